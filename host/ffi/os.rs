//! The operating system calls the progress machinery makes.

/// Asks the kernel to end this thread's timed sleeps within `ns` nanoseconds of their
/// deadline. Linux lets a sleep run over by the thread's *timer slack*, 50 µs by default, so a
/// thread that polls with short sleeps (1, 2, 4 µs…) would in fact sleep at least 50 µs each
/// time. Elsewhere, and if the call fails, nothing changes.
pub(crate) fn set_timer_slack(ns: u64) {
    #[cfg(target_os = "linux")]
    // SAFETY: `PR_SET_TIMERSLACK` takes one integer argument and only changes the calling
    // thread's timer slack; it touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, ns as libc::c_ulong);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = ns;
}
