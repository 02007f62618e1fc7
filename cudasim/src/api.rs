//! The exported driver API: one `extern "C"` function per call, each checking what it can and
//! handing device work to [`crate::exec`].

use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use cudarc::driver::sys::{
    CUcontext, CUdevice, CUdevice_attribute as Attr, CUdeviceptr, CUevent, CUfunction, CUhostFn, CUmodule, CUresult,
    CUstream,
};
use duralumin_kernels::flag::reached;

use crate::exec::{self, Context, Event, Marker, Stream, Work};
use crate::kernels::{self, Function, Module, Params};
use crate::memory::{self, Kind};
use crate::timing;
use crate::{Fault, usize_of};

thread_local! {
    /// The context current on this thread (its handle, 0 for none).
    static CURRENT: Cell<usize> = const { Cell::new(0) };
    /// Set while a host function runs on this thread (a hardware queue's).
    static IN_HOST_FN: Cell<bool> = const { Cell::new(false) };
}

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// The one device's primary context.
fn primary() -> &'static Arc<Context> {
    static PRIMARY: OnceLock<Arc<Context>> = OnceLock::new();
    PRIMARY.get_or_init(|| {
        let var = |name: &str, default: usize| std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default);
        let queues = var("CUDA_DEVICE_MAX_CONNECTIONS", 8);
        Context::new(queues.clamp(1, 32), var("CUDASIM_QUEUE_DEPTH", 1024))
    })
}

fn context_handle() -> usize {
    Arc::as_ptr(primary()) as usize
}

fn trace() -> bool {
    static TRACE: OnceLock<bool> = OnceLock::new();
    *TRACE.get_or_init(|| std::env::var("CUDASIM_TRACE").is_ok_and(|v| v == "1"))
}

/// Whether `CUDASIM_FAIL_CALLS` (call names separated by commas) names the call `name`: it then
/// fails with `CUDA_ERROR_UNKNOWN` without doing anything, so tests can reach their callers'
/// failure paths (a host function that cannot be queued, a synchronize that fails). With
/// `CUDASIM_FAIL_RANK=R`, only in the process the MPI launcher started as rank R (a device
/// that fails on one rank of a job).
fn injected_failure(name: &str) -> bool {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES
        .get_or_init(|| {
            if !on_failing_rank() {
                return Vec::new();
            }
            let list = std::env::var("CUDASIM_FAIL_CALLS").unwrap_or_default();
            list.split(',').map(str::trim).filter(|n| !n.is_empty()).map(str::to_owned).collect()
        })
        .iter()
        .any(|n| n == name)
}

/// Whether this process is the rank `CUDASIM_FAIL_RANK` names (every process when it is unset),
/// by the rank its MPI launcher gave it (Open MPI's, PMIx's or PMI's variable).
fn on_failing_rank() -> bool {
    let Ok(wanted) = std::env::var("CUDASIM_FAIL_RANK") else { return true };
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .is_some_and(|rank| rank.trim() == wanted.trim())
}

/// Objects handed out as handles: the handle is the object's address, looked up before use.
struct Handles<T>(OnceLock<Mutex<HashMap<usize, Arc<T>>>>);

impl<T> Handles<T> {
    const fn new() -> Self {
        Handles(OnceLock::new())
    }

    fn map(&self) -> MutexGuard<'_, HashMap<usize, Arc<T>>> {
        self.0.get_or_init(Mutex::default).lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn add(&self, t: Arc<T>) -> usize {
        let h = Arc::as_ptr(&t) as usize;
        self.map().insert(h, t);
        h
    }

    fn get(&self, h: usize, what: &str) -> Result<Arc<T>, Fault> {
        self.map().get(&h).cloned().ok_or_else(|| handle(format!("{h:#x} is not a live {what}")))
    }

    fn remove(&self, h: usize, what: &str) -> Result<Arc<T>, Fault> {
        self.map().remove(&h).ok_or_else(|| handle(format!("{h:#x} is not a live {what}")))
    }
}

static STREAMS: Handles<Stream> = Handles::new();
static EVENTS: Handles<Event> = Handles::new();
static MODULES: Handles<Module> = Handles::new();
static FUNCTIONS: Handles<Function> = Handles::new();

fn handle(message: String) -> Fault {
    Fault::new(CUresult::CUDA_ERROR_INVALID_HANDLE, message)
}

/// What a call needs before it runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Needs {
    /// Nothing (`cuInit`, versions, error strings).
    Nothing,
    /// `cuInit` called.
    Init,
    /// A context current on the calling thread, not made unusable by a fault.
    Context,
}

/// Runs one API call: checks what it needs, catches panics, reports failures on stderr.
fn call(name: &'static str, needs: Needs, f: impl FnOnce() -> Result<(), Fault>) -> CUresult {
    if trace() {
        eprintln!("cudasim: {name}");
    }
    if needs != Needs::Nothing && IN_HOST_FN.get() {
        eprintln!("cudasim: {name} called from a host function, which may not call the driver");
        return CUresult::CUDA_ERROR_NOT_PERMITTED;
    }
    if needs != Needs::Nothing && !INITIALIZED.load(Ordering::Acquire) {
        return CUresult::CUDA_ERROR_NOT_INITIALIZED;
    }
    if needs == Needs::Context {
        if CURRENT.get() == 0 {
            eprintln!("cudasim: {name} without a current context on thread {:?}", std::thread::current().name());
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        if let Err(code) = primary().check() {
            return code;
        }
    }
    if injected_failure(name) {
        eprintln!("cudasim: {name} failed: injected by CUDASIM_FAIL_CALLS");
        return CUresult::CUDA_ERROR_UNKNOWN;
    }
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUresult::CUDA_SUCCESS,
        Ok(Err(fault)) => {
            if fault.code != CUresult::CUDA_ERROR_NOT_READY {
                eprintln!("cudasim: {name} failed: {} ({:?})", fault.message, fault.code);
            }
            fault.code
        }
        Err(_) => {
            eprintln!("cudasim: {name} panicked");
            CUresult::CUDA_ERROR_UNKNOWN
        }
    }
}

/// Writes a call's result through an out-pointer.
///
/// # Safety
/// `ptr` is null or valid for a write of `T`.
unsafe fn out<T>(ptr: *mut T, value: T) -> Result<(), Fault> {
    if ptr.is_null() {
        return Err(Fault::invalid("null output pointer".into()));
    }
    // SAFETY: non-null, and valid for the write by the caller's contract.
    unsafe { ptr.write(value) };
    Ok(())
}

fn ctx() -> &'static Arc<Context> {
    primary()
}

/// The stream of a handle (0, and the legacy and per-thread handles 1 and 2: the null stream).
pub(crate) fn stream(h: CUstream) -> Result<Arc<Stream>, Fault> {
    match h as usize {
        0..=2 => Ok(ctx().null_stream()),
        h => STREAMS.get(h, "stream"),
    }
}

fn device(dev: CUdevice) -> Result<(), Fault> {
    if dev == 0 { Ok(()) } else { Err(Fault::new(CUresult::CUDA_ERROR_INVALID_DEVICE, format!("no device {dev}"))) }
}

pub(crate) fn submit(s: &Arc<Stream>, what: &'static str, work: Work) -> Result<(), Fault> {
    ctx().submit(s, what, work).map_err(|code| Fault::new(code, "the context faulted".into()))
}

fn submit_and_wait(s: &Arc<Stream>, what: &'static str, work: Work) -> Result<(), Fault> {
    ctx().submit_and_wait(s, what, work).map_err(|code| Fault::new(code, "the context faulted".into()))
}

fn barrier(what: &'static str) -> Result<(), Fault> {
    ctx().barrier(what).map_err(|code| Fault::new(code, "the context faulted".into()))
}

fn wait_idle(what: &str) -> Result<(), Fault> {
    ctx().wait_idle(what).map_err(|code| Fault::new(code, "the context faulted".into()))
}

/// A contiguous copy between addresses (device sides checked when it runs).
fn copy_work(dst: usize, dst_device: bool, src: usize, src_device: bool, n: usize, what: &'static str) -> Work {
    let engine = timing::engine_of(dst_device, src_device);
    timing::timed(
        engine,
        n,
        Box::new(move || {
            if dst_device {
                memory::device_range(dst as u64, n, what)?;
            }
            if src_device {
                memory::device_range(src as u64, n, what)?;
            }
            if n > 0 {
                // SAFETY: device sides are live allocations (checked); host sides are the caller's,
                // valid until the copy has run (pinned memory) or until the call returns, which
                // waits for it (pageable memory).
                unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
            }
            Ok(())
        }),
    )
}

/// A copy with a host side: asynchronous when the host side is pinned, else (pageable memory)
/// synchronous with respect to the host and the stream, the most the driver may do.
fn host_copy(s: CUstream, dst: usize, src: usize, n: usize, to_host: bool, what: &'static str) -> Result<(), Fault> {
    let s = stream(s)?;
    let host = if to_host { dst } else { src };
    if n == 0 || memory::pinned(host, n, what)? {
        return submit(&s, what, copy_work(dst, !to_host, src, to_host, n, what));
    }
    submit_and_wait(&s, what, copy_work(dst, !to_host, src, to_host, n, what))
}

/// `CUDA_MEMCPY2D`, with the memory types as plain integers (any value can arrive).
#[repr(C)]
pub struct Memcpy2d {
    src_x: usize,
    src_y: usize,
    src_type: u32,
    src_host: usize,
    src_device: u64,
    src_array: usize,
    src_pitch: usize,
    dst_x: usize,
    dst_y: usize,
    dst_type: u32,
    dst_host: usize,
    dst_device: u64,
    dst_array: usize,
    dst_pitch: usize,
    width: usize,
    height: usize,
}

/// Multiprocessors of the simulated device (an H100's).
const MULTIPROCESSORS: u16 = 132;

const MEMORYTYPE_HOST: u32 = 1;
const MEMORYTYPE_DEVICE: u32 = 2;
const MEMORYTYPE_UNIFIED: u32 = 4;

/// One side of a 2-D copy: `(address of row 0, pitch, device side)`.
fn side(
    kind: u32,
    host: usize,
    device: u64,
    array: usize,
    x: usize,
    y: usize,
    pitch: usize,
) -> Result<(usize, usize, bool), Fault> {
    let base = match kind {
        MEMORYTYPE_HOST => host,
        MEMORYTYPE_DEVICE | MEMORYTYPE_UNIFIED if array == 0 => usize_of(device),
        _ => return Err(Fault::not_supported(format!("memory type {kind} (arrays are not simulated)"))),
    };
    let at = y.checked_mul(pitch).and_then(|o| o.checked_add(x)).and_then(|o| o.checked_add(base));
    Ok((at.ok_or_else(|| Fault::invalid("2-D copy offset overflows".into()))?, pitch, kind != MEMORYTYPE_HOST))
}

fn memcpy_2d(p: &Memcpy2d, s: CUstream) -> Result<(), Fault> {
    let s = stream(s)?;
    let (src, sp, src_dev) = side(p.src_type, p.src_host, p.src_device, p.src_array, p.src_x, p.src_y, p.src_pitch)?;
    let (dst, dp, dst_dev) = side(p.dst_type, p.dst_host, p.dst_device, p.dst_array, p.dst_x, p.dst_y, p.dst_pitch)?;
    let (width, height) = (p.width, p.height);
    if height > 1 && (sp < width || dp < width) {
        return Err(Fault::invalid(format!("pitch below the width ({sp}, {dp} < {width})")));
    }
    let extent = |pitch: usize| height.checked_sub(1).map_or(Some(0), |h| h.checked_mul(pitch)?.checked_add(width));
    let (se, de) = match (extent(sp), extent(dp)) {
        (Some(a), Some(b)) => (a, b),
        _ => return Err(Fault::invalid("2-D copy extent overflows".into())),
    };
    let what = "cuMemcpy2DAsync";
    let work: Work = Box::new(move || {
        if src_dev {
            memory::device_range(src as u64, se, what)?;
        }
        if dst_dev {
            memory::device_range(dst as u64, de, what)?;
        }
        for r in 0..height {
            // SAFETY: every row is inside its side's extent (device sides checked above, host
            // sides the caller's to keep valid until the copy has run).
            unsafe { std::ptr::copy((src + r * sp) as *const u8, (dst + r * dp) as *mut u8, width) };
        }
        Ok(())
    });
    let work = timing::timed(timing::engine_of(dst_dev, src_dev), width.saturating_mul(height), work);
    let pageable = (!src_dev && !memory::pinned(src, se, what)?) || (!dst_dev && !memory::pinned(dst, de, what)?);
    if pageable { submit_and_wait(&s, what, work) } else { submit(&s, what, work) }
}

/// The 32-bit word of a stream memory operation, checked when it runs.
fn word(addr: CUdeviceptr, what: &str) -> Result<&'static AtomicU32, Fault> {
    memory::device_range(addr, 4, what)?;
    if !addr.is_multiple_of(4) {
        return Err(Fault::illegal(format!("{what}: {addr:#x} is not 4-byte aligned")));
    }
    // SAFETY: a live, aligned word of device-accessible memory (checked); stream memory
    // operations access it atomically, as everything else must.
    Ok(unsafe { AtomicU32::from_ptr(addr as *mut u32) })
}

fn write_value(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) -> Result<(), Fault> {
    let s = stream(s)?;
    if flags > 1 {
        return Err(Fault::invalid(format!("cuStreamWriteValue32 flags {flags:#x}")));
    }
    let order = if flags == 0 { Ordering::Release } else { Ordering::Relaxed };
    submit(
        &s,
        "cuStreamWriteValue32",
        Box::new(move || {
            word(addr, "cuStreamWriteValue32")?.store(value, order);
            Ok(())
        }),
    )
}

fn wait_value(s: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) -> Result<(), Fault> {
    let s = stream(s)?;
    let test: fn(u32, u32) -> bool = match flags & !(1 << 30) {
        0 => reached,
        1 => |a, b| a == b,
        2 => |a, b| a & b != 0,
        3 => |a, b| !(a | b) != 0,
        other => return Err(Fault::invalid(format!("cuStreamWaitValue32 flags {other:#x}"))),
    };
    let id = s.id;
    submit(
        &s,
        "cuStreamWaitValue32",
        Box::new(move || {
            let w = word(addr, "cuStreamWaitValue32")?;
            exec::device_wait(
                || test(w.load(Ordering::Acquire), value),
                || {
                    format!(
                        "cuStreamWaitValue32 on stream {id}: {addr:#x} (now {}) to reach {value}",
                        w.load(Ordering::Relaxed)
                    )
                },
            );
            Ok(())
        }),
    )
}

/// Defines exported driver functions: `needs fn name(args) { body }`, the body returning
/// `Result<(), Fault>`.
macro_rules! driver {
    ($(
        $(#[doc = $doc:literal])*
        $needs:ident fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block
    )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// The CUDA driver API's contract for this function: pointer arguments are valid for
        /// what it reads and writes, and memory a queued operation uses stays valid until the
        /// operation has run. Handles the simulator did not give out are rejected.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            call(stringify!($name), Needs::$needs, move || $body)
        }
    )*};
}

driver! {
    /// Initializes the driver.
    Nothing fn cuInit(_flags: c_uint) {
        INITIALIZED.store(true, Ordering::Release);
        Ok(())
    }

    /// The driver's version: 12.8, so stream memory operations are available.
    Nothing fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: the caller's out-pointer.
        unsafe { out(version, 12080) }
    }

    /// One device.
    Init fn cuDeviceGetCount(count: *mut c_int) {
        // SAFETY: the caller's out-pointer.
        unsafe { out(count, 1) }
    }

    Init fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) {
        device(ordinal)?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(dev, 0) }
    }

    Init fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        device(dev)?;
        let text = b"cudasim (CPU)\0";
        if name.is_null() || usize::try_from(len).ok().is_none_or(|len| len < text.len()) {
            return Err(Fault::invalid("name buffer too small".into()));
        }
        // SAFETY: the caller's buffer holds `len` bytes (checked against the text's length).
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr().cast(), name, text.len()) };
        Ok(())
    }

    /// Attributes of an H100-like device with unified addressing and mapped host memory.
    Init fn cuDeviceGetAttribute(value: *mut c_int, attrib: c_int, dev: CUdevice) {
        device(dev)?;
        let is = |a: Attr| attrib == a as c_int;
        let v = if is(Attr::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) {
            c_int::from(MULTIPROCESSORS)
        } else if is(Attr::CU_DEVICE_ATTRIBUTE_MAX_PITCH) {
            c_int::MAX
        } else if is(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR) {
            9
        } else if is(Attr::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK) {
            1024
        } else if is(Attr::CU_DEVICE_ATTRIBUTE_WARP_SIZE) {
            32
        } else if is(Attr::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR) {
            0
        } else if is(Attr::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)
            || is(Attr::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING)
            || is(Attr::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY)
            || is(Attr::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS)
            || is(Attr::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT)
            || is(Attr::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH)
        {
            1
        } else {
            0
        };
        // SAFETY: the caller's out-pointer.
        unsafe { out(value, v) }
    }

    Init fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        device(dev)?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(bytes, 80 << 30) }
    }

    Init fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) {
        device(dev)?;
        primary().retained.fetch_add(1, Ordering::AcqRel);
        // SAFETY: the caller's out-pointer.
        unsafe { out(pctx, context_handle() as CUcontext) }
    }

    /// The context stays (its hardware queue threads run for the process's life).
    Init fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        device(dev)?;
        let was = primary().retained.fetch_sub(1, Ordering::AcqRel);
        if was == 0 {
            primary().retained.store(0, Ordering::Release);
            return Err(Fault::invalid("primary context released more often than retained".into()));
        }
        Ok(())
    }

    Init fn cuCtxSetCurrent(c: CUcontext) {
        let h = c as usize;
        if h != 0 && h != context_handle() {
            return Err(Fault::new(CUresult::CUDA_ERROR_INVALID_CONTEXT, format!("{h:#x} is not a context")));
        }
        CURRENT.set(h);
        Ok(())
    }

    Init fn cuCtxGetCurrent(pctx: *mut CUcontext) {
        // SAFETY: the caller's out-pointer.
        unsafe { out(pctx, CURRENT.get() as CUcontext) }
    }

    Context fn cuCtxGetDevice(dev: *mut CUdevice) {
        // SAFETY: the caller's out-pointer.
        unsafe { out(dev, 0) }
    }

    Context fn cuCtxSynchronize() {
        wait_idle("cuCtxSynchronize")
    }

    Context fn cuStreamCreate(ph: *mut CUstream, _flags: c_uint) {
        let h = STREAMS.add(ctx().new_stream());
        // SAFETY: the caller's out-pointer.
        unsafe { out(ph, h as CUstream) }
    }

    Context fn cuStreamCreateWithPriority(ph: *mut CUstream, _flags: c_uint, _priority: c_int) {
        let h = STREAMS.add(ctx().new_stream());
        // SAFETY: the caller's out-pointer.
        unsafe { out(ph, h as CUstream) }
    }

    /// The stream's queued work still runs.
    Context fn cuStreamDestroy_v2(h: CUstream) {
        let s = STREAMS.remove(h as usize, "stream")?;
        ctx().destroy(&s);
        Ok(())
    }

    Context fn cuStreamSynchronize(h: CUstream) {
        let s = stream(h)?;
        s.wait_for(s.submitted(), "cuStreamSynchronize");
        ctx().check().map_err(|code| Fault::new(code, "the context faulted".into()))
    }

    Context fn cuStreamQuery(h: CUstream) {
        if stream(h)?.idle() { Ok(()) } else { Err(Fault::new(CUresult::CUDA_ERROR_NOT_READY, String::new())) }
    }

    /// The stream waits, on the device, for the event's latest record at the time of the call.
    Context fn cuStreamWaitEvent(h: CUstream, ev: CUevent, _flags: c_uint) {
        let s = stream(h)?;
        let Some(marker) = EVENTS.get(ev as usize, "event")?.latest() else { return Ok(()) };
        let id = s.id;
        submit(&s, "cuStreamWaitEvent", Box::new(move || {
            marker.wait(&format!("cuStreamWaitEvent on stream {id}"));
            Ok(())
        }))
    }

    Context fn cuEventCreate(ph: *mut CUevent, _flags: c_uint) {
        let h = EVENTS.add(Arc::new(Event::default()));
        // SAFETY: the caller's out-pointer.
        unsafe { out(ph, h as CUevent) }
    }

    Context fn cuEventDestroy_v2(ev: CUevent) {
        EVENTS.remove(ev as usize, "event").map(drop)
    }

    Context fn cuEventRecord(ev: CUevent, h: CUstream) {
        let (e, s) = (EVENTS.get(ev as usize, "event")?, stream(h)?);
        let marker = Arc::new(Marker::default());
        *e.latest.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::clone(&marker));
        submit(&s, "cuEventRecord", Box::new(move || {
            marker.set();
            Ok(())
        }))
    }

    Context fn cuEventSynchronize(ev: CUevent) {
        if let Some(m) = EVENTS.get(ev as usize, "event")?.latest() {
            m.wait("cuEventSynchronize");
        }
        ctx().check().map_err(|code| Fault::new(code, "the context faulted".into()))
    }

    Context fn cuEventQuery(ev: CUevent) {
        match EVENTS.get(ev as usize, "event")?.latest() {
            Some(m) if !m.is_set() => Err(Fault::new(CUresult::CUDA_ERROR_NOT_READY, String::new())),
            _ => Ok(()),
        }
    }

    /// A device-wide barrier (see [`Context::barrier`]).
    Context fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) {
        barrier("cuMemAlloc")?;
        let p = memory::alloc(bytes, Kind::Device)
            .ok_or_else(|| Fault::new(CUresult::CUDA_ERROR_OUT_OF_MEMORY, format!("{bytes} bytes")))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(dptr, p as CUdeviceptr) }
    }

    /// Allocated at once (the memory is the stream's from its point in the stream on).
    Context fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytes: usize, h: CUstream) {
        stream(h)?;
        let p = memory::alloc(bytes, Kind::Device)
            .ok_or_else(|| Fault::new(CUresult::CUDA_ERROR_OUT_OF_MEMORY, format!("{bytes} bytes")))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(dptr, p as CUdeviceptr) }
    }

    /// Synchronizes the device first, as the driver's does.
    Context fn cuMemFree_v2(dptr: CUdeviceptr) {
        wait_idle("cuMemFree")?;
        memory::free(usize_of(dptr), "cuMemFree", |k| k == Kind::Device)
    }

    /// Freed when the stream reaches it.
    Context fn cuMemFreeAsync(dptr: CUdeviceptr, h: CUstream) {
        let s = stream(h)?;
        submit(&s, "cuMemFreeAsync", Box::new(move || memory::free(usize_of(dptr), "cuMemFreeAsync", |k| k == Kind::Device)))
    }

    Context fn cuMemsetD8Async(dptr: CUdeviceptr, value: u8, n: usize, h: CUstream) {
        let s = stream(h)?;
        submit(&s, "cuMemsetD8Async", Box::new(move || {
            memory::device_range(dptr, n, "cuMemsetD8Async")?;
            // SAFETY: a live device range (checked).
            unsafe { std::ptr::write_bytes(dptr as *mut u8, value, n) };
            Ok(())
        }))
    }

    Context fn cuMemsetD8_v2(dptr: CUdeviceptr, value: u8, n: usize) {
        let s = ctx().null_stream();
        submit_and_wait(&s, "cuMemsetD8", Box::new(move || {
            memory::device_range(dptr, n, "cuMemsetD8")?;
            // SAFETY: a live device range (checked).
            unsafe { std::ptr::write_bytes(dptr as *mut u8, value, n) };
            Ok(())
        }))
    }

    Context fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, n: usize, h: CUstream) {
        host_copy(h, usize_of(dst), src as usize, n, false, "cuMemcpyHtoDAsync")
    }

    Context fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, n: usize, h: CUstream) {
        host_copy(h, dst as usize, usize_of(src), n, true, "cuMemcpyDtoHAsync")
    }

    Context fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize, h: CUstream) {
        let s = stream(h)?;
        submit(&s, "cuMemcpyDtoDAsync", copy_work(usize_of(dst), true, usize_of(src), true, n, "cuMemcpyDtoDAsync"))
    }

    /// Synchronous: on the null stream, waited for.
    Context fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, n: usize) {
        let s = ctx().null_stream();
        submit_and_wait(&s, "cuMemcpyHtoD", copy_work(usize_of(dst), true, src as usize, false, n, "cuMemcpyHtoD"))
    }

    Context fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, n: usize) {
        let s = ctx().null_stream();
        submit_and_wait(&s, "cuMemcpyDtoH", copy_work(dst as usize, false, usize_of(src), true, n, "cuMemcpyDtoH"))
    }

    Context fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, n: usize) {
        let s = ctx().null_stream();
        submit_and_wait(&s, "cuMemcpyDtoD", copy_work(usize_of(dst), true, usize_of(src), true, n, "cuMemcpyDtoD"))
    }

    Context fn cuMemcpy2DAsync_v2(p: *const Memcpy2d, h: CUstream) {
        if p.is_null() {
            return Err(Fault::invalid("null CUDA_MEMCPY2D".into()));
        }
        // SAFETY: the caller's parameter block (non-null); its fields are plain integers.
        memcpy_2d(unsafe { &*p }, h)
    }

    /// A device-wide barrier (see [`Context::barrier`]).
    Context fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) {
        const DEVICEMAP: c_uint = 2;
        barrier("cuMemHostAlloc")?;
        let mapped = flags & DEVICEMAP != 0;
        let p = memory::alloc(bytes, Kind::Pinned { mapped })
            .ok_or_else(|| Fault::new(CUresult::CUDA_ERROR_OUT_OF_MEMORY, format!("{bytes} bytes")))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(pp, p as *mut c_void) }
    }

    /// A device-wide barrier (see [`Context::barrier`]).
    Context fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) {
        barrier("cuMemAllocHost")?;
        let p = memory::alloc(bytes, Kind::Pinned { mapped: true })
            .ok_or_else(|| Fault::new(CUresult::CUDA_ERROR_OUT_OF_MEMORY, format!("{bytes} bytes")))?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(pp, p as *mut c_void) }
    }

    /// Synchronizes the device first (page-locked memory is freed only once nothing can be
    /// using it).
    Context fn cuMemFreeHost(p: *mut c_void) {
        wait_idle("cuMemFreeHost")?;
        memory::free(p as usize, "cuMemFreeHost", |k| matches!(k, Kind::Pinned { .. }))
    }

    Context fn cuMemHostGetDevicePointer_v2(pd: *mut CUdeviceptr, p: *mut c_void, flags: c_uint) {
        if flags != 0 {
            return Err(Fault::invalid(format!("flags {flags} (must be 0)")));
        }
        let d = memory::mapped(p as usize)?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(pd, d) }
    }

    Context fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) {
        // SAFETY: the caller's out-pointers.
        unsafe {
            out(free, 79 << 30)?;
            out(total, 80 << 30)
        }
    }

    Context fn cuStreamWriteValue32_v2(h: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        write_value(h, addr, value, flags)
    }

    Context fn cuStreamWriteValue32(h: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        write_value(h, addr, value, flags)
    }

    Context fn cuStreamWaitValue32_v2(h: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        wait_value(h, addr, value, flags)
    }

    Context fn cuStreamWaitValue32(h: CUstream, addr: CUdeviceptr, value: u32, flags: c_uint) {
        wait_value(h, addr, value, flags)
    }

    /// Runs `f(data)` on the hardware queue's thread when the stream reaches it; the driver may
    /// not be called from it.
    Context fn cuLaunchHostFunc(h: CUstream, f: CUhostFn, data: *mut c_void) {
        let s = stream(h)?;
        let f = f.ok_or_else(|| Fault::invalid("null host function".into()))?;
        let data = data as usize;
        submit(&s, "cuLaunchHostFunc", Box::new(move || {
            IN_HOST_FN.set(true);
            // SAFETY: the caller's host function with the caller's data, as the driver runs it.
            unsafe { f(data as *mut c_void) };
            IN_HOST_FN.set(false);
            Ok(())
        }))
    }

    /// Loads PTX text (read for its entry points).
    Context fn cuModuleLoadData(pm: *mut CUmodule, image: *const c_void) {
        if image.is_null() {
            return Err(Fault::invalid("null image".into()));
        }
        // SAFETY: a PTX image is NUL-terminated text, by the call's contract.
        let text = unsafe { CStr::from_ptr(image.cast()) }.to_string_lossy();
        let h = MODULES.add(Arc::new(kernels::parse_ptx(&text)?));
        // SAFETY: the caller's out-pointer.
        unsafe { out(pm, h as CUmodule) }
    }

    /// Launches of the module still queued are a fault: their code would be gone.
    Context fn cuModuleUnload(m: CUmodule) {
        let module = MODULES.remove(m as usize, "module")?;
        let pending = module.pending.load(Ordering::Acquire);
        if pending > 0 {
            let f = Fault::illegal(format!("module unloaded with {pending} launches of it still queued"));
            ctx().fault(u64::MAX, "cuModuleUnload", f.clone());
            return Err(f);
        }
        Ok(())
    }

    /// Under lazy loading (CUDA 12.2's default) this loads the function, which may wait for
    /// the device: it does here.
    Context fn cuModuleGetFunction(pf: *mut CUfunction, m: CUmodule, name: *const c_char) {
        let module = MODULES.get(m as usize, "module")?;
        if name.is_null() {
            return Err(Fault::invalid("null name".into()));
        }
        // SAFETY: a NUL-terminated name, by the call's contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let f = module.function(&name)?;
        wait_idle("cuModuleGetFunction (loading a function under lazy loading)")?;
        let h = FUNCTIONS.add(Arc::new(f));
        // SAFETY: the caller's out-pointer.
        unsafe { out(pf, h as CUfunction) }
    }

    Context fn cuLaunchKernel(
        f: CUfunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        _shared: c_uint,
        h: CUstream,
        params: *mut *mut c_void,
        extra: *mut *mut c_void,
    ) {
        if !extra.is_null() {
            return Err(Fault::not_supported("launch parameters through `extra`".into()));
        }
        let shape = Shape { grid: [gx, gy, gz], block: [bx, by, bz], together: false };
        // SAFETY: forwarded from the caller.
        unsafe { launch_kernel("cuLaunchKernel", f, shape, h, params) }
    }

    /// A launch whose blocks are all resident at once: at most 2048 threads per multiprocessor
    /// of the simulated device in all.
    Context fn cuLaunchCooperativeKernel(
        f: CUfunction,
        gx: c_uint,
        gy: c_uint,
        gz: c_uint,
        bx: c_uint,
        by: c_uint,
        bz: c_uint,
        _shared: c_uint,
        h: CUstream,
        params: *mut *mut c_void,
    ) {
        if u64::from(gx) * u64::from(bx) > u64::from(MULTIPROCESSORS) * 2048 {
            return Err(Fault::new(
                CUresult::CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE,
                format!("a cooperative launch of {gx} blocks of {bx} threads does not fit at once"),
            ));
        }
        let shape = Shape { grid: [gx, gy, gz], block: [bx, by, bz], together: true };
        // SAFETY: forwarded from the caller.
        unsafe { launch_kernel("cuLaunchCooperativeKernel", f, shape, h, params) }
    }
}

/// A launch's geometry, and whether its blocks are resident at once (a cooperative launch).
struct Shape {
    grid: [c_uint; 3],
    block: [c_uint; 3],
    together: bool,
}

/// Queues kernel `f` on stream `h` (`api` names the call).
///
/// # Safety
/// `params` holds the function's arguments, as `cuLaunchKernel` requires.
unsafe fn launch_kernel(
    api: &'static str,
    f: CUfunction,
    shape: Shape,
    h: CUstream,
    params: *mut *mut c_void,
) -> Result<(), Fault> {
    let (f, s) = (FUNCTIONS.get(f as usize, "function")?, stream(h)?);
    let ([gx, gy, gz], [bx, by, bz]) = (shape.grid, shape.block);
    if gy != 1 || gz != 1 || by != 1 || bz != 1 {
        return Err(Fault::not_supported("multi-dimensional launches (the kernels are 1-D)".into()));
    }
    if gx == 0 || bx == 0 || bx > 1024 {
        return Err(Fault::invalid(format!("launch of {gx} blocks of {bx} threads")));
    }
    if params.is_null() {
        return Err(Fault::invalid("null kernel parameters".into()));
    }
    let launch = kernels::Launch { blocks: gx as usize, threads: bx as usize, together: shape.together };
    // SAFETY: the caller passes the function's arguments (its contract).
    let run = unsafe { kernels::launch(&f, &Params(params), launch)? };
    let module = Arc::clone(&f.module);
    module.pending.fetch_add(1, Ordering::AcqRel);
    let threads = gx as usize * bx as usize;
    let work = timing::timed(timing::Engine::Sms, threads.saturating_mul(8), Box::new(run));
    let queued = submit(
        &s,
        api,
        Box::new(move || {
            let r = work();
            module.pending.fetch_sub(1, Ordering::AcqRel);
            r
        }),
    );
    if queued.is_err() {
        f.module.pending.fetch_sub(1, Ordering::AcqRel);
    }
    queued
}

/// Status names and descriptions for `cuGetErrorName` and `cuGetErrorString`.
fn describe(code: c_int) -> Option<(&'static CStr, &'static CStr)> {
    Some(match code {
        0 => (c"CUDA_SUCCESS", c"no error"),
        1 => (c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
        2 => (c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
        3 => (c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
        101 => (c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
        201 => (c"CUDA_ERROR_INVALID_CONTEXT", c"invalid device context"),
        218 => (c"CUDA_ERROR_INVALID_PTX", c"a PTX JIT compilation failed"),
        400 => (c"CUDA_ERROR_INVALID_HANDLE", c"invalid resource handle"),
        500 => (c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
        600 => (c"CUDA_ERROR_NOT_READY", c"device not ready"),
        700 => (c"CUDA_ERROR_ILLEGAL_ADDRESS", c"an illegal memory access was encountered"),
        720 => (c"CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE", c"too many blocks in cooperative launch"),
        800 => (c"CUDA_ERROR_NOT_PERMITTED", c"operation not permitted"),
        801 => (c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
        999 => (c"CUDA_ERROR_UNKNOWN", c"unknown error"),
        _ => return None,
    })
}

driver! {
    Nothing fn cuGetErrorName(code: c_int, p: *mut *const c_char) {
        let (name, _) = describe(code).ok_or_else(|| Fault::invalid(format!("unknown status {code}")))?;
        // SAFETY: the caller's out-pointer; the string is static.
        unsafe { out(p, name.as_ptr()) }
    }

    Nothing fn cuGetErrorString(code: c_int, p: *mut *const c_char) {
        let (_, text) = describe(code).ok_or_else(|| Fault::invalid(format!("unknown status {code}")))?;
        // SAFETY: the caller's out-pointer; the string is static.
        unsafe { out(p, text.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn current() {
        // SAFETY: out-pointers to locals; the handle is the one just retained.
        unsafe {
            assert_eq!(cuInit(0), CUresult::CUDA_SUCCESS);
            let mut c: CUcontext = std::ptr::null_mut();
            assert_eq!(cuDevicePrimaryCtxRetain(&mut c, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(cuCtxSetCurrent(c), CUresult::CUDA_SUCCESS);
        }
    }

    #[test]
    fn calls_need_a_current_context() {
        // SAFETY: as in `current`.
        unsafe { assert_eq!(cuInit(0), CUresult::CUDA_SUCCESS) };
        let on_a_fresh_thread = std::thread::spawn(|| {
            let mut s: CUstream = std::ptr::null_mut();
            // SAFETY: an out-pointer to a local.
            unsafe { cuStreamCreate(&mut s, 0) }
        });
        assert_eq!(on_a_fresh_thread.join().unwrap(), CUresult::CUDA_ERROR_INVALID_CONTEXT);
    }

    /// The status a host function's driver call got.
    static FROM_HOST_FN: Mutex<Option<CUresult>> = Mutex::new(None);

    /// # Safety
    /// Called by the simulator with a null user pointer.
    unsafe extern "C" fn calls_the_driver(_: *mut c_void) {
        // SAFETY: the null stream exists once a context does.
        let status = unsafe { cuStreamQuery(std::ptr::null_mut()) };
        *FROM_HOST_FN.lock().unwrap() = Some(status);
    }

    #[test]
    fn host_functions_may_not_call_the_driver() {
        current();
        let mut s: CUstream = std::ptr::null_mut();
        // SAFETY: a stream of the current context; the host function takes no data.
        unsafe {
            assert_eq!(cuStreamCreate(&mut s, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(cuLaunchHostFunc(s, Some(calls_the_driver), std::ptr::null_mut()), CUresult::CUDA_SUCCESS);
            assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_SUCCESS);
            assert_eq!(cuStreamDestroy_v2(s), CUresult::CUDA_SUCCESS);
        }
        assert_eq!(*FROM_HOST_FN.lock().unwrap(), Some(CUresult::CUDA_ERROR_NOT_PERMITTED));
    }

    /// Stream memory operations on mapped pinned memory: a wait holds its stream until the host
    /// writes the value; a write lands in stream order.
    #[test]
    fn stream_memory_operations_wait_and_write() {
        current();
        let (mut host, mut dev): (*mut c_void, CUdeviceptr) = (std::ptr::null_mut(), 0);
        let (mut s, mut t): (CUstream, CUstream) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: out-pointers to locals; the flags are 8 bytes of mapped pinned memory that
        // outlive the synchronized streams.
        unsafe {
            assert_eq!(cuMemHostAlloc(&mut host, 8, 2), CUresult::CUDA_SUCCESS);
            assert_eq!(cuMemHostGetDevicePointer_v2(&mut dev, host, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(cuStreamCreate(&mut s, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(cuStreamCreate(&mut t, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(cuStreamWaitValue32_v2(s, dev, 1, 0), CUresult::CUDA_SUCCESS);
            assert_eq!(cuStreamWriteValue32_v2(s, dev + 4, 7, 0), CUresult::CUDA_SUCCESS);
            let (flag, out) = (AtomicU32::from_ptr(host.cast()), AtomicU32::from_ptr(host.cast::<u32>().add(1)));
            assert_eq!(cuStreamQuery(s), CUresult::CUDA_ERROR_NOT_READY, "waits for the host");
            flag.store(1, Ordering::Release);
            assert_eq!(cuStreamSynchronize(s), CUresult::CUDA_SUCCESS);
            assert_eq!(out.load(Ordering::Acquire), 7);
            // An unaligned or unmapped address faults the stream's work, not the call; this
            // one is rejected before anything is queued.
            assert_eq!(cuStreamWaitValue32_v2(t, dev, 1, 9), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!(cuStreamDestroy_v2(s), CUresult::CUDA_SUCCESS);
            assert_eq!(cuStreamDestroy_v2(t), CUresult::CUDA_SUCCESS);
            assert_eq!(cuMemFreeHost(host), CUresult::CUDA_SUCCESS);
        }
    }
}
