// Multi-rank tests of every backend: Mpi and HostTransfer on the host device here, the device
// groups (HostTransfer on CUDA, on a GPU or on cudasim, and NCCL, on a GPU or on ncclsim) in
// `tests/device_ranks`, built from this same source as a second binary so the two
// compile in parallel (`docs/testing.md`).
//
// Run by `cargo test`, this binary is the launcher: one trial per rank count (1..=5), each
// starting `mpirun --oversubscribe -np N` on this same binary with `DURALUMIN_RANK_PROGRAM`
// set, bounded by a timeout, and failing with the ranks' output if any rank fails. Under
// mpirun, the binary is the rank program: one MPI initialization, then every test group.
// Each rank keeps where it is (group, backend, case) in memory the launcher can read however
// the rank ends, so a failure's message leads with the case that failed on each rank, or that
// each rank was in when the job hung (`case.rs`, `common/rank_case.rs`).
//
// This file is the root of `mpi_ranks` and, included, of `device_ranks` (tests/device_ranks/main.rs):
// the binary's name chooses its groups and trials, as a constant, so each compiles only its own
// (see `DEVICE`). It holds no inner attributes, which an included file may not.

// Test values are cut from counters, ranks and random numbers on purpose (all small, or wanted
// modulo the type): the cast lints are noise in every module. (An included file may hold no
// inner attribute, so each module carries them.)
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod backend;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod bad_input;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod case;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
#[cfg(feature = "cuda")]
mod cuda;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod elements;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod engine;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod generic;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod host_transfer;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod launcher;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
#[path = "../common/mpirun.rs"]
mod mpirun;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
#[cfg(feature = "cuda")]
mod nccl;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod p2p;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod sweep;
#[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
mod topology;

use std::time::Instant;

use duralumin::mpi::topology::SimpleCommunicator;
use duralumin::{MpiCommunicator, Tuning};

/// The tuning the sweep runs with: thresholds low enough that the "big" count goes through
/// every algorithm (`Auto` on one node: the shared-memory window; a non-blocking one before any
/// blocking one has made the window: the ring), pipelines through several segments and chunks,
/// and is split into several MPI messages (the large-count path; messages to other nodes in
/// smaller pieces still), while counts 0, 1 and 7 take the native paths (on several nodes,
/// `Auto` runs recursive doubling for those allreduces).
pub fn small_thresholds() -> Tuning {
    Tuning::default()
        .with_allreduce_ring_bytes(256)
        .with_ring_segment_bytes(64)
        .with_reduce_ring_bytes(256)
        .with_reduce_root_ring_bytes(256)
        .with_bcast_chain_bytes(256)
        .with_bcast_chunk_bytes(64)
        .with_max_message_elements(50)
        .with_hierarchical_allreduce_bytes(256)
        .with_hierarchical_bcast_bytes(256)
        .with_hierarchical_reduce_scatter_bytes(256)
        .with_hierarchical_allgather_bytes(256)
        .with_hierarchical_chunk_bytes(256)
        .with_network_message_bytes(64)
        .with_shared_memory_allreduce_bytes(256)
}

/// Counts every operation is tested with: empty, one, odd, and above every threshold.
pub const COUNTS: [usize; 4] = [0, 1, 7, 300];

fn main() {
    if let Ok(program) = std::env::var("DURALUMIN_RANK_PROGRAM") {
        rank_main(&program);
        return;
    }
    launcher::main();
}

/// A named group of checks run on every rank.
type Group = (&'static str, fn(&MpiCommunicator, &SimpleCommunicator));

/// Whether this is the `device_ranks` binary (the device groups and their trials) rather than
/// `mpi_ranks` (the host groups): its name, as a constant, so each binary compiles only its own
/// groups and the two build in parallel.
const DEVICE: bool = named(env!("CARGO_CRATE_NAME"), "device_ranks");

const fn named(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The `mpi_ranks` binary's groups: Mpi and HostTransfer on the host device.
fn host_groups() -> Vec<Group> {
    vec![
        ("sweep", |c, _| sweep::run(c, "Mpi")),
        ("p2p", |c, _| p2p::run(c)),
        ("bad_input", |c, _| bad_input::run(c)),
        ("engine", |c, _| engine::run(c)),
        ("topology", topology::run),
        ("threads", |c, _| engine::threads(c)),
        ("host_transfer", host_transfer::run),
        ("generic", generic::run),
    ]
}

/// The `device_ranks` binary's groups: HostTransfer on CUDA and the NCCL backend.
fn device_groups() -> Vec<Group> {
    #[cfg(feature = "cuda")]
    return vec![
        ("cuda", cuda::run),
        ("nccl", nccl::run),
        ("nccl_faults", nccl::faults),
        ("nccl_watchdog", nccl::watchdog),
        ("nccl_missing", nccl::missing_library),
    ];
    #[cfg(not(feature = "cuda"))]
    Vec::new()
}

fn rank_main(program: &str) {
    let universe = duralumin::init().expect("MPI init");
    // The user pairs' device kernels (the custom-kernels example's), for the device backends.
    duralumin_example_custom_kernels::register().expect("registering the user kernels");
    let world = universe.world();
    let mut comm = MpiCommunicator::new(&world).expect("communicator");
    mpirun::rank_case::start(comm.rank());
    comm.set_tuning(small_thresholds());
    // A constant condition: the other binary's groups are not compiled into this one.
    let groups = if DEVICE { device_groups() } else { host_groups() };
    for (name, group) in groups {
        // The GPU groups run only when asked for by name (the `cuda_np*`, `nccl_np*` trials).
        // `program` is a group, `all` (every group but the GPU ones), or groups joined by `+`.
        let listed = program.split('+').any(|p| p == name);
        if !listed && (program != "all" || name == "cuda" || name.starts_with("nccl")) {
            continue;
        }
        #[cfg(feature = "cuda")]
        if (name == "cuda" || name.starts_with("nccl")) && duralumin::device::cuda::device_count() == 0 {
            if comm.rank() == 0 {
                println!("rank group {name}: SKIPPED: no CUDA device");
            }
            continue;
        }
        let _group = mpirun::rank_case::enter(format!("group {name}"));
        let t = Instant::now();
        group(&comm, &world);
        comm.barrier().expect("barrier after group");
        if comm.rank() == 0 {
            println!("rank group {name}: ok on {} ranks in {:.2?}", comm.size(), t.elapsed());
        }
    }
    drop(comm);
    if program == "all" || program == "engine" {
        engine::after_drop();
    }
}
