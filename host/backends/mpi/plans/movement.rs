//! Plans of the collectives that move equal blocks: bcast, allgather, alltoall, gather and
//! scatter.

use std::sync::Arc;

use duralumin_kernels::Element;

use super::super::MpiCommunicator;
use super::super::choice::{AllgatherAlgorithm, BcastAlgorithm};
use super::super::job::{Job, Mode};
use super::*;
use crate::algorithms::hierarchical::{self, Levels};
use crate::algorithms::{bcast, exchange};
use crate::api::error::{Error, Result};
use crate::common::buffer::RawBuf;
use crate::common::check;
use crate::common::datatype::datatype;
use crate::ffi::native::Native;
use crate::ffi::{c_rank, in_place};
use crate::operations::{Allgather, Alltoall, Bcast, Gather, Scatter};

impl MpiCommunicator {
    pub(crate) fn plan_bcast<T: Element>(
        &self,
        buf: &mut [T],
        root: usize,
        algorithm: BcastAlgorithm,
        mode: Mode,
    ) -> Result<Job<T>> {
        Bcast { buf: buf.len(), root, algorithm: None }.check(self.ranks())?;
        let bytes = buf.len().saturating_mul(size_of::<T>());
        let algorithm = match algorithm {
            BcastAlgorithm::Auto => self.auto_bcast(bytes),
            a => a,
        };
        let out = RawBuf::from_mut(buf);
        if algorithm == BcastAlgorithm::Native {
            let calls = self.native_pieces(out.len(), |off, len| {
                Ok(Native::Bcast { buf: at(out, off), count: cnt(len)?, root: c_rank(root) })
            })?;
            return Ok(Job::natives(datatype::<T>()?, calls, Vec::new(), bytes));
        }
        let x = self.transport::<T>(mode)?;
        let chunk = elements::<T>(self.tuning.bcast_chunk_bytes);
        if algorithm == BcastAlgorithm::Hierarchical {
            let topology = Arc::clone(&self.topology);
            return Ok(Job::Future(Box::pin(async move {
                // SAFETY: `buf` is borrowed by the public method for the whole operation.
                unsafe { hierarchical::bcast(&x, &topology, out, root, chunk).await }
            })));
        }
        // SAFETY: as above.
        Ok(Job::Future(Box::pin(async move { unsafe { bcast::chain(&x, out, root, chunk).await } })))
    }

    pub(crate) fn plan_allgather<T: Element>(&self, send: Option<&[T]>, recv: &mut [T], mode: Mode) -> Result<Job<T>> {
        let n = self.size();
        let count = Allgather { send: send.map(<[T]>::len), recv: recv.len() }.check(self.ranks())?;
        let out = RawBuf::from_mut(recv);
        let bytes = out.len().saturating_mul(size_of::<T>());
        match self.allgather_choice::<T>(count) {
            AllgatherAlgorithm::Hierarchical => {
                return self.two_level_allgather(send.map(RawBuf::from_ref), out, count, mode);
            }
            AllgatherAlgorithm::Native => {
                let send = send.map_or(in_place().cast_const(), cptr);
                let call = Native::Allgather { send, recv: out.ptr().cast(), count: cnt(count)? };
                return Ok(Job::native(datatype::<T>()?, call, bytes));
            }
            AllgatherAlgorithm::Ring => {}
        }
        let blocks: Vec<_> = (0..n).map(|i| out.block(i * count, count)).collect();
        self.ring_allgather(send.map(RawBuf::from_ref), blocks, mode)
    }

    /// The two-level allgather ([`hierarchical::allgather`]) of `count` elements per rank into
    /// `out`, after placing this rank's own block.
    fn two_level_allgather<T: Element>(
        &self,
        send: Option<RawBuf<T>>,
        out: RawBuf<T>,
        count: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let core = Arc::clone(&self.core);
        let levels = Levels::new(&self.topology, self.rank());
        let chunk = elements::<T>(self.tuning.hierarchical_chunk_bytes);
        let columns = levels.columns(chunk).min(count);
        let xs = self.chunk_transports::<T>(mode, count.div_ceil(columns))?;
        let own = out.block(self.rank() * count, count);
        let slot = self.size() * columns;
        Ok(Job::Future(Box::pin(async move {
            let mut scratch = core.scratch.take::<T>(slot * xs.len())?;
            // SAFETY: the public method borrows the buffers for the whole operation (the send
            // buffer is a distinct slice); the scratch is this operation's own.
            unsafe {
                if let Some(s) = send {
                    own.copy_from(s);
                }
                hierarchical::allgather(&xs, &levels, out, count, scratch.raw(), chunk).await
            }
        })))
    }

    /// Allgather(v) over the ring ([`exchange::allgather_placed`]).
    pub(super) fn ring_allgather<T: Element>(
        &self,
        send: Option<RawBuf<T>>,
        blocks: Vec<RawBuf<T>>,
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        // SAFETY: the public method borrows the buffers for the whole operation; receive blocks
        // were checked disjoint, and the send buffer is a distinct slice.
        Ok(Job::Future(Box::pin(async move { unsafe { exchange::allgather_placed(&x, send, &blocks).await } })))
    }

    pub(crate) fn plan_alltoall<T: Element>(&self, send: Option<&[T]>, recv: &mut [T], mode: Mode) -> Result<Job<T>> {
        let n = self.size();
        let count = Alltoall { send: send.map(<[T]>::len), recv: recv.len() }.check(self.ranks())?;
        let out = RawBuf::from_mut(recv);
        if self.fits(count) {
            let send = send.map_or(in_place().cast_const(), cptr);
            let call = Native::Alltoall { send, recv: out.ptr().cast(), count: cnt(count)? };
            return Ok(Job::native(datatype::<T>()?, call, bytes_of::<T>(out.len())));
        }
        let counts = vec![count; n];
        let displs = check::packed_displs(&counts);
        self.pairwise_alltoall(send.map(RawBuf::from_ref), &counts, &displs, out, &counts, &displs, mode)
    }

    /// All-to-all(v) over point-to-point ([`exchange::alltoallv`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pairwise_alltoall<T: Element>(
        &self,
        send: Option<RawBuf<T>>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: RawBuf<T>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        let core = Arc::clone(&self.core);
        let sblocks: Vec<(usize, usize)> = send_counts.iter().zip(send_displs).map(|(&c, &d)| (d, c)).collect();
        let rblocks: Vec<_> = recv_counts.iter().zip(recv_displs).map(|(&c, &d)| recv.block(d, c)).collect();
        Ok(Job::Future(Box::pin(async move {
            // In place only: scratch for the outgoing blocks.
            let mut aside = match send {
                Some(_) => None,
                None => Some(core.scratch.take::<T>(recv.len())?),
            };
            let source = match (send, aside.as_mut()) {
                (Some(s), _) => exchange::Source::Send(s),
                (None, Some(a)) => exchange::Source::Aside(a.raw()),
                (None, None) => return Err(Error::Progress("an in-place all-to-all without scratch")),
            };
            // SAFETY: the public method borrows the buffers for the whole operation; receive
            // blocks were checked in range and disjoint; the scratch is this operation's own.
            unsafe { exchange::alltoallv(&x, source, recv, &sblocks, &rblocks).await }
        })))
    }

    pub(crate) fn plan_gather<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        let count = Gather { send: send.map(<[T]>::len), recv: recv.len(), root }.check(self.ranks())?;
        let is_root = self.rank() == root;
        let out = RawBuf::from_mut(recv);
        let mine = send.map_or(out, RawBuf::from_ref);
        if self.fits(count) {
            let (s, r) = match (send.is_some(), is_root) {
                (true, true) => (mine.ptr().cast(), out.ptr().cast()),
                (false, true) => (in_place(), out.ptr().cast()),
                (_, false) => (mine.ptr().cast(), std::ptr::null_mut()),
            };
            let call = Native::Gather { send: s.cast_const(), recv: r, count: cnt(count)?, root: c_rank(root) };
            return Ok(Job::native(datatype::<T>()?, call, bytes_of::<T>(count.saturating_mul(n))));
        }
        let blocks: Vec<_> = (0..n).map(|i| out.block(i * count, count)).collect();
        self.linear(send.map(RawBuf::from_ref), mine, blocks, root, true, mode)
    }

    /// Linear gather (`gather == true`) or scatter over point-to-point
    /// ([`exchange::gather_placed`], [`exchange::scatter_placed`]). At the root, `separate` is
    /// the out-of-place buffer whose own block is copied into (gather) or out of (scatter)
    /// `blocks`; `mine` is this rank's contribution or destination elsewhere.
    pub(super) fn linear<T: Element>(
        &self,
        separate: Option<RawBuf<T>>,
        mine: RawBuf<T>,
        blocks: Vec<RawBuf<T>>,
        root: usize,
        gather: bool,
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        Ok(Job::Future(Box::pin(async move {
            // SAFETY: the public method borrows the buffers for the whole operation; blocks
            // were checked in range (and disjoint where they are written).
            unsafe {
                if gather {
                    exchange::gather_placed(&x, root, separate, mine, &blocks).await
                } else {
                    exchange::scatter_placed(&x, root, separate, mine, &blocks).await
                }
            }
        })))
    }

    pub(crate) fn plan_scatter<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        let count = Scatter { send: send.map(<[T]>::len), recv: recv.len(), root }.check(self.ranks())?;
        let is_root = self.rank() == root;
        let out = RawBuf::from_mut(recv);
        let source = send.map_or(out, RawBuf::from_ref);
        if self.fits(count) {
            let (s, r) = match (send.is_some(), is_root) {
                (true, true) => (source.ptr().cast_const().cast(), out.ptr().cast()),
                (false, true) => (out.ptr().cast_const().cast(), in_place()),
                (_, false) => (std::ptr::null(), out.ptr().cast()),
            };
            let call = Native::Scatter { send: s, recv: r, count: cnt(count)?, root: c_rank(root) };
            return Ok(Job::native(datatype::<T>()?, call, bytes_of::<T>(count.saturating_mul(n))));
        }
        let blocks: Vec<_> =
            if is_root { (0..n).map(|i| source.block(i * count, count)).collect() } else { Vec::new() };
        let separate = send.is_some().then_some(out);
        self.linear(separate, out, blocks, root, false, mode)
    }
}
