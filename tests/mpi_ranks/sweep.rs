//! The sweep: every operation × blocking/non-blocking × in-place/out-of-place × every root ×
//! counts {0, 1, 7, above every threshold} × every element type × every valid operator, checked
//! bit-exactly against a sequential reference. Written once, generic over element, operator
//! and backend ([`Backend`]).

use duralumin::half::{bf16, f16};
use duralumin::*;

use crate::COUNTS;
use crate::elements::*;

use crate::backend::Backend;
use crate::case::Case;
use crate::mpirun::rank_case;

const NB: [bool; 2] = [false, true];

/// How much of the element × operator matrix a sweep covers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Breadth {
    /// Every element type with every operator it has.
    Full,
    /// Every operation, algorithm, count, root and mode, but one pair of each kind: every
    /// element size (1, 2, 4, 8 bytes and the user pairs), signed, unsigned and floating,
    /// operators MPI has natively and those it has not (`Avg`, the logical ones on floats), a
    /// bitwise one, the user pairs and the non-commutative one. For trials that vary only how
    /// the data moves (another rank count, a simulated cluster, one hardware queue, another
    /// flag path or chunk size), where every pair's own arithmetic is the full sweep's on the
    /// same backend.
    Representative,
}

/// The breadth a launch asked for: `DURALUMIN_SWEEP=representative` (the launcher sets it on
/// the trials that vary only how data moves), else [`Breadth::Full`].
pub fn breadth() -> Breadth {
    match std::env::var("DURALUMIN_SWEEP").as_deref() {
        Ok("representative") => Breadth::Representative,
        _ => Breadth::Full,
    }
}

/// Runs the sweep on `c`, named `backend` in failure messages, at the launch's [`breadth`].
pub fn run(c: &impl Backend, backend: &str) {
    run_with(c, backend, breadth());
}

/// Runs the sweep on `c` at `breadth` (never wider than the launch's).
pub fn run_with(c: &impl Backend, backend: &str, breadth: Breadth) {
    let _backend = rank_case::enter(backend);
    if breadth == Breadth::Representative || self::breadth() == Breadth::Representative {
        reductions::<i8, Sum>(c);
        reductions::<u16, BitXor>(c);
        reductions::<i32, Max>(c);
        reductions::<u64, Prod>(c);
        reductions::<f32, Sum>(c);
        reductions::<f64, Avg>(c);
        reductions::<f16, LogicalOr>(c);
        reductions::<bf16, Min>(c);
        movement::<u8>(c);
        movement::<f64>(c);
        user_pairs(c);
        point_to_point(c);
        return;
    }
    macro_rules! numeric {
        ($($t:ty),*) => {$(
            reductions::<$t, Sum>(c);
            reductions::<$t, Prod>(c);
            reductions::<$t, Min>(c);
            reductions::<$t, Max>(c);
            reductions::<$t, LogicalAnd>(c);
            reductions::<$t, LogicalOr>(c);
            reductions::<$t, LogicalXor>(c);
            reductions::<$t, Avg>(c);
            movement::<$t>(c);
        )*};
    }
    macro_rules! integer {
        ($($t:ty),*) => {$(
            reductions::<$t, BitAnd>(c);
            reductions::<$t, BitOr>(c);
            reductions::<$t, BitXor>(c);
        )*};
    }
    numeric!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64, f16, bf16);
    integer!(i8, i16, i32, i64, u8, u16, u32, u64);
    user_pairs(c);
    point_to_point(c);
}

/// Point-to-point around the ring, blocking and not: send/recv (even ranks send first),
/// sendrecv, sendrecv in place, and multi_sendrecv to both neighbours. On one rank, messages
/// to itself: a sendrecv and a multi_sendrecv.
pub fn point_to_point(c: &impl Backend) {
    let (me, n) = (c.rank(), c.size());
    let (next, prev) = ((me + 1) % n, (me + n - 1) % n);
    let mine = |r: usize| vec![r as u32 * 10 + 1; 5];
    for nb in NB {
        let _case = Case::movement::<u32>("point-to-point around the ring", 5, nb, false).enter();
        let mut got = vec![0u32; 5];
        if n > 1 && me % 2 == 0 {
            c.send(nb, &mine(me), next, 1).expect("send");
            c.recv(nb, &mut got, prev, 1).expect("recv");
        } else if n > 1 {
            c.recv(nb, &mut got, prev, 1).expect("recv");
            c.send(nb, &mine(me), next, 1).expect("send");
        } else {
            c.sendrecv(nb, &mine(me), next, &mut got, prev, 1).expect("sendrecv to itself");
        }
        assert_eq!(got, mine(prev), "send/recv around the ring");
        let mut got = vec![0u32; 5];
        c.sendrecv(nb, &mine(me), next, &mut got, prev, 2).expect("sendrecv");
        assert_eq!(got, mine(prev), "sendrecv");
        let mut buf = mine(me);
        c.sendrecv_in_place(nb, &mut buf, next, prev, 3).expect("sendrecv in place");
        assert_eq!(buf, mine(prev), "sendrecv in place");
        let (sent, mut from_prev, mut from_next) = (mine(me), vec![0u32; 5], vec![0u32; 5]);
        let sends = [(&sent[..], next), (&sent[..], prev)];
        let mut recvs = [(&mut from_prev[..], prev), (&mut from_next[..], next)];
        c.multi_sendrecv(nb, &sends, &mut recvs, 4).expect("multi_sendrecv");
        assert_eq!((from_prev, from_next), (mine(prev), mine(next)), "multi_sendrecv");
    }
}

/// The user pairs: moved, and reduced where the backend runs them (else refused by name).
fn user_pairs(c: &impl Backend) {
    movement::<MinLoc>(c);
    movement::<Complex>(c);
    if c.runs_user_pairs() {
        reductions::<MinLoc, ArgMin>(c);
        reductions::<Complex, Sum>(c);
        non_commutative(c);
    } else {
        user_pairs_refused::<MinLoc, ArgMin>(c);
        user_pairs_refused::<Affine, Compose>(c);
    }
}

/// A user pair without device kernels is refused by name, with nothing changed.
fn user_pairs_refused<T: TestElem, O: ReduceOp<T>>(c: &impl Backend) {
    let _case = Case::reduction::<T, O>("allreduce refusal (no device kernels)", 7, false, true).enter();
    let mut buf = input::<T, O>(c.rank(), 7);
    let e = c.allreduce_in_place(false, &mut buf, O::default()).unwrap_err();
    assert!(matches!(&e, Error::KernelsUnavailable(m) if m.contains(T::NAME) && m.contains(O::NAME)), "{e}");
    assert!(same(&buf, &input::<T, O>(c.rank(), 7)), "refused call changed the buffer");
}

pub fn reductions<T: TestElem, O: ReduceOp<T>>(c: &impl Backend) {
    // Non-commutative operators: only the algorithms that keep rank order.
    let algorithms: Vec<_> =
        c.allreduce_algorithms().iter().copied().filter(|&a| O::COMMUTATIVE || keeps_rank_order(a)).collect();
    for count in COUNTS {
        for nb in NB {
            for in_place in [false, true] {
                for &algorithm in &algorithms {
                    allreduce::<T, O>(c, count, nb, in_place, algorithm);
                }
                for root in 0..c.size() {
                    reduce::<T, O>(c, count, nb, in_place, root);
                }
                reduce_scatter::<T, O>(c, count, nb, in_place);
                reduce_scatterv::<T, O>(c, count, nb, in_place);
            }
        }
    }
}

fn allreduce<T: TestElem, O: ReduceOp<T>>(
    c: &impl Backend,
    count: usize,
    nb: bool,
    in_place: bool,
    algorithm: AllreduceAlgorithm,
) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::reduction::<T, O>("allreduce", count, nb, in_place).algorithm(algorithm).enter();
    let send = input::<T, O>(me, count);
    let expect: Vec<T> = (0..count).map(|i| reduced::<T, O>(0..n, n, i)).collect();
    if in_place {
        let mut buf = send.clone();
        // `Auto` blocking through the plain method, every other call through `_with`: both
        // are swept, `Auto` named explicitly too.
        case.ok(match algorithm {
            AllreduceAlgorithm::Auto if !nb => c.allreduce_in_place(nb, &mut buf, O::default()),
            a => c.allreduce_in_place_with(nb, &mut buf, O::default(), a),
        });
        case.check(&buf, &expect);
    } else {
        let mut recv = poison::<T>(count);
        case.ok(match algorithm {
            AllreduceAlgorithm::Auto if !nb => c.allreduce(nb, &send, &mut recv, O::default()),
            a => c.allreduce_with(nb, &send, &mut recv, O::default(), a),
        });
        case.check(&recv, &expect);
        case.unchanged(&send, &input::<T, O>(me, count));
    }
}

fn reduce<T: TestElem, O: ReduceOp<T>>(c: &impl Backend, count: usize, nb: bool, in_place: bool, root: usize) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::reduction::<T, O>("reduce", count, nb, in_place).root(root).enter();
    let send = input::<T, O>(me, count);
    let expect: Vec<T> = (0..count).map(|i| reduced::<T, O>(0..n, n, i)).collect();
    if in_place {
        let mut buf = send.clone();
        case.ok(c.reduce_in_place(nb, &mut buf, root, O::default()));
        let want = if me == root { &expect } else { &send };
        case.check(&buf, want);
    } else {
        let mut recv = if me == root { poison::<T>(count) } else { Vec::new() };
        case.ok(c.reduce(nb, &send, &mut recv, root, O::default()));
        if me == root {
            case.check(&recv, &expect);
        }
        case.unchanged(&send, &input::<T, O>(me, count));
    }
}

fn reduce_scatter<T: TestElem, O: ReduceOp<T>>(c: &impl Backend, count: usize, nb: bool, in_place: bool) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::reduction::<T, O>("reduce_scatter", count, nb, in_place).enter();
    let send = input::<T, O>(me, n * count);
    let expect: Vec<T> = (0..count).map(|j| reduced::<T, O>(0..n, n, me * count + j)).collect();
    if in_place {
        let mut buf = send.clone();
        case.ok(c.reduce_scatter_in_place(nb, &mut buf, O::default()));
        case.check(&buf[..count], &expect);
    } else {
        let mut recv = poison::<T>(count);
        case.ok(c.reduce_scatter(nb, &send, &mut recv, O::default()));
        case.check(&recv, &expect);
    }
}

/// Uneven per-rank counts around `count`, with zeros among them when `count` is 0.
pub fn vcounts(count: usize, n: usize) -> Vec<usize> {
    (0..n).map(|r| count + r % 3).collect()
}

/// Displacements that place blocks in reverse rank order with a one-element gap after each;
/// returns them with the buffer length.
pub fn gapped_displs(counts: &[usize]) -> (Vec<usize>, usize) {
    let mut displs = vec![0; counts.len()];
    let mut pos = 0;
    for r in (0..counts.len()).rev() {
        displs[r] = pos;
        pos += counts[r] + 1;
    }
    (displs, pos)
}

fn packed(counts: &[usize]) -> Vec<usize> {
    counts.iter().scan(0, |a, &c| Some(std::mem::replace(a, *a + c))).collect()
}

fn reduce_scatterv<T: TestElem, O: ReduceOp<T>>(c: &impl Backend, count: usize, nb: bool, in_place: bool) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::reduction::<T, O>("reduce_scatterv", count, nb, in_place).enter();
    let counts = vcounts(count, n);
    let displs = packed(&counts);
    let total: usize = counts.iter().sum();
    let send = input::<T, O>(me, total);
    let expect: Vec<T> = (0..counts[me]).map(|j| reduced::<T, O>(0..n, n, displs[me] + j)).collect();
    if in_place {
        let mut buf = send.clone();
        case.ok(c.reduce_scatterv_in_place(nb, &mut buf, &counts, O::default()));
        case.check(&buf[..counts[me]], &expect);
    } else {
        let mut recv = poison::<T>(counts[me]);
        case.ok(c.reduce_scatterv(nb, &send, &mut recv, &counts, O::default()));
        case.check(&recv, &expect);
    }
}

/// Element `i` of rank `r`'s data in the data-movement collectives.
fn v<T: TestElem>(r: usize, i: usize) -> T {
    T::make(((r * 3 + i * 5 + r * i) % 7) as u8, r)
}

fn data<T: TestElem>(r: usize, start: usize, len: usize) -> Vec<T> {
    (start..start + len).map(|i| v::<T>(r, i)).collect()
}

pub fn movement<T: TestElem>(c: &impl Backend) {
    let n = c.size();
    for count in COUNTS {
        for nb in NB {
            for root in 0..n {
                for &algorithm in c.bcast_algorithms() {
                    bcast::<T>(c, count, nb, root, algorithm);
                }
            }
            for in_place in [false, true] {
                allgather::<T>(c, count, nb, in_place);
                allgatherv::<T>(c, count, nb, in_place);
                alltoall::<T>(c, count, nb, in_place);
                for root in 0..n {
                    gather::<T>(c, count, nb, in_place, root);
                    gatherv::<T>(c, count, nb, in_place, root);
                    scatter::<T>(c, count, nb, in_place, root);
                    scatterv::<T>(c, count, nb, in_place, root);
                }
            }
            alltoallv::<T>(c, count, nb);
        }
    }
}

fn bcast<T: TestElem>(c: &impl Backend, count: usize, nb: bool, root: usize, algorithm: BcastAlgorithm) {
    let case = Case::movement::<T>("bcast", count, nb, false).root(root).algorithm(algorithm).enter();
    let expect = data::<T>(root, 0, count);
    let mut buf = if c.rank() == root { expect.clone() } else { poison::<T>(count) };
    case.ok(match algorithm {
        BcastAlgorithm::Auto if !nb => c.bcast(nb, &mut buf, root),
        a => c.bcast_with(nb, &mut buf, root, a),
    });
    case.check(&buf, &expect);
}

fn allgather<T: TestElem>(c: &impl Backend, count: usize, nb: bool, in_place: bool) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("allgather", count, nb, in_place).enter();
    let expect: Vec<T> = (0..n).flat_map(|r| data::<T>(r, 0, count)).collect();
    let mine = data::<T>(me, 0, count);
    let mut recv = poison::<T>(n * count);
    if in_place {
        recv[me * count..(me + 1) * count].copy_from_slice(&mine);
        case.ok(c.allgather_in_place(nb, &mut recv));
    } else {
        case.ok(c.allgather(nb, &mine, &mut recv));
    }
    case.check(&recv, &expect);
}

fn allgatherv<T: TestElem>(c: &impl Backend, count: usize, nb: bool, in_place: bool) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("allgatherv", count, nb, in_place).enter();
    let counts = vcounts(count, n);
    let (displs, len) = gapped_displs(&counts);
    let mut expect = poison::<T>(len);
    for r in 0..n {
        expect[displs[r]..displs[r] + counts[r]].copy_from_slice(&data::<T>(r, 0, counts[r]));
    }
    let mine = data::<T>(me, 0, counts[me]);
    let mut recv = poison::<T>(len);
    case.ok(if in_place {
        recv[displs[me]..displs[me] + counts[me]].copy_from_slice(&mine);
        c.allgatherv_in_place(nb, &mut recv, &counts, &displs)
    } else {
        c.allgatherv(nb, &mine, &mut recv, &counts, &displs)
    });
    case.check(&recv, &expect);
}

fn alltoall<T: TestElem>(c: &impl Backend, count: usize, nb: bool, in_place: bool) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("alltoall", count, nb, in_place).enter();
    let send = data::<T>(me, 0, n * count);
    let expect: Vec<T> = (0..n).flat_map(|r| data::<T>(r, me * count, count)).collect();
    let mut recv = if in_place { send.clone() } else { poison::<T>(n * count) };
    case.ok(if in_place { c.alltoall_in_place(nb, &mut recv) } else { c.alltoall(nb, &send, &mut recv) });
    case.check(&recv, &expect);
}

fn alltoallv<T: TestElem>(c: &impl Backend, count: usize, nb: bool) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("alltoallv", count, nb, false).enter();
    let stride = 1000;
    let send_counts: Vec<usize> = (0..n).map(|j| count + (me + j) % 2).collect();
    let recv_counts: Vec<usize> = (0..n).map(|i| count + (i + me) % 2).collect();
    let send_displs = packed(&send_counts);
    let (recv_displs, len) = gapped_displs(&recv_counts);
    let send: Vec<T> = (0..n).flat_map(|j| data::<T>(me, j * stride, send_counts[j])).collect();
    let mut expect = poison::<T>(len);
    for i in 0..n {
        expect[recv_displs[i]..recv_displs[i] + recv_counts[i]].copy_from_slice(&data::<T>(
            i,
            me * stride,
            recv_counts[i],
        ));
    }
    let mut recv = poison::<T>(len);
    case.ok(c.alltoallv(nb, &send, &send_counts, &send_displs, &mut recv, &recv_counts, &recv_displs));
    case.check(&recv, &expect);
}

fn gather<T: TestElem>(c: &impl Backend, count: usize, nb: bool, in_place: bool, root: usize) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("gather", count, nb, in_place).root(root).enter();
    let mine = data::<T>(me, 0, count);
    let expect: Vec<T> = (0..n).flat_map(|r| data::<T>(r, 0, count)).collect();
    let is_root = me == root;
    if in_place {
        let mut buf = if is_root { poison::<T>(n * count) } else { mine.clone() };
        if is_root {
            buf[me * count..(me + 1) * count].copy_from_slice(&mine);
        }
        case.ok(c.gather_in_place(nb, &mut buf, root));
        let want = if is_root { &expect } else { &mine };
        case.check(&buf, want);
    } else {
        let mut recv = if is_root { poison::<T>(n * count) } else { Vec::new() };
        case.ok(c.gather(nb, &mine, &mut recv, root));
        if is_root {
            case.check(&recv, &expect);
        }
    }
}

fn gatherv<T: TestElem>(c: &impl Backend, count: usize, nb: bool, in_place: bool, root: usize) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("gatherv", count, nb, in_place).root(root).enter();
    let counts = vcounts(count, n);
    let (displs, len) = gapped_displs(&counts);
    let mine = data::<T>(me, 0, counts[me]);
    let mut expect = poison::<T>(len);
    for r in 0..n {
        expect[displs[r]..displs[r] + counts[r]].copy_from_slice(&data::<T>(r, 0, counts[r]));
    }
    let is_root = me == root;
    // Non-roots pass no counts: they are significant at the root only.
    let (rc, rd): (&[usize], &[usize]) = if is_root { (&counts, &displs) } else { (&[], &[]) };
    if in_place {
        let mut buf = if is_root { poison::<T>(len) } else { mine.clone() };
        if is_root {
            buf[displs[me]..displs[me] + counts[me]].copy_from_slice(&mine);
        }
        case.ok(c.gatherv_in_place(nb, &mut buf, rc, rd, root));
        let want = if is_root { &expect } else { &mine };
        case.check(&buf, want);
    } else {
        let mut recv = if is_root { poison::<T>(len) } else { Vec::new() };
        case.ok(c.gatherv(nb, &mine, &mut recv, rc, rd, root));
        if is_root {
            case.check(&recv, &expect);
        }
    }
}

fn scatter<T: TestElem>(c: &impl Backend, count: usize, nb: bool, in_place: bool, root: usize) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("scatter", count, nb, in_place).root(root).enter();
    let all = data::<T>(root, 0, n * count);
    let expect = all[me * count..(me + 1) * count].to_vec();
    let is_root = me == root;
    if in_place {
        let mut buf = if is_root { all.clone() } else { poison::<T>(count) };
        case.ok(c.scatter_in_place(nb, &mut buf, root));
        let want = if is_root { &all } else { &expect };
        case.check(&buf, want);
    } else {
        let send = if is_root { all.clone() } else { Vec::new() };
        let mut recv = poison::<T>(count);
        case.ok(c.scatter(nb, &send, &mut recv, root));
        case.check(&recv, &expect);
    }
}

fn scatterv<T: TestElem>(c: &impl Backend, count: usize, nb: bool, in_place: bool, root: usize) {
    let (me, n) = (c.rank(), c.size());
    let case = Case::movement::<T>("scatterv", count, nb, in_place).root(root).enter();
    let counts = vcounts(count, n);
    let (displs, len) = gapped_displs(&counts);
    let all = data::<T>(root, 0, len);
    let expect = all[displs[me]..displs[me] + counts[me]].to_vec();
    let is_root = me == root;
    let (rc, rd): (&[usize], &[usize]) = if is_root { (&counts, &displs) } else { (&[], &[]) };
    if in_place {
        let mut buf = if is_root { all.clone() } else { poison::<T>(counts[me]) };
        case.ok(c.scatterv_in_place(nb, &mut buf, rc, rd, root));
        let want = if is_root { &all } else { &expect };
        case.check(&buf, want);
    } else {
        let send = if is_root { all.clone() } else { Vec::new() };
        let mut recv = poison::<T>(counts[me]);
        case.ok(c.scatterv(nb, &send, rc, rd, &mut recv, root));
        case.check(&recv, &expect);
    }
}

/// The allreduce algorithms that combine in rank order, so take non-commutative operators.
fn keeps_rank_order(a: AllreduceAlgorithm) -> bool {
    matches!(a, AllreduceAlgorithm::Auto | AllreduceAlgorithm::Native | AllreduceAlgorithm::SharedMemory)
}

/// A non-commutative user operator: MPI must combine in rank order; the algorithms that
/// reorder refuse it with a typed error.
pub fn non_commutative(c: &impl Backend) {
    reductions::<Affine, Compose>(c);
    let mut buf = input::<Affine, Compose>(c.rank(), 7);
    for &algorithm in c.allreduce_algorithms().iter().filter(|&&a| !keeps_rank_order(a)) {
        let _case =
            Case::reduction::<Affine, Compose>("allreduce refusal", 7, false, true).algorithm(algorithm).enter();
        let e = c.allreduce_in_place_with(false, &mut buf, Compose, algorithm).unwrap_err();
        assert!(matches!(e, Error::AlgorithmUnsupported { .. }), "{algorithm:?}: {e}");
    }
    assert!(same(&buf, &input::<Affine, Compose>(c.rank(), 7)), "refused call changed the buffer");
}
