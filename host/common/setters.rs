//! `with_*` setters of the `#[non_exhaustive]` settings structs, which users outside the crate
//! cannot build with a struct literal.

/// For each `field: Type`, a `#[must_use] pub fn with_field(self, value: Type) -> Self`.
macro_rules! with_setters {
    ($ty:ident { $($field:ident: $fty:ty => $setter:ident),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("This [`", stringify!($ty), "`] with [`", stringify!($field), "`](", stringify!($ty),
                    "::", stringify!($field), ") set to `value`.")]
                #[must_use]
                pub fn $setter(self, value: $fty) -> Self {
                    $ty { $field: value, ..self }
                }
            )*
        }
    };
}
