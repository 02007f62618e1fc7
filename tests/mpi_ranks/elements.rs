//! Element types and values of the sweep: every builtin plus three user pairs.

use duralumin::half::{bf16, f16};
use duralumin::{Element, ReduceOp, bytemuck};

// The user pairs are the custom-kernels example's: the same types and operators the users'
// guide builds, with device kernels (when the nightly toolchain built them), so the device
// backends reduce them on the device. MinLoc/ArgMin (ties to the smaller index), Complex32
// with Sum, and Affine/Compose (non-commutative: combines must keep rank order).
pub use duralumin_example_custom_kernels::{Affine, ArgMin, Complex32 as Complex, Compose, MinLoc};

/// Test elements made from small integers (exact in every type and any reduction order).
pub trait TestElem: Element + PartialEq + std::fmt::Debug {
    fn make(x: u8, rank: usize) -> Self;
}

macro_rules! prim {
    ($($t:ty),*) => {$(
        impl TestElem for $t {
            fn make(x: u8, _rank: usize) -> Self {
                x as $t
            }
        }
    )*};
}
prim!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);

impl TestElem for f16 {
    fn make(x: u8, _rank: usize) -> Self {
        f16::from_f32(f32::from(x))
    }
}

impl TestElem for bf16 {
    fn make(x: u8, _rank: usize) -> Self {
        bf16::from_f32(f32::from(x))
    }
}

impl TestElem for MinLoc {
    fn make(x: u8, rank: usize) -> Self {
        MinLoc { value: f64::from(x), index: rank as u64 }
    }
}

impl TestElem for Complex {
    fn make(x: u8, rank: usize) -> Self {
        Complex { re: f32::from(x), im: (rank % 3) as f32 }
    }
}

impl TestElem for Affine {
    fn make(x: u8, rank: usize) -> Self {
        Affine { a: i64::from(x % 2) + 1, b: rank as i64 + i64::from(x) }
    }
}

/// Rank `rank`'s input element `i`. Products use only 1 and 2 so even bf16 stays exact.
pub fn value<T: TestElem, O: ReduceOp<T>>(rank: usize, i: usize) -> T {
    if O::NAME == "prod" {
        T::make(((rank + i) % 2 + 1) as u8, rank)
    } else {
        T::make(((rank * 3 + i * 5 + rank * i) % 5) as u8, rank)
    }
}

/// Rank `rank`'s input of `count` elements.
pub fn input<T: TestElem, O: ReduceOp<T>>(rank: usize, count: usize) -> Vec<T> {
    (0..count).map(|i| value::<T, O>(rank, i)).collect()
}

/// The sequential reference: element `i` reduced over `ranks` (in rank order), finished.
pub fn reduced<T: TestElem, O: ReduceOp<T>>(ranks: std::ops::Range<usize>, n: usize, i: usize) -> T {
    let mut acc = value::<T, O>(ranks.start, i);
    for r in ranks.start + 1..ranks.end {
        acc = O::combine(acc, value::<T, O>(r, i));
    }
    O::finish(acc, n as u32)
}

/// A buffer of `len` elements filled with a poison byte pattern, so unwritten results show.
pub fn poison<T: Element>(len: usize) -> Vec<T> {
    let mut v: Vec<T> = vec![bytemuck::Zeroable::zeroed(); len];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).fill(0xA5);
    v
}

/// Bit-exact comparison (NaN-safe, and what "exact in any order" promises).
pub fn same<T: Element>(a: &[T], b: &[T]) -> bool {
    bytemuck::cast_slice::<T, u8>(a) == bytemuck::cast_slice::<T, u8>(b)
}
