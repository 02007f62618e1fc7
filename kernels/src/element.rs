//! What can travel in a collective, and the arithmetic of the builtin numeric elements.

use half::{bf16, f16};

/// A value that can be sent, received and reduced by Duralumin.
///
/// Elements are plain old data (`bytemuck::Pod`): they are copied as bytes between ranks and
/// devices. [`Element::NAME`] is a deterministic identifier fragment (ASCII letters, digits and
/// `_`) from which kernel entry-point names are built, so it must be unique among the elements a
/// program uses.
///
/// A user type becomes an element with one impl:
///
/// ```
/// use duralumin_kernels::{bytemuck, Element};
///
/// #[repr(C)]
/// #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
/// struct MinLoc {
///     value: f64,
///     index: u64,
/// }
///
/// impl Element for MinLoc {
///     const NAME: &'static str = "minloc";
/// }
/// ```
pub trait Element: bytemuck::Pod + Send + Sync + 'static {
    /// Identifier fragment used in kernel names, e.g. `"f32"` or `"minloc"`.
    const NAME: &'static str;
}

mod sealed {
    pub trait Sealed {}
}

/// The builtin numeric elements: every integer width, `f32`, `f64`, `f16` and `bf16`.
///
/// This is the arithmetic the builtin reduction operators need. Integer addition and
/// multiplication wrap (two's complement, like MPI implementations in practice) so a reduction
/// never panics on overflow; `f16` and `bf16` compute in `f32` and round once per operation.
/// The trait is sealed: user types get reductions by implementing [`crate::ReduceOp`] instead.
pub trait Number: Element + PartialOrd + sealed::Sealed {
    /// `a + b` (wrapping for integers).
    fn add(a: Self, b: Self) -> Self;
    /// `a * b` (wrapping for integers).
    fn mul(a: Self, b: Self) -> Self;
    /// The truth value used by the logical operators: non-zero is true.
    fn truth(self) -> bool;
    /// `1` for true, `0` for false.
    fn from_truth(t: bool) -> Self;
    /// Divides by a rank count, as `avg` does after summing. Integers truncate toward zero.
    fn div_count(self, n: u32) -> Self;
}

/// The builtin integer elements, which also support the bitwise operators.
pub trait Integer: Number + num_traits::PrimInt {}

macro_rules! integer_elements {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const NAME: &'static str = stringify!($t);
        }
        impl sealed::Sealed for $t {}
        impl Number for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                num_traits::WrappingAdd::wrapping_add(&a, &b)
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                num_traits::WrappingMul::wrapping_mul(&a, &b)
            }
            #[inline(always)]
            fn truth(self) -> bool {
                !num_traits::Zero::is_zero(&self)
            }
            #[inline(always)]
            fn from_truth(t: bool) -> Self {
                if t { num_traits::One::one() } else { num_traits::Zero::zero() }
            }
            #[inline(always)]
            fn div_count(self, n: u32) -> Self {
                // i128 holds every builtin integer and every u32, so the quotient is exact
                // before the (always fitting) narrowing; n == 0 cannot come from a communicator.
                let wide: i128 = num_traits::AsPrimitive::<i128>::as_(self);
                num_traits::AsPrimitive::<$t>::as_(wide / (n.max(1) as i128))
            }
        }
        impl Integer for $t {}
    )*};
}
integer_elements!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_elements {
    ($($t:ty),*) => {$(
        impl Element for $t {
            const NAME: &'static str = stringify!($t);
        }
        impl sealed::Sealed for $t {}
        impl Number for $t {
            #[inline(always)]
            fn add(a: Self, b: Self) -> Self {
                a + b
            }
            #[inline(always)]
            fn mul(a: Self, b: Self) -> Self {
                a * b
            }
            #[inline(always)]
            fn truth(self) -> bool {
                !num_traits::Zero::is_zero(&self)
            }
            #[inline(always)]
            fn from_truth(t: bool) -> Self {
                if t { num_traits::One::one() } else { num_traits::Zero::zero() }
            }
            #[inline(always)]
            fn div_count(self, n: u32) -> Self {
                let wide: f64 = num_traits::AsPrimitive::<f64>::as_(self);
                num_traits::AsPrimitive::<$t>::as_(wide / f64::from(n.max(1)))
            }
        }
    )*};
}
// half's `Add`/`Mul` convert to f32, operate, and round back: "f16/bf16 compute in f32".
float_elements!(f32, f64, f16, bf16);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integer_arithmetic_wraps_instead_of_panicking() {
        assert_eq!(<i8 as Number>::add(127, 1), -128);
        assert_eq!(<u8 as Number>::mul(16, 16), 0);
    }

    #[test]
    fn avg_division_truncates_toward_zero() {
        assert_eq!((-7i32).div_count(2), -3);
        assert_eq!(7u8.div_count(2), 3);
        assert_eq!(u64::MAX.div_count(1), u64::MAX);
        assert_eq!(7.0f32.div_count(2), 3.5);
        assert_eq!(f16::from_f32(3.0).div_count(2), f16::from_f32(1.5));
    }

    #[test]
    fn names_are_the_type_names() {
        assert_eq!(<f16 as Element>::NAME, "f16");
        assert_eq!(<bf16 as Element>::NAME, "bf16");
        assert_eq!(<u64 as Element>::NAME, "u64");
    }
}
