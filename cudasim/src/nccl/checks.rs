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
    })
}

/// Checks what NCCL returns `ncclInvalidArgument` for, and that the buffers the operation
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
