//! The HIP device: AMD GPUs through the HIP runtime (`libamdhip64`), for the HostTransfer
//! backend. Behind the cargo feature `hip`.
//!
//! **Status:** CI compiles, links and lints this module against the HIP runtime and runs its
//! test, which skips without an AMD GPU; it has not been run on AMD hardware. Only the driver
//! primitives are here; everything the HostTransfer backend builds on them (copies, pack/unpack,
//! flags, reductions, keep-alives, kernel cache) is the shared GPU layer, `device::gpu`, which
//! runs in CI on `cudasim` through the CUDA primitives.
//!
//! The FFI is layered as cudarc layers its own: `sys` declares the runtime calls, `result`
//! wraps each in a function returning [`Result`], and this module builds the device on those.
//! It adds:
//!
//! * streams ([`HipStream`]): non-blocking `hipStream_t`s, destroyed when the last handle drops;
//! * pinned staging memory from `hipHostMalloc(Mapped | Portable | Coherent)`: page-locked,
//!   mapped, cached on the CPU (the proxy thread reads it) and fine-grained, so flags and data
//!   change visibly while kernels run;
//! * device buffers ([`HipBuffer`]) that collectives accept as [`DeviceSlice`]s.
//!
//! Kernels come from the AMD code objects embedded by the build ([`crate::device_code`]) for the
//! device's `gcnArchName`, loaded with `hipModuleLoadData` per device and unloaded once the
//! device's queued work has run.
//!
//! # Flags and cyclic waits
//! [`Device::wait_flag`](super::Device::wait_flag) compares cyclically (`flag - value` as `i32` is not negative), like
//! CUDA's `CU_STREAM_WAIT_VALUE_GEQ`. HIP's `hipStreamWaitValueGte` does not: it compares plainly
//! (`*flag >= value`; ROCm's implementation converts to unsigned, an AQL barrier-value packet
//! would compare signed). So a wait on the [`FlagPath::StreamMemOps`] path reads the flag when
//! it is queued and
//! * queues nothing when the flag has already reached the value;
//! * uses `hipStreamWaitValue32(Gte)` when the flag is below the value and the value is at most
//!   [`MEMOP_WAIT_MAX`]: then, as long as the flag runs less than 2²⁴ past the value before the
//!   device sees it, every value it passes through compares the same signed, unsigned and
//!   cyclically;
//! * otherwise (a wait across a wrap of the counter, or near one) launches the `stream_wait`
//!   kernel, which compares cyclically.
//!
//! # Hardware queues
//! ROCm maps streams onto a few hardware queues (`GPU_MAX_HW_QUEUES`, 4 by default), so the
//! queue-order rule (`docs/architecture.md#the-queue-order-rule`) applies in full.
//!
//! # Errors
//! A failing HIP call is [`Error::Device`] with the call's name and HIP's error string. Errors in
//! `Drop` (destroying a stream or an event, freeing memory) cannot be returned there; they are
//! recorded and returned by the next call of a [`HipDevice`] with the same ordinal, as cudarc
//! does.

use std::ffi::{CString, c_int, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::Arc;

use duralumin_kernels::Element;

pub use super::gpu::FlagPath;
use super::gpu::{Direction, Driver, Gpu, Shape, gpu_device, record};
use super::{DevicePtr, DeviceSlice, DeviceSliceMut, KeepAlive, sealed};
use crate::api::error::{Error, Result};
use crate::device_code::KernelModule;

mod result;
pub use result::HipError;
mod sys;

/// Keeps the error of a `Drop` for the next call on device `ordinal`.
fn record_hip(ordinal: usize, result: Result<()>) {
    record(Hip::API, ordinal, result);
}

/// Number of HIP devices; 0 when the runtime finds none (no GPU, no driver).
pub fn device_count() -> usize {
    result::device_count().unwrap_or(0)
}

/// Whether the HIP runtime finds at least one device (tests and callers skip the HIP device
/// otherwise).
pub fn driver_present() -> bool {
    device_count() > 0
}

/// Largest value a [`FlagPath::StreamMemOps`] wait hands to `hipStreamWaitValue32`: 2²⁴ below
/// `i32::MAX`, so a flag may run 2²⁴ past the value before signed, unsigned and cyclic
/// comparisons could disagree. Waits for larger values use the `stream_wait` kernel.
pub const MEMOP_WAIT_MAX: u32 = i32::MAX as u32 - (1 << 24);

/// An AMD GPU for the HostTransfer backend: its ordinal, architecture and flag path.
///
/// Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct HipDevice {
    gpu: Gpu<Hip>,
}

impl fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipDevice")
            .field("ordinal", &self.gpu.driver().ordinal)
            .field("arch", &self.gpu.driver().arch)
            .field("flags", &self.gpu.flag_path())
            .finish_non_exhaustive()
    }
}

impl HipDevice {
    /// HIP device `ordinal`, with the flag path chosen automatically.
    ///
    /// # Errors
    /// [`Error::Device`] when the runtime finds no such device (or none at all).
    pub fn new(ordinal: usize) -> Result<Self> {
        Self::with_flag_path(ordinal, FlagPath::Auto)
    }

    /// HIP device `ordinal` with flags written and awaited by `flags`.
    ///
    /// # Errors
    /// [`Error::Device`] when the runtime finds no such device; [`Error::KernelsUnavailable`]
    /// for [`FlagPath::Kernels`] (or [`FlagPath::Auto`] choosing it) when the builtin kernels
    /// were not built for the device's architecture.
    pub fn with_flag_path(ordinal: usize, flags: FlagPath) -> Result<Self> {
        let count = result::device_count()?;
        if ordinal >= count {
            return Err(Error::device("hipSetDevice", format!("no HIP device {ordinal}: the runtime finds {count}")));
        }
        result::set_device(ordinal)?;
        let arch = result::arch_name(ordinal)?;
        let flags = match flags {
            // A runtime that does not know the attribute has no stream memory operations to offer.
            FlagPath::Auto if result::attribute(ordinal, sys::ATTR_CAN_USE_STREAM_WAIT_VALUE).unwrap_or(0) != 0 => {
                FlagPath::StreamMemOps
            }
            FlagPath::Auto => FlagPath::Kernels,
            other => other,
        };
        let compute_units =
            u32::try_from(result::attribute(ordinal, sys::ATTR_MULTIPROCESSOR_COUNT)?).unwrap_or(0).max(1);
        // A device that reports no limit gets the largest pitch a C `int` holds.
        let max_pitch = match usize::try_from(result::attribute(ordinal, sys::ATTR_MAX_PITCH).unwrap_or(0)) {
            Ok(p) if p > 0 => p,
            _ => c_int::MAX as usize,
        };
        Ok(HipDevice { gpu: Gpu::new(Hip { ordinal, arch: arch.into() }, flags, compute_units, max_pitch)? })
    }

    /// The flag path in use (never [`FlagPath::Auto`]).
    pub fn flag_path(&self) -> FlagPath {
        self.gpu.flag_path()
    }

    /// The device's architecture name (`gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`).
    pub fn arch(&self) -> &str {
        &self.gpu.driver().arch
    }

    /// A zero-filled buffer of `len` elements in the device's memory (`hipMalloc`; an empty
    /// buffer allocates nothing).
    pub fn alloc<T: Element>(&self, len: usize) -> Result<HipBuffer<T>> {
        let bytes =
            len.checked_mul(size_of::<T>()).ok_or(Error::CountOverflow { what: "HIP buffer", value: len as u128 })?;
        self.gpu.bind()?;
        let ordinal = self.gpu.driver().ordinal;
        if bytes == 0 {
            return Ok(HipBuffer { ptr: null_mut(), len, ordinal, _t: PhantomData });
        }
        let buf = HipBuffer { ptr: result::malloc(bytes)?, len, ordinal, _t: PhantomData };
        // SAFETY: `ptr` is a fresh allocation of `bytes` bytes that nothing else uses.
        unsafe { result::memset(buf.ptr, 0, bytes) }?;
        // `hipMemset` runs on the null stream, which the device's (non-blocking) streams do not
        // wait for: finish it before any of them can use the buffer.
        // SAFETY: the null stream is always valid.
        unsafe { result::stream_synchronize(null_mut()) }?;
        Ok(buf)
    }

    /// A buffer holding a copy of `data`, copied on `stream` after the work queued there so far;
    /// returns when the copy is done.
    pub fn upload<T: Element>(&self, stream: &HipStream, data: &[T]) -> Result<HipBuffer<T>> {
        let mut buf = self.alloc::<T>(data.len())?;
        buf.write(stream, data)?;
        Ok(buf)
    }
}

gpu_device!(HipDevice, HipStream, HipEvent);

/// The HIP runtime primitives, for one device.
#[derive(Clone)]
pub(crate) struct Hip {
    ordinal: usize,
    arch: Arc<str>,
}

/// A loaded code object, unloaded on drop.
pub(crate) struct Module {
    raw: sys::hipModule_t,
    ordinal: usize,
}

// SAFETY: module handles are process-wide runtime objects, usable from any thread; they are
// only handed to HIP calls.
unsafe impl Send for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the GPU layer drops modules only once the device's queued work has run.
        record_hip(self.ordinal, unsafe { result::module_unload(self.raw) });
    }
}

/// A kernel of a loaded code object.
#[derive(Clone, Copy)]
pub(crate) struct Function(sys::hipFunction_t);

// SAFETY: as for `Module`.
unsafe impl Send for Function {}

/// Host callback queued by [`Hip::host_fn`].
///
/// # Safety
/// `payload` is what [`super::gpu::released`] expects, passed exactly once.
unsafe extern "C" fn release(_stream: sys::hipStream_t, _status: sys::Status, payload: *mut c_void) {
    // SAFETY: guaranteed by the caller (the runtime passes back what `host_fn` queued).
    unsafe { super::gpu::released(payload) }
}

impl Driver for Hip {
    type Stream = HipStream;
    type Module = Module;
    type Function = Function;
    type Image = &'static [u8];
    type Event = HipEvent;

    const API: &'static str = "hip";
    const HOST_FN: &'static str = "hipStreamAddCallback";

    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn owns(&self, stream: &HipStream) -> bool {
        stream.inner.ordinal == self.ordinal
    }

    fn describe(stream: &HipStream) -> String {
        format!("hip:{}", stream.inner.ordinal)
    }

    fn same(a: &HipStream, b: &HipStream) -> bool {
        Arc::ptr_eq(&a.inner, &b.inner)
    }

    fn bind(&self) -> Result<()> {
        result::set_device(self.ordinal)
    }

    fn new_stream(&self) -> Result<HipStream> {
        let raw = result::stream_create()?;
        Ok(HipStream { inner: Arc::new(StreamInner { raw, ordinal: self.ordinal }) })
    }

    fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        result::host_malloc(bytes)
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        result::set_device(self.ordinal)?;
        // SAFETY: the caller guarantees `ptr` came from `host_alloc` and no queued work uses it.
        unsafe { result::host_free(ptr.cast()) }
    }

    fn raw_stream(stream: &HipStream) -> *mut c_void {
        stream.raw().cast()
    }

    fn alloc_async(&self, stream: &HipStream, bytes: usize) -> Result<DevicePtr> {
        self.bind()?;
        // SAFETY: a live stream of this device, now current.
        unsafe { result::malloc_async(bytes, stream.raw()) }.map(DevicePtr)
    }

    unsafe fn free_async(&self, stream: &HipStream, ptr: DevicePtr) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { result::free_async(ptr.0, stream.raw()) }
    }

    unsafe fn memcpy_d2d(&self, stream: &HipStream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe {
            result::memcpy_async(
                dst.0 as *mut c_void,
                src.0 as *const c_void,
                bytes,
                sys::DEVICE_TO_DEVICE,
                stream.raw(),
            )
        }
    }

    fn host_device_ptr(&self, host: *mut u8) -> Result<DevicePtr> {
        result::host_get_device_pointer(host).map(DevicePtr)
    }

    unsafe fn memcpy(
        &self,
        stream: &HipStream,
        dir: Direction,
        host: *mut u8,
        device: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        let (dst, src, kind) = copy_sides(dir, host, device);
        // SAFETY: forwarded from the caller.
        unsafe { result::memcpy_async(dst, src, bytes, kind, stream.raw()) }
    }

    unsafe fn memcpy_2d(
        &self,
        stream: &HipStream,
        dir: Direction,
        host: *mut u8,
        host_pitch: usize,
        device: DevicePtr,
        device_pitch: usize,
        row_bytes: usize,
        rows: usize,
    ) -> Result<()> {
        let (dst, src, kind) = copy_sides(dir, host, device);
        let (dst_pitch, src_pitch) = match dir {
            Direction::ToHost => (host_pitch, device_pitch),
            Direction::ToDevice => (device_pitch, host_pitch),
        };
        // SAFETY: forwarded from the caller.
        unsafe { result::memcpy_2d_async(dst, dst_pitch, src, src_pitch, row_bytes, rows, kind, stream.raw()) }
    }

    fn find(&self, entry: &str) -> Result<(&'static [u8], usize, &'static str)> {
        let kernel = crate::device_code::find_code_object(entry, &self.arch)?;
        let elf = kernel.code_object.elf;
        Ok((elf, elf.as_ptr() as usize, kernel.entry))
    }

    fn has_image(&self, module: &KernelModule) -> bool {
        module.code_object(&self.arch).is_some()
    }

    fn load_module(&self, elf: &'static [u8]) -> Result<Module> {
        // SAFETY: the image is a complete code object for this device's architecture (found by
        // `gcnArchName`) that lives for the whole program.
        let raw = unsafe { result::module_load_data(elf.as_ptr().cast()) }?;
        Ok(Module { raw, ordinal: self.ordinal })
    }

    fn get_function(&self, module: &Module, entry: &str) -> Result<Function> {
        let name = CString::new(entry)
            .map_err(|_| Error::KernelsUnavailable(format!("kernel name {entry:?} contains a NUL byte")))?;
        // SAFETY: the module is loaded (it unloads on drop).
        unsafe { result::module_get_function(module.raw, &name) }.map(Function)
    }

    unsafe fn launch(
        &self,
        stream: &HipStream,
        function: &Function,
        shape: Shape,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        if shape.together && shape.blocks > 1 {
            return Err(Error::Unsupported(
                "cooperative launches of module kernels (hipModuleLaunchCooperativeKernel is newer than the HIP \
                 this was built against)",
            ));
        }
        // SAFETY: forwarded from the caller.
        unsafe { result::module_launch_kernel(function.0, shape.blocks, shape.threads, stream.raw(), args) }
    }

    unsafe fn host_fn(&self, stream: &HipStream, payload: *mut c_void) -> Result<()> {
        // SAFETY: `release` hands `payload` back exactly once, and calls no HIP function.
        unsafe { result::stream_add_callback(stream.raw(), release, payload) }
    }

    unsafe fn write_value(&self, stream: &HipStream, flag: DevicePtr, value: u32) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { result::stream_write_value(stream.raw(), flag.0 as *mut c_void, value) }
    }

    unsafe fn wait_value(&self, stream: &HipStream, flag: DevicePtr, value: u32) -> Result<()> {
        // SAFETY: forwarded from the caller; `wait_value_is_exact` made the plain comparison
        // agree with the cyclic one.
        unsafe { result::stream_wait_value_gte(stream.raw(), flag.0 as *mut c_void, value) }
    }

    /// The flag is below the value and the value at most [`MEMOP_WAIT_MAX`] (see the module
    /// docs).
    fn wait_value_is_exact(now: u32, value: u32) -> bool {
        now < value && value <= MEMOP_WAIT_MAX
    }

    fn new_event(&self) -> Result<HipEvent> {
        result::set_device(self.ordinal)?;
        Ok(HipEvent { raw: result::event_create()?, ordinal: self.ordinal })
    }

    fn record_event(&self, event: &HipEvent, stream: &HipStream) -> Result<()> {
        // SAFETY: a live event and stream of this device.
        unsafe { result::event_record(event.raw, stream.raw()) }
    }

    fn event_done(&self, event: &HipEvent) -> Result<bool> {
        // SAFETY: a live event.
        unsafe { result::event_query(event.raw) }
    }

    fn wait_event(&self, waiter: &HipStream, event: &HipEvent) -> Result<()> {
        // SAFETY: a live stream and event of this device.
        unsafe { result::stream_wait_event(waiter.raw(), event.raw) }
    }

    fn join(&self, waiter: &HipStream, stream: &HipStream) -> Result<()> {
        let event = HipEvent { raw: result::event_create()?, ordinal: self.ordinal };
        // SAFETY: a live event and streams of this device.
        unsafe { result::event_record(event.raw, stream.raw()) }?;
        // SAFETY: as above; the wait keeps what it needs after the event is destroyed.
        unsafe { result::stream_wait_event(waiter.raw(), event.raw) }
    }

    fn synchronize(&self, stream: &HipStream) -> Result<()> {
        // SAFETY: a live stream handle.
        unsafe { result::stream_synchronize(stream.raw()) }
    }

    fn query(&self, stream: &HipStream) -> Result<bool> {
        // SAFETY: a live stream handle.
        unsafe { result::stream_query(stream.raw()) }
    }

    fn drained(&self, stream: &HipStream) -> bool {
        // SAFETY: a live stream handle (held by the caller).
        result::set_device(self.ordinal).is_ok() && unsafe { result::stream_synchronize(stream.raw()) }.is_ok()
    }

    fn synchronize_all(&self) -> Result<()> {
        result::set_device(self.ordinal)?;
        result::device_synchronize()
    }
}

/// `(dst, src, kind)` of a copy between `host` and `device` memory.
fn copy_sides(dir: Direction, host: *mut u8, device: DevicePtr) -> (*mut c_void, *const c_void, c_int) {
    let device = device.0 as *mut c_void;
    match dir {
        Direction::ToHost => (host.cast(), device, sys::DEVICE_TO_HOST),
        Direction::ToDevice => (device, host as *const c_void, sys::HOST_TO_DEVICE),
    }
}

/// A stream of a [`HipDevice`]: a non-blocking `hipStream_t`. Cloning gives another handle to
/// the same stream; it is destroyed when the last handle drops.
#[derive(Clone)]
pub struct HipStream {
    inner: Arc<StreamInner>,
}

struct StreamInner {
    raw: sys::hipStream_t,
    ordinal: usize,
}

// SAFETY: a HIP stream handle may be used from any thread; the runtime synchronizes access.
unsafe impl Send for StreamInner {}
// SAFETY: as above.
unsafe impl Sync for StreamInner {}

impl Drop for StreamInner {
    fn drop(&mut self) {
        let destroyed = result::set_device(self.ordinal).and_then(|()| {
            // SAFETY: the last handle is gone, so nothing queues on the stream any more; the
            // runtime finishes (or releases after) the work queued on it.
            unsafe { result::stream_destroy(self.raw) }
        });
        record_hip(self.ordinal, destroyed);
    }
}

impl fmt::Debug for HipStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipStream").field("ordinal", &self.inner.ordinal).field("raw", &self.inner.raw).finish()
    }
}

impl HipStream {
    /// The ordinal of the device the stream belongs to.
    pub fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    /// The `hipStream_t`, to queue one's own work on the stream; valid while a handle to the
    /// stream lives.
    pub fn raw(&self) -> hip_runtime_sys::hipStream_t {
        self.inner.raw
    }
}

/// An event of a HIP device, recorded on one stream for another (or the host) to wait on;
/// destroyed on drop.
#[derive(Debug)]
pub struct HipEvent {
    raw: sys::hipEvent_t,
    ordinal: usize,
}

// SAFETY: a HIP event handle may be recorded, queried, waited on and destroyed from any thread.
unsafe impl Send for HipEvent {}
// SAFETY: as above; every use goes through the runtime, which synchronizes.
unsafe impl Sync for HipEvent {}

impl Drop for HipEvent {
    fn drop(&mut self) {
        // SAFETY: created by `event_create`; a wait queued on it keeps what it needs.
        record_hip(self.ordinal, unsafe { result::event_destroy(self.raw) });
    }
}

/// A buffer of `len` `T`s in a HIP device's memory (`hipMalloc`), usable by collectives as a
/// [`DeviceSlice`].
///
/// Its [`DeviceSlice::keep_alive`] is `None`: instead, dropping the buffer synchronizes the whole
/// device (`hipDeviceSynchronize`) before `hipFree`, so work queued on any stream that still uses
/// it has finished (a drop blocks while a stream of the device waits for a flag).
pub struct HipBuffer<T> {
    ptr: *mut c_void,
    len: usize,
    ordinal: usize,
    _t: PhantomData<T>,
}

// SAFETY: the buffer owns device memory that the host never dereferences; device accesses are
// ordered by streams.
unsafe impl<T: Send> Send for HipBuffer<T> {}
// SAFETY: as above; `&HipBuffer` only reads (or queues reads of) the memory.
unsafe impl<T: Sync> Sync for HipBuffer<T> {}

impl<T> fmt::Debug for HipBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipBuffer").field("len", &self.len).field("ordinal", &self.ordinal).finish()
    }
}

impl<T> Drop for HipBuffer<T> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        let freed = result::set_device(self.ordinal).and_then(|()| {
            result::device_synchronize()?;
            // SAFETY: `ptr` came from `hipMalloc` and no queued work uses it any more.
            unsafe { result::free(self.ptr) }
        });
        record_hip(self.ordinal, freed);
    }
}

impl<T: Element> HipBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check_stream(&self, stream: &HipStream) -> Result<()> {
        if stream.ordinal() == self.ordinal {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what: "stream",
                expected: format!("hip:{}", self.ordinal),
                found: format!("hip:{}", stream.ordinal()),
            })
        }
    }

    /// A blocking copy of `bytes` on `stream`, after the work queued there so far.
    ///
    /// # Safety
    /// `dst` and `src` hold `bytes` bytes, one of them this buffer's memory, the other host
    /// memory the caller owns until this returns.
    unsafe fn copy_now(&self, stream: &HipStream, dst: *mut c_void, src: *const c_void, kind: c_int) -> Result<()> {
        self.check_stream(stream)?;
        let bytes = self.len * size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        result::set_device(self.ordinal)?;
        // SAFETY: guaranteed by the caller; the copy is finished before this returns.
        unsafe { result::memcpy_async(dst, src, bytes, kind, stream.raw()) }?;
        // SAFETY: a live stream handle.
        unsafe { result::stream_synchronize(stream.raw()) }
    }

    /// The contents, copied on `stream` after the work queued there so far; returns when the
    /// copy is done.
    pub fn download(&self, stream: &HipStream) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); self.len];
        // SAFETY: `out` holds as many bytes as the buffer and outlives the copy.
        unsafe { self.copy_now(stream, out.as_mut_ptr().cast(), self.ptr, sys::DEVICE_TO_HOST) }?;
        Ok(out)
    }

    /// Overwrites the buffer with `data` (equal lengths), copied on `stream` after the work
    /// queued there so far; returns when the copy is done.
    pub fn write(&mut self, stream: &HipStream, data: &[T]) -> Result<()> {
        crate::common::check::len("HipBuffer::write data", data.len(), self.len)?;
        // SAFETY: `data` holds as many bytes as the buffer and outlives the copy.
        unsafe { self.copy_now(stream, self.ptr, data.as_ptr().cast(), sys::HOST_TO_DEVICE) }
    }
}

impl<T> sealed::Sealed for HipBuffer<T> {}

impl<T: Element> DeviceSlice<HipDevice> for HipBuffer<T> {
    type Elem = T;

    fn device_ptr(&self) -> DevicePtr {
        DevicePtr(self.ptr as u64)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn ordinal(&self) -> usize {
        self.ordinal
    }

    fn keep_alive(&self) -> Option<KeepAlive> {
        None
    }
}

impl<T: Element> DeviceSliceMut<HipDevice> for HipBuffer<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memop_waits_only_where_plain_and_cyclic_comparisons_agree() {
        assert!(<Hip as Driver>::wait_value_is_exact(0, 1));
        assert!(<Hip as Driver>::wait_value_is_exact(5, MEMOP_WAIT_MAX));
        assert!(!<Hip as Driver>::wait_value_is_exact(5, MEMOP_WAIT_MAX + 1));
        // Across a wrap of the counter: the flag is numerically above the value.
        assert!(!<Hip as Driver>::wait_value_is_exact(u32::MAX - 1, 2));
    }

    #[test]
    fn no_device_is_an_error_not_a_panic() {
        if driver_present() {
            return;
        }
        assert!(matches!(HipDevice::new(0), Err(Error::Device { .. })));
        assert_eq!(device_count(), 0);
    }
}
