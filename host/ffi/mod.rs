//! The MPI foreign-function layer.
//!
//! Three layers, as in cudarc: [`sys`] is rsmpi's raw bindings; this module turns status codes
//! into [`Error`]s and wraps MPI handles in `Copy` newtypes that may cross threads (the library
//! always runs MPI at `MPI_THREAD_MULTIPLE`, see [`crate::init`]); the safe types
//! ([`crate::MpiCommunicator`] and friends) are built on top. All `unsafe` that talks to MPI lives
//! here, in [`native`] and in [`win`]; [`os`] holds the one operating-system call of the progress
//! machinery.

pub(crate) mod native;
#[cfg(any(feature = "cuda", feature = "hip"))]
pub(crate) mod nccl;
pub(crate) mod os;
pub(crate) mod spawn;
pub(crate) mod ulfm;
pub(crate) mod win;

use std::ffi::{c_int, c_void};

pub(crate) use mpi::ffi as sys;

use crate::api::error::{Error, Result};

unsafe extern "C" {
    fn duralumin_mpi_in_place() -> *mut c_void;
    fn duralumin_set_world_errhandler() -> c_int;
    fn duralumin_completing_requests(on: c_int);
}

/// Gives `MPI_COMM_WORLD` the shim's error handler: fatal, as MPI's default, except while a
/// thread completes Duralumin's requests, where the error is returned (Open MPI 4.1 raises a
/// failed non-blocking collective's error there, not on the request's communicator).
pub(crate) fn set_world_errhandler() -> Result<()> {
    // SAFETY: MPI is initialized (called from `init` after MPI_Init); the shim creates a
    // handler and sets it on MPI_COMM_WORLD.
    check(unsafe { duralumin_set_world_errhandler() }, "MPI_Comm_set_errhandler")
}

/// Runs `f` (which completes Duralumin's requests) with MPI_COMM_WORLD's handler returning
/// errors on this thread (see [`set_world_errhandler`]).
fn completing<R>(f: impl FnOnce() -> R) -> R {
    // SAFETY: sets a thread-local flag of the shim.
    unsafe { duralumin_completing_requests(1) };
    let r = f();
    // SAFETY: as above.
    unsafe { duralumin_completing_requests(0) };
    r
}

/// `MPI_IN_PLACE`, whose value is implementation-defined (a C macro, read through the shim).
pub(crate) fn in_place() -> *mut c_void {
    // SAFETY: the shim function takes no arguments and returns a constant.
    unsafe { duralumin_mpi_in_place() }
}

/// `MPI_SUCCESS` as the `int` MPI calls return (the bindings give the macro as a `u32`).
#[allow(clippy::cast_possible_wrap, reason = "MPI_SUCCESS is 0 in every MPI library")]
pub(crate) const SUCCESS: c_int = sys::MPI_SUCCESS as c_int;

/// A rank or communicator size as MPI's `int`. Both come from MPI as `int`s (a rank a user passes
/// is checked below the size first), so this never saturates; were it to, MPI would refuse the
/// rank rather than reach another one.
pub(crate) fn c_rank(rank: usize) -> c_int {
    c_int::try_from(rank).unwrap_or(c_int::MAX)
}

/// A rank or communicator size as a `u32` (the rank count of [`ReduceOp::finish`], a snapshot's
/// rank). Both come from MPI as non-negative `int`s, so this never saturates.
///
/// [`ReduceOp::finish`]: duralumin_kernels::ReduceOp::finish
pub(crate) fn u32_rank(rank: usize) -> u32 {
    u32::try_from(rank).unwrap_or(u32::MAX)
}

/// Turns an MPI return code into a `Result`, with MPI's own error string.
pub(crate) fn check(code: c_int, call: &'static str) -> Result<()> {
    if code == SUCCESS {
        return Ok(());
    }
    Err(mpi_error(code, call))
}

pub(crate) fn mpi_error(code: c_int, call: &'static str) -> Error {
    let mut class: c_int = 0;
    let mut buf = vec![0u8; sys::MPI_MAX_ERROR_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: both calls write at most MPI_MAX_ERROR_STRING bytes / one int into buffers we
    // own; they are valid to call whenever MPI is initialized, and an error code only reaches
    // us from an MPI call made while it was.
    unsafe {
        sys::MPI_Error_class(code, &mut class);
        sys::MPI_Error_string(code, buf.as_mut_ptr().cast(), &mut len);
    }
    buf.truncate(usize::try_from(len).unwrap_or(0));
    match ulfm::classify(class) {
        // The failed ranks are filled in by the caller, who knows the communicator.
        Some(ulfm::Failure::ProcessFailed) => Error::ProcessFailed { ranks: Vec::new() },
        Some(ulfm::Failure::Revoked) => Error::Revoked,
        None => Error::Mpi { call, code, class, message: String::from_utf8_lossy(&buf).into_owned() },
    }
}

/// An MPI communicator handle that may be used from any thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawComm(pub(crate) sys::MPI_Comm);
// SAFETY: MPI handles are opaque references into the MPI library, which Duralumin initializes
// with MPI_THREAD_MULTIPLE, so any thread may use them; data races on the handle itself cannot
// happen because it is never mutated after creation.
unsafe impl Send for RawComm {}
// SAFETY: see the `Send` impl.
unsafe impl Sync for RawComm {}

/// An MPI datatype handle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawDatatype(pub(crate) sys::MPI_Datatype);
// SAFETY: as for `RawComm`; committed datatypes are immutable.
unsafe impl Send for RawDatatype {}
// SAFETY: see the `Send` impl.
unsafe impl Sync for RawDatatype {}

/// An MPI reduction-operation handle.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawOp(pub(crate) sys::MPI_Op);
// SAFETY: as for `RawComm`; operation handles are immutable.
unsafe impl Send for RawOp {}
// SAFETY: see the `Send` impl.
unsafe impl Sync for RawOp {}

/// An MPI request handle owned by exactly one in-flight operation.
#[derive(Debug)]
pub(crate) struct RawRequest(pub(crate) sys::MPI_Request);
// SAFETY: a request is moved between threads but only ever used by its single owner (the
// task that holds it), and MPI_THREAD_MULTIPLE allows completing it on any thread.
unsafe impl Send for RawRequest {}

impl RawRequest {
    pub(crate) fn null() -> Self {
        // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
        RawRequest(unsafe { sys::RSMPI_REQUEST_NULL })
    }
}

pub(crate) fn is_finalized() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Finalized may be called at any time, even before MPI_Init or after
    // MPI_Finalize; it writes one int.
    unsafe { sys::MPI_Finalized(&mut flag) };
    flag != 0
}

/// `MPI_COMM_WORLD`.
pub(crate) fn world() -> RawComm {
    // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
    RawComm(unsafe { sys::RSMPI_COMM_WORLD })
}

/// `MPI_Abort(MPI_COMM_WORLD, code)`: ends every process of the job. Returns only if MPI is
/// not running (not initialized, or finalized) or the library failed to abort.
pub(crate) fn abort(code: c_int) {
    if !is_initialized() || is_finalized() {
        return;
    }
    // SAFETY: MPI is initialized; MPI_Abort may be called from any thread at any time.
    unsafe { sys::MPI_Abort(world().0, code) };
}

/// The MPI library's own description of itself (`MPI_Get_library_version`).
pub(crate) fn library_version() -> String {
    let mut buf = vec![0u8; sys::MPI_MAX_LIBRARY_VERSION_STRING as usize + 1];
    let mut len: c_int = 0;
    // SAFETY: MPI writes at most MPI_MAX_LIBRARY_VERSION_STRING bytes and one int; the call
    // is valid before MPI_Init and after MPI_Finalize.
    unsafe { sys::MPI_Get_library_version(buf.as_mut_ptr().cast(), &mut len) };
    buf.truncate(usize::try_from(len).unwrap_or(0));
    String::from_utf8_lossy(&buf).trim_end_matches('\0').trim().to_string()
}

/// Runs `f` at the start of `MPI_Finalize`, while MPI still works (the MPI standard calls the
/// delete callbacks of `MPI_COMM_SELF`'s attributes first thing in `MPI_Finalize`). Threads that
/// call MPI on their own stop there, so none calls MPI after it is finalized.
pub(crate) fn on_finalize(f: fn()) -> Result<()> {
    unsafe extern "C" fn no_copy(
        _: sys::MPI_Comm,
        _: c_int,
        _: *mut c_void,
        _: *mut c_void,
        _: *mut c_void,
        flag: *mut c_int,
    ) -> c_int {
        // SAFETY: MPI passes a valid flag to write.
        unsafe { *flag = 0 };
        SUCCESS
    }
    unsafe extern "C" fn run(_: sys::MPI_Comm, _: c_int, _: *mut c_void, extra: *mut c_void) -> c_int {
        // SAFETY: `extra` is the `fn()` registered below, cast to a pointer.
        let f: fn() = unsafe { std::mem::transmute::<*mut c_void, fn()>(extra) };
        // A panic must not unwind into MPI.
        let _ = std::panic::catch_unwind(f);
        SUCCESS
    }
    let mut key: c_int = 0;
    // SAFETY: both callbacks have the signatures MPI declares; `extra` carries a plain function
    // pointer, valid for the whole program. MPI_COMM_SELF is live until MPI_Finalize, whose first
    // step deletes the attribute and calls `run`.
    unsafe {
        check(
            sys::MPI_Comm_create_keyval(Some(no_copy), Some(run), &mut key, f as *mut c_void),
            "MPI_Comm_create_keyval",
        )?;
        check(sys::MPI_Comm_set_attr(sys::RSMPI_COMM_SELF, key, std::ptr::null_mut()), "MPI_Comm_set_attr")
    }
}

pub(crate) fn is_initialized() -> bool {
    let mut flag: c_int = 0;
    // SAFETY: MPI_Initialized may be called at any time; it writes one int.
    unsafe { sys::MPI_Initialized(&mut flag) };
    flag != 0
}

/// Thin wrappers over communicator management calls.
pub(crate) mod comm {
    use super::*;

    /// `MPI_Comm_rank` and `MPI_Comm_size`.
    pub(crate) fn rank_size(comm: RawComm) -> Result<(usize, usize)> {
        let (mut rank, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: `comm` is a live communicator (RawComm values are only made from live ones
        // and freed when their owner drops); each call writes one int.
        unsafe {
            check(sys::MPI_Comm_rank(comm.0, &mut rank), "MPI_Comm_rank")?;
            check(sys::MPI_Comm_size(comm.0, &mut size), "MPI_Comm_size")?;
        }
        #[allow(clippy::cast_sign_loss, reason = "MPI gives a size of at least 1 and a rank in 0..size")]
        Ok((rank as usize, size as usize))
    }

    /// `MPI_Comm_dup`, with the new communicator set to return errors instead of aborting.
    pub(crate) fn dup(comm: RawComm) -> Result<RawComm> {
        let mut out = std::mem::MaybeUninit::<sys::MPI_Comm>::uninit();
        // SAFETY: `comm` is live; MPI writes the new handle into `out` on success, and we read
        // it only then.
        let out = unsafe {
            check(sys::MPI_Comm_dup(comm.0, out.as_mut_ptr()), "MPI_Comm_dup")?;
            out.assume_init()
        };
        errors_return(RawComm(out))
    }

    /// `MPI_Comm_split`; `None` when this rank passed `MPI_UNDEFINED`.
    pub(crate) fn split(comm: RawComm, color: c_int, key: c_int) -> Result<Option<RawComm>> {
        let mut out = std::mem::MaybeUninit::<sys::MPI_Comm>::uninit();
        // SAFETY: as for `dup`.
        let out = unsafe {
            check(sys::MPI_Comm_split(comm.0, color, key, out.as_mut_ptr()), "MPI_Comm_split")?;
            out.assume_init()
        };
        if is_null(out) { Ok(None) } else { errors_return(RawComm(out)).map(Some) }
    }

    /// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`: the ranks sharing this node's memory.
    pub(crate) fn split_shared(comm: RawComm, key: c_int) -> Result<RawComm> {
        let mut out = std::mem::MaybeUninit::<sys::MPI_Comm>::uninit();
        // SAFETY: as for `dup`; the split type and info handle are constants of the shim.
        let out = unsafe {
            check(
                sys::MPI_Comm_split_type(
                    comm.0,
                    sys::RSMPI_COMM_TYPE_SHARED,
                    key,
                    sys::RSMPI_INFO_NULL,
                    out.as_mut_ptr(),
                ),
                "MPI_Comm_split_type",
            )?;
            out.assume_init()
        };
        errors_return(RawComm(out))
    }

    fn is_null(comm: sys::MPI_Comm) -> bool {
        // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
        comm == unsafe { sys::RSMPI_COMM_NULL }
    }

    /// Makes `comm`'s errors return to the caller (`MPI_ERRORS_RETURN`).
    pub(crate) fn errors_return(comm: RawComm) -> Result<RawComm> {
        // SAFETY: `comm` was just created and is live; the handler is a shim constant.
        check(unsafe { sys::MPI_Comm_set_errhandler(comm.0, sys::RSMPI_ERRORS_RETURN) }, "MPI_Comm_set_errhandler")?;
        Ok(comm)
    }

    /// The largest tag value the MPI library allows on `comm` (`MPI_TAG_UB`).
    pub(crate) fn tag_ub(comm: RawComm) -> Result<c_int> {
        #[allow(clippy::cast_possible_wrap, reason = "MPI_TAG_UB is a small attribute key")]
        const TAG_UB: c_int = sys::MPI_TAG_UB as c_int;
        let mut value: *mut c_int = std::ptr::null_mut();
        let mut flag: c_int = 0;
        // SAFETY: for MPI_TAG_UB, MPI stores a pointer to an int it owns into `value`, valid
        // for the life of the communicator; we read it only when `flag` says it was set.
        unsafe {
            check(
                sys::MPI_Comm_get_attr(comm.0, TAG_UB, (&mut value as *mut *mut c_int).cast(), &mut flag),
                "MPI_Comm_get_attr",
            )?;
            Ok(if flag != 0 && !value.is_null() { *value } else { 32767 })
        }
    }

    /// `MPI_Comm_free`, skipped once MPI has been finalized (nothing left to free).
    ///
    /// # Safety
    /// `comm` must be a communicator this crate created, not used by anyone afterwards.
    pub(crate) unsafe fn free(comm: RawComm) {
        if is_finalized() {
            return;
        }
        let mut handle = comm.0;
        // SAFETY: the caller guarantees exclusive ownership; errors at teardown have no one
        // to be reported to, so they are deliberately ignored.
        unsafe { sys::MPI_Comm_free(&mut handle) };
    }
}

/// Point-to-point and request calls.
pub(crate) mod p2p {
    use super::*;

    /// `MPI_Isend`.
    ///
    /// # Safety
    /// `buf` must point to `count` elements of `dt` that stay valid and unmodified until the
    /// returned request completes.
    pub(crate) unsafe fn isend(
        buf: *const c_void,
        count: c_int,
        dt: RawDatatype,
        peer: c_int,
        tag: c_int,
        comm: RawComm,
    ) -> Result<RawRequest> {
        let mut req = RawRequest::null();
        // SAFETY: guaranteed by the caller; `req` is ours to write.
        check(unsafe { sys::MPI_Isend(buf, count, dt.0, peer, tag, comm.0, &mut req.0) }, "MPI_Isend")?;
        Ok(req)
    }

    /// `MPI_Irecv`.
    ///
    /// # Safety
    /// `buf` must point to room for `count` elements of `dt`, valid and not otherwise accessed
    /// until the returned request completes, and no message longer than that may match it (MPI
    /// libraries write a truncated message past the buffer: `transport::matcher`).
    pub(crate) unsafe fn irecv(
        buf: *mut c_void,
        count: c_int,
        dt: RawDatatype,
        peer: c_int,
        tag: c_int,
        comm: RawComm,
    ) -> Result<RawRequest> {
        let mut req = RawRequest::null();
        // SAFETY: guaranteed by the caller; `req` is ours to write.
        check(unsafe { sys::MPI_Irecv(buf, count, dt.0, peer, tag, comm.0, &mut req.0) }, "MPI_Irecv")?;
        Ok(req)
    }

    /// A zeroed status, for MPI to fill.
    pub(crate) fn empty_status() -> sys::MPI_Status {
        // SAFETY: MPI_Status is a plain C struct of integers; all-zero is a valid value.
        unsafe { std::mem::zeroed() }
    }

    /// `MPI_Test` on one request. On completion the request becomes `MPI_REQUEST_NULL` and the
    /// status is returned.
    pub(crate) fn test(req: &mut RawRequest) -> Result<Option<sys::MPI_Status>> {
        let mut flag: c_int = 0;
        let mut status = empty_status();
        let code = completing(|| {
            // SAFETY: `req` is a live or null request owned by the caller; MPI writes the flag
            // and status we own. Completing a request is always allowed.
            unsafe { sys::MPI_Test(&mut req.0, &mut flag, &mut status) }
        });
        check(code, "MPI_Test")?;
        Ok((flag != 0).then_some(status))
    }

    /// `MPI_Test` on a point-to-point request of a communicator whose errors return (all of
    /// Duralumin's): as [`test`], without the handling that failed non-blocking collectives
    /// need, which costs two calls per test of a request polled in a loop.
    pub(crate) fn test_p2p(req: &mut RawRequest) -> Result<Option<sys::MPI_Status>> {
        let mut flag: c_int = 0;
        let mut status = empty_status();
        // SAFETY: as for `test`.
        check(unsafe { sys::MPI_Test(&mut req.0, &mut flag, &mut status) }, "MPI_Test")?;
        Ok((flag != 0).then_some(status))
    }

    /// Cancels and completes a request whose buffers are about to go away.
    pub(crate) fn cancel_and_wait(req: &mut RawRequest) {
        if req.0 == RawRequest::null().0 || is_finalized() {
            return;
        }
        // SAFETY: `req` is live and owned by the caller. Cancellation may fail (the operation
        // already matched), in which case the wait completes it normally; either way the
        // buffers are no longer in use when this returns. Errors are ignored: this only runs
        // on an error path whose first error is already being reported.
        unsafe {
            sys::MPI_Cancel(&mut req.0);
            let mut status = empty_status();
            sys::MPI_Wait(&mut req.0, &mut status);
        }
    }

    /// A message matched by [`improbe`] and taken off MPI's matching queue: no receive but
    /// [`imrecv`] of this handle can receive it.
    #[derive(Debug)]
    pub(crate) struct RawMessage(sys::MPI_Message);
    // SAFETY: a message handle is an opaque reference into the MPI library (initialized with
    // MPI_THREAD_MULTIPLE), owned by exactly one receive, which may run on any thread.
    unsafe impl Send for RawMessage {}

    /// `MPI_Improbe`: the first message from `source` with `tag` on `comm`, if one has arrived,
    /// matched and taken off the queue, with its status (its length, before a byte of it is
    /// received). The handle must be received with [`imrecv`].
    pub(crate) fn improbe(source: c_int, tag: c_int, comm: RawComm) -> Result<Option<(RawMessage, sys::MPI_Status)>> {
        let mut flag: c_int = 0;
        let mut status = empty_status();
        // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
        let mut msg = RawMessage(unsafe { sys::RSMPI_MESSAGE_NULL });
        // SAFETY: `comm` is live; MPI writes the flag, the handle and the status we own.
        let code = unsafe { sys::MPI_Improbe(source, tag, comm.0, &mut flag, &mut msg.0, &mut status) };
        check(code, "MPI_Improbe")?;
        Ok((flag != 0).then_some((msg, status)))
    }

    /// `MPI_Imrecv` of a message [`improbe`] returned, into `count` elements of `dt` at `buf`.
    ///
    /// # Safety
    /// `buf` must point to room for `count` elements of `dt`, valid and not otherwise accessed
    /// until the returned request completes, and `count` must not be below the message's own
    /// length: MPI libraries write a truncated message past the receive buffer (Open MPI 4.1
    /// and 5.0 do, above their eager size; see `docs/reliability.md`).
    pub(crate) unsafe fn imrecv(
        buf: *mut c_void,
        count: c_int,
        dt: RawDatatype,
        msg: RawMessage,
    ) -> Result<RawRequest> {
        let mut req = RawRequest::null();
        let mut handle = msg.0;
        // SAFETY: guaranteed by the caller; the handle came from MPI_Improbe and is received once.
        check(unsafe { sys::MPI_Imrecv(buf, count, dt.0, &mut handle, &mut req.0) }, "MPI_Imrecv")?;
        Ok(req)
    }

    /// The tag of the first message from `source` on `comm` that no receive has matched yet,
    /// whatever its tag (`MPI_Iprobe` with `MPI_ANY_TAG`), if one has arrived.
    pub(crate) fn head_tag(source: c_int, comm: RawComm) -> Result<Option<c_int>> {
        let mut flag: c_int = 0;
        let mut status = empty_status();
        // SAFETY: `comm` is live; MPI writes the flag and status we own; the tag wildcard is a
        // shim constant.
        let code = unsafe { sys::MPI_Iprobe(source, sys::RSMPI_ANY_TAG, comm.0, &mut flag, &mut status) };
        check(code, "MPI_Iprobe")?;
        Ok((flag != 0).then_some(status.MPI_TAG))
    }

    /// The length in bytes of a message that `status` describes (`MPI_Get_elements_x` of bytes).
    pub(crate) fn message_bytes(status: &sys::MPI_Status) -> Result<u64> {
        let mut count: sys::MPI_Count = 0;
        // SAFETY: `status` was filled by MPI; MPI writes one MPI_Count; the byte type is a shim
        // constant.
        check(unsafe { sys::MPI_Get_elements_x(status, sys::RSMPI_UINT8_T, &mut count) }, "MPI_Get_elements_x")?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// `MPI_Request_free` of a request that may still be active: it completes in the
    /// background, and nothing tells when.
    ///
    /// # Safety
    /// The request's buffers must stay valid (and, for a receive, untouched) for ever, or for
    /// as long as the process lives.
    pub(crate) unsafe fn request_free(req: &mut RawRequest) {
        if req.0 == RawRequest::null().0 || is_finalized() {
            return;
        }
        // SAFETY: `req` is live and owned by the caller, which gives it up here; the caller
        // guarantees its buffers outlive it.
        unsafe { sys::MPI_Request_free(&mut req.0) };
    }

    /// A message waiting on `comm` from any source with any tag (`MPI_Iprobe`): its source, tag
    /// and length in bytes.
    pub(crate) fn probe_any(comm: RawComm) -> Result<Option<(c_int, c_int, usize)>> {
        let mut flag: c_int = 0;
        let mut status = empty_status();
        // SAFETY: `comm` is live; MPI writes the flag and status we own.
        let code =
            unsafe { sys::MPI_Iprobe(sys::RSMPI_ANY_SOURCE, sys::RSMPI_ANY_TAG, comm.0, &mut flag, &mut status) };
        check(code, "MPI_Iprobe")?;
        if flag == 0 {
            return Ok(None);
        }
        // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
        let bytes = received_count(&status, RawDatatype(unsafe { sys::RSMPI_UINT8_T }))?;
        Ok(Some((status.MPI_SOURCE, status.MPI_TAG, bytes)))
    }

    /// `MPI_Recv` of a message `probe_any` found (so it does not block), as bytes. Its length
    /// is the sender's: memory for it that cannot be had is an error, not the process's end.
    pub(crate) fn recv_bytes(comm: RawComm, source: c_int, tag: c_int, bytes: usize) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        buf.try_reserve_exact(bytes).map_err(|_| Error::OutOfMemory { what: "a message received", bytes })?;
        buf.resize(bytes, 0u8);
        let count =
            c_int::try_from(bytes).map_err(|_| Error::CountOverflow { what: "message", value: bytes as u128 })?;
        let mut status = empty_status();
        // SAFETY: `buf` holds `bytes` bytes for MPI to write; `comm` is live.
        let code = unsafe {
            sys::MPI_Recv(buf.as_mut_ptr().cast(), count, sys::RSMPI_UINT8_T, source, tag, comm.0, &mut status)
        };
        check(code, "MPI_Recv")?;
        Ok(buf)
    }

    /// The length, in elements of `dt`, of a message or completed receive `status` describes;
    /// `None` if it is not a whole number of them (`MPI_UNDEFINED`).
    pub(crate) fn received_elements(status: &sys::MPI_Status, dt: RawDatatype) -> Result<Option<usize>> {
        let mut count: c_int = 0;
        // SAFETY: `status` was filled by MPI; MPI writes one int.
        check(unsafe { sys::MPI_Get_count(status, dt.0, &mut count) }, "MPI_Get_count")?;
        Ok(usize::try_from(count).ok())
    }

    /// `MPI_Get_count` of a completed receive.
    pub(crate) fn received_count(status: &sys::MPI_Status, dt: RawDatatype) -> Result<usize> {
        let mut count: c_int = 0;
        // SAFETY: `status` was filled by MPI for a receive of `dt`; MPI writes one int.
        check(unsafe { sys::MPI_Get_count(status, dt.0, &mut count) }, "MPI_Get_count")?;
        // MPI_UNDEFINED (negative: not a whole number of elements) reads as none.
        Ok(usize::try_from(count).unwrap_or(0))
    }
}
