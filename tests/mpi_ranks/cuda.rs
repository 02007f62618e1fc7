//! HostTransfer on a CUDA GPU: the whole sweep (the same body as on the host device) on both
//! flag paths, staged in small chunks (every "big" operation pipelines and reuses its slots,
//! and small allreduces reduce on the GPU with the reduction kernels) and with the default
//! settings; then ordering against kernels on the stream, a buffer whose home stream is not
//! the communicator's, and more operations queued than the pinned pool can stage at once. Run by the `cuda_np*` trials, which are ignored without a CUDA device.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};
use duralumin::backends::host_transfer::HostTransferConfig;
use duralumin::device::cuda::{CudaDevice, FlagPath};
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::*;

use crate::backend::{HostTransfer, TestDevice, small_chunks};
use crate::host_transfer::assert_idle;

pub fn run(_: &Communicator, world: &SimpleCommunicator) {
    let ctx = CudaContext::new(0).expect("CUDA context");
    for path in [FlagPath::StreamMemOps, FlagPath::Kernels] {
        let dev = CudaDevice::with_flag_path(Arc::clone(&ctx), path).expect("CUDA device");
        for config in [small_chunks(), HostTransferConfig::default()] {
            let stream = ctx.new_stream().expect("stream");
            let ht = HostTransfer::on(world, dev.clone(), stream, config);
            let t = std::time::Instant::now();
            crate::sweep::run(&ht);
            ht.comm.synchronize().expect("synchronize after the sweep");
            assert_idle(&ht.comm, "after the CUDA sweep");
            if ht.comm.rank() == 0 {
                println!("cuda sweep {path:?} chunk {} B: ok in {:.2?}", config.chunk_bytes, t.elapsed());
            }
            foreign_home(&ht, &ctx);
        }
        crate::host_transfer::waits_for_the_pool(world, &dev, || ctx.new_stream().expect("stream"));
    }
}

/// A buffer allocated on another stream: the operation waits for that stream's work before
/// reading it, and the home stream's later work sees the result.
fn foreign_home(ht: &HostTransfer<CudaDevice>, ctx: &Arc<CudaContext>) {
    let home: Arc<CudaStream> = ctx.new_stream().expect("stream");
    let (me, n) = (ht.comm.rank() as u64, ht.comm.size() as u64);
    let len = 100_000;
    let mut buf = ht.dev.up(&home, &vec![me; len]);
    ht.comm.allreduce_in_place(&mut buf, Sum).expect("allreduce");
    // Read back on the home stream only: it must have been ordered after the operation.
    let got = ht.dev.down(&home, &buf);
    assert_eq!(got, vec![n * (n - 1) / 2; len], "allreduce on a buffer of another stream");
    ht.comm.synchronize().expect("synchronize");
}
