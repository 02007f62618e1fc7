//! Operations and groups: what a collective or send/recv call leaves to run, the per-thread
//! group that gathers them between `ncclGroupStart` and the outermost `ncclGroupEnd`, and the
//! queuing of a communicator's operations on its stream as one unit.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::ffi::c_int;
use std::sync::Arc;

use super::comm::{Comm, State};
use super::faults::Injected;
use super::transport::Header;
use super::{Error, IN_PROGRESS, INVALID_USAGE, SUCCESS, UNHANDLED_CUDA, work};
use crate::exec::Stream;

/// The most operations one group may hold.
pub(crate) const MAX_GROUP_OPS: usize = 2048;

/// What an operation is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    AllReduce = 1,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    Send,
    Recv,
    /// NCCL 2.28 and later.
    AlltoAll,
    /// NCCL 2.28 and later.
    Gather,
    /// NCCL 2.28 and later.
    Scatter,
}

/// The version that added `ncclAlltoAll`, `ncclGather` and `ncclScatter`.
pub(crate) const EXCHANGES_SINCE: i32 = 22800;

impl Kind {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::AllReduce => "ncclAllReduce",
            Kind::Broadcast => "ncclBroadcast",
            Kind::Reduce => "ncclReduce",
            Kind::AllGather => "ncclAllGather",
            Kind::ReduceScatter => "ncclReduceScatter",
            Kind::Send => "ncclSend",
            Kind::Recv => "ncclRecv",
            Kind::AlltoAll => "ncclAlltoAll",
            Kind::Gather => "ncclGather",
            Kind::Scatter => "ncclScatter",
        }
    }

    /// The oldest NCCL version that has it.
    pub(crate) fn since(self) -> i32 {
        match self {
            Kind::AlltoAll | Kind::Gather | Kind::Scatter => EXCHANGES_SINCE,
            _ => 0,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<Kind> {
        [
            Kind::AllReduce,
            Kind::Broadcast,
            Kind::Reduce,
            Kind::AllGather,
            Kind::ReduceScatter,
            Kind::Send,
            Kind::Recv,
            Kind::AlltoAll,
            Kind::Gather,
            Kind::Scatter,
        ]
        .into_iter()
        .find(|k| *k as u32 == code)
    }

    /// Whether it takes a reduction operator.
    pub(crate) fn reduces(self) -> bool {
        matches!(self, Kind::AllReduce | Kind::Reduce | Kind::ReduceScatter)
    }

    /// Whether it has a root.
    pub(crate) fn rooted(self) -> bool {
        matches!(self, Kind::Broadcast | Kind::Reduce | Kind::Gather | Kind::Scatter)
    }

    pub(crate) fn p2p(self) -> bool {
        matches!(self, Kind::Send | Kind::Recv)
    }
}

/// One collective or send/recv, as called.
#[derive(Clone, Debug)]
pub(crate) struct Op {
    pub(crate) kind: Kind,
    pub(crate) send: usize,
    pub(crate) recv: usize,
    pub(crate) count: usize,
    pub(crate) dtype: c_int,
    pub(crate) redop: c_int,
    /// The root, or the peer of a send/recv.
    pub(crate) root: usize,
    /// The call's number on its communicator (messages).
    pub(crate) call: u64,
    pub(crate) fault: Option<Injected>,
    /// Set when queued: the collective's number on the communicator, or the send's (receive's)
    /// number to (from) its peer.
    pub(crate) seq: u64,
    /// Set when queued, for sends and receives: the group's number among those with a send to
    /// (receive from) the peer.
    pub(crate) group: u64,
}

impl Op {
    /// What frames of this operation say about it.
    pub(crate) fn header(&self) -> Header {
        Header {
            kind: self.kind as u32,
            count: self.count as u64,
            dtype: self.dtype,
            op: if self.kind.reduces() { self.redop } else { -1 },
            root: if self.kind.rooted() { i32::try_from(self.root).unwrap_or(i32::MAX) } else { -1 },
            group: self.group,
        }
    }
}

/// A communicator's operations of one group (or one call outside a group), queued together.
pub(crate) struct Unit {
    pub(crate) stream: Arc<Stream>,
    pub(crate) ops: Vec<Op>,
}

struct Grouped {
    comm: Arc<Comm>,
    stream: Arc<Stream>,
    op: Op,
}

#[derive(Default)]
struct Group {
    depth: usize,
    ops: Vec<Grouped>,
    /// The first failure of a call in the group: the group's operations are dropped.
    failed: Option<Error>,
}

thread_local! {
    static GROUP: RefCell<Group> = RefCell::default();
}

/// `ncclGroupStart`.
pub(crate) fn start() {
    GROUP.with_borrow_mut(|g| g.depth += 1);
}

/// Records a call's failure in the calling thread's group, if it is in one.
pub(crate) fn fail(e: &Error) {
    GROUP.with_borrow_mut(|g| {
        if g.depth > 0 && g.failed.is_none() {
            g.failed = Some(e.clone());
        }
    });
}

/// Takes an operation that passed its call-time checks: into the thread's group, or queued at
/// once (blocking communicator), or left for the next poll (non-blocking).
pub(crate) fn add(comm: &Arc<Comm>, stream: Arc<Stream>, op: Op) -> Result<c_int, Error> {
    let grouped = GROUP.with_borrow_mut(|g| {
        if g.depth == 0 {
            return Ok(None);
        }
        if let Some(e) = &g.failed {
            // Already reported: the group fails at its end.
            return Err(Error::new(e.code, String::new()));
        }
        if g.ops.len() >= MAX_GROUP_OPS {
            comm.set_async(INVALID_USAGE);
            let e = Error::usage(format!(
                "too many operations in a group: {} call {}: {} is operation {} of the group (at most {MAX_GROUP_OPS}); the group fails",
                comm.who(),
                op.call,
                op.kind.name(),
                g.ops.len() + 1
            ));
            g.failed = Some(e.clone());
            return Err(e);
        }
        let (comm, call) = (Arc::clone(comm), op.kind);
        g.ops.push(Grouped { comm, stream: Arc::clone(&stream), op: op.clone() });
        Ok(Some(call))
    })?;
    if grouped.is_some() {
        return Ok(SUCCESS);
    }
    let unit = Unit { stream, ops: vec![op] };
    if comm.blocking {
        enqueue(comm, unit)?;
        Ok(SUCCESS)
    } else {
        comm.defer(unit);
        Ok(IN_PROGRESS)
    }
}

/// `ncclGroupEnd`: at the outermost one, each communicator's operations go to its stream as
/// one unit (or to its next poll when it is non-blocking).
pub(crate) fn end() -> Result<c_int, Error> {
    let taken = GROUP.with_borrow_mut(|g| {
        if g.depth == 0 {
            return Err(Error::usage("ncclGroupEnd without ncclGroupStart".into()));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some((std::mem::take(&mut g.ops), g.failed.take())))
    })?;
    let Some((ops, failed)) = taken else { return Ok(SUCCESS) };
    if let Some(e) = failed {
        return Err(Error::new(
            e.code,
            format!("group failed: ncclGroupEnd dropped the group's {} operation(s): a call in it failed", ops.len()),
        ));
    }
    let mut units: Vec<(Arc<Comm>, Unit)> = Vec::new();
    for g in ops {
        match units.iter_mut().find(|(c, _)| Arc::ptr_eq(c, &g.comm)) {
            Some((c, unit)) => {
                if !Arc::ptr_eq(&unit.stream, &g.stream) {
                    c.set_async(INVALID_USAGE);
                    let first = &unit.ops[0];
                    return Err(Error::usage(format!(
                        "a group spans several streams: {}: {} (call {}) on stream {}, {} (call {}) on stream {}",
                        c.who(),
                        first.kind.name(),
                        first.call,
                        unit.stream.id,
                        g.op.kind.name(),
                        g.op.call,
                        g.stream.id
                    )));
                }
                unit.ops.push(g.op);
            }
            None => units.push((g.comm, Unit { stream: g.stream, ops: vec![g.op] })),
        }
    }
    let mut result = SUCCESS;
    for (comm, unit) in units {
        let _in = comm.enter("ncclGroupEnd")?;
        if comm.blocking {
            enqueue(&comm, unit)?;
        } else {
            comm.defer(unit);
            result = IN_PROGRESS;
        }
    }
    Ok(result)
}

/// Numbers a unit's operations: collectives on the communicator, sends and receives per peer,
/// and the unit among the groups each peer pair exchanged.
pub(crate) fn number(st: &mut State, mut unit: Unit) -> Unit {
    let (mut to, mut from) = (BTreeSet::new(), BTreeSet::new());
    for op in &mut unit.ops {
        let (count, groups, seen) = match op.kind {
            Kind::Send => (&mut st.sends, &mut st.send_groups, &mut to),
            Kind::Recv => (&mut st.recvs, &mut st.recv_groups, &mut from),
            _ => {
                st.colls += 1;
                op.seq = st.colls;
                continue;
            }
        };
        let g = groups.entry(op.root).or_insert(0);
        if seen.insert(op.root) {
            *g += 1;
        }
        op.group = *g;
        let n = count.entry(op.root).or_insert(0);
        *n += 1;
        op.seq = *n;
    }
    unit
}

/// Queues a numbered unit on its stream.
pub(crate) fn submit(comm: &Arc<Comm>, unit: Unit) -> Result<(), Error> {
    let what = match unit.ops.as_slice() {
        [one] => one.kind.name(),
        _ => "ncclGroupEnd",
    };
    let (work, c, stream) = (comm.work(), Arc::clone(comm), Arc::clone(&unit.stream));
    crate::api::submit(
        &stream,
        what,
        Box::new(move || {
            let _work = work;
            work::run(&c, &unit.ops)
        }),
    )
    .map_err(|f| {
        Error::new(UNHANDLED_CUDA, format!("cannot queue {what} on stream {}: {} ({:?})", stream.id, f.message, f.code))
    })
}

/// Numbers and queues a unit (a blocking communicator's).
pub(crate) fn enqueue(comm: &Arc<Comm>, unit: Unit) -> Result<(), Error> {
    let unit = number(&mut super::lock(&comm.state), unit);
    submit(comm, unit)
}
