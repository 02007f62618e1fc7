//! A unit of operations run on its stream: sends first, then receives and collectives in call
//! order. Each collective sends its header and this rank's contribution to every other rank and
//! computes its own result, so every rank checks every other rank's call.

use std::sync::Arc;

use super::checks::{describe, extents};
use super::comm::{Comm, Layout};
use super::faults::Injected;
use super::group::{Kind, Op};
use super::reduce::reducer;
use super::transport::{Key, Stop, Transport};
use super::{INTERNAL, INVALID_USAGE, REMOTE, SYSTEM};
use crate::{Fault, memory};

/// Reads `len` bytes of device memory at `ptr`, which must lie in a live allocation.
fn read(ptr: usize, len: usize, what: &str) -> Result<Vec<u8>, Fault> {
    memory::device_range(ptr as u64, len, what)?;
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: a live allocation's range (checked just now), which the device owns while its
    // work runs.
    Ok(unsafe { std::slice::from_raw_parts(ptr as *const u8, len) }.to_vec())
}

/// Writes `data` to device memory at `ptr`, which must lie in a live allocation.
fn write(ptr: usize, data: &[u8], what: &str) -> Result<(), Fault> {
    memory::device_range(ptr as u64, data.len(), what)?;
    if !data.is_empty() {
        // SAFETY: as in `read`; `data` is a separate host buffer, so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), ptr as *mut u8, data.len()) };
    }
    Ok(())
}

/// Runs a unit. `Err` is a memory fault (as the simulated device reports faults); checks that
/// fail set the communicator's asynchronous error instead.
pub(crate) fn run(comm: &Comm, ops: &[Op]) -> Result<(), Fault> {
    if comm.broken() {
        return Ok(());
    }
    let (Some(l), Some(t)) = (comm.layout(), comm.transport()) else { return Ok(()) };
    let r = Runner { comm, t, l };
    let (sends, rest): (Vec<&Op>, Vec<&Op>) = ops.iter().partition(|op| op.kind == Kind::Send);
    for op in sends.into_iter().chain(rest) {
        if !r.step(op)? {
            break;
        }
    }
    Ok(())
}

struct Runner<'a> {
    comm: &'a Comm,
    t: Arc<Transport>,
    l: Layout,
}

impl Runner<'_> {
    /// Runs one operation; `Ok(false)` stops the unit (aborted, failed, injected fault).
    fn step(&self, op: &Op) -> Result<bool, Fault> {
        if self.comm.broken() {
            return Ok(false);
        }
        match op.fault {
            Some(Injected::Async) => {
                self.comm.fail(
                    SYSTEM,
                    &format!("injected async error: {} call {} ({})", self.comm.who(), op.call, op.kind.name()),
                );
                return Ok(false);
            }
            Some(Injected::Hang) => {
                eprintln!(
                    "ncclsim: injected hang: {} call {} ({}) blocks until the communicator is aborted",
                    self.comm.who(),
                    op.call,
                    op.kind.name()
                );
                self.t.inbox.wait_aborted();
                return Ok(false);
            }
            None => {}
        }
        let Some((input, output)) = extents(op, self.l) else {
            self.comm.fail(INTERNAL, &format!("internal error: {} call {}: sizes overflow", self.comm.who(), op.call));
            return Ok(false);
        };
        match op.kind {
            Kind::Send => {
                let payload = read(op.send, input, "ncclSend")?;
                Ok(self.sent(op, op.root, self.t.send(op.root, Key::P2p(op.seq), &op.header(), &payload)))
            }
            Kind::Recv => self.recv(op, output),
            _ => self.collective(op, input, output),
        }
    }

    /// Whether a send went out; a failure (the peer is gone) is a remote error.
    fn sent(&self, op: &Op, peer: usize, r: Result<(), String>) -> bool {
        match r {
            Ok(()) => true,
            Err(_) if self.comm.aborted() => false,
            Err(e) => {
                self.comm.fail(
                    REMOTE,
                    &format!(
                        "remote error: {} call {} ({}): rank {peer} is gone: {e}",
                        self.comm.who(),
                        op.call,
                        op.kind.name()
                    ),
                );
                false
            }
        }
    }

    /// Waits for `peer`'s frame `key`; `None` when the wait ended without it (the unit stops).
    fn take(&self, op: &Op, peer: usize, key: Key) -> Option<super::transport::Frame> {
        let waiting = || {
            format!(
                "rank {} has waited 20 s in {} (call {} on comm {:#x}) for rank {peer}",
                self.l.rank,
                op.kind.name(),
                op.call,
                self.comm.handle()
            )
        };
        match self.t.inbox.take(peer, key, &waiting) {
            Ok(f) => Some(f),
            Err(Stop::Aborted) => None,
            Err(Stop::Closed) => {
                if !self.comm.aborted() {
                    self.comm.fail(
                        REMOTE,
                        &format!(
                            "remote error: {} call {} ({}): rank {peer} closed its connection (aborted, destroyed or exited) before sending what this call needs",
                            self.comm.who(),
                            op.call,
                            op.kind.name()
                        ),
                    );
                }
                None
            }
        }
    }

    fn recv(&self, op: &Op, output: usize) -> Result<bool, Fault> {
        let peer = op.root;
        let Some(f) = self.take(op, peer, Key::P2p(op.seq)) else { return Ok(false) };
        let mine = op.header();
        let theirs = f.header;
        if (theirs.count, theirs.dtype, theirs.group) != (mine.count, mine.dtype, mine.group)
            || f.payload.len() != output
        {
            self.comm.fail(
                INVALID_USAGE,
                &format!(
                    "send/recv mismatch: {} call {}: its receive {} from rank {peer} is {}; rank {peer}'s send {} to it is {}",
                    self.comm.who(),
                    op.call,
                    op.seq,
                    describe(&mine),
                    op.seq,
                    describe(&theirs)
                ),
            );
            return Ok(true);
        }
        write(op.recv, &f.payload, "ncclRecv")?;
        Ok(true)
    }

    /// What this rank sends to `peer` of its `input` (`peer` may be itself: its own part).
    fn part<'i>(&self, op: &Op, input: &'i [u8], peer: usize) -> &'i [u8] {
        match op.kind {
            Kind::Reduce if peer != op.root => &[],
            Kind::Broadcast if self.l.rank != op.root => &[],
            Kind::Gather if peer != op.root => &[],
            Kind::Scatter if self.l.rank != op.root => &[],
            Kind::ReduceScatter | Kind::AlltoAll | Kind::Scatter => {
                let each = input.len() / self.l.nranks.max(1);
                input.get(peer * each..(peer + 1) * each).unwrap_or(&[])
            }
            _ => input,
        }
    }

    fn collective(&self, op: &Op, input_len: usize, output_len: usize) -> Result<bool, Fault> {
        let (rank, n) = (self.l.rank, self.l.nranks);
        let name = op.kind.name();
        // All of the input is read before any output is written: in-place calls are safe.
        let input = read(op.send, input_len, name)?;
        let mine = op.header();
        for p in (0..n).filter(|&p| p != rank) {
            if !self.sent(op, p, self.t.send(p, Key::Coll(op.seq), &mine, self.part(op, &input, p))) {
                return Ok(false);
            }
        }
        let mut parts: Vec<Vec<u8>> = Vec::with_capacity(n);
        let mut mismatch = Vec::new();
        for p in 0..n {
            if p == rank {
                parts.push(self.part(op, &input, rank).to_vec());
                continue;
            }
            let Some(f) = self.take(op, p, Key::Coll(op.seq)) else { return Ok(false) };
            if f.header != mine {
                mismatch.push(format!("rank {p} called {}", describe(&f.header)));
            }
            parts.push(f.payload);
        }
        if !mismatch.is_empty() {
            self.comm.fail(
                INVALID_USAGE,
                &format!(
                    "collective mismatch: {} collective {} (call {}): rank {rank} called {}; {}",
                    self.comm.who(),
                    op.seq,
                    op.call,
                    describe(&mine),
                    mismatch.join("; ")
                ),
            );
            return Ok(true);
        }
        let reduce = || {
            let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            reducer(op.dtype, op.redop).and_then(|f| f(&refs))
        };
        let result = match op.kind {
            Kind::AllReduce | Kind::ReduceScatter => reduce(),
            Kind::Reduce if rank == op.root => reduce(),
            Kind::Reduce => Some(Vec::new()),
            Kind::Broadcast | Kind::Scatter => parts.get(op.root).cloned(),
            Kind::AllGather | Kind::AlltoAll => Some(parts.concat()),
            Kind::Gather if rank == op.root => Some(parts.concat()),
            Kind::Gather => Some(Vec::new()),
            Kind::Send | Kind::Recv => None,
        };
        match result {
            Some(out) if out.len() == output_len => {
                write(op.recv, &out, name)?;
                Ok(true)
            }
            _ => {
                self.comm.fail(
                    INTERNAL,
                    &format!(
                        "internal error: {} collective {}: contributions of unequal sizes",
                        self.comm.who(),
                        op.seq
                    ),
                );
                Ok(true)
            }
        }
    }
}
