//! HostTransfer on a CUDA GPU: in-place f32 sum allreduce from 4 KiB to 256 MiB, pipelined
//! (the default settings) against staging the whole buffer at once (Aluminum's method), the
//! bulk-synchronous manual way (synchronize, copy to pinned memory, `MPI_Allreduce`, copy back)
//! and the device-reduction path (allgather, reduce on the GPU); each as algorithm bandwidth and
//! as a fraction of the measured min(D2H, H2D) copy bandwidth, with the host-thread enqueue
//! time per operation; the pipelined path again with the proxy thread queueing the copies
//! (`proxy_queues_copies`: its time and enqueue time), and in fixed `chunk_bytes` chunks however
//! many (`max_chunks = usize::MAX`: its time and enqueue time); then the stream-wait release
//! latency of both flag paths.
//!
//! `cargo bench --bench host_transfer_gpu [-- --np 1,2 --max-bytes N]` relaunches itself under
//! `mpirun` per rank count (the ranks share GPU 0). Without a CUDA device it prints `SKIPPED`.
//! Rows start with `| ` (what `scripts/gpu.sh` collects); targets are printed as checks, never
//! asserted.

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
        for np in super::relaunch::rank_counts("1,2") {
            relaunch(np, &[("DURALUMIN_BENCH_MAX", max.clone())], &[]);
        }
    }

    /// Microseconds per call of `op` after one warm-up call (see [`timing::time_us`]).
    fn time_us(world: &SimpleCommunicator, reps: usize, mut op: impl FnMut(), finish: impl Fn()) -> f64 {
        op();
        finish();
        timing::time_us(world, reps, op, finish)
    }

    fn reps(bytes: usize) -> usize {
        ((64usize << 20) / bytes).clamp(3, 200)
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
        let dev = CudaDevice::new(Arc::clone(&ctx)).expect("CUDA device");
        let stream = ctx.new_stream().expect("stream");
        let top = SIZES.into_iter().filter(|&s| s <= max).max().unwrap_or(4 << 10);
        let mut buf: CudaSlice<f32> = stream.alloc_zeros(top / 4).expect("device buffer");
        let (mut p_in, mut p_out) = (Pinned::new(&dev, top), Pinned::new(&dev, top));

        // Copy bandwidth with every rank copying at once (they share the GPU's PCIe link).
        let ptr = {
            let (p, _sync) = buf.device_ptr(&stream);
            duralumin::device::DevicePtr::new(p)
        };
        let sync = || stream.synchronize().expect("synchronize");
        let shape = Copy2d::contiguous(top);
        let d2h = time_us(
            &world,
            3,
            // SAFETY: both sides hold `top` bytes and outlive the synchronized copies.
            || unsafe { dev.copy_d2h(&stream, p_in.ptr, ptr, shape, None) }.expect("d2h"),
            sync,
        );
        let h2d = time_us(
            &world,
            3,
            // SAFETY: as above.
            || unsafe { dev.copy_h2d(&stream, ptr, p_in.ptr, shape, None) }.expect("h2d"),
            sync,
        );
        let gbs = |bytes: usize, us: f64| bytes as f64 / (us * 1e3);
        let copy_bw = gbs(top, d2h).min(gbs(top, h2d));
        if me == 0 {
            // The device's name says when this ran on the driver simulator ("cudasim (CPU)"),
            // whose numbers are the CPU's.
            let name = ctx.name().unwrap_or_else(|_| "an unnamed device".into());
            println!("\n== np = {np} (ranks share GPU 0: {name}), flag path {:?} ==", dev.flag_path());
            println!(
                "| copy {} MiB | D2H {:.1} GB/s | H2D {:.1} GB/s | per rank, all ranks at once |",
                top >> 20,
                gbs(top, d2h),
                gbs(top, h2d)
            );
            println!(
                "| bytes | pipelined us | GB/s | of copy bw | whole-buffer us | manual us | device-reduce us | pipelined/whole | enqueue us | proxy-queued us | its enqueue us | fixed chunks us | its enqueue us |"
            );
        }

        let comm = |config: HostTransferConfig| {
            HostTransferCommunicator::with_config(&world, dev.clone(), Arc::clone(&stream), config)
                .expect("communicator")
        };
        let pipelined = comm(HostTransferConfig::default());
        let whole = comm(HostTransferConfig::default().with_chunk_bytes(usize::MAX >> 2).with_depth(1));
        let device_reduce = comm(HostTransferConfig::default().with_device_reduce_max_bytes(usize::MAX));
        // The proxy thread queueing the copies: O(1) enqueue, unsafe when streams share a queue.
        let proxied = comm(HostTransferConfig::default().with_proxy_queues_copies(true));
        // Every operation in `chunk_bytes` chunks, however many (the default grows them past
        // `max_chunks`): a few device calls per chunk on the calling thread.
        let fixed = comm(HostTransferConfig::default().with_max_chunks(usize::MAX));
        let mut checks = Vec::new();
        for bytes in SIZES.into_iter().filter(|&s| s <= max) {
            let n = bytes / 4;
            let r = reps(bytes);
            let mut view = buf.slice_mut(0..n);
            // An operation's time, and the host thread's enqueue time of each repetition.
            let mut timed = |c: &HostTransferCommunicator<CudaDevice>| {
                let mut enqueue = Vec::new();
                let t = time_us(
                    &world,
                    r,
                    || {
                        let t = Instant::now();
                        c.allreduce_in_place(&mut view, Sum).expect("allreduce");
                        enqueue.push(t.elapsed());
                    },
                    || c.synchronize().expect("synchronize"),
                );
                (t, enqueue)
            };
            let (t_pipe, enqueue) = timed(&pipelined);
            let (t_proxied, enqueue_proxied) = timed(&proxied);
            let (t_fixed, enqueue_fixed) = timed(&fixed);
            let t_whole = time_us(
                &world,
                r,
                || whole.allreduce_in_place(&mut view, Sum).expect("allreduce"),
                || whole.synchronize().expect("synchronize"),
            );
            let t_dev = (np > 1 && bytes <= 16 << 20).then(|| {
                time_us(
                    &world,
                    r,
                    || device_reduce.allreduce_in_place(&mut view, Sum).expect("allreduce"),
                    || device_reduce.synchronize().expect("synchronize"),
                )
            });
            // The manual way: synchronize, copy out, MPI_Allreduce, copy back, synchronize.
            let shape = Copy2d::contiguous(bytes);
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
            let median = |mut v: Vec<std::time::Duration>| {
                v.sort();
                max_over(&world, v[v.len() / 2].as_secs_f64() * 1e6)
            };
            let (enq, enq_proxied, enq_fixed) = (median(enqueue), median(enqueue_proxied), median(enqueue_fixed));
            let frac = gbs(bytes, t_pipe) / copy_bw;
            if me == 0 {
                println!(
                    "| {bytes} | {t_pipe:.1} | {:.2} | {frac:.2} | {t_whole:.1} | {t_manual:.1} | {} | {:.2}x | {enq:.1} | {t_proxied:.1} | {enq_proxied:.1} | {t_fixed:.1} | {enq_fixed:.1} |",
                    gbs(bytes, t_pipe),
                    t_dev.map_or("-".into(), |t| format!("{t:.1}")),
                    t_whole / t_pipe,
                );
            }
            if bytes == top {
                checks.push((
                    format!("pipelined allreduce {} MiB, fraction of copy bandwidth", top >> 20),
                    frac,
                    0.8,
                    true,
                ));
                checks.push(("pipelined speed-up over whole-buffer staging".into(), t_whole / t_pipe, 1.5, true));
            }
            checks.push((format!("enqueue time {bytes} B, us"), enq, 10.0, false));
        }
        // The copy-out of the manual row used `p_in`/`p_out`; keep them alive until here.
        drop((p_in, p_out));
        drop((pipelined, whole, device_reduce, proxied, fixed));

        for path in [FlagPath::StreamMemOps, FlagPath::Kernels] {
            let us = release_latency(&ctx, path);
            let us = max_over(&world, us);
            if me == 0 {
                println!("| stream-wait release + signal round trip, {path:?} | {us:.1} us |");
            }
        }
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
