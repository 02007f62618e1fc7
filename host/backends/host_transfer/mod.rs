//! The HostTransfer backend: collectives on device buffers, staged through pinned host memory,
//! ordered on a stream like kernels.
//!
//! A [`HostTransferCommunicator`] is an MPI communicator bound to a stream of a [`Device`]. Every operation
//! is queued on that stream and the calling thread returns at once:
//!
//! 1. the stream copies chunk `k` of the input from the device into a pinned staging slot and
//!    raises the operation's *input* flag to `k + 1`;
//! 2. the proxy thread (the progress engine), which polls that flag, runs the MPI part of chunk
//!    `k` on the staging slot (the Mpi backend's own plans: native MPI or Duralumin's
//!    algorithms), then raises the *output* flag to `k + 1`;
//! 3. the stream, waiting on the device for the output flag, copies the chunk's result back
//!    into the device buffer, then stages chunk `k + depth` into the freed slot.
//!
//! Chunks are pipelined: while MPI works on chunk `k`, the stream copies the results of earlier
//! chunks back and stages later ones. Operations with nothing to copy back (a bcast root, a
//! send, a reduce or gather off the root) release the stream once their input is staged: the
//! stream does not wait for the MPI part, which sends from pinned memory the operation keeps
//! until it is through (its request completes with the stream; an MPI error is then reported by
//! the communicator's next call). Pinned memory held by an operation is `depth` slots of one
//! chunk each, whatever the message size ([`HostTransferConfig`]); operations take it from the
//! communicator's pool in the order they were queued, and one that finds the pool's cap reached
//! waits for earlier ones to give memory back (see [`HostTransferConfig::pool_cap_bytes`]). The
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
//! waits for: a stream never waits on the device for work queued later. GPUs may run streams
//! that share a hardware queue one item at a time (more streams than
//! `CUDA_DEVICE_MAX_CONNECTIONS`, or it set to 1), and a wait for later work there is a
//! deadlock. The host device built by
//! [`HostDevice::with_queues`](crate::device::host::HostDevice::with_queues) behaves the same
//! way, so the tests show such waits.

mod collectives;
mod copies;
mod plans;
mod proxy;
mod request;
mod staging;

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::BTreeSet;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use request::DeviceRequest;

/// The HostTransfer backend's communicator under its old name.
#[deprecated(since = "0.2.0", note = "renamed `HostTransferCommunicator` (also at the crate root)")]
pub type Communicator<D> = HostTransferCommunicator<D>;

use crate::backends::mpi::Tuning;
use crate::device::PoolStats;
use crate::device::pool::Pools;
use crate::device::{Device, DeviceSlice};
use crate::error::{Error, Result};
use crate::progress::{Engine, Task};
use crate::reliability::OnTimeout;
use crate::reliability::crosscheck::Pairs;
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::{Signature, State};
use crate::request::DeferredError;

/// Pipelining and memory settings of a HostTransfer communicator. Every rank must use the same
/// values (they decide how operations are cut into chunks).
///
/// Start from [`HostTransferConfig::default()`] and change what you need with the `with_*`
/// setters (or the fields): the struct is `#[non_exhaustive]`, so settings can be added
/// without breaking callers.
///
/// ```
/// let c = duralumin::HostTransferConfig::default().with_chunk_bytes(256 << 10).with_depth(4);
/// assert_eq!((c.chunk_bytes, c.depth), (256 << 10, 4));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostTransferConfig {
    /// Bytes per chunk and direction, rounded down to whole elements: reductions and
    /// point-to-point messages are cut into chunks of this size; collectives over per-rank
    /// blocks (v-collectives included) cut each block into chunks of this size over the number
    /// of ranks. Operations larger than one chunk are pipelined. A staging slot holds one
    /// chunk of the send side and one of the receive side (`multi_sendrecv`: one chunk of
    /// each message). Operations that would need more than [`max_chunks`](Self::max_chunks)
    /// chunks of this size get larger ones.
    pub chunk_bytes: usize,
    /// The most chunks an operation is cut into while its chunks can grow: beyond it, chunks
    /// grow from [`chunk_bytes`](Self::chunk_bytes) to `count / max_chunks`, up to
    /// [`max_chunk_bytes`](Self::max_chunk_bytes) and to a staging block of a quarter of
    /// [`pool_cap_bytes`](Self::pool_cap_bytes). The calling thread queues a few device calls
    /// per chunk, so this bounds an operation's enqueue time as well as the per-chunk costs
    /// (flag round trips, one MPI call each). Operations whose ranks may cut different numbers
    /// of chunks (gatherv, scatterv, alltoallv, point-to-point, which send their chunks as
    /// point-to-point messages) always use `chunk_bytes`. At least 1; `usize::MAX` keeps every
    /// chunk at `chunk_bytes`.
    pub max_chunks: usize,
    /// The largest chunk [`max_chunks`](Self::max_chunks) may grow chunks to, in bytes per
    /// direction as for `chunk_bytes` (below `chunk_bytes`, chunks stay at `chunk_bytes`). The
    /// pinned memory an operation holds is at most `depth` slots of chunks of this size,
    /// whatever the message size.
    pub max_chunk_bytes: usize,
    /// Staging slots per operation: how many chunks can be between "copied to the host" and
    /// "copied back" at once. At least 1.
    pub depth: usize,
    /// Cap on the pinned staging memory the communicator's pool holds. An operation holds
    /// `depth` slots whatever its size, so messages larger than the cap work. Operations take
    /// their staging in the order they were queued: one queued while earlier ones hold the
    /// rest of the pool waits for their memory. The calling thread waits, then queues it (the
    /// earlier operations need nothing more from it); with
    /// [`proxy_queues_copies`](Self::proxy_queues_copies) the stream waits on the device
    /// instead and the calling thread returns at once. Only an operation whose `depth` slots
    /// alone (rounded up to a power of two) exceed the cap fails, with
    /// [`Error::PoolExhausted`] before anything is queued.
    pub pool_cap_bytes: usize,
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
    /// Have the proxy thread queue a pipelined operation's copies (once the stream reaches the
    /// operation) instead of the calling thread. Queueing costs the calling thread two flag
    /// operations instead of a few device calls per chunk, but the stream then waits for
    /// copies queued after the work the program queues behind the operation, which deadlocks
    /// a GPU whose streams share a hardware queue (see [queue order](crate::backends::host_transfer#queue-order)), so
    /// this is off by default. Operations that wait for staging memory always work this way.
    pub proxy_queues_copies: bool,
}

impl HostTransferConfig {
    /// Elements per row and chunk of a staged operation with `count` elements per row, `width`
    /// rows sharing the chunk size and `sz`-byte elements: `chunk_bytes`' worth, or more (see
    /// [`max_chunks`](Self::max_chunks)) unless `fixed` (ranks that must cut their chunks alike
    /// without knowing each other's counts, or that stage more rows than `2 × width`). It
    /// depends only on what every rank of the operation knows alike (not on the rows a rank
    /// stages, which differ at a root or in place), so every rank cuts the same chunks.
    pub(crate) fn chunk_elems(&self, count: usize, sz: usize, width: usize, fixed: bool) -> usize {
        let (sz, width) = (sz.max(1), width.max(1));
        let elems = |bytes: usize| (bytes / sz / width).max(1);
        let base = elems(self.chunk_bytes);
        let chunks = self.max_chunks.max(1);
        if fixed || count.div_ceil(base) <= chunks {
            return base;
        }
        // A quarter of the pool for one operation's `depth` slots of (at most) a send and a
        // receive block per row.
        let pool_share = self.pool_cap_bytes / 4 / self.depth.max(1) / 2 / width / sz;
        count.div_ceil(chunks).min(elems(self.max_chunk_bytes)).min(pool_share).max(base)
    }
}

with_setters!(HostTransferConfig {
    chunk_bytes: usize => with_chunk_bytes,
    max_chunks: usize => with_max_chunks,
    max_chunk_bytes: usize => with_max_chunk_bytes,
    depth: usize => with_depth,
    pool_cap_bytes: usize => with_pool_cap_bytes,
    direct: bool => with_direct,
    device_reduce_max_bytes: usize => with_device_reduce_max_bytes,
    proxy_queues_copies: bool => with_proxy_queues_copies,
});

impl Default for HostTransferConfig {
    fn default() -> Self {
        HostTransferConfig {
            chunk_bytes: 1 << 20,
            max_chunks: 16,
            max_chunk_bytes: 16 << 20,
            depth: 3,
            pool_cap_bytes: 1 << 30,
            direct: true,
            device_reduce_max_bytes: 0,
            proxy_queues_copies: false,
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
    /// Whose turn it is to take staging memory.
    grants: Mutex<Grants>,
    /// The operations' numbers, flight recorder, deadline and poisoned state (the Mpi
    /// communicator's: see [`crate::reliability`]).
    pub(crate) monitor: Arc<Monitor>,
}

/// Staging memory is taken in the order operations were queued: operation `g` (counting the
/// staged operations of a communicator) takes its block only after operations `0..g` have
/// theirs. An operation therefore only ever waits for memory held by earlier ones, which
/// never wait for it (their MPI parts come first too), so waiting cannot deadlock.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    /// The operation that may take memory now.
    pub(crate) next: u64,
    /// Later operations that gave up their turn (their future was dropped before it came).
    abandoned: BTreeSet<u64>,
}

impl Grants {
    /// Operation `g`, whose turn it is, has its memory (or gave up on it): the next one may
    /// take.
    pub(crate) fn pass(&mut self, g: u64) {
        debug_assert_eq!(self.next, g);
        self.next = g + 1;
        while self.abandoned.remove(&self.next) {
            self.next += 1;
        }
    }

    /// Operation `g` will not take memory: its turn passes now or when it comes.
    pub(crate) fn abandon(&mut self, g: u64) {
        if self.next == g {
            self.pass(g);
        } else {
            self.abandoned.insert(g);
        }
    }
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
    /// Staging turns handed out (see [`Grants`]).
    grants_issued: Cell<u64>,
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
        if config.depth == 0 || config.chunk_bytes == 0 || config.max_chunks == 0 {
            return Err(Error::InvalidConfig("chunk_bytes, max_chunks and depth must be at least 1"));
        }
        let (rank, size, max_tag) = (mpi.rank(), mpi.size(), mpi.max_tag());
        let monitor = Arc::clone(mpi.monitor());
        let pools = Pools::new(Arc::clone(&device), config.pool_cap_bytes);
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
                grants: Mutex::default(),
                monitor,
            }),
            stream,
            side: OnceCell::new(),
            copies: OnceCell::new(),
            tickets: Cell::new(0),
            grants_issued: Cell::new(0),
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

    /// The staging pool's counters (pinned bytes and flags in use, high-water mark).
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
        let (device, m) = (&self.shared.device, &self.shared.monitor);
        let wait = m.wait_begin("synchronize");
        let stop = || m.poisoned().is_some();
        let give_up: crate::device::GiveUp<'_> = (m.on_timeout() == OnTimeout::Error).then_some(&stop);
        let mut waited = device.synchronize_helping(&self.stream, &mut || self.drive_pending(), give_up);
        if let (Ok(()), Some(side)) = (&waited, self.side.get()) {
            waited = device.synchronize_helping(side, &mut || self.drive_pending(), give_up);
        }
        m.wait_end(wait);
        waited?;
        m.check_poison(Asker::Waiter(wait))?;
        self.shared.errors.check()
    }

    /// The deadline of every operation and wait (`None`: none), as on the Mpi backend
    /// ([`crate::MpiCommunicator::timeout`]).
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.shared.monitor.timeout()
    }

    /// Sets the deadline of every operation and wait from now on (`None`: none). An operation
    /// whose MPI part runs past it on the proxy thread, or a [`synchronize`](Self::synchronize)
    /// or request wait that does, is reported by every rank that can, then handled as
    /// [`on_timeout`](Self::on_timeout) says.
    pub fn set_timeout(&mut self, timeout: Option<std::time::Duration>) {
        self.shared.monitor.set_timeout(timeout);
    }

    /// What a timeout does ([`OnTimeout::Abort`] by default).
    pub fn on_timeout(&self) -> OnTimeout {
        self.shared.monitor.on_timeout()
    }

    /// Sets what a timeout does. Under [`OnTimeout::Error`] the MPI parts always stage (never
    /// run on host-accessible device memory directly), so an abandoned operation leaves MPI
    /// only memory the library owns.
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
        plan: impl FnOnce() -> Result<P>,
    ) -> Result<((OpId, Signature), P)> {
        let m = &self.shared.monitor;
        let op = m.begin(sig, State::Running)?;
        let planned = crate::reliability::prepare(m, &self.shared.errors, op, &sig, pairs, plan)?;
        m.set(op, State::Queued, None);
        Ok(((op, sig), planned))
    }

    /// Whether the signature check is on for operations like `sig`.
    fn checks(&self, sig: &Signature) -> bool {
        self.shared.monitor.checks(sig)
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

    /// The internal copy streams (device-to-host, host-to-device), if `wanted`.
    fn copy_streams_if(&self, wanted: bool) -> Result<Option<(&D::Stream, &D::Stream)>> {
        if !wanted {
            return Ok(None);
        }
        if self.copies.get().is_none() {
            let pair = (self.shared.device.new_stream()?, self.shared.device.new_stream()?);
            let _ = self.copies.set(pair);
        }
        let (i, o) = self.copies.get().ok_or(Error::Progress("no copy streams"))?;
        Ok(Some((i, o)))
    }

    fn next_ticket(&self) -> u64 {
        let t = self.tickets.get();
        self.tickets.set(t + 1);
        t
    }

    fn next_grant(&self) -> u64 {
        let g = self.grants_issued.get();
        self.grants_issued.set(g + 1);
        g
    }

    /// Checks that a buffer lives on this communicator's device.
    fn check_buffer<B: DeviceSlice<D>>(&self, what: &'static str, buf: &B) -> Result<()> {
        if buf.ordinal() != self.shared.device.ordinal() {
            return Err(Error::WrongDevice {
                what,
                expected: self.shared.device.name(),
                found: format!("device {}", buf.ordinal()),
            });
        }
        Ok(())
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

    /// The staging turns.
    fn grants(&self) -> std::sync::MutexGuard<'_, Grants> {
        self.grants.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::HostTransferConfig;

    /// Chunks stay at `chunk_bytes` up to `max_chunks` of them, then grow to cut the operation
    /// into `max_chunks`, up to `max_chunk_bytes` and a quarter of the pool; operations whose
    /// ranks must cut alike without knowing each other's counts never grow.
    #[test]
    fn chunks_grow_past_max_chunks_within_their_caps() {
        let config = HostTransferConfig {
            chunk_bytes: 1 << 10,
            max_chunks: 4,
            max_chunk_bytes: 4 << 10,
            depth: 2,
            pool_cap_bytes: 1 << 30,
            ..HostTransferConfig::default()
        };
        let sz = 4; // 256 elements per chunk, 1024 at most.
        assert_eq!(config.chunk_elems(256 * 4, sz, 1, false), 256, "four chunks: no growth");
        assert_eq!(config.chunk_elems(256 * 4 + 1, sz, 1, false), 257, "five chunks' worth: four grown ones");
        assert_eq!(config.chunk_elems(3000, sz, 1, false), 750);
        assert_eq!(config.chunk_elems(1 << 20, sz, 1, false), 1024, "capped at max_chunk_bytes");
        assert_eq!(config.chunk_elems(1 << 20, sz, 1, true), 256, "cut alike: chunk_bytes always");
        assert_eq!(config.chunk_elems(1 << 20, sz, 4, false), 256, "per row over a width of 4: capped at 4 KiB / 4");
        assert_eq!(config.chunk_elems(300, sz, 4, false), 75, "five chunks of 64 per row: four grown ones");
        let fixed = HostTransferConfig { max_chunks: usize::MAX, ..config };
        assert_eq!(fixed.chunk_elems(1 << 20, sz, 1, false), 256, "max_chunks = usize::MAX: never grows");
        // A quarter of a 16 KiB pool over 2 slots of a send and a receive block: 1 KiB chunks,
        // which is chunk_bytes: no growth.
        let small_pool = HostTransferConfig { pool_cap_bytes: 16 << 10, ..config };
        assert_eq!(small_pool.chunk_elems(1 << 20, sz, 1, false), 256);
        let pool_64k = HostTransferConfig { pool_cap_bytes: 64 << 10, ..config };
        assert_eq!(pool_64k.chunk_elems(1 << 20, sz, 1, false), 1024, "64 KiB pool: 4 KiB chunks fit its quarter");
        let pool_32k = HostTransferConfig { pool_cap_bytes: 32 << 10, ..config };
        assert_eq!(pool_32k.chunk_elems(1 << 20, sz, 1, false), 512, "32 KiB pool: 2 KiB chunks");
        let below = HostTransferConfig { max_chunk_bytes: 16, ..config };
        assert_eq!(below.chunk_elems(1 << 20, sz, 1, false), 256, "max_chunk_bytes below chunk_bytes");
        assert_eq!(config.chunk_elems(0, sz, 1, false), 256);
        assert_eq!(config.chunk_elems(usize::MAX, 1, 1, false), 4096, "no overflow near usize::MAX");
    }
}
