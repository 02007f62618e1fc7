//! The device layer: what the HostTransfer backend needs from an accelerator ([`Device`]), and
//! what the NCCL backend needs beyond it (`NcclDevice`, features `cuda`/`hip`).
//!
//! A [`Device`] has streams (in-order queues of work), page-locked host memory it can copy to
//! and from asynchronously, 32-bit flags in host-mapped memory that a stream can write and wait
//! for, and 2-D copies between its memory and host memory. Everything a backend queues on a
//! stream runs after the work queued before it and before the work queued after it; the host
//! thread that queues it returns at once.
//!
//! Implementations:
//! * [`cpu::HostDevice`]: an in-order executor thread per stream over host memory; flags are
//!   atomics and copies run the shared kernel bodies on the CPU. A real device for CPU users,
//!   and what lets the whole HostTransfer path run in CI without a GPU.
//! * `cuda::CudaDevice` (feature `cuda`, the default) and `hip::HipDevice` (feature `hip`):
//!   an NVIDIA or AMD GPU. Both are one implementation, `gpu` (private), written once over
//!   each vendor's handful of driver primitives, as Aluminum's `AlGpu*` layer is.
//!
//! The layer is split like cudarc's: the [`Device`] trait's methods are thin and `unsafe` where
//! they take raw addresses (the callers in the backend guarantee sizes and lifetimes); the
//! safe types users touch are the buffers ([`DeviceSlice`]) and the backends' communicators.

pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod gpu;
#[cfg(feature = "hip")]
pub mod hip;
#[cfg(any(feature = "cuda", feature = "hip"))]
mod nccl;
// Not part of the API (hidden from the docs, no stability promise): public only so the crate's
// own device tests and benchmarks can drive the staging pool directly.
#[doc(hidden)]
pub mod pool;

#[cfg(any(feature = "cuda", feature = "hip"))]
pub use nccl::NcclDevice;
pub use pool::PoolStats;

/// The host device's module under its old name.
#[doc(hidden)]
pub use cpu as host;

use std::any::Any;
use std::fmt::Debug;
use std::sync::Arc;
use std::sync::atomic::AtomicU32;

use duralumin_kernels::grid::HostGrid;
use duralumin_kernels::mover::Schedule;
use duralumin_kernels::{Element, KernelName, ReduceKernel, ReduceOp};

use crate::api::error::{Error, Result};

/// An address in a device's memory (a `CUdeviceptr`, a HIP device pointer, or a host address on
/// the host device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DevicePtr(u64);

impl DevicePtr {
    /// The address `addr` (a `CUdeviceptr`, a HIP device pointer, or a host address on the host
    /// device).
    pub const fn new(addr: u64) -> DevicePtr {
        DevicePtr(addr)
    }

    /// The address as a number.
    pub const fn addr(self) -> u64 {
        self.0
    }

    /// The address `bytes` further on.
    pub fn offset(self, bytes: usize) -> DevicePtr {
        DevicePtr(self.0.wrapping_add(bytes as u64))
    }
}

/// The shape of a 2-D copy: `rows` rows of `row_bytes` bytes, consecutive rows `src_pitch`
/// bytes apart in the source and `dst_pitch` bytes apart in the destination. A contiguous copy
/// is one row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy2d {
    /// The bytes copied from each row.
    pub row_bytes: usize,
    /// The number of rows.
    pub rows: usize,
    /// The distance in bytes from one row's start to the next one's in the source.
    pub src_pitch: usize,
    /// The distance in bytes from one row's start to the next one's in the destination.
    pub dst_pitch: usize,
}

impl Copy2d {
    /// One contiguous run of `bytes` bytes.
    pub fn contiguous(bytes: usize) -> Copy2d {
        Copy2d { row_bytes: bytes, rows: 1, src_pitch: bytes, dst_pitch: bytes }
    }

    /// Total bytes moved.
    pub fn bytes(&self) -> usize {
        self.row_bytes * self.rows
    }

    /// Bytes spanned from the first row's start to the last row's end with `pitch`.
    pub fn extent(&self, pitch: usize) -> usize {
        if self.rows == 0 || self.row_bytes == 0 { 0 } else { (self.rows - 1) * pitch + self.row_bytes }
    }
}

/// A 32-bit flag in host-mapped memory: the host reads and writes it through `host`, the
/// device through `device`. Values only grow (modulo 2³²), so waiting is "until at least".
#[derive(Clone, Copy, Debug)]
pub struct Flag {
    pub(crate) host: *const AtomicU32,
    pub(crate) device: DevicePtr,
}

// SAFETY: a Flag is the address of an atomic in memory that the flag pool keeps alive while any
// operation holds the flag; every access through it is atomic.
unsafe impl Send for Flag {}
// SAFETY: as above.
unsafe impl Sync for Flag {}

impl Flag {
    /// The device's address of the flag (what a stream memory operation or the stream-wait
    /// kernel polls).
    pub fn device_ptr(&self) -> DevicePtr {
        self.device
    }

    /// The host view of the flag.
    ///
    /// # Safety
    /// The flag's slot must still be held (not returned to its pool).
    pub(crate) unsafe fn atomic(&self) -> &AtomicU32 {
        // SAFETY: guaranteed by the caller: the slot is live and aligned.
        unsafe { &*self.host }
    }
}

/// What a thread that waits for a device can do meanwhile: poll the host parts of its own
/// operations (the tasks the proxy thread polls too; a task's lock lets one thread poll it at a
/// time). Returns whether any of them is still pending. Used by
/// [`Device::synchronize_helping`] and [`Device::host_wait_helping`].
pub type Help<'a> = &'a mut dyn FnMut() -> bool;

/// When a thread waiting for a device should stop waiting (its communicator was given up,
/// and the work it waits for may never end). `None`: wait until done, blocking in the
/// driver once there is nothing to help with.
pub type GiveUp<'a> = Option<&'a dyn Fn() -> bool>;

/// Something a stream keeps alive until the work queued with it has run (the host device's
/// buffers are reference-counted; GPU allocations are freed in stream order and need nothing).
pub type KeepAlive = Arc<dyn Any + Send + Sync>;

/// A reduction `(T, O)` with its type erased, so a device can run it without knowing the
/// types: the entry names of its GPU kernels and its host bodies.
#[derive(Clone, Copy)]
pub struct ReduceFns {
    pub(crate) elem_size: usize,
    /// `dst[i] = combine(dst[i], src[i])`, parameters `(dst, src, n)`.
    pub(crate) reduce: KernelName,
    /// `dst[i] = finish(dst[i], ranks)`, parameters `(dst, n, ranks)`, if the operator has one.
    pub(crate) finish: Option<KernelName>,
    /// The host bodies, with the C ABI so a driver simulator can run them for user kernels
    /// (see `Driver::offer_host_body`).
    pub(crate) host_reduce: HostReduceFn,
    pub(crate) host_finish: Option<HostFinishFn>,
    /// The number of contributions `finish` divides by (the communicator size).
    pub(crate) ranks: u32,
}

impl Debug for ReduceFns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReduceFns").field("reduce", &self.reduce.as_str()).finish_non_exhaustive()
    }
}

/// A reduction's host body: `dst[..n] = combine(dst[..n], src[..n])`.
pub(crate) type HostReduceFn = unsafe extern "C" fn(*mut u8, *const u8, usize);
/// An operator's finish on the host: `dst[..n] = finish(dst[..n], ranks)`.
pub(crate) type HostFinishFn = unsafe extern "C" fn(*mut u8, usize, u32);

/// `dst[..n] = combine(dst[..n], src[..n])` on the CPU.
///
/// # Safety
/// `dst` and `src` hold `n` aligned `T`s each and do not overlap.
unsafe extern "C" fn host_reduce<T: Element, O: ReduceOp<T>>(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY: guaranteed by the caller.
    let (d, s) =
        unsafe { (std::slice::from_raw_parts_mut(dst.cast::<T>(), n), std::slice::from_raw_parts(src.cast::<T>(), n)) };
    HostGrid::SINGLE.reduce::<T, O>(d, s);
}

/// `dst[..n] = finish(dst[..n], ranks)` on the CPU.
///
/// # Safety
/// `dst` holds `n` aligned `T`s.
unsafe extern "C" fn host_finish<T: Element, O: ReduceOp<T>>(dst: *mut u8, n: usize, ranks: u32) {
    // SAFETY: guaranteed by the caller.
    let d = unsafe { std::slice::from_raw_parts_mut(dst.cast::<T>(), n) };
    HostGrid::SINGLE.finish::<T, O>(d, ranks);
}

impl ReduceFns {
    /// The bytes of one row of `len` elements, checked so that `rows` such rows (what
    /// [`Device::reduce_h2d`] reads) can be addressed: a typed error rather than a wrapped
    /// size. The one place every device computes its reduction rows' size.
    pub(crate) fn row_bytes(&self, rows: usize, len: usize) -> Result<usize> {
        let overflow = |elems: u128| Error::CountOverflow { what: "reduce rows", value: elems };
        let row = len.checked_mul(self.elem_size).ok_or(overflow(len as u128))?;
        row.checked_mul(rows).ok_or(overflow(len as u128 * rows as u128))?;
        Ok(row)
    }

    /// The reduction of `O` over `T`, of `ranks` contributions.
    pub fn of<T: Element, O: ReduceOp<T>>(ranks: u32) -> ReduceFns {
        ReduceFns {
            elem_size: size_of::<T>(),
            reduce: KernelName::reduce::<T, O>(ReduceKernel::Reduce),
            finish: O::HAS_FINISH.then(|| KernelName::reduce::<T, O>(ReduceKernel::Finish)),
            host_reduce: host_reduce::<T, O>,
            host_finish: O::HAS_FINISH.then_some(host_finish::<T, O> as HostFinishFn),
            ranks,
        }
    }
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// A device the HostTransfer backend can stage through. Sealed: the crate implements it for
/// its devices.
pub trait Device: sealed::Sealed + Debug + Send + Sync + 'static {
    /// An in-order queue of work.
    type Stream: Clone + Debug + Send + Sync + 'static;

    /// The device's name in messages (`"host"`, `"cuda:0"`).
    fn name(&self) -> String;

    /// The stream's device ordinal (to reject buffers of another device).
    fn ordinal(&self) -> usize;

    /// Whether the host can read and write the device's memory at its device addresses (the
    /// host device), so collectives can skip staging.
    fn host_accessible(&self) -> bool {
        false
    }

    /// Whether `stream` belongs to this device (and context).
    fn owns(&self, stream: &Self::Stream) -> bool;

    /// A new stream on this device.
    fn new_stream(&self) -> Result<Self::Stream>;

    /// `bytes` of page-locked host memory the device can copy to and from asynchronously, and
    /// read as host-mapped memory (flags live there too). Zero-filled.
    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8>;

    /// Frees memory from [`Device::alloc_pinned`].
    ///
    /// # Safety
    /// `ptr` came from `alloc_pinned(bytes)` on this device, and no queued work uses it.
    unsafe fn free_pinned(&self, ptr: *mut u8, bytes: usize);

    /// The device's address of pinned host memory from [`Device::alloc_pinned`].
    fn mapped(&self, host: *mut u8) -> Result<DevicePtr>;

    /// Queues a copy from device memory to host memory.
    ///
    /// # Safety
    /// The source rows are device memory that stays allocated until the copy has run (or is
    /// kept alive by `keep`); the destination rows are pinned memory no one else touches until
    /// the copy has run.
    unsafe fn copy_d2h(
        &self,
        stream: &Self::Stream,
        dst: *mut u8,
        src: DevicePtr,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()>;

    /// Queues a copy from host memory to device memory.
    ///
    /// # Safety
    /// As [`Device::copy_d2h`], the other way round.
    unsafe fn copy_h2d(
        &self,
        stream: &Self::Stream,
        dst: DevicePtr,
        src: *const u8,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()>;

    /// Queues one copy of several device pieces `(address, bytes)` into host memory at `dst`,
    /// packed back to back in order (a v-collective's blocks in one launch).
    ///
    /// # Safety
    /// As [`Device::copy_d2h`] for every piece; `dst` holds the pieces' total.
    unsafe fn pack_d2h(
        &self,
        stream: &Self::Stream,
        dst: *mut u8,
        pieces: Vec<(DevicePtr, usize)>,
        keep: Vec<KeepAlive>,
    ) -> Result<()>;

    /// Queues one copy of packed host memory at `src` out to several device pieces, the
    /// inverse of [`Device::pack_d2h`].
    ///
    /// # Safety
    /// As [`Device::copy_h2d`] for every piece; the pieces do not overlap.
    unsafe fn unpack_h2d(
        &self,
        stream: &Self::Stream,
        pieces: Vec<(DevicePtr, usize)>,
        src: *const u8,
        keep: Vec<KeepAlive>,
    ) -> Result<()>;

    /// Queues a release store of `value` to `flag`.
    ///
    /// # Safety
    /// The flag's slot stays held until the store has run.
    unsafe fn write_flag(&self, stream: &Self::Stream, flag: Flag, value: u32) -> Result<()>;

    /// Queues a wait, on the device, until `flag` reaches `value` (modulo 2³²: `flag - value`
    /// as `i32` is not negative). Work queued after it does not start before.
    ///
    /// # Safety
    /// The flag's slot stays held until the wait has finished (or is kept alive by `keep`), and
    /// the value is written by the host or by work queued before this wait, never by work
    /// queued after it on any stream (the queue-order rule,
    /// `docs/architecture.md#the-queue-order-rule`).
    unsafe fn wait_flag(&self, stream: &Self::Stream, flag: Flag, value: u32, keep: Option<KeepAlive>) -> Result<()>;

    /// Whether [`Device::queue_mover`] runs here. The staging engine then queues a staged
    /// operation's device side as one mover instead of items per chunk, where the operation is
    /// large enough ([`HostTransferConfig::mover_min_chunks`]).
    ///
    /// [`HostTransferConfig::mover_min_chunks`]: crate::backends::host_transfer::HostTransferConfig::mover_min_chunks
    fn has_mover(&self) -> bool {
        false
    }

    /// The fewest chunks of a staged operation queued as one mover when the communicator's
    /// configuration leaves it to the device; `None`: never (the default).
    fn mover_min_chunks(&self) -> Option<usize> {
        None
    }

    /// Queues a mover: one item that runs a staged operation's whole device side as
    /// `schedule` says ([`duralumin_kernels::mover::run`]: every chunk's copies through the
    /// staging ring and the ring's counters, then `done`), on up to `blocks` blocks that share
    /// its chunks where the device runs several at once (a GPU; the host device runs one).
    /// [`Error::Unsupported`] on a device without one ([`Device::has_mover`]).
    ///
    /// # Safety
    /// As `mover::run` for `schedule`, from the time the mover runs to its end; `keep` holds the
    /// device rows; every counter value the mover waits for is written by the host (which may
    /// itself wait for the mover's own earlier writes), by the mover itself, or by work queued
    /// before it, never by work queued after it (the queue-order rule,
    /// `docs/architecture.md#the-queue-order-rule`).
    unsafe fn queue_mover(
        &self,
        stream: &Self::Stream,
        schedule: Schedule,
        blocks: usize,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        let _ = (stream, schedule, blocks, keep);
        Err(Error::Unsupported("this device has no mover"))
    }

    /// Queues the reduction of `rows` rows of `len` elements, packed back to back in pinned
    /// host memory at `src`, into device memory at `dst`: `dst = finish(row_0 ∘ row_1 ∘ … ∘
    /// row_{rows-1}, op.ranks)`, combined in row order (the order of ranks). GPU devices run the
    /// reduction kernels reading the rows through host-mapped memory.
    ///
    /// # Safety
    /// `dst` holds `len` elements of `op`'s type, `src` `rows * len`; both stay allocated and
    /// untouched by others until the work has run; `src` came from [`Device::alloc_pinned`].
    unsafe fn reduce_h2d(
        &self,
        stream: &Self::Stream,
        dst: DevicePtr,
        src: *const u8,
        rows: usize,
        len: usize,
        op: ReduceFns,
    ) -> Result<()>;

    /// Whether [`Device::reduce_h2d`] can run `op` here: the host device always can; a GPU
    /// when the kernels for its (element, operator) pair are built in or registered (loading
    /// them now, on the calling thread). The answer must be the same on every rank (a pair's
    /// kernels registered on all of them or none), since it decides which MPI calls an
    /// allreduce makes.
    fn can_reduce(&self, op: &ReduceFns) -> bool {
        let _ = op;
        true
    }

    /// Before an operation's first work on `stream`: orders `stream` after the work the buffers
    /// behind `keep` have pending elsewhere (a cudarc buffer's own stream; a host device
    /// buffer's earlier uses on other streams). Nothing by default.
    fn acquire(&self, stream: &Self::Stream, keep: &[KeepAlive]) -> Result<()> {
        let _ = (stream, keep);
        Ok(())
    }

    /// After an operation's last work on `stream`: orders the buffers' own streams after it, so
    /// they may be used or freed there at once (a host device buffer records it as its last
    /// use, which later work on other streams waits for). Nothing by default.
    fn release(&self, stream: &Self::Stream, keep: &[KeepAlive]) -> Result<()> {
        let _ = (stream, keep);
        Ok(())
    }

    /// Makes `waiter` wait for the work queued on `stream` so far, without blocking the host.
    fn join(&self, waiter: &Self::Stream, stream: &Self::Stream) -> Result<()>;

    /// Blocks the calling thread until the work queued on `stream` so far has run.
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;

    /// Whether the work queued on `stream` so far has run, without blocking.
    fn query(&self, stream: &Self::Stream) -> Result<bool>;

    /// [`Device::synchronize`], calling `help` while it waits (and returning early once
    /// `give_up` says so): the calling thread drives the
    /// host parts of its own operations on the stream itself instead of waiting for the proxy
    /// thread to be scheduled (which still drives them too). GPUs poll the stream between
    /// calls, and block in the driver once `help` has nothing left to do; the host device also
    /// runs the stream's queued work on the calling thread whenever its executor thread is not
    /// running it.
    fn synchronize_helping(&self, stream: &Self::Stream, help: Help<'_>, give_up: GiveUp<'_>) -> Result<()> {
        let stop = || give_up.is_some_and(|g| g());
        if crate::common::progress::help_until(|| Ok(stop() || self.query(stream)?), help, std::thread::sleep)? {
            return Ok(());
        }
        match give_up {
            None => self.synchronize(stream),
            Some(g) => {
                let mut backoff = crate::common::progress::Backoff::default();
                while !g() && !self.query(stream)? {
                    backoff.snooze();
                }
                Ok(())
            }
        }
    }

    /// Blocks the calling thread until `flag` reaches `value` (modulo 2³², as in
    /// [`Device::wait_flag`]), whoever writes it. By default it polls with a backoff that ends
    /// in short sleeps; the host device sleeps until one of its flag writes wakes it.
    ///
    /// # Safety
    /// The flag's slot stays held until this returns.
    unsafe fn host_wait(&self, flag: Flag, value: u32) {
        // SAFETY: the caller holds the slot.
        let atomic = unsafe { flag.atomic() };
        let mut backoff = crate::common::progress::Backoff::default();
        while !duralumin_kernels::flag::reached(atomic.load(std::sync::atomic::Ordering::Acquire), value) {
            backoff.snooze();
        }
    }

    /// [`Device::host_wait`], calling `help` while it waits, as
    /// [`Device::synchronize_helping`] does; `stream` is the stream whose work raises the flag
    /// (the host device runs it on the calling thread when its executor is not running it).
    ///
    /// # Safety
    /// As [`Device::host_wait`].
    unsafe fn host_wait_helping(
        &self,
        stream: &Self::Stream,
        flag: Flag,
        value: u32,
        help: Help<'_>,
        give_up: GiveUp<'_>,
    ) {
        let _ = stream;
        // SAFETY: the caller holds the slot.
        let atomic = unsafe { flag.atomic() };
        let reached = || duralumin_kernels::flag::reached(atomic.load(std::sync::atomic::Ordering::Acquire), value);
        let stop = || give_up.is_some_and(|g| g());
        if matches!(crate::common::progress::help_until(|| Ok(reached() || stop()), help, std::thread::sleep), Ok(true))
        {
            return;
        }
        match give_up {
            // SAFETY: as above.
            None => unsafe { self.host_wait(flag, value) },
            Some(g) => {
                let mut backoff = crate::common::progress::Backoff::default();
                while !reached() && !g() {
                    backoff.snooze();
                }
            }
        }
    }

    /// The host has just stored to one of this device's flags. GPUs poll their flags in
    /// hardware, so nothing by default; the host device wakes its streams that sleep in
    /// [`Device::wait_flag`], so a wait ends when the flag is written rather than when a sleep
    /// runs out.
    fn host_wrote_flag(&self) {}
}

/// A buffer in a device's memory that collectives can read (and, through `&mut`, write): the
/// device-side counterpart of rsmpi's `Buffer`/`BufferMut`. Implemented by the devices' buffer
/// types.
pub trait DeviceSlice<D: Device>: sealed::Sealed {
    /// The element type.
    type Elem: Element;
    /// The first element's device address.
    fn device_ptr(&self) -> DevicePtr;
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether there are no elements.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The ordinal of the device that holds the memory.
    fn ordinal(&self) -> usize;
    /// What queued work must hold to keep the memory alive.
    fn keep_alive(&self) -> Option<KeepAlive>;
    /// Called after an operation that reads the buffer is queued (and its stream ordered
    /// before the buffer's own): tells the buffer's own dependency tracking that the work
    /// queued so far reads it. cudarc buffers record their read event on their home stream, so
    /// a kernel that cudarc later queues on any stream to write the buffer waits for the
    /// operation. Nothing by default.
    fn track_read(&self) {}
}

/// Checks that `buf` lives on `device`: [`Error::WrongDevice`], naming it `what`, otherwise.
pub(crate) fn check_on<D: Device, B: DeviceSlice<D> + ?Sized>(device: &D, what: &'static str, buf: &B) -> Result<()> {
    if buf.ordinal() == device.ordinal() {
        return Ok(());
    }
    Err(Error::WrongDevice { what, expected: device.name(), found: format!("device {}", buf.ordinal()) })
}

/// [`check_on`] for an operation's send buffer (where it has one) and receive buffer (where it
/// uses one), named by `names` (`[send, receive]`).
pub(crate) fn check_both<D: Device, S: DeviceSlice<D> + ?Sized, R: DeviceSlice<D> + ?Sized>(
    device: &D,
    names: [&'static str; 2],
    send: Option<&S>,
    recv: Option<&R>,
) -> Result<()> {
    send.map_or(Ok(()), |s| check_on(device, names[0], s))?;
    recv.map_or(Ok(()), |r| check_on(device, names[1], r))
}

/// A [`DeviceSlice`] that operations may write (rsmpi's `BufferMut`): owned buffers and
/// mutable views, not shared views.
pub trait DeviceSliceMut<D: Device>: DeviceSlice<D> {
    /// Called before an operation that writes the buffer is queued, and again after: tells
    /// the buffer's own dependency tracking about the write. For cudarc buffers, the first
    /// call makes the home stream (and so the operation) wait for the reads and writes cudarc
    /// tracked on other streams; the second records the write event on the home stream, after
    /// the operation, so later cudarc work on any stream that uses the buffer waits for it.
    /// Nothing by default.
    fn track_write(&mut self) {}
}

impl<S: sealed::Sealed + ?Sized> sealed::Sealed for &S {}
impl<S: sealed::Sealed + ?Sized> sealed::Sealed for &mut S {}

/// Forwards [`DeviceSlice`] to the buffer behind a reference, so a borrowed buffer (or a
/// `&dyn DeviceSlice`, as [`Collectives`](crate::Collectives) takes) is a buffer too.
macro_rules! forward_device_slice {
    () => {
        type Elem = S::Elem;
        fn device_ptr(&self) -> DevicePtr {
            (**self).device_ptr()
        }
        fn len(&self) -> usize {
            (**self).len()
        }
        fn ordinal(&self) -> usize {
            (**self).ordinal()
        }
        fn keep_alive(&self) -> Option<KeepAlive> {
            (**self).keep_alive()
        }
        fn track_read(&self) {
            (**self).track_read();
        }
    };
}

impl<D: Device, S: DeviceSlice<D> + ?Sized> DeviceSlice<D> for &S {
    forward_device_slice!();
}

impl<D: Device, S: DeviceSlice<D> + ?Sized> DeviceSlice<D> for &mut S {
    forward_device_slice!();
}

impl<D: Device, S: DeviceSliceMut<D> + ?Sized> DeviceSliceMut<D> for &mut S {
    fn track_write(&mut self) {
        (**self).track_write();
    }
}

#[cfg(test)]
mod tests {
    use super::ReduceFns;
    use crate::api::error::Error;

    /// The row size every device's reduction computes: exact where it fits, a typed error
    /// (not a wrapped size) where the row, or the rows together, overflow `usize`.
    #[test]
    fn row_bytes_is_checked() {
        let op = ReduceFns::of::<u64, crate::Sum>(3);
        assert_eq!(op.row_bytes(3, 5).unwrap(), 40);
        assert_eq!(op.row_bytes(0, 5).unwrap(), 40);
        assert_eq!(op.row_bytes(1, usize::MAX / 8).unwrap(), usize::MAX / 8 * 8);
        for (rows, len) in [(1, usize::MAX / 8 + 1), (1, usize::MAX), (2, usize::MAX / 8), (usize::MAX, 2)] {
            match op.row_bytes(rows, len) {
                Err(Error::CountOverflow { what, value }) => {
                    assert_eq!(what, "reduce rows");
                    assert!(value >= len as u128, "{value}");
                }
                other => panic!("rows {rows} of {len}: {other:?}"),
            }
        }
    }
}
