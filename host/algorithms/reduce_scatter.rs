//! Ring reduce-scatter over any block partition: the phase shared by ring allreduce,
//! reduce-scatter(v) and large reduces.
//!
//! In step `s` (of `n - 1`) each rank sends a partially reduced block to its right neighbour
//! and receives the next one from its left, combining it with its own input for that block.
//! After the last step rank `r` holds the full reduction of block `(r + shift) % n`. Every rank
//! sends and receives `(n-1)/n` of the data, the minimum, and steps are cut into segments so
//! reducing segment `k` overlaps receiving segment `k+1`.
//!
//! Safety contract: see the module docs of [`crate::algorithms`].

use super::segments;
use crate::api::error::Result;
use crate::common::buffer::RawBuf;
use crate::common::reducer::Reducer;
use crate::transport::Transport;

/// Where partial reductions live between steps.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Partials<T> {
    /// In the blocks of a full-size buffer (the input itself in place, or the allreduce result).
    InBuffer(RawBuf<T>),
    /// In two alternating slots of at least the largest block each (`2 * max_block` elements):
    /// out-of-place reduce-scatter needs no full-size temporary.
    Slots(RawBuf<T>),
}

/// The blocks of the ring, the input they are read from and where the result goes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RingLayout<'a, T> {
    /// `(start, len)` of block `b` in the input (and in an `InBuffer` partials buffer).
    pub(crate) blocks: &'a [(usize, usize)],
    /// This rank's input (full size; only read unless it is also the partials buffer).
    pub(crate) input: RawBuf<T>,
    /// Rank `r` ends with block `(r + shift) % n`.
    pub(crate) shift: usize,
    /// Where this rank's fully reduced block goes (its length).
    pub(crate) out: RawBuf<T>,
    pub(crate) partials: Partials<T>,
}

/// Runs the ring reduce-scatter. `scratch` holds at least `2 * seg` elements (or twice the
/// largest block, if smaller).
///
/// # Safety
/// See [`crate::algorithms`]: every buffer in `layout` and `scratch` valid and exclusive until
/// completion; `out`, the partials and `scratch` disjoint from each other, except that `out` may
/// be the final block of an `InBuffer` partials buffer, which may be the input itself.
pub(crate) async unsafe fn ring<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    r: &R,
    layout: RingLayout<'_, T>,
    scratch: RawBuf<T>,
    seg: usize,
) -> Result<()> {
    let (n, me) = (x.size(), x.rank());
    let RingLayout { blocks, input, shift, out, partials } = layout;
    let block = |b: RawBuf<T>, i: usize| b.block(blocks[i].0, blocks[i].1);
    if n == 1 {
        // SAFETY: distinct buffers, or the same block (which `copy_from` skips).
        unsafe { out.copy_from(block(input, shift % n)) };
        return Ok(());
    }
    let max_block = blocks.iter().map(|b| b.1).max().unwrap_or(0);
    // Where the reduction of block `b` made in step `s` is stored.
    let place = |s: usize, b: usize| -> RawBuf<T> {
        if s + 2 == n {
            return out;
        }
        match partials {
            Partials::InBuffer(buf) => block(buf, b),
            Partials::Slots(slots) => slots.block((s % 2) * max_block, blocks[b].1),
        }
    };
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let seg = seg.max(1).min(scratch.len() / 2).max(1);
    for s in 0..n - 1 {
        let sb = (me + shift + 2 * n - s - 1) % n;
        let rb = (me + shift + 2 * n - s - 2) % n;
        // The first step sends this rank's own input; later ones the block reduced before.
        let send = if s == 0 { block(input, sb) } else { place(s - 1, sb) };
        let (local, dst) = (block(input, rb), place(s, rb));
        let sends: Vec<_> = segments(send.len(), seg).collect();
        let recvs: Vec<_> = segments(dst.len(), seg).collect();
        let mut previous: Option<(X::Pending, usize)> = None;
        for k in 0..sends.len().max(recvs.len()) {
            let slot = scratch.block((k % 2) * seg, seg);
            let sk: Vec<_> = sends.get(k).map(|&(o, l)| (send.block(o, l), right)).into_iter().collect();
            let rk: Vec<_> = recvs.get(k).map(|&(_, l)| (slot.block(0, l), left)).into_iter().collect();
            // SAFETY: the send segment is complete (input, or reduced in the previous step)
            // and not written during this step; the receive goes into a scratch slot whose
            // previous contents were reduced at iteration k-1.
            let pending = unsafe { x.post(&sk, &rk) }?;
            if let Some((p, kk)) = previous.take() {
                p.await?;
                combine_segment(r, local, dst, &recvs, kk, scratch, seg);
            }
            previous = Some((pending, k));
        }
        if let Some((p, kk)) = previous.take() {
            p.await?;
            combine_segment(r, local, dst, &recvs, kk, scratch, seg);
        }
    }
    Ok(())
}

/// `dst[seg k] = combine(local[seg k], incoming)`; `local` may be `dst` itself.
fn combine_segment<T: Copy, R: Reducer<T>>(
    r: &R,
    local: RawBuf<T>,
    dst: RawBuf<T>,
    recvs: &[(usize, usize)],
    k: usize,
    scratch: RawBuf<T>,
    seg: usize,
) {
    let Some(&(o, l)) = recvs.get(k) else { return };
    let (d, incoming) = (dst.block(o, l), scratch.block((k % 2) * seg, l));
    // SAFETY: segment k of the destination is owned by this rank during the step (no message
    // reads or writes it), the scratch slot's receive has completed, and the input segment is
    // only read (or is the destination itself, handled by the two-operand form).
    unsafe {
        if std::ptr::eq(local.ptr(), dst.ptr()) {
            r.reduce(d.as_mut_slice(), incoming.as_slice());
        } else {
            r.reduce_into(d.as_mut_slice(), local.block(o, l).as_slice(), incoming.as_slice());
        }
    }
}

/// The scratch elements [`ring_blocks`] needs: the ring's two segment slots and, out of place,
/// two slots of the largest block for the partial sums.
pub(crate) fn ring_blocks_scratch(out_of_place: bool, blocks: &[(usize, usize)], seg: usize) -> usize {
    let max_block = blocks.iter().map(|b| b.1).max().unwrap_or(0);
    2 * seg.min(max_block.max(1)) + if out_of_place { 2 * max_block } else { 0 }
}

/// Reduce-scatter(v) of `blocks` (`(start, len)` in the input) over the ring, ending with this
/// rank's reduced block at the front of `out`, without the operator's finishing step. Out of
/// place the input is `send` and the partial sums live in two block slots of `scratch`; in place
/// the input is `out`, the partial sums live in it, and the result moves to its front.
///
/// # Safety
/// See [`crate::algorithms`]; `scratch` ([`ring_blocks_scratch`] elements) is distinct from
/// `send` and `out`, and `send` from `out`.
pub(crate) async unsafe fn ring_blocks<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    r: &R,
    send: Option<RawBuf<T>>,
    out: RawBuf<T>,
    blocks: &[(usize, usize)],
    scratch: RawBuf<T>,
    seg: usize,
) -> Result<()> {
    let me = x.rank();
    let slots = if send.is_some() { 2 * blocks.iter().map(|b| b.1).max().unwrap_or(0) } else { 0 };
    let incoming = scratch.block(slots, scratch.len() - slots);
    let (input, result, partials) = match send {
        Some(input) => (input, out, Partials::Slots(scratch.block(0, slots))),
        None => (out, out.block(blocks[me].0, blocks[me].1), Partials::InBuffer(out)),
    };
    let layout = RingLayout { blocks, input, shift: 0, out: result, partials };
    // SAFETY: guaranteed by the caller; the slots and the receive area of `scratch` are
    // disjoint.
    unsafe { ring(x, r, layout, incoming, seg).await? };
    let (from, len) = blocks[me];
    if send.is_none() && from != 0 && len != 0 {
        // SAFETY: the ring has completed and `out` is exclusive; `copy_within` handles the
        // overlap.
        unsafe { out.as_mut_slice().copy_within(from..from + len, 0) };
    }
    Ok(())
}
