//! The rate limiter's model: GCRA (the generic cell rate algorithm) with reservations.
//!
//! Encodes the module documentation of `lockkit_protocol::rate_limiter` and the rustdoc of
//! `lockkit::RateLimiter` (issue 30):
//!
//! > The schedule is one number, `tat` (server µs): the theoretical arrival time of the next
//! > permit. With `T = interval / rate` and a tolerance of `burst × T`, a request for `k` permits
//! > is admitted at the first moment `at ≥ now` with `max(tat, now) + (k − 1)·T − burst·T ≤ at`,
//! > and `tat` moves on by `k·T`. A request whose moment lies ahead is *reserved* […] In any
//! > window of one interval at most `rate + burst` permits are admitted, and no request may ask
//! > for more than `burst + 1`.
//! > A reservation more than one interval ahead is *far*: [...] the caller listens for a loss.
//! > Only the last request of a schedule can be given back (every later one was placed after it).
//!
//! and `set_limit`: "Permits already admitted or reserved keep their moments; the new limit
//! applies from the next request on"; `with_limit`: "a rate limiter whose limit is not stored
//! (never set, or lost with Redis' data) is set up with it"; and the acquire script's
//! idempotence: "a re-sent copy finds its marker as the last request and answers as the first
//! run did" (a copy arriving after another request was placed is a new request: it is charged
//! again, so a late re-send can only admit fewer, never more).
//!
//! Time is the server's clock in **µs** (the scripts read `TIME` themselves and their replies
//! carry the instant they decided at), and the schedule is kept **exactly**, as a rational
//! number of µs. The scripts keep it as a double, which is exact to a fraction of a µs at today's
//! clock: [`RateLimiterSpec::outcomes`] lists every result a schedule within
//! [`PRECISION_US`] of the exact one gives, and [`RateLimiterSpec::accepts`] compares
//! moments and delays within [`PRECISION_US`].
//!
//! Not modelled: the per-client schedule's expiry (a minute after it fell idle; the programs
//! that run the model are shorter), and the waiting ZSET's expiry (one second after its last
//! reservation's moment, past every entry it counts while intervals are under a second).

use std::collections::BTreeMap;

/// How far (µs) the scripts' schedule, kept as a double, may be from the exact one.
pub const PRECISION_US: u64 = 8;

/// A stored limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Limit {
    /// Permits per interval (≥ 1).
    pub rate: u64,
    /// The interval in ms (≥ 1).
    pub interval_ms: u64,
    /// Permits a window may see on top of the rate.
    pub burst: u64,
    /// Each client has a schedule of its own.
    pub per_client: bool,
}

impl Limit {
    /// The most one request may take: `burst + 1`.
    pub fn most(&self) -> u64 {
        self.burst + 1
    }

    /// The most permits any window of one interval may admit: `rate + burst`.
    pub fn per_window(&self) -> u64 {
        self.rate + self.burst
    }
}

/// One schedule: the overall one, or one client's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Schedule {
    /// The theoretical arrival time of the next permit, in ticks (`None`: never used).
    tat: Option<u128>,
    /// The last request: its marker, its moment (µs, exact ticks) and its cost (ticks).
    last: Option<(String, u128, u128)>,
    /// The marker of the last request given back (a re-sent give-back answers `true` again).
    given: Option<String>,
}

/// The state of one rate limiter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RateLimiterSpec {
    limit: Option<Limit>,
    /// The marker of the request that stored the limit (`set_limit`, `try_set_limit`; not a
    /// request that stored its configured limit): a re-sent `try_set_limit` answers `true` again.
    set_by: Option<String>,
    /// Ticks per µs: a multiple of every rate seen, so `T` is a whole number of ticks.
    den: u128,
    overall: Schedule,
    clients: BTreeMap<String, Schedule>,
    /// Reservations still to come: marker → its moment in µs.
    waiting: BTreeMap<String, u64>,
}

impl Default for RateLimiterSpec {
    fn default() -> Self {
        Self::new()
    }
}

/// An operation on a rate limiter.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateOp {
    /// Ask for `permits`, waiting at most `wait_us` (`None`: no bound).
    Acquire {
        /// The caller's client id (its schedule, in the per-client mode).
        client: String,
        /// The request's marker (a re-send repeats it).
        marker: String,
        /// How many.
        permits: u64,
        /// The longest the caller may wait, in µs.
        wait_us: Option<u64>,
        /// The limit the caller's handle is configured with (stored when none is).
        configured: Option<Limit>,
    },
    /// Give back the request `marker` (only the last of its schedule goes back).
    Cancel {
        /// The caller's client id.
        client: String,
        /// The request's marker.
        marker: String,
    },
    /// Store a limit (`only_if_absent`: only when none is stored).
    SetLimit {
        /// The limit.
        limit: Limit,
        /// `try_set_limit` rather than `set_limit`.
        only_if_absent: bool,
        /// The request's marker (a re-send repeats it).
        marker: String,
    },
    /// The limit, what one request of `client` could take now, and the reservations to come.
    Status {
        /// The caller's client id.
        client: String,
    },
    /// Every key gone (data loss: a restart empty, `FLUSHALL`, the keys deleted).
    Lose,
}

/// An operation's result (µs figures on the server's clock).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateRet {
    /// Admitted at `at_us`; reserved when `delay_us > 0`.
    Admitted {
        /// How long the caller sleeps.
        delay_us: u64,
        /// The moment the permits are admitted.
        at_us: u64,
        /// The moment is more than one interval ahead (the caller listens for a loss).
        far: bool,
    },
    /// Refused: the permits come in `earliest_us`, more than the caller may wait.
    Refused {
        /// In how long.
        earliest_us: u64,
        /// The instant of the decision.
        now_us: u64,
    },
    /// No limit stored, none configured.
    NoLimit,
    /// More permits than one request may take.
    TooMany {
        /// `burst + 1`.
        most: u64,
    },
    /// `Cancel`: whether permits went back.
    GivenBack(bool),
    /// `SetLimit`: whether the limit was stored.
    Stored(bool),
    /// `Status`.
    Status {
        /// The stored limit.
        limit: Option<Limit>,
        /// Permits one request could take now (0 without a limit).
        available: u64,
        /// The instant of the reading.
        now_us: u64,
        /// Reservations to come.
        waiting: u64,
    },
    /// `Lose`.
    Done,
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl RateLimiterSpec {
    /// A rate limiter with nothing stored.
    pub fn new() -> Self {
        Self {
            limit: None,
            set_by: None,
            den: 1,
            overall: Schedule::default(),
            clients: BTreeMap::new(),
            waiting: BTreeMap::new(),
        }
    }

    /// The stored limit.
    pub fn limit(&self) -> Option<Limit> {
        self.limit
    }

    /// The schedule's `tat` (µs, exact as a fraction) of `client` under the stored mode.
    pub fn tat_us(&self, client: &str) -> Option<f64> {
        let s = self.schedule_ref(client)?;
        s.tat.map(|t| t as f64 / self.den as f64)
    }

    /// The last request of `client`'s schedule (under the stored mode): marker, moment (µs,
    /// rounded up) and cost (µs).
    pub fn last(&self, client: &str) -> Option<(String, u64, f64)> {
        let s = self.schedule_ref(client)?;
        s.last
            .as_ref()
            .map(|(m, at, cost)| (m.clone(), self.ceil_us(*at), *cost as f64 / self.den as f64))
    }

    /// The reservations to come: marker → moment in µs, as the waiting ZSET has them (its score
    /// is the moment in ms with the µs as the fraction; entries already past included until a
    /// request drops them).
    pub fn waiting(&self) -> &BTreeMap<String, u64> {
        &self.waiting
    }

    fn schedule_ref(&self, client: &str) -> Option<&Schedule> {
        match self.limit {
            Some(Limit {
                per_client: true, ..
            }) => self.clients.get(client),
            _ => Some(&self.overall),
        }
    }

    fn schedule_mut(&mut self, client: &str) -> &mut Schedule {
        match self.limit {
            Some(Limit {
                per_client: true, ..
            }) => self.clients.entry(client.to_owned()).or_default(),
            _ => &mut self.overall,
        }
    }

    /// Makes every rate of `limit` a divisor of the ticks per µs.
    fn admit_rate(&mut self, rate: u64) {
        let rate = u128::from(rate.max(1));
        let den = self.den / gcd(self.den, rate) * rate;
        if den == self.den {
            return;
        }
        let f = den / self.den;
        let scale = |s: &mut Schedule| {
            if let Some(t) = s.tat.as_mut() {
                *t *= f;
            }
            if let Some((_, at, cost)) = s.last.as_mut() {
                *at *= f;
                *cost *= f;
            }
        };
        scale(&mut self.overall);
        self.clients.values_mut().for_each(scale);
        self.den = den;
    }

    fn ticks(&self, us: u64) -> u128 {
        u128::from(us) * self.den
    }

    fn ceil_us(&self, ticks: u128) -> u64 {
        u64::try_from(ticks.div_ceil(self.den)).unwrap_or(u64::MAX)
    }

    /// `T` of `limit`, in ticks.
    fn emission(&self, limit: &Limit) -> u128 {
        u128::from(limit.interval_ms) * 1000 * self.den / u128::from(limit.rate)
    }

    fn store(&mut self, limit: Limit) {
        self.admit_rate(limit.rate);
        self.limit = Some(limit);
    }

    /// The result of `op` at server instant `now_us` with the schedule exact (the first of
    /// [`outcomes`](RateLimiterSpec::outcomes)), and the state it leaves.
    pub fn apply(&mut self, now_us: u64, op: &RateOp) -> RateRet {
        self.apply_skewed(now_us, op, 0)
    }

    /// As [`apply`](RateLimiterSpec::apply), deciding as if the schedule were `skew` ticks later
    /// (the state left keeps the exact schedule, moved on as the decision says).
    fn apply_skewed(&mut self, now_us: u64, op: &RateOp, skew: i128) -> RateRet {
        match op {
            RateOp::Lose => {
                *self = Self {
                    den: self.den,
                    ..Self::new()
                };
                RateRet::Done
            }
            RateOp::SetLimit {
                limit,
                only_if_absent,
                marker,
            } => {
                if self.limit.is_some() && *only_if_absent {
                    return RateRet::Stored(self.set_by.as_ref() == Some(marker));
                }
                self.store(*limit);
                self.set_by = Some(marker.clone());
                RateRet::Stored(true)
            }
            RateOp::Cancel { client, marker } => {
                self.waiting.remove(marker);
                if self.limit.is_none() {
                    return RateRet::GivenBack(false);
                }
                let s = self.schedule_mut(client);
                if s.given.as_ref() == Some(marker) {
                    return RateRet::GivenBack(true);
                }
                match s.last.take() {
                    Some((m, _, cost)) if m == *marker => {
                        s.tat = s.tat.map(|t| t.saturating_sub(cost));
                        s.given = Some(marker.clone());
                        RateRet::GivenBack(true)
                    }
                    other => {
                        s.last = other;
                        RateRet::GivenBack(false)
                    }
                }
            }
            RateOp::Status { client } => {
                let waiting = self.waiting.values().filter(|at| **at > now_us).count() as u64;
                let Some(limit) = self.limit else {
                    return RateRet::Status {
                        limit: None,
                        available: 0,
                        now_us,
                        waiting,
                    };
                };
                let now = self.ticks(now_us);
                let t = self.emission(&limit);
                let tat = self
                    .schedule_ref(client)
                    .and_then(|s| s.tat)
                    .map(|tat| skewed(tat, skew));
                let available = match tat {
                    Some(tat) if tat > now => {
                        let room = now + u128::from(limit.burst) * t;
                        if room < tat {
                            0
                        } else {
                            u64::try_from((room - tat) / t).unwrap_or(u64::MAX) + 1
                        }
                    }
                    _ => limit.burst + 1,
                };
                RateRet::Status {
                    limit: Some(limit),
                    available,
                    now_us,
                    waiting,
                }
            }
            RateOp::Acquire {
                client,
                marker,
                permits,
                wait_us,
                configured,
            } => {
                let limit = match (self.limit, configured) {
                    (Some(limit), _) => limit,
                    (None, Some(configured)) => {
                        self.store(*configured);
                        *configured
                    }
                    (None, None) => return RateRet::NoLimit,
                };
                if *permits > limit.most() {
                    return RateRet::TooMany { most: limit.most() };
                }
                let now = self.ticks(now_us);
                let den = self.den;
                let t = self.emission(&limit);
                let horizon = limit.interval_ms * 1000;
                let s = self.schedule_mut(client);
                if let Some((m, at, _)) = &s.last {
                    if m == marker {
                        let at_us = u64::try_from(at.div_ceil(den)).unwrap_or(u64::MAX);
                        let delay_us = at_us.saturating_sub(now_us);
                        return RateRet::Admitted {
                            delay_us,
                            at_us,
                            far: delay_us > horizon,
                        };
                    }
                }
                let tat = s.tat.unwrap_or(now).max(now);
                let need = skewed(tat, skew) + u128::from(*permits - 1) * t;
                let tolerance = u128::from(limit.burst) * t;
                let at = need.saturating_sub(tolerance).max(now);
                let at_us = u64::try_from(at.div_ceil(den)).unwrap_or(u64::MAX);
                let delay_us = at_us - now_us;
                if wait_us.is_some_and(|wait| delay_us > wait) {
                    return RateRet::Refused {
                        earliest_us: delay_us,
                        now_us,
                    };
                }
                // The slots start at the moment when its rounding up put it past `tat`.
                let start = tat.max(u128::from(at_us) * den);
                let cost = start - tat + u128::from(*permits) * t;
                s.tat = Some(tat + cost);
                s.last = Some((marker.clone(), at, cost));
                if delay_us > 0 {
                    self.waiting.retain(|_, at| *at >= now_us);
                    self.waiting.insert(marker.clone(), at_us);
                }
                RateRet::Admitted {
                    delay_us,
                    at_us,
                    far: delay_us > horizon,
                }
            }
        }
    }

    /// Every `(result, next state)` the contract allows for `op` at `now_us`: the exact
    /// schedule's first, then those of a schedule up to [`PRECISION_US`] earlier or later where
    /// they differ (a decision on the edge of a wait, of one interval ahead, or of a whole permit).
    pub fn outcomes(&self, now_us: u64, op: &RateOp) -> Vec<(RateRet, Self)> {
        let eps = i128::try_from(self.ticks(PRECISION_US)).unwrap_or(i128::MAX);
        let mut out: Vec<(RateRet, Self)> = Vec::new();
        for skew in [0, -eps, eps] {
            let mut next = self.clone();
            let ret = next.apply_skewed(now_us, op, skew);
            if !out.iter().any(|(r, _)| Self::accepts(r, &ret)) {
                out.push((ret, next));
            }
        }
        out
    }

    /// Whether an observed result is the expected one, µs figures within [`PRECISION_US`].
    pub fn accepts(expected: &RateRet, observed: &RateRet) -> bool {
        let near = |a: u64, b: u64| a.abs_diff(b) <= PRECISION_US;
        match (expected, observed) {
            (
                RateRet::Admitted {
                    delay_us,
                    at_us,
                    far,
                },
                RateRet::Admitted {
                    delay_us: d,
                    at_us: a,
                    far: f,
                },
            ) => near(*delay_us, *d) && near(*at_us, *a) && far == f,
            (
                RateRet::Refused {
                    earliest_us,
                    now_us,
                },
                RateRet::Refused {
                    earliest_us: e,
                    now_us: n,
                },
            ) => near(*earliest_us, *e) && now_us == n,
            _ => expected == observed,
        }
    }
}

// === Histories: the client-visible operations, for the linearizability checker ===

/// A rate limiter operation as a client sees it, for [`RateHistorySpec`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateHistoryOp {
    /// `acquire(permits)` (`wait_us: None`), `try_acquire(permits, wait)` or
    /// `try_admission(permits, wait)`.
    Acquire {
        /// Names the request, for its give-back (the history's label, not the library's marker).
        marker: String,
        /// How many permits.
        permits: u64,
        /// The caller's wait, µs (`None`: `acquire`, no bound). The wait the script is given is
        /// at most this (what is left of it when the request is sent).
        wait_us: Option<u64>,
        /// A lower bound of the wait the script was given: the caller's wait less the time the
        /// call took, call to return (a refusal's script cannot have had less). Only refusals
        /// read it; `0` is always sound.
        wait_floor_us: u64,
    },
    /// `RateAdmission::give_back` of the request `marker` (also the give-back a dropped or
    /// failed call runs in the background).
    GiveBack {
        /// The request's label.
        marker: String,
    },
}

/// What a client saw of a [`RateHistoryOp`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum RateHistoryRet {
    /// Admitted at `at_us` (server µs, `RateAdmission::admitted_at`); `None`: admitted at a
    /// moment the client does not see (`try_acquire`'s `true`, or a call cut off that may have
    /// taken effect).
    Admitted {
        /// The moment, when known.
        at_us: Option<u64>,
    },
    /// Refused (`try_acquire`'s `false`, `try_admission`'s `None`).
    Refused,
    /// A give-back's answer.
    GivenBack(bool),
}

/// What the tat (ticks) may be at a server instant `x` (µs): in `[lo, max(hi, x·den + float)]`.
/// `float` is set by an admission whose moment is unknown: it took its permits at some instant
/// not later than the next operation's, so the schedule may reach as far past that instant as
/// the permits (and the wait they may have had) reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct TatBound {
    lo: u128,
    hi: u128,
    float: Option<u128>,
}

impl TatBound {
    fn exact(tat: u128) -> Self {
        Self {
            lo: tat,
            hi: tat,
            float: None,
        }
    }

    /// The greatest tat possible at instant `x` (in ticks).
    fn hi_at(&self, x: u128) -> u128 {
        self.float.map_or(self.hi, |f| self.hi.max(x + f))
    }
}

/// The sequential specification of a rate limiter's **client-visible** operations (one limit,
/// the overall mode, no data loss), for the linearizability checker: `acquire`, `try_acquire`,
/// `try_admission` and `give_back`, with the moments the client sees
/// (`RateAdmission::admitted_at`) and nothing else.
///
/// The arithmetic is [`RateLimiterSpec`]'s (its ticks, `T`, the tolerance, the rounded-up moment,
/// the slots that start at the moment when rounding puts it past `tat`, [`PRECISION_US`]); what
/// differs is what is known. A client does not see the server instant `now` at which the script
/// decided, so a result is accepted iff **some** instant explains it, not earlier than the
/// instant of the operation linearized before it (the server's clock only moves forward):
/// - an admission at `at` either was immediate (`now = at`, the schedule's earliest moment for
///   the request was not after `at`) or reserved (`now < at`, `at` is the earliest moment, within
///   the precision, and `at − now` is at most the wait and one interval);
/// - a refusal needs an instant at which the earliest moment is more than the wait away; the
///   earliest instant allowed is the one that makes this likeliest, and it changes nothing;
/// - an admission whose moment is not seen (`try_acquire`'s `true`, a cut-off call that took
///   effect) is always possible (at a late enough instant every permit is free): it moves the
///   schedule on by its permits from an instant that is not known.
///
/// **The state** keeps what can be known: a lower bound of the server clock (`clock`, µs), and
/// the tat as an interval (ticks) that is a single point while every admission's moment is seen
/// (then this spec is exactly [`RateLimiterSpec`]: `tests` cross-check it). Where several
/// instants explain a result, the state keeps every one of them: the earliest instant as the
/// clock's lower bound (a later instant only forbids futures, never allows one: every bound on
/// later operations is "not before the clock"), and the tat's interval the union of what each
/// explanation leaves (an immediate and a reserved admission at the same `at` leave the same tat,
/// `max(tat, at) + k·T`). An admission at an unseen instant widens the interval's top by the
/// unknown instant (`TatBound::float`) until an admission whose moment is seen pins it again: a
/// reservation tells the tat to within a µs, an immediate admission bounds it by the moment.
/// Every step is thus an over-approximation that is exact without unseen moments: it never
/// rejects a legal history, and it rejects an admission before the schedule's earliest moment
/// (over-admission) whenever the tat's interval is a point, as it is between seen moments. An
/// interval wider than a point loosens the check by its width, at most the permits of the
/// unseen admissions plus their wait: the sliding-window check on the admitted moments
/// (`lockkit_suite::rate_window`) covers what it lets through.
///
/// **Give-back:** `true` iff the request is the last of the schedule (or the last given back:
/// a re-sent give-back), and then the tat is what it was before the request (`max(tat, now)`),
/// kept as an interval with the request. A call cut off (an error, a dropped future) may have
/// taken effect at an unseen moment, and its give-back runs in the background: the histories
/// record both as pending operations (the acquire with `Admitted { at_us: None }`, the give-back
/// with either answer), each linearized or left out by the checker.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RateHistorySpec {
    /// Ticks per µs, `T` and the tolerance in ticks (from [`RateLimiterSpec`]).
    den: u128,
    t: u128,
    tolerance: u128,
    /// How far ahead a reservation may reach, µs: any distance (`u64::MAX`); the caller's wait
    /// bounds it.
    horizon_us: u64,
    /// `burst + 1`.
    most: u64,
    /// A lower bound of the server clock, µs.
    clock: u64,
    tat: TatBound,
    /// The last request: its label and what its give-back restores.
    last: Option<(String, TatBound)>,
    /// The last request given back.
    given: Option<String>,
}

impl RateHistorySpec {
    /// A rate limiter with `limit` stored (overall mode) and an empty schedule.
    pub fn new(limit: Limit) -> Self {
        let mut exact = RateLimiterSpec::new();
        exact.store(limit);
        let t = exact.emission(&limit);
        Self {
            den: exact.den,
            t,
            tolerance: u128::from(limit.burst) * t,
            horizon_us: u64::MAX,
            most: limit.most(),
            clock: 0,
            tat: TatBound::exact(0),
            last: None,
            given: None,
        }
    }

    /// The tat's bounds (µs, as fractions) at the clock's lower bound, and the clock's lower
    /// bound: for messages and tests.
    pub fn bounds_us(&self) -> (f64, f64, u64) {
        let den = self.den as f64;
        let x = u128::from(self.clock) * self.den;
        (
            self.tat.lo as f64 / den,
            self.tat.hi_at(x) as f64 / den,
            self.clock,
        )
    }

    fn ticks(&self, us: u64) -> u128 {
        u128::from(us) * self.den
    }

    /// `(k − 1)·T − τ`, ticks (never positive for a valid request).
    fn reach(&self, permits: u64) -> i128 {
        let ahead =
            i128::try_from(u128::from(permits.saturating_sub(1)) * self.t).unwrap_or(i128::MAX);
        ahead - i128::try_from(self.tolerance).unwrap_or(i128::MAX)
    }

    /// An admission at the seen moment `at`.
    fn admitted_at(&self, marker: &str, permits: u64, wait: Option<u64>, at: u64) -> Option<Self> {
        let eps = self.ticks(PRECISION_US);
        let reach = self.reach(permits);
        let shift = |v: u128, by: i128| -> u128 {
            u128::try_from(i128::try_from(v).unwrap_or(i128::MAX) + by).unwrap_or(0)
        };
        let at_t = self.ticks(at);
        // Immediate (now = at): the script's tat, within the precision, was at most
        // `at − ((k − 1)·T − τ)`.
        let immediate = (at >= self.clock)
            .then(|| {
                let hi = self.tat.hi_at(at_t).min(shift(at_t + eps, -reach));
                (self.tat.lo <= hi).then_some((self.tat.lo, hi, at))
            })
            .flatten();
        // Reserved (now < at, now ≥ at − wait): `at` is the rounded-up earliest
        // moment `tat + (k − 1)·T − τ` of a script's tat within the precision.
        let reach_back = wait.unwrap_or(u64::MAX).min(self.horizon_us);
        let earliest_now = self.clock.max(at.saturating_sub(reach_back));
        let reserved = (earliest_now < at)
            .then(|| {
                let lo = self
                    .tat
                    .lo
                    .max(shift(self.ticks(at - 1) + 1, -reach).saturating_sub(eps));
                let hi = self
                    .tat
                    .hi_at(self.ticks(at - 1))
                    .min(shift(at_t + eps, -reach));
                (lo <= hi).then_some((lo, hi, earliest_now))
            })
            .flatten();
        let (lo, hi, clock) = match (immediate, reserved) {
            (Some(a), Some(b)) => (a.0.min(b.0), a.1.max(b.1), a.2.min(b.2)),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => return None,
        };
        let k_t = u128::from(permits) * self.t;
        // The slots start at the moment when it lies past the tat (`RateLimiterSpec::apply`).
        let tat = TatBound {
            lo: lo.max(at_t) + k_t,
            hi: hi.max(at_t) + k_t,
            float: None,
        };
        // A give-back restores `max(tat, now)`: now = at (immediate) or before at (reserved).
        let restore = TatBound {
            lo: lo.max(self.ticks(clock)),
            hi: hi.max(at_t),
            float: None,
        };
        Some(Self {
            clock,
            tat,
            last: Some((marker.to_owned(), restore)),
            ..self.clone()
        })
    }

    /// An admission at an unseen moment: at some instant `y ≥ clock`, not later than the next
    /// operation's, with a delay of at most `wait`.
    fn admitted_unseen(&self, marker: &str, permits: u64, wait: Option<u64>) -> Self {
        let k_t = u128::from(permits) * self.t;
        let delay = self.ticks(wait.unwrap_or(u64::MAX).min(self.horizon_us));
        let x = self.ticks(self.clock);
        // tat' = max(tat, at) + k·T with at ≤ y + delay: at most max(hi, y + float, y + delay)
        // + k·T, y not later than the next operation's instant.
        let float = Some(self.tat.float.unwrap_or(0).max(delay) + k_t);
        let tat = TatBound {
            lo: self.tat.lo.max(x) + k_t,
            hi: self.tat.hi + k_t,
            float,
        };
        let restore = TatBound {
            lo: self.tat.lo.max(x),
            hi: self.tat.hi,
            float: Some(self.tat.float.unwrap_or(0)),
        };
        Self {
            tat,
            last: Some((marker.to_owned(), restore)),
            ..self.clone()
        }
    }

    /// A refusal: at the earliest instant allowed (the likeliest to refuse), the latest tat
    /// possible put the earliest moment more than `floor` away. Nothing changes but what the
    /// refusal tells of the tat.
    fn refused(&self, permits: u64, floor: u64) -> Option<Self> {
        let eps = self.ticks(PRECISION_US);
        let reach = self.reach(permits);
        let x = self.ticks(self.clock);
        let latest = i128::try_from(self.tat.hi_at(x) + eps).unwrap_or(i128::MAX) + reach;
        let bar = i128::try_from(self.ticks(self.clock.saturating_add(floor))).unwrap_or(i128::MAX);
        if latest <= bar {
            return None;
        }
        // The script's tat exceeded `(now + floor)·den − reach` at some now ≥ clock.
        let above = u128::try_from(bar - reach - i128::try_from(eps).unwrap_or(0) + 1).unwrap_or(0);
        let mut next = self.clone();
        next.tat.lo = next.tat.lo.max(above);
        Some(next)
    }

    fn give_back(&self, marker: &str, answered: bool) -> Option<Self> {
        if self.given.as_deref() == Some(marker) {
            return answered.then(|| self.clone());
        }
        match &self.last {
            Some((m, restore)) if m == marker => answered.then(|| Self {
                tat: *restore,
                last: None,
                given: Some(marker.to_owned()),
                ..self.clone()
            }),
            _ => (!answered).then(|| self.clone()),
        }
    }
}

impl crate::spec::Spec for RateHistorySpec {
    type Op = RateHistoryOp;
    type Ret = RateHistoryRet;

    fn step(&self, op: &RateHistoryOp, ret: &RateHistoryRet) -> Option<Self> {
        match (op, ret) {
            (
                RateHistoryOp::Acquire {
                    marker,
                    permits,
                    wait_us,
                    ..
                },
                RateHistoryRet::Admitted { at_us },
            ) => {
                if *permits == 0 || *permits > self.most {
                    return None;
                }
                match at_us {
                    Some(at) => self.admitted_at(marker, *permits, *wait_us, *at),
                    None => Some(self.admitted_unseen(marker, *permits, *wait_us)),
                }
            }
            (
                RateHistoryOp::Acquire {
                    permits,
                    wait_us: Some(_),
                    wait_floor_us,
                    ..
                },
                RateHistoryRet::Refused,
            ) => self.refused(*permits, *wait_floor_us),
            (RateHistoryOp::GiveBack { marker }, RateHistoryRet::GivenBack(answered)) => {
                self.give_back(marker, *answered)
            }
            _ => None,
        }
    }
}

fn skewed(tat: u128, skew: i128) -> u128 {
    if skew >= 0 {
        tat.saturating_add(skew.unsigned_abs())
    } else {
        tat.saturating_sub(skew.unsigned_abs())
    }
}

/// The most permits a run may admit in any window of one interval when its schedule was rolled
/// back (a restart from an older snapshot) or lost (a restart empty, `FLUSHALL`) `resets` times
/// within the two intervals around that window: `(rate + burst) × (1 + resets)`.
///
/// Why: each schedule between two resets is exact on its own (at most `rate + burst` in any
/// window of what it admitted), and a schedule admits nothing more than one interval after it
/// was reset away (reservations reach at most one interval ahead), so a window of one interval
/// meets at most the schedules of the resets in the interval before it and in it, plus the one
/// in force.
pub fn most_per_window(limit: &Limit, resets: u64) -> u64 {
    limit.per_window() * (1 + resets)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_700_000_000_000_000;

    fn limit(rate: u64, interval_ms: u64, burst: u64) -> Limit {
        Limit {
            rate,
            interval_ms,
            burst,
            per_client: false,
        }
    }

    fn acquire(marker: &str, permits: u64, wait_us: Option<u64>) -> RateOp {
        RateOp::Acquire {
            client: "a".into(),
            marker: marker.into(),
            permits,
            wait_us,
            configured: None,
        }
    }

    fn admitted(delay_us: u64, at_us: u64) -> RateRet {
        RateRet::Admitted {
            delay_us,
            at_us,
            far: false,
        }
    }

    #[test]
    fn admits_the_burst_then_one_per_emission_interval() {
        let mut r = RateLimiterSpec::new();
        assert_eq!(r.apply(S, &acquire("#1", 1, None)), RateRet::NoLimit);
        let set = RateOp::SetLimit {
            limit: limit(2, 1000, 1),
            only_if_absent: true,
            marker: "#set".to_owned(),
        };
        assert_eq!(r.apply(S, &set), RateRet::Stored(true));
        // A re-sent copy answers as the first run did; another request finds a limit stored.
        assert_eq!(r.apply(S, &set), RateRet::Stored(true));
        let other = RateOp::SetLimit {
            limit: limit(2, 1000, 1),
            only_if_absent: true,
            marker: "#set2".to_owned(),
        };
        assert_eq!(r.apply(S, &other), RateRet::Stored(false));
        assert_eq!(
            r.apply(S, &acquire("#0", 3, None)),
            RateRet::TooMany { most: 2 }
        );
        assert_eq!(r.apply(S, &acquire("#1", 2, Some(0))), admitted(0, S));
        // tat = S + 1 s: the next permit at S + 500 ms.
        assert_eq!(
            r.apply(S, &acquire("#2", 1, Some(100))),
            RateRet::Refused {
                earliest_us: 500_000,
                now_us: S
            }
        );
        assert_eq!(
            r.apply(S, &acquire("#2", 1, None)),
            admitted(500_000, S + 500_000)
        );
        assert_eq!(r.waiting().len(), 1);
        // A re-sent copy answers as the first run did.
        assert_eq!(
            r.apply(S + 10, &acquire("#2", 1, None)),
            admitted(499_990, S + 500_000)
        );
        // The next at S + 1 s, one interval ahead; the one after is further: reserved, far.
        assert_eq!(
            r.apply(S, &acquire("#3", 1, None)),
            admitted(1_000_000, S + 1_000_000)
        );
        assert_eq!(
            r.apply(S, &acquire("#4", 1, None)),
            RateRet::Admitted {
                delay_us: 1_500_000,
                at_us: S + 1_500_000,
                far: true
            }
        );
        // Give-back: only the last.
        let cancel = |m: &str| RateOp::Cancel {
            client: "a".into(),
            marker: m.into(),
        };
        assert_eq!(r.apply(S, &cancel("#2")), RateRet::GivenBack(false));
        assert_eq!(r.apply(S, &cancel("#3")), RateRet::GivenBack(false));
        assert_eq!(r.apply(S, &cancel("#4")), RateRet::GivenBack(true));
        // A re-sent give-back answers as the first run did, and gives back nothing more.
        assert_eq!(r.apply(S, &cancel("#4")), RateRet::GivenBack(true));
        assert_eq!(
            r.apply(S, &acquire("#5", 1, None)),
            RateRet::Admitted {
                delay_us: 1_500_000,
                at_us: S + 1_500_000,
                far: true
            }
        );
    }

    #[test]
    fn set_limit_keeps_the_schedule_and_a_loss_starts_afresh() {
        let mut r = RateLimiterSpec::new();
        let configured = Some(limit(1, 100, 0));
        let op = |m: &str| RateOp::Acquire {
            client: "a".into(),
            marker: m.into(),
            permits: 1,
            wait_us: None,
            configured,
        };
        assert_eq!(r.apply(S, &op("#1")), admitted(0, S));
        assert_eq!(r.apply(S, &op("#2")), admitted(100_000, S + 100_000));
        r.apply(
            S,
            &RateOp::SetLimit {
                limit: limit(3, 100, 0),
                only_if_absent: false,
                marker: "#set".to_owned(),
            },
        );
        // tat = S + 200 ms stays; T is now 33 333.3 µs.
        let later = S + 100_000;
        assert_eq!(r.apply(later, &op("#3")), admitted(100_000, S + 200_000));
        assert_eq!(
            r.apply(later, &op("#4")),
            RateRet::Admitted {
                delay_us: 133_334,
                at_us: later + 133_334,
                far: true
            }
        );
        assert_eq!(r.apply(S, &RateOp::Lose), RateRet::Done);
        assert_eq!(r.apply(S, &op("#5")), admitted(0, S));
        assert_eq!(r.limit(), configured);
        let status = r.apply(S, &RateOp::Status { client: "a".into() });
        assert_eq!(
            status,
            RateRet::Status {
                limit: configured,
                available: 0,
                now_us: S,
                waiting: 0
            }
        );
    }

    #[test]
    fn per_client_schedules_are_apart() {
        let mut r = RateLimiterSpec::new();
        r.apply(
            S,
            &RateOp::SetLimit {
                limit: Limit {
                    per_client: true,
                    ..limit(1, 10, 0)
                },
                only_if_absent: false,
                marker: "#set".to_owned(),
            },
        );
        let op = |c: &str, m: &str| RateOp::Acquire {
            client: c.into(),
            marker: m.into(),
            permits: 1,
            wait_us: Some(0),
            configured: None,
        };
        assert_eq!(r.apply(S, &op("a", "#1")), admitted(0, S));
        assert_eq!(r.apply(S, &op("b", "#2")), admitted(0, S));
        assert!(matches!(
            r.apply(S, &op("a", "#3")),
            RateRet::Refused { .. }
        ));
    }

    #[test]
    fn an_edge_decision_allows_both_answers() {
        let mut r = RateLimiterSpec::new();
        r.apply(
            S,
            &RateOp::SetLimit {
                limit: limit(3, 10, 0),
                only_if_absent: false,
                marker: "#set".to_owned(),
            },
        );
        r.apply(S, &acquire("#1", 1, None));
        // The next at S + 3333.33: a wait of 3333 µs is on the edge.
        let outcomes = r.outcomes(S, &acquire("#2", 1, Some(3333)));
        assert_eq!(outcomes.len(), 2, "{outcomes:?}");
        assert!(matches!(outcomes[0].0, RateRet::Refused { .. }));
        assert!(matches!(outcomes[1].0, RateRet::Admitted { .. }));
        assert_eq!(most_per_window(&limit(3, 10, 2), 1), 10);
    }

    // === RateHistorySpec ===

    use crate::spec::Spec;

    fn h_acquire(marker: &str, permits: u64, wait_us: Option<u64>) -> RateHistoryOp {
        RateHistoryOp::Acquire {
            marker: marker.into(),
            permits,
            wait_us,
            wait_floor_us: wait_us.unwrap_or(0),
        }
    }

    fn seen(at: u64) -> RateHistoryRet {
        RateHistoryRet::Admitted { at_us: Some(at) }
    }

    fn give_back(marker: &str) -> RateHistoryOp {
        RateHistoryOp::GiveBack {
            marker: marker.into(),
        }
    }

    /// 10 per second (T = 100 ms), burst 1.
    fn history_spec() -> RateHistorySpec {
        RateHistorySpec::new(limit(10, 1000, 1))
    }

    #[test]
    fn a_legal_history_steps_through() {
        let s = history_spec();
        // The burst: two at once, then one per 100 ms; a reservation; a refusal; a give-back.
        let s = s.step(&h_acquire("a", 1, Some(0)), &seen(S)).unwrap();
        let s = s.step(&h_acquire("b", 1, Some(0)), &seen(S)).unwrap();
        let s = s
            .step(&h_acquire("c", 1, Some(50_000)), &RateHistoryRet::Refused)
            .unwrap();
        let s = s
            .step(&h_acquire("d", 1, None), &seen(S + 100_000))
            .unwrap();
        let s = s
            .step(&give_back("b"), &RateHistoryRet::GivenBack(false))
            .unwrap();
        let s = s
            .step(&give_back("d"), &RateHistoryRet::GivenBack(true))
            .unwrap();
        // A re-sent give-back answers true again.
        let s = s
            .step(&give_back("d"), &RateHistoryRet::GivenBack(true))
            .unwrap();
        // d's slot is free again: taken by e.
        let s = s
            .step(&h_acquire("e", 1, None), &seen(S + 100_000))
            .unwrap();
        let (lo, hi, _) = s.bounds_us();
        assert_eq!(lo, hi, "every moment seen: the tat is exact");
        assert_eq!(lo, (S + 300_000) as f64);
    }

    #[test]
    fn two_admissions_too_close_are_rejected() {
        let s = history_spec();
        let s = s.step(&h_acquire("a", 2, Some(0)), &seen(S)).unwrap();
        // The burst is spent: the next permit is at S + 100 ms.
        assert!(s
            .step(&h_acquire("b", 1, Some(0)), &seen(S + 50_000))
            .is_none());
        assert!(s
            .step(&h_acquire("b", 1, None), &seen(S + 50_000))
            .is_none());
        assert!(s
            .step(
                &h_acquire("b", 1, None),
                &seen(S + 100_000 - PRECISION_US - 1)
            )
            .is_none());
        assert!(s
            .step(&h_acquire("b", 1, None), &seen(S + 100_000))
            .is_some());
        // Immediately at any later instant is fine too (the caller came later).
        assert!(s
            .step(&h_acquire("b", 1, Some(0)), &seen(S + 170_000))
            .is_some());
        // A reservation further ahead than the wait allows cannot be: refused, then.
        assert!(s
            .step(&h_acquire("b", 1, Some(10)), &RateHistoryRet::Refused)
            .is_some());
        // Nor a refusal once the clock has passed the permit's moment, by more than the wait.
        let later = s
            .step(&h_acquire("x", 1, Some(0)), &seen(S + 300_000))
            .unwrap();
        assert!(later
            .step(&h_acquire("y", 1, Some(1000)), &RateHistoryRet::Refused)
            .is_none());
        assert!(history_spec()
            .step(&h_acquire("y", 1, Some(0)), &RateHistoryRet::Refused)
            .is_none());
    }

    #[test]
    fn a_give_back_answered_true_when_not_last_is_rejected() {
        let s = history_spec();
        let s = s.step(&h_acquire("a", 1, Some(0)), &seen(S)).unwrap();
        let s = s.step(&h_acquire("b", 1, Some(0)), &seen(S)).unwrap();
        assert!(s
            .step(&give_back("a"), &RateHistoryRet::GivenBack(true))
            .is_none());
        assert!(s
            .step(&give_back("b"), &RateHistoryRet::GivenBack(false))
            .is_none());
        assert!(s
            .step(&give_back("zz"), &RateHistoryRet::GivenBack(true))
            .is_none());
    }

    #[test]
    fn an_unseen_admission_loosens_the_tat_until_a_reservation_pins_it() {
        let s = history_spec();
        let s = s.step(&h_acquire("a", 2, Some(0)), &seen(S)).unwrap();
        // try_acquire's true: taken at some instant, moment unknown.
        let s = s
            .step(
                &h_acquire("b", 1, Some(0)),
                &RateHistoryRet::Admitted { at_us: None },
            )
            .unwrap();
        // A refusal is explained (b may have come late), and so is a later admission.
        assert!(s
            .step(&h_acquire("c", 1, Some(150_000)), &RateHistoryRet::Refused)
            .is_some());
        // But not one further than b can reach (b's moment is at most its wait away).
        assert!(s
            .step(&h_acquire("c", 1, Some(250_000)), &RateHistoryRet::Refused)
            .is_none());
        // Not before the schedule's earliest moment: a and b took 3 slots from S on.
        assert!(s
            .step(&h_acquire("c", 1, None), &seen(S + 150_000))
            .is_none());
        let s = s
            .step(&h_acquire("c", 1, None), &seen(S + 200_000))
            .unwrap();
        let (lo, hi, _) = s.bounds_us();
        assert!(hi - lo <= 2.0 * PRECISION_US as f64 + 1.0, "{lo}..{hi}");
    }

    /// Exactly `RateLimiterSpec` while every moment is seen: its admissions and refusals at
    /// random instants are accepted, and its tat is the history spec's.
    #[test]
    fn the_history_spec_accepts_what_the_exact_model_decides() {
        let mut seed = 7u64;
        let mut rnd = |n: u64| {
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (seed >> 33) % n
        };
        for case in 0..50 {
            let lim = limit(1 + rnd(7), 1 + rnd(300), rnd(3));
            let mut exact = RateLimiterSpec::new();
            exact.apply(
                S,
                &RateOp::SetLimit {
                    limit: lim,
                    only_if_absent: false,
                    marker: "#set".into(),
                },
            );
            let mut h = RateHistorySpec::new(lim);
            let mut now = S;
            for i in 0..60 {
                now += rnd(lim.interval_ms * 400);
                let marker = format!("#{i}");
                if i > 0 && rnd(5) == 0 {
                    let target = format!("#{}", i - 1 - rnd(2).min(i - 1));
                    let op = RateOp::Cancel {
                        client: "a".into(),
                        marker: target.clone(),
                    };
                    let RateRet::GivenBack(b) = exact.apply(now, &op) else {
                        panic!()
                    };
                    h = h
                        .step(&give_back(&target), &RateHistoryRet::GivenBack(b))
                        .unwrap_or_else(|| panic!("case {case} step {i}: give-back {b}"));
                    continue;
                }
                let permits = 1 + rnd(lim.most());
                let wait_us = match rnd(3) {
                    0 => None,
                    1 => Some(0),
                    _ => Some(rnd(lim.interval_ms * 1000)),
                };
                let ret = match exact.apply(now, &acquire(&marker, permits, wait_us)) {
                    RateRet::Admitted { at_us, .. } => seen(at_us),
                    RateRet::Refused { .. } => RateHistoryRet::Refused,
                    _ => continue,
                };
                h = h
                    .step(&h_acquire(&marker, permits, wait_us), &ret)
                    .unwrap_or_else(|| panic!("case {case} step {i}: {ret:?} of {h:?}"));
                let (lo, hi, _) = h.bounds_us();
                assert_eq!(lo, hi, "case {case} step {i}");
                assert_eq!(Some(lo), exact.tat_us("a"), "case {case} step {i}");
            }
        }
    }
}
