//! A communicator's [`Monitor`]: its operation numbers, flight recorder, settings, poisoned
//! state and the two communicators of its own (signature checks, report exchange), shared by
//! the backend's calling thread, the proxy thread and the watchdog.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use super::OnTimeout;
use super::recorder::{self, OpKind, RecordId, RecordView, Recorder, Signature, Snapshot, State, Tick, WaitView};
use crate::api::error::{Error, Result};
use crate::ffi::{self, RawComm};

/// How long past the answer window a failed collective waits for the watchdog's report
/// before ending the job (see [`Monitor::fault`]).
const FAULT_REPORT_SLACK: Duration = Duration::from_secs(30);

/// An operation being recorded: where its record is, and its number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpId {
    pub(crate) rec: RecordId,
    pub(crate) seq: u64,
    pub(crate) kind: OpKind,
}

/// What ran past its deadline: an operation (its record's insertion number) or a wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Trigger {
    Op(u64),
    Wait(u64),
}

/// Who asks for the error of a poisoned communicator.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Asker {
    /// An operation that was in flight.
    Op(OpId),
    /// A thread waiting for all of the communicator's work (`synchronize`, a request's wait).
    Waiter(u64),
    /// A call made after the communicator was poisoned.
    New,
}

/// Why a communicator was given up.
#[derive(Debug)]
pub(crate) struct Poison {
    trigger: Option<Trigger>,
    /// For [`Error::Aborted`].
    pub(crate) reason: String,
    /// The timeout itself, for the operation (or waits) that ran past the deadline.
    timeout: Option<(&'static str, u64, Duration, String)>,
    /// The mismatch this rank found (or learned of from a rank that gave up in another call:
    /// [`given_up_poison`]), for the operation that found it (and whole-communicator waits),
    /// with the report.
    mismatch: Option<(Mismatch, String)>,
    /// The rank that gave the communicator up, with the collective it was in, where this rank
    /// had not entered that collective yet: the call that does is compared with it.
    giver: Option<(usize, RecordView)>,
}

/// What [`Error::Mismatch`] says, but its report.
#[derive(Clone, Debug)]
pub(crate) struct Mismatch {
    pub(crate) op: &'static str,
    pub(crate) seq: u64,
    pub(crate) peer: usize,
    pub(crate) what: String,
}

impl Mismatch {
    fn of(e: &Error) -> Option<Mismatch> {
        match e {
            Error::Mismatch { op, seq, peer, what, .. } => {
                Some(Mismatch { op, seq: *seq, peer: *peer, what: what.clone() })
            }
            _ => None,
        }
    }
}

impl Poison {
    /// The error `asker` gets: the timeout or mismatch for the operation that timed out or
    /// found it (and for whole-communicator waits), [`Error::Aborted`] for everything else.
    pub(crate) fn error(&self, asker: Asker) -> Error {
        let own = match (asker, self.trigger) {
            (Asker::Op(o), Some(Trigger::Op(t))) => o.rec.id() == t,
            (Asker::Waiter(w), Some(Trigger::Wait(t))) => w == t,
            (Asker::Waiter(_), Some(Trigger::Op(_))) => true,
            _ => false,
        };
        match (&self.timeout, &self.mismatch) {
            (Some((op, seq, elapsed, report)), _) if own => {
                Error::Timeout { op, seq: *seq, elapsed: *elapsed, report: report.clone() }
            }
            (_, Some((m, report))) if own => {
                Error::Mismatch { op: m.op, seq: m.seq, peer: m.peer, what: m.what.clone(), report: report.clone() }
            }
            _ => Error::Aborted { reason: self.reason.clone() },
        }
    }

    /// The error of a call made after the poisoning, as number `seq` (of its kind) of this
    /// rank `(me, size)`: where it is the collective the giving rank gave up in and it differs
    /// from that rank's call there, the mismatch with both calls (a rank short of a core may
    /// enter the collective only after the other's deadline passed); else [`Error::Aborted`].
    pub(crate) fn error_for_new(&self, sig: &Signature, seq: u64, (me, size): (usize, usize)) -> Error {
        let Some((from, theirs)) = self.giver.as_ref().filter(|(_, t)| sig.kind.is_collective() && t.seq == seq) else {
            return self.error(Asker::New);
        };
        match giver_mismatch((me, size), &self.reason, &RecordView::of_call(seq, sig), (*from, theirs)) {
            Some((m, report)) => Error::Mismatch { op: m.op, seq: m.seq, peer: m.peer, what: m.what, report },
            None => self.error(Asker::New),
        }
    }
}

/// Where this rank's call `mine` differs from `theirs`, the call rank `from` gave the
/// communicator up in (because of `reason`): the mismatch, with the report setting the two
/// calls side by side.
pub(crate) fn giver_mismatch(
    (me, size): (usize, usize),
    reason: &str,
    mine: &RecordView,
    (from, theirs): (usize, &RecordView),
) -> Option<(Mismatch, String)> {
    let report = super::report::against_giver((me, size), reason, mine, (from, theirs))?;
    let what = format!("{reason}, where it called {}", super::report::describe(theirs));
    Some((Mismatch { op: mine.kind.name(), seq: mine.seq, peer: from, what }, report))
}

/// A fault an operation's thread hands to the watchdog: the exchange runs now, and the thread
/// waits for it.
#[derive(Debug)]
pub(crate) struct FaultRequest {
    pub(crate) op: OpId,
    pub(crate) message: String,
    /// The mismatch, where the fault is one.
    pub(crate) mismatch: Option<Mismatch>,
}

/// Settings, read on every call.
#[derive(Debug)]
struct Settings {
    /// Deadline in milliseconds; 0: none.
    timeout_ms: AtomicU64,
    on_timeout: AtomicU8,
    check: AtomicBool,
}

/// A thread waiting on the communicator (`synchronize`, a request's wait).
#[derive(Debug)]
pub(crate) struct Wait {
    pub(crate) id: u64,
    pub(crate) what: &'static str,
    pub(crate) since: Tick,
    /// The communicator's deadline when the wait began.
    pub(crate) deadline: Option<Duration>,
}

#[derive(Debug)]
pub(crate) struct MonitorState {
    pub(crate) recorder: Recorder,
    /// The next collective and point-to-point numbers (from 1).
    pub(crate) next_seq: u64,
    pub(crate) next_p2p: u64,
    /// When the last operation began or ended.
    pub(crate) last_activity: Tick,
    /// Threads waiting on the communicator.
    pub(crate) waits: Vec<Wait>,
    next_wait: u64,
    pub(crate) poison: Option<Arc<Poison>>,
    /// The last trigger an exchange ran for (each runs once).
    pub(crate) handled: Option<Trigger>,
    pub(crate) fault: Option<FaultRequest>,
    /// Set by the watchdog when a fault's exchange concluded.
    pub(crate) fault_done: bool,
    /// The operations' open spans (`super::spans`).
    spans: super::spans::OpSpans,
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Monitor {
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The communicator's number in its operations' spans.
    pub(crate) comm_id: u64,
    settings: Settings,
    poisoned: AtomicBool,
    /// Set once the communicator is known revoked (ULFM: the program's `revoke`, or an MPI call
    /// that failed with `MPIX_ERR_REVOKED`): MPI requests pending on it then complete soon, so
    /// they may be waited for (see `transport::OnError::Abandon`).
    revoked: Arc<AtomicBool>,
    state: Mutex<MonitorState>,
    /// Signals a concluded fault exchange to the waiting operation thread.
    pub(crate) concluded: Condvar,
    /// The signature check's communicator.
    pub(crate) check_comm: RawComm,
    /// The report exchange's communicator, used by the watchdog alone; `None` once closed.
    pub(crate) report: Mutex<Option<RawComm>>,
    /// The communicators operations run on, revoked on a timeout where ULFM allows.
    pub(crate) data: Vec<RawComm>,
    /// The watchdog's exchange in progress.
    pub(crate) exchange: Mutex<Option<super::watchdog::Exchange>>,
}

/// Whether a thread blocked in an operation of `kind` can be made to return: every operation
/// waits on requests that the revocation (or, without ULFM, the abandonment) of the
/// communicator ends, except `dup` and `split`, which MPI offers only blocking (revocation ends
/// them, so with ULFM they can), and `drop`, blocked in `MPI_Win_free` (or the agreement
/// before it) on the window's own communicator, which nothing ends.
pub(crate) fn interruptible(kind: OpKind) -> bool {
    match kind {
        OpKind::Dup | OpKind::Split => ffi::ulfm::available(),
        OpKind::Drop => false,
        _ => true,
    }
}

/// The default deadline of every operation.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(600);

/// A deadline as the milliseconds the settings keep: at least 1 (0 is none), and at most
/// `u64::MAX`, where a longer one saturates.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Monitor {
    /// The monitor of a communicator whose operations run on `data` (the first is the one its
    /// collectives use): makes its check and report communicators (collective over `data[0]`)
    /// and registers it with the watchdog.
    pub(crate) fn new(rank: usize, size: usize, data: Vec<RawComm>) -> Result<Arc<Monitor>> {
        let env = super::EnvSettings::read()?;
        let base = *data.first().ok_or(Error::Progress("a monitor needs a communicator"))?;
        let check_comm = ffi::comm::dup(base)?;
        let report = match ffi::comm::dup(base) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: made just above, used by nobody.
                unsafe { ffi::comm::free(check_comm) };
                return Err(e);
            }
        };
        let monitor = Arc::new(Monitor {
            rank,
            size,
            comm_id: super::spans::next_comm(),
            settings: Settings {
                timeout_ms: AtomicU64::new(env.timeout.map_or(0, millis)),
                on_timeout: AtomicU8::new(env.on_timeout as u8),
                check: AtomicBool::new(env.check),
            },
            poisoned: AtomicBool::new(false),
            revoked: Arc::default(),
            state: Mutex::new(MonitorState {
                recorder: Recorder::new(env.recorder_ops),
                next_seq: 1,
                next_p2p: 1,
                last_activity: recorder::now(),
                waits: Vec::new(),
                next_wait: 0,
                poison: None,
                handled: None,
                fault: None,
                fault_done: false,
                spans: super::spans::OpSpans::default(),
            }),
            concluded: Condvar::new(),
            check_comm,
            report: Mutex::new(Some(report)),
            data,
            exchange: Mutex::new(None),
        });
        super::watchdog::register(&monitor);
        Ok(monitor)
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, MonitorState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Closes the check and report communicators (the watchdog stops using the latter first):
    /// frees them, or leaks them (`free` false: the communicator was given up with operations
    /// MPI may still run, see `backends::mpi::Core`).
    pub(crate) fn close(&self, free: bool) {
        let report = self.report.lock().unwrap_or_else(PoisonError::into_inner).take();
        if !free {
            return;
        }
        for c in report.into_iter().chain([self.check_comm]) {
            // SAFETY: both were made by `new` for this monitor; the report communicator was taken
            // out under its lock, so the watchdog no longer uses it, and operations that use the
            // check communicator have completed (they hold the communicator).
            unsafe { ffi::comm::free(c) };
        }
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        match self.settings.timeout_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    pub(crate) fn set_timeout(&self, t: Option<Duration>) {
        self.settings.timeout_ms.store(t.map_or(0, millis), Ordering::Relaxed);
    }

    pub(crate) fn on_timeout(&self) -> OnTimeout {
        match self.settings.on_timeout.load(Ordering::Relaxed) {
            x if x == OnTimeout::Error as u8 => OnTimeout::Error,
            _ => OnTimeout::Abort,
        }
    }

    pub(crate) fn set_on_timeout(&self, o: OnTimeout) {
        self.settings.on_timeout.store(o as u8, Ordering::Relaxed);
    }

    pub(crate) fn check(&self) -> bool {
        self.settings.check.load(Ordering::Relaxed)
    }

    pub(crate) fn set_check(&self, on: bool) {
        self.settings.check.store(on, Ordering::Relaxed);
    }

    /// Whether an operation of this signature goes through the signature check.
    pub(crate) fn checks(&self, sig: &Signature) -> bool {
        self.check() && sig.kind.is_collective() && self.size > 1
    }

    /// Whether a timeout may end in an error returned while MPI still holds the operation's
    /// buffers (no ULFM to revoke it): such operations must run on memory of their own, with
    /// MPI's non-blocking calls (see `docs/reliability.md`).
    pub(crate) fn guarded(&self) -> bool {
        self.on_timeout() == OnTimeout::Error && self.timeout().is_some() && !ffi::ulfm::available()
    }

    /// The answer window of a report exchange.
    pub(crate) fn answer_window(&self) -> Duration {
        let t = self.timeout().unwrap_or(DEFAULT_TIMEOUT);
        (t / 2).clamp(Duration::from_secs(1), Duration::from_secs(10))
    }

    /// The flag set once the communicator is known revoked (see the field).
    pub(crate) fn revoked_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.revoked)
    }

    /// Records that the program revoked the communicator (every one of its MPI communicators).
    pub(crate) fn mark_revoked(&self) {
        self.revoked.store(true, Ordering::Release);
    }

    /// Whether the communicator is known revoked (by the program here, or by another rank).
    pub(crate) fn revoked(&self) -> bool {
        self.revoked.load(Ordering::Acquire)
    }

    /// Whether the communicator was given up.
    pub(crate) fn poisoned(&self) -> Option<Arc<Poison>> {
        if !self.poisoned.load(Ordering::Acquire) {
            return None;
        }
        self.lock().poison.clone()
    }

    /// Fails with the communicator's poison, if it has one.
    pub(crate) fn check_poison(&self, asker: Asker) -> Result<()> {
        match self.poisoned() {
            Some(p) => Err(p.error(asker)),
            None => Ok(()),
        }
    }

    /// Numbers and records an operation that starts now in `state` (`Running`, or `Queued`
    /// for stream-ordered ones); fails at once if the communicator was given up.
    pub(crate) fn begin(&self, sig: Signature, state: State) -> Result<OpId> {
        let now = recorder::now();
        let mut st = self.lock();
        if let Some(p) = &st.poison {
            let next = if sig.kind.is_collective() { st.next_seq } else { st.next_p2p };
            return Err(p.error_for_new(&sig, next, (self.rank, self.size)));
        }
        let seq = if sig.kind.is_collective() {
            st.next_seq += 1;
            st.next_seq - 1
        } else {
            st.next_p2p += 1;
            st.next_p2p - 1
        };
        let rec = st.recorder.push(seq, sig, state, now, self.timeout());
        st.last_activity = now;
        st.spans.open(rec.id(), super::spans::operation(&sig, seq, self.comm_id));
        Ok(OpId { rec, seq, kind: sig.kind })
    }

    /// Moves an operation to `state`; `note` says why it failed or was refused. A finished
    /// operation's span closes.
    pub(crate) fn set(&self, op: OpId, state: State, note: Option<String>) {
        let now = recorder::now();
        let mut st = self.lock();
        st.recorder.set(op.rec, state, now, note);
        st.last_activity = now;
        let closed = if state.is_finished() { st.spans.take(op.rec.id()) } else { None };
        drop(st);
        drop(closed);
    }

    /// Operation `op`'s span while it is open (`None` without a subscriber), for the spans of
    /// its steps.
    pub(crate) fn span(&self, op: OpId) -> Option<tracing::Span> {
        if !super::spans::wanted() {
            // No lock taken for nothing (the proxy thread asks for every operation).
            return None;
        }
        self.lock().spans.get(op.rec.id())
    }

    /// Records the end of an operation and turns its error into what the caller gets (see
    /// [`Monitor::named`]); a collective that failed in a way that leaves the other ranks waiting
    /// is a fault (see [`Monitor::fault`]).
    pub(crate) fn end(&self, op: OpId, result: Result<()>) -> Result<()> {
        let Err(e) = result else {
            self.set(op, State::Done, None);
            return Ok(());
        };
        let e = self.named(op, e);
        let state = if self.poisoned().is_some() { State::Abandoned } else { State::Failed };
        self.set(op, state, Some(e.to_string()));
        Err(self.fault(op, e))
    }

    /// `op`'s error as the caller gets it: a process failure names the failed ranks (MPI's
    /// error names none); MPI's revocation after a poisoning is the poison's error.
    pub(crate) fn named(&self, op: OpId, e: Error) -> Error {
        match e {
            Error::ProcessFailed { ranks } if ranks.is_empty() => {
                Error::ProcessFailed { ranks: ffi::ulfm::failed_ranks(self.data[0]).unwrap_or_default() }
            }
            Error::Revoked => match self.poisoned() {
                Some(p) => p.error(Asker::Op(op)),
                None => Error::Revoked,
            },
            e => e,
        }
    }

    /// A collective failed with an error that may leave the other ranks waiting (an MPI error
    /// inside it, a count mismatch, memory for a message, an internal error): the watchdog runs the
    /// report exchange now, then, under [`OnTimeout::Abort`], ends the job; under
    /// [`OnTimeout::Error`] the communicator is given up and the error returned. A process
    /// failure under `Abort` ends the job too. So no collective that failed with sends in
    /// flight leaves the communicator in use: its staging may still be MPI's.
    pub(crate) fn fault(&self, op: OpId, e: Error) -> Error {
        let abort = self.on_timeout() == OnTimeout::Abort;
        match &e {
            Error::ProcessFailed { ranks } if abort => super::abort::abort_job(&format!(
                "{} #{} failed: processes {ranks:?} of the communicator failed, aborting the job \
                 (OnTimeout::Abort; use OnTimeout::Error to recover with shrink)",
                op.kind.name(),
                op.seq
            )),
            Error::Mpi { .. }
            | Error::CountMismatch { .. }
            | Error::Mismatch { .. }
            | Error::OutOfMemory { .. }
            | Error::Progress(_)
                if op.kind.is_collective() && self.size > 1 => {}
            _ => return e,
        }
        self.report_fault(op, e)
    }

    /// A collective this rank recorded but could not queue, for a reason of its own (its
    /// device failed, no flag was left): the other ranks may be in it already, waiting for
    /// this one, so it is a fault (see [`fault`](Self::fault)) whatever the error.
    pub(crate) fn failed_to_queue(&self, op: OpId, e: Error) -> Error {
        self.set(op, State::Failed, Some(e.to_string()));
        if op.kind.is_collective() && self.size > 1 { self.report_fault(op, e) } else { e }
    }

    /// Has the watchdog run the report exchange for `op`'s failure `e`, then end the job or
    /// give the communicator up; the error for the caller.
    fn report_fault(&self, op: OpId, e: Error) -> Error {
        let mut st = self.lock();
        if let Some(p) = &st.poison {
            return p.error(Asker::Op(op));
        }
        st.fault = Some(FaultRequest { op, message: e.to_string(), mismatch: Mismatch::of(&e) });
        st.fault_done = false;
        drop(st);
        super::watchdog::wake();
        // A watchdog that never concludes is a bug this ends; one that is only slow (its rank,
        // or the ranks it asks, short of a core on an oversubscribed machine: 6 s were seen
        // with 4 ranks and a busy loop on 2 cores) must not end the job.
        let limit = self.answer_window() + FAULT_REPORT_SLACK;
        let st = self.lock();
        let (st, waited) =
            self.concluded.wait_timeout_while(st, limit, |st| !st.fault_done).unwrap_or_else(PoisonError::into_inner);
        let poison = st.poison.clone();
        drop(st);
        if waited.timed_out() {
            super::abort::abort_job(&format!(
                "{} #{} failed ({e}) and the watchdog did not report within {limit:?}, aborting the job",
                op.kind.name(),
                op.seq
            ));
        }
        // A mismatch comes back with the report the exchange wrote; if another rank's fault
        // poisoned the communicator first, with this rank's own finding.
        match (poison, &e) {
            (Some(p), Error::Mismatch { .. }) => match p.error(Asker::Op(op)) {
                reported @ Error::Mismatch { .. } => reported,
                _ => e,
            },
            _ => e,
        }
    }

    /// Registers a thread waiting on the communicator (`what`: `synchronize`, `wait`), so a
    /// wait that outlives the deadline is reported too.
    pub(crate) fn wait_begin(&self, what: &'static str) -> u64 {
        let mut st = self.lock();
        st.next_wait += 1;
        let id = st.next_wait;
        let deadline = self.timeout();
        st.waits.push(Wait { id, what, since: recorder::now(), deadline });
        id
    }

    pub(crate) fn wait_end(&self, id: u64) {
        self.lock().waits.retain(|w| w.id != id);
    }

    /// Gives the communicator up: later calls fail with the poison's error, and so do the
    /// operations in flight, whose records become abandoned.
    pub(crate) fn poison_with(st: &mut MonitorState, this: &Monitor, poison: Poison) {
        if st.poison.is_some() {
            return;
        }
        // A thread in an operation nothing interrupts would wait for ever, unreported (the
        // watchdog does not watch a communicator given up): end the job instead, once the
        // rank that gave the communicator up had the answer window to print its report.
        if let Some(r) = st.recorder.iter().find(|r| r.state == State::Running && !interruptible(r.sig.kind)) {
            let why = format!(
                "the communicator was given up ({}) while this rank is in {} #{}, which MPI cannot interrupt: \
                 aborting the job",
                poison.reason,
                r.sig.kind.name(),
                r.seq
            );
            let grace = this.answer_window() + Duration::from_millis(500);
            let ended = std::thread::Builder::new().name("duralumin-abort".into()).spawn(move || {
                std::thread::sleep(grace);
                super::abort::abort_job(&why)
            });
            if let Err(e) = ended {
                super::abort::abort_job(&format!("{e} (starting a thread to end the job)"));
            }
        }
        st.recorder.abandon_unfinished(recorder::now());
        st.poison = Some(Arc::new(poison));
        this.poisoned.store(true, Ordering::Release);
    }

    /// This rank's snapshot (under the state lock the caller holds).
    pub(crate) fn snapshot(&self, st: &MonitorState) -> Snapshot {
        let now = recorder::now();
        Snapshot {
            rank: ffi::u32_rank(self.rank),
            next_seq: st.next_seq,
            next_p2p: st.next_p2p,
            poisoned: st.poison.is_some(),
            idle: recorder::secs(st.last_activity, now),
            waits: st
                .waits
                .iter()
                .map(|w| WaitView { what: w.what.into(), ago: recorder::secs(w.since, now) })
                .collect(),
            records: st.recorder.iter().map(|r| RecordView::of(r, now)).collect(),
        }
    }

    /// Operations of the communicator queued or running (for leak checks).
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().recorder.unfinished()
    }
}

/// The poison for a timeout of `what` (`op #seq`) seen here, with the report.
pub(crate) fn timeout_poison(
    trigger: Trigger,
    op: &'static str,
    seq: u64,
    elapsed: Duration,
    report: String,
    me: usize,
) -> Poison {
    Poison {
        trigger: Some(trigger),
        reason: format!("rank {me}: {op} #{seq} timed out after {elapsed:.1?}"),
        timeout: Some((op, seq, elapsed, report)),
        mismatch: None,
        giver: None,
    }
}

/// The poison for a fault of operation `trigger` (`op`, which failed) found here: the
/// operation and waits get the mismatch with the report, where the fault is one.
pub(crate) fn fault_poison(
    trigger: Trigger,
    op: &str,
    mismatch: Option<Mismatch>,
    report: String,
    me: usize,
) -> Poison {
    Poison {
        trigger: Some(trigger),
        reason: format!("rank {me}: {op} failed (see its report)"),
        timeout: None,
        mismatch: mismatch.map(|m| (m, report)),
        giver: None,
    }
}

/// The poison of a communicator another rank gave up in because of `reason`, where this rank's
/// operation `trigger` made another call than that rank's there: the operation and the threads
/// waiting on the communicator get the mismatch, with the report; everything else
/// [`Error::Aborted`].
pub(crate) fn given_up_poison(trigger: Trigger, reason: String, mismatch: Mismatch, report: String) -> Poison {
    Poison { trigger: Some(trigger), reason, timeout: None, mismatch: Some((mismatch, report)), giver: None }
}

/// The poison of a communicator given up because of `reason` (another rank's timeout or fault,
/// or a revocation); `giver`, the rank that gave it up with the collective it was in, where
/// this rank had not entered that collective (see [`Poison::error_for_new`]).
pub(crate) fn plain_poison(reason: String, giver: Option<(usize, RecordView)>) -> Poison {
    Poison { trigger: None, reason, timeout: None, mismatch: None, giver }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank that enters the collective another rank gave up in only after the give-up came
    /// learns whether its call differs from the giver's there: a mismatch naming the giver, or
    /// (the same call, another number, another kind of call) the plain abort.
    #[test]
    fn a_call_entered_after_a_give_up_is_compared_with_the_givers() {
        let bcast = |count| Signature::new(OpKind::Bcast).elem::<f32>().count(count).root(0);
        let theirs = RecordView::of_call(2, &bcast(1024));
        let p = plain_poison("rank 0 gave up".into(), Some((0, theirs)));
        match p.error_for_new(&bcast(2048), 2, (1, 4)) {
            Error::Mismatch { peer: 0, seq: 2, report, .. } => assert!(report.contains("count"), "{report}"),
            other => panic!("a differing call at the giver's number: {other}"),
        }
        assert!(matches!(p.error_for_new(&bcast(1024), 2, (1, 4)), Error::Aborted { .. }), "the same call");
        assert!(matches!(p.error_for_new(&bcast(2048), 3, (1, 4)), Error::Aborted { .. }), "another number");
        let p2p = Signature::new(OpKind::Send).elem::<f32>().count(2048).root(0);
        assert!(matches!(p.error_for_new(&p2p, 2, (1, 4)), Error::Aborted { .. }), "not a collective");
        let plain = plain_poison("revoked".into(), None);
        assert!(matches!(plain.error_for_new(&bcast(2048), 2, (1, 4)), Error::Aborted { .. }));
    }
}
