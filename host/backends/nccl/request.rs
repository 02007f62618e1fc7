//! Requests of non-blocking NCCL operations.

use std::marker::PhantomData;

use super::{NcclCommunicator, NcclDevice, Tracked};
use crate::api::error::Result;

/// A non-blocking NCCL operation in flight on the communicator's internal stream.
///
/// It borrows the operation's buffers (lifetime `'a`), so safe code cannot touch them until it
/// is done. Completion is the operation's own event, recorded after its work: requests
/// complete one by one, whatever else is queued after them. [`wait`](Self::wait) blocks the
/// host until then, with the communicator's deadline and its asynchronous-error checks;
/// [`stream_wait`](Self::stream_wait) makes a stream wait for it on the device instead.
/// Dropping an unfinished request waits for it.
#[must_use = "a request must be waited on (dropping it waits)"]
pub struct NcclRequest<'a, D: NcclDevice> {
    comm: &'a NcclCommunicator<D>,
    op: Tracked<D>,
    done: bool,
    _buffers: PhantomData<&'a mut ()>,
}

impl<D: NcclDevice> std::fmt::Debug for NcclRequest<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclRequest")
            .field("op", &self.op.op)
            .field("seq", &self.op.seq)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl<'a, D: NcclDevice> NcclRequest<'a, D> {
    pub(crate) fn new(comm: &'a NcclCommunicator<D>, op: Tracked<D>) -> Self {
        NcclRequest { comm, op, done: false, _buffers: PhantomData }
    }

    /// Whether the operation has completed; reports the communicator's asynchronous error
    /// (or the error of an abort since).
    pub fn test(&mut self) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        let live = self.comm.live()?;
        // SAFETY: the live communicator, locked.
        unsafe { self.comm.nccl().async_error(live.comm()) }?;
        drop(live);
        self.done = self.comm.device.event_done(&self.op.done)?;
        Ok(self.done)
    }

    /// Blocks until the operation has completed; past the communicator's deadline it is
    /// aborted ([`Error::Timeout`](crate::Error::Timeout)).
    pub fn wait(mut self) -> Result<()> {
        self.done = true;
        self.comm.wait_tracked(&self.op)
    }

    /// Makes `stream` wait on the device for the operation and lets the request go, without
    /// blocking the host. Work queued on `stream` afterwards sees the results.
    pub fn stream_wait(mut self, stream: &D::Stream) -> Result<()> {
        self.comm.device.wait_event(stream, &self.op.done)?;
        self.done = true;
        Ok(())
    }
}

impl<D: NcclDevice> Drop for NcclRequest<'_, D> {
    fn drop(&mut self) {
        if !self.done
            && let Err(e) = self.comm.wait_tracked(&self.op)
        {
            tracing::warn!("a dropped NCCL request failed: {e}");
        }
    }
}
