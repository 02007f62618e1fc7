//! The HostTransfer operations: each validates its arguments on the calling thread, describes
//! its data as rows for the staging engine, and names the Mpi backend plan that runs one chunk.

use std::sync::Arc;

use duralumin_kernels::{Element, ReduceOp};

use super::Communicator;
use super::request::DeviceRequest;
use super::staging::{ChunkBufs, Into, Plan, Region, Rows, carries, cut};
use crate::backends::mpi::{AllreduceAlgorithm, BcastAlgorithm, Mode, exchange};
use crate::buffer::RawBuf;
use crate::check;
use crate::device::{Device, DevicePtr, DeviceSlice, DeviceSliceMut, KeepAlive, ReduceFns};
use crate::error::{Error, Result};
use crate::reliability::crosscheck::Pairs;
use crate::reliability::recorder::{OpKind, Signature};
use crate::transport::MpiTransport;

/// `parts` rows of `pitch` elements of `buf` from element `offset`, back to back.
fn rows<D: Device, B: DeviceSlice<D>>(buf: &B, offset: usize, parts: usize, pitch: usize) -> Region {
    Region::Rows(Rows {
        ptr: buf.device_ptr().offset(offset * size_of::<B::Elem>()),
        parts,
        len: pitch,
        pitch,
        keep: buf.keep_alive(),
    })
}

/// The blocks `[displs[i], displs[i] + counts[i])` of `buf` as pieces, in rank order.
fn blocks<D: Device, B: DeviceSlice<D>>(buf: &B, counts: &[usize], displs: &[usize]) -> Region {
    let (sz, base) = (size_of::<B::Elem>(), buf.device_ptr());
    let pieces = counts.iter().zip(displs).map(|(&c, &d)| (base.offset(d * sz), c)).collect();
    Region::Pieces { pieces, keep: buf.keep_alive().into_iter().collect() }
}

impl<T> ChunkBufs<T> {
    /// The chunk's send and receive staging as slices.
    ///
    /// # Safety
    /// Only the chunk's MPI part may use the staging slot until it completes (the staging
    /// engine guarantees this: the stream touches the slot only before the input flag and after
    /// the output flag).
    unsafe fn slices<'a>(&self) -> (Option<&'a [T]>, &'a mut [T]) {
        // SAFETY: guaranteed by the caller; the send and receive areas are disjoint.
        unsafe { (self.send.map(|s| s.as_slice()), self.recv.as_mut_slice()) }
    }

    /// The first `send` and `recv` elements of the areas (chunks of blocks of different
    /// lengths, packed from the start of each area).
    ///
    /// # Safety
    /// As [`ChunkBufs::slices`].
    unsafe fn prefixes<'a>(&self, send: usize, recv: usize) -> (Option<&'a [T]>, &'a mut [T]) {
        // SAFETY: as in `slices`.
        unsafe { (self.send.map(|s| s.block(0, send).as_slice()), self.recv.block(0, recv).as_mut_slice()) }
    }
}

/// Emits the stream-ordered and the non-blocking method of an operation from its plan.
/// `sig(|c| ..)` is its [`Signature`] and `pairs(|c| ..)` its per-pair counts, as on the Mpi
/// backend; `uses(...)` names the buffers the operation reads (`read`, `reads` for a list) and
/// writes (`write`, `writes`), for the buffers' own dependency tracking (see [`uses`]).
macro_rules! stream_ordered_and_nonblocking {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $iname:ident <$($g:ident : $bound:path),*> ($($arg:ident : $ty:ty),* $(,)?)
            sig($sig:expr) $(pairs($pairs:expr))? uses($($kind:ident $buf:ident),*) => $plan:ident ($($pa:expr),* $(,)?);
    )*) => {$(
        $(#[$doc])*
        ///
        /// Stream-ordered: queued on the communicator's stream after the work already there;
        /// returns at once. Argument errors are returned before anything is queued; errors of
        /// the MPI part are returned by the communicator's next call or [`Communicator::synchronize`].
        #[allow(clippy::too_many_arguments)]
        pub fn $name<'a, $($g: $bound),*>(&self, $($arg: $ty),*) -> Result<()> {
            let sig: Signature = ($sig)(self);
            let pairs: Option<Pairs> = if self.checks(&sig) { None $(.or_else(|| Some(($pairs)(self))))? } else { None };
            let (id, plan) = self.prepare(sig, pairs, || self.$plan($($pa),*))?;
            $(uses::$kind::<D, _>($buf, uses::Stage::Before);)*
            self.enqueue(&self.stream, plan, id)?;
            $(uses::$kind::<D, _>($buf, uses::Stage::After);)*
            Ok(())
        }

        #[doc = concat!("Non-blocking [`", stringify!($name), "`](Self::", stringify!($name), "): runs on the \
            communicator's internal stream after the work queued on its stream so far, and \
            returns a [`DeviceRequest`] that borrows the buffers until the operation completes.")]
        #[allow(clippy::too_many_arguments)]
        pub fn $iname<'a, $($g: $bound),*>(&'a self, $($arg: $ty),*) -> Result<DeviceRequest<'a, D>> {
            let sig: Signature = ($sig)(self);
            let pairs: Option<Pairs> = if self.checks(&sig) { None $(.or_else(|| Some(($pairs)(self))))? } else { None };
            let side = self.side_stream()?;
            let (id, plan) = self.prepare(sig, pairs, || self.$plan($($pa),*))?;
            $(uses::$kind::<D, _>($buf, uses::Stage::Before);)*
            let queued = self.enqueue(side, plan, id)?;
            $(uses::$kind::<D, _>($buf, uses::Stage::After);)*
            Ok(DeviceRequest::new(queued, side.clone(), Arc::clone(&self.shared)))
        }
    )*};
}

/// Tells the buffers' own dependency tracking (cudarc's read and write events) about an
/// operation: before it is queued, written buffers make their home stream wait for tracked
/// reads and writes elsewhere (reads already waited for tracked writes when the plan took their
/// addresses); after it is queued (and the home streams were ordered after it), every buffer
/// records its read or write on its home stream.
mod uses {
    use crate::device::{Device, DeviceSlice, DeviceSliceMut};

    /// Before or after the operation is queued.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(super) enum Stage {
        Before,
        After,
    }

    pub(super) fn read<D: Device, S: DeviceSlice<D>>(buf: &S, at: Stage) {
        if at == Stage::After {
            buf.track_read();
        }
    }

    pub(super) fn write<D: Device, R: DeviceSliceMut<D>>(buf: &mut R, _: Stage) {
        buf.track_write();
    }

    pub(super) fn reads<D: Device, S: DeviceSlice<D>>(bufs: &[(&S, usize)], at: Stage) {
        for (buf, _) in bufs {
            read::<D, S>(*buf, at);
        }
    }

    pub(super) fn writes<D: Device, R: DeviceSliceMut<D>>(bufs: &mut [(&mut R, usize)], at: Stage) {
        for (buf, _) in bufs {
            write::<D, R>(*buf, at);
        }
    }
}

impl<D: Device> Communicator<D> {
    stream_ordered_and_nonblocking! {
        /// Allreduce: `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank (equal
        /// lengths everywhere).
        fn allreduce / iallreduce <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(send.len()))
            uses(read send, write recv) => plan_allreduce(Some(send), recv, op);
        /// In-place allreduce: `buf` is the input and receives the result.
        fn allreduce_in_place / iallreduce_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(buf.len()).in_place())
            uses(write buf) => plan_allreduce(None::<&B>, buf, op);

        /// Reduce to `root`: at the root `recv` (the length of `send`) receives the reduction;
        /// elsewhere `recv` is not used.
        fn reduce / ireduce <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize, op: O)
            sig(|_| Signature::new(OpKind::Reduce).reduce::<T, O>().count(send.len()).root(root))
            uses(read send, write recv) => plan_reduce(Some(send), recv, root, op);
        /// In-place reduce: `buf` is every rank's input; the root's receives the result.
        fn reduce_in_place / ireduce_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, root: usize, op: O)
            sig(|_| Signature::new(OpKind::Reduce).reduce::<T, O>().count(buf.len()).root(root).in_place())
            uses(write buf) => plan_reduce(None::<&B>, buf, root, op);

        /// Broadcast of the root's `buf` into every rank's `buf` (equal lengths). The root's
        /// stream does not wait for the other ranks' copies back.
        fn bcast / ibcast <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize)
            sig(|_| Signature::new(OpKind::Bcast).elem::<T>().count(buf.len()).root(root)) uses(write buf)
            => plan_bcast(buf, root);

        /// Allgather: rank `i`'s `send` (`c` elements) lands at `recv[i*c..]` on every rank.
        fn allgather / iallgather <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R)
            sig(|_| Signature::new(OpKind::Allgather).elem::<T>().count(send.len()))
            uses(read send, write recv) => plan_allgather(Some(send), recv);
        /// In-place allgather: this rank's block is already at `buf[rank*c..]`.
        fn allgather_in_place / iallgather_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B)
            sig(|c: &Self| Signature::new(OpKind::Allgather).elem::<T>().count(buf.len() / c.size()).in_place())
            uses(write buf) => plan_allgather(None::<&B>, buf);

        /// All-to-all: block `j` of `send` goes to rank `j`, block `i` of `recv` comes from
        /// rank `i` (`size * c` elements each).
        fn alltoall / ialltoall <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R)
            sig(|_| Signature::new(OpKind::Alltoall).elem::<T>().count(send.len()))
            uses(read send, write recv) => plan_alltoall(Some(send), recv);
        /// In-place all-to-all on `buf`.
        fn alltoall_in_place / ialltoall_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B)
            sig(|_| Signature::new(OpKind::Alltoall).elem::<T>().count(buf.len()).in_place())
            uses(write buf) => plan_alltoall(None::<&B>, buf);

        /// Gather to `root`: rank `i`'s `send` lands at `recv[i*c..]` on the root; `recv` is
        /// not used elsewhere.
        fn gather / igather <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize)
            sig(|_| Signature::new(OpKind::Gather).elem::<T>().count(send.len()).root(root))
            uses(read send, write recv) => plan_gather(Some(send), recv, root);
        /// In-place gather: at the root `buf` has `size * c` elements with its own block in
        /// place; elsewhere `buf` is the `c`-element contribution.
        fn gather_in_place / igather_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize)
            sig(|c: &Self| Signature::new(OpKind::Gather).elem::<T>().block_count(buf.len(), c.rank(), root, c.size()).root(root).in_place())
            uses(write buf) => plan_gather(None::<&B>, buf, root);

        /// Scatter from `root`: block `i` of the root's `send` lands in rank `i`'s `recv`;
        /// `send` is not used elsewhere.
        fn scatter / iscatter <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize)
            sig(|_| Signature::new(OpKind::Scatter).elem::<T>().count(recv.len()).root(root))
            uses(read send, write recv) => plan_scatter(Some(send), recv, root);
        /// In-place scatter: at the root `buf` holds all blocks and keeps its own; elsewhere
        /// `buf` receives the block.
        fn scatter_in_place / iscatter_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize)
            sig(|c: &Self| Signature::new(OpKind::Scatter).elem::<T>().block_count(buf.len(), c.rank(), root, c.size()).root(root).in_place())
            uses(write buf) => plan_scatter(None::<&B>, buf, root);

        /// Reduce-scatter with equal blocks: `send` has `size * c` elements, rank `i` receives
        /// the reduction of block `i` in `recv` (`c` elements).
        fn reduce_scatter / ireduce_scatter <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O)
            sig(|_| Signature::new(OpKind::ReduceScatter).reduce::<T, O>().count(recv.len()))
            uses(read send, write recv) => plan_reduce_scatter(Some(send), recv, op);
        /// In-place reduce-scatter: `buf` (`size * c`) is the input; the result goes to
        /// `buf[..c]`.
        fn reduce_scatter_in_place / ireduce_scatter_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O)
            sig(|c: &Self| Signature::new(OpKind::ReduceScatter).reduce::<T, O>().count(buf.len() / c.size()).in_place())
            uses(write buf) => plan_reduce_scatter(None::<&B>, buf, op);

        /// Allgatherv: rank `i`'s `send` (`counts[i]` elements) lands at
        /// `recv[displs[i]..]` on every rank.
        fn allgatherv / iallgatherv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], displs: &[usize])
            sig(|_| Signature::new(OpKind::Allgatherv).elem::<T>().counts(counts)) uses(read send, write recv)
            => plan_allgatherv(Some(send), recv, counts, displs);
        /// In-place allgatherv: this rank's block is already at `buf[displs[rank]..]`.
        fn allgatherv_in_place / iallgatherv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize])
            sig(|_| Signature::new(OpKind::Allgatherv).elem::<T>().counts(counts).in_place())
            uses(write buf) => plan_allgatherv(None::<&B>, buf, counts, displs);

        /// Alltoallv: `send[send_displs[j]..][..send_counts[j]]` goes to rank `j`, and what
        /// rank `i` sends lands at `recv[recv_displs[i]..][..recv_counts[i]]`.
        fn alltoallv / ialltoallv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, send_counts: &[usize], send_displs: &[usize], recv: &'a mut R, recv_counts: &[usize], recv_displs: &[usize])
            sig(|_| Signature::new(OpKind::Alltoallv).elem::<T>().count(send.len()))
            pairs(|c: &Self| Pairs::alltoallv(c.size(), send_counts, recv_counts)) uses(read send, write recv)
            => plan_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);

        /// Gatherv to `root`: rank `i`'s `send` lands at `recv[displs[i]..][..counts[i]]` on
        /// the root; `counts`, `displs` and `recv` are used at the root only.
        fn gatherv / igatherv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Gatherv).elem::<T>().count(send.len()).root(root))
            pairs(|c: &Self| Pairs::gatherv(c.size(), c.rank(), root, send.len(), counts)) uses(read send, write recv)
            => plan_gatherv(Some(send), recv, counts, displs, root);
        /// In-place gatherv: the root's own block is already in place; elsewhere `buf` is the
        /// contribution.
        fn gatherv_in_place / igatherv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Gatherv).elem::<T>().count(buf.len()).root(root).in_place())
            pairs(|c: &Self| Pairs::gatherv(c.size(), c.rank(), root, buf.len(), counts)) uses(write buf)
            => plan_gatherv(None::<&B>, buf, counts, displs, root);

        /// Scatterv from `root`: `send[displs[i]..][..counts[i]]` lands in rank `i`'s `recv`;
        /// `send`, `counts` and `displs` are used at the root only.
        fn scatterv / iscatterv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, counts: &[usize], displs: &[usize], recv: &'a mut R, root: usize)
            sig(|_| Signature::new(OpKind::Scatterv).elem::<T>().count(recv.len()).root(root))
            pairs(|c: &Self| Pairs::scatterv(c.size(), c.rank(), root, recv.len(), counts)) uses(read send, write recv)
            => plan_scatterv(Some(send), counts, displs, recv, root);
        /// In-place scatterv: at the root `buf` is the send buffer and keeps its own block;
        /// elsewhere `buf` receives the block.
        fn scatterv_in_place / iscatterv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Scatterv).elem::<T>().count(buf.len()).root(root).in_place())
            pairs(|c: &Self| Pairs::scatterv(c.size(), c.rank(), root, buf.len(), counts)) uses(write buf)
            => plan_scatterv(None::<&B>, counts, displs, buf, root);

        /// Reduce-scatter with per-rank counts: `send` holds the blocks back to back, rank `i`
        /// receives the reduction of block `i` (`counts[i]` elements).
        fn reduce_scatterv / ireduce_scatterv <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], op: O)
            sig(|_| Signature::new(OpKind::ReduceScatterv).reduce::<T, O>().counts(counts))
            uses(read send, write recv) => plan_reduce_scatterv(Some(send), recv, counts, op);
        /// In-place reduce-scatterv: the result goes to `buf[..counts[rank]]`.
        fn reduce_scatterv_in_place / ireduce_scatterv_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], op: O)
            sig(|_| Signature::new(OpKind::ReduceScatterv).reduce::<T, O>().counts(counts).in_place())
            uses(write buf) => plan_reduce_scatterv(None::<&B>, buf, counts, op);

        /// Sends `buf` to `dest` with `tag`. Sending to this rank itself is refused
        /// ([`Error::SelfMessage`]): the stream would wait forever.
        fn send / isend <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a B, dest: usize, tag: i32)
            sig(|_| Signature::new(OpKind::Send).elem::<T>().count(buf.len()).root(dest).tag(tag)) uses(read buf)
            => plan_p2p(Some((buf, dest)), None::<(&mut B, usize)>, tag, "send");
        /// Receives exactly `buf.len()` elements from `source` with `tag`.
        ///
        /// A message longer than one chunk travels as one MPI message per chunk, cut the same
        /// way by every point-to-point call (so a `multi_sendrecv` message meets a `recv`). The
        /// lengths must match, as MPI requires: a shorter message is reported here
        /// ([`Error::CountMismatch`]) and a longer one as MPI's truncation error, but the
        /// sender of a message longer than the receive by a whole chunk or more is left
        /// waiting for a receiver of its last chunks.
        fn recv / irecv <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, source: usize, tag: i32)
            sig(|_| Signature::new(OpKind::Recv).elem::<T>().count(buf.len()).root(source).tag(tag)) uses(write buf)
            => plan_p2p(None::<(&B, usize)>, Some((buf, source)), tag, "recv");
        /// Sends `send` to `dest` and receives `recv` from `source` at once; either peer may be
        /// this rank.
        fn sendrecv / isendrecv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, dest: usize, recv: &'a mut R, source: usize, tag: i32)
            sig(|_| Signature::new(OpKind::SendRecv).elem::<T>().count(send.len()).root(dest).tag(tag))
            uses(read send, write recv) => plan_p2p(Some((send, dest)), Some((recv, source)), tag, "sendrecv");
        /// Sends `buf` to `dest` and replaces it with the same number of elements from
        /// `source`.
        fn sendrecv_in_place / isendrecv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, dest: usize, source: usize, tag: i32)
            sig(|_| Signature::new(OpKind::SendRecv).elem::<T>().count(buf.len()).root(dest).tag(tag).in_place())
            uses(write buf) => plan_sendrecv_in_place(buf, dest, source, tag);
        /// Sends each `(buffer, dest)` of `sends` and receives each `(buffer, source)` of
        /// `recvs`, all at once (Aluminum's MultiSendRecv), each message cut into chunks as by
        /// [`recv`](Self::recv), one pack launch per chunk and direction.
        fn multi_sendrecv / imulti_sendrecv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (sends: &[(&'a S, usize)], recvs: &mut [(&'a mut R, usize)], tag: i32)
            sig(|_| Signature::new(OpKind::MultiSendRecv).elem::<T>().count(sends.iter().map(|s| s.0.len()).sum()).tag(tag))
            uses(reads sends, writes recvs) => plan_multi(sends, recvs, tag);
    }

    /// Barrier, ordered on the stream: work queued after it starts once every rank's stream
    /// has reached the barrier. Returns at once.
    pub fn barrier(&self) -> Result<()> {
        let (id, plan) = self.prepare(Signature::new(OpKind::Barrier), None, || Ok(self.plan_barrier()))?;
        self.enqueue::<u8>(&self.stream, plan, id).map(drop)
    }

    /// Non-blocking [`barrier`](Self::barrier) on the internal stream.
    pub fn ibarrier(&self) -> Result<DeviceRequest<'_, D>> {
        let side = self.side_stream()?;
        let (id, plan) = self.prepare(Signature::new(OpKind::Barrier), None, || Ok(self.plan_barrier()))?;
        let queued = self.enqueue::<u8>(side, plan, id)?;
        Ok(DeviceRequest::new(queued, side.clone(), Arc::clone(&self.shared)))
    }

    fn plan_barrier(&self) -> Plan<u8> {
        Plan {
            count: 0,
            width: 1,
            send_parts: 0,
            recv_parts: 0,
            input: None,
            output: None,
            device_reduce: None,
            exchange: false,
            chunk: Box::new(|c, _| c.plan_barrier()),
        }
    }

    fn check_root(&self, what: &'static str, root: usize) -> Result<()> {
        check::rank(what, root, self.size())
    }

    fn plan_allreduce<T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        op: O,
    ) -> Result<Plan<T>> {
        self.check_buffer("allreduce receive buffer", recv)?;
        let n = recv.len();
        let input = match send {
            Some(s) => {
                self.check_buffer("allreduce send buffer", s)?;
                check::len("allreduce receive buffer", n, s.len())?;
                (rows(s, 0, 1, n), Into::Send)
            }
            None => (rows(recv, 0, 1, n), Into::Recv { part: 0 }),
        };
        let size = self.size();
        let fns = ReduceFns::of::<T, O>(size as u32);
        // Pairs without device kernels (a user's pair whose kernels were not registered)
        // reduce in MPI whatever their size.
        if size > 1 && n * size_of::<T>() <= self.config.device_reduce_max_bytes && self.shared.device.can_reduce(&fns)
        {
            // Allgather the contributions into staging, reduce them on the device in rank order.
            return Ok(Plan {
                count: n,
                width: size,
                send_parts: 1,
                recv_parts: size,
                input: Some((input.0, Into::Send)),
                output: Some(rows(recv, 0, 1, n)),
                device_reduce: Some(fns),
                exchange: false,
                chunk: Box::new(move |c, b| {
                    // SAFETY: as below.
                    let (s, r) = unsafe { b.slices() };
                    c.plan_allgather(s, r, Mode::NonBlocking)
                }),
            });
        }
        Ok(Plan {
            count: n,
            width: 1,
            send_parts: usize::from(send.is_some()),
            recv_parts: 1,
            input: Some(input),
            output: Some(rows(recv, 0, 1, n)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: the staging engine hands each chunk's slot to its MPI part alone.
                let (s, r) = unsafe { b.slices() };
                c.plan_allreduce(s, r, op, AllreduceAlgorithm::Auto, Mode::NonBlocking)
            }),
        })
    }

    fn plan_reduce<T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        root: usize,
        op: O,
    ) -> Result<Plan<T>> {
        self.check_root("reduce root", root)?;
        let is_root = self.rank() == root;
        let n = match send {
            Some(s) => {
                self.check_buffer("reduce send buffer", s)?;
                if is_root {
                    self.check_buffer("reduce receive buffer", recv)?;
                    check::len("reduce receive buffer", recv.len(), s.len())?;
                }
                s.len()
            }
            None => {
                self.check_buffer("reduce buffer", recv)?;
                recv.len()
            }
        };
        let input = match send {
            Some(s) => (rows(s, 0, 1, n), Into::Send),
            None => (rows(recv, 0, 1, n), Into::Recv { part: 0 }),
        };
        let staged_recv = is_root || send.is_none();
        Ok(Plan {
            count: n,
            width: 1,
            send_parts: usize::from(send.is_some()),
            recv_parts: usize::from(staged_recv),
            input: Some(input),
            output: is_root.then(|| rows(recv, 0, 1, n)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.slices() };
                c.plan_reduce(s, r, root, op, Mode::NonBlocking)
            }),
        })
    }

    fn plan_bcast<T: Element, B: DeviceSlice<D, Elem = T>>(&self, buf: &mut B, root: usize) -> Result<Plan<T>> {
        self.check_root("bcast root", root)?;
        self.check_buffer("bcast buffer", buf)?;
        let n = buf.len();
        let is_root = self.rank() == root;
        Ok(Plan {
            count: n,
            width: 1,
            send_parts: 0,
            recv_parts: 1,
            input: is_root.then(|| (rows(buf, 0, 1, n), Into::Recv { part: 0 })),
            // The root's buffer does not change: nothing to copy back.
            output: (!is_root).then(|| rows(buf, 0, 1, n)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (_, r) = unsafe { b.slices() };
                c.plan_bcast(r, root, BcastAlgorithm::Auto, Mode::NonBlocking)
            }),
        })
    }

    fn plan_allgather<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_buffer("allgather receive buffer", recv)?;
        let (count, input) = match send {
            Some(s) => {
                self.check_buffer("allgather send buffer", s)?;
                check::len("allgather receive buffer", recv.len(), check::product("allgather", s.len(), n)?)?;
                (s.len(), (rows(s, 0, 1, s.len()), Into::Send))
            }
            None => {
                let c = check::divisible("allgather buffer (size * count)", recv.len(), n)?;
                (c, (rows(recv, me * c, 1, c), Into::Recv { part: me }))
            }
        };
        Ok(Plan {
            count,
            width: n,
            send_parts: usize::from(send.is_some()),
            recv_parts: n,
            input: Some(input),
            output: Some(rows(recv, 0, n, count)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.slices() };
                c.plan_allgather(s, r, Mode::NonBlocking)
            }),
        })
    }

    fn plan_alltoall<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
    ) -> Result<Plan<T>> {
        let n = self.size();
        self.check_buffer("alltoall receive buffer", recv)?;
        let count = check::divisible("alltoall receive buffer (size * count)", recv.len(), n)?;
        let input = match send {
            Some(s) => {
                self.check_buffer("alltoall send buffer", s)?;
                check::len("alltoall receive buffer", recv.len(), s.len())?;
                (rows(s, 0, n, count), Into::Send)
            }
            None => (rows(recv, 0, n, count), Into::Recv { part: 0 }),
        };
        Ok(Plan {
            count,
            width: n,
            send_parts: if send.is_some() { n } else { 0 },
            recv_parts: n,
            input: Some(input),
            output: Some(rows(recv, 0, n, count)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.slices() };
                c.plan_alltoall(s, r, Mode::NonBlocking)
            }),
        })
    }

    fn plan_gather<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        root: usize,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_root("gather root", root)?;
        let is_root = me == root;
        let (count, input) = match (send, is_root) {
            (Some(s), _) => {
                self.check_buffer("gather send buffer", s)?;
                if is_root {
                    self.check_buffer("gather receive buffer", recv)?;
                    check::len("gather receive buffer", recv.len(), check::product("gather", s.len(), n)?)?;
                }
                (s.len(), (rows(s, 0, 1, s.len()), Into::Send))
            }
            (None, true) => {
                self.check_buffer("gather buffer", recv)?;
                let c = check::divisible("gather buffer (size * count)", recv.len(), n)?;
                (c, (rows(recv, me * c, 1, c), Into::Recv { part: me }))
            }
            (None, false) => {
                self.check_buffer("gather buffer", recv)?;
                (recv.len(), (rows(recv, 0, 1, recv.len()), Into::Recv { part: 0 }))
            }
        };
        let recv_parts = match (is_root, send.is_some()) {
            (true, _) => n,
            (false, true) => 0,
            (false, false) => 1,
        };
        Ok(Plan {
            count,
            width: n,
            send_parts: usize::from(send.is_some()),
            recv_parts,
            input: Some(input),
            output: is_root.then(|| rows(recv, 0, n, count)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.slices() };
                c.plan_gather(s, r, root, Mode::NonBlocking)
            }),
        })
    }

    fn plan_scatter<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        root: usize,
    ) -> Result<Plan<T>> {
        let n = self.size();
        self.check_root("scatter root", root)?;
        let is_root = self.rank() == root;
        self.check_buffer("scatter receive buffer", recv)?;
        let count = match (send, is_root) {
            (Some(s), true) => {
                self.check_buffer("scatter send buffer", s)?;
                check::len("scatter send buffer", s.len(), check::product("scatter", recv.len(), n)?)?;
                recv.len()
            }
            (None, true) => check::divisible("scatter buffer (size * count)", recv.len(), n)?,
            (_, false) => recv.len(),
        };
        let (input, send_parts, recv_parts) = match (send, is_root) {
            (Some(s), true) => (Some((rows(s, 0, n, count), Into::Send)), n, 1),
            (None, true) => (Some((rows(recv, 0, n, count), Into::Recv { part: 0 })), 0, n),
            (_, false) => (None, 0, 1),
        };
        // In place, the root's own block stays where it is.
        let output = if is_root && send.is_none() { None } else { Some(rows(recv, 0, 1, count)) };
        Ok(Plan {
            count,
            width: n,
            send_parts,
            recv_parts,
            input,
            output,
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.slices() };
                c.plan_scatter(s, r, root, Mode::NonBlocking)
            }),
        })
    }

    fn plan_reduce_scatter<T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        op: O,
    ) -> Result<Plan<T>> {
        let n = self.size();
        self.check_buffer("reduce_scatter receive buffer", recv)?;
        let (count, input) = match send {
            Some(s) => {
                self.check_buffer("reduce_scatter send buffer", s)?;
                check::len("reduce_scatter send buffer", s.len(), check::product("reduce_scatter", recv.len(), n)?)?;
                (recv.len(), (rows(s, 0, n, recv.len()), Into::Send))
            }
            None => {
                let c = check::divisible("reduce_scatter buffer (size * count)", recv.len(), n)?;
                (c, (rows(recv, 0, n, c), Into::Recv { part: 0 }))
            }
        };
        Ok(Plan {
            count,
            width: n,
            send_parts: if send.is_some() { n } else { 0 },
            recv_parts: if send.is_some() { 1 } else { n },
            input: Some(input),
            output: Some(rows(recv, 0, 1, count)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.slices() };
                c.plan_reduce_scatter(s, r, op, Mode::NonBlocking)
            }),
        })
    }

    /// Point-to-point: one message each way at most. A message longer than a chunk goes as
    /// one message per chunk (at the chunk size of one row, on both sides of every pair), so
    /// sender and receiver, who know the same length, cut it the same way.
    fn plan_p2p<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<(&S, usize)>,
        recv: Option<(&mut R, usize)>,
        tag: i32,
        name: &'static str,
    ) -> Result<Plan<T>> {
        let me = self.rank();
        check::tag(tag, self.shared.max_tag)?;
        if let Some((s, dest)) = &send {
            check::rank("destination rank", *dest, self.size())?;
            self.check_buffer("send buffer", *s)?;
        }
        if let Some((r, source)) = &recv {
            check::rank("source rank", *source, self.size())?;
            self.check_buffer("receive buffer", *r)?;
        }
        let to_self = send.as_ref().is_some_and(|s| s.1 == me) || recv.as_ref().is_some_and(|r| r.1 == me);
        if to_self && (send.is_none() || recv.is_none()) {
            return Err(Error::SelfMessage { op: name });
        }
        let send_len = send.as_ref().map_or(0, |s| s.0.len());
        let recv_len = recv.as_ref().map_or(0, |r| r.0.len());
        let dest = send.as_ref().map(|s| s.1);
        let source = recv.as_ref().map(|r| r.1);
        Ok(Plan {
            count: send_len.max(recv_len),
            width: 1,
            send_parts: usize::from(send.is_some()),
            recv_parts: usize::from(recv.is_some()),
            input: send.map(|(s, _)| (rows(s, 0, 1, send_len), Into::Send)),
            output: recv.map(|(r, _)| rows(r, 0, 1, recv_len)),
            device_reduce: None,
            exchange: true,
            chunk: Box::new(move |c, b| {
                let x = c.p2p_transport::<T>(tag, Mode::NonBlocking)?;
                let sends = match (dest, b.send) {
                    (Some(d), Some(s)) if carries(send_len, b.k, b.c) => vec![(s.block(0, cut(send_len, b.k, b.c)), d)],
                    _ => Vec::new(),
                };
                let recvs = match source {
                    Some(src) if carries(recv_len, b.k, b.c) => vec![(b.recv.block(0, cut(recv_len, b.k, b.c)), src)],
                    _ => Vec::new(),
                };
                // SAFETY: the blocks lie in this chunk's staging slot (or the device buffers,
                // held by the operation), which only this chunk's MPI part uses until it
                // completes; the send and receive areas are disjoint.
                Ok(unsafe { exchange(x, sends, recvs) })
            }),
        })
    }

    fn check_blocks<B: DeviceSlice<D>>(
        &self,
        what: &'static str,
        buf: &B,
        counts: &[usize],
        displs: &[usize],
        disjoint: bool,
    ) -> Result<usize> {
        self.check_buffer(what, buf)?;
        check::per_rank(what, counts, self.size())?;
        check::blocks(what, counts, displs, buf.len(), disjoint)?;
        check::total(what, counts)
    }

    fn plan_allgatherv<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_blocks("allgatherv receive blocks", recv, counts, displs, true)?;
        let input = match send {
            Some(s) => {
                self.check_buffer("allgatherv send buffer", s)?;
                check::len("allgatherv send buffer", s.len(), counts[me])?;
                (rows(s, 0, 1, s.len()), Into::Send)
            }
            None => (rows(recv, displs[me], 1, counts[me]), Into::Recv { part: me }),
        };
        let counts = counts.to_vec();
        Ok(Plan {
            count: longest(&counts),
            width: n,
            send_parts: usize::from(send.is_some()),
            recv_parts: n,
            input: Some(input),
            output: Some(blocks(recv, &counts, displs)),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // Every rank knows every count, so every rank runs the same chunks.
                let lens = cuts(&b, &counts);
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.prefixes(lens[me], lens.iter().sum()) };
                c.plan_allgatherv(s, r, &lens, &check::packed_displs(&lens), Mode::NonBlocking)
            }),
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_alltoallv<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: &S,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut R,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_blocks("alltoallv send blocks", send, send_counts, send_displs, false)?;
        self.check_blocks("alltoallv receive blocks", recv, recv_counts, recv_displs, true)?;
        check::len("alltoallv receive count from this rank itself", recv_counts[me], send_counts[me])?;
        let (sc, rc) = (send_counts.to_vec(), recv_counts.to_vec());
        let mut tag = OpTag::default();
        Ok(Plan {
            count: longest(&sc).max(longest(&rc)),
            width: n,
            send_parts: n,
            recv_parts: n,
            input: Some((blocks(send, &sc, send_displs), Into::Send)),
            output: Some(blocks(recv, &rc, recv_displs)),
            device_reduce: None,
            exchange: true,
            chunk: Box::new(move |c, b| {
                let x = tag.transport::<T>(c)?;
                let source = b.send.ok_or(Error::Progress("alltoallv chunk without a send area"))?;
                let (sb, rb) = (packed(source, &cuts(&b, &sc)), packed(b.recv, &cuts(&b, &rc)));
                // SAFETY: the send and receive areas of the slot are disjoint and belong to
                // this chunk's MPI part.
                unsafe { rb[me].copy_from(sb[me]) };
                let sends = peers(n, me, |j| carries(sc[j], b.k, b.c).then(|| sb[j]));
                let recvs = peers(n, me, |i| carries(rc[i], b.k, b.c).then(|| rb[i]));
                // SAFETY: as in `plan_p2p`.
                Ok(unsafe { exchange(x, sends, recvs) })
            }),
        })
    }

    fn plan_gatherv<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_root("gatherv root", root)?;
        let mut tag = OpTag::default();
        if me == root {
            // Every block lands in the receive area packed, this rank's own included (staged
            // from `send`, or from its place in `recv` in place); the others arrive from their
            // ranks, chunk by chunk.
            self.check_blocks("gatherv receive blocks", recv, counts, displs, true)?;
            let own = match send {
                Some(s) => {
                    self.check_buffer("gatherv send buffer", s)?;
                    check::len("gatherv send buffer", s.len(), counts[root])?;
                    rows(s, 0, 1, s.len())
                }
                None => rows(recv, displs[me], 1, counts[me]),
            };
            let counts = counts.to_vec();
            return Ok(Plan {
                count: longest(&counts),
                width: n,
                send_parts: 0,
                recv_parts: n,
                input: Some((own, Into::Recv { part: root })),
                output: Some(blocks(recv, &counts, displs)),
                device_reduce: None,
                exchange: true,
                chunk: Box::new(move |c, b| {
                    let x = tag.transport::<T>(c)?;
                    let rb = packed(b.recv, &cuts(&b, &counts));
                    let recvs = peers(n, me, |i| carries(counts[i], b.k, b.c).then(|| rb[i]));
                    // SAFETY: as in `plan_p2p`.
                    Ok(unsafe { exchange(x, Vec::new(), recvs) })
                }),
            });
        }
        let contribution = send.map_or(recv.len(), |s| s.len());
        let input = match send {
            Some(s) => {
                self.check_buffer("gatherv send buffer", s)?;
                (rows(s, 0, 1, contribution), Into::Send)
            }
            None => {
                self.check_buffer("gatherv buffer", recv)?;
                (rows(recv, 0, 1, contribution), Into::Recv { part: 0 })
            }
        };
        Ok(Plan {
            count: contribution,
            width: n,
            send_parts: usize::from(send.is_some()),
            recv_parts: usize::from(send.is_none()),
            input: Some(input),
            output: None,
            device_reduce: None,
            exchange: true,
            chunk: Box::new(move |c, b| {
                let x = tag.transport::<T>(c)?;
                let sends = if carries(contribution, b.k, b.c) {
                    vec![(b.send.unwrap_or(b.recv).block(0, cut(contribution, b.k, b.c)), root)]
                } else {
                    Vec::new()
                };
                // SAFETY: as in `plan_p2p`.
                Ok(unsafe { exchange(x, sends, Vec::new()) })
            }),
        })
    }

    fn plan_scatterv<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        counts: &[usize],
        displs: &[usize],
        recv: &mut R,
        root: usize,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_root("scatterv root", root)?;
        self.check_buffer("scatterv receive buffer", recv)?;
        let mut tag = OpTag::default();
        if me == root {
            // Every block is staged packed in the send area; this rank's own is copied to the
            // receive area (out of place) or stays where it is (in place).
            let all = match send {
                Some(s) => {
                    self.check_blocks("scatterv send blocks", s, counts, displs, false)?;
                    check::len("scatterv receive buffer", recv.len(), counts[root])?;
                    blocks(s, counts, displs)
                }
                None => {
                    self.check_blocks("scatterv buffer", recv, counts, displs, false)?;
                    blocks(recv, counts, displs)
                }
            };
            let out_of_place = send.is_some();
            let counts = counts.to_vec();
            return Ok(Plan {
                count: longest(&counts),
                width: n,
                send_parts: n,
                recv_parts: usize::from(out_of_place),
                input: Some((all, Into::Send)),
                output: out_of_place.then(|| rows(recv, 0, 1, counts[root])),
                device_reduce: None,
                exchange: true,
                chunk: Box::new(move |c, b| {
                    let x = tag.transport::<T>(c)?;
                    let source = b.send.ok_or(Error::Progress("scatterv chunk without a send area"))?;
                    let sb = packed(source, &cuts(&b, &counts));
                    if out_of_place {
                        // SAFETY: as in `plan_alltoallv`.
                        unsafe { b.recv.block(0, sb[me].len()).copy_from(sb[me]) };
                    }
                    let sends = peers(n, me, |i| carries(counts[i], b.k, b.c).then(|| sb[i]));
                    // SAFETY: as in `plan_p2p`.
                    Ok(unsafe { exchange(x, sends, Vec::new()) })
                }),
            });
        }
        let len = recv.len();
        Ok(Plan {
            count: len,
            width: n,
            send_parts: 0,
            recv_parts: 1,
            input: None,
            output: Some(rows(recv, 0, 1, len)),
            device_reduce: None,
            exchange: true,
            chunk: Box::new(move |c, b| {
                let x = tag.transport::<T>(c)?;
                let recvs =
                    if carries(len, b.k, b.c) { vec![(b.recv.block(0, cut(len, b.k, b.c)), root)] } else { Vec::new() };
                // SAFETY: as in `plan_p2p`.
                Ok(unsafe { exchange(x, Vec::new(), recvs) })
            }),
        })
    }

    fn plan_reduce_scatterv<T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        counts: &[usize],
        op: O,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_buffer("reduce_scatterv receive buffer", recv)?;
        check::per_rank("reduce_scatterv counts", counts, n)?;
        let total = check::total("reduce_scatterv counts", counts)?;
        let packed_at = check::packed_displs(counts);
        let input = match send {
            Some(s) => {
                self.check_buffer("reduce_scatterv send buffer", s)?;
                check::len("reduce_scatterv send buffer", s.len(), total)?;
                check::len("reduce_scatterv receive buffer", recv.len(), counts[me])?;
                (blocks(s, counts, &packed_at), Into::Send)
            }
            None => {
                check::len("reduce_scatterv buffer", recv.len(), total)?;
                (blocks(recv, counts, &packed_at), Into::Recv { part: 0 })
            }
        };
        let (out_of_place, counts) = (send.is_some(), counts.to_vec());
        Ok(Plan {
            count: longest(&counts),
            width: n,
            send_parts: if out_of_place { n } else { 0 },
            recv_parts: if out_of_place { 1 } else { n },
            input: Some(input),
            output: Some(rows(recv, 0, 1, counts[me])),
            device_reduce: None,
            exchange: false,
            chunk: Box::new(move |c, b| {
                // Every rank knows every count, so every rank runs the same chunks.
                let lens = cuts(&b, &counts);
                let total: usize = lens.iter().sum();
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.prefixes(total, if out_of_place { lens[me] } else { total }) };
                c.plan_reduce_scatterv(s, r, &lens, op, Mode::NonBlocking)
            }),
        })
    }

    fn plan_sendrecv_in_place<T: Element, B: DeviceSlice<D, Elem = T>>(
        &self,
        buf: &mut B,
        dest: usize,
        source: usize,
        tag: i32,
    ) -> Result<Plan<T>> {
        check::tag(tag, self.shared.max_tag)?;
        check::rank("destination rank", dest, self.size())?;
        check::rank("source rank", source, self.size())?;
        self.check_buffer("sendrecv buffer", buf)?;
        let len = buf.len();
        Ok(Plan {
            count: len,
            width: 1,
            send_parts: 1,
            recv_parts: 1,
            input: Some((rows(buf, 0, 1, len), Into::Send)),
            output: Some(rows(buf, 0, 1, len)),
            device_reduce: None,
            exchange: true,
            chunk: Box::new(move |c, b| {
                // Staged (exchanges never work on the device buffer), so the send and receive
                // areas are distinct.
                let n = cut(len, b.k, b.c);
                let (s, r) = (b.send.unwrap_or(b.recv).block(0, n), b.recv.block(0, n));
                let x = c.p2p_transport::<T>(tag, Mode::NonBlocking)?;
                // SAFETY: as in `plan_p2p`.
                Ok(unsafe { exchange(x, vec![(s, dest)], vec![(r, source)]) })
            }),
        })
    }

    fn plan_multi<T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        sends: &[(&S, usize)],
        recvs: &mut [(&mut R, usize)],
        tag: i32,
    ) -> Result<Plan<T>> {
        let (me, n) = (self.rank(), self.size());
        check::tag(tag, self.shared.max_tag)?;
        for (b, peer) in sends {
            check::rank("destination rank", *peer, n)?;
            self.check_buffer("send buffer", *b)?;
        }
        for (b, peer) in recvs.iter() {
            check::rank("source rank", *peer, n)?;
            self.check_buffer("receive buffer", *b)?;
        }
        let only_self = |peers: &mut dyn Iterator<Item = usize>| {
            let v: Vec<usize> = peers.collect();
            !v.is_empty() && v.iter().all(|&p| p == me)
        };
        if (sends.is_empty() || recvs.is_empty())
            && (only_self(&mut sends.iter().map(|s| s.1)) || only_self(&mut recvs.iter().map(|r| r.1)))
        {
            return Err(Error::SelfMessage { op: "multi_sendrecv" });
        }
        let send_lens: Vec<(usize, usize)> = sends.iter().map(|(b, p)| (b.len(), *p)).collect();
        let recv_lens: Vec<(usize, usize)> = recvs.iter().map(|(b, p)| (b.len(), *p)).collect();
        let pieces = |list: &mut dyn Iterator<Item = (DevicePtr, usize, Option<KeepAlive>)>| {
            let (mut pieces, mut keep) = (Vec::new(), Vec::new());
            for (ptr, len, k) in list {
                pieces.push((ptr, len));
                keep.extend(k);
            }
            Region::Pieces { pieces, keep }
        };
        let input = pieces(&mut sends.iter().map(|(b, _)| (b.device_ptr(), b.len(), b.keep_alive())));
        let output = pieces(&mut recvs.iter().map(|(b, _)| (b.device_ptr(), b.len(), b.keep_alive())));
        let lens = |l: &[(usize, usize)]| l.iter().map(|p| p.0).collect::<Vec<_>>();
        let (sl, rl) = (lens(&send_lens), lens(&recv_lens));
        Ok(Plan {
            // Cut like single messages (one row per chunk), so a message matches a plain
            // send or receive on the other side.
            count: longest(&sl).max(longest(&rl)),
            width: 1,
            send_parts: sends.len(),
            recv_parts: recvs.len(),
            input: (!sends.is_empty()).then_some((input, Into::Send)),
            output: (!recvs.is_empty()).then_some(output),
            device_reduce: None,
            exchange: true,
            chunk: Box::new(move |c, b| {
                let x = c.p2p_transport::<T>(tag, Mode::NonBlocking)?;
                let list = |area: RawBuf<T>, l: &[(usize, usize)], lens: &[usize]| {
                    packed(area, &cuts(&b, lens))
                        .into_iter()
                        .zip(l)
                        .filter(|(_, (len, _))| carries(*len, b.k, b.c))
                        .map(|(blk, &(_, peer))| (blk, peer))
                        .collect::<Vec<_>>()
                };
                let s = list(b.send.unwrap_or(b.recv), &send_lens, &sl);
                let r = list(b.recv, &recv_lens, &rl);
                // SAFETY: as in `plan_p2p`.
                Ok(unsafe { exchange(x, s, r) })
            }),
        })
    }
}

/// The longest of `lens` (0 if none).
fn longest(lens: &[usize]) -> usize {
    lens.iter().copied().max().unwrap_or(0)
}

/// Chunk `b.k`'s share of each of `lens`.
fn cuts<T>(b: &ChunkBufs<T>, lens: &[usize]) -> Vec<usize> {
    lens.iter().map(|&n| cut(n, b.k, b.c)).collect()
}

/// Blocks of `lens` elements packed back to back from the start of `area`.
fn packed<T>(area: RawBuf<T>, lens: &[usize]) -> Vec<RawBuf<T>> {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            at += n;
            area.block(at - n, n)
        })
        .collect()
}

/// `(block, peer)` for every other rank whose block `f` gives.
fn peers<T>(n: usize, me: usize, f: impl Fn(usize) -> Option<RawBuf<T>>) -> Vec<(RawBuf<T>, usize)> {
    (0..n).filter(|&p| p != me).filter_map(|p| f(p).map(|b| (b, p))).collect()
}

/// The message tag of an operation whose ranks may run different numbers of chunks: taken by
/// its first chunk (which every rank runs, so every rank takes one, in operation order) and
/// kept for the others. Messages of one pair then match chunk by chunk, in order.
#[derive(Default)]
struct OpTag(Option<MpiTransport>);

impl OpTag {
    fn transport<T: Element>(&mut self, c: &crate::Communicator) -> Result<MpiTransport> {
        match self.0 {
            Some(x) => Ok(x),
            None => Ok(*self.0.insert(c.transport::<T>(Mode::NonBlocking)?)),
        }
    }
}
