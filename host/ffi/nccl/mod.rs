//! The NCCL/RCCL foreign-function layer: [`sys`] resolves the entry points at run time; this
//! module turns their status codes into [`Error`]s (any code, known or not), gates entry points
//! by the loaded library's version, and polls non-blocking calls. The backend
//! ([`crate::backends::nccl`]) builds on it.

pub(crate) mod sys;

use std::ffi::{CStr, c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::time::{Duration, Instant};

pub(crate) use sys::{Comm, Flavor, Stream, UniqueId};

use crate::api::error::{Error, Result};

/// A loaded library and its version.
pub(crate) struct Nccl {
    lib: sys::Library,
    flavor: Flavor,
    /// `ncclGetVersion`'s code (`major * 10000 + minor * 100 + patch`).
    version: i32,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} ({})", self.flavor.name(), version_text(self.version), self.lib.loaded)
    }
}

/// `2.27.3` from `22703`.
pub(crate) fn version_text(code: i32) -> String {
    format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100)
}

/// The oldest version the backend needs: `ncclCommSplit` and non-blocking communicators.
pub(crate) const MIN_VERSION: i32 = 21800;

/// The NCCL version that added `ncclAlltoAll`, `ncclGather` and `ncclScatter`.
pub(crate) const EXCHANGES_SINCE: i32 = 22800;

/// The library of `flavor`, loaded once per process: an error (never a panic) when it cannot
/// be loaded or is older than [`MIN_VERSION`].
pub(crate) fn library(flavor: Flavor) -> Result<&'static Nccl> {
    static LIBS: [OnceLock<Result<Nccl, String>>; 2] = [OnceLock::new(), OnceLock::new()];
    let slot = &LIBS[usize::from(flavor == Flavor::Rccl)];
    slot.get_or_init(|| Nccl::open(flavor)).as_ref().map_err(|e| Error::LibraryUnavailable(e.clone()))
}

/// What a call that may run on in the background returned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Progress {
    Done,
    /// `ncclInProgress`: poll [`Nccl::wait_ready`] before the next call on the communicator.
    InProgress,
}

/// The description of a status code; codes this layer does not know are named by number.
pub(crate) fn status_name(code: c_int) -> String {
    match code {
        0 => "success".into(),
        1 => "unhandled CUDA error".into(),
        2 => "system error".into(),
        3 => "internal error".into(),
        4 => "invalid argument".into(),
        5 => "invalid usage".into(),
        6 => "remote error (a peer failed or aborted)".into(),
        7 => "in progress".into(),
        8 => "timeout".into(),
        other => format!("unknown NCCL status {other}"),
    }
}

impl Nccl {
    fn open(flavor: Flavor) -> Result<Nccl, String> {
        let lib = sys::load(flavor)?;
        let get_version = lib.get_version.ok_or_else(|| format!("{} has no ncclGetVersion", lib.loaded))?;
        let mut version: c_int = 0;
        // SAFETY: an out-pointer to a local.
        let code = unsafe { get_version(&mut version) };
        if code != sys::SUCCESS {
            return Err(format!("ncclGetVersion failed: {}", status_name(code)));
        }
        if version < MIN_VERSION {
            return Err(format!(
                "{} is {}; Duralumin needs {} or newer (ncclCommSplit, non-blocking communicators)",
                lib.loaded,
                version_text(version),
                version_text(MIN_VERSION)
            ));
        }
        Ok(Nccl { lib, flavor, version })
    }

    /// The library's version code.
    pub(crate) fn version(&self) -> i32 {
        self.version
    }

    /// Whether the library has NCCL 2.28's `ncclAlltoAll`, `ncclGather` and `ncclScatter`
    /// (RCCL's older functions of similar names are not used: untested).
    pub(crate) fn has_exchanges(&self) -> bool {
        let l = &self.lib;
        self.flavor == Flavor::Nccl
            && self.version >= EXCHANGES_SINCE
            && l.alltoall.is_some()
            && l.gather.is_some()
            && l.scatter.is_some()
    }

    /// The library's name (`NCCL`, `RCCL`).
    pub(crate) fn name(&self) -> &'static str {
        self.flavor.name()
    }

    /// An entry point, or a typed error when the loaded library lacks it.
    fn entry<F>(&self, f: Option<F>, call: &'static str) -> Result<F> {
        f.ok_or_else(|| Error::nccl(call, -1, format!("{} has no {call}", self.lib.loaded)))
    }

    /// `code` as a result: success, in progress, or the error with the library's last message
    /// for `comm` where it has one.
    pub(crate) fn check(&self, call: &'static str, code: c_int, comm: Option<Comm>) -> Result<Progress> {
        match code {
            sys::SUCCESS => Ok(Progress::Done),
            sys::IN_PROGRESS => Ok(Progress::InProgress),
            _ => Err(Error::nccl(call, code, self.describe(code, comm))),
        }
    }

    fn describe(&self, code: c_int, comm: Option<Comm>) -> String {
        let mut text = status_name(code);
        if let (Some(last), Some(comm)) = (self.lib.get_last_error, comm) {
            // SAFETY: a live communicator (callers pass only those); the library returns a
            // NUL-terminated string it owns, or null.
            let msg = unsafe { last(comm) };
            if !msg.is_null() {
                // SAFETY: non-null and NUL-terminated, read at once.
                let msg = unsafe { CStr::from_ptr(msg) }.to_string_lossy();
                if !msg.trim().is_empty() {
                    text = format!("{text}: {}", msg.trim());
                }
            }
        }
        text
    }

    /// A fresh unique id (`ncclGetUniqueId`).
    pub(crate) fn unique_id(&self) -> Result<UniqueId> {
        let f = self.entry(self.lib.get_unique_id, "ncclGetUniqueId")?;
        let mut id = UniqueId { internal: [0; 128] };
        // SAFETY: an out-pointer to a local id.
        self.check("ncclGetUniqueId", unsafe { f(&mut id) }, None)?;
        Ok(id)
    }

    /// `ncclCommInitRankConfig`, non-blocking: the communicator, which may still be
    /// initializing ([`Nccl::wait_ready`] before using it).
    ///
    /// # Safety
    /// The device the communicator is for is current on the calling thread.
    pub(crate) unsafe fn init_rank(&self, nranks: usize, id: UniqueId, rank: usize) -> Result<Comm> {
        let f = self.entry(self.lib.comm_init_rank_config, "ncclCommInitRankConfig")?;
        let (n, r) = (int(nranks, "nranks")?, int(rank, "rank")?);
        let mut config = sys::Config::new(false);
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: out-pointers to locals; the config outlives the call (NCCL copies it).
        let code = unsafe { f(&mut comm, n, id, r, &mut config) };
        if comm.is_null() || code != sys::SUCCESS && code != sys::IN_PROGRESS {
            return Err(Error::nccl("ncclCommInitRankConfig", code, status_name(code)));
        }
        Ok(comm)
    }

    /// `ncclCommSplit` into a non-blocking communicator (`None` for `color == None`), which may
    /// still be initializing. NCCL writes the new handle later, from its own thread (the NCCL
    /// split bug: `docs/nccl.md#the-nccl-split-bug`): this waits, up to `deadline`, until the
    /// parent's `ncclCommGetAsyncError` reports the split done and, with a color, the handle is
    /// there.
    ///
    /// # Safety
    /// `comm` is a live, ready communicator, used by no other thread.
    pub(crate) unsafe fn split(
        &self,
        comm: Comm,
        color: Option<u32>,
        key: i32,
        deadline: Option<Instant>,
    ) -> Result<Option<Comm>> {
        let f = self.entry(self.lib.comm_split, "ncclCommSplit")?;
        let colored = color.is_some();
        let color = match color {
            Some(c) => c_int::try_from(c).map_err(|_| Error::InvalidConfig("split color above i32::MAX"))?,
            None => sys::SPLIT_NOCOLOR,
        };
        let mut config = sys::Config::new(false);
        // NCCL's thread stores the handle through this pointer (a release store) after the
        // call returns: it lives on the heap until the split is known to be over, and is
        // leaked when that is not known.
        let slot: *mut AtomicPtr<c_void> = Box::into_raw(Box::new(AtomicPtr::new(std::ptr::null_mut())));
        // SAFETY: a live communicator (caller); the slot (an AtomicPtr, laid out as the
        // `ncclComm_t` NCCL writes) is valid until reclaimed below; NCCL copies the config.
        let code = unsafe { f(comm, color, key, slot.cast(), &mut config) };
        // SAFETY: the slot is valid (leaked on every early return); a live communicator.
        let over = self.check("ncclCommSplit", code, Some(comm)).and_then(|_| unsafe {
            self.wait_until(comm, "ncclCommSplit", deadline, || !colored || !(*slot).load(Ordering::Acquire).is_null())
        });
        // An error while NCCL may still run the split: the slot stays NCCL's (leaked).
        over?;
        // SAFETY: from Box::into_raw above; NCCL's thread has finished with it (the parent's
        // poll reported the split's job done, which follows its store), and nothing else holds it.
        let new = unsafe { Box::from_raw(slot) }.into_inner();
        Ok((!new.is_null()).then_some(new))
    }

    /// Polls `ncclCommGetAsyncError` until the communicator's pending call has finished, and
    /// returns its outcome (or the communicator's asynchronous error). Past `deadline` it
    /// returns [`Error::Nccl`] naming `call` with status `ncclInProgress`.
    ///
    /// # Safety
    /// `comm` is a live communicator.
    pub(crate) unsafe fn wait_ready(&self, comm: Comm, call: &'static str, deadline: Option<Instant>) -> Result<()> {
        // SAFETY: a live communicator (caller).
        unsafe { self.wait_until(comm, call, deadline, || true) }
    }

    /// [`wait_ready`](Self::wait_ready) until `also` holds as well.
    ///
    /// # Safety
    /// `comm` is a live communicator.
    unsafe fn wait_until(
        &self,
        comm: Comm,
        call: &'static str,
        deadline: Option<Instant>,
        also: impl Fn() -> bool,
    ) -> Result<()> {
        let mut spins = 0u32;
        loop {
            // SAFETY: a live communicator (caller).
            match unsafe { self.async_error(comm) }? {
                Progress::Done if also() => return Ok(()),
                Progress::Done | Progress::InProgress => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(Error::nccl(
                    call,
                    sys::IN_PROGRESS,
                    "still in progress at the communicator's deadline".into(),
                ));
            }
            spins = spins.saturating_add(1);
            if spins < 64 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }

    /// `ncclCommGetAsyncError`: `Done` when the communicator is idle and well, `InProgress`
    /// while a call is pending, the asynchronous error otherwise.
    ///
    /// # Safety
    /// `comm` is a live communicator (any thread may ask).
    pub(crate) unsafe fn async_error(&self, comm: Comm) -> Result<Progress> {
        let f = self.entry(self.lib.comm_get_async_error, "ncclCommGetAsyncError")?;
        let mut state: c_int = 0;
        // SAFETY: a live communicator (caller); an out-pointer to a local.
        let code = unsafe { f(comm, &mut state) };
        self.check("ncclCommGetAsyncError", code, Some(comm))?;
        self.check("NCCL (asynchronous error)", state, Some(comm))
    }

    /// `ncclCommCount` and `ncclCommUserRank`.
    ///
    /// # Safety
    /// `comm` is a live, ready communicator.
    pub(crate) unsafe fn rank_and_size(&self, comm: Comm) -> Result<(usize, usize)> {
        let count = self.entry(self.lib.comm_count, "ncclCommCount")?;
        let user_rank = self.entry(self.lib.comm_user_rank, "ncclCommUserRank")?;
        let (mut n, mut r): (c_int, c_int) = (0, 0);
        // SAFETY: a live communicator; out-pointers to locals.
        self.check("ncclCommCount", unsafe { count(comm, &mut n) }, Some(comm))?;
        // SAFETY: as above.
        self.check("ncclCommUserRank", unsafe { user_rank(comm, &mut r) }, Some(comm))?;
        let u = |v: c_int| usize::try_from(v).map_err(|_| Error::nccl("ncclCommCount", -1, format!("returned {v}")));
        Ok((u(r)?, u(n)?))
    }

    /// `ncclCommFinalize` then `ncclCommDestroy`, polling in between, for a communicator
    /// whose work has all been waited for.
    ///
    /// # Safety
    /// `comm` is live and is not used again.
    pub(crate) unsafe fn finalize(&self, comm: Comm, deadline: Option<Instant>) -> Result<()> {
        let finalize = self.entry(self.lib.comm_finalize, "ncclCommFinalize")?;
        let destroy = self.entry(self.lib.comm_destroy, "ncclCommDestroy")?;
        // SAFETY: a live communicator (caller).
        if self.check("ncclCommFinalize", unsafe { finalize(comm) }, Some(comm))? == Progress::InProgress {
            // SAFETY: still live.
            unsafe { self.wait_ready(comm, "ncclCommFinalize", deadline) }?;
        }
        // SAFETY: finalized; not used again (caller).
        self.check("ncclCommDestroy", unsafe { destroy(comm) }, None).map(drop)
    }

    /// `ncclCommAbort`: ends the communicator's pending work and frees it, from any thread.
    ///
    /// # Safety
    /// `comm` is live and is not used again.
    pub(crate) unsafe fn abort(&self, comm: Comm) -> Result<()> {
        let f = self.entry(self.lib.comm_abort, "ncclCommAbort")?;
        // SAFETY: a live communicator, not used again (caller).
        self.check("ncclCommAbort", unsafe { f(comm) }, None).map(drop)
    }

    /// `ncclGroupStart`.
    pub(crate) fn group_start(&self) -> Result<()> {
        let f = self.entry(self.lib.group_start, "ncclGroupStart")?;
        // SAFETY: no arguments; groups nest per thread.
        self.check("ncclGroupStart", unsafe { f() }, None).map(drop)
    }

    /// `ncclGroupEnd`: `InProgress` on a non-blocking communicator until polled ready.
    pub(crate) fn group_end(&self, comm: Comm) -> Result<Progress> {
        let f = self.entry(self.lib.group_end, "ncclGroupEnd")?;
        // SAFETY: no arguments; ends the group this thread started.
        self.check("ncclGroupEnd", unsafe { f() }, Some(comm))
    }

    /// Queues one call (a collective or a send/receive) inside the current group.
    ///
    /// # Safety
    /// The call's buffers are device memory of the communicator's device, valid for the
    /// elements it reads and writes until the stream has run it; `comm` is live; `stream`
    /// belongs to the communicator's device.
    pub(crate) unsafe fn queue(&self, call: &Call, comm: Comm, stream: Stream) -> Result<()> {
        use sys::Library as L;
        let l: &L = &self.lib;
        let code = match *call {
            Call::AllReduce { send, recv, count, dtype, op } => {
                // SAFETY: as the function's contract; the entry point's signature is NCCL's.
                unsafe { self.entry(l.all_reduce, "ncclAllReduce")?(send, recv, count, dtype, op, comm, stream) }
            }
            Call::Broadcast { send, recv, count, dtype, root } => {
                // SAFETY: as above.
                unsafe { self.entry(l.broadcast, "ncclBroadcast")?(send, recv, count, dtype, root, comm, stream) }
            }
            Call::Reduce { send, recv, count, dtype, op, root } => {
                // SAFETY: as above.
                unsafe { self.entry(l.reduce, "ncclReduce")?(send, recv, count, dtype, op, root, comm, stream) }
            }
            Call::AllGather { send, recv, count, dtype } => {
                // SAFETY: as above.
                unsafe { self.entry(l.all_gather, "ncclAllGather")?(send, recv, count, dtype, comm, stream) }
            }
            Call::ReduceScatter { send, recv, count, dtype, op } => {
                // SAFETY: as above.
                unsafe {
                    self.entry(l.reduce_scatter, "ncclReduceScatter")?(send, recv, count, dtype, op, comm, stream)
                }
            }
            Call::Send { buf, count, dtype, peer } => {
                // SAFETY: as above.
                unsafe { self.entry(l.send, "ncclSend")?(buf, count, dtype, peer, comm, stream) }
            }
            Call::Recv { buf, count, dtype, peer } => {
                // SAFETY: as above.
                unsafe { self.entry(l.recv, "ncclRecv")?(buf, count, dtype, peer, comm, stream) }
            }
            Call::AlltoAll { send, recv, count, dtype } => {
                // SAFETY: as above.
                unsafe { self.entry(l.alltoall, "ncclAlltoAll")?(send, recv, count, dtype, comm, stream) }
            }
            Call::Gather { send, recv, count, dtype, root } => {
                // SAFETY: as above.
                unsafe { self.entry(l.gather, "ncclGather")?(send, recv, count, dtype, root, comm, stream) }
            }
            Call::Scatter { send, recv, count, dtype, root } => {
                // SAFETY: as above.
                unsafe { self.entry(l.scatter, "ncclScatter")?(send, recv, count, dtype, root, comm, stream) }
            }
        };
        self.check(call.name(), code, Some(comm)).map(drop)
    }
}

/// One NCCL call, with raw device addresses. `AlltoAll`, `Gather` and `Scatter` are NCCL 2.28's
/// ([`Nccl::has_exchanges`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Call {
    AllReduce { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int },
    Broadcast { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, root: c_int },
    Reduce { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int, root: c_int },
    AllGather { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int },
    ReduceScatter { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int },
    Send { buf: *const c_void, count: usize, dtype: c_int, peer: c_int },
    Recv { buf: *mut c_void, count: usize, dtype: c_int, peer: c_int },
    AlltoAll { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int },
    Gather { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, root: c_int },
    Scatter { send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, root: c_int },
}

impl Call {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Call::AllReduce { .. } => "ncclAllReduce",
            Call::Broadcast { .. } => "ncclBroadcast",
            Call::Reduce { .. } => "ncclReduce",
            Call::AllGather { .. } => "ncclAllGather",
            Call::ReduceScatter { .. } => "ncclReduceScatter",
            Call::Send { .. } => "ncclSend",
            Call::Recv { .. } => "ncclRecv",
            Call::AlltoAll { .. } => "ncclAlltoAll",
            Call::Gather { .. } => "ncclGather",
            Call::Scatter { .. } => "ncclScatter",
        }
    }
}

/// A rank, root or peer as NCCL's `int` (communicator sizes fit: NCCL's own limit).
pub(crate) fn int(v: usize, what: &'static str) -> Result<c_int> {
    c_int::try_from(v).map_err(|_| Error::CountOverflow { what, value: v as u128 })
}
