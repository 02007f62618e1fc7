//! The spans of a staged operation's pipeline steps, children of the operation's span
//! (`reliability::spans`), opened and closed by the proxy thread as it sees the counters move:
//! per chunk `k`, `stage` (the input stream copying it into the ring: from the previous
//! chunk's staging to its own, as the copies run one after another), `mpi` (its MPI part),
//! `unstage` (the output stream copying the result back, until the ring's *drained* counter
//! passes it), and the proxy thread's flag waits (`wait_staged`, `wait_done`). Each span is
//! an interval of its own, so a trace shows chunks overlapping: chunk `k + 1` staging and
//! chunk `k - 1` copying back during chunk `k`'s MPI part. Without a subscriber there is no
//! parent span and nothing here runs.

use std::collections::VecDeque;

use tracing::Span;

/// The open step spans of one operation.
pub(super) struct Steps {
    parent: Span,
    chunks: usize,
    /// The chunk being staged and its span.
    staging: Option<(usize, Span)>,
    /// Chunks being copied back, oldest first.
    unstaging: VecDeque<(usize, Span)>,
}

impl Steps {
    /// Steps under `parent` (the operation's span, if a subscriber wants it) for `chunks` chunks.
    pub(super) fn new(parent: Option<Span>, chunks: usize) -> Option<Steps> {
        Some(Steps { parent: parent?, chunks, staging: None, unstaging: VecDeque::new() })
    }

    /// A span for step `name` of chunk `k`: held while a proxy-thread step runs (`mpi`, a flag
    /// wait), or kept until the counters say a stream's step is over (`stage`, `unstage`).
    pub(super) fn during(&self, name: &'static str, k: usize) -> Span {
        macro_rules! named {
            ($($n:literal),*) => {
                match name {
                    $($n => tracing::info_span!(target: "duralumin", parent: &self.parent, $n, chunk = k),)*
                    _ => tracing::info_span!(target: "duralumin", parent: &self.parent, "step", chunk = k),
                }
            };
        }
        named!("stage", "mpi", "unstage", "wait_staged", "wait_done")
    }

    /// The stream starts staging chunk `k` (the first one, or the one after a staged chunk).
    pub(super) fn staging(&mut self, k: usize) {
        if k < self.chunks {
            self.staging = Some((k, self.during("stage", k)));
        }
    }

    /// Chunk `k`'s result goes back to the device.
    pub(super) fn unstaging(&mut self, k: usize) {
        let span = self.during("unstage", k);
        self.unstaging.push_back((k, span));
    }

    /// Moves the spans on as the counters say: chunks `is_staged` are staged, chunks
    /// `is_drained` copied back.
    pub(super) fn observe(&mut self, is_staged: impl Fn(usize) -> bool, is_drained: impl Fn(usize) -> bool) {
        while let Some(k) = self.staging.as_ref().map(|(k, _)| *k).filter(|&k| is_staged(k)) {
            // Its span closes; the next chunk's copy starts behind it on the same stream.
            self.staging = None;
            self.staging(k + 1);
        }
        while self.unstaging.front().is_some_and(|(k, _)| is_drained(*k)) {
            self.unstaging.pop_front();
        }
    }
}

/// `fut`, calling `look` before each poll (the proxy thread polls an MPI part until it ends:
/// the steps' spans move on meanwhile).
pub(super) async fn observing<F: std::future::Future>(fut: F, mut look: impl FnMut()) -> F::Output {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| {
        look();
        fut.as_mut().poll(cx)
    })
    .await
}
