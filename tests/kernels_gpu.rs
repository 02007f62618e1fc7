//! The embedded PTX on a real NVIDIA GPU: every builtin (element, operator) reduction and the
//! pack/unpack kernels against the host bodies' results, then bandwidth (reduce f32 sum and pack
//! over 256 MiB, as fractions of device-to-device copy bandwidth) and stream-wait release latency.
//!
//! Ignored by default, since CI machines have no GPU: `scripts/gpu.sh` runs it with
//! `--ignored`. Without a CUDA driver it prints `SKIPPED: ...` and checks nothing.
// Test values are cut from counters, ranks and random numbers on purpose (all small, or
// wanted modulo the type): the cast lints are noise here.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap, clippy::cast_sign_loss)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{self, CUdevice_attribute, CUevent_flags};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, LaunchArgs, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;
use duralumin::device_code::{self, KernelName, ReduceKernel, fixed};
use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::half::{bf16, f16};
use duralumin_kernels::pack::Segment;
use duralumin_kernels::{Element, ReduceOp, Sum, bytemuck};

#[path = "common/rng.rs"]
mod rng;
use rng::Rng;

/// Verifiable data: any bits for integers, small integers for floats (exact in any order).
trait Sample: Element {
    fn sample(rng: &mut Rng) -> Self;
}

macro_rules! int_sample {
    ($($t:ty),*) => {$(
        impl Sample for $t {
            fn sample(rng: &mut Rng) -> Self {
                if rng.next() % 4 == 0 { (rng.next() % 2) as $t } else { rng.next() as $t }
            }
        }
    )*};
}
int_sample!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! float_sample {
    ($($t:ty: $from:expr),*) => {$(
        impl Sample for $t {
            fn sample(rng: &mut Rng) -> Self {
                $from((rng.next() % 17) as f32 - 8.0)
            }
        }
    )*};
}
float_sample!(f32: |x| x, f64: f64::from, f16: f16::from_f32, bf16: bf16::from_f32);

struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
    sms: u32,
}

impl Gpu {
    fn function(&self, name: &str) -> CudaFunction {
        self.module.load_function(name).unwrap_or_else(|e| panic!("loading {name}: {e:?}"))
    }

    /// A grid-stride launch shape: 256 threads per block, enough blocks to fill the GPU a few
    /// times over but no more than the work needs.
    fn config(&self, items: usize) -> LaunchConfig {
        let blocks = items.div_ceil(256 * 4).clamp(1, self.sms as usize * 8) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
    }

    fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> CudaSlice<u8> {
        // At least one byte: zero-length allocations have no address to offset from.
        let mut bytes = bytemuck::cast_slice::<T, u8>(data).to_vec();
        bytes.resize(bytes.len().max(1) + 64, 0);
        self.stream.clone_htod(&bytes).unwrap()
    }

    fn download<T: Element>(&self, slice: &CudaSlice<u8>, byte_offset: usize, n: usize) -> Vec<T> {
        let bytes = self.stream.clone_dtoh(slice).unwrap();
        bytes[byte_offset..byte_offset + n * size_of::<T>()]
            .chunks_exact(size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }

    fn ptr(&self, slice: &CudaSlice<u8>) -> u64 {
        let (ptr, _sync) = slice.device_ptr(&self.stream);
        ptr
    }

    /// Launches `f` with `args` pushed in order.
    fn launch<'a>(&'a self, f: &'a CudaFunction, cfg: LaunchConfig, push: impl FnOnce(&mut LaunchArgs<'a>)) {
        let mut builder = self.stream.launch_builder(f);
        push(&mut builder);
        // SAFETY: every caller passes the kernel's exact parameter list (see
        // duralumin_kernels::names) with device pointers into live allocations of the sizes the
        // kernel's `# Safety` section requires.
        unsafe { builder.launch(cfg) }.unwrap();
    }

    /// Milliseconds `work` takes on the stream (median of `reps`).
    fn time_ms(&self, reps: usize, mut work: impl FnMut()) -> f64 {
        let mut times = Vec::with_capacity(reps);
        for _ in 0..reps {
            let start = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
            let end = self.ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)).unwrap();
            start.record(&self.stream).unwrap();
            work();
            end.record(&self.stream).unwrap();
            end.synchronize().unwrap();
            times.push(f64::from(start.elapsed_ms(&end).unwrap()));
        }
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    }
}

/// Runs reduce, reduce3 and finish of one pair on the GPU and compares them with the host bodies.
fn check_pair<T: Sample + PartialEq, O: ReduceOp<T>>(gpu: &Gpu, rng: &mut Rng) {
    let names = ReduceKernel::ALL.map(|k| KernelName::reduce::<T, O>(k));
    let [reduce, reduce3, finish] = names.map(|n| gpu.function(n.as_str()));
    for (n, offset) in [(0usize, 0usize), (1, 0), (1001, 1), (1001, 0), ((1 << 20) + 3, 3)] {
        let a: Vec<T> = (0..n).map(|_| T::sample(rng)).collect();
        let b: Vec<T> = (0..n).map(|_| T::sample(rng)).collect();
        let mut expected = a.clone();
        HostGrid::SINGLE.reduce::<T, O>(&mut expected, &b);
        let mut finished = expected.clone();
        HostGrid::SINGLE.finish::<T, O>(&mut finished, 3);

        let off = offset * size_of::<T>();
        let mut padded_a = vec![a.first().copied().unwrap_or_else(T::zeroed); offset];
        padded_a.extend_from_slice(&a);
        let mut padded_b = vec![b.first().copied().unwrap_or_else(T::zeroed); offset];
        padded_b.extend_from_slice(&b);
        let (da, db) = (gpu.upload(&padded_a), gpu.upload(&padded_b));
        let (pa, pb) = (gpu.ptr(&da) + off as u64, gpu.ptr(&db) + off as u64);
        let context = format!("{}/{} n={n} offset={offset}", T::NAME, O::NAME);

        gpu.launch(&reduce, gpu.config(n), |l| {
            l.arg(&pa).arg(&pb).arg(&n);
        });
        assert!(gpu.download::<T>(&da, off, n) == expected, "reduce {context}");

        let dout = gpu.upload(&vec![T::zeroed(); n + offset]);
        let pout = gpu.ptr(&dout) + off as u64;
        let da = gpu.upload(&padded_a);
        let pa = gpu.ptr(&da) + off as u64;
        gpu.launch(&reduce3, gpu.config(n), |l| {
            l.arg(&pout).arg(&pa).arg(&pb).arg(&n);
        });
        assert!(gpu.download::<T>(&dout, off, n) == expected, "reduce3 {context}");

        let ranks = 3u32;
        gpu.launch(&finish, gpu.config(n), |l| {
            l.arg(&pout).arg(&n).arg(&ranks);
        });
        assert!(gpu.download::<T>(&dout, off, n) == finished, "finish {context}");
    }
}

macro_rules! sweep_builtin_pairs {
    ($gpu:expr, $rng:expr, $checked:expr; $($elem:ty = $elem_name:literal => [$($op:ty = $op_name:literal),+ $(,)?]);+ $(;)?) => {
        $($(
            check_pair::<$elem, $op>($gpu, $rng);
            *$checked += 1;
        )+)+
    };
}

fn check_pack(gpu: &Gpu, rng: &mut Rng) {
    let copy_2d = gpu.function(fixed::COPY_2D);
    let pack = gpu.function(fixed::PACK_SEGMENTS);
    let unpack = gpu.function(fixed::UNPACK_SEGMENTS);
    for (row_bytes, rows, src_pitch, dst_pitch, src_off) in [
        (1usize, 1usize, 1usize, 1usize, 0usize),
        (12, 7, 20, 12, 4),
        (64, 1000, 96, 64, 3),
        (4096, 257, 8192, 4096, 16),
    ] {
        let src: Vec<u8> = (0..src_off + rows * src_pitch).map(|_| rng.next() as u8).collect();
        let mut expected = vec![0u8; rows * dst_pitch];
        HostGrid::SINGLE.copy_2d(&mut expected, dst_pitch, &src[src_off..], src_pitch, row_bytes, rows);
        let (dsrc, ddst) = (gpu.upload(&src), gpu.upload(&vec![0u8; rows * dst_pitch]));
        let (ps, pd) = (gpu.ptr(&dsrc) + src_off as u64, gpu.ptr(&ddst));
        gpu.launch(&copy_2d, gpu.config(rows * row_bytes / 16 + 1), |l| {
            l.arg(&pd).arg(&dst_pitch).arg(&ps).arg(&src_pitch).arg(&row_bytes).arg(&rows);
        });
        assert_eq!(gpu.download::<u8>(&ddst, 0, expected.len()), expected, "copy_2d {row_bytes}x{rows}");
    }

    let segments: Vec<Segment> =
        (0..37).map(|k| Segment::new(k * 70_001 + k % 5, 513 + (k * 9_973) % 60_000)).collect();
    let scattered_len = segments.iter().map(|s| (s.offset + s.len) as usize).max().unwrap_or(0);
    let total: usize = segments.iter().map(|s| s.len as usize).sum();
    let scattered: Vec<u8> = (0..scattered_len).map(|_| rng.next() as u8).collect();
    let mut expected = vec![0u8; total];
    HostGrid::SINGLE.pack_segments(&mut expected, &scattered, &segments);
    let (dscat, dpack, dsegs) = (gpu.upload(&scattered), gpu.upload(&vec![0u8; total]), gpu.upload(&segments));
    let (pscat, ppack, psegs, count) = (gpu.ptr(&dscat), gpu.ptr(&dpack), gpu.ptr(&dsegs), segments.len());
    gpu.launch(&pack, gpu.config(total / 16), |l| {
        l.arg(&ppack).arg(&pscat).arg(&psegs).arg(&count);
    });
    assert_eq!(gpu.download::<u8>(&dpack, 0, total), expected, "pack_segments");

    let dback = gpu.upload(&vec![0u8; scattered_len]);
    let pback = gpu.ptr(&dback);
    gpu.launch(&unpack, gpu.config(total / 16), |l| {
        l.arg(&pback).arg(&ppack).arg(&psegs).arg(&count);
    });
    let mut back = vec![0u8; scattered_len];
    HostGrid::SINGLE.unpack_segments(&mut back, &expected, &segments);
    assert_eq!(gpu.download::<u8>(&dback, 0, scattered_len), back, "unpack_segments");
}

/// Bandwidth table: reduce f32 sum and pack (2-D and segments), 256 MiB each, against
/// device-to-device copies of the same size.
fn measure_bandwidth(gpu: &Gpu) {
    const BYTES: usize = 256 << 20;
    let gbps = |bytes_moved: usize, ms: f64| bytes_moved as f64 / (ms * 1e-3) / 1e9;
    let a = gpu.stream.alloc_zeros::<u8>(BYTES).unwrap();
    let mut b = gpu.stream.alloc_zeros::<u8>(BYTES).unwrap();
    let copy_ms = gpu.time_ms(10, || gpu.stream.memcpy_dtod(&a, &mut b).unwrap());
    let copy = gbps(2 * BYTES, copy_ms);

    let reduce = gpu.function(KernelName::reduce::<f32, Sum>(ReduceKernel::Reduce).as_str());
    let (pa, pb, n) = (gpu.ptr(&a), gpu.ptr(&b), BYTES / 4);
    let reduce_ms = gpu.time_ms(10, || {
        gpu.launch(&reduce, gpu.config(n / 4), |l| {
            l.arg(&pb).arg(&pa).arg(&n);
        })
    });
    let reduce_bw = gbps(3 * BYTES, reduce_ms);

    // Pack a 2-D region: 4 KiB rows out of 8 KiB pitch (half the source).
    let copy_2d = gpu.function(fixed::COPY_2D);
    let src = gpu.stream.alloc_zeros::<u8>(2 * BYTES).unwrap();
    let psrc = gpu.ptr(&src);
    let (row, pitch, rows) = (4096usize, 8192usize, BYTES / 4096);
    let pack2d_ms = gpu.time_ms(10, || {
        gpu.launch(&copy_2d, gpu.config(BYTES / 16), |l| {
            l.arg(&pb).arg(&row).arg(&psrc).arg(&pitch).arg(&row).arg(&rows);
        })
    });
    let pack2d_bw = gbps(2 * BYTES, pack2d_ms);

    // Pack 64 segments (a v-collective over 64 ranks) of 4 MiB minus a few bytes each.
    let pack = gpu.function(fixed::PACK_SEGMENTS);
    let segments: Vec<Segment> =
        (0..64u64).map(|k| Segment::new(k * 2 * (4 << 20) + 8 * (k % 3), (4 << 20) - 4 * (k % 5))).collect();
    let packed: usize = segments.iter().map(|s| s.len as usize).sum();
    let dsegs = gpu.upload(&segments);
    let (psegs, count) = (gpu.ptr(&dsegs), segments.len());
    let segs_ms = gpu.time_ms(10, || {
        gpu.launch(&pack, gpu.config(BYTES / 16), |l| {
            l.arg(&pb).arg(&psrc).arg(&psegs).arg(&count);
        })
    });
    let segs_bw = gbps(2 * packed, segs_ms);

    println!("| measurement (256 MiB) | time (ms) | GB/s (read + write) | fraction of D2D copy |");
    println!("|---|---|---|---|");
    println!("| device-to-device copy | {copy_ms:.3} | {copy:.1} | 1.00 |");
    println!("| reduce f32 sum | {reduce_ms:.3} | {reduce_bw:.1} | {:.2} (target >= 0.9) |", reduce_bw / copy);
    println!(
        "| pack 2-D (4 KiB rows, 8 KiB pitch) | {pack2d_ms:.3} | {pack2d_bw:.1} | {:.2} (target >= 0.8) |",
        pack2d_bw / copy
    );
    println!("| pack 64 segments | {segs_ms:.3} | {segs_bw:.1} | {:.2} (target >= 0.8) |", segs_bw / copy);
}

/// Pinned, device-mapped host memory holding two flags.
struct MappedFlags {
    host: *mut u32,
    device: u64,
}

impl MappedFlags {
    fn new(ctx: &Arc<CudaContext>) -> MappedFlags {
        ctx.bind_to_thread().unwrap();
        // SAFETY: a plain allocation of 8 bytes of pinned host memory, mapped for the device
        // (not write-combined: the host reads it).
        let host = unsafe {
            cudarc::driver::result::malloc_host(8, sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE)
        }
        .unwrap()
        .cast::<u32>();
        // SAFETY: `host` is 8 valid, 4-byte aligned bytes.
        unsafe { host.write_bytes(0, 2) };
        let mut device = 0;
        // SAFETY: `host` was allocated with CU_MEMHOSTALLOC_DEVICEMAP in the current context.
        let status = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) };
        assert_eq!(status, sys::CUresult::CUDA_SUCCESS);
        MappedFlags { host, device }
    }

    fn flag(&self, i: usize) -> &AtomicU32 {
        assert!(i < 2);
        // SAFETY: the allocation holds two aligned u32s, lives as long as `self`, and is accessed
        // only atomically (by the host here and by the kernels' atomics).
        unsafe { AtomicU32::from_ptr(self.host.add(i)) }
    }
}

impl Drop for MappedFlags {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_host in `new`; no kernel uses it any more (the test
        // synchronizes before dropping).
        let _ = unsafe { cudarc::driver::result::free_host(self.host.cast()) };
    }
}

/// Stream-wait release latency: the host sets the flag a waiting kernel polls, a signal kernel
/// queued behind it sets a second flag, the host sees it. The round trip bounds the release
/// latency from above.
fn measure_stream_wait(gpu: &Gpu) {
    let stream = gpu.ctx.new_stream().unwrap();
    let wait = gpu.function(fixed::STREAM_WAIT);
    let signal = gpu.function(fixed::SIGNAL);
    let flags = MappedFlags::new(&gpu.ctx);
    let (go, done) = (flags.device, flags.device + 4);
    let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (32, 1, 1), shared_mem_bytes: 0 };
    let mut rtts = Vec::new();
    for value in 1..=200u32 {
        let mut b = stream.launch_builder(&wait);
        b.arg(&go).arg(&value);
        // SAFETY: `go` is a device-mapped host flag that outlives the launch (synchronized below).
        unsafe { b.launch(one) }.unwrap();
        let mut b = stream.launch_builder(&signal);
        b.arg(&done).arg(&value);
        // SAFETY: as above for `done`.
        unsafe { b.launch(one) }.unwrap();
        std::thread::sleep(Duration::from_micros(500));
        let start = Instant::now();
        flags.flag(0).store(value, Ordering::Release);
        while flags.flag(1).load(Ordering::Acquire) != value {
            assert!(start.elapsed() < Duration::from_secs(5), "stream-wait did not release (value {value})");
            std::hint::spin_loop();
        }
        rtts.push(start.elapsed());
    }
    stream.synchronize().unwrap();
    rtts.sort();
    println!(
        "stream-wait release round trip (host store -> wait kernel -> signal kernel -> host load), 200 runs: median {:.2} us, p90 {:.2} us, max {:.2} us",
        rtts[100].as_secs_f64() * 1e6,
        rtts[180].as_secs_f64() * 1e6,
        rtts[199].as_secs_f64() * 1e6
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; run scripts/gpu.sh"]
fn builtin_kernels_on_the_gpu() {
    // SAFETY: only tries to dlopen libcuda; no other cudarc call happens before it says yes.
    if !unsafe { sys::is_culib_present() } {
        println!("SKIPPED: no CUDA driver (libcuda) on this machine");
        return;
    }
    let module = device_code::builtin();
    let Some(ptx) = module.ptx else {
        println!("SKIPPED: the builtin PTX was not built: {}", module.unavailable.unwrap_or("unknown reason"));
        return;
    };
    if CudaContext::device_count().unwrap_or(0) == 0 {
        println!("SKIPPED: the CUDA driver sees no GPU");
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    let sms = ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).unwrap() as u32;
    println!(
        "device: {} (sm_{}{}, {sms} SMs)",
        ctx.name().unwrap(),
        ctx.compute_capability().unwrap().0,
        ctx.compute_capability().unwrap().1
    );
    let started = Instant::now();
    let loaded = ctx.load_module(Ptx::from_src(ptx.text)).unwrap();
    println!(
        "PTX module ({} entries) loaded and JIT-compiled in {:.2} s",
        module.entries.len(),
        started.elapsed().as_secs_f64()
    );
    let gpu = Gpu { stream: ctx.new_stream().unwrap(), ctx, module: loaded, sms };

    let mut rng = Rng(0x5eed);
    let mut checked = 0;
    duralumin_kernels::builtin_reduce_pairs!(sweep_builtin_pairs, &gpu, &mut rng, &mut checked;);
    println!("reduce, reduce3, finish: {checked} builtin (element, operator) pairs match the host");
    check_pack(&gpu, &mut rng);
    println!("copy_2d, pack_segments, unpack_segments match the host");
    measure_bandwidth(&gpu);
    measure_stream_wait(&gpu);
}
