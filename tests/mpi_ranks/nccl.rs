//! The NCCL backend on a CUDA device: the whole sweep (the same body as on the other
//! backends), code generic over the public trait, point-to-point lists, and sub-communicators.
//! Run by the `nccl_np*` trials (a GPU and a real NCCL; ignored without them) and the
//! `ncclsim_np*` trials (cudasim and its NCCL, ncclsim, on the CPU).

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use duralumin::device::cuda::CudaDevice;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::mpi::traits::Communicator as _;
use duralumin::*;

use crate::backend::{Nccl, TestDevice};
use crate::mpirun::rank_case::within;

pub fn run(_: &MpiCommunicator, world: &SimpleCommunicator) {
    let ctx = CudaContext::new(0).expect("CUDA context");
    let dev = CudaDevice::new(Arc::clone(&ctx)).expect("CUDA device");
    let nccl = Nccl::on(world, dev.clone(), ctx.new_stream().expect("stream"));
    if world.rank() == 0 {
        println!("nccl group on {} with {}", ctx.name().unwrap_or_default(), nccl.comm.library_version());
    }
    let t = std::time::Instant::now();
    crate::sweep::run(&nccl, "Nccl<cuda>");
    nccl.comm.synchronize().expect("synchronize after the sweep");
    if world.rank() == 0 {
        println!("nccl sweep: ok in {:.2?}", t.elapsed());
    }
    within("nccl p2p", || p2p(&nccl));
    within("nccl split", || split(&nccl));
    within("nccl generic", || crate::generic::on_nccl(world, dev.clone(), ctx.new_stream().expect("stream")));
}

/// A ring of sends and receives with uneven counts (0 included), sendrecv in place, and
/// multi_sendrecv with several messages per peer.
fn p2p(c: &Nccl<CudaDevice>) {
    let (me, n) = (c.comm.rank(), c.comm.size());
    let s = c.comm.stream();
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let count = |r: usize| (r * 3) % 5; // 0, 3, 1, 4, 2: uneven, one empty
    let send = c.dev.up(s, &vec![me as u32; count(me)]);
    let mut recv = c.dev.up(s, &vec![u32::MAX; count(left)]);
    c.comm.sendrecv(&send, right, &mut recv, left, 0).expect("sendrecv");
    assert_eq!(c.dev.down(s, &recv), vec![left as u32; count(left)], "sendrecv ring");
    let mut buf = c.dev.up(s, &[me as u64; 4]);
    c.comm.sendrecv_in_place(&mut buf, right, left, 0).expect("sendrecv in place");
    assert_eq!(c.dev.down(s, &buf), [left as u64; 4], "sendrecv in place");
    // Two messages to each neighbour, in order, with uneven lengths.
    let a = c.dev.up(s, &vec![me as u16 * 10; count(me)]);
    let b = c.dev.up(s, &[me as u16 * 10 + 1; 2]);
    let mut ra = c.dev.up(s, &vec![0u16; count(left)]);
    let mut rb = c.dev.up(s, &[0u16; 2]);
    c.comm
        .multi_sendrecv(&[(&a, right), (&b, right)], &mut [(&mut ra, left), (&mut rb, left)], 0)
        .expect("multi_sendrecv");
    assert_eq!(c.dev.down(s, &ra), vec![left as u16 * 10; count(left)]);
    assert_eq!(c.dev.down(s, &rb), [left as u16 * 10 + 1; 2]);
    if n == 1 {
        let e = c.comm.send(&a, 0, 0).unwrap_err();
        assert!(matches!(e, Error::SelfMessage { .. }), "{e}");
    }
    c.comm.synchronize().expect("synchronize");
}

/// `dup` and `split`: even and odd ranks, ordered by descending key.
fn split(c: &Nccl<CudaDevice>) {
    let (me, n) = (c.comm.rank(), c.comm.size());
    let d = c.comm.dup().expect("dup");
    assert_eq!((d.rank(), d.size()), (me, n));
    let half = c.comm.split(Some((me % 2) as u32), -(me as i32)).expect("split").expect("a communicator");
    let members: Vec<usize> = (0..n).filter(|r| r % 2 == me % 2).collect();
    assert_eq!(half.size(), members.len());
    assert_eq!(half.rank(), members.len() - 1 - members.iter().position(|&r| r == me).unwrap());
    let mut x = c.dev.up(half.stream(), &[me as i64; 5]);
    half.allreduce_in_place(&mut x, Sum).expect("allreduce on the split");
    assert_eq!(c.dev.down(half.stream(), &x), [members.iter().sum::<usize>() as i64; 5]);
    let none = c.comm.split(None, 0).expect("split without a color");
    assert!(none.is_none());
    drop((d, half));
}

/// The fault trials' communicator, with a deadline of 2 s, and a buffer to reduce.
fn faulty(world: &SimpleCommunicator) -> (Arc<CudaStream>, NcclCommunicator<CudaDevice>, CudaSlice<f32>) {
    let ctx = CudaContext::new(0).expect("CUDA context");
    let stream = ctx.new_stream().expect("stream");
    let mut comm = NcclCommunicator::from_stream(world, Arc::clone(&stream)).expect("NCCL communicator");
    comm.set_timeout(Some(std::time::Duration::from_secs(2)));
    let x = comm.device().up(&stream, &[1.0f32; 64]);
    (stream, comm, x)
}

/// Failure behaviour (the `ncclsim_fault_*` trials, with `NCCLSIM_FAULT` making rank 1's third
/// NCCL call hang or fail asynchronously): every rank's wait ends within its deadline plus a
/// few seconds with an error naming the operation or NCCL's error, the communicator is
/// aborted, later calls fail with `Error::Aborted` at once, and dropping it does not hang.
pub fn faults(_: &MpiCommunicator, world: &SimpleCommunicator) {
    let (_stream, comm, mut x) = faulty(world);
    let deadline = comm.timeout().expect("a deadline");
    let start = std::time::Instant::now();
    let mut failed = None;
    for i in 1..=5u64 {
        if let Err(e) = comm.allreduce_in_place(&mut x, Sum).and_then(|()| comm.synchronize()) {
            failed = Some((i, e));
            break;
        }
    }
    let (i, e) = failed.expect("the injected fault surfaced as an error");
    let took = start.elapsed();
    println!("rank {}: allreduce {i} failed after {took:.1?}: {e}", comm.rank());
    assert!(took < deadline + std::time::Duration::from_secs(8), "the failure took {took:?}");
    assert!(i >= 3, "failed before the fault: {e}");
    match &e {
        Error::Timeout { op, seq, .. } => assert_eq!((*op, *seq), ("allreduce_in_place", 3), "{e}"),
        Error::Nccl { .. } => {}
        other => panic!("unexpected error: {other}"),
    }
    assert!(comm.is_aborted());
    let again = comm.allreduce_in_place(&mut x, Sum).unwrap_err();
    assert!(matches!(again, Error::Aborted { .. }), "{again}");
    drop(comm);
}

/// The watchdog: with rank 1's third call hanging (or failing asynchronously), ranks that queue
/// work and never wait on the communicator, blocking in their own stream synchronization
/// instead, are released by the watchdog's abort within the deadline; the first call after it
/// reports the failure, later ones `Aborted`. (An asynchronous error may instead surface while
/// a later call is queued, which polls for it: then that call returns it, as it should.)
pub fn watchdog(_: &MpiCommunicator, world: &SimpleCommunicator) {
    let (stream, comm, mut x) = faulty(world);
    let deadline = comm.timeout().expect("a deadline");
    let start = std::time::Instant::now();
    let mut seen = None;
    for _ in 0..5 {
        if let Err(e) = comm.allreduce_in_place(&mut x, Sum) {
            assert!(matches!(e, Error::Nccl { .. }), "queueing failed with {e}");
            seen = Some(e);
            break;
        }
    }
    // The program's own wait, which knows nothing of NCCL: only an abort ends it.
    stream.synchronize().expect("the stream drains once the communicator is aborted");
    let took = start.elapsed();
    println!("rank {}: stream released after {took:.1?}", comm.rank());
    assert!(took < deadline + std::time::Duration::from_secs(8), "the release took {took:?}");
    let wait_for = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !comm.is_aborted() && std::time::Instant::now() < wait_for {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert!(comm.is_aborted(), "the watchdog did not abort the communicator");
    if seen.is_none() {
        let first = comm.allreduce_in_place(&mut x, Sum).unwrap_err();
        match &first {
            Error::Timeout { op, seq, .. } => assert_eq!(*op, "allreduce_in_place", "{first} (#{seq})"),
            Error::Nccl { .. } => {}
            other => panic!("unexpected first error after the abort: {other}"),
        }
    }
    let again = comm.synchronize().unwrap_err();
    assert!(matches!(again, Error::Aborted { .. }), "{again}");
    drop(comm);
}

/// Without a loadable NCCL (`DURALUMIN_NCCL` names a missing file in the trial), creating a
/// communicator is a typed error on every rank, after they agreed: no panic, no hang.
pub fn missing_library(_: &MpiCommunicator, world: &SimpleCommunicator) {
    assert!(!duralumin::backends::nccl::library_present());
    let ctx = CudaContext::new(0).expect("CUDA context");
    let dev = CudaDevice::new(Arc::clone(&ctx)).expect("CUDA device");
    let e = NcclCommunicator::new(world, dev, ctx.new_stream().expect("stream")).unwrap_err();
    assert!(matches!(&e, Error::LibraryUnavailable(m) if m.contains("DURALUMIN_NCCL")), "{e}");
}
