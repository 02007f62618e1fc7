//! The v-collectives, whose blocks have per-rank lengths and places: allgatherv, alltoallv,
//! gatherv and scatterv. Receive blocks must not overlap; send blocks may.

use super::{Describe, Ranks, placed};
use crate::api::error::Result;
use crate::common::check;
use crate::reliability::crosscheck::Pairs;
use crate::reliability::recorder::{OpKind, Signature};

/// Allgatherv: rank `i`'s `send` (`counts[i]` elements) lands at `recv[displs[i]..]` on every
/// rank. In place this rank's block of `recv` is its input.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allgatherv<'a> {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
    pub(crate) counts: &'a [usize],
    pub(crate) displs: &'a [usize],
}

impl Allgatherv<'_> {
    /// The total count; `counts` and `displs` have one entry per rank when this returns.
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        check::per_rank("allgatherv counts", self.counts, r.size)?;
        check::blocks("allgatherv receive blocks", self.counts, self.displs, self.recv, true)?;
        if let Some(s) = self.send {
            check::len("allgatherv send buffer", s, self.counts[r.rank])?;
        }
        check::total("allgatherv counts", self.counts)
    }
}

impl Describe for Allgatherv<'_> {
    fn signature(&self, _: Ranks) -> Signature {
        placed(Signature::new(OpKind::Allgatherv).counts(self.counts), self.send)
    }
}

/// All-to-all with per-rank counts and displacements: `send[send_displs[j]..][..send_counts[j]]`
/// goes to rank `j`, `recv[recv_displs[i]..][..recv_counts[i]]` comes from rank `i`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Alltoallv<'a> {
    pub(crate) send: usize,
    pub(crate) send_counts: &'a [usize],
    pub(crate) send_displs: &'a [usize],
    pub(crate) recv: usize,
    pub(crate) recv_counts: &'a [usize],
    pub(crate) recv_displs: &'a [usize],
}

impl Alltoallv<'_> {
    /// Every vector has one entry per rank when this returns.
    pub(crate) fn check(&self, r: Ranks) -> Result<()> {
        check::per_rank("alltoallv send counts", self.send_counts, r.size)?;
        check::per_rank("alltoallv receive counts", self.recv_counts, r.size)?;
        check::blocks("alltoallv send blocks", self.send_counts, self.send_displs, self.send, false)?;
        check::blocks("alltoallv receive blocks", self.recv_counts, self.recv_displs, self.recv, true)?;
        let own = (self.recv_counts[r.rank], self.send_counts[r.rank]);
        check::len("alltoallv receive count from this rank itself", own.0, own.1)
    }
}

impl Describe for Alltoallv<'_> {
    fn signature(&self, _: Ranks) -> Signature {
        Signature::new(OpKind::Alltoallv).count(self.send)
    }

    fn pairs(&self, r: Ranks) -> Option<Pairs> {
        Some(Pairs::alltoallv(r.size, self.send_counts, self.recv_counts))
    }
}

/// Gatherv to `root`: rank `i`'s `send` lands at `recv[displs[i]..][..counts[i]]` on the root.
/// `counts` and `displs` are read at the root only. In place the root's own block is in
/// place in `recv` already, and elsewhere `recv` is the contribution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gatherv<'a> {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
    pub(crate) counts: &'a [usize],
    pub(crate) displs: &'a [usize],
    pub(crate) root: usize,
}

impl Gatherv<'_> {
    /// At the root, `counts` and `displs` have one entry per rank when this returns.
    pub(crate) fn check(&self, r: Ranks) -> Result<()> {
        check::rank("gatherv root", self.root, r.size)?;
        if !r.is(self.root) {
            return Ok(());
        }
        check::per_rank("gatherv counts", self.counts, r.size)?;
        check::blocks("gatherv receive blocks", self.counts, self.displs, self.recv, true)?;
        match self.send {
            Some(s) => check::len("gatherv send buffer", s, self.counts[r.rank]),
            None => Ok(()),
        }
    }

    /// This rank's contribution.
    fn mine(&self) -> usize {
        self.send.unwrap_or(self.recv)
    }
}

impl Describe for Gatherv<'_> {
    fn signature(&self, _: Ranks) -> Signature {
        placed(Signature::new(OpKind::Gatherv).count(self.mine()).root(self.root), self.send)
    }

    fn pairs(&self, r: Ranks) -> Option<Pairs> {
        Some(Pairs::gatherv(r.size, r.rank, self.root, self.mine(), self.counts))
    }
}

/// Scatterv from `root`: `send[displs[i]..][..counts[i]]` lands in rank `i`'s `recv`. `send`,
/// `counts` and `displs` are read at the root only. In place the root's `recv` is the send
/// buffer and its own block stays in place.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scatterv<'a> {
    pub(crate) send: Option<usize>,
    pub(crate) counts: &'a [usize],
    pub(crate) displs: &'a [usize],
    pub(crate) recv: usize,
    pub(crate) root: usize,
}

impl Scatterv<'_> {
    /// At the root, `counts` and `displs` have one entry per rank when this returns.
    pub(crate) fn check(&self, r: Ranks) -> Result<()> {
        check::rank("scatterv root", self.root, r.size)?;
        if !r.is(self.root) {
            return Ok(());
        }
        check::per_rank("scatterv counts", self.counts, r.size)?;
        let source = self.send.unwrap_or(self.recv);
        check::blocks("scatterv send blocks", self.counts, self.displs, source, false)?;
        match self.send {
            Some(_) => check::len("scatterv receive buffer", self.recv, self.counts[r.rank]),
            None => Ok(()),
        }
    }
}

impl Describe for Scatterv<'_> {
    fn signature(&self, _: Ranks) -> Signature {
        placed(Signature::new(OpKind::Scatterv).count(self.recv).root(self.root), self.send)
    }

    fn pairs(&self, r: Ranks) -> Option<Pairs> {
        Some(Pairs::scatterv(r.size, r.rank, self.root, self.recv, self.counts))
    }
}
