//! Point-to-point: send/recv, sendrecv, in-place sendrecv, multi-sendrecv, count mismatches.

use duralumin::*;

use crate::COUNTS;
use crate::backend::mpi_call;
use crate::elements::*;
use crate::mpirun::rank_case::within;

pub fn run(c: &MpiCommunicator) {
    let (me, n) = (c.rank(), c.size());
    let (right, left) = ((me + 1) % n, (me + n - 1) % n);
    for count in COUNTS {
        for nb in [false, true] {
            let what = format!("count={count} nonblocking={nb}");
            let named =
                |op: &str, t: &str| format!("{op}{}, {t}, count {count}", if nb { " non-blocking" } else { "" });
            within(named("sendrecv", "u32"), || {
                let send: Vec<u32> = (0..count).map(|i| (me * 1000 + i) as u32).collect();
                let mut recv = poison::<u32>(count);
                mpi_call!(nb, c.sendrecv / isendrecv(&send, right, &mut recv, left, 7))
                    .unwrap_or_else(|e| panic!("sendrecv {what}: {e}"));
                let expect: Vec<u32> = (0..count).map(|i| (left * 1000 + i) as u32).collect();
                assert_eq!(recv, expect, "sendrecv {what}");
            });
            within(named("sendrecv in place", "f64"), || {
                let mut buf: Vec<f64> = (0..count).map(|i| (me + i) as f64).collect();
                mpi_call!(nb, c.sendrecv_in_place / isendrecv_in_place(&mut buf, right, left, 3))
                    .unwrap_or_else(|e| panic!("sendrecv_in_place {what}: {e}"));
                assert_eq!(buf, (0..count).map(|i| (left + i) as f64).collect::<Vec<_>>(), "in place {what}");
            });
            // Pairs (0,1), (2,3), ...: blocking send/recv between distinct ranks.
            let partner = me ^ 1;
            if partner < n {
                within(named(&format!("send and recv with rank {partner}"), "i16"), || {
                    let mine: Vec<i16> = (0..count).map(|i| (me * 10 + i) as i16).collect();
                    let mut theirs = poison::<i16>(count);
                    if me % 2 == 0 {
                        mpi_call!(nb, c.send / isend(&mine, partner, 11))
                            .unwrap_or_else(|e| panic!("send {what}: {e}"));
                        mpi_call!(nb, c.recv / irecv(&mut theirs, partner, 12))
                            .unwrap_or_else(|e| panic!("recv {what}: {e}"));
                    } else {
                        mpi_call!(nb, c.recv / irecv(&mut theirs, partner, 11))
                            .unwrap_or_else(|e| panic!("recv {what}: {e}"));
                        mpi_call!(nb, c.send / isend(&mine, partner, 12))
                            .unwrap_or_else(|e| panic!("send {what}: {e}"));
                    }
                    let expect = (0..count).map(|i| (partner * 10 + i) as i16).collect::<Vec<_>>();
                    assert_eq!(theirs, expect, "pair {what}");
                });
            }
            within(named("multi_sendrecv", "Complex"), || multi(c, count, nb));
        }
    }
    within("messages to self", || self_messages(c));
    within("mismatches", || mismatches(c));
}

/// Every rank sends a distinct block to every rank (itself included) and receives from all.
fn multi(c: &MpiCommunicator, count: usize, nb: bool) {
    let (me, n) = (c.rank(), c.size());
    let outgoing: Vec<Vec<Complex>> = (0..n)
        .map(|to| (0..count + to).map(|i| Complex { re: me as f32, im: (to * 100 + i) as f32 }).collect())
        .collect();
    let sends: Vec<(&[Complex], usize)> = outgoing.iter().enumerate().map(|(to, b)| (b.as_slice(), to)).collect();
    let mut incoming: Vec<Vec<Complex>> = (0..n).map(|_| poison::<Complex>(count + me)).collect();
    let mut recvs: Vec<(&mut [Complex], usize)> =
        incoming.iter_mut().enumerate().map(|(from, b)| (b.as_mut_slice(), from)).collect();
    mpi_call!(nb, c.multi_sendrecv / imulti_sendrecv(&sends, &mut recvs, 5))
        .unwrap_or_else(|e| panic!("multi_sendrecv count={count} nb={nb}: {e}"));
    for (from, got) in incoming.iter().enumerate() {
        let expect: Vec<Complex> =
            (0..count + me).map(|i| Complex { re: from as f32, im: (me * 100 + i) as f32 }).collect();
        assert!(same(got, &expect), "multi_sendrecv from {from}: {got:?}");
    }
}

/// Messages to this rank itself work when they cannot deadlock (non-blocking, or sendrecv).
fn self_messages(c: &MpiCommunicator) {
    let me = c.rank();
    let send = [1u8, 2, 3];
    let mut recv = [0u8; 3];
    scope(|s| {
        let r = c.irecv(s, &mut recv, me, 9)?;
        let q = c.isend(s, &send, me, 9)?;
        Request::wait_all([q, r])
    })
    .expect("isend/irecv to self");
    assert_eq!(recv, send);
    let mut back = [0u8; 3];
    c.sendrecv(&send, me, &mut back, me, 9).expect("sendrecv with self");
    assert_eq!(back, send);
}

/// A receive of a different size than what was sent is an error, not undefined behaviour; and
/// an error of a request dropped unwaited surfaces from the next call.
fn mismatches(c: &MpiCommunicator) {
    let (me, n) = (c.rank(), c.size());
    if n < 2 || me > 1 {
        c.barrier().expect("barrier");
        c.barrier().expect("barrier");
        c.barrier().expect("barrier");
        return;
    }
    let peer = 1 - me;
    // Fewer elements arrive than expected.
    if me == 0 {
        c.send(&[1u64; 4], peer, 20).unwrap();
    } else {
        let mut buf = [0u64; 8];
        let e = c.recv(&mut buf, peer, 20).unwrap_err();
        assert!(matches!(e, Error::CountMismatch { expected: 8, received: 4, .. }), "short message: {e}");
    }
    c.barrier().expect("barrier");
    // More elements arrive than fit, far beyond MPI's eager size (where Open MPI would write a
    // truncated message past the buffer): refused before a byte lands.
    if me == 0 {
        c.send(&[1u64; 4096], peer, 21).unwrap();
    } else {
        let mut space = vec![7u64; 8192];
        let e = c.recv(&mut space[..4], peer, 21).unwrap_err();
        // (The sweep's tuning cuts messages into pieces of at most `max_message_elements`.)
        assert!(matches!(e, Error::CountMismatch { expected: 4, received: 5.., .. }), "long message: {e}");
        assert!(space.iter().all(|&x| x == 7), "the long message wrote into the receive buffer or past it");
    }
    c.barrier().expect("barrier");
    // The same failure in a request that is dropped without wait: reported by the next call.
    if me == 0 {
        c.send(&[1u64; 8], peer, 22).unwrap();
    } else {
        let mut buf = [0u64; 4];
        scope(|s| {
            let r = c.irecv(s, &mut buf, peer, 22).expect("irecv starts");
            drop(r);
        });
        let e = c.barrier().unwrap_err();
        assert!(matches!(e, Error::CountMismatch { expected: 4, received: 8, .. }), "deferred error: {e}");
    }
    c.barrier().expect("the communicator works after a deferred error");
}
