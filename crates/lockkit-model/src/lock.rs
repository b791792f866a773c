//! The reentrant hash locks: [`Lock`](LockKind::Lock), [`FencedLock`](LockKind::Fenced) and
//! [`FairLock`](LockKind::Fair), as one model ([`HashLock`]) with a kind.
//!
//! The contract encoded here, from `docs/design.md` ("The lock's data", "Script contracts",
//! "The lock family", "Direct grant (issue 20)") and `docs/guide.md` ("Lock", "FencedLock",
//! "FairLock"):
//!
//! - *"A HASH per lock; every hold in it has a lease of its own."* An owner's count is the number
//!   of its holds; *"a hold is live while its expiry is in the future"*; *"every script that reads
//!   the hash first ends the holds whose lease ran out"*; *"the key exists exactly while some hold
//!   is live"* (it expires with the latest hold).
//! - *"an acquire that fred re-sends after a dropped connection finds its marker and does not
//!   count again"*; *"a release names the exact hold it gives back"*; *"renewal neither revives
//!   it nor moves any other hold's expiry"*; *"a hold's own expiry is never shortened by a
//!   re-sent acquire or a renewal"*.
//! - Fencing: *"every acquire mints `max(counter, TIME in µs) + 1"*, *"every mint sets the
//!   counter to expire once the server clock has passed the new token by the counter TTL"*
//!   ([`HashLock::counter_expiry`], [`COUNTER_TTL_MS`]), *"`force_unlock` keeps the counter"*, and tokens never repeat even after the object's keys
//!   are restored from an older snapshot ([`HashLock::restore`] keeps the highest token issued).
//!   A grant *"mints its fencing token"* as an acquire does, and a grant that is undone leaves
//!   the counter where the mint left it.
//! - The `Lock`'s and `FencedLock`'s waiting set and direct grant (design, "Direct grant (issue
//!   20)" and the lock family table; guide, "Handoff under contention: the lock is granted"):
//!   - an entry is a *request*, *"one waiting acquire call, `<marker> <lease ms> <owner>
//!     <client's channel>` (lease 0: a multi-lock member that only looks)"*
//!     ([`Request::entry`]); the marker is the same for every try of the call. A busy try that
//!     will wait joins (keeping the place of the call's first busy try) and pushes its keep-alive
//!     deadline; its entry is dropped once that passes (*"entries past it dropped before a release
//!     chooses whom to grant"*). *"A wait that runs out makes its last try with keep-alive 0,
//!     which takes its request out of the line in the same script when refused"* (so does any
//!     refused try with keep-alive 0);
//!   - a release that frees the lock *"makes the longest-waiting one the holder in the same
//!     script"* ([`HashLock::hand_over`]), with a hold that *"expires after `min(lease,
//!     GRANT_PROBATION)`"* ([`PROBATION_MS`]), and *"publishes one message on that call's
//!     client's own channel"* (`g:<count>:<token or 0>:<now>:<expiry>:<marker>`); a grant that
//!     reached no subscriber *"is undone in the same script and the next call in line gets
//!     it"*; *"a multi-lock member that only looks is reserved the free lock for the 10 ms
//!     handoff window instead (`p:<marker>`, on its client's channel)"* ([`HANDOFF_WINDOW_MS`]),
//!     and only its owner may take the lock meanwhile; with nobody left the lock stays free;
//!   - *"a retry with the call's marker finds the granted hold and reports it"* (counted once,
//!     out of the waiting set);
//!   - *"a free lock with calls waiting (the holder's lease ran out, so no release handed it on):
//!     the next acquire that finds it grants it to the head of the line and waits itself, unless
//!     it is the head"* (or the lock is reserved for its own owner). The handover stops at a
//!     request of the caller's owner (past unheard requests ahead of it): the caller then takes
//!     the lock itself, as the scripts do. A re-entry does not leave the waiting set; *"the next
//!     cancel that finds it (not reserved for anyone) hands it on too"* (issue 27: a multi-lock
//!     member passes on a reservation that lapsed unused);
//!   - a waiter that gives up: *"its cancel (`lock_cancel`, …) finds its marker's hold and gives
//!     it back, and the lock goes on"*; a reservation for its owner ends too. A force-unlock of a
//!     held lock ends a reservation and hands the lock over.
//!   - a granted hold's confirmation (the renew script's `@<server ms>` form,
//!     [`HashLock::renew_until`]) extends it to *"grant + lease, not confirmation + lease"*.
//! - The `FairLock` queue (guide, "How the order is kept"): granted only to the head of the queue
//!   or to anyone while it is empty, re-entry past the queue, a zero-wait try never queues (and
//!   a queued waiter's try with keep-alive 0, the last of a wait that ran out, leaves the queue),
//!   waiters at the head whose deadline passed are dropped first, a waiter that gives up leaves.
//!   Its wake-up messages are not modelled (they change nothing in Redis).
//! - A key of another type: *"a wrong-typed key makes the acquire fail with `WRONGTYPE` … without
//!   touching the foreign value, while the batched renewal treats a wrong-typed key as gone"*.
//!
//! Time is logical: every operation takes the server's clock ([`Now`]), and leases, deadlines and
//! the handoff window are absolute server milliseconds. Keys that Redis expires on its own (the
//! hash, the waiting sets, the queue, the reservation) vanish in the model at the same instants,
//! so the model's state can be compared with what Redis holds at any moment ([`HashLock::view`]).
//! Which channels have a subscriber is part of the model's state ([`HashLock::listen`]): it
//! decides whether a grant stands. The messages a `Lock` or `FencedLock` publishes are kept for
//! the caller to compare with what the subscribers got ([`HashLock::take_messages`]).
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

    /// The instant `ms` milliseconds after the epoch (both clocks at it).
    pub fn from_ms(ms: u64) -> Self {
        Self::from_us(ms * 1000)
    }
}

/// The handoff window of the `Lock` and `FencedLock` (`lockkit_protocol::lock::HANDOFF_WINDOW`):
/// how long a handoff reserves the free lock for a looker (a multi-lock member that only looks).
pub const HANDOFF_WINDOW_MS: u64 = 10;

/// The probation of a grant: a hold granted to a waiter lasts at most this long (its lease, if
/// shorter) until the waiter's client claims and confirms it.
pub const PROBATION_MS: u64 = 5_000;

/// The default TTL of a fenced lock's token counter in ms
/// (`lockkit_protocol::fenced_lock::DEFAULT_COUNTER_TTL`): each mint sets the counter to expire
/// at `token / 1000 + 1 + TTL` (server ms).
pub const COUNTER_TTL_MS: u64 = 86_400_000;

/// Which of the reentrant hash locks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LockKind {
    /// The reentrant lock, with its waiting set and handoff by direct grant.
    Lock,
    /// The reentrant lock whose acquisitions (and grants) carry fencing tokens.
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

/// One acquire request (one try of an acquire call), as the runtime sends it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// The owner id (`<client id>:<sequence>`, or the holder's scope; no spaces).
    pub owner: String,
    /// The hold marker (`#<client id>:<sequence>`), the same for every try of one acquire call.
    pub marker: String,
    /// The lease in ms (> 0).
    pub lease_ms: u64,
    /// The waiter's keep-alive in ms; 0 = try once, never wait (and never join the waiting set or
    /// the queue; a refused `Lock`/`FencedLock` try with 0 takes its request out of the waiting
    /// set: the last try of a wait that ran out).
    pub keepalive_ms: u64,
    /// The fair lock's waiter id (`<client id>:w<sequence>`, one per acquire call); ignored by
    /// the other kinds.
    pub waiter: String,
    /// `Lock`/`FencedLock`: the waiting client's own channel for this object
    /// (`<object channel>:<client id>`), where a grant for this call is published. May contain
    /// spaces.
    pub channel: String,
    /// `Lock` only (a fenced lock's waiters never only look): only look (a multi-lock member):
    /// where the lock would be taken, answer [`Acquired::Available`] and take nothing; a handoff
    /// to this call reserves the lock for its owner instead of granting it.
    pub look: bool,
}

impl Request {
    /// The call's entry in the waiting set of a `Lock` or `FencedLock`:
    /// `<marker> <lease_ms> <owner> <channel>`, the lease `0` for a looker.
    pub fn entry(&self) -> String {
        let lease = if self.look { 0 } else { self.lease_ms };
        Entry::format(&self.marker, lease, &self.owner, &self.channel)
    }

    /// Both forms of the call's entry (a taker's and a looker's): a call leaves the waiting set
    /// in both.
    fn entries(&self) -> [String; 2] {
        [
            Entry::format(&self.marker, self.lease_ms, &self.owner, &self.channel),
            Entry::format(&self.marker, 0, &self.owner, &self.channel),
        ]
    }
}

/// A waiting entry of a `Lock` or `FencedLock`, read back from its member string.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Entry {
    /// The call's hold marker.
    pub marker: String,
    /// The lease the call asked for; 0 for a looker.
    pub lease_ms: u64,
    /// The owner id.
    pub owner: String,
    /// The waiting client's channel (the rest of the member: it may contain spaces).
    pub channel: String,
}

impl Entry {
    /// The member string of an entry.
    pub fn format(marker: &str, lease_ms: u64, owner: &str, channel: &str) -> String {
        format!("{marker} {lease_ms} {owner} {channel}")
    }

    /// Reads a member string back; `None` when it is not `<marker> <lease> <owner> <channel>`.
    pub fn parse(member: &str) -> Option<Self> {
        let mut parts = member.splitn(4, ' ');
        let marker = parts.next()?;
        let lease = parts.next()?;
        let owner = parts.next()?;
        let channel = parts.next()?;
        if lease.is_empty() || !lease.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self {
            marker: marker.to_owned(),
            lease_ms: lease.parse().ok()?,
            owner: owner.to_owned(),
            channel: channel.to_owned(),
        })
    }
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
    /// a message: the holder's latest expiry, or the deadline of the fair queue's head. (The
    /// `Lock`'s and `FencedLock`'s reply also carries the server's clock: `{0, until - now,
    /// now}`.)
    Busy {
        /// Absolute server ms (`None`: never, a key without expiry).
        until: Option<u64>,
    },
    /// Not taken: the lock is free, but reserved for another waiter (a looker) until `until`.
    Reserved {
        /// Absolute server ms: the end of the handoff window.
        until: u64,
    },
    /// Only looking (`Lock`/`FencedLock`): the lock would have been taken; nothing was.
    Available,
}

/// What a release answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Released {
    /// The last hold was given back: the lock is free (or handed over to a waiter).
    Freed,
    /// Given back; the owner still holds it this many times.
    StillHeld(u32),
    /// The hold was not there: its lease ended, it was force-unlocked or released already.
    NotHeld,
}

/// An operation refused by Redis: a key of another type is at the lock's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WrongType;

/// One message a `Lock` or `FencedLock` script published.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Message {
    /// The channel it was published on.
    pub channel: String,
    /// `g:<count>:<token or 0>:<now>:<expiry>:<marker>` (a grant) or `p:<marker>` (a looker told
    /// of its reservation).
    pub payload: String,
    /// Whether a subscriber got it (someone listened on the channel).
    pub heard: bool,
}

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
    /// The channels some client is subscribed to: a grant (or a looker's notice) published on
    /// one of them is heard, one published elsewhere is not (and so is undone). Not part of the
    /// object's keys: a restore keeps it.
    pub listening: BTreeSet<String>,
    /// The messages published since [`HashLock::take_messages`] last took them (`Lock` and
    /// `FencedLock`).
    pub messages: Vec<Message>,
    /// A value of another type sits at the lock's key.
    pub foreign: bool,
    /// The hash: marker → hold. Holds whose lease ended stay until a script settles them.
    pub holds: BTreeMap<String, Hold>,
    /// `Lock`/`FencedLock`: entry ([`Request::entry`]) → when its call first found the lock taken
    /// (server µs).
    pub waiting: Expiring<BTreeMap<String, u64>>,
    /// Keep-alive deadlines (server ms): of the waiting entries, or of the fair queue's waiters.
    pub timeouts: Expiring<BTreeMap<String, u64>>,
    /// `Lock`/`FencedLock`: the owner a handoff reserved the free lock for (a looker's), and
    /// until when.
    pub handoff: Option<(String, u64)>,
    /// `FairLock`: the queue of waiter ids, head first.
    pub queue: Expiring<Vec<String>>,
    /// `FencedLock`: the token counter (`None` while never minted, or expired).
    pub counter: Option<u64>,
    /// `FencedLock`: when Redis deletes the counter (server ms): `token / 1000 + 1 +
    /// counter_ttl_ms` for the last token minted.
    pub counter_expiry: Option<u64>,
    /// `FencedLock`: the counter TTL the scripts are given ([`COUNTER_TTL_MS`] unless set).
    pub counter_ttl_ms: u64,
    /// `FencedLock`: the greatest token ever minted. Not part of Redis' state, so a restore of
    /// older keys does not roll it back: every later token must exceed it.
    pub issued: u64,
}

impl HashLock {
    /// A free lock of `kind`, with no channel listened to.
    pub fn new(kind: LockKind) -> Self {
        Self {
            kind,
            listening: BTreeSet::new(),
            messages: Vec::new(),
            foreign: false,
            holds: BTreeMap::new(),
            waiting: Expiring::default(),
            timeouts: Expiring::default(),
            handoff: None,
            queue: Expiring::default(),
            counter: None,
            counter_expiry: None,
            counter_ttl_ms: COUNTER_TTL_MS,
            issued: 0,
        }
    }

    /// The kind.
    pub fn kind(&self) -> LockKind {
        self.kind
    }

    /// A client subscribes to `channel` (`on`) or unsubscribes from it.
    pub fn listen(&mut self, channel: &str, on: bool) {
        if on {
            self.listening.insert(channel.to_owned());
        } else {
            self.listening.remove(channel);
        }
    }

    /// The messages published since the last call, in order.
    pub fn take_messages(&mut self) -> Vec<Message> {
        std::mem::take(&mut self.messages)
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

    /// The waiting entries of a `Lock` or `FencedLock`, longest waiting first (by when they
    /// joined, then by member, as Redis orders a ZSET).
    pub fn waiting_order(&self) -> Vec<String> {
        let mut order: Vec<(u64, &String)> = self
            .waiting
            .items
            .iter()
            .map(|(member, since)| (*since, member))
            .collect();
        order.sort();
        order.into_iter().map(|(_, m)| m.clone()).collect()
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
        if self.counter_expiry.is_some_and(|at| now > at) {
            self.counter = None;
            self.counter_expiry = None;
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

    /// A fenced lock's next token: `max(counter, TIME in µs) + 1`; `None` for the other kinds.
    fn mint(&mut self, now: Now) -> Option<u64> {
        (self.kind == LockKind::Fenced).then(|| {
            let token = self.counter.unwrap_or(0).max(now.us) + 1;
            self.counter = Some(token);
            self.counter_expiry = Some(token / 1000 + 1 + self.counter_ttl_ms);
            self.issued = self.issued.max(token);
            token
        })
    }

    /// Records the hold `marker` of `owner` until `expiry` (minting its token); the owner's
    /// count and the token.
    fn hold(&mut self, now: Now, owner: &str, marker: &str, expiry: u64) -> (u32, Option<u64>) {
        let token = self.mint(now);
        self.holds.insert(
            marker.to_owned(),
            Hold {
                owner: owner.to_owned(),
                expiry,
                token,
            },
        );
        (self.count(owner), token)
    }

    fn take(&mut self, now: Now, req: &Request) -> Acquired {
        let (count, token) = self.hold(now, &req.owner, &req.marker, now.ms + req.lease_ms);
        Acquired::Granted { count, token }
    }

    /// A request whose marker has a live hold (a re-sent try whose first run took it, or a grant
    /// not claimed yet): the same hold, counted once, its expiry never shortened.
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
        if !req.look {
            if let Some(granted) = self.resent(now, req) {
                self.leave_waiting(req);
                return Ok(granted);
            }
        }
        if let Some(latest) = latest {
            if self.count(&req.owner) > 0 {
                // A re-entry; a request of this call in the line leaves it (a later release
                // must not grant the lock to a call that has returned).
                return Ok(if req.look {
                    Acquired::Available
                } else {
                    self.leave_waiting(req);
                    self.take(now, req)
                });
            }
            return Ok(self.wait_turn(
                now,
                req,
                Acquired::Busy {
                    until: Some(latest),
                },
            ));
        }
        // Free. A handoff may have reserved it for a looker: for another owner, the caller
        // waits; for the caller's owner, it is the caller's (a look keeps the reservation).
        let ours = match self.handoff.clone() {
            Some((reserved, until)) if reserved != req.owner => {
                return Ok(self.wait_turn(now, req, Acquired::Reserved { until }));
            }
            Some(_) if req.look => return Ok(Acquired::Available),
            Some(_) => {
                self.handoff = None;
                true
            }
            None => false,
        };
        // Else, when another owner's request is at the head, it is handed the lock first.
        let head = if ours {
            None
        } else {
            self.prune(now.ms);
            self.waiting_order().into_iter().next()
        };
        if head
            .and_then(|member| Entry::parse(&member))
            .is_some_and(|head| head.owner != req.owner)
        {
            self.hand_over(now, Some(&req.owner));
            if let Some(latest) = self.key_expiry() {
                return Ok(self.wait_turn(
                    now,
                    req,
                    Acquired::Busy {
                        until: Some(latest),
                    },
                ));
            }
            if let Some((_, until)) = self.handoff {
                return Ok(self.wait_turn(now, req, Acquired::Reserved { until }));
            }
        }
        if req.look {
            return Ok(Acquired::Available);
        }
        self.leave_waiting(req);
        Ok(self.take(now, req))
    }

    /// The call of `req` leaves the waiting set (both forms of its entry).
    fn leave_waiting(&mut self, req: &Request) {
        for entry in req.entries() {
            self.waiting.items.remove(&entry);
            self.timeouts.items.remove(&entry);
        }
        self.tidy();
    }

    /// Drops the waiting entries whose keep-alive deadline passed by `now` (nothing while the
    /// waiting set is absent).
    fn prune(&mut self, now: u64) {
        if self.waiting.items.is_empty() {
            return;
        }
        let stale: Vec<String> = self
            .timeouts
            .items
            .iter()
            .filter(|(_, deadline)| **deadline <= now)
            .map(|(member, _)| member.clone())
            .collect();
        for member in &stale {
            self.waiting.items.remove(member);
            self.timeouts.items.remove(member);
        }
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

    /// Answers `reply` (busy or reserved); first, if the caller will wait, its call joins the
    /// waiting set (keeping an earlier place) and its deadline moves to now + keep-alive; a
    /// caller that will not (keep-alive 0: a single try, or the last try of a wait that ran out)
    /// takes this form of its request out instead, so no release grants a call that returned.
    fn wait_turn(&mut self, now: Now, req: &Request, reply: Acquired) -> Acquired {
        let entry = req.entry();
        if req.keepalive_ms > 0 {
            self.waiting.items.entry(entry.clone()).or_insert(now.us);
            self.timeouts.items.insert(entry, now.ms + req.keepalive_ms);
            self.waiting.extend(now.ms, req.keepalive_ms);
            self.timeouts.extend(now.ms, req.keepalive_ms);
        } else if !self.waiting.items.is_empty() {
            self.waiting.items.remove(&entry);
            self.timeouts.items.remove(&entry);
            self.tidy();
        }
        reply
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

    /// The free `Lock` or `FencedLock` is handed over (issue 20's `hand_over`): stale entries are
    /// dropped; then the longest waiting entry leaves the set and, if a taker, is granted the lock
    /// for `min(lease, PROBATION_MS)` and told on its channel (`g:…`), or, if a looker, told
    /// (`p:<marker>`) and the lock reserved for its owner for the handoff window. When nobody
    /// heard the message, a grant is undone (its minted token stays spent) and the next entry is
    /// tried; when the set runs empty the lock stays free. At most one message is heard.
    /// `caller`: the owner of an acquire that hands over; the handover stops (the lock free) at a
    /// request of that owner's, which the caller then takes itself.
    pub fn hand_over(&mut self, now: Now, caller: Option<&str>) {
        self.prune(now.ms);
        while let Some(member) = self.waiting_order().into_iter().next() {
            let entry = Entry::parse(&member);
            if entry
                .as_ref()
                .is_some_and(|entry| Some(entry.owner.as_str()) == caller)
            {
                break;
            }
            self.waiting.items.remove(&member);
            self.timeouts.items.remove(&member);
            let Some(entry) = entry else {
                continue;
            };
            if entry.lease_ms == 0 {
                if self.publish(&entry.channel, format!("p:{}", entry.marker)) {
                    self.handoff = Some((entry.owner, now.ms + HANDOFF_WINDOW_MS));
                    break;
                }
                continue;
            }
            let expiry = now.ms + entry.lease_ms.min(PROBATION_MS);
            let (count, token) = self.hold(now, &entry.owner, &entry.marker, expiry);
            let payload = format!(
                "g:{count}:{}:{}:{expiry}:{}",
                token.unwrap_or(0),
                now.ms,
                entry.marker
            );
            if self.publish(&entry.channel, payload) {
                break;
            }
            self.settle(now.ms, Some(&entry.marker));
        }
        self.tidy();
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
        } else if self.timeouts.items.remove(&req.waiter).is_some() {
            // A try that will not wait (the last of a wait that ran out) leaves the queue.
            if let Some(at) = self.queue.items.iter().position(|w| *w == req.waiter) {
                self.queue.items.remove(at);
            }
            self.tidy();
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

    /// Release: give back the hold `marker`; when that frees a `Lock` or `FencedLock`, it is
    /// handed over ([`HashLock::hand_over`]).
    pub fn release(&mut self, now: Now, marker: &str) -> Result<Released, WrongType> {
        self.expire_keys(now.keys_ms.min(now.ms));
        if self.kind == LockKind::Fair {
            self.purge_heads(now.ms, None);
        }
        if self.foreign {
            return Err(WrongType);
        }
        let (latest, owner) = self.settle(now.ms, Some(marker));
        let Some(owner) = owner else {
            return Ok(Released::NotHeld);
        };
        if latest.is_some() {
            return Ok(Released::StillHeld(self.count(&owner)));
        }
        if self.kind != LockKind::Fair {
            self.hand_over(now, None);
        }
        Ok(Released::Freed)
    }

    /// Renewal of one hold (the watchdog's batched renew: one call per hold of the batch, at one
    /// `now`): `true` when the hold is live, after extending it to `now + lease` (never
    /// shortening; `lease` 0 only checks). An ended hold is never revived.
    pub fn renew(&mut self, now: u64, marker: &str, lease_ms: u64) -> bool {
        self.renew_to(now, marker, (lease_ms > 0).then(|| now + lease_ms))
    }

    /// The confirmation of a granted hold (the renew script's `@<until>` form): as
    /// [`renew`](HashLock::renew), extending the hold to the instant `until_ms` itself (its
    /// grant's time + its lease: a lease counted from the grant, not from the confirmation).
    pub fn renew_until(&mut self, now: u64, marker: &str, until_ms: u64) -> bool {
        self.renew_to(now, marker, Some(until_ms))
    }

    fn renew_to(&mut self, now: u64, marker: &str, target: Option<u64>) -> bool {
        self.expire_keys(now);
        if self.foreign {
            return false;
        }
        self.settle(now, None);
        match self.holds.get_mut(marker) {
            Some(hold) => {
                if let Some(target) = target {
                    hold.expiry = hold.expiry.max(target);
                }
                true
            }
            None => false,
        }
    }

    /// A waiter that stopped waiting leaves. `FairLock`: `waiter` is its waiter id. `Lock`,
    /// `FencedLock`: `waiter` is its call's entry ([`Request::entry`]); the entry leaves the
    /// waiting set, a grant to the call that it did not claim (a live hold of its marker) is
    /// given back, a reservation for its owner ends, and the lock, if that freed it, is handed
    /// over; so is a free lock reserved for nobody (a reservation that lapsed unused: a
    /// multi-lock member passes it on this way). `true` when anything was removed or given back.
    pub fn cancel(&mut self, now: Now, waiter: &str) -> Result<bool, WrongType> {
        self.expire_keys(now.keys_ms.min(now.ms));
        if self.kind == LockKind::Fair {
            let removed = self.timeouts.items.remove(waiter).is_some();
            if removed {
                if let Some(at) = self.queue.items.iter().position(|w| w == waiter) {
                    self.queue.items.remove(at);
                }
            }
            self.purge_heads(now.ms, None);
            return Ok(removed);
        }
        let mut removed = self.timeouts.items.remove(waiter).is_some();
        removed |= self.waiting.items.remove(waiter).is_some();
        self.tidy();
        let Some(entry) = Entry::parse(waiter) else {
            return Ok(removed);
        };
        if self.foreign {
            return Err(WrongType);
        }
        if self
            .holds
            .get(&entry.marker)
            .is_some_and(|hold| live(hold.expiry, now.ms))
        {
            removed = true;
            if self.settle(now.ms, Some(&entry.marker)).0.is_none() {
                self.hand_over(now, None);
            }
        }
        if self
            .handoff
            .as_ref()
            .is_some_and(|(owner, _)| *owner == entry.owner)
        {
            self.handoff = None;
            removed = true;
        }
        if !self.key_exists() && self.handoff.is_none() {
            self.hand_over(now, None);
        }
        Ok(removed)
    }

    /// Force-unlock: the lock is deleted whoever holds it (the fair queue and the fencing counter
    /// are kept). `true` when it was held. A value of another type at the key is deleted too:
    /// the documented contract does not say otherwise for this administrative operation (unlike
    /// acquire, which must leave a foreign value alone), and the scripts do so. A `Lock` or
    /// `FencedLock` that was held (its key existed) ends a reservation too and is handed over;
    /// one that was not is left as it is (as the scripts do; issue 20's notes say "DEL key and
    /// handoff, then hand_over" without that condition).
    pub fn force_unlock(&mut self, now: Now) -> bool {
        self.expire_keys(now.keys_ms.min(now.ms));
        if self.kind == LockKind::Fair {
            self.purge_heads(now.ms, None);
        }
        let existed = self.key_exists();
        self.holds.clear();
        self.foreign = false;
        if self.kind != LockKind::Fair && existed {
            self.handoff = None;
            self.hand_over(now, None);
        }
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
    /// already issued do not, so every later token still exceeds them. Subscriptions are not
    /// part of the keys: they stay as they are.
    pub fn restore(&mut self, snapshot: &HashLock) {
        let issued = self.issued;
        let counter_ttl_ms = self.counter_ttl_ms;
        let listening = std::mem::take(&mut self.listening);
        let messages = std::mem::take(&mut self.messages);
        *self = snapshot.clone();
        self.issued = issued.max(snapshot.issued);
        self.counter_ttl_ms = counter_ttl_ms;
        self.listening = listening;
        self.messages = messages;
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
            channel: format!("ch {owner}"),
            look: false,
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
        let mut lock = HashLock::new(LockKind::Lock);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 30_000, 0)), granted(1));
        assert_eq!(lock.acquire(at(1), &req("o1", "#2", 1_000, 0)), granted(2));
        // The outer hold is released first; the 1 s re-entry ends after its second.
        assert_eq!(lock.release(at(2), "#1"), Ok(Released::StillHeld(1)));
        assert_eq!(lock.key_expiry(), Some(1_001));
        assert_eq!(
            lock.acquire(at(500), &req("o2", "#3", 100, 0)),
            Ok(Acquired::Busy { until: Some(1_001) })
        );
        assert_eq!(lock.view(1_002).holds.len(), 0);
        assert_eq!(lock.release(at(1_002), "#2"), Ok(Released::NotHeld));
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
        let mut lock = HashLock::new(LockKind::Lock);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 1_000, 0)), granted(1));
        assert_eq!(lock.acquire(at(10), &req("o1", "#1", 100, 0)), granted(1));
        assert_eq!(lock.holds["#1"].expiry, 1_000);
        assert!(lock.renew(20, "#1", 0));
        assert!(lock.renew(20, "#1", 5_000));
        assert_eq!(lock.holds["#1"].expiry, 5_020);
    }

    #[test]
    fn fencing_tokens_never_repeat_after_a_restore() {
        let mut lock = HashLock::new(LockKind::Fenced);
        let snapshot = lock.clone();
        let token = |r: Result<Acquired, WrongType>| match r {
            Ok(Acquired::Granted { token, .. }) => token.unwrap_or(0),
            other => panic!("not granted: {other:?}"),
        };
        let t1 = token(lock.acquire(Now::from_us(5), &req("o1", "#1", 100, 0)));
        let t2 = token(lock.acquire(Now::from_us(6), &req("o1", "#2", 100, 0)));
        assert_eq!((t1, t2), (6, 7));
        assert!(lock.force_unlock(at(1)));
        lock.restore(&snapshot);
        let t3 = token(lock.acquire(Now::from_us(7), &req("o2", "#3", 100, 0)));
        assert!(t3 > t2 && lock.issued == t3, "{t3}");
    }

    #[test]
    fn the_counter_expires_a_ttl_after_the_clock_passed_it_and_tokens_still_grow() {
        let mut lock = HashLock::new(LockKind::Fenced);
        lock.counter_ttl_ms = 50;
        let token = |r: Result<Acquired, WrongType>| match r {
            Ok(Acquired::Granted { token, .. }) => token.unwrap_or(0),
            other => panic!("not granted: {other:?}"),
        };
        // The counter ahead of the clock (a failover to a server whose clock is behind): it lives
        // until the clock has passed it by the TTL.
        lock.counter = Some(2_000_000);
        let t1 = token(lock.acquire(at(10), &req("o1", "#1", 100, 0)));
        assert_eq!((t1, lock.counter_expiry), (2_000_001, Some(2_051)));
        assert!(lock.release(at(20), "#1").is_ok());
        assert_eq!(lock.view(2_051).counter, Some(t1));
        assert_eq!(lock.view(2_052).counter, None);
        let t2 = token(lock.acquire(at(2_052), &req("o2", "#2", 100, 0)));
        assert!(t2 > t1, "{t2} after {t1}");
        assert_eq!(lock.counter_expiry, Some(2_052 + 1 + 50));
    }

    /// The messages published since the last look, as `(channel, payload, heard)`.
    fn sent(lock: &mut HashLock) -> Vec<(String, String, bool)> {
        lock.take_messages()
            .into_iter()
            .map(|m| (m.channel, m.payload, m.heard))
            .collect()
    }

    fn msg(channel: &str, payload: &str, heard: bool) -> (String, String, bool) {
        (channel.to_owned(), payload.to_owned(), heard)
    }

    #[test]
    fn a_release_grants_the_longest_waiter_that_hears_it() {
        let mut lock = HashLock::new(LockKind::Fenced);
        lock.listen("ch o3", true);
        lock.listen("ch o4", true);
        let t1 = match lock.acquire(at(0), &req("o1", "#1", 1_000, 0)) {
            Ok(Acquired::Granted { count: 1, token }) => token,
            other => panic!("not granted: {other:?}"),
        };
        assert_eq!(t1, Some(1));
        let busy = Ok(Acquired::Busy { until: Some(1_000) });
        assert_eq!(lock.acquire(at(1), &req("o2", "#2", 100, 5_000)), busy);
        assert_eq!(lock.acquire(at(2), &req("o3", "#3", 60_000, 5_000)), busy);
        assert_eq!(lock.acquire(at(3), &req("o4", "#4", 100, 5_000)), busy);
        // A zero-wait try never joins; a retry of a waiting call keeps its place.
        assert_eq!(lock.acquire(at(4), &req("o5", "#5", 100, 0)), busy);
        assert_eq!(lock.acquire(at(5), &req("o2", "#2", 100, 5_000)), busy);
        let entry = |owner: &str, marker: &str, lease: u64| {
            Entry::format(marker, lease, owner, &format!("ch {owner}"))
        };
        assert_eq!(
            lock.waiting_order(),
            [
                entry("o2", "#2", 100),
                entry("o3", "#3", 60_000),
                entry("o4", "#4", 100)
            ]
        );
        assert_eq!(lock.timeouts.items[&entry("o2", "#2", 100)], 5_005);
        assert!(sent(&mut lock).is_empty());
        // The release grants o2 first: nobody listens on its channel, so the grant is undone
        // (its token stays spent) and o3 is granted, for the probation only.
        assert_eq!(lock.release(at(10), "#1"), Ok(Released::Freed));
        assert_eq!(
            sent(&mut lock),
            [
                msg("ch o2", "g:1:10001:10:110:#2", false),
                msg("ch o3", "g:1:10002:10:5010:#3", true)
            ]
        );
        let granted = Hold {
            owner: "o3".to_owned(),
            expiry: 5_010,
            token: Some(10_002),
        };
        assert_eq!(lock.holds.values().collect::<Vec<_>>(), [&granted]);
        assert_eq!(lock.counter, Some(10_002));
        assert_eq!(lock.waiting_order(), [entry("o4", "#4", 100)]);
        // o3's call tries again: it finds its grant, counted once, its lease applied.
        assert_eq!(
            lock.acquire(at(20), &req("o3", "#3", 60_000, 5_000)),
            Ok(Acquired::Granted {
                count: 1,
                token: Some(10_002)
            })
        );
        assert_eq!(lock.holds["#3"].expiry, 60_020);
        assert_eq!(lock.waiting_order(), [entry("o4", "#4", 100)]);
        // Its release grants o4: one message.
        assert_eq!(lock.release(at(30), "#3"), Ok(Released::Freed));
        assert_eq!(sent(&mut lock), [msg("ch o4", "g:1:30001:30:130:#4", true)]);
        assert!(lock.waiting.items.is_empty() && lock.timeouts.items.is_empty());
        // A release with nobody waiting publishes nothing.
        assert_eq!(lock.release(at(40), "#4"), Ok(Released::Freed));
        assert!(sent(&mut lock).is_empty() && lock.holds.is_empty());
    }

    #[test]
    fn a_free_lock_goes_to_the_head_first_and_a_cancel_hands_it_on() {
        let mut lock = HashLock::new(LockKind::Lock);
        lock.listen("ch o2", true);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 30, 0)), granted(1));
        let busy = Ok(Acquired::Busy { until: Some(30) });
        assert_eq!(lock.acquire(at(1), &req("o2", "#2", 100, 5_000)), busy);
        assert_eq!(lock.acquire(at(2), &req("o3", "#3", 100, 5_000)), busy);
        // o1's lease ran out unseen. o3 finds the lock free with o2 at the head: o2 is granted
        // it, o3 waits on (busy until the grant's end) and keeps its place.
        assert_eq!(
            lock.acquire(at(40), &req("o3", "#3", 100, 5_000)),
            Ok(Acquired::Busy { until: Some(140) })
        );
        assert_eq!(sent(&mut lock), [msg("ch o2", "g:1:0:40:140:#2", true)]);
        assert_eq!(lock.count("o2"), 1);
        // o2 gave up before it saw the grant: it is given back, and handed to o3, whose channel
        // nobody listens to: undone, the lock stays free.
        let entry2 = req("o2", "#2", 100, 5_000).entry();
        assert_eq!(lock.cancel(at(50), &entry2), Ok(true));
        assert_eq!(sent(&mut lock), [msg("ch o3", "g:1:0:50:150:#3", false)]);
        assert!(lock.holds.is_empty() && lock.waiting.items.is_empty());
        assert_eq!(lock.cancel(at(51), &entry2), Ok(false));
        // With nobody waiting it is anyone's.
        assert_eq!(lock.acquire(at(52), &req("o3", "#4", 100, 0)), granted(1));
        assert!(sent(&mut lock).is_empty());
    }

    #[test]
    fn an_acquire_hands_over_up_to_its_own_request_and_then_takes_it() {
        let mut lock = HashLock::new(LockKind::Lock);
        lock.listen("ch o3", true);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 30, 0)), granted(1));
        let busy = Ok(Acquired::Busy { until: Some(30) });
        assert_eq!(lock.acquire(at(1), &req("o2", "#2", 100, 5_000)), busy);
        assert_eq!(lock.acquire(at(2), &req("o3", "#3", 100, 5_000)), busy);
        // o1's lease ran out unseen; o3's call tries again: o2, at the head, is granted it but
        // nobody hears, so it is undone; the handover stops at o3's own request, and o3 takes
        // the lock with this very try (not a grant to itself, which would leave it told busy).
        assert_eq!(
            lock.acquire(at(40), &req("o3", "#3", 100, 5_000)),
            granted(1)
        );
        assert_eq!(sent(&mut lock), [msg("ch o2", "g:1:0:40:140:#2", false)]);
        assert_eq!(lock.holds["#3"].expiry, 140);
        assert!(lock.waiting.items.is_empty() && lock.timeouts.items.is_empty());
    }

    #[test]
    fn a_last_try_that_is_refused_leaves_the_waiting_set() {
        let mut lock = HashLock::new(LockKind::Lock);
        lock.listen("ch o2", true);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 1_000, 0)), granted(1));
        let busy = Ok(Acquired::Busy { until: Some(1_000) });
        assert_eq!(lock.acquire(at(1), &req("o2", "#2", 100, 5_000)), busy);
        assert_eq!(lock.waiting.items.len(), 1);
        // The wait ran out: its last try (keep-alive 0) is refused and takes the request out,
        // so the release grants nobody a call that has returned.
        assert_eq!(lock.acquire(at(2), &req("o2", "#2", 100, 0)), busy);
        assert!(lock.waiting.items.is_empty() && lock.timeouts.items.is_empty());
        assert_eq!(lock.release(at(3), "#1"), Ok(Released::Freed));
        assert!(sent(&mut lock).is_empty() && lock.holds.is_empty());
    }

    #[test]
    fn a_looker_is_told_and_the_lock_reserved_for_its_owner() {
        let mut lock = HashLock::new(LockKind::Lock);
        lock.listen("ch o2", true);
        assert_eq!(lock.acquire(at(0), &req("o1", "#1", 1_000, 0)), granted(1));
        let mut look = req("o2", "#2", 100, 5_000);
        look.look = true;
        assert_eq!(
            lock.acquire(at(1), &look),
            Ok(Acquired::Busy { until: Some(1_000) })
        );
        assert_eq!(lock.waiting_order(), ["#2 0 o2 ch o2".to_owned()]);
        assert_eq!(
            lock.acquire(at(2), &req("o3", "#3", 100, 5_000)),
            Ok(Acquired::Busy { until: Some(1_000) })
        );
        assert_eq!(lock.release(at(10), "#1"), Ok(Released::Freed));
        assert_eq!(sent(&mut lock), [msg("ch o2", "p:#2", true)]);
        assert_eq!(lock.handoff, Some(("o2".to_owned(), 20)));
        assert!(lock.holds.is_empty());
        // Only the reserved owner may take it during the window; the others join and wait.
        assert_eq!(
            lock.acquire(at(11), &req("o3", "#3", 100, 5_000)),
            Ok(Acquired::Reserved { until: 20 })
        );
        // The looker looks again (the reservation stays), then takes it with another call.
        assert_eq!(lock.acquire(at(12), &look), Ok(Acquired::Available));
        assert_eq!(lock.handoff, Some(("o2".to_owned(), 20)));
        assert_eq!(lock.acquire(at(13), &req("o2", "#4", 100, 0)), granted(1));
        assert_eq!(lock.handoff, None);
        // A force-unlock hands it over: to o3, who nobody hears; the lock stays free.
        assert!(lock.force_unlock(at(14)));
        assert_eq!(sent(&mut lock), [msg("ch o3", "g:1:0:14:114:#3", false)]);
        assert!(lock.holds.is_empty() && lock.waiting.items.is_empty());
        // A reservation ends when its owner gives up, and the lock is handed on.
        lock.listen("ch o3", true);
        assert_eq!(lock.acquire(at(20), &req("o1", "#5", 1_000, 0)), granted(1));
        assert_eq!(
            lock.acquire(at(21), &look),
            Ok(Acquired::Busy { until: Some(1_020) })
        );
        assert_eq!(
            lock.acquire(at(22), &req("o3", "#6", 100, 5_000)),
            Ok(Acquired::Busy { until: Some(1_020) })
        );
        assert_eq!(lock.release(at(23), "#5"), Ok(Released::Freed));
        assert_eq!(sent(&mut lock), [msg("ch o2", "p:#2", true)]);
        assert_eq!(lock.cancel(at(24), &look.entry()), Ok(true));
        assert_eq!(lock.handoff, None);
        assert_eq!(sent(&mut lock), [msg("ch o3", "g:1:0:24:124:#6", true)]);
        assert_eq!(lock.count("o3"), 1);
    }

    #[test]
    fn entries_are_read_back_with_spaces_in_the_channel() {
        let mut r = req("c:1", "#c:7", 250, 5_000);
        r.channel = "lockkit:lock:{a b}:c".to_owned();
        assert_eq!(r.entry(), "#c:7 250 c:1 lockkit:lock:{a b}:c");
        assert_eq!(
            Entry::parse(&r.entry()),
            Some(Entry {
                marker: "#c:7".to_owned(),
                lease_ms: 250,
                owner: "c:1".to_owned(),
                channel: "lockkit:lock:{a b}:c".to_owned(),
            })
        );
        r.look = true;
        assert_eq!(r.entry(), "#c:7 0 c:1 lockkit:lock:{a b}:c");
        assert_eq!(Entry::parse("#c:7 x c:1 ch"), None);
        assert_eq!(Entry::parse("#c:7 1 c:1"), None);
    }

    #[test]
    fn the_fair_queue_serves_in_order() {
        let mut lock = HashLock::new(LockKind::Fair);
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
        assert_eq!(lock.release(at(4), "#1"), Ok(Released::StillHeld(1)));
        assert_eq!(lock.release(at(5), "#4"), Ok(Released::Freed));
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
        assert_eq!(lock.cancel(at(62), "w#2"), Ok(true));
        assert!(lock.queue.items.is_empty());
    }

    #[test]
    fn a_foreign_value_is_reported_and_left_alone() {
        let mut lock = HashLock::new(LockKind::Lock);
        lock.put_foreign();
        assert_eq!(
            lock.acquire(at(0), &req("o1", "#1", 100, 0)),
            Err(WrongType)
        );
        assert_eq!(lock.release(at(0), "#1"), Err(WrongType));
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
