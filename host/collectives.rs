//! [`Collectives`]: the operations every backend offers, so code can be written once and run on
//! any backend (as the test sweep is).
//!
//! Each backend implements the trait by forwarding to its own methods, which say exactly what
//! each call guarantees (the Mpi backend's complete before they return; the stream-ordered
//! backends' are queued on the communicator's stream and return at once). The trait holds the
//! blocking (stream-ordered) and in-place forms. Non-blocking forms stay with each backend,
//! since they borrow differently: the Mpi backend's requests live in a
//! [`scope`](crate::scope), the stream-ordered backends' borrow their buffers until they
//! complete on the device. The design is argued in `docs/api.md`.

use duralumin_kernels::{Element, ReduceOp};

use crate::backends::mpi::{AllreduceAlgorithm, BcastAlgorithm};
use crate::error::Result;

/// Passes the list of operations to `$m`: the trait's declaration and each backend's
/// forwarding are generated from this one list. Each argument is `name: type => how`, where
/// `how` names the macro, in scope where `$m` expands, that passes it to the backend's own
/// method (`input`, `output`, or `value`).
macro_rules! for_each_collective {
    ($m:ident) => {
        $m! {
            /// Allreduce: `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank (equal
            /// lengths everywhere); the algorithm is chosen automatically.
            #[doc(alias = "all_reduce")]
            fn allreduce<T: Element, O: ReduceOp<T>>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, op: O => value);
            /// In-place allreduce: `buf` is the input and receives the result.
            fn allreduce_in_place<T: Element, O: ReduceOp<T>>(buf: Self::BufMut<'_, T> => output, op: O => value);
            /// Allreduce with an explicit algorithm (algorithms other than `Native` and `Auto`
            /// need a commutative operator).
            fn allreduce_with<T: Element, O: ReduceOp<T>>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, op: O => value, algorithm: AllreduceAlgorithm => value);
            /// In-place allreduce with an explicit algorithm.
            fn allreduce_in_place_with<T: Element, O: ReduceOp<T>>(buf: Self::BufMut<'_, T> => output, op: O => value, algorithm: AllreduceAlgorithm => value);
            /// Reduce to `root`: at the root `recv` (the length of `send`) receives the
            /// reduction; elsewhere `recv` is not used.
            fn reduce<T: Element, O: ReduceOp<T>>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, root: usize => value, op: O => value);
            /// In-place reduce: `buf` is every rank's input and, at the root, the result.
            fn reduce_in_place<T: Element, O: ReduceOp<T>>(buf: Self::BufMut<'_, T> => output, root: usize => value, op: O => value);
            /// Reduce-scatter: `send` holds `size` blocks of `recv.len()` elements; block `i` of
            /// the reduction lands in rank `i`'s `recv`.
            #[doc(alias = "reduce_scatter_tensor")]
            fn reduce_scatter<T: Element, O: ReduceOp<T>>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, op: O => value);
            /// In-place reduce-scatter: this rank's block of `buf` (`size` blocks) receives its
            /// block of the reduction.
            fn reduce_scatter_in_place<T: Element, O: ReduceOp<T>>(buf: Self::BufMut<'_, T> => output, op: O => value);
            /// Reduce-scatter with per-rank counts: `send` holds the blocks back to back, rank
            /// `i`'s `recv` (of `counts[i]` elements) receives block `i` of the reduction.
            fn reduce_scatterv<T: Element, O: ReduceOp<T>>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, counts: &[usize] => value, op: O => value);
            /// In-place reduce-scatterv: block `i` of `buf` is rank `i`'s result.
            fn reduce_scatterv_in_place<T: Element, O: ReduceOp<T>>(buf: Self::BufMut<'_, T> => output, counts: &[usize] => value, op: O => value);
            /// Broadcast of the root's `buf` into every rank's `buf` (equal lengths).
            #[doc(alias = "broadcast")]
            fn bcast<T: Element>(buf: Self::BufMut<'_, T> => output, root: usize => value);
            /// Broadcast with an explicit algorithm.
            fn bcast_with<T: Element>(buf: Self::BufMut<'_, T> => output, root: usize => value, algorithm: BcastAlgorithm => value);
            /// Allgather: rank `i`'s `send` (`c` elements) lands at `recv[i*c..]` on every rank.
            #[doc(alias = "all_gather")]
            fn allgather<T: Element>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output);
            /// In-place allgather: this rank's block of `buf` (`size * c` elements) is its input.
            fn allgather_in_place<T: Element>(buf: Self::BufMut<'_, T> => output);
            /// Allgatherv: rank `i`'s `send` (`counts[i]` elements) lands at
            /// `recv[displs[i]..]` on every rank.
            fn allgatherv<T: Element>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, counts: &[usize] => value, displs: &[usize] => value);
            /// In-place allgatherv: this rank's block of `buf` is its input.
            fn allgatherv_in_place<T: Element>(buf: Self::BufMut<'_, T> => output, counts: &[usize] => value, displs: &[usize] => value);
            /// All-to-all: block `j` of `send` goes to rank `j`, block `i` of `recv` comes from
            /// rank `i` (`size * c` elements each).
            #[doc(alias = "all_to_all")]
            fn alltoall<T: Element>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output);
            /// In-place all-to-all: block `j` of `buf` goes to rank `j` and is replaced by the
            /// block rank `j` sent.
            fn alltoall_in_place<T: Element>(buf: Self::BufMut<'_, T> => output);
            /// All-to-all with per-rank counts and displacements.
            fn alltoallv<T: Element>(send: Self::Buf<'_, T> => input, send_counts: &[usize] => value, send_displs: &[usize] => value, recv: Self::BufMut<'_, T> => output, recv_counts: &[usize] => value, recv_displs: &[usize] => value);
            /// Gather to `root`: rank `i`'s `send` lands at `recv[i*c..]` on the root; elsewhere
            /// `recv` is not used.
            fn gather<T: Element>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, root: usize => value);
            /// In-place gather: this rank's block of `buf` is its input; the root's `buf`
            /// receives every block.
            fn gather_in_place<T: Element>(buf: Self::BufMut<'_, T> => output, root: usize => value);
            /// Gatherv to `root`: rank `i`'s `send` (`counts[i]` elements) lands at
            /// `recv[displs[i]..]` on the root.
            fn gatherv<T: Element>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, counts: &[usize] => value, displs: &[usize] => value, root: usize => value);
            /// In-place gatherv: this rank's block of `buf` is its input.
            fn gatherv_in_place<T: Element>(buf: Self::BufMut<'_, T> => output, counts: &[usize] => value, displs: &[usize] => value, root: usize => value);
            /// Scatter from `root`: block `i` of the root's `send` lands in rank `i`'s `recv`.
            fn scatter<T: Element>(send: Self::Buf<'_, T> => input, recv: Self::BufMut<'_, T> => output, root: usize => value);
            /// In-place scatter: every rank's block of `buf` receives its block of the root's.
            fn scatter_in_place<T: Element>(buf: Self::BufMut<'_, T> => output, root: usize => value);
            /// Scatterv from `root`: `send[displs[i]..][..counts[i]]` lands in rank `i`'s `recv`.
            fn scatterv<T: Element>(send: Self::Buf<'_, T> => input, counts: &[usize] => value, displs: &[usize] => value, recv: Self::BufMut<'_, T> => output, root: usize => value);
            /// In-place scatterv: every rank's block of `buf` receives its block of the root's.
            fn scatterv_in_place<T: Element>(buf: Self::BufMut<'_, T> => output, counts: &[usize] => value, displs: &[usize] => value, root: usize => value);
            /// Sends `buf` to rank `dest` with `tag`.
            fn send<T: Element>(buf: Self::Buf<'_, T> => input, dest: usize => value, tag: i32 => value);
            /// Receives exactly `buf.len()` elements from rank `source` with `tag`.
            fn recv<T: Element>(buf: Self::BufMut<'_, T> => output, source: usize => value, tag: i32 => value);
            /// Sends `send` to `dest` and receives `recv` from `source` at once.
            fn sendrecv<T: Element>(send: Self::Buf<'_, T> => input, dest: usize => value, recv: Self::BufMut<'_, T> => output, source: usize => value, tag: i32 => value);
            /// Sends `buf` to `dest` and replaces it by as many elements from `source`.
            fn sendrecv_in_place<T: Element>(buf: Self::BufMut<'_, T> => output, dest: usize => value, source: usize => value, tag: i32 => value);
        }
    };
}

/// Declares [`Collectives`] from the list.
macro_rules! declare {
    ($( $(#[$doc:meta])* fn $name:ident <$($g:ident: $b:path),*> ($($arg:ident: $ty:ty => $pass:ident),*); )*) => {
        /// The operations every backend offers, over the backend's own buffers: host slices on
        /// the Mpi backend, device buffers on the stream-ordered ones. Code generic over this
        /// trait runs on any backend. It holds the blocking (on a stream-ordered backend:
        /// stream-ordered) and in-place forms; the non-blocking forms stay with each backend,
        /// since they borrow their buffers differently (`docs/api.md` says why).
        ///
        /// Every operation checks its arguments and returns a typed error, with nothing sent,
        /// on bad input, as the backend's own method does (which each one forwards to; its docs
        /// say which MPI call or algorithm it runs and when it completes).
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
            /// Sends each `(buffer, dest)` of `sends` and receives each `(buffer, source)` of
            /// `recvs`, all at once (Aluminum's MultiSendRecv).
            fn multi_sendrecv<'b, T: Element>(
                &self,
                sends: &[(Self::Buf<'b, T>, usize)],
                recvs: &mut [(Self::BufMut<'b, T>, usize)],
                tag: i32,
            ) -> Result<()>;
            $( $(#[$doc])* fn $name<$($g: $b),*>(&self, $($arg: $ty),*) -> Result<()>; )*
        }
    };
}
for_each_collective!(declare);

/// The trait's operations as calls of the backend's own methods (inherent methods come first
/// in `Self::name` paths). `input`, `output` and `value` must be in scope where it expands.
macro_rules! forward {
    ($( $(#[$doc:meta])* fn $name:ident <$($g:ident: $b:path),*> ($($arg:ident: $ty:ty => $pass:ident),*); )*) => {
        $(
            #[allow(clippy::too_many_arguments, unused_mut)]
            fn $name<$($g: $b),*>(&self, $(mut $arg: $ty),*) -> Result<()> {
                Self::$name(self, $($pass!($arg)),*)
            }
        )*
    };
}

/// Passes an argument as it is.
macro_rules! value {
    ($x:expr) => {
        $x
    };
}

/// The Mpi backend: host slices, forwarded as they are.
mod mpi {
    use super::*;
    use crate::MpiCommunicator;

    macro_rules! input {
        ($x:expr) => {
            $x
        };
    }
    macro_rules! output {
        ($x:expr) => {
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
        fn multi_sendrecv<'b, T: Element>(
            &self,
            sends: &[(&'b [T], usize)],
            recvs: &mut [(&'b mut [T], usize)],
            tag: i32,
        ) -> Result<()> {
            Self::multi_sendrecv(self, sends, recvs, tag)
        }
        for_each_collective!(forward);
    }
}

/// The stream-ordered backends: any device buffer, as a trait object. `$comm<D>` is the
/// communicator type over devices bounded by `$bound`.
macro_rules! stream_ordered {
    ($comm:ident, $bound:path) => {
        macro_rules! input {
            ($x:expr) => {
                &$x
            };
        }
        macro_rules! output {
            ($x:expr) => {
                &mut $x
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
            fn multi_sendrecv<'b, T: Element>(
                &self,
                sends: &[(Self::Buf<'b, T>, usize)],
                recvs: &mut [(Self::BufMut<'b, T>, usize)],
                tag: i32,
            ) -> Result<()> {
                let sends: Vec<_> = sends.iter().map(|(b, peer)| (b, *peer)).collect();
                let mut recvs: Vec<_> = recvs.iter_mut().map(|(b, peer)| (b, *peer)).collect();
                Self::multi_sendrecv(self, &sends, &mut recvs, tag)
            }
            for_each_collective!(forward);
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
