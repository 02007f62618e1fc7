//! Pack and unpack bodies: gather scattered pieces of a buffer into one contiguous buffer and
//! scatter them back, in one launch.
//!
//! * [`copy_2d`] copies `rows` rows of `row_bytes` bytes between two buffers with independent row
//!   pitches: packing a strided matrix (`dst_pitch == row_bytes`), unpacking one
//!   (`src_pitch == row_bytes`), or re-striding.
//! * [`pack_segments`] / [`unpack_segments`] move a list of [`Segment`]s, `(offset, len)` byte
//!   ranges of the scattered buffer, to and from consecutive places in the packed buffer: a
//!   v-collective moves all its per-rank blocks with one launch instead of one copy per rank.
//!
//! Everything is in bytes, so one kernel serves every element type. Each copy picks the widest
//! access (16, 8, 4, 2 or 1 bytes) that both sides can use at the same time: with source and
//! destination at the same offset modulo that width, a byte-wise head reaches the boundary, the
//! body moves whole units, and a byte-wise tail finishes.

use crate::grid::{Grid, stride_from};

/// A byte range `offset..offset + len` of a scattered buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Segment {
    /// Start of the range in bytes.
    pub offset: u64,
    /// Length of the range in bytes.
    pub len: u64,
}

impl Segment {
    /// The range `offset..offset + len`.
    pub const fn new(offset: u64, len: u64) -> Segment {
        Segment { offset, len }
    }
}

/// How one contiguous copy of `len` bytes splits into a byte head, units of `width` bytes and a
/// byte tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Plan {
    width: usize,
    head: usize,
    units: usize,
    tail: usize,
}

impl Plan {
    /// The widest access usable for copying `len` bytes from `src` to `dst`, given that
    /// `extra` must also be a multiple of the width (row pitches, which keep every row of a 2-D
    /// copy at the same alignment). Bit operations only: a 64-bit division or remainder is a
    /// long subroutine on a GPU, and a body makes a plan per piece it copies.
    #[inline(always)]
    fn new(dst: usize, src: usize, len: usize, extra: usize) -> Plan {
        // The lowest set bit of everything that must be a multiple of the width, capped at 16.
        let misaligned = (dst ^ src) | extra | 16;
        let width = misaligned & misaligned.wrapping_neg();
        let (mask, shift) = (width - 1, width.trailing_zeros());
        let head = (width.wrapping_sub(dst) & mask).min(len);
        let units = (len - head) >> shift;
        Plan { width, head, units, tail: len - head - (units << shift) }
    }

    /// Work items: head bytes, units, tail bytes.
    #[inline(always)]
    fn items(self) -> usize {
        self.head + self.units + self.tail
    }

    /// Copies work item `item` (`< items()`) of the range starting at `dst` / `src`.
    ///
    /// # Safety
    /// `dst` is valid for writes and `src` for reads of the `head + units * width + tail` bytes
    /// this plan was made for, with the addresses the plan was made for.
    #[inline(always)]
    unsafe fn copy_item(self, dst: *mut u8, src: *const u8, item: usize) {
        let (at, width) = self.item_at(item);
        // SAFETY: the item lies inside the planned range; unit items start at `head + k *
        // width`, which the plan aligned to `width` on both sides. Typed copies, not through a
        // `u128` (which the host compiles to two 8-byte halves: half the speed).
        unsafe {
            let (d, s) = (dst.add(at), src.add(at));
            match width {
                // One 16-byte access (`ld.global.v2.b64`); a 16-byte struct would be copied as
                // two 8-byte halves.
                16 => d.cast::<u128>().write(s.cast::<u128>().read()),
                8 => d.cast::<u64>().write(s.cast::<u64>().read()),
                4 => d.cast::<u32>().write(s.cast::<u32>().read()),
                2 => d.cast::<u16>().write(s.cast::<u16>().read()),
                _ => d.write(s.read()),
            }
        }
    }

    /// Where work item `item` starts in the range, and its width in bytes.
    #[inline(always)]
    fn item_at(self, item: usize) -> (usize, usize) {
        if item < self.head {
            (item, 1)
        } else if item < self.head + self.units {
            (self.head + (item - self.head) * self.width, self.width)
        } else {
            (self.head + self.units * self.width + (item - self.head - self.units), 1)
        }
    }

    /// Reads work item `item` (`< items()`) of the range starting at `src`, widened to a `u128`.
    ///
    /// # Safety
    /// `src` is valid for reads of the range this plan was made for, at the address it was
    /// made for.
    #[inline(always)]
    unsafe fn read_item(self, src: *const u8, item: usize) -> u128 {
        let (at, width) = self.item_at(item);
        // SAFETY: the item lies inside the planned range; unit items start at `head + k *
        // width`, which the plan aligned to `width`. One 16-byte access is `ld.global.v2.b64`
        // (a 16-byte struct would be read as two 8-byte halves).
        unsafe {
            let p = src.add(at);
            match width {
                16 => p.cast::<u128>().read(),
                8 => u128::from(p.cast::<u64>().read()),
                4 => u128::from(p.cast::<u32>().read()),
                2 => u128::from(p.cast::<u16>().read()),
                _ => u128::from(p.read()),
            }
        }
    }

    /// Writes `value` (narrowed to the item's width) as work item `item` of the range starting
    /// at `dst`.
    ///
    /// # Safety
    /// `dst` is valid for writes of the range this plan was made for, at the address it was
    /// made for.
    #[inline(always)]
    #[allow(clippy::cast_possible_truncation, reason = "the value was read at the item's width")]
    unsafe fn write_item(self, dst: *mut u8, item: usize, value: u128) {
        let (at, width) = self.item_at(item);
        // SAFETY: as in `read_item`, for writes.
        unsafe {
            let p = dst.add(at);
            match width {
                16 => p.cast::<u128>().write(value),
                8 => p.cast::<u64>().write(value as u64),
                4 => p.cast::<u32>().write(value as u32),
                2 => p.cast::<u16>().write(value as u16),
                _ => p.write(value as u8),
            }
        }
    }
}

/// Copies `rows` rows of `row_bytes` bytes: row `r` goes from `src + r * src_pitch` to
/// `dst + r * dst_pitch`.
///
/// # Safety
/// For every row `r < rows`, `dst + r * dst_pitch` is valid for writes and `src + r * src_pitch`
/// for reads of `row_bytes` bytes; destination rows do not overlap each other or any source row,
/// and nothing else writes these buffers during the launch.
#[inline(always)]
pub unsafe fn copy_2d<G: Grid>(
    grid: G,
    dst: *mut u8,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    row_bytes: usize,
    rows: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe { copy_2d_unrolled::<G, 1>(grid, dst, dst_pitch, src, src_pitch, row_bytes, rows) }
}

/// [`copy_2d`], each thread reading `U` of its work items before it writes them: `U` reads in
/// flight per thread instead of one, for copies whose reads wait long (a GPU reading host memory
/// over the bus: the mover's).
///
/// # Safety
/// As [`copy_2d`].
#[inline(always)]
pub unsafe fn copy_2d_unrolled<G: Grid, const U: usize>(
    grid: G,
    dst: *mut u8,
    dst_pitch: usize,
    src: *const u8,
    src_pitch: usize,
    row_bytes: usize,
    rows: usize,
) {
    // Pitches that are multiples of the width keep every row at the first row's alignment, so
    // one plan serves all rows.
    let plan = Plan::new(dst as usize, src as usize, row_bytes, dst_pitch | src_pitch);
    if U == 0 {
        return;
    }
    let Some(mut walk) = Walk::start(grid, plan.items(), rows) else { return };
    let (dst, src) = (Pitched { at: dst, pitch: dst_pitch }, Pitched { at: src.cast_mut(), pitch: src_pitch });
    while walk.row < rows {
        let (at, n) = walk.take::<U>();
        // SAFETY: each `(row, item)` the walk gave has `row < rows` and `item < items()`, inside
        // the ranges the caller guarantees; the plan's alignment holds for every row because
        // both pitches are multiples of its width.
        unsafe {
            if U == 1 {
                plan.copy_item(dst.row(at[0].0), src.row(at[0].0), at[0].1);
            } else {
                copy_items(plan, dst, src, &at, n);
            }
        }
    }
}

/// Rows `pitch` bytes apart from `at`.
#[derive(Clone, Copy)]
struct Pitched {
    at: *mut u8,
    pitch: usize,
}

impl Pitched {
    /// Row `r`'s start.
    ///
    /// # Safety
    /// Row `r` is inside the buffer.
    #[inline(always)]
    unsafe fn row(self, r: usize) -> *mut u8 {
        // SAFETY: guaranteed by the caller.
        unsafe { self.at.add(r * self.pitch) }
    }
}

/// A thread's `(row, item)` positions in grid-stride order, walked without a division per step:
/// one division up front, then the stride is added as a (rows, items) pair with a carry.
struct Walk {
    row: usize,
    item: usize,
    step_rows: usize,
    step_items: usize,
    per_row: usize,
    rows: usize,
}

impl Walk {
    /// The walk of `grid`'s thread over `rows` rows of `per_row` items; `None` if it has nothing.
    #[inline(always)]
    fn start<G: Grid>(grid: G, per_row: usize, rows: usize) -> Option<Walk> {
        if per_row == 0 || rows == 0 {
            return None;
        }
        let total = per_row.checked_mul(rows)?;
        let start = Some(grid.index()).filter(|&i| i < total)?;
        let (step_rows, step_items) = (grid.size() / per_row, grid.size() % per_row);
        Some(Walk { row: start / per_row, item: start % per_row, step_rows, step_items, per_row, rows })
    }

    /// The next `U` positions (fewer at the end: the count), in a loop of fixed trip count so
    /// they stay in registers.
    #[inline(always)]
    fn take<const U: usize>(&mut self) -> ([(usize, usize); U], usize) {
        let (mut at, mut n) = ([(0usize, 0usize); U], 0);
        #[allow(clippy::needless_range_loop, reason = "indexed by a constant range: unrolled")]
        for j in 0..U {
            if self.row < self.rows {
                at[j] = (self.row, self.item);
                n = j + 1;
                self.row += self.step_rows;
                self.item += self.step_items;
                if self.item >= self.per_row {
                    self.item -= self.per_row;
                    self.row += 1;
                }
            }
        }
        (at, n)
    }
}

/// Reads the first `n` of the positions `at`, then writes them: `n` reads in flight at once.
///
/// # Safety
/// As [`copy_2d`], every position `(row, item)` inside the rows and the plan's items.
#[inline(always)]
unsafe fn copy_items<const U: usize>(plan: Plan, dst: Pitched, src: Pitched, at: &[(usize, usize); U], n: usize) {
    let mut values = [0u128; U];
    // SAFETY: guaranteed by the caller; fixed trip counts keep `values` in registers.
    unsafe {
        #[allow(clippy::needless_range_loop, reason = "indexed by a constant range: unrolled")]
        for j in 0..U {
            if j < n {
                values[j] = plan.read_item(src.row(at[j].0), at[j].1);
            }
        }
        #[allow(clippy::needless_range_loop, reason = "indexed by a constant range: unrolled")]
        for j in 0..U {
            if j < n {
                plan.write_item(dst.row(at[j].0), at[j].1, values[j]);
            }
        }
    }
}

/// Direction of a segment copy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Pack,
    Unpack,
}

/// Threads that copy one tile together: 32 consecutive global indices, a warp on NVIDIA
/// hardware, so each access of a group is one coalesced 512-byte transaction.
const LANES: usize = 32;
/// Bytes of the packed buffer per tile: eight 16-byte accesses per lane of a full group.
const TILE: usize = 4096;

/// Shared body of [`pack_segments`] and [`unpack_segments`].
///
/// The packed buffer is cut into tiles of [`TILE`] bytes, dealt to groups of [`LANES`] threads
/// round-robin, so neighbouring groups work on neighbouring memory. A group walks the segment
/// list once, in step with its tiles, and copies each piece of a segment that falls inside a tile
/// with its lanes side by side: no thread visits every segment's items, and no division runs per
/// segment.
///
/// # Safety
/// As [`pack_segments`] (for `Pack`) or [`unpack_segments`] (for `Unpack`).
#[inline(always)]
unsafe fn segments<G: Grid>(
    grid: G,
    scattered: *mut u8,
    packed: *mut u8,
    segments: *const Segment,
    count: usize,
    direction: Direction,
) {
    let (me, threads) = (grid.index(), grid.size());
    if threads == 0 {
        // Never true for a real launch; checked so the tile loop below always advances.
        return;
    }
    let (group, lane) = (me / LANES, me % LANES);
    let groups = threads.div_ceil(LANES);
    // The last group of a launch whose size is not a multiple of LANES has fewer lanes.
    let lanes = threads.saturating_sub(group * LANES).min(LANES);
    let copy = SegmentCopy { scattered, packed, segments, count, direction, lane, lanes };
    // The first segment that does not end before the current tile, and where it starts in `packed`.
    let (mut first, mut first_at) = (0usize, 0usize);
    let mut tile = group;
    loop {
        let Some(lo) = tile.checked_mul(TILE) else { return };
        while first < count {
            // SAFETY: `first < count`.
            let (_, len) = unsafe { copy.segment(first) };
            if first_at + len > lo {
                break;
            }
            first_at += len;
            first += 1;
        }
        if first == count {
            return;
        }
        // SAFETY: segment `first` starts at `first_at` and is the first not ending before `lo`.
        unsafe { copy.tile(first, first_at, lo, lo.saturating_add(TILE)) };
        tile += groups;
    }
}

/// One thread's view of a segment copy: the buffers, the list, and its lane of its group.
#[derive(Clone, Copy)]
struct SegmentCopy {
    scattered: *mut u8,
    packed: *mut u8,
    segments: *const Segment,
    count: usize,
    direction: Direction,
    lane: usize,
    lanes: usize,
}

impl SegmentCopy {
    /// Segment `s`: its offset in the scattered buffer and its length.
    ///
    /// # Safety
    /// `s < count`, and the launch's guarantees hold (as [`segments`]).
    #[inline(always)]
    unsafe fn segment(self, s: usize) -> (usize, usize) {
        // SAFETY: the caller guarantees `count` readable segments, and `s < count`.
        let segment = unsafe { self.segments.add(s).read() };
        #[allow(clippy::cast_possible_truncation, reason = "the segment lies inside `scattered`, so both fit a usize")]
        (segment.offset as usize, segment.len as usize)
    }

    /// Copies this lane's share of the packed range `lo..hi`, segment `s` (which starts at `at`
    /// in the packed buffer) being the first that reaches into it.
    ///
    /// # Safety
    /// As [`segments`]; `s < count` and `at` is the sum of the lengths of the segments before it.
    #[inline(always)]
    unsafe fn tile(self, mut s: usize, mut at: usize, lo: usize, hi: usize) {
        while s < self.count && at < hi {
            // SAFETY: `s < count`.
            let (offset, len) = unsafe { self.segment(s) };
            let (from, to) = (at.max(lo), (at + len).min(hi));
            if from < to {
                // SAFETY: `from - at .. to - at` lies inside segment `s`, and `from .. to` inside
                // the packed total; the caller guarantees both ranges are inside their buffers.
                let (outside, inside) = unsafe { (self.scattered.add(offset + (from - at)), self.packed.add(from)) };
                let (dst, src) = match self.direction {
                    Direction::Pack => (inside, outside.cast_const()),
                    Direction::Unpack => (outside, inside.cast_const()),
                };
                // SAFETY: the piece of `to - from` bytes at `dst` / `src` is inside both buffers.
                unsafe { copy_piece(dst, src, to - from, self.lane, self.lanes) };
            }
            at += len;
            s += 1;
        }
    }
}

/// Copies `len` bytes from `src` to `dst` with `lanes` threads side by side, this one being
/// `lane`: the widest accesses both sides allow. A full group batches its reads
/// ([`copy_piece_batched`]); the short last group of an odd-sized launch goes item by item, lane
/// `k` taking items `k, k + lanes, ...`.
///
/// # Safety
/// `dst` is valid for writes and `src` for reads of `len` bytes.
#[inline(always)]
unsafe fn copy_piece(dst: *mut u8, src: *const u8, len: usize, lane: usize, lanes: usize) {
    if lanes == LANES {
        // SAFETY: forwarded from the caller; `lane < LANES`.
        unsafe { copy_piece_batched(dst, src, len, lane) };
        return;
    }
    let plan = Plan::new(dst as usize, src as usize, len, 0);
    for item in stride_from(lane, plan.items(), lanes) {
        // SAFETY: `item < items()`; the plan was made for exactly this range.
        unsafe { plan.copy_item(dst, src, item) };
    }
}

/// Bytes a lane of a full group reads before it writes them: four 16-byte accesses, or as many
/// narrower ones as make the same bytes (at most 16 accesses, so byte and 2-byte copies keep
/// fewer). One access in flight per thread is enough for 16-byte items but leaves 4- and 8-byte
/// items (source and destination at different offsets modulo 16, as most of a v-collective's
/// blocks are) at a fraction of the memory's bandwidth: every read waits for the write before it,
/// which may alias it.
const IN_FLIGHT: usize = 64;

/// [`copy_piece`] for a full group (`lane < LANES`): the byte head and tail that bring both
/// sides to the plan's width go one byte per lane (each is shorter than the width, at most 15
/// bytes, so 30 lanes cover both), then the units in chunks of [`IN_FLIGHT`] bytes per lane, each
/// chunk read entirely into registers before any of it is written.
///
/// # Safety
/// `dst` is valid for writes and `src` for reads of `len` bytes; `lane < LANES`.
#[inline(always)]
unsafe fn copy_piece_batched(dst: *mut u8, src: *const u8, len: usize, lane: usize) {
    let plan = Plan::new(dst as usize, src as usize, len, 0);
    let edges = plan.head + plan.tail;
    if lane < edges {
        // Head byte `lane`, or tail byte `lane - head`, which is at `len - tail + lane - head`.
        let at = if lane < plan.head { lane } else { len - edges + lane };
        // SAFETY: `at` is inside the head or the tail, both inside the `len` bytes.
        unsafe { dst.add(at).write(src.add(at).read()) };
    }
    if plan.units <= lane {
        return;
    }
    // This lane's first unit, in bytes: `lane << log2(width)`, one shift for every width, so that
    // the compiler does not hoist a `lane * width` pair of addresses per width out of the tile
    // loop (live through the whole kernel, they took it from 64 registers to 72).
    let first = plan.head + (lane << plan.width.trailing_zeros());
    // SAFETY: `lane < units`, so this lane's first unit is inside the units, which start `head`
    // bytes in, at an address both sides have aligned to the plan's width.
    unsafe {
        let (d, s) = (dst.add(first), src.add(first));
        match plan.width {
            16 => copy_units::<u128, { IN_FLIGHT / 16 }>(d.cast(), s.cast(), plan.units - lane),
            8 => copy_units::<u64, { IN_FLIGHT / 8 }>(d.cast(), s.cast(), plan.units - lane),
            4 => copy_units::<u32, { IN_FLIGHT / 4 }>(d.cast(), s.cast(), plan.units - lane),
            2 => copy_units::<u16, 16>(d.cast(), s.cast(), plan.units - lane),
            _ => copy_units::<u8, 16>(d, s, plan.units - lane),
        }
    }
}

/// One lane's share of a full group's copy of aligned units, `dst` and `src` pointing at the
/// lane's first unit and `units` counting from there: in chunks of `LANES * U` units, the lane
/// reads units `0, LANES, ..., (U - 1) * LANES` of a chunk (beside its neighbours' reads: each
/// read of the group is one coalesced transaction) and only then writes them. Whole chunks need
/// no bounds check; the last, partial one checks each unit. Constant strides keep one address
/// per chunk, the units at fixed offsets from it.
///
/// # Safety
/// `dst` is valid for writes and `src` for reads of those of the `units` units of `T` that are
/// this lane's (every `LANES`-th from the first), both aligned for `T`.
#[inline(always)]
unsafe fn copy_units<T: Copy + Default, const U: usize>(dst: *mut T, src: *const T, units: usize) {
    let mut base = 0;
    while units - base >= LANES * U {
        let mut values = [T::default(); U];
        // SAFETY: units `base .. base + LANES * U` are all inside; fixed trip counts keep
        // `values` in registers.
        unsafe {
            let (d, s) = (dst.add(base), src.add(base));
            #[allow(clippy::needless_range_loop, reason = "indexed by a constant range: unrolled")]
            for j in 0..U {
                values[j] = s.add(j * LANES).read();
            }
            #[allow(clippy::needless_range_loop, reason = "indexed by a constant range: unrolled")]
            for j in 0..U {
                d.add(j * LANES).write(values[j]);
            }
        }
        base += LANES * U;
    }
    if base == units {
        return;
    }
    let mut values = [T::default(); U];
    // SAFETY: each unit is read and written only if it is inside.
    unsafe {
        #[allow(clippy::needless_range_loop, reason = "indexed by a constant range: unrolled")]
        for j in 0..U {
            let i = base + j * LANES;
            if i < units {
                values[j] = src.add(i).read();
            }
        }
        #[allow(clippy::needless_range_loop, reason = "indexed by a constant range: unrolled")]
        for j in 0..U {
            let i = base + j * LANES;
            if i < units {
                dst.add(i).write(values[j]);
            }
        }
    }
}

/// Concatenates the segments of `src` into `dst`: segment `k` lands right after segment `k - 1`.
///
/// # Safety
/// `segments` is valid for reads of `count` segments; each `src[offset..offset + len]` is readable;
/// `dst` is valid for writes of the sum of the lengths and overlaps no segment of `src`; nothing
/// else writes these buffers during the launch.
#[inline(always)]
pub unsafe fn pack_segments<G: Grid>(grid: G, dst: *mut u8, src: *const u8, segments: *const Segment, count: usize) {
    // SAFETY: forwarded from the caller; the scattered side is only read when packing.
    unsafe { self::segments(grid, src.cast_mut(), dst, segments, count, Direction::Pack) }
}

/// Spreads the packed `src` over the segments of `dst`: the inverse of [`pack_segments`].
///
/// # Safety
/// `segments` is valid for reads of `count` segments, which do not overlap each other; each
/// `dst[offset..offset + len]` is writable; `src` is readable for the sum of the lengths and
/// overlaps no segment of `dst`; nothing else writes these buffers during the launch.
#[inline(always)]
pub unsafe fn unpack_segments<G: Grid>(grid: G, dst: *mut u8, src: *const u8, segments: *const Segment, count: usize) {
    // SAFETY: forwarded from the caller; the packed side is only read when unpacking.
    unsafe { self::segments(grid, dst, src.cast_mut(), segments, count, Direction::Unpack) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_pick_the_widest_common_alignment() {
        assert_eq!(Plan::new(0, 32, 40, 0), Plan { width: 16, head: 0, units: 2, tail: 8 });
        assert_eq!(Plan::new(3, 19, 40, 0), Plan { width: 16, head: 13, units: 1, tail: 11 });
        assert_eq!(Plan::new(0, 4, 40, 0), Plan { width: 4, head: 0, units: 10, tail: 0 });
        assert_eq!(Plan::new(0, 0, 40, 8), Plan { width: 8, head: 0, units: 5, tail: 0 });
        assert_eq!(Plan::new(1, 2, 5, 0), Plan { width: 1, head: 0, units: 5, tail: 0 });
        assert_eq!(Plan::new(5, 5, 3, 0).items(), 3);
    }

    /// Every offset of the source and of the destination modulo 16 (so every access width, with
    /// and without byte heads and tails), pieces of whole and partial chunks and tiles, full
    /// groups and a short one, both directions, against a byte-by-byte copy.
    #[test]
    fn segments_move_at_every_relative_alignment() {
        use crate::grid::HostGrid;
        use std::vec::Vec;

        // Under Miri, fewer cases.
        let (lens, shifts, offsets, threads): (&[usize], &[usize], &[usize], &[usize]) = if cfg!(miri) {
            (&[0, 1, 17, 100, 4111], &[0, 4, 3], &[0, 4, 3], &[40])
        } else {
            (
                &[0, 1, 15, 17, 31, 100, 2047, 4096, 4111, 9000],
                &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
                &[0, 4, 8, 12, 3],
                &[1, 32, 40, 96],
            )
        };
        let total: usize = lens.iter().sum();
        // Segments `spacing` bytes apart, a multiple of 16, plus a shift that differs per segment.
        let spacing = (lens.iter().max().unwrap_or(&0) / 16 + 2) * 16;
        let scattered_len = lens.len() * spacing + 16;
        for &shift in shifts {
            let ranges: Vec<core::ops::Range<usize>> = lens
                .iter()
                .enumerate()
                .map(|(k, &len)| {
                    let at = k * spacing + (shift * (k + 1)) % 16;
                    at..at + len
                })
                .collect();
            let segments: Vec<Segment> = ranges.iter().map(|r| Segment::new(r.start as u64, r.len() as u64)).collect();
            // 16-byte aligned storage: offsets into it are offsets modulo 16.
            let mut words = Vec::from_iter((0..scattered_len / 16 + 1).map(|w| w as u128 * 0x0123_4567_89ab_cdef));
            let scattered: Vec<u8> = bytemuck::cast_slice::<u128, u8>(&words)[..scattered_len].to_vec();
            let expected: Vec<u8> = ranges.iter().flat_map(|r| scattered[r.clone()].iter().copied()).collect();
            for &packed_off in offsets {
                let mut packed_words = Vec::from_iter((0..(packed_off + total) / 16 + 1).map(|_| 0u128));
                let packed = &mut bytemuck::cast_slice_mut::<u128, u8>(&mut packed_words)[packed_off..][..total];
                for &threads in threads {
                    packed.fill(0);
                    HostGrid::new(threads).pack_segments(packed, &scattered, &segments);
                    assert!(*packed == expected[..], "pack shift={shift} packed_off={packed_off} threads={threads}");

                    let back = &mut bytemuck::cast_slice_mut::<u128, u8>(&mut words)[..scattered_len];
                    back.fill(0);
                    HostGrid::new(threads).unpack_segments(back, packed, &segments);
                    for r in &ranges {
                        assert!(back[r.clone()] == scattered[r.clone()], "unpack shift={shift} threads={threads}");
                    }
                }
            }
        }
    }
}
