//! Point-to-point operations: send, recv, sendrecv (out of place and in place) and
//! multi-sendrecv. When a message to this rank itself is refused is the backend's own rule: it
//! depends on how the backend matches messages.

use super::{Describe, Ranks};
use crate::api::error::Result;
use crate::common::check;
use crate::reliability::recorder::{OpKind, Signature};

/// A point-to-point operation: `len` elements to `peer` (the destination; the source of a
/// receive) with `tag`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct P2p {
    pub(crate) kind: OpKind,
    /// The elements sent (received, for a receive; in all, for a multi-sendrecv).
    pub(crate) len: usize,
    /// The peer, where there is one.
    pub(crate) peer: Option<usize>,
    pub(crate) tag: i32,
    /// A sendrecv whose buffer is replaced.
    pub(crate) in_place: bool,
}

impl Describe for P2p {
    fn signature(&self, _: Ranks) -> Signature {
        let sig = Signature::new(self.kind).count(self.len).tag(self.tag);
        let sig = self.peer.map_or(sig, |p| sig.root(p));
        if self.in_place { sig.in_place() } else { sig }
    }
}

/// Checks a point-to-point operation's tag (`0..=max_tag`, the backend's limit) and the peers
/// of its sends (`dests`) and receives (`sources`).
pub(crate) fn check_peers(
    tag: i32,
    max_tag: i32,
    dests: impl IntoIterator<Item = usize>,
    sources: impl IntoIterator<Item = usize>,
    r: Ranks,
) -> Result<()> {
    check::tag(tag, max_tag)?;
    dests.into_iter().try_for_each(|d| check::rank("destination rank", d, r.size))?;
    sources.into_iter().try_for_each(|s| check::rank("source rank", s, r.size))
}
