//! The simulated GPU's execution: a context's hardware queues, streams and events.
//!
//! A GPU maps streams onto a few hardware queues (`CUDA_DEVICE_MAX_CONNECTIONS`, 8 by default)
//! and runs each queue's work in the order it was submitted: work waiting on the device (a
//! stream memory wait, an event wait, a spinning kernel) holds up everything behind it in its
//! queue, whichever stream that belongs to. The simulator does the same: one worker thread per
//! hardware queue, streams assigned round robin as they are created. A stream's work runs in
//! its order; streams on different queues run concurrently.
//!
//! A hardware queue holds at most `CUDASIM_QUEUE_DEPTH` (1024) items not yet started, as a
//! GPU's command buffer does: a call that would queue more blocks until the device has taken
//! some, so a thread that queues work behind a wait only it can release deadlocks here as on a
//! GPU.
//!
//! After a fault (an access outside any allocation, say) the context is unusable, as after an
//! illegal address on a GPU: the fault is reported on stderr, later work is skipped, and every
//! API call returns the error.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::sys::CUresult;

use crate::Fault;

/// How long a wait may last before the simulator says on stderr that it may be a deadlock (it
/// goes on waiting: the test's own timeout ends it).
pub(crate) const STALL_REPORT: Duration = Duration::from_secs(20);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Work queued on a stream; `Err` faults the context.
pub(crate) type Work = Box<dyn FnOnce() -> Result<(), Fault> + Send>;

struct Item {
    stream: Arc<Stream>,
    what: &'static str,
    work: Work,
}

/// One hardware queue: a worker thread running its items in submission order.
struct Queue {
    items: Mutex<VecDeque<Item>>,
    ready: Condvar,
    /// Signalled when an item leaves the queue (a submitter may be waiting for room).
    room: Condvar,
    depth: usize,
}

/// A context: its hardware queues, streams and sticky error.
pub(crate) struct Context {
    queues: Vec<Arc<Queue>>,
    next_queue: AtomicUsize,
    /// Every stream made in the context (the null stream first), for context-wide waits; a
    /// destroyed one until its work has run.
    streams: Mutex<Vec<Arc<Stream>>>,
    sticky: Mutex<Option<Fault>>,
    /// Retain count of the primary context.
    pub(crate) retained: AtomicUsize,
}

/// A stream: the queue it runs on and how much of its work has run.
pub(crate) struct Stream {
    pub(crate) id: u64,
    queue: Arc<Queue>,
    /// `(submitted, completed)` items.
    counts: Mutex<(u64, u64)>,
    progressed: Condvar,
    destroyed: std::sync::atomic::AtomicBool,
}

static STREAM_IDS: AtomicU64 = AtomicU64::new(0);

impl Context {
    /// A context with `queues` hardware queues of `depth` items each (their worker threads run
    /// for the process's life).
    pub(crate) fn new(queues: usize, depth: usize) -> Arc<Context> {
        let queue =
            || Queue { items: Mutex::default(), ready: Condvar::new(), room: Condvar::new(), depth: depth.max(1) };
        let queues: Vec<Arc<Queue>> = (0..queues.max(1)).map(|_| Arc::new(queue())).collect();
        let ctx = Arc::new(Context {
            queues,
            next_queue: AtomicUsize::new(0),
            streams: Mutex::default(),
            sticky: Mutex::new(None),
            retained: AtomicUsize::new(0),
        });
        for (i, q) in ctx.queues.iter().enumerate() {
            let (q, weak) = (Arc::clone(q), Arc::downgrade(&ctx));
            std::thread::Builder::new()
                .name(format!("cudasim-queue-{i}"))
                .spawn(move || worker(&q, &weak))
                .expect("cudasim: cannot start a hardware queue thread");
        }
        ctx.new_stream();
        ctx
    }

    /// A new stream, on the next hardware queue round robin.
    pub(crate) fn new_stream(&self) -> Arc<Stream> {
        let q = self.next_queue.fetch_add(1, Ordering::Relaxed) % self.queues.len();
        let s = Arc::new(Stream {
            id: STREAM_IDS.fetch_add(1, Ordering::Relaxed),
            queue: Arc::clone(&self.queues[q]),
            counts: Mutex::new((0, 0)),
            progressed: Condvar::new(),
            destroyed: std::sync::atomic::AtomicBool::new(false),
        });
        let mut streams = lock(&self.streams);
        streams.retain(|s| !(s.destroyed.load(Ordering::Acquire) && s.idle()));
        streams.push(Arc::clone(&s));
        s
    }

    /// The null stream.
    pub(crate) fn null_stream(&self) -> Arc<Stream> {
        Arc::clone(&lock(&self.streams)[0])
    }

    /// Marks a stream destroyed: its queued work still runs (and context-wide waits wait for
    /// it); it is forgotten once idle.
    pub(crate) fn destroy(&self, stream: &Arc<Stream>) {
        stream.destroyed.store(true, Ordering::Release);
    }

    /// The context's sticky error, if a fault made it unusable.
    pub(crate) fn check(&self) -> Result<(), CUresult> {
        match &*lock(&self.sticky) {
            Some(f) => Err(f.code),
            None => Ok(()),
        }
    }

    pub(crate) fn fault(&self, stream: u64, what: &str, f: Fault) {
        eprintln!(
            "cudasim: FAULT in {what} on stream {stream}: {} ({:?}); the context is now unusable",
            f.message, f.code
        );
        let mut sticky = lock(&self.sticky);
        if sticky.is_none() {
            *sticky = Some(f);
        }
    }

    /// Waits until every stream has run what was queued on it before the call (what
    /// `cuCtxSynchronize` does and what some calls do implicitly: `what` names the call in the
    /// report of a wait that looks like a deadlock).
    pub(crate) fn wait_idle(&self, what: &str) -> Result<(), CUresult> {
        let streams: Vec<(Arc<Stream>, u64)> =
            lock(&self.streams).iter().map(|s| (Arc::clone(s), s.submitted())).collect();
        for (s, upto) in streams {
            s.wait_for(upto, what);
        }
        self.check()
    }

    /// Queues `work` on `stream`, waiting for room in its hardware queue.
    pub(crate) fn submit(&self, stream: &Arc<Stream>, what: &'static str, work: Work) -> Result<(), CUresult> {
        self.check()?;
        let q = &stream.queue;
        let mut items = lock(&q.items);
        let (start, mut reported) = (Instant::now(), false);
        while items.len() >= q.depth {
            items = q.room.wait_timeout(items, Duration::from_millis(100)).unwrap_or_else(PoisonError::into_inner).0;
            if !reported && start.elapsed() > STALL_REPORT {
                reported = true;
                eprintln!(
                    "cudasim: {what} on stream {} has waited {:?} for room in its hardware queue ({} items): is the device waiting for this thread?",
                    stream.id,
                    start.elapsed(),
                    q.depth
                );
            }
        }
        lock(&stream.counts).0 += 1;
        items.push_back(Item { stream: Arc::clone(stream), what, work });
        q.ready.notify_one();
        Ok(())
    }

    /// A device-wide barrier, which the CUDA programming guide lets allocations of device and
    /// page-locked memory be: work queued on any stream from now on starts only after all work
    /// queued so far, on every stream, has run. The call itself does not wait.
    pub(crate) fn barrier(&self, what: &'static str) -> Result<(), CUresult> {
        let streams: Vec<Arc<Stream>> = lock(&self.streams).clone();
        let upto: Arc<Vec<(Arc<Stream>, u64)>> =
            Arc::new(streams.iter().map(|s| (Arc::clone(s), s.submitted())).collect());
        for s in streams.iter().filter(|s| !s.destroyed.load(Ordering::Acquire)) {
            let upto = Arc::clone(&upto);
            self.submit(
                s,
                what,
                Box::new(move || {
                    for (t, n) in upto.iter() {
                        t.wait_for(*n, what);
                    }
                    Ok(())
                }),
            )?;
        }
        Ok(())
    }

    /// Queues `work` and waits until it has run (a call synchronous with respect to the host).
    pub(crate) fn submit_and_wait(&self, stream: &Arc<Stream>, what: &'static str, work: Work) -> Result<(), CUresult> {
        self.submit(stream, what, work)?;
        let upto = stream.submitted();
        stream.wait_for(upto, what);
        self.check()
    }
}

impl Stream {
    pub(crate) fn submitted(&self) -> u64 {
        lock(&self.counts).0
    }

    /// Whether everything submitted so far has run.
    pub(crate) fn idle(&self) -> bool {
        let c = lock(&self.counts);
        c.1 >= c.0
    }

    /// Waits until the first `upto` items of the stream have run.
    pub(crate) fn wait_for(&self, upto: u64, what: &str) {
        let start = Instant::now();
        let mut reported = false;
        let mut c = lock(&self.counts);
        while c.1 < upto {
            c = self.progressed.wait_timeout(c, Duration::from_millis(100)).unwrap_or_else(PoisonError::into_inner).0;
            if !reported && start.elapsed() > STALL_REPORT {
                reported = true;
                eprintln!(
                    "cudasim: {what} has waited {:?} for stream {} ({} of {upto} items run): is the device waiting for this thread?",
                    start.elapsed(),
                    self.id,
                    c.1
                );
            }
        }
    }
}

fn worker(q: &Queue, ctx: &std::sync::Weak<Context>) {
    // Device waits sleep in steps of a few microseconds at first: without this, each would
    // last at least Linux's default timer slack of 50 µs.
    // SAFETY: `PR_SET_TIMERSLACK` takes one integer and changes only this thread's slack.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong) };
    loop {
        let item = {
            let mut items = lock(&q.items);
            loop {
                if let Some(item) = items.pop_front() {
                    q.room.notify_all();
                    break item;
                }
                items = q.ready.wait(items).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let Some(ctx) = ctx.upgrade() else { return };
        if ctx.check().is_ok()
            && let Err(f) = (item.work)()
        {
            ctx.fault(item.stream.id, item.what, f);
        }
        let mut c = lock(&item.stream.counts);
        c.1 += 1;
        item.stream.progressed.notify_all();
    }
}

/// The longest a device wait sleeps between looks at its condition.
const MAX_DEVICE_WAIT_SLEEP: Duration = Duration::from_millis(1);

/// Waits on the device (a worker thread) until `ready()`: spins, yields, then sleeps in growing
/// steps up to 20 µs, and reports a wait that lasts [`STALL_REPORT`]. A wait that has lasted a
/// while (past about 1.3 ms) sleeps longer, a 64th of the time waited so far (at most
/// [`MAX_DEVICE_WAIT_SLEEP`]), so that a device waiting for a slow peer (another host, ms away)
/// does not take the cores from the threads it waits for: at most 1/64 more latency there.
pub(crate) fn device_wait(ready: impl Fn() -> bool, what: impl Fn() -> String) {
    let start = Instant::now();
    let (mut i, mut reported) = (0u32, false);
    while !ready() {
        i = i.saturating_add(1);
        match i {
            0..64 => std::hint::spin_loop(),
            64..128 => std::thread::yield_now(),
            _ => {
                let step = Duration::from_micros(u64::from((i - 127).min(20)));
                std::thread::sleep(step.max(start.elapsed() / 64).min(MAX_DEVICE_WAIT_SLEEP));
            }
        }
        if !reported && i % 256 == 0 && start.elapsed() > STALL_REPORT {
            reported = true;
            eprintln!("cudasim: the device has waited {:?} for {}", start.elapsed(), what());
        }
    }
}

/// A point in a stream that an event recorded: done once the stream has run up to it.
#[derive(Default)]
pub(crate) struct Marker {
    done: Mutex<bool>,
    cv: Condvar,
}

impl Marker {
    pub(crate) fn set(&self) {
        *lock(&self.done) = true;
        self.cv.notify_all();
    }

    pub(crate) fn is_set(&self) -> bool {
        *lock(&self.done)
    }

    pub(crate) fn wait(&self, what: &str) {
        let start = Instant::now();
        let mut reported = false;
        let mut done = lock(&self.done);
        while !*done {
            done = self.cv.wait_timeout(done, Duration::from_millis(100)).unwrap_or_else(PoisonError::into_inner).0;
            if !reported && start.elapsed() > STALL_REPORT {
                reported = true;
                eprintln!("cudasim: {what} has waited {:?} for an event", start.elapsed());
            }
        }
    }
}

/// An event: the marker of its latest record (none before the first, which waits wait for
/// nothing, as CUDA's do).
#[derive(Default)]
pub(crate) struct Event {
    pub(crate) latest: Mutex<Option<Arc<Marker>>>,
}

impl Event {
    pub(crate) fn latest(&self) -> Option<Arc<Marker>> {
        lock(&self.latest).clone()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// Work that cannot fail.
    fn work(f: impl FnOnce() + Send + 'static) -> Work {
        Box::new(move || {
            f();
            Ok(())
        })
    }

    /// Queues on `stream` a device-side wait that lasts until the returned flag is set.
    fn held(ctx: &Context, stream: &Arc<Stream>) -> Arc<AtomicBool> {
        let go = Arc::new(AtomicBool::new(false));
        let g = Arc::clone(&go);
        ctx.submit(stream, "wait", work(move || device_wait(|| g.load(Ordering::Acquire), || "go".into()))).unwrap();
        go
    }

    /// A wait on one stream holds up the work of every stream on its hardware queue, and only
    /// those: with one queue the second stream's work waits for the first stream's wait; with
    /// two it runs at once.
    #[test]
    fn streams_sharing_a_queue_wait_for_each_other() {
        for queues in [1, 2] {
            let ctx = Context::new(queues, 1024);
            let (a, b) = (ctx.new_stream(), ctx.new_stream());
            let (go, ran) = (held(&ctx, &a), Arc::new(AtomicBool::new(false)));
            let r = Arc::clone(&ran);
            ctx.submit(&b, "write", work(move || r.store(true, Ordering::Release))).unwrap();
            if queues == 1 {
                // Cannot have run: its queue is held by `a`'s wait until `go` is set below.
                std::thread::sleep(Duration::from_millis(20));
                assert!(!ran.load(Ordering::Acquire), "ran past a wait on its hardware queue");
            } else {
                b.wait_for(b.submitted(), "test");
                assert!(ran.load(Ordering::Acquire));
            }
            go.store(true, Ordering::Release);
            ctx.wait_idle("test").unwrap();
            assert!(ran.load(Ordering::Acquire));
        }
    }

    /// A hardware queue holds `depth` items not yet started: the call that queues one more waits
    /// until the device has started one.
    #[test]
    fn a_full_queue_blocks_the_submitter() {
        let ctx = Context::new(1, 2);
        let s = ctx.new_stream();
        let go = held(&ctx, &s);
        // The worker starts the wait (it leaves the queue), then two items fill the queue.
        while !s.queue.items.lock().unwrap().is_empty() {
            std::thread::yield_now();
        }
        for _ in 0..2 {
            ctx.submit(&s, "fill", work(|| ())).unwrap();
        }
        let queued = Arc::new(AtomicBool::new(false));
        let submitter = {
            let (ctx, s, q) = (Arc::clone(&ctx), Arc::clone(&s), Arc::clone(&queued));
            std::thread::spawn(move || {
                ctx.submit(&s, "one more", work(|| ())).unwrap();
                q.store(true, Ordering::Release);
            })
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(!queued.load(Ordering::Acquire), "queued into a full hardware queue");
        go.store(true, Ordering::Release);
        submitter.join().unwrap();
        ctx.wait_idle("test").unwrap();
        assert_eq!(s.submitted(), 4);
    }

    /// After a barrier (what an allocation is), work queued on any stream waits for all work
    /// queued before it on every stream, even on another hardware queue; the call returns at once.
    #[test]
    fn a_barrier_orders_later_work_after_earlier_work() {
        let ctx = Context::new(2, 1024);
        let (a, b) = (ctx.new_stream(), ctx.new_stream());
        let (go, ran) = (held(&ctx, &a), Arc::new(AtomicBool::new(false)));
        ctx.barrier("test barrier").unwrap();
        let r = Arc::clone(&ran);
        ctx.submit(&b, "after", work(move || r.store(true, Ordering::Release))).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        assert!(!ran.load(Ordering::Acquire), "ran past a barrier before the work queued ahead of it");
        go.store(true, Ordering::Release);
        ctx.wait_idle("test").unwrap();
        assert!(ran.load(Ordering::Acquire));
    }

    /// A fault makes the context unusable: later work is skipped and every check fails.
    #[test]
    fn a_fault_is_sticky() {
        let ctx = Context::new(1, 1024);
        let s = ctx.new_stream();
        ctx.submit(&s, "bad", Box::new(|| Err(Fault::illegal("test fault".into())))).unwrap();
        let ran = Arc::new(AtomicBool::new(false));
        let r = Arc::clone(&ran);
        // Queued before the fault is seen, or refused after: either way it never runs.
        let _ = ctx.submit(&s, "after", work(move || r.store(true, Ordering::Release)));
        assert_eq!(ctx.wait_idle("test"), Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(!ran.load(Ordering::Acquire), "work after a fault ran");
        assert!(ctx.submit(&s, "later", Box::new(|| Ok(()))).is_err());
    }
}
