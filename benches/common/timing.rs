//! Timing across ranks: every figure is the slowest rank's.

use std::time::Instant;

use duralumin::mpi::collective::SystemOperation;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::mpi::traits::*;

/// The slowest rank's value.
pub fn max_over(world: &SimpleCommunicator, x: f64) -> f64 {
    let mut out = 0.0;
    world.all_reduce_into(&x, &mut out, SystemOperation::max());
    out
}

/// Microseconds per call of `op` (`reps` back to back after a barrier, then `finish`), the
/// slowest rank's.
pub fn time_us(world: &SimpleCommunicator, reps: usize, mut op: impl FnMut(), finish: impl Fn()) -> f64 {
    world.barrier();
    let t = Instant::now();
    for _ in 0..reps {
        op();
    }
    finish();
    max_over(world, t.elapsed().as_secs_f64() * 1e6 / reps as f64)
}
