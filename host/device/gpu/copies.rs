//! Copies between pinned host memory and device memory: the decision tree for one 2-D copy,
//! and the pack/unpack kernels that move a v-collective's blocks in one launch.

use std::sync::Arc;

use duralumin_kernels::mover::{self, Schedule};
use duralumin_kernels::names::fixed;
use duralumin_kernels::pack::Segment;

use std::ffi::c_void;

use super::{BLOCK, Direction, Driver, Gpu, Shape, arg};
use crate::api::error::Result;
use crate::device::{Copy2d, DevicePtr, KeepAlive};

impl<R: Driver> Gpu<R> {
    /// Queues one 2-D (or 1-D) copy, then holds `keep` until it has run.
    ///
    /// # Safety
    /// As [`crate::device::Device::copy_d2h`] (`ToHost`) or `copy_h2d`: both sides are valid
    /// for the shape until the copy has run, the host side is pinned.
    pub(crate) unsafe fn copy(
        &self,
        stream: &R::Stream,
        dir: Direction,
        host: *mut u8,
        device: DevicePtr,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if shape.bytes() == 0 {
            // Nothing to copy; `keep` is still held behind the stream's queued work, like any
            // keep-alive handed to the device.
            return self.hold_others(stream, keep.into_iter().collect());
        }
        self.bind()?;
        // SAFETY: forwarded from the caller.
        let queued = unsafe { self.copy_rows(stream, dir, host, device, shape) };
        // Rows queued before a failure still use the buffers.
        let held = self.hold_others(stream, keep.into_iter().collect());
        queued.and(held)
    }

    /// The copy as the driver can take it: one contiguous copy when the rows are back to back
    /// on both sides, one pitched copy when the pitches are within the driver's limit (and no
    /// rows overlap), else row by row.
    ///
    /// # Safety
    /// As [`Gpu::copy`].
    unsafe fn copy_rows(
        &self,
        stream: &R::Stream,
        dir: Direction,
        host: *mut u8,
        device: DevicePtr,
        shape: Copy2d,
    ) -> Result<()> {
        let driver = self.driver();
        let Copy2d { row_bytes, rows, src_pitch, dst_pitch } = shape;
        let (host_pitch, device_pitch) = match dir {
            Direction::ToHost => (dst_pitch, src_pitch),
            Direction::ToDevice => (src_pitch, dst_pitch),
        };
        let contiguous = rows == 1 || (host_pitch == row_bytes && device_pitch == row_bytes);
        let pitched = host_pitch >= row_bytes
            && device_pitch >= row_bytes
            && host_pitch.max(device_pitch) <= self.inner.max_pitch;
        if contiguous {
            // SAFETY: the caller guarantees both sides are valid for the shape.
            unsafe { driver.memcpy(stream, dir, host, device, shape.bytes()) }
        } else if pitched {
            // SAFETY: as above; the pitches are within the driver's limit and rows don't overlap.
            unsafe { driver.memcpy_2d(stream, dir, host, host_pitch, device, device_pitch, row_bytes, rows) }
        } else {
            (0..rows).try_for_each(|r| {
                let (h, d) = (host.wrapping_add(r * host_pitch), device.offset(r * device_pitch));
                // SAFETY: row `r` of the shape, which the caller guarantees valid.
                unsafe { driver.memcpy(stream, dir, h, d, row_bytes) }
            })
        }
    }

    /// One launch of the pack (`ToHost`) or unpack kernel over `pieces`: the host side is
    /// packed in piece order.
    ///
    /// # Safety
    /// As [`crate::device::Device::pack_d2h`] or `unpack_h2d`.
    pub(crate) unsafe fn pieces(
        &self,
        stream: &R::Stream,
        dir: Direction,
        host: *mut u8,
        pieces: Vec<(DevicePtr, usize)>,
        mut keep: Vec<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let nonempty: Vec<(DevicePtr, usize)> = pieces.into_iter().filter(|p| p.1 > 0).collect();
        let Some(base) = nonempty.iter().map(|p| p.0).min() else {
            return self.hold_others(stream, keep);
        };
        let total: usize = nonempty.iter().map(|p| p.1).sum();
        self.bind()?;
        let function = self.function(match dir {
            Direction::ToHost => fixed::PACK_SEGMENTS,
            Direction::ToDevice => fixed::UNPACK_SEGMENTS,
        })?;
        let mapped = self.mapped(host)?;
        // Device offsets from the lowest piece.
        let segments: Vec<Segment> =
            nonempty.iter().map(|&(ptr, bytes)| Segment::new(ptr.0 - base.0, bytes as u64)).collect();
        // In pinned memory the kernel reads: see `arg_lists`.
        let list = self.inner.arg_lists.take_on(self, bytemuck::cast_slice(&segments))?;
        let (dst, src) = match dir {
            Direction::ToHost => (mapped.0, base.0),
            Direction::ToDevice => (base.0, mapped.0),
        };
        let (mut dst, mut src, mut list_ptr, mut count) = (dst, src, list.device_ptr().0, segments.len());
        let mut args = [arg(&mut dst), arg(&mut src), arg(&mut list_ptr), arg(&mut count)];
        // SAFETY: the pack kernels take `(dst, src, segments, count)`; every segment lies in a
        // piece the caller guarantees valid, the packed side holds `total` bytes, and the list
        // (mapped memory holding `count` segments) is held until the stream has run the kernel.
        let queued = unsafe {
            self.driver().launch(stream, &function, Shape::blocks(self.blocks(total / 16 + 1), BLOCK), &mut args)
        };
        keep.push(Arc::new(list));
        let held = self.hold_others(stream, keep);
        queued.and(held)
    }

    /// The blocks a mover of `wanted` blocks launches as: at least one, at most one per
    /// multiprocessor (where one always fits, so all are resident at once) and
    /// [`mover::MAX_BLOCKS`].
    fn mover_blocks(&self, wanted: usize) -> u32 {
        let most = self.units().min(u32::try_from(mover::MAX_BLOCKS).unwrap_or(1));
        u32::try_from(wanted).unwrap_or(u32::MAX).clamp(1, most)
    }

    /// Whether the mover kernel loads here (the builtin kernels were built).
    pub(crate) fn has_mover(&self) -> bool {
        self.bind().is_ok() && self.function(fixed::MOVER).is_ok()
    }

    /// Launches the mover kernel on `stream` as up to `blocks` blocks (at most one per
    /// multiprocessor, all resident at once: a cooperative launch, or one block where the driver
    /// has none or the device refuses it), the schedule passed as its words (the driver copies
    /// launch parameters when the launch is queued: nothing to allocate or keep), then holds
    /// `keep` until it has run.
    ///
    /// # Safety
    /// As [`crate::device::Device::queue_mover`].
    pub(crate) unsafe fn queue_mover(
        &self,
        stream: &R::Stream,
        schedule: Schedule,
        blocks: usize,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        let function = self.function(fixed::MOVER)?;
        let mut words = schedule.to_words();
        let base = words.as_mut_ptr();
        let mut args: [*mut c_void; Schedule::WORDS] = std::array::from_fn(|i| base.wrapping_add(i).cast());
        // SAFETY: the mover takes the schedule's words as `u64` arguments, each pointer above
        // one of them (alive until the launch returns, which copies them); the caller guarantees
        // every address of the schedule for the run, and `keep` holds the device rows until the
        // stream has run it.
        let queued = unsafe {
            let threads = mover::DEVICE_THREADS;
            match self.mover_blocks(blocks) {
                1 => self.driver().launch(stream, &function, Shape::blocks(1, threads), &mut args),
                // A driver or device may refuse a cooperative launch (HIP's is newer than the
                // ROCm this builds against; a GPU without support for it, or SMs taken by MPS);
                // a refused launch queued nothing, and one block needs no other resident.
                n => self.driver().launch(stream, &function, Shape::together(n, threads), &mut args).or_else(|e| {
                    tracing::debug!("a mover of {n} blocks was refused ({e}); launching it as one");
                    self.driver().launch(stream, &function, Shape::blocks(1, threads), &mut args)
                }),
            }
        };
        let held = self.hold_others(stream, keep);
        queued.and(held)
    }
}
