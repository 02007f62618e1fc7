//! Element types, reduction operators and device kernels shared by every Duralumin code path.
//!
//! This crate is `#![no_std]` so that the very same definitions run on the CPU (the MPI backend,
//! the host device, unit tests) and inside device kernels compiled for NVPTX and AMDGCN.
//!
//! * [`Element`] is anything that can travel in a collective: a `bytemuck::Pod` type with a
//!   deterministic [`Element::NAME`]. All builtin integers and floats (`half::f16`/`half::bf16`
//!   included) are elements; a user's `#[repr(C)]` Pod struct becomes one with a one-line impl.
//! * [`ReduceOp`] is a pure combining function. The builtin operators are zero-sized types
//!   ([`Sum`], [`Prod`], [`Min`], [`Max`], [`LogicalAnd`], [`LogicalOr`], [`LogicalXor`],
//!   [`BitAnd`], [`BitOr`], [`BitXor`], [`Avg`]) implemented only for the element types where
//!   they are meaningful: `BitAnd` on an `f32` is a compile error, not a runtime one.
//!
//! # Kernels
//! Kernel bodies are written once, generic over the element and operator, against a two-number
//! index abstraction ([`grid::Grid`]: global index and global size, walked with grid-stride
//! loops), so the same code runs on GPU threads and on the host ([`grid::HostGrid`]):
//!
//! * module [`reduce`]: `dst = op(dst, src)`, `dst = op(a, b)` and the operator's finishing step,
//!   with 16-byte loads and stores where size and alignment allow;
//! * module [`pack`]: strided 2-D copies and segment-list pack/unpack for v-collectives;
//! * module [`mover`]: a staged operation's whole device side (its copies through the staging
//!   ring and its counters) in one body;
//! * module [`flag`]: stream-wait (poll a host-mapped flag with system-scope acquire loads and
//!   backoff) and signal (system-scope release store).
//!
//! [`grid::HostGrid`]'s methods (module [`host`], not on GPU targets) run the bodies on slices.
//!
//! [`reduce_kernels!`] stamps out `#[unsafe(export_name)]` entry points for concrete
//! (element, operator) pairs with names the host computes with [`names::KernelName::reduce`].
//! With feature `builtin-kernels` the crate holds the builtin set (every builtin pair valid for
//! its element, plus pack, unpack, stream-wait and signal). With feature `builder` (std),
//! [`builder::KernelBuilder`] compiles a kernel crate to PTX and AMD code objects from a build
//! script, which is how the library builds the builtin set and how users build kernels for their
//! own elements and operators; [`module::KernelModule`] describes the result.
//!
//! On NVPTX and AMDGPU this crate provides the `#[panic_handler]` (a trap); kernel bodies have no
//! panicking paths, and the tests check that the PTX calls nothing external.
#![no_std]
#![deny(missing_docs)]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, stdarch_nvptx, asm_experimental_arch, allow_internal_unstable),
    // The kernel ABI is used by the entry macro, so without feature `builtin-kernels` only in
    // the crates that invoke it.
    allow(internal_features, unused_features)
)]
#![cfg_attr(
    target_arch = "amdgpu",
    feature(abi_gpu_kernel, stdarch_amdgpu, core_intrinsics, gpu_intrinsics, allow_internal_unstable),
    allow(internal_features, unused_features)
)]

#[cfg(feature = "builder")]
extern crate std;

pub mod element;
pub mod entry;
pub mod flag;
pub mod grid;
#[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
pub mod host;
pub mod module;
pub mod mover;
pub mod names;
pub mod op;
pub mod pack;
pub mod reduce;

#[cfg(feature = "builder")]
pub mod builder;
#[cfg(feature = "builtin-kernels")]
mod builtin;

pub use element::{Element, Integer, Number};
pub use entry::BUILTIN_REDUCE_PAIRS;
pub use module::{CodeObject, KernelModule, Ptx};
pub use names::{KernelName, ReduceKernel};
pub use op::{Avg, BitAnd, BitOr, BitXor, LogicalAnd, LogicalOr, LogicalXor, Max, Min, Prod, ReduceOp, Sum};
pub use {bytemuck, half};

/// Kernels never panic (the tests check the PTX for calls to anything external); should one
/// anyway, the thread traps and the launch fails with an error instead of hanging.
#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // SAFETY: `trap` aborts the kernel; it has no preconditions.
    unsafe { core::arch::nvptx::trap() }
}

/// As on NVPTX: trap.
#[cfg(target_arch = "amdgpu")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    core::intrinsics::abort()
}
