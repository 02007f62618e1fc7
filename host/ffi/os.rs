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

/// The address of a page of this process that no access is allowed to (`PROT_NONE`), made on
/// first use and never unmapped; `None` if the kernel refused it. An empty receive posted on it
/// cannot have a longer message written into memory of ours: MPI's write past the buffer (a
/// truncation: `transport::matcher`) faults instead, or the library reports the truncation.
pub(crate) fn trap_page() -> Option<*mut std::ffi::c_void> {
    static TRAP: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let addr = *TRAP.get_or_init(|| {
        // SAFETY: an anonymous private mapping of one page with no access: it aliases nothing,
        // and nothing of ours ever reads or writes it.
        let p = unsafe {
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        (p != libc::MAP_FAILED).then_some(p as usize)
    });
    addr.map(|a| a as *mut std::ffi::c_void)
}
