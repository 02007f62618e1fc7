//! Element types and reduction operators shared by every Duralumin code path.
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
#![no_std]

pub mod element;
pub mod op;

pub use element::{Element, Integer, Number};
pub use op::{Avg, BitAnd, BitOr, BitXor, LogicalAnd, LogicalOr, LogicalXor, Max, Min, Prod, ReduceOp, Sum};
pub use {bytemuck, half};
