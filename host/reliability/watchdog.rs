//! The watchdog: one thread per process that enforces every communicator's deadline and runs
//! the report exchange.
//!
//! Every [`TICK`] while communicators exist it looks, for each one, at three things:
//! * the report communicator: another rank asking for this rank's flight recorder (`ASK`) is
//!   answered with a snapshot (`SNAP`) at once, whatever this rank's program is doing, so a rank
//!   stuck in its own code still says where it is;
//! * the oldest operation running, and the threads waiting on the communicator: one past the
//!   deadline (or a fault an operation handed over) starts an exchange: `ASK` to every other
//!   rank, then their snapshots are collected until all have answered or the answer window
//!   closes;
//! * an exchange whose answers are in: the report is written to stderr, then the job is
//!   aborted ([`OnTimeout::Abort`]) or the communicator given up ([`OnTimeout::Error`]).
//!
//! With no communicator it sleeps until one is made. It never calls MPI once `MPI_Finalize` has
//! begun (a hook on `MPI_COMM_SELF` stops it first).

use std::ffi::c_int;
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::OnTimeout;
use super::abort::{abort_job, rank_label};
use super::monitor::{
    FaultRequest, Monitor, MonitorState, Poison, Trigger, fault_poison, given_up_poison, giver_mismatch, interruptible,
    plain_poison, timeout_poison,
};
use super::recorder::{self, RecordView, Snapshot, State};
use super::report::{self, Target};
use crate::ffi::{self, RawComm, RawDatatype, RawRequest, p2p, sys};

/// How often the watchdog looks at its communicators.
pub(crate) const TICK: Duration = Duration::from_millis(50);

/// Message tags on a report communicator.
const ASK: c_int = 1;
const SNAP: c_int = 2;

/// `ASK` flag: the asker gives the communicator up (`OnTimeout::Error`); so does the answerer,
/// before it answers, so its answer "never entered" stays true.
const GIVE_UP: u64 = 1;

/// A report exchange in progress on one communicator.
#[derive(Debug)]
pub(crate) struct Exchange {
    trigger: Trigger,
    target: Target,
    headline: String,
    what: &'static str,
    seq: u64,
    elapsed: Duration,
    /// Whether the thread in the operation can be interrupted (see [`interruptible`]).
    interruptible: bool,
    fault: bool,
    deadline: Instant,
    replies: Vec<Option<Snapshot>>,
}

#[derive(Default)]
struct Registry {
    monitors: Vec<Weak<Monitor>>,
    thread: Option<JoinHandle<()>>,
    /// `MPI_Finalize` has begun: never call MPI again.
    stopped: bool,
    hooked: bool,
}

static REGISTRY: Mutex<Registry> =
    Mutex::new(Registry { monitors: Vec::new(), thread: None, stopped: false, hooked: false });
static WAKE: Condvar = Condvar::new();

/// Puts `m` under watch, starting the watchdog if it is not running.
pub(crate) fn register(m: &Arc<Monitor>) {
    let mut reg = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
    reg.monitors.retain(|w| w.strong_count() > 0);
    reg.monitors.push(Arc::downgrade(m));
    if reg.stopped {
        return;
    }
    if !reg.hooked {
        reg.hooked = ffi::on_finalize(stop).is_ok();
    }
    if reg.thread.is_none() {
        reg.thread = std::thread::Builder::new().name("duralumin-watchdog".into()).spawn(run).ok();
    }
    drop(reg);
    WAKE.notify_all();
}

/// Has the watchdog look at its communicators now (a fault is waiting).
pub(crate) fn wake() {
    WAKE.notify_all();
}

/// Stops the watchdog for good (at the start of `MPI_Finalize`) and waits until it is out of
/// MPI.
fn stop() {
    let thread = {
        let mut reg = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        reg.stopped = true;
        reg.thread.take()
    };
    WAKE.notify_all();
    if let Some(t) = thread {
        let _ = t.join();
    }
}

/// A send in flight and the buffer it reads.
type Outgoing = (RawRequest, Vec<u8>);

fn run() {
    let mut outgoing: Vec<Outgoing> = Vec::new();
    loop {
        let monitors: Vec<Arc<Monitor>> = {
            let mut reg = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
            if reg.stopped {
                return;
            }
            reg.monitors.retain(|w| w.strong_count() > 0);
            reg.monitors.iter().filter_map(Weak::upgrade).collect()
        };
        for m in &monitors {
            tick(m, &mut outgoing);
        }
        // A send the other side never receives stays here (its buffer with it) rather than
        // being freed under MPI.
        outgoing.retain_mut(|(req, _)| matches!(p2p::test(req), Ok(None)));
        let idle = monitors.is_empty() && outgoing.is_empty();
        drop(monitors);
        let reg = REGISTRY.lock().unwrap_or_else(PoisonError::into_inner);
        if reg.stopped {
            return;
        }
        if idle && reg.monitors.iter().all(|w| w.strong_count() == 0) {
            drop(WAKE.wait(reg).unwrap_or_else(PoisonError::into_inner));
        } else {
            drop(WAKE.wait_timeout(reg, TICK).unwrap_or_else(PoisonError::into_inner));
        }
    }
}

/// One look at one communicator (see the module docs).
fn tick(m: &Monitor, outgoing: &mut Vec<Outgoing>) {
    let report = m.report.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(rc) = *report else { return };
    let mut exchange = m.exchange.lock().unwrap_or_else(PoisonError::into_inner);
    while let Ok(Some((source, tag, bytes))) = p2p::probe_any(rc) {
        let Ok(msg) = p2p::recv_bytes(rc, source, tag, bytes) else { break };
        // A message received has a real source, never MPI_ANY_SOURCE or MPI_PROC_NULL.
        let Ok(from) = usize::try_from(source) else { continue };
        match tag {
            ASK => answer(m, rc, from, &msg, exchange.is_some(), outgoing),
            SNAP => {
                // A reply that does not decode never hides one that did.
                if let (Some(x), Some(snap)) = (exchange.as_mut().filter(|_| from < m.size), Snapshot::decode(&msg)) {
                    x.replies[from] = Some(snap);
                }
            }
            _ => {}
        }
    }
    let complete = |x: &Exchange| {
        Instant::now() >= x.deadline || x.replies.iter().enumerate().all(|(r, s)| r == m.rank || s.is_some())
    };
    match exchange.as_ref() {
        Some(x) if complete(x) => {
            if let Some(x) = exchange.take() {
                conclude(m, x);
            }
        }
        Some(_) => {}
        None => {
            if let Some(x) = start(m) {
                ask(m, rc, &x, outgoing);
                let done = complete(&x);
                *exchange = Some(x);
                if done {
                    if let Some(x) = exchange.take() {
                        conclude(m, x);
                    }
                }
            }
        }
    }
}

/// Answers another rank's `ASK` with this rank's snapshot, giving the communicator up first if
/// the asker does, unless this rank has a report of its own to make (an exchange in progress,
/// or an operation past its deadline): its conclusion gives the communicator up, with its own
/// timeout for its own operation.
fn answer(m: &Monitor, rc: RawComm, from: usize, msg: &[u8], exchanging: bool, outgoing: &mut Vec<Outgoing>) {
    let word = |i: usize| msg.get(i * 8..i * 8 + 8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
    let (seq, flags) = (word(0), word(1));
    let mut st = m.lock();
    let own_report = exchanging || late_op(&st, recorder::now()).is_some();
    if flags & GIVE_UP != 0 && !own_report {
        if m.on_timeout() == OnTimeout::Abort && st.poison.is_none() {
            // Giving up here would hand the caller back buffers that MPI may still read
            // (`transport::OnError::Abandon`); under `Abort` a failure ends the job instead
            // (unless the program revoked the communicator already).
            drop(st);
            abort_job(&format!(
                "rank {from} gave up on the communicator (#{seq} timed out or failed there, under \
                 OnTimeout::Error), aborting the job (OnTimeout::Abort here: give every rank the same OnTimeout)"
            ));
        }
        let theirs = msg.get(16..).and_then(RecordView::decode);
        let poison = given_up(m, &st, (from, seq), theirs.as_ref());
        Monitor::poison_with(&mut st, m, poison);
    }
    let bytes = m.snapshot(&st).encode();
    drop(st);
    send(rc, from, SNAP, bytes, outgoing);
}

/// The poison of a communicator rank `from` gave up in (its operation #`seq` timed out or
/// failed there). Where `theirs`, the collective `from` was in, differs from this rank's call
/// at the same number, and this rank is in that call (its stream has queued, reached or failed
/// it, but not completed it: a call that returned is not reopened) with no finding of its own
/// on the way to the watchdog (which names the difference better), the two ranks made different
/// calls and `from`'s deadline passed before this rank found out (a rank short of a core finds a
/// mismatch late): that operation, and the threads waiting on the communicator, get the
/// mismatch with both calls; where this rank has not entered that call yet, the call that
/// enters it is compared in the same way ([`Poison::error_for_new`]). Everything else gets
/// [`Error::Aborted`](crate::Error::Aborted) naming `from`.
fn given_up(m: &Monitor, st: &MonitorState, (from, seq): (usize, u64), theirs: Option<&RecordView>) -> Poison {
    let reason = format!("rank {from} gave up on the communicator (#{seq} timed out or failed there)");
    let now = recorder::now();
    let theirs = theirs.filter(|t| t.kind.is_collective() && st.fault.is_none());
    let differing = theirs.and_then(|theirs| {
        let open = |r: &&recorder::Record| matches!(r.state, State::Queued | State::Running | State::Failed);
        let mine = st.recorder.iter().filter(open).find(|r| r.sig.kind.is_collective() && r.seq == theirs.seq)?;
        let (mismatch, report) = giver_mismatch((m.rank, m.size), &reason, &RecordView::of(mine, now), (from, theirs))?;
        Some((mine.id(), mismatch, report))
    });
    match differing {
        Some((id, mismatch, report)) => given_up_poison(Trigger::Op(id), reason, mismatch, report),
        // Not in that call yet (short of a core, say): the call that enters it is compared.
        None => plain_poison(reason, theirs.filter(|t| st.next_seq <= t.seq).map(|t| (from, t.clone()))),
    }
}

fn send(rc: RawComm, to: usize, tag: c_int, bytes: Vec<u8>, outgoing: &mut Vec<Outgoing>) {
    // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
    let dt = RawDatatype(unsafe { sys::RSMPI_UINT8_T });
    let Ok(count) = c_int::try_from(bytes.len()) else { return };
    // SAFETY: `bytes` moves into `outgoing` with the request and stays there (its heap buffer
    // unmoved) until the request completes.
    if let Ok(req) = unsafe { p2p::isend(bytes.as_ptr().cast(), count, dt, ffi::c_rank(to), tag, rc) } {
        outgoing.push((req, bytes));
    }
}

/// The exchange a communicator needs now, if any: a fault handed over, else the oldest
/// operation running past the deadline, else the oldest wait past it.
fn start(m: &Monitor) -> Option<Exchange> {
    let mut st = m.lock();
    if st.poison.is_some() {
        if st.fault.take().is_some() {
            st.fault_done = true;
            m.concluded.notify_all();
        }
        return None;
    }
    let now = recorder::now();
    let x = match &st.fault {
        Some(f) => fault_exchange(&st, f, now)?,
        None => late_op_exchange(&st, now).or_else(|| late_wait_exchange(&st, now))?,
    };
    st.handled = Some(x.trigger);
    drop(st);
    Some(Exchange { deadline: Instant::now() + m.answer_window(), replies: vec![None; m.size], ..x })
}

/// The exchange that reports a failure this rank's operation handed over.
fn fault_exchange(st: &MonitorState, f: &FaultRequest, now: recorder::Tick) -> Option<Exchange> {
    let v = view(st, f.op.rec.id(), now)?;
    let headline = format!("{} failed here: {}", report::describe(&v), f.message);
    let x =
        Exchange::new(Trigger::Op(f.op.rec.id()), f.op.kind.name(), f.op.seq, Duration::ZERO, headline, target_of(v));
    Some(x.failed())
}

/// The exchange that reports the oldest operation running past its deadline.
fn late_op_exchange(st: &MonitorState, now: recorder::Tick) -> Option<Exchange> {
    let r = late_op(st, now)?;
    let (v, timeout) = (RecordView::of(r, now), r.deadline?);
    let elapsed = Duration::from_nanos(now.saturating_sub(r.started));
    let headline =
        format!("{} timed out after {:.1} s (deadline {timeout:.1?})", report::describe(&v), elapsed.as_secs_f64());
    let interruptible = interruptible(v.kind);
    let x = Exchange::new(Trigger::Op(r.id()), v.kind.name(), r.seq, elapsed, headline, target_of(v));
    Some(Exchange { interruptible, ..x })
}

/// The exchange that reports the oldest wait past its deadline that none has reported yet.
fn late_wait_exchange(st: &MonitorState, now: recorder::Tick) -> Option<Exchange> {
    let wait = st
        .waits
        .iter()
        .filter(|w| recorder::past(w.deadline, w.since, now) && st.handled != Some(Trigger::Wait(w.id)))
        .min_by_key(|w| w.since)?;
    let timeout = wait.deadline?;
    let elapsed = Duration::from_nanos(now.saturating_sub(wait.since));
    let seq = st.next_seq.saturating_sub(1);
    // The wait is for this rank's unfinished operations: the oldest collective among them is
    // what the ranks are compared at (a stream-ordered one may not have started here yet, so it
    // is not late itself).
    let pending = st
        .recorder
        .iter()
        .filter(|r| r.sig.kind.is_collective() && !r.state.is_finished())
        .min_by_key(|r| r.seq)
        .map(|r| Target::Collective(RecordView::of(r, now)));
    let headline = format!(
        "{} (after collective #{seq}) waited {:.1} s (deadline {timeout:.1?})",
        wait.what,
        elapsed.as_secs_f64()
    );
    Some(Exchange::new(Trigger::Wait(wait.id), wait.what, seq, elapsed, headline, pending.unwrap_or(Target::Wait)))
}

/// The recorder's view of operation `id`, if it is still recorded.
fn view(st: &MonitorState, id: u64, now: recorder::Tick) -> Option<RecordView> {
    st.recorder.iter().find(|r| r.id() == id).map(|r| RecordView::of(r, now))
}

/// What the ranks are compared at for an operation: the collective itself, or a point-to-point
/// operation's peer.
fn target_of(v: RecordView) -> Target {
    if v.kind.is_collective() { Target::Collective(v) } else { Target::P2p(v) }
}

impl Exchange {
    /// An exchange about `what` (#`seq`, `elapsed` so far), interruptible, not a fault; its
    /// answer window and replies are set when it starts.
    fn new(
        trigger: Trigger,
        what: &'static str,
        seq: u64,
        elapsed: Duration,
        headline: String,
        target: Target,
    ) -> Exchange {
        Exchange {
            trigger,
            target,
            headline,
            what,
            seq,
            elapsed,
            interruptible: true,
            fault: false,
            deadline: Instant::now(),
            replies: Vec::new(),
        }
    }

    /// The same exchange, about a failure rather than a deadline.
    fn failed(self) -> Exchange {
        Exchange { fault: true, ..self }
    }
}

/// The oldest operation running past its deadline that no exchange has reported yet.
fn late_op(st: &MonitorState, now: recorder::Tick) -> Option<&recorder::Record> {
    let reported = match st.handled {
        Some(Trigger::Op(id)) => Some(id),
        _ => None,
    };
    st.recorder.oldest_late(now, reported)
}

/// Sends `ASK` to every other rank.
fn ask(m: &Monitor, rc: RawComm, x: &Exchange, outgoing: &mut Vec<Outgoing>) {
    let give_up = m.on_timeout() == OnTimeout::Error;
    let mut msg = x.seq.to_le_bytes().to_vec();
    msg.extend_from_slice(&(if give_up { GIVE_UP } else { 0 }).to_le_bytes());
    if let (true, Target::Collective(mine)) = (give_up, &x.target) {
        // The call this rank gives up in: an answerer that made another call at that point
        // learns it from its own error (see `given_up`).
        msg.extend_from_slice(&mine.encode());
    }
    for r in (0..m.size).filter(|&r| r != m.rank) {
        send(rc, r, ASK, msg.clone(), outgoing);
    }
}

/// Writes the report and acts on it.
fn conclude(m: &Monitor, mut x: Exchange) {
    let mut st = m.lock();
    x.replies[m.rank] = Some(m.snapshot(&st));
    let text = report::write(m.rank, &x.headline, &x.target, &x.replies, m.answer_window().as_secs_f64());
    let me = rank_label();
    let mut block = String::new();
    for line in text.lines() {
        block.push_str(&format!("[duralumin {me}] {line}\n"));
    }
    eprint!("{block}");
    let op = format!("{} #{}", x.what, x.seq);
    let happened = if x.fault { "failed" } else { "timed out" };
    if m.on_timeout() == OnTimeout::Abort {
        abort_job(&format!("{op} {happened}, aborting the job (OnTimeout::Abort)"));
    }
    if !x.interruptible {
        abort_job(&format!(
            "{op} {happened} and MPI cannot interrupt it, aborting the job instead of returning an error"
        ));
    }
    let poison = if x.fault {
        let mismatch = st.fault.as_mut().and_then(|f| f.mismatch.take());
        fault_poison(x.trigger, &op, mismatch, text, m.rank)
    } else {
        timeout_poison(x.trigger, x.what, x.seq, x.elapsed, text, m.rank)
    };
    Monitor::poison_with(&mut st, m, poison);
    if x.fault {
        st.fault = None;
        st.fault_done = true;
        m.concluded.notify_all();
    }
    drop(st);
    if ffi::ulfm::available() {
        // Blocked MPI calls on these communicators return (MPIX_ERR_REVOKED), here and on
        // every other rank.
        for &c in &m.data {
            let _ = ffi::ulfm::revoke(c);
        }
    }
}
