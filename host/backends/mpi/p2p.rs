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
use super::job::{Job, Mode};
use crate::api::error::{Error, Result};
use crate::common::buffer::RawBuf;
use crate::common::datatype::datatype;
use crate::operations::check_peers;
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
    /// The transport of a point-to-point operation whose `tag` was checked
    /// ([`check_peers`]).
    pub(crate) fn p2p_transport<T: Element>(&self, tag: i32, mode: Mode) -> Result<MpiTransport> {
        let dt = datatype::<T>()?;
        let max = self.tuning.max_message_elements;
        let comm = (self.core.p2p, &self.core.p2p_matcher);
        Ok(MpiTransport::new(comm, dt, tag as c_int, (self.rank(), self.size()), max, mode == Mode::Blocking))
    }

    pub(crate) fn plan_send<T: Element>(&self, buf: &[T], dest: usize, tag: i32, mode: Mode) -> Result<Job<T>> {
        self.plan_p2p(&[(RawBuf::from_ref(buf), dest)], &[], tag, "send", mode)
    }

    pub(crate) fn plan_recv<T: Element>(&self, buf: &mut [T], source: usize, tag: i32, mode: Mode) -> Result<Job<T>> {
        self.plan_p2p(&[], &[(RawBuf::from_mut(buf), source)], tag, "recv", mode)
    }

    pub(crate) fn plan_sendrecv<T: Element>(
        &self,
        send: &[T],
        dest: usize,
        recv: &mut [T],
        source: usize,
        tag: i32,
        mode: Mode,
    ) -> Result<Job<T>> {
        self.plan_p2p(&[(RawBuf::from_ref(send), dest)], &[(RawBuf::from_mut(recv), source)], tag, "sendrecv", mode)
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
        check_peers(tag, self.core.tag_ub, sends.iter().map(|s| s.1), recvs.iter().map(|r| r.1), self.ranks())?;
        let only_self = |v: &[(RawBuf<T>, usize)]| !v.is_empty() && v.iter().all(|&(_, p)| p == self.rank());
        if mode == Mode::Blocking && (sends.is_empty() || recvs.is_empty()) && (only_self(sends) || only_self(recvs)) {
            return Err(Error::SelfMessage { op: name });
        }
        let x = self.p2p_transport::<T>(tag, mode)?;
        // SAFETY: the public method borrows every buffer for the whole operation; receive
        // buffers are distinct `&mut` slices, so they cannot overlap each other or the sends.
        Ok(unsafe { exchange(x, sends.to_vec(), recvs.to_vec()) })
    }

    pub(crate) fn plan_sendrecv_in_place<T: Element>(
        &self,
        buf: &mut [T],
        dest: usize,
        source: usize,
        tag: i32,
        mode: Mode,
    ) -> Result<Job<T>> {
        check_peers(tag, self.core.tag_ub, [dest], [source], self.ranks())?;
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
