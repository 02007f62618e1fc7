//! Build script: compiles the small C shim that exposes MPI macro values to Rust, and the builtin
//! device kernels (`kernels/` with feature `builtin-kernels`) to PTX and AMD code objects, which
//! `host/api/device_code.rs` embeds. Without the nightly toolchain and its rust-src the kernels are
//! skipped with one warning and the library still builds (CPU paths work; GPU kernel lookups
//! return `Error::KernelsUnavailable` naming what to install).

use duralumin_kernels::builder::KernelBuilder;

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=host/ffi/shim.c");

    let mpi = match build_probe_mpi::probe() {
        Ok(lib) => lib,
        Err(errors) => {
            for e in errors {
                println!("cargo::warning=MPI probe: {e}");
            }
            panic!("duralumin needs an MPI library (Debian: apt-get install libopenmpi-dev openmpi-bin)");
        }
    };
    let mut shim = cc::Build::new();
    shim.file("host/ffi/shim.c");
    match mpi.mpicc {
        Some(mpicc) => {
            shim.compiler(mpicc);
        }
        None => {
            for dir in &mpi.include_paths {
                shim.include(dir);
            }
        }
    }
    shim.compile("duralumin_mpi_shim");

    build_kernels();
}

/// Builds the builtin kernel set into `$OUT_DIR/duralumin_kernels.rs` (see
/// `duralumin_kernels::builder`); never fails the build.
fn build_kernels() {
    let builder = KernelBuilder::new("kernels").feature("builtin-kernels").watch("Cargo.lock");
    match builder.embed("duralumin_kernels") {
        Ok(artifacts) => artifacts.warn_failures(),
        Err(e) => e.warn(),
    }
}
