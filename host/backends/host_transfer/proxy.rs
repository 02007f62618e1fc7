//! The proxy thread's side of a staged operation ([`HostPart`]): it runs the operation's MPI
//! part chunk by chunk as the stream stages them, in the communicator's ticket order, raising
//! each chunk's output flag when its MPI part is over and handing its ring cells back once the
//! stream no longer needs them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use duralumin_kernels::Element;
use duralumin_kernels::flag::reached;

use super::Shared;
use super::copies::Geometry;
use super::plans::{ChunkBufs, ChunkFn};
use super::steps::{Steps, observing};
use crate::api::error::{Error, Result};
use crate::api::request::ErrorSlot;
use crate::common::buffer::RawBuf;
use crate::common::progress::OpFuture;
use crate::device::pool::FlagSlot;
use crate::device::{Device, KeepAlive};
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::{Signature, State};

/// The flags of an operation in flight. Dropping it (normally after the stream raised `done`;
/// early only if the MPI part panicked) releases the stream and its ring cells.
pub(super) struct InFlight<D: Device> {
    pub(super) shared: Arc<Shared<D>>,
    pub(super) ticket: u64,
    pub(super) turn_held: bool,
    pub(super) geo: Geometry,
    /// The operation's own input and output flags when it works on the device buffers (else
    /// the ring's counters). The output flag is shared with the calling thread while it queues
    /// (it releases the waits if that fails).
    pub(super) own: Option<(FlagSlot<D>, Arc<FlagSlot<D>>)>,
    /// Whether every chunk's device work was queued (else `done` is raised by the host).
    pub(super) queued: bool,
    /// Chunks whose ring cells were handed back to the ring.
    pub(super) released: usize,
    /// Whether the output stream drains each chunk (copies it back) before its cells are free.
    pub(super) drains: bool,
    pub(super) done: Arc<FlagSlot<D>>,
    /// The device buffers, held while the MPI part works on them directly.
    pub(super) keep: Vec<KeepAlive>,
    /// Where the operation's error goes (its request, or the communicator).
    pub(super) errors: Arc<ErrorSlot>,
}

impl<D: Device> InFlight<D> {
    /// The flag the stream raises as it stages each chunk.
    fn input(&self) -> &FlagSlot<D> {
        self.own.as_ref().map_or(&self.shared.ring.staged, |own| &own.0)
    }

    /// The flag this thread raises as each chunk's MPI part ends.
    fn output(&self) -> &FlagSlot<D> {
        self.own.as_ref().map_or(&self.shared.ring.output, |own| &own.1)
    }

    /// Hands the ring cells of the chunks before `upto` back, in order (`drains`: once the
    /// output stream copied each back).
    fn release_upto(&mut self, upto: usize, drains: bool) {
        if let Some(place) = &self.geo.place {
            for k in self.released..upto.min(self.geo.chunks) {
                self.shared.ring.finished(place, k, drains);
            }
        }
        self.released = self.released.max(upto);
    }

    /// Lets every wait the device may have queued for this operation pass.
    fn release_all(&self) {
        self.output().raise(self.geo.last());
    }

    /// The communicator was given up ([`OnTimeout::Error`](crate::reliability::OnTimeout)):
    /// every wait the device has queued for the operation passes (the stream goes on, its
    /// outputs undefined), later operations get their turns, and the operation's flags, its
    /// buffers and the ring are leaked rather than freed or waited for, since MPI or the device
    /// may still use them. The operation's error is recorded for `synchronize`.
    fn abandon(self, m: &Monitor, id: OpId) -> Result<()> {
        self.release_all();
        if let Some(place) = &self.geo.place {
            self.shared.ring.abandon(place, self.geo.chunks);
        }
        if !self.queued {
            self.done.store(1);
        }
        if self.turn_held {
            self.shared.pass_turn(self.ticket);
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
        // Chunks not handed back yet (the MPI part panicked): no one copies them back now.
        self.release_upto(self.geo.chunks, false);
        if !self.queued {
            // Nothing (or not everything) was queued: no stream will raise `done`.
            self.done.store(1);
        }
        if self.turn_held {
            self.shared.pass_turn(self.ticket);
        }
        self.done.wait_for(1);
        self.shared.ring.advance();
        self.keep.clear();
    }
}

/// A future that is ready once `ready()` holds.
async fn until(mut ready: impl FnMut() -> bool) {
    if ready() {
        return;
    }
    std::future::poll_fn(|_| {
        if ready() {
            crate::common::progress::made_progress();
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

/// Moves the step spans on (`steps`: only when a subscriber wants them) from the input flag
/// and the ring's *drained* counter.
fn observe<D: Device>(steps: &mut Option<Steps>, geo: &Geometry, input: &FlagSlot<D>, ring: &super::ring::Ring<D>) {
    if let Some(s) = steps {
        let (staged, drained) = (input.load(), ring.drained.load());
        s.observe(|k| reached(staged, geo.flag(k)), |k| reached(drained, geo.flag(k)));
    }
}

/// Where chunk `k` of an operation lies: its areas in `geo`, whether its input is staged into
/// its receive area (`in_place`), and its receive parts.
pub(super) struct ChunkAt<'a> {
    pub(super) geo: &'a Geometry,
    pub(super) k: usize,
    pub(super) in_place: bool,
    pub(super) recv_parts: usize,
}

/// A chunk's MPI part on its ring cells (or on the device buffers), as a future, behind the
/// operation's signature check if `check` (see `MpiCommunicator::gate`); and whether it waits
/// for that check (later chunks then skip it).
pub(super) fn chunk_job<D: Device, T: Element>(
    shared: &Shared<D>,
    chunk: &mut ChunkFn<T>,
    at: &ChunkAt<'_>,
    (id, sig): (OpId, Signature),
    check: bool,
) -> Result<(OpFuture, bool)> {
    let (geo, k) = (at.geo, at.k);
    let len = geo.len_of(k);
    let (send, recv) = geo.areas(k);
    let send = RawBuf::from_raw(send as *mut T, geo.send_parts * len);
    let recv = RawBuf::from_raw(recv as *mut T, at.recv_parts * len);
    let bufs = ChunkBufs { send: (!at.in_place).then_some(send), recv, index: k, chunk_elems: geo.chunk_elems };
    let mpi = shared.mpi.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    // The chunk's messages carry the whole operation's signature: ranks that cut another plan
    // (another count) never exchange a chunk.
    mpi.set_current(id, sig);
    let job = mpi.gate(chunk(&mpi, bufs)?, check);
    let checks = job.waits_for_check();
    Ok((mpi.job_future(job), checks))
}

/// The host part of a staged operation, which the proxy thread runs (see the module docs).
pub(super) struct HostPart<D: Device, T> {
    /// First, so that it is dropped first when the operation ends.
    pub(super) op: InFlight<D>,
    pub(super) chunk: ChunkFn<T>,
    pub(super) recv_parts: usize,
    /// The input is staged into the receive area: chunks have no send area.
    pub(super) in_place: bool,
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
    /// The spans of its steps, when a subscriber wants the operation's span (`super::steps`).
    pub(super) steps: Option<Steps>,
    /// The first chunk's MPI part, started on the calling thread (see
    /// `HostTransferCommunicator::start_here`), which this thread finishes.
    pub(super) started: Option<OpFuture>,
}

impl<D: Device, T: Element> HostPart<D, T> {
    /// The host part as a future for the proxy thread. (An `async fn` taking `self` would hold
    /// it twice, as its argument and as a local: a larger future to copy for every operation.)
    pub(super) fn into_future(mut self) -> OpFuture {
        Box::pin(async move {
            // Chunks in flight: the proxy thread polls without sleeping until the end.
            let _hot = crate::common::progress::Hot::new();
            self.steps = Steps::new(self.monitor.span(self.id), self.op.geo.chunks);
            if self.run_to_end().await.is_err() {
                return self.abandon();
            }
            // `self` (`op` first) is dropped as the future ends: the operation's flags go back
            // (see `InFlight`).
            Ok(())
        })
    }

    /// The host part's steps, in order; `Err` once the communicator is given up.
    async fn run_to_end(&mut self) -> std::result::Result<(), GivenUp> {
        // An error is recorded as soon as it happens: before the output flag that lets the
        // stream (and so a `synchronize` waiting for it) finish, which then reports it. (The
        // calling thread returns its own queueing errors.)
        self.take_turn().await?;
        self.run_chunks().await?;
        self.op.shared.pass_turn(self.op.ticket);
        self.op.turn_held = false;
        if self.op.geo.chunks == 0 && !self.failed {
            self.monitor.set(self.id, State::Done, None);
        }
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
    /// to the stream after its own; chunks never run (the calling thread gave up) go back to
    /// the ring at the end.
    async fn run_chunks(&mut self) -> std::result::Result<(), GivenUp> {
        if let Some(s) = &mut self.steps {
            s.staging(0);
        }
        for k in 0..self.op.geo.chunks {
            self.until_staged(k).await?;
            if k == 0 && !self.failed && !self.caller_gave_up() {
                // The stream has reached the operation: this rank is in it, and the deadline
                // runs.
                self.monitor.set(self.id, State::Running, None);
            }
            if self.caller_gave_up() {
                // The calling thread's queueing failed: what it queued runs through once its
                // waits pass (earlier operations' MPI parts are over: this one has the turn).
                self.op.queued = false;
                self.failed = true;
                self.op.release_all();
                break;
            }
            if !self.failed {
                self.run_mpi(k).await?;
            }
            if k + 1 == self.op.geo.chunks && !self.failed {
                // Recorded done before the last output flag lets the stream, and so a
                // `synchronize`, finish: a caller that then shortens the deadline must never find
                // the operation it saw complete still running (and report it late).
                self.monitor.set(self.id, State::Done, None);
            }
            self.hand_back(k);
        }
        self.op.release_upto(self.op.geo.chunks, false);
        Ok(())
    }

    /// Waits for the stream to stage chunk `k` (or the calling thread to give up).
    async fn until_staged(&mut self, k: usize) -> std::result::Result<(), GivenUp> {
        let (input, gave_up, m) = (self.op.input(), &*self.caller_gave_up, &*self.monitor);
        let (flag, ring, geo) = (self.op.geo.flag(k), &self.op.shared.ring, &self.op.geo);
        let _wait = self.steps.as_ref().map(|s| s.during("wait_staged", k));
        let steps = &mut self.steps;
        // The stream may be waiting for cells that earlier chunks hand back as they drain.
        until(|| {
            ring.advance();
            observe(steps, geo, input, ring);
            reached(input.load(), flag) || gave_up.load(Ordering::Acquire) || poisoned(m)
        })
        .await;
        if poisoned(m) {
            return Err(GivenUp);
        }
        Ok(())
    }

    /// Runs chunk `k`'s MPI part; its failure is recorded.
    async fn run_mpi(&mut self, k: usize) -> std::result::Result<(), GivenUp> {
        let _mpi = self.steps.as_ref().map(|s| s.during("mpi", k));
        let job = match self.started.take() {
            Some(started) => Ok(started),
            None => self.start_mpi(k),
        };
        let ran = match job {
            Ok(job) => {
                let (m, id) = (&*self.monitor, self.id);
                let give_up = || m.poisoned().map(|p| p.error(Asker::Op(id)));
                let (input, ring, geo) = (self.op.input(), &self.op.shared.ring, &self.op.geo);
                let steps = &mut self.steps;
                // An MPI part on the caller's buffers is never left to MPI: given up once the
                // communicator is known revoked, it runs on to its end (its requests then
                // complete soon); given up without a revocation (it was queued under
                // `OnTimeout::Abort`, and the communicator switched to `Error` since), the job
                // ends, as it would have under the setting it was queued with.
                let direct = self.op.geo.direct.is_some();
                let finish = || direct && (m.revoked() || end_job_for_buffers(m, id));
                let job = crate::common::progress::unless_or_finish(job, give_up, finish);
                observing(job, || observe(steps, geo, input, ring)).await.map_err(|_| GivenUp)?
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

    /// Builds chunk `k`'s MPI part on its ring cells (or on the device buffers).
    fn start_mpi(&mut self, k: usize) -> Result<OpFuture> {
        let at = ChunkAt { geo: &self.op.geo, k, in_place: self.in_place, recv_parts: self.recv_parts };
        let (job, checks) = chunk_job(&self.op.shared, &mut self.chunk, &at, (self.id, self.sig), !self.checked)?;
        self.checked |= checks;
        Ok(job)
    }

    /// Chunk `k`'s MPI part is over (or skipped after a failure): its output goes back to the
    /// stream, and its cells to the ring once the stream no longer needs them.
    fn hand_back(&mut self, k: usize) {
        // Raised, not stored: a calling thread giving up may have released every wait meanwhile.
        self.op.output().raise(self.op.geo.flag(k));
        let drains = self.op.drains;
        if let (Some(s), true, None) = (&mut self.steps, drains, &self.op.own) {
            s.unstaging(k);
        }
        self.op.release_upto(k + 1, drains);
    }

    /// Waits for the stream to raise `done` on a fully queued operation, moving the ring on
    /// meanwhile (its cells go back as the output stream drains them).
    async fn until_done(&mut self) -> std::result::Result<(), GivenUp> {
        if self.op.queued {
            let (done, m, ring) = (&self.op.done, &*self.monitor, &self.op.shared.ring);
            let (input, geo) = (self.op.input(), &self.op.geo);
            let _wait = self.steps.as_ref().map(|s| s.during("wait_done", geo.chunks));
            let steps = &mut self.steps;
            until(|| {
                ring.advance();
                observe(steps, geo, input, ring);
                reached(done.load(), 1) || poisoned(m)
            })
            .await;
            if !reached(done.load(), 1) {
                // Given up while the stream is held up (by the program's own work): never wait
                // for it here.
                return Err(GivenUp);
            }
        }
        self.op.shared.ring.advance();
        self.steps = None;
        Ok(())
    }

    /// The communicator was given up: lets the operation go (see [`InFlight::abandon`]).
    fn abandon(self) -> Result<()> {
        let HostPart { op, monitor, id, .. } = self;
        op.abandon(&monitor, id)
    }
}

/// Ends the job for operation `id`, given up while MPI runs it on the caller's buffers and with
/// no revocation to make MPI let them go (see `HostPart::run_mpi`).
fn end_job_for_buffers(m: &Monitor, id: OpId) -> ! {
    let why = m.poisoned().map_or_else(|| "given up".to_string(), |p| p.reason.clone());
    crate::reliability::abort::abort_job(&format!(
        "{} #{}: the communicator was given up ({why}) while MPI runs it on the caller's buffers \
         (it was queued under OnTimeout::Abort), and without a revocation MPI cannot give them back: \
         aborting the job (switch OnTimeout with nothing queued)",
        id.kind.name(),
        id.seq
    ))
}
