//! Elastic jobs: a loop of steps that goes on when ranks die, grows back by spawning
//! replacements or new ranks, and hands the newcomers the committed state from the peers'
//! memory. The protocol, its guarantees and what it needs of MPI: `docs/elastic.md`.
//!
//! ```no_run
//! use duralumin::elastic::{Elastic, Policy, State, StatePart};
//! use duralumin::{MpiCommunicator, Sum};
//!
//! struct Model(Vec<f64>);
//! impl State for Model {
//!     fn global(&mut self) -> Vec<&mut dyn StatePart> {
//!         vec![&mut self.0]
//!     }
//! }
//!
//! let universe = duralumin::init()?;
//! let mut job = Elastic::new(&universe, Policy::default())?;
//! let mut model = Model(vec![0.0; 1024]);
//! job.run(&mut model, 100, |comm| MpiCommunicator::new(comm), |comm, model, step| {
//!     let grad = vec![step.rank as f64; model.0.len()];
//!     let mut sum = vec![0.0; grad.len()];
//!     comm.allreduce(&grad, &mut sum, Sum)?;
//!     model.0.iter_mut().zip(&sum).for_each(|(m, g)| *m -= 0.01 * g);
//!     Ok(())
//! })?;
//! # Ok::<(), duralumin::Error>(())
//! ```
//!
//! Recovering from a rank's death needs an MPI library with ULFM, run with fault tolerance on
//! (Open MPI 5: `mpirun --with-ft ulfm`, and the flags `docs/elastic.md` gives). On an MPI
//! without ULFM (Open MPI 4.1) the job runs and grows by spawn, and a failure ends the run with
//! [`Error::Unsupported`] (if the MPI library has not ended the job first).

mod member;
mod plan;
mod recovery;
mod state;

use std::time::{Duration, Instant};

use mpi::topology::SimpleCommunicator;

pub use member::Member;
#[cfg(feature = "cuda")]
pub use state::CudaState;
pub use state::{HostDeviceState, State, StatePart};

use crate::api::error::{Error, Result};
use crate::ffi::{self, RawComm};
use crate::{MpiCommunicator, Universe};
use state::Store;

/// How an elastic job changes its membership. Every rank must use the same policy (the
/// callbacks run on one rank, see each).
pub struct Policy {
    /// The fewest ranks the job goes on with: below it, [`Elastic::run`] returns
    /// [`Error::Membership`] (default 1).
    pub min: usize,
    /// The most ranks it grows to (default: no limit).
    pub max: usize,
    /// Whether lost ranks are replaced by spawned ones (default `true`); without, the job
    /// shrinks to the survivors.
    pub respawn: bool,
    /// Steps between commits (default 1). A failure rolls every rank back to the last commit.
    pub commit_every: u64,
    /// The deadline of every operation of the steps and of the recovery (default 30 s).
    pub timeout: Duration,
    /// The program spawned processes run, and its arguments (default: this program, with the
    /// arguments it was started with).
    pub program: Option<(String, Vec<String>)>,
    discovery: Option<Discovery>,
    observer: Option<Observer>,
}

/// How many ranks the job should have now: called on rank 0 after each commit with the
/// current size and the step.
type Discovery = Box<dyn FnMut(usize, u64) -> usize>;
/// Called on every rank at each [`Event`].
type Observer = Box<dyn FnMut(&Event)>;

impl Default for Policy {
    fn default() -> Self {
        Policy {
            min: 1,
            max: usize::MAX,
            respawn: true,
            commit_every: 1,
            timeout: Duration::from_secs(30),
            program: None,
            discovery: None,
            observer: None,
        }
    }
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("min", &self.min)
            .field("max", &self.max)
            .field("respawn", &self.respawn)
            .field("commit_every", &self.commit_every)
            .field("timeout", &self.timeout)
            .field("program", &self.program)
            .field("discovery", &self.discovery.is_some())
            .finish_non_exhaustive()
    }
}

impl Policy {
    /// Sets the discovery callback: after each commit, rank 0 calls it with the job's size
    /// and step, and the job grows (spawning ranks) or shrinks (the highest slots leave) to
    /// the size it returns, kept within [`min`](Self::min)..=[`max`](Self::max). In the
    /// spirit of Horovod's host-discovery script.
    #[must_use]
    pub fn discovery(mut self, f: impl FnMut(usize, u64) -> usize + 'static) -> Self {
        self.discovery = Some(Box::new(f));
        self
    }

    /// Sets a callback every rank calls at each [`Event`] (to log membership changes, or
    /// to inject faults at a protocol point in tests).
    #[must_use]
    pub fn observer(mut self, f: impl FnMut(&Event) + 'static) -> Self {
        self.observer = Some(Box::new(f));
        self
    }
}

/// A point of the protocol, as the [`Policy::observer`] sees it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Event {
    /// This rank's state was saved for the commit before `step`, not yet replicated.
    Committing {
        /// The step the commit is taken before.
        step: u64,
    },
    /// A recovery or resize reached `stage`: `"shrunk"`, `"spawned"`, `"merged"` (on the
    /// spawned ranks too), `"planned"` (every member knows who sends what), `"transferred"`
    /// (the new membership is agreed).
    Recovering {
        /// The stage just finished.
        stage: &'static str,
    },
    /// The membership changed; the job goes on from `change.step`.
    Changed(Change),
}

/// Why the membership changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// Ranks died (or gave up): the slots lost.
    Failure,
    /// The discovery callback asked for this size.
    Discovery(usize),
    /// This rank was spawned and joined the job.
    Joined,
}

/// One change of membership, as every member saw it.
#[derive(Clone, Debug)]
pub struct Change {
    /// Why.
    pub cause: Cause,
    /// The step the job goes on from (the last commit).
    pub step: u64,
    /// The size before, as this rank knew it (0 on a joining rank).
    pub from: usize,
    /// The size after.
    pub to: usize,
    /// The slots (workers, numbered once and kept across changes) no longer in the job.
    pub lost: Vec<u64>,
    /// The slots whose ranks were spawned.
    pub joined: Vec<u64>,
    /// Why the runtime would not start the ranks the policy asked for (no free slot, …), if it
    /// would not: the job went on smaller.
    pub spawn_refused: Option<String>,
    /// Where the time went.
    pub timings: Timings,
}

/// The stages of one change of membership, as this rank measured them.
#[derive(Clone, Copy, Debug, Default)]
pub struct Timings {
    /// From the failed step's error (or the commit that asked to resize) to the end of the
    /// agreement that everyone recovers.
    pub detect: Duration,
    /// `MPIX_Comm_shrink` (zero when nobody died).
    pub shrink: Duration,
    /// `MPI_Comm_spawn` (zero when nobody joins).
    pub spawn: Duration,
    /// `MPI_Intercomm_merge`, and the communicator over everyone.
    pub merge: Duration,
    /// The state handed to the joiners, the replicas made again, the communicator rebuilt.
    pub transfer: Duration,
    /// The whole change.
    pub total: Duration,
}

/// Where a step is, passed to the step function.
#[derive(Clone, Copy, Debug)]
pub struct Step {
    /// The step's number, from 0.
    pub step: u64,
    /// This rank in the job now.
    pub rank: usize,
    /// The job's size now.
    pub size: usize,
    /// This rank's slot (its worker's number, kept across changes; a replacement takes the
    /// slot of the rank it replaces).
    pub slot: u64,
}

/// How [`Elastic::run`] ended on this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every step ran; the job has `size` ranks.
    Done {
        /// The job's size at the end.
        size: usize,
    },
    /// The discovery callback shrank the job and this rank left it before `step`.
    Left {
        /// The first step it did not run.
        step: u64,
    },
}

/// An elastic job: the membership, the committed state, the changes so far.
pub struct Elastic {
    policy: Policy,
    /// The communicator over the members (this driver's own; the steps' communicator is built
    /// from `owner`).
    ctl: Option<MpiCommunicator>,
    owner: Option<SimpleCommunicator>,
    /// The merged communicator of a joining rank, until its first [`Elastic::run`], and the
    /// deadline of its joining.
    join: Option<RawComm>,
    join_deadline: Option<std::sync::mpsc::Sender<()>>,
    /// This rank's slot (`None` on a joiner until it is given one) and every member's, in
    /// rank order.
    slot: Option<u64>,
    members: Vec<u64>,
    step: u64,
    store: Store,
    /// Why the current change's spawn was refused, if it was (for its [`Change`]).
    spawn_refused: Option<String>,
    changes: Vec<Change>,
}

impl std::fmt::Debug for Elastic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elastic")
            .field("slot", &self.slot)
            .field("members", &self.members)
            .field("step", &self.step)
            .field("changes", &self.changes.len())
            .finish_non_exhaustive()
    }
}

/// Whether this process was spawned by an elastic job (it joins it in [`Elastic::new`]).
/// MPI must be initialized.
pub fn is_spawned() -> Result<bool> {
    Ok(ffi::spawn::parent()?.is_some())
}

/// The agreement's bits: this rank's step (and commit) went well; this rank saw nothing worse
/// than a failure of other ranks.
const OK: u32 = 1;
const SANE: u32 = 2;

/// The AND of every member's `bits` over `ctl`, and whether a failure of a rank was seen:
/// ULFM's fault-tolerant agreement (`MPIX_Comm_agree`), or on an MPI without ULFM an
/// allreduce (a rank's death ends the job there anyway; the recovery that a clear bit starts
/// stops at its shrink with [`Error::Unsupported`], and growing by spawn works).
fn agree(ctl: &MpiCommunicator, bits: u32) -> Result<(u32, bool)> {
    if ffi::ulfm::available() {
        return ffi::ulfm::agree_bits(ctl.raw(), bits);
    }
    let mut all = [0u32];
    ctl.allreduce(&[bits], &mut all, crate::BitAnd)?;
    Ok((all[0], false))
}

/// After an agreement in which a rank's error was not a failure of another: whether any member
/// knows of a dead rank (the error may then be the death's doing, and the job recovers). Every
/// member gets the same answer.
fn someone_died(ctl: &MpiCommunicator) -> Result<bool> {
    if !ffi::ulfm::available() {
        return Ok(false);
    }
    let none = ffi::ulfm::failed_ranks(ctl.raw()).is_ok_and(|f| f.is_empty());
    let (all, failed) = agree(ctl, u32::from(none))?;
    Ok(all == 0 || failed)
}

/// Whether `e` is what a dead or departed rank makes the others' calls return.
fn is_failure(e: &Error) -> bool {
    matches!(e, Error::ProcessFailed { .. } | Error::Revoked | Error::Aborted { .. } | Error::Timeout { .. })
}

impl Elastic {
    /// Joins the job: on a process `mpirun` started, the members are `MPI_COMM_WORLD`'s ranks;
    /// on a process an elastic job spawned, this merges with the job (its state and step
    /// arrive in [`run`](Self::run)). Collective over the world, or with the spawning job.
    pub fn new(universe: &Universe, policy: Policy) -> Result<Self> {
        if policy.commit_every == 0 || policy.min == 0 || policy.min > policy.max {
            return Err(Error::InvalidConfig(
                "elastic policy: commit_every and min must be at least 1, min at most max",
            ));
        }
        let mut job = Elastic {
            policy,
            ctl: None,
            owner: None,
            join: None,
            join_deadline: None,
            slot: None,
            members: Vec::new(),
            step: 0,
            store: Store::default(),
            spawn_refused: None,
            changes: Vec::new(),
        };
        if let Some(parent) = ffi::spawn::parent()? {
            job.join_deadline = Some(recovery::join_deadline(job.policy.timeout * 2));
            job.join = Some(recovery::join_parent(parent)?);
            job.notify(&Event::Recovering { stage: "merged" });
            return Ok(job);
        }
        use mpi::topology::Communicator;
        let owner = universe.world().duplicate();
        job.install(owner)?;
        job.slot = Some(job.rank() as u64);
        job.members = (0..job.size() as u64).collect();
        Ok(job)
    }

    /// This rank in the job now.
    pub fn rank(&self) -> usize {
        self.ctl.as_ref().map_or(0, MpiCommunicator::rank)
    }

    /// The job's size now (0 on a joiner before [`run`](Self::run)).
    pub fn size(&self) -> usize {
        self.ctl.as_ref().map_or(0, MpiCommunicator::size)
    }

    /// The next step to run (after [`run`](Self::run): the number of steps run).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// Whether this process was spawned into a running job.
    pub fn joined(&self) -> bool {
        self.changes.first().is_some_and(|c| c.cause == Cause::Joined) || self.join.is_some()
    }

    /// The communicator over the members now (in slot order), for work outside the steps:
    /// [`Error::Membership`] on a rank that is not a member (a joiner before
    /// [`run`](Self::run), a rank that left).
    pub fn communicator(&self) -> Result<&SimpleCommunicator> {
        self.owner.as_ref().ok_or(Error::Membership("this rank is not a member of the job".into()))
    }

    /// Every change of membership this rank went through, oldest first.
    pub fn changes(&self) -> &[Change] {
        &self.changes
    }

    /// Runs steps until `steps` have run. `make` builds the steps' communicator from the
    /// members' (again after each change); `step` runs one step on it. A step that fails
    /// because a rank died is rolled back on every rank to the last commit and run again
    /// once the membership is repaired (by the [`Policy`]), so `step` must be a function of
    /// the state, the step number and the rank and size it is given. An error that is not a
    /// failure of another rank ends the run on every rank.
    pub fn run<C: Member, S: State>(
        &mut self,
        state: &mut S,
        steps: u64,
        mut make: impl FnMut(&SimpleCommunicator) -> Result<C>,
        mut step: impl FnMut(&mut C, &mut S, Step) -> Result<()>,
    ) -> Result<Outcome> {
        let mut comm = self.start(state, &mut make)?;
        while self.step < steps {
            let next = self.step + 1;
            let commit = next % self.policy.commit_every == 0 || next == steps;
            let info = Step { step: self.step, rank: self.rank(), size: self.size(), slot: self.slot.unwrap_or(0) };
            let mut r = step(&mut comm, state, info);
            let failed_at = Instant::now();
            if r.is_ok() && !commit {
                self.step = next;
                continue;
            }
            if r.is_ok() {
                r = self.commit(state, next);
            }
            match self.settle(&comm, r)? {
                true => {
                    self.store.promote();
                    self.step = next;
                    if let Some(out) = self.resize(state, &mut make, &mut comm)? {
                        return Ok(out);
                    }
                }
                false => {
                    drop(comm);
                    comm = self.recover(state, &mut make, Cause::Failure, failed_at)?;
                }
            }
        }
        Ok(Outcome::Done { size: self.size() })
    }

    /// The steps' first communicator: on a joiner after receiving the state, elsewhere after
    /// the commit of the state before the first step (so that a failure in it rolls back).
    fn start<C: Member, S: State>(
        &mut self,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
    ) -> Result<C> {
        if let Some(merged) = self.join.take() {
            let comm = self.rejoin(recovery::Start::Merged(merged), state, make, Cause::Joined, Instant::now());
            self.join_deadline = None;
            return comm;
        }
        if self.store.committed.is_empty() {
            let r = self.commit(state, self.step);
            let ctl = self.ctl()?;
            if !self.agree_on(ctl, r)? {
                return self.recover(state, make, Cause::Failure, Instant::now());
            }
            self.store.promote();
        }
        self.build(make)
    }

    /// The uniform outcome of a step (and its commit): `true` when every rank's went well
    /// and nobody died; `false` when the job must recover; the error when a rank failed for
    /// another reason than another's failure (on that rank its own error, elsewhere
    /// [`Error::Membership`]).
    fn settle<C: Member>(&self, comm: &C, r: Result<()>) -> Result<bool> {
        if matches!(&r, Err(e) if is_failure(e)) && !ffi::ulfm::available() {
            // Nothing can wake the other ranks or shrink the job: they end at their deadline,
            // or when the MPI library ends the job.
            return Err(Error::Unsupported(
                "recovering from a failed step needs an MPI library with ULFM (Open MPI 5 with `mpirun --with-ft \
                 ulfm`, docs/elastic.md)",
            ));
        }
        if r.is_err() {
            // Nobody may stay waiting in this step: every rank's next call fails, and they
            // all come to the agreement.
            let _ = comm.give_up();
        }
        self.agree_on(self.ctl()?, r)
    }

    /// See [`settle`](Self::settle): the agreement over `ctl`.
    fn agree_on(&self, ctl: &MpiCommunicator, r: Result<()>) -> Result<bool> {
        let bits = match &r {
            Ok(()) => OK | SANE,
            Err(e) if is_failure(e) => SANE,
            Err(_) => 0,
        };
        if bits != OK | SANE {
            let _ = ctl.revoke();
        }
        let (all, failed) = agree(ctl, bits)?;
        if all & SANE == 0 && !failed && !someone_died(ctl)? {
            return Err(match r {
                Err(e) if !is_failure(&e) => e,
                _ => Error::Membership("another rank stopped with an error that is not a failure of a rank".into()),
            });
        }
        Ok(all & OK != 0 && !failed)
    }

    /// Saves the state as the commit before `step` and replicates this rank's local parts to
    /// the next rank. The commit counts once the agreement after it says so.
    fn commit<S: State>(&mut self, state: &mut S, step: u64) -> Result<()> {
        let mut g = self.store.blank();
        g.step = step;
        state::save(state.global(), &mut g.global)?;
        state::save(state.local(), &mut g.local)?;
        self.notify(&Event::Committing { step });
        let ctl = self.ctl()?;
        let reuse = g.replica.take().map(|(_, bytes)| bytes);
        g.replica = recovery::replicate(ctl, &self.members, &g.local, reuse)?;
        self.store.pending = Some(g);
        Ok(())
    }

    /// Calls the observer.
    fn notify(&mut self, event: &Event) {
        if let Some(f) = self.policy.observer.as_mut() {
            f(event);
        }
    }

    /// The driver's communicator.
    fn ctl(&self) -> Result<&MpiCommunicator> {
        self.ctl.as_ref().ok_or(Error::Membership("this rank is not a member of the job".into()))
    }

    /// Makes `owner` the members' communicator.
    fn install(&mut self, owner: SimpleCommunicator) -> Result<()> {
        use crate::elastic::member::Member as _;
        let mut ctl = MpiCommunicator::new(&owner)?;
        ctl.return_errors(self.policy.timeout);
        self.ctl = Some(ctl);
        self.owner = Some(owner);
        Ok(())
    }

    /// The steps' communicator over the members, returning its errors.
    fn build<C: Member>(&self, make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>) -> Result<C> {
        let mut comm = make(self.communicator()?)?;
        comm.return_errors(self.policy.timeout);
        Ok(comm)
    }

    /// After an agreed commit: asks the discovery callback for the size wanted and grows or
    /// shrinks to it. `Some` when this rank left the job.
    fn resize<C: Member, S: State>(
        &mut self,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
        comm: &mut C,
    ) -> Result<Option<Outcome>> {
        let Some(wanted) = self.wanted_size()? else { return Ok(None) };
        let started = Instant::now();
        if wanted < self.size() {
            let Some(owner) = recovery::leave(self, wanted)? else {
                return Ok(Some(Outcome::Left { step: self.step }));
            };
            let _ = std::mem::replace(
                comm,
                self.rejoin(recovery::Start::Kept(owner), state, make, Cause::Discovery(wanted), started)?,
            );
            return Ok(None);
        }
        let ctl = self.ctl.take().ok_or(Error::Membership("this rank is not a member of the job".into()))?;
        let start = recovery::Start::Grow(ctl, wanted);
        let _ = std::mem::replace(comm, self.rejoin(start, state, make, Cause::Discovery(wanted), started)?);
        Ok(None)
    }

    /// The size the discovery callback wants now, within the policy's bounds, when it differs
    /// from the size (rank 0 asks; every rank learns it).
    fn wanted_size(&mut self) -> Result<Option<usize>> {
        if self.policy.discovery.is_none() {
            return Ok(None);
        }
        let (size, step) = (self.size(), self.step);
        let mut wanted = [0u64];
        if self.rank() == 0 {
            let f = self.policy.discovery.as_mut().ok_or(Error::Progress("no discovery callback"))?;
            wanted[0] = f(size, step).clamp(self.policy.min, self.policy.max) as u64;
        }
        self.ctl()?.bcast(&mut wanted, 0)?;
        let wanted = usize::try_from(wanted[0]).map_err(|_| Error::Membership("rank 0 asked for no size".into()))?;
        Ok((wanted != size).then_some(wanted))
    }

    /// Repairs the membership after a failure (the survivors shrink, then respawn by the
    /// policy) and rolls the state back to the last commit every survivor holds.
    fn recover<C: Member, S: State>(
        &mut self,
        state: &mut S,
        make: &mut impl FnMut(&SimpleCommunicator) -> Result<C>,
        cause: Cause,
        since: Instant,
    ) -> Result<C> {
        let ctl = self.ctl.take().ok_or(Error::Membership("this rank is not a member of the job".into()))?;
        self.owner = None;
        self.rejoin(recovery::Start::Failed(ctl), state, make, cause, since)
    }
}
