//! The interface between a sequential model and the linearizability checker.

use std::fmt::Debug;
use std::hash::Hash;

/// A sequential specification: a state, and which observed results an operation may have from
/// it. Nondeterminism (a timed-out acquire, a lease that may or may not have lapsed) is allowed:
/// [`step`](Spec::step) accepts every result the contract permits.
///
/// The checker explores orders of the operations of a history; it memoizes on the state, so
/// states must be `Eq + Hash` and cheap to clone.
pub trait Spec: Clone + Eq + Hash + Debug {
    /// An operation as invoked (with its arguments).
    type Op: Clone + Debug;
    /// An operation's observed result.
    type Ret: Clone + Debug;
    /// The state after `op` returned `ret` from `self`, or `None` when the contract does not
    /// allow that result from this state.
    fn step(&self, op: &Self::Op, ret: &Self::Ret) -> Option<Self>;
}
