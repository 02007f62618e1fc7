//! Backends: where a collective's data lives and how it moves.
//!
//! * [`mpi`]: host memory, MPI plus Duralumin's own algorithms.
//! * [`host_transfer`]: device memory staged through pinned host memory, stream-ordered.
//! * `nccl`: device memory through NCCL (RCCL on HIP) and the Rust kernels, stream-ordered.

/// A stream-ordered backend's parameter type for an argument of kind `$kind` of the list of
/// operations (`crate::for_each_operation`): any buffer of the communicator's device `D`.
macro_rules! device_param {
    ([in]) => { &'a impl DeviceSlice<D, Elem = T> };
    ([out]) => { &'a mut impl DeviceSliceMut<D, Elem = T> };
    ([ins]) => { &[(&'a impl DeviceSlice<D, Elem = T>, usize)] };
    ([outs]) => { &mut [(&'a mut impl DeviceSliceMut<D, Elem = T>, usize)] };
    ($t:ty) => { $t };
}

pub mod host_transfer;
pub mod mpi;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub mod nccl;
