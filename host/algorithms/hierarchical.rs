//! Two-level (hierarchical) collectives: a node-local phase over shared memory and a cross-node
//! phase over the network, so the slow links carry as little as possible. Design and measured
//! numbers: `docs/topology.md`.
//!
//! Every node's first `lanes` ranks (`lanes` = the fewest ranks any node has) each own one
//! *lane*: a slice of the data. Rank `l` of every node forms lane group `l` with the rank `l`s of
//! the other nodes, and the cross-node phase runs in all lane groups at once, so every rank that
//! owns a lane drives the network rather than one leader per node. Ranks beyond `lanes` (on nodes
//! with more ranks than the smallest) take part in the node-local phases only. Phases run on
//! [`Group`]s of the operation's transport.
//!
//! All of them need a commutative operator (the node phase combines ranks out of rank order);
//! callers fall back to another algorithm otherwise. Safety contract: see [`crate::algorithms`].

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Poll;

use super::reduce_scatter::{self, Partials, RingLayout};
use super::{allreduce, bcast, block_range, exchange, segment, segment_count};
use crate::api::error::{Error, Result};
use crate::common::buffer::RawBuf;
use crate::common::reducer::Reducer;
use crate::topology::Topology;
use crate::transport::{Group, Transport};

/// This rank's view of the two levels.
#[derive(Debug)]
pub(crate) struct Levels {
    /// Every node's ranks, in rank order; nodes in the topology's order.
    nodes: Vec<Vec<usize>>,
    /// This rank's node, and its index there.
    node: usize,
    local: usize,
    /// The number of lanes: the fewest ranks any node has.
    lanes: usize,
    /// This rank's lane group (rank `local` of every node), if `local < lanes`.
    lane: Option<Vec<usize>>,
}

impl Levels {
    pub(crate) fn new(topology: &Topology, rank: usize) -> Self {
        let nodes: Vec<Vec<usize>> = (0..topology.node_count()).map(|k| topology.ranks_on(k).to_vec()).collect();
        let (node, local) = (topology.node_of(rank), topology.local_index(rank));
        let lanes = nodes.iter().map(Vec::len).min().unwrap_or(1).max(1);
        let lane = (local < lanes).then(|| nodes.iter().map(|ranks| ranks[local]).collect());
        Levels { nodes, node, local, lanes, lane }
    }

    fn node_group<'a, X>(&'a self, x: &'a X) -> Group<'a, X> {
        Group::new(x, &self.nodes[self.node], self.local)
    }

    fn lane_group<'a, X>(&'a self, x: &'a X) -> Option<Group<'a, X>> {
        self.lane.as_deref().map(|lane| Group::new(x, lane, self.node))
    }

    /// The number of ranks, on all nodes.
    pub(crate) fn size(&self) -> usize {
        self.nodes.iter().map(Vec::len).sum()
    }

    /// The columns of every rank's block that one chunk of about `chunk` elements of a
    /// reduce-scatter's input (or an allgather's output) covers: at least one.
    pub(crate) fn columns(&self, chunk: usize) -> usize {
        (chunk / self.size().max(1)).max(1)
    }

    /// `(start, len)` of node rank `b`'s slice when `len` elements are cut into lanes: ranks
    /// beyond the lanes own an empty slice at the end.
    fn lane_blocks(&self, len: usize) -> Vec<(usize, usize)> {
        let m = self.nodes[self.node].len();
        (0..m).map(|b| if b < self.lanes { block_range(len, self.lanes, b) } else { (len, 0) }).collect()
    }
}

/// Hierarchical allreduce: node-local ring reduce-scatter into lanes, a ring allreduce of each
/// lane's slice across nodes (all lane groups at once), then a node-local ring allgather. Each
/// node sends `2 (nodes-1)/nodes` of the buffer over the network in total, against the flat
/// ring's `2 (n-1)/n` per rank crossing wherever the ring crosses nodes.
///
/// The buffer runs in chunks of `chunk` elements ([`in_chunks`]), so the node-local phases of
/// one chunk overlap the network phase of the one before.
///
/// `input`: as for [`allreduce::ring`]. `scratch` holds `xs.len()` equal slots of at least
/// `2 * seg` elements each (or the chunk, if smaller).
///
/// # Safety
/// See [`crate::algorithms`].
#[allow(clippy::too_many_arguments)]
pub(crate) async unsafe fn allreduce<T: Copy, X: Transport<T>, R: Reducer<T>>(
    xs: &[X],
    r: &R,
    lv: &Levels,
    input: Option<RawBuf<T>>,
    buf: RawBuf<T>,
    scratch: RawBuf<T>,
    seg: usize,
    chunk: usize,
) -> Result<()> {
    in_chunks(xs, scratch, buf.len(), chunk, |ch| {
        let (input, buf) = (input.map(|i| i.block(ch.start, ch.len)), buf.block(ch.start, ch.len));
        async move {
            // SAFETY: the chunk's ranges of the caller's buffers and its own scratch slot: valid
            // and exclusive (chunks are disjoint), as the caller guarantees for the whole.
            let mine = unsafe { node_reduce_scatter(ch.x, r, lv, input, buf, ch.scratch, seg) }.await;
            ch.pass_head();
            let mine = mine?;
            if let Some(lane) = lv.lane_group(ch.x) {
                // SAFETY: this rank's slice of the chunk and the chunk's scratch slot, both
                // exclusive to the chunk.
                unsafe { allreduce::ring(&lane, r, None, mine, ch.scratch, seg) }.await?;
            }
            // SAFETY: as above; this rank's slice of the chunk is complete.
            unsafe { node_allgather(ch.x, lv, buf) }.await
        }
    })
    .await
}

/// The node phase before the network: a node-local ring reduce-scatter of `buf` (read from
/// `input` out of place) into the lane slices. Returns this rank's slice, reduced over its node.
///
/// # Safety
/// As for [`allreduce`], on one chunk.
async unsafe fn node_reduce_scatter<T: Copy, X: Transport<T>, R: Reducer<T>>(
    x: &X,
    r: &R,
    lv: &Levels,
    input: Option<RawBuf<T>>,
    buf: RawBuf<T>,
    scratch: RawBuf<T>,
    seg: usize,
) -> Result<RawBuf<T>> {
    let blocks = lv.lane_blocks(buf.len());
    let mine = buf.block(blocks[lv.local].0, blocks[lv.local].1);
    let layout = RingLayout {
        blocks: &blocks,
        input: input.unwrap_or(buf),
        shift: 0,
        out: mine,
        partials: Partials::InBuffer(buf),
    };
    let node = lv.node_group(x);
    // SAFETY: forwarded from the caller; partial sums live in `buf`'s own blocks, the result in
    // this rank's block of it.
    unsafe { reduce_scatter::ring(&node, r, layout, scratch, seg) }.await?;
    Ok(mine)
}

/// The node phase after the network: a node-local ring allgather of the lane slices of `buf`.
///
/// # Safety
/// As for [`allreduce`], on one chunk whose own slice is complete.
async unsafe fn node_allgather<T: Copy, X: Transport<T>>(x: &X, lv: &Levels, buf: RawBuf<T>) -> Result<()> {
    let slices: Vec<_> = lv.lane_blocks(buf.len()).iter().map(|&(s, l)| buf.block(s, l)).collect();
    let node = lv.node_group(x);
    // SAFETY: the slices partition `buf`; this rank's own is complete.
    unsafe { exchange::ring_allgather(&node, &slices) }.await
}

/// One chunk of an operation run by [`in_chunks`]: elements `start..start + len` of its
/// buffers, the transport and scratch slot it has to itself while in flight.
struct Chunk<'a, X, T> {
    index: usize,
    start: usize,
    len: usize,
    x: &'a X,
    scratch: RawBuf<T>,
    heads: Arc<AtomicUsize>,
}

impl<X, T> Chunk<'_, X, T> {
    /// Lets the next chunk start: this one has finished its first (node-local) phase.
    fn pass_head(&self) {
        self.heads.fetch_max(self.index + 1, Ordering::Release);
    }
}

/// Cuts `len` elements into chunks of `chunk` and runs `run` on each as a [`pipeline`] as deep
/// as there are transports in `xs` (one per chunk in flight, each with its own tag), chunk `c`
/// taking transport `c % depth` and the same slot of `scratch` (cut into `depth` equal slots).
async fn in_chunks<'a, T, X, F: Future<Output = Result<()>>>(
    xs: &'a [X],
    scratch: RawBuf<T>,
    len: usize,
    chunk: usize,
    mut run: impl FnMut(Chunk<'a, X, T>) -> F,
) -> Result<()> {
    if xs.is_empty() {
        return Err(Error::Progress("a chunked operation without a transport"));
    }
    let depth = xs.len();
    let slot = scratch.len() / depth;
    let heads = Arc::new(AtomicUsize::new(0));
    let chunk_at = |c: usize| {
        let (start, len) = segment(len, chunk, c);
        let (x, scratch) = (&xs[c % depth], scratch.block((c % depth) * slot, slot));
        Chunk { index: c, start, len, x, scratch, heads: Arc::clone(&heads) }
    };
    pipeline(segment_count(len, chunk), depth, &heads, |c| run(chunk_at(c))).await
}

/// Runs chunks `0..count` of one operation, `run(c)` each, with at most `depth` in flight:
/// chunk `c` starts once `heads` has reached `c` (chunk `c-1` has finished its first phase and
/// said so) and chunk `c - depth`, whose slot (scratch, transport) it takes, has finished. The
/// first error ends the operation; chunks still in flight are dropped, which cancels their
/// messages.
///
/// Every rank starts the chunks in the same order, and chunk `c` posts a message on its slot's
/// tag only after chunk `c - depth` has completed all of its own on that rank, so the messages
/// of one tag match in the same order on both sides of every pair.
async fn pipeline<F: Future<Output = Result<()>>>(
    count: usize,
    depth: usize,
    heads: &AtomicUsize,
    mut run: impl FnMut(usize) -> F,
) -> Result<()> {
    let depth = depth.max(1);
    let mut slots: Vec<Option<Pin<Box<F>>>> = (0..depth).map(|_| None).collect();
    let mut next = 0;
    // Chunk `next` may start: its predecessor has passed its head and its slot is free.
    let startable = |next: usize, slots: &[Option<Pin<Box<F>>>]| {
        next < count && heads.load(Ordering::Acquire) >= next && slots[next % depth].is_none()
    };
    poll_fn(|cx| {
        loop {
            while startable(next, &slots) {
                slots[next % depth] = Some(Box::pin(run(next)));
                next += 1;
            }
            let mut finished = false;
            for slot in slots.iter_mut() {
                let Some(fut) = slot.as_mut() else { continue };
                match fut.as_mut().poll(cx) {
                    Poll::Ready(Ok(())) => {
                        *slot = None;
                        finished = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => {}
                }
            }
            if next == count && slots.iter().all(Option::is_none) {
                return Poll::Ready(Ok(()));
            }
            if !finished && !startable(next, &slots) {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// Hierarchical broadcast, pipelined over a two-level tree: the root's node first, the chunks
/// flow down a chain of node leaders (the root on its node, the lowest rank on the others),
/// and each leader forwards every chunk to its next leader and down a chain through its own
/// node at once. The network carries the buffer once per node.
///
/// # Safety
/// See [`crate::algorithms`]: `buf` valid and exclusive until the future completes.
pub(crate) async unsafe fn bcast<T: Copy, X: Transport<T>>(
    x: &X,
    topology: &Topology,
    buf: RawBuf<T>,
    root: usize,
    chunk: usize,
) -> Result<()> {
    let count = topology.node_count();
    let root_node = topology.node_of(root);
    let leader = |k: usize| if k == root_node { root } else { topology.ranks_on(k).first().copied().unwrap_or(root) };
    let me = x.rank();
    let node = topology.node_of(me);
    let rel = (node + count - root_node) % count;
    // The node's chain: its leader, then its other ranks in rank order.
    let chain: Vec<usize> = std::iter::once(leader(node))
        .chain(topology.ranks_on(node).iter().copied().filter(|&r| r != leader(node)))
        .collect();
    let pos = chain.iter().position(|&r| r == me).unwrap_or(0);
    let parent = match (pos, rel) {
        (0, 0) => None,
        (0, _) => Some(leader((node + count - 1) % count)),
        _ => Some(chain[pos - 1]),
    };
    let mut children = Vec::with_capacity(2);
    if pos == 0 && rel + 1 < count {
        // The cross-node link first: it is the slow one.
        children.push(leader((node + 1) % count));
    }
    if let Some(&next) = chain.get(pos + 1) {
        children.push(next);
    }
    // SAFETY: forwarded from the caller.
    unsafe { bcast::pipeline(x, buf, parent, &children, chunk) }.await
}

/// Where the data of a two-level reduce-scatter or allgather of `count` elements per rank lives
/// in the lane-major scratch layout: node `k`'s data (its ranks' blocks in rank order) is cut
/// into lanes, and lane `l` of every node comes together, so each phase works on contiguous
/// ranges: lane `l` is `lane_range(l)`, and node `k`'s part of it is `part(l, k)`. The `count`
/// elements of a rank are columns `first..first + count` of its block of `stride` elements in
/// the rank-ordered buffer (a chunk of the operation: [`LaneLayout::within`]).
struct LaneLayout<'a> {
    lv: &'a Levels,
    count: usize,
    stride: usize,
    first: usize,
    /// `starts[l][k]`: where lane `l` of node `k` begins in the layout.
    starts: Vec<Vec<usize>>,
}

impl<'a> LaneLayout<'a> {
    fn new(lv: &'a Levels, count: usize) -> Self {
        let mut at = 0;
        let starts = (0..lv.lanes)
            .map(|l| {
                (0..lv.nodes.len())
                    .map(|k| {
                        let start = at;
                        at += block_range(lv.nodes[k].len() * count, lv.lanes, l).1;
                        start
                    })
                    .collect()
            })
            .collect();
        LaneLayout { lv, count, stride: count, first: 0, starts }
    }

    /// The layout of columns `first..first + count` of blocks of `stride` elements.
    fn within(self, stride: usize, first: usize) -> Self {
        LaneLayout { stride, first, ..self }
    }

    /// The elements of the layout: `count` for every rank.
    fn total(&self) -> usize {
        self.lv.size() * self.count
    }

    /// `(start, len)` of lane `l` of node `k`'s data, relative to the node's data.
    fn in_node(&self, l: usize, k: usize) -> (usize, usize) {
        block_range(self.lv.nodes[k].len() * self.count, self.lv.lanes, l)
    }

    /// `(start, len)` of lane `l` of node `k` in the layout.
    fn part(&self, l: usize, k: usize) -> (usize, usize) {
        (self.starts[l][k], self.in_node(l, k).1)
    }

    /// `(start, len)` of lane `l` (every node's part of it) in the layout.
    fn lane_range(&self, l: usize) -> (usize, usize) {
        let start = self.starts[l][0];
        (start, (0..self.lv.nodes.len()).map(|k| self.in_node(l, k).1).sum())
    }

    /// The node-local slices of the layout: lane `b` for node rank `b`, empty beyond the lanes.
    fn lane_blocks(&self) -> Vec<(usize, usize)> {
        let total = self.total();
        (0..self.lv.nodes[self.lv.node].len())
            .map(|b| if b < self.lv.lanes { self.lane_range(b) } else { (total, 0) })
            .collect()
    }

    /// The pieces where lane `l` of node `k` meets the blocks of the node's ranks: `(offset in
    /// the layout, node rank j, offset in rank j's block, len)`, in order, none empty.
    fn pieces(&self, l: usize, k: usize) -> Vec<(usize, usize, usize, usize)> {
        let (lane_start, lane_len) = self.in_node(l, k);
        let at = self.part(l, k).0;
        let mut out = Vec::new();
        let mut i = lane_start;
        while i < lane_start + lane_len {
            let (j, off) = (i / self.count, i % self.count);
            let len = (self.count - off).min(lane_start + lane_len - i);
            out.push((at + (i - lane_start), j, off, len));
            i += len;
        }
        out
    }

    /// Copies between the layout and the rank-ordered buffer `full` (`stride` per rank), every
    /// piece of every lane and node: `into_layout` gathers, otherwise scatters back.
    ///
    /// # Safety
    /// Both buffers valid, exclusive to the caller and disjoint.
    unsafe fn permute<T: Copy>(&self, layout: RawBuf<T>, full: RawBuf<T>, into_layout: bool) {
        for l in 0..self.lv.lanes {
            for k in 0..self.lv.nodes.len() {
                for (at, j, off, len) in self.pieces(l, k) {
                    let (a, b) =
                        (layout.block(at, len), full.block(self.lv.nodes[k][j] * self.stride + self.first + off, len));
                    // SAFETY: distinct buffers, guaranteed by the caller.
                    unsafe {
                        if into_layout {
                            a.copy_from(b);
                        } else {
                            b.copy_from(a);
                        }
                    }
                }
            }
        }
    }
}

/// Hierarchical reduce-scatter of `count` elements per rank: the input (`n * count`, rank
/// order) is laid out lane-major in scratch; a node-local ring reduce-scatter gives each lane
/// rank its lane summed over the node; a ring reduce-scatter in each lane group gives every
/// node its own part of the lane; the lane ranks then hand each rank of their node its pieces,
/// straight into `out` (`count` elements).
///
/// Every rank's block runs in chunks of columns, about `chunk` elements of the whole input
/// each, through [`in_chunks`] over the transports `xs`: the node-local phase of one chunk
/// overlaps the network phase of the one before. `scratch` holds `xs.len()` equal slots, each
/// of at least a chunk's input plus `2 * seg` elements (or twice the chunk's input).
///
/// # Safety
/// See [`crate::algorithms`]; `out` may lie inside `input` (in place): a chunk reads its
/// columns of the input before it writes the same columns of `out`, and no other chunk reads
/// them.
#[allow(clippy::too_many_arguments)]
pub(crate) async unsafe fn reduce_scatter<T: Copy, X: Transport<T>, R: Reducer<T>>(
    xs: &[X],
    r: &R,
    lv: &Levels,
    input: RawBuf<T>,
    out: RawBuf<T>,
    scratch: RawBuf<T>,
    seg: usize,
    chunk: usize,
) -> Result<()> {
    let count = out.len();
    in_chunks(xs, scratch, count, lv.columns(chunk), |ch| {
        let ll = LaneLayout::new(lv, ch.len).within(count, ch.start);
        let out = out.block(ch.start, ch.len);
        async move {
            let step = ReduceScatterChunk { x: ch.x, r, ll, slot: ch.scratch, seg };
            // SAFETY: the chunk's columns of the caller's buffers and its own scratch slot.
            let reduced = unsafe { step.reduce_lanes(input) }.await;
            ch.pass_head();
            reduced?;
            // SAFETY: as above; the node phase is complete.
            unsafe { step.scatter_lanes(out) }.await
        }
    })
    .await
}

/// One chunk of a [`reduce_scatter`]: its layout, its scratch slot (the lane-major layout,
/// then the ring's two segment slots) and what its phases run with.
struct ReduceScatterChunk<'a, X, R, T> {
    x: &'a X,
    r: &'a R,
    ll: LaneLayout<'a>,
    slot: RawBuf<T>,
    seg: usize,
}

impl<T: Copy, X: Transport<T>, R: Reducer<T>> ReduceScatterChunk<'_, X, R, T> {
    /// The lane-major layout, this rank's lane in it, and the ring's scratch.
    fn parts(&self) -> (RawBuf<T>, RawBuf<T>, RawBuf<T>) {
        let size = self.ll.total();
        let layout = self.slot.block(0, size);
        let (start, len) = self.ll.lane_blocks()[self.ll.lv.local];
        (layout, layout.block(start, len), self.slot.block(size, self.slot.len() - size))
    }

    /// The node phase: lays the chunk's columns of `input` out lane-major and reduces them
    /// over the node, leaving this rank's lane summed over its node.
    ///
    /// # Safety
    /// As for [`reduce_scatter`], on this chunk's columns; the slot is the chunk's own.
    async unsafe fn reduce_lanes(&self, input: RawBuf<T>) -> Result<()> {
        let (layout, lane_out, ring_scratch) = self.parts();
        // SAFETY: scratch and the caller's input are disjoint.
        unsafe { self.ll.permute(layout, input, true) };
        let blocks = self.ll.lane_blocks();
        let by_node = RingLayout {
            blocks: &blocks,
            input: layout,
            shift: 0,
            out: lane_out,
            partials: Partials::InBuffer(layout),
        };
        let node = self.ll.lv.node_group(self.x);
        // SAFETY: all in this chunk's scratch, reduced in place.
        unsafe { reduce_scatter::ring(&node, self.r, by_node, ring_scratch, self.seg) }.await
    }

    /// The phases after the node's: the lane groups' ring reduce-scatter across nodes, then
    /// every lane rank hands the ranks of its node their pieces, into `out` (this chunk's
    /// columns of this rank's result).
    ///
    /// # Safety
    /// As for [`Self::reduce_lanes`], which has completed.
    async unsafe fn scatter_lanes(&self, out: RawBuf<T>) -> Result<()> {
        let (ll, lv) = (&self.ll, self.ll.lv);
        let (layout, lane_out, ring_scratch) = self.parts();
        let (mut sends, mut recvs) = (Vec::new(), Vec::new());
        if let Some(lane) = lv.lane_group(self.x) {
            let parts: Vec<_> = (0..lv.nodes.len())
                .map(|k| {
                    let (s, l) = ll.part(lv.local, k);
                    (s - ll.lane_range(lv.local).0, l)
                })
                .collect();
            let mine = lane_out.block(parts[lv.node].0, parts[lv.node].1);
            let across = RingLayout {
                blocks: &parts,
                input: lane_out,
                shift: 0,
                out: mine,
                partials: Partials::InBuffer(lane_out),
            };
            // SAFETY: as above.
            unsafe { reduce_scatter::ring(&lane, self.r, across, ring_scratch, self.seg) }.await?;
            for (at, j, off, len) in ll.pieces(lv.local, lv.node) {
                sends.push((layout.block(at, len), j, out.block(off, len)));
            }
        }
        for l in 0..lv.lanes {
            for (_, j, off, len) in ll.pieces(l, lv.node) {
                if j == lv.local && l != lv.local {
                    recvs.push((out.block(off, len), l));
                }
            }
        }
        let mut to = Vec::new();
        for (piece, j, dst) in sends {
            if j == lv.local {
                // SAFETY: scratch into this rank's own output, disjoint.
                unsafe { dst.copy_from(piece) };
            } else {
                to.push((piece, j));
            }
        }
        // SAFETY: sends read scratch, receives write disjoint pieces of `out`.
        unsafe { lv.node_group(self.x).post(&to, &recvs) }?.await
    }
}

/// Hierarchical allgather of `count` elements per rank into `full` (`n * count`, rank order;
/// this rank's block already in place): the ranks of each node hand their pieces to the lane
/// ranks, each lane group runs a ring allgather across nodes, a node-local ring allgather shares
/// the lanes, and the lane-major layout is copied back into rank order.
///
/// Chunks of columns as in [`reduce_scatter`]; `scratch` holds `xs.len()` equal slots of at
/// least a chunk's data (`n` times its columns) each.
///
/// # Safety
/// See [`crate::algorithms`].
pub(crate) async unsafe fn allgather<T: Copy, X: Transport<T>>(
    xs: &[X],
    lv: &Levels,
    full: RawBuf<T>,
    count: usize,
    scratch: RawBuf<T>,
    chunk: usize,
) -> Result<()> {
    in_chunks(xs, scratch, count, lv.columns(chunk), |ch| {
        let ll = LaneLayout::new(lv, ch.len).within(count, ch.start);
        async move {
            let layout = ch.scratch.block(0, ll.total());
            // SAFETY: this chunk's columns of `full` and its own scratch slot.
            let gathered = unsafe { gather_lanes(ch.x, &ll, full, layout) }.await;
            ch.pass_head();
            gathered?;
            if let Some(lane) = lv.lane_group(ch.x) {
                let parts: Vec<_> = (0..lv.nodes.len())
                    .map(|k| {
                        let (s, l) = ll.part(lv.local, k);
                        layout.block(s, l)
                    })
                    .collect();
                // SAFETY: the parts are disjoint ranges of scratch; this node's is complete.
                unsafe { exchange::ring_allgather(&lane, &parts) }.await?;
            }
            let lanes: Vec<_> = ll.lane_blocks().iter().map(|&(s, l)| layout.block(s, l)).collect();
            let node = lv.node_group(ch.x);
            // SAFETY: as above, over the node.
            unsafe { exchange::ring_allgather(&node, &lanes) }.await?;
            // SAFETY: scratch and the receive buffer are disjoint.
            unsafe { ll.permute(layout, full, false) };
            Ok(())
        }
    })
    .await
}

/// The node phase of [`allgather`] on one chunk: the ranks of the node hand their columns to
/// the lane ranks, into `layout`.
///
/// # Safety
/// As for [`allgather`], on one chunk; `layout` is its scratch.
async unsafe fn gather_lanes<T: Copy, X: Transport<T>>(
    x: &X,
    ll: &LaneLayout<'_>,
    full: RawBuf<T>,
    layout: RawBuf<T>,
) -> Result<()> {
    let lv = ll.lv;
    let me = lv.nodes[lv.node][lv.local];
    let own = full.block(me * ll.stride + ll.first, ll.count);
    let (mut sends, mut recvs) = (Vec::new(), Vec::new());
    for l in 0..lv.lanes {
        for (at, j, off, len) in ll.pieces(l, lv.node) {
            let (piece, dst) = (own.block(off, len), layout.block(at, len));
            match (j == lv.local, l == lv.local) {
                // SAFETY: this rank's block into the scratch, disjoint.
                (true, true) => unsafe { dst.copy_from(piece) },
                (true, false) => sends.push((piece, l)),
                (false, true) => recvs.push((dst, j)),
                (false, false) => {}
            }
        }
    }
    // SAFETY: sends read this rank's block, receives write disjoint pieces of scratch.
    unsafe { lv.node_group(x).post(&sends, &recvs) }?.await
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::common::progress::block_on;

    /// Pending `n` times, then ready: lets the pipeline interleave its chunks.
    async fn pending_for(mut n: usize) {
        poll_fn(|_| {
            if n == 0 {
                return Poll::Ready(());
            }
            n -= 1;
            Poll::Pending
        })
        .await;
    }

    /// Runs `count` chunks `depth` deep, chunk `fail` (if any) failing after its head, and
    /// returns the result with the log of `(chunk, event)`.
    fn run_pipeline(count: usize, depth: usize, fail: Option<usize>) -> (Result<()>, Vec<(usize, &'static str)>) {
        let log = Mutex::new(Vec::new());
        let heads = AtomicUsize::new(0);
        let push = |c: usize, what: &'static str| log.lock().unwrap().push((c, what));
        let run = |c: usize| {
            let (heads, push) = (&heads, &push);
            async move {
                push(c, "start");
                pending_for((c * 7) % 5).await;
                heads.fetch_max(c + 1, Ordering::Release);
                push(c, "head");
                if fail == Some(c) {
                    return Err(Error::Progress("chunk failed"));
                }
                pending_for((c * 3) % 7).await;
                push(c, "end");
                Ok(())
            }
        };
        let result = block_on(pipeline(count, depth, &heads, run));
        (result, log.into_inner().unwrap())
    }

    #[test]
    fn the_pipeline_starts_chunks_in_order_and_keeps_its_depth() {
        for (count, depth) in [(0, 3), (1, 3), (7, 1), (7, 3), (9, 4)] {
            let (result, log) = run_pipeline(count, depth, None);
            result.unwrap();
            let at = |c: usize, what: &str| log.iter().position(|&e| e == (c, what)).unwrap();
            for c in 0..count {
                assert!(at(c, "start") < at(c, "head") && at(c, "head") < at(c, "end"));
                if c >= 1 {
                    assert!(at(c - 1, "head") < at(c, "start"), "chunk {c} before its predecessor's head");
                }
                if c >= depth {
                    assert!(at(c - depth, "end") < at(c, "start"), "chunk {c} took a busy slot");
                }
            }
            let mut open = 0usize;
            let mut most = 0;
            for &(_, what) in &log {
                match what {
                    "start" => open += 1,
                    "end" => open -= 1,
                    _ => {}
                }
                most = most.max(open);
            }
            assert!(most <= depth && (count < 2 || depth < 2 || most >= 2), "{most} in flight at depth {depth}");
        }
    }

    #[test]
    fn the_first_error_ends_the_pipeline() {
        let (result, log) = run_pipeline(8, 3, Some(2));
        assert!(matches!(result, Err(Error::Progress("chunk failed"))));
        assert!(!log.contains(&(2, "end")));
        assert!(log.iter().all(|&(c, _)| c <= 5), "chunks started after the failure: {log:?}");
    }

    fn levels(leaders: &[usize], rank: usize) -> Levels {
        Levels::new(&Topology::from_leaders(leaders), rank)
    }

    #[test]
    fn lanes_are_set_by_the_smallest_node() {
        // Nodes {0, 2, 3} and {1}: one lane, so ranks 2 and 3 have none.
        let lv = levels(&[0, 1, 0, 0], 2);
        assert_eq!((lv.node, lv.local, lv.lanes), (0, 1, 1));
        assert!(lv.lane.is_none());
        assert_eq!(levels(&[0, 1, 0, 0], 0).lane, Some(vec![0, 1]));
        assert_eq!(lv.lane_blocks(10), vec![(0, 10), (10, 0), (10, 0)]);
    }

    #[test]
    fn the_lane_layout_is_a_permutation() {
        for (leaders, count) in
            [(vec![0, 0, 2, 2], 3), (vec![0, 1, 0, 1, 0], 5), (vec![0, 1, 2], 4), (vec![0, 0, 0], 1)]
        {
            let lv = levels(&leaders, 0);
            let ll = LaneLayout::new(&lv, count);
            let n = leaders.len() * count;
            let mut seen = vec![0; n];
            let mut covered = vec![0; n];
            for l in 0..lv.lanes {
                for k in 0..lv.nodes.len() {
                    let (s, len) = ll.part(l, k);
                    assert!(s >= ll.lane_range(l).0 && s + len <= ll.lane_range(l).0 + ll.lane_range(l).1);
                    for (at, j, off, len) in ll.pieces(l, k) {
                        for i in 0..len {
                            seen[at + i] += 1;
                            covered[lv.nodes[k][j] * count + off + i] += 1;
                        }
                    }
                }
            }
            assert!(seen.iter().chain(&covered).all(|&c| c == 1), "{leaders:?} {count}");
        }
    }
}
