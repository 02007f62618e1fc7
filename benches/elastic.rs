//! Elastic jobs (`docs/elastic.md`): what a commit costs against the state's size, as a
//! fraction of an allreduce and of a bcast of the same bytes, and where a recovery's time
//! goes (detection, shrink, spawn, merge, state transfer) at each rank count.
//!
//! Needs Open MPI 5 with ULFM: build and run it against the wheel `scripts/setup.sh` installs,
//!
//! ```sh
//! u=/opt/duralumin/openmpi5; OPAL_PREFIX=$u PATH=$u/bin:$PATH MPICC=$u/bin/mpicc DURALUMIN_SKIP_KERNELS=1 \
//!     cargo bench --bench elastic --target-dir target/ulfm -- --np 2,3,4,5 --max-bytes 268435456
//! ```
//!
//! `--np` the rank counts, `--max-bytes` the largest state (from 1 MiB, doubling; 1 GiB at
//! most), `--commit-np` the rank count of the commit table (default 4), `--steps` the steps
//! timed per size, `--parts global,local` which kinds of state part the commit table times.

#[path = "../tests/common/mpirun.rs"]
mod mpirun;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use duralumin::elastic::{Elastic, Event, Policy, State, StatePart};
use duralumin::{MpiCommunicator, Result, Sum};

fn main() -> Result<()> {
    match std::env::var("DURALUMIN_ELASTIC_BENCH").ok().as_deref() {
        Some("commit") => commit_rank(),
        Some("recover") => recover_rank(),
        _ => {
            drive();
            Ok(())
        }
    }
}

/// The value after `name` on the command line.
fn flag(name: &str) -> Option<String> {
    let mut args = std::env::args().skip_while(|a| a != name);
    args.next()?;
    args.next()
}

/// Runs the rank programs under Open MPI 5 and prints the tables.
fn drive() {
    let nps: Vec<usize> =
        flag("--np").unwrap_or_else(|| "2,3,4,5".into()).split(',').filter_map(|s| s.parse().ok()).collect();
    let max = flag("--max-bytes").and_then(|v| v.parse::<usize>().ok()).unwrap_or(256 << 20).min(1 << 30);
    let commit_np = flag("--commit-np").and_then(|v| v.parse().ok()).unwrap_or(4);
    let steps = flag("--steps").unwrap_or_else(|| "6".into());
    println!("# Commit cost, np {commit_np} (per commit: save, replicate, agree), the slowest rank's");
    println!(
        "{:>10} {:>7} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "bytes", "part", "commit us", "allreduce us", "bcast us", "/allreduce", "/bcast"
    );
    let parts = flag("--parts").unwrap_or_else(|| "global,local".into());
    let env = [
        ("DURALUMIN_ELASTIC_BENCH_MAX", max.to_string()),
        ("DURALUMIN_ELASTIC_BENCH_STEPS", steps),
        ("DURALUMIN_ELASTIC_BENCH_PARTS", parts),
    ];
    for row in rows(&launch(commit_np, "commit", &env)) {
        println!("{row}");
    }
    println!();
    println!("# Recovery after a SIGKILL in step 5 (slot 1), respawn on; ms, the slowest survivor's");
    println!(
        "{:>3} {:>10} {:>8} {:>8} {:>8} {:>8} {:>9} {:>8} {:>14}",
        "np", "state", "detect", "shrink", "spawn", "merge", "transfer", "total", "kill->full"
    );
    for &np in &nps {
        let out = launch(np, "recover", &[]);
        let kill = out.lines().find_map(|l| l.strip_prefix("KILL ")?.trim().parse::<f64>().ok());
        for row in rows(&out) {
            let (row, end) = row.split_once(" END ").unwrap_or((&row, ""));
            let full = match (kill, end.trim().parse::<f64>()) {
                (Some(k), Ok(e)) => format!("{:.1}", (e - k) * 1e3),
                _ => "-".into(),
            };
            println!("{row} {full:>14}");
        }
    }
}

/// The lines rank 0 printed as `ROW `.
fn rows(out: &str) -> Vec<String> {
    out.lines().filter_map(|line| line.strip_prefix("ROW ")).map(str::to_string).collect()
}

/// One launch of `mode` at `np` ranks under Open MPI 5 with ULFM; what the ranks printed.
fn launch(np: usize, mode: &str, env: &[(&str, String)]) -> String {
    let prefix = std::path::PathBuf::from(
        std::env::var("DURALUMIN_ULFM_PREFIX").unwrap_or_else(|_| "/opt/duralumin/openmpi5".into()),
    );
    let bin = prefix.join("bin");
    let exe = std::env::current_exe().expect("current_exe");
    let mut env: Vec<(&str, String)> = env.to_vec();
    env.extend([
        ("DURALUMIN_ELASTIC_BENCH", mode.to_string()),
        ("OPAL_PREFIX", prefix.display().to_string()),
        ("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())),
        ("LD_LIBRARY_PATH", mpirun::library_path_with(&prefix.join("lib"))),
    ]);
    let flags = ["--with-ft", "ulfm", "--mca", "async_mpi_finalize", "1", "--prtemca", "state_base_recoverable", "1"];
    let mpirun = bin.join("mpirun").display().to_string();
    let l = mpirun::launch_with(&mpirun, np, &exe, &env, &flags, Duration::from_secs(1800))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(l.status.is_some_and(|s| s.success()), "the {mode} launch at np {np} failed\n{}", l.output());
    l.stdout
}

/// A state of `global` and `local` bytes.
struct Bytes {
    global: Vec<u8>,
    local: Vec<u8>,
}

impl State for Bytes {
    fn global(&mut self) -> Vec<&mut dyn StatePart> {
        vec![&mut self.global]
    }
    fn local(&mut self) -> Vec<&mut dyn StatePart> {
        vec![&mut self.local]
    }
}

/// Seconds of `steps` steps that do nothing, with a commit every `every` steps, the slowest
/// rank's.
fn timed_run(universe: &duralumin::Universe, state: &mut Bytes, steps: u64, every: u64) -> Result<f64> {
    let mut policy = Policy::default();
    policy.commit_every = every;
    let mut job = Elastic::new(universe, policy)?;
    let world = MpiCommunicator::new(&universe.world())?;
    world.barrier()?;
    let t = Instant::now();
    job.run(state, steps, MpiCommunicator::new, |_, _, _| Ok(()))?;
    slowest(&world, t.elapsed().as_secs_f64())
}

/// The largest of every rank's `x`.
fn slowest(world: &MpiCommunicator, x: f64) -> Result<f64> {
    let mut out = [0.0];
    world.allreduce(&[x], &mut out, duralumin::Max)?;
    Ok(out[0])
}

/// Microseconds per call of `op`, the slowest rank's (`reps` calls after one warm-up).
fn per_call(world: &MpiCommunicator, reps: usize, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    op()?;
    world.barrier()?;
    let t = Instant::now();
    for _ in 0..reps {
        op()?;
    }
    slowest(world, t.elapsed().as_secs_f64() * 1e6 / reps as f64)
}

/// The commit table's rows: each size as a global part (kept by every rank, not sent) and as a
/// local part (sent to the next rank).
fn commit_rank() -> Result<()> {
    let universe = duralumin::init()?;
    let world = MpiCommunicator::new(&universe.world())?;
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    let max = std::env::var("DURALUMIN_ELASTIC_BENCH_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(256 << 20);
    let steps = var("DURALUMIN_ELASTIC_BENCH_STEPS").unwrap_or(6).max(2);
    let mut bytes = 1 << 20;
    while bytes <= max {
        let reps = (64 << 20) / bytes + 2;
        // The buffers are freed before the commits are timed (the largest states take much of
        // the machine's memory).
        let (allreduce, bcast) = {
            let send = vec![1u8; bytes];
            let mut recv = vec![0u8; bytes];
            let allreduce = per_call(&world, reps, || world.allreduce(&send, &mut recv, Sum))?;
            (allreduce, per_call(&world, reps, || world.bcast(&mut recv, 0))?)
        };
        let parts = std::env::var("DURALUMIN_ELASTIC_BENCH_PARTS").unwrap_or_default();
        for part in ["global", "local"].into_iter().filter(|p| parts.contains(p)) {
            let (g, l) = if part == "global" { (bytes, 0) } else { (8, bytes) };
            let mut state = Bytes { global: vec![7; g], local: vec![world.rank().to_le_bytes()[0]; l] };
            // Every step commits, against only the first and last: the difference is
            // `steps - 1` commits.
            let all = timed_run(&universe, &mut state, steps, 1)?;
            let ends = timed_run(&universe, &mut state, steps, steps + 1)?;
            let commit = (all - ends).max(0.0) * 1e6 / (steps - 1) as f64;
            if world.rank() == 0 {
                println!(
                    "ROW {bytes:>10} {part:>7} {commit:>12.0} {allreduce:>12.0} {bcast:>12.0} {:>10.2} {:>10.2}",
                    commit / allreduce,
                    commit / bcast
                );
            }
        }
        bytes *= 2;
    }
    Ok(())
}

/// Wall-clock seconds since the epoch (the kill and the end of the recovery happen in
/// different processes of one machine).
fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// One recovery: slot 1 dies in step 5; the survivors respawn it; rank 0 prints the slowest
/// survivor's stages.
fn recover_rank() -> Result<()> {
    let universe = duralumin::init()?;
    let spawned = duralumin::elastic::is_spawned()?;
    let timings = std::rc::Rc::new(std::cell::Cell::new(None));
    let seen = timings.clone();
    let policy = Policy::default().observer(move |e| {
        if let Event::Changed(c) = e {
            seen.set(Some((c.timings, now())));
        }
    });
    let mut job = Elastic::new(&universe, policy)?;
    let mut state = Bytes { global: vec![1; 1 << 20], local: vec![2; 1 << 10] };
    job.run(&mut state, 10, MpiCommunicator::new, |comm, _, at| {
        if at.step == 5 && at.slot == 1 && !spawned {
            println!("KILL {:.6}", now());
            use std::io::Write;
            let _ = std::io::stdout().flush();
            // SAFETY: ends this process at once (the failure measured).
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let mut sum = [0u64];
        comm.allreduce(&[1u64], &mut sum, Sum)
    })?;
    report_recovery(&universe, &job, spawned, timings.get())
}

/// Prints the recovery row on rank 0: each stage the slowest survivor's (joiners report
/// zeros), and the end of the recovery after the kill (its time arrives through stdout).
fn report_recovery(
    universe: &duralumin::Universe,
    job: &Elastic,
    spawned: bool,
    seen: Option<(duralumin::elastic::Timings, f64)>,
) -> Result<()> {
    let _ = universe;
    let world = MpiCommunicator::new(job.communicator()?)?;
    let (t, end) = seen.filter(|_| !spawned).unwrap_or_default();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let mut row = [ms(t.detect), ms(t.shrink), ms(t.spawn), ms(t.merge), ms(t.transfer), ms(t.total), end];
    let mine = row;
    world.allreduce(&mine, &mut row, duralumin::Max)?;
    if world.rank() == 0 {
        println!(
            "ROW {:>3} {:>10} {:>8.1} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>8.1} END {:.6}",
            world.size(),
            "1 MiB",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            row[6]
        );
    }
    Ok(())
}
