//! The NCCL backend (RCCL on HIP): every operation runs on the device, ordered on the
//! communicator's stream, through NCCL's kernels and Duralumin's own.
//!
//! * Builtin (element, operator) pairs that NCCL has go to NCCL as they are (`ncclAvg` for
//!   floats; an integer `Avg` is NCCL's sum and the Rust finish kernel).
//! * Every other element moves as bytes, and every other operator (a user's, the logical and
//!   bitwise ones) reduces with the Rust kernels between grouped sends and receives,
//!   combining contributions in rank order, so non-commutative operators are exact.
//! * Every operation without a root funnel: allgatherv is one group of broadcasts, one per
//!   root; reduce-scatterv one group of reduces.
//!
//! Which operation is which NCCL call, and why the FFI is Duralumin's own rather than cudarc's,
//! is in `docs/nccl.md`. The communicator is non-blocking (`config.blocking = 0`), so a wait
//! past the deadline or an asynchronous error can abort it (`ncclCommAbort`) instead of hanging.

mod collectives;
mod datatype;
mod launch;
mod ops;
mod plans;
mod request;
mod watch;

use std::cell::{Cell, OnceCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use request::NcclRequest;

pub use crate::device::NcclDevice;

use crate::MpiCommunicator;
use crate::api::error::{Error, Result};
use crate::ffi::nccl::{self, Comm, Flavor, Nccl, UniqueId};

/// How long a communicator's creation, or a wait with no deadline set, may take before it is
/// given up: NCCL's bootstrap waits for every rank.
const DEFAULT_INIT_DEADLINE: Duration = Duration::from_secs(120);

/// A communicator of the NCCL backend: device memory, every operation stream-ordered on
/// [`stream`](Self::stream).
///
/// `Send` but not `Sync`, as the other backends: one thread at a time uses it (NCCL's rule for
/// a communicator). Dropping it waits for its work and finalizes the NCCL communicator.
pub struct NcclCommunicator<D: NcclDevice> {
    nccl: &'static Nccl,
    /// The NCCL handle and the operations in flight, shared with the watchdog.
    watch: Arc<watch::Watch<D>>,
    device: D,
    stream: D::Stream,
    side: OnceCell<D::Stream>,
    mpi: MpiCommunicator,
    rank: usize,
    size: usize,
    timeout: Option<Duration>,
    /// The last operation queued, and its number, for timeout reports.
    last: Cell<(&'static str, u64)>,
}

// SAFETY: the NCCL communicator may be used from any thread, one at a time (its handle is
// behind the watch's lock); the type is not `Sync` (its `Cell`s), so one thread at a time holds
// it. The device and streams are `Send`.
unsafe impl<D: NcclDevice> Send for NcclCommunicator<D> {}

impl<D: NcclDevice> std::fmt::Debug for NcclCommunicator<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclCommunicator")
            .field("library", &self.nccl)
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// Whether NCCL (`libnccl.so.2`, or the path in `DURALUMIN_NCCL`) can be loaded here, at a
/// version the backend supports.
pub fn library_present() -> bool {
    nccl::library(Flavor::Nccl).is_ok()
}

fn flavor_of<D: NcclDevice>(device: &D) -> Flavor {
    if device.api() == "hip" { Flavor::Rccl } else { Flavor::Nccl }
}

impl<D: NcclDevice> NcclCommunicator<D> {
    /// A communicator over the ranks of `comm`, on `device`, ordered on `stream`. Collective
    /// over `comm`: rank 0 makes the `ncclUniqueId` and broadcasts it over MPI.
    ///
    /// Fails on every rank, with nothing left running, when any rank cannot load the library
    /// ([`Error::LibraryUnavailable`] there) or was given a `stream` of another device
    /// ([`Error::WrongDevice`] there).
    pub fn new<C: mpi::topology::Communicator>(comm: &C, device: D, stream: D::Stream) -> Result<Self> {
        let mpi = MpiCommunicator::new(comm)?;
        // Every rank's own checks, agreed on before any rank waits for the others.
        let local = if device.owns(&stream) {
            nccl::library(flavor_of(&device))
        } else {
            Err(Error::WrongDevice { what: "stream", found: "another device".into(), expected: device.name() })
        };
        let nccl = Self::agree(&mpi, local)?;
        let mut id = [0u8; 128];
        let made = if mpi.rank() == 0 { nccl.unique_id().map(|u| id = bytes_of(&u)) } else { Ok(()) };
        // Rank 0's failure travels with the id (a zero first byte after the flag), so no rank
        // waits for an id that will not come.
        let mut message = [0u8; 129];
        message[0] = u8::from(made.is_ok());
        message[1..].copy_from_slice(&id);
        mpi.bcast(&mut message[..], 0)?;
        made?;
        if message[0] == 0 {
            return Err(Error::LibraryUnavailable("rank 0 could not make an NCCL unique id".into()));
        }
        let id = id_of(&message[1..]);
        let timeout = mpi.timeout();
        device.bind()?;
        // SAFETY: the device is current on this thread.
        let raw = unsafe { nccl.init_rank(mpi.size(), id, mpi.rank()) }?;
        Self::ready(nccl, raw, mpi, device, stream, timeout, "ncclCommInitRankConfig")
    }

    /// Agrees on every rank's local outcome (the library loaded, the stream on the device):
    /// all ranks go on, or all fail (with their own error, or one saying another rank failed).
    fn agree(mpi: &MpiCommunicator, local: Result<&'static Nccl>) -> Result<&'static Nccl> {
        let mine = [u8::from(local.is_ok())];
        let mut all = [0u8];
        mpi.allreduce(&mine, &mut all, crate::Min)?;
        match local {
            Ok(lib) if all[0] == 1 => Ok(lib),
            Ok(lib) => Err(Error::LibraryUnavailable(format!(
                "another rank could not create its {} communicator (its own error says why)",
                lib.name()
            ))),
            Err(e) => Err(e),
        }
    }

    /// Waits for a new NCCL communicator to be ready and wraps it (aborting it on failure).
    fn ready(
        nccl: &'static Nccl,
        raw: Comm,
        mpi: MpiCommunicator,
        device: D,
        stream: D::Stream,
        timeout: Option<Duration>,
        call: &'static str,
    ) -> Result<Self> {
        let deadline = Instant::now() + timeout.unwrap_or(DEFAULT_INIT_DEADLINE);
        // SAFETY: a communicator NCCL just returned.
        let ready = unsafe { nccl.wait_ready(raw, call, Some(deadline)) }
            // SAFETY: as above.
            .and_then(|()| unsafe { nccl.rank_and_size(raw) });
        let (rank, size) = match ready {
            Ok(rs) => rs,
            Err(e) => {
                // SAFETY: the communicator is not used again.
                let _ = unsafe { nccl.abort(raw) };
                return Err(e);
            }
        };
        Ok(NcclCommunicator {
            nccl,
            watch: watch::Watch::start(nccl, device.clone(), rank, raw, timeout),
            device,
            stream,
            side: OnceCell::new(),
            mpi,
            rank,
            size,
            timeout,
            last: Cell::new(("no operation", 0)),
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// This rank's place, as the operations' rules read it.
    pub(crate) fn ranks(&self) -> crate::operations::Ranks {
        crate::operations::Ranks { rank: self.rank, size: self.size }
    }

    /// This process's rank among the communicator's ranks on its node.
    pub fn local_rank(&self) -> usize {
        self.mpi.local_rank()
    }

    /// The number of the communicator's ranks on this process's node.
    pub fn local_size(&self) -> usize {
        self.mpi.local_size()
    }

    /// Which node each rank runs on ([`MpiCommunicator::topology`]).
    pub fn topology(&self) -> crate::Topology {
        self.mpi.topology().clone()
    }

    /// The stream operations are ordered on.
    pub fn stream(&self) -> &D::Stream {
        &self.stream
    }

    /// The device.
    pub fn device(&self) -> &D {
        &self.device
    }

    /// The loaded library's version, e.g. `"NCCL 2.27.3"`.
    pub fn library_version(&self) -> String {
        format!("{} {}", self.nccl.name(), nccl::version_text(self.nccl.version()))
    }

    /// The deadline: how long [`synchronize`](Self::synchronize) and a request's wait may
    /// take, and how long the device may make no progress on the communicator's operations
    /// while nobody waits (the watchdog's limit), before the communicator is aborted
    /// ([`Error::Timeout`]); `None`: no deadline (asynchronous NCCL errors still abort it).
    /// The Mpi communicator's (`DURALUMIN_TIMEOUT`) by default.
    pub fn timeout(&self) -> Option<Duration> {
        self.timeout
    }

    /// Sets the deadline.
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.timeout = timeout;
        self.watch.set_timeout(timeout);
    }

    /// Whether the communicator was aborted (after a timeout, an asynchronous NCCL error, or
    /// [`abort`](Self::abort)), by a call or by the watchdog; every later call fails with
    /// [`Error::Aborted`] (the first one after a watchdog abort with the abort's error).
    pub fn is_aborted(&self) -> bool {
        self.watch.is_aborted()
    }

    /// A new communicator of the same ranks (`ncclCommSplit` with one color), on the same
    /// stream. Collective.
    pub fn dup(&self) -> Result<Self> {
        self.split_with(Some(0), i32::try_from(self.rank).unwrap_or(i32::MAX))
            .and_then(|c| c.ok_or(Error::nccl("ncclCommSplit", -1, "dup gave no communicator".into())))
    }

    /// Splits the communicator (`ncclCommSplit`): ranks with the same `color` form a new one,
    /// ordered by `key` then rank; `None` takes no part and gets `None`. Collective.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Self>> {
        self.split_with(color, key)
    }

    fn split_with(&self, color: Option<u32>, key: i32) -> Result<Option<Self>> {
        let live = self.live()?;
        self.device.bind()?;
        // SAFETY: a live, ready communicator, locked.
        let raw = unsafe { self.nccl.split(live.comm(), color, key, Some(self.deadline())) }?;
        drop(live);
        let mpi = self.mpi.split(color, key)?;
        match (raw, mpi) {
            (Some(raw), Some(mpi)) => Self::ready(
                self.nccl,
                raw,
                mpi,
                self.device.clone(),
                self.stream.clone(),
                self.timeout,
                "ncclCommSplit",
            )
            .map(Some),
            (None, None) => Ok(None),
            (raw, _) => {
                if let Some(raw) = raw {
                    // SAFETY: not used again.
                    let _ = unsafe { self.nccl.abort(raw) };
                }
                Err(Error::nccl("ncclCommSplit", -1, "NCCL and MPI disagree on the split".into()))
            }
        }
    }

    /// Blocks until every operation queued so far (on the stream and the internal stream of
    /// non-blocking operations) has completed, and reports an asynchronous NCCL error. Past
    /// the [`timeout`](Self::timeout), or on an asynchronous error, the communicator is
    /// aborted (`ncclCommAbort`, which ends the stuck kernels) and the error returned names
    /// the last operation queued.
    pub fn synchronize(&self) -> Result<()> {
        self.wait_stream(&self.stream)?;
        match self.side.get() {
            Some(side) => self.wait_stream(side),
            None => Ok(()),
        }
    }

    /// Waits for `stream`, polling the communicator's asynchronous error.
    pub(crate) fn wait_stream(&self, stream: &D::Stream) -> Result<()> {
        self.wait_until(|| self.device.query(stream), self.last.get())
    }

    /// Waits for operation `t` to complete.
    pub(crate) fn wait_tracked(&self, t: &Tracked<D>) -> Result<()> {
        self.wait_until(|| self.device.event_done(&t.done), (t.op, t.seq))
    }

    /// Polls `done` until it says yes, with the communicator's asynchronous error and
    /// deadline; a failure aborts the communicator and names `op` #`seq`.
    fn wait_until(&self, done: impl Fn() -> Result<bool>, (op, seq): (&'static str, u64)) -> Result<()> {
        let start = Instant::now();
        let mut pause = Duration::from_micros(5);
        loop {
            let finished = done()?;
            let live = self.live()?;
            // SAFETY: the live communicator, locked.
            let failed = unsafe { self.nccl.async_error(live.comm()) };
            drop(live);
            if let Err(e) = failed {
                self.abort_with(format!("asynchronous NCCL error: {e}"));
                return Err(e);
            }
            if finished {
                return Ok(());
            }
            if let Some(t) = self.timeout
                && start.elapsed() > t
            {
                let report = format!(
                    "rank {}: the device had not finished {op} #{seq} (or work queued before it); \
                     the NCCL communicator was aborted",
                    self.rank
                );
                self.abort_with(format!("{op} #{seq} timed out on rank {}", self.rank));
                return Err(Error::Timeout { op, seq, elapsed: start.elapsed(), report });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(2));
        }
    }

    /// Aborts the NCCL communicator (`ncclCommAbort`): its pending kernels end, its results
    /// are undefined, and every later call fails with [`Error::Aborted`]. Other ranks' pending
    /// operations fail (or time out) too.
    pub fn abort(&self) {
        self.abort_with(format!("aborted by rank {}", self.rank));
    }

    pub(crate) fn abort_with(&self, reason: String) {
        self.watch.abort(reason, None);
    }

    /// The NCCL communicator, locked for this thread's calls; after an abort, the error.
    pub(crate) fn live(&self) -> Result<watch::Live<'_, D>> {
        self.watch.live()
    }

    /// Marks the completion of the operation just queued on `stream` (the last noted).
    pub(crate) fn track(&self, stream: &D::Stream, span: tracing::Span) -> Result<Tracked<D>> {
        let (op, seq) = self.last.get();
        Ok(Tracked { done: self.watch.track(op, seq, stream, span)?, op, seq })
    }

    /// The internal stream of non-blocking operations (made on first use).
    pub(crate) fn side_stream(&self) -> Result<&D::Stream> {
        if let Some(s) = self.side.get() {
            return Ok(s);
        }
        let s = self.device.new_stream()?;
        Ok(self.side.get_or_init(|| s))
    }

    pub(crate) fn nccl(&self) -> &'static Nccl {
        self.nccl
    }

    /// Counts an operation for reports.
    pub(crate) fn note(&self, op: &'static str) {
        let (_, seq) = self.last.get();
        self.last.set((op, seq + 1));
    }

    /// A deadline for polling a pending NCCL call.
    pub(crate) fn deadline(&self) -> Instant {
        Instant::now() + self.timeout.unwrap_or(DEFAULT_INIT_DEADLINE)
    }
}

/// An operation queued, with the event that marks its completion.
pub(crate) struct Tracked<D: NcclDevice> {
    pub(crate) done: Arc<D::Event>,
    pub(crate) op: &'static str,
    pub(crate) seq: u64,
}

impl<D: NcclDevice> Drop for NcclCommunicator<D> {
    fn drop(&mut self) {
        if self.is_aborted() {
            return;
        }
        if let Err(e) = self.synchronize() {
            tracing::warn!("NCCL communicator dropped with failed work: {e}");
            return;
        }
        self.watch.finalize(self.deadline());
    }
}

fn bytes_of(id: &UniqueId) -> [u8; 128] {
    bytemuck::cast(id.internal.map(|c| c.to_ne_bytes()[0]))
}

fn id_of(bytes: &[u8]) -> UniqueId {
    let mut id = UniqueId { internal: [0; 128] };
    for (d, s) in id.internal.iter_mut().zip(bytes) {
        *d = std::ffi::c_char::from_ne_bytes([*s]);
    }
    id
}

#[cfg(feature = "cuda")]
impl NcclCommunicator<crate::device::cuda::CudaDevice> {
    /// A communicator over the ranks of `comm` whose operations are ordered on the CUDA stream
    /// `stream`, on the device of the stream's context (a
    /// [`CudaDevice::new`](crate::device::cuda::CudaDevice::new) of it, with the registered
    /// kernels). As [`new`](Self::new) otherwise.
    pub fn from_stream<C: mpi::topology::Communicator>(
        comm: &C,
        stream: std::sync::Arc<cudarc::driver::CudaStream>,
    ) -> Result<Self> {
        let device = crate::device::cuda::CudaDevice::new(std::sync::Arc::clone(stream.context()))?;
        Self::new(comm, device, stream)
    }
}
