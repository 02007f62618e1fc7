//! The NCCL backend on a CUDA GPU, built from a stream alone, reducing the builtin pairs with
//! NCCL and a user's own element types and operators (the `custom-kernels` crate's, whose GPU
//! kernels `KernelBuilder` compiled and `register()` hands to Duralumin) with their kernels:
//! an argmin (`MinLoc`/`ArgMin`) and a non-commutative composition of affine maps
//! (`Affine`/`Compose`), which must combine in rank order.
//!
//! Run with `mpirun -np 2 target/release/examples/06-nccl-custom-kernels` on a machine with a
//! CUDA GPU and NCCL (several ranks may share one GPU: `NCCL_MULTI_RANK_GPU_ENABLE=1` on
//! NCCL 2.30 and later), or on the simulators (cudasim's NCCL):
//! `LD_LIBRARY_PATH=target/release/cudasim mpirun -np 3 target/release/examples/06-nccl-custom-kernels`.

#[cfg(feature = "cuda")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    use duralumin::cudarc::driver::CudaContext;
    use duralumin::{NcclCommunicator, Sum};
    use duralumin_example_custom_kernels::{Affine, ArgMin, Compose, MinLoc, register};

    if !duralumin::device::cuda::driver_present() || duralumin::device::cuda::device_count() == 0 {
        eprintln!("no CUDA driver or device: this example needs a GPU (or cudasim, see its docs)");
        std::process::exit(2);
    }
    let universe = duralumin::init()?;
    // The user's kernels, before the first reduction that needs them.
    register()?;
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let comm = NcclCommunicator::from_stream(&universe.world(), stream.clone())?;
    let (rank, size) = (comm.rank(), comm.size());
    // User element types go up and down through the device (cudarc's own copies take only its
    // `DeviceRepr` types).
    let dev = comm.device();
    let r = u64::try_from(rank)?;

    // A builtin pair: ncclAllReduce itself.
    let mut grads = stream.clone_htod(&vec![rank as f32 + 1.0; 1 << 16])?;
    comm.allreduce_in_place(&mut grads, Sum)?;
    // Argmin: each rank's values, the smallest value and the rank holding it.
    let values: Vec<MinLoc> =
        (0..1000u64).map(|i| MinLoc { value: ((i * 7 + r * 13) % 101) as f64, index: r }).collect();
    let mut mins = dev.upload(&stream, &values)?;
    comm.allreduce_in_place(&mut mins, ArgMin)?;
    // Composition, non-blocking: rank r's map is x -> (r + 2) x + r, applied in rank order.
    let mut maps = dev.upload(&stream, &vec![Affine { a: i64::try_from(rank)? + 2, b: i64::try_from(rank)? }; 64])?;
    let req = comm.iallreduce_in_place(&mut maps, Compose)?;
    req.stream_wait(&stream)?;
    let sums = stream.clone_dtoh(&grads)?;
    let mins = dev.download(&stream, &mins)?;
    let maps = dev.download(&stream, &maps)?;
    comm.synchronize()?;

    let expected_sum = (size * (size + 1) / 2) as f32;
    assert!(sums.iter().all(|&g| g == expected_sum), "allreduce");
    for (i, m) in (0..1000u64).zip(&mins) {
        let want = (0..size as u64).map(|q| MinLoc { value: ((i * 7 + q * 13) % 101) as f64, index: q }).fold(
            None,
            |acc: Option<MinLoc>, x| match acc {
                Some(a) if a.value < x.value || (a.value == x.value && a.index <= x.index) => Some(a),
                _ => Some(x),
            },
        );
        assert_eq!(Some(*m), want, "argmin of element {i}");
    }
    // Apply the maps of ranks 0, 1, ... in turn to 0 and 1: the composed map's offset and slope.
    let apply =
        |x: i64| (0..i64::try_from(size)?).try_fold(x, |x, q| Ok::<i64, std::num::TryFromIntError>((q + 2) * x + q));
    let (b, a1) = (apply(0)?, apply(1)?);
    assert!(maps.iter().all(|m| *m == Affine { a: a1 - b, b }), "compose in rank order");
    if rank == 0 {
        println!(
            "{} on {size} ranks: sum {expected_sum}, argmin and compose with the user's kernels",
            comm.library_version()
        );
        println!("ok");
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn main() {
    eprintln!("built without the `cuda` feature");
    std::process::exit(2);
}
