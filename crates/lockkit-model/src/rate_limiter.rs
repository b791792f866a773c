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
//! > Reservations reach at most one interval ahead: a request further out is told when to ask
//! > again.
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
    /// Reservations still to come: marker → its moment in ms (rounded up).
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

    /// The reservations to come: marker → moment in ms (rounded up), as the waiting ZSET has them
    /// (entries already past included until a request drops them).
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
                let now_ms = now_us / 1000;
                let waiting = self.waiting.values().filter(|ms| **ms >= now_ms).count() as u64;
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
                    let now_ms = now_us / 1000;
                    self.waiting.retain(|_, ms| *ms >= now_ms);
                    self.waiting.insert(marker.clone(), at_us.div_ceil(1000));
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
}
