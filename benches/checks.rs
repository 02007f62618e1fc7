//! What checking calls costs: the blocking allreduce (`Auto`, f32 sum) at 4 B, 64 KiB and
//! 64 MiB against MPI's own in the same run, and the same with the signature check on
//! (`DURALUMIN_CHECK=1`), as a table.
//!
//! `cargo bench --bench checks [-- --np 2,4 --rounds 9]` relaunches itself under `mpirun` for
//! each rank count (`DURALUMIN_MPIRUN=scripts/cluster-mpirun DURALUMIN_CLUSTER=2x2` for the
//! simulated cluster). Every figure is the median of `--rounds` rounds, each timing Duralumin,
//! MPI and the checked call one after the other, so that a drift of the machine between two
//! moments of the run cancels within a round.

#[path = "common/relaunch.rs"]
mod relaunch;

use std::time::Instant;

use duralumin::mpi::collective::SystemOperation;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::mpi::traits::*;
use duralumin::{MpiCommunicator, Sum};
use relaunch::relaunch;

const SIZES: [usize; 3] = [4, 64 << 10, 64 << 20];

fn main() {
    if std::env::var("DURALUMIN_BENCH_RANK").is_ok() {
        rank_main();
        return;
    }
    let env = [("DURALUMIN_BENCH_ROUNDS", relaunch::flag("--rounds").unwrap_or_else(|| "9".into()))];
    for np in relaunch::rank_counts("2") {
        relaunch(np, &env, &[]);
    }
}

/// Microseconds per call of `f` on the slowest rank, `iters` calls after a barrier.
fn time(world: &SimpleCommunicator, iters: usize, mut f: impl FnMut()) -> f64 {
    f();
    world.barrier();
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    let mine = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let mut slowest = 0.0;
    world.all_reduce_into(&mine, &mut slowest, SystemOperation::max());
    slowest
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn rank_main() {
    let universe = duralumin::init().expect("init");
    let world = universe.world();
    let comm = MpiCommunicator::new(&world).expect("communicator");
    let mut checked = comm.dup().expect("dup");
    checked.set_check(true);
    let rounds: usize = std::env::var("DURALUMIN_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(9);
    let me = comm.rank();
    if me == 0 {
        println!(
            "\n== np = {}, {} node(s), median of {rounds} rounds ==\n{:>10} {:>11} {:>11} {:>11} {:>8} {:>11} {:>11}",
            comm.size(),
            comm.topology().node_count(),
            "bytes",
            "native_us",
            "auto_us",
            "over_us",
            "ratio",
            "checked_us",
            "check_us"
        );
    }
    for bytes in SIZES {
        let len = bytes / 4;
        let send: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
        let mut recv = vec![0.0f32; len];
        let iters = ((64usize << 20) / bytes.max(1)).clamp(3, 2000);
        let (mut native, mut ours, mut check) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..rounds {
            native
                .push(time(&world, iters, || world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum())));
            ours.push(time(&world, iters, || comm.allreduce(&send, &mut recv, Sum).expect("allreduce")));
            check.push(time(&world, iters, || checked.allreduce(&send, &mut recv, Sum).expect("checked allreduce")));
        }
        let over = median(ours.iter().zip(&native).map(|(o, n)| o - n).collect());
        let ratio = median(ours.iter().zip(&native).map(|(o, n)| o / n).collect());
        let check_cost = median(check.iter().zip(&ours).map(|(c, o)| c - o).collect());
        if me == 0 {
            println!(
                "{bytes:>10} {:>11.3} {:>11.3} {over:>11.3} {ratio:>8.3} {:>11.3} {check_cost:>11.3}",
                median(native),
                median(ours),
                median(check)
            );
        }
    }
}
