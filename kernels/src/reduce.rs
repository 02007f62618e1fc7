//! Elementwise reduction bodies: `dst[i] = op(dst[i], src[i])`, `dst[i] = op(a[i], b[i])` and the
//! operator's finishing step (`dst[i] = finish(dst[i], ranks)`, e.g. avg's division).
//!
//! Memory access is what limits these kernels, so they move 16 bytes per load and store where
//! they can: when the element size divides 16 and every buffer has the same offset from a 16-byte
//! boundary, a short scalar head brings the buffers to that boundary, the body moves whole
//! 16-byte vectors (`16 / size_of::<T>()` elements each) and a scalar tail finishes. Anything
//! else (odd-sized user structs, buffers with different misalignments) runs element by element.
//! Either way each element is read and written by exactly one thread.

use core::mem::{MaybeUninit, size_of};

use crate::grid::{Grid, stride};
use crate::{Element, ReduceOp};

/// Bytes moved by one wide load or store.
pub const VECTOR_BYTES: usize = 16;

/// The unit of a wide access: 16 bytes, 16-byte aligned (`ld.global.v4.u32` / `global_load_dwordx4`).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Vector([u32; 4]);

/// Elements of `T` per 16-byte vector (0 when `T` cannot be moved in vectors).
struct Lanes<T>(core::marker::PhantomData<T>);

impl<T> Lanes<T> {
    const N: usize = {
        let size = size_of::<T>();
        if size == 0 || size > VECTOR_BYTES || !VECTOR_BYTES.is_multiple_of(size) { 0 } else { VECTOR_BYTES / size }
    };
}

/// How `n` elements at a set of addresses split into a scalar head, whole vectors and a scalar
/// tail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    /// Elements before the first 16-byte boundary (processed one at a time).
    head: usize,
    /// Whole vectors after the head.
    vectors: usize,
    /// Elements per vector (0 when there are no vectors).
    lanes: usize,
    /// Elements in total.
    n: usize,
}

impl Split {
    /// Elements processed one at a time: the head and the tail.
    #[inline(always)]
    fn scalars(self) -> usize {
        self.n - self.vectors * self.lanes
    }

    /// Element index of the `j`-th scalar (`j < scalars()`).
    #[inline(always)]
    fn scalar_index(self, j: usize) -> usize {
        if j < self.head { j } else { j + self.vectors * self.lanes }
    }
}

/// Splits `n` elements of `T` stored at every address in `addrs` (the first is the output).
#[inline(always)]
fn split<T>(n: usize, addrs: &[usize]) -> Split {
    let size = size_of::<T>();
    let scalar = Split { head: n, vectors: 0, lanes: 0, n };
    if Lanes::<T>::N == 0 {
        return scalar;
    }
    let misalignment = addrs.first().map_or(0, |&a| a % VECTOR_BYTES);
    if addrs.iter().any(|&a| a % VECTOR_BYTES != misalignment) {
        return scalar;
    }
    let head_bytes = (VECTOR_BYTES - misalignment) % VECTOR_BYTES;
    if !head_bytes.is_multiple_of(size) {
        // Elements straddle the 16-byte boundary (e.g. an 8-byte struct at offset 4).
        return scalar;
    }
    let lanes = Lanes::<T>::N;
    let head = if head_bytes / size < n { head_bytes / size } else { n };
    Split { head, vectors: (n - head) / lanes, lanes, n }
}

/// Applies `f` to the elements of `inputs` at every index in `0..n` and stores the result in `out`:
/// `out[i] = f([inputs[0][i], inputs[1][i], ...])`, one thread per element or vector.
///
/// # Safety
/// * `out` is valid for reads and writes of `n` elements of `T`, each input for reads of `n`
///   elements; all are aligned for `T`.
/// * An input may be the same pointer as `out`; otherwise no two of the ranges overlap, and no
///   other thread or device writes them while the launch runs.
#[inline(always)]
unsafe fn map<T: Element, G: Grid, const K: usize>(
    grid: G,
    out: *mut T,
    inputs: [*const T; K],
    n: usize,
    f: impl Fn([T; K]) -> T,
) {
    let mut addrs = [out as usize; 4];
    for (slot, &p) in addrs.iter_mut().skip(1).zip(inputs.iter()) {
        *slot = p as usize;
    }
    let split = split::<T>(n, &addrs[..if K < 4 { K + 1 } else { 4 }]);

    // A compile-time lane count lets the lane loop unroll completely, so the vectors stay in
    // registers (a runtime count keeps them in local memory).
    let lanes = Lanes::<T>::N;
    for v in stride(grid, split.vectors) {
        let first = split.head + v * lanes;
        // SAFETY: `first + lanes <= n`, so each vector lies inside its buffer; `split` only
        // produces vectors when every buffer's element `head` sits on a 16-byte boundary.
        unsafe {
            let loaded: [Vector; K] = core::array::from_fn(|k| inputs[k].add(first).cast::<Vector>().read());
            let mut result = MaybeUninit::<Vector>::uninit();
            for lane in 0..lanes {
                // Lanes are read from the aligned local copies: a Vector is 16-aligned and
                // `size_of::<T>()` divides 16, so lane `lane` is aligned for T, and every bit
                // pattern is a valid T (Pod).
                let args: [T; K] = core::array::from_fn(|k| (&loaded[k] as *const Vector).cast::<T>().add(lane).read());
                result.as_mut_ptr().cast::<T>().add(lane).write(f(args));
            }
            out.add(first).cast::<Vector>().write(result.assume_init());
        }
    }

    for j in stride(grid, split.scalars()) {
        let i = split.scalar_index(j);
        // SAFETY: `scalar_index` maps `0..scalars()` into `0..n` outside the vector body, and the
        // caller guarantees every buffer holds `n` aligned elements.
        unsafe {
            let args: [T; K] = core::array::from_fn(|k| inputs[k].add(i).read());
            out.add(i).write(f(args));
        }
    }
}

/// `dst[i] = O::combine(dst[i], src[i])` for `i` in `0..n`.
///
/// # Safety
/// `dst` is valid for reads and writes of `n` elements, `src` for reads of `n` elements, both
/// aligned for `T`; they do not overlap, and nothing else writes them during the launch.
#[inline(always)]
pub unsafe fn reduce<T: Element, O: ReduceOp<T>, G: Grid>(grid: G, dst: *mut T, src: *const T, n: usize) {
    // SAFETY: forwarded from the caller; `dst` doubles as the first input, which `map` allows.
    unsafe { map(grid, dst, [dst.cast_const(), src], n, |[a, b]| O::combine(a, b)) }
}

/// `dst[i] = O::combine(a[i], b[i])` for `i` in `0..n`.
///
/// # Safety
/// `dst` is valid for writes of `n` elements and `a`, `b` for reads of `n` elements, all aligned
/// for `T`. `dst` may be equal to `a` or `b`; otherwise the ranges do not overlap. Nothing else
/// writes them during the launch.
#[inline(always)]
pub unsafe fn reduce3<T: Element, O: ReduceOp<T>, G: Grid>(grid: G, dst: *mut T, a: *const T, b: *const T, n: usize) {
    // SAFETY: forwarded from the caller.
    unsafe { map(grid, dst, [a, b], n, |[x, y]| O::combine(x, y)) }
}

/// `dst[i] = O::finish(dst[i], ranks)` for `i` in `0..n`; does nothing when the operator has no
/// finishing step ([`ReduceOp::HAS_FINISH`] is false).
///
/// # Safety
/// `dst` is valid for reads and writes of `n` elements aligned for `T`, and nothing else writes it
/// during the launch.
#[inline(always)]
pub unsafe fn finish<T: Element, O: ReduceOp<T>, G: Grid>(grid: G, dst: *mut T, n: usize, ranks: u32) {
    if !O::HAS_FINISH {
        return;
    }
    // SAFETY: forwarded from the caller.
    unsafe { map(grid, dst, [dst.cast_const()], n, |[x]| O::finish(x, ranks)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_uses_vectors_only_when_every_buffer_agrees() {
        // 16-aligned f32 buffers: no head, 4 lanes.
        assert_eq!(split::<f32>(10, &[0, 16]), Split { head: 0, vectors: 2, lanes: 4, n: 10 });
        // Both at offset 4: three scalars up to the boundary.
        assert_eq!(split::<f32>(10, &[4, 36]), Split { head: 3, vectors: 1, lanes: 4, n: 10 });
        // Different misalignments: scalar.
        assert_eq!(split::<f32>(10, &[0, 4]).vectors, 0);
        // An 8-byte element 4 bytes past a boundary straddles it: scalar.
        assert_eq!(split::<[f32; 2]>(10, &[4, 4]).vectors, 0);
        // 12-byte elements never use vectors.
        assert_eq!(split::<[f32; 3]>(10, &[0, 0]).vectors, 0);
        // Fewer elements than the head.
        assert_eq!(split::<u8>(3, &[1, 1]), Split { head: 3, vectors: 0, lanes: 16, n: 3 });
    }

    #[test]
    fn scalar_indices_skip_the_vector_body() {
        let s = Split { head: 3, vectors: 2, lanes: 4, n: 13 };
        let idx: [usize; 5] = core::array::from_fn(|j| s.scalar_index(j));
        assert_eq!(s.scalars(), 5);
        assert_eq!(idx, [0, 1, 2, 11, 12]);
    }
}
