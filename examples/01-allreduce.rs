//! The main demo: every rank contributes its rank number, and every rank gets the sum.
//!
//! Run with `mpirun -np 4 target/release/examples/01-allreduce`.

use duralumin::{Avg, Max, MpiCommunicator, Sum};

fn main() -> duralumin::Result<()> {
    let universe = duralumin::init()?;
    let comm = MpiCommunicator::new(&universe.world())?;
    let (rank, size) = (comm.rank(), comm.size());

    // Blocking allreduce of a small vector.
    let send: Vec<f32> = (0..8).map(|i| (rank * 10 + i) as f32).collect();
    let mut sum = vec![0.0f32; 8];
    comm.allreduce(&send, &mut sum, Sum)?;

    // In place, and a different operator.
    let mut max = vec![rank as u64; 4];
    comm.allreduce_in_place(&mut max, Max)?;

    // Non-blocking: start it, do other work, then wait.
    let big: Vec<f64> = vec![rank as f64; 1 << 20];
    let mut avg = vec![0.0f64; 1 << 20];
    duralumin::scope(|s| {
        let req = comm.iallreduce(s, &big, &mut avg, Avg)?;
        req.wait()
    })?;

    if rank == 0 {
        let expected: f32 = (0..size).map(|r| (r * 10) as f32).sum();
        println!("duralumin allreduce on {size} ranks");
        println!("  sum of ranks*10  = {} (expected {expected})", sum[0]);
        println!("  max of ranks     = {} (expected {})", max[0], size - 1);
        println!("  avg of ranks     = {} (expected {})", avg[0], (size - 1) as f64 / 2.0);
        assert_eq!(sum[0], expected);
        assert_eq!(max[0], (size - 1) as u64);
        assert_eq!(avg[0], (size - 1) as f64 / 2.0);
        println!("ok");
    }
    Ok(())
}
