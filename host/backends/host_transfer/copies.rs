//! The device side of a staged operation: where each chunk lives ([`Geometry`]), and every
//! chunk's copies and flag operations ([`Copies`]).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use duralumin_kernels::flag::reached;
use duralumin_kernels::mover::{self, Schedule};

use super::plans::{InputArea, Region, cut};
use super::ring::Place;
use crate::api::error::Result;
use crate::device::{Copy2d, Device, DevicePtr, Flag, ReduceFns};

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
    /// `chunks` as a `u32` (an operation's chunk numbers fit a flag).
    pub(super) last_flag: u32,
    /// Staging elements per chunk.
    pub(super) slot_elems: usize,
    pub(super) send_parts: usize,
    /// Where the chunks lie in the communicator's ring (none when direct).
    pub(super) place: Option<Place>,
    /// The device buffers' own addresses when the MPI part works on them.
    pub(super) direct: Option<(usize, usize)>,
}

impl Geometry {
    /// The flag value that says chunk `k` is through a step: the ring's counter value for it,
    /// or `k + 1` on an operation's own flags (chunks are numbered below `chunks`, which fits a
    /// `u32`).
    pub(super) fn flag(&self, k: usize) -> u32 {
        match &self.place {
            Some(place) => place.flag(k),
            None => u32::try_from(k + 1).unwrap_or(self.last_flag),
        }
    }

    /// The flag value of the operation's last chunk.
    pub(super) fn last(&self) -> u32 {
        self.flag(self.chunks.max(1) - 1)
    }

    /// Elements of each row chunk `k` covers.
    pub(super) fn len_of(&self, k: usize) -> usize {
        self.chunk_elems.min(self.count - (k * self.chunk_elems).min(self.count))
    }

    /// Bytes of one chunk's staging.
    pub(super) fn chunk_bytes(&self) -> usize {
        self.slot_elems * self.sz
    }

    /// How many chunks the input stream stages ahead of the output stream: as many as the
    /// ring holds (chunk `k + ahead` refills chunk `k`'s cells).
    pub(super) fn ahead(&self) -> usize {
        match &self.place {
            Some(p) => p.at.ahead(self.chunks),
            None => 1,
        }
    }

    /// Host addresses of chunk `k`'s send and receive areas.
    pub(super) fn areas(&self, k: usize) -> (usize, usize) {
        match (self.direct, &self.place) {
            (Some(areas), _) => areas,
            (None, Some(place)) => {
                let cell = place.addr(k);
                (cell, cell + self.send_parts * self.len_of(k) * self.sz)
            }
            (None, None) => (0, 0),
        }
    }
}

/// The device side of an operation: every chunk's copies and flag operations, queued at once
/// by the calling thread ([`Copies::queue`]).
pub(super) struct Copies<D: Device> {
    pub(super) device: Arc<D>,
    /// Device-to-host and host-to-device streams: the communicator's copy streams, or the
    /// operation's stream itself when the MPI part works on the device buffers.
    pub(super) ins: D::Stream,
    pub(super) outs: D::Stream,
    pub(super) input: Option<(Region, InputArea)>,
    pub(super) output: Option<Region>,
    pub(super) device_reduce: Option<ReduceFns>,
    pub(super) recv_parts: usize,
    pub(super) geo: Geometry,
    /// Raised when a chunk is staged (the ring's *staged*, or the operation's own flag).
    pub(super) input_flag: Flag,
    /// Raised by the proxy thread when a chunk's MPI part is done.
    pub(super) output_flag: Flag,
    /// The ring's *drained* and *free* counters (staged operations only).
    pub(super) ring: Option<(Flag, Flag)>,
    pub(super) done: Flag,
    /// The *drained* value the communicator's earlier operations reach: the output side waits
    /// for it before it raises *drained* itself, so the counter only grows even where an
    /// earlier operation's mover copies back beside this operation's output stream.
    pub(super) after: u32,
    /// The operation only sends from staging (no output, not direct): the stream is released
    /// once the last chunk is staged, without waiting for the MPI part (a bcast root, a send).
    pub(super) early: bool,
}

impl<D: Device> Copies<D> {
    /// Queues a wait on `stream` for `flag` (if any) to reach `value`, unless it already has.
    ///
    /// # Safety
    /// As [`Copies::stage_in`].
    unsafe fn wait_unless_reached(&self, stream: &D::Stream, flag: Option<Flag>, value: u32) -> Result<()> {
        let Some(flag) = flag else { return Ok(()) };
        // SAFETY: the ring's counters live as long as the communicator's shared state, which
        // the operation holds.
        let now = unsafe { flag.atomic() }.load(Ordering::Acquire);
        if reached(now, value) {
            return Ok(());
        }
        // SAFETY: guaranteed by the caller; the value is raised by work queued before.
        unsafe { self.device.wait_flag(stream, flag, value, None) }
    }

    /// Queues chunk `k`'s device-to-host copy and raises the input flag, after the ring's
    /// *free* counter says its cells may be refilled (no wait where it says so already).
    ///
    /// # Safety
    /// The flags stay held until the output stream raised `done`; the ring outlives the
    /// operation.
    unsafe fn stage_in(&self, k: usize) -> Result<()> {
        let (device, ins, g) = (&*self.device, &self.ins, &self.geo);
        let sz = g.sz;
        if let Some(needs) = g.place.and_then(|p| p.at.needs_free(k)) {
            // SAFETY: guaranteed by the caller; the proxy thread raises *free*.
            unsafe { self.wait_unless_reached(ins, self.ring.map(|r| r.1), needs)? };
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
            // order); the destination is this chunk's cells of the ring, which no one else
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
    /// reduction), then raises the ring's *drained* counter.
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
            // cells before raising the output flag, and leaves them to this copy until *drained*.
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
        if let Some((drained, _)) = self.ring {
            // SAFETY: guaranteed by the caller.
            unsafe { device.write_flag(outs, drained, g.flag(k))? };
        }
        Ok(())
    }

    /// The operation as one mover's schedule: a staged operation whose input and output (if
    /// any) are device rows and whose results are copied back as they are (no device
    /// reduction); `None` for any other, which the copy-engine path queues. `ring` is the
    /// device address of the ring's first cell, `arrived` the device addresses of the ring's
    /// arrival words of a mover's blocks (input and output side).
    pub(super) fn schedule(&self, ring: DevicePtr, arrived: [u64; 2]) -> Option<Schedule> {
        let (g, place) = (&self.geo, self.geo.place?);
        let ((drained, free), None, None) = (self.ring?, g.direct, self.device_reduce) else { return None };
        let rows = |region: Option<&Region>| match region {
            None => Some(mover::Rows::default()),
            Some(Region::Rows(r)) => {
                Some(mover::Rows { ptr: r.ptr.addr(), parts: r.parts, len: r.len, pitch: r.pitch })
            }
            Some(Region::Pieces { .. }) => None,
        };
        let input_at = match self.input.as_ref().map(|i| i.1) {
            Some(InputArea::Recv { part }) => part + 1,
            _ => 0,
        };
        Some(Schedule {
            place: place.at,
            ring: ring.addr(),
            sz: g.sz,
            chunk_elems: g.chunk_elems,
            count: g.count,
            chunks: g.chunks,
            send_parts: g.send_parts,
            input: rows(self.input.as_ref().map(|i| &i.0))?,
            input_at,
            output: rows(self.output.as_ref())?,
            early: u32::from(self.early),
            after: self.after,
            staged: self.input_flag.device_ptr().addr(),
            output_flag: self.output_flag.device_ptr().addr(),
            drained: drained.device_ptr().addr(),
            free: free.device_ptr().addr(),
            done: self.done.device_ptr().addr(),
            arrived_in: arrived[0],
            arrived_out: arrived[1],
        })
    }

    /// Queues the operation as one mover on the input stream (see [`Copies::schedule`]), as up
    /// to `blocks` blocks that share every chunk's copies.
    ///
    /// # Safety
    /// As [`Copies::stage_in`]; `schedule` is this operation's.
    pub(super) unsafe fn queue_mover(&self, schedule: Schedule, blocks: usize) -> Result<()> {
        let keep = [self.input.as_ref().map(|i| &i.0), self.output.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|r| match r {
                Region::Rows(rows) => rows.keep.clone(),
                Region::Pieces { .. } => None,
            })
            .collect();
        // SAFETY: the schedule's rows were checked against the device buffers when the plan was
        // made and `keep` holds them; its cells and counters are the ring's, which the shared
        // state the operation holds keeps alive. The proxy thread raises *output* and *free*
        // (the latter once a chunk's MPI part is over and it is drained: by this mover, or by
        // earlier operations' work queued before it), and earlier operations' work raises the
        // *drained* its output side waits for first. The arrival words are the ring's too; every
        // mover of the communicator runs on this stream, so no two use them at once, and they
        // hold earlier chunks' numbers, which only grow.
        unsafe { self.device.queue_mover(&self.ins, schedule, blocks, keep) }
    }

    /// Blocks until what was queued on the two streams has run (after a failure, once its
    /// waits are released; errors are left to the one already being reported).
    pub(super) fn run_through(&self) {
        let _ = self.device.synchronize(&self.ins);
        let _ = self.device.synchronize(&self.outs);
    }

    /// Queues every chunk, the input side as far ahead as the ring allows, then raises `done`
    /// once the output side is through (the input side, for operations released early).
    ///
    /// # Safety
    /// As [`Copies::stage_in`].
    pub(super) unsafe fn queue(&self) -> Result<()> {
        let (chunks, ahead) = (self.geo.chunks, self.geo.ahead());
        // SAFETY: forwarded from the caller throughout.
        unsafe {
            if self.early {
                for k in 0..chunks {
                    self.stage_in(k)?;
                }
                return self.device.write_flag(&self.ins, self.done, 1);
            }
            // Chunk `k + ahead` may wait for chunk `k` to be drained: queued after it
            // (the queue-order rule: docs/architecture.md#the-queue-order-rule).
            for k in 0..ahead.min(chunks) {
                self.stage_in(k)?;
            }
            self.wait_unless_reached(&self.outs, self.ring.map(|r| r.0), self.after)?;
            for k in 0..chunks {
                self.stage_out(k)?;
                if k + ahead < chunks {
                    self.stage_in(k + ahead)?;
                }
            }
            self.device.write_flag(&self.outs, self.done, 1)
        }
    }
}
