//! Where the library's spans go: a Chrome trace (`--trace`, the `tracing-chrome` crate; each
//! span is an asynchronous slice from its creation to its close, so the chunks of one
//! operation, which the proxy thread runs interleaved, show overlapping) and NVTX ranges
//! (`--nvtx`, feature `nvtx`) for Nsight Systems. Without either, no subscriber is installed
//! and the library's spans cost a check of a cached flag.

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
    let registry = registry.with(nvtx.then(nvtx::tracing::NvtxLayer::default));
    #[cfg(not(feature = "nvtx"))]
    if nvtx {
        return Err("--nvtx: this duralumin-perf was built without the nvtx feature".into());
    }
    registry.try_init()?;
    Ok(TraceGuard { _chrome: guard })
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
