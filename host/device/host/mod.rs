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
//! them. A wait only ever names work queued before it, so it cannot deadlock the device.

use std::alloc::Layout;
use std::collections::VecDeque;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering, fence};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use duralumin_kernels::Element;
use duralumin_kernels::flag::reached;
use duralumin_kernels::grid::HostGrid;

use super::{Copy2d, Device, DevicePtr, DeviceSlice, DeviceSliceMut, Flag, KeepAlive, ReduceFns, sealed};
use crate::error::{Error, Result};

/// Alignment of host-device allocations: enough for the copy bodies' 16-byte accesses and for
/// any element type.
const ALIGN: usize = 64;

static NEXT_DEVICE_ID: AtomicU64 = AtomicU64::new(1);

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
    signals: Arc<Signals>,
    /// With [`HostDevice::with_queues`]: the executors streams share, handed out round robin
    /// (each lives while a stream uses it), and how many streams were made.
    queues: Option<Mutex<(Vec<Weak<Queue>>, usize)>>,
}

/// How threads wait for flags of the device: they check a few times, yielding the core in
/// between, then sleep until whoever writes a flag of this device wakes them. A sleep that runs
/// out would cost at least the kernel's timer slack (50 µs by default) per wait; a wake-up costs
/// the writer one futex call, and only when someone is asleep. Host threads sleep here; a
/// stream's lane has a condition variable of its own (work queued on one stream wakes no
/// other), and a lane whose sleeper waits for a flag is woken from here too.
struct Signals {
    /// Threads asleep until a flag changes: here, or on a lane.
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
    /// The device's lanes, for waking those with a thread asleep until a flag changes.
    lanes: Mutex<Vec<Weak<Lane>>>,
    /// The longest a sleeping waiter waits for a wake-up before it checks again.
    longest_sleep: Duration,
}

/// Checks before a waiting stream sleeps.
const CHECKS_BEFORE_SLEEPING: u32 = 64;

/// The longest a waiting stream sleeps without a wake-up before it checks again (a safety net:
/// every flag write of the host device wakes it).
const LONGEST_SLEEP: Duration = Duration::from_millis(10);

impl Signals {
    fn new(longest_sleep: Duration) -> Signals {
        Signals {
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
            lanes: Mutex::default(),
            longest_sleep,
        }
    }

    /// Returns once `ready()` holds.
    fn wait_until(&self, ready: impl Fn() -> bool) {
        if check_a_while(|| ready().then_some(())).is_some() {
            return;
        }
        while !self.sleep_unless(self.longest_sleep, &ready) {}
    }

    /// Sleeps until a write wakes it or `limit` runs out, unless `ready()` already holds;
    /// returns whether it holds afterwards.
    fn sleep_unless(&self, limit: Duration, ready: impl Fn() -> bool) -> bool {
        self.sleepers.fetch_add(1, Ordering::SeqCst);
        // Paired with the fence in `wake_all`: either this check sees the write, or the writer
        // sees this sleeper and wakes it (it takes the lock, so not before the `wait` below has
        // released it).
        fence(Ordering::SeqCst);
        let guard = self.lock.lock().unwrap_or_else(PoisonError::into_inner);
        let done = ready();
        if !done {
            drop(self.wake.wait_timeout(guard, limit).unwrap_or_else(PoisonError::into_inner));
        }
        self.sleepers.fetch_sub(1, Ordering::SeqCst);
        done || ready()
    }

    /// Wakes every thread asleep until a flag changes; call after writing what they wait for.
    fn wake_all(&self) {
        fence(Ordering::SeqCst);
        if self.sleepers.load(Ordering::SeqCst) > 0 {
            drop(self.lock.lock().unwrap_or_else(PoisonError::into_inner));
            self.wake.notify_all();
            let lanes: Vec<_> =
                self.lanes.lock().unwrap_or_else(PoisonError::into_inner).iter().filter_map(Weak::upgrade).collect();
            for lane in lanes {
                lane.wake_flag_sleepers();
            }
        }
    }
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
    /// round robin as streams are made, the way a GPU maps streams onto its hardware queues
    /// (`CUDA_DEVICE_MAX_CONNECTIONS`). Work of streams that share a queue runs one item at a
    /// time in the order it was queued, whatever the stream: a stream waiting for a flag holds
    /// up the others behind it, as a blocked stream wait does on a GPU. So this device shows
    /// any work whose completion depends on work queued after it, which can deadlock a GPU.
    pub fn with_queues(ordinal: usize, queues: usize) -> HostDevice {
        Self::make(ordinal, Some(Mutex::new(((0..queues.max(1)).map(|_| Weak::new()).collect(), 0))), LONGEST_SLEEP)
    }

    /// A device whose sleeping threads check again after `longest_sleep` at the latest (tests
    /// set it long, so that only wake-ups move them).
    fn make(ordinal: usize, queues: Option<Mutex<(Vec<Weak<Queue>>, usize)>>, longest_sleep: Duration) -> HostDevice {
        HostDevice {
            inner: Arc::new(DeviceInner {
                id: NEXT_DEVICE_ID.fetch_add(1, Ordering::Relaxed),
                ordinal,
                streams: Mutex::new(Vec::new()),
                pinned_bytes: AtomicUsize::new(0),
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
        let bytes =
            len.checked_mul(size_of::<T>()).ok_or(Error::CountOverflow { what: "buffer", value: len as u128 })?;
        Ok(HostBuffer { mem: Arc::new(Memory::zeroed(bytes, self.inner.ordinal)?), len, _t: PhantomData })
    }

    /// A buffer holding a copy of `data`.
    pub fn upload<T: Element>(&self, data: &[T]) -> Result<HostBuffer<T>> {
        let buf = self.alloc_zeroed::<T>(data.len())?;
        // SAFETY: the buffer is new: no stream has work queued on it, and it holds `data.len()`
        // elements.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.mem.ptr.cast::<T>(), data.len()) };
        Ok(buf)
    }

    /// The buffer's contents, after every stream of the device has finished its queued work.
    pub fn download<T: Element>(&self, buf: &HostBuffer<T>) -> Result<Vec<T>> {
        self.synchronize_all()?;
        // SAFETY: no queued work remains on any stream of this device, so nothing writes the
        // buffer while it is read; it holds `len` initialized elements.
        Ok(unsafe { std::slice::from_raw_parts(buf.mem.ptr.cast::<T>(), buf.len) }.to_vec())
    }

    /// Overwrites the buffer with `data` (equal lengths) after every stream of the device has
    /// finished its queued work.
    pub fn write<T: Element>(&self, buf: &mut HostBuffer<T>, data: &[T]) -> Result<()> {
        crate::check::len("HostDevice::write data", data.len(), buf.len)?;
        self.synchronize_all()?;
        // SAFETY: as in `download`; `&mut` keeps other safe code away meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), buf.mem.ptr.cast::<T>(), data.len()) };
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
        let len = buf.len;
        let lane = stream.lane();
        // Held until the kernel is recorded as the buffer's last use, so no use is queued in
        // between that neither waits for it nor is waited for.
        let mut uses = buf.mem.uses();
        let mut after = Vec::new();
        pending_uses(&uses, lane, &mut after);
        stream.submit_after(after)?;
        let ticket = lane.push(Item::Run(Box::new(move || {
            // SAFETY: the memory is alive (`mem`) and holds `len` elements. Nothing else uses it
            // while this runs: work queued on it earlier on this executor has run (executors run
            // their items in order), earlier work on other executors has too (the wait queued
            // just before this item), and later work waits for this item (it is the buffer's
            // last use now, which every later launch, operation (`Device::acquire`) and host
            // access (`download`, `write`) of safe code waits for).
            f(unsafe { std::slice::from_raw_parts_mut(mem.ptr.cast::<T>(), len) })
        })))?;
        // It waited for every earlier use: later work need only wait for it.
        uses.clear();
        uses.push(Use { lane: Arc::downgrade(lane), ticket });
        Ok(())
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
}

/// Memory of the host device, 64-byte aligned and zero-filled.
struct Memory {
    ptr: *mut u8,
    bytes: usize,
    ordinal: usize,
    /// Where the work queued on the memory last is, per executor (see the module docs; unused
    /// for pinned memory, whose users order themselves with flags).
    uses: Mutex<Vec<Use>>,
}

/// An item of an executor that uses a buffer's memory: the `ticket`-th item queued on `lane`.
/// A lane that is gone has run all its items.
struct Use {
    lane: Weak<Lane>,
    ticket: u64,
}

impl Use {
    /// The lane, while the item has not run yet.
    fn pending(&self) -> Option<Arc<Lane>> {
        self.lane.upgrade().filter(|lane| !lane.has_finished(self.ticket))
    }
}

/// Adds the uses among `uses` on lanes other than `lane` that have not run yet to `after`, as
/// `(lane, ticket)`: what work queued on `lane` must wait for (its own lane runs in order).
fn pending_uses(uses: &[Use], lane: &Arc<Lane>, after: &mut Vec<(Arc<Lane>, u64)>) {
    for u in uses {
        if let Some(other) = u.pending().filter(|other| !Arc::ptr_eq(other, lane)) {
            after.push((other, u.ticket));
        }
    }
}

// SAFETY: the memory is only accessed in stream order or after synchronizing (see the module
// docs); the struct itself is an owned allocation (and a lock).
unsafe impl Send for Memory {}
// SAFETY: as above.
unsafe impl Sync for Memory {}

impl Memory {
    fn uses(&self) -> std::sync::MutexGuard<'_, Vec<Use>> {
        self.uses.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the `ticket`-th item of `lane` as the memory's last use there (it comes after
    /// the lane's earlier ones), dropping uses that have run.
    fn record(&self, lane: &Arc<Lane>, ticket: u64) {
        let mut uses = self.uses();
        uses.retain(|u| !std::ptr::eq(u.lane.as_ptr(), Arc::as_ptr(lane)) && u.pending().is_some());
        uses.push(Use { lane: Arc::downgrade(lane), ticket });
    }

    fn layout(bytes: usize) -> Result<Layout> {
        Layout::from_size_align(bytes.max(1), ALIGN)
            .map_err(|_| Error::CountOverflow { what: "allocation", value: bytes as u128 })
    }

    fn zeroed(bytes: usize, ordinal: usize) -> Result<Memory> {
        let layout = Self::layout(bytes)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::OutOfMemory { what: "host device memory", bytes });
        }
        Ok(Memory { ptr, bytes, ordinal, uses: Mutex::default() })
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        if let Ok(layout) = Self::layout(self.bytes) {
            // SAFETY: allocated in `zeroed` with this layout.
            unsafe { std::alloc::dealloc(self.ptr, layout) };
        }
    }
}

/// A buffer of `T` in the host device's memory: the host device's counterpart of a
/// `CudaSlice<T>`. Read it with [`HostDevice::download`].
pub struct HostBuffer<T> {
    mem: Arc<Memory>,
    len: usize,
    _t: PhantomData<T>,
}

impl<T> fmt::Debug for HostBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostBuffer").field("len", &self.len).field("ordinal", &self.mem.ordinal).finish()
    }
}

impl<T> HostBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl<T> sealed::Sealed for HostBuffer<T> {}

impl<T: Element> DeviceSlice<HostDevice> for HostBuffer<T> {
    type Elem = T;
    fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.mem.ptr as u64)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn ordinal(&self) -> usize {
        self.mem.ordinal
    }
    fn keep_alive(&self) -> Option<KeepAlive> {
        Some(Arc::clone(&self.mem) as KeepAlive)
    }
}

impl<T: Element> DeviceSliceMut<HostDevice> for HostBuffer<T> {}

type Work = Box<dyn FnOnce() + Send>;

/// Whether a wait item may pass. Checked under its queue's lock by whichever thread advances
/// the queue, so it only reads (a flag, an event) and never blocks.
type Ready = Box<dyn Fn() -> bool + Send>;

/// One item of a stream's work.
enum Item {
    /// Runs to its end once started: a copy, a flag write, a kernel.
    Run(Work),
    /// The stream goes on once this holds (a flag wait, a join).
    Wait(Ready),
}

/// Calls `check` up to [`CHECKS_BEFORE_SLEEPING`] times, spinning and then yielding the core
/// in between, until it returns something; `None` if it never did (the caller then sleeps).
fn check_a_while<T>(mut check: impl FnMut() -> Option<T>) -> Option<T> {
    for i in 0..CHECKS_BEFORE_SLEEPING {
        if let Some(found) = check() {
            return Some(found);
        }
        if i < CHECKS_BEFORE_SLEEPING / 2 { std::hint::spin_loop() } else { std::thread::yield_now() }
    }
    None
}

/// The work of one executor (one stream's, or the streams' that share it with
/// [`HostDevice::with_queues`]), run in order by whichever thread advances it: the executor
/// thread, or a thread synchronizing with one of its streams, which runs the work itself
/// rather than wait for the executor thread to be scheduled. One thread runs an item at a time.
struct Lane {
    state: Mutex<LaneState>,
    /// Where the lane's threads sleep: woken when work is queued, an item finishes or the lane
    /// closes, and (those waiting for one) when a flag of the device is written.
    changed: Condvar,
    signals: Arc<Signals>,
    /// `LaneState::finished`, for other lanes' waits on this one's items (checked under their
    /// own lane's lock, so they read this rather than take this lane's).
    finished: AtomicU64,
    /// Other lanes' waits on this lane's items that have not passed: while there are any,
    /// finishing an item wakes the device's sleepers that wait for a flag (waiting lanes sleep
    /// as those do).
    watchers: AtomicUsize,
}

#[derive(Default)]
struct LaneState {
    items: VecDeque<Item>,
    /// A thread is running an item it took off `items`: no one else may start the next.
    running: bool,
    /// Items ever queued and ever finished: a synchronize waits until `finished` reaches the
    /// `queued` it saw.
    queued: u64,
    finished: u64,
    /// Threads asleep on `changed`, and how many of them also wait for a flag.
    sleepers: usize,
    flag_sleepers: usize,
    /// Threads waiting for the lane that run its work themselves (see [`Lane::wait_helping`]):
    /// the executor thread leaves the work to them meanwhile.
    helpers: usize,
    /// An item panicked (a kernel of [`HostDevice::launch`]): reported by every later
    /// synchronize, as a faulted GPU context reports its fault; later work still runs, so no
    /// operation waiting for the stream hangs.
    panicked: bool,
    /// The executor thread finishes the queued work and exits.
    closed: bool,
}

impl LaneState {
    /// Whether a thread may run the next item now.
    fn runnable(&self) -> bool {
        !self.running
            && match self.items.front() {
                Some(Item::Run(_)) => true,
                Some(Item::Wait(ready)) => ready(),
                None => false,
            }
    }

    /// Whether the lane is held up by a wait (so only a flag write moves it on).
    fn waiting(&self) -> bool {
        !self.running && matches!(self.items.front(), Some(Item::Wait(_)))
    }

    /// Whether the executor thread is through.
    fn ended(&self) -> bool {
        self.closed && self.items.is_empty() && !self.running
    }
}

type LaneGuard<'a> = std::sync::MutexGuard<'a, LaneState>;

impl Lane {
    fn new(signals: &Arc<Signals>) -> Arc<Lane> {
        let lane = Arc::new(Lane {
            state: Mutex::default(),
            changed: Condvar::new(),
            signals: Arc::clone(signals),
            finished: AtomicU64::new(0),
            watchers: AtomicUsize::new(0),
        });
        let mut lanes = signals.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        lanes.retain(|l| l.strong_count() > 0);
        lanes.push(Arc::downgrade(&lane));
        lane
    }

    fn lock(&self) -> LaneGuard<'_> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Releases the lane after a change of its state made under `st`, then wakes its sleepers.
    /// Not before: a sleeper woken while the lock is still held would only block on it, and on
    /// a busy machine could take the core of the thread that holds it.
    fn unlock_changed(&self, st: LaneGuard<'_>) {
        let wake = st.sleepers > 0;
        drop(st);
        if wake {
            self.changed.notify_all();
        }
    }

    /// Wakes the lane's sleepers that wait for a flag.
    fn wake_flag_sleepers(&self) {
        if self.lock().flag_sleepers > 0 {
            self.changed.notify_all();
        }
    }

    /// Sleeps until the lane changes (or, with `flags`, a flag of the device is written) or
    /// `limit` runs out, unless `ready(state)` holds once the sleeper is counted in.
    fn sleep<'a>(
        &'a self,
        mut st: LaneGuard<'a>,
        flags: bool,
        limit: Duration,
        ready: impl Fn(&LaneState) -> bool,
    ) -> LaneGuard<'a> {
        st.sleepers += 1;
        if flags {
            st.flag_sleepers += 1;
            self.signals.sleepers.fetch_add(1, Ordering::SeqCst);
            // Paired with the fence in `Signals::wake_all`: either `ready` below sees the flag
            // write, or the writer sees this sleeper and wakes the lane (under the lane's lock,
            // so not before the wait below has released it).
            fence(Ordering::SeqCst);
        }
        if !ready(&st) {
            st = self.changed.wait_timeout(st, limit).unwrap_or_else(PoisonError::into_inner).0;
        }
        st.sleepers -= 1;
        if flags {
            st.flag_sleepers -= 1;
            self.signals.sleepers.fetch_sub(1, Ordering::SeqCst);
        }
        st
    }

    /// Queues an item, waking the lane's sleepers if it is the next one to run. Returns its
    /// ticket: it has run once the lane has finished that many items.
    fn push(&self, item: Item) -> Result<u64> {
        let mut st = self.lock();
        if st.closed {
            return Err(Error::Device { call: "host stream", message: "the stream's executor has stopped".into() });
        }
        st.items.push_back(item);
        st.queued += 1;
        let ticket = st.queued;
        if st.items.len() == 1 {
            // Behind other items it changes nothing until they are through.
            self.unlock_changed(st);
        }
        Ok(ticket)
    }

    /// Whether the item with `ticket` (see [`Lane::push`]) has run.
    fn has_finished(&self, ticket: u64) -> bool {
        self.finished.load(Ordering::SeqCst) >= ticket
    }

    /// Runs items in order until the lane is empty or waits, unless another thread is running
    /// one. Returns whether any item finished.
    fn advance(&self) -> bool {
        let mut st = self.lock();
        let mut ran = false;
        while !st.running {
            match st.items.front() {
                Some(Item::Wait(ready)) if ready() => {
                    st.items.pop_front();
                }
                Some(Item::Run(_)) => {
                    let Some(Item::Run(work)) = st.items.pop_front() else { break };
                    st.running = true;
                    drop(st);
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work));
                    st = self.lock();
                    st.running = false;
                    st.panicked |= outcome.is_err();
                }
                _ => break,
            }
            st.finished += 1;
            self.finished.store(st.finished, Ordering::SeqCst);
            ran = true;
        }
        if ran {
            self.unlock_changed(st);
            // Paired with `After::new`: either a waiting lane sees the store above when it
            // checks, or this sees it counted in and wakes it.
            if self.watchers.load(Ordering::SeqCst) > 0 {
                self.signals.wake_all();
            }
        }
        ran
    }

    /// Returns once `until(state)` holds, advancing the lane on this thread meanwhile and
    /// calling `help` (see [`Device::synchronize_helping`]); between checks it sleeps until the
    /// lane changes or a flag of the device is written (or, while `help` has work, a backoff runs
    /// out).
    fn wait_helping(&self, until: impl Fn(&LaneState) -> bool, help: super::Help<'_>) {
        /// Counts the thread in as a helper while it waits (and out, even on a panic in `help`).
        struct Helping<'a>(&'a Lane);
        impl Drop for Helping<'_> {
            fn drop(&mut self) {
                let mut st = self.0.lock();
                st.helpers -= 1;
                self.0.unlock_changed(st);
            }
        }
        self.lock().helpers += 1;
        let _helping = Helping(self);
        let done = || {
            if self.advance() {
                crate::progress::made_progress();
            }
            until(&self.lock())
        };
        let news = |st: &LaneState| until(st) || st.runnable();
        let nap = |limit| drop(self.sleep(self.lock(), true, limit, news));
        if matches!(crate::progress::help_until(|| Ok(done()), help, nap), Ok(true)) {
            return;
        }
        while check_a_while(|| done().then_some(())).is_none() {
            nap(self.signals.longest_sleep);
        }
    }

    /// Blocks until the work queued so far has run (see [`Lane::wait_helping`]).
    fn synchronize(&self, help: super::Help<'_>, give_up: super::GiveUp<'_>) -> Result<()> {
        let target = self.lock().queued;
        self.wait_helping(|st| st.finished >= target || give_up.is_some_and(|g| g()), help);
        if self.lock().panicked {
            return Err(Error::Device {
                call: "host stream",
                message: "a kernel queued on the stream panicked".into(),
            });
        }
        Ok(())
    }

    /// The executor thread: runs what it can, sleeps until there is more, and exits once the
    /// lane is closed and empty. While threads wait for the lane and run its work themselves, it
    /// leaves the work to them (two threads taking turns at one lane only contend for it), and
    /// steps in only when they have not moved it on for [`HELPER_GRACE`] (a helper can be busy
    /// driving an operation), so the lane never depends on them.
    fn execute(&self) {
        let go_on = |st: &LaneState| st.ended() || (st.runnable() && st.helpers == 0);
        loop {
            self.advance();
            // Work comes in bursts: look for more a while (without contending for the lock)
            // before sleeping.
            let soon = check_a_while(|| self.state.try_lock().ok().filter(|st| go_on(st)).map(drop));
            let mut st = self.lock();
            while soon.is_none() && !go_on(&st) {
                if st.runnable() {
                    let seen = st.finished;
                    st = self.sleep(st, false, HELPER_GRACE, |st| st.helpers == 0 || st.finished != seen);
                    if st.runnable() && st.finished == seen {
                        break;
                    }
                } else if st.helpers > 0 {
                    // Held up by a wait a helper is there for: no flag write wakes this thread
                    // (each would cost the writer a system call), only the lane's changes, or
                    // the longest sleep if a helper never moves it on. Once the helpers leave,
                    // look for work a while again: their thread is likely to queue more at
                    // once, and finding this one awake needs no wake-up.
                    st = self.sleep(st, false, self.signals.longest_sleep, |st| st.helpers == 0 || st.runnable());
                    if st.helpers == 0 {
                        break;
                    }
                } else {
                    let flags = st.waiting();
                    st = self.sleep(st, flags, self.signals.longest_sleep, go_on);
                }
            }
            if st.ended() {
                return;
            }
        }
    }
}

/// Items of other lanes that a wait item waits for (a buffer's earlier uses), counted in as
/// their lanes' watchers while it waits.
struct After(Vec<(Arc<Lane>, u64)>);

impl After {
    fn new(items: Vec<(Arc<Lane>, u64)>) -> After {
        for (lane, _) in &items {
            lane.watchers.fetch_add(1, Ordering::SeqCst);
        }
        After(items)
    }

    /// Whether every item has run.
    fn passed(&self) -> bool {
        self.0.iter().all(|(lane, ticket)| lane.has_finished(*ticket))
    }
}

impl Drop for After {
    fn drop(&mut self) {
        for (lane, _) in &self.0 {
            lane.watchers.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// How long the executor thread leaves runnable work to a thread that waits for the lane and
/// runs it itself, before running it anyway.
const HELPER_GRACE: Duration = Duration::from_millis(1);

/// An executor thread and its lane.
struct Queue {
    lane: Arc<Lane>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Queue {
    fn start(ordinal: usize, signals: &Arc<Signals>) -> Result<Arc<Queue>> {
        let lane = Lane::new(signals);
        let executor = Arc::clone(&lane);
        let thread = std::thread::Builder::new()
            .name(format!("duralumin-host-stream-{ordinal}"))
            .spawn(move || executor.execute())
            .map_err(|e| Error::Device { call: "spawn host stream", message: e.to_string() })?;
        Ok(Arc::new(Queue { lane, thread: Mutex::new(Some(thread)) }))
    }
}

struct StreamInner {
    device_id: u64,
    ordinal: usize,
    queue: Arc<Queue>,
    #[cfg(test)]
    gate: Arc<tests::WaitGate>,
}

impl Drop for Queue {
    fn drop(&mut self) {
        // The thread finishes the queued work, then exits.
        let mut st = self.lane.lock();
        st.closed = true;
        self.lane.unlock_changed(st);
        if let Some(t) = self.thread.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = t.join();
        }
    }
}

/// A stream of the [`HostDevice`]: an executor thread running work in order (shared with other
/// streams on a device made by [`HostDevice::with_queues`]). Cloning gives another handle to
/// the same stream; the thread exits when the last handle of every stream using it drops,
/// after running what was queued.
#[derive(Clone)]
pub struct HostStream {
    inner: Arc<StreamInner>,
}

impl fmt::Debug for HostStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostStream").field("ordinal", &self.inner.ordinal).finish_non_exhaustive()
    }
}

impl HostStream {
    fn submit(&self, work: Work) -> Result<()> {
        self.inner.queue.lane.push(Item::Run(work)).map(drop)
    }

    fn submit_wait(&self, ready: Ready) -> Result<()> {
        self.inner.queue.lane.push(Item::Wait(ready)).map(drop)
    }

    /// Queues a wait until the items `after` of other lanes have run (nothing if there are none).
    fn submit_after(&self, after: Vec<(Arc<Lane>, u64)>) -> Result<()> {
        if after.is_empty() {
            return Ok(());
        }
        let after = After::new(after);
        self.submit_wait(Box::new(move || after.passed()))
    }

    /// The lane the stream's work runs on.
    fn lane(&self) -> &Arc<Lane> {
        &self.inner.queue.lane
    }

    /// Blocks until the work queued so far has run. The calling thread runs queued work itself
    /// while the executor thread is not running it. An error if a kernel queued on the stream
    /// (or on a stream sharing its executor) panicked.
    pub fn sync(&self) -> Result<()> {
        self.inner.queue.lane.synchronize(&mut || false, None)
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
        let queue = match &self.inner.queues {
            None => Queue::start(self.inner.ordinal, &self.inner.signals)?,
            Some(shared) => {
                let mut shared = shared.lock().unwrap_or_else(PoisonError::into_inner);
                let (list, made) = &mut *shared;
                let i = *made % list.len();
                *made += 1;
                match list[i].upgrade() {
                    Some(q) => q,
                    None => {
                        let q = Queue::start(self.inner.ordinal, &self.inner.signals)?;
                        list[i] = Arc::downgrade(&q);
                        q
                    }
                }
            }
        };
        let inner = Arc::new(StreamInner {
            device_id: self.inner.id,
            ordinal: self.inner.ordinal,
            queue,
            #[cfg(test)]
            gate: Arc::default(),
        });
        let mut list = self.inner.streams.lock().unwrap_or_else(PoisonError::into_inner);
        list.retain(|w| w.strong_count() > 0);
        list.push(Arc::downgrade(&inner));
        Ok(HostStream { inner })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        let mem = Memory::zeroed(bytes, self.inner.ordinal)?;
        let ptr = mem.ptr;
        std::mem::forget(mem);
        self.inner.pinned_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok(ptr)
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize) {
        self.inner.pinned_bytes.fetch_sub(bytes, Ordering::Relaxed);
        drop(Memory { ptr, bytes, ordinal: self.inner.ordinal, uses: Mutex::default() });
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
        unsafe { self.pieces(stream, pieces, keep, move |at, (ptr, bytes)| (dst + at, ptr.0 as usize, bytes)) }
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
        unsafe { self.pieces(stream, pieces, keep, move |at, (ptr, bytes)| (ptr.0 as usize, src + at, bytes)) }
    }

    unsafe fn write_flag(&self, stream: &HostStream, flag: Flag, value: u32) -> Result<()> {
        self.check_stream(stream)?;
        let signals = Arc::clone(&self.inner.signals);
        stream.submit(Box::new(move || {
            // SAFETY: the caller keeps the flag's slot held until this has run.
            HostGrid::SINGLE.signal(unsafe { flag.atomic() }, value);
            // The proxy thread and other streams may wait for the flag: neither need wait out
            // a sleep.
            crate::progress::nudge();
            signals.wake_all();
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
        let (dst, src, row) = (dst.0 as usize, src as usize, op.row_bytes(rows, len)?);
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
        let ticket = lane.lock().queued;
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
        let st = stream.inner.queue.lane.lock();
        Ok(st.finished == st.queued)
    }

    fn synchronize_helping(
        &self,
        stream: &HostStream,
        help: super::Help<'_>,
        give_up: super::GiveUp<'_>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        stream.inner.queue.lane.synchronize(help, give_up)
    }

    unsafe fn host_wait_helping(
        &self,
        stream: &HostStream,
        flag: Flag,
        value: u32,
        help: super::Help<'_>,
        give_up: super::GiveUp<'_>,
    ) {
        // SAFETY: the caller holds the slot.
        let atomic = unsafe { flag.atomic() };
        let stop = || give_up.is_some_and(|g| g());
        stream.inner.queue.lane.wait_helping(|_| reached(atomic.load(Ordering::Acquire), value) || stop(), help);
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

/// The host device's memory behind keep-alives (a buffer's [`DeviceSlice::keep_alive`]).
fn memories(keep: &[KeepAlive]) -> impl Iterator<Item = &Memory> {
    keep.iter().filter_map(|k| k.downcast_ref::<Memory>())
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

#[cfg(test)]
impl HostStream {
    /// The gate this stream's flag waits pass before they look at their flag.
    pub(crate) fn wait_gate(&self) -> &tests::WaitGate {
        &self.inner.gate
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    use std::sync::{Arc, Condvar, Mutex, PoisonError};
    use std::thread::ThreadId;
    use std::time::{Duration, Instant};

    use super::{DevicePtr, Flag, HostDevice, HostStream, Signals};
    use crate::device::{Copy2d, Device, DeviceSlice, ReduceFns};
    use crate::error::Error;

    /// Lets a test hold a stream back: while the gate is held, the stream's flag waits stop
    /// before they look at their flag, as if the stream had fallen behind everything else.
    #[derive(Debug, Default)]
    pub(crate) struct WaitGate {
        /// Whether the gate is held, and how many waits have reached it.
        state: Mutex<(bool, usize)>,
        changed: Condvar,
    }

    impl WaitGate {
        /// Checked by a wait of the stream before it looks at its flag: counts the wait in (once:
        /// `arrived` is the wait's own), and holds it back while the gate is held.
        pub(super) fn open_for(&self, arrived: &AtomicBool) -> bool {
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if !arrived.swap(true, Ordering::Relaxed) {
                st.1 += 1;
                self.changed.notify_all();
            }
            !st.0
        }

        /// Holds the stream's flag waits from now on.
        pub(crate) fn hold(&self) {
            self.state.lock().unwrap_or_else(PoisonError::into_inner).0 = true;
        }

        /// A guard that releases the gate when dropped (a failing test lets its stream go).
        pub(crate) fn held_until_drop(&self) -> impl Drop + '_ {
            struct Release<'a>(&'a WaitGate);
            impl Drop for Release<'_> {
                fn drop(&mut self) {
                    self.0.release();
                }
            }
            Release(self)
        }

        /// Lets every held wait and later ones through.
        pub(crate) fn release(&self) {
            self.state.lock().unwrap_or_else(PoisonError::into_inner).0 = false;
            self.changed.notify_all();
        }

        /// Waits until `n` waits in all have reached the gate; false if that takes over `limit`.
        pub(crate) fn reached_by(&self, n: usize, limit: Duration) -> bool {
            let end = Instant::now() + limit;
            let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            while st.1 < n {
                let left = end.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return false;
                }
                st = self.changed.wait_timeout(st, left).unwrap_or_else(PoisonError::into_inner).0;
            }
            true
        }
    }

    /// Streams share executors round robin on a device made with `with_queues`: work of two
    /// streams on one executor runs in the order it was queued (a slow item on one holds up the
    /// other), while a stream with an executor of its own runs past it.
    #[test]
    fn streams_sharing_a_queue_run_in_the_order_work_was_queued() {
        let dev = super::HostDevice::with_queues(0, 2);
        let streams: Vec<_> = (0..3).map(|_| dev.stream().unwrap()).collect();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut bufs: Vec<_> = (0..3).map(|_| dev.alloc_zeroed::<u32>(1).unwrap()).collect();
        for (i, (s, b)) in streams.iter().zip(bufs.iter_mut()).enumerate() {
            let order = Arc::clone(&order);
            dev.launch(s, b, move |_| {
                if i == 0 {
                    std::thread::sleep(Duration::from_millis(200));
                }
                order.lock().unwrap().push(i);
            })
            .unwrap();
        }
        for s in &streams {
            s.sync().unwrap();
        }
        // Streams 0 and 2 share the first executor, stream 1 has the second.
        assert_eq!(*order.lock().unwrap(), [1, 0, 2]);
    }

    /// Launches on two streams that use one buffer run one after the other, in the order they
    /// were queued: the second stream waits for the first's slow kernel. Unordered, the second
    /// kernel ran at once, while the first slept, with `&mut` to the same elements on two
    /// threads, and the first's write then overwrote its result.
    #[test]
    fn launches_on_two_streams_are_ordered_by_their_buffer() {
        let dev = HostDevice::new(0);
        let (first, second) = (dev.stream().unwrap(), dev.stream().unwrap());
        let mut buf = dev.alloc_zeroed::<u32>(1024).unwrap();
        dev.launch(&first, &mut buf, |b| {
            std::thread::sleep(Duration::from_millis(200));
            b.fill(1);
        })
        .unwrap();
        dev.launch(&second, &mut buf, |b| b.iter_mut().for_each(|x| *x += 1)).unwrap();
        let got = dev.download(&buf).unwrap();
        assert!(got.iter().all(|&x| x == 2), "expected 2 everywhere (1, then + 1), got {:?}...", &got[..4]);
    }

    /// An operation on another stream (what the HostTransfer backend queues between
    /// `acquire` and `release`) starts after a launch on its buffer: its copy sees the
    /// kernel's write, though the kernel is slow.
    #[test]
    fn an_operation_on_another_stream_waits_for_a_launch_on_its_buffer() {
        const N: usize = 1024;
        let dev = HostDevice::new(0);
        let (kernels, ops) = (dev.stream().unwrap(), dev.stream().unwrap());
        let mut buf = dev.alloc_zeroed::<u32>(N).unwrap();
        dev.launch(&kernels, &mut buf, |b| {
            std::thread::sleep(Duration::from_millis(200));
            b.fill(1);
        })
        .unwrap();
        let staged = dev.alloc_pinned(N * 4).unwrap();
        let keep = vec![buf.keep_alive().unwrap()];
        dev.acquire(&ops, &keep).unwrap();
        // SAFETY: `staged` holds N u32s and nothing else touches it until the stream is
        // synchronized below; `keep` holds the buffer, which has N elements.
        unsafe { dev.copy_d2h(&ops, staged, buf.device_ptr(), Copy2d::contiguous(N * 4), Some(keep[0].clone())) }
            .unwrap();
        dev.release(&ops, &keep).unwrap();
        ops.sync().unwrap();
        // SAFETY: the copy has run (synchronized above); N u32s of pinned memory.
        let got = unsafe { std::slice::from_raw_parts(staged.cast::<u32>(), N) }.to_vec();
        // SAFETY: allocated above with this size; no queued work uses it any more.
        unsafe { dev.free_pinned(staged, N * 4) };
        assert!(got.iter().all(|&x| x == 1), "the operation's copy ran before the kernel's write: {:?}...", &got[..4]);
    }

    /// A launch on a buffer waits for an operation on another stream that uses the buffer, even
    /// while the operation is held up (here by a flag, as an operation waits for its MPI
    /// part): the operation's copy still sees the buffer as it was, and the kernel's write
    /// lands after it.
    #[test]
    fn a_launch_waits_for_an_operation_on_another_stream() {
        const N: usize = 1024;
        let dev = HostDevice::new(0);
        let (kernels, ops) = (dev.stream().unwrap(), dev.stream().unwrap());
        let mut buf = dev.alloc_zeroed::<u32>(N).unwrap();
        let staged = dev.alloc_pinned(N * 4).unwrap();
        let raised = Arc::new(AtomicU32::new(0));
        let flag = Flag { host: &*raised, device: DevicePtr(Arc::as_ptr(&raised) as u64) };
        let keep = vec![buf.keep_alive().unwrap()];
        dev.acquire(&ops, &keep).unwrap();
        // SAFETY: the flag outlives the stream's work (synchronized below, before it goes);
        // `staged` and the buffer as in the test above.
        unsafe {
            dev.wait_flag(&ops, flag, 1, None).unwrap();
            dev.copy_d2h(&ops, staged, buf.device_ptr(), Copy2d::contiguous(N * 4), Some(keep[0].clone())).unwrap();
        }
        dev.release(&ops, &keep).unwrap();
        dev.launch(&kernels, &mut buf, |b| b.fill(5)).unwrap();
        // Unordered, the kernel would run meanwhile.
        std::thread::sleep(Duration::from_millis(100));
        raised.store(1, Ordering::Release);
        dev.host_wrote_flag();
        ops.sync().unwrap();
        kernels.sync().unwrap();
        // SAFETY: as in the test above.
        let got = unsafe { std::slice::from_raw_parts(staged.cast::<u32>(), N) }.to_vec();
        // SAFETY: as in the test above.
        unsafe { dev.free_pinned(staged, N * 4) };
        assert!(
            got.iter().all(|&x| x == 0),
            "the kernel wrote the buffer before the operation's copy: {:?}...",
            &got[..4]
        );
        assert!(dev.download(&buf).unwrap().iter().all(|&x| x == 5));
    }

    /// A reduction whose row size overflows `usize` is refused with a typed error before
    /// anything is queued (it used to wrap and queue a copy of the wrapped size).
    #[test]
    fn reduce_h2d_refuses_rows_whose_size_overflows() {
        let dev = HostDevice::new(0);
        let stream = dev.stream().unwrap();
        let op = ReduceFns::of::<u32, crate::Sum>(2);
        for (rows, len) in [(1, usize::MAX / 2), (2, usize::MAX / 8 + 1)] {
            // SAFETY: the call fails its size check before it queues anything, so the
            // addresses are never used.
            let r = unsafe { dev.reduce_h2d(&stream, DevicePtr(64), 64 as *const u8, rows, len, op) };
            assert!(matches!(r, Err(Error::CountOverflow { .. })), "rows {rows} of {len}: {r:?}");
        }
        stream.sync().unwrap();
    }

    /// A stream waiting for a flag, then a kernel that notes the thread it runs on.
    fn flag_then_kernel(dev: &HostDevice, flag: &AtomicU32) -> (HostStream, Arc<Mutex<Option<ThreadId>>>) {
        let stream = dev.stream().unwrap();
        let ran_on = Arc::new(Mutex::new(None));
        let note = Arc::clone(&ran_on);
        let flag = Flag { host: flag, device: DevicePtr(flag as *const AtomicU32 as u64) };
        // SAFETY: the flag outlives the stream's work (the tests synchronize before it goes).
        unsafe { dev.wait_flag(&stream, flag, 1, None).unwrap() };
        let mut buf = dev.alloc_zeroed::<u8>(1).unwrap();
        dev.launch(&stream, &mut buf, move |_| *note.lock().unwrap() = Some(std::thread::current().id())).unwrap();
        (stream, ran_on)
    }

    /// A thread that synchronizes runs the stream's work itself, once what it drives meanwhile
    /// (`help`) has raised the flag the stream waits for. The flag is raised without waking
    /// anyone and the device's sleepers never check again on their own, so the executor thread,
    /// asleep on the flag, cannot be the one that runs the kernel: without helping, the
    /// synchronize would hang.
    #[test]
    fn a_synchronizing_thread_runs_the_streams_work() {
        let dev = HostDevice::make(0, None, Duration::from_secs(3600));
        let flag = Arc::new(AtomicU32::new(0));
        let (stream, ran_on) = flag_then_kernel(&dev, &flag);
        // Long enough for the executor to reach the wait and fall asleep on it.
        std::thread::sleep(Duration::from_millis(50));
        let (tx, rx) = std::sync::mpsc::channel();
        let (helper_dev, helper_stream, raised) = (dev.clone(), stream.clone(), Arc::clone(&flag));
        std::thread::spawn(move || {
            let mut calls = 0;
            let mut help = || {
                calls += 1;
                raised.store(1, Ordering::Release);
                true
            };
            let r = helper_dev.synchronize_helping(&helper_stream, &mut help, None);
            let _ = tx.send((r, calls, std::thread::current().id()));
        });
        let Ok((r, calls, helper)) = rx.recv_timeout(Duration::from_secs(60)) else {
            // The stream's work waits for nothing now that the flag is up; dropping it would
            // wait for the sleeping executor.
            std::mem::forget(stream);
            panic!("the synchronize hung: the helper did not run the stream's work")
        };
        r.unwrap();
        assert!(calls >= 1, "help was never called");
        assert_eq!(*ran_on.lock().unwrap(), Some(helper), "the kernel ran on another thread than the helper");
    }

    /// A helper busy with what it drives does not hold the stream up: the executor thread runs
    /// work that became runnable while the helper was away.
    #[test]
    fn the_executor_runs_work_a_busy_helper_leaves() {
        let dev = HostDevice::new(0);
        let flag = Arc::new(AtomicU32::new(0));
        let (stream, ran_on) = flag_then_kernel(&dev, &flag);
        // The executor reaches the wait and falls asleep on it before the helper comes.
        std::thread::sleep(Duration::from_millis(50));
        let signals = Arc::clone(&dev.inner.signals);
        let mut help = || {
            flag.store(1, Ordering::Release);
            signals.wake_all();
            // Busy for far longer than the executor leaves work to helpers.
            std::thread::sleep(Duration::from_millis(200));
            true
        };
        dev.synchronize_helping(&stream, &mut help, None).unwrap();
        let ran_on = ran_on.lock().unwrap().expect("the kernel never ran");
        assert_ne!(ran_on, std::thread::current().id(), "the helper ran the kernel: the executor never stepped in");
    }

    /// A kernel that panics fails the synchronize that follows (and every later one, as a
    /// faulted context does); the stream's later work still runs.
    #[test]
    fn a_panicking_kernel_fails_synchronize_and_later_work_still_runs() {
        let dev = HostDevice::new(0);
        let stream = dev.stream().unwrap();
        let mut buf = dev.alloc_zeroed::<u32>(4).unwrap();
        dev.launch(&stream, &mut buf, |_| panic!("a kernel that panics (expected by the test)")).unwrap();
        dev.launch(&stream, &mut buf, |b| b.fill(7)).unwrap();
        let err = stream.sync().expect_err("the panic must be reported");
        assert!(err.to_string().contains("panicked"), "{err}");
        assert_eq!(dev.download(&buf).expect_err("sticky").to_string(), err.to_string());
        let mut fresh = dev.alloc_zeroed::<u32>(1).unwrap();
        let other = dev.stream().unwrap();
        dev.launch(&other, &mut fresh, |b| b[0] = 1).unwrap();
        other.sync().expect("another stream of the device is not broken");
        // The kernel after the panic ran (its write is there once the stream is through).
        assert!(stream.sync().is_err());
        let mem = buf.mem.ptr.cast::<u32>();
        // SAFETY: the stream is through with the buffer (synchronized above) and nothing else
        // queued work on it.
        assert_eq!(unsafe { std::slice::from_raw_parts(mem, 4) }, [7; 4]);
    }

    /// Two threads take turns through [`Signals`], each pausing before its write so the other
    /// is asleep by then. The waits never time out on their own, so one lost wake-up leaves a
    /// thread asleep for good and the test fails at its deadline.
    #[test]
    fn sleeping_waiters_are_woken_by_every_write() {
        const ROUNDS: u32 = 100;
        let signals = Arc::new(Signals::new(Duration::from_secs(3600)));
        let (ping, pong) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
        let turn = |mine: Arc<AtomicU32>, theirs: Arc<AtomicU32>, first: bool| {
            let signals = Arc::clone(&signals);
            move || {
                for i in 1..=ROUNDS {
                    if !first {
                        signals.wait_until(|| theirs.load(Ordering::Acquire) >= i);
                    }
                    std::thread::sleep(Duration::from_micros(300));
                    mine.store(i, Ordering::Release);
                    signals.wake_all();
                    if first {
                        signals.wait_until(|| theirs.load(Ordering::Acquire) >= i);
                    }
                }
            }
        };
        let a = std::thread::spawn(turn(Arc::clone(&ping), Arc::clone(&pong), true));
        let b = std::thread::spawn(turn(Arc::clone(&pong), Arc::clone(&ping), false));
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = a.join();
            let _ = b.join();
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(Duration::from_secs(60)).is_ok(),
            "a waiter was not woken (ping {}, pong {})",
            ping.load(Ordering::Acquire),
            pong.load(Ordering::Acquire)
        );
    }
}
