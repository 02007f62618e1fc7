//! Point-to-point transport for Duralumin's own algorithms.
//!
//! Algorithms ([`crate::algorithms`]) are written once against the [`Transport`] trait: post a
//! set of sends and receives, do other work (reduce the previous segment), then await the set.
//! [`MpiTransport`] implements it over MPI point-to-point, splitting any buffer larger than the
//! per-message limit (by default `i32::MAX` elements, MPI's `int` count) into several messages,
//! so algorithms never see a count limit. What another rank sends is untrusted: a receive takes
//! a message only once its length is known to be the expected one ([`matcher`]), and an
//! algorithm's messages carry its operation's signature in their tags ([`tag`]), so the
//! messages of calls that differ never meet.

mod matcher;
pub(crate) mod tag;

use std::ffi::c_int;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use duralumin_kernels::Element;

use crate::algorithms::segments;
use crate::api::error::{Error, Result};
use crate::common::buffer::RawBuf;
use crate::ffi::{RawComm, RawDatatype, RawRequest, c_rank, p2p};
use crate::topology::Topology;
pub(crate) use matcher::Matcher;
use matcher::{Few, Misfit, Progress, SlotId};
pub(crate) use tag::TagLayout;

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

/// The collective an algorithm transport's messages belong to, for its errors and for telling a
/// peer's messages of another call apart ([`TagLayout::differs`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OpLabel {
    /// The operation (`"allreduce"`).
    pub(crate) name: &'static str,
    /// Its number on the communicator.
    pub(crate) seq: u64,
    pub(crate) layout: TagLayout,
}

/// What a set of messages does with sends still in flight when its operation fails (it is
/// dropped before it completes). MPI cannot take a send back, and a peer in another call never
/// receives it.
#[derive(Clone, Debug)]
pub(crate) enum OnError {
    /// Wait for them: the peer may still receive them (point-to-point, or a communicator with
    /// no deadline and no ULFM, whose operations are never given up).
    Wait,
    /// Revoke the communicator first (ULFM), which completes them, then wait.
    Revoke,
    /// Let them complete in the background. Only where the failure ends the job
    /// ([`OnTimeout::Abort`](crate::reliability::OnTimeout::Abort)) or the operation's buffers
    /// belong to the library: its shadow copies and staging are leaked with the operation, and
    /// `leaked`, once set, makes the communicator's scratch memory never return to the heap.
    /// Once `revoked` is set (the program revoked the communicator, or MPI said another rank
    /// did: under `Abort` too, whose operations may read the caller's own buffers) they are
    /// waited for instead ([`OnError::disposal`]).
    Abandon { leaked: Arc<AtomicBool>, revoked: Arc<AtomicBool> },
}

/// What a dropped set of messages does with its sends still in flight.
#[derive(Debug, PartialEq, Eq)]
enum Disposal {
    /// Wait for them.
    Wait,
    /// Revoke the communicator (its pending requests then complete soon), then wait.
    RevokeThenWait,
    /// Hand them to MPI (`MPI_Request_free`) and set the leak flag.
    Free,
}

impl OnError {
    /// What becomes of the sends. Abandoned sends may read the caller's own buffers (under
    /// `OnTimeout::Abort`, whose failures end the job before the caller has them back): after
    /// a revocation (this rank's `revoke`, or another rank's that MPI reported), the one way
    /// the job goes on under `Abort`, they complete soon and are waited for, so that the caller
    /// never gets back a buffer MPI still reads (`docs/reliability.md`).
    fn disposal(&self) -> Disposal {
        match self {
            OnError::Wait => Disposal::Wait,
            OnError::Revoke => Disposal::RevokeThenWait,
            OnError::Abandon { revoked, .. } if revoked.load(Ordering::Acquire) => Disposal::Wait,
            OnError::Abandon { .. } => Disposal::Free,
        }
    }
}

/// MPI point-to-point on a communicator reserved for Duralumin's algorithms, one tag per
/// transport (or a user's tag, on the user's point-to-point communicator).
#[derive(Clone, Debug)]
pub(crate) struct MpiTransport {
    pub(crate) comm: RawComm,
    /// The communicator's expected receives.
    pub(crate) matcher: Arc<Matcher>,
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
    /// Complete by polling on the caller's thread until done (a blocking call) rather than
    /// one poll at a time (an operation on the progress engine).
    pub(crate) blocking: bool,
    /// The collective the messages belong to; `None` for a user's point-to-point messages.
    pub(crate) label: Option<OpLabel>,
    pub(crate) on_error: OnError,
}

/// Messages posted by [`MpiTransport`].
#[derive(Debug)]
pub(crate) struct MpiPending {
    matcher: Arc<Matcher>,
    comm: RawComm,
    tag: c_int,
    /// The receives not yet complete.
    recvs: Few<SlotId>,
    /// The sends not yet complete.
    sends: Few<RawRequest>,
    /// Empty receives posted ahead ([`MpiTransport::signal`]), not yet complete, and their
    /// sources.
    signals: Few<(RawRequest, c_int)>,
    blocking: bool,
    label: Option<OpLabel>,
    on_error: OnError,
    /// Polls that left a receive waiting (see [`DIAGNOSE_EVERY`]).
    polls: u32,
}

/// How often a poll that leaves a receive waiting for its message looks at what its peer sent
/// first instead ([`MpiPending::diagnose`]).
const DIAGNOSE_EVERY: u32 = 32;

impl<T: Element> Transport<T> for MpiTransport {
    type Pending = MpiPending;

    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    unsafe fn post(&self, sends: &[(RawBuf<T>, usize)], recvs: &[(RawBuf<T>, usize)]) -> Result<MpiPending> {
        let mut pending = self.pending();
        // Receives first, so a message arriving early is claimed in order.
        for &(buf, from) in recvs {
            for (start, len) in segments(buf.len(), self.max_to(from)) {
                let piece = buf.block(start, len);
                let count = count(len)?;
                // SAFETY: the caller keeps the block valid and untouched until `pending`
                // completes or is dropped (which releases the receive: `MpiPending`'s Drop).
                let id = unsafe { self.matcher.expect(c_rank(from), self.tag, piece.ptr().cast(), count, self.dt) };
                pending.recvs.push(id);
            }
        }
        for &(buf, to) in sends {
            for (start, len) in segments(buf.len(), self.max_to(to)) {
                let piece = buf.block(start, len);
                let count = count(len)?;
                // SAFETY: as above, for reads.
                let req = unsafe { p2p::isend(piece.ptr().cast(), count, self.dt, c_rank(to), self.tag, self.comm) }?;
                pending.sends.push(req);
            }
        }
        Ok(pending)
    }
}

impl MpiTransport {
    /// An empty message to `to` and one from `from`, whose receive is posted ahead rather than
    /// claimed by length (claiming costs a message a trip through MPI's unexpected queue): for
    /// a tag whose messages are all empty, so that no receive of it is claimed (the
    /// shared-memory allreduce's barriers). The receive's buffer is the trap page
    /// ([`os::trap_page`](crate::ffi::os::trap_page)): a longer message, which only a peer in
    /// another call whose tag collides could send, is MPI's truncation error or faults, and is
    /// never written into memory of ours. Without a trap page, the receive is claimed.
    pub(crate) fn signal(&self, to: usize, from: usize) -> Result<MpiPending> {
        let empty = RawBuf::<u8>::from_raw(std::ptr::null_mut(), 0);
        let Some(trap) = crate::ffi::os::trap_page() else {
            // SAFETY: zero-length messages: no memory is read or written.
            return unsafe { Transport::<u8>::post(self, &[(empty, to)], &[(empty, from)]) };
        };
        let mut pending = self.pending();
        // SAFETY: a receive of zero elements into the trap page, which MPI may write only by
        // faulting (see above); nothing of ours is there.
        let req = unsafe { p2p::irecv(trap, 0, self.dt, c_rank(from), self.tag, self.comm) }?;
        pending.signals.push((req, c_rank(from)));
        // SAFETY: zero elements: MPI reads no memory.
        pending.sends.push(unsafe { p2p::isend(empty.ptr().cast(), 0, self.dt, c_rank(to), self.tag, self.comm) }?);
        Ok(pending)
    }

    /// An empty set of this transport's messages.
    fn pending(&self) -> MpiPending {
        MpiPending {
            matcher: Arc::clone(&self.matcher),
            comm: self.comm,
            tag: self.tag,
            recvs: Few::new(),
            sends: Few::new(),
            signals: Few::new(),
            blocking: self.blocking,
            label: self.label,
            on_error: self.on_error.clone(),
            polls: 0,
        }
    }

    /// Messages of elements `dt` with `tag` on `comm` (whose expected receives `matcher`
    /// keeps), whose ranks are `0..size` (this one `rank`), at most `max_count` elements each
    /// whoever the peer; completed on the caller's thread (`blocking`) or by polling. A user's
    /// point-to-point messages until [`MpiTransport::for_op`] says otherwise.
    pub(crate) fn new(
        (comm, matcher): (RawComm, &Arc<Matcher>),
        dt: RawDatatype,
        tag: c_int,
        (rank, size): (usize, usize),
        max_count: usize,
        blocking: bool,
    ) -> Self {
        MpiTransport {
            comm,
            matcher: Arc::clone(matcher),
            dt,
            tag,
            rank,
            size,
            max_count,
            network: None,
            blocking,
            label: None,
            on_error: OnError::Wait,
        }
    }

    /// The messages of collective `label`, with `on_error` for sends its failure leaves.
    pub(crate) fn for_op(self, label: Option<OpLabel>, on_error: OnError) -> Self {
        MpiTransport { label, on_error, ..self }
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
    /// The error of a receive that found a message of another length.
    fn misfit(&self, m: Misfit) -> Error {
        let Some(op) = self.label else {
            return match m.elements {
                Some(received) => {
                    Error::CountMismatch { what: "message", peer: m.source, expected: m.expected, received }
                }
                None => Error::CountMismatch {
                    what: "message (bytes, not a whole number of elements)",
                    peer: m.source,
                    expected: m.expected,
                    received: usize::try_from(m.bytes).unwrap_or(usize::MAX),
                },
            };
        };
        let what = match m.elements {
            Some(e) => {
                format!("rank {} sent a message of {e} elements where this rank expects {}", m.source, m.expected)
            }
            None => format!(
                "rank {} sent a message of {} bytes, not a whole number of this rank's elements (it expects {})",
                m.source, m.bytes, m.expected
            ),
        };
        Error::Mismatch { op: op.name, seq: op.seq, peer: m.source, what, report: String::new() }
    }

    /// A receive is still waiting: whether the first message its peer sent instead belongs to
    /// this operation with another signature (the peer called something else), which is then
    /// the error. Only algorithm messages carry signatures.
    fn diagnose(&self) -> Result<()> {
        let Some(op) = self.label else { return Ok(()) };
        let mut sources = self.matcher.waiting_sources(&self.recvs);
        sources.extend(self.signals.iter().map(|s| s.1));
        for source in sources {
            if let Some(seen) = p2p::head_tag(source, self.comm)?
                && op.layout.differs(self.tag, seen)
            {
                let peer = usize::try_from(source).unwrap_or(usize::MAX);
                let what = format!(
                    "rank {peer} is in this collective with another call: its messages carry another signature \
                     (tag {seen}; this rank's {})",
                    self.tag
                );
                return Err(Error::Mismatch { op: op.name, seq: op.seq, peer, what, report: String::new() });
            }
        }
        Ok(())
    }

    /// Completes what has arrived (or, blocking, everything); true once nothing is left. Each
    /// call looks only at the messages still pending.
    fn poll_all(&mut self) -> Result<bool> {
        loop {
            let progress = if self.recvs.is_empty() { Progress::Done } else { self.matcher.poll(&mut self.recvs)? };
            if let Progress::Failed(m) = progress {
                return Err(self.misfit(m));
            }
            test_all(&mut self.sends, |r| r)?;
            test_all(&mut self.signals, |s| &mut s.0)?;
            if progress == Progress::Done && self.sends.is_empty() && self.signals.is_empty() {
                return Ok(true);
            }
            if progress == Progress::Pending || !self.signals.is_empty() {
                self.polls = self.polls.wrapping_add(1);
                if self.polls % DIAGNOSE_EVERY == 0 {
                    self.diagnose()?;
                }
            }
            if !self.blocking {
                return Ok(false);
            }
        }
    }
}

/// Tests the request of every entry of `reqs` and drops the completed ones.
fn test_all<E>(reqs: &mut Few<E>, req: impl Fn(&mut E) -> &mut RawRequest) -> Result<()> {
    let mut i = 0;
    while i < reqs.len() {
        if p2p::test_p2p(req(&mut reqs[i]))?.is_some() {
            reqs.swap_remove(i);
            crate::common::progress::made_progress();
        } else {
            i += 1;
        }
    }
    Ok(())
}

impl Future for MpiPending {
    type Output = Result<()>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        match this.poll_all() {
            Ok(true) => Poll::Ready(Ok(())),
            Ok(false) => Poll::Pending,
            Err(e) => {
                if let (Error::Revoked, OnError::Abandon { revoked, .. }) = (&e, &this.on_error) {
                    // Another rank revoked the communicator: what is pending on it completes
                    // soon, so the sends are waited for when this is dropped (`disposal`).
                    revoked.store(true, Ordering::Release);
                }
                Poll::Ready(Err(e))
            }
        }
    }
}

impl Drop for MpiPending {
    fn drop(&mut self) {
        // An error path can leave messages in flight: make sure MPI no longer touches the
        // buffers before they are released, or that they are never released (see `OnError`).
        for (req, _) in &mut self.signals {
            p2p::cancel_and_wait(req);
        }
        if self.recvs.is_empty() && self.sends.is_empty() {
            return;
        }
        let disposal = self.on_error.disposal();
        if disposal == Disposal::RevokeThenWait {
            let _ = crate::ffi::ulfm::revoke(self.comm);
        }
        self.matcher.release(&self.recvs);
        for req in &mut self.sends {
            match (&disposal, &self.on_error) {
                (Disposal::Free, OnError::Abandon { leaked, .. }) => {
                    leaked.store(true, Ordering::Release);
                    // SAFETY: the operation's failure ends the job, or its buffers are the
                    // library's and never freed once `leaked` is set (see `OnError::Abandon`).
                    unsafe { p2p::request_free(req) };
                }
                _ => p2p::cancel_and_wait(req),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sends abandoned with their operation are handed to MPI unless the program revoked the
    /// communicator, which completes them; the other ways always wait.
    #[test]
    fn abandoned_sends_are_waited_for_once_the_communicator_is_revoked() {
        let revoked = Arc::new(AtomicBool::new(false));
        let abandon = OnError::Abandon { leaked: Arc::default(), revoked: Arc::clone(&revoked) };
        assert_eq!(abandon.disposal(), Disposal::Free);
        revoked.store(true, Ordering::Release);
        assert_eq!(abandon.disposal(), Disposal::Wait);
        assert_eq!(OnError::Wait.disposal(), Disposal::Wait);
        assert_eq!(OnError::Revoke.disposal(), Disposal::RevokeThenWait);
    }

    fn transport(rank: usize, max_count: usize, leaders: &[usize], net: usize) -> MpiTransport {
        let topology = Arc::new(Topology::from_leaders(leaders));
        flat(rank, leaders.len(), max_count).with_network(Some((topology, net)))
    }

    /// A transport whose handles are never used: `max_to` reads only the limits.
    fn flat(rank: usize, size: usize, max_count: usize) -> MpiTransport {
        let dt = crate::common::datatype::datatype::<u8>().unwrap();
        let world = crate::ffi::world();
        MpiTransport::new((world, &Arc::new(Matcher::new(world))), dt, 0, (rank, size), max_count, true)
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
