//! HostTransfer on a CUDA GPU: the whole sweep (the same body as on the host device) on both
//! flag paths, staged in small chunks (every "big" operation pipelines and reuses its slots,
//! and small allreduces reduce on the GPU with the reduction kernels) and with the default
//! settings; then ordering against kernels on the stream, a buffer whose home stream is not
//! the communicator's, cudarc work on a third stream that uses the buffers, and more
//! operations queued than the pinned pool can stage at once. Run by the `cuda_np*` trials,
//! which are ignored without a CUDA device, and by the `cudasim_*` trials on the CUDA driver
//! simulator (`cudasim/`).

use std::ffi::c_void;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, sys};
use duralumin::backends::host_transfer::HostTransferConfig;
use duralumin::device::cuda::{CudaDevice, FlagPath};
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::mpi::traits::Communicator as _;
use duralumin::*;

use crate::backend::{HostTransfer, TestDevice, small_chunks};
use crate::host_transfer::assert_idle;
use crate::mpirun::rank_case::{enter, within};
use crate::sweep::Breadth;

pub fn run(_: &MpiCommunicator, world: &SimpleCommunicator) {
    let ctx = CudaContext::new(0).expect("CUDA context");
    if world.rank() == 0 {
        // "cudasim (CPU)" on the driver simulator.
        println!("cuda group on {}", ctx.name().unwrap_or_else(|e| format!("an unnamed device ({e:?})")));
    }
    for path in flag_paths() {
        let dev = CudaDevice::with_flag_path(Arc::clone(&ctx), path).expect("CUDA device");
        for config in [small_chunks(), HostTransferConfig::default()] {
            let stream = ctx.new_stream().expect("stream");
            let ht = HostTransfer::on(world, dev.clone(), stream, config);
            let t = std::time::Instant::now();
            // Every pair's reduction kernels run in small chunks (small allreduces reduce on the
            // device); the other flag path and the default chunks only move data otherwise.
            let breadth = if path == FlagPath::StreamMemOps && config == small_chunks() {
                Breadth::Full
            } else {
                Breadth::Representative
            };
            let name = format!("HostTransfer<cuda> {path:?} chunk {} B", config.chunk_bytes);
            crate::sweep::run_with(&ht, &name, breadth);
            ht.comm.synchronize().expect("synchronize after the sweep");
            assert_idle(&ht.comm, "after the CUDA sweep");
            if ht.comm.rank() == 0 {
                println!("cuda sweep {path:?} chunk {} B: ok in {:.2?}", config.chunk_bytes, t.elapsed());
            }
            // Operations of several chunks (8 MiB, or 4 KiB in small chunks); operations of
            // thousands of chunks are `host_transfer::long_pipelines`'.
            let len = (config.chunk_bytes / 8 * 16).min(1 << 20);
            let _backend = enter(format!("HostTransfer<cuda> {path:?} chunk {} B", config.chunk_bytes));
            within("foreign_home", || foreign_home(&ht, &ctx, len));
            within("third_stream", || third_stream(&ht, &ctx, len));
        }
        // A stream of another handle to the same (primary) context is the device's own.
        let again = CudaContext::new(0).expect("CUDA context");
        let ht =
            HostTransfer::on(world, dev.clone(), again.new_stream().expect("stream"), HostTransferConfig::default());
        let mut x = ht.dev.up(ht.comm.stream(), &[1u32; 3]);
        ht.comm.allreduce_in_place(&mut x, Sum).expect("allreduce on a stream of another context handle");
        assert_eq!(ht.dev.down(ht.comm.stream(), &x), [ht.comm.size() as u32; 3]);
        drop(ht);
        // A communicator from a stream alone, on the device of the stream's context.
        let stream = ctx.new_stream().expect("stream");
        let c = HostTransferCommunicator::from_stream(world, Arc::clone(&stream)).expect("communicator from a stream");
        assert!(Arc::ptr_eq(c.device().context(), &ctx), "the device of the stream's context");
        let mut x = stream.clone_htod(&[1u32; 3]).expect("upload");
        c.allreduce_in_place(&mut x, Sum).expect("allreduce on a communicator made from a stream");
        assert_eq!(stream.clone_dtoh(&x).expect("download"), [c.size() as u32; 3]);
        drop(c);
        // Code generic over the public trait, on this device.
        crate::generic::on_device(world, dev.clone(), ctx.new_stream().expect("stream"));
        // Everything else a stream-ordered backend has, written once for every device.
        let t = std::time::Instant::now();
        within(format!("HostTransfer<cuda> {path:?}"), || {
            crate::host_transfer::stream_ordered(world, &dev, || ctx.new_stream().expect("stream"))
        });
        if world.rank() == 0 {
            println!("cuda stream-ordered checks {path:?}: ok in {:.2?}", t.elapsed());
        }
    }
}

/// The flag paths the group runs on: both, or the one the launch names with
/// `DURALUMIN_CUDA_FLAG_PATHS`: `stream-mem-ops` (the simulated clusters: a flag path is local
/// to a device, and both run on one node) or `kernels` (`scripts/gpu.sh`'s MPS stage).
fn flag_paths() -> Vec<FlagPath> {
    match std::env::var("DURALUMIN_CUDA_FLAG_PATHS").as_deref() {
        Ok("stream-mem-ops") => vec![FlagPath::StreamMemOps],
        Ok("kernels") => vec![FlagPath::Kernels],
        _ => vec![FlagPath::StreamMemOps, FlagPath::Kernels],
    }
}

/// How long `third_stream` holds a stream up.
const HOLD: Duration = Duration::from_millis(100);

/// A buffer allocated on another stream: the operation waits for that stream's work before
/// reading it, and the home stream's later work sees the result.
fn foreign_home(ht: &HostTransfer<CudaDevice>, ctx: &Arc<CudaContext>, len: usize) {
    let home: Arc<CudaStream> = ctx.new_stream().expect("stream");
    let (me, n) = (ht.comm.rank() as u64, ht.comm.size() as u64);
    let mut buf = ht.dev.up(&home, &vec![me; len]);
    ht.comm.allreduce_in_place(&mut buf, Sum).expect("allreduce");
    // Read back on the home stream only: it must have been ordered after the operation.
    let got = ht.dev.down(&home, &buf);
    assert_eq!(got, vec![n * (n - 1) / 2; len], "allreduce on a buffer of another stream");
    ht.comm.synchronize().expect("synchronize");
}

/// The host callback of [`delay`]: sleeps for the microseconds its user data holds.
///
/// # Safety
/// Called by the driver with the user data of [`delay`], a number, not a pointer; it makes no
/// CUDA call.
unsafe extern "C" fn sleep_a_while(micros: *mut c_void) {
    std::thread::sleep(Duration::from_micros(micros as u64));
}

/// Holds `stream` up for `how_long` on the device (a host function in its queue), so work
/// queued after it runs late unless something orders it.
pub fn delay(ctx: &Arc<CudaContext>, stream: &CudaStream, how_long: Duration) {
    ctx.bind_to_thread().expect("bind");
    let micros = how_long.as_micros() as usize as *mut c_void;
    // SAFETY: a live stream of the bound context; the callback makes no CUDA call and reads its
    // user data as a number.
    let status = unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(sleep_a_while), micros) };
    assert_eq!(status, sys::CUresult::CUDA_SUCCESS, "cuLaunchHostFunc");
}

/// cudarc's own dependency tracking sees the operations: a read of the output buffer that
/// cudarc queued earlier on a third stream runs before the operation overwrites it, a write of
/// the input queued there runs before the operation reads it, and a copy cudarc queues there
/// right after the call reads the result. The third stream and the communicator's are each held
/// up in turn, so each check fails when its ordering is missing.
fn third_stream(ht: &HostTransfer<CudaDevice>, ctx: &Arc<CudaContext>, len: usize) {
    let (home, third) = (ctx.new_stream().expect("stream"), ctx.new_stream().expect("stream"));
    let (me, n) = (ht.comm.rank() as u64, ht.comm.size() as u64);
    let sentinel = u64::MAX;
    let sum = |base: u64| n * (n - 1) / 2 + base * n;
    let mut recv = ht.dev.up(&home, &vec![sentinel; len]);
    let mut old: CudaSlice<u64> = third.alloc_zeros(len).expect("alloc");
    let source = ht.dev.up(&third, &vec![me + 100; len]);
    let send = ht.dev.up(&home, &vec![me; len]);
    let mut written: CudaSlice<u64> = home.alloc_zeros(len).expect("alloc");
    home.synchronize().expect("synchronize");
    third.synchronize().expect("synchronize");

    // Write after read: the held-up third stream reads the output's old contents, and only
    // that; the operation's input is not touched elsewhere, so nothing else orders them.
    delay(ctx, &third, HOLD);
    third.memcpy_dtod(&recv, &mut old).expect("copy on the third stream");
    ht.comm.allreduce(&send, &mut recv, Sum).expect("allreduce");
    assert_eq!(
        third.clone_dtoh(&old).expect("download"),
        vec![sentinel; len],
        "the operation overwrote its output before a read queued earlier on another stream"
    );
    ht.comm.synchronize().expect("synchronize");
    assert_eq!(ht.dev.down(&home, &recv), vec![sum(0); len], "allreduce (write after read)");

    // Read after write: the held-up third stream writes the input.
    delay(ctx, &third, HOLD);
    third.memcpy_dtod(&source, &mut written).expect("copy on the third stream");
    ht.comm.allreduce(&written, &mut recv, Sum).expect("allreduce");
    ht.comm.synchronize().expect("synchronize");
    assert_eq!(
        ht.dev.down(&home, &recv),
        vec![sum(100); len],
        "the operation read its input before a write queued earlier on another stream"
    );

    // After: the communicator's stream is held up; a copy queued on the third stream right
    // after the call must still see the new result.
    delay(ctx, ht.comm.stream(), HOLD);
    ht.comm.allreduce(&send, &mut recv, Sum).expect("allreduce");
    assert_eq!(
        third.clone_dtoh(&recv).expect("download"),
        vec![sum(0); len],
        "a copy queued on another stream after the operation ran before it"
    );
    ht.comm.synchronize().expect("synchronize");
    third.synchronize().expect("synchronize");
}
