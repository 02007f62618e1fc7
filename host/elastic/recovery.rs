//! Changing the membership: shrink to the survivors, spawn and merge the newcomers, agree on
//! the commit to go on from, hand each newcomer its state, replicate again
//! (`docs/elastic.md`). Every stage ends in an agreement, so that a rank dying during a
//! recovery sends every member back to the start of the next attempt rather than leaving
//! some waiting.

use std::time::{Duration, Instant};

use mpi::raw::FromRaw;
use mpi::topology::SimpleCommunicator;

use super::plan::{Info, Plan};
use super::{Cause, Change, Elastic, Event, Member, OK, SANE, State, Timings, is_failure, state};
use crate::MpiCommunicator;
use crate::api::error::{Error, Result};
use crate::ffi::{self, RawComm};

/// Attempts at one change of membership before giving up (each is cut short only by another
/// rank's death).
const ATTEMPTS: usize = 8;

/// The tags of the state transfers.
const TAG_GLOBAL: i32 = 71;
const TAG_LOCAL: i32 = 72;
const TAG_REPLICA: i32 = 73;

/// Where a change of membership starts.
pub(super) enum Start {
    /// A step failed: shrink to the survivors first.
    Failed(MpiCommunicator),
    /// Nobody failed; grow to this size.
    Grow(MpiCommunicator, usize),
    /// A spawned rank, merged with the job.
    Merged(RawComm),
    /// The members that stay after others left.
    Kept(SimpleCommunicator),
}

/// How an attempt ended short of success.
enum Stop {
    /// Another rank died meanwhile: start again over this communicator's survivors.
    Retry(Box<MpiCommunicator>),
    Fatal(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Fatal(e)
    }
}

/// A joining rank's side of the merge.
pub(super) fn join_parent(parent: RawComm) -> Result<RawComm> {
    let merged = ffi::spawn::merge(parent, true);
    // SAFETY: the parent communicator is this process's own and nothing uses it after the
    // merge.
    unsafe { ffi::comm::free(parent) };
    merged
}

/// Ends this process if it has not joined the job within `limit` (until the returned sender
/// is dropped): a joiner the job gave up on (its spawners died, or retried without it) waits
/// in MPI calls no deadline reaches, and has no one to report to.
pub(super) fn join_deadline(limit: Duration) -> std::sync::mpsc::Sender<()> {
    let (joined, wait) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if wait.recv_timeout(limit) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            eprintln!("duralumin elastic: this spawned rank did not join the job within {limit:?}: exiting");
            // SAFETY: ends the process at once, without running destructors or MPI's
            // finalization, which would wait on the job that gave this rank up.
            unsafe { libc::_exit(75) };
        }
    });
    joined
}

/// Copies `local` (this rank's local parts) to the next member and returns the copy the
/// previous one sent, with its slot. Collective over `ctl`.
pub(super) fn replicate(ctl: &MpiCommunicator, members: &[u64], local: &[u8]) -> Result<Option<(u64, Vec<u8>)>> {
    let (rank, size) = (ctl.rank(), ctl.size());
    if size < 2 || local.is_empty() {
        return Ok(None);
    }
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let mut copy = vec![0u8; local.len()];
    ctl.sendrecv(local, next, &mut copy, prev, TAG_REPLICA)?;
    let slot =
        members.get(prev).copied().ok_or(Error::Membership("the members' list is shorter than the job".into()))?;
    Ok(Some((slot, copy)))
}

/// The ranks above `keep` leave the job (after an agreed commit); the rest get the
/// communicator over them. `None` on a rank that left. Collective over the job.
pub(super) fn leave(job: &mut Elastic, keep: usize) -> Result<Option<SimpleCommunicator>> {
    let ctl = job.ctl()?;
    let stays = ctl.rank() < keep;
    let color = if stays { 0 } else { mpi_undefined() };
    let kept = ffi::comm::split(ctl.raw(), color, ffi::c_rank(ctl.rank()))?;
    if !stays {
        job.ctl = None;
        job.owner = None;
        return Ok(None);
    }
    let raw = kept.ok_or(Error::Membership("the split of the staying ranks made no communicator".into()))?;
    // SAFETY: `raw` was made by the split above and is owned by nobody else.
    Ok(Some(unsafe { SimpleCommunicator::from_raw(raw.0) }))
}

/// `MPI_UNDEFINED`, the color of a rank that joins no part of a split.
fn mpi_undefined() -> std::ffi::c_int {
    #[allow(clippy::cast_possible_wrap, reason = "MPI_UNDEFINED is a small negative int in every MPI")]
    let undefined = ffi::sys::MPI_UNDEFINED as std::ffi::c_int;
    undefined
}

impl Elastic {
    /// Changes the membership from `start` and returns the steps' communicator over the new
    /// members, the state rolled back (or, on a joiner, loaded) to the commit the job goes on
    /// from.
    pub(super) fn rejoin<C: Member, S: State>(
        &mut self,
        mut start: Start,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
        cause: Cause,
        since: Instant,
    ) -> Result<C> {
        let from = self.members.len();
        let mut t = Timings { detect: since.elapsed(), ..Timings::default() };
        for _ in 0..ATTEMPTS {
            match self.attempt(start, state, make, &mut t) {
                Ok((comm, plan)) => {
                    t.total = since.elapsed();
                    let change = Change {
                        cause,
                        step: self.step,
                        from,
                        to: self.members.len(),
                        lost: plan.lost,
                        joined: plan.joined,
                        timings: t,
                    };
                    self.notify(&Event::Changed(change.clone()));
                    self.changes.push(change);
                    return Ok(comm);
                }
                Err(Stop::Retry(ctl)) => start = Start::Failed(*ctl),
                Err(Stop::Fatal(e)) => return Err(e),
            }
        }
        Err(Error::Membership(format!("ranks kept dying: gave up after {ATTEMPTS} attempts to recover")))
    }

    /// One attempt: the communicator over everyone who takes part (survivors and newcomers),
    /// then the new membership over it.
    fn attempt<C: Member, S: State>(
        &mut self,
        start: Start,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
        t: &mut Timings,
    ) -> Result<(C, Plan), Stop> {
        let (all, target) = match start {
            Start::Failed(ctl) => {
                let began = Instant::now();
                let survivors = ctl.shrink()?;
                t.shrink += began.elapsed();
                self.notify(&Event::Recovering { stage: "shrunk" });
                let target = self.target(&survivors)?;
                (self.gather(survivors, target, t)?, target)
            }
            Start::Grow(ctl, wanted) => (self.gather(ctl, wanted, t)?, wanted),
            Start::Merged(raw) => (with_errors(MpiCommunicator::from_raw_comm(raw), self.policy.timeout)?, 0),
            Start::Kept(owner) => {
                let kept = with_errors(MpiCommunicator::new(&owner), self.policy.timeout)?;
                let size = kept.size();
                (kept, size)
            }
        };
        let began = Instant::now();
        let r = self.settle_members(&all, target, state, make);
        let ok = bits_of(&r);
        if ok != OK | SANE {
            let _ = all.revoke();
        }
        let (agreed, failed) = ffi::ulfm::agree_bits(all.raw(), ok)?;
        t.transfer += began.elapsed();
        if agreed & SANE == 0 {
            return Err(Stop::Fatal(fatal(r)));
        }
        if agreed & OK == 0 || failed {
            self.ctl = None;
            self.owner = None;
            return Err(Stop::Retry(Box::new(all)));
        }
        self.notify(&Event::Recovering { stage: "transferred" });
        r.map_err(Stop::Fatal)
    }

    /// The size to repair to, as the lowest survivor holding the job's membership decides it,
    /// once every survivor agrees it knows it (a survivor dying now sends all to the next
    /// attempt, rather than some into a spawn the others never join).
    fn target(&self, survivors: &MpiCommunicator) -> Result<usize, Stop> {
        let known = self.members.len();
        let mine = if self.policy.respawn { known.max(survivors.size()) } else { survivors.size() };
        let mut target = [if known > 0 { mine.min(self.policy.max) as u64 } else { 0 }];
        let sent = survivors.bcast(&mut target, 0);
        if sent.is_err() {
            let _ = survivors.revoke();
        }
        let (agreed, failed) = ffi::ulfm::agree_bits(survivors.raw(), u32::from(sent.is_ok()))?;
        if agreed == 0 || failed {
            let again = survivors.shrink()?;
            return Err(Stop::Retry(Box::new(again)));
        }
        let target = usize::try_from(target[0]).unwrap_or(0);
        if target == 0 {
            return Err(Stop::Fatal(Error::Membership("no rank that held the job's state survived".into())));
        }
        if target < self.policy.min {
            return Err(Stop::Fatal(Error::Membership(format!(
                "{target} ranks left, fewer than the policy's minimum {} (respawn off)",
                self.policy.min
            ))));
        }
        Ok(target)
    }

    /// Spawns the ranks missing from `target` over `members` and merges them in: the
    /// communicator over everyone, once every member agrees it has it.
    fn gather(&mut self, members: MpiCommunicator, target: usize, t: &mut Timings) -> Result<MpiCommunicator, Stop> {
        let count = target.saturating_sub(members.size());
        if count == 0 {
            return Ok(members);
        }
        let (program, args) = self.program()?;
        let began = Instant::now();
        let inter = ffi::spawn::spawn(members.raw(), &program, &args, count, 0);
        t.spawn += began.elapsed();
        self.notify(&Event::Recovering { stage: "spawned" });
        let began = Instant::now();
        let merged = inter.and_then(|inter| {
            let merged = ffi::spawn::merge(inter, false);
            // SAFETY: made by the spawn above; nothing uses it after the merge.
            unsafe { ffi::comm::free(inter) };
            with_errors(MpiCommunicator::from_raw_comm(merged?), self.policy.timeout)
        });
        let (agreed, failed) = ffi::ulfm::agree_bits(members.raw(), u32::from(merged.is_ok()))?;
        t.merge += began.elapsed();
        match merged {
            Ok(all) if agreed == 1 && !failed => {
                self.notify(&Event::Recovering { stage: "merged" });
                Ok(all)
            }
            Ok(all) => {
                let _ = all.revoke();
                Err(Stop::Retry(Box::new(members)))
            }
            Err(e) if is_failure(&e) || agreed == 0 => Err(Stop::Retry(Box::new(members))),
            Err(e) => Err(Stop::Fatal(e)),
        }
    }

    /// The program spawned ranks run.
    fn program(&self) -> Result<(String, Vec<String>)> {
        if let Some(p) = &self.policy.program {
            return Ok(p.clone());
        }
        let exe = std::env::current_exe().map_err(|_| Error::InvalidConfig("cannot name this program to spawn it"))?;
        Ok((exe.display().to_string(), std::env::args().skip(1).collect()))
    }

    /// Over `all` (survivors and newcomers): agree on the commit to go on from and who holds
    /// which slot, hand the state to those without it, and make the new members'
    /// communicator (ranks in slot order), its replicas and the steps' communicator.
    fn settle_members<C: Member, S: State>(
        &mut self,
        all: &MpiCommunicator,
        target: usize,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
    ) -> Result<(C, Plan)> {
        let local_len = state::bytes(state.local());
        let plan = self.plan(all, target, local_len)?;
        let mut g = self.received_state(all, &plan, state)?;
        let raw = ffi::comm::split(all.raw(), 0, ffi::c_rank(plan.new_rank[all.rank()]))?
            .ok_or(Error::Membership("the split of the members made no communicator".into()))?;
        // SAFETY: `raw` was made by the split above and is owned by nobody else.
        self.install(unsafe { SimpleCommunicator::from_raw(raw.0) })?;
        self.members = plan.members.clone();
        self.slot = Some(plan.slot[all.rank()]);
        g.replica = replicate(self.ctl()?, &self.members, &g.local)?;
        state::load(state.global(), &g.global)?;
        state::load(state.local(), &g.local)?;
        self.step = plan.step;
        self.store.committed = vec![g];
        self.store.pending = None;
        let comm = self.build(make)?;
        Ok((comm, plan))
    }

    /// What every member holds, gathered, and the plan every member derives from it alike.
    fn plan(&self, all: &MpiCommunicator, target: usize, local_len: usize) -> Result<Plan> {
        let mine = Info::of(self.slot, &self.store, self.members.len(), target, local_len);
        let mut infos = vec![0u64; Info::WORDS * all.size()];
        all.allgather(&mine.words(), &mut infos)?;
        let infos: Vec<Info> = infos.chunks_exact(Info::WORDS).map(Info::from_words).collect();
        let root = Plan::holder(&infos)?;
        let mut old =
            self.members.iter().copied().chain(std::iter::repeat(0)).take(infos[root].members).collect::<Vec<_>>();
        all.bcast(&mut old, root)?;
        Plan::new(&infos, &old, self.policy.respawn)
    }

    /// This rank's committed copy at the plan's step: its own, or the one the plan has
    /// others send it (the global parts from the holder, the local ones from the rank that
    /// held its slot's replica; a fresh slot's from this rank's state as it is).
    fn received_state<S: State>(
        &mut self,
        all: &MpiCommunicator,
        plan: &Plan,
        state: &mut S,
    ) -> Result<state::Generation> {
        let me = all.rank();
        let mut g = match self.store.at(plan.step) {
            Some(_) if plan.has_state[me] => self.take_generation(plan.step),
            _ => {
                let mut g = state::Generation { step: plan.step, ..Default::default() };
                state::save(state.global(), &mut g.global)?;
                state::save(state.local(), &mut g.local)?;
                g
            }
        };
        for &(src, dst) in &plan.global_sends {
            if src == me {
                all.send(&g.global, dst, TAG_GLOBAL)?;
            } else if dst == me {
                all.recv(&mut g.global, src, TAG_GLOBAL)?;
            }
        }
        for &(src, dst, slot, replica) in &plan.local_sends {
            if src == me {
                let bytes = if replica { replica_of(&g, slot)? } else { &g.local };
                all.send(bytes, dst, TAG_LOCAL)?;
            } else if dst == me {
                all.recv(&mut g.local, src, TAG_LOCAL)?;
            }
        }
        Ok(g)
    }

    /// The committed generation of `step`, taken out of the store.
    fn take_generation(&mut self, step: u64) -> state::Generation {
        let at = self.store.committed.iter().position(|g| g.step == step).unwrap_or(0);
        self.store.committed.swap_remove(at)
    }
}

/// The replica of `slot`'s local parts in `g`.
fn replica_of(g: &state::Generation, slot: u64) -> Result<&[u8]> {
    match &g.replica {
        Some((s, bytes)) if *s == slot => Ok(bytes),
        _ => Err(Error::Membership(format!("this rank holds no replica of slot {slot} at step {}", g.step))),
    }
}

/// The communicator, returning its errors under the policy's deadline.
fn with_errors(comm: Result<MpiCommunicator>, timeout: Duration) -> Result<MpiCommunicator> {
    let mut comm = comm?;
    comm.return_errors(timeout);
    Ok(comm)
}

/// The agreement's bits for `r` (see [`super::OK`]).
fn bits_of<T>(r: &Result<T>) -> u32 {
    match r {
        Ok(_) => OK | SANE,
        Err(e) if is_failure(e) => SANE,
        Err(_) => 0,
    }
}

/// The error a rank ends with when a member's error was not a failure: its own, or one that
/// says another rank's was.
fn fatal<T>(r: Result<T>) -> Error {
    match r {
        Err(e) if !is_failure(&e) => e,
        _ => Error::Membership("another rank stopped with an error that is not a failure of a rank".into()),
    }
}
