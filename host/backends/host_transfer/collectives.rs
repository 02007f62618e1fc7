//! The HostTransfer operations, listed in one place: each names its signature, the buffers it
//! reads and writes, and its planner (in [`super::plans`]), which validates its arguments on the
//! calling thread, describes its data for the staging engine, and names the Mpi backend plan
//! that runs one chunk.

use std::sync::Arc;

use duralumin_kernels::{Element, ReduceOp};

use super::HostTransferCommunicator;
use super::request::DeviceRequest;
use crate::backends::mpi::{AllreduceAlgorithm, BcastAlgorithm};
use crate::device::{Device, DeviceSlice, DeviceSliceMut};
use crate::error::Result;
use crate::reliability::crosscheck::Pairs;
use crate::reliability::recorder::{OpKind, Signature};
use crate::request::ErrorSlot;

/// Emits the stream-ordered and the non-blocking method of an operation from its plan.
/// `sig(|comm| ..)` is its [`Signature`] and `pairs(|comm| ..)` its per-pair counts, as on the Mpi
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
        /// the MPI part are returned by the communicator's next call or [`HostTransferCommunicator::synchronize`].
        #[allow(clippy::too_many_arguments)]
        pub fn $name<'a, $($g: $bound),*>(&self, $($arg: $ty),*) -> Result<()> {
            let sig: Signature = ($sig)(self);
            let pairs: Option<Pairs> = if self.checks(&sig) { None $(.or_else(|| Some(($pairs)(self))))? } else { None };
            let (id, plan) = self.prepare(sig, pairs, || self.$plan($($pa),*))?;
            $(uses::$kind::<D, _>($buf, uses::Stage::Before);)*
            self.enqueue(&self.stream, plan, id, ErrorSlot::for_communicator(&self.shared.errors))?;
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
            let queued = self.enqueue(side, plan, id, ErrorSlot::for_request(&self.shared.errors))?;
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

impl<D: Device> HostTransferCommunicator<D> {
    stream_ordered_and_nonblocking! {
        /// Allreduce: `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank (equal
        /// lengths everywhere).
        #[doc(alias = "all_reduce")]
        fn allreduce / iallreduce <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(send.len()))
            uses(read send, write recv) => plan_allreduce(Some(send), recv, op, AllreduceAlgorithm::Auto);
        /// In-place allreduce: `buf` is the input and receives the result.
        fn allreduce_in_place / iallreduce_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(buf.len()).in_place())
            uses(write buf) => plan_allreduce(None::<&B>, buf, op, AllreduceAlgorithm::Auto);
        /// Allreduce whose MPI part runs `algorithm` on every chunk (`Auto`: by the chunk's size
        /// and the communicator's [`Tuning`](crate::Tuning)). Algorithms other than `Native` and `Auto` need
        /// a commutative operator ([`Error::AlgorithmUnsupported`](crate::Error::AlgorithmUnsupported)
        /// otherwise, before anything is queued). Small allreduces reduce on the device
        /// ([`HostTransferConfig::device_reduce_max_bytes`](super::HostTransferConfig::device_reduce_max_bytes))
        /// only under `Auto`.
        fn allreduce_with / iallreduce_with <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O, algorithm: AllreduceAlgorithm)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(send.len()).algorithm(algorithm.name()))
            uses(read send, write recv) => plan_allreduce(Some(send), recv, op, algorithm);
        /// In-place allreduce with an explicit algorithm, as [`allreduce_with`](Self::allreduce_with).
        fn allreduce_in_place_with / iallreduce_in_place_with <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O, algorithm: AllreduceAlgorithm)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(buf.len()).algorithm(algorithm.name()).in_place())
            uses(write buf) => plan_allreduce(None::<&B>, buf, op, algorithm);

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
        #[doc(alias = "broadcast")]
        fn bcast / ibcast <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize)
            sig(|_| Signature::new(OpKind::Bcast).elem::<T>().count(buf.len()).root(root)) uses(write buf)
            => plan_bcast(buf, root, BcastAlgorithm::Auto);
        /// Broadcast whose MPI part runs `algorithm` on every chunk (`Auto`: by the chunk's size
        /// and the communicator's [`Tuning`](crate::Tuning)).
        fn bcast_with / ibcast_with <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize, algorithm: BcastAlgorithm)
            sig(|_| Signature::new(OpKind::Bcast).elem::<T>().count(buf.len()).root(root).algorithm(algorithm.name()))
            uses(write buf) => plan_bcast(buf, root, algorithm);

        /// Allgather: rank `i`'s `send` (`c` elements) lands at `recv[i*c..]` on every rank.
        #[doc(alias = "all_gather")]
        fn allgather / iallgather <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R)
            sig(|_| Signature::new(OpKind::Allgather).elem::<T>().count(send.len()))
            uses(read send, write recv) => plan_allgather(Some(send), recv);
        /// In-place allgather: this rank's block is already at `buf[rank*c..]`.
        fn allgather_in_place / iallgather_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B)
            sig(|comm: &Self| Signature::new(OpKind::Allgather).elem::<T>().count(buf.len() / comm.size()).in_place())
            uses(write buf) => plan_allgather(None::<&B>, buf);

        /// All-to-all: block `j` of `send` goes to rank `j`, block `i` of `recv` comes from
        /// rank `i` (`size * c` elements each).
        #[doc(alias = "all_to_all")]
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
            sig(|comm: &Self| Signature::new(OpKind::Gather).elem::<T>()
                .block_count(buf.len(), comm.rank(), root, comm.size()).root(root).in_place())
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
            sig(|comm: &Self| Signature::new(OpKind::Scatter).elem::<T>()
                .block_count(buf.len(), comm.rank(), root, comm.size()).root(root).in_place())
            uses(write buf) => plan_scatter(None::<&B>, buf, root);

        /// Reduce-scatter with equal blocks: `send` has `size * c` elements, rank `i` receives
        /// the reduction of block `i` in `recv` (`c` elements).
        #[doc(alias = "reduce_scatter_tensor")]
        fn reduce_scatter / ireduce_scatter <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O)
            sig(|_| Signature::new(OpKind::ReduceScatter).reduce::<T, O>().count(recv.len()))
            uses(read send, write recv) => plan_reduce_scatter(Some(send), recv, op);
        /// In-place reduce-scatter: `buf` (`size * c`) is the input; the result goes to
        /// `buf[..c]`.
        fn reduce_scatter_in_place / ireduce_scatter_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O)
            sig(|comm: &Self| Signature::new(OpKind::ReduceScatter).reduce::<T, O>().count(buf.len() / comm.size()).in_place())
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
            pairs(|comm: &Self| Pairs::alltoallv(comm.size(), send_counts, recv_counts)) uses(read send, write recv)
            => plan_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);

        /// Gatherv to `root`: rank `i`'s `send` lands at `recv[displs[i]..][..counts[i]]` on
        /// the root; `counts`, `displs` and `recv` are used at the root only.
        fn gatherv / igatherv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Gatherv).elem::<T>().count(send.len()).root(root))
            pairs(|comm: &Self| Pairs::gatherv(comm.size(), comm.rank(), root, send.len(), counts)) uses(read send, write recv)
            => plan_gatherv(Some(send), recv, counts, displs, root);
        /// In-place gatherv: the root's own block is already in place; elsewhere `buf` is the
        /// contribution.
        fn gatherv_in_place / igatherv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Gatherv).elem::<T>().count(buf.len()).root(root).in_place())
            pairs(|comm: &Self| Pairs::gatherv(comm.size(), comm.rank(), root, buf.len(), counts)) uses(write buf)
            => plan_gatherv(None::<&B>, buf, counts, displs, root);

        /// Scatterv from `root`: `send[displs[i]..][..counts[i]]` lands in rank `i`'s `recv`;
        /// `send`, `counts` and `displs` are used at the root only.
        fn scatterv / iscatterv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, counts: &[usize], displs: &[usize], recv: &'a mut R, root: usize)
            sig(|_| Signature::new(OpKind::Scatterv).elem::<T>().count(recv.len()).root(root))
            pairs(|comm: &Self| Pairs::scatterv(comm.size(), comm.rank(), root, recv.len(), counts)) uses(read send, write recv)
            => plan_scatterv(Some(send), counts, displs, recv, root);
        /// In-place scatterv: at the root `buf` is the send buffer and keeps its own block;
        /// elsewhere `buf` receives the block.
        fn scatterv_in_place / iscatterv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Scatterv).elem::<T>().count(buf.len()).root(root).in_place())
            pairs(|comm: &Self| Pairs::scatterv(comm.size(), comm.rank(), root, buf.len(), counts)) uses(write buf)
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
        /// ([`Error::SelfMessage`](crate::Error::SelfMessage)): the stream would wait forever.
        fn send / isend <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a B, dest: usize, tag: i32)
            sig(|_| Signature::new(OpKind::Send).elem::<T>().count(buf.len()).root(dest).tag(tag)) uses(read buf)
            => plan_p2p(Some((buf, dest)), None::<(&mut B, usize)>, tag, "send");
        /// Receives exactly `buf.len()` elements from `source` with `tag`.
        ///
        /// A message longer than one chunk travels as one MPI message per chunk, cut the same
        /// way by every point-to-point call (so a `multi_sendrecv` message meets a `recv`). The
        /// lengths must match, as MPI requires: a shorter message is reported here
        /// ([`Error::CountMismatch`](crate::Error::CountMismatch)) and a longer one as MPI's
        /// truncation error, but the sender of a message longer than the receive by a whole
        /// chunk or more is left waiting for a receiver of its last chunks.
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
        self.enqueue::<u8>(&self.stream, plan, id, ErrorSlot::for_communicator(&self.shared.errors)).map(drop)
    }

    /// Non-blocking [`barrier`](Self::barrier) on the internal stream.
    pub fn ibarrier(&self) -> Result<DeviceRequest<'_, D>> {
        let side = self.side_stream()?;
        let (id, plan) = self.prepare(Signature::new(OpKind::Barrier), None, || Ok(self.plan_barrier()))?;
        let queued = self.enqueue::<u8>(side, plan, id, ErrorSlot::for_request(&self.shared.errors))?;
        Ok(DeviceRequest::new(queued, side.clone(), Arc::clone(&self.shared)))
    }
}
