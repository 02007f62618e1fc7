//! MPI initialization at the thread level Duralumin needs.

use std::ffi::c_int;

use mpi::Threading;

use crate::api::error::{Error, Result};
use crate::ffi::{self, check, sys};
use crate::reliability::InitOptions;

/// Initializes MPI with `MPI_THREAD_MULTIPLE` and returns the [`Universe`] (MPI is finalized
/// when it drops; drop every [`crate::MpiCommunicator`] first).
///
/// Duralumin needs `MPI_THREAD_MULTIPLE` because non-blocking operations progress on a proxy
/// thread while the program keeps calling MPI. If the MPI library provides less, this returns
/// [`Error::ThreadLevel`] naming what it provides.
///
/// A launcher that started several tasks without connecting their MPI (each task then sees
/// itself as rank 0 of 1) gets [`Error::UnwiredLaunch`], unless
/// [`InitOptions::independent_tasks`] or `DURALUMIN_INDEPENDENT_TASKS=1` allows it: otherwise
/// every task would reduce alone and report success.
///
/// It also settles what a panic does from now on: by default (`DURALUMIN_ON_PANIC` unset or
/// `abort`) a panic ends the whole job after its message, so no rank waits for a dead one (see
/// [`init_with`] and [`OnPanic`](crate::reliability::OnPanic)).
pub fn init() -> Result<Universe> {
    init_with(InitOptions::default())
}

/// [`init`] with options: what panics do ([`InitOptions::on_panic`], else
/// `DURALUMIN_ON_PANIC=abort|unwind`, else abort).
pub fn init_with(options: InitOptions) -> Result<Universe> {
    // Before MPI starts: a singleton Open MPI sets its own launch variables in this process.
    let launch = crate::api::launch::Launch::capture();
    let (universe, provided) = mpi::initialize_with_threading(Threading::Multiple)
        .ok_or(Error::Init("MPI is already initialized (use MpiCommunicator::new on your communicator)"))?;
    if provided != Threading::Multiple {
        return Err(Error::ThreadLevel { provided: level_name(provided as c_int) });
    }
    ffi::set_world_errhandler()?;
    let world_size = usize::try_from(mpi::traits::Communicator::size(&universe.world())).unwrap_or(0);
    if !options.allows_independent_tasks()
        && let Some(e) = launch.unwired(world_size)
    {
        return Err(e);
    }
    crate::reliability::abort::settle(options.requested_on_panic())?;
    Ok(Universe { inner: Some(universe) })
}

/// MPI, initialized by [`init`]: rsmpi's [`Universe`](mpi::environment::Universe) (it
/// dereferences to it: `universe.world()`), which finalizes MPI when it drops.
///
/// After a process failure, `MPI_Finalize` itself is bounded: ULFM in Open MPI 5 may wait there
/// forever for the dead process (its issue 11404), so if it has not returned after
/// [`FINALIZE_GRACE`], the process prints why and ends with status 0 (its work is done).
pub struct Universe {
    inner: Option<mpi::environment::Universe>,
}

impl std::fmt::Debug for Universe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Universe").finish_non_exhaustive()
    }
}

/// How long `MPI_Finalize` may take after a process failure.
pub const FINALIZE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

impl std::ops::Deref for Universe {
    type Target = mpi::environment::Universe;

    fn deref(&self) -> &Self::Target {
        // `inner` is only taken by `drop`.
        self.inner.as_ref().unwrap_or_else(|| unreachable!("a Universe is only emptied when it drops"))
    }
}

impl Drop for Universe {
    fn drop(&mut self) {
        let bound = ffi::ulfm::failure_seen().then(|| crate::reliability::abort::exit_unless_done(FINALIZE_GRACE));
        drop(self.inner.take());
        drop(bound);
    }
}

fn level_name(level: c_int) -> &'static str {
    // SAFETY: reading immutable constants exported by the rsmpi shim.
    let (single, funneled, serialized) =
        unsafe { (sys::RSMPI_THREAD_SINGLE, sys::RSMPI_THREAD_FUNNELED, sys::RSMPI_THREAD_SERIALIZED) };
    match level {
        l if l == single => "MPI_THREAD_SINGLE",
        l if l == funneled => "MPI_THREAD_FUNNELED",
        l if l == serialized => "MPI_THREAD_SERIALIZED",
        _ => "MPI_THREAD_MULTIPLE",
    }
}

/// Fails unless MPI is initialized at `MPI_THREAD_MULTIPLE`.
pub(crate) fn require_thread_multiple() -> Result<()> {
    if !ffi::is_initialized() || ffi::is_finalized() {
        return Err(Error::Init("MPI is not initialized (call duralumin::init first)"));
    }
    let mut provided: c_int = 0;
    // SAFETY: MPI is initialized (checked above); the call writes one int.
    check(unsafe { sys::MPI_Query_thread(&mut provided) }, "MPI_Query_thread")?;
    // SAFETY: reading an immutable constant exported by the rsmpi shim.
    if provided != unsafe { sys::RSMPI_THREAD_MULTIPLE } {
        return Err(Error::ThreadLevel { provided: level_name(provided) });
    }
    Ok(())
}
