//! Point-to-point transport for Duralumin's own algorithms.
//!
//! Algorithms ([`crate::algorithms`]) are written once against the [`Transport`] trait: post a
//! set of sends and receives, do other work (reduce the previous segment), then await the set.
//! [`MpiTransport`] implements it over `MPI_Isend`/`MPI_Irecv`, splitting any buffer larger than
//! the per-message limit (by default `i32::MAX` elements, MPI's `int` count) into several
//! messages, so algorithms never see a count limit.

use std::ffi::c_int;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use duralumin_kernels::Element;

use crate::buffer::RawBuf;
use crate::error::{Error, Result};
use crate::ffi::{RawComm, RawDatatype, RawRequest, c_rank, p2p};
use crate::topology::Topology;

/// A point-to-point transport between the ranks of one communicator.
pub(crate) trait Transport<T>: Send + Sync {
    /// The set of posted messages; completes when all of them have.
    type Pending: Future<Output = Result<()>> + Send;

    fn rank(&self) -> usize;
    fn size(&self) -> usize;

    /// Posts `sends` (block, destination) and `recvs` (block, source) and returns at once.
    ///
    /// # Safety
    /// Send blocks must stay valid for reads and unmodified, receive blocks valid for writes
    /// and otherwise untouched, until the returned value completes or is dropped; receive blocks
    /// must not overlap each other or any send block.
    unsafe fn post(&self, sends: &[(RawBuf<T>, usize)], recvs: &[(RawBuf<T>, usize)]) -> Result<Self::Pending>;
}

/// The ranks `members` of transport `x` as a transport of their own: rank `i` of the group is
/// rank `members[i]` of `x`. The hierarchical algorithms run their node-local and cross-node
/// phases on groups of one communicator; messages keep the operation's tag, which is safe because
/// MPI never lets two messages between one pair of ranks overtake each other and every phase
/// posts them in the same order on both sides.
#[derive(Debug)]
pub(crate) struct Group<'a, X> {
    x: &'a X,
    members: &'a [usize],
    me: usize,
}

impl<'a, X> Group<'a, X> {
    /// The group of `members` (ranks of `x`, distinct) as seen by its member `me` (an index
    /// into `members`).
    pub(crate) fn new(x: &'a X, members: &'a [usize], me: usize) -> Self {
        Group { x, members, me }
    }

    fn map<T>(&self, list: &[(RawBuf<T>, usize)]) -> Vec<(RawBuf<T>, usize)> {
        list.iter().map(|&(b, i)| (b, self.members[i])).collect()
    }
}

impl<T, X: Transport<T>> Transport<T> for Group<'_, X> {
    type Pending = X::Pending;

    fn rank(&self) -> usize {
        self.me
    }

    fn size(&self) -> usize {
        self.members.len()
    }

    unsafe fn post(&self, sends: &[(RawBuf<T>, usize)], recvs: &[(RawBuf<T>, usize)]) -> Result<Self::Pending> {
        // SAFETY: the same messages under the members' ranks in `x`; the caller's guarantees
        // carry over unchanged.
        unsafe { self.x.post(&self.map(sends), &self.map(recvs)) }
    }
}

/// MPI point-to-point on a communicator reserved for Duralumin's algorithms, one tag per
/// operation.
#[derive(Clone, Debug)]
pub(crate) struct MpiTransport {
    pub(crate) comm: RawComm,
    pub(crate) dt: RawDatatype,
    pub(crate) tag: c_int,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The most elements one MPI message carries.
    pub(crate) max_count: usize,
    /// Where the ranks run and the most elements one message to a rank on another node
    /// carries ([`Tuning::network_message_bytes`](crate::Tuning::network_message_bytes)).
    /// `None`: every peer gets `max_count`.
    pub(crate) network: Option<(Arc<Topology>, usize)>,
    /// Complete with `MPI_Wait` (a blocking call on the caller's thread) rather than by
    /// polling `MPI_Test` (an operation on the progress engine).
    pub(crate) blocking: bool,
}

/// Messages posted by [`MpiTransport`].
#[derive(Debug)]
pub(crate) struct MpiPending {
    reqs: Vec<RawRequest>,
    /// For each request that is a receive: (request index, elements expected, source).
    recvs: Vec<(usize, usize, usize)>,
    dt: RawDatatype,
    blocking: bool,
}

impl<T: Element> Transport<T> for MpiTransport {
    type Pending = MpiPending;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    unsafe fn post(&self, sends: &[(RawBuf<T>, usize)], recvs: &[(RawBuf<T>, usize)]) -> Result<MpiPending> {
        let mut pending = MpiPending { reqs: Vec::new(), recvs: Vec::new(), dt: self.dt, blocking: self.blocking };
        // Receives first, so a message arriving early finds its buffer.
        for &(buf, from) in recvs {
            for (start, len) in pieces(buf.len(), self.max_to(from)) {
                let piece = buf.block(start, len);
                let count = count(len)?;
                // SAFETY: the caller keeps the block valid and untouched until `pending`
                // completes or is dropped (Drop cancels and completes it).
                let req = unsafe { p2p::irecv(piece.ptr().cast(), count, self.dt, c_rank(from), self.tag, self.comm) }?;
                pending.recvs.push((pending.reqs.len(), len, from));
                pending.reqs.push(req);
            }
        }
        for &(buf, to) in sends {
            for (start, len) in pieces(buf.len(), self.max_to(to)) {
                let piece = buf.block(start, len);
                let count = count(len)?;
                // SAFETY: as above, for reads.
                let req = unsafe { p2p::isend(piece.ptr().cast(), count, self.dt, c_rank(to), self.tag, self.comm) }?;
                pending.reqs.push(req);
            }
        }
        Ok(pending)
    }
}

impl MpiTransport {
    /// The most elements one message to or from `peer` carries. Both ends of a pair compute
    /// the same value, so they cut a buffer into the same messages.
    fn max_to(&self, peer: usize) -> usize {
        let max = self.max_count.clamp(1, c_int::MAX as usize);
        match &self.network {
            Some((topology, net)) if topology.node_of(peer) != topology.node_of(self.rank) => max.min((*net).max(1)),
            _ => max,
        }
    }
}

/// A message's `len` elements as MPI's count. `post` cuts messages at `c_int::MAX` elements, so
/// this does not fail.
fn count(len: usize) -> Result<c_int> {
    c_int::try_from(len).map_err(|_| Error::CountOverflow { what: "MPI count", value: len as u128 })
}

/// Splits `len` elements into messages of at most `max`; an empty buffer is one empty message,
/// so sender and receiver always agree on the number of messages.
fn pieces(len: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    let n = len.div_ceil(max).max(1);
    (0..n).map(move |i| (i * max, max.min(len - (i * max).min(len))))
}

impl MpiPending {
    fn complete_one(&mut self, i: usize, status: &crate::ffi::sys::MPI_Status) -> Result<()> {
        if let Some(&(_, expected, peer)) = self.recvs.iter().find(|r| r.0 == i) {
            let received = p2p::received_count(status, self.dt)?;
            if received != expected {
                return Err(Error::CountMismatch { what: "message", peer, expected, received });
            }
        }
        Ok(())
    }

    fn poll_all(&mut self) -> Result<bool> {
        let mut all = true;
        for i in 0..self.reqs.len() {
            if self.reqs[i].0 == RawRequest::null().0 {
                continue;
            }
            let status =
                if self.blocking { Some(p2p::wait(&mut self.reqs[i])?) } else { p2p::test(&mut self.reqs[i])? };
            match status {
                Some(status) => {
                    self.complete_one(i, &status)?;
                    crate::progress::made_progress();
                }
                None => all = false,
            }
        }
        Ok(all)
    }
}

impl Future for MpiPending {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        match this.poll_all() {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl Drop for MpiPending {
    fn drop(&mut self) {
        // An error path can leave messages posted: make sure MPI no longer touches the buffers
        // before they are released.
        for req in &mut self.reqs {
            p2p::cancel_and_wait(req);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::pieces;

    #[test]
    fn pieces_cover_the_buffer() {
        assert_eq!(pieces(0, 4).collect::<Vec<_>>(), vec![(0, 0)]);
        assert_eq!(pieces(4, 4).collect::<Vec<_>>(), vec![(0, 4)]);
        assert_eq!(pieces(9, 4).collect::<Vec<_>>(), vec![(0, 4), (4, 4), (8, 1)]);
    }
}
