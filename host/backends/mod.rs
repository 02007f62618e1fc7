//! Backends: where a collective's data lives and how it moves.
//!
//! * [`mpi`]: host memory, MPI plus Duralumin's own algorithms.
//! * [`host_transfer`]: device memory staged through pinned host memory, stream-ordered.
//! * `nccl`: device memory through NCCL (RCCL on HIP) and the Rust kernels, stream-ordered.

pub mod host_transfer;
pub mod mpi;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod nccl;
