//! Who holds what after a change of membership, and who sends what to whom: a pure function
//! of what every member reported ([`Info`]), so every member derives the same plan
//! (`docs/elastic.md`). What a member reports is untrusted: an inconsistent report is an
//! [`Error::Membership`] on every member alike, never an out-of-range index.

use super::state::Store;
use crate::api::error::{Error, Result};

/// "None" in a report's words.
const NONE: u64 = u64::MAX;

/// What one member reports: its slot, its two newest commits (step, and the slot whose
/// replica it kept with each), the size of the membership it knows, and the length of its
/// local parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Info {
    pub slot: Option<u64>,
    pub commits: [Option<(u64, Option<u64>)>; 2],
    pub members: usize,
    pub local_len: u64,
}

impl Info {
    /// Words per report.
    pub const WORDS: usize = 7;

    pub fn of(slot: Option<u64>, store: &Store, members: usize, local_len: usize) -> Info {
        let mut commits = [None; 2];
        for (c, g) in commits.iter_mut().zip(&store.committed) {
            *c = Some((g.step, g.replica.as_ref().map(|(s, _)| *s)));
        }
        Info { slot, commits, members, local_len: local_len as u64 }
    }

    pub fn words(&self) -> [u64; Self::WORDS] {
        let opt = |v: Option<u64>| v.unwrap_or(NONE);
        let [a, b] = self.commits;
        [
            opt(self.slot),
            opt(a.map(|c| c.0)),
            opt(a.and_then(|c| c.1)),
            opt(b.map(|c| c.0)),
            opt(b.and_then(|c| c.1)),
            self.members as u64,
            self.local_len,
        ]
    }

    pub fn from_words(w: &[u64]) -> Info {
        let get = |i: usize| w.get(i).copied().unwrap_or(NONE);
        let opt = |v: u64| (v != NONE).then_some(v);
        let commit = |i: usize| opt(get(i)).map(|step| (step, opt(get(i + 1))));
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        Info { slot: opt(get(0)), commits: [commit(1), commit(3)], members: size(get(5)), local_len: get(6) }
    }

    /// Whether this member holds the commit of `step`.
    fn holds(&self, step: u64) -> bool {
        self.slot.is_some() && self.commits.iter().flatten().any(|c| c.0 == step)
    }

    /// Whether this member holds, at `step`, the replica of `slot`'s local parts.
    fn holds_replica(&self, step: u64, slot: u64) -> bool {
        self.commits.iter().flatten().any(|c| c.0 == step && c.1 == Some(slot))
    }
}

/// The new membership and the transfers that make it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The commit the job goes on from: the oldest newest commit of the members that hold one.
    pub step: u64,
    /// Per member (by its rank in the communicator over everyone): whether it holds that
    /// commit, its slot, and its rank in the new membership.
    pub has_state: Vec<bool>,
    pub slot: Vec<u64>,
    pub new_rank: Vec<usize>,
    /// Every slot, in the new membership's rank order.
    pub members: Vec<u64>,
    /// The global parts: (from, to).
    pub global_sends: Vec<(usize, usize)>,
    /// Local parts: (from, to, slot, whether from a replica).
    pub local_sends: Vec<(usize, usize, u64, bool)>,
    /// The slots of the old membership that are gone, and the slots given to newcomers.
    pub lost: Vec<u64>,
    pub joined: Vec<u64>,
}

impl Plan {
    /// The step to go on from and the first member holding it.
    fn step_and_holder(infos: &[Info]) -> Result<(u64, usize)> {
        let step = infos
            .iter()
            .filter(|i| i.slot.is_some())
            .filter_map(|i| i.commits[0].map(|c| c.0))
            .min()
            .ok_or(Error::Membership("no member holds a committed state: every rank that held one died".into()))?;
        let holder = infos.iter().position(|i| i.holds(step)).unwrap_or(0);
        Ok((step, holder))
    }

    /// The member every other learns the old membership from.
    pub fn holder(infos: &[Info]) -> Result<usize> {
        Self::step_and_holder(infos).map(|(_, h)| h)
    }

    /// The plan from every member's report and the old membership (`old`, as the holder
    /// knows it). Newcomers take the slots of the dead when `respawn`, fresh slots otherwise.
    pub fn new(infos: &[Info], old: &[u64], respawn: bool) -> Result<Plan> {
        let (step, holder) = Self::step_and_holder(infos)?;
        for (r, i) in infos.iter().enumerate() {
            if i.slot.is_some() && i.commits[0].is_some() && !i.holds(step) {
                return Err(Error::Membership(format!(
                    "rank {r} holds the commits {:?}, not the one of step {step} the others go on from",
                    i.commits
                )));
            }
        }
        let has_state: Vec<bool> = infos.iter().map(|i| i.holds(step)).collect();
        let live: Vec<u64> = infos.iter().zip(&has_state).filter(|(_, h)| **h).filter_map(|(i, _)| i.slot).collect();
        let mut dead: Vec<u64> = old.iter().copied().filter(|s| !live.contains(s)).collect();
        dead.sort_unstable();
        dead.dedup();
        let mut plan = Plan { step, has_state, slot: vec![0; infos.len()], ..Plan::default() };
        let mut fresh = old.iter().chain(&live).copied().max().map_or(0, |m| m + 1);
        let mut refill = dead.iter().copied().filter(|_| respawn);
        let local = infos[holder].local_len > 0;
        for (r, i) in infos.iter().enumerate() {
            if plan.has_state[r] {
                plan.slot[r] = i.slot.unwrap_or(0);
                continue;
            }
            let slot = refill.next().unwrap_or_else(|| {
                fresh += 1;
                fresh - 1
            });
            plan.slot[r] = slot;
            plan.joined.push(slot);
            plan.global_sends.push((holder, r));
            if local && dead.contains(&slot) {
                let from =
                    infos.iter().position(|i| i.holds(step) && i.holds_replica(step, slot)).ok_or_else(|| {
                        Error::Membership(format!(
                            "slot {slot}'s local state of step {step} is lost: its rank and the rank holding its only \
                         replica both died"
                        ))
                    })?;
                plan.local_sends.push((from, r, slot, true));
            }
        }
        plan.lost = dead.into_iter().filter(|s| !plan.joined.contains(s)).collect();
        plan.members = plan.slot.clone();
        plan.members.sort_unstable();
        if plan.members.windows(2).any(|w| w[0] == w[1]) {
            return Err(Error::Membership(format!("two members report the same slot: {:?}", plan.slot)));
        }
        plan.new_rank = plan.slot.iter().map(|s| plan.members.partition_point(|m| m < s)).collect();
        Ok(plan)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn survivor(slot: u64, step: u64, replica: u64, members: usize) -> Info {
        Info { slot: Some(slot), commits: [Some((step, Some(replica))), None], members, local_len: 8 }
    }

    fn joiner() -> Info {
        Info { slot: None, commits: [None, None], members: 0, local_len: 8 }
    }

    #[test]
    fn words_round_trip() {
        let i = Info { slot: Some(3), commits: [Some((9, Some(2))), Some((8, None))], members: 4, local_len: 7 };
        assert_eq!(Info::from_words(&i.words()), i);
        assert_eq!(Info::from_words(&joiner().words()), joiner());
        // A short report reads as a member with nothing.
        assert_eq!(Info::from_words(&[]).slot, None);
    }

    #[test]
    fn a_replacement_takes_the_dead_slot_and_its_replica() {
        // Slot 1 of 0..4 died; slot 2 held its replica.
        let infos = [survivor(0, 5, 3, 4), survivor(2, 5, 1, 4), survivor(3, 5, 2, 4), joiner()];
        let plan = Plan::new(&infos, &[0, 1, 2, 3], true).unwrap();
        assert_eq!(plan.step, 5);
        assert_eq!(plan.slot, vec![0, 2, 3, 1]);
        assert_eq!(plan.new_rank, vec![0, 2, 3, 1]);
        assert_eq!(plan.global_sends, vec![(0, 3)]);
        assert_eq!(plan.local_sends, vec![(1, 3, 1, true)]);
        assert_eq!((plan.lost.clone(), plan.joined.clone()), (vec![], vec![1]));
    }

    #[test]
    fn shrinking_drops_the_dead_slots() {
        let infos = [survivor(0, 5, 3, 4), survivor(3, 5, 2, 4)];
        let plan = Plan::new(&infos, &[0, 1, 2, 3], false).unwrap();
        assert_eq!(plan.members, vec![0, 3]);
        assert_eq!(plan.new_rank, vec![0, 1]);
        assert_eq!(plan.lost, vec![1, 2]);
        assert!(plan.global_sends.is_empty() && plan.local_sends.is_empty());
    }

    #[test]
    fn growing_gives_fresh_slots() {
        let infos = [survivor(0, 2, 1, 2), survivor(1, 2, 0, 2), joiner(), joiner()];
        let plan = Plan::new(&infos, &[0, 1], true).unwrap();
        assert_eq!(plan.slot, vec![0, 1, 2, 3]);
        assert_eq!(plan.global_sends, vec![(0, 2), (0, 3)]);
        assert!(plan.local_sends.is_empty());
    }

    #[test]
    fn a_rank_one_commit_ahead_rolls_back() {
        let mut ahead = survivor(1, 6, 0, 2);
        ahead.commits[1] = Some((5, Some(0)));
        let infos = [survivor(0, 5, 1, 2), ahead];
        assert_eq!(Plan::new(&infos, &[0, 1], true).unwrap().step, 5);
        // Two commits ahead: the others' commit is gone from it.
        let far = survivor(1, 7, 0, 2);
        assert!(matches!(Plan::new(&[survivor(0, 5, 1, 2), far], &[0, 1], true), Err(Error::Membership(_))));
    }

    #[test]
    fn a_lost_replica_is_an_error_naming_the_slot() {
        // Slots 1 and 2 died; slot 2 held slot 1's only replica.
        let infos = [survivor(0, 5, 3, 4), survivor(3, 5, 2, 4), joiner(), joiner()];
        match Plan::new(&infos, &[0, 1, 2, 3], true) {
            Err(Error::Membership(m)) => assert!(m.contains("slot 1's local state"), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn nobody_holding_state_or_duplicate_slots_is_an_error() {
        assert!(Plan::new(&[joiner(), joiner()], &[], true).is_err());
        let infos = [survivor(0, 5, 1, 2), survivor(0, 5, 1, 2)];
        assert!(Plan::new(&infos, &[0, 1], true).is_err());
    }
}
