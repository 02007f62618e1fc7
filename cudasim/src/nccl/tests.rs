//! ncclsim's tests: ranks as threads of this process, each with its own communicator from one
//! unique id, its own stream and its own device buffers.
//!
//! The ranks share the one simulated device, which real ranks do not: tests run one at a time
//! (the device-wide barrier of an allocation would otherwise order one test's collectives
//! behind another's), allocate before their first collective and free after their last, and
//! make their streams together so that each lands on a hardware queue of its own.

use std::ffi::{c_int, c_void};
use std::sync::{Barrier, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cudarc::driver::sys::{CUcontext, CUdeviceptr, CUresult, CUstream};
use duralumin_kernels::half::f16;
use duralumin_kernels::{Avg, Max, Min, Number, Prod, ReduceOp, Sum, bytemuck};

use super::*;
use crate::api::{
    cuCtxSetCurrent, cuDevicePrimaryCtxRetain, cuInit, cuMemAlloc_v2, cuMemFree_v2, cuMemcpyDtoHAsync_v2,
    cuMemcpyHtoDAsync_v2, cuStreamCreate, cuStreamDestroy_v2, cuStreamQuery, cuStreamSynchronize,
};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

fn ok(r: CUresult) {
    assert_eq!(r, CUresult::CUDA_SUCCESS);
}

/// Makes the primary context current on this thread.
fn current() {
    let mut c: CUcontext = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; the handle is the one just retained.
    unsafe {
        ok(cuInit(0));
        ok(cuDevicePrimaryCtxRetain(&mut c, 0));
        ok(cuCtxSetCurrent(c));
    }
}

fn ptr(p: CUdeviceptr) -> *mut c_void {
    crate::usize_of(p) as *mut c_void
}

fn alloc(bytes: usize) -> CUdeviceptr {
    let mut p = 0;
    // SAFETY: an out-pointer to a local.
    ok(unsafe { cuMemAlloc_v2(&mut p, bytes.max(1)) });
    p
}

fn free(p: CUdeviceptr) {
    // SAFETY: a device allocation of this test, no longer used by queued work.
    ok(unsafe { cuMemFree_v2(p) });
}

fn unique_id() -> NcclUniqueId {
    let mut id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { ncclGetUniqueId(&mut id) }, SUCCESS);
    id
}

fn last_error() -> String {
    // SAFETY: the string stays valid for the process's life.
    unsafe { CStr::from_ptr(ncclGetLastError(std::ptr::null_mut())) }.to_string_lossy().into_owned()
}

/// `ncclConfig_t` as NCCL 2.27 lays it out (the part ncclsim reads).
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

fn non_blocking() -> Config {
    Config {
        size: size_of::<Config>(),
        magic: 0xcafe_beef,
        version: 22703,
        blocking: 0,
        cga_cluster_size: c_int::MIN,
        min_ctas: c_int::MIN,
        max_ctas: c_int::MIN,
        net_name: std::ptr::null(),
        split_share: c_int::MIN,
    }
}

/// Polls a non-blocking communicator until its operation is done: asserts that the first poll
/// says `ncclInProgress`; returns the result.
fn poll(comm: NcclComm) -> c_int {
    let (mut state, mut seen) = (IN_PROGRESS, false);
    let start = Instant::now();
    loop {
        // SAFETY: a live communicator of this test; an out-pointer to a local.
        assert_eq!(unsafe { ncclCommGetAsyncError(comm, &mut state) }, SUCCESS);
        if state != IN_PROGRESS {
            break;
        }
        seen = true;
        assert!(start.elapsed() < Duration::from_secs(20), "still in progress after 20 s");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(seen, "a non-blocking operation must answer ncclInProgress at least once");
    state
}

/// The asynchronous error of a blocking communicator.
fn async_error(comm: NcclComm) -> c_int {
    let mut state = -1;
    // SAFETY: a live communicator of this test; an out-pointer to a local.
    assert_eq!(unsafe { ncclCommGetAsyncError(comm, &mut state) }, SUCCESS);
    state
}

fn count_of(comm: NcclComm) -> (c_int, c_int) {
    let (mut n, mut r) = (-1, -1);
    // SAFETY: a live communicator of this test; out-pointers to locals.
    unsafe {
        assert_eq!(ncclCommCount(comm, &mut n), SUCCESS);
        assert_eq!(ncclCommUserRank(comm, &mut r), SUCCESS);
    }
    (n, r)
}

/// One rank of a test's communicator.
struct Rank<'a> {
    rank: usize,
    n: usize,
    comm: NcclComm,
    stream: usize,
    barrier: &'a Barrier,
}

impl Rank<'_> {
    fn stream(&self) -> CUstream {
        self.stream as CUstream
    }

    /// Copies `data` to device memory in stream order (pageable memory: synchronously).
    fn upload(&self, dst: CUdeviceptr, data: &[u8]) {
        // SAFETY: a device allocation of this test holding `data.len()` bytes.
        ok(unsafe { cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), data.len(), self.stream()) });
    }

    /// Copies `len` bytes of device memory to the host in stream order.
    fn download(&self, src: CUdeviceptr, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        // SAFETY: a device allocation of this test holding `len` bytes.
        ok(unsafe { cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), src, len, self.stream()) });
        v
    }

    fn sync(&self) {
        // SAFETY: a live stream of this test.
        ok(unsafe { cuStreamSynchronize(self.stream()) });
    }

    fn query(&self) -> CUresult {
        // SAFETY: a live stream of this test.
        unsafe { cuStreamQuery(self.stream()) }
    }

    fn allreduce(&self, send: CUdeviceptr, recv: CUdeviceptr, count: usize, dtype: c_int, op: c_int) -> c_int {
        // SAFETY: device buffers of this test, live until the stream has been synchronized.
        unsafe { ncclAllReduce(ptr(send), ptr(recv), count, dtype, op, self.comm, self.stream()) }
    }

    fn send(&self, buf: CUdeviceptr, count: usize, peer: usize) -> c_int {
        let peer = c_int::try_from(peer).unwrap();
        // SAFETY: as in `allreduce`.
        unsafe { ncclSend(ptr(buf), count, 2, peer, self.comm, self.stream()) }
    }

    fn recv(&self, buf: CUdeviceptr, count: usize, peer: usize) -> c_int {
        let peer = c_int::try_from(peer).unwrap();
        // SAFETY: as in `allreduce`.
        unsafe { ncclRecv(ptr(buf), count, 2, peer, self.comm, self.stream()) }
    }
}

/// Runs `body` as rank `r` of `n` on `n` threads, each with a communicator (non-blocking when
/// asked, its initialization polled to completion) and a stream; destroys the communicators
/// the bodies did not abort. The bodies' results in rank order.
fn world<R: Send>(n: usize, nonblocking: bool, body: impl Fn(&Rank) -> R + Sync) -> Vec<R> {
    current();
    let id = unique_id();
    let streams: Vec<usize> = (0..n)
        .map(|_| {
            let mut s: CUstream = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local.
            ok(unsafe { cuStreamCreate(&mut s, 0) });
            s as usize
        })
        .collect();
    let barrier = Barrier::new(n);
    let results = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..n)
            .map(|r| {
                let (barrier, body, stream) = (&barrier, &body, streams[r]);
                scope.spawn(move || {
                    current();
                    let (nranks, rank) = (c_int::try_from(n).unwrap(), c_int::try_from(r).unwrap());
                    let mut comm: NcclComm = std::ptr::null_mut();
                    if nonblocking {
                        let mut config = non_blocking();
                        // SAFETY: out-pointers to locals; the config is a whole ncclConfig_t.
                        unsafe {
                            let cfg = (&raw mut config).cast();
                            assert_eq!(ncclCommInitRankConfig(&mut comm, nranks, id, rank, cfg), IN_PROGRESS);
                            let mut count = 0;
                            assert_eq!(ncclCommCount(comm, &mut count), INVALID_USAGE, "used while in progress");
                        }
                        assert_eq!(poll(comm), SUCCESS);
                    } else {
                        // SAFETY: an out-pointer to a local.
                        assert_eq!(unsafe { ncclCommInitRank(&mut comm, nranks, id, rank) }, SUCCESS);
                    }
                    let result = body(&Rank { rank: r, n, comm, stream, barrier });
                    if comm::get(comm).is_ok() {
                        // SAFETY: a live communicator of this test.
                        assert_eq!(unsafe { ncclCommDestroy(comm) }, SUCCESS);
                    }
                    result
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    for s in streams {
        // SAFETY: streams of this test, their work done.
        ok(unsafe { cuStreamDestroy_v2(s as CUstream) });
    }
    results
}

/// The element types the sweeps cover.
trait Elem: Number {
    const DTYPE: c_int;
    fn of(v: i32) -> Self;
}

impl Elem for i32 {
    const DTYPE: c_int = 2;
    fn of(v: i32) -> Self {
        v
    }
}

impl Elem for f32 {
    const DTYPE: c_int = 7;
    #[allow(clippy::cast_precision_loss, reason = "small test values")]
    fn of(v: i32) -> Self {
        v as f32
    }
}

impl Elem for f16 {
    const DTYPE: c_int = 6;
    #[allow(clippy::cast_precision_loss, reason = "small test values")]
    fn of(v: i32) -> Self {
        f16::from_f32(v as f32)
    }
}

/// Rank `rank`'s `i`-th input element.
fn input<T: Elem>(rank: usize, i: usize) -> T {
    T::of(i32::try_from((rank * 7 + i * 3) % 11).unwrap() - 5)
}

fn inputs<T: Elem>(rank: usize, count: usize) -> Vec<u8> {
    let v: Vec<T> = (0..count).map(|i| input(rank, i)).collect();
    bytemuck::cast_slice(&v).to_vec()
}

/// `op` over the ranks' `i`-th (`at(i)`-th) elements, in rank order, as bytes.
fn fold<T: Elem, O: ReduceOp<T>>(n: usize, count: usize, at: impl Fn(usize) -> usize) -> Vec<u8> {
    let v: Vec<T> = (0..count)
        .map(|i| {
            let acc = (1..n).fold(input::<T>(0, at(i)), |acc, r| O::combine(acc, input(r, at(i))));
            O::finish(acc, u32::try_from(n).unwrap())
        })
        .collect();
    bytemuck::cast_slice(&v).to_vec()
}

fn expected<T: Elem>(op: c_int, n: usize, count: usize, at: impl Fn(usize) -> usize) -> Vec<u8> {
    match op {
        0 => fold::<T, Sum>(n, count, at),
        1 => fold::<T, Prod>(n, count, at),
        2 => fold::<T, Max>(n, count, at),
        3 => fold::<T, Min>(n, count, at),
        _ => fold::<T, Avg>(n, count, at),
    }
}

fn allreduce_sweep<T: Elem>(r: &Rank, send: CUdeviceptr, recv: CUdeviceptr) {
    let size = size_of::<T>();
    for op in 0..5 {
        for count in [0, 1, 7, 300] {
            for in_place in [false, true] {
                let src = if in_place { recv } else { send };
                r.upload(src, &inputs::<T>(r.rank, count));
                assert_eq!(r.allreduce(src, recv, count, T::DTYPE, op,), SUCCESS);
                let got = r.download(recv, count * size);
                let want = expected::<T>(op, r.n, count, |i| i);
                assert!(got == want, "allreduce {} op {op} count {count} in place {in_place} of {}", T::DTYPE, r.n);
            }
        }
    }
}

#[test]
fn allreduce_of_every_op_type_count_and_placement() {
    let _s = serial();
    for n in 1..=4 {
        world(n, false, |r| {
            let (send, recv) = (alloc(300 * 4), alloc(300 * 4));
            r.barrier.wait();
            allreduce_sweep::<i32>(r, send, recv);
            allreduce_sweep::<f32>(r, send, recv);
            allreduce_sweep::<f16>(r, send, recv);
            assert_eq!(async_error(r.comm), SUCCESS);
            r.sync();
            r.barrier.wait();
            free(send);
            free(recv);
        });
    }
}

#[test]
fn broadcast_and_reduce_from_every_root() {
    let _s = serial();
    world(3, false, |r| {
        let (send, recv) = (alloc(64), alloc(64));
        r.barrier.wait();
        let poison = vec![0xab_u8; 28];
        for root in 0..3 {
            let root_c = c_int::try_from(root).unwrap();
            for in_place in [false, true] {
                for count in [0, 7] {
                    let src = if in_place { recv } else { send };
                    r.upload(recv, &poison);
                    r.upload(src, &inputs::<i32>(r.rank, count));
                    // SAFETY: device buffers of this test, live until the stream is synchronized.
                    let s = unsafe { ncclBroadcast(ptr(src), ptr(recv), count, 2, root_c, r.comm, r.stream()) };
                    assert_eq!(s, SUCCESS);
                    assert_eq!(r.download(recv, count * 4), inputs::<i32>(root, count), "broadcast from {root}");

                    r.upload(recv, &poison);
                    r.upload(src, &inputs::<i32>(r.rank, count));
                    // SAFETY: as above.
                    let s = unsafe { ncclReduce(ptr(src), ptr(recv), count, 2, 0, root_c, r.comm, r.stream()) };
                    assert_eq!(s, SUCCESS);
                    let got = r.download(recv, 28);
                    if r.rank == root {
                        assert_eq!(got[..count * 4], expected::<i32>(0, 3, count, |i| i)[..], "reduce to {root}");
                    } else if !in_place {
                        assert_eq!(got, poison, "a reduce writes only the root's output");
                    }
                }
            }
        }
        assert_eq!(async_error(r.comm), SUCCESS);
        r.sync();
        r.barrier.wait();
        free(send);
        free(recv);
    });
}

#[test]
fn allgather_and_reduce_scatter_in_and_out_of_place() {
    let _s = serial();
    world(3, false, |r| {
        let (n, count) = (3, 5);
        let cb = count * 4;
        let (send, recv) = (alloc(n * cb), alloc(n * cb));
        r.barrier.wait();
        let off = u64::try_from(r.rank * cb).unwrap();
        for in_place in [false, true] {
            let src = if in_place { recv + off } else { send };
            r.upload(src, &inputs::<i32>(r.rank, count));
            // SAFETY: device buffers of this test, live until the stream is synchronized.
            let s = unsafe { ncclAllGather(ptr(src), ptr(recv), count, 2, r.comm, r.stream()) };
            assert_eq!(s, SUCCESS);
            let want: Vec<u8> = (0..n).flat_map(|q| inputs::<i32>(q, count)).collect();
            assert_eq!(r.download(recv, n * cb), want, "allgather in place {in_place}");

            let src = if in_place { recv } else { send };
            let dst = if in_place { recv + off } else { recv };
            r.upload(src, &inputs::<i32>(r.rank, n * count));
            // SAFETY: as above.
            let s = unsafe { ncclReduceScatter(ptr(src), ptr(dst), count, 2, 0, r.comm, r.stream()) };
            assert_eq!(s, SUCCESS);
            let want = expected::<i32>(0, n, count, |i| r.rank * count + i);
            assert_eq!(r.download(dst, cb), want, "reduce_scatter in place {in_place}");
        }
        assert_eq!(async_error(r.comm), SUCCESS);
        r.sync();
        r.barrier.wait();
        free(send);
        free(recv);
    });
}

/// `count` bytes for block `to` of rank `from`'s input, distinct per (from, to, index).
fn block(from: usize, to: usize, count: usize) -> Vec<u8> {
    (0..count).map(|i| u8::try_from((from * 31 + to * 7 + i) % 251).unwrap()).collect()
}

#[test]
fn alltoall_gather_and_scatter_in_and_out_of_place() {
    let _s = serial();
    world(3, false, |r| {
        let (n, c, root) = (3, 5, 1);
        let (send, recv) = (alloc(n * c), alloc(n * c));
        r.barrier.wait();
        let mine: Vec<u8> = (0..n).flat_map(|to| block(r.rank, to, c)).collect();
        r.upload(send, &mine);
        // SAFETY: device buffers of this test, live until the stream is synchronized.
        assert_eq!(unsafe { ncclAlltoAll(ptr(send), ptr(recv), c, 0, r.comm, r.stream()) }, SUCCESS);
        let want: Vec<u8> = (0..n).flat_map(|from| block(from, r.rank, c)).collect();
        assert_eq!(r.download(recv, n * c), want, "alltoall");
        // SAFETY: as above; the call is refused before it queues anything.
        let overlapping = unsafe { ncclAlltoAll(ptr(send), ptr(send + 1), c - 1, 0, r.comm, r.stream()) };
        assert_eq!(overlapping, INVALID_ARGUMENT, "alltoall runs out of place only");
        let off = u64::try_from(root * c).unwrap();
        for in_place in [false, true] {
            let src = if in_place && r.rank == root { recv + off } else { send };
            r.upload(src, &block(r.rank, root, c));
            // SAFETY: as above.
            let s = unsafe { ncclGather(ptr(src), ptr(recv), c, 0, 1, r.comm, r.stream()) };
            assert_eq!(s, SUCCESS);
            if r.rank == root {
                let want: Vec<u8> = (0..n).flat_map(|from| block(from, root, c)).collect();
                assert_eq!(r.download(recv, n * c), want, "gather in place {in_place}");
            }
            r.upload(send, &mine);
            let dst = if in_place && r.rank == root { send + off } else { recv };
            // SAFETY: as above.
            let s = unsafe { ncclScatter(ptr(send), ptr(dst), c, 0, 1, r.comm, r.stream()) };
            assert_eq!(s, SUCCESS);
            assert_eq!(r.download(dst, c), block(root, r.rank, c), "scatter in place {in_place}");
        }
        if r.rank == root {
            // SAFETY: as above; refused before anything is queued.
            let s = unsafe { ncclGather(ptr(recv + 1), ptr(recv), c, 0, 1, r.comm, r.stream()) };
            assert_eq!(s, INVALID_ARGUMENT, "a gather overlapping other than in place");
        }
        assert_eq!(async_error(r.comm), SUCCESS);
        r.sync();
        r.barrier.wait();
        free(send);
        free(recv);
    });
}

/// Rank `r`'s two messages to its successor in the ring: uneven counts, zero among them.
fn ring_counts(r: usize) -> [usize; 2] {
    [[3, 0, 5, 1][r], [2, 4, 0, 6][r]]
}

#[test]
fn grouped_send_recv_ring_with_uneven_counts() {
    let _s = serial();
    world(4, false, |r| {
        let (next, prev) = ((r.rank + 1) % r.n, (r.rank + r.n - 1) % r.n);
        let (mine, theirs) = (ring_counts(r.rank), ring_counts(prev));
        let (send, recv) = (alloc(64), alloc(64));
        r.barrier.wait();
        let data = inputs::<i32>(r.rank, 16);
        r.upload(send, &data);
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupStart() }, SUCCESS);
        // Receives first: the group posts its sends first anyway.
        assert_eq!(r.recv(recv, theirs[0], prev), SUCCESS);
        assert_eq!(r.recv(recv + 32, theirs[1], prev), SUCCESS);
        assert_eq!(r.send(send, mine[0], next), SUCCESS);
        assert_eq!(r.send(send + 16, mine[1], next), SUCCESS);
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupEnd() }, SUCCESS);
        let from = inputs::<i32>(prev, 16);
        assert_eq!(r.download(recv, theirs[0] * 4), from[..theirs[0] * 4]);
        assert_eq!(r.download(recv + 32, theirs[1] * 4), from[16..16 + theirs[1] * 4]);
        assert_eq!(async_error(r.comm), SUCCESS);
        r.sync();
        r.barrier.wait();
        free(send);
        free(recv);
    });
}

#[test]
fn non_blocking_communicators_need_polling() {
    let _s = serial();
    world(2, true, |r| {
        let buf = alloc(16);
        r.barrier.wait();
        r.upload(buf, &inputs::<i32>(r.rank, 4));
        assert_eq!(r.allreduce(buf, buf, 4, 2, 0), IN_PROGRESS);
        assert_eq!(r.query(), CUresult::CUDA_SUCCESS, "nothing queued before the poll");
        assert_eq!(r.allreduce(buf, buf, 4, 2, 0), INVALID_USAGE, "used while in progress");
        assert_eq!(poll(r.comm), SUCCESS);
        assert_eq!(r.download(buf, 16), expected::<i32>(0, 2, 4, |i| i));

        // A group with operations: in progress until polled.
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupStart() }, SUCCESS);
        assert_eq!(r.allreduce(buf, buf, 4, 2, 2), SUCCESS);
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupEnd() }, IN_PROGRESS);
        assert_eq!(poll(r.comm), SUCCESS);
        r.sync();

        // A split inherits non-blocking from its parent and (as in NCCL 2.28) returns success
        // at once, writing the new handle only when it completes, which the parent's poll
        // reports.
        let mut child: NcclComm = std::ptr::null_mut();
        // SAFETY: a live communicator; an out-pointer to a local, which outlives the split.
        let s = unsafe { ncclCommSplit(r.comm, 0, 0, &mut child, std::ptr::null_mut()) };
        assert_eq!(s, SUCCESS);
        assert!(child.is_null(), "no handle before the split completes");
        let start = Instant::now();
        while async_error(r.comm) == IN_PROGRESS {
            assert!(start.elapsed() < Duration::from_secs(20), "split still in progress after 20 s");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(async_error(r.comm), SUCCESS);
        assert!(!child.is_null(), "the handle once the parent's poll says the split is done");
        assert_eq!(poll(child), SUCCESS);
        assert_eq!(count_of(child), (2, c_int::try_from(r.rank).unwrap()));
        // SAFETY: live communicators of this test.
        unsafe {
            assert_eq!(ncclCommFinalize(child), IN_PROGRESS);
            assert_eq!(poll(child), SUCCESS);
            assert_eq!(ncclCommDestroy(child), SUCCESS);
            assert_eq!(ncclCommFinalize(r.comm), IN_PROGRESS);
        }
        assert_eq!(poll(r.comm), SUCCESS);
        r.barrier.wait();
        free(buf);
    });
}

#[test]
fn split_by_color_and_key() {
    let _s = serial();
    world(4, false, |r| {
        let buf = alloc(4);
        r.barrier.wait();
        let (color, key) = [(0, 5), (1, 0), (0, 1), (-1, 0)][r.rank];
        let mut child: NcclComm = std::ptr::null_mut();
        // SAFETY: a live communicator; an out-pointer to a local.
        assert_eq!(unsafe { ncclCommSplit(r.comm, color, key, &mut child, std::ptr::null_mut()) }, SUCCESS);
        if color == -1 {
            assert!(child.is_null(), "NCCL_SPLIT_NOCOLOR gives no communicator");
        } else {
            // Color 0: old rank 2 (key 1) is new rank 0, old rank 0 (key 5) new rank 1.
            let want = [(2, 1), (1, 0), (2, 0)][r.rank];
            assert_eq!(count_of(child), want);
            r.upload(buf, &i32::try_from(r.rank + 1).unwrap().to_ne_bytes());
            let on_child = Rank { comm: child, ..*r };
            assert_eq!(on_child.allreduce(buf, buf, 1, 2, 0), SUCCESS);
            let sum = [4, 2, 4][r.rank];
            assert_eq!(r.download(buf, 4), i32::to_ne_bytes(sum));
            // SAFETY: a live communicator of this test.
            assert_eq!(unsafe { ncclCommDestroy(child) }, SUCCESS);
        }
        r.sync();
        r.barrier.wait();
        free(buf);
    });
}

#[test]
fn mismatched_collectives_are_reported() {
    let _s = serial();
    world(2, false, |r| {
        let buf = alloc(32);
        r.barrier.wait();
        assert_eq!(r.allreduce(buf, buf, 4 + r.rank, 2, 0), SUCCESS);
        r.sync();
        assert_eq!(async_error(r.comm), INVALID_USAGE);
        assert!(last_error().contains("collective mismatch"), "{}", last_error());
        r.barrier.wait();
        free(buf);
    });
}

#[test]
fn mismatched_sends_and_receives_are_reported() {
    let _s = serial();
    // Different counts.
    world(2, false, |r| {
        let buf = alloc(32);
        r.barrier.wait();
        if r.rank == 0 {
            assert_eq!(r.send(buf, 3, 1), SUCCESS);
        } else {
            assert_eq!(r.recv(buf, 4, 0), SUCCESS);
        }
        r.sync();
        assert_eq!(async_error(r.comm), if r.rank == 0 { SUCCESS } else { INVALID_USAGE });
        r.barrier.wait();
        free(buf);
    });
    assert!(last_error().contains("send/recv mismatch"), "{}", last_error());
    // Two sends in one group, received in two groups.
    world(2, false, |r| {
        let buf = alloc(32);
        r.barrier.wait();
        // SAFETY: no arguments.
        unsafe {
            if r.rank == 0 {
                assert_eq!(ncclGroupStart(), SUCCESS);
                assert_eq!(r.send(buf, 1, 1), SUCCESS);
                assert_eq!(r.send(buf, 1, 1), SUCCESS);
                assert_eq!(ncclGroupEnd(), SUCCESS);
            } else {
                assert_eq!(r.recv(buf, 1, 0), SUCCESS);
                assert_eq!(r.recv(buf, 1, 0), SUCCESS);
            }
        }
        r.sync();
        assert_eq!(async_error(r.comm), if r.rank == 0 { SUCCESS } else { INVALID_USAGE });
        r.barrier.wait();
        free(buf);
    });
}

#[test]
fn a_group_holds_at_most_2048_operations() {
    let _s = serial();
    world(1, false, |r| {
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupStart() }, SUCCESS);
        for _ in 0..group::MAX_GROUP_OPS {
            assert_eq!(r.send(0, 0, 0), SUCCESS);
        }
        assert_eq!(r.send(0, 0, 0), INVALID_USAGE, "operation 2049");
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupEnd() }, INVALID_USAGE);
        assert_eq!(async_error(r.comm), INVALID_USAGE);
        assert_eq!(r.query(), CUresult::CUDA_SUCCESS, "nothing queued");
    });
}

#[test]
fn a_group_on_two_streams_is_rejected() {
    let _s = serial();
    world(1, false, |r| {
        let buf = alloc(16);
        let on_null_stream = Rank { stream: 0, ..*r };
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupStart() }, SUCCESS);
        assert_eq!(r.allreduce(buf, buf, 4, 2, 0), SUCCESS);
        assert_eq!(on_null_stream.allreduce(buf, buf, 4, 2, 0), SUCCESS);
        // SAFETY: no arguments.
        assert_eq!(unsafe { ncclGroupEnd() }, INVALID_USAGE);
        assert!(last_error().contains("a group spans several streams"), "{}", last_error());
        assert_eq!(async_error(r.comm), INVALID_USAGE);
        free(buf);
    });
}

#[test]
fn bad_arguments_and_freed_buffers_are_rejected_at_call_time() {
    let _s = serial();
    world(2, false, |r| {
        let (buf, freed) = (alloc(16), alloc(16));
        r.barrier.wait();
        r.barrier.wait();
        free(freed);
        assert_eq!(r.allreduce(freed, buf, 4, 2, 0), INVALID_ARGUMENT, "a freed send buffer");
        // The last message is the process's: no rank reports another until both have read it
        // (a rank that read another rank's later message would fail, and its peer then wait at
        // the final barrier forever).
        r.barrier.wait();
        let message = last_error();
        r.barrier.wait();
        assert!(message.contains("buffer not in a live allocation"), "{message}");
        assert_eq!(r.allreduce(buf, buf, 5, 2, 0), INVALID_ARGUMENT, "past the end of the allocation");
        assert_eq!(r.allreduce(buf, buf, 4, 42, 0), INVALID_ARGUMENT, "unknown type");
        assert_eq!(r.allreduce(buf, buf, 4, 2, 9), INVALID_ARGUMENT, "unknown operator");
        assert_eq!(r.allreduce(buf, buf, usize::MAX, 2, 0), INVALID_ARGUMENT, "negative count");
        assert_eq!(r.send(buf, 1, 2), INVALID_ARGUMENT, "peer out of range");
        // SAFETY: device buffers of this test.
        let s = unsafe { ncclBroadcast(ptr(buf), ptr(buf), 1, 2, -1, r.comm, r.stream()) };
        assert_eq!(s, INVALID_ARGUMENT, "root out of range");
        let bogus = std::ptr::dangling_mut::<c_void>();
        // SAFETY: a handle ncclsim did not give out is rejected, not used.
        assert_eq!(unsafe { ncclAllReduce(ptr(buf), ptr(buf), 1, 2, 0, bogus, r.stream()) }, INVALID_ARGUMENT);
        assert_eq!(async_error(r.comm), SUCCESS, "argument errors are the call's, not the communicator's");
        r.barrier.wait();
        free(buf);
    });
}

#[test]
fn two_threads_on_one_communicator_are_reported() {
    let _s = serial();
    world(2, false, |r| {
        let buf = alloc(16);
        r.barrier.wait();
        if r.rank == 0 {
            assert_eq!(r.recv(buf, 4, 1), SUCCESS);
            let comm = r.comm as usize;
            std::thread::scope(|s| {
                s.spawn(|| {
                    // Meanwhile the finalize below waits for the receive.
                    std::thread::sleep(Duration::from_millis(100));
                    let mut n = 0;
                    // SAFETY: a live communicator; an out-pointer to a local.
                    assert_eq!(unsafe { ncclCommCount(comm as NcclComm, &mut n) }, INVALID_USAGE);
                    assert!(last_error().contains("two threads"), "{}", last_error());
                    r.barrier.wait();
                });
                // SAFETY: a live communicator of this test.
                assert_eq!(unsafe { ncclCommFinalize(r.comm) }, SUCCESS);
            });
            assert_eq!(async_error(r.comm), INVALID_USAGE);
        } else {
            r.barrier.wait();
            assert_eq!(r.send(buf, 4, 0), SUCCESS);
        }
        r.sync();
        r.barrier.wait();
        free(buf);
    });
}

#[test]
fn abort_ends_a_blocked_receive_and_peers_see_a_remote_error() {
    let _s = serial();
    world(2, false, |r| {
        let buf = alloc(16);
        r.barrier.wait();
        r.upload(buf, &[0x5a; 16]);
        assert_eq!(r.recv(buf, 4, 1 - r.rank), SUCCESS);
        if r.rank == 0 {
            std::thread::sleep(Duration::from_millis(100));
            assert_eq!(r.query(), CUresult::CUDA_ERROR_NOT_READY, "the receive waits");
            let start = Instant::now();
            // SAFETY: a live communicator of this test.
            assert_eq!(unsafe { ncclCommAbort(r.comm) }, SUCCESS);
            assert!(start.elapsed() < Duration::from_secs(2));
            r.sync();
            assert_eq!(r.download(buf, 16), [0x5a; 16], "an aborted receive leaves its output");
        } else {
            r.sync();
            assert_eq!(async_error(r.comm), REMOTE);
        }
        r.barrier.wait();
        free(buf);
    });
}

/// Clears the injected faults when a test ends, even by a panic.
struct Faults;

impl Drop for Faults {
    fn drop(&mut self) {
        faults::set("");
    }
}

#[test]
fn injected_async_errors_and_hangs() {
    let _s = serial();
    let _clear = Faults;
    faults::set("async:rank=0,call=2");
    world(2, false, |r| {
        let buf = alloc(16);
        r.barrier.wait();
        r.upload(buf, &inputs::<i32>(r.rank, 4));
        assert_eq!(r.allreduce(buf, buf, 4, 2, 0), SUCCESS);
        let after_one = expected::<i32>(0, 2, 4, |i| i);
        assert_eq!(r.allreduce(buf, buf, 4, 2, 0), SUCCESS);
        if r.rank == 0 {
            r.sync();
            assert_eq!(async_error(r.comm), SYSTEM);
            assert!(last_error().contains("injected async error"), "{}", last_error());
            assert_eq!(r.download(buf, 16), after_one, "the failed call did not communicate");
            // SAFETY: a live communicator of this test.
            assert_eq!(unsafe { ncclCommAbort(r.comm) }, SUCCESS);
        } else {
            // Waits for rank 0's second contribution until rank 0 aborts.
            r.sync();
            assert_eq!(async_error(r.comm), REMOTE);
        }
        r.barrier.wait();
        free(buf);
    });
    faults::set("hang:rank=0,call=1");
    world(1, false, |r| {
        let buf = alloc(16);
        assert_eq!(r.allreduce(buf, buf, 4, 2, 0), SUCCESS);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(r.query(), CUresult::CUDA_ERROR_NOT_READY, "the injected hang holds the stream");
        // SAFETY: a live communicator of this test.
        assert_eq!(unsafe { ncclCommAbort(r.comm) }, SUCCESS);
        r.sync();
        free(buf);
    });
}

#[test]
fn versions_ids_and_error_strings() {
    let mut v = 0;
    // SAFETY: an out-pointer to a local; error strings are static.
    unsafe {
        assert_eq!(ncclGetVersion(&mut v), SUCCESS);
        assert_eq!(CStr::from_ptr(ncclGetErrorString(IN_PROGRESS)), c"NCCL operation in progress");
        assert_eq!(CStr::from_ptr(ncclGetErrorString(99)), c"unknown result code");
    }
    assert!(v >= 22809 || std::env::var_os("NCCLSIM_VERSION").is_some());
    let (a, b) = (unique_id(), unique_id());
    assert_ne!(a.internal, b.internal);
    let mut garbage = a;
    garbage.internal[0] = 0;
    let mut comm: NcclComm = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local.
    assert_eq!(unsafe { ncclCommInitRank(&mut comm, 1, garbage, 0) }, INVALID_ARGUMENT);
}
