//! The proxy thread's side of a staged operation ([`HostPart`]): it runs the operation's MPI
//! part chunk by chunk as the stream stages them, in the communicator's ticket order, raising
//! each chunk's output flag when its MPI part is over; with deferred copies it first queues the
//! device side itself, once the stream has reached the operation.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use duralumin_kernels::Element;
use duralumin_kernels::flag::reached;

use super::Shared;
use super::copies::{Copies, Geometry};
use super::plans::{ChunkBufs, ChunkFn};
use crate::buffer::RawBuf;
use crate::device::pool::{FlagSlot, PinnedBlock, Retired};
use crate::device::{Device, KeepAlive};
use crate::error::{Error, Result};
use crate::progress::OpFuture;
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::{Signature, State};
use crate::request::ErrorSlot;

/// The flags and staging memory of an operation in flight. Dropping it (normally after the
/// stream raised `done`; early only if the MPI part panicked) releases the stream and waits for
/// it to stop using the staging memory before the memory goes back to the pool.
pub(super) struct InFlight<D: Device> {
    pub(super) shared: Arc<Shared<D>>,
    pub(super) ticket: u64,
    pub(super) turn_held: bool,
    pub(super) chunks: u32,
    pub(super) input: FlagSlot<D>,
    /// Shared with the calling thread while it queues (it releases the waits if that fails).
    pub(super) output: Arc<FlagSlot<D>>,
    /// Raised by the output stream when a chunk's slot may be refilled (two-stream staging).
    pub(super) freed: Option<Arc<FlagSlot<D>>>,
    /// Raised by the stream when it reaches a pipelined operation whose copies the proxy thread
    /// queues (then).
    pub(super) start: Option<FlagSlot<D>>,
    /// Whether every chunk's device work was queued (else `done` is raised by the host).
    pub(super) queued: bool,
    pub(super) done: Arc<FlagSlot<D>>,
    pub(super) staging: Option<PinnedBlock<D>>,
    /// The staging block once handed back for the stream's `done` to free.
    pub(super) retired: Option<Retired<D>>,
    /// The operation's turn to take staging memory, while it waits for it (see
    /// [`Grants`](super::Grants)).
    pub(super) grant: Option<u64>,
    /// The device buffers, held while the MPI part works on them directly.
    pub(super) keep: Vec<KeepAlive>,
    /// Where the operation's error goes (its request, or the communicator).
    pub(super) errors: Arc<ErrorSlot>,
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
            self.errors.record(p.error(Asker::Op(id)));
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
pub(super) fn release_waits<D: Device>(output: &FlagSlot<D>, freed: Option<&FlagSlot<D>>, chunks: u32) {
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

/// Whether the communicator was given up: every wait of an operation's host part ends then,
/// and the operation is abandoned (see [`InFlight::abandon`]).
#[inline]
fn poisoned(m: &Monitor) -> bool {
    m.poisoned().is_some()
}

/// The communicator was given up while the operation waited or ran: it is to be abandoned.
struct GivenUp;

/// The host part of a staged operation, which the proxy thread runs (see the module docs).
pub(super) struct HostPart<D: Device, T> {
    /// First, so that it is dropped first when the operation ends.
    pub(super) op: InFlight<D>,
    /// The device side, when this thread queues it (once the stream raises `start`).
    pub(super) deferred: Option<Copies<D>>,
    pub(super) geo: Geometry,
    pub(super) chunk: ChunkFn<T>,
    pub(super) recv_parts: usize,
    /// The input is staged into the receive area: chunks have no send area.
    pub(super) in_place: bool,
    /// The stream does not wait for the MPI part (see `Copies::early`).
    pub(super) early: bool,
    pub(super) monitor: Arc<Monitor>,
    pub(super) id: OpId,
    /// The operation's signature, which its chunks' messages carry.
    pub(super) sig: Signature,
    /// Set when the calling thread's queueing failed, after what it queued has run through
    /// with its waits released: this thread then lets the operation go.
    pub(super) caller_gave_up: Arc<AtomicBool>,
    /// The operation failed (its error is recorded): later chunks skip their MPI part.
    pub(super) failed: bool,
    /// A chunk's native MPI part passed the signature check: the whole operation agrees on
    /// every rank, and later chunks skip it (see `MpiCommunicator::gate`).
    pub(super) checked: bool,
}

impl<D: Device, T: Element> HostPart<D, T> {
    /// The host part as a future for the proxy thread. (An `async fn` taking `self` would hold
    /// it twice, as its argument and as a local: a larger future to copy for every operation.)
    pub(super) fn into_future(mut self) -> OpFuture {
        Box::pin(async move {
            if self.run_to_end().await.is_err() {
                return self.abandon();
            }
            // `self` (`op` first) is dropped as the future ends: the operation's flags and
            // staging go back (see `InFlight`).
            Ok(())
        })
    }

    /// The host part's steps, in order; `Err` once the communicator is given up.
    async fn run_to_end(&mut self) -> std::result::Result<(), GivenUp> {
        // An error is recorded as soon as it happens: before the output flag that lets the
        // stream (and so a `synchronize` waiting for it) finish, which then reports it. (The
        // calling thread returns its own queueing errors.)
        if let Err(e) = self.queue_deferred().await? {
            if self.caller_gave_up() {
                self.failed = true;
            } else {
                self.fail(e, "queueing failed");
            }
        }
        self.take_turn().await?;
        self.run_chunks().await?;
        self.op.shared.pass_turn(self.op.ticket);
        self.op.turn_held = false;
        if !self.failed {
            self.monitor.set(self.id, State::Done, None);
        }
        self.release_partly_queued();
        self.until_done().await
    }

    fn caller_gave_up(&self) -> bool {
        self.caller_gave_up.load(Ordering::Acquire)
    }

    /// Records the operation's error `e` (`fallback` if the monitor had one already).
    fn fail(&mut self, e: Error, fallback: &'static str) {
        self.op.errors.record(self.monitor.end(self.id, Err(e)).err().unwrap_or(Error::Progress(fallback)));
        self.failed = true;
    }

    /// With deferred copies: waits for the stream to reach the operation, takes the staging
    /// memory it waits for, and queues its device side; how that went. Nothing to do without.
    async fn queue_deferred(&mut self) -> std::result::Result<Result<()>, GivenUp> {
        let (Some(copies), Some(start)) = (&mut self.deferred, &self.op.start) else { return Ok(Ok(())) };
        let (gave_up, m) = (&*self.caller_gave_up, &*self.monitor);
        until(|| reached(start.load(), 1) || gave_up.load(Ordering::Acquire) || poisoned(m)).await;
        if poisoned(m) {
            return Err(GivenUp);
        }
        let mut result = Ok(());
        if gave_up.load(Ordering::Acquire) {
            // The calling thread could not queue the stream's part: nothing to run.
            result = Err(Error::Progress("the operation was not queued"));
        } else if self.op.grant.is_some() {
            match take_grant(&mut self.op, &self.geo, m).await? {
                Some(Ok((block, granted))) => {
                    self.geo.base = block.ptr() as usize;
                    self.geo.slots = granted;
                    copies.geo = self.geo;
                    self.op.staging = Some(block);
                }
                Some(Err(e)) => result = Err(e),
                None => {}
            }
        }
        if result.is_ok() {
            // SAFETY: the operation holds the flags and staging until `done`.
            result = unsafe { copies.queue() };
        }
        self.op.queued = result.is_ok();
        Ok(result)
    }

    /// Waits for the operation's ticket: MPI parts start in the order operations were queued.
    async fn take_turn(&mut self) -> std::result::Result<(), GivenUp> {
        let (shared, ticket, m) = (&self.op.shared, self.op.ticket, &*self.monitor);
        until(|| shared.has_turn(ticket) || poisoned(m)).await;
        if poisoned(m) {
            return Err(GivenUp);
        }
        self.op.turn_held = true;
        Ok(())
    }

    /// Runs the chunks' MPI parts in order as the stream stages them, handing each chunk back
    /// to the stream after its own.
    async fn run_chunks(&mut self) -> std::result::Result<(), GivenUp> {
        for k in 0..if self.op.queued { self.geo.chunks } else { 0 } {
            self.until_staged(k).await?;
            if k == 0 && !self.failed && !self.caller_gave_up() {
                // The stream has reached the operation: this rank is in it, and the deadline
                // runs.
                self.monitor.set(self.id, State::Running, None);
            }
            if self.caller_gave_up() {
                // The calling thread's queueing failed and what it queued has run through.
                self.op.queued = false;
                break;
            }
            if !self.failed {
                self.run_mpi(k).await?;
            }
            self.hand_back(k);
        }
        Ok(())
    }

    /// Waits for the stream to stage chunk `k` (or the calling thread to give up).
    async fn until_staged(&mut self, k: usize) -> std::result::Result<(), GivenUp> {
        let (input, gave_up, m) = (&self.op.input, &*self.caller_gave_up, &*self.monitor);
        let flag = self.geo.flag(k);
        until(|| reached(input.load(), flag) || gave_up.load(Ordering::Acquire) || poisoned(m)).await;
        if poisoned(m) {
            return Err(GivenUp);
        }
        Ok(())
    }

    /// Runs chunk `k`'s MPI part; its failure is recorded.
    async fn run_mpi(&mut self, k: usize) -> std::result::Result<(), GivenUp> {
        let ran = match self.start_mpi(k) {
            Ok(job) => {
                let (m, id) = (&*self.monitor, self.id);
                let give_up = || m.poisoned().map(|p| p.error(Asker::Op(id)));
                crate::progress::unless(job, give_up).await.map_err(|_| GivenUp)?
            }
            Err(e) => Err(e),
        };
        if let Err(e) = ran {
            // A failed collective may leave the other ranks waiting: the monitor has the
            // watchdog report it (see `Monitor::fault`).
            self.fail(e, "chunk failed");
        }
        Ok(())
    }

    /// Builds chunk `k`'s MPI part on its staging slot (or on the device buffers).
    fn start_mpi(&mut self, k: usize) -> Result<OpFuture> {
        let geo = &self.geo;
        let len = geo.len_of(k);
        let (send, recv) = geo.areas(k);
        let send = RawBuf::from_raw(send as *mut T, geo.send_parts * len);
        let recv = RawBuf::from_raw(recv as *mut T, self.recv_parts * len);
        let bufs = ChunkBufs { send: (!self.in_place).then_some(send), recv, index: k, chunk_elems: geo.chunk_elems };
        let mpi = self.op.shared.mpi.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        // The chunk's messages carry the whole operation's signature: ranks that cut another
        // plan (another count) never exchange a chunk.
        mpi.set_current(self.id, self.sig);
        let job = mpi.gate((self.chunk)(&mpi, bufs)?, !self.checked);
        self.checked |= job.waits_for_check();
        Ok(mpi.job_future(job))
    }

    /// Chunk `k`'s MPI part is over (or skipped after a failure): its slot and its output go
    /// back to the stream.
    fn hand_back(&mut self, k: usize) {
        let op = &mut self.op;
        if let (true, Some(freed)) = (self.early, &op.freed) {
            // No copy back: the slot is free for chunk `k + depth` now.
            freed.raise(self.geo.flag(k));
        }
        if k + 1 == self.geo.chunks {
            // Only the stream's last copies back use the staging now: it is free once `done`
            // is raised, so an operation queued after a synchronize can have it before this
            // thread sees `done`.
            op.retired = op.staging.take().map(|b| b.retire_on(Arc::clone(&op.done)));
        }
        // Raised, not stored: a calling thread giving up may have released every wait meanwhile.
        op.output.raise(self.geo.flag(k));
    }

    /// Deferred copies whose queueing failed part-way: lets what was queued run through, then
    /// releases the stream (its output is unspecified; the error is recorded). When the
    /// calling thread gave up, this thread queued nothing.
    fn release_partly_queued(&mut self) {
        if let (Some(copies), false, false) = (&self.deferred, self.op.queued, self.caller_gave_up()) {
            self.op.release_all();
            copies.run_through();
            self.op.done.store(1);
        }
    }

    /// Waits for the stream to raise `done` on a fully queued operation.
    async fn until_done(&mut self) -> std::result::Result<(), GivenUp> {
        if self.op.queued {
            let (done, m) = (&self.op.done, &*self.monitor);
            until(|| reached(done.load(), 1) || poisoned(m)).await;
            if !reached(done.load(), 1) {
                // Given up while the stream is held up (by the program's own work): never wait
                // for it here.
                return Err(GivenUp);
            }
        }
        Ok(())
    }

    /// The communicator was given up: lets the operation go (see [`InFlight::abandon`]).
    fn abandon(self) -> Result<()> {
        let HostPart { op, monitor, id, .. } = self;
        op.abandon(&monitor, id)
    }
}

/// Waits for the operation's turn to take staging memory, and for the memory (see
/// [`InFlight::try_grant`]).
async fn take_grant<D: Device>(
    op: &mut InFlight<D>,
    geo: &Geometry,
    m: &Monitor,
) -> std::result::Result<Option<Result<(PinnedBlock<D>, usize)>>, GivenUp> {
    let mut got = None;
    until(|| {
        got = op.try_grant(geo.slot_elems * geo.sz, geo.slots);
        got.is_some() || poisoned(m)
    })
    .await;
    if poisoned(m) {
        return Err(GivenUp);
    }
    Ok(got)
}
