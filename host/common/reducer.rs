//! Reducers: where an algorithm's combining step runs.
//!
//! Algorithms take a [`Reducer`] so the same ring or recursive-doubling code can reduce on the
//! CPU (this module) or, in device backends, with a device kernel.

use std::marker::PhantomData;

use duralumin_kernels::{Element, ReduceOp};

/// Combines received data into a local accumulator.
pub(crate) trait Reducer<T>: Send + Sync {
    /// `acc[i] = combine(acc[i], incoming[i])` for every `i` (equal lengths).
    fn reduce(&self, acc: &mut [T], incoming: &[T]);
    /// `dst[i] = combine(a[i], b[i])` for every `i` (equal lengths).
    fn reduce_into(&self, dst: &mut [T], a: &[T], b: &[T]);
    /// Applies the operator's finishing step for `ranks` contributions (e.g. avg's division).
    fn finish(&self, buf: &mut [T], ranks: u32);
}

/// A reducer behind a reference: the backends pass `&dyn Reducer<T>`, so each algorithm is
/// compiled once per element type rather than once per element and operator (the combining
/// loop, the only part that needs the operator, is called once per segment).
impl<T, R: Reducer<T> + ?Sized> Reducer<T> for &R {
    fn reduce(&self, acc: &mut [T], incoming: &[T]) {
        (**self).reduce(acc, incoming);
    }

    fn reduce_into(&self, dst: &mut [T], a: &[T], b: &[T]) {
        (**self).reduce_into(dst, a, b);
    }

    fn finish(&self, buf: &mut [T], ranks: u32) {
        (**self).finish(buf, ranks);
    }
}

/// The CPU reducer of `O` as a trait object (see the `&R` implementation).
pub(crate) fn host_reducer<T: Element, O: ReduceOp<T>>() -> &'static dyn Reducer<T> {
    &HostReducer::<O>(PhantomData)
}

/// Reduces on the calling CPU thread with the operator's own `combine`.
#[derive(Debug)]
pub(crate) struct HostReducer<O>(PhantomData<O>);

impl<T: Element, O: ReduceOp<T>> Reducer<T> for HostReducer<O> {
    #[inline]
    fn reduce(&self, acc: &mut [T], incoming: &[T]) {
        for (a, &b) in acc.iter_mut().zip(incoming) {
            *a = O::combine(*a, b);
        }
    }

    #[inline]
    fn reduce_into(&self, dst: &mut [T], a: &[T], b: &[T]) {
        for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
            *d = O::combine(x, y);
        }
    }

    fn finish(&self, buf: &mut [T], ranks: u32) {
        if O::HAS_FINISH {
            for x in buf {
                *x = O::finish(*x, ranks);
            }
        }
    }
}
