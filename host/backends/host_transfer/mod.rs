//! The HostTransfer backend: collectives on device buffers, staged through pinned host memory,
//! ordered on a stream like kernels.
//!
//! A [`HostTransferCommunicator`] is an MPI communicator bound to a stream of a [`Device`]. Every operation
//! is queued on that stream and the calling thread returns at once:
//!
//! 1. a copy stream copies chunk `k` of the input from the device into the chunk's cells of the
//!    communicator's pinned staging ring and raises the ring's *staged* counter;
//! 2. the proxy thread (the progress engine), which polls that counter, runs the MPI part of
//!    chunk `k` on the cells (the Mpi backend's own plans: native MPI or Duralumin's
//!    algorithms), then raises the *output* counter;
//! 3. the other copy stream, waiting on the device for the output counter, copies the chunk's
//!    result back into the device buffer; the proxy thread then hands the cells back, and a
//!    later chunk refills them.
//!
//! Chunks are pipelined: while MPI works on chunk `k`, the stream copies the results of earlier
//! chunks back and stages later ones. Operations with nothing to copy back (a bcast root, a
//! send, a reduce or gather off the root) release the stream once their input is staged: the
//! stream does not wait for the MPI part, which sends from ring cells that are handed back only
//! once it is through (its request completes with the stream; an MPI error is then reported by
//! the communicator's next call). Every staged operation streams through the communicator's
//! staging ring, pinned memory taken once when the communicator is made
//! ([`HostTransferConfig::ring_cells`] cells of [`HostTransferConfig::chunk_bytes`]), in the
//! order operations were queued: the device waits for a cell until the proxy thread hands it
//! back, so queueing an operation never allocates or waits, whatever its size. The
//! proxy thread starts the MPI parts of one communicator's operations in the order they were
//! queued (a ticket per operation), which is the same order on every rank, as MPI requires.
//!
//! Buffers an operation reads are [`DeviceSlice`]s; buffers it writes (outputs, in-place
//! buffers) are [`crate::device::DeviceSliceMut`]s, as in rsmpi's `Buffer`/`BufferMut`: a
//! shared view (cudarc's `CudaView`) can be sent from but not received into. On CUDA, each
//! operation also takes part in cudarc's per-buffer event tracking (see the `cuda` device's
//! module docs).
//!
//! Errors in the MPI part are recorded and returned by the communicator's next call or by the
//! operation's request; the stream is released either way (the output then holds unspecified
//! values), so a failure never hangs the device.
//!
//! # Queue order
//!
//! The calling thread queues all of an operation's device work, each item after whatever it
//! waits for: the queue-order rule, argued in `docs/architecture.md#the-queue-order-rule`. The
//! host device built by [`HostDevice::with_queues`](crate::device::cpu::HostDevice::with_queues)
//! runs streams on shared queues as a GPU may, so the tests catch a wait that breaks it.

mod collectives;
mod copies;
mod plans;
mod proxy;
mod request;
mod ring;
mod staging;
mod steps;

use std::cell::{Cell, OnceCell, RefCell};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use request::DeviceRequest;

/// The HostTransfer backend's communicator under its old name.
#[deprecated(since = "0.2.0", note = "renamed `HostTransferCommunicator` (also at the crate root)")]
pub type Communicator<D> = HostTransferCommunicator<D>;

use crate::api::error::{Error, Result};
use crate::api::request::DeferredError;
use crate::backends::mpi::Tuning;
use crate::common::progress::{Engine, Task};
use crate::device::PoolStats;
use crate::device::pool::Pools;
use crate::device::{Device, DeviceSlice};
use crate::reliability::OnTimeout;
use crate::reliability::crosscheck::Pairs;
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::{Signature, State};

/// Pipelining and memory settings of a HostTransfer communicator. Every rank must use the same
/// values (they decide how operations are cut into chunks).
///
/// Start from [`HostTransferConfig::default()`] and change what you need with the `with_*`
/// setters (or the fields): the struct is `#[non_exhaustive]`, so settings can be added
/// without breaking callers. The defaults and the measurements behind them are in
/// `docs/host_transfer.md`.
///
/// ```
/// let c = duralumin::HostTransferConfig::default().with_chunk_bytes(256 << 10).with_ring_cells(8);
/// assert_eq!((c.chunk_bytes, c.ring_cells), (256 << 10, 8));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostTransferConfig {
    /// The largest chunk, in bytes per direction (rounded down to whole elements), and the size
    /// of a cell of the staging ring. A chunk of a reduction occupies one cell in place and two
    /// out of place (its send and its receive side); collectives over per-rank blocks
    /// (v-collectives included) cut each block into chunks of this size over the number of
    /// ranks; point-to-point lists take a cell per message. Operations larger than
    /// [`pipeline_chunks`](Self::pipeline_chunks) chunks of this size are cut into as many
    /// chunks as they need.
    pub chunk_bytes: usize,
    /// The smallest chunk an operation is cut into to pipeline it, in bytes per direction.
    pub min_chunk_bytes: usize,
    /// Operations of less than `pipeline_chunks` full chunks are cut into this many smaller
    /// ones (of at least [`min_chunk_bytes`](Self::min_chunk_bytes)), so that their copies
    /// overlap each other and the MPI part too. Operations whose ranks may cut different
    /// numbers of chunks (gatherv, scatterv, alltoallv, point-to-point, which send their chunks
    /// as point-to-point messages) always use full chunks. At least 1.
    pub pipeline_chunks: usize,
    /// Cells of the staging ring, a power of two: the communicator holds `ring_cells ×
    /// chunk_bytes` of pinned memory from its creation on (and 4 KiB for its movers' blocks),
    /// and as many chunks can be between "copied to the host" and "copied back" at once. An
    /// operation whose one chunk needs more cells than the ring has (a point-to-point list of
    /// more messages than cells) fails with [`Error::PoolExhausted`] before anything is queued.
    pub ring_cells: usize,
    /// On devices whose memory the host can address (the host device), run the MPI part on
    /// the device buffers themselves instead of staging copies. V-collectives and
    /// point-to-point operations still stage: they pack blocks, or send their chunks as
    /// point-to-point messages, which every rank must cut alike.
    pub direct: bool,
    /// Allreduces of at most this many bytes reduce on the device: the ranks' contributions
    /// are allgathered into staging and the device combines them in rank order (with the
    /// reduction kernels on a GPU) instead of the MPI library combining them on the host. It
    /// moves `size` times the data to the device, so it pays only where host reduction is the
    /// bottleneck (operators MPI has no native form for, few ranks); 0 turns it off.
    pub device_reduce_max_bytes: usize,
    /// Operations on the device buffers themselves ([`direct`](Self::direct)) of at most this
    /// many bytes start on the calling thread when their stream has nothing queued and the
    /// communicator nothing in flight: the calling thread runs their MPI part for at most
    /// [`inline_wait`](Self::inline_wait), and one that is through by then leaves nothing on
    /// the stream. One that is not (a late peer) goes on on the proxy thread, and the stream
    /// waits for it as for any other. Small operations then cost what the Mpi backend's do,
    /// without a hand-off between threads (see `docs/host_transfer.md`). 0 turns it off.
    pub inline_max_bytes: usize,
    /// How long the calling thread runs a small operation's MPI part before it hands the rest
    /// to the proxy thread (see [`inline_max_bytes`](Self::inline_max_bytes)): the longest an
    /// operation's call may take beyond queueing it.
    pub inline_wait: std::time::Duration,
    /// Staged operations of at least this many chunks, on a device with a mover, are queued as
    /// one mover: a single item that runs every chunk's copies and counters, so that queueing
    /// them costs the same at any size. Smaller ones queue their copies and flag operations
    /// chunk by chunk on two copy streams, which overlap the two directions (see
    /// `docs/host_transfer.md`, "The mover"). `None`: the device's choice
    /// ([`Device::mover_min_chunks`]: every staged
    /// operation on the host device, none on a GPU until the mover is measured there);
    /// `Some(usize::MAX)`: never.
    pub mover_min_chunks: Option<usize>,
    /// Blocks a GPU mover is launched as, each copying its share of every chunk, so that
    /// more copies are in flight over the bus (a read of host memory waits a bus round trip);
    /// from 1 to 64 (`duralumin_kernels::mover::MAX_BLOCKS`). A launch takes at most one block
    /// per multiprocessor, all resident at once (a cooperative launch), and one where the
    /// device refuses a cooperative launch. The host device runs one, as does HIP, whose
    /// cooperative launch of module kernels is newer than the ROCm this builds against
    /// (`docs/host_transfer.md`, "The mover").
    pub mover_blocks: usize,
}

impl HostTransferConfig {
    /// Elements per row and chunk of a staged operation with `count` elements per row, `width`
    /// rows sharing the chunk size and `sz`-byte elements: `chunk_bytes`' worth, or less for
    /// operations of fewer than `pipeline_chunks` full chunks, unless `fixed` (ranks that must
    /// cut their chunks alike without knowing each other's counts, or that stage more rows than
    /// `2 × width`). It depends only on what every rank of the operation knows alike (not on
    /// the rows a rank stages, which differ at a root or in place), so every rank cuts the same
    /// chunks.
    pub(crate) fn chunk_elems(&self, count: usize, sz: usize, width: usize, fixed: bool) -> usize {
        let (sz, width) = (sz.max(1), width.max(1));
        let elems = |bytes: usize| (bytes / sz / width).max(1);
        let full = elems(self.chunk_bytes);
        if fixed {
            return full;
        }
        let smallest = elems(self.min_chunk_bytes).min(full);
        count.div_ceil(self.pipeline_chunks.max(1)).clamp(smallest, full)
    }

    /// Chunks a staged allreduce, reduce or broadcast of `bytes` bytes is cut into under these
    /// settings: what [`mover_min_chunks`](Self::mover_min_chunks) counts. (Operations of
    /// several rows per rank divide each chunk among the rows; allreduces that reduce on the
    /// device, [`device_reduce_max_bytes`](Self::device_reduce_max_bytes), take full chunks;
    /// one on the device buffers themselves, [`direct`](Self::direct), is one chunk.)
    pub fn chunks_for(&self, bytes: usize) -> usize {
        bytes.div_ceil(self.chunk_elems(bytes, 1, 1, false)).max(1)
    }

    /// Bytes of one ring cell: `chunk_bytes` rounded up to a cache line, so every cell starts
    /// aligned for any element.
    fn cell_bytes(&self) -> Option<usize> {
        self.chunk_bytes.checked_next_multiple_of(64)
    }
}

with_setters!(HostTransferConfig {
    chunk_bytes: usize => with_chunk_bytes,
    min_chunk_bytes: usize => with_min_chunk_bytes,
    pipeline_chunks: usize => with_pipeline_chunks,
    ring_cells: usize => with_ring_cells,
    direct: bool => with_direct,
    device_reduce_max_bytes: usize => with_device_reduce_max_bytes,
    inline_max_bytes: usize => with_inline_max_bytes,
    inline_wait: std::time::Duration => with_inline_wait,
    mover_min_chunks: Option<usize> => with_mover_min_chunks,
    mover_blocks: usize => with_mover_blocks,
});

impl Default for HostTransferConfig {
    fn default() -> Self {
        HostTransferConfig {
            chunk_bytes: 2 << 20,
            min_chunk_bytes: 128 << 10,
            pipeline_chunks: 8,
            ring_cells: 16,
            direct: true,
            device_reduce_max_bytes: 0,
            inline_max_bytes: 64 << 10,
            inline_wait: std::time::Duration::from_micros(20),
            mover_min_chunks: None,
            mover_blocks: 4,
        }
    }
}

/// What the operations of a communicator (and its in-flight work on the proxy thread) share.
pub(crate) struct Shared<D: Device> {
    /// The Mpi backend communicator the proxy thread runs the MPI parts on.
    pub(crate) mpi: Mutex<crate::MpiCommunicator>,
    pub(crate) device: Arc<D>,
    pub(crate) pools: Arc<Pools<D>>,
    /// The ticket whose MPI part may run now.
    pub(crate) turn: AtomicU64,
    pub(crate) errors: Arc<DeferredError>,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    /// The MPI library's largest tag, read once (checking a tag must not wait for the proxy
    /// thread's hold on `mpi`).
    pub(crate) max_tag: i32,
    /// The staging ring every staged operation streams through.
    pub(crate) ring: ring::Ring<D>,
    /// The operations' numbers, flight recorder, deadline and poisoned state (the Mpi
    /// communicator's: see [`crate::reliability`]).
    pub(crate) monitor: Arc<Monitor>,
}

/// A HostTransfer communicator: an MPI communicator bound to a device stream.
///
/// `Send` but not `Sync`, like the Mpi backend's communicator: one thread queues its operations
/// at a time (so their order is the program's order on every rank).
pub struct HostTransferCommunicator<D: Device> {
    shared: Arc<Shared<D>>,
    stream: D::Stream,
    /// The internal stream non-blocking operations run on (made on first use).
    side: OnceCell<D::Stream>,
    /// The internal device-to-host and host-to-device copy streams of pipelined staging (made
    /// on first use).
    copies: OnceCell<(D::Stream, D::Stream)>,
    tickets: Cell<u64>,
    /// The communicator's next chunk number and ring position (see [`ring`]).
    ring_next: Cell<(u64, u64)>,
    /// The *drained* value the operations queued so far reach (the flag of their last chunk
    /// that is copied back).
    drained_upto: Cell<u32>,
    /// The host parts of operations queued and maybe not yet through, which
    /// [`HostTransferCommunicator::synchronize`] drives while it waits.
    pending: RefCell<Vec<Arc<Task>>>,
    config: HostTransferConfig,
    engine: Arc<Engine>,
    _not_sync: PhantomData<Cell<()>>,
}

impl<D: Device> std::fmt::Debug for HostTransferCommunicator<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostTransferCommunicator")
            .field("rank", &self.shared.rank)
            .field("size", &self.shared.size)
            .field("device", &self.shared.device.name())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl<D: Device> HostTransferCommunicator<D> {
    /// A communicator over the ranks of `comm` (duplicated, like
    /// [`crate::MpiCommunicator::new`]) whose operations are ordered on `stream` of `device`.
    pub fn new<C: mpi::topology::Communicator>(comm: &C, device: D, stream: D::Stream) -> Result<Self> {
        Self::with_config(comm, device, stream, HostTransferConfig::default())
    }

    /// As [`HostTransferCommunicator::new`], with explicit pipelining settings.
    pub fn with_config<C: mpi::topology::Communicator>(
        comm: &C,
        device: D,
        stream: D::Stream,
        config: HostTransferConfig,
    ) -> Result<Self> {
        let mpi = crate::MpiCommunicator::new(comm)?;
        Self::from_mpi(mpi, Arc::new(device), stream, config)
    }

    fn from_mpi(
        mpi: crate::MpiCommunicator,
        device: Arc<D>,
        stream: D::Stream,
        config: HostTransferConfig,
    ) -> Result<Self> {
        if !device.owns(&stream) {
            return Err(Error::WrongDevice {
                what: "stream",
                expected: device.name(),
                found: "a stream of another device or context".into(),
            });
        }
        let at_least_one = [config.chunk_bytes, config.pipeline_chunks, config.mover_blocks].iter().all(|&n| n > 0);
        let blocks = config.mover_blocks <= duralumin_kernels::mover::MAX_BLOCKS;
        let cell_bytes = config.cell_bytes().filter(|_| at_least_one && blocks);
        let Some(cell_bytes) = cell_bytes.filter(|_| config.ring_cells.is_power_of_two()) else {
            return Err(Error::InvalidConfig(
                "chunk_bytes, pipeline_chunks and mover_blocks must be at least 1, mover_blocks at most 32, and \
                 ring_cells a power of two",
            ));
        };
        let (rank, size, max_tag) = (mpi.rank(), mpi.size(), mpi.max_tag());
        let monitor = Arc::clone(mpi.monitor());
        // The pool lends whole powers of two, of at least its smallest block.
        let ring_bytes = config.ring_cells.saturating_mul(cell_bytes).max(crate::device::pool::MIN_BLOCK);
        // Room for the ring and its movers' arrival words (one smallest block).
        let pools_bytes = ring_bytes.checked_next_power_of_two().unwrap_or(ring_bytes);
        let pools = Pools::new(Arc::clone(&device), pools_bytes.saturating_add(crate::device::pool::MIN_BLOCK));
        let ring = ring::Ring::new(&pools, config.ring_cells, cell_bytes, mpi.sends_left_flag())?;
        Ok(HostTransferCommunicator {
            shared: Arc::new(Shared {
                mpi: Mutex::new(mpi),
                device,
                pools,
                turn: AtomicU64::new(0),
                errors: Arc::default(),
                rank,
                size,
                max_tag,
                ring,
                monitor,
            }),
            stream,
            side: OnceCell::new(),
            copies: OnceCell::new(),
            tickets: Cell::new(0),
            ring_next: Cell::new((0, 0)),
            drained_upto: Cell::new(0),
            pending: RefCell::default(),
            config,
            engine: Engine::get()?,
            _not_sync: PhantomData,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.shared.size
    }

    /// This rank's place, as the operations' rules read it.
    pub(crate) fn ranks(&self) -> crate::operations::Ranks {
        crate::operations::Ranks { rank: self.rank(), size: self.size() }
    }

    /// The stream operations are ordered on.
    pub fn stream(&self) -> &D::Stream {
        &self.stream
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.shared.device
    }

    /// The pipelining settings.
    pub fn config(&self) -> HostTransferConfig {
        self.config
    }

    /// The staging pool's counters: the ring (two blocks, its cells and its movers' arrival
    /// words, lent for the communicator's life),
    /// the flags in use, the high-water mark. Constant once the communicator is made, apart
    /// from the flags of operations in flight.
    pub fn pool_stats(&self) -> PoolStats {
        self.shared.pools.stats()
    }

    /// A communicator over the same ranks, with the same device, stream and settings, and a
    /// pool of its own; its traffic never mixes with this one's.
    pub fn dup(&self) -> Result<Self> {
        let mpi = self.mpi().dup()?;
        Self::from_mpi(mpi, Arc::clone(&self.shared.device), self.stream.clone(), self.config)
    }

    /// Revokes the communicator (`MPIX_Comm_revoke`), as [`crate::MpiCommunicator::revoke`] does:
    /// every rank's pending and later operations on it fail with [`Error::Revoked`] (or
    /// [`Error::Aborted`]), and this rank's queued operations are let go, their stream flags
    /// raised, so the stream goes on (the outputs of those operations are undefined). Needs ULFM;
    /// without it, [`Error::Unsupported`] and nothing changes. See `docs/reliability.md`.
    pub fn revoke(&self) -> Result<()> {
        self.mpi().revoke()
    }

    /// Fault-tolerant agreement over the ranks still alive, as [`crate::MpiCommunicator::agree`]:
    /// whether `ok` holds on all of them and no process failed since the last agreement. Works
    /// on a revoked communicator. Host-side: it is not ordered on the stream. Needs ULFM.
    pub fn agree(&self, ok: bool) -> Result<bool> {
        self.mpi().agree(ok)
    }

    /// A communicator over the ranks still alive, as [`crate::MpiCommunicator::shrink`], with this
    /// one's device, stream and settings and a pool of its own; collective over the survivors.
    /// Works on a revoked communicator. Needs ULFM.
    pub fn shrink(&self) -> Result<Self> {
        let mpi = self.mpi().shrink()?;
        Self::from_mpi(mpi, Arc::clone(&self.shared.device), self.stream.clone(), self.config)
    }

    /// The thresholds of the automatic algorithm choice for the MPI parts (the inner Mpi
    /// communicator's: [`crate::MpiCommunicator::tuning`]).
    pub fn tuning(&self) -> Tuning {
        self.mpi().tuning()
    }

    /// Which node each rank runs on ([`MpiCommunicator::topology`](crate::MpiCommunicator::topology)).
    pub fn topology(&self) -> crate::Topology {
        self.mpi().topology().clone()
    }

    /// Sets the thresholds of the automatic algorithm choice (the same on every rank). The MPI
    /// part of each chunk picks its algorithm by the chunk's size, so thresholds above the
    /// chunk size ([`HostTransferConfig::chunk_bytes`], or `max_chunk_bytes` for operations
    /// whose chunks grow) never pick the large-message algorithms. Applies to operations queued
    /// from now on; ones already queued may still start with the old ones.
    pub fn set_tuning(&mut self, tuning: Tuning) {
        self.mpi().set_tuning(tuning);
    }

    /// The inner Mpi communicator (the proxy thread locks it only while it starts a chunk).
    fn mpi(&self) -> std::sync::MutexGuard<'_, crate::MpiCommunicator> {
        self.shared.mpi.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Blocks until every operation queued so far has completed on the stream (and the
    /// non-blocking ones on the internal stream), then reports any error they had.
    ///
    /// While it waits, the calling thread drives the host parts of this communicator's
    /// operations itself (the proxy thread's polls, MPI's progress), and on the host device runs
    /// the stream's queued work, rather than waiting for those threads to be scheduled: a
    /// small operation followed by `synchronize` then costs about what the MPI call does, plus
    /// the queueing.
    ///
    /// The wait has the communicator's deadline (see [`set_timeout`](Self::set_timeout)): past
    /// it, the ranks report where they are, then the job is aborted or, under
    /// [`OnTimeout::Error`], this returns [`Error::Timeout`] once the communicator is given up
    /// (its flags raised, so the streams go on; the outputs are then undefined).
    pub fn synchronize(&self) -> Result<()> {
        let m = &self.shared.monitor;
        if self.is_through()? {
            // Nothing to wait for (operations that ran on the calling thread leave nothing
            // behind): no wait to record.
            m.check_poison(Asker::Waiter(0))?;
            return self.shared.errors.check();
        }
        let wait = m.wait_begin("synchronize");
        let waited = self.wait_for_streams();
        m.wait_end(wait);
        waited?;
        m.check_poison(Asker::Waiter(wait))?;
        self.shared.errors.check()
    }

    /// Waits until the stream (and the side stream, if one was made) has run what was queued
    /// on it, driving the operations' host parts meanwhile; under [`OnTimeout::Error`] a
    /// give-up ends the wait.
    fn wait_for_streams(&self) -> Result<()> {
        let (device, m) = (&self.shared.device, &self.shared.monitor);
        let stop = || m.poisoned().is_some();
        let give_up: crate::device::GiveUp<'_> = (m.on_timeout() == OnTimeout::Error).then_some(&stop);
        device.synchronize_helping(&self.stream, &mut || self.drive_pending(), give_up)?;
        match self.side.get() {
            Some(side) => device.synchronize_helping(side, &mut || self.drive_pending(), give_up),
            None => Ok(()),
        }
    }

    /// The deadline of every operation and wait (`None`: none), as on the Mpi backend
    /// ([`crate::MpiCommunicator::timeout`]).
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.shared.monitor.timeout()
    }

    /// Sets the deadline of the operations called and the waits begun after this call (`None`:
    /// none); those called before keep theirs, even if still queued or running. An operation
    /// whose MPI part runs past its deadline on the proxy thread, or a
    /// [`synchronize`](Self::synchronize) or request wait that does, is reported by every rank
    /// that can, then handled as [`on_timeout`](Self::on_timeout) says.
    pub fn set_timeout(&mut self, timeout: Option<std::time::Duration>) {
        self.shared.monitor.set_timeout(timeout);
    }

    /// What a timeout does ([`OnTimeout::Abort`] by default).
    pub fn on_timeout(&self) -> OnTimeout {
        self.shared.monitor.on_timeout()
    }

    /// Sets what a timeout does. Under [`OnTimeout::Error`] the MPI parts always stage (never
    /// run on host-accessible device memory directly), so an abandoned operation leaves MPI
    /// only memory the library owns. Operations queued before a switch from `Abort` keep
    /// running on the device buffers themselves, so a give-up of one of them without a
    /// revocation (ULFM) ends the job, as under `Abort`: switch with nothing queued (after
    /// [`synchronize`](Self::synchronize)) to have errors for all of them
    /// (`docs/reliability.md`).
    pub fn set_on_timeout(&mut self, on_timeout: OnTimeout) {
        self.shared.monitor.set_on_timeout(on_timeout);
    }

    /// Whether collectives compare their signatures across ranks before anything is queued.
    pub fn check(&self) -> bool {
        self.shared.monitor.check()
    }

    /// Turns the signature check on or off (the same on every rank). The check runs on the
    /// calling thread when an operation is queued: it waits for every rank to queue the same
    /// operation.
    pub fn set_check(&mut self, on: bool) {
        self.shared.monitor.set_check(on);
    }

    /// Whether the communicator was given up (every call on it fails).
    pub fn is_aborted(&self) -> bool {
        self.shared.monitor.poisoned().is_some()
    }

    /// Operations of this communicator queued or running.
    pub fn ops_in_flight(&self) -> usize {
        self.shared.monitor.in_flight()
    }

    /// Numbers, records and plans an operation (see [`crate::reliability::prepare`]); a
    /// planned one is recorded as queued.
    fn prepare<P>(
        &self,
        sig: Signature,
        pairs: Option<Pairs>,
        plan: &mut dyn FnMut() -> Result<P>,
    ) -> Result<((OpId, Signature), P)> {
        let m = &self.shared.monitor;
        // Running while its signature check runs, if it has one.
        let checks = m.checks(&sig);
        let op = m.begin(sig, if checks { State::Running } else { State::Queued })?;
        let planned = crate::reliability::prepare(m, &self.shared.errors, op, &sig, pairs, plan)?;
        if checks {
            m.set(op, State::Queued, None);
        }
        Ok(((op, sig), planned))
    }

    /// Whether every operation queued so far is through: both streams have run their work and
    /// no host part is pending.
    fn is_through(&self) -> Result<bool> {
        let device = &self.shared.device;
        if !self.pending.borrow().iter().all(|t| t.is_done()) || !device.query(&self.stream)? {
            return Ok(false);
        }
        self.side.get().map_or(Ok(true), |side| device.query(side))
    }

    /// Remembers the host part of an operation just queued, for [`HostTransferCommunicator::synchronize`].
    fn track(&self, task: Arc<Task>) {
        let mut pending = self.pending.borrow_mut();
        pending.retain(|t| !t.is_done());
        pending.push(task);
    }

    /// Polls the host parts of this communicator's operations once, in the order they were
    /// queued; whether any is still pending. (An operation's future holds the shared state, not
    /// the communicator, so polling it cannot come back here.)
    fn drive_pending(&self) -> bool {
        let mut pending = self.pending.borrow_mut();
        pending.retain(|t| !t.poll_once());
        !pending.is_empty()
    }

    /// The internal stream of non-blocking operations, made to wait for the work queued on the
    /// communicator's stream so far.
    fn side_stream(&self) -> Result<&D::Stream> {
        if self.side.get().is_none() {
            let s = self.shared.device.new_stream()?;
            let _ = self.side.set(s);
        }
        let side = self.side.get().ok_or(Error::Progress("no internal stream"))?;
        self.shared.device.join(side, &self.stream)?;
        Ok(side)
    }

    /// The internal copy streams (device-to-host, host-to-device), made on first use.
    fn copy_streams(&self) -> Result<(&D::Stream, &D::Stream)> {
        if self.copies.get().is_none() {
            let pair = (self.shared.device.new_stream()?, self.shared.device.new_stream()?);
            let _ = self.copies.set(pair);
        }
        let (i, o) = self.copies.get().ok_or(Error::Progress("no copy streams"))?;
        Ok((i, o))
    }

    fn next_ticket(&self) -> u64 {
        let t = self.tickets.get();
        self.tickets.set(t + 1);
        t
    }

    /// Checks that a buffer lives on this communicator's device.
    fn check_buffer<B: DeviceSlice<D> + ?Sized>(&self, what: &'static str, buf: &B) -> Result<()> {
        crate::device::check_on(&*self.shared.device, what, buf)
    }
}

#[cfg(feature = "cuda")]
impl HostTransferCommunicator<crate::device::cuda::CudaDevice> {
    /// A communicator over the ranks of `comm` whose operations are ordered on the CUDA stream
    /// `stream`, on the device of the stream's context (a
    /// [`CudaDevice::new`](crate::device::cuda::CudaDevice::new) of it, with its own kernels
    /// and flag path: the [`device`](Self::device) accessor returns it). As
    /// [`new`](Self::new) otherwise.
    pub fn from_stream<C: mpi::topology::Communicator>(
        comm: &C,
        stream: Arc<cudarc::driver::CudaStream>,
    ) -> Result<Self> {
        Self::from_stream_with_config(comm, stream, HostTransferConfig::default())
    }

    /// As [`from_stream`](Self::from_stream), with explicit pipelining settings.
    pub fn from_stream_with_config<C: mpi::topology::Communicator>(
        comm: &C,
        stream: Arc<cudarc::driver::CudaStream>,
        config: HostTransferConfig,
    ) -> Result<Self> {
        let device = crate::device::cuda::CudaDevice::new(Arc::clone(stream.context()))?;
        Self::with_config(comm, device, stream, config)
    }
}

impl<D: Device> Shared<D> {
    /// Whether `ticket` may start its MPI part.
    fn has_turn(&self, ticket: u64) -> bool {
        self.turn.load(Ordering::Acquire) == ticket
    }

    /// Lets the next ticket start.
    fn pass_turn(&self, ticket: u64) {
        self.turn.store(ticket + 1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::HostTransferConfig;

    /// Operations of fewer than `pipeline_chunks` full chunks are cut into that many chunks of
    /// at least `min_chunk_bytes`; larger ones into full chunks, as many as they need;
    /// operations whose ranks must cut alike without knowing each other's counts always use
    /// full chunks.
    #[test]
    fn chunks_are_full_or_cut_for_pipelining() {
        let config = HostTransferConfig {
            chunk_bytes: 4 << 10,
            min_chunk_bytes: 1 << 10,
            pipeline_chunks: 4,
            ..HostTransferConfig::default()
        };
        let sz = 4; // 1024 elements per full chunk, 256 at least.
        assert_eq!(config.chunk_elems(1 << 20, sz, 1, false), 1024, "large: full chunks");
        assert_eq!(config.chunk_elems(4096, sz, 1, false), 1024, "four full chunks");
        assert_eq!(config.chunk_elems(2048, sz, 1, false), 512, "two chunks' worth cut into four");
        assert_eq!(config.chunk_elems(100, sz, 1, false), 256, "never below min_chunk_bytes");
        assert_eq!(config.chunk_elems(2048, sz, 1, true), 1024, "cut alike: full chunks");
        assert_eq!(config.chunk_elems(1 << 20, sz, 4, false), 256, "per row over a width of 4");
        let tiny = HostTransferConfig { min_chunk_bytes: 1 << 20, ..config };
        assert_eq!(tiny.chunk_elems(2048, sz, 1, false), 1024, "min_chunk_bytes above chunk_bytes");
        assert_eq!(config.chunk_elems(0, sz, 1, false), 256);
        assert_eq!(config.chunk_elems(usize::MAX, 1, 1, false), 4096, "no overflow near usize::MAX");
        // The same cut in chunks, by bytes.
        assert_eq!(config.chunks_for(4 << 20), 1024, "large: full chunks");
        assert_eq!(config.chunks_for(16 << 10), 4, "four full chunks");
        assert_eq!(config.chunks_for(8 << 10), 4, "two chunks' worth cut into four");
        assert_eq!(config.chunks_for(1500), 2, "never below min_chunk_bytes");
        assert_eq!(config.chunks_for(0), 1);
        assert_eq!(config.chunks_for(usize::MAX), usize::MAX.div_ceil(4096), "no overflow near usize::MAX");
    }

    /// Operations whose ranks exchange their chunks pair by pair take a chunk more where their
    /// longest piece ends at a chunk's boundary: its pairs' last messages are empty.
    #[test]
    fn exchanged_chunks_end_below_a_chunk() {
        use super::plans::chunks_of;
        for (count, collective, exchanged) in [(0, 1, 1), (1, 1, 1), (64, 1, 2), (65, 2, 2), (128, 2, 3), (129, 3, 3)] {
            assert_eq!(chunks_of(count, 64, false), collective, "{count} elements, cut alike");
            assert_eq!(chunks_of(count, 64, true), exchanged, "{count} elements, exchanged");
        }
        assert_eq!(chunks_of(usize::MAX, 1, true), usize::MAX, "no overflow");
    }
}
