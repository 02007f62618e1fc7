//! Allreduce: ring (bandwidth-optimal, pipelined), recursive doubling (latency-optimal) and
//! Rabenseifner (recursive-halving reduce-scatter + recursive-doubling allgather).
//!
//! All three work in place on `buf` and assume a commutative operator; callers apply the
//! operator's finishing step (avg's division) afterwards. Safety contract: see the module docs
//! of [`crate::algorithms`].

use super::reduce_scatter::{self, Partials, RingLayout};
use super::{Fold, block_range};
use crate::api::error::Result;
use crate::common::buffer::RawBuf;
use crate::common::reducer::Reducer;
use crate::transport::Transport;

/// Ring allreduce: a [reduce-scatter](super::reduce_scatter::ring) around the ring, then an
/// allgather around the ring. Each rank sends and receives `2 (n-1)/n` of the buffer, the
/// minimum.
///
/// Out of place (`input` is `Some`), the input is read directly: the first send comes from it
/// and every reduction is `buf[b] = combine(input[b], incoming)`, so the input is never copied
/// (a copy costs as much as a transfer at large sizes). In place, `input` is `None`.
///
/// `scratch` must hold at least `2 * seg` elements (or the whole buffer if smaller).
///
/// # Safety
/// See [`crate::algorithms`]: `input` (same length as `buf`, only read), `buf` and `scratch`
/// valid, exclusive and disjoint until the future completes.
pub(crate) async unsafe fn ring<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    r: &R,
    input: Option<RawBuf<T>>,
    buf: RawBuf<T>,
    scratch: RawBuf<T>,
    seg: usize,
) -> Result<()> {
    let (n, me) = (x.size(), x.rank());
    let blocks: Vec<_> = (0..n).map(|i| block_range(buf.len(), n, i)).collect();
    let block = |i: usize| buf.block(blocks[i].0, blocks[i].1);
    let layout = RingLayout {
        blocks: &blocks,
        input: input.unwrap_or(buf),
        shift: 1,
        out: block((me + 1) % n),
        partials: Partials::InBuffer(buf),
    };
    // SAFETY: forwarded from the caller; partial results live in `buf`'s own blocks.
    unsafe { reduce_scatter::ring(x, r, layout, scratch, seg) }.await?;
    if n == 1 {
        return Ok(());
    }
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    for step in 0..n - 1 {
        let send = block((me + 1 + n - step) % n);
        let recv = block((me + n - step) % n);
        // SAFETY: distinct blocks of `buf`; the send block is complete, the receive block is
        // not read by this rank during the step.
        unsafe { x.post(&[(send, right)], &[(recv, left)]) }?.await?;
    }
    Ok(())
}

/// Folds the extra ranks of a non-power-of-two communicator in: odd ranks below `2 rem`
/// receive and reduce their even neighbour's data.
async fn fold_in<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    r: &R,
    fold: Fold,
    buf: RawBuf<T>,
    scratch: RawBuf<T>,
) -> Result<()> {
    let me = x.rank();
    if me >= 2 * fold.rem {
        return Ok(());
    }
    if me % 2 == 0 {
        // SAFETY: `buf` is only read while the send is pending.
        unsafe { x.post(&[(buf, me + 1)], &[]) }?.await
    } else {
        let tmp = scratch.block(0, buf.len());
        // SAFETY: `tmp` is scratch, disjoint from `buf`.
        unsafe { x.post(&[], &[(tmp, me - 1)]) }?.await?;
        // SAFETY: the receive completed; nothing else touches either buffer.
        unsafe { r.reduce(buf.as_mut_slice(), tmp.as_slice()) };
        Ok(())
    }
}

/// Sends the result back to the ranks that folded away.
async fn fold_out<T: Copy, X: Transport<T>>(x: &X, fold: Fold, buf: RawBuf<T>) -> Result<()> {
    let me = x.rank();
    if me >= 2 * fold.rem {
        return Ok(());
    }
    // SAFETY: `buf` is read by the send (odd ranks) or written by the receive (even ranks) and
    // untouched otherwise until completion.
    unsafe { if me % 2 == 0 { x.post(&[], &[(buf, me + 1)]) } else { x.post(&[(buf, me - 1)], &[]) } }?.await
}

/// Recursive doubling: `log2 n` full-buffer exchanges; best for small buffers.
/// `scratch` must hold `buf.len()` elements.
///
/// # Safety
/// See [`crate::algorithms`].
pub(crate) async unsafe fn recursive_doubling<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    r: &R,
    buf: RawBuf<T>,
    scratch: RawBuf<T>,
) -> Result<()> {
    let fold = Fold::new(x.size());
    fold_in(x, r, fold, buf, scratch).await?;
    if let Some(v) = fold.virtual_rank(x.rank()) {
        let tmp = scratch.block(0, buf.len());
        let mut mask = 1;
        while mask < fold.pof2 {
            let partner = fold.real_rank(v ^ mask);
            // SAFETY: `buf` is only read by the send, `tmp` (scratch) only written by the
            // receive, until completion.
            unsafe { x.post(&[(buf, partner)], &[(tmp, partner)]) }?.await?;
            // SAFETY: the exchange completed.
            unsafe { r.reduce(buf.as_mut_slice(), tmp.as_slice()) };
            mask <<= 1;
        }
    }
    fold_out(x, fold, buf).await
}

/// Rabenseifner: reduce-scatter by recursive halving, then allgather by recursive doubling.
/// Moves about as little data as the ring in `2 log2 n` steps instead of `2 (n-1)`.
/// `scratch` must hold `buf.len()` elements.
///
/// # Safety
/// See [`crate::algorithms`].
pub(crate) async unsafe fn rabenseifner<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    r: &R,
    buf: RawBuf<T>,
    scratch: RawBuf<T>,
) -> Result<()> {
    let fold = Fold::new(x.size());
    fold_in(x, r, fold, buf, scratch).await?;
    if let Some(v) = fold.virtual_rank(x.rank()) {
        let (mut lo, mut hi) = (0, buf.len());
        let mut levels = Vec::new();
        let mut mask = fold.pof2 / 2;
        while mask >= 1 {
            let partner = fold.real_rank(v ^ mask);
            let mid = lo + (hi - lo) / 2;
            let (keep, give) = if v & mask == 0 { ((lo, mid), (mid, hi)) } else { ((mid, hi), (lo, mid)) };
            let keep_buf = buf.block(keep.0, keep.1 - keep.0);
            let tmp = scratch.block(0, keep_buf.len());
            // SAFETY: the given half is only read, the scratch only written, until completion;
            // the kept half is untouched meanwhile.
            unsafe { x.post(&[(buf.block(give.0, give.1 - give.0), partner)], &[(tmp, partner)]) }?.await?;
            // SAFETY: the exchange completed.
            unsafe { r.reduce(keep_buf.as_mut_slice(), tmp.as_slice()) };
            levels.push((lo, hi));
            (lo, hi) = keep;
            mask /= 2;
        }
        let mut mask = 1;
        while mask < fold.pof2 {
            let partner = fold.real_rank(v ^ mask);
            let Some((plo, phi)) = levels.pop() else { break };
            let other = if lo == plo { (hi, phi) } else { (plo, lo) };
            // SAFETY: this rank's reduced range is only read, the partner's range only written,
            // and they are disjoint halves of the parent range.
            unsafe {
                x.post(&[(buf.block(lo, hi - lo), partner)], &[(buf.block(other.0, other.1 - other.0), partner)])
            }?
            .await?;
            (lo, hi) = (plo, phi);
            mask <<= 1;
        }
    }
    fold_out(x, fold, buf).await
}
