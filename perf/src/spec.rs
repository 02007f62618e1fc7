//! What each operation's buffers hold before a call and what they must hold after it, for the
//! check mode (`-c 1`): small integers, exact in every element type, so a result is compared
//! bit for bit; reductions are folded here with the same operator in rank order.

use duralumin::{Avg, Max, Min, Number, Prod, ReduceOp, Sum};
use num_traits::NumCast;

use crate::native::{Native, NativeCall};
use crate::ops::{Coll, Redop};

/// An element type `duralumin-perf` runs (nccl-tests' `-d` names).
pub trait PerfElem: Number + NumCast + std::fmt::Debug + PartialEq {
    /// nccl-tests' name of the type.
    const TYPE: &'static str;
    /// MPI's own operation of `s` on host vectors of this type (`window` sets, each starting
    /// from `b`, the out-of-place form's buffers), where MPI has the type.
    fn native(s: &Shape, b: &Buffers<Self>, window: usize) -> Option<Box<dyn NativeCall>>;
}

macro_rules! perf_elems {
    ($($t:ty => $name:literal),* $(,)?) => {$(
        impl PerfElem for $t {
            const TYPE: &'static str = $name;
            fn native(s: &Shape, b: &Buffers<Self>, window: usize) -> Option<Box<dyn NativeCall>> {
                crate::native::has(s.coll, s.redop)
                    .then(|| Box::new(Native::<$t>::new(s, b, window)) as Box<dyn NativeCall>)
            }
        }
    )*};
}
perf_elems!(
    i8 => "int8", u8 => "uint8", i32 => "int32", u32 => "uint32", i64 => "int64", u64 => "uint64",
    f32 => "float", f64 => "double",
);

/// The half-width floats, which MPI has no type for: no native columns.
macro_rules! half_elems {
    ($($t:ty => $name:literal),* $(,)?) => {$(
        impl PerfElem for $t {
            const TYPE: &'static str = $name;
            fn native(_: &Shape, _: &Buffers<Self>, _: usize) -> Option<Box<dyn NativeCall>> {
                None
            }
        }
    )*};
}
half_elems!(duralumin::half::f16 => "half", duralumin::half::bf16 => "bfloat16");

/// Where an operation runs: its rank count, this rank, its element count (the row's), root and
/// reduction operator.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub coll: Coll,
    pub redop: Redop,
    pub n: usize,
    pub rank: usize,
    pub count: usize,
    pub root: usize,
}

impl Shape {
    /// One rank's block (operations cut per rank).
    pub fn block(&self) -> usize {
        self.count / self.n.max(1)
    }
    pub fn next(&self) -> usize {
        (self.rank + 1) % self.n
    }
    pub fn prev(&self) -> usize {
        (self.rank + self.n - 1) % self.n
    }
    /// The pair partner of [`Coll::SendRecvPair`] and whether this rank sends; `None` idles.
    pub fn pair(&self) -> Option<(usize, bool)> {
        let partner = self.rank ^ 1;
        (partner < self.n).then_some((partner, self.rank.is_multiple_of(2)))
    }
}

/// Buffers before a call and the expected contents of the written one after it.
#[derive(Clone, Debug)]
pub struct Buffers<T> {
    pub send: Vec<T>,
    pub recv: Vec<T>,
    /// Compared with the start of `recv` after the call (`recv` may be longer: an in-place
    /// reduce-scatter leaves the rest unspecified).
    pub expect: Vec<T>,
}

fn small<T: PerfElem>(v: usize) -> T {
    <T as NumCast>::from(v).unwrap_or_else(T::zeroed)
}

/// Rank `r`'s input at global index `i`: products stay at powers of two (1 or 2), everything
/// else in 1..=61, exact in every type (bf16 included) and far from overflow.
pub fn input<T: PerfElem>(redop: Redop, r: usize, i: usize) -> T {
    match redop {
        Redop::Prod => small(1 + (r + i) % 2),
        _ => small(1 + (r * 7 + i * 3) % 61),
    }
}

fn fold<T: PerfElem, O: ReduceOp<T>>(redop: Redop, n: usize, i: usize) -> T {
    let mut acc = input::<T>(redop, 0, i);
    for r in 1..n {
        acc = O::combine(acc, input(redop, r, i));
    }
    if O::HAS_FINISH { O::finish(acc, u32::try_from(n).unwrap_or(u32::MAX)) } else { acc }
}

/// The reduction over all ranks at index `i`.
pub fn reduced<T: PerfElem>(redop: Redop, n: usize, i: usize) -> T {
    match redop {
        Redop::Sum => fold::<T, Sum>(redop, n, i),
        Redop::Prod => fold::<T, Prod>(redop, n, i),
        Redop::Min => fold::<T, Min>(redop, n, i),
        Redop::Max => fold::<T, Max>(redop, n, i),
        Redop::Avg => fold::<T, Avg>(redop, n, i),
    }
}

/// The buffers of the out-of-place form (the only form of a broadcast, the point-to-point
/// patterns and the barrier).
pub fn out_of_place<T: PerfElem>(s: &Shape) -> Buffers<T> {
    let (n, r, count, c, op) = (s.n, s.rank, s.count, s.block(), s.redop);
    let inp = |rank: usize, i: usize| input::<T>(op, rank, i);
    let zeros = |len: usize| vec![T::zeroed(); len];
    let mine = |len: usize| (0..len).map(|i| inp(r, i)).collect::<Vec<T>>();
    let own_block = || (0..c).map(|j| inp(r, r * c + j)).collect::<Vec<T>>();
    let gathered = || (0..count).map(|g| inp(g / c.max(1), g)).collect::<Vec<T>>();
    match s.coll {
        Coll::Allreduce => {
            Buffers { send: mine(count), recv: zeros(count), expect: (0..count).map(|i| reduced(op, n, i)).collect() }
        }
        Coll::Reduce => {
            let expect = if r == s.root { (0..count).map(|i| reduced(op, n, i)).collect() } else { zeros(count) };
            Buffers { send: mine(count), recv: zeros(count), expect }
        }
        Coll::Bcast => {
            let recv = if r == s.root { (0..count).map(|i| inp(s.root, i)).collect() } else { zeros(count) };
            Buffers { send: Vec::new(), recv, expect: (0..count).map(|i| inp(s.root, i)).collect() }
        }
        Coll::Allgather | Coll::Allgatherv => Buffers { send: own_block(), recv: zeros(count), expect: gathered() },
        Coll::ReduceScatter | Coll::ReduceScatterv => {
            Buffers { send: mine(count), recv: zeros(c), expect: (0..c).map(|j| reduced(op, n, r * c + j)).collect() }
        }
        Coll::Alltoall | Coll::Alltoallv => Buffers {
            send: mine(count),
            recv: zeros(count),
            expect: (0..count).map(|g| inp(g / c.max(1), r * c + g % c.max(1))).collect(),
        },
        Coll::Gather | Coll::Gatherv => {
            let expect = if r == s.root { gathered() } else { zeros(count) };
            Buffers { send: own_block(), recv: zeros(count), expect }
        }
        Coll::Scatter | Coll::Scatterv => {
            let send = if r == s.root { (0..count).map(|g| inp(s.root, g)).collect() } else { Vec::new() };
            Buffers { send, recv: zeros(c), expect: (0..c).map(|j| inp(s.root, r * c + j)).collect() }
        }
        Coll::Sendrecv => {
            Buffers { send: mine(count), recv: zeros(count), expect: (0..count).map(|i| inp(s.prev(), i)).collect() }
        }
        Coll::MultiSendrecv => {
            // Two messages each way: the first half goes to the next rank, the second to the
            // previous one; the first half of `recv` comes from the previous, the second from
            // the next.
            let from_prev = (0..count).map(|i| inp(s.prev(), i));
            let from_next = (0..count).map(|i| inp(s.next(), count + i));
            Buffers { send: mine(2 * count), recv: zeros(2 * count), expect: from_prev.chain(from_next).collect() }
        }
        Coll::SendRecvPair => match s.pair() {
            Some((_, true)) => Buffers { send: mine(count), recv: Vec::new(), expect: Vec::new() },
            Some((from, false)) => {
                Buffers { send: Vec::new(), recv: zeros(count), expect: (0..count).map(|i| inp(from, i)).collect() }
            }
            None => Buffers { send: Vec::new(), recv: Vec::new(), expect: Vec::new() },
        },
        Coll::Barrier => Buffers { send: Vec::new(), recv: Vec::new(), expect: Vec::new() },
    }
}

/// The buffer of the in-place form (in `recv`; `send` is empty), where the operation has one,
/// from the out-of-place form's buffers `oop` (its expected results are the same).
pub fn in_place<T: PerfElem>(s: &Shape, oop: &Buffers<T>) -> Option<Buffers<T>> {
    let (r, count, c, op) = (s.rank, s.count, s.block(), s.redop);
    let inp = |rank: usize, i: usize| input::<T>(op, rank, i);
    // Where the out-of-place form sends this rank's whole input, the in-place buffer is it.
    let mine = || oop.send.clone();
    let with_own_block = || (0..count).map(|g| if g / c.max(1) == r { inp(r, g) } else { T::zeroed() }).collect();
    let (recv, expect) = match s.coll {
        Coll::Allreduce | Coll::ReduceScatter | Coll::ReduceScatterv | Coll::Alltoall | Coll::Sendrecv => {
            (mine(), oop.expect.clone())
        }
        Coll::Reduce if r == s.root => (mine(), oop.expect.clone()),
        Coll::Reduce => (mine(), mine()),
        Coll::Allgather | Coll::Allgatherv => (with_own_block(), oop.expect.clone()),
        Coll::Gather | Coll::Gatherv if r == s.root => (with_own_block(), oop.expect.clone()),
        Coll::Gather | Coll::Gatherv => (oop.send.clone(), oop.send.clone()),
        Coll::Scatter | Coll::Scatterv if r == s.root => (oop.send.clone(), oop.send.clone()),
        Coll::Scatter | Coll::Scatterv => (oop.recv.clone(), oop.expect.clone()),
        _ => return None,
    };
    Some(Buffers { send: Vec::new(), recv, expect })
}

/// Elements of `got` that differ from `expect` (compared by value; `got` may be longer).
pub fn wrong<T: PerfElem>(got: &[T], expect: &[T]) -> u64 {
    let missing = expect.len().saturating_sub(got.len()) as u64;
    missing + got.iter().zip(expect).filter(|(g, e)| g != e).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(coll: Coll, redop: Redop, n: usize, rank: usize) -> Shape {
        Shape { coll, redop, n, rank, count: 12, root: 1 }
    }

    #[test]
    fn reductions_fold_every_rank_and_avg_divides() {
        let s: f32 = reduced(Redop::Sum, 3, 0);
        assert_eq!(s, (1 + 8 + 15) as f32);
        let a: i32 = reduced(Redop::Avg, 3, 0);
        assert_eq!(a, 8);
        let p: u8 = reduced(Redop::Prod, 4, 1);
        assert_eq!(p, 4);
    }

    #[test]
    fn the_expected_blocks_are_what_the_peers_send() {
        // Rank 2 of 3 in an all-to-all receives block 2 of every rank's send.
        let n = 3;
        let mine = out_of_place::<i32>(&shape(Coll::Alltoall, Redop::Sum, n, 2));
        for from in 0..n {
            let theirs = out_of_place::<i32>(&shape(Coll::Alltoall, Redop::Sum, n, from));
            assert_eq!(mine.expect[from * 4..from * 4 + 4], theirs.send[8..12]);
        }
        // In place, the gather root keeps its block and expects the others'.
        let g = shape(Coll::Gather, Redop::Sum, n, 1);
        let root = in_place::<f64>(&g, &out_of_place(&g)).unwrap();
        assert_eq!(root.recv[4..8], root.expect[4..8]);
        assert_eq!(root.recv[0], 0.0);
        let b = shape(Coll::Bcast, Redop::Sum, n, 0);
        assert!(in_place::<f32>(&b, &out_of_place(&b)).is_none());
        assert_eq!(wrong(&[1, 2, 3], &[1, 5, 3, 4]), 2);
    }
}
