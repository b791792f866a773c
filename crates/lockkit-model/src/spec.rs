//! The interface between a sequential model and the linearizability checker.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::hash::Hash;

use crate::lock::LockRet;

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

/// What a concurrent history has shown of one hold, for the time-free specs
/// ([`LockSpec`](crate::lock::LockSpec), [`RwSpec`](crate::rwlock::RwSpec),
/// [`PermitSpec`](crate::semaphore::PermitSpec)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HoldState {
    /// Taken and not known to be gone.
    Live,
    /// May or may not have been taken (an acquire that failed ambiguously), or released (a
    /// release that failed ambiguously).
    Maybe,
    /// Known to be gone (lost, a renewal found it gone, a conflicting grant, force-unlock): its
    /// release must answer `NotHeld`.
    Gone,
}

/// One hold as a history has shown it: its owner, what it holds (`K`: nothing for a lock, the
/// mode of a read-write hold, a semaphore hold's permits), its state, and whether it may have
/// ended on its own.
///
/// Leases are not visible in a history. What it does show is which holds may have lapsed
/// (`may_lapse`): the guard reported itself lost, its release answered `NotHeld` or failed, or a
/// fault hit it. Every other hold lived until its release. That is the whole of time in the
/// time-free specs, and it keeps them tight: a grant that needs such a hold to have ended is a
/// violation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Seen<K> {
    /// The owner (scope) the hold counts for.
    pub owner: String,
    /// What it holds.
    pub kind: K,
    /// What is known of it.
    pub state: HoldState,
    /// Whether it may have ended on its own.
    pub may_lapse: bool,
}

impl<K> Seen<K> {
    /// A hold just granted.
    pub fn live(owner: &str, kind: K, may_lapse: bool) -> Self {
        Self {
            owner: owner.to_owned(),
            kind,
            state: HoldState::Live,
            may_lapse,
        }
    }

    /// A hold whose acquire failed ambiguously.
    pub fn maybe(owner: &str, kind: K, may_lapse: bool) -> Self {
        Self {
            state: HoldState::Maybe,
            ..Self::live(owner, kind, may_lapse)
        }
    }

    /// Whether the hold may still be in force and keep others out: live, or maybe taken.
    pub fn in_force(&self) -> bool {
        self.state != HoldState::Gone
    }

    /// Ends the hold for a grant it conflicts with. `false` when it cannot have ended (a live
    /// hold that did not lapse): the grant breaks the contract.
    pub fn yield_to_grant(&mut self) -> bool {
        if self.state == HoldState::Live && !self.may_lapse {
            return false;
        }
        self.state = HoldState::Gone;
        true
    }
}

/// A release of `hold` that answered `ret`, in any time-free spec: `Released` gives back a hold
/// in force (a violation if it was known gone or never taken), `NotHeld` is always allowed (the
/// hold ended before, or is gone now), an ambiguous `Error` leaves a live hold only maybe held.
/// `None`: a violation, or not a release's result.
pub fn release_seen<K>(
    holds: &mut BTreeMap<String, Seen<K>>,
    hold: &str,
    ret: &LockRet,
) -> Option<()> {
    match ret {
        LockRet::Released => holds.remove(hold).filter(Seen::in_force).map(|_| ()),
        LockRet::NotHeld => {
            holds.remove(hold);
            Some(())
        }
        LockRet::Error => {
            if let Some(seen) = holds.get_mut(hold) {
                seen.state = seen.state.max(HoldState::Maybe);
            }
            Some(())
        }
        _ => None,
    }
}
