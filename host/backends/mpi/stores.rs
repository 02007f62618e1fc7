//! How a rank writes the shared-memory window in a large allreduce: with ordinary stores, or
//! around the caches (non-temporal), whichever costs it less while the job runs. On some
//! machines (this one, about one run in four) ordinary stores into lines the other core held
//! slow down fourfold for whole runs, where streamed ones do not; elsewhere streamed ones cost
//! about a third more (`docs/topology.md`, "The slow mode"). The choice only changes how this
//! rank's bytes are written, not which bytes or when, so each rank makes its own.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

/// How a rank writes the shared-memory window in large allreduces
/// ([`Tuning::shared_memory_stores`](crate::Tuning::shared_memory_stores)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum WindowStores {
    /// Whichever way costs this rank less, measured as the job runs (one operation in 16 is
    /// written the other way, on every rank at once, to keep its cost known).
    #[default]
    Adaptive,
    /// Ordinary stores: the best where the cores share a cache and stores into lines another
    /// core held stay cheap.
    Cached,
    /// Non-temporal stores, around the caches.
    Streamed,
}

/// How a chunk's window writes are made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stores {
    Cached,
    Streamed,
}

impl Stores {
    fn index(self) -> usize {
        match self {
            Stores::Cached => 0,
            Stores::Streamed => 1,
        }
    }

    fn other(self) -> Stores {
        match self {
            Stores::Cached => Stores::Streamed,
            Stores::Streamed => Stores::Cached,
        }
    }
}

/// One operation in this many is written the way that is not the cheaper one, so that a change
/// of mode is seen. Every rank counts the same operations (the large allreduces of the window,
/// whose counts agree), so all write the other way in the same operation and each measures it
/// as it is when every rank writes so.
const EXPLORE_EVERY: u64 = 16;

/// The running cost of each way, per rank and window.
#[derive(Debug, Default)]
pub(crate) struct StoreChoice {
    /// Per way, a running mean of picoseconds per byte written (0: not measured yet).
    cost: [AtomicU32; 2],
    /// Large operations so far.
    operations: AtomicU64,
}

impl StoreChoice {
    /// The way to write the next operation under `setting`; adaptively, each way once first,
    /// then the cheaper one, but the other one operation in [`EXPLORE_EVERY`].
    pub fn pick(&self, setting: WindowStores) -> Stores {
        match setting {
            WindowStores::Cached => return Stores::Cached,
            WindowStores::Streamed => return Stores::Streamed,
            WindowStores::Adaptive => {}
        }
        let n = self.operations.fetch_add(1, Ordering::Relaxed);
        let [cached, streamed] = [0, 1].map(|i| self.cost[i].load(Ordering::Relaxed));
        let best = match (cached, streamed) {
            (0, _) => return Stores::Cached,
            (_, 0) => return Stores::Streamed,
            (c, s) if s < c => Stores::Streamed,
            _ => Stores::Cached,
        };
        if n % EXPLORE_EVERY == EXPLORE_EVERY - 1 { best.other() } else { best }
    }

    /// Records that writing `bytes` the way `how` took `took` (a mean over the last few, so a
    /// chunk cut short by the scheduler moves it little).
    pub fn record(&self, how: Stores, bytes: usize, took: Duration) {
        if bytes == 0 {
            return;
        }
        let ps = (took.as_nanos().saturating_mul(1000) / bytes as u128).clamp(1, u128::from(u32::MAX));
        let ps = u32::try_from(ps).unwrap_or(u32::MAX);
        let slot = &self.cost[how.index()];
        let old = slot.load(Ordering::Relaxed);
        let new =
            if old == 0 { ps } else { u32::try_from((3 * u64::from(old) + u64::from(ps)) / 4).unwrap_or(u32::MAX) };
        slot.store(new, Ordering::Relaxed);
    }

    /// The cost of each way in picoseconds per byte (0: not measured).
    #[cfg(test)]
    pub fn costs(&self) -> [u32; 2] {
        [0, 1].map(|i| self.cost[i].load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// `ops` operations of 4 chunks, each chunk costing `cost`: how many were written each way.
    fn run(choice: &StoreChoice, ops: usize, cost: impl Fn(Stores) -> u64) -> [usize; 2] {
        let mut used = [0; 2];
        for _ in 0..ops {
            let how = choice.pick(WindowStores::Adaptive);
            used[how.index()] += 1;
            for _ in 0..4 {
                choice.record(how, MIB, Duration::from_micros(cost(how)));
            }
        }
        used
    }

    #[test]
    fn tries_both_then_keeps_the_cheaper_and_still_looks_at_the_other() {
        let choice = StoreChoice::default();
        assert_eq!(choice.pick(WindowStores::Adaptive), Stores::Cached);
        assert_eq!(choice.pick(WindowStores::Streamed), Stores::Streamed);
        // Fast mode: ordinary stores 120 µs a chunk, streamed 160.
        let used = run(&StoreChoice::default(), 64, |h| if h == Stores::Cached { 120 } else { 160 });
        assert!(used[0] >= 58 && used[1] >= 2, "{used:?}");
    }

    #[test]
    fn follows_a_change_of_mode() {
        let choice = StoreChoice::default();
        run(&choice, 64, |h| if h == Stores::Cached { 120 } else { 160 });
        // The slow mode sets in: ordinary stores cost 4x.
        let used = run(&choice, 64, |h| if h == Stores::Cached { 480 } else { 160 });
        assert!(used[1] >= 56, "{used:?}");
        assert!(choice.costs()[0] > choice.costs()[1]);
    }

    #[test]
    fn an_empty_chunk_records_nothing() {
        let choice = StoreChoice::default();
        choice.record(Stores::Cached, 0, Duration::from_micros(5));
        assert_eq!(choice.costs(), [0, 0]);
    }
}
