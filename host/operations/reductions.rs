//! The reductions: allreduce, reduce, reduce-scatter and reduce-scatterv.

use super::{Describe, Ranks, asked, placed};
use crate::api::error::Result;
use crate::common::check;
use crate::reliability::recorder::{OpKind, Signature};

/// Allreduce: `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank, equal lengths
/// everywhere. In place (`send: None`) `recv` is the input too.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allreduce {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
    /// The algorithm's name where one was asked for (`_with`).
    pub(crate) algorithm: Option<&'static str>,
}

impl Allreduce {
    /// The element count.
    pub(crate) fn check(&self) -> Result<usize> {
        if let Some(s) = self.send {
            check::len("allreduce receive buffer", self.recv, s)?;
        }
        Ok(self.recv)
    }
}

impl Describe for Allreduce {
    fn signature(&self, _: Ranks) -> Signature {
        let sig = Signature::new(OpKind::Allreduce).count(self.send.unwrap_or(self.recv));
        asked(placed(sig, self.send), self.algorithm)
    }
}

/// Reduce to `root`: at the root `recv` (as long as `send`) receives the reduction; elsewhere
/// `recv` is not used. In place `recv` is every rank's input.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reduce {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
    pub(crate) root: usize,
}

impl Reduce {
    /// The element count.
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        check::rank("reduce root", self.root, r.size)?;
        match self.send {
            Some(s) if r.is(self.root) => check::len("reduce receive buffer", self.recv, s).map(|()| s),
            Some(s) => Ok(s),
            None => Ok(self.recv),
        }
    }
}

impl Describe for Reduce {
    fn signature(&self, _: Ranks) -> Signature {
        let sig = Signature::new(OpKind::Reduce).count(self.send.unwrap_or(self.recv)).root(self.root);
        placed(sig, self.send)
    }
}

/// Reduce-scatter with equal blocks: `send` holds `size` blocks of `recv` elements and rank
/// `i` receives the reduction of block `i`. In place `recv` holds the `size` blocks and the
/// result lands at its front (MPI's `MPI_IN_PLACE` convention).
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReduceScatter {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
}

impl ReduceScatter {
    /// The block length.
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        match self.send {
            Some(s) => {
                let all = check::product("reduce_scatter", self.recv, r.size)?;
                check::len("reduce_scatter send buffer", s, all).map(|()| self.recv)
            }
            None => check::divisible("reduce_scatter buffer (size * count)", self.recv, r.size),
        }
    }
}

impl Describe for ReduceScatter {
    fn signature(&self, r: Ranks) -> Signature {
        let count = if self.send.is_some() { self.recv } else { self.recv / r.size.max(1) };
        placed(Signature::new(OpKind::ReduceScatter).count(count), self.send)
    }
}

/// Reduce-scatter with per-rank counts: `send` holds the blocks back to back (`sum(counts)`
/// elements) and rank `i` receives block `i` (`counts[i]`). In place `recv` holds the blocks
/// and the result lands at its front.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ReduceScatterv<'a> {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
    pub(crate) counts: &'a [usize],
}

impl ReduceScatterv<'_> {
    /// The total count; `counts` has one entry per rank when this returns.
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        check::per_rank("reduce_scatterv counts", self.counts, r.size)?;
        let total = check::total("reduce_scatterv counts", self.counts)?;
        match self.send {
            Some(s) => {
                check::len("reduce_scatterv send buffer", s, total)?;
                check::len("reduce_scatterv receive buffer", self.recv, self.counts[r.rank])?;
            }
            None => check::len("reduce_scatterv buffer", self.recv, total)?,
        }
        Ok(total)
    }
}

impl Describe for ReduceScatterv<'_> {
    fn signature(&self, _: Ranks) -> Signature {
        placed(Signature::new(OpKind::ReduceScatterv).counts(self.counts), self.send)
    }
}
