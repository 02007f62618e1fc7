//! Plans of the v-collectives that move blocks of per-rank lengths: allgatherv, alltoallv,
//! gatherv, scatterv. Their blocks are pieces, cut into chunks and packed (see the
//! [module docs](super)); all but allgatherv send their chunks as point-to-point messages.

use duralumin_kernels::Element;

use super::{ChunkBufs, InputArea, Plan, Region, SliceOf, Tag, blocks, longest, packed, peers, rows};
use crate::backends::host_transfer::HostTransferCommunicator;
use crate::backends::mpi::Mode;
use crate::check;
use crate::device::Device;
use crate::error::{Error, Result};

impl<D: Device> HostTransferCommunicator<D> {
    pub(crate) fn plan_allgatherv<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_blocks("allgatherv receive blocks", recv, counts, displs, true)?;
        let own = self.own_block("allgatherv send buffer", send, recv, counts, displs)?;
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
    pub(crate) fn plan_alltoallv<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
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

    pub(crate) fn plan_gatherv<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
        &self,
        send: Option<&S>,
        recv: &mut R,
        counts: &[usize],
        displs: &[usize],
        root: usize,
    ) -> Result<Plan<T>> {
        let (n, me) = (self.size(), self.rank());
        self.check_root("gatherv root", root)?;
        if me != root {
            return self.plan_gatherv_contribution(send, recv, root);
        }
        // Every block lands in the receive area packed, this rank's own included (staged from
        // `send`, or from its place in `recv` in place); the others arrive from their ranks,
        // chunk by chunk.
        self.check_blocks("gatherv receive blocks", recv, counts, displs, true)?;
        let own = self.own_block("gatherv send buffer", send, recv, counts, displs)?;
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
    fn plan_gatherv_contribution<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
        &self,
        send: Option<&S>,
        recv: &R,
        root: usize,
    ) -> Result<Plan<T>> {
        let contribution = send.map_or(recv.len(), |s| s.len());
        let input = match send {
            Some(s) => {
                self.check_buffer("gatherv send buffer", s)?;
                (rows(s, 0, 1, contribution), InputArea::Send)
            }
            None => {
                self.check_buffer("gatherv buffer", recv)?;
                (rows(recv, 0, 1, contribution), InputArea::Recv { part: 0 })
            }
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

    pub(crate) fn plan_scatterv<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
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
            Some(s) => {
                self.check_blocks("scatterv send blocks", s, counts, displs, false)?;
                check::len("scatterv receive buffer", recv.len(), counts[me])?;
                blocks(s, counts, displs)
            }
            None => {
                self.check_blocks("scatterv buffer", recv, counts, displs, false)?;
                blocks(recv, counts, displs)
            }
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

    /// This rank's own block of an allgatherv, or of a gatherv at the root: `send` (checked
    /// against `counts[rank]`, as `what`), or in place its block of `recv`.
    fn own_block<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
        &self,
        what: &'static str,
        send: Option<&S>,
        recv: &R,
        counts: &[usize],
        displs: &[usize],
    ) -> Result<Region> {
        let me = self.rank();
        match send {
            Some(s) => {
                self.check_buffer(what, s)?;
                check::len(what, s.len(), counts[me])?;
                Ok(rows(s, 0, 1, s.len()))
            }
            None => Ok(rows(recv, displs[me], 1, counts[me])),
        }
    }
}
