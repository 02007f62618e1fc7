//! Data-movement collectives over point-to-point: allgather(v) around a ring, and linear
//! gather(v), scatter(v) and all-to-all(v). The MPI backend uses them when a count or
//! displacement is too large for MPI's `int` arguments (the transport splits messages), and
//! device backends reuse them on staged data.
//!
//! Blocks are given per rank; the caller has already placed this rank's own block where the
//! collective wants it (or it is in place).

use crate::api::error::Result;
use crate::common::buffer::RawBuf;
use crate::transport::Transport;

/// Ring allgather(v): `blocks[i]` is rank `i`'s block inside the receive buffer; on entry this
/// rank's own block holds its data.
///
/// # Safety
/// See [`crate::algorithms`]; the blocks must not overlap.
pub(crate) async unsafe fn ring_allgather<T: Copy, X: Transport<T>>(x: &X, blocks: &[RawBuf<T>]) -> Result<()> {
    let (n, me) = (x.size(), x.rank());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    for step in 0..n.saturating_sub(1) {
        let send = blocks[(me + n - step) % n];
        let recv = blocks[(me + n - step - 1) % n];
        // SAFETY: the send block is complete and only read; the receive block is disjoint and
        // written only by this message.
        unsafe { x.post(&[(send, right)], &[(recv, left)]) }?.await?;
    }
    Ok(())
}

/// Linear gather(v) to `root`: `blocks[i]` is where rank `i`'s data lands at the root (ignored
/// elsewhere), `mine` is this rank's contribution (ignored at the root, whose own block is
/// already in place).
///
/// # Safety
/// See [`crate::algorithms`].
pub(crate) async unsafe fn linear_gather<T: Copy, X: Transport<T>>(
    x: &X,
    root: usize,
    mine: RawBuf<T>,
    blocks: &[RawBuf<T>],
) -> Result<()> {
    let me = x.rank();
    if me == root {
        let recvs: Vec<_> = (0..x.size()).filter(|&i| i != root).map(|i| (blocks[i], i)).collect();
        // SAFETY: disjoint receive blocks, written only by their messages.
        unsafe { x.post(&[], &recvs) }?.await
    } else {
        // SAFETY: `mine` is only read.
        unsafe { x.post(&[(mine, root)], &[]) }?.await
    }
}

/// Linear scatter(v) from `root`: `blocks[i]` is rank `i`'s block at the root, `mine` where
/// this rank receives (ignored at the root).
///
/// # Safety
/// See [`crate::algorithms`].
pub(crate) async unsafe fn linear_scatter<T: Copy, X: Transport<T>>(
    x: &X,
    root: usize,
    mine: RawBuf<T>,
    blocks: &[RawBuf<T>],
) -> Result<()> {
    let me = x.rank();
    if me == root {
        let sends: Vec<_> = (0..x.size()).filter(|&i| i != root).map(|i| (blocks[i], i)).collect();
        // SAFETY: send blocks are only read.
        unsafe { x.post(&sends, &[]) }?.await
    } else {
        // SAFETY: `mine` is written only by this receive.
        unsafe { x.post(&[], &[(mine, root)]) }?.await
    }
}

/// All-to-all(v): `send[i]` goes to rank `i`, `recv[i]` comes from rank `i`; the caller copies
/// this rank's own block. All messages are posted at once.
///
/// # Safety
/// See [`crate::algorithms`]; receive blocks disjoint from each other and from send blocks.
pub(crate) async unsafe fn alltoall<T: Copy, X: Transport<T>>(
    x: &X,
    send: &[RawBuf<T>],
    recv: &[RawBuf<T>],
) -> Result<()> {
    let me = x.rank();
    let n = x.size();
    let sends: Vec<_> = (1..n).map(|s| ((me + s) % n, s)).map(|(to, _)| (send[to], to)).collect();
    let recvs: Vec<_> = (1..n).map(|s| (me + n - s) % n).map(|from| (recv[from], from)).collect();
    // SAFETY: guaranteed by the caller.
    unsafe { x.post(&sends, &recvs) }?.await
}

/// Ring allgather(v) after placing this rank's own block: out of place, `send` is copied into
/// `blocks[rank]` first.
///
/// # Safety
/// As [`ring_allgather`]; `send` is distinct from every block.
pub(crate) async unsafe fn allgather_placed<T: Copy, X: Transport<T>>(
    x: &X,
    send: Option<RawBuf<T>>,
    blocks: &[RawBuf<T>],
) -> Result<()> {
    if let Some(s) = send {
        // SAFETY: distinct buffers, guaranteed by the caller.
        unsafe { blocks[x.rank()].copy_from(s) };
    }
    // SAFETY: guaranteed by the caller.
    unsafe { ring_allgather(x, blocks).await }
}

/// Linear gather(v) after placing the root's own block: at the root, an out-of-place send
/// buffer (`own`) is copied into `blocks[root]` first (see [`linear_gather`]).
///
/// # Safety
/// As [`linear_gather`]; `own` is distinct from every block.
pub(crate) async unsafe fn gather_placed<T: Copy, X: Transport<T>>(
    x: &X,
    root: usize,
    own: Option<RawBuf<T>>,
    mine: RawBuf<T>,
    blocks: &[RawBuf<T>],
) -> Result<()> {
    if let (true, Some(own)) = (x.rank() == root, own) {
        // SAFETY: distinct buffers, guaranteed by the caller.
        unsafe { blocks[root].copy_from(own) };
    }
    // SAFETY: guaranteed by the caller.
    unsafe { linear_gather(x, root, mine, blocks).await }
}

/// Linear scatter(v) that also delivers the root's own block: at the root, `blocks[root]` is
/// copied out into an out-of-place receive buffer (`own`) (see [`linear_scatter`]).
///
/// # Safety
/// As [`linear_scatter`]; `own` is distinct from every block.
pub(crate) async unsafe fn scatter_placed<T: Copy, X: Transport<T>>(
    x: &X,
    root: usize,
    own: Option<RawBuf<T>>,
    mine: RawBuf<T>,
    blocks: &[RawBuf<T>],
) -> Result<()> {
    if let (true, Some(own)) = (x.rank() == root, own) {
        // SAFETY: distinct buffers, guaranteed by the caller.
        unsafe { own.copy_from(blocks[root]) };
    }
    // SAFETY: guaranteed by the caller.
    unsafe { linear_scatter(x, root, mine, blocks).await }
}

/// Where [`alltoallv`] reads the blocks it sends.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Source<T> {
    /// The send buffer.
    Send(RawBuf<T>),
    /// In place: scratch as long as the receive buffer, which is copied there first.
    Aside(RawBuf<T>),
}

/// Pairwise all-to-all(v) of blocks of any lengths: block `j` of the send side (`(start, len)`
/// of `sblocks[j]` in `send`) goes to rank `j`, rank `i`'s block lands in `rblocks[i]`, and this
/// rank's own is copied locally. `source` is where the outgoing blocks are read: the send
/// buffer, or, in place (`Aside`), a copy of `recv` made first into the scratch given, since the
/// receive blocks are the same memory.
///
/// # Safety
/// See [`crate::algorithms`]; the receive blocks lie in `recv` and are disjoint; the send
/// buffer (or the scratch, as long as `recv`) is distinct from `recv`.
pub(crate) async unsafe fn alltoallv<T: Copy, X: Transport<T>>(
    x: &X,
    source: Source<T>,
    recv: RawBuf<T>,
    sblocks: &[(usize, usize)],
    rblocks: &[RawBuf<T>],
) -> Result<()> {
    let source = match source {
        Source::Send(s) => s,
        Source::Aside(aside) => {
            // SAFETY: `aside` and `recv` are distinct and exclusive (the caller's guarantee).
            unsafe { aside.copy_from(recv) };
            aside
        }
    };
    let sends: Vec<_> = sblocks.iter().map(|&(start, len)| source.block(start, len)).collect();
    // SAFETY: send blocks are only read; receive blocks are disjoint and distinct from the
    // send side (or its copy).
    unsafe {
        rblocks[x.rank()].copy_from(sends[x.rank()]);
        alltoall(x, &sends, rblocks).await
    }
}
