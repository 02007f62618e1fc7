//! The communicator's staging ring: pinned memory taken once, when the communicator is made,
//! that every staged operation streams through in queue order (see
//! [docs/host_transfer.md](../../../docs/host_transfer.md#the-staging-ring)).
//!
//! The ring is `cells` cells of `cell_bytes`. Chunk `c` of the communicator (chunks are
//! numbered across operations, in queue order) occupies `span` cells from ring position `p`
//! (positions also count across operations; the cell is `p mod cells`). Four monotonic 32-bit
//! counters in pinned, mapped memory say how far each side is, compared modulo 2³²:
//!
//! | counter | raised by | to | meaning |
//! |---|---|---|---|
//! | *staged* | the input copy stream | `c + 1` | chunk `c`'s input is in its cells |
//! | *output* | the proxy thread | `c + 1` | chunk `c`'s MPI part is done |
//! | *drained* | the output copy stream | `c + 1` | chunk `c`'s result was copied back |
//! | *free* | the proxy thread | `p` | every position below `p` may be refilled |
//!
//! The input stream waits for *free* before it refills a cell: that is the only wait of an
//! operation on an earlier one, and the proxy thread raises *free* once the earlier chunk's
//! MPI part is over and (if it copies back) the output stream has drained it, which was queued
//! before the wait. So this wait keeps the queue-order rule
//! (`docs/architecture.md#the-queue-order-rule`).
//!
//! A mover of several blocks also uses the ring's arrival words, one per block and side, to
//! hand each chunk to block 0, which raises the counters (`duralumin_kernels::mover::Share`).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use duralumin_kernels::flag::reached;
use duralumin_kernels::mover;

use crate::api::error::{Error, Result};
use crate::device::pool::{FlagSlot, PinnedBlock, Pools};
use crate::device::{Device, DevicePtr};

pub(crate) use duralumin_kernels::mover::low;

/// A chunk whose MPI part is over, waiting for its cells to be released in chunk order.
struct Release {
    /// The chunk's number.
    chunk: u64,
    /// The position after its cells.
    end: u64,
    /// Whether the output stream copies it back first (then *drained* must reach it).
    drains: bool,
}

/// The ring and its counters (shared by the calling thread, the proxy thread and the device).
pub(crate) struct Ring<D: Device> {
    block: Option<PinnedBlock<D>>,
    base: usize,
    /// The device's address of the ring's first cell.
    pub(crate) device_base: DevicePtr,
    pub(crate) cells: u64,
    pub(crate) cell_bytes: usize,
    pub(crate) staged: FlagSlot<D>,
    pub(crate) output: FlagSlot<D>,
    pub(crate) drained: FlagSlot<D>,
    pub(crate) free: FlagSlot<D>,
    /// The arrival words of a mover's blocks (see [`ARRIVAL_BYTES`]): zeroed when the ring is
    /// made, then written only by movers, and only ever raised.
    arrivals: Option<PinnedBlock<D>>,
    /// The device's address of the arrival words.
    arrivals_at: DevicePtr,
    releases: Mutex<VecDeque<Release>>,
    /// An operation was abandoned while MPI may still use the ring: it is never freed.
    leaked: AtomicBool,
    /// Set by the MPI side when a failed chunk left sends in flight for MPI to finish
    /// (`transport::OnError::Abandon`): they may read the ring's cells, so it is never freed.
    sends_left: Arc<AtomicBool>,
}

/// Bytes of a ring's arrival words: [`mover::MAX_BLOCKS`] 8-byte words for a mover's input
/// side and as many for its output side (`duralumin_kernels::mover::Share`).
pub(crate) const ARRIVAL_BYTES: usize = 2 * mover::MAX_BLOCKS * size_of::<u64>();

/// Where an operation's chunks lie in the ring (the arithmetic is the mover's,
/// [`duralumin_kernels::mover::Place`]), and the host address of the ring's first cell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) at: mover::Place,
    pub(crate) base: usize,
}

impl Place {
    /// The counter value that says chunk `k` of the operation is through a step.
    pub(crate) fn flag(&self, k: usize) -> u32 {
        self.at.flag(k)
    }

    /// The position after chunk `k`'s cells.
    pub(crate) fn end(&self, k: usize) -> u64 {
        self.at.end(k)
    }

    /// Host address of chunk `k`'s first cell.
    pub(crate) fn addr(&self, k: usize) -> usize {
        // Below the ring's bytes, which came from a `usize`.
        self.base + usize::try_from(self.at.offset(k)).unwrap_or(0)
    }
}

impl<D: Device> Ring<D> {
    /// The device addresses of the arrival words of a mover's blocks, input and output side.
    pub(crate) fn arrivals(&self) -> [u64; 2] {
        [self.arrivals_at.addr(), self.arrivals_at.offset(ARRIVAL_BYTES / 2).addr()]
    }

    /// A ring of `cells` cells of `cell_bytes` (`cells` a power of two), taken from `pools`
    /// (contents unspecified: nothing reads a cell before the device or MPI wrote it).
    /// `sends_left` is the flag the MPI side sets when it leaves sends in flight.
    pub(crate) fn new(
        pools: &Arc<Pools<D>>,
        cells: usize,
        cell_bytes: usize,
        sends_left: Arc<AtomicBool>,
    ) -> Result<Ring<D>> {
        let bytes = cells
            .checked_mul(cell_bytes)
            .ok_or(Error::CountOverflow { what: "staging ring bytes", value: cells as u128 * cell_bytes as u128 })?;
        let block = pools.take(bytes)?;
        let arrivals = pools.take(ARRIVAL_BYTES)?;
        // SAFETY: the block holds at least `ARRIVAL_BYTES` and was just taken: nothing else
        // uses it yet.
        unsafe { std::ptr::write_bytes(arrivals.ptr(), 0, ARRIVAL_BYTES) };
        let counter = || pools.flag();
        Ok(Ring {
            base: block.ptr() as usize,
            device_base: pools.device().mapped(block.ptr())?,
            block: Some(block),
            cells: cells as u64,
            cell_bytes,
            staged: counter()?,
            output: counter()?,
            drained: counter()?,
            free: counter()?,
            arrivals_at: pools.device().mapped(arrivals.ptr())?,
            arrivals: Some(arrivals),
            releases: Mutex::default(),
            leaked: AtomicBool::new(false),
            sends_left,
        })
    }

    /// Cells a chunk of `bytes` occupies (a power of two, so chunks never straddle the ring's
    /// end), or [`Error::PoolExhausted`] when one chunk needs more than the ring.
    pub(crate) fn span_of(&self, bytes: usize) -> Result<u64> {
        let span = (bytes.div_ceil(self.cell_bytes).max(1) as u64).next_power_of_two();
        if span > self.cells {
            return Err(Error::PoolExhausted {
                requested: bytes,
                in_use: 0,
                cap: usize::try_from(self.cells).unwrap_or(usize::MAX).saturating_mul(self.cell_bytes),
            });
        }
        Ok(span)
    }

    /// Places `chunks` chunks of `span` cells from chunk `*next_chunk` and position
    /// `*next_pos` (the calling thread's counters, advanced past them).
    pub(crate) fn place(&self, chunks: usize, span: u64, next_chunk: &mut u64, next_pos: &mut u64) -> Place {
        let pos = next_pos.div_ceil(span) * span;
        let (first, skipped, cells, cell_bytes) = (*next_chunk, *next_pos, self.cells, self.cell_bytes as u64);
        let place = Place { at: mover::Place { first, pos, skipped, span, cells, cell_bytes }, base: self.base };
        *next_chunk += chunks as u64;
        *next_pos = pos + chunks as u64 * span;
        place
    }

    /// Chunk `k` of the operation at `place` is through its MPI part (or skipped): its cells
    /// are released once every earlier chunk's are and, if `drains`, the output stream copied it
    /// back.
    pub(crate) fn finished(&self, place: &Place, k: usize, drains: bool) {
        let release = Release { chunk: place.at.first + k as u64, end: place.end(k), drains };
        self.lock().push_back(release);
        self.advance();
    }

    /// Raises *free* over every released chunk at the front of the queue; whether any chunk
    /// is still waiting.
    pub(crate) fn advance(&self) -> bool {
        let mut q = self.lock();
        while let Some(r) = q.front() {
            if r.drains && !reached(self.drained.load(), low(r.chunk + 1)) {
                return true;
            }
            self.free.raise(low(r.end));
            q.pop_front();
        }
        false
    }

    /// The operation at `place` is given up: every wait of its chunks (and of earlier ones)
    /// passes, and the ring is leaked, since MPI may still write into it.
    pub(crate) fn abandon(&self, place: &Place, chunks: usize) {
        self.leaked.store(true, Ordering::Release);
        let last = chunks.max(1) - 1;
        self.lock().clear();
        self.output.raise(place.flag(last));
        self.free.raise(low(place.end(last)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Release>> {
        self.releases.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<D: Device> Drop for Ring<D> {
    fn drop(&mut self) {
        if self.leaked.load(Ordering::Acquire) || self.sends_left.load(Ordering::Acquire) {
            std::mem::forget(self.block.take());
            std::mem::forget(self.arrivals.take());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cpu::HostDevice;

    /// A ring whose MPI side left sends in flight keeps its memory when it is dropped; one
    /// without gives it back.
    #[test]
    #[cfg_attr(miri, ignore = "leaks the ring on purpose, which Miri's leak check reports")]
    fn a_ring_under_sends_left_in_flight_is_never_freed() {
        let pools = Pools::new(Arc::new(HostDevice::new(0)), 1 << 20);
        for left in [false, true] {
            let before = pools.stats().blocks_in_use;
            let flag = Arc::new(AtomicBool::new(false));
            let ring = Ring::new(&pools, 4, 1024, Arc::clone(&flag)).expect("a ring");
            assert_eq!(pools.stats().blocks_in_use, before + 2, "its cells and its arrival words");
            flag.store(left, Ordering::Release);
            drop(ring);
            let kept = if left { 2 } else { 0 };
            assert_eq!(pools.stats().blocks_in_use, before + kept, "sends left in flight: {left}");
        }
    }
}
