//! Build script: compiles the small C shim that exposes MPI macro values to Rust.

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
}
