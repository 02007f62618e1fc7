//! Plans of the reductions: allreduce, reduce, reduce_scatter, reduce_scatterv.

use duralumin_kernels::{Element, ReduceOp};

use super::{ChunkBufs, InputArea, Plan, SliceOf, Src, blocks, longest, on_slices, rows};
use crate::api::error::Result;
use crate::backends::host_transfer::HostTransferCommunicator;
use crate::backends::mpi::{AllreduceAlgorithm, Mode};
use crate::common::check;
use crate::device::{Device, ReduceFns};
use crate::operations::{Allreduce, Reduce, ReduceScatter, ReduceScatterv, buffers};

impl<D: Device> HostTransferCommunicator<D> {
    pub(crate) fn plan_allreduce<T: Element, O: ReduceOp<T>, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        op: O,
        algorithm: AllreduceAlgorithm,
    ) -> Result<Plan<T>> {
        algorithm.check_operator::<T, O>()?;
        let n = Allreduce { send: send.map(|s| s.len()), recv: recv.len(), algorithm: None }.check()?;
        self.check_buffers(buffers!("allreduce"), send, Some(&*recv))?;
        let input = match send {
            Some(s) => (rows(s, 0, 1, n), InputArea::Send),
            None => (rows(recv, 0, 1, n), InputArea::Recv { part: 0 }),
        };
        let size = self.size();
        let fns = ReduceFns::of::<T, O>(crate::ffi::u32_rank(size));
        // Pairs without device kernels (a user's pair whose kernels were not registered)
        // reduce in MPI whatever their size; so do those with an algorithm chosen.
        let small = n * size_of::<T>() <= self.config.device_reduce_max_bytes;
        if size > 1 && small && algorithm == AllreduceAlgorithm::Auto && self.shared.device.can_reduce(&fns) {
            // Allgather the contributions into staging, reduce them on the device in rank order.
            let allgather = on_slices(|mpi, send, recv| mpi.plan_allgather(send, recv, Mode::NonBlocking));
            return Ok(Plan::collective(n, size, allgather)
                .parts(1, size)
                .input((input.0, InputArea::Send))
                .output(rows(recv, 0, 1, n))
                .reduce_on_device(fns));
        }
        let allreduce = on_slices(move |mpi, send, recv| {
            let algorithm = match algorithm {
                AllreduceAlgorithm::Auto => mpi.auto_staged_allreduce::<T, O>(size_of_val(recv)),
                chosen => chosen,
            };
            mpi.plan_allreduce(send, recv, op, algorithm, Mode::NonBlocking)
        });
        Ok(Plan::collective(n, 1, allreduce)
            .parts(usize::from(send.is_some()), 1)
            .input(input)
            .output(rows(recv, 0, 1, n)))
    }

    pub(crate) fn plan_reduce<T: Element, O: ReduceOp<T>, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        root: usize,
        op: O,
    ) -> Result<Plan<T>> {
        let n = Reduce { send: send.map(|s| s.len()), recv: recv.len(), root }.check(self.ranks())?;
        let is_root = self.rank() == root;
        self.check_buffers(buffers!("reduce"), send, (is_root || send.is_none()).then_some(&*recv))?;
        let input = match send {
            Some(s) => (rows(s, 0, 1, n), InputArea::Send),
            None => (rows(recv, 0, 1, n), InputArea::Recv { part: 0 }),
        };
        let staged_recv = is_root || send.is_none();
        let reduce = on_slices(move |mpi, send, recv| mpi.plan_reduce(send, recv, root, op, Mode::NonBlocking));
        Ok(Plan::collective(n, 1, reduce)
            .parts(usize::from(send.is_some()), usize::from(staged_recv))
            .input(input)
            .output(is_root.then(|| rows(recv, 0, 1, n))))
    }

    pub(crate) fn plan_reduce_scatter<T: Element, O: ReduceOp<T>, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        op: O,
    ) -> Result<Plan<T>> {
        let n = self.size();
        let count = ReduceScatter { send: send.map(|s| s.len()), recv: recv.len() }.check(self.ranks())?;
        self.check_buffers(buffers!("reduce_scatter"), send, Some(&*recv))?;
        let input = match send {
            Some(s) => (rows(s, 0, n, count), InputArea::Send),
            None => (rows(recv, 0, n, count), InputArea::Recv { part: 0 }),
        };
        let reduce_scatter =
            on_slices(move |mpi, send, recv| mpi.plan_reduce_scatter(send, recv, op, Mode::NonBlocking));
        Ok(Plan::collective(count, n, reduce_scatter)
            .parts(if send.is_some() { n } else { 0 }, if send.is_some() { 1 } else { n })
            .input(input)
            .output(rows(recv, 0, 1, count)))
    }

    pub(crate) fn plan_reduce_scatterv<T: Element, O: ReduceOp<T>, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        counts: &[usize],
        op: O,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        ReduceScatterv { send: send.map(|s| s.len()), recv: recv.len(), counts }.check(self.ranks())?;
        self.check_buffers(buffers!("reduce_scatterv"), send, Some(&*recv))?;
        let packed_at = check::packed_displs(counts);
        let input = match send {
            Some(s) => (blocks(s, counts, &packed_at), InputArea::Send),
            None => (blocks(recv, counts, &packed_at), InputArea::Recv { part: 0 }),
        };
        let (out_of_place, count, own) = (send.is_some(), longest(counts), counts[me]);
        let counts = counts.to_vec();
        let reduce_scatterv = move |mpi: &crate::MpiCommunicator, chunk: ChunkBufs<T>| {
            // Every rank knows every count, so every rank runs the same chunks.
            let lens = chunk.cuts(&counts);
            let total: usize = lens.iter().sum();
            // SAFETY: as in `on_slices`.
            let (s, r) = unsafe { chunk.prefixes(total, if out_of_place { lens[me] } else { total }) };
            mpi.plan_reduce_scatterv(s, r, &lens, op, Mode::NonBlocking)
        };
        Ok(Plan::collective(count, n, reduce_scatterv)
            .parts(if out_of_place { n } else { 0 }, if out_of_place { 1 } else { n })
            .input(input)
            .output(rows(recv, 0, 1, own)))
    }
}
