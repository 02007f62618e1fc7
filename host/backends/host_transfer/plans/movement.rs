//! Plans of the collectives that move equal blocks: bcast, allgather, alltoall, gather,
//! scatter.

use duralumin_kernels::Element;

use super::{InputArea, Plan, SliceOf, Src, on_slices, rows};
use crate::api::error::Result;
use crate::backends::host_transfer::HostTransferCommunicator;
use crate::backends::mpi::{BcastAlgorithm, Mode};
use crate::device::Device;
use crate::operations::{Allgather, Alltoall, Bcast, Gather, Scatter, buffers};

impl<D: Device> HostTransferCommunicator<D> {
    pub(crate) fn plan_bcast<T: Element, B: SliceOf<D, T>>(
        &self,
        buf: &mut B,
        root: usize,
        algorithm: BcastAlgorithm,
    ) -> Result<Plan<T>> {
        Bcast { buf: buf.len(), root, algorithm: None }.check(self.ranks())?;
        self.check_buffer("bcast buffer", buf)?;
        let n = buf.len();
        let is_root = self.rank() == root;
        let bcast = on_slices(move |mpi, _, recv| mpi.plan_bcast(recv, root, algorithm, Mode::NonBlocking));
        Ok(Plan::collective(n, 1, bcast)
            .parts(0, 1)
            .input(is_root.then(|| (rows(buf, 0, 1, n), InputArea::Recv { part: 0 })))
            // The root's buffer does not change: nothing to copy back.
            .output((!is_root).then(|| rows(buf, 0, 1, n))))
    }

    pub(crate) fn plan_allgather<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        let count = Allgather { send: send.map(|s| s.len()), recv: recv.len() }.check(self.ranks())?;
        self.check_buffers(buffers!("allgather"), send, Some(&*recv))?;
        let input = match send {
            Some(s) => (rows(s, 0, 1, count), InputArea::Send),
            None => (rows(recv, me * count, 1, count), InputArea::Recv { part: me }),
        };
        let allgather = on_slices(|mpi, send, recv| mpi.plan_allgather(send, recv, Mode::NonBlocking));
        Ok(Plan::collective(count, n, allgather)
            .parts(usize::from(send.is_some()), n)
            .input(input)
            .output(rows(recv, 0, n, count)))
    }

    pub(crate) fn plan_alltoall<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
    ) -> Result<Plan<T>> {
        let n = self.size();
        let count = Alltoall { send: send.map(|s| s.len()), recv: recv.len() }.check(self.ranks())?;
        self.check_buffers(buffers!("alltoall"), send, Some(&*recv))?;
        let input = match send {
            Some(s) => (rows(s, 0, n, count), InputArea::Send),
            None => (rows(recv, 0, n, count), InputArea::Recv { part: 0 }),
        };
        let alltoall = on_slices(|mpi, send, recv| mpi.plan_alltoall(send, recv, Mode::NonBlocking));
        Ok(Plan::collective(count, n, alltoall)
            .parts(if send.is_some() { n } else { 0 }, n)
            .input(input)
            .output(rows(recv, 0, n, count)))
    }

    pub(crate) fn plan_gather<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        root: usize,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        let count = Gather { send: send.map(|s| s.len()), recv: recv.len(), root }.check(self.ranks())?;
        let is_root = me == root;
        self.check_buffers(buffers!("gather"), send, (is_root || send.is_none()).then_some(&*recv))?;
        let input = match (send, is_root) {
            (Some(s), _) => (rows(s, 0, 1, count), InputArea::Send),
            (None, true) => (rows(recv, me * count, 1, count), InputArea::Recv { part: me }),
            (None, false) => (rows(recv, 0, 1, count), InputArea::Recv { part: 0 }),
        };
        let recv_parts = match (is_root, send.is_some()) {
            (true, _) => n,
            (false, true) => 0,
            (false, false) => 1,
        };
        let gather = on_slices(move |mpi, send, recv| mpi.plan_gather(send, recv, root, Mode::NonBlocking));
        Ok(Plan::collective(count, n, gather)
            .parts(usize::from(send.is_some()), recv_parts)
            .input(input)
            .output(is_root.then(|| rows(recv, 0, n, count))))
    }

    pub(crate) fn plan_scatter<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        root: usize,
    ) -> Result<Plan<T>> {
        let n = self.size();
        let count = Scatter { send: send.map(|s| s.len()), recv: recv.len(), root }.check(self.ranks())?;
        let is_root = self.rank() == root;
        self.check_buffers(buffers!("scatter"), send.filter(|_| is_root), Some(&*recv))?;
        let (input, send_parts, recv_parts) = match (send, is_root) {
            (Some(s), true) => (Some((rows(s, 0, n, count), InputArea::Send)), n, 1),
            (None, true) => (Some((rows(recv, 0, n, count), InputArea::Recv { part: 0 })), 0, n),
            (_, false) => (None, 0, 1),
        };
        // In place, the root's own block stays where it is.
        let output = if is_root && send.is_none() { None } else { Some(rows(recv, 0, 1, count)) };
        let scatter = on_slices(move |mpi, send, recv| mpi.plan_scatter(send, recv, root, Mode::NonBlocking));
        Ok(Plan::collective(count, n, scatter).parts(send_parts, recv_parts).input(input).output(output))
    }
}
