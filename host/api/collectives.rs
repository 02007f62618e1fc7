//! [`Collectives`]: the operations every backend offers, so code can be written once and run on
//! any backend (as the test sweep is).
//!
//! Each backend implements the trait by forwarding to its own methods, which say exactly what
//! each call guarantees (the Mpi backend's complete before they return; the stream-ordered
//! backends' are queued on the communicator's stream and return at once). The trait holds the
//! blocking (stream-ordered) and in-place forms. Non-blocking forms stay with each backend,
//! since they borrow differently: the Mpi backend's requests live in a
//! [`scope`](crate::scope), the stream-ordered backends' borrow their buffers until they
//! complete on the device. The design is argued in `docs/api.md`. The trait and its
//! implementations are generated from the one list of operations (`crate::for_each_operation`),
//! as each backend's methods are.

use duralumin_kernels::{Element, ReduceOp};

use crate::api::error::Result;

/// A trait method's parameter type for an argument of kind `$kind` (see
/// `crate::for_each_operation`).
macro_rules! param {
    ([in]) => { Self::Buf<'_, T> };
    ([out]) => { Self::BufMut<'_, T> };
    ([ins]) => { &[(Self::Buf<'b, T>, usize)] };
    ([outs]) => { &mut [(Self::BufMut<'b, T>, usize)] };
    ($t:ty) => { $t };
}

/// Declares [`Collectives`] from the list.
macro_rules! declare {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $iname:ident <$($lt:lifetime,)? $($g:ident: $b:path),*> ($($arg:ident: $kind:tt),* $(,)?)
            describe($call:expr => $elem:ident::<$($et:ty),+>) plan($plan:ident($($pa:expr),*));
    )*) => {
        /// The operations every backend offers, over the backend's own buffers: host slices on
        /// the Mpi backend, device buffers on the stream-ordered ones. Code generic over this
        /// trait runs on any backend. It holds the blocking (on a stream-ordered backend:
        /// stream-ordered) and in-place forms; the non-blocking forms stay with each backend,
        /// since they borrow their buffers differently (`docs/api.md` says why).
        ///
        /// Every operation checks its arguments and returns a typed error, with nothing sent,
        /// on bad input, as the backend's own method does (which each one forwards to; its docs
        /// say when it completes, and the backend's module docs which MPI or NCCL call or which
        /// algorithm it runs).
        ///
        /// ```no_run
        /// use duralumin::{Collectives, Result, Sum};
        ///
        /// /// One step of data-parallel training, on any backend.
        /// fn average_gradients<C: Collectives>(comm: &C, grads: C::BufMut<'_, f32>) -> Result<()> {
        ///     comm.allreduce_in_place(grads, Sum)?;
        ///     comm.synchronize()
        /// }
        /// ```
        #[allow(clippy::too_many_arguments)]
        pub trait Collectives {
            /// A buffer of `T` the backend reads (sends from).
            type Buf<'a, T: Element>
            where
                Self: 'a;
            /// A buffer of `T` the backend writes (receives into).
            type BufMut<'a, T: Element>
            where
                Self: 'a;

            /// This process's rank.
            fn rank(&self) -> usize;
            /// The number of ranks.
            fn size(&self) -> usize;
            /// Waits until every operation queued so far has completed and reports an error
            /// one of them had. On the Mpi backend every operation has completed when it
            /// returns, so this only reports an error left by a request nobody waited for.
            fn synchronize(&self) -> Result<()>;
            /// Barrier: no rank passes it (on the Mpi backend) or runs the work queued after it
            /// (on a stream-ordered one) before every rank has reached it.
            fn barrier(&self) -> Result<()>;
            $(
                $(#[$doc])*
                #[allow(unused_parens)]
                fn $name<$($lt,)? $($g: $b),*>(&self, $($arg: param!($kind)),*) -> Result<()>;
            )*
        }
    };
}
crate::for_each_operation!(declare);

/// The trait's operations as calls of the backend's own methods (inherent methods come first
/// in `Self::name` paths). `pass!` must be in scope where it expands: how the backend's
/// method takes an argument of each kind.
macro_rules! forward {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $iname:ident <$($lt:lifetime,)? $($g:ident: $b:path),*> ($($arg:ident: $kind:tt),* $(,)?)
            describe($call:expr => $elem:ident::<$($et:ty),+>) plan($plan:ident($($pa:expr),*));
    )*) => {
        $(
            #[allow(clippy::too_many_arguments, unused_mut, unused_parens)]
            fn $name<$($lt,)? $($g: $b),*>(&self, $(mut $arg: param!($kind)),*) -> Result<()> {
                Self::$name(self, $(pass!($kind, $arg)),*)
            }
        )*
    };
}

/// The Mpi backend: host slices, forwarded as they are.
mod mpi {
    use super::*;
    use crate::MpiCommunicator;

    macro_rules! pass {
        ($kind:tt, $x:ident) => {
            $x
        };
    }

    impl Collectives for MpiCommunicator {
        type Buf<'a, T: Element> = &'a [T];
        type BufMut<'a, T: Element> = &'a mut [T];

        fn rank(&self) -> usize {
            Self::rank(self)
        }
        fn size(&self) -> usize {
            Self::size(self)
        }
        fn synchronize(&self) -> Result<()> {
            self.deferred_error()
        }
        fn barrier(&self) -> Result<()> {
            Self::barrier(self)
        }
        crate::for_each_operation!(forward);
    }
}

/// The stream-ordered backends: any device buffer, as a trait object. `$comm<D>` is the
/// communicator type over devices bounded by `$bound`.
macro_rules! stream_ordered {
    ($comm:ident, $bound:path) => {
        macro_rules! pass {
            ([in], $x:ident) => {
                &$x
            };
            ([out], $x:ident) => {
                &mut $x
            };
            ([ins], $x:ident) => {
                &$x.iter().map(|(b, peer)| (b, *peer)).collect::<Vec<_>>()
            };
            ([outs], $x:ident) => {
                &mut $x.iter_mut().map(|(b, peer)| (b, *peer)).collect::<Vec<_>>()
            };
            ($kind:tt, $x:ident) => {
                $x
            };
        }

        impl<D: $bound> Collectives for $comm<D> {
            type Buf<'a, T: Element> = &'a dyn DeviceSlice<D, Elem = T>;
            type BufMut<'a, T: Element> = &'a mut dyn DeviceSliceMut<D, Elem = T>;

            fn rank(&self) -> usize {
                Self::rank(self)
            }
            fn size(&self) -> usize {
                Self::size(self)
            }
            fn synchronize(&self) -> Result<()> {
                Self::synchronize(self)
            }
            fn barrier(&self) -> Result<()> {
                Self::barrier(self)
            }
            crate::for_each_operation!(forward);
        }
    };
}

/// HostTransfer.
mod host_transfer {
    use super::*;
    use crate::HostTransferCommunicator;
    use crate::device::{Device, DeviceSlice, DeviceSliceMut};

    stream_ordered!(HostTransferCommunicator, Device);
}

/// NCCL.
#[cfg(any(feature = "cuda", feature = "hip"))]
mod nccl {
    use super::*;
    use crate::backends::nccl::{NcclCommunicator, NcclDevice};
    use crate::device::{DeviceSlice, DeviceSliceMut};

    stream_ordered!(NcclCommunicator, NcclDevice);
}
