//! The semaphores' model: `Semaphore` (holds of `k` leased permits) and
//! `PermitExpirableSemaphore` (one permit per hold, the hold's id handed around).
//!
//! Encodes `docs/guide.md`, "Semaphore — at most N at a time, with leased permits":
//!
//! > Every pod may call this at start-up: only the first call sets the total.
//! > Every acquisition is one *hold* of `k` permits with a lease […] a fixed lease ends on its
//! > own. […] A holder that crashes gives its permits back when its lease ends.
//! > Asking for zero permits, more than 4,294,967,295, a zero lease: `Error::InvalidArgument`,
//! > before anything is sent. Asking for more permits than the semaphore has **in total**, or
//! > using a semaphore whose permits were never set: `Error::Refused` at once […]
//! > `add_permits(-n)` never takes permits away from holders: while they keep more than the new
//! > total, none is free. The total cannot go below zero (`Refused`).
//! > An acquire re-sent by fred after a reconnect takes its permits once.
//! > permits come back only through the guard of the hold that took them (or its lease
//! > ending), and a second release is `NotHeld`.
//!
//! its "PermitExpirableSemaphore" section (`release(id)` from anywhere; `update_lease(id,
//! lease)` "sets the lease to end `lease` from now (shorter or longer than before) and returns
//! `false` when the permit is gone"), and `docs/topologies.md`, "Memory limits and eviction":
//!
//! > **leases gone, permits in use:** every hold is dropped and its permits come back […]
//! > **leases left without a total** (the main HASH was evicted): the leases are dropped, and
//! > `try_set_permits` can set the total again from a clean state. […] The repair is counted in
//! > the main HASH's `evicted` field.
//!
//! Renewal (the watchdog's batch) never shortens a lease and never revives a lapsed hold.
//!
//! The FIFO line and its direct grant (issue 28; `scripts/line_lib.lua`, `semaphore_lib.lua`, the
//! rustdoc of `Semaphore`, "Waiting: a FIFO line"), the grant as part of the model as the lock's
//! is ([`crate::lock`]):
//!
//! > Waiting acquire calls stand in one line […] Whatever frees permits — a release, an
//! > `add_permits`, a holder's lease found run out — grants them, in the same script, to the head
//! > of the line while the head's request fits: the granted call holds its permits at once and is
//! > told on its client's own channel, with one message; no other client hears anything.
//! > A request for many permits at the head is not overtaken by smaller ones behind it […]
//! > `try_acquire` with a zero `wait` takes permits only when nobody waits ahead of it.
//!
//! A request is `<marker> <lease> <permits> <channel>`; a try that waits (keep-alive > 0) joins
//! the line or keeps its place and pushes its keep-alive deadline, one that does not (keep-alive
//! 0) leaves it; entries whose deadline passed are dropped before the line is served. A grant is
//! a hold of `min(lease, PROBATION_MS)` announced with `g:<k>:0:<now>:<expiry>:<marker>` on the
//! request's channel; a grant nobody heard is undone at once and the walk goes on. A total set or
//! lowered takes every live request that asks for more out of the line and publishes `w:<marker>`
//! on its channel. Which channels have a subscriber is part of the state ([`Semaphore::listen`]);
//! the messages are kept for the caller to compare with what a subscriber got
//! ([`Semaphore::take_messages`]).
//!
//! And its "Data loss" paragraph (issue 19, §6):
//!
//! > an acquire that finds the semaphore's keys gone […] sets the total again, atomically, before
//! > it takes its permits […] the first to find the keys gone sets it. `add_permits` on a total
//! > that is absent starts from the configured total.

use std::collections::{BTreeMap, BTreeSet};

use crate::lock::{LockRet, PROBATION_MS};
use crate::spec::{release_seen, Seen, Spec};
use crate::timed::Timed;

pub use crate::rwlock::MAX_LEASE_MS;

/// The most permits a semaphore can have, or a hold can take (4,294,967,295).
pub const MAX_PERMITS: u64 = u32::MAX as u64;

/// One live hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hold {
    /// The permits it took.
    pub permits: u64,
    /// When its lease ends (server ms).
    pub expiry: u64,
}

/// Which of the semaphore's two keys an eviction took.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// The main HASH (total, permits in use, each hold's permits, the repair count).
    Main,
    /// The leases ZSET.
    Leases,
}

/// One waiting acquire call in the line.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Waiter {
    /// The call's hold marker.
    pub marker: String,
    /// The lease it asked for (ms).
    pub lease_ms: u64,
    /// The permits it asked for.
    pub permits: u64,
    /// Its client's own channel.
    pub channel: String,
    /// Its keep-alive deadline (server ms): dropped once it has passed.
    pub deadline: u64,
}

impl Waiter {
    /// The request as the scripts file it: `<marker> <lease> <permits> <channel>`.
    pub fn member(&self) -> String {
        format!(
            "{} {} {} {}",
            self.marker, self.lease_ms, self.permits, self.channel
        )
    }
}

/// One published message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Message {
    /// The channel.
    pub channel: String,
    /// The payload.
    pub payload: String,
    /// Whether a subscriber got it.
    pub heard: bool,
}

/// The state of one semaphore (either kind).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Semaphore {
    total: Option<u64>,
    holds: BTreeMap<String, Hold>,
    evicted: u64,
    foreign: bool,
    /// The line, head first (kept apart from the two keys above: an eviction, a foreign value
    /// or deleting the two keys leaves it).
    line: Vec<Waiter>,
    listening: BTreeSet<String>,
    messages: Vec<Message>,
}

/// An operation on a semaphore.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SemOp {
    /// Set the total, only if it was never set.
    TrySetPermits {
        /// The total.
        permits: u64,
    },
    /// Add to (or take from) the total.
    AddPermits {
        /// The change.
        delta: i64,
        /// The caller's configured total: an absent total starts from it (`None`: from 0).
        configured: Option<u64>,
    },
    /// Take `permits` as one hold (`hold` unique per request; a re-send repeats it).
    Acquire {
        /// The hold's marker (the permit id of a permit-expirable semaphore).
        hold: String,
        /// How many (1 for a permit-expirable semaphore).
        permits: u64,
        /// The lease in ms.
        lease_ms: u64,
        /// The caller's configured total: an absent total is set to it first (`None`: the
        /// acquire is refused as `NotSet`).
        configured: Option<u64>,
    },
    /// As [`Acquire`](SemOp::Acquire), by a call that waits if refused: its request (on its
    /// client's `channel`) joins the line, or keeps its place, until `keepalive_ms` from now.
    Wait {
        /// The call's hold marker, the same for every try.
        hold: String,
        /// How many.
        permits: u64,
        /// The lease in ms.
        lease_ms: u64,
        /// The caller's configured total.
        configured: Option<u64>,
        /// Its client's own channel.
        channel: String,
        /// The keep-alive in ms (0: a try that does not wait, as `Acquire`).
        keepalive_ms: u64,
    },
    /// A waiting call gave up: its request leaves the line, permits granted to it and not taken
    /// are given back, and the line is served.
    Cancel {
        /// The call's hold marker.
        hold: String,
        /// How many it asked for.
        permits: u64,
        /// The lease it asked for.
        lease_ms: u64,
        /// Its client's own channel.
        channel: String,
    },
    /// Give back one hold (by its taker's guard, or by id).
    Release {
        /// The hold's marker.
        hold: String,
    },
    /// Extend (lease > 0) or check (lease 0) holds in one batch; never shortens.
    Renew {
        /// `(marker, lease ms)` per hold.
        holds: Vec<(String, u64)>,
    },
    /// Set a hold's lease to end `lease_ms` from now (shorter or longer).
    UpdateLease {
        /// The hold's marker.
        hold: String,
        /// The new lease in ms.
        lease_ms: u64,
    },
    /// The free permits and the total.
    Available,
    /// Redis evicted one of the two keys (noticed and repaired by the next operation).
    Evict(Key),
    /// Another program replaces the keys with a value of another type at the main key.
    Foreign,
    /// The semaphore's keys are deleted (by an operator).
    Clear,
}

/// An operation's result.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SemRet {
    /// Whether this call set the total.
    Set(bool),
    /// The total was changed; the new total.
    Added {
        /// The new total.
        total: u64,
    },
    /// Refused: the total would go below zero (the current total).
    BelowZero {
        /// The current total.
        total: u64,
    },
    /// Refused: the total would exceed [`MAX_PERMITS`] (the current total).
    AboveMax {
        /// The current total.
        total: u64,
    },
    /// Taken; the permits still free (`None`: not observed).
    Acquired {
        /// Free permits afterwards.
        available: Option<u64>,
    },
    /// One try found too few free permits.
    Busy,
    /// A waiting acquire gave up: nothing taken. Always allowed (progress is judged elsewhere).
    TimedOut,
    /// Refused: more permits than the total.
    MoreThanTotal {
        /// The total.
        total: u64,
    },
    /// Refused: the permits were never set.
    NotSet,
    /// Rejected before anything was sent.
    InvalidArgument,
    /// The hold was given back.
    Released,
    /// The hold was not there.
    NotHeld,
    /// Per renewed hold: whether it is live (and was extended).
    Renewed(Vec<bool>),
    /// Whether the hold was there (and its lease set).
    LeaseUpdated(bool),
    /// Whether the request was in the line, or granted (`Cancel`).
    Cancelled(bool),
    /// The free permits and the total.
    Available {
        /// Free now.
        available: u64,
        /// The total.
        total: u64,
    },
    /// The key holds another type; nothing changed.
    WrongType,
    /// The call failed without saying whether it took effect.
    Error,
    /// Done (`Evict`, `Foreign`, `Clear`).
    Done,
}

impl Semaphore {
    /// A semaphore whose permits were never set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The total (`None`: never set).
    pub fn total(&self) -> Option<u64> {
        self.total
    }

    /// The live holds by marker, as of the last step.
    pub fn holds(&self) -> &BTreeMap<String, Hold> {
        &self.holds
    }

    /// How many evictions were noticed and repaired (0: never).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Whether the main key holds a value of another type.
    pub fn is_foreign(&self) -> bool {
        self.foreign
    }

    /// The permits held by live holds.
    pub fn used(&self) -> u64 {
        self.holds.values().map(|h| h.permits).sum()
    }

    /// The free permits: none while holders keep more than a reduced total.
    pub fn available(&self) -> u64 {
        self.total.unwrap_or(0).saturating_sub(self.used())
    }

    /// Gives back the permits of the holds whose lease ended by `now`.
    pub fn purge(&mut self, now: u64) {
        self.holds.retain(|_, h| h.expiry > now);
    }

    /// The two first keys gone (`foreign`: a value of another type at the main key): the line,
    /// kept in keys of its own, stays.
    fn reset(&mut self, foreign: bool) {
        let (line, listening, messages) = (
            std::mem::take(&mut self.line),
            std::mem::take(&mut self.listening),
            std::mem::take(&mut self.messages),
        );
        *self = Self::new();
        self.foreign = foreign;
        (self.line, self.listening, self.messages) = (line, listening, messages);
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

    fn publish(&mut self, channel: &str, payload: String) -> bool {
        let heard = self.listening.contains(channel);
        self.messages.push(Message {
            channel: channel.to_owned(),
            payload,
            heard,
        });
        heard
    }

    /// Drops the requests whose keep-alive deadline passed by `now` (line_lib.lua's `prune`).
    fn prune(&mut self, now: u64) {
        self.line.retain(|w| w.deadline > now);
    }

    /// Takes `member` out of the line.
    fn leave(&mut self, member: &str) {
        self.line.retain(|w| w.member() != member);
    }

    /// semaphore_lib.lua's `grant_line`: grants the head while it fits; stops at a head that
    /// asks for more than is free, at `caller`'s request, or while the total is absent; drops a
    /// head asking for more than the total, or whose marker holds already.
    fn grant_line(&mut self, now: u64, caller: Option<&str>) {
        if self.line.is_empty() {
            return;
        }
        self.prune(now);
        while let Some(head) = self.line.first().cloned() {
            let Some(total) = self.total else {
                return;
            };
            if Some(head.marker.as_str()) == caller {
                return;
            }
            if head.permits > total || self.holds.contains_key(&head.marker) {
                self.line.remove(0);
                continue;
            }
            if self.available() < head.permits {
                return;
            }
            self.line.remove(0);
            let expiry = now + head.lease_ms.min(PROBATION_MS);
            self.holds.insert(
                head.marker.clone(),
                Hold {
                    permits: head.permits,
                    expiry,
                },
            );
            let grant = format!("g:{}:0:{now}:{expiry}:{}", head.permits, head.marker);
            if !self.publish(&head.channel, grant) {
                self.holds.remove(&head.marker);
            }
        }
    }

    /// semaphore_lib.lua's `refuse_impossible`: every live request asking for more than the
    /// total leaves the line and is told (`w:<marker>`).
    fn refuse_impossible(&mut self, now: u64) {
        let Some(total) = self.total else {
            return;
        };
        if self.line.is_empty() {
            return;
        }
        self.prune(now);
        let (refused, kept): (Vec<Waiter>, Vec<Waiter>) = std::mem::take(&mut self.line)
            .into_iter()
            .partition(|w| w.permits > total);
        self.line = kept;
        for waiter in refused {
            self.publish(&waiter.channel, format!("w:{}", waiter.marker));
        }
    }

    /// semaphore_acquire.lua.
    #[allow(clippy::too_many_arguments)] // the script's arguments
    fn acquire(
        &mut self,
        now: u64,
        hold: &str,
        permits: u64,
        lease_ms: u64,
        configured: Option<u64>,
        channel: &str,
        keepalive_ms: u64,
    ) -> SemRet {
        let me = Waiter {
            marker: hold.to_owned(),
            lease_ms,
            permits,
            channel: channel.to_owned(),
            deadline: now + keepalive_ms,
        };
        let member = me.member();
        self.purge(now);
        if self.total.is_none() {
            // The first initialiser wins: a total set already is kept.
            self.total = configured;
            if self.total.is_none() {
                self.leave(&member);
                return SemRet::NotSet;
            }
            self.refuse_impossible(now);
        }
        let total = self.total.unwrap_or(0);
        let ret = if let Some(h) = self.holds.get_mut(hold) {
            h.expiry = h.expiry.max(now + lease_ms);
            self.leave(&member);
            SemRet::Acquired {
                available: Some(self.available()),
            }
        } else if permits > total {
            self.leave(&member);
            SemRet::MoreThanTotal { total }
        } else {
            self.grant_line(now, Some(hold));
            let first = self.line.first().map(Waiter::member);
            if first.as_ref().is_none_or(|m| *m == member) && self.available() >= permits {
                self.holds.insert(
                    hold.to_owned(),
                    Hold {
                        permits,
                        expiry: now + lease_ms,
                    },
                );
                self.leave(&member);
                SemRet::Acquired {
                    available: Some(self.available()),
                }
            } else {
                if keepalive_ms > 0 {
                    match self.line.iter_mut().find(|w| w.member() == member) {
                        Some(w) => w.deadline = now + keepalive_ms,
                        None => self.line.push(me),
                    }
                } else {
                    self.leave(&member);
                }
                SemRet::Busy
            }
        };
        self.grant_line(now, None);
        ret
    }

    /// The result of `op` at `now`, and the state it leaves (deterministic: the script's reply).
    pub fn apply(&mut self, now: u64, op: &SemOp) -> SemRet {
        if let Some(ret) = Self::invalid(op) {
            return ret;
        }
        match op {
            SemOp::Foreign | SemOp::Clear => {
                self.reset(*op == SemOp::Foreign);
                return SemRet::Done;
            }
            SemOp::Renew { holds } if self.foreign => {
                return SemRet::Renewed(vec![false; holds.len()]);
            }
            SemOp::Cancel {
                hold,
                permits,
                lease_ms,
                channel,
            } if self.foreign => {
                // The script leaves the line before its first read of the main key fails.
                let member = format!("{hold} {lease_ms} {permits} {channel}");
                self.leave(&member);
                return SemRet::WrongType;
            }
            _ if self.foreign => return SemRet::WrongType,
            _ => {}
        }
        match op {
            SemOp::TrySetPermits { permits } => {
                // Holds left without a total were dropped when the eviction was noticed.
                let set = self.total.is_none();
                if set {
                    self.total = Some(*permits);
                    self.refuse_impossible(now);
                    self.grant_line(now, None);
                }
                SemRet::Set(set)
            }
            SemOp::AddPermits { delta, configured } => {
                self.purge(now);
                let current = self.total;
                let total = current.or(*configured).unwrap_or(0);
                let ret = match total.checked_add_signed(*delta) {
                    None => SemRet::BelowZero { total },
                    Some(new) if new > MAX_PERMITS => SemRet::AboveMax { total },
                    Some(new) => {
                        self.total = Some(new);
                        if current.is_none() || *delta < 0 {
                            self.refuse_impossible(now);
                        }
                        SemRet::Added { total: new }
                    }
                };
                self.grant_line(now, None);
                ret
            }
            SemOp::Acquire {
                hold,
                permits,
                lease_ms,
                configured,
            } => self.acquire(now, hold, *permits, *lease_ms, *configured, "", 0),
            SemOp::Wait {
                hold,
                permits,
                lease_ms,
                configured,
                channel,
                keepalive_ms,
            } => self.acquire(
                now,
                hold,
                *permits,
                *lease_ms,
                *configured,
                channel,
                *keepalive_ms,
            ),
            SemOp::Cancel {
                hold,
                permits,
                lease_ms,
                channel,
            } => {
                let member = format!("{hold} {lease_ms} {permits} {channel}");
                let mut removed = self
                    .line
                    .iter()
                    .any(|w| w.member() == member && w.deadline > now);
                self.leave(&member);
                self.purge(now);
                if self.holds.remove(hold).is_some() {
                    removed = true;
                }
                self.grant_line(now, None);
                SemRet::Cancelled(removed)
            }
            SemOp::Release { hold } => {
                self.purge(now);
                let ret = match self.holds.remove(hold) {
                    Some(_) => SemRet::Released,
                    None => SemRet::NotHeld,
                };
                self.grant_line(now, None);
                ret
            }
            SemOp::Renew { holds } => {
                // A lapsed hold is never revived (whether or not a purge removed it yet).
                SemRet::Renewed(
                    holds
                        .iter()
                        .map(|(marker, lease)| match self.holds.get_mut(marker) {
                            Some(h) if h.expiry > now => {
                                h.expiry = h.expiry.max(now + lease);
                                true
                            }
                            _ => false,
                        })
                        .collect(),
                )
            }
            SemOp::UpdateLease { hold, lease_ms } => {
                self.purge(now);
                let ret = match self.holds.get_mut(hold) {
                    Some(h) => {
                        h.expiry = now + lease_ms;
                        SemRet::LeaseUpdated(true)
                    }
                    None => SemRet::LeaseUpdated(false),
                };
                self.grant_line(now, None);
                ret
            }
            SemOp::Available => {
                self.purge(now);
                self.grant_line(now, None);
                match self.total {
                    None => SemRet::NotSet,
                    Some(total) => SemRet::Available {
                        available: self.available(),
                        total,
                    },
                }
            }
            SemOp::Evict(key) => {
                self.evict(*key);
                SemRet::Done
            }
            SemOp::Foreign | SemOp::Clear => SemRet::Done,
        }
    }

    /// Arguments the runtime rejects before sending anything.
    fn invalid(op: &SemOp) -> Option<SemRet> {
        let bad_lease = |l: u64| l == 0 || l > MAX_LEASE_MS;
        let bad = match op {
            SemOp::TrySetPermits { permits } => *permits > MAX_PERMITS,
            SemOp::Acquire {
                permits, lease_ms, ..
            }
            | SemOp::Wait {
                permits, lease_ms, ..
            } => *permits == 0 || *permits > MAX_PERMITS || bad_lease(*lease_ms),
            SemOp::UpdateLease { hold, lease_ms } => bad_lease(*lease_ms) || !is_permit_id(hold),
            SemOp::Release { hold } => !is_permit_id(hold),
            _ => false,
        };
        bad.then_some(SemRet::InvalidArgument)
    }

    /// An eviction, with the repair the next operation makes (the only way to observe it).
    /// Holds whose lease ended but that no operation has purged yet still have their lease
    /// entry: the keys still go together or not, whatever the leases say.
    fn evict(&mut self, key: Key) {
        match key {
            // Leases gone while permits are in use: every hold is dropped, the total kept.
            Key::Leases if !self.holds.is_empty() => {
                self.holds.clear();
                self.evicted += 1;
            }
            Key::Leases => {}
            // The main HASH gone: the total, the holds' permits and the repair count with it;
            // leases left over are dropped (a repair).
            Key::Main => {
                let orphans = !self.holds.is_empty();
                self.reset(false);
                if orphans {
                    self.evicted = 1;
                }
            }
        }
    }
}

/// Whether `id` can be a hold marker (a permit id): `#` and at least one more character.
pub fn is_permit_id(id: &str) -> bool {
    id.len() > 1 && id.starts_with('#')
}

impl Timed for Semaphore {
    type Op = SemOp;
    type Ret = SemRet;

    fn outcomes(&self, now: u64, op: &SemOp) -> Vec<(SemRet, Self)> {
        let mut after = self.clone();
        let ret = after.apply(now, op);
        if ret == SemRet::InvalidArgument {
            return vec![(ret, after)];
        }
        let mut before = self.clone();
        if !before.foreign {
            before.purge(now);
        }
        let mut out = vec![(ret.clone(), after.clone())];
        if matches!(op, SemOp::Acquire { .. } | SemOp::Wait { .. }) {
            out.push((SemRet::TimedOut, before.clone()));
        }
        out.push((SemRet::Error, before));
        out.push((SemRet::Error, after));
        out
    }

    fn deadlines(&self) -> Vec<u64> {
        self.holds
            .values()
            .map(|h| h.expiry)
            .chain(self.line.iter().map(|w| w.deadline))
            .collect()
    }

    fn accepts(expected: &SemRet, observed: &SemRet) -> bool {
        match (expected, observed) {
            (SemRet::Acquired { available: e }, SemRet::Acquired { available: o }) => {
                o.is_none() || e == o
            }
            _ => expected == observed,
        }
    }
}

/// An operation of a recorded client history on one semaphore (for [`PermitSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PermitHistoryOp {
    /// An acquire of `permits` (any wait, any lease) whose hold (if granted) is `hold`, unique per
    /// acquisition.
    Acquire {
        /// The hold the acquisition creates.
        hold: String,
        /// How many permits.
        permits: u64,
        /// The history shows the hold may have ended on its own (see [`Seen`]).
        may_lapse: bool,
    },
    /// The release of `hold` (its guard, or by id).
    Release {
        /// The hold given back.
        hold: String,
    },
}

/// The semaphore's rule without time, for checking concurrent client histories (results as
/// [`LockRet`]): the permits of the holds in force never exceed the total. A grant that needs room
/// only holds that cannot have ended occupy is a violation; when it needs room that holds which
/// may have ended occupy, they are all taken to have ended (their releases must answer
/// `NotHeld`). That choice is exact for the holds a history marks (a lost guard's release answers
/// `NotHeld` every time) and conservative otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PermitSpec {
    total: u64,
    holds: BTreeMap<String, Seen<u64>>,
}

impl PermitSpec {
    /// A semaphore of `total` permits, none taken.
    pub fn new(total: u64) -> Self {
        Self {
            total,
            holds: BTreeMap::new(),
        }
    }

    fn load(&self, counts: impl Fn(&Seen<u64>) -> bool) -> u64 {
        self.holds
            .values()
            .filter(|s| counts(s))
            .map(|s| s.kind)
            .sum()
    }
}

impl Spec for PermitSpec {
    type Op = PermitHistoryOp;
    type Ret = LockRet;

    fn step(&self, op: &PermitHistoryOp, ret: &LockRet) -> Option<Self> {
        let mut next = self.clone();
        match (op, ret) {
            (
                PermitHistoryOp::Acquire {
                    hold,
                    permits,
                    may_lapse,
                },
                LockRet::Granted(None),
            ) => {
                let fixed = next.load(|s| s.state == crate::spec::HoldState::Live && !s.may_lapse);
                if fixed + permits > next.total {
                    return None;
                }
                if next.load(Seen::in_force) + permits > next.total {
                    for seen in next.holds.values_mut() {
                        if seen.in_force() {
                            seen.yield_to_grant();
                        }
                    }
                }
                next.holds
                    .insert(hold.clone(), Seen::live(hold, *permits, *may_lapse));
            }
            (PermitHistoryOp::Acquire { .. }, LockRet::TimedOut | LockRet::Refused) => {}
            (
                PermitHistoryOp::Acquire {
                    hold,
                    permits,
                    may_lapse,
                },
                LockRet::Error,
            ) => {
                next.holds
                    .entry(hold.clone())
                    .or_insert(Seen::maybe(hold, *permits, *may_lapse));
            }
            (PermitHistoryOp::Release { hold }, ret) => {
                release_seen(&mut next.holds, hold, ret)?;
            }
            _ => return None,
        }
        Some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acquire(hold: &str, permits: u64, lease_ms: u64) -> SemOp {
        SemOp::Acquire {
            hold: hold.into(),
            permits,
            lease_ms,
            configured: None,
        }
    }

    fn add(delta: i64) -> SemOp {
        SemOp::AddPermits {
            delta,
            configured: None,
        }
    }

    #[test]
    fn a_lost_total_is_set_again_by_the_first_configured_acquire() {
        let mut s = Semaphore::new();
        s.apply(0, &SemOp::TrySetPermits { permits: 2 });
        s.apply(0, &acquire("#1", 2, 1000));
        s.apply(1, &SemOp::Clear);
        let configured = |hold: &str, permits, total| SemOp::Acquire {
            hold: hold.into(),
            permits,
            lease_ms: 1000,
            configured: Some(total),
        };
        assert_eq!(s.apply(1, &acquire("#2", 1, 1000)), SemRet::NotSet);
        assert_eq!(
            s.apply(1, &configured("#2", 1, 3)),
            SemRet::Acquired { available: Some(2) }
        );
        // The first initialiser wins.
        assert_eq!(
            s.apply(1, &configured("#3", 4, 5)),
            SemRet::MoreThanTotal { total: 3 }
        );
        s.apply(2, &SemOp::Clear);
        assert_eq!(
            s.apply(
                2,
                &SemOp::AddPermits {
                    delta: -1,
                    configured: Some(3)
                }
            ),
            SemRet::Added { total: 2 }
        );
    }

    #[test]
    fn permits_are_leased_and_counted_once() {
        let mut s = Semaphore::new();
        assert_eq!(s.apply(0, &acquire("#1", 1, 100)), SemRet::NotSet);
        assert_eq!(
            s.apply(0, &SemOp::TrySetPermits { permits: 3 }),
            SemRet::Set(true)
        );
        assert_eq!(
            s.apply(0, &SemOp::TrySetPermits { permits: 9 }),
            SemRet::Set(false)
        );
        let got = |n| SemRet::Acquired { available: Some(n) };
        assert_eq!(s.apply(0, &acquire("#1", 2, 100)), got(1));
        assert_eq!(s.apply(0, &acquire("#1", 2, 100)), got(1), "a re-send");
        assert_eq!(s.apply(0, &acquire("#2", 2, 100)), SemRet::Busy);
        assert_eq!(
            s.apply(0, &acquire("#2", 4, 100)),
            SemRet::MoreThanTotal { total: 3 }
        );
        assert_eq!(s.apply(0, &acquire("#2", 0, 100)), SemRet::InvalidArgument);
        // The lease ends: the permits come back.
        assert_eq!(
            s.apply(100, &SemOp::Available),
            SemRet::Available {
                available: 3,
                total: 3
            }
        );
        assert_eq!(
            s.apply(100, &SemOp::Release { hold: "#1".into() }),
            SemRet::NotHeld
        );
    }

    #[test]
    fn a_reduced_total_takes_nothing_from_holders() {
        let mut s = Semaphore::new();
        s.apply(0, &SemOp::TrySetPermits { permits: 2 });
        s.apply(0, &acquire("#1", 2, 1000));
        assert_eq!(s.apply(0, &add(-1)), SemRet::Added { total: 1 });
        assert_eq!(s.available(), 0);
        assert_eq!(s.apply(0, &add(-2)), SemRet::BelowZero { total: 1 });
        assert_eq!(
            s.apply(0, &SemOp::Release { hold: "#1".into() }),
            SemRet::Released
        );
        assert_eq!(s.available(), 1);
    }

    #[test]
    fn evictions_are_repaired() {
        let mut s = Semaphore::new();
        s.apply(0, &SemOp::TrySetPermits { permits: 2 });
        s.apply(0, &acquire("#1", 2, 1000));
        s.apply(1, &SemOp::Evict(Key::Leases));
        assert_eq!((s.available(), s.evicted()), (2, 1));
        s.apply(1, &acquire("#2", 1, 1000));
        s.apply(2, &SemOp::Evict(Key::Main));
        assert_eq!((s.total(), s.evicted()), (None, 1));
        assert_eq!(
            s.apply(2, &SemOp::TrySetPermits { permits: 1 }),
            SemRet::Set(true)
        );
        assert_eq!(
            s.apply(
                3,
                &SemOp::Renew {
                    holds: vec![("#2".into(), 100)]
                }
            ),
            SemRet::Renewed(vec![false])
        );
    }

    fn wait(hold: &str, permits: u64, channel: &str) -> SemOp {
        SemOp::Wait {
            hold: hold.into(),
            permits,
            lease_ms: 60_000,
            configured: None,
            channel: channel.into(),
            keepalive_ms: 5_000,
        }
    }

    fn payloads(s: &mut Semaphore) -> Vec<(String, String)> {
        s.take_messages()
            .into_iter()
            .map(|m| (m.channel, m.payload))
            .collect()
    }

    #[test]
    fn the_line_is_granted_in_order_and_a_big_head_is_not_overtaken() {
        let mut s = Semaphore::new();
        s.listen("a");
        s.listen("b");
        s.apply(0, &SemOp::TrySetPermits { permits: 2 });
        assert!(matches!(
            s.apply(0, &acquire("#h:1", 1, 60_000)),
            SemRet::Acquired { .. }
        ));
        assert!(matches!(
            s.apply(0, &acquire("#h:2", 1, 60_000)),
            SemRet::Acquired { .. }
        ));
        assert_eq!(s.apply(1, &wait("#big", 2, "a")), SemRet::Busy);
        assert_eq!(s.apply(2, &wait("#small", 1, "b")), SemRet::Busy);
        // One permit back: kept for the head, which needs two; nobody is told anything.
        assert_eq!(
            s.apply(
                3,
                &SemOp::Release {
                    hold: "#h:1".into()
                }
            ),
            SemRet::Released
        );
        assert!(payloads(&mut s).is_empty());
        assert_eq!(s.available(), 1);
        // Nor does a try that does not wait jump the line.
        assert_eq!(s.apply(3, &acquire("#t:1", 1, 60_000)), SemRet::Busy);
        // The second permit back: the head gets both, on its channel alone, on probation.
        assert_eq!(
            s.apply(
                4,
                &SemOp::Release {
                    hold: "#h:2".into()
                }
            ),
            SemRet::Released
        );
        assert_eq!(
            payloads(&mut s),
            vec![("a".into(), "g:2:0:4:5004:#big".into())]
        );
        assert_eq!(s.holds()["#big"].expiry, 4 + PROBATION_MS);
        assert_eq!(
            s.apply(
                5,
                &SemOp::Release {
                    hold: "#big".into()
                }
            ),
            SemRet::Released
        );
        assert_eq!(
            payloads(&mut s),
            vec![("b".into(), "g:1:0:5:5005:#small".into())]
        );
        assert!(s.line().is_empty());
    }

    #[test]
    fn an_unheard_grant_is_undone_and_the_next_request_gets_it() {
        let mut s = Semaphore::new();
        s.listen("a");
        s.apply(0, &SemOp::TrySetPermits { permits: 1 });
        s.apply(0, &acquire("#h:1", 1, 60_000));
        s.apply(1, &wait("#gone", 1, "nobody"));
        s.apply(2, &wait("#here", 1, "a"));
        s.apply(
            3,
            &SemOp::Release {
                hold: "#h:1".into(),
            },
        );
        let messages = s.take_messages();
        assert_eq!(messages.len(), 2);
        assert!(!messages[0].heard && messages[1].heard);
        assert!(!s.holds().contains_key("#gone"));
        assert!(s.holds().contains_key("#here"));
    }

    #[test]
    fn a_lowered_total_refuses_the_requests_it_made_impossible() {
        let mut s = Semaphore::new();
        s.listen("a");
        s.apply(0, &SemOp::TrySetPermits { permits: 3 });
        s.apply(0, &acquire("#h:1", 3, 60_000));
        s.apply(1, &wait("#three", 3, "a"));
        s.apply(2, &wait("#one", 1, "a"));
        s.apply(3, &add(-1));
        assert_eq!(payloads(&mut s), vec![("a".into(), "w:#three".into())]);
        assert_eq!(s.line().len(), 1);
    }

    #[test]
    fn spec_permits_in_force_never_exceed_the_total() {
        let acquire = |hold: &str, permits: u64, may_lapse: bool| PermitHistoryOp::Acquire {
            hold: hold.to_owned(),
            permits,
            may_lapse,
        };
        let granted = LockRet::Granted(None);
        let s = PermitSpec::new(3)
            .step(&acquire("a", 2, false), &granted)
            .unwrap();
        assert!(s.step(&acquire("b", 2, false), &granted).is_none());
        let s = s.step(&acquire("b", 1, true), &granted).unwrap();
        // b may have lapsed: room for c, and then b's release must say NotHeld.
        let s = s.step(&acquire("c", 1, false), &granted).unwrap();
        let release = |hold: &str| PermitHistoryOp::Release {
            hold: hold.to_owned(),
        };
        assert!(s.step(&release("b"), &LockRet::Released).is_none());
        let s = s.step(&release("b"), &LockRet::NotHeld).unwrap();
        let s = s.step(&release("a"), &LockRet::Released).unwrap();
        assert!(s.step(&release("a"), &LockRet::Released).is_none());
        assert!(s.step(&acquire("d", 2, false), &granted).is_some());
    }
}
