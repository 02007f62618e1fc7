//! The NCCL backend's planners: each operation's argument checks (its description in
//! [`crate::operations`], the buffers' device, NCCL's byte counts), then its work queued on the
//! launch ([`super::launch`], [`super::ops`]). Called by the methods [`super::collectives`]
//! generates from the list of operations, in the same form as the other backends' planners.

use duralumin_kernels::{Element, ReduceOp};

use super::datatype::native;
use super::launch::{Launch, Piece};
use super::ops::{Block, Reduction, blocks_of};
use super::{NcclCommunicator, NcclDevice};
use crate::api::error::{Error, Result};
use crate::backends::mpi::{AllreduceAlgorithm, BcastAlgorithm};
use crate::common::check;
use crate::device::{DeviceSlice, ReduceFns};
use crate::operations::{
    Allgather, Allgatherv, Allreduce, Alltoall, Alltoallv, Bcast, Gather, Gatherv, Ranks, Reduce, ReduceScatter,
    ReduceScatterv, Scatter, Scatterv, buffers, check_peers,
};

impl<D: NcclDevice> NcclCommunicator<D> {
    pub(super) fn check_buffer<B: DeviceSlice<D> + ?Sized>(&self, what: &'static str, buf: &B) -> Result<()> {
        crate::device::check_on(&self.device, what, buf)
    }

    /// Checks that an operation's send buffer (if it has one) and receive buffer (if it uses
    /// one) live on this communicator's device; `names` ([`buffers!`]) name them.
    pub(super) fn check_buffers<T: Element>(
        &self,
        names: [&'static str; 2],
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: Option<&dyn DeviceSlice<D, Elem = T>>,
    ) -> Result<()> {
        crate::device::check_both(&self.device, names, send, recv)
    }

    /// The reduction of `(T, O)`: NCCL's, or the Rust kernels' (which must be loadable).
    pub(super) fn reduction<T: Element, O: ReduceOp<T>>(&self) -> Result<Reduction> {
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

    pub(super) fn bytes<T>(what: &'static str, n: usize) -> Result<usize> {
        check::product(what, n, size_of::<T>())
    }

    pub(super) fn plan_allreduce<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        _op: O,
        algorithm: AllreduceAlgorithm,
    ) -> Result<()> {
        own_allreduce(algorithm)?;
        let n = Allreduce { send: send.map(|s| s.len()), recv: recv.len(), algorithm: None }.check()?;
        self.check_buffers(buffers!("allreduce"), send, Some(recv))?;
        let src = send.unwrap_or(recv).device_ptr();
        Self::bytes::<T>("allreduce", n)?;
        let red = self.reduction::<T, O>()?;
        l.allreduce(src, recv.device_ptr(), n, &red)
    }

    pub(super) fn plan_reduce<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        root: usize,
        _op: O,
    ) -> Result<()> {
        let n = Reduce { send: send.map(|s| s.len()), recv: recv.len(), root }.check(self.ranks())?;
        let is_root = self.rank == root;
        self.check_buffers(buffers!("reduce"), send, (is_root || send.is_none()).then_some(recv))?;
        let src = send.unwrap_or(recv).device_ptr();
        Self::bytes::<T>("reduce", n)?;
        let red = self.reduction::<T, O>()?;
        l.reduce_to(src, recv.device_ptr(), n, root, &red)
    }

    pub(super) fn plan_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        _op: O,
    ) -> Result<()> {
        let c = ReduceScatter { send: send.map(|s| s.len()), recv: recv.len() }.check(self.ranks())?;
        self.check_buffers(buffers!("reduce_scatter"), send, Some(recv))?;
        Self::bytes::<T>("reduce_scatter", c * self.size)?;
        let red = self.reduction::<T, O>()?;
        l.reduce_scatter(send.unwrap_or(recv).device_ptr(), recv.device_ptr(), c, &red)
    }

    pub(super) fn plan_reduce_scatterv<T: Element, O: ReduceOp<T>>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        counts: &[usize],
        _op: O,
    ) -> Result<()> {
        let total = ReduceScatterv { send: send.map(|s| s.len()), recv: recv.len(), counts }.check(self.ranks())?;
        self.check_buffers(buffers!("reduce_scatterv"), send, Some(recv))?;
        let blocks = blocks_of(counts, &check::packed_displs(counts));
        Self::bytes::<T>("reduce_scatterv", total)?;
        let red = self.reduction::<T, O>()?;
        l.reduce_scatterv(send.unwrap_or(recv).device_ptr(), recv.device_ptr(), &blocks, &red)
    }

    pub(super) fn plan_bcast<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        buf: &dyn DeviceSlice<D, Elem = T>,
        root: usize,
        algorithm: BcastAlgorithm,
    ) -> Result<()> {
        own_bcast(algorithm)?;
        Bcast { buf: buf.len(), root, algorithm: None }.check(self.ranks())?;
        self.check_buffer("bcast buffer", buf)?;
        l.bcast(buf.device_ptr(), Self::bytes::<T>("bcast", buf.len())?, root)
    }

    pub(super) fn plan_allgather<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
    ) -> Result<()> {
        let c = Allgather { send: send.map(|s| s.len()), recv: recv.len() }.check(self.ranks())?;
        self.check_buffers(buffers!("allgather"), send, Some(recv))?;
        let src = send.map_or_else(|| recv.device_ptr().offset(self.rank * c * size_of::<T>()), |s| s.device_ptr());
        l.allgather(src, recv.device_ptr(), Self::bytes::<T>("allgather", c)?)
    }

    pub(super) fn plan_allgatherv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<()> {
        Allgatherv { send: send.map(|s| s.len()), recv: recv.len(), counts, displs }.check(self.ranks())?;
        self.check_buffers(buffers!("allgatherv"), send, Some(recv))?;
        Self::bytes::<T>("allgatherv", recv.len())?;
        l.allgatherv(send.map(|s| s.device_ptr()), recv.device_ptr(), &blocks_of(counts, displs), size_of::<T>())
    }

    pub(super) fn plan_alltoall<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
    ) -> Result<()> {
        let n = self.size;
        let c = Alltoall { send: send.map(|s| s.len()), recv: recv.len() }.check(self.ranks())?;
        self.check_buffers(buffers!("alltoall"), send, Some(recv))?;
        Self::bytes::<T>("alltoall", recv.len())?;
        if l.has_exchanges() {
            return l.alltoall_native(send.map(|s| s.device_ptr()), recv.device_ptr(), c * size_of::<T>());
        }
        let blocks: Vec<Block> = (0..n).map(|i| Block { start: i * c, len: c }).collect();
        let send = send.map(|s| (s.device_ptr(), &blocks[..]));
        l.alltoallv(send, recv.device_ptr(), &blocks, size_of::<T>())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn plan_alltoallv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: &dyn DeviceSlice<D, Elem = T>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &dyn DeviceSlice<D, Elem = T>,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<()> {
        let (send_len, recv_len) = (send.len(), recv.len());
        Alltoallv { send: send_len, send_counts, send_displs, recv: recv_len, recv_counts, recv_displs }
            .check(self.ranks())?;
        self.check_buffers(buffers!("alltoallv"), Some(send), Some(recv))?;
        Self::bytes::<T>("alltoallv", send.len().max(recv.len()))?;
        let sb = blocks_of(send_counts, send_displs);
        l.alltoallv(
            Some((send.device_ptr(), &sb)),
            recv.device_ptr(),
            &blocks_of(recv_counts, recv_displs),
            size_of::<T>(),
        )
    }

    pub(super) fn plan_gather<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        root: usize,
    ) -> Result<()> {
        self.plan_rooted_gather(l, send, recv, None, root)
    }

    pub(super) fn plan_gatherv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<()> {
        self.plan_rooted_gather(l, send, recv, Some((counts, displs)), root)
    }

    pub(super) fn plan_scatter<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        root: usize,
    ) -> Result<()> {
        self.plan_rooted_scatter(l, send, recv, None, root)
    }

    pub(super) fn plan_scatterv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        counts: &[usize],
        displs: &[usize],
        recv: &dyn DeviceSlice<D, Elem = T>,
        root: usize,
    ) -> Result<()> {
        self.plan_rooted_scatter(l, send, recv, Some((counts, displs)), root)
    }

    /// Gather and gatherv: `layout` is the root's `counts`/`displs` (`None`: equal blocks of
    /// the contribution's length). Off the root only the contribution counts, as in MPI.
    pub(super) fn plan_rooted_gather<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        layout: Option<(&[usize], &[usize])>,
        root: usize,
    ) -> Result<()> {
        let (n, me, sz) = (self.size, self.rank, size_of::<T>());
        let (counts, displs) = self.rooted_layout(layout, |r| {
            let (send, recv) = (send.map(|s| s.len()), recv.len());
            match layout {
                Some((counts, displs)) => Gatherv { send, recv, counts, displs, root }.check(r).map(|()| 0),
                None => Gather { send, recv, root }.check(r),
            }
        })?;
        let names = if layout.is_some() { buffers!("gatherv") } else { buffers!("gather") };
        // Equal blocks go to ncclGather where the library has it.
        let native = layout.is_none() && l.has_exchanges();
        if me != root {
            self.check_buffers(names, send, send.is_none().then_some(recv))?;
            let own = send.unwrap_or(recv);
            Self::bytes::<T>("gather", own.len())?;
            if native {
                return l.rooted_native(true, own.device_ptr(), recv.device_ptr(), own.len() * sz, root);
            }
            let mut blocks = vec![Block { start: 0, len: 0 }; n];
            blocks[me].len = own.len();
            return l.gatherv(own.device_ptr(), true, recv.device_ptr(), &blocks, root, sz);
        }
        self.check_buffers(names, send, Some(recv))?;
        let (src, in_place) = match send {
            Some(s) => (s.device_ptr(), false),
            None => (recv.device_ptr().offset(displs[me] * sz), true),
        };
        Self::bytes::<T>("gather", recv.len())?;
        if native {
            return l.rooted_native(true, src, recv.device_ptr(), counts[me] * sz, root);
        }
        l.gatherv(src, in_place, recv.device_ptr(), &blocks_of(&counts, &displs), root, sz)
    }

    /// Scatter and scatterv, as [`Self::plan_rooted_gather`] the other way.
    pub(super) fn plan_rooted_scatter<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: Option<&dyn DeviceSlice<D, Elem = T>>,
        recv: &dyn DeviceSlice<D, Elem = T>,
        layout: Option<(&[usize], &[usize])>,
        root: usize,
    ) -> Result<()> {
        let (n, me, sz) = (self.size, self.rank, size_of::<T>());
        let (counts, displs) = self.rooted_layout(layout, |r| {
            let (send, recv) = (send.map(|s| s.len()), recv.len());
            match layout {
                Some((counts, displs)) => Scatterv { send, counts, displs, recv, root }.check(r).map(|()| 0),
                None => Scatter { send, recv, root }.check(r),
            }
        })?;
        let names = if layout.is_some() { buffers!("scatterv") } else { buffers!("scatter") };
        self.check_buffers(names, send.filter(|_| me == root), Some(recv))?;
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
        let (src, dst, in_place) = match send {
            Some(s) => {
                Self::bytes::<T>("scatter", s.len())?;
                (s.device_ptr(), recv.device_ptr(), false)
            }
            None => (recv.device_ptr(), recv.device_ptr().offset(displs[me] * sz), true),
        };
        if native {
            return l.rooted_native(false, src, dst, counts[me] * sz, root);
        }
        l.scatterv(src, &blocks_of(&counts, &displs), dst, in_place, root, sz)
    }

    /// The checked blocks of a gather or scatter (`layout`: the v-form's counts and
    /// displacements; `None`: `size` equal blocks of the length `check` returns).
    pub(super) fn rooted_layout(
        &self,
        layout: Option<(&[usize], &[usize])>,
        check: impl FnOnce(Ranks) -> Result<usize>,
    ) -> Result<(Vec<usize>, Vec<usize>)> {
        let c = check(self.ranks())?;
        Ok(match layout {
            Some((counts, displs)) => (counts.to_vec(), displs.to_vec()),
            None => (vec![c; self.size], (0..self.size).map(|i| i * c).collect()),
        })
    }

    /// Point-to-point lists: checks peers, tag and self-messages, then queues them grouped.
    pub(super) fn plan_p2p<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        sends: &[(&dyn DeviceSlice<D, Elem = T>, usize)],
        recvs: &[(&dyn DeviceSlice<D, Elem = T>, usize)],
        tag: i32,
        name: &'static str,
    ) -> Result<()> {
        check_peers(tag, i32::MAX, sends.iter().map(|s| s.1), recvs.iter().map(|r| r.1), self.ranks())?;
        sends.iter().try_for_each(|(b, _)| self.check_buffer("send buffer", *b))?;
        recvs.iter().try_for_each(|(b, _)| self.check_buffer("receive buffer", *b))?;
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

    pub(super) fn plan_send<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        buf: &dyn DeviceSlice<D, Elem = T>,
        dest: usize,
        tag: i32,
    ) -> Result<()> {
        self.plan_p2p(l, &[(buf, dest)], &[], tag, "send")
    }

    pub(super) fn plan_recv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        buf: &dyn DeviceSlice<D, Elem = T>,
        source: usize,
        tag: i32,
    ) -> Result<()> {
        self.plan_p2p(l, &[], &[(buf, source)], tag, "recv")
    }

    pub(super) fn plan_sendrecv<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        send: &dyn DeviceSlice<D, Elem = T>,
        dest: usize,
        recv: &dyn DeviceSlice<D, Elem = T>,
        source: usize,
        tag: i32,
    ) -> Result<()> {
        self.plan_p2p(l, &[(send, dest)], &[(recv, source)], tag, "sendrecv")
    }

    pub(super) fn plan_multi<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        sends: &[(&dyn DeviceSlice<D, Elem = T>, usize)],
        recvs: &[(&dyn DeviceSlice<D, Elem = T>, usize)],
        tag: i32,
    ) -> Result<()> {
        self.plan_p2p(l, sends, recvs, tag, "multi_sendrecv")
    }

    pub(super) fn plan_sendrecv_in_place<T: Element>(
        &self,
        l: &mut Launch<'_, D>,
        buf: &dyn DeviceSlice<D, Elem = T>,
        dest: usize,
        source: usize,
        tag: i32,
    ) -> Result<()> {
        check_peers(tag, i32::MAX, [dest], [source], self.ranks())?;
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
pub(super) fn dynamic<D: NcclDevice, S: DeviceSlice<D>>(s: &S) -> &dyn DeviceSlice<D, Elem = S::Elem> {
    s
}
