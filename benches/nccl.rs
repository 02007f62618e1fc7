//! The NCCL backend on a CUDA GPU, f32 allreduce from 4 KiB to 256 MiB (x4 steps):
//!
//! * the host time of one `NcclCommunicator::allreduce` call (enqueue, the median of the
//!   timed calls), next to that of a direct `ncclAllReduce`;
//! * bus bandwidth (nccl-tests' `2 (n-1)/n * bytes / time`) of `NcclCommunicator::allreduce`
//!   (f32, `Sum`) and of `ncclAllReduce` called directly, on a communicator of the same library
//!   made in the same run and on the same stream, and their ratio;
//! * u32 `BitXor`, a builtin pair NCCL lacks (its bytes move through NCCL, the Rust kernels
//!   reduce them), against f32 `Sum` through NCCL;
//! * HostTransfer's allreduce on the same device and stream.
//!
//! Every path's result is checked once against the expected reduction before anything is
//! timed. Times are the median of [`ROUNDS`] rounds, the paths interleaved round by round, each
//! round's time the slowest rank's. At one rank busbw is 0 (nothing crosses a link); the ratios
//! are of times, so they still mean something there.
//!
//! `cargo bench --bench nccl [-- --np 1,2 --max-bytes N --iters N]` relaunches itself under
//! `mpirun` per rank count; started by `mpirun` itself it is one rank of that job. The ranks
//! share GPU 0. `DURALUMIN_NCCL` names the library (default `libnccl.so.2`) for both the
//! backend and the direct calls. Without a CUDA device or NCCL it prints `SKIPPED` and exits 0.
//! Rows start with `| ` (what `scripts/gpu.sh` collects); targets are printed as checks, never
//! asserted.

#[cfg(not(feature = "cuda"))]
fn main() {
    println!("SKIPPED: built without the cuda feature");
}

#[cfg(feature = "cuda")]
fn main() {
    gpu::main();
}

/// `ncclAllReduce` without Duralumin: the few entry points the comparison needs, loaded with
/// `dlopen` from the library the backend loads.
#[cfg(feature = "cuda")]
mod direct {
    use std::ffi::{CStr, CString, c_char, c_int, c_void};

    /// `ncclUniqueId`: 128 opaque bytes, passed by value.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub struct UniqueId {
        pub internal: [c_char; 128],
    }

    /// `ncclFloat32`.
    pub const FLOAT32: c_int = 7;
    /// `ncclSum`.
    pub const SUM: c_int = 0;

    type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
    type CommInitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> c_int;
    type AllReduce =
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
    type CommDestroy = unsafe extern "C" fn(*mut c_void) -> c_int;
    type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

    /// The loaded library's entry points (the handle is never closed).
    pub struct Lib {
        get_unique_id: GetUniqueId,
        comm_init_rank: CommInitRank,
        all_reduce: AllReduce,
        comm_destroy: CommDestroy,
        error_string: GetErrorString,
    }

    impl Lib {
        /// `$DURALUMIN_NCCL` if set, else `libnccl.so.2`: the library the backend loads.
        pub fn open() -> Result<Lib, String> {
            let path = std::env::var("DURALUMIN_NCCL").ok().filter(|p| !p.is_empty());
            let path = path.unwrap_or_else(|| "libnccl.so.2".into());
            let c = CString::new(path.clone()).map_err(|_| format!("{path:?} contains a NUL byte"))?;
            // SAFETY: dlopen of a NUL-terminated name; the handle is never closed, so the entry
            // points stay valid for the process's life.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if handle.is_null() {
                return Err(format!("dlopen {path}: {}", dl_error()));
            }
            let sym = |name: &CStr| {
                // SAFETY: a live handle and a NUL-terminated name.
                let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
                if p.is_null() { Err(format!("{path}: no {}: {}", name.to_string_lossy(), dl_error())) } else { Ok(p) }
            };
            // SAFETY (each transmute): the symbol is the NCCL entry point of that name, whose C
            // signature (nccl.h, every status an `ncclResult_t`, a C int) the type spells.
            Ok(Lib {
                // SAFETY: as above.
                get_unique_id: unsafe { std::mem::transmute::<*mut c_void, GetUniqueId>(sym(c"ncclGetUniqueId")?) },
                // SAFETY: as above.
                comm_init_rank: unsafe { std::mem::transmute::<*mut c_void, CommInitRank>(sym(c"ncclCommInitRank")?) },
                // SAFETY: as above.
                all_reduce: unsafe { std::mem::transmute::<*mut c_void, AllReduce>(sym(c"ncclAllReduce")?) },
                // SAFETY: as above.
                comm_destroy: unsafe { std::mem::transmute::<*mut c_void, CommDestroy>(sym(c"ncclCommDestroy")?) },
                // SAFETY: as above.
                error_string: unsafe {
                    std::mem::transmute::<*mut c_void, GetErrorString>(sym(c"ncclGetErrorString")?)
                },
            })
        }

        fn check(&self, call: &str, status: c_int) -> Result<(), String> {
            if status == 0 {
                return Ok(());
            }
            // SAFETY: ncclGetErrorString takes any status and returns a static string (or null).
            let text = unsafe { (self.error_string)(status) };
            let text = if text.is_null() {
                "no description".into()
            } else {
                // SAFETY: a NUL-terminated string NCCL keeps for the process's life.
                unsafe { CStr::from_ptr(text) }.to_string_lossy().into_owned()
            };
            Err(format!("{call}: status {status} ({text})"))
        }

        pub fn unique_id(&self) -> Result<UniqueId, String> {
            let mut id = UniqueId { internal: [0; 128] };
            // SAFETY: `id` is a whole `ncclUniqueId` to write.
            self.check("ncclGetUniqueId", unsafe { (self.get_unique_id)(&mut id) })?;
            Ok(id)
        }
    }

    fn dl_error() -> String {
        // SAFETY: dlerror returns a NUL-terminated message or null.
        let why = unsafe { libc::dlerror() };
        if why.is_null() {
            "unknown error".into()
        } else {
            // SAFETY: as above; copied before any other dl call.
            unsafe { CStr::from_ptr(why) }.to_string_lossy().into_owned()
        }
    }

    /// A blocking NCCL communicator (`ncclCommInitRank`), destroyed on drop.
    pub struct Comm<'l> {
        lib: &'l Lib,
        raw: *mut c_void,
    }

    impl<'l> Comm<'l> {
        /// Collective over the `nranks` ranks given the same `id`; the CUDA context of the
        /// device must be current on this thread.
        pub fn new(lib: &'l Lib, nranks: usize, id: UniqueId, rank: usize) -> Result<Comm<'l>, String> {
            let nranks = c_int::try_from(nranks).map_err(|_| "too many ranks".to_string())?;
            let rank = c_int::try_from(rank).map_err(|_| "rank out of range".to_string())?;
            let mut raw = std::ptr::null_mut();
            // SAFETY: `raw` is the out-pointer; the id came from ncclGetUniqueId on rank 0.
            lib.check("ncclCommInitRank", unsafe { (lib.comm_init_rank)(&mut raw, nranks, id, rank) })?;
            Ok(Comm { lib, raw })
        }

        /// `ncclAllReduce(send, recv, count, ncclFloat32, ncclSum, comm, stream)`.
        ///
        /// # Safety
        /// `send` and `recv` are device addresses of `count` f32 each on this communicator's
        /// device, valid until the operation has run on `stream`, a stream of that device.
        pub unsafe fn allreduce_f32_sum(
            &self,
            send: u64,
            recv: u64,
            count: usize,
            stream: *mut c_void,
        ) -> Result<(), String> {
            // Device addresses are pointers of the device's address space, passed as such.
            let address =
                |p: u64| usize::try_from(p).map_err(|_| format!("device address {p:#x} is not a pointer here"));
            let (send, recv) = (address(send)? as *const c_void, address(recv)? as *mut c_void);
            // SAFETY: guaranteed by the caller; the communicator is live.
            let status = unsafe { (self.lib.all_reduce)(send, recv, count, FLOAT32, SUM, self.raw, stream) };
            self.lib.check("ncclAllReduce", status)
        }
    }

    impl Drop for Comm<'_> {
        fn drop(&mut self) {
            // SAFETY: the live communicator, not used again; the caller synchronized its stream.
            if let Err(e) = self.lib.check("ncclCommDestroy", unsafe { (self.lib.comm_destroy)(self.raw) }) {
                eprintln!("nccl bench: {e}");
            }
        }
    }
}

#[cfg(feature = "cuda")]
#[path = "common/relaunch.rs"]
mod relaunch;
#[cfg(feature = "cuda")]
#[path = "common/timing.rs"]
mod timing;

#[cfg(feature = "cuda")]
mod gpu {
    use super::relaunch::relaunch;
    use super::timing::{max_over, time_us};
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
    use duralumin::backends::nccl::library_present;
    use duralumin::device::cuda::{CudaDevice, device_count};
    use duralumin::mpi::collective::SystemOperation;
    use duralumin::mpi::topology::SimpleCommunicator;
    use duralumin::mpi::traits::*;
    use duralumin::{BitXor, Error, HostTransferCommunicator, NcclCommunicator, Sum};

    use crate::direct;

    const SIZES: [usize; 9] = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20];

    /// Timed rounds per measurement, the paths interleaved; the median round is reported.
    const ROUNDS: usize = 3;

    /// The targets the checks print (never asserted).
    const ENQUEUE_US: f64 = 5.0;
    const NCCL_OF_DIRECT: f64 = 0.95;
    const USER_OF_BUILTIN: f64 = 0.6;

    struct Opts {
        nps: Vec<usize>,
        max_bytes: usize,
        /// Calls per timed round; by size when not given.
        iters: Option<usize>,
    }

    fn opts() -> Opts {
        let get = super::relaunch::flag;
        Opts {
            nps: super::relaunch::rank_counts("1,2"),
            max_bytes: get("--max-bytes").and_then(|s| s.parse().ok()).unwrap_or(256 << 20),
            iters: get("--iters").and_then(|s| s.parse().ok()).filter(|&n| n > 0),
        }
    }

    /// Why this process cannot run the benchmark, if it cannot.
    fn unable() -> Option<&'static str> {
        if device_count() == 0 {
            Some("no CUDA device")
        } else if !library_present() {
            Some("NCCL could not be loaded (libnccl.so.2, or the path in DURALUMIN_NCCL)")
        } else {
            None
        }
    }

    pub fn main() {
        let under_mpirun = ["DURALUMIN_BENCH_RANK", "OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"]
            .iter()
            .any(|v| std::env::var_os(v).is_some());
        if under_mpirun {
            rank_main(&opts());
            return;
        }
        if let Some(why) = unable() {
            println!("SKIPPED: {why}");
            return;
        }
        let opts = opts();
        let args: Vec<String> = std::env::args().skip(1).collect();
        for &np in &opts.nps {
            relaunch(np, &[], &args);
        }
    }

    fn median(mut v: Vec<f64>) -> f64 {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    /// Calls per timed round at `bytes`.
    fn iters(opts: &Opts, bytes: usize) -> usize {
        opts.iters.unwrap_or(((64usize << 20) / bytes).clamp(3, 100))
    }

    /// Rank `r`'s f32 contribution at `i`, small integers so that sums are exact.
    fn f32_of(i: u32, r: u32) -> f32 {
        // Both below 2^24: exact in f32.
        ((i % 13) + r + 1) as f32
    }

    /// Rank `r`'s u32 contribution at `i`.
    fn u32_of(i: u32, r: u32) -> u32 {
        i.rotate_left(r * 7) ^ r.wrapping_mul(0x9E37_79B9)
    }

    /// Counts elements of `got` unlike `want`, summed over the ranks.
    fn wrong<T: PartialEq>(world: &SimpleCommunicator, got: &[T], want: &[T]) -> u64 {
        let mine = got.iter().zip(want).filter(|(g, w)| g != w).count() as u64 + got.len().abs_diff(want.len()) as u64;
        let mut all = 0u64;
        world.all_reduce_into(&mine, &mut all, SystemOperation::sum());
        all
    }

    fn rank_main(opts: &Opts) {
        let universe = duralumin::init().expect("init");
        let world = universe.world();
        let me = usize::try_from(world.rank()).expect("a rank");
        let np = usize::try_from(world.size()).expect("an MPI size");
        let me_u32 = u32::try_from(me).expect("a rank");
        // Every rank must agree, or one would wait in a collective the others never join.
        let why = unable();
        let mut all_able = 0u8;
        world.all_reduce_into(&u8::from(why.is_none()), &mut all_able, SystemOperation::min());
        if all_able == 0 {
            if me == 0 {
                println!("SKIPPED: {}", why.unwrap_or("another rank has no CUDA device or no NCCL"));
            }
            return;
        }
        let ctx = CudaContext::new(0).expect("CUDA context");
        let dev = CudaDevice::new(Arc::clone(&ctx)).expect("CUDA device");
        let stream: Arc<CudaStream> = ctx.new_stream().expect("stream");
        let nccl = match NcclCommunicator::new(&world, dev.clone(), Arc::clone(&stream)) {
            Ok(c) => c,
            Err(Error::LibraryUnavailable(why)) => {
                if me == 0 {
                    println!("SKIPPED: NCCL unavailable: {why}");
                }
                return;
            }
            Err(e) => panic!("NcclCommunicator::new: {e}"),
        };
        let lib = direct::Lib::open().expect("loading NCCL for the direct calls");
        let raw = direct_comm(&world, &ctx, &lib);
        let host_transfer =
            HostTransferCommunicator::new(&world, dev.clone(), Arc::clone(&stream)).expect("HostTransfer communicator");

        let top = SIZES.into_iter().filter(|&s| s <= opts.max_bytes).max().unwrap_or(SIZES[0]);
        let top_n = u32::try_from(top / 4).expect("at most 2^32 elements");
        let send: CudaSlice<f32> =
            stream.clone_htod(&(0..top_n).map(|i| f32_of(i, me_u32)).collect::<Vec<_>>()).expect("send buffer");
        let mut recv: CudaSlice<f32> = stream.alloc_zeros(top / 4).expect("receive buffer");
        let send_u: CudaSlice<u32> =
            stream.clone_htod(&(0..top_n).map(|i| u32_of(i, me_u32)).collect::<Vec<_>>()).expect("send buffer");
        let mut recv_u: CudaSlice<u32> = stream.alloc_zeros(top / 4).expect("receive buffer");
        // The direct calls take raw addresses: read once, on the stream every path uses, so
        // cudarc's tracking has nothing to order.
        let send_ptr = send.device_ptr(&stream).0;
        let recv_ptr = recv.device_ptr(&stream).0;
        let cu_stream = stream.cu_stream().cast::<std::ffi::c_void>();
        let direct_allreduce = |n: usize| {
            // SAFETY: both buffers hold `top / 4 >= n` f32 on this device and live until the
            // stream is synchronized, which every measurement does before they could go.
            unsafe { raw.allreduce_f32_sum(send_ptr, recv_ptr, n, cu_stream) }.expect("ncclAllReduce");
        };
        let sync = || nccl.synchronize().expect("synchronize");

        // Each path's result once, at the largest size, before anything is timed.
        let ranks = || 0..u32::try_from(np).expect("ranks");
        let want: Vec<f32> = (0..top_n).map(|i| ranks().map(|r| f32_of(i, r)).sum()).collect();
        let want_u: Vec<u32> = (0..top_n).map(|i| ranks().fold(0, |x, r| x ^ u32_of(i, r))).collect();
        let mut verify = |what: &str, run: &mut dyn FnMut(&mut CudaSlice<f32>)| {
            stream.memset_zeros(&mut recv).expect("memset");
            run(&mut recv);
            sync();
            let bad = wrong(&world, &stream.clone_dtoh(&recv).expect("download"), &want);
            assert_eq!(bad, 0, "{what}: {bad} wrong elements over the ranks");
        };
        verify("NcclCommunicator::allreduce f32 Sum", &mut |r| nccl.allreduce(&send, r, Sum).expect("allreduce"));
        verify("ncclAllReduce", &mut |_| direct_allreduce(top / 4));
        verify("HostTransferCommunicator::allreduce f32 Sum", &mut |r| {
            host_transfer.allreduce(&send, r, Sum).expect("allreduce");
            host_transfer.synchronize().expect("synchronize");
        });
        stream.memset_zeros(&mut recv_u).expect("memset");
        nccl.allreduce(&send_u, &mut recv_u, BitXor).expect("allreduce");
        sync();
        let bad = wrong(&world, &stream.clone_dtoh(&recv_u).expect("download"), &want_u);
        assert_eq!(bad, 0, "NcclCommunicator::allreduce u32 BitXor: {bad} wrong elements over the ranks");

        if me == 0 {
            // The device's name says when this ran on the driver simulator ("cudasim (CPU)"),
            // whose numbers are the CPU's.
            let name = ctx.name().unwrap_or_else(|_| "an unnamed device".into());
            println!("\n== np = {np} (ranks share GPU 0: {name}), {} ==", nccl.library_version());
            // A row, so the summary of scripts/gpu.sh says which run the rows below are.
            println!(
                "| np = {np} | {name} | {} | verified: f32 Sum (Nccl, ncclAllReduce, HostTransfer) and u32 BitXor (Nccl) at {top} B |",
                nccl.library_version()
            );
            println!(
                "| targets | Nccl enqueue <= {ENQUEUE_US} us | Nccl busbw >= {NCCL_OF_DIRECT} x direct ncclAllReduce at 256 MiB | u32 BitXor (Rust kernels) busbw >= {USER_OF_BUILTIN} x f32 Sum at 256 MiB |"
            );
            println!(
                "| bytes | Nccl enqueue us | direct enqueue us | Nccl us | Nccl busbw | direct us | direct busbw | Nccl/direct | u32 BitXor us | its busbw | BitXor/Sum | HostTransfer us | its busbw |"
            );
        }

        let busbw_factor = 2.0 * (np - 1) as f64 / np as f64;
        let busbw = |bytes: usize, us: f64| busbw_factor * bytes as f64 / (us * 1e3);
        let mut worst_enqueue = 0.0f64;
        let mut at_top = None;
        for bytes in SIZES.into_iter().filter(|&s| s <= top) {
            let n = bytes / 4;
            let it = iters(opts, bytes);
            let (s, s_u) = (send.slice(0..n), send_u.slice(0..n));
            let mut r = recv.slice_mut(0..n);
            let mut r_u = recv_u.slice_mut(0..n);
            // Warm-up: NCCL sets up its channels and buffers on a size's first call.
            nccl.allreduce(&s, &mut r, Sum).expect("allreduce");
            direct_allreduce(n);
            nccl.allreduce(&s_u, &mut r_u, BitXor).expect("allreduce");
            host_transfer.allreduce(&s, &mut r, Sum).expect("allreduce");
            host_transfer.synchronize().expect("synchronize");
            sync();
            let (mut enqueue, mut enqueue_direct) = (Vec::new(), Vec::new());
            let (mut t_nccl, mut t_direct, mut t_user, mut t_ht) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                t_nccl.push(time_us(
                    &world,
                    it,
                    || {
                        let t = Instant::now();
                        nccl.allreduce(&s, &mut r, Sum).expect("allreduce");
                        enqueue.push(t.elapsed());
                    },
                    sync,
                ));
                t_direct.push(time_us(
                    &world,
                    it,
                    || {
                        let t = Instant::now();
                        direct_allreduce(n);
                        enqueue_direct.push(t.elapsed());
                    },
                    sync,
                ));
                t_user.push(time_us(&world, it, || nccl.allreduce(&s_u, &mut r_u, BitXor).expect("allreduce"), sync));
                t_ht.push(time_us(
                    &world,
                    it,
                    || host_transfer.allreduce(&s, &mut r, Sum).expect("allreduce"),
                    || host_transfer.synchronize().expect("synchronize"),
                ));
            }
            let us = |v: Vec<Duration>| max_over(&world, median(v.iter().map(|d| d.as_secs_f64() * 1e6).collect()));
            let (enq, enq_direct) = (us(enqueue), us(enqueue_direct));
            let (t_nccl, t_direct, t_user, t_ht) = (median(t_nccl), median(t_direct), median(t_user), median(t_ht));
            worst_enqueue = worst_enqueue.max(enq);
            if bytes == top {
                at_top = Some((t_direct / t_nccl, t_nccl / t_user));
            }
            if me == 0 {
                println!(
                    "| {bytes} | {enq:.2} | {enq_direct:.2} | {t_nccl:.1} | {:.2} | {t_direct:.1} | {:.2} | {:.2} | {t_user:.1} | {:.2} | {:.2} | {t_ht:.1} | {:.2} |",
                    busbw(bytes, t_nccl),
                    busbw(bytes, t_direct),
                    t_direct / t_nccl,
                    busbw(bytes, t_user),
                    t_nccl / t_user,
                    busbw(bytes, t_ht),
                );
            }
        }
        sync();
        if me == 0
            && let Some((nccl_of_direct, user_of_builtin)) = at_top
        {
            let at =
                if top == 256 << 20 { "256 MiB".to_string() } else { format!("{top} B (the target is at 256 MiB)") };
            let checks = [
                ("Nccl enqueue, worst size's median, us".to_string(), worst_enqueue, ENQUEUE_US, false),
                (format!("Nccl busbw / direct ncclAllReduce busbw at {at}"), nccl_of_direct, NCCL_OF_DIRECT, true),
                (format!("u32 BitXor busbw / f32 Sum busbw at {at}"), user_of_builtin, USER_OF_BUILTIN, true),
            ];
            for (what, value, target, at_least) in checks {
                let ok = if at_least { value >= target } else { value <= target };
                let cmp = if at_least { ">=" } else { "<=" };
                println!(
                    "| check | {what} | {value:.2} | target {cmp} {target} | {} |",
                    if ok { "met" } else { "MISSED" }
                );
            }
        }
        // The direct communicator goes first: NCCL's destroy wants its work done (synchronized
        // above) and the context alive.
        drop(raw);
        drop((nccl, host_transfer));
    }

    /// The direct calls' communicator: rank 0's unique id broadcast over MPI, with a flag so no
    /// rank waits for an id that will not come.
    fn direct_comm<'l>(world: &SimpleCommunicator, ctx: &Arc<CudaContext>, lib: &'l direct::Lib) -> direct::Comm<'l> {
        let me = usize::try_from(world.rank()).expect("a rank");
        let np = usize::try_from(world.size()).expect("an MPI size");
        let mut message = [0u8; 129];
        let made = if me == 0 { Some(lib.unique_id()) } else { None };
        if let Some(Ok(id)) = &made {
            message[0] = 1;
            for (d, s) in message[1..].iter_mut().zip(id.internal) {
                *d = s.to_ne_bytes()[0];
            }
        }
        world.process_at_rank(0).broadcast_into(&mut message[..]);
        if let Some(Err(e)) = made {
            panic!("{e}");
        }
        assert_eq!(message[0], 1, "rank 0 could not make an NCCL unique id");
        let mut id = direct::UniqueId { internal: [0; 128] };
        for (d, s) in id.internal.iter_mut().zip(&message[1..]) {
            *d = std::ffi::c_char::from_ne_bytes([*s]);
        }
        // NCCL takes the device from the thread's current context.
        ctx.bind_to_thread().expect("bind the CUDA context");
        direct::Comm::new(lib, np, id, me).expect("ncclCommInitRank")
    }
}
