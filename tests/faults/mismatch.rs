//! Mismatched calls: one rank calls a collective with another count, root or operation than
//! the others, at one size per algorithm class and with every algorithm forced once. The
//! launch runs under `OnTimeout::Error`, each case on a communicator of its own, so one launch
//! runs every case of a backend, rank count and layout.
//!
//! Each rank prints, per case, how its call ended, how long it took, and whether an `Ok` held
//! exactly what its own call asked for (`CASE <i> <rank> <outcome> <ms>`), every line of an
//! error (`ERR <i> <rank>| ...`), and whether anything was written around its buffers
//! (`CANARY <i> <rank>`). The launcher ([`check`]) holds every case to the guarantees of
//! `docs/reliability.md`.

use std::time::{Duration, Instant};

use duralumin::backends::host_transfer::{HostTransferCommunicator, HostTransferConfig};
use duralumin::device::cpu::HostDevice;
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::mpi::traits::{Communicator as _, CommunicatorCollectives as _};
use duralumin::reliability::OnTimeout;
use duralumin::{AllreduceAlgorithm, BcastAlgorithm, Error, MpiCommunicator, Result, Sum};

/// The sizes of the cases, one per algorithm class: native and recursive doubling (4 B), the
/// shared-memory window and two-level algorithms (4 KiB, 64 KiB), the ring (1 MiB), the chunked
/// pipelines (16 MiB).
pub const SIZES: [usize; 5] = [4, 4 << 10, 64 << 10, 1 << 20, 16 << 20];

/// What the faulty rank does differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Twice the count of the others.
    Count,
    /// Another root (a broadcast).
    Root,
    /// A broadcast where the others allreduce.
    Op,
}

/// The collective (and the algorithm forced on every rank).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algo {
    Allreduce(AllreduceAlgorithm),
    Bcast(BcastAlgorithm),
}

/// One case.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub kind: Kind,
    pub algo: Algo,
    /// The others' data, in bytes.
    pub bytes: usize,
    pub faulty: usize,
    /// The others' root (broadcasts).
    pub root: usize,
    /// Whether a correct call of the same shape runs first (so a window exists already, say).
    pub warm: bool,
}

impl Case {
    /// Whether the others' call runs the MPI library's own collective unchecked (at most 2 KiB:
    /// `NATIVE_UNCHECKED_BYTES`), where MPI's own detection is what there is
    /// (`docs/reliability.md`): such a case may end with a silent `Ok`.
    pub fn native_unchecked(&self) -> bool {
        let native = matches!(
            self.algo,
            Algo::Allreduce(AllreduceAlgorithm::Native | AllreduceAlgorithm::Auto)
                | Algo::Bcast(BcastAlgorithm::Native | BcastAlgorithm::Auto)
        );
        native && self.bytes <= 2 << 10
    }

    fn count(&self, me: usize) -> usize {
        let c = (self.bytes / 4).max(1);
        if self.kind == Kind::Count && me == self.faulty { 2 * c } else { c }
    }

    fn root(&self, me: usize, n: usize) -> usize {
        if self.kind == Kind::Root && me == self.faulty { (self.root + 1) % n } else { self.root }
    }
}

/// Every case for `n` ranks on `nodes` nodes, in the order every rank runs them.
pub fn cases(n: usize, nodes: usize) -> Vec<Case> {
    let mut allreduces = vec![
        AllreduceAlgorithm::Auto,
        AllreduceAlgorithm::Native,
        AllreduceAlgorithm::Ring,
        AllreduceAlgorithm::RecursiveDoubling,
        AllreduceAlgorithm::Rabenseifner,
    ];
    allreduces.push(if nodes > 1 { AllreduceAlgorithm::Hierarchical } else { AllreduceAlgorithm::SharedMemory });
    let mut bcasts = vec![BcastAlgorithm::Auto, BcastAlgorithm::Native, BcastAlgorithm::Chain];
    if nodes > 1 {
        bcasts.push(BcastAlgorithm::Hierarchical);
    }
    let mut out = Vec::new();
    let mut add = |kind: Kind, algo: Algo, bytes: usize| {
        let i = out.len();
        let faulty = (i * 7 + 1) % n;
        out.push(Case { kind, algo, bytes, faulty, root: i % n, warm: i % 2 == 0 });
    };
    for &bytes in &SIZES {
        for &a in &allreduces {
            add(Kind::Count, Algo::Allreduce(a), bytes);
            add(Kind::Op, Algo::Allreduce(a), bytes);
        }
        for &b in &bcasts {
            add(Kind::Count, Algo::Bcast(b), bytes);
            add(Kind::Root, Algo::Bcast(b), bytes);
        }
    }
    out
}

/// The collectives on host vectors, with guard elements around every buffer the library
/// writes where the backend allows it.
trait Calls {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// The deadline of the operations from now on.
    fn set_timeout(&mut self, timeout: Duration);
    /// Sum allreduce of `send`; the result and whether its guards held.
    fn allreduce(&self, send: &[f32], algo: AllreduceAlgorithm) -> (Result<Vec<f32>>, bool);
    /// Broadcast of `buf` from `root`; the result and whether its guards held.
    fn bcast(&self, buf: &[f32], root: usize, algo: BcastAlgorithm) -> (Result<Vec<f32>>, bool);
}

/// Guard elements on each side of a buffer, and their bits.
const GUARD: usize = 4096;
const GUARD_BITS: u32 = 0x7fc0_dead;

fn guarded(data: &[f32]) -> Vec<f32> {
    let g = f32::from_bits(GUARD_BITS);
    let mut v = vec![g; GUARD];
    v.extend_from_slice(data);
    v.extend(std::iter::repeat_n(g, GUARD));
    v
}

fn guards_hold(v: &[f32]) -> bool {
    let n = v.len();
    v[..GUARD].iter().chain(&v[n - GUARD..]).all(|x| x.to_bits() == GUARD_BITS)
}

impl Calls for MpiCommunicator {
    fn rank(&self) -> usize {
        MpiCommunicator::rank(self)
    }
    fn size(&self) -> usize {
        MpiCommunicator::size(self)
    }
    fn set_timeout(&mut self, timeout: Duration) {
        MpiCommunicator::set_timeout(self, Some(timeout));
    }
    fn allreduce(&self, send: &[f32], algo: AllreduceAlgorithm) -> (Result<Vec<f32>>, bool) {
        let mut recv = guarded(&vec![0.0; send.len()]);
        let r = self.allreduce_with(send, &mut recv[GUARD..GUARD + send.len()], Sum, algo);
        let held = guards_hold(&recv);
        (r.map(|()| recv[GUARD..GUARD + send.len()].to_vec()), held)
    }
    fn bcast(&self, buf: &[f32], root: usize, algo: BcastAlgorithm) -> (Result<Vec<f32>>, bool) {
        let mut b = guarded(buf);
        let r = self.bcast_with(&mut b[GUARD..GUARD + buf.len()], root, algo);
        let held = guards_hold(&b);
        (r.map(|()| b[GUARD..GUARD + buf.len()].to_vec()), held)
    }
}

/// HostTransfer on the host device (staged in 1 MiB chunks, as on a GPU). Its buffers are the
/// device's own: what MPI writes is the staging memory, which the library owns.
struct Ht {
    dev: HostDevice,
    comm: HostTransferCommunicator<HostDevice>,
}

impl Calls for Ht {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn set_timeout(&mut self, timeout: Duration) {
        self.comm.set_timeout(Some(timeout));
    }
    fn allreduce(&self, send: &[f32], algo: AllreduceAlgorithm) -> (Result<Vec<f32>>, bool) {
        let run = || {
            let ds = self.dev.upload(send)?;
            let mut dr = self.dev.alloc_zeroed::<f32>(send.len())?;
            self.comm.allreduce_with(&ds, &mut dr, Sum, algo)?;
            self.comm.synchronize()?;
            self.dev.download(&dr)
        };
        (run(), true)
    }
    fn bcast(&self, buf: &[f32], root: usize, algo: BcastAlgorithm) -> (Result<Vec<f32>>, bool) {
        let run = || {
            let mut b = self.dev.upload(buf)?;
            self.comm.bcast_with(&mut b, root, algo)?;
            self.comm.synchronize()?;
            self.dev.download(&b)
        };
        (run(), true)
    }
}

/// What rank `r`'s data is, and what a broadcast from `root` delivers.
fn data(r: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| ((r + 1) * 1000 + i % 97) as f32).collect()
}

/// Runs one case on `c`: the outcome word and the error, if any.
fn run_case(case: &Case, c: &impl Calls) -> (String, Option<Error>, bool) {
    let (me, n) = (c.rank(), c.size());
    let count = case.count(me);
    let sum = (n * (n + 1) / 2) as f32;
    let (result, expected, held) = match (case.kind, case.algo) {
        (Kind::Op, Algo::Allreduce(_)) if me == case.faulty => {
            let (r, held) = c.bcast(&data(me, count), case.root, BcastAlgorithm::Auto);
            (r, data(case.root, count), held)
        }
        (_, Algo::Allreduce(a)) => {
            let (r, held) = c.allreduce(&vec![(me + 1) as f32; count], a);
            (r, vec![sum; count], held)
        }
        (_, Algo::Bcast(b)) => {
            let root = case.root(me, n);
            let (r, held) = c.bcast(&data(me, count), root, b);
            (r, data(root, count), held)
        }
    };
    match result {
        Ok(v) if v == expected => ("ok".into(), None, held),
        Ok(_) => ("WRONG".into(), None, held),
        Err(e) => (kind(&e).into(), Some(e), held),
    }
}

fn kind(e: &Error) -> &'static str {
    match e {
        Error::Mismatch { .. } => "Mismatch",
        Error::SignatureMismatch { .. } => "SignatureMismatch",
        Error::Timeout { .. } => "Timeout",
        Error::Aborted { .. } => "Aborted",
        Error::CountMismatch { .. } => "CountMismatch",
        Error::Mpi { .. } => "Mpi",
        _ => "other",
    }
}

/// The rank program (`DURALUMIN_FAULT_PROGRAM=mismatch-mpi` or `mismatch-host`).
pub fn main(backend: &str) {
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let probe = MpiCommunicator::new(&world).expect("communicator");
    let (me, n, nodes) = (probe.rank(), probe.size(), probe.topology().node_count());
    drop(probe);
    crate::mpirun::rank_case::start(me);
    let only: Option<usize> = std::env::var("MISMATCH_CASE").ok().and_then(|v| v.parse().ok());
    let mut report = Report::open(me);
    // The last case's HostTransfer communicator, dropped only after the next case: a case in
    // which two ranks both take themselves for the root of a broadcast ends `ok` on both with
    // their sends unreceived, and MPI may hand a send that arrives after its communicator is
    // freed to the next communicator given the same context id (the next case's, made right
    // after). Kept one case longer, the sends land in the old communicator's queue and go
    // with it.
    let mut previous: Option<Ht> = None;
    for (i, case) in cases(n, nodes).iter().enumerate() {
        if only.is_some_and(|k| k != i) {
            continue;
        }
        let _frame = crate::mpirun::rank_case::enter(format!("mismatch case {i}: {case:?}"));
        // Every rank is done with the case (and its reports) before any drops its
        // communicator: the drops then come in the same order everywhere, as MPI asks.
        let outcome = match backend {
            "mpi" => {
                let mut c = MpiCommunicator::new(&world).expect("communicator");
                c.set_on_timeout(OnTimeout::Error);
                let r = one(i, case, &mut c, &world);
                world.barrier();
                r
            }
            "host" => {
                let dev = HostDevice::new(0);
                let config = HostTransferConfig::default().with_chunk_bytes(1 << 20);
                let stream = dev.stream().expect("stream");
                let mut comm =
                    HostTransferCommunicator::with_config(&world, dev.clone(), stream, config).expect("communicator");
                comm.set_on_timeout(OnTimeout::Error);
                let mut ht = Ht { dev, comm };
                let r = one(i, case, &mut ht, &world);
                world.barrier();
                drop(previous.replace(ht));
                r
            }
            other => panic!("unknown backend {other}"),
        };
        report.write(&outcome);
    }
    drop(previous);
    report.write(&format!("DONE {me}\n"));
}

/// The deadline of the rank that gives up first in [`given_up`]; the other's is
/// [`WARMUP_TIMEOUT`], far beyond it.
pub const GIVE_UP_TIMEOUT: Duration = Duration::from_millis(500);

/// The rank program of the given-up trial (`DURALUMIN_FAULT_PROGRAM=given-up-mpi` or
/// `given-up-host`, 2 ranks, `OnTimeout::Error`): each rank broadcasts with the other as the
/// root (chain algorithm), so each waits for the other's data and no message can show either
/// rank the mismatch. Rank 0's deadline passes first; rank 1 must learn from its give-up that
/// the calls differ. Writes `GIVEN_UP <rank> <outcome> <ms>` and the error's lines
/// (`ERR <rank>| ...`) where [`Report`] says.
///
/// `abort-<backend>`: rank 1 runs under `OnTimeout::Abort`, where the give-up must end the
/// job (its operations may run on the caller's buffers, which MPI may still read).
pub fn given_up(backend: &str) {
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let me = usize::try_from(world.rank()).expect("a rank is never negative");
    let mut report = Report::open(me);
    let (abort, backend) = match backend.strip_prefix("abort-") {
        Some(b) => (me == 1, b),
        None => (false, backend),
    };
    let on_timeout = if abort { OnTimeout::Abort } else { OnTimeout::Error };
    // Every rank is done with its call (and its lines) before either drops its communicator.
    match backend {
        "mpi" => {
            let mut c = MpiCommunicator::new(&world).expect("communicator");
            c.set_on_timeout(on_timeout);
            report.write(&give_up_once(&mut c, &world));
            world.barrier();
        }
        "host" => {
            let dev = HostDevice::new(0);
            let stream = dev.stream().expect("stream");
            let mut comm = HostTransferCommunicator::new(&world, dev.clone(), stream).expect("communicator");
            comm.set_on_timeout(on_timeout);
            report.write(&give_up_once(&mut Ht { dev, comm }, &world));
            world.barrier();
        }
        other => panic!("unknown backend {other}"),
    }
}

/// One broadcast of 1024 elements rooted at the other rank, under this rank's deadline.
fn give_up_once(c: &mut impl Calls, world: &SimpleCommunicator) -> String {
    let me = c.rank();
    c.set_timeout(if me == 0 { GIVE_UP_TIMEOUT } else { WARMUP_TIMEOUT });
    world.barrier();
    let start = Instant::now();
    let (r, _) = c.bcast(&data(me, 1024), 1 - me, BcastAlgorithm::Chain);
    let ms = start.elapsed().as_millis();
    match r {
        Ok(_) => format!("GIVEN_UP {me} ok {ms}\n"),
        Err(e) => {
            let mut out = format!("GIVEN_UP {me} {} {ms}\n", kind(&e));
            push_error(&mut out, &format!("ERR {me}"), &e);
            out
        }
    }
}

/// The variable naming the directory where each rank writes its case lines (`rank<r>`).
pub const REPORTS: &str = "DURALUMIN_MISMATCH_REPORTS";

/// Where a rank's case lines go: its file in [`REPORTS`]'s directory (whole lines, in order,
/// never interleaved with another rank's), else stdout.
struct Report(Option<std::fs::File>);

impl Report {
    fn open(me: usize) -> Report {
        let dir = std::env::var_os(REPORTS).map(std::path::PathBuf::from);
        Report(dir.map(|d| std::fs::File::create(d.join(format!("rank{me}"))).expect("the rank's report file")))
    }

    fn write(&mut self, lines: &str) {
        use std::io::Write as _;
        match &mut self.0 {
            Some(f) => f.write_all(lines.as_bytes()).expect("writing the rank's report"),
            None => print!("{lines}"),
        }
    }
}

/// The deadline of a case's correct call before it: generous, so that a machine slowed by
/// other work cannot make a correct call time out (the case's own deadline is
/// `DURALUMIN_TIMEOUT`, short, since it ends the cases nothing can find sooner).
pub const WARMUP_TIMEOUT: Duration = Duration::from_secs(60);

/// Case `i` on `c`, after a correct call of the same shape when the case asks for one: the
/// lines to print.
fn one(i: usize, case: &Case, c: &mut impl Calls, world: &SimpleCommunicator) -> String {
    let me = c.rank();
    if case.warm {
        let deadline = std::env::var("DURALUMIN_TIMEOUT").ok().and_then(|v| v.parse::<f64>().ok());
        c.set_timeout(WARMUP_TIMEOUT);
        let warm = Case { kind: Kind::Count, faulty: usize::MAX, ..*case };
        let (word, e, _) = run_case(&warm, c);
        if word != "ok" {
            // The others still meet this rank at the barrier below: the case ends for every
            // rank rather than leaving them in another collective than this rank's next one.
            world.barrier();
            return format!("WARMUP {i} {me} {word} {}\n", e.map(|e| e.to_string()).unwrap_or_default());
        }
        c.set_timeout(Duration::from_secs_f64(deadline.expect("the launcher sets DURALUMIN_TIMEOUT")));
    }
    world.barrier();
    let start = Instant::now();
    let (word, err, held) = run_case(case, c);
    let ms = start.elapsed().as_millis();
    let mut out = format!("CASE {i} {me} {word} {ms}\n");
    if let Some(e) = err {
        push_error(&mut out, &format!("ERR {i} {me}"), &e);
    }
    if !held {
        out.push_str(&format!("CANARY {i} {me}\n"));
    }
    out
}

/// Every line of `e`, each after `prefix` and `| `.
fn push_error(out: &mut String, prefix: &str, e: &Error) {
    for line in e.to_string().lines() {
        out.push_str(&format!("{prefix}| {line}\n"));
    }
}

/// How long a case may take on a rank: the deadline plus 5 s.
pub fn bound(deadline_s: f64) -> Duration {
    Duration::from_secs_f64(deadline_s + 5.0)
}
