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

/// Reduces on the calling CPU thread with the operator's own `combine`.
#[derive(Debug)]
pub(crate) struct HostReducer<O>(PhantomData<O>);

impl<O> HostReducer<O> {
    pub(crate) fn new() -> Self {
        HostReducer(PhantomData)
    }
}

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
