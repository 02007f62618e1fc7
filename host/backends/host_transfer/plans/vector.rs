//! Plans of the v-collectives that move blocks of per-rank lengths: allgatherv, alltoallv,
//! gatherv, scatterv. Their blocks are pieces, cut into chunks and packed (see the
//! [module docs](super)); all but allgatherv send their chunks as point-to-point messages.

use duralumin_kernels::Element;

use super::{ChunkBufs, InputArea, Plan, Region, SliceOf, Src, Tag, blocks, longest, packed, peers, rows};
use crate::api::error::{Error, Result};
use crate::backends::host_transfer::HostTransferCommunicator;
use crate::backends::mpi::Mode;
use crate::common::check;
use crate::device::Device;
use crate::operations::{Allgatherv, Alltoallv, Gatherv, Scatterv, buffers};

impl<D: Device> HostTransferCommunicator<D> {
    pub(crate) fn plan_allgatherv<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        Allgatherv { send: send.map(|s| s.len()), recv: recv.len(), counts, displs }.check(self.ranks())?;
        self.check_buffers(buffers!("allgatherv"), send, Some(&*recv))?;
        let own = own_block(send, recv, counts[me], displs[me]);
        let input = (own, if send.is_some() { InputArea::Send } else { InputArea::Recv { part: me } });
        let output = blocks(recv, counts, displs);
        let (count, counts) = (longest(counts), counts.to_vec());
        let allgatherv = move |mpi: &crate::MpiCommunicator, chunk: ChunkBufs<T>| {
            // Every rank knows every count, so every rank runs the same chunks.
            let lens = chunk.cuts(&counts);
            // SAFETY: as in `on_slices`.
            let (s, r) = unsafe { chunk.prefixes(lens[me], lens.iter().sum()) };
            mpi.plan_allgatherv(s, r, &lens, &check::packed_displs(&lens), Mode::NonBlocking)
        };
        Ok(Plan::collective(count, n, allgatherv).parts(usize::from(send.is_some()), n).input(input).output(output))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan_alltoallv<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Src<'_, D, T>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut R,
        recv_counts: &[usize],
        recv_displs: &[usize],
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        let (send_len, recv_len) = (send.len(), recv.len());
        Alltoallv { send: send_len, send_counts, send_displs, recv: recv_len, recv_counts, recv_displs }
            .check(self.ranks())?;
        self.check_buffers(buffers!("alltoallv"), Some(send), Some(&*recv))?;
        let (input, output) = (blocks(send, send_counts, send_displs), blocks(recv, recv_counts, recv_displs));
        let count = longest(send_counts).max(longest(recv_counts));
        let (sc, rc) = (send_counts.to_vec(), recv_counts.to_vec());
        let messages = move |chunk: &ChunkBufs<T>| {
            let source = chunk.send.ok_or(Error::Progress("alltoallv chunk without a send area"))?;
            let (sb, rb) = (packed(source, &chunk.cuts(&sc)), packed(chunk.recv, &chunk.cuts(&rc)));
            // SAFETY: the send and receive areas of the slot are disjoint and belong to this
            // chunk's MPI part.
            unsafe { rb[me].copy_from(sb[me]) };
            let sends = peers(n, me, |j| chunk.carries(sc[j]).then(|| sb[j]));
            let recvs = peers(n, me, |i| chunk.carries(rc[i]).then(|| rb[i]));
            Ok((sends, recvs))
        };
        Ok(Plan::pairwise(count, n, Tag::Operation(None), messages)
            .parts(n, n)
            .input((input, InputArea::Send))
            .output(output))
    }

    pub(crate) fn plan_gatherv<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        Gatherv { send: send.map(|s| s.len()), recv: recv.len(), counts, displs, root }.check(self.ranks())?;
        if me != root {
            return self.plan_gatherv_contribution(send, recv, root);
        }
        // Every block lands in the receive area packed, this rank's own included (staged from
        // `send`, or from its place in `recv` in place); the others arrive from their ranks,
        // chunk by chunk.
        self.check_buffers(buffers!("gatherv"), send, Some(&*recv))?;
        let own = own_block(send, recv, counts[me], displs[me]);
        let output = blocks(recv, counts, displs);
        let (count, counts) = (longest(counts), counts.to_vec());
        let messages = move |chunk: &ChunkBufs<T>| {
            let rb = packed(chunk.recv, &chunk.cuts(&counts));
            Ok((Vec::new(), peers(n, me, |i| chunk.carries(counts[i]).then(|| rb[i]))))
        };
        Ok(Plan::pairwise(count, n, Tag::Operation(None), messages)
            .parts(0, n)
            .input((own, InputArea::Recv { part: me }))
            .output(output))
    }

    /// Gatherv off the root: this rank's contribution (`send`, or `recv` in place) goes to the
    /// root, chunk by chunk.
    fn plan_gatherv_contribution<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        recv: &R,
        root: usize,
    ) -> Result<Plan<T>> {
        let contribution = send.map_or(recv.len(), |s| s.len());
        self.check_buffers(buffers!("gatherv"), send, send.is_none().then_some(recv))?;
        let input = match send {
            Some(s) => (rows(s, 0, 1, contribution), InputArea::Send),
            None => (rows(recv, 0, 1, contribution), InputArea::Recv { part: 0 }),
        };
        let messages = move |chunk: &ChunkBufs<T>| {
            let area = chunk.send.unwrap_or(chunk.recv);
            let sends = if chunk.carries(contribution) {
                vec![(area.block(0, chunk.cut(contribution)), root)]
            } else {
                Vec::new()
            };
            Ok((sends, Vec::new()))
        };
        Ok(Plan::pairwise(contribution, self.size(), Tag::Operation(None), messages)
            .parts(usize::from(send.is_some()), usize::from(send.is_none()))
            .input(input))
    }

    pub(crate) fn plan_scatterv<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<Src<'_, D, T>>,
        counts: &[usize],
        displs: &[usize],
        recv: &mut R,
        root: usize,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        Scatterv { send: send.map(|s| s.len()), counts, displs, recv: recv.len(), root }.check(self.ranks())?;
        self.check_buffers(buffers!("scatterv"), send.filter(|_| me == root), Some(&*recv))?;
        if me != root {
            // This rank's block comes from the root, chunk by chunk.
            let len = recv.len();
            let messages = move |chunk: &ChunkBufs<T>| {
                let recvs =
                    if chunk.carries(len) { vec![(chunk.recv.block(0, chunk.cut(len)), root)] } else { Vec::new() };
                Ok((Vec::new(), recvs))
            };
            return Ok(Plan::pairwise(len, n, Tag::Operation(None), messages)
                .parts(0, 1)
                .output(rows(recv, 0, 1, len)));
        }
        // Every block is staged packed in the send area; this rank's own is copied to the
        // receive area (out of place) or stays where it is (in place).
        let all = match send {
            Some(s) => blocks(s, counts, displs),
            None => blocks(recv, counts, displs),
        };
        let out_of_place = send.is_some();
        let output = out_of_place.then(|| rows(recv, 0, 1, counts[me]));
        let (count, counts) = (longest(counts), counts.to_vec());
        let messages = move |chunk: &ChunkBufs<T>| {
            let source = chunk.send.ok_or(Error::Progress("scatterv chunk without a send area"))?;
            let sb = packed(source, &chunk.cuts(&counts));
            if out_of_place {
                // SAFETY: as in `plan_alltoallv`.
                unsafe { chunk.recv.block(0, sb[me].len()).copy_from(sb[me]) };
            }
            Ok((peers(n, me, |i| chunk.carries(counts[i]).then(|| sb[i])), Vec::new()))
        };
        Ok(Plan::pairwise(count, n, Tag::Operation(None), messages)
            .parts(n, usize::from(out_of_place))
            .input((all, InputArea::Send))
            .output(output))
    }
}

/// This rank's own block of an allgatherv, or of a gatherv at the root (`len` elements, at
/// `displ` in `recv`): `send`, or in place its block of `recv`.
fn own_block<D: Device, T: Element, R: SliceOf<D, T>>(
    send: Option<Src<'_, D, T>>,
    recv: &R,
    len: usize,
    displ: usize,
) -> Region {
    match send {
        Some(s) => rows(s, 0, 1, len),
        None => rows(recv, displ, 1, len),
    }
}
