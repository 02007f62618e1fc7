//! [`NcclDevice`]: the device-memory primitives the NCCL backend is written over (events,
//! scratch, device-to-device copies and the Rust reduction kernels), beyond what [`Device`]
//! gives HostTransfer. Implemented once for both GPUs by `gpu`; declared here so the device
//! layer never depends on a backend.

use std::ffi::c_void;

use super::{Device, DevicePtr, ReduceFns};
use crate::api::error::Result;

/// A GPU device NCCL (CUDA) or RCCL (HIP) can run on. Implemented by
/// [`CudaDevice`](crate::device::cuda::CudaDevice) and `HipDevice`; the methods are the
/// device-memory primitives the backend is written over, not for use outside Duralumin.
pub trait NcclDevice: Device + Clone {
    /// The driver's event.
    #[doc(hidden)]
    type Event: Send + Sync + 'static;
    #[doc(hidden)]
    fn new_event(&self) -> Result<Self::Event>;
    #[doc(hidden)]
    fn record_event(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;
    #[doc(hidden)]
    fn event_done(&self, event: &Self::Event) -> Result<bool>;
    #[doc(hidden)]
    fn wait_event(&self, waiter: &Self::Stream, event: &Self::Event) -> Result<()>;
    #[doc(hidden)]
    fn raw_stream(&self, stream: &Self::Stream) -> *mut c_void;
    #[doc(hidden)]
    fn api(&self) -> &'static str;
    #[doc(hidden)]
    fn bind(&self) -> Result<()>;
    #[doc(hidden)]
    fn scratch(&self, stream: &Self::Stream, bytes: usize) -> Result<DevicePtr>;
    /// # Safety
    /// `ptr` came from `scratch`; nothing queued later uses it.
    #[doc(hidden)]
    unsafe fn free_scratch(&self, stream: &Self::Stream, ptr: DevicePtr);
    /// # Safety
    /// Both ranges are device memory of this device, valid until the copy has run.
    #[doc(hidden)]
    unsafe fn copy_d2d(&self, stream: &Self::Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// # Safety
    /// `dst` and `src` hold `len` elements of `op`'s type, do not overlap, and stay valid until
    /// the kernel has run.
    #[doc(hidden)]
    unsafe fn reduce_d2d(
        &self,
        stream: &Self::Stream,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        op: &ReduceFns,
    ) -> Result<()>;
    /// # Safety
    /// `dst` holds `len` elements of `op`'s type, valid until the kernel has run.
    #[doc(hidden)]
    unsafe fn finish_d2d(&self, stream: &Self::Stream, dst: DevicePtr, len: usize, op: &ReduceFns) -> Result<()>;
}
