//! Plans of point-to-point operations: send, recv, sendrecv (in place too), multi_sendrecv.
//! A message longer than a chunk goes as one message per chunk (at the chunk size of one row,
//! on both sides of every pair), so sender and receiver, who know the same length, cut it the
//! same way.

use duralumin_kernels::Element;

use super::{ChunkBufs, InputArea, Messages, Plan, Region, SliceOf, Src, Tag, longest, packed, rows};
use crate::api::error::{Error, Result};
use crate::backends::host_transfer::HostTransferCommunicator;
use crate::common::buffer::RawBuf;
use crate::device::{Device, DevicePtr, DeviceSlice, KeepAlive};
use crate::operations::check_peers;

impl<D: Device> HostTransferCommunicator<D> {
    /// One message each way at most.
    pub(crate) fn plan_p2p<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Option<(Src<'_, D, T>, usize)>,
        recv: Option<(&mut R, usize)>,
        tag: i32,
        name: &'static str,
    ) -> Result<Plan<T>> {
        let me = self.rank();
        let (dest, source) = (send.as_ref().map(|s| s.1), recv.as_ref().map(|r| r.1));
        check_peers(tag, self.shared.max_tag, dest, source, self.ranks())?;
        self.check_buffers(
            ["send buffer", "receive buffer"],
            send.as_ref().map(|s| s.0),
            recv.as_ref().map(|r| &*r.0),
        )?;
        // A message to this rank itself needs its receive in the same call (else the stream
        // waits for itself), as in `check_multi`.
        if (dest == Some(me)) != (source == Some(me)) {
            return Err(Error::SelfMessage { op: name });
        }
        let send_len = send.as_ref().map_or(0, |s| s.0.len());
        let recv_len = recv.as_ref().map_or(0, |r| r.0.len());
        let messages = move |chunk: &ChunkBufs<T>| {
            let sends = match (dest, chunk.send) {
                (Some(d), Some(s)) if chunk.carries(send_len) => vec![(s.block(0, chunk.cut(send_len)), d)],
                _ => Vec::new(),
            };
            let recvs = match source {
                Some(src) if chunk.carries(recv_len) => vec![(chunk.recv.block(0, chunk.cut(recv_len)), src)],
                _ => Vec::new(),
            };
            Ok((sends, recvs))
        };
        Ok(Plan::pairwise(send_len.max(recv_len), 1, Tag::User(tag), messages)
            .parts(usize::from(send.is_some()), usize::from(recv.is_some()))
            .input(send.map(|(s, _)| (rows(s, 0, 1, send_len), InputArea::Send)))
            .output(recv.map(|(r, _)| rows(r, 0, 1, recv_len))))
    }

    pub(crate) fn plan_send<T: Element>(&self, buf: Src<'_, D, T>, dest: usize, tag: i32) -> Result<Plan<T>> {
        self.plan_p2p(Some((buf, dest)), None::<(&mut Src<'_, D, T>, usize)>, tag, "send")
    }

    pub(crate) fn plan_recv<T: Element, R: SliceOf<D, T>>(
        &self,
        buf: &mut R,
        source: usize,
        tag: i32,
    ) -> Result<Plan<T>> {
        self.plan_p2p(None, Some((buf, source)), tag, "recv")
    }

    pub(crate) fn plan_sendrecv<T: Element, R: SliceOf<D, T>>(
        &self,
        send: Src<'_, D, T>,
        dest: usize,
        recv: &mut R,
        source: usize,
        tag: i32,
    ) -> Result<Plan<T>> {
        self.plan_p2p(Some((send, dest)), Some((recv, source)), tag, "sendrecv")
    }

    pub(crate) fn plan_sendrecv_in_place<T: Element, B: SliceOf<D, T>>(
        &self,
        buf: &mut B,
        dest: usize,
        source: usize,
        tag: i32,
    ) -> Result<Plan<T>> {
        check_peers(tag, self.shared.max_tag, [dest], [source], self.ranks())?;
        self.check_buffer("sendrecv buffer", buf)?;
        let len = buf.len();
        let messages = move |chunk: &ChunkBufs<T>| {
            // Staged (exchanges never work on the device buffer), so the send and receive
            // areas are distinct.
            let n = chunk.cut(len);
            let (s, r) = (chunk.send.unwrap_or(chunk.recv).block(0, n), chunk.recv.block(0, n));
            Ok((vec![(s, dest)], vec![(r, source)]))
        };
        Ok(Plan::pairwise(len, 1, Tag::User(tag), messages)
            .parts(1, 1)
            .input((rows(buf, 0, 1, len), InputArea::Send))
            .output(rows(buf, 0, 1, len)))
    }

    pub(crate) fn plan_multi<T: Element, S: SliceOf<D, T>, R: SliceOf<D, T>>(
        &self,
        sends: &[(&S, usize)],
        recvs: &mut [(&mut R, usize)],
        tag: i32,
    ) -> Result<Plan<T>> {
        self.check_multi(sends, recvs, tag)?;
        let send_lens: Vec<(usize, usize)> = sends.iter().map(|(b, p)| (b.len(), *p)).collect();
        let recv_lens: Vec<(usize, usize)> = recvs.iter().map(|(b, p)| (b.len(), *p)).collect();
        let input = pieces(&mut sends.iter().map(|(b, _)| (b.device_ptr(), b.len(), b.keep_alive())));
        let output = pieces(&mut recvs.iter().map(|(b, _)| (b.device_ptr(), b.len(), b.keep_alive())));
        let lens = |l: &[(usize, usize)]| l.iter().map(|p| p.0).collect::<Vec<_>>();
        let (sl, rl) = (lens(&send_lens), lens(&recv_lens));
        // Cut like single messages (one row per chunk), so a message matches a plain send or
        // receive on the other side.
        let count = longest(&sl).max(longest(&rl));
        let messages = move |chunk: &ChunkBufs<T>| {
            let list = |area: RawBuf<T>, l: &[(usize, usize)], lens: &[usize]| -> Messages<T> {
                packed(area, &chunk.cuts(lens))
                    .into_iter()
                    .zip(l)
                    .filter(|(_, (len, _))| chunk.carries(*len))
                    .map(|(blk, &(_, peer))| (blk, peer))
                    .collect()
            };
            Ok((list(chunk.send.unwrap_or(chunk.recv), &send_lens, &sl), list(chunk.recv, &recv_lens, &rl)))
        };
        Ok(Plan::pairwise(count, 1, Tag::User(tag), messages)
            .parts(sends.len(), recvs.len())
            .input((!sends.is_empty()).then_some((input, InputArea::Send)))
            .output((!recvs.is_empty()).then_some(output)))
    }

    /// Checks a `multi_sendrecv`'s tag, peers and buffers; every message to this rank itself
    /// needs its receive in the same call (as many receives from itself as sends to itself).
    fn check_multi<S: DeviceSlice<D>, R: DeviceSlice<D>>(
        &self,
        sends: &[(&S, usize)],
        recvs: &[(&mut R, usize)],
        tag: i32,
    ) -> Result<()> {
        let me = self.rank();
        check_peers(tag, self.shared.max_tag, sends.iter().map(|s| s.1), recvs.iter().map(|r| r.1), self.ranks())?;
        sends.iter().try_for_each(|(b, _)| self.check_buffer("send buffer", *b))?;
        recvs.iter().try_for_each(|(b, _)| self.check_buffer("receive buffer", *b))?;
        let to_self = sends.iter().filter(|s| s.1 == me).count();
        if to_self != recvs.iter().filter(|r| r.1 == me).count() {
            return Err(Error::SelfMessage { op: "multi_sendrecv" });
        }
        Ok(())
    }
}

/// The buffers `(address, elements, keep-alive)` of a list as pieces.
fn pieces(list: &mut dyn Iterator<Item = (DevicePtr, usize, Option<KeepAlive>)>) -> Region {
    let (mut pieces, mut keep) = (Vec::new(), Vec::new());
    for (ptr, len, k) in list {
        pieces.push((ptr, len));
        keep.extend(k);
    }
    Region::Pieces { pieces, keep }
}
