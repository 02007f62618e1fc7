//! How a benchmark program runs itself under `mpirun`, once per rank count.

/// Runs this program under `mpirun -np np` as one rank of the job (`DURALUMIN_BENCH_RANK=1`),
/// with `env` set and `args` passed on; panics if the job fails. `DURALUMIN_MPIRUN` names
/// another mpirun program (another MPI's, or `scripts/cluster-mpirun` for a simulated cluster:
/// see `docs/cluster.md`), as for the tests.
pub fn relaunch(np: usize, env: &[(&str, String)], args: &[String]) {
    let exe = std::env::current_exe().expect("current_exe");
    let mpirun = std::env::var("DURALUMIN_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    let status = std::process::Command::new(&mpirun)
        .args(["--oversubscribe", "--bind-to", "none", "-np", &np.to_string()])
        .arg(&exe)
        .args(args)
        .env("DURALUMIN_BENCH_RANK", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .status()
        .unwrap_or_else(|e| panic!("could not start {mpirun}: {e}"));
    assert!(status.success(), "benchmark at np={np} failed");
}
