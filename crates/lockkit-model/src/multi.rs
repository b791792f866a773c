//! The `MultiLock`: several locks taken all or nothing.
//!
//! The contract encoded here, from `docs/guide.md` ("MultiLock — all or nothing"):
//!
//! - *"A successful acquire holds every lock; a failed or timed-out one holds none."*
//! - *"Locks are taken in name order, so multi-locks over overlapping sets cannot deadlock each
//!   other."*
//! - *"When one lock is busy, everything taken so far is given back, the busy one is waited for
//!   … A multi-lock never holds some of its locks while it waits"* (issue 11, item 3: no
//!   hold-and-wait, so it cannot deadlock with a plain holder of one member who wants another).
//! - *"An error or cancellation leaves nothing held."*
//!
//! The model is the acquisition's state machine: [`MultiLock::step`] accepts the steps the
//! contract allows and names the rule a step breaks. [`MultiLock::observe`] judges a state seen
//! from outside (which members the multi-lock's owner holds in Redis, and whether it is waiting).

use std::collections::BTreeSet;

/// Where the acquisition is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not acquiring, holding nothing.
    Idle,
    /// Taking members in name order.
    Taking,
    /// Waiting for this busy member to be released.
    Waiting(String),
    /// Holding every member.
    Holding,
}

/// One step of a multi-lock acquisition or release.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MultiStep {
    /// An acquire (or its next round) starts.
    Begin,
    /// A member was taken.
    Take(String),
    /// A member held by it was given back.
    GiveBack(String),
    /// It starts waiting for a busy member.
    Wait(String),
    /// The wait ended (a release message, the holder's TTL bound); the next round starts.
    Woken,
    /// The acquire returned a guard.
    Granted,
    /// The acquire returned without a guard (timed out, error, cancelled).
    GaveUp,
    /// The guard was released (every member given back first).
    Released,
}

/// A broken rule of the contract.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Violation {
    /// A step that cannot happen in this phase.
    UnexpectedStep(Phase, MultiStep),
    /// A member taken out of name order, or not a member.
    OutOfOrder(String),
    /// Waiting while holding these members (hold-and-wait).
    HoldAndWait(BTreeSet<String>),
    /// Granted, or returned without a guard, holding only these members.
    Subset(BTreeSet<String>),
}

/// A multi-lock acquisition (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MultiLock {
    members: Vec<String>,
    held: BTreeSet<String>,
    phase: Phase,
}

impl MultiLock {
    /// A multi-lock over `members` (duplicates count once; taken in name order).
    pub fn new<I: IntoIterator<Item = S>, S: Into<String>>(members: I) -> Self {
        let members: BTreeSet<String> = members.into_iter().map(Into::into).collect();
        Self {
            members: members.into_iter().collect(),
            held: BTreeSet::new(),
            phase: Phase::Idle,
        }
    }

    /// The members, in the order they are taken.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// The members it holds.
    pub fn held(&self) -> &BTreeSet<String> {
        &self.held
    }

    /// The phase.
    pub fn phase(&self) -> &Phase {
        &self.phase
    }

    /// Applies `step`, or names the rule it breaks.
    pub fn step(&mut self, step: MultiStep) -> Result<(), Violation> {
        let unexpected = |phase: &Phase, step: &MultiStep| {
            Err(Violation::UnexpectedStep(phase.clone(), step.clone()))
        };
        match (&self.phase, &step) {
            (Phase::Idle, MultiStep::Begin) => self.phase = Phase::Taking,
            (Phase::Taking, MultiStep::Take(member)) => {
                let next = self.members.iter().find(|m| !self.held.contains(*m));
                if next != Some(member) || self.held.len() != self.prefix_len() {
                    return Err(Violation::OutOfOrder(member.clone()));
                }
                self.held.insert(member.clone());
            }
            (Phase::Taking | Phase::Holding, MultiStep::GiveBack(member))
                if self.held.contains(member) =>
            {
                self.held.remove(member);
            }
            (Phase::Taking, MultiStep::Wait(member)) => {
                if !self.held.is_empty() {
                    return Err(Violation::HoldAndWait(self.held.clone()));
                }
                self.phase = Phase::Waiting(member.clone());
            }
            (Phase::Waiting(_), MultiStep::Woken) => self.phase = Phase::Taking,
            (Phase::Taking, MultiStep::Granted) => {
                if self.held.len() != self.members.len() {
                    return Err(Violation::Subset(self.held.clone()));
                }
                self.phase = Phase::Holding;
            }
            (Phase::Taking | Phase::Waiting(_), MultiStep::GaveUp) => {
                if !self.held.is_empty() {
                    return Err(Violation::Subset(self.held.clone()));
                }
                self.phase = Phase::Idle;
            }
            (Phase::Holding, MultiStep::Released) if self.held.is_empty() => {
                self.phase = Phase::Idle;
            }
            (phase, step) => return unexpected(phase, step),
        }
        Ok(())
    }

    /// How many of the first members (in name order) are held, contiguously.
    fn prefix_len(&self) -> usize {
        self.members
            .iter()
            .take_while(|m| self.held.contains(*m))
            .count()
    }

    /// Judges a state seen from outside: `held` = the members its owner holds in Redis,
    /// `waiting` = whether it is known to be waiting for a member. While it waits it holds
    /// nothing; it never holds anything but members.
    pub fn observe(&self, held: &BTreeSet<String>, waiting: bool) -> Result<(), Violation> {
        if let Some(stranger) = held.iter().find(|m| !self.members.contains(m)) {
            return Err(Violation::OutOfOrder(stranger.clone()));
        }
        if waiting && !held.is_empty() {
            return Err(Violation::HoldAndWait(held.clone()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> String {
        x.to_owned()
    }

    #[test]
    fn gives_everything_back_before_each_wait() {
        let mut multi = MultiLock::new(["c", "a", "b"]);
        assert_eq!(multi.members(), ["a", "b", "c"]);
        multi.step(MultiStep::Begin).unwrap();
        multi.step(MultiStep::Take(s("a"))).unwrap();
        // b is busy: a goes back before the wait.
        assert_eq!(
            multi.clone().step(MultiStep::Wait(s("b"))),
            Err(Violation::HoldAndWait(BTreeSet::from([s("a")])))
        );
        multi.step(MultiStep::GiveBack(s("a"))).unwrap();
        multi.step(MultiStep::Wait(s("b"))).unwrap();
        multi.step(MultiStep::Woken).unwrap();
        // Next round: a, b taken; c busy. Carrying b (the one waited for) into the wait is the
        // bug of issue 11, item 3.
        multi.step(MultiStep::Take(s("a"))).unwrap();
        multi.step(MultiStep::Take(s("b"))).unwrap();
        assert_eq!(
            multi.step(MultiStep::Take(s("a"))),
            Err(Violation::OutOfOrder(s("a")))
        );
        multi.step(MultiStep::GiveBack(s("a"))).unwrap();
        assert!(matches!(
            multi.clone().step(MultiStep::Wait(s("c"))),
            Err(Violation::HoldAndWait(_))
        ));
        assert!(multi.observe(&BTreeSet::from([s("b")]), true).is_err());
        multi.step(MultiStep::GiveBack(s("b"))).unwrap();
        multi.step(MultiStep::Wait(s("c"))).unwrap();
        multi.step(MultiStep::Woken).unwrap();
        for m in ["a", "b", "c"] {
            multi.step(MultiStep::Take(s(m))).unwrap();
        }
        multi.step(MultiStep::Granted).unwrap();
        for m in ["a", "b", "c"] {
            multi.step(MultiStep::GiveBack(s(m))).unwrap();
        }
        multi.step(MultiStep::Released).unwrap();
        assert_eq!(multi.phase(), &Phase::Idle);
    }

    #[test]
    fn never_granted_or_given_up_with_a_subset() {
        let mut multi = MultiLock::new(["a", "b"]);
        multi.step(MultiStep::Begin).unwrap();
        multi.step(MultiStep::Take(s("a"))).unwrap();
        assert!(matches!(
            multi.clone().step(MultiStep::Granted),
            Err(Violation::Subset(_))
        ));
        assert!(matches!(
            multi.clone().step(MultiStep::GaveUp),
            Err(Violation::Subset(_))
        ));
        multi.step(MultiStep::GiveBack(s("a"))).unwrap();
        multi.step(MultiStep::GaveUp).unwrap();
    }
}
