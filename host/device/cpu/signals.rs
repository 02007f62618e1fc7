//! How threads wait for the host device's flags: check a while, then sleep until a write wakes
//! them.

use std::sync::atomic::{AtomicUsize, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::Duration;

use super::executor::Lane;

/// Checks before a waiting stream sleeps.
const CHECKS_BEFORE_SLEEPING: u32 = 64;

/// The longest a waiting stream sleeps without a wake-up before it checks again (a safety net:
/// every flag write of the host device wakes it).
pub(super) const LONGEST_SLEEP: Duration = Duration::from_millis(10);

/// How threads wait for flags of the device: they check a few times, yielding the core in
/// between, then sleep until whoever writes a flag of this device wakes them. A sleep that runs
/// out would cost at least the kernel's timer slack (50 µs by default) per wait; a wake-up costs
/// the writer one futex call, and only when someone is asleep. Host threads sleep here; a
/// stream's lane has a condition variable of its own (work queued on one stream wakes no
/// other), and a lane whose sleeper waits for a flag is woken from here too.
pub(super) struct Signals {
    /// Threads asleep until a flag changes: here, or on a lane.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The device's lanes, for waking those with a thread asleep until a flag changes.
    lanes: Mutex<Vec<Weak<Lane>>>,
    /// The longest a sleeping waiter waits for a wake-up before it checks again.
    pub(super) longest_sleep: Duration,
}

impl Signals {
    pub(super) fn new(longest_sleep: Duration) -> Signals {
        Signals {
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            lanes: Mutex::default(),
            longest_sleep,
        }
    }

    /// Adds `lane` to those woken when a flag changes, forgetting lanes that are gone.
    pub(super) fn add_lane(&self, lane: &Arc<Lane>) {
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        lanes.retain(|l| l.strong_count() > 0);
        lanes.push(Arc::downgrade(lane));
    }

    /// Counts in a thread about to sleep until a flag changes. Call before the thread's last
    /// check of what it waits for: the fence is paired with the one in [`Signals::wake_all`],
    /// so either that check sees the write, or the writer sees the sleeper and wakes it.
    pub(super) fn sleeper_in(&self) {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// Counts out a thread counted in by [`Signals::sleeper_in`], once it is awake.
    pub(super) fn sleeper_out(&self) {
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
    }

    /// Returns once `ready()` holds.
    pub(super) fn wait_until(&self, ready: impl Fn() -> bool) {
        if check_a_while(|| ready().then_some(())).is_some() {
            return;
        }
        while !self.sleep_unless(self.longest_sleep, &ready) {}
    }

    /// Sleeps until a write wakes it or `limit` runs out, unless `ready()` already holds;
    /// returns whether it holds afterwards.
    fn sleep_unless(&self, limit: Duration, ready: impl Fn() -> bool) -> bool {
        // The writer takes the lock to wake this thread, so not before the `wait` below has
        // released it.
        self.sleeper_in();
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let done = ready();
        if !done {
            drop(self.wake.wait_timeout(guard, limit).unwrap_or_else(PoisonError::into_inner));
        }
        self.sleeper_out();
        done || ready()
    }

    /// Wakes every thread asleep until a flag changes; call after writing what they wait for.
    pub(super) fn wake_all(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            drop(self.lock.lock().unwrap_or_else(PoisonError::into_inner));
            self.wake.notify_all();
            let lanes: Vec<_> =
                self.lanes.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect();
            for lane in lanes {
                lane.wake_flag_sleepers();
            }
        }
    }
}

/// Calls `check` up to [`CHECKS_BEFORE_SLEEPING`] times, spinning and then yielding the core
/// in between, until it returns something; `None` if it never did (the caller then sleeps).
pub(super) fn check_a_while<T>(mut check: impl FnMut() -> Option<T>) -> Option<T> {
    for i in 0..CHECKS_BEFORE_SLEEPING {
        if let Some(found) = check() {
            return Some(found);
        }
        if i < CHECKS_BEFORE_SLEEPING / 2 { std::hint::spin_loop() } else { std::thread::yield_now() }
    }
    None
}
