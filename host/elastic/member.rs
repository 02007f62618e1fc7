//! What the elastic driver needs of the communicator a step runs on: to be woken out of a
//! pending operation when another rank gives up, and to return its errors.

use std::time::Duration;

use crate::api::error::Result;
use crate::reliability::OnTimeout;

/// A communicator an elastic step runs its collectives on, rebuilt by the driver after every
/// change of membership: [`crate::MpiCommunicator`], [`crate::HostTransferCommunicator`] and
/// `NcclCommunicator`.
pub trait Member {
    /// Makes every pending and later operation on this communicator fail, here and on the
    /// other ranks (an MPI revoke; for NCCL, an abort of the NCCL communicator), so that no
    /// rank stays waiting in a step that another rank gave up.
    fn give_up(&self) -> Result<()>;

    /// Makes a deadline or a failed peer return an error from the operation (rather than
    /// end the job), with `timeout` as every operation's deadline.
    fn return_errors(&mut self, timeout: Duration);
}

impl Member for crate::MpiCommunicator {
    fn give_up(&self) -> Result<()> {
        self.revoke()
    }

    fn return_errors(&mut self, timeout: Duration) {
        self.set_on_timeout(OnTimeout::Error);
        self.set_timeout(Some(timeout));
    }
}

impl<D: crate::device::Device> Member for crate::HostTransferCommunicator<D> {
    fn give_up(&self) -> Result<()> {
        self.revoke()
    }

    fn return_errors(&mut self, timeout: Duration) {
        self.set_on_timeout(OnTimeout::Error);
        self.set_timeout(Some(timeout));
    }
}

#[cfg(any(feature = "cuda", feature = "hip"))]
impl<D: crate::NcclDevice> Member for crate::NcclCommunicator<D> {
    fn give_up(&self) -> Result<()> {
        self.abort();
        Ok(())
    }

    fn return_errors(&mut self, timeout: Duration) {
        // NCCL's operations always return their errors (its watchdog aborts the NCCL
        // communicator at the deadline); only the deadline is set.
        self.set_timeout(Some(timeout));
    }
}
