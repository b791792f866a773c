//! The reentrant hash locks: [`Lock`](LockKind::Lock), [`FencedLock`](LockKind::Fenced) and
//! [`FairLock`](LockKind::Fair), as one model ([`HashLock`]) with a kind.
//!
//! The contract encoded here, from `docs/design.md` ("The lock's data", "Script contracts",
//! "The lock family") and `docs/guide.md` ("Lock", "FencedLock", "FairLock"):
//!
//! - *"A HASH per lock; every hold in it has a lease of its own."* An owner's count is the number
//!   of its holds; *"a hold is live while its expiry is in the future"*; *"every script that reads
//!   the hash first ends the holds whose lease ran out"*; *"the key exists exactly while some hold
//!   is live"* (it expires with the latest hold).
//! - *"an acquire that fred re-sends after a dropped connection finds its marker and does not
//!   count again"*; *"a release names the exact hold it gives back"*; *"renewal neither revives
//!   it nor moves any other hold's expiry"*; *"a hold's own expiry is never shortened by a
//!   re-sent acquire or a renewal"*.
//! - Fencing: *"every acquire mints `max(counter, TIME in µs) + 1`"*, the counter never expires,
//!   *"`force_unlock` keeps the counter"*, and tokens never repeat even after the object's keys
//!   are restored from an older snapshot ([`HashLock::restore`] keeps the highest token issued).
//! - The `Lock`'s waiting set (guide, "Handoff under contention"; design, the lock family table):
//!   busy acquires that will wait join it by when they first found the lock taken, with a
//!   keep-alive deadline pushed on by each retry; a release drops the stale entries and, when a
//!   subscriber heard it, reserves the free lock for the longest waiting owner for
//!   [`HANDOFF_WINDOW_MS`]; *"only the reserved owner can take the lock during the window"*; a
//!   reserved waiter that gives up hands the reservation on at once.
//! - The `FairLock` queue (guide, "How the order is kept"): granted only to the head of the queue
//!   or to anyone while it is empty, re-entry past the queue, a zero-wait try never queues,
//!   waiters at the head whose deadline passed are dropped first, a waiter that gives up leaves.
//! - A key of another type: *"a wrong-typed key makes the acquire fail with `WRONGTYPE` … without
//!   touching the foreign value, while the batched renewal treats a wrong-typed key as gone"*.
//!
//! Time is logical: every operation takes the server's clock ([`Now`]), and leases, deadlines and
//! the handoff window are absolute server milliseconds. Keys that Redis expires on its own (the
//! hash, the waiting sets, the queue, the reservation) vanish in the model at the same instants,
//! so the model's state can be compared with what Redis holds at any moment ([`HashLock::view`]).
//!
//! [`LockSpec`] is the same contract without time, for the linearizability checker.

use std::collections::{BTreeMap, BTreeSet};

pub use crate::spec::HoldState;
use crate::spec::{release_seen, Seen, Spec};

/// A point in logical time: the server's clock (`TIME`) in milliseconds and microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Now {
    /// Milliseconds (lease expiries, deadlines).
    pub ms: u64,
    /// Microseconds (the waiting order, fencing tokens); `ms == us / 1000` on a real server.
    pub us: u64,
    /// Redis' own clock for expiring whole keys, at most `ms`: Redis takes it once per command
    /// (a script's is frozen when the script starts), so a key whose expiry falls between it and
    /// the script's later `TIME` is still there for the script.
    pub keys_ms: u64,
}

impl Now {
    /// The instant `us` microseconds after the epoch (both clocks at it).
    pub fn from_us(us: u64) -> Self {
        Self {
            ms: us / 1000,
            us,
            keys_ms: us / 1000,
        }
    }
}

/// The handoff window of the `Lock` and `FencedLock` (`lockkit_protocol::lock::HANDOFF_WINDOW`):
/// how long a release reserves the free lock for the longest waiting owner.
pub const HANDOFF_WINDOW_MS: u64 = 10;

/// Which of the reentrant hash locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// The reentrant lock, with its waiting set and handoff reservation.
    Lock,
    /// The reentrant lock whose acquisitions carry fencing tokens.
    Fenced,
    /// The reentrant lock granted in queue order.
    Fair,
}

/// One outstanding hold.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Hold {
    /// The owner it counts for.
    pub owner: String,
    /// When its own lease ends (server ms); live while the clock is before it.
    pub expiry: u64,
    /// Its fencing token (fenced locks).
    pub token: Option<u64>,
}

/// One acquire request, as the runtime sends it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// The owner id (`<client id>:<sequence>`, or the holder's scope).
    pub owner: String,
    /// The hold marker (`#<client id>:<sequence>`), fixed for the life of one request.
    pub marker: String,
    /// The lease in ms (> 0).
    pub lease_ms: u64,
    /// The waiter's keep-alive in ms; 0 = try once, never wait (and never join the waiting set or
    /// the queue).
    pub keepalive_ms: u64,
    /// The fair lock's waiter id (`<client id>:w<sequence>`, one per acquire call); ignored by
    /// the other kinds, whose waiters are their owners.
    pub waiter: String,
}

/// What an acquire answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Acquired {
    /// Taken: the owner's count after this hold, and its token (fenced locks).
    Granted {
        /// The owner's hold count including this hold.
        count: u32,
        /// The fencing token of this acquisition.
        token: Option<u64>,
    },
    /// Not taken. `until` is the server time up to which nothing changes for this caller without
    /// a message: the holder's latest expiry, or the deadline of the fair queue's head.
    Busy {
        /// Absolute server ms (`None`: never, a key without expiry).
        until: Option<u64>,
    },
    /// Not taken: the lock is free, but reserved for another waiter until `until`.
    Reserved {
        /// Absolute server ms: the end of the handoff window.
        until: u64,
    },
}

/// What a release answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Released {
    /// The last hold was given back: the lock is free (and announced).
    Freed,
    /// Given back; the owner still holds it this many times.
    StillHeld(u32),
    /// The hold was not there: its lease ended, it was force-unlocked or released already.
    NotHeld,
}

/// An operation refused by Redis: a key of another type is at the lock's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WrongType;

/// An expiring Redis collection (the waiting set, its deadlines, the fair queue): gone when empty
/// or once its expiry passed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Expiring<T> {
    /// The content.
    pub items: T,
    /// When Redis deletes it (server ms); `None` while it has no expiry (or does not exist).
    pub expiry: Option<u64>,
}

impl<T: Default + Collection> Expiring<T> {
    /// Makes the key live at least `ms` more milliseconds (never shortening it).
    fn extend(&mut self, now: u64, ms: u64) {
        match self.expiry {
            Some(at) if at.saturating_sub(now) >= ms => {}
            _ => self.expiry = Some(now + ms),
        }
    }

    /// Redis' view at `now`: an expired or empty key does not exist.
    fn expire(&mut self, now: u64) {
        if self.items.is_empty() || self.expiry.is_some_and(|at| now > at) {
            *self = Self::default();
        }
    }
}

/// The collections kept in an [`Expiring`] key.
pub trait Collection {
    /// Whether it holds nothing (Redis deletes an empty collection).
    fn is_empty(&self) -> bool;
}

impl<K, V> Collection for BTreeMap<K, V> {
    fn is_empty(&self) -> bool {
        BTreeMap::is_empty(self)
    }
}

impl<T> Collection for Vec<T> {
    fn is_empty(&self) -> bool {
        Vec::is_empty(self)
    }
}

/// A reentrant hash lock's state (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HashLock {
    kind: LockKind,
    /// Whether a release announcement reaches a subscriber (someone listens on the channel): only
    /// then does a release reserve the lock for a waiter.
    listeners: bool,
    /// A value of another type sits at the lock's key.
    pub foreign: bool,
    /// The hash: marker → hold. Holds whose lease ended stay until a script settles them.
    pub holds: BTreeMap<String, Hold>,
    /// `Lock`/`FencedLock`: owner → when it first found the lock taken (server µs).
    pub waiting: Expiring<BTreeMap<String, u64>>,
    /// Keep-alive deadlines (server ms): of the waiting owners, or of the fair queue's waiters.
    pub timeouts: Expiring<BTreeMap<String, u64>>,
    /// `Lock`/`FencedLock`: the owner a release reserved the free lock for, and until when.
    pub handoff: Option<(String, u64)>,
    /// `FairLock`: the queue of waiter ids, head first.
    pub queue: Expiring<Vec<String>>,
    /// `FencedLock`: the token counter (never expires; `None` while never minted).
    pub counter: Option<u64>,
    /// `FencedLock`: the greatest token ever minted. Not part of Redis' state, so a restore of
    /// older keys does not roll it back: every later token must exceed it.
    pub issued: u64,
}

impl HashLock {
    /// A free lock of `kind`. `listeners`: whether releases reach a subscriber (they do whenever
    /// some client waits; tests that want handoff reservations keep one subscribed).
    pub fn new(kind: LockKind, listeners: bool) -> Self {
        Self {
            kind,
            listeners,
            foreign: false,
            holds: BTreeMap::new(),
            waiting: Expiring::default(),
            timeouts: Expiring::default(),
            handoff: None,
            queue: Expiring::default(),
            counter: None,
            issued: 0,
        }
    }

    /// The kind.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// The holds `owner` has in the hash (what its count field says).
    pub fn count(&self, owner: &str) -> u32 {
        let n = self.holds.values().filter(|h| h.owner == owner).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// When the hash expires: with its latest hold.
    pub fn key_expiry(&self) -> Option<u64> {
        self.holds.values().map(|h| h.expiry).max()
    }

    /// The state as Redis shows it at `now`, without running any script: keys whose expiry
    /// passed are gone, nothing else changes (holds whose lease ended but whose key lives on stay
    /// until the next script settles them).
    pub fn view(&self, now: u64) -> Self {
        let mut view = self.clone();
        view.expire_keys(now);
        view
    }

    fn expire_keys(&mut self, now: u64) {
        if self.key_expiry().is_some_and(|at| now > at) {
            self.holds.clear();
        }
        self.waiting.expire(now);
        self.timeouts.expire(now);
        self.queue.expire(now);
        if self.handoff.as_ref().is_some_and(|(_, until)| now > *until) {
            self.handoff = None;
        }
    }

    /// Whether the lock's key exists (a live hold, a not yet settled one, or a foreign value).
    fn key_exists(&self) -> bool {
        self.foreign || !self.holds.is_empty()
    }

    /// Ends the holds whose lease ran out by `now` (see [`live`]), and the hold `gone`. Returns
    /// the latest expiry left (`None`: the lock is free) and the owner of `gone` when it was
    /// live.
    fn settle(&mut self, now: u64, gone: Option<&str>) -> (Option<u64>, Option<String>) {
        let released = gone
            .and_then(|marker| self.holds.get(marker))
            .filter(|hold| live(hold.expiry, now))
            .map(|hold| hold.owner.clone());
        self.holds
            .retain(|marker, hold| live(hold.expiry, now) && Some(marker.as_str()) != gone);
        (self.key_expiry(), released)
    }

    fn take(&mut self, now: Now, req: &Request) -> Acquired {
        let token = (self.kind == LockKind::Fenced).then(|| {
            let token = self.counter.unwrap_or(0).max(now.us) + 1;
            self.counter = Some(token);
            self.issued = self.issued.max(token);
            token
        });
        self.holds.insert(
            req.marker.clone(),
            Hold {
                owner: req.owner.clone(),
                expiry: now.ms + req.lease_ms,
                token,
            },
        );
        Acquired::Granted {
            count: self.count(&req.owner),
            token,
        }
    }

    /// A request re-sent after its first run took the hold: the same hold, counted once, its
    /// expiry never shortened.
    fn resent(&mut self, now: Now, req: &Request) -> Option<Acquired> {
        let hold = self.holds.get_mut(&req.marker)?;
        hold.expiry = hold.expiry.max(now.ms + req.lease_ms);
        let token = hold.token;
        Some(Acquired::Granted {
            count: self.count(&req.owner),
            token,
        })
    }

    /// Acquire: take one hold, or report the lock busy (and, when the caller will wait, enter
    /// or stay in the waiting set / queue).
    pub fn acquire(&mut self, now: Now, req: &Request) -> Result<Acquired, WrongType> {
        self.expire_keys(now.keys_ms.min(now.ms));
        if self.foreign {
            return Err(WrongType);
        }
        if self.kind == LockKind::Fair {
            return Ok(self.acquire_fair(now, req));
        }
        let (latest, _) = self.settle(now.ms, None);
        if let Some(granted) = self.resent(now, req) {
            return Ok(granted);
        }
        match latest {
            None => {
                if let Some(until) = self.reserved_for_another(now.ms, &req.owner) {
                    self.wait_turn(now, req, Some(until));
                    return Ok(Acquired::Reserved { until });
                }
                self.handoff = None;
                self.leave_waiting(&req.owner);
                Ok(self.take(now, req))
            }
            Some(_) if self.count(&req.owner) > 0 => Ok(self.take(now, req)),
            Some(latest) => Ok(self.wait_turn(now, req, Some(latest))),
        }
    }

    /// The end of a reservation of the free lock for another owner that still waits.
    fn reserved_for_another(&self, now: u64, owner: &str) -> Option<u64> {
        let (reserved, until) = self.handoff.as_ref()?;
        let waits = self
            .timeouts
            .items
            .get(reserved)
            .is_some_and(|deadline| *deadline > now);
        (reserved != owner && waits).then_some(*until)
    }

    fn leave_waiting(&mut self, owner: &str) {
        self.waiting.items.remove(owner);
        self.timeouts.items.remove(owner);
        self.tidy();
    }

    /// Redis deletes emptied collections.
    fn tidy(&mut self) {
        if self.waiting.items.is_empty() {
            self.waiting = Expiring::default();
        }
        if self.timeouts.items.is_empty() {
            self.timeouts = Expiring::default();
        }
        if self.queue.items.is_empty() {
            self.queue = Expiring::default();
        }
    }

    fn wait_turn(&mut self, now: Now, req: &Request, until: Option<u64>) -> Acquired {
        if req.keepalive_ms > 0 {
            self.waiting
                .items
                .entry(req.owner.clone())
                .or_insert(now.us);
            self.timeouts
                .items
                .insert(req.owner.clone(), now.ms + req.keepalive_ms);
            self.waiting.extend(now.ms, req.keepalive_ms);
            self.timeouts.extend(now.ms, req.keepalive_ms);
        }
        Acquired::Busy { until }
    }

    fn acquire_fair(&mut self, now: Now, req: &Request) -> Acquired {
        let (latest, _) = self.settle(now.ms, None);
        self.purge_heads(now.ms, Some(&req.waiter));
        if let Some(granted) = self.resent(now, req) {
            return granted;
        }
        if latest.is_some() && self.count(&req.owner) > 0 {
            let granted = self.take(now, req);
            if self.timeouts.items.remove(&req.waiter).is_some() {
                if let Some(at) = self.queue.items.iter().position(|w| *w == req.waiter) {
                    self.queue.items.remove(at);
                }
            }
            self.tidy();
            return granted;
        }
        let head = self.queue.items.first().cloned();
        if latest.is_none() && head.as_ref().is_none_or(|h| *h == req.waiter) {
            if head.is_some() {
                self.queue.items.remove(0);
                self.timeouts.items.remove(&req.waiter);
                self.tidy();
            }
            return self.take(now, req);
        }
        if req.keepalive_ms > 0 {
            if !self.timeouts.items.contains_key(&req.waiter) {
                self.queue.items.push(req.waiter.clone());
            }
            self.timeouts
                .items
                .insert(req.waiter.clone(), now.ms + req.keepalive_ms);
            self.queue.extend(now.ms, req.keepalive_ms);
            self.timeouts.extend(now.ms, req.keepalive_ms);
        }
        match (latest, head) {
            (Some(latest), _) => Acquired::Busy {
                until: Some(latest),
            },
            (None, head) => Acquired::Busy {
                until: head.and_then(|h| self.timeouts.items.get(&h).copied()),
            },
        }
    }

    /// Drops the fair queue's waiters at the head whose deadline passed (never `keep`, a waiter
    /// that is running a script and so is alive).
    fn purge_heads(&mut self, now: u64, keep: Option<&str>) {
        while let Some(head) = self.queue.items.first().cloned() {
            if Some(head.as_str()) == keep
                || self.timeouts.items.get(&head).is_some_and(|d| *d > now)
            {
                break;
            }
            self.queue.items.remove(0);
            self.timeouts.items.remove(&head);
        }
        self.tidy();
    }

    /// Release: give back the hold `marker`.
    pub fn release(&mut self, now: u64, marker: &str) -> Result<Released, WrongType> {
        self.expire_keys(now);
        if self.kind == LockKind::Fair {
            self.purge_heads(now, None);
        }
        if self.foreign {
            return Err(WrongType);
        }
        let (latest, owner) = self.settle(now, Some(marker));
        let Some(owner) = owner else {
            return Ok(Released::NotHeld);
        };
        if latest.is_some() {
            return Ok(Released::StillHeld(self.count(&owner)));
        }
        if self.kind != LockKind::Fair {
            self.announce_release(now);
        }
        Ok(Released::Freed)
    }

    /// The free lock is announced, unless nobody waits (the waiting set is absent): stale
    /// waiters are dropped, and the longest waiting owner leaves the set; the lock is reserved
    /// for it when a subscriber heard the message.
    fn announce_release(&mut self, now: u64) {
        if self.waiting.items.is_empty() {
            return;
        }
        let stale: Vec<String> = self
            .timeouts
            .items
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(owner, _)| owner.clone())
            .collect();
        for owner in &stale {
            self.leave_waiting(owner);
        }
        let first = self
            .waiting
            .items
            .iter()
            .min_by_key(|(owner, since)| (**since, (*owner).clone()))
            .map(|(owner, _)| owner.clone());
        if let Some(first) = first {
            self.waiting.items.remove(&first);
            self.tidy();
            if self.listeners {
                self.handoff = Some((first, now + HANDOFF_WINDOW_MS));
            }
        }
    }

    /// Renewal of one hold (the watchdog's batched renew: one call per hold of the batch, at one
    /// `now`): `true` when the hold is live, after extending it to `now + lease` (never
    /// shortening; `lease` 0 only checks). An ended hold is never revived.
    pub fn renew(&mut self, now: u64, marker: &str, lease_ms: u64) -> bool {
        self.expire_keys(now);
        if self.foreign {
            return false;
        }
        self.settle(now, None);
        match self.holds.get_mut(marker) {
            Some(hold) => {
                if lease_ms > 0 && hold.expiry < now + lease_ms {
                    hold.expiry = now + lease_ms;
                }
                true
            }
            None => false,
        }
    }

    /// A waiter that stopped waiting (`Lock`, `FencedLock`: an owner; `FairLock`: a waiter id)
    /// leaves; a reservation it had is handed on at once. `true` when it was waiting (or
    /// reserved for).
    pub fn cancel(&mut self, now: u64, waiter: &str) -> bool {
        self.expire_keys(now);
        if self.kind == LockKind::Fair {
            let removed = self.timeouts.items.remove(waiter).is_some();
            if removed {
                if let Some(at) = self.queue.items.iter().position(|w| w == waiter) {
                    self.queue.items.remove(at);
                }
            }
            self.purge_heads(now, None);
            return removed;
        }
        let mut removed = self.timeouts.items.remove(waiter).is_some();
        removed |= self.waiting.items.remove(waiter).is_some();
        self.tidy();
        if self
            .handoff
            .as_ref()
            .is_some_and(|(owner, _)| owner == waiter)
        {
            self.handoff = None;
            if !self.key_exists() {
                self.announce_release(now);
            }
            removed = true;
        }
        removed
    }

    /// Force-unlock: the lock is deleted whoever holds it (the fair queue and the fencing counter
    /// are kept). `true` when it was held. A value of another type at the key is deleted too:
    /// the documented contract does not say otherwise for this administrative operation (unlike
    /// acquire, which must leave a foreign value alone), and the scripts do so.
    pub fn force_unlock(&mut self, now: u64) -> bool {
        self.expire_keys(now);
        if self.kind == LockKind::Fair {
            self.purge_heads(now, None);
        }
        let existed = self.key_exists();
        self.holds.clear();
        self.foreign = false;
        existed
    }

    /// The summed live hold count of `owners` (`hold_count`, `is_held_by_current_task`).
    pub fn hold_count(&mut self, now: u64, owners: &[&str]) -> Result<u32, WrongType> {
        self.expire_keys(now);
        if !self.key_exists() {
            return Ok(0);
        }
        if self.foreign {
            return Err(WrongType);
        }
        self.settle(now, None);
        Ok(owners.iter().map(|o| self.count(o)).sum())
    }

    /// A value of another type is written over the lock's key (its holds are gone with it).
    pub fn put_foreign(&mut self) {
        self.holds.clear();
        self.foreign = true;
    }

    /// The object's keys are put back as they were in `snapshot` (a restart from an older
    /// snapshot, a failover to a lagging replica). The fencing counter goes back too; the tokens
    /// already issued do not, so every later token still exceeds them.
    pub fn restore(&mut self, snapshot: &HashLock) {
        let issued = self.issued;
        *self = snapshot.clone();
        self.issued = issued.max(snapshot.issued);
    }
}

/// An operation of a recorded client history on one reentrant lock (for [`LockSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LockOp {
    /// An acquire (any wait, any lease) by `owner`, whose hold (if granted) is `hold`: a guard's
    /// id, unique per acquisition.
    Acquire {
        /// The owner (scope) id.
        owner: String,
        /// The hold the acquisition creates.
        hold: String,
        /// The history shows the hold may have ended on its own: its guard reported it lost, or
        /// its release answered `NotHeld` or failed, or a fault hit it. A hold without this
        /// lived until its release (a watchdog hold, or a fixed lease longer than the hold).
        may_lapse: bool,
    },
    /// `guard.unlock()` of `hold`.
    Release {
        /// The hold given back.
        hold: String,
    },
    /// A renewal (or check) of `hold` by the watchdog.
    Renew {
        /// The hold renewed.
        hold: String,
    },
    /// The guard of `hold` reported itself lost (`is_lost()` / `lost()` resolved).
    Lost {
        /// The hold lost.
        hold: String,
    },
    /// `force_unlock()`.
    ForceUnlock,
}

/// The observed result of a [`LockOp`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockRet {
    /// Acquire: granted (with the fencing token of a fenced lock).
    Granted(Option<u64>),
    /// Acquire: not acquired within its wait (`Ok(None)`).
    TimedOut,
    /// Acquire: refused before anything was sent (invalid argument, shutdown).
    Refused,
    /// Release: `Ok(())`.
    Released,
    /// Release: `Err(NotHeld)`.
    NotHeld,
    /// Renew: the hold is live (and extended).
    Live,
    /// Renew: the hold is gone.
    Gone,
    /// Force-unlock: whether it was held.
    Unlocked(bool),
    /// The lost signal was seen.
    Signalled,
    /// Any operation: an error that leaves unknown whether it took effect (a dropped
    /// connection).
    Error,
}

/// The reentrant locks' contract without time, for checking concurrent client histories.
///
/// Leases are not visible in a history; what it shows is which holds may have lapsed
/// (`may_lapse`: reported lost, released with `NotHeld` or an error, hit by a fault). Every other
/// hold lived until its release: that is what makes the check tight (mutual exclusion as seen by
/// clients), and the search small.
/// - a grant to another owner (to anyone, for a non-reentrant lock) is a violation while a hold
///   of the others that cannot have lapsed is live; the others' holds that may have ended become
///   [`HoldState::Gone`], and their releases must answer `NotHeld` and their renewals `Gone`;
/// - a hold reported lost, or found gone by a renewal, is gone for good: a renewal never revives
///   it and its `unlock()` answers `NotHeld` every time;
/// - a release that answers `Ok` gives back a hold that was live until then;
/// - fencing tokens strictly increase in the order of the grants.
///
/// Timed-out acquires are always allowed (the lock may have been taken meanwhile, or reserved
/// for another waiter).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LockSpec {
    reentrant: bool,
    holds: BTreeMap<String, Seen<()>>,
    last_token: u64,
}

impl LockSpec {
    /// A free lock; `reentrant` is false for the spin lock (its owner's second acquire is just
    /// another contender).
    pub fn new(reentrant: bool) -> Self {
        Self {
            reentrant,
            holds: BTreeMap::new(),
            last_token: 0,
        }
    }

    /// The holds the history has not seen end, with what is known of them.
    pub fn holds(&self) -> impl Iterator<Item = (&str, HoldState)> {
        self.holds.iter().map(|(h, seen)| (h.as_str(), seen.state))
    }
}

impl Spec for LockSpec {
    type Op = LockOp;
    type Ret = LockRet;

    fn step(&self, op: &LockOp, ret: &LockRet) -> Option<Self> {
        let mut next = self.clone();
        match (op, ret) {
            (
                LockOp::Acquire {
                    owner,
                    hold,
                    may_lapse,
                },
                LockRet::Granted(token),
            ) => {
                if let Some(token) = token {
                    if *token <= next.last_token {
                        return None;
                    }
                    next.last_token = *token;
                }
                let reentrant = next.reentrant;
                for seen in next.holds.values_mut() {
                    if (!reentrant || seen.owner != *owner) && !seen.yield_to_grant() {
                        return None;
                    }
                }
                next.holds
                    .insert(hold.clone(), Seen::live(owner, (), *may_lapse));
            }
            (LockOp::Acquire { .. }, LockRet::TimedOut | LockRet::Refused) => {}
            (
                LockOp::Acquire {
                    owner,
                    hold,
                    may_lapse,
                },
                LockRet::Error,
            ) => {
                next.holds
                    .entry(hold.clone())
                    .or_insert(Seen::maybe(owner, (), *may_lapse));
            }
            (LockOp::Release { hold }, ret) => release_seen(&mut next.holds, hold, ret)?,
            (LockOp::Renew { hold }, LockRet::Error) => {
                if let Some(seen) = next.holds.get_mut(hold) {
                    seen.state = seen.state.max(HoldState::Maybe);
                }
            }
            (LockOp::Renew { hold }, LockRet::Live) => match next.holds.get_mut(hold) {
                Some(seen) if seen.state != HoldState::Gone => seen.state = HoldState::Live,
                _ => return None,
            },
            (LockOp::Renew { hold }, LockRet::Gone)
            | (LockOp::Lost { hold }, LockRet::Signalled) => {
                if let Some(seen) = next.holds.get_mut(hold) {
                    seen.state = HoldState::Gone;
                }
            }
            (LockOp::ForceUnlock, LockRet::Unlocked(_)) => {
                for seen in next.holds.values_mut() {
                    seen.state = HoldState::Gone;
                }
            }
            (LockOp::ForceUnlock, LockRet::Error) => {
                for seen in next.holds.values_mut() {
                    if seen.state == HoldState::Live {
                        seen.state = HoldState::Maybe;
                    }
                }
            }
            _ => return None,
        }
        Some(next)
    }
}

/// Whether a hold that expires at `expiry` is live at `now` (server ms), as the scripts judge it
/// (`hold_lib.lua`'s `live`): a hold in its last millisecond counts as ended, since Redis may
/// expire its key on a clock that has passed the millisecond boundary `now` has not.
pub fn live(expiry: u64, now: u64) -> bool {
    expiry > now + 1
}

/// The owners that hold `lock` (live holds at `now`), for invariant checks.
pub fn holders(lock: &HashLock, now: u64) -> BTreeSet<String> {
    lock.holds
        .values()
        .filter(|h| live(h.expiry, now))
        .map(|h| h.owner.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(owner: &str, marker: &str, lease_ms: u64, keepalive_ms: u64) -> Request {
        Request {
            owner: owner.to_owned(),
            marker: marker.to_owned(),
            lease_ms,
            keepalive_ms,
            waiter: format!("w{marker}"),
        }
    }

    fn at(ms: u64) -> Now {
        Now::from_us(ms * 1000)
    }

    fn granted(count: u32) -> Result<Acquired, WrongType> {
        Ok(Acquired::Granted { count, token: None })
    }

    #[test]
    fn every_hold_has_its_own_lease() {
        let mut lock = HashLock::new(LockKind::Lock, false);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 30_000, 0)), granted(1));
        assert_eq!(lock.acquire(at(1), &req("o1", "#2", 1_000, 0)), granted(2));
        // The outer hold is released first; the 1 s re-entry ends after its second.
        assert_eq!(lock.release(2, "#1"), Ok(Released::StillHeld(1)));
        assert_eq!(lock.key_expiry(), Some(1_001));
        assert_eq!(
            lock.acquire(at(500), &req("o2", "#3", 100, 0)),
            Ok(Acquired::Busy { until: Some(1_001) })
        );
        assert_eq!(lock.view(1_002).holds.len(), 0);
        assert_eq!(lock.release(1_002, "#2"), Ok(Released::NotHeld));
        // Renewal never revives an ended hold.
        assert_eq!(
            lock.acquire(at(2_000), &req("o2", "#4", 100, 0)),
            granted(1)
        );
        assert!(!lock.renew(2_100, "#4", 1_000));
        assert_eq!(
            lock.acquire(at(2_100), &req("o3", "#5", 100, 0)),
            granted(1)
        );
    }

    #[test]
    fn a_resent_request_counts_once_and_never_shortens() {
        let mut lock = HashLock::new(LockKind::Lock, false);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 1_000, 0)), granted(1));
        assert_eq!(lock.acquire(at(10), &req("o1", "#1", 100, 0)), granted(1));
        assert_eq!(lock.holds["#1"].expiry, 1_000);
        assert!(lock.renew(20, "#1", 0));
        assert!(lock.renew(20, "#1", 5_000));
        assert_eq!(lock.holds["#1"].expiry, 5_020);
    }

    #[test]
    fn fencing_tokens_never_repeat_after_a_restore() {
        let mut lock = HashLock::new(LockKind::Fenced, false);
        let snapshot = lock.clone();
        let token = |r: Result<Acquired, WrongType>| match r {
            Ok(Acquired::Granted { token, .. }) => token.unwrap_or(0),
            other => panic!("not granted: {other:?}"),
        };
        let t1 = token(lock.acquire(Now::from_us(5), &req("o1", "#1", 100, 0)));
        let t2 = token(lock.acquire(Now::from_us(6), &req("o1", "#2", 100, 0)));
        assert_eq!((t1, t2), (6, 7));
        assert!(lock.force_unlock(1));
        lock.restore(&snapshot);
        let t3 = token(lock.acquire(Now::from_us(7), &req("o2", "#3", 100, 0)));
        assert!(t3 > t2 && lock.issued == t3, "{t3}");
    }

    #[test]
    fn a_release_reserves_for_the_longest_waiter_who_hands_it_on() {
        let mut lock = HashLock::new(LockKind::Lock, true);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 1_000, 0)), granted(1));
        let busy = Ok(Acquired::Busy { until: Some(1_000) });
        assert_eq!(lock.acquire(at(1), &req("o2", "#2", 100, 5_000)), busy);
        assert_eq!(lock.acquire(at(2), &req("o3", "#3", 100, 5_000)), busy);
        // A zero-wait try never joins.
        assert_eq!(lock.acquire(at(3), &req("o4", "#4", 100, 0)), busy);
        assert_eq!(lock.release(4, "#1"), Ok(Released::Freed));
        assert_eq!(lock.handoff, Some(("o2".to_owned(), 14)));
        // Nobody else gets it during the window...
        assert_eq!(
            lock.acquire(at(5), &req("o4", "#5", 100, 0)),
            Ok(Acquired::Reserved { until: 14 })
        );
        // ...until the reserved waiter gives up and hands it to the next one.
        assert!(lock.cancel(6, "o2"));
        assert_eq!(lock.handoff, Some(("o3".to_owned(), 16)));
        assert!(lock.cancel(7, "o3"));
        assert_eq!(lock.handoff, None);
        assert_eq!(lock.acquire(at(8), &req("o4", "#6", 100, 0)), granted(1));
        assert!(lock.waiting.items.is_empty() && lock.timeouts.items.is_empty());
    }

    #[test]
    fn the_fair_queue_serves_in_order() {
        let mut lock = HashLock::new(LockKind::Fair, true);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 100, 0)), granted(1));
        let mut w2 = req("o2", "#2", 100, 50);
        let mut w3 = req("o3", "#3", 100, 500);
        assert!(matches!(
            lock.acquire(at(1), &w2),
            Ok(Acquired::Busy { .. })
        ));
        assert!(matches!(
            lock.acquire(at(2), &w3),
            Ok(Acquired::Busy { .. })
        ));
        // Re-entry past the queue.
        assert_eq!(lock.acquire(at(3), &req("o1", "#4", 100, 0)), granted(2));
        assert_eq!(lock.release(4, "#1"), Ok(Released::StillHeld(1)));
        assert_eq!(lock.release(5, "#4"), Ok(Released::Freed));
        // Free, but o2 is first in line: o3 waits, a zero-wait try too.
        w3.marker = "#5".to_owned();
        assert_eq!(
            lock.acquire(at(6), &w3),
            Ok(Acquired::Busy { until: Some(51) })
        );
        // o2's deadline passes: it is dropped, o3 is served.
        w3.marker = "#6".to_owned();
        assert_eq!(lock.acquire(at(60), &w3), granted(1));
        w2.marker = "#7".to_owned();
        assert!(matches!(
            lock.acquire(at(61), &w2),
            Ok(Acquired::Busy { .. })
        ));
        assert_eq!(lock.queue.items, vec!["w#2".to_owned()]);
        assert!(lock.cancel(62, "w#2"));
        assert!(lock.queue.items.is_empty());
    }

    #[test]
    fn a_foreign_value_is_reported_and_left_alone() {
        let mut lock = HashLock::new(LockKind::Lock, false);
        lock.put_foreign();
        assert_eq!(
            lock.acquire(at(0), &req("o1", "#1", 100, 0)),
            Err(WrongType)
        );
        assert_eq!(lock.release(0, "#1"), Err(WrongType));
        assert!(!lock.renew(0, "#1", 100));
        assert!(lock.foreign);
    }

    #[test]
    fn spec_mutual_exclusion_lost_and_tokens() {
        let acquire = |owner: &str, hold: &str, may_lapse: bool| LockOp::Acquire {
            owner: owner.to_owned(),
            hold: hold.to_owned(),
            may_lapse,
        };
        let release = |hold: &str| LockOp::Release {
            hold: hold.to_owned(),
        };
        let spec = LockSpec::new(true);
        let s = spec
            .step(&acquire("a", "h1", true), &LockRet::Granted(Some(5)))
            .unwrap();
        // Re-entry keeps the first hold live; another owner's grant means it had lapsed.
        let s = s
            .step(&acquire("a", "h2", true), &LockRet::Granted(Some(6)))
            .unwrap();
        assert!(s
            .step(&acquire("b", "h3", false), &LockRet::Granted(Some(6)))
            .is_none());
        let s = s
            .step(&acquire("b", "h3", false), &LockRet::Granted(Some(7)))
            .unwrap();
        assert!(s.step(&release("h1"), &LockRet::Released).is_none());
        let s = s.step(&release("h1"), &LockRet::NotHeld).unwrap();
        // A hold that cannot have lapsed (no lost signal, released with Ok) excludes every
        // other owner until its release.
        assert!(s
            .step(&acquire("c", "h4", false), &LockRet::Granted(Some(8)))
            .is_none());
        // A lost hold answers NotHeld; a renewal never revives it.
        let lost = LockOp::Lost {
            hold: "h3".to_owned(),
        };
        let s = s.step(&lost, &LockRet::Signalled).unwrap();
        let renew = LockOp::Renew {
            hold: "h3".to_owned(),
        };
        assert!(s.step(&renew, &LockRet::Live).is_none());
        assert!(s.step(&release("h3"), &LockRet::Released).is_none());
        // A non-reentrant lock: the owner's second grant means the first had lapsed, and so it
        // must have been one that could.
        let spin = LockSpec::new(false);
        let s = spin
            .step(&acquire("a", "h1", false), &LockRet::Granted(None))
            .unwrap();
        assert!(s
            .step(&acquire("a", "h2", false), &LockRet::Granted(None))
            .is_none());
        let s = spin
            .step(&acquire("a", "h1", true), &LockRet::Granted(None))
            .unwrap();
        let s = s
            .step(&acquire("a", "h2", false), &LockRet::Granted(None))
            .unwrap();
        assert!(s.step(&release("h1"), &LockRet::Released).is_none());
    }
}
