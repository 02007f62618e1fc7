//! Work on device memory alone, for backends whose data never leaves the device (NCCL): scratch
//! allocated and freed in stream order, device-to-device copies, and reductions of one device
//! buffer into another by the Rust kernels.

use super::{BLOCK, Driver, Gpu, Shape, arg};
use crate::api::error::Result;
use crate::device::{DevicePtr, ReduceFns};

impl<R: Driver> Gpu<R> {
    /// `bytes` of device memory for work queued on `stream` from now on.
    pub(crate) fn scratch(&self, stream: &R::Stream, bytes: usize) -> Result<DevicePtr> {
        self.check_stream(stream)?;
        self.bind()?;
        self.driver().alloc_async(stream, bytes)
    }

    /// Frees scratch in stream order (an error is kept for the device's next call).
    ///
    /// # Safety
    /// `ptr` came from [`Gpu::scratch`]; nothing queued later uses it.
    pub(crate) unsafe fn free_scratch(&self, stream: &R::Stream, ptr: DevicePtr) {
        // SAFETY: guaranteed by the caller.
        self.record(unsafe { self.driver().free_async(stream, ptr) });
    }

    /// Queues a copy of `bytes` between device buffers.
    ///
    /// # Safety
    /// As [`Driver::memcpy_d2d`].
    pub(crate) unsafe fn copy_d2d(
        &self,
        stream: &R::Stream,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        if bytes == 0 || dst == src {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.driver().memcpy_d2d(stream, dst, src, bytes) }
    }

    /// Queues `dst[i] = combine(dst[i], src[i])` for `len` elements of `op`'s type.
    ///
    /// # Safety
    /// `dst` and `src` are device memory of `len` elements each, not overlapping, valid until
    /// the kernel has run.
    pub(crate) unsafe fn reduce_d2d(
        &self,
        stream: &R::Stream,
        dst: DevicePtr,
        src: DevicePtr,
        len: usize,
        op: &ReduceFns,
    ) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        let reduce = self.reduce_kernel(op)?;
        let (mut d, mut s, mut n) = (dst.0, src.0, len);
        let mut args = [arg(&mut d), arg(&mut s), arg(&mut n)];
        // SAFETY: reduce kernels take `(dst, src, n)` over `n` elements of the operator's type;
        // the ranges are the caller's.
        unsafe { self.driver().launch(stream, &reduce, Shape::blocks(self.blocks(len), BLOCK), &mut args) }
    }

    /// Queues `dst[i] = finish(dst[i], op.ranks)` if the operator has a finish.
    ///
    /// # Safety
    /// `dst` is device memory of `len` elements, valid until the kernel has run.
    pub(crate) unsafe fn finish_d2d(
        &self,
        stream: &R::Stream,
        dst: DevicePtr,
        len: usize,
        op: &ReduceFns,
    ) -> Result<()> {
        if op.finish.is_none() || len == 0 {
            return Ok(());
        }
        self.bind()?;
        let Some(finish) = self.finish_kernel(op)? else { return Ok(()) };
        let (mut d, mut n, mut ranks) = (dst.0, len, op.ranks);
        let mut args = [arg(&mut d), arg(&mut n), arg(&mut ranks)];
        // SAFETY: finish kernels take `(dst, n, ranks: u32)`; `dst` holds `len` elements.
        unsafe { self.driver().launch(stream, &finish, Shape::blocks(self.blocks(len), BLOCK), &mut args) }
    }
}
