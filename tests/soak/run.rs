//! The soak's three workers: batches of non-blocking operations in flight together on one
//! communicator each, every result checked against [`Spec::expected`].

use duralumin::backends::host_transfer::{self, DeviceRequest};
use duralumin::device::cpu::{HostBuffer, HostDevice};
use duralumin::{Max, MpiCommunicator, Request, Result, Scope, Sum, scope};

use crate::plan::{Kind, Spec};

/// Operations in flight at once in a batch.
pub const BATCH: usize = 6;

/// One operation of a batch with its buffers.
struct Slot {
    spec: Spec,
    send: Vec<u64>,
    recv: Vec<u64>,
}

impl Slot {
    fn new(spec: Spec, me: usize) -> Slot {
        let (send, recv) = spec.inputs(me);
        Slot { spec, send, recv }
    }
}

/// Names batch `batch` of communicator `comm` (its operations' kinds, counts and roots) as
/// where this thread is, for the launcher's failure message.
fn batch_case(backend: &str, comm: usize, batch: usize, n: usize) -> crate::mpirun::rank_case::Frame {
    let ops: Vec<String> = (0..BATCH)
        .map(|k| {
            let spec = Spec::new(comm, batch, k, n);
            format!("{:?} count {} root {}", spec.kind, spec.count, spec.root)
        })
        .collect();
    crate::mpirun::rank_case::enter(format!("{backend} communicator {comm}, batch {batch}: {}", ops.join("; ")))
}

/// Starts `slot`'s operation on the Mpi communicator `c`.
fn start<'s>(c: &'s MpiCommunicator, s: &'s Scope<'s, '_>, slot: &'s mut Slot) -> Result<Request<'s>> {
    let (me, n) = (c.rank(), c.size());
    let Slot { spec, send, recv } = slot;
    let root = spec.root;
    match spec.kind {
        Kind::Allreduce => c.iallreduce(s, send, recv, Sum),
        Kind::AllreduceInPlace => c.iallreduce_in_place(s, recv, Sum),
        Kind::Bcast => c.ibcast(s, recv, root),
        Kind::Allgather => c.iallgather(s, send, recv),
        Kind::Allgatherv => {
            let counts = spec.counts();
            c.iallgatherv(s, send, recv, &counts, &Spec::gapped(&counts))
        }
        Kind::ReduceScatter => c.ireduce_scatter(s, send, recv, Sum),
        Kind::Alltoall => c.ialltoall(s, send, recv),
        Kind::Alltoallv => {
            let (sc, sd, rc, rd) = spec.alltoallv(me);
            c.ialltoallv(s, send, &sc, &sd, recv, &rc, &rd)
        }
        Kind::Reduce => c.ireduce(s, send, recv, root, Max),
        Kind::Gatherv if me == root => {
            let counts = spec.counts();
            c.igatherv(s, send, recv, &counts, &Spec::gapped(&counts), root)
        }
        Kind::Gatherv => c.igatherv(s, send, recv, &[], &[], root),
        Kind::Scatterv if me == root => {
            let counts = spec.counts();
            c.iscatterv(s, send, &counts, &Spec::gapped(&counts), recv, root)
        }
        Kind::Scatterv => c.iscatterv(s, &[], &[], &[], recv, root),
        Kind::SendRecv => c.isendrecv(s, send, (me + 1) % n, recv, (me + n - 1) % n, spec.count as i32 % 7),
        Kind::Barrier => c.ibarrier(s),
    }
}

/// Runs `ops` operations on the Mpi communicator `c` (number `comm` of the soak), in batches
/// of [`BATCH`] non-blocking operations waited for together; `first` is the first batch's
/// number (the warm-up and the measured run continue one sequence). Returns the batches run.
pub fn mpi(c: &MpiCommunicator, comm: usize, first: usize, ops: usize) -> usize {
    let (me, n) = (c.rank(), c.size());
    let batches = ops.div_ceil(BATCH);
    for b in first..first + batches {
        let _batch = batch_case("Mpi", comm, b, n);
        let mut slots: Vec<Slot> = (0..BATCH).map(|k| Slot::new(Spec::new(comm, b, k, n), me)).collect();
        let all = &mut slots;
        scope(|s| {
            let mut requests = Vec::with_capacity(BATCH);
            for slot in all.iter_mut() {
                requests.push(start(c, s, slot)?);
            }
            // Test the first one before waiting for all (MPI_Test makes progress as well).
            if let Some(r) = requests.first_mut() {
                r.test()?;
            }
            Request::wait_all(requests)
        })
        .unwrap_or_else(|e| panic!("rank {me}: Mpi communicator {comm}, batch {b}: {e}"));
        for (k, slot) in slots.iter().enumerate() {
            check(&slot.recv, &slot.spec, me, &format!("Mpi communicator {comm}, batch {b} slot {k}"));
        }
    }
    batches
}

fn check(got: &[u64], spec: &Spec, me: usize, what: &str) {
    let want = spec.expected(me);
    if got != want.as_slice() {
        let at = got.iter().zip(&want).position(|(a, b)| a != b);
        panic!(
            "rank {me}: {what}: {:?} of {} elements differs (lengths {} and {}, first difference at {at:?})",
            spec.kind,
            spec.count,
            got.len(),
            want.len()
        );
    }
}

/// A HostTransfer operation's device buffers.
struct DevSlot {
    spec: Spec,
    send: HostBuffer<u64>,
    recv: HostBuffer<u64>,
}

type Ht = host_transfer::HostTransferCommunicator<HostDevice>;

/// Starts `slot`'s operation on the HostTransfer communicator `c`: non-blocking when `nb`
/// (returning its request), else ordered on the communicator's stream.
fn start_ht<'a>(c: &'a Ht, slot: &'a mut DevSlot, nb: bool) -> Result<Option<DeviceRequest<'a, HostDevice>>> {
    let (me, n) = (c.rank(), c.size());
    let DevSlot { spec, send, recv } = slot;
    let root = spec.root;
    macro_rules! either {
        ($name:ident / $iname:ident ($($arg:expr),*)) => {
            if nb { c.$iname($($arg),*).map(Some) } else { c.$name($($arg),*).map(|()| None) }
        };
    }
    match spec.kind {
        Kind::Allreduce => either!(allreduce / iallreduce(send, recv, Sum)),
        Kind::AllreduceInPlace => either!(allreduce_in_place / iallreduce_in_place(recv, Sum)),
        Kind::Bcast => either!(bcast / ibcast(recv, root)),
        Kind::Allgather => either!(allgather / iallgather(send, recv)),
        Kind::Allgatherv => {
            let counts = spec.counts();
            either!(allgatherv / iallgatherv(send, recv, &counts, &Spec::gapped(&counts)))
        }
        Kind::ReduceScatter => either!(reduce_scatter / ireduce_scatter(send, recv, Sum)),
        Kind::Alltoall => either!(alltoall / ialltoall(send, recv)),
        Kind::Alltoallv => {
            let (sc, sd, rc, rd) = spec.alltoallv(me);
            either!(alltoallv / ialltoallv(send, &sc, &sd, recv, &rc, &rd))
        }
        Kind::Reduce => either!(reduce / ireduce(send, recv, root, Max)),
        Kind::Gatherv => {
            let counts = if me == root { spec.counts() } else { Vec::new() };
            let displs = if me == root { Spec::gapped(&counts) } else { Vec::new() };
            either!(gatherv / igatherv(send, recv, &counts, &displs, root))
        }
        Kind::Scatterv => {
            let counts = if me == root { spec.counts() } else { Vec::new() };
            let displs = if me == root { Spec::gapped(&counts) } else { Vec::new() };
            either!(scatterv / iscatterv(send, &counts, &displs, recv, root))
        }
        Kind::SendRecv => {
            let tag = spec.count as i32 % 7;
            either!(sendrecv / isendrecv(send, (me + 1) % n, recv, (me + n - 1) % n, tag))
        }
        Kind::Barrier => {
            if nb {
                c.ibarrier().map(Some)
            } else {
                c.barrier().map(|()| None)
            }
        }
    }
}

/// Runs `ops` operations on the HostTransfer communicator `c` (number `comm`): in each batch,
/// the odd slots are non-blocking operations on the communicator's internal stream, whose
/// requests the communicator's stream waits for on the device (`stream_wait`) before the next
/// stream-ordered operation (the even slots) is queued behind them; then the requests are
/// waited for, the stream synchronized and every buffer checked.
pub fn ht(c: &Ht, dev: &HostDevice, comm: usize, first: usize, ops: usize) -> usize {
    let (me, n) = (c.rank(), c.size());
    let batches = ops.div_ceil(BATCH);
    let up = |v: &[u64]| dev.upload(v).expect("upload");
    for b in first..first + batches {
        let _batch = batch_case("HostTransfer", comm, b, n);
        let mut slots: Vec<DevSlot> = (0..BATCH)
            .map(|k| {
                let spec = Spec::new(comm, b, k, n);
                let (send, recv) = spec.inputs(me);
                DevSlot { spec, send: up(&send), recv: up(&recv) }
            })
            .collect();
        let fail = |e: duralumin::Error| -> ! { panic!("rank {me}: HostTransfer communicator {comm}, batch {b}: {e}") };
        {
            let mut requests = Vec::new();
            for (k, slot) in slots.iter_mut().enumerate() {
                if let Some(r) = start_ht(c, slot, k % 2 == 1).unwrap_or_else(|e| fail(e)) {
                    // Every other request is handed to the stream (the host does not wait for
                    // it); the rest are waited for on the host.
                    if k % 4 < 2 {
                        r.stream_wait(c.stream()).unwrap_or_else(|e| fail(e));
                    } else {
                        requests.push(r);
                    }
                }
            }
            for r in requests {
                r.wait().unwrap_or_else(|e| fail(e));
            }
        }
        c.synchronize().unwrap_or_else(|e| fail(e));
        for (k, slot) in slots.iter().enumerate() {
            let got = dev.download(&slot.recv).expect("download");
            check(&got, &slot.spec, me, &format!("HostTransfer communicator {comm}, batch {b} slot {k}"));
        }
    }
    batches
}
