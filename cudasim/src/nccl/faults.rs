//! Fault injection: `NCCLSIM_FAULT=<kind>:rank=R,call=N[;...]` makes rank `R`'s `N`-th
//! collective or send/recv call fail when its work runs, `async` with an asynchronous
//! `ncclSystemError`, `hang` by blocking until the communicator is aborted.
//!
//! Calls are counted per rank from 1 over all of this process's communicators, the rank being
//! the caller's rank in the communicator made by `ncclCommInitRank` that its communicator
//! descends from (a split communicator counts for its parent's rank): under `mpirun` the
//! process's world rank, in a test with ranks as threads each thread's own.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::lock;

/// What an injected fault does when its operation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Injected {
    /// Sets the communicator's asynchronous error to `ncclSystemError`; does not communicate.
    Async,
    /// Blocks until the communicator is aborted.
    Hang,
}

#[derive(Clone, Copy, Debug)]
struct Rule {
    kind: Injected,
    rank: usize,
    call: u64,
}

struct Faults {
    /// `None` until `NCCLSIM_FAULT` has been read.
    rules: Option<Vec<Rule>>,
    /// Calls counted so far, per rank.
    calls: BTreeMap<usize, u64>,
}

static FAULTS: Mutex<Faults> = Mutex::new(Faults { rules: None, calls: BTreeMap::new() });

/// Reads a fault list; a malformed entry is reported and ignored.
fn parse(spec: &str) -> Vec<Rule> {
    let mut rules = Vec::new();
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let rule = entry.split_once(':').and_then(|(kind, args)| {
            let kind = match kind.trim() {
                "async" => Injected::Async,
                "hang" => Injected::Hang,
                _ => return None,
            };
            let (mut rank, mut call) = (None, None);
            for arg in args.split(',') {
                match arg.trim().split_once('=') {
                    Some(("rank", v)) => rank = v.trim().parse().ok(),
                    Some(("call", v)) => call = v.trim().parse().ok(),
                    _ => return None,
                }
            }
            Some(Rule { kind, rank: rank?, call: call.filter(|&c| c > 0)? })
        });
        match rule {
            Some(r) => rules.push(r),
            None => eprintln!("ncclsim: NCCLSIM_FAULT entry {entry:?} ignored: expected async|hang:rank=R,call=N"),
        }
    }
    rules
}

/// Counts one collective or send/recv call of `rank`; the fault injected into it, if any.
pub(crate) fn next_call(rank: usize) -> Option<Injected> {
    let mut f = lock(&FAULTS);
    let rules = f.rules.get_or_insert_with(|| parse(&std::env::var("NCCLSIM_FAULT").unwrap_or_default())).clone();
    if rules.is_empty() {
        return None;
    }
    let n = f.calls.entry(rank).or_insert(0);
    *n += 1;
    let n = *n;
    rules.iter().find(|r| r.rank == rank && r.call == n).map(|r| r.kind)
}

/// Replaces the fault list (as if `NCCLSIM_FAULT` were `spec`) and restarts the counts.
#[cfg(test)]
pub(crate) fn set(spec: &str) {
    let mut f = lock(&FAULTS);
    f.rules = Some(parse(spec));
    f.calls.clear();
}
