//! Requests of non-blocking HostTransfer operations.

use std::marker::PhantomData;
use std::sync::Arc;

use duralumin_kernels::flag::reached;

use super::Shared;
use super::staging::Queued;
use crate::api::error::Result;
use crate::api::request::ErrorSlot;
use crate::common::progress::Task;
use crate::device::pool::FlagSlot;
use crate::device::{Device, GiveUp, KeepAlive};
use crate::reliability::OnTimeout;
use crate::reliability::monitor::Asker;

/// A non-blocking HostTransfer operation in flight on the communicator's internal stream.
///
/// It borrows the operation's device buffers (lifetime `'a`), so safe code cannot queue other
/// work on them until it is done. [`DeviceRequest::wait`] blocks the host until the operation
/// has completed; [`DeviceRequest::stream_wait`] hands the request to a stream, which waits for
/// it on the device, without blocking the host (torch's and NCCL's `work.wait()`).
///
/// [`test`](Self::test) and [`wait`](Self::wait) report this operation's own error, as the Mpi
/// backend's [`Request`](crate::Request) does, and no other operation's (those are reported by
/// the communicator's next call). An error the request does not report (it was dropped
/// unfinished, handed to a stream, or the error came after the request had reported) is
/// reported by the communicator's next call. Dropping an unfinished request waits for it. A
/// send-only operation (a bcast root, a send) completes once its data is staged, while MPI may
/// still be sending it from pinned memory; an MPI error after that point is reported by the
/// communicator's next call.
#[must_use = "a request must be waited on (dropping it waits and defers its error)"]
pub struct DeviceRequest<'a, D: Device> {
    /// The flag the stream raises once the operation has completed there, and its host part,
    /// which a waiting thread drives too (`None`: it ran through on the calling thread).
    pending: Option<(Arc<FlagSlot<D>>, Arc<Task>)>,
    /// The internal stream the operation runs on.
    stream: D::Stream,
    shared: Arc<Shared<D>>,
    /// The operation's own error, until the request reports it or lets it go.
    errors: Arc<ErrorSlot>,
    reported: bool,
    /// Handed to a stream by [`DeviceRequest::stream_wait`]: dropping it does not wait.
    handed_over: bool,
    _buffers: PhantomData<&'a mut ()>,
}

impl<D: Device> std::fmt::Debug for DeviceRequest<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceRequest").field("complete", &self.is_complete()).finish()
    }
}

impl<'a, D: Device> DeviceRequest<'a, D> {
    pub(crate) fn new(queued: Queued<D>, stream: D::Stream, shared: Arc<Shared<D>>) -> Self {
        let Queued { pending, errors } = queued;
        DeviceRequest { pending, stream, shared, errors, reported: false, handed_over: false, _buffers: PhantomData }
    }

    /// Whether the operation has completed on the device.
    pub fn is_complete(&self) -> bool {
        self.pending.as_ref().is_none_or(|(done, _)| reached(done.load(), 1))
    }

    /// Whether the operation has completed; the first time it has, returns the operation's
    /// error, if it had one (or the communicator's being given up). Polls the operation's host
    /// part once on the calling thread, as `MPI_Test` makes progress.
    pub fn test(&mut self) -> Result<bool> {
        if let Some((_, task)) = &self.pending {
            task.poll_once();
        }
        let given_up = self.shared.monitor.poisoned();
        if !self.is_complete() && given_up.is_none() {
            return Ok(false);
        }
        if !self.reported {
            self.reported = true;
            self.errors.take()?;
            if let Some(p) = given_up {
                return Err(p.error(Asker::Waiter(0)));
            }
        }
        Ok(true)
    }

    /// Blocks until the operation has completed, then returns its error, if it had one (or
    /// the communicator's being given up). While it waits, the calling thread drives the operation's host part (and on
    /// the host device runs the internal stream's queued work), as
    /// [`HostTransferCommunicator::synchronize`](super::HostTransferCommunicator::synchronize) does.
    ///
    /// The wait has the communicator's deadline, as
    /// [`synchronize`](super::HostTransferCommunicator::synchronize) has.
    pub fn wait(mut self) -> Result<()> {
        self.reported = true;
        let wait = self.block();
        self.errors.take()?;
        self.shared.monitor.check_poison(Asker::Waiter(wait))
    }

    /// Makes `stream` wait, on the device, until the operation has completed, and lets the
    /// request go: the host does not block, now or when the request is dropped. Work queued on
    /// `stream` afterwards sees the results; an error of the operation is reported by the
    /// communicator's next call (or its [`synchronize`](super::HostTransferCommunicator::synchronize)).
    ///
    /// The buffers are free for safe code again at once. Every later use of them is ordered
    /// after the operation, as for any operation queued on the communicator's own stream: a
    /// use on `stream` by the wait; host-device buffers by their per-stream uses, and their
    /// downloads synchronize the device; cudarc buffers through their home stream, which waits
    /// for the operation, and cudarc's events. Only a HIP buffer used on a
    /// stream that does not wait for `stream` is unordered with it, as any two HIP streams are.
    ///
    /// On error nothing was queued and the request is dropped as usual (waiting for it).
    pub fn stream_wait(mut self, stream: &D::Stream) -> Result<()> {
        if let Some((done, _)) = &self.pending {
            let keep: KeepAlive = Arc::clone(done) as KeepAlive;
            // SAFETY: `keep` holds the flag's slot until the wait has finished; the proxy thread
            // and the internal stream raise the flag independently of `stream`.
            unsafe { self.shared.device.wait_flag(stream, done.flag(), 1, Some(keep)) }?;
        }
        self.handed_over = true;
        Ok(())
    }

    /// Waits for the operation (or until the communicator is given up, under
    /// [`OnTimeout::Error`]), as a wait the watchdog watches; returns the wait's id (0 for an
    /// operation that ran through on the calling thread: nothing to wait for).
    fn block(&self) -> u64 {
        let Some((done, task)) = &self.pending else { return 0 };
        let m = &self.shared.monitor;
        let wait = m.wait_begin("a request's wait");
        let mut help = || !task.poll_once();
        let stop = || m.poisoned().is_some();
        let give_up: GiveUp<'_> = (m.on_timeout() == OnTimeout::Error).then_some(&stop);
        // SAFETY: `done` holds the flag's slot until this returns.
        unsafe { self.shared.device.host_wait_helping(&self.stream, done.flag(), 1, &mut help, give_up) };
        m.wait_end(wait);
        wait
    }
}

impl<D: Device> Drop for DeviceRequest<'_, D> {
    fn drop(&mut self) {
        if !self.handed_over {
            self.block();
        }
        self.errors.let_go();
    }
}
