//! One operation's work on its stream: NCCL calls in groups, scratch, copies and reduce
//! kernels. Groups are cut where every rank cuts them: a list every rank issues alike is cut
//! every [`MAX_GROUP`] calls; point-to-point exchanges are cut by rounds (round `k`: send to
//! `rank + k`, receive from `rank - k`), so a send and its receive are always in the same
//! group on both sides.

use std::ffi::{c_int, c_void};

use super::{NcclCommunicator, NcclDevice};
use crate::api::error::Result;
use crate::device::{DevicePtr, ReduceFns};
use crate::ffi::nccl::{Call, Progress, int, sys::dtype};

/// The most calls in one NCCL group.
pub(crate) const MAX_GROUP: usize = 1024;
/// Rounds per group of an exchange (a send and a receive each).
const ROUNDS_PER_GROUP: usize = MAX_GROUP / 2;

/// A message of an exchange: `bytes` at `ptr`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Piece {
    pub(crate) ptr: DevicePtr,
    pub(crate) bytes: usize,
}

/// The work of one operation on one stream. Scratch is freed in stream order when it drops.
pub(crate) struct Launch<'c, D: NcclDevice> {
    comm: &'c NcclCommunicator<D>,
    stream: &'c D::Stream,
    scratch: Vec<DevicePtr>,
}

impl<'c, D: NcclDevice> Launch<'c, D> {
    pub(crate) fn new(comm: &'c NcclCommunicator<D>, stream: &'c D::Stream) -> Result<Self> {
        comm.live()?;
        comm.device.bind()?;
        Ok(Launch { comm, stream, scratch: Vec::new() })
    }

    pub(crate) fn rank(&self) -> usize {
        self.comm.rank
    }

    pub(crate) fn size(&self) -> usize {
        self.comm.size
    }

    /// Whether the library has native all-to-all, gather and scatter (NCCL 2.28 and later);
    /// without them those operations are grouped sends and receives.
    pub(crate) fn has_exchanges(&self) -> bool {
        self.comm.nccl().has_exchanges()
    }

    /// Queues `calls` in groups of at most [`MAX_GROUP`], cut at the same indices on every
    /// rank that issues the same list.
    pub(crate) fn grouped(&mut self, calls: &[Call]) -> Result<()> {
        for group in calls.chunks(MAX_GROUP) {
            self.group(group)?;
        }
        Ok(())
    }

    /// One NCCL group of `calls` (nothing for none), polled until queued.
    fn group(&mut self, calls: &[Call]) -> Result<()> {
        if calls.is_empty() {
            return Ok(());
        }
        // Held through the group: the watchdog cannot abort the communicator under a call.
        let live = self.comm.live()?;
        let comm = live.comm();
        let (nccl, raw) = (self.comm.nccl(), self.comm.device.raw_stream(self.stream));
        nccl.group_start()?;
        let mut queued = Ok(());
        for call in calls {
            // SAFETY: every call's buffers were checked by the operation's planner to be device
            // memory of this device holding what the call reads and writes; the operation's
            // borrows (or the stream-ordered contract) keep them valid until the stream has
            // run it; the communicator is live and locked by this thread.
            queued = unsafe { nccl.queue(call, comm, raw) };
            if queued.is_err() {
                break;
            }
        }
        // The group is ended even after a failed call, so the thread's group state is clean.
        let ended = nccl.group_end(comm);
        queued?;
        if ended? == Progress::InProgress {
            // SAFETY: the live communicator.
            unsafe { nccl.wait_ready(comm, "ncclGroupEnd", Some(self.comm.deadline())) }?;
        }
        Ok(())
    }

    /// A point-to-point exchange by rounds: in round `k` (1..size) this rank sends
    /// `send(rank + k)` and receives `recv(rank - k)` (ranks modulo size; `None` or empty:
    /// nothing). At most one message per peer and direction, so [`Launch::messages`] groups
    /// them by windows of rounds alone, which both sides of a pair agree on.
    pub(crate) fn exchange(
        &mut self,
        send: impl Fn(usize) -> Option<Piece>,
        recv: impl Fn(usize) -> Option<Piece>,
    ) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let nonempty = |p: &Piece| p.bytes > 0;
        let sends: Vec<(Piece, usize)> =
            (1..n).map(|k| (r + k) % n).filter_map(|to| send(to).filter(nonempty).map(|p| (p, to))).collect();
        let recvs: Vec<(Piece, usize)> =
            (1..n).map(|k| (r + n - k) % n).filter_map(|from| recv(from).filter(nonempty).map(|p| (p, from))).collect();
        self.messages(&sends, &recvs)
    }

    /// Point-to-point lists (each rank its own): messages are grouped by (window of rounds,
    /// index among the messages to or from the same peer), which both sides of a pair agree
    /// on, and queued in that order (round of a message to `peer`: `peer - rank`; from `peer`:
    /// `rank - peer`).
    pub(crate) fn messages(&mut self, sends: &[(Piece, usize)], recvs: &[(Piece, usize)]) -> Result<()> {
        let (n, r) = (self.size(), self.rank());
        let mut keyed: Vec<((usize, usize), Call)> = Vec::with_capacity(sends.len() + recvs.len());
        let mut nth = vec![(0usize, 0usize); n];
        for &(p, peer) in sends {
            let layer = nth[peer].0;
            nth[peer].0 += 1;
            let round = (peer + n - r) % n;
            let call = Call::Send {
                buf: p.ptr.addr() as *const c_void,
                count: p.bytes,
                dtype: dtype::UINT8,
                peer: int(peer, "peer")?,
            };
            keyed.push(((round / ROUNDS_PER_GROUP, layer), call));
        }
        for &(p, peer) in recvs {
            let layer = nth[peer].1;
            nth[peer].1 += 1;
            let round = (r + n - peer) % n;
            let call = Call::Recv {
                buf: p.ptr.addr() as *mut c_void,
                count: p.bytes,
                dtype: dtype::UINT8,
                peer: int(peer, "peer")?,
            };
            keyed.push(((round / ROUNDS_PER_GROUP, layer), call));
        }
        // Stable: within a group, the calls keep list order.
        keyed.sort_by_key(|(k, _)| *k);
        for group in keyed.chunk_by(|a, b| a.0 == b.0) {
            let calls: Vec<Call> = group.iter().map(|(_, c)| *c).collect();
            self.grouped(&calls)?;
        }
        Ok(())
    }

    /// `bytes` of scratch, freed in stream order after the operation.
    pub(crate) fn scratch(&mut self, bytes: usize) -> Result<DevicePtr> {
        let p = self.comm.device.scratch(self.stream, bytes)?;
        self.scratch.push(p);
        Ok(p)
    }

    /// Queues a device-to-device copy.
    pub(crate) fn copy(&self, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: the planner checked both ranges lie in the operation's buffers or scratch,
        // valid until the stream has run the copy.
        unsafe { self.comm.device.copy_d2d(self.stream, dst, src, bytes) }
    }

    /// Queues `dst = combine(dst, src)` over `len` elements.
    pub(crate) fn reduce(&self, dst: DevicePtr, src: DevicePtr, len: usize, op: &ReduceFns) -> Result<()> {
        // SAFETY: as `copy`; `dst` and `src` are different blocks.
        unsafe { self.comm.device.reduce_d2d(self.stream, dst, src, len, op) }
    }

    /// Queues the operator's finish over `len` elements.
    pub(crate) fn finish(&self, dst: DevicePtr, len: usize, op: &ReduceFns) -> Result<()> {
        // SAFETY: as `copy`.
        unsafe { self.comm.device.finish_d2d(self.stream, dst, len, op) }
    }
}

impl<D: NcclDevice> Drop for Launch<'_, D> {
    fn drop(&mut self) {
        for p in self.scratch.drain(..) {
            // SAFETY: every use of the scratch was queued on this stream before this point.
            unsafe { self.comm.device.free_scratch(self.stream, p) };
        }
    }
}

/// A rank as NCCL's `int`.
pub(crate) fn root(r: usize) -> Result<c_int> {
    int(r, "root")
}
