//! HostTransfer on the host device: the whole sweep (written once in `sweep.rs`) run directly
//! on the device memory and staged with chunks small enough that every operation pipelines
//! through several, then what only a stream-ordered backend has ([`stream_ordered`], written
//! once for every device and run on CUDA too): ordering against work queued before and after
//! on the stream, many outstanding non-blocking operations on several streams, point-to-point,
//! operations far larger than the staging ring and more chunks queued than it holds, early
//! release, bad input (typed errors before anything is queued), an MPI failure on the proxy
//! thread reaching the caller, and the pool lending only the ring once operations are through;
//! on the host device also a device whose streams share one
//! queue, buffers and streams of another device, and no pinned memory left once the
//! communicator is dropped.

use duralumin::device::Device;
use duralumin::device::cpu::HostDevice;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::*;
use duralumin::{HostTransferCommunicator, HostTransferConfig};

use crate::backend::{HostTransfer, TestDevice, small_chunks};
use crate::mpirun::rank_case::{comes_surely, within};

pub fn run(_: &MpiCommunicator, world: &SimpleCommunicator) {
    // The sweep twice: staged through pinned memory in small chunks (what a GPU does), and
    // direct on the host device's memory (the default there).
    let direct = HostTransfer::new(world, HostTransferConfig::default());
    crate::sweep::run(&direct, "HostTransfer<host> direct");
    direct.comm.synchronize().expect("synchronize after the direct sweep");
    assert_idle(&direct.comm, "after the direct sweep");
    drop(direct);
    let staged = HostTransfer::new(world, small_chunks());
    crate::sweep::run(&staged, "HostTransfer<host> staged");
    staged.comm.synchronize().expect("synchronize after the sweep");
    assert_idle(&staged.comm, "after the sweep");
    drop(staged);
    let dev = HostDevice::new(0);
    within("HostTransfer<host>", || stream_ordered(world, &dev, || dev.stream().unwrap()));
    one_hardware_queue(world);
    within("late_peer", || late_peer(world, &dev));
    let ht = HostTransfer::new(world, small_chunks());
    within("wrong_device", || wrong_device(&ht, world));
    // Dropping the communicators frees their pools: no pinned memory or flag page stays
    // allocated.
    drop(ht);
    assert!(comes_surely(|| dev.pinned_bytes() == 0), "{} pinned bytes leaked", dev.pinned_bytes());
}

/// A small operation that starts on the calling thread (`HostTransferConfig::inline_max_bytes`)
/// does not wait there for a late peer: rank 0's allreduce returns before rank 1 has called its
/// own (rank 1 calls it once rank 0's message, sent after the call returned, arrives; a call that
/// waited for rank 1 would never return), the proxy thread finishes it, and the result is the
/// whole sum. Then the same operation once every rank is in it, on the calling thread.
fn late_peer(world: &SimpleCommunicator, dev: &HostDevice) {
    use duralumin::mpi::traits::*;
    let (me, n) = (u32::try_from(world.rank()).unwrap(), u32::try_from(world.size()).unwrap());
    if n < 2 {
        return;
    }
    let ht = HostTransferCommunicator::with_config(world, dev.clone(), dev.stream().unwrap(), Default::default())
        .expect("communicator");
    let send = dev.upload(&[me + 1; 3]).unwrap();
    let sum = n * (n + 1) / 2;
    for round in 0..2 {
        let mut out = dev.alloc_zeroed::<u32>(3).unwrap();
        match (round, me) {
            (0, 0) => {
                ht.allreduce(&send, &mut out, Sum).expect("allreduce");
                world.process_at_rank(1).send(&1u8);
            }
            (0, 1) => {
                let (_go, _) = world.process_at_rank(0).receive::<u8>();
                ht.allreduce(&send, &mut out, Sum).expect("allreduce");
            }
            _ => ht.allreduce(&send, &mut out, Sum).expect("allreduce"),
        }
        ht.synchronize().expect("synchronize");
        assert_eq!(dev.download(&out).unwrap(), vec![sum; 3], "round {round}");
    }
    assert_idle(&ht, "after a late peer");
}

/// What only a stream-ordered backend has, written once for every device.
pub fn stream_ordered<D: TestDevice>(world: &SimpleCommunicator, dev: &D, new_stream: impl Fn() -> D::Stream) {
    let ht = HostTransfer::on(world, dev.clone(), new_stream(), small_chunks());
    within("ordering", || ordering(&ht));
    within("p2p", || p2p(&ht));
    assert_idle(&ht.comm, "after ordering and point-to-point");
    within("many_outstanding", || many_outstanding(world, dev, &new_stream));
    within("algorithms", || algorithms(world, dev, &new_stream));
    within("queued_on_fresh_communicators", || queued_on_fresh_communicators(world, dev, &new_stream));
    within("beyond_the_ring", || beyond_the_ring(world, dev, &new_stream, false));
    if dev.host_accessible() {
        within("beyond_the_ring, direct", || beyond_the_ring(world, dev, &new_stream, true));
    }
    within("long_pipelines", || long_pipelines(world, dev, &new_stream));
    within("streams_through_the_ring", || streams_through_the_ring(world, dev, &new_stream));
    within("early_release", || early_release(world, dev, &new_stream));
    within("bad_input", || bad_input(&ht));
    within("proxy_error", || proxy_error(&ht));
    within("chunk_boundaries", || chunk_boundaries(world, dev, &new_stream));
    assert_idle(&ht.comm, "at the end");
}

/// The flags the staging ring holds for the communicator's life.
const RING_FLAGS: usize = 4;

/// The pinned blocks the staging ring holds for the communicator's life: its cells, and its
/// movers' arrival words.
const RING_BLOCKS: usize = 2;

/// Once the operations have completed, the pool lends only the ring (its blocks, held since
/// the communicator was made) and its counters: every operation's flags are back, and nothing
/// was ever allocated beyond the ring.
pub fn assert_idle<D: Device>(c: &HostTransferCommunicator<D>, when: &str) {
    // The proxy thread returns an operation's flags right after the stream's last copy; give
    // it a moment to see that.
    let idle = |s: &duralumin::device::PoolStats| s.blocks_in_use == RING_BLOCKS && s.flags_in_use == RING_FLAGS;
    let mut stats = c.pool_stats();
    assert!(
        comes_surely(|| {
            stats = c.pool_stats();
            idle(&stats)
        }),
        "{when}: the pool still lends {stats:?}"
    );
    assert!(
        stats.high_water_bytes == stats.in_use_bytes && stats.held_bytes == stats.in_use_bytes,
        "{when}: the pool lent more than the ring: {stats:?}"
    );
}

/// An allreduce sees what a "kernel" queued before it wrote, and a kernel queued after it
/// sees the result, with nothing synchronized in between.
fn ordering<D: TestDevice>(ht: &HostTransfer<D>) {
    let (c, dev, s) = (&ht.comm, &ht.dev, ht.comm.stream());
    let (me, n) = (c.rank() as i64, c.size() as i64);
    let len = 1000;
    let mut buf = dev.up(s, &vec![0i64; len]);
    let mut after = dev.up(s, &vec![0i64; len]);
    for round in 0..3i64 {
        let pattern = dev.up(s, &(0..len as i64).map(|i| me + i + round).collect::<Vec<_>>());
        // A slow "kernel" writes the buffer: the stream is busy while the host queues the
        // collective behind it.
        dev.delay(s);
        dev.copy(s, &pattern, &mut buf);
        c.allreduce_in_place(&mut buf, Sum).unwrap();
        // A "kernel" queued right behind reads the result.
        dev.copy(s, &buf, &mut after);
        let want: Vec<i64> = (0..len as i64).map(|i| n * (n - 1) / 2 + n * (i + round)).collect();
        assert_eq!(dev.down(s, &after), want, "ordering round {round}");
    }
}

/// Send, receive, sendrecv (in place too) and multi-peer sendrecv around the ring,
/// stream-ordered and non-blocking.
fn p2p<D: TestDevice>(ht: &HostTransfer<D>) {
    let (c, dev, s) = (&ht.comm, &ht.dev, ht.comm.stream().clone());
    let (me, n) = (c.rank(), c.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    for count in crate::COUNTS {
        let mine: Vec<u32> = (0..count as u32).map(|i| i * 10 + me as u32).collect();
        let theirs: Vec<u32> = (0..count as u32).map(|i| i * 10 + left as u32).collect();
        let send = dev.up(&s, &mine);
        let mut recv = dev.up(&s, &vec![0u32; count]);
        c.sendrecv(&send, right, &mut recv, left, 3).unwrap();
        assert_eq!(dev.down(&s, &recv), theirs, "sendrecv count={count}");
        let mut recv = dev.up(&s, &vec![0u32; count]);
        c.isendrecv(&send, right, &mut recv, left, 4).unwrap().wait().unwrap();
        assert_eq!(dev.down(&s, &recv), theirs, "isendrecv count={count}");
        let mut buf = dev.up(&s, &mine);
        c.sendrecv_in_place(&mut buf, right, left, 7).unwrap();
        assert_eq!(dev.down(&s, &buf), theirs, "sendrecv_in_place count={count}");
        // Two peers each way in one call (the same peer twice when n <= 2).
        let from_right: Vec<u32> = (0..count as u32).map(|i| i * 10 + right as u32).collect();
        let mut a = dev.up(&s, &vec![0u32; count]);
        let mut b = dev.up(&s, &vec![0u32; count]);
        c.multi_sendrecv(&[(&send, right), (&send, left)], &mut [(&mut a, left), (&mut b, right)], 8).unwrap();
        assert_eq!(dev.down(&s, &a), theirs, "multi_sendrecv from the left, count={count}");
        assert_eq!(dev.down(&s, &b), from_right, "multi_sendrecv from the right, count={count}");
        if n > 1 {
            // Pairs exchange with send and recv (the lower rank sends first).
            let partner = me ^ 1;
            if partner < n {
                let expect: Vec<u32> = (0..count as u32).map(|i| i * 10 + partner as u32).collect();
                let mut got = dev.up(&s, &vec![0u32; count]);
                if me < partner {
                    c.send(&send, partner, 5).unwrap();
                    c.recv(&mut got, partner, 6).unwrap();
                } else {
                    c.recv(&mut got, partner, 5).unwrap();
                    c.send(&send, partner, 6).unwrap();
                }
                assert_eq!(dev.down(&s, &got), expect, "send/recv count={count}");
            }
        }
    }
    c.barrier().unwrap();
    c.ibarrier().unwrap().wait().unwrap();
    c.synchronize().unwrap();
}

/// Three communicators on three streams, each with several non-blocking operations in flight
/// at once, plus stream-side waits: all complete with the right results.
fn many_outstanding<D: TestDevice>(world: &SimpleCommunicator, dev: &D, new_stream: &impl Fn() -> D::Stream) {
    let config = HostTransferConfig::default().with_chunk_bytes(256).with_ring_cells(4).with_direct(false);
    let comms: Vec<HostTransferCommunicator<D>> = (0..3)
        .map(|_| HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), config).unwrap())
        .collect();
    let (me, n) = (comms[0].rank() as u64, comms[0].size() as u64);
    let len = 700;
    let mut bufs: Vec<Vec<_>> = (0..3)
        .map(|k| (0..4).map(|j| dev.up(comms[k].stream(), &vec![me + (k * 4 + j) as u64; len])).collect())
        .collect();
    {
        let mut requests = Vec::new();
        for (c, row) in comms.iter().zip(bufs.iter_mut()) {
            for b in row.iter_mut() {
                requests.push(c.iallreduce_in_place(b, Sum).unwrap());
            }
        }
        // The first communicator's stream takes every request of the second (the host does not
        // wait for them); the others are waited for on the host.
        for (i, r) in requests.into_iter().enumerate() {
            match i {
                4..8 => r.stream_wait(comms[0].stream()).unwrap(),
                _ => r.wait().unwrap(),
            }
        }
    }
    for (k, row) in bufs.iter().enumerate() {
        for (j, b) in row.iter().enumerate() {
            let want = n * (n - 1) / 2 + n * (k * 4 + j) as u64;
            assert_eq!(dev.down(comms[k].stream(), b), vec![want; len], "communicator {k} request {j}");
        }
    }
    for c in &comms {
        c.synchronize().unwrap();
        assert_idle(c, "after many outstanding operations");
    }
}

/// Pipelined operations queued back to back, on a fresh communicator each round (a fresh pool,
/// so flag slots are handed out again as soon as operations finish), with their results
/// checked. The race this once hung on (a later operation resetting the `done` flag a stream
/// still waited for) needs the stream to fall behind the proxy thread, which this only brings
/// about sometimes; the lib test `a_stream_behind_the_proxy_thread_keeps_its_done_flag` holds
/// the stream back on purpose and catches it every time.
fn queued_on_fresh_communicators<D: TestDevice>(
    world: &SimpleCommunicator,
    dev: &D,
    new_stream: &impl Fn() -> D::Stream,
) {
    let config = HostTransferConfig::default().with_chunk_bytes(256 << 10).with_direct(false);
    let len = 1 << 20;
    for round in 0..12u32 {
        let c = HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), config).unwrap();
        let s = c.stream().clone();
        let (me, n) = (c.rank() as u32, c.size() as u32);
        let send = dev.up(&s, &vec![me + round; len]);
        let mut outs: Vec<_> = (0..8).map(|_| dev.up(&s, &vec![0u32; len])).collect();
        for out in &mut outs {
            c.allreduce(&send, out, Sum).unwrap();
        }
        c.synchronize().unwrap();
        let want = n * (n - 1) / 2 + n * round;
        for (j, out) in outs.iter().enumerate() {
            assert_eq!(dev.down(&s, out), vec![want; len], "round {round} operation {j}");
        }
        assert_idle(&c, "after operations queued on a fresh communicator");
    }
}

/// Every stream of the device on one executor, as on a GPU whose streams share one hardware
/// queue (`CUDA_DEVICE_MAX_CONNECTIONS=1`; the queue-order rule,
/// `docs/architecture.md#the-queue-order-rule`): the staged sweep, the ordering checks (work
/// queued right behind each operation) and operations streaming through a full ring must
/// finish here.
fn one_hardware_queue(world: &SimpleCommunicator) {
    let dev = HostDevice::with_queues(0, 1);
    let stream = dev.stream().unwrap();
    let ht = HostTransfer::on(world, dev, stream, small_chunks());
    crate::sweep::run_with(&ht, "HostTransfer<host> on one hardware queue", crate::sweep::Breadth::Representative);
    within("ordering on one hardware queue", || ordering(&ht));
    ht.comm.synchronize().expect("synchronize after the sweep on one hardware queue");
    assert_idle(&ht.comm, "after the sweep on one hardware queue");
    // More chunks queued than the ring holds: the device waits for cells the proxy thread
    // hands back as earlier chunks drain, which were queued before the wait.
    within("streams_through_the_ring on one hardware queue", || {
        streams_through_the_ring(world, &ht.dev, &|| ht.dev.stream().unwrap())
    });
}

/// Operations of a thousand chunks and more, each chunk a few device calls: far more work than
/// a GPU's command queue holds (about a thousand items), so the calling thread blocks while it
/// queues them, until the device has run some, which needs the proxy thread to run the
/// operation's first chunks meanwhile, and through a ring of four cells, which each chunk
/// refills after the one four before it has drained. Point-to-point, alltoallv and an
/// allreduce, all in full chunks.
fn long_pipelines<D: TestDevice>(world: &SimpleCommunicator, dev: &D, new_stream: &impl Fn() -> D::Stream) {
    let config = HostTransferConfig::default().with_chunk_bytes(256).with_ring_cells(4).with_direct(false);
    let c = HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), config).unwrap();
    let (me, n, s) = (c.rank(), c.size(), c.stream().clone());
    let len = 64 << 10; // 256 KiB of u32: 1024 chunks.
    let of = |r: usize| (0..len).map(|i| (r * 1_000_000 + i) as u32).collect::<Vec<_>>();
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let mine = dev.up(&s, &of(me));
    let mut got = dev.up(&s, &vec![0u32; len]);
    c.sendrecv(&mine, right, &mut got, left, 1).unwrap();
    assert!(dev.down(&s, &got) == of(left), "sendrecv of 1024 chunks");
    let mut sum = dev.up(&s, &vec![0u32; len]);
    c.allreduce(&mine, &mut sum, Sum).unwrap();
    let want: Vec<u32> = (0..len).map(|i| (0..n).map(|r| of(r)[i]).sum()).collect();
    assert!(dev.down(&s, &sum) == want, "allreduce of 1024 chunks");
    // Alltoallv: 256 KiB to every rank.
    let counts = vec![len; n];
    let displs: Vec<usize> = (0..n).map(|j| j * len).collect();
    let send = dev.up(&s, &(0..n).flat_map(|_| of(me)).collect::<Vec<_>>());
    let mut recv = dev.up(&s, &vec![0u32; n * len]);
    c.alltoallv(&send, &counts, &displs, &mut recv, &counts, &displs).unwrap();
    assert!(dev.down(&s, &recv) == (0..n).flat_map(of).collect::<Vec<_>>(), "alltoallv of 1024 chunks per block");
    c.synchronize().unwrap();
    assert_idle(&c, "after operations of a thousand chunks");
}

/// Send-only operations release their stream once the data is staged: a bcast root's and a
/// sender's requests complete before any receiver has joined (the receivers start only when
/// told so), with messages far above MPI's eager limit, and the data arrives all the same.
fn early_release<D: TestDevice>(world: &SimpleCommunicator, dev: &D, new_stream: &impl Fn() -> D::Stream) {
    use duralumin::mpi::traits::*;
    let config = HostTransferConfig::default().with_direct(false);
    let c = HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), config).unwrap();
    let s = c.stream().clone();
    let (me, n) = (c.rank(), c.size());
    if n < 2 {
        return;
    }
    let len = config.chunk_bytes / size_of::<u32>();
    let data: Vec<u32> = (0..len as u32).map(|i| i ^ 0x5a5a).collect();
    let released = |mut r: duralumin::backends::host_transfer::DeviceRequest<'_, D>, what: &str| {
        assert!(comes_surely(|| r.test().unwrap()), "{what}: the sender's stream waits for the receivers");
    };
    let mut buf = dev.up(&s, &if me == 0 { data.clone() } else { vec![0; len] });
    if me == 0 {
        released(c.ibcast(&mut buf, 0).unwrap(), "bcast root");
        released(c.isend(&buf, 1, 11).unwrap(), "send");
        for r in 1..n {
            world.process_at_rank(r as i32).send(&1u8);
        }
    } else {
        let (go, _) = world.process_at_rank(0).receive::<u8>();
        assert_eq!(go, 1);
        c.bcast(&mut buf, 0).unwrap();
        c.synchronize().unwrap();
        assert!(dev.down(&s, &buf) == data, "bcast after the root's release");
        if me == 1 {
            let mut got = dev.up(&s, &vec![0u32; len]);
            c.recv(&mut got, 0, 11).unwrap();
            c.synchronize().unwrap();
            assert!(dev.down(&s, &got) == data, "recv after the sender's release");
        }
    }
    c.synchronize().unwrap();
    drop(c);
}

/// More chunks queued at once than the ring holds (each operation 16 chunks, the ring 4
/// cells), by operations on two streams (the communicator's, and the internal one of
/// non-blocking operations), interleaved, then a bcast (released early at the root) and an
/// allgather, with nothing synchronized between: the device waits for cells the proxy thread
/// hands back, in queue order, and the pool never lends more than the ring. An operation whose
/// one chunk needs more cells than the ring has fails with a typed error before anything is
/// queued, and the communicator goes on. Written once for every device.
pub fn streams_through_the_ring<D: TestDevice>(
    world: &SimpleCommunicator,
    dev: &D,
    new_stream: &impl Fn() -> D::Stream,
) {
    let config = HostTransferConfig::default().with_chunk_bytes(512).with_ring_cells(4).with_direct(false);
    let c = HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), config).unwrap();
    let (me, n, s) = (c.rank(), c.size(), c.stream().clone());
    let ring = c.pool_stats();
    assert!(
        ring.blocks_in_use == RING_BLOCKS && ring.in_use_bytes >= 4 * 512,
        "the ring is lent from the start: {ring:?}"
    );
    let len = 16 * 512 / size_of::<u32>();
    let val = |r: usize, i: usize, k: usize| (r * 1_000_000 + i * 10 + k) as u32;
    let inputs: Vec<_> = (0..6).map(|k| dev.up(&s, &(0..len).map(|i| val(me, i, k)).collect::<Vec<_>>())).collect();
    let sum = |k: usize| (0..len).map(|i| (0..n).map(|r| val(r, i, k)).sum::<u32>()).collect::<Vec<_>>();
    let mut outs: Vec<_> = (0..6).map(|_| dev.up(&s, &vec![0u32; len])).collect();
    let mut gathered = dev.up(&s, &vec![0u32; n * len]);
    let root = n - 1;
    let mut bc = dev.up(&s, &if me == root { sum(0) } else { vec![0; len] });
    {
        let (stream_outs, side_outs) = outs.split_at_mut(3);
        let mut requests = Vec::new();
        for (k, (o, x)) in stream_outs.iter_mut().zip(side_outs.iter_mut()).enumerate() {
            c.allreduce(&inputs[k], o, Sum).unwrap_or_else(|e| panic!("allreduce {k} while the ring is full: {e}"));
            requests.push(c.iallreduce(&inputs[k + 3], x, Sum).unwrap_or_else(|e| panic!("iallreduce {k}: {e}")));
        }
        c.bcast(&mut bc, root).unwrap();
        c.allgather(&inputs[0], &mut gathered).unwrap();
        for r in requests {
            r.wait().unwrap();
        }
    }
    c.synchronize().unwrap();
    for (k, o) in outs.iter().enumerate() {
        assert!(dev.down(&s, o) == sum(k), "allreduce {k} streamed through a full ring: wrong result");
    }
    assert!(dev.down(&s, &bc) == sum(0), "bcast queued behind a full ring");
    let want: Vec<u32> = (0..n).flat_map(|r| (0..len).map(move |i| val(r, i, 0))).collect();
    assert!(dev.down(&s, &gathered) == want, "allgather queued behind a full ring");
    assert_idle(&c, "after operations streaming through the ring");
    assert_eq!(c.pool_stats().held_bytes, ring.held_bytes, "nothing allocated beyond the ring");

    // An out-of-place chunk takes two cells (its send and its receive side): more than a
    // one-cell ring, whatever else is queued; in place it takes one and runs.
    let one = config.with_ring_cells(1);
    let b = HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), one).unwrap();
    let x = dev.up(&s, &vec![1u32; 2048]);
    let mut y = dev.up(&s, &vec![0u32; 2048]);
    match b.allreduce(&x, &mut y, Sum) {
        Err(Error::PoolExhausted { cap, .. }) => assert_eq!(cap, 512),
        other => panic!("a chunk larger than the ring: expected PoolExhausted, got {other:?}"),
    }
    assert_idle(&b, "after an operation larger than the ring");
    let mut mine = dev.up(&s, &vec![me as u32; 2048]);
    b.allreduce_in_place(&mut mine, Sum).unwrap();
    b.synchronize().unwrap();
    let total = (0..n as u32).sum::<u32>();
    assert!(dev.down(b.stream(), &mine) == vec![total; 2048], "an in-place allreduce after the refused one");
    assert_idle(&b, "after the refused operation");
}

/// Every kind of staging (rows, pieces, point-to-point; in place and not) with messages four
/// times the ring: each operation streams through the ring's cells, and the pool never lends
/// more than the ring. With `direct`, the operations the host device runs
/// on its buffers meet staged ones on other ranks (a gatherv's root stages, its senders would
/// not), and must still cut their messages alike.
fn beyond_the_ring<D: TestDevice>(
    world: &SimpleCommunicator,
    dev: &D,
    new_stream: &impl Fn() -> D::Stream,
    direct: bool,
) {
    let cap = 8 * 512;
    let config = HostTransferConfig::default().with_chunk_bytes(512).with_ring_cells(8).with_direct(direct);
    let c = HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), config).unwrap();
    let s = c.stream().clone();
    let (me, n) = (c.rank(), c.size());
    let len = 4 * cap / size_of::<u32>();
    let val = |r: usize, i: usize| (r * 1_000_000 + i) as u32;
    let of = |r: usize, count: usize| (0..count).map(|i| val(r, i)).collect::<Vec<u32>>();
    let mine = dev.up(&s, &of(me, len));
    // Each check waits for the pool to be idle: send-only operations release their stream
    // before their MPI part (and its staging) is through.
    let check = |what: &str, got: &D::Buf<u32>, want: Vec<u32>| {
        c.synchronize().unwrap_or_else(|e| panic!("{what}: {e}"));
        let got = dev.down(&s, got);
        assert!(got == want, "{what}: wrong result");
        assert_idle(&c, what);
    };

    // Back to back with only a synchronize between them.
    let mut sum = dev.up(&s, &vec![0u32; len]);
    for _ in 0..10 {
        c.allreduce(&mine, &mut sum, Sum).unwrap();
        c.synchronize().unwrap();
    }
    check("allreduce", &sum, (0..len).map(|i| (0..n).map(|r| val(r, i)).sum()).collect());
    let mut all = dev.up(&s, &vec![0u32; n * len]);
    c.allgather(&mine, &mut all).unwrap();
    check("allgather", &all, (0..n).flat_map(|r| of(r, len)).collect());

    // Uneven blocks: rank r has `len + r` elements.
    let counts: Vec<usize> = (0..n).map(|r| len + r).collect();
    let displs: Vec<usize> = counts.iter().scan(0, |a, &x| Some(std::mem::replace(a, *a + x))).collect();
    let total: usize = counts.iter().sum();
    let gathered: Vec<u32> = (0..n).flat_map(|r| of(r, counts[r])).collect();
    let mine_v = dev.up(&s, &of(me, counts[me]));
    let mut v = dev.up(&s, &vec![0u32; total]);
    c.allgatherv(&mine_v, &mut v, &counts, &displs).unwrap();
    check("allgatherv", &v, gathered.clone());
    let mut v = dev.up(&s, &vec![0; total]);
    let mut own = vec![0; total];
    own[displs[me]..displs[me] + counts[me]].copy_from_slice(&of(me, counts[me]));
    let mut v_in = dev.up(&s, &own);
    c.allgatherv_in_place(&mut v_in, &counts, &displs).unwrap();
    check("allgatherv in place", &v_in, gathered.clone());
    let root = n - 1;
    c.gatherv(&mine_v, &mut v, &counts, &displs, root).unwrap();
    check("gatherv", &v, if me == root { gathered.clone() } else { vec![0; total] });
    // Scatterv from the root's gathered blocks: rank r gets its own block back.
    let source = dev.up(&s, &gathered);
    let mut back = dev.up(&s, &vec![0u32; counts[me]]);
    c.scatterv(&source, &counts, &displs, &mut back, root).unwrap();
    check("scatterv", &back, of(me, counts[me]));
    let mut whole = dev.up(&s, &if me == root { gathered.clone() } else { vec![0; counts[me]] });
    c.scatterv_in_place(&mut whole, &counts, &displs, root).unwrap();
    check("scatterv in place", &whole, if me == root { gathered.clone() } else { of(me, counts[me]) });
    // Alltoallv: rank r sends `len + r + j` elements to rank j.
    let sc: Vec<usize> = (0..n).map(|j| len + me + j).collect();
    let rc: Vec<usize> = (0..n).map(|i| len + i + me).collect();
    let packed = |x: &[usize]| x.iter().scan(0, |a, &y| Some(std::mem::replace(a, *a + y))).collect::<Vec<_>>();
    let (sd, rd) = (packed(&sc), packed(&rc));
    let send: Vec<u32> = (0..n).flat_map(|j| (0..sc[j]).map(move |i| val(me, j * 7 + i))).collect();
    let want: Vec<u32> = (0..n).flat_map(|i| (0..rc[i]).map(move |x| val(i, me * 7 + x))).collect();
    let send = dev.up(&s, &send);
    let mut recv = dev.up(&s, &vec![0u32; rc.iter().sum()]);
    c.alltoallv(&send, &sc, &sd, &mut recv, &rc, &rd).unwrap();
    check("alltoallv", &recv, want);
    let mut rs = dev.up(&s, &vec![0u32; counts[me]]);
    let contrib = dev.up(&s, &gathered);
    c.reduce_scatterv(&contrib, &mut rs, &counts, Sum).unwrap();
    check("reduce_scatterv", &rs, of(me, counts[me]).iter().map(|x| x * n as u32).collect());

    // Point-to-point around the ring.
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    let mut got = dev.up(&s, &vec![0u32; len]);
    c.sendrecv(&mine, right, &mut got, left, 1).unwrap();
    check("sendrecv", &got, of(left, len));
    let mut buf = dev.up(&s, &of(me, len));
    c.sendrecv_in_place(&mut buf, right, left, 2).unwrap();
    check("sendrecv_in_place", &buf, of(left, len));
    let (mut a, mut b) = (dev.up(&s, &vec![0u32; len]), dev.up(&s, &vec![0u32; len]));
    c.multi_sendrecv(&[(&mine, right), (&mine, left)], &mut [(&mut a, left), (&mut b, right)], 3).unwrap();
    check("multi_sendrecv from the left", &a, of(left, len));
    check("multi_sendrecv from the right", &b, of(right, len));
    // A multi-peer send met by a plain receive: both sides cut the message alike.
    if n > 1 {
        if me == 0 {
            let no_recvs: &mut [(&mut D::Buf<u32>, usize)] = &mut [];
            c.multi_sendrecv(&[(&mine, 1)], no_recvs, 4).unwrap();
            c.synchronize().unwrap();
        } else if me == 1 {
            let mut got = dev.up(&s, &vec![0u32; len]);
            c.recv(&mut got, 0, 4).unwrap();
            check("recv of a multi_sendrecv message", &got, of(0, len));
        }
    }
    c.synchronize().unwrap();
    assert_idle(&c, "after operations beyond the pool");
}

/// Runs `$call`, which must fail with `$pat`, then checks that a valid operation still works.
macro_rules! expect_err {
    ($still_works:expr, $call:expr, $pat:pat) => {{
        match $call {
            Err($pat) => {}
            other => panic!("{}: expected {}, got {other:?}", stringify!($call), stringify!($pat)),
        }
        $still_works(stringify!($call));
    }};
}

/// An allreduce that must work (after an input error): checks its result.
fn still_works<D: TestDevice>(ht: &HostTransfer<D>, after: &str) {
    let (c, dev, s) = (&ht.comm, &ht.dev, ht.comm.stream());
    let mut x = dev.up(s, &[c.rank() as u64, 1]);
    c.allreduce_in_place(&mut x, Sum).unwrap_or_else(|e| panic!("after {after}: {e}"));
    let k = c.size() as u64;
    assert_eq!(dev.down(s, &x), [k * (k - 1) / 2, k], "after {after}");
}

/// Each input error, on every rank at once: the typed error, nothing queued, and the next
/// valid operation works.
fn bad_input<D: TestDevice>(ht: &HostTransfer<D>) {
    let (c, dev, s) = (&ht.comm, &ht.dev, ht.comm.stream());
    let n = c.size();
    let works = |after: &str| still_works(ht, after);
    let a = dev.up(s, &[1.0f32; 4]);
    let mut b = dev.up(s, &[0.0f32; 5]);
    expect_err!(works, c.allreduce(&a, &mut b, Sum), Error::BufferLength { expected: 4, actual: 5, .. });
    expect_err!(works, c.iallreduce(&a, &mut b, Sum).map(drop), Error::BufferLength { .. });
    expect_err!(works, c.reduce(&a, &mut b, n, Sum), Error::RankOutOfRange { .. });
    expect_err!(works, c.bcast(&mut b, n + 2), Error::RankOutOfRange { .. });
    expect_err!(works, c.gather(&a, &mut b, n), Error::RankOutOfRange { .. });
    expect_err!(works, c.scatter_in_place(&mut b, n), Error::RankOutOfRange { .. });
    expect_err!(works, c.allgather(&a, &mut b), Error::BufferLength { .. });
    expect_err!(works, c.alltoall(&a, &mut b), Error::BufferLength { .. });
    expect_err!(works, c.reduce_scatter(&a, &mut b, Sum), Error::BufferLength { .. });
    expect_err!(works, c.send(&a, n, 0), Error::RankOutOfRange { .. });
    expect_err!(works, c.recv(&mut b, c.rank(), 0), Error::SelfMessage { .. });
    if n > 1 {
        // A message to itself whose receive is from another rank (and the other way round).
        let other = (c.rank() + 1) % n;
        let mut c4 = dev.up(s, &[0.0f32; 4]);
        expect_err!(works, c.sendrecv(&a, c.rank(), &mut c4, other, 0), Error::SelfMessage { .. });
        expect_err!(works, c.sendrecv(&a, other, &mut c4, c.rank(), 0), Error::SelfMessage { .. });
        let sends = [(&a, c.rank()), (&a, other)];
        let mut recvs = [(&mut c4, other)];
        expect_err!(works, c.multi_sendrecv(&sends, &mut recvs, 0), Error::SelfMessage { .. });
    }
    expect_err!(works, c.send(&a, 0, -1), Error::InvalidTag { .. });
    if 5 % n != 0 {
        expect_err!(works, c.allgather_in_place(&mut b), Error::BufferLength { .. });
    }
    c.synchronize().unwrap();
}

/// Buffers and streams of another device (the host device's second ordinal): typed errors,
/// nothing queued, and bad settings.
fn wrong_device(ht: &HostTransfer, world: &SimpleCommunicator) {
    let (c, dev) = (&ht.comm, &ht.dev);
    let works = |after: &str| still_works(ht, after);
    let a = dev.upload(&[1.0f32; 4]).unwrap();
    let other = HostDevice::new(1);
    let mut foreign = other.alloc_zeroed::<f32>(4).unwrap();
    expect_err!(works, c.allreduce(&a, &mut foreign, Sum), Error::WrongDevice { .. });
    expect_err!(works, c.bcast(&mut foreign, 0), Error::WrongDevice { .. });
    // A stream of another device cannot carry a communicator.
    match HostTransferCommunicator::new(world, dev.clone(), other.stream().unwrap()) {
        Err(Error::WrongDevice { .. }) => {}
        r => panic!("stream of another device: expected WrongDevice, got {:?}", r.map(|_| ())),
    }
    for bad in [
        HostTransferConfig::default().with_ring_cells(3),
        HostTransferConfig::default().with_ring_cells(0),
        HostTransferConfig::default().with_chunk_bytes(0),
        HostTransferConfig::default().with_pipeline_chunks(0),
        HostTransferConfig::default().with_mover_blocks(0),
    ] {
        assert!(
            matches!(
                HostTransferCommunicator::with_config(world, dev.clone(), dev.stream().unwrap(), bad),
                Err(Error::InvalidConfig(_))
            ),
            "{bad:?}"
        );
    }
    assert!(dev.owns(c.stream()) && !other.owns(c.stream()));
    c.synchronize().unwrap();
}

/// Explicit algorithms and the communicator's tuning reach the MPI part of every chunk: with
/// thresholds below the chunk size, every allreduce and bcast algorithm runs (`Auto` picking
/// the large-message ones), and a non-commutative operator is refused the reordering ones.
fn algorithms<D: TestDevice>(world: &SimpleCommunicator, dev: &D, new_stream: &impl Fn() -> D::Stream) {
    let mut ht = HostTransfer::on(world, dev.clone(), new_stream(), small_chunks());
    ht.comm.set_tuning(crate::small_thresholds());
    assert_eq!(ht.comm.tuning(), crate::small_thresholds());
    ht.algorithms = true;
    crate::sweep::reductions::<f32, Sum>(&ht);
    crate::sweep::reductions::<u16, BitXor>(&ht);
    crate::sweep::movement::<i64>(&ht);
    crate::sweep::non_commutative(&ht);
    ht.comm.synchronize().expect("synchronize after the algorithms");
    assert_idle(&ht.comm, "after the algorithms");
}

/// Messages that differ from their receive by whole chunks: a receive of a whole number of
/// chunks meeting one element more, a whole chunk fewer, or a chunk and an element more. The
/// pair's chunks part in one whose messages differ in length, so each is a count error at the
/// receiver (never a silent pass, with the sender's last chunk left for a later receive, nor a
/// receive waiting for a chunk that never comes); equal lengths of whole chunks pass with their
/// data, and the communicator works on.
fn chunk_boundaries<D: TestDevice>(world: &SimpleCommunicator, dev: &D, new_stream: &impl Fn() -> D::Stream) {
    const CHUNK: usize = 64;
    let config = HostTransferConfig::default().with_chunk_bytes(CHUNK).with_direct(false);
    let c = HostTransferCommunicator::with_config(world, dev.clone(), new_stream(), config).unwrap();
    let (me, n, s) = (c.rank(), c.size(), c.stream().clone());
    let partner = me ^ 1;
    // (elements sent, elements expected), of one-byte elements: CHUNK per chunk.
    let cases = [(CHUNK + 1, CHUNK), (CHUNK, 2 * CHUNK), (2 * CHUNK + 1, 2 * CHUNK), (2 * CHUNK, 2 * CHUNK), (0, 0)];
    if partner < n {
        for (i, &(sent, expected)) in cases.iter().enumerate() {
            let (tag, fill) = (40 + i as i32, 1 + i as u8);
            if me < partner {
                c.send(&dev.up(&s, &vec![fill; sent]), partner, tag).unwrap();
                c.synchronize().unwrap_or_else(|e| panic!("case {i}: the sender: {e}"));
                continue;
            }
            let mut b = dev.up(&s, &vec![0u8; expected]);
            c.recv(&mut b, partner, tag).unwrap();
            match c.synchronize() {
                Ok(()) if sent == expected => assert_eq!(dev.down(&s, &b), vec![fill; expected], "case {i}"),
                Ok(()) => panic!("case {i}: a receive of {expected} elements met {sent} and passed"),
                Err(e) if sent != expected => {
                    assert!(matches!(e, Error::CountMismatch { .. }), "case {i}: {e}")
                }
                Err(e) => panic!("case {i}: equal lengths failed: {e}"),
            }
        }
    }
    let mut x = dev.up(&s, &[1u32]);
    c.allreduce_in_place(&mut x, Sum).unwrap();
    c.synchronize().unwrap();
    assert_eq!(dev.down(&s, &x), [n as u32], "after the mismatches");
    assert_idle(&c, "after the chunk boundaries");
}

/// A receive shorter than the message fails inside MPI on the proxy thread: the stream is
/// released (no hang), the error reaches the caller on the next call, and the communicator
/// keeps working. A non-blocking one's error is its request's (by `wait` or `test`), not the
/// communicator's, unless the request is dropped unreported.
fn proxy_error<D: TestDevice>(ht: &HostTransfer<D>) {
    let (c, dev, s) = (&ht.comm, &ht.dev, ht.comm.stream().clone());
    let (me, n) = (c.rank(), c.size());
    if n < 2 {
        return;
    }
    let partner = me ^ 1;
    if partner < n {
        if me < partner {
            let long = dev.up(&s, &[7u8; 10]);
            for tag in 9..13 {
                c.send(&long, partner, tag).unwrap();
            }
            c.synchronize().unwrap();
        } else {
            let truncated = |err: &Error| matches!(err, Error::Mpi { .. } | Error::CountMismatch { .. });
            let mut short = dev.up(&s, &[0u8; 4]);
            c.recv(&mut short, partner, 9).unwrap();
            let err = c.synchronize().expect_err("a truncated receive must fail");
            assert!(truncated(&err), "{err}");
            let err = c.irecv(&mut short, partner, 10).unwrap().wait().expect_err("the request reports its error");
            assert!(truncated(&err), "{err}");
            c.synchronize().expect("a request's error is not the communicator's too");
            drop(c.irecv(&mut short, partner, 11).unwrap());
            let err = c.synchronize().expect_err("a dropped request's error goes to the communicator");
            assert!(truncated(&err), "{err}");
            let mut r = c.irecv(&mut short, partner, 12).unwrap();
            let err = loop {
                match r.test() {
                    Ok(false) => std::thread::yield_now(),
                    Ok(true) => panic!("a truncated non-blocking receive tested complete without its error"),
                    Err(e) => break e,
                }
            };
            assert!(truncated(&err), "{err}");
            assert!(matches!(r.test(), Ok(true)), "the error is reported once");
            drop(r);
            c.synchronize().expect("a request's error is not the communicator's too");
        }
    }
    let mut x = dev.up(&s, &[1u32]);
    c.allreduce_in_place(&mut x, Sum).unwrap();
    c.synchronize().unwrap();
    assert_eq!(dev.down(&s, &x), [n as u32]);
}
