//! Elastic data-parallel training: linear regression by SGD on synthetic data, in fixed point
//! so that every run, whatever ranks it lost or gained, ends with the same model bit for bit.
//! Ranks may die (SIGKILL) at any point: the job rolls back to the last commit, spawns
//! replacements that get the model from the peers' memory, and goes on
//! ([`duralumin::elastic`], `docs/elastic.md`). Prints the loss and every membership change;
//! at the end each rank checks its model against a failure-free run replayed on one process.
//!
//! Needs Open MPI 5 with ULFM (README, "Elastic jobs"):
//! `mpirun --with-ft ulfm --mca async_mpi_finalize 1 --prtemca state_base_recoverable 1
//! --oversubscribe -np 4 target/debug/examples/07-elastic-training`.
//!
//! Settings (environment):
//! - `DURALUMIN_ELASTIC_KILL=<who>@<where>[,...]`: `who` a slot (worker number) or `joiner`;
//!   `where` `step:N` (a thread kills the rank 1 ms into step N's allreduce), `commit:N`
//!   (inside the commit before step N), or a recovery stage (`shrunk`, `spawned`, `merged`,
//!   `planned`, `transferred`). Each fires once per job (markers in `DURALUMIN_ELASTIC_MARKS`).
//! - `DURALUMIN_ELASTIC_FAIL=<slot>@<step>`: that slot's step returns `Error::Revoked` once,
//!   as if a peer had died, though none did (every rank rolls back and goes on; without ULFM
//!   the recovery stops with `Error::Unsupported`).
//! - `DURALUMIN_ELASTIC_GROW=<size>@<step>`: the discovery callback asks for `size` ranks from
//!   that step on (fewer than the job has: the highest slots leave).
//! - `DURALUMIN_ELASTIC_RESPAWN=0`: shrink only. `DURALUMIN_ELASTIC_PROGRAM`: what to spawn
//!   (a program that does not exist: the runtime refuses, and the job goes on smaller). `DURALUMIN_ELASTIC_STEPS`,
//!   `DURALUMIN_ELASTIC_DIM` (model size).
//! - `DURALUMIN_ELASTIC_BACKEND=mpi|host-transfer|cuda|nccl` (the last two on a GPU or
//!   cudasim).

#![allow(
    clippy::cast_possible_wrap,
    reason = "the fixed-point values, sample indices and dimensions are far below 2^63"
)]

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use duralumin::elastic::{Elastic, Event, Member, Policy, State, StatePart, Step};
use duralumin::{MpiCommunicator, Result, Sum};

/// Fixed point: values are multiples of 2^-24.
const ONE: i64 = 1 << 24;
/// Global batch per step, split over the ranks.
const BATCH: u64 = 64;

/// The model (global) and this worker's data cursor (local).
struct Training {
    weights: Vec<i64>,
    /// `[first step this slot ran, a hash chain over the steps it ran]`.
    cursor: [u64; 2],
}

impl State for Training {
    fn global(&mut self) -> Vec<&mut dyn StatePart> {
        vec![&mut self.weights]
    }
    fn local(&mut self) -> Vec<&mut dyn StatePart> {
        vec![&mut self.cursor]
    }
}

/// A communicator that sums `i64` vectors of host memory, whatever backend it is.
trait Summer: Member {
    fn sum(&mut self, v: &[i64]) -> Result<Vec<i64>>;
}

impl Summer for MpiCommunicator {
    fn sum(&mut self, v: &[i64]) -> Result<Vec<i64>> {
        let mut out = vec![0; v.len()];
        self.allreduce(v, &mut out, Sum)?;
        Ok(out)
    }
}

/// HostTransfer on the host device (a stand-in for a GPU).
struct HostTransfer {
    comm: duralumin::HostTransferCommunicator<duralumin::device::cpu::HostDevice>,
    dev: duralumin::device::cpu::HostDevice,
}

impl Member for HostTransfer {
    fn give_up(&self) -> Result<()> {
        self.comm.give_up()
    }
    fn return_errors(&mut self, timeout: Duration) {
        self.comm.return_errors(timeout);
    }
}

impl Summer for HostTransfer {
    fn sum(&mut self, v: &[i64]) -> Result<Vec<i64>> {
        let mut buf = self.dev.upload(v)?;
        self.comm.allreduce_in_place(&mut buf, Sum)?;
        self.comm.synchronize()?;
        self.dev.download(&buf)
    }
}

#[cfg(feature = "cuda")]
mod gpu {
    use super::*;
    use duralumin::cudarc::driver::CudaStream;
    use std::sync::Arc;

    /// HostTransfer or NCCL on a CUDA device.
    pub struct Gpu<C> {
        pub comm: C,
        pub stream: Arc<CudaStream>,
    }

    impl<C: Member> Member for Gpu<C> {
        fn give_up(&self) -> Result<()> {
            self.comm.give_up()
        }
        fn return_errors(&mut self, timeout: Duration) {
            self.comm.return_errors(timeout);
        }
    }

    fn device_err(e: duralumin::cudarc::driver::DriverError) -> duralumin::Error {
        duralumin::Error::Progress(if e.0 as u32 == 0 { "cuda" } else { "a CUDA copy failed" })
    }

    impl Summer for Gpu<duralumin::HostTransferCommunicator<duralumin::device::cuda::CudaDevice>> {
        fn sum(&mut self, v: &[i64]) -> Result<Vec<i64>> {
            let mut buf = self.stream.clone_htod(v).map_err(device_err)?;
            self.comm.allreduce_in_place(&mut buf, Sum)?;
            self.comm.synchronize()?;
            self.stream.clone_dtoh(&buf).map_err(device_err)
        }
    }

    impl Summer for Gpu<duralumin::NcclCommunicator<duralumin::device::cuda::CudaDevice>> {
        fn sum(&mut self, v: &[i64]) -> Result<Vec<i64>> {
            let mut buf = self.stream.clone_htod(v).map_err(device_err)?;
            self.comm.allreduce_in_place(&mut buf, Sum)?;
            self.comm.synchronize()?;
            self.stream.clone_dtoh(&buf).map_err(device_err)
        }
    }
}

fn main() -> Result<()> {
    let universe = duralumin::init()?;
    let joined = duralumin::elastic::is_spawned()?;
    let settings = Settings::from_env(joined);
    // The slot this rank holds, for the kill points the observer sees.
    let slot = Rc::new(Cell::new(None::<u64>));
    let mut job = Elastic::new(&universe, settings.policy(slot.clone()))?;
    let dim = settings.dim;
    let mut state = Training { weights: vec![0; dim], cursor: [u64::MAX, 0] };
    let backend = std::env::var("DURALUMIN_ELASTIC_BACKEND").unwrap_or_else(|_| "mpi".into());
    let steps = settings.steps;
    let run = |job: &mut Elastic, state: &mut Training| -> Result<_> {
        let step = |c: &mut dyn Summer, s: &mut Training, at: Step| train_step(c, s, at, &settings, &slot);
        match backend.as_str() {
            "mpi" => job.run(state, steps, MpiCommunicator::new, |c, s, at| step(c, s, at)),
            "host-transfer" => {
                let dev = duralumin::device::cpu::HostDevice::new(0);
                let make = |w: &_| {
                    let comm = duralumin::HostTransferCommunicator::new(w, dev.clone(), dev.stream()?)?;
                    Ok(HostTransfer { comm, dev: dev.clone() })
                };
                job.run(state, steps, make, |c, s, at| step(c, s, at))
            }
            #[cfg(feature = "cuda")]
            "cuda" | "nccl" => {
                let ctx = duralumin::cudarc::driver::CudaContext::new(0)
                    .map_err(|_| duralumin::Error::Unsupported("no CUDA device (or cudasim)"))?;
                let stream = ctx.new_stream().map_err(|_| duralumin::Error::Unsupported("no CUDA stream"))?;
                if backend == "cuda" {
                    let make = |w: &_| {
                        let comm = duralumin::HostTransferCommunicator::from_stream(w, stream.clone())?;
                        Ok(gpu::Gpu { comm, stream: stream.clone() })
                    };
                    job.run(state, steps, make, |c, s, at| step(c, s, at))
                } else {
                    let make = |w: &_| {
                        let comm = duralumin::NcclCommunicator::from_stream(w, stream.clone())?;
                        Ok(gpu::Gpu { comm, stream: stream.clone() })
                    };
                    job.run(state, steps, make, |c, s, at| step(c, s, at))
                }
            }
            _ => Err(duralumin::Error::Unsupported("DURALUMIN_ELASTIC_BACKEND names no backend this example knows")),
        }
    };
    let outcome = run(&mut job, &mut state)?;
    let me = slot.get().unwrap_or(u64::MAX);
    if let duralumin::elastic::Outcome::Left { step } = outcome {
        println!("LEFT slot {me}: left the job before step {step}");
        return Ok(());
    }
    let exact = state.weights == reference(dim, steps) && state.cursor == reference_cursor(me, state.cursor[0], steps);
    println!(
        "RESULT slot {me} rank {}: {steps} steps on {} ranks after {} changes, state {} ({backend})",
        job.rank(),
        job.size(),
        job.changes().len(),
        if exact { "exact" } else { "WRONG" }
    );
    if !exact {
        return Err(duralumin::Error::Membership("the final state differs from the failure-free run".into()));
    }
    Ok(())
}

/// One SGD step: this rank's share of the batch, the gradients summed over the job.
fn train_step(
    comm: &mut dyn Summer,
    s: &mut Training,
    at: Step,
    set: &Settings,
    slot: &Cell<Option<u64>>,
) -> Result<()> {
    slot.set(Some(at.slot));
    set.kill_in_step(at);
    if set.fails(at) {
        println!("slot {}: step {} fails without a death", at.slot, at.step);
        return Err(duralumin::Error::Revoked);
    }
    let samples = (0..BATCH).filter(|i| *i % at.size as u64 == at.rank as u64);
    let (mut grad, loss) = gradient(&s.weights, at.step, samples);
    grad.push(loss);
    let sum = comm.sum(&grad)?;
    let loss = sum[s.weights.len()] as f64 / ONE as f64 / BATCH as f64;
    apply(&mut s.weights, &sum);
    if s.cursor[0] == u64::MAX {
        s.cursor[0] = at.step;
    }
    s.cursor[1] = chain(s.cursor[1], at.slot, at.step);
    if at.rank == 0 && at.step % 10 == 0 {
        println!("step {:4} on {} ranks: loss {loss:.6}", at.step, at.size);
    }
    Ok(())
}

/// The gradient of the squared error over `samples` (fixed point), and their loss.
fn gradient(w: &[i64], step: u64, samples: impl Iterator<Item = u64>) -> (Vec<i64>, i64) {
    let mut grad = vec![0i64; w.len()];
    let mut loss = 0i64;
    for i in samples {
        let x: Vec<i64> = (0..w.len()).map(|d| feature(step, i, d)).collect();
        let target: i64 = x.iter().enumerate().map(|(d, xi)| xi * truth(d) / ONE).sum();
        let pred: i64 = x.iter().zip(w).map(|(xi, wi)| xi * wi / ONE).sum();
        let err = pred - target;
        loss = loss.wrapping_add(err * err / ONE);
        for (g, xi) in grad.iter_mut().zip(&x) {
            *g = g.wrapping_add(err * xi / ONE);
        }
    }
    (grad, loss)
}

/// `w -= lr * grad / BATCH`, lr = 1/4.
fn apply(w: &mut [i64], sum: &[i64]) {
    for (wi, g) in w.iter_mut().zip(sum) {
        *wi -= g / (4 * BATCH as i64);
    }
}

/// Feature `d` of sample `i` at `step`: in [-1, 1).
fn feature(step: u64, i: u64, d: usize) -> i64 {
    let h = mix(step.wrapping_mul(0x9E37_79B9) ^ i.wrapping_mul(0x85EB_CA6B) ^ (d as u64).wrapping_mul(0xC2B2_AE35));
    (h % (2 * ONE as u64)) as i64 - ONE
}

/// The weights the data come from.
fn truth(d: usize) -> i64 {
    ((d as i64 % 7) - 3) * ONE / 4
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x
}

fn chain(acc: u64, slot: u64, step: u64) -> u64 {
    mix(acc ^ slot.wrapping_mul(31) ^ step.wrapping_mul(0x1000_0001))
}

/// The model after `steps` steps of a failure-free run (the whole batch on one process).
fn reference(dim: usize, steps: u64) -> Vec<i64> {
    let mut w = vec![0i64; dim];
    for step in 0..steps {
        let (mut grad, loss) = gradient(&w, step, 0..BATCH);
        grad.push(loss);
        apply(&mut w, &grad);
    }
    w
}

/// The cursor of `slot` that first ran step `first`, after `steps` steps.
fn reference_cursor(slot: u64, first: u64, steps: u64) -> [u64; 2] {
    [first, (first..steps).fold(0, |acc, step| chain(acc, slot, step))]
}

/// The run's settings, from the environment.
struct Settings {
    steps: u64,
    dim: usize,
    joined: bool,
    kills: Vec<(String, String)>,
    fail: Option<(u64, u64)>,
    marks: Option<std::path::PathBuf>,
}

impl Settings {
    fn from_env(joined: bool) -> Settings {
        let var = |k: &str| std::env::var(k).ok();
        let kills = var("DURALUMIN_ELASTIC_KILL")
            .map(|v| {
                v.split(',')
                    .filter_map(|k| k.split_once('@'))
                    .map(|(who, at)| (who.to_string(), at.to_string()))
                    .collect()
            })
            .unwrap_or_default();
        Settings {
            steps: var("DURALUMIN_ELASTIC_STEPS").and_then(|v| v.parse().ok()).unwrap_or(40),
            dim: var("DURALUMIN_ELASTIC_DIM").and_then(|v| v.parse().ok()).unwrap_or(256),
            joined,
            kills,
            fail: var("DURALUMIN_ELASTIC_FAIL").and_then(|v| {
                let (slot, step) = v.split_once('@')?;
                Some((slot.parse().ok()?, step.parse().ok()?))
            }),
            marks: var("DURALUMIN_ELASTIC_MARKS").map(Into::into),
        }
    }

    /// The policy, with the observer that prints changes and fires the kill points.
    fn policy(&self, slot: Rc<Cell<Option<u64>>>) -> Policy {
        let mut policy = Policy::default();
        policy.timeout = Duration::from_secs(
            std::env::var("DURALUMIN_ELASTIC_TIMEOUT").ok().and_then(|v| v.parse().ok()).unwrap_or(20),
        );
        if std::env::var("DURALUMIN_ELASTIC_RESPAWN").is_ok_and(|v| v == "0") {
            policy.respawn = false;
        }
        if let Ok(program) = std::env::var("DURALUMIN_ELASTIC_PROGRAM") {
            policy.program = Some((program, Vec::new()));
        }
        if let Some((size, from)) = std::env::var("DURALUMIN_ELASTIC_GROW").ok().and_then(|v| {
            let (s, f) = v.split_once('@')?;
            Some((s.parse::<usize>().ok()?, f.parse::<u64>().ok()?))
        }) {
            policy = policy.discovery(move |now, step| if step >= from { size } else { now });
        }
        let kills = self.kills.clone();
        let (joined, marks) = (self.joined, self.marks.clone());
        policy.observer(move |event| {
            let who = slot.get();
            let fire = |at: &str| kill_once(&kills, who, joined, at, marks.as_deref());
            match event {
                Event::Committing { step } => fire(&format!("commit:{step}")),
                Event::Recovering { stage } => fire(stage),
                Event::Changed(c) => println!(
                    "CHANGE slot {}: {:?} at step {}, {} -> {} ranks, lost {:?}, joined {:?}, spawn refused {:?}, {:?}",
                    who.map_or("new".into(), |s| s.to_string()),
                    c.cause,
                    c.step,
                    c.from,
                    c.to,
                    c.lost,
                    c.joined,
                    c.spawn_refused,
                    c.timings
                ),
                _ => {}
            }
        })
    }

    /// Whether this step fails without a death (once per job).
    fn fails(&self, at: Step) -> bool {
        self.fail == Some((at.slot, at.step)) && claim(self.marks.as_deref(), "fail")
    }

    /// Kills this rank 1 ms into the step's allreduce, if a kill point says so.
    fn kill_in_step(&self, at: Step) {
        let spec = format!("step:{}", at.step);
        if matches(&self.kills, Some(at.slot), self.joined, &spec) && claim(self.marks.as_deref(), &spec) {
            println!("slot {}: killed in step {}", at.slot, at.step);
            std::thread::spawn(|| {
                std::thread::sleep(Duration::from_millis(1));
                die();
            });
        }
    }
}

/// Whether a kill point names this rank (`who`: its slot, or `joiner`) at `at`.
fn matches(kills: &[(String, String)], slot: Option<u64>, joined: bool, at: &str) -> bool {
    kills
        .iter()
        .any(|(who, point)| point == at && ((who == "joiner" && joined) || slot.is_some_and(|s| who == &s.to_string())))
}

/// Kills this rank at `at` if a kill point says so and it has not fired yet in this job.
fn kill_once(kills: &[(String, String)], slot: Option<u64>, joined: bool, at: &str, marks: Option<&std::path::Path>) {
    if matches(kills, slot, joined, at) && claim(marks, at) {
        println!("slot {}: killed at {at}", slot.map_or("joiner".into(), |s| s.to_string()));
        die();
    }
}

/// Takes the once-per-job marker of `at` (without a marker directory, once per process).
fn claim(marks: Option<&std::path::Path>, at: &str) -> bool {
    static FIRED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    match marks {
        Some(dir) => std::fs::File::create_new(dir.join(at.replace(':', "_"))).is_ok(),
        None => {
            let mut fired = FIRED.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let first = !fired.iter().any(|f| f == at);
            fired.push(at.to_string());
            first
        }
    }
}

fn die() {
    use std::io::Write;
    let _ = std::io::stdout().flush();
    // SAFETY: ends this process at once (the failure the job survives).
    unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
}
