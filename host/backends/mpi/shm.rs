//! Allreduce inside one node through an MPI-3 shared-memory window
//! ([`AllreduceAlgorithm::SharedMemory`](super::AllreduceAlgorithm::SharedMemory)).
//!
//! Each communicator whose ranks share a node owns a [`NodeWindow`]: its own node-local
//! communicator and one `MPI_Win_allocate_shared` window in which every rank owns a part of
//! [`PART_BYTES`]: a [`Header`] and two buffers of [`BUFFER_BYTES`]. The window is made by the
//! first operation that uses it, once every rank is known to be in that operation (a barrier
//! on the operation's own tag, which carries its signature), so memory does not grow with the
//! message: messages are pipelined through it one chunk of at most a buffer at a time, the
//! buffers alternating.
//!
//! What a peer writes into the window is untrusted. Every operation writes its call into its
//! rank's header before the first barrier and compares every other rank's after it: a rank
//! in another call ([`Error::Mismatch`] on every rank) is found before anyone reads a slot,
//! and every copy out of a slot is bounded by this rank's own count (the slots of a chunk lie
//! within one buffer whatever the count).
//!
//! Per chunk `c` (slices cut as [`block_range`] cuts a ring's blocks):
//! 1. every rank copies the slices of its input the others reduce into its buffer, each at
//!    its place in a full chunk (its own slice stays in its input);
//! 2. barrier `X_c`;
//! 3. rank `i` reduces slice `i` in rank order `0..n` (so non-commutative operators work)
//!    straight from the peers' buffers and its own input, applies the operator's finishing
//!    step, and writes the result into its own buffer at slice `i` and, a cache-sized block at
//!    a time, into its output; then it stages chunk `c+1` into the other buffer;
//! 4. barrier `X_{c+1}`, after which every rank copies the others' `n - 1` result slices of
//!    chunk `c` into its output (and reduces chunk `c+1`...).
//!
//! One barrier per chunk, plus one: between `X_c` and `X_{c+1}` ranks only read the staged
//! data of chunk `c` and the results of chunk `c-1`, which sit in different buffers from what
//! they write (results of `c`, staging of `c+1`), and a buffer is written again only after the
//! next barrier, which every rank passes after its reads. Operations continue the buffer
//! alternation where the previous one stopped, so no barrier is needed between them either.
//!
//! Barriers are dissemination barriers of zero-length messages on the communicator's algorithm
//! communicator (whose ranks are the node communicator's when every rank is on the node), so a
//! non-blocking operation waits on `MPI_Test` like every other algorithm and never blocks the
//! progress engine, and revoking the communicator wakes a rank waiting in one for a peer that
//! failed or left with an error. `MPI_Win_sync` (plus a fence for the compiler) on both sides
//! of each barrier orders the window accesses (the window stays in one `MPI_Win_lock_all`
//! epoch).
//!
//! Operations on one communicator take the window in issue order, the same on every rank: a
//! turn (ticket) is taken when the operation is planned and served in order; a turn dropped
//! unused passes to the next one.

use std::collections::BTreeSet;
use std::future::poll_fn;
use std::sync::atomic::{self, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::task::Poll;
use std::time::Instant;

use duralumin_kernels::{Element, ReduceOp};

use super::job::{Job, Mode};
use super::stores::{StoreChoice, Stores, WindowStores};
use super::{Core, MpiCommunicator};
use crate::algorithms::block_range;
use crate::api::error::{Error, Result};
use crate::common::buffer::RawBuf;
use crate::common::progress::unless;
use crate::common::reducer::{Reducer, host_reducer};
use crate::ffi::win::{self, RawWin};
use crate::ffi::{self, RawComm, c_rank, u32_rank};
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::{OpKind, Signature, State};
use crate::transport::MpiTransport;

/// Bytes of one of a rank's two buffers: the most a rank stages (and the chunk length) per
/// step. Small enough that a chunk stays in the caches between being staged by one rank and
/// reduced by another, large enough that the per-chunk barrier is cheap next to the copies
/// (128 KiB, 256 KiB and 1 MiB were within 7 % of each other at 64 MiB, 2 ranks, here).
pub(crate) const BUFFER_BYTES: usize = 1 << 20;

/// Results of operations of at least this many bytes are copied out with non-temporal stores
/// ([`RawBuf::stream_from`]): an output larger than a core's cache (2 MiB of L2 here) is not
/// read back from it, and writing around the caches saves reading every line in first (64 MiB
/// at 2 ranks, when it was introduced: 14.3-15.9 ms against 17.4-17.7 ms).
const STREAM_BYTES: usize = 4 << 20;

/// Bytes a rank reduces of its slice before copying them to its output: small enough to be
/// copied from the first-level cache.
const REDUCE_BLOCK_BYTES: usize = 16 << 10;

/// Bytes at the start of each rank's part that hold its [`Header`] (a cache line).
const HEADER_BYTES: usize = 64;

/// Bytes of each rank's part of the window: its header and two buffers.
const PART_BYTES: usize = HEADER_BYTES + 2 * BUFFER_BYTES;

/// The call a rank is in, written at the start of its part before an operation's first barrier
/// (after its first chunk is staged) and read by the others after it. The previous operation's
/// is read by every rank before it enters that operation's second barrier, which every rank
/// passes before writing the next. Ranks agree on everything but the number (a collective
/// refused on one rank alone took a number there only), including how many operations the
/// window ran before: a rank whose first barrier a colliding message of another call let
/// through (`docs/reliability.md`) finds a peer's header of an earlier operation, never reads
/// its buffers as this one's.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
struct Header {
    /// The operation's number on the communicator (for the error only).
    seq: u64,
    /// [`Signature::agreement_hash`] of the operation.
    hash: u64,
    /// Elements of this chunk of the operation (of a HostTransfer chunk, the chunk's).
    count: u64,
    elem_size: u64,
    /// Operations the window ran before this one.
    uses: u64,
}

const _: () = assert!(size_of::<Header>() <= HEADER_BYTES && HEADER_BYTES % ALIGN == 0);

impl Header {
    /// Whether two ranks' calls agree.
    fn agrees(&self, other: &Header) -> bool {
        (self.hash, self.count, self.elem_size, self.uses) == (other.hash, other.count, other.elem_size, other.uses)
    }
}

/// The alignment of every part of the window (each starts at the first such address of the
/// memory MPI gave), so any element of at most this alignment can be placed at any element
/// offset.
const ALIGN: usize = 64;

const ALGORITHM: &str = "shared memory";

/// A communicator's shared-memory window, made by the first operation that uses it and freed
/// by [`NodeWindow::release`] when the communicator drops.
#[derive(Debug, Default)]
pub(crate) struct NodeWindow {
    window: OnceLock<Window>,
    /// Held while the window is made, so two threads planning at once make one.
    making: Mutex<()>,
    turns: Mutex<Turns>,
}

/// Who may use the window: turns are handed out in issue order and served in that order.
#[derive(Debug, Default)]
struct Turns {
    next: u64,
    serving: u64,
    /// Turns given back before they came up.
    dropped: BTreeSet<u64>,
    /// The buffer the next operation starts in (0 or 1): the one the last operation did not
    /// finish in.
    buffer: usize,
    /// Operations that ran through the window.
    uses: u64,
}

/// A window made: the node communicator, the window and where every rank's part lies here.
#[derive(Debug)]
struct Window {
    node: RawComm,
    win: RawWin,
    rank: usize,
    size: usize,
    parts: Vec<*mut u8>,
    /// How this rank writes the window in large operations ([`super::stores`]).
    stores: StoreChoice,
}

// SAFETY: the part addresses point into MPI-allocated shared memory that lives as long as the
// window (freed only by `NodeWindow::release` as the core drops, after every operation using it
// completed); which thread uses them is governed by the turns, one operation at a time.
unsafe impl Send for Window {}
// SAFETY: see the `Send` impl; shared references only read the handles and addresses.
unsafe impl Sync for Window {}

impl Window {
    /// Makes the node communicator and the window; collective over `parent`.
    fn make(parent: RawComm, rank: usize) -> Result<Window> {
        let node = ffi::comm::split_shared(parent, c_rank(rank))?;
        let made = Self::make_on(node);
        if made.is_err() {
            // SAFETY: `node` was made above for this window alone and nobody else uses it.
            unsafe { ffi::comm::free(node) };
        }
        made
    }

    fn make_on(node: RawComm) -> Result<Window> {
        let (rank, size) = ffi::comm::rank_size(node)?;
        // Open MPI places the parts 8 bytes past a page boundary: each part gets `ALIGN` bytes
        // more and starts at its first `ALIGN`-aligned address.
        let (win, _) = win::allocate_shared(node, PART_BYTES + ALIGN)?;
        let ready = (|| {
            let parts = (0..size)
                .map(|j| {
                    let (base, bytes) = win::shared_query(win, c_rank(j))?;
                    let skip = (ALIGN - base.addr() % ALIGN) % ALIGN;
                    if base.is_null() || bytes < PART_BYTES + skip {
                        return Err(Error::AlgorithmUnsupported {
                            algorithm: ALGORITHM,
                            reason: "the MPI library gave a window part too small",
                        });
                    }
                    // SAFETY: `skip < ALIGN` and the part holds `bytes >= skip` bytes.
                    Ok(unsafe { base.add(skip) })
                })
                .collect::<Result<Vec<_>>>()?;
            win::lock_all(win)?;
            Ok(parts)
        })();
        match ready {
            Ok(parts) => Ok(Window { node, win, rank, size, parts, stores: StoreChoice::default() }),
            Err(e) => {
                // SAFETY: the window was made above, is not locked and nobody uses its memory;
                // the failure (a property of what the library gave) is the same on every rank,
                // so every rank frees it.
                unsafe { win::free(win) };
                Err(e)
            }
        }
    }

    /// Buffer `b` (0 or 1) of rank `j`'s part, as `len` elements of `T`.
    fn buffer<T>(&self, j: usize, b: usize, len: usize) -> RawBuf<T> {
        // SAFETY: `b % 2 < 2` and each part holds the header and two buffers, so the offset
        // stays inside the part.
        RawBuf::from_raw(unsafe { self.parts[j].add(HEADER_BYTES + (b % 2) * BUFFER_BYTES) }.cast(), len)
    }

    /// Writes this rank's header.
    ///
    /// # Safety
    /// The caller holds the window's turn, before the operation's first barrier (see
    /// [`Header`]).
    unsafe fn write_header(&self, h: Header) {
        // SAFETY: the part starts `ALIGN`-aligned with `HEADER_BYTES` for the header, which
        // only this rank writes, and nobody reads until the barrier.
        unsafe { std::ptr::write_volatile(self.parts[self.rank].cast::<Header>(), h) };
    }

    /// The first rank whose header differs from `mine`, and its header.
    ///
    /// # Safety
    /// Between the operation's first and second barriers (see [`Header`]).
    unsafe fn differing(&self, mine: Header) -> Option<(usize, Header)> {
        (0..self.size).filter(|&j| j != self.rank).find_map(|j| {
            // SAFETY: every part starts with a header the rank wrote before the barrier just
            // passed, and none is written again before the next one; any bit pattern is a
            // valid `Header` (plain integers).
            let h = unsafe { std::ptr::read_volatile(self.parts[j].cast::<Header>()) };
            // The buffers are read after the header that says they hold this operation's.
            atomic::fence(Ordering::Acquire);
            (!h.agrees(&mine)).then_some((j, h))
        })
    }

    /// Orders this process's window accesses before (and after) a barrier.
    fn fence(&self) -> Result<()> {
        atomic::fence(Ordering::SeqCst);
        win::sync(self.win)
    }
}

impl NodeWindow {
    /// The window, made now if no earlier operation made it (collective over the ranks of
    /// `parent`: every rank must make it at the same operation).
    fn get_or_make(&self, parent: RawComm, rank: usize) -> Result<&Window> {
        if let Some(w) = self.window.get() {
            return Ok(w);
        }
        let _making = self.making.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(w) = self.window.get() {
            return Ok(w);
        }
        let w = Window::make(parent, rank)?;
        Ok(self.window.get_or_init(|| w))
    }

    /// Whether an operation made the window already.
    pub(crate) fn is_made(&self) -> bool {
        self.window.get().is_some()
    }

    fn turns(&self) -> MutexGuard<'_, Turns> {
        self.turns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Frees the window, if an operation made it: the communicator's last operation, called
    /// as its core drops, with `coll` the communicator's collective communicator.
    ///
    /// `MPI_Win_free` returns only once every rank of the node frees the window too (Open MPI
    /// synchronises there), so it is a recorded operation (`drop`) under the communicator's
    /// deadline, which the watchdog reports and, since nothing interrupts it, ends the job
    /// over. Every rank must take the same path, free or leak: a rank that gave the
    /// communicator up (or, with ULFM, saw a process failure, after which the free could wait
    /// for a dead process) leaks the window and its communicator. With ULFM the ranks first
    /// agree (`MPIX_Comm_agree`, which works on a revoked communicator and over failed
    /// processes) and free only if every one of them can; without it, a rank that gave the
    /// communicator up told the others, which gave it up too. Left alone if MPI is finalized.
    pub(crate) fn release(&mut self, monitor: &Monitor, coll: RawComm) {
        let Some(w) = self.window.take() else { return };
        if ffi::is_finalized() {
            return;
        }
        // A communicator given up is refused here.
        let op = monitor.begin(Signature::new(OpKind::Drop), State::Running).ok();
        let free = if ffi::ulfm::available() {
            let able = op.is_some() && !ffi::ulfm::failure_seen();
            ffi::ulfm::agree(coll, able).is_ok_and(|(all, failed)| all && !failed)
        } else {
            op.is_some()
        };
        if free {
            // Teardown errors have no one to be reported to.
            let _ = win::unlock_all(w.win);
            // SAFETY: the core is dropping, so every operation that used the window has
            // completed and no pointer into it is left; the epoch was closed just above.
            unsafe { win::free(w.win) };
            // SAFETY: made by `Window::make` for this window alone; the window over it is freed.
            unsafe { ffi::comm::free(w.node) };
        }
        if let Some(op) = op {
            let _ = monitor.end(op, Ok(()));
        }
    }
}

/// An operation's turn at the window; given back when dropped, used or not.
struct Turn {
    core: Arc<Core>,
    ticket: u64,
}

impl Turn {
    fn take(core: Arc<Core>) -> Turn {
        let ticket = {
            let mut t = core.shm.turns();
            t.next += 1;
            t.next - 1
        };
        Turn { core, ticket }
    }

    /// Completes when every earlier turn was given back; returns the buffer to start in and
    /// how many operations ran through the window before.
    async fn come_up(&self) -> (usize, u64) {
        poll_fn(|_| {
            let t = self.core.shm.turns();
            if t.serving == self.ticket { Poll::Ready((t.buffer, t.uses)) } else { Poll::Pending }
        })
        .await
    }

    /// Records that this operation ran through, and the buffer the next one starts in (while
    /// this turn is being served).
    fn continue_at(&self, buffer: usize) {
        let mut t = self.core.shm.turns();
        t.buffer = buffer % 2;
        t.uses += 1;
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        let mut t = self.core.shm.turns();
        if t.serving == self.ticket {
            t.serving += 1;
            loop {
                let next = t.serving;
                if !t.dropped.remove(&next) {
                    break;
                }
                t.serving += 1;
            }
        } else {
            t.dropped.insert(self.ticket);
        }
    }
}

/// Plans an allreduce through the node window: `out` receives the reduction of every rank's
/// `send` (or of `out` itself, in place). The caller checked the lengths and that `O` may be
/// used (any operator: the reduction keeps rank order).
///
/// Fails with [`Error::AlgorithmUnsupported`] when the communicator's ranks are not all on one
/// node. The first call on a communicator makes the window: collective over the node (it
/// returns once every rank reached the same operation), even for a non-blocking operation.
pub(super) fn plan_allreduce<T: Element, O: ReduceOp<T>>(
    comm: &MpiCommunicator,
    send: Option<&[T]>,
    out: RawBuf<T>,
    mode: Mode,
) -> Result<Job<T>> {
    check_usable::<T>(comm)?;
    let input = send.map(RawBuf::from_ref);
    let n = comm.size();
    if n == 1 || out.len() == 0 {
        // Nothing to exchange (every rank has the same count).
        return Ok(copy_and_finish::<T, O>(input, out, n));
    }
    let x = comm.transport::<u8>(mode)?;
    let op = comm.current.get().map(|(op, _)| op);
    make_window(comm, &x, op)?;
    let header = Header {
        seq: op.map_or(0, |o| o.seq),
        hash: comm.current_hash(),
        count: out.len() as u64,
        elem_size: size_of::<T>() as u64,
        uses: 0,
    };
    let stores = comm.tuning().shared_memory_stores;
    let turn = Turn::take(Arc::clone(&comm.core));
    Ok(Job::Future(Box::pin(async move {
        let (first, uses) = turn.come_up().await;
        let header = Header { uses, ..header };
        let w = turn.core.shm.window.get().ok_or(Error::Progress("shared-memory window missing"))?;
        let r = host_reducer::<T, O>();
        // SAFETY: the public method borrows `send` and `out` for the whole operation (the
        // same slice in place); this operation holds the window's turn.
        let chunks = unsafe { pipeline(w, &x, &r, (input.unwrap_or(out), out), first, header, stores) }.await?;
        turn.continue_at(first + chunks);
        Ok(())
    })))
}

/// Refuses a communicator whose ranks are not all on one node, and elements the window's
/// buffers cannot hold.
fn check_usable<T: Element>(comm: &MpiCommunicator) -> Result<()> {
    if comm.local_size() != comm.size() {
        return Err(Error::AlgorithmUnsupported {
            algorithm: ALGORITHM,
            reason: "the ranks of the communicator are not all on one node",
        });
    }
    if align_of::<T>() > ALIGN || size_of::<T>() > BUFFER_BYTES {
        return Err(Error::AlgorithmUnsupported { algorithm: ALGORITHM, reason: "the element is too large" });
    }
    Ok(())
}

/// The allreduce of one rank, or of no elements: the input copied to `out` (unless in place)
/// and finished (`Avg`'s division by the rank count).
fn copy_and_finish<T: Element, O: ReduceOp<T>>(input: Option<RawBuf<T>>, out: RawBuf<T>, n: usize) -> Job<T> {
    Job::Future(Box::pin(async move {
        if let Some(input) = input {
            // SAFETY: the public method borrows `send` and `recv` (distinct slices) for the
            // whole operation.
            unsafe { out.copy_from(input) };
        }
        // SAFETY: as above.
        host_reducer::<T, O>().finish(unsafe { out.as_mut_slice() }, u32_rank(n));
        Ok(())
    }))
}

/// Makes the node window on the communicator's first use of it, and checks that its ranks are
/// the communicator's.
fn make_window(comm: &MpiCommunicator, x: &MpiTransport, op: Option<OpId>) -> Result<()> {
    let core = &comm.core;
    if !core.shm.is_made() {
        // Making the window is collective over the node: every rank must be in this very
        // operation first, which a barrier on its tag (which carries its signature) shows; a
        // rank in another call never passes it (it finds the other call's messages, or the
        // deadline gives the communicator up), and no rank starts a collective the others are
        // not in.
        let handshake = x.clone();
        let given_up = || core.monitor.poisoned().map(|p| p.error(op.map_or(Asker::New, Asker::Op)));
        crate::common::progress::block_on(unless(Box::pin(async move { barrier(&handshake).await }), given_up))??;
    }
    let w = core.shm.get_or_make(core.algo, core.rank)?;
    if w.size != comm.size() {
        return Err(Error::AlgorithmUnsupported {
            algorithm: ALGORITHM,
            reason: "the ranks of the communicator are not all on one node",
        });
    }
    // The node communicator was split keyed by rank, so with every rank on the node its ranks
    // are the communicator's. The barriers run on the communicator's own algorithm
    // communicator, not the node's: revoking the communicator (by the program, or the watchdog
    // on a timeout) must wake a rank waiting in a barrier for a peer that failed elsewhere.
    if w.rank != core.rank {
        return Err(Error::Progress("the shared-memory window's ranks differ from the communicator's"));
    }
    Ok(())
}

/// The chunk pipeline (see the module docs); returns the number of chunks (buffers used).
/// `header` is this rank's call; a rank whose header differs fails the operation on every rank
/// before any slot is read.
///
/// # Safety
/// `input` (only read) and `out` have equal lengths, are valid and not otherwise accessed until
/// the future completes; they are the same buffer or do not overlap. The caller holds the
/// window's turn and `first` is the buffer it starts in; every rank of the node that passes the
/// first barrier runs an operation with the same `first`.
async unsafe fn pipeline<T: Element, R: Reducer<T>>(
    w: &Window,
    x: &MpiTransport,
    r: &R,
    (input, out): (RawBuf<T>, RawBuf<T>),
    first: usize,
    header: Header,
    stores: WindowStores,
) -> Result<usize> {
    let mut p = Chunks::new(w, input, out, first);
    let chunks = p.count();
    // Large operations write the window the way that costs this rank less (`super::stores`).
    let how = if p.stream { w.stores.pick(stores) } else { Stores::Cached };
    // Each step below runs between the barriers the module docs give it, which is what the
    // steps of `Chunks` require.
    // SAFETY: this operation holds the turn, before its first barrier; the caller guarantees
    // `input` readable.
    unsafe { p.stage(0, how) };
    // The header after the staging (see `Header`).
    w.fence()?;
    // SAFETY: as above.
    unsafe { w.write_header(header) };
    for c in 0..=chunks {
        w.fence()?;
        barrier(x).await?;
        w.fence()?;
        // SAFETY: between the first and second barriers.
        if let Some((j, theirs)) = (c == 0).then(|| unsafe { w.differing(header) }).flatten() {
            return Err(header_mismatch(x, j, &theirs, &header));
        }
        if c > 0 {
            // SAFETY: as above.
            unsafe { p.copy_out(c - 1) };
        }
        if c + 1 < chunks {
            let t = Instant::now();
            // SAFETY: as above.
            unsafe {
                p.reduce(r, c, how);
                p.stage(c + 1, how);
            }
            if p.stream {
                w.stores.record(how, p.span(c).1 * size_of::<T>(), t.elapsed());
            }
        } else if c < chunks {
            // SAFETY: as above.
            unsafe { p.reduce(r, c, how) };
        }
    }
    Ok(chunks)
}

/// One rank's part of a pipelined allreduce through the window: chunk `c` of the operation (at
/// most a buffer's worth of elements) goes through buffer `first + c` of every rank.
struct Chunks<'a, T> {
    w: &'a Window,
    input: RawBuf<T>,
    out: RawBuf<T>,
    first: usize,
    /// Elements per chunk.
    k: usize,
    /// Elements reduced per cache-sized block.
    block: usize,
    /// Whether results go to `out` with non-temporal stores (large operations).
    stream: bool,
    /// A block to reduce into when the window is written around the caches (large operations
    /// only).
    scratch: Vec<T>,
}

impl<'a, T: Element> Chunks<'a, T> {
    fn new(w: &'a Window, input: RawBuf<T>, out: RawBuf<T>, first: usize) -> Chunks<'a, T> {
        let k = (BUFFER_BYTES / size_of::<T>().max(1)).max(1);
        let block = (REDUCE_BLOCK_BYTES / size_of::<T>().max(1)).max(1);
        let stream = out.len().saturating_mul(size_of::<T>()) >= STREAM_BYTES;
        let scratch = if stream { vec![bytemuck::Zeroable::zeroed(); block] } else { Vec::new() };
        Chunks { w, input, out, first, k, block, stream, scratch }
    }

    fn count(&self) -> usize {
        self.out.len().div_ceil(self.k)
    }

    /// Chunk `c`: where it starts in the operation's buffers, and its length.
    fn span(&self, c: usize) -> (usize, usize) {
        (c * self.k, self.k.min(self.out.len() - c * self.k))
    }

    /// Slice `j` of a chunk of `l` elements: `(where it starts in the chunk, where it starts in
    /// a buffer, its length)`. In a buffer it sits where it would in a full chunk, so slots of
    /// chunks of different lengths (the last one) never overlap: staging the last chunk cannot
    /// touch the result slot of the chunk before it that the others may still be reading.
    fn slice(&self, l: usize, j: usize) -> (usize, usize, usize) {
        let (s, sl) = block_range(l, self.w.size, j);
        (s, block_range(self.k, self.w.size, j).0, sl)
    }

    /// Rank `j`'s buffer for chunk `c`.
    fn buffer(&self, j: usize, c: usize) -> RawBuf<T> {
        self.w.buffer::<T>(j, self.first + c, self.k)
    }

    /// Copies this rank's input for the others' slices of chunk `c` into its buffer.
    ///
    /// # Safety
    /// Runs before the barrier after which the others read chunk `c`, and after the one past
    /// which nobody reads this buffer's previous chunk; `input` is readable.
    unsafe fn stage(&self, c: usize, how: Stores) {
        let ((off, l), me) = (self.span(c), self.w.rank);
        let mine = self.buffer(me, c);
        for j in (0..self.w.size).filter(|&j| j != me) {
            let (s, at, sl) = self.slice(l, j);
            // SAFETY: this rank's buffer for chunk `c` is written by it alone, and no rank
            // reads these slots before the next barrier (the caller's guarantee).
            unsafe { put(mine.block(at, sl), self.input.block(off + s, sl), how == Stores::Streamed) };
        }
    }

    /// Reduces this rank's slice of chunk `c`, a cache-sized block at a time, into its slot of
    /// its buffer (where the others read it) and from there, while the block is in the cache,
    /// into `out`.
    ///
    /// # Safety
    /// Every rank staged chunk `c` before the barrier just passed, and nobody writes the staged
    /// slots until the next one; `out` is this operation's.
    unsafe fn reduce<R: Reducer<T>>(&mut self, r: &R, c: usize, how: Stores) {
        let ((off, l), me, n) = (self.span(c), self.w.rank, self.w.size);
        let (s, at, sl) = self.slice(l, me);
        let ranks = u32_rank(n);
        // Streamed: the result is made in the scratch block (in the first-level cache), then
        // streamed into the window; cached: made in the window, where the output copies it from.
        let streamed = how == Stores::Streamed && self.scratch.len() >= self.block;
        let scratch = RawBuf::from_mut(&mut self.scratch);
        for b in (0..sl).step_by(self.block) {
            let bl = self.block.min(sl - b);
            let src = |j: usize| {
                if j == me { self.input.block(off + s + b, bl) } else { self.buffer(j, c).block(at + b, bl) }
            };
            let slot = self.buffer(me, c).block(at + b, bl);
            let dst = if streamed { scratch.block(0, bl) } else { slot };
            // SAFETY: the staged sources are final (the caller's guarantee); `dst` (this rank's
            // own slot of its buffer, or its private scratch) is read by the others only after
            // the next barrier, and lies apart from every source. The block of `out` is this
            // operation's; in place it is the block of the input just read, and no one reads
            // it again.
            unsafe {
                let d = dst.as_mut_slice();
                r.reduce_into(d, src(0).as_slice(), src(1).as_slice());
                for j in 2..n {
                    r.reduce(d, src(j).as_slice());
                }
                r.finish(d, ranks);
                if streamed {
                    slot.stream_from(dst);
                }
                put(self.out.block(off + s + b, bl), dst, self.stream);
            }
        }
    }

    /// Copies the others' slices of chunk `c` into `out`.
    ///
    /// # Safety
    /// Every rank reduced chunk `c` before the barrier just passed, and nobody writes its result
    /// slots until the barrier after next; `out` is this operation's.
    unsafe fn copy_out(&self, c: usize) {
        let ((off, l), me) = (self.span(c), self.w.rank);
        for j in (0..self.w.size).filter(|&j| j != me) {
            let (s, at, sl) = self.slice(l, j);
            // SAFETY: the caller's guarantee.
            unsafe { put(self.out.block(off + s, sl), self.buffer(j, c).block(at, sl), self.stream) };
        }
    }
}

/// The error of an operation whose peer `j` wrote `theirs` into its header where this rank
/// wrote `mine`.
fn header_mismatch(x: &MpiTransport, j: usize, theirs: &Header, mine: &Header) -> Error {
    let (op, seq) = x.label.map_or(("allreduce", mine.seq), |l| (l.name, l.seq));
    let call = |h: &Header| {
        format!(
            "#{} of {} elements of {} bytes (signature {:016x}, after {} operations on the window)",
            h.seq, h.count, h.elem_size, h.hash, h.uses
        )
    };
    let what = format!(
        "rank {j} is in another call on the shared-memory window: its header says {}, this rank's {}",
        call(theirs),
        call(mine)
    );
    Error::Mismatch { op, seq, peer: j, what, report: String::new() }
}

/// Copies a block: streamed around the caches when `stream`.
///
/// # Safety
/// As for [`RawBuf::copy_from`].
unsafe fn put<T: Copy>(dst: RawBuf<T>, src: RawBuf<T>, stream: bool) {
    // SAFETY: guaranteed by the caller.
    unsafe {
        if stream {
            dst.stream_from(src);
        } else {
            dst.copy_from(src);
        }
    }
}

/// Dissemination barrier of zero-length messages: `ceil(log2 n)` rounds; in round `k` each rank
/// signals `rank + 2^k` and waits for `rank - 2^k`. The sources of one barrier's rounds are
/// distinct and messages between two ranks do not overtake, so consecutive barriers with one
/// tag cannot mix. Every message on the operation's tag is one of these, so the receives are
/// posted ahead ([`MpiTransport::signal`]).
async fn barrier(x: &MpiTransport) -> Result<()> {
    let (n, me) = (x.size, x.rank);
    let mut dist = 1;
    while dist < n {
        x.signal((me + dist) % n, (me + n - dist) % n)?.await?;
        dist *= 2;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Header;

    /// Ranks agree on a call whatever its number on each, and on nothing else that differs:
    /// a header left by an earlier operation on the window never passes for this one's.
    #[test]
    fn headers_agree_on_everything_but_the_number() {
        let h = Header { seq: 3, hash: 7, count: 10, elem_size: 4, uses: 2 };
        assert!(h.agrees(&Header { seq: 5, ..h }));
        for other in
            [Header { hash: 8, ..h }, Header { count: 11, ..h }, Header { elem_size: 8, ..h }, Header { uses: 1, ..h }]
        {
            assert!(!h.agrees(&other), "{other:?} agreed with {h:?}");
        }
    }
}
