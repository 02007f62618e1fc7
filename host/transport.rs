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

use crate::algorithms::segments;
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
    /// Every message not yet complete: its request and, for a receive, `(elements expected,
    /// source)` to check against its status.
    reqs: Vec<(RawRequest, Option<(usize, usize)>)>,
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
        let mut pending = MpiPending { reqs: Vec::new(), dt: self.dt, blocking: self.blocking };
        // Receives first, so a message arriving early finds its buffer.
        for &(buf, from) in recvs {
            for (start, len) in segments(buf.len(), self.max_to(from)) {
                let piece = buf.block(start, len);
                let count = count(len)?;
                // SAFETY: the caller keeps the block valid and untouched until `pending`
                // completes or is dropped (Drop cancels and completes it).
                let req = unsafe { p2p::irecv(piece.ptr().cast(), count, self.dt, c_rank(from), self.tag, self.comm) }?;
                pending.reqs.push((req, Some((len, from))));
            }
        }
        for &(buf, to) in sends {
            for (start, len) in segments(buf.len(), self.max_to(to)) {
                let piece = buf.block(start, len);
                let count = count(len)?;
                // SAFETY: as above, for reads.
                let req = unsafe { p2p::isend(piece.ptr().cast(), count, self.dt, c_rank(to), self.tag, self.comm) }?;
                pending.reqs.push((req, None));
            }
        }
        Ok(pending)
    }
}

impl MpiTransport {
    /// Messages of elements `dt` with `tag` on `comm`, whose ranks are `0..size` (this one
    /// `rank`), at most `max_count` elements each whoever the peer; completed by waiting
    /// (`blocking`) or by polling.
    pub(crate) fn new(
        comm: RawComm,
        dt: RawDatatype,
        tag: c_int,
        (rank, size): (usize, usize),
        max_count: usize,
        blocking: bool,
    ) -> Self {
        MpiTransport { comm, dt, tag, rank, size, max_count, network: None, blocking }
    }

    /// Cuts messages to ranks on another node of `topology` at `elements`.
    pub(crate) fn with_network(self, network: Option<(Arc<Topology>, usize)>) -> Self {
        MpiTransport { network, ..self }
    }

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

impl MpiPending {
    /// Checks a completed receive's length against what was expected.
    fn check(&self, expected: Option<(usize, usize)>, status: &crate::ffi::sys::MPI_Status) -> Result<()> {
        if let Some((expected, peer)) = expected {
            let received = p2p::received_count(status, self.dt)?;
            if received != expected {
                return Err(Error::CountMismatch { what: "message", peer, expected, received });
            }
        }
        Ok(())
    }

    /// Completes what has arrived (or, blocking, everything); true once nothing is left. Each
    /// call looks only at the messages still pending.
    fn poll_all(&mut self) -> Result<bool> {
        let mut i = 0;
        while i < self.reqs.len() {
            let (req, expected) = &mut self.reqs[i];
            let expected = *expected;
            let status = if self.blocking { Some(p2p::wait(req)?) } else { p2p::test(req)? };
            match status {
                Some(status) => {
                    self.reqs.swap_remove(i);
                    self.check(expected, &status)?;
                    crate::progress::made_progress();
                }
                None => i += 1,
            }
        }
        Ok(self.reqs.is_empty())
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
        for (req, _) in &mut self.reqs {
            p2p::cancel_and_wait(req);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(rank: usize, max_count: usize, leaders: &[usize], net: usize) -> MpiTransport {
        let topology = Arc::new(Topology::from_leaders(leaders));
        flat(rank, leaders.len(), max_count).with_network(Some((topology, net)))
    }

    /// A transport whose handles are never used: `max_to` reads only the limits.
    fn flat(rank: usize, size: usize, max_count: usize) -> MpiTransport {
        let dt = crate::datatype::datatype::<u8>().unwrap();
        MpiTransport::new(crate::ffi::world(), dt, 0, (rank, size), max_count, true)
    }

    #[test]
    #[cfg_attr(miri, ignore = "reads MPI's handle constants (foreign statics)")]
    fn only_messages_to_other_nodes_are_cut_to_the_network_size() {
        // Nodes {0, 1} and {2, 3}.
        let leaders = [0, 0, 2, 2];
        for rank in 0..4 {
            let x = transport(rank, 1000, &leaders, 16);
            for peer in 0..4 {
                let same_node = leaders[peer] == leaders[rank];
                assert_eq!(x.max_to(peer), if same_node { 1000 } else { 16 }, "{rank} -> {peer}");
                // Both ends of a pair cut alike.
                assert_eq!(x.max_to(peer), transport(peer, 1000, &leaders, 16).max_to(rank));
            }
        }
        // The smaller limit wins, a zero limit means one element, and no topology cuts nothing.
        assert_eq!(transport(0, 8, &leaders, 16).max_to(2), 8);
        assert_eq!(transport(0, 8, &leaders, 0).max_to(2), 1);
        assert_eq!(flat(0, 4, usize::MAX).max_to(3), c_int::MAX as usize);
    }
}
