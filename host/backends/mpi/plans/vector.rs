//! Plans of the v-collectives, whose blocks have per-rank lengths: allgatherv, alltoallv,
//! gatherv and scatterv. They run Duralumin's linear or pairwise algorithms beyond one MPI
//! call (see the [module docs](super)).

use duralumin_kernels::Element;

use super::super::MpiCommunicator;
use super::super::job::{Job, Mode, Post};
use super::*;
use crate::api::error::Result;
use crate::common::buffer::RawBuf;
use crate::common::datatype::datatype;
use crate::ffi::in_place;
use crate::ffi::native::Native;
use crate::operations::{Allgatherv, Alltoallv, Gatherv, Scatterv};

impl MpiCommunicator {
    pub(crate) fn plan_allgatherv<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let call = Allgatherv { send: send.map(<[T]>::len), recv: recv.len(), counts, displs };
        let total = call.check(self.ranks())?;
        let out = RawBuf::from_mut(recv);
        // Counts agree on every rank, displacements are this rank's own business: decide by
        // counts alone so every rank takes the same path. MPI's displacements are `int`s: a rank
        // whose displacements do not fit receives the blocks packed and copies them out.
        if self.fits(total) {
            let me = self.rank();
            let dt = datatype::<T>()?;
            if displs.iter().all(|&d| self.fits(d)) {
                let send_ptr = send.map_or(in_place().cast_const(), cptr);
                let call = Native::Allgatherv {
                    send: send_ptr,
                    count: cnt(counts[me])?,
                    recv: out.ptr().cast(),
                    counts: cnts(counts)?,
                    displs: cnts(displs)?,
                };
                return Ok(Job::native(dt, call, bytes_of::<T>(total)));
            }
            let packed_displs: Vec<usize> =
                counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
            let mut packed = vec![T::zeroed(); total];
            // Not in place: this rank's block is read from where the caller put it.
            let own = out.block(displs[me], counts[me]);
            let send_ptr = send.map_or(own.ptr().cast_const().cast(), cptr);
            let call = Native::Allgatherv {
                send: send_ptr,
                count: cnt(counts[me])?,
                recv: packed.as_mut_ptr().cast(),
                counts: cnts(counts)?,
                displs: cnts(&packed_displs)?,
            };
            let blocks = packed_displs.iter().zip(counts).zip(displs).map(|((&p, &c), &d)| (p, c, d)).collect();
            return Ok(Job::native(dt, call, bytes_of::<T>(total)).then(Some(Post::Unpack {
                packed,
                buf: out,
                blocks,
            })));
        }
        let blocks: Vec<_> = counts.iter().zip(displs).map(|(&c, &d)| out.block(d, c)).collect();
        self.ring_allgather(send.map(RawBuf::from_ref), blocks, mode)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan_alltoallv<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let (send_len, recv_len) = (send.len(), recv.len());
        Alltoallv { send: send_len, send_counts, send_displs, recv: recv_len, recv_counts, recv_displs }
            .check(self.ranks())?;
        self.pairwise_alltoall(
            Some(RawBuf::from_ref(send)),
            send_counts,
            send_displs,
            RawBuf::from_mut(recv),
            recv_counts,
            recv_displs,
            mode,
        )
    }

    pub(crate) fn plan_gatherv<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        Gatherv { send: send.map(<[T]>::len), recv: recv.len(), counts, displs, root }.check(self.ranks())?;
        let out = RawBuf::from_mut(recv);
        let blocks = match self.rank() == root {
            true => counts.iter().zip(displs).map(|(&c, &d)| out.block(d, c)).collect(),
            false => Vec::new(),
        };
        let mine = send.map_or(out, RawBuf::from_ref);
        self.linear(send.map(RawBuf::from_ref), mine, blocks, root, true, mode)
    }

    pub(crate) fn plan_scatterv<T: Element>(
        &self,
        send: Option<&[T]>,
        counts: &[usize],
        displs: &[usize],
        recv: &mut [T],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        Scatterv { send: send.map(<[T]>::len), counts, displs, recv: recv.len(), root }.check(self.ranks())?;
        let out = RawBuf::from_mut(recv);
        let source = send.map_or(out, RawBuf::from_ref);
        let blocks = match self.rank() == root {
            true => counts.iter().zip(displs).map(|(&c, &d)| source.block(d, c)).collect(),
            false => Vec::new(),
        };
        let separate = send.is_some().then_some(out);
        self.linear(separate, out, blocks, root, false, mode)
    }
}
