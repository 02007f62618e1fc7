//! The CUDA device's failure paths, on the CUDA driver simulator (cudasim/): what the device
//! does when the driver refuses a call, which a GPU cannot be made to do on demand.
//!
//! Each test runs its body in a child process of this binary, with the simulator first on
//! `LD_LIBRARY_PATH` (cudarc loads the driver once per process) and `CUDASIM_FAIL_CALLS` naming
//! the calls the simulator makes fail. When the simulator is not built (`cargo build --release
//! -p duralumin-cudasim`), the tests report themselves ignored, unless
//! `DURALUMIN_REQUIRE_CUDASIM=1` (set by `scripts/test.sh`), where they fail.

use std::process::{Command, Stdio};
use std::ptr::null_mut;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use duralumin::cudarc::driver::sys::{self, CUstreamWaitValue_flags};
use duralumin::cudarc::driver::{CudaContext, CudaStream};
use duralumin::device::cuda::{CudaDevice, driver_present};
use duralumin::device::{Copy2d, Device, DevicePtr, ReduceFns};
use duralumin::{Error, Sum};
use libtest_mimic::{Arguments, Trial};

#[path = "common/mpirun.rs"]
mod mpirun;

/// Set in the child process to the name of the test whose body it runs.
const CHILD: &str = "DURALUMIN_CUDASIM_CHILD";

/// The tests: name, the calls the simulator makes fail, body.
const TESTS: [(&str, &str, fn()); 3] = [
    (
        "a_keep_alive_outlives_queued_work_when_its_host_function_fails",
        "cuLaunchHostFunc",
        a_keep_alive_outlives_queued_work_when_its_host_function_fails,
    ),
    (
        "a_keep_alive_is_not_dropped_when_neither_host_function_nor_synchronize_works",
        "cuLaunchHostFunc,cuStreamSynchronize",
        a_keep_alive_is_not_dropped_when_neither_host_function_nor_synchronize_works,
    ),
    ("reduce_h2d_refuses_rows_whose_size_overflows", "", reduce_h2d_refuses_rows_whose_size_overflows),
];

fn main() {
    if let Ok(name) = std::env::var(CHILD) {
        assert!(driver_present(), "the child found no driver on LD_LIBRARY_PATH");
        let (_, _, body) = TESTS.iter().find(|t| t.0 == name).unwrap_or_else(|| panic!("no test {name}"));
        body();
        println!("CHILD {name} ok");
        return;
    }
    let args = Arguments::from_args();
    let sim = mpirun::cudasim_dir();
    let required = std::env::var("DURALUMIN_REQUIRE_CUDASIM").is_ok_and(|v| v == "1");
    let trials = TESTS
        .iter()
        .map(|&(name, fail, _)| {
            let dir = sim.clone();
            Trial::test(name, move || {
                let dir =
                    dir.ok_or("the CUDA driver simulator is not built: cargo build --release -p duralumin-cudasim")?;
                on_simulator(&dir, name, fail);
                Ok(())
            })
            .with_ignored_flag(sim.is_none() && !required)
        })
        .collect();
    libtest_mimic::run(&args, trials).exit();
}

/// How long a child may run (its bodies take well under a second).
const LIMIT: Duration = Duration::from_secs(120);

/// Runs the test `name` in a child process on the simulator (in `dir`) with the calls `fail`
/// (comma-separated) failing.
fn on_simulator(dir: &std::path::Path, name: &str, fail: &str) {
    let exe = std::env::current_exe().expect("current_exe");
    let mut child = Command::new(exe)
        .env(CHILD, name)
        .env("LD_LIBRARY_PATH", mpirun::library_path_with(dir))
        .env("CUDASIM_FAIL_CALLS", fail)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the child");
    let (mut out, mut err) = (child.stdout.take().expect("stdout"), child.stderr.take().expect("stderr"));
    let read = |pipe: &mut dyn std::io::Read| {
        let mut s = String::new();
        let _ = pipe.read_to_string(&mut s);
        s
    };
    let (out, err) = std::thread::scope(|s| {
        let out = s.spawn(|| read(&mut out));
        let err = s.spawn(|| read(&mut err));
        let start = Instant::now();
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for the child") {
                break Some(status);
            }
            if start.elapsed() > LIMIT {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let (out, err) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
        let output = format!("--- stdout\n{out}\n--- stderr\n{err}");
        match status {
            None => panic!("the child ran past {LIMIT:?}\n{output}"),
            Some(s) => assert!(s.success(), "the child failed ({s})\n{output}"),
        }
        (out, err)
    });
    assert!(out.contains(&format!("CHILD {name} ok")), "the child did not run {name}\n{out}\n{err}");
}

/// The simulator's device and a stream of it.
fn device() -> (CudaDevice, Arc<CudaStream>) {
    let ctx = CudaContext::new(0).expect("a context on the simulator");
    let dev = CudaDevice::new(Arc::clone(&ctx)).expect("the CUDA device");
    let stream = dev.new_stream().expect("a stream");
    (dev, stream)
}

/// Work held up on a stream: a wait for `gate`, then a write of 1 to `ran`, in pinned memory.
/// It runs once the test raises the gate.
struct HeldUp {
    /// Pinned memory: the gate's word, then `ran`'s. Never freed (the child process ends soon),
    /// so a keep-alive dropped at any time may still read it.
    words: *mut u8,
}

impl HeldUp {
    fn queue(dev: &CudaDevice, stream: &CudaStream) -> HeldUp {
        let words = dev.alloc_pinned(8).expect("pinned memory");
        let device = dev.mapped(words).expect("its device address").addr();
        let geq = CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
        // SAFETY: both words lie in pinned mapped memory that is never freed; the device's
        // context is current (alloc_pinned made it so).
        unsafe {
            sys::cuStreamWaitValue32_v2(stream.cu_stream(), device, 1, geq).result().expect("queue the wait");
            sys::cuStreamWriteValue32_v2(stream.cu_stream(), device + 4, 1, 0).result().expect("queue the write");
        }
        HeldUp { words }
    }

    fn gate(&self) -> &'static AtomicU32 {
        // SAFETY: an aligned word of pinned memory that is never freed; the device reads and
        // writes it only with atomic accesses of its own.
        unsafe { &*self.words.cast::<AtomicU32>() }
    }

    fn ran(&self) -> &'static AtomicU32 {
        // SAFETY: as in `gate`, the second word.
        unsafe { &*self.words.add(4).cast::<AtomicU32>() }
    }

    /// Lets the work run.
    fn raise(&self) {
        self.gate().store(1, Ordering::Release);
    }
}

/// A keep-alive that notes, when it is dropped, whether the held-up work had run: 0 never
/// dropped, 1 dropped before the work ran, 2 after.
struct Witness {
    ran: &'static AtomicU32,
    seen: Arc<AtomicU32>,
}

impl Drop for Witness {
    fn drop(&mut self) {
        self.seen.store(1 + self.ran.load(Ordering::Acquire), Ordering::Release);
    }
}

/// Hands `witness` to the device as a keep-alive of the work queued on `stream` (an empty copy
/// holds its keep-alive like any other), with the host function that would release it failing.
fn hold(dev: &CudaDevice, stream: &Arc<CudaStream>, witness: Witness) {
    // SAFETY: an empty copy touches no memory.
    let held =
        unsafe { dev.copy_d2h(stream, null_mut(), DevicePtr::new(0), Copy2d::contiguous(0), Some(Arc::new(witness))) };
    let err = held.expect_err("cuLaunchHostFunc fails on the simulator here");
    assert!(err.to_string().contains("cuLaunchHostFunc"), "{err}");
}

/// What the witness saw when it was dropped, once it is (or, after `patience`, 0 for never).
fn seen_at_drop(seen: &AtomicU32, patience: Duration) -> u32 {
    let end = Instant::now() + patience;
    while seen.load(Ordering::Acquire) == 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    seen.load(Ordering::Acquire)
}

/// When the host function that would release a keep-alive cannot be queued, the keep-alive is
/// still not dropped before the work queued before it on the stream has run: the device drops
/// it once the stream has been synchronized. (It dropped it at once, while the stream waited.)
fn a_keep_alive_outlives_queued_work_when_its_host_function_fails() {
    let (dev, stream) = device();
    let work = HeldUp::queue(&dev, &stream);
    let seen = Arc::new(AtomicU32::new(0));
    hold(&dev, &stream, Witness { ran: work.ran(), seen: Arc::clone(&seen) });
    // The gate is down: the work cannot have run.
    let early = seen.load(Ordering::Acquire);
    work.raise();
    dev.synchronize(&stream).expect("the stream runs through");
    assert_eq!(early, 0, "the keep-alive was dropped while the stream's queued work could still use it");
    assert_eq!(seen_at_drop(&seen, LIMIT / 4), 2, "the keep-alive was never dropped, though the work ran");
}

/// When the stream cannot be synchronized either, the keep-alive is never dropped while the
/// queued work could use it (it is leaked).
fn a_keep_alive_is_not_dropped_when_neither_host_function_nor_synchronize_works() {
    let (dev, stream) = device();
    let work = HeldUp::queue(&dev, &stream);
    let seen = Arc::new(AtomicU32::new(0));
    hold(&dev, &stream, Witness { ran: work.ran(), seen: Arc::clone(&seen) });
    // A keep-alive dropped after a failed synchronize goes at once, with the gate down.
    let dropped = seen_at_drop(&seen, Duration::from_millis(200));
    work.raise();
    let end = Instant::now() + LIMIT / 4;
    while !dev.query(&stream).expect("cuStreamQuery") {
        assert!(Instant::now() < end, "the stream never ran through");
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_ne!(dropped, 1, "the keep-alive was dropped while the stream's work could use it");
}

/// A reduction whose row size overflows `usize` is refused with a typed error before anything
/// reaches the driver (it used to wrap, and queue a copy of the wrapped size).
fn reduce_h2d_refuses_rows_whose_size_overflows() {
    let (dev, stream) = device();
    let op = ReduceFns::of::<u32, Sum>(2);
    for (rows, len) in [(1, usize::MAX / 2), (2, usize::MAX / 8 + 1)] {
        // SAFETY: the call fails its size check before it queues anything, so the addresses
        // are never used.
        let r = unsafe { dev.reduce_h2d(&stream, DevicePtr::new(64), 64 as *const u8, rows, len, op) };
        assert!(matches!(r, Err(Error::CountOverflow { .. })), "rows {rows} of {len}: {r:?}");
    }
    dev.synchronize(&stream).expect("nothing failed on the stream");
}
