//! `duralumin-perf`, the nccl-tests of Duralumin (`docs/perf.md`): every operation of every
//! backend timed over a range of sizes, checked, and printed as nccl-tests' table (size, count,
//! type, redop, root, time, algbw, busbw, #wrong; out of place and in place; enqueue time on
//! the stream-ordered backends; MPI's own operation beside it with `--native`), as CSV, JSON and
//! an SVG plot, with a Chrome trace of every operation.
//!
//! The library half holds what the benches share: the table ([`table`]) and the plots
//! ([`plot`]).

// The library half serves this program and the benches; its types are not a published API.
#![allow(missing_debug_implementations)]

pub mod args;
pub mod call;
pub mod native;
pub mod ops;
pub mod plot;
pub mod run;
pub mod spec;
pub mod table;
pub mod targets;
pub mod trace;

/// Any error, boxed: what the program reports before it exits.
pub type Boxed = Box<dyn std::error::Error + Send + Sync>;
