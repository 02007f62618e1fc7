//! The Mpi backend: collectives over host memory.
//!
//! An [`MpiCommunicator`] wraps an MPI communicator. Every operation exists blocking
//! (`allreduce`), non-blocking (`iallreduce`, returning a [`crate::Request`] inside a
//! [`crate::scope`]) and, where it makes sense, in place (`allreduce_in_place`).
//!
//! Builtin (element, operator) pairs MPI supports go straight to the MPI library; other
//! elements travel as bytes and other operators become MPI user operations
//! (`datatype.rs`). Large allreduces and broadcasts run Duralumin's own algorithms
//! (`algorithms/`) where they beat the library's; the choice is automatic by size and
//! can be forced per call ([`AllreduceAlgorithm`], [`BcastAlgorithm`]).

mod choice;
mod collectives;
mod job;
mod p2p;
mod plans;
mod shadow;
mod shm;
mod stores;

pub use stores::WindowStores;

use std::cell::{Cell, OnceCell};
use std::ffi::c_int;
use std::marker::PhantomData;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::api::error::{Error, Result};
use crate::api::request::DeferredError;
use crate::common::buffer::ScratchPool;
use crate::common::progress::Engine;
use crate::ffi::native::Native;
use crate::ffi::{self, RawComm, sys};
use crate::reliability::OnTimeout;
use crate::reliability::monitor::{Monitor, OpId};
use crate::reliability::recorder::{OpKind, Signature};
use crate::topology::{Shape, Topology};
use crate::transport::{Matcher, OnError, TagLayout};

pub use choice::{AllgatherAlgorithm, AllreduceAlgorithm, BcastAlgorithm, ReduceScatterAlgorithm};

/// The Mpi backend's communicator under its old name.
#[deprecated(since = "0.2.0", note = "renamed `MpiCommunicator` (also at the crate root)")]
pub type Communicator = MpiCommunicator;
use job::NATIVE_UNCHECKED_BYTES;
pub(crate) use job::{Job, Mode};
pub(crate) use p2p::exchange;

/// Size thresholds of the automatic algorithm choice, and pipelining granularity.
///
/// The defaults come from the benchmark in `benches/collectives.rs` on a 2-core shared-memory
/// machine with Open MPI 4.1; clusters may prefer other values. Start from
/// [`Tuning::default()`] and change what you need with the `with_*` setters (or the fields):
/// the struct is `#[non_exhaustive]`, so new thresholds can be added without breaking callers.
///
/// ```
/// let t = duralumin::Tuning::default().with_allreduce_ring_bytes(1 << 20).with_bcast_chain_bytes(4 << 20);
/// assert_eq!(t.allreduce_ring_bytes, 1 << 20);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Tuning {
    /// Allreduces of at least this many bytes use the ring algorithm (commutative operators);
    /// smaller ones go to the MPI library.
    pub allreduce_ring_bytes: usize,
    /// Segment size (bytes) of the ring's pipelined reduce-scatter.
    pub ring_segment_bytes: usize,
    /// Reduce-scatters of at least this many bytes in total use the ring reduce-scatter
    /// (commutative operators); smaller ones go to the MPI library (256 KiB; 2 KiB at 2 ranks
    /// on one node).
    pub reduce_ring_bytes: usize,
    /// Reduce-scatters of at least this many bytes in total go back to the MPI library when it
    /// fits one call: 32 MiB under MPICH, whose own was the faster at 64 MiB (2 ranks: 25.7 ms
    /// against the ring's 41.9; at 16 MiB either won by turns); no bound (`usize::MAX`) under
    /// the other MPIs.
    pub reduce_native_above_bytes: usize,
    /// Reduces of at least this many bytes run the ring reduce-scatter and gather the blocks
    /// at the root (commutative operators). Off by default (`usize::MAX`): Open MPI's own reduce
    /// was faster in the benchmark here (1.5-4.8x at 256 KiB..64 MiB, 2 ranks); reduces too
    /// large for one MPI call take this path regardless.
    pub reduce_root_ring_bytes: usize,
    /// On one node, broadcasts of at least this many bytes use the pipelined chain (1 MiB; 2 KiB
    /// at 2 ranks, where the chain is one send).
    pub bcast_chain_bytes: usize,
    /// Chunk size (bytes) of the pipelined chain broadcast.
    pub bcast_chunk_bytes: usize,
    /// The most elements one MPI call or message carries; larger operations are split or run
    /// over point-to-point. At most `i32::MAX` (MPI's `int` counts); tests lower it to
    /// exercise the large-count paths with small buffers.
    pub max_message_elements: usize,
    /// On one node, allreduces of at least this many bytes run through the node's shared-memory
    /// window ([`AllreduceAlgorithm::SharedMemory`]; commutative operators): blocking ones, and
    /// non-blocking ones once a blocking one has made the window (making it is collective).
    /// Below it the window's two barriers cost more than Open MPI's one exchange; from 2 KiB
    /// (the default) Open MPI's own would first wait for the signature check
    /// (`docs/reliability.md`), which costs more than the barriers.
    pub shared_memory_allreduce_bytes: usize,
    /// On several nodes (see [`MpiCommunicator::topology`]), allreduces of at least this many bytes run the hierarchical
    /// algorithm (commutative operators).
    pub hierarchical_allreduce_bytes: usize,
    /// On several nodes, allreduces below this many bytes run recursive doubling (commutative
    /// operators): one round of messages per doubling, each carrying the whole buffer. Set from
    /// the simulated cluster's 4 gbit links; lower it on a slow network, where it loses from
    /// 16 KiB (the measurements: `docs/topology.md`).
    pub nodes_recursive_doubling_bytes: usize,
    /// On one node, a HostTransfer operation's allreduce parts of at most this many bytes run
    /// recursive doubling (commutative operators). Its MPI parts run one at a time, so the
    /// point-to-point exchange (one, at 2 ranks) costs less than `MPI_Iallreduce`'s schedule,
    /// and from 2 KiB it needs no signature check first: at 2 ranks 20–30 % less from 4 B to
    /// 16 KiB, alike at 4 ranks (`docs/host_transfer.md`).
    pub staged_recursive_doubling_bytes: usize,
    /// On several nodes, broadcasts of at least this many bytes run the hierarchical pipeline.
    pub hierarchical_bcast_bytes: usize,
    /// On several nodes, reduce-scatters (equal blocks) of at least this many bytes in total run
    /// the two-level algorithm (commutative operators).
    pub hierarchical_reduce_scatter_bytes: usize,
    /// On several nodes, allgathers of at least this many bytes in total run the two-level
    /// algorithm.
    pub hierarchical_allgather_bytes: usize,
    /// Messages of Duralumin's own algorithms to a rank on another node are cut into pieces of
    /// at most this many bytes, all posted at once. Open MPI's TCP transport sends a message
    /// above its eager limit (64 KiB with headers) through a rendezvous that runs a pair's two
    /// directions one at a time: two ranks exchanging 32 MiB reach half the link rate each way,
    /// and eager-sized pieces reach all of it (`docs/topology.md`). Raise it to `usize::MAX` on
    /// networks whose transport has no such limit (RDMA).
    pub network_message_bytes: usize,
    /// The hierarchical allreduce runs in chunks of this many bytes, pipelined so that one
    /// chunk's node-local phases overlap another's network phase.
    pub hierarchical_chunk_bytes: usize,
    /// How a rank writes the shared-memory window in allreduces of 4 MiB and more: by default
    /// whichever of ordinary and non-temporal stores costs it less while the job runs
    /// ([`WindowStores::Adaptive`]).
    pub shared_memory_stores: WindowStores,
}

with_setters!(Tuning {
    allreduce_ring_bytes: usize => with_allreduce_ring_bytes,
    ring_segment_bytes: usize => with_ring_segment_bytes,
    reduce_ring_bytes: usize => with_reduce_ring_bytes,
    reduce_native_above_bytes: usize => with_reduce_native_above_bytes,
    reduce_root_ring_bytes: usize => with_reduce_root_ring_bytes,
    bcast_chain_bytes: usize => with_bcast_chain_bytes,
    bcast_chunk_bytes: usize => with_bcast_chunk_bytes,
    max_message_elements: usize => with_max_message_elements,
    shared_memory_allreduce_bytes: usize => with_shared_memory_allreduce_bytes,
    hierarchical_allreduce_bytes: usize => with_hierarchical_allreduce_bytes,
    nodes_recursive_doubling_bytes: usize => with_nodes_recursive_doubling_bytes,
    staged_recursive_doubling_bytes: usize => with_staged_recursive_doubling_bytes,
    hierarchical_bcast_bytes: usize => with_hierarchical_bcast_bytes,
    hierarchical_reduce_scatter_bytes: usize => with_hierarchical_reduce_scatter_bytes,
    hierarchical_allgather_bytes: usize => with_hierarchical_allgather_bytes,
    network_message_bytes: usize => with_network_message_bytes,
    hierarchical_chunk_bytes: usize => with_hierarchical_chunk_bytes,
    shared_memory_stores: WindowStores => with_shared_memory_stores,
});

impl Default for Tuning {
    /// The thresholds for one node.
    fn default() -> Self {
        Tuning::for_shape(Shape { nodes: 1, min_per_node: 1, max_per_node: 1 })
    }
}

impl Tuning {
    /// The thresholds measured best for a communicator of `shape` under the MPI library this
    /// process runs on (the tables in `docs/topology.md`). Every communicator starts from these.
    pub fn for_shape_here(shape: Shape) -> Self {
        Self::for_shape(shape).for_library(crate::topology::MpiLibrary::running())
    }

    /// These thresholds adjusted for `library`, where its own collectives measured faster.
    pub fn for_library(mut self, library: crate::topology::MpiLibrary) -> Self {
        if library == crate::topology::MpiLibrary::Mpich {
            self.reduce_native_above_bytes = 32 << 20;
        }
        self
    }

    /// The thresholds measured best for a communicator of `shape` (the table in
    /// `docs/topology.md`), under any MPI library.
    pub fn for_shape(shape: Shape) -> Self {
        // Measured on the simulated cluster's default 4 gbit links (docs/topology.md says what
        // changes on slower ones). With one rank per node the hierarchical allreduce is the flat
        // ring: it takes over where the ring does; the two-level reduce-scatter and allgather
        // have no node phase to save and take over later too.
        let several_per_node = shape.max_per_node > 1;
        // Two ranks on one node: a bcast is one send and a reduce-scatter one exchange each way,
        // and Duralumin's (its signature in the tags) beat every MPI's own from 4 KiB
        // (docs/topology.md, "Per MPI"), from where MPI's own would wait for the signature
        // check.
        let pair = shape.nodes == 1 && shape.max_per_node == 2;
        let pair_or = |bytes: usize| if pair { NATIVE_UNCHECKED_BYTES } else { bytes };
        Tuning {
            // From where a native allreduce would wait for the signature check
            // (`NATIVE_UNCHECKED_BYTES`): the window's barriers cost less than that.
            shared_memory_allreduce_bytes: 2 << 10,
            hierarchical_allreduce_bytes: if several_per_node { 64 << 10 } else { 256 << 10 },
            nodes_recursive_doubling_bytes: 64 << 10,
            staged_recursive_doubling_bytes: 16 << 10,
            hierarchical_bcast_bytes: 4 << 10,
            hierarchical_reduce_scatter_bytes: if several_per_node { 32 << 10 } else { 16 << 20 },
            hierarchical_allgather_bytes: if several_per_node { 32 << 10 } else { 64 << 10 },
            allreduce_ring_bytes: 256 << 10,
            ring_segment_bytes: 1 << 20,
            reduce_ring_bytes: pair_or(256 << 10),
            reduce_native_above_bytes: usize::MAX,
            reduce_root_ring_bytes: usize::MAX,
            // At 2 ranks the chain is one send, which beat every MPI's own bcast from 4 KiB.
            bcast_chain_bytes: pair_or(1 << 20),
            bcast_chunk_bytes: 1 << 20,
            max_message_elements: c_int::MAX as usize,
            network_message_bytes: 60 << 10,
            hierarchical_chunk_bytes: 2 << 20,
            shared_memory_stores: WindowStores::Adaptive,
        }
    }
}

/// What every operation of a communicator shares, including operations in flight on the
/// progress thread.
#[derive(Debug)]
pub(crate) struct Core {
    /// Native MPI collectives.
    pub(crate) coll: RawComm,
    /// Duralumin's algorithms (tags are per-operation sequence numbers).
    pub(crate) algo: RawComm,
    /// The user's point-to-point messages (tags are the user's).
    pub(crate) p2p: RawComm,
    pub(crate) rank: usize,
    pub(crate) size: usize,
    pub(crate) tag_ub: c_int,
    /// How algorithm tags carry the transport number and the operation's signature.
    pub(crate) tags: TagLayout,
    /// The expected receives of `algo` and of `p2p` (see `transport::matcher`).
    pub(crate) algo_matcher: Arc<Matcher>,
    pub(crate) p2p_matcher: Arc<Matcher>,
    pub(crate) scratch: ScratchPool,
    /// The order native collectives start in on `coll` (see [`job::StartOrder`]).
    pub(crate) start_order: Arc<job::StartOrder>,
    pub(crate) errors: Arc<DeferredError>,
    /// Operation numbers, flight recorder, deadline, poisoned state (see
    /// [`crate::reliability`]).
    pub(crate) monitor: Arc<Monitor>,
    /// The node's shared-memory window, made by the first operation that uses it (see
    /// `shm.rs`); freed (collectively over the node) before the communicators below.
    pub(crate) shm: shm::NodeWindow,
}

impl Drop for Core {
    fn drop(&mut self) {
        // Before the monitor closes: the free is watched like an operation.
        self.shm.release(&self.monitor, self.coll);
        // Given up without ULFM, the communicator may have operations MPI still runs
        // (abandoned with their buffers, which are leaked: `docs/reliability.md`), and its
        // peers may still send to them. Its communicators are leaked too, so that MPI never
        // hands their context ids to a later communicator those late messages could reach.
        let keep = self.monitor.poisoned().is_some() && !ffi::ulfm::available();
        self.monitor.close(!keep);
        if keep {
            return;
        }
        for c in [self.coll, self.algo, self.p2p] {
            // SAFETY: the three communicators were created by `MpiCommunicator::from_raw` for
            // this core alone, and every operation using them has completed (operations hold
            // an Arc of the core).
            unsafe { ffi::comm::free(c) };
        }
    }
}

/// A communicator of the Mpi backend.
///
/// `Send` but not `Sync`: it can move to another thread, and two communicators can be used
/// from two threads at once, but one communicator cannot be used by two threads at once (MPI
/// requires collectives on one communicator to be issued in one order):
///
/// ```compile_fail
/// fn shared_between_threads<T: Sync>() {}
/// shared_between_threads::<duralumin::MpiCommunicator>();
/// ```
///
/// ```
/// fn movable_to_a_thread<T: Send>() {}
/// movable_to_a_thread::<duralumin::MpiCommunicator>();
/// ```
///
/// **Dropping it is collective** once an allreduce used the shared-memory algorithm (which
/// `Auto` picks from 2 KiB when every rank is on one node): freeing the window waits for every
/// rank of the node to drop its communicator too. Drop communicators in the same order on
/// every rank, as MPI asks of `MPI_Comm_free`. A drop that waits past the communicator's
/// deadline is reported, and ends the job (`docs/reliability.md`).
#[derive(Debug)]
pub struct MpiCommunicator {
    core: Arc<Core>,
    local_rank: usize,
    local_size: usize,
    /// The number of the next algorithm transport (see [`MpiCommunicator::next_tag`]).
    seq: Cell<u32>,
    /// The operation being planned and its signature, which the algorithm tags carry: set as
    /// each operation of this communicator is planned, and by HostTransfer before each chunk's
    /// MPI part.
    current: Cell<Option<(OpId, Signature)>>,
    /// The current operation's [`Signature::agreement_hash`], once a transport or header
    /// needed it.
    current_hash: Cell<Option<u64>>,
    tuning: Tuning,
    topology: Arc<Topology>,
    engine: OnceCell<Arc<Engine>>,
    _not_sync: PhantomData<Cell<()>>,
}

impl MpiCommunicator {
    /// A Duralumin communicator over the same ranks as `comm` (any rsmpi communicator: the
    /// world, or one the program made). `comm` is duplicated, so traffic never mixes with the
    /// program's own use of it.
    ///
    /// Fails with [`Error::ThreadLevel`] if MPI was initialized below
    /// `MPI_THREAD_MULTIPLE` (use [`crate::init`]).
    pub fn new<C: mpi::topology::Communicator>(comm: &C) -> Result<Self> {
        Self::from_raw(RawComm(comm.as_raw()))
    }

    /// The communicator over `comm` (duplicated: the caller still owns `comm`).
    pub(crate) fn from_raw_comm(comm: RawComm) -> Result<Self> {
        let made = Self::from_raw(comm);
        // SAFETY: the caller handed `comm` over; `from_raw` duplicated it.
        unsafe { ffi::comm::free(comm) };
        made
    }

    /// The handle its collectives run on (for the calls the library makes over the whole
    /// communicator itself: ULFM agreements, spawns, splits).
    pub(crate) fn raw(&self) -> RawComm {
        self.core.coll
    }

    fn from_raw(comm: RawComm) -> Result<Self> {
        crate::api::init::require_thread_multiple()?;
        crate::reliability::abort::settle(None)?;
        let mut made = Vec::new();
        let built = Self::build(comm, &mut made);
        if built.is_err() {
            for c in made {
                // SAFETY: duplicated above for this communicator, used by nobody yet.
                unsafe { ffi::comm::free(c) };
            }
        }
        built
    }

    /// The communicator over `comm`; the duplicates it makes are pushed to `made` first, so
    /// a failure part-way can free them.
    fn build(comm: RawComm, made: &mut Vec<RawComm>) -> Result<Self> {
        for _ in 0..3 {
            made.push(ffi::comm::dup(comm)?);
        }
        let (coll, algo, p2p) = (made[0], made[1], made[2]);
        let (rank, size) = ffi::comm::rank_size(coll)?;
        let tag_ub = ffi::comm::tag_ub(coll)?;
        let node = ffi::comm::split_shared(coll, ffi::c_rank(rank))?;
        let learned = learn_topology(coll, node, rank, size);
        // SAFETY: `node` was created just above and is used by nobody else.
        unsafe { ffi::comm::free(node) };
        let (local_rank, local_size, topology) = learned?;
        let monitor = Monitor::new(rank, size, vec![coll, algo, p2p])?;
        Ok(MpiCommunicator {
            core: Arc::new(Core {
                coll,
                algo,
                p2p,
                rank,
                size,
                tag_ub,
                tags: TagLayout::new(tag_ub),
                algo_matcher: Arc::new(Matcher::new(algo)),
                p2p_matcher: Arc::new(Matcher::new(p2p)),
                scratch: ScratchPool::default(),
                start_order: Arc::default(),
                errors: Arc::default(),
                monitor,
                shm: shm::NodeWindow::default(),
            }),
            local_rank,
            local_size,
            seq: Cell::new(0),
            current: Cell::new(None),
            current_hash: Cell::new(None),
            tuning: Tuning::for_shape_here(topology.shape()),
            topology: Arc::new(topology),
            engine: OnceCell::new(),
            _not_sync: PhantomData,
        })
    }

    /// The oldest error of a request nobody waited for, if any.
    pub(crate) fn deferred_error(&self) -> Result<()> {
        self.core.errors.check()
    }

    /// This process's rank in the communicator.
    pub fn rank(&self) -> usize {
        self.core.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.core.size
    }

    /// The communicator's number in its operations' spans (`reliability::spans`).
    pub(crate) fn comm_id(&self) -> u64 {
        self.core.monitor.comm_id
    }

    /// This rank's place, as the operations' rules read it.
    pub(crate) fn ranks(&self) -> crate::operations::Ranks {
        crate::operations::Ranks { rank: self.rank(), size: self.size() }
    }

    /// This process's rank among the ranks on its node (`MPI_Comm_split_type` with
    /// `MPI_COMM_TYPE_SHARED`).
    pub fn local_rank(&self) -> usize {
        self.local_rank
    }

    /// The number of ranks on this process's node.
    pub fn local_size(&self) -> usize {
        self.local_size
    }

    /// Which node each rank runs on (learned when the communicator was made).
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// The largest tag point-to-point calls accept (`MPI_TAG_UB`).
    pub fn max_tag(&self) -> i32 {
        self.core.tag_ub
    }

    /// A new communicator over the same ranks (`MPI_Comm_dup`); collective. It has this one's
    /// tuning and reliability settings.
    pub fn dup(&self) -> Result<Self> {
        let sig = Signature::new(OpKind::Dup);
        let op = self.begin(sig)?;
        // (The barrier's plan is never run: `prepare` only checks, and runs the signature check.)
        self.prepare(op, &sig, None, &mut || self.plan_barrier::<u8>())?;
        let made = Self::from_raw(self.core.coll);
        self.record_end(op, &made);
        made.map(|c| self.inherit(c))
    }

    /// Splits the communicator (`MPI_Comm_split`); collective. Ranks passing the same `color`
    /// end up together, ordered by `key` (then by old rank); `None` as color leaves this rank
    /// out and returns `None`. The new communicators have this one's tuning and reliability
    /// settings.
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Self>> {
        let sig = Signature::new(OpKind::Split);
        let op = self.begin(sig)?;
        let (color, mut refused) = match color.map(c_int::try_from) {
            None => (sys::MPI_UNDEFINED, None),
            Some(Ok(c)) => (c, None),
            Some(Err(_)) => (0, Some(Error::CountOverflow { what: "split color", value: color.unwrap_or(0).into() })),
        };
        // (The barrier's plan is never run: `prepare` only checks, as for `dup`.)
        self.prepare(op, &sig, None, &mut || match refused.take() {
            Some(e) => Err(e),
            None => self.plan_barrier::<u8>(),
        })?;
        let made = (|| {
            let Some(part) = ffi::comm::split(self.core.coll, color, key)? else { return Ok(None) };
            let made = Self::from_raw(part);
            // SAFETY: `part` was created by the split above; `from_raw` duplicated it.
            unsafe { ffi::comm::free(part) };
            made.map(Some)
        })();
        self.record_end(op, &made);
        made.map(|c| c.map(|c| self.inherit(c)))
    }

    /// Records how a communicator-making operation ended (it is no fault: MPI reports a
    /// failure to make one on every rank).
    fn record_end<R>(&self, op: crate::reliability::monitor::OpId, made: &Result<R>) {
        use crate::reliability::recorder::State;
        match made {
            Ok(_) => self.core.monitor.set(op, State::Done, None),
            Err(e) => self.core.monitor.set(op, State::Failed, Some(e.to_string())),
        }
    }

    /// `c` with this communicator's tuning and reliability settings.
    fn inherit(&self, mut c: Self) -> Self {
        c.tuning = self.tuning;
        let (from, to) = (&self.core.monitor, &c.core.monitor);
        to.set_timeout(from.timeout());
        to.set_on_timeout(from.on_timeout());
        to.set_check(from.check());
        c
    }

    /// The deadline of every operation (`None`: none). 10 minutes unless `DURALUMIN_TIMEOUT`
    /// (seconds; 0 for none) or [`set_timeout`](Self::set_timeout) says otherwise.
    pub fn timeout(&self) -> Option<Duration> {
        self.core.monitor.timeout()
    }

    /// Sets the deadline of the operations called and the waits begun after this call (`None`:
    /// none); those called before keep theirs, even if still running. An operation that runs
    /// past its deadline (a blocking call, a request's wait, an operation on the progress
    /// thread) is reported by every rank that can, then handled as
    /// [`on_timeout`](Self::on_timeout) says.
    pub fn set_timeout(&mut self, timeout: Option<Duration>) {
        self.core.monitor.set_timeout(timeout);
    }

    /// What a timeout does: [`OnTimeout::Abort`] unless `DURALUMIN_ON_TIMEOUT=error` or
    /// [`set_on_timeout`](Self::set_on_timeout) says otherwise.
    pub fn on_timeout(&self) -> OnTimeout {
        self.core.monitor.on_timeout()
    }

    /// Sets what a timeout (or a collective that fails in a way that leaves the other ranks
    /// waiting) does. Every rank should use the same.
    pub fn set_on_timeout(&mut self, on_timeout: OnTimeout) {
        self.core.monitor.set_on_timeout(on_timeout);
    }

    /// Whether collectives compare their signatures across ranks before moving data
    /// (`DURALUMIN_CHECK=1`).
    pub fn check(&self) -> bool {
        self.core.monitor.check()
    }

    /// Turns the signature check on or off. Every rank must use the same setting (the check is
    /// itself a collective).
    pub fn set_check(&mut self, on: bool) {
        self.core.monitor.set_check(on);
    }

    /// Whether the communicator was given up ([`OnTimeout::Error`] after a timeout or fault
    /// here or on another rank, or [`revoke`](Self::revoke)): every call on it fails.
    pub fn is_aborted(&self) -> bool {
        self.core.monitor.poisoned().is_some()
    }

    /// The communicator's monitor (shared with the HostTransfer communicator built on it).
    pub(crate) fn monitor(&self) -> &Arc<Monitor> {
        &self.core.monitor
    }

    /// The flag a failed operation sets when it leaves sends in flight for MPI to finish
    /// ([`OnError::Abandon`]): memory they may read must not be freed once it is set.
    pub(crate) fn sends_left_flag(&self) -> Arc<AtomicBool> {
        self.core.scratch.leak_flag()
    }

    /// Operations of this communicator in flight (started and not yet completed).
    pub fn ops_in_flight(&self) -> usize {
        self.core.monitor.in_flight()
    }

    /// Revokes the communicator (`MPIX_Comm_revoke`): operations pending on it, on every rank,
    /// fail with [`Error::Revoked`], and so does every later one, except
    /// [`agree`](Self::agree) and [`shrink`](Self::shrink). Needs an MPI library with ULFM
    /// ([`Error::Unsupported`] otherwise).
    pub fn revoke(&self) -> Result<()> {
        if !ffi::ulfm::available() {
            return ffi::ulfm::revoke(self.core.coll);
        }
        for c in [self.core.coll, self.core.algo, self.core.p2p] {
            ffi::ulfm::revoke(c)?;
        }
        // Before the poison, which operations in flight see first.
        self.core.monitor.mark_revoked();
        let mut st = self.core.monitor.lock();
        let poison = crate::reliability::monitor::plain_poison("revoked".into(), None);
        Monitor::poison_with(&mut st, &self.core.monitor, poison);
        Ok(())
    }

    /// Fault-tolerant agreement (`MPIX_Comm_agree`) over the ranks still alive: whether `ok`
    /// holds on all of them and no process failed since the last agreement. Works on a revoked
    /// communicator; every surviving rank gets the same answer. Needs ULFM.
    pub fn agree(&self, ok: bool) -> Result<bool> {
        let (all, failed) = ffi::ulfm::agree(self.core.coll, ok)?;
        Ok(all && !failed)
    }

    /// A new communicator over the ranks still alive (`MPIX_Comm_shrink`), numbered in the
    /// same order, with this one's settings; collective over the survivors. Works on a revoked
    /// communicator. Needs ULFM.
    pub fn shrink(&self) -> Result<Self> {
        let raw = ffi::ulfm::shrink(self.core.coll)?;
        let made = Self::from_raw(raw);
        // SAFETY: `raw` was made by the shrink above; `from_raw` duplicated it.
        unsafe { ffi::comm::free(raw) };
        made.map(|c| self.inherit(c))
    }

    /// The thresholds in effect.
    pub fn tuning(&self) -> Tuning {
        self.tuning
    }

    /// Changes the automatic algorithm thresholds. Every rank must use the same values (they
    /// decide which algorithm runs, and all ranks must run the same one).
    pub fn set_tuning(&mut self, tuning: Tuning) {
        self.tuning =
            Tuning { max_message_elements: tuning.max_message_elements.clamp(1, c_int::MAX as usize), ..tuning };
    }

    /// The tag of the next algorithm transport, of an operation whose signature hashes to
    /// `hash`: all ranks make transports in the same order, so they agree on its number, and
    /// concurrent operations never match each other's messages; calls that differ carry
    /// different hashes (`transport::tag`).
    fn next_tag(&self, hash: u64) -> c_int {
        let s = self.seq.get();
        self.seq.set(s.wrapping_add(1));
        self.core.tags.tag(s, hash)
    }

    /// Makes `op` (of signature `sig`) the operation whose signature the algorithm transports
    /// made from now on carry (see [`MpiCommunicator::transport`]).
    pub(crate) fn set_current(&self, op: OpId, sig: Signature) {
        self.current.set(Some((op, sig)));
        self.current_hash.set(None);
    }

    /// The current operation's signature hash (0 without one).
    pub(crate) fn current_hash(&self) -> u64 {
        if let Some(h) = self.current_hash.get() {
            return h;
        }
        let h = self.current.get().map_or(0, |(_, sig)| sig.agreement_hash());
        self.current_hash.set(Some(h));
        h
    }

    /// What a transport of the current operation does with sends in flight when the operation
    /// fails (see [`OnError`]).
    fn on_error(&self) -> OnError {
        let m = &self.core.monitor;
        if m.on_timeout() == OnTimeout::Abort || m.guarded() {
            OnError::Abandon { leaked: self.core.scratch.leak_flag(), revoked: m.revoked_flag() }
        } else if ffi::ulfm::available() {
            OnError::Revoke
        } else {
            OnError::Wait
        }
    }

    fn engine(&self) -> Result<&Arc<Engine>> {
        if self.engine.get().is_none() {
            let _ = self.engine.set(Engine::get()?);
        }
        self.engine.get().ok_or(Error::Progress("no progress engine"))
    }
}

/// This rank's place on its node and every rank's node: the node communicator's rank and size,
/// then an allgather over `coll` of each node's lowest rank (which names the node). Collective.
fn learn_topology(coll: RawComm, node: RawComm, rank: usize, size: usize) -> Result<(usize, usize, Topology)> {
    let (local_rank, local_size) = ffi::comm::rank_size(node)?;
    let dt = crate::common::datatype::datatype::<u64>()?;
    // The node's lowest rank: the split was keyed by rank, so it is local rank 0.
    let mut leader = rank as u64;
    let mut leaders = vec![0u64; size];
    let calls = [
        Native::Bcast { buf: (&raw mut leader).cast(), count: 1, root: 0 },
        Native::Allgather { send: (&raw const leader).cast(), recv: leaders.as_mut_ptr().cast(), count: 1 },
    ];
    for (call, comm) in calls.iter().zip([node, coll]) {
        // SAFETY: `leader` is one u64 and `leaders` one per rank of `coll`, both live across
        // the blocking calls; the communicators are live.
        unsafe { call.run(dt, comm) }?;
    }
    let mut leaders: Vec<usize> = leaders.iter().map(|&l| usize::try_from(l).unwrap_or(usize::MAX)).collect();
    if let Some(k) = simulated_nodes() {
        // Rank r on node r % k: uneven and not contiguous, the layouts hardest to get right.
        leaders = (0..size).map(|r| r % k).collect();
    }
    Ok((local_rank, local_size, Topology::from_leaders(&leaders)))
}

/// `DURALUMIN_SIMULATED_NODES=k`: the algorithms (not `local_rank`/`local_size`, which stay
/// MPI's) treat rank `r` as running on node `r % k`, so the two-level algorithms can be tested
/// on one host (`docs/topology.md`). Every rank must see the same value.
fn simulated_nodes() -> Option<usize> {
    std::env::var("DURALUMIN_SIMULATED_NODES").ok()?.parse().ok().filter(|&k| k > 0)
}

/// Whether the process's progress thread is running (it stops when the last communicator that
/// used non-blocking operations is dropped).
pub fn progress_thread_running() -> bool {
    crate::common::progress::engine_running()
}
