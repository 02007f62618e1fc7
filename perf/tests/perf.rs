//! `duralumin-perf` under `mpirun`: its check mode (`-c 1`) over every operation, operator and
//! algorithm at 1..4 ranks on the Mpi backend and HostTransfer on the host device, and on
//! HostTransfer and NCCL on the CUDA driver simulator (cudasim, ncclsim), reading the rows
//! back from `--json` and `--csv`; a wrong result fails the run; the Chrome trace of a
//! HostTransfer allreduce shows its chunks' steps overlapping; `--plot` draws every series.

#[path = "../../tests/common/mpirun.rs"]
mod mpirun;

use std::path::{Path, PathBuf};
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};
use serde_json::Value;

/// The hard limit of one launch.
const LIMIT: Duration = Duration::from_secs(900);

const OPS: [&str; 17] = [
    "allreduce",
    "reduce",
    "bcast",
    "allgather",
    "allgatherv",
    "reduce_scatter",
    "reduce_scatterv",
    "alltoall",
    "alltoallv",
    "gather",
    "gatherv",
    "scatter",
    "scatterv",
    "sendrecv",
    "multi_sendrecv",
    "send",
    "barrier",
];

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_duralumin-perf"))
}

/// This test program's own scratch directory.
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("duralumin-perf-test-{}", std::process::id()))
}

fn scratch(name: &str) -> PathBuf {
    let dir = scratch_dir();
    let _ = std::fs::create_dir_all(&dir);
    dir.join(name)
}

/// Runs duralumin-perf on `np` ranks with `args` (and `env`), returning the launch.
fn perf(np: usize, args: &[&str], env: &[(&str, String)]) -> Result<mpirun::Launch, Failed> {
    perf_with(&mpirun::mpirun_program(), np, args, env)
}

/// [`perf`] under the launcher `mpirun`.
fn perf_with(mpirun: &str, np: usize, args: &[&str], env: &[(&str, String)]) -> Result<mpirun::Launch, Failed> {
    let l = mpirun::launch_args(mpirun, np, &exe(), env, args, LIMIT)?;
    if l.status.is_none() {
        return Err(l.failure(&format!("duralumin-perf {args:?} at {np} ranks: still running after {LIMIT:?}")).into());
    }
    Ok(l)
}

fn rows(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    match serde_json::from_str::<Value>(&text).map_err(|e| e.to_string())? {
        Value::Array(rows) => Ok(rows),
        other => Err(format!("--json wrote {other}, not a list of rows")),
    }
}

/// Every operation of every backend in `backends` has rows, and none has a wrong element.
fn check_rows(rows: &[Value], backends: &[&str]) -> Result<(), String> {
    for b in backends {
        for op in OPS {
            if !rows.iter().any(|r| r["backend"] == *b && r["op"] == op) {
                return Err(format!("no {op} row for {b}"));
            }
        }
    }
    for r in rows {
        for key in ["size", "count", "type", "redop", "root", "time", "algbw", "busbw", "wrong"] {
            if r.get(key).is_none() {
                return Err(format!("a row without '{key}': {r}"));
            }
        }
        if r["wrong"] != 0 || r.get("ip_wrong").is_some_and(|w| !w.is_null() && *w != 0) {
            return Err(format!("wrong elements: {r}"));
        }
    }
    Ok(())
}

/// The check mode over everything at `np` ranks on `backends` (`device`), elements of `dtype`,
/// with the flags `extra`.
fn check(
    np: usize,
    backends: &'static str,
    device: &'static str,
    (dtype, extra): (&'static str, &'static [&'static str]),
    env: Vec<(&'static str, String)>,
) -> Result<(), Failed> {
    check_with(&mpirun::mpirun_program(), np, backends, device, (dtype, extra), env)
}

/// [`check`] under the launcher `mpirun`.
fn check_with(
    mpirun: &str,
    np: usize,
    backends: &'static str,
    device: &'static str,
    (dtype, extra): (&'static str, &'static [&'static str]),
    env: Vec<(&'static str, String)>,
) -> Result<(), Failed> {
    // Trials run at once: the launcher's name keeps the cluster's files apart from the
    // same rank count's on one host.
    let launcher = Path::new(mpirun).file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let name = format!("{backends}-{device}-np{np}-{launcher}{}", extra.concat());
    let (json, csv) = (scratch(&format!("{name}.json")), scratch(&format!("{name}.csv")));
    let (j, c) = (json.display().to_string(), csv.display().to_string());
    let args = [
        "-o",
        "all",
        "--redop",
        "all",
        "--algorithm",
        "all",
        "-d",
        dtype,
        "-b",
        "4",
        "-e",
        "64K",
        "-f",
        "16",
        "-n",
        "1",
        "-w",
        "0",
        "-c",
        "1",
        "-r",
        "0",
        "--backend",
        backends,
        "--device",
        device,
        "--json",
        &j,
        "--csv",
        &c,
    ];
    let args: Vec<&str> = args.iter().chain(extra).copied().collect();
    let l = perf_with(mpirun, np, &args, &env)?;
    if !l.status.is_some_and(|s| s.success()) {
        return Err(l.failure(&format!("duralumin-perf failed at {np} ranks")).into());
    }
    let rows = rows(&json)?;
    check_rows(&rows, &backends.split(',').collect::<Vec<_>>()).map_err(|e| l.failure(&e))?;
    let csv_lines = std::fs::read_to_string(&csv)?.lines().count();
    if csv_lines != rows.len() + 1 {
        return Err(format!("--csv has {csv_lines} lines for {} rows", rows.len()).into());
    }
    if extra.windows(2).any(|w| w == ["-z", "0"])
        && backends.contains("mpi")
        && !l.stdout.contains("non-blocking calls")
    {
        return Err(l.failure("-z 0 did not run the Mpi backend's non-blocking calls").into());
    }
    if !l.stdout.contains("# Avg bus bandwidth") || !l.stdout.contains("#wrong") {
        return Err(l.failure("the table lacks nccl-tests' columns or closing lines").into());
    }
    Ok(())
}

/// A wrong element makes the exit code 1 and the row say so.
fn wrong_fails() -> Result<(), Failed> {
    let json = scratch("wrong.json");
    let j = json.display().to_string();
    let env = [("DURALUMIN_PERF_CORRUPT", "1".to_string())];
    let l = perf(2, &["-b", "64", "-e", "64", "-n", "1", "-w", "0", "--json", &j], &env)?;
    if l.status.and_then(|s| s.code()) != Some(1) {
        return Err(l.failure("a wrong result did not make the exit code 1").into());
    }
    let rows = rows(&json)?;
    if rows.first().map(|r| r["wrong"].clone()) != Some(Value::from(1)) || !l.stdout.contains("FAILED") {
        return Err(l.failure("the wrong element is not in the row and the summary").into());
    }
    Ok(())
}

/// The begin/end times of the trace's step spans named `name`, per chunk, in the asynchronous
/// slice `id` (the operation's).
fn steps(events: &[Value], id: &Value, name: &str) -> Vec<(u64, f64, f64)> {
    let mut open: Vec<(u64, f64)> = Vec::new();
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e["id"] == *id && e["name"] == name) {
        let ts = e["ts"].as_f64().unwrap_or(0.0);
        match e["ph"].as_str() {
            Some("b") => {
                let chunk = e["args"]["chunk"].as_str().and_then(|c| c.parse().ok()).unwrap_or(u64::MAX);
                open.push((chunk, ts));
            }
            Some("e") if !open.is_empty() => {
                // Slices of one name close in the order they opened.
                let (chunk, begin) = open.remove(0);
                out.push((chunk, begin, ts));
            }
            _ => {}
        }
    }
    out
}

/// One rank's Chrome trace of 8 MiB HostTransfer and NCCL allreduces on cudasim and ncclsim:
/// each operation's span carries its fields, on both backends; a HostTransfer operation's
/// chunks' `stage`, `mpi` and `unstage` spans are there, and one chunk's MPI part overlaps
/// another chunk's copies.
fn trace_chunks(sim: PathBuf) -> Result<(), Failed> {
    let trace = scratch("trace.json");
    let t = trace.display().to_string();
    let env = [("LD_LIBRARY_PATH", mpirun::library_path_with(&sim))];
    let args = [
        "-b",
        "8M",
        "-e",
        "8M",
        "-n",
        "2",
        "-w",
        "0",
        "--backend",
        "host-transfer,nccl",
        "--device",
        "cuda",
        "--trace",
        &t,
    ];
    let l = perf(2, &args, &env)?;
    if !l.status.is_some_and(|s| s.success()) {
        return Err(l.failure("duralumin-perf --trace failed").into());
    }
    let events: Vec<Value> = match serde_json::from_str(&std::fs::read_to_string(&trace)?)? {
        Value::Array(v) => v,
        _ => return Err("the trace is not a list of events".into()),
    };
    if !trace.with_file_name("trace.rank1.json").is_file() {
        return Err("rank 1 wrote no trace".into());
    }
    let op = events
        .iter()
        .find(|e| e["name"] == "allreduce" && e["ph"] == "b" && e["args"]["bytes"] == "8388608")
        .ok_or("no allreduce span of 8 MiB")?;
    for field in ["element", "operator", "algorithm", "comm", "seq"] {
        if op["args"].get(field).is_none() {
            return Err(format!("the operation's span lacks '{field}': {op}").into());
        }
    }
    // The NCCL backend's operations too: their spans name another communicator.
    let comms: std::collections::BTreeSet<String> = events
        .iter()
        .filter(|e| e["name"] == "allreduce" && e["ph"] == "b" && e["args"]["bytes"] == "8388608")
        .map(|e| e["args"]["comm"].to_string())
        .collect();
    if comms.len() < 2 {
        return Err(
            format!("8 MiB allreduce spans of {} communicator(s), not HostTransfer's and NCCL's", comms.len()).into()
        );
    }
    let id = &op["id"];
    let (stage, mpi, unstage) = (steps(&events, id, "stage"), steps(&events, id, "mpi"), steps(&events, id, "unstage"));
    if mpi.len() < 2 || stage.len() != mpi.len() || unstage.len() != mpi.len() {
        return Err(format!(
            "{} stage, {} mpi, {} unstage spans in the first operation",
            stage.len(),
            mpi.len(),
            unstage.len()
        )
        .into());
    }
    let overlaps = |a: &(u64, f64, f64), b: &(u64, f64, f64)| a.0 != b.0 && a.1 < b.2 && b.1 < a.2;
    let copies_during_mpi = mpi.iter().any(|m| stage.iter().chain(&unstage).any(|c| overlaps(m, c)));
    if !copies_during_mpi {
        return Err(format!(
            "no chunk's copies overlap another's MPI part: mpi {mpi:?}, stage {stage:?}, unstage {unstage:?}"
        )
        .into());
    }
    Ok(())
}

/// `--nvtx` under an NVTX injection library standing in for Nsight Systems
/// (`nvtx_inject.c`, built here with the C compiler Rust links with): on each of 2 ranks, an
/// 8 MiB HostTransfer allreduce on cudasim is a range in the `duralumin` domain named with its
/// fields, its chunks' `stage`, `mpi` and `unstage` steps are ranges too, and every range that
/// starts ends.
fn nvtx_ranges(sim: PathBuf) -> Result<(), Failed> {
    let (lib, log) = (scratch("libnvtx_inject.so"), scratch("nvtx"));
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/nvtx_inject.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = std::process::Command::new(&cc).args(["-shared", "-fPIC", "-O1", "-o"]).arg(&lib).arg(&src).output()?;
    if !built.status.success() {
        return Err(format!("{cc} {}: {}", src.display(), String::from_utf8_lossy(&built.stderr)).into());
    }
    let env = [
        ("NVTX_INJECTION64_PATH", lib.display().to_string()),
        ("NVTX_TEST_LOG", log.display().to_string()),
        ("LD_LIBRARY_PATH", mpirun::library_path_with(&sim)),
    ];
    let args =
        ["-b", "8M", "-e", "8M", "-n", "1", "-w", "0", "--backend", "host-transfer", "--device", "cuda", "--nvtx"];
    let l = perf(2, &args, &env)?;
    if !l.status.is_some_and(|s| s.success()) {
        return Err(l.failure("duralumin-perf --nvtx failed").into());
    }
    let logs: Vec<PathBuf> = std::fs::read_dir(scratch_dir())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("nvtx.")))
        .collect();
    if logs.len() != 2 {
        return Err(l.failure(&format!("{} ranks' NVTX logs, not 2: was the injection loaded?", logs.len())).into());
    }
    for path in logs {
        let text = std::fs::read_to_string(&path)?;
        let starts: Vec<(&str, &str)> =
            text.lines().filter_map(|l| l.strip_prefix("start ")).filter_map(|l| l.split_once(' ')).collect();
        let ends: std::collections::BTreeSet<&str> = text.lines().filter_map(|l| l.strip_prefix("end ")).collect();
        let named = |name: &str| starts.iter().filter(|(_, m)| m.starts_with(&format!("duralumin {name} "))).count();
        if !starts.iter().any(|(_, m)| m.starts_with("duralumin allreduce ") && m.contains("bytes=8388608")) {
            return Err(format!("{}: no range of the 8 MiB allreduce:\n{text}", path.display()).into());
        }
        if ["stage", "mpi", "unstage"].iter().any(|n| named(n) < 2) {
            return Err(
                format!("{}: fewer than 2 chunks' stage, mpi and unstage ranges:\n{text}", path.display()).into()
            );
        }
        if let Some((id, m)) = starts.iter().find(|(id, _)| !ends.contains(id)) {
            return Err(format!("{}: range {id} ({m}) never ends", path.display()).into());
        }
    }
    Ok(())
}

/// `--plot` draws a line per backend and algorithm, and the native one.
fn plot() -> Result<(), Failed> {
    let svg = scratch("plot.svg");
    let s = svg.display().to_string();
    let args = [
        "-b",
        "1K",
        "-e",
        "64K",
        "-f",
        "8",
        "-n",
        "2",
        "-w",
        "0",
        "--algorithm",
        "ring,native",
        "--native",
        "--plot",
        &s,
    ];
    let l = perf(2, &args, &[])?;
    if !l.status.is_some_and(|s| s.success()) {
        return Err(l.failure("duralumin-perf --plot failed").into());
    }
    let text = std::fs::read_to_string(&svg)?;
    for label in ["mpi ring", "mpi native", "native MPI"] {
        if !text.contains(label) {
            return Err(format!("the plot has no '{label}' line").into());
        }
    }
    Ok(())
}

/// Runs duralumin-perf as `program` with `args`, and holds it to the refusal of a task that is
/// alone in its MPI world although its launcher started `tasks`: exit code 3 with the
/// library's reason, and no rows.
fn refused(mut program: std::process::Command, tasks: usize) -> Result<(), Failed> {
    const LIMIT: Duration = Duration::from_secs(120);
    program.env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    let ran = mpirun::run_within(program, LIMIT, "scripts/setup.sh installs the launchers")?;
    let Some(status) = ran.status else {
        return Err(format!("not refused: still running after {LIMIT:?}").into());
    };
    let reason = format!("{tasks} separate MPI jobs");
    if status.code() != Some(3) || !ran.stderr.contains(&reason) || ran.stdout.contains("allreduce") {
        return Err(format!("not refused: {status}\nstdout:\n{}\nstderr:\n{}", ran.stdout, ran.stderr).into());
    }
    Ok(())
}

/// A task started by Slurm's task starter (a shell named `slurmstepd` here) in a step of 2
/// tasks, alone in its MPI world (`srun --mpi=none`).
fn unwired_step_refused() -> Result<(), Failed> {
    let starter = scratch("slurmstepd");
    let _ = std::fs::remove_file(&starter);
    std::os::unix::fs::symlink("/bin/sh", &starter)?;
    let mut sh = std::process::Command::new(&starter);
    // The shell forks the program (it is not the last command), so the shell is its parent.
    sh.args(["-c", "\"$@\"; exit $?", "sh"]).arg(exe()).args(["-b", "8", "-e", "8", "-n", "1", "-w", "0"]);
    sh.env("SLURM_STEP_NUM_TASKS", "2").env("SLURM_PROCID", "1");
    refused(sh, 2)
}

/// This build (Open MPI's) launched by MPICH's mpiexec at 2 ranks: each rank is a singleton.
fn mismatched_mpiexec_refused(mpiexec: PathBuf) -> Result<(), Failed> {
    let mut c = std::process::Command::new(mpiexec);
    c.args(["-n", "2"]).arg(exe()).args(["-b", "8", "-e", "8", "-n", "1", "-w", "0"]);
    refused(c, 2)
}

/// Why `scripts/SCRIPT check` says its launcher cannot run here, if it says so.
fn unavailable(script: &str) -> Option<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(script);
    match std::process::Command::new(&path).arg("check").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("{}: {} ({})", script, String::from_utf8_lossy(&out.stderr).trim(), out.status)),
        Err(e) => Some(format!("cannot run {}: {e}", path.display())),
    }
}

/// The check mode at 4 ranks on Mpi and HostTransfer (host device) under the launcher
/// `scripts/WRAPPER`, which `scripts/SCRIPT` runs: ignored where that cannot run here, unless
/// the variable `require` is 1.
fn launcher_trial(
    name: &str,
    (script, wrapper, require): (&str, &'static str, &str),
    dtype: &'static str,
    env: Vec<(&'static str, String)>,
) -> Trial {
    let why = unavailable(script);
    let ignored = why.is_some() && !std::env::var(require).is_ok_and(|v| v == "1");
    Trial::test(name, move || {
        if let Some(why) = why {
            return Err(why.into());
        }
        let launcher = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(wrapper);
        check_with(&launcher.display().to_string(), 4, "mpi,host-transfer", "host", (dtype, &[]), env)
    })
    .with_ignored_flag(ignored)
}

fn main() {
    let args = Arguments::from_args();
    let sim = mpirun::cudasim_dir();
    let sim_required = std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1");
    let no_sim = sim.is_none() && !sim_required;
    let dtypes = ["int8", "float", "bfloat16", "uint64"];
    let mut trials = Vec::new();
    for np in 1..=4 {
        let dtype = dtypes[np - 1];
        trials.push(Trial::test(format!("check_host_np{np}"), move || {
            check(np, "mpi,host-transfer", "host", (dtype, &[]), vec![])
        }));
        // The Mpi backend's non-blocking calls, 3 started at once (and MPI's own, likewise).
        trials.push(Trial::test(format!("check_nonblocking_np{np}"), move || {
            check(np, "mpi", "host", (dtype, &["-z", "0", "-n", "3", "--native"]), vec![])
        }));
        let dir = sim.clone();
        let trial = Trial::test(format!("check_cudasim_np{np}"), move || {
            let dir = dir.ok_or("cudasim is not built (cargo build --release -p duralumin-cudasim)")?;
            let env = vec![("LD_LIBRARY_PATH", mpirun::library_path_with(&dir))];
            check(np, "host-transfer,nccl", "cuda", (dtype, &[]), env)
        });
        trials.push(trial.with_ignored_flag(no_sim));
    }
    // On two simulated hosts of two ranks (the hierarchical algorithms included), and launched
    // by srun (PMIx) on a private one-node Slurm, as a cluster's users launch it.
    let cluster = ("cluster.sh", "cluster-mpirun", "DURALUMIN_REQUIRE_CLUSTER");
    trials.push(launcher_trial("check_cluster_2x2", cluster, "double", vec![("DURALUMIN_CLUSTER", "2x2".into())]));
    let slurm = ("slurm.sh", "slurm-srun", "DURALUMIN_REQUIRE_SLURM");
    trials.push(launcher_trial("check_srun_np4", slurm, "int32", vec![]));
    trials.push(Trial::test("unwired_step_refused", unwired_step_refused));
    let mpich = PathBuf::from(std::env::var("DURALUMIN_MPICH_DIR").unwrap_or_else(|_| "/opt/duralumin/mpich".into()))
        .join("bin/mpiexec");
    let no_mpich = !mpich.is_file();
    let trial = Trial::test("mismatched_mpiexec_refused", move || {
        if !mpich.is_file() {
            return Err(format!("{} is not installed (scripts/setup.sh installs it)", mpich.display()).into());
        }
        mismatched_mpiexec_refused(mpich)
    });
    trials.push(trial.with_ignored_flag(no_mpich && !std::env::var("DURALUMIN_REQUIRE_MPICH").is_ok_and(|v| v == "1")));
    trials.push(Trial::test("wrong_result_fails", wrong_fails));
    let dir = sim.clone();
    let trial = Trial::test("trace_shows_chunks_overlapping", move || {
        trace_chunks(dir.ok_or("cudasim is not built (cargo build --release -p duralumin-cudasim)")?)
    });
    trials.push(trial.with_ignored_flag(no_sim));
    trials.push(Trial::test("plot_draws_every_series", plot));
    let dir = sim.clone();
    let trial = Trial::test("nvtx_ranges_under_an_injection", move || {
        nvtx_ranges(dir.ok_or("cudasim is not built (cargo build --release -p duralumin-cudasim)")?)
    });
    trials.push(trial.with_ignored_flag(no_sim));
    let status = libtest_mimic::run(&args, trials);
    let _ = std::fs::remove_dir_all(scratch_dir());
    status.exit();
}
