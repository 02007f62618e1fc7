//! The collectives that move equal blocks: bcast, allgather, alltoall, gather and scatter.

use super::{Describe, Ranks, asked, placed};
use crate::api::error::Result;
use crate::common::check;
use crate::reliability::recorder::{OpKind, Signature};

/// Broadcast of the root's `buf` into every rank's `buf`, equal lengths everywhere.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bcast {
    pub(crate) buf: usize,
    pub(crate) root: usize,
    /// The algorithm's name where one was asked for (`_with`).
    pub(crate) algorithm: Option<&'static str>,
}

impl Bcast {
    pub(crate) fn check(&self, r: Ranks) -> Result<()> {
        check::rank("bcast root", self.root, r.size)
    }
}

impl Describe for Bcast {
    fn signature(&self, _: Ranks) -> Signature {
        asked(Signature::new(OpKind::Bcast).count(self.buf).root(self.root), self.algorithm)
    }
}

/// Allgather: rank `i`'s `send` (`c` elements) lands at `recv[i*c..]` on every rank,
/// `recv` holding `size * c`. In place this rank's block of `recv` is its input.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Allgather {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
}

impl Allgather {
    /// The block length `c`.
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        match self.send {
            Some(s) => {
                let all = check::product("allgather", s, r.size)?;
                check::len("allgather receive buffer", self.recv, all).map(|()| s)
            }
            None => check::divisible("allgather buffer (size * count)", self.recv, r.size),
        }
    }
}

impl Describe for Allgather {
    fn signature(&self, r: Ranks) -> Signature {
        let count = self.send.unwrap_or(self.recv / r.size.max(1));
        placed(Signature::new(OpKind::Allgather).count(count), self.send)
    }
}

/// All-to-all: block `j` of `send` goes to rank `j`, block `i` of `recv` comes from rank `i`;
/// both hold `size * c` elements. In place `recv`'s blocks are sent and replaced.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Alltoall {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
}

impl Alltoall {
    /// The block length `c`.
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        if let Some(s) = self.send {
            check::len("alltoall receive buffer", self.recv, s)?;
        }
        check::divisible("alltoall buffer (size * count)", self.recv, r.size)
    }
}

impl Describe for Alltoall {
    fn signature(&self, _: Ranks) -> Signature {
        placed(Signature::new(OpKind::Alltoall).count(self.send.unwrap_or(self.recv)), self.send)
    }
}

/// Gather to `root`: rank `i`'s `send` (`c` elements) lands at `recv[i*c..]` on the root
/// (`size * c`); `recv` is not used elsewhere. In place the root's `recv` holds its own block
/// already, and elsewhere `recv` is the contribution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gather {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
    pub(crate) root: usize,
}

impl Gather {
    /// The block length `c` (this rank's contribution off the root).
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        check::rank("gather root", self.root, r.size)?;
        match (self.send, r.is(self.root)) {
            (Some(s), true) => {
                let all = check::product("gather", s, r.size)?;
                check::len("gather receive buffer", self.recv, all).map(|()| s)
            }
            (Some(s), false) => Ok(s),
            (None, true) => check::divisible("gather buffer (size * count)", self.recv, r.size),
            (None, false) => Ok(self.recv),
        }
    }
}

impl Describe for Gather {
    fn signature(&self, r: Ranks) -> Signature {
        let sig = Signature::new(OpKind::Gather).root(self.root);
        match self.send {
            Some(s) => sig.count(s),
            None => sig.block_count(self.recv, r.rank, self.root, r.size).in_place(),
        }
    }
}

/// Scatter from `root`: block `i` of the root's `send` (`size * c` elements) lands in rank
/// `i`'s `recv` (`c`); `send` is not used elsewhere. In place the root's `recv` holds every
/// block and keeps its own.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scatter {
    pub(crate) send: Option<usize>,
    pub(crate) recv: usize,
    pub(crate) root: usize,
}

impl Scatter {
    /// The block length `c`.
    pub(crate) fn check(&self, r: Ranks) -> Result<usize> {
        check::rank("scatter root", self.root, r.size)?;
        match (self.send, r.is(self.root)) {
            (Some(s), true) => {
                let all = check::product("scatter", self.recv, r.size)?;
                check::len("scatter send buffer", s, all).map(|()| self.recv)
            }
            (None, true) => check::divisible("scatter buffer (size * count)", self.recv, r.size),
            (_, false) => Ok(self.recv),
        }
    }
}

impl Describe for Scatter {
    fn signature(&self, r: Ranks) -> Signature {
        let sig = Signature::new(OpKind::Scatter).root(self.root);
        match self.send {
            Some(_) => sig.count(self.recv),
            None => sig.block_count(self.recv, r.rank, self.root, r.size).in_place(),
        }
    }
}
