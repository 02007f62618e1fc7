//! Running one rank's part of a case on the Mpi backend, on HostTransfer over the host device,
//! or on NCCL over a CUDA device, blocking (stream-ordered) or non-blocking.

use duralumin::backends::host_transfer;
use duralumin::device::cpu::HostDevice;
use duralumin::device::cuda::CudaDevice;
use duralumin::{Error, MpiCommunicator, NcclCommunicator, Request, Sum, scope};

use crate::case::{Case, Op};

/// The variant's name, for comparing with the model's.
pub fn kind(e: &Error) -> &'static str {
    match e {
        Error::BufferLength { .. } => "BufferLength",
        Error::VectorLength { .. } => "VectorLength",
        Error::DisplacementOutOfRange { .. } => "DisplacementOutOfRange",
        Error::DisplacementOverlap { .. } => "DisplacementOverlap",
        Error::RankOutOfRange { .. } => "RankOutOfRange",
        Error::SelfMessage { .. } => "SelfMessage",
        Error::InvalidTag { .. } => "InvalidTag",
        Error::CountOverflow { .. } => "CountOverflow",
        Error::SignatureMismatch { .. } => "SignatureMismatch",
        Error::CountMismatch { .. } => "CountMismatch",
        Error::Mpi { .. } => "Mpi",
        Error::Timeout { .. } => "Timeout",
        Error::Aborted { .. } => "Aborted",
        _ => "another error",
    }
}

/// Rank `me`'s part of `case` on the Mpi communicator `c`: its receive buffer afterwards.
pub fn mpi(c: &MpiCommunicator, case: &Case, me: usize, nonblocking: bool) -> Result<Vec<u64>, Error> {
    let a = &case.args[me];
    let (send, mut recv) = case.inputs(me);
    let (send, recv_buf) = (&send[..], &mut recv[..]);
    macro_rules! call {
        ($name:ident / $iname:ident ($($arg:expr),*)) => {
            if nonblocking {
                scope(|s| {
                    let mut r = c.$iname(s, $($arg),*)?;
                    // A test first (it polls), then the wait.
                    r.test()?;
                    Request::wait(r)
                })
            } else {
                c.$name($($arg),*)
            }
        };
    }
    match case.op {
        Op::Allreduce => call!(allreduce / iallreduce(send, recv_buf, Sum)),
        Op::AllreduceInPlace => call!(allreduce_in_place / iallreduce_in_place(recv_buf, Sum)),
        Op::Bcast => call!(bcast / ibcast(recv_buf, a.root)),
        Op::Reduce => call!(reduce / ireduce(send, recv_buf, a.root, Sum)),
        Op::Allgather => call!(allgather / iallgather(send, recv_buf)),
        Op::Allgatherv => call!(allgatherv / iallgatherv(send, recv_buf, &a.counts, &a.displs)),
        Op::Alltoall => call!(alltoall / ialltoall(send, recv_buf)),
        Op::Alltoallv => {
            call!(alltoallv / ialltoallv(send, &a.counts, &a.displs, recv_buf, &a.counts2, &a.displs2))
        }
        Op::Gather => call!(gather / igather(send, recv_buf, a.root)),
        Op::Gatherv => call!(gatherv / igatherv(send, recv_buf, &a.counts, &a.displs, a.root)),
        Op::Scatter => call!(scatter / iscatter(send, recv_buf, a.root)),
        Op::Scatterv => call!(scatterv / iscatterv(send, &a.counts, &a.displs, recv_buf, a.root)),
        Op::ReduceScatter => call!(reduce_scatter / ireduce_scatter(send, recv_buf, Sum)),
        Op::ReduceScatterv => call!(reduce_scatterv / ireduce_scatterv(send, recv_buf, &a.counts, Sum)),
        Op::SendRecv => call!(sendrecv / isendrecv(send, a.root, recv_buf, a.source, a.tag)),
    }?;
    Ok(recv)
}

/// The blocking form of an operation on `c`, or the non-blocking one and its request's wait.
macro_rules! device_call {
    ($c:ident, $nonblocking:ident, $name:ident / $iname:ident ($($arg:expr),*)) => {
        if $nonblocking { $c.$iname($($arg),*).and_then(|r| r.wait()) } else { $c.$name($($arg),*) }
    };
}

/// `op` with rank arguments `a` on the stream-ordered communicator `c` (device buffers `send`
/// and `recv`), by [`device_call!`].
macro_rules! on_device {
    ($c:expr, $op:expr, $a:expr, $send:expr, $recv:expr, $nonblocking:expr) => {{
        let (c, a, send, recv, nb) = ($c, $a, $send, $recv, $nonblocking);
        match $op {
            Op::Allreduce => device_call!(c, nb, allreduce / iallreduce(send, recv, Sum)),
            Op::AllreduceInPlace => device_call!(c, nb, allreduce_in_place / iallreduce_in_place(recv, Sum)),
            Op::Bcast => device_call!(c, nb, bcast / ibcast(recv, a.root)),
            Op::Reduce => device_call!(c, nb, reduce / ireduce(send, recv, a.root, Sum)),
            Op::Allgather => device_call!(c, nb, allgather / iallgather(send, recv)),
            Op::Allgatherv => device_call!(c, nb, allgatherv / iallgatherv(send, recv, &a.counts, &a.displs)),
            Op::Alltoall => device_call!(c, nb, alltoall / ialltoall(send, recv)),
            Op::Alltoallv => {
                device_call!(c, nb, alltoallv / ialltoallv(send, &a.counts, &a.displs, recv, &a.counts2, &a.displs2))
            }
            Op::Gather => device_call!(c, nb, gather / igather(send, recv, a.root)),
            Op::Gatherv => device_call!(c, nb, gatherv / igatherv(send, recv, &a.counts, &a.displs, a.root)),
            Op::Scatter => device_call!(c, nb, scatter / iscatter(send, recv, a.root)),
            Op::Scatterv => device_call!(c, nb, scatterv / iscatterv(send, &a.counts, &a.displs, recv, a.root)),
            Op::ReduceScatter => device_call!(c, nb, reduce_scatter / ireduce_scatter(send, recv, Sum)),
            Op::ReduceScatterv => device_call!(c, nb, reduce_scatterv / ireduce_scatterv(send, recv, &a.counts, Sum)),
            Op::SendRecv => device_call!(c, nb, sendrecv / isendrecv(send, a.root, recv, a.source, a.tag)),
        }
    }};
}

/// Rank `me`'s part of `case` on the HostTransfer communicator `c` (stream-ordered, then a
/// synchronize; or non-blocking, then the request's wait and a synchronize).
pub fn ht(
    c: &host_transfer::HostTransferCommunicator<HostDevice>,
    dev: &HostDevice,
    case: &Case,
    me: usize,
    nonblocking: bool,
) -> Result<Vec<u64>, Error> {
    let a = &case.args[me];
    let (send, recv) = case.inputs(me);
    let send = dev.upload(&send)?;
    let mut recv_dev = dev.upload(&recv)?;
    let (send, recv) = (&send, &mut recv_dev);
    on_device!(c, case.op, a, send, recv, nonblocking)?;
    c.synchronize()?;
    dev.download(&recv_dev)
}

/// Rank `me`'s part of `case` on the NCCL communicator `c`, as [`ht`].
pub fn nccl(c: &NcclCommunicator<CudaDevice>, case: &Case, me: usize, nonblocking: bool) -> Result<Vec<u64>, Error> {
    let (a, dev, stream) = (&case.args[me], c.device(), c.stream());
    let (send, recv) = case.inputs(me);
    let send = dev.upload(stream, &send)?;
    let mut recv_dev = dev.upload(stream, &recv)?;
    let (send, recv) = (&send, &mut recv_dev);
    on_device!(c, case.op, a, send, recv, nonblocking)?;
    c.synchronize()?;
    dev.download(stream, &recv_dev)
}
