//! The MPI library's own operation on host vectors of the same size (`--native`), through
//! rsmpi on the world communicator: the baseline every row can be read against.

use duralumin::mpi::collective::SystemOperation;
use duralumin::mpi::datatype::{Equivalence, Partition, PartitionMut};
use duralumin::mpi::topology::{Communicator as _, SimpleCommunicator};
use duralumin::mpi::traits::*;

use crate::call::Layout;
use crate::ops::{Coll, Redop};
use crate::spec::{Buffers, PerfElem, Shape};

/// Whether MPI has the operation itself (no v-form reduce-scatter in rsmpi, no average
/// operator, no single call for a multi-send-receive).
pub fn has(coll: Coll, redop: Redop) -> bool {
    !(matches!(coll, Coll::ReduceScatterv | Coll::MultiSendrecv) || coll.reduces() && redop == Redop::Avg)
}

fn system_op(redop: Redop) -> SystemOperation {
    match redop {
        Redop::Prod => SystemOperation::product(),
        Redop::Min => SystemOperation::min(),
        Redop::Max => SystemOperation::max(),
        Redop::Sum | Redop::Avg => SystemOperation::sum(),
    }
}

fn i32s(v: &[usize]) -> Vec<i32> {
    v.iter().map(|&x| i32::try_from(x).unwrap_or(i32::MAX)).collect()
}

/// Host buffers of one native call, kept between calls.
pub struct Native<T> {
    send: Vec<T>,
    recv: Vec<T>,
    counts: Vec<i32>,
    displs: Vec<i32>,
}

/// One call of MPI's own operation, whatever the element type.
pub trait NativeCall {
    /// One call of MPI's operation of `s` on `w`.
    fn call(&mut self, w: &SimpleCommunicator, s: &Shape);
}

impl<T: PerfElem + Equivalence> Native<T> {
    /// MPI's buffers for `s`, starting as `b` (the out-of-place form's).
    pub fn new(s: &Shape, b: &Buffers<T>) -> Native<T> {
        let lay = Layout::of(s);
        Native { send: b.send.clone(), recv: b.recv.clone(), counts: i32s(&lay.counts), displs: i32s(&lay.displs) }
    }
}

impl<T: PerfElem + Equivalence> NativeCall for Native<T> {
    fn call(&mut self, w: &SimpleCommunicator, s: &Shape) {
        let rank = |r: usize| w.process_at_rank(i32::try_from(r).unwrap_or(0));
        let root = rank(s.root);
        let is_root = s.rank == s.root;
        let (send, recv, counts, displs) = (&self.send[..], &mut self.recv[..], &self.counts[..], &self.displs[..]);
        match s.coll {
            Coll::Allreduce => w.all_reduce_into(send, recv, system_op(s.redop)),
            Coll::Reduce if is_root => root.reduce_into_root(send, recv, system_op(s.redop)),
            Coll::Reduce => root.reduce_into(send, system_op(s.redop)),
            Coll::ReduceScatter => w.reduce_scatter_block_into(send, recv, system_op(s.redop)),
            Coll::Bcast => root.broadcast_into(recv),
            Coll::Allgather => w.all_gather_into(send, recv),
            Coll::Allgatherv => w.all_gather_varcount_into(send, &mut PartitionMut::new(recv, counts, displs)),
            Coll::Alltoall => w.all_to_all_into(send, recv),
            Coll::Alltoallv => w.all_to_all_varcount_into(
                &Partition::new(send, counts, displs),
                &mut PartitionMut::new(recv, counts, displs),
            ),
            Coll::Gather if is_root => root.gather_into_root(send, recv),
            Coll::Gather => root.gather_into(send),
            Coll::Gatherv if is_root => {
                root.gather_varcount_into_root(send, &mut PartitionMut::new(recv, counts, displs))
            }
            Coll::Gatherv => root.gather_varcount_into(send),
            Coll::Scatter if is_root => root.scatter_into_root(send, recv),
            Coll::Scatter => root.scatter_into(recv),
            Coll::Scatterv if is_root => root.scatter_varcount_into_root(&Partition::new(send, counts, displs), recv),
            Coll::Scatterv => root.scatter_varcount_into(recv),
            Coll::Sendrecv => {
                duralumin::mpi::point_to_point::send_receive_into(send, &rank(s.next()), recv, &rank(s.prev()));
            }
            Coll::SendRecvPair => match s.pair() {
                Some((to, true)) => rank(to).send(send),
                Some((from, false)) => {
                    rank(from).receive_into(recv);
                }
                None => {}
            },
            Coll::Barrier => w.barrier(),
            Coll::ReduceScatterv | Coll::MultiSendrecv => {}
        }
    }
}
