//! Plans of the collectives that move equal blocks: bcast, allgather, alltoall, gather,
//! scatter.

use duralumin_kernels::Element;

use super::{InputArea, Plan, SliceOf, on_slices, rows};
use crate::backends::host_transfer::HostTransferCommunicator;
use crate::backends::mpi::{BcastAlgorithm, Mode};
use crate::check;
use crate::device::Device;
use crate::error::Result;

impl<D: Device> HostTransferCommunicator<D> {
    pub(crate) fn plan_bcast<T: Element, B: SliceOf<D, T>>(
        &self,
        buf: &mut B,
        root: usize,
        algorithm: BcastAlgorithm,
    ) -> Result<Plan<T>> {
        self.check_root("bcast root", root)?;
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

    pub(crate) fn plan_allgather<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
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
                (s.len(), (rows(s, 0, 1, s.len()), InputArea::Send))
            }
            None => {
                let c = check::divisible("allgather buffer (size * count)", recv.len(), n)?;
                (c, (rows(recv, me * c, 1, c), InputArea::Recv { part: me }))
            }
        };
        let allgather = on_slices(|mpi, send, recv| mpi.plan_allgather(send, recv, Mode::NonBlocking));
        Ok(Plan::collective(count, n, allgather)
            .parts(usize::from(send.is_some()), n)
            .input(input)
            .output(rows(recv, 0, n, count)))
    }

    pub(crate) fn plan_alltoall<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
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
                (rows(s, 0, n, count), InputArea::Send)
            }
            None => (rows(recv, 0, n, count), InputArea::Recv { part: 0 }),
        };
        let alltoall = on_slices(|mpi, send, recv| mpi.plan_alltoall(send, recv, Mode::NonBlocking));
        Ok(Plan::collective(count, n, alltoall)
            .parts(if send.is_some() { n } else { 0 }, n)
            .input(input)
            .output(rows(recv, 0, n, count)))
    }

    pub(crate) fn plan_gather<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
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
                (s.len(), (rows(s, 0, 1, s.len()), InputArea::Send))
            }
            (None, true) => {
                self.check_buffer("gather buffer", recv)?;
                let c = check::divisible("gather buffer (size * count)", recv.len(), n)?;
                (c, (rows(recv, me * c, 1, c), InputArea::Recv { part: me }))
            }
            (None, false) => {
                self.check_buffer("gather buffer", recv)?;
                (recv.len(), (rows(recv, 0, 1, recv.len()), InputArea::Recv { part: 0 }))
            }
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

    pub(crate) fn plan_scatter<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
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
