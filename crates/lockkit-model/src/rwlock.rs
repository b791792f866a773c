//! The read-write lock's model.
//!
//! Encodes `docs/guide.md`, "ReadWriteLock — many readers or one writer", **The rules** and
//! **Failure behaviour**:
//!
//! > A read hold is granted unless another owner holds a write hold; a write hold when nobody
//! > else holds anything. Inside a write hold's scope the writer may also take read holds
//! > (downgrade). Inside a read hold's scope, a write request from an owner that holds only read
//! > holds gets `Error::Refused` immediately […]
//!
//! > **Every hold expires on its own.** Each hold has its own expiry, kept in Redis by server
//! > time. […] Only the hold whose lease ended is lost; the owner's other holds stay.
//! > A connection drop between request and reply: acquire and renew are re-sent and counted
//! > once; a release is retried and never gives back a second hold.
//!
//! and `docs/design.md`, "The lock family" (one owner per plain acquire, re-entry inside the
//! holder's scope: the model's owner *is* the scope; renewal "moves only the renewed hold's own
//! expiry"; `force_unlock` "removes every hold, readers and writer alike"). A key holding
//! another type is reported (`WrongType`) and left alone; a renewal reports such a hold gone;
//! `force_unlock`, administrative, deletes whatever is at the key (as `Lock::force_unlock`).
//!
//! Owners and holds are opaque strings (the runtime's `<client>:<sequence>` owner ids and
//! `#<client>:<sequence>` hold markers); time is the server's clock in milliseconds.

use std::collections::BTreeMap;

use crate::lock::LockRet;
use crate::spec::{release_seen, Seen, Spec};
use crate::timed::Timed;

/// The longest lease accepted (`lockkit::MAX_LEASE`, 365 days), in milliseconds.
pub const MAX_LEASE_MS: u64 = 365 * 24 * 3600 * 1000;

/// The two kinds of hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// Shared with other readers.
    Read,
    /// Exclusive, except for the writer's own read holds.
    Write,
}

/// One live hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hold {
    /// The owner (scope) the hold counts for.
    pub owner: String,
    /// Read or write.
    pub mode: Mode,
    /// When its own lease ends (server ms); it is gone from then on.
    pub expiry: u64,
}

/// The state of one read-write lock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RwLock {
    holds: BTreeMap<String, Hold>,
    foreign: bool,
}

/// An operation on the lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RwOp {
    /// Take one hold (`hold` is unique per request; a re-sent request repeats it).
    Acquire {
        /// The owner (scope).
        owner: String,
        /// The hold's marker.
        hold: String,
        /// Read or write.
        mode: Mode,
        /// The hold's lease in ms (0 or above [`MAX_LEASE_MS`]: invalid).
        lease_ms: u64,
    },
    /// Give back one hold.
    Release {
        /// The hold's marker.
        hold: String,
    },
    /// Extend (lease > 0) or check (lease 0) holds, in one batch.
    Renew {
        /// `(marker, lease ms)` per hold.
        holds: Vec<(String, u64)>,
    },
    /// Delete every hold, whoever holds it.
    ForceUnlock,
    /// The mode and the summed hold counts of some owners.
    Status {
        /// The owners asked about.
        owners: Vec<String>,
    },
    /// Another program replaces the lock's keys with a value of another type at its key.
    Foreign,
    /// The lock's keys are deleted (by an operator).
    Clear,
}

/// An operation's result.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RwRet {
    /// The hold was taken; the owner's count in that mode (`None`: not observed).
    Acquired {
        /// The owner's hold count in the requested mode, including this hold.
        hold_count: Option<u32>,
    },
    /// One try found conflicting holds; `wait_ms` bounds how long they can last.
    Busy {
        /// The conflicting holds' remaining lease (`None`: not observed).
        wait_ms: Option<u64>,
    },
    /// A waiting acquire gave up: nothing taken. Always allowed (progress is judged elsewhere).
    TimedOut,
    /// An upgrade: a write asked by an owner holding only read holds.
    Refused {
        /// The owner's read holds.
        read_holds: u32,
    },
    /// Rejected before anything was sent (a zero or absurd lease).
    InvalidArgument,
    /// The hold was given back; the owner's holds left (read + write; 0: none).
    Released {
        /// The same owner's remaining holds.
        still_held: u32,
    },
    /// The hold was not there (lapsed, released already, force-unlocked).
    NotHeld,
    /// Per renewed hold: whether it is live (and was extended).
    Renewed(Vec<bool>),
    /// Whether the lock was held.
    ForceUnlocked(bool),
    /// The mode (`None`: free) and the owners' summed counts.
    Status {
        /// The lock's mode.
        mode: Option<Mode>,
        /// The owners' read holds.
        read_holds: u32,
        /// The owners' write holds.
        write_holds: u32,
    },
    /// The key holds another type; nothing changed.
    WrongType,
    /// The call failed without saying whether it took effect.
    Error,
    /// Done (`Foreign`, `Clear`).
    Done,
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl RwLock {
    /// A free lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// The live holds, by marker (as of the last step: call [`purge`](Self::purge) first to see
    /// them at a later instant).
    pub fn holds(&self) -> &BTreeMap<String, Hold> {
        &self.holds
    }

    /// Whether the key holds a value of another type.
    pub fn is_foreign(&self) -> bool {
        self.foreign
    }

    /// Drops the holds whose lease has ended by `now`.
    pub fn purge(&mut self, now: u64) {
        self.holds.retain(|_, h| h.expiry > now);
    }

    /// The lock's mode: write while any write hold lives, read while any other hold does.
    pub fn mode(&self) -> Option<Mode> {
        if self.holds.values().any(|h| h.mode == Mode::Write) {
            Some(Mode::Write)
        } else if self.holds.is_empty() {
            None
        } else {
            Some(Mode::Read)
        }
    }

    /// How many holds `owner` has in `mode`.
    pub fn count(&self, owner: &str, mode: Mode) -> u32 {
        count(
            self.holds
                .values()
                .filter(|h| h.owner == owner && h.mode == mode)
                .count(),
        )
    }

    /// The latest expiry of the holds `pick` selects.
    fn latest(&self, pick: impl Fn(&Hold) -> bool) -> Option<u64> {
        self.holds
            .values()
            .filter(|h| pick(h))
            .map(|h| h.expiry)
            .max()
    }

    /// The result of `op` at `now`, and the state it leaves (deterministic: the script's reply).
    pub fn apply(&mut self, now: u64, op: &RwOp) -> RwRet {
        if let RwOp::Acquire { lease_ms, .. } = op {
            if *lease_ms == 0 || *lease_ms > MAX_LEASE_MS {
                return RwRet::InvalidArgument;
            }
        }
        match op {
            RwOp::Foreign => {
                *self = Self::new();
                self.foreign = true;
                return RwRet::Done;
            }
            RwOp::Clear => {
                *self = Self::new();
                return RwRet::Done;
            }
            RwOp::Renew { holds } if self.foreign => {
                return RwRet::Renewed(vec![false; holds.len()]);
            }
            // Administrative, as `Lock::force_unlock`: whatever is at the key is deleted.
            RwOp::ForceUnlock if self.foreign => {
                *self = Self::new();
                return RwRet::ForceUnlocked(true);
            }
            _ if self.foreign => return RwRet::WrongType,
            _ => {}
        }
        self.purge(now);
        match op {
            RwOp::Acquire {
                owner,
                hold,
                mode,
                lease_ms,
            } => self.acquire(now, owner, hold, *mode, *lease_ms),
            RwOp::Release { hold } => match self.holds.remove(hold) {
                None => RwRet::NotHeld,
                Some(h) => RwRet::Released {
                    still_held: self.count(&h.owner, Mode::Read)
                        + self.count(&h.owner, Mode::Write),
                },
            },
            RwOp::Renew { holds } => RwRet::Renewed(
                holds
                    .iter()
                    .map(|(marker, lease)| match self.holds.get_mut(marker) {
                        Some(h) => {
                            h.expiry = h.expiry.max(now + lease);
                            true
                        }
                        None => false,
                    })
                    .collect(),
            ),
            RwOp::ForceUnlock => {
                let held = !self.holds.is_empty();
                self.holds.clear();
                RwRet::ForceUnlocked(held)
            }
            RwOp::Status { owners } => RwRet::Status {
                mode: self.mode(),
                read_holds: owners.iter().map(|o| self.count(o, Mode::Read)).sum(),
                write_holds: owners.iter().map(|o| self.count(o, Mode::Write)).sum(),
            },
            RwOp::Foreign | RwOp::Clear => RwRet::Done,
        }
    }

    fn acquire(&mut self, now: u64, owner: &str, hold: &str, mode: Mode, lease: u64) -> RwRet {
        // A re-sent request whose first run took the hold: counted once, lease never shortened.
        if let Some(h) = self.holds.get_mut(hold) {
            h.expiry = h.expiry.max(now + lease);
            let (owner, mode) = (h.owner.clone(), h.mode);
            return RwRet::Acquired {
                hold_count: Some(self.count(&owner, mode)),
            };
        }
        let others = |h: &Hold| h.owner != owner;
        match mode {
            Mode::Write => {
                let reads = self.count(owner, Mode::Read);
                if reads > 0 && self.count(owner, Mode::Write) == 0 {
                    return RwRet::Refused { read_holds: reads };
                }
                if self.holds.values().any(others) {
                    return RwRet::Busy {
                        wait_ms: self.latest(|_| true).map(|e| e - now),
                    };
                }
            }
            Mode::Read => {
                if let Some(e) = self.latest(|h| others(h) && h.mode == Mode::Write) {
                    return RwRet::Busy {
                        wait_ms: Some(e - now),
                    };
                }
            }
        }
        self.holds.insert(
            hold.to_owned(),
            Hold {
                owner: owner.to_owned(),
                mode,
                expiry: now + lease,
            },
        );
        RwRet::Acquired {
            hold_count: Some(self.count(owner, mode)),
        }
    }
}

impl Timed for RwLock {
    type Op = RwOp;
    type Ret = RwRet;

    fn outcomes(&self, now: u64, op: &RwOp) -> Vec<(RwRet, Self)> {
        let mut after = self.clone();
        let ret = after.apply(now, op);
        let mut before = self.clone();
        if !before.foreign {
            before.purge(now);
        }
        let mut out = vec![(ret.clone(), after.clone())];
        match op {
            // A waiting acquire may give up; an error may or may not have taken effect.
            RwOp::Acquire { .. } if ret != RwRet::InvalidArgument => {
                out.push((RwRet::TimedOut, before.clone()));
                out.push((RwRet::Error, before));
                if matches!(ret, RwRet::Acquired { .. }) {
                    out.push((RwRet::Error, after));
                }
            }
            RwOp::Release { .. } | RwOp::Renew { .. } | RwOp::ForceUnlock => {
                out.push((RwRet::Error, before));
                out.push((RwRet::Error, after));
            }
            _ => out.push((RwRet::Error, before)),
        }
        out
    }

    fn deadlines(&self) -> Vec<u64> {
        self.holds.values().map(|h| h.expiry).collect()
    }

    fn accepts(expected: &RwRet, observed: &RwRet) -> bool {
        match (expected, observed) {
            (RwRet::Acquired { hold_count: e }, RwRet::Acquired { hold_count: o }) => {
                o.is_none() || e == o
            }
            (RwRet::Busy { .. }, RwRet::Busy { .. }) => true,
            _ => expected == observed,
        }
    }
}

/// An operation of a recorded client history on one read-write lock (for [`RwSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RwHistoryOp {
    /// A read or write acquire (any wait, any lease) by `owner`, whose hold (if granted) is
    /// `hold`, unique per acquisition.
    Acquire {
        /// The owner (scope) id.
        owner: String,
        /// The hold the acquisition creates.
        hold: String,
        /// Read or write.
        mode: Mode,
        /// The history shows the hold may have ended on its own (see [`Seen`]).
        may_lapse: bool,
    },
    /// `guard.unlock()` of `hold`.
    Release {
        /// The hold given back.
        hold: String,
    },
}

/// The read-write lock's rules without time, for checking concurrent client histories (results
/// as [`LockRet`]): a read grant needs every other owner's write hold to have ended, a write grant
/// every other owner's hold of either mode; a write grant to an owner holding only reads breaks
/// the no-upgrade rule. Which holds may have ended is what the history shows ([`Seen`]); a grant
/// that needs a hold to have ended that cannot have is a violation, and the holds it needed to
/// have ended must answer `NotHeld` to their releases.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct RwSpec {
    holds: BTreeMap<String, Seen<Mode>>,
}

impl RwSpec {
    /// A free lock.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Spec for RwSpec {
    type Op = RwHistoryOp;
    type Ret = LockRet;

    fn step(&self, op: &RwHistoryOp, ret: &LockRet) -> Option<Self> {
        let mut next = self.clone();
        match (op, ret) {
            (
                RwHistoryOp::Acquire {
                    owner,
                    hold,
                    mode,
                    may_lapse,
                },
                LockRet::Granted(None),
            ) => {
                let own = |m: Mode| {
                    next.holds
                        .values()
                        .any(|s| s.owner == *owner && s.kind == m && s.in_force())
                };
                if *mode == Mode::Write && own(Mode::Read) && !own(Mode::Write) {
                    return None;
                }
                for seen in next.holds.values_mut() {
                    let conflicts = seen.owner != *owner
                        && seen.in_force()
                        && (*mode == Mode::Write || seen.kind == Mode::Write);
                    if conflicts && !seen.yield_to_grant() {
                        return None;
                    }
                }
                next.holds
                    .insert(hold.clone(), Seen::live(owner, *mode, *may_lapse));
            }
            (RwHistoryOp::Acquire { .. }, LockRet::TimedOut) => {}
            // Refused: only a write asked by an owner whose holds in force are all reads (the
            // histories record no invalid arguments).
            (RwHistoryOp::Acquire { owner, mode, .. }, LockRet::Refused) => {
                let mut own = next
                    .holds
                    .values()
                    .filter(|s| s.owner == *owner && s.in_force());
                let reads_only = own.clone().next().is_some() && own.all(|s| s.kind == Mode::Read);
                if *mode != Mode::Write || !reads_only {
                    return None;
                }
            }
            (
                RwHistoryOp::Acquire {
                    owner,
                    hold,
                    mode,
                    may_lapse,
                },
                LockRet::Error,
            ) => {
                next.holds
                    .entry(hold.clone())
                    .or_insert(Seen::maybe(owner, *mode, *may_lapse));
            }
            (RwHistoryOp::Release { hold }, ret) => release_seen(&mut next.holds, hold, ret)?,
            _ => return None,
        }
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Spec;
    use crate::timed::{At, Possible, Window};

    fn acquire(owner: &str, hold: &str, mode: Mode, lease_ms: u64) -> RwOp {
        RwOp::Acquire {
            owner: owner.into(),
            hold: hold.into(),
            mode,
            lease_ms,
        }
    }

    fn release(hold: &str) -> RwOp {
        RwOp::Release { hold: hold.into() }
    }

    #[test]
    fn readers_share_a_writer_excludes() {
        let mut l = RwLock::new();
        let got = |n| RwRet::Acquired {
            hold_count: Some(n),
        };
        assert_eq!(l.apply(0, &acquire("a", "#1", Mode::Read, 100)), got(1));
        assert_eq!(l.apply(0, &acquire("b", "#2", Mode::Read, 200)), got(1));
        assert_eq!(
            l.apply(10, &acquire("c", "#3", Mode::Write, 100)),
            RwRet::Busy { wait_ms: Some(190) }
        );
        // An upgrade is refused; the reader's own holds would block it forever.
        assert_eq!(
            l.apply(10, &acquire("a", "#4", Mode::Write, 100)),
            RwRet::Refused { read_holds: 1 }
        );
        // Each hold lapses on its own: at 150 only b's read remains.
        assert_eq!(
            l.apply(150, &RwOp::Status { owners: vec![] }),
            RwRet::Status {
                mode: Some(Mode::Read),
                read_holds: 0,
                write_holds: 0
            }
        );
        assert_eq!(
            l.apply(150, &release("#2")),
            RwRet::Released { still_held: 0 }
        );
        assert_eq!(l.apply(150, &release("#2")), RwRet::NotHeld);
        assert_eq!(l.apply(150, &acquire("c", "#3", Mode::Write, 100)), got(1));
        assert_eq!(
            l.apply(160, &acquire("a", "#5", Mode::Read, 100)),
            RwRet::Busy { wait_ms: Some(90) }
        );
    }

    #[test]
    fn downgrade_then_the_write_ends() {
        let mut l = RwLock::new();
        l.apply(0, &acquire("w", "#1", Mode::Write, 1000));
        assert_eq!(
            l.apply(0, &acquire("w", "#2", Mode::Read, 1000)),
            RwRet::Acquired {
                hold_count: Some(1)
            }
        );
        assert_eq!(
            l.apply(0, &release("#1")),
            RwRet::Released { still_held: 1 }
        );
        assert_eq!(l.mode(), Some(Mode::Read));
        // A re-sent acquire is counted once.
        assert_eq!(
            l.apply(5, &acquire("w", "#2", Mode::Read, 1000)),
            RwRet::Acquired {
                hold_count: Some(1)
            }
        );
        assert_eq!(
            l.apply(
                5,
                &RwOp::Renew {
                    holds: vec![("#2".into(), 5000), ("#1".into(), 5000)]
                }
            ),
            RwRet::Renewed(vec![true, false])
        );
        assert_eq!(l.holds()["#2"].expiry, 5005);
        assert_eq!(l.apply(6, &RwOp::Foreign), RwRet::Done);
        assert_eq!(l.apply(6, &release("#2")), RwRet::WrongType);
        assert_eq!(
            l.apply(6, &acquire("w", "#3", Mode::Read, 0)),
            RwRet::InvalidArgument
        );
    }

    #[test]
    fn the_spec_allows_a_lease_that_may_have_lapsed() {
        let s = Possible::new(RwLock::new());
        let at = |earliest, latest, op| At {
            window: Window { earliest, latest },
            op,
        };
        let s = s
            .step(
                &at(0, 0, acquire("a", "#1", Mode::Write, 100)),
                &RwRet::Acquired { hold_count: None },
            )
            .expect("free");
        // In [90, 110] the write hold may or may not have lapsed: both answers are allowed.
        let op = at(90, 110, acquire("b", "#2", Mode::Read, 100));
        assert!(s.step(&op, &RwRet::Busy { wait_ms: None }).is_some());
        assert!(s.step(&op, &RwRet::Acquired { hold_count: None }).is_some());
        // Before it: only busy.
        let op = at(50, 60, acquire("b", "#2", Mode::Read, 100));
        assert!(s.step(&op, &RwRet::Acquired { hold_count: None }).is_none());
        // Two writers at once: never.
        let op = at(10, 20, acquire("b", "#2", Mode::Write, 100));
        assert!(s.step(&op, &RwRet::Acquired { hold_count: None }).is_none());
    }

    #[test]
    fn spec_readers_share_writers_exclude() {
        let acquire = |owner: &str, mode: Mode, may_lapse: bool| RwHistoryOp::Acquire {
            owner: owner.to_owned(),
            hold: format!("{owner}{mode:?}"),
            mode,
            may_lapse,
        };
        let granted = LockRet::Granted(None);
        let s = RwSpec::new()
            .step(&acquire("a", Mode::Read, false), &granted)
            .unwrap();
        let s = s.step(&acquire("b", Mode::Read, false), &granted).unwrap();
        // A writer while readers that cannot have lapsed hold: a violation.
        assert!(s
            .step(&acquire("c", Mode::Write, false), &granted)
            .is_none());
        // No upgrade: a write grant to an owner holding only reads.
        assert!(s
            .step(&acquire("a", Mode::Write, false), &granted)
            .is_none());
        assert!(s
            .step(&acquire("a", Mode::Write, false), &LockRet::Refused)
            .is_some());
        // A refusal to an owner that holds nothing: wrong.
        assert!(s
            .step(&acquire("c", Mode::Write, false), &LockRet::Refused)
            .is_none());
        let s = s
            .step(
                &RwHistoryOp::Release {
                    hold: "aRead".to_owned(),
                },
                &LockRet::Released,
            )
            .unwrap();
        let s = s
            .step(
                &RwHistoryOp::Release {
                    hold: "bRead".to_owned(),
                },
                &LockRet::Released,
            )
            .unwrap();
        let s = s.step(&acquire("c", Mode::Write, true), &granted).unwrap();
        // The writer may have lapsed: a reader may come in, and then the writer's hold is gone.
        let s = s.step(&acquire("d", Mode::Read, false), &granted).unwrap();
        let release_c = RwHistoryOp::Release {
            hold: "cWrite".to_owned(),
        };
        assert!(s.step(&release_c, &LockRet::Released).is_none());
        assert!(s.step(&release_c, &LockRet::NotHeld).is_some());
    }
}
