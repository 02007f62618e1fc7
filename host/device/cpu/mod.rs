//! The host device: streams are in-order executor threads over host memory.
//!
//! Each [`HostStream`] owns one thread that runs the stream's work items in order. Copies run
//! the shared 2-D copy kernel body ([`duralumin_kernels::pack`]); flags are atomics, written
//! with release stores and read with acquire loads. A stream held up by a flag wait checks a
//! few times, then sleeps until a flag write of the device wakes it, so it costs no core and
//! still sees the write at once.
//!
//! A thread that synchronizes with a stream (or waits for an operation on it) runs the
//! stream's work itself while it waits, and drives the host parts of its own operations
//! ([`Device::synchronize_helping`]); meanwhile the executor thread leaves the work to it,
//! stepping in only if it has not moved the stream on for a millisecond. So a small operation
//! followed by a synchronize costs no hand-off between threads, each of which costs
//! microseconds on a busy machine. Stream order is kept either way: one thread runs an item
//! at a time, in queue order. A kernel ([`HostDevice::launch`]) therefore runs on the
//! executor thread or on a thread waiting for its stream.
//!
//! "Device memory" is host memory owned by [`HostBuffer`]s, which queued work keeps alive, and
//! which the host reads and writes only through [`HostDevice::download`] and
//! [`HostDevice::write`]: those first wait for every stream of the device, so no safe code can
//! race with queued work.
//!
//! # Ordering across streams
//! Streams run side by side, so work on one buffer queued on two streams needs ordering the
//! streams alone do not give. Each buffer remembers where the work queued on it last is: per
//! executor, the position of its last item that uses the buffer (what cudarc keeps as a
//! buffer's read and write events). Work queued on a buffer on another executor first waits,
//! on that executor, for those items to have run, and then becomes the buffer's last use. Who
//! queues such work:
//! * [`HostDevice::launch`] waits for every earlier use and records itself;
//! * an operation of the HostTransfer backend does the same through [`Device::acquire`] before
//!   its first work on its stream (the stream waits for the buffers' earlier uses) and
//!   [`Device::release`] after its last (the stream's position there, after the operation's
//!   MPI part too when it runs directly on the buffers, is recorded for every buffer).
//!
//! Reads are ordered like writes (as the CUDA device orders every operation through a buffer's
//! home stream): a buffer's two uses on different streams never overlap, whatever they do with
//! it. So a kernel's `&mut [T]` never aliases other work on the buffer, whichever threads run
//! them. A wait only ever names work queued before it
//! (`docs/architecture.md#the-queue-order-rule`).
//!
//! # Streams that share an executor
//! A device made by [`HostDevice::with_queues`] maps its streams onto a fixed number of
//! executors, round robin, as a GPU maps streams onto hardware queues: work of streams that
//! share an executor runs one item at a time in queue order, so a stream waiting for a flag
//! holds up the others behind it. So this device hangs on any break of the queue-order rule
//! (`docs/architecture.md#the-queue-order-rule`), as a GPU can.

mod executor;
mod memory;
mod signals;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod wait_gate;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use duralumin_kernels::Element;
use duralumin_kernels::flag::reached;
use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::mover::{self, Schedule};

pub use self::executor::HostStream;
use self::executor::{Queue, SharedQueues, StreamInner};
pub use self::memory::HostBuffer;
use self::memory::{Memory, Use, memories, pending_uses};
use self::signals::{LONGEST_SLEEP, Signals};
use super::{Copy2d, Device, DevicePtr, Flag, GiveUp, Help, KeepAlive, ReduceFns, sealed};
use crate::api::error::{Error, Result};

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

/// The host address a pointer of this device stands for.
#[allow(clippy::cast_possible_truncation, reason = "the device makes its pointers from host addresses")]
fn addr(ptr: DevicePtr) -> usize {
    ptr.0 as usize
}

/// A device whose memory is host memory and whose streams are executor threads.
///
/// Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct HostDevice {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    id: u64,
    ordinal: usize,
    streams: Mutex<Vec<Weak<StreamInner>>>,
    pinned_bytes: AtomicUsize,
    /// Movers queued so far.
    movers: AtomicUsize,
    signals: Arc<Signals>,
    /// With [`HostDevice::with_queues`]: the executors streams share.
    queues: Option<Mutex<SharedQueues>>,
}

impl fmt::Debug for HostDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostDevice").field("ordinal", &self.inner.ordinal).finish_non_exhaustive()
    }
}

impl HostDevice {
    /// A host device with ordinal `ordinal` (only used to tell devices apart, like a GPU's
    /// index: a buffer of one cannot be used with a communicator of another).
    pub fn new(ordinal: usize) -> HostDevice {
        Self::make(ordinal, None, LONGEST_SLEEP)
    }

    /// A host device whose streams share `queues` executor threads (at least 1), handed out
    /// round robin as streams are made: it hangs on any break of the queue-order rule, as a
    /// GPU can (see "Streams that share an executor" in the module docs).
    pub fn with_queues(ordinal: usize, queues: usize) -> HostDevice {
        Self::make(ordinal, Some(Mutex::new(SharedQueues::new(queues))), LONGEST_SLEEP)
    }

    /// A device whose sleeping threads check again after `longest_sleep` at the latest (tests
    /// set it long, so that only wake-ups move them).
    fn make(ordinal: usize, queues: Option<Mutex<SharedQueues>>, longest_sleep: Duration) -> HostDevice {
        HostDevice {
            inner: Arc::new(DeviceInner {
                id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
                ordinal,
                streams: Mutex::new(Vec::new()),
                pinned_bytes: AtomicUsize::new(0),
                movers: AtomicUsize::new(0),
                signals: Arc::new(Signals::new(longest_sleep)),
                queues,
            }),
        }
    }

    /// A stream of this device: its own executor thread, or a share of one with
    /// [`HostDevice::with_queues`].
    pub fn stream(&self) -> Result<HostStream> {
        self.new_stream()
    }

    /// A zero-filled buffer of `len` elements.
    pub fn alloc_zeroed<T: Element>(&self, len: usize) -> Result<HostBuffer<T>> {
        HostBuffer::zeroed(len, self.inner.ordinal)
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<HostBuffer<T>> {
        let buf = self.alloc_zeroed::<T>(data.len())?;
        // SAFETY: the buffer is new: no stream has work queued on it, and it holds `data.len()`
        // elements.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr(), data.len()) };
        Ok(buf)
    }

    /// The buffer's contents, after every stream of the device has finished its queued work.
    pub fn download<T: Element>(&self, buf: &HostBuffer<T>) -> Result<Vec<T>> {
        self.synchronize_all()?;
        // SAFETY: no queued work remains on any stream of this device, so nothing writes the
        // buffer while it is read; it holds `len` initialized elements.
        Ok(unsafe { std::slice::from_raw_parts(buf.ptr(), buf.len()) }.to_vec())
    }

    /// Overwrites the buffer with `data` (equal lengths) after every stream of the device has
    /// finished its queued work.
    pub fn write<T: Element>(&self, buf: &mut HostBuffer<T>, data: &[T]) -> Result<()> {
        crate::common::check::len("HostDevice::write data", data.len(), buf.len())?;
        self.synchronize_all()?;
        // SAFETY: as in `download`; `&mut` keeps other safe code away meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.ptr(), data.len()) };
        Ok(())
    }

    /// Queues `f` on `stream` to run on the buffer's elements in stream order: the host
    /// device's kernel launch. It runs on the stream's executor thread, or on a thread that
    /// synchronizes with the stream meanwhile. It runs after the work queued on the buffer
    /// before it on any stream of the device, and work queued on the buffer after it on any
    /// stream runs after it (see the module docs). If it panics, the stream's later work still
    /// runs and every later synchronize of the stream returns an error, as a faulted GPU context
    /// reports its fault.
    pub fn launch<T: Element>(
        &self,
        stream: &HostStream,
        buf: &mut HostBuffer<T>,
        f: impl FnOnce(&mut [T]) + Send + 'static,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let mem = Arc::clone(&buf.mem);
        let len = buf.len();
        let lane = stream.lane();
        // Held until the kernel is recorded as the buffer's last use, so no use is queued in
        // between that neither waits for it nor is waited for.
        let mut uses = buf.mem.uses();
        let mut after = Vec::new();
        pending_uses(&uses, lane, &mut after);
        stream.submit_after(after)?;
        let ticket = stream.submit_ticketed(Box::new(move || {
            // SAFETY: the memory is alive (`mem`) and holds `len` elements. Nothing else uses it
            // while this runs: work queued on it earlier on this executor has run (executors run
            // their items in order), earlier work on other executors has too (the wait queued
            // just before this item), and later work waits for this item (it is the buffer's
            // last use now, which every later launch, operation (`Device::acquire`) and host
            // access (`download`, `write`) of safe code waits for).
            f(unsafe { std::slice::from_raw_parts_mut(mem.ptr.cast::<T>(), len) })
        }))?;
        // It waited for every earlier use: later work need only wait for it.
        uses.clear();
        uses.push(Use::new(lane, ticket));
        Ok(())
    }

    /// How many movers (staged operations queued as one item, see
    /// [`HostTransferConfig::mover_min_chunks`](crate::HostTransferConfig::mover_min_chunks))
    /// were queued on this device so far.
    pub fn movers_queued(&self) -> usize {
        self.inner.movers.load(Ordering::Relaxed)
    }

    /// Pinned bytes currently allocated from this device (for leak checks).
    pub fn pinned_bytes(&self) -> usize {
        self.inner.pinned_bytes.load(Ordering::Relaxed)
    }

    /// Waits for every live stream of the device.
    fn synchronize_all(&self) -> Result<()> {
        let streams: Vec<_> = {
            let mut list = self.inner.streams.lock().unwrap_or_else(PoisonError::into_inner);
            list.retain(|w| w.strong_count() > 0);
            list.iter().filter_map(Weak::upgrade).collect()
        };
        for s in streams {
            HostStream { inner: s }.sync()?;
        }
        Ok(())
    }

    fn check_stream(&self, stream: &HostStream) -> Result<()> {
        if self.owns(stream) {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what: "stream",
                expected: self.name(),
                found: format!("host:{}", stream.inner.ordinal),
            })
        }
    }

    /// The executor of a new stream: its own, or the next shared one in turn.
    fn queue_for_new_stream(&self) -> Result<Arc<Queue>> {
        let (ordinal, signals) = (self.inner.ordinal, &self.inner.signals);
        match &self.inner.queues {
            None => Queue::start(ordinal, signals),
            Some(shared) => shared.lock().unwrap_or_else(PoisonError::into_inner).next(ordinal, signals),
        }
    }
}

impl sealed::Sealed for HostDevice {}

impl Device for HostDevice {
    type Stream = HostStream;

    fn name(&self) -> String {
        format!("host:{}", self.inner.ordinal)
    }

    fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    fn host_accessible(&self) -> bool {
        true
    }

    fn owns(&self, stream: &HostStream) -> bool {
        stream.inner.device_id == self.inner.id
    }

    fn new_stream(&self) -> Result<HostStream> {
        let stream = HostStream::new(self.inner.id, self.inner.ordinal, self.queue_for_new_stream()?);
        let mut list = self.inner.streams.lock().unwrap_or_else(PoisonError::into_inner);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&stream.inner));
        Ok(stream)
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        let ptr = Memory::zeroed(bytes, self.inner.ordinal)?.into_raw();
        self.inner.pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) {
        self.inner.pinned_bytes.fetch_sub(bytes, Ordering::Relaxed);
        // SAFETY: the caller passes memory of `bytes` bytes from `alloc_pinned` (`into_raw`),
        // once, and no queued work uses it any more.
        drop(unsafe { Memory::from_raw(ptr, bytes, self.inner.ordinal) });
    }

    fn mapped(&self, host: *mut u8) -> Result<DevicePtr> {
        Ok(DevicePtr(host as u64))
    }

    unsafe fn copy_d2h(
        &self,
        stream: &HostStream,
        dst: *mut u8,
        src: DevicePtr,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded: on the host device, device addresses are host addresses.
        unsafe { self.copy(stream, dst, src.0 as *const u8, shape, keep) }
    }

    unsafe fn copy_h2d(
        &self,
        stream: &HostStream,
        dst: DevicePtr,
        src: *const u8,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded, as in `copy_d2h`.
        unsafe { self.copy(stream, dst.0 as *mut u8, src, shape, keep) }
    }

    unsafe fn pack_d2h(
        &self,
        stream: &HostStream,
        dst: *mut u8,
        pieces: Vec<(DevicePtr, usize)>,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        let dst = dst as usize;
        // SAFETY: forwarded from the caller, piece by piece.
        unsafe { self.pieces(stream, pieces, keep, move |at, (ptr, bytes)| (dst + at, addr(ptr), bytes)) }
    }

    unsafe fn unpack_h2d(
        &self,
        stream: &HostStream,
        pieces: Vec<(DevicePtr, usize)>,
        src: *const u8,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        let src = src as usize;
        // SAFETY: forwarded from the caller, piece by piece.
        unsafe { self.pieces(stream, pieces, keep, move |at, (ptr, bytes)| (addr(ptr), src + at, bytes)) }
    }

    unsafe fn write_flag(&self, stream: &HostStream, flag: Flag, value: u32) -> Result<()> {
        self.check_stream(stream)?;
        let signals = Arc::clone(&self.inner.signals);
        stream.submit(Box::new(move || {
            // SAFETY: the caller keeps the flag's slot held until this has run.
            HostGrid::SINGLE.signal(unsafe { flag.atomic() }, value);
            announce(&signals);
        }))
    }

    unsafe fn wait_flag(&self, stream: &HostStream, flag: Flag, value: u32, keep: Option<KeepAlive>) -> Result<()> {
        self.check_stream(stream)?;
        #[cfg(test)]
        let (gate, arrived) = (Arc::clone(&stream.inner.gate), AtomicBool::new(false));
        stream.submit_wait(Box::new(move || {
            // Dropped with the item, once the wait has passed.
            let _ = &keep;
            #[cfg(test)]
            if !gate.open_for(&arrived) {
                return false;
            }
            // SAFETY: the caller keeps the flag's slot held until the wait has finished.
            reached(unsafe { flag.atomic() }.load(Ordering::Acquire), value)
        }))
    }

    fn has_mover(&self) -> bool {
        true
    }

    /// Every staged operation: queueing is then one item at any size, and the copies cost
    /// the same either way here (`docs/host_transfer.md`, "The mover").
    fn mover_min_chunks(&self) -> Option<usize> {
        Some(1)
    }

    /// One work item runs the whole schedule on the executor thread, as one block whatever
    /// `blocks` says (the executor runs one item at a time); its waits sleep until a flag write
    /// wakes them, as the stream's own flag waits do. Like any long work item, a
    /// thread that synchronizes with a stream sharing the executor
    /// ([`HostDevice::with_queues`]) may run it itself, and is then busy until the operation is
    /// through (or given up: abandoning it raises every counter it waits for).
    unsafe fn queue_mover(
        &self,
        stream: &HostStream,
        schedule: Schedule,
        _blocks: usize,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let signals = Arc::clone(&self.inner.signals);
        let queued = stream.submit(Box::new(move || {
            let _keep = keep;
            // SAFETY: the caller guarantees the schedule's addresses for the run, and that its
            // counters are raised by the host or by work queued before; on the host device
            // device addresses are host addresses.
            HostGrid::SINGLE
                .run(|t| unsafe { mover::run(t, &schedule, &Waker(&signals), mover::Side::Both, mover::Share::ALL) });
        }));
        if queued.is_ok() {
            self.inner.movers.fetch_add(1, Ordering::Relaxed);
        }
        queued
    }

    unsafe fn reduce_h2d(
        &self,
        stream: &HostStream,
        dst: DevicePtr,
        src: *const u8,
        rows: usize,
        len: usize,
        op: ReduceFns,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if rows == 0 || len == 0 {
            return Ok(());
        }
        let (dst, src, row) = (addr(dst), src as usize, op.row_bytes(rows, len)?);
        stream.submit(Box::new(move || {
            let (d, s) = (dst as *mut u8, src as *const u8);
            // SAFETY: the caller guarantees `dst` holds `len` elements and `src` `rows * len`,
            // both untouched by others until this has run; they are distinct allocations.
            unsafe {
                std::ptr::copy_nonoverlapping(s, d, row);
                for r in 1..rows {
                    (op.host_reduce)(d, s.add(r * row), len);
                }
                if let Some(finish) = op.host_finish {
                    finish(d, len, op.ranks);
                }
            }
        }))
    }

    /// The stream waits for the work queued on the buffers behind `keep` on other executors
    /// (see the module docs).
    fn acquire(&self, stream: &HostStream, keep: &[KeepAlive]) -> Result<()> {
        self.check_stream(stream)?;
        let mut after = Vec::new();
        for mem in memories(keep) {
            pending_uses(&mem.uses(), stream.lane(), &mut after);
        }
        stream.submit_after(after)
    }

    /// The work queued on the stream so far becomes the last use of the buffers behind `keep`
    /// there, which work on them on other executors will wait for.
    fn release(&self, stream: &HostStream, keep: &[KeepAlive]) -> Result<()> {
        self.check_stream(stream)?;
        let lane = stream.lane();
        let ticket = lane.last_ticket();
        for mem in memories(keep) {
            mem.record(lane, ticket);
        }
        Ok(())
    }

    fn join(&self, waiter: &HostStream, stream: &HostStream) -> Result<()> {
        self.check_stream(waiter)?;
        self.check_stream(stream)?;
        if Arc::ptr_eq(&waiter.inner, &stream.inner) {
            return Ok(());
        }
        let event = Arc::new(AtomicBool::new(false));
        let (set, wake) = (Arc::clone(&event), Arc::clone(&self.inner.signals));
        stream.submit(Box::new(move || {
            set.store(true, Ordering::Release);
            wake.wake_all();
        }))?;
        waiter.submit_wait(Box::new(move || event.load(Ordering::Acquire)))
    }

    fn synchronize(&self, stream: &HostStream) -> Result<()> {
        self.check_stream(stream)?;
        stream.sync()
    }

    fn query(&self, stream: &HostStream) -> Result<bool> {
        self.check_stream(stream)?;
        Ok(stream.lane().is_through())
    }

    fn synchronize_helping(&self, stream: &HostStream, help: Help<'_>, give_up: GiveUp<'_>) -> Result<()> {
        self.check_stream(stream)?;
        stream.lane().synchronize(help, give_up)
    }

    unsafe fn host_wait_helping(
        &self,
        stream: &HostStream,
        flag: Flag,
        value: u32,
        help: Help<'_>,
        give_up: GiveUp<'_>,
    ) {
        // SAFETY: the caller holds the slot.
        let atomic = unsafe { flag.atomic() };
        let stop = || give_up.is_some_and(|g| g());
        stream.lane().wait_helping_until(|| reached(atomic.load(Ordering::Acquire), value) || stop(), help);
    }

    unsafe fn host_wait(&self, flag: Flag, value: u32) {
        // SAFETY: the caller holds the slot.
        let atomic = unsafe { flag.atomic() };
        self.inner.signals.wait_until(|| reached(atomic.load(Ordering::Acquire), value));
    }

    fn host_wrote_flag(&self) {
        self.inner.signals.wake_all();
    }
}

impl HostDevice {
    /// Queues one work item copying every piece: `route(offset in the packed buffer, piece)`
    /// gives `(dst, src, bytes)`.
    ///
    /// # Safety
    /// As [`Device::pack_d2h`].
    unsafe fn pieces(
        &self,
        stream: &HostStream,
        pieces: Vec<(DevicePtr, usize)>,
        keep: Vec<KeepAlive>,
        route: impl Fn(usize, (DevicePtr, usize)) -> (usize, usize, usize) + Send + 'static,
    ) -> Result<()> {
        self.check_stream(stream)?;
        stream.submit(Box::new(move || {
            let _keep = keep;
            let mut at = 0;
            for piece in pieces {
                let (dst, src, bytes) = route(at, piece);
                at += piece.1;
                if bytes == 0 {
                    continue;
                }
                // SAFETY: the caller guarantees every piece and the packed buffer are valid and
                // untouched by anyone else until this has run; `keep` holds the device memory.
                let (d, s) = unsafe {
                    (
                        std::slice::from_raw_parts_mut(dst as *mut u8, bytes),
                        std::slice::from_raw_parts(src as *const u8, bytes),
                    )
                };
                HostGrid::SINGLE.copy_2d(d, bytes, s, bytes, bytes, 1);
            }
        }))
    }

    /// Queues a 2-D copy between host addresses, run by the shared copy body.
    ///
    /// # Safety
    /// As [`Device::copy_d2h`].
    unsafe fn copy(
        &self,
        stream: &HostStream,
        dst: *mut u8,
        src: *const u8,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if shape.bytes() == 0 {
            return Ok(());
        }
        let (dst, src) = (dst as usize, src as usize);
        stream.submit(Box::new(move || {
            let _keep = keep;
            let (dst_len, src_len) = (shape.extent(shape.dst_pitch), shape.extent(shape.src_pitch));
            // SAFETY: the caller guarantees both row sets are valid and untouched by anyone else
            // until this copy has run (stream order), and `keep` holds the device memory.
            let (d, s) = unsafe {
                (
                    std::slice::from_raw_parts_mut(dst as *mut u8, dst_len),
                    std::slice::from_raw_parts(src as *const u8, src_len),
                )
            };
            HostGrid::SINGLE.copy_2d(d, shape.dst_pitch, s, shape.src_pitch, shape.row_bytes, shape.rows);
        }))
    }
}

/// The mover's hooks on the host device: waits sleep until a flag write wakes them, and its
/// counter writes wake the device's sleepers and the proxy thread.
struct Waker<'a>(&'a Signals);

impl mover::Hooks for Waker<'_> {
    fn wait_until<F: Fn() -> bool>(&self, ready: F, _value: u64) {
        self.0.wait_until(ready);
    }

    fn wrote(&self) {
        announce(self.0);
    }
}

/// After a stream wrote a flag: the proxy thread and other streams may wait for it, and neither
/// need wait out a sleep.
fn announce(signals: &Signals) {
    crate::common::progress::nudge();
    signals.wake_all();
}
