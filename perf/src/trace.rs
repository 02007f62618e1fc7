//! Where the library's spans go: a Chrome trace (`--trace`, the `tracing-chrome` crate; each
//! span is an asynchronous slice from its creation to its close, so the chunks of one
//! operation, which the proxy thread runs interleaved, show overlapping) and NVTX ranges
//! (`--nvtx`, feature `nvtx`: [`nvtx_ranges`]) for Nsight Systems. Without either, no
//! subscriber is installed and the library's spans cost a check of a cached flag.

use std::path::{Path, PathBuf};

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::Boxed;

/// Keeps the trace file open; it is complete once this drops.
pub struct TraceGuard {
    _chrome: Option<tracing_chrome::FlushGuard>,
}

impl std::fmt::Debug for TraceGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TraceGuard").field("chrome", &self._chrome.is_some()).finish()
    }
}

/// Rank `rank`'s trace file: `path` itself on rank 0, `path` with `.rank<r>` before its
/// extension elsewhere.
pub fn rank_path(path: &Path, rank: usize) -> PathBuf {
    if rank == 0 {
        return path.to_path_buf();
    }
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.rank{rank}.{}", ext.to_string_lossy()),
        None => format!("{stem}.rank{rank}"),
    };
    path.with_file_name(name)
}

/// Installs the subscriber for `--trace FILE` (this rank's file) and `--nvtx`, if either.
pub fn install(trace: Option<&Path>, nvtx: bool) -> Result<TraceGuard, Boxed> {
    if trace.is_none() && !nvtx {
        return Ok(TraceGuard { _chrome: None });
    }
    let (chrome, guard) = match trace {
        Some(p) => {
            let (layer, guard) = tracing_chrome::ChromeLayerBuilder::new()
                .file(p)
                .include_args(true)
                .trace_style(tracing_chrome::TraceStyle::Async)
                .build();
            (Some(layer), Some(guard))
        }
        None => (None, None),
    };
    let registry = tracing_subscriber::registry().with(chrome);
    #[cfg(feature = "nvtx")]
    let registry = registry.with(nvtx.then(nvtx_ranges::Ranges::default));
    #[cfg(not(feature = "nvtx"))]
    if nvtx {
        return Err("--nvtx: this duralumin-perf was built without the nvtx feature".into());
    }
    registry.try_init()?;
    Ok(TraceGuard { _chrome: guard })
}

/// NVTX ranges of the same extent as the Chrome trace's slices: a start/end range (not a
/// push/pop one) from a span's creation to its close, in an NVTX domain named after the span's
/// target (`duralumin`), its message the span's name and fields.
///
/// The library's spans are never *entered*: an operation's span opens on the calling thread
/// and closes on the proxy thread or the NCCL watchdog, and a chunk's steps interleave on the
/// proxy. The `nvtx` crate's own layer draws a range per entry, so it would draw none of them.
#[cfg(feature = "nvtx")]
pub mod nvtx_ranges {
    use std::collections::HashMap;
    use std::fmt::Write as _;
    use std::sync::Mutex;

    use tracing::Subscriber;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id};
    use tracing_subscriber::layer::{Context, Layer};
    use tracing_subscriber::registry::LookupSpan;

    /// The layer: one NVTX domain per target, made on its first span and kept for the process.
    #[derive(Debug, Default)]
    pub struct Ranges {
        domains: Mutex<HashMap<&'static str, &'static nvtx::Domain>>,
    }

    /// A span's open range, ended when it drops (at the span's close).
    struct Open(#[allow(dead_code)] nvtx::domain::Range<'static>);

    /// The span's name, then its fields as `name=value`.
    struct Message(String);

    impl Visit for Message {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    impl Ranges {
        fn domain(&self, target: &'static str) -> &'static nvtx::Domain {
            let mut d = self.domains.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            d.entry(target).or_insert_with(|| Box::leak(Box::new(nvtx::Domain::new(nvtx::Str::from_str_lossy(target)))))
        }
    }

    impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Ranges {
        fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
            let Some(span) = ctx.span(id) else { return };
            let mut message = Message(attrs.metadata().name().to_string());
            attrs.record(&mut message);
            let domain = self.domain(attrs.metadata().target());
            let range = domain.range(nvtx::Str::from_string_lossy(message.0));
            span.extensions_mut().insert(Open(range));
        }

        fn on_close(&self, id: Id, ctx: Context<'_, S>) {
            if let Some(span) = ctx.span(&id) {
                drop(span.extensions_mut().remove::<Open>());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_ranks_write_beside_rank_0() {
        assert_eq!(rank_path(Path::new("t/x.json"), 0), Path::new("t/x.json"));
        assert_eq!(rank_path(Path::new("t/x.json"), 3), Path::new("t/x.rank3.json"));
        assert_eq!(rank_path(Path::new("x"), 1), Path::new("x.rank1"));
    }
}
