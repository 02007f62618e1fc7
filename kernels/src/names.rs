//! Deterministic kernel entry-point names.
//!
//! A reduction entry point for element `T` and operator `O` is called
//! `duralumin_{kind}_{T::NAME}_{O::NAME}`, e.g. `duralumin_reduce_f32_sum`,
//! `duralumin_reduce3_minloc_argmin` or `duralumin_finish_bf16_avg`. [`KernelName::reduce`] is a
//! `const fn`: the entry macro checks at compile time that the symbol it exports is exactly the
//! name the host computes with the same function, so the two cannot drift apart.

use crate::{Element, ReduceOp};

/// The reduction kernels stamped out for every (element, operator) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKernel {
    /// `dst[i] = combine(dst[i], src[i])`; parameters `(dst, src, n)`.
    Reduce,
    /// `dst[i] = combine(a[i], b[i])`; parameters `(dst, a, b, n)`.
    Reduce3,
    /// `dst[i] = finish(dst[i], ranks)`; parameters `(dst, n, ranks: u32)`. An empty kernel for
    /// operators without a finishing step.
    Finish,
}

impl ReduceKernel {
    /// Every kind, in name order.
    pub const ALL: [ReduceKernel; 3] = [ReduceKernel::Reduce, ReduceKernel::Reduce3, ReduceKernel::Finish];

    /// The kind's fragment of the entry name.
    #[inline]
    pub const fn tag(self) -> &'static str {
        match self {
            ReduceKernel::Reduce => "reduce",
            ReduceKernel::Reduce3 => "reduce3",
            ReduceKernel::Finish => "finish",
        }
    }
}

/// Names of the type-independent kernels of the builtin set.
pub mod fixed {
    /// [`crate::pack::copy_2d`]: `(dst, dst_pitch, src, src_pitch, row_bytes, rows)`.
    pub const COPY_2D: &str = "duralumin_copy_2d";
    /// [`crate::pack::pack_segments`]: `(dst, src, segments, count)`.
    pub const PACK_SEGMENTS: &str = "duralumin_pack_segments";
    /// [`crate::pack::unpack_segments`]: `(dst, src, segments, count)`.
    pub const UNPACK_SEGMENTS: &str = "duralumin_unpack_segments";
    /// [`crate::flag::stream_wait`]: `(flag, value: u32)`.
    pub const STREAM_WAIT: &str = "duralumin_stream_wait";
    /// [`crate::flag::signal`]: `(flag, value: u32)`.
    pub const SIGNAL: &str = "duralumin_signal";
    /// [`crate::mover::run`]: the schedule as its `Schedule::WORDS` words, launched as blocks of
    /// `mover::DEVICE_THREADS` threads (cooperatively when there are several).
    pub const MOVER: &str = "duralumin_mover";
    /// All of them.
    pub const ALL: [&str; 6] = [COPY_2D, PACK_SEGMENTS, UNPACK_SEGMENTS, STREAM_WAIT, SIGNAL, MOVER];
}

/// The longest [`Element::NAME`] or [`ReduceOp::NAME`] fragment, in bytes.
pub const MAX_FRAGMENT: usize = 48;

/// Prefix of every Duralumin entry point.
pub const PREFIX: &str = "duralumin_";

const CAPACITY: usize = PREFIX.len() + "reduce3".len() + 2 + 2 * MAX_FRAGMENT;

/// A kernel entry-point name built in a `const fn`, without allocation.
#[derive(Clone, Copy)]
pub struct KernelName {
    bytes: [u8; CAPACITY],
    len: usize,
    valid: bool,
}

impl KernelName {
    /// The name of the `kind` kernel for element `T` and operator `O`.
    ///
    /// The name is [invalid](KernelName::is_valid) when a fragment is empty, longer than
    /// [`MAX_FRAGMENT`] bytes or not made of ASCII letters, digits and `_`; the entry macro
    /// rejects such pairs at compile time.
    #[inline]
    pub const fn reduce<T: Element, O: ReduceOp<T>>(kind: ReduceKernel) -> KernelName {
        KernelName::from_parts(kind, T::NAME, O::NAME)
    }

    /// The name of the `kind` kernel for the element and operator named `element` and `op`
    /// (their [`Element::NAME`] and [`ReduceOp::NAME`]), e.g. from
    /// [`BUILTIN_REDUCE_PAIRS`](crate::entry::BUILTIN_REDUCE_PAIRS).
    #[inline]
    pub const fn from_parts(kind: ReduceKernel, element: &str, op: &str) -> KernelName {
        let mut name = KernelName { bytes: [0; CAPACITY], len: 0, valid: true };
        name = name.push(PREFIX, false);
        name = name.push(kind.tag(), false);
        name = name.push("_", false);
        name = name.push(element, true);
        name = name.push("_", false);
        name.push(op, true)
    }

    #[inline]
    const fn push(mut self, s: &str, fragment: bool) -> KernelName {
        let b = s.as_bytes();
        if fragment && !fragment_is_valid(s) {
            self.valid = false;
        }
        let mut i = 0;
        while i < b.len() {
            if self.len < CAPACITY {
                self.bytes[self.len] = b[i];
                self.len += 1;
            } else {
                self.valid = false;
            }
            i += 1;
        }
        self
    }

    /// Whether both fragments were valid, so this is the name the entry macro exports.
    #[inline]
    pub const fn is_valid(&self) -> bool {
        self.valid
    }

    /// The name.
    #[inline]
    pub const fn as_str(&self) -> &str {
        let (used, _) = self.bytes.split_at(self.len);
        match core::str::from_utf8(used) {
            Ok(s) => s,
            // Only `&str`s are copied in, so this needs an over-long name cut inside a non-ASCII
            // character; such a name is invalid anyway and no kernel carries it.
            Err(_) => "",
        }
    }

    /// Whether the name equals `other` (usable in constants).
    #[inline]
    pub const fn eq_str(&self, other: &str) -> bool {
        let (a, b) = (self.as_str().as_bytes(), other.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }
}

impl core::fmt::Debug for KernelName {
    #[inline]
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_tuple("KernelName").field(&self.as_str()).finish()
    }
}

impl core::fmt::Display for KernelName {
    #[inline]
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for KernelName {
    #[inline]
    fn eq(&self, other: &KernelName) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for KernelName {}

/// Whether `s` can be a name fragment: 1 to [`MAX_FRAGMENT`] ASCII letters, digits or `_`.
#[inline]
pub const fn fragment_is_valid(s: &str) -> bool {
    let b = s.as_bytes();
    if b.is_empty() || b.len() > MAX_FRAGMENT {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if !(b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Avg, Sum};

    #[test]
    fn names_follow_the_pattern() {
        assert_eq!(KernelName::reduce::<f32, Sum>(ReduceKernel::Reduce).as_str(), "duralumin_reduce_f32_sum");
        assert_eq!(KernelName::reduce::<half::bf16, Avg>(ReduceKernel::Finish).as_str(), "duralumin_finish_bf16_avg");
        assert!(KernelName::reduce::<u8, Sum>(ReduceKernel::Reduce3).eq_str("duralumin_reduce3_u8_sum"));
        assert!(!KernelName::reduce::<u8, Sum>(ReduceKernel::Reduce3).eq_str("duralumin_reduce3_u8_su"));
    }

    #[test]
    fn fragments_are_checked() {
        assert!(fragment_is_valid("minloc_2"));
        assert!(!fragment_is_valid(""));
        assert!(!fragment_is_valid("min-loc"));
        assert!(!fragment_is_valid("é"));
        let long = [b'x'; MAX_FRAGMENT + 1];
        assert!(!fragment_is_valid(core::str::from_utf8(&long).unwrap()));
        assert!(fragment_is_valid(core::str::from_utf8(&long[1..]).unwrap()));
    }

    #[test]
    fn a_bad_fragment_makes_the_name_invalid_not_a_panic() {
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(C)]
        struct Odd(u8);
        impl Element for Odd {
            const NAME: &'static str = "not ok";
        }
        #[derive(Clone, Copy, Default)]
        struct First;
        impl ReduceOp<Odd> for First {
            const NAME: &'static str = "first";
            fn combine(a: Odd, _: Odd) -> Odd {
                a
            }
        }
        assert!(!KernelName::reduce::<Odd, First>(ReduceKernel::Reduce).is_valid());
    }
}
