//! The NCCL watchdog: a communicator's shared state (the NCCL handle, whether and why it was
//! aborted, the completion events of its queued operations) and the one thread per process
//! that watches every communicator's, so a stuck or failed NCCL operation is aborted even when
//! no thread of the program waits on the communicator (one blocked in its own stream
//! synchronization, say). Why it is not the MPI backend's watchdog: `docs/nccl.md`.
//!
//! Every [`TICK`] the thread looks at each communicator, without ever blocking on one (a
//! communicator busy queueing is looked at next tick):
//! * operations whose completion event has fired are retired, oldest first (each operation
//!   queued also retires up to two, so the list stays short between ticks);
//! * an asynchronous NCCL error aborts the communicator;
//! * so does the oldest unfinished operation when the device has made no progress on the
//!   communicator's operations for the deadline (counted from when that operation became the
//!   oldest, so a long queue of work is not blamed on its last item).
//!
//! The error goes to the first call that waits afterwards ([`Error::Timeout`] or the NCCL
//! error); every later call gets [`Error::Aborted`].

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use super::NcclDevice;
use crate::api::error::{Error, Result};
use crate::ffi::nccl::{Comm, Nccl};

/// How often the watchdog looks at its communicators.
pub(crate) const TICK: Duration = Duration::from_millis(20);

/// Events kept for reuse per communicator.
const SPARE_EVENTS: usize = 1024;

/// An operation queued and not yet seen to complete.
struct Pending<D: NcclDevice> {
    op: &'static str,
    seq: u64,
    done: Arc<D::Event>,
    /// The operation's span (`reliability::spans`), closed when it is retired.
    _span: tracing::Span,
}

/// What the communicator's thread and the watchdog share, behind one lock: a thread holds it
/// while it calls NCCL with the handle, so an abort never frees a communicator under a call.
pub(crate) struct State<D: NcclDevice> {
    /// The NCCL communicator; null once aborted or destroyed.
    comm: Comm,
    /// Why it was aborted, once it was.
    aborted: Option<String>,
    /// The error of an abort no caller has seen yet.
    unreported: Option<Error>,
    pending: VecDeque<Pending<D>>,
    spare: Vec<D::Event>,
    /// When the oldest pending operation became the oldest.
    since: Instant,
    timeout: Option<Duration>,
}

// SAFETY: the NCCL handle may be used from any thread, one at a time, which the lock around
// `State` ensures; the events are `Send`.
unsafe impl<D: NcclDevice> Send for State<D> {}

/// One communicator's watched state.
pub(crate) struct Watch<D: NcclDevice> {
    nccl: &'static Nccl,
    device: D,
    rank: usize,
    state: Mutex<State<D>>,
}

impl<D: NcclDevice> Watch<D> {
    /// Starts watching `comm` (a ready communicator).
    pub(crate) fn start(
        nccl: &'static Nccl,
        device: D,
        rank: usize,
        comm: Comm,
        timeout: Option<Duration>,
    ) -> Arc<Self> {
        let state = State {
            comm,
            aborted: None,
            unreported: None,
            pending: VecDeque::new(),
            spare: Vec::new(),
            since: Instant::now(),
            timeout,
        };
        let watch = Arc::new(Watch { nccl, device, rank, state: Mutex::new(state) });
        let weak: Weak<dyn Watched> = Arc::downgrade(&watch) as Weak<dyn Watched>;
        registry().add(weak);
        watch
    }

    fn lock(&self) -> MutexGuard<'_, State<D>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The live communicator, locked for the caller's NCCL calls; after an abort, the abort's
    /// error the first time and [`Error::Aborted`] after.
    pub(crate) fn live(&self) -> Result<Live<'_, D>> {
        let mut state = self.lock();
        if let Some(reason) = state.aborted.clone() {
            return Err(state.unreported.take().unwrap_or(Error::Aborted { reason }));
        }
        Ok(Live { state })
    }

    pub(crate) fn is_aborted(&self) -> bool {
        self.lock().aborted.is_some()
    }

    pub(crate) fn set_timeout(&self, timeout: Option<Duration>) {
        self.lock().timeout = timeout;
    }

    /// Aborts the communicator (once): `ncclCommAbort`, then every later call fails.
    /// `error` is what the next caller that waits is told, if anyone is to be.
    pub(crate) fn abort(&self, reason: String, error: Option<Error>) {
        self.lock().abort(self.nccl, self.rank, reason, error);
    }

    /// Records a completion event for operation `op` #`seq`, just queued on `stream`; waits
    /// and the watchdog use it.
    pub(crate) fn track(
        &self,
        op: &'static str,
        seq: u64,
        stream: &D::Stream,
        span: tracing::Span,
    ) -> Result<Arc<D::Event>> {
        let mut state = self.lock();
        // Two for the one added: the list stays short (and its events reused) between the
        // watchdog's ticks, and without a watchdog thread.
        self.retire(&mut state, 2);
        let event = match state.spare.pop() {
            Some(e) => e,
            None => self.device.new_event()?,
        };
        self.device.record_event(&event, stream)?;
        let done = Arc::new(event);
        if state.pending.is_empty() {
            state.since = Instant::now();
        }
        state.pending.push_back(Pending { op, seq, done: Arc::clone(&done), _span: span });
        Ok(done)
    }

    /// Retires up to `most` operations whose event has fired, oldest first, keeping their
    /// events for reuse.
    fn retire(&self, state: &mut State<D>, most: usize) {
        for _ in 0..most {
            let Some(front) = state.pending.front() else { return };
            match self.device.event_done(&front.done) {
                Ok(true) => {}
                // An error of the device: the next wait reports it.
                Ok(false) | Err(_) => return,
            }
            if let Some(p) = state.pending.pop_front()
                && let Ok(event) = Arc::try_unwrap(p.done)
                && state.spare.len() < SPARE_EVENTS
            {
                state.spare.push(event);
            }
            state.since = Instant::now();
        }
    }

    /// Finalizes and destroys the communicator (its work has completed); aborts it if that
    /// fails.
    pub(crate) fn finalize(&self, deadline: Instant) {
        let mut state = self.lock();
        if state.comm.is_null() {
            return;
        }
        // SAFETY: the live communicator, idle, not used again (its handle is cleared below).
        let finalized = unsafe { self.nccl.finalize(state.comm, Some(deadline)) };
        match finalized {
            Ok(()) => state.comm = std::ptr::null_mut(),
            Err(e) => {
                tracing::warn!("finalizing the NCCL communicator: {e}; aborting it");
                state.abort(self.nccl, self.rank, format!("finalize failed: {e}"), None);
            }
        }
    }

    /// One look (see the module docs); skipped if the communicator is busy.
    fn look(&self) {
        let Ok(mut state) = self.state.try_lock() else { return };
        if state.comm.is_null() {
            return;
        }
        if self.device.bind().is_err() {
            return;
        }
        let state = &mut *state;
        self.retire(state, usize::MAX);
        // SAFETY: the live communicator, locked.
        if let Err(e) = unsafe { self.nccl.async_error(state.comm) } {
            let reason = format!("asynchronous NCCL error on rank {}: {e}", self.rank);
            state.abort(self.nccl, self.rank, reason, Some(e));
            return;
        }
        let (Some(front), Some(timeout)) = (state.pending.front(), state.timeout) else { return };
        let elapsed = state.since.elapsed();
        if elapsed > timeout {
            let (op, seq) = (front.op, front.seq);
            let report = format!(
                "rank {}: the device made no progress on {op} #{seq} (or work queued before it on its \
                 stream) for {elapsed:.1?}; the watchdog aborted the NCCL communicator",
                self.rank
            );
            let error = Error::Timeout { op, seq, elapsed, report };
            state.abort(self.nccl, self.rank, format!("{op} #{seq} timed out on rank {}", self.rank), Some(error));
        }
    }
}

impl<D: NcclDevice> State<D> {
    fn abort(&mut self, nccl: &Nccl, rank: usize, reason: String, error: Option<Error>) {
        if self.aborted.is_some() {
            return;
        }
        tracing::warn!(rank, "aborting the NCCL communicator: {reason}");
        let comm = std::mem::replace(&mut self.comm, std::ptr::null_mut());
        if !comm.is_null() {
            // SAFETY: the live communicator, not used again (its handle is cleared); callable
            // while its operations are pending.
            if let Err(e) = unsafe { nccl.abort(comm) } {
                tracing::warn!("ncclCommAbort: {e}");
            }
        }
        self.aborted = Some(reason);
        self.unreported = error;
    }
}

/// The communicator, locked for NCCL calls.
pub(crate) struct Live<'w, D: NcclDevice> {
    state: MutexGuard<'w, State<D>>,
}

impl<D: NcclDevice> Live<'_, D> {
    pub(crate) fn comm(&self) -> Comm {
        self.state.comm
    }
}

/// What the watchdog thread looks at.
trait Watched: Send + Sync {
    fn look(&self);
}

impl<D: NcclDevice> Watched for Watch<D> {
    fn look(&self) {
        Watch::look(self);
    }
}

// SAFETY: `Watch` holds the library (static, thread-safe), a device (`Send + Sync`) and the
// state behind a mutex (`State` is `Send`).
unsafe impl<D: NcclDevice> Sync for Watch<D> {}

/// Every watched communicator, and the thread that looks at them.
struct Registry {
    watched: Mutex<Vec<Weak<dyn Watched>>>,
    wake: Condvar,
}

fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        std::thread::Builder::new()
            .name("duralumin-nccl-watchdog".into())
            .spawn(|| registry().run())
            .map_err(|e| tracing::warn!("no NCCL watchdog thread: {e}"))
            .ok();
        Registry { watched: Mutex::new(Vec::new()), wake: Condvar::new() }
    })
}

impl Registry {
    fn add(&self, w: Weak<dyn Watched>) {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner).push(w);
        self.wake.notify_one();
    }

    /// The thread: sleeps while no communicator lives, otherwise looks at each every tick.
    fn run(&self) {
        loop {
            let live: Vec<Arc<dyn Watched>> = {
                let mut watched = self.watched.lock().unwrap_or_else(PoisonError::into_inner);
                watched.retain(|w| w.strong_count() > 0);
                while watched.is_empty() {
                    watched = self.wake.wait(watched).unwrap_or_else(PoisonError::into_inner);
                    watched.retain(|w| w.strong_count() > 0);
                }
                watched.iter().filter_map(Weak::upgrade).collect()
            };
            for w in &live {
                w.look();
            }
            drop(live);
            std::thread::sleep(TICK);
        }
    }
}
