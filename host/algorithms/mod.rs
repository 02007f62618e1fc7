//! Collective algorithms, written once over a [`Transport`] and a [`Reducer`].
//!
//! Every function here is an `async fn` state machine: a blocking call runs it to completion on
//! the caller's thread, a non-blocking one hands it to the progress engine. Backends reuse them
//! with their own transport (MPI point-to-point on host or pinned memory) and reducer (CPU, or a
//! device kernel).
//!
//! All of them take buffers as [`RawBuf`]s. Their common safety contract: every buffer passed
//! in is valid for the reads and writes the algorithm makes and is not accessed by anyone else
//! until the returned future completes; distinct buffer arguments do not overlap.
//!
//! [`Transport`]: crate::transport::Transport
//! [`Reducer`]: crate::common::reducer::Reducer
//! [`RawBuf`]: crate::common::buffer::RawBuf

pub(crate) mod allreduce;
pub(crate) mod bcast;
pub(crate) mod exchange;
pub(crate) mod hierarchical;
pub(crate) mod reduce;
pub(crate) mod reduce_scatter;

/// The block of `len` elements that rank `i` of `n` owns in ring and halving algorithms:
/// sizes differ by at most one element.
pub(crate) fn block_range(len: usize, n: usize, i: usize) -> (usize, usize) {
    let base = len / n;
    let rem = len % n;
    (i * base + i.min(rem), base + usize::from(i < rem))
}

/// The segments `(start, len)` of a block of `len` elements cut every `seg` elements; an
/// empty block is one empty segment so both sides of a message agree on the count.
pub(crate) fn segments(len: usize, seg: usize) -> impl ExactSizeIterator<Item = (usize, usize)> {
    (0..segment_count(len, seg)).map(move |k| segment(len, seg, k))
}

/// How many segments [`segments`] cuts `len` elements into: at least one.
pub(crate) fn segment_count(len: usize, seg: usize) -> usize {
    len.div_ceil(seg.max(1)).max(1)
}

/// Segment `k` of [`segments`]: computed alone, so a pipeline of many segments need not list
/// them.
pub(crate) fn segment(len: usize, seg: usize, k: usize) -> (usize, usize) {
    let seg = seg.max(1);
    let start = k.saturating_mul(seg).min(len);
    (start, seg.min(len - start))
}

/// How ranks pair up when the communicator size is not a power of two (recursive doubling and
/// Rabenseifner): the first `2 * rem` ranks fold pairwise so `pof2` ranks remain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fold {
    pub(crate) pof2: usize,
    pub(crate) rem: usize,
}

impl Fold {
    pub(crate) fn new(n: usize) -> Self {
        let pof2 = if n.is_power_of_two() { n } else { n.next_power_of_two() / 2 };
        Fold { pof2, rem: n - pof2 }
    }

    /// This rank's index among the `pof2` remaining ranks, or `None` if it folded away.
    pub(crate) fn virtual_rank(&self, rank: usize) -> Option<usize> {
        if rank < 2 * self.rem { (rank % 2 == 1).then_some(rank / 2) } else { Some(rank - self.rem) }
    }

    /// The real rank of virtual rank `v`.
    pub(crate) fn real_rank(&self, v: usize) -> usize {
        if v < self.rem { 2 * v + 1 } else { v + self.rem }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_partition_the_buffer() {
        for len in [0, 1, 7, 100] {
            for n in 1..6 {
                let mut next = 0;
                for i in 0..n {
                    let (s, l) = block_range(len, n, i);
                    assert_eq!(s, next);
                    next = s + l;
                }
                assert_eq!(next, len);
            }
        }
    }

    #[test]
    fn fold_maps_ranks_both_ways() {
        for n in 1..12 {
            let f = Fold::new(n);
            assert!(f.pof2.is_power_of_two() && f.pof2 <= n && 2 * f.pof2 > n);
            let survivors: Vec<_> = (0..n).filter_map(|r| f.virtual_rank(r).map(|v| (r, v))).collect();
            assert_eq!(survivors.len(), f.pof2);
            for (r, v) in survivors {
                assert_eq!(f.real_rank(v), r);
            }
        }
    }

    #[test]
    fn segments_cover_blocks() {
        assert_eq!(segments(0, 4).collect::<Vec<_>>(), vec![(0, 0)]);
        assert_eq!(segments(10, 4).collect::<Vec<_>>(), vec![(0, 4), (4, 4), (8, 2)]);
        assert_eq!((segment_count(10, 0), segment(10, 0, 9)), (10, (9, 1)));
        assert_eq!(segment(10, 4, 7), (10, 0));
    }
}
