//! Every operation as a `tracing` span, from the call that starts it to its end (for a
//! stream-ordered operation: until its host part is over), with what it is: operation, bytes,
//! element, operator, algorithm, communicator and sequence number. HostTransfer's proxy thread
//! opens its pipeline steps as children of it (`backends::host_transfer::steps`). Why spans and
//! what they cost: `docs/perf.md`.
//!
//! A span exists only while a subscriber wants it: with none (`tracing`'s default), making one
//! is a check of the callsite's cached interest, and nothing is stored.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use tracing::Span;

use super::recorder::{OpKind, Signature};

/// Numbers communicators for the spans' `comm` field, from 1 in creation order per process.
static NEXT_COMM: AtomicU64 = AtomicU64::new(1);

/// Whether operations get spans at all (on unless the span-cost benchmark turns them off).
static ENABLED: AtomicBool = AtomicBool::new(true);

/// See [`crate::reliability::set_operation_spans`].
pub(crate) fn set_enabled(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether an operation's span would be kept: spans are on and a subscriber wants the
/// target's spans. A backend that must compute a span's fields first (NCCL, which keeps no
/// flight record) asks this before it does.
pub(crate) fn wanted() -> bool {
    ENABLED.load(Ordering::Relaxed) && tracing::enabled!(target: "duralumin", tracing::Level::INFO)
}

/// A number for a new communicator.
pub(crate) fn next_comm() -> u64 {
    NEXT_COMM.fetch_add(1, Ordering::Relaxed)
}

/// The span of operation `seq` of communicator `comm` (disabled without a subscriber).
pub(crate) fn operation(sig: &Signature, seq: u64, comm: u64) -> Span {
    if !ENABLED.load(Ordering::Relaxed) {
        return Span::none();
    }
    // Span names are static per callsite: one callsite per kind.
    macro_rules! span {
        ($($kind:ident => $name:literal),* $(,)?) => {
            match sig.kind {
                $(OpKind::$kind => tracing::info_span!(
                    target: "duralumin",
                    $name,
                    bytes = sig.count.saturating_mul(u64::from(sig.elem_size)),
                    element = sig.elem,
                    operator = sig.operator,
                    algorithm = sig.algorithm,
                    comm,
                    seq,
                    in_place = sig.in_place,
                ),)*
            }
        };
    }
    span!(
        Barrier => "barrier", Bcast => "bcast", Allreduce => "allreduce", Reduce => "reduce",
        Allgather => "allgather", Allgatherv => "allgatherv", Alltoall => "alltoall",
        Alltoallv => "alltoallv", Gather => "gather", Gatherv => "gatherv", Scatter => "scatter",
        Scatterv => "scatterv", ReduceScatter => "reduce_scatter", ReduceScatterv => "reduce_scatterv",
        Send => "send", Recv => "recv", SendRecv => "sendrecv", MultiSendRecv => "multi_sendrecv",
        Dup => "dup", Split => "split", Drop => "drop",
    )
}

/// The open spans of a communicator's operations, by record number (empty without a
/// subscriber).
#[derive(Debug, Default)]
pub(crate) struct OpSpans {
    open: Vec<(u64, Span)>,
}

impl OpSpans {
    /// Keeps `span` open for record `rec` (a disabled span is not kept).
    pub(crate) fn open(&mut self, rec: u64, span: Span) {
        if !span.is_disabled() {
            self.open.push((rec, span));
        }
    }

    /// Record `rec`'s span, to be closed by the caller (after any lock is let go).
    pub(crate) fn take(&mut self, rec: u64) -> Option<Span> {
        let i = self.open.iter().position(|(r, _)| *r == rec)?;
        Some(self.open.swap_remove(i).1)
    }

    /// Record `rec`'s span, still open (a handle to it).
    pub(crate) fn get(&self, rec: u64) -> Option<Span> {
        self.open.iter().find(|(r, _)| *r == rec).map(|(_, s)| s.clone())
    }
}
