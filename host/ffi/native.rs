//! Native MPI collectives, described as data and started blocking or non-blocking.
//!
//! Each collective the MPI library runs itself is a [`Native`] value: raw buffer pointers, MPI
//! counts (already checked to fit a C `int`), datatype, operation and root. [`Native::run`]
//! calls the blocking MPI function, [`Native::start`] the `MPI_I*` one. Count and displacement
//! vectors are owned by the value, so a non-blocking call that keeps the value alive until its
//! request completes satisfies MPI's rule that those arrays stay untouched meanwhile.

use std::ffi::{c_int, c_void};

use super::{RawComm, RawDatatype, RawOp, RawRequest, check, sys};
use crate::api::error::Result;

/// A send-buffer pointer that may be `MPI_IN_PLACE`.
pub(crate) type SendPtr = *const c_void;
/// A receive-buffer pointer.
pub(crate) type RecvPtr = *mut c_void;

/// One native MPI collective call.
#[derive(Debug)]
pub(crate) enum Native {
    Barrier,
    Bcast { buf: RecvPtr, count: c_int, root: c_int },
    Allreduce { send: SendPtr, recv: RecvPtr, count: c_int, op: RawOp },
    Reduce { send: SendPtr, recv: RecvPtr, count: c_int, op: RawOp, root: c_int },
    Allgather { send: SendPtr, recv: RecvPtr, count: c_int },
    Allgatherv { send: SendPtr, count: c_int, recv: RecvPtr, counts: Vec<c_int>, displs: Vec<c_int> },
    Alltoall { send: SendPtr, recv: RecvPtr, count: c_int },
    Gather { send: SendPtr, recv: RecvPtr, count: c_int, root: c_int },
    Scatter { send: SendPtr, recv: RecvPtr, count: c_int, root: c_int },
    ReduceScatter { send: SendPtr, recv: RecvPtr, counts: Vec<c_int>, op: RawOp },
}

// SAFETY: the raw pointers are only dereferenced by MPI while the owning operation is in flight,
// and the operation's scope keeps the buffers borrowed for that whole time (see
// `crate::api::request`); moving the description to the progress thread changes nothing about who
// may touch the memory.
unsafe impl Send for Native {}

/// The pointer MPI reads a count or displacement vector through.
fn ptr(v: &[c_int]) -> *const c_int {
    v.as_ptr()
}

impl Native {
    /// Runs the collective with the blocking MPI call.
    ///
    /// # Safety
    /// Every pointer must be valid for the reads and writes MPI makes for this call on this
    /// rank (as computed from the counts, displacements, `dt`'s extent and whether this rank is
    /// the root), receive regions must not overlap each other or any send region except through
    /// `MPI_IN_PLACE`, and `comm`, `dt` and any op must be live handles.
    pub(crate) unsafe fn run(&self, dt: RawDatatype, comm: RawComm) -> Result<()> {
        let (d, c) = (dt.0, comm.0);
        // SAFETY: the caller guarantees buffer validity and handle liveness for exactly the
        // accesses each MPI function makes with these arguments.
        unsafe {
            match self {
                Native::Barrier => check(sys::MPI_Barrier(c), "MPI_Barrier"),
                Native::Bcast { buf, count, root } => check(sys::MPI_Bcast(*buf, *count, d, *root, c), "MPI_Bcast"),
                Native::Allreduce { send, recv, count, op } => {
                    check(sys::MPI_Allreduce(*send, *recv, *count, d, op.0, c), "MPI_Allreduce")
                }
                Native::Reduce { send, recv, count, op, root } => {
                    check(sys::MPI_Reduce(*send, *recv, *count, d, op.0, *root, c), "MPI_Reduce")
                }
                Native::Allgather { send, recv, count } => {
                    check(sys::MPI_Allgather(*send, *count, d, *recv, *count, d, c), "MPI_Allgather")
                }
                Native::Allgatherv { send, count, recv, counts, displs } => check(
                    sys::MPI_Allgatherv(*send, *count, d, *recv, ptr(counts), ptr(displs), d, c),
                    "MPI_Allgatherv",
                ),
                Native::Alltoall { send, recv, count } => {
                    check(sys::MPI_Alltoall(*send, *count, d, *recv, *count, d, c), "MPI_Alltoall")
                }
                Native::Gather { send, recv, count, root } => {
                    check(sys::MPI_Gather(*send, *count, d, *recv, *count, d, *root, c), "MPI_Gather")
                }
                Native::Scatter { send, recv, count, root } => {
                    check(sys::MPI_Scatter(*send, *count, d, *recv, *count, d, *root, c), "MPI_Scatter")
                }
                Native::ReduceScatter { send, recv, counts, op } => {
                    check(sys::MPI_Reduce_scatter(*send, *recv, ptr(counts), d, op.0, c), "MPI_Reduce_scatter")
                }
            }
        }
    }

    /// Starts the collective with the non-blocking `MPI_I*` call.
    ///
    /// # Safety
    /// As for [`Native::run`], and in addition the buffers must stay valid (and receive buffers
    /// otherwise untouched) and `self` must not be dropped until the returned request completes.
    pub(crate) unsafe fn start(&self, dt: RawDatatype, comm: RawComm) -> Result<RawRequest> {
        let (d, c) = (dt.0, comm.0);
        let mut req = RawRequest::null();
        let r = &mut req.0;
        // SAFETY: as for `run`; the caller keeps buffers and `self` (which owns the count
        // vectors) alive until the request completes.
        unsafe {
            match self {
                Native::Barrier => check(sys::MPI_Ibarrier(c, r), "MPI_Ibarrier"),
                Native::Bcast { buf, count, root } => {
                    check(sys::MPI_Ibcast(*buf, *count, d, *root, c, r), "MPI_Ibcast")
                }
                Native::Allreduce { send, recv, count, op } => {
                    check(sys::MPI_Iallreduce(*send, *recv, *count, d, op.0, c, r), "MPI_Iallreduce")
                }
                Native::Reduce { send, recv, count, op, root } => {
                    check(sys::MPI_Ireduce(*send, *recv, *count, d, op.0, *root, c, r), "MPI_Ireduce")
                }
                Native::Allgather { send, recv, count } => {
                    check(sys::MPI_Iallgather(*send, *count, d, *recv, *count, d, c, r), "MPI_Iallgather")
                }
                Native::Allgatherv { send, count, recv, counts, displs } => check(
                    sys::MPI_Iallgatherv(*send, *count, d, *recv, ptr(counts), ptr(displs), d, c, r),
                    "MPI_Iallgatherv",
                ),
                Native::Alltoall { send, recv, count } => {
                    check(sys::MPI_Ialltoall(*send, *count, d, *recv, *count, d, c, r), "MPI_Ialltoall")
                }
                Native::Gather { send, recv, count, root } => {
                    check(sys::MPI_Igather(*send, *count, d, *recv, *count, d, *root, c, r), "MPI_Igather")
                }
                Native::Scatter { send, recv, count, root } => {
                    check(sys::MPI_Iscatter(*send, *count, d, *recv, *count, d, *root, c, r), "MPI_Iscatter")
                }
                Native::ReduceScatter { send, recv, counts, op } => {
                    check(sys::MPI_Ireduce_scatter(*send, *recv, ptr(counts), d, op.0, c, r), "MPI_Ireduce_scatter")
                }
            }?;
        }
        Ok(req)
    }
}
