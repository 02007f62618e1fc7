//! The index abstraction kernel bodies are written against.
//!
//! A kernel body sees only two numbers: its own global index and the global number of threads.
//! It covers its share of the work with a grid-stride loop (`i = index; i < n; i += size`), so the
//! same body is correct for any launch shape: one GPU thread per element, a few blocks that each
//! loop, or a single host thread that walks every index.
//!
//! * On NVPTX and AMDGPU, `DeviceGrid` reads the launch geometry from the hardware (x dimension
//!   only: the host launches one-dimensional grids).
//! * On the host, [`HostGrid`] runs a body once per emulated thread, one after another; the host
//!   device and the tests use it, and emulating several threads checks that the bodies partition
//!   the work correctly.

/// Where a running kernel thread is in its launch: its global index and the global thread count.
///
/// Implementations must return `index() < size()` and the same values for every call within one
/// body invocation.
pub trait Grid: Copy {
    /// Global index of this thread, `0..size()`.
    fn index(self) -> usize;
    /// Number of threads in the launch.
    fn size(self) -> usize;
}

/// One emulated thread of a [`HostGrid`] launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostThread {
    index: usize,
    size: usize,
}

impl HostThread {
    /// Thread `index` of `size` (`index < size`): one thread of a part of a launch, emulated
    /// or real (a side of the mover's block).
    pub const fn part(index: usize, size: usize) -> HostThread {
        HostThread { index, size }
    }
}

impl Grid for HostThread {
    #[inline(always)]
    fn index(self) -> usize {
        self.index
    }

    #[inline(always)]
    fn size(self) -> usize {
        self.size
    }
}

/// A launch of `threads` emulated threads on the calling host thread.
///
/// Threads run one after another in index order. Kernel bodies never depend on the order in which
/// threads run (each element is written by exactly one thread), so the result equals a parallel
/// GPU launch of the same size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostGrid {
    threads: usize,
}

impl HostGrid {
    /// One thread that walks every index: the cheapest way to run a body on the CPU.
    pub const SINGLE: HostGrid = HostGrid { threads: 1 };

    /// A launch of `threads` emulated threads (at least one).
    pub const fn new(threads: usize) -> HostGrid {
        HostGrid { threads: if threads == 0 { 1 } else { threads } }
    }

    /// Number of emulated threads.
    pub const fn threads(self) -> usize {
        self.threads
    }

    /// Calls `body` once per thread, with that thread's [`HostThread`].
    pub fn run(self, mut body: impl FnMut(HostThread)) {
        for index in 0..self.threads {
            body(HostThread { index, size: self.threads });
        }
    }
}

/// The calling GPU thread's place in a one-dimensional launch.
#[cfg(any(target_arch = "nvptx64", target_arch = "amdgpu"))]
#[derive(Clone, Copy, Debug)]
pub struct DeviceGrid;

#[cfg(any(target_arch = "nvptx64", target_arch = "amdgpu"))]
impl Grid for DeviceGrid {
    #[inline(always)]
    fn index(self) -> usize {
        let (thread, dim, block, _) = device_block();
        block * dim + thread
    }

    #[inline(always)]
    fn size(self) -> usize {
        let (_, dim, _, blocks) = device_block();
        blocks * dim
    }
}

#[cfg(target_arch = "amdgpu")]
impl DeviceGrid {
    /// The HSA kernel dispatch packet of the running kernel.
    #[inline(always)]
    fn packet() -> *const u8 {
        core::intrinsics::gpu::amdgpu_dispatch_ptr().cast::<u8>()
    }
}

/// The calling GPU thread's block: `(thread in the block, threads per block, block, blocks)` of a
/// one-dimensional launch (the mover's blocks each run their own share of a schedule).
#[cfg(target_arch = "nvptx64")]
#[inline(always)]
pub fn device_block() -> (usize, usize, usize, usize) {
    use core::arch::nvptx::{_block_dim_x, _block_idx_x, _grid_dim_x, _thread_idx_x};
    // SAFETY: reading the special registers %tid.x, %ntid.x, %ctaid.x and %nctaid.x has no
    // preconditions inside a kernel, the only place this (and DeviceGrid) is used.
    let (thread, dim, block, blocks) = unsafe { (_thread_idx_x(), _block_dim_x(), _block_idx_x(), _grid_dim_x()) };
    (thread as usize, dim as usize, block as usize, blocks as usize)
}

/// The calling GPU thread's block: `(thread in the block, threads per block, block, blocks)` of a
/// one-dimensional launch (the mover's blocks each run their own share of a schedule).
#[cfg(target_arch = "amdgpu")]
#[inline(always)]
pub fn device_block() -> (usize, usize, usize, usize) {
    use core::arch::amdgpu::{workgroup_id_x, workitem_id_x};
    // SAFETY: every gpu-kernel is launched through an hsa_kernel_dispatch_packet_t, valid for
    // the whole kernel; `workgroup_size_x` is its u16 at byte offset 4 and `grid_size_x` (in
    // work-items) its u32 at offset 12 (HSA system architecture spec 1.2, section 2.9.6), so
    // both reads are in bounds and aligned.
    let (dim, total) = unsafe {
        let packet = DeviceGrid::packet();
        (packet.add(4).cast::<u16>().read() as usize, packet.add(12).cast::<u32>().read() as usize)
    };
    let dim = dim.max(1);
    (workitem_id_x() as usize, dim, workgroup_id_x() as usize, total / dim)
}

/// The thread indices `grid` covers in `0..n`, in a grid-stride loop: `index, index + size, ...`.
#[inline(always)]
pub(crate) fn stride<G: Grid>(grid: G, n: usize) -> Stride {
    stride_from(grid.index(), n, grid.size())
}

/// The indices `start, start + step, ...` below `end`: [`stride`] for a part of a launch (the
/// lanes of a group of threads).
#[inline(always)]
pub(crate) fn stride_from(start: usize, end: usize, step: usize) -> Stride {
    Stride { next: start, end, step }
}

/// Iterator behind [`stride`]. Written as a plain `while`-style iterator (no `step_by`), which
/// compiles to a tight loop on every target and has no panicking paths.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Stride {
    next: usize,
    end: usize,
    step: usize,
}

impl Iterator for Stride {
    type Item = usize;

    #[inline(always)]
    fn next(&mut self) -> Option<usize> {
        if self.next < self.end {
            let i = self.next;
            // Saturating: a launch can never have `end + step` overflow in practice, but a wrap
            // would restart the loop at a small index.
            self.next = i.saturating_add(self.step);
            Some(i)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_grid_partitions_every_index_exactly_once() {
        for threads in [1, 2, 7, 64] {
            let mut seen = [0u8; 100];
            HostGrid::new(threads).run(|t| {
                assert_eq!(t.size(), threads);
                for i in stride(t, seen.len()) {
                    seen[i] += 1;
                }
            });
            assert!(seen.iter().all(|&c| c == 1), "threads = {threads}");
        }
    }

    #[test]
    fn zero_threads_means_one() {
        assert_eq!(HostGrid::new(0).threads(), 1);
    }
}
