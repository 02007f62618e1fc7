//! Duralumin: accelerator-centric collective communication.
//!
//! Communicators wrap MPI communicators; every collective of MPI (and Aluminum's
//! MultiSendRecv) is available blocking, non-blocking and in place, on any [`Element`] type
//! with any [`ReduceOp`].
//!
//! ```no_run
//! use duralumin::{MpiCommunicator, Sum};
//!
//! let universe = duralumin::init()?;
//! let comm = MpiCommunicator::new(&universe.world())?;
//! let send = vec![comm.rank() as f32; 4];
//! let mut recv = vec![0.0f32; 4];
//! comm.allreduce(&send, &mut recv, Sum)?;
//! # Ok::<(), duralumin::Error>(())
//! ```
//!
//! Backends, all implementing [`Collectives`] (so code can be written once for any of them):
//! * [`backends::mpi`] ([`MpiCommunicator`]): host memory over MPI.
//! * [`backends::host_transfer`] ([`HostTransferCommunicator`]): device memory staged through pinned host memory, ordered on
//!   a device stream.
//! * `backends::nccl` (`NcclCommunicator`, features `cuda`/`hip`): device memory through NCCL
//!   (RCCL) and the Rust kernels, ordered on a device stream (`docs/nccl.md`).
//!
//! Nothing hangs silently: a panic ends the job, every operation has a deadline past which the
//! ranks report who is out of step, and collectives can check their signatures across ranks
//! ([`reliability`], `docs/reliability.md`).
#![deny(missing_docs)]

#[macro_use]
mod common;

pub mod backends;
pub mod device;
pub mod elastic;
pub mod reliability;

mod algorithms;
mod api;
mod ffi;
mod operations;
mod transport;

pub use api::{device_code, topology};

pub use backends::host_transfer::{DeviceRequest, HostTransferCommunicator, HostTransferConfig};
pub use backends::mpi::{
    AllgatherAlgorithm, AllreduceAlgorithm, BcastAlgorithm, MpiCommunicator, ReduceScatterAlgorithm, Tuning,
    WindowStores, progress_thread_running,
};
#[cfg(any(feature = "cuda", feature = "hip"))]
pub use backends::nccl::{NcclCommunicator, NcclDevice, NcclRequest};

/// The Mpi backend's communicator under its old name.
#[deprecated(since = "0.2.0", note = "renamed `MpiCommunicator`")]
pub type Communicator = MpiCommunicator;
pub use api::collectives::Collectives;
pub use api::error::{Error, Result};
pub use api::init::{FINALIZE_GRACE, Universe, init, init_with};
pub use api::request::{Request, Scope, scope};
/// The cudarc version the CUDA device takes streams and buffers of.
#[cfg(feature = "cuda")]
pub use cudarc;
pub use duralumin_kernels::{
    Avg, BitAnd, BitOr, BitXor, Element, Integer, LogicalAnd, LogicalOr, LogicalXor, Max, Min, Number, Prod, ReduceOp,
    Sum,
};
pub use topology::{Shape, Topology};
pub use {bytemuck, half, mpi};

/// The README's code, compiled as doctests (`no_run`: they need `mpirun`), so the tour cannot
/// drift from the API.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    /// The old paths name the renamed types until they are removed.
    #[test]
    #[allow(deprecated)]
    fn deprecated_paths_still_name_the_communicators() {
        use std::any::TypeId;
        assert_eq!(TypeId::of::<crate::Communicator>(), TypeId::of::<crate::MpiCommunicator>());
        assert_eq!(TypeId::of::<crate::backends::mpi::Communicator>(), TypeId::of::<crate::MpiCommunicator>());
        type Host = crate::device::cpu::HostDevice;
        assert_eq!(
            TypeId::of::<crate::backends::host_transfer::Communicator<Host>>(),
            TypeId::of::<crate::HostTransferCommunicator<Host>>()
        );
    }
}
