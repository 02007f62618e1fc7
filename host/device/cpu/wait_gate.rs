//! A test hook that holds a stream's flag waits back, as if the stream had fallen behind.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::HostStream;

/// Lets a test hold a stream back: while the gate is held, the stream's flag waits stop
/// before they look at their flag, as if the stream had fallen behind everything else.
#[derive(Debug, Default)]
pub(crate) struct WaitGate {
    /// Whether the gate is held, and how many waits have reached it.
    state: Mutex<(bool, usize)>,
    changed: Condvar,
}

impl WaitGate {
    /// Checked by a wait of the stream before it looks at its flag: counts the wait in (once:
    /// `arrived` is the wait's own), and holds it back while the gate is held.
    pub(super) fn open_for(&self, arrived: &AtomicBool) -> bool {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !arrived.swap(true, Ordering::Relaxed) {
            st.1 += 1;
            self.changed.notify_all();
        }
        !st.0
    }

    /// Holds the stream's flag waits from now on.
    pub(crate) fn hold(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 = true;
    }

    /// A guard that releases the gate when dropped (a failing test lets its stream go).
    pub(crate) fn held_until_drop(&self) -> impl Drop + '_ {
        struct Release<'a>(&'a WaitGate);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                self.0.release();
            }
        }
        Release(self)
    }

    /// Lets every held wait and later ones through.
    pub(crate) fn release(&self) {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).0 = false;
        self.changed.notify_all();
    }

    /// Waits until `n` waits in all have reached the gate; false if that takes over `limit`.
    pub(crate) fn reached_by(&self, n: usize, limit: Duration) -> bool {
        let end = Instant::now() + limit;
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        while st.1 < n {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self.changed.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }
}

impl HostStream {
    /// The gate this stream's flag waits pass before they look at their flag.
    pub(crate) fn wait_gate(&self) -> &WaitGate {
        &self.inner.gate
    }
}
