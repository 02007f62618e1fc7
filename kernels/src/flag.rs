//! Stream-wait and signal bodies: how a GPU stream waits for, and announces, progress made by the
//! host through 32-bit flags in host-mapped (pinned, device-visible) memory.
//!
//! Flags hold sequence numbers compared modulo 2³² like CUDA's `CU_STREAM_WAIT_VALUE_GEQ`:
//! `flag` has reached `value` when `flag.wrapping_sub(value) as i32 >= 0`, so a counter may wrap.
//!
//! # Memory ordering
//! The waiting thread polls with acquire loads and the signal is a release store, both at system
//! scope (`ld.acquire.sys` / `st.release.sys` on NVPTX, LLVM's default system scope on AMDGPU):
//! what the host wrote before setting the flag is visible to work queued after the wait, and what
//! the stream wrote before a signal is visible to a host thread that acquires the flag.
//!
//! # Deadlock
//! A stream-wait kernel occupies one thread of one block until the flag is set, and it must not be
//! the reason the flag is never set. It is safe when the flag is set by the host (the proxy
//! thread) independently of the waiting stream. It deadlocks if
//! * the flag is set only by work queued *after* the wait, or by a host thread that first waits
//!   for such work (e.g. synchronizes the stream): the queue-order rule,
//!   `docs/architecture.md#the-queue-order-rule`;
//! * the flag is set by a kernel on another stream that cannot start because waiting kernels (or
//!   other resident work) occupy every SM slot it needs: the GPU gives no guarantee that a
//!   launched kernel ever runs concurrently with another, so at least one slot must stay free
//!   (e.g. keep the number of simultaneously waiting kernels below the number of SMs, and do not
//!   run under an MPS or `CUDA_DEVICE_MAX_CONNECTIONS` limit of one);
//! * the flag is not in memory the host can write while the kernel runs (pageable memory, or
//!   device memory the host cannot access).
//!
//! Prefer the driver's stream memory operations (`cuStreamWaitValue32`, `cuStreamWriteValue32`)
//! where the device supports them: they wait in the front end and occupy no SM. These kernels are
//! the fallback.

use core::sync::atomic::{AtomicU32, Ordering};

use crate::grid::Grid;

/// Whether a flag holding `current` has reached `value`, modulo 2³².
#[inline(always)]
pub const fn reached(current: u32, value: u32) -> bool {
    // The difference, read as a signed number, is not negative.
    current.wrapping_sub(value) < 1 << 31
}

/// Exponential backoff between polls: short first (the flag is often about to be set), capped so
/// the release latency stays around a microsecond.
#[derive(Clone, Copy, Debug)]
pub struct Backoff {
    level: u32,
}

impl Backoff {
    /// Longest pause level: about 1 µs on NVPTX (`nanosleep` of 32 ns doubled five times), about
    /// 1024 cycles on AMDGPU (`s_sleep 16`).
    pub const MAX_LEVEL: u32 = 5;

    /// A fresh backoff at its shortest pause.
    pub const fn new() -> Backoff {
        Backoff { level: 0 }
    }

    /// Pauses the calling thread briefly and lengthens the next pause.
    #[inline(always)]
    pub fn pause(&mut self) {
        #[cfg(target_arch = "nvptx64")]
        {
            let ns: u32 = 32 << self.level;
            // SAFETY: `nanosleep` (sm_70+, which the kernels are built for) only suspends the
            // calling thread for at most about `ns` nanoseconds; it touches no memory or flags.
            unsafe { core::arch::asm!("nanosleep.u32 {0};", in(reg32) ns, options(nomem, nostack, preserves_flags)) };
        }
        #[cfg(target_arch = "amdgpu")]
        {
            // `s_sleep` takes an immediate: one arm per level (64 * N cycles each).
            use core::arch::amdgpu::s_sleep;
            match self.level {
                0 => s_sleep::<1>(),
                1 => s_sleep::<2>(),
                2 => s_sleep::<4>(),
                3 => s_sleep::<8>(),
                _ => s_sleep::<16>(),
            }
        }
        #[cfg(not(any(target_arch = "nvptx64", target_arch = "amdgpu")))]
        core::hint::spin_loop();
        if self.level < Self::MAX_LEVEL {
            self.level += 1;
        }
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new()
    }
}

/// Blocks thread 0 of the launch until `*flag` reaches `value` (modulo 2³², see [`reached`]);
/// every other thread returns at once. The kernel, and with it the stream, completes only then.
///
/// See the [module documentation](self) for when this can deadlock.
///
/// # Safety
/// `flag` is valid, 4-byte aligned and stays allocated until the launch completes; everything
/// that writes it does so atomically (any aligned 32-bit store from the host is atomic).
#[inline(always)]
pub unsafe fn stream_wait<G: Grid>(grid: G, flag: *const u32, value: u32) {
    if grid.index() != 0 {
        return;
    }
    // SAFETY: the caller guarantees a valid, aligned flag that is only accessed atomically while
    // the kernel runs; the `*mut` is never written through here.
    let flag = unsafe { AtomicU32::from_ptr(flag.cast_mut()) };
    let mut backoff = Backoff::new();
    while !reached(flag.load(Ordering::Acquire), value) {
        backoff.pause();
    }
}

/// Thread 0 of the launch stores `value` to `*flag` with a system-scope release store; every other
/// thread does nothing. Work the stream completed before this kernel is visible to whoever
/// acquires the flag.
///
/// # Safety
/// `flag` is valid for writes, 4-byte aligned, and every concurrent access to it is atomic.
#[inline(always)]
pub unsafe fn signal<G: Grid>(grid: G, flag: *mut u32, value: u32) {
    if grid.index() != 0 {
        return;
    }
    // SAFETY: the caller guarantees a valid, aligned flag accessed only atomically.
    unsafe { AtomicU32::from_ptr(flag) }.store(value, Ordering::Release);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reached_is_cyclic() {
        assert!(reached(5, 5));
        assert!(reached(6, 5));
        assert!(!reached(4, 5));
        assert!(reached(2, u32::MAX - 1));
        assert!(!reached(u32::MAX - 1, 2));
    }

    #[test]
    fn backoff_levels_saturate() {
        let mut b = Backoff::new();
        for _ in 0..10 {
            b.pause();
        }
        assert_eq!(b.level, Backoff::MAX_LEVEL);
    }
}
