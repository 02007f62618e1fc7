//! Changing the membership: shrink to the survivors, spawn and merge the newcomers, agree on
//! the commit to go on from, hand each newcomer its state, replicate again
//! (`docs/elastic.md`). Every stage ends in an agreement, so that a rank dying during a
//! recovery sends every member back to the start of the next attempt rather than leaving
//! some waiting.

use std::time::{Duration, Instant};

use mpi::raw::FromRaw;
use mpi::topology::SimpleCommunicator;

use super::plan::{Info, Plan};
use super::{Cause, Change, Elastic, Event, Member, OK, SANE, State, Timings, agree, is_failure, state};
use crate::MpiCommunicator;
use crate::api::error::{Error, Result};
use crate::ffi::{self, RawComm};

/// Attempts at one change of membership before giving up (each is cut short only by another
/// rank's death, or a spawn or merge that failed on some members).
const ATTEMPTS: usize = 8;

/// The bit of the spawn's agreement that says the runtime refused to start the ranks.
const REFUSED: u32 = 2;

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
/// in MPI calls no deadline reaches, and has no one to report to. It exits with status 0: the
/// job goes on without it, and a failing status would end the job's `mpirun` in failure.
pub(super) fn join_deadline(limit: Duration) -> std::sync::mpsc::Sender<()> {
    let (joined, wait) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if wait.recv_timeout(limit) == Err(std::sync::mpsc::RecvTimeoutError::Timeout) {
            eprintln!("duralumin elastic: this spawned rank did not join the job within {limit:?}: exiting");
            // SAFETY: ends the process at once, without running destructors or MPI's
            // finalization, which would wait on the job that gave this rank up.
            unsafe { libc::_exit(0) };
        }
    });
    joined
}

/// Copies `local` (this rank's local parts) to the next member and returns the copy the
/// previous one sent (into `reuse`'s memory, if given), with its slot. Collective over `ctl`.
pub(super) fn replicate(
    ctl: &MpiCommunicator,
    members: &[u64],
    local: &[u8],
    reuse: Option<Vec<u8>>,
) -> Result<Option<(u64, Vec<u8>)>> {
    let (rank, size) = (ctl.rank(), ctl.size());
    if size < 2 || local.is_empty() {
        return Ok(None);
    }
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    let mut copy = reuse.unwrap_or_default();
    copy.resize(local.len(), 0);
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
        // A resize asked for this size: an attempt that a death cuts short still aims for it.
        let goal = match (&start, &cause) {
            (Start::Grow(_, wanted), _) => Some(*wanted),
            (_, Cause::Discovery(wanted)) => Some(*wanted),
            _ => None,
        };
        for _ in 0..ATTEMPTS {
            match self.attempt(start, goal, state, make, &mut t) {
                Ok((comm, plan)) => {
                    t.total = since.elapsed();
                    let change = Change {
                        cause,
                        step: self.step,
                        from,
                        to: self.members.len(),
                        lost: plan.lost,
                        joined: plan.joined,
                        spawn_refused: self.spawn_refused.take(),
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
        Err(Error::Membership(format!(
            "gave up after {ATTEMPTS} attempts to change the membership, each cut short by a rank's death or a spawn or \
             merge that failed on some members"
        )))
    }

    /// One attempt: the communicator over everyone who takes part (survivors and newcomers),
    /// then the new membership over it.
    fn attempt<C: Member, S: State>(
        &mut self,
        start: Start,
        goal: Option<usize>,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
        t: &mut Timings,
    ) -> Result<(C, Plan), Stop> {
        let all = match start {
            Start::Failed(ctl) => {
                let began = Instant::now();
                let survivors = ctl.shrink()?;
                t.shrink += began.elapsed();
                self.notify(&Event::Recovering { stage: "shrunk" });
                let target = self.target(&survivors, goal)?;
                self.gather(survivors, target, t)?
            }
            Start::Grow(ctl, wanted) => self.gather(ctl, wanted, t)?,
            Start::Merged(raw) => with_errors(MpiCommunicator::from_raw_comm(raw), self.policy.timeout)?,
            Start::Kept(owner) => with_errors(MpiCommunicator::new(&owner), self.policy.timeout)?,
        };
        let began = Instant::now();
        let planned = self.plan(&all, state::bytes(state.local()));
        let derived_alike = matches!(planned, Err(Error::Membership(_)));
        let r = planned.and_then(|plan| self.settle_members(&all, plan, state, make));
        let ok = bits_of(&r);
        // A plan's error is derived alike by every member from what the plan's exchanges gave
        // all of them: no member waits for this one, so nothing is revoked. Revoking would
        // interrupt a slower member still in those exchanges, which would then end without
        // the reason ("another member could not plan").
        if ok != OK | SANE && !derived_alike {
            let _ = all.revoke();
        }
        let (agreed, failed) = agree(&all, ok)?;
        t.transfer += began.elapsed();
        if agreed & SANE == 0 && !failed && claimed(&all, &r)? {
            return Err(Stop::Fatal(fatal(r)));
        }
        if agreed & OK == 0 || failed {
            self.ctl = None;
            self.owner = None;
            return Err(Stop::Retry(Box::new(all)));
        }
        let settled = r.map_err(Stop::Fatal)?;
        self.notify(&Event::Recovering { stage: "transferred" });
        Ok(self.apply(settled))
    }

    /// The size to repair to (`goal` when a resize asked for one), as the lowest survivor
    /// holding the job's membership decides it,
    /// once every survivor agrees it knows it (a survivor dying now sends all to the next
    /// attempt, rather than some into a spawn the others never join).
    fn target(&self, survivors: &MpiCommunicator, goal: Option<usize>) -> Result<usize, Stop> {
        let known = self.members.len();
        let repaired = if self.policy.respawn { known.max(survivors.size()) } else { survivors.size() };
        let mine = goal.unwrap_or(repaired);
        let mut target = [if known > 0 { mine.min(self.policy.max) as u64 } else { 0 }];
        let sent = survivors.bcast(&mut target, 0);
        if sent.is_err() {
            let _ = survivors.revoke();
        }
        let (agreed, failed) = agree(survivors, u32::from(sent.is_ok()))?;
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
        // The runtime could not start the ranks (no free slot, no such program): not a death.
        let refused = match &inter {
            Err(e) if !is_failure(e) => Some(e.to_string()),
            _ => None,
        };
        self.notify(&Event::Recovering { stage: "spawned" });
        let began = Instant::now();
        let merged = inter.and_then(|inter| {
            let merged = ffi::spawn::merge(inter, false);
            // SAFETY: made by the spawn above; nothing uses it after the merge.
            unsafe { ffi::comm::free(inter) };
            with_errors(MpiCommunicator::from_raw_comm(merged?), self.policy.timeout)
        });
        let bits = u32::from(merged.is_ok()) | if refused.is_some() { REFUSED } else { 0 };
        let (agreed, failed) = agree(&members, bits)?;
        t.merge += began.elapsed();
        match merged {
            Ok(all) if agreed & 1 == 1 && !failed => {
                self.notify(&Event::Recovering { stage: "merged" });
                Ok(all)
            }
            Ok(all) => {
                let _ = all.revoke();
                Err(Stop::Retry(Box::new(members)))
            }
            Err(_) if agreed & REFUSED != 0 && !failed => self.without_newcomers(members, refused),
            Err(_) => Err(Stop::Retry(Box::new(members))),
        }
    }

    /// Every member's spawn was refused: the job goes on over `members` if the policy's minimum
    /// allows (the change says why it is smaller), else stops with the reason.
    fn without_newcomers(&mut self, members: MpiCommunicator, why: Option<String>) -> Result<MpiCommunicator, Stop> {
        let why = why.unwrap_or_else(|| "the spawn was refused".into());
        if members.size() < self.policy.min {
            return Err(Stop::Fatal(Error::Membership(format!(
                "cannot spawn ranks ({why}), and {} ranks are fewer than the policy's minimum {}",
                members.size(),
                self.policy.min
            ))));
        }
        self.spawn_refused = Some(why);
        Ok(members)
    }

    /// The program spawned ranks run.
    fn program(&self) -> Result<(String, Vec<String>)> {
        if let Some(p) = &self.policy.program {
            return Ok(p.clone());
        }
        let exe = std::env::current_exe().map_err(|_| Error::InvalidConfig("cannot name this program to spawn it"))?;
        Ok((exe.display().to_string(), std::env::args().skip(1).collect()))
    }

    /// Over `all` (survivors and newcomers), with the `plan` every member derived
    /// ([`Self::plan`]: the commit to go on from and who holds which slot): hand the state to
    /// those without it, and make the new members' communicator (ranks in slot order), its
    /// replicas and the steps' communicator. Changes nothing of this rank's membership or
    /// commits (the agreement after it may still send everyone to another attempt); the
    /// program's state is loaded from the commit.
    fn settle_members<C: Member, S: State>(
        &mut self,
        all: &MpiCommunicator,
        plan: Plan,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
    ) -> Result<Settled<C>> {
        self.notify(&Event::Recovering { stage: "planned" });
        let me = all.rank();
        let fresh = if plan.has_state[me] {
            self.send_state(all, &plan)?;
            None
        } else {
            Some(receive_state(all, &plan, state)?)
        };
        let g = match &fresh {
            Some(g) => g,
            None => self.store.at(plan.step).ok_or(Error::Membership("this rank lost its own commit".into()))?,
        };
        let raw = ffi::comm::split(all.raw(), 0, ffi::c_rank(plan.new_rank[me]))?
            .ok_or(Error::Membership("the split of the members made no communicator".into()))?;
        // SAFETY: `raw` was made by the split above and is owned by nobody else.
        let owner = unsafe { SimpleCommunicator::from_raw(raw.0) };
        let ctl = with_errors(MpiCommunicator::new(&owner), self.policy.timeout)?;
        let replica = replicate(&ctl, &plan.members, &g.local, None)?;
        state::load(state.global(), &g.global)?;
        state::load(state.local(), &g.local)?;
        let mut comm = make(&owner)?;
        comm.return_errors(self.policy.timeout);
        let slot = plan.slot[me];
        Ok(Settled { owner, ctl, comm, plan, slot, fresh, replica })
    }

    /// The new membership, once every member agreed on it.
    fn apply<C>(&mut self, s: Settled<C>) -> (C, Plan) {
        let step = s.plan.step;
        match s.fresh {
            Some(g) => self.store.committed = vec![g],
            None => self.store.committed.retain(|g| g.step == step),
        }
        if let Some(g) = self.store.committed.first_mut() {
            g.replica = s.replica;
        }
        self.store.pending = None;
        self.step = step;
        self.members = s.plan.members.clone();
        self.slot = Some(s.slot);
        self.ctl = Some(s.ctl);
        self.owner = Some(s.owner);
        (s.comm, s.plan)
    }

    /// A holder's part of the plan's transfers: the global parts to each newcomer, and its own
    /// local parts or the replica it kept to the newcomer that takes the slot.
    fn send_state(&self, all: &MpiCommunicator, plan: &Plan) -> Result<()> {
        let me = all.rank();
        let g = self.store.at(plan.step).ok_or(Error::Membership("this rank lost its own commit".into()))?;
        for &(_, dst) in plan.global_sends.iter().filter(|(src, _)| *src == me) {
            all.send(&g.global, dst, TAG_GLOBAL)?;
        }
        for &(_, dst, slot, replica) in plan.local_sends.iter().filter(|s| s.0 == me) {
            let bytes = if replica { replica_of(g, slot)? } else { &g.local };
            all.send(bytes, dst, TAG_LOCAL)?;
        }
        Ok(())
    }

    /// What every member holds, gathered, and the plan every member derives from it alike.
    fn plan(&self, all: &MpiCommunicator, local_len: usize) -> Result<Plan> {
        let mine = Info::of(self.slot, &self.store, self.members.len(), local_len);
        let mut infos = vec![0u64; Info::WORDS * all.size()];
        all.allgather(&mine.words(), &mut infos)?;
        let infos: Vec<Info> = infos.chunks_exact(Info::WORDS).map(Info::from_words).collect();
        let root = Plan::holder(&infos)?;
        let mut old =
            self.members.iter().copied().chain(std::iter::repeat(0)).take(infos[root].members).collect::<Vec<_>>();
        all.bcast(&mut old, root)?;
        Plan::new(&infos, &old, self.policy.respawn)
    }
}

/// What a settled attempt made, applied once every member agreed on it.
struct Settled<C> {
    owner: SimpleCommunicator,
    ctl: MpiCommunicator,
    comm: C,
    plan: Plan,
    slot: u64,
    /// The commit this rank received (`None`: it holds its own).
    fresh: Option<state::Generation>,
    replica: Option<(u64, Vec<u8>)>,
}

/// A newcomer's part of the plan's transfers: the commit of the plan's step, its global parts
/// from the holder and, for a slot that had a rank before, its local parts from the rank that
/// kept them (a fresh slot's local parts are this rank's state as it is).
fn receive_state<S: State>(all: &MpiCommunicator, plan: &Plan, state: &mut S) -> Result<state::Generation> {
    let me = all.rank();
    let mut g = state::Generation { step: plan.step, ..Default::default() };
    state::save(state.global(), &mut g.global)?;
    state::save(state.local(), &mut g.local)?;
    for &(src, _) in plan.global_sends.iter().filter(|(_, dst)| *dst == me) {
        all.recv(&mut g.global, src, TAG_GLOBAL)?;
    }
    for &(src, ..) in plan.local_sends.iter().filter(|s| s.1 == me) {
        all.recv(&mut g.local, src, TAG_LOCAL)?;
    }
    Ok(g)
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

/// The agreement's bits for an attempt's outcome `r` (see [`super::OK`]). Only a plan error
/// (`Error::Membership`: derived alike on every member from what all reported) ends the job;
/// any other error sends everyone to another attempt, since a death during an attempt shows
/// up as MPI errors of any kind (communicator creation, transfers).
fn bits_of<T>(r: &Result<T>) -> u32 {
    match r {
        Ok(_) => OK | SANE,
        Err(Error::Membership(_)) => 0,
        Err(_) => SANE,
    }
}

/// After an agreement whose `SANE` bit came back clear: whether a member still here says its
/// plan failed (`r` is this rank's outcome). When none does, the bit was cleared by a member
/// that is gone since (a newcomer the runtime ended), and the attempt is retried rather than
/// ending every member with a reason no one holds.
fn claimed<T>(all: &MpiCommunicator, r: &Result<T>) -> Result<bool, Stop> {
    let mine = u32::from(!matches!(r, Err(Error::Membership(_))));
    let (none, failed) = agree(all, mine)?;
    Ok(none == 0 && !failed)
}

/// The error a rank ends with when a member's plan failed: its own, or one that says another
/// member's did.
fn fatal<T>(r: Result<T>) -> Error {
    match r {
        Err(e @ Error::Membership(_)) => e,
        _ => Error::Membership("another member could not plan the new membership".into()),
    }
}
