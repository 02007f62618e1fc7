//! The NCCL backend's operations: each checks its arguments on the calling thread (the same
//! checks and errors as HostTransfer's), then queues its work ([`super::ops`]) on the
//! communicator's stream, or, non-blocking, on the internal stream after the work queued on
//! the communicator's stream so far.

use duralumin_kernels::{Element, ReduceOp};

use super::datatype::native;
use super::launch::{Launch, Piece};
use super::ops::{Block, Reduction, blocks_of};
use super::{NcclCommunicator, NcclDevice, NcclRequest, Tracked};
use crate::backends::mpi::{AllreduceAlgorithm, BcastAlgorithm};
use crate::check;
use crate::device::{DeviceSlice, DeviceSliceMut, KeepAlive, ReduceFns};
use crate::error::{Error, Result};

/// Emits the stream-ordered and the non-blocking method of an operation. `uses(...)` names the
/// buffers it reads (`read`) and writes (`write`), ordered with their home streams.
macro_rules! stream_ordered_and_nonblocking {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $iname:ident <$($g:ident : $bound:path),*> ($($arg:ident : $ty:ty),* $(,)?)
            uses($($kind:ident $buf:ident),*) => |$me:ident, $l:ident| $body:expr;
    )*) => {$(
        $(#[$doc])*
        ///
        /// Stream-ordered: queued on the communicator's stream after the work already there;
        /// returns at once. Argument errors are returned before anything is queued.
        #[allow(clippy::too_many_arguments)]
        pub fn $name<'a, $($g: $bound),*>(&self, $($arg: $ty),*) -> Result<()> {
            let keep: Vec<KeepAlive> = [$(uses::keep(&*$buf)),*].into_iter().flatten().collect();
            let $me = self;
            self.run(&self.stream, stringify!($name), &keep, |$l| $body)?;
            $(uses::$kind::<D, _>($buf);)*
            Ok(())
        }

        #[doc = concat!("Non-blocking [`", stringify!($name), "`](Self::", stringify!($name), "): runs on the \
            communicator's internal stream after the work queued on its stream so far, and \
            returns an [`NcclRequest`] that borrows the buffers until the operation completes.")]
        #[allow(clippy::too_many_arguments)]
        pub fn $iname<'a, $($g: $bound),*>(&'a self, $($arg: $ty),*) -> Result<NcclRequest<'a, D>> {
            let keep: Vec<KeepAlive> = [$(uses::keep(&*$buf)),*].into_iter().flatten().collect();
            let side = self.side_stream()?;
            self.device.join(side, &self.stream)?;
            let $me = self;
            let done = self.run(side, stringify!($name), &keep, |$l| $body)?;
            $(uses::$kind::<D, _>($buf);)*
            Ok(NcclRequest::new(self, done))
        }
    )*};
}

/// The buffers' own dependency tracking (cudarc's read and write events), after the operation
/// was queued and the home streams ordered after it.
mod uses {
    use crate::device::{Device, DeviceSlice, DeviceSliceMut, KeepAlive};

    pub(super) fn keep<D: Device, S: DeviceSlice<D> + ?Sized>(buf: &S) -> Option<KeepAlive> {
        buf.keep_alive()
    }

    pub(super) fn read<D: Device, S: DeviceSlice<D>>(buf: &S) {
        buf.track_read();
    }

    pub(super) fn write<D: Device, R: DeviceSliceMut<D>>(buf: &mut R) {
        buf.track_write();
    }
}

impl<D: NcclDevice> NcclCommunicator<D> {
    /// Checks and queues one operation on `stream`: `body` checks its arguments first (nothing
    /// queued on error), then queues its work; the buffers' home streams are ordered around it.
    /// Returns the operation's completion event (which the watchdog watches too) and name.
    fn run(
        &self,
        stream: &D::Stream,
        op: &'static str,
        keep: &[KeepAlive],
        body: impl FnOnce(&mut Launch<'_, D>) -> Result<()>,
    ) -> Result<Tracked<D>> {
        let mut launch = Launch::new(self, stream)?;
        self.device.acquire(stream, keep)?;
        self.note(op);
        let queued = body(&mut launch);
        drop(launch);
        if let Err(e @ Error::Nccl { .. }) = &queued {
            // NCCL failed under a queued operation: its peers may wait for it forever.
            self.abort_with(format!("{op} failed on rank {}: {e}", self.rank));
        }
        self.device.release(stream, keep)?;
        queued?;
        self.track(stream)
    }

    fn check_buffer<B: DeviceSlice<D> + ?Sized>(&self, what: &'static str, buf: &B) -> Result<()> {
        if buf.ordinal() != self.device.ordinal() {
            return Err(Error::WrongDevice {
                what,
                expected: self.device.name(),
                found: format!("device {}", buf.ordinal()),
            });
        }
        Ok(())
    }

    /// The reduction of `(T, O)`: NCCL's, or the Rust kernels' (which must be loadable).
    fn reduction<T: Element, O: ReduceOp<T>>(&self) -> Result<Reduction> {
        let fns = ReduceFns::of::<T, O>(crate::ffi::u32_rank(self.size));
        let native = native::<T, O>();
        let needs_kernels = native.is_none_or(|n| n.finish);
        if needs_kernels && !self.device.can_reduce(&fns) {
            return Err(Error::KernelsUnavailable(format!(
                "no device kernels for ({}, {}): build them with KernelBuilder and register them \
                 (the NCCL backend never moves a reduction to the host)",
                T::NAME,
                O::NAME
            )));
        }
        Ok(Reduction { native, fns, size: size_of::<T>() })
    }

    fn bytes<T>(what: &'static str, n: usize) -> Result<usize> {
        check::product(what, n, size_of::<T>())
    }

    fn plan_allreduce<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
    ) -> Result<()> {
        self.check_buffer("allreduce receive buffer", recv)?;
        let n = recv.len();
        let src = match send {
            Some(s) => {
                self.check_buffer("allreduce send buffer", s)?;
                check::len("allreduce receive buffer", n, s.len())?;
                s.device_ptr()
            }
            None => recv.device_ptr(),
        };
        Self::bytes::<T>("allreduce", n)?;
        let red = self.reduction::<T, O>()?;
        l.allreduce(src, recv.device_ptr(), n, &red)
    }

    fn plan_reduce<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        root: usize,
    ) -> Result<()> {
        check::rank("reduce root", root, self.size)?;
        let is_root = self.rank == root;
        let (src, n) = match send {
            Some(s) => {
                self.check_buffer("reduce send buffer", s)?;
                if is_root {
                    self.check_buffer("reduce receive buffer", recv)?;
                    check::len("reduce receive buffer", recv.len(), s.len())?;
                }
                (s.device_ptr(), s.len())
            }
            None => {
                self.check_buffer("reduce buffer", recv)?;
                (recv.device_ptr(), recv.len())
            }
        };
        Self::bytes::<T>("reduce", n)?;
        let red = self.reduction::<T, O>()?;
        l.reduce_to(src, recv.device_ptr(), n, root, &red)
    }

    fn plan_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
    ) -> Result<()> {
        let n = self.size;
        self.check_buffer("reduce_scatter receive buffer", recv)?;
        let (src, dst, c) = match send {
            Some(s) => {
                self.check_buffer("reduce_scatter send buffer", s)?;
                check::len("reduce_scatter send buffer", s.len(), check::product("reduce_scatter", recv.len(), n)?)?;
                (s.device_ptr(), recv.device_ptr(), recv.len())
            }
            None => {
                let c = check::divisible("reduce_scatter buffer (size * count)", recv.len(), n)?;
                (recv.device_ptr(), recv.device_ptr(), c)
            }
        };
        Self::bytes::<T>("reduce_scatter", c * n)?;
        let red = self.reduction::<T, O>()?;
        l.reduce_scatter(src, dst, c, &red)
    }

    fn plan_reduce_scatterv<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        counts: &[usize],
    ) -> Result<()> {
        check::per_rank("reduce_scatterv counts", counts, self.size)?;
        let total = check::total("reduce_scatterv counts", counts)?;
        let blocks = blocks_of(counts, &check::packed_displs(counts));
        self.check_buffer("reduce_scatterv receive buffer", recv)?;
        let (src, dst) = match send {
            Some(s) => {
                self.check_buffer("reduce_scatterv send buffer", s)?;
                check::len("reduce_scatterv send buffer", s.len(), total)?;
                check::len("reduce_scatterv receive buffer", recv.len(), counts[self.rank])?;
                (s.device_ptr(), recv.device_ptr())
            }
            None => {
                check::len("reduce_scatterv buffer", recv.len(), total)?;
                (recv.device_ptr(), recv.device_ptr())
            }
        };
        Self::bytes::<T>("reduce_scatterv", total)?;
        let red = self.reduction::<T, O>()?;
        l.reduce_scatterv(src, dst, &blocks, &red)
    }

    fn plan_bcast<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        buf: &dyn DeviceSlice<D, Elem = T>,
        root: usize,
    ) -> Result<()> {
        check::rank("bcast root", root, self.size)?;
        self.check_buffer("bcast buffer", buf)?;
        l.bcast(buf.device_ptr(), Self::bytes::<T>("bcast", buf.len())?, root)
    }

    fn plan_allgather<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
    ) -> Result<()> {
        let n = self.size;
        self.check_buffer("allgather receive buffer", recv)?;
        let (src, c) = match send {
            Some(s) => {
                self.check_buffer("allgather send buffer", s)?;
                check::len("allgather receive buffer", recv.len(), check::product("allgather", s.len(), n)?)?;
                (s.device_ptr(), s.len())
            }
            None => {
                let c = check::divisible("allgather buffer (size * count)", recv.len(), n)?;
                (recv.device_ptr().offset(self.rank * c * size_of::<T>()), c)
            }
        };
        l.allgather(src, recv.device_ptr(), Self::bytes::<T>("allgather", c)?)
    }

    fn plan_allgatherv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        check::per_rank("allgatherv counts", counts, self.size)?;
        self.check_buffer("allgatherv receive buffer", recv)?;
        check::blocks("allgatherv receive blocks", counts, displs, recv.len(), true)?;
        if let Some(s) = send {
            self.check_buffer("allgatherv send buffer", s)?;
            check::len("allgatherv send buffer", s.len(), counts[self.rank])?;
        }
        Self::bytes::<T>("allgatherv", recv.len())?;
        l.allgatherv(send.map(|s| s.device_ptr()), recv.device_ptr(), &blocks_of(counts, displs), size_of::<T>())
    }

    fn plan_alltoall<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
    ) -> Result<()> {
        let n = self.size;
        self.check_buffer("alltoall receive buffer", recv)?;
        let c = check::divisible("alltoall receive buffer (size * count)", recv.len(), n)?;
        if let Some(s) = send {
            self.check_buffer("alltoall send buffer", s)?;
            check::len("alltoall receive buffer", recv.len(), s.len())?;
        }
        Self::bytes::<T>("alltoall", recv.len())?;
        if l.has_exchanges() {
            return l.alltoall_native(send.map(|s| s.device_ptr()), recv.device_ptr(), c * size_of::<T>());
        }
        let blocks: Vec<Block> = (0..n).map(|i| Block { start: i * c, len: c }).collect();
        let send = send.map(|s| (s.device_ptr(), &blocks[..]));
        l.alltoallv(send, recv.device_ptr(), &blocks, size_of::<T>())
    }

    #[allow(clippy::too_many_arguments)]
    fn plan_alltoallv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: &dyn DeviceSlice<D, Elem = T>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &dyn DeviceSlice<D, Elem = T>,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let me = self.rank;
        check::per_rank("alltoallv send counts", send_counts, self.size)?;
        check::per_rank("alltoallv receive counts", recv_counts, self.size)?;
        self.check_buffer("alltoallv send buffer", send)?;
        self.check_buffer("alltoallv receive buffer", recv)?;
        check::blocks("alltoallv send blocks", send_counts, send_displs, send.len(), false)?;
        check::blocks("alltoallv receive blocks", recv_counts, recv_displs, recv.len(), true)?;
        check::len("alltoallv receive count from this rank itself", recv_counts[me], send_counts[me])?;
        Self::bytes::<T>("alltoallv", send.len().max(recv.len()))?;
        let sb = blocks_of(send_counts, send_displs);
        l.alltoallv(
            Some((send.device_ptr(), &sb)),
            recv.device_ptr(),
            &blocks_of(recv_counts, recv_displs),
            size_of::<T>(),
        )
    }

    /// Gather and gatherv: `layout` is the root's `counts`/`displs` (`None`: equal blocks of
    /// the contribution's length). Off the root only the contribution counts, as in MPI.
    fn plan_gatherv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        layout: Option<(&[usize], &[usize])>,
        root: usize,
        what: &'static str,
    ) -> Result<()> {
        check::rank(if layout.is_some() { "gatherv root" } else { "gather root" }, root, self.size)?;
        let (n, me, sz) = (self.size, self.rank, size_of::<T>());
        // Equal blocks go to ncclGather where the library has it.
        let native = layout.is_none() && l.has_exchanges();
        if me != root {
            let own = send.unwrap_or(recv);
            self.check_buffer(what, own)?;
            Self::bytes::<T>("gather", own.len())?;
            if native {
                return l.rooted_native(true, own.device_ptr(), recv.device_ptr(), own.len() * sz, root);
            }
            let mut blocks = vec![Block { start: 0, len: 0 }; n];
            blocks[me].len = own.len();
            return l.gatherv(own.device_ptr(), true, recv.device_ptr(), &blocks, root, sz);
        }
        let (counts, displs): (Vec<usize>, Vec<usize>) = match layout {
            Some((c, d)) => {
                check::per_rank("gatherv counts", c, n)?;
                (c.to_vec(), d.to_vec())
            }
            None => {
                let c = match send {
                    Some(s) => {
                        // As MPI: the root receives exactly `size` contributions.
                        check::len("gather receive buffer", recv.len(), check::product("gather", s.len(), n)?)?;
                        s.len()
                    }
                    None => check::divisible("gather buffer (size * count)", recv.len(), n)?,
                };
                (vec![c; n], (0..n).map(|i| i * c).collect())
            }
        };
        self.check_buffer("gather receive buffer", recv)?;
        check::blocks("gather receive blocks", &counts, &displs, recv.len(), true)?;
        let (src, in_place) = match send {
            Some(s) => {
                self.check_buffer(what, s)?;
                check::len(what, s.len(), counts[me])?;
                (s.device_ptr(), false)
            }
            None => (recv.device_ptr().offset(displs[me] * sz), true),
        };
        Self::bytes::<T>("gather", recv.len())?;
        if native {
            return l.rooted_native(true, src, recv.device_ptr(), counts[me] * sz, root);
        }
        l.gatherv(src, in_place, recv.device_ptr(), &blocks_of(&counts, &displs), root, sz)
    }

    /// Scatter and scatterv, as [`Self::plan_gatherv`] the other way.
    fn plan_scatterv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        layout: Option<(&[usize], &[usize])>,
        root: usize,
    ) -> Result<()> {
        check::rank(if layout.is_some() { "scatterv root" } else { "scatter root" }, root, self.size)?;
        let (n, me, sz) = (self.size, self.rank, size_of::<T>());
        self.check_buffer("scatter receive buffer", recv)?;
        Self::bytes::<T>("scatter", recv.len())?;
        // Equal blocks come from ncclScatter where the library has it.
        let native = layout.is_none() && l.has_exchanges();
        if me != root {
            if native {
                return l.rooted_native(false, recv.device_ptr(), recv.device_ptr(), recv.len() * sz, root);
            }
            let mut blocks = vec![Block { start: 0, len: 0 }; n];
            blocks[me].len = recv.len();
            return l.scatterv(recv.device_ptr(), &blocks, recv.device_ptr(), true, root, sz);
        }
        let (counts, displs): (Vec<usize>, Vec<usize>) = match layout {
            Some((c, d)) => {
                check::per_rank("scatterv counts", c, n)?;
                (c.to_vec(), d.to_vec())
            }
            None => {
                let c = match send {
                    // As MPI: the root sends exactly `size` blocks.
                    Some(s) => {
                        check::len("scatter send buffer", s.len(), check::product("scatter", recv.len(), n)?)?;
                        recv.len()
                    }
                    None => check::divisible("scatter buffer (size * count)", recv.len(), n)?,
                };
                (vec![c; n], (0..n).map(|i| i * c).collect())
            }
        };
        let (src, dst, in_place) = match send {
            Some(s) => {
                self.check_buffer("scatter send buffer", s)?;
                check::blocks("scatter send blocks", &counts, &displs, s.len(), false)?;
                check::len("scatter receive buffer", recv.len(), counts[me])?;
                Self::bytes::<T>("scatter", s.len())?;
                (s.device_ptr(), recv.device_ptr(), false)
            }
            None => {
                check::blocks("scatter buffer", &counts, &displs, recv.len(), false)?;
                (recv.device_ptr(), recv.device_ptr().offset(displs[me] * sz), true)
            }
        };
        if native {
            return l.rooted_native(false, src, dst, counts[me] * sz, root);
        }
        l.scatterv(src, &blocks_of(&counts, &displs), dst, in_place, root, sz)
    }

    /// Point-to-point lists: checks peers, tag and self-messages, then queues them grouped.
    fn plan_p2p<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        sends: &[(&dyn DeviceSlice<D, Elem = T>, usize)],
        recvs: &[(&dyn DeviceSlice<D, Elem = T>, usize)],
        tag: i32,
        name: &'static str,
    ) -> Result<()> {
        check::tag(tag, i32::MAX)?;
        for (b, dest) in sends {
            check::rank("destination rank", *dest, self.size)?;
            self.check_buffer("send buffer", *b)?;
        }
        for (b, source) in recvs {
            check::rank("source rank", *source, self.size)?;
            self.check_buffer("receive buffer", *b)?;
        }
        let self_sends = sends.iter().filter(|(_, p)| *p == self.rank).count();
        let self_recvs = recvs.iter().filter(|(_, p)| *p == self.rank).count();
        // A message to this rank itself needs its receive in the same group (else it waits
        // for itself).
        if self_sends != self_recvs {
            return Err(Error::SelfMessage { op: name });
        }
        let piece = |b: &dyn DeviceSlice<D, Elem = T>| -> Result<Piece> {
            Ok(Piece { ptr: b.device_ptr(), bytes: Self::bytes::<T>(name, b.len())? })
        };
        let s: Vec<(Piece, usize)> = sends.iter().map(|(b, p)| piece(*b).map(|x| (x, *p))).collect::<Result<_>>()?;
        let r: Vec<(Piece, usize)> = recvs.iter().map(|(b, p)| piece(*b).map(|x| (x, *p))).collect::<Result<_>>()?;
        l.messages(&s, &r)
    }

    fn plan_sendrecv_in_place<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        buf: &dyn DeviceSlice<D, Elem = T>,
        dest: usize,
        source: usize,
        tag: i32,
    ) -> Result<()> {
        check::tag(tag, i32::MAX)?;
        check::rank("destination rank", dest, self.size)?;
        check::rank("source rank", source, self.size)?;
        self.check_buffer("sendrecv buffer", buf)?;
        let bytes = Self::bytes::<T>("sendrecv", buf.len())?;
        let tmp = l.scratch(bytes)?;
        l.messages(&[(Piece { ptr: buf.device_ptr(), bytes }, dest)], &[(Piece { ptr: tmp, bytes }, source)])?;
        l.copy(buf.device_ptr(), tmp, bytes)
    }
}

/// Only NCCL's own algorithm runs on this backend: `Auto` or `Native`.
fn nccl_picks(algorithm: &'static str, ok: bool) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(Error::AlgorithmUnsupported {
            algorithm,
            reason: "the NCCL backend runs NCCL's own algorithms (Auto or Native)",
        })
    }
}

fn own_allreduce(a: AllreduceAlgorithm) -> Result<()> {
    nccl_picks(a.name(), matches!(a, AllreduceAlgorithm::Auto | AllreduceAlgorithm::Native))
}

fn own_bcast(a: BcastAlgorithm) -> Result<()> {
    nccl_picks(a.name(), matches!(a, BcastAlgorithm::Auto | BcastAlgorithm::Native))
}

/// A buffer as a trait object, so one planner serves every buffer type.
fn dynamic<D: NcclDevice, S: DeviceSlice<D>>(s: &S) -> &dyn DeviceSlice<D, Elem = S::Elem> {
    s
}

impl<D: NcclDevice> NcclCommunicator<D> {
    stream_ordered_and_nonblocking! {
        /// Allreduce: `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank (equal
        /// lengths everywhere). `ncclAllReduce` for NCCL's pairs; otherwise every rank reduces
        /// its block of all contributions in rank order with the Rust kernels, then the blocks
        /// are broadcast.
        #[doc(alias = "all_reduce")]
        fn allreduce / iallreduce <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O)
            uses(read send, write recv) => |c, l| { let _ = op; c.plan_allreduce::<T, O>(l, Some(dynamic(send)), dynamic(&*recv)) };
        /// Allreduce with an explicit algorithm: NCCL chooses its own, so only `Auto` and
        /// `Native` run ([`Error::AlgorithmUnsupported`] otherwise, before anything is queued).
        fn allreduce_with / iallreduce_with <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O, algorithm: AllreduceAlgorithm)
            uses(read send, write recv) => |c, l| { let _ = op; own_allreduce(algorithm)?; c.plan_allreduce::<T, O>(l, Some(dynamic(send)), dynamic(&*recv)) };
        /// In-place allreduce with an explicit algorithm, as [`allreduce_with`](Self::allreduce_with).
        fn allreduce_in_place_with / iallreduce_in_place_with <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O, algorithm: AllreduceAlgorithm)
            uses(write buf) => |c, l| { let _ = op; own_allreduce(algorithm)?; c.plan_allreduce::<T, O>(l, None, dynamic(&*buf)) };
        /// In-place allreduce: `buf` is the input and receives the result.
        fn allreduce_in_place / iallreduce_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O)
            uses(write buf) => |c, l| { let _ = op; c.plan_allreduce::<T, O>(l, None, dynamic(&*buf)) };
        /// Reduce to `root`: at the root `recv` (the length of `send`) receives the reduction;
        /// elsewhere `recv` is not used.
        fn reduce / ireduce <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize, op: O)
            uses(read send, write recv) => |c, l| { let _ = op; c.plan_reduce::<T, O>(l, Some(dynamic(send)), dynamic(&*recv), root) };
        /// In-place reduce: `buf` is every rank's input; the root's receives the result.
        fn reduce_in_place / ireduce_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, root: usize, op: O)
            uses(write buf) => |c, l| { let _ = op; c.plan_reduce::<T, O>(l, None, dynamic(&*buf), root) };
        /// Reduce-scatter: `send` holds `size` blocks of `recv.len()` elements; block `i` of
        /// the reduction lands in rank `i`'s `recv`.
        #[doc(alias = "reduce_scatter_tensor")]
        fn reduce_scatter / ireduce_scatter <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, op: O)
            uses(read send, write recv) => |c, l| { let _ = op; c.plan_reduce_scatter::<T, O>(l, Some(dynamic(send)), dynamic(&*recv)) };
        /// In-place reduce-scatter: this rank's block of `buf` receives its block of the reduction.
        fn reduce_scatter_in_place / ireduce_scatter_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, op: O)
            uses(write buf) => |c, l| { let _ = op; c.plan_reduce_scatter::<T, O>(l, None, dynamic(&*buf)) };
        /// Reduce-scatter with per-rank counts: natively one group of `ncclReduce`, one per rank.
        fn reduce_scatterv / ireduce_scatterv <T: Element, O: ReduceOp<T>, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], op: O)
            uses(read send, write recv) => |c, l| { let _ = op; c.plan_reduce_scatterv::<T, O>(l, Some(dynamic(send)), dynamic(&*recv), counts) };
        /// In-place reduce-scatterv: block `i` of `buf` is rank `i`'s result.
        fn reduce_scatterv_in_place / ireduce_scatterv_in_place <T: Element, O: ReduceOp<T>, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], op: O)
            uses(write buf) => |c, l| { let _ = op; c.plan_reduce_scatterv::<T, O>(l, None, dynamic(&*buf), counts) };
        /// Broadcast of the root's `buf` into every rank's `buf` (`ncclBroadcast` of its bytes).
        #[doc(alias = "broadcast")]
        fn bcast / ibcast <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize)
            uses(write buf) => |c, l| c.plan_bcast::<T>(l, dynamic(&*buf), root);
        /// Broadcast with an explicit algorithm: only `Auto` and `Native` (NCCL's own).
        fn bcast_with / ibcast_with <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize, algorithm: BcastAlgorithm)
            uses(write buf) => |c, l| { own_bcast(algorithm)?; c.plan_bcast::<T>(l, dynamic(&*buf), root) };
        /// Allgather (`ncclAllGather` of bytes): rank `i`'s `send` lands at `recv[i*c..]`.
        #[doc(alias = "all_gather")]
        fn allgather / iallgather <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R)
            uses(read send, write recv) => |c, l| c.plan_allgather::<T>(l, Some(dynamic(send)), dynamic(&*recv));
        /// In-place allgather: this rank's block is already at `buf[rank*c..]`.
        fn allgather_in_place / iallgather_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B)
            uses(write buf) => |c, l| c.plan_allgather::<T>(l, None, dynamic(&*buf));
        /// Allgatherv: one group of `ncclBroadcast`, one per rank with a non-empty block.
        fn allgatherv / iallgatherv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], displs: &[usize])
            uses(read send, write recv) => |c, l| c.plan_allgatherv::<T>(l, Some(dynamic(send)), dynamic(&*recv), counts, displs);
        /// In-place allgatherv: this rank's block of `buf` is its input.
        fn allgatherv_in_place / iallgatherv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize])
            uses(write buf) => |c, l| c.plan_allgatherv::<T>(l, None, dynamic(&*buf), counts, displs);
        /// All-to-all over grouped sends and receives.
        #[doc(alias = "all_to_all")]
        fn alltoall / ialltoall <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R)
            uses(read send, write recv) => |c, l| c.plan_alltoall::<T>(l, Some(dynamic(send)), dynamic(&*recv));
        /// In-place all-to-all on `buf` (through device scratch).
        fn alltoall_in_place / ialltoall_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B)
            uses(write buf) => |c, l| c.plan_alltoall::<T>(l, None, dynamic(&*buf));
        /// All-to-all with per-rank counts and displacements.
        fn alltoallv / ialltoallv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, send_counts: &[usize], send_displs: &[usize], recv: &'a mut R, recv_counts: &[usize], recv_displs: &[usize])
            uses(read send, write recv) => |c, l| c.plan_alltoallv::<T>(l, dynamic(send), send_counts, send_displs, dynamic(&*recv), recv_counts, recv_displs);
        /// Gather to `root` over grouped sends and receives.
        fn gather / igather <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize)
            uses(read send, write recv) => |c, l| c.plan_gatherv::<T>(l, Some(dynamic(send)), dynamic(&*recv), None, root, "gather send buffer");
        /// In-place gather: at the root `buf` has `size * c` elements with its own block in
        /// place; elsewhere `buf` is the contribution.
        fn gather_in_place / igather_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize)
            uses(write buf) => |c, l| c.plan_gatherv::<T>(l, None, dynamic(&*buf), None, root, "gather buffer");
        /// Gatherv to `root`.
        fn gatherv / igatherv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, counts: &[usize], displs: &[usize], root: usize)
            uses(read send, write recv) => |c, l| c.plan_gatherv::<T>(l, Some(dynamic(send)), dynamic(&*recv), Some((counts, displs)), root, "gatherv send buffer");
        /// In-place gatherv.
        fn gatherv_in_place / igatherv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            uses(write buf) => |c, l| c.plan_gatherv::<T>(l, None, dynamic(&*buf), Some((counts, displs)), root, "gatherv buffer");
        /// Scatter from `root` over grouped sends and receives.
        fn scatter / iscatter <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, recv: &'a mut R, root: usize)
            uses(read send, write recv) => |c, l| c.plan_scatterv::<T>(l, Some(dynamic(send)), dynamic(&*recv), None, root);
        /// In-place scatter.
        fn scatter_in_place / iscatter_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>> (buf: &'a mut B, root: usize)
            uses(write buf) => |c, l| c.plan_scatterv::<T>(l, None, dynamic(&*buf), None, root);
        /// Scatterv from `root`.
        fn scatterv / iscatterv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, counts: &[usize], displs: &[usize], recv: &'a mut R, root: usize)
            uses(read send, write recv) => |c, l| c.plan_scatterv::<T>(l, Some(dynamic(send)), dynamic(&*recv), Some((counts, displs)), root);
        /// In-place scatterv.
        fn scatterv_in_place / iscatterv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, counts: &[usize], displs: &[usize], root: usize)
            uses(write buf) => |c, l| c.plan_scatterv::<T>(l, None, dynamic(&*buf), Some((counts, displs)), root);
        /// Sends `buf` to `dest` (`ncclSend`). NCCL matches messages between a pair in call
        /// order; `tag` is checked, not matched.
        fn send / isend <T: Element, S: DeviceSlice<D, Elem = T>> (buf: &'a S, dest: usize, tag: i32)
            uses(read buf) => |c, l| c.plan_p2p::<T>(l, &[(dynamic(buf), dest)], &[], tag, "send");
        /// Receives exactly `buf.len()` elements from `source` (`ncclRecv`).
        fn recv / irecv <T: Element, R: DeviceSliceMut<D, Elem = T>> (buf: &'a mut R, source: usize, tag: i32)
            uses(write buf) => |c, l| c.plan_p2p::<T>(l, &[], &[(dynamic(&*buf), source)], tag, "recv");
        /// Sends `send` to `dest` and receives `recv` from `source`, in one group.
        fn sendrecv / isendrecv <T: Element, S: DeviceSlice<D, Elem = T>, R: DeviceSliceMut<D, Elem = T>>
            (send: &'a S, dest: usize, recv: &'a mut R, source: usize, tag: i32)
            uses(read send, write recv) => |c, l| c.plan_p2p::<T>(l, &[(dynamic(send), dest)], &[(dynamic(&*recv), source)], tag, "sendrecv");
        /// Sends `buf` to `dest` and replaces it by as many elements from `source` (through
        /// device scratch).
        fn sendrecv_in_place / isendrecv_in_place <T: Element, B: DeviceSliceMut<D, Elem = T>>
            (buf: &'a mut B, dest: usize, source: usize, tag: i32)
            uses(write buf) => |c, l| c.plan_sendrecv_in_place::<T>(l, dynamic(&*buf), dest, source, tag);
    }

    /// Barrier, stream-ordered: work queued after it runs once every rank has reached it (an
    /// allreduce of one word).
    pub fn barrier(&self) -> Result<()> {
        self.run(&self.stream, "barrier", &[], |l| l.barrier()).map(drop)
    }

    /// Sends each `(buffer, dest)` of `sends` and receives each `(buffer, source)` of `recvs`,
    /// all at once, stream-ordered (Aluminum's MultiSendRecv). Messages between a pair match
    /// in list order.
    pub fn multi_sendrecv<S: DeviceSlice<D>, R: DeviceSliceMut<D, Elem = S::Elem>>(
        &self,
        sends: &[(&S, usize)],
        recvs: &mut [(&mut R, usize)],
        tag: i32,
    ) -> Result<()> {
        let keep: Vec<KeepAlive> = sends
            .iter()
            .filter_map(|(b, _)| b.keep_alive())
            .chain(recvs.iter().filter_map(|(b, _)| b.keep_alive()))
            .collect();
        let s: Vec<(&dyn DeviceSlice<D, Elem = S::Elem>, usize)> =
            sends.iter().map(|(b, p)| (dynamic(*b), *p)).collect();
        let r: Vec<(&dyn DeviceSlice<D, Elem = S::Elem>, usize)> =
            recvs.iter().map(|(b, p)| (dynamic(&**b), *p)).collect();
        self.run(&self.stream, "multi_sendrecv", &keep, |l| self.plan_p2p(l, &s, &r, tag, "multi_sendrecv"))?;
        for (b, _) in sends {
            b.track_read();
        }
        for (b, _) in recvs.iter_mut() {
            b.track_write();
        }
        Ok(())
    }
}
