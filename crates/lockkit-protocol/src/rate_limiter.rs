//! The rate limiter: GCRA (the generic cell rate algorithm) with reservations, in one HASH.
//!
//! | key | type | content |
//! |---|---|---|
//! | `<prefix>:ratelimiter:{name}` | HASH | the limit: `rate`, `interval` (ms), `burst`, `mode`, `set_by` (the request that stored it); in the overall mode also the schedule: `tat`, `last`, `last_at`, `last_cost`, `given` (the last request given back) |
//! | `<prefix>:ratelimiter.waiting:{name}` | ZSET | member = marker of a reservation still to come, score = its moment (server ms, its µs as the fraction) |
//! | `<prefix>:ratelimiter.client:{name}:<client id>` | HASH | in the per-client mode, one client's schedule; expires once idle |
//!
//! The schedule is one number, `tat` (server µs): the theoretical arrival time of the next
//! permit. With `T = interval / rate` and a tolerance of `burst × T`, a request for `k` permits
//! is admitted at the first moment `at ≥ now` with `max(tat, now) + (k − 1)·T − burst·T ≤ at`,
//! and `tat` moves on by `k·T`. A request whose moment lies ahead is *reserved*: the script
//! places it, answers with the delay, and the caller sleeps that long, asking Redis nothing more.
//! So requests are served in the order they reached Redis, a waiting caller costs Redis nothing,
//! and one script call admits one request. In any window of one interval at most
//! `rate + burst` permits are admitted, and no request may ask for more than `burst + 1`.
//!
//! A reservation more than one interval ahead is *far*: should Redis lose its data meanwhile
//! (the reservation with it), the caller must not take its moment in a schedule that no longer
//! has it. The first request that finds the limit missing writes it again (from its handle) and
//! announces `all` on the limiter's channel; a far sleeper listens there (and to its client's
//! reconnects, which a restart causes), and on either re-checks that its marker is still in the
//! waiting ZSET, asking again when it is not. A sleeper within one interval does not listen: what
//! it can over-admit after a loss is bounded by one window.
//!
//! Only the last request of a schedule can be given back (every later one was placed after it):
//! the schedule remembers its marker and cost (`last`, `last_cost`).
//!
//! Every script is idempotent per request (fred re-sends a command in flight when a connection
//! drops): a re-sent request finds its marker as `last` and answers with the same moment; a
//! re-sent give-back finds it as `given`; a re-sent `try_set_limit` finds it as `set_by`.

use crate::keys::{KeyError, Kind, Namespace};
use crate::script::{with_prelude, Script};
use crate::DecodeError;

/// Take permits now, or reserve them, or say when they could be had.
pub static ACQUIRE: Script = with_prelude!("rate_lib", "rate_limiter_acquire");
/// Give back the last request's permits.
pub static CANCEL: Script = with_prelude!("rate_lib", "rate_limiter_cancel");
/// Store the limit (or only when none is stored).
pub static SET_LIMIT: Script = with_prelude!("rate_lib", "rate_limiter_set_limit");
/// The limit, what one request could take now, and how many reservations are to come.
pub static STATUS: Script = with_prelude!("rate_lib", "rate_limiter_status");

/// The `mode` field's value of the overall mode: one schedule for every client.
pub const MODE_OVERALL: &str = "overall";
/// The `mode` field's value of the per-client mode: each client has a schedule of its own.
pub const MODE_PER_CLIENT: &str = "per_client";

/// The key of one client's schedule (per-client mode):
/// `<prefix>:ratelimiter.client:<tagged name>:<client id>`, in the object's hash slot. No object
/// has a key of the `ratelimiter.client` segment, so it never collides with one.
///
/// ```
/// use lockkit_protocol::{keys::{Kind, Namespace}, rate_limiter, slot::key_slot};
/// let ns = Namespace::default();
/// let keys = ns.object(Kind::RateLimiter, "partner-api").unwrap();
/// let mine = rate_limiter::client_state_key(&ns, "partner-api", "3f2a").unwrap();
/// assert_eq!(mine, "lockkit:ratelimiter.client:{partner-api}:3f2a");
/// assert_eq!(key_slot(&mine), key_slot(&keys.key));
/// ```
pub fn client_state_key(ns: &Namespace, name: &str, client_id: &str) -> Result<String, KeyError> {
    let base = ns.object_base(&format!("{}.client", Kind::RateLimiter.segment()), name)?;
    Ok(format!("{base}:{client_id}"))
}

/// Reply of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Admitted at `at_us` (server µs); `delay_us > 0`: reserved, the caller sleeps that long.
    Admitted {
        /// How long the caller sleeps before the permits are its, in µs.
        delay_us: u64,
        /// When the permits are admitted, on the server's clock (µs since the Unix epoch).
        at_us: u64,
        /// The moment is more than one interval ahead: the caller listens, while it sleeps, for
        /// the announcement that the data was lost, and then re-checks its reservation.
        far: bool,
    },
    /// Refused: the permits come in `earliest_us`, more than the caller may wait.
    Refused {
        /// In how many µs the permits could be had.
        earliest_us: u64,
    },
    /// No limit is stored, and the caller configured none.
    NoLimit,
    /// More permits than the stored limit ever admits at once.
    TooMany {
        /// The most one request may take: the burst + 1.
        most: u64,
    },
}

impl AcquireReply {
    /// Decodes the script's reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        let err = || DecodeError::new(ACQUIRE.name(), reply);
        let u = |v: i64| u64::try_from(v).map_err(|_| err());
        match *reply {
            [1, delay, at, far @ (0 | 1)] => Ok(Self::Admitted {
                delay_us: u(delay)?,
                at_us: u(at)?,
                far: far == 1,
            }),
            [0, earliest, _now] => Ok(Self::Refused {
                earliest_us: u(earliest)?,
            }),
            [-1] => Ok(Self::NoLimit),
            [-2, most] => Ok(Self::TooMany { most: u(most)? }),
            _ => Err(err()),
        }
    }
}

/// Decodes [`CANCEL`]'s reply: whether permits were given back.
pub fn decode_cancel(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(CANCEL.name(), reply)),
    }
}

/// Decodes [`SET_LIMIT`]'s reply: whether the limit was stored.
pub fn decode_set_limit(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(SET_LIMIT.name(), reply)),
    }
}

/// A stored limit, as [`STATUS`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoredLimit {
    /// Permits per interval.
    pub rate: u64,
    /// The interval, in ms.
    pub interval_ms: u64,
    /// Permits a window may see on top of the rate.
    pub burst: u64,
    /// Whether each client has a schedule of its own.
    pub per_client: bool,
}

/// Reply of [`STATUS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatusReply {
    /// The stored limit, if any.
    pub limit: Option<StoredLimit>,
    /// The permits one request could take now (0 without a limit).
    pub available: u64,
    /// The server's clock, µs since the Unix epoch.
    pub now_us: u64,
    /// Reservations still to come.
    pub waiting: u64,
}

impl StatusReply {
    /// Decodes the script's reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        let err = || DecodeError::new(STATUS.name(), reply);
        let u = |v: i64| u64::try_from(v).map_err(|_| err());
        match *reply {
            [1, rate, interval, burst, per_client @ (0 | 1), available, now, waiting] => Ok(Self {
                limit: Some(StoredLimit {
                    rate: u(rate)?,
                    interval_ms: u(interval)?,
                    burst: u(burst)?,
                    per_client: per_client == 1,
                }),
                available: u(available)?,
                now_us: u(now)?,
                waiting: u(waiting)?,
            }),
            [0, now, waiting] => Ok(Self {
                limit: None,
                available: 0,
                now_us: u(now)?,
                waiting: u(waiting)?,
            }),
            _ => Err(err()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_acquire() {
        assert_eq!(
            AcquireReply::decode(&[1, 0, 5, 0]),
            Ok(AcquireReply::Admitted {
                delay_us: 0,
                at_us: 5,
                far: false
            })
        );
        assert_eq!(
            AcquireReply::decode(&[1, 7, 5, 1]),
            Ok(AcquireReply::Admitted {
                delay_us: 7,
                at_us: 5,
                far: true
            })
        );
        assert_eq!(
            AcquireReply::decode(&[0, 7, 5]),
            Ok(AcquireReply::Refused { earliest_us: 7 })
        );
        assert_eq!(AcquireReply::decode(&[-1]), Ok(AcquireReply::NoLimit));
        assert_eq!(
            AcquireReply::decode(&[-2, 3]),
            Ok(AcquireReply::TooMany { most: 3 })
        );
        for bad in [
            &[][..],
            &[1, -1, 5, 0],
            &[1, 0, 5],
            &[1, 0, 5, 2],
            &[2, 7, 5],
            &[0, 1],
        ] {
            assert!(AcquireReply::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decodes_status() {
        let status = StatusReply::decode(&[1, 100, 1000, 5, 1, 3, 9, 2]).unwrap();
        assert_eq!(
            status.limit,
            Some(StoredLimit {
                rate: 100,
                interval_ms: 1000,
                burst: 5,
                per_client: true
            })
        );
        assert_eq!((status.available, status.now_us, status.waiting), (3, 9, 2));
        assert_eq!(StatusReply::decode(&[0, 9, 0]).unwrap().limit, None);
        assert!(StatusReply::decode(&[1, 100, 1000, 5, 2, 3, 9, 2]).is_err());
    }

    #[test]
    fn every_script_documents_its_contract() {
        for script in [&ACQUIRE, &CANCEL, &SET_LIMIT, &STATUS] {
            let own = script
                .source()
                .split(&format!("-- {}:", script.name()))
                .nth(1);
            let own = own.unwrap_or_else(|| panic!("{} has no header", script.name()));
            assert!(
                own.contains("KEYS[") && own.contains("Reply"),
                "{}",
                script.name()
            );
        }
    }
}
