//! The thread that drops what GPU host callbacks release.
//!
//! A host function queued on a stream (`cuLaunchHostFunc`, `hipStreamAddCallback`) must not call
//! the GPU runtime, and dropping a keep-alive might (it can free pinned memory). So the callback
//! only sends the payload here, and this thread drops it.
//!
//! When the callback itself cannot be queued, [`drop_when_drained`] stands in for it.

use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

use crate::api::error::{Error, Result};
use crate::device::KeepAlive;

/// The reaper's queue; `None` when its thread could not be started.
static REAPER: OnceLock<Option<Sender<Vec<KeepAlive>>>> = OnceLock::new();

/// Starts the reaper if it is not running (call before queueing a callback, never from one).
/// `call` names the runtime call that needed it, for the error.
pub(crate) fn start(call: &'static str) -> Result<()> {
    REAPER
        .get_or_init(|| {
            let (tx, rx) = channel::<Vec<KeepAlive>>();
            let spawned = std::thread::Builder::new().name("duralumin-reaper".into()).spawn(move || {
                for keep in rx {
                    drop(keep);
                }
            });
            spawned.ok().map(|_| tx)
        })
        .as_ref()
        .map(drop)
        .ok_or_else(|| Error::device(call, "the thread that releases keep-alives could not start"))
}

/// Hands `keep` to the reaper (from a host callback). If the reaper is gone, leaks it rather
/// than dropping it on the runtime's thread.
pub(crate) fn reap(keep: Vec<KeepAlive>) {
    match REAPER.get() {
        Some(Some(tx)) => {
            if let Err(unsent) = tx.send(keep) {
                std::mem::forget(unsent);
            }
        }
        _ => std::mem::forget(keep),
    }
}

/// Drops `keep` once `drained()` (which blocks until the work queued so far on a stream has run,
/// and says whether it could tell) returns true, on a thread of its own; leaks it otherwise.
/// For a keep-alive whose callback could not be queued: the work queued before may still use
/// what it holds, so it may go only once that work is through, and the calling thread must not
/// wait for that itself: it may be the proxy thread (`docs/architecture.md#the-queue-order-rule`).
/// Leaking is the fallback whenever the work is not known to be through (the wait failed,
/// panicked, or no thread could start): a bounded loss on a path where the device is already
/// failing, rather than memory freed under it, or a flag slot lent again under a stream still
/// waiting on it.
pub(crate) fn drop_when_drained(keep: Vec<KeepAlive>, drained: impl FnOnce() -> bool + Send + 'static) {
    // Not dropped with the closure if the thread cannot start, nor on a panic in `drained`.
    let keep = std::mem::ManuallyDrop::new(keep);
    let _ = std::thread::Builder::new().name("duralumin-drain".into()).spawn(move || {
        if drained() {
            drop(std::mem::ManuallyDrop::into_inner(keep));
        }
    });
}
