//! The collectives of the Mpi backend.
//!
//! Each collective is planned once (`plan_*`: argument checks, then either native MPI calls or
//! one of Duralumin's algorithms) and exposed blocking and non-blocking by
//! [`blocking_and_nonblocking!`]. The path is chosen only from values every rank shares (counts
//! that must match, tuning, operator), so all ranks always take the same one:
//! * counts that fit one MPI call go to the MPI library; larger ones are split (elementwise
//!   operations) or run over point-to-point, whose transport splits messages;
//! * gatherv, scatterv and alltoallv always run Duralumin's linear/pairwise algorithms: their
//!   counts are not known on every rank, so no rank could tell whether another one needs the
//!   large-count path (MPI libraries run these linear too).

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use duralumin_kernels::{Element, ReduceOp};

use super::MpiCommunicator;
use super::job::{Job, Mode, NATIVE_UNCHECKED_BYTES, NativeCalls, Post};
use crate::algorithms::hierarchical::{self, Levels};
use crate::algorithms::reduce_scatter::{self, Partials, RingLayout};
use crate::algorithms::{allreduce, bcast, exchange};
use crate::buffer::RawBuf;
use crate::check;
use crate::datatype::{datatype, mpi_op};
use crate::error::{Error, Result};
use crate::ffi::native::Native;
use crate::ffi::{c_rank, in_place, u32_rank};
use crate::reducer::{HostReducer, Reducer};
use crate::reliability::crosscheck::Pairs;
use crate::reliability::recorder::{OpKind, Signature};
use crate::request::{Request, Scope};
use crate::topology::Topology;
use crate::transport::{MpiTransport, OpLabel};

/// Bytes of `elements` elements of `T` (saturating).
fn bytes_of<T>(elements: usize) -> usize {
    elements.saturating_mul(size_of::<T>())
}

/// Whole elements of `T` in a size given in bytes, at least one (a tuning's segment or chunk).
fn elements<T>(bytes: usize) -> usize {
    (bytes / size_of::<T>().max(1)).max(1)
}

/// The most chunks of one hierarchical allreduce in flight at once (see
/// `hierarchical::allreduce`): one in its node-local reduce-scatter, the others on the network or
/// in their allgather.
const HIERARCHICAL_DEPTH: usize = 3;

/// Allreduce algorithms. `Auto` picks by operator, message size and the communicator's shape
/// (see [`super::Tuning`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AllreduceAlgorithm {
    /// On several nodes, recursive doubling below
    /// [`super::Tuning::nodes_recursive_doubling_bytes`] and hierarchical from
    /// [`super::Tuning::hierarchical_allreduce_bytes`] (native between; hierarchical first
    /// where the two overlap); on one, shared memory from
    /// [`super::Tuning::shared_memory_allreduce_bytes`] (a non-blocking call before a blocking
    /// one has made the window: the ring from [`super::Tuning::allreduce_ring_bytes`]), native
    /// below; native for non-commutative operators.
    #[default]
    Auto,
    /// The MPI library's `MPI_Allreduce`.
    Native,
    /// Pipelined ring: reduce-scatter then allgather around the ring.
    Ring,
    /// Recursive doubling (full-buffer exchanges, `log2 n` steps).
    RecursiveDoubling,
    /// Rabenseifner: recursive-halving reduce-scatter, recursive-doubling allgather.
    Rabenseifner,
    /// Two-level: node-local reduce-scatter, cross-node allreduce of each slice by all ranks
    /// that hold it, node-local allgather (see [`crate::Topology`] and `docs/topology.md`).
    Hierarchical,
    /// One node only: the ranks reduce through an MPI-3 shared-memory window
    /// (`MPI_Win_allocate_shared`), pipelined in chunks of at most 1 MiB per rank: each rank
    /// stages the parts of its input the others reduce, reduces its own slice straight from
    /// the others' staged parts in rank order (so any operator works, commutative or not),
    /// and every rank copies the results out. The first use on a communicator makes the window,
    /// collectively over the node. [`Error::AlgorithmUnsupported`] if the ranks span several
    /// nodes.
    SharedMemory,
}

/// Broadcast algorithms. `Auto` picks by message size and the communicator's shape (see
/// [`super::Tuning`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BcastAlgorithm {
    /// On several nodes, hierarchical from [`super::Tuning::hierarchical_bcast_bytes`]; on one,
    /// chain from [`super::Tuning::bcast_chain_bytes`] with 3 ranks or more; native otherwise.
    #[default]
    Auto,
    /// The MPI library's `MPI_Bcast`.
    Native,
    /// Pipelined chain (chunks flow `root -> root+1 -> ...`).
    Chain,
    /// Two-level pipeline: a chain of node leaders, each forwarding down a chain through its
    /// own node at once, so the network carries the buffer once per node.
    Hierarchical,
}

impl BcastAlgorithm {
    pub(crate) fn name(self) -> &'static str {
        match self {
            BcastAlgorithm::Auto => "auto",
            BcastAlgorithm::Native => "native",
            BcastAlgorithm::Chain => "chain",
            BcastAlgorithm::Hierarchical => "hierarchical",
        }
    }
}

impl AllreduceAlgorithm {
    /// Whether the algorithm can reduce with `O`: only `Auto`, `Native` and `SharedMemory` keep
    /// the rank order a non-commutative operator needs.
    pub(crate) fn check_operator<T: Element, O: ReduceOp<T>>(self) -> Result<()> {
        match self {
            AllreduceAlgorithm::Auto | AllreduceAlgorithm::Native | AllreduceAlgorithm::SharedMemory => Ok(()),
            a if !O::COMMUTATIVE => {
                Err(Error::AlgorithmUnsupported { algorithm: a.name(), reason: "the operator is not commutative" })
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            AllreduceAlgorithm::Auto => "auto",
            AllreduceAlgorithm::Native => "native",
            AllreduceAlgorithm::Ring => "ring",
            AllreduceAlgorithm::RecursiveDoubling => "recursive doubling",
            AllreduceAlgorithm::Rabenseifner => "rabenseifner",
            AllreduceAlgorithm::Hierarchical => "hierarchical",
            AllreduceAlgorithm::SharedMemory => "shared memory",
        }
    }
}

fn cptr<T>(s: &[T]) -> *const c_void {
    crate::buffer::address(s).cast_const().cast()
}

/// `p + off` elements, as a void pointer for MPI.
fn at<T>(p: RawBuf<T>, off: usize) -> *mut c_void {
    p.block(off, 0).ptr().cast()
}

/// `n` as an MPI count. Callers pass counts already checked against
/// `max_message_elements <= c_int::MAX`; one that is not is an error, never a smaller count.
fn cnt(n: usize) -> Result<c_int> {
    c_int::try_from(n).map_err(|_| Error::CountOverflow { what: "MPI count", value: n as u128 })
}

/// [`cnt`] of every entry.
fn cnts(v: &[usize]) -> Result<Vec<c_int>> {
    v.iter().map(|&n| cnt(n)).collect()
}

fn finish_slice<T: Element, O: ReduceOp<T>>(s: &mut [T], ranks: u32) {
    for x in s {
        *x = O::finish(*x, ranks);
    }
}

/// The finishing step of `O` on `buf`, if it has one.
fn finish<T: Element, O: ReduceOp<T>>(buf: RawBuf<T>, ranks: usize) -> Option<Post<T>> {
    O::HAS_FINISH.then_some(Post::Finish { buf, f: finish_slice::<T, O>, ranks: u32_rank(ranks) })
}

/// `(offset, len)` pieces of at most `max` elements; at least one piece.
fn pieces(len: usize, max: usize) -> impl Iterator<Item = (usize, usize)> {
    crate::algorithms::segments(len, max)
}

/// Emits the blocking and the non-blocking public method of an operation from its plan.
///
/// `sig(|c| ..)` is the operation's [`Signature`] (what the flight recorder keeps and the
/// signature check compares), `pairs(|c| ..)` its per-pair counts for the check where counts
/// are per pair, and `bufs(..)` the buffers it reads (`read`, `reads` for a list of `(buffer,
/// peer)`) and writes (`write`, `writes`): on a communicator whose operations may be abandoned
/// ([`Monitor::guarded`](crate::reliability::monitor::Monitor::guarded)), MPI works on copies of
/// those ([`super::shadow`]).
macro_rules! blocking_and_nonblocking {
    ($(
        $(#[$doc:meta])*
        fn $name:ident / $iname:ident <$($g:ident : $bound:path),*> ($($arg:ident : $ty:ty),* $(,)?)
            sig($sig:expr) $(pairs($pairs:expr))? bufs($($kind:ident $buf:ident),*)
            => $plan:ident ($($pa:expr),* $(,)?);
    )*) => {$(
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)]
        pub fn $name<'buf, $($g: $bound),*>(&self, $($arg: $ty),*) -> Result<()> {
            let sig: crate::reliability::recorder::Signature = ($sig)(self);
            let pairs: Option<crate::reliability::crosscheck::Pairs> =
                if self.checks(&sig) { None $(.or_else(|| Some(($pairs)(self))))? } else { None };
            let op = self.begin(sig)?;
            if self.core.monitor.guarded() {
                let mut shadow = super::shadow::Shadow::default();
                $(shadow!(shadow, $kind $buf);)*
                let job = self.prepare(op, &sig, pairs, || self.$plan($($pa,)* Mode::NonBlocking))?;
                return self.run_shadowed(op, job, shadow);
            }
            let job = self.prepare(op, &sig, pairs, || self.$plan($($pa,)* Mode::Blocking))?;
            self.run_op(op, job)
        }

        #[doc = concat!("Non-blocking [`", stringify!($name), "`](Self::", stringify!($name), "): starts the \
            operation and returns a [`Request`]. The buffers stay borrowed until the request \
            completes (at the latest when the [`Scope`] ends); the operation progresses on the \
            progress thread meanwhile.")]
        #[allow(clippy::too_many_arguments)]
        pub fn $iname<'s, 'buf: 's, $($g: $bound),*>(
            &'s self,
            scope: &'s Scope<'s, '_>,
            $($arg: $ty),*
        ) -> Result<Request<'s>> {
            let sig: crate::reliability::recorder::Signature = ($sig)(self);
            let pairs: Option<crate::reliability::crosscheck::Pairs> =
                if self.checks(&sig) { None $(.or_else(|| Some(($pairs)(self))))? } else { None };
            let op = self.begin(sig)?;
            if self.core.monitor.guarded() {
                let mut shadow = super::shadow::Shadow::default();
                $(shadow!(shadow, $kind $buf);)*
                let job = self.prepare(op, &sig, pairs, || self.$plan($($pa,)* Mode::NonBlocking))?;
                return self.start_op(scope, op, job, Some(shadow));
            }
            let job = self.prepare(op, &sig, pairs, || self.$plan($($pa,)* Mode::NonBlocking))?;
            self.start_op(scope, op, job, None)
        }
    )*};
}

/// Rebinds a buffer argument to its copy in a [`super::shadow::Shadow`].
macro_rules! shadow {
    ($sh:ident, read $b:ident) => {
        // SAFETY: the copy is used by this operation alone, which completes before the shadow
        // is committed or dropped (or is abandoned with it).
        let $b = unsafe { $sh.read($b) };
    };
    ($sh:ident, write $b:ident) => {
        // SAFETY: as for `read`; the caller's buffer stays borrowed by the public method (or
        // its scope) until the commit.
        let $b = unsafe { $sh.write($b) };
    };
    ($sh:ident, reads $b:ident) => {
        // SAFETY: as for `read`, for every buffer of the list.
        let copies = unsafe { $sh.reads($b) };
        let $b = &copies[..];
    };
    ($sh:ident, writes $b:ident) => {
        // SAFETY: as for `write`, for every buffer of the list.
        let mut copies = unsafe { $sh.writes($b) };
        let $b = &mut copies[..];
    };
}
pub(super) use blocking_and_nonblocking;
pub(super) use shadow;

impl MpiCommunicator {
    fn fits(&self, n: usize) -> bool {
        n <= self.tuning.max_message_elements
    }

    /// The native calls of an elementwise operation on `n` elements: `call(offset, len)` for
    /// each piece of at most `max_message_elements` (one, but for the largest).
    fn native_pieces(&self, n: usize, mut call: impl FnMut(usize, usize) -> Result<Native>) -> Result<NativeCalls> {
        if self.fits(n) {
            return Ok(smallvec::smallvec![call(0, n)?]);
        }
        pieces(n, self.tuning.max_message_elements).map(|(off, len)| call(off, len)).collect()
    }

    /// A transport of its own (a tag of its own) for the current operation's messages.
    pub(crate) fn transport<T: Element>(&self, mode: Mode) -> Result<MpiTransport> {
        let dt = datatype::<T>()?;
        let tag = self.next_tag(self.current_hash());
        let label =
            self.current.get().map(|(op, _)| OpLabel { name: op.kind.name(), seq: op.seq, layout: self.core.tags });
        let x = MpiTransport::new(
            (self.core.algo, &self.core.algo_matcher),
            dt,
            tag,
            (self.rank(), self.size()),
            self.tuning.max_message_elements,
            mode == Mode::Blocking,
        );
        Ok(x.for_op(label, self.on_error()).with_network(self.network_pieces::<T>()))
    }

    /// The transports of an operation run in `chunks` pipelined chunks
    /// (`hierarchical::in_chunks`): one per chunk in flight, each with its own tag. With
    /// several, they poll (`MPI_Test`) even in a blocking call: a transport that waits
    /// (`MPI_Wait`) would finish each chunk before the next could start.
    fn chunk_transports<T: Element>(&self, mode: Mode, chunks: usize) -> Result<Vec<MpiTransport>> {
        let depth = chunks.clamp(1, HIERARCHICAL_DEPTH);
        let mut xs = (0..depth).map(|_| self.transport::<T>(mode)).collect::<Result<Vec<_>>>()?;
        if depth > 1 {
            xs.iter_mut().for_each(|x| x.blocking = false);
        }
        Ok(xs)
    }

    /// What [`MpiTransport::network`] needs: `None` on one node.
    fn network_pieces<T>(&self) -> Option<(Arc<Topology>, usize)> {
        let elements = elements::<T>(self.tuning.network_message_bytes);
        (self.topology.node_count() > 1).then(|| (Arc::clone(&self.topology), elements))
    }

    blocking_and_nonblocking! {
        /// Allreduce (`MPI_Allreduce`): `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every
        /// rank. `send` and `recv` have equal lengths on every rank. The algorithm is chosen by
        /// size ([`AllreduceAlgorithm::Auto`]).
        #[doc(alias = "all_reduce")]
        fn allreduce / iallreduce <T: Element, O: ReduceOp<T>> (send: &'buf [T], recv: &'buf mut [T], op: O)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(send.len())) bufs(read send, write recv)
            => plan_allreduce(Some(send), recv, op, AllreduceAlgorithm::Auto);
        /// In-place allreduce: `buf` is both the input and the result.
        fn allreduce_in_place / iallreduce_in_place <T: Element, O: ReduceOp<T>> (buf: &'buf mut [T], op: O)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(buf.len()).in_place()) bufs(write buf)
            => plan_allreduce(None, buf, op, AllreduceAlgorithm::Auto);
        /// Allreduce with an explicit algorithm. Algorithms other than `Native` and `Auto`
        /// need a commutative operator ([`Error::AlgorithmUnsupported`] otherwise).
        fn allreduce_with / iallreduce_with <T: Element, O: ReduceOp<T>>
            (send: &'buf [T], recv: &'buf mut [T], op: O, algorithm: AllreduceAlgorithm)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(send.len()).algorithm(algorithm.name()))
            bufs(read send, write recv)
            => plan_allreduce(Some(send), recv, op, algorithm);
        /// In-place allreduce with an explicit algorithm.
        fn allreduce_in_place_with / iallreduce_in_place_with <T: Element, O: ReduceOp<T>>
            (buf: &'buf mut [T], op: O, algorithm: AllreduceAlgorithm)
            sig(|_| Signature::new(OpKind::Allreduce).reduce::<T, O>().count(buf.len()).algorithm(algorithm.name()).in_place())
            bufs(write buf)
            => plan_allreduce(None, buf, op, algorithm);

        /// Reduce (`MPI_Reduce`) to `root`: at the root `recv` (as long as `send`) receives the
        /// reduction; elsewhere `recv` is not used (pass `&mut []`).
        fn reduce / ireduce <T: Element, O: ReduceOp<T>> (send: &'buf [T], recv: &'buf mut [T], root: usize, op: O)
            sig(|_| Signature::new(OpKind::Reduce).reduce::<T, O>().count(send.len()).root(root)) bufs(read send, write recv)
            => plan_reduce(Some(send), recv, root, op);
        /// In-place reduce: `buf` is every rank's input; at the root it receives the result,
        /// elsewhere it is left unchanged.
        fn reduce_in_place / ireduce_in_place <T: Element, O: ReduceOp<T>> (buf: &'buf mut [T], root: usize, op: O)
            sig(|_| Signature::new(OpKind::Reduce).reduce::<T, O>().count(buf.len()).root(root).in_place()) bufs(write buf)
            => plan_reduce(None, buf, root, op);

        /// Broadcast (`MPI_Bcast`) of `buf` from `root`; `buf` has the same length everywhere.
        #[doc(alias = "broadcast")]
        fn bcast / ibcast <T: Element> (buf: &'buf mut [T], root: usize)
            sig(|_| Signature::new(OpKind::Bcast).elem::<T>().count(buf.len()).root(root)) bufs(write buf)
            => plan_bcast(buf, root, BcastAlgorithm::Auto);
        /// Broadcast with an explicit algorithm.
        fn bcast_with / ibcast_with <T: Element> (buf: &'buf mut [T], root: usize, algorithm: BcastAlgorithm)
            sig(|_| Signature::new(OpKind::Bcast).elem::<T>().count(buf.len()).root(root).algorithm(algorithm.name()))
            bufs(write buf)
            => plan_bcast(buf, root, algorithm);

        /// Allgather (`MPI_Allgather`): rank `i`'s `send` lands at `recv[i*c..(i+1)*c]` on every
        /// rank, `c = send.len()`, `recv.len() == size * c`.
        #[doc(alias = "all_gather")]
        fn allgather / iallgather <T: Element> (send: &'buf [T], recv: &'buf mut [T])
            sig(|_| Signature::new(OpKind::Allgather).elem::<T>().count(send.len())) bufs(read send, write recv)
            => plan_allgather(Some(send), recv);
        /// In-place allgather: this rank's block of `buf` (length `size * c`) is its input.
        fn allgather_in_place / iallgather_in_place <T: Element> (buf: &'buf mut [T])
            sig(|c: &Self| Signature::new(OpKind::Allgather).elem::<T>().count(buf.len() / c.size()).in_place())
            bufs(write buf)
            => plan_allgather(None, buf);

        /// Allgatherv (`MPI_Allgatherv`): rank `i`'s `send` (of `counts[i]` elements) lands at
        /// `recv[displs[i]..]`. Receive blocks must not overlap.
        fn allgatherv / iallgatherv <T: Element>
            (send: &'buf [T], recv: &'buf mut [T], counts: &[usize], displs: &[usize])
            sig(|_| Signature::new(OpKind::Allgatherv).elem::<T>().counts(counts)) bufs(read send, write recv)
            => plan_allgatherv(Some(send), recv, counts, displs);
        /// In-place allgatherv: this rank's block of `buf` is its input.
        fn allgatherv_in_place / iallgatherv_in_place <T: Element>
            (buf: &'buf mut [T], counts: &[usize], displs: &[usize])
            sig(|_| Signature::new(OpKind::Allgatherv).elem::<T>().counts(counts).in_place()) bufs(write buf)
            => plan_allgatherv(None, buf, counts, displs);

        /// All-to-all (`MPI_Alltoall`): block `j` of `send` goes to rank `j`, block `i` of
        /// `recv` comes from rank `i`; both have `size * c` elements.
        #[doc(alias = "all_to_all")]
        fn alltoall / ialltoall <T: Element> (send: &'buf [T], recv: &'buf mut [T])
            sig(|_| Signature::new(OpKind::Alltoall).elem::<T>().count(send.len())) bufs(read send, write recv)
            => plan_alltoall(Some(send), recv);
        /// In-place all-to-all: block `j` of `buf` is sent to rank `j` and replaced by the
        /// block rank `j` sent.
        fn alltoall_in_place / ialltoall_in_place <T: Element> (buf: &'buf mut [T])
            sig(|_| Signature::new(OpKind::Alltoall).elem::<T>().count(buf.len()).in_place()) bufs(write buf)
            => plan_alltoall(None, buf);

        /// All-to-all with per-rank counts and displacements (`MPI_Alltoallv`):
        /// `send[send_displs[j]..][..send_counts[j]]` goes to rank `j`,
        /// `recv[recv_displs[i]..][..recv_counts[i]]` comes from rank `i`.
        fn alltoallv / ialltoallv <T: Element> (
            send: &'buf [T], send_counts: &[usize], send_displs: &[usize],
            recv: &'buf mut [T], recv_counts: &[usize], recv_displs: &[usize],
        ) sig(|_| Signature::new(OpKind::Alltoallv).elem::<T>().count(send.len()))
          pairs(|c: &Self| Pairs::alltoallv(c.size(), send_counts, recv_counts)) bufs(read send, write recv)
          => plan_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs);

        /// Gather (`MPI_Gather`) to `root`: rank `i`'s `send` lands at `recv[i*c..]` on the
        /// root (`recv.len() == size * c`); `recv` is not used elsewhere (pass `&mut []`).
        fn gather / igather <T: Element> (send: &'buf [T], recv: &'buf mut [T], root: usize)
            sig(|_| Signature::new(OpKind::Gather).elem::<T>().count(send.len()).root(root)) bufs(read send, write recv)
            => plan_gather(Some(send), recv, root);
        /// In-place gather: at the root `buf` has `size * c` elements with its own block in
        /// place; elsewhere `buf` is the `c`-element contribution (only read).
        fn gather_in_place / igather_in_place <T: Element> (buf: &'buf mut [T], root: usize)
            sig(|c: &Self| Signature::new(OpKind::Gather).elem::<T>().block_count(buf.len(), c.rank(), root, c.size()).root(root).in_place())
            bufs(write buf)
            => plan_gather(None, buf, root);

        /// Gatherv (`MPI_Gatherv`) to `root`: rank `i`'s `send` lands at
        /// `recv[displs[i]..][..counts[i]]` on the root. `counts` and `displs` are used at the
        /// root only (pass `&[]` elsewhere).
        fn gatherv / igatherv <T: Element>
            (send: &'buf [T], recv: &'buf mut [T], counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Gatherv).elem::<T>().count(send.len()).root(root))
            pairs(|c: &Self| Pairs::gatherv(c.size(), c.rank(), root, send.len(), counts)) bufs(read send, write recv)
            => plan_gatherv(Some(send), recv, counts, displs, root);
        /// In-place gatherv: the root's own block is already in place in `buf`; elsewhere
        /// `buf` is the contribution (only read).
        fn gatherv_in_place / igatherv_in_place <T: Element>
            (buf: &'buf mut [T], counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Gatherv).elem::<T>().count(buf.len()).root(root).in_place())
            pairs(|c: &Self| Pairs::gatherv(c.size(), c.rank(), root, buf.len(), counts)) bufs(write buf)
            => plan_gatherv(None, buf, counts, displs, root);

        /// Scatter (`MPI_Scatter`) from `root`: block `i` of the root's `send`
        /// (`send.len() == size * recv.len()`) lands in rank `i`'s `recv`; `send` is not used
        /// elsewhere (pass `&[]`).
        fn scatter / iscatter <T: Element> (send: &'buf [T], recv: &'buf mut [T], root: usize)
            sig(|_| Signature::new(OpKind::Scatter).elem::<T>().count(recv.len()).root(root)) bufs(read send, write recv)
            => plan_scatter(Some(send), recv, root);
        /// In-place scatter: at the root `buf` holds all `size` blocks and keeps its own;
        /// elsewhere `buf` receives the block.
        fn scatter_in_place / iscatter_in_place <T: Element> (buf: &'buf mut [T], root: usize)
            sig(|c: &Self| Signature::new(OpKind::Scatter).elem::<T>().block_count(buf.len(), c.rank(), root, c.size()).root(root).in_place())
            bufs(write buf)
            => plan_scatter(None, buf, root);

        /// Scatterv (`MPI_Scatterv`) from `root`: `send[displs[i]..][..counts[i]]` lands in rank
        /// `i`'s `recv`. `send`, `counts` and `displs` are used at the root only.
        fn scatterv / iscatterv <T: Element>
            (send: &'buf [T], counts: &[usize], displs: &[usize], recv: &'buf mut [T], root: usize)
            sig(|_| Signature::new(OpKind::Scatterv).elem::<T>().count(recv.len()).root(root))
            pairs(|c: &Self| Pairs::scatterv(c.size(), c.rank(), root, recv.len(), counts)) bufs(read send, write recv)
            => plan_scatterv(Some(send), counts, displs, recv, root);
        /// In-place scatterv: at the root `buf` is the send buffer and its own block stays in
        /// place; elsewhere `buf` receives the block.
        fn scatterv_in_place / iscatterv_in_place <T: Element>
            (buf: &'buf mut [T], counts: &[usize], displs: &[usize], root: usize)
            sig(|_| Signature::new(OpKind::Scatterv).elem::<T>().count(buf.len()).root(root).in_place())
            pairs(|c: &Self| Pairs::scatterv(c.size(), c.rank(), root, buf.len(), counts)) bufs(write buf)
            => plan_scatterv(None, counts, displs, buf, root);

        /// Reduce-scatter with equal blocks (`MPI_Reduce_scatter_block` semantics): `send` has
        /// `size * c` elements and rank `i` receives the reduction of block `i` in `recv`
        /// (`c` elements).
        #[doc(alias = "reduce_scatter_tensor")]
        fn reduce_scatter / ireduce_scatter <T: Element, O: ReduceOp<T>> (send: &'buf [T], recv: &'buf mut [T], op: O)
            sig(|_| Signature::new(OpKind::ReduceScatter).reduce::<T, O>().count(recv.len())) bufs(read send, write recv)
            => plan_reduce_scatter(Some(send), recv, op);
        /// In-place reduce-scatter: `buf` (`size * c` elements) is the input; the result for
        /// this rank is written to `buf[..c]` (MPI's `MPI_IN_PLACE` convention).
        fn reduce_scatter_in_place / ireduce_scatter_in_place <T: Element, O: ReduceOp<T>> (buf: &'buf mut [T], op: O)
            sig(|c: &Self| Signature::new(OpKind::ReduceScatter).reduce::<T, O>().count(buf.len() / c.size()).in_place())
            bufs(write buf)
            => plan_reduce_scatter(None, buf, op);

        /// Reduce-scatter with per-rank counts (`MPI_Reduce_scatter`): `send` holds the blocks
        /// back to back (`sum(counts)` elements), rank `i` receives block `i` (`counts[i]`).
        fn reduce_scatterv / ireduce_scatterv <T: Element, O: ReduceOp<T>>
            (send: &'buf [T], recv: &'buf mut [T], counts: &[usize], op: O)
            sig(|_| Signature::new(OpKind::ReduceScatterv).reduce::<T, O>().counts(counts)) bufs(read send, write recv)
            => plan_reduce_scatterv(Some(send), recv, counts, op);
        /// In-place reduce-scatterv: `buf` (`sum(counts)` elements) is the input; the result is
        /// written to `buf[..counts[rank]]`.
        fn reduce_scatterv_in_place / ireduce_scatterv_in_place <T: Element, O: ReduceOp<T>>
            (buf: &'buf mut [T], counts: &[usize], op: O)
            sig(|_| Signature::new(OpKind::ReduceScatterv).reduce::<T, O>().counts(counts).in_place()) bufs(write buf)
            => plan_reduce_scatterv(None, buf, counts, op);
    }

    /// Barrier (`MPI_Barrier`): returns once every rank has entered it.
    pub fn barrier(&self) -> Result<()> {
        let sig = Signature::new(OpKind::Barrier);
        let op = self.begin(sig)?;
        let job = self.prepare(op, &sig, None, || self.plan_barrier::<u8>())?;
        if self.core.monitor.guarded() {
            return self.run_shadowed(op, job, super::shadow::Shadow::default());
        }
        self.run_op(op, job)
    }

    /// Non-blocking barrier (`MPI_Ibarrier`).
    pub fn ibarrier<'s>(&'s self, scope: &'s Scope<'s, '_>) -> Result<Request<'s>> {
        let sig = Signature::new(OpKind::Barrier);
        let op = self.begin(sig)?;
        let job = self.prepare(op, &sig, None, || self.plan_barrier::<u8>())?;
        let shadow = self.core.monitor.guarded().then(super::shadow::Shadow::default);
        self.start_op(scope, op, job, shadow)
    }

    pub(crate) fn plan_barrier<T>(&self) -> Result<Job<T>> {
        Ok(Job::native(datatype::<u8>()?, Native::Barrier, 0))
    }

    pub(crate) fn plan_allreduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        _op: O,
        algorithm: AllreduceAlgorithm,
        mode: Mode,
    ) -> Result<Job<T>> {
        if let Some(s) = send {
            check::len("allreduce receive buffer", recv.len(), s.len())?;
        }
        let bytes = recv.len().saturating_mul(size_of::<T>());
        algorithm.check_operator::<T, O>()?;
        let algorithm = match algorithm {
            AllreduceAlgorithm::Auto => self.auto_allreduce::<T, O>(bytes, mode),
            a => a,
        };
        let out = RawBuf::from_mut(recv);
        match algorithm {
            AllreduceAlgorithm::Native => self.native_allreduce::<T, O>(send, out),
            AllreduceAlgorithm::SharedMemory => super::shm::plan_allreduce::<T, O>(self, send, out, mode),
            _ => self.own_allreduce::<T, O>(send, out, algorithm, mode),
        }
    }

    /// The MPI library's allreduce, in pieces of at most the tuning's message size.
    fn native_allreduce<T: Element, O: ReduceOp<T>>(&self, send: Option<&[T]>, out: RawBuf<T>) -> Result<Job<T>> {
        let (dt, op, n) = (datatype::<T>()?, mpi_op::<T, O>()?, out.len());
        let calls = self.native_pieces(n, |off, len| {
            Ok(Native::Allreduce {
                send: send.map_or(in_place().cast_const(), |s| at(RawBuf::from_ref(s), off).cast_const()),
                recv: at(out, off),
                count: cnt(len)?,
                op,
            })
        })?;
        let post = finish::<T, O>(out, self.size()).into_iter().collect();
        Ok(Job::natives(dt, calls, post, n.saturating_mul(size_of::<T>())))
    }

    /// Duralumin's own allreduce algorithms: the ring, recursive doubling, Rabenseifner's, and
    /// the hierarchical pipeline.
    fn own_allreduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        out: RawBuf<T>,
        algorithm: AllreduceAlgorithm,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = out.len();
        let input = send.map(RawBuf::from_ref);
        let core = Arc::clone(&self.core);
        let seg = self.segment::<T>();
        let reads_input = matches!(algorithm, AllreduceAlgorithm::Ring | AllreduceAlgorithm::Hierarchical);
        let levels = (algorithm == AllreduceAlgorithm::Hierarchical).then(|| Levels::new(&self.topology, self.rank()));
        // One transport for a flat algorithm; one per chunk in flight for the hierarchical
        // pipeline.
        let chunk = elements::<T>(self.tuning.hierarchical_chunk_bytes);
        let xs = self.chunk_transports::<T>(mode, if levels.is_some() { n.div_ceil(chunk) } else { 1 })?;
        Ok(Job::Future(Box::pin(async move {
            let x = xs.first().ok_or(Error::Progress("an allreduce without a transport"))?;
            if let (Some(input), false) = (input, reads_input) {
                // SAFETY: the public method borrows `send` and `recv` (distinct slices) for the
                // whole operation. The ring reads its input in place instead.
                unsafe { out.copy_from(input) };
            }
            let r = HostReducer::<O>::new();
            // The ring's two segment slots; the hierarchical pipeline's for each chunk in flight.
            let slots = if levels.is_some() { n.min(chunk).min(2 * seg) * xs.len() } else { n.min(2 * seg) };
            let scratch_len = if reads_input { slots } else { n };
            let mut scratch = core.scratch.take::<T>(scratch_len)?;
            let tmp = scratch.raw();
            // SAFETY: `out` is borrowed by the operation and `tmp` is its own scratch: valid,
            // exclusive and disjoint until completion.
            unsafe {
                match (algorithm, &levels) {
                    (_, Some(lv)) => hierarchical::allreduce(&xs, &r, lv, input, out, tmp, seg, chunk).await?,
                    (AllreduceAlgorithm::Ring, _) => allreduce::ring(x, &r, input, out, tmp, seg).await?,
                    (AllreduceAlgorithm::RecursiveDoubling, _) => {
                        allreduce::recursive_doubling(x, &r, out, tmp).await?
                    }
                    _ => allreduce::rabenseifner(x, &r, out, tmp).await?,
                }
                r.finish(out.as_mut_slice(), u32_rank(x.size));
            }
            Ok(())
        })))
    }

    pub(crate) fn plan_reduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
        _op: O,
        mode: Mode,
    ) -> Result<Job<T>> {
        check::rank("reduce root", root, self.size())?;
        let is_root = self.rank() == root;
        let n = match send {
            Some(s) => {
                if is_root {
                    check::len("reduce receive buffer", recv.len(), s.len())?;
                }
                s.len()
            }
            None => recv.len(),
        };
        let out = RawBuf::from_mut(recv);
        let input = send.map(RawBuf::from_ref);
        if self.use_reduce_ring::<T, O>(n, self.tuning.reduce_root_ring_bytes) {
            return self.ring_reduce::<T, O>(input, out, n, root, mode);
        }
        let dt = datatype::<T>()?;
        let op = mpi_op::<T, O>()?;
        let calls = self.native_pieces(n, |off, len| {
            let (s, r) = match (input, is_root) {
                (Some(i), true) => (at(i, off), at(out, off)),
                (Some(i), false) => (at(i, off), std::ptr::null_mut()),
                (None, true) => (in_place(), at(out, off)),
                (None, false) => (at(out, off), std::ptr::null_mut()),
            };
            Ok(Native::Reduce { send: s.cast_const(), recv: r, count: cnt(len)?, op, root: c_rank(root) })
        })?;
        let post = if is_root { finish::<T, O>(out, self.size()) } else { None };
        Ok(Job::natives(dt, calls, post.into_iter().collect(), bytes_of::<T>(n)))
    }

    pub(crate) fn plan_bcast<T: Element>(
        &self,
        buf: &mut [T],
        root: usize,
        algorithm: BcastAlgorithm,
        mode: Mode,
    ) -> Result<Job<T>> {
        check::rank("bcast root", root, self.size())?;
        let bytes = buf.len().saturating_mul(size_of::<T>());
        let algorithm = match algorithm {
            BcastAlgorithm::Auto => self.auto_bcast(bytes),
            a => a,
        };
        let out = RawBuf::from_mut(buf);
        if algorithm == BcastAlgorithm::Native {
            let calls = self.native_pieces(out.len(), |off, len| {
                Ok(Native::Bcast { buf: at(out, off), count: cnt(len)?, root: c_rank(root) })
            })?;
            return Ok(Job::natives(datatype::<T>()?, calls, Vec::new(), bytes));
        }
        let x = self.transport::<T>(mode)?;
        let chunk = elements::<T>(self.tuning.bcast_chunk_bytes);
        if algorithm == BcastAlgorithm::Hierarchical {
            let topology = Arc::clone(&self.topology);
            return Ok(Job::Future(Box::pin(async move {
                // SAFETY: `buf` is borrowed by the public method for the whole operation.
                unsafe { hierarchical::bcast(&x, &topology, out, root, chunk).await }
            })));
        }
        // SAFETY: as above.
        Ok(Job::Future(Box::pin(async move { unsafe { bcast::chain(&x, out, root, chunk).await } })))
    }

    pub(crate) fn plan_allgather<T: Element>(&self, send: Option<&[T]>, recv: &mut [T], mode: Mode) -> Result<Job<T>> {
        let n = self.size();
        let count = match send {
            Some(s) => {
                check::len("allgather receive buffer", recv.len(), check::product("allgather", s.len(), n)?)?;
                s.len()
            }
            None => check::divisible("allgather buffer (size * count)", recv.len(), n)?,
        };
        let out = RawBuf::from_mut(recv);
        let bytes = out.len().saturating_mul(size_of::<T>());
        if self.use_two_level(bytes, self.tuning.hierarchical_allgather_bytes, true) {
            return self.two_level_allgather(send.map(RawBuf::from_ref), out, count, mode);
        }
        if self.fits(count) {
            let send = send.map_or(in_place().cast_const(), cptr);
            let call = Native::Allgather { send, recv: out.ptr().cast(), count: cnt(count)? };
            return Ok(Job::native(datatype::<T>()?, call, bytes));
        }
        let blocks: Vec<_> = (0..n).map(|i| out.block(i * count, count)).collect();
        self.ring_allgather(send.map(RawBuf::from_ref), blocks, mode)
    }

    /// The two-level allgather ([`hierarchical::allgather`]) of `count` elements per rank into
    /// `out`, after placing this rank's own block.
    fn two_level_allgather<T: Element>(
        &self,
        send: Option<RawBuf<T>>,
        out: RawBuf<T>,
        count: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let core = Arc::clone(&self.core);
        let levels = Levels::new(&self.topology, self.rank());
        let chunk = elements::<T>(self.tuning.hierarchical_chunk_bytes);
        let columns = levels.columns(chunk).min(count);
        let xs = self.chunk_transports::<T>(mode, count.div_ceil(columns))?;
        let own = out.block(self.rank() * count, count);
        let slot = self.size() * columns;
        Ok(Job::Future(Box::pin(async move {
            let mut scratch = core.scratch.take::<T>(slot * xs.len())?;
            // SAFETY: the public method borrows the buffers for the whole operation (the send
            // buffer is a distinct slice); the scratch is this operation's own.
            unsafe {
                if let Some(s) = send {
                    own.copy_from(s);
                }
                hierarchical::allgather(&xs, &levels, out, count, scratch.raw(), chunk).await
            }
        })))
    }

    /// The two-level reduce-scatter ([`hierarchical::reduce_scatter`]) of `input` (every
    /// rank's blocks) into `out` (this rank's), then the operator's finishing step.
    fn two_level_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        input: RawBuf<T>,
        out: RawBuf<T>,
        mode: Mode,
    ) -> Result<Job<T>> {
        let core = Arc::clone(&self.core);
        let levels = Levels::new(&self.topology, self.rank());
        let seg = self.segment::<T>();
        let n = self.size();
        let chunk = elements::<T>(self.tuning.hierarchical_chunk_bytes);
        let columns = levels.columns(chunk).min(out.len());
        let xs = self.chunk_transports::<T>(mode, out.len().div_ceil(columns))?;
        // A chunk's lane-major input, then the ring's two segment slots.
        let slot = n * columns + (n * columns).min(2 * seg);
        Ok(Job::Future(Box::pin(async move {
            let r = HostReducer::<O>::new();
            let mut scratch = core.scratch.take::<T>(slot * xs.len())?;
            // SAFETY: the public method borrows the buffers for the whole operation (`out` may
            // lie inside `input` in place, which the algorithm allows); the scratch is this
            // operation's own.
            unsafe {
                hierarchical::reduce_scatter(&xs, &r, &levels, input, out, scratch.raw(), seg, chunk).await?;
                r.finish(out.as_mut_slice(), u32_rank(n));
            }
            Ok(())
        })))
    }

    /// Allgather(v) over the ring algorithm, after placing this rank's own block.
    fn ring_allgather<T: Element>(
        &self,
        send: Option<RawBuf<T>>,
        blocks: Vec<RawBuf<T>>,
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        let me = self.rank();
        Ok(Job::Future(Box::pin(async move {
            // SAFETY: the public method borrows the buffers for the whole operation; receive
            // blocks were checked disjoint, and the send buffer is a distinct slice.
            unsafe {
                if let Some(s) = send {
                    blocks[me].copy_from(s);
                }
                exchange::ring_allgather(&x, &blocks).await
            }
        })))
    }

    pub(crate) fn plan_allgatherv<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        check::per_rank("allgatherv counts", counts, n)?;
        check::per_rank("allgatherv displacements", displs, n)?;
        check::blocks("allgatherv receive blocks", counts, displs, recv.len(), true)?;
        if let Some(s) = send {
            check::len("allgatherv send buffer", s.len(), counts[self.rank()])?;
        }
        let total = check::total("allgatherv counts", counts)?;
        let out = RawBuf::from_mut(recv);
        // Counts agree on every rank, displacements are this rank's own business: decide by
        // counts alone so every rank takes the same path. MPI's displacements are `int`s: a rank
        // whose displacements do not fit receives the blocks packed and copies them out.
        if self.fits(total) {
            let me = self.rank();
            let dt = datatype::<T>()?;
            if displs.iter().all(|&d| self.fits(d)) {
                let send_ptr = send.map_or(in_place().cast_const(), cptr);
                let call = Native::Allgatherv {
                    send: send_ptr,
                    count: cnt(counts[me])?,
                    recv: out.ptr().cast(),
                    counts: cnts(counts)?,
                    displs: cnts(displs)?,
                };
                return Ok(Job::native(dt, call, bytes_of::<T>(total)));
            }
            let packed_displs: Vec<usize> =
                counts.iter().scan(0, |at, &c| Some(std::mem::replace(at, *at + c))).collect();
            let mut packed = vec![T::zeroed(); total];
            // Not in place: this rank's block is read from where the caller put it.
            let own = out.block(displs[me], counts[me]);
            let send_ptr = send.map_or(own.ptr().cast_const().cast(), cptr);
            let call = Native::Allgatherv {
                send: send_ptr,
                count: cnt(counts[me])?,
                recv: packed.as_mut_ptr().cast(),
                counts: cnts(counts)?,
                displs: cnts(&packed_displs)?,
            };
            let blocks = packed_displs.iter().zip(counts).zip(displs).map(|((&p, &c), &d)| (p, c, d)).collect();
            return Ok(Job::native(dt, call, bytes_of::<T>(total)).then(Some(Post::Unpack {
                packed,
                buf: out,
                blocks,
            })));
        }
        let blocks: Vec<_> = counts.iter().zip(displs).map(|(&c, &d)| out.block(d, c)).collect();
        self.ring_allgather(send.map(RawBuf::from_ref), blocks, mode)
    }

    pub(crate) fn plan_alltoall<T: Element>(&self, send: Option<&[T]>, recv: &mut [T], mode: Mode) -> Result<Job<T>> {
        let n = self.size();
        if let Some(s) = send {
            check::len("alltoall receive buffer", recv.len(), s.len())?;
        }
        let count = check::divisible("alltoall buffer (size * count)", recv.len(), n)?;
        let out = RawBuf::from_mut(recv);
        if self.fits(count) {
            let send = send.map_or(in_place().cast_const(), cptr);
            let call = Native::Alltoall { send, recv: out.ptr().cast(), count: cnt(count)? };
            return Ok(Job::native(datatype::<T>()?, call, bytes_of::<T>(out.len())));
        }
        let counts = vec![count; n];
        let displs = check::packed_displs(&counts);
        self.pairwise_alltoall(send.map(RawBuf::from_ref), &counts, &displs, out, &counts, &displs, mode)
    }

    #[allow(clippy::too_many_arguments)]
    fn pairwise_alltoall<T: Element>(
        &self,
        send: Option<RawBuf<T>>,
        send_counts: &[usize],
        send_displs: &[usize],
        recv: RawBuf<T>,
        recv_counts: &[usize],
        recv_displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        let me = self.rank();
        let core = Arc::clone(&self.core);
        let sblocks: Vec<(usize, usize)> = send_counts.iter().zip(send_displs).map(|(&c, &d)| (d, c)).collect();
        let rblocks: Vec<_> = recv_counts.iter().zip(recv_displs).map(|(&c, &d)| recv.block(d, c)).collect();
        Ok(Job::Future(Box::pin(async move {
            // In place, the outgoing blocks are copied aside first: the receive blocks are the
            // same memory.
            let mut copy = match send {
                Some(_) => None,
                None => Some(core.scratch.take::<T>(recv.len())?),
            };
            let source = match (send, copy.as_mut()) {
                (Some(s), _) => s,
                (None, Some(c)) => {
                    let c = c.raw();
                    // SAFETY: scratch and the operation's buffer are disjoint and exclusive.
                    unsafe { c.copy_from(recv) };
                    c
                }
                (None, None) => return Ok(()),
            };
            let sends: Vec<_> = sblocks.iter().map(|&(d, c)| source.block(d, c)).collect();
            // SAFETY: send blocks are only read; receive blocks were checked in range and
            // disjoint, and are distinct from the send buffer (or its scratch copy).
            unsafe {
                rblocks[me].copy_from(sends[me]);
                exchange::alltoall(&x, &sends, &rblocks).await
            }
        })))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan_alltoallv<T: Element>(
        &self,
        send: &[T],
        send_counts: &[usize],
        send_displs: &[usize],
        recv: &mut [T],
        recv_counts: &[usize],
        recv_displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        check::per_rank("alltoallv send counts", send_counts, n)?;
        check::per_rank("alltoallv receive counts", recv_counts, n)?;
        check::blocks("alltoallv send blocks", send_counts, send_displs, send.len(), false)?;
        check::blocks("alltoallv receive blocks", recv_counts, recv_displs, recv.len(), true)?;
        let me = self.rank();
        check::len("alltoallv receive count from this rank itself", recv_counts[me], send_counts[me])?;
        self.pairwise_alltoall(
            Some(RawBuf::from_ref(send)),
            send_counts,
            send_displs,
            RawBuf::from_mut(recv),
            recv_counts,
            recv_displs,
            mode,
        )
    }

    pub(crate) fn plan_gather<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        check::rank("gather root", root, n)?;
        let is_root = self.rank() == root;
        let count = match (send, is_root) {
            (Some(s), true) => {
                check::len("gather receive buffer", recv.len(), check::product("gather", s.len(), n)?)?;
                s.len()
            }
            (Some(s), false) => s.len(),
            (None, true) => check::divisible("gather buffer (size * count)", recv.len(), n)?,
            (None, false) => recv.len(),
        };
        let out = RawBuf::from_mut(recv);
        let mine = send.map_or(out, RawBuf::from_ref);
        if self.fits(count) {
            let (s, r) = match (send.is_some(), is_root) {
                (true, true) => (mine.ptr().cast(), out.ptr().cast()),
                (false, true) => (in_place(), out.ptr().cast()),
                (_, false) => (mine.ptr().cast(), std::ptr::null_mut()),
            };
            let call = Native::Gather { send: s.cast_const(), recv: r, count: cnt(count)?, root: c_rank(root) };
            return Ok(Job::native(datatype::<T>()?, call, bytes_of::<T>(count.saturating_mul(n))));
        }
        let blocks: Vec<_> = (0..n).map(|i| out.block(i * count, count)).collect();
        self.linear(send.map(RawBuf::from_ref), mine, blocks, root, true, mode)
    }

    /// Linear gather (`gather == true`) or scatter over point-to-point. At the root,
    /// `separate` is the out-of-place buffer whose own block must be copied into (gather) or
    /// out of (scatter) `blocks`; `mine` is this rank's contribution or destination elsewhere.
    fn linear<T: Element>(
        &self,
        separate: Option<RawBuf<T>>,
        mine: RawBuf<T>,
        blocks: Vec<RawBuf<T>>,
        root: usize,
        gather: bool,
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        let is_root = self.rank() == root;
        Ok(Job::Future(Box::pin(async move {
            // SAFETY: the public method borrows the buffers for the whole operation; blocks
            // were checked in range (and disjoint where they are written).
            unsafe {
                if let (true, Some(own)) = (is_root, separate) {
                    if gather { blocks[root].copy_from(own) } else { own.copy_from(blocks[root]) }
                }
                if gather {
                    exchange::linear_gather(&x, root, mine, &blocks).await
                } else {
                    exchange::linear_scatter(&x, root, mine, &blocks).await
                }
            }
        })))
    }

    pub(crate) fn plan_gatherv<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        counts: &[usize],
        displs: &[usize],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        check::rank("gatherv root", root, n)?;
        let is_root = self.rank() == root;
        let out = RawBuf::from_mut(recv);
        let mut blocks = Vec::new();
        if is_root {
            check::per_rank("gatherv counts", counts, n)?;
            check::blocks("gatherv receive blocks", counts, displs, out.len(), true)?;
            if let Some(s) = send {
                check::len("gatherv send buffer", s.len(), counts[root])?;
            }
            blocks = counts.iter().zip(displs).map(|(&c, &d)| out.block(d, c)).collect();
        }
        let mine = send.map_or(out, RawBuf::from_ref);
        self.linear(send.map(RawBuf::from_ref), mine, blocks, root, true, mode)
    }

    pub(crate) fn plan_scatter<T: Element>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        check::rank("scatter root", root, n)?;
        let is_root = self.rank() == root;
        let count = match (send, is_root) {
            (Some(s), true) => {
                check::len("scatter send buffer", s.len(), check::product("scatter", recv.len(), n)?)?;
                recv.len()
            }
            (None, true) => check::divisible("scatter buffer (size * count)", recv.len(), n)?,
            (_, false) => recv.len(),
        };
        let out = RawBuf::from_mut(recv);
        let source = send.map_or(out, RawBuf::from_ref);
        if self.fits(count) {
            let (s, r) = match (send.is_some(), is_root) {
                (true, true) => (source.ptr().cast_const().cast(), out.ptr().cast()),
                (false, true) => (out.ptr().cast_const().cast(), in_place()),
                (_, false) => (std::ptr::null(), out.ptr().cast()),
            };
            let call = Native::Scatter { send: s, recv: r, count: cnt(count)?, root: c_rank(root) };
            return Ok(Job::native(datatype::<T>()?, call, bytes_of::<T>(count.saturating_mul(n))));
        }
        let blocks: Vec<_> =
            if is_root { (0..n).map(|i| source.block(i * count, count)).collect() } else { Vec::new() };
        let separate = send.is_some().then_some(out);
        self.linear(separate, out, blocks, root, false, mode)
    }

    pub(crate) fn plan_scatterv<T: Element>(
        &self,
        send: Option<&[T]>,
        counts: &[usize],
        displs: &[usize],
        recv: &mut [T],
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        check::rank("scatterv root", root, n)?;
        let is_root = self.rank() == root;
        let out = RawBuf::from_mut(recv);
        let source = send.map_or(out, RawBuf::from_ref);
        let mut blocks = Vec::new();
        if is_root {
            check::per_rank("scatterv counts", counts, n)?;
            check::blocks("scatterv send blocks", counts, displs, source.len(), false)?;
            if send.is_some() {
                check::len("scatterv receive buffer", out.len(), counts[root])?;
            }
            blocks = counts.iter().zip(displs).map(|(&c, &d)| source.block(d, c)).collect();
        }
        let separate = send.is_some().then_some(out);
        self.linear(separate, out, blocks, root, false, mode)
    }

    pub(crate) fn plan_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        op: O,
        mode: Mode,
    ) -> Result<Job<T>> {
        let n = self.size();
        let count = match send {
            Some(s) => {
                check::len("reduce_scatter send buffer", s.len(), check::product("reduce_scatter", recv.len(), n)?)?;
                recv.len()
            }
            None => check::divisible("reduce_scatter buffer (size * count)", recv.len(), n)?,
        };
        let bytes = recv.len().max(count.saturating_mul(n)).saturating_mul(size_of::<T>());
        if self.use_two_level(bytes, self.tuning.hierarchical_reduce_scatter_bytes, O::COMMUTATIVE) {
            let (input, out) = match send {
                Some(s) => (RawBuf::from_ref(s), RawBuf::from_mut(recv)),
                None => {
                    let all = RawBuf::from_mut(recv);
                    (all, all.block(0, count))
                }
            };
            return self.two_level_reduce_scatter::<T, O>(input, out, mode);
        }
        // Equal blocks go through MPI_Reduce_scatter: Open MPI 4.1's MPI_Reduce_scatter_block
        // is a reduce followed by a scatter, three times slower at 16 MiB in our benchmark.
        self.plan_reduce_scatterv(send, recv, &vec![count; n], op, mode)
    }

    pub(crate) fn plan_reduce_scatterv<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<&[T]>,
        recv: &mut [T],
        counts: &[usize],
        _op: O,
        mode: Mode,
    ) -> Result<Job<T>> {
        let (n, me) = (self.size(), self.rank());
        check::per_rank("reduce_scatterv counts", counts, n)?;
        let total = check::total("reduce_scatterv counts", counts)?;
        match send {
            Some(s) => {
                check::len("reduce_scatterv send buffer", s.len(), total)?;
                check::len("reduce_scatterv receive buffer", recv.len(), counts[me])?;
            }
            None => check::len("reduce_scatterv buffer", recv.len(), total)?,
        }
        let out = RawBuf::from_mut(recv);
        let displs = check::packed_displs(counts);
        if self.use_reduce_ring::<T, O>(total, self.tuning.reduce_ring_bytes) {
            return self.ring_reduce_scatter::<T, O>(send.map(RawBuf::from_ref), out, counts, &displs, mode);
        }
        let dt = datatype::<T>()?;
        let op = mpi_op::<T, O>()?;
        let result = out.block(0, counts[me]);
        if self.fits(total) {
            let call = Native::ReduceScatter {
                send: send.map_or(in_place().cast_const(), cptr),
                recv: out.ptr().cast(),
                counts: cnts(counts)?,
                op,
            };
            return Ok(Job::native(dt, call, bytes_of::<T>(total)).then(finish::<T, O>(result, n)));
        }
        // Too large for one call and not commutative: one (split) reduce per block, to that
        // block's owner, which keeps MPI's rank-order guarantee. Every rank knows the counts, so
        // all issue the same calls in the same order.
        let input = send.map_or(out, RawBuf::from_ref);
        let mut calls = Vec::new();
        for r in 0..n {
            for (off, len) in pieces(counts[r], self.tuning.max_message_elements) {
                let src = at(input, displs[r] + off);
                let (s, d) = match (r == me, send.is_some()) {
                    (true, true) => (src.cast_const(), at(out, off)),
                    (true, false) => (in_place().cast_const(), src),
                    (false, _) => (src.cast_const(), std::ptr::null_mut()),
                };
                calls.push(Native::Reduce { send: s, recv: d, count: cnt(len)?, op, root: c_rank(r) });
            }
        }
        let mut post = Vec::new();
        if send.is_none() {
            post.push(Post::MoveToFront { buf: out, from: displs[me], len: counts[me] });
        }
        post.extend(finish::<T, O>(result, n));
        Ok(Job::natives(dt, calls.into(), post, bytes_of::<T>(total)))
    }

    /// The algorithm [`AllreduceAlgorithm::Auto`] runs for a blocking allreduce of `count`
    /// elements with `O` on this communicator (never `Auto`). A non-blocking one runs the same,
    /// except that it does not pick [`AllreduceAlgorithm::SharedMemory`] before the window
    /// exists (made by the first blocking allreduce that uses it): making it is collective and
    /// would block the call.
    pub fn allreduce_choice<T: Element, O: ReduceOp<T>>(&self, count: usize) -> AllreduceAlgorithm {
        self.auto_allreduce::<T, O>(count.saturating_mul(size_of::<T>()), Mode::Blocking)
    }

    /// The algorithm [`BcastAlgorithm::Auto`] runs for a broadcast of `count` elements of `T`
    /// on this communicator (never `Auto`).
    pub fn bcast_choice<T: Element>(&self, count: usize) -> BcastAlgorithm {
        self.auto_bcast(count.saturating_mul(size_of::<T>()))
    }

    /// What `Auto` runs for an allreduce of `bytes` with `O` in `mode`: decided from values every
    /// rank shares (operator, size, tuning, shape, and whether the node window exists, which
    /// every rank made at the same operation), so all ranks agree.
    fn auto_allreduce<T: Element, O: ReduceOp<T>>(&self, bytes: usize, mode: Mode) -> AllreduceAlgorithm {
        let t = &self.tuning;
        let window = mode == Mode::Blocking || self.core.shm.is_made();
        if !O::COMMUTATIVE || self.size() == 1 {
            AllreduceAlgorithm::Native
        } else if !self.topology.shape().single_node() && bytes >= t.hierarchical_allreduce_bytes {
            AllreduceAlgorithm::Hierarchical
        } else if !self.topology.shape().single_node() && bytes <= NATIVE_UNCHECKED_BYTES {
            // MPI's own is the faster here (4 B on 2 hosts x 2 ranks: 20 µs against recursive
            // doubling's 22), and needs no check.
            AllreduceAlgorithm::Native
        } else if !self.topology.shape().single_node() && bytes < t.nodes_recursive_doubling_bytes {
            AllreduceAlgorithm::RecursiveDoubling
        } else if self.topology.shape().single_node() && bytes >= t.shared_memory_allreduce_bytes && window {
            AllreduceAlgorithm::SharedMemory
        } else if bytes >= t.allreduce_ring_bytes {
            AllreduceAlgorithm::Ring
        } else {
            AllreduceAlgorithm::Native
        }
    }

    /// What `Auto` runs for a broadcast of `bytes`.
    fn auto_bcast(&self, bytes: usize) -> BcastAlgorithm {
        let t = &self.tuning;
        if !self.topology.shape().single_node() && bytes >= t.hierarchical_bcast_bytes {
            BcastAlgorithm::Hierarchical
        } else if self.topology.shape().single_node() && self.size() > 2 && bytes >= t.bcast_chain_bytes {
            BcastAlgorithm::Chain
        } else {
            BcastAlgorithm::Native
        }
    }

    /// Whether a collective of `bytes` in total runs a two-level algorithm from `threshold` up:
    /// several nodes, and a commutative operator where it reduces.
    fn use_two_level(&self, bytes: usize, threshold: usize, commutative: bool) -> bool {
        commutative && !self.topology.shape().single_node() && bytes >= threshold
    }

    /// Whether a reduce or reduce-scatter of `total` elements runs the ring reduce-scatter:
    /// decided from values every rank shares, so all ranks agree.
    fn use_reduce_ring<T: Element, O: ReduceOp<T>>(&self, total: usize, threshold: usize) -> bool {
        let bytes = total.saturating_mul(size_of::<T>());
        O::COMMUTATIVE && self.size() > 1 && (bytes >= threshold || !self.fits(total))
    }

    fn segment<T>(&self) -> usize {
        elements::<T>(self.tuning.ring_segment_bytes)
    }

    /// Reduce-scatter(v) over the ring. Out of place the partial sums live in two block-sized
    /// slots of scratch; in place they live in the buffer and the result moves to its front.
    fn ring_reduce_scatter<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<RawBuf<T>>,
        out: RawBuf<T>,
        counts: &[usize],
        displs: &[usize],
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        let core = Arc::clone(&self.core);
        let seg = self.segment::<T>();
        let (me, n) = (self.rank(), self.size());
        let blocks: Vec<(usize, usize)> = displs.iter().copied().zip(counts.iter().copied()).collect();
        let max_block = counts.iter().copied().max().unwrap_or(0);
        Ok(Job::Future(Box::pin(async move {
            let r = HostReducer::<O>::new();
            let slots = if send.is_some() { 2 * max_block } else { 0 };
            let mut scratch = core.scratch.take::<T>(2 * seg.min(max_block.max(1)) + slots)?;
            let scratch = scratch.raw();
            let incoming = scratch.block(slots, scratch.len() - slots);
            let (input, result, partials) = match send {
                Some(input) => (input, out, Partials::Slots(scratch.block(0, slots))),
                None => (out, out.block(blocks[me].0, blocks[me].1), Partials::InBuffer(out)),
            };
            let layout = RingLayout { blocks: &blocks, input, shift: 0, out: result, partials };
            // SAFETY: the public method borrows the buffers for the whole operation; scratch is
            // this operation's own, and its slots and receive area are disjoint.
            unsafe {
                reduce_scatter::ring(&x, &r, layout, incoming, seg).await?;
                if send.is_none() {
                    Post::MoveToFront { buf: out, from: blocks[me].0, len: blocks[me].1 }.apply();
                }
                r.finish(out.block(0, blocks[me].1).as_mut_slice(), u32_rank(n));
            }
            Ok(())
        })))
    }

    /// A large reduce: ring reduce-scatter, then the blocks are gathered at the root. Non-root
    /// ranks never write their input (in place it must stay unchanged), so their partial sums
    /// and final block live in scratch.
    fn ring_reduce<T: Element, O: ReduceOp<T>>(
        &self,
        send: Option<RawBuf<T>>,
        out: RawBuf<T>,
        len: usize,
        root: usize,
        mode: Mode,
    ) -> Result<Job<T>> {
        let x = self.transport::<T>(mode)?;
        // The gather has a tag of its own, so its messages can never meet the ring's.
        let xg = self.transport::<T>(mode)?;
        let core = Arc::clone(&self.core);
        let seg = self.segment::<T>();
        let (me, n) = (self.rank(), self.size());
        let blocks: Vec<(usize, usize)> = (0..n).map(|i| crate::algorithms::block_range(len, n, i)).collect();
        let max_block = blocks.iter().map(|b| b.1).max().unwrap_or(0);
        let is_root = me == root;
        Ok(Job::Future(Box::pin(async move {
            let r = HostReducer::<O>::new();
            let input = send.unwrap_or(out);
            let own = if is_root { 0 } else { 3 * max_block };
            let mut scratch = core.scratch.take::<T>(2 * seg.min(max_block.max(1)) + own)?;
            let scratch = scratch.raw();
            let incoming = scratch.block(own, scratch.len() - own);
            let (result, partials) = if is_root {
                (out.block(blocks[me].0, blocks[me].1), Partials::InBuffer(out))
            } else {
                (scratch.block(2 * max_block, blocks[me].1), Partials::Slots(scratch.block(0, 2 * max_block)))
            };
            let layout = RingLayout { blocks: &blocks, input, shift: 0, out: result, partials };
            let dest: Vec<_> = blocks.iter().map(|&(s, l)| out.block(s, l)).collect();
            // SAFETY: the public method borrows the buffers for the whole operation (the
            // root's is the full-size result); scratch is this operation's own and its parts
            // are disjoint.
            unsafe {
                reduce_scatter::ring(&x, &r, layout, incoming, seg).await?;
                exchange::linear_gather(&xg, root, result, &dest).await?;
                if is_root {
                    r.finish(out.as_mut_slice(), u32_rank(n));
                }
            }
            Ok(())
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::cnt;

    /// A count MPI's `int` cannot hold is an error: it once came back clamped to
    /// `c_int::MAX`, which would have moved a different amount of data than asked.
    #[test]
    fn counts_beyond_an_mpi_int_are_refused() {
        assert_eq!(cnt(7).unwrap(), 7);
        assert_eq!(cnt(i32::MAX as usize).unwrap(), i32::MAX);
        assert!(matches!(cnt(i32::MAX as usize + 1), Err(crate::Error::CountOverflow { .. })));
    }
}
