//! Starts the rank programs under mpirun.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
        let sim = cudasim_dir();
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
                let path = match std::env::var("LD_LIBRARY_PATH") {
                    Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
                    _ => dir.display().to_string(),
                };
                let mut env = vec![("LD_LIBRARY_PATH", path)];
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

/// A directory holding the CUDA driver simulator as `libcuda.so` (`target/<profile>/cudasim/`, a
/// link to the `libduralumin_cudasim.so` built with this test binary's profile), if it was built.
/// Only the simulator's trials get it on their library path.
#[cfg(feature = "cuda")]
fn cudasim_dir() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/mpi_ranks-<hash> -> target/<profile>
    let profile = exe.parent()?.parent()?;
    let lib = profile.join("libduralumin_cudasim.so");
    if !lib.is_file() {
        return None;
    }
    let dir = profile.join("cudasim");
    let link = dir.join("libcuda.so");
    if !link.exists() {
        std::fs::create_dir_all(&dir).ok()?;
        // Another launcher may have made it meanwhile.
        let _ = std::os::unix::fs::symlink(&lib, &link);
    }
    link.exists().then_some(dir)
}

/// Runs `program` of this binary on `np` ranks.
pub fn launch(np: usize, program: &str) -> Result<(), Failed> {
    launch_with(np, program, &[])
}

/// Runs `program` of this binary on `np` ranks with `env` set for mpirun and the ranks.
pub fn launch_with(np: usize, program: &str, env: &[(&str, String)]) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut child = Command::new("mpirun")
        .args(["--oversubscribe", "--bind-to", "none", "-np", &np.to_string()])
        .arg(&exe)
        .env("DURALUMIN_RANK_PROGRAM", program)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Open MPI 5 (the wheel the GPU script brings) asks its runtime the same.
        .env("PRTE_ALLOW_RUN_AS_ROOT", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .env("OMPI_MCA_mpi_yield_when_idle", "1")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start mpirun (is openmpi-bin installed?): {e}"))?;
    let mut out = child.stdout.take().ok_or("no stdout")?;
    let mut err = child.stderr.take().ok_or("no stderr")?;
    let out_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let (start, limit) = (Instant::now(), timeout());
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            break Some(status);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    match status {
        Some(s) if s.success() => Ok(()),
        Some(s) => {
            Err(format!("mpirun -np {np} {program} failed ({s})\n--- stdout\n{stdout}\n--- stderr\n{stderr}").into())
        }
        None => Err(format!(
            "mpirun -np {np} {program} timed out after {limit:?}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
        )
        .into()),
    }
}
