//! ULFM, MPI's fault-tolerance extension (`MPIX_Comm_revoke`, `_agree`, `_shrink`,
//! `_failure_ack`), looked up at run time: a binary built against an MPI without it (Debian's
//! Open MPI 4.1) uses it when it runs on one that has it (Open MPI 5 with
//! `mpirun --with-ft ulfm`). Its error classes are not in every `mpi.h`, so they come from the
//! library's own description: Open MPI 5 and MPICH number them differently. Both export the
//! functions whether or not their fault tolerance is on (Open MPI's then interrupt nothing,
//! MPICH's abort the job), so they count only when it is: `OMPI_MCA_mpi_ft_enable`, which
//! `mpirun --with-ft ulfm` sets, or `MPIR_CVAR_ENABLE_FT=1`.

use std::ffi::{CStr, c_int};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use super::{RawComm, check, sys};
use crate::api::error::{Error, Result};

type CommFn = unsafe extern "C" fn(sys::MPI_Comm) -> c_int;
type ShrinkFn = unsafe extern "C" fn(sys::MPI_Comm, *mut sys::MPI_Comm) -> c_int;
type AgreeFn = unsafe extern "C" fn(sys::MPI_Comm, *mut c_int) -> c_int;
type AckedFn = unsafe extern "C" fn(sys::MPI_Comm, *mut sys::MPI_Group) -> c_int;

/// The ULFM functions of the running MPI library.
#[derive(Debug)]
pub(crate) struct Api {
    revoke: CommFn,
    shrink: ShrinkFn,
    agree: AgreeFn,
    failure_ack: CommFn,
    failure_get_acked: AckedFn,
    /// `(MPIX_ERR_PROC_FAILED, MPIX_ERR_PROC_FAILED_PENDING, MPIX_ERR_REVOKED)`, when the library
    /// is one whose numbering is known.
    classes: Option<(c_int, c_int, c_int)>,
}

static API: OnceLock<Option<Api>> = OnceLock::new();

/// Whether this process saw a process failure: MPI reported one, or the program revoked or
/// shrank a communicator (a rank whose own calls all succeeded learns of a failure only from
/// the others).
static FAILURE_SEEN: AtomicBool = AtomicBool::new(false);

/// Whether this process saw a process failure (see [`FAILURE_SEEN`]; `MPI_Finalize` may then
/// never return, see [`crate::reliability::watchdog`]).
pub(crate) fn failure_seen() -> bool {
    FAILURE_SEEN.load(Ordering::Relaxed)
}

/// [`require`] for a call that recovers from a failure.
fn recovering() -> Result<&'static Api> {
    let api = require()?;
    FAILURE_SEEN.store(true, Ordering::Relaxed);
    Ok(api)
}

/// `name` in the running process, as a function of type `F`.
///
/// # Safety
/// `F` must be the function's real type.
unsafe fn lookup<F: Copy>(name: &CStr) -> Option<F> {
    // SAFETY: dlsym with RTLD_DEFAULT searches the loaded objects; `name` is NUL-terminated.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    // SAFETY: guaranteed by the caller; a non-null symbol of a function is its address.
    (!p.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut libc::c_void, F>(&p) })
}

/// Whether an MPICH library was started with its fault tolerance on (`MPIR_CVAR_ENABLE_FT`,
/// or its older names). MPICH exports the `MPIX_Comm_*` functions either way, but without it
/// they abort the job (MPICH 5.0.2's `MPIX_Comm_failure_ack`: an assertion in ch4_comm.c).
fn mpich_fault_tolerant() -> bool {
    ["MPIR_CVAR_ENABLE_FT", "MPIR_PARAM_ENABLE_FT", "MPICH_ENABLE_FT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|v| matches!(v.as_str(), "1" | "yes" | "true")))
}

/// Whether an Open MPI 5 job was started with its fault tolerance on (`mpirun --with-ft
/// ulfm` sets `OMPI_MCA_mpi_ft_enable=1` in every process). Open MPI exports the `MPIX_Comm_*`
/// functions either way, but without it a revoke interrupts nothing: a rank blocked in a
/// collective stays there (seen by the fault trials under Open MPI 5.0.11).
fn open_mpi_fault_tolerant() -> bool {
    std::env::var("OMPI_MCA_mpi_ft_enable")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "enabled"))
}

/// The ULFM functions, if the MPI library has them and its fault tolerance is on.
pub(crate) fn api() -> Option<&'static Api> {
    API.get_or_init(|| {
        // SAFETY: the types are ULFM's prototypes (`mpiext_ftmpi_c.h`).
        unsafe {
            let version = super::library_version();
            let classes = if version.contains("Open MPI") {
                if !open_mpi_fault_tolerant() {
                    return None;
                }
                Some((75, 76, 77))
            } else if version.contains("MPICH") {
                if !mpich_fault_tolerant() {
                    return None;
                }
                Some((101, 102, 103))
            } else {
                None
            };
            Some(Api {
                revoke: lookup(c"MPIX_Comm_revoke")?,
                shrink: lookup(c"MPIX_Comm_shrink")?,
                agree: lookup(c"MPIX_Comm_agree")?,
                failure_ack: lookup(c"MPIX_Comm_failure_ack")?,
                failure_get_acked: lookup(c"MPIX_Comm_failure_get_acked")?,
                classes,
            })
        }
    })
    .as_ref()
}

/// Whether the MPI library has ULFM.
pub(crate) fn available() -> bool {
    api().is_some()
}

const MISSING: &str = "the MPI library has no ULFM (MPIX_Comm_revoke/agree/shrink): use Open MPI 5 with `mpirun --with-ft \
                       ulfm`, or an MPICH built with fault tolerance";

fn require() -> Result<&'static Api> {
    api().ok_or(Error::Unsupported(MISSING))
}

/// What a ULFM error class means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Failure {
    ProcessFailed,
    Revoked,
}

/// The ULFM meaning of an MPI error class, if it has one.
pub(crate) fn classify(class: c_int) -> Option<Failure> {
    let (failed, pending, revoked) = api()?.classes?;
    match class {
        c if c == failed || c == pending => {
            FAILURE_SEEN.store(true, Ordering::Relaxed);
            Some(Failure::ProcessFailed)
        }
        c if c == revoked => Some(Failure::Revoked),
        _ => None,
    }
}

/// `MPIX_Comm_revoke`: every pending and later operation on `comm`, on every rank, fails with
/// `MPIX_ERR_REVOKED` (agree and shrink excepted).
pub(crate) fn revoke(comm: RawComm) -> Result<()> {
    let api = recovering()?;
    // SAFETY: `comm` is a live communicator; revoking is allowed from any thread.
    check(unsafe { (api.revoke)(comm.0) }, "MPIX_Comm_revoke")
}

/// `MPIX_Comm_shrink`: a new communicator over the processes of `comm` still alive, with the
/// same error handler as its parent (errors return).
pub(crate) fn shrink(comm: RawComm) -> Result<RawComm> {
    let api = recovering()?;
    let mut out = std::mem::MaybeUninit::<sys::MPI_Comm>::uninit();
    // SAFETY: `comm` is live; MPI writes the new handle on success, read only then.
    let out = unsafe {
        check((api.shrink)(comm.0, out.as_mut_ptr()), "MPIX_Comm_shrink")?;
        out.assume_init()
    };
    Ok(RawComm(out))
}

/// `MPIX_Comm_agree` on `flag` over the live processes: their logical AND, and whether a
/// process failure was seen (new failures are acknowledged first, so one failure is reported
/// once).
pub(crate) fn agree(comm: RawComm, flag: bool) -> Result<(bool, bool)> {
    let (value, failed) = agree_bits(comm, u32::from(flag))?;
    Ok((value != 0, failed))
}

/// `MPIX_Comm_agree` on the bits of `bits` over the live processes: their bitwise AND (every
/// surviving rank gets the same), and whether a process failure was seen (as [`agree`]).
pub(crate) fn agree_bits(comm: RawComm, bits: u32) -> Result<(u32, bool)> {
    let api = require()?;
    let mut value = c_int::from_ne_bytes(bits.to_ne_bytes());
    // SAFETY: `comm` is live (revoked is allowed); MPI writes one int.
    let rc = unsafe {
        (api.failure_ack)(comm.0);
        (api.agree)(comm.0, &mut value)
    };
    let value = u32::from_ne_bytes(value.to_ne_bytes());
    if rc == super::SUCCESS {
        if value != bits || value == 0 {
            // Some rank cleared a bit (or none was set): it may have seen a failure.
            FAILURE_SEEN.store(true, Ordering::Relaxed);
        }
        return Ok((value, false));
    }
    match super::mpi_error(rc, "MPIX_Comm_agree") {
        Error::ProcessFailed { .. } => Ok((value & bits, true)),
        e => Err(e),
    }
}

/// The ranks of `comm` known to have failed (acknowledging them).
pub(crate) fn failed_ranks(comm: RawComm) -> Result<Vec<usize>> {
    let api = require()?;
    let (mut failed, mut all) = (std::mem::MaybeUninit::uninit(), std::mem::MaybeUninit::uninit());
    // SAFETY: `comm` is live; each call writes the handles and ints we own, read only on
    // success; both groups are freed before returning.
    unsafe {
        check((api.failure_ack)(comm.0), "MPIX_Comm_failure_ack")?;
        check((api.failure_get_acked)(comm.0, failed.as_mut_ptr()), "MPIX_Comm_failure_get_acked")?;
        let mut failed = failed.assume_init();
        let mut n: c_int = 0;
        let translated = check(sys::MPI_Group_size(failed, &mut n), "MPI_Group_size").and_then(|()| {
            check(sys::MPI_Comm_group(comm.0, all.as_mut_ptr()), "MPI_Comm_group")?;
            let mut all = all.assume_init();
            let from: Vec<c_int> = (0..n).collect();
            let mut to = vec![0 as c_int; from.len()];
            let r = check(
                sys::MPI_Group_translate_ranks(failed, n, from.as_ptr(), all, to.as_mut_ptr()),
                "MPI_Group_translate_ranks",
            );
            sys::MPI_Group_free(&mut all);
            // A rank with no counterpart is MPI_UNDEFINED (negative): left out.
            r.map(|()| to.into_iter().filter_map(|r| usize::try_from(r).ok()).collect())
        });
        sys::MPI_Group_free(&mut failed);
        translated
    }
}
