//! The rank program of the fault-injection tests: a loop of small collectives on one backend,
//! with one fault at collective `#op` on rank `rank` (see [`Fault`]). Each rank prints what
//! happened to it on stdout (`RESULT <rank> ...`, and an error's text as `ERROR <rank>| ...`),
//! for the launcher to check.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use duralumin::backends::host_transfer::{self, HostTransferConfig};
use duralumin::device::cpu::{HostBuffer, HostDevice};
use duralumin::device::{Device, DeviceSliceMut};
use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::{Error, MpiCommunicator, Result, Sum};

/// The faults the tests inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Stuck in its own code before the collective (for `STALL`).
    Stall,
    /// A Rust panic in its own code.
    Panic,
    /// The collective with another count.
    Count,
    /// Another collective (a bcast where the others allreduce).
    Op,
    /// The bcast with another root.
    Root,
    /// Arguments its own checks refuse (a receive buffer one element short).
    BadArg,
    /// SIGKILL in the middle of a 64 MiB allreduce.
    Kill,
    /// Drops a communicator whose shared-memory window exists before an allreduce on another
    /// communicator, which the others run first (Mpi backend only; see [`drop_order`]).
    DropOrder,
    /// Drops that communicator while the others run one more allreduce on it, so their
    /// deadline passes first (see [`drop_order`]).
    DropEarly,
}

impl Fault {
    pub const ALL: [Fault; 9] = [
        Fault::Stall,
        Fault::Panic,
        Fault::Count,
        Fault::Op,
        Fault::Root,
        Fault::BadArg,
        Fault::Kill,
        Fault::DropOrder,
        Fault::DropEarly,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Fault::Stall => "stall",
            Fault::Panic => "panic",
            Fault::Count => "count",
            Fault::Op => "op",
            Fault::Root => "root",
            Fault::BadArg => "badarg",
            Fault::Kill => "kill",
            Fault::DropOrder => "droporder",
            Fault::DropEarly => "dropearly",
        }
    }

    fn parse(s: &str) -> Fault {
        Fault::ALL.into_iter().find(|f| f.name() == s).unwrap_or_else(|| panic!("unknown fault {s}"))
    }
}

/// The count of the loop's collectives, and of the big allreduce of the kill fault.
pub const COUNT: usize = 7;
const BIG: usize = 16 << 20;

fn now_ms() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis())
}

/// What the loop needs from a backend: the collectives on host vectors.
trait Ops {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    /// A sum allreduce of `send` into a receive buffer of `recv_len` elements.
    fn allreduce(&self, send: &[f32], recv_len: usize) -> Result<Vec<f32>>;
    fn bcast(&self, buf: &[f32], root: usize) -> Result<Vec<f32>>;
}

impl Ops for MpiCommunicator {
    fn rank(&self) -> usize {
        MpiCommunicator::rank(self)
    }
    fn size(&self) -> usize {
        MpiCommunicator::size(self)
    }
    fn allreduce(&self, send: &[f32], recv_len: usize) -> Result<Vec<f32>> {
        let mut recv = vec![0.0; recv_len];
        MpiCommunicator::allreduce(self, send, &mut recv, Sum)?;
        Ok(recv)
    }
    fn bcast(&self, buf: &[f32], root: usize) -> Result<Vec<f32>> {
        let mut b = buf.to_vec();
        MpiCommunicator::bcast(self, &mut b, root)?;
        Ok(b)
    }
}

/// A device the HostTransfer loop runs on: host vectors in and out of its buffers.
trait Dev: Device + Clone {
    type Buf: DeviceSliceMut<Self, Elem = f32>;
    fn up(&self, stream: &Self::Stream, v: &[f32]) -> Self::Buf;
    fn down(&self, stream: &Self::Stream, b: &Self::Buf) -> Vec<f32>;
}

impl Dev for HostDevice {
    type Buf = HostBuffer<f32>;
    fn up(&self, _: &Self::Stream, v: &[f32]) -> Self::Buf {
        self.upload(v).expect("upload")
    }
    fn down(&self, _: &Self::Stream, b: &Self::Buf) -> Vec<f32> {
        self.download(b).expect("download")
    }
}

#[cfg(feature = "cuda")]
impl Dev for duralumin::device::cuda::CudaDevice {
    type Buf = duralumin::cudarc::driver::CudaSlice<f32>;
    fn up(&self, stream: &Self::Stream, v: &[f32]) -> Self::Buf {
        let mut b = stream.alloc_zeros::<f32>(v.len().max(1)).expect("alloc");
        if !v.is_empty() {
            stream.memcpy_htod(v, &mut b).expect("upload");
        }
        stream.synchronize().expect("synchronize");
        b
    }
    fn down(&self, stream: &Self::Stream, b: &Self::Buf) -> Vec<f32> {
        stream.clone_dtoh(b).expect("download")
    }
}

struct Ht<D: Dev> {
    dev: D,
    comm: host_transfer::HostTransferCommunicator<D>,
}

impl<D: Dev> Ops for Ht<D> {
    fn rank(&self) -> usize {
        self.comm.rank()
    }
    fn size(&self) -> usize {
        self.comm.size()
    }
    fn allreduce(&self, send: &[f32], recv_len: usize) -> Result<Vec<f32>> {
        let s = self.comm.stream();
        let (ds, mut dr) = (self.dev.up(s, send), self.dev.up(s, &vec![0.0; recv_len]));
        self.comm.allreduce(&ds, &mut dr, Sum)?;
        self.comm.synchronize()?;
        let mut out = self.dev.down(s, &dr);
        out.truncate(recv_len);
        Ok(out)
    }
    fn bcast(&self, buf: &[f32], root: usize) -> Result<Vec<f32>> {
        let s = self.comm.stream();
        let mut b = self.dev.up(s, buf);
        self.comm.bcast(&mut b, root)?;
        self.comm.synchronize()?;
        let mut out = self.dev.down(s, &b);
        out.truncate(buf.len());
        Ok(out)
    }
}

/// The scenario, from the environment the launcher sets.
struct Scenario {
    fault: Fault,
    rank: usize,
    op: usize,
    /// How long the stall lasts, and how long a rank that refused its arguments waits before
    /// it tries again (without the signature check).
    stall: Duration,
    /// Whether the signature check is on (`DURALUMIN_CHECK=1`).
    check: bool,
}

pub fn main(backend: &str) {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is not set"));
    let sc = Scenario {
        fault: Fault::parse(&var("FAULT_KIND")),
        rank: var("FAULT_RANK").parse().expect("FAULT_RANK"),
        op: var("FAULT_OP").parse().expect("FAULT_OP"),
        stall: Duration::from_secs_f64(var("FAULT_STALL").parse().expect("FAULT_STALL")),
        check: std::env::var("DURALUMIN_CHECK").is_ok_and(|v| v == "1"),
    };
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    match backend {
        "mpi" if matches!(sc.fault, Fault::DropOrder | Fault::DropEarly) => {
            drop_order(&sc, MpiCommunicator::new(&world).expect("communicator"))
        }
        "mpi" => run(&sc, &MpiCommunicator::new(&world).expect("communicator")),
        "host" => {
            let dev = HostDevice::new(0);
            run(&sc, &ht(&world, dev.clone(), dev.stream().expect("stream")));
        }
        #[cfg(feature = "cuda")]
        "cudasim" => {
            let ctx = duralumin::cudarc::driver::CudaContext::new(0).expect("CUDA context (the simulator)");
            let stream = ctx.new_stream().expect("stream");
            run(&sc, &ht(&world, duralumin::device::cuda::CudaDevice::new(ctx).expect("device"), stream));
        }
        other => panic!("unknown backend {other}"),
    }
}

/// The deadline of [`queue_failure`]: the rank already in the collective must hear of the
/// other's failure long before it.
#[cfg(feature = "cuda")]
pub const QUEUE_FAILURE_TIMEOUT: Duration = Duration::from_secs(20);

/// One allreduce on cudasim that rank 1 cannot queue (the launcher makes its device's copies
/// fail: `CUDASIM_FAIL_RANK`), under `OnTimeout::Error`: rank 0, already in it, must get the
/// communicator given up by rank 1 at once, not its own timeout. `QUEUED <rank> <kind> <ms>`.
#[cfg(feature = "cuda")]
pub fn queue_failure() {
    use duralumin::mpi::traits::CommunicatorCollectives as _;
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let ctx = duralumin::cudarc::driver::CudaContext::new(0).expect("CUDA context (the simulator)");
    let stream = ctx.new_stream().expect("stream");
    let mut h = ht(&world, duralumin::device::cuda::CudaDevice::new(ctx).expect("device"), stream);
    h.comm.set_on_timeout(duralumin::reliability::OnTimeout::Error);
    h.comm.set_timeout(Some(QUEUE_FAILURE_TIMEOUT));
    let me = h.rank();
    world.barrier();
    let start = std::time::Instant::now();
    let r = h.allreduce(&vec![1.0; 4096], 4096);
    let ms = start.elapsed().as_millis();
    match r {
        Ok(_) => println!("QUEUED {me} ok {ms}"),
        Err(e) => {
            println!("QUEUED {me} {} {ms}", kind(&e));
            report(me, 1, &e);
        }
    }
    world.barrier();
}

/// How many operations [`set_aside`] queues; more than the flight recorder keeps
/// (`DURALUMIN_RECORDER_OPS`, 8 in that launch).
pub const SET_ASIDE_OPS: usize = 14;
/// The deadline of [`set_aside`]: the fault report must end every rank long before it.
pub const SET_ASIDE_TIMEOUT: Duration = Duration::from_secs(20);

/// HostTransfer on the host device under `OnTimeout::Error`: [`SET_ASIDE_OPS`] allreduces
/// queued behind a host kernel that holds the stream, so all of them are recorded before the
/// first runs; rank 1's #2 has another count. Its record, with more operations queued behind
/// it than the flight recorder keeps, was set aside: the fault must still be reported and the
/// communicator given up on every rank. `SET_ASIDE <rank> <kind> <ms>`.
pub fn set_aside() {
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let (dev, h) = on_host(&world, duralumin::reliability::OnTimeout::Error, SET_ASIDE_TIMEOUT);
    let me = h.rank();
    let count = |i: usize| if me == 1 && i == 2 { COUNT + 1 } else { COUNT };
    let bufs: Vec<_> = (1..=SET_ASIDE_OPS)
        .map(|i| {
            (dev.upload(&vec![1.0f32; count(i)]).expect("upload"), dev.alloc_zeroed::<f32>(count(i)).expect("alloc"))
        })
        .collect();
    let mut gate = dev.alloc_zeroed::<u8>(1).expect("alloc");
    let start = std::time::Instant::now();
    dev.launch(h.comm.stream(), &mut gate, |_| std::thread::sleep(Duration::from_millis(300))).expect("the gate");
    let queued = bufs.into_iter().try_for_each(|(s, mut r)| h.comm.allreduce(&s, &mut r, Sum));
    let r = queued.and_then(|()| h.comm.synchronize());
    let ms = start.elapsed().as_millis();
    match r {
        Ok(()) => println!("SET_ASIDE {me} ok {ms}"),
        Err(e) => {
            println!("SET_ASIDE {me} {} {ms}", kind(&e));
            report(me, 2, &e);
        }
    }
}

/// The deadline of [`switched`].
pub const SWITCHED_TIMEOUT: Duration = Duration::from_secs(1);

/// HostTransfer on the host device: rank 0 queues an allreduce under `OnTimeout::Abort` (so it
/// runs on the device buffers themselves), then switches to `OnTimeout::Error` and
/// synchronizes; rank 1 joins only after five deadlines. Given up without a revocation, the
/// operation's MPI part cannot give the buffers back: the job must end before rank 0 can read
/// its result (`synchronize` returns the give-up's error; the download waits for the stream).
/// `SWITCHED <rank> <outcome>`, then `SWITCHED <rank> downloaded`.
pub fn switched() {
    let universe = duralumin::init().expect("MPI init");
    let world = universe.world();
    let (dev, mut h) = on_host(&world, duralumin::reliability::OnTimeout::Abort, SWITCHED_TIMEOUT);
    let me = h.rank();
    // Larger than the operations started on the calling thread: it runs on the proxy thread.
    let len = 1 << 18;
    let send = dev.upload(&vec![1.0f32; len]).expect("upload");
    let mut recv = dev.alloc_zeroed::<f32>(len).expect("alloc");
    let r = if me == 0 {
        let queued = h.comm.allreduce(&send, &mut recv, Sum);
        h.comm.set_on_timeout(duralumin::reliability::OnTimeout::Error);
        queued.and_then(|()| h.comm.synchronize())
    } else {
        h.comm.set_on_timeout(duralumin::reliability::OnTimeout::Error);
        std::thread::sleep(5 * SWITCHED_TIMEOUT);
        h.comm.allreduce(&send, &mut recv, Sum).and_then(|()| h.comm.synchronize())
    };
    match r {
        Ok(()) => println!("SWITCHED {me} ok"),
        Err(e) => println!("SWITCHED {me} {}", kind(&e)),
    }
    // The result, once the stream is past the operation: if it is, the buffers are the
    // program's again.
    let _ = dev.download(&recv);
    println!("SWITCHED {me} downloaded");
    drop((send, recv));
}

/// A HostTransfer communicator on the host device with these settings, and its device.
fn on_host(
    world: &SimpleCommunicator,
    on_timeout: duralumin::reliability::OnTimeout,
    timeout: Duration,
) -> (HostDevice, Ht<HostDevice>) {
    let dev = HostDevice::new(0);
    let mut h = ht(world, dev.clone(), dev.stream().expect("stream"));
    h.comm.set_on_timeout(on_timeout);
    h.comm.set_timeout(Some(timeout));
    (dev, h)
}

fn ht<D: Dev>(world: &SimpleCommunicator, dev: D, stream: D::Stream) -> Ht<D> {
    // Staged in small chunks, as on a GPU.
    let config = HostTransferConfig::default().with_chunk_bytes(1 << 20);
    let comm =
        host_transfer::HostTransferCommunicator::with_config(world, dev.clone(), stream, config).expect("communicator");
    Ht { dev, comm }
}

/// The error's kind, for the `RESULT` line.
fn kind(e: &Error) -> &'static str {
    match e {
        Error::Timeout { .. } => "Timeout",
        Error::Aborted { .. } => "Aborted",
        Error::SignatureMismatch { .. } => "SignatureMismatch",
        Error::BufferLength { .. } => "BufferLength",
        Error::Mpi { .. } => "Mpi",
        Error::CountMismatch { .. } => "CountMismatch",
        Error::Mismatch { .. } => "Mismatch",
        Error::Device { .. } => "Device",
        _ => "other",
    }
}

fn report(me: usize, i: usize, e: &Error) {
    let mut out = format!("RESULT {me} error at #{i}: {}\n", kind(e));
    for line in e.to_string().lines() {
        out.push_str(&format!("ERROR {me}| {line}\n"));
    }
    print!("{out}");
}

fn run(sc: &Scenario, ops: &impl Ops) {
    let (me, n) = (ops.rank(), ops.size());
    crate::mpirun::rank_case::start(me);
    let mine = vec![(me + 1) as f32; COUNT];
    let sum = (n * (n + 1) / 2) as f32;
    let mut i = 1;
    while i <= sc.op + 1 {
        let _case = crate::mpirun::rank_case::enter(format!("collective #{i}"));
        let faulty = me == sc.rank && i == sc.op;
        if faulty {
            println!("FAULT_AT {me} {}", now_ms());
        }
        let root_fault = sc.fault == Fault::Root;
        let result = match (sc.fault, faulty) {
            (Fault::Stall, true) => {
                std::thread::sleep(sc.stall);
                ops.allreduce(&mine, COUNT)
            }
            (Fault::Panic, true) => panic!("injected panic at collective #{i}"),
            (Fault::Count, true) => ops.allreduce(&[1.0; COUNT + 1], COUNT + 1),
            (Fault::Op, true) => ops.bcast(&mine, 0),
            (Fault::Root, true) => ops.bcast(&mine, 1 % n),
            (Fault::BadArg, true) => ops.allreduce(&mine, COUNT - 1),
            (Fault::Kill, _) if i == sc.op => {
                if faulty {
                    std::thread::spawn(|| {
                        std::thread::sleep(Duration::from_millis(20));
                        // SAFETY: ends this process (the fault under test); touches no memory.
                        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
                    });
                }
                ops.allreduce(&vec![1.0; BIG], BIG)
            }
            (_, _) if root_fault => ops.bcast(&[me as f32; COUNT], 0),
            _ => ops.allreduce(&mine, COUNT),
        };
        match result {
            Ok(v) if root_fault && !faulty => assert!(v.iter().all(|&x| x == 0.0), "#{i}: bcast from 0 gave {v:?}"),
            Ok(v) if !faulty && sc.fault != Fault::Kill => assert!(v.iter().all(|&x| x == sum), "#{i}: sum {v:?}"),
            Ok(_) => {}
            Err(e) => {
                report(me, i, &e);
                if matches!(e, Error::Timeout { .. } | Error::Aborted { .. }) {
                    // The communicator is given up: every later call fails at once.
                    let again = ops.allreduce(&mine, COUNT);
                    assert!(matches!(again, Err(Error::Aborted { .. })), "after {}: {again:?}", kind(&e));
                    println!("RESULT {me} then Aborted");
                    return;
                }
                if faulty && !sc.check && sc.fault == Fault::BadArg && matches!(e, Error::BufferLength { .. }) {
                    // The others are in the collective this rank refused: stay, then try the
                    // next one, which fails if they gave the communicator up meanwhile.
                    std::thread::sleep(sc.stall);
                }
            }
        }
        i += 1;
    }
    println!("RESULT {me} done");
}

/// The window's deadline in [`drop_order`]; the world's is [`DROP_ORDER_WORLD_TIMEOUT`], so
/// only the drop can time out within the launcher's bound.
const DROP_ORDER_WORLD_TIMEOUT: Duration = Duration::from_secs(30);

/// Communicator `a` (a dup of `world`) makes its shared-memory window in an allreduce; then
/// rank `sc.rank` drops `a` before an allreduce on `world`. Freeing the window waits for every
/// rank, and:
/// * [`Fault::DropOrder`]: the others run that allreduce before they drop `a`, so the faulty
///   rank waits in its drop for ranks that wait in the allreduce for it: the drop's deadline
///   (`a`'s) must end it with a report, not a silent hang;
/// * [`Fault::DropEarly`]: the others run one more allreduce on `a` first, which the faulty
///   rank joins 1.5 s late by dropping instead: their deadline passes first and (under
///   `OnTimeout::Error`) gives `a` up on every rank, which must end the job rather than leave
///   the faulty rank in a free nothing interrupts.
fn drop_order(sc: &Scenario, mut world: MpiCommunicator) {
    let (me, n) = (world.rank(), world.size());
    crate::mpirun::rank_case::start(me);
    let a = world.dup().expect("dup");
    world.set_timeout(Some(DROP_ORDER_WORLD_TIMEOUT));
    let mine = vec![1.0f32; 4096];
    let mut sum = vec![0.0f32; mine.len()];
    a.allreduce_with(&mine, &mut sum, Sum, duralumin::AllreduceAlgorithm::SharedMemory).expect("allreduce on a");
    assert!(sum.iter().all(|&x| x == n as f32), "allreduce on a: {sum:?}");
    // The loop's small allreduce (`Ops::allreduce`), on either communicator.
    let small = |c: &MpiCommunicator| Ops::allreduce(c, &[1.0; COUNT], COUNT);
    if me == sc.rank {
        println!("FAULT_AT {me} {}", now_ms());
        if sc.fault == Fault::DropEarly {
            std::thread::sleep(Duration::from_millis(1500));
        }
        drop(a);
        println!("RESULT {me} dropped");
        small(&world).expect("allreduce on world");
    } else {
        if sc.fault == Fault::DropEarly
            && let Err(e) = small(&a)
        {
            report(me, 2, &e);
        }
        small(&world).expect("allreduce on world");
        drop(a);
    }
    println!("RESULT {me} done");
}
