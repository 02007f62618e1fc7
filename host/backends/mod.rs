//! Backends: where a collective's data lives and how it moves.
//!
//! * [`mpi`]: host memory, MPI plus Duralumin's own algorithms.

pub mod mpi;
