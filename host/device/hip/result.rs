//! Thin wrappers over [`super::sys`], as cudarc's `result` layer wraps its `sys`: one function
//! per runtime call, its status turned into a [`Result`] that names the call and carries HIP's
//! error string.

use std::ffi::{CStr, c_int, c_uint, c_void};
use std::ptr::null_mut;

use super::sys::{self, Status};
use crate::api::error::{Error, Result};

/// A failed HIP call's `hipError_t`: the source of its [`Error::Device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HipError(pub c_int);

impl std::fmt::Display for HipError {
    /// HIP's text for the status.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // SAFETY: `hipGetErrorString` accepts any code and returns a static string (or null).
        let text = unsafe { sys::hipGetErrorString(self.0) };
        if text.is_null() {
            return write!(f, "HIP error {}", self.0);
        }
        // SAFETY: a non-null result is a NUL-terminated static string.
        let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
        write!(f, "{text} (hipError_t {})", self.0)
    }
}

impl std::error::Error for HipError {}

/// `Ok` for `hipSuccess`, else [`Error::Device`] naming `call`.
fn check(call: &'static str, status: Status) -> Result<()> {
    if status == sys::SUCCESS { Ok(()) } else { Err(Error::device_from(call, HipError(status))) }
}

/// A device ordinal as HIP takes it.
fn device(ordinal: usize) -> c_int {
    c_int::try_from(ordinal).unwrap_or(c_int::MAX)
}

/// `hipGetDeviceCount`.
pub(super) fn device_count() -> Result<usize> {
    let mut count: c_int = 0;
    // SAFETY: writes one int.
    check("hipGetDeviceCount", unsafe { sys::hipGetDeviceCount(&mut count) })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// `hipSetDevice`: the calling thread's current device (HIP keeps it per thread).
pub(super) fn set_device(ordinal: usize) -> Result<()> {
    let ordinal =
        c_int::try_from(ordinal).map_err(|_| Error::device("hipSetDevice", format!("no HIP device {ordinal}")))?;
    // SAFETY: plain call; an invalid ordinal is reported as an error.
    check("hipSetDevice", unsafe { sys::hipSetDevice(ordinal) })
}

/// `hipDeviceSynchronize` of the current device.
pub(super) fn device_synchronize() -> Result<()> {
    // SAFETY: no arguments; waits for the current device's work.
    check("hipDeviceSynchronize", unsafe { sys::hipDeviceSynchronize() })
}

/// `hipDeviceGetAttribute`.
pub(super) fn attribute(ordinal: usize, attr: c_int) -> Result<c_int> {
    let mut value: c_int = 0;
    // SAFETY: writes one int; an invalid device or attribute is reported as an error.
    check("hipDeviceGetAttribute", unsafe { sys::hipDeviceGetAttribute(&mut value, attr, device(ordinal)) })?;
    Ok(value)
}

/// The device's `gcnArchName` (`hipGetDeviceProperties`), e.g. `gfx90a:sramecc+:xnack-`.
pub(super) fn arch_name(ordinal: usize) -> Result<String> {
    /// The properties with room to spare, in case a runtime writes a longer structure than the
    /// bindings describe (the `gcnArchName` offset is the same in every layout that
    /// `hipGetDeviceProperties` fills).
    #[repr(C)]
    struct Props {
        props: sys::hipDeviceProp_t,
        _slack: [u8; 4096],
    }
    // SAFETY: every field of the properties (integers, arrays, raw pointers, a bitfield) is
    // valid when zero.
    let mut props: Box<Props> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: writes at most the properties structure, which fits in `Props`.
    check("hipGetDeviceProperties", unsafe { sys::hipGetDeviceProperties(&mut props.props, device(ordinal)) })?;
    let bytes: Vec<u8> = props.props.gcnArchName.iter().take_while(|&&c| c != 0).map(|&c| c.to_ne_bytes()[0]).collect();
    let arch = String::from_utf8_lossy(&bytes).into_owned();
    if arch.is_empty() {
        return Err(Error::device("hipGetDeviceProperties", format!("device {ordinal} reports no gcnArchName")));
    }
    Ok(arch)
}

/// `hipStreamCreateWithFlags(NonBlocking)` on the current device.
pub(super) fn stream_create() -> Result<sys::hipStream_t> {
    let mut raw: sys::hipStream_t = null_mut();
    // SAFETY: writes one handle.
    check("hipStreamCreateWithFlags", unsafe { sys::hipStreamCreateWithFlags(&mut raw, sys::STREAM_NON_BLOCKING) })?;
    Ok(raw)
}

/// `hipStreamDestroy`.
///
/// # Safety
/// `stream` is a live stream no one queues on any more.
pub(super) unsafe fn stream_destroy(stream: sys::hipStream_t) -> Result<()> {
    // SAFETY: guaranteed by the caller; the runtime finishes (or releases after) queued work.
    check("hipStreamDestroy", unsafe { sys::hipStreamDestroy(stream) })
}

/// `hipStreamSynchronize`.
///
/// # Safety
/// `stream` is a live stream (or null, the null stream).
pub(super) unsafe fn stream_synchronize(stream: sys::hipStream_t) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(stream) })
}

/// `hipStreamQuery`: whether the stream's queued work has run.
///
/// # Safety
/// `stream` is a live stream.
pub(super) unsafe fn stream_query(stream: sys::hipStream_t) -> Result<bool> {
    // SAFETY: guaranteed by the caller.
    match unsafe { sys::hipStreamQuery(stream) } {
        sys::NOT_READY => Ok(false),
        status => check("hipStreamQuery", status).map(|()| true),
    }
}

/// `hipStreamWaitEvent`.
///
/// # Safety
/// A live stream and event.
pub(super) unsafe fn stream_wait_event(stream: sys::hipStream_t, event: sys::hipEvent_t) -> Result<()> {
    // SAFETY: guaranteed by the caller; the wait keeps what it needs after the event goes.
    check("hipStreamWaitEvent", unsafe { sys::hipStreamWaitEvent(stream, event, 0) })
}

/// `hipStreamAddCallback`.
///
/// # Safety
/// A live stream; `callback` may run on any runtime thread with `data`, and must not call HIP.
pub(super) unsafe fn stream_add_callback(
    stream: sys::hipStream_t,
    callback: sys::StreamCallback,
    data: *mut c_void,
) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipStreamAddCallback", unsafe { sys::hipStreamAddCallback(stream, Some(callback), data, 0) })
}

/// `hipStreamWaitValue32(Gte, mask ~0)`: plain, not cyclic, comparison.
///
/// # Safety
/// `ptr` is mapped host memory that stays allocated until the wait has finished.
pub(super) unsafe fn stream_wait_value_gte(stream: sys::hipStream_t, ptr: *mut c_void, value: u32) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipStreamWaitValue32", unsafe {
        sys::hipStreamWaitValue32(stream, ptr, value, sys::WAIT_VALUE_GTE, u32::MAX)
    })
}

/// `hipStreamWriteValue32`, after the work queued before it.
///
/// # Safety
/// `ptr` is mapped host memory that stays allocated until the write has run.
pub(super) unsafe fn stream_write_value(stream: sys::hipStream_t, ptr: *mut c_void, value: u32) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipStreamWriteValue32", unsafe { sys::hipStreamWriteValue32(stream, ptr, value, 0) })
}

/// `hipEventCreateWithFlags(DisableTiming)` on the current device.
pub(super) fn event_create() -> Result<sys::hipEvent_t> {
    let mut raw: sys::hipEvent_t = null_mut();
    // SAFETY: writes one handle.
    check("hipEventCreateWithFlags", unsafe { sys::hipEventCreateWithFlags(&mut raw, sys::EVENT_DISABLE_TIMING) })?;
    Ok(raw)
}

/// `hipEventRecord`.
///
/// # Safety
/// A live event and stream of the same device.
pub(super) unsafe fn event_record(event: sys::hipEvent_t, stream: sys::hipStream_t) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipEventRecord", unsafe { sys::hipEventRecord(event, stream) })
}

/// `hipEventQuery`: whether the work the event was recorded after has run.
///
/// # Safety
/// A live event.
pub(super) unsafe fn event_query(event: sys::hipEvent_t) -> Result<bool> {
    // SAFETY: guaranteed by the caller.
    match unsafe { sys::hipEventQuery(event) } {
        sys::NOT_READY => Ok(false),
        status => check("hipEventQuery", status).map(|()| true),
    }
}

/// `hipEventDestroy`.
///
/// # Safety
/// A live event no one uses any more (queued waits keep what they need).
pub(super) unsafe fn event_destroy(event: sys::hipEvent_t) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipEventDestroy", unsafe { sys::hipEventDestroy(event) })
}

/// `hipMalloc` of `bytes` (at least 1) on the current device.
pub(super) fn malloc(bytes: usize) -> Result<*mut c_void> {
    let mut ptr = null_mut();
    // SAFETY: writes one pointer.
    check("hipMalloc", unsafe { sys::hipMalloc(&mut ptr, bytes) })?;
    Ok(ptr)
}

/// `hipFree`.
///
/// # Safety
/// `ptr` came from `hipMalloc` and no queued work uses it.
pub(super) unsafe fn free(ptr: *mut c_void) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipFree", unsafe { sys::hipFree(ptr) })
}

/// `hipMemset` (on the null stream, which non-blocking streams do not wait for).
///
/// # Safety
/// `ptr` holds `bytes` bytes of device memory nothing else uses meanwhile.
pub(super) unsafe fn memset(ptr: *mut c_void, value: u8, bytes: usize) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipMemset", unsafe { sys::hipMemset(ptr, c_int::from(value), bytes) })
}

/// `hipHostMalloc(Mapped | Portable | Coherent)`: page-locked, mapped, cached on the CPU (the
/// proxy thread reads it) and fine-grained (flags and data change visibly while kernels run).
pub(super) fn host_malloc(bytes: usize) -> Result<*mut u8> {
    let mut ptr = null_mut();
    // SAFETY: writes one pointer.
    check("hipHostMalloc", unsafe { sys::hipHostMalloc(&mut ptr, bytes, sys::HOST_MALLOC_FLAGS) })?;
    if ptr.is_null() {
        return Err(Error::OutOfMemory { what: "pinned host memory (hipHostMalloc)", bytes });
    }
    Ok(ptr.cast())
}

/// `hipHostFree`.
///
/// # Safety
/// `ptr` came from `hipHostMalloc` and no queued work uses it.
pub(super) unsafe fn host_free(ptr: *mut c_void) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipHostFree", unsafe { sys::hipHostFree(ptr) })
}

/// `hipHostGetDevicePointer`: the device's address of mapped host memory.
pub(super) fn host_get_device_pointer(host: *mut u8) -> Result<u64> {
    let mut ptr = null_mut();
    // SAFETY: writes one pointer; an address outside `hipHostMalloc` memory is an error.
    check("hipHostGetDevicePointer", unsafe { sys::hipHostGetDevicePointer(&mut ptr, host.cast(), 0) })?;
    Ok(ptr as u64)
}

/// `hipMemcpyAsync`.
///
/// # Safety
/// Both ranges hold `bytes` bytes and stay valid until the copy has run; the host side is
/// pinned (so the copy is asynchronous) or outlives a synchronize of the stream.
pub(super) unsafe fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: c_int,
    stream: sys::hipStream_t,
) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipMemcpyAsync", unsafe { sys::hipMemcpyAsync(dst, src, bytes, kind, stream) })
}

/// `hipMallocAsync` of `bytes` (at least 1) in stream order.
///
/// # Safety
/// `stream` is a live stream of the current device.
pub(super) unsafe fn malloc_async(bytes: usize, stream: sys::hipStream_t) -> Result<u64> {
    let mut ptr: *mut c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer to a local; the stream is live (caller).
    let status = unsafe { sys::hipMallocAsync(&mut ptr, bytes.max(1), stream) };
    check("hipMallocAsync", status)?;
    Ok(ptr as u64)
}

/// `hipFreeAsync`.
///
/// # Safety
/// `ptr` came from [`malloc_async`] and no work queued later uses it.
pub(super) unsafe fn free_async(ptr: u64, stream: sys::hipStream_t) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipFreeAsync", unsafe { sys::hipFreeAsync(ptr as *mut c_void, stream) })
}

/// `hipMemcpy2DAsync`.
///
/// # Safety
/// As [`memcpy_async`], for every row.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn memcpy_2d_async(
    dst: *mut c_void,
    dst_pitch: usize,
    src: *const c_void,
    src_pitch: usize,
    width: usize,
    height: usize,
    kind: c_int,
    stream: sys::hipStream_t,
) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipMemcpy2DAsync", unsafe {
        sys::hipMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height, kind, stream)
    })
}

/// `hipModuleLoadData` on the current device.
///
/// # Safety
/// `image` is a complete code object for the device's architecture that outlives the module.
pub(super) unsafe fn module_load_data(image: *const c_void) -> Result<sys::hipModule_t> {
    let mut module: sys::hipModule_t = null_mut();
    // SAFETY: guaranteed by the caller; writes one handle.
    check("hipModuleLoadData", unsafe { sys::hipModuleLoadData(&mut module, image) })?;
    Ok(module)
}

/// `hipModuleUnload`.
///
/// # Safety
/// No queued work runs the module's kernels any more.
pub(super) unsafe fn module_unload(module: sys::hipModule_t) -> Result<()> {
    // SAFETY: guaranteed by the caller.
    check("hipModuleUnload", unsafe { sys::hipModuleUnload(module) })
}

/// `hipModuleGetFunction`.
///
/// # Safety
/// `module` is loaded.
pub(super) unsafe fn module_get_function(module: sys::hipModule_t, name: &CStr) -> Result<sys::hipFunction_t> {
    let mut function: sys::hipFunction_t = null_mut();
    // SAFETY: guaranteed by the caller; `name` is NUL-terminated; writes one handle.
    check("hipModuleGetFunction", unsafe { sys::hipModuleGetFunction(&mut function, module, name.as_ptr()) })?;
    Ok(function)
}

/// `hipModuleLaunchKernel` with a 1-D grid and no dynamic shared memory.
///
/// # Safety
/// `args` point to the kernel's parameters in order, each of the parameter's type; the memory
/// the kernel touches stays valid, and untouched by others, until it has run.
pub(super) unsafe fn module_launch_kernel(
    function: sys::hipFunction_t,
    blocks: c_uint,
    threads: c_uint,
    stream: sys::hipStream_t,
    args: &mut [*mut c_void],
) -> Result<()> {
    // SAFETY: guaranteed by the caller; HIP copies the arguments before returning.
    check("hipModuleLaunchKernel", unsafe {
        sys::hipModuleLaunchKernel(function, blocks, 1, 1, threads, 1, 1, 0, stream, args.as_mut_ptr(), null_mut())
    })
}
