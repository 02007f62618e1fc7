//! The thread that drops what GPU host callbacks release.
//!
//! A host function queued on a stream (`cuLaunchHostFunc`, `hipStreamAddCallback`) must not call
//! the GPU runtime, and dropping a keep-alive might (it can free pinned memory). So the callback
//! only sends the payload here, and this thread drops it.

use std::sync::OnceLock;
use std::sync::mpsc::{Sender, channel};

use super::KeepAlive;
use crate::error::{Error, Result};

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
        .ok_or_else(|| Error::Device { call, message: "the thread that releases keep-alives could not start".into() })
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
