//! Starting a test binary's rank program under `mpirun` with a hard limit, shared by the test
//! binaries through `#[path]`. A launch that outruns its limit is killed with its whole process
//! group (mpirun and every rank: killing mpirun alone can leave ranks running) and reported as
//! such. Either way, a failed launch's message leads with where each rank was ([`rank_case`]).

#![allow(dead_code)]

#[path = "rank_case.rs"]
pub mod rank_case;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime};

/// How a launch ended.
#[derive(Debug)]
pub struct Launch {
    /// `None`: killed at the limit.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    /// When mpirun exited (or was killed).
    pub ended: SystemTime,
    pub elapsed: Duration,
    /// Where each rank was when the launch ended, from the ranks' records: a line (or, for a
    /// panic's message, lines) per rank that panicked, then one per rank that did not and
    /// per thread of it in a frame (see [`rank_case::Records::read`]). Empty for rank programs
    /// that do not call [`rank_case::start`].
    pub ranks: Vec<String>,
}

impl Launch {
    /// The whole output, for failure messages.
    pub fn output(&self) -> String {
        format!("--- stdout\n{}\n--- stderr\n{}", self.stdout, self.stderr)
    }

    /// A failure message: where each rank was, then `headline`, then the whole output, then
    /// `headline` again (a log that keeps only the tail of a long output still says what failed).
    pub fn failure(&self, headline: &str) -> String {
        let mut s = String::new();
        for r in &self.ranks {
            s.push_str(r);
            s.push('\n');
        }
        format!("{s}{headline}\n{}\n--- failed: {headline}", self.output())
    }
}

/// The mpirun to use: `DURALUMIN_MPIRUN` (another MPI's, say), else the one on the path.
pub fn mpirun_program() -> String {
    std::env::var("DURALUMIN_MPIRUN").unwrap_or_else(|_| "mpirun".into())
}

/// Runs `exe` on `np` ranks with `env` set (and `extra` mpirun arguments), for at most `limit`.
pub fn launch(
    np: usize,
    exe: &std::path::Path,
    env: &[(&str, String)],
    extra: &[&str],
    limit: Duration,
) -> Result<Launch, String> {
    launch_with(&mpirun_program(), np, exe, env, extra, limit)
}

/// [`launch`] with the `mpirun` program to use.
pub fn launch_with(
    mpirun: &str,
    np: usize,
    exe: &std::path::Path,
    env: &[(&str, String)],
    extra: &[&str],
    limit: Duration,
) -> Result<Launch, String> {
    launch_program(mpirun, np, exe, &[], env, extra, limit)
}

/// [`launch_with`] of a program that takes arguments of its own (`args`, after it).
pub fn launch_args(
    mpirun: &str,
    np: usize,
    exe: &std::path::Path,
    env: &[(&str, String)],
    args: &[&str],
    limit: Duration,
) -> Result<Launch, String> {
    launch_program(mpirun, np, exe, args, env, &[], limit)
}

fn launch_program(
    mpirun: &str,
    np: usize,
    exe: &std::path::Path,
    args: &[&str],
    env: &[(&str, String)],
    extra: &[&str],
    limit: Duration,
) -> Result<Launch, String> {
    let records = rank_case::Records::new()?;
    let (var, dir) = records.env();
    let mut cmd = command(mpirun, np, exe, extra);
    cmd.args(args).env("OMPI_MCA_mpi_yield_when_idle", "1").env(var, dir).envs(env.iter().map(|(k, v)| (k, v)));
    let Ran { status, stdout, stderr, ended, elapsed } = run_within(cmd, limit, "is openmpi-bin installed?")?;
    // Every rank is gone (the group was killed): their records are complete.
    let ranks = records.read(np);
    Ok(Launch { status, stdout, stderr, ended, elapsed, ranks })
}

/// How a program [`run_within`] its limit ended.
#[derive(Debug)]
pub struct Ran {
    /// `None`: killed at the limit.
    pub status: Option<ExitStatus>,
    pub stdout: String,
    pub stderr: String,
    /// When it exited (or was killed).
    pub ended: SystemTime,
    pub elapsed: Duration,
}

/// Runs `cmd` in a process group of its own, its output read as it comes, for at most
/// `limit`; then kills the group: at the limit that ends the job, and otherwise processes that
/// outlive the program (ranks that outlive mpirun should not) must not hold the output pipes
/// open. `hint` follows the error if the program cannot be started.
pub fn run_within(mut cmd: Command, limit: Duration, hint: &str) -> Result<Ran, String> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start {} ({hint}): {e}", cmd.get_program().to_string_lossy()))?;
    let group = i32::try_from(child.id()).map_err(|e| e.to_string())?;
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
    let start = Instant::now();
    let status = wait_for(&mut child, limit)?;
    let (ended, elapsed) = (SystemTime::now(), start.elapsed());
    // SAFETY: sends SIGKILL to the process group this run made; touches no memory.
    unsafe { libc::kill(-group, libc::SIGKILL) };
    if status.is_none() {
        let _ = child.wait();
    }
    let stdout = out_reader.join().unwrap_or_default();
    let stderr = err_reader.join().unwrap_or_default();
    Ok(Ran { status, stdout, stderr, ended, elapsed })
}

/// Which launcher a `mpirun` program is: MPICH's Hydra (MPICH, and the MPIs of its ABI), Open
/// MPI's (4's ORTE, 5's PRRTE) or Slurm's `srun`. They take different flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    Hydra,
    OpenMpi,
    Slurm,
}

/// The launcher `mpirun` is: `srun` by its name (or `scripts/slurm-srun`, which runs it on a
/// private Slurm), else from its `--version` (asked once per
/// program named `mpirun` or `mpiexec`; any other, such as `scripts/cluster-mpirun`, wraps Open
/// MPI's).
pub fn launcher(mpirun: &str) -> Launcher {
    let name = std::path::Path::new(mpirun).file_name().map(|n| n.to_string_lossy().into_owned());
    if name.as_deref().is_some_and(|n| n.ends_with("srun")) {
        return Launcher::Slurm;
    }
    if !name.is_some_and(|n| n.starts_with("mpirun") || n.starts_with("mpiexec")) {
        return Launcher::OpenMpi;
    }
    static SEEN: std::sync::Mutex<Vec<(String, Launcher)>> = std::sync::Mutex::new(Vec::new());
    let mut seen = SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some((_, l)) = seen.iter().find(|(p, _)| p == mpirun) {
        return *l;
    }
    let out = Command::new(mpirun).arg("--version").stdin(Stdio::null()).output();
    let hydra = out.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("HYDRA"));
    let l = if hydra { Launcher::Hydra } else { Launcher::OpenMpi };
    seen.push((mpirun.to_string(), l));
    l
}

/// `mpirun -np np [extra] exe`, allowed to run as root (Open MPI 4's and 5's runtimes both ask),
/// with `--oversubscribe` (fewer cores than ranks) and no binding (ranks share the cores).
/// Under Hydra (MPICH), which neither asks about root nor counts slots: `-np` and no binding.
/// Under `srun`: see [`Launcher::Slurm`]'s arguments below.
///
/// The job ends with the thread that started it: `mpirun` (or the cluster script, which tears
/// its cluster down) gets SIGTERM if the launching program is killed, rather than leaving the
/// ranks running.
pub fn command(mpirun: &str, np: usize, exe: &std::path::Path, extra: &[&str]) -> Command {
    let mut c = Command::new(mpirun);
    // SAFETY: runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed: `prctl(PR_SET_PDEATHSIG)` is a plain system call that sets one flag on this
    // process; nothing is allocated or locked.
    unsafe {
        c.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    match launcher(mpirun) {
        Launcher::Hydra => c.args(["-bind-to", "none", "-np", &np.to_string()]),
        Launcher::OpenMpi => c.args(["--oversubscribe", "--bind-to", "none", "-np", &np.to_string()]),
        // More tasks than CPUs, the step ended when one task fails, and the PMI Open MPI and
        // MPICH-with-PMIx take (`DURALUMIN_SRUN_MPI=pmi2` for MPICH's own).
        Launcher::Slurm => c.args([
            "--overcommit",
            "--kill-on-bad-exit=1",
            &format!("--mpi={}", std::env::var("DURALUMIN_SRUN_MPI").unwrap_or_else(|_| "pmix".into())),
            "-n",
            &np.to_string(),
        ]),
    };
    c.args(extra)
        .arg(exe)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        // Open MPI 5 (the wheel the GPU script and the ULFM test bring) asks its runtime the same.
        .env("PRTE_ALLOW_RUN_AS_ROOT", "1")
        .env("PRTE_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
    c
}

/// Waits for `child` at most `limit`: its status, or `None` if it is still running then (the
/// caller ends it).
pub fn wait_for(child: &mut Child, limit: Duration) -> Result<Option<ExitStatus>, String> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().map_err(|e| format!("wait: {e}"))? {
            return Ok(Some(status));
        }
        if start.elapsed() > limit {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A directory holding the CUDA driver simulator as `libcuda.so` and `libnccl.so.2` (`target/<profile>/cudasim/`, a
/// link to the `libduralumin_cudasim.so` built with this test binary's profile), if it was built.
/// Only the simulator's trials get it on their library path.
pub fn cudasim_dir() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    // target/<profile>/deps/<test>-<hash> -> target/<profile>
    let profile = exe.parent()?.parent()?;
    let lib = profile.join("libduralumin_cudasim.so");
    if !lib.is_file() {
        return None;
    }
    let dir = profile.join("cudasim");
    // The simulator is the CUDA driver and, under NCCL's name, NCCL (ncclsim): one file, so
    // NCCL's work runs on the driver's streams and memory.
    for name in ["libcuda.so", "libnccl.so.2"] {
        let link = dir.join(name);
        if !link.exists() {
            std::fs::create_dir_all(&dir).ok()?;
            // Another launcher may have made it meanwhile.
            let _ = std::os::unix::fs::symlink(&lib, &link);
        }
    }
    ["libcuda.so", "libnccl.so.2"].iter().all(|n| dir.join(n).exists()).then_some(dir)
}

/// `LD_LIBRARY_PATH` with `dir` first.
pub fn library_path_with(dir: &std::path::Path) -> String {
    match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    }
}
