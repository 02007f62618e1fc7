//! HostTransfer on a CUDA GPU: in-place f32 sum allreduce from 4 KiB to 256 MiB, pipelined
//! through the communicator's staging ring (the default settings) against staging the whole
//! buffer at once (Aluminum's method) and the bulk-synchronous manual way (synchronize, copy to
//! pinned memory, `MPI_Allreduce`, copy back), each against the bound: a device-to-host and a
//! host-to-device copy of the same bytes at once, on two streams, measured in the same run
//! (`fraction of bound` = bound time / operation time). The pipelined allreduce runs twice:
//! its copies queued chunk by chunk on the copy engines (the default on a GPU), and as one mover
//! kernel per operation (`HostTransferConfig::mover_min_chunks`), with each one's enqueue time;
//! the mover as the default number of blocks sharing the chunks (`mover_blocks`) and as one.
//! At np >= 2 also the host MPI allreduce of the same bytes. The host thread's enqueue time per operation as the median and the
//! slowest call. The flag release latency of both flag paths is measured first, before any
//! communicator exists.
//!
//! Every row runs untimed warm-up repetitions, then at least 10 timed ones (`--reps N`
//! overrides that, for the simulator's timing model in CI).
//!
//! `cargo bench --bench host_transfer_gpu [-- --np 1,2 --max-bytes N --reps N]` relaunches
//! itself under `mpirun` per rank count (the ranks share GPU 0). Without a CUDA device it
//! prints `SKIPPED`. On cudasim with `CUDASIM_COPY_GBPS` set the copies take modelled time, so
//! the fractions say how well the pipeline overlaps. Rows start with `| ` (what
//! `scripts/gpu.sh` collects); targets are printed as checks, never asserted.

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("SKIPPED: built without the cuda feature");
}

#[cfg(feature = "cuda")]
fn main() {
    gpu::main();
}

#[cfg(feature = "cuda")]
#[path = "common/relaunch.rs"]
mod relaunch;
#[cfg(feature = "cuda")]
#[path = "common/timing.rs"]
mod timing;

#[cfg(feature = "cuda")]
mod gpu {
    use super::relaunch::relaunch;
    use super::timing::{self, max_over};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
    use duralumin::Sum;
    use duralumin::device::cuda::{CudaDevice, FlagPath, device_count};
    use duralumin::device::pool::Pools;
    use duralumin::device::{Copy2d, Device};
    use duralumin::mpi::collective::SystemOperation;
    use duralumin::mpi::topology::SimpleCommunicator;
    use duralumin::mpi::traits::*;
    use duralumin::{HostTransferCommunicator, HostTransferConfig};

    const SIZES: [usize; 9] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20];

    pub fn main() {
        if std::env::var("DURALUMIN_BENCH_RANK").is_ok() {
            rank_main();
            return;
        }
        if device_count() == 0 {
            println!("SKIPPED: no CUDA device");
            return;
        }
        let max = super::relaunch::flag("--max-bytes").unwrap_or_else(|| (256usize << 20).to_string());
        let reps = super::relaunch::flag("--reps").unwrap_or_default();
        for np in super::relaunch::rank_counts("1,2") {
            relaunch(np, &[("DURALUMIN_BENCH_MAX", max.clone()), ("DURALUMIN_BENCH_REPS", reps.clone())], &[]);
        }
    }

    /// Untimed repetitions before each row.
    const WARM_UP: usize = 2;

    /// Timed repetitions at `bytes`: at least 10, or `--reps`.
    fn reps(bytes: usize) -> usize {
        match std::env::var("DURALUMIN_BENCH_REPS").ok().and_then(|s| s.parse().ok()) {
            Some(r) if r > 0 => r,
            _ => ((64usize << 20) / bytes).clamp(10, 200),
        }
    }

    /// Microseconds per call of `op` after [`WARM_UP`] untimed calls (see [`timing::time_us`]).
    fn time_us(world: &SimpleCommunicator, reps: usize, mut op: impl FnMut(), finish: impl Fn()) -> f64 {
        for _ in 0..WARM_UP {
            op();
        }
        finish();
        timing::time_us(world, reps, op, finish)
    }

    struct Pinned {
        dev: CudaDevice,
        ptr: *mut u8,
        bytes: usize,
    }

    impl Pinned {
        fn new(dev: &CudaDevice, bytes: usize) -> Pinned {
            Pinned { dev: dev.clone(), ptr: dev.alloc_pinned(bytes).expect("pinned"), bytes }
        }
        fn f32s(&mut self, n: usize) -> &mut [f32] {
            assert!(n * 4 <= self.bytes);
            // SAFETY: the allocation holds `bytes` zero-filled (valid f32) bytes, page aligned.
            unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<f32>(), n) }
        }
    }

    impl Drop for Pinned {
        fn drop(&mut self) {
            // SAFETY: allocated by `alloc_pinned(bytes)`; every stream using it was synchronized.
            unsafe { self.dev.free_pinned(self.ptr, self.bytes) };
        }
    }

    fn rank_main() {
        let universe = duralumin::init().expect("init");
        let world = universe.world();
        let (me, np) = (world.rank(), usize::try_from(world.size()).expect("an MPI size"));
        let max: usize = std::env::var("DURALUMIN_BENCH_MAX").ok().and_then(|s| s.parse().ok()).unwrap_or(256 << 20);
        let ctx = CudaContext::new(0).expect("CUDA context");
        let name = ctx.name().unwrap_or_else(|_| "an unnamed device".into());
        // Before any communicator exists: the flag round trip of both paths.
        let mut latency = Vec::new();
        for path in [FlagPath::StreamMemOps, FlagPath::Kernels] {
            latency.push((path, max_over(&world, release_latency(&ctx, path))));
        }
        let dev = CudaDevice::new(Arc::clone(&ctx)).expect("CUDA device");
        let (stream, other) = (ctx.new_stream().expect("stream"), ctx.new_stream().expect("stream"));
        let top = SIZES.into_iter().filter(|&s| s <= max).max().unwrap_or(4 << 10);
        let mut buf: CudaSlice<f32> = stream.alloc_zeros(top / 4).expect("device buffer");
        let mut spare: CudaSlice<f32> = stream.alloc_zeros(top / 4).expect("device buffer");
        let (mut p_in, mut p_out) = (Pinned::new(&dev, top), Pinned::new(&dev, top));
        let dptr = |b: &mut CudaSlice<f32>| {
            let (p, _sync) = b.device_ptr(&stream);
            duralumin::device::DevicePtr::new(p)
        };
        let (ptr, spare_ptr) = (dptr(&mut buf), dptr(&mut spare));
        let sync = || {
            stream.synchronize().expect("synchronize");
            other.synchronize().expect("synchronize");
        };
        if me == 0 {
            // The device's name says when this ran on the driver simulator ("cudasim (CPU)"),
            // whose numbers are the CPU's (or its timing model's, with CUDASIM_COPY_GBPS).
            let model = std::env::var("CUDASIM_COPY_GBPS").map_or(String::new(), |g| format!(", copy model {g} GB/s"));
            println!("\n== np = {np} (ranks share GPU 0: {name}{model}), flag path {:?} ==", dev.flag_path());
            for (path, us) in &latency {
                println!("| stream-wait release + signal round trip, {path:?} | {us:.1} us |");
            }
            println!(
                "| bytes | bound us | pipelined us | fraction of bound | whole-buffer us | its fraction | pipelined/whole | manual us | host MPI us | enqueue p50 us | enqueue max us | mover us | its fraction | mover enqueue p50 us | mover enqueue max us | one-block mover fraction |"
            );
        }

        let comm = |config: HostTransferConfig| {
            HostTransferCommunicator::with_config(&world, dev.clone(), Arc::clone(&stream), config)
                .expect("communicator")
        };
        let pipelined = comm(HostTransferConfig::default());
        // The same chunks, each operation's device side one mover kernel.
        let mover = comm(HostTransferConfig::default().with_mover_min_chunks(Some(1)));
        let one_block = comm(HostTransferConfig::default().with_mover_min_chunks(Some(1)).with_mover_blocks(1));
        if me == 0 && !dev.has_mover() {
            println!("| mover | not loaded (the device kernels were not built): its columns time the copy engines |");
        } else if me == 0 {
            println!(
                "| mover blocks | {} (at most one per multiprocessor) |",
                HostTransferConfig::default().mover_blocks
            );
        }
        // Aluminum's method: one chunk of the whole buffer, in place (one ring cell).
        let whole =
            comm(HostTransferConfig::default().with_chunk_bytes(top).with_pipeline_chunks(1).with_ring_cells(1));
        let mut checks = Vec::new();
        for bytes in SIZES.into_iter().filter(|&s| s <= max) {
            let n = bytes / 4;
            let r = reps(bytes);
            let shape = Copy2d::contiguous(bytes);
            // The bound: both directions at once, on two streams.
            let t_bound = time_us(
                &world,
                r,
                || {
                    // SAFETY: each side holds at least `bytes` bytes and outlives the
                    // synchronized copies; the two copies touch different buffers.
                    unsafe {
                        dev.copy_d2h(&stream, p_in.ptr, ptr, shape, None).expect("d2h");
                        dev.copy_h2d(&other, spare_ptr, p_out.ptr, shape, None).expect("h2d");
                    }
                },
                sync,
            );
            let mut view = buf.slice_mut(0..n);
            // An allreduce's time per operation, and each call's enqueue time.
            let mut staged = |comm: &HostTransferCommunicator<CudaDevice>| {
                let mut calls = Vec::new();
                let t = time_us(
                    &world,
                    r,
                    || {
                        let t = Instant::now();
                        comm.allreduce_in_place(&mut view, Sum).expect("allreduce");
                        calls.push(t.elapsed());
                    },
                    || comm.synchronize().expect("synchronize"),
                );
                (t, calls)
            };
            let (t_pipe, enqueue) = staged(&pipelined);
            let (t_mover, mover_enqueue) = staged(&mover);
            let (t_one_block, _) = staged(&one_block);
            let t_whole = time_us(
                &world,
                r,
                || whole.allreduce_in_place(&mut view, Sum).expect("allreduce"),
                || whole.synchronize().expect("synchronize"),
            );
            // The manual way: synchronize, copy out, MPI_Allreduce, copy back, synchronize.
            let t_manual = time_us(
                &world,
                r,
                || {
                    // SAFETY: both sides hold `bytes` bytes; the stream is synchronized before
                    // the host touches the pinned buffers.
                    unsafe { dev.copy_d2h(&stream, p_in.ptr, ptr, shape, None) }.expect("d2h");
                    sync();
                    let src = p_in.f32s(n).to_vec();
                    world.all_reduce_into(&src[..], p_out.f32s(n), SystemOperation::sum());
                    // SAFETY: as above.
                    unsafe { dev.copy_h2d(&stream, ptr, p_out.ptr, shape, None) }.expect("h2d");
                    sync();
                },
                || {},
            );
            let t_mpi = (np > 1).then(|| {
                let src = vec![1.0f32; n];
                time_us(&world, r, || world.all_reduce_into(&src[..], p_out.f32s(n), SystemOperation::sum()), || {})
            });
            // The timed calls' enqueue times (the warm-up's left out): median and slowest.
            let spread = |calls: &[std::time::Duration]| {
                let mut timed: Vec<f64> = calls[WARM_UP..].iter().map(|d| d.as_secs_f64() * 1e6).collect();
                timed.sort_by(f64::total_cmp);
                (max_over(&world, timed[timed.len() / 2]), max_over(&world, timed[timed.len() - 1]))
            };
            let (p50, slowest) = spread(&enqueue);
            let (mover_p50, mover_slowest) = spread(&mover_enqueue);
            let frac = t_bound / t_pipe;
            let bound_both = t_mpi.map_or(t_bound, |m| m.max(t_bound));
            if me == 0 {
                println!(
                    "| {bytes} | {t_bound:.1} | {t_pipe:.1} | {frac:.2} | {t_whole:.1} | {:.2} | {:.2}x | {t_manual:.1} | {} | {p50:.1} | {slowest:.1} | {t_mover:.1} | {:.2} | {mover_p50:.1} | {mover_slowest:.1} | {:.2} |",
                    t_bound / t_whole,
                    t_whole / t_pipe,
                    t_mpi.map_or("-".into(), |t| format!("{t:.1}")),
                    t_bound / t_mover,
                    t_bound / t_one_block,
                );
            }
            if bytes == top {
                let what = format!("pipelined allreduce {} MiB, fraction of min(copy bound, host MPI)", top >> 20);
                checks.push((what, bound_both / t_pipe, 0.8, true));
            }
            if bytes >= 16 << 20 {
                checks.push((
                    format!("pipelined speed-up over whole-buffer staging, {bytes} B"),
                    t_whole / t_pipe,
                    1.5,
                    true,
                ));
            }
            checks.push((format!("enqueue time {bytes} B, slowest call, us"), slowest, 10.0, false));
            checks.push((format!("mover enqueue time {bytes} B, slowest call, us"), mover_slowest, 10.0, false));
        }
        // The copies of the manual row used `p_in`/`p_out`; keep them alive until here.
        drop((p_in, p_out));
        drop((pipelined, mover, one_block, whole));
        if me == 0 {
            for (what, value, target, at_least) in checks {
                let ok = if at_least { value >= target } else { value <= target };
                let cmp = if at_least { ">=" } else { "<=" };
                println!(
                    "| check | {what} | {value:.2} | target {cmp} {target} | {} |",
                    if ok { "met" } else { "MISSED" }
                );
            }
        }
    }

    /// Median microseconds from the host raising a flag a stream waits on to the host seeing a
    /// second flag the stream raises right after the wait.
    fn release_latency(ctx: &Arc<CudaContext>, path: FlagPath) -> f64 {
        let dev = CudaDevice::with_flag_path(Arc::clone(ctx), path).expect("CUDA device");
        let stream: Arc<CudaStream> = ctx.new_stream().expect("stream");
        let pools = Pools::new(Arc::new(dev.clone()), 1 << 20);
        let (go, back) = (pools.flag().expect("flag"), pools.flag().expect("flag"));
        let mut times = Vec::new();
        for round in 1..=200u32 {
            // SAFETY: both flag slots live until the stream is synchronized below.
            unsafe {
                dev.wait_flag(&stream, go.flag(), round, None).expect("wait");
                dev.write_flag(&stream, back.flag(), round).expect("write");
            }
            std::thread::sleep(Duration::from_micros(200));
            let t = Instant::now();
            go.store(round);
            while back.load() != round {
                std::hint::spin_loop();
            }
            times.push(t.elapsed());
        }
        stream.synchronize().expect("synchronize");
        times.sort();
        times[times.len() / 2].as_secs_f64() * 1e6
    }
}
