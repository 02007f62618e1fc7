//! The HIP device: AMD GPUs through the HIP runtime (`libamdhip64`), for the HostTransfer
//! backend. Behind the cargo feature `hip`.
//!
//! **Status:** CI compiles, links and lints this module against the HIP runtime and runs its
//! test, which skips without an AMD GPU; it has not been run on AMD hardware. It follows the HIP
//! API documentation and mirrors the CUDA device (`device::cuda`), which is tested on GPUs.
//!
//! What the device adds on top of the HIP runtime:
//!
//! * streams ([`HipStream`]): non-blocking `hipStream_t`s, destroyed when the last handle drops;
//! * pinned staging memory from `hipHostMalloc(Mapped | Portable | Coherent)`: page-locked,
//!   mapped into the device's address space, cached on the CPU (not write-combined: the proxy
//!   thread reads it) and fine-grained, so flags and data change visibly while kernels run;
//! * 2-D copies with `hipMemcpyAsync` / `hipMemcpy2DAsync`, packed v-collective blocks with one
//!   launch of the `pack_segments`/`unpack_segments` kernels, which read their segment lists
//!   from pinned mapped memory (no copy is queued for them, see [`super::arg_lists`]);
//! * flags: `hipStreamWriteValue32`/`hipStreamWaitValue32` ([`FlagPath::StreamMemOps`]) or the
//!   Rust `signal`/`stream_wait` kernels ([`FlagPath::Kernels`]);
//! * reductions of staged rows into device memory with the reduction kernels, reading the rows
//!   through host-mapped memory;
//! * device buffers ([`HipBuffer`]) that collectives accept as [`DeviceSlice`]s.
//!
//! Kernels come from the AMD code objects embedded by the build ([`crate::device_code`]) for the
//! device's `gcnArchName`; each code object is loaded with `hipModuleLoadData` once per process
//! and device, and stays loaded (work queued by a dropped [`HipDevice`] may still run them).
//!
//! # Flags and cyclic waits
//! [`Device::wait_flag`] compares cyclically (`flag - value` as `i32` is not negative), like
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
//! ROCm maps streams onto a few hardware queues (`GPU_MAX_HW_QUEUES`, 4 by default) and runs a
//! queue's packets in order. A stream waiting for a flag (with a kernel, or a memory operation
//! that ROCm may itself implement as a polling kernel) therefore also holds back the streams that
//! share its hardware queue: the flag must be set by the host (the proxy thread), never only by
//! work on another stream of the same device. See also the deadlock notes in
//! [`duralumin_kernels::flag`].
//!
//! # Errors
//! A failing HIP call is [`Error::Device`] with the call's name and HIP's error string. Errors in
//! `Drop` (destroying a stream or an event, freeing memory) cannot be returned there; they are
//! recorded and returned by the next call of a [`HipDevice`] with the same ordinal, as cudarc
//! does.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_int, c_void};
use std::fmt;
use std::marker::PhantomData;
use std::ptr::null_mut;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use duralumin_kernels::Element;
use duralumin_kernels::flag::reached;
use duralumin_kernels::names::fixed;
use duralumin_kernels::pack::Segment;

use super::arg_lists::ArgLists;
use super::{Copy2d, Device, DevicePtr, DeviceSlice, DeviceSliceMut, Flag, KeepAlive, ReduceFns, sealed};
use crate::error::{Error, Result};

/// The HIP runtime calls this module makes.
///
/// Declared here rather than taken from `hip-runtime-sys` (which links the library and supplies
/// the handle types and constants) because its functions return `hipError_t` as a Rust enum: a
/// code added by a newer runtime would be an invalid enum value, which is undefined behaviour.
/// Here the status is the C `int` it is.
mod sys {
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
        pub fn hipStreamWaitEvent(stream: hipStream_t, event: hipEvent_t, flags: c_uint) -> Status;
        pub fn hipStreamAddCallback(
            stream: hipStream_t,
            callback: Option<StreamCallback>,
            user_data: *mut c_void,
            flags: c_uint,
        ) -> Status;
        pub fn hipStreamWaitValue32(
            stream: hipStream_t,
            ptr: *mut c_void,
            value: u32,
            flags: c_uint,
            mask: u32,
        ) -> Status;
        pub fn hipStreamWriteValue32(stream: hipStream_t, ptr: *mut c_void, value: u32, flags: c_uint) -> Status;

        pub fn hipEventCreateWithFlags(event: *mut hipEvent_t, flags: c_uint) -> Status;
        pub fn hipEventRecord(event: hipEvent_t, stream: hipStream_t) -> Status;
        pub fn hipEventDestroy(event: hipEvent_t) -> Status;

        pub fn hipMalloc(ptr: *mut *mut c_void, size: usize) -> Status;
        pub fn hipFree(ptr: *mut c_void) -> Status;
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
}

/// HIP's text for `status`.
fn error_message(status: sys::Status) -> String {
    // SAFETY: `hipGetErrorString` accepts any code and returns a static string (or null).
    let text = unsafe { sys::hipGetErrorString(status) };
    if text.is_null() {
        return format!("HIP error {status}");
    }
    // SAFETY: a non-null result is a NUL-terminated static string.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    format!("{text} (hipError_t {status})")
}

/// `Ok` for `hipSuccess`, else [`Error::Device`] naming `call`.
fn check(call: &'static str, status: sys::Status) -> Result<()> {
    if status == sys::SUCCESS { Ok(()) } else { Err(Error::Device { call, message: error_message(status) }) }
}

/// Makes `ordinal` the calling thread's current device (HIP keeps it per thread, and calls come
/// from user threads and the proxy thread alike).
fn set_device(ordinal: usize) -> Result<()> {
    let device = c_int::try_from(ordinal)
        .map_err(|_| Error::Device { call: "hipSetDevice", message: format!("no HIP device {ordinal}") })?;
    // SAFETY: plain call; an invalid ordinal is reported as an error.
    check("hipSetDevice", unsafe { sys::hipSetDevice(device) })
}

/// Errors raised in `Drop`, by device ordinal, until a call of that device returns them.
fn recorded() -> &'static Mutex<Vec<(usize, Error)>> {
    static RECORDED: OnceLock<Mutex<Vec<(usize, Error)>>> = OnceLock::new();
    RECORDED.get_or_init(Mutex::default)
}

/// Keeps the error of a `Drop` for the next call on `ordinal`.
fn record(ordinal: usize, result: Result<()>) {
    if let Err(e) = result {
        recorded().lock().unwrap_or_else(PoisonError::into_inner).push((ordinal, e));
    }
}

/// The first recorded error of `ordinal`, if any.
fn take_recorded(ordinal: usize) -> Result<()> {
    let mut list = recorded().lock().unwrap_or_else(PoisonError::into_inner);
    match list.iter().position(|(o, _)| *o == ordinal) {
        Some(i) => Err(list.remove(i).1),
        None => Ok(()),
    }
}

/// Number of HIP devices: the error when the runtime reports none.
fn count_devices() -> Result<usize> {
    let mut count: c_int = 0;
    // SAFETY: writes one int.
    check("hipGetDeviceCount", unsafe { sys::hipGetDeviceCount(&mut count) })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Number of HIP devices; 0 when the runtime finds none (no GPU, no driver).
pub fn device_count() -> usize {
    count_devices().unwrap_or(0)
}

/// Whether the HIP runtime finds at least one device (tests and callers skip the HIP device
/// otherwise).
pub fn driver_present() -> bool {
    device_count() > 0
}

/// A device attribute.
fn attribute(ordinal: usize, attr: c_int) -> Result<c_int> {
    let mut value: c_int = 0;
    let device = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
    // SAFETY: writes one int; an invalid device or attribute is reported as an error.
    check("hipDeviceGetAttribute", unsafe { sys::hipDeviceGetAttribute(&mut value, attr, device) })?;
    Ok(value)
}

/// The device's `gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`.
fn arch_name(ordinal: usize) -> Result<String> {
    /// The properties with room to spare, in case a runtime writes a longer structure than the
    /// bindings describe (the `gcnArchName` offset is the same in every layout that
    /// `hipGetDeviceProperties` fills).
    #[repr(C)]
    struct Props {
        props: sys::hipDeviceProp_t,
        _slack: [u8; 4096],
    }
    let device = c_int::try_from(ordinal).unwrap_or(c_int::MAX);
    // SAFETY: every field of the properties (integers, arrays, raw pointers, a bitfield) is
    // valid when zero.
    let mut props: Box<Props> = Box::new(unsafe { std::mem::zeroed() });
    // SAFETY: writes at most the properties structure, which fits in `Props`.
    check("hipGetDeviceProperties", unsafe { sys::hipGetDeviceProperties(&mut props.props, device) })?;
    let bytes: Vec<u8> = props.props.gcnArchName.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    let arch = String::from_utf8_lossy(&bytes).into_owned();
    if arch.is_empty() {
        return Err(Error::Device {
            call: "hipGetDeviceProperties",
            message: format!("device {ordinal} reports no gcnArchName"),
        });
    }
    Ok(arch)
}

/// How streams write and wait for flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FlagPath {
    /// Stream memory operations where `hipDeviceAttributeCanUseStreamWaitValue` says the device
    /// has them, else kernels.
    #[default]
    Auto,
    /// `hipStreamWriteValue32` / `hipStreamWaitValue32`. Waits that `hipStreamWaitValueGte`
    /// cannot compare cyclically still use the `stream_wait` kernel (see the module docs).
    StreamMemOps,
    /// One-thread `signal` and `stream_wait` kernels from `duralumin-kernels` (a waiting stream
    /// holds one compute-unit slot while it spins).
    Kernels,
}

/// Largest value a [`FlagPath::StreamMemOps`] wait hands to `hipStreamWaitValue32`: 2²⁴ below
/// `i32::MAX`, so a flag may run 2²⁴ past the value before signed, unsigned and cyclic
/// comparisons could disagree. Waits for larger values use the `stream_wait` kernel.
pub const MEMOP_WAIT_MAX: u32 = i32::MAX as u32 - (1 << 24);

/// Threads per block of the grid-stride kernels.
const BLOCK: u32 = 256;

/// A loaded code object.
struct Module(sys::hipModule_t);

/// A kernel of a loaded code object.
#[derive(Clone, Copy)]
struct Function(sys::hipFunction_t);

// SAFETY: module and function handles are process-wide runtime objects, usable from any thread;
// they are only handed to HIP calls.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Send for Function {}

/// Code objects loaded so far, per device ordinal: by address of the embedded image, and their
/// kernels by entry name. Never unloaded: queued work of a dropped device may still run them.
#[derive(Default)]
struct Loaded {
    modules: HashMap<(usize, usize), Module>,
    functions: HashMap<usize, HashMap<String, Function>>,
}

fn loaded() -> &'static Mutex<Loaded> {
    static LOADED: OnceLock<Mutex<Loaded>> = OnceLock::new();
    LOADED.get_or_init(Mutex::default)
}

/// An AMD GPU for the HostTransfer backend: its ordinal, architecture and flag path.
///
/// Cloning gives another handle to the same device.
#[derive(Clone)]
pub struct HipDevice {
    inner: Arc<Inner>,
}

struct Inner {
    ordinal: usize,
    arch: String,
    flags: FlagPath,
    compute_units: u32,
    max_pitch: usize,
    /// Pinned memory the pack kernels read their segment lists from.
    arg_lists: Arc<ArgLists>,
}

impl Drop for Inner {
    /// The segment lists' blocks are freed once the device has run every kernel that could
    /// read them. The proxy thread must not wait for that (streams may be waiting for it):
    /// there, another thread waits and frees.
    fn drop(&mut self) {
        let blocks: Vec<usize> = self.arg_lists.blocks().into_iter().map(|(p, _)| p as usize).collect();
        if blocks.is_empty() {
            return;
        }
        let ordinal = self.ordinal;
        let free = move || {
            let freed = set_device(ordinal).and_then(|()| {
                // SAFETY: no arguments; waits for the current device's work.
                check("hipDeviceSynchronize", unsafe { sys::hipDeviceSynchronize() })?;
                for p in blocks {
                    // SAFETY: a list block from `hipHostMalloc`; the device has run every
                    // kernel that could read it.
                    check("hipHostFree", unsafe { sys::hipHostFree(p as *mut c_void) })?;
                }
                Ok(())
            });
            record(ordinal, freed);
        };
        if crate::progress::on_proxy_thread() {
            // Without a thread, the blocks stay allocated rather than the proxy thread waiting.
            let _ = std::thread::Builder::new().name("duralumin-free-lists".into()).spawn(free);
        } else {
            free();
        }
    }
}

impl fmt::Debug for HipDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HipDevice")
            .field("ordinal", &self.inner.ordinal)
            .field("arch", &self.inner.arch)
            .field("flags", &self.inner.flags)
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
        let count = count_devices()?;
        if ordinal >= count {
            return Err(Error::Device {
                call: "hipSetDevice",
                message: format!("no HIP device {ordinal}: the runtime finds {count}"),
            });
        }
        set_device(ordinal)?;
        let arch = arch_name(ordinal)?;
        let flags = match flags {
            // A runtime that does not know the attribute has no stream memory operations to offer.
            FlagPath::Auto if attribute(ordinal, sys::ATTR_CAN_USE_STREAM_WAIT_VALUE).unwrap_or(0) != 0 => {
                FlagPath::StreamMemOps
            }
            FlagPath::Auto => FlagPath::Kernels,
            other => other,
        };
        let compute_units = attribute(ordinal, sys::ATTR_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        // A device that reports no limit gets the largest pitch a C `int` holds.
        let max_pitch = match attribute(ordinal, sys::ATTR_MAX_PITCH).unwrap_or(0) {
            p if p > 0 => p as usize,
            _ => c_int::MAX as usize,
        };
        let device = HipDevice {
            inner: Arc::new(Inner { ordinal, arch, flags, compute_units, max_pitch, arg_lists: Arc::default() }),
        };
        if flags == FlagPath::Kernels {
            // Fail now, not on the first operation, when the kernels are missing.
            device.function(fixed::SIGNAL)?;
            device.function(fixed::STREAM_WAIT)?;
        }
        Ok(device)
    }

    /// The flag path in use (never [`FlagPath::Auto`]).
    pub fn flag_path(&self) -> FlagPath {
        self.inner.flags
    }

    /// The device's architecture name (`gcnArchName`, e.g. `gfx90a:sramecc+:xnack-`).
    pub fn arch(&self) -> &str {
        &self.inner.arch
    }

    /// A zero-filled buffer of `len` elements in the device's memory (`hipMalloc`; an empty
    /// buffer allocates nothing).
    pub fn alloc<T: Element>(&self, len: usize) -> Result<HipBuffer<T>> {
        let bytes =
            len.checked_mul(size_of::<T>()).ok_or(Error::CountOverflow { what: "HIP buffer", value: len as u128 })?;
        self.bind()?;
        let mut ptr = null_mut();
        if bytes > 0 {
            // SAFETY: writes one pointer.
            check("hipMalloc", unsafe { sys::hipMalloc(&mut ptr, bytes) })?;
        }
        let buf = HipBuffer { ptr, len, ordinal: self.inner.ordinal, _t: PhantomData };
        if bytes > 0 {
            // SAFETY: `ptr` is a fresh allocation of `bytes` bytes that nothing else uses.
            check("hipMemset", unsafe { sys::hipMemset(ptr, 0, bytes) })?;
            // `hipMemset` runs on the null stream, which the device's (non-blocking) streams do not
            // wait for: finish it before any of them can use the buffer.
            // SAFETY: the null stream is always valid.
            check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(null_mut()) })?;
        }
        Ok(buf)
    }

    /// A buffer holding a copy of `data`, copied on `stream` after the work queued there so far;
    /// returns when the copy is done.
    pub fn upload<T: Element>(&self, stream: &HipStream, data: &[T]) -> Result<HipBuffer<T>> {
        let mut buf = self.alloc::<T>(data.len())?;
        buf.write(stream, data)?;
        Ok(buf)
    }

    /// Makes this device current on the calling thread, first returning an error recorded by a
    /// `Drop` of this device's objects.
    fn bind(&self) -> Result<()> {
        take_recorded(self.inner.ordinal)?;
        set_device(self.inner.ordinal)
    }

    fn check_stream(&self, stream: &HipStream) -> Result<()> {
        if self.owns(stream) {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what: "stream",
                expected: self.name(),
                found: format!("hip:{}", stream.inner.ordinal),
            })
        }
    }

    /// The kernel `entry` of a registered kernel module, loaded on this device on first use.
    fn function(&self, entry: &str) -> Result<Function> {
        let ordinal = self.inner.ordinal;
        let mut loaded = loaded().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&f) = loaded.functions.get(&ordinal).and_then(|m| m.get(entry)) {
            return Ok(f);
        }
        let kernel = crate::device_code::find_code_object(entry, &self.inner.arch)?;
        self.bind()?;
        let key = (ordinal, kernel.code_object.elf.as_ptr() as usize);
        let module = match loaded.modules.get(&key) {
            Some(m) => m.0,
            None => {
                let mut module: sys::hipModule_t = null_mut();
                // SAFETY: the image is a complete code object for this device's architecture
                // (found by `gcnArchName`) that lives for the whole program.
                check("hipModuleLoadData", unsafe {
                    sys::hipModuleLoadData(&mut module, kernel.code_object.elf.as_ptr().cast())
                })?;
                loaded.modules.insert(key, Module(module));
                module
            }
        };
        let name = CString::new(kernel.entry)
            .map_err(|_| Error::KernelsUnavailable(format!("kernel name {:?} contains a NUL byte", kernel.entry)))?;
        let mut function: sys::hipFunction_t = null_mut();
        // SAFETY: `module` is loaded on this device; `name` is NUL-terminated.
        check("hipModuleGetFunction", unsafe { sys::hipModuleGetFunction(&mut function, module, name.as_ptr()) })?;
        let function = Function(function);
        loaded.functions.entry(ordinal).or_default().insert(entry.to_owned(), function);
        Ok(function)
    }

    /// Blocks for a grid-stride launch over `items` work items.
    fn blocks(&self, items: usize) -> u32 {
        let max = self.inner.compute_units as usize * 8;
        items.div_ceil(BLOCK as usize * 4).clamp(1, max.max(1)) as u32
    }

    /// Queues `function` with `blocks` × `threads` threads.
    ///
    /// # Safety
    /// `args` point to the kernel's parameters in order, each with the parameter's type; the
    /// memory the kernel touches stays valid, and untouched by others, until it has run.
    unsafe fn launch(
        &self,
        stream: &HipStream,
        function: Function,
        blocks: u32,
        threads: u32,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; HIP copies the arguments before returning.
        check("hipModuleLaunchKernel", unsafe {
            sys::hipModuleLaunchKernel(
                function.0,
                blocks,
                1,
                1,
                threads,
                1,
                1,
                0,
                stream.raw(),
                args.as_mut_ptr(),
                null_mut(),
            )
        })
    }

    /// A one-thread launch of the `signal` or `stream_wait` kernel.
    ///
    /// # Safety
    /// The flag's slot stays held until the kernel has run.
    unsafe fn flag_kernel(&self, stream: &HipStream, entry: &str, flag: Flag, value: u32) -> Result<()> {
        let function = self.function(entry)?;
        let (mut ptr, mut value) = (flag.device.0, value);
        let mut args = [arg(&mut ptr), arg(&mut value)];
        // SAFETY: the flag kernels take `(flag: *u32, value: u32)`; the flag is host-mapped
        // memory the caller keeps allocated until the kernel has run.
        unsafe { self.launch(stream, function, 1, 1, &mut args) }
    }

    /// Keeps `keep` alive until the work queued on `stream` so far has run: a host callback hands
    /// it to the reaper thread, which drops it (callbacks may not call HIP, and a drop might free
    /// HIP memory). When the callback cannot be queued, `keep` is dropped once the stream has
    /// been synchronized, on a thread of its own, and leaked if that fails.
    fn hold(&self, stream: &HipStream, keep: Vec<KeepAlive>) -> Result<()> {
        if keep.is_empty() {
            return Ok(());
        }
        let (error, keep) = match super::reaper::start("hipStreamAddCallback") {
            Err(e) => (e, keep),
            Ok(()) => {
                let payload = Box::into_raw(Box::new(keep));
                // SAFETY: `release` takes back the box exactly once, when the stream reaches it.
                let status = unsafe { sys::hipStreamAddCallback(stream.raw(), Some(release), payload.cast(), 0) };
                match check("hipStreamAddCallback", status) {
                    Ok(()) => return Ok(()),
                    // SAFETY: the callback was not queued, so the box is still ours.
                    Err(e) => (e, *unsafe { Box::from_raw(payload) }),
                }
            }
        };
        // The work queued so far may still use what `keep` holds: it goes once the stream is
        // through, waited for on a thread of its own (this may be the proxy thread, whose flags
        // that work waits for), or never (see `reaper::drop_when_drained`).
        let (stream, ordinal) = (stream.clone(), self.inner.ordinal);
        super::reaper::drop_when_drained(keep, move || {
            // SAFETY: a live stream handle (held here).
            set_device(ordinal).is_ok() && unsafe { sys::hipStreamSynchronize(stream.raw()) } == sys::SUCCESS
        });
        Err(error)
    }

    /// One 2-D (or 1-D) copy between pinned host memory and device memory.
    ///
    /// # Safety
    /// As [`Device::copy_d2h`] (`to_host`) or [`Device::copy_h2d`].
    unsafe fn copy(
        &self,
        stream: &HipStream,
        to_host: bool,
        host: *mut u8,
        device: DevicePtr,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if shape.bytes() == 0 {
            return Ok(());
        }
        self.bind()?;
        let device = device.0 as *mut u8;
        let (dst, src, kind) =
            if to_host { (host, device, sys::DEVICE_TO_HOST) } else { (device, host, sys::HOST_TO_DEVICE) };
        let s = stream.raw();
        let Copy2d { row_bytes, rows, src_pitch, dst_pitch } = shape;
        let contiguous = rows == 1 || (src_pitch == row_bytes && dst_pitch == row_bytes);
        let pitched =
            src_pitch >= row_bytes && dst_pitch >= row_bytes && src_pitch.max(dst_pitch) <= self.inner.max_pitch;
        // SAFETY: the caller guarantees both sides are valid for the shape until the copy has
        // run; the host side is pinned memory, so the copies are asynchronous.
        let queued = unsafe {
            if contiguous {
                check("hipMemcpyAsync", sys::hipMemcpyAsync(dst.cast(), src.cast(), shape.bytes(), kind, s))
            } else if pitched {
                check(
                    "hipMemcpy2DAsync",
                    sys::hipMemcpy2DAsync(dst.cast(), dst_pitch, src.cast(), src_pitch, row_bytes, rows, kind, s),
                )
            } else {
                // Overlapping or over-long pitches: row by row.
                (0..rows).try_for_each(|r| {
                    let (d, s_row) = (dst.wrapping_add(r * dst_pitch), src.wrapping_add(r * src_pitch));
                    check("hipMemcpyAsync", sys::hipMemcpyAsync(d.cast(), s_row.cast(), row_bytes, kind, s))
                })
            }
        };
        let held = self.hold(stream, keep.into_iter().collect());
        queued.and(held)
    }

    /// One launch of the pack (`to_host`) or unpack kernel over `pieces`.
    ///
    /// # Safety
    /// As [`Device::pack_d2h`] (`to_host`) or [`Device::unpack_h2d`].
    unsafe fn pieces(
        &self,
        stream: &HipStream,
        to_host: bool,
        host: *mut u8,
        pieces: Vec<(DevicePtr, usize)>,
        mut keep: Vec<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let nonempty: Vec<(DevicePtr, usize)> = pieces.into_iter().filter(|p| p.1 > 0).collect();
        let Some(base) = nonempty.iter().map(|p| p.0).min() else {
            return Ok(());
        };
        let total: usize = nonempty.iter().map(|p| p.1).sum();
        self.bind()?;
        let function = self.function(if to_host { fixed::PACK_SEGMENTS } else { fixed::UNPACK_SEGMENTS })?;
        let mapped = self.mapped(host)?;
        // Device offsets from the lowest piece; the packed side is consecutive.
        let segments: Vec<Segment> =
            nonempty.iter().map(|&(ptr, bytes)| Segment::new(ptr.0 - base.0, bytes as u64)).collect();
        // The list is written to pinned memory the kernel reads: a copy from pageable memory
        // may wait for a stream that waits for this thread (see `super::arg_lists`).
        let list = self.inner.arg_lists.take_on(self, bytemuck::cast_slice(&segments))?;
        let (dst, src) = if to_host { (mapped.0, base.0) } else { (base.0, mapped.0) };
        let (mut dst, mut src, mut list_ptr, mut count) = (dst, src, list.device_ptr().0, segments.len());
        let mut args = [arg(&mut dst), arg(&mut src), arg(&mut list_ptr), arg(&mut count)];
        // SAFETY: the pack kernels take `(dst, src, segments, count)`; every segment lies in a
        // piece the caller guarantees valid, the packed side holds `total` bytes, and the list
        // (mapped memory holding `count` segments) is kept until the stream has run the kernel.
        let queued = unsafe { self.launch(stream, function, self.blocks(total / 16 + 1), BLOCK, &mut args) };
        keep.push(Arc::new(list));
        let held = self.hold(stream, keep);
        queued.and(held)
    }

    /// Whether a [`FlagPath::StreamMemOps`] wait for `value`, with the flag at `now` (not yet
    /// reached), compares like the cyclic wait (see the module docs).
    fn memop_wait_is_exact(now: u32, value: u32) -> bool {
        now < value && value <= MEMOP_WAIT_MAX
    }
}

/// A pointer to a kernel argument, as `hipModuleLaunchKernel` takes them.
fn arg<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

/// Host callback queued by [`HipDevice::hold`]: hands the payload to the reaper.
///
/// # Safety
/// `payload` is a `Box<Vec<KeepAlive>>` from `Box::into_raw`, passed exactly once.
unsafe extern "C" fn release(_stream: sys::hipStream_t, _status: sys::Status, payload: *mut c_void) {
    // SAFETY: guaranteed by the caller (the runtime passes back what `hold` queued).
    let keep = unsafe { Box::from_raw(payload.cast::<Vec<KeepAlive>>()) };
    super::reaper::reap(*keep);
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
        let destroyed = set_device(self.ordinal).and_then(|()| {
            // SAFETY: the last handle is gone, so nothing queues on the stream any more; the
            // runtime finishes (or releases after) the work queued on it.
            check("hipStreamDestroy", unsafe { sys::hipStreamDestroy(self.raw) })
        });
        record(self.ordinal, destroyed);
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

/// An event recorded on one stream for another to wait on; destroyed on drop.
struct Event {
    raw: sys::hipEvent_t,
    ordinal: usize,
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by `hipEventCreateWithFlags`; a wait queued on it keeps what it needs.
        record(self.ordinal, check("hipEventDestroy", unsafe { sys::hipEventDestroy(self.raw) }));
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
        let freed = set_device(self.ordinal).and_then(|()| {
            // SAFETY: plain call; waits for all queued work of the device.
            check("hipDeviceSynchronize", unsafe { sys::hipDeviceSynchronize() })?;
            // SAFETY: `ptr` came from `hipMalloc` and no queued work uses it any more.
            check("hipFree", unsafe { sys::hipFree(self.ptr) })
        });
        record(self.ordinal, freed);
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

    /// The contents, copied on `stream` after the work queued there so far; returns when the
    /// copy is done.
    pub fn download(&self, stream: &HipStream) -> Result<Vec<T>> {
        self.check_stream(stream)?;
        let mut out = vec![T::zeroed(); self.len];
        let bytes = self.len * size_of::<T>();
        if bytes == 0 {
            return Ok(out);
        }
        set_device(self.ordinal)?;
        // SAFETY: `out` holds `bytes` bytes and outlives the copy (synchronized below); the
        // buffer holds as many.
        check("hipMemcpyAsync", unsafe {
            sys::hipMemcpyAsync(out.as_mut_ptr().cast(), self.ptr, bytes, sys::DEVICE_TO_HOST, stream.raw())
        })?;
        // SAFETY: a valid stream handle.
        check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(stream.raw()) })?;
        Ok(out)
    }

    /// Overwrites the buffer with `data` (equal lengths), copied on `stream` after the work
    /// queued there so far; returns when the copy is done.
    pub fn write(&mut self, stream: &HipStream, data: &[T]) -> Result<()> {
        crate::check::len("HipBuffer::write data", data.len(), self.len)?;
        self.check_stream(stream)?;
        let bytes = self.len * size_of::<T>();
        if bytes == 0 {
            return Ok(());
        }
        set_device(self.ordinal)?;
        // SAFETY: `data` holds `bytes` bytes and outlives the copy (synchronized below); the
        // buffer holds as many.
        check("hipMemcpyAsync", unsafe {
            sys::hipMemcpyAsync(self.ptr, data.as_ptr().cast(), bytes, sys::HOST_TO_DEVICE, stream.raw())
        })?;
        // SAFETY: a valid stream handle.
        check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(stream.raw()) })
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

impl sealed::Sealed for HipDevice {}

impl Device for HipDevice {
    type Stream = HipStream;

    fn name(&self) -> String {
        format!("hip:{}", self.inner.ordinal)
    }

    fn ordinal(&self) -> usize {
        self.inner.ordinal
    }

    fn owns(&self, stream: &HipStream) -> bool {
        stream.inner.ordinal == self.inner.ordinal
    }

    fn new_stream(&self) -> Result<HipStream> {
        self.bind()?;
        let mut raw: sys::hipStream_t = null_mut();
        // SAFETY: writes one handle.
        check("hipStreamCreateWithFlags", unsafe {
            sys::hipStreamCreateWithFlags(&mut raw, sys::STREAM_NON_BLOCKING)
        })?;
        Ok(HipStream { inner: Arc::new(StreamInner { raw, ordinal: self.inner.ordinal }) })
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let mut ptr = null_mut();
        // SAFETY: writes one pointer.
        check("hipHostMalloc", unsafe { sys::hipHostMalloc(&mut ptr, bytes.max(1), sys::HOST_MALLOC_FLAGS) })?;
        if ptr.is_null() {
            return Err(Error::Device { call: "hipHostMalloc", message: format!("no memory for {bytes} bytes") });
        }
        // SAFETY: `ptr` is a fresh host allocation of at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        Ok(ptr.cast())
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) {
        let freed = set_device(self.inner.ordinal).and_then(|()| {
            // SAFETY: the caller guarantees `ptr` came from `alloc_pinned` and no queued work
            // uses it.
            check("hipHostFree", unsafe { sys::hipHostFree(ptr.cast()) })
        });
        record(self.inner.ordinal, freed);
    }

    fn mapped(&self, host: *mut u8) -> Result<DevicePtr> {
        self.bind()?;
        let mut ptr = null_mut();
        // SAFETY: writes one pointer; an address outside `hipHostMalloc` memory is an error.
        check("hipHostGetDevicePointer", unsafe { sys::hipHostGetDevicePointer(&mut ptr, host.cast(), 0) })?;
        Ok(DevicePtr(ptr as u64))
    }

    unsafe fn copy_d2h(
        &self,
        stream: &HipStream,
        dst: *mut u8,
        src: DevicePtr,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.copy(stream, true, dst, src, shape, keep) }
    }

    unsafe fn copy_h2d(
        &self,
        stream: &HipStream,
        dst: DevicePtr,
        src: *const u8,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the host side is only read.
        unsafe { self.copy(stream, false, src.cast_mut(), dst, shape, keep) }
    }

    unsafe fn pack_d2h(
        &self,
        stream: &HipStream,
        dst: *mut u8,
        pieces: Vec<(DevicePtr, usize)>,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.pieces(stream, true, dst, pieces, keep) }
    }

    unsafe fn unpack_h2d(
        &self,
        stream: &HipStream,
        pieces: Vec<(DevicePtr, usize)>,
        src: *const u8,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the host side is only read.
        unsafe { self.pieces(stream, false, src.cast_mut(), pieces, keep) }
    }

    unsafe fn write_flag(&self, stream: &HipStream, flag: Flag, value: u32) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        match self.inner.flags {
            // SAFETY: the caller keeps the flag's slot held until the store has run.
            FlagPath::Kernels => unsafe { self.flag_kernel(stream, fixed::SIGNAL, flag, value) },
            _ => {
                // SAFETY: the flag is in `hipHostMalloc` memory held until the write has run (the
                // caller's contract); the write runs after the work queued before it.
                check("hipStreamWriteValue32", unsafe {
                    sys::hipStreamWriteValue32(stream.raw(), flag.device.0 as *mut c_void, value, 0)
                })
            }
        }
    }

    unsafe fn wait_flag(&self, stream: &HipStream, flag: Flag, value: u32, keep: Option<KeepAlive>) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        // SAFETY: the caller keeps the flag's slot held.
        let now = unsafe { flag.atomic() }.load(Ordering::Acquire);
        if reached(now, value) {
            // Flags only move forward: nothing to wait for, and nothing queued that needs `keep`.
            return Ok(());
        }
        let memop = match self.inner.flags {
            FlagPath::Kernels => false,
            _ => Self::memop_wait_is_exact(now, value),
        };
        if memop {
            // SAFETY: as in `write_flag`; the wait holds the stream until the value arrives, and
            // `memop_wait_is_exact` makes its plain comparison agree with the cyclic one.
            check("hipStreamWaitValue32", unsafe {
                sys::hipStreamWaitValue32(
                    stream.raw(),
                    flag.device.0 as *mut c_void,
                    value,
                    sys::WAIT_VALUE_GTE,
                    u32::MAX,
                )
            })?;
        } else {
            // SAFETY: the caller keeps the flag's slot held until the wait has finished.
            unsafe { self.flag_kernel(stream, fixed::STREAM_WAIT, flag, value) }?;
        }
        self.hold(stream, keep.into_iter().collect())
    }

    unsafe fn reduce_h2d(
        &self,
        stream: &HipStream,
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
        let row = op.row_bytes(rows, len)?;
        self.bind()?;
        let reduce = self.function(op.reduce.as_str())?;
        let finish = op.finish.map(|f| self.function(f.as_str())).transpose()?;
        let mapped = self.mapped(src.cast_mut())?;
        // SAFETY: the caller guarantees `dst` holds `len` elements and `src` `rows * len` of
        // pinned memory, both valid and untouched by others until the work has run.
        check("hipMemcpyAsync", unsafe {
            sys::hipMemcpyAsync(dst.0 as *mut c_void, src.cast(), row, sys::HOST_TO_DEVICE, stream.raw())
        })?;
        let blocks = self.blocks(len);
        for r in 1..rows {
            let (mut d, mut s, mut n) = (dst.0, mapped.offset(r * row).0, len);
            let mut args = [arg(&mut d), arg(&mut s), arg(&mut n)];
            // SAFETY: reduce kernels take `(dst, src, n)` over `n` elements of the operator's
            // type; row `r` lies in the caller's pinned allocation, read through its mapping,
            // and does not overlap `dst`.
            unsafe { self.launch(stream, reduce, blocks, BLOCK, &mut args) }?;
        }
        if let Some(finish) = finish {
            let (mut d, mut n, mut ranks) = (dst.0, len, op.ranks);
            let mut args = [arg(&mut d), arg(&mut n), arg(&mut ranks)];
            // SAFETY: finish kernels take `(dst, n, ranks: u32)`; `dst` holds `len` elements.
            unsafe { self.launch(stream, finish, blocks, BLOCK, &mut args) }?;
        }
        Ok(())
    }

    fn can_reduce(&self, op: &ReduceFns) -> bool {
        self.bind().is_ok()
            && self.function(op.reduce.as_str()).is_ok()
            && op.finish.is_none_or(|f| self.function(f.as_str()).is_ok())
    }

    fn join(&self, waiter: &HipStream, stream: &HipStream) -> Result<()> {
        self.check_stream(waiter)?;
        self.check_stream(stream)?;
        if Arc::ptr_eq(&waiter.inner, &stream.inner) {
            return Ok(());
        }
        self.bind()?;
        let mut raw: sys::hipEvent_t = null_mut();
        // SAFETY: writes one handle.
        check("hipEventCreateWithFlags", unsafe { sys::hipEventCreateWithFlags(&mut raw, sys::EVENT_DISABLE_TIMING) })?;
        let event = Event { raw, ordinal: self.inner.ordinal };
        // SAFETY: a live event and streams of this device.
        check("hipEventRecord", unsafe { sys::hipEventRecord(event.raw, stream.raw()) })?;
        // SAFETY: as above; the wait keeps what it needs after the event is destroyed.
        check("hipStreamWaitEvent", unsafe { sys::hipStreamWaitEvent(waiter.raw(), event.raw, 0) })
    }

    fn synchronize(&self, stream: &HipStream) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        // SAFETY: a valid stream handle.
        check("hipStreamSynchronize", unsafe { sys::hipStreamSynchronize(stream.raw()) })
    }

    fn query(&self, stream: &HipStream) -> Result<bool> {
        self.check_stream(stream)?;
        self.bind()?;
        // SAFETY: a valid stream handle.
        match unsafe { sys::hipStreamQuery(stream.raw()) } {
            sys::NOT_READY => Ok(false),
            status => check("hipStreamQuery", status).map(|()| true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memop_waits_only_where_plain_and_cyclic_comparisons_agree() {
        assert!(HipDevice::memop_wait_is_exact(0, 1));
        assert!(HipDevice::memop_wait_is_exact(5, MEMOP_WAIT_MAX));
        assert!(!HipDevice::memop_wait_is_exact(5, MEMOP_WAIT_MAX + 1));
        // Across a wrap of the counter: the flag is numerically above the value.
        assert!(!HipDevice::memop_wait_is_exact(u32::MAX - 1, 2));
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
