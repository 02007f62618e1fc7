//! The progress engine: one proxy thread per process that drives non-blocking operations.
//!
//! Every operation is a future (an algorithm's state machine over [`crate::transport`], or a
//! wait on an MPI request). A blocking call polls its future on the calling thread
//! ([`block_on`]); a non-blocking call wraps it in a [`Task`] that the proxy thread polls until
//! it completes, so non-blocking operations make progress while the caller computes.
//!
//! Polling is adaptive: while tasks are pending the thread spins briefly, then yields, then
//! sleeps with exponential backoff (up to [`MAX_SLEEP`]), starting over whenever an operation
//! moves on ([`made_progress`]): after each step of a long operation the polls come close
//! together again, rather than one per [`MAX_SLEEP`]. With no tasks it dozes in
//! [`DOZE`]-long timed waits, so handing it a task needs no system call (a futex wake costs
//! several microseconds and puts a second thread on the cores the ranks use); after
//! [`DOZES_BEFORE_PARKING`] empty dozes it parks indefinitely, and the next submission wakes
//! it. Idle, it therefore costs nothing (parked) or about a thousand short wake-ups a second
//! for a moment after the last operation. A waiting caller does not depend on the proxy thread at all: it
//! polls the task itself (the task's lock makes sure only one thread polls at a time), which is
//! what keeps a non-blocking small-message operation close to its blocking latency even on an
//! oversubscribed machine; a wait that lasts ([`Task::wait`]) sleeps between polls, so that
//! ranks sharing cores do not starve one another.

use std::cell::Cell;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::api::error::{Error, Result};

/// An operation's state machine.
pub(crate) type OpFuture = Pin<Box<dyn Future<Output = Result<()>> + Send>>;

/// The longest the proxy thread sleeps between polls while operations are pending.
const MAX_SLEEP: Duration = Duration::from_micros(200);

/// How long [`Task::wait`] polls without sleeping.
const WAIT_BEFORE_SLEEPING: Duration = Duration::from_millis(2);

/// The longest [`Task::wait`] sleeps between polls.
const MAX_WAIT_SLEEP: Duration = Duration::from_micros(100);

/// How late the proxy thread's sleeps may end: short enough that the backoff's first sleeps
/// (1, 2, 4 µs…) last about that long rather than the kernel's default 50 µs.
const TIMER_SLACK_NS: u64 = 1_000;

/// How long an idle proxy thread sleeps before looking for new tasks on its own.
const DOZE: Duration = Duration::from_millis(1);

/// Times an idle proxy thread looks for new tasks (spinning, then yielding its core) before it
/// dozes.
const IDLE_CHECKS: u32 = 64;

/// Empty dozes (about 100 ms) before the proxy thread parks until woken.
const DOZES_BEFORE_PARKING: u32 = 100;

thread_local! {
    /// Steps operations polled on this thread have taken (see [`made_progress`]).
    static PROGRESS: Cell<u64> = const { Cell::new(0) };
    /// Whether this is the proxy thread.
    static PROXY: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is the proxy thread, which must never wait for the device (the
/// queue-order rule: `docs/architecture.md#the-queue-order-rule`).
pub(crate) fn on_proxy_thread() -> bool {
    PROXY.with(Cell::get)
}

/// Tells the thread polling an operation that it has moved on (a flag it waited for was
/// raised, a set of messages completed): the next step may be close, so the thread should go
/// back to polling closely rather than keep backing off. Without it, a long operation (a
/// pipelined one: many chunks, each waiting for a copy and then for MPI) would be polled ever
/// more slowly after its first steps, up to [`MAX_SLEEP`] between polls, and every later step
/// would start that late. On a GPU nothing wakes the proxy thread when a copy is done: only
/// polling notices it.
pub(crate) fn made_progress() {
    PROGRESS.with(|p| p.set(p.get().wrapping_add(1)));
}

fn progress_count() -> u64 {
    PROGRESS.with(Cell::get)
}

/// Waits until `done()` holds, calling `help` between checks, so a thread that waits for its
/// own operations drives them rather than waiting for the proxy thread to be scheduled (on a
/// busy machine each hand-off between threads costs microseconds). Backs off as
/// [`block_on`] does, with `sleep` doing the sleeping (a device cuts it short when it has
/// news). Returns `Ok(true)` once done, `Ok(false)` as soon as `help` has nothing left to drive:
/// the caller then waits its own way (blocking in the driver, say).
pub(crate) fn help_until(
    mut done: impl FnMut() -> Result<bool>,
    help: crate::device::Help<'_>,
    mut sleep: impl FnMut(Duration),
) -> Result<bool> {
    let mut backoff = Backoff::default();
    loop {
        let moved = progress_count();
        if done()? {
            return Ok(true);
        }
        if !help() {
            return Ok(false);
        }
        if progress_count() != moved {
            backoff.reset();
        } else {
            backoff.snooze_with(&mut sleep);
        }
    }
}

/// `fut`, unless `give_up` says otherwise first: its output, or `give_up`'s error. A future
/// given up on is leaked, not dropped: it may hold MPI requests that will never complete
/// (dropping it would wait for them) on memory that must then never be freed.
pub(crate) async fn unless(fut: OpFuture, give_up: impl FnMut() -> Option<Error>) -> Result<Result<()>> {
    unless_or_finish(fut, give_up, || false).await
}

/// As [`unless`], but a future given up on while `finish()` holds is polled on to its end
/// rather than leaked, then the give-up's error returned: for MPI requests on the caller's own
/// memory after the program revoked the communicator, which completes them soon.
pub(crate) async fn unless_or_finish(
    fut: OpFuture,
    mut give_up: impl FnMut() -> Option<Error>,
    finish: impl Fn() -> bool,
) -> Result<Result<()>> {
    let mut fut = Some(fut);
    let mut given: Option<Error> = None;
    std::future::poll_fn(move |cx| {
        let Some(f) = fut.as_mut() else { return Poll::Ready(Err(Error::Progress("polled after giving up"))) };
        if let Poll::Ready(r) = f.as_mut().poll(cx) {
            return Poll::Ready(given.take().map_or(Ok(r), Err));
        }
        if given.is_some() {
            return Poll::Pending;
        }
        match give_up() {
            Some(e) if finish() => {
                given = Some(e);
                Poll::Pending
            }
            Some(e) => {
                std::mem::forget(fut.take());
                Poll::Ready(Err(e))
            }
            None => Poll::Pending,
        }
    })
    .await
}

/// Polls `fut` on the calling thread until it completes.
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    block_on_with(fut, std::thread::sleep)
}

/// [`block_on`], with `sleep` doing the backoff's sleeping.
fn block_on_with<F: Future>(fut: F, mut sleep: impl FnMut(Duration)) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    let mut backoff = Backoff::default();
    loop {
        let moved = progress_count();
        if let Poll::Ready(out) = fut.as_mut().poll(&mut cx) {
            return out;
        }
        if progress_count() != moved {
            backoff.reset();
        }
        backoff.snooze_with(&mut sleep);
    }
}

/// Operations with chunks in flight on the devices (see [`Hot`]).
static HOT: AtomicUsize = AtomicUsize::new(0);

/// Held by an operation while its chunks are in flight: the proxy thread then polls without
/// sleeping (spinning, then yielding its core to whoever wants it), so that each pipeline step
/// costs its copies and its MPI part and not a sleep; a device's flag write cannot wake a
/// sleeping thread. Not where the cores are oversubscribed (see [`oversubscribed`]).
#[derive(Debug)]
pub(crate) struct Hot(());

impl Hot {
    pub(crate) fn new() -> Hot {
        HOT.fetch_add(1, Ordering::AcqRel);
        Hot(())
    }
}

impl Drop for Hot {
    fn drop(&mut self) {
        HOT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Whether any operation holds a [`Hot`] and the cores are not oversubscribed.
fn hot() -> bool {
    HOT.load(Ordering::Acquire) > 0 && !oversubscribed()
}

/// Whether this node's ranks (and their proxy threads) fill its cores, or Open MPI was told
/// they do (`mpi_yield_when_idle`): the proxy thread then keeps its usual backoff, sleeps
/// included, even with chunks in flight, since a thread that only yields still takes most of
/// a core from the ranks it shares it with.
fn oversubscribed() -> bool {
    static OVER: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *OVER.get_or_init(|| {
        let var = |name: &str| std::env::var(name).ok();
        let local = ["OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"]
            .iter()
            .find_map(|v| var(v)?.parse::<usize>().ok())
            .unwrap_or(1);
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        var("OMPI_MCA_mpi_yield_when_idle").as_deref() == Some("1") || 2 * local > cores
    })
}

/// Spin, then yield, then sleep with doubling durations.
#[derive(Debug, Default)]
pub(crate) struct Backoff {
    step: u32,
}

impl Backoff {
    pub(crate) fn reset(&mut self) {
        self.step = 0;
    }

    pub(crate) fn snooze(&mut self) {
        self.snooze_with(std::thread::sleep);
    }

    /// As [`Backoff::snooze`], without the sleeps: spin, then yield.
    fn snooze_hot(&mut self) {
        self.step = self.step.saturating_add(1);
        if self.step <= 32 { std::hint::spin_loop() } else { std::thread::yield_now() }
    }

    /// As [`Backoff::snooze`], with `sleep` doing the sleeping (e.g. a timed wait that others
    /// can cut short).
    pub(crate) fn snooze_with(&mut self, sleep: impl FnOnce(Duration)) {
        self.step = self.step.saturating_add(1);
        match self.step {
            0..=32 => std::hint::spin_loop(),
            33..=64 => std::thread::yield_now(),
            s => {
                let us = 1u64 << (s - 65).min(8);
                sleep(Duration::from_micros(us).min(MAX_SLEEP));
            }
        }
    }
}

enum TaskState {
    Running(OpFuture),
    Finished(Option<Result<()>>),
}

/// Polls an operation once, on this thread.
///
/// A panic in it (a user `combine` that panics, say) leaves its collective half done: the
/// other ranks would wait for this one for ever, so under MPI the job ends, whatever `OnPanic`
/// says. Without MPI (the host device alone) it ends with a typed error.
pub(crate) fn poll_guarded(fut: &mut OpFuture) -> Poll<Result<()>> {
    let mut cx = Context::from_waker(Waker::noop());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
        Ok(polled) => polled,
        Err(_) => {
            if crate::ffi::is_initialized() && !crate::ffi::is_finalized() {
                crate::reliability::abort::abort_job(
                    "panic inside an operation in flight (a ReduceOp's combine?), aborting the job",
                );
            }
            Poll::Ready(Err(Error::Progress("the operation panicked")))
        }
    }
}

/// One non-blocking operation in flight.
pub(crate) struct Task {
    state: Mutex<TaskState>,
    done: AtomicBool,
}

impl std::fmt::Debug for Task {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Task").field("done", &self.done.load(Ordering::Relaxed)).finish()
    }
}

impl Task {
    pub(crate) fn new(fut: OpFuture) -> Arc<Task> {
        Arc::new(Task { state: Mutex::new(TaskState::Running(fut)), done: AtomicBool::new(false) })
    }

    pub(crate) fn is_done(&self) -> bool {
        self.done.load(Ordering::Acquire)
    }

    /// Polls the operation once unless another thread is polling it right now. Returns whether
    /// it has completed.
    pub(crate) fn poll_once(&self) -> bool {
        if self.is_done() {
            return true;
        }
        let Ok(mut state) = self.state.try_lock() else { return false };
        let TaskState::Running(fut) = &mut *state else { return true };
        match poll_guarded(fut) {
            Poll::Pending => false,
            Poll::Ready(result) => {
                *state = TaskState::Finished(Some(result));
                self.done.store(true, Ordering::Release);
                true
            }
        }
    }

    /// Polls until complete (on this thread), then takes the result. A second call returns
    /// `Ok(())`: the outcome is reported once. The waiter spins, then yields its core between
    /// polls: it is the one waiting, so it should notice completion at once. Only once the
    /// operation has not moved for [`WAIT_BEFORE_SLEEPING`] (a peer is late) does it sleep
    /// between polls, a 64th of that time (at most [`MAX_WAIT_SLEEP`]), starting over whenever
    /// the operation moves on ([`made_progress`]): a pipelined operation's steps are noticed at
    /// once, a late peer a few percent late at most, and ranks that outnumber the cores leave
    /// them to the ranks (and the kernel's network work) they wait for.
    pub(crate) fn wait(&self) -> Result<()> {
        let mut spins = 0u32;
        let mut yielding_since = None;
        loop {
            let moved = progress_count();
            if self.poll_once() {
                break;
            }
            if progress_count() != moved {
                (spins, yielding_since) = (0, None);
            }
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::hint::spin_loop();
                continue;
            }
            let waited = yielding_since.get_or_insert_with(Instant::now).elapsed();
            if waited < WAIT_BEFORE_SLEEPING {
                std::thread::yield_now();
            } else {
                std::thread::sleep((waited / 64).min(MAX_WAIT_SLEEP));
            }
        }
        self.take_result()
    }

    /// The result of a completed task, reported once.
    pub(crate) fn take_result(&self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *state {
            TaskState::Finished(result) => result.take().unwrap_or(Ok(())),
            TaskState::Running(_) => Err(Error::Progress("result taken before completion")),
        }
    }
}

#[derive(Default)]
struct Queue {
    incoming: Vec<Arc<Task>>,
    shutdown: bool,
    /// The proxy thread waits without a timeout: a submission must wake it.
    parked: bool,
    /// A device raised a flag since the proxy thread last polled: it must not sleep.
    nudged: bool,
    /// The proxy thread is waiting on the condition variable: only then does a submission or a
    /// nudge need to notify it (a notification is a system call even with nobody waiting).
    sleeping: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    wake: Condvar,
}

/// Handle to the proxy thread. The thread exits (and is joined) when the last handle drops,
/// which happens when the last communicator that used non-blocking operations drops.
pub(crate) struct Engine {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").finish_non_exhaustive()
    }
}

static ENGINE: Mutex<Weak<Engine>> = Mutex::new(Weak::new());

/// The running engine's queue, for [`nudge`].
static QUEUE: Mutex<Weak<Shared>> = Mutex::new(Weak::new());

/// Wakes the proxy thread if it is waiting between polls: a device just wrote a flag that an
/// operation polls, so there is progress to make now rather than after the backoff.
pub(crate) fn nudge() {
    let shared = QUEUE.lock().unwrap_or_else(PoisonError::into_inner).upgrade();
    if let Some(shared) = shared {
        // Set under the lock, so a proxy thread about to sleep either sees it or is already
        // waiting (and gets the notification).
        let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.nudged = true;
        let sleeping = q.sleeping;
        drop(q);
        if sleeping {
            shared.wake.notify_one();
        }
    }
}

impl Engine {
    /// The process's engine, started if no communicator holds it.
    pub(crate) fn get() -> Result<Arc<Engine>> {
        let mut slot = ENGINE.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(engine) = slot.upgrade() {
            return Ok(engine);
        }
        let shared = Arc::new(Shared { queue: Mutex::new(Queue::default()), wake: Condvar::new() });
        let for_thread = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("duralumin-progress".into())
            .spawn(move || {
                crate::ffi::os::set_timer_slack(TIMER_SLACK_NS);
                run(&for_thread)
            })
            .map_err(|_| Error::Progress("could not start the progress thread"))?;
        *QUEUE.lock().unwrap_or_else(PoisonError::into_inner) = Arc::downgrade(&shared);
        let engine = Arc::new(Engine { shared, thread: Some(thread) });
        *slot = Arc::downgrade(&engine);
        Ok(engine)
    }

    /// Hands a task to the proxy thread. A dozing thread notices it within [`DOZE`]: fine
    /// for tasks whose caller polls them too (see the module docs).
    pub(crate) fn submit(&self, task: Arc<Task>) {
        self.push(task, false);
    }

    /// Hands a task to the proxy thread and wakes it even from a doze: for tasks only the
    /// proxy thread drives (stream-ordered operations, whose caller has returned).
    pub(crate) fn submit_now(&self, task: Arc<Task>) {
        self.push(task, true);
    }

    fn push(&self, task: Arc<Task>, wake_dozing: bool) {
        let mut q = self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
        q.incoming.push(task);
        let wake = q.sleeping && (q.parked || wake_dozing);
        drop(q);
        if wake {
            self.shared.wake.notify_one();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shared.queue.lock().unwrap_or_else(PoisonError::into_inner).shutdown = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether the process's proxy thread is running (for leak tests).
pub(crate) fn engine_running() -> bool {
    ENGINE.lock().unwrap_or_else(PoisonError::into_inner).strong_count() > 0
}

fn run(shared: &Shared) {
    PROXY.with(|p| p.set(true));
    let mut active: Vec<Arc<Task>> = Vec::new();
    let mut backoff = Backoff::default();
    while wait_for_work(shared, &mut active, &mut backoff) {
        poll_round(shared, &mut active, &mut backoff);
    }
}

/// Takes in the submitted tasks and drops the finished ones. While none is left, looks for the
/// next a while, then dozes, then parks until a submission wakes the thread. Returns `false` at
/// shutdown with nothing left to run.
fn wait_for_work(shared: &Shared, active: &mut Vec<Arc<Task>>, backoff: &mut Backoff) -> bool {
    let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
    let (mut dozes, mut idle_checks) = (0, 0);
    loop {
        q.nudged = false;
        active.append(&mut q.incoming);
        active.retain(|t| !t.is_done());
        if !active.is_empty() {
            q.parked = false;
            return true;
        }
        if q.shutdown {
            return false;
        }
        if idle_checks < IDLE_CHECKS {
            // Operations often come in a stream (one per training step, say): look for the next
            // one a while before sleeping, so submitting it wakes nobody.
            idle_checks += 1;
            drop(q);
            if idle_checks <= IDLE_CHECKS / 2 {
                std::hint::spin_loop()
            } else {
                std::thread::yield_now()
            }
            q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            continue;
        }
        backoff.reset();
        q.sleeping = true;
        if dozes < DOZES_BEFORE_PARKING {
            dozes += 1;
            q = shared.wake.wait_timeout(q, DOZE).unwrap_or_else(PoisonError::into_inner).0;
        } else {
            q.parked = true;
            q = shared.wake.wait(q).unwrap_or_else(PoisonError::into_inner);
        }
        q.sleeping = false;
    }
}

/// Polls every active task once, and backs off when none finished or moved.
fn poll_round(shared: &Shared, active: &mut Vec<Arc<Task>>, backoff: &mut Backoff) {
    let (before, moved) = (active.len(), progress_count());
    active.retain(|t| !t.poll_once());
    if active.len() < before || progress_count() != moved {
        backoff.reset();
    } else if hot() {
        backoff.snooze_hot();
    } else {
        // Sleeping on the condition variable lets a submission or a device's flag write
        // ([`nudge`]) cut the sleep short.
        backoff.snooze_with(|d| {
            let mut q = shared.queue.lock().unwrap_or_else(PoisonError::into_inner);
            if q.incoming.is_empty() && !q.nudged {
                q.sleeping = true;
                q = shared.wake.wait_timeout(q, d).unwrap_or_else(PoisonError::into_inner).0;
                q.sleeping = false;
            }
            q.nudged = false;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::task::Poll;

    use super::{block_on_with, made_progress};

    /// A future pending `polls` times, reporting progress each time if `moving`.
    fn steps(polls: u32, moving: bool) -> impl std::future::Future<Output = ()> {
        let mut left = polls;
        std::future::poll_fn(move |_| {
            if left == 0 {
                return Poll::Ready(());
            }
            left -= 1;
            if moving {
                made_progress();
            }
            Poll::Pending
        })
    }

    /// A future given up on is leaked where `finish` says no, polled on to its end (then the
    /// give-up's error) where it says yes; one that completes first is never given up.
    #[test]
    #[cfg_attr(miri, ignore = "leaks the future given up on, which Miri's leak check reports")]
    fn a_future_given_up_on_is_leaked_or_run_to_its_end() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

        use super::{OpFuture, block_on, unless_or_finish};
        use crate::api::error::Error;

        let counted = |polls: &Arc<AtomicU32>, ended: &Arc<AtomicBool>| -> OpFuture {
            let (polls, ended) = (Arc::clone(polls), Arc::clone(ended));
            Box::pin(std::future::poll_fn(move |_| {
                if polls.fetch_add(1, Ordering::Relaxed) < 5 {
                    return Poll::Pending;
                }
                ended.store(true, Ordering::Relaxed);
                Poll::Ready(Ok(()))
            }))
        };
        let given_up = || Some(Error::Revoked);
        for finish in [false, true] {
            let (polls, ended) = (Arc::default(), Arc::default());
            let out = block_on(unless_or_finish(counted(&polls, &ended), given_up, || finish));
            assert!(matches!(out, Err(Error::Revoked)), "finish {finish}: {out:?}");
            assert_eq!(ended.load(Ordering::Relaxed), finish, "finish {finish}: ran to its end");
            assert_eq!(polls.load(Ordering::Relaxed), if finish { 6 } else { 1 });
        }
        let (polls, ended) = (Arc::default(), Arc::default());
        let out = block_on(unless_or_finish(counted(&polls, &ended), || None, || true));
        assert!(matches!(out, Ok(Ok(()))) && ended.load(Ordering::Relaxed));
    }

    #[test]
    fn polling_stays_close_while_the_operation_moves_on() {
        let mut sleeps = 0;
        block_on_with(steps(500, true), |_| sleeps += 1);
        assert_eq!(sleeps, 0, "an operation that moved on at every poll was polled after sleeps");
        block_on_with(steps(500, false), |_| sleeps += 1);
        assert!(sleeps > 0, "an operation that did not move on was polled without backing off");
    }
}
