//! The CUDA device: cudarc's driver API, loaded at run time (the crate builds and links
//! without CUDA; [`driver_present`] says whether a driver can be loaded).
//!
//! Users bring their own [`CudaContext`], streams ([`Arc<CudaStream>`]) and buffers
//! ([`CudaSlice`], [`CudaView`], [`CudaViewMut`]). This module holds only the driver primitives
//! (over cudarc's `result` and `sys` layers) and the buffer traits; what the HostTransfer backend
//! builds on them (copies, flags, reductions, keep-alives) is the shared GPU layer,
//! `device::gpu`. Pinned staging memory is `cuMemHostAlloc(PORTABLE | DEVICEMAP)` (cached, not
//! write-combined: the proxy thread reads it); flags use `cuStreamWriteValue32`/
//! `cuStreamWaitValue32` ([`FlagPath::StreamMemOps`]) or the Rust kernels ([`FlagPath::Kernels`]).
//!
//! # Ordering with the buffers' own streams
//! A cudarc buffer belongs to the stream it was allocated on (its *home*; it is freed there, in
//! stream order). When an operation's stream is not a buffer's home, the operation's stream
//! waits for the home stream's work queued so far before the operation starts, and the home
//! stream waits for the operation's end. So the buffer may be dropped, or used by kernels on
//! its home stream, right after the call returns.
//!
//! cudarc's own dependency tracking (its per-buffer read and write events, on by default once
//! a context has several streams) sees every operation too. Taking a buffer's address makes the
//! home stream wait for the buffer's tracked write; before an operation is queued, a buffer it
//! writes also makes the home stream wait for its tracked read; after it is queued (the home
//! stream now waits for it), the buffer's read or write event is recorded on the home stream.
//! So cudarc work queued afterwards on *any* stream (a kernel launch, a copy) that uses the
//! buffer waits for the operation, and the operation waits for cudarc work queued before it on
//! any stream, as cudarc orders its own launches, with cudarc's limits: one read event per
//! buffer (reads on two other streams, then an operation that writes the buffer, order it
//! after the later read only), and nothing at all when tracking is off. Errors of these calls
//! are kept by cudarc and reported by the device's next call.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, CUdevice_attribute, CUmemorytype};
use cudarc::driver::{CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut};
use duralumin_kernels::Element;

pub use super::gpu::FlagPath;
use super::gpu::{Direction, Driver, Gpu, Home, HostBody, Shape, gpu_device};
use super::{DevicePtr, DeviceSlice, DeviceSliceMut, KeepAlive, sealed};
use crate::api::error::{Error, Result};
use crate::device_code::KernelModule;

/// Whether a CUDA driver library can be loaded (checked before any other call: cudarc panics
/// when the library is missing).
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library; no CUDA call is made.
    unsafe { sys::is_culib_present() }
}

/// Number of CUDA devices, 0 without a driver.
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

fn driver(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::device_from(call, e)
}

/// A CUDA device for the HostTransfer backend: one context, its kernels and its flag path.
///
/// Cloning gives another handle to the same device. When the last handle goes (communicators
/// hold one), the context's queued work is waited for before the device's kernels are
/// unloaded, since some of it may still be theirs.
#[derive(Clone)]
pub struct CudaDevice {
    gpu: Gpu<Cuda>,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.gpu.driver().ctx.ordinal())
            .field("flags", &self.gpu.flag_path())
            .finish_non_exhaustive()
    }
}

impl CudaDevice {
    /// The device of `ctx`, with the flag path chosen automatically.
    pub fn new(ctx: Arc<CudaContext>) -> Result<Self> {
        Self::with_flag_path(ctx, FlagPath::Auto)
    }

    /// The device of `ctx` with flags written and awaited by `flags` (both paths are tested;
    /// [`FlagPath::Kernels`] needs the builtin kernels, see [`crate::device_code`]).
    pub fn with_flag_path(ctx: Arc<CudaContext>, flags: FlagPath) -> Result<Self> {
        let flags = match flags {
            FlagPath::Auto => {
                let mut version = 0;
                // SAFETY: writes one int; the library is loaded (a context exists).
                let ok = unsafe { sys::cuDriverGetVersion(&mut version) }.result().is_ok();
                if ok && version >= 12000 { FlagPath::StreamMemOps } else { FlagPath::Kernels }
            }
            other => other,
        };
        let attr = |a| ctx.attribute(a).map_err(driver("cuDeviceGetAttribute"));
        let sms =
            u32::try_from(attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?).unwrap_or(0).max(1);
        let max_pitch = usize::try_from(attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH)?).unwrap_or(0);
        Ok(CudaDevice { gpu: Gpu::new(Cuda { ctx }, flags, sms, max_pitch)? })
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.gpu.driver().ctx
    }

    /// The flag path in use (never [`FlagPath::Auto`]).
    pub fn flag_path(&self) -> FlagPath {
        self.gpu.flag_path()
    }

    /// A new buffer of this device holding `data`, copied in `stream`'s order. Any
    /// [`Element`], a user's `#[repr(C)]` Pod struct included (cudarc's `clone_htod` takes its
    /// own `DeviceRepr` types only). [`Error::WrongDevice`] for a stream of another context.
    pub fn upload<T: Element>(&self, stream: &Arc<CudaStream>, data: &[T]) -> Result<CudaSlice<T>> {
        self.gpu.check_stream(stream)?;
        let bytes = bytemuck::cast_slice::<T, u8>(data);
        // At least one byte, so an empty buffer has an address too.
        let raw = if bytes.is_empty() { stream.alloc_zeros::<u8>(1) } else { stream.clone_htod(bytes) }
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        let ptr = raw.leak();
        // SAFETY: `ptr` is a live allocation of the stream's context holding `data.len()`
        // elements of `T` (their bytes, copied in stream order before any later use); the
        // returned slice owns it from here on and frees it when dropped.
        Ok(unsafe { stream.upgrade_device_ptr::<T>(ptr, data.len()) })
    }

    /// The contents of `buf` once the work queued on `stream` so far has run (the host waits).
    /// Any [`Element`], as [`upload`](Self::upload).
    pub fn download<T: Element>(&self, stream: &Arc<CudaStream>, buf: &CudaSlice<T>) -> Result<Vec<T>> {
        self.gpu.check_stream(stream)?;
        let mut out: Vec<T> = vec![bytemuck::Zeroable::zeroed(); buf.len()];
        let bytes = bytemuck::cast_slice_mut::<T, u8>(&mut out);
        // SAFETY: any bytes are valid `u8`s; the view covers exactly `buf`'s elements.
        let view = unsafe { buf.transmute::<u8>(bytes.len()) }
            .ok_or_else(|| Error::device("download", "the buffer is shorter than its length says"))?;
        stream.memcpy_dtoh(&view, bytes).map_err(driver("cuMemcpyDtoHAsync"))?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        Ok(out)
    }
}

gpu_device!(CudaDevice, Arc<CudaStream>, CudaEvent);

/// The CUDA driver primitives, for one context.
#[derive(Clone)]
pub(crate) struct Cuda {
    ctx: Arc<CudaContext>,
}

impl Cuda {
    /// Makes the context current on the calling thread, nothing else.
    fn make_current(&self) -> Result<()> {
        let ctx = self.ctx.cu_ctx();
        if cudarc::driver::result::ctx::get_current().map_err(driver("cuCtxGetCurrent"))? != Some(ctx) {
            // SAFETY: `ctx` is the live context the device holds.
            unsafe { cudarc::driver::result::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))?;
        }
        Ok(())
    }
}

/// Host function queued by [`Cuda::host_fn`].
///
/// # Safety
/// `payload` is what [`super::gpu::released`] expects, passed exactly once.
unsafe extern "C" fn release(payload: *mut c_void) {
    // SAFETY: guaranteed by the caller (the driver passes back what `host_fn` queued).
    unsafe { super::gpu::released(payload) }
}

impl Driver for Cuda {
    type Stream = Arc<CudaStream>;
    type Module = Arc<CudaModule>;
    type Function = CudaFunction;
    type Image = &'static str;
    type Event = CudaEvent;

    const API: &'static str = "cuda";
    const HOST_FN: &'static str = "cuLaunchHostFunc";

    fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The same `CUcontext` (two `CudaContext::new(0)` handles wrap the one primary context).
    fn owns(&self, stream: &Arc<CudaStream>) -> bool {
        stream.context().cu_ctx() == self.ctx.cu_ctx()
    }

    fn describe(stream: &Arc<CudaStream>) -> String {
        format!("a stream of another context (device {})", stream.context().ordinal())
    }

    fn same(a: &Arc<CudaStream>, b: &Arc<CudaStream>) -> bool {
        Arc::ptr_eq(a, b)
    }

    /// Reports any error cudarc recorded from an earlier asynchronous call (a drop, say) under
    /// its own name first.
    fn bind(&self) -> Result<()> {
        self.ctx.check_err().map_err(driver("an earlier CUDA call (error recorded by cudarc)"))?;
        self.make_current()
    }

    fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.ctx.new_stream().map_err(driver("cuStreamCreate"))
    }

    fn host_alloc(&self, bytes: usize) -> Result<*mut u8> {
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: allocates `bytes` bytes of page-locked memory (the caller zero-fills it).
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes, flags) }.map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Error::OutOfMemory { what: "pinned host memory (cuMemHostAlloc)", bytes }
            }
            _ => driver("cuMemHostAlloc")(e),
        })?;
        Ok(ptr.cast())
    }

    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()> {
        self.make_current()?;
        // SAFETY: the caller guarantees `ptr` came from `host_alloc` and no queued work uses it.
        unsafe { cudarc::driver::result::free_host(ptr.cast()) }.map_err(driver("cuMemFreeHost"))
    }

    fn raw_stream(stream: &Arc<CudaStream>) -> *mut c_void {
        stream.cu_stream().cast()
    }

    fn alloc_async(&self, stream: &Arc<CudaStream>, bytes: usize) -> Result<DevicePtr> {
        self.make_current()?;
        // SAFETY: a live stream of this context; the memory is not read before it is written
        // (the caller's contract for scratch).
        let ptr =
            unsafe { cudarc::driver::result::malloc_async(stream.cu_stream(), bytes.max(1)) }.map_err(|e| {
                match e.0 {
                    sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                        Error::OutOfMemory { what: "device scratch (cuMemAllocAsync)", bytes }
                    }
                    _ => driver("cuMemAllocAsync")(e),
                }
            })?;
        Ok(DevicePtr(ptr))
    }

    unsafe fn free_async(&self, stream: &Arc<CudaStream>, ptr: DevicePtr) -> Result<()> {
        self.make_current()?;
        // SAFETY: `ptr` came from `alloc_async` and nothing queued later uses it (caller).
        unsafe { cudarc::driver::result::free_async(ptr.0, stream.cu_stream()) }.map_err(driver("cuMemFreeAsync"))
    }

    unsafe fn memcpy_d2d(&self, stream: &Arc<CudaStream>, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()> {
        // SAFETY: both ranges are device memory valid until the copy has run (caller).
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst.0, src.0, bytes, stream.cu_stream()) }
            .map_err(driver("cuMemcpyDtoDAsync"))
    }

    fn host_device_ptr(&self, host: *mut u8) -> Result<DevicePtr> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` lies in memory from `cuMemHostAlloc(DEVICEMAP)`; writes one address.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut ptr, host.cast(), 0) }
            .result()
            .map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok(DevicePtr(ptr))
    }

    unsafe fn memcpy(
        &self,
        stream: &Arc<CudaStream>,
        dir: Direction,
        host: *mut u8,
        device: DevicePtr,
        bytes: usize,
    ) -> Result<()> {
        let s = stream.cu_stream();
        // SAFETY: the caller guarantees both ranges valid until the copy has run; the host side
        // is pinned, so the copy is asynchronous.
        unsafe {
            match dir {
                Direction::ToHost => sys::cuMemcpyDtoHAsync_v2(host.cast(), device.0, bytes, s)
                    .result()
                    .map_err(driver("cuMemcpyDtoHAsync")),
                Direction::ToDevice => sys::cuMemcpyHtoDAsync_v2(device.0, host as *const c_void, bytes, s)
                    .result()
                    .map_err(driver("cuMemcpyHtoDAsync")),
            }
        }
    }

    unsafe fn memcpy_2d(
        &self,
        stream: &Arc<CudaStream>,
        dir: Direction,
        host: *mut u8,
        host_pitch: usize,
        device: DevicePtr,
        device_pitch: usize,
        row_bytes: usize,
        rows: usize,
    ) -> Result<()> {
        let to_host = dir == Direction::ToHost;
        // Every field set: a zeroed CUDA_MEMCPY2D is not a valid value (its memory-type enums
        // have no zero variant).
        let (host_side, device_side) = (CUmemorytype::CU_MEMORYTYPE_HOST, CUmemorytype::CU_MEMORYTYPE_DEVICE);
        let p = sys::CUDA_MEMCPY2D {
            srcXInBytes: 0,
            srcY: 0,
            srcMemoryType: if to_host { device_side } else { host_side },
            srcHost: if to_host { std::ptr::null() } else { host as *const c_void },
            srcDevice: if to_host { device.0 } else { 0 },
            srcArray: std::ptr::null_mut(),
            srcPitch: if to_host { device_pitch } else { host_pitch },
            dstXInBytes: 0,
            dstY: 0,
            dstMemoryType: if to_host { host_side } else { device_side },
            dstHost: if to_host { host.cast() } else { std::ptr::null_mut() },
            dstDevice: if to_host { 0 } else { device.0 },
            dstArray: std::ptr::null_mut(),
            dstPitch: if to_host { host_pitch } else { device_pitch },
            WidthInBytes: row_bytes,
            Height: rows,
        };
        // SAFETY: the caller guarantees every row of both sides valid until the copy has run.
        unsafe { sys::cuMemcpy2DAsync_v2(&p, stream.cu_stream()) }.result().map_err(driver("cuMemcpy2DAsync"))
    }

    fn find(&self, entry: &str) -> Result<(&'static str, usize, &'static str)> {
        let kernel = crate::device_code::find_ptx(entry)?;
        Ok((kernel.ptx.text, kernel.ptx.text.as_ptr() as usize, kernel.entry))
    }

    fn has_image(&self, module: &KernelModule) -> bool {
        module.ptx.is_some()
    }

    fn load_module(&self, ptx: &'static str) -> Result<Arc<CudaModule>> {
        self.ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx)).map_err(driver("cuModuleLoadData"))
    }

    fn get_function(&self, module: &Arc<CudaModule>, entry: &str) -> Result<CudaFunction> {
        module.load_function(entry).map_err(driver("cuModuleGetFunction"))
    }

    fn offer_host_body(&self, entry: &str, body: HostBody) {
        let Some(register) = simulator_hook() else { return };
        let Ok(name) = std::ffi::CString::new(entry) else { return };
        let (kind, elem_size, run) = match body {
            HostBody::Reduce { elem_size, run } => (0, elem_size, run as *const c_void),
            HostBody::Finish { elem_size, run } => (1, elem_size, run as *const c_void),
        };
        // SAFETY: the simulator's registration call: a NUL-terminated name and a function of
        // `kind`'s signature (a monomorphized host body, valid for the process's life) that
        // touches only the `n` elements it is given.
        let status = unsafe { register(name.as_ptr(), kind, elem_size, run) };
        if status != 0 {
            tracing::warn!("cudasim refused the host body of {entry}: status {status}");
        }
    }

    unsafe fn launch(
        &self,
        stream: &Arc<CudaStream>,
        function: &CudaFunction,
        shape: Shape,
        args: &mut [*mut c_void],
    ) -> Result<()> {
        let (call, name): (unsafe fn(_, _, _, _, _, &mut [*mut c_void]) -> _, _) = if shape.together {
            (cudarc::driver::result::launch_cooperative_kernel, "cuLaunchCooperativeKernel")
        } else {
            (cudarc::driver::result::launch_kernel, "cuLaunchKernel")
        };
        let (grid, block) = ((shape.blocks, 1, 1), (shape.threads, 1, 1));
        // SAFETY: forwarded from the caller; the function is loaded in this context (it holds
        // its module), which the caller made current.
        unsafe { call(function.cu_function(), grid, block, 0, stream.cu_stream(), args) }.map_err(driver(name))
    }

    unsafe fn host_fn(&self, stream: &Arc<CudaStream>, payload: *mut c_void) -> Result<()> {
        // SAFETY: `release` hands `payload` back exactly once, when the stream reaches it.
        unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(release), payload) }
            .result()
            .map_err(driver("cuLaunchHostFunc"))
    }

    unsafe fn write_value(&self, stream: &Arc<CudaStream>, flag: DevicePtr, value: u32) -> Result<()> {
        let default = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
        // SAFETY: the flag is mapped host memory held until the write has run (the caller's
        // contract); the default flags order the write after all prior work of the stream,
        // behind a system-wide fence.
        unsafe { sys::cuStreamWriteValue32_v2(stream.cu_stream(), flag.0, value, default) }
            .result()
            .map_err(driver("cuStreamWriteValue32"))
    }

    unsafe fn wait_value(&self, stream: &Arc<CudaStream>, flag: DevicePtr, value: u32) -> Result<()> {
        // GEQ compares cyclically, `(int32_t)(*flag - value) >= 0`, as `reached` does.
        let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: as in `write_value`; the wait holds the stream until the value arrives.
        unsafe { sys::cuStreamWaitValue32_v2(stream.cu_stream(), flag.0, value, geq) }
            .result()
            .map_err(driver("cuStreamWaitValue32"))
    }

    fn join(&self, waiter: &Arc<CudaStream>, stream: &Arc<CudaStream>) -> Result<()> {
        waiter.join(stream).map_err(driver("cuStreamWaitEvent"))
    }

    fn new_event(&self) -> Result<CudaEvent> {
        self.ctx.new_event(None).map_err(driver("cuEventCreate"))
    }

    fn record_event(&self, event: &CudaEvent, stream: &Arc<CudaStream>) -> Result<()> {
        event.record(stream).map_err(driver("cuEventRecord"))
    }

    fn event_done(&self, event: &CudaEvent) -> Result<bool> {
        event.try_is_complete().map_err(driver("cuEventQuery"))
    }

    fn wait_event(&self, waiter: &Arc<CudaStream>, event: &CudaEvent) -> Result<()> {
        waiter.wait(event).map_err(driver("cuStreamWaitEvent"))
    }

    fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<()> {
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    fn query(&self, stream: &Arc<CudaStream>) -> Result<bool> {
        // SAFETY: a live stream of this device's context, which is current.
        match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(driver("cuStreamQuery")(DriverError(e))),
        }
    }

    fn drained(&self, stream: &Arc<CudaStream>) -> bool {
        // The raw calls, not cudarc's, which would take an error recorded for the device's next
        // call, and fail on it.
        // SAFETY: the context and the stream are alive (held here); a failing call only makes
        // this report the stream as not drained.
        unsafe {
            cudarc::driver::result::ctx::set_current(self.ctx.cu_ctx()).is_ok()
                && sys::cuStreamSynchronize(stream.cu_stream()).result().is_ok()
        }
    }

    fn synchronize_all(&self) -> Result<()> {
        self.ctx.synchronize().map_err(driver("cuCtxSynchronize"))
    }
}

/// Implements [`DeviceSlice`] for cudarc's buffer types: the address is read with cudarc's
/// `DevicePtr` on the buffer's home stream, so the home stream (and through `acquire` the
/// operation) waits for the writes cudarc tracked on other streams; the keep-alive carries the
/// home stream for the ordering described in the module docs.
macro_rules! cuda_slice {
    ($($ty:ty),*) => {$(
        impl<T: Element> sealed::Sealed for $ty {}

        impl<T: Element> DeviceSlice<CudaDevice> for $ty {
            type Elem = T;

            fn device_ptr(&self) -> DevicePtr {
                let home = cudarc::driver::DeviceSlice::stream(self);
                let (ptr, record) = cudarc::driver::DevicePtr::device_ptr(self, home);
                // Not dropped: that would record the buffer's read event on the home stream now,
                // replacing a read another stream recorded, which a write by the operation must
                // still wait for (`track_write`). The guard only borrows; forgetting it leaks
                // nothing.
                std::mem::forget(record);
                DevicePtr(ptr)
            }

            fn len(&self) -> usize {
                cudarc::driver::DeviceSlice::len(self)
            }

            fn ordinal(&self) -> usize {
                cudarc::driver::DeviceSlice::stream(self).context().ordinal()
            }

            fn keep_alive(&self) -> Option<KeepAlive> {
                Some(Arc::new(Home(Arc::clone(cudarc::driver::DeviceSlice::stream(self)))))
            }

            fn track_read(&self) {
                // The home stream is ordered after the operation (`release`), so the read
                // event recorded there now covers it.
                let home = cudarc::driver::DeviceSlice::stream(self);
                drop(cudarc::driver::DevicePtr::device_ptr(self, home));
            }
        }
    )*};
}

cuda_slice!(CudaSlice<T>, CudaView<'_, T>, CudaViewMut<'_, T>);

/// Implements [`DeviceSliceMut`] for cudarc's writable buffer types with `DevicePtrMut` on the
/// home stream: it makes the home stream wait for the buffer's read and write events and then
/// records its write event there.
macro_rules! cuda_slice_mut {
    ($($ty:ty),*) => {$(
        impl<T: Element> DeviceSliceMut<CudaDevice> for $ty {
            fn track_write(&mut self) {
                let home = Arc::clone(cudarc::driver::DeviceSlice::stream(self));
                drop(cudarc::driver::DevicePtrMut::device_ptr_mut(self, &home));
            }
        }
    )*};
}

cuda_slice_mut!(CudaSlice<T>, CudaViewMut<'_, T>);

/// cudasim's `cudasimRegisterHostKernel`, when the loaded driver is the simulator (a real
/// driver has no such symbol). Looked up once.
fn simulator_hook() -> Option<RegisterHostKernel> {
    static HOOK: std::sync::OnceLock<Option<RegisterHostKernel>> = std::sync::OnceLock::new();
    *HOOK.get_or_init(|| {
        // SAFETY: a device exists, so the driver library is loaded (`culib` returns it);
        // looking a symbol up runs nothing, and the symbol's type is the simulator's signature.
        unsafe { sys::culib().get::<RegisterHostKernel>(b"cudasimRegisterHostKernel\0") }.ok().map(|f| *f)
    })
}

/// The signature of cudasim's `cudasimRegisterHostKernel(name, kind, elem_size, body)`.
type RegisterHostKernel =
    unsafe extern "C" fn(*const std::ffi::c_char, std::ffi::c_int, usize, *const c_void) -> std::ffi::c_int;
