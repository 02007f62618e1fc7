//! Pipelined broadcasts: the buffer is cut into chunks that flow down a chain
//! (`root -> root+1 -> ...`) or any tree, so every link is busy at once and a large broadcast
//! costs about one buffer transfer plus a chunk transfer per level, instead of `log2 n` full
//! transfers. The hierarchical broadcast runs the same pipeline over a two-level tree.

use std::collections::VecDeque;

use super::{segment, segment_count};
use crate::api::error::Result;
use crate::common::buffer::RawBuf;
use crate::transport::Transport;

/// Receives (and sends) kept in flight per rank. Two measured best on 2 cores at 4 ranks (64 MiB:
/// 0.64x native with 2, 0.69x with 4, 0.78x with 8): more outstanding copies only contend.
const WINDOW: usize = 2;

/// Broadcasts `buf` from `root` down a chain, `chunk` elements at a time.
///
/// # Safety
/// See [`crate::algorithms`]: `buf` valid and exclusive until the future completes.
pub(crate) async unsafe fn chain<T: Copy, X: Transport<T>>(
    x: &X,
    buf: RawBuf<T>,
    root: usize,
    chunk: usize,
) -> Result<()> {
    let (n, me) = (x.size(), x.rank());
    let rel = (me + n - root) % n;
    let parent = (rel != 0).then_some((me + n - 1) % n);
    let next: Vec<usize> = (rel + 1 < n).then_some((me + 1) % n).into_iter().collect();
    // SAFETY: forwarded from the caller.
    unsafe { pipeline(x, buf, parent, &next, chunk) }.await
}

/// Broadcasts down any tree, pipelined: this rank receives each chunk from `parent` (`None` at
/// the root, which has the data) and forwards it to every rank of `children` (one message per
/// child and chunk, children in the order given). Every rank of the tree must run it with the
/// same `chunk`.
///
/// # Safety
/// See [`crate::algorithms`]: `buf` valid and exclusive until the future completes.
pub(crate) async unsafe fn pipeline<T: Copy, X: Transport<T>>(
    x: &X,
    buf: RawBuf<T>,
    parent: Option<usize>,
    children: &[usize],
    chunk: usize,
) -> Result<()> {
    let count = segment_count(buf.len(), chunk);
    let chunk_at = |k: usize| {
        let (o, l) = segment(buf.len(), chunk, k);
        buf.block(o, l)
    };
    let mut sends: VecDeque<X::Pending> = VecDeque::new();
    let mut recvs: VecDeque<X::Pending> = VecDeque::new();
    let mut posted = 0;
    if let Some(prev) = parent {
        while posted < count.min(WINDOW) {
            // SAFETY: each chunk is written only by its receive until it completes.
            recvs.push_back(unsafe { x.post(&[], &[(chunk_at(posted), prev)]) }?);
            posted += 1;
        }
    }
    for c in (0..count).map(chunk_at) {
        if let Some(prev) = parent {
            if let Some(r) = recvs.pop_front() {
                r.await?;
            }
            if posted < count {
                // SAFETY: as above.
                recvs.push_back(unsafe { x.post(&[], &[(chunk_at(posted), prev)]) }?);
                posted += 1;
            }
        }
        if !children.is_empty() {
            let to: Vec<_> = children.iter().map(|&child| (c, child)).collect();
            // SAFETY: chunk k is complete (received or the root's data) and only read from now.
            sends.push_back(unsafe { x.post(&to, &[]) }?);
            if sends.len() > WINDOW {
                if let Some(s) = sends.pop_front() {
                    s.await?;
                }
            }
        }
    }
    while let Some(s) = sends.pop_front() {
        s.await?;
    }
    Ok(())
}
