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

/// Host buffers of the native calls, kept between calls: one set per call started at once
/// (`-z 0` on the Mpi backend; one set otherwise).
pub struct Native<T> {
    sets: Vec<(Vec<T>, Vec<T>)>,
    counts: Vec<i32>,
    displs: Vec<i32>,
}

/// Calls of MPI's own operation, whatever the element type.
pub trait NativeCall {
    /// One call of MPI's operation of `s` on `w`.
    fn call(&mut self, w: &SimpleCommunicator, s: &Shape);
    /// `k` non-blocking calls started at once, one on each of the first `k` buffer sets, then
    /// waited for.
    fn call_all(&mut self, w: &SimpleCommunicator, s: &Shape, k: usize);
}

impl<T: PerfElem + Equivalence> Native<T> {
    /// MPI's buffers for `s`, `window` sets starting as `b` (the out-of-place form's).
    pub fn new(s: &Shape, b: &Buffers<T>, window: usize) -> Native<T> {
        let lay = Layout::of(s);
        let sets = vec![(b.send.clone(), b.recv.clone()); window.max(1)];
        Native { sets, counts: i32s(&lay.counts), displs: i32s(&lay.displs) }
    }
}

impl<T: PerfElem + Equivalence> NativeCall for Native<T> {
    fn call(&mut self, w: &SimpleCommunicator, s: &Shape) {
        let rank = |r: usize| w.process_at_rank(i32::try_from(r).unwrap_or(0));
        let root = rank(s.root);
        let is_root = s.rank == s.root;
        let Some((send, recv)) = self.sets.first_mut() else { return };
        let (send, recv) = (&send[..], &mut recv[..]);
        let (counts, displs) = (&self.counts[..], &self.displs[..]);
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

    fn call_all(&mut self, w: &SimpleCommunicator, s: &Shape, k: usize) {
        let rank = |r: usize| w.process_at_rank(i32::try_from(r).unwrap_or(0));
        let (root, is_root, op) = (rank(s.root), s.rank == s.root, system_op(s.redop));
        let (counts, displs) = (&self.counts[..], &self.displs[..]);
        let k = k.clamp(1, self.sets.len());
        if s.coll == Coll::Barrier {
            let started: Vec<_> = (0..k).map(|_| w.immediate_barrier()).collect();
            started.into_iter().for_each(|r| {
                let _ = r.wait();
            });
            return;
        }
        // Each call's buffers, as plain slices and as the v-operations' partitions (a request
        // borrows its partition, so they are made before the scope); a receive buffer is one or
        // the other.
        let send_parted = s.coll == Coll::Alltoallv || s.coll == Coll::Scatterv && is_root;
        let recv_parted = matches!(s.coll, Coll::Allgatherv | Coll::Alltoallv) || s.coll == Coll::Gatherv && is_root;
        let mut views: Vec<_> = self.sets[..k]
            .iter_mut()
            .map(|(send, recv)| {
                let (parted, plain) = if recv_parted {
                    (Some(PartitionMut::new(&mut recv[..], counts, displs)), &mut [][..])
                } else {
                    (None, &mut recv[..])
                };
                (send_parted.then(|| Partition::new(&send[..], counts, displs)), &send[..], parted, plain)
            })
            .collect();
        duralumin::mpi::request::scope(|scope| {
            let mut waits: Vec<Box<dyn FnOnce() + '_>> = Vec::with_capacity(2 * k);
            macro_rules! started {
                ($($r:expr),+) => {{ $(let r = $r; waits.push(Box::new(move || { let _ = r.wait(); }));)+ }};
            }
            for (send_parts, send, recv_parts, recv) in views.iter_mut() {
                let (send, recv) = (*send, &mut **recv);
                match (s.coll, recv_parts, send_parts.as_ref()) {
                    (Coll::Allreduce, _, _) => started!(w.immediate_all_reduce_into(scope, send, recv, op)),
                    (Coll::Reduce, _, _) if is_root => started!(root.immediate_reduce_into_root(scope, send, recv, op)),
                    (Coll::Reduce, _, _) => started!(root.immediate_reduce_into(scope, send, op)),
                    (Coll::ReduceScatter, _, _) => {
                        started!(w.immediate_reduce_scatter_block_into(scope, send, recv, op))
                    }
                    (Coll::Bcast, _, _) => started!(root.immediate_broadcast_into(scope, recv)),
                    (Coll::Allgather, _, _) => started!(w.immediate_all_gather_into(scope, send, recv)),
                    (Coll::Allgatherv, Some(parts), _) => {
                        started!(w.immediate_all_gather_varcount_into(scope, send, parts))
                    }
                    (Coll::Alltoall, _, _) => started!(w.immediate_all_to_all_into(scope, send, recv)),
                    (Coll::Alltoallv, Some(parts), Some(send_parts)) => {
                        started!(w.immediate_all_to_all_varcount_into(scope, send_parts, parts))
                    }
                    (Coll::Gather, _, _) if is_root => started!(root.immediate_gather_into_root(scope, send, recv)),
                    (Coll::Gather, _, _) => started!(root.immediate_gather_into(scope, send)),
                    (Coll::Gatherv, Some(parts), _) => {
                        started!(root.immediate_gather_varcount_into_root(scope, send, parts))
                    }
                    (Coll::Gatherv, _, _) => started!(root.immediate_gather_varcount_into(scope, send)),
                    (Coll::Scatter, _, _) if is_root => started!(root.immediate_scatter_into_root(scope, send, recv)),
                    (Coll::Scatter, _, _) => started!(root.immediate_scatter_into(scope, recv)),
                    (Coll::Scatterv, _, Some(send_parts)) => {
                        started!(root.immediate_scatter_varcount_into_root(scope, send_parts, recv))
                    }
                    (Coll::Scatterv, _, _) => started!(root.immediate_scatter_varcount_into(scope, recv)),
                    (Coll::Sendrecv, _, _) => started!(
                        rank(s.prev()).immediate_receive_into(scope, recv),
                        rank(s.next()).immediate_send(scope, send)
                    ),
                    (Coll::SendRecvPair, _, _) => match s.pair() {
                        Some((to, true)) => started!(rank(to).immediate_send(scope, send)),
                        Some((from, false)) => started!(rank(from).immediate_receive_into(scope, recv)),
                        None => {}
                    },
                    _ => {}
                }
            }
            waits.into_iter().for_each(|wait| wait());
        });
    }
}
