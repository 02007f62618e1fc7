//! A training loop that survives losing a rank: each step allreduces every rank's "gradient";
//! when a rank dies, the survivors revoke the communicator, shrink it to themselves and redo
//! the step, so the loop finishes on fewer ranks with exact results (the recovery model of
//! `docs/reliability.md`).
//!
//! Needs an MPI library with ULFM, run with fault tolerance on, for example Open MPI 5:
//! `mpirun --with-ft ulfm -np 4 target/release/examples/03-survive-rank-loss`. On an MPI
//! without it, the first `agree` says so with [`Error::Unsupported`] and the example stops there.
//!
//! `DURALUMIN_EXAMPLE_KILL=<rank>:<step>` makes that rank kill itself (SIGKILL) at the start of
//! that step, as a crashed node would (the test in `tests/ulfm.rs` uses it).
//! `DURALUMIN_EXAMPLE_BACKEND=host-transfer` runs the same loop on a HostTransfer communicator
//! over the host device (stream-ordered operations on device buffers) instead of the Mpi
//! backend: the recovery calls are the same. On the Mpi backend,
//! `DURALUMIN_EXAMPLE_ALLREDUCE=native|ring|recursive-doubling|rabenseifner|shared-memory`
//! runs every step's allreduce with that algorithm instead of `Auto` (the test runs the
//! recovery through each).
//!
//! `DURALUMIN_EXAMPLE_REVOKE_IN_FLIGHT=<bytes>` runs, instead of the loop, a revocation while
//! an operation is in flight on the caller's own buffers: on a HostTransfer communicator under
//! [`OnTimeout::Abort`] (where the host device's operations run on the buffers themselves),
//! rank 0 queues an allreduce of that many bytes, which rank 1 joins only a second later, and
//! revokes the communicator before it synchronizes. Its operation must end with an error soon
//! (its MPI part completes once revoked, rather than being left with the buffers), and rank 1's
//! late call must fail too.

use std::time::Duration;

use duralumin::HostTransferCommunicator;
use duralumin::device::cpu::{HostBuffer, HostDevice};
use duralumin::mpi::traits::CommunicatorCollectives as _;
use duralumin::reliability::OnTimeout;
use duralumin::{AllreduceAlgorithm, Error, MpiCommunicator, Result, Sum};

const STEPS: usize = 40;
const LEN: usize = 1 << 16;

/// What the loop needs of a communicator: one step's allreduce, and the three recovery calls,
/// which both backends have with the same meaning.
trait Group: Sized {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// The sum of every rank's `grad`, or the error that stopped it.
    fn sum(&mut self, grad: &[f64]) -> Result<Vec<f64>>;
    fn revoke(&self) -> Result<()>;
    fn agree(&self, ok: bool) -> Result<bool>;
    fn shrink(&self) -> Result<Self>;
    /// The original ranks of the communicator's members, in its order.
    fn members(&mut self, me: usize) -> Result<Vec<usize>>;
}

fn main() -> Result<()> {
    let universe = duralumin::init()?;
    let world = universe.world();
    let timeout = Some(Duration::from_secs(30));
    if let Ok(bytes) = std::env::var("DURALUMIN_EXAMPLE_REVOKE_IN_FLIGHT") {
        let bytes =
            bytes.parse().map_err(|_| Error::Unsupported("DURALUMIN_EXAMPLE_REVOKE_IN_FLIGHT takes a byte count"))?;
        let dev = HostDevice::new(0);
        let mut comm = HostTransferCommunicator::new(&world, dev.clone(), dev.stream()?)?;
        // Under `OnTimeout::Error` its operations would run on staging the library owns.
        comm.set_on_timeout(OnTimeout::Abort);
        comm.set_timeout(timeout);
        revoke_in_flight(&comm, &dev, bytes)?;
        world.barrier();
        return Ok(());
    }
    if std::env::var("DURALUMIN_EXAMPLE_BACKEND").is_ok_and(|b| b == "host-transfer") {
        let dev = HostDevice::new(0);
        let mut comm = HostTransferCommunicator::new(&world, dev.clone(), dev.stream()?)?;
        // Errors come back to the program (the default, OnTimeout::Abort, ends the job).
        comm.set_on_timeout(OnTimeout::Error);
        comm.set_timeout(timeout);
        train(HostTransfer { comm, dev }, "HostTransfer")
    } else {
        let mut comm = MpiCommunicator::new(&world)?;
        comm.set_on_timeout(OnTimeout::Error);
        comm.set_timeout(timeout);
        train(Mpi { comm, algorithm: allreduce_algorithm()? }, "Mpi")
    }
}

fn train<G: Group>(mut comm: G, backend: &str) -> Result<()> {
    let me = comm.rank();
    let kill = kill_point();
    // The ranks (of the original job) still in the loop.
    let mut alive: Vec<usize> = (0..comm.size()).collect();
    let mut step = 0;
    let mut recoveries = 0;
    while step < STEPS {
        if kill == Some((me, step)) {
            println!("rank {me}: killing myself at step {step}");
            // SAFETY: ends this process at once (the failure this example survives).
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
        }
        let grad = vec![gradient(me, step); LEN];
        let (ok, sum, why) = match comm.sum(&grad) {
            Ok(sum) => (true, sum, None),
            // A rank died (or another rank revoked the communicator after seeing it die).
            Err(e @ (Error::ProcessFailed { .. } | Error::Revoked | Error::Aborted { .. })) => {
                // Every rank still waiting in this step's allreduce stops waiting.
                comm.revoke()?;
                (false, Vec::new(), Some(e))
            }
            Err(e) => return Err(e),
        };
        // One rank's allreduce may complete while another's fails: the survivors agree on
        // whether the step counts (this works on a revoked communicator).
        if comm.agree(ok)? {
            let expected: f64 = alive.iter().map(|&r| gradient(r, step)).sum();
            if sum.iter().any(|&x| x != expected) {
                return Err(Error::Progress("a step's sum is wrong"));
            }
            step += 1;
            continue;
        }
        // Carry on over the survivors, and redo this step.
        comm = comm.shrink()?;
        alive = comm.members(me)?;
        recoveries += 1;
        let why = why.map_or_else(|| "another rank's allreduce failed".to_string(), |e| e.to_string());
        println!("rank {me}: lost a rank at step {step} ({why}); carrying on with ranks {alive:?}");
    }
    println!(
        "RESULT rank {me}: {STEPS} steps done on {} ranks after {recoveries} recoveries, every sum exact ({backend})",
        alive.len()
    );
    Ok(())
}

/// See `DURALUMIN_EXAMPLE_REVOKE_IN_FLIGHT` in the module docs. Prints `REVOKED rank <r>:
/// <outcome> after <ms> ms`.
fn revoke_in_flight(comm: &HostTransferCommunicator<HostDevice>, dev: &HostDevice, bytes: usize) -> Result<()> {
    let me = comm.rank();
    let len = (bytes / 8).max(1);
    let send = dev.upload(&vec![1.0f64; len])?;
    let mut recv = dev.alloc_zeroed::<f64>(len)?;
    let start = std::time::Instant::now();
    let ended = if me == 0 {
        comm.allreduce(&send, &mut recv, Sum)?;
        std::thread::sleep(Duration::from_millis(100));
        comm.revoke()?;
        comm.synchronize()
    } else {
        std::thread::sleep(Duration::from_secs(1));
        comm.allreduce(&send, &mut recv, Sum).and_then(|()| comm.synchronize())
    };
    let ms = start.elapsed().as_millis();
    let outcome = match &ended {
        Ok(()) => "completed".to_string(),
        Err(e) => format!("failed ({e})"),
    };
    println!("REVOKED rank {me}: {} after {ms} ms", outcome.lines().next().unwrap_or_default());
    // The buffers are the program's again: MPI must be through with them.
    drop((send, recv));
    Ok(())
}

/// An Mpi communicator with the algorithm its steps' allreduces run.
struct Mpi {
    comm: MpiCommunicator,
    algorithm: AllreduceAlgorithm,
}

impl Group for Mpi {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn sum(&mut self, grad: &[f64]) -> Result<Vec<f64>> {
        let mut sum = vec![0.0; grad.len()];
        self.comm.allreduce_with(grad, &mut sum, Sum, self.algorithm)?;
        Ok(sum)
    }
    fn revoke(&self) -> Result<()> {
        self.comm.revoke()
    }
    fn agree(&self, ok: bool) -> Result<bool> {
        self.comm.agree(ok)
    }
    fn shrink(&self) -> Result<Self> {
        Ok(Mpi { comm: self.comm.shrink()?, algorithm: self.algorithm })
    }
    fn members(&mut self, me: usize) -> Result<Vec<usize>> {
        let mut all = vec![0u64; self.size()];
        self.comm.allgather(&[me as u64], &mut all)?;
        Ok(all.into_iter().map(|r| usize::try_from(r).expect("a rank")).collect())
    }
}

/// A HostTransfer communicator with the device its buffers live on.
struct HostTransfer {
    comm: HostTransferCommunicator<HostDevice>,
    dev: HostDevice,
}

impl HostTransfer {
    /// Runs `op` on device copies of `send` and a zeroed result of `len`, in stream order, and
    /// brings the result back once the stream is through.
    fn stream_op<T: duralumin::Element>(
        &mut self,
        send: &[T],
        len: usize,
        op: impl FnOnce(&mut HostTransferCommunicator<HostDevice>, &HostBuffer<T>, &mut HostBuffer<T>) -> Result<()>,
    ) -> Result<Vec<T>> {
        let send = self.dev.upload(send)?;
        let mut recv = self.dev.alloc_zeroed::<T>(len)?;
        op(&mut self.comm, &send, &mut recv)?;
        self.comm.synchronize()?;
        self.dev.download(&recv)
    }
}

impl Group for HostTransfer {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn sum(&mut self, grad: &[f64]) -> Result<Vec<f64>> {
        self.stream_op(grad, grad.len(), |c, s, r| c.allreduce(s, r, Sum))
    }
    fn revoke(&self) -> Result<()> {
        self.comm.revoke()
    }
    fn agree(&self, ok: bool) -> Result<bool> {
        self.comm.agree(ok)
    }
    fn shrink(&self) -> Result<Self> {
        Ok(HostTransfer { comm: self.comm.shrink()?, dev: self.dev.clone() })
    }
    fn members(&mut self, me: usize) -> Result<Vec<usize>> {
        let n = self.comm.size();
        let all = self.stream_op(&[me as u64], n, |c, s, r| c.allgather(s, r))?;
        Ok(all.into_iter().map(|r| usize::try_from(r).expect("a rank")).collect())
    }
}

/// Rank `r`'s contribution at `step` (distinct per rank, exact in `f64`).
fn gradient(r: usize, step: usize) -> f64 {
    ((r + 1) * 1000 + step) as f64
}

/// The algorithm `DURALUMIN_EXAMPLE_ALLREDUCE` names (`Auto` when unset).
fn allreduce_algorithm() -> Result<AllreduceAlgorithm> {
    let Ok(name) = std::env::var("DURALUMIN_EXAMPLE_ALLREDUCE") else { return Ok(AllreduceAlgorithm::Auto) };
    Ok(match name.as_str() {
        "native" => AllreduceAlgorithm::Native,
        "ring" => AllreduceAlgorithm::Ring,
        "recursive-doubling" => AllreduceAlgorithm::RecursiveDoubling,
        "rabenseifner" => AllreduceAlgorithm::Rabenseifner,
        "shared-memory" => AllreduceAlgorithm::SharedMemory,
        _ => return Err(Error::Unsupported("DURALUMIN_EXAMPLE_ALLREDUCE names no algorithm this example knows")),
    })
}

fn kill_point() -> Option<(usize, usize)> {
    let v = std::env::var("DURALUMIN_EXAMPLE_KILL").ok()?;
    let (rank, step) = v.split_once(':')?;
    Some((rank.parse().ok()?, step.parse().ok()?))
}
