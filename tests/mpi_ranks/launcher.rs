//! Starts the rank programs under mpirun.

use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

/// Upper bound for one mpirun launch (the whole sweep at one rank count), in seconds;
/// `DURALUMIN_LAUNCH_TIMEOUT` sets another (the GPU script keeps it under the device's limit on
/// one command, so a hang still ends with the ranks' output).
const TIMEOUT_S: u64 = 900;

fn timeout() -> Duration {
    let s = std::env::var("DURALUMIN_LAUNCH_TIMEOUT").ok().and_then(|v| v.parse().ok()).unwrap_or(TIMEOUT_S);
    Duration::from_secs(s)
}

pub fn main() {
    let mut args = Arguments::from_args();
    // Rank counts share the machine's cores: run one launch at a time.
    args.test_threads = Some(1);
    let mut trials: Vec<Trial> =
        (1..=5).map(|np| Trial::test(format!("mpi_np{np}"), move || launch(np, "all"))).collect();
    // HostTransfer on a CUDA GPU: several ranks share the one GPU. Reported as ignored (never
    // passed) without one.
    #[cfg(feature = "cuda")]
    {
        let gpu = duralumin::device::cuda::device_count() > 0;
        trials.extend(
            (1..=3).map(|np| Trial::test(format!("cuda_np{np}"), move || launch(np, "cuda")).with_ignored_flag(!gpu)),
        );
        // The same group on the CUDA driver simulator (cudasim/, see `cudasim_dir`), which runs Duralumin's CUDA device on the CPU with
        // checks a GPU does not make: at 1..3 ranks, and with every stream on one hardware
        // queue. Reported as ignored when the simulator was not built, unless
        // DURALUMIN_REQUIRE_CUDASIM=1 (scripts/test.sh builds it and sets that).
        let sim = crate::mpirun::cudasim_dir();
        let required = std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1");
        let runs: [(&str, usize, Option<&str>); 4] = [
            ("cudasim_np1", 1, None),
            ("cudasim_np2", 2, None),
            ("cudasim_np3", 3, None),
            ("cudasim_maxconn1_np2", 2, Some("1")),
        ];
        for (name, np, connections) in runs {
            let dir = sim.clone();
            let trial = Trial::test(name, move || {
                let dir =
                    dir.ok_or("the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim")?;
                let mut env = vec![("LD_LIBRARY_PATH", crate::mpirun::library_path_with(&dir))];
                if let Some(c) = connections {
                    env.push(("CUDA_DEVICE_MAX_CONNECTIONS", c.to_string()));
                }
                launch_with(np, "cuda", &env)
            });
            trials.push(trial.with_ignored_flag(sim.is_none() && !required));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}

/// Runs `program` of this binary on `np` ranks.
pub fn launch(np: usize, program: &str) -> Result<(), Failed> {
    launch_with(np, program, &[])
}

/// Runs `program` of this binary on `np` ranks with `env` set for mpirun and the ranks.
pub fn launch_with(np: usize, program: &str, env: &[(&str, String)]) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut env = env.to_vec();
    env.push(("DURALUMIN_RANK_PROGRAM", program.to_string()));
    // Well under the launch's limit: a hang ends with the ranks' report naming the operation
    // (see duralumin::reliability) rather than with the limit's kill.
    if std::env::var("DURALUMIN_TIMEOUT").is_err() {
        env.push(("DURALUMIN_TIMEOUT", "120".into()));
    }
    let limit = timeout();
    let run = crate::mpirun::launch(np, &exe, &env, &[], limit)?;
    match run.status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(format!("mpirun -np {np} {program} failed ({s})\n{}", run.output()).into()),
        None => Err(format!("mpirun -np {np} {program} timed out after {limit:?}\n{}", run.output()).into()),
    }
}
