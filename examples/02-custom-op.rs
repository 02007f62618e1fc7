//! A user element and a user reduction operator: argmin with its location, and complex sum.
//!
//! Any `#[repr(C)]` Pod struct is an element; any pure combining function is an operator. They
//! work with every collective, blocking or not; MPI sees a contiguous byte type and a user
//! operation generated for exactly this (element, operator) pair.
//!
//! Run with `mpirun -np 3 target/release/examples/02-custom-op`.

use duralumin::{Element, MpiCommunicator, ReduceOp, bytemuck};

/// A value and where it came from.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct MinLoc {
    value: f64,
    index: u64,
}

impl Element for MinLoc {
    const NAME: &'static str = "minloc";
}

/// Keeps the smaller value; on a tie, the smaller index (so the result is order-independent).
#[derive(Clone, Copy, Debug, Default)]
struct ArgMin;

impl ReduceOp<MinLoc> for ArgMin {
    const NAME: &'static str = "argmin";
    fn combine(a: MinLoc, b: MinLoc) -> MinLoc {
        if b.value < a.value || (b.value == a.value && b.index < a.index) { b } else { a }
    }
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
struct Complex {
    re: f32,
    im: f32,
}

impl Element for Complex {
    const NAME: &'static str = "c32";
}

#[derive(Clone, Copy, Debug, Default)]
struct ComplexSum;

impl ReduceOp<Complex> for ComplexSum {
    const NAME: &'static str = "csum";
    fn combine(a: Complex, b: Complex) -> Complex {
        Complex { re: a.re + b.re, im: a.im + b.im }
    }
}

fn main() -> duralumin::Result<()> {
    let universe = duralumin::init()?;
    let comm = MpiCommunicator::new(&universe.world())?;
    let (rank, size) = (comm.rank(), comm.size());

    // Each rank proposes a value per slot; find the smallest and which rank had it.
    let mine: Vec<MinLoc> =
        (0..4).map(|slot| MinLoc { value: ((rank * 7 + slot * 3) % 5) as f64, index: rank as u64 }).collect();
    let mut best = mine.clone();
    comm.allreduce(&mine, &mut best, ArgMin)?;

    // Complex sum, non-blocking and in place.
    let mut z = vec![Complex { re: rank as f32, im: 1.0 }; 1000];
    duralumin::scope(|s| comm.iallreduce_in_place(s, &mut z, ComplexSum)?.wait())?;

    if rank == 0 {
        for (slot, b) in best.iter().enumerate() {
            println!("slot {slot}: min {} on rank {}", b.value, b.index);
        }
        let re: f32 = (0..size).map(|r| r as f32).sum();
        println!("complex sum: {:?} (expected re = {re}, im = {size})", z[0]);
        assert!(z.iter().all(|c| c.re == re && c.im == size as f32));
        // The smallest value of each slot and the lowest rank holding it.
        for (slot, b) in best.iter().enumerate() {
            let (value, index) = (0..size)
                .map(|r| (((r * 7 + slot * 3) % 5) as f64, r as u64))
                .fold((f64::INFINITY, u64::MAX), |a, b| if b.0 < a.0 { b } else { a });
            assert_eq!((b.value, b.index), (value, index), "slot {slot}");
        }
        println!("ok");
    }
    Ok(())
}
