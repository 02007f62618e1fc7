//! Requests of non-blocking NCCL operations.

use std::marker::PhantomData;

use super::{NcclCommunicator, NcclDevice};
use crate::error::Result;

/// A non-blocking NCCL operation in flight on the communicator's internal stream.
///
/// It borrows the operation's buffers (lifetime `'a`), so safe code cannot touch them until it
/// is done. [`wait`](Self::wait) blocks the host until the internal stream has run everything
/// queued on it so far (this operation included), with the communicator's deadline and its
/// asynchronous-error checks; [`stream_wait`](Self::stream_wait) makes a stream wait for it
/// on the device instead. Dropping an unfinished request waits for it.
#[must_use = "a request must be waited on (dropping it waits)"]
pub struct NcclRequest<'a, D: NcclDevice> {
    comm: &'a NcclCommunicator<D>,
    stream: D::Stream,
    done: bool,
    _buffers: PhantomData<&'a mut ()>,
}

impl<D: NcclDevice> std::fmt::Debug for NcclRequest<'_, D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NcclRequest").field("done", &self.done).finish_non_exhaustive()
    }
}

impl<'a, D: NcclDevice> NcclRequest<'a, D> {
    pub(crate) fn new(comm: &'a NcclCommunicator<D>, stream: &D::Stream) -> Self {
        NcclRequest { comm, stream: stream.clone(), done: false, _buffers: PhantomData }
    }

    /// Whether the operation (and everything queued before it on the internal stream) has
    /// completed; reports the communicator's asynchronous error.
    pub fn test(&mut self) -> Result<bool> {
        if self.done {
            return Ok(true);
        }
        let comm = self.comm.live()?;
        // SAFETY: the live communicator (any thread may ask).
        unsafe { self.comm.nccl().async_error(comm) }?;
        self.done = self.comm.device.query(&self.stream)?;
        Ok(self.done)
    }

    /// Blocks until the operation has completed; past the communicator's deadline it is
    /// aborted ([`Error::Timeout`](crate::Error::Timeout)).
    pub fn wait(mut self) -> Result<()> {
        self.done = true;
        self.comm.wait_stream(&self.stream)
    }

    /// Makes `stream` wait on the device for the operation and lets the request go, without
    /// blocking the host. Work queued on `stream` afterwards sees the results.
    pub fn stream_wait(mut self, stream: &D::Stream) -> Result<()> {
        self.comm.device.join(stream, &self.stream)?;
        self.done = true;
        Ok(())
    }
}

impl<D: NcclDevice> Drop for NcclRequest<'_, D> {
    fn drop(&mut self) {
        if !self.done
            && let Err(e) = self.comm.wait_stream(&self.stream)
        {
            tracing::warn!("a dropped NCCL request failed: {e}");
        }
    }
}
