//! Reduction operators.

use crate::element::{Element, Integer, Number};

/// A reduction operator over elements of type `T`.
///
/// An operator is a zero-sized type with a pure combining function, so one definition runs on
/// the CPU, in MPI user operations and in device kernels. `combine` must be associative; it is
/// also assumed commutative unless [`ReduceOp::COMMUTATIVE`] says otherwise, in which case
/// Duralumin only uses algorithms that combine contributions in rank order
/// (`x0 op x1 op ... op x(n-1)`).
///
/// Operators that need a final step after all contributions are combined (like [`Avg`], which
/// sums and then divides by the number of ranks) set [`ReduceOp::HAS_FINISH`] and implement
/// [`ReduceOp::finish`].
///
/// Builtin operators exist only where they mean something; a bitwise operator on a float does
/// not compile:
///
/// ```compile_fail
/// use duralumin_kernels::{BitAnd, ReduceOp};
/// let _ = <BitAnd as ReduceOp<f32>>::combine(1.0, 2.0);
/// ```
///
/// and neither does arithmetic on a user struct that has no operator:
///
/// ```compile_fail
/// use duralumin_kernels::{Element, ReduceOp, Sum};
/// #[repr(C)]
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// struct P { x: f32 }
/// impl Element for P { const NAME: &'static str = "p"; }
/// let _ = <Sum as ReduceOp<P>>::combine(P { x: 1.0 }, P { x: 2.0 });
/// ```
pub trait ReduceOp<T: Element>: Copy + Default + Send + Sync + 'static {
    /// Identifier fragment used in kernel names, e.g. `"sum"`.
    const NAME: &'static str;
    /// Whether `combine(a, b) == combine(b, a)` for all inputs.
    const COMMUTATIVE: bool = true;
    /// Whether [`ReduceOp::finish`] must run on the fully combined value.
    const HAS_FINISH: bool = false;

    /// Combines two values. Called as `combine(earlier_rank_value, later_rank_value)`.
    fn combine(a: T, b: T) -> T;

    /// Turns the combination of all `ranks` contributions into the result. Identity unless
    /// [`ReduceOp::HAS_FINISH`] is set.
    #[inline(always)]
    fn finish(value: T, ranks: u32) -> T {
        let _ = ranks;
        value
    }
}

macro_rules! operator {
    ($(#[$doc:meta])* $name:ident, $tag:literal, $bound:ident, |$a:ident, $b:ident| $body:expr) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        pub struct $name;

        impl<T: $bound> ReduceOp<T> for $name {
            const NAME: &'static str = $tag;
            #[inline(always)]
            fn combine($a: T, $b: T) -> T {
                $body
            }
        }
    };
}

operator!(
    /// Sum (wrapping for integers).
    Sum, "sum", Number, |a, b| T::add(a, b)
);
operator!(
    /// Product (wrapping for integers).
    Prod, "prod", Number, |a, b| T::mul(a, b)
);
operator!(
    /// Minimum. With NaN inputs the result is whichever operand compares as not greater.
    Min, "min", Number, |a, b| if b < a { b } else { a }
);
operator!(
    /// Maximum. With NaN inputs the result is whichever operand compares as not smaller.
    Max, "max", Number, |a, b| if b > a { b } else { a }
);
operator!(
    /// Logical and: non-zero is true; the result is `1` or `0`.
    LogicalAnd, "land", Number, |a, b| T::from_truth(a.truth() && b.truth())
);
operator!(
    /// Logical or: non-zero is true; the result is `1` or `0`.
    LogicalOr, "lor", Number, |a, b| T::from_truth(a.truth() || b.truth())
);
operator!(
    /// Logical exclusive or: non-zero is true; the result is `1` or `0`.
    LogicalXor, "lxor", Number, |a, b| T::from_truth(a.truth() != b.truth())
);
operator!(
    /// Bitwise and (integers only).
    BitAnd, "band", Integer, |a, b| a & b
);
operator!(
    /// Bitwise or (integers only).
    BitOr, "bor", Integer, |a, b| a | b
);
operator!(
    /// Bitwise exclusive or (integers only).
    BitXor, "bxor", Integer, |a, b| a ^ b
);

/// Average: the sum of all contributions divided by the number of ranks.
///
/// Integer averages wrap while summing (like [`Sum`]) and then truncate toward zero
/// (`-7 / 2 == -3`); `f16`/`bf16` sum in `f32` per step and divide in `f64`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Avg;

impl<T: Number> ReduceOp<T> for Avg {
    const NAME: &'static str = "avg";
    const HAS_FINISH: bool = true;
    #[inline(always)]
    fn combine(a: T, b: T) -> T {
        T::add(a, b)
    }
    #[inline(always)]
    fn finish(value: T, ranks: u32) -> T {
        value.div_count(ranks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::bf16;

    fn fold<T: Element, O: ReduceOp<T>>(xs: &[T]) -> T {
        let mut acc = xs[0];
        for &x in &xs[1..] {
            acc = O::combine(acc, x);
        }
        O::finish(acc, u32::try_from(xs.len()).unwrap())
    }

    #[test]
    fn builtin_operators() {
        assert_eq!(fold::<i32, Sum>(&[1, 2, 3]), 6);
        assert_eq!(fold::<i32, Prod>(&[2, 3, 4]), 24);
        assert_eq!(fold::<i32, Min>(&[5, -2, 3]), -2);
        assert_eq!(fold::<u16, Max>(&[5, 9, 3]), 9);
        assert_eq!(fold::<f32, LogicalAnd>(&[1.0, 2.0, 0.0]), 0.0);
        assert_eq!(fold::<i8, LogicalOr>(&[0, 0, 7]), 1);
        assert_eq!(fold::<u8, LogicalXor>(&[1, 3, 0]), 0);
        assert_eq!(fold::<u8, BitAnd>(&[0b1110, 0b0111]), 0b0110);
        assert_eq!(fold::<u8, BitOr>(&[0b1000, 0b0001]), 0b1001);
        assert_eq!(fold::<i64, BitXor>(&[0b11, 0b01]), 0b10);
        assert_eq!(fold::<i32, Avg>(&[1, 2, 4]), 2);
        assert_eq!(fold::<bf16, Avg>(&[bf16::from_f32(1.0), bf16::from_f32(2.0)]), bf16::from_f32(1.5));
    }
}
