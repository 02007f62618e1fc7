//! Running one rank's part of a case on the Mpi backend or on HostTransfer over the host
//! device, blocking (stream-ordered) or non-blocking.

use duralumin::backends::host_transfer;
use duralumin::device::host::HostDevice;
use duralumin::{Error, MpiCommunicator, Request, Sum, scope};

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
    macro_rules! call {
        ($name:ident / $iname:ident ($($arg:expr),*)) => {
            if nonblocking { c.$iname($($arg),*).and_then(|r| r.wait()) } else { c.$name($($arg),*) }
        };
    }
    match case.op {
        Op::Allreduce => call!(allreduce / iallreduce(send, recv, Sum)),
        Op::AllreduceInPlace => call!(allreduce_in_place / iallreduce_in_place(recv, Sum)),
        Op::Bcast => call!(bcast / ibcast(recv, a.root)),
        Op::Reduce => call!(reduce / ireduce(send, recv, a.root, Sum)),
        Op::Allgather => call!(allgather / iallgather(send, recv)),
        Op::Allgatherv => call!(allgatherv / iallgatherv(send, recv, &a.counts, &a.displs)),
        Op::Alltoall => call!(alltoall / ialltoall(send, recv)),
        Op::Alltoallv => call!(alltoallv / ialltoallv(send, &a.counts, &a.displs, recv, &a.counts2, &a.displs2)),
        Op::Gather => call!(gather / igather(send, recv, a.root)),
        Op::Gatherv => call!(gatherv / igatherv(send, recv, &a.counts, &a.displs, a.root)),
        Op::Scatter => call!(scatter / iscatter(send, recv, a.root)),
        Op::Scatterv => call!(scatterv / iscatterv(send, &a.counts, &a.displs, recv, a.root)),
        Op::ReduceScatter => call!(reduce_scatter / ireduce_scatter(send, recv, Sum)),
        Op::ReduceScatterv => call!(reduce_scatterv / ireduce_scatterv(send, recv, &a.counts, Sum)),
        Op::SendRecv => call!(sendrecv / isendrecv(send, a.root, recv, a.source, a.tag)),
    }?;
    c.synchronize()?;
    dev.download(&recv_dev)
}
