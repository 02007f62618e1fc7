//! Every operation, listed once. The [`Collectives`](crate::Collectives) trait, each backend's
//! methods and the test suite's wrappers are generated from this list: `for_each_operation!(m)`
//! passes it to the
//! generating macro `m`, and a backend supplies only the types of its buffers and the plans
//! that move the data (NCCL's `ncclInfo` passed through one enqueue path).
//!
//! An entry: its documentation (`op_doc!`, said once) and aliases; `fn name / iname` (the
//! blocking or stream-ordered method and its non-blocking twin) with its generics; its
//! arguments in call order, each with its kind: `[in]` a buffer the operation reads, `[out]`
//! one it writes, `[ins]`/`[outs]` lists of `(buffer, peer)`, or a value of the type in
//! parentheses; `describe(..)` its description ([`super`]) and how its element joins the
//! signature (`elem::<T>`, `reduce::<T, O>`); and `plan(..)` the backend's planner and its
//! arguments, in the same form on every backend.

/// Passes the list of operations to `$m`, after `$extra` in parentheses where given (see the
/// module docs of `operations::list`). Exported,
/// hidden, so the test suite's wrappers take the same list; no stability promise.
#[macro_export]
#[doc(hidden)]
macro_rules! for_each_operation {
    ($m:ident $(, $($extra:tt)*)?) => {
        $m! {
            $(($($extra)*))?
            #[doc = $crate::operations::op_doc!(allreduce)]
            #[doc(alias = "all_reduce")]
            fn allreduce / iallreduce <T: Element, O: ReduceOp<T>> (send: [in], recv: [out], op: (O))
                describe($crate::operations::Allreduce { send: Some(send.len()), recv: recv.len(), algorithm: None } => reduce::<T, O>)
                plan(plan_allreduce(Some(send), recv, op, $crate::AllreduceAlgorithm::Auto));
            #[doc = $crate::operations::op_doc!(allreduce_in_place)]
            fn allreduce_in_place / iallreduce_in_place <T: Element, O: ReduceOp<T>> (buf: [out], op: (O))
                describe($crate::operations::Allreduce { send: None, recv: buf.len(), algorithm: None } => reduce::<T, O>)
                plan(plan_allreduce(None, buf, op, $crate::AllreduceAlgorithm::Auto));
            #[doc = $crate::operations::op_doc!(allreduce_with)]
            fn allreduce_with / iallreduce_with <T: Element, O: ReduceOp<T>>
                (send: [in], recv: [out], op: (O), algorithm: ($crate::AllreduceAlgorithm))
                describe($crate::operations::Allreduce { send: Some(send.len()), recv: recv.len(), algorithm: Some(algorithm.name()) } => reduce::<T, O>)
                plan(plan_allreduce(Some(send), recv, op, algorithm));
            #[doc = $crate::operations::op_doc!(allreduce_in_place_with)]
            fn allreduce_in_place_with / iallreduce_in_place_with <T: Element, O: ReduceOp<T>>
                (buf: [out], op: (O), algorithm: ($crate::AllreduceAlgorithm))
                describe($crate::operations::Allreduce { send: None, recv: buf.len(), algorithm: Some(algorithm.name()) } => reduce::<T, O>)
                plan(plan_allreduce(None, buf, op, algorithm));
            #[doc = $crate::operations::op_doc!(reduce)]
            fn reduce / ireduce <T: Element, O: ReduceOp<T>> (send: [in], recv: [out], root: (usize), op: (O))
                describe($crate::operations::Reduce { send: Some(send.len()), recv: recv.len(), root } => reduce::<T, O>)
                plan(plan_reduce(Some(send), recv, root, op));
            #[doc = $crate::operations::op_doc!(reduce_in_place)]
            fn reduce_in_place / ireduce_in_place <T: Element, O: ReduceOp<T>> (buf: [out], root: (usize), op: (O))
                describe($crate::operations::Reduce { send: None, recv: buf.len(), root } => reduce::<T, O>)
                plan(plan_reduce(None, buf, root, op));
            #[doc = $crate::operations::op_doc!(reduce_scatter)]
            #[doc(alias = "reduce_scatter_tensor")]
            fn reduce_scatter / ireduce_scatter <T: Element, O: ReduceOp<T>> (send: [in], recv: [out], op: (O))
                describe($crate::operations::ReduceScatter { send: Some(send.len()), recv: recv.len() } => reduce::<T, O>)
                plan(plan_reduce_scatter(Some(send), recv, op));
            #[doc = $crate::operations::op_doc!(reduce_scatter_in_place)]
            fn reduce_scatter_in_place / ireduce_scatter_in_place <T: Element, O: ReduceOp<T>> (buf: [out], op: (O))
                describe($crate::operations::ReduceScatter { send: None, recv: buf.len() } => reduce::<T, O>)
                plan(plan_reduce_scatter(None, buf, op));
            #[doc = $crate::operations::op_doc!(reduce_scatterv)]
            fn reduce_scatterv / ireduce_scatterv <T: Element, O: ReduceOp<T>>
                (send: [in], recv: [out], counts: (&[usize]), op: (O))
                describe($crate::operations::ReduceScatterv { send: Some(send.len()), recv: recv.len(), counts } => reduce::<T, O>)
                plan(plan_reduce_scatterv(Some(send), recv, counts, op));
            #[doc = $crate::operations::op_doc!(reduce_scatterv_in_place)]
            fn reduce_scatterv_in_place / ireduce_scatterv_in_place <T: Element, O: ReduceOp<T>>
                (buf: [out], counts: (&[usize]), op: (O))
                describe($crate::operations::ReduceScatterv { send: None, recv: buf.len(), counts } => reduce::<T, O>)
                plan(plan_reduce_scatterv(None, buf, counts, op));
            #[doc = $crate::operations::op_doc!(bcast)]
            #[doc(alias = "broadcast")]
            fn bcast / ibcast <T: Element> (buf: [out], root: (usize))
                describe($crate::operations::Bcast { buf: buf.len(), root, algorithm: None } => elem::<T>)
                plan(plan_bcast(buf, root, $crate::BcastAlgorithm::Auto));
            #[doc = $crate::operations::op_doc!(bcast_with)]
            fn bcast_with / ibcast_with <T: Element> (buf: [out], root: (usize), algorithm: ($crate::BcastAlgorithm))
                describe($crate::operations::Bcast { buf: buf.len(), root, algorithm: Some(algorithm.name()) } => elem::<T>)
                plan(plan_bcast(buf, root, algorithm));
            #[doc = $crate::operations::op_doc!(allgather)]
            #[doc(alias = "all_gather")]
            fn allgather / iallgather <T: Element> (send: [in], recv: [out])
                describe($crate::operations::Allgather { send: Some(send.len()), recv: recv.len() } => elem::<T>)
                plan(plan_allgather(Some(send), recv));
            #[doc = $crate::operations::op_doc!(allgather_in_place)]
            fn allgather_in_place / iallgather_in_place <T: Element> (buf: [out])
                describe($crate::operations::Allgather { send: None, recv: buf.len() } => elem::<T>)
                plan(plan_allgather(None, buf));
            #[doc = $crate::operations::op_doc!(allgatherv)]
            fn allgatherv / iallgatherv <T: Element> (send: [in], recv: [out], counts: (&[usize]), displs: (&[usize]))
                describe($crate::operations::Allgatherv { send: Some(send.len()), recv: recv.len(), counts, displs } => elem::<T>)
                plan(plan_allgatherv(Some(send), recv, counts, displs));
            #[doc = $crate::operations::op_doc!(allgatherv_in_place)]
            fn allgatherv_in_place / iallgatherv_in_place <T: Element> (buf: [out], counts: (&[usize]), displs: (&[usize]))
                describe($crate::operations::Allgatherv { send: None, recv: buf.len(), counts, displs } => elem::<T>)
                plan(plan_allgatherv(None, buf, counts, displs));
            #[doc = $crate::operations::op_doc!(alltoall)]
            #[doc(alias = "all_to_all")]
            fn alltoall / ialltoall <T: Element> (send: [in], recv: [out])
                describe($crate::operations::Alltoall { send: Some(send.len()), recv: recv.len() } => elem::<T>)
                plan(plan_alltoall(Some(send), recv));
            #[doc = $crate::operations::op_doc!(alltoall_in_place)]
            fn alltoall_in_place / ialltoall_in_place <T: Element> (buf: [out])
                describe($crate::operations::Alltoall { send: None, recv: buf.len() } => elem::<T>)
                plan(plan_alltoall(None, buf));
            #[doc = $crate::operations::op_doc!(alltoallv)]
            fn alltoallv / ialltoallv <T: Element> (
                send: [in], send_counts: (&[usize]), send_displs: (&[usize]),
                recv: [out], recv_counts: (&[usize]), recv_displs: (&[usize])
            )
                describe($crate::operations::Alltoallv {
                    send: send.len(), send_counts, send_displs, recv: recv.len(), recv_counts, recv_displs
                } => elem::<T>)
                plan(plan_alltoallv(send, send_counts, send_displs, recv, recv_counts, recv_displs));
            #[doc = $crate::operations::op_doc!(gather)]
            fn gather / igather <T: Element> (send: [in], recv: [out], root: (usize))
                describe($crate::operations::Gather { send: Some(send.len()), recv: recv.len(), root } => elem::<T>)
                plan(plan_gather(Some(send), recv, root));
            #[doc = $crate::operations::op_doc!(gather_in_place)]
            fn gather_in_place / igather_in_place <T: Element> (buf: [out], root: (usize))
                describe($crate::operations::Gather { send: None, recv: buf.len(), root } => elem::<T>)
                plan(plan_gather(None, buf, root));
            #[doc = $crate::operations::op_doc!(gatherv)]
            fn gatherv / igatherv <T: Element>
                (send: [in], recv: [out], counts: (&[usize]), displs: (&[usize]), root: (usize))
                describe($crate::operations::Gatherv { send: Some(send.len()), recv: recv.len(), counts, displs, root } => elem::<T>)
                plan(plan_gatherv(Some(send), recv, counts, displs, root));
            #[doc = $crate::operations::op_doc!(gatherv_in_place)]
            fn gatherv_in_place / igatherv_in_place <T: Element>
                (buf: [out], counts: (&[usize]), displs: (&[usize]), root: (usize))
                describe($crate::operations::Gatherv { send: None, recv: buf.len(), counts, displs, root } => elem::<T>)
                plan(plan_gatherv(None, buf, counts, displs, root));
            #[doc = $crate::operations::op_doc!(scatter)]
            fn scatter / iscatter <T: Element> (send: [in], recv: [out], root: (usize))
                describe($crate::operations::Scatter { send: Some(send.len()), recv: recv.len(), root } => elem::<T>)
                plan(plan_scatter(Some(send), recv, root));
            #[doc = $crate::operations::op_doc!(scatter_in_place)]
            fn scatter_in_place / iscatter_in_place <T: Element> (buf: [out], root: (usize))
                describe($crate::operations::Scatter { send: None, recv: buf.len(), root } => elem::<T>)
                plan(plan_scatter(None, buf, root));
            #[doc = $crate::operations::op_doc!(scatterv)]
            fn scatterv / iscatterv <T: Element>
                (send: [in], counts: (&[usize]), displs: (&[usize]), recv: [out], root: (usize))
                describe($crate::operations::Scatterv { send: Some(send.len()), counts, displs, recv: recv.len(), root } => elem::<T>)
                plan(plan_scatterv(Some(send), counts, displs, recv, root));
            #[doc = $crate::operations::op_doc!(scatterv_in_place)]
            fn scatterv_in_place / iscatterv_in_place <T: Element>
                (buf: [out], counts: (&[usize]), displs: (&[usize]), root: (usize))
                describe($crate::operations::Scatterv { send: None, counts, displs, recv: buf.len(), root } => elem::<T>)
                plan(plan_scatterv(None, counts, displs, buf, root));
            #[doc = $crate::operations::op_doc!(send)]
            fn send / isend <T: Element> (buf: [in], dest: (usize), tag: (i32))
                describe($crate::operations::P2p { kind: $crate::reliability::recorder::OpKind::Send, len: buf.len(), peer: Some(dest), tag, in_place: false } => elem::<T>)
                plan(plan_send(buf, dest, tag));
            #[doc = $crate::operations::op_doc!(recv)]
            fn recv / irecv <T: Element> (buf: [out], source: (usize), tag: (i32))
                describe($crate::operations::P2p { kind: $crate::reliability::recorder::OpKind::Recv, len: buf.len(), peer: Some(source), tag, in_place: false } => elem::<T>)
                plan(plan_recv(buf, source, tag));
            #[doc = $crate::operations::op_doc!(sendrecv)]
            fn sendrecv / isendrecv <T: Element> (send: [in], dest: (usize), recv: [out], source: (usize), tag: (i32))
                describe($crate::operations::P2p { kind: $crate::reliability::recorder::OpKind::SendRecv, len: send.len(), peer: Some(dest), tag, in_place: false } => elem::<T>)
                plan(plan_sendrecv(send, dest, recv, source, tag));
            #[doc = $crate::operations::op_doc!(sendrecv_in_place)]
            fn sendrecv_in_place / isendrecv_in_place <T: Element> (buf: [out], dest: (usize), source: (usize), tag: (i32))
                describe($crate::operations::P2p { kind: $crate::reliability::recorder::OpKind::SendRecv, len: buf.len(), peer: Some(dest), tag, in_place: true } => elem::<T>)
                plan(plan_sendrecv_in_place(buf, dest, source, tag));
            #[doc = $crate::operations::op_doc!(multi_sendrecv)]
            fn multi_sendrecv / imulti_sendrecv <'b, T: Element> (sends: [ins], recvs: [outs], tag: (i32))
                describe($crate::operations::P2p {
                    kind: $crate::reliability::recorder::OpKind::MultiSendRecv, len: sends.iter().map(|s| s.0.len()).sum(), peer: None, tag, in_place: false
                } => elem::<T>)
                plan(plan_multi(sends, recvs, tag));
        }
    };
}
