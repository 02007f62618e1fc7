//! The progress engine, communicator management and threads.

use duralumin::*;

use crate::elements::*;
use crate::mpirun::rank_case::{comes_surely, enter, within};

pub fn run(c: &MpiCommunicator) {
    within("many_outstanding", || many_outstanding(c));
    within("progresses_without_polling", || progresses_without_polling(c));
    within("test_polls_to_completion", || test_polls_to_completion(c));
    within("shared_memory_in_flight", || shared_memory_in_flight(c));
    within("auto_nonblocking_before_the_window", || auto_nonblocking_before_the_window(c));
    assert!(progress_thread_running(), "the progress thread runs while a communicator used it");
}

/// Many operations of different kinds in flight at once, completed in reverse order.
fn many_outstanding(c: &MpiCommunicator) {
    let (me, n) = (c.rank(), c.size());
    let k = 12;
    let inputs: Vec<Vec<i64>> = (0..k).map(|j| (0..300).map(|i| (me * j + i) as i64).collect()).collect();
    let mut outs: Vec<Vec<i64>> = (0..k).map(|_| vec![0; 300]).collect();
    let mut bc: Vec<f32> = if me == 0 { (0..1000).map(|i| i as f32).collect() } else { vec![0.0; 1000] };
    let mine = [me as u32; 3];
    let mut gathered = vec![0u32; 3 * n];
    scope(|s| {
        let mut reqs = Vec::new();
        for (j, (i, o)) in inputs.iter().zip(outs.iter_mut()).enumerate() {
            let algorithm =
                [AllreduceAlgorithm::Native, AllreduceAlgorithm::Ring, AllreduceAlgorithm::Rabenseifner][j % 3];
            reqs.push(c.iallreduce_with(s, i, o, Sum, algorithm)?);
        }
        reqs.push(c.ibcast_with(s, &mut bc, 0, BcastAlgorithm::Chain)?);
        reqs.push(c.iallgather(s, &mine, &mut gathered)?);
        reqs.push(c.ibarrier(s)?);
        while let Some(r) = reqs.pop() {
            r.wait()?;
        }
        Ok::<(), Error>(())
    })
    .expect("many outstanding operations");
    for (j, o) in outs.iter().enumerate() {
        let expect: Vec<i64> = (0..300).map(|i| (0..n).map(|r| (r * j + i) as i64).sum()).collect();
        assert_eq!(*o, expect, "outstanding allreduce {j}");
    }
    assert!(bc.iter().enumerate().all(|(i, &x)| x == i as f32), "outstanding bcast");
    assert_eq!(gathered, (0..n).flat_map(|r| [r as u32; 3]).collect::<Vec<_>>(), "outstanding allgather");
}

/// Non-blocking shared-memory allreduces in flight at once on one communicator, each several
/// window chunks long (1 MiB per rank), plus a blocking one issued while they are: they take
/// the window in issue order and all give the right result, completed in reverse order.
fn shared_memory_in_flight(c: &MpiCommunicator) {
    let (me, n) = (c.rank(), c.size());
    let a_in: Vec<i64> = (0..700_001).map(|i| (i % 1000 + me) as i64).collect();
    let b_in: Vec<f64> = (0..300_007).map(|i| ((i + 3 * me) % 100) as f64).collect();
    let mut a_out = vec![0i64; a_in.len()];
    let mut b_out = b_in.clone();
    let mut d = vec![me as u32 + 1; 262_145];
    let mut between = vec![me as u16; 1000];
    scope(|s| {
        let a = c.iallreduce_with(s, &a_in, &mut a_out, Sum, AllreduceAlgorithm::SharedMemory)?;
        let b = c.iallreduce_in_place_with(s, &mut b_out, Max, AllreduceAlgorithm::SharedMemory)?;
        c.allreduce_in_place_with(&mut between, Max, AllreduceAlgorithm::SharedMemory)?;
        let e = c.iallreduce_in_place_with(s, &mut d, Prod, AllreduceAlgorithm::SharedMemory)?;
        e.wait()?;
        b.wait()?;
        a.wait()
    })
    .expect("shared-memory allreduces in flight");
    let ranks = || 0..n;
    assert!(
        a_out.iter().enumerate().all(|(i, &x)| x == ranks().map(|r| (i % 1000 + r) as i64).sum::<i64>()),
        "in-flight shared-memory allreduce (i64 sum)"
    );
    assert!(
        b_out.iter().enumerate().all(|(i, &x)| x == ranks().map(|r| ((i + 3 * r) % 100) as f64).fold(0.0, f64::max)),
        "in-flight shared-memory allreduce (f64 max, in place)"
    );
    assert!(between.iter().all(|&x| x as usize == n - 1), "blocking shared-memory allreduce among them");
    let prod: u32 = ranks().map(|r| r as u32 + 1).product();
    assert!(d.iter().all(|&x| x == prod), "in-flight shared-memory allreduce (u32 prod)");
}

/// On one node, a non-blocking `Auto` allreduce issued before any blocking one has made the
/// shared-memory window must not make it (that is collective, and would block the call): rank 0
/// issues it and then enters a barrier on another communicator, which the others enter before
/// issuing theirs, a legal order that deadlocks if the call blocks. A blocking one then makes
/// the window, and the non-blocking ones after it use it.
fn auto_nonblocking_before_the_window(c: &MpiCommunicator) {
    let (me, n) = (c.rank(), c.size());
    if n < 2 || !c.topology().shape().single_node() {
        return;
    }
    let mut d = c.dup().expect("dup");
    d.set_tuning(Tuning::default().with_shared_memory_allreduce_bytes(0));
    let send: Vec<f32> = (0..20_000).map(|i| (i % 7 + me) as f32).collect();
    let expect: Vec<f32> = (0..20_000).map(|i| (0..n).map(|r| (i % 7 + r) as f32).sum()).collect();
    assert_eq!(d.allreduce_choice::<f32, Sum>(send.len()), AllreduceAlgorithm::SharedMemory);
    for round in 0..3 {
        let mut out = vec![0.0f32; send.len()];
        scope(|s| {
            if round == 1 {
                d.allreduce(&send, &mut out, Sum)?;
                return Ok(());
            }
            if me == 0 {
                let r = d.iallreduce(s, &send, &mut out, Sum)?;
                c.barrier()?;
                r.wait()
            } else {
                c.barrier()?;
                d.iallreduce(s, &send, &mut out, Sum)?.wait()
            }
        })
        .unwrap_or_else(|e| panic!("Auto allreduce, round {round}: {e}"));
        assert_eq!(out, expect, "Auto allreduce, round {round}");
    }
}

/// A started operation completes while the caller sleeps: the proxy thread drives it.
fn progresses_without_polling(c: &MpiCommunicator) {
    let n = c.size();
    let send = vec![1.0f64; 5000];
    let mut recv = vec![0.0f64; 5000];
    scope(|s| {
        let r = c.iallreduce_with(s, &send, &mut recv, Sum, AllreduceAlgorithm::Ring)?;
        assert!(comes_surely(|| r.is_complete()), "the operation did not progress without the caller");
        r.wait()
    })
    .expect("progress without polling");
    assert!(recv.iter().all(|&x| x == n as f64));
}

fn test_polls_to_completion(c: &MpiCommunicator) {
    let mut buf = vec![c.rank() as u16; 100];
    scope(|s| {
        let mut r = c.iallreduce_in_place(s, &mut buf, Max)?;
        while !r.test()? {
            std::hint::spin_loop();
        }
        assert!(r.test()?, "test stays true after completion");
        Ok::<(), Error>(())
    })
    .expect("test loop");
    assert!(buf.iter().all(|&x| x as usize == c.size() - 1));
}

/// After the last communicator is gone, so is the progress thread.
pub fn after_drop() {
    assert!(!progress_thread_running(), "the progress thread outlived every communicator");
}

/// Dup and split (the node-local rank and size are checked against the hostnames in
/// `topology.rs`, which calls this).
pub fn topology(c: &MpiCommunicator) {
    let (me, n) = (c.rank(), c.size());
    let d = c.dup().expect("dup");
    assert_eq!((d.rank(), d.size()), (me, n));
    assert_eq!(d.tuning(), c.tuning());
    let mut x = [1u32];
    d.allreduce_in_place(&mut x, Sum).expect("allreduce on dup");
    assert_eq!(x[0] as usize, n);

    let half = c.split(Some((me % 2) as u32), -(me as i32)).expect("split").expect("member");
    let size = (n + 1 - me % 2) / 2;
    assert_eq!(half.size(), size);
    assert_eq!(half.rank(), size - 1 - me / 2, "key orders ranks in reverse");
    let mut y = [me as u64];
    half.allreduce_in_place(&mut y, Sum).expect("allreduce on split");
    assert_eq!(y[0], (0..n).filter(|r| r % 2 == me % 2).map(|r| r as u64).sum::<u64>());

    let none = c.split(if me == 0 { None } else { Some(0) }, 0).expect("split with undefined");
    assert_eq!(none.is_none(), me == 0);
    if let Some(rest) = none {
        assert_eq!(rest.size(), n - 1);
    }
}

/// Two communicators used from two threads at once; a communicator moved to another thread.
pub fn threads(c: &MpiCommunicator) {
    let n = c.size();
    let a = c.dup().expect("dup a");
    let b = c.dup().expect("dup b");
    let ta = std::thread::spawn(move || {
        let _case = enter("allreduce in place on a dup, 200 times");
        for i in 0..200u64 {
            let mut x = vec![i; 64];
            a.allreduce_in_place(&mut x, Sum).expect("thread a");
            assert!(x.iter().all(|&v| v == i * n as u64));
        }
        a
    });
    let tb = std::thread::spawn(move || {
        let _case = enter("ibcast and iallreduce on another dup, 200 times");
        for i in 0..200u32 {
            let mut x = vec![if b.rank() == 0 { i } else { 0 }; 300];
            let z = vec![b.rank() as u32; 300];
            let mut y = poison::<u32>(300);
            scope(|s| {
                let r = b.ibcast(s, &mut x, 0)?;
                let q = b.iallreduce(s, &z, &mut y, Max)?;
                Request::wait_all([r, q])
            })
            .expect("thread b");
            assert!(x.iter().all(|&v| v == i));
            assert!(y.iter().all(|&v| v as usize == n - 1));
        }
    });
    let a = ta.join().expect("thread a panicked");
    tb.join().expect("thread b panicked");
    // `a` came back from the other thread and still works here.
    a.barrier().expect("moved communicator");
}
