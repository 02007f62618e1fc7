//! An operation ready to run: native MPI calls or an algorithm future, plus finishing steps;
//! and how it runs blocking or on the progress engine.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use duralumin_kernels::Element;

use super::MpiCommunicator;
use super::shadow::Shadow;
use crate::api::error::Result;
use crate::api::request::{Request, Scope};
use crate::common::buffer::RawBuf;
use crate::common::progress::{OpFuture, Task, block_on};
use crate::ffi::native::Native;
use crate::ffi::{RawComm, RawDatatype, RawRequest, p2p};
use crate::reliability::crosscheck::Pairs;
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::{Signature, State};

/// Whether an operation is being built for a blocking call or for the progress engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Blocking,
    NonBlocking,
}

/// A step that runs after the data has moved.
#[derive(Debug)]
pub(crate) enum Post<T> {
    /// Applies the operator's finishing step (avg's division) to `buf`.
    Finish { buf: RawBuf<T>, f: fn(&mut [T], u32), ranks: u32 },
    /// Moves `len` elements at `from` to the start of `buf` (in-place reduce-scatter results).
    MoveToFront { buf: RawBuf<T>, from: usize, len: usize },
    /// Copies blocks received packed (`(from, len)` in `packed`) to their places (`to`) in
    /// `buf`: allgatherv into a rank's blocks that MPI's `int` displacements cannot address.
    Unpack { packed: Vec<T>, buf: RawBuf<T>, blocks: Vec<(usize, usize, usize)> },
}

// SAFETY: the buffers belong to the operation, which is the only user until it completes.
unsafe impl<T: Send> Send for Post<T> {}

impl<T: Copy> Post<T> {
    /// # Safety
    /// The operation's data movement has completed and its buffers are still borrowed by it.
    pub(crate) unsafe fn apply(&self) {
        match self {
            // SAFETY: the caller guarantees exclusive access to the completed buffer.
            Post::Finish { buf, f, ranks } => f(unsafe { buf.as_mut_slice() }, *ranks),
            &Post::MoveToFront { buf, from, len } => {
                if from != 0 && len != 0 {
                    // SAFETY: `from + len <= buf.len()` (checked when planned); ptr::copy
                    // handles the overlap.
                    unsafe { std::ptr::copy(buf.ptr().add(from), buf.ptr(), len) };
                }
            }
            Post::Unpack { packed, buf, blocks } => {
                for &(from, len, to) in blocks {
                    let block = buf.block(to, len);
                    if let Some(src) = packed.get(from..from + len).filter(|_| block.len() == len) {
                        // SAFETY: `block` lies inside `buf` (clamped, and its length checked),
                        // which the caller gives this step alone; `packed` is this step's own.
                        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), block.ptr(), len) };
                    }
                }
            }
        }
    }
}

/// The most bytes of data a native MPI collective may have without the signature check first.
/// MPI libraries write a message longer than its receive buffer past the buffer (Open MPI 4.1
/// and 5.0 do above their eager size: about 4 KiB over shared memory, 64 KiB over TCP,
/// measured in `docs/reliability.md`), so native calls of two ranks whose counts differ may
/// meet only if every message either sends fits an eager message: collectives of at most this
/// much data, whose messages are no larger. Larger ones wait for the check
/// ([`MpiCommunicator::gate`]).
pub(crate) const NATIVE_UNCHECKED_BYTES: usize = 2 << 10;

/// The native calls of a job: one, but for operations split at MPI's `int` counts, so held
/// without a heap allocation.
pub(crate) type NativeCalls = smallvec::SmallVec<[Native; 1]>;

/// An operation ready to run.
pub(crate) enum Job<T> {
    /// Native MPI collectives (several when a large operation is split), then `post`. `bytes`
    /// is the operation's data (its size in the nccl-tests convention: the largest buffer any
    /// rank has), which decides whether it waits for the signature check; `gate` is what it
    /// waits for before its calls start.
    Native { dt: RawDatatype, calls: NativeCalls, post: Vec<Post<T>>, bytes: usize, gate: Gate },
    /// One of Duralumin's algorithms (its future includes any finishing step).
    Future(OpFuture),
}

impl<T> Job<T> {
    /// Native `calls` on `bytes` of data (see [`Job::Native`]), then `post`.
    pub(crate) fn natives(dt: RawDatatype, calls: NativeCalls, post: Vec<Post<T>>, bytes: usize) -> Self {
        Job::Native { dt, calls, post, bytes, gate: Gate::default() }
    }

    /// One native call on `bytes` of data.
    pub(crate) fn native(dt: RawDatatype, call: Native, bytes: usize) -> Self {
        Job::natives(dt, smallvec::smallvec![call], Vec::new(), bytes)
    }

    /// Whether it waits for the signature check before its calls start.
    pub(crate) fn waits_for_check(&self) -> bool {
        matches!(self, Job::Native { gate: Gate { check: Some(_), .. }, .. })
    }

    pub(crate) fn then(mut self, step: Option<Post<T>>) -> Self {
        if let (Job::Native { post, .. }, Some(step)) = (&mut self, step) {
            post.push(step);
        }
        self
    }
}

/// What a native job waits for before its calls start: its turn ([`StartOrder`]), then the
/// signature check (boxed: a job without one stays small).
#[derive(Debug, Default)]
pub(crate) struct Gate {
    check: Option<Box<(Arc<Monitor>, OpId, Signature)>>,
    turn: Option<StartTurn>,
}

impl Gate {
    fn is_open(&self) -> bool {
        self.check.is_none() && self.turn.is_none()
    }

    /// Waits for the turn and passes the check, without blocking the thread.
    async fn open(&mut self) -> Result<()> {
        if let Some(turn) = &self.turn {
            std::future::poll_fn(|_| if turn.is_up() { Poll::Ready(()) } else { Poll::Pending }).await;
        }
        match self.check.take() {
            Some(c) => {
                let (m, op, sig) = *c;
                crate::reliability::crosscheck::verify(m, op, sig).await
            }
            None => Ok(()),
        }
    }

    /// Waits for the turn and passes the check on this thread.
    fn open_blocking(&mut self) -> Result<()> {
        if let Some(turn) = &self.turn {
            block_on(std::future::poll_fn(|_| if turn.is_up() { Poll::Ready(()) } else { Poll::Pending }));
        }
        match self.check.take() {
            Some(c) => crate::reliability::crosscheck::verify_blocking(&c.0, c.1, &c.2),
            None => Ok(()),
        }
    }

    /// The calls have started: later jobs may start theirs.
    fn started(&mut self) {
        if let Some(turn) = self.turn.take() {
            turn.pass();
        }
    }
}

/// The order native collectives start in on the collective communicator. MPI requires every
/// rank to start its collectives on a communicator in one order, and a job that waits for its
/// signature check (on the progress thread, for a non-blocking call) must not be overtaken by
/// one planned after it: jobs planned while one waits queue behind it, in plan order. With none
/// waiting, the usual case, a job starts at once.
#[derive(Debug, Default)]
pub(crate) struct StartOrder {
    queue: Mutex<VecDeque<u64>>,
    /// The queue's length, read without the lock.
    queued: AtomicUsize,
    next: AtomicU64,
}

/// A job's place in the [`StartOrder`]; leaves it when passed or dropped.
#[derive(Debug)]
pub(crate) struct StartTurn {
    order: Arc<StartOrder>,
    id: u64,
}

impl StartOrder {
    fn queue(&self) -> std::sync::MutexGuard<'_, VecDeque<u64>> {
        self.queue.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether a job waits to start.
    pub(crate) fn is_empty(&self) -> bool {
        self.queued.load(Ordering::Acquire) == 0
    }

    /// A place at the end of the queue (the planning thread's, in plan order).
    pub(crate) fn enqueue(self: &Arc<Self>) -> StartTurn {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.queue().push_back(id);
        self.queued.fetch_add(1, Ordering::Release);
        StartTurn { order: Arc::clone(self), id }
    }
}

impl StartTurn {
    /// Whether every job queued before this one has started.
    fn is_up(&self) -> bool {
        self.order.queue().front() == Some(&self.id)
    }

    fn pass(self) {
        // Dropping it leaves the queue.
    }
}

impl Drop for StartTurn {
    fn drop(&mut self) {
        let mut q = self.order.queue();
        if let Some(i) = q.iter().position(|&x| x == self.id) {
            q.remove(i);
            self.order.queued.fetch_sub(1, Ordering::Release);
            crate::common::progress::made_progress();
        }
    }
}

/// Waits for a set of MPI requests by polling `MPI_Test`.
struct WaitRequests {
    reqs: Vec<RawRequest>,
}

impl Future for WaitRequests {
    type Output = Result<()>;
    fn poll(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Result<()>> {
        let this = self.get_mut();
        let mut done = true;
        for r in &mut this.reqs {
            if r.0 != RawRequest::null().0 {
                match p2p::test(r) {
                    Ok(Some(_)) => crate::common::progress::made_progress(),
                    Ok(None) => done = false,
                    Err(e) => return Poll::Ready(Err(e)),
                }
            }
        }
        if done { Poll::Ready(Ok(())) } else { Poll::Pending }
    }
}

impl Drop for WaitRequests {
    fn drop(&mut self) {
        for r in &mut self.reqs {
            p2p::cancel_and_wait(r);
        }
    }
}

/// Starts native `calls` with the non-blocking MPI calls: their requests, and the error that
/// stopped the starting, if one did.
///
/// # Safety
/// As [`Native::start`], for every call, until the requests complete: the calls were planned
/// from buffers that their caller keeps borrowed until then (a scope, or an operation's own
/// staging memory), and `calls` outlives the requests.
unsafe fn start_all(calls: &[Native], dt: RawDatatype, comm: RawComm) -> (WaitRequests, Option<crate::Error>) {
    let mut reqs = Vec::with_capacity(calls.len());
    for call in calls {
        // SAFETY: guaranteed by the caller.
        match unsafe { call.start(dt, comm) } {
            Ok(r) => reqs.push(r),
            Err(e) => return (WaitRequests { reqs }, Some(e)),
        }
    }
    (WaitRequests { reqs }, None)
}

impl MpiCommunicator {
    /// Puts a native job above [`NATIVE_UNCHECKED_BYTES`] behind the signature check of the
    /// current operation (`check` false: it was checked already, as a HostTransfer operation's
    /// earlier chunk was), unless every call is checked already (`DURALUMIN_CHECK`), and any
    /// native job behind one that waits ([`StartOrder`]). Other jobs are returned as they are.
    pub(crate) fn gate<T>(&self, mut job: Job<T>, check: bool) -> Job<T> {
        if let Job::Native { bytes, gate, .. } = &mut job {
            let m = &self.core.monitor;
            if check && *bytes > NATIVE_UNCHECKED_BYTES && self.size() > 1 {
                gate.check = self
                    .current
                    .get()
                    .filter(|(_, sig)| !m.checks(sig))
                    .map(|(op, sig)| Box::new((Arc::clone(m), op, sig)));
            }
            let order = &self.core.start_order;
            if gate.check.is_some() || !order.is_empty() {
                gate.turn = Some(order.enqueue());
            }
        }
        job
    }

    /// Runs a job to completion on this thread.
    pub(crate) fn run<T: Element>(&self, job: Job<T>) -> Result<()> {
        match job {
            Job::Native { dt, calls, post, mut gate, .. } => {
                gate.open_blocking()?;
                for call in &calls {
                    // SAFETY: the call was planned from buffers borrowed by the public method
                    // that is running it now, with counts checked against their lengths.
                    unsafe { call.run(dt, self.core.coll) }?;
                }
                gate.started();
                for p in &post {
                    // SAFETY: the data movement completed; the buffers are still borrowed.
                    unsafe { p.apply() };
                }
                Ok(())
            }
            Job::Future(f) => block_on(f),
        }
    }

    /// Starts a job's MPI calls (at once, unless its gate is closed) and returns the future
    /// that completes it (polled by a blocking waiter, the progress engine, or an enclosing
    /// operation's future).
    pub(crate) fn job_future<T: Element>(&self, job: Job<T>) -> OpFuture {
        let (dt, calls, post, mut gate) = match job {
            Job::Future(f) => return f,
            Job::Native { dt, calls, post, gate, .. } => (dt, calls, post, gate),
        };
        let coll = self.core.coll;
        let finish = move |post: Vec<Post<T>>| {
            for p in &post {
                // SAFETY: the data movement completed; the buffers are still borrowed.
                unsafe { p.apply() };
            }
        };
        if gate.is_open() {
            // SAFETY: see `start_all`; `calls` moves into the future, which lives until the
            // requests complete.
            let (wait, failed) = unsafe { start_all(&calls, dt, coll) };
            return Box::pin(async move {
                let _keep_alive = calls;
                wait.await?;
                if let Some(e) = failed {
                    return Err(e);
                }
                finish(post);
                Ok(())
            });
        }
        Box::pin(async move {
            gate.open().await?;
            // SAFETY: as above.
            let (wait, failed) = unsafe { start_all(&calls, dt, coll) };
            gate.started();
            wait.await?;
            if let Some(e) = failed {
                return Err(e);
            }
            finish(post);
            Ok(())
        })
    }

    /// Hands an operation's future to the progress engine (after one poll here).
    pub(crate) fn start<'s>(&'s self, scope: &'s Scope<'s, '_>, fut: OpFuture) -> Result<Request<'s>> {
        let engine = self.engine()?;
        let task = Task::new(fut);
        if !task.poll_once() {
            engine.submit(Arc::clone(&task));
        }
        Ok(scope.register(task, Arc::clone(&self.core.errors)))
    }

    /// Numbers and records an operation that begins now (see [`crate::reliability`]); fails
    /// at once if the communicator was given up.
    pub(crate) fn begin(&self, sig: Signature) -> Result<OpId> {
        self.core.monitor.begin(sig, State::Running)
    }

    /// Plans a recorded operation (see [`crate::reliability::prepare`]) and gates it (see
    /// [`MpiCommunicator::gate`]).
    pub(crate) fn prepare<T>(
        &self,
        op: OpId,
        sig: &Signature,
        pairs: Option<Pairs>,
        plan: &mut dyn FnMut() -> Result<Job<T>>,
    ) -> Result<Job<T>> {
        // A refused operation sends nothing, so it gives back the algorithm tags its plan took:
        // a rank whose own checks refuse it plans nothing, and every rank must stay in step.
        let seq = self.seq.get();
        self.set_current(op, *sig);
        let r = crate::reliability::prepare(&self.core.monitor, &self.core.errors, op, sig, pairs, plan);
        if r.is_err() {
            self.seq.set(seq);
        }
        r.map(|job| self.gate(job, true))
    }

    /// Runs a planned operation to completion on this thread and records how it ended.
    pub(crate) fn run_op<T: Element>(&self, op: OpId, job: Job<T>) -> Result<()> {
        let r = self.run(job);
        self.core.monitor.end(op, r)
    }

    /// [`MpiCommunicator::run_op`] for an operation on shadow copies: driven through MPI's
    /// non-blocking calls and, if the communicator is given up meanwhile, abandoned with them.
    pub(crate) fn run_shadowed<T: Element>(&self, op: OpId, job: Job<T>, shadow: Shadow) -> Result<()> {
        block_on(shadowed(self.job_future(job), Arc::clone(&self.core.monitor), op, shadow))
    }

    /// Starts a planned operation on the progress engine; its request completes with how it
    /// ended, recorded. With shadow copies, it is abandoned with them if the communicator is
    /// given up.
    pub(crate) fn start_op<'s, T: Element>(
        &'s self,
        scope: &'s Scope<'s, '_>,
        op: OpId,
        job: Job<T>,
        shadow: Option<Shadow>,
    ) -> Result<Request<'s>> {
        let inner = self.job_future(job);
        let m = Arc::clone(&self.core.monitor);
        let fut: OpFuture = match shadow {
            None => Box::pin(async move {
                let r = inner.await;
                m.end(op, r)
            }),
            Some(shadow) => Box::pin(shadowed(inner, m, op, shadow)),
        };
        self.start(scope, fut)
    }
}

/// An operation on shadow copies, recorded: copied back when it completes; abandoned with its
/// copies (which MPI may still use) if the communicator is given up first.
async fn shadowed(inner: OpFuture, m: Arc<Monitor>, op: OpId, shadow: Shadow) -> Result<()> {
    match crate::common::progress::unless(inner, || m.poisoned().map(|p| p.error(Asker::Op(op)))).await {
        Ok(r) => {
            if r.is_ok() {
                // SAFETY: the operation completed; the public method (or the request's scope)
                // still borrows the caller's buffers.
                unsafe { shadow.commit() };
            } else {
                // A failed operation may leave sends MPI still reads from the copies
                // (`transport::OnError::Abandon`).
                shadow.abandon();
            }
            m.end(op, r)
        }
        Err(e) => {
            shadow.abandon();
            Err(e)
        }
    }
}
