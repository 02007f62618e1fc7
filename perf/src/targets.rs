//! What `duralumin-perf` runs on: a communicator of one backend and how host data moves in and
//! out of its buffers (host vectors on the Mpi backend, device buffers on the stream-ordered
//! ones). The runner is written once over [`Target`].

use duralumin::device::cpu::{HostBuffer, HostDevice};
use duralumin::device::{DeviceSlice, DeviceSliceMut};
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::{Collectives, Element, HostTransferCommunicator, MpiCommunicator, Result};

use crate::call::{self, Algorithm, Bufs, Layout};
use crate::spec::{PerfElem, Shape};

/// A backend's communicator and its buffers.
pub trait Target {
    type C: Collectives;
    type Owned<T: Element>;
    /// `mpi`, `host-transfer` or `nccl`.
    const BACKEND: &'static str;
    fn comm(&self) -> &Self::C;
    /// `host` or `cuda`.
    fn device(&self) -> &'static str;
    /// Whether operations are queued on a stream (their calls return before they complete).
    fn stream_ordered(&self) -> bool;
    /// A buffer holding `v` (on the device, once this returns).
    fn up<T: Element>(&self, v: &[T]) -> Result<Self::Owned<T>>;
    /// `b`'s contents once everything queued so far has run.
    fn down<T: Element>(&self, b: &Self::Owned<T>) -> Result<Vec<T>>;
    fn buf<'a, T: Element>(b: &'a Self::Owned<T>) -> <Self::C as Collectives>::Buf<'a, T>
    where
        Self::C: 'a;
    fn buf_mut<'a, T: Element>(b: &'a mut Self::Owned<T>) -> <Self::C as Collectives>::BufMut<'a, T>
    where
        Self::C: 'a;
    /// Starts the operation of `s` once on each buffer set of `sets` at once, as non-blocking
    /// calls, and waits for them all (`-z 0` on a backend whose calls are not queued on a
    /// stream); `None` where the backend has no non-blocking calls.
    fn call_all<T: PerfElem>(
        &self,
        _s: &Shape,
        _lay: &Layout,
        _algo: Algorithm,
        _sets: &mut [Bufs<Self, T>],
        _in_place: bool,
    ) -> Option<Result<()>>
    where
        Self: Sized,
    {
        None
    }
}

/// The Mpi backend on host vectors.
pub struct Mpi(pub MpiCommunicator);

impl Target for Mpi {
    type C = MpiCommunicator;
    type Owned<T: Element> = Vec<T>;
    const BACKEND: &'static str = "mpi";
    fn comm(&self) -> &MpiCommunicator {
        &self.0
    }
    fn device(&self) -> &'static str {
        "host"
    }
    fn stream_ordered(&self) -> bool {
        false
    }
    fn up<T: Element>(&self, v: &[T]) -> Result<Vec<T>> {
        Ok(v.to_vec())
    }
    fn down<T: Element>(&self, b: &Vec<T>) -> Result<Vec<T>> {
        Ok(b.clone())
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
    fn call_all<T: PerfElem>(
        &self,
        s: &Shape,
        lay: &Layout,
        algo: Algorithm,
        sets: &mut [Bufs<Self, T>],
        in_place: bool,
    ) -> Option<Result<()>> {
        Some(duralumin::scope(|scope| {
            let mut started = Vec::with_capacity(sets.len());
            for b in sets.iter_mut() {
                match call::start(&self.0, scope, s, lay, algo, b, in_place) {
                    Ok(r) => started.extend(r),
                    Err(e) => {
                        // The calls started so far report their own errors here, not on a
                        // later call.
                        let _ = duralumin::Request::wait_all(started);
                        return Err(e);
                    }
                }
            }
            duralumin::Request::wait_all(started)
        }))
    }
}

/// HostTransfer on the host device (the CPU standing in for a GPU: executor-thread streams).
pub struct HtHost {
    pub dev: HostDevice,
    pub comm: HostTransferCommunicator<HostDevice>,
}

impl HtHost {
    pub fn new(world: &SimpleCommunicator) -> Result<HtHost> {
        let dev = HostDevice::new(0);
        let comm = HostTransferCommunicator::new(world, dev.clone(), dev.stream()?)?;
        Ok(HtHost { dev, comm })
    }
}

/// The stream-ordered buffer plumbing shared by every device target: trait objects over the
/// device's own buffer type.
macro_rules! device_buffers {
    ($comm:ty, $dev:ty, $owned:ident) => {
        fn buf<'a, T: Element>(b: &'a $owned<T>) -> &'a dyn DeviceSlice<$dev, Elem = T>
        where
            $comm: 'a,
        {
            b
        }
        fn buf_mut<'a, T: Element>(b: &'a mut $owned<T>) -> &'a mut dyn DeviceSliceMut<$dev, Elem = T>
        where
            $comm: 'a,
        {
            b
        }
    };
}

impl Target for HtHost {
    type C = HostTransferCommunicator<HostDevice>;
    type Owned<T: Element> = HostBuffer<T>;
    const BACKEND: &'static str = "host-transfer";
    fn comm(&self) -> &Self::C {
        &self.comm
    }
    fn device(&self) -> &'static str {
        "host"
    }
    fn stream_ordered(&self) -> bool {
        true
    }
    fn up<T: Element>(&self, v: &[T]) -> Result<HostBuffer<T>> {
        self.comm.synchronize()?;
        self.dev.upload(v)
    }
    fn down<T: Element>(&self, b: &HostBuffer<T>) -> Result<Vec<T>> {
        self.comm.synchronize()?;
        self.dev.download(b)
    }
    device_buffers!(HostTransferCommunicator<HostDevice>, HostDevice, HostBuffer);
}

#[cfg(feature = "cuda")]
pub use cuda::{HtCuda, Nccl, cuda_device};

#[cfg(feature = "cuda")]
mod cuda {
    use std::sync::Arc;

    use duralumin::cudarc::driver::{CudaContext, CudaSlice, CudaStream};

    use duralumin::device::cuda::CudaDevice;
    use duralumin::{NcclCommunicator, Result};

    use super::*;
    use crate::Boxed;

    /// The CUDA device of this rank (GPU `local rank % devices`) and a stream on it.
    pub fn cuda_device(local_rank: usize) -> std::result::Result<(CudaDevice, Arc<CudaStream>), Boxed> {
        let devices = duralumin::device::cuda::device_count();
        if devices == 0 {
            return Err(
                "--device cuda: no CUDA device (no driver library, or no GPU; cudasim stands in for one)".into()
            );
        }
        let ordinal = local_rank % devices;
        let ctx = CudaContext::new(ordinal)?;
        let stream = ctx.new_stream()?;
        Ok((CudaDevice::new(ctx)?, stream))
    }

    /// HostTransfer on a CUDA device.
    pub struct HtCuda {
        pub dev: CudaDevice,
        pub stream: Arc<CudaStream>,
        pub comm: HostTransferCommunicator<CudaDevice>,
    }

    /// NCCL on a CUDA device.
    pub struct Nccl {
        pub dev: CudaDevice,
        pub stream: Arc<CudaStream>,
        pub comm: NcclCommunicator<CudaDevice>,
    }

    impl HtCuda {
        pub fn new(world: &SimpleCommunicator, local_rank: usize) -> std::result::Result<HtCuda, Boxed> {
            let (dev, stream) = cuda_device(local_rank)?;
            let comm = HostTransferCommunicator::new(world, dev.clone(), Arc::clone(&stream))?;
            Ok(HtCuda { dev, stream, comm })
        }
    }

    impl Nccl {
        pub fn new(world: &SimpleCommunicator, local_rank: usize) -> std::result::Result<Nccl, Boxed> {
            let (dev, stream) = cuda_device(local_rank)?;
            let comm = NcclCommunicator::new(world, dev.clone(), Arc::clone(&stream))?;
            Ok(Nccl { dev, stream, comm })
        }
    }

    /// [`Target`] for a CUDA communicator type `$t` with the communicator `$comm`.
    macro_rules! cuda_target {
        ($t:ty, $comm:ty, $backend:literal) => {
            impl Target for $t {
                type C = $comm;
                type Owned<T: Element> = CudaSlice<T>;
                const BACKEND: &'static str = $backend;
                fn comm(&self) -> &Self::C {
                    &self.comm
                }
                fn device(&self) -> &'static str {
                    "cuda"
                }
                fn stream_ordered(&self) -> bool {
                    true
                }
                fn up<T: Element>(&self, v: &[T]) -> Result<CudaSlice<T>> {
                    let b = self.dev.upload(&self.stream, v)?;
                    self.comm.synchronize()?;
                    Ok(b)
                }
                fn down<T: Element>(&self, b: &CudaSlice<T>) -> Result<Vec<T>> {
                    self.dev.download(&self.stream, b)
                }
                device_buffers!($comm, CudaDevice, CudaSlice);
            }
        };
    }

    cuda_target!(HtCuda, HostTransferCommunicator<CudaDevice>, "host-transfer");
    cuda_target!(Nccl, NcclCommunicator<CudaDevice>, "nccl");
}
