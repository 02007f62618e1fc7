//! One pipelined staging engine for every HostTransfer operation.
//!
//! An operation is described by a [`Plan`]: its data is `parts` rows of `count` elements (the
//! per-rank blocks of a collective, one row for a reduction), every rank agrees on `count`, and
//! chunk `k` is the column range `[k C, (k + 1) C)` of every row. So one chunk of any operation
//! is again the same collective on smaller blocks, which the plan's `chunk` function builds
//! with the Mpi backend's planners on the staging slot. Rows move between device and host in
//! one 2-D copy per chunk and direction.

use std::sync::Arc;

use duralumin_kernels::Element;
use duralumin_kernels::flag::reached;

use super::{Communicator, Shared};
use crate::backends::mpi::Job;
use crate::buffer::RawBuf;
use crate::device::pool::{FlagSlot, PinnedBlock};
use crate::device::{Copy2d, Device, DevicePtr, KeepAlive, ReduceFns};
use crate::error::{Error, Result};
use crate::progress::{OpFuture, Task};

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

/// Device data of an operation: rows (cut into chunks), or a list of pieces `(address, bytes)`
/// packed back to back in staging (v-collectives and multi-peer point-to-point, whose blocks
/// differ in size; only in plans staged whole).
pub(crate) enum Region {
    Rows(Rows),
    Pieces { pieces: Vec<(DevicePtr, usize)>, keep: Vec<KeepAlive> },
}

/// Where staged input goes: the send area, or rows of the receive area starting at `part`
/// (in-place operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Into {
    Send,
    Recv {
        part: usize,
    },
    /// At this element offset of the receive area (plans staged whole).
    RecvAt {
        offset: usize,
    },
}

/// The staging buffers of one chunk: `send_parts × len` and `recv_parts × len` elements (`len`
/// the chunk's row length), rows contiguous. `send` is `None` where the operation stages in place.
pub(crate) struct ChunkBufs<T> {
    pub(crate) send: Option<RawBuf<T>>,
    pub(crate) recv: RawBuf<T>,
}

/// Builds the MPI part of one chunk on its staging buffers.
pub(crate) type ChunkFn<T> = Box<dyn FnMut(&crate::Communicator, ChunkBufs<T>) -> Result<Job<T>> + Send>;

/// A staged operation.
pub(crate) struct Plan<T> {
    /// Elements per row, the same on every rank.
    pub(crate) count: usize,
    /// Rows that the chunk size is divided among: the same on every rank (the communicator
    /// size for block collectives, 1 for reductions), so every rank cuts the same chunks.
    pub(crate) width: usize,
    /// Stage the operation in one chunk (point-to-point, where the sides' lengths may differ).
    pub(crate) whole: bool,
    pub(crate) send_parts: usize,
    pub(crate) recv_parts: usize,
    /// Device rows copied in before each chunk's MPI part.
    pub(crate) input: Option<(Region, Into)>,
    /// Device rows the receive area's first rows are copied back to.
    pub(crate) output: Option<Region>,
    /// Reduce the receive area's `recv_parts` rows into the output rows on the device (with
    /// the #3 kernels on a GPU) instead of copying them back.
    pub(crate) device_reduce: Option<ReduceFns>,
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
            (None, Some((_, Into::RecvAt { .. }))) => return None,
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
    output: FlagSlot<D>,
    /// Raised by the output stream when a chunk's slot may be refilled (two-stream staging).
    _freed: Option<FlagSlot<D>>,
    done: Arc<FlagSlot<D>>,
    staging: Option<PinnedBlock<D>>,
    /// The device buffers, held while the MPI part works on them directly.
    keep: Vec<KeepAlive>,
}

impl<D: Device> Drop for InFlight<D> {
    fn drop(&mut self) {
        self.output.store(self.chunks);
        if self.turn_held {
            self.shared.pass_turn(self.ticket);
        }
        let mut backoff = crate::progress::Backoff::default();
        while !reached(self.done.load(), 1) {
            backoff.snooze();
        }
        self.staging.take();
        self.keep.clear();
    }
}

/// A future that is ready once `ready()` holds.
async fn until(mut ready: impl FnMut() -> bool) {
    std::future::poll_fn(|_| if ready() { std::task::Poll::Ready(()) } else { std::task::Poll::Pending }).await
}

impl<D: Device> Communicator<D> {
    /// Queues `plan` on `stream` and hands its MPI part to the proxy thread. Returns the flag the
    /// stream raises to 1 when the operation has completed on it.
    pub(crate) fn enqueue<T: Element>(&self, stream: &D::Stream, mut plan: Plan<T>) -> Result<Arc<FlagSlot<D>>> {
        let sz = size_of::<T>().max(1);
        let device = &*self.shared.device;
        // Device memory the host can address needs no staging: the MPI part runs on it.
        let direct = (self.config.direct && device.host_accessible()).then(|| plan.direct_areas(sz)).flatten();
        let c = if plan.whole || direct.is_some() {
            plan.count.max(1)
        } else {
            (self.config.chunk_bytes / (sz * plan.width.max(1))).max(1)
        };
        let chunks = plan.count.div_ceil(c).max(1);
        let chunks32 =
            u32::try_from(chunks).map_err(|_| Error::CountOverflow { what: "chunks", value: chunks as u128 })?;
        let slots = self.config.depth.min(chunks);
        let slot_elems = (plan.send_parts + plan.recv_parts) * c.min(plan.count);
        let staging = if direct.is_some() { None } else { Some(self.shared.pools.take(slots * slot_elems * sz)?) };
        let pools = &self.shared.pools;
        let (input, output, done) = (pools.flag()?, pools.flag()?, Arc::new(pools.flag()?));
        // Pipelined staging copies in both directions at once: device-to-host copies on one
        // internal stream, host-to-device copies on another, both ordered after `stream` (and
        // the buffers' own streams) and `stream` after them. A slot is refilled once the other
        // stream has raised `freed` for the chunk that used it.
        let keeps = plan.keep_alives();
        device.acquire(stream, &keeps)?;
        let two = direct.is_none() && chunks > 1;
        let (ins, outs, freed) = if two {
            let (i, o) = self.copy_streams()?;
            device.join(i, stream)?;
            device.join(o, stream)?;
            (i, o, Some(pools.flag()?))
        } else {
            (stream, stream, None)
        };
        let base = staging.as_ref().map_or(0, |s| s.ptr() as usize);
        let (count, send_parts) = (plan.count, plan.send_parts);
        let len_of = move |k: usize| c.min(count - (k * c).min(count));
        // Host addresses of chunk k's send and receive areas.
        let areas = move |k: usize| match direct {
            Some(areas) => areas,
            None => {
                let slot = base + (k % slots) * slot_elems * sz;
                (slot, slot + send_parts * len_of(k) * sz)
            }
        };

        let stage_in = |k: usize| -> Result<()> {
            if let (Some(freed), true) = (&freed, k >= slots) {
                // SAFETY: the flag slot is held until the stream raised `done`, after this wait,
                // and the output stream raises it independently of this one.
                unsafe { device.wait_flag(ins, freed.flag(), (k - slots + 1) as u32, None)? };
            }
            if let (Some((src, into)), None) = (&plan.input, direct) {
                let len = len_of(k);
                let (send, recv) = areas(k);
                let dst = match *into {
                    Into::Send => send,
                    Into::Recv { part } => recv + part * len * sz,
                    Into::RecvAt { offset } => recv + offset * sz,
                };
                // SAFETY: the source rows or pieces were checked against the device buffers'
                // lengths when the plan was made and the buffers are kept alive (or freed in
                // stream order); the destination is this operation's staging slot, which no one
                // else touches until the proxy thread has seen the input flag.
                unsafe {
                    match src {
                        Region::Rows(src) => {
                            let row = src.chunk_len(k, c) * sz;
                            let shape = Copy2d {
                                row_bytes: row,
                                rows: src.parts,
                                src_pitch: src.pitch * sz,
                                dst_pitch: len * sz,
                            };
                            let from = src.ptr.offset(k * c * sz);
                            device.copy_d2h(ins, dst as *mut u8, from, shape, src.keep.clone())?
                        }
                        Region::Pieces { pieces, keep } => {
                            device.pack_d2h(ins, dst as *mut u8, pieces.clone(), keep.clone())?
                        }
                    }
                }
            }
            // SAFETY: the flag slot is held until the stream raised `done`, after this write.
            unsafe { device.write_flag(ins, input.flag(), (k + 1) as u32) }
        };
        let stage_out = |k: usize| -> Result<()> {
            // SAFETY: as for the input flag; the proxy thread raises the output flag.
            unsafe { device.wait_flag(outs, output.flag(), (k + 1) as u32, None)? };
            if let (Some(dst), None) = (&plan.output, direct) {
                let len = len_of(k);
                let (_, recv) = areas(k);
                // SAFETY: as in `stage_in`, the other way round; the proxy thread finished with
                // the slot before raising the output flag.
                unsafe {
                    match dst {
                        Region::Rows(dst) if plan.device_reduce.is_some() => {
                            let fns = plan.device_reduce.ok_or(Error::Progress("device reduction"))?;
                            let to = dst.ptr.offset(k * c * sz);
                            device.reduce_h2d(outs, to, recv as *const u8, plan.recv_parts, len, fns)?
                        }
                        Region::Rows(dst) => {
                            let row = dst.chunk_len(k, c) * sz;
                            let shape = Copy2d {
                                row_bytes: row,
                                rows: dst.parts,
                                src_pitch: len * sz,
                                dst_pitch: dst.pitch * sz,
                            };
                            let to = dst.ptr.offset(k * c * sz);
                            device.copy_h2d(outs, to, recv as *const u8, shape, dst.keep.clone())?
                        }
                        Region::Pieces { pieces, keep } => {
                            device.unpack_h2d(outs, pieces.clone(), recv as *const u8, keep.clone())?
                        }
                    }
                }
            }
            if let Some(freed) = &freed {
                // SAFETY: as for the input flag.
                unsafe { device.write_flag(outs, freed.flag(), (k + 1) as u32)? };
            }
            Ok(())
        };
        for k in 0..slots {
            stage_in(k)?;
        }
        for k in 0..chunks {
            stage_out(k)?;
            if k + slots < chunks {
                stage_in(k + slots)?;
            }
        }
        if two {
            device.join(outs, ins)?;
        }
        // SAFETY: `done` is held by the operation until it has seen this store, and by the
        // request (if any) as long as it exists.
        unsafe { device.write_flag(outs, done.flag(), 1)? };
        if two {
            device.join(stream, outs)?;
        }
        device.release(stream, &keeps)?;

        let ticket = self.next_ticket();
        let mut op = InFlight {
            shared: Arc::clone(&self.shared),
            ticket,
            turn_held: false,
            chunks: chunks32,
            input,
            output,
            _freed: freed,
            done: Arc::clone(&done),
            staging,
            keep: if direct.is_some() { keeps } else { Vec::new() },
        };
        let recv_parts = plan.recv_parts;
        let in_place = !matches!(plan.input, Some((_, Into::Send)));
        let fut: OpFuture = Box::pin(async move {
            until(|| op.shared.has_turn(ticket)).await;
            op.turn_held = true;
            let mut result = Ok(());
            for k in 0..chunks {
                until(|| reached(op.input.load(), (k + 1) as u32)).await;
                if result.is_ok() {
                    let len = len_of(k);
                    let (send, recv) = areas(k);
                    let send = RawBuf::from_raw(send as *mut T, send_parts * len);
                    let recv = RawBuf::from_raw(recv as *mut T, recv_parts * len);
                    let bufs = ChunkBufs { send: (!in_place).then_some(send), recv };
                    let job = {
                        let mpi = op.shared.mpi.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        (plan.chunk)(&mpi, bufs).map(|job| mpi.job_future(job))
                    };
                    result = match job {
                        Ok(f) => f.await,
                        Err(e) => Err(e),
                    };
                }
                op.output.store((k + 1) as u32);
            }
            op.shared.pass_turn(ticket);
            op.turn_held = false;
            if let Err(e) = result {
                op.shared.errors.record(e);
            }
            until(|| reached(op.done.load(), 1)).await;
            drop(op);
            Ok(())
        });
        let task = Task::new(fut);
        self.engine.submit_now(task);
        Ok(done)
    }
}
