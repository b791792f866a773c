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
//!
//! The FIFO line and its direct grant (issue 28; `scripts/line_lib.lua`, `rwlock_lib.lua`, the
//! docs of `lockkit_protocol::read_write_lock`), the grant as part of the model as the lock's and
//! the semaphores' are ([`crate::lock`], [`crate::semaphore`]):
//!
//! > The line is **FIFO** (task-fair, as tokio's `RwLock`): a call that is not a re-entry takes
//! > the lock only when nobody waits ahead of it, so a waiting writer holds back the readers that
//! > come after it and is never starved by a stream of readers. Whatever frees the lock (a
//! > release, a hold's lease found run out, a cancelled waiter's unclaimed grant, a forced
//! > unlock) grants the line from its head: the head writer when the lock is free, or every
//! > reader at the head up to the next writer while no writer holds, each as a hold on probation
//! > told on its client's own channel. Nobody else is told anything.
//!
//! A request is `<marker> <lease> <r|w>:<owner> <channel>`. A re-entry (the owner writes already,
//! or reads while the lock is in read mode) is granted at once and never waits in the line; an
//! upgrade is refused and leaves the line. A refused try that waits (keep-alive > 0) joins the
//! line or keeps its place and pushes its keep-alive deadline; one that does not (keep-alive 0: a
//! single try, or the last try of a wait that ran out) leaves it. Requests whose deadline passed
//! are dropped before the line is served. A grant is a hold of `min(lease, PROBATION_MS)`
//! announced with `g:<count>:0:<now>:<expiry>:<marker>` (count: the owner's holds in that mode)
//! on the request's channel; a grant nobody heard is undone at once and the walk goes on. Which
//! channels have a subscriber is part of the state ([`RwLock::listen`]); the messages are kept
//! for the caller to compare with what a subscriber got ([`RwLock::take_messages`]).

use std::collections::{BTreeMap, BTreeSet};

use crate::lock::{LockRet, PROBATION_MS};
pub use crate::semaphore::Message;
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

impl Mode {
    /// The mode as the scripts write it (`r`, `w`).
    pub fn arg(self) -> &'static str {
        match self {
            Mode::Read => "r",
            Mode::Write => "w",
        }
    }
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

/// One waiting acquire call in the line.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Waiter {
    /// The call's hold marker.
    pub marker: String,
    /// The lease it asked for (ms).
    pub lease_ms: u64,
    /// Read or write.
    pub mode: Mode,
    /// The owner (scope) it asks for.
    pub owner: String,
    /// Its client's own channel.
    pub channel: String,
    /// Its keep-alive deadline (server ms): dropped once it has passed.
    pub deadline: u64,
}

/// The request as the scripts file it: `<marker> <lease> <r|w>:<owner> <channel>`.
pub fn member(marker: &str, lease_ms: u64, mode: Mode, owner: &str, channel: &str) -> String {
    format!("{marker} {lease_ms} {}:{owner} {channel}", mode.arg())
}

impl Waiter {
    /// The request as the scripts file it.
    pub fn member(&self) -> String {
        member(
            &self.marker,
            self.lease_ms,
            self.mode,
            &self.owner,
            &self.channel,
        )
    }
}

/// The state of one read-write lock.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RwLock {
    holds: BTreeMap<String, Hold>,
    foreign: bool,
    /// The line, head first (keys of its own: a foreign value or deleting the two first keys
    /// leaves it).
    line: Vec<Waiter>,
    listening: BTreeSet<String>,
    messages: Vec<Message>,
}

/// An operation on the lock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RwOp {
    /// Take one hold (`hold` is unique per request; a re-sent request repeats it): a single try
    /// that does not wait (keep-alive 0).
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
    /// As [`Acquire`](RwOp::Acquire), by a call that waits if refused: its request (on its
    /// client's `channel`) joins the line, or keeps its place, until `keepalive_ms` from now
    /// (0: the last try of a wait that ran out, which leaves the line).
    Wait {
        /// The owner (scope).
        owner: String,
        /// The call's hold marker, the same for every try.
        hold: String,
        /// Read or write.
        mode: Mode,
        /// The hold's lease in ms.
        lease_ms: u64,
        /// Its client's own channel.
        channel: String,
        /// The keep-alive in ms.
        keepalive_ms: u64,
    },
    /// A waiting call gave up: its request leaves the line, a hold granted to it and not claimed
    /// is given back, and the line is served.
    Cancel {
        /// The owner (scope).
        owner: String,
        /// The call's hold marker.
        hold: String,
        /// Read or write.
        mode: Mode,
        /// The lease it asked for.
        lease_ms: u64,
        /// Its client's own channel.
        channel: String,
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
    /// One try found conflicting holds, or others waiting ahead; `wait_ms` bounds how long the
    /// holds in the way can last.
    Busy {
        /// The conflicting holds' remaining lease (`None`: not observed, or no hold).
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
    /// Whether the request was in the line, or granted (`Cancel`).
    Cancelled(bool),
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

    /// The line, head first (entries whose deadline passed included until a script drops them).
    pub fn line(&self) -> &[Waiter] {
        &self.line
    }

    /// `channel` has a subscriber from now on (a grant published there is heard).
    pub fn listen(&mut self, channel: &str) {
        self.listening.insert(channel.to_owned());
    }

    /// The messages published since the last call, in order.
    pub fn take_messages(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.messages)
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

    /// The keys gone (`foreign`: a value of another type at the main key); the line, kept in
    /// keys of its own, stays.
    fn reset(&mut self, foreign: bool) {
        self.holds.clear();
        self.foreign = foreign;
    }

    fn publish(&mut self, channel: &str, payload: String) -> bool {
        let heard = self.listening.contains(channel);
        self.messages.push(Message {
            channel: channel.to_owned(),
            payload,
            heard,
        });
        heard
    }

    /// Takes `member` out of the line.
    fn leave(&mut self, member: &str) {
        self.line.retain(|w| w.member() != member);
    }

    /// line_lib.lua's `stay_in_line`: a refused try that waits keeps its place (or joins at the
    /// back) and pushes its deadline; one that does not wait leaves.
    fn stay_in_line(&mut self, me: Waiter, keepalive_ms: u64) {
        let member = me.member();
        if keepalive_ms == 0 {
            self.leave(&member);
        } else if let Some(w) = self.line.iter_mut().find(|w| w.member() == member) {
            w.deadline = me.deadline;
        } else {
            self.line.push(me);
        }
    }

    /// rwlock_lib.lua's `grant_line`: drops the requests whose keep-alive passed, then grants the
    /// head while it fits (a writer a free lock, a reader a lock no writer holds); stops at a head
    /// that does not fit and at `caller`'s request; drops a head whose marker holds already. A
    /// grant is a hold on probation, told on the request's channel, undone if nobody heard it.
    fn grant_line(&mut self, now: u64, caller: Option<&str>) {
        if self.line.is_empty() {
            return;
        }
        self.line.retain(|w| w.deadline > now);
        while let Some(head) = self.line.first().cloned() {
            if Some(head.marker.as_str()) == caller {
                return;
            }
            if !self.holds.contains_key(&head.marker) {
                let mode = self.mode();
                if mode == Some(Mode::Write) || (head.mode == Mode::Write && mode.is_some()) {
                    return;
                }
                let expiry = now + head.lease_ms.min(PROBATION_MS);
                self.holds.insert(
                    head.marker.clone(),
                    Hold {
                        owner: head.owner.clone(),
                        mode: head.mode,
                        expiry,
                    },
                );
                let count = self.count(&head.owner, head.mode);
                let grant = format!("g:{count}:0:{now}:{expiry}:{}", head.marker);
                if !self.publish(&head.channel, grant) {
                    self.holds.remove(&head.marker);
                }
            }
            self.line.remove(0);
        }
    }

    /// The result of `op` at `now`, and the state it leaves (deterministic: the script's reply).
    pub fn apply(&mut self, now: u64, op: &RwOp) -> RwRet {
        if let RwOp::Acquire { lease_ms, .. } | RwOp::Wait { lease_ms, .. } = op {
            if *lease_ms == 0 || *lease_ms > MAX_LEASE_MS {
                return RwRet::InvalidArgument;
            }
        }
        match op {
            RwOp::Foreign | RwOp::Clear => {
                self.reset(*op == RwOp::Foreign);
                return RwRet::Done;
            }
            RwOp::Renew { holds } if self.foreign => {
                return RwRet::Renewed(vec![false; holds.len()]);
            }
            // Administrative, as `Lock::force_unlock`: whatever is at the key is deleted, and the
            // lock goes to the line.
            RwOp::ForceUnlock if self.foreign => {
                self.reset(false);
                self.grant_line(now, None);
                return RwRet::ForceUnlocked(true);
            }
            // The script leaves the line before its first read of the main key fails.
            RwOp::Cancel {
                owner,
                hold,
                mode,
                lease_ms,
                channel,
            } if self.foreign => {
                self.leave(&member(hold, *lease_ms, *mode, owner, channel));
                return RwRet::WrongType;
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
            } => self.acquire(now, owner, hold, *mode, *lease_ms, "", 0),
            RwOp::Wait {
                owner,
                hold,
                mode,
                lease_ms,
                channel,
                keepalive_ms,
            } => self.acquire(now, owner, hold, *mode, *lease_ms, channel, *keepalive_ms),
            RwOp::Cancel {
                owner,
                hold,
                mode,
                lease_ms,
                channel,
            } => {
                let member = member(hold, *lease_ms, *mode, owner, channel);
                let mut removed = self
                    .line
                    .iter()
                    .any(|w| w.member() == member && w.deadline > now);
                self.leave(&member);
                if self.holds.remove(hold).is_some() {
                    removed = true;
                }
                self.grant_line(now, None);
                RwRet::Cancelled(removed)
            }
            RwOp::Release { hold } => {
                let ret = match self.holds.remove(hold) {
                    None => RwRet::NotHeld,
                    Some(h) => RwRet::Released {
                        still_held: self.count(&h.owner, Mode::Read)
                            + self.count(&h.owner, Mode::Write),
                    },
                };
                self.grant_line(now, None);
                ret
            }
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
                if self.holds.is_empty() {
                    return RwRet::ForceUnlocked(false);
                }
                self.holds.clear();
                self.grant_line(now, None);
                RwRet::ForceUnlocked(true)
            }
            RwOp::Status { owners } => RwRet::Status {
                mode: self.mode(),
                read_holds: owners.iter().map(|o| self.count(o, Mode::Read)).sum(),
                write_holds: owners.iter().map(|o| self.count(o, Mode::Write)).sum(),
            },
            RwOp::Foreign | RwOp::Clear => RwRet::Done,
        }
    }

    /// rwlock_acquire.lua.
    #[allow(clippy::too_many_arguments)] // the script's arguments
    fn acquire(
        &mut self,
        now: u64,
        owner: &str,
        hold: &str,
        mode: Mode,
        lease: u64,
        channel: &str,
        keepalive_ms: u64,
    ) -> RwRet {
        let me = Waiter {
            marker: hold.to_owned(),
            lease_ms: lease,
            mode,
            owner: owner.to_owned(),
            channel: channel.to_owned(),
            deadline: now + keepalive_ms,
        };
        let member = me.member();
        // A re-sent request whose first run took the hold, or a request a release granted: counted
        // once, lease never shortened (and the line is not served).
        if let Some(h) = self.holds.get_mut(hold) {
            h.expiry = h.expiry.max(now + lease);
            let (owner, mode) = (h.owner.clone(), h.mode);
            self.leave(&member);
            return RwRet::Acquired {
                hold_count: Some(self.count(&owner, mode)),
            };
        }
        let current = self.mode();
        let writes = current == Some(Mode::Write) && self.count(owner, Mode::Write) > 0;
        let reads = current == Some(Mode::Read) && self.count(owner, Mode::Read) > 0;
        if mode == Mode::Write && reads {
            self.leave(&member);
            return RwRet::Refused {
                read_holds: self.count(owner, Mode::Read),
            };
        }
        let mut ret = None;
        // Not a re-entry: the line first, then this call if it is at the head and fits.
        if !(writes || (mode == Mode::Read && reads)) {
            self.grant_line(now, Some(hold));
            let current = self.mode();
            let fits = match mode {
                Mode::Write => current.is_none(),
                Mode::Read => current != Some(Mode::Write),
            };
            let first = self.line.first().map(Waiter::member);
            if !fits || first.is_some_and(|m| m != member) {
                self.stay_in_line(me, keepalive_ms);
                // For a reader a writer keeps out: the writer's latest hold; otherwise every hold.
                let wait = if mode == Mode::Read && current == Some(Mode::Write) {
                    self.latest(|h| h.mode == Mode::Write)
                } else {
                    self.latest(|_| true)
                };
                ret = Some(RwRet::Busy {
                    wait_ms: wait.map(|e| e - now),
                });
            }
        }
        let ret = ret.unwrap_or_else(|| {
            self.holds.insert(
                hold.to_owned(),
                Hold {
                    owner: owner.to_owned(),
                    mode,
                    expiry: now + lease,
                },
            );
            self.leave(&member);
            RwRet::Acquired {
                hold_count: Some(self.count(owner, mode)),
            }
        });
        // What this call left may let the next head in: readers behind this one.
        self.grant_line(now, None);
        ret
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
            RwOp::Acquire { .. } | RwOp::Wait { .. } if ret != RwRet::InvalidArgument => {
                out.push((RwRet::TimedOut, before.clone()));
                out.push((RwRet::Error, before));
                if matches!(ret, RwRet::Acquired { .. }) {
                    out.push((RwRet::Error, after));
                }
            }
            RwOp::Release { .. } | RwOp::Renew { .. } | RwOp::ForceUnlock | RwOp::Cancel { .. } => {
                out.push((RwRet::Error, before));
                out.push((RwRet::Error, after));
            }
            _ => out.push((RwRet::Error, before)),
        }
        out
    }

    fn deadlines(&self) -> Vec<u64> {
        self.holds
            .values()
            .map(|h| h.expiry)
            .chain(self.line.iter().map(|w| w.deadline))
            .collect()
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

    fn wait(owner: &str, hold: &str, mode: Mode, channel: &str) -> RwOp {
        RwOp::Wait {
            owner: owner.into(),
            hold: hold.into(),
            mode,
            lease_ms: 60_000,
            channel: channel.into(),
            keepalive_ms: 5_000,
        }
    }

    fn payloads(l: &mut RwLock) -> Vec<(String, String)> {
        l.take_messages()
            .into_iter()
            .map(|m| (m.channel, m.payload))
            .collect()
    }

    fn markers(l: &RwLock) -> Vec<&str> {
        l.line().iter().map(|w| w.marker.as_str()).collect()
    }

    #[test]
    fn the_line_is_granted_in_order_readers_in_a_batch_up_to_the_next_writer() {
        let mut l = RwLock::new();
        l.listen("a");
        let got = |n| RwRet::Acquired {
            hold_count: Some(n),
        };
        assert_eq!(l.apply(0, &acquire("w", "#w", Mode::Write, 60_000)), got(1));
        let busy = |l: &mut RwLock, t, op| matches!(l.apply(t, &op), RwRet::Busy { .. });
        assert!(busy(&mut l, 1, wait("r1", "#r1", Mode::Read, "a")));
        assert!(busy(&mut l, 2, wait("r2", "#r2", Mode::Read, "a")));
        assert!(busy(&mut l, 3, wait("w2", "#w2", Mode::Write, "a")));
        assert!(busy(&mut l, 4, wait("r3", "#r3", Mode::Read, "a")));
        assert_eq!(markers(&l), ["#r1", "#r2", "#w2", "#r3"]);
        assert!(payloads(&mut l).is_empty());
        // The writer's release grants both readers at the head, each on probation, and stops at
        // the writer: the reader behind it does not overtake it.
        assert_eq!(
            l.apply(10, &release("#w")),
            RwRet::Released { still_held: 0 }
        );
        assert_eq!(
            payloads(&mut l),
            vec![
                ("a".into(), "g:1:0:10:5010:#r1".into()),
                ("a".into(), "g:1:0:10:5010:#r2".into())
            ]
        );
        assert_eq!(markers(&l), ["#w2", "#r3"]);
        assert_eq!(l.holds()["#r1"].expiry, 10 + PROBATION_MS);
        // Nor does a try that does not wait, though a reader fits a read-mode lock.
        assert!(busy(&mut l, 11, acquire("r4", "#r4", Mode::Read, 60_000)));
        assert!(l.line().iter().all(|w| w.marker != "#r4"));
        // The claim (the acquire run again with the marker) reports the grant.
        assert_eq!(l.apply(12, &wait("r1", "#r1", Mode::Read, "a")), got(1));
        l.apply(13, &release("#r1"));
        assert!(payloads(&mut l).is_empty(), "a reader still holds");
        l.apply(14, &release("#r2"));
        assert_eq!(
            payloads(&mut l),
            vec![("a".into(), "g:1:0:14:5014:#w2".into())]
        );
        l.apply(15, &release("#w2"));
        assert_eq!(
            payloads(&mut l),
            vec![("a".into(), "g:1:0:15:5015:#r3".into())]
        );
        assert!(l.line().is_empty());
    }

    #[test]
    fn a_re_entry_never_waits_and_an_upgrade_leaves_the_line() {
        let mut l = RwLock::new();
        l.listen("a");
        l.apply(0, &acquire("r", "#r1", Mode::Read, 60_000));
        l.apply(1, &wait("w", "#w", Mode::Write, "a"));
        // A reader's re-entry in read mode: granted at once, ahead of the waiting writer.
        assert_eq!(
            l.apply(2, &wait("r", "#r2", Mode::Read, "a")),
            RwRet::Acquired {
                hold_count: Some(2)
            }
        );
        // A new reader is not: it queues behind the writer.
        assert!(matches!(
            l.apply(3, &wait("s", "#s", Mode::Read, "a")),
            RwRet::Busy { .. }
        ));
        assert_eq!(markers(&l), ["#w", "#s"]);
        // An upgrade is refused at once; it does not join the line.
        assert_eq!(
            l.apply(5, &wait("r", "#up", Mode::Write, "a")),
            RwRet::Refused { read_holds: 2 }
        );
        assert_eq!(markers(&l), ["#w", "#s"]);
        // The last try of a wait that ran out (keep-alive 0) leaves the line.
        let last = RwOp::Wait {
            owner: "s".into(),
            hold: "#s".into(),
            mode: Mode::Read,
            lease_ms: 60_000,
            channel: "a".into(),
            keepalive_ms: 0,
        };
        assert!(matches!(l.apply(6, &last), RwRet::Busy { .. }));
        assert_eq!(markers(&l), ["#w"]);
    }

    #[test]
    fn an_unheard_grant_is_undone_and_the_next_request_gets_it() {
        let mut l = RwLock::new();
        l.listen("a");
        l.apply(0, &acquire("h", "#h", Mode::Write, 60_000));
        l.apply(1, &wait("gone", "#gone", Mode::Write, "nobody"));
        l.apply(2, &wait("here", "#here", Mode::Write, "a"));
        l.apply(3, &release("#h"));
        let messages = l.take_messages();
        assert_eq!(messages.len(), 2);
        assert!(!messages[0].heard && messages[1].heard);
        assert!(!l.holds().contains_key("#gone"));
        assert_eq!(l.holds()["#here"].mode, Mode::Write);
        assert!(l.line().is_empty());
    }

    #[test]
    fn a_cancel_hands_on_an_unclaimed_grant_and_stale_requests_are_dropped() {
        let mut l = RwLock::new();
        l.listen("a");
        l.apply(0, &acquire("h", "#h", Mode::Read, 100));
        l.apply(1, &wait("w", "#w", Mode::Write, "a"));
        l.apply(2, &wait("r", "#r", Mode::Read, "a"));
        // The reader's lease runs out: the next script that serves the line grants the writer.
        assert_eq!(
            l.apply(
                150,
                &RwOp::Renew {
                    holds: vec![("#h".into(), 100)]
                }
            ),
            RwRet::Renewed(vec![false])
        );
        assert!(payloads(&mut l).is_empty(), "a renewal serves nobody");
        l.apply(150, &release("#nothing"));
        assert_eq!(
            payloads(&mut l),
            vec![("a".into(), "g:1:0:150:5150:#w".into())]
        );
        // The writer gave up while its grant was on its way: the cancel gives the hold back, and
        // the reader behind gets the lock.
        let cancel = RwOp::Cancel {
            owner: "w".into(),
            hold: "#w".into(),
            mode: Mode::Write,
            lease_ms: 60_000,
            channel: "a".into(),
        };
        assert_eq!(l.apply(160, &cancel), RwRet::Cancelled(true));
        assert_eq!(
            payloads(&mut l),
            vec![("a".into(), "g:1:0:160:5160:#r".into())]
        );
        assert_eq!(l.apply(161, &cancel), RwRet::Cancelled(false));
        // A request whose keep-alive passed is dropped before the line is served.
        l.apply(200, &wait("x", "#x", Mode::Write, "a"));
        l.apply(200 + 5_000, &release("#r"));
        assert!(payloads(&mut l).is_empty());
        assert!(l.line().is_empty());
    }

    #[test]
    fn force_unlock_grants_the_line() {
        let mut l = RwLock::new();
        l.listen("a");
        l.apply(0, &acquire("h", "#h", Mode::Write, 60_000));
        l.apply(1, &wait("r", "#r", Mode::Read, "a"));
        l.apply(2, &RwOp::Foreign);
        assert_eq!(l.apply(3, &release("#h")), RwRet::WrongType);
        assert_eq!(l.apply(4, &RwOp::ForceUnlock), RwRet::ForceUnlocked(true));
        assert_eq!(
            payloads(&mut l),
            vec![("a".into(), "g:1:0:4:5004:#r".into())]
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
