//! Every input error, on a live multi-rank run: the typed error on the calling rank (all ranks
//! make the same mistake, so none is left waiting), and then a valid operation on the same
//! communicator still works (nothing was sent).

use duralumin::*;

fn still_works(c: &MpiCommunicator, after: &str) {
    let mut x = [c.rank() as u64, 1];
    c.allreduce_in_place(&mut x, Sum).unwrap_or_else(|e| panic!("after {after}: {e}"));
    let n = c.size() as u64;
    assert_eq!(x, [n * (n - 1) / 2, n], "after {after}");
}

macro_rules! expect_err {
    ($c:expr, $call:expr, $pat:pat) => {{
        let what = stringify!($call);
        let _case = crate::mpirun::rank_case::enter(what);
        match $call {
            Err(e @ $pat) => {
                let _ = e.to_string();
            }
            other => panic!("{what}: expected {}, got {other:?}", stringify!($pat)),
        }
        still_works($c, what);
    }};
}

pub fn run(c: &MpiCommunicator) {
    let (me, n) = (c.rank(), c.size());
    let a = vec![1.0f32; 4];
    let mut b = vec![0.0f32; 5];

    expect_err!(c, c.allreduce(&a, &mut b, Sum), Error::BufferLength { expected: 4, actual: 5, .. });
    expect_err!(c, scope(|s| c.iallreduce(s, &a, &mut b, Max).map(|_| ())), Error::BufferLength { .. });
    expect_err!(c, c.reduce(&a, &mut b[..4], n, Sum), Error::RankOutOfRange { rank: _, .. });
    expect_err!(c, c.reduce_in_place(&mut b, n + 3, Min), Error::RankOutOfRange { .. });
    expect_err!(c, c.bcast(&mut b, n), Error::RankOutOfRange { .. });
    expect_err!(c, c.gather(&a, &mut b, n), Error::RankOutOfRange { .. });
    expect_err!(c, c.scatterv(&a, &[], &[], &mut b, n + 1), Error::RankOutOfRange { .. });
    expect_err!(c, c.allgather(&a, &mut b), Error::BufferLength { .. });
    expect_err!(c, c.alltoall(&a, &mut b), Error::BufferLength { .. });
    if n > 1 {
        let mut odd = vec![0u8; n + 1];
        expect_err!(c, c.allgather_in_place(&mut odd), Error::BufferLength { .. });
        expect_err!(c, c.alltoall_in_place(&mut odd), Error::BufferLength { .. });
        expect_err!(c, c.reduce_scatter_in_place(&mut odd, Sum), Error::BufferLength { .. });
    }
    expect_err!(c, c.reduce_scatter(&a, &mut b, Sum), Error::BufferLength { .. });

    // Per-rank vectors of the wrong size, overlapping and out-of-range blocks, overflow.
    let ones = vec![1usize; n];
    let short = vec![1usize; n - 1];
    let packed: Vec<usize> = (0..n).collect();
    let mut recv = vec![0u32; 2 * n];
    let mine = [me as u32];
    expect_err!(c, c.allgatherv(&mine, &mut recv, &short, &packed), Error::VectorLength { .. });
    expect_err!(c, c.allgatherv(&mine, &mut recv, &ones, &short), Error::VectorLength { .. });
    expect_err!(c, c.reduce_scatterv(&mine, &mut recv[..1], &short, Sum), Error::VectorLength { .. });
    let beyond: Vec<usize> = (0..n).map(|i| i + 2 * n).collect();
    expect_err!(c, c.allgatherv(&mine, &mut recv, &ones, &beyond), Error::DisplacementOutOfRange { .. });
    if n > 1 {
        let overlapping = vec![0usize; n];
        expect_err!(c, c.allgatherv(&mine, &mut recv, &ones, &overlapping), Error::DisplacementOverlap { .. });
        let mut counts = ones.clone();
        counts[0] = usize::MAX;
        let displs = vec![1usize; n];
        expect_err!(c, c.alltoallv(&mine, &counts, &displs, &mut recv, &ones, &packed), Error::CountOverflow { .. });
        let mut huge = ones.clone();
        huge[1] = usize::MAX;
        expect_err!(c, c.reduce_scatterv(&mine, &mut recv[..1], &huge, Sum), Error::CountOverflow { .. });
    }
    expect_err!(c, c.allgatherv(&[1u32, 2], &mut recv, &ones, &packed), Error::BufferLength { .. });
    let mut wrong_self = ones.clone();
    wrong_self[me] = 0;
    expect_err!(
        c,
        c.alltoallv(&recv.clone(), &ones, &packed, &mut recv, &wrong_self, &packed),
        Error::BufferLength { .. }
    );

    // Point-to-point: peers, self, tags.
    expect_err!(c, c.send(&a, n, 0), Error::RankOutOfRange { .. });
    expect_err!(c, c.recv(&mut b, n + 7, 0), Error::RankOutOfRange { .. });
    expect_err!(c, c.send(&a, me, 0), Error::SelfMessage { .. });
    expect_err!(c, c.recv(&mut b, me, 0), Error::SelfMessage { .. });
    expect_err!(c, c.sendrecv(&a, (me + 1) % n, &mut b, n, 0), Error::RankOutOfRange { .. });
    expect_err!(c, c.sendrecv(&a, me, &mut b[..4], me, -1), Error::InvalidTag { .. });
    let max = c.max_tag();
    if max < i32::MAX {
        expect_err!(c, c.sendrecv(&a, me, &mut b[..4], me, max + 1), Error::InvalidTag { .. });
    }
    expect_err!(c, c.multi_sendrecv(&[(&a[..], n)], &mut [], 0), Error::RankOutOfRange { .. });

    // Overlapping send blocks are fine (MPI reads the same data twice).
    if n > 1 {
        let src: Vec<u16> = (0..4).collect();
        let counts = vec![2usize; n];
        let displs = vec![1usize; n];
        let mut got = [0u16; 2];
        c.scatterv(&src, &counts, &displs, &mut got, 0).expect("overlapping send blocks");
        assert_eq!(got, [1, 2]);
    }
}
