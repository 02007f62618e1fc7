//! Algorithm sweep by topology: for each operation and size, every algorithm and the native MPI
//! call, timed in one run, with the one `Auto` picks marked.
//!
//! `cargo bench --bench topology [-- --np 4 --op allreduce,bcast --min-bytes N --max-bytes N]` relaunches
//! itself under `mpirun` (or `DURALUMIN_MPIRUN`, e.g. `scripts/cluster-mpirun` with
//! `DURALUMIN_CLUSTER=2x2` for two simulated hosts of two ranks: see `docs/cluster.md`). Times
//! are the slowest rank's median per call over 5 rounds, in µs; each round times every variant
//! of a point once, in turn. Then it checks the targets of
//! `docs/topology.md`: `Auto` within 10 % of the best at every point, and on several nodes the
//! hierarchical allreduce and broadcast against the flat ones at 64 MiB. It reports, never
//! fails, on a missed target.

#[path = "common/relaunch.rs"]
mod relaunch;
#[path = "common/timing.rs"]
mod timing;

use std::fmt::Write as _;

use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::{AllreduceAlgorithm, BcastAlgorithm, MpiCommunicator, Sum, Tuning, WindowStores};

const SIZES: [usize; 9] = [4 << 10, 16 << 10, 32 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];
const ROUNDS: usize = 5;

fn main() {
    if std::env::var("DURALUMIN_BENCH_RANK").is_ok() {
        rank_main();
        return;
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    for np in relaunch::rank_counts("4") {
        relaunch::relaunch(np, &[], &args);
    }
}

/// One measured point: the time of every variant, and which one `Auto` runs.
struct Point {
    op: &'static str,
    bytes: usize,
    times: Vec<(String, f64)>,
    auto: String,
}

impl Point {
    fn best(&self) -> (&str, f64) {
        self.times
            .iter()
            .filter(|(name, _)| name != "auto")
            .map(|(n, t)| (n.as_str(), *t))
            .fold(("", f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a })
    }
    fn time(&self, name: &str) -> Option<f64> {
        self.times.iter().find(|(n, _)| n == name).map(|&(_, t)| t)
    }
}

struct Bench<'a> {
    comm: &'a mut MpiCommunicator,
    world: &'a SimpleCommunicator,
    points: Vec<Point>,
}

impl Bench<'_> {
    /// The slowest rank's median µs per call of each variant `i < tunings.len()` (`f(comm, i)`,
    /// run under `tunings[i]`, for the operations whose path the thresholds choose). The rounds
    /// take the variants in turn, so that a slow stretch of the machine (a rank descheduled, the
    /// links' kernel work) falls on all of them alike rather than on one variant's rounds.
    fn time(&mut self, bytes: usize, tunings: &[Tuning], mut f: impl FnMut(&MpiCommunicator, usize)) -> Vec<f64> {
        // Enough calls per round that a small point is not one descheduling away from another.
        let reps = ((8 << 20) / bytes.max(1)).clamp(1, 400);
        let saved = self.comm.tuning();
        let mut t = vec![Vec::with_capacity(ROUNDS); tunings.len()];
        // Round 0 warms every variant up (its transports, windows and pools).
        for round in 0..=ROUNDS {
            for (i, &tuning) in tunings.iter().enumerate() {
                self.comm.set_tuning(tuning);
                let comm = &*self.comm;
                // One untimed call first: the variant run right after another kind of algorithm
                // finds the caches and the window in that one's state (without it, the same
                // shared-memory path read 10-25 % slower in the column after another algorithm's).
                f(comm, i);
                if round > 0 {
                    t[i].push(timing::time_us(self.world, reps, || f(comm, i), || ()));
                }
            }
        }
        self.comm.set_tuning(saved);
        t.into_iter()
            .map(|mut v| {
                v.sort_by(f64::total_cmp);
                v[ROUNDS / 2]
            })
            .collect()
    }
}

fn rank_main() {
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let mut comm = MpiCommunicator::new(&world).expect("communicator");
    let get = relaunch::flag;
    let min_bytes: usize = get("--min-bytes").and_then(|s| s.parse().ok()).unwrap_or(0);
    let max_bytes: usize = get("--max-bytes").and_then(|s| s.parse().ok()).unwrap_or(64 << 20);
    let ops = get("--op").unwrap_or_else(|| "allreduce,bcast,reduce_scatter,allgather".into());
    let shape = comm.topology().shape();
    let me = comm.rank();
    if me == 0 {
        println!(
            "\n== np {}: {} node(s), {}..{} ranks per node ==",
            comm.size(),
            shape.nodes,
            shape.min_per_node,
            shape.max_per_node
        );
    }
    let mut b = Bench { comm: &mut comm, world: &world, points: Vec::new() };
    for bytes in SIZES.into_iter().filter(|&s| (min_bytes..=max_bytes).contains(&s)) {
        for op in ops.split(',') {
            match op {
                "allreduce" => allreduce(&mut b, bytes),
                "bcast" => bcast(&mut b, bytes),
                "reduce_scatter" => reduce_scatter(&mut b, bytes),
                "allgather" => allgather(&mut b, bytes),
                other => panic!("unknown --op {other}"),
            }
        }
    }
    if me == 0 {
        report(&b.points, shape.single_node());
        plot_points(&b.points, comm.size());
    }
}

fn allreduce(b: &mut Bench, bytes: usize) {
    let len = bytes / 4;
    let send = vec![1.0f32; len];
    let mut recv = vec![0.0f32; len];
    // The shared-memory window needs every rank on one node.
    let single = b.comm.topology().shape().single_node();
    let algorithms: Vec<AllreduceAlgorithm> = [
        AllreduceAlgorithm::Native,
        AllreduceAlgorithm::Ring,
        AllreduceAlgorithm::RecursiveDoubling,
        AllreduceAlgorithm::Rabenseifner,
        AllreduceAlgorithm::Hierarchical,
        AllreduceAlgorithm::SharedMemory,
        AllreduceAlgorithm::Auto,
    ]
    .into_iter()
    .filter(|&a| single || a != AllreduceAlgorithm::SharedMemory)
    .collect();
    let base = b.comm.tuning();
    let mut variants: Vec<(String, AllreduceAlgorithm, Tuning)> =
        algorithms.iter().map(|&a| (name(&format!("{a:?}")), a, base)).collect();
    // The shared-memory window written one way only (the default picks as it runs from
    // 4 MiB; below, every variant writes it with ordinary stores).
    if single {
        for (how, stores) in [("cached", WindowStores::Cached), ("streamed", WindowStores::Streamed)] {
            let tuning = base.with_shared_memory_stores(stores);
            variants.push((format!("shm_{how}"), AllreduceAlgorithm::SharedMemory, tuning));
        }
    }
    let tunings: Vec<Tuning> = variants.iter().map(|v| v.2).collect();
    let t = b.time(bytes, &tunings, |c, i| c.allreduce_with(&send, &mut recv, Sum, variants[i].1).expect("allreduce"));
    let times = variants.iter().zip(t).map(|(v, t)| (v.0.clone(), t)).collect();
    let auto = name(&format!("{:?}", b.comm.allreduce_choice::<f32, Sum>(len)));
    b.points.push(Point { op: "allreduce", bytes, times, auto });
}

fn bcast(b: &mut Bench, bytes: usize) {
    let mut buf = vec![1.0f32; bytes / 4];
    let algorithms =
        [BcastAlgorithm::Native, BcastAlgorithm::Chain, BcastAlgorithm::Hierarchical, BcastAlgorithm::Auto];
    let tunings = [b.comm.tuning(); 4];
    let t = b.time(bytes, &tunings, |c, i| c.bcast_with(&mut buf, 0, algorithms[i]).expect("bcast"));
    let times = algorithms.iter().zip(t).map(|(a, t)| (name(&format!("{a:?}")), t)).collect();
    let auto = name(&format!("{:?}", b.comm.bcast_choice::<f32>(bytes / 4)));
    b.points.push(Point { op: "bcast", bytes, times, auto });
}

/// The reduce-scatter's paths, chosen by thresholds: MPI's, the flat ring, the two-level one.
fn reduce_scatter(b: &mut Bench, bytes: usize) {
    let n = b.comm.size();
    let block = (bytes / 4 / n).max(1);
    let send = vec![1.0f32; block * n];
    let mut recv = vec![0.0f32; block];
    let base = b.comm.tuning();
    let never = base.with_hierarchical_reduce_scatter_bytes(usize::MAX);
    let variants = [
        ("native", never.with_reduce_ring_bytes(usize::MAX)),
        ("ring", never.with_reduce_ring_bytes(0)),
        ("hierarchical", base.with_hierarchical_reduce_scatter_bytes(0)),
        ("auto", base),
    ];
    let t =
        b.time(bytes, &variants.map(|v| v.1), |c, _| c.reduce_scatter(&send, &mut recv, Sum).expect("reduce_scatter"));
    let times = variants.iter().zip(t).map(|((label, _), t)| (label.to_string(), t)).collect();
    let auto = name(&format!("{:?}", b.comm.reduce_scatter_choice::<f32, Sum>(block)));
    b.points.push(Point { op: "reduce_scatter", bytes, times, auto });
}

/// The allgather's paths: MPI's and the two-level one.
fn allgather(b: &mut Bench, bytes: usize) {
    let n = b.comm.size();
    let block = (bytes / 4 / n).max(1);
    let mine = vec![1.0f32; block];
    let mut out = vec![0.0f32; block * n];
    let base = b.comm.tuning();
    let variants = [
        ("native", base.with_hierarchical_allgather_bytes(usize::MAX)),
        ("hierarchical", base.with_hierarchical_allgather_bytes(0)),
        ("auto", base),
    ];
    let t = b.time(bytes, &variants.map(|v| v.1), |c, _| c.allgather(&mine, &mut out).expect("allgather"));
    let times = variants.iter().zip(t).map(|((label, _), t)| (label.to_string(), t)).collect();
    let auto = name(&format!("{:?}", b.comm.allgather_choice::<f32>(block)));
    b.points.push(Point { op: "allgather", bytes, times, auto });
}

/// `RecursiveDoubling` -> `recursive_doubling`.
fn name(debug: &str) -> String {
    let mut s = String::new();
    for (i, ch) in debug.chars().enumerate() {
        if ch.is_uppercase() && i > 0 {
            s.push('_');
        }
        s.push(ch.to_ascii_lowercase());
    }
    s
}

fn human(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// Bus bandwidth against size of every variant, one plot per operation
/// (`target/bench-topology-<op>-np<N>.svg`; `docs/perf.md`).
fn plot_points(points: &[Point], np: usize) {
    use duralumin_perf::ops::Coll;
    use duralumin_perf::plot::{plot, push_to};
    let mut ops: Vec<&str> = points.iter().map(|p| p.op).collect();
    ops.sort_unstable();
    ops.dedup();
    for op in ops {
        let factor = Coll::parse(op).map_or(1.0, |c| c.busbw_factor(np));
        let mut series = Vec::new();
        for p in points.iter().filter(|p| p.op == op) {
            for (name, t) in &p.times {
                push_to(&mut series, name.clone(), p.bytes, p.bytes as f64 / (t * 1e3) * factor);
            }
        }
        let path = format!("target/bench-topology-{op}-np{np}.svg");
        match plot(std::path::Path::new(&path), &format!("{op}, {np} ranks"), &series) {
            Ok(()) => println!("plot written to {path}"),
            Err(e) => println!("no plot: {e}"),
        }
    }
}

fn report(points: &[Point], single_node: bool) {
    let mut ops: Vec<&str> = points.iter().map(|p| p.op).collect();
    ops.dedup();
    ops.sort_unstable();
    ops.dedup();
    let mut targets = String::new();
    for op in ops {
        let rows: Vec<&Point> = points.iter().filter(|p| p.op == op).collect();
        let names: Vec<&str> = rows[0].times.iter().map(|(n, _)| n.as_str()).collect();
        let mut head = format!("{:>8}", "bytes");
        for n in &names {
            let _ = write!(head, " {n:>18}");
        }
        println!("\n-- {op} (µs per call; * = Auto's pick; auto/best = the Auto row over the best fixed one) --");
        println!("{head} {:>10}", "auto/best");
        for p in &rows {
            let mut line = format!("{:>8}", human(p.bytes));
            for (n, t) in &p.times {
                let mark = if *n == p.auto { "*" } else { " " };
                let _ = write!(line, " {:>17.1}{mark}", t);
            }
            let (best_name, best) = p.best();
            let auto = p.time("auto").unwrap_or(f64::NAN);
            let _ = write!(line, " {:>10.2}", auto / best);
            println!("{line}");
            // The pick against the best fixed algorithm, both from their own rows (the Auto row
            // repeats the pick and adds only noise).
            let pick = p.time(&p.auto).unwrap_or(f64::NAN);
            let ok = pick <= 1.10 * best;
            let _ = writeln!(
                targets,
                "{} auto {} {op} {}: picks {} ({pick:.0} µs), best {best_name} ({best:.0} µs): within 10 %",
                if ok { "met   " } else { "MISSED" },
                if single_node { "one node" } else { "nodes" },
                human(p.bytes),
                p.auto,
            );
        }
    }
    let at =
        |op: &str, name: &str| points.iter().find(|p| p.op == op && p.bytes == 64 << 20).and_then(|p| p.time(name));
    let mut check = |what: &str, ratio: Option<f64>, ok: fn(f64) -> bool| {
        if let Some(r) = ratio {
            let _ = writeln!(targets, "{} {what}: {r:.2}", if ok(r) { "met   " } else { "MISSED" });
        }
    };
    if single_node {
        let shm = at("allreduce", "shared_memory").zip(at("allreduce", "native")).map(|(s, n)| s / n);
        check("shared-memory allreduce 64 MiB, time / native (<= 0.35)", shm, |r| r <= 0.35);
    } else {
        let ring = at("allreduce", "ring").zip(at("allreduce", "hierarchical")).map(|(r, h)| r / h);
        check("hierarchical allreduce 64 MiB, speed-up over the flat ring (>= 1.5)", ring, |r| r >= 1.5);
        let native = at("allreduce", "hierarchical").zip(at("allreduce", "native")).map(|(h, n)| h / n);
        check("hierarchical allreduce 64 MiB, time / native (< 1)", native, |r| r < 1.0);
        let bcast = at("bcast", "hierarchical").zip(at("bcast", "native")).map(|(h, n)| h / n);
        check("hierarchical bcast 64 MiB, time / native (<= 0.7)", bcast, |r| r <= 0.7);
    }
    println!("\n-- targets --\n{targets}");
}
