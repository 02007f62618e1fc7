//! Each operation's documentation, said once: `op_doc!(name)` is the paragraph that says what the
//! operation computes. The [`Collectives`](crate::Collectives) trait and every backend's method
//! open with it; a backend's methods then say when the call returns (blocking, or queued on the
//! stream), and its module docs what only it knows: which MPI or NCCL call runs, what it
//! refuses.

/// The paragraph of operation `$name` (see the [module docs](self)).
macro_rules! op_doc {
    (allreduce) => {
        "Allreduce: `recv[i] = op(send_0[i], ..., send_{n-1}[i])` on every rank; `send` and \
         `recv` have equal lengths on every rank."
    };
    (allreduce_in_place) => {
        "In-place allreduce: `buf` is every rank's input and receives the result."
    };
    (allreduce_with) => {
        "Allreduce with an explicit algorithm. An algorithm a backend does not run, or one that \
         cannot keep the rank order a non-commutative operator needs (all but `Auto`, `Native` \
         and `SharedMemory`), is refused with \
         [`Error::AlgorithmUnsupported`](crate::Error::AlgorithmUnsupported), with nothing sent."
    };
    (allreduce_in_place_with) => {
        "In-place allreduce with an explicit algorithm, as `allreduce_with`."
    };
    (reduce) => {
        "Reduce to `root`: at the root `recv` (as long as `send`) receives the reduction; \
         elsewhere `recv` is not used (pass an empty buffer)."
    };
    (reduce_in_place) => {
        "In-place reduce: `buf` is every rank's input; at the root it receives the result, \
         elsewhere it is left unchanged."
    };
    (reduce_scatter) => {
        "Reduce-scatter with equal blocks: `send` holds `size` blocks of `recv.len()` elements, \
         and block `i` of the reduction lands in rank `i`'s `recv`."
    };
    (reduce_scatter_in_place) => {
        "In-place reduce-scatter: `buf` (`size * c` elements) is the input; this rank's block of \
         the reduction is written to `buf[..c]` (MPI's `MPI_IN_PLACE` convention)."
    };
    (reduce_scatterv) => {
        "Reduce-scatter with per-rank counts: `send` holds the blocks back to back (`sum(counts)` \
         elements), and block `i` of the reduction (`counts[i]` elements) lands in rank `i`'s \
         `recv`."
    };
    (reduce_scatterv_in_place) => {
        "In-place reduce-scatterv: `buf` (`sum(counts)` elements) is the input; this rank's block \
         of the reduction is written to `buf[..counts[rank]]`."
    };
    (bcast) => {
        "Broadcast of the root's `buf` into every rank's `buf`; `buf` has the same length \
         everywhere."
    };
    (bcast_with) => {
        "Broadcast with an explicit algorithm."
    };
    (allgather) => {
        "Allgather: rank `i`'s `send` (`c` elements) lands at `recv[i*c..(i+1)*c]` on every \
         rank; `recv` holds `size * c` elements."
    };
    (allgather_in_place) => {
        "In-place allgather: this rank's block of `buf` (`size * c` elements) is its input."
    };
    (allgatherv) => {
        "Allgatherv: rank `i`'s `send` (`counts[i]` elements) lands at `recv[displs[i]..]` on \
         every rank. Receive blocks must not overlap."
    };
    (allgatherv_in_place) => {
        "In-place allgatherv: this rank's block of `buf` (at `displs[rank]`) is its input."
    };
    (alltoall) => {
        "All-to-all: block `j` of `send` goes to rank `j`, block `i` of `recv` comes from rank \
         `i`; both hold `size * c` elements."
    };
    (alltoall_in_place) => {
        "In-place all-to-all: block `j` of `buf` goes to rank `j` and is replaced by the block \
         rank `j` sent."
    };
    (alltoallv) => {
        "All-to-all with per-rank counts and displacements: \
         `send[send_displs[j]..][..send_counts[j]]` goes to rank `j`, and \
         `recv[recv_displs[i]..][..recv_counts[i]]` comes from rank `i`."
    };
    (gather) => {
        "Gather to `root`: rank `i`'s `send` (`c` elements) lands at `recv[i*c..]` on the root \
         (`size * c` elements); elsewhere `recv` is not used (pass an empty buffer)."
    };
    (gather_in_place) => {
        "In-place gather: at the root `buf` holds `size * c` elements with its own block in \
         place; elsewhere `buf` is the `c`-element contribution (only read)."
    };
    (gatherv) => {
        "Gatherv to `root`: rank `i`'s `send` lands at `recv[displs[i]..][..counts[i]]` on the \
         root. `counts`, `displs` and `recv` are used at the root only (pass empty ones \
         elsewhere)."
    };
    (gatherv_in_place) => {
        "In-place gatherv: the root's own block is in place in `buf` already; elsewhere `buf` is \
         the contribution (only read)."
    };
    (scatter) => {
        "Scatter from `root`: block `i` of the root's `send` (`size * recv.len()` elements) lands \
         in rank `i`'s `recv`; elsewhere `send` is not used (pass an empty buffer)."
    };
    (scatter_in_place) => {
        "In-place scatter: at the root `buf` holds every block and keeps its own; elsewhere `buf` \
         receives the block."
    };
    (scatterv) => {
        "Scatterv from `root`: `send[displs[i]..][..counts[i]]` lands in rank `i`'s `recv`. \
         `send`, `counts` and `displs` are used at the root only."
    };
    (scatterv_in_place) => {
        "In-place scatterv: at the root `buf` is the send buffer and keeps its own block in \
         place; elsewhere `buf` receives the block."
    };
    (send) => {
        "Sends `buf` to rank `dest` with `tag`."
    };
    (recv) => {
        "Receives exactly `buf.len()` elements from rank `source` with `tag`."
    };
    (sendrecv) => {
        "Sends `send` to `dest` and receives `recv` from `source` at once."
    };
    (sendrecv_in_place) => {
        "Sends `buf` to `dest` and replaces it by as many elements from `source`."
    };
    (multi_sendrecv) => {
        "Sends each `(buffer, dest)` of `sends` and receives each `(buffer, source)` of `recvs`, \
         all at once (Aluminum's MultiSendRecv); messages between a pair match in list order."
    };
}
pub(crate) use op_doc;
