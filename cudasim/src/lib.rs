//! A CUDA driver simulator for tests: `libcuda.so` with the part of the driver API Duralumin
//! (through cudarc) uses, run on the CPU.
//!
//! No GPU is needed to run Duralumin's CUDA device end to end: put the directory holding this
//! library first on `LD_LIBRARY_PATH` and cudarc's dynamic loading finds it as the driver. It
//! simulates one device with unified addressing, streams on shared hardware queues, events,
//! stream memory operations, host functions, pinned mapped memory, 2-D copies, and launches of
//! Duralumin's builtin kernels (their bodies from `duralumin-kernels`, on the CPU).
//!
//! It is not a GPU; what it adds is checks a GPU does not make, where Duralumin's CUDA code can
//! go wrong without one:
//!
//! * **contexts**: every call but the initialization and device queries needs a context
//!   current on the calling thread (`CUDA_ERROR_INVALID_CONTEXT` otherwise);
//! * **host functions** may not call the driver (`CUDA_ERROR_NOT_PERMITTED`, reported);
//! * **hardware queues**: streams share `CUDA_DEVICE_MAX_CONNECTIONS` (default 8) queues,
//!   each running its work in submission order, so a stream waiting on the device for work
//!   queued after it deadlocks, as it can on a GPU; a queue holds `CUDASIM_QUEUE_DEPTH`
//!   commands (default 1024) and the call that queues one more blocks until one has run;
//! * **implicit synchronization**: `cuMemFreeHost`, `cuMemFree`, `cuModuleGetFunction` (which
//!   loads a function under lazy loading) and copies from or to pageable memory wait for the
//!   device, the worst case the CUDA documentation allows; a wait that lasts 20 s is reported
//!   on stderr as a likely deadlock (this thread is one the device waits for); allocations
//!   (`cuMemAlloc`, `cuMemAllocHost`, `cuMemHostAlloc`) order themselves after all work queued
//!   so far, without blocking the caller; a destroyed stream's work counts until it has run;
//! * **memory**: every device-side access (copies, memsets, kernels, flag operations) must lie
//!   in a live allocation, device or pinned host memory (unified addressing); freed blocks are
//!   quarantined, so a late access faults instead of touching reused memory; new memory is
//!   filled with 0xCD, freed memory with 0xDD. A fault is reported on stderr and
//!   makes the context unusable (every later call fails), as an illegal address does on a GPU;
//! * **modules**: PTX is read for its entry points and their parameter counts, which must match
//!   the kernel bodies (and their widths); unloading a module with launches of it still queued is a fault.
//!
//! `CUDASIM_COPY_GBPS=B` turns on a timing model (see `timing.rs`): each copy takes at least
//! its bytes at B GB/s on a copy engine per direction shared by all streams, kernels a modelled
//! time on the SMs, so a pipeline's overlap shows in wall-clock time on a CPU.
//!
//! `CUDASIM_TRACE=1` prints every call on stderr. `CUDASIM_FAIL_CALLS=cuLaunchHostFunc,...`
//! makes the named calls fail (`CUDA_ERROR_UNKNOWN`, doing nothing), for tests of what their
//! callers do then; with `CUDASIM_FAIL_RANK=R`, only in the rank R of an MPI job.
//!
//! # ncclsim
//!
//! The same library is also a simulated NCCL (the C API of `libnccl.so.2`, version 2.28.9, or
//! `NCCLSIM_VERSION`, below 2.28 refusing `ncclAlltoAll`, `ncclGather` and `ncclScatter` as a
//! library without them would): linked under that name next to `libcuda.so`, it is loaded once
//! and its communicators queue their work on the simulator's streams and check the simulator's memory.
//! Ranks are processes (under `mpirun`) or threads: each communicator connects to its peers over
//! Unix domain sockets in `${NCCLSIM_DIR:-/tmp}/ncclsim-<id>/` (waiting `NCCLSIM_INIT_TIMEOUT`
//! seconds, default 60, for them), and every collective sends its header and contribution to
//! every other rank, each computing its own result in rank order with the element bodies of
//! `duralumin-kernels` (bit for bit the library's own reductions). Work runs in stream order:
//! a group's operations are one unit at the outermost `ncclGroupEnd` (sends first). Non-blocking
//! communicators answer `ncclInProgress` from init, split, finalize, `ncclGroupEnd` and lone
//! operations, and do the work only when `ncclCommGetAsyncError` is polled; any other call on
//! them meanwhile is `ncclInvalidUsage`. It adds checks NCCL does not make, each reported on
//! stderr as `ncclsim: <what>: <details>` and made the communicator's asynchronous error
//! (`ncclInvalidUsage`) without hanging:
//!
//! * all ranks call the same collectives in the same order with the same kind, count, type,
//!   operator and root; sends and receives match per peer pair in order, count, type and group;
//! * at most 2048 operations per group; one thread at a time in calls on a communicator;
//! * send and receive ranges overlap only as the operation's in-place form (none for
//!   all-to-all), at the call (`ncclInvalidArgument`);
//! * buffers lie in live allocations (at the call: `ncclInvalidArgument`; when the work runs: a
//!   fault, as the simulator reports faults), as do ranks, roots, types and operators;
//! * work that waits 20 s for a peer is reported as a likely hang (and waits on, as NCCL does,
//!   until the frame comes or the communicator is aborted); `ncclCommAbort` ends blocked work at
//!   once and its peers' waits end with `ncclRemoteError`; messages from peers never received
//!   are reported at `ncclCommDestroy`.
//!
//! `NCCLSIM_FAULT=async:rank=R,call=N;hang:rank=R,call=N` makes rank `R`'s `N`-th collective or
//! send/recv (counted in this process from 1, by the rank in the communicator the call's
//! descends from) fail with an asynchronous `ncclSystemError` without communicating, or block
//! until aborted. `NCCLSIM_TRACE=1` prints every call. What it cannot show: performance,
//! NVLink, InfiniBand or network protocol behaviour, NCCL's algorithms and their rounding order
//! (its sums are in rank order), and where exactly real NCCL returns `ncclInProgress`. Ranks as
//! threads of one process share the one simulated device, unlike real ranks: their streams
//! need hardware queues of their own (at most `CUDA_DEVICE_MAX_CONNECTIONS` ranks), and an
//! allocation (a device-wide barrier) while collectives are in flight can order a rank's work
//! behind work that waits for it.

#![deny(missing_docs)]
#![allow(non_snake_case)]

mod api;
mod exec;
mod kernels;
mod memory;
mod nccl;
mod timing;

use cudarc::driver::sys::CUresult;

// CUDA's device addresses are 64-bit; the simulator's are host addresses.
#[cfg(not(target_pointer_width = "64"))]
compile_error!("the simulator needs 64-bit host addresses");

/// A device address, size or count as the host's `usize`.
#[allow(clippy::cast_possible_truncation, reason = "the host is 64-bit (checked above)")]
pub(crate) fn usize_of(v: u64) -> usize {
    v as usize
}

/// Why a call or a piece of device work failed: the status and what the simulator saw.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    code: CUresult,
    message: String,
}

impl Fault {
    pub(crate) fn new(code: CUresult, message: String) -> Fault {
        Fault { code, message }
    }

    pub(crate) fn invalid(message: String) -> Fault {
        Fault::new(CUresult::CUDA_ERROR_INVALID_VALUE, message)
    }

    pub(crate) fn illegal(message: String) -> Fault {
        Fault::new(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, message)
    }

    pub(crate) fn ptx(message: String) -> Fault {
        Fault::new(CUresult::CUDA_ERROR_INVALID_PTX, message)
    }

    pub(crate) fn not_found(message: String) -> Fault {
        Fault::new(CUresult::CUDA_ERROR_NOT_FOUND, message)
    }

    pub(crate) fn not_supported(message: String) -> Fault {
        Fault::new(CUresult::CUDA_ERROR_NOT_SUPPORTED, message)
    }
}
