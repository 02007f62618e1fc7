//! How a benchmark program runs itself under `mpirun`, once per rank count.

/// Runs this program under `mpirun -np np` as one rank of the job (`DURALUMIN_BENCH_RANK=1`),
/// with `env` set and `args` passed on; panics if the job fails. `DURALUMIN_MPIRUN` names
/// another mpirun program (another MPI's, or `scripts/cluster-mpirun` for a simulated cluster:
/// see `docs/cluster.md`), as for the tests.
///
/// With as many ranks as cores or more, the ranks yield the core when idle
/// (`OMPI_MCA_mpi_yield_when_idle=1`, unless set already): busy-polling ranks otherwise starve
/// each other and, on the simulated cluster, the kernel's work for the veth links (cross-host
/// latency went from 55 µs to 5-8 ms with 2 ranks on 2 cores, `docs/topology.md`).
pub fn relaunch(np: usize, env: &[(&str, String)], args: &[String]) {
    let exe = std::env::current_exe().expect("current_exe");
    let mpirun = std::env::var("DURALUMIN_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let yield_when_idle = np >= cores
        && std::env::var_os("OMPI_MCA_mpi_yield_when_idle").is_none()
        && !env.iter().any(|(k, _)| *k == "OMPI_MCA_mpi_yield_when_idle");
    let status = std::process::Command::new(&mpirun)
        .args(["--oversubscribe", "--bind-to", "none", "-np", &np.to_string()])
        .arg(&exe)
        .args(args)
        .env("DURALUMIN_BENCH_RANK", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .envs(yield_when_idle.then_some(("OMPI_MCA_mpi_yield_when_idle", "1")))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .status()
        .unwrap_or_else(|e| panic!("could not start {mpirun}: {e}"));
    assert!(status.success(), "benchmark at np={np} failed");
}
