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

use std::time::Duration;

use duralumin::reliability::OnTimeout;
use duralumin::{Communicator, Error, Sum};

const STEPS: usize = 40;
const LEN: usize = 1 << 16;

fn main() -> duralumin::Result<()> {
    let universe = duralumin::init()?;
    let mut comm = Communicator::new(&universe.world())?;
    // Errors come back to the program (the default, OnTimeout::Abort, ends the job).
    comm.set_on_timeout(OnTimeout::Error);
    comm.set_timeout(Some(Duration::from_secs(30)));
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
        let mut sum = vec![0.0f64; LEN];
        let ok = match comm.allreduce(&grad, &mut sum, Sum) {
            Ok(()) => true,
            // A rank died (or another rank revoked the communicator after seeing it die).
            Err(Error::ProcessFailed { .. } | Error::Revoked | Error::Aborted { .. }) => {
                // Every rank still waiting in this step's allreduce stops waiting.
                comm.revoke()?;
                false
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
        alive = survivors(&comm, me)?;
        recoveries += 1;
        println!("rank {me}: lost a rank at step {step}; carrying on with ranks {alive:?}");
    }
    println!(
        "RESULT rank {me}: {STEPS} steps done on {} ranks after {recoveries} recoveries, every sum exact",
        alive.len()
    );
    Ok(())
}

/// Rank `r`'s contribution at `step` (distinct per rank, exact in `f64`).
fn gradient(r: usize, step: usize) -> f64 {
    ((r + 1) * 1000 + step) as f64
}

/// The original ranks of the communicator's members, in its order.
fn survivors(comm: &Communicator, me: usize) -> duralumin::Result<Vec<usize>> {
    let mut all = vec![0u64; comm.size()];
    comm.allgather(&[me as u64], &mut all)?;
    Ok(all.into_iter().map(|r| r as usize).collect())
}

fn kill_point() -> Option<(usize, usize)> {
    let v = std::env::var("DURALUMIN_EXAMPLE_KILL").ok()?;
    let (rank, step) = v.split_once(':')?;
    Some((rank.parse().ok()?, step.parse().ok()?))
}
