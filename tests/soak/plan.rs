//! What the soak runs: a deterministic sequence of operations (every rank derives the same one
//! from the batch and slot numbers, as MPI requires of collectives), each rank's inputs, and
//! the exact result every rank must get, computed sequentially.

/// The operations the soak mixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Allreduce,
    AllreduceInPlace,
    Bcast,
    Allgather,
    Allgatherv,
    ReduceScatter,
    Alltoall,
    Alltoallv,
    Reduce,
    Gatherv,
    Scatterv,
    SendRecv,
    Barrier,
}

pub const KINDS: [Kind; 13] = [
    Kind::Allreduce,
    Kind::Bcast,
    Kind::Allgather,
    Kind::ReduceScatter,
    Kind::Alltoall,
    Kind::Alltoallv,
    Kind::AllreduceInPlace,
    Kind::Allgatherv,
    Kind::Reduce,
    Kind::SendRecv,
    Kind::Gatherv,
    Kind::Scatterv,
    Kind::Barrier,
];

/// What a receive buffer holds where nothing may be written.
pub const UNTOUCHED: u64 = u64::MAX - 1;

/// One operation of a batch, as every rank sees it.
#[derive(Clone, Copy, Debug)]
pub struct Spec {
    pub kind: Kind,
    /// The operation's base count (per block where there are blocks).
    pub count: usize,
    pub root: usize,
    /// Tells the data of one operation from another's.
    pub seed: u64,
    pub n: usize,
}

impl Spec {
    /// Slot `slot` of batch `batch` on communicator `comm` of `n` ranks. Counts are mostly
    /// small, with an empty one and a large one now and then (large enough to take Duralumin's
    /// own algorithms under the low thresholds one communicator uses, and to be cut into
    /// several chunks on HostTransfer).
    pub fn new(comm: usize, batch: usize, slot: usize, n: usize) -> Spec {
        let pick = batch * 5 + slot * 3 + comm;
        let kind = KINDS[pick % KINDS.len()];
        let count = match (batch * 7 + slot) % 23 {
            0 => 0,
            5 => 1500 + batch % 100,
            k => 1 + (k * 13 + batch) % 61,
        };
        let seed = ((comm * 1_000_003 + batch) * 16 + slot) as u64;
        Spec { kind, count, root: (batch + slot) % n, seed, n }
    }

    /// Rank `r`'s element `i` of its input.
    pub fn val(&self, r: usize, i: usize) -> u64 {
        (self.seed % 1_000_000) * 1_000_003 + r as u64 * 10_007 + i as u64
    }

    fn vals(&self, r: usize, len: usize) -> Vec<u64> {
        (0..len).map(|i| self.val(r, i)).collect()
    }

    /// Per-rank block counts of the allgatherv and gatherv/scatterv (some zero).
    pub fn counts(&self) -> Vec<usize> {
        (0..self.n).map(|k| (self.count + 3 * k) % 6).collect()
    }

    /// Displacements of `counts` with one untouched element before each block.
    pub fn gapped(counts: &[usize]) -> Vec<usize> {
        let mut at = 0;
        counts
            .iter()
            .map(|&c| {
                let d = at + 1;
                at = d + c;
                d
            })
            .collect()
    }

    /// What rank `from` sends rank `to` in the alltoallv.
    pub fn pair_count(&self, from: usize, to: usize) -> usize {
        (self.count + 2 * from + to) % 5
    }

    /// Rank `r`'s alltoallv send counts and displacements (packed), receive counts and
    /// displacements (gapped).
    #[allow(clippy::type_complexity)]
    pub fn alltoallv(&self, r: usize) -> (Vec<usize>, Vec<usize>, Vec<usize>, Vec<usize>) {
        let sc: Vec<usize> = (0..self.n).map(|j| self.pair_count(r, j)).collect();
        let sd = packed(&sc);
        let rc: Vec<usize> = (0..self.n).map(|k| self.pair_count(k, r)).collect();
        let rd = Spec::gapped(&rc);
        (sc, sd, rc, rd)
    }

    /// Rank `r`'s (send, receive) buffers before the operation.
    pub fn inputs(&self, r: usize) -> (Vec<u64>, Vec<u64>) {
        let (n, c) = (self.n, self.count);
        let fresh = |len: usize| vec![UNTOUCHED; len];
        match self.kind {
            Kind::Allreduce => (self.vals(r, c), fresh(c)),
            Kind::AllreduceInPlace => (Vec::new(), self.vals(r, c)),
            Kind::Bcast => (Vec::new(), if r == self.root { self.vals(r, c) } else { fresh(c) }),
            Kind::Allgather => (self.vals(r, c), fresh(n * c)),
            Kind::Allgatherv => {
                let counts = self.counts();
                let end = Spec::gapped(&counts)[n - 1] + counts[n - 1];
                (self.vals(r, counts[r]), fresh(end + 1))
            }
            Kind::ReduceScatter | Kind::Alltoall => {
                (self.vals(r, n * c), fresh(if self.kind == Kind::Alltoall { n * c } else { c }))
            }
            Kind::Alltoallv => {
                let (sc, _, rc, rd) = self.alltoallv(r);
                (self.vals(r, sc.iter().sum()), fresh(rd[n - 1] + rc[n - 1] + 1))
            }
            Kind::Reduce => (self.vals(r, c), fresh(if r == self.root { c } else { 0 })),
            Kind::Gatherv => {
                let counts = self.counts();
                let end = Spec::gapped(&counts)[n - 1] + counts[n - 1];
                (self.vals(r, counts[r]), fresh(if r == self.root { end + 1 } else { 0 }))
            }
            Kind::Scatterv => {
                let counts = self.counts();
                let end = Spec::gapped(&counts)[n - 1] + counts[n - 1];
                (if r == self.root { self.vals(r, end + 1) } else { Vec::new() }, fresh(counts[r]))
            }
            Kind::SendRecv => (self.vals(r, c), fresh(c)),
            Kind::Barrier => (Vec::new(), Vec::new()),
        }
    }

    /// Rank `r`'s receive buffer after the operation.
    pub fn expected(&self, r: usize) -> Vec<u64> {
        let (n, c) = (self.n, self.count);
        let sum = |i: usize| (0..n).map(|k| self.val(k, i)).sum::<u64>();
        let (_, mut out) = self.inputs(r);
        match self.kind {
            Kind::Allreduce | Kind::AllreduceInPlace => out = (0..c).map(sum).collect(),
            Kind::Bcast => out = self.vals(self.root, c),
            Kind::Allgather => out = (0..n * c).map(|x| self.val(x / c.max(1), x % c.max(1))).collect(),
            Kind::Allgatherv | Kind::Gatherv => {
                if self.kind == Kind::Allgatherv || r == self.root {
                    let counts = self.counts();
                    for (k, d) in Spec::gapped(&counts).into_iter().enumerate() {
                        for i in 0..counts[k] {
                            out[d + i] = self.val(k, i);
                        }
                    }
                }
            }
            Kind::ReduceScatter => out = (0..c).map(|i| sum(r * c + i)).collect(),
            Kind::Alltoall => out = (0..n * c).map(|x| self.val(x / c.max(1), r * c + x % c.max(1))).collect(),
            Kind::Alltoallv => {
                let (_, _, rc, rd) = self.alltoallv(r);
                for k in 0..n {
                    let (_, sd_k, _, _) = self.alltoallv(k);
                    for i in 0..rc[k] {
                        out[rd[k] + i] = self.val(k, sd_k[r] + i);
                    }
                }
            }
            Kind::Reduce => {
                if r == self.root {
                    // Max: the largest rank's values are the largest.
                    out = self.vals(n - 1, c);
                }
            }
            Kind::Scatterv => {
                let counts = self.counts();
                let d = Spec::gapped(&counts)[r];
                out = (0..counts[r]).map(|i| self.val(self.root, d + i)).collect();
            }
            Kind::SendRecv => out = self.vals((r + n - 1) % n, c),
            Kind::Barrier => {}
        }
        out
    }
}

/// Displacements of blocks packed back to back.
pub fn packed(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |at, &c| {
            let d = *at;
            *at += c;
            Some(d)
        })
        .collect()
}
