//! The backends the sweep runs on: the sweep is written once against [`Backend`], whose
//! methods take and return host vectors and run the operation blocking or non-blocking, and is
//! instantiated for the Mpi backend and for HostTransfer on the host device (the same body that
//! will run for HostTransfer on CUDA).

use duralumin::backends::host_transfer::{self, HostTransferConfig};
use duralumin::device::cpu::{HostBuffer, HostDevice, HostStream};
#[cfg(feature = "cuda")]
use duralumin::device::cuda::CudaDevice;
use duralumin::device::{Device, DeviceSliceMut};
use duralumin::scope;
use duralumin::*;

/// Runs a method of the Mpi backend blocking or, inside a scope, non-blocking.
macro_rules! mpi_call {
    ($nb:expr, $c:ident . $f:ident / $i:ident ( $($a:expr),* $(,)? )) => {
        if $nb { scope(|s| $c.$i(s, $($a),*)?.wait()) } else { MpiCommunicator::$f($c, $($a),*) }
    };
}
pub(crate) use mpi_call;

/// A wrapper's parameter type for an argument of kind `$kind` of the library's list of
/// operations (`duralumin::for_each_operation!`): host vectors, as the sweep holds its data.
macro_rules! host {
    ([in]) => { &[T] };
    ([out]) => { &mut [T] };
    ([ins]) => { &[(&'b [T], usize)] };
    ([outs]) => { &mut [(&'b mut [T], usize)] };
    ($t:ty) => { $t };
}

/// Declares [`Backend`] from the library's list of operations (`duralumin::for_each_operation!`),
/// the list the library generates its [`Collectives`] trait and every backend's methods from.
macro_rules! declare_backend {
    ($(
        $(#[$doc:meta])*
        fn $f:ident / $i:ident <$($lt:lifetime,)? $($g:ident: $b:path),*> ($($a:ident: $k:tt),* $(,)?)
            describe($call:expr => $elem:ident::<$($et:ty),+>) plan($plan:ident($($pa:expr),*));
    )*) => {
        /// One collective interface over host vectors, for the sweep: every operation of the
        /// library's list; `nb` runs it non-blocking (waiting on its request) instead of
        /// blocking or stream-ordered.
        #[allow(clippy::too_many_arguments)]
        pub trait Backend {
            fn rank(&self) -> usize;
            fn size(&self) -> usize;
            /// The allreduce and bcast algorithms the backend takes.
            fn allreduce_algorithms(&self) -> &'static [AllreduceAlgorithm];
            fn bcast_algorithms(&self) -> &'static [BcastAlgorithm];
            /// Whether user (element, operator) pairs reduce here; where they do not (the NCCL
            /// backend, whose test pairs have no device kernels), they must be refused by name.
            fn runs_user_pairs(&self) -> bool {
                true
            }
            $(
                #[allow(unused_parens)]
                fn $f<$($lt,)? $($g: $b),*>(&self, nb: bool, $($a: host!($k)),*) -> Result<()>;
            )*
        }
    };
}
duralumin::for_each_operation!(declare_backend);

/// Copies an argument of kind `$k` where the backend `$s` can run on it: `(host, staged)`, the
/// receive side too, so elements an operation must not touch keep their values.
macro_rules! stage {
    ($s:ident, [in], $x:ident) => {
        ($x, $s.up($x))
    };
    ($s:ident, [out], $x:ident) => {{
        let staged = $s.up(&*$x);
        ($x, staged)
    }};
    ($s:ident, [ins], $x:ident) => {
        ($x, $x.iter().map(|(b, p)| ($s.up(b), *p)).collect::<Vec<_>>())
    };
    ($s:ident, [outs], $x:ident) => {{
        let staged = $x.iter().map(|(b, p)| ($s.up(&**b), *p)).collect::<Vec<_>>();
        ($x, staged)
    }};
    ($s:ident, $k:tt, $x:ident) => {
        ($x, ())
    };
}

/// Copies a staged argument back (`[out]`, `[outs]`) or checks that the operation left it alone
/// (`[in]`, `[ins]`).
macro_rules! unstage {
    ($s:ident, [in], $x:ident) => {
        assert!(crate::elements::same(&$s.down(&$x.1), $x.0), "the device input changed")
    };
    ($s:ident, [out], $x:ident) => {
        $x.0.copy_from_slice(&$s.down(&$x.1))
    };
    ($s:ident, [ins], $x:ident) => {
        for ((host, _), (staged, _)) in $x.0.iter().zip(&$x.1) {
            assert!(crate::elements::same(&$s.down(staged), host), "the device input changed");
        }
    };
    ($s:ident, [outs], $x:ident) => {
        for ((host, _), (staged, _)) in $x.0.iter_mut().zip(&$x.1) {
            host.copy_from_slice(&$s.down(staged));
        }
    };
    ($s:ident, $k:tt, $x:ident) => {};
}
pub(crate) use {host, stage, unstage};

/// Every allreduce algorithm.
pub const ALL_ALLREDUCE: &[AllreduceAlgorithm] = &[
    AllreduceAlgorithm::Auto,
    AllreduceAlgorithm::Native,
    AllreduceAlgorithm::Ring,
    AllreduceAlgorithm::RecursiveDoubling,
    AllreduceAlgorithm::Rabenseifner,
    AllreduceAlgorithm::Hierarchical,
    AllreduceAlgorithm::SharedMemory,
];

/// The allreduce algorithms for a communicator over several nodes: all but the shared-memory
/// one, which needs every rank on one node (`topology.rs` checks it refuses).
pub fn allreduce_algorithms_for(topology: &duralumin::Topology) -> &'static [AllreduceAlgorithm] {
    if topology.node_count() > 1 { &ALL_ALLREDUCE[..ALL_ALLREDUCE.len() - 1] } else { ALL_ALLREDUCE }
}

/// Every bcast algorithm.
pub const ALL_BCAST: &[BcastAlgorithm] =
    &[BcastAlgorithm::Auto, BcastAlgorithm::Native, BcastAlgorithm::Chain, BcastAlgorithm::Hierarchical];

/// The Mpi backend's implementation from the list: host vectors are its buffers.
macro_rules! mpi_backend {
    ($(
        $(#[$doc:meta])*
        fn $f:ident / $i:ident <$($lt:lifetime,)? $($g:ident: $b:path),*> ($($a:ident: $k:tt),* $(,)?)
            describe($call:expr => $elem:ident::<$($et:ty),+>) plan($plan:ident($($pa:expr),*));
    )*) => {
        impl Backend for MpiCommunicator {
            fn rank(&self) -> usize {
                MpiCommunicator::rank(self)
            }
            fn size(&self) -> usize {
                MpiCommunicator::size(self)
            }
            fn allreduce_algorithms(&self) -> &'static [AllreduceAlgorithm] {
                allreduce_algorithms_for(self.topology())
            }
            fn bcast_algorithms(&self) -> &'static [BcastAlgorithm] {
                ALL_BCAST
            }
            $(
                #[allow(unused_parens)]
                fn $f<$($lt,)? $($g: $b),*>(&self, nb: bool, $($a: host!($k)),*) -> Result<()> {
                    mpi_call!(nb, self.$f / $i($($a),*))
                }
            )*
        }
    };
}
duralumin::for_each_operation!(mpi_backend);

/// A device the HostTransfer tests run on: how to move host vectors in and out of its buffers
/// (synchronously; the tests' own business, not the library's), and two stand-ins for a
/// program's kernels on a stream.
pub trait TestDevice: Device + Clone {
    type Buf<T: Element>: DeviceSliceMut<Self, Elem = T>;
    /// A new buffer holding `v`, once the work queued on `stream` so far has run.
    fn up<T: Element>(&self, stream: &Self::Stream, v: &[T]) -> Self::Buf<T>;
    /// `b`'s contents once the work queued on `stream` has run.
    fn down<T: Element>(&self, stream: &Self::Stream, b: &Self::Buf<T>) -> Vec<T>;
    /// Holds `stream` up on the device for a few milliseconds: work queued behind it runs late
    /// unless something orders it (a slow kernel).
    fn delay(&self, stream: &Self::Stream);
    /// Copies `src` into `dst` (equal lengths) on `stream`, after the work queued there so far
    /// (a kernel that reads one buffer and writes another).
    fn copy<T: Element>(&self, stream: &Self::Stream, src: &Self::Buf<T>, dst: &mut Self::Buf<T>);
}

/// How long [`TestDevice::delay`] holds a stream.
pub const DELAY: std::time::Duration = std::time::Duration::from_millis(5);

impl TestDevice for HostDevice {
    type Buf<T: Element> = HostBuffer<T>;
    fn up<T: Element>(&self, _: &HostStream, v: &[T]) -> HostBuffer<T> {
        self.upload(v).expect("upload")
    }
    fn down<T: Element>(&self, _: &HostStream, b: &HostBuffer<T>) -> Vec<T> {
        self.download(b).expect("download")
    }
    fn delay(&self, stream: &HostStream) {
        let mut none = self.alloc_zeroed::<u8>(0).expect("alloc");
        self.launch(stream, &mut none, |_| std::thread::sleep(DELAY)).expect("launch");
    }
    fn copy<T: Element>(&self, stream: &HostStream, src: &HostBuffer<T>, dst: &mut HostBuffer<T>) {
        use duralumin::device::{Copy2d, DeviceSlice};
        assert_eq!(src.len(), dst.len(), "copy: lengths differ");
        let (from, bytes) = (src.device_ptr().addr() as *const u8, src.len() * size_of::<T>());
        // SAFETY: host device memory is host memory at its device address; both buffers hold
        // `len` elements, and `src` is kept alive until the copy has run (its keep-alive), `dst`
        // by the caller until the stream is synchronized (the tests download it).
        unsafe { self.copy_h2d(stream, dst.device_ptr(), from, Copy2d::contiguous(bytes), src.keep_alive()) }
            .expect("copy");
    }
}

#[cfg(feature = "cuda")]
impl TestDevice for CudaDevice {
    type Buf<T: Element> = cudarc::driver::CudaSlice<T>;
    fn up<T: Element>(&self, stream: &std::sync::Arc<cudarc::driver::CudaStream>, v: &[T]) -> Self::Buf<T> {
        // Any element type: the bytes go up as `u8` and the allocation is re-typed (at least
        // one byte, so even an empty buffer has an address).
        let mut bytes = bytemuck::cast_slice::<T, u8>(v).to_vec();
        bytes.resize(bytes.len().max(1), 0);
        let raw = stream.clone_htod(&bytes).expect("upload").leak();
        // SAFETY: `raw` is a live allocation of at least `v.len()` elements of `T` on `stream`,
        // initialized from `v`; the new slice owns it from here on.
        unsafe { stream.upgrade_device_ptr::<T>(raw, v.len()) }
    }
    fn delay(&self, stream: &std::sync::Arc<cudarc::driver::CudaStream>) {
        crate::cuda::delay(self.context(), stream, DELAY);
    }
    fn copy<T: Element>(
        &self,
        stream: &std::sync::Arc<cudarc::driver::CudaStream>,
        src: &Self::Buf<T>,
        dst: &mut Self::Buf<T>,
    ) {
        stream.memcpy_dtod(src, dst).expect("copy on the stream");
    }
    fn down<T: Element>(&self, stream: &std::sync::Arc<cudarc::driver::CudaStream>, b: &Self::Buf<T>) -> Vec<T> {
        stream.synchronize().expect("synchronize");
        let mut bytes = vec![0u8; b.len() * size_of::<T>()];
        let ptr = duralumin::device::DeviceSlice::<CudaDevice>::device_ptr(b).addr();
        // SAFETY: `b` holds `bytes.len()` bytes of device memory and its stream has finished.
        unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut bytes, ptr) }.expect("download");
        bytes.chunks_exact(size_of::<T>().max(1)).map(bytemuck::pod_read_unaligned).collect()
    }
}

/// HostTransfer on a device: host vectors are uploaded to device buffers (the receive buffer
/// too, so elements an operation must not touch keep their values), the operation is queued
/// stream-ordered or non-blocking, and the results are downloaded after synchronizing.
pub struct HostTransfer<D: TestDevice = HostDevice> {
    pub dev: D,
    pub comm: host_transfer::HostTransferCommunicator<D>,
    /// The sweep runs every allreduce and bcast algorithm (else only `Auto`).
    pub algorithms: bool,
}

/// Staged (not direct, though the host device allows it) in chunks of 64 to 256 bytes through
/// a ring of 16 cells: every "big" operation of the sweep pipelines through many chunks and
/// reuses the ring's cells, as on a GPU.
pub fn small_chunks() -> HostTransferConfig {
    HostTransferConfig::default()
        .with_chunk_bytes(256)
        // Operations of fewer than 4 full chunks are cut into 4 of at least 64 bytes: the
        // sweep has operations of one chunk, of cut chunks and of many full ones, and roots and
        // in-place ranks must cut the same chunks as the others.
        .with_min_chunk_bytes(64)
        .with_pipeline_chunks(4)
        .with_ring_cells(16)
        .with_direct(false)
        // Allreduces up to 64 bytes (counts 0, 1 and 7 of most types) reduce on the device; larger ones in MPI.
        .with_device_reduce_max_bytes(64)
        // Operations of 3 chunks or more run as one mover, smaller ones on the copy streams:
        // both paths, one after the other on the same ring; on a GPU (cudasim) as 3 blocks
        // sharing the chunks (the host device runs one).
        .with_mover_min_chunks(Some(3))
        .with_mover_blocks(3)
}

impl HostTransfer {
    pub fn new(world: &duralumin::mpi::topology::SimpleCommunicator, config: HostTransferConfig) -> Self {
        let dev = HostDevice::new(0);
        let stream = dev.stream().expect("host stream");
        Self::on(world, dev, stream, config)
    }
}

impl<D: TestDevice> HostTransfer<D> {
    /// HostTransfer reduces pairs without device kernels in MPI.
    fn user_pairs(&self) -> bool {
        true
    }

    pub fn on(
        world: &duralumin::mpi::topology::SimpleCommunicator,
        dev: D,
        stream: D::Stream,
        config: HostTransferConfig,
    ) -> Self {
        let comm = host_transfer::HostTransferCommunicator::with_config(world, dev.clone(), stream, config)
            .expect("communicator");
        HostTransfer { dev, comm, algorithms: false }
    }
}

/// Runs a HostTransfer method stream-ordered or non-blocking (waiting on its request).
macro_rules! ht_call {
    ($nb:expr, $c:expr, $f:ident / $i:ident ( $($a:expr),* $(,)? )) => {
        if $nb { $c.$i($($a),*)?.wait() } else { $c.$f($($a),*) }
    };
}

/// A staged argument as a stream-ordered backend takes it.
macro_rules! staged {
    ([in], $x:ident) => {
        &$x.1
    };
    ([out], $x:ident) => {
        &mut $x.1
    };
    ([ins], $x:ident) => {
        &$x.1.iter().map(|(b, p)| (b, *p)).collect::<Vec<_>>()
    };
    ([outs], $x:ident) => {
        &mut $x.1.iter_mut().map(|(b, p)| (b, *p)).collect::<Vec<_>>()
    };
    ($k:tt, $x:ident) => {
        $x.0
    };
}

/// The sweep's interface for a stream-ordered backend's adapter (`$adapter<D>` with fields
/// `dev`, `comm` and `algorithms`): host vectors are uploaded to device buffers (the receive
/// buffer too, so elements an operation must not touch keep their values), the operation is
/// queued stream-ordered or non-blocking, and the results are downloaded after synchronizing.
macro_rules! device_backend {
    ($adapter:ident where D: $($bound:tt)+) => {
        impl<D: $($bound)+> $adapter<D> {
            fn up<T: Element>(&self, v: &[T]) -> D::Buf<T> {
                self.dev.up(self.comm.stream(), v)
            }

            fn down<T: Element>(&self, b: &D::Buf<T>) -> Vec<T> {
                self.dev.down(self.comm.stream(), b)
            }
        }

        duralumin::for_each_operation!(device_backend_impl, $adapter where D: $($bound)+);
    };
}

/// A stream-ordered backend's implementation from the list (see [`device_backend!`]): each
/// argument staged on the device, the operation queued stream-ordered or non-blocking, the
/// results copied back after synchronizing.
macro_rules! device_backend_impl {
    (($adapter:ident where D: $($bound:tt)+)
        $(
            $(#[$doc:meta])*
            fn $f:ident / $i:ident <$($lt:lifetime,)? $($g:ident: $b:path),*> ($($a:ident: $k:tt),* $(,)?)
                describe($call:expr => $elem:ident::<$($et:ty),+>) plan($plan:ident($($pa:expr),*));
        )*
    ) => {
        impl<D: $($bound)+> Backend for $adapter<D> {
            fn rank(&self) -> usize {
                self.comm.rank()
            }
            fn size(&self) -> usize {
                self.comm.size()
            }
            fn allreduce_algorithms(&self) -> &'static [AllreduceAlgorithm] {
                if self.algorithms { allreduce_algorithms_for(&self.comm.topology()) } else { &[AllreduceAlgorithm::Auto] }
            }
            fn bcast_algorithms(&self) -> &'static [BcastAlgorithm] {
                if self.algorithms { ALL_BCAST } else { &[BcastAlgorithm::Auto] }
            }
            fn runs_user_pairs(&self) -> bool {
                self.user_pairs()
            }
            $(
                #[allow(unused_parens, unused_mut)]
                fn $f<$($lt,)? $($g: $b),*>(&self, nb: bool, $($a: host!($k)),*) -> Result<()> {
                    $(let mut $a = stage!(self, $k, $a);)*
                    ht_call!(nb, self.comm, $f / $i($(staged!($k, $a)),*))?;
                    self.comm.synchronize()?;
                    $(unstage!(self, $k, $a);)*
                    Ok(())
                }
            )*
        }
    };
}

device_backend!(HostTransfer where D: TestDevice);
#[cfg(feature = "cuda")]
device_backend!(Nccl where D: TestDevice + duralumin::NcclDevice);

/// The NCCL backend on a device, for the sweep (the same body as HostTransfer's).
#[cfg(feature = "cuda")]
pub struct Nccl<D: TestDevice + duralumin::NcclDevice> {
    pub dev: D,
    pub comm: duralumin::NcclCommunicator<D>,
    /// Unused: NCCL runs its own algorithms (`Auto` only).
    pub algorithms: bool,
}

#[cfg(feature = "cuda")]
impl<D: TestDevice + duralumin::NcclDevice> Nccl<D> {
    pub fn on(world: &duralumin::mpi::topology::SimpleCommunicator, dev: D, stream: D::Stream) -> Self {
        let comm = duralumin::NcclCommunicator::new(world, dev.clone(), stream).expect("NCCL communicator");
        Nccl { dev, comm, algorithms: false }
    }

    /// NCCL reduces the user pairs with their device kernels, and refuses them by name when
    /// the kernels were not built (no nightly toolchain); `DURALUMIN_REQUIRE_KERNELS=1` makes
    /// that a failure.
    fn user_pairs(&self) -> bool {
        use duralumin::device_code::{ReduceKernel, find_reduce_ptx};
        let built = find_reduce_ptx::<crate::elements::MinLoc, crate::elements::ArgMin>(ReduceKernel::Reduce);
        if let Err(e) = &built {
            let required = std::env::var_os("DURALUMIN_REQUIRE_KERNELS").is_some_and(|v| v == "1");
            assert!(!required, "DURALUMIN_REQUIRE_KERNELS=1 but the user kernels are missing: {e}");
        }
        built.is_ok()
    }
}
