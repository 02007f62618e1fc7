//! Plans of the reductions: allreduce, reduce, reduce-scatter and reduce-scatterv.

use std::sync::Arc;

use duralumin_kernels::{Element, ReduceOp};

use super::super::MpiCommunicator;
use super::super::choice::{AllreduceAlgorithm, ReduceScatterAlgorithm};
use super::super::job::{Job, Mode, Post};
use super::*;
use crate::algorithms::hierarchical::{self, Levels};
use crate::algorithms::reduce_scatter;
use crate::algorithms::{allreduce, reduce};
use crate::api::error::{Error, Result};
use crate::common::buffer::RawBuf;
use crate::common::check;
use crate::common::datatype::{datatype, mpi_op};
use crate::common::reducer::host_reducer;
use crate::ffi::native::Native;
use crate::ffi::{c_rank, in_place, u32_rank};
use crate::operations::{Allreduce, Reduce, ReduceScatter, ReduceScatterv};

impl MpiCommunicator {
    pub(crate) fn plan_allreduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        _op: O,
        algorithm: AllreduceAlgorithm,
        mode: Mode,
    ) -> Result<Job<T>> {
        Allreduce { send: send.map(<[T]>::len), recv: recv.len(), algorithm: None }.check()?;
        let bytes = recv.len().saturating_mul(size_of::<T>());
        algorithm.check_operator::<T, O>()?;
        let algorithm = match algorithm {
            AllreduceAlgorithm::Auto => self.auto_allreduce::<T, O>(bytes, mode),
            a => a,
        };
        let out = RawBuf::from_mut(recv);
        match algorithm {
            AllreduceAlgorithm::Native => self.native_allreduce::<T, O>(send, out),
            AllreduceAlgorithm::SharedMemory => super::super::shm::plan_allreduce::<T, O>(self, send, out, mode),
            _ => self.own_allreduce::<T, O>(send, out, algorithm, mode),
        }
    }

    /// The MPI library's allreduce, in pieces of at most the tuning's message size.
    fn native_allreduce<T: Element, O: ReduceOp<T>>(&self, send: Option<&[T]>, out: RawBuf<T>) -> Result<Job<T>> {
        let (dt, op, n) = (datatype::<T>()?, mpi_op::<T, O>()?, out.len());
        let calls = self.native_pieces(n, |off, len| {
            Ok(Native::Allreduce {
                send: send.map_or(in_place().cast_const(), |s| at(RawBuf::from_ref(s), off).cast_const()),
                recv: at(out, off),
                count: cnt(len)?,
                op,
            })
        })?;
        let post = finish::<T, O>(out, self.size()).into_iter().collect();
        Ok(Job::natives(dt, calls, post, n.saturating_mul(size_of::<T>())))
    }

    /// Duralumin's own allreduce algorithms: the ring, recursive doubling, Rabenseifner's, and
    /// the hierarchical pipeline.
    fn own_allreduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        out: RawBuf<T>,
        algorithm: AllreduceAlgorithm,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = out.len();
        let input = send.map(RawBuf::from_ref);
        let core = Arc::clone(&self.core);
        let seg = self.segment::<T>();
        let reads_input = matches!(algorithm, AllreduceAlgorithm::Ring | AllreduceAlgorithm::Hierarchical);
        let levels = (algorithm == AllreduceAlgorithm::Hierarchical).then(|| Levels::new(&self.topology, self.rank()));
        // One transport for a flat algorithm; one per chunk in flight for the hierarchical
        // pipeline.
        let chunk = elements::<T>(self.tuning.hierarchical_chunk_bytes);
        let xs = self.chunk_transports::<T>(mode, if levels.is_some() { n.div_ceil(chunk) } else { 1 })?;
        Ok(Job::Future(Box::pin(async move {
            let x = xs.first().ok_or(Error::Progress("an allreduce without a transport"))?;
            if let (Some(input), false) = (input, reads_input) {
                // SAFETY: the public method borrows `send` and `recv` (distinct slices) for the
                // whole operation. The ring reads its input in place instead.
                unsafe { out.copy_from(input) };
            }
            let r = host_reducer::<T, O>();
            // The ring's two segment slots; the hierarchical pipeline's for each chunk in flight.
            let slots = if levels.is_some() { n.min(chunk).min(2 * seg) * xs.len() } else { n.min(2 * seg) };
            let scratch_len = if reads_input { slots } else { n };
            let mut scratch = core.scratch.take::<T>(scratch_len)?;
            let tmp = scratch.raw();
            // SAFETY: `out` is borrowed by the operation and `tmp` is its own scratch: valid,
            // exclusive and disjoint until completion.
            unsafe {
                match (algorithm, &levels) {
                    (_, Some(lv)) => hierarchical::allreduce(&xs, &r, lv, input, out, tmp, seg, chunk).await?,
                    (AllreduceAlgorithm::Ring, _) => allreduce::ring(x, &r, input, out, tmp, seg).await?,
                    (AllreduceAlgorithm::RecursiveDoubling, _) => {
                        allreduce::recursive_doubling(x, &r, out, tmp).await?
                    }
                    _ => allreduce::rabenseifner(x, &r, out, tmp).await?,
                }
                r.finish(out.as_mut_slice(), u32_rank(x.size));
            }
            Ok(())
        })))
    }

    pub(crate) fn plan_reduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
        _op: O,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = Reduce { send: send.map(<[T]>::len), recv: recv.len(), root }.check(self.ranks())?;
        let is_root = self.rank() == root;
        let out = RawBuf::from_mut(recv);
        let input = send.map(RawBuf::from_ref);
        if self.use_reduce_ring::<T, O>(n, self.tuning.reduce_root_ring_bytes) {
            return self.ring_reduce::<T, O>(input, out, n, root, mode);
        }
        let dt = datatype::<T>()?;
        let op = mpi_op::<T, O>()?;
        let calls = self.native_pieces(n, |off, len| {
            let (s, r) = match (input, is_root) {
                (Some(i), true) => (at(i, off), at(out, off)),
                (Some(i), false) => (at(i, off), std::ptr::null_mut()),
                (None, true) => (in_place(), at(out, off)),
                (None, false) => (at(out, off), std::ptr::null_mut()),
            };
            Ok(Native::Reduce { send: s.cast_const(), recv: r, count: cnt(len)?, op, root: c_rank(root) })
        })?;
        let post = if is_root { finish::<T, O>(out, self.size()) } else { None };
        Ok(Job::natives(dt, calls, post.into_iter().collect(), bytes_of::<T>(n)))
    }

    pub(crate) fn plan_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        op: O,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        let count = ReduceScatter { send: send.map(<[T]>::len), recv: recv.len() }.check(self.ranks())?;
        if self.reduce_scatter_choice::<T, O>(count) == ReduceScatterAlgorithm::Hierarchical {
            let (input, out) = match send {
                Some(s) => (RawBuf::from_ref(s), RawBuf::from_mut(recv)),
                None => {
                    let all = RawBuf::from_mut(recv);
                    (all, all.block(0, count))
                }
            };
            return self.two_level_reduce_scatter::<T, O>(input, out, mode);
        }
        // Equal blocks go through MPI_Reduce_scatter: Open MPI 4.1's MPI_Reduce_scatter_block
        // is a reduce followed by a scatter, three times slower at 16 MiB in our benchmark.
        self.plan_reduce_scatterv(send, recv, &vec![count; n], op, mode)
    }

    pub(crate) fn plan_reduce_scatterv<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        counts: &[usize],
        _op: O,
        mode: Mode,
    ) -> Result<Job<T>> {
        let (n, me) = (self.size(), self.rank());
        let total = ReduceScatterv { send: send.map(<[T]>::len), recv: recv.len(), counts }.check(self.ranks())?;
        let out = RawBuf::from_mut(recv);
        let displs = check::packed_displs(counts);
        if self.use_reduce_scatter_ring::<T, O>(total) {
            return self.ring_reduce_scatter::<T, O>(send.map(RawBuf::from_ref), out, counts, &displs, mode);
        }
        let dt = datatype::<T>()?;
        let op = mpi_op::<T, O>()?;
        let result = out.block(0, counts[me]);
        if self.fits(total) {
            let call = Native::ReduceScatter {
                send: send.map_or(in_place().cast_const(), cptr),
                recv: out.ptr().cast(),
                counts: cnts(counts)?,
                op,
            };
            return Ok(Job::native(dt, call, bytes_of::<T>(total)).then(finish::<T, O>(result, n)));
        }
        // Too large for one call and not commutative: one (split) reduce per block, to that
        // block's owner, which keeps MPI's rank-order guarantee. Every rank knows the counts, so
        // all issue the same calls in the same order.
        let input = send.map_or(out, RawBuf::from_ref);
        let mut calls = Vec::new();
        for r in 0..n {
            for (off, len) in pieces(counts[r], self.tuning.max_message_elements) {
                let src = at(input, displs[r] + off);
                let (s, d) = match (r == me, send.is_some()) {
                    (true, true) => (src.cast_const(), at(out, off)),
                    (true, false) => (in_place().cast_const(), src),
                    (false, _) => (src.cast_const(), std::ptr::null_mut()),
                };
                calls.push(Native::Reduce { send: s, recv: d, count: cnt(len)?, op, root: c_rank(r) });
            }
        }
        let mut post = Vec::new();
        if send.is_none() {
            post.push(Post::MoveToFront { buf: out, from: displs[me], len: counts[me] });
        }
        post.extend(finish::<T, O>(result, n));
        Ok(Job::natives(dt, calls.into(), post, bytes_of::<T>(total)))
    }

    /// The two-level reduce-scatter ([`hierarchical::reduce_scatter`]) of `input` (every
    /// rank's blocks) into `out` (this rank's), then the operator's finishing step.
    fn two_level_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        input: RawBuf<T>,
        out: RawBuf<T>,
        mode: Mode,
    ) -> Result<Job<T>> {
        let core = Arc::clone(&self.core);
        let levels = Levels::new(&self.topology, self.rank());
        let seg = self.segment::<T>();
        let n = self.size();
        let chunk = elements::<T>(self.tuning.hierarchical_chunk_bytes);
        let columns = levels.columns(chunk).min(out.len());
        let xs = self.chunk_transports::<T>(mode, out.len().div_ceil(columns))?;
        // A chunk's lane-major input, then the ring's two segment slots.
        let slot = n * columns + (n * columns).min(2 * seg);
        Ok(Job::Future(Box::pin(async move {
            let r = host_reducer::<T, O>();
            let mut scratch = core.scratch.take::<T>(slot * xs.len())?;
            // SAFETY: the public method borrows the buffers for the whole operation (`out` may
            // lie inside `input` in place, which the algorithm allows); the scratch is this
            // operation's own.
            unsafe {
                hierarchical::reduce_scatter(&xs, &r, &levels, input, out, scratch.raw(), seg, chunk).await?;
                r.finish(out.as_mut_slice(), u32_rank(n));
            }
            Ok(())
        })))
    }

    /// Reduce-scatter(v) over the ring ([`reduce_scatter::ring_blocks`]), then the operator's
    /// finishing step.
    fn ring_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<RawBuf<T>>,
        out: RawBuf<T>,
        counts: &[usize],
        displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        let core = Arc::clone(&self.core);
        let seg = self.segment::<T>();
        let (own, n) = (counts[self.rank()], self.size());
        let blocks: Vec<(usize, usize)> = displs.iter().copied().zip(counts.iter().copied()).collect();
        let scratch_len = reduce_scatter::ring_blocks_scratch(send.is_some(), &blocks, seg);
        Ok(Job::Future(Box::pin(async move {
            let r = host_reducer::<T, O>();
            let mut scratch = core.scratch.take::<T>(scratch_len)?;
            // SAFETY: the public method borrows the buffers for the whole operation; scratch is
            // this operation's own.
            unsafe {
                reduce_scatter::ring_blocks(&x, &r, send, out, &blocks, scratch.raw(), seg).await?;
                r.finish(out.block(0, own).as_mut_slice(), u32_rank(n));
            }
            Ok(())
        })))
    }

    /// A large reduce over the ring ([`reduce::ring`]), then the operator's finishing step at
    /// the root.
    fn ring_reduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<RawBuf<T>>,
        out: RawBuf<T>,
        len: usize,
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        // The gather has a tag of its own, so its messages can never meet the ring's.
        let xg = self.transport::<T>(mode)?;
        let core = Arc::clone(&self.core);
        let seg = self.segment::<T>();
        let (is_root, n) = (self.rank() == root, self.size());
        let scratch_len = reduce::ring_scratch(len, n, is_root, seg);
        Ok(Job::Future(Box::pin(async move {
            let r = host_reducer::<T, O>();
            let mut scratch = core.scratch.take::<T>(scratch_len)?;
            // SAFETY: the public method borrows the buffers for the whole operation (the
            // root's is the full-size result); scratch is this operation's own.
            unsafe {
                reduce::ring(&x, &xg, &r, send.unwrap_or(out), out, root, scratch.raw(), seg).await?;
                if is_root {
                    r.finish(out.as_mut_slice(), u32_rank(n));
                }
            }
            Ok(())
        })))
    }
}
