//! Each operation described once: its shape (which buffers, counts, displacements, root, in
//! place), its argument rules with their typed errors, and its [`Signature`] for the
//! cross-rank checks. The backends supply only how the data moves.
//!
//! A backend's method builds the operation's description from the lengths of its buffers
//! ([`Describe`] gives the signature the flight recorder keeps and the signature check
//! compares), and its plan checks the same description's rules before it moves anything. This
//! is NCCL's `ncclInfo` (one description passed through one enqueue path) and Aluminum's one
//! file per operation; `docs/architecture.md` shows where it sits between the public methods
//! and the backends.
//!
//! Descriptions hold lengths, counts and ranks, never an element type, so each rule is
//! compiled once rather than once per element and operator. Only a backend's own limits stay
//! with the backend: a buffer on the wrong device, NCCL's byte counts, MPI's `int` counts,
//! which algorithms it runs, and when a message to this rank itself is refused.

mod docs;
mod list;
mod movement;
mod p2p;
mod reductions;
mod vector;

pub(crate) use docs::op_doc;
pub(crate) use movement::{Allgather, Alltoall, Bcast, Gather, Scatter};
pub(crate) use p2p::{P2p, check_peers};
pub(crate) use reductions::{Allreduce, Reduce, ReduceScatter, ReduceScatterv};
pub(crate) use vector::{Allgatherv, Alltoallv, Gatherv, Scatterv};

use crate::reliability::crosscheck::Pairs;
use crate::reliability::monitor::Monitor;
use crate::reliability::recorder::Signature;

/// The names of operation `$op`'s send and receive buffers (`[send, receive]`), for the device
/// backends' check that an operation's buffers live on their device.
macro_rules! buffers {
    ($op:literal) => {
        [concat!($op, " send buffer"), concat!($op, " receive buffer")]
    };
}
pub(crate) use buffers;

/// Where the calling rank stands: what the rules read besides the call's own arguments.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ranks {
    /// The calling rank.
    pub(crate) rank: usize,
    /// The number of ranks.
    pub(crate) size: usize,
}

impl Ranks {
    fn is(self, root: usize) -> bool {
        self.rank == root
    }
}

/// What every description gives the cross-rank checks.
pub(crate) trait Describe {
    /// The operation's signature, but for its element and operator, which the backend adds
    /// (`.elem::<T>()`, `.reduce::<T, O>()`) where it knows them.
    fn signature(&self, r: Ranks) -> Signature;

    /// The per-pair counts the signature check compares where counts are per pair (gatherv,
    /// scatterv, alltoallv); `None` elsewhere.
    fn pairs(&self, _r: Ranks) -> Option<Pairs> {
        None
    }
}

/// The signature of the operation `call` describes, with its element and operator added by
/// `elem`, and, where `m` runs the signature check on it, its per-pair counts. Not generic, so
/// one copy serves every operation, element and operator.
pub(crate) fn describe(
    m: &Monitor,
    r: Ranks,
    call: &dyn Describe,
    elem: fn(Signature) -> Signature,
) -> (Signature, Option<Pairs>) {
    let sig = elem(call.signature(r));
    let pairs = if m.checks(&sig) { call.pairs(r) } else { None };
    (sig, pairs)
}

/// `sig`, marked in place when the call has no separate send buffer.
fn placed(sig: Signature, send: Option<usize>) -> Signature {
    if send.is_none() { sig.in_place() } else { sig }
}

/// `sig` with the algorithm asked for, if one was.
fn asked(sig: Signature, algorithm: Option<&'static str>) -> Signature {
    algorithm.map_or(sig, |a| sig.algorithm(a))
}
