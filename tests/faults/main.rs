//! Fault injection: under `mpirun` at 2 to 5 ranks, one rank misbehaves at collective #3 of a
//! loop (see `rank.rs`: a stall, a panic, another count, another collective, another root,
//! arguments its own checks refuse, a SIGKILL in the middle of a 64 MiB allreduce), on the Mpi
//! backend, HostTransfer on the host device and HostTransfer<cuda> on the CUDA driver
//! simulator, with the job aborting on a timeout (the default), returning errors
//! (`OnTimeout::Error`), or checking signatures (`DURALUMIN_CHECK=1`). Deadlines are 2 s. On
//! the Mpi backend alone, a rank also drops a communicator whose shared-memory window exists
//! out of order (see `rank::drop_order`).
//!
//! Each trial asserts that every rank ends (exit or error) within the deadline plus 5 s of the
//! fault, that the report (or the error every rank gets) names the right rank and collective,
//! and that nothing hangs afterwards: the launch must end on its own, and a launch that outruns
//! its limit is killed and fails. A launch that broke only the time bound (a machine busy with
//! CI's other stages can stop every rank for seconds) runs again and must keep it there.

mod mismatch;
#[path = "../common/mpirun.rs"]
mod mpirun;
mod rank;

use std::time::{Duration, UNIX_EPOCH};

use libtest_mimic::{Arguments, Failed, Trial};
use rank::Fault;

/// Every operation's deadline in the trials.
const TIMEOUT_S: f64 = 2.0;
/// The collective the fault hits.
const OP: usize = 3;
/// The hard limit of one launch.
const LIMIT: Duration = Duration::from_secs(60);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `OnTimeout::Abort`, no signature check.
    Abort,
    /// `OnTimeout::Error`.
    Error,
    /// `DURALUMIN_CHECK=1`.
    Check,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Abort => "abort",
            Mode::Error => "error",
            Mode::Check => "check",
        }
    }
}

/// Every fault under the modes where its outcome is defined. A root mismatch is only caught by
/// the signature check (without it, two ranks that each think they are the root may both
/// "complete" a bcast); a SIGKILL is handled by mpirun whatever the mode.
const PLAN: [(Fault, Mode); 16] = [
    (Fault::Stall, Mode::Abort),
    (Fault::Stall, Mode::Error),
    (Fault::Panic, Mode::Abort),
    (Fault::Count, Mode::Abort),
    (Fault::Count, Mode::Check),
    (Fault::Op, Mode::Abort),
    (Fault::Op, Mode::Error),
    (Fault::Op, Mode::Check),
    (Fault::Root, Mode::Check),
    (Fault::BadArg, Mode::Abort),
    (Fault::BadArg, Mode::Error),
    (Fault::BadArg, Mode::Check),
    (Fault::Kill, Mode::Abort),
    (Fault::DropOrder, Mode::Abort),
    (Fault::DropOrder, Mode::Error),
    (Fault::DropEarly, Mode::Error),
];

#[derive(Clone, Copy, Debug)]
struct Case {
    backend: &'static str,
    fault: Fault,
    mode: Mode,
    np: usize,
    rank: usize,
}

fn main() {
    if let Ok(program) = std::env::var("DURALUMIN_FAULT_PROGRAM") {
        if let Some(backend) = program.strip_prefix("mismatch-") {
            mismatch::main(backend);
        } else if let Some(backend) = program.strip_prefix("given-up-") {
            mismatch::given_up(backend);
        } else if program == "switched" {
            rank::switched();
        } else if program == "set-aside" {
            rank::set_aside();
        } else if program == "queue-failure" {
            #[cfg(feature = "cuda")]
            rank::queue_failure();
        } else {
            rank::main(&program);
        }
        return;
    }
    let mut args = Arguments::from_args();
    // Launches mostly wait (on deadlines, stalls); two at a time keep the suite short.
    args.test_threads = Some(args.test_threads.unwrap_or(2));
    let sim = mpirun::cudasim_dir();
    let sim_required = std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1");
    let mut trials = Vec::new();
    for backend in ["mpi", "host", "cudasim"] {
        if backend == "cudasim" && !cfg!(feature = "cuda") {
            continue;
        }
        for (i, &(fault, mode)) in PLAN.iter().enumerate() {
            if matches!(fault, Fault::DropOrder | Fault::DropEarly) && backend != "mpi" {
                // Only the Mpi backend has a shared-memory window.
                continue;
            }
            // Every rank count from 2 to 5 for each backend, the faulty rank varying with it.
            let nps = if backend == "cudasim" { vec![2 + i % 2] } else { vec![2 + i % 4, 2 + (i + 2) % 4] };
            for np in nps {
                let case = Case { backend, fault, mode, np, rank: faulty_rank(fault, np, trials.len()) };
                let name = format!("{backend}_{}_{}_np{np}_rank{}", fault.name(), mode.name(), case.rank);
                let dir = sim.clone();
                let trial = Trial::test(name, move || run(case, dir.as_deref()));
                trials.push(trial.with_ignored_flag(backend == "cudasim" && sim.is_none() && !sim_required));
            }
        }
    }
    // Mismatched calls at every size class and algorithm (see `mismatch.rs`), on one node at
    // 2 to 5 ranks and on a simulated cluster of 2 hosts x 2 ranks.
    let cluster = cluster_unavailable();
    let cluster_required = std::env::var("DURALUMIN_REQUIRE_CLUSTER").is_ok_and(|v| v == "1");
    for backend in ["mpi", "host"] {
        for np in 2..=5 {
            trials.push(Trial::test(format!("mismatch_{backend}_np{np}"), move || run_mismatch(backend, np, None)));
        }
        let why = cluster.clone();
        let trial = Trial::test(format!("mismatch_{backend}_cluster_2x2"), move || match &why {
            Some(reason) => Err(reason.clone().into()),
            None => run_mismatch(backend, 4, Some("2x2")),
        });
        trials.push(trial.with_ignored_flag(cluster.is_some() && !cluster_required));
    }
    // A rank told of another's give-up in a call unlike its own (see `mismatch::given_up`).
    for backend in ["mpi", "host"] {
        trials.push(Trial::test(format!("given_up_{backend}_np2"), move || run_given_up(backend)));
        trials.push(Trial::test(format!("given_up_abort_{backend}_np2"), move || run_given_up_abort(backend)));
    }
    // A fault in an operation the flight recorder had set aside.
    trials.push(Trial::test("set_aside_host_np2", run_set_aside));
    // An operation queued under `OnTimeout::Abort`, given up after a switch to `Error`.
    trials.push(Trial::test("switched_abort_to_error_host_np2", run_switched));
    // A collective one rank's device cannot queue, on cudasim.
    #[cfg(feature = "cuda")]
    {
        let dir = sim.clone();
        let trial = Trial::test("queue_failure_cudasim_np2", move || run_queue_failure(dir.as_deref()));
        trials.push(trial.with_ignored_flag(sim.is_none() && !sim_required));
    }
    // `scripts/test.sh` runs this binary on its own, beside its last stages (its launches
    // mostly wait out deadlines: `docs/testing.md`); inside the workspace's `cargo test` there,
    // every trial reports itself ignored.
    if std::env::var("DURALUMIN_FAULTS_DEFERRED").is_ok_and(|v| v == "1") {
        trials = trials.into_iter().map(|t| t.with_ignored_flag(true)).collect();
    }
    libtest_mimic::run(&args, trials).exit();
}

/// The hard limit of a launch of every mismatch case.
const MISMATCH_LIMIT: Duration = Duration::from_secs(900);

/// The deadline of the mismatch trials. About a quarter of their cases can only end at it (a
/// rank in MPI's own collective, or in a signature check, sends nothing the others' algorithm
/// could find), so it sets most of their time. The correct call before a case runs under a
/// generous deadline of its own (`mismatch::WARMUP_TIMEOUT`): a loaded machine may slow it past
/// this one (a 16 MiB allreduce on the simulated cluster took 1.1 s under CI's load).
const MISMATCH_TIMEOUT_S: f64 = 1.0;

/// Why the simulated cluster (`scripts/cluster.sh`, network namespaces: root only) cannot run
/// here, if it cannot.
fn cluster_unavailable() -> Option<String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster.sh");
    match std::process::Command::new(&script).arg("check").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("cluster: {} ({})", String::from_utf8_lossy(&out.stderr).trim(), out.status)),
        Err(e) => Some(format!("cluster: cannot run {}: {e}", script.display())),
    }
}

/// Every mismatch case of `backend` at `np` ranks, on one node or a simulated cluster of
/// `layout`, in one launch under `OnTimeout::Error`. A case that broke only the time bound runs
/// again, alone, in a launch of its own, and must keep it there (see [`Slow`]).
fn run_mismatch(backend: &str, np: usize, layout: Option<&str>) -> Result<(), Failed> {
    let launch = launch_mismatch(backend, np, layout, None)?;
    let nodes = if layout.is_some() { 2 } else { 1 };
    let fail = |l: &mpirun::Launch, why: String| -> Failed {
        l.failure(&format!("mismatch {backend} np {np} {}: {why}", layout.unwrap_or("one node"))).into()
    };
    let (tally, slow) = check_mismatch(np, nodes, MISMATCH_TIMEOUT_S, &launch).map_err(|why| fail(&launch, why))?;
    let mut alone = Vec::new();
    for s in &slow {
        let again = launch_mismatch(backend, np, layout, Some(s.case))?;
        let case = mismatch::cases(np, nodes)[s.case];
        match check_case(s.case, &case, np, MISMATCH_TIMEOUT_S, &again) {
            Ok((_, ms)) => alone.push(format!("case {} took {} ms on rank {}, {ms} ms alone", s.case, s.ms, s.rank)),
            Err(CaseFailure::Broken(why) | CaseFailure::Slow(Slow { why, .. })) => {
                return Err(fail(&again, format!("{} (and alone: {why})", s.why)));
            }
        }
    }
    let retried =
        if alone.is_empty() { String::new() } else { format!("; beyond the bound under load: {}", alone.join(", ")) };
    println!("mismatch {backend} np {np} {}: {tally}{retried}", layout.unwrap_or("one node"));
    Ok(())
}

/// Two ranks broadcast, each with the other as the root, and no message can show either the
/// mismatch: rank 0's deadline passes first and it gives the communicator up. Rank 0 must get
/// its timeout; rank 1, long before its own deadline, the mismatch, naming both calls.
fn run_given_up(backend: &str) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let env = vec![("DURALUMIN_FAULT_PROGRAM", format!("given-up-{backend}")), ("DURALUMIN_CHECK", "0".to_string())];
    let l = with_reports(2, &format!("given-up-{backend}"), env, |env| mpirun::launch(2, &exe, env, &[], LIMIT))?;
    let fail = |why: String| -> Failed { l.failure(&format!("given up {backend}: {why}")).into() };
    if !l.status.is_some_and(|s| s.success()) {
        return Err(fail(format!("the launch ended with {:?}", l.status)));
    }
    let outcome = |r: usize| outcome_line(&l.stdout, &format!("GIVEN_UP {r} "));
    let err = |r: usize| -> String {
        let prefix = format!("ERR {r}| ");
        l.stdout.lines().filter_map(|line| line.strip_prefix(&prefix)).collect::<Vec<_>>().join("\n")
    };
    let (first, second) = (outcome(0), outcome(1));
    if first.as_ref().map(|o| o.0.as_str()) != Some("Timeout") {
        return Err(fail(format!("rank 0 ended {first:?}, not with its timeout")));
    }
    let bound = mismatch::GIVE_UP_TIMEOUT + Duration::from_secs(5);
    match second {
        Some((word, ms)) if word == "Mismatch" && u128::from(ms) <= bound.as_millis() => {}
        other => return Err(fail(format!("rank 1 ended {other:?}, not with the mismatch within {bound:?}"))),
    }
    let text = err(1);
    for needle in [
        "rank 0 gave up on the communicator",
        "rank 1: entered #",
        "which differs from rank 0's call in root (0; rank 0's 1)",
    ] {
        if !text.contains(needle) {
            return Err(fail(format!("rank 1's error lacks {needle:?}: {text}")));
        }
    }
    println!("given up {backend}: rank 1 got the mismatch: {}", text.lines().nth(2).unwrap_or_default().trim());
    Ok(())
}

/// As [`run_given_up`], with rank 1 under `OnTimeout::Abort`: rank 0's give-up must end the
/// job from rank 1 (which, given up, would hand back buffers MPI may still read), saying why.
fn run_given_up_abort(backend: &str) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let program = format!("given-up-abort-{backend}");
    let env = vec![("DURALUMIN_FAULT_PROGRAM", program.clone()), ("DURALUMIN_CHECK", "0".to_string())];
    let l = with_reports(2, &program, env, |env| mpirun::launch(2, &exe, env, &[], LIMIT))?;
    let fail = |why: String| -> Failed { l.failure(&format!("given up, abort {backend}: {why}")).into() };
    match l.status {
        None => return Err(fail(format!("still running after {LIMIT:?}: killed"))),
        Some(s) if s.success() => return Err(fail("the job did not end".into())),
        Some(_) => {}
    }
    let needle = "rank 1: rank 0 gave up on the communicator";
    let Some(line) = l.stderr.lines().find(|line| line.contains(needle)) else {
        return Err(fail(format!("no line says {needle:?}")));
    };
    if !line.contains("aborting the job (OnTimeout::Abort here") {
        return Err(fail(format!("rank 1's line does not say it ends the job: {line}")));
    }
    if outcome_line(&l.stdout, "GIVEN_UP 1 ").is_some() {
        return Err(fail("rank 1's call returned".into()));
    }
    println!("given up, abort {backend}: rank 1 ended the job: {line}");
    Ok(())
}

/// Rank 1's device fails to queue an allreduce rank 0 is already in (see
/// [`rank::queue_failure`]): rank 1 must get its device's error, and rank 0, within seconds
/// rather than at its deadline, the communicator given up by rank 1.
#[cfg(feature = "cuda")]
fn run_queue_failure(sim: Option<&std::path::Path>) -> Result<(), Failed> {
    let dir = sim.ok_or("the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim")?;
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let env = [
        ("DURALUMIN_FAULT_PROGRAM", "queue-failure".to_string()),
        ("DURALUMIN_CHECK", "0".to_string()),
        ("CUDASIM_FAIL_CALLS", "cuMemcpyDtoHAsync_v2".to_string()),
        ("CUDASIM_FAIL_RANK", "1".to_string()),
        ("LD_LIBRARY_PATH", mpirun::library_path_with(dir)),
    ];
    let l = mpirun::launch(2, &exe, &env, &[], LIMIT)?;
    let fail = |why: String| -> Failed { l.failure(&format!("queue failure: {why}")).into() };
    if !l.status.is_some_and(|s| s.success()) {
        return Err(fail(format!("the launch ended with {:?}", l.status)));
    }
    let errors = |r: usize| -> String {
        let prefix = format!("ERROR {r}| ");
        l.stdout.lines().filter_map(|line| line.strip_prefix(&prefix)).collect::<Vec<_>>().join("\n")
    };
    match outcome_line(&l.stdout, "QUEUED 1 ") {
        Some((word, _)) if word == "Device" && errors(1).contains("cuMemcpyDtoHAsync") => {}
        other => return Err(fail(format!("rank 1 ended {other:?}, not with its device's error: {}", errors(1)))),
    }
    let bound = rank::QUEUE_FAILURE_TIMEOUT / 2;
    match outcome_line(&l.stdout, "QUEUED 0 ") {
        Some((word, ms)) if word == "Aborted" && u128::from(ms) < bound.as_millis() => {}
        other => return Err(fail(format!("rank 0 ended {other:?}, not given up within {bound:?}"))),
    }
    if !errors(0).contains("rank 1 gave up on the communicator") {
        return Err(fail(format!("rank 0's error does not name rank 1: {}", errors(0))));
    }
    println!("queue failure: rank 0 got {}", errors(0).lines().next().unwrap_or_default());
    Ok(())
}

/// See [`rank::set_aside`]: every rank must end with the fault's error (not its timeout) in a
/// launch that ends on its own.
fn run_set_aside() -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let env = [
        ("DURALUMIN_FAULT_PROGRAM", "set-aside".to_string()),
        ("DURALUMIN_CHECK", "0".to_string()),
        ("DURALUMIN_RECORDER_OPS", "8".to_string()),
    ];
    let l = mpirun::launch(2, &exe, &env, &[], LIMIT)?;
    let fail = |why: String| -> Failed { l.failure(&format!("set aside: {why}")).into() };
    if !l.status.is_some_and(|s| s.success()) {
        return Err(fail(format!("the launch ended with {:?}", l.status)));
    }
    let bound = rank::SET_ASIDE_TIMEOUT / 2;
    for r in 0..2 {
        match outcome_line(&l.stdout, &format!("SET_ASIDE {r} ")) {
            Some((word, ms)) if word != "ok" && word != "Timeout" && u128::from(ms) < bound.as_millis() => {}
            other => return Err(fail(format!("rank {r} ended {other:?}, not with the fault within {bound:?}"))),
        }
    }
    let shown = |p: &str| l.stdout.lines().filter(|x| x.starts_with(p)).collect::<Vec<_>>().join("; ");
    println!("set aside: {}; {}", shown("SET_ASIDE"), shown("ERROR"));
    Ok(())
}

/// See [`rank::switched`]: the job must end, saying why, rather than rank 0 getting its
/// buffers back while MPI may still use them.
fn run_switched() -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let env = [("DURALUMIN_FAULT_PROGRAM", "switched".to_string()), ("DURALUMIN_CHECK", "0".to_string())];
    let l = mpirun::launch(2, &exe, &env, &[], LIMIT)?;
    let fail = |why: String| -> Failed { l.failure(&format!("switched: {why}")).into() };
    let Some(status) = l.status else { return Err(fail(format!("still running after {LIMIT:?}: killed"))) };
    if status.success() || l.stdout.contains("SWITCHED 0 downloaded") {
        return Err(fail(format!("rank 0 got its buffers back ({status})")));
    }
    let why = "while MPI runs it on the caller's buffers (it was queued under OnTimeout::Abort)";
    if !l.stderr.contains("rank 0: allreduce #1: the communicator was given up") || !l.stderr.contains(why) {
        return Err(fail("the job did not end saying why".into()));
    }
    println!("switched: the job ended ({status})");
    Ok(())
}

/// One launch of the mismatch cases (`only`: just that one) under `OnTimeout::Error`.
fn launch_mismatch(
    backend: &str,
    np: usize,
    layout: Option<&str>,
    only: Option<usize>,
) -> Result<mpirun::Launch, Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let mut env = vec![
        ("DURALUMIN_FAULT_PROGRAM", format!("mismatch-{backend}")),
        ("DURALUMIN_TIMEOUT", MISMATCH_TIMEOUT_S.to_string()),
        ("DURALUMIN_ON_TIMEOUT", "error".to_string()),
        ("DURALUMIN_CHECK", "0".to_string()),
    ];
    if let Some(i) = only {
        env.push(("MISMATCH_CASE", i.to_string()));
    }
    let tag = format!(
        "mismatch-{backend}-{np}-{}-{}",
        layout.unwrap_or("node"),
        only.map_or("all".into(), |i| i.to_string())
    );
    if let Some(layout) = layout {
        env.push(("DURALUMIN_CLUSTER", layout.to_string()));
    }
    with_reports(np, &tag, env, |env| match layout {
        None => mpirun::launch(np, &exe, env, &[], MISMATCH_LIMIT),
        Some(_) => {
            let mpirun = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster-mpirun");
            mpirun::launch_with(&mpirun.display().to_string(), np, &exe, env, &[], MISMATCH_LIMIT)
        }
    })
}

/// Runs `launch` with `env` and [`mismatch::REPORTS`] naming a directory of its own (`tag`
/// tells it apart), where each of the `np` ranks writes its lines to a file: the launcher
/// forwards the ranks' stdout in pieces that need not end at a line's end, and interleaves
/// them. The launch's stdout is then the ranks' lines, in rank order, before what the ranks
/// printed (a panic's message).
fn with_reports(
    np: usize,
    tag: &str,
    mut env: Vec<(&'static str, String)>,
    launch: impl FnOnce(&[(&str, String)]) -> Result<mpirun::Launch, String>,
) -> Result<mpirun::Launch, Failed> {
    let reports = std::env::temp_dir().join(format!("duralumin-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&reports).map_err(|e| format!("{}: {e}", reports.display()))?;
    env.push((mismatch::REPORTS, reports.display().to_string()));
    let launched = launch(&env);
    let lines: String =
        (0..np).filter_map(|r| std::fs::read_to_string(reports.join(format!("rank{r}"))).ok()).collect();
    let _ = std::fs::remove_dir_all(&reports);
    let mut l = launched?;
    l.stdout = format!("{lines}{}", l.stdout);
    Ok(l)
}

/// A case that broke only the time bound. Every other guarantee is about what the library
/// does; the bound is also about the machine: two launches share 2 cores in CI, up to 9 ranks
/// whose MPI waits spin, and a rank that gets no core for seconds ends late through no fault
/// of the library. Such a case must keep the bound when run again alone.
struct Slow {
    case: usize,
    rank: usize,
    ms: u64,
    why: String,
}

/// How a mismatch case (`S` = [`Slow`]) or a fault trial's launch (`S` = the reason) broke
/// its guarantees.
enum CaseFailure<S = Slow> {
    /// Only the time bound.
    Slow(S),
    Broken(String),
}

/// The outcome word and milliseconds of the first line of `stdout` that reads
/// `<prefix><word> <ms>`.
fn outcome_line(stdout: &str, prefix: &str) -> Option<(String, u64)> {
    stdout.lines().find_map(|line| {
        let (word, ms) = line.strip_prefix(prefix)?.split_once(' ')?;
        Some((word.to_string(), ms.trim().parse().ok()?))
    })
}

/// Holds every case of a mismatch launch to the guarantees (see [`check_case`]). Returns a
/// summary of the outcomes and the cases that broke only the time bound.
fn check_mismatch(np: usize, nodes: usize, timeout_s: f64, l: &mpirun::Launch) -> Result<(String, Vec<Slow>), String> {
    let Some(status) = l.status else {
        return Err(format!("still running after {MISMATCH_LIMIT:?}: killed"));
    };
    if !status.success() {
        return Err(format!("the launch failed ({status})"));
    }
    let mut tally: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    // Where a launch's time goes: the slowest rank of each case, and the cases that reached the
    // deadline (nothing found the mismatch before it).
    let (mut total_ms, mut at_deadline, mut worst) = (0u64, 0usize, (0u64, 0usize));
    let mut slow = Vec::new();
    for (i, case) in mismatch::cases(np, nodes).iter().enumerate() {
        let (outcome, slowest) = match check_case(i, case, np, timeout_s, l) {
            Ok(done) => done,
            Err(CaseFailure::Slow(s)) => {
                slow.push(s);
                continue;
            }
            Err(CaseFailure::Broken(why)) => return Err(why),
        };
        *tally.entry(outcome).or_default() += 1;
        total_ms += slowest;
        worst = worst.max((slowest, i));
        at_deadline += usize::from(slowest as f64 >= timeout_s * 1000.0);
    }
    let summary = format!(
        "{tally:?}; cases took {total_ms} ms (slowest rank each), {at_deadline} reached the deadline, the slowest \
         (case {}) {} ms",
        worst.1, worst.0
    );
    Ok((summary, slow))
}

/// Holds case `i` of launch `l` to the guarantees (see `mismatch.rs`): every rank ended it
/// within the deadline plus 5 s; no `Ok` held anything but what its own call asked for (unless
/// the others' call was MPI's own collective of at most 2 KiB, where MPI's own detection is
/// what there is); nothing was written around a buffer; and where a rank got an error, some
/// error names the faulty rank. Returns the outcome's class and the slowest rank's time.
fn check_case(
    i: usize,
    case: &mismatch::Case,
    np: usize,
    timeout_s: f64,
    l: &mpirun::Launch,
) -> Result<(String, u64), CaseFailure> {
    let broken = |why: String| CaseFailure::Broken(format!("case {i} ({case:?}): {why}"));
    let of = |r: usize| outcome_line(&l.stdout, &format!("CASE {i} {r} "));
    if let Some(w) = l.stdout.lines().find(|line| line.starts_with(&format!("WARMUP {i} "))) {
        return Err(broken(format!("the correct call before it failed: {w}")));
    }
    let errs: Vec<&str> = l.stdout.lines().filter_map(|line| line.strip_prefix(&format!("ERR {i} "))).collect();
    let bound = u64::try_from(mismatch::bound(timeout_s).as_millis()).unwrap_or(u64::MAX);
    let mut words = Vec::new();
    let mut slowest = (0, 0);
    for r in 0..np {
        let Some((word, ms)) = of(r) else {
            return Err(broken(format!("rank {r} reported nothing")));
        };
        slowest = slowest.max((ms, r));
        if word == "WRONG" && !case.native_unchecked() {
            return Err(broken(format!("rank {r} returned Ok with data its call did not ask for")));
        }
        if l.stdout.lines().any(|line| line == format!("CANARY {i} {r}")) {
            return Err(broken(format!("rank {r}'s buffer guards were overwritten")));
        }
        words.push(word);
    }
    let k = case.faulty;
    // The faulty rank's own deadline may pass first (a broadcast root, released once its
    // data is staged, goes on waiting on the proxy thread): the others then hear that it
    // gave up, which names it too. Another rank's may, where the faulty rank (short of a core)
    // has yet to find the mismatch: the faulty rank's error then sets its call beside that
    // rank's (as in `run_given_up`), in a line that names it.
    let names = |e: &&str| {
        [format!("rank {k}:"), format!("rank {k} sent"), format!("rank {k} is in"), format!("rank {k} gave up")]
            .iter()
            .any(|needle| e.contains(needle.as_str()))
    };
    let errored = words.iter().any(|w| w != "ok" && w != "WRONG");
    // MPI's own errors do not carry the report (it goes to stderr, where it names the rank).
    let named = case.native_unchecked() || errs.iter().any(names);
    if errored && !named && !(np == 2 && errs.iter().any(|e| e.contains("differs"))) {
        return Err(broken(format!("no error names rank {k}; outcomes {words:?}")));
    }
    let (ms, rank) = slowest;
    if ms > bound {
        let why = format!("case {i} ({case:?}): rank {rank} ended after {ms} ms, beyond {bound} ms");
        return Err(CaseFailure::Slow(Slow { case: i, rank, ms, why }));
    }
    let class = if case.native_unchecked() { "native" } else { "duralumin" };
    let outcome = if errored {
        "error"
    } else if words.iter().any(|w| w == "WRONG") {
        "silent-wrong"
    } else {
        "all-ok"
    };
    Ok((format!("{class}/{outcome}"), ms))
}

/// The faulty rank of the `t`-th trial: each rank in turn. Not rank 0 for another collective:
/// a bcast rooted at the rank that also roots the others' allreduce tree sends exactly the
/// messages they wait for, and MPI completes the mismatch silently (only the signature check
/// sees it; see `docs/reliability.md`).
fn faulty_rank(fault: Fault, np: usize, t: usize) -> usize {
    match t % np {
        0 if fault == Fault::Op => np - 1,
        k => k,
    }
}

fn run(case: Case, sim: Option<&std::path::Path>) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // Abort mode: the stalled rank is killed with the job long before its stall ends.
    let stall = if case.mode == Mode::Abort { 30.0 } else { TIMEOUT_S + 2.0 };
    let mut env = vec![
        ("DURALUMIN_FAULT_PROGRAM", case.backend.to_string()),
        ("FAULT_KIND", case.fault.name().to_string()),
        ("FAULT_RANK", case.rank.to_string()),
        ("FAULT_OP", OP.to_string()),
        ("FAULT_STALL", stall.to_string()),
        ("DURALUMIN_TIMEOUT", TIMEOUT_S.to_string()),
        ("DURALUMIN_ON_TIMEOUT", if case.mode == Mode::Error { "error" } else { "abort" }.to_string()),
        ("DURALUMIN_CHECK", if case.mode == Mode::Check { "1" } else { "0" }.to_string()),
    ];
    if case.backend == "cudasim" {
        let dir = sim.ok_or("the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim")?;
        env.push(("LD_LIBRARY_PATH", mpirun::library_path_with(dir)));
    }
    let launch = mpirun::launch(case.np, &exe, &env, &[], LIMIT)?;
    match check(case, &launch) {
        Ok(()) => Ok(()),
        Err(CaseFailure::Broken(why)) => Err(launch.failure(&format!("{case:?}: {why}")).into()),
        Err(CaseFailure::Slow(why)) => {
            // Everything held but the time bound: the trial must keep it when run again.
            let again = mpirun::launch(case.np, &exe, &env, &[], LIMIT)?;
            match check(case, &again) {
                Ok(()) => {
                    println!("{case:?}: beyond the bound under load ({why}); within it run again");
                    Ok(())
                }
                Err(CaseFailure::Broken(w) | CaseFailure::Slow(w)) => {
                    Err(again.failure(&format!("{case:?}: {why} (and run again: {w})")).into())
                }
            }
        }
    }
}

/// The three assertions of a trial (see the module docs); the time bound's last, so that a
/// launch that broke only it is told apart.
fn check(case: Case, l: &mpirun::Launch) -> Result<(), CaseFailure<String>> {
    let broken = CaseFailure::Broken;
    let Some(status) = l.status else {
        return Err(broken(format!("still running after {LIMIT:?}: killed")));
    };
    let fault_at = l
        .stdout
        .lines()
        .find_map(|line| line.strip_prefix(&format!("FAULT_AT {} ", case.rank))?.trim().parse::<u128>().ok())
        .ok_or_else(|| broken("the faulty rank never reached the fault".into()))?;
    let ended = l.ended.duration_since(UNIX_EPOCH).map_err(|e| broken(e.to_string()))?.as_millis();
    let after = Duration::from_millis(u64::try_from(ended.saturating_sub(fault_at)).unwrap_or(u64::MAX));
    check_outcome(case, l, status).map_err(broken)?;
    // A rank that ends the job while its main thread is inside `MPI_Win_free` (the drop
    // faults) may find `MPI_Abort` blocked behind it, and then ends itself after the abort's
    // grace (`ABORT_GRACE` in host/reliability/abort.rs, 5 s).
    let grace = if matches!(case.fault, Fault::DropOrder | Fault::DropEarly) { 5.0 } else { 0.0 };
    let bound = Duration::from_secs_f64(TIMEOUT_S + 5.0 + grace);
    if after > bound {
        return Err(CaseFailure::Slow(format!("the ranks ended {after:?} after the fault, more than {bound:?}")));
    }
    Ok(())
}

/// What the ranks reported and how the launch ended, held to the fault's guarantees.
fn check_outcome(case: Case, l: &mpirun::Launch, status: std::process::ExitStatus) -> Result<(), String> {
    let (k, n) = (case.rank, case.np);
    let has = |text: &str, needle: &str| text.contains(needle);
    if case.fault == Fault::DropOrder {
        // Under either mode: nothing can interrupt the window's free, so the job ends.
        let ending = match case.mode {
            Mode::Error => "drop #2 timed out and MPI cannot interrupt it, aborting the job",
            _ => "drop #2 timed out, aborting the job (OnTimeout::Abort)",
        };
        let ok = !status.success()
            && has(&l.stderr, &format!("[duralumin rank {}] desync report", case.rank))
            && has(&l.stderr, "drop #2 timed out after")
            && has(&l.stderr, ending);
        return if ok { Ok(()) } else { Err("the job did not end with the drop's report and abort".into()) };
    }
    if case.fault == Fault::DropEarly {
        // The others' report names the faulty rank's drop; the faulty rank, given up while in
        // it, ends the job.
        let ok = !status.success()
            && has(&l.stderr, "allreduce #2 (f32 sum, count 7) timed out after")
            && has(&l.stderr, &format!("rank {}: entered #2 as drop, which differs in op", case.rank))
            && has(&l.stderr, &format!("rank {}: the communicator was given up", case.rank))
            && has(&l.stderr, "while this rank is in drop #2, which MPI cannot interrupt: aborting the job");
        return if ok {
            Ok(())
        } else {
            Err("the job did not end when the ranks gave up a communicator mid-drop".into())
        };
    }
    let result = |r: usize, what: &str| has(&l.stdout, &format!("RESULT {r} {what}"));
    // A report line about rank `k` (or, at 2 ranks, where each rank's call is as common as the
    // other's, a report of the difference from either side).
    let names = |text: &str, line: &str, either: &str| has(text, line) || (n == 2 && has(text, either));
    let entered =
        |as_what: &str, differs: &str| format!("rank {k}: entered #{OP} as {as_what}, which differs in {differs}");
    let hydra = mpirun::launcher(&mpirun::mpirun_program()) == mpirun::Launcher::Hydra;
    match case.mode {
        Mode::Abort => {
            if status.success() {
                return Err("the job was not aborted".into());
            }
            let ok = match case.fault {
                Fault::Stall => has(&l.stderr, &format!("rank {k}: never entered #{OP}")),
                Fault::Panic => has(&l.stderr, &format!("rank {k}: panic, aborting the job")),
                // MPICH's own allreduce finds the longer message and ends the job itself, before
                // the deadline (`docs/cluster.md`).
                Fault::Count if hydra => has(&l.stderr, "Fatal error in internal_Allreduce: Message truncated"),
                Fault::Count => names(
                    &l.stderr,
                    &entered("allreduce (f32 sum, count 8)", "count (8; expected 7)"),
                    "differs in count",
                ),
                Fault::Op => names(
                    &l.stderr,
                    &entered("bcast (f32, count 7, root 0)", "op (expected allreduce)"),
                    "differs in op",
                ),
                Fault::BadArg => has(&l.stderr, &format!("rank {k}: refused its arguments for allreduce #{OP}")),
                Fault::Kill if hydra => killed_under_hydra(l),
                Fault::Kill => has(&l.stderr, &format!("rank {k} with PID")) && has(&l.stderr, "signal 9"),
                Fault::Root => return Err("no abort-mode expectation for a root mismatch".into()),
                Fault::DropOrder | Fault::DropEarly => unreachable!("checked above"),
            };
            if !ok {
                return Err("the output does not name the faulty rank and collective".into());
            }
            let by_duralumin = matches!(case.fault, Fault::Stall | Fault::Op | Fault::BadArg)
                || (case.fault == Fault::Count && !hydra);
            if by_duralumin && !has(&l.stderr, "aborting the job (OnTimeout::Abort)") {
                return Err("no rank said it aborts the job".into());
            }
        }
        Mode::Error => {
            if !status.success() {
                return Err(format!("a rank failed ({status})"));
            }
            for r in 0..n {
                if !result(r, &format!("error at #{OP}")) {
                    return Err(format!("rank {r} did not get an error at #{OP}"));
                }
                if !result(r, "then Aborted") {
                    return Err(format!("rank {r}: the communicator was not given up after the error"));
                }
            }
            let report = match case.fault {
                Fault::Stall => format!("rank {k}: never entered #{OP}"),
                Fault::Op => entered("bcast (f32, count 7, root 0)", "op (expected allreduce)"),
                Fault::BadArg => format!("rank {k}: refused its arguments for allreduce #{OP}"),
                _ => return Err("no error-mode expectation for this fault".into()),
            };
            let others = (0..n).filter(|&r| r != k).collect::<Vec<_>>();
            let timed_out = others.iter().any(|&r| result(r, &format!("error at #{OP}: Timeout")));
            if !timed_out || !names(&l.stdout, &report, "differs in op") {
                return Err(format!("no rank timed out at #{OP} with a report saying {report:?}"));
            }
            match case.fault {
                Fault::Stall if !result(k, &format!("error at #{OP}: Aborted")) => {
                    return Err("the stalled rank's collective did not fail at once".into());
                }
                Fault::BadArg if !result(k, &format!("error at #{OP}: BufferLength")) => {
                    return Err("the rank with bad arguments did not get its own typed error".into());
                }
                _ => {}
            }
        }
        Mode::Check => {
            if !status.success() {
                return Err(format!("a rank failed ({status})"));
            }
            for r in 0..n {
                let own = if r == k && case.fault == Fault::BadArg { "BufferLength" } else { "SignatureMismatch" };
                if !result(r, &format!("error at #{OP}: {own}")) {
                    return Err(format!("rank {r} did not get {own} at #{OP}"));
                }
                if !result(r, "done") {
                    return Err(format!("rank {r}: the collective after the mismatch did not work"));
                }
            }
            let line = match case.fault {
                Fault::Count => entered("allreduce (f32 sum, count 8)", "count (8; expected 7)"),
                Fault::Op => entered("bcast (f32, count 7, root 0)", "op (expected allreduce)"),
                Fault::Root => entered(&format!("bcast (f32, count 7, root {})", 1 % n), "root (1; expected 0)"),
                Fault::BadArg => format!("rank {k}: refused its arguments for allreduce #{OP}"),
                _ => return Err("no check-mode expectation for this fault".into()),
            };
            // Every other rank's error names the faulty one (at 2 ranks, each side's own call
            // wins the tie, so the other rank's error names it).
            for r in (0..n).filter(|&r| r != k) {
                let named = l.stdout.lines().any(|x| x.starts_with(&format!("ERROR {r}| ")) && x.contains(&line));
                if !named {
                    return Err(format!("rank {r}'s error does not say {line:?}"));
                }
            }
        }
    }
    Ok(())
}

/// Whether MPICH's launcher reported a rank killed. It names one process by its PID, not
/// always the killed one (in a trial at 4 ranks it named rank 0's when rank 1 was killed: the
/// others end by the same signal when it cleans up), so only the signal is checked.
fn killed_under_hydra(l: &mpirun::Launch) -> bool {
    l.stdout.contains("BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES") && l.stdout.contains("Killed (signal 9)")
}
