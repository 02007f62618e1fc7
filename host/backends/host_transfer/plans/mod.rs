//! What the staging engine runs: a [`Plan`] per operation, and the planners that make them,
//! by family (reductions, data movement, v-collectives, point-to-point).
//!
//! An operation's data is `parts` rows of `count` elements (the per-rank blocks of a
//! collective, one row for a reduction), every rank agrees on `count`, and chunk `k` is the
//! column range `[k C, (k + 1) C)` of every row. So one chunk of any operation is again the
//! same collective on smaller blocks, which the plan's `chunk` function builds with the Mpi
//! backend's planners on the staging slot. Rows move between device and host in one 2-D copy
//! per chunk and direction.
//!
//! Blocks of different lengths (v-collectives, point-to-point lists) are *pieces*, cut the same
//! way: chunk `k` holds elements `[k C, (k + 1) C)` of every piece, packed back to back by one
//! pack launch. Each rank then runs as many chunks as its own longest piece needs; operations
//! whose ranks may disagree on that (gatherv, scatterv, alltoallv, point-to-point) exchange
//! their chunks as point-to-point messages ([`Plan::pairwise`]), which match pair by pair in
//! order, since both sides of a pair know the pair's length. So every operation, whatever its
//! size, streams through the communicator's staging ring one chunk at a time.

mod movement;
mod p2p;
mod reductions;
mod vector;

use duralumin_kernels::Element;

use super::HostTransferCommunicator;
use crate::api::error::Result;
use crate::backends::mpi::{Job, Mode, exchange};
use crate::common::buffer::RawBuf;
use crate::device::{Device, DevicePtr, DeviceSlice, KeepAlive, ReduceFns};
use crate::transport::MpiTransport;

/// Device rows: `parts` rows of `len` elements starting at `ptr`, `pitch` elements apart.
/// `len` is the plan's `count` except for point-to-point, whose two directions may differ.
pub(crate) struct Rows {
    pub(crate) ptr: DevicePtr,
    pub(crate) parts: usize,
    pub(crate) len: usize,
    pub(crate) pitch: usize,
    pub(crate) keep: Option<KeepAlive>,
}

impl Rows {
    /// Elements of each row that chunk `k` (of `chunk_elems` elements per row) covers.
    pub(crate) fn chunk_len(&self, k: usize, chunk_elems: usize) -> usize {
        chunk_elems.min(self.len.saturating_sub(k * chunk_elems))
    }
}

/// Elements of a `len`-element row or piece that chunk `k` covers, at `chunk_elems` elements
/// per chunk.
pub(crate) fn cut(len: usize, k: usize, chunk_elems: usize) -> usize {
    chunk_elems.min(len.saturating_sub(k.saturating_mul(chunk_elems)))
}

/// Whether chunk `k` carries a message for a `len`-element piece: every chunk from the first
/// through the one the piece ends in, which is an empty message where the piece ends at a
/// chunk's boundary (an empty piece is one empty message). So each pair's last message is
/// shorter than a chunk, and two lengths that differ part in a message of the same chunk whose
/// lengths differ: a count error at the receiver, where a receive of a whole number of chunks
/// would otherwise complete silently before the sender's extra chunks, or wait for ever for
/// chunks a shorter sender never sends.
fn carries(len: usize, k: usize, chunk_elems: usize) -> bool {
    k.saturating_mul(chunk_elems) <= len
}

/// Chunks of an operation whose longest row or piece has `count` elements, cut at `chunk_elems`
/// per chunk: enough for every piece's messages (see [`carries`]) where the ranks exchange
/// their chunks pair by pair (`exchange`), at least one otherwise.
pub(crate) fn chunks_of(count: usize, chunk_elems: usize, exchange: bool) -> usize {
    let chunk_elems = chunk_elems.max(1);
    if exchange { (count / chunk_elems).saturating_add(1) } else { count.div_ceil(chunk_elems).max(1) }
}

/// Device data of an operation: rows (cut into chunks), or a list of pieces `(address,
/// elements)` of different lengths, each cut into chunks the same way and packed back to back
/// in staging (v-collectives and point-to-point lists).
pub(crate) enum Region {
    Rows(Rows),
    Pieces { pieces: Vec<(DevicePtr, usize)>, keep: Vec<KeepAlive> },
}

/// The staging area an operation's input is staged into: the send area, or the receive area
/// from its row (or output piece) `part` on (in-place operations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum InputArea {
    Send,
    Recv { part: usize },
}

/// The staging buffers of one chunk: `send_parts × len` and `recv_parts × len` elements (`len`
/// the chunk's row length), rows contiguous, or the chunk's pieces packed. `send` is `None`
/// where the operation stages in place.
pub(crate) struct ChunkBufs<T> {
    pub(crate) send: Option<RawBuf<T>>,
    pub(crate) recv: RawBuf<T>,
    /// The chunk's index.
    pub(crate) index: usize,
    /// Elements per row (or piece) and chunk.
    pub(crate) chunk_elems: usize,
}

impl<T> ChunkBufs<T> {
    /// The chunk's send and receive staging as slices.
    ///
    /// # Safety
    /// Only the chunk's MPI part may use the staging slot until it completes (the staging
    /// engine guarantees this: the stream touches the slot only before the input flag and after
    /// the output flag).
    unsafe fn slices<'a>(&self) -> (Option<&'a [T]>, &'a mut [T]) {
        // SAFETY: guaranteed by the caller; the send and receive areas are disjoint.
        unsafe { (self.send.map(|s| s.as_slice()), self.recv.as_mut_slice()) }
    }

    /// The first `send` and `recv` elements of the areas (chunks of blocks of different
    /// lengths, packed from the start of each area).
    ///
    /// # Safety
    /// As [`ChunkBufs::slices`].
    unsafe fn prefixes<'a>(&self, send: usize, recv: usize) -> (Option<&'a [T]>, &'a mut [T]) {
        // SAFETY: as in `slices`.
        unsafe { (self.send.map(|s| s.block(0, send).as_slice()), self.recv.block(0, recv).as_mut_slice()) }
    }

    /// Elements of a `len`-element row or piece this chunk covers.
    fn cut(&self, len: usize) -> usize {
        cut(len, self.index, self.chunk_elems)
    }

    /// This chunk's share of each of `lens`.
    fn cuts(&self, lens: &[usize]) -> Vec<usize> {
        lens.iter().map(|&len| self.cut(len)).collect()
    }

    /// Whether this chunk carries a message for a `len`-element piece (see [`carries`]).
    fn carries(&self, len: usize) -> bool {
        carries(len, self.index, self.chunk_elems)
    }
}

/// Builds the MPI part of one chunk on its staging buffers.
pub(crate) type ChunkFn<T> = Box<dyn FnMut(&crate::MpiCommunicator, ChunkBufs<T>) -> Result<Job<T>> + Send>;

/// Point-to-point messages of a chunk: `(block, peer)`.
type Messages<T> = Vec<(RawBuf<T>, usize)>;

/// A staged operation.
pub(crate) struct Plan<T> {
    /// Elements per row (the longest piece's for pieces): the same on every rank, except in
    /// plans that [`exchange`](Plan::exchange) their chunks, where each rank runs its own.
    pub(crate) count: usize,
    /// Rows that the chunk size is divided among: the same on every rank (the communicator
    /// size for block collectives and v-collectives, 1 for reductions and point-to-point), so
    /// every rank cuts the same chunks.
    pub(crate) width: usize,
    pub(crate) send_parts: usize,
    pub(crate) recv_parts: usize,
    /// Device rows copied in before each chunk's MPI part.
    pub(crate) input: Option<(Region, InputArea)>,
    /// Device rows the receive area's first rows are copied back to.
    pub(crate) output: Option<Region>,
    /// Reduce the receive area's `recv_parts` rows into the output rows on the device (with
    /// the #3 kernels on a GPU) instead of copying them back.
    pub(crate) device_reduce: Option<ReduceFns>,
    /// The chunks go as point-to-point messages (gatherv, scatterv, alltoallv, point-to-point),
    /// matched pair by pair: every rank must cut them alike, so the plan is always staged at
    /// the configured chunk size, never run on the device buffers in one piece (a direct
    /// sender's one message would meet a staged receiver's chunks).
    pub(crate) exchange: bool,
    pub(crate) chunk: ChunkFn<T>,
}

impl<T> Plan<T> {
    /// A plan whose ranks all run the same chunks of `count` elements per row, the chunk size
    /// divided among `width` rows; `chunk` builds a chunk's MPI part. It stages nothing until
    /// [`parts`](Self::parts), [`input`](Self::input) and [`output`](Self::output) say what.
    fn collective(
        count: usize,
        width: usize,
        chunk: impl FnMut(&crate::MpiCommunicator, ChunkBufs<T>) -> Result<Job<T>> + Send + 'static,
    ) -> Self {
        Plan {
            count,
            width,
            send_parts: 0,
            recv_parts: 0,
            input: None,
            output: None,
            device_reduce: None,
            exchange: false,
            chunk: Box::new(chunk),
        }
    }

    /// Rows per chunk in the send and in the receive staging area.
    fn parts(self, send_parts: usize, recv_parts: usize) -> Self {
        Plan { send_parts, recv_parts, ..self }
    }

    /// The device data staged into `area` before each chunk's MPI part (none if `None`).
    fn input(self, input: impl Into<Option<(Region, InputArea)>>) -> Self {
        Plan { input: input.into(), ..self }
    }

    /// The device data the receive area is copied back to after each chunk (none if `None`).
    fn output(self, output: impl Into<Option<Region>>) -> Self {
        Plan { output: output.into(), ..self }
    }

    /// Reduces the receive area's rows on the device with `fns` instead of copying them back.
    fn reduce_on_device(self, fns: ReduceFns) -> Self {
        Plan { device_reduce: Some(fns), ..self }
    }

    /// Where the MPI part reads and writes when it works on the device buffers themselves:
    /// `(send, receive)` host addresses, the layout staging would have with one chunk. `None`
    /// for plans with piece lists, whose staging packs them.
    pub(crate) fn direct_areas(&self, sz: usize) -> Option<(usize, usize)> {
        if self.device_reduce.is_some() {
            return None;
        }
        let rows = |r: &Region| match r {
            Region::Rows(rows) => usize::try_from(rows.ptr.addr()).ok(),
            Region::Pieces { .. } => None,
        };
        let input = match &self.input {
            Some((r, area)) => Some((rows(r)?, *area)),
            None => None,
        };
        let output = match &self.output {
            Some(r) => Some(rows(r)?),
            None => None,
        };
        let send = match input {
            Some((p, InputArea::Send)) => p,
            _ => 0,
        };
        let recv = match (output, input) {
            (Some(p), _) => p,
            (None, Some((p, InputArea::Recv { part }))) => p - part * self.count * sz,
            _ => 0,
        };
        Some((send, recv))
    }

    /// Whether the input is staged into the receive area: the chunks have no send area.
    pub(crate) fn in_place(&self) -> bool {
        !matches!(self.input, Some((_, InputArea::Send)))
    }

    /// What keeps the plan's device buffers alive.
    pub(crate) fn keep_alives(&self) -> Vec<KeepAlive> {
        let of = |r: &Region| match r {
            Region::Rows(rows) => rows.keep.iter().cloned().collect::<Vec<_>>(),
            Region::Pieces { keep, .. } => keep.clone(),
        };
        self.input.iter().flat_map(|(r, _)| of(r)).chain(self.output.iter().flat_map(of)).collect()
    }
}

impl<T: Element> Plan<T> {
    /// A plan whose chunks go as point-to-point messages ([`exchange`](Plan::exchange)), with
    /// `tag`: `messages` gives a chunk's sends and receives.
    fn pairwise(
        count: usize,
        width: usize,
        mut tag: Tag,
        mut messages: impl FnMut(&ChunkBufs<T>) -> Result<(Messages<T>, Messages<T>)> + Send + 'static,
    ) -> Self {
        let chunk = move |mpi: &crate::MpiCommunicator, bufs: ChunkBufs<T>| {
            let x = tag.transport::<T>(mpi)?;
            let (sends, recvs) = messages(&bufs)?;
            // SAFETY: the blocks lie in this chunk's staging slot (exchanges never work on the
            // device buffers), which only this chunk's MPI part uses until it completes; the
            // send and receive areas are disjoint.
            Ok(unsafe { exchange(x, sends, recvs) })
        };
        Plan { exchange: true, ..Plan::collective(count, width, chunk) }
    }
}

/// A chunk function that runs `plan` (an Mpi backend planner) on the chunk's send and receive
/// staging as slices.
fn on_slices<T>(
    mut plan: impl for<'s> FnMut(&crate::MpiCommunicator, Option<&'s [T]>, &'s mut [T]) -> Result<Job<T>> + Send + 'static,
) -> impl FnMut(&crate::MpiCommunicator, ChunkBufs<T>) -> Result<Job<T>> + Send + 'static {
    move |mpi: &crate::MpiCommunicator, chunk: ChunkBufs<T>| {
        // SAFETY: the staging engine hands each chunk's slot (or the device buffers, which the
        // operation holds) to its MPI part alone.
        let (send, recv) = unsafe { chunk.slices() };
        plan(mpi, send, recv)
    }
}

/// The tag of a pairwise plan's messages.
enum Tag {
    /// The tag a point-to-point call was given.
    User(i32),
    /// The operation's own, for an operation whose ranks may run different numbers of chunks:
    /// taken by its first chunk (which every rank runs, so every rank takes one, in operation
    /// order) and kept for the others. Messages of one pair then match chunk by chunk, in order.
    Operation(Option<MpiTransport>),
}

impl Tag {
    /// The transport of this chunk's messages.
    fn transport<T: Element>(&mut self, mpi: &crate::MpiCommunicator) -> Result<MpiTransport> {
        match self {
            Tag::User(tag) => mpi.p2p_transport::<T>(*tag, Mode::NonBlocking),
            Tag::Operation(Some(x)) => Ok(x.clone()),
            Tag::Operation(taken) => Ok(taken.insert(mpi.transport::<T>(Mode::NonBlocking)?).clone()),
        }
    }
}

/// What the planners take as a device buffer of `T` elements: `S: SliceOf<D, T>` stands for
/// `S: DeviceSlice<D, Elem = T>`.
pub(crate) trait SliceOf<D: Device, T>: DeviceSlice<D, Elem = T> {}

impl<D: Device, T, S: DeviceSlice<D, Elem = T>> SliceOf<D, T> for S {}

/// A buffer the operation reads, as the planners take it (the generated methods pass their
/// read buffers as trait objects, so an in-place call's `None` needs no type).
pub(crate) type Src<'a, D, T> = &'a dyn DeviceSlice<D, Elem = T>;

/// `parts` rows of `pitch` elements of `buf` from element `offset`, back to back.
fn rows<D: Device, B: DeviceSlice<D> + ?Sized>(buf: &B, offset: usize, parts: usize, pitch: usize) -> Region {
    Region::Rows(Rows {
        ptr: buf.device_ptr().offset(offset * size_of::<B::Elem>()),
        parts,
        len: pitch,
        pitch,
        keep: buf.keep_alive(),
    })
}

/// The blocks `[displs[i], displs[i] + counts[i])` of `buf` as pieces, in rank order.
fn blocks<D: Device, B: DeviceSlice<D> + ?Sized>(buf: &B, counts: &[usize], displs: &[usize]) -> Region {
    let (sz, base) = (size_of::<B::Elem>(), buf.device_ptr());
    let pieces = counts.iter().zip(displs).map(|(&count, &displ)| (base.offset(displ * sz), count)).collect();
    Region::Pieces { pieces, keep: buf.keep_alive().into_iter().collect() }
}

/// The longest of `lens` (0 if none).
fn longest(lens: &[usize]) -> usize {
    lens.iter().copied().max().unwrap_or(0)
}

/// Blocks of `lens` elements packed back to back from the start of `area`.
fn packed<T>(area: RawBuf<T>, lens: &[usize]) -> Vec<RawBuf<T>> {
    let mut at = 0;
    lens.iter()
        .map(|&n| {
            at += n;
            area.block(at - n, n)
        })
        .collect()
}

/// `(block, peer)` for every other rank whose block `f` gives.
fn peers<T>(n: usize, me: usize, f: impl Fn(usize) -> Option<RawBuf<T>>) -> Messages<T> {
    (0..n).filter(|&p| p != me).filter_map(|p| f(p).map(|b| (b, p))).collect()
}

impl<D: Device> HostTransferCommunicator<D> {
    /// Checks that an operation's send buffer (if it has one) and receive buffer (if it uses
    /// one) live on this communicator's device; `names` ([`buffers!`]) name them.
    fn check_buffers<S: DeviceSlice<D> + ?Sized, R: DeviceSlice<D> + ?Sized>(
        &self,
        names: [&'static str; 2],
        send: Option<&S>,
        recv: Option<&R>,
    ) -> Result<()> {
        crate::device::check_both(&*self.shared.device, names, send, recv)
    }

    /// A barrier: no data, one MPI barrier.
    pub(crate) fn plan_barrier(&self) -> Plan<u8> {
        Plan::collective(0, 1, |mpi, _| mpi.plan_barrier())
    }
}
