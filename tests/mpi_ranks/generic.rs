//! Part of the sweep through the public [`Collectives`] trait, on the Mpi backend and on
//! HostTransfer: code written once over the trait runs every operation on each backend. The
//! trait has no non-blocking forms, so the sweep's non-blocking cases run blocking here too.

use duralumin::device::DeviceSliceMut;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::*;

use crate::backend::{
    ALL_ALLREDUCE, ALL_BCAST, Backend, TestDevice, allreduce_algorithms_for, small_chunks, stage, unstage,
};
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
        subset(&Generic {
            comm: c,
            stage: Host,
            native_only: false,
            allreduce: allreduce_algorithms_for(c.topology()),
        });
    });
    let dev = duralumin::device::cpu::HostDevice::new(0);
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
        within("point-to-point around the ring", || crate::sweep::point_to_point(&g));
        within("point-to-point chained on the stream", || chained_point_to_point(&g));
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
    within("point-to-point around the ring", || crate::sweep::point_to_point(g));
    within("point-to-point chained on the stream", || chained_point_to_point(g));
}

/// Point-to-point chained through the trait: send/recv around the ring (even ranks send
/// first), sendrecv, sendrecv in place, multi_sendrecv to both neighbours and a barrier, queued
/// back to back with one synchronize between them, where the sweep's wrappers synchronize
/// after every call.
fn chained_point_to_point<C: Collectives, S: Stage<C>>(g: &Generic<'_, C, S>) {
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

/// A staged argument as the trait takes it.
macro_rules! through {
    ([in], $x:ident) => {
        S::buf(&$x.1)
    };
    ([out], $x:ident) => {
        S::buf_mut(&mut $x.1)
    };
    ([ins], $x:ident) => {
        &$x.1.iter().map(|(b, p)| (S::buf(b), *p)).collect::<Vec<_>>()
    };
    ([outs], $x:ident) => {
        &mut $x.1.iter_mut().map(|(b, p)| (S::buf_mut(b), *p)).collect::<Vec<_>>()
    };
    ($k:tt, $x:ident) => {
        $x.0
    };
}

/// The adapter's implementation from the library's list (`duralumin::for_each_operation!`):
/// every operation through the trait (blocking or stream-ordered whatever `nb` says).
macro_rules! generic_backend {
    ($(
        $(#[$doc:meta])*
        fn $f:ident / $i:ident <$($lt:lifetime,)? $($g:ident: $b:path),*> ($($a:ident: $k:tt),* $(,)?)
            describe($call:expr => $elem:ident::<$($et:ty),+>) plan($plan:ident($($pa:expr),*));
    )*) => {
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
            $(
                #[allow(unused_parens, unused_mut)]
                fn $f<$($lt,)? $($g: $b),*>(&self, _: bool, $($a: crate::backend::host!($k)),*) -> Result<()> {
                    let st = &self.stage;
                    $(let mut $a = stage!(st, $k, $a);)*
                    self.comm.$f($(through!($k, $a)),*)?;
                    self.comm.synchronize()?;
                    $(unstage!(st, $k, $a);)*
                    Ok(())
                }
            )*
        }
    };
}
for_each_operation!(generic_backend);
