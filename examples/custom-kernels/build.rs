//! Builds this crate's kernels (`reduce_kernels!` in src/lib.rs) for NVIDIA and AMD GPUs and writes
//! `$OUT_DIR/custom_kernels.rs`, which src/lib.rs embeds. Without the nightly toolchain and its
//! rust-src the crate still builds, with one warning, and GPU lookups of its kernels say what to
//! install.

use duralumin_kernels::builder::KernelBuilder;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    // The kernel crate is this package itself. When the nested GPU build compiles it, this script
    // runs again for that target and `embed` returns at once (BuildErrorKind::GpuTarget).
    match KernelBuilder::new(".").embed("custom_kernels") {
        Ok(artifacts) => artifacts.warn_failures(),
        Err(e) => e.warn(),
    }
}
