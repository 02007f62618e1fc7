//! Tests of the host device: executors, the ordering of work on a buffer across streams, and
//! waking sleepers.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;
use std::time::Duration;

use super::signals::Signals;
use super::{HostDevice, HostStream};
use crate::api::error::Error;
use crate::device::{Copy2d, Device, DevicePtr, DeviceSlice, Flag, ReduceFns};

/// Streams share executors round robin on a device made with `with_queues`: work of two
/// streams on one executor runs in the order it was queued (a slow item on one holds up the
/// other), while a stream with an executor of its own runs past it.
#[test]
fn streams_sharing_a_queue_run_in_the_order_work_was_queued() {
    let dev = HostDevice::with_queues(0, 2);
    let streams: Vec<_> = (0..3).map(|_| dev.stream().unwrap()).collect();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut bufs: Vec<_> = (0..3).map(|_| dev.alloc_zeroed::<u32>(1).unwrap()).collect();
    for (i, (s, b)) in streams.iter().zip(bufs.iter_mut()).enumerate() {
        let order = Arc::clone(&order);
        dev.launch(s, b, move |_| {
            if i == 0 {
                std::thread::sleep(Duration::from_millis(200));
            }
            order.lock().unwrap().push(i);
        })
        .unwrap();
    }
    for s in &streams {
        s.sync().unwrap();
    }
    // Streams 0 and 2 share the first executor, stream 1 has the second.
    assert_eq!(*order.lock().unwrap(), [1, 0, 2]);
}

/// Launches on two streams that use one buffer run one after the other, in the order they
/// were queued: the second stream waits for the first's slow kernel. Unordered, the second
/// kernel ran at once, while the first slept, with `&mut` to the same elements on two
/// threads, and the first's write then overwrote its result.
#[test]
fn launches_on_two_streams_are_ordered_by_their_buffer() {
    let dev = HostDevice::new(0);
    let (first, second) = (dev.stream().unwrap(), dev.stream().unwrap());
    let mut buf = dev.alloc_zeroed::<u32>(1024).unwrap();
    dev.launch(&first, &mut buf, |b| {
        std::thread::sleep(Duration::from_millis(200));
        b.fill(1);
    })
    .unwrap();
    dev.launch(&second, &mut buf, |b| b.iter_mut().for_each(|x| *x += 1)).unwrap();
    let got = dev.download(&buf).unwrap();
    assert!(got.iter().all(|&x| x == 2), "expected 2 everywhere (1, then + 1), got {:?}...", &got[..4]);
}

/// An operation on another stream (what the HostTransfer backend queues between
/// `acquire` and `release`) starts after a launch on its buffer: its copy sees the
/// kernel's write, though the kernel is slow.
#[test]
fn an_operation_on_another_stream_waits_for_a_launch_on_its_buffer() {
    const N: usize = 1024;
    let dev = HostDevice::new(0);
    let (kernels, ops) = (dev.stream().unwrap(), dev.stream().unwrap());
    let mut buf = dev.alloc_zeroed::<u32>(N).unwrap();
    dev.launch(&kernels, &mut buf, |b| {
        std::thread::sleep(Duration::from_millis(200));
        b.fill(1);
    })
    .unwrap();
    let staged = dev.alloc_pinned(N * 4).unwrap();
    let keep = vec![buf.keep_alive().unwrap()];
    dev.acquire(&ops, &keep).unwrap();
    // SAFETY: `staged` holds N u32s and nothing else touches it until the stream is
    // synchronized below; `keep` holds the buffer, which has N elements.
    unsafe { dev.copy_d2h(&ops, staged, buf.device_ptr(), Copy2d::contiguous(N * 4), Some(keep[0].clone())) }.unwrap();
    dev.release(&ops, &keep).unwrap();
    ops.sync().unwrap();
    // SAFETY: the copy has run (synchronized above); N u32s of pinned memory.
    let got = unsafe { std::slice::from_raw_parts(staged.cast::<u32>(), N) }.to_vec();
    // SAFETY: allocated above with this size; no queued work uses it any more.
    unsafe { dev.free_pinned(staged, N * 4) };
    assert!(got.iter().all(|&x| x == 1), "the operation's copy ran before the kernel's write: {:?}...", &got[..4]);
}

/// A launch on a buffer waits for an operation on another stream that uses the buffer, even
/// while the operation is held up (here by a flag, as an operation waits for its MPI
/// part): the operation's copy still sees the buffer as it was, and the kernel's write
/// lands after it.
#[test]
fn a_launch_waits_for_an_operation_on_another_stream() {
    const N: usize = 1024;
    let dev = HostDevice::new(0);
    let (kernels, ops) = (dev.stream().unwrap(), dev.stream().unwrap());
    let mut buf = dev.alloc_zeroed::<u32>(N).unwrap();
    let staged = dev.alloc_pinned(N * 4).unwrap();
    let raised = Arc::new(AtomicU32::new(0));
    let flag = Flag { host: &*raised, device: DevicePtr(Arc::as_ptr(&raised) as u64) };
    let keep = vec![buf.keep_alive().unwrap()];
    dev.acquire(&ops, &keep).unwrap();
    // SAFETY: the flag outlives the stream's work (synchronized below, before it goes);
    // `staged` and the buffer as in the test above.
    unsafe {
        dev.wait_flag(&ops, flag, 1, None).unwrap();
        dev.copy_d2h(&ops, staged, buf.device_ptr(), Copy2d::contiguous(N * 4), Some(keep[0].clone())).unwrap();
    }
    dev.release(&ops, &keep).unwrap();
    dev.launch(&kernels, &mut buf, |b| b.fill(5)).unwrap();
    // Unordered, the kernel would run meanwhile.
    std::thread::sleep(Duration::from_millis(100));
    raised.store(1, Ordering::Release);
    dev.host_wrote_flag();
    ops.sync().unwrap();
    kernels.sync().unwrap();
    // SAFETY: as in the test above.
    let got = unsafe { std::slice::from_raw_parts(staged.cast::<u32>(), N) }.to_vec();
    // SAFETY: as in the test above.
    unsafe { dev.free_pinned(staged, N * 4) };
    assert!(got.iter().all(|&x| x == 0), "the kernel wrote the buffer before the operation's copy: {:?}...", &got[..4]);
    assert!(dev.download(&buf).unwrap().iter().all(|&x| x == 5));
}

/// A reduction whose row size overflows `usize` is refused with a typed error before
/// anything is queued (it used to wrap and queue a copy of the wrapped size).
#[test]
fn reduce_h2d_refuses_rows_whose_size_overflows() {
    let dev = HostDevice::new(0);
    let stream = dev.stream().unwrap();
    let op = ReduceFns::of::<u32, crate::Sum>(2);
    for (rows, len) in [(1, usize::MAX / 2), (2, usize::MAX / 8 + 1)] {
        // SAFETY: the call fails its size check before it queues anything, so the
        // addresses are never used.
        let r = unsafe { dev.reduce_h2d(&stream, DevicePtr(64), 64 as *const u8, rows, len, op) };
        assert!(matches!(r, Err(Error::CountOverflow { .. })), "rows {rows} of {len}: {r:?}");
    }
    stream.sync().unwrap();
}

/// A stream waiting for a flag, then a kernel that notes the thread it runs on.
fn flag_then_kernel(dev: &HostDevice, flag: &AtomicU32) -> (HostStream, Arc<Mutex<Option<ThreadId>>>) {
    let stream = dev.stream().unwrap();
    let ran_on = Arc::new(Mutex::new(None));
    let note = Arc::clone(&ran_on);
    let flag = Flag { host: flag, device: DevicePtr(flag as *const AtomicU32 as u64) };
    // SAFETY: the flag outlives the stream's work (the tests synchronize before it goes).
    unsafe { dev.wait_flag(&stream, flag, 1, None).unwrap() };
    let mut buf = dev.alloc_zeroed::<u8>(1).unwrap();
    dev.launch(&stream, &mut buf, move |_| *note.lock().unwrap() = Some(std::thread::current().id())).unwrap();
    (stream, ran_on)
}

/// A thread that synchronizes runs the stream's work itself, once what it drives meanwhile
/// (`help`) has raised the flag the stream waits for. The flag is raised without waking
/// anyone and the device's sleepers never check again on their own, so the executor thread,
/// asleep on the flag, cannot be the one that runs the kernel: without helping, the
/// synchronize would hang.
#[test]
fn a_synchronizing_thread_runs_the_streams_work() {
    let dev = HostDevice::make(0, None, Duration::from_secs(3600));
    let flag = Arc::new(AtomicU32::new(0));
    let (stream, ran_on) = flag_then_kernel(&dev, &flag);
    // Long enough for the executor to reach the wait and fall asleep on it.
    std::thread::sleep(Duration::from_millis(50));
    let (tx, rx) = std::sync::mpsc::channel();
    let (helper_dev, helper_stream, raised) = (dev.clone(), stream.clone(), Arc::clone(&flag));
    std::thread::spawn(move || {
        let mut calls = 0;
        let mut help = || {
            calls += 1;
            raised.store(1, Ordering::Release);
            true
        };
        let r = helper_dev.synchronize_helping(&helper_stream, &mut help, None);
        let _ = tx.send((r, calls, std::thread::current().id()));
    });
    let Ok((r, calls, helper)) = rx.recv_timeout(Duration::from_secs(60)) else {
        // The stream's work waits for nothing now that the flag is up; dropping it would
        // wait for the sleeping executor.
        std::mem::forget(stream);
        panic!("the synchronize hung: the helper did not run the stream's work")
    };
    r.unwrap();
    assert!(calls >= 1, "help was never called");
    assert_eq!(*ran_on.lock().unwrap(), Some(helper), "the kernel ran on another thread than the helper");
}

/// A helper busy with what it drives does not hold the stream up: the executor thread runs
/// work that became runnable while the helper was away.
#[test]
fn the_executor_runs_work_a_busy_helper_leaves() {
    let dev = HostDevice::new(0);
    let flag = Arc::new(AtomicU32::new(0));
    let (stream, ran_on) = flag_then_kernel(&dev, &flag);
    // The executor reaches the wait and falls asleep on it before the helper comes.
    std::thread::sleep(Duration::from_millis(50));
    let signals = Arc::clone(&dev.inner.signals);
    let mut help = || {
        flag.store(1, Ordering::Release);
        signals.wake_all();
        // Busy for far longer than the executor leaves work to helpers.
        std::thread::sleep(Duration::from_millis(200));
        true
    };
    dev.synchronize_helping(&stream, &mut help, None).unwrap();
    let ran_on = ran_on.lock().unwrap().expect("the kernel never ran");
    assert_ne!(ran_on, std::thread::current().id(), "the helper ran the kernel: the executor never stepped in");
}

/// A kernel that panics fails the synchronize that follows (and every later one, as a
/// faulted context does); the stream's later work still runs.
#[test]
fn a_panicking_kernel_fails_synchronize_and_later_work_still_runs() {
    let dev = HostDevice::new(0);
    let stream = dev.stream().unwrap();
    let mut buf = dev.alloc_zeroed::<u32>(4).unwrap();
    dev.launch(&stream, &mut buf, |_| panic!("a kernel that panics (expected by the test)")).unwrap();
    dev.launch(&stream, &mut buf, |b| b.fill(7)).unwrap();
    let err = stream.sync().expect_err("the panic must be reported");
    assert!(err.to_string().contains("panicked"), "{err}");
    assert_eq!(dev.download(&buf).expect_err("sticky").to_string(), err.to_string());
    let mut fresh = dev.alloc_zeroed::<u32>(1).unwrap();
    let other = dev.stream().unwrap();
    dev.launch(&other, &mut fresh, |b| b[0] = 1).unwrap();
    other.sync().expect("another stream of the device is not broken");
    // The kernel after the panic ran (its write is there once the stream is through).
    assert!(stream.sync().is_err());
    let mem = buf.mem.ptr.cast::<u32>();
    // SAFETY: the stream is through with the buffer (synchronized above) and nothing else
    // queued work on it.
    assert_eq!(unsafe { std::slice::from_raw_parts(mem, 4) }, [7; 4]);
}

/// Two threads take turns through [`Signals`], each pausing before its write so the other
/// is asleep by then. The waits never time out on their own, so one lost wake-up leaves a
/// thread asleep for good and the test fails at its deadline.
#[test]
fn sleeping_waiters_are_woken_by_every_write() {
    const ROUNDS: u32 = 100;
    let signals = Arc::new(Signals::new(Duration::from_secs(3600)));
    let (ping, pong) = (Arc::new(AtomicU32::new(0)), Arc::new(AtomicU32::new(0)));
    let turn = |mine: Arc<AtomicU32>, theirs: Arc<AtomicU32>, first: bool| {
        let signals = Arc::clone(&signals);
        move || {
            for i in 1..=ROUNDS {
                if !first {
                    signals.wait_until(|| theirs.load(Ordering::Acquire) >= i);
                }
                std::thread::sleep(Duration::from_micros(300));
                mine.store(i, Ordering::Release);
                signals.wake_all();
                if first {
                    signals.wait_until(|| theirs.load(Ordering::Acquire) >= i);
                }
            }
        }
    };
    let a = std::thread::spawn(turn(Arc::clone(&ping), Arc::clone(&pong), true));
    let b = std::thread::spawn(turn(Arc::clone(&pong), Arc::clone(&ping), false));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = a.join();
        let _ = b.join();
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(60)).is_ok(),
        "a waiter was not woken (ping {}, pong {})",
        ping.load(Ordering::Acquire),
        pong.load(Ordering::Acquire)
    );
}
