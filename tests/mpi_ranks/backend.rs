//! The backends the sweep runs on: the sweep is written once against [`Backend`], whose
//! methods take and return host vectors and run the operation blocking or non-blocking, and is
//! instantiated for the Mpi backend and for HostTransfer on the host device (the same body that
//! will run for HostTransfer on CUDA).

use duralumin::backends::host_transfer::{self, HostTransferConfig};
#[cfg(feature = "cuda")]
use duralumin::device::cuda::CudaDevice;
use duralumin::device::host::{HostBuffer, HostDevice, HostStream};
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

/// One collective interface over host vectors, for the sweep.
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

    fn allreduce_with<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        s: &[T],
        r: &mut [T],
        op: O,
        a: AllreduceAlgorithm,
    ) -> Result<()>;
    fn allreduce_in_place_with<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        b: &mut [T],
        op: O,
        a: AllreduceAlgorithm,
    ) -> Result<()>;
    fn reduce<T: Element, O: ReduceOp<T>>(&self, nb: bool, s: &[T], r: &mut [T], root: usize, op: O) -> Result<()>;
    fn reduce_in_place<T: Element, O: ReduceOp<T>>(&self, nb: bool, b: &mut [T], root: usize, op: O) -> Result<()>;
    fn reduce_scatter<T: Element, O: ReduceOp<T>>(&self, nb: bool, s: &[T], r: &mut [T], op: O) -> Result<()>;
    fn reduce_scatter_in_place<T: Element, O: ReduceOp<T>>(&self, nb: bool, b: &mut [T], op: O) -> Result<()>;
    fn reduce_scatterv<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        s: &[T],
        r: &mut [T],
        counts: &[usize],
        op: O,
    ) -> Result<()>;
    fn reduce_scatterv_in_place<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        b: &mut [T],
        counts: &[usize],
        op: O,
    ) -> Result<()>;
    fn bcast_with<T: Element>(&self, nb: bool, b: &mut [T], root: usize, a: BcastAlgorithm) -> Result<()>;
    fn allgather<T: Element>(&self, nb: bool, s: &[T], r: &mut [T]) -> Result<()>;
    fn allgather_in_place<T: Element>(&self, nb: bool, b: &mut [T]) -> Result<()>;
    fn allgatherv<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()>;
    fn allgatherv_in_place<T: Element>(&self, nb: bool, b: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()>;
    fn alltoall<T: Element>(&self, nb: bool, s: &[T], r: &mut [T]) -> Result<()>;
    fn alltoall_in_place<T: Element>(&self, nb: bool, b: &mut [T]) -> Result<()>;
    fn alltoallv<T: Element>(
        &self,
        nb: bool,
        s: &[T],
        sc: &[usize],
        sd: &[usize],
        r: &mut [T],
        rc: &[usize],
        rd: &[usize],
    ) -> Result<()>;
    fn gather<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], root: usize) -> Result<()>;
    fn gather_in_place<T: Element>(&self, nb: bool, b: &mut [T], root: usize) -> Result<()>;
    fn gatherv<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()>;
    fn gatherv_in_place<T: Element>(&self, nb: bool, b: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()>;
    fn scatter<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], root: usize) -> Result<()>;
    fn scatter_in_place<T: Element>(&self, nb: bool, b: &mut [T], root: usize) -> Result<()>;
    fn scatterv<T: Element>(&self, nb: bool, s: &[T], c: &[usize], d: &[usize], r: &mut [T], root: usize)
    -> Result<()>;
    fn scatterv_in_place<T: Element>(&self, nb: bool, b: &mut [T], c: &[usize], d: &[usize], root: usize)
    -> Result<()>;
}

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
    fn allreduce_with<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        s: &[T],
        r: &mut [T],
        op: O,
        a: AllreduceAlgorithm,
    ) -> Result<()> {
        mpi_call!(nb, self.allreduce_with / iallreduce_with(s, r, op, a))
    }
    fn allreduce_in_place_with<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        b: &mut [T],
        op: O,
        a: AllreduceAlgorithm,
    ) -> Result<()> {
        mpi_call!(nb, self.allreduce_in_place_with / iallreduce_in_place_with(b, op, a))
    }
    fn reduce<T: Element, O: ReduceOp<T>>(&self, nb: bool, s: &[T], r: &mut [T], root: usize, op: O) -> Result<()> {
        mpi_call!(nb, self.reduce / ireduce(s, r, root, op))
    }
    fn reduce_in_place<T: Element, O: ReduceOp<T>>(&self, nb: bool, b: &mut [T], root: usize, op: O) -> Result<()> {
        mpi_call!(nb, self.reduce_in_place / ireduce_in_place(b, root, op))
    }
    fn reduce_scatter<T: Element, O: ReduceOp<T>>(&self, nb: bool, s: &[T], r: &mut [T], op: O) -> Result<()> {
        mpi_call!(nb, self.reduce_scatter / ireduce_scatter(s, r, op))
    }
    fn reduce_scatter_in_place<T: Element, O: ReduceOp<T>>(&self, nb: bool, b: &mut [T], op: O) -> Result<()> {
        mpi_call!(nb, self.reduce_scatter_in_place / ireduce_scatter_in_place(b, op))
    }
    fn reduce_scatterv<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        s: &[T],
        r: &mut [T],
        counts: &[usize],
        op: O,
    ) -> Result<()> {
        mpi_call!(nb, self.reduce_scatterv / ireduce_scatterv(s, r, counts, op))
    }
    fn reduce_scatterv_in_place<T: Element, O: ReduceOp<T>>(
        &self,
        nb: bool,
        b: &mut [T],
        counts: &[usize],
        op: O,
    ) -> Result<()> {
        mpi_call!(nb, self.reduce_scatterv_in_place / ireduce_scatterv_in_place(b, counts, op))
    }
    fn bcast_with<T: Element>(&self, nb: bool, b: &mut [T], root: usize, a: BcastAlgorithm) -> Result<()> {
        mpi_call!(nb, self.bcast_with / ibcast_with(b, root, a))
    }
    fn allgather<T: Element>(&self, nb: bool, s: &[T], r: &mut [T]) -> Result<()> {
        mpi_call!(nb, self.allgather / iallgather(s, r))
    }
    fn allgather_in_place<T: Element>(&self, nb: bool, b: &mut [T]) -> Result<()> {
        mpi_call!(nb, self.allgather_in_place / iallgather_in_place(b))
    }
    fn allgatherv<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
        mpi_call!(nb, self.allgatherv / iallgatherv(s, r, counts, displs))
    }
    fn allgatherv_in_place<T: Element>(&self, nb: bool, b: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
        mpi_call!(nb, self.allgatherv_in_place / iallgatherv_in_place(b, counts, displs))
    }
    fn alltoall<T: Element>(&self, nb: bool, s: &[T], r: &mut [T]) -> Result<()> {
        mpi_call!(nb, self.alltoall / ialltoall(s, r))
    }
    fn alltoall_in_place<T: Element>(&self, nb: bool, b: &mut [T]) -> Result<()> {
        mpi_call!(nb, self.alltoall_in_place / ialltoall_in_place(b))
    }
    fn alltoallv<T: Element>(
        &self,
        nb: bool,
        s: &[T],
        sc: &[usize],
        sd: &[usize],
        r: &mut [T],
        rc: &[usize],
        rd: &[usize],
    ) -> Result<()> {
        mpi_call!(nb, self.alltoallv / ialltoallv(s, sc, sd, r, rc, rd))
    }
    fn gather<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], root: usize) -> Result<()> {
        mpi_call!(nb, self.gather / igather(s, r, root))
    }
    fn gather_in_place<T: Element>(&self, nb: bool, b: &mut [T], root: usize) -> Result<()> {
        mpi_call!(nb, self.gather_in_place / igather_in_place(b, root))
    }
    fn gatherv<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()> {
        mpi_call!(nb, self.gatherv / igatherv(s, r, c, d, root))
    }
    fn gatherv_in_place<T: Element>(&self, nb: bool, b: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()> {
        mpi_call!(nb, self.gatherv_in_place / igatherv_in_place(b, c, d, root))
    }
    fn scatter<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], root: usize) -> Result<()> {
        mpi_call!(nb, self.scatter / iscatter(s, r, root))
    }
    fn scatter_in_place<T: Element>(&self, nb: bool, b: &mut [T], root: usize) -> Result<()> {
        mpi_call!(nb, self.scatter_in_place / iscatter_in_place(b, root))
    }
    fn scatterv<T: Element>(
        &self,
        nb: bool,
        s: &[T],
        c: &[usize],
        d: &[usize],
        r: &mut [T],
        root: usize,
    ) -> Result<()> {
        mpi_call!(nb, self.scatterv / iscatterv(s, c, d, r, root))
    }
    fn scatterv_in_place<T: Element>(
        &self,
        nb: bool,
        b: &mut [T],
        c: &[usize],
        d: &[usize],
        root: usize,
    ) -> Result<()> {
        mpi_call!(nb, self.scatterv_in_place / iscatterv_in_place(b, c, d, root))
    }
}

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

            /// Runs `f` on device copies of `s` and `r`, then copies the device result back into `r`.
            fn two<T: Element>(
                &self,
                s: &[T],
                r: &mut [T],
                f: impl FnOnce(&D::Buf<T>, &mut D::Buf<T>) -> Result<()>,
            ) -> Result<()> {
                let (ds, mut dr) = (self.up(s), self.up(r));
                f(&ds, &mut dr)?;
                self.comm.synchronize()?;
                r.copy_from_slice(&self.down(&dr));
                assert!(crate::elements::same(&self.down(&ds), s), "the device input changed");
                Ok(())
            }

            /// Runs `f` on a device copy of `b`, then copies it back.
            fn one<T: Element>(&self, b: &mut [T], f: impl FnOnce(&mut D::Buf<T>) -> Result<()>) -> Result<()> {
                let mut db = self.up(b);
                f(&mut db)?;
                self.comm.synchronize()?;
                b.copy_from_slice(&self.down(&db));
                Ok(())
            }
        }

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
            fn allreduce_with<T: Element, O: ReduceOp<T>>(
                &self,
                nb: bool,
                s: &[T],
                r: &mut [T],
                op: O,
                a: AllreduceAlgorithm,
            ) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, allreduce_with / iallreduce_with(s, r, op, a)))
            }
            fn allreduce_in_place_with<T: Element, O: ReduceOp<T>>(
                &self,
                nb: bool,
                b: &mut [T],
                op: O,
                a: AllreduceAlgorithm,
            ) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, allreduce_in_place_with / iallreduce_in_place_with(b, op, a)))
            }
            fn reduce<T: Element, O: ReduceOp<T>>(&self, nb: bool, s: &[T], r: &mut [T], root: usize, op: O) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, reduce / ireduce(s, r, root, op)))
            }
            fn reduce_in_place<T: Element, O: ReduceOp<T>>(&self, nb: bool, b: &mut [T], root: usize, op: O) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, reduce_in_place / ireduce_in_place(b, root, op)))
            }
            fn reduce_scatter<T: Element, O: ReduceOp<T>>(&self, nb: bool, s: &[T], r: &mut [T], op: O) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, reduce_scatter / ireduce_scatter(s, r, op)))
            }
            fn reduce_scatter_in_place<T: Element, O: ReduceOp<T>>(&self, nb: bool, b: &mut [T], op: O) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, reduce_scatter_in_place / ireduce_scatter_in_place(b, op)))
            }
            fn reduce_scatterv<T: Element, O: ReduceOp<T>>(
                &self,
                nb: bool,
                s: &[T],
                r: &mut [T],
                counts: &[usize],
                op: O,
            ) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, reduce_scatterv / ireduce_scatterv(s, r, counts, op)))
            }
            fn reduce_scatterv_in_place<T: Element, O: ReduceOp<T>>(
                &self,
                nb: bool,
                b: &mut [T],
                counts: &[usize],
                op: O,
            ) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, reduce_scatterv_in_place / ireduce_scatterv_in_place(b, counts, op)))
            }
            fn bcast_with<T: Element>(&self, nb: bool, b: &mut [T], root: usize, a: BcastAlgorithm) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, bcast_with / ibcast_with(b, root, a)))
            }
            fn allgather<T: Element>(&self, nb: bool, s: &[T], r: &mut [T]) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, allgather / iallgather(s, r)))
            }
            fn allgather_in_place<T: Element>(&self, nb: bool, b: &mut [T]) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, allgather_in_place / iallgather_in_place(b)))
            }
            fn allgatherv<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, allgatherv / iallgatherv(s, r, counts, displs)))
            }
            fn allgatherv_in_place<T: Element>(&self, nb: bool, b: &mut [T], counts: &[usize], displs: &[usize]) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, allgatherv_in_place / iallgatherv_in_place(b, counts, displs)))
            }
            fn alltoall<T: Element>(&self, nb: bool, s: &[T], r: &mut [T]) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, alltoall / ialltoall(s, r)))
            }
            fn alltoall_in_place<T: Element>(&self, nb: bool, b: &mut [T]) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, alltoall_in_place / ialltoall_in_place(b)))
            }
            fn alltoallv<T: Element>(
                &self,
                nb: bool,
                s: &[T],
                sc: &[usize],
                sd: &[usize],
                r: &mut [T],
                rc: &[usize],
                rd: &[usize],
            ) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, alltoallv / ialltoallv(s, sc, sd, r, rc, rd)))
            }
            fn gather<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], root: usize) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, gather / igather(s, r, root)))
            }
            fn gather_in_place<T: Element>(&self, nb: bool, b: &mut [T], root: usize) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, gather_in_place / igather_in_place(b, root)))
            }
            fn gatherv<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, gatherv / igatherv(s, r, c, d, root)))
            }
            fn gatherv_in_place<T: Element>(&self, nb: bool, b: &mut [T], c: &[usize], d: &[usize], root: usize) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, gatherv_in_place / igatherv_in_place(b, c, d, root)))
            }
            fn scatter<T: Element>(&self, nb: bool, s: &[T], r: &mut [T], root: usize) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, scatter / iscatter(s, r, root)))
            }
            fn scatter_in_place<T: Element>(&self, nb: bool, b: &mut [T], root: usize) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, scatter_in_place / iscatter_in_place(b, root)))
            }
            fn scatterv<T: Element>(
                &self,
                nb: bool,
                s: &[T],
                c: &[usize],
                d: &[usize],
                r: &mut [T],
                root: usize,
            ) -> Result<()> {
                self.two(s, r, |s, r| ht_call!(nb, self.comm, scatterv / iscatterv(s, c, d, r, root)))
            }
            fn scatterv_in_place<T: Element>(
                &self,
                nb: bool,
                b: &mut [T],
                c: &[usize],
                d: &[usize],
                root: usize,
            ) -> Result<()> {
                self.one(b, |b| ht_call!(nb, self.comm, scatterv_in_place / iscatterv_in_place(b, c, d, root)))
            }
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
