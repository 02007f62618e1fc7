//! HostTransfer on a CUDA GPU: in-place f32 sum allreduce from 4 KiB to 256 MiB, pipelined
//! through the communicator's staging ring (the default settings) against staging the whole
//! buffer at once (Aluminum's method) and the bulk-synchronous manual way (synchronize, copy to
//! pinned memory, `MPI_Allreduce`, copy back), each against the bound: a device-to-host and a
//! host-to-device copy of the same bytes at once, on two streams, measured in the same run
//! (`fraction of bound` = bound time / operation time). The pipelined allreduce runs twice:
//! its copies queued chunk by chunk on the copy engines (the default on a GPU), and as one mover
//! kernel per operation (`HostTransferConfig::mover_min_chunks`), with each one's enqueue time;
//! the mover as the default number of blocks sharing the chunks (`mover_blocks`) and as one.
//! At np >= 2 also the host MPI allreduce of the same bytes. The host thread's enqueue time per
//! operation as the median and the slowest call. The flag release latency of both flag paths is
//! measured first, before any communicator exists; then one table per flag path (stream memory
//! operations, then the Rust wait and write kernels; `--flag-paths stream-mem-ops` or `kernels`
//! runs one).
//!
//! Every row runs untimed warm-up repetitions, then at least 10 timed ones (`--reps N`
//! overrides that, for the simulator's timing model in CI).
//!
//! After each table, the targets are printed as checks, and two verdicts read off the mover
//! columns: from which size (and so how many chunks, `HostTransferConfig::chunks_for`) the
//! mover keeps up with the copy engines, the value for the device's `mover_min_chunks`; and what
//! the default blocks gain over one, for `mover_blocks`.
//!
//! `--mover-blocks 8,16,32` adds a table per flag path: the mover at each of those block counts,
//! from 1 MiB (fraction of the bound, enqueue median); `--chunk-bytes 524288,4194304` one of the
//! copy-engine path at each of those fixed chunk sizes. Before the tables, what each kind of
//! stream item costs the calling thread to queue, and the stream to run (`item costs`).
//!
//! `cargo bench --bench host_transfer_gpu [-- --np 1,2 --max-bytes N --reps N --flag-paths P --mover-blocks L --chunk-bytes L]`
//! relaunches itself under `mpirun` per rank count (the ranks share GPU 0). Without a CUDA
//! device it prints `SKIPPED`. On cudasim with `CUDASIM_COPY_GBPS` set the copies take modelled
//! time, so the fractions say how well the pipeline overlaps. Rows start with `| ` (what
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

    use cudarc::driver::sys::CUdevice_attribute;
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
        let paths = super::relaunch::flag("--flag-paths").unwrap_or_default();
        let blocks = super::relaunch::flag("--mover-blocks").unwrap_or_default();
        let chunks = super::relaunch::flag("--chunk-bytes").unwrap_or_default();
        for np in super::relaunch::rank_counts("1,2") {
            let env = [
                ("DURALUMIN_BENCH_MAX", max.clone()),
                ("DURALUMIN_BENCH_REPS", reps.clone()),
                ("DURALUMIN_BENCH_FLAG_PATHS", paths.clone()),
                ("DURALUMIN_BENCH_MOVER_BLOCKS", blocks.clone()),
                ("DURALUMIN_BENCH_CHUNK_BYTES", chunks.clone()),
            ];
            relaunch(np, &env, &[]);
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

    /// The flag paths to measure: both, or the one `--flag-paths stream-mem-ops|kernels` names.
    fn flag_paths() -> Vec<FlagPath> {
        match std::env::var("DURALUMIN_BENCH_FLAG_PATHS").as_deref() {
            Ok("stream-mem-ops") => vec![FlagPath::StreamMemOps],
            Ok("kernels") => vec![FlagPath::Kernels],
            _ => vec![FlagPath::StreamMemOps, FlagPath::Kernels],
        }
    }

    /// One size's times, microseconds (the slowest rank's).
    struct Row {
        bytes: usize,
        bound: f64,
        pipelined: f64,
        whole: f64,
        manual: f64,
        mpi: Option<f64>,
        /// Enqueue of the pipelined operation, median and slowest call.
        enqueue: (f64, f64),
        mover: f64,
        mover_enqueue: (f64, f64),
        one_block: f64,
        /// Enqueue of the one-block mover (a plain launch, not a cooperative one), median.
        one_block_enqueue: f64,
    }

    /// What every table's rows use: the GPU buffers, pinned host memory and two streams.
    struct Setup {
        world: SimpleCommunicator,
        ctx: Arc<CudaContext>,
        stream: Arc<CudaStream>,
        other: Arc<CudaStream>,
        buf: CudaSlice<f32>,
        spare: CudaSlice<f32>,
        p_in: Pinned,
        p_out: Pinned,
        top: usize,
    }

    fn rank_main() {
        let universe = duralumin::init().expect("init");
        let world = universe.world();
        let max: usize = std::env::var("DURALUMIN_BENCH_MAX").ok().and_then(|s| s.parse().ok()).unwrap_or(256 << 20);
        let ctx = CudaContext::new(0).expect("CUDA context");
        // Before any communicator exists: the flag round trip of both paths.
        let mut latency = Vec::new();
        for path in [FlagPath::StreamMemOps, FlagPath::Kernels] {
            latency.push((path, max_over(&world, release_latency(&ctx, path))));
        }
        let costs = item_costs(&world, &ctx);
        let devs: Vec<CudaDevice> = flag_paths()
            .into_iter()
            .map(|path| CudaDevice::with_flag_path(Arc::clone(&ctx), path).expect("CUDA device"))
            .collect();
        let base = &devs[0];
        let (stream, other) = (ctx.new_stream().expect("stream"), ctx.new_stream().expect("stream"));
        let top = SIZES.into_iter().filter(|&s| s <= max).max().unwrap_or(4 << 10);
        let mut setup = Setup {
            buf: stream.alloc_zeros(top / 4).expect("device buffer"),
            spare: stream.alloc_zeros(top / 4).expect("device buffer"),
            p_in: Pinned::new(base, top),
            p_out: Pinned::new(base, top),
            world,
            ctx,
            stream,
            other,
            top,
        };
        if setup.world.rank() == 0 {
            println!("\n| item costs ({ITEMS} of a kind on an idle stream) | queue us per item | stream us per item |");
            for (what, queue, run) in &costs {
                println!("| {what} | {queue:.2} | {run:.2} |");
            }
        }
        for dev in &devs {
            header(&setup, dev, &latency);
            let comms = Comms::new(&setup, dev);
            let sizes = SIZES.into_iter().filter(|&s| s <= max);
            let rows: Vec<Row> = sizes.map(|bytes| row(&mut setup, dev, &comms, bytes)).collect();
            if setup.world.rank() == 0 {
                report(&rows, dev);
            }
            if dev.has_mover() {
                // The mover at each of `--mover-blocks`' block counts.
                let mover = |b| HostTransferConfig::default().with_mover_min_chunks(Some(1)).with_mover_blocks(b);
                scan(&mut setup, dev, &rows, ("DURALUMIN_BENCH_MOVER_BLOCKS", "blocks"), mover);
            }
            // The copy engines at each of `--chunk-bytes`' fixed chunk sizes.
            let fixed = |c| HostTransferConfig::default().with_chunk_bytes(c).with_min_chunk_bytes(c);
            scan(&mut setup, dev, &rows, ("DURALUMIN_BENCH_CHUNK_BYTES", "B chunks"), fixed);
        }
    }

    /// A table of the allreduce under each setting that environment variable `var` lists
    /// (comma-separated; none by default), `config` making a setting's configuration, from
    /// 1 MiB: fraction of the bound (each row's as measured in the table) and enqueue median, a
    /// row per size, beside the table's default pipelined fraction (rank 0). `unit` heads the
    /// columns.
    fn scan(
        setup: &mut Setup,
        dev: &CudaDevice,
        rows: &[Row],
        (var, unit): (&str, &str),
        config: impl Fn(usize) -> HostTransferConfig,
    ) {
        let list = std::env::var(var).unwrap_or_default();
        let settings: Vec<usize> = list.split(',').filter_map(|b| b.trim().parse().ok()).filter(|&b| b > 0).collect();
        if settings.is_empty() {
            return;
        }
        let comms: Vec<_> = settings
            .iter()
            .map(|&v| {
                HostTransferCommunicator::with_config(&setup.world, dev.clone(), Arc::clone(&setup.stream), config(v))
                    .expect("communicator")
            })
            .collect();
        if setup.world.rank() == 0 {
            let heads: Vec<String> =
                settings.iter().map(|v| format!("{v} {unit} fraction | {v} {unit} enqueue p50 us")).collect();
            println!("| bytes | default fraction | {} |", heads.join(" | "));
        }
        for row in rows.iter().filter(|r| r.bytes >= 1 << 20) {
            let r = reps(row.bytes);
            let cells: Vec<String> = comms
                .iter()
                .map(|comm| {
                    let (t, (p50, _)) = staged(setup, comm, row.bytes, r);
                    format!("{:.2} | {p50:.1}", row.bound / t)
                })
                .collect();
            if setup.world.rank() == 0 {
                println!("| {} | {:.2} | {} |", row.bytes, row.bound / row.pipelined, cells.join(" | "));
            }
        }
    }

    /// The table's title and column heads (rank 0).
    fn header(setup: &Setup, dev: &CudaDevice, latency: &[(FlagPath, f64)]) {
        if setup.world.rank() != 0 {
            return;
        }
        // The device's name says when this ran on the driver simulator ("cudasim (CPU)"),
        // whose numbers are the CPU's (or its timing model's, with CUDASIM_COPY_GBPS).
        let name = setup.ctx.name().unwrap_or_else(|_| "an unnamed device".into());
        let model = std::env::var("CUDASIM_COPY_GBPS").map_or(String::new(), |g| format!(", copy model {g} GB/s"));
        let np = setup.world.size();
        println!("\n== np = {np} (ranks share GPU 0: {name}{model}), flag path {:?} ==", dev.flag_path());
        for (path, us) in latency {
            println!("| stream-wait release + signal round trip, {path:?} | {us:.1} us |");
        }
        if dev.has_mover() {
            let blocks = HostTransferConfig::default().mover_blocks;
            // Without cooperative launches every mover runs as one block.
            let together = setup.ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH);
            let together = together.map_or_else(|e| format!("unknown ({e:?})"), |a| (a != 0).to_string());
            println!("| mover blocks | {blocks} (at most one per multiprocessor; cooperative launch: {together}) |");
        } else {
            println!("| mover | not loaded (the device kernels were not built): its columns time the copy engines |");
        }
        println!(
            "| bytes | bound us | pipelined us | fraction of bound | whole-buffer us | its fraction | pipelined/whole | manual us | host MPI us | enqueue p50 us | enqueue max us | mover us | its fraction | mover enqueue p50 us | mover enqueue max us | one-block mover fraction | one-block mover enqueue p50 us |"
        );
    }

    /// The communicators a table compares, on one device (flag path).
    struct Comms {
        /// The default settings: copies queued chunk by chunk on the copy engines.
        pipelined: HostTransferCommunicator<CudaDevice>,
        /// The same chunks, each operation's device side one mover kernel, of the default
        /// blocks and of one.
        mover: HostTransferCommunicator<CudaDevice>,
        one_block: HostTransferCommunicator<CudaDevice>,
        /// Aluminum's method: one chunk of the whole buffer, in place (one ring cell).
        whole: HostTransferCommunicator<CudaDevice>,
    }

    impl Comms {
        fn new(setup: &Setup, dev: &CudaDevice) -> Comms {
            let comm = |config: HostTransferConfig| {
                HostTransferCommunicator::with_config(&setup.world, dev.clone(), Arc::clone(&setup.stream), config)
                    .expect("communicator")
            };
            let mover = HostTransferConfig::default().with_mover_min_chunks(Some(1));
            let whole = HostTransferConfig::default().with_chunk_bytes(setup.top).with_pipeline_chunks(1);
            Comms {
                pipelined: comm(HostTransferConfig::default()),
                mover: comm(mover),
                one_block: comm(mover.with_mover_blocks(1)),
                whole: comm(whole.with_ring_cells(1)),
            }
        }
    }

    /// Measures one size and prints its row (rank 0).
    fn row(setup: &mut Setup, dev: &CudaDevice, comms: &Comms, bytes: usize) -> Row {
        let r = reps(bytes);
        let bound = copy_bound(setup, dev, bytes, r);
        let [(pipelined, enqueue), (mover, mover_enqueue), (one_block, one_block_enqueue), (whole, _)] =
            [&comms.pipelined, &comms.mover, &comms.one_block, &comms.whole].map(|comm| staged(setup, comm, bytes, r));
        let out = Row {
            bytes,
            bound,
            pipelined,
            whole,
            manual: manual(setup, dev, bytes, r),
            mpi: host_mpi(setup, bytes, r),
            enqueue,
            mover,
            mover_enqueue,
            one_block,
            one_block_enqueue: one_block_enqueue.0,
        };
        if setup.world.rank() == 0 {
            print_row(&out);
        }
        out
    }

    /// An in-place allreduce of `bytes` on `comm`: its time per operation, and its calls'
    /// enqueue times (median, slowest).
    fn staged(
        setup: &mut Setup,
        comm: &HostTransferCommunicator<CudaDevice>,
        bytes: usize,
        reps: usize,
    ) -> (f64, (f64, f64)) {
        let Setup { world, buf, .. } = setup;
        let mut view = buf.slice_mut(0..bytes / 4);
        let mut calls = Vec::new();
        let op = || {
            let t = Instant::now();
            comm.allreduce_in_place(&mut view, Sum).expect("allreduce");
            calls.push(t.elapsed());
        };
        let t = time_us(world, reps, op, || comm.synchronize().expect("synchronize"));
        (t, spread(world, &calls))
    }

    /// The bound: a device-to-host and a host-to-device copy of `bytes` at once, on two streams.
    fn copy_bound(setup: &mut Setup, dev: &CudaDevice, bytes: usize, reps: usize) -> f64 {
        let shape = Copy2d::contiguous(bytes);
        let (ptr, spare) = (dptr(&mut setup.buf, &setup.stream), dptr(&mut setup.spare, &setup.stream));
        let (p_in, p_out) = (setup.p_in.ptr, setup.p_out.ptr);
        let (stream, other) = (&setup.stream, &setup.other);
        let op = || {
            // SAFETY: each side holds at least `bytes` bytes and outlives the synchronized
            // copies; the two copies touch different buffers.
            unsafe {
                dev.copy_d2h(stream, p_in, ptr, shape, None).expect("d2h");
                dev.copy_h2d(other, spare, p_out, shape, None).expect("h2d");
            }
        };
        time_us(&setup.world, reps, op, || sync(stream, other))
    }

    /// The manual way: synchronize, copy out, `MPI_Allreduce`, copy back, synchronize.
    fn manual(setup: &mut Setup, dev: &CudaDevice, bytes: usize, reps: usize) -> f64 {
        let (shape, n) = (Copy2d::contiguous(bytes), bytes / 4);
        let ptr = dptr(&mut setup.buf, &setup.stream);
        let Setup { world, stream, other, p_in, p_out, .. } = setup;
        let op = || {
            // SAFETY: both sides hold `bytes` bytes; the stream is synchronized before the host
            // touches the pinned buffers.
            unsafe { dev.copy_d2h(stream, p_in.ptr, ptr, shape, None) }.expect("d2h");
            sync(stream, other);
            let src = p_in.f32s(n).to_vec();
            world.all_reduce_into(&src[..], p_out.f32s(n), SystemOperation::sum());
            // SAFETY: as above.
            unsafe { dev.copy_h2d(stream, ptr, p_out.ptr, shape, None) }.expect("h2d");
            sync(stream, other);
        };
        time_us(world, reps, op, || {})
    }

    /// The host MPI allreduce of the same bytes, at np >= 2.
    fn host_mpi(setup: &mut Setup, bytes: usize, reps: usize) -> Option<f64> {
        let n = bytes / 4;
        let Setup { world, p_out, .. } = setup;
        (world.size() > 1).then(|| {
            let src = vec![1.0f32; n];
            time_us(world, reps, || world.all_reduce_into(&src[..], p_out.f32s(n), SystemOperation::sum()), || {})
        })
    }

    fn dptr(buf: &mut CudaSlice<f32>, stream: &Arc<CudaStream>) -> duralumin::device::DevicePtr {
        let (p, _sync) = buf.device_ptr(stream);
        duralumin::device::DevicePtr::new(p)
    }

    fn sync(stream: &CudaStream, other: &CudaStream) {
        stream.synchronize().expect("synchronize");
        other.synchronize().expect("synchronize");
    }

    /// The timed calls' enqueue times (the warm-up's left out): median and slowest, the slowest
    /// rank's.
    fn spread(world: &SimpleCommunicator, calls: &[Duration]) -> (f64, f64) {
        let mut timed: Vec<f64> = calls[WARM_UP..].iter().map(|d| d.as_secs_f64() * 1e6).collect();
        timed.sort_by(f64::total_cmp);
        (max_over(world, timed[timed.len() / 2]), max_over(world, timed[timed.len() - 1]))
    }

    fn print_row(r: &Row) {
        println!(
            "| {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.2} | {:.2}x | {:.1} | {} | {:.1} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {:.1} |",
            r.bytes,
            r.bound,
            r.pipelined,
            r.bound / r.pipelined,
            r.whole,
            r.bound / r.whole,
            r.whole / r.pipelined,
            r.manual,
            r.mpi.map_or("-".into(), |t| format!("{t:.1}")),
            r.enqueue.0,
            r.enqueue.1,
            r.mover,
            r.bound / r.mover,
            r.mover_enqueue.0,
            r.mover_enqueue.1,
            r.bound / r.one_block,
            r.one_block_enqueue,
        );
    }

    /// The targets as checks, then what the mover columns say for the defaults (rank 0).
    fn report(rows: &[Row], dev: &CudaDevice) {
        let mut checks = Vec::new();
        if let Some(top) = rows.last() {
            let bound = top.mpi.map_or(top.bound, |m| m.max(top.bound));
            let what = format!("pipelined allreduce {} MiB, fraction of min(copy bound, host MPI)", top.bytes >> 20);
            checks.push((what, bound / top.pipelined, 0.8, true));
        }
        for r in rows.iter().filter(|r| r.bytes >= 16 << 20) {
            let what = format!("pipelined speed-up over whole-buffer staging, {} B", r.bytes);
            checks.push((what, r.whole / r.pipelined, 1.5, true));
        }
        for r in rows {
            checks.push((format!("enqueue time {} B, slowest call, us", r.bytes), r.enqueue.1, 10.0, false));
            checks.push((
                format!("mover enqueue time {} B, slowest call, us", r.bytes),
                r.mover_enqueue.1,
                10.0,
                false,
            ));
        }
        for (what, value, target, at_least) in checks {
            let ok = if at_least { value >= target } else { value <= target };
            let cmp = if at_least { ">=" } else { "<=" };
            let verdict = if ok { "met" } else { "MISSED" };
            println!("| check | {what} | {value:.2} | target {cmp} {target} | {verdict} |");
        }
        if dev.has_mover() {
            mover_verdict(rows);
        }
    }

    /// What the mover columns say: from how many chunks on the mover keeps up with the copy
    /// engines (one more than the most chunks of any size where it fell behind), for the
    /// device's `mover_min_chunks`; and what its blocks gain over one, for `mover_blocks`.
    fn mover_verdict(rows: &[Row]) {
        const SLACK: f64 = 1.05;
        let config = HostTransferConfig::default();
        let behind = rows.iter().filter(|r| r.mover > SLACK * r.pipelined).map(|r| config.chunks_for(r.bytes)).max();
        let min_chunks = behind.map_or(1, |c| c + 1);
        match rows.iter().find(|r| config.chunks_for(r.bytes) >= min_chunks) {
            Some(r) => println!(
                "| verdict | mover_min_chunks | the mover keeps up with the copy engines (within 5 %) at every size of at least {min_chunks} chunks (from {} B): set the device's mover_min_chunks to {min_chunks} |",
                r.bytes
            ),
            None if rows.is_empty() => {}
            None => println!(
                "| verdict | mover_min_chunks | the mover falls behind the copy engines at the largest size: keep the device off the mover |"
            ),
        }
        let large: Vec<&Row> = rows.iter().filter(|r| r.bytes >= 16 << 20).collect();
        if !large.is_empty() {
            let gain = large.iter().map(|r| r.one_block / r.mover).fold(f64::INFINITY, f64::min);
            println!(
                "| verdict | mover_blocks | {} blocks against one, from 16 MiB: at least {gain:.2}x |",
                config.mover_blocks
            );
        }
    }

    /// Items of a kind [`item_costs`] queues: few enough that waits and host functions behind
    /// them fit the device's command queue (200 of each hung an H200 run, most likely with the
    /// calling thread waiting for room while the waits it had queued waited for it).
    const ITEMS: u32 = 32;

    /// What the calling thread pays to queue each kind of stream item the staging engine uses,
    /// and what the stream takes to run it: [`ITEMS`] of a kind queued on an idle stream,
    /// microseconds per item (the slowest rank's) to queue them, and from the first call until
    /// the stream has run them all (the waits are released once all are queued, or after 100 ms
    /// if queueing blocks, which then shows in the queue column; a host function's round trip
    /// through the driver's thread is what the last column adds).
    fn item_costs(world: &SimpleCommunicator, ctx: &Arc<CudaContext>) -> Vec<(&'static str, f64, f64)> {
        let dev = CudaDevice::with_flag_path(Arc::clone(ctx), FlagPath::StreamMemOps).expect("CUDA device");
        let stream: Arc<CudaStream> = ctx.new_stream().expect("stream");
        let pools = Pools::new(Arc::new(dev.clone()), 1 << 20);
        let flag = pools.flag().expect("flag");
        let keep: duralumin::device::KeepAlive = Arc::new(());
        let host = Pinned::new(&dev, 4096);
        let mut buf: CudaSlice<f32> = stream.alloc_zeros(1024).expect("device buffer");
        let ptr = dptr(&mut buf, &stream);
        let shape = Copy2d::contiguous(4096);
        // The flag, the pinned and the device buffer outlive the stream's synchronization
        // below; the host raises the waits' values once all are queued.
        let kinds: [(&'static str, &dyn Fn(u32)); 5] = [
            ("counter write (cuStreamWriteValue32)", &|v| {
                // SAFETY: see above.
                unsafe { dev.write_flag(&stream, flag.flag(), v) }.expect("write")
            }),
            ("counter wait (cuStreamWaitValue32)", &|v| {
                // SAFETY: see above.
                unsafe { dev.wait_flag(&stream, flag.flag(), v + 1, None) }.expect("wait")
            }),
            ("counter wait + keep-alive (a host function behind it)", &|v| {
                // SAFETY: see above.
                unsafe { dev.wait_flag(&stream, flag.flag(), v + 1, Some(Arc::clone(&keep))) }.expect("wait")
            }),
            ("4 KiB device-to-host copy", &|_| {
                // SAFETY: see above.
                unsafe { dev.copy_d2h(&stream, host.ptr, ptr, shape, None) }.expect("d2h")
            }),
            ("4 KiB host-to-device copy", &|_| {
                // SAFETY: see above.
                unsafe { dev.copy_h2d(&stream, ptr, host.ptr, shape, None) }.expect("h2d")
            }),
        ];
        let mut out = Vec::new();
        for (what, queue) in kinds {
            stream.synchronize().expect("synchronize");
            flag.store(0);
            let t = Instant::now();
            let done = std::sync::atomic::AtomicBool::new(false);
            let queued = std::thread::scope(|scope| {
                // A backstop: the waits pass even if the device's queue fills before all are in.
                scope.spawn(|| {
                    while !done.load(std::sync::atomic::Ordering::Acquire) && t.elapsed() < Duration::from_millis(100) {
                        std::thread::sleep(Duration::from_micros(50));
                    }
                    flag.raise(ITEMS);
                });
                for v in 0..ITEMS {
                    queue(v);
                }
                let queued = t.elapsed();
                done.store(true, std::sync::atomic::Ordering::Release);
                queued
            });
            stream.synchronize().expect("synchronize");
            let ran = t.elapsed();
            let per = |d: Duration| max_over(world, d.as_secs_f64() * 1e6 / f64::from(ITEMS));
            out.push((what, per(queued), per(ran)));
        }
        out
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
