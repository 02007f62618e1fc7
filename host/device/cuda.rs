//! The CUDA device: cudarc's driver API, loaded at run time (the crate builds and links
//! without CUDA; [`driver_present`] says whether a driver can be loaded).
//!
//! Users bring their own [`CudaContext`], streams ([`Arc<CudaStream>`]) and buffers
//! ([`CudaSlice`], [`CudaView`], [`CudaViewMut`]). The device adds what the HostTransfer backend
//! needs on top:
//!
//! * pinned staging memory from `cuMemHostAlloc(PORTABLE | DEVICEMAP)` (cached, not
//!   write-combined: the proxy thread reads it), and its mapped device address;
//! * 2-D copies with `cuMemcpy2DAsync`, packed v-collective blocks with one launch of the
//!   `pack_segments`/`unpack_segments` kernels, which read their segment lists from pinned
//!   mapped memory (no copy is queued for them, see [`super::arg_lists`]);
//! * flags: `cuStreamWriteValue32`/`cuStreamWaitValue32` ([`FlagPath::StreamMemOps`]) or the
//!   Rust `signal`/`stream_wait` kernels ([`FlagPath::Kernels`]);
//! * reductions of staged rows into device memory with the reduction kernels, reading the rows
//!   through host-mapped memory.
//!
//! The proxy thread queues pipelined operations' copies while device streams wait for its
//! flags, so nothing it calls may wait for the device: every built-in kernel is loaded when
//! the device is made (lazy loading may synchronize the context on a kernel's first launch),
//! pack segment lists are written to pinned memory the kernel reads (a copy from pageable
//! memory may wait for a stream that waits for this thread), and the staging pool never frees
//! pinned memory from that thread.
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

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::result::DriverError;
use cudarc::driver::sys::{self, CUdevice_attribute, CUmemorytype};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, CudaViewMut, LaunchConfig, PushKernelArg,
};
use duralumin_kernels::Element;
use duralumin_kernels::names::fixed;
use duralumin_kernels::pack::Segment;

use super::arg_lists::ArgLists;
use super::{Copy2d, Device, DevicePtr, DeviceSlice, DeviceSliceMut, Flag, KeepAlive, ReduceFns, sealed};
use crate::error::{Error, Result};

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
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

/// How streams write and wait for flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FlagPath {
    /// Stream memory operations where the driver has them (CUDA 12 and later), else kernels.
    #[default]
    Auto,
    /// `cuStreamWriteValue32` / `cuStreamWaitValue32` (the GPU front end polls; no SM is used).
    StreamMemOps,
    /// One-thread `signal` and `stream_wait` kernels from `duralumin-kernels` (works on any
    /// driver; a waiting stream holds one SM slot while it spins).
    Kernels,
}

fn driver(call: &'static str) -> impl FnOnce(DriverError) -> Error {
    move |e| Error::Device { call, message: format!("{e:?}") }
}

/// Threads per block of the grid-stride kernels.
const BLOCK: u32 = 256;

/// A CUDA device for the HostTransfer backend: one context, its kernels and its flag path.
///
/// Cloning gives another handle to the same device. When the last handle goes (communicators
/// hold one), the context's queued work is waited for before the device's kernels are
/// unloaded, since some of it may still be theirs.
#[derive(Clone)]
pub struct CudaDevice {
    inner: Arc<Inner>,
}

struct Inner {
    ctx: Arc<CudaContext>,
    flags: FlagPath,
    sms: u32,
    max_pitch: usize,
    /// Pinned memory the pack kernels read their segment lists from.
    arg_lists: Arc<ArgLists>,
    /// Loaded kernel modules by PTX text address, and functions by entry name.
    modules: Mutex<HashMap<usize, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, CudaFunction>>,
}

impl Drop for Inner {
    /// Kernels of the device's modules may still be queued (a flag kernel behind an
    /// operation's last wait, say): a module unloaded before they run takes their code away.
    /// So the modules are unloaded only once the context is through with its queued work. The
    /// proxy thread must not wait for that (streams of other communicators on this context may
    /// be waiting for it): there, another thread waits and unloads.
    fn drop(&mut self) {
        let modules = std::mem::take(self.modules.get_mut().unwrap_or_else(PoisonError::into_inner));
        let functions = std::mem::take(self.functions.get_mut().unwrap_or_else(PoisonError::into_inner));
        // Addresses, so the closure below may move to another thread.
        let lists: Vec<usize> = self.arg_lists.blocks().into_iter().map(|(p, _)| p as usize).collect();
        if modules.is_empty() && lists.is_empty() {
            return;
        }
        let ctx = Arc::clone(&self.ctx);
        let unload = move || {
            // An error (a failed kernel) is recorded for the context's next user, as cudarc
            // does in its own drops; the modules and lists go either way.
            ctx.record_err(ctx.synchronize());
            drop(functions);
            drop(modules);
            ctx.record_err(ctx.bind_to_thread());
            for p in lists {
                // SAFETY: an argument list block from `cuMemHostAlloc`; the context has run
                // every kernel that could read it.
                ctx.record_err(unsafe { cudarc::driver::result::free_host(p as *mut c_void) });
            }
        };
        if crate::progress::on_proxy_thread() {
            // Without a thread, the modules stay loaded (until the context goes) rather than
            // the proxy thread waiting for the device.
            let _ = std::thread::Builder::new().name("duralumin-unload".into()).spawn(unload);
        } else {
            unload();
        }
    }
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.inner.ctx.ordinal())
            .field("flags", &self.inner.flags)
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
        let sms = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?.max(1) as u32;
        let max_pitch = attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_PITCH)?.max(0) as usize;
        let device = CudaDevice {
            inner: Arc::new(Inner {
                arg_lists: Arc::default(),
                ctx,
                flags,
                sms,
                max_pitch,
                modules: Mutex::default(),
                functions: Mutex::default(),
            }),
        };
        // Load every built-in kernel now, on the caller's thread. With lazy module loading (the
        // default since CUDA 12.2) a kernel is otherwise loaded on its first launch, which may
        // synchronize the context: on the proxy thread, while streams wait for its flags, that
        // would never return. It also fails now, not on the first operation, when the kernels
        // are missing.
        let builtin = crate::device_code::builtin();
        if builtin.ptx.is_some() {
            for entry in builtin.entries {
                device.function(entry)?;
            }
        } else if flags == FlagPath::Kernels {
            device.function(fixed::SIGNAL)?;
        }
        Ok(device)
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    /// The flag path in use (never [`FlagPath::Auto`]).
    pub fn flag_path(&self) -> FlagPath {
        self.inner.flags
    }

    /// The kernel `entry` of a registered module, loaded into this context on first use.
    fn function(&self, entry: &str) -> Result<CudaFunction> {
        let mut functions = self.inner.functions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = functions.get(entry) {
            return Ok(f.clone());
        }
        let kernel = crate::device_code::find_ptx(entry)?;
        let module = {
            let mut modules = self.inner.modules.lock().unwrap_or_else(PoisonError::into_inner);
            let key = kernel.ptx.text.as_ptr() as usize;
            match modules.get(&key) {
                Some(m) => Arc::clone(m),
                None => {
                    let ptx = cudarc::nvrtc::Ptx::from_src(kernel.ptx.text);
                    let m = self.inner.ctx.load_module(ptx).map_err(driver("cuModuleLoadData"))?;
                    modules.insert(key, Arc::clone(&m));
                    m
                }
            }
        };
        let f = module.load_function(kernel.entry).map_err(driver("cuModuleGetFunction"))?;
        functions.insert(entry.to_owned(), f.clone());
        Ok(f)
    }

    /// A grid-stride launch shape for `items` work items.
    fn grid(&self, items: usize) -> LaunchConfig {
        let blocks = items.div_ceil(BLOCK as usize * 4).clamp(1, self.inner.sms as usize * 8) as u32;
        LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 }
    }

    /// Whether `stream` belongs to this device's context: the same `CUcontext` (two
    /// `CudaContext::new(0)` handles wrap the one primary context).
    fn same_context(&self, stream: &CudaStream) -> bool {
        stream.context().cu_ctx() == self.inner.ctx.cu_ctx()
    }

    fn check_stream(&self, stream: &CudaStream) -> Result<()> {
        if self.same_context(stream) {
            Ok(())
        } else {
            Err(Error::WrongDevice {
                what: "stream",
                expected: self.name(),
                found: format!("a stream of another context (device {})", stream.context().ordinal()),
            })
        }
    }

    /// Makes the device's context current on the calling thread, after reporting any error
    /// cudarc recorded from an earlier asynchronous call (a drop, say) under its own name.
    fn bind(&self) -> Result<()> {
        self.inner.ctx.check_err().map_err(driver("an earlier CUDA call (error recorded by cudarc)"))?;
        self.make_current()
    }

    /// Makes the device's context current on the calling thread, nothing else.
    fn make_current(&self) -> Result<()> {
        let ctx = self.inner.ctx.cu_ctx();
        if cudarc::driver::result::ctx::get_current().map_err(driver("cuCtxGetCurrent"))? != Some(ctx) {
            // SAFETY: `ctx` is the live context the device holds.
            unsafe { cudarc::driver::result::ctx::set_current(ctx) }.map_err(driver("cuCtxSetCurrent"))?;
        }
        Ok(())
    }

    /// Keeps the entries of `keep` that are not home streams alive until the work queued on
    /// `stream` so far has run (home streams are ordered by `acquire`/`release` instead).
    fn hold_others(&self, stream: &Arc<CudaStream>, keep: Vec<KeepAlive>) -> Result<()> {
        self.hold(stream, keep.into_iter().filter(|k| !k.is::<Home>()).collect())
    }

    /// Keeps `keep` alive until the work queued on `stream` so far has run: a host function
    /// hands it to the reaper thread, which drops it (host functions may not call CUDA, and a
    /// drop might free pinned memory). When the host function cannot be queued, `keep` is
    /// dropped once the stream has been synchronized, on a thread of its own, and leaked if that
    /// fails (see [`super::reaper::drop_when_drained`]).
    fn hold(&self, stream: &Arc<CudaStream>, keep: Vec<KeepAlive>) -> Result<()> {
        if keep.is_empty() {
            return Ok(());
        }
        let (error, keep) = match self.bind().and_then(|()| super::reaper::start("cuLaunchHostFunc")) {
            Err(e) => (e, keep),
            Ok(()) => {
                let payload = Box::into_raw(Box::new(keep));
                // SAFETY: `release` takes back the box exactly once, when the stream reaches it.
                let queued = unsafe { sys::cuLaunchHostFunc(stream.cu_stream(), Some(release), payload.cast()) };
                match queued.result() {
                    Ok(()) => return Ok(()),
                    // SAFETY: the host function was not queued, so the box is still ours.
                    Err(e) => (driver("cuLaunchHostFunc")(e), *unsafe { Box::from_raw(payload) }),
                }
            }
        };
        // The work queued so far may still use what `keep` holds.
        let (ctx, stream) = (Arc::clone(&self.inner.ctx), Arc::clone(stream));
        super::reaper::drop_when_drained(keep, move || {
            // The raw calls, not cudarc's, which would take an error recorded for the device's
            // next call, and fail on it.
            // SAFETY: the context and the stream are alive (held here); a failing call only
            // makes this report the stream as not drained.
            unsafe {
                cudarc::driver::result::ctx::set_current(ctx.cu_ctx()).is_ok()
                    && sys::cuStreamSynchronize(stream.cu_stream()).result().is_ok()
            }
        });
        Err(error)
    }

    /// One 2-D (or 1-D) copy.
    ///
    /// # Safety
    /// As [`Device::copy_d2h`]; exactly one side is host memory.
    unsafe fn copy(
        &self,
        stream: &Arc<CudaStream>,
        to_host: bool,
        host: *mut u8,
        device: DevicePtr,
        shape: Copy2d,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        if shape.bytes() == 0 {
            return self.hold_others(stream, keep.into_iter().collect());
        }
        self.bind()?;
        let (host_pitch, device_pitch) =
            if to_host { (shape.dst_pitch, shape.src_pitch) } else { (shape.src_pitch, shape.dst_pitch) };
        let s = stream.cu_stream();
        let contiguous = shape.rows == 1 || (host_pitch == shape.row_bytes && device_pitch == shape.row_bytes);
        // One contiguous run `(host offset, device offset, bytes)`.
        let run = |h: usize, d: usize, bytes: usize| {
            // SAFETY: the caller guarantees both sides are valid for the shape until the copy
            // has run; the host side is pinned memory, so the copy is asynchronous.
            unsafe {
                if to_host {
                    sys::cuMemcpyDtoHAsync_v2(host.add(h).cast(), device.0 + d as u64, bytes, s)
                        .result()
                        .map_err(driver("cuMemcpyDtoHAsync"))
                } else {
                    sys::cuMemcpyHtoDAsync_v2(device.0 + d as u64, host.add(h) as *const c_void, bytes, s)
                        .result()
                        .map_err(driver("cuMemcpyHtoDAsync"))
                }
            }
        };
        if contiguous {
            run(0, 0, shape.bytes())?;
        } else if host_pitch.max(device_pitch) <= self.inner.max_pitch {
            // Every field set: a zeroed CUDA_MEMCPY2D is not a valid value (its memory-type
            // enums have no zero variant).
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
                WidthInBytes: shape.row_bytes,
                Height: shape.rows,
            };
            // SAFETY: as for `run`, for every row of the shape.
            unsafe { sys::cuMemcpy2DAsync_v2(&p, s) }.result().map_err(driver("cuMemcpy2DAsync"))?;
        } else {
            // Rows further apart than the driver's 2-D limit go one by one.
            for r in 0..shape.rows {
                run(r * host_pitch, r * device_pitch, shape.row_bytes)?;
            }
        }
        self.hold_others(stream, keep.into_iter().collect())
    }

    /// One launch of the pack (`to_host`) or unpack kernel over `pieces`.
    ///
    /// # Safety
    /// As [`Device::pack_d2h`].
    unsafe fn pieces(
        &self,
        stream: &Arc<CudaStream>,
        to_host: bool,
        host: *mut u8,
        pieces: Vec<(DevicePtr, usize)>,
        mut keep: Vec<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        let total: usize = pieces.iter().map(|p| p.1).sum();
        let nonempty: Vec<(DevicePtr, usize)> = pieces.into_iter().filter(|p| p.1 > 0).collect();
        let Some(base) = nonempty.iter().map(|p| p.0).min() else {
            return self.hold_others(stream, keep);
        };
        self.bind()?;
        let mapped = self.mapped(host)?;
        // Device offsets from `base`; the host side is packed in piece order.
        let segments: Vec<Segment> =
            nonempty.iter().map(|&(ptr, bytes)| Segment::new(ptr.0 - base.0, bytes as u64)).collect();
        let list = self.inner.arg_lists.take_on(self, bytemuck::cast_slice(&segments))?;
        let count = segments.len();
        let (f, dst, src) = if to_host {
            (self.function(fixed::PACK_SEGMENTS)?, mapped.0, base.0)
        } else {
            (self.function(fixed::UNPACK_SEGMENTS)?, base.0, mapped.0)
        };
        let list_ptr = list.device_ptr().0;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&dst).arg(&src).arg(&list_ptr).arg(&count);
        // SAFETY: the pack kernels take `(dst, src, segments, count)`; every segment lies in a
        // piece the caller guarantees valid, the packed side holds `total` bytes, and the list
        // (mapped memory holding `count` segments) is kept until the stream has run the kernel.
        unsafe { launch.launch(self.grid(total / 16 + 1)) }.map_err(driver("cuLaunchKernel"))?;
        keep.push(Arc::new(list));
        self.hold_others(stream, keep)
    }

    /// A one-thread launch of a flag kernel.
    fn flag_kernel(&self, stream: &CudaStream, entry: &str, flag: Flag, value: u32) -> Result<()> {
        let f = self.function(entry)?;
        let ptr = flag.device.0;
        let mut launch = stream.launch_builder(&f);
        launch.arg(&ptr).arg(&value);
        let one = LaunchConfig { grid_dim: (1, 1, 1), block_dim: (1, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the flag kernels take `(flag, value)`; the flag is host-mapped memory the
        // caller keeps allocated until the kernel has run.
        unsafe { launch.launch(one) }.map(drop).map_err(driver("cuLaunchKernel"))
    }
}

/// A buffer's home stream, as carried in its keep-alive.
struct Home(Arc<CudaStream>);

/// The distinct home streams among `keep` other than `stream`.
fn homes<'a>(keep: &'a [KeepAlive], stream: &Arc<CudaStream>) -> Vec<&'a Arc<CudaStream>> {
    let mut out: Vec<&Arc<CudaStream>> = Vec::new();
    for home in keep.iter().filter_map(|k| k.downcast_ref::<Home>()) {
        if !Arc::ptr_eq(&home.0, stream) && !out.iter().any(|h| Arc::ptr_eq(h, &home.0)) {
            out.push(&home.0);
        }
    }
    out
}

/// Host function queued by [`CudaDevice::hold`].
///
/// # Safety
/// `payload` is a `Box<Vec<KeepAlive>>` from `Box::into_raw`, passed exactly once.
unsafe extern "C" fn release(payload: *mut c_void) {
    // SAFETY: guaranteed by the caller (the driver passes back what `hold` queued).
    let keep = unsafe { Box::from_raw(payload.cast::<Vec<KeepAlive>>()) };
    super::reaper::reap(*keep);
}

impl sealed::Sealed for CudaDevice {}

impl Device for CudaDevice {
    type Stream = Arc<CudaStream>;

    fn name(&self) -> String {
        format!("cuda:{}", self.inner.ctx.ordinal())
    }

    fn ordinal(&self) -> usize {
        self.inner.ctx.ordinal()
    }

    fn owns(&self, stream: &Arc<CudaStream>) -> bool {
        self.same_context(stream)
    }

    fn new_stream(&self) -> Result<Arc<CudaStream>> {
        self.inner.ctx.new_stream().map_err(driver("cuStreamCreate"))
    }

    fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: allocates `bytes.max(1)` bytes of page-locked memory; zero-filled below
        // before anyone reads it.
        let ptr = unsafe { cudarc::driver::result::malloc_host(bytes.max(1), flags) }.map_err(|e| match e.0 {
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Error::OutOfMemory { what: "pinned host memory (cuMemHostAlloc)", bytes }
            }
            _ => driver("cuMemHostAlloc")(e),
        })?;
        // SAFETY: `ptr` is a fresh allocation of at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        Ok(ptr.cast())
    }

    unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) {
        // Not `bind`: an unrelated error cudarc recorded earlier must not leak the memory.
        if self.make_current().is_ok() {
            // SAFETY: the caller guarantees `ptr` came from `alloc_pinned` and no queued work
            // uses it.
            let _ = unsafe { cudarc::driver::result::free_host(ptr.cast()) };
        }
    }

    fn mapped(&self, host: *mut u8) -> Result<DevicePtr> {
        self.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `host` lies in memory from `cuMemHostAlloc(DEVICEMAP)`; writes one address.
        unsafe { sys::cuMemHostGetDevicePointer_v2(&mut ptr, host.cast(), 0) }
            .result()
            .map_err(driver("cuMemHostGetDevicePointer"))?;
        Ok(DevicePtr(ptr))
    }

    unsafe fn copy_d2h(
        &self,
        stream: &Arc<CudaStream>,
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
        stream: &Arc<CudaStream>,
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
        stream: &Arc<CudaStream>,
        dst: *mut u8,
        pieces: Vec<(DevicePtr, usize)>,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.pieces(stream, true, dst, pieces, keep) }
    }

    unsafe fn unpack_h2d(
        &self,
        stream: &Arc<CudaStream>,
        pieces: Vec<(DevicePtr, usize)>,
        src: *const u8,
        keep: Vec<KeepAlive>,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the host side is only read.
        unsafe { self.pieces(stream, false, src.cast_mut(), pieces, keep) }
    }

    unsafe fn write_flag(&self, stream: &Arc<CudaStream>, flag: Flag, value: u32) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        match self.inner.flags {
            FlagPath::Kernels => self.flag_kernel(stream, fixed::SIGNAL, flag, value),
            _ => {
                let default = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
                // SAFETY: the flag is host-mapped memory held until the write has run (the
                // caller's contract); the default flags order the write after all prior work
                // of the stream, behind a system-wide fence.
                unsafe { sys::cuStreamWriteValue32_v2(stream.cu_stream(), flag.device.0, value, default) }
                    .result()
                    .map_err(driver("cuStreamWriteValue32"))
            }
        }
    }

    unsafe fn wait_flag(
        &self,
        stream: &Arc<CudaStream>,
        flag: Flag,
        value: u32,
        keep: Option<KeepAlive>,
    ) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        match self.inner.flags {
            FlagPath::Kernels => self.flag_kernel(stream, fixed::STREAM_WAIT, flag, value)?,
            _ => {
                // GEQ compares cyclically, `(int32_t)(*flag - value) >= 0`, as `reached` does.
                let geq = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
                // SAFETY: as in `write_flag`; the wait holds the stream until the value arrives.
                unsafe { sys::cuStreamWaitValue32_v2(stream.cu_stream(), flag.device.0, value, geq) }
                    .result()
                    .map_err(driver("cuStreamWaitValue32"))?;
            }
        }
        self.hold(stream, keep.into_iter().collect())
    }

    unsafe fn reduce_h2d(
        &self,
        stream: &Arc<CudaStream>,
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
        // SAFETY: the caller guarantees `dst` holds `len` elements and `src` `rows * len` of
        // pinned memory, both valid until the work has run.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst.0, src.cast(), row, stream.cu_stream()) }
            .result()
            .map_err(driver("cuMemcpyHtoDAsync"))?;
        let cfg = self.grid(len);
        for r in 1..rows {
            // SAFETY: row `r` lies inside the caller's pinned allocation.
            let from = self.mapped(unsafe { src.add(r * row) }.cast_mut())?.0;
            let mut launch = stream.launch_builder(&reduce);
            launch.arg(&dst.0).arg(&from).arg(&len);
            // SAFETY: reduce kernels take `(dst, src, n)` over `n` elements of the operator's
            // type; both ranges are valid (the caller's contract) and do not overlap.
            unsafe { launch.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
        }
        if let Some(finish) = finish {
            let mut launch = stream.launch_builder(&finish);
            launch.arg(&dst.0).arg(&len).arg(&op.ranks);
            // SAFETY: finish kernels take `(dst, n, ranks)`; `dst` holds `len` elements.
            unsafe { launch.launch(cfg) }.map_err(driver("cuLaunchKernel"))?;
        }
        Ok(())
    }

    fn can_reduce(&self, op: &ReduceFns) -> bool {
        self.bind().is_ok()
            && self.function(op.reduce.as_str()).is_ok()
            && op.finish.is_none_or(|f| self.function(f.as_str()).is_ok())
    }

    fn acquire(&self, stream: &Arc<CudaStream>, keep: &[KeepAlive]) -> Result<()> {
        for home in homes(keep, stream) {
            stream.join(home).map_err(driver("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    fn release(&self, stream: &Arc<CudaStream>, keep: &[KeepAlive]) -> Result<()> {
        for home in homes(keep, stream) {
            home.join(stream).map_err(driver("cuStreamWaitEvent"))?;
        }
        Ok(())
    }

    fn join(&self, waiter: &Arc<CudaStream>, stream: &Arc<CudaStream>) -> Result<()> {
        self.check_stream(waiter)?;
        self.check_stream(stream)?;
        if Arc::ptr_eq(waiter, stream) {
            return Ok(());
        }
        waiter.join(stream).map_err(driver("cuStreamWaitEvent"))
    }

    fn synchronize(&self, stream: &Arc<CudaStream>) -> Result<()> {
        self.check_stream(stream)?;
        stream.synchronize().map_err(driver("cuStreamSynchronize"))
    }

    fn query(&self, stream: &Arc<CudaStream>) -> Result<bool> {
        self.check_stream(stream)?;
        self.bind()?;
        // SAFETY: a live stream of this device's context, which is current.
        match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            e => Err(driver("cuStreamQuery")(DriverError(e))),
        }
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
