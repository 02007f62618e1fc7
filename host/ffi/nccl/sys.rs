//! NCCL's C types and entry points, resolved at run time from the library the loader finds.
//!
//! Why not cudarc's `nccl::sys` (argued in `docs/nccl.md`): its loader does not look for
//! `libnccl.so.2`, the only name NCCL's packages and wheels ship; its `ncclResult_t` is a Rust
//! enum, so a status code newer than the bindings would be undefined behaviour; and its
//! `ncclConfig_t` layout is fixed by a build feature. Here every entry point returns a plain
//! `c_int`, and the configuration is the NCCL 2.17 prefix every later NCCL accepts (it reads
//! `size` first).

use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_void};

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct UniqueId {
    pub(crate) internal: [c_char; 128],
}

/// `ncclConfig_t` as of NCCL 2.17 (`NCCL_CONFIG_INITIALIZER` with `blocking` set).
#[repr(C)]
pub(crate) struct Config {
    size: usize,
    magic: c_uint,
    version: c_uint,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

/// `NCCL_CONFIG_UNDEF_INT`: the library's default.
const UNDEF: c_int = c_int::MIN;

impl Config {
    /// A configuration that leaves everything at NCCL's defaults but `blocking`.
    pub(crate) fn new(blocking: bool) -> Config {
        Config {
            size: size_of::<Config>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: c_int::from(blocking),
            cga_cluster_size: UNDEF,
            min_ctas: UNDEF,
            max_ctas: UNDEF,
            net_name: std::ptr::null(),
            split_share: UNDEF,
        }
    }
}

/// `ncclComm_t`.
pub(crate) type Comm = *mut c_void;
/// `cudaStream_t` / `hipStream_t`.
pub(crate) type Stream = *mut c_void;

/// `ncclSuccess`.
pub(crate) const SUCCESS: c_int = 0;
/// `ncclInProgress`.
pub(crate) const IN_PROGRESS: c_int = 7;
/// `NCCL_SPLIT_NOCOLOR`.
pub(crate) const SPLIT_NOCOLOR: c_int = -1;

/// `ncclDataType_t` values.
pub(crate) mod dtype {
    use std::ffi::c_int;
    pub(crate) const INT8: c_int = 0;
    pub(crate) const UINT8: c_int = 1;
    pub(crate) const INT32: c_int = 2;
    pub(crate) const UINT32: c_int = 3;
    pub(crate) const INT64: c_int = 4;
    pub(crate) const UINT64: c_int = 5;
    pub(crate) const FLOAT16: c_int = 6;
    pub(crate) const FLOAT32: c_int = 7;
    pub(crate) const FLOAT64: c_int = 8;
    pub(crate) const BFLOAT16: c_int = 9;
}

/// `ncclRedOp_t` values.
pub(crate) mod redop {
    use std::ffi::c_int;
    pub(crate) const SUM: c_int = 0;
    pub(crate) const PROD: c_int = 1;
    pub(crate) const MAX: c_int = 2;
    pub(crate) const MIN: c_int = 3;
    pub(crate) const AVG: c_int = 4;
}

/// Which library: NCCL (CUDA) or RCCL (HIP, the same API).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flavor {
    Nccl,
    Rccl,
}

impl Flavor {
    /// The environment variable that names the library's path.
    pub(crate) fn env(self) -> &'static str {
        match self {
            Flavor::Nccl => "DURALUMIN_NCCL",
            Flavor::Rccl => "DURALUMIN_RCCL",
        }
    }

    /// The names the dynamic loader is asked for, in order.
    fn names(self) -> &'static [&'static str] {
        match self {
            Flavor::Nccl => &["libnccl.so.2", "libnccl.so"],
            Flavor::Rccl => &["librccl.so.1", "librccl.so"],
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Flavor::Nccl => "NCCL",
            Flavor::Rccl => "RCCL",
        }
    }
}

/// Declares the entry-point table: each field a function pointer resolved by name.
macro_rules! entry_points {
    ($($field:ident = $sym:literal : fn($($arg:ty),*) $(-> $ret:ty)?;)*) => {
        /// The library's entry points (every status is a plain `c_int`, see the module doc).
        pub(crate) struct Library {
            /// What was loaded (path or name), for messages.
            pub(crate) loaded: String,
            $(pub(crate) $field: Option<unsafe extern "C" fn($($arg),*) $(-> $ret)?>,)*
        }

        impl Library {
            /// Resolves every entry point of `handle` (missing ones stay `None`).
            ///
            /// # Safety
            /// `handle` is a live `dlopen` handle of an NCCL-compatible library, never closed.
            unsafe fn resolve(handle: *mut c_void, loaded: String) -> Library {
                Library {
                    loaded,
                    $($field: {
                        // SAFETY: the handle is live (caller); the name is NUL-terminated.
                        let p = unsafe { libc::dlsym(handle, concat!($sym, "\0").as_ptr().cast()) };
                        // SAFETY: a non-null symbol of this name has the C signature NCCL's
                        // header declares, which the field's type spells out.
                        (!p.is_null()).then(|| unsafe {
                            std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($arg),*) $(-> $ret)?>(p)
                        })
                    },)*
                }
            }
        }
    };
}

entry_points! {
    get_version = "ncclGetVersion": fn(*mut c_int) -> c_int;
    get_last_error = "ncclGetLastError": fn(Comm) -> *const c_char;
    get_unique_id = "ncclGetUniqueId": fn(*mut UniqueId) -> c_int;
    comm_init_rank_config = "ncclCommInitRankConfig": fn(*mut Comm, c_int, UniqueId, c_int, *mut Config) -> c_int;
    comm_split = "ncclCommSplit": fn(Comm, c_int, c_int, *mut Comm, *mut Config) -> c_int;
    comm_finalize = "ncclCommFinalize": fn(Comm) -> c_int;
    comm_destroy = "ncclCommDestroy": fn(Comm) -> c_int;
    comm_abort = "ncclCommAbort": fn(Comm) -> c_int;
    comm_get_async_error = "ncclCommGetAsyncError": fn(Comm, *mut c_int) -> c_int;
    comm_count = "ncclCommCount": fn(Comm, *mut c_int) -> c_int;
    comm_user_rank = "ncclCommUserRank": fn(Comm, *mut c_int) -> c_int;
    group_start = "ncclGroupStart": fn() -> c_int;
    group_end = "ncclGroupEnd": fn() -> c_int;
    all_reduce = "ncclAllReduce": fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
    broadcast = "ncclBroadcast": fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
    reduce = "ncclReduce": fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, Stream) -> c_int;
    all_gather = "ncclAllGather": fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> c_int;
    reduce_scatter = "ncclReduceScatter": fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
    send = "ncclSend": fn(*const c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
    recv = "ncclRecv": fn(*mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
    alltoall = "ncclAlltoAll": fn(*const c_void, *mut c_void, usize, c_int, Comm, Stream) -> c_int;
    gather = "ncclGather": fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
    scatter = "ncclScatter": fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, Stream) -> c_int;
}

// SAFETY: the table holds function pointers and a string; NCCL's entry points may be called
// from any thread (each communicator is used by one at a time, which the backend ensures).
unsafe impl Send for Library {}
// SAFETY: as above; the table is immutable once loaded.
unsafe impl Sync for Library {}

/// Loads the library: the path in the flavor's environment variable if set, else the first
/// of its names the dynamic loader finds. Returns why none could be loaded.
pub(crate) fn load(flavor: Flavor) -> Result<Library, String> {
    let mut tried = Vec::new();
    let from_env = std::env::var(flavor.env()).ok().filter(|p| !p.is_empty());
    let candidates: Vec<String> = match from_env {
        Some(p) => vec![p],
        None => flavor.names().iter().map(|s| (*s).to_owned()).collect(),
    };
    for name in candidates {
        let Ok(c) = CString::new(name.clone()) else {
            tried.push(format!("{name:?}: contains a NUL byte"));
            continue;
        };
        // SAFETY: dlopen of a NUL-terminated name; the handle is never closed (the entry
        // points stay valid for the process's life).
        let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            // SAFETY: dlerror returns a NUL-terminated message or null.
            let why = unsafe { libc::dlerror() };
            let why = if why.is_null() {
                "not found".to_owned()
            } else {
                // SAFETY: non-null, NUL-terminated (dlerror's contract).
                unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
            };
            tried.push(why);
            continue;
        }
        // SAFETY: a live handle that is never closed.
        return Ok(unsafe { Library::resolve(handle, name) });
    }
    Err(format!("{} could not be loaded ({}; set {} to its path)", flavor.name(), tried.join("; "), flavor.env()))
}
