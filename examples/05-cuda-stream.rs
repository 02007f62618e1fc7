//! HostTransfer on a CUDA GPU, built from a cudarc stream alone: collectives on `CudaSlice`s
//! ordered with the program's own work on that stream.
//!
//! Run with `mpirun -np 2 target/release/examples/05-cuda-stream` on a machine with a CUDA GPU
//! (several ranks may share it), or on the CUDA driver simulator:
//! `LD_LIBRARY_PATH=target/release/cudasim mpirun -np 2 target/release/examples/05-cuda-stream`.

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use duralumin::cudarc::driver::CudaContext;
    use duralumin::{HostTransferCommunicator, Max, Sum};

    if !duralumin::device::cuda::driver_present() || duralumin::device::cuda::device_count() == 0 {
        eprintln!("no CUDA driver or device: this example needs a GPU (or cudasim, see its docs)");
        std::process::exit(2);
    }
    let universe = duralumin::init()?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let comm = HostTransferCommunicator::from_stream(&universe.world(), stream.clone())?;
    let (rank, size) = (comm.rank(), comm.size());
    let (r, n) = (u32::try_from(rank)?, u32::try_from(size)?);

    // Upload, reduce and download, all in the stream's order: no synchronize in between.
    let mut grads = stream.clone_htod(&vec![rank as f32 + 1.0; 1 << 20])?;
    comm.allreduce_in_place(&mut grads, Sum)?;
    let mut peak = stream.clone_htod(&[r; 16])?;
    let req = comm.iallreduce_in_place(&mut peak, Max)?;
    req.stream_wait(&stream)?;
    let sums = stream.clone_dtoh(&grads)?;
    let peaks = stream.clone_dtoh(&peak)?;
    comm.synchronize()?;

    let expected = (size * (size + 1) / 2) as f32;
    assert!(sums.iter().all(|&g| g == expected), "allreduce");
    assert!(peaks.iter().all(|&p| p == n - 1), "max");
    if rank == 0 {
        let name = ctx.name().unwrap_or_else(|_| "an unnamed device".into());
        println!("HostTransfer on {name}, {size} ranks: sum {expected}, max {}", size - 1);
        println!("ok");
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("built without the `cuda` feature");
    std::process::exit(2);
}
