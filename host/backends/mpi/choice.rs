//! Auto's choice on the Mpi backend: the algorithms each operation can run, and which one
//! `Auto` runs, decided only from values every rank shares (operator, size, tuning, shape), so
//! all ranks take the same path. The `*_choice` methods say what `Auto` runs; the benches and
//! `docs/topology.md` read them rather than restating the thresholds.

use duralumin_kernels::{Element, ReduceOp};

use super::MpiCommunicator;
use super::job::{Mode, NATIVE_UNCHECKED_BYTES};
use crate::api::error::{Error, Result};

/// Allreduce algorithms. `Auto` picks by operator, message size and the communicator's shape
/// (see [`super::Tuning`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllreduceAlgorithm {
    /// On several nodes, recursive doubling below
    /// [`super::Tuning::nodes_recursive_doubling_bytes`] and hierarchical from
    /// [`super::Tuning::hierarchical_allreduce_bytes`] (native between; hierarchical first
    /// where the two overlap); on one, shared memory from
    /// [`super::Tuning::shared_memory_allreduce_bytes`] (a non-blocking call before a blocking
    /// one has made the window: the ring from [`super::Tuning::allreduce_ring_bytes`]), native
    /// below; native for non-commutative operators.
    #[default]
    Auto,
    /// The MPI library's `MPI_Allreduce`.
    Native,
    /// Pipelined ring: reduce-scatter then allgather around the ring.
    Ring,
    /// Recursive doubling (full-buffer exchanges, `log2 n` steps).
    RecursiveDoubling,
    /// Rabenseifner: recursive-halving reduce-scatter, recursive-doubling allgather.
    Rabenseifner,
    /// Two-level: node-local reduce-scatter, cross-node allreduce of each slice by all ranks
    /// that hold it, node-local allgather (see [`crate::Topology`] and `docs/topology.md`).
    Hierarchical,
    /// One node only: the ranks reduce through an MPI-3 shared-memory window
    /// (`MPI_Win_allocate_shared`), pipelined in chunks of at most 1 MiB per rank: each rank
    /// stages the parts of its input the others reduce, reduces its own slice straight from
    /// the others' staged parts in rank order (so any operator works, commutative or not),
    /// and every rank copies the results out. The first use on a communicator makes the window,
    /// collectively over the node. [`Error::AlgorithmUnsupported`] if the ranks span several
    /// nodes.
    SharedMemory,
}

/// Broadcast algorithms. `Auto` picks by message size and the communicator's shape (see
/// [`super::Tuning`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BcastAlgorithm {
    /// On several nodes, hierarchical from [`super::Tuning::hierarchical_bcast_bytes`]; on one,
    /// chain from [`super::Tuning::bcast_chain_bytes`] (at 2 ranks, one send); native otherwise.
    #[default]
    Auto,
    /// The MPI library's `MPI_Bcast`.
    Native,
    /// Pipelined chain (chunks flow `root -> root+1 -> ...`).
    Chain,
    /// Two-level pipeline: a chain of node leaders, each forwarding down a chain through its
    /// own node at once, so the network carries the buffer once per node.
    Hierarchical,
}

impl BcastAlgorithm {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BcastAlgorithm::Auto => "auto",
            BcastAlgorithm::Native => "native",
            BcastAlgorithm::Chain => "chain",
            BcastAlgorithm::Hierarchical => "hierarchical",
        }
    }
}

impl AllreduceAlgorithm {
    /// Whether the algorithm can reduce with `O`: only `Auto`, `Native` and `SharedMemory` keep
    /// the rank order a non-commutative operator needs.
    pub(crate) fn check_operator<T: Element, O: ReduceOp<T>>(self) -> Result<()> {
        match self {
            AllreduceAlgorithm::Auto | AllreduceAlgorithm::Native | AllreduceAlgorithm::SharedMemory => Ok(()),
            a if !O::COMMUTATIVE => {
                Err(Error::AlgorithmUnsupported { algorithm: a.name(), reason: "the operator is not commutative" })
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            AllreduceAlgorithm::Auto => "auto",
            AllreduceAlgorithm::Native => "native",
            AllreduceAlgorithm::Ring => "ring",
            AllreduceAlgorithm::RecursiveDoubling => "recursive doubling",
            AllreduceAlgorithm::Rabenseifner => "rabenseifner",
            AllreduceAlgorithm::Hierarchical => "hierarchical",
            AllreduceAlgorithm::SharedMemory => "shared memory",
        }
    }
}

/// The paths a reduce-scatter with equal blocks takes (reduce-scatterv takes the first two: it
/// never runs the two-level one). It has no `_with` form: the communicator's
/// [`super::Tuning`] decides, and [`MpiCommunicator::reduce_scatter_choice`] says which path
/// runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ReduceScatterAlgorithm {
    /// The MPI library's `MPI_Reduce_scatter` (split into rooted reduces beyond one MPI call).
    Native,
    /// The pipelined ring reduce-scatter (commutative operators).
    Ring,
    /// Two-level: node-local, then across nodes (several nodes, commutative operators).
    Hierarchical,
}

/// The paths an allgather takes. It has no `_with` form: the communicator's [`super::Tuning`]
/// decides, and [`MpiCommunicator::allgather_choice`] says which path runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllgatherAlgorithm {
    /// The MPI library's `MPI_Allgather`.
    Native,
    /// The ring, for blocks larger than one MPI call.
    Ring,
    /// Two-level: node-local, then across nodes (several nodes).
    Hierarchical,
}

impl MpiCommunicator {
    /// The algorithm [`AllreduceAlgorithm::Auto`] runs for a blocking allreduce of `count`
    /// elements with `O` on this communicator (never `Auto`). A non-blocking one runs the same,
    /// except that it does not pick [`AllreduceAlgorithm::SharedMemory`] before the window
    /// exists (made by the first blocking allreduce that uses it): making it is collective and
    /// would block the call.
    pub fn allreduce_choice<T: Element, O: ReduceOp<T>>(&self, count: usize) -> AllreduceAlgorithm {
        self.auto_allreduce::<T, O>(count.saturating_mul(size_of::<T>()), Mode::Blocking)
    }

    /// The algorithm [`BcastAlgorithm::Auto`] runs for a broadcast of `count` elements of `T`
    /// on this communicator (never `Auto`).
    pub fn bcast_choice<T: Element>(&self, count: usize) -> BcastAlgorithm {
        self.auto_bcast(count.saturating_mul(size_of::<T>()))
    }

    /// The path a reduce-scatter of `count` elements per rank with `O` takes on this
    /// communicator, as its thresholds ([`super::Tuning::hierarchical_reduce_scatter_bytes`],
    /// [`super::Tuning::reduce_native_above_bytes`], [`super::Tuning::reduce_ring_bytes`])
    /// decide.
    pub fn reduce_scatter_choice<T: Element, O: ReduceOp<T>>(&self, count: usize) -> ReduceScatterAlgorithm {
        let total = count.saturating_mul(self.size());
        let bytes = total.saturating_mul(size_of::<T>());
        if self.use_two_level(bytes, self.tuning.hierarchical_reduce_scatter_bytes, O::COMMUTATIVE) {
            ReduceScatterAlgorithm::Hierarchical
        } else if self.use_reduce_scatter_ring::<T, O>(total) {
            ReduceScatterAlgorithm::Ring
        } else {
            ReduceScatterAlgorithm::Native
        }
    }

    /// The path an allgather of `count` elements per rank of `T` takes on this communicator,
    /// as [`super::Tuning::hierarchical_allgather_bytes`] and the largest MPI message decide.
    pub fn allgather_choice<T: Element>(&self, count: usize) -> AllgatherAlgorithm {
        let bytes = count.saturating_mul(self.size()).saturating_mul(size_of::<T>());
        if self.use_two_level(bytes, self.tuning.hierarchical_allgather_bytes, true) {
            AllgatherAlgorithm::Hierarchical
        } else if self.fits(count) {
            AllgatherAlgorithm::Native
        } else {
            AllgatherAlgorithm::Ring
        }
    }

    /// What `Auto` runs for an allreduce of `bytes` with `O` in `mode`: decided from values every
    /// rank shares (operator, size, tuning, shape, and whether the node window exists, which
    /// every rank made at the same operation), so all ranks agree.
    pub(super) fn auto_allreduce<T: Element, O: ReduceOp<T>>(&self, bytes: usize, mode: Mode) -> AllreduceAlgorithm {
        let t = &self.tuning;
        let window = mode == Mode::Blocking || self.core.shm.is_made();
        if !O::COMMUTATIVE || self.size() == 1 {
            AllreduceAlgorithm::Native
        } else if !self.topology.shape().single_node() && bytes >= t.hierarchical_allreduce_bytes {
            AllreduceAlgorithm::Hierarchical
        } else if !self.topology.shape().single_node() && bytes <= NATIVE_UNCHECKED_BYTES {
            // MPI's own is the faster here (4 B on 2 hosts x 2 ranks: 20 µs against recursive
            // doubling's 22), and needs no check.
            AllreduceAlgorithm::Native
        } else if !self.topology.shape().single_node() && bytes < t.nodes_recursive_doubling_bytes {
            AllreduceAlgorithm::RecursiveDoubling
        } else if self.topology.shape().single_node() && bytes >= t.shared_memory_allreduce_bytes && window {
            AllreduceAlgorithm::SharedMemory
        } else if bytes >= t.allreduce_ring_bytes {
            AllreduceAlgorithm::Ring
        } else {
            AllreduceAlgorithm::Native
        }
    }

    /// What `Auto` runs for a HostTransfer operation's allreduce part of `bytes` (see
    /// [`super::Tuning::staged_recursive_doubling_bytes`]); otherwise what it runs for a
    /// non-blocking call.
    pub(crate) fn auto_staged_allreduce<T: Element, O: ReduceOp<T>>(&self, bytes: usize) -> AllreduceAlgorithm {
        let tiny = bytes <= self.tuning.staged_recursive_doubling_bytes;
        if tiny && O::COMMUTATIVE && self.size() > 1 && self.topology.shape().single_node() {
            AllreduceAlgorithm::RecursiveDoubling
        } else {
            self.auto_allreduce::<T, O>(bytes, Mode::NonBlocking)
        }
    }

    /// What `Auto` runs for a broadcast of `bytes`.
    pub(super) fn auto_bcast(&self, bytes: usize) -> BcastAlgorithm {
        let t = &self.tuning;
        if !self.topology.shape().single_node() && bytes >= t.hierarchical_bcast_bytes {
            BcastAlgorithm::Hierarchical
        } else if self.topology.shape().single_node() && self.size() > 1 && bytes >= t.bcast_chain_bytes {
            BcastAlgorithm::Chain
        } else {
            BcastAlgorithm::Native
        }
    }

    /// Whether a collective of `bytes` in total runs a two-level algorithm from `threshold` up:
    /// several nodes, and a commutative operator where it reduces.
    pub(super) fn use_two_level(&self, bytes: usize, threshold: usize, commutative: bool) -> bool {
        commutative && !self.topology.shape().single_node() && bytes >= threshold
    }

    /// Whether a reduce-scatter of `total` elements runs the ring: from
    /// [`super::Tuning::reduce_ring_bytes`] up to [`super::Tuning::reduce_native_above_bytes`],
    /// and whenever it is too large for one MPI call.
    pub(super) fn use_reduce_scatter_ring<T: Element, O: ReduceOp<T>>(&self, total: usize) -> bool {
        let bytes = total.saturating_mul(size_of::<T>());
        let native = bytes >= self.tuning.reduce_native_above_bytes && self.fits(total);
        !native && self.use_reduce_ring::<T, O>(total, self.tuning.reduce_ring_bytes)
    }

    /// Whether a reduce or reduce-scatter of `total` elements runs the ring reduce-scatter:
    /// decided from values every rank shares, so all ranks agree.
    pub(super) fn use_reduce_ring<T: Element, O: ReduceOp<T>>(&self, total: usize, threshold: usize) -> bool {
        let bytes = total.saturating_mul(size_of::<T>());
        O::COMMUTATIVE && self.size() > 1 && (bytes >= threshold || !self.fits(total))
    }
}
