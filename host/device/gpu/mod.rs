//! The GPU layer: what the HostTransfer backend needs from a GPU, written once over a small set
//! of driver primitives (Aluminum's `AlGpu*` idea).
//!
//! [`Driver`] is the set of primitives: asynchronous and 2-D copies, kernel launches, host
//! functions, stream memory operations (write and wait for a value), events (one stream waits
//! for another), stream query and synchronize, and the device address of mapped host memory.
//! `cuda` (over cudarc's `result` layer) and `hip` (over its own `sys`/`result` layers) implement
//! only these. Everything else is here, once, generic over the driver, in [`Gpu`]:
//!
//! * the copy decision tree and pack/unpack of v-collective blocks ([`copies`]);
//! * flags, by stream memory operations or by the `signal`/`stream_wait` kernels ([`flags`],
//!   [`FlagPath`]);
//! * reductions of staged rows into device memory ([`reduce`]);
//! * scratch, device-to-device copies and reductions for backends whose data stays on the
//!   device (NCCL) ([`device_memory`]);
//! * keeping buffers alive until the stream has used them, and what happens when a host
//!   function cannot be queued ([`hold`]);
//! * ordering with the buffers' own streams ([`hold`]: `acquire`/`release`);
//! * grid sizing, the loaded-kernel cache and unloading once the device is through;
//! * errors raised where they cannot be returned (drops, other threads), kept for the device's
//!   next call, as cudarc does.
//!
//! So everything but the primitives runs in CI on `cudasim`, HIP's copy included. The engine's
//! design is in `docs/host_transfer.md`; the rule it relies on (nothing the proxy thread calls
//! may wait for the device) is the queue-order rule, `docs/architecture.md#the-queue-order-rule`.
//!
//! The public devices ([`super::cuda::CudaDevice`], `hip::HipDevice`) are thin handles to a
//! [`Gpu`]; [`gpu_device!`] implements [`super::Device`] for them by forwarding.

mod arg_lists;
mod copies;
mod device_memory;
mod flags;
mod hold;
pub(crate) mod reaper;
mod reduce;

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::ffi::c_void;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use duralumin_kernels::names::fixed;

pub(crate) use self::hold::{Home, released};
use super::{DevicePtr, HostFinishFn, HostReduceFn, ReduceFns};
use crate::api::error::{Error, Result};
use crate::device_code::KernelModule;
use arg_lists::ArgLists;

/// How streams write and wait for flags.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FlagPath {
    /// Stream memory operations where the driver offers them (CUDA 12 and later; HIP where
    /// `hipDeviceAttributeCanUseStreamWaitValue` says so), else kernels.
    #[default]
    Auto,
    /// `cuStreamWriteValue32`/`cuStreamWaitValue32` or their HIP namesakes: the GPU front end
    /// polls; no compute unit is used. On HIP, a wait the plain comparison of
    /// `hipStreamWaitValueGte` cannot decide exactly still uses the `stream_wait` kernel (see
    /// `hip`'s module docs).
    StreamMemOps,
    /// One-thread `signal` and `stream_wait` kernels from `duralumin-kernels` (works on any
    /// driver; a waiting stream holds one SM or compute-unit slot while it spins).
    Kernels,
}

/// Threads per block of the grid-stride kernels.
pub(crate) const BLOCK: u32 = 256;

/// How a kernel is launched: `blocks` one-dimensional blocks of `threads` threads, and whether
/// every block must be resident on the device at once (a cooperative launch), so that its
/// blocks may wait for each other. Such a launch has at most one block per multiprocessor, and
/// one block of `threads` fits on each; drivers that cannot launch one block and refuse more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub(crate) blocks: u32,
    pub(crate) threads: u32,
    pub(crate) together: bool,
}

impl Shape {
    /// Blocks that need not run at once.
    pub(crate) fn blocks(blocks: u32, threads: u32) -> Shape {
        Shape { blocks, threads, together: false }
    }

    /// Blocks resident at once (a cooperative launch).
    pub(crate) fn together(blocks: u32, threads: u32) -> Shape {
        Shape { blocks, threads, together: true }
    }
}

/// Which way a copy goes between pinned host memory and device memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    ToHost,
    ToDevice,
}

/// A pointer to a kernel argument, as the launch calls take them (`void **params`).
pub(crate) fn arg<T>(value: &mut T) -> *mut c_void {
    (value as *mut T).cast()
}

/// A kernel's host body, which a driver simulator can run in the kernel's place (see
/// [`Driver::offer_host_body`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum HostBody {
    /// A reduce kernel, `(dst, src, n)`.
    Reduce { elem_size: usize, run: HostReduceFn },
    /// A finish kernel, `(dst, n, ranks)`.
    Finish { elem_size: usize, run: HostFinishFn },
}

/// The primitives of one GPU driver API, for one device. Cloning gives another handle to the
/// same device (the handle [`Driver::drained`] and unloading use on other threads).
///
/// Every `unsafe fn` queues work that touches raw addresses: the caller (the generic layer,
/// which holds the backend's guarantees) keeps them valid until the work has run.
pub(crate) trait Driver: Clone + Send + Sync + 'static {
    /// A stream handle users pass in (cudarc's `Arc<CudaStream>`, `HipStream`).
    type Stream: Clone + Debug + Send + Sync + 'static;
    /// A loaded code module (unloaded on drop).
    type Module: Send + 'static;
    /// A kernel of a loaded module.
    type Function: Clone + Send + 'static;
    /// A completion marker recorded on a stream; destroyed when dropped.
    type Event: Send + Sync + 'static;
    /// What a module is loaded from (PTX text, a code object).
    type Image: Copy;

    /// The API's name in device names and errors (`"cuda"`, `"hip"`).
    const API: &'static str;
    /// The call that queues a host function, for errors.
    const HOST_FN: &'static str;

    /// The device ordinal.
    fn ordinal(&self) -> usize;
    /// Whether `stream` belongs to this device (and context).
    fn owns(&self, stream: &Self::Stream) -> bool;
    /// What `stream` is, in a wrong-device error.
    fn describe(stream: &Self::Stream) -> String;
    /// Whether two handles are the same stream.
    fn same(a: &Self::Stream, b: &Self::Stream) -> bool;

    /// Makes the device current on the calling thread, after reporting any error the driver
    /// bindings recorded for it.
    fn bind(&self) -> Result<()>;
    /// A new stream.
    fn new_stream(&self) -> Result<Self::Stream>;

    /// `bytes` (at least 1) of page-locked host memory, mapped into the device's address space
    /// and portable across contexts; not yet zeroed.
    fn host_alloc(&self, bytes: usize) -> Result<*mut u8>;
    /// Frees memory from [`Driver::host_alloc`]; makes the device current first, without
    /// reporting earlier errors (they must not leak the memory).
    ///
    /// # Safety
    /// `ptr` came from `host_alloc` and no queued work uses it.
    unsafe fn host_free(&self, ptr: *mut u8) -> Result<()>;
    /// The stream's raw handle (`CUstream`, `hipStream_t`), for libraries that take one.
    fn raw_stream(stream: &Self::Stream) -> *mut c_void;
    /// `bytes` (at least 1) of device memory, allocated in stream order on `stream`: work
    /// queued on `stream` afterwards may use it.
    fn alloc_async(&self, stream: &Self::Stream, bytes: usize) -> Result<DevicePtr>;
    /// Frees memory from [`Driver::alloc_async`] in stream order on `stream`.
    ///
    /// # Safety
    /// `ptr` came from `alloc_async`; no work queued after this call (on any stream not ordered
    /// before it) uses it.
    unsafe fn free_async(&self, stream: &Self::Stream, ptr: DevicePtr) -> Result<()>;
    /// Queues a copy of `bytes` from device memory at `src` to device memory at `dst`.
    ///
    /// # Safety
    /// Both ranges are device memory of this device, valid until the copy has run.
    unsafe fn memcpy_d2d(&self, stream: &Self::Stream, dst: DevicePtr, src: DevicePtr, bytes: usize) -> Result<()>;
    /// The device's address of mapped host memory.
    fn host_device_ptr(&self, host: *mut u8) -> Result<DevicePtr>;

    /// Queues a copy of `bytes` contiguous bytes between pinned `host` and `device` memory.
    ///
    /// # Safety
    /// Both ranges are valid until the copy has run; `host` is pinned.
    unsafe fn memcpy(
        &self,
        stream: &Self::Stream,
        dir: Direction,
        host: *mut u8,
        device: DevicePtr,
        bytes: usize,
    ) -> Result<()>;
    /// Queues a 2-D copy of `rows` rows of `row_bytes`, consecutive rows `host_pitch` and
    /// `device_pitch` apart (both at least `row_bytes` and within the device's pitch limit).
    ///
    /// # Safety
    /// As [`Driver::memcpy`], for every row.
    #[allow(clippy::too_many_arguments)]
    unsafe fn memcpy_2d(
        &self,
        stream: &Self::Stream,
        dir: Direction,
        host: *mut u8,
        host_pitch: usize,
        device: DevicePtr,
        device_pitch: usize,
        row_bytes: usize,
        rows: usize,
    ) -> Result<()>;

    /// Where kernel `entry` comes from: the image, a key that identifies it (its address), and
    /// the entry's name in it.
    fn find(&self, entry: &str) -> Result<(Self::Image, usize, &'static str)>;
    /// Whether `module` has an image this device can load (the builtin kernels are preloaded
    /// when it does).
    fn has_image(&self, module: &KernelModule) -> bool;
    /// Loads a module.
    fn load_module(&self, image: Self::Image) -> Result<Self::Module>;
    /// A kernel of a loaded module.
    fn get_function(&self, module: &Self::Module, entry: &str) -> Result<Self::Function>;
    /// Hands the host body of kernel `entry` to a driver simulator (cudasim), which runs it
    /// when `entry` is a user kernel; called before the kernel is first loaded. Real drivers
    /// have no such hook: nothing happens.
    fn offer_host_body(&self, _entry: &str, _body: HostBody) {}
    /// Queues `function` as `shape` says.
    ///
    /// # Safety
    /// `args` point to the kernel's parameters in order, each of the parameter's type; the
    /// memory the kernel touches stays valid, and untouched by others, until it has run.
    unsafe fn launch(
        &self,
        stream: &Self::Stream,
        function: &Self::Function,
        shape: Shape,
        args: &mut [*mut c_void],
    ) -> Result<()>;
    /// Queues a host function that calls [`released`] with `payload` when the stream reaches
    /// it.
    ///
    /// # Safety
    /// `payload` is what [`released`] expects; on error it was not queued and stays the
    /// caller's.
    unsafe fn host_fn(&self, stream: &Self::Stream, payload: *mut c_void) -> Result<()>;

    /// Queues a store of `value` to the 32-bit word at `flag`, after all prior work of the
    /// stream and visible to the host.
    ///
    /// # Safety
    /// `flag` is mapped host memory that stays allocated until the store has run.
    unsafe fn write_value(&self, stream: &Self::Stream, flag: DevicePtr, value: u32) -> Result<()>;
    /// Queues a wait until the word at `flag` compares at least `value` (see
    /// [`Driver::wait_value_is_exact`]).
    ///
    /// # Safety
    /// As [`Driver::write_value`], until the wait has finished.
    unsafe fn wait_value(&self, stream: &Self::Stream, flag: DevicePtr, value: u32) -> Result<()>;
    /// Whether [`Driver::wait_value`] for `value`, with the flag at `now` (below it), decides
    /// exactly as the cyclic comparison of [`duralumin_kernels::flag::reached`] does; else the
    /// `stream_wait` kernel waits. CUDA's `GEQ` is cyclic.
    fn wait_value_is_exact(now: u32, value: u32) -> bool {
        let _ = (now, value);
        true
    }

    /// Makes `waiter` wait for the work queued on `stream` so far (an event).
    fn join(&self, waiter: &Self::Stream, stream: &Self::Stream) -> Result<()>;
    /// A new event (no timing).
    fn new_event(&self) -> Result<Self::Event>;
    /// Records `event` on `stream`: it completes once the work queued there so far has run.
    fn record_event(&self, event: &Self::Event, stream: &Self::Stream) -> Result<()>;
    /// Whether the work `event` was last recorded after has run (an event never recorded has).
    fn event_done(&self, event: &Self::Event) -> Result<bool>;
    /// Makes `waiter` wait for the work `event` was last recorded after.
    fn wait_event(&self, waiter: &Self::Stream, event: &Self::Event) -> Result<()>;
    /// Blocks until the work queued on `stream` so far has run.
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;
    /// Whether the work queued on `stream` so far has run.
    fn query(&self, stream: &Self::Stream) -> Result<bool>;
    /// Synchronizes `stream` with the raw calls, reporting nothing: whether it is drained (used
    /// on a thread of its own, where an error recorded for the device's next call must stay).
    fn drained(&self, stream: &Self::Stream) -> bool;
    /// Blocks until the device's (or context's) queued work has run.
    fn synchronize_all(&self) -> Result<()>;
}

/// Errors recorded for later: `(API, device ordinal, error)`.
type Recorded = Mutex<Vec<(&'static str, usize, Error)>>;

/// Errors raised where they cannot be returned (drops, other threads), by API and device
/// ordinal, until a call of that device returns them (cudarc's `record_err`/`check_err`).
fn recorded() -> &'static Recorded {
    static RECORDED: OnceLock<Recorded> = OnceLock::new();
    RECORDED.get_or_init(Mutex::default)
}

/// Keeps the error of `result`, if any, for the next call on device `ordinal` of `api`.
pub(crate) fn record(api: &'static str, ordinal: usize, result: Result<()>) {
    if let Err(e) = result {
        recorded().lock().unwrap_or_else(PoisonError::into_inner).push((api, ordinal, e));
    }
}

/// The first recorded error of device `ordinal` of `api`, if any.
fn take_recorded(api: &'static str, ordinal: usize) -> Result<()> {
    let mut list = recorded().lock().unwrap_or_else(PoisonError::into_inner);
    match list.iter().position(|(a, o, _)| *a == api && *o == ordinal) {
        Some(i) => Err(list.remove(i).2),
        None => Ok(()),
    }
}

/// A GPU for the HostTransfer backend: its driver, flag path, grid limits, pinned argument
/// lists and loaded kernels. Cloning gives another handle to the same device.
pub(crate) struct Gpu<R: Driver> {
    inner: Arc<Inner<R>>,
}

impl<R: Driver> Clone for Gpu<R> {
    fn clone(&self) -> Self {
        Gpu { inner: Arc::clone(&self.inner) }
    }
}

struct Inner<R: Driver> {
    driver: R,
    flags: FlagPath,
    /// Streaming multiprocessors or compute units (grid sizing).
    units: u32,
    /// The largest pitch a 2-D copy takes.
    max_pitch: usize,
    /// Pinned memory the pack kernels read their segment lists from.
    arg_lists: Arc<ArgLists>,
    /// Loaded modules by image key, and kernels by entry name.
    modules: Mutex<HashMap<usize, R::Module>>,
    functions: Mutex<HashMap<String, R::Function>>,
}

impl<R: Driver> Drop for Inner<R> {
    /// Kernels of the device's modules, reading its argument lists, may still be queued (a flag
    /// kernel behind an operation's last wait, say): the modules are unloaded and the lists
    /// freed only once the device is through with its queued work. The proxy thread must not
    /// wait for that (`docs/architecture.md#the-queue-order-rule`): there, another thread waits
    /// and unloads.
    fn drop(&mut self) {
        let modules = std::mem::take(self.modules.get_mut().unwrap_or_else(PoisonError::into_inner));
        let functions = std::mem::take(self.functions.get_mut().unwrap_or_else(PoisonError::into_inner));
        // Addresses, so the closure below may move to another thread.
        let lists: Vec<usize> = self.arg_lists.blocks().into_iter().map(|(p, _)| p as usize).collect();
        if modules.is_empty() && lists.is_empty() {
            return;
        }
        let driver = self.driver.clone();
        let unload = move || {
            let ordinal = driver.ordinal();
            // An error (a failed kernel) is recorded for the device's next user; the modules
            // and lists go either way.
            record(R::API, ordinal, driver.synchronize_all());
            drop(functions);
            drop(modules);
            for p in lists {
                // SAFETY: an argument list block from `host_alloc`; the device has run every
                // kernel that could read it.
                record(R::API, ordinal, unsafe { driver.host_free(p as *mut u8) });
            }
        };
        if crate::common::progress::on_proxy_thread() {
            // Without a thread, the modules stay loaded rather than the proxy thread waiting.
            let _ = std::thread::Builder::new().name("duralumin-unload".into()).spawn(unload);
        } else {
            unload();
        }
    }
}

impl<R: Driver> Gpu<R> {
    /// A device over `driver` with flag path `flags` (resolved, never `Auto`), `units`
    /// multiprocessors and pitch limit `max_pitch`. Loads the builtin kernels now, on the
    /// caller's thread: with lazy loading (CUDA 12.2 and later) a kernel's first launch may
    /// otherwise synchronize the context, which on the proxy thread would never return (the
    /// queue-order rule: `docs/architecture.md#the-queue-order-rule`). Missing kernels the flag
    /// path needs fail here, not on the first operation.
    pub(crate) fn new(driver: R, flags: FlagPath, units: u32, max_pitch: usize) -> Result<Self> {
        let gpu = Gpu {
            inner: Arc::new(Inner {
                driver,
                flags,
                units: units.max(1),
                max_pitch,
                arg_lists: Arc::default(),
                modules: Mutex::default(),
                functions: Mutex::default(),
            }),
        };
        let builtin = crate::device_code::builtin();
        if gpu.inner.driver.has_image(builtin) {
            for entry in builtin.entries {
                gpu.function(entry)?;
            }
        } else if flags == FlagPath::Kernels {
            gpu.function(fixed::SIGNAL)?;
            gpu.function(fixed::STREAM_WAIT)?;
        }
        Ok(gpu)
    }

    /// The driver handle.
    pub(crate) fn driver(&self) -> &R {
        &self.inner.driver
    }

    /// The flag path in use (never [`FlagPath::Auto`]).
    pub(crate) fn flag_path(&self) -> FlagPath {
        self.inner.flags
    }

    /// The device's name in messages (`"cuda:0"`).
    pub(crate) fn name(&self) -> String {
        format!("{}:{}", R::API, self.inner.driver.ordinal())
    }

    /// Makes the device current, after returning an error recorded for it.
    pub(crate) fn bind(&self) -> Result<()> {
        take_recorded(R::API, self.inner.driver.ordinal())?;
        self.inner.driver.bind()
    }

    /// Keeps an error for this device's next call.
    pub(crate) fn record(&self, result: Result<()>) {
        record(R::API, self.inner.driver.ordinal(), result);
    }

    pub(crate) fn check_stream(&self, stream: &R::Stream) -> Result<()> {
        if self.inner.driver.owns(stream) {
            Ok(())
        } else {
            Err(Error::WrongDevice { what: "stream", expected: self.name(), found: R::describe(stream) })
        }
    }

    /// The kernel `entry` of a registered module, loaded on this device on first use.
    pub(crate) fn function(&self, entry: &str) -> Result<R::Function> {
        self.function_with(entry, None)
    }

    /// The reduce kernel of `op`.
    pub(crate) fn reduce_kernel(&self, op: &ReduceFns) -> Result<R::Function> {
        let body = HostBody::Reduce { elem_size: op.elem_size, run: op.host_reduce };
        self.function_with(op.reduce.as_str(), Some(body))
    }

    /// The finish kernel of `op`, if it has one.
    pub(crate) fn finish_kernel(&self, op: &ReduceFns) -> Result<Option<R::Function>> {
        let (Some(name), Some(run)) = (op.finish, op.host_finish) else { return Ok(None) };
        self.function_with(name.as_str(), Some(HostBody::Finish { elem_size: op.elem_size, run })).map(Some)
    }

    /// Kernel `entry`, loaded on first use (its host body, if given, offered to the driver
    /// first).
    fn function_with(&self, entry: &str, body: Option<HostBody>) -> Result<R::Function> {
        let mut functions = self.inner.functions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = functions.get(entry) {
            return Ok(f.clone());
        }
        let driver = &self.inner.driver;
        let (image, key, name) = driver.find(entry)?;
        if let Some(body) = body {
            driver.offer_host_body(name, body);
        }
        let f = {
            let mut modules = self.inner.modules.lock().unwrap_or_else(PoisonError::into_inner);
            let module = match modules.entry(key) {
                Entry::Occupied(m) => m.into_mut(),
                Entry::Vacant(v) => {
                    self.bind()?;
                    v.insert(driver.load_module(image)?)
                }
            };
            driver.get_function(module, name)?
        };
        functions.insert(entry.to_owned(), f.clone());
        Ok(f)
    }

    /// Multiprocessors (or compute units) of the device.
    pub(crate) fn units(&self) -> u32 {
        self.inner.units
    }

    /// Blocks of a grid-stride launch over `items` work items.
    fn blocks(&self, items: usize) -> u32 {
        let max = self.inner.units as usize * 8;
        u32::try_from(items.div_ceil(BLOCK as usize * 4).clamp(1, max.max(1))).unwrap_or(u32::MAX)
    }

    /// The stream's raw handle.
    pub(crate) fn raw_stream(&self, stream: &R::Stream) -> *mut c_void {
        R::raw_stream(stream)
    }

    /// The driver API's name (`"cuda"`, `"hip"`).
    pub(crate) fn api(&self) -> &'static str {
        R::API
    }

    pub(crate) fn new_stream(&self) -> Result<R::Stream> {
        self.bind()?;
        self.inner.driver.new_stream()
    }

    /// Zero-filled pinned, mapped memory.
    pub(crate) fn alloc_pinned(&self, bytes: usize) -> Result<*mut u8> {
        self.bind()?;
        let ptr = self.inner.driver.host_alloc(bytes.max(1))?;
        // SAFETY: `ptr` is a fresh allocation of at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, bytes) };
        Ok(ptr)
    }

    /// # Safety
    /// `ptr` came from [`Gpu::alloc_pinned`] and no queued work uses it.
    pub(crate) unsafe fn free_pinned(&self, ptr: *mut u8) {
        // SAFETY: guaranteed by the caller.
        self.record(unsafe { self.inner.driver.host_free(ptr) });
    }

    pub(crate) fn mapped(&self, host: *mut u8) -> Result<DevicePtr> {
        self.bind()?;
        self.inner.driver.host_device_ptr(host)
    }

    /// Whether the reduction kernels of `op` load here.
    pub(crate) fn can_reduce(&self, op: &ReduceFns) -> bool {
        self.bind().is_ok() && self.reduce_kernel(op).is_ok() && self.finish_kernel(op).is_ok()
    }

    pub(crate) fn join(&self, waiter: &R::Stream, stream: &R::Stream) -> Result<()> {
        self.check_stream(waiter)?;
        self.check_stream(stream)?;
        if R::same(waiter, stream) {
            return Ok(());
        }
        self.bind()?;
        self.inner.driver.join(waiter, stream)
    }

    pub(crate) fn new_event(&self) -> Result<R::Event> {
        self.bind()?;
        self.inner.driver.new_event()
    }

    pub(crate) fn record_event(&self, event: &R::Event, stream: &R::Stream) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        self.inner.driver.record_event(event, stream)
    }

    pub(crate) fn event_done(&self, event: &R::Event) -> Result<bool> {
        self.bind()?;
        self.inner.driver.event_done(event)
    }

    pub(crate) fn wait_event(&self, waiter: &R::Stream, event: &R::Event) -> Result<()> {
        self.check_stream(waiter)?;
        self.bind()?;
        self.inner.driver.wait_event(waiter, event)
    }

    pub(crate) fn synchronize(&self, stream: &R::Stream) -> Result<()> {
        self.check_stream(stream)?;
        self.bind()?;
        self.inner.driver.synchronize(stream)
    }

    pub(crate) fn query(&self, stream: &R::Stream) -> Result<bool> {
        self.check_stream(stream)?;
        self.bind()?;
        self.inner.driver.query(stream)
    }
}

/// Implements [`super::Device`] (and the NCCL backend's device trait) for a public GPU device
/// type holding a [`Gpu`] in a field named `gpu`, by forwarding every method; `$stream` and
/// `$event` are its driver's stream and event types.
macro_rules! gpu_device {
    ($device:ty, $stream:ty, $event:ty) => {
        impl $crate::device::sealed::Sealed for $device {}

        #[cfg(any(feature = "cuda", feature = "hip"))]
        impl $crate::device::NcclDevice for $device {
            type Event = $event;

            fn new_event(&self) -> $crate::api::error::Result<Self::Event> {
                self.gpu.new_event()
            }
            fn record_event(&self, event: &Self::Event, stream: &Self::Stream) -> $crate::api::error::Result<()> {
                self.gpu.record_event(event, stream)
            }
            fn event_done(&self, event: &Self::Event) -> $crate::api::error::Result<bool> {
                self.gpu.event_done(event)
            }
            fn wait_event(&self, waiter: &Self::Stream, event: &Self::Event) -> $crate::api::error::Result<()> {
                self.gpu.wait_event(waiter, event)
            }
            fn raw_stream(&self, stream: &Self::Stream) -> *mut std::ffi::c_void {
                self.gpu.raw_stream(stream)
            }
            fn api(&self) -> &'static str {
                self.gpu.api()
            }
            fn bind(&self) -> $crate::api::error::Result<()> {
                self.gpu.bind()
            }
            fn scratch(
                &self,
                stream: &Self::Stream,
                bytes: usize,
            ) -> $crate::api::error::Result<$crate::device::DevicePtr> {
                self.gpu.scratch(stream, bytes)
            }
            unsafe fn free_scratch(&self, stream: &Self::Stream, ptr: $crate::device::DevicePtr) {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.free_scratch(stream, ptr) }
            }
            unsafe fn copy_d2d(
                &self,
                stream: &Self::Stream,
                dst: $crate::device::DevicePtr,
                src: $crate::device::DevicePtr,
                bytes: usize,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.copy_d2d(stream, dst, src, bytes) }
            }
            unsafe fn reduce_d2d(
                &self,
                stream: &Self::Stream,
                dst: $crate::device::DevicePtr,
                src: $crate::device::DevicePtr,
                len: usize,
                op: &$crate::device::ReduceFns,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.reduce_d2d(stream, dst, src, len, op) }
            }
            unsafe fn finish_d2d(
                &self,
                stream: &Self::Stream,
                dst: $crate::device::DevicePtr,
                len: usize,
                op: &$crate::device::ReduceFns,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.finish_d2d(stream, dst, len, op) }
            }
        }

        impl $crate::device::Device for $device {
            type Stream = $stream;

            fn name(&self) -> String {
                self.gpu.name()
            }

            fn ordinal(&self) -> usize {
                $crate::device::gpu::Driver::ordinal(self.gpu.driver())
            }

            fn owns(&self, stream: &Self::Stream) -> bool {
                $crate::device::gpu::Driver::owns(self.gpu.driver(), stream)
            }

            fn new_stream(&self) -> $crate::api::error::Result<Self::Stream> {
                self.gpu.new_stream()
            }

            fn alloc_pinned(&self, bytes: usize) -> $crate::api::error::Result<*mut u8> {
                self.gpu.alloc_pinned(bytes)
            }

            unsafe fn free_pinned(&self, ptr: *mut u8, _bytes: usize) {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.free_pinned(ptr) }
            }

            fn mapped(&self, host: *mut u8) -> $crate::api::error::Result<$crate::device::DevicePtr> {
                self.gpu.mapped(host)
            }

            unsafe fn copy_d2h(
                &self,
                stream: &Self::Stream,
                dst: *mut u8,
                src: $crate::device::DevicePtr,
                shape: $crate::device::Copy2d,
                keep: Option<$crate::device::KeepAlive>,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.copy(stream, $crate::device::gpu::Direction::ToHost, dst, src, shape, keep) }
            }

            unsafe fn copy_h2d(
                &self,
                stream: &Self::Stream,
                dst: $crate::device::DevicePtr,
                src: *const u8,
                shape: $crate::device::Copy2d,
                keep: Option<$crate::device::KeepAlive>,
            ) -> $crate::api::error::Result<()> {
                let to_device = $crate::device::gpu::Direction::ToDevice;
                // SAFETY: forwarded from the caller; the host side is only read.
                unsafe { self.gpu.copy(stream, to_device, src.cast_mut(), dst, shape, keep) }
            }

            unsafe fn pack_d2h(
                &self,
                stream: &Self::Stream,
                dst: *mut u8,
                pieces: Vec<($crate::device::DevicePtr, usize)>,
                keep: Vec<$crate::device::KeepAlive>,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.pieces(stream, $crate::device::gpu::Direction::ToHost, dst, pieces, keep) }
            }

            unsafe fn unpack_h2d(
                &self,
                stream: &Self::Stream,
                pieces: Vec<($crate::device::DevicePtr, usize)>,
                src: *const u8,
                keep: Vec<$crate::device::KeepAlive>,
            ) -> $crate::api::error::Result<()> {
                let to_device = $crate::device::gpu::Direction::ToDevice;
                // SAFETY: forwarded from the caller; the host side is only read.
                unsafe { self.gpu.pieces(stream, to_device, src.cast_mut(), pieces, keep) }
            }

            unsafe fn write_flag(
                &self,
                stream: &Self::Stream,
                flag: $crate::device::Flag,
                value: u32,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.write_flag(stream, flag, value) }
            }

            unsafe fn wait_flag(
                &self,
                stream: &Self::Stream,
                flag: $crate::device::Flag,
                value: u32,
                keep: Option<$crate::device::KeepAlive>,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.wait_flag(stream, flag, value, keep) }
            }

            unsafe fn reduce_h2d(
                &self,
                stream: &Self::Stream,
                dst: $crate::device::DevicePtr,
                src: *const u8,
                rows: usize,
                len: usize,
                op: $crate::device::ReduceFns,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.reduce_h2d(stream, dst, src, rows, len, op) }
            }

            fn can_reduce(&self, op: &$crate::device::ReduceFns) -> bool {
                self.gpu.can_reduce(op)
            }

            fn has_mover(&self) -> bool {
                self.gpu.has_mover()
            }

            unsafe fn queue_mover(
                &self,
                stream: &Self::Stream,
                schedule: duralumin_kernels::mover::Schedule,
                blocks: usize,
                keep: Vec<$crate::device::KeepAlive>,
            ) -> $crate::api::error::Result<()> {
                // SAFETY: forwarded from the caller.
                unsafe { self.gpu.queue_mover(stream, schedule, blocks, keep) }
            }

            fn acquire(
                &self,
                stream: &Self::Stream,
                keep: &[$crate::device::KeepAlive],
            ) -> $crate::api::error::Result<()> {
                self.gpu.acquire(stream, keep)
            }

            fn release(
                &self,
                stream: &Self::Stream,
                keep: &[$crate::device::KeepAlive],
            ) -> $crate::api::error::Result<()> {
                self.gpu.release(stream, keep)
            }

            fn join(&self, waiter: &Self::Stream, stream: &Self::Stream) -> $crate::api::error::Result<()> {
                self.gpu.join(waiter, stream)
            }

            fn synchronize(&self, stream: &Self::Stream) -> $crate::api::error::Result<()> {
                self.gpu.synchronize(stream)
            }

            fn query(&self, stream: &Self::Stream) -> $crate::api::error::Result<bool> {
                self.gpu.query(stream)
            }
        }
    };
}
pub(crate) use gpu_device;
