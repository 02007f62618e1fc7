//! ncclsim: the part of NCCL's C API (`libnccl.so.2`) Duralumin uses, simulated in the same
//! library as the driver, so collectives run on the simulator's streams and memory. See the
//! crate documentation for what it checks and what it cannot show.
//!
//! This file holds the exported functions; [`comm`] the communicators, [`group`] operations and
//! groups, [`work`] what runs on the streams, [`transport`] the sockets between ranks,
//! [`checks`] the call-time checks, [`reduce`] the reductions, [`faults`] fault injection.

mod checks;
mod comm;
mod faults;
mod group;
mod reduce;
mod transport;
mod work;

#[cfg(test)]
mod tests;

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::io::Read;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::driver::sys::CUstream;

use self::comm::out;
use self::group::{Kind, Op};

/// `ncclResult_t` values.
pub(crate) const SUCCESS: c_int = 0;
pub(crate) const UNHANDLED_CUDA: c_int = 1;
pub(crate) const SYSTEM: c_int = 2;
pub(crate) const INTERNAL: c_int = 3;
pub(crate) const INVALID_ARGUMENT: c_int = 4;
pub(crate) const INVALID_USAGE: c_int = 5;
pub(crate) const REMOTE: c_int = 6;
pub(crate) const IN_PROGRESS: c_int = 7;

/// `ncclComm_t`: an opaque handle.
pub type NcclComm = *mut c_void;

/// `ncclUniqueId`, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclUniqueId {
    /// Opaque bytes: ncclsim's magic prefix, then the id proper.
    pub internal: [c_char; 128],
}

/// Starts every unique id ncclsim makes.
const ID_MAGIC: &[u8; 8] = b"ncclsim\x01";

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Why a call failed: its status and what ncclsim reports on stderr (nothing when empty).
#[derive(Clone, Debug)]
pub(crate) struct Error {
    code: c_int,
    message: String,
}

impl Error {
    pub(crate) fn new(code: c_int, message: String) -> Error {
        Error { code, message }
    }

    pub(crate) fn argument(message: String) -> Error {
        Error::new(INVALID_ARGUMENT, message)
    }

    pub(crate) fn usage(message: String) -> Error {
        Error::new(INVALID_USAGE, message)
    }

    pub(crate) fn system(message: String) -> Error {
        Error::new(SYSTEM, message)
    }

    pub(crate) fn internal(message: String) -> Error {
        Error::new(INTERNAL, message)
    }
}

/// Every message reported, kept so `ncclGetLastError`'s pointers stay valid (errors are few).
static MESSAGES: Mutex<Vec<CString>> = Mutex::new(Vec::new());
/// Bound on the messages kept; later ones are printed but not kept.
const MAX_MESSAGES: usize = 4096;

/// Prints `ncclsim: <message>` on stderr; it becomes what `ncclGetLastError` returns.
pub(crate) fn report(message: &str) {
    let line = format!("ncclsim: {message}");
    eprintln!("{line}");
    let mut kept = lock(&MESSAGES);
    if kept.len() < MAX_MESSAGES
        && let Ok(c) = CString::new(line.replace('\0', " "))
    {
        kept.push(c);
    }
}

fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var("NCCLSIM_TRACE").is_ok_and(|v| v == "1"))
}

/// Runs one API call: traces it, catches panics, reports failures.
fn call(name: &'static str, f: impl FnOnce() -> Result<c_int, Error>) -> c_int {
    if trace() {
        eprintln!("ncclsim: {name}");
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(code)) => code,
        Ok(Err(e)) => {
            if !e.message.is_empty() {
                report(&e.message);
            }
            e.code
        }
        Err(_) => {
            report(&format!("internal error: {name} panicked"));
            INTERNAL
        }
    }
}

/// `2.28.9` from `22809`.
fn version_text(code: c_int) -> String {
    format!("{}.{}.{}", code / 10000, (code / 100) % 100, code % 100)
}

/// The id proper of a unique id ncclsim made.
fn id_of(id: &NcclUniqueId) -> Result<u64, Error> {
    let bytes: Vec<u8> = id.internal.iter().map(|c| c.to_ne_bytes()[0]).collect();
    if bytes[..8] != ID_MAGIC[..] {
        return Err(Error::argument("invalid argument: an ncclUniqueId that ncclGetUniqueId did not make".into()));
    }
    let mut w = [0u8; 8];
    w.copy_from_slice(&bytes[8..16]);
    Ok(u64::from_le_bytes(w))
}

/// 8 random bytes: /dev/urandom, or the pid, time and a counter hashed.
fn random_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_ok() {
        return u64::from_le_bytes(b);
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let mut seed = std::process::id().to_le_bytes().to_vec();
    seed.extend_from_slice(&nanos.to_le_bytes());
    seed.extend_from_slice(&COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    comm::fnv(&seed)
}

/// `blocking` of an `ncclConfig_t` (read through its `size`): `None` without a config or
/// when unset (`NCCL_CONFIG_UNDEF_INT`).
///
/// # Safety
/// `config` is null or points to an `ncclConfig_t` of at least its `size` bytes.
unsafe fn config_blocking(config: *const c_void) -> Result<Option<bool>, Error> {
    if config.is_null() {
        return Ok(None);
    }
    let p = config.cast::<u8>();
    // SAFETY: a config starts with its `size_t size` (the caller's contract).
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    if size < 12 {
        return Err(Error::argument(format!("invalid argument: an ncclConfig_t of size {size}")));
    }
    // SAFETY: `magic` lies at offset 8, inside the config's `size` bytes (checked).
    let magic = unsafe { p.add(8).cast::<u32>().read_unaligned() };
    if magic != 0xcafe_beef {
        return Err(Error::argument(format!(
            "invalid argument: an ncclConfig_t with magic {magic:#x}, not initialized with NCCL_CONFIG_INITIALIZER"
        )));
    }
    if size < 20 {
        return Ok(None);
    }
    // SAFETY: `blocking` lies at offset 16, inside the config's `size` bytes (checked).
    let blocking = unsafe { p.add(16).cast::<c_int>().read_unaligned() };
    Ok(if blocking == c_int::MIN { None } else { Some(blocking != 0) })
}

/// The NCCL version simulated: `NCCLSIM_VERSION` (`major * 10000 + minor * 100 + patch`),
/// 2.28.9 by default.
fn version() -> c_int {
    static VERSION: OnceLock<c_int> = OnceLock::new();
    *VERSION.get_or_init(|| std::env::var("NCCLSIM_VERSION").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(22809))
}

/// Checks and takes a collective or send/recv call.
#[allow(clippy::too_many_arguments, reason = "the C API's arguments, forwarded")]
fn operation(
    kind: Kind,
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: c_int,
    redop: c_int,
    root: c_int,
    comm: NcclComm,
    stream: CUstream,
) -> Result<c_int, Error> {
    let r = (|| {
        let name = kind.name();
        if version() < kind.since() {
            return Err(Error::usage(format!(
                "invalid usage: {name} is not in NCCL {} (added in {}): a real library would not have the symbol",
                version_text(version()),
                version_text(kind.since())
            )));
        }
        let comm = comm::get(comm)?;
        let _in = comm.enter(name)?;
        let l = comm.ready(name)?;
        let call = comm.next_call();
        let what = if kind.p2p() { "peer" } else { "root" };
        let root = usize::try_from(root).ok().filter(|&r| r < l.nranks).ok_or_else(|| {
            Error::argument(format!(
                "invalid argument: {} call {call}: {name} with {what} {root} of {} ranks",
                comm.who(),
                l.nranks
            ))
        })?;
        let (send, recv) = (send as usize, recv as usize);
        let mut op = Op { kind, send, recv, count, dtype, redop, root, call, fault: None, seq: 0, group: 0 };
        checks::arguments(&comm, l, &op)?;
        let s = crate::api::stream(stream).map_err(|f| {
            Error::argument(format!(
                "invalid argument: {} call {call}: {name}: stream {:#x}: {}",
                comm.who(),
                stream as usize,
                f.message
            ))
        })?;
        op.fault = faults::next_call(comm.lineage_rank);
        if trace() {
            eprintln!(
                "ncclsim: {name}: {} call {call}: {} × {}, {what} {root}, stream {}, send {send:#x}, recv {recv:#x}",
                comm.who(),
                count,
                reduce::dtype_name(dtype),
                s.id
            );
        }
        group::add(&comm, s, op)
    })();
    if let Err(e) = &r {
        group::fail(e);
    }
    r
}

/// Defines exported functions returning `ncclResult_t`: `fn name(args) { body }`, the body
/// returning `Result<c_int, Error>`.
macro_rules! nccl {
    ($(
        $(#[doc = $doc:literal])*
        fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// NCCL's contract for this function: pointer arguments are null or valid for what it
        /// reads and writes, buffers are device (or pinned) memory that stays allocated until
        /// the operation has run on its stream. Handles ncclsim did not give out are rejected.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> c_int {
            call(stringify!($name), move || $body)
        }
    )*};
}

nccl! {
    /// NCCL's version as `major * 10000 + minor * 100 + patch`: 22809 (2.28.9), or
    /// `NCCLSIM_VERSION`.
    fn ncclGetVersion(v: *mut c_int) {
        // SAFETY: the caller's out-pointer.
        unsafe { out(v, version()) }
    }

    /// A fresh unique id (random, with ncclsim's magic prefix so init can reject others).
    fn ncclGetUniqueId(id: *mut NcclUniqueId) {
        let mut internal = [0 as c_char; 128];
        let bytes = ID_MAGIC.iter().copied().chain(random_id().to_le_bytes());
        for (c, b) in internal.iter_mut().zip(bytes) {
            *c = c_char::from_ne_bytes([b]);
        }
        // SAFETY: the caller's out-pointer.
        unsafe { out(id, NcclUniqueId { internal }) }
    }

    /// Rank `rank` of `nranks` of the communicator `id`, blocking.
    fn ncclCommInitRank(comm: *mut NcclComm, nranks: c_int, id: NcclUniqueId, rank: c_int) {
        let id = id_of(&id)?;
        // SAFETY: the caller's out-pointer.
        unsafe { comm::init(comm, nranks, id, rank, None) }
    }

    /// As `ncclCommInitRank`, non-blocking when the config's `blocking` is 0.
    fn ncclCommInitRankConfig(comm: *mut NcclComm, nranks: c_int, id: NcclUniqueId, rank: c_int, config: *mut c_void) {
        let id = id_of(&id)?;
        // SAFETY: the caller's config (null or a whole `ncclConfig_t`).
        let blocking = unsafe { config_blocking(config) }?;
        // SAFETY: the caller's out-pointer.
        unsafe { comm::init(comm, nranks, id, rank, blocking) }
    }

    /// A collective over `comm`: ranks with the same `color` form a new communicator, ordered
    /// by `(key, rank in comm)`; `NCCL_SPLIT_NOCOLOR` (-1) gives `*newcomm = NULL`. Blocking as
    /// `config` says, else as `comm`.
    fn ncclCommSplit(comm: NcclComm, color: c_int, key: c_int, newcomm: *mut NcclComm, config: *mut c_void) {
        let parent = comm::get(comm)?;
        // SAFETY: the caller's config (null or a whole `ncclConfig_t`).
        let blocking = unsafe { config_blocking(config) }?;
        // SAFETY: the caller's out-pointer.
        unsafe { comm::split(&parent, color, key, newcomm, blocking) }
    }

    /// Waits for the communicator's queued operations (or, non-blocking, leaves that to polls).
    fn ncclCommFinalize(comm: NcclComm) {
        comm::finalize(&comm::get(comm)?)
    }

    /// Waits for the communicator's queued operations, reports messages from peers it never
    /// received, closes its connections and frees it.
    fn ncclCommDestroy(comm: NcclComm) {
        comm::destroy(comm)
    }

    /// Ends the communicator's work (blocked work included, outputs as they are), closes its
    /// connections and frees it; callable from any thread.
    fn ncclCommAbort(comm: NcclComm) {
        comm::abort(comm)
    }

    /// The communicator's asynchronous error; for a non-blocking communicator with an
    /// operation in progress, `ncclInProgress` at least once, then the operation's result.
    fn ncclCommGetAsyncError(comm: NcclComm, state: *mut c_int) {
        let comm = comm::get(comm)?;
        let s = comm.poll();
        // SAFETY: the caller's out-pointer.
        unsafe { out(state, s) }
    }

    fn ncclCommCount(comm: NcclComm, count: *mut c_int) {
        let comm = comm::get(comm)?;
        let _in = comm.enter("ncclCommCount")?;
        let n = c_int::try_from(comm.ready("ncclCommCount")?.nranks).unwrap_or(c_int::MAX);
        // SAFETY: the caller's out-pointer.
        unsafe { out(count, n) }
    }

    fn ncclCommUserRank(comm: NcclComm, rank: *mut c_int) {
        let comm = comm::get(comm)?;
        let _in = comm.enter("ncclCommUserRank")?;
        let r = c_int::try_from(comm.ready("ncclCommUserRank")?.rank).unwrap_or(c_int::MAX);
        // SAFETY: the caller's out-pointer.
        unsafe { out(rank, r) }
    }

    /// Device 0, the simulator's only one.
    fn ncclCommCuDevice(comm: NcclComm, device: *mut c_int) {
        let comm = comm::get(comm)?;
        let _in = comm.enter("ncclCommCuDevice")?;
        comm.ready("ncclCommCuDevice")?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(device, 0) }
    }

    /// Opens a group on the calling thread (groups nest).
    fn ncclGroupStart() {
        group::start();
        Ok(SUCCESS)
    }

    /// Closes a group; the outermost queues each communicator's operations as one unit.
    fn ncclGroupEnd() {
        group::end()
    }

    fn ncclAllReduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::AllReduce, send, recv, count, dtype, op, 0, comm, stream)
    }

    fn ncclBroadcast(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, root: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::Broadcast, send, recv, count, dtype, -1, root, comm, stream)
    }

    fn ncclReduce(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, op: c_int, root: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::Reduce, send, recv, count, dtype, op, root, comm, stream)
    }

    fn ncclAllGather(send: *const c_void, recv: *mut c_void, sendcount: usize, dtype: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::AllGather, send, recv, sendcount, dtype, -1, 0, comm, stream)
    }

    fn ncclReduceScatter(send: *const c_void, recv: *mut c_void, recvcount: usize, dtype: c_int, op: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::ReduceScatter, send, recv, recvcount, dtype, op, 0, comm, stream)
    }

    /// NCCL 2.28 and later: block `j` of `send` to rank `j`, block `i` of `recv` from rank `i`
    /// (`count` elements each); out of place only.
    fn ncclAlltoAll(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::AlltoAll, send, recv, count, dtype, -1, 0, comm, stream)
    }

    /// NCCL 2.28 and later: every rank's `count` elements to block `i` of the root's `recv`
    /// (in place: `send == recv + root * count`).
    fn ncclGather(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, root: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::Gather, send, recv, count, dtype, -1, root, comm, stream)
    }

    /// NCCL 2.28 and later: block `i` of the root's `send` to rank `i`'s `recv` (in place:
    /// `recv == send + root * count`).
    fn ncclScatter(send: *const c_void, recv: *mut c_void, count: usize, dtype: c_int, root: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::Scatter, send, recv, count, dtype, -1, root, comm, stream)
    }

    fn ncclSend(send: *const c_void, count: usize, dtype: c_int, peer: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::Send, send, std::ptr::null_mut(), count, dtype, -1, peer, comm, stream)
    }

    fn ncclRecv(recv: *mut c_void, count: usize, dtype: c_int, peer: c_int, comm: NcclComm, stream: CUstream) {
        operation(Kind::Recv, std::ptr::null(), recv, count, dtype, -1, peer, comm, stream)
    }
}

/// NCCL's description of a status (unknown ones too).
///
/// # Safety
/// None: any value is accepted; the string is static.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetErrorString(result: c_int) -> *const c_char {
    let s: &'static CStr = match result {
        SUCCESS => c"no error",
        UNHANDLED_CUDA => c"unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        SYSTEM => c"unhandled system error (run with NCCL_DEBUG=INFO for details)",
        INTERNAL => c"internal error - please report this issue to the NCCL developers",
        INVALID_ARGUMENT => c"invalid argument (run with NCCL_DEBUG=WARN for details)",
        INVALID_USAGE => c"invalid usage (run with NCCL_DEBUG=WARN for details)",
        REMOTE => c"remote process exited or there was a network error",
        IN_PROGRESS => c"NCCL operation in progress",
        _ => c"unknown result code",
    };
    s.as_ptr()
}

/// The last message ncclsim reported in this process (any communicator), "" before the first;
/// the string stays valid for the process's life.
///
/// # Safety
/// None: the communicator is not used.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn ncclGetLastError(_comm: NcclComm) -> *const c_char {
    lock(&MESSAGES).last().map_or(c"".as_ptr(), |m| m.as_ptr())
}
