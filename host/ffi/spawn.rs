//! Dynamic processes (MPI 10.3): `MPI_Comm_spawn`, `MPI_Comm_get_parent` and
//! `MPI_Intercomm_merge`, the calls an elastic job grows by ([`crate::elastic`]). Every
//! communicator made here returns its errors (`MPI_ERRORS_RETURN`), and the caller owns it.

use std::ffi::{CString, c_char, c_int};

use super::{RawComm, check, comm, sys};
use crate::api::error::{Error, Result};

/// The communicator to the job that spawned this process (`MPI_Comm_get_parent`), if one did.
/// MPI owns it: free it with [`comm::free`] only once merged and done with.
pub(crate) fn parent() -> Result<Option<RawComm>> {
    let mut out = std::mem::MaybeUninit::<sys::MPI_Comm>::uninit();
    // SAFETY: MPI is initialized (a communicator exists); MPI writes one handle, read only
    // on success.
    let out = unsafe {
        check(sys::MPI_Comm_get_parent(out.as_mut_ptr()), "MPI_Comm_get_parent")?;
        out.assume_init()
    };
    // SAFETY: reading an immutable handle constant exported by the rsmpi shim.
    if out == unsafe { sys::RSMPI_COMM_NULL } {
        return Ok(None);
    }
    comm::errors_return(RawComm(out)).map(Some)
}

/// Starts `count` processes of `program` with `args` (`MPI_Comm_spawn`, collective over
/// `parents`, `root`'s arguments counting) and returns the intercommunicator to them.
/// [`Error::Mpi`] when MPI refuses, or when any of the processes could not start (the
/// intercommunicator, if made, is freed then).
pub(crate) fn spawn(parents: RawComm, program: &str, args: &[String], count: usize, root: usize) -> Result<RawComm> {
    let invalid = |_| Error::InvalidConfig("the program to spawn or one of its arguments holds a NUL byte");
    let program = CString::new(program).map_err(invalid)?;
    let args = args.iter().map(|a| CString::new(a.as_str())).collect::<Result<Vec<_>, _>>().map_err(invalid)?;
    // MPI's `char *argv[]`, NULL-terminated; MPI does not write through it.
    let mut argv: Vec<*mut c_char> =
        args.iter().map(|a| a.as_ptr().cast_mut()).chain(std::iter::once(std::ptr::null_mut())).collect();
    let n = c_int::try_from(count).map_err(|_| Error::InvalidConfig("too many processes to spawn"))?;
    let mut codes: Vec<c_int> = vec![super::SUCCESS; count];
    let mut out = std::mem::MaybeUninit::<sys::MPI_Comm>::uninit();
    // SAFETY: `program` and every argument are NUL-terminated strings alive across the call,
    // `argv` ends with NULL; `codes` holds one int per process; `parents` is live; MPI writes
    // the handle, read only on success.
    let inter = unsafe {
        check(
            sys::MPI_Comm_spawn(
                program.as_ptr(),
                argv.as_mut_ptr(),
                n,
                sys::RSMPI_INFO_NULL,
                super::c_rank(root),
                parents.0,
                out.as_mut_ptr(),
                codes.as_mut_ptr(),
            ),
            "MPI_Comm_spawn",
        )?;
        RawComm(out.assume_init())
    };
    if let Some(&code) = codes.iter().find(|&&c| c != super::SUCCESS) {
        // SAFETY: made just above, used by nobody.
        unsafe { comm::free(inter) };
        return Err(super::mpi_error(code, "MPI_Comm_spawn (a process did not start)"));
    }
    comm::errors_return(inter)
}

/// One intracommunicator over both sides of `inter` (`MPI_Intercomm_merge`), the side that
/// passes `high` numbered after the other. Collective over both sides.
pub(crate) fn merge(inter: RawComm, high: bool) -> Result<RawComm> {
    let mut out = std::mem::MaybeUninit::<sys::MPI_Comm>::uninit();
    // SAFETY: `inter` is a live intercommunicator; MPI writes the handle, read only on
    // success.
    let merged = unsafe {
        check(sys::MPI_Intercomm_merge(inter.0, c_int::from(high), out.as_mut_ptr()), "MPI_Intercomm_merge")?;
        RawComm(out.assume_init())
    };
    comm::errors_return(merged)
}
