//! Soak: 10 000 mixed non-blocking operations per rank on three communicators driven from three
//! threads at once (two Mpi communicators, one of them with thresholds low enough that its
//! larger operations run Duralumin's own algorithms on the progress thread, and a HostTransfer
//! communicator on the host device whose stream waits on the device for its non-blocking
//! operations), every result checked exactly.
//!
//! After a warm-up the ranks note their baseline; after the measured run they check that
//! nothing is left behind: no operation in flight on any communicator (requests), every
//! flag slot back in the HostTransfer pool, whose counters equal the warm-up's (only the staging
//! ring and its counters lent, nothing allocated since), every communicator still in step
//! (an operation on each whose messages carry per-operation tags still gets the right result),
//! the progress thread gone once the communicators are dropped, and the resident set grown by
//! less than 16 MiB. (No public call shows the tags themselves.)
//!
//! Run under `mpirun` at 2 and 3 ranks, one launch each with a hard limit; each rank prints
//! what it measured (`SOAK rank ...` lines), shown in the test's output.
// Test values are cut from counters, ranks and random numbers on purpose (all small, or
// wanted modulo the type): the cast lints are noise here.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

#[path = "../common/mpirun.rs"]
mod mpirun;
mod plan;
mod run;

use std::time::{Duration, Instant};

use duralumin::device::PoolStats;
use duralumin::device::cpu::HostDevice;
use duralumin::{HostTransferCommunicator, HostTransferConfig};
use duralumin::{MpiCommunicator, Sum, Tuning};
use libtest_mimic::{Arguments, Failed, Trial};

/// Operations per rank in the measured run, over the three communicators.
const OPS: usize = 10_000;
/// Each communicator's share of [`OPS`]: the two Mpi communicators, then HostTransfer (whose
/// operations each cost a device round trip more).
const SHARES: [usize; 3] = [4_200, 4_200, 1_600];
/// Operations per communicator in the warm-up, before the baseline is taken.
const WARM_UP: usize = 300;
/// The most the resident set may grow between the warm-up and the end.
const RSS_LIMIT: usize = 16 << 20;
/// The hard limit of one launch.
const LIMIT: Duration = Duration::from_secs(120);

fn main() {
    if std::env::var("DURALUMIN_SOAK_PROGRAM").is_ok() {
        rank_main();
        return;
    }
    let mut args = Arguments::from_args();
    // Both launches share the machine's cores: one at a time.
    args.test_threads = Some(1);
    let trials = [2, 3].into_iter().map(|np| Trial::test(format!("soak_np{np}"), move || launch(np))).collect();
    libtest_mimic::run(&args, trials).exit();
}

fn launch(np: usize) -> Result<(), Failed> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    // Well under the launch's limit: a hang ends with the ranks' report naming the operation.
    let env = [("DURALUMIN_SOAK_PROGRAM", "1".to_string()), ("DURALUMIN_TIMEOUT", "60".to_string())];
    let run = mpirun::launch(np, &exe, &env, &[], LIMIT)?;
    match run.status {
        Some(s) if s.success() => {
            for line in run.stdout.lines().filter(|l| l.starts_with("SOAK")) {
                println!("{line}");
            }
            println!("soak np {np}: {:.1?}", run.elapsed);
            Ok(())
        }
        Some(s) => Err(run.failure(&format!("mpirun -np {np} failed ({s})")).into()),
        None => Err(run.failure(&format!("mpirun -np {np} still running after {LIMIT:?}: killed")).into()),
    }
}

/// The resident set of this process, in bytes.
fn rss() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm.split_whitespace().nth(1).and_then(|p| p.parse().ok()).expect("statm's resident pages");
    // SAFETY: sysconf only reads a configuration value.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * usize::try_from(page).expect("page size")
}

/// The three communicators of a rank.
struct Comms {
    algorithms: MpiCommunicator,
    native: MpiCommunicator,
    ht: HostTransferCommunicator<HostDevice>,
    dev: HostDevice,
}

/// Runs `ops[k]` operations on communicator `k`, each from its own thread, starting at batch
/// `first`; returns the communicators and the operations run.
fn round(c: Comms, first: usize, ops: [usize; 3]) -> (Comms, usize) {
    let Comms { algorithms, native, ht, dev } = c;
    let a = std::thread::spawn(move || {
        let batches = run::mpi(&algorithms, 0, first, ops[0]);
        (algorithms, batches)
    });
    let b = std::thread::spawn(move || {
        let batches = run::mpi(&native, 1, first, ops[1]);
        (native, batches)
    });
    let h = std::thread::spawn(move || {
        let batches = run::ht(&ht, &dev, 2, first, ops[2]);
        (ht, dev, batches)
    });
    let (algorithms, ba) = a.join().expect("the Mpi (algorithms) thread panicked");
    let (native, bb) = b.join().expect("the Mpi (native) thread panicked");
    let (ht, dev, bh) = h.join().expect("the HostTransfer thread panicked");
    (Comms { algorithms, native, ht, dev }, (ba + bb + bh) * run::BATCH)
}

/// The pool's counters and the operations in flight on each communicator, once they are idle
/// or after 10 s: the proxy thread takes back an operation's flags right after its stream's
/// last copy, and an operation that copies nothing back (a bcast at its root) releases the
/// stream before its MPI part is through.
fn settled(c: &Comms) -> (PoolStats, [usize; 3]) {
    let start = Instant::now();
    loop {
        let s = c.ht.pool_stats();
        let flight = [c.algorithms.ops_in_flight(), c.native.ops_in_flight(), c.ht.ops_in_flight()];
        // Only the ring (its cells and its movers' arrival words) and its four counters stay
        // lent.
        let idle = s.blocks_in_use == 2 && s.flags_in_use == 4 && flight == [0; 3];
        if idle || start.elapsed().as_secs() >= 10 {
            return (s, flight);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Every communicator is still in step on every rank: an operation on each that runs on
/// Duralumin's own algorithms (their messages carry per-operation tags, which must still agree)
/// gets the right result.
fn in_step(c: &Comms) {
    let (me, n) = (c.native.rank() as u64, c.native.size() as u64);
    let want = vec![n * (n - 1) / 2 + n; 1000];
    // 8000 bytes: the ring, over the low thresholds.
    let mut x: Vec<u64> = vec![me + 1; 1000];
    c.algorithms.allreduce_in_place(&mut x, Sum).expect("allreduce after the soak");
    assert_eq!(x, want, "rank {me}: ring allreduce after the soak");
    // Alltoallv always runs the pairwise exchange.
    let ones = vec![1usize; n as usize];
    let at: Vec<usize> = (0..n as usize).collect();
    let mut got = vec![0u64; n as usize];
    c.native.alltoallv(&vec![me; n as usize], &ones, &at, &mut got, &ones, &at).expect("alltoallv after the soak");
    assert_eq!(got, (0..n).collect::<Vec<_>>(), "rank {me}: alltoallv after the soak");
    let mut buf = c.dev.upload(&vec![me + 1; 1000]).expect("upload");
    c.ht.allreduce_in_place(&mut buf, Sum).expect("HostTransfer allreduce after the soak");
    c.ht.synchronize().expect("synchronize after the soak");
    assert_eq!(c.dev.download(&buf).expect("download"), want, "rank {me}: HostTransfer allreduce after the soak");
}

fn rank_main() {
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let mut algorithms = MpiCommunicator::new(&world).expect("communicator");
    algorithms.set_tuning(
        Tuning::default()
            .with_allreduce_ring_bytes(1024)
            .with_ring_segment_bytes(512)
            .with_reduce_ring_bytes(1024)
            .with_reduce_root_ring_bytes(1024)
            .with_bcast_chain_bytes(1024)
            .with_bcast_chunk_bytes(512)
            .with_max_message_elements(700),
    );
    let native = MpiCommunicator::new(&world).expect("communicator");
    let dev = HostDevice::new(0);
    // Staged (not run on the device buffers directly) in small chunks, so larger operations
    // pipeline through several of the ring's cells.
    let config = HostTransferConfig::default().with_chunk_bytes(4096).with_direct(false);
    let ht = HostTransferCommunicator::with_config(&world, dev.clone(), dev.stream().expect("stream"), config)
        .expect("HostTransfer communicator");
    let me = native.rank();
    mpirun::rank_case::start(me);
    let comms = Comms { algorithms, native, ht, dev };

    let t = Instant::now();
    let (comms, warm) = mpirun::rank_case::within("warm-up", || round(comms, 0, [WARM_UP; 3]));
    let first = WARM_UP.div_ceil(run::BATCH);
    let ((pool0, flight0), rss0) = (settled(&comms), rss());
    let t_warm = t.elapsed();

    let t = Instant::now();
    let (comms, ops) = mpirun::rank_case::within("measured run", || round(comms, first, SHARES));
    let elapsed = t.elapsed();
    let ((pool1, flight1), rss1) = (settled(&comms), rss());
    let pinned = comms.dev.pinned_bytes();
    let growth = rss1 as i64 - rss0 as i64;
    println!(
        "SOAK rank {me}: {ops} operations in {elapsed:.2?} after a warm-up of {warm} in {t_warm:.2?}; \
         RSS {} KiB -> {} KiB ({:+} KiB); in flight {flight0:?} -> {flight1:?}; pool in use {} -> {} bytes, \
         blocks {} -> {}, flags {} -> {}, held {} -> {} bytes, high water {} bytes of a {} byte cap; \
         device pinned {pinned} bytes",
        rss0 >> 10,
        rss1 >> 10,
        growth / 1024,
        pool0.in_use_bytes,
        pool1.in_use_bytes,
        pool0.blocks_in_use,
        pool1.blocks_in_use,
        pool0.flags_in_use,
        pool1.flags_in_use,
        pool0.held_bytes,
        pool1.held_bytes,
        pool1.high_water_bytes,
        pool1.cap_bytes,
    );
    assert!(ops >= OPS, "rank {me}: ran {ops} operations, fewer than {OPS}");
    assert_eq!(flight1, [0; 3], "rank {me}: operations still in flight after the soak");
    assert_eq!(pool1, pool0, "rank {me}: the HostTransfer pool changed between the warm-up and the end");
    assert_eq!(pool1.blocks_in_use, 2, "rank {me}: the HostTransfer pool lends more than the ring: {pool1:?}");
    assert_eq!(pool1.flags_in_use, 4, "rank {me}: the HostTransfer pool still lends flags: {pool1:?}");
    assert_eq!(pool1.high_water_bytes, pool1.in_use_bytes, "rank {me}: pinned memory beyond the ring: {pool1:?}");
    assert!(growth < RSS_LIMIT as i64, "rank {me}: the resident set grew by {growth} bytes during the soak");

    mpirun::rank_case::within("in step after the soak", || in_step(&comms));
    drop(comms);
    assert!(!duralumin::progress_thread_running(), "rank {me}: the progress thread outlived every communicator");
    println!("SOAK rank {me}: ok");
}
