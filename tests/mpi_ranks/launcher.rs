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
    }
    libtest_mimic::run(&args, trials).exit();
}

/// Runs `program` of this binary on `np` ranks.
pub fn launch(np: usize, program: &str) -> Result<(), Failed> {
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
