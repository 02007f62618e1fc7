//! Point-to-point operations of the Mpi backend: send, recv, sendrecv and multi-sendrecv.
//!
//! They run on a communicator of their own (a duplicate), so user tags never collide with
//! Duralumin's algorithms. Messages larger than MPI's `int` count are split transparently;
//! a receive checks that exactly the expected number of elements arrived
//! ([`Error::CountMismatch`] if fewer did; MPI reports a truncation error if more did).

use std::ffi::c_int;
use std::sync::Arc;

use duralumin_kernels::Element;

use super::MpiCommunicator;
use super::collectives::{blocking_and_nonblocking, shadow};
use super::job::{Job, Mode};
use crate::buffer::RawBuf;
use crate::check;
use crate::datatype::datatype;
use crate::error::{Error, Result};
use crate::reliability::recorder::{OpKind, Signature};
use crate::request::{Request, Scope};
use crate::transport::{MpiTransport, Transport};

/// A job that posts `sends` and `recvs` (block, peer) on `x` and completes when all have.
///
/// # Safety
/// As [`Transport::post`]: the blocks stay valid (and the receive blocks untouched by anyone
/// else) until the job completes or is dropped; receive blocks overlap nothing else.
pub(crate) unsafe fn exchange<T: Element>(
    x: MpiTransport,
    sends: Vec<(RawBuf<T>, usize)>,
    recvs: Vec<(RawBuf<T>, usize)>,
) -> Job<T> {
    // SAFETY: guaranteed by the caller, for as long as the future lives.
    Job::Future(Box::pin(async move { unsafe { x.post(&sends, &recvs) }?.await }))
}

impl MpiCommunicator {
    pub(crate) fn p2p_transport<T: Element>(&self, tag: i32, mode: Mode) -> Result<MpiTransport> {
        check::tag(tag, self.core.tag_ub)?;
        let dt = datatype::<T>()?;
        let max = self.tuning.max_message_elements;
        let comm = (self.core.p2p, &self.core.p2p_matcher);
        Ok(MpiTransport::new(comm, dt, tag as c_int, (self.rank(), self.size()), max, mode == Mode::Blocking))
    }

    blocking_and_nonblocking! {
        /// Sends `buf` to rank `dest` with `tag` (`MPI_Send`). A blocking send to this rank
        /// itself is refused ([`Error::SelfMessage`]): nothing could receive it.
        fn send / isend <T: Element> (buf: &'buf [T], dest: usize, tag: i32)
            sig(|_| Signature::new(OpKind::Send).elem::<T>().count(buf.len()).root(dest).tag(tag)) bufs(read buf)
            => plan_p2p(&[(RawBuf::from_ref(buf), dest)], &[], tag, "send");
        /// Receives exactly `buf.len()` elements from rank `source` with `tag` (`MPI_Recv`).
        fn recv / irecv <T: Element> (buf: &'buf mut [T], source: usize, tag: i32)
            sig(|_| Signature::new(OpKind::Recv).elem::<T>().count(buf.len()).root(source).tag(tag)) bufs(write buf)
            => plan_p2p(&[], &[(RawBuf::from_mut(buf), source)], tag, "recv");
        /// Sends `send` to `dest` and receives `recv` from `source` at once (`MPI_Sendrecv`);
        /// either peer may be this rank itself.
        fn sendrecv / isendrecv <T: Element>
            (send: &'buf [T], dest: usize, recv: &'buf mut [T], source: usize, tag: i32)
            sig(|_| Signature::new(OpKind::SendRecv).elem::<T>().count(send.len()).root(dest).tag(tag))
            bufs(read send, write recv)
            => plan_p2p(&[(RawBuf::from_ref(send), dest)], &[(RawBuf::from_mut(recv), source)], tag, "sendrecv");
        /// Sends `buf` to `dest` and replaces it by the same number of elements from `source`
        /// (`MPI_Sendrecv_replace`).
        fn sendrecv_in_place / isendrecv_in_place <T: Element> (buf: &'buf mut [T], dest: usize, source: usize, tag: i32)
            sig(|_| Signature::new(OpKind::SendRecv).elem::<T>().count(buf.len()).root(dest).tag(tag).in_place())
            bufs(write buf)
            => plan_sendrecv_replace(buf, dest, source, tag);
        /// Sends each `(buffer, dest)` of `sends` and receives each `(buffer, source)` of
        /// `recvs`, all at once (Aluminum's MultiSendRecv). Peers may repeat and may be this
        /// rank itself; messages to the same peer are matched in order.
        fn multi_sendrecv / imulti_sendrecv <T: Element>
            (sends: &[(&'buf [T], usize)], recvs: &mut [(&'buf mut [T], usize)], tag: i32)
            sig(|_| Signature::new(OpKind::MultiSendRecv).elem::<T>().count(sends.iter().map(|s| s.0.len()).sum()).tag(tag))
            bufs(reads sends, writes recvs)
            => plan_multi(sends, recvs, tag);
    }

    pub(crate) fn plan_multi<T: Element>(
        &self,
        sends: &[(&[T], usize)],
        recvs: &mut [(&mut [T], usize)],
        tag: i32,
        mode: Mode,
    ) -> Result<Job<T>> {
        let s: Vec<_> = sends.iter().map(|(b, p)| (RawBuf::from_ref(b), *p)).collect();
        let r: Vec<_> = recvs.iter_mut().map(|(b, p)| (RawBuf::from_mut(b), *p)).collect();
        self.plan_p2p(&s, &r, tag, "multi_sendrecv", mode)
    }

    pub(crate) fn plan_p2p<T: Element>(
        &self,
        sends: &[(RawBuf<T>, usize)],
        recvs: &[(RawBuf<T>, usize)],
        tag: i32,
        name: &'static str,
        mode: Mode,
    ) -> Result<Job<T>> {
        let size = self.size();
        for &(_, peer) in sends {
            check::rank("destination rank", peer, size)?;
        }
        for &(_, peer) in recvs {
            check::rank("source rank", peer, size)?;
        }
        let only_self = |v: &[(RawBuf<T>, usize)]| !v.is_empty() && v.iter().all(|&(_, p)| p == self.rank());
        if mode == Mode::Blocking && (sends.is_empty() || recvs.is_empty()) && (only_self(sends) || only_self(recvs)) {
            return Err(Error::SelfMessage { op: name });
        }
        let x = self.p2p_transport::<T>(tag, mode)?;
        // SAFETY: the public method borrows every buffer for the whole operation; receive
        // buffers are distinct `&mut` slices, so they cannot overlap each other or the sends.
        Ok(unsafe { exchange(x, sends.to_vec(), recvs.to_vec()) })
    }

    pub(crate) fn plan_sendrecv_replace<T: Element>(
        &self,
        buf: &mut [T],
        dest: usize,
        source: usize,
        tag: i32,
        mode: Mode,
    ) -> Result<Job<T>> {
        check::rank("destination rank", dest, self.size())?;
        check::rank("source rank", source, self.size())?;
        let x = self.p2p_transport::<T>(tag, mode)?;
        let core = Arc::clone(&self.core);
        let out = RawBuf::from_mut(buf);
        Ok(Job::Future(Box::pin(async move {
            let mut copy = core.scratch.take::<T>(out.len())?;
            let copy = copy.raw();
            // SAFETY: the scratch copy and the caller's buffer are disjoint; the buffer is
            // borrowed by the public method until completion.
            unsafe {
                copy.copy_from(out);
                x.post(&[(copy, dest)], &[(out, source)])?.await
            }
        })))
    }
}
