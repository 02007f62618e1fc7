//! The tags of Duralumin's own algorithm messages: the number of the transport that sends them
//! (every rank numbers its operations' transports alike) above a few bits of the operation's
//! signature hash ([`Signature::agreement_hash`](crate::reliability::recorder::Signature::agreement_hash)).
//!
//! So a message of a call that differs on another rank (another operation, count, root, element
//! or operator) never matches a receive of this one, and a receive that waits while the first
//! message from its peer carries its own number with another hash has found a mismatch
//! ([`TagLayout::differs`]). The hash bits are what `MPI_TAG_UB` leaves beside enough numbers
//! for the operations in flight at once: 12 bits under Open MPI's and MPICH's 2^31 - 1.

use std::ffi::c_int;

/// How a communicator's algorithm tags are laid out (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TagLayout {
    /// Low bits: the signature hash's.
    hash_bits: u32,
    /// The bits above them: the transport number's.
    seq_bits: u32,
}

impl TagLayout {
    /// The layout for tags up to `tag_ub` (`MPI_TAG_UB`, at least 32767 by the standard).
    pub(crate) fn new(tag_ub: c_int) -> Self {
        let ub = u64::try_from(tag_ub).unwrap_or(0).max(1);
        // The largest `b` with `2^b - 1 <= tag_ub`.
        let bits = 63 - (ub + 1).leading_zeros();
        let hash_bits = match bits {
            27.. => 12,
            20..=26 => 8,
            _ => bits.saturating_sub(12),
        };
        TagLayout { hash_bits, seq_bits: bits - hash_bits }
    }

    fn mask(bits: u32) -> u64 {
        (1u64 << bits) - 1
    }

    /// The tag of transport number `seq` of an operation whose signature hashes to `hash`.
    pub(crate) fn tag(self, seq: u32, hash: u64) -> c_int {
        let seq = u64::from(seq) & Self::mask(self.seq_bits);
        let tag = (seq << self.hash_bits) | (hash & Self::mask(self.hash_bits));
        // At most `seq_bits + hash_bits <= 31` bits: a non-negative `c_int` within `tag_ub`.
        c_int::try_from(tag).unwrap_or(0)
    }

    /// Whether `seen` (the tag of a message waiting from a peer) is the same transport number
    /// as `mine` with another signature hash: the peer is in this operation with another call.
    pub(crate) fn differs(self, mine: c_int, seen: c_int) -> bool {
        mine != seen && (mine >> self.hash_bits) == (seen >> self.hash_bits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_stay_within_the_bound_and_carry_the_number_and_hash() {
        for ub in [32767, 65535, (1 << 20) - 1, (1 << 27) - 1, c_int::MAX] {
            let l = TagLayout::new(ub);
            assert!(l.seq_bits >= 12 && l.seq_bits + l.hash_bits <= 31, "{ub}: {l:?}");
            for seq in [0, 1, 4095, u32::MAX] {
                for hash in [0, 1, 0xabc, u64::MAX] {
                    let t = l.tag(seq, hash);
                    assert!((0..=ub).contains(&t), "{ub} {seq} {hash}: {t}");
                }
            }
        }
        let l = TagLayout::new(c_int::MAX);
        assert_eq!(l.hash_bits, 12);
        // Another hash at the same number is a mismatch; another number is not (a later
        // operation's message may come first).
        assert!(l.differs(l.tag(7, 1), l.tag(7, 2)));
        assert!(!l.differs(l.tag(7, 1), l.tag(7, 1)));
        assert!(!l.differs(l.tag(7, 1), l.tag(8, 2)));
        // Numbers wrap within their bits.
        assert_eq!(l.tag(1 << 19, 5), l.tag(0, 5));
    }
}
