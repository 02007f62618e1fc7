//! One call of an operation through the [`Collectives`] trait, on any [`Target`]: the one
//! place that knows each operation's argument list.

use duralumin::{
    AllreduceAlgorithm, Avg, BcastAlgorithm, Collectives, Max, Min, MpiCommunicator, Prod, Request, Result, Scope, Sum,
};

use crate::ops::{Coll, Redop};
use crate::spec::{PerfElem, Shape};
use crate::targets::{Mpi, Target};

/// The algorithm forced on the operations that take one (the others run `Auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    Auto,
    Allreduce(AllreduceAlgorithm),
    Bcast(BcastAlgorithm),
}

impl Algorithm {
    /// Every algorithm `coll` can be asked for by name (`--algorithm all`).
    pub fn all_for(coll: Coll) -> Vec<Algorithm> {
        use AllreduceAlgorithm as A;
        match coll {
            Coll::Allreduce => {
                [A::Auto, A::Native, A::Ring, A::RecursiveDoubling, A::Rabenseifner, A::Hierarchical, A::SharedMemory]
                    .into_iter()
                    .map(Algorithm::Allreduce)
                    .collect()
            }
            Coll::Bcast => {
                [BcastAlgorithm::Auto, BcastAlgorithm::Native, BcastAlgorithm::Chain, BcastAlgorithm::Hierarchical]
                    .into_iter()
                    .map(Algorithm::Bcast)
                    .collect()
            }
            _ => vec![Algorithm::Auto],
        }
    }

    /// The algorithm named `name` for `coll` (`Auto` for an operation that takes none, which
    /// only `auto` names).
    pub fn parse(coll: Coll, name: &str) -> Option<Algorithm> {
        let want = name.to_ascii_lowercase().replace(['-', ' '], "_");
        Algorithm::all_for(coll).into_iter().find(|a| a.name() == want)
    }

    pub fn name(self) -> &'static str {
        use AllreduceAlgorithm as A;
        match self {
            Algorithm::Auto | Algorithm::Allreduce(A::Auto) | Algorithm::Bcast(BcastAlgorithm::Auto) => "auto",
            Algorithm::Allreduce(A::Native) | Algorithm::Bcast(BcastAlgorithm::Native) => "native",
            Algorithm::Allreduce(A::Ring) => "ring",
            Algorithm::Allreduce(A::RecursiveDoubling) => "recursive_doubling",
            Algorithm::Allreduce(A::Rabenseifner) => "rabenseifner",
            Algorithm::Allreduce(A::Hierarchical) | Algorithm::Bcast(BcastAlgorithm::Hierarchical) => "hierarchical",
            Algorithm::Allreduce(A::SharedMemory) => "shared_memory",
            Algorithm::Bcast(BcastAlgorithm::Chain) => "chain",
            _ => "unknown",
        }
    }

    fn allreduce(self) -> AllreduceAlgorithm {
        if let Algorithm::Allreduce(a) = self { a } else { AllreduceAlgorithm::Auto }
    }

    fn bcast(self) -> BcastAlgorithm {
        if let Algorithm::Bcast(b) = self { b } else { BcastAlgorithm::Auto }
    }
}

/// Runs `$body` with `$o` bound to the operator value `redop` names.
macro_rules! with_redop {
    ($redop:expr, $o:ident => $body:expr) => {
        match $redop {
            Redop::Sum => {
                let $o = Sum;
                $body
            }
            Redop::Prod => {
                let $o = Prod;
                $body
            }
            Redop::Min => {
                let $o = Min;
                $body
            }
            Redop::Max => {
                let $o = Max;
                $body
            }
            Redop::Avg => {
                let $o = Avg;
                $body
            }
        }
    };
}

/// Uniform per-rank counts and displacements of the v-collectives.
pub struct Layout {
    pub counts: Vec<usize>,
    pub displs: Vec<usize>,
}

impl Layout {
    pub fn of(s: &Shape) -> Layout {
        let c = s.block();
        Layout { counts: vec![c; s.n], displs: (0..s.n).map(|i| i * c).collect() }
    }
}

/// A call's buffers on the target: one send and one receive buffer (two of each for the
/// multi-send-receive).
pub struct Bufs<X: Target, T: PerfElem> {
    pub send: Vec<X::Owned<T>>,
    pub recv: Vec<X::Owned<T>>,
}

/// One call of a communicator method: `(blocking)` the method, `(nonblocking SCOPE)` its
/// non-blocking twin started in `SCOPE`, its request returned (`None` where nothing starts).
macro_rules! invoke {
    ((blocking), $c:expr, $m:ident / $im:ident ($($arg:expr),*)) => {
        $c.$m($($arg),*)
    };
    ((nonblocking $scope:expr), $c:expr, $m:ident / $im:ident ($($arg:expr),*)) => {
        $c.$im($scope, $($arg),*).map(Some)
    };
}

/// What a call that starts nothing returns (a rank outside a send/recv pair).
macro_rules! nothing {
    ((blocking)) => {
        Ok(())
    };
    ((nonblocking $scope:expr)) => {
        Ok(None)
    };
}

/// The operation of `$s` on `$c` with the buffers `$b` of target `$X`, called `$how`
/// ([`invoke!`]): out of place, or in place on `recv[0]`. The one table of every operation's
/// arguments, for the blocking (or stream-ordered) calls and the Mpi backend's non-blocking ones.
macro_rules! dispatch {
    ($how:tt, $X:ty, $c:expr, $s:expr, $lay:expr, $algo:expr, $b:expr, $in_place:expr) => {{
        let (c, s, lay, algo, b) = ($c, $s, $lay, $algo, $b);
        let (root, op) = (s.root, s.redop);
        if $in_place {
            let buf = <$X>::buf_mut(&mut b.recv[0]);
            return match s.coll {
                Coll::Allreduce => with_redop!(op, o => invoke!($how, c, allreduce_in_place_with / iallreduce_in_place_with (buf, o, algo.allreduce()))),
                Coll::Reduce => with_redop!(op, o => invoke!($how, c, reduce_in_place / ireduce_in_place (buf, root, o))),
                Coll::ReduceScatter => with_redop!(op, o => invoke!($how, c, reduce_scatter_in_place / ireduce_scatter_in_place (buf, o))),
                Coll::ReduceScatterv => with_redop!(op, o => invoke!($how, c, reduce_scatterv_in_place / ireduce_scatterv_in_place (buf, &lay.counts, o))),
                Coll::Allgather => invoke!($how, c, allgather_in_place / iallgather_in_place (buf)),
                Coll::Allgatherv => invoke!($how, c, allgatherv_in_place / iallgatherv_in_place (buf, &lay.counts, &lay.displs)),
                Coll::Alltoall => invoke!($how, c, alltoall_in_place / ialltoall_in_place (buf)),
                Coll::Gather => invoke!($how, c, gather_in_place / igather_in_place (buf, root)),
                Coll::Gatherv => invoke!($how, c, gatherv_in_place / igatherv_in_place (buf, &lay.counts, &lay.displs, root)),
                Coll::Scatter => invoke!($how, c, scatter_in_place / iscatter_in_place (buf, root)),
                Coll::Scatterv => invoke!($how, c, scatterv_in_place / iscatterv_in_place (buf, &lay.counts, &lay.displs, root)),
                Coll::Sendrecv => invoke!($how, c, sendrecv_in_place / isendrecv_in_place (buf, s.next(), s.prev(), 0)),
                _ => Err(duralumin::Error::Unsupported("this operation has no in-place form")),
            };
        }
        if s.coll == Coll::MultiSendrecv {
            let (send, recv) = (&b.send, &mut b.recv);
            let sends: Vec<_> = send.iter().zip([s.next(), s.prev()]).map(|(o, p)| (<$X>::buf(o), p)).collect();
            let mut recvs: Vec<_> = recv.iter_mut().zip([s.prev(), s.next()]).map(|(o, p)| (<$X>::buf_mut(o), p)).collect();
            return invoke!($how, c, multi_sendrecv / imulti_sendrecv (&sends, &mut recvs, 0));
        }
        let (send, recv) = (<$X>::buf(&b.send[0]), <$X>::buf_mut(&mut b.recv[0]));
        match s.coll {
            Coll::Allreduce => with_redop!(op, o => invoke!($how, c, allreduce_with / iallreduce_with (send, recv, o, algo.allreduce()))),
            Coll::Reduce => with_redop!(op, o => invoke!($how, c, reduce / ireduce (send, recv, root, o))),
            Coll::ReduceScatter => with_redop!(op, o => invoke!($how, c, reduce_scatter / ireduce_scatter (send, recv, o))),
            Coll::ReduceScatterv => with_redop!(op, o => invoke!($how, c, reduce_scatterv / ireduce_scatterv (send, recv, &lay.counts, o))),
            Coll::Bcast => invoke!($how, c, bcast_with / ibcast_with (recv, root, algo.bcast())),
            Coll::Allgather => invoke!($how, c, allgather / iallgather (send, recv)),
            Coll::Allgatherv => invoke!($how, c, allgatherv / iallgatherv (send, recv, &lay.counts, &lay.displs)),
            Coll::Alltoall => invoke!($how, c, alltoall / ialltoall (send, recv)),
            Coll::Alltoallv => invoke!($how, c, alltoallv / ialltoallv (send, &lay.counts, &lay.displs, recv, &lay.counts, &lay.displs)),
            Coll::Gather => invoke!($how, c, gather / igather (send, recv, root)),
            Coll::Gatherv => invoke!($how, c, gatherv / igatherv (send, recv, &lay.counts, &lay.displs, root)),
            Coll::Scatter => invoke!($how, c, scatter / iscatter (send, recv, root)),
            Coll::Scatterv => invoke!($how, c, scatterv / iscatterv (send, &lay.counts, &lay.displs, recv, root)),
            Coll::Sendrecv => invoke!($how, c, sendrecv / isendrecv (send, s.next(), recv, s.prev(), 0)),
            Coll::SendRecvPair => match s.pair() {
                Some((to, true)) => invoke!($how, c, send / isend (send, to, 0)),
                Some((from, false)) => invoke!($how, c, recv / irecv (recv, from, 0)),
                None => nothing!($how),
            },
            Coll::Barrier => invoke!($how, c, barrier / ibarrier ()),
            Coll::MultiSendrecv => Err(duralumin::Error::Unsupported("multi_sendrecv takes lists of buffers")),
        }
    }};
}

/// Calls the operation of `s` once: out of place, or in place on `recv[0]`.
pub fn call<X: Target, T: PerfElem>(
    x: &X,
    s: &Shape,
    lay: &Layout,
    algo: Algorithm,
    b: &mut Bufs<X, T>,
    in_place: bool,
) -> Result<()> {
    dispatch!((blocking), X, x.comm(), s, lay, algo, b, in_place)
}

/// Starts the operation of `s` once on the Mpi backend as a non-blocking call in `scope`, on
/// buffers `b` that stay borrowed until the request completes: its request (`None` where this
/// rank has nothing to do).
pub fn start<'s, T: PerfElem>(
    c: &'s MpiCommunicator,
    scope: &'s Scope<'s, '_>,
    s: &Shape,
    lay: &Layout,
    algo: Algorithm,
    b: &'s mut Bufs<Mpi, T>,
    in_place: bool,
) -> Result<Option<Request<'s>>> {
    dispatch!((nonblocking scope), Mpi, c, s, lay, algo, b, in_place)
}
