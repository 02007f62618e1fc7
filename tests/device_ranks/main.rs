//! The device groups of the multi-rank tests: HostTransfer on CUDA (a GPU or cudasim) and the
//! NCCL backend (a GPU or ncclsim). The same source as `tests/mpi_ranks` (its `main.rs`),
//! built as a second binary that holds only these groups, so the two binaries compile in
//! parallel (`docs/testing.md`).
// As in tests/mpi_ranks: test values are cut from counters, ranks and random numbers on purpose.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

include!("../mpi_ranks/main.rs");
