//! The flight recorder: the last operations of a communicator, what they were and how far they
//! got, kept in a fixed ring so its memory is bounded whatever the program does.
//!
//! Every operation is recorded by its [`Signature`] (what every rank must agree on, plus what
//! identifies it to a reader: names, algorithm), its sequence number (collectives and
//! point-to-point operations are numbered apart: a collective's number is the same on every
//! rank, a point-to-point one only means something to its pair), its [`State`] and three
//! times. A [`Snapshot`] of the recorder is what a rank sends to the others when one of them
//! times out (see `docs/reliability.md`).

use std::time::Duration;

use duralumin_kernels::{Element, ReduceOp};

/// A coarse monotonic time in nanoseconds (`CLOCK_MONOTONIC_COARSE`: a few nanoseconds to
/// read, a few milliseconds of resolution, which is plenty for deadlines of seconds).
pub(crate) type Tick = u64;

/// The current [`Tick`].
pub(crate) fn now() -> Tick {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid timespec to write; the clock id is a constant Linux knows.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    // The monotonic clock is never negative.
    let (secs, nanos) = (u64::try_from(ts.tv_sec).unwrap_or(0), u64::try_from(ts.tv_nsec).unwrap_or(0));
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// `d` in ticks (nanoseconds), saturating.
pub(crate) fn nanos(d: Duration) -> Tick {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Whether something begun at `since` with `deadline` (`None`: none) is past it at `now`.
pub(crate) fn past(deadline: Option<Duration>, since: Tick, now: Tick) -> bool {
    deadline.is_some_and(|d| now.saturating_sub(since) > nanos(d))
}

/// Seconds between two ticks, for messages.
pub(crate) fn secs(from: Tick, to: Tick) -> f64 {
    to.saturating_sub(from) as f64 / 1e9
}

/// The operations of every backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub(crate) enum OpKind {
    Barrier = 1,
    Bcast,
    Allreduce,
    Reduce,
    Allgather,
    Allgatherv,
    Alltoall,
    Alltoallv,
    Gather,
    Gatherv,
    Scatter,
    Scatterv,
    ReduceScatter,
    ReduceScatterv,
    Send,
    Recv,
    SendRecv,
    MultiSendRecv,
    Dup,
    Split,
    /// Dropping a communicator whose shared-memory window is freed (`MPI_Win_free`, which
    /// waits for every rank of the node).
    Drop,
}

impl OpKind {
    pub(crate) const ALL: [OpKind; 21] = [
        OpKind::Barrier,
        OpKind::Bcast,
        OpKind::Allreduce,
        OpKind::Reduce,
        OpKind::Allgather,
        OpKind::Allgatherv,
        OpKind::Alltoall,
        OpKind::Alltoallv,
        OpKind::Gather,
        OpKind::Gatherv,
        OpKind::Scatter,
        OpKind::Scatterv,
        OpKind::ReduceScatter,
        OpKind::ReduceScatterv,
        OpKind::Send,
        OpKind::Recv,
        OpKind::SendRecv,
        OpKind::MultiSendRecv,
        OpKind::Dup,
        OpKind::Split,
        OpKind::Drop,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            OpKind::Barrier => "barrier",
            OpKind::Bcast => "bcast",
            OpKind::Allreduce => "allreduce",
            OpKind::Reduce => "reduce",
            OpKind::Allgather => "allgather",
            OpKind::Allgatherv => "allgatherv",
            OpKind::Alltoall => "alltoall",
            OpKind::Alltoallv => "alltoallv",
            OpKind::Gather => "gather",
            OpKind::Gatherv => "gatherv",
            OpKind::Scatter => "scatter",
            OpKind::Scatterv => "scatterv",
            OpKind::ReduceScatter => "reduce_scatter",
            OpKind::ReduceScatterv => "reduce_scatterv",
            OpKind::Send => "send",
            OpKind::Recv => "recv",
            OpKind::SendRecv => "sendrecv",
            OpKind::MultiSendRecv => "multi_sendrecv",
            OpKind::Dup => "dup",
            OpKind::Split => "split",
            OpKind::Drop => "drop",
        }
    }

    fn from_u8(v: u8) -> Option<OpKind> {
        OpKind::ALL.iter().copied().find(|k| *k as u8 == v)
    }

    /// Whether every rank takes part (and so numbers it alike).
    pub(crate) fn is_collective(self) -> bool {
        !matches!(self, OpKind::Send | OpKind::Recv | OpKind::SendRecv | OpKind::MultiSendRecv)
    }

    /// Whether the operation has a root that every rank must name alike.
    pub(crate) fn has_root(self) -> bool {
        matches!(
            self,
            OpKind::Bcast | OpKind::Reduce | OpKind::Gather | OpKind::Gatherv | OpKind::Scatter | OpKind::Scatterv
        )
    }

    /// Whether [`Signature::count`] must be equal on every rank (the v-collectives compare a
    /// digest of their counts instead, or, where counts are per pair, check them pairwise).
    pub(crate) fn common_count(self) -> bool {
        self.is_collective() && !matches!(self, OpKind::Gatherv | OpKind::Scatterv | OpKind::Alltoallv)
    }

    /// Whether [`Signature::digest`] (of the counts vector) must be equal on every rank.
    pub(crate) fn common_digest(self) -> bool {
        matches!(self, OpKind::Allgatherv | OpKind::ReduceScatterv)
    }
}

/// What an operation is: what every rank must agree on for a collective, and what tells a
/// reader which call it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Signature {
    pub(crate) kind: OpKind,
    /// `Element::NAME` (empty for a barrier).
    pub(crate) elem: &'static str,
    pub(crate) elem_size: u32,
    /// `ReduceOp::NAME` (empty for operations that do not reduce).
    pub(crate) operator: &'static str,
    /// The element count every rank must agree on (see [`OpKind::common_count`]): the whole
    /// buffer of an allreduce or bcast, one rank's block of a gather or allgather, the total of
    /// a v-collective; a point-to-point operation's own message length.
    pub(crate) count: u64,
    /// A digest of the counts vector of allgatherv and reduce_scatterv (equal counts on every
    /// rank); a point-to-point operation's tag.
    pub(crate) digest: u64,
    /// The root, or a point-to-point operation's peer.
    pub(crate) root: Option<u32>,
    /// The algorithm asked for (`auto` unless forced).
    pub(crate) algorithm: &'static str,
    pub(crate) in_place: bool,
}

impl Signature {
    pub(crate) fn new(kind: OpKind) -> Signature {
        Signature {
            kind,
            elem: "",
            elem_size: 0,
            operator: "",
            count: 0,
            digest: 0,
            root: None,
            algorithm: "auto",
            in_place: false,
        }
    }

    pub(crate) fn elem<T: Element>(self) -> Signature {
        Signature { elem: T::NAME, elem_size: u32::try_from(size_of::<T>()).unwrap_or(u32::MAX), ..self }
    }

    pub(crate) fn reduce<T: Element, O: ReduceOp<T>>(self) -> Signature {
        Signature { operator: O::NAME, ..self.elem::<T>() }
    }

    pub(crate) fn count(self, count: usize) -> Signature {
        Signature { count: count as u64, ..self }
    }

    /// The count of a rooted in-place call on `len` elements made by rank `me` of `n`: one
    /// rank's block (the root's buffer holds every rank's block).
    pub(crate) fn block_count(self, len: usize, me: usize, root: usize, n: usize) -> Signature {
        self.count(if me == root { len / n.max(1) } else { len })
    }

    pub(crate) fn root(self, root: usize) -> Signature {
        Signature { root: Some(u32::try_from(root).unwrap_or(u32::MAX)), ..self }
    }

    /// Equal counts on every rank: the total as the count and a digest of the vector.
    pub(crate) fn counts(self, counts: &[usize]) -> Signature {
        let total = counts.iter().fold(0u64, |a, &c| a.saturating_add(c as u64));
        Signature { count: total, digest: digest(counts), ..self }
    }

    pub(crate) fn tag(self, tag: i32) -> Signature {
        // The tag's bits: an invalid, negative one differs from every valid one too.
        Signature { digest: u64::from(u32::from_ne_bytes(tag.to_ne_bytes())), ..self }
    }

    pub(crate) fn algorithm(self, name: &'static str) -> Signature {
        Signature { algorithm: name, ..self }
    }

    pub(crate) fn in_place(self) -> Signature {
        Signature { in_place: true, ..self }
    }

    /// A hash of what every rank of a collective must agree on: the fields the desync report
    /// compares (`report::key`), so it is the same on every rank of a correct program and, but
    /// for a collision, differs where two ranks' calls differ. Duralumin's algorithms carry it in
    /// their message tags (`transport::tag`), so the messages of calls that differ never match.
    pub(crate) fn agreement_hash(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        // FxHash: no random state, so every rank (of one architecture) computes the same value.
        let mut h = rustc_hash::FxHasher::default();
        (self.kind as u8).hash(&mut h);
        (self.elem, self.elem_size, self.operator, self.algorithm).hash(&mut h);
        self.root.filter(|_| self.kind.has_root()).hash(&mut h);
        (if self.kind.common_count() { self.count } else { u64::MAX }).hash(&mut h);
        (if self.kind.common_digest() { self.digest } else { 0 }).hash(&mut h);
        h.finish()
    }
}

/// FNV-1a over the counts: equal vectors give equal digests on every rank.
fn digest(counts: &[usize]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &c in counts {
        for b in (c as u64).to_le_bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// How far an operation got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum State {
    /// Stream-ordered and queued: its stream has not reached it yet (HostTransfer).
    Queued = 1,
    /// This rank is in it: the deadline runs.
    Running,
    Done,
    /// It ended with an error.
    Failed,
    /// Its arguments were refused on this rank before anything was sent.
    Rejected,
    /// Given up when the communicator was aborted.
    Abandoned,
}

impl State {
    fn from_u8(v: u8) -> Option<State> {
        [State::Queued, State::Running, State::Done, State::Failed, State::Rejected, State::Abandoned]
            .into_iter()
            .find(|s| *s as u8 == v)
    }

    pub(crate) fn is_finished(self) -> bool {
        !matches!(self, State::Queued | State::Running)
    }
}

/// One recorded operation.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// Insertion number (identifies the record while it is updated).
    id: u64,
    /// The collective or point-to-point sequence number (see the module docs), from 1.
    pub(crate) seq: u64,
    pub(crate) sig: Signature,
    pub(crate) state: State,
    pub(crate) enqueued: Tick,
    /// When this rank entered it (the MPI part started), 0 before.
    pub(crate) started: Tick,
    pub(crate) ended: Tick,
    /// Its deadline: the communicator's when it was called (a later change applies to later
    /// operations only).
    pub(crate) deadline: Option<Duration>,
    /// The error of a rejected or failed operation.
    pub(crate) note: Option<Box<str>>,
}

impl Record {
    /// The record's insertion number.
    pub(crate) fn id(&self) -> u64 {
        self.id
    }
}

/// Where a record is, to update it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RecordId {
    slot: usize,
    id: u64,
}

impl RecordId {
    /// The record's insertion number.
    pub(crate) fn id(self) -> u64 {
        self.id
    }
}

/// The ring of the last `cap` operations. An unfinished operation is never lost: when the ring
/// comes round to it, it moves aside until it finishes (so the memory is bounded by `cap`
/// plus the operations in flight, which hold far more memory themselves). The last one set
/// aside that failed is kept after it: its fault is reported after it ended.
#[derive(Debug)]
pub(crate) struct Recorder {
    ring: Vec<Record>,
    cap: usize,
    next_id: u64,
    aside: Vec<Record>,
    failed_aside: Option<Record>,
}

/// The default number of operations a recorder keeps; `DURALUMIN_RECORDER_OPS` sets another
/// (8 to 4096).
pub(crate) const DEFAULT_OPS: usize = 64;

impl Recorder {
    pub(crate) fn new(cap: usize) -> Recorder {
        let cap = cap.clamp(8, 4096);
        Recorder { ring: Vec::with_capacity(cap), cap, next_id: 0, aside: Vec::new(), failed_aside: None }
    }

    pub(crate) fn push(
        &mut self,
        seq: u64,
        sig: Signature,
        state: State,
        at: Tick,
        deadline: Option<Duration>,
    ) -> RecordId {
        let id = self.next_id;
        self.next_id += 1;
        let started = if state == State::Running { at } else { 0 };
        let rec = Record { id, seq, sig, state, enqueued: at, started, ended: 0, deadline, note: None };
        #[allow(clippy::cast_possible_truncation, reason = "the remainder is below `cap`, a usize")]
        let slot = (id % self.cap as u64) as usize;
        if slot == self.ring.len() {
            self.ring.push(rec);
        } else {
            let old = std::mem::replace(&mut self.ring[slot], rec);
            if !old.state.is_finished() {
                self.aside.push(old);
            }
        }
        RecordId { slot, id }
    }

    pub(crate) fn get_mut(&mut self, at: RecordId) -> Option<&mut Record> {
        match self.ring.get_mut(at.slot) {
            Some(r) if r.id == at.id => Some(r),
            _ => self.aside.iter_mut().chain(&mut self.failed_aside).find(|r| r.id == at.id),
        }
    }

    /// Updates a record's state (and `note`); a finished record leaves the aside list.
    pub(crate) fn set(&mut self, at: RecordId, state: State, when: Tick, note: Option<String>) {
        if let Some(r) = self.get_mut(at) {
            r.state = state;
            match state {
                State::Running => r.started = when,
                State::Queued => {}
                _ => r.ended = when,
            }
            if note.is_some() {
                r.note = note.map(|n| clip(&n, 160).into());
            }
        }
        if state.is_finished()
            && let Some(i) = self.aside.iter().position(|r| r.id == at.id)
        {
            let r = self.aside.remove(i);
            if state == State::Failed {
                self.failed_aside = Some(r);
            }
        }
    }

    /// Records oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Record> {
        #[allow(clippy::cast_possible_truncation, reason = "the remainder is below `cap`, a usize")]
        let split = if self.ring.len() < self.cap { 0 } else { (self.next_id % self.cap as u64) as usize };
        let older = self.failed_aside.iter().chain(&self.aside);
        older.chain(self.ring[split..].iter()).chain(self.ring[..split].iter())
    }

    /// The operation that has been running longest past its own deadline at `now`, if any has,
    /// but `skip` (the insertion number of one already reported).
    pub(crate) fn oldest_late(&self, now: Tick, skip: Option<u64>) -> Option<&Record> {
        self.iter()
            .filter(|r| r.state == State::Running && Some(r.id) != skip)
            .filter(|r| past(r.deadline, r.started, now))
            .min_by_key(|r| r.started)
    }

    /// Operations queued or running.
    pub(crate) fn unfinished(&self) -> usize {
        self.iter().filter(|r| !r.state.is_finished()).count()
    }

    /// Every state to [`State::Abandoned`] that is not finished.
    pub(crate) fn abandon_unfinished(&mut self, when: Tick) {
        for r in self.ring.iter_mut().chain(self.aside.iter_mut()) {
            if !r.state.is_finished() {
                r.state = State::Abandoned;
                r.ended = when;
            }
        }
        self.aside.clear();
    }
}

/// `s` cut to at most `max` bytes on a character boundary.
pub(crate) fn clip(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A record as another rank sees it (names owned, since they came over the wire).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct RecordView {
    pub(crate) seq: u64,
    pub(crate) kind: OpKind,
    pub(crate) elem: String,
    pub(crate) elem_size: u32,
    pub(crate) operator: String,
    pub(crate) count: u64,
    pub(crate) digest: u64,
    pub(crate) root: Option<u32>,
    pub(crate) algorithm: String,
    pub(crate) in_place: bool,
    pub(crate) state: State,
    /// Seconds before the snapshot was taken (`None`: not reached yet).
    pub(crate) enqueued_ago: Option<f64>,
    pub(crate) started_ago: Option<f64>,
    pub(crate) ended_ago: Option<f64>,
    pub(crate) note: String,
}

impl RecordView {
    pub(crate) fn of(r: &Record, now: Tick) -> RecordView {
        let ago = |t: Tick| (t != 0).then(|| secs(t, now));
        RecordView {
            seq: r.seq,
            kind: r.sig.kind,
            elem: r.sig.elem.into(),
            elem_size: r.sig.elem_size,
            operator: r.sig.operator.into(),
            count: r.sig.count,
            digest: r.sig.digest,
            root: r.sig.root,
            algorithm: r.sig.algorithm.into(),
            in_place: r.sig.in_place,
            state: r.state,
            enqueued_ago: ago(r.enqueued),
            started_ago: ago(r.started),
            ended_ago: ago(r.ended),
            note: r.note.as_deref().unwrap_or("").into(),
        }
    }
}

/// A thread's wait on the communicator (a synchronize, a request's wait), as reported.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WaitView {
    pub(crate) what: String,
    pub(crate) ago: f64,
}

/// What one rank tells the others about a communicator.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Snapshot {
    pub(crate) rank: u32,
    /// The next collective sequence number (so `next_seq - 1` is the last one it started).
    pub(crate) next_seq: u64,
    pub(crate) next_p2p: u64,
    pub(crate) poisoned: bool,
    /// Seconds since its last operation began or ended (how long it has been outside
    /// Duralumin, when nothing is in flight).
    pub(crate) idle: f64,
    pub(crate) waits: Vec<WaitView>,
    /// Oldest first.
    pub(crate) records: Vec<RecordView>,
}

/// The little-endian byte encoding of snapshots, for the exchange over MPI.
mod wire {
    pub(super) struct Writer(pub(super) Vec<u8>);

    impl Writer {
        pub(super) fn u8(&mut self, v: u8) {
            self.0.push(v);
        }
        pub(super) fn u32(&mut self, v: u32) {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
        pub(super) fn u64(&mut self, v: u64) {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
        pub(super) fn f64(&mut self, v: f64) {
            self.u64(v.to_bits());
        }
        pub(super) fn opt_f64(&mut self, v: Option<f64>) {
            self.f64(v.unwrap_or(-1.0));
        }
        pub(super) fn str(&mut self, s: &str) {
            let s = super::clip(s, 255);
            self.u8(u8::try_from(s.len()).unwrap_or(u8::MAX));
            self.0.extend_from_slice(s.as_bytes());
        }
    }

    pub(super) struct Reader<'a>(pub(super) &'a [u8]);

    impl Reader<'_> {
        fn take(&mut self, n: usize) -> Option<&[u8]> {
            if self.0.len() < n {
                return None;
            }
            let (head, tail) = self.0.split_at(n);
            self.0 = tail;
            Some(head)
        }
        pub(super) fn u8(&mut self) -> Option<u8> {
            self.take(1).map(|b| b[0])
        }
        pub(super) fn u32(&mut self) -> Option<u32> {
            self.take(4).map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
        }
        pub(super) fn u64(&mut self) -> Option<u64> {
            self.take(8).map(|b| u64::from_le_bytes(b.try_into().unwrap_or_default()))
        }
        pub(super) fn f64(&mut self) -> Option<f64> {
            self.u64().map(f64::from_bits)
        }
        pub(super) fn opt_f64(&mut self) -> Option<Option<f64>> {
            self.f64().map(|v| (v >= 0.0).then_some(v))
        }
        pub(super) fn str(&mut self) -> Option<String> {
            let n = usize::from(self.u8()?);
            self.take(n).map(|b| String::from_utf8_lossy(b).into_owned())
        }
        /// A count of items of at least `min_bytes` each: `None` above `max`, or above what
        /// the bytes left can hold (so a short message never sizes a large allocation).
        pub(super) fn count(&mut self, max: usize, min_bytes: usize) -> Option<usize> {
            let n = usize::try_from(self.u32()?).ok()?;
            (n <= max && n.saturating_mul(min_bytes) <= self.0.len()).then_some(n)
        }
    }
}

/// Encoding version (first byte) of a snapshot and of a record sent alone
/// ([`RecordView::encode`]), so a mismatch between builds reads as "no answer" (or no record)
/// rather than garbage.
const WIRE_VERSION: u8 = 1;

/// The most waits a snapshot carries (one per thread blocked on the communicator).
const MAX_WAITS: usize = 1024;

/// The most records a snapshot carries (the ring's, at most 4096, and the unfinished ones).
const MAX_RECORDS: usize = 1 << 16;

impl WaitView {
    /// The fewest bytes one takes on the wire: an empty name and its time.
    const MIN_BYTES: usize = 1 + 8;
}

impl RecordView {
    /// The fewest bytes one takes on the wire: its numbers, with empty names and no times.
    const MIN_BYTES: usize = 8 + 1 + 1 + 4 + 1 + 8 + 8 + 8 + 1 + 1 + 1 + 3 * 8 + 1;
}

impl Snapshot {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = wire::Writer(Vec::with_capacity(64 + self.records.len() * 96));
        w.u8(WIRE_VERSION);
        w.u32(self.rank);
        w.u64(self.next_seq);
        w.u64(self.next_p2p);
        w.u8(u8::from(self.poisoned));
        w.f64(self.idle);
        // At most what `decode` takes: a snapshot beyond it says less, never something else.
        let waits = &self.waits[..self.waits.len().min(MAX_WAITS)];
        w.u32(u32::try_from(waits.len()).unwrap_or(0));
        for wait in waits {
            w.str(&wait.what);
            w.f64(wait.ago);
        }
        let records = &self.records[..self.records.len().min(MAX_RECORDS)];
        w.u32(u32::try_from(records.len()).unwrap_or(0));
        for r in records {
            r.write(&mut w);
        }
        w.0
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<Snapshot> {
        let mut r = wire::Reader(bytes);
        if r.u8()? != WIRE_VERSION {
            return None;
        }
        let rank = r.u32()?;
        let next_seq = r.u64()?;
        let next_p2p = r.u64()?;
        let poisoned = r.u8()? != 0;
        let idle = r.f64()?;
        let waits = (0..r.count(MAX_WAITS, WaitView::MIN_BYTES)?)
            .map(|_| Some(WaitView { what: r.str()?, ago: r.f64()? }))
            .collect::<Option<Vec<_>>>()?;
        let n = r.count(MAX_RECORDS, RecordView::MIN_BYTES)?;
        let mut records = Vec::with_capacity(n);
        for _ in 0..n {
            records.push(RecordView::read(&mut r)?);
        }
        r.0.is_empty().then_some(Snapshot { rank, next_seq, next_p2p, poisoned, idle, waits, records })
    }
}

impl RecordView {
    /// Call `seq` of signature `sig`, as a report shows a call being made (running, no times).
    pub(crate) fn of_call(seq: u64, sig: &Signature) -> RecordView {
        RecordView {
            seq,
            kind: sig.kind,
            elem: sig.elem.into(),
            elem_size: sig.elem_size,
            operator: sig.operator.into(),
            count: sig.count,
            digest: sig.digest,
            root: sig.root,
            algorithm: sig.algorithm.into(),
            in_place: sig.in_place,
            state: State::Running,
            enqueued_ago: None,
            started_ago: None,
            ended_ago: None,
            note: String::new(),
        }
    }

    /// One record alone, versioned like a snapshot: what a rank that gives a communicator up
    /// tells the others it was in (see the watchdog's `ask`).
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut w = wire::Writer(Vec::with_capacity(96));
        w.u8(WIRE_VERSION);
        self.write(&mut w);
        w.0
    }

    pub(crate) fn decode(bytes: &[u8]) -> Option<RecordView> {
        let mut r = wire::Reader(bytes);
        if r.u8()? != WIRE_VERSION {
            return None;
        }
        RecordView::read(&mut r).filter(|_| r.0.is_empty())
    }

    fn write(&self, w: &mut wire::Writer) {
        w.u64(self.seq);
        w.u8(self.kind as u8);
        w.str(&self.elem);
        w.u32(self.elem_size);
        w.str(&self.operator);
        w.u64(self.count);
        w.u64(self.digest);
        w.u64(self.root.map_or(u64::MAX, u64::from));
        w.str(&self.algorithm);
        w.u8(u8::from(self.in_place));
        w.u8(self.state as u8);
        w.opt_f64(self.enqueued_ago);
        w.opt_f64(self.started_ago);
        w.opt_f64(self.ended_ago);
        w.str(&self.note);
    }

    fn read(r: &mut wire::Reader<'_>) -> Option<RecordView> {
        Some(RecordView {
            seq: r.u64()?,
            kind: OpKind::from_u8(r.u8()?)?,
            elem: r.str()?,
            elem_size: r.u32()?,
            operator: r.str()?,
            count: r.u64()?,
            digest: r.u64()?,
            root: u32::try_from(r.u64()?).ok(),
            algorithm: r.str()?,
            in_place: r.u8()? != 0,
            state: State::from_u8(r.u8()?)?,
            enqueued_ago: r.opt_f64()?,
            started_ago: r.opt_f64()?,
            ended_ago: r.opt_f64()?,
            note: r.str()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sig(count: usize) -> Signature {
        Signature::new(OpKind::Allreduce).reduce::<f32, crate::Sum>().count(count)
    }

    /// Calls that differ in anything the report compares hash apart; what ranks may legitimately
    /// differ in (in place, a non-rooted kind's root, a v-collective's own count) does not.
    #[test]
    fn the_agreement_hash_covers_what_the_ranks_must_agree_on() {
        let base = sig(7);
        let h = base.agreement_hash();
        let differing = [
            Signature { kind: OpKind::Reduce, ..base },
            sig(8),
            Signature::new(OpKind::Allreduce).reduce::<f32, crate::Max>().count(7),
            Signature::new(OpKind::Allreduce).reduce::<i32, crate::Sum>().count(7),
            Signature::new(OpKind::Allreduce).reduce::<f64, crate::Sum>().count(7),
            base.algorithm("ring"),
        ];
        for d in differing {
            assert_ne!(d.agreement_hash(), h, "{d:?}");
        }
        assert_eq!(base.in_place().agreement_hash(), h);
        assert_eq!(base.root(3).agreement_hash(), h, "allreduce has no root");
        let bcast = |root: usize| Signature::new(OpKind::Bcast).elem::<f32>().count(7).root(root);
        assert_ne!(bcast(0).agreement_hash(), bcast(1).agreement_hash());
        let gatherv = |count: usize| Signature::new(OpKind::Gatherv).elem::<u8>().count(count).root(0);
        assert_eq!(gatherv(3).agreement_hash(), gatherv(5).agreement_hash(), "counts are per pair");
        let allgatherv = |c: &[usize]| Signature::new(OpKind::Allgatherv).elem::<u8>().counts(c);
        assert_ne!(allgatherv(&[1, 2]).agreement_hash(), allgatherv(&[2, 1]).agreement_hash());
        // Strings end where they end.
        let a = Signature { elem: "ab", operator: "c", ..base };
        let b = Signature { elem: "a", operator: "bc", ..base };
        assert_ne!(a.agreement_hash(), b.agreement_hash());
    }

    #[test]
    fn the_ring_keeps_the_last_operations_and_every_unfinished_one() {
        let mut r = Recorder::new(8);
        let first = r.push(1, sig(1), State::Running, 10, Some(Duration::from_nanos(5)));
        let mut ids = Vec::new();
        for seq in 2..=20 {
            let id = r.push(seq, sig(usize::try_from(seq).unwrap()), State::Running, 10 + seq, None);
            r.set(id, State::Done, 20 + seq, None);
            ids.push(id);
        }
        let seqs: Vec<u64> = r.iter().map(|x| x.seq).collect();
        assert_eq!(seqs, [1, 13, 14, 15, 16, 17, 18, 19, 20], "the unfinished #1, then the last 8 in order");
        assert!(r.oldest_late(15, None).is_none(), "#1 is at its deadline, not past it");
        assert_eq!(r.oldest_late(16, None).map(|x| x.seq), Some(1));
        assert!(r.oldest_late(16, Some(first.id)).is_none(), "#1 was reported");
        assert_eq!(r.unfinished(), 1);
        r.set(first, State::Failed, 99, Some("x".repeat(500)));
        assert_eq!(r.unfinished(), 0);
        assert!(r.oldest_late(1000, None).is_none());
        let failed = r.get_mut(first).map(|x| (x.seq, x.state, x.note.as_deref().map_or(0, str::len)));
        assert_eq!(failed, Some((1, State::Failed, 160)), "a failure set aside is kept for its report");
        assert_eq!(r.iter().map(|x| x.seq).next(), Some(1), "oldest first");
        let second = r.push(21, sig(21), State::Running, 100, None);
        for seq in 22..=30 {
            let id = r.push(seq, sig(usize::try_from(seq).unwrap()), State::Running, 100 + seq, None);
            r.set(id, State::Done, 200 + seq, None);
        }
        r.set(second, State::Done, 300, None);
        assert!(r.get_mut(first).is_some(), "until another failure takes its place");
        assert_eq!(r.iter().count(), 9, "a record set aside that completed leaves");
        assert!(r.get_mut(ids[0]).is_none(), "an overwritten finished record is gone");
    }

    #[test]
    fn each_operation_keeps_the_deadline_it_was_called_with() {
        let mut r = Recorder::new(8);
        let (long, short) = (Duration::from_secs(60), Duration::from_secs(1));
        let a = r.push(1, sig(1), State::Running, 0, Some(long));
        let b = r.push(2, sig(1), State::Queued, 0, Some(short));
        let at = |s: u64| s * 1_000_000_000;
        assert!(r.oldest_late(at(5), None).is_none(), "#1 has 60 s; #2 is not running yet");
        r.set(b, State::Running, at(5), None);
        assert_eq!(r.oldest_late(at(7), None).map(|x| x.seq), Some(2), "#2 is late, #1 (older) is not");
        r.set(b, State::Done, at(7), None);
        assert_eq!(r.oldest_late(at(61), None).map(|x| x.seq), Some(1));
        r.push(3, sig(1), State::Running, at(61), None);
        r.set(a, State::Done, at(61), None);
        assert!(r.oldest_late(u64::MAX, None).is_none(), "an operation without a deadline is never late");
    }

    #[test]
    fn snapshots_survive_the_wire() {
        let mut rec = Recorder::new(8);
        let a = rec.push(4, sig(7).root(2).algorithm("ring").in_place(), State::Running, 1_000_000_000, None);
        rec.set(a, State::Rejected, 2_000_000_000, Some("bad ünïcode".into()));
        rec.push(5, Signature::new(OpKind::Recv).elem::<u8>().count(3).root(1).tag(9), State::Queued, 1, None);
        let now = 3_000_000_000;
        let snap = Snapshot {
            rank: 3,
            next_seq: 6,
            next_p2p: 2,
            poisoned: true,
            idle: 1.5,
            waits: vec![WaitView { what: "synchronize".into(), ago: 0.25 }],
            records: rec.iter().map(|r| RecordView::of(r, now)).collect(),
        };
        let back = Snapshot::decode(&snap.encode()).expect("decodes");
        assert_eq!(back, snap);
        assert_eq!(back.records[0].started_ago, Some(2.0));
        assert_eq!(back.records[1].started_ago, None);
        let bytes = snap.encode();
        assert!(Snapshot::decode(&bytes[..bytes.len() - 1]).is_none(), "a cut snapshot is refused");
        assert!(Snapshot::decode(&[9]).is_none(), "another version is refused");
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(Snapshot::decode(&longer).is_none(), "a snapshot with bytes after it is refused");
        let one = snap.records[0].encode();
        assert_eq!(RecordView::decode(&one).as_ref(), Some(&snap.records[0]));
        assert!(
            RecordView::decode(&[one.as_slice(), &[0]].concat()).is_none(),
            "a record with bytes after it is refused"
        );
    }

    /// A count beyond what a snapshot carries, or beyond what its bytes can hold, is refused
    /// rather than read on into the next field or allowed to size an allocation.
    #[test]
    fn snapshot_counts_are_checked_against_their_bounds_and_bytes() {
        let empty = Snapshot {
            rank: 0,
            next_seq: 0,
            next_p2p: 0,
            poisoned: false,
            idle: 0.0,
            waits: Vec::new(),
            records: Vec::new(),
        };
        let bytes = empty.encode();
        // The waits' count, then the records' count, are the last 8 bytes of an empty snapshot.
        let with_counts = |waits: u32, records: u32| {
            let mut b = bytes[..bytes.len() - 8].to_vec();
            b.extend_from_slice(&waits.to_le_bytes());
            b.extend_from_slice(&records.to_le_bytes());
            b
        };
        assert_eq!(Snapshot::decode(&with_counts(0, 0)), Some(empty.clone()));
        assert!(Snapshot::decode(&with_counts(1025, 0)).is_none(), "more waits than a snapshot carries");
        assert!(Snapshot::decode(&with_counts(0, 1 << 16)).is_none(), "65,536 records in no bytes");
        assert!(Snapshot::decode(&with_counts(0, u32::MAX)).is_none());
        // A snapshot of more waits than a snapshot carries says fewer, and still decodes.
        let many = Snapshot {
            waits: (0..MAX_WAITS + 5).map(|_| WaitView { what: "wait".into(), ago: 1.0 }).collect(),
            ..empty
        };
        assert_eq!(Snapshot::decode(&many.encode()).map(|s| s.waits.len()), Some(MAX_WAITS));
    }

    #[test]
    fn equal_counts_give_equal_digests() {
        let a = Signature::new(OpKind::Allgatherv).counts(&[1, 2, 3]);
        assert_eq!(a, Signature::new(OpKind::Allgatherv).counts(&[1, 2, 3]));
        assert_ne!(a.digest, Signature::new(OpKind::Allgatherv).counts(&[2, 1, 3]).digest);
        assert_eq!(a.count, 6);
    }
}
