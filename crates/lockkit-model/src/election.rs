//! The leader election (issue 22): [`ElectionSpec`], with time, for the model-based tests, and
//! [`LeadershipSpec`], without time, for the linearizability check of client histories.
//!
//! The contract encoded here, from the issue and its design note (`election_proclaim`,
//! `election_resign`, `election_leader`):
//!
//! - Leadership *is* a fenced hold of the election's main key: the fenced lock's acquire,
//!   release, cancel and force-unlock run unchanged on the election's first five keys, and its
//!   renew (`election_renew`: `lock_renew`, then the record follows its hold, see below), so
//!   the candidates are served in FIFO order by the direct grant, every hold has its own lease,
//!   and the **term is the hold's fencing token**: terms strictly increase and never repeat, also
//!   after a restore ([`HashLock`] with [`LockKind::Fenced`] is that part of the state).
//! - The leader record (a HASH `term`, `value`, `marker`, `owner` at the `leader` key; since
//!   issue 22's second protocol commit also `version`, the count of its announcements; since
//!   issue 27 also `request`, the id of the proclaim call that wrote it last, and it expires with
//!   the hold it names: every proclaim sets it to expire at the hold's own expiry and
//!   `election_renew` moves it with the hold's, so it lives exactly as long as the leadership;
//!   a proclaim whose request id and marker the record already carries, a re-sent one, answers
//!   1 and changes and publishes nothing): *"`election_proclaim` … if field `<marker>` of main
//!   is a live hold of `owner` (as `live` reads it) and its token is `term`: HSET record, PEXPIRE, PUBLISH
//!   `l:<term>:<value>`, return 1; else 0"*, the message now `l:<term>:<version>:<value>`. A proclaim by anyone who is not the live holder of
//!   that term changes nothing and publishes nothing.
//! - *"`election_resign` … if record.term == term [and its marker is the caller's]: DEL record, PUBLISH `r:<term>`; returns 1 /
//!   0"*; the client then releases its hold with the fenced release (which grants the next
//!   candidate at once). Since the resign–release window was closed (issue 27, item 3), the deleted record leaves `resigned` =
//!   term while that hold is live ([`ElectionSpec::resigned`]).
//! - *"`election_leader` → `{1, term, version, value}` if the record's marker is a live hold of main, else
//!   `{0}`"*: the record is reported only while its marker's hold is live (its owner's, carrying
//!   the record's term, as the scripts' `leads` checks). Since issue 27, `{0}` carries where the
//!   change channel stands ([`ElectionSpec::nobody`]): `{0, term, 0}` with the greatest term of a
//!   live hold (`{0, term, 1}` when that term resigned), else `{0, counter, 1}`.
//! - The messages go to the election's change channel, one per successful proclaim or resign, in
//!   the order of the scripts; they are kept with the fenced lock's grant messages
//!   ([`HashLock::take_messages`]), heard when someone listens on the channel.
//!
//! [`ElectionSpec::check`] states the invariants: at most one leader (one owner of live holds)
//! at any instant, and a reported leader is the live holder of its term.

use std::collections::{BTreeMap, BTreeSet};

use crate::lock::{live, Acquired, HashLock, LockKind, Message, Now, Released, Request, WrongType};
use crate::spec::{HoldState, Seen, Spec};

/// The leader record (`<prefix>:election.leader:{name}`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct LeaderRecord {
    /// The leader's term (its hold's fencing token).
    pub term: u64,
    /// The value it announced.
    pub value: String,
    /// Its hold marker in the main key.
    pub marker: String,
    /// Its owner id.
    pub owner: String,
    /// How many announcements the record has carried (each proclaim adds one; it starts again
    /// only once the record is deleted or expires).
    pub version: u64,
    /// The id of the proclaim request that wrote it last.
    pub request: String,
    /// When Redis deletes the record (server ms): its hold's own expiry, as of the last proclaim
    /// or renewal of that hold.
    pub expiry: u64,
}

/// An election's state: the fenced hold model of its main key and token counter, the leader
/// record, and the messages published (in [`HashLock::messages`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ElectionSpec {
    /// The candidates' fenced holds (main key, token, handoff, waiting, timeouts).
    pub lock: HashLock,
    /// The leader record, if any (whether its marker is live or not).
    pub record: Option<LeaderRecord>,
    /// What a resignation leaves at the record's key while the resigned hold is still live (its
    /// release is the client's next call): the resigned term and when the key expires (that
    /// hold's expiry at the resignation, server ms). `election_leader` reads it to answer that
    /// this term is over. Never at once with [`record`](ElectionSpec::record).
    pub resigned: Option<(u64, u64)>,
    /// The change channel (`<prefix>:election:{name}:changes`).
    pub channel: String,
    /// Every term a grant or an acquire handed out, in order (for [`ElectionSpec::check`]).
    pub terms: Vec<u64>,
}

impl ElectionSpec {
    /// An election with no candidate and no record; its changes go to `channel`.
    pub fn new(channel: &str) -> Self {
        Self {
            lock: HashLock::new(LockKind::Fenced),
            record: None,
            resigned: None,
            channel: channel.to_owned(),
            terms: Vec::new(),
        }
    }

    /// The state as Redis shows it at `now` (keys past their expiry gone).
    pub fn view(&self, now: u64) -> Self {
        let mut view = self.clone();
        view.lock = self.lock.view(now);
        view.expire_record(now);
        view
    }

    fn expire_record(&mut self, now: u64) {
        if self.record.as_ref().is_some_and(|r| now > r.expiry) {
            self.record = None;
        }
        if self.resigned.is_some_and(|(_, expiry)| now > expiry) {
            self.resigned = None;
        }
    }

    /// Redis expires keys before a script runs.
    fn expire(&mut self, now: Now) {
        let at = now.keys_ms.min(now.ms);
        self.lock = self.lock.view(at);
        self.expire_record(at);
    }

    /// Notes the terms the last lock step minted (from its grant messages and its reply).
    fn note_terms(&mut self, before: u64) {
        if self.lock.issued > before {
            self.terms.push(self.lock.issued);
        }
    }

    /// A candidate's campaign, its first half: the fenced acquire on the election's keys (a
    /// grant's term is its token).
    pub fn campaign(&mut self, now: Now, req: &Request) -> Result<Acquired, WrongType> {
        let before = self.lock.issued;
        let acquired = self.lock.acquire(now, req);
        self.note_terms(before);
        acquired
    }

    /// The fenced release of a hold (a resign's second half, or a dropped leadership).
    pub fn release(&mut self, now: Now, marker: &str) -> Result<Released, WrongType> {
        let before = self.lock.issued;
        let released = self.lock.release(now, marker);
        self.note_terms(before);
        released
    }

    /// The watchdog's renewal of one hold (`election_renew`): the lock's renewal, then the
    /// record, when it names this hold, expires with it.
    pub fn renew(&mut self, now: u64, marker: &str, lease_ms: u64) -> bool {
        self.expire_record(now);
        let renewed = self.lock.renew(now, marker, lease_ms);
        if renewed {
            let expiry = self
                .lock
                .holds
                .get(marker)
                .filter(|hold| live(hold.expiry, now))
                .map(|hold| hold.expiry);
            if let (Some(record), Some(expiry)) = (self.record.as_mut(), expiry) {
                if record.marker == marker {
                    record.expiry = expiry;
                }
            }
        }
        renewed
    }

    /// A waiting campaign gives up (the fenced cancel).
    pub fn cancel(&mut self, now: Now, entry: &str) -> Result<bool, WrongType> {
        let before = self.lock.issued;
        let cancelled = self.lock.cancel(now, entry);
        self.note_terms(before);
        cancelled
    }

    /// Force-unlock of the main key (the record stays; it is no longer reported).
    pub fn force_unlock(&mut self, now: Now) -> bool {
        let before = self.lock.issued;
        let held = self.lock.force_unlock(now);
        self.note_terms(before);
        held
    }

    /// Whether `marker` is a live hold of `owner` at `now` carrying the token `term` (the
    /// scripts' `leads`).
    fn leads(&self, marker: &str, owner: &str, term: u64, now: u64) -> bool {
        self.lock.holds.get(marker).is_some_and(|hold| {
            live(hold.expiry, now) && hold.owner == owner && hold.token == Some(term)
        })
    }

    fn publish(&mut self, payload: String) {
        let heard = self.lock.listening.contains(&self.channel);
        self.lock.messages.push(Message {
            channel: self.channel.clone(),
            payload,
            heard,
        });
    }

    /// `election_proclaim` of the request `request`: when the record already carries `marker`'s
    /// `request` (a re-sent request whose first run announced), nothing changes (`true`); else
    /// when `marker` is a live hold of `owner` whose token is `term`, the record becomes `(term,
    /// value, marker, owner, request)`, expiring with the hold, and `l:<term>:<version>:<value>`
    /// is published (`true`); else nothing changes (`false`). Nothing is settled.
    #[allow(clippy::too_many_arguments)] // the script's ARGV, one each
    pub fn proclaim(
        &mut self,
        now: Now,
        marker: &str,
        owner: &str,
        term: u64,
        value: &str,
        request: &str,
    ) -> bool {
        self.expire(now);
        if self
            .record
            .as_ref()
            .is_some_and(|r| r.marker == marker && r.request == request)
        {
            return true;
        }
        if !self.leads(marker, owner, term, now.ms) {
            return false;
        }
        let Some(expiry) = self.lock.holds.get(marker).map(|hold| hold.expiry) else {
            return false;
        };
        let version = self.record.as_ref().map_or(0, |r| r.version) + 1;
        self.resigned = None;
        self.record = Some(LeaderRecord {
            term,
            value: value.to_owned(),
            marker: marker.to_owned(),
            owner: owner.to_owned(),
            version,
            request: request.to_owned(),
            expiry,
        });
        self.publish(format!("l:{term}:{version}:{value}"));
        true
    }

    /// `election_resign`: when the record is `marker`'s under `term`, the record is deleted and
    /// `r:<term>` published (`true`); while `marker`'s hold is still live (its release comes
    /// next), the key keeps only the resigned term, expiring with that hold
    /// ([`resigned`](ElectionSpec::resigned)). Else nothing changes (`false`).
    pub fn resign(&mut self, now: Now, marker: &str, term: u64) -> bool {
        self.expire(now);
        if self
            .record
            .as_ref()
            .is_none_or(|r| r.term != term || r.marker != marker)
        {
            return false;
        }
        self.record = None;
        self.resigned = self
            .lock
            .holds
            .get(marker)
            .filter(|hold| live(hold.expiry, now.ms))
            .map(|hold| (term, hold.expiry));
        self.publish(format!("r:{term}"));
        true
    }

    /// `election_leader`: the record's term, version and value while its marker is a live hold of its
    /// owner carrying its term.
    pub fn leader(&mut self, now: Now) -> Option<(u64, u64, String)> {
        self.expire(now);
        let record = self.record.as_ref()?;
        self.leads(&record.marker, &record.owner, record.term, now.ms)
            .then(|| (record.term, record.version, record.value.clone()))
    }

    /// `election_leader` when [`leader`](ElectionSpec::leader) finds no announced leader: where
    /// the change channel stands. The greatest term of a live hold and `false` (it leads without
    /// its record), or `true` when that term resigned and its hold is not released yet; else the
    /// token counter (0 when it is gone) and `true` (every term up to it is over).
    pub fn nobody(&mut self, now: Now) -> (u64, bool) {
        self.expire(now);
        let held = self
            .lock
            .holds
            .values()
            .filter(|hold| live(hold.expiry, now.ms))
            .filter_map(|hold| hold.token)
            .max();
        match held {
            // The live hold's term resigned (its release comes next): over.
            Some(term) => (
                term,
                self.resigned.is_some_and(|(resigned, _)| resigned == term),
            ),
            None => (self.lock.counter.unwrap_or(0), true),
        }
    }

    /// The object's keys are put back as in `snapshot` (a restore): the terms already handed out
    /// are not (see [`HashLock::restore`]).
    pub fn restore(&mut self, snapshot: &ElectionSpec) {
        self.lock.restore(&snapshot.lock);
        self.record = snapshot.record.clone();
        self.resigned = snapshot.resigned;
    }

    /// The invariants at `now`: the live holds of the main key belong to one owner at most (one
    /// leader); a record that [`leader`](ElectionSpec::leader) would report is the live holder's,
    /// under a term handed out; the terms handed out strictly increase.
    pub fn check(&self, now: u64) -> Result<(), String> {
        let owners = crate::lock::holders(&self.lock, now);
        if owners.len() > 1 {
            return Err(format!("{} leaders at {now}: {owners:?}", owners.len()));
        }
        if let Some(record) = &self.record {
            let reported = self.leads(&record.marker, &record.owner, record.term, now);
            if reported && (!owners.contains(&record.owner) || !self.terms.contains(&record.term)) {
                return Err(format!(
                    "the reported record {record:?} is not the live holder's of a term handed out"
                ));
            }
        }
        if let Some(pair) = self.terms.windows(2).find(|w| w[1] <= w[0]) {
            return Err(format!("term {} after {}", pair[1], pair[0]));
        }
        Ok(())
    }
}

// === the time-free spec ===

/// A client-level operation on one election (for [`LeadershipSpec`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ElectionOp {
    /// `campaign(value)` / `try_campaign(value, ..)`; `hold` names the leadership it creates.
    Campaign {
        /// The leadership's id (unique per campaign).
        hold: String,
        /// The value it announces.
        value: String,
        /// The history shows the leadership may have ended on its own (reported lost, a later
        /// operation answered `NotHeld` or failed, a fault hit it).
        may_lapse: bool,
    },
    /// `leadership.proclaim(value)`.
    Proclaim {
        /// The leadership.
        hold: String,
        /// The new value.
        value: String,
    },
    /// `leadership.resign()`.
    Resign {
        /// The leadership.
        hold: String,
    },
    /// The leadership reported itself lost.
    Lost {
        /// The leadership.
        hold: String,
    },
    /// `election.leader()`.
    Leader,
}

/// The observed result of an [`ElectionOp`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ElectionRet {
    /// Campaign: leader, with this term.
    Elected(u64),
    /// Campaign: not elected within its wait.
    TimedOut,
    /// Proclaim, resign: `Ok(())`.
    Done,
    /// Proclaim, resign: `Err(NotHeld)`; campaign: elected but lost before its announcement.
    NotHeld,
    /// Leader: the term and value reported, or none.
    Leader(Option<(u64, String)>),
    /// Lost: the signal was seen.
    Signalled,
    /// Any operation: an error that leaves unknown whether it took effect.
    Error,
}

/// What a history has shown of one leadership: its term (unknown for a campaign that failed
/// ambiguously) and the value its campaign announced.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Term {
    /// The term, when seen.
    pub term: Option<u64>,
    /// The campaign's value.
    pub value: String,
}

/// The record as a history has shown it: whose it is and which values it may hold (more than
/// one after an ambiguous proclaim).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shown {
    /// The leadership that wrote it.
    pub hold: String,
    /// The values it may hold.
    pub values: BTreeSet<String>,
}

/// The election's contract without time, for concurrent histories (see
/// [`LockSpec`](crate::lock::LockSpec) for how leases are seen: `may_lapse`).
///
/// - a campaign elected with term `t`: `t` exceeds every term before it (strictly increasing,
///   never repeated), and every other leadership in force must be able to have ended (at most
///   one leader at any instant); the record becomes the new leader's value;
/// - a proclaim answers `Ok` only from a leadership in force, and sets the value; `NotHeld`
///   means it has ended, at the latest by the answer (a re-sent proclaim's first send may have
///   announced the value before that);
/// - `leader()` reports the record of a leadership in force, with its term and a value it may
///   hold, or none (then the last leader's hold has ended, or it resigned);
/// - a resign answering `Ok` ends a leadership in force and deletes its record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LeadershipSpec {
    holds: BTreeMap<String, Seen<Term>>,
    record: Option<Shown>,
    last_term: u64,
}

impl LeadershipSpec {
    /// An election nobody ever led.
    pub fn new() -> Self {
        Self::default()
    }

    /// The greatest term seen so far.
    pub fn last_term(&self) -> u64 {
        self.last_term
    }

    /// `hold` becomes leader with `term`: the others must be able to have ended.
    fn elect(&mut self, hold: &str, term: u64, value: &str, may_lapse: bool) -> Option<()> {
        if term <= self.last_term {
            return None;
        }
        self.last_term = term;
        for (other, seen) in &mut self.holds {
            if other != hold && !seen.yield_to_grant() {
                return None;
            }
        }
        let mut seen = Seen::live(
            hold,
            Term {
                term: Some(term),
                value: value.to_owned(),
            },
            may_lapse,
        );
        if let Some(known) = self.holds.get(hold) {
            seen.may_lapse |= known.may_lapse;
        }
        self.holds.insert(hold.to_owned(), seen);
        self.record = Some(Shown {
            hold: hold.to_owned(),
            values: BTreeSet::from([value.to_owned()]),
        });
        Some(())
    }

    fn in_force(&self, hold: &str) -> bool {
        self.holds.get(hold).is_some_and(Seen::in_force)
    }
}

impl Spec for LeadershipSpec {
    type Op = ElectionOp;
    type Ret = ElectionRet;

    fn step(&self, op: &ElectionOp, ret: &ElectionRet) -> Option<Self> {
        let mut next = self.clone();
        match (op, ret) {
            (
                ElectionOp::Campaign {
                    hold,
                    value,
                    may_lapse,
                },
                ElectionRet::Elected(term),
            ) => next.elect(hold, *term, value, *may_lapse)?,
            // Not elected in time, or elected and lost before its announcement (nothing was
            // announced; the hold lapsed): no leadership.
            (ElectionOp::Campaign { .. }, ElectionRet::TimedOut | ElectionRet::NotHeld) => {}
            (
                ElectionOp::Campaign {
                    hold,
                    value,
                    may_lapse,
                },
                ElectionRet::Error,
            ) => {
                next.holds.entry(hold.clone()).or_insert(Seen::maybe(
                    hold,
                    Term {
                        term: None,
                        value: value.clone(),
                    },
                    *may_lapse,
                ));
            }
            (ElectionOp::Proclaim { hold, value }, ElectionRet::Done) => {
                if !next.in_force(hold) {
                    return None;
                }
                next.record = Some(Shown {
                    hold: hold.clone(),
                    values: BTreeSet::from([value.clone()]),
                });
            }
            (ElectionOp::Lost { hold }, ElectionRet::Signalled) => {
                if let Some(seen) = next.holds.get_mut(hold) {
                    seen.state = HoldState::Gone;
                }
            }
            // The leadership had ended when the answer was made; but a proclaim re-sent after a
            // reconnect answers so even when its first send announced the value before the
            // lease ran out (its rustdoc says so): the value may be shown until the end, which
            // may come at any point after it.
            (ElectionOp::Proclaim { hold, value }, ElectionRet::NotHeld) => {
                if let Some(shown) = next.record.as_mut().filter(|s| s.hold == *hold) {
                    shown.values.insert(value.clone());
                }
                if let Some(seen) = next.holds.get_mut(hold) {
                    seen.may_lapse = true;
                }
            }
            (ElectionOp::Proclaim { hold, value }, ElectionRet::Error) => {
                if let Some(shown) = next.record.as_mut().filter(|s| s.hold == *hold) {
                    shown.values.insert(value.clone());
                }
            }
            (ElectionOp::Resign { hold }, ElectionRet::Done) => {
                if !next.in_force(hold) {
                    return None;
                }
                next.holds.remove(hold);
                if next.record.as_ref().is_some_and(|s| s.hold == *hold) {
                    next.record = None;
                }
            }
            (ElectionOp::Resign { hold }, ElectionRet::NotHeld) => {
                if let Some(seen) = next.holds.get_mut(hold) {
                    seen.state = HoldState::Gone;
                }
            }
            (ElectionOp::Resign { hold }, ElectionRet::Error) => {
                if let Some(seen) = next.holds.get_mut(hold) {
                    seen.state = seen.state.max(HoldState::Maybe);
                    seen.may_lapse = true;
                }
            }
            (ElectionOp::Leader, ElectionRet::Leader(None)) => {
                // The last record's leadership is not live: it has ended for good (a hold is
                // never revived), which it may only have if it could.
                if let Some(shown) = next.record.take() {
                    if let Some(seen) = next.holds.get_mut(&shown.hold) {
                        if seen.state == HoldState::Live && !seen.may_lapse {
                            return None;
                        }
                        seen.state = HoldState::Gone;
                    }
                }
            }
            (ElectionOp::Leader, ElectionRet::Leader(Some((term, value)))) => {
                let shown = next.record.as_ref();
                let known = shown.and_then(|s| next.holds.get(&s.hold).map(|seen| (s, seen)));
                match known {
                    Some((shown, seen))
                        if seen.in_force()
                            && seen.kind.term == Some(*term)
                            && shown.values.contains(value) => {}
                    _ => {
                        // A campaign that failed ambiguously may have won with this term.
                        let hold = next
                            .holds
                            .iter()
                            .find(|(_, s)| {
                                s.in_force() && s.kind.term.is_none() && s.kind.value == *value
                            })
                            .map(|(h, s)| (h.clone(), s.may_lapse))?;
                        next.elect(&hold.0, *term, value, hold.1)?;
                        if let Some(seen) = next.holds.get_mut(&hold.0) {
                            seen.state = HoldState::Maybe;
                        }
                    }
                }
            }
            (_, ElectionRet::Error) => {}
            _ => return None,
        }
        Some(next)
    }
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
            waiter: String::new(),
            channel: format!("ch {owner}"),
            look: false,
        }
    }

    fn at(ms: u64) -> Now {
        Now::from_ms(ms)
    }

    fn term(acquired: Result<Acquired, WrongType>) -> u64 {
        match acquired {
            Ok(Acquired::Granted {
                token: Some(token), ..
            }) => token,
            other => panic!("not elected: {other:?}"),
        }
    }

    fn payloads(e: &mut ElectionSpec) -> Vec<String> {
        e.lock
            .take_messages()
            .into_iter()
            .map(|m| m.payload)
            .collect()
    }

    #[test]
    fn one_leader_its_record_and_its_messages() {
        let mut e = ElectionSpec::new("changes");
        e.lock.listen("changes", true);
        e.lock.listen("ch b", true);
        let t1 = term(e.campaign(at(1), &req("a", "#a", 1_000, 0)));
        assert!(e.proclaim(at(2), "#a", "a", t1, "pod-a", "1"));
        assert_eq!(e.leader(at(3)), Some((t1, 1, "pod-a".to_owned())));
        // The record expires with the hold, and follows its renewal.
        assert_eq!(e.record.as_ref().map(|r| r.expiry), Some(1_001));
        assert!(e.renew(3, "#a", 1_000));
        assert_eq!(e.record.as_ref().map(|r| r.expiry), Some(1_003));
        // The same request again (re-sent): nothing changes, nothing is published.
        let before = e.record.clone();
        assert!(e.proclaim(at(3), "#a", "a", t1, "pod-a", "1"));
        assert_eq!(e.record, before);
        // b waits in line; a proclaim by b (not the holder) changes nothing.
        assert!(matches!(
            e.campaign(at(4), &req("b", "#b", 1_000, 5_000)),
            Ok(Acquired::Busy { .. })
        ));
        assert!(!e.proclaim(at(5), "#b", "b", t1, "pod-b", "1"));
        assert!(!e.proclaim(at(5), "#a", "a", t1 + 1, "pod-x", "2"));
        assert_eq!(payloads(&mut e), [format!("l:{t1}:1:pod-a")]);
        // Resign: record gone, r:<term>, then the release grants b at once.
        assert!(!e.resign(at(6), "#a", t1 + 7));
        assert!(!e.resign(at(6), "#b", t1));
        assert!(e.resign(at(6), "#a", t1));
        assert_eq!(e.leader(at(6)), None);
        assert_eq!(e.release(at(7), "#a"), Ok(Released::Freed));
        let sent = payloads(&mut e);
        assert_eq!(sent[0], format!("r:{t1}"));
        assert!(sent[1].starts_with("g:1:7001:"), "{sent:?}");
        let t2 = term(e.campaign(at(8), &req("b", "#b", 1_000, 5_000)));
        assert!(t2 > t1);
        assert!(e.proclaim(at(9), "#b", "b", t2, "pod-b", "1"));
        assert!(e.check(9).is_ok());
        // b's lease lapses: the record goes with it.
        assert_eq!(e.leader(at(1_100)), None);
        assert!(e.record.is_none());
        assert!(!e.proclaim(at(1_100), "#b", "b", t2, "late", "2"));
    }

    #[test]
    fn the_spec_allows_one_leader_at_a_time() {
        let campaign = |hold: &str, may_lapse| ElectionOp::Campaign {
            hold: hold.to_owned(),
            value: format!("v{hold}"),
            may_lapse,
        };
        let s = LeadershipSpec::new();
        let s = s
            .step(&campaign("a", false), &ElectionRet::Elected(5))
            .unwrap();
        // b elected while a cannot have lapsed: two leaders.
        assert!(s
            .step(&campaign("b", true), &ElectionRet::Elected(6))
            .is_none());
        let lead = |t: u64, v: &str| ElectionRet::Leader(Some((t, v.to_owned())));
        assert!(s.step(&ElectionOp::Leader, &lead(5, "va")).is_some());
        assert!(s.step(&ElectionOp::Leader, &lead(5, "vb")).is_none());
        assert!(s
            .step(&ElectionOp::Leader, &ElectionRet::Leader(None))
            .is_none());
        let proclaim = |hold: &str, v: &str| ElectionOp::Proclaim {
            hold: hold.to_owned(),
            value: v.to_owned(),
        };
        let s = s.step(&proclaim("a", "new"), &ElectionRet::Done).unwrap();
        assert!(s.step(&ElectionOp::Leader, &lead(5, "new")).is_some());
        // A non-leader's proclaim cannot succeed.
        assert!(s.step(&proclaim("z", "x"), &ElectionRet::Done).is_none());
        let resign = ElectionOp::Resign {
            hold: "a".to_owned(),
        };
        let s = s.step(&resign, &ElectionRet::Done).unwrap();
        assert!(s
            .step(&ElectionOp::Leader, &ElectionRet::Leader(None))
            .is_some());
        // Terms never go back nor repeat.
        assert!(s
            .step(&campaign("b", false), &ElectionRet::Elected(5))
            .is_none());
        let s = s
            .step(&campaign("b", true), &ElectionRet::Elected(9))
            .unwrap();
        // b may lapse: c may be elected after it.
        let s = s
            .step(&campaign("c", false), &ElectionRet::Elected(10))
            .unwrap();
        assert!(s.step(&proclaim("b", "late"), &ElectionRet::Done).is_none());
    }

    #[test]
    fn the_spec_explains_an_ambiguous_campaign_by_what_leader_saw() {
        let lead = |t: u64, v: &str| ElectionRet::Leader(Some((t, v.to_owned())));
        let s = LeadershipSpec::new()
            .step(
                &ElectionOp::Campaign {
                    hold: "a".to_owned(),
                    value: "va".to_owned(),
                    may_lapse: true,
                },
                &ElectionRet::Error,
            )
            .unwrap();
        // Nothing is known of its term: leader() may show it (with its value) or not.
        assert!(s.step(&ElectionOp::Leader, &lead(3, "vx")).is_none());
        let s = s.step(&ElectionOp::Leader, &lead(3, "va")).unwrap();
        assert_eq!(s.last_term(), 3);
        assert!(s.step(&ElectionOp::Leader, &lead(3, "va")).is_some());
        // A proclaim that answered NotHeld: its leadership may have ended at any point, and a
        // re-sent proclaim's first send may have announced its value before that.
        let s = s
            .step(
                &ElectionOp::Proclaim {
                    hold: "a".to_owned(),
                    value: "vb".to_owned(),
                },
                &ElectionRet::NotHeld,
            )
            .unwrap();
        assert!(s.step(&ElectionOp::Leader, &lead(3, "vb")).is_some());
        assert!(s.step(&ElectionOp::Leader, &lead(3, "vx")).is_none());
        let s = s
            .step(&ElectionOp::Leader, &ElectionRet::Leader(None))
            .unwrap();
        // Once leader() saw it end, it is not shown again.
        assert!(s.step(&ElectionOp::Leader, &lead(3, "va")).is_none());
    }
}
