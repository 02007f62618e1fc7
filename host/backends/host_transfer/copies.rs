//! The device side of a staged operation: where each chunk lives ([`Geometry`]), and every
//! chunk's copies and flag operations ([`Copies`]).

use std::sync::Arc;

use super::plans::{InputArea, Region, cut};
use crate::device::{Copy2d, Device, DevicePtr, Flag, ReduceFns};
use crate::error::Result;

/// The pieces of chunk `k` as `(address, bytes)`, empty ones left out.
fn chunk_pieces(pieces: &[(DevicePtr, usize)], k: usize, chunk_elems: usize, sz: usize) -> Vec<(DevicePtr, usize)> {
    pieces
        .iter()
        .filter_map(|&(ptr, len)| {
            let n = cut(len, k, chunk_elems);
            (n > 0).then(|| (ptr.offset(k * chunk_elems * sz), n * sz))
        })
        .collect()
}

/// Where chunk `k` of an operation lives: its row length and staging (or direct) areas.
#[derive(Clone, Copy)]
pub(super) struct Geometry {
    /// Element size.
    pub(super) sz: usize,
    /// Elements per row and chunk.
    pub(super) chunk_elems: usize,
    pub(super) count: usize,
    pub(super) chunks: usize,
    /// `chunks` as a flag value (the output and freed flags end at it).
    pub(super) last_flag: u32,
    pub(super) slots: usize,
    pub(super) slot_elems: usize,
    pub(super) send_parts: usize,
    /// Host address of the staging block (0 when direct).
    pub(super) base: usize,
    /// The device buffers' own addresses when the MPI part works on them.
    pub(super) direct: Option<(usize, usize)>,
}

impl Geometry {
    /// The flag value that says chunk `k` is through a step: `k + 1`. Chunks are numbered
    /// below `chunks`, which fits a `u32` (`last_flag`), so this never saturates.
    pub(super) fn flag(&self, k: usize) -> u32 {
        u32::try_from(k + 1).unwrap_or(self.last_flag)
    }

    /// Elements of each row chunk `k` covers.
    pub(super) fn len_of(&self, k: usize) -> usize {
        self.chunk_elems.min(self.count - (k * self.chunk_elems).min(self.count))
    }

    /// Bytes of the staging block: `slots` slots of `slot_elems` elements.
    pub(super) fn staging_bytes(&self) -> usize {
        self.slots * self.slot_elems * self.sz
    }

    /// Host addresses of chunk `k`'s send and receive areas.
    pub(super) fn areas(&self, k: usize) -> (usize, usize) {
        match self.direct {
            Some(areas) => areas,
            None => {
                let slot = self.base + (k % self.slots) * self.slot_elems * self.sz;
                (slot, slot + self.send_parts * self.len_of(k) * self.sz)
            }
        }
    }
}

/// The device side of an operation: every chunk's copies and flag operations, queued at once
/// by [`Copies::queue`]: by the calling thread, or by the proxy thread once the stream reaches
/// an operation that waited for staging memory there (or with `proxy_queues_copies`).
pub(super) struct Copies<D: Device> {
    pub(super) device: Arc<D>,
    /// Device-to-host and host-to-device streams (the same stream for one chunk).
    pub(super) ins: D::Stream,
    pub(super) outs: D::Stream,
    pub(super) input: Option<(Region, InputArea)>,
    pub(super) output: Option<Region>,
    pub(super) device_reduce: Option<ReduceFns>,
    pub(super) recv_parts: usize,
    pub(super) geo: Geometry,
    pub(super) input_flag: Flag,
    pub(super) output_flag: Flag,
    /// Raised when a chunk's slot may be refilled (two streams only): by the output stream,
    /// or by the proxy thread for operations released early.
    pub(super) freed: Option<Flag>,
    pub(super) done: Flag,
    /// The operation only sends from staging (no output, not direct): the stream is released
    /// once the last chunk is staged, without waiting for the MPI part (a bcast root, a send).
    pub(super) early: bool,
}

impl<D: Device> Copies<D> {
    /// Queues chunk `k`'s device-to-host copy and raises the input flag.
    ///
    /// # Safety
    /// The flags and the staging block stay held until the output stream raised `done`.
    unsafe fn stage_in(&self, k: usize) -> Result<()> {
        let (device, ins, g) = (&*self.device, &self.ins, &self.geo);
        let sz = g.sz;
        if let (Some(freed), true) = (self.freed, k >= g.slots) {
            // SAFETY: guaranteed by the caller; the output stream raises it independently.
            unsafe { device.wait_flag(ins, freed, g.flag(k - g.slots), None)? };
        }
        if let (Some((src, area)), None) = (&self.input, g.direct) {
            let len = g.len_of(k);
            let (send, recv) = g.areas(k);
            let dst = match *area {
                InputArea::Send => send,
                InputArea::Recv { part } => recv + self.recv_offset(part, k) * sz,
            };
            // SAFETY: the source rows or pieces were checked against the device buffers'
            // lengths when the plan was made and the buffers are kept alive (or freed in stream
            // order); the destination is this operation's staging slot, which no one else
            // touches until the proxy thread has seen the input flag.
            unsafe {
                match src {
                    Region::Rows(src) => {
                        let row = src.chunk_len(k, g.chunk_elems) * sz;
                        let shape =
                            Copy2d { row_bytes: row, rows: src.parts, src_pitch: src.pitch * sz, dst_pitch: len * sz };
                        let from = src.ptr.offset(k * g.chunk_elems * sz);
                        device.copy_d2h(ins, dst as *mut u8, from, shape, src.keep.clone())?
                    }
                    Region::Pieces { pieces, keep } => {
                        let list = chunk_pieces(pieces, k, g.chunk_elems, sz);
                        if !list.is_empty() {
                            device.pack_d2h(ins, dst as *mut u8, list, keep.clone())?
                        }
                    }
                }
            }
        }
        // SAFETY: guaranteed by the caller.
        unsafe { device.write_flag(ins, self.input_flag, g.flag(k)) }
    }

    /// Where row (or output piece) `part` of chunk `k` starts in the receive area, in elements.
    fn recv_offset(&self, part: usize, k: usize) -> usize {
        match &self.output {
            Some(Region::Pieces { pieces, .. }) => {
                pieces.iter().take(part).map(|p| cut(p.1, k, self.geo.chunk_elems)).sum()
            }
            _ => part * self.geo.len_of(k),
        }
    }

    /// Queues the wait for chunk `k`'s output flag and its host-to-device copy (or device
    /// reduction), then frees its slot if a later chunk refills it.
    ///
    /// # Safety
    /// As [`Copies::stage_in`].
    unsafe fn stage_out(&self, k: usize) -> Result<()> {
        let (device, outs, g) = (&*self.device, &self.outs, &self.geo);
        let sz = g.sz;
        // SAFETY: guaranteed by the caller; the proxy thread raises the output flag.
        unsafe { device.wait_flag(outs, self.output_flag, g.flag(k), None)? };
        if let (Some(dst), None) = (&self.output, g.direct) {
            let len = g.len_of(k);
            let (_, recv) = g.areas(k);
            // SAFETY: as in `stage_in`, the other way round; the proxy thread finished with the
            // slot before raising the output flag.
            unsafe {
                match (dst, self.device_reduce) {
                    (Region::Rows(dst), Some(fns)) => {
                        let to = dst.ptr.offset(k * g.chunk_elems * sz);
                        device.reduce_h2d(outs, to, recv as *const u8, self.recv_parts, len, fns)?
                    }
                    (Region::Rows(dst), None) => {
                        let row = dst.chunk_len(k, g.chunk_elems) * sz;
                        let shape =
                            Copy2d { row_bytes: row, rows: dst.parts, src_pitch: len * sz, dst_pitch: dst.pitch * sz };
                        let to = dst.ptr.offset(k * g.chunk_elems * sz);
                        device.copy_h2d(outs, to, recv as *const u8, shape, dst.keep.clone())?
                    }
                    (Region::Pieces { pieces, keep }, _) => {
                        let list = chunk_pieces(pieces, k, g.chunk_elems, sz);
                        if !list.is_empty() {
                            device.unpack_h2d(outs, list, recv as *const u8, keep.clone())?
                        }
                    }
                }
            }
        }
        // Only a chunk whose slot is refilled (by chunk `k + slots`) says it is free.
        if let (Some(freed), true) = (self.freed, k + g.slots < g.chunks) {
            // SAFETY: guaranteed by the caller.
            unsafe { device.write_flag(outs, freed, g.flag(k))? };
        }
        Ok(())
    }

    /// Blocks until what was queued on the two streams has run (after a failure, once its
    /// waits are released; errors are left to the one already being reported).
    pub(super) fn run_through(&self) {
        let _ = self.device.synchronize(&self.ins);
        let _ = self.device.synchronize(&self.outs);
    }

    /// Queues every chunk, `depth` slots ahead, then raises `done` on the output stream once
    /// both streams are through.
    ///
    /// # Safety
    /// As [`Copies::stage_in`].
    pub(super) unsafe fn queue(&self) -> Result<()> {
        let (chunks, slots) = (self.geo.chunks, self.geo.slots);
        // SAFETY: forwarded from the caller throughout.
        unsafe {
            if self.early {
                for k in 0..chunks {
                    self.stage_in(k)?;
                }
                return self.device.write_flag(&self.ins, self.done, 1);
            }
            for k in 0..slots {
                self.stage_in(k)?;
            }
            for k in 0..chunks {
                self.stage_out(k)?;
                if k + slots < chunks {
                    self.stage_in(k + slots)?;
                }
            }
            if self.freed.is_some() {
                self.device.join(&self.outs, &self.ins)?;
            }
            self.device.write_flag(&self.outs, self.done, 1)
        }
    }
}
