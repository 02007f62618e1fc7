//! Scopes and requests: how non-blocking operations borrow their buffers soundly.
//!
//! A non-blocking call borrows its buffers (and its communicator) for the lifetime `'s` of a
//! [`Scope`], exactly like `std::thread::scope`: the buffers cannot be touched by safe code
//! until the request completes, and the scope does not return until every request started in
//! it has completed. That holds even if a request is leaked with `mem::forget`, so MPI can
//! never write into freed memory.

use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::api::error::{Error, Result};
use crate::common::progress::Task;

/// Where a request whose outcome nobody collected leaves its error: the communicator reports it
/// from its next call (like cudarc's `record_err`/`check_err`). Errors are kept in order and
/// reported one per call; none is dropped silently: past [`DeferredError::KEPT`] waiting errors,
/// a further one is logged (`tracing::warn!`) and counted, and the count is reported with the
/// last one kept.
#[derive(Debug, Default)]
pub(crate) struct DeferredError {
    queue: Mutex<Deferred>,
    /// Whether `queue` holds an error (written under its lock).
    waiting: AtomicBool,
}

#[derive(Debug, Default)]
struct Deferred {
    errors: std::collections::VecDeque<Error>,
    /// Errors logged but not kept, since the queue was full.
    dropped: usize,
}

impl DeferredError {
    /// How many errors wait at most.
    pub(crate) const KEPT: usize = 64;

    pub(crate) fn record(&self, e: Error) {
        let mut d = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if d.errors.len() < Self::KEPT {
            d.errors.push_back(e);
            // Set under the lock: a `check` that finds it clear has nothing to take.
            self.waiting.store(true, Ordering::Release);
        } else {
            tracing::warn!("an operation's error was not kept ({} are waiting to be reported): {e}", Self::KEPT);
            d.dropped += 1;
        }
    }

    /// The oldest error not yet reported, if any.
    pub(crate) fn check(&self) -> Result<()> {
        if !self.waiting.load(Ordering::Acquire) {
            // Nothing waits (the lock is not taken for nothing on every call).
            return Ok(());
        }
        let mut d = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(e) = d.errors.pop_front() else { return Ok(()) };
        if d.errors.is_empty() {
            self.waiting.store(false, Ordering::Release);
        }
        match std::mem::take(&mut d.dropped) {
            0 => Err(e),
            more if d.errors.is_empty() => Err(Error::Deferred { first: Box::new(e), more }),
            more => {
                d.dropped = more;
                Err(e)
            }
        }
    }
}

/// Where the error of one operation goes: to its request while the request is there to report
/// it, else (an operation without a request, or once its request let it go) to the
/// communicator's [`DeferredError`]. So a request reports its own operation's error, as
/// `MPI_Wait` does, and no other; and an error nobody will collect from the request is still
/// reported by the communicator.
#[derive(Debug)]
pub(crate) struct ErrorSlot {
    deferred: Arc<DeferredError>,
    state: Mutex<Slot>,
}

#[derive(Debug)]
enum Slot {
    /// A request will collect the error.
    Held(Option<Error>),
    /// Errors go to the communicator.
    LetGo,
}

impl ErrorSlot {
    /// The slot of an operation whose request reports its error.
    pub(crate) fn for_request(deferred: &Arc<DeferredError>) -> Arc<Self> {
        Arc::new(ErrorSlot { deferred: Arc::clone(deferred), state: Mutex::new(Slot::Held(None)) })
    }

    /// The slot of an operation without a request: errors go to the communicator.
    pub(crate) fn for_communicator(deferred: &Arc<DeferredError>) -> Arc<Self> {
        Arc::new(ErrorSlot { deferred: Arc::clone(deferred), state: Mutex::new(Slot::LetGo) })
    }

    /// Records an error of the operation. A second one while the first waits for the request
    /// goes to the communicator, so neither is lost.
    pub(crate) fn record(&self, e: Error) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *state {
            Slot::Held(held @ None) => *held = Some(e),
            Slot::Held(Some(_)) | Slot::LetGo => self.deferred.record(e),
        }
    }

    /// The request's report: the operation's error so far, if any. Errors recorded later go to
    /// the communicator.
    pub(crate) fn take(&self) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match std::mem::replace(&mut *state, Slot::LetGo) {
            Slot::Held(Some(e)) => Err(e),
            Slot::Held(None) | Slot::LetGo => Ok(()),
        }
    }

    /// The request goes without reporting: an error it holds, and any later one, go to the
    /// communicator.
    pub(crate) fn let_go(&self) {
        if let Err(e) = self.take() {
            self.deferred.record(e);
        }
    }
}

/// A region in which non-blocking operations may borrow data. Made by [`scope`].
#[derive(Debug)]
pub struct Scope<'s, 'env: 's> {
    tasks: Mutex<Vec<(Arc<Task>, Arc<DeferredError>)>>,
    _scope: PhantomData<&'s mut &'s ()>,
    _env: PhantomData<&'env mut &'env ()>,
}

/// Runs `f` with a [`Scope`] for non-blocking operations, and waits for every operation
/// started in it before returning.
///
/// ```no_run
/// # fn demo(comm: &duralumin::MpiCommunicator) -> duralumin::Result<()> {
/// let send = vec![1.0f32; 1024];
/// let mut recv = vec![0.0f32; 1024];
/// duralumin::scope(|s| {
///     let req = comm.iallreduce(s, &send, &mut recv, duralumin::Sum)?;
///     // ... compute while the allreduce progresses ...
///     req.wait()
/// })?;
/// # Ok(()) }
/// ```
///
/// Errors of requests that were dropped without `wait` are reported by the next call on their
/// communicator.
pub fn scope<'env, F, R>(f: F) -> R
where
    F: for<'s> FnOnce(&'s Scope<'s, 'env>) -> R,
{
    let scope = Scope { tasks: Mutex::new(Vec::new()), _scope: PhantomData, _env: PhantomData };
    // Waits even if `f` panics, so no operation outlives the borrowed buffers.
    struct JoinOnExit<'a, 's, 'env>(&'a Scope<'s, 'env>);
    impl Drop for JoinOnExit<'_, '_, '_> {
        fn drop(&mut self) {
            self.0.join_all();
        }
    }
    let guard = JoinOnExit(&scope);
    let out = f(guard.0);
    drop(guard);
    out
}

impl<'s> Scope<'s, '_> {
    pub(crate) fn register(&'s self, task: Arc<Task>, errors: Arc<DeferredError>) -> Request<'s> {
        self.tasks.lock().unwrap_or_else(PoisonError::into_inner).push((Arc::clone(&task), Arc::clone(&errors)));
        Request { task, errors, reported: false, _scope: PhantomData }
    }

    fn join_all(&self) {
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(PoisonError::into_inner));
        for (task, errors) in tasks {
            if let Err(e) = task.wait() {
                errors.record(e);
            }
        }
    }
}

/// A non-blocking operation in flight.
///
/// Completes by [`Request::wait`] or [`Request::test`]; it also progresses on its own (on the
/// progress thread) while the caller does other work. Dropping an unfinished request waits for
/// it; an error it had is then reported by the next call on its communicator.
#[derive(Debug)]
#[must_use = "a request must be waited on (dropping it waits and defers its error)"]
pub struct Request<'s> {
    task: Arc<Task>,
    errors: Arc<DeferredError>,
    reported: bool,
    _scope: PhantomData<&'s ()>,
}

impl Request<'_> {
    /// Whether the operation has completed, polling it once. Returns its error the first time
    /// it is seen complete with one.
    pub fn test(&mut self) -> Result<bool> {
        if !self.task.poll_once() {
            return Ok(false);
        }
        if !self.reported {
            self.reported = true;
            self.task.take_result()?;
        }
        Ok(true)
    }

    /// Whether the operation has completed, without polling it (so only the progress thread
    /// or another waiter can have completed it).
    pub fn is_complete(&self) -> bool {
        self.task.is_done()
    }

    /// Waits for completion (driving the operation on this thread) and returns its outcome.
    pub fn wait(mut self) -> Result<()> {
        self.reported = true;
        self.task.wait()
    }

    /// Waits for every request, returning the first error after all have completed.
    pub fn wait_all(requests: impl IntoIterator<Item = Self>) -> Result<()> {
        let mut first = Ok(());
        for r in requests {
            let res = r.wait();
            if first.is_ok() {
                first = res;
            }
        }
        first
    }
}

impl Drop for Request<'_> {
    fn drop(&mut self) {
        if !self.reported {
            if let Err(e) = self.task.wait() {
                self.errors.record(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::DeferredError;
    use crate::api::error::Error;

    fn progress(what: &'static str) -> Error {
        Error::Progress(what)
    }

    /// A request's error goes to the request, not to the communicator; once the request let go
    /// (or for an operation without one), errors go to the communicator.
    #[test]
    fn an_operations_error_goes_to_its_request_while_it_waits() {
        use std::sync::Arc;

        use super::ErrorSlot;
        let deferred = Arc::new(DeferredError::default());
        let slot = ErrorSlot::for_request(&deferred);
        slot.record(progress("mine"));
        slot.record(progress("second"));
        assert!(matches!(slot.take(), Err(Error::Progress("mine"))));
        assert!(matches!(deferred.check(), Err(Error::Progress("second"))), "a second error goes to the communicator");
        slot.record(progress("after the report"));
        assert!(slot.take().is_ok());
        assert!(matches!(deferred.check(), Err(Error::Progress("after the report"))));
        assert!(deferred.check().is_ok());

        let dropped = ErrorSlot::for_request(&deferred);
        dropped.record(progress("uncollected"));
        dropped.let_go();
        assert!(
            matches!(deferred.check(), Err(Error::Progress("uncollected"))),
            "let go: reported by the communicator"
        );

        let blocking = ErrorSlot::for_communicator(&deferred);
        blocking.record(progress("blocking"));
        assert!(blocking.take().is_ok());
        assert!(matches!(deferred.check(), Err(Error::Progress("blocking"))));
    }

    /// Unobserved errors come back one per check, oldest first; past the cap, the count of the
    /// ones not kept comes with the last one kept, and nothing is lost without a word.
    #[test]
    fn deferred_errors_are_reported_in_order_and_counted_past_the_cap() {
        let d = DeferredError::default();
        assert!(d.check().is_ok());
        d.record(progress("first"));
        d.record(progress("second"));
        assert!(matches!(d.check(), Err(Error::Progress("first"))));
        assert!(matches!(d.check(), Err(Error::Progress("second"))));
        assert!(d.check().is_ok());
        for _ in 0..DeferredError::KEPT + 3 {
            d.record(progress("many"));
        }
        for _ in 0..DeferredError::KEPT - 1 {
            assert!(matches!(d.check(), Err(Error::Progress("many"))));
        }
        match d.check() {
            Err(Error::Deferred { first, more: 3 }) => assert!(matches!(*first, Error::Progress("many"))),
            other => panic!("{other:?}"),
        }
        assert!(d.check().is_ok());
    }
}
