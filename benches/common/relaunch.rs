//! How a benchmark program runs itself under `mpirun`, once per rank count, with a deadline.

#[path = "../../tests/common/mpirun.rs"]
mod mpirun;

use std::time::Duration;

/// The default limit of one launch (every size of one rank count), in seconds:
/// `DURALUMIN_BENCH_TIMEOUT` sets another. Each operation has its own deadline in the ranks
/// as well (`DURALUMIN_TIMEOUT`); this one also catches a job that hangs outside them.
const LIMIT_S: f64 = 3600.0;

/// How long mpirun has, once asked to stop, to take its ranks down before it is killed.
const GRACE: Duration = Duration::from_secs(10);

/// The value after `name` on this program's command line (`--np 2,4`), if given.
pub fn flag(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next()?;
    args.next()
}

/// The rank counts of `--np` (a comma-separated list), or of `default`.
pub fn rank_counts(default: &str) -> Vec<usize> {
    flag("--np").as_deref().unwrap_or(default).split(',').filter_map(|s| s.parse().ok()).collect()
}

/// Runs this program under `mpirun -np np` as one rank of the job (`DURALUMIN_BENCH_RANK=1`),
/// with `env` set and `args` passed on; panics if the job fails or outruns its limit (it is
/// then stopped). `DURALUMIN_MPIRUN` names another mpirun program (another MPI's, or
/// `scripts/cluster-mpirun` for a simulated cluster: see `docs/cluster.md`), as for the tests.
///
/// With as many ranks as cores or more, the ranks yield the core when idle
/// (`OMPI_MCA_mpi_yield_when_idle=1`, unless set already): busy-polling ranks otherwise starve
/// each other and, on the simulated cluster, the kernel's work for the veth links (cross-host
/// latency went from 55 µs to 5-8 ms with 2 ranks on 2 cores, `docs/topology.md`).
pub fn relaunch(np: usize, env: &[(&str, String)], args: &[String]) {
    let exe = std::env::current_exe().expect("current_exe");
    let mpirun = mpirun::mpirun_program();
    let limit = limit();
    let yield_when_idle = yields_when_idle(np) && !env.iter().any(|(k, _)| *k == "OMPI_MCA_mpi_yield_when_idle");
    // The job stays in this process's group, so an interrupt from the terminal reaches it.
    let mut child = mpirun::command(&mpirun, np, &exe, &[])
        .args(args)
        .env("DURALUMIN_BENCH_RANK", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .envs(yield_when_idle.then_some(("OMPI_MCA_mpi_yield_when_idle", "1")))
        .spawn()
        .unwrap_or_else(|e| panic!("could not start {mpirun}: {e}"));
    match mpirun::wait_for(&mut child, limit).unwrap_or_else(|e| panic!("{e}")) {
        Some(status) => assert!(status.success(), "benchmark at np={np} failed ({status})"),
        None => {
            stop(&mut child);
            panic!(
                "benchmark at np={np} outran its limit of {} s (DURALUMIN_BENCH_TIMEOUT) and was stopped",
                limit.as_secs_f64()
            );
        }
    }
}

/// Whether a launch of `np` ranks yields the core when idle (see [`relaunch`]), unless told
/// otherwise.
pub fn yields_when_idle(np: usize) -> bool {
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    match std::env::var("OMPI_MCA_mpi_yield_when_idle") {
        Ok(v) => v == "1",
        Err(_) => np >= cores,
    }
}

fn limit() -> Duration {
    let s = match std::env::var("DURALUMIN_BENCH_TIMEOUT") {
        Ok(v) => v
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s > 0.0)
            .unwrap_or_else(|| panic!("DURALUMIN_BENCH_TIMEOUT must be a positive number of seconds, not {v:?}")),
        Err(_) => LIMIT_S,
    };
    Duration::from_secs_f64(s)
}

/// Asks mpirun to stop (it takes its ranks down), then kills it if it has not within [`GRACE`].
fn stop(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        // SAFETY: sends SIGTERM to the mpirun this program started and has not reaped; touches
        // no memory.
        unsafe { libc::kill(pid, libc::SIGTERM) };
    }
    if !matches!(mpirun::wait_for(child, GRACE), Ok(Some(_))) {
        let _ = child.kill();
        let _ = child.wait();
    }
}
