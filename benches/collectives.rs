//! Collective benchmark: Duralumin against the native rsmpi/MPI call, measured in the same run.
//!
//! `cargo bench --bench collectives [-- --np 2,4 --op allreduce --max-bytes N --csv FILE]`
//! relaunches itself under `mpirun` for each rank count. For every operation and size it
//! prints OSU-style average latency (µs, the slowest rank's), nccl-tests-style algorithm and
//! bus bandwidth (GB/s), blocking and non-blocking, next to the native baseline and the
//! ratio, then checks the project's performance targets. Sizes are the largest buffer of the
//! operation (nccl-tests' convention), in f32 elements.

#[path = "common/relaunch.rs"]
mod relaunch;

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::Instant;

use duralumin::mpi::collective::SystemOperation;
use duralumin::mpi::datatype::{Partition, PartitionMut};
use duralumin::mpi::topology::{Communicator as _, SimpleCommunicator};
use duralumin::mpi::traits::*;
use duralumin::{AllreduceAlgorithm, BcastAlgorithm, MpiCommunicator, ReduceOp, Sum, bytemuck};
use relaunch::relaunch;

/// Timed rounds per measurement (the median is reported).
const ROUNDS: usize = 5;

const SIZES: [usize; 9] = [4, 64, 1 << 10, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

fn sizes(max: usize) -> impl Iterator<Item = usize> {
    SIZES.into_iter().filter(move |&s| s <= max)
}

#[derive(Clone, Debug)]
struct Row {
    np: usize,
    op: String,
    bytes: usize,
    mode: &'static str,
    ours_us: f64,
    native_us: Option<f64>,
    busbw_factor: f64,
}

impl Row {
    fn algbw(&self) -> f64 {
        self.bytes as f64 / (self.ours_us * 1e3)
    }
    fn ratio(&self) -> Option<f64> {
        self.native_us.map(|n| self.ours_us / n)
    }
}

fn main() {
    if std::env::var("DURALUMIN_BENCH_RANK").is_ok() {
        rank_main();
        return;
    }
    let get = relaunch::flag;
    let nps = relaunch::rank_counts("2,4");
    let csv = get("--csv").unwrap_or_else(|| "target/bench-collectives.csv".into());
    let _ = std::fs::remove_file(&csv);
    let env = [
        ("DURALUMIN_BENCH_OP", get("--op").unwrap_or_default()),
        ("DURALUMIN_BENCH_MAX", get("--max-bytes").unwrap_or_else(|| (64usize << 20).to_string())),
        ("DURALUMIN_BENCH_CSV", csv.clone()),
        ("DURALUMIN_TUNING", std::env::var("DURALUMIN_TUNING").unwrap_or_default()),
    ];
    let op = get("--op").unwrap_or_default();
    for np in nps {
        relaunch(np, &env, &[]);
        // The HostTransfer rows once more, with the ranks' other idle setting: each hand-off
        // between threads costs a trip through the scheduler where ranks yield when idle.
        if "ht".starts_with(&op) || op.starts_with("ht") {
            let other = if relaunch::yields_when_idle(np) { "0" } else { "1" };
            let mut ht: Vec<_> = env.to_vec();
            for (key, value) in &mut ht {
                match *key {
                    "DURALUMIN_BENCH_OP" => *value = "ht".into(),
                    "DURALUMIN_BENCH_CSV" => *value = format!("{csv}.yield{other}"),
                    _ => {}
                }
            }
            ht.push(("OMPI_MCA_mpi_yield_when_idle", other.into()));
            relaunch(np, &ht, &[]);
        }
    }
    println!("CSV written to {csv}");
}

struct Bench<'a> {
    comm: &'a MpiCommunicator,
    world: &'a SimpleCommunicator,
    filter: String,
    max_bytes: usize,
    rows: Vec<Row>,
}

impl Bench<'_> {
    fn wanted(&self, op: &str) -> bool {
        self.filter.is_empty() || op.starts_with(&self.filter)
    }

    fn iters(bytes: usize) -> usize {
        ((256usize << 20) / bytes.max(1)).clamp(ROUNDS, 5000)
    }

    /// Average time of `f` in µs on the slowest rank: the median of [`ROUNDS`] timed rounds,
    /// each started together after a barrier, so a round disturbed by the scheduler (4 ranks
    /// share 2 cores here) does not decide the result.
    fn time(&self, bytes: usize, mut f: impl FnMut()) -> f64 {
        let iters = Self::iters(bytes).div_ceil(ROUNDS);
        for _ in 0..iters.clamp(2, 20) {
            f();
        }
        let mut rounds = [0.0f64; ROUNDS];
        for r in &mut rounds {
            self.world.barrier();
            let t = Instant::now();
            for _ in 0..iters {
                f();
            }
            let mine = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
            self.world.all_reduce_into(&mine, r, SystemOperation::max());
        }
        rounds.sort_by(f64::total_cmp);
        rounds[ROUNDS / 2]
    }

    fn push(&mut self, op: &str, bytes: usize, mode: &'static str, ours: f64, native: Option<f64>, factor: f64) {
        let row = Row {
            np: self.comm.size(),
            op: op.to_string(),
            bytes,
            mode,
            ours_us: ours,
            native_us: native,
            busbw_factor: factor,
        };
        if self.comm.rank() == 0 {
            print_row(&row);
        }
        self.rows.push(row);
    }
}

fn print_header() {
    println!(
        "{:<28} {:>10} {:<11} {:>12} {:>12} {:>7} {:>9} {:>9}",
        "op", "bytes", "mode", "duralumin_us", "native_us", "ratio", "algbw", "busbw"
    );
}

fn print_row(r: &Row) {
    let native = r.native_us.map_or("-".to_string(), |n| format!("{n:.2}"));
    let ratio = r.ratio().map_or("-".to_string(), |x| format!("{x:.2}"));
    println!(
        "{:<28} {:>10} {:<11} {:>12.2} {:>12} {:>7} {:>9.3} {:>9.3}",
        r.op,
        r.bytes,
        r.mode,
        r.ours_us,
        native,
        ratio,
        r.algbw(),
        r.algbw() * r.busbw_factor
    );
}

fn rank_main() {
    let universe = duralumin::init().expect("init");
    let world = universe.world();
    let mut comm = MpiCommunicator::new(&world).expect("communicator");
    comm.set_tuning(tuning_from_env(comm.tuning()));
    let mut b = Bench {
        comm: &comm,
        world: &world,
        filter: std::env::var("DURALUMIN_BENCH_OP").unwrap_or_default(),
        max_bytes: std::env::var("DURALUMIN_BENCH_MAX").ok().and_then(|s| s.parse().ok()).unwrap_or(64 << 20),
        rows: Vec::new(),
    };
    if comm.rank() == 0 {
        let yields = std::env::var("OMPI_MCA_mpi_yield_when_idle").unwrap_or_else(|_| "unset".into());
        println!("\n== np = {}, OMPI_MCA_mpi_yield_when_idle={yields} ==", comm.size());
        print_header();
    }
    let idle_before = small_allreduce(&b);
    allreduce_rows(&mut b);
    reduction_rows(&mut b);
    movement_rows(&mut b);
    p2p_rows(&mut b);
    custom_op_rows(&mut b);
    host_transfer_rows(&mut b);
    let reliability = reliability_rows(&mut b);
    // The progress thread exists now (non-blocking rows started it) and must cost nothing
    // while idle.
    let idle_after = small_allreduce(&b);
    if comm.rank() == 0 {
        targets(&b.rows, idle_before, idle_after, comm.size());
        if let Some(r) = reliability {
            reliability_targets(&r);
        }
        write_csv(&b.rows);
        write_plot(&b.rows, comm.size());
    }
}

/// Bus bandwidth against size for the blocking rows, Duralumin's and MPI's own per operation,
/// beside the CSV (`-np<N>.svg`; `docs/perf.md`).
fn write_plot(rows: &[Row], np: usize) {
    use duralumin_perf::plot::{plot, push_to};
    let csv = std::env::var("DURALUMIN_BENCH_CSV").unwrap_or_else(|_| "target/bench-collectives.csv".into());
    let path = format!("{}-np{np}.svg", csv.trim_end_matches(".csv"));
    let mut series = Vec::new();
    for r in rows.iter().filter(|r| r.mode == "blocking") {
        push_to(&mut series, r.op.clone(), r.bytes, r.algbw() * r.busbw_factor);
        if let Some(n) = r.native_us {
            push_to(&mut series, format!("{} native", r.op), r.bytes, r.bytes as f64 / (n * 1e3) * r.busbw_factor);
        }
    }
    match plot(std::path::Path::new(&path), &format!("collectives, {np} ranks (blocking)"), &series) {
        Ok(()) => println!("plot written to {path}"),
        Err(e) => println!("no plot: {e}"),
    }
}

/// `DURALUMIN_TUNING="allreduce_ring_bytes=N,ring_segment_bytes=N,bcast_chain_bytes=N,bcast_chunk_bytes=N"`
/// overrides the defaults, to explore thresholds without rebuilding.
fn tuning_from_env(mut t: duralumin::Tuning) -> duralumin::Tuning {
    let spec = std::env::var("DURALUMIN_TUNING").unwrap_or_default();
    for kv in spec.split(',').filter(|s| !s.is_empty()) {
        let Some((k, v)) = kv.split_once('=') else { continue };
        let Ok(v) = v.parse::<usize>() else { continue };
        match k {
            "allreduce_ring_bytes" => t.allreduce_ring_bytes = v,
            "ring_segment_bytes" => t.ring_segment_bytes = v,
            "reduce_ring_bytes" => t.reduce_ring_bytes = v,
            "reduce_root_ring_bytes" => t.reduce_root_ring_bytes = v,
            "bcast_chain_bytes" => t.bcast_chain_bytes = v,
            "bcast_chunk_bytes" => t.bcast_chunk_bytes = v,
            _ => eprintln!("unknown tuning key {k}"),
        }
    }
    t
}

/// The 1-element allreduce's time over MPI's own, timed in alternating pairs (the median of
/// [`PAIRS`] per-pair ratios): the machine's state drifts between two moments of a run (MPI's own
/// 1-element allreduce reads anywhere from 0.75 to 1.3 µs here), and within a pair it cancels.
fn small_allreduce(b: &Bench) -> f64 {
    let send = [1.0f32];
    let mut recv = [0.0f32];
    let mut ratios: Vec<f64> = (0..PAIRS)
        .map(|_| {
            let ours = b.time(4, || b.comm.allreduce(&send, &mut recv, Sum).unwrap());
            let native = b.time(4, || b.world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum()));
            ours / native
        })
        .collect();
    ratios.sort_by(f64::total_cmp);
    ratios[PAIRS / 2]
}

/// Alternating pairs in [`small_allreduce`].
const PAIRS: usize = 9;

/// What the reliability machinery costs a blocking 8-byte allreduce: µs over the native call,
/// each the median of [`PAIRS`] alternating pairs with it.
struct ReliabilityCost {
    /// Deadline (the 10-minute default), watchdog, sequence numbers, flight recorder.
    monitored: f64,
    /// The same with the deadline off (numbers and recorder only).
    no_deadline: f64,
    /// With the signature check (`DURALUMIN_CHECK=1`).
    checked: f64,
    native: f64,
}

/// `f`'s time against the native 8-byte allreduce in alternating pairs: the medians of `f`'s
/// time, and of its excess over native.
fn paired_8b(b: &Bench, mut f: impl FnMut()) -> (f64, f64, f64) {
    let send = [1.0f32; 2];
    let mut recv = [0.0f32; 2];
    let mut pairs: Vec<(f64, f64)> = (0..PAIRS)
        .map(|_| {
            let ours = b.time(8, &mut f);
            let native = b.time(8, || b.world.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum()));
            (ours, native)
        })
        .collect();
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let mut ours: Vec<f64> = pairs.iter().map(|p| p.0).collect();
    let mut native: Vec<f64> = pairs.iter().map(|p| p.1).collect();
    let mut over: Vec<f64> = pairs.drain(..).map(|(o, n)| o - n).collect();
    (median(&mut ours), median(&mut native), median(&mut over))
}

fn reliability_rows(b: &mut Bench) -> Option<ReliabilityCost> {
    if !b.wanted("reliability") {
        return None;
    }
    let mut no_deadline = b.comm.dup().expect("dup");
    no_deadline.set_timeout(None);
    let mut checked = b.comm.dup().expect("dup");
    checked.set_check(true);
    let send = [1.0f32; 2];
    let mut recv = [0.0f32; 2];
    let default = b.comm;
    let mut run = |label: &str, comm: &MpiCommunicator| {
        let (ours, native, over) = paired_8b(b, || comm.allreduce(&send, &mut recv, Sum).unwrap());
        b.push(&format!("reliability/{label}"), 8, "blocking", ours, Some(native), 1.0);
        (over, native)
    };
    let (monitored, native) = run("monitored", default);
    let (no_deadline, _) = run("no-deadline", &no_deadline);
    let (checked, _) = run("check-mode", &checked);
    Some(ReliabilityCost { monitored, no_deadline, checked, native })
}

fn reliability_targets(r: &ReliabilityCost) {
    println!("\n-- reliability cost, blocking 8-byte allreduce (median of {PAIRS} pairs with native) --");
    println!("  native MPI_Allreduce                                   {:>8.3} us", r.native);
    println!("  duralumin, 10 min deadline + watchdog + recorder, over native {:>8.3} us", r.monitored);
    println!("  duralumin, no deadline (numbers + recorder), over native    {:>8.3} us", r.no_deadline);
    println!("  duralumin, signature check mode, over native               {:>8.3} us", r.checked);
    let deadline = r.monitored - r.no_deadline;
    let verdict = if deadline <= 0.1 || deadline <= 0.03 * r.native { "met" } else { "MISSED" };
    println!("  deadline + watchdog cost: {deadline:.3} us (target <= 0.1 us or 3 % of native) {verdict}");
}

fn busbw_allreduce(n: usize) -> f64 {
    2.0 * (n as f64 - 1.0) / n as f64
}

fn allreduce_rows(b: &mut Bench) {
    if !b.wanted("allreduce") {
        return;
    }
    let (c, w, n) = (b.comm, b.world, b.comm.size());
    for bytes in sizes(b.max_bytes) {
        let len = bytes / 4;
        let send: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
        let mut recv = vec![0.0f32; len];
        let native = b.time(bytes, || w.all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum()));
        let native_nb = b.time(bytes, || {
            duralumin::mpi::request::scope(|s| {
                w.immediate_all_reduce_into(s, &send[..], &mut recv[..], SystemOperation::sum()).wait();
            })
        });
        for algorithm in [
            AllreduceAlgorithm::Auto,
            AllreduceAlgorithm::Native,
            AllreduceAlgorithm::Ring,
            AllreduceAlgorithm::RecursiveDoubling,
            AllreduceAlgorithm::Rabenseifner,
            AllreduceAlgorithm::SharedMemory,
        ] {
            let ours = b.time(bytes, || c.allreduce_with(&send, &mut recv, Sum, algorithm).unwrap());
            b.push(&format!("allreduce/{algorithm:?}"), bytes, "blocking", ours, Some(native), busbw_allreduce(n));
        }
        let ours = b.time(bytes, || {
            duralumin::scope(|s| c.iallreduce(s, &send, &mut recv, Sum)?.wait()).unwrap();
        });
        b.push("allreduce/Auto", bytes, "nonblocking", ours, Some(native_nb), busbw_allreduce(n));
    }
}

/// Reduce, reduce-scatter(v): Duralumin's auto path vs rsmpi/MPI.
fn reduction_rows(b: &mut Bench) {
    let (c, w, n) = (b.comm, b.world, b.comm.size());
    let nf = n as f64;
    for bytes in sizes(b.max_bytes) {
        let len = (bytes / 4 / n).max(1) * n;
        let send: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
        let mut recv = vec![0.0f32; len];
        if b.wanted("reduce") {
            let root = w.process_at_rank(0);
            let native = b.time(bytes, || {
                if c.rank() == 0 {
                    root.reduce_into_root(&send[..], &mut recv[..], SystemOperation::sum())
                } else {
                    root.reduce_into(&send[..], SystemOperation::sum())
                }
            });
            let ours = b.time(bytes, || c.reduce(&send, &mut recv, 0, Sum).unwrap());
            b.push("reduce", bytes, "blocking", ours, Some(native), 1.0);
        }
        if b.wanted("reduce_scatter") {
            let block = len / n;
            let native =
                b.time(bytes, || w.reduce_scatter_block_into(&send[..], &mut recv[..block], SystemOperation::sum()));
            let ours = b.time(bytes, || c.reduce_scatter(&send, &mut recv[..block], Sum).unwrap());
            b.push("reduce_scatter", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
            let counts = vec![block; n];
            let ours = b.time(bytes, || c.reduce_scatterv(&send, &mut recv[..block], &counts, Sum).unwrap());
            b.push("reduce_scatterv", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
            let native_nb = b.time(bytes, || {
                duralumin::mpi::request::scope(|s| {
                    w.immediate_reduce_scatter_block_into(s, &send[..], &mut recv[..block], SystemOperation::sum())
                        .wait();
                })
            });
            let ours = b.time(bytes, || {
                duralumin::scope(|s| c.ireduce_scatter(s, &send, &mut recv[..block], Sum)?.wait()).unwrap()
            });
            b.push("reduce_scatter", bytes, "nonblocking", ours, Some(native_nb), (nf - 1.0) / nf);
        }
    }
}

fn movement_rows(b: &mut Bench) {
    let (c, w, n) = (b.comm, b.world, b.comm.size());
    let nf = n as f64;
    let me = c.rank();
    for bytes in sizes(b.max_bytes) {
        let len = (bytes / 4 / n).max(1) * n;
        let block = len / n;
        let all: Vec<f32> = (0..len).map(|i| i as f32).collect();
        let mut out = vec![0.0f32; len];
        let mine = vec![me as f32; block];
        let mut part = vec![0.0f32; block];
        let counts = vec![block; n];
        let displs: Vec<usize> = (0..n).map(|i| i * block).collect();
        let ccounts: Vec<i32> = counts.iter().map(|&x| i32::try_from(x).expect("an MPI count")).collect();
        let cdispls: Vec<i32> = displs.iter().map(|&x| i32::try_from(x).expect("an MPI displacement")).collect();
        let root = w.process_at_rank(0);

        if b.wanted("bcast") {
            let native = b.time(bytes, || root.broadcast_into(&mut out[..]));
            for algorithm in [BcastAlgorithm::Auto, BcastAlgorithm::Native, BcastAlgorithm::Chain] {
                let ours = b.time(bytes, || c.bcast_with(&mut out, 0, algorithm).unwrap());
                b.push(&format!("bcast/{algorithm:?}"), bytes, "blocking", ours, Some(native), 1.0);
            }
            let native_nb = b.time(bytes, || {
                duralumin::mpi::request::scope(|s| {
                    root.immediate_broadcast_into(s, &mut out[..]).wait();
                })
            });
            let ours = b.time(bytes, || duralumin::scope(|s| c.ibcast(s, &mut out, 0)?.wait()).unwrap());
            b.push("bcast/Auto", bytes, "nonblocking", ours, Some(native_nb), 1.0);
        }
        if b.wanted("allgather") {
            let native = b.time(bytes, || w.all_gather_into(&mine[..], &mut out[..]));
            let ours = b.time(bytes, || c.allgather(&mine, &mut out).unwrap());
            b.push("allgather", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
            let native_nb = b.time(bytes, || {
                duralumin::mpi::request::scope(|s| {
                    w.immediate_all_gather_into(s, &mine[..], &mut out[..]).wait();
                })
            });
            let ours = b.time(bytes, || duralumin::scope(|s| c.iallgather(s, &mine, &mut out)?.wait()).unwrap());
            b.push("allgather", bytes, "nonblocking", ours, Some(native_nb), (nf - 1.0) / nf);
            let native = b.time(bytes, || {
                let mut p = PartitionMut::new(&mut out[..], &ccounts[..], &cdispls[..]);
                w.all_gather_varcount_into(&mine[..], &mut p)
            });
            let ours = b.time(bytes, || c.allgatherv(&mine, &mut out, &counts, &displs).unwrap());
            b.push("allgatherv", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
        }
        if b.wanted("alltoall") {
            let native = b.time(bytes, || w.all_to_all_into(&all[..], &mut out[..]));
            let ours = b.time(bytes, || c.alltoall(&all, &mut out).unwrap());
            b.push("alltoall", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
            let native_nb = b.time(bytes, || {
                duralumin::mpi::request::scope(|s| {
                    w.immediate_all_to_all_into(s, &all[..], &mut out[..]).wait();
                })
            });
            let ours = b.time(bytes, || duralumin::scope(|s| c.ialltoall(s, &all, &mut out)?.wait()).unwrap());
            b.push("alltoall", bytes, "nonblocking", ours, Some(native_nb), (nf - 1.0) / nf);
            let native = b.time(bytes, || {
                let sp = Partition::new(&all[..], &ccounts[..], &cdispls[..]);
                let mut rp = PartitionMut::new(&mut out[..], &ccounts[..], &cdispls[..]);
                w.all_to_all_varcount_into(&sp, &mut rp)
            });
            let ours = b.time(bytes, || c.alltoallv(&all, &counts, &displs, &mut out, &counts, &displs).unwrap());
            b.push("alltoallv", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
        }
        if b.wanted("gather") {
            let native = b.time(bytes, || {
                if me == 0 { root.gather_into_root(&mine[..], &mut out[..]) } else { root.gather_into(&mine[..]) }
            });
            let ours = b.time(bytes, || c.gather(&mine, &mut out, 0).unwrap());
            b.push("gather", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
            let native = b.time(bytes, || {
                if me == 0 {
                    let mut p = PartitionMut::new(&mut out[..], &ccounts[..], &cdispls[..]);
                    root.gather_varcount_into_root(&mine[..], &mut p)
                } else {
                    root.gather_varcount_into(&mine[..])
                }
            });
            let ours = b.time(bytes, || c.gatherv(&mine, &mut out, &counts, &displs, 0).unwrap());
            b.push("gatherv", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
        }
        if b.wanted("scatter") {
            let native = b.time(bytes, || {
                if me == 0 { root.scatter_into_root(&all[..], &mut part[..]) } else { root.scatter_into(&mut part[..]) }
            });
            let ours = b.time(bytes, || c.scatter(&all, &mut part, 0).unwrap());
            b.push("scatter", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
            let native = b.time(bytes, || {
                if me == 0 {
                    let p = Partition::new(&all[..], &ccounts[..], &cdispls[..]);
                    root.scatter_varcount_into_root(&p, &mut part[..])
                } else {
                    root.scatter_varcount_into(&mut part[..])
                }
            });
            let ours = b.time(bytes, || c.scatterv(&all, &counts, &displs, &mut part, 0).unwrap());
            b.push("scatterv", bytes, "blocking", ours, Some(native), (nf - 1.0) / nf);
        }
    }
    if b.wanted("barrier") {
        let native = b.time(0, || w.barrier());
        let ours = b.time(0, || c.barrier().unwrap());
        b.push("barrier", 0, "blocking", ours, Some(native), 0.0);
        let native_nb = b.time(0, || w.immediate_barrier().wait_without_status());
        let ours = b.time(0, || duralumin::scope(|s| c.ibarrier(s)?.wait()).unwrap());
        b.push("barrier", 0, "nonblocking", ours, Some(native_nb), 0.0);
    }
}

fn p2p_rows(b: &mut Bench) {
    let (c, w, n) = (b.comm, b.world, b.comm.size());
    let me = c.rank();
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    for bytes in sizes(b.max_bytes) {
        let len = bytes / 4;
        let send = vec![me as f32; len];
        let mut recv = vec![0.0f32; len];
        if b.wanted("sendrecv") {
            let rank = |r: usize| w.process_at_rank(i32::try_from(r).expect("an MPI rank"));
            let (rp, lp) = (rank(right), rank(left));
            let native = b.time(bytes, || {
                duralumin::mpi::point_to_point::send_receive_into(&send[..], &rp, &mut recv[..], &lp);
            });
            let ours = b.time(bytes, || c.sendrecv(&send, right, &mut recv, left, 0).unwrap());
            b.push("sendrecv", bytes, "blocking", ours, Some(native), 1.0);
            let ours = b.time(bytes, || {
                duralumin::scope(|s| {
                    let r = c.irecv(s, &mut recv, left, 0)?;
                    let q = c.isend(s, &send, right, 0)?;
                    duralumin::Request::wait_all([r, q])
                })
                .unwrap()
            });
            b.push("isend+irecv", bytes, "nonblocking", ours, Some(native), 1.0);
            let sends: Vec<(&[f32], usize)> = vec![(&send[..], right), (&send[..], left)];
            let mut r2 = vec![0.0f32; len];
            let ours = b.time(bytes, || {
                let mut recvs: Vec<(&mut [f32], usize)> = vec![(&mut recv[..], left), (&mut r2[..], right)];
                c.multi_sendrecv(&sends, &mut recvs, 0).unwrap()
            });
            b.push("multi_sendrecv(2 peers)", bytes, "blocking", ours, None, 2.0);
        }
    }
}

/// A user element and operator against the builtin of the same byte size.
#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Complex {
    re: f32,
    im: f32,
}

impl duralumin::Element for Complex {
    const NAME: &'static str = "c32";
}

#[derive(Clone, Copy, Debug, Default)]
struct ComplexSum;

impl ReduceOp<Complex> for ComplexSum {
    const NAME: &'static str = "csum";
    fn combine(a: Complex, b: Complex) -> Complex {
        Complex { re: a.re + b.re, im: a.im + b.im }
    }
}

fn custom_op_rows(b: &mut Bench) {
    if !b.wanted("custom") {
        return;
    }
    let (c, n) = (b.comm, b.comm.size());
    for bytes in sizes(b.max_bytes).filter(|&s| s >= 8) {
        let len = bytes / 8;
        let send: Vec<Complex> = (0..len).map(|i| Complex { re: i as f32, im: 1.0 }).collect();
        let mut recv = send.clone();
        let fsend: Vec<f64> = (0..len).map(|i| i as f64).collect();
        let mut frecv = fsend.clone();
        let builtin = b.time(bytes, || c.allreduce(&fsend, &mut frecv, Sum).unwrap());
        let ours = b.time(bytes, || c.allreduce(&send, &mut recv, ComplexSum).unwrap());
        b.push("allreduce/custom-vs-f64-sum", bytes, "blocking", ours, Some(builtin), busbw_allreduce(n));
    }
}

/// HostTransfer on the host device against the Mpi backend: direct on the device memory (the
/// host device's default: the stream machinery's overhead alone), staged in pipelined chunks
/// (what a GPU does) as one mover and item by item on the copy streams, and staged whole
/// (Aluminum's method); and the host thread's enqueue time per pipelined operation; and
/// alltoallv staged in chunks.
fn host_transfer_rows(b: &mut Bench) {
    use duralumin::device::cpu::HostDevice;
    use duralumin::{HostTransferCommunicator, HostTransferConfig};
    if !b.wanted("ht") {
        return;
    }
    let (c, n) = (b.comm, b.comm.size());
    let dev = HostDevice::new(0);
    let comm = |config| {
        HostTransferCommunicator::with_config(b.world, dev.clone(), dev.stream().expect("stream"), config)
            .expect("comm")
    };
    let direct = comm(HostTransferConfig::default());
    let pipelined = comm(HostTransferConfig::default().with_direct(false));
    // The same chunks queued item by item on the two copy streams instead of as one mover.
    let copies = comm(HostTransferConfig::default().with_direct(false).with_mover_min_chunks(Some(usize::MAX)));
    // Aluminum's method: the whole buffer staged at once (one chunk, a ring of two).
    let whole = HostTransferConfig::default().with_direct(false).with_pipeline_chunks(1).with_ring_cells(2);
    let unpipelined = comm(whole.with_chunk_bytes(b.max_bytes.max(4)));
    for bytes in sizes(b.max_bytes) {
        let len = bytes / 4;
        let host: Vec<f32> = (0..len).map(|i| (i % 7) as f32).collect();
        let mut recv = vec![0.0f32; len];
        let send = dev.upload(&host).expect("upload");
        let mut out = dev.alloc_zeroed::<f32>(len).expect("alloc");
        let mpi = b.time(bytes, || c.allreduce(&host, &mut recv, Sum).unwrap());
        for (name, ht) in [
            ("ht-allreduce", &direct),
            ("ht-allreduce/staged", &pipelined),
            ("ht-allreduce/staged-copies", &copies),
            ("ht-allreduce/unpipelined", &unpipelined),
        ] {
            let ours = b.time(bytes, || {
                ht.allreduce(&send, &mut out, Sum).unwrap();
                ht.synchronize().unwrap();
            });
            b.push(name, bytes, "stream", ours, Some(mpi), busbw_allreduce(n));
        }
        // Eight allreduces queued back to back, then one synchronize: they stream through the
        // ring one after the other. Time per operation.
        let ours = b.time(8 * bytes, || {
            for _ in 0..8 {
                pipelined.allreduce(&send, &mut out, Sum).unwrap();
            }
            pipelined.synchronize().unwrap();
        }) / 8.0;
        b.push("ht-allreduce/queued8", bytes, "stream", ours, Some(mpi), busbw_allreduce(n));
        // Host-thread cost of queueing one operation (the stream and proxy run it meanwhile):
        // the median and the slowest call, the slowest rank's.
        // `idle`: after 1 ms asleep, by when the proxy and executor threads sleep too, so the
        // call wakes them from cold caches, as one after a large operation does (see
        // `docs/host_transfer.md`, "What an enqueue costs").
        let iters = Bench::iters(bytes).clamp(10, 200);
        for (name, ht, idle) in [
            ("ht-allreduce/enqueue", &pipelined, false),
            ("ht-allreduce/enqueue-copies", &copies, false),
            ("ht-allreduce/enqueue-direct", &direct, false),
            ("ht-allreduce/enqueue-idle", &pipelined, true),
        ] {
            let mut enqueue = Vec::with_capacity(iters);
            for _ in 0..iters {
                if idle {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                let t = Instant::now();
                ht.allreduce(&send, &mut out, Sum).unwrap();
                enqueue.push(t.elapsed().as_secs_f64() * 1e6);
                ht.synchronize().unwrap();
            }
            enqueue.sort_by(f64::total_cmp);
            let (p50, max) = (enqueue[iters / 2], enqueue[iters - 1]);
            let mut worst = [0.0f64; 2];
            b.world.all_reduce_into(&[p50, max][..], &mut worst[..], SystemOperation::max());
            b.push(&format!("{name}-p50"), bytes, "host", worst[0], None, 0.0);
            b.push(&format!("{name}-max"), bytes, "host", worst[1], None, 0.0);
        }
    }
    // V-collectives staged in chunks (their blocks cut and packed per chunk, the chunks sent as
    // point-to-point messages): alltoallv with uneven blocks, against the Mpi backend's.
    let me = c.rank();
    for bytes in sizes(b.max_bytes).filter(|&s| s >= 4 * n) {
        let base = bytes / 4 / n;
        let sc: Vec<usize> = (0..n).map(|j| base + (me + j) % 2).collect();
        let rc: Vec<usize> = (0..n).map(|i| base + (i + me) % 2).collect();
        let displs = |x: &[usize]| x.iter().scan(0, |a, &y| Some(std::mem::replace(a, *a + y))).collect::<Vec<_>>();
        let (sd, rd) = (displs(&sc), displs(&rc));
        let host: Vec<f32> = vec![1.0; sc.iter().sum()];
        let mut recv = vec![0.0f32; rc.iter().sum()];
        let send = dev.upload(&host).expect("upload");
        let mut out = dev.alloc_zeroed::<f32>(recv.len()).expect("alloc");
        let mpi = b.time(bytes, || c.alltoallv(&host, &sc, &sd, &mut recv, &rc, &rd).unwrap());
        let ours = b.time(bytes, || {
            pipelined.alltoallv(&send, &sc, &sd, &mut out, &rc, &rd).unwrap();
            pipelined.synchronize().unwrap();
        });
        b.push("ht-alltoallv/staged", bytes, "stream", ours, Some(mpi), (n - 1) as f64 / n as f64);
    }
    if c.rank() == 0 {
        let stats = pipelined.pool_stats();
        println!(
            "(info) pinned staging after messages up to {} bytes: {} bytes held, high-water mark {} (the ring, taken at creation); {} bytes whole-buffer",
            b.max_bytes,
            stats.held_bytes,
            stats.high_water_bytes,
            unpipelined.pool_stats().high_water_bytes
        );
    }
}

fn find<'a>(rows: &'a [Row], op: &str, bytes: usize, mode: &str) -> Option<&'a Row> {
    rows.iter().find(|r| r.op == op && r.bytes == bytes && r.mode == mode)
}

fn targets(rows: &[Row], idle_before: f64, idle_after: f64, n: usize) {
    let mut out = String::new();
    let mut check = |what: &str, value: Option<f64>, limit: f64| {
        if let Some(v) = value {
            let verdict = if v <= limit { "met" } else { "MISSED" };
            let _ = writeln!(out, "  {what:<64} {v:>8.3} (target <= {limit}) {verdict}");
        }
    };
    let ratio = |op: &str, bytes: usize, mode: &str| find(rows, op, bytes, mode).and_then(Row::ratio);
    let small: Vec<f64> = [4usize, 64, 1024]
        .iter()
        .filter_map(|&s| find(rows, "allreduce/Auto", s, "blocking").and_then(|r| r.native_us.map(|nv| r.ours_us - nv)))
        .collect();
    check(
        "blocking allreduce, small messages (4 B..1 KiB): us over native (max)",
        small.iter().cloned().reduce(f64::max),
        0.2,
    );
    let large: Vec<f64> = [16usize << 10, 256 << 10, 1 << 20, 4 << 20]
        .iter()
        .filter_map(|&s| ratio("allreduce/Auto", s, "blocking"))
        .collect();
    check("blocking allreduce 16 KiB..4 MiB: ratio to native (max)", large.iter().cloned().reduce(f64::max), 1.05);
    if n == 2 {
        check("auto allreduce 64 MiB, np=2: ratio to native", ratio("allreduce/Auto", 64 << 20, "blocking"), 0.5);
    }
    if n == 4 {
        check("chain bcast 64 MiB, np=4: ratio to native", ratio("bcast/Chain", 64 << 20, "blocking"), 0.67);
    }
    let nb = find(rows, "allreduce/Auto", 4, "nonblocking").map(|r| r.ours_us);
    let bl = find(rows, "allreduce/Auto", 4, "blocking").map(|r| r.ours_us);
    check("non-blocking 1-element allreduce: ratio to blocking", nb.zip(bl).map(|(a, b)| a / b), 3.0);
    let custom: Vec<f64> =
        rows.iter().filter(|r| r.op == "allreduce/custom-vs-f64-sum").filter_map(Row::ratio).collect();
    check(
        "custom-op allreduce: ratio to builtin of the same byte size (max)",
        custom.iter().cloned().reduce(f64::max),
        1.2,
    );
    check("HostTransfer<host> allreduce 4 B: ratio to the Mpi backend", ratio("ht-allreduce", 4, "stream"), 2.0);
    check(
        "HostTransfer<host> allreduce 64 MiB: ratio to the Mpi backend",
        ratio("ht-allreduce", 64 << 20, "stream"),
        1.1,
    );
    let enqueue = |op: &str| rows.iter().filter(|r| r.op == op).map(|r| r.ours_us).reduce(f64::max);
    check("HostTransfer<host> staged enqueue p50, us (max over sizes)", enqueue("ht-allreduce/enqueue-p50"), 10.0);
    check(
        "HostTransfer<host> direct enqueue p50, us (max over sizes)",
        enqueue("ht-allreduce/enqueue-direct-p50"),
        10.0,
    );
    let pipe = find(rows, "ht-allreduce/staged", 64 << 20, "stream").map(|r| r.ours_us);
    let whole = find(rows, "ht-allreduce/unpipelined", 64 << 20, "stream").map(|r| r.ours_us);
    if n == 2 {
        check("1-element allreduce with an idle progress thread: ratio to none", Some(idle_after / idle_before), 1.1);
    } else {
        let _ = writeln!(
            out,
            "  (info) 1-element allreduce, idle progress thread vs none: {:.3}",
            idle_after / idle_before
        );
    }
    if let Some((p, w)) = pipe.zip(whole) {
        let _ = writeln!(
            out,
            "  (info) HostTransfer<host> 64 MiB allreduce, pipelined / whole-buffer staging: {:.3}",
            p / w
        );
    }
    if let Some(idle) = enqueue("ht-allreduce/enqueue-idle-p50") {
        let _ = writeln!(
            out,
            "  (info) HostTransfer<host> staged enqueue p50 after 1 ms idle, us (max over sizes): {idle:.3}"
        );
    }
    println!("\n-- targets, np = {n} --\n{out}");
}

fn write_csv(rows: &[Row]) {
    let path = std::env::var("DURALUMIN_BENCH_CSV").unwrap_or_else(|_| "target/bench-collectives.csv".into());
    let new = !std::path::Path::new(&path).exists();
    let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&path) else { return };
    if new {
        let _ = writeln!(f, "np,op,bytes,mode,duralumin_us,native_us,ratio,algbw_gbs,busbw_gbs");
    }
    for r in rows {
        let _ = writeln!(
            f,
            "{},{},{},{},{:.3},{},{},{:.4},{:.4}",
            r.np,
            r.op,
            r.bytes,
            r.mode,
            r.ours_us,
            r.native_us.map_or(String::new(), |v| format!("{v:.3}")),
            r.ratio().map_or(String::new(), |v| format!("{v:.4}")),
            r.algbw(),
            r.algbw() * r.busbw_factor
        );
    }
}
