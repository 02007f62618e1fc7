//! Ending the whole job: the panic hook, and the one way every fatal path (a panic, a
//! timeout under [`OnTimeout::Abort`](super::OnTimeout::Abort), a panic inside MPI) ends it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::{RecvTimeoutError, Sender};
use std::time::Duration;

use super::OnPanic;
use crate::ffi;

/// This process's rank in `MPI_COMM_WORLD`, for messages (-1 before `init`).
static WORLD_RANK: AtomicI64 = AtomicI64::new(-1);

/// What panics do in this process, decided once (by `init_with`, or by the first communicator
/// when the program initialized MPI itself).
static ON_PANIC: OnceLock<OnPanic> = OnceLock::new();

/// How long `MPI_Abort` gets to end the job before this process exits on its own (a process
/// that exits without `MPI_Finalize` makes `mpirun` end the job too).
const ABORT_GRACE: Duration = Duration::from_secs(5);

/// How long a rank waits between printing why it ends the job and calling `MPI_Abort`. MPICH's
/// launcher (Hydra) tears the job down as soon as the abort reaches it, and drops what it has not
/// yet read of the ranks' output: without the pause, the line that says why was lost in about one
/// abort in five (the panic and window-drop fault trials under MPICH).
const REPORT_FORWARDING: Duration = Duration::from_millis(100);

/// The exit code of a job ended by Duralumin.
pub(crate) const EXIT_CODE: i32 = 134;

/// `rank R` for messages: the world rank once MPI is initialized.
pub(crate) fn rank_label() -> String {
    match WORLD_RANK.load(Ordering::Relaxed) {
        r if r >= 0 => format!("rank {r}"),
        _ => "a rank".into(),
    }
}

/// Records the world rank and settles what panics do: `requested`, else
/// `DURALUMIN_ON_PANIC`, else [`OnPanic::Abort`]. With `Abort`, installs the hook (once, chained
/// to the one already set).
pub(crate) fn settle(requested: Option<OnPanic>) -> crate::Result<OnPanic> {
    if let Ok((rank, _)) = ffi::comm::rank_size(ffi::world()) {
        WORLD_RANK.store(i64::try_from(rank).unwrap_or(-1), Ordering::Relaxed);
    }
    let wanted = match requested {
        Some(p) => p,
        None => super::env_on_panic()?.unwrap_or_default(),
    };
    let mut installed = false;
    let settled = *ON_PANIC.get_or_init(|| {
        installed = true;
        wanted
    });
    if installed && settled == OnPanic::Abort {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            if ffi::is_initialized() && !ffi::is_finalized() {
                abort_job("panic, aborting the job");
            }
        }));
    }
    Ok(settled)
}

/// Prints `rank R: {why}`, gives the launcher [`REPORT_FORWARDING`] to pass it on, and ends every
/// process of the job (`MPI_Abort`); if MPI cannot (it is
/// not running, or it does not end this process within [`ABORT_GRACE`]), exits this process
/// without finalizing, which ends the job under `mpirun` as well. Never returns.
pub(crate) fn abort_job(why: &str) -> ! {
    say(why);
    std::thread::sleep(REPORT_FORWARDING);
    let _ = std::thread::Builder::new().name("duralumin-abort".into()).spawn(|| {
        std::thread::sleep(ABORT_GRACE);
        // SAFETY: `_exit` ends the process at once; nothing of ours runs after it.
        unsafe { libc::_exit(EXIT_CODE) }
    });
    ffi::abort(EXIT_CODE);
    // MPI is not running, or MPI_Abort returned: the grace thread (or this) ends the process.
    std::thread::sleep(ABORT_GRACE);
    // SAFETY: as above.
    unsafe { libc::_exit(EXIT_CODE) }
}

/// Prints `rank R: {why}` on stderr in one write, so that `mpirun`, which forwards each rank's
/// output in the pieces it reads, cannot put its own abort banner inside the line.
fn say(why: &str) {
    use std::io::Write;
    let line = format!("{}: {why}\n", rank_label());
    let _ = std::io::stderr().write_all(line.as_bytes());
}

/// Ends the process (see [`exit_now`]) unless the returned sender is dropped within `grace`:
/// bounds `MPI_Finalize` after a process failure (see [`crate::Universe`]).
pub(crate) fn exit_unless_done(grace: Duration) -> Sender<()> {
    let (done, wait) = std::sync::mpsc::channel::<()>();
    let _ = std::thread::Builder::new().name("duralumin-finalize".into()).spawn(move || {
        // The sender never sends: dropping it (`Disconnected`) is the signal.
        if wait.recv_timeout(grace) == Err(RecvTimeoutError::Timeout) {
            exit_now(&format!(
                "MPI_Finalize did not return within {grace:?} after a process failure (a known ULFM limitation), \
                 ending this process"
            ));
        }
    });
    done
}

/// Prints `rank R: {why}` and ends this process at once with status 0 (its work is done; only
/// MPI's own teardown is stuck), flushing what the program printed first.
pub(crate) fn exit_now(why: &str) -> ! {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    say(why);
    // SAFETY: `_exit` ends the process at once without running exit handlers (which could
    // call into the stuck MPI library); nothing of ours runs after it.
    unsafe { libc::_exit(0) }
}

/// Runs `f` where a panic cannot be allowed to unwind (inside an MPI callback, on the proxy
/// thread halfway through a collective): a panic ends the job with `what` in the message,
/// whatever [`OnPanic`] says, since the other ranks would otherwise wait for this one.
pub(crate) fn or_abort<R>(what: impl FnOnce() -> String, f: impl FnOnce() -> R) -> R {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => abort_job(&format!("panic {}, aborting the job", what())),
    }
}
