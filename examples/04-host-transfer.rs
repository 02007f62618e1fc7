//! HostTransfer on the host device: collectives ordered on a stream like kernels, the same
//! training step written once over [`Collectives`] for the Mpi and HostTransfer backends, and a
//! non-blocking operation handed to a stream with `stream_wait`.
//!
//! Run with `mpirun -np 4 target/release/examples/04-host-transfer`.

use duralumin::device::cpu::HostDevice;
use duralumin::{Collectives, HostTransferCommunicator, HostTransferConfig, MpiCommunicator, Result, Sum};

/// One data-parallel step on any backend: sum the gradients of every rank, then wait for it.
fn average_step<C: Collectives>(comm: &C, grads: C::BufMut<'_, f32>) -> Result<()> {
    comm.allreduce_in_place(grads, Sum)?;
    comm.synchronize()
}

fn main() -> Result<()> {
    let universe = duralumin::init()?;
    let world = universe.world();
    let mpi = MpiCommunicator::new(&world)?;
    let (rank, size) = (mpi.rank(), mpi.size());

    // The host device stands for a GPU: buffers, streams and the same staging engine.
    let dev = HostDevice::new(0);
    let stream = dev.stream()?;
    let config = HostTransferConfig::default().with_chunk_bytes(64 << 10);
    let ht = HostTransferCommunicator::with_config(&world, dev.clone(), stream.clone(), config)?;

    // The same step on both backends.
    let mut host_grads = vec![rank as f32 + 1.0; 1 << 16];
    average_step(&mpi, &mut host_grads[..])?;
    let mut device_grads = dev.upload(&vec![rank as f32 + 1.0; 1 << 16])?;
    average_step(&ht, &mut device_grads)?;
    let expected = (size * (size + 1) / 2) as f32;
    assert!(host_grads.iter().all(|&g| g == expected));
    assert!(dev.download(&device_grads)?.iter().all(|&g| g == expected));

    // Stream-ordered: queued behind the stream's work, returns at once.
    let mut x = dev.upload(&[rank as u64; 1000])?;
    ht.allreduce_in_place(&mut x, Sum)?;
    // Non-blocking on the internal stream, then handed to `stream`: later work on `stream`
    // sees the result, and the host never blocks for it.
    let mut y = dev.upload(&vec![0u32; 4096])?;
    if rank == 0 {
        y = dev.upload(&vec![7u32; 4096])?;
    }
    ht.ibcast(&mut y, 0)?.stream_wait(&stream)?;
    ht.synchronize()?;
    let sum = dev.download(&x)?[0];
    assert_eq!(sum, (size * (size - 1) / 2) as u64);
    assert!(dev.download(&y)?.iter().all(|&v| v == 7));

    if rank == 0 {
        println!("HostTransfer on the host device, {size} ranks: step sum {expected}, allreduce {sum}, bcast 7");
        println!("ok");
    }
    Ok(())
}
