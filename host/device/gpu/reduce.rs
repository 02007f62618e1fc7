//! Reductions of staged rows into device memory: the first row is copied, the others combined
//! into it in row order by the reduction kernel, reading them through host-mapped memory.

use super::{BLOCK, Direction, Driver, Gpu, Shape, arg};
use crate::api::error::Result;
use crate::device::{DevicePtr, ReduceFns};

impl<R: Driver> Gpu<R> {
    /// # Safety
    /// As [`crate::device::Device::reduce_h2d`].
    pub(crate) unsafe fn reduce_h2d(
        &self,
        stream: &R::Stream,
        dst: DevicePtr,
        src: *const u8,
        rows: usize,
        len: usize,
        op: ReduceFns,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if rows == 0 || len == 0 {
            return Ok(());
        }
        let row = op.row_bytes(rows, len)?;
        self.bind()?;
        let reduce = self.reduce_kernel(&op)?;
        let finish = self.finish_kernel(&op)?;
        let mapped = self.mapped(src.cast_mut())?;
        // SAFETY: the caller guarantees `dst` holds `len` elements and `src` `rows * len` of
        // pinned memory, both valid and untouched by others until the work has run.
        unsafe { self.driver().memcpy(stream, Direction::ToDevice, src.cast_mut(), dst, row) }?;
        let blocks = self.blocks(len);
        for r in 1..rows {
            let (mut d, mut s, mut n) = (dst.0, mapped.offset(r * row).0, len);
            let mut args = [arg(&mut d), arg(&mut s), arg(&mut n)];
            // SAFETY: reduce kernels take `(dst, src, n)` over `n` elements of the operator's
            // type; row `r` lies in the caller's pinned allocation, read through its mapping,
            // and does not overlap `dst`.
            unsafe { self.driver().launch(stream, &reduce, Shape::blocks(blocks, BLOCK), &mut args) }?;
        }
        if let Some(finish) = finish {
            let (mut d, mut n, mut ranks) = (dst.0, len, op.ranks);
            let mut args = [arg(&mut d), arg(&mut n), arg(&mut ranks)];
            // SAFETY: finish kernels take `(dst, n, ranks: u32)`; `dst` holds `len` elements.
            unsafe { self.driver().launch(stream, &finish, Shape::blocks(blocks, BLOCK), &mut args) }?;
        }
        Ok(())
    }
}
