//! An operation ready to run: native MPI calls or an algorithm future, plus finishing steps;
//! and how it runs blocking or on the progress engine.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use duralumin_kernels::Element;

use super::MpiCommunicator;
use super::shadow::Shadow;
use crate::buffer::RawBuf;
use crate::error::Result;
use crate::ffi::native::Native;
use crate::ffi::{RawDatatype, RawRequest, p2p};
use crate::progress::{OpFuture, Task, block_on};
use crate::reliability::crosscheck::Pairs;
use crate::reliability::monitor::{Asker, Monitor, OpId};
use crate::reliability::recorder::{Signature, State};
use crate::request::{Request, Scope};

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

/// An operation ready to run.
pub(crate) enum Job<T> {
    /// Native MPI collectives (several when a large operation is split), then `post`.
    Native { dt: RawDatatype, calls: Vec<Native>, post: Vec<Post<T>> },
    /// One of Duralumin's algorithms (its future includes any finishing step).
    Future(OpFuture),
}

impl<T> Job<T> {
    pub(crate) fn native(dt: RawDatatype, call: Native) -> Self {
        Job::Native { dt, calls: vec![call], post: Vec::new() }
    }

    pub(crate) fn then(mut self, step: Option<Post<T>>) -> Self {
        if let (Job::Native { post, .. }, Some(step)) = (&mut self, step) {
            post.push(step);
        }
        self
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
                    Ok(Some(_)) => crate::progress::made_progress(),
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

impl MpiCommunicator {
    /// Runs a job to completion on this thread.
    pub(crate) fn run<T: Element>(&self, job: Job<T>) -> Result<()> {
        match job {
            Job::Native { dt, calls, post } => {
                for call in &calls {
                    // SAFETY: the call was planned from buffers borrowed by the public method
                    // that is running it now, with counts checked against their lengths.
                    unsafe { call.run(dt, self.core.coll) }?;
                }
                for p in &post {
                    // SAFETY: the data movement completed; the buffers are still borrowed.
                    unsafe { p.apply() };
                }
                Ok(())
            }
            Job::Future(f) => block_on(f),
        }
    }

    /// Starts a job's MPI calls and returns the future that completes it (polled by a
    /// blocking waiter, the progress engine, or an enclosing operation's future).
    pub(crate) fn job_future<T: Element>(&self, job: Job<T>) -> OpFuture {
        match job {
            Job::Native { dt, calls, post } => {
                let mut reqs = Vec::with_capacity(calls.len());
                let mut first_err = None;
                for call in &calls {
                    // SAFETY: the call was planned from buffers that its caller keeps borrowed
                    // until the returned future completes (a scope, or an operation's own
                    // staging memory), and `calls` moves into the future below so its count
                    // vectors live until the requests complete.
                    match unsafe { call.start(dt, self.core.coll) } {
                        Ok(r) => reqs.push(r),
                        Err(e) => {
                            first_err = Some(e);
                            break;
                        }
                    }
                }
                let wait = WaitRequests { reqs };
                Box::pin(async move {
                    let _keep_alive = calls;
                    wait.await?;
                    if let Some(e) = first_err {
                        return Err(e);
                    }
                    for p in &post {
                        // SAFETY: the data movement completed; the buffers are still borrowed.
                        unsafe { p.apply() };
                    }
                    Ok(())
                }) as OpFuture
            }
            Job::Future(f) => f,
        }
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

    /// Plans a recorded operation (see [`crate::reliability::prepare`]).
    pub(crate) fn prepare<P>(
        &self,
        op: OpId,
        sig: &Signature,
        pairs: Option<Pairs>,
        plan: impl FnOnce() -> Result<P>,
    ) -> Result<P> {
        // A refused operation sends nothing, so it gives back the algorithm tags its plan took:
        // a rank whose own checks refuse it plans nothing, and every rank must stay in step.
        let seq = self.seq.get();
        let r = crate::reliability::prepare(&self.core.monitor, &self.core.errors, op, sig, pairs, plan);
        if r.is_err() {
            self.seq.set(seq);
        }
        r
    }

    /// Whether operations of this kind go through the signature check.
    pub(crate) fn checks(&self, sig: &Signature) -> bool {
        self.core.monitor.checks(sig)
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
    match crate::progress::unless(inner, || m.poisoned().map(|p| p.error(Asker::Op(op)))).await {
        Ok(r) => {
            if r.is_ok() {
                // SAFETY: the operation completed; the public method (or the request's scope)
                // still borrows the caller's buffers.
                unsafe { shadow.commit() };
            }
            m.end(op, r)
        }
        Err(e) => {
            shadow.abandon();
            Err(e)
        }
    }
}
