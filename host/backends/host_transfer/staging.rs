//! One pipelined staging engine for every HostTransfer operation.
//!
//! An operation is described by a [`Plan`]: its data is `parts` rows of `count` elements (the
//! per-rank blocks of a collective, one row for a reduction), every rank agrees on `count`, and
//! chunk `k` is the column range `[k C, (k + 1) C)` of every row. So one chunk of any operation
//! is again the same collective on smaller blocks, which the plan's `chunk` function builds
//! with the Mpi backend's planners on the staging slot. Rows move between device and host in
//! one 2-D copy per chunk and direction.
//!
//! Blocks of different lengths (v-collectives, point-to-point lists) are *pieces*, cut the same
//! way: chunk `k` holds elements `[k C, (k + 1) C)` of every piece, packed back to back by one
//! pack launch. Each rank then runs as many chunks as its own longest piece needs; operations
//! whose ranks may disagree on that (gatherv, scatterv, alltoallv, point-to-point) exchange
//! their chunks as point-to-point messages, which match pair by pair in order, since both
//! sides of a pair know the pair's length. So every operation, whatever its size, holds
//! `depth` slots of one chunk of pinned memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use duralumin_kernels::Element;
use duralumin_kernels::flag::reached;

use super::{Communicator, Shared};
use crate::backends::mpi::Job;
use crate::buffer::RawBuf;
use crate::device::pool::{FlagSlot, PinnedBlock, Retired};
use crate::device::{Copy2d, Device, DevicePtr, Flag, KeepAlive, ReduceFns};
use crate::error::{Error, Result};
use crate::progress::{OpFuture, Task};
use crate::reliability::OnTimeout;
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::State;

/// Device rows: `parts` rows of `len` elements starting at `ptr`, `pitch` elements apart.
/// `len` is the plan's `count` except for point-to-point, whose two directions may differ.
pub(crate) struct Rows {
    pub(crate) ptr: DevicePtr,
    pub(crate) parts: usize,
    pub(crate) len: usize,
    pub(crate) pitch: usize,
    pub(crate) keep: Option<KeepAlive>,
}

impl Rows {
    /// Elements of each row that chunk `k` (of `c` elements per row) covers.
    fn chunk_len(&self, k: usize, c: usize) -> usize {
        c.min(self.len.saturating_sub(k * c))
    }
}

/// Elements of a `len`-element row or piece that chunk `k` covers, at `c` elements per chunk.
pub(crate) fn cut(len: usize, k: usize, c: usize) -> usize {
    c.min(len.saturating_sub(k.saturating_mul(c)))
}

/// Whether chunk `k` carries a message for a `len`-element piece: every chunk with elements of
/// it, and chunk 0 always (an empty piece is one empty message, so both sides of a pair agree
/// on the number of messages, and an empty message meeting a non-empty receive is a count
/// error rather than a receive waiting forever).
pub(crate) fn carries(len: usize, k: usize, c: usize) -> bool {
    k == 0 || cut(len, k, c) > 0
}

/// The pieces of chunk `k` as `(address, bytes)`, empty ones left out.
fn chunk_pieces(pieces: &[(DevicePtr, usize)], k: usize, c: usize, sz: usize) -> Vec<(DevicePtr, usize)> {
    pieces
        .iter()
        .filter_map(|&(ptr, len)| {
            let n = cut(len, k, c);
            (n > 0).then(|| (ptr.offset(k * c * sz), n * sz))
        })
        .collect()
}

/// Device data of an operation: rows (cut into chunks), or a list of pieces `(address,
/// elements)` of different lengths, each cut into chunks the same way and packed back to back
/// in staging (v-collectives and point-to-point lists).
pub(crate) enum Region {
    Rows(Rows),
    Pieces { pieces: Vec<(DevicePtr, usize)>, keep: Vec<KeepAlive> },
}

/// Where staged input goes: the send area, or the receive area from its row (or output piece)
/// `part` on (in-place operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Into {
    Send,
    Recv { part: usize },
}

/// The staging buffers of one chunk: `send_parts × len` and `recv_parts × len` elements (`len`
/// the chunk's row length), rows contiguous, or the chunk's pieces packed. `send` is `None`
/// where the operation stages in place.
pub(crate) struct ChunkBufs<T> {
    pub(crate) send: Option<RawBuf<T>>,
    pub(crate) recv: RawBuf<T>,
    /// The chunk's index.
    pub(crate) k: usize,
    /// Elements per row (or piece) and chunk: chunk `k` covers `cut(len, k, c)` of each.
    pub(crate) c: usize,
}

/// Builds the MPI part of one chunk on its staging buffers.
pub(crate) type ChunkFn<T> = Box<dyn FnMut(&crate::Communicator, ChunkBufs<T>) -> Result<Job<T>> + Send>;

/// A staged operation.
pub(crate) struct Plan<T> {
    /// Elements per row (the longest piece's for pieces): the same on every rank, except in
    /// plans that [`exchange`](Plan::exchange) their chunks, where each rank runs its own.
    pub(crate) count: usize,
    /// Rows that the chunk size is divided among: the same on every rank (the communicator
    /// size for block collectives and v-collectives, 1 for reductions and point-to-point), so
    /// every rank cuts the same chunks.
    pub(crate) width: usize,
    pub(crate) send_parts: usize,
    pub(crate) recv_parts: usize,
    /// Device rows copied in before each chunk's MPI part.
    pub(crate) input: Option<(Region, Into)>,
    /// Device rows the receive area's first rows are copied back to.
    pub(crate) output: Option<Region>,
    /// Reduce the receive area's `recv_parts` rows into the output rows on the device (with
    /// the #3 kernels on a GPU) instead of copying them back.
    pub(crate) device_reduce: Option<ReduceFns>,
    /// The chunks go as point-to-point messages (gatherv, scatterv, alltoallv, point-to-point),
    /// matched pair by pair: every rank must cut them alike, so the plan is always staged at
    /// the configured chunk size, never run on the device buffers in one piece (a direct
    /// sender's one message would meet a staged receiver's chunks).
    pub(crate) exchange: bool,
    pub(crate) chunk: ChunkFn<T>,
}

impl<T> Plan<T> {
    /// Where the MPI part reads and writes when it works on the device buffers themselves:
    /// `(send, receive)` host addresses, the layout staging would have with one chunk. `None`
    /// for plans with piece lists, whose staging packs them.
    fn direct_areas(&self, sz: usize) -> Option<(usize, usize)> {
        if self.device_reduce.is_some() {
            return None;
        }
        let rows = |r: &Region| match r {
            Region::Rows(rows) => Some(rows.ptr.0 as usize),
            Region::Pieces { .. } => None,
        };
        let input = match &self.input {
            Some((r, into)) => Some((rows(r)?, *into)),
            None => None,
        };
        let output = match &self.output {
            Some(r) => Some(rows(r)?),
            None => None,
        };
        let send = match input {
            Some((p, Into::Send)) => p,
            _ => 0,
        };
        let recv = match (output, input) {
            (Some(p), _) => p,
            (None, Some((p, Into::Recv { part }))) => p - part * self.count * sz,
            _ => 0,
        };
        Some((send, recv))
    }

    /// What keeps the plan's device buffers alive.
    fn keep_alives(&self) -> Vec<KeepAlive> {
        let of = |r: &Region| match r {
            Region::Rows(rows) => rows.keep.iter().cloned().collect::<Vec<_>>(),
            Region::Pieces { keep, .. } => keep.clone(),
        };
        self.input.iter().flat_map(|(r, _)| of(r)).chain(self.output.iter().flat_map(of)).collect()
    }
}

/// The flags and staging memory of an operation in flight. Dropping it (normally after the
/// stream raised `done`; early only if the MPI part panicked) releases the stream and waits for
/// it to stop using the staging memory before the memory goes back to the pool.
struct InFlight<D: Device> {
    shared: Arc<Shared<D>>,
    ticket: u64,
    turn_held: bool,
    chunks: u32,
    input: FlagSlot<D>,
    /// Shared with the calling thread while it queues (it releases the waits if that fails).
    output: Arc<FlagSlot<D>>,
    /// Raised by the output stream when a chunk's slot may be refilled (two-stream staging).
    freed: Option<Arc<FlagSlot<D>>>,
    /// Raised by the stream when it reaches a pipelined operation whose copies the proxy thread
    /// queues (then).
    start: Option<FlagSlot<D>>,
    /// Whether every chunk's device work was queued (else `done` is raised by the host).
    queued: bool,
    done: Arc<FlagSlot<D>>,
    staging: Option<PinnedBlock<D>>,
    /// The staging block once handed back for the stream's `done` to free.
    retired: Option<Retired<D>>,
    /// The operation's turn to take staging memory, while it waits for it (see
    /// [`Grants`](super::Grants)).
    grant: Option<u64>,
    /// The device buffers, held while the MPI part works on them directly.
    keep: Vec<KeepAlive>,
}

impl<D: Device> InFlight<D> {
    /// Takes the operation's staging block, `slots` slots of `slot_bytes`, once every earlier
    /// operation has had its own and the pool has room: `None` while it must wait; the block
    /// and the number of slots it holds once granted.
    ///
    /// The proxy thread frees no pinned memory (that may wait for the device, whose streams
    /// may be waiting for this thread). So when nothing is in use any more but only freeing
    /// idle blocks could make room, the operation pipelines through fewer slots, as many as
    /// the largest idle block holds, rather than wait for ever; with not even one, it fails.
    fn try_grant(&mut self, slot_bytes: usize, slots: usize) -> Option<Result<(PinnedBlock<D>, usize)>> {
        let grant = self.grant?;
        let mut grants = self.shared.grants();
        if grants.next != grant {
            return None;
        }
        let pools = &self.shared.pools;
        let mut got = pools.try_take(slots * slot_bytes, false).map(|b| b.map(|b| (b, slots)));
        if matches!(got, Ok(None)) {
            if pools.stats().in_use_bytes > 0 {
                return None;
            }
            for fewer in (1..slots).rev() {
                match pools.try_take(fewer * slot_bytes, false) {
                    Ok(None) => continue,
                    other => {
                        got = other.map(|b| b.map(|b| (b, fewer)));
                        break;
                    }
                }
            }
        }
        let got = got.and_then(|g| {
            g.ok_or(Error::PoolExhausted { requested: slot_bytes, in_use: 0, cap: pools.stats().cap_bytes })
        });
        grants.pass(grant);
        self.grant = None;
        Some(got)
    }

    /// Lets every wait the device may have queued for this operation pass.
    fn release_all(&self) {
        release_waits(&self.output, self.freed.as_deref(), self.chunks);
    }

    /// The communicator was given up ([`OnTimeout::Error`](crate::reliability::OnTimeout)):
    /// every wait the device has queued for the operation passes (the stream goes on, its
    /// outputs undefined), later operations get their turns, and the operation's staging,
    /// flags and buffers are leaked rather than freed or waited for, since MPI or the device
    /// may still use them. The operation's error is recorded for `synchronize`.
    fn abandon(self, m: &Monitor, id: OpId) -> Result<()> {
        self.release_all();
        if !self.queued {
            self.done.store(1);
        }
        if self.turn_held {
            self.shared.pass_turn(self.ticket);
        }
        if let Some(grant) = self.grant {
            self.shared.grants().abandon(grant);
        }
        if let Some(p) = m.poisoned() {
            self.shared.errors.record(p.error(Asker::Op(id)));
        }
        std::mem::forget(self);
        Ok(())
    }
}

impl<D: Device> Drop for InFlight<D> {
    fn drop(&mut self) {
        self.release_all();
        if !self.queued {
            // Nothing (or not everything) was queued: no stream will raise `done`.
            self.done.store(1);
        }
        if self.turn_held {
            self.shared.pass_turn(self.ticket);
        }
        if let Some(grant) = self.grant.take() {
            self.shared.grants().abandon(grant);
        }
        self.done.wait_for(1);
        self.staging.take();
        self.retired.take();
        self.keep.clear();
    }
}

/// Raises the flags the copy streams of an operation of `chunks` chunks wait for (`output` on
/// the output stream, `freed` on the input stream) to their last values, so every such wait
/// passes.
fn release_waits<D: Device>(output: &FlagSlot<D>, freed: Option<&FlagSlot<D>>, chunks: u32) {
    output.raise(chunks);
    if let Some(freed) = freed {
        freed.raise(chunks);
    }
}

/// A future that is ready once `ready()` holds.
async fn until(mut ready: impl FnMut() -> bool) {
    if ready() {
        return;
    }
    std::future::poll_fn(|_| {
        if ready() {
            crate::progress::made_progress();
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await
}

/// Where chunk `k` of an operation lives: its row length and staging (or direct) areas.
#[derive(Clone, Copy)]
struct Geometry {
    /// Element size.
    sz: usize,
    /// Elements per row and chunk.
    c: usize,
    count: usize,
    chunks: usize,
    slots: usize,
    slot_elems: usize,
    send_parts: usize,
    /// Host address of the staging block (0 when direct).
    base: usize,
    /// The device buffers' own addresses when the MPI part works on them.
    direct: Option<(usize, usize)>,
}

impl Geometry {
    /// Elements of each row chunk `k` covers.
    fn len_of(&self, k: usize) -> usize {
        self.c.min(self.count - (k * self.c).min(self.count))
    }

    /// Host addresses of chunk `k`'s send and receive areas.
    fn areas(&self, k: usize) -> (usize, usize) {
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
struct Copies<D: Device> {
    device: Arc<D>,
    /// Device-to-host and host-to-device streams (the same stream for one chunk).
    ins: D::Stream,
    outs: D::Stream,
    input: Option<(Region, Into)>,
    output: Option<Region>,
    device_reduce: Option<ReduceFns>,
    recv_parts: usize,
    geo: Geometry,
    input_flag: Flag,
    output_flag: Flag,
    /// Raised when a chunk's slot may be refilled (two streams only): by the output stream,
    /// or by the proxy thread for operations released early.
    freed: Option<Flag>,
    done: Flag,
    /// The operation only sends from staging (no output, not direct): the stream is released
    /// once the last chunk is staged, without waiting for the MPI part (a bcast root, a send).
    early: bool,
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
            unsafe { device.wait_flag(ins, freed, (k - g.slots + 1) as u32, None)? };
        }
        if let (Some((src, into)), None) = (&self.input, g.direct) {
            let len = g.len_of(k);
            let (send, recv) = g.areas(k);
            let dst = match *into {
                Into::Send => send,
                Into::Recv { part } => recv + self.recv_offset(part, k) * sz,
            };
            // SAFETY: the source rows or pieces were checked against the device buffers'
            // lengths when the plan was made and the buffers are kept alive (or freed in stream
            // order); the destination is this operation's staging slot, which no one else
            // touches until the proxy thread has seen the input flag.
            unsafe {
                match src {
                    Region::Rows(src) => {
                        let row = src.chunk_len(k, g.c) * sz;
                        let shape =
                            Copy2d { row_bytes: row, rows: src.parts, src_pitch: src.pitch * sz, dst_pitch: len * sz };
                        let from = src.ptr.offset(k * g.c * sz);
                        device.copy_d2h(ins, dst as *mut u8, from, shape, src.keep.clone())?
                    }
                    Region::Pieces { pieces, keep } => {
                        let list = chunk_pieces(pieces, k, g.c, sz);
                        if !list.is_empty() {
                            device.pack_d2h(ins, dst as *mut u8, list, keep.clone())?
                        }
                    }
                }
            }
        }
        // SAFETY: guaranteed by the caller.
        unsafe { device.write_flag(ins, self.input_flag, (k + 1) as u32) }
    }

    /// Where row (or output piece) `part` of chunk `k` starts in the receive area, in elements.
    fn recv_offset(&self, part: usize, k: usize) -> usize {
        match &self.output {
            Some(Region::Pieces { pieces, .. }) => pieces.iter().take(part).map(|p| cut(p.1, k, self.geo.c)).sum(),
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
        unsafe { device.wait_flag(outs, self.output_flag, (k + 1) as u32, None)? };
        if let (Some(dst), None) = (&self.output, g.direct) {
            let len = g.len_of(k);
            let (_, recv) = g.areas(k);
            // SAFETY: as in `stage_in`, the other way round; the proxy thread finished with the
            // slot before raising the output flag.
            unsafe {
                match (dst, self.device_reduce) {
                    (Region::Rows(dst), Some(fns)) => {
                        let to = dst.ptr.offset(k * g.c * sz);
                        device.reduce_h2d(outs, to, recv as *const u8, self.recv_parts, len, fns)?
                    }
                    (Region::Rows(dst), None) => {
                        let row = dst.chunk_len(k, g.c) * sz;
                        let shape =
                            Copy2d { row_bytes: row, rows: dst.parts, src_pitch: len * sz, dst_pitch: dst.pitch * sz };
                        let to = dst.ptr.offset(k * g.c * sz);
                        device.copy_h2d(outs, to, recv as *const u8, shape, dst.keep.clone())?
                    }
                    (Region::Pieces { pieces, keep }, _) => {
                        let list = chunk_pieces(pieces, k, g.c, sz);
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
            unsafe { device.write_flag(outs, freed, (k + 1) as u32)? };
        }
        Ok(())
    }

    /// Blocks until what was queued on the two streams has run (after a failure, once its
    /// waits are released; errors are left to the one already being reported).
    fn run_through(&self) {
        let _ = self.device.synchronize(&self.ins);
        let _ = self.device.synchronize(&self.outs);
    }

    /// Queues every chunk, `depth` slots ahead, then raises `done` on the output stream once
    /// both streams are through.
    ///
    /// # Safety
    /// As [`Copies::stage_in`].
    unsafe fn queue(&self) -> Result<()> {
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

/// An operation handed to the proxy thread and queued on a stream.
pub(crate) struct Queued<D: Device> {
    /// Raised to 1 by the stream once the operation has completed there.
    pub(crate) done: Arc<FlagSlot<D>>,
    /// Its host part, which a thread waiting for the operation drives too.
    pub(crate) task: Arc<Task>,
}

impl<D: Device> Communicator<D> {
    /// Waits on the calling thread until the pool can lend `bytes` of staging: the earlier
    /// operations holding it are fully queued, so the proxy thread and the device finish them
    /// without this thread (as NCCL's host waits when its queue of work is full). An MPI
    /// failure recorded meanwhile ends the wait with that error.
    fn wait_for_staging(&self, bytes: usize) -> Result<PinnedBlock<D>> {
        let m = &self.shared.monitor;
        let wait = m.wait_begin("a wait for staging memory");
        let mut backoff = crate::progress::Backoff::default();
        let got = loop {
            match self.shared.pools.try_take(bytes, true) {
                Ok(Some(block)) => break Ok(block),
                Err(e) => break Err(e),
                Ok(None) => {}
            }
            if let Err(e) = self.shared.errors.check().and_then(|()| m.check_poison(Asker::Waiter(wait))) {
                break Err(e);
            }
            backoff.snooze();
        };
        m.wait_end(wait);
        got
    }

    /// Queues `plan` on `stream` and hands its MPI part to the proxy thread. Returns the flag the
    /// stream raises to 1 when the operation has completed on it, and the task of its host part
    /// (which [`Communicator::synchronize`] drives too).
    ///
    /// The calling thread queues the device work of every chunk: one chunk on `stream`; more on
    /// the two internal copy streams (device-to-host on one, host-to-device on the other, so
    /// both directions overlap each other and the MPI work), which start where `stream` is and
    /// which `stream` then waits for. Work is queued after whatever it waits for (see below).
    /// When the pool cannot lend the staging until earlier operations give theirs back, the
    /// calling thread waits for that first. With `proxy_queues_copies` (and for operations
    /// waiting for memory then), the stream raises *start* and waits for *done*, and the proxy
    /// thread queues the copies once it sees *start*: two flag operations on the calling
    /// thread whatever the size.
    ///
    /// `id` is the operation's record: the proxy thread marks it running when the stream
    /// reaches the operation, and done or failed when its MPI part ends; a failure to queue
    /// marks it failed.
    pub(crate) fn enqueue<T: Element>(&self, stream: &D::Stream, plan: Plan<T>, id: OpId) -> Result<Queued<D>> {
        let queued = self.enqueue_recorded(stream, plan, id);
        if let Err(e) = &queued {
            self.shared.monitor.set(id, State::Failed, Some(e.to_string()));
        }
        queued
    }

    fn enqueue_recorded<T: Element>(&self, stream: &D::Stream, mut plan: Plan<T>, id: OpId) -> Result<Queued<D>> {
        let sz = size_of::<T>().max(1);
        let device = &*self.shared.device;
        // Device memory the host can address needs no staging: the MPI part runs on it.
        // Not when the operation may be abandoned (`OnTimeout::Error`): MPI must then only hold
        // memory the library owns (staging, which is leaked with the operation).
        let abandonable = self.shared.monitor.on_timeout() == OnTimeout::Error;
        let direct = (self.config.direct && !plan.exchange && device.host_accessible() && !abandonable)
            .then(|| plan.direct_areas(sz))
            .flatten();
        let c = match direct {
            Some(_) => plan.count.max(1),
            None => {
                let fixed = plan.exchange || plan.device_reduce.is_some();
                self.config.chunk_elems(plan.count, sz, plan.width, fixed)
            }
        };
        let chunks = plan.count.div_ceil(c).max(1);
        let chunks32 =
            u32::try_from(chunks).map_err(|_| Error::CountOverflow { what: "chunks", value: chunks as u128 })?;
        let slots = self.config.depth.min(chunks);
        let slot_elems = (plan.send_parts + plan.recv_parts) * c.min(plan.count);
        let bytes = slots * slot_elems * sz;
        let pools = &self.shared.pools;
        // Staging is granted in queue order: an operation takes it now only if no earlier one
        // is waiting for memory (else it could hold what that one waits for, while waiting for
        // that one's MPI turn). Without room now, the calling thread waits for the memory; with
        // `proxy_queues_copies`, the proxy thread takes it when the operation's turn and the
        // memory come, and the stream waits on the device meanwhile.
        let staging = match direct {
            Some(_) => None,
            None if self.shared.grants().next == self.grants_issued.get() => match pools.try_take(bytes, true)? {
                None if !self.config.proxy_queues_copies => Some(self.wait_for_staging(bytes)?),
                got => got,
            },
            None => {
                pools.check_fits(bytes)?;
                None
            }
        };
        let waits_for_memory = direct.is_none() && staging.is_none();
        let (input, output, done) = (pools.flag()?, Arc::new(pools.flag()?), Arc::new(pools.flag()?));
        let mut geo = Geometry {
            sz,
            c,
            count: plan.count,
            chunks,
            slots,
            slot_elems,
            send_parts: plan.send_parts,
            base: staging.as_ref().map_or(0, |s| s.ptr() as usize),
            direct,
        };
        let keeps = plan.keep_alives();
        let in_place = !matches!(plan.input, Some((_, Into::Send)));
        device.acquire(stream, &keeps)?;
        let two = direct.is_none() && (chunks > 1 || waits_for_memory);
        // Send-only operations staged through pinned memory: once the data is staged, the device
        // buffers are free, so the stream need not wait for the MPI part.
        let early = direct.is_none() && plan.output.is_none() && plan.input.is_some();
        // Device work is queued in the order it depends on: whatever releases a stream's wait
        // on the device is queued before that wait, or is a write by the host. A GPU may run
        // streams that share a hardware queue one item at a time, and a stream wait (or work
        // behind it on its stream) that needs work queued later would then hold that work up
        // for ever. So the calling thread queues every chunk's copies; only an operation that
        // waits for staging memory (or a communicator configured to) has the proxy thread
        // queue them, once the stream raises `start`.
        let deferred = waits_for_memory || (two && self.config.proxy_queues_copies);
        let freed = if two { Some(Arc::new(pools.flag()?)) } else { None };
        let start = if deferred { Some(pools.flag()?) } else { None };
        let (ins, outs) = match self.copy_streams_if(two)? {
            Some((i, o)) => (i.clone(), o.clone()),
            None => (stream.clone(), stream.clone()),
        };
        let copies = Copies {
            device: Arc::clone(&self.shared.device),
            ins,
            outs,
            input: plan.input.take(),
            output: plan.output.take(),
            device_reduce: plan.device_reduce,
            recv_parts: plan.recv_parts,
            geo,
            input_flag: input.flag(),
            output_flag: output.flag(),
            freed: freed.as_deref().map(FlagSlot::flag),
            done: done.flag(),
            early,
        };
        let wait_done = || {
            // SAFETY: the wait keeps `done`'s slot. The operation's own hold is not enough: it
            // ends when the proxy thread sees `done`, which may be before this stream does, and
            // a later operation could then take the slot and reset it to 0 under the stream's
            // wait, which would never end.
            unsafe { device.wait_flag(stream, done.flag(), 1, Some(Arc::clone(&done) as KeepAlive)) }
        };
        // The operation goes to the proxy thread before its device work is queued: a GPU's
        // command queue holds about a thousand items, and a calling thread queueing more (an
        // operation of hundreds of chunks) blocks until the device has run some, which needs
        // the proxy thread to run the operation's first chunks meanwhile. Tickets are still
        // taken in the program's order.
        let ticket = self.next_ticket();
        let grant = direct.is_none().then(|| self.next_grant());
        if let (Some(g), false) = (grant, waits_for_memory) {
            self.shared.grants().pass(g);
        }
        // Set when the calling thread's queueing failed, after what it queued has run through
        // with its waits released: the proxy thread then lets the operation go.
        let abandoned = Arc::new(AtomicBool::new(false));
        let gave_up = Arc::clone(&abandoned);
        let (mut deferred, mine) = if start.is_some() { (Some(copies), None) } else { (None, Some(copies)) };
        let (out_flag, freed_flag) = (Arc::clone(&output), freed.clone());
        let mut op = InFlight {
            shared: Arc::clone(&self.shared),
            ticket,
            turn_held: false,
            chunks: chunks32,
            input,
            output,
            freed,
            start,
            queued: deferred.is_none(),
            done: Arc::clone(&done),
            staging,
            retired: None,
            grant: grant.filter(|_| waits_for_memory),
            keep: if direct.is_some() { keeps.clone() } else { Vec::new() },
        };
        let start_flag = op.start.as_ref().map(FlagSlot::flag);
        let recv_parts = plan.recv_parts;
        let m = Arc::clone(&self.shared.monitor);
        let fut: OpFuture = Box::pin(async move {
            // Whether the communicator was given up: every wait below also ends then, and the
            // operation is abandoned (see `InFlight::abandon`).
            let stop = || m.poisoned().is_some();
            let mut result = Ok(());
            if let (Some(copies), Some(start)) = (&mut deferred, &op.start) {
                until(|| reached(start.load(), 1) || gave_up.load(Ordering::Acquire) || stop()).await;
                if stop() {
                    return op.abandon(&m, id);
                }
                if gave_up.load(Ordering::Acquire) {
                    // The calling thread could not queue the stream's part: nothing to run.
                    result = Err(Error::Progress("the operation was not queued"));
                } else if op.grant.is_some() {
                    let mut got = None;
                    until(|| {
                        got = op.try_grant(slot_elems * sz, slots);
                        got.is_some() || stop()
                    })
                    .await;
                    if stop() {
                        return op.abandon(&m, id);
                    }
                    match got {
                        Some(Ok((block, granted))) => {
                            geo.base = block.ptr() as usize;
                            geo.slots = granted;
                            copies.geo = geo;
                            op.staging = Some(block);
                        }
                        Some(Err(e)) => result = Err(e),
                        None => {}
                    }
                }
                if result.is_ok() {
                    // SAFETY: the operation holds the flags and staging until `done`.
                    result = unsafe { copies.queue() };
                }
                op.queued = result.is_ok();
            }
            // An error is recorded as soon as it happens: before the output flag that lets the
            // stream (and so a `synchronize` waiting for it) finish, which then reports it. (The
            // calling thread returns its own queueing errors.)
            let mut failed = false;
            if let Err(e) = result {
                if !gave_up.load(Ordering::Acquire) {
                    op.shared.errors.record(m.end(id, Err(e)).err().unwrap_or(Error::Progress("queueing failed")));
                }
                failed = true;
            }
            until(|| op.shared.has_turn(ticket) || stop()).await;
            if stop() {
                return op.abandon(&m, id);
            }
            op.turn_held = true;
            for k in 0..if op.queued { chunks } else { 0 } {
                until(|| reached(op.input.load(), (k + 1) as u32) || gave_up.load(Ordering::Acquire) || stop()).await;
                if stop() {
                    return op.abandon(&m, id);
                }
                if k == 0 && !failed && !gave_up.load(Ordering::Acquire) {
                    // The stream has reached the operation: this rank is in it, and the
                    // deadline runs.
                    m.set(id, State::Running, None);
                }
                if gave_up.load(Ordering::Acquire) {
                    // The calling thread's queueing failed and what it queued has run through.
                    op.queued = false;
                    break;
                }
                if !failed {
                    let len = geo.len_of(k);
                    let (send, recv) = geo.areas(k);
                    let send = RawBuf::from_raw(send as *mut T, geo.send_parts * len);
                    let recv = RawBuf::from_raw(recv as *mut T, recv_parts * len);
                    let bufs = ChunkBufs { send: (!in_place).then_some(send), recv, k, c };
                    let job = {
                        let mpi = op.shared.mpi.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        (plan.chunk)(&mpi, bufs).map(|job| mpi.job_future(job))
                    };
                    let ran = match job {
                        Ok(f) => {
                            match crate::progress::unless(f, || m.poisoned().map(|p| p.error(Asker::Op(id)))).await {
                                Ok(ran) => ran,
                                Err(_) => return op.abandon(&m, id),
                            }
                        }
                        Err(e) => Err(e),
                    };
                    if let Err(e) = ran {
                        // A failed collective may leave the other ranks waiting: the monitor
                        // has the watchdog report it (see `Monitor::fault`).
                        op.shared.errors.record(m.end(id, Err(e)).err().unwrap_or(Error::Progress("chunk failed")));
                        failed = true;
                    }
                }
                if let (true, Some(freed)) = (early, &op.freed) {
                    // No copy back: the slot is free for chunk `k + depth` now.
                    freed.raise((k + 1) as u32);
                }
                if k + 1 == chunks {
                    // Only the stream's last copies back use the staging now: it is free once
                    // `done` is raised, so an operation queued after a synchronize can have it
                    // before this thread sees `done`.
                    op.retired = op.staging.take().map(|b| b.retire_on(Arc::clone(&op.done)));
                }
                // Raised, not stored: a calling thread giving up may have released every wait meanwhile.
                op.output.raise((k + 1) as u32);
            }
            op.shared.pass_turn(ticket);
            op.turn_held = false;
            if !failed {
                m.set(id, State::Done, None);
            }
            if let (Some(copies), false, false) = (&deferred, op.queued, gave_up.load(Ordering::Acquire)) {
                // Queueing failed part-way: let what was queued run through, then release the
                // stream (its output is unspecified; the error is recorded). (When the calling
                // thread gave up, this thread queued nothing.)
                op.release_all();
                copies.run_through();
                op.done.store(1);
            }
            if op.queued {
                until(|| reached(op.done.load(), 1) || stop()).await;
                if !reached(op.done.load(), 1) {
                    // Given up while the stream is held up (by the program's own work): never
                    // wait for it here.
                    return op.abandon(&m, id);
                }
            }
            drop(op);
            Ok(())
        });
        let task = Task::new(fut);
        self.engine.submit_now(Arc::clone(&task));
        self.track(Arc::clone(&task));

        // On failure, whether the operation is to be let go: not when the stream already
        // raised (or will raise) `start`, after which the proxy thread runs it to its end.
        let queued: std::result::Result<(), (Error, bool)> = match (start_flag, &mine) {
            // SAFETY: `start` is held by the operation until the proxy thread has seen it.
            (Some(start), _) => match unsafe { device.write_flag(stream, start, 1) } {
                Err(e) => Err((e, true)),
                Ok(()) => wait_done().map_err(|e| (e, false)),
            },
            (None, Some(copies)) => {
                // SAFETY: the flags and staging are held by the operation until `done`.
                unsafe {
                    // The copy streams start where the stream is now: its earlier work made
                    // the data.
                    let joined = if two { device.join(&copies.ins, stream) } else { Ok(()) };
                    joined.and_then(|()| copies.queue()).and_then(|()| if two { wait_done() } else { Ok(()) })
                }
                .map_err(|e| (e, true))
            }
            (None, None) => Ok(()),
        };
        if let Err((e, abandon)) = queued {
            if abandon {
                // Let what was queued run through (its waits released), then let the proxy
                // thread drop the operation, whose flags and staging go back to the pool; the
                // outputs are unspecified.
                release_waits(&out_flag, freed_flag.as_deref(), chunks32);
                if let Some(copies) = &mine {
                    copies.run_through();
                }
                abandoned.store(true, Ordering::Release);
            }
            let _ = device.release(stream, &keeps);
            return Err(e);
        }
        device.release(stream, &keeps)?;
        Ok(Queued { done, task })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::{Communicator, HostTransferConfig};
    use crate::Sum;
    use crate::device::host::HostDevice;

    const LIMIT: Duration = Duration::from_secs(30);

    /// A stream that falls behind the proxy thread still passes its wait for a pipelined
    /// operation's `done` flag. The stream is held at that wait until the proxy thread has
    /// finished the operation; the flag's slot must still be lent then (the wait holds it), and
    /// an operation queued next on the stream must not take it. When the operation's own hold
    /// was all there was, the next operation took the slot and reset it to 0 under the wait,
    /// and the stream never went on.
    #[test]
    fn a_stream_behind_the_proxy_thread_keeps_its_done_flag() {
        let universe = crate::init().expect("MPI init (singleton)");
        let world = universe.world();
        let dev = HostDevice::new(0);
        let stream = dev.stream().unwrap();
        let config = HostTransferConfig { chunk_bytes: 4 << 10, direct: false, ..Default::default() };
        let c = Communicator::with_config(&world, dev.clone(), stream.clone(), config).unwrap();
        let len = 4 << 10; // 16 KiB of u32: four chunks, so the operation pipelines.
        let send = dev.upload(&vec![3u32; len]).unwrap();
        let (mut first, mut second) = (dev.alloc_zeroed::<u32>(len).unwrap(), dev.alloc_zeroed::<u32>(len).unwrap());

        let gate = stream.wait_gate();
        gate.hold();
        // Whatever fails below, the stream is let go, so the test fails rather than hangs.
        let _open = gate.held_until_drop();
        c.allreduce(&send, &mut first, Sum).unwrap();
        assert!(gate.reached_by(1, LIMIT), "the stream never reached its wait for done");
        // The proxy thread lets go of the operation's flags (four of them) once it sees `done`.
        let end = Instant::now() + LIMIT;
        while c.pool_stats().flags_in_use > 1 {
            assert!(Instant::now() < end, "the operation never finished: {:?}", c.pool_stats());
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(c.pool_stats().flags_in_use, 1, "the stream waits on done, so its slot must stay lent");
        // Without that, the next operation takes the slot: its flags are set to 0 on taking.

        c.allreduce(&send, &mut second, Sum).unwrap();
        gate.release();
        let (tx, rx) = std::sync::mpsc::channel();
        let behind = stream.clone();
        std::thread::spawn(move || {
            let _ = tx.send(behind.sync());
        });
        match rx.recv_timeout(LIMIT) {
            Ok(r) => r.unwrap(),
            Err(_) => {
                // Dropping the communicator would wait for the stream forever.
                std::mem::forget(c);
                panic!("the stream hung on its wait for the first operation's done flag")
            }
        }
        c.synchronize().unwrap();
        assert_eq!(dev.download(&first).unwrap(), vec![3; len]);
        assert_eq!(dev.download(&second).unwrap(), vec![3; len]);
        let end = Instant::now() + LIMIT;
        while c.pool_stats().flags_in_use != 0 || c.pool_stats().blocks_in_use != 0 {
            assert!(Instant::now() < end, "the pool still lends {:?}", c.pool_stats());
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}
