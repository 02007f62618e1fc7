//! The HostTransfer operations: each validates its arguments on the calling thread, describes
//! its data as rows for the staging engine, and names the Mpi backend plan that runs one chunk.

use std::sync::Arc;

use duralumin_kernels::{Element, ReduceOp};

use super::Communicator;
use super::request::DeviceRequest;
use super::staging::{ChunkBufs, Into, Plan, Region, Rows};
use crate::backends::mpi::{AllreduceAlgorithm, BcastAlgorithm, Mode};
use crate::buffer::RawBuf;
use crate::check;
use crate::device::{Device, DevicePtr, DeviceSlice, KeepAlive, ReduceFns};
use crate::error::{Error, Result};

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
    let sz = size_of::<B::Elem>();
    let pieces = counts.iter().zip(displs).map(|(&c, &d)| (buf.device_ptr().offset(d * sz), c * sz)).collect();
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

    /// The first `send` and `recv` elements of the areas (plans staged whole, whose areas are
    /// sized for the larger of the two).
    ///
    /// # Safety
    /// As [`ChunkBufs::slices`].
    unsafe fn prefixes<'a>(&self, send: usize, recv: usize) -> (Option<&'a [T]>, &'a mut [T]) {
        // SAFETY: as in `slices`.
        unsafe { (self.send.map(|s| s.block(0, send).as_slice()), self.recv.block(0, recv).as_mut_slice()) }
    }
}

/// Emits the stream-ordered and the non-blocking method of an operation from its plan.
macro_rules! stream_ordered_and_nonblocking {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $iname:ident <$($g:ident : $bound:path),*> ($($arg:ident : $ty:ty),* $(,)?)
            => $plan:ident ($($pa:expr),* $(,)?);
    )*) => {$(
        $(#[$doc])*
        ///
        /// Stream-ordered: queued on the communicator's stream after the work already there;
        /// returns at once. Argument errors are returned before anything is queued; errors of
        /// the MPI part are returned by the communicator's next call or [`Communicator::synchronize`].
        #[allow(clippy::too_many_arguments)]
        pub fn $name<'a, $($g: $bound),*>(&self, $($arg: $ty),*) -> Result<()> {
            self.shared.errors.check()?;
            let plan = self.$plan($($pa),*)?;
            self.enqueue(&self.stream, plan).map(drop)
        }

        #[doc = concat!("Non-blocking [`", stringify!($name), "`](Self::", stringify!($name), "): runs on the \
            communicator's internal stream after the work queued on its stream so far, and \
            returns a [`DeviceRequest`] that borrows the buffers until the operation completes.")]
        #[allow(clippy::too_many_arguments)]
        pub fn $iname<'a, $($g: $bound),*>(&'a self, $($arg: $ty),*) -> Result<DeviceRequest<'a, D>> {
            self.shared.errors.check()?;
            let plan = self.$plan($($pa),*)?;
            let side = self.side_stream()?;
            let done = self.enqueue(side, plan)?;
            Ok(DeviceRequest::new(done, Arc::clone(&self.shared)))
        }
    )*};
}

impl<D: Device> Communicator<D> {
    stream_ordered_and_nonblocking! {
        /// Allreduce: `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank (equal
        /// lengths everywhere).
        fn allreduce / iallreduce <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O) => plan_allreduce(Some(send), recv, op);
        /// In-place allreduce: `buf` is the input and receives the result.
        fn allreduce_in_place / iallreduce_in_place <T: Element, O: ReduceOp<T>, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, op: O) => plan_allreduce(None::<&B>, buf, op);

        /// Reduce to `root`: at the root `recv` (the length of `send`) receives the reduction;
        /// elsewhere `recv` is not used.
        fn reduce / ireduce <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize, op: O) => plan_reduce(Some(send), recv, root, op);
        /// In-place reduce: `buf` is every rank's input; the root's receives the result.
        fn reduce_in_place / ireduce_in_place <T: Element, O: ReduceOp<T>, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, root: usize, op: O) => plan_reduce(None::<&B>, buf, root, op);

        /// Broadcast of the root's `buf` into every rank's `buf` (equal lengths). The root's
        /// stream does not wait for the other ranks' copies back.
        fn bcast / ibcast <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a mut B, root: usize)
            => plan_bcast(buf, root);

        /// Allgather: rank `i`'s `send` (`c` elements) lands at `recv[i*c..]` on every rank.
        fn allgather / iallgather <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R) => plan_allgather(Some(send), recv);
        /// In-place allgather: this rank's block is already at `buf[rank*c..]`.
        fn allgather_in_place / iallgather_in_place <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a mut B)
            => plan_allgather(None::<&B>, buf);

        /// All-to-all: block `j` of `send` goes to rank `j`, block `i` of `recv` comes from
        /// rank `i` (`size * c` elements each).
        fn alltoall / ialltoall <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R) => plan_alltoall(Some(send), recv);
        /// In-place all-to-all on `buf`.
        fn alltoall_in_place / ialltoall_in_place <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a mut B)
            => plan_alltoall(None::<&B>, buf);

        /// Gather to `root`: rank `i`'s `send` lands at `recv[i*c..]` on the root; `recv` is
        /// not used elsewhere.
        fn gather / igather <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize) => plan_gather(Some(send), recv, root);
        /// In-place gather: at the root `buf` has `size * c` elements with its own block in
        /// place; elsewhere `buf` is the `c`-element contribution.
        fn gather_in_place / igather_in_place <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a mut B, root: usize)
            => plan_gather(None::<&B>, buf, root);

        /// Scatter from `root`: block `i` of the root's `send` lands in rank `i`'s `recv`;
        /// `send` is not used elsewhere.
        fn scatter / iscatter <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize) => plan_scatter(Some(send), recv, root);
        /// In-place scatter: at the root `buf` holds all blocks and keeps its own; elsewhere
        /// `buf` receives the block.
        fn scatter_in_place / iscatter_in_place <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a mut B, root: usize)
            => plan_scatter(None::<&B>, buf, root);

        /// Reduce-scatter with equal blocks: `send` has `size * c` elements, rank `i` receives
        /// the reduction of block `i` in `recv` (`c` elements).
        fn reduce_scatter / ireduce_scatter <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O) => plan_reduce_scatter(Some(send), recv, op);
        /// In-place reduce-scatter: `buf` (`size * c`) is the input; the result goes to
        /// `buf[..c]`.
        fn reduce_scatter_in_place / ireduce_scatter_in_place <T: Element, O: ReduceOp<T>, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, op: O) => plan_reduce_scatter(None::<&B>, buf, op);

        /// Allgatherv: rank `i`'s `send` (`counts[i]` elements) lands at
        /// `recv[displs[i]..]` on every rank. Staged in one piece (the blocks differ in size).
        fn allgatherv / iallgatherv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], displs: &[usize])
            => plan_allgatherv(Some(send), recv, counts, displs);
        /// In-place allgatherv: this rank's block is already at `buf[displs[rank]..]`.
        fn allgatherv_in_place / iallgatherv_in_place <T: Element, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize]) => plan_allgatherv(None::<&B>, buf, counts, displs);

        /// Alltoallv: `send[send_displs[j]..][..send_counts[j]]` goes to rank `j`, and what
        /// rank `i` sends lands at `recv[recv_displs[i]..][..recv_counts[i]]`.
        fn alltoallv / ialltoallv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, send_counts: &[usize], send_displs: &[usize], recv: &'a mut R, recv_counts: &[usize], recv_displs: &[usize])
            => plan_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);

        /// Gatherv to `root`: rank `i`'s `send` lands at `recv[displs[i]..][..counts[i]]` on
        /// the root; `counts`, `displs` and `recv` are used at the root only.
        fn gatherv / igatherv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], displs: &[usize], root: usize)
            => plan_gatherv(Some(send), recv, counts, displs, root);
        /// In-place gatherv: the root's own block is already in place; elsewhere `buf` is the
        /// contribution.
        fn gatherv_in_place / igatherv_in_place <T: Element, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            => plan_gatherv(None::<&B>, buf, counts, displs, root);

        /// Scatterv from `root`: `send[displs[i]..][..counts[i]]` lands in rank `i`'s `recv`;
        /// `send`, `counts` and `displs` are used at the root only.
        fn scatterv / iscatterv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, counts: &[usize], displs: &[usize], recv: &'a mut R, root: usize)
            => plan_scatterv(Some(send), counts, displs, recv, root);
        /// In-place scatterv: at the root `buf` is the send buffer and keeps its own block;
        /// elsewhere `buf` receives the block.
        fn scatterv_in_place / iscatterv_in_place <T: Element, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            => plan_scatterv(None::<&B>, counts, displs, buf, root);

        /// Reduce-scatter with per-rank counts: `send` holds the blocks back to back, rank `i`
        /// receives the reduction of block `i` (`counts[i]` elements).
        fn reduce_scatterv / ireduce_scatterv <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], op: O) => plan_reduce_scatterv(Some(send), recv, counts, op);
        /// In-place reduce-scatterv: the result goes to `buf[..counts[rank]]`.
        fn reduce_scatterv_in_place / ireduce_scatterv_in_place <T: Element, O: ReduceOp<T>, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], op: O) => plan_reduce_scatterv(None::<&B>, buf, counts, op);

        /// Sends `buf` to `dest` with `tag`. Sending to this rank itself is refused
        /// ([`Error::SelfMessage`]): the stream would wait forever.
        fn send / isend <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a B, dest: usize, tag: i32)
            => plan_p2p(Some((buf, dest)), None::<(&mut B, usize)>, tag, "send");
        /// Receives exactly `buf.len()` elements from `source` with `tag`.
        fn recv / irecv <T: Element, B: DeviceSlice<D, Elem = T>> (buf: &'a mut B, source: usize, tag: i32)
            => plan_p2p(None::<(&B, usize)>, Some((buf, source)), tag, "recv");
        /// Sends `send` to `dest` and receives `recv` from `source` at once; either peer may be
        /// this rank.
        fn sendrecv / isendrecv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (send: &'a S, dest: usize, recv: &'a mut R, source: usize, tag: i32)
            => plan_p2p(Some((send, dest)), Some((recv, source)), tag, "sendrecv");
        /// Sends `buf` to `dest` and replaces it with the same number of elements from
        /// `source`.
        fn sendrecv_in_place / isendrecv_in_place <T: Element, B: DeviceSlice<D, Elem = T>>
            (buf: &'a mut B, dest: usize, source: usize, tag: i32) => plan_sendrecv_in_place(buf, dest, source, tag);
        /// Sends each `(buffer, dest)` of `sends` and receives each `(buffer, source)` of
        /// `recvs`, all at once (Aluminum's MultiSendRecv), staged through one pinned block.
        fn multi_sendrecv / imulti_sendrecv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>
            (sends: &[(&'a S, usize)], recvs: &mut [(&'a mut R, usize)], tag: i32) => plan_multi(sends, recvs, tag);
    }

    /// Barrier, ordered on the stream: work queued after it starts once every rank's stream
    /// has reached the barrier. Returns at once.
    pub fn barrier(&self) -> Result<()> {
        self.shared.errors.check()?;
        self.enqueue::<u8>(&self.stream, self.plan_barrier()).map(drop)
    }

    /// Non-blocking [`barrier`](Self::barrier) on the internal stream.
    pub fn ibarrier(&self) -> Result<DeviceRequest<'_, D>> {
        self.shared.errors.check()?;
        let side = self.side_stream()?;
        let done = self.enqueue::<u8>(side, self.plan_barrier())?;
        Ok(DeviceRequest::new(done, Arc::clone(&self.shared)))
    }

    fn plan_barrier(&self) -> Plan<u8> {
        Plan {
            count: 0,
            width: 1,
            whole: false,
            send_parts: 0,
            recv_parts: 0,
            input: None,
            output: None,
            device_reduce: None,
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
        if size > 1 && n * size_of::<T>() <= self.config.device_reduce_max_bytes {
            // Allgather the contributions into staging, reduce them on the device in rank order.
            return Ok(Plan {
                count: n,
                width: size,
                whole: false,
                send_parts: 1,
                recv_parts: size,
                input: Some((input.0, Into::Send)),
                output: Some(rows(recv, 0, 1, n)),
                device_reduce: Some(ReduceFns::of::<T, O>(size as u32)),
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
            whole: false,
            send_parts: usize::from(send.is_some()),
            recv_parts: 1,
            input: Some(input),
            output: Some(rows(recv, 0, 1, n)),
            device_reduce: None,
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
            whole: false,
            send_parts: usize::from(send.is_some()),
            recv_parts: usize::from(staged_recv),
            input: Some(input),
            output: is_root.then(|| rows(recv, 0, 1, n)),
            device_reduce: None,
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
            whole: false,
            send_parts: 0,
            recv_parts: 1,
            input: is_root.then(|| (rows(buf, 0, 1, n), Into::Recv { part: 0 })),
            // The root's buffer does not change: nothing to copy back.
            output: (!is_root).then(|| rows(buf, 0, 1, n)),
            device_reduce: None,
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
            whole: false,
            send_parts: usize::from(send.is_some()),
            recv_parts: n,
            input: Some(input),
            output: Some(rows(recv, 0, n, count)),
            device_reduce: None,
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
            whole: false,
            send_parts: if send.is_some() { n } else { 0 },
            recv_parts: n,
            input: Some(input),
            output: Some(rows(recv, 0, n, count)),
            device_reduce: None,
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
            whole: false,
            send_parts: usize::from(send.is_some()),
            recv_parts,
            input: Some(input),
            output: is_root.then(|| rows(recv, 0, n, count)),
            device_reduce: None,
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
            whole: false,
            send_parts,
            recv_parts,
            input,
            output,
            device_reduce: None,
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
            whole: false,
            send_parts: if send.is_some() { n } else { 0 },
            recv_parts: if send.is_some() { 1 } else { n },
            input: Some(input),
            output: Some(rows(recv, 0, 1, count)),
            device_reduce: None,
            chunk: Box::new(move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.slices() };
                c.plan_reduce_scatter(s, r, op, Mode::NonBlocking)
            }),
        })
    }

    /// Point-to-point: one message each way at most, staged whole (the two sides' lengths
    /// need not agree, so the message is not cut into chunks).
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
        // One chunk holding both messages: rows of the longer length.
        let count = send_len.max(recv_len);
        let dest = send.as_ref().map(|s| s.1);
        let source = recv.as_ref().map(|r| r.1);
        Ok(Plan {
            count,
            width: 1,
            whole: true,
            send_parts: usize::from(send.is_some()),
            recv_parts: usize::from(recv.is_some()),
            input: send.map(|(s, _)| (rows(s, 0, 1, send_len), Into::Send)),
            output: recv.map(|(r, _)| rows(r, 0, 1, recv_len)),
            device_reduce: None,
            chunk: Box::new(move |c, b| {
                let sends: Vec<_> = b.send.map(|s| (s.block(0, send_len), dest.unwrap_or(0))).into_iter().collect();
                let recvs: Vec<_> = source.map(|src| (b.recv.block(0, recv_len), src)).into_iter().collect();
                c.plan_p2p(&sends, &recvs, tag, name, Mode::NonBlocking)
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
        let me = self.rank();
        let total = self.check_blocks("allgatherv receive blocks", recv, counts, displs, true)?;
        let packed = check::packed_displs(counts);
        let (send_len, input) = match send {
            Some(s) => {
                self.check_buffer("allgatherv send buffer", s)?;
                check::len("allgatherv send buffer", s.len(), counts[me])?;
                (s.len(), (rows(s, 0, 1, s.len()), Into::Send))
            }
            None => (0, (blocks(recv, &counts[me..=me], &displs[me..=me]), Into::RecvAt { offset: packed[me] })),
        };
        let counts = counts.to_vec();
        Ok(Plan {
            output: Some(blocks(recv, &counts, displs)),
            ..whole(send_len.max(total), send.is_some(), true, Some(input), move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.prefixes(send_len, total) };
                c.plan_allgatherv(s, r, &counts, &packed, Mode::NonBlocking)
            })
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
        let stot = self.check_blocks("alltoallv send blocks", send, send_counts, send_displs, false)?;
        let rtot = self.check_blocks("alltoallv receive blocks", recv, recv_counts, recv_displs, true)?;
        let (sc, rc) = (send_counts.to_vec(), recv_counts.to_vec());
        let (sd, rd) = (check::packed_displs(&sc), check::packed_displs(&rc));
        Ok(Plan {
            output: Some(blocks(recv, &rc, recv_displs)),
            ..whole(stot.max(rtot), true, true, Some((blocks(send, &sc, send_displs), Into::Send)), move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.prefixes(stot, rtot) };
                c.plan_alltoallv(s.unwrap_or_default(), &sc, &sd, r, &rc, &rd, Mode::NonBlocking)
            })
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
        let me = self.rank();
        self.check_root("gatherv root", root)?;
        let is_root = me == root;
        let (total, counts, packed) = if is_root {
            let total = self.check_blocks("gatherv receive blocks", recv, counts, displs, true)?;
            (total, counts.to_vec(), check::packed_displs(counts))
        } else {
            (0, Vec::new(), Vec::new())
        };
        let (send_len, recv_len, input) = match (send, is_root) {
            (Some(s), _) => {
                self.check_buffer("gatherv send buffer", s)?;
                if is_root {
                    check::len("gatherv send buffer", s.len(), counts[root])?;
                }
                (s.len(), total, (rows(s, 0, 1, s.len()), Into::Send))
            }
            (None, true) => {
                let own = blocks(recv, &counts[me..=me], &displs[me..=me]);
                (0, total, (own, Into::RecvAt { offset: packed[me] }))
            }
            (None, false) => {
                self.check_buffer("gatherv buffer", recv)?;
                (0, recv.len(), (rows(recv, 0, 1, recv.len()), Into::Recv { part: 0 }))
            }
        };
        let output = is_root.then(|| blocks(recv, &counts, displs));
        Ok(Plan {
            output,
            ..whole(send_len.max(recv_len), send.is_some(), is_root || send.is_none(), Some(input), move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.prefixes(send_len, recv_len) };
                c.plan_gatherv(s, r, &counts, &packed, root, Mode::NonBlocking)
            })
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
        let me = self.rank();
        self.check_root("scatterv root", root)?;
        let is_root = me == root;
        let (input, total, counts, packed) = match (send, is_root) {
            (Some(s), true) => {
                let total = self.check_blocks("scatterv send blocks", s, counts, displs, false)?;
                self.check_buffer("scatterv receive buffer", recv)?;
                check::len("scatterv receive buffer", recv.len(), counts[root])?;
                (Some((blocks(s, counts, displs), Into::Send)), total, counts.to_vec(), check::packed_displs(counts))
            }
            (None, true) => {
                let total = self.check_blocks("scatterv buffer", recv, counts, displs, false)?;
                let all = blocks(recv, counts, displs);
                (Some((all, Into::RecvAt { offset: 0 })), total, counts.to_vec(), check::packed_displs(counts))
            }
            (_, false) => {
                self.check_buffer("scatterv receive buffer", recv)?;
                (None, 0, Vec::new(), Vec::new())
            }
        };
        let (send_len, recv_len) = match (send.is_some() && is_root, is_root) {
            (true, _) => (total, recv.len()),
            (false, true) => (0, total),
            (false, false) => (0, recv.len()),
        };
        // In place, the root's own block stays where it is.
        let output = (!is_root || send.is_some()).then(|| rows(recv, 0, 1, recv.len()));
        let staged_send = send.is_some() && is_root;
        Ok(Plan {
            output,
            ..whole(send_len.max(recv_len), staged_send, true, input, move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.prefixes(send_len, recv_len) };
                c.plan_scatterv(s, &counts, &packed, r, root, Mode::NonBlocking)
            })
        })
    }

    fn plan_reduce_scatterv<T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSlice<D, Elem = T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        counts: &[usize],
        op: O,
    ) -> Result<Plan<T>> {
        let me = self.rank();
        self.check_buffer("reduce_scatterv receive buffer", recv)?;
        check::per_rank("reduce_scatterv counts", counts, self.size())?;
        let total = check::total("reduce_scatterv counts", counts)?;
        let input = match send {
            Some(s) => {
                self.check_buffer("reduce_scatterv send buffer", s)?;
                check::len("reduce_scatterv send buffer", s.len(), total)?;
                check::len("reduce_scatterv receive buffer", recv.len(), counts[me])?;
                (rows(s, 0, 1, total), Into::Send)
            }
            None => {
                check::len("reduce_scatterv buffer", recv.len(), total)?;
                (rows(recv, 0, 1, total), Into::Recv { part: 0 })
            }
        };
        let (mine, counts) = (counts[me], counts.to_vec());
        let recv_len = if send.is_some() { mine } else { total };
        Ok(Plan {
            output: Some(rows(recv, 0, 1, mine)),
            ..whole(total, send.is_some(), true, Some(input), move |c, b| {
                // SAFETY: as in `plan_allreduce`.
                let (s, r) = unsafe { b.prefixes(total, recv_len) };
                c.plan_reduce_scatterv(s, r, &counts, op, Mode::NonBlocking)
            })
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
            output: Some(rows(buf, 0, 1, len)),
            ..whole(len, true, true, Some((rows(buf, 0, 1, len), Into::Send)), move |c, b| {
                let sends = [(b.send.unwrap_or(b.recv).block(0, len), dest)];
                c.plan_p2p(&sends, &[(b.recv.block(0, len), source)], tag, "sendrecv_in_place", Mode::NonBlocking)
            })
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
        let sz = size_of::<T>();
        let send_lens: Vec<(usize, usize)> = sends.iter().map(|(b, p)| (b.len(), *p)).collect();
        let recv_lens: Vec<(usize, usize)> = recvs.iter().map(|(b, p)| (b.len(), *p)).collect();
        let pieces = |list: &mut dyn Iterator<Item = (DevicePtr, usize, Option<KeepAlive>)>| {
            let (mut pieces, mut keep) = (Vec::new(), Vec::new());
            for (ptr, len, k) in list {
                pieces.push((ptr, len * sz));
                keep.extend(k);
            }
            Region::Pieces { pieces, keep }
        };
        let input = pieces(&mut sends.iter().map(|(b, _)| (b.device_ptr(), b.len(), b.keep_alive())));
        let output = pieces(&mut recvs.iter().map(|(b, _)| (b.device_ptr(), b.len(), b.keep_alive())));
        let stot: usize = send_lens.iter().map(|s| s.0).sum();
        let rtot: usize = recv_lens.iter().map(|r| r.0).sum();
        Ok(Plan {
            output: Some(output),
            ..whole(stot.max(rtot), true, true, Some((input, Into::Send)), move |c, b| {
                let split = |buf: RawBuf<T>, lens: &[(usize, usize)]| {
                    let mut at = 0;
                    lens.iter()
                        .map(|&(len, peer)| {
                            at += len;
                            (buf.block(at - len, len), peer)
                        })
                        .collect::<Vec<_>>()
                };
                let s = split(b.send.unwrap_or(b.recv), &send_lens);
                c.plan_p2p(&s, &split(b.recv, &recv_lens), tag, "multi_sendrecv", Mode::NonBlocking)
            })
        })
    }
}

/// A plan staged in one chunk: `count` elements in each area, a send area only if
/// `send`, a receive area only if `recv`, no output (set it with struct update syntax).
fn whole<T>(
    count: usize,
    send: bool,
    recv: bool,
    input: Option<(Region, Into)>,
    chunk: impl FnMut(&crate::Communicator, ChunkBufs<T>) -> Result<crate::backends::mpi::Job<T>> + Send + 'static,
) -> Plan<T> {
    Plan {
        count,
        width: 1,
        whole: true,
        send_parts: usize::from(send),
        recv_parts: usize::from(recv),
        input,
        output: None,
        device_reduce: None,
        chunk: Box::new(chunk),
    }
}
