//! Communicators: their handles, their state (asynchronous error, the operation a non-blocking
//! one has in progress, what has been numbered so far), the one-thread-at-a-time rule, and the
//! calls that make and end them (init, split, finalize, destroy, abort).

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use super::group::{self, Unit};
use super::transport::{Header, Key, Stop, Transport};
use super::{Error, IN_PROGRESS, INTERNAL, INVALID_USAGE, REMOTE, SUCCESS, SYSTEM, lock, report};
use crate::exec::STALL_REPORT;

/// A rank's place in its communicator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) rank: usize,
    pub(crate) nranks: usize,
}

/// Host-side work of a non-blocking call (an init or a split) running on a thread of its own.
#[derive(Default)]
pub(crate) struct Job {
    result: Mutex<Option<c_int>>,
}

/// What a non-blocking communicator has in progress.
enum Pending {
    /// Init or split: `polled` once `ncclCommGetAsyncError` has answered `ncclInProgress`;
    /// `must_poll` unless this is the parent of a split, which is free once the job is done.
    Job { job: Arc<Job>, polled: bool, must_poll: bool },
    /// Operations to queue on the stream at the next poll.
    Ops(Unit),
    /// Operations queued by a poll, with the result of queuing them.
    Queued(c_int),
    /// `ncclCommFinalize`: done once the communicator's queued work has run.
    Finalize { polled: bool },
}

/// What a communicator has seen so far.
#[derive(Default)]
pub(crate) struct State {
    pub(crate) async_error: c_int,
    pending: Option<Pending>,
    finalized: bool,
    /// Collective and send/recv calls made (numbers in messages).
    calls: u64,
    /// Collectives queued.
    pub(crate) colls: u64,
    /// Sends queued per receiving peer, receives per sending peer.
    pub(crate) sends: HashMap<usize, u64>,
    pub(crate) recvs: HashMap<usize, u64>,
    /// Groups (units) with a send to, a receive from, each peer.
    pub(crate) send_groups: HashMap<usize, u64>,
    pub(crate) recv_groups: HashMap<usize, u64>,
    /// `ncclCommSplit`s made.
    splits: u64,
}

/// A communicator: one rank's side of it.
pub(crate) struct Comm {
    /// Names the socket directory (from the unique id, or derived from the parent's by a split).
    id: u64,
    pub(crate) blocking: bool,
    /// The rank in the `ncclCommInitRank` communicator this one descends from (faults count by it).
    pub(crate) lineage_rank: usize,
    /// Set once known (a split learns it from its peers).
    layout: OnceLock<Layout>,
    transport: Mutex<Option<Arc<Transport>>>,
    pub(crate) state: Mutex<State>,
    /// The thread inside an API call on this communicator, and the call.
    user: Mutex<Option<(ThreadId, &'static str)>>,
    /// Units queued on streams that have not finished.
    outstanding: Mutex<usize>,
    drained: Condvar,
    aborted: AtomicBool,
}

static COMMS: Mutex<BTreeMap<usize, Arc<Comm>>> = Mutex::new(BTreeMap::new());

/// The live communicator of a handle.
pub(crate) fn get(h: *mut c_void) -> Result<Arc<Comm>, Error> {
    lock(&COMMS)
        .get(&(h as usize))
        .cloned()
        .ok_or_else(|| Error::argument(format!("invalid communicator: {:#x} is not a live ncclComm_t", h as usize)))
}

fn add(comm: &Arc<Comm>) -> *mut c_void {
    let h = comm.handle();
    lock(&COMMS).insert(h, Arc::clone(comm));
    h as *mut c_void
}

fn remove(h: usize) -> Option<Arc<Comm>> {
    lock(&COMMS).remove(&h)
}

/// How long initialization may wait for the other ranks: `NCCLSIM_INIT_TIMEOUT` seconds (60).
fn init_deadline() -> (Instant, u64) {
    let secs = std::env::var("NCCLSIM_INIT_TIMEOUT").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(60);
    (Instant::now() + Duration::from_secs(secs), secs)
}

/// Runs `f` on a thread of its own, its result (an `ncclResult_t`) going to `job`.
fn spawn(job: &Arc<Job>, f: impl FnOnce() -> c_int + Send + 'static) -> Result<(), Error> {
    let job = Arc::clone(job);
    std::thread::Builder::new()
        .name("ncclsim-init".into())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
                report("internal error: a non-blocking initialization panicked");
                INTERNAL
            });
            *lock(&job.result) = Some(r);
        })
        .map(drop)
        .map_err(|e| Error::system(format!("cannot start a thread: {e}")))
}

/// Ends an API call on a communicator (see [`Comm::enter`]).
pub(crate) struct Entered<'a> {
    comm: &'a Comm,
    owner: bool,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        if self.owner {
            *lock(&self.comm.user) = None;
        }
    }
}

/// Counts a unit of queued work as outstanding until dropped (run, skipped or never queued).
pub(crate) struct Work(Arc<Comm>);

impl Drop for Work {
    fn drop(&mut self) {
        *lock(&self.0.outstanding) -= 1;
        self.0.drained.notify_all();
    }
}

impl Comm {
    fn new(id: u64, blocking: bool, lineage_rank: usize, layout: Option<Layout>) -> Comm {
        let l = OnceLock::new();
        if let Some(layout) = layout {
            let _ = l.set(layout);
        }
        Comm {
            id,
            blocking,
            lineage_rank,
            layout: l,
            transport: Mutex::new(None),
            state: Mutex::default(),
            user: Mutex::new(None),
            outstanding: Mutex::new(0),
            drained: Condvar::new(),
            aborted: AtomicBool::new(false),
        }
    }

    /// The handle (`ncclComm_t`) of the communicator.
    pub(crate) fn handle(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    pub(crate) fn layout(&self) -> Option<Layout> {
        self.layout.get().copied()
    }

    /// "rank R comm C", for messages.
    pub(crate) fn who(&self) -> String {
        match self.layout() {
            Some(l) => format!("rank {} comm {:#x}", l.rank, self.handle()),
            None => format!("comm {:#x}", self.handle()),
        }
    }

    pub(crate) fn transport(&self) -> Option<Arc<Transport>> {
        lock(&self.transport).clone()
    }

    pub(crate) fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Acquire)
    }

    /// Whether work on the communicator should stop: aborted, or failed (a system or remote
    /// error: a peer may no longer take part).
    pub(crate) fn broken(&self) -> bool {
        self.aborted() || matches!(lock(&self.state).async_error, SYSTEM | REMOTE)
    }

    /// Sets the asynchronous error, unless one is set already.
    pub(crate) fn set_async(&self, code: c_int) {
        let mut st = lock(&self.state);
        if st.async_error == SUCCESS {
            st.async_error = code;
        }
    }

    /// Reports `message` on stderr and sets the asynchronous error `code` (stream work's checks).
    pub(crate) fn fail(&self, code: c_int, message: &str) {
        report(message);
        self.set_async(code);
    }

    /// The next collective or send/recv call's number on this communicator (from 1).
    pub(crate) fn next_call(&self) -> u64 {
        let mut st = lock(&self.state);
        st.calls += 1;
        st.calls
    }

    /// Marks the calling thread as inside `call` on this communicator; another thread already
    /// inside a call on it is reported and fails the call with `ncclInvalidUsage`.
    pub(crate) fn enter(&self, call: &'static str) -> Result<Entered<'_>, Error> {
        let me = std::thread::current().id();
        let mut user = lock(&self.user);
        match *user {
            Some((t, _)) if t == me => Ok(Entered { comm: self, owner: false }),
            Some((t, other)) => {
                drop(user);
                let calls = lock(&self.state).calls;
                self.set_async(INVALID_USAGE);
                Err(Error::usage(format!(
                    "a communicator used from two threads at once: {} after call {calls}: {call} on thread {me:?} while {other} runs on thread {t:?}",
                    self.who()
                )))
            }
            None => {
                *user = Some((me, call));
                Ok(Entered { comm: self, owner: true })
            }
        }
    }

    /// Settles a split parent's finished job (which needs no poll).
    fn settle(st: &mut State) {
        let done = match &st.pending {
            Some(Pending::Job { job, must_poll: false, .. }) => *lock(&job.result),
            _ => None,
        };
        if let Some(r) = done {
            st.pending = None;
            if st.async_error == SUCCESS {
                st.async_error = r;
            }
        }
    }

    /// Fails with `ncclInvalidUsage` while a non-blocking operation is in progress.
    fn not_in_progress(&self, call: &str) -> Result<(), Error> {
        let mut st = lock(&self.state);
        Self::settle(&mut st);
        if st.pending.is_some() {
            return Err(Error::usage(format!(
                "a non-blocking communicator used while an operation is in progress: {call} on {}: poll ncclCommGetAsyncError until it no longer returns ncclInProgress first",
                self.who()
            )));
        }
        Ok(())
    }

    /// Checks that the communicator can take `call`: not in progress, not finalized,
    /// initialized; its layout.
    pub(crate) fn ready(&self, call: &str) -> Result<Layout, Error> {
        self.not_in_progress(call)?;
        if lock(&self.state).finalized {
            return Err(Error::usage(format!("{call} on a finalized communicator: {}", self.who())));
        }
        match (self.layout(), self.transport()) {
            (Some(l), Some(_)) => Ok(l),
            _ => Err(Error::usage(format!("{call} on a communicator whose initialization failed: {}", self.who()))),
        }
    }

    /// Counts a unit of work as outstanding.
    pub(crate) fn work(self: &Arc<Self>) -> Work {
        *lock(&self.outstanding) += 1;
        Work(Arc::clone(self))
    }

    /// Waits until no queued work is outstanding, at most `limit`; a wait of [`STALL_REPORT`] is
    /// reported once. Whether everything finished.
    fn drain(&self, call: &str, limit: Option<Duration>) -> bool {
        let (start, mut reported) = (Instant::now(), false);
        let mut n = lock(&self.outstanding);
        while *n > 0 {
            if limit.is_some_and(|l| start.elapsed() >= l) {
                return false;
            }
            n = self.drained.wait_timeout(n, Duration::from_millis(20)).unwrap_or_else(|e| e.into_inner()).0;
            if !reported && start.elapsed() >= STALL_REPORT {
                reported = true;
                eprintln!(
                    "ncclsim: {} has waited {} s in {call} for its queued work: likely a hang",
                    self.who(),
                    STALL_REPORT.as_secs()
                );
            }
        }
        true
    }

    /// Leaves operations for the next poll (a non-blocking communicator).
    pub(crate) fn defer(&self, unit: Unit) {
        lock(&self.state).pending = Some(Pending::Ops(unit));
    }

    /// `ncclCommGetAsyncError`: moves a non-blocking operation on (answering `ncclInProgress`
    /// at least once) and then gives its result, or the asynchronous error.
    pub(crate) fn poll(self: &Arc<Self>) -> c_int {
        let mut st = lock(&self.state);
        let Some(pending) = st.pending.take() else { return st.async_error };
        let settle = |st: &mut State, r: c_int| {
            if r != SUCCESS && st.async_error == SUCCESS {
                st.async_error = r;
            }
            if r == SUCCESS { st.async_error } else { r }
        };
        match pending {
            Pending::Job { job, polled, must_poll } => {
                let done = *lock(&job.result);
                match done {
                    Some(r) if polled || !must_poll => settle(&mut st, r),
                    _ => {
                        st.pending = Some(Pending::Job { job, polled: true, must_poll });
                        IN_PROGRESS
                    }
                }
            }
            Pending::Ops(unit) => {
                let unit = group::number(&mut st, unit);
                drop(st);
                let r = match group::submit(self, unit) {
                    Ok(()) => SUCCESS,
                    Err(e) => {
                        report(&e.message);
                        e.code
                    }
                };
                lock(&self.state).pending = Some(Pending::Queued(r));
                IN_PROGRESS
            }
            Pending::Queued(r) => settle(&mut st, r),
            Pending::Finalize { polled } => {
                if polled && *lock(&self.outstanding) == 0 {
                    st.finalized = true;
                    st.async_error
                } else {
                    st.pending = Some(Pending::Finalize { polled: true });
                    IN_PROGRESS
                }
            }
        }
    }

    /// Connects the communicator's transport, unless it is aborted meanwhile.
    fn connect(&self, deadline: Instant, timeout: u64) -> Result<(), Error> {
        let l = self.layout().ok_or_else(|| Error::internal("a communicator without its layout".into()))?;
        let t = Transport::connect(self.id, l.rank, l.nranks, deadline, &|| self.aborted()).map_err(|e| {
            Error::system(format!(
                "initialization failed: rank {} of {} comm {:#x} (timeout {timeout} s): {e}",
                l.rank,
                l.nranks,
                self.handle()
            ))
        })?;
        let mut slot = lock(&self.transport);
        if self.aborted() {
            t.close();
            return Err(Error::system(format!("initialization aborted: {}", self.who())));
        }
        *slot = Some(Arc::new(t));
        Ok(())
    }
}

/// Writes `value` through a caller's out-pointer.
///
/// # Safety
/// `ptr` is null or valid for a write of `T`.
pub(crate) unsafe fn out<T>(ptr: *mut T, value: T) -> Result<c_int, Error> {
    if ptr.is_null() {
        return Err(Error::argument("a null output pointer".into()));
    }
    // SAFETY: non-null, and valid for the write by the caller's contract.
    unsafe { ptr.write(value) };
    Ok(SUCCESS)
}

/// `ncclCommInitRank(Config)`: rank `rank` of `nranks` of the communicator `id`, blocking
/// unless `blocking` is `Some(false)`.
///
/// # Safety
/// `out` is null or valid for a write.
pub(crate) unsafe fn init(
    out_comm: *mut *mut c_void,
    nranks: c_int,
    id: u64,
    rank: c_int,
    blocking: Option<bool>,
) -> Result<c_int, Error> {
    if out_comm.is_null() {
        return Err(Error::argument("ncclCommInitRank with a null communicator pointer".into()));
    }
    let n = usize::try_from(nranks).ok().filter(|&n| n > 0);
    let (n, r) = match (n, usize::try_from(rank)) {
        (Some(n), Ok(r)) if r < n => (n, r),
        _ => return Err(Error::argument(format!("ncclCommInitRank: rank {rank} of {nranks} ranks"))),
    };
    let blocking = blocking.unwrap_or(true);
    let comm = Arc::new(Comm::new(id, blocking, r, Some(Layout { rank: r, nranks: n })));
    let (deadline, timeout) = init_deadline();
    if blocking {
        comm.connect(deadline, timeout)?;
        // SAFETY: the caller's out-pointer (non-null, checked).
        return unsafe { out(out_comm, add(&comm)) };
    }
    let job = Arc::new(Job::default());
    lock(&comm.state).pending = Some(Pending::Job { job: Arc::clone(&job), polled: false, must_poll: true });
    let h = add(&comm);
    let c = Arc::clone(&comm);
    spawn(&job, move || match c.connect(deadline, timeout) {
        Ok(()) => SUCCESS,
        Err(e) => {
            report(&e.message);
            e.code
        }
    })?;
    // SAFETY: the caller's out-pointer (non-null, checked).
    unsafe { out(out_comm, h) }?;
    Ok(IN_PROGRESS)
}

/// FNV-1a over `bytes`: ids derived the same way in every process.
pub(crate) fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The colors and keys of all ranks of `parent` (a host-side all-gather on its transport).
fn exchange(parent: &Comm, seq: u64, color: c_int, key: c_int) -> Result<Vec<(c_int, c_int)>, Error> {
    let (Some(l), Some(t)) = (parent.layout(), parent.transport()) else {
        return Err(Error::usage(format!("ncclCommSplit of an uninitialized communicator: {}", parent.who())));
    };
    let mut mine = color.to_le_bytes().to_vec();
    mine.extend_from_slice(&key.to_le_bytes());
    let header = Header { kind: 100, ..Header::default() };
    for p in (0..l.nranks).filter(|&p| p != l.rank) {
        t.send(p, Key::Split(seq), &header, &mine)
            .map_err(|e| Error::new(REMOTE, format!("ncclCommSplit: {} split {seq}: {e}", parent.who())))?;
    }
    let mut all = Vec::with_capacity(l.nranks);
    for p in 0..l.nranks {
        if p == l.rank {
            all.push((color, key));
            continue;
        }
        let waiting = || format!("{} has waited 20 s in ncclCommSplit (split {seq}) for rank {p}", parent.who());
        let f = t.inbox.take(p, Key::Split(seq), &waiting).map_err(|stop| match stop {
            Stop::Aborted => Error::usage(format!("ncclCommSplit: {} was aborted", parent.who())),
            Stop::Closed => {
                Error::new(REMOTE, format!("ncclCommSplit: {}: rank {p} closed its connection", parent.who()))
            }
        })?;
        let word = |at: usize| f.payload.get(at..at + 4).and_then(|w| w.try_into().ok()).map(c_int::from_le_bytes);
        match (word(0), word(4)) {
            (Some(c), Some(k)) => all.push((c, k)),
            _ => return Err(Error::internal(format!("ncclCommSplit: a malformed frame from rank {p}"))),
        }
    }
    Ok(all)
}

/// The split proper: exchange, then the child's layout and transport.
fn split_job(parent: &Comm, child: Option<&Comm>, seq: u64, color: c_int, key: c_int) -> Result<(), Error> {
    let (deadline, timeout) = init_deadline();
    let all = exchange(parent, seq, color, key)?;
    let Some(child) = child else { return Ok(()) };
    let mut members: Vec<(c_int, usize)> =
        all.iter().enumerate().filter(|(_, (c, _))| *c == color).map(|(r, (_, k))| (*k, r)).collect();
    members.sort_unstable();
    let me = parent.layout().map(|l| l.rank);
    let rank = members
        .iter()
        .position(|&(_, r)| Some(r) == me)
        .ok_or_else(|| Error::internal("split: not a member".into()))?;
    let _ = child.layout.set(Layout { rank, nranks: members.len() });
    child.connect(deadline, timeout)
}

/// `ncclCommSplit`. Non-blocking, it does what NCCL 2.28 does: the call returns
/// `ncclSuccess` (its group's `ncclInProgress` is not passed on) with `*newcomm` still null,
/// and the split's own thread writes the new handle as it finishes, before the parent's
/// `ncclCommGetAsyncError` stops answering `ncclInProgress`. A caller that reads the handle
/// at once gets null, and one whose slot is gone by then has its memory written.
///
/// # Safety
/// `newcomm` is null or valid for a write, non-blocking until the parent's poll reports the
/// split complete.
pub(crate) unsafe fn split(
    parent: &Arc<Comm>,
    color: c_int,
    key: c_int,
    newcomm: *mut *mut c_void,
    blocking: Option<bool>,
) -> Result<c_int, Error> {
    const NOCOLOR: c_int = -1;
    if newcomm.is_null() {
        return Err(Error::argument("ncclCommSplit with a null newcomm pointer".into()));
    }
    if color < NOCOLOR {
        return Err(Error::argument(format!("ncclCommSplit: color {color} (not >= 0 nor NCCL_SPLIT_NOCOLOR)")));
    }
    let _in = parent.enter("ncclCommSplit")?;
    parent.ready("ncclCommSplit")?;
    let seq = {
        let mut st = lock(&parent.state);
        st.splits += 1;
        st.splits
    };
    let blocking = blocking.unwrap_or(parent.blocking);
    let mut seed = parent.id.to_le_bytes().to_vec();
    seed.extend_from_slice(&seq.to_le_bytes());
    seed.extend_from_slice(&color.to_le_bytes());
    let child = (color != NOCOLOR).then(|| Arc::new(Comm::new(fnv(&seed), blocking, parent.lineage_rank, None)));
    if blocking {
        split_job(parent, child.as_deref(), seq, color, key)?;
        let h = child.as_ref().map_or(std::ptr::null_mut(), add);
        // SAFETY: the caller's out-pointer (non-null, checked).
        return unsafe { out(newcomm, h) };
    }
    let job = Arc::new(Job::default());
    lock(&parent.state).pending = Some(Pending::Job { job: Arc::clone(&job), polled: false, must_poll: false });
    let h = match &child {
        Some(c) => {
            lock(&c.state).pending = Some(Pending::Job { job: Arc::clone(&job), polled: false, must_poll: true });
            add(c)
        }
        None => std::ptr::null_mut(),
    };
    let (p, c) = (Arc::clone(parent), child.clone());
    // SAFETY: the caller's out-pointer (non-null, checked).
    unsafe { out(newcomm, std::ptr::null_mut()) }?;
    // The address crosses to the split's thread as an integer (raw pointers are not `Send`).
    let (slot, handle) = (newcomm as usize, h as usize);
    spawn(&job, move || match split_job(&p, c.as_deref(), seq, color, key) {
        Ok(()) => {
            // SAFETY: valid for a write until the parent's poll reports this job done (the
            // caller's contract); the job's result is published after this write.
            unsafe { (slot as *mut *mut c_void).write(handle as *mut c_void) };
            SUCCESS
        }
        Err(e) => {
            report(&e.message);
            e.code
        }
    })?;
    Ok(SUCCESS)
}

/// `ncclCommFinalize`: waits for (blocking) or leaves to polls (non-blocking) the
/// communicator's queued work.
pub(crate) fn finalize(comm: &Arc<Comm>) -> Result<c_int, Error> {
    let _in = comm.enter("ncclCommFinalize")?;
    comm.ready("ncclCommFinalize")?;
    if comm.blocking {
        comm.drain("ncclCommFinalize", None);
        let mut st = lock(&comm.state);
        st.finalized = true;
        return Ok(SUCCESS);
    }
    lock(&comm.state).pending = Some(Pending::Finalize { polled: false });
    Ok(IN_PROGRESS)
}

/// `ncclCommDestroy`: waits for the queued work, reports frames never received, closes.
pub(crate) fn destroy(h: *mut c_void) -> Result<c_int, Error> {
    let comm = get(h)?;
    {
        let _in = comm.enter("ncclCommDestroy")?;
        comm.not_in_progress("ncclCommDestroy")?;
        comm.drain("ncclCommDestroy", None);
        if let Some(t) = comm.transport() {
            let left = t.inbox.leftovers();
            if !left.is_empty() && lock(&comm.state).async_error == SUCCESS {
                let list: Vec<String> = left
                    .iter()
                    .take(8)
                    .map(|(p, k)| match k {
                        Key::Coll(n) => format!("rank {p}'s collective {n}"),
                        Key::P2p(n) => format!("rank {p}'s send {n} to it"),
                        Key::Split(n) => format!("rank {p}'s split {n}"),
                    })
                    .collect();
                report(&format!(
                    "operations never matched: {} destroyed with {} message(s) from peers never received: {}",
                    comm.who(),
                    left.len(),
                    list.join(", ")
                ));
            }
        }
    }
    remove(h as usize);
    if let Some(t) = lock(&comm.transport).take() {
        t.close();
    }
    Ok(SUCCESS)
}

/// `ncclCommAbort`: ends the communicator's blocked work (outputs left as they are), closes its
/// connections (peers' waits end with `ncclRemoteError`) and frees it, within about a second.
pub(crate) fn abort(h: *mut c_void) -> Result<c_int, Error> {
    let comm = remove(h as usize)
        .ok_or_else(|| Error::argument(format!("ncclCommAbort: {:#x} is not a live ncclComm_t", h as usize)))?;
    comm.aborted.store(true, Ordering::Release);
    if let Some(t) = lock(&comm.transport).take() {
        t.inbox.abort();
        t.close();
    }
    lock(&comm.state).pending = None;
    // Work already running ends at once; work still queued behind other work ends when it runs.
    comm.drain("ncclCommAbort", Some(Duration::from_secs(1)));
    Ok(SUCCESS)
}
