//! Multi-rank tests of every backend: Mpi and HostTransfer on the host device here, the device
//! groups (HostTransfer on CUDA, on a GPU or on cudasim, and NCCL, on a GPU or on ncclsim) in
//! `tests/device_ranks`, built from the same source (`ranks.rs`) as a second binary so the two
//! compile in parallel (`docs/testing.md`).
//!
//! Run by `cargo test`, this binary is the launcher: one trial per rank count (1..=5), each
//! starting `mpirun --oversubscribe -np N` on this same binary with `DURALUMIN_RANK_PROGRAM`
//! set, bounded by a timeout, and failing with the ranks' output if any rank fails. Under
//! mpirun, the binary is the rank program: one MPI initialization, then every test group.
//! Each rank keeps where it is (group, backend, case) in memory the launcher can read however
//! the rank ends, so a failure's message leads with the case that failed on each rank, or that
//! each rank was in when the job hung (`case.rs`, `common/rank_case.rs`).
// Test values are cut from counters, ranks and random numbers on purpose (all small, or
// wanted modulo the type): the cast lints are noise here.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

include!("ranks.rs");
