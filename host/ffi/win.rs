//! MPI-3 shared-memory windows: `MPI_Win_allocate_shared` and the passive-target calls a
//! window shared by the ranks of one node needs (`MPI_Win_shared_query`, `MPI_Win_lock_all`,
//! `MPI_Win_sync`, `MPI_Win_unlock_all`, `MPI_Win_free`).
//!
//! Thin wrappers, one per call, turning status codes into [`Result`]s. What the memory holds and
//! who may touch it when is the caller's business (`backends/mpi/shm.rs`).

use std::ffi::{c_int, c_void};

use super::{RawComm, check, is_finalized, sys};
use crate::api::error::{Error, Result};

/// An MPI window handle that may be used from any thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawWin(pub(crate) sys::MPI_Win);
// SAFETY: as for `RawComm`: the handle is an opaque reference into the MPI library, which
// Duralumin runs at MPI_THREAD_MULTIPLE, and the handle itself is never mutated after creation.
unsafe impl Send for RawWin {}
// SAFETY: see the `Send` impl.
unsafe impl Sync for RawWin {}

/// `MPI_Win_allocate_shared`: a window over `bytes` bytes of memory owned by this rank and
/// shared with every rank of `comm` (which must be a communicator whose ranks share memory,
/// e.g. one made by [`super::comm::split_shared`]). Collective over `comm`: it returns once
/// every rank of `comm` has called it. Returns the window, set to return errors rather than
/// abort, and the base of this rank's part (`bytes` bytes, suitably aligned for any type of up
/// to page alignment in Open MPI; callers check what they need).
pub(crate) fn allocate_shared(comm: RawComm, bytes: usize) -> Result<(RawWin, *mut u8)> {
    let size = sys::MPI_Aint::try_from(bytes)
        .map_err(|_| Error::CountOverflow { what: "window size", value: bytes as u128 })?;
    let mut base: *mut u8 = std::ptr::null_mut();
    let mut win = std::mem::MaybeUninit::<sys::MPI_Win>::uninit();
    // SAFETY: `comm` is live; MPI stores the base address into `base` (passed as a pointer to a
    // pointer, as the standard's `void *baseptr` argument requires) and the handle into `win`,
    // which we read only on success. The info handle is a shim constant.
    let win = unsafe {
        check(
            sys::MPI_Win_allocate_shared(
                size,
                1,
                sys::RSMPI_INFO_NULL,
                comm.0,
                (&raw mut base).cast::<c_void>(),
                win.as_mut_ptr(),
            ),
            "MPI_Win_allocate_shared",
        )?;
        RawWin(win.assume_init())
    };
    // SAFETY: `win` was just created and is live; the handler is a shim constant.
    let set = check(unsafe { sys::MPI_Win_set_errhandler(win.0, sys::RSMPI_ERRORS_RETURN) }, "MPI_Win_set_errhandler");
    if let Err(e) = set {
        // SAFETY: the window was created above and is used by nobody yet. (Every rank fails
        // the same way here, so the collective free is reached everywhere.)
        unsafe { free(win) };
        return Err(e);
    }
    Ok((win, base))
}

/// `MPI_Win_shared_query`: where rank `rank`'s part of `win` lies in this process's address
/// space, and its size in bytes.
pub(crate) fn shared_query(win: RawWin, rank: c_int) -> Result<(*mut u8, usize)> {
    let mut size: sys::MPI_Aint = 0;
    let mut unit: c_int = 0;
    let mut base: *mut u8 = std::ptr::null_mut();
    // SAFETY: `win` is a live window (RawWin values are only made from live ones and freed when
    // their owner drops); MPI writes one MPI_Aint, one int and one pointer, all ours.
    let code =
        unsafe { sys::MPI_Win_shared_query(win.0, rank, &mut size, &mut unit, (&raw mut base).cast::<c_void>()) };
    check(code, "MPI_Win_shared_query")?;
    Ok((base, usize::try_from(size).unwrap_or(0)))
}

/// `MPI_Win_lock_all(MPI_MODE_NOCHECK)`: opens a passive-target epoch on every rank's part of
/// `win`, which [`sync`] needs. `NOCHECK`: nobody ever takes an exclusive lock on the window.
pub(crate) fn lock_all(win: RawWin) -> Result<()> {
    #[allow(clippy::cast_possible_wrap, reason = "MPI_MODE_NOCHECK is a small flag")]
    const NOCHECK: c_int = sys::MPI_MODE_NOCHECK as c_int;
    // SAFETY: `win` is live; the call touches no memory of ours.
    check(unsafe { sys::MPI_Win_lock_all(NOCHECK, win.0) }, "MPI_Win_lock_all")
}

/// `MPI_Win_sync`: a memory barrier between this process's accesses to the window memory and
/// the other ranks' (inside a [`lock_all`] epoch). Stores made before it are visible to a rank
/// that synchronises with this one afterwards (a message) and calls it in turn.
pub(crate) fn sync(win: RawWin) -> Result<()> {
    // SAFETY: `win` is live; the call touches no memory of ours.
    check(unsafe { sys::MPI_Win_sync(win.0) }, "MPI_Win_sync")
}

/// `MPI_Win_unlock_all`: closes the epoch [`lock_all`] opened.
pub(crate) fn unlock_all(win: RawWin) -> Result<()> {
    // SAFETY: `win` is live; the call touches no memory of ours.
    check(unsafe { sys::MPI_Win_unlock_all(win.0) }, "MPI_Win_unlock_all")
}

/// `MPI_Win_free`, skipped once MPI has been finalized (nothing left to free). Collective over
/// the window's communicator: it returns once every rank has called it (Open MPI synchronises).
///
/// # Safety
/// `win` must be a window this crate created, whose memory nobody accesses afterwards (every
/// pointer into it is dead), with no epoch open ([`unlock_all`] was called, or the window was
/// never locked), and every rank of its communicator must free it too.
pub(crate) unsafe fn free(win: RawWin) {
    if is_finalized() {
        return;
    }
    let mut handle = win.0;
    // SAFETY: the caller guarantees exclusive ownership and the collective call; errors at
    // teardown have no one to be reported to, so they are deliberately ignored.
    unsafe { sys::MPI_Win_free(&mut handle) };
}
