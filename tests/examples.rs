//! The numbered examples, each run to its end under `mpirun` (as a user would run them) and
//! checked for its `ok`: the Mpi backend (01, 02), HostTransfer on the host device (04), and
//! HostTransfer on CUDA from a stream alone (05) and the NCCL backend with a user's GPU
//! kernels (06) on the CUDA driver simulator (and its NCCL), ignored when the simulator was not
//! built unless `DURALUMIN_REQUIRE_CUDASIM=1`, and on a GPU (with NCCL) when there is one. (03, the ULFM recovery, is `tests/ulfm.rs`'s.)

#[path = "common/mpirun.rs"]
mod mpirun;

use std::path::PathBuf;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

/// The hard limit of one launch.
const LIMIT: Duration = Duration::from_secs(120);

/// The example `name`, built next to this test (`cargo test` builds the examples).
fn example(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/deps/examples-<hash> -> target/<profile>/examples/
    exe.parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join(name))
        .filter(|p| p.is_file())
        .ok_or_else(|| format!("example {name} is not built next to this test (cargo test builds it)"))
}

/// Runs example `name` on `np` ranks with `env`; it must exit 0 and print `ok`.
fn run(name: &str, np: usize, env: &[(&str, String)]) -> Result<(), Failed> {
    let l = mpirun::launch(np, &example(name)?, env, &[], LIMIT)?;
    match l.status {
        None => Err(format!("{name} on {np} ranks: still running after {LIMIT:?}: killed\n{}", l.output()).into()),
        Some(s) if !s.success() || !l.stdout.lines().any(|line| line == "ok") => {
            Err(format!("{name} on {np} ranks: exit {s}, no `ok`\n{}", l.output()).into())
        }
        Some(_) => Ok(()),
    }
}

fn main() {
    let args = Arguments::from_args();
    let mut trials = vec![
        Trial::test("01-allreduce_np4", || run("01-allreduce", 4, &[])),
        Trial::test("02-custom-op_np3", || run("02-custom-op", 3, &[])),
        Trial::test("04-host-transfer_np3", || run("04-host-transfer", 3, &[])),
    ];
    #[cfg(feature = "cuda")]
    {
        let sim = mpirun::cudasim_dir();
        let required = std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1");
        let on_sim = |trial: &'static str, example: &'static str, np: usize| {
            let dir = sim.clone();
            Trial::test(trial, move || {
                let dir =
                    dir.ok_or("the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim")?;
                run(example, np, &[("LD_LIBRARY_PATH", mpirun::library_path_with(&dir))])
            })
            .with_ignored_flag(sim.is_none() && !required)
        };
        trials.push(on_sim("05-cuda-stream_cudasim_np2", "05-cuda-stream", 2));
        // The NCCL backend with the user's kernels, on ncclsim (cudasim's NCCL).
        trials.push(on_sim("06-nccl-custom-kernels_ncclsim_np3", "06-nccl-custom-kernels", 3));
        let gpu = duralumin::device::cuda::device_count() > 0;
        trials.push(Trial::test("05-cuda-stream_gpu_np2", || run("05-cuda-stream", 2, &[])).with_ignored_flag(!gpu));
        let nccl = gpu && duralumin::backends::nccl::library_present();
        trials.push(
            Trial::test("06-nccl-custom-kernels_gpu_np2", || {
                run("06-nccl-custom-kernels", 2, &[("NCCL_MULTI_RANK_GPU_ENABLE", "1".into())])
            })
            .with_ignored_flag(!nccl),
        );
    }
    libtest_mimic::run(&args, trials).exit();
}
