//! The operations over NCCL calls and the Rust kernels, on raw device addresses whose
//! arguments the planners in [`super::plans`] have checked. One implementation per
//! algorithm; `docs/nccl.md` lists which operation is which NCCL call.

use std::ffi::c_void;

use super::NcclDevice;
use super::datatype::Native;
use super::launch::{Launch, Piece, root};
use crate::api::error::Result;
use crate::device::{DevicePtr, ReduceFns};
use crate::ffi::nccl::Call;
use crate::ffi::nccl::sys::{dtype, redop};

/// A reduction as the operations run it: NCCL's own where it has one, else the Rust kernels.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reduction {
    pub(crate) native: Option<Native>,
    pub(crate) fns: ReduceFns,
    /// Bytes per element.
    pub(crate) size: usize,
}

/// A block of `len` elements at element offset `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Block {
    pub(crate) start: usize,
    pub(crate) len: usize,
}

/// `n` elements cut into `parts` blocks as even as can be (the first `n % parts` one longer).
pub(crate) fn even_blocks(n: usize, parts: usize) -> Vec<Block> {
    let (base, extra) = (n / parts, n % parts);
    (0..parts).map(|i| Block { start: i * base + i.min(extra), len: base + usize::from(i < extra) }).collect()
}

/// Blocks from counts and displacements.
pub(crate) fn blocks_of(counts: &[usize], displs: &[usize]) -> Vec<Block> {
    counts.iter().zip(displs).map(|(&len, &start)| Block { start, len }).collect()
}

fn at(p: DevicePtr, elems: usize, size: usize) -> DevicePtr {
    p.offset(elems * size)
}

fn cp(p: DevicePtr) -> *const c_void {
    p.addr() as *const c_void
}

fn mp(p: DevicePtr) -> *mut c_void {
    p.addr() as *mut c_void
}

impl<D: NcclDevice> Launch<'_, D> {
    /// Allreduce of `n` elements from `send` (`== recv` in place) into `recv`.
    pub(crate) fn allreduce(&mut self, send: DevicePtr, recv: DevicePtr, n: usize, red: &Reduction) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if let Some(nat) = red.native {
            self.grouped(&[Call::AllReduce {
                send: cp(send),
                recv: mp(recv),
                count: n,
                dtype: nat.dtype,
                op: nat.op,
            }])?;
            return self.finish_if(nat, recv, n, red);
        }
        // Each rank reduces its block of everyone's contributions in rank order, then every
        // block is broadcast from its owner.
        let blocks = even_blocks(n, self.size());
        let mine = at(recv, blocks[self.rank()].start, red.size);
        self.reduce_blocks(send, &blocks, mine, red)?;
        self.broadcast_blocks(recv, &blocks, red.size)
    }

    /// Reduce-scatter: this rank's block (of `blocks`, offsets into `send`) of the reduction
    /// lands at `out`. `send` may contain `out` (in place): inputs are read before `out` is
    /// written.
    pub(crate) fn reduce_blocks(
        &mut self,
        send: DevicePtr,
        blocks: &[Block],
        out: DevicePtr,
        red: &Reduction,
    ) -> Result<()> {
        let (r, sz) = (self.rank(), red.size);
        let mine = blocks[r];
        let row = mine.len * sz;
        let rows = if row > 0 { Some(self.scratch(blocks.len() * row)?) } else { None };
        let row_at = |q: usize| rows.map(|p| p.offset(q * row));
        if let Some(own) = row_at(r) {
            self.copy(own, at(send, mine.start, sz), row)?;
        }
        self.exchange(
            |to| Some(Piece { ptr: at(send, blocks[to].start, sz), bytes: blocks[to].len * sz }),
            |from| row_at(from).map(|ptr| Piece { ptr, bytes: row }),
        )?;
        match rows {
            Some(rows) => self.combine_rows(out, rows, blocks.len(), mine.len, red),
            None => Ok(()),
        }
    }

    /// `out = finish(row_0 ∘ row_1 ∘ … ∘ row_{parts-1})`: `parts` rows of `len` elements packed
    /// at `rows` (one per rank), combined in rank order.
    fn combine_rows(&self, out: DevicePtr, rows: DevicePtr, parts: usize, len: usize, red: &Reduction) -> Result<()> {
        let row = len * red.size;
        self.copy(out, rows, row)?;
        for q in 1..parts {
            self.reduce(out, rows.offset(q * row), len, &red.fns)?;
        }
        self.finish(out, len, &red.fns)
    }

    /// Every rank's block of `buf` broadcast from its owner to every rank: one group of
    /// `ncclBroadcast`, one per non-empty block.
    pub(crate) fn broadcast_blocks(&mut self, buf: DevicePtr, blocks: &[Block], size: usize) -> Result<()> {
        let mut calls = Vec::with_capacity(blocks.len());
        for (i, b) in blocks.iter().enumerate().filter(|(_, b)| b.len > 0) {
            let p = at(buf, b.start, size);
            calls.push(Call::Broadcast {
                send: cp(p),
                recv: mp(p),
                count: b.len * size,
                dtype: dtype::UINT8,
                root: root(i)?,
            });
        }
        self.grouped(&calls)
    }

    fn finish_if(&mut self, nat: Native, buf: DevicePtr, n: usize, red: &Reduction) -> Result<()> {
        if nat.finish { self.finish(buf, n, &red.fns) } else { Ok(()) }
    }

    /// Reduce to `root_rank` (`recv` used there only).
    pub(crate) fn reduce_to(
        &mut self,
        send: DevicePtr,
        recv: DevicePtr,
        n: usize,
        root_rank: usize,
        red: &Reduction,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let is_root = self.rank() == root_rank;
        if let Some(nat) = red.native {
            let out = if is_root { recv } else { send };
            let call = Call::Reduce {
                send: cp(send),
                recv: mp(out),
                count: n,
                dtype: nat.dtype,
                op: nat.op,
                root: root(root_rank)?,
            };
            self.grouped(&[call])?;
            return if is_root { self.finish_if(nat, recv, n, red) } else { Ok(()) };
        }
        // The root receives every contribution and combines them in rank order.
        let (sz, size) = (red.size, self.size());
        let row = n * sz;
        let rows = if is_root { Some(self.scratch(size * row)?) } else { None };
        if let Some(rows) = rows {
            self.copy(rows.offset(root_rank * row), send, row)?;
        }
        self.exchange(
            |to| (to == root_rank).then_some(Piece { ptr: send, bytes: row }),
            |from| rows.map(|p| Piece { ptr: p.offset(from * row), bytes: row }),
        )?;
        match rows {
            Some(rows) => self.combine_rows(recv, rows, size, n, red),
            None => Ok(()),
        }
    }

    /// Reduce-scatter with equal blocks of `c` elements into `recv`; in place (`recv ==
    /// send`) the result lands at the start of the buffer, as MPI's `MPI_IN_PLACE` does.
    pub(crate) fn reduce_scatter(&mut self, send: DevicePtr, recv: DevicePtr, c: usize, red: &Reduction) -> Result<()> {
        let blocks: Vec<Block> = (0..self.size()).map(|i| Block { start: i * c, len: c }).collect();
        self.reduce_scatterv(send, recv, &blocks, red)
    }

    /// Reduce-scatter with per-rank blocks of `send` into `recv` (in place, `recv == send`:
    /// the start of the buffer). Natively one `ncclReduceScatter` for equal blocks, else one
    /// group of `ncclReduce`, one per non-empty block; NCCL reduces in place into this rank's
    /// own block, which is then moved to the front.
    pub(crate) fn reduce_scatterv(
        &mut self,
        send: DevicePtr,
        recv: DevicePtr,
        blocks: &[Block],
        red: &Reduction,
    ) -> Result<()> {
        let (r, sz) = (self.rank(), red.size);
        let mine = blocks[r];
        let Some(nat) = red.native else { return self.reduce_blocks(send, blocks, recv, red) };
        let in_place = send == recv;
        let out = if in_place { at(send, mine.start, sz) } else { recv };
        let equal = blocks.iter().enumerate().all(|(i, b)| b.len == mine.len && b.start == i * mine.len);
        if equal && mine.len > 0 {
            let call =
                Call::ReduceScatter { send: cp(send), recv: mp(out), count: mine.len, dtype: nat.dtype, op: nat.op };
            self.grouped(&[call])?;
        } else {
            let mut calls = Vec::with_capacity(blocks.len());
            for (i, b) in blocks.iter().enumerate().filter(|(_, b)| b.len > 0) {
                let src = at(send, b.start, sz);
                let dst = if i == r { out } else { src };
                calls.push(Call::Reduce {
                    send: cp(src),
                    recv: mp(dst),
                    count: b.len,
                    dtype: nat.dtype,
                    op: nat.op,
                    root: root(i)?,
                });
            }
            self.grouped(&calls)?;
        }
        self.finish_if(nat, out, mine.len, red)?;
        if in_place {
            self.copy(recv, out, mine.len * sz)?;
        }
        Ok(())
    }

    /// Broadcast of `bytes` from `root_rank`.
    pub(crate) fn bcast(&mut self, buf: DevicePtr, bytes: usize, root_rank: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.grouped(&[Call::Broadcast {
            send: cp(buf),
            recv: mp(buf),
            count: bytes,
            dtype: dtype::UINT8,
            root: root(root_rank)?,
        }])
    }

    /// Allgather of `bytes` per rank (`send == recv + rank * bytes` in place).
    pub(crate) fn allgather(&mut self, send: DevicePtr, recv: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        self.grouped(&[Call::AllGather { send: cp(send), recv: mp(recv), count: bytes, dtype: dtype::UINT8 }])
    }

    /// Allgatherv: this rank's `send` (`None` in place) to its block of `recv` on every rank,
    /// one broadcast per non-empty block.
    pub(crate) fn allgatherv(
        &mut self,
        send: Option<DevicePtr>,
        recv: DevicePtr,
        blocks: &[Block],
        size: usize,
    ) -> Result<()> {
        let r = self.rank();
        if let Some(s) = send {
            self.copy(at(recv, blocks[r].start, size), s, blocks[r].len * size)?;
        }
        self.broadcast_blocks(recv, blocks, size)
    }

    /// All-to-all with blocks: `send` block `j` to rank `j`, `recv` block `i` from rank `i`
    /// (`send == None`: in place, through scratch).
    pub(crate) fn alltoallv(
        &mut self,
        send: Option<(DevicePtr, &[Block])>,
        recv: DevicePtr,
        recv_blocks: &[Block],
        size: usize,
    ) -> Result<()> {
        let r = self.rank();
        let (src, send_blocks) = match send {
            Some(s) => s,
            None => {
                let end = recv_blocks.iter().map(|b| b.start + b.len).max().unwrap_or(0);
                (self.staged(recv, end * size)?, recv_blocks)
            }
        };
        let bytes = |b: &Block| b.len * size;
        self.copy(at(recv, recv_blocks[r].start, size), at(src, send_blocks[r].start, size), bytes(&recv_blocks[r]))?;
        self.exchange(
            |to| Some(Piece { ptr: at(src, send_blocks[to].start, size), bytes: bytes(&send_blocks[to]) }),
            |from| Some(Piece { ptr: at(recv, recv_blocks[from].start, size), bytes: bytes(&recv_blocks[from]) }),
        )
    }

    /// Gatherv to `root_rank`: `send` (`None`: already in place at the root's block) lands in
    /// block `i` of the root's `recv`.
    pub(crate) fn gatherv(
        &mut self,
        send: DevicePtr,
        send_in_place: bool,
        recv: DevicePtr,
        blocks: &[Block],
        root_rank: usize,
        size: usize,
    ) -> Result<()> {
        let r = self.rank();
        if r == root_rank && !send_in_place {
            self.copy(at(recv, blocks[r].start, size), send, blocks[r].len * size)?;
        }
        let is_root = r == root_rank;
        self.exchange(
            |to| (to == root_rank).then_some(Piece { ptr: send, bytes: blocks[r].len * size }),
            |from| is_root.then_some(Piece { ptr: at(recv, blocks[from].start, size), bytes: blocks[from].len * size }),
        )
    }

    /// Scatterv from `root_rank`: block `i` of the root's `send` lands in rank `i`'s `recv`
    /// (`recv_in_place` at the root: its block stays where it is).
    pub(crate) fn scatterv(
        &mut self,
        send: DevicePtr,
        blocks: &[Block],
        recv: DevicePtr,
        recv_in_place: bool,
        root_rank: usize,
        size: usize,
    ) -> Result<()> {
        let r = self.rank();
        let is_root = r == root_rank;
        if is_root && !recv_in_place {
            self.copy(recv, at(send, blocks[r].start, size), blocks[r].len * size)?;
        }
        self.exchange(
            |to| is_root.then_some(Piece { ptr: at(send, blocks[to].start, size), bytes: blocks[to].len * size }),
            |from| (from == root_rank).then_some(Piece { ptr: recv, bytes: blocks[r].len * size }),
        )
    }

    /// All-to-all of `bytes` per pair of ranks, one `ncclAlltoAll`: block `j` of `send` to rank
    /// `j` (`send == None`: in place, through scratch, as NCCL's runs out of place only).
    pub(crate) fn alltoall_native(&mut self, send: Option<DevicePtr>, recv: DevicePtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let src = match send {
            Some(s) => s,
            None => self.staged(recv, bytes * self.size())?,
        };
        self.grouped(&[Call::AlltoAll { send: cp(src), recv: mp(recv), count: bytes, dtype: dtype::UINT8 }])
    }

    /// A scratch copy of the first `bytes` of `buf` (the input of an in-place all-to-all).
    fn staged(&mut self, buf: DevicePtr, bytes: usize) -> Result<DevicePtr> {
        let tmp = self.scratch(bytes)?;
        self.copy(tmp, buf, bytes)?;
        Ok(tmp)
    }

    /// Gather (`gather`) or scatter of `bytes` per rank to or from `root_rank`, one
    /// `ncclGather` or `ncclScatter`. In place at the root where `send == recv + root_rank *
    /// bytes` (gather) or `recv == send + root_rank * bytes` (scatter); elsewhere the root's
    /// side of the call is unused.
    pub(crate) fn rooted_native(
        &mut self,
        gather: bool,
        send: DevicePtr,
        recv: DevicePtr,
        bytes: usize,
        root_rank: usize,
    ) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let (send, recv, count, dtype, root) = (cp(send), mp(recv), bytes, dtype::UINT8, root(root_rank)?);
        let call = if gather {
            Call::Gather { send, recv, count, dtype, root }
        } else {
            Call::Scatter { send, recv, count, dtype, root }
        };
        self.grouped(&[call])
    }

    /// A stream-ordered barrier: an allreduce of one scratch word.
    pub(crate) fn barrier(&mut self) -> Result<()> {
        let word = self.scratch(4)?;
        self.grouped(&[Call::AllReduce {
            send: cp(word),
            recv: mp(word),
            count: 1,
            dtype: dtype::INT32,
            op: redop::SUM,
        }])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn even_blocks_cover_everything_once() {
        for (n, p) in [(0, 3), (1, 3), (7, 3), (300, 5), (4, 4)] {
            let b = even_blocks(n, p);
            assert_eq!(b.len(), p);
            assert_eq!(b.iter().map(|b| b.len).sum::<usize>(), n);
            for w in b.windows(2) {
                assert_eq!(w[0].start + w[0].len, w[1].start);
                assert!(w[0].len >= w[1].len && w[0].len - w[1].len <= 1);
            }
        }
    }
}
