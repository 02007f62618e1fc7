//! Call-time checks of an operation's arguments, and the descriptions of operations that the
//! run-time checks (matching collectives and sends with receives across ranks) print.

use super::Error;
use super::comm::{Comm, Layout};
use super::group::{Kind, Op};
use super::reduce::{dtype_name, op_name, reducer, size_of};
use super::transport::Header;
use crate::memory;

/// The bytes an operation reads and writes on this rank: `(input, output)`; `None` when they
/// overflow.
pub(crate) fn extents(op: &Op, l: Layout) -> Option<(usize, usize)> {
    let c = op.count.checked_mul(size_of(op.dtype)?)?;
    let root = op.root == l.rank;
    Some(match op.kind {
        Kind::AllReduce => (c, c),
        Kind::Broadcast => (if root { c } else { 0 }, c),
        Kind::Reduce => (c, if root { c } else { 0 }),
        Kind::AllGather => (c, c.checked_mul(l.nranks)?),
        Kind::ReduceScatter => (c.checked_mul(l.nranks)?, c),
        Kind::Send => (c, 0),
        Kind::Recv => (0, c),
        Kind::AlltoAll => (c.checked_mul(l.nranks)?, c.checked_mul(l.nranks)?),
        Kind::Gather => (c, if root { c.checked_mul(l.nranks)? } else { 0 }),
        Kind::Scatter => (if root { c.checked_mul(l.nranks)? } else { 0 }, c),
    })
}

/// Checks what NCCL returns `ncclInvalidArgument` for (and what it does not check but needs:
/// send and receive ranges overlapping only as in place), and that the buffers the operation
/// reads and writes lie in live allocations (device or pinned memory).
pub(crate) fn arguments(comm: &Comm, l: Layout, op: &Op) -> Result<(), Error> {
    let at = || format!("{} call {}: {}", comm.who(), op.call, op.kind.name());
    if size_of(op.dtype).is_none() {
        return Err(Error::argument(format!("invalid argument: {}: unknown data type {}", at(), op.dtype)));
    }
    if op.kind.reduces() && reducer(op.dtype, op.redop).is_none() {
        return Err(Error::argument(format!("invalid argument: {}: unknown reduction operator {}", at(), op.redop)));
    }
    if isize::try_from(op.count).is_err() {
        return Err(Error::argument(format!(
            "invalid argument: {}: negative count -{}",
            at(),
            op.count.wrapping_neg()
        )));
    }
    let (input, output) = extents(op, l)
        .ok_or_else(|| Error::argument(format!("invalid argument: {}: count {} overflows", at(), op.count)))?;
    check_overlap(op, l, (input, output))
        .map_err(|why| Error::argument(format!("invalid argument: {}: {why}", at())))?;
    for (which, ptr, len) in [("send", op.send, input), ("receive", op.recv, output)] {
        memory::device_range(ptr as u64, len, op.kind.name()).map_err(|f| {
            Error::argument(format!(
                "buffer not in a live allocation: {}: the {which} buffer ({} bytes at {ptr:#x}): {}",
                at(),
                len,
                f.message
            ))
        })?;
    }
    Ok(())
}

/// Where NCCL's in-place form of the operation puts the send buffer, as `send - recv` in
/// bytes (wrapping): the same address for most; this rank's block for allgather and the root's
/// for gather (send inside receive); this rank's block for reduce-scatter and the root's for
/// scatter (receive inside send). `None`: all-to-all runs out of place only.
fn in_place_offset(op: &Op, l: Layout, block: usize) -> Option<usize> {
    match op.kind {
        Kind::AlltoAll => None,
        Kind::AllGather => Some(l.rank * block),
        Kind::Gather => Some(op.root * block),
        Kind::ReduceScatter => Some((l.rank * block).wrapping_neg()),
        Kind::Scatter => Some((op.root * block).wrapping_neg()),
        _ => Some(0),
    }
}

/// Send and receive ranges may overlap only as NCCL's in-place form of the operation (other
/// overlaps a real NCCL computes garbage for, without a word).
fn check_overlap(op: &Op, l: Layout, (input, output): (usize, usize)) -> Result<(), String> {
    let (s, r) = (op.send, op.recv);
    if input == 0 || output == 0 || s >= r.saturating_add(output) || r >= s.saturating_add(input) {
        return Ok(());
    }
    let ranges = format!("{input} bytes at {s:#x}, {output} at {r:#x}");
    match in_place_offset(op, l, input.min(output)) {
        Some(at) if s.wrapping_sub(r) == at => Ok(()),
        Some(_) => Err(format!("the send and receive buffers overlap ({ranges}) other than as its in-place form")),
        None => Err(format!("the send and receive buffers overlap ({ranges}): it runs out of place only")),
    }
}

/// "ncclAllReduce of 7 × ncclInt32, ncclSum" and the like, for a header from any rank.
pub(crate) fn describe(h: &Header) -> String {
    let kind = Kind::from_code(h.kind);
    let mut s = format!("{} of {} × {}", kind.map_or("an unknown operation", Kind::name), h.count, dtype_name(h.dtype));
    if kind.is_some_and(Kind::reduces) {
        s += &format!(", {}", op_name(h.op));
    }
    if kind.is_some_and(Kind::rooted) {
        s += &format!(", root {}", h.root);
    }
    if kind.is_some_and(Kind::p2p) {
        s += &format!(", in its group {} with this peer", h.group);
    }
    s
}
