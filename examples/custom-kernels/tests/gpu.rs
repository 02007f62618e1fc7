//! The user kernels on a real NVIDIA GPU against the host bodies. Ignored by default (CI has no
//! GPU); `scripts/gpu.sh` runs it. Without a CUDA driver it prints `SKIPPED: ...`.

use cudarc::driver::{CudaContext, DevicePtr, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use duralumin::device_code::{self, KernelName, ReduceKernel};
use duralumin_example_custom_kernels::{ArgMin, Complex32, MinLoc, register};
use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::{Element, ReduceOp, Sum, bytemuck};

/// Runs `dst = op(dst, src)` (at element offset `offset`) on the GPU and returns `dst`.
fn reduce_on_gpu<T: Element, O: ReduceOp<T>>(
    ctx: &std::sync::Arc<CudaContext>,
    a: &[T],
    b: &[T],
    offset: usize,
) -> Vec<T> {
    let kernel = device_code::find_reduce_ptx::<T, O>(ReduceKernel::Reduce).unwrap();
    let module = ctx.load_module(Ptx::from_src(kernel.ptx.text)).unwrap();
    let f = module.load_function(kernel.entry).unwrap();
    let stream = ctx.default_stream();
    let pad = |v: &[T]| {
        let mut bytes = vec![0u8; offset * size_of::<T>()];
        bytes.extend_from_slice(bytemuck::cast_slice(v));
        bytes.resize(bytes.len() + 16, 0);
        bytes
    };
    let (da, db) = (stream.clone_htod(&pad(a)).unwrap(), stream.clone_htod(&pad(b)).unwrap());
    let off = (offset * size_of::<T>()) as u64;
    let (pa, pb, n) = (da.device_ptr(&stream).0 + off, db.device_ptr(&stream).0 + off, a.len());
    let cfg = LaunchConfig {
        grid_dim: (u32::try_from(n.div_ceil(1024).clamp(1, 1024)).unwrap(), 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let mut launch = stream.launch_builder(&f);
    launch.arg(&pa).arg(&pb).arg(&n);
    // SAFETY: (dst, src, n) is the reduce kernel's parameter list; both device buffers hold `n`
    // elements after `off` and are distinct.
    unsafe { launch.launch(cfg) }.unwrap();
    let bytes = stream.clone_dtoh(&da).unwrap();
    let start = offset * size_of::<T>();
    bytes[start..start + n * size_of::<T>()].chunks_exact(size_of::<T>()).map(bytemuck::pod_read_unaligned).collect()
}

fn check<T: Element + PartialEq, O: ReduceOp<T>>(ctx: &std::sync::Arc<CudaContext>, make: impl Fn(u64) -> T) {
    for (n, offset) in [(1usize, 0usize), (1001, 1), (1 << 20, 0), ((1 << 20) + 7, 3)] {
        let a: Vec<T> = (0..n as u64).map(&make).collect();
        let b: Vec<T> = (0..n as u64).map(|i| make(i.wrapping_mul(0x9e37_79b9).rotate_left(7))).collect();
        let mut expected = a.clone();
        HostGrid::SINGLE.reduce::<T, O>(&mut expected, &b);
        assert!(
            reduce_on_gpu::<T, O>(ctx, &a, &b, offset) == expected,
            "{} n={n} offset={offset}",
            KernelName::reduce::<T, O>(ReduceKernel::Reduce)
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver; run scripts/gpu.sh"]
fn user_kernels_on_the_gpu() {
    // SAFETY: only tries to dlopen libcuda; no other cudarc call happens before it says yes.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        println!("SKIPPED: no CUDA driver (libcuda) on this machine");
        return;
    }
    register().unwrap();
    if device_code::find_reduce_ptx::<MinLoc, ArgMin>(ReduceKernel::Reduce).is_err() {
        println!("SKIPPED: the user kernels were not built");
        return;
    }
    if CudaContext::device_count().unwrap_or(0) == 0 {
        println!("SKIPPED: the CUDA driver sees no GPU");
        return;
    }
    let ctx = CudaContext::new(0).unwrap();
    check::<MinLoc, ArgMin>(&ctx, |i| MinLoc { value: ((i * 31) % 13) as f64, index: i % 5 });
    check::<Complex32, Sum>(&ctx, |i| Complex32 { re: (i % 1000) as f32, im: -((i % 64) as f32) });
    println!("user kernels (minloc/argmin, c32/sum) match the host");
}
