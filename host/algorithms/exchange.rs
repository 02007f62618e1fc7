//! Data-movement collectives over point-to-point: allgather(v) around a ring, and linear
//! gather(v), scatter(v) and all-to-all(v). The MPI backend uses them when a count or
//! displacement is too large for MPI's `int` arguments (the transport splits messages), and
//! device backends reuse them on staged data.
//!
//! Blocks are given per rank; the caller has already placed this rank's own block where the
//! collective wants it (or it is in place).

use crate::buffer::RawBuf;
use crate::error::Result;
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
