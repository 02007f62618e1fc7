//! Argument checks, run on the calling rank before anything is sent.

use crate::api::error::{Error, Result};

pub(crate) fn len(what: &'static str, actual: usize, expected: usize) -> Result<()> {
    if actual == expected { Ok(()) } else { Err(Error::BufferLength { what, expected, actual }) }
}

pub(crate) fn rank(what: &'static str, rank: usize, size: usize) -> Result<()> {
    if rank < size { Ok(()) } else { Err(Error::RankOutOfRange { what, rank, size }) }
}

pub(crate) fn per_rank(what: &'static str, v: &[usize], size: usize) -> Result<()> {
    if v.len() == size { Ok(()) } else { Err(Error::VectorLength { what, expected: size, actual: v.len() }) }
}

/// `a * b` elements, or an overflow error.
pub(crate) fn product(what: &'static str, a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or(Error::CountOverflow { what, value: a as u128 * b as u128 })
}

/// The sum of `counts`, or an overflow error.
pub(crate) fn total(what: &'static str, counts: &[usize]) -> Result<usize> {
    counts
        .iter()
        .try_fold(0usize, |acc, &c| acc.checked_add(c))
        .ok_or(Error::CountOverflow { what, value: counts.iter().map(|&c| c as u128).sum() })
}

/// `len / n` when `n` divides `len` evenly.
pub(crate) fn divisible(what: &'static str, len: usize, n: usize) -> Result<usize> {
    if len % n == 0 {
        Ok(len / n)
    } else {
        Err(Error::BufferLength { what, expected: len.div_ceil(n) * n, actual: len })
    }
}

/// Checks that the blocks `[displs[i], displs[i] + counts[i])` lie inside a buffer of `len`
/// elements and, for receive buffers (`disjoint`), that no two non-empty blocks overlap.
/// Overlapping send blocks are allowed: MPI may read the same element twice.
pub(crate) fn blocks(what: &'static str, counts: &[usize], displs: &[usize], len: usize, disjoint: bool) -> Result<()> {
    per_rank(what, displs, counts.len())?;
    for (rank, (&c, &d)) in counts.iter().zip(displs).enumerate() {
        let end = d.checked_add(c).ok_or(Error::CountOverflow { what, value: d as u128 + c as u128 })?;
        if end > len {
            return Err(Error::DisplacementOutOfRange { what, rank, start: d, end, len });
        }
    }
    if disjoint {
        let mut order: Vec<usize> = (0..counts.len()).filter(|&i| counts[i] > 0).collect();
        order.sort_by_key(|&i| displs[i]);
        for w in order.windows(2) {
            if displs[w[0]] + counts[w[0]] > displs[w[1]] {
                let (first, second) = (w[0].min(w[1]), w[0].max(w[1]));
                return Err(Error::DisplacementOverlap { what, first, second });
            }
        }
    }
    Ok(())
}

/// Prefix sums of `counts`: the displacements of blocks packed back to back.
pub(crate) fn packed_displs(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0usize, |acc, &c| {
            let d = *acc;
            *acc = acc.saturating_add(c);
            Some(d)
        })
        .collect()
}

pub(crate) fn tag(tag: i32, max: i32) -> Result<()> {
    if (0..=max).contains(&tag) { Ok(()) } else { Err(Error::InvalidTag { tag: tag.into(), max: max.into() }) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_receive_blocks_are_rejected() {
        assert!(blocks("t", &[2, 2], &[0, 2], 4, true).is_ok());
        assert!(matches!(
            blocks("t", &[3, 2], &[0, 2], 5, true),
            Err(Error::DisplacementOverlap { first: 0, second: 1, .. })
        ));
        assert!(blocks("t", &[3, 2], &[0, 2], 5, false).is_ok());
        assert!(blocks("t", &[0, 2], &[1, 0], 2, true).is_ok());
        assert!(matches!(blocks("t", &[2], &[3], 4, true), Err(Error::DisplacementOutOfRange { end: 5, .. })));
        assert!(matches!(blocks("t", &[2], &[usize::MAX], 4, true), Err(Error::CountOverflow { .. })));
    }

    #[test]
    fn packed() {
        assert_eq!(packed_displs(&[2, 0, 3]), vec![0, 2, 2]);
        assert_eq!(
            total("t", &[usize::MAX, 1]).unwrap_err().to_string(),
            "t: 18446744073709551616 elements overflows what can be addressed"
        );
    }
}
