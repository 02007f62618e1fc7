//! The host device's executors: lanes of work run in order, the threads that run them, and the
//! streams that queue work on them.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::signals::{Signals, check_a_while};
use crate::api::error::{Error, Result};
use crate::device::{GiveUp, Help};

pub(super) type Work = Box<dyn FnOnce() + Send>;

/// Whether a wait item may pass. Checked under its queue's lock by whichever thread advances
/// the queue, so it only reads (a flag, an event) and never blocks.
pub(super) type Ready = Box<dyn Fn() -> bool + Send>;

/// An item queued on a lane, and its ticket there (see [`Lane::push`]).
pub(super) type LaneItem = (Arc<Lane>, u64);

/// One item of a stream's work.
enum Item {
    /// Runs to its end once started: a copy, a flag write, a kernel.
    Run(Work),
    /// The stream goes on once this holds (a flag wait, a join).
    Wait(Ready),
}

/// The work of one executor (one stream's, or the streams' that share it with
/// [`HostDevice::with_queues`](super::HostDevice::with_queues)), run in order by whichever
/// thread advances it: the executor thread, or a thread synchronizing with one of its streams,
/// which runs the work itself rather than wait for the executor thread to be scheduled. One
/// thread runs an item at a time.
pub(super) struct Lane {
    state: Mutex<LaneState>,
    /// Where the lane's threads sleep: woken when work is queued, an item finishes or the lane
    /// closes, and (those waiting for one) when a flag of the device is written.
    changed: Condvar,
    signals: Arc<Signals>,
    /// `LaneState::finished`, for other lanes' waits on this one's items (checked under their
    /// own lane's lock, so they read this rather than take this lane's).
    finished: AtomicU64,
    /// Other lanes' waits on this lane's items that have not passed: while there are any,
    /// finishing an item wakes the device's sleepers that wait for a flag (waiting lanes sleep
    /// as those do).
    watchers: AtomicUsize,
}

#[derive(Default)]
struct LaneState {
    items: VecDeque<Item>,
    /// A thread is running an item it took off `items`: no one else may start the next.
    running: bool,
    /// Items ever queued and ever finished: a synchronize waits until `finished` reaches the
    /// `queued` it saw.
    queued: u64,
    finished: u64,
    /// Threads asleep on `changed`, and how many of them also wait for a flag.
    sleepers: usize,
    flag_sleepers: usize,
    /// Threads waiting for the lane that run its work themselves (see [`Lane::wait_helping`]):
    /// the executor thread leaves the work to them meanwhile.
    helpers: usize,
    /// An item panicked (a kernel of [`HostDevice::launch`](super::HostDevice::launch)):
    /// reported by every later synchronize, as a faulted GPU context reports its fault; later
    /// work still runs, so no operation waiting for the stream hangs.
    panicked: bool,
    /// The executor thread finishes the queued work and exits.
    closed: bool,
}

impl LaneState {
    /// Whether a thread may run the next item now.
    fn runnable(&self) -> bool {
        !self.running
            && match self.items.front() {
                Some(Item::Run(_)) => true,
                Some(Item::Wait(ready)) => ready(),
                None => false,
            }
    }

    /// Whether the lane is held up by a wait (so only a flag write moves it on).
    fn waiting(&self) -> bool {
        !self.running && matches!(self.items.front(), Some(Item::Wait(_)))
    }

    /// Whether the executor thread is through.
    fn ended(&self) -> bool {
        self.closed && self.items.is_empty() && !self.running
    }

    /// Counts the item at the front as finished (it has run, or its wait has passed).
    fn finish_one(&mut self, lane: &Lane) {
        self.finished += 1;
        lane.finished.store(self.finished, Ordering::SeqCst);
    }
}

type LaneGuard<'a> = MutexGuard<'a, LaneState>;

/// How long the executor thread leaves runnable work to a thread that waits for the lane and
/// runs it itself, before running it anyway.
const HELPER_GRACE: Duration = Duration::from_millis(1);

impl Lane {
    fn new(signals: &Arc<Signals>) -> Arc<Lane> {
        let lane = Arc::new(Lane {
            state: Mutex::default(),
            changed: Condvar::new(),
            signals: Arc::clone(signals),
            finished: AtomicU64::new(0),
            watchers: AtomicUsize::new(0),
        });
        signals.add_lane(&lane);
        lane
    }

    fn lock(&self) -> LaneGuard<'_> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases the lane after a change of its state made under `st`, then wakes its sleepers.
    /// Not before: a sleeper woken while the lock is still held would only block on it, and on
    /// a busy machine could take the core of the thread that holds it.
    fn unlock_changed(&self, st: LaneGuard<'_>) {
        let wake = st.sleepers > 0;
        drop(st);
        if wake {
            self.changed.notify_all();
        }
    }

    /// Wakes the lane's sleepers that wait for a flag.
    pub(super) fn wake_flag_sleepers(&self) {
        if self.lock().flag_sleepers > 0 {
            self.changed.notify_all();
        }
    }

    /// Sleeps until the lane changes (or, with `flags`, a flag of the device is written) or
    /// `limit` runs out, unless `ready(state)` holds once the sleeper is counted in.
    fn sleep<'a>(
        &'a self,
        mut st: LaneGuard<'a>,
        flags: bool,
        limit: Duration,
        ready: impl Fn(&LaneState) -> bool,
    ) -> LaneGuard<'a> {
        st.sleepers += 1;
        if flags {
            st.flag_sleepers += 1;
            // A flag's writer wakes the lane under the lane's lock, so not before the wait
            // below has released it.
            self.signals.sleeper_in();
        }
        if !ready(&st) {
            st = self.changed.wait_timeout(st, limit).unwrap_or_else(PoisonError::into_inner).0;
        }
        st.sleepers -= 1;
        if flags {
            st.flag_sleepers -= 1;
            self.signals.sleeper_out();
        }
        st
    }

    /// Queues an item, waking the lane's sleepers if it is the next one to run. Returns its
    /// ticket: it has run once the lane has finished that many items.
    fn push(&self, item: Item) -> Result<u64> {
        let mut st = self.lock();
        if st.closed {
            return Err(Error::device("host stream", "the stream's executor has stopped"));
        }
        st.items.push_back(item);
        st.queued += 1;
        let ticket = st.queued;
        if st.items.len() == 1 {
            // Behind other items it changes nothing until they are through.
            self.unlock_changed(st);
        }
        Ok(ticket)
    }

    /// Whether the item with `ticket` (see [`Lane::push`]) has run.
    pub(super) fn has_finished(&self, ticket: u64) -> bool {
        self.finished.load(Ordering::SeqCst) >= ticket
    }

    /// The ticket of the item queued last (0 before the first).
    pub(super) fn last_ticket(&self) -> u64 {
        self.lock().queued
    }

    /// Whether every item queued so far has run.
    pub(super) fn is_through(&self) -> bool {
        let st = self.lock();
        st.finished == st.queued
    }

    /// Runs items in order until the lane is empty or waits, unless another thread is running
    /// one. Returns whether any item finished.
    fn advance(&self) -> bool {
        let mut st = self.lock();
        let mut ran = false;
        while !st.running {
            match st.items.front() {
                Some(Item::Wait(ready)) if ready() => {
                    st.items.pop_front();
                }
                Some(Item::Run(_)) => {
                    let Some(Item::Run(work)) = st.items.pop_front() else { break };
                    st = self.run(st, work);
                }
                _ => break,
            }
            st.finish_one(self);
            ran = true;
        }
        if ran {
            self.unlock_changed(st);
            // Paired with `After::new`: either a waiting lane sees the store of `finish_one`
            // when it checks, or this sees it counted in and wakes it.
            if self.watchers.load(Ordering::SeqCst) > 0 {
                self.signals.wake_all();
            }
        }
        ran
    }

    /// Runs `work`, taken off the front of the lane, without holding the lane's lock: the lane
    /// is marked running meanwhile. A panic is caught and recorded (see `LaneState::panicked`).
    fn run<'a>(&'a self, mut st: LaneGuard<'a>, work: Work) -> LaneGuard<'a> {
        st.running = true;
        drop(st);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
        let mut st = self.lock();
        st.running = false;
        st.panicked |= outcome.is_err();
        st
    }

    /// Returns once `ready()` holds (it reads a flag, say), as [`Lane::wait_helping`] does.
    pub(super) fn wait_helping_until(&self, ready: impl Fn() -> bool, help: Help<'_>) {
        self.wait_helping(|_| ready(), help);
    }

    /// Returns once `until(state)` holds, advancing the lane on this thread meanwhile and
    /// calling `help` (see [`Device::synchronize_helping`]); between checks it sleeps until the
    /// lane changes or a flag of the device is written (or, while `help` has work, a backoff runs
    /// out).
    ///
    /// [`Device::synchronize_helping`]: crate::device::Device::synchronize_helping
    fn wait_helping(&self, until: impl Fn(&LaneState) -> bool, help: Help<'_>) {
        /// Counts the thread in as a helper while it waits (and out, even on a panic in `help`).
        struct Helping<'a>(&'a Lane);
        impl Drop for Helping<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock();
                st.helpers -= 1;
                // Only the executor thread's rest depends on the helpers (it leaves runnable
                // work to them): wake it only if it has something to do now. A waiter leaving
                // an idle lane (every `synchronize` of an idle stream) wakes nobody, which cost
                // a futex wake and a context switch per call.
                if st.helpers == 0 && (st.runnable() || st.ended()) {
                    self.0.unlock_changed(st);
                }
            }
        }
        self.lock().helpers += 1;
        let _helping = Helping(self);
        let done = || {
            if self.advance() {
                crate::common::progress::made_progress();
            }
            until(&self.lock())
        };
        let news = |st: &LaneState| until(st) || st.runnable();
        let nap = |limit| drop(self.sleep(self.lock(), true, limit, news));
        if matches!(crate::common::progress::help_until(|| Ok(done()), help, nap), Ok(true)) {
            return;
        }
        while check_a_while(|| done().then_some(())).is_none() {
            nap(self.signals.longest_sleep);
        }
    }

    /// Blocks until the work queued so far has run (see [`Lane::wait_helping`]).
    pub(super) fn synchronize(&self, help: Help<'_>, give_up: GiveUp<'_>) -> Result<()> {
        let target = self.last_ticket();
        self.wait_helping(|st| st.finished >= target || give_up.is_some_and(|g| g()), help);
        if self.lock().panicked {
            return Err(Error::device("host stream", "a kernel queued on the stream panicked"));
        }
        Ok(())
    }

    /// The executor thread: runs what it can, sleeps until there is more, and exits once the
    /// lane is closed and empty. While threads wait for the lane and run its work themselves, it
    /// leaves the work to them (two threads taking turns at one lane only contend for it), and
    /// steps in only when they have not moved it on for [`HELPER_GRACE`] (a helper can be busy
    /// driving an operation), so the lane never depends on them.
    fn execute(&self) {
        let go_on = |st: &LaneState| st.ended() || (st.runnable() && st.helpers == 0);
        loop {
            self.advance();
            // Work comes in bursts: look for more a while (without contending for the lock)
            // before sleeping.
            let soon = check_a_while(|| self.state.try_lock().ok().filter(|st| go_on(st)).map(drop));
            let mut st = self.lock();
            if soon.is_none() {
                st = self.rest(st, go_on);
            }
            if st.ended() {
                return;
            }
        }
    }

    /// The executor thread sleeps until it should go on (`go_on`), or until runnable work has
    /// been left to helpers for [`HELPER_GRACE`], or until the helpers have left.
    fn rest<'a>(&'a self, mut st: LaneGuard<'a>, go_on: impl Fn(&LaneState) -> bool) -> LaneGuard<'a> {
        while !go_on(&st) {
            if st.runnable() {
                let seen = st.finished;
                st = self.sleep(st, false, HELPER_GRACE, |st| st.helpers == 0 || st.finished != seen);
                if st.runnable() && st.finished == seen {
                    break;
                }
            } else if st.helpers > 0 {
                // Held up by a wait a helper is there for: no flag write wakes this thread
                // (each would cost the writer a system call), only the lane's changes, or
                // the longest sleep if a helper never moves it on. Once the helpers leave,
                // look for work a while again: their thread is likely to queue more at
                // once, and finding this one awake needs no wake-up.
                st = self.sleep(st, false, self.signals.longest_sleep, |st| st.helpers == 0 || st.runnable());
                if st.helpers == 0 {
                    break;
                }
            } else {
                let flags = st.waiting();
                st = self.sleep(st, flags, self.signals.longest_sleep, &go_on);
            }
        }
        st
    }
}

/// Items of other lanes that a wait item waits for (a buffer's earlier uses), counted in as
/// their lanes' watchers while it waits.
struct After(Vec<LaneItem>);

impl After {
    fn new(items: Vec<LaneItem>) -> After {
        for (lane, _) in &items {
            lane.watchers.fetch_add(1, Ordering::SeqCst);
        }
        After(items)
    }

    /// Whether every item has run.
    fn passed(&self) -> bool {
        self.0.iter().all(|(lane, ticket)| lane.has_finished(*ticket))
    }
}

impl Drop for After {
    fn drop(&mut self) {
        for (lane, _) in &self.0 {
            lane.watchers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// An executor thread and its lane.
pub(super) struct Queue {
    lane: Arc<Lane>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Queue {
    pub(super) fn start(ordinal: usize, signals: &Arc<Signals>) -> Result<Arc<Queue>> {
        let lane = Lane::new(signals);
        let executor = Arc::clone(&lane);
        let thread = std::thread::Builder::new()
            .name(format!("duralumin-host-stream-{ordinal}"))
            .spawn(move || executor.execute())
            .map_err(|e| Error::device_from("spawn host stream", e))?;
        Ok(Arc::new(Queue { lane, thread: Mutex::new(Some(thread)) }))
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        // The thread finishes the queued work, then exits.
        let mut st = self.lane.lock();
        st.closed = true;
        self.lane.unlock_changed(st);
        if let Some(t) = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = t.join();
        }
    }
}

/// The executors that streams share on a device made by
/// [`HostDevice::with_queues`](super::HostDevice::with_queues), handed out round robin; each
/// lives while a stream uses it.
pub(super) struct SharedQueues {
    queues: Vec<Weak<Queue>>,
    /// Streams made so far.
    made: usize,
}

impl SharedQueues {
    /// `count` executors (at least 1), none started yet.
    pub(super) fn new(count: usize) -> SharedQueues {
        SharedQueues { queues: (0..count.max(1)).map(|_| Weak::new()).collect(), made: 0 }
    }

    /// The executor of the next stream: the next in turn, started if no stream uses it now.
    pub(super) fn next(&mut self, ordinal: usize, signals: &Arc<Signals>) -> Result<Arc<Queue>> {
        let i = self.made % self.queues.len();
        self.made += 1;
        if let Some(queue) = self.queues[i].upgrade() {
            return Ok(queue);
        }
        let queue = Queue::start(ordinal, signals)?;
        self.queues[i] = Arc::downgrade(&queue);
        Ok(queue)
    }
}

pub(super) struct StreamInner {
    pub(super) device_id: u64,
    pub(super) ordinal: usize,
    queue: Arc<Queue>,
    #[cfg(test)]
    pub(super) gate: Arc<super::wait_gate::WaitGate>,
}

/// A stream of the [`HostDevice`](super::HostDevice): an executor thread running work in order
/// (shared with other streams on a device made by
/// [`HostDevice::with_queues`](super::HostDevice::with_queues)). Cloning gives another handle
/// to the same stream; the thread exits when the last handle of every stream using it drops,
/// after running what was queued.
#[derive(Clone)]
pub struct HostStream {
    pub(super) inner: Arc<StreamInner>,
}

impl fmt::Debug for HostStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostStream").field("ordinal", &self.inner.ordinal).finish_non_exhaustive()
    }
}

impl HostStream {
    /// A stream of the device `device_id` whose work runs on `queue`.
    pub(super) fn new(device_id: u64, ordinal: usize, queue: Arc<Queue>) -> HostStream {
        HostStream {
            inner: Arc::new(StreamInner {
                device_id,
                ordinal,
                queue,
                #[cfg(test)]
                gate: Arc::default(),
            }),
        }
    }

    pub(super) fn submit(&self, work: Work) -> Result<()> {
        self.lane().push(Item::Run(work)).map(drop)
    }

    /// Queues `work` and returns its ticket on the stream's lane.
    pub(super) fn submit_ticketed(&self, work: Work) -> Result<u64> {
        self.lane().push(Item::Run(work))
    }

    pub(super) fn submit_wait(&self, ready: Ready) -> Result<()> {
        self.lane().push(Item::Wait(ready)).map(drop)
    }

    /// Queues a wait until the items `after` of other lanes have run (nothing if there are none).
    pub(super) fn submit_after(&self, after: Vec<LaneItem>) -> Result<()> {
        if after.is_empty() {
            return Ok(());
        }
        let after = After::new(after);
        self.submit_wait(Box::new(move || after.passed()))
    }

    /// The lane the stream's work runs on.
    pub(super) fn lane(&self) -> &Arc<Lane> {
        &self.inner.queue.lane
    }

    /// Blocks until the work queued so far has run. The calling thread runs queued work itself
    /// while the executor thread is not running it. An error if a kernel queued on the stream
    /// (or on a stream sharing its executor) panicked.
    pub fn sync(&self) -> Result<()> {
        self.lane().synchronize(&mut || false, None)
    }
}
