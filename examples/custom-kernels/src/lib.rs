//! Device kernels for your own element types and operators.
//!
//! This crate is what a user writes to reduce their own types on the GPU:
//!
//! 1. Elements and operators in a `no_std` crate (this one): [`MinLoc`] with [`ArgMin`] (the
//!    value and rank/index of the minimum, like `MPI_MINLOC`), [`Complex32`] with
//!    [`Sum`](duralumin_kernels::Sum) (complex addition: an impl of the builtin operator for a
//!    new element), and [`Affine`] with [`Compose`] (composing maps `x -> a x + b`: associative
//!    but not commutative, so the result depends on rank order, which every backend keeps).
//! 2. One [`reduce_kernels!`](duralumin_kernels::reduce_kernels) invocation that stamps out the
//!    GPU entry points for those pairs.
//! 3. A build script that compiles the crate for NVIDIA (PTX) and AMD (code objects) with
//!    [`KernelBuilder`](duralumin_kernels::builder::KernelBuilder) and embeds the result.
//! 4. On the host, [`register`] hands the embedded module to Duralumin, which then finds these
//!    kernels by the names it computes from the types.
//!
//! The same `combine` functions run on the CPU (MPI backend, host device) and in the kernels.
#![no_std]

use duralumin_kernels::{Element, ReduceOp, Sum};

/// A value with the index (e.g. rank) it came from.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MinLoc {
    /// The value compared.
    pub value: f64,
    /// Where it came from.
    pub index: u64,
}

impl Element for MinLoc {
    const NAME: &'static str = "minloc";
}

/// The smaller value, and on a tie the smaller index (so the result is independent of the
/// reduction order, like `MPI_MINLOC`). NaN values lose against numbers.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ArgMin;

impl ReduceOp<MinLoc> for ArgMin {
    const NAME: &'static str = "argmin";

    #[inline(always)]
    fn combine(a: MinLoc, b: MinLoc) -> MinLoc {
        let b_wins =
            b.value < a.value || (b.value == a.value && b.index < a.index) || (a.value.is_nan() && !b.value.is_nan());
        if b_wins { b } else { a }
    }
}

/// A complex number of two `f32`s (the layout of `cuComplex` / `std::complex<float>`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Complex32 {
    /// Real part.
    pub re: f32,
    /// Imaginary part.
    pub im: f32,
}

impl Element for Complex32 {
    const NAME: &'static str = "c32";
}

/// Complex addition, under the builtin operator's name: `duralumin_reduce_c32_sum`.
impl ReduceOp<Complex32> for Sum {
    const NAME: &'static str = "sum";

    #[inline(always)]
    fn combine(a: Complex32, b: Complex32) -> Complex32 {
        Complex32 { re: a.re + b.re, im: a.im + b.im }
    }
}

/// The affine map `x -> a x + b` over wrapping 64-bit integers.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Affine {
    /// Slope.
    pub a: i64,
    /// Offset.
    pub b: i64,
}

impl Element for Affine {
    const NAME: &'static str = "affine";
}

/// `combine(f, g) = g ∘ f`: the lower rank's map is applied first. Associative, not
/// commutative (`COMMUTATIVE = false`), so a reduction must combine contributions in rank order.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Compose;

impl ReduceOp<Affine> for Compose {
    const NAME: &'static str = "compose";
    const COMMUTATIVE: bool = false;

    #[inline(always)]
    fn combine(f: Affine, g: Affine) -> Affine {
        Affine { a: g.a.wrapping_mul(f.a), b: g.a.wrapping_mul(f.b).wrapping_add(g.b) }
    }
}

duralumin_kernels::reduce_kernels! {
    MinLoc = "minloc" => [ArgMin = "argmin"];
    Complex32 = "c32" => [Sum = "sum"];
    Affine = "affine" => [Compose = "compose"];
}

#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
mod host {
    use duralumin::device_code::{self, KernelModule};

    /// This crate's device code, as build.rs built it (PTX and AMD code objects, or the reason
    /// they are missing).
    pub static KERNELS: KernelModule = include!(concat!(env!("OUT_DIR"), "/custom_kernels.rs"));

    /// Registers [`KERNELS`] with Duralumin, so its (element, operator) kernels are found by name.
    /// Idempotent.
    ///
    /// # Errors
    /// `Error::KernelsUnavailable` if another registered module defines the same kernel names.
    pub fn register() -> duralumin::Result<()> {
        device_code::register(&KERNELS)
    }
}

#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
pub use host::{KERNELS, register};
