//! Time for the leased models (read-write lock, semaphores, latch): a model step happens at one
//! instant of the **server's** clock (`TIME`, milliseconds), and a recorded history only knows a
//! window around that instant.
//!
//! A model implements [`Timed`]: every result the contract allows for an operation at an exact
//! instant. [`Possible`] lifts it to a [`Spec`] for the linearizability checker: the set of
//! states the history so far can have led to (a powerset construction, so the nondeterminism of
//! the contract — a lease that may or may not have lapsed within the operation's window, an
//! ambiguous error — never makes the checker pick one branch too early).

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::hash::Hash;

use crate::spec::Spec;

/// The interval of server time (ms) in which an operation took effect: from its invocation to
/// its response, as the recorder knows them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Window {
    /// The earliest instant the operation may have taken effect.
    pub earliest: u64,
    /// The latest instant (at least `earliest`).
    pub latest: u64,
}

impl Window {
    /// A window of one instant.
    pub fn at(now: u64) -> Self {
        Self {
            earliest: now,
            latest: now,
        }
    }
}

/// An operation and the window in which it took effect.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct At<Op> {
    /// When.
    pub window: Window,
    /// What.
    pub op: Op,
}

/// A sequential model whose steps depend on the server's clock.
pub trait Timed: Clone + Ord + Hash + Debug {
    /// An operation as invoked.
    type Op: Clone + Debug;
    /// An operation's result.
    type Ret: Clone + Debug;

    /// Every `(result, next state)` the contract allows for `op` at server time `now` (ms).
    /// Usually one; more where the contract leaves a choice (an error whose effect is unknown).
    fn outcomes(&self, now: u64, op: &Self::Op) -> Vec<(Self::Ret, Self)>;

    /// The instants at which the state changes on its own (lease ends): the only instants inside
    /// a window where an operation's result can change.
    fn deadlines(&self) -> Vec<u64>;

    /// Whether an observed result is the one the model computed. Lenient where a recorded
    /// history knows less than the script's reply (a waiting time, a hold count).
    fn accepts(expected: &Self::Ret, observed: &Self::Ret) -> bool;
}

/// The instants worth trying for an operation in `window` from a state whose clock is at
/// `clock`: the window's start (or the clock, if later), every deadline inside the window, and
/// the window's end. Results only change at deadlines, so these cover every behaviour; a lease
/// granted in the window is taken to start at one of them.
pub fn candidates(window: Window, clock: u64, deadlines: &[u64]) -> Vec<u64> {
    let start = window.earliest.max(clock);
    let end = window.latest.max(start);
    let mut times = vec![start];
    times.extend(
        deadlines
            .iter()
            .copied()
            .filter(|d| *d > start && *d <= end),
    );
    times.push(end);
    times.sort_unstable();
    times.dedup();
    times
}

/// Every state a history may have led a [`Timed`] model to, each with its clock (the instant of
/// the last operation, so time never runs backwards along one explanation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Possible<M> {
    states: BTreeSet<(u64, M)>,
}

impl<M: Timed> Possible<M> {
    /// The model in `initial`, with the clock at 0.
    pub fn new(initial: M) -> Self {
        Self {
            states: BTreeSet::from([(0, initial)]),
        }
    }

    /// The states still possible.
    pub fn states(&self) -> impl Iterator<Item = &M> {
        self.states.iter().map(|(_, m)| m)
    }
}

impl<M: Timed> Spec for Possible<M> {
    type Op = At<M::Op>;
    type Ret = M::Ret;

    fn step(&self, op: &Self::Op, ret: &Self::Ret) -> Option<Self> {
        let mut next = BTreeSet::new();
        for (clock, state) in &self.states {
            for now in candidates(op.window, *clock, &state.deadlines()) {
                for (expected, after) in state.outcomes(now, &op.op) {
                    if M::accepts(&expected, ret) {
                        next.insert((now, after));
                    }
                }
            }
        }
        (!next.is_empty()).then_some(Self { states: next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_cover_the_deadlines_in_the_window() {
        let w = Window {
            earliest: 10,
            latest: 20,
        };
        assert_eq!(candidates(w, 0, &[5, 12, 20, 25]), vec![10, 12, 20]);
        assert_eq!(candidates(w, 15, &[12, 18]), vec![15, 18, 20]);
        assert_eq!(candidates(Window::at(7), 9, &[]), vec![9]);
    }
}
