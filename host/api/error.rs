//! The one error type of the library.

/// Everything a Duralumin call can fail with.
///
/// Input errors (the first group) are detected on the calling rank before anything is sent, so
/// the communicator stays usable: the next valid call works. MPI errors carry MPI's own message
/// and error class. Errors inside an operation that runs on the progress thread are reported by
/// that operation's [`crate::Request::wait`] / [`crate::Request::test`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A buffer does not hold the number of elements the call needs.
    #[error("{what}: the buffer holds {actual} elements but the call needs {expected}")]
    BufferLength {
        /// The buffer, as the call names it (`"allreduce receive buffer"`).
        what: &'static str,
        /// The number of elements the call needs.
        expected: usize,
        /// The number of elements the buffer holds.
        actual: usize,
    },

    /// A per-rank vector (counts or displacements) is not one entry per rank.
    #[error("{what} has {actual} entries but the communicator has {expected} ranks")]
    VectorLength {
        /// The vector, as the call names it (`"reduce_scatterv counts"`).
        what: &'static str,
        /// The communicator's size: one entry per rank.
        expected: usize,
        /// The number of entries the vector has.
        actual: usize,
    },

    /// A block `[start, start + count)` of a v-collective does not fit its buffer.
    #[error("{what}: the block of rank {rank} ({start}..{end}) is outside the buffer of {len} elements")]
    DisplacementOutOfRange {
        /// The blocks, as the call names them (`"gatherv receive blocks"`).
        what: &'static str,
        /// The rank the block belongs to.
        rank: usize,
        /// The block's first element: its displacement.
        start: usize,
        /// One past the block's last element: its displacement plus its count.
        end: usize,
        /// The number of elements the buffer holds.
        len: usize,
    },

    /// Two receive blocks of a v-collective overlap, so the result would depend on timing.
    #[error("{what}: the blocks of ranks {first} and {second} overlap")]
    DisplacementOverlap {
        /// The blocks, as the call names them.
        what: &'static str,
        /// The lower of the two ranks whose blocks overlap.
        first: usize,
        /// The higher of the two ranks whose blocks overlap.
        second: usize,
    },

    /// A root or peer rank is not in the communicator.
    #[error("{what} {rank} is out of range for a communicator of {size} ranks")]
    RankOutOfRange {
        /// The argument, as the call names it (`"bcast root"`, `"destination rank"`).
        what: &'static str,
        /// The rank given.
        rank: usize,
        /// The communicator's size: valid ranks are `0..size`.
        size: usize,
    },

    /// A blocking send or receive with this rank itself as the peer, which can never complete.
    #[error("a blocking {op} to this rank itself would deadlock; use sendrecv or the non-blocking form")]
    SelfMessage {
        /// The call (`"send"`, `"recv"`).
        op: &'static str,
    },

    /// A tag outside `0..=max` (`max` is the MPI library's `MPI_TAG_UB`).
    #[error("tag {tag} is outside 0..={max}")]
    InvalidTag {
        /// The tag given.
        tag: i64,
        /// The largest valid tag: the MPI library's `MPI_TAG_UB`.
        max: i64,
    },

    /// A count, displacement or byte size does not fit the integer types involved.
    #[error("{what}: {value} elements overflows what can be addressed")]
    CountOverflow {
        /// The quantity, as the call names it.
        what: &'static str,
        /// The value that does not fit (computed without overflow), or the operand that made
        /// the computation overflow.
        value: u128,
    },

    /// An algorithm was requested that cannot run this operation.
    #[error("algorithm {algorithm} cannot run this operation: {reason}")]
    AlgorithmUnsupported {
        /// The algorithm requested.
        algorithm: &'static str,
        /// Why it cannot run this operation.
        reason: &'static str,
    },

    /// Another rank sent a different amount of data than this rank expected (a count mismatch
    /// between ranks, which cannot be detected before sending).
    #[error("{what}: expected {expected} elements from rank {peer} but {received} arrived")]
    CountMismatch {
        /// The transfer, as the call names it (`"message"`).
        what: &'static str,
        /// The rank the data came from.
        peer: usize,
        /// The number of elements this rank expected.
        expected: usize,
        /// The number of elements that arrived.
        received: usize,
    },

    /// Another rank's collective does not match this rank's, found while the operation ran
    /// (without the signature check): a message of another length, a message of another call
    /// where this rank expects one of its own, or another call in a shared-memory peer's
    /// header. What arrived was never written past this rank's buffers. As after a timeout, the
    /// ranks then exchange their flight recorders (`report`, whose lines name the ranks that
    /// differ and what they called) and the job is aborted or, under
    /// [`OnTimeout::Error`](crate::reliability::OnTimeout::Error), the communicator given up:
    /// its later calls, here and on the other ranks, fail with [`Error::Aborted`]. Why this is
    /// not [`Error::SignatureMismatch`]: `docs/reliability.md`.
    ///
    /// Also, under `OnTimeout::Error`, the error of an operation still in flight when another
    /// rank (`peer`) gave the communicator up in a collective of the same number that is
    /// another call than this one (its deadline passed, or it failed, before this rank found
    /// the difference): then `report` sets the two calls side by side, and the report of every
    /// rank's call is the one `peer` printed.
    #[error("{op} #{seq}: {what}\n{report}")]
    Mismatch {
        /// This rank's operation (`"allreduce"`).
        op: &'static str,
        /// Its number on the communicator (collectives are numbered from 1).
        seq: u64,
        /// The rank whose message or header differs (or that gave the communicator up).
        peer: usize,
        /// What was found (`"rank 3 sent 8 elements where this rank expects 7"`).
        what: String,
        /// The desync report of the exchange that followed (or the two calls, where `peer`
        /// gave the communicator up).
        report: String,
    },

    /// The MPI library returned an error.
    #[error("{call} failed: {message} (MPI error code {code}, class {class})")]
    Mpi {
        /// The MPI function that failed (`"MPI_Allreduce"`).
        call: &'static str,
        /// The error code it returned.
        code: i32,
        /// The code's error class (`MPI_Error_class`).
        class: i32,
        /// The code's description (`MPI_Error_string`).
        message: String,
    },

    /// MPI is initialized with a thread level below `MPI_THREAD_MULTIPLE`.
    #[error("Duralumin needs MPI_THREAD_MULTIPLE but the MPI library provides {provided}")]
    ThreadLevel {
        /// The thread level the MPI library provides (`"MPI_THREAD_SERIALIZED"`).
        provided: &'static str,
    },

    /// MPI was already initialized by someone else, or initialization failed.
    #[error("MPI initialization: {0}")]
    Init(&'static str),

    /// The launcher started several tasks as one job, but MPI was not wired up between them:
    /// each is an MPI job of one rank (`srun --mpi=none`, a PMI the MPI library cannot use, or
    /// the `mpirun` of another MPI library). [`crate::init`] refuses to go on, since every task
    /// would compute alone and report success (see `docs/cluster.md`, "Slurm").
    #[error(
        "{launcher} started {tasks} tasks ({variable}), but MPI sees one rank in each: they are {tasks} separate \
         MPI jobs, not one. {hint} (or set DURALUMIN_INDEPENDENT_TASKS=1 if each task is meant to run alone)"
    )]
    UnwiredLaunch {
        /// The launcher (`"srun"`).
        launcher: &'static str,
        /// How many tasks it started.
        tasks: usize,
        /// The variable that says so (`"SLURM_STEP_NUM_TASKS"`).
        variable: &'static str,
        /// How to launch instead.
        hint: &'static str,
    },

    /// Device kernels were not built or cannot be loaded; the message says what to install.
    #[error("device kernels are unavailable: {0}")]
    KernelsUnavailable(String),

    /// A buffer or stream belongs to another device (or context) than the communicator's.
    #[error("{what} belongs to {found}, but the communicator uses {expected}")]
    WrongDevice {
        /// The argument, as the call names it (`"stream"`).
        what: &'static str,
        /// The communicator's device.
        expected: String,
        /// The device the argument belongs to.
        found: String,
    },

    /// An in-place call was given two different buffers, or out-of-place buffers that overlap.
    #[error("{what}: the send and receive buffers overlap")]
    BufferOverlap {
        /// The call, as it names itself.
        what: &'static str,
    },

    /// A device or host allocation failed.
    #[error("{what}: could not allocate {bytes} bytes")]
    OutOfMemory {
        /// The memory asked for (`"pinned host memory (cuMemHostAlloc)"`).
        what: &'static str,
        /// The size of the allocation that failed.
        bytes: usize,
    },

    /// A pinned staging block does not fit under the pool's configured cap: a HostTransfer
    /// operation one of whose chunks needs more than the communicator's whole staging ring
    /// (`cap` is the ring's bytes), or [`Pools::take`](crate::device::pool::Pools::take) while
    /// the blocks in use leave no room.
    #[error(
        "the pinned staging pool is full: {requested} more bytes would exceed its cap of {cap} bytes ({in_use} in use)"
    )]
    PoolExhausted {
        /// The bytes asked for.
        requested: usize,
        /// The bytes of the pool's blocks in use when it was asked.
        in_use: usize,
        /// The pool's cap, in bytes.
        cap: usize,
    },

    /// A configuration value is out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(&'static str),

    /// A device call failed. `source` is the driver's own error, where there is one (cudarc's
    /// `DriverError`, a HIP status).
    #[error("{call} failed: {message}")]
    Device {
        /// The device call that failed (`"cuMemcpyAsync"`).
        call: &'static str,
        /// What went wrong: the driver's description, or the library's where there is none.
        message: String,
        /// The driver's own error, where there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },

    /// More operations failed, unobserved, than a communicator keeps for its next calls: the
    /// last error kept, and how many more were logged (`tracing`) but not kept.
    #[error("{first} (and {more} more unobserved errors, logged but not kept)")]
    Deferred {
        /// The last error kept.
        first: Box<Error>,
        /// How many errors beyond it were logged but not kept.
        more: usize,
    },

    /// The operation's task was lost (its thread panicked), so its outcome is unknown.
    #[error("the progress engine lost this operation: {0}")]
    Progress(&'static str),

    /// The operation ran past its communicator's deadline (see
    /// [`OnTimeout`](crate::reliability::OnTimeout)). `report` is the desync report: what every
    /// rank was doing at that moment (format in `docs/reliability.md`). The communicator is
    /// poisoned: later calls on it fail with [`Error::Aborted`].
    #[error("{op} #{seq} timed out after {elapsed:.1?}\n{report}")]
    Timeout {
        /// The operation (`"allreduce"`).
        op: &'static str,
        /// Its number on the communicator: collectives and point-to-point operations are
        /// numbered separately, each from 1.
        seq: u64,
        /// How long it had run when it was given up.
        elapsed: std::time::Duration,
        /// The desync report.
        report: String,
    },

    /// The communicator was given up ([`OnTimeout::Error`](crate::reliability::OnTimeout::Error)
    /// after a timeout or a failed collective, here or on another rank): every later call on it
    /// fails at once with this error, and operations pending on it complete with it.
    #[error("the communicator was aborted: {reason}")]
    Aborted {
        /// Why and where the communicator was given up.
        reason: String,
    },

    /// The signature check (`DURALUMIN_CHECK=1`, or
    /// [`MpiCommunicator::set_check`](crate::MpiCommunicator::set_check)) found that the ranks called
    /// different collectives at this point, or the same one with arguments that do not match,
    /// or that another rank's arguments were invalid. Nothing was sent; the communicator stays
    /// usable. `report` has one line per rank that differs.
    #[error("{op} #{seq}: the ranks' calls do not match\n{report}")]
    SignatureMismatch {
        /// This rank's operation.
        op: &'static str,
        /// Its number on the communicator (collectives are numbered from 1).
        seq: u64,
        /// One line per rank whose call differs.
        report: String,
    },

    /// Processes of the communicator failed (an MPI library with ULFM reported it). Recover
    /// with [`MpiCommunicator::shrink`](crate::MpiCommunicator::shrink).
    #[error("processes failed: ranks {ranks:?} of the communicator")]
    ProcessFailed {
        /// The ranks, in the communicator, of the processes known to have failed; empty where
        /// the MPI library could not say which.
        ranks: Vec<usize>,
    },

    /// The communicator was revoked ([`MpiCommunicator::revoke`](crate::MpiCommunicator::revoke) on
    /// some rank, with an MPI library that has ULFM).
    #[error("the communicator was revoked")]
    Revoked,

    /// An elastic job ([`crate::elastic`]) cannot go on: too few ranks are left, a state no
    /// surviving rank holds, or ranks that disagree on what was committed. The message says
    /// which, naming the ranks or slots.
    #[error("elastic job: {0}")]
    Membership(String),

    /// The feature needs something this build or MPI library lacks; the message says what.
    #[error("unsupported: {0}")]
    Unsupported(&'static str),

    /// A collective library call (NCCL or RCCL) failed. `code` is its status, known to this
    /// version of Duralumin or not (`-1`: the entry point is missing from the loaded library).
    #[error("{call} failed: {message} (status {code})")]
    Nccl {
        /// The call (`"ncclAllReduce"`).
        call: &'static str,
        /// The library's status code.
        code: i32,
        /// The status's meaning and the library's last message.
        message: String,
    },

    /// A library loaded at run time (NCCL, RCCL) is missing or too old; the message says what
    /// was tried and how to point Duralumin at it.
    #[error("{0}")]
    LibraryUnavailable(String),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// [`Error::Device`] with no driver error behind it.
    pub(crate) fn device(call: &'static str, message: impl Into<String>) -> Error {
        Error::Device { call, message: message.into(), source: None }
    }

    /// [`Error::Nccl`].
    pub(crate) fn nccl(call: &'static str, code: i32, message: String) -> Error {
        Error::Nccl { call, code, message }
    }

    /// [`Error::Device`] caused by the driver's error `cause`.
    pub(crate) fn device_from(call: &'static str, cause: impl std::error::Error + Send + Sync + 'static) -> Error {
        Error::Device { call, message: cause.to_string(), source: Some(Box::new(cause)) }
    }
}

#[cfg(test)]
mod tests {
    use super::Error;

    /// A device error keeps the driver's error as its source, and says the call it came from.
    #[test]
    fn device_errors_keep_their_cause() {
        let cause = std::io::Error::other("driver said no");
        let e = Error::device_from("cuSomething", cause);
        assert_eq!(e.to_string(), "cuSomething failed: driver said no");
        let source = std::error::Error::source(&e).expect("a source");
        assert_eq!(source.to_string(), "driver said no");
        assert!(std::error::Error::source(&Error::device("host stream", "stopped")).is_none());
    }
}
