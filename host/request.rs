//! Scopes and requests: how non-blocking operations borrow their buffers soundly.
//!
//! A non-blocking call borrows its buffers (and its communicator) for the lifetime `'s` of a
//! [`Scope`], exactly like `std::thread::scope`: the buffers cannot be touched by safe code
//! until the request completes, and the scope does not return until every request started in
//! it has completed. That holds even if a request is leaked with `mem::forget`, so MPI can
//! never write into freed memory.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex, PoisonError};

use crate::error::{Error, Result};
use crate::progress::Task;

/// Where a request whose outcome nobody collected leaves its error: the communicator reports it
/// from its next call (like cudarc's `record_err`/`check_err`). Errors are kept in order and
/// reported one per call; none is dropped silently: past [`DeferredError::KEPT`] waiting errors,
/// a further one is logged (`tracing::warn!`) and counted, and the count is reported with the
/// last one kept.
#[derive(Debug, Default)]
pub(crate) struct DeferredError(Mutex<Deferred>);

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
        let mut d = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if d.errors.len() < Self::KEPT {
            d.errors.push_back(e);
        } else {
            tracing::warn!("an operation's error was not kept ({} are waiting to be reported): {e}", Self::KEPT);
            d.dropped += 1;
        }
    }

    /// The oldest error not yet reported, if any.
    pub(crate) fn check(&self) -> Result<()> {
        let mut d = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(e) = d.errors.pop_front() else { return Ok(()) };
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
    use crate::error::Error;

    fn progress(what: &'static str) -> Error {
        Error::Progress(what)
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
