//! The operations `duralumin-perf` times, their buffer sizes and bus-bandwidth factors, after
//! nccl-tests' conventions: the size of a row is the largest buffer of the operation (the whole
//! gathered or scattered buffer, not one rank's block), and bus bandwidth is the algorithm
//! bandwidth times a factor that makes it comparable with the link speed
//! (nccl-tests' `doc/PERFORMANCE.md`).

use std::fmt;

/// A collective (or point-to-point pattern) `duralumin-perf` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coll {
    Allreduce,
    Reduce,
    Bcast,
    Allgather,
    Allgatherv,
    ReduceScatter,
    ReduceScatterv,
    Alltoall,
    Alltoallv,
    Gather,
    Gatherv,
    Scatter,
    Scatterv,
    /// Every rank sends to the next and receives from the previous one.
    Sendrecv,
    /// Every rank exchanges a message with both neighbours at once (a halo exchange).
    MultiSendrecv,
    /// Ranks in pairs (0 to 1, 2 to 3…): a `send` on one and a `recv` on the other, as the OSU
    /// bandwidth test; with an odd rank count the last rank idles.
    SendRecvPair,
    Barrier,
}

impl Coll {
    /// Every operation, in the order `-o all` runs them.
    pub const ALL: [Coll; 17] = [
        Coll::Allreduce,
        Coll::Reduce,
        Coll::Bcast,
        Coll::Allgather,
        Coll::Allgatherv,
        Coll::ReduceScatter,
        Coll::ReduceScatterv,
        Coll::Alltoall,
        Coll::Alltoallv,
        Coll::Gather,
        Coll::Gatherv,
        Coll::Scatter,
        Coll::Scatterv,
        Coll::Sendrecv,
        Coll::MultiSendrecv,
        Coll::SendRecvPair,
        Coll::Barrier,
    ];

    /// The name on the command line and in the table.
    pub fn name(self) -> &'static str {
        match self {
            Coll::Allreduce => "allreduce",
            Coll::Reduce => "reduce",
            Coll::Bcast => "bcast",
            Coll::Allgather => "allgather",
            Coll::Allgatherv => "allgatherv",
            Coll::ReduceScatter => "reduce_scatter",
            Coll::ReduceScatterv => "reduce_scatterv",
            Coll::Alltoall => "alltoall",
            Coll::Alltoallv => "alltoallv",
            Coll::Gather => "gather",
            Coll::Gatherv => "gatherv",
            Coll::Scatter => "scatter",
            Coll::Scatterv => "scatterv",
            Coll::Sendrecv => "sendrecv",
            Coll::MultiSendrecv => "multi_sendrecv",
            Coll::SendRecvPair => "send",
            Coll::Barrier => "barrier",
        }
    }

    /// The operation named `s` (nccl-tests' names, `all_reduce`, `broadcast`…, are accepted too).
    pub fn parse(s: &str) -> Option<Coll> {
        let s = s.to_ascii_lowercase().replace('-', "_");
        let alias = match s.as_str() {
            "all_reduce" => "allreduce",
            "broadcast" => "bcast",
            "all_gather" => "allgather",
            "alltoall_v" | "all_to_allv" => "alltoallv",
            "all_to_all" => "alltoall",
            "reducescatter" => "reduce_scatter",
            "recv" => "send",
            other => other,
        };
        Coll::ALL.into_iter().find(|c| c.name() == alias)
    }

    /// Whether it reduces (takes a reduction operator).
    pub fn reduces(self) -> bool {
        matches!(self, Coll::Allreduce | Coll::Reduce | Coll::ReduceScatter | Coll::ReduceScatterv)
    }

    /// Whether it has a root.
    pub fn rooted(self) -> bool {
        matches!(self, Coll::Reduce | Coll::Bcast | Coll::Gather | Coll::Gatherv | Coll::Scatter | Coll::Scatterv)
    }

    /// Whether its buffers are cut in one block per rank (the size must hold `n` blocks).
    pub fn blocks(self) -> bool {
        matches!(
            self,
            Coll::Allgather
                | Coll::Allgatherv
                | Coll::ReduceScatter
                | Coll::ReduceScatterv
                | Coll::Alltoall
                | Coll::Alltoallv
                | Coll::Gather
                | Coll::Gatherv
                | Coll::Scatter
                | Coll::Scatterv
        )
    }

    /// Whether it has an in-place form besides the out-of-place one (a broadcast has one form
    /// only, reported as out-of-place; the all-to-all-v, the point-to-point patterns and the
    /// barrier have none).
    pub fn has_in_place(self) -> bool {
        !matches!(self, Coll::Bcast | Coll::Alltoallv | Coll::MultiSendrecv | Coll::SendRecvPair | Coll::Barrier)
    }

    /// nccl-tests' bus-bandwidth factor at `n` ranks: busbw = algbw × factor.
    pub fn busbw_factor(self, n: usize) -> f64 {
        let n = n as f64;
        match self {
            Coll::Allreduce => 2.0 * (n - 1.0) / n,
            Coll::Reduce | Coll::Bcast | Coll::Sendrecv | Coll::SendRecvPair => 1.0,
            // Two messages of the row's size per rank.
            Coll::MultiSendrecv => 2.0,
            Coll::Barrier => 0.0,
            _ => (n - 1.0) / n,
        }
    }

    /// The element count of a row of `bytes` at `n` ranks (a whole number of blocks where the
    /// buffers are cut per rank, as nccl-tests rounds), or `None` where no element fits.
    pub fn count(self, bytes: usize, elem: usize, n: usize) -> Option<usize> {
        let count = bytes / elem.max(1);
        let count = if self.blocks() { count / n * n } else { count };
        (count > 0 || self == Coll::Barrier).then_some(count)
    }
}

impl fmt::Display for Coll {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A reduction operator (nccl-tests' `-o` values).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Redop {
    Sum,
    Prod,
    Min,
    Max,
    Avg,
}

impl Redop {
    pub const ALL: [Redop; 5] = [Redop::Sum, Redop::Prod, Redop::Min, Redop::Max, Redop::Avg];

    pub fn name(self) -> &'static str {
        match self {
            Redop::Sum => "sum",
            Redop::Prod => "prod",
            Redop::Min => "min",
            Redop::Max => "max",
            Redop::Avg => "avg",
        }
    }

    pub fn parse(s: &str) -> Option<Redop> {
        Redop::ALL.into_iter().find(|r| r.name().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Redop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_nccl_tests_aliases_parse() {
        for c in Coll::ALL {
            assert_eq!(Coll::parse(c.name()), Some(c));
        }
        assert_eq!(Coll::parse("all_reduce"), Some(Coll::Allreduce));
        assert_eq!(Coll::parse("broadcast"), Some(Coll::Bcast));
        assert_eq!(Coll::parse("recv"), Some(Coll::SendRecvPair));
        assert_eq!(Coll::parse("nonsense"), None);
        for r in Redop::ALL {
            assert_eq!(Redop::parse(r.name()), Some(r));
        }
    }

    #[test]
    fn counts_round_to_whole_blocks_and_factors_follow_nccl_tests() {
        assert_eq!(Coll::Allgather.count(100, 4, 3), Some(24));
        assert_eq!(Coll::Allreduce.count(100, 4, 3), Some(25));
        assert_eq!(Coll::Allgather.count(8, 4, 3), None);
        assert_eq!(Coll::Barrier.count(0, 4, 3), Some(0));
        assert!((Coll::Allreduce.busbw_factor(4) - 1.5).abs() < 1e-12);
        assert!((Coll::Allgather.busbw_factor(4) - 0.75).abs() < 1e-12);
        assert!((Coll::Bcast.busbw_factor(4) - 1.0).abs() < 1e-12);
    }
}
