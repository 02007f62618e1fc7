//! Keeping what queued work uses alive until the stream has run it, and ordering operations
//! with their buffers' own streams.
//!
//! A host function queued behind the work hands the keep-alives to the reaper thread (host
//! functions may not call the driver, and a drop might free pinned memory). When the host
//! function cannot be queued, the keep-alives go once the stream has been synchronized, on a
//! thread of its own (the caller may be the proxy thread:
//! `docs/architecture.md#the-queue-order-rule`), or never (see
//! [`super::reaper::drop_when_drained`]).
//!
//! A buffer that belongs to a stream (a cudarc buffer's *home*, where it is freed in stream
//! order) carries it in its keep-alive as a [`Home`]: an operation on another stream first waits
//! for the home stream's work (`acquire`), and the home stream then waits for the operation
//! (`release`), so the buffer may be used or dropped there right after the call returns.

use std::ffi::c_void;

use super::{Driver, Gpu, reaper};
use crate::api::error::Result;
use crate::device::KeepAlive;

/// A buffer's home stream, as carried in its keep-alive.
pub(crate) struct Home<S>(pub(crate) S);

/// What the drivers' host functions call with the payload [`Gpu::hold`] queued.
///
/// # Safety
/// `payload` is a `Box<Vec<KeepAlive>>` from `Box::into_raw`, passed exactly once.
pub(crate) unsafe fn released(payload: *mut c_void) {
    // SAFETY: guaranteed by the caller (the driver passes back what `hold` queued).
    let keep = unsafe { Box::from_raw(payload.cast::<Vec<KeepAlive>>()) };
    reaper::reap(*keep);
}

impl<R: Driver> Gpu<R> {
    /// Holds the entries of `keep` that are not home streams (those are ordered by
    /// `acquire`/`release` instead).
    pub(crate) fn hold_others(&self, stream: &R::Stream, keep: Vec<KeepAlive>) -> Result<()> {
        self.hold(stream, keep.into_iter().filter(|k| !k.is::<Home<R::Stream>>()).collect())
    }

    /// Keeps `keep` alive until the work queued on `stream` so far has run.
    pub(crate) fn hold(&self, stream: &R::Stream, keep: Vec<KeepAlive>) -> Result<()> {
        if keep.is_empty() {
            return Ok(());
        }
        let (error, keep) = match self.bind().and_then(|()| reaper::start(R::HOST_FN)) {
            Err(e) => (e, keep),
            Ok(()) => {
                let payload = Box::into_raw(Box::new(keep));
                // SAFETY: `released` takes back the box exactly once, when the stream reaches it.
                match unsafe { self.driver().host_fn(stream, payload.cast()) } {
                    Ok(()) => return Ok(()),
                    // SAFETY: the host function was not queued, so the box is still ours.
                    Err(e) => (e, *unsafe { Box::from_raw(payload) }),
                }
            }
        };
        let (driver, stream) = (self.driver().clone(), stream.clone());
        reaper::drop_when_drained(keep, move || driver.drained(&stream));
        Err(error)
    }

    /// Orders `stream` after the work queued so far on the home streams among `keep`.
    pub(crate) fn acquire(&self, stream: &R::Stream, keep: &[KeepAlive]) -> Result<()> {
        homes::<R>(keep, stream).into_iter().try_for_each(|home| self.driver().join(stream, home))
    }

    /// Orders the home streams among `keep` after the work queued so far on `stream`.
    pub(crate) fn release(&self, stream: &R::Stream, keep: &[KeepAlive]) -> Result<()> {
        homes::<R>(keep, stream).into_iter().try_for_each(|home| self.driver().join(home, stream))
    }
}

/// The distinct home streams among `keep` other than `stream`.
fn homes<'a, R: Driver>(keep: &'a [KeepAlive], stream: &R::Stream) -> Vec<&'a R::Stream> {
    let mut out: Vec<&R::Stream> = Vec::new();
    for home in keep.iter().filter_map(|k| k.downcast_ref::<Home<R::Stream>>()) {
        if !R::same(&home.0, stream) && !out.iter().any(|h| R::same(h, &home.0)) {
            out.push(&home.0);
        }
    }
    out
}
