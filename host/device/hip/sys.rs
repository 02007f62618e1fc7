//! The raw HIP runtime calls the HIP device makes (the `sys` layer; `result` wraps each one).
//!
//! Declared here rather than taken from `hip-runtime-sys` (which links the library and supplies
//! the handle types and constants) because its functions return `hipError_t` as a Rust enum: a
//! code added by a newer runtime would be an invalid enum value, which is undefined behaviour.
//! Here the status is the C `int` it is.

use std::ffi::{c_char, c_int, c_uint, c_void};

use hip_runtime_sys::{hipDeviceAttribute_t, hipMemcpyKind};
pub use hip_runtime_sys::{hipDeviceProp_t, hipEvent_t, hipFunction_t, hipModule_t, hipStream_t};

/// A `hipError_t`.
pub type Status = c_int;
pub const SUCCESS: Status = 0;
/// `hipErrorNotReady`: queued work has not finished (`hipStreamQuery`).
pub const NOT_READY: Status = hip_runtime_sys::hipError_t::hipErrorNotReady as c_int;

pub const STREAM_NON_BLOCKING: c_uint = hip_runtime_sys::hipStreamNonBlocking;
pub const EVENT_DISABLE_TIMING: c_uint = hip_runtime_sys::hipEventDisableTiming;
pub const HOST_MALLOC_FLAGS: c_uint = hip_runtime_sys::hipHostMallocMapped
    | hip_runtime_sys::hipHostMallocPortable
    | hip_runtime_sys::hipHostMallocCoherent;
pub const WAIT_VALUE_GTE: c_uint = hip_runtime_sys::hipStreamWaitValueGte;

pub const HOST_TO_DEVICE: c_int = hipMemcpyKind::hipMemcpyHostToDevice as c_int;
pub const DEVICE_TO_HOST: c_int = hipMemcpyKind::hipMemcpyDeviceToHost as c_int;
pub const DEVICE_TO_DEVICE: c_int = hipMemcpyKind::hipMemcpyDeviceToDevice as c_int;

pub const ATTR_MULTIPROCESSOR_COUNT: c_int = hipDeviceAttribute_t::hipDeviceAttributeMultiprocessorCount as c_int;
pub const ATTR_MAX_PITCH: c_int = hipDeviceAttribute_t::hipDeviceAttributeMaxPitch as c_int;
pub const ATTR_CAN_USE_STREAM_WAIT_VALUE: c_int =
    hipDeviceAttribute_t::hipDeviceAttributeCanUseStreamWaitValue as c_int;

/// `hipStreamCallback_t`.
pub type StreamCallback = unsafe extern "C" fn(stream: hipStream_t, status: Status, user_data: *mut c_void);

// SAFETY: these are the C prototypes of `hip_runtime_api.h` (ROCm 5 and 6) with `hipError_t`,
// `hipMemcpyKind` and `hipDeviceAttribute_t` spelled as the `int`s they are.
unsafe extern "C" {
    pub fn hipGetErrorString(error: Status) -> *const c_char;
    pub fn hipGetDeviceCount(count: *mut c_int) -> Status;
    pub fn hipSetDevice(device: c_int) -> Status;
    pub fn hipDeviceSynchronize() -> Status;
    pub fn hipDeviceGetAttribute(value: *mut c_int, attr: c_int, device: c_int) -> Status;
    /// The legacy export, which fills the ROCm 5 layout of `hipDeviceProp_t` in ROCm 6 too.
    pub fn hipGetDeviceProperties(prop: *mut hipDeviceProp_t, device: c_int) -> Status;

    pub fn hipStreamCreateWithFlags(stream: *mut hipStream_t, flags: c_uint) -> Status;
    pub fn hipStreamDestroy(stream: hipStream_t) -> Status;
    pub fn hipStreamSynchronize(stream: hipStream_t) -> Status;
    pub fn hipStreamQuery(stream: hipStream_t) -> Status;
    pub fn hipEventQuery(event: hipEvent_t) -> Status;
    pub fn hipStreamWaitEvent(stream: hipStream_t, event: hipEvent_t, flags: c_uint) -> Status;
    pub fn hipStreamAddCallback(
        stream: hipStream_t,
        callback: Option<StreamCallback>,
        user_data: *mut c_void,
        flags: c_uint,
    ) -> Status;
    pub fn hipStreamWaitValue32(stream: hipStream_t, ptr: *mut c_void, value: u32, flags: c_uint, mask: u32) -> Status;
    pub fn hipStreamWriteValue32(stream: hipStream_t, ptr: *mut c_void, value: u32, flags: c_uint) -> Status;

    pub fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> Status;
    pub fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> Status;
    pub fn hipEventDestroy(event: hipEvent_t) -> Status;

    pub fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Status;
    pub fn hipFree(ptr: *mut c_void) -> Status;
    pub fn hipMallocAsync(ptr: *mut *mut c_void, size: usize, stream: hipStream_t) -> Status;
    pub fn hipFreeAsync(ptr: *mut c_void, stream: hipStream_t) -> Status;
    pub fn hipMemset(dst: *mut c_void, value: c_int, size: usize) -> Status;
    pub fn hipHostMalloc(ptr: *mut *mut c_void, size: usize, flags: c_uint) -> Status;
    pub fn hipHostFree(ptr: *mut c_void) -> Status;
    pub fn hipHostGetDevicePointer(device_ptr: *mut *mut c_void, host_ptr: *mut c_void, flags: c_uint) -> Status;

    pub fn hipMemcpyAsync(
        dst: *mut c_void,
        src: *const c_void,
        bytes: usize,
        kind: c_int,
        stream: hipStream_t,
    ) -> Status;
    pub fn hipMemcpy2DAsync(
        dst: *mut c_void,
        dst_pitch: usize,
        src: *const c_void,
        src_pitch: usize,
        width: usize,
        height: usize,
        kind: c_int,
        stream: hipStream_t,
    ) -> Status;

    pub fn hipModuleLoadData(module: *mut hipModule_t, image: *const c_void) -> Status;
    pub fn hipModuleUnload(module: hipModule_t) -> Status;
    pub fn hipModuleGetFunction(function: *mut hipFunction_t, module: hipModule_t, name: *const c_char) -> Status;
    pub fn hipModuleLaunchKernel(
        function: hipFunction_t,
        grid_x: c_uint,
        grid_y: c_uint,
        grid_z: c_uint,
        block_x: c_uint,
        block_y: c_uint,
        block_z: c_uint,
        shared_bytes: c_uint,
        stream: hipStream_t,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) -> Status;
}
