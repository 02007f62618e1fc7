//! Part of the sweep through the public [`Collectives`] trait, on the Mpi backend and on
//! HostTransfer: code written once over the trait runs every operation on each backend. The
//! trait has no non-blocking forms, so the sweep's non-blocking cases run blocking here too.

use duralumin::device::DeviceSliceMut;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::*;

use crate::backend::{ALL_ALLREDUCE, ALL_BCAST, Backend, TestDevice, allreduce_algorithms_for, small_chunks};
use crate::mpirun::rank_case::within;

/// How a test moves host vectors in and out of a backend's buffers.
pub trait Stage<C: Collectives> {
    type Owned<T: Element>;
    fn up<T: Element>(&self, v: &[T]) -> Self::Owned<T>;
    fn down<T: Element>(&self, b: &Self::Owned<T>) -> Vec<T>;
    fn buf<'a, T: Element>(b: &'a Self::Owned<T>) -> C::Buf<'a, T>
    where
        C: 'a;
    fn buf_mut<'a, T: Element>(b: &'a mut Self::Owned<T>) -> C::BufMut<'a, T>
    where
        C: 'a;
}

/// Host vectors are the Mpi backend's buffers.
pub struct Host;

impl Stage<MpiCommunicator> for Host {
    type Owned<T: Element> = Vec<T>;
    fn up<T: Element>(&self, v: &[T]) -> Vec<T> {
        v.to_vec()
    }
    fn down<T: Element>(&self, b: &Vec<T>) -> Vec<T> {
        b.clone()
    }
    fn buf<'a, T: Element>(b: &'a Vec<T>) -> &'a [T]
    where
        MpiCommunicator: 'a,
    {
        b
    }
    fn buf_mut<'a, T: Element>(b: &'a mut Vec<T>) -> &'a mut [T]
    where
        MpiCommunicator: 'a,
    {
        b
    }
}

/// Device buffers on a stream of the communicator's device.
pub struct OnDevice<D: TestDevice> {
    dev: D,
    stream: D::Stream,
}

/// Device buffers of a stream-ordered backend `$comm<D>`, as trait objects.
macro_rules! on_device_stage {
    ($comm:ident, $($bound:tt)+) => {
        impl<D: $($bound)+> Stage<$comm<D>> for OnDevice<D> {
            type Owned<T: Element> = D::Buf<T>;
            fn up<T: Element>(&self, v: &[T]) -> D::Buf<T> {
                self.dev.up(&self.stream, v)
            }
            fn down<T: Element>(&self, b: &D::Buf<T>) -> Vec<T> {
                self.dev.down(&self.stream, b)
            }
            fn buf<'a, T: Element>(b: &'a D::Buf<T>) -> &'a dyn device::DeviceSlice<D, Elem = T>
            where
                $comm<D>: 'a,
            {
                b
            }
            fn buf_mut<'a, T: Element>(b: &'a mut D::Buf<T>) -> &'a mut dyn DeviceSliceMut<D, Elem = T>
            where
                $comm<D>: 'a,
            {
                b
            }
        }
    };
}

on_device_stage!(HostTransferCommunicator, TestDevice);
#[cfg(feature = "cuda")]
on_device_stage!(NcclCommunicator, TestDevice + duralumin::NcclDevice);

pub struct Generic<'c, C, S> {
    comm: &'c C,
    stage: S,
    /// The backend runs only its own algorithms (`Auto`): NCCL.
    native_only: bool,
    /// The allreduce algorithms for the communicator's topology.
    allreduce: &'static [AllreduceAlgorithm],
}

/// The sweep's reductions, data movement and non-commutative checks through the trait, on the
/// Mpi communicator `c` and on HostTransfer on the host device.
pub fn run(c: &MpiCommunicator, world: &SimpleCommunicator) {
    within("Collectives on Mpi", || {
        subset(&Generic { comm: c, stage: Host, native_only: false, allreduce: allreduce_algorithms_for(c.topology()) })
    });
    let dev = duralumin::device::host::HostDevice::new(0);
    let stream = dev.stream().expect("stream");
    on_device(world, dev, stream);
}

/// The subset on HostTransfer over `dev`'s `stream`.
pub fn on_device<D: TestDevice>(world: &SimpleCommunicator, dev: D, stream: D::Stream) {
    let mut ht = HostTransferCommunicator::with_config(world, dev.clone(), stream.clone(), small_chunks())
        .expect("communicator");
    ht.set_tuning(crate::small_thresholds());
    within(format!("Collectives on HostTransfer<{}>", dev.name()), || {
        let allreduce = allreduce_algorithms_for(&ht.topology());
        subset(&Generic { comm: &ht, stage: OnDevice { dev, stream }, native_only: false, allreduce })
    });
    Collectives::synchronize(&ht).expect("synchronize");
}

/// The same part of the sweep through the public trait on the NCCL backend (without the
/// non-commutative user pair, which has no device kernels there).
#[cfg(feature = "cuda")]
pub fn on_nccl<D: TestDevice + duralumin::NcclDevice>(world: &SimpleCommunicator, dev: D, stream: D::Stream) {
    let comm = NcclCommunicator::new(world, dev.clone(), stream.clone()).expect("NCCL communicator");
    within(format!("Collectives on Nccl<{}>", dev.name()), || {
        let g = Generic { comm: &comm, stage: OnDevice { dev, stream }, native_only: true, allreduce: ALL_ALLREDUCE };
        common_subset(&g);
        within("point-to-point around the ring", || point_to_point(&g));
    });
    Collectives::synchronize(&comm).expect("synchronize");
}

fn common_subset<C: Collectives, S: Stage<C>>(g: &Generic<'_, C, S>) {
    crate::sweep::reductions::<u32, Sum>(g);
    crate::sweep::reductions::<f64, Max>(g);
    crate::sweep::movement::<i16>(g);
}

fn subset<C: Collectives, S: Stage<C>>(g: &Generic<'_, C, S>) {
    common_subset(g);
    crate::sweep::non_commutative(g);
    within("point-to-point around the ring", || point_to_point(g));
}

/// Around the ring: send/recv (even ranks send first), sendrecv, sendrecv in place,
/// multi_sendrecv to both neighbours, and a barrier.
fn point_to_point<C: Collectives, S: Stage<C>>(g: &Generic<'_, C, S>) {
    let (c, st) = (g.comm, &g.stage);
    let (me, n) = (c.rank(), c.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mine = |r: usize| vec![r as u32 * 10 + 1; 5];
    let mut got = st.up(&[0u32; 5]);
    let sent = st.up(&mine(me));
    if n > 1 && me % 2 == 0 {
        c.send(S::buf(&sent), next, 1).expect("send");
        c.recv(S::buf_mut(&mut got), prev, 1).expect("recv");
    } else if n > 1 {
        c.recv(S::buf_mut(&mut got), prev, 1).expect("recv");
        c.send(S::buf(&sent), next, 1).expect("send");
    } else {
        c.sendrecv(S::buf(&sent), next, S::buf_mut(&mut got), prev, 1).expect("sendrecv to self");
    }
    c.synchronize().expect("synchronize");
    assert_eq!(st.down(&got), mine(prev), "send/recv around the ring");
    let mut got = st.up(&[0u32; 5]);
    c.sendrecv(S::buf(&sent), next, S::buf_mut(&mut got), prev, 2).expect("sendrecv");
    let mut buf = st.up(&mine(me));
    c.sendrecv_in_place(S::buf_mut(&mut buf), next, prev, 3).expect("sendrecv in place");
    c.synchronize().expect("synchronize");
    assert_eq!(st.down(&got), mine(prev), "sendrecv");
    assert_eq!(st.down(&buf), mine(prev), "sendrecv in place");
    let (mut from_prev, mut from_next) = (st.up(&[0u32; 5]), st.up(&[0u32; 5]));
    let sends = [(S::buf(&sent), next), (S::buf(&sent), prev)];
    let mut recvs = [(S::buf_mut(&mut from_prev), prev), (S::buf_mut(&mut from_next), next)];
    c.multi_sendrecv(&sends, &mut recvs, 4).expect("multi_sendrecv");
    drop((sends, recvs));
    c.barrier().expect("barrier");
    c.synchronize().expect("synchronize");
    assert_eq!((st.down(&from_prev), st.down(&from_next)), (mine(prev), mine(next)), "multi_sendrecv");
}

impl<C: Collectives, S: Stage<C>> Generic<'_, C, S> {
    /// Runs `f` on buffers holding `s` and `r`, then copies the result back into `r`.
    fn two<T: Element>(
        &self,
        s: &[T],
        r: &mut [T],
        f: impl FnOnce(C::Buf<'_, T>, C::BufMut<'_, T>) -> Result<()>,
    ) -> Result<()> {
        let (ds, mut dr) = (self.stage.up(s), self.stage.up(r));
        f(S::buf(&ds), S::buf_mut(&mut dr))?;
        self.comm.synchronize()?;
        r.copy_from_slice(&self.stage.down(&dr));
        assert!(crate::elements::same(&self.stage.down(&ds), s), "the input changed");
        Ok(())
    }

    /// Runs `f` on a buffer holding `b`, then copies it back.
    fn one<T: Element>(&self, b: &mut [T], f: impl FnOnce(C::BufMut<'_, T>) -> Result<()>) -> Result<()> {
        let mut db = self.stage.up(b);
        f(S::buf_mut(&mut db))?;
        self.comm.synchronize()?;
        b.copy_from_slice(&self.stage.down(&db));
        Ok(())
    }
}

impl<C: Collectives, S: Stage<C>> Backend for Generic<'_, C, S> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn allreduce_algorithms(&self) -> &'static [AllreduceAlgorithm] {
        if self.native_only { &ALL_ALLREDUCE[..1] } else { self.allreduce }
    }
    fn bcast_algorithms(&self) -> &'static [BcastAlgorithm] {
        if self.native_only { &ALL_BCAST[..1] } else { ALL_BCAST }
    }
    fn allreduce_with<T: Element, O: ReduceOp<T>>(
        &self,
        _: bool,
        s: &[T],
        r: &mut [T],
        op: O,
        a: AllreduceAlgorithm,
    ) -> Result<()> {
        match a {
            AllreduceAlgorithm::Auto => self.two(s, r, |s, r| self.comm.allreduce(s, r, op)),
            a => self.two(s, r, |s, r| self.comm.allreduce_with(s, r, op, a)),
        }
    }
    fn allreduce_in_place_with<T: Element, O: ReduceOp<T>>(
        &self,
        _: bool,
        b: &mut [T],
        op: O,
        a: AllreduceAlgorithm,
    ) -> Result<()> {
        match a {
            AllreduceAlgorithm::Auto => self.one(b, |b| self.comm.allreduce_in_place(b, op)),
            a => self.one(b, |b| self.comm.allreduce_in_place_with(b, op, a)),
        }
    }
    fn reduce<T: Element, O: ReduceOp<T>>(&self, _: bool, s: &[T], r: &mut [T], root: usize, op: O) -> Result<()> {
        self.two(s, r, |s, r| self.comm.reduce(s, r, root, op))
    }
    fn reduce_in_place<T: Element, O: ReduceOp<T>>(&self, _: bool, b: &mut [T], root: usize, op: O) -> Result<()> {
        self.one(b, |b| self.comm.reduce_in_place(b, root, op))
    }
    fn reduce_scatter<T: Element, O: ReduceOp<T>>(&self, _: bool, s: &[T], r: &mut [T], op: O) -> Result<()> {
        self.two(s, r, |s, r| self.comm.reduce_scatter(s, r, op))
    }
    fn reduce_scatter_in_place<T: Element, O: ReduceOp<T>>(&self, _: bool, b: &mut [T], op: O) -> Result<()> {
        self.one(b, |b| self.comm.reduce_scatter_in_place(b, op))
    }
    fn reduce_scatterv<T: Element, O: ReduceOp<T>>(
        &self,
        _: bool,
        s: &[T],
        r: &mut [T],
        counts: &[usize],
        op: O,
    ) -> Result<()> {
        self.two(s, r, |s, r| self.comm.reduce_scatterv(s, r, counts, op))
    }
    fn reduce_scatterv_in_place<T: Element, O: ReduceOp<T>>(
        &self,
        _: bool,
        b: &mut [T],
        counts: &[usize],
        op: O,
    ) -> Result<()> {
        self.one(b, |b| self.comm.reduce_scatterv_in_place(b, counts, op))
    }
    fn bcast_with<T: Element>(&self, _: bool, b: &mut [T], root: usize, a: BcastAlgorithm) -> Result<()> {
        match a {
            BcastAlgorithm::Auto => self.one(b, |b| self.comm.bcast(b, root)),
            a => self.one(b, |b| self.comm.bcast_with(b, root, a)),
        }
    }
    fn allgather<T: Element>(&self, _: bool, s: &[T], r: &mut [T]) -> Result<()> {
        self.two(s, r, |s, r| self.comm.allgather(s, r))
    }
    fn allgather_in_place<T: Element>(&self, _: bool, b: &mut [T]) -> Result<()> {
        self.one(b, |b| self.comm.allgather_in_place(b))
    }
    fn allgatherv<T: Element>(&self, _: bool, s: &[T], r: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
        self.two(s, r, |s, r| self.comm.allgatherv(s, r, counts, displs))
    }
    fn allgatherv_in_place<T: Element>(&self, _: bool, b: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
        self.one(b, |b| self.comm.allgatherv_in_place(b, counts, displs))
    }
    fn alltoall<T: Element>(&self, _: bool, s: &[T], r: &mut [T]) -> Result<()> {
        self.two(s, r, |s, r| self.comm.alltoall(s, r))
    }
    fn alltoall_in_place<T: Element>(&self, _: bool, b: &mut [T]) -> Result<()> {
        self.one(b, |b| self.comm.alltoall_in_place(b))
    }
    fn alltoallv<T: Element>(
        &self,
        _: bool,
        s: &[T],
        sc: &[usize],
        sd: &[usize],
        r: &mut [T],
        rc: &[usize],
        rd: &[usize],
    ) -> Result<()> {
        self.two(s, r, |s, r| self.comm.alltoallv(s, sc, sd, r, rc, rd))
    }
    fn gather<T: Element>(&self, _: bool, s: &[T], r: &mut [T], root: usize) -> Result<()> {
        self.two(s, r, |s, r| self.comm.gather(s, r, root))
    }
    fn gather_in_place<T: Element>(&self, _: bool, b: &mut [T], root: usize) -> Result<()> {
        self.one(b, |b| self.comm.gather_in_place(b, root))
    }
    fn gatherv<T: Element>(&self, _: bool, s: &[T], r: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()> {
        self.two(s, r, |s, r| self.comm.gatherv(s, r, c, d, root))
    }
    fn gatherv_in_place<T: Element>(&self, _: bool, b: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()> {
        self.one(b, |b| self.comm.gatherv_in_place(b, c, d, root))
    }
    fn scatter<T: Element>(&self, _: bool, s: &[T], r: &mut [T], root: usize) -> Result<()> {
        self.two(s, r, |s, r| self.comm.scatter(s, r, root))
    }
    fn scatter_in_place<T: Element>(&self, _: bool, b: &mut [T], root: usize) -> Result<()> {
        self.one(b, |b| self.comm.scatter_in_place(b, root))
    }
    fn scatterv<T: Element>(&self, _: bool, s: &[T], c: &[usize], d: &[usize], r: &mut [T], root: usize) -> Result<()> {
        self.two(s, r, |s, r| self.comm.scatterv(s, c, d, r, root))
    }
    fn scatterv_in_place<T: Element>(&self, _: bool, b: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()> {
        self.one(b, |b| self.comm.scatterv_in_place(b, c, d, root))
    }
}
