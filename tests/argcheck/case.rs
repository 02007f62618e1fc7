//! The cases: a collective with every rank's arguments (every rank draws the same case, so each
//! knows what all the others pass), built valid and then maybe spoiled on one rank or on all;
//! a model of the library's argument checks; and the sequential reference of a valid case.

use proptest::prelude::*;
use proptest::sample::select;

/// The operations under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Allreduce,
    AllreduceInPlace,
    Bcast,
    Reduce,
    Allgather,
    Allgatherv,
    Alltoall,
    Alltoallv,
    Gather,
    Gatherv,
    Scatter,
    Scatterv,
    ReduceScatter,
    ReduceScatterv,
    SendRecv,
}

pub const OPS: [Op; 15] = [
    Op::Allreduce,
    Op::AllreduceInPlace,
    Op::Bcast,
    Op::Reduce,
    Op::Allgather,
    Op::Allgatherv,
    Op::Alltoall,
    Op::Alltoallv,
    Op::Gather,
    Op::Gatherv,
    Op::Scatter,
    Op::Scatterv,
    Op::ReduceScatter,
    Op::ReduceScatterv,
    Op::SendRecv,
];

impl Op {
    /// Whether the signature check covers it (point-to-point is not a collective).
    pub fn collective(self) -> bool {
        self != Op::SendRecv
    }
}

/// One rank's arguments. `root` is the root of rooted collectives and the destination of the
/// sendrecv; `counts`/`displs` are the per-rank vectors (the send side of the alltoallv),
/// `counts2`/`displs2` the alltoallv's receive side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    pub send_len: usize,
    pub recv_len: usize,
    pub root: usize,
    pub source: usize,
    pub tag: i32,
    pub counts: Vec<usize>,
    pub displs: Vec<usize>,
    pub counts2: Vec<usize>,
    pub displs2: Vec<usize>,
}

/// How a case spoils the arguments it was built with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spoil {
    SendLonger,
    SendShorter,
    RecvLonger,
    RecvShorter,
    RootOutOfRange,
    OtherRoot,
    CountsLonger,
    CountsShorter,
    DisplsLonger,
    DisplsShorter,
    CountUp,
    DisplUp,
    DisplOverlap,
    HugeCount,
    HugeDispl,
    /// Another count, with buffers to match: valid on the rank, but not what the others pass.
    OtherCount,
    BadTag,
    PeerOutOfRange,
}

impl Op {
    /// The spoilings that touch an argument the operation has.
    fn spoils(self) -> &'static [Spoil] {
        use Spoil::*;
        match self {
            Op::Allreduce | Op::Allgather | Op::Alltoall | Op::ReduceScatter => {
                &[SendLonger, SendShorter, RecvLonger, RecvShorter, OtherCount]
            }
            Op::AllreduceInPlace => &[RecvLonger, RecvShorter, OtherCount],
            Op::Bcast => &[RecvLonger, RecvShorter, RootOutOfRange, OtherRoot, OtherCount],
            Op::Reduce | Op::Gather | Op::Scatter => {
                &[SendLonger, SendShorter, RecvLonger, RecvShorter, RootOutOfRange, OtherRoot, OtherCount]
            }
            Op::ReduceScatterv => &[
                SendLonger,
                SendShorter,
                RecvLonger,
                RecvShorter,
                CountsLonger,
                CountsShorter,
                CountUp,
                HugeCount,
                OtherCount,
            ],
            Op::Allgatherv | Op::Alltoallv => &[
                SendLonger,
                SendShorter,
                RecvLonger,
                RecvShorter,
                CountsLonger,
                CountsShorter,
                DisplsLonger,
                DisplsShorter,
                CountUp,
                DisplUp,
                DisplOverlap,
                HugeCount,
                HugeDispl,
                OtherCount,
            ],
            Op::Gatherv | Op::Scatterv => &[
                SendLonger,
                SendShorter,
                RecvLonger,
                RecvShorter,
                RootOutOfRange,
                OtherRoot,
                CountsLonger,
                CountsShorter,
                DisplsLonger,
                DisplsShorter,
                CountUp,
                DisplUp,
                DisplOverlap,
                HugeCount,
                HugeDispl,
                OtherCount,
            ],
            Op::SendRecv => &[BadTag, PeerOutOfRange, RootOutOfRange],
        }
    }
}

/// A spoiling: what (one of the operation's [`Op::spoils`]), on which rank (or all), by
/// how much, at which entry, on which side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mutation {
    pub spoil: Spoil,
    pub rank: usize,
    pub everywhere: bool,
    pub delta: usize,
    pub entry: usize,
    /// The alltoallv's receive vectors rather than its send vectors.
    pub recv_side: bool,
}

/// The backend a case runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Mpi,
    HostTransfer,
    /// NCCL on a CUDA device (cudasim's, with ncclsim), where the run has one; HostTransfer
    /// otherwise (`DURALUMIN_ARGCHECK_NCCL` says which, the same on every rank).
    Nccl,
}

#[derive(Clone, Debug)]
pub struct Case {
    pub op: Op,
    pub backend: Backend,
    /// Whether the signature check is on. Drawn, and forced on where a spoiled argument would
    /// otherwise leave ranks waiting (some ranks refuse their arguments and others do not, or
    /// all accept arguments that do not match).
    pub check: bool,
    /// The non-blocking form (a request and its wait) rather than the blocking or
    /// stream-ordered one.
    pub nonblocking: bool,
    pub n: usize,
    /// Tells one case's data from another's.
    pub id: u64,
    pub args: Vec<Args>,
    pub mutation: Option<Mutation>,
}

/// What a receive buffer holds where nothing may be written.
pub const UNTOUCHED: u64 = 0xDEAD_BEEF_0000;

/// Displacements of `counts` laid out in order with `gaps[k]` untouched elements before block
/// `k`; and the end of the last block.
fn layout(counts: &[usize], gaps: &[usize]) -> (Vec<usize>, usize) {
    let mut at = 0;
    let displs = counts
        .iter()
        .zip(gaps)
        .map(|(&c, &g)| {
            let d = at + g;
            at = d + c;
            d
        })
        .collect();
    (displs, at)
}

/// The strategy of cases on `n` ranks, on NCCL too where `nccl`.
pub fn cases(n: usize, nccl: bool) -> impl Strategy<Value = Case> {
    // The spoiling is picked among those of the operation once the operation is known.
    let mutation = (any::<prop::sample::Index>(), 0..n, any::<bool>(), 1usize..3, 0..n, any::<bool>());
    (
        select(OPS.to_vec()),
        select(vec![Backend::Mpi, Backend::HostTransfer, Backend::Nccl]),
        any::<bool>(),
        0usize..10,
        0..n,
        prop::collection::vec(0usize..5, n * n),
        prop::collection::vec(0usize..3, n * n),
        0usize..3,
        prop::option::weighted(0.7, mutation),
        any::<u32>(),
        any::<bool>(),
    )
        .prop_map(move |(op, backend, check, count, root, pairs, gaps, slack, mutation, id, nonblocking)| {
            let backend = if backend == Backend::Nccl && !nccl { Backend::HostTransfer } else { backend };
            let args = (0..n).map(|r| valid(op, n, r, count, root, &pairs, &gaps, slack)).collect();
            let mutation = mutation.map(|(which, rank, everywhere, delta, entry, recv_side)| {
                let spoil = *which.get(op.spoils());
                Mutation { spoil, rank, everywhere, delta, entry, recv_side }
            });
            let mut case = Case { op, backend, check, nonblocking, n, id: id.into(), args, mutation };
            if let Some(m) = mutation {
                case.spoil(m);
            }
            let needs_check = case.op.collective() && !case.all_or_nothing();
            match case.backend {
                // NCCL has no signature check: a case that needs one runs on HostTransfer, and
                // the others run without.
                Backend::Nccl if needs_check => (case.backend, case.check) = (Backend::HostTransfer, true),
                Backend::Nccl => case.check = false,
                _ if needs_check => case.check = true,
                _ => {}
            }
            case
        })
}

/// Rank `r`'s valid arguments: `count` the common count, `pairs[i * n + j]` what rank `i`
/// gives rank `j` (or rank `j`'s block of a v-collective, from row 0), `gaps` untouched
/// elements before each receive block (rank `r`'s own layout: displacements are local),
/// `slack` untouched elements after the last.
#[allow(clippy::too_many_arguments)]
fn valid(op: Op, n: usize, r: usize, count: usize, root: usize, pairs: &[usize], gaps: &[usize], slack: usize) -> Args {
    let blocks: Vec<usize> = pairs[..n].to_vec();
    let my_gaps = &gaps[r * n..(r + 1) * n];
    let mut a = Args {
        send_len: 0,
        recv_len: 0,
        root,
        source: root,
        tag: (count % 4) as i32,
        counts: Vec::new(),
        displs: Vec::new(),
        counts2: Vec::new(),
        displs2: Vec::new(),
    };
    let at_root = r == root;
    match op {
        Op::Allreduce => (a.send_len, a.recv_len) = (count, count),
        Op::AllreduceInPlace | Op::Bcast => a.recv_len = count,
        Op::Reduce => (a.send_len, a.recv_len) = (count, if at_root { count } else { 0 }),
        Op::Allgather => (a.send_len, a.recv_len) = (count, n * count),
        Op::Alltoall => (a.send_len, a.recv_len) = (n * count, n * count),
        Op::ReduceScatter => (a.send_len, a.recv_len) = (n * count, count),
        Op::Gather => (a.send_len, a.recv_len) = (count, if at_root { n * count } else { 0 }),
        Op::Scatter => (a.send_len, a.recv_len) = (if at_root { n * count } else { 0 }, count),
        Op::ReduceScatterv => {
            a.send_len = blocks.iter().sum();
            a.recv_len = blocks[r];
            a.counts = blocks;
        }
        Op::Allgatherv => {
            let (displs, end) = layout(&blocks, my_gaps);
            (a.send_len, a.recv_len, a.displs) = (blocks[r], end + slack, displs);
            a.counts = blocks;
        }
        Op::Gatherv => {
            a.send_len = blocks[r];
            if at_root {
                let (displs, end) = layout(&blocks, my_gaps);
                (a.recv_len, a.counts, a.displs) = (end + slack, blocks, displs);
            }
        }
        Op::Scatterv => {
            a.recv_len = blocks[r];
            if at_root {
                // Send blocks may overlap: each starts anywhere in the buffer.
                let longest = blocks.iter().copied().max().unwrap_or(0);
                let len = longest + 2 + slack;
                a.displs = blocks.iter().enumerate().map(|(k, &c)| (my_gaps[k] * 3 + k) % (len - c + 1)).collect();
                (a.send_len, a.counts) = (len, blocks);
            }
        }
        Op::Alltoallv => {
            let sc: Vec<usize> = (0..n).map(|j| pairs[r * n + j]).collect();
            let rc: Vec<usize> = (0..n).map(|i| pairs[i * n + r]).collect();
            let (sd, send_end) = layout(&sc, &vec![0; n]);
            let (rd, recv_end) = layout(&rc, my_gaps);
            (a.send_len, a.counts, a.displs) = (send_end + slack, sc, sd);
            (a.recv_len, a.counts2, a.displs2) = (recv_end, rc, rd);
        }
        Op::SendRecv => {
            let shift = 1 + root;
            (a.send_len, a.recv_len) = (count, count);
            (a.root, a.source) = ((r + shift) % n, (r + n - shift % n) % n);
        }
    }
    a
}

impl Case {
    /// Applies `m` to the rank it names, or to every rank. Point-to-point operations have no
    /// signature check, so a spoiled argument there is one every rank refuses (a peer or tag
    /// out of range on all), or none.
    fn spoil(&mut self, m: Mutation) {
        let (op, n) = (self.op, self.n);
        let mut m = m;
        if op == Op::SendRecv {
            m.everywhere = true;
            self.mutation = Some(m);
        }
        let targets: Vec<usize> = if m.everywhere { (0..n).collect() } else { vec![m.rank] };
        for r in targets {
            let a = &mut self.args[r];
            let d = m.delta;
            let (counts, displs) = if m.recv_side && op == Op::Alltoallv {
                (&mut a.counts2, &mut a.displs2)
            } else {
                (&mut a.counts, &mut a.displs)
            };
            let entry = |v: &Vec<usize>| (!v.is_empty()).then(|| m.entry % v.len());
            match m.spoil {
                Spoil::SendLonger => a.send_len += d,
                Spoil::SendShorter => a.send_len = a.send_len.saturating_sub(d),
                Spoil::RecvLonger => a.recv_len += d,
                Spoil::RecvShorter => a.recv_len = a.recv_len.saturating_sub(d),
                Spoil::RootOutOfRange | Spoil::PeerOutOfRange => {
                    if op == Op::SendRecv && m.spoil == Spoil::PeerOutOfRange {
                        a.source = n + d - 1;
                    } else {
                        a.root = n + d - 1;
                    }
                }
                Spoil::OtherRoot => a.root = (a.root + d) % n,
                Spoil::CountsLonger => counts.push(1),
                Spoil::CountsShorter => drop(counts.pop()),
                Spoil::DisplsLonger => displs.push(0),
                Spoil::DisplsShorter => drop(displs.pop()),
                Spoil::CountUp => {
                    if let Some(k) = entry(counts) {
                        counts[k] += d;
                    }
                }
                Spoil::DisplUp => {
                    if let Some(k) = entry(displs) {
                        displs[k] += d;
                    }
                }
                Spoil::DisplOverlap => {
                    if let Some(k) = entry(displs) {
                        displs[k] = displs[(k + 1) % displs.len()];
                    }
                }
                Spoil::HugeCount => {
                    if let Some(k) = entry(counts) {
                        counts[k] = usize::MAX - d;
                    }
                }
                Spoil::HugeDispl => {
                    if let Some(k) = entry(displs) {
                        displs[k] = usize::MAX - d;
                    }
                }
                Spoil::BadTag => a.tag = -(d as i32),
                Spoil::OtherCount => other_count(op, n, r, a, d),
            }
        }
    }

    /// Whether every rank refuses its arguments, or every rank accepts them and they match:
    /// the cases that need no signature check to end the same way on every rank.
    pub fn all_or_nothing(&self) -> bool {
        let refused = (0..self.n).filter(|&r| !self.violations(r).is_empty()).count();
        refused == self.n || (refused == 0 && self.consistent())
    }

    /// Whether the case is valid: every rank accepts its arguments and they match.
    pub fn valid(&self) -> bool {
        (0..self.n).all(|r| self.violations(r).is_empty()) && self.consistent()
    }

    /// The typed errors rank `r`'s own checks may return for its arguments (the library checks
    /// in some order and reports the first failure; any of these is right). Empty: it accepts
    /// them.
    pub fn violations(&self, r: usize) -> Vec<&'static str> {
        let (n, a) = (self.n, &self.args[r]);
        let mut v = Vec::new();
        let mut len = |ok: bool| {
            if !ok {
                v.push("BufferLength");
            }
        };
        let rooted = |v: &mut Vec<&'static str>| {
            if a.root >= n {
                v.push("RankOutOfRange");
            }
            a.root < n && r == a.root
        };
        match self.op {
            Op::Allreduce => len(a.send_len == a.recv_len),
            Op::AllreduceInPlace => {}
            Op::Bcast => {
                rooted(&mut v);
            }
            Op::Reduce => {
                if rooted(&mut v) && a.recv_len != a.send_len {
                    v.push("BufferLength");
                }
            }
            Op::Allgather => len(a.recv_len == n * a.send_len),
            Op::Alltoall => {
                len(a.recv_len == a.send_len);
                len(a.recv_len % n == 0);
            }
            Op::ReduceScatter => len(a.send_len == n * a.recv_len),
            Op::Gather => {
                if rooted(&mut v) && a.recv_len != n * a.send_len {
                    v.push("BufferLength");
                }
            }
            Op::Scatter => {
                if rooted(&mut v) && a.send_len != n * a.recv_len {
                    v.push("BufferLength");
                }
            }
            Op::ReduceScatterv => {
                if a.counts.len() != n {
                    v.push("VectorLength");
                } else {
                    match total(&a.counts) {
                        None => v.push("CountOverflow"),
                        Some(t) => {
                            if a.send_len != t || a.recv_len != a.counts[r] {
                                v.push("BufferLength");
                            }
                        }
                    }
                }
            }
            Op::Allgatherv => {
                blocks(&mut v, n, &a.counts, &a.displs, a.recv_len, true);
                if a.counts.len() == n && a.send_len != a.counts[r] {
                    v.push("BufferLength");
                }
            }
            Op::Gatherv => {
                if rooted(&mut v) {
                    blocks(&mut v, n, &a.counts, &a.displs, a.recv_len, true);
                    if a.counts.len() == n && a.send_len != a.counts[r] {
                        v.push("BufferLength");
                    }
                }
            }
            Op::Scatterv => {
                if rooted(&mut v) {
                    blocks(&mut v, n, &a.counts, &a.displs, a.send_len, false);
                    if a.counts.len() == n && a.recv_len != a.counts[r] {
                        v.push("BufferLength");
                    }
                }
            }
            Op::Alltoallv => {
                blocks(&mut v, n, &a.counts, &a.displs, a.send_len, false);
                blocks(&mut v, n, &a.counts2, &a.displs2, a.recv_len, true);
                if a.counts.len() == n && a.counts2.len() == n && a.counts[r] != a.counts2[r] {
                    v.push("BufferLength");
                }
            }
            Op::SendRecv => {
                if a.tag < 0 {
                    v.push("InvalidTag");
                }
                if a.root >= n || a.source >= n {
                    v.push("RankOutOfRange");
                }
            }
        }
        v
    }

    /// Whether the ranks' arguments match each other (all assumed valid on their own).
    fn consistent(&self) -> bool {
        let (n, a) = (self.n, &self.args);
        let same = |f: &dyn Fn(&Args) -> usize| a.iter().all(|x| f(x) == f(&a[0]));
        let same_root = same(&|x| x.root);
        match self.op {
            Op::Allreduce | Op::Allgather | Op::Alltoall => same(&|x| x.send_len),
            Op::AllreduceInPlace | Op::ReduceScatter => same(&|x| x.recv_len),
            Op::Bcast => same_root && same(&|x| x.recv_len),
            Op::Reduce | Op::Gather => same_root && same(&|x| x.send_len),
            Op::Scatter => same_root && same(&|x| x.recv_len),
            Op::ReduceScatterv | Op::Allgatherv => a.iter().all(|x| x.counts == a[0].counts),
            Op::Gatherv => same_root && (0..n).all(|k| a[a[0].root].counts[k] == a[k].send_len),
            Op::Scatterv => same_root && (0..n).all(|k| a[a[0].root].counts[k] == a[k].recv_len),
            Op::Alltoallv => (0..n).all(|i| (0..n).all(|j| a[i].counts[j] == a[j].counts2[i])),
            Op::SendRecv => (0..n).all(|r| {
                let to = a[r].root;
                a[to].source == r && a[to].recv_len == a[r].send_len && a[to].tag == a[r].tag
            }),
        }
    }

    /// Rank `r`'s element `i` of its input.
    pub fn val(&self, r: usize, i: usize) -> u64 {
        (self.id % 100_000) * 1_000_000 + r as u64 * 1000 + i as u64
    }

    fn vals(&self, r: usize, len: usize) -> Vec<u64> {
        (0..len).map(|i| self.val(r, i)).collect()
    }

    /// Rank `r`'s (send, receive) buffers before the operation (in place, the receive buffer
    /// holds the input).
    pub fn inputs(&self, r: usize) -> (Vec<u64>, Vec<u64>) {
        let a = &self.args[r];
        match self.op {
            Op::AllreduceInPlace => (Vec::new(), self.vals(r, a.recv_len)),
            Op::Bcast if r == a.root => (Vec::new(), self.vals(r, a.recv_len)),
            _ => (self.vals(r, a.send_len), vec![UNTOUCHED; a.recv_len]),
        }
    }

    /// Rank `r`'s receive buffer after the operation, for a valid case.
    pub fn expected(&self, r: usize) -> Vec<u64> {
        let (n, a) = (self.n, &self.args);
        let me = &a[r];
        let (_, mut out) = self.inputs(r);
        let sum = |i: usize| (0..n).map(|k| self.val(k, i)).sum::<u64>();
        let root = me.root;
        match self.op {
            Op::Allreduce | Op::AllreduceInPlace => out = (0..me.recv_len).map(sum).collect(),
            Op::Bcast => out = self.vals(root, me.recv_len),
            Op::Reduce if r == root => out = (0..me.send_len).map(sum).collect(),
            Op::Reduce => {}
            Op::Allgather | Op::Gather => {
                if self.op == Op::Allgather || r == root {
                    let c = me.send_len;
                    out = (0..n * c).map(|x| self.val(x / c, x % c)).collect();
                }
            }
            Op::Alltoall => {
                let c = me.recv_len / n;
                out = (0..n * c).map(|x| self.val(x / c, r * c + x % c)).collect();
            }
            Op::ReduceScatter => {
                let c = me.recv_len;
                out = (0..c).map(|i| sum(r * c + i)).collect();
            }
            Op::ReduceScatterv => {
                let d: usize = me.counts[..r].iter().sum();
                out = (0..me.counts[r]).map(|i| sum(d + i)).collect();
            }
            Op::Allgatherv | Op::Gatherv => {
                if self.op == Op::Allgatherv || r == root {
                    for k in 0..n {
                        for i in 0..me.counts[k] {
                            out[me.displs[k] + i] = self.val(k, i);
                        }
                    }
                }
            }
            Op::Scatter => out = (0..me.recv_len).map(|i| self.val(root, r * me.recv_len + i)).collect(),
            Op::Scatterv => out = (0..me.recv_len).map(|i| self.val(root, a[root].displs[r] + i)).collect(),
            Op::Alltoallv => {
                for k in 0..n {
                    for i in 0..me.counts2[k] {
                        out[me.displs2[k] + i] = self.val(k, a[k].displs[r] + i);
                    }
                }
            }
            Op::SendRecv => out = self.vals(me.source, me.recv_len),
        }
        out
    }
}

/// Another count on rank `r` with its own buffers to match (valid there, mismatched elsewhere).
fn other_count(op: Op, n: usize, r: usize, a: &mut Args, d: usize) {
    let at_root = a.root == r;
    match op {
        Op::Allreduce => (a.send_len, a.recv_len) = (a.send_len + d, a.recv_len + d),
        Op::AllreduceInPlace | Op::Bcast => a.recv_len += d,
        Op::Reduce | Op::Gather => {
            a.send_len += d;
            if at_root {
                a.recv_len += if op == Op::Gather { n * d } else { d };
            }
        }
        Op::Allgather => (a.send_len, a.recv_len) = (a.send_len + d, a.recv_len + n * d),
        Op::Alltoall => (a.send_len, a.recv_len) = (a.send_len + n * d, a.recv_len + n * d),
        Op::ReduceScatter => (a.send_len, a.recv_len) = (a.send_len + n * d, a.recv_len + d),
        Op::Scatter => {
            a.recv_len += d;
            if at_root {
                a.send_len += n * d;
            }
        }
        Op::ReduceScatterv => {
            // One more element for rank 0's block.
            a.counts[0] += d;
            a.send_len += d;
            if r == 0 {
                a.recv_len += d;
            }
        }
        Op::Allgatherv => {
            // This rank's block grows into the untouched tail, which it has room for only if it
            // is the last block: otherwise the model sees the overlap.
            a.counts[r] += d;
            a.send_len += d;
            a.recv_len += d;
        }
        Op::Gatherv if !at_root => a.send_len += d,
        Op::Scatterv if !at_root => a.recv_len += d,
        Op::Gatherv | Op::Scatterv => {}
        Op::Alltoallv => {
            // Sends one more element to the next rank, from a longer send buffer.
            let to = (r + 1) % n;
            a.counts[to] += d;
            a.send_len += d;
            if to == r {
                a.counts2[r] += d;
                let end = a.displs2[r] + a.counts2[r];
                a.recv_len = a.recv_len.max(end);
            }
        }
        Op::SendRecv => {}
    }
}

fn total(counts: &[usize]) -> Option<usize> {
    counts.iter().try_fold(0usize, |acc, &c| acc.checked_add(c))
}

/// The checks of a v-collective's blocks in a buffer of `len` elements (`disjoint` for
/// receive buffers).
fn blocks(v: &mut Vec<&'static str>, n: usize, counts: &[usize], displs: &[usize], len: usize, disjoint: bool) {
    if counts.len() != n {
        v.push("VectorLength");
        return;
    }
    if displs.len() != counts.len() {
        v.push("VectorLength");
        return;
    }
    let mut bad = false;
    for (&c, &d) in counts.iter().zip(displs) {
        match d.checked_add(c) {
            None => {
                v.push("CountOverflow");
                bad = true;
            }
            Some(end) if end > len => {
                v.push("DisplacementOutOfRange");
                bad = true;
            }
            Some(_) => {}
        }
    }
    if total(counts).is_none() {
        v.push("CountOverflow");
    }
    if disjoint && !bad {
        let mut order: Vec<usize> = (0..n).filter(|&i| counts[i] > 0).collect();
        order.sort_by_key(|&i| displs[i]);
        if order.windows(2).any(|w| displs[w[0]] + counts[w[0]] > displs[w[1]]) {
            v.push("DisplacementOverlap");
        }
    }
}
