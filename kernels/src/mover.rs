//! The mover: a staged operation's whole device side run by one item of work, so that queueing
//! an operation costs a constant number of queue items whatever its size (see
//! `docs/host_transfer.md`, "The mover").
//!
//! A staged operation streams through its communicator's staging ring chunk by chunk. For
//! chunk `k`, the device waits until the ring's *free* counter says the chunk's cells may be
//! refilled, copies the chunk's input rows into them and raises *staged*; later it waits for
//! the proxy thread's *output* counter, copies the result rows back and raises *drained*. The
//! input side runs `ahead` chunks in front of the output side, as far as the ring holds. The
//! copy-engine path queues those steps as separate items on two copy streams; [`run`] runs
//! the same steps, in the same order, in one body.
//!
//! [`Place`] is the ring arithmetic both paths (and the proxy thread) use; [`Schedule`] is
//! everything one operation's mover needs, plain data a launch can carry.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::flag::reached;
use crate::grid::Grid;
use crate::pack::copy_2d_unrolled;

/// Where an operation's chunks lie in its communicator's staging ring: chunk `k` is chunk
/// `first + k` of the communicator (chunks are numbered across operations, in queue order), at
/// ring position `pos + k span` (positions count across operations too; the cell is the
/// position modulo `cells`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Place {
    /// The communicator's number of the operation's first chunk.
    pub first: u64,
    /// The ring position of the operation's first chunk.
    pub pos: u64,
    /// Where the earlier chunks ended: positions from here to `pos` were skipped to align the
    /// first chunk, and are never filled.
    pub skipped: u64,
    /// Cells per chunk (a power of two).
    pub span: u64,
    /// Cells in the ring (a power of two).
    pub cells: u64,
    /// Bytes per cell.
    pub cell_bytes: u64,
}

/// The low 32 bits of a chunk number or position: the counters compare modulo 2³², and fewer
/// than 2³¹ chunks or cells are ever in flight.
#[inline(always)]
#[allow(clippy::cast_possible_truncation, reason = "the counters are the low 32 bits by design")]
pub const fn low(v: u64) -> u32 {
    v as u32
}

impl Place {
    /// The counter value that says chunk `k` of the operation is through a step.
    #[inline(always)]
    pub fn flag(&self, k: usize) -> u32 {
        low(self.first.wrapping_add(k as u64 + 1))
    }

    /// The position after chunk `k`'s cells.
    #[inline(always)]
    pub fn end(&self, k: usize) -> u64 {
        self.pos + (k as u64 + 1) * self.span
    }

    /// The *free* value chunk `k`'s cells need before they are filled: its end, a ring behind.
    #[inline(always)]
    pub fn needs_free(&self, k: usize) -> Option<u32> {
        let need = self.end(k).checked_sub(self.cells)?;
        // Skipped positions hold nothing: the earlier chunks' end is enough (the skipped ones
        // count as free only once this operation's first chunk is handed back, which may come
        // later on the device's queue than this chunk).
        Some(low(if need > self.skipped && need <= self.pos { self.skipped } else { need }))
    }

    /// Byte offset of chunk `k`'s first cell from the ring's start.
    #[inline(always)]
    pub fn offset(&self, k: usize) -> u64 {
        ((self.pos + k as u64 * self.span) % self.cells.max(1)) * self.cell_bytes
    }

    /// How many chunks the input side may run ahead of the output side: as many as the ring
    /// holds (chunk `k + ahead` refills chunk `k`'s cells), at least one and at most `chunks`.
    #[inline(always)]
    pub fn ahead(&self, chunks: usize) -> usize {
        let fits = self.cells / self.span.max(1);
        usize::try_from(fits).unwrap_or(usize::MAX).clamp(1, chunks.max(1))
    }
}

/// Device rows: `parts` rows of `len` elements from device address `ptr`, `pitch` elements
/// apart. `parts == 0`: no rows (the operation has no input, or no output, on the device).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Rows {
    /// Device address of the first row.
    pub ptr: u64,
    /// Number of rows.
    pub parts: usize,
    /// Elements per row.
    pub len: usize,
    /// Elements from one row's start to the next one's.
    pub pitch: usize,
}

impl Rows {
    /// Elements of each row that chunk `k` (of `chunk_elems` elements per row) covers.
    #[inline(always)]
    pub fn chunk_len(&self, k: usize, chunk_elems: usize) -> usize {
        chunk_elems.min(self.len.saturating_sub(k.saturating_mul(chunk_elems)))
    }
}

/// One staged operation's device side, as [`run`] runs it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Schedule {
    /// Where the chunks lie in the ring.
    pub place: Place,
    /// Device address of the ring's first cell.
    pub ring: u64,
    /// Element size in bytes.
    pub sz: usize,
    /// Elements per row and chunk.
    pub chunk_elems: usize,
    /// Elements per row (the operation's count).
    pub count: usize,
    /// Number of chunks.
    pub chunks: usize,
    /// Rows of a chunk's send area (its receive area follows them).
    pub send_parts: usize,
    /// The input rows, copied into each chunk's cells.
    pub input: Rows,
    /// Where the input lands: 0 the send area, `r + 1` the receive area from row `r` on (an
    /// in-place operation).
    pub input_at: usize,
    /// The output rows, copied back from each chunk's receive area.
    pub output: Rows,
    /// Non-zero: the operation only sends from staging, and `done` is raised once every chunk
    /// is staged (a bcast root, a send).
    pub early: u32,
    /// The *drained* value the communicator's earlier operations reach (their last chunk that
    /// is copied back): the output side waits for it before it raises *drained* itself.
    pub after: u32,
    /// Device addresses of the ring's counters and of the operation's `done` flag.
    pub staged: u64,
    /// The proxy thread's counter: chunk `c`'s MPI part is over.
    pub output_flag: u64,
    /// Raised as chunks are copied back.
    pub drained: u64,
    /// The positions below it may be refilled.
    pub free: u64,
    /// Raised to 1 at the end.
    pub done: u64,
    /// Device address of [`MAX_BLOCKS`] 8-byte words, one per block: the communicator's number
    /// of the last chunk (plus one) a block's input side copied its share of (see [`Share`]).
    /// Only a mover of several blocks touches them; they only grow.
    pub arrived_in: u64,
    /// As `arrived_in`, for the output side.
    pub arrived_out: u64,
}

impl Schedule {
    /// The schedule's size in 8-byte words: a launch passes it as that many `u64` arguments
    /// (a struct passed by value is not reliably laid out the same by every GPU kernel ABI).
    pub const WORDS: usize = size_of::<Schedule>() / 8;

    /// The schedule as [`Schedule::WORDS`] words.
    pub fn to_words(&self) -> [u64; Schedule::WORDS] {
        bytemuck::cast(*self)
    }

    /// The schedule from its words.
    pub fn from_words(words: [u64; Schedule::WORDS]) -> Schedule {
        bytemuck::cast(words)
    }

    /// Elements of each row chunk `k` covers.
    #[inline(always)]
    pub fn len_of(&self, k: usize) -> usize {
        self.chunk_elems.min(self.count - k.saturating_mul(self.chunk_elems).min(self.count))
    }

    /// How many chunks the input side runs ahead of the output side.
    #[inline(always)]
    pub fn ahead(&self) -> usize {
        self.place.ahead(self.chunks)
    }
}

/// What a mover needs from where it runs.
pub trait Hooks {
    /// Returns once `ready()` holds, polling it; `value` is the counter value it waits for (for
    /// a simulator's report of a wait that does not end).
    fn wait_until<F: Fn() -> bool>(&self, ready: F, value: u64);
    /// Returns once `flag` has reached `value` (modulo 2³²).
    #[inline(always)]
    fn wait(&self, flag: &AtomicU32, value: u32) {
        self.wait_until(|| reached(flag.load(Ordering::Acquire), value), u64::from(value));
    }
    /// A counter was just written (host waiters may want waking).
    fn wrote(&self) {}
    /// Runs `copy`, which moves `bytes` to host memory if `to_host`, else to the device (a
    /// simulator's timing model times it).
    #[inline(always)]
    fn copy<F: FnOnce()>(&self, bytes: usize, to_host: bool, copy: F) {
        let _ = (bytes, to_host);
        copy();
    }
    /// Every thread of the mover reaches this point before any goes on (one thread: nothing).
    fn barrier(&self) {}
}

/// The mover's hooks inside a GPU kernel, in each block of its launch: thread 0 of a side polls a
/// counter with backoff ([`crate::flag::Backoff`]); the barrier is a system-scope fence by every
/// thread of the side, then the side's barrier, so what every thread copied is visible
/// system-wide before thread 0's release store of a counter, and what thread 0's acquire load
/// saw is visible to every thread after a wait. On NVPTX each side of the block has a named
/// barrier of its own (`barrier.sync id, threads`), so the two sides run at once; AMDGPU has one
/// barrier per workgroup, and its mover runs both sides in turn.
#[cfg(any(target_arch = "nvptx64", target_arch = "amdgpu"))]
#[derive(Clone, Copy, Debug)]
pub struct DeviceHooks {
    /// The side's named barrier (NVPTX) and its thread count.
    #[cfg_attr(target_arch = "amdgpu", allow(dead_code))]
    barrier: u32,
    #[cfg_attr(target_arch = "amdgpu", allow(dead_code))]
    threads: u32,
}

#[cfg(any(target_arch = "nvptx64", target_arch = "amdgpu"))]
impl Hooks for DeviceHooks {
    #[inline(always)]
    fn wait_until<F: Fn() -> bool>(&self, ready: F, _value: u64) {
        let mut backoff = crate::flag::Backoff::new();
        while !ready() {
            backoff.pause();
        }
    }

    #[inline(always)]
    fn barrier(&self) {
        core::sync::atomic::fence(Ordering::SeqCst);
        #[cfg(target_arch = "nvptx64")]
        // SAFETY: `barrier.sync id, threads` with a barrier id below 16 and a thread count that
        // is a multiple of the warp size, reached by every thread of the side (the mover's
        // control flow is the same for all of them) and by no other. Not `bar.sync`, which is
        // `.aligned`: the compiler does not treat inline assembly as convergent and may
        // duplicate it into both arms of the `index() == 0` branches around it, and the
        // non-aligned form allows a warp's threads to reach it at different instructions.
        unsafe {
            core::arch::asm!("barrier.sync {0}, {1};", in(reg32) self.barrier, in(reg32) self.threads, options(nostack))
        };
        #[cfg(target_arch = "amdgpu")]
        core::arch::amdgpu::s_barrier();
    }
}

/// The mover kernel's body: on NVPTX the first half of the block runs the input side and the
/// second half the output side, each with its own barrier; on AMDGPU the whole block runs both
/// in turn.
///
/// # Safety
/// As [`run`]; launched as blocks of [`DEVICE_THREADS`] threads, every block resident at once
/// when there are several (a cooperative launch: see [`Share`]); blocks past [`MAX_BLOCKS`]
/// do nothing.
#[cfg(any(target_arch = "nvptx64", target_arch = "amdgpu"))]
#[inline(always)]
pub unsafe fn device_entry(schedule: &Schedule) {
    use crate::grid::HostThread;
    let (me, _, block, blocks) = crate::grid::device_block();
    // A launch of more blocks than there are arrival words: those past them have nothing to do.
    if block >= MAX_BLOCKS {
        return;
    }
    let share = Share { block, blocks: blocks.min(MAX_BLOCKS) };
    #[cfg(target_arch = "nvptx64")]
    {
        let half = (DEVICE_THREADS / 2) as usize;
        let hooks = |barrier| DeviceHooks { barrier, threads: DEVICE_THREADS / 2 };
        // SAFETY: forwarded from the caller; the two halves are warps apart and each reaches
        // only its own barrier.
        unsafe {
            if me < half {
                run(HostThread::part(me, half), schedule, &hooks(1), Side::Input, share);
            } else {
                run(HostThread::part(me - half, half), schedule, &hooks(2), Side::Output, share);
            }
        }
    }
    #[cfg(target_arch = "amdgpu")]
    {
        let (threads, hooks) = (DEVICE_THREADS as usize, DeviceHooks { barrier: 0, threads: DEVICE_THREADS });
        // SAFETY: forwarded from the caller.
        unsafe { run(HostThread::part(me, threads), schedule, &hooks, Side::Both, share) };
    }
}

/// Device address `at` as a pointer.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "addresses are 64-bit wherever the mover runs (x86-64, NVPTX64, AMDGPU)"
)]
fn ptr(at: u64) -> *mut u8 {
    at as usize as *mut u8
}

/// The counter at device address `at`.
///
/// # Safety
/// `at` is a live, 4-byte aligned counter that everyone accesses atomically.
#[inline(always)]
unsafe fn counter<'a>(at: u64) -> &'a AtomicU32 {
    // SAFETY: guaranteed by the caller.
    unsafe { AtomicU32::from_ptr(ptr(at).cast::<u32>()) }
}

/// One block of a mover launch. Every block copies its share of every chunk (the same stretch
/// of each of the chunk's rows), so a chunk is in flight from every block at once, as a copy
/// engine would move it. A block then writes the chunk's number to its
/// word of the side's arrival words (`arrived_in`, `arrived_out`), and block 0, once every
/// block's word has reached the chunk, raises the ring's counter for it (and `done` after the
/// last chunk), so the counters read as if one block had run. Only block 0 waits for the
/// others, and only for chunks they were given, so the blocks need not move in step; but block
/// 0 does wait: every block of a launch must be resident at once (a cooperative launch), or it
/// could wait for one that never starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share {
    /// This block's number.
    pub block: usize,
    /// Blocks in the launch (at least one).
    pub blocks: usize,
}

impl Share {
    /// The whole schedule, as one block.
    pub const ALL: Share = Share { block: 0, blocks: 1 };
}

/// The most blocks a mover is launched as (the arrival words a schedule points to).
pub const MAX_BLOCKS: usize = 64;

/// One mover thread's view of a schedule.
struct Mover<'a, G, H> {
    grid: G,
    s: &'a Schedule,
    hooks: &'a H,
    share: Share,
}

impl<G: Grid, H: Hooks> Mover<'_, G, H> {
    /// Thread 0 waits for `flag` to reach `value`, then every thread goes on.
    ///
    /// # Safety
    /// As [`run`].
    #[inline(always)]
    unsafe fn wait(&self, flag: u64, value: u32) {
        if self.grid.index() == 0 {
            // SAFETY: a counter of the schedule (the caller's guarantee).
            let flag = unsafe { counter(flag) };
            if !reached(flag.load(Ordering::Acquire), value) {
                self.hooks.wait(flag, value);
            }
        }
        self.hooks.barrier();
    }

    /// The end of a side's step for chunk `k`: every thread's copies are done, and thread 0
    /// hands the chunk on. With several blocks, a block other than 0 writes the chunk's number
    /// to its word of `arrived`, and block 0 first waits for every other block's word to reach
    /// it. Block 0 then stores the chunk's value to `flag` with release, once `flag` has
    /// reached `before` (if given: the earlier operations' value), then `done` if `ends` and `k`
    /// is the last chunk.
    ///
    /// # Safety
    /// As [`run`].
    #[inline(always)]
    unsafe fn publish(&self, k: usize, flag: u64, arrived: u64, before: Option<u32>, ends: bool) {
        self.hooks.barrier();
        if self.grid.index() != 0 {
            return;
        }
        let (s, share) = (self.s, self.share);
        // SAFETY: counters of the schedule (the caller's guarantee); `arrived` holds
        // `MAX_BLOCKS` words with several blocks, which are at most that many.
        unsafe {
            if share.blocks > 1 {
                let chunk = s.place.first.wrapping_add(k as u64 + 1);
                let word = |b: usize| AtomicU64::from_ptr(ptr(arrived).cast::<u64>().add(b));
                if share.block != 0 {
                    if share.block < MAX_BLOCKS {
                        word(share.block).store(chunk, Ordering::Release);
                    }
                    return;
                }
                for b in 1..share.blocks.min(MAX_BLOCKS) {
                    let word = word(b);
                    self.hooks.wait_until(|| word.load(Ordering::Acquire) >= chunk, chunk);
                }
            }
            let flag = counter(flag);
            if let Some(before) = before
                && !reached(flag.load(Ordering::Acquire), before)
            {
                self.hooks.wait(flag, before);
            }
            flag.store(s.place.flag(k), Ordering::Release);
            if ends && k + 1 == s.chunks {
                counter(s.done).store(1, Ordering::Release);
            }
        }
        self.hooks.wrote();
    }

    /// An operation of no chunks: the first block raises `done` (once *drained* has reached
    /// `after`, unless it only sends).
    ///
    /// # Safety
    /// As [`run`].
    #[inline(always)]
    unsafe fn finish_empty(&self) {
        let s = self.s;
        if s.chunks > 0 || self.share.block != 0 {
            return;
        }
        // SAFETY: counters of the schedule (the caller's guarantee).
        unsafe {
            if s.early == 0 {
                self.wait(s.drained, s.after);
            }
            self.hooks.barrier();
            if self.grid.index() == 0 {
                counter(s.done).store(1, Ordering::Release);
                self.hooks.wrote();
            }
        }
    }

    /// Chunk `k`'s cells: its send area and its receive area, as device addresses.
    #[inline(always)]
    fn areas(&self, k: usize) -> (u64, u64) {
        let s = self.s;
        let send = s.ring + s.place.offset(k);
        (send, send + (s.send_parts * s.len_of(k) * s.sz) as u64)
    }

    /// Copies this block's share of `rows` rows of `row` bytes (`dst_pitch` and `src_pitch`
    /// apart), to host memory if `to_host`: the same stretch of every row, block `b` of `n` the
    /// bytes from `b × row / n` to `(b + 1) × row / n`, both cut down to a multiple of 64 (so
    /// each stretch keeps the rows' alignment, and no two blocks write one cache line).
    ///
    /// # Safety
    /// As [`copy_2d_unrolled`] for the whole rows.
    #[inline(always)]
    unsafe fn copy_share(
        &self,
        (dst, dst_pitch): (*mut u8, usize),
        (src, src_pitch): (*const u8, usize),
        (row, rows): (usize, usize),
        to_host: bool,
    ) {
        let (b, n) = (self.share.block, self.share.blocks.max(1));
        let cut = |i: usize| if i >= n { row } else { (row / n * i + row % n * i / n) & !63 };
        let (from, to) = (cut(b), cut(b + 1));
        if to <= from {
            return;
        }
        self.hooks.copy((to - from) * rows, to_host, || {
            // SAFETY: a stretch of every row of the caller's copy.
            unsafe {
                copy_2d_unrolled::<_, UNROLL>(
                    self.grid,
                    dst.add(from),
                    dst_pitch,
                    src.add(from),
                    src_pitch,
                    to - from,
                    rows,
                )
            }
        });
    }

    /// Waits for chunk `k`'s cells, copies its input rows into them, raises *staged*.
    ///
    /// # Safety
    /// As [`run`].
    #[inline(always)]
    unsafe fn stage_in(&self, k: usize) {
        let s = self.s;
        // SAFETY: forwarded from the caller throughout.
        unsafe {
            if let Some(needs) = s.place.needs_free(k) {
                self.wait(s.free, needs);
            }
            let input = &s.input;
            if input.parts > 0 {
                let (len, (send, recv)) = (s.len_of(k), self.areas(k));
                let dst = match s.input_at {
                    0 => send,
                    r => recv + ((r - 1) * len * s.sz) as u64,
                };
                let row = input.chunk_len(k, s.chunk_elems) * s.sz;
                let src = input.ptr + (k * s.chunk_elems * s.sz) as u64;
                let (dst, src, pitch) = (ptr(dst), ptr(src).cast_const(), input.pitch * s.sz);
                self.copy_share((dst, len * s.sz), (src, pitch), (row, input.parts), true);
            }
            self.publish(k, s.staged, s.arrived_in, None, s.early != 0);
        }
    }

    /// Waits for chunk `k`'s MPI part, copies its result rows back, raises *drained* (chunk 0
    /// once the earlier operations' chunks, copied back on other streams, are).
    ///
    /// # Safety
    /// As [`run`].
    #[inline(always)]
    unsafe fn stage_out(&self, k: usize) {
        let s = self.s;
        // SAFETY: forwarded from the caller throughout.
        unsafe {
            self.wait(s.output_flag, s.place.flag(k));
            let output = &s.output;
            if output.parts > 0 {
                let (len, (_, recv)) = (s.len_of(k), self.areas(k));
                let row = output.chunk_len(k, s.chunk_elems) * s.sz;
                let dst = output.ptr + (k * s.chunk_elems * s.sz) as u64;
                let (dst, src, pitch) = (ptr(dst), ptr(recv).cast_const(), output.pitch * s.sz);
                self.copy_share((dst, pitch), (src, len * s.sz), (row, output.parts), false);
            }
            self.publish(k, s.drained, s.arrived_out, (k == 0).then_some(s.after), true);
        }
    }
}

/// Work items each mover thread reads before it writes them (see [`copy_2d_unrolled`]): on a
/// GPU a side of 256 threads then keeps 16 KiB of reads in flight, where a read of host memory
/// waits a bus round trip. One on the host, whose typed copies run twice as fast as copies
/// through a `u128`.
const UNROLL: usize = if cfg!(any(target_arch = "nvptx64", target_arch = "amdgpu")) { 4 } else { 1 };

/// Threads per block of a GPU mover launch (its two sides' barriers count on them).
pub const DEVICE_THREADS: u32 = 512;

/// Which steps of a schedule a mover's threads run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Every step, each chunk's input side `ahead` chunks in front of its output side (the
    /// order the copy-engine path queues them in).
    Both,
    /// The input side of every chunk (which ends the operation, for one that only sends).
    Input,
    /// The output side of every chunk (nothing, for an operation that only sends). Runs at the same time as the input side: the input side waits for cells the
    /// output side hands back.
    Output,
}

/// Runs side `side` of block `share` of schedule `s` (see [`Share`]); block 0 raises `done` to 1
/// once the last chunk is through. Before it raises *drained* for chunk 0, the output side waits
/// until *drained* has reached `after` (the earlier operations' chunks are copied back), so
/// *drained* only grows, whichever streams the earlier ones ran on.
///
/// # Safety
/// Every address of `s` is as the schedule says, for the whole run: `input` rows readable and
/// `output` rows writable device memory, no other thread writing them; the ring's cells the
/// chunks occupy, touched by no one else between the waits that give them to the mover and the
/// counters it raises; the counters and `done` (and with several blocks, at most
/// [`MAX_BLOCKS`], the [`MAX_BLOCKS`] 8-byte words of `arrived_in` and of `arrived_out`, each
/// at most the operation's first chunk number, touched by no other mover while this one runs)
/// live, aligned and accessed atomically by everyone. The counters are raised by the proxy
/// thread (or by work that cannot wait for this run), so the waits end; a [`Side::Input`] run
/// has a [`Side::Output`] run of the same schedule and block beside it, and every block of
/// `share.blocks` runs beside this one, all at the same time. Every thread of a side runs it
/// with the same `s`, `hooks` and `share`, whose barrier spans them all (one side of a block on
/// a GPU, one thread on the host), with `share.block < share.blocks <= MAX_BLOCKS`.
pub unsafe fn run<G: Grid, H: Hooks>(grid: G, s: &Schedule, hooks: &H, side: Side, share: Share) {
    let m = Mover { grid, s, hooks, share };
    let (chunks, ahead, early) = (s.chunks, s.ahead(), s.early != 0);
    // SAFETY: forwarded from the caller throughout.
    unsafe {
        match side {
            Side::Input | Side::Both if early => {
                for k in 0..chunks {
                    m.stage_in(k);
                }
            }
            Side::Output if early => return,
            Side::Input => {
                for k in 0..chunks {
                    m.stage_in(k);
                }
                return;
            }
            Side::Output => {
                for k in 0..chunks {
                    m.stage_out(k);
                }
            }
            Side::Both => {
                for k in 0..ahead.min(chunks) {
                    m.stage_in(k);
                }
                for k in 0..chunks {
                    m.stage_out(k);
                    if k + ahead < chunks {
                        m.stage_in(k + ahead);
                    }
                }
            }
        }
        m.finish_empty();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_round_trip_through_words() {
        let s = Schedule { chunks: 7, early: 1, after: 9, done: 0x1000, ..Schedule::default() };
        assert_eq!(Schedule::WORDS * 8, size_of::<Schedule>());
        assert_eq!(Schedule::from_words(s.to_words()), s);
    }

    #[test]
    fn places_wrap_around_the_ring() {
        let p = Place { first: 10, pos: 12, skipped: 11, span: 2, cells: 8, cell_bytes: 64 };
        assert_eq!(p.flag(0), 11);
        assert_eq!(p.end(1), 16);
        assert_eq!(p.offset(0), 4 * 64);
        assert_eq!(p.offset(2), 0);
        // Chunk 0 ends at 14, a ring behind is 6: free must reach 6.
        assert_eq!(p.needs_free(0), Some(6));
        assert_eq!(p.ahead(100), 4);
        assert_eq!(p.ahead(2), 2);
        let start = Place { first: 0, pos: 0, skipped: 0, span: 4, cells: 8, cell_bytes: 1 };
        assert_eq!(start.needs_free(1), Some(0));
        assert_eq!(start.needs_free(0), None);
    }
}
