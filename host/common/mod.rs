//! What every layer uses and no user sees: raw buffers and scratch, argument checks, MPI
//! datatypes and operators, reducers, the progress engine, and the config setters' macro.

#[macro_use]
mod setters;

pub(crate) mod buffer;
pub(crate) mod check;
pub(crate) mod datatype;
pub(crate) mod progress;
pub(crate) mod reducer;
