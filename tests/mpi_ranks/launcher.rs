//! Starts the rank programs under mpirun.

use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

use crate::case::BREAK;

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
    let cluster = Cluster::new();
    // A constant condition: the other binary's trials are not compiled into this one.
    let trials = if crate::DEVICE { device_trials(&cluster) } else { host_trials(&cluster) };
    libtest_mimic::run(&args, trials).exit();
}

/// The `mpi_ranks` binary's trials: Mpi and HostTransfer on the host device, on one host and
/// on the simulated cluster.
fn host_trials(cluster: &Cluster) -> Vec<Trial> {
    // Every element with every operator at 3 ranks (uneven blocks, a ring that is not a
    // pairwise exchange); the other rank counts move the same pairs' data by other algorithms,
    // which the representative cut covers at every element width.
    // `DURALUMIN_RANK_GROUPS` names the groups they run (`sweep+p2p`, say; every group by
    // default): the cut scripts/test.sh runs under the other MPIs.
    let groups = std::env::var("DURALUMIN_RANK_GROUPS").unwrap_or_else(|_| "all".into());
    let mut trials: Vec<Trial> = (1..=5)
        .map(|np| {
            let env = if np == FULL_SWEEP_RANKS { vec![] } else { vec![representative()] };
            let groups = groups.clone();
            Trial::test(format!("mpi_np{np}"), move || launch_with(np, &groups, &env, timeout()))
        })
        .collect();
    // The two-level algorithms on one host, with rank r treated as on node r % 2: at 5 ranks
    // the nodes are uneven (3 and 2) and not contiguous in rank order.
    trials.push(Trial::test("mpi_np5_simulated_nodes", || {
        launch_with(5, "sweep", &[("DURALUMIN_SIMULATED_NODES", "2".into()), representative()], timeout())
    }));
    // A failure names its case (checked with one failure injected into each).
    trials.push(Trial::test("names_a_wrong_result", names_a_wrong_result));
    trials.push(Trial::test("names_a_hang", names_a_hang));
    // Local rank and size against the hostnames, on one host (and on several below).
    trials.push(Trial::test("topology_np3", || launch(3, "topology")));
    // The same programs on a simulated cluster on this machine (scripts/cluster.sh: each host a
    // network namespace with its own hostname, TCP between hosts, shared memory within one).
    // The sweep of the Mpi and HostTransfer backends (host device), every algorithm: on nodes
    // of two, of one, and uneven. The links are not shaped here (the benchmark shapes them):
    // correctness does not need a slow network, and the suite's time does not want one.
    let unshaped = || Ok(vec![("DURALUMIN_CLUSTER_RATE", "none".to_string())]);
    for (name, layout, np) in [("2x2", "2x2", 4), ("3x1", "3x1", 3), ("2+1", "2,1", 3)] {
        let program = "sweep+host_transfer";
        trials.push(cluster.trial(format!("cluster_{name}_sweep"), layout, np, program, unshaped(), false));
    }
    for (name, layout, np) in [("2x2", "2x2", 4), ("3x1", "3x1", 3), ("2+1", "2,1", 3)] {
        trials.push(cluster.trial(format!("cluster_topology_{name}"), layout, np, "topology", Ok(vec![]), false));
    }
    trials
}

/// The `device_ranks` binary's trials: HostTransfer on CUDA and the NCCL backend, on a GPU and
/// on the simulators.
#[cfg(not(feature = "cuda"))]
fn device_trials(_: &Cluster) -> Vec<Trial> {
    Vec::new()
}

/// The `device_ranks` binary's trials: HostTransfer on CUDA and the NCCL backend, on a GPU and
/// on the simulators.
#[cfg(feature = "cuda")]
fn device_trials(cluster: &Cluster) -> Vec<Trial> {
    let mut trials = Vec::new();
    // HostTransfer on a CUDA GPU: several ranks share the one GPU. Reported as ignored (never
    // passed) without one.
    {
        let gpu = duralumin::device::cuda::device_count() > 0;
        trials.extend(
            (1..=3).map(|np| Trial::test(format!("cuda_np{np}"), move || launch(np, "cuda")).with_ignored_flag(!gpu)),
        );
        // The same group on the CUDA driver simulator (cudasim/, see `cudasim_dir`), which runs
        // Duralumin's CUDA device on the CPU with checks a GPU does not make: at 1..3 ranks, and with every stream on one hardware
        // queue. Reported as ignored when the simulator was not built, unless
        // DURALUMIN_REQUIRE_CUDASIM=1 (scripts/test.sh builds it and sets that).
        let sim = crate::mpirun::cudasim_dir();
        let required = std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1");
        // A trial of `program` on `np` ranks over cudasim (and ncclsim) with `env` besides.
        let on_sim = |name: String, np: usize, program: &'static str, env: Vec<(&'static str, String)>, limit| {
            let dir = sim.clone();
            Trial::test(name, move || {
                let dir =
                    dir.ok_or("the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim")?;
                let mut env = env.clone();
                env.push(("LD_LIBRARY_PATH", crate::mpirun::library_path_with(&dir)));
                launch_with(np, program, &env, limit)
            })
            .with_ignored_flag(sim.is_none() && !required)
        };
        // Every pair at 2 ranks; at 1 and 3 the ranks only move the data differently.
        for np in 1..=3 {
            let env = if np == 2 { vec![] } else { vec![representative()] };
            trials.push(on_sim(format!("cudasim_np{np}"), np, "cuda", env, timeout()));
        }
        // Ranks on several simulated hosts sharing the simulator's one device.
        let sim_env = sim
            .as_ref()
            .map(|dir| {
                vec![
                    ("LD_LIBRARY_PATH", crate::mpirun::library_path_with(dir)),
                    ("DURALUMIN_CLUSTER_RATE", "none".to_string()),
                    // A flag path is local to a device: both run on one node.
                    ("DURALUMIN_CUDA_FLAG_PATHS", "stream-mem-ops".to_string()),
                ]
            })
            .ok_or_else(|| "the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim".into());
        // One layout: two nodes of two ranks take both the node-local and the network paths.
        // The other layouts' algorithms run on the host device (cluster_*_sweep above); the
        // device changes only the staging, which this trial and cudasim_np* cover.
        let no_sim = sim.is_none() && !required;
        trials.push(cluster.trial("cluster_cudasim_2x2".into(), "2x2", 4, "cuda", sim_env, no_sim));
        // One hardware queue, on a device that refuses cooperative launches: multi-block
        // movers fall back to one block.
        let one_queue = vec![
            ("CUDA_DEVICE_MAX_CONNECTIONS", "1".to_string()),
            ("CUDASIM_FAIL_CALLS", "cuLaunchCooperativeKernel".to_string()),
            representative(),
        ];
        trials.push(on_sim("cudasim_maxconn1_np2".into(), 2, "cuda", one_queue, timeout()));
        // The NCCL backend on a GPU with a real NCCL (ignored without them), and on cudasim
        // with its NCCL, ncclsim (2.28: native all-to-all, gather and scatter), at 1..5 ranks;
        // at 2 and 5 ranks also as NCCL 2.27, which has none of those (grouped sends and
        // receives instead; ncclsim refuses the native calls there).
        let nccl_gpu = gpu && duralumin::backends::nccl::library_present();
        trials
            .extend((1..=3).map(|np| {
                Trial::test(format!("nccl_np{np}"), move || launch(np, "nccl")).with_ignored_flag(!nccl_gpu)
            }));
        for np in 1..=5 {
            let env = if np == FULL_SWEEP_RANKS { vec![] } else { vec![representative()] };
            trials.push(on_sim(format!("ncclsim_np{np}"), np, "nccl", env, timeout()));
        }
        for np in [2, 5] {
            let env = vec![("NCCLSIM_VERSION", "22703".to_string()), representative()];
            trials.push(on_sim(format!("ncclsim_nccl2_27_np{np}"), np, "nccl", env, timeout()));
        }
        // Rank 1's third NCCL call hangs, or fails asynchronously: both ranks must end with
        // an error within the deadline, not hang; with the ranks waiting on the communicator,
        // and with nobody waiting on it (the watchdog aborts it).
        let minute = Duration::from_secs(60);
        for kind in ["hang", "async"] {
            let env = vec![("NCCLSIM_FAULT", format!("{kind}:rank=1,call=3"))];
            trials.push(on_sim(format!("ncclsim_fault_{kind}_np2"), 2, "nccl_faults", env.clone(), minute));
            trials.push(on_sim(format!("ncclsim_watchdog_{kind}_np2"), 2, "nccl_watchdog", env, minute));
        }
        // No NCCL to load: a typed error on every rank.
        let env = vec![("DURALUMIN_NCCL", "/nonexistent/libnccl.so.2".to_string())];
        trials.push(on_sim("ncclsim_missing_library_np2".into(), 2, "nccl_missing", env, minute));
    }
    trials
}

/// The rank count at which the Mpi and NCCL sweeps take every element with every operator
/// (HostTransfer on cudasim takes them at 2, the simulator's cheapest multi-rank count).
const FULL_SWEEP_RANKS: usize = 3;

/// The sweep's representative cut (`sweep::Breadth::Representative`), for trials that vary only
/// how the data moves: a rank count other than the full sweep's, a simulated cluster, one
/// hardware queue, an older NCCL. Every pair is swept in full on the same backend by another
/// trial.
fn representative() -> (&'static str, String) {
    ("DURALUMIN_SWEEP", "representative".to_string())
}

/// Runs `program` of this binary on `np` ranks.
pub fn launch(np: usize, program: &str) -> Result<(), Failed> {
    launch_with(np, program, &[], timeout())
}

/// Runs `program` of this binary on `np` ranks with `env` set for mpirun and the ranks, for at
/// most `limit`. A failure's message leads with a line per rank: what failed on the ranks that
/// did (`rank 2: group sweep / Mpi / allreduce in place, f32, Sum, count 7, algorithm Auto: got
/// [...], expected [...]`), where the others were (`rank 1 was in: ...`).
pub fn launch_with(np: usize, program: &str, env: &[(&str, String)], limit: Duration) -> Result<(), Failed> {
    launch_on(&crate::mpirun::mpirun_program(), np, program, env, limit)
}

/// [`launch_with`] under the `mpirun` program given.
fn launch_on(mpirun: &str, np: usize, program: &str, env: &[(&str, String)], limit: Duration) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut env = env.to_vec();
    env.push(("DURALUMIN_RANK_PROGRAM", program.to_string()));
    // Well under the launch's limit: a hang ends with the ranks' report naming the operation
    // (see duralumin::reliability) rather than with the limit's kill.
    if std::env::var("DURALUMIN_TIMEOUT").is_err() && !env.iter().any(|(k, _)| *k == "DURALUMIN_TIMEOUT") {
        env.push(("DURALUMIN_TIMEOUT", "120".into()));
    }
    let run = crate::mpirun::launch_with(mpirun, np, &exe, &env, &[], limit)?;
    match run.status {
        Some(s) if s.success() => Ok(()),
        Some(s) => Err(run.failure(&format!("mpirun -np {np} {program} failed ({s})")).into()),
        None => Err(run.failure(&format!("mpirun -np {np} {program} timed out after {limit:?}")).into()),
    }
}

/// The simulated cluster: `scripts/cluster-mpirun`, mpirun on a fresh cluster of network
/// namespaces (layout from `DURALUMIN_CLUSTER`), and whether `scripts/cluster.sh check` says it
/// can run here (it needs root). Its trials are reported as ignored where it cannot, with the
/// reason on stderr, unless `DURALUMIN_REQUIRE_CLUSTER=1` (scripts/test.sh sets it): then they
/// fail with the reason.
struct Cluster {
    mpirun: String,
    /// Why the cluster cannot run here.
    unavailable: Option<String>,
    required: bool,
}

impl Cluster {
    fn new() -> Cluster {
        let scripts = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts");
        let unavailable = match std::process::Command::new(scripts.join("cluster.sh")).arg("check").output() {
            Ok(out) if out.status.success() => None,
            Ok(out) => Some(format!("{} ({})", String::from_utf8_lossy(&out.stderr).trim(), out.status)),
            Err(e) => Some(format!("cluster: cannot run scripts/cluster.sh: {e}")),
        };
        let required = std::env::var("DURALUMIN_REQUIRE_CLUSTER").is_ok_and(|v| v == "1");
        if let Some(reason) = &unavailable {
            let outcome = if required { "fail (DURALUMIN_REQUIRE_CLUSTER=1)" } else { "are ignored" };
            eprintln!("the cluster_* trials {outcome}: {reason}");
        }
        Cluster { mpirun: scripts.join("cluster-mpirun").display().to_string(), unavailable, required }
    }

    /// A trial of `program` on `np` ranks on a cluster of `layout` (`HxS`, or slots per host:
    /// `2,1`) with `env` besides, or the reason `env` cannot be had (a trial then fails; it is
    /// ignored instead where `ignore`).
    fn trial(
        &self,
        name: String,
        layout: &'static str,
        np: usize,
        program: &'static str,
        env: Result<Vec<(&'static str, String)>, String>,
        ignore: bool,
    ) -> Trial {
        let (mpirun, unavailable) = (self.mpirun.clone(), self.unavailable.clone());
        let ignored = ignore || (unavailable.is_some() && !self.required);
        Trial::test(name, move || {
            if let Some(reason) = unavailable {
                return Err(reason.into());
            }
            let mut env = env?;
            env.push(("DURALUMIN_CLUSTER", layout.to_string()));
            env.push(representative());
            launch_on(&mpirun, np, program, &env, timeout())
        })
        .with_ignored_flag(ignored)
    }
}

/// The sweep at 2 ranks with one failure injected: the launch's failure message (it must fail).
fn injected(spec: &str, env: &[(&str, String)], limit: Duration) -> Result<String, Failed> {
    let mut env = env.to_vec();
    env.push((BREAK, spec.to_string()));
    match launch_with(2, "sweep", &env, limit) {
        Ok(()) => Err(format!("{BREAK}={spec}: the launch passed").into()),
        Err(f) => Ok(f.message().unwrap_or_default().to_string()),
    }
}

/// Fails with the whole message unless `ok`.
fn expect(ok: bool, what: &str, message: &str) -> Result<(), Failed> {
    if ok { Ok(()) } else { Err(format!("the failure message does not {what}; it was:\n{message}").into()) }
}

/// A wrong result on rank 1 names the case, with what it got and expected, on the message's
/// first line; rank 0, ended with the job, says where it was.
fn names_a_wrong_result() -> Result<(), Failed> {
    let spec = "wrong:rank=1,op=allreduce,type=i8,operator=Sum,count=7,in_place=true";
    let message = injected(spec, &[], timeout())?;
    let first = message.lines().next().unwrap_or_default();
    let case = "rank 1: group sweep / Mpi / allreduce in place, i8, Sum, count 7, algorithm Auto: got [";
    expect(first.starts_with(case) && first.contains("], expected ["), &format!("start with {case:?}"), &message)?;
    expect(
        message.lines().nth(1).is_some_and(|l| l.starts_with("rank 0 was in: group sweep")),
        "say where rank 0 was",
        &message,
    )
}

/// A hang (rank 1 stops at a case; no operation deadline) killed at the launch's limit names
/// the case both ranks were in.
fn names_a_hang() -> Result<(), Failed> {
    let spec = "hang:rank=1,op=reduce,type=i8,operator=Sum,count=7,nb=true,in_place=false,root=0";
    let case = "group sweep / Mpi / reduce non-blocking, i8, Sum, count 7, root 0";
    let want = [format!("rank 0 was in: {case}"), format!("rank 1 was in: {case}")];
    // The case comes well within the sweep's first second, and the limit is the whole trial's
    // time; once more with a longer one in case a loaded machine started the ranks late.
    let mut message = String::new();
    for limit in [3, 30].map(Duration::from_secs) {
        message = injected(spec, &[("DURALUMIN_TIMEOUT", "0".into())], limit)?;
        let lines: Vec<&str> = message.lines().take(3).collect();
        if lines.len() == 3 && lines[..2] == want && lines[2].contains("timed out after") {
            return Ok(());
        }
    }
    expect(false, &format!("start with {want:?} and then say the launch timed out"), &message)
}
