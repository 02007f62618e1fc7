//! The Mpi backend's plans: each operation's argument checks (its description in
//! [`crate::operations`]), then either native MPI calls or one of Duralumin's algorithms, as a
//! [`Job`] that runs blocking or on the progress engine. By family, as HostTransfer's.
//!
//! The path is chosen only from values every rank shares (counts that must match, tuning,
//! operator; `super::choice`), so all ranks always take the same one:
//! * counts that fit one MPI call go to the MPI library; larger ones are split (elementwise
//!   operations) or run over point-to-point, whose transport splits messages;
//! * gatherv, scatterv and alltoallv always run Duralumin's linear/pairwise algorithms: their
//!   counts are not known on every rank, so no rank could tell whether another one needs the
//!   large-count path (MPI libraries run these linear too).

mod movement;
mod reductions;
mod vector;

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use duralumin_kernels::{Element, ReduceOp};

use super::MpiCommunicator;
use super::job::{Job, Mode, NativeCalls, Post};
use crate::api::error::{Error, Result};
use crate::common::buffer::RawBuf;
use crate::common::datatype::datatype;
use crate::ffi::native::Native;
use crate::ffi::u32_rank;
use crate::topology::Topology;
use crate::transport::{MpiTransport, OpLabel};

/// Bytes of `elements` elements of `T` (saturating).
fn bytes_of<T>(elements: usize) -> usize {
    elements.saturating_mul(size_of::<T>())
}

/// Whole elements of `T` in a size given in bytes, at least one (a tuning's segment or chunk).
fn elements<T>(bytes: usize) -> usize {
    (bytes / size_of::<T>().max(1)).max(1)
}

/// The most chunks of one hierarchical allreduce in flight at once (see
/// `hierarchical::allreduce`): one in its node-local reduce-scatter, the others on the network or
/// in their allgather.
const HIERARCHICAL_DEPTH: usize = 3;

fn cptr<T>(s: &[T]) -> *const c_void {
    crate::common::buffer::address(s).cast_const().cast()
}

/// `p + off` elements, as a void pointer for MPI.
fn at<T>(p: RawBuf<T>, off: usize) -> *mut c_void {
    p.block(off, 0).ptr().cast()
}

/// `n` as an MPI count. Callers pass counts already checked against
/// `max_message_elements <= c_int::MAX`; one that is not is an error, never a smaller count.
fn cnt(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::CountOverflow { what: "MPI count", value: n as u128 })
}

/// [`cnt`] of every entry.
fn cnts(v: &[usize]) -> Result<Vec<c_int>> {
    v.iter().map(|&n| cnt(n)).collect()
}

fn finish_slice<T: Element, O: ReduceOp<T>>(s: &mut [T], ranks: u32) {
    for x in s {
        *x = O::finish(*x, ranks);
    }
}

/// The finishing step of `O` on `buf`, if it has one.
fn finish<T: Element, O: ReduceOp<T>>(buf: RawBuf<T>, ranks: usize) -> Option<Post<T>> {
    O::HAS_FINISH.then_some(Post::Finish { buf, f: finish_slice::<T, O>, ranks: u32_rank(ranks) })
}

/// `(offset, len)` pieces of at most `max` elements; at least one piece.
fn pieces(len: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    crate::algorithms::segments(len, max)
}

impl MpiCommunicator {
    pub(super) fn fits(&self, n: usize) -> bool {
        n <= self.tuning.max_message_elements
    }

    /// The native calls of an elementwise operation on `n` elements: `call(offset, len)` for
    /// each piece of at most `max_message_elements` (one, but for the largest).
    fn native_pieces(&self, n: usize, mut call: impl FnMut(usize, usize) -> Result<Native>) -> Result<NativeCalls> {
        if self.fits(n) {
            return Ok(smallvec::smallvec![call(0, n)?]);
        }
        pieces(n, self.tuning.max_message_elements).map(|(off, len)| call(off, len)).collect()
    }

    /// A transport of its own (a tag of its own) for the current operation's messages.
    pub(crate) fn transport<T: Element>(&self, mode: Mode) -> Result<MpiTransport> {
        let dt = datatype::<T>()?;
        let tag = self.next_tag(self.current_hash());
        let label =
            self.current.get().map(|(op, _)| OpLabel { name: op.kind.name(), seq: op.seq, layout: self.core.tags });
        let x = MpiTransport::new(
            (self.core.algo, &self.core.algo_matcher),
            dt,
            tag,
            (self.rank(), self.size()),
            self.tuning.max_message_elements,
            mode == Mode::Blocking,
        );
        Ok(x.for_op(label, self.on_error()).with_network(self.network_pieces::<T>()))
    }

    /// The transports of an operation run in `chunks` pipelined chunks
    /// (`hierarchical::in_chunks`): one per chunk in flight, each with its own tag. With
    /// several, they poll (`MPI_Test`) even in a blocking call: a transport that waits
    /// (`MPI_Wait`) would finish each chunk before the next could start.
    fn chunk_transports<T: Element>(&self, mode: Mode, chunks: usize) -> Result<Vec<MpiTransport>> {
        let depth = chunks.clamp(1, HIERARCHICAL_DEPTH);
        let mut xs = (0..depth).map(|_| self.transport::<T>(mode)).collect::<Result<Vec<_>>>()?;
        if depth > 1 {
            xs.iter_mut().for_each(|x| x.blocking = false);
        }
        Ok(xs)
    }

    /// What [`MpiTransport::network`] needs: `None` on one node.
    fn network_pieces<T>(&self) -> Option<(Arc<Topology>, usize)> {
        let elements = elements::<T>(self.tuning.network_message_bytes);
        (self.topology.node_count() > 1).then(|| (Arc::clone(&self.topology), elements))
    }

    fn segment<T>(&self) -> usize {
        elements::<T>(self.tuning.ring_segment_bytes)
    }

    pub(crate) fn plan_barrier<T>(&self) -> Result<Job<T>> {
        Ok(Job::native(datatype::<u8>()?, Native::Barrier, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::cnt;

    /// A count MPI's `int` cannot hold is an error: it once came back clamped to
    /// `c_int::MAX`, which would have moved a different amount of data than asked.
    #[test]
    fn counts_beyond_an_mpi_int_are_refused() {
        assert_eq!(cnt(7).unwrap(), 7);
        assert_eq!(cnt(i32::MAX as usize).unwrap(), i32::MAX);
        assert!(matches!(cnt(i32::MAX as usize + 1), Err(crate::Error::CountOverflow { .. })));
    }
}
