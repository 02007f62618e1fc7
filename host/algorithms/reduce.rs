//! Reduce to a root over the ring: the ring reduce-scatter, then the reduced blocks gathered
//! at the root. For large reductions with a commutative operator, where a tree of
//! whole-buffer messages would move `log2 n` times the data through the root's links.
//!
//! Safety contract: see the module docs of [`crate::algorithms`].

use super::block_range;
use super::exchange::linear_gather;
use super::reduce_scatter::{self, Partials, RingLayout};
use crate::api::error::Result;
use crate::common::buffer::RawBuf;
use crate::common::reducer::Reducer;
use crate::transport::Transport;

/// The scratch elements [`ring`] needs for `len` elements over `n` ranks in segments of `seg`:
/// the ring's two segment slots and, off the root, its partial sums and its reduced block.
pub(crate) fn ring_scratch(len: usize, n: usize, is_root: bool, seg: usize) -> usize {
    let max_block = block_range(len, n.max(1), 0).1;
    2 * seg.min(max_block.max(1)) + if is_root { 0 } else { 3 * max_block }
}

/// Reduces `input` of every rank into `out` at `root` (unused elsewhere), without the
/// operator's finishing step. Off the root the input is never written (in place it must stay
/// unchanged), so the partial sums and the reduced block live in `scratch`
/// ([`ring_scratch`] elements). `xg` carries the gather: its messages can never meet the
/// ring's.
///
/// # Safety
/// See [`crate::algorithms`]; `input` may be `out` (in place at the root); `scratch` is
/// distinct from both.
#[allow(clippy::too_many_arguments)]
pub(crate) async unsafe fn ring<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    xg: &X,
    r: &R,
    input: RawBuf<T>,
    out: RawBuf<T>,
    root: usize,
    scratch: RawBuf<T>,
    seg: usize,
) -> Result<()> {
    let (me, n) = (x.rank(), x.size());
    let blocks: Vec<(usize, usize)> = (0..n).map(|i| block_range(input.len(), n, i)).collect();
    let max_block = blocks.first().map_or(0, |b| b.1);
    let own = if me == root { 0 } else { 3 * max_block };
    let incoming = scratch.block(own, scratch.len() - own);
    let (result, partials) = if me == root {
        (out.block(blocks[me].0, blocks[me].1), Partials::InBuffer(out))
    } else {
        (scratch.block(2 * max_block, blocks[me].1), Partials::Slots(scratch.block(0, 2 * max_block)))
    };
    let layout = RingLayout { blocks: &blocks, input, shift: 0, out: result, partials };
    let dest: Vec<_> = blocks.iter().map(|&(s, l)| out.block(s, l)).collect();
    // SAFETY: guaranteed by the caller; the parts of `scratch` are disjoint.
    unsafe {
        reduce_scatter::ring(x, r, layout, incoming, seg).await?;
        linear_gather(xg, root, result, &dest).await
    }
}
