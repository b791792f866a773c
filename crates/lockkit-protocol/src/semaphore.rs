//! The semaphores: leased permits counted in a HASH, one lease per hold in a ZSET.
//!
//! Both semaphore kinds (the counting semaphore and the permit-expirable one) share this layout and
//! these scripts; they differ only in their keys' segment and in how the runtime uses them.
//!
//! | key | type | content |
//! |---|---|---|
//! | `<prefix>:semaphore:{name}` | HASH | `permits` = total; `used` = permits of live holds; `#<hold>` = permits of that hold; `evicted` = repairs after an eviction |
//! | `<prefix>:semaphore.leases:{name}` | ZSET | member `#<hold>`, score = end of its lease in server ms |
//! | `<prefix>:semaphore.waiting:{name}` | ZSET | the line: member `<marker> <lease> <k> <channel>` (a waiting acquire call), score = when it joined (server µs) |
//! | `<prefix>:semaphore.timeouts:{name}` | ZSET | the same members, score = keep-alive deadline (server ms) |
//!
//! A hold (a [`hold_marker`](crate::lock::hold_marker), unique per acquire call) is live while
//! its score is in the future. Every script first gives back the permits of holds whose lease has
//! ended, so a crashed holder's permits come back on their own.
//!
//! **The line** (`scripts/line_lib.lua`, the lock's mechanism): waiting acquire calls stand in a
//! FIFO line. Whatever frees permits (a release, a lease found run out, permits added) grants them
//! to the head of the line while the head's request fits, in the same script, and tells each
//! granted call on its client's own channel ([`ObjectKeys::client_channel`](crate::keys::ObjectKeys::client_channel),
//! message `g:<k>:0:<now>:<expiry>:<marker>`, see [`wake`](crate::wake)); nobody else hears
//! anything. A request for many permits at the head is not overtaken by smaller ones behind it
//! (as with tokio's `Semaphore`: no starvation of `acquire_many`), and an acquire takes free
//! permits only when nobody waits ahead of it. A grant is on probation as a lock's is
//! ([`GRANT_PROBATION`](crate::lock::GRANT_PROBATION)). The two line keys expire with the last
//! keep-alive.
//!
//! Neither key has a TTL, so only a maxmemory policy of `allkeys-*` can evict one of them. Every
//! script but the watchdog's renewal (which reports a hold whose keys are gone as lost) first
//! checks that the two first keys still go together: leases gone while permits are counted as used, or leases left without a total.
//! It then drops the orphaned holds (their permits come back), and counts the repair in the
//! `evicted` field.
//!
//! **Data loss.** A total that is absent (never set, or lost with the data: an empty restart,
//! `FLUSHALL`, an eviction, a failover to a lagging replica) is set again by the first acquire or
//! `add_permits` that carries a configured total (an ARGV; `''` = none): the runtime passes the
//! total its client last set or was given for the object. Every change that can make a waiting
//! request impossible (a total set where it was absent, or lowered) takes each such request out
//! of the line and wakes its waiter (`w:<marker>` on its client's channel), which tries once more
//! and is refused at once.
//!
//! Every script is `line_lib.lua` and `semaphore_lib.lua` (the helpers: server time, purge, the
//! line's grant) followed by the operation's own file.
//!
//! The release and renew scripts follow the conventions every hold kind shares: a release is
//! decoded by [`ReleaseReply`](crate::lock::ReleaseReply) (`{1,0}` freed, `{0,0}` not held), a
//! renewal by [`decode_renew`](crate::lock::decode_renew) (keys: two per hold).

use crate::script::{with_prelude, Script};
use crate::DecodeError;

/// Take `k` permits as one hold.
pub static ACQUIRE: Script = with_prelude!(["line_lib", "semaphore_lib"], "semaphore_acquire");
/// Give back the permits of one hold (the release convention of every hold kind).
pub static RELEASE: Script = with_prelude!(["line_lib", "semaphore_lib"], "semaphore_release");
/// Extend or check many holds at once (the watchdog's batch; two keys per hold).
pub static RENEW: Script = with_prelude!(["line_lib", "semaphore_lib"], "semaphore_renew");
/// Set the total, only if it was never set.
pub static TRY_SET_PERMITS: Script =
    with_prelude!(["line_lib", "semaphore_lib"], "semaphore_try_set_permits");
/// Add to or take from the total.
pub static ADD_PERMITS: Script =
    with_prelude!(["line_lib", "semaphore_lib"], "semaphore_add_permits");
/// Count the free permits.
pub static AVAILABLE: Script = with_prelude!(["line_lib", "semaphore_lib"], "semaphore_available");
/// Set one hold's lease to end a given time from now.
pub static UPDATE_LEASE: Script =
    with_prelude!(["line_lib", "semaphore_lib"], "semaphore_update_lease");

/// Take a request whose call stopped waiting out of the line, and hand on what was granted to it.
pub static CANCEL: Script = with_prelude!(["line_lib", "semaphore_lib"], "semaphore_cancel");

/// Every semaphore script.
pub const SCRIPTS: [&Script; 8] = [
    &ACQUIRE,
    &RELEASE,
    &RENEW,
    &TRY_SET_PERMITS,
    &ADD_PERMITS,
    &AVAILABLE,
    &UPDATE_LEASE,
    &CANCEL,
];

/// Whether `id` has the shape of a hold marker (a permit id): `#` followed by something.
///
/// ```
/// use lockkit_protocol::{lock::hold_marker, semaphore::is_permit_id};
/// assert!(is_permit_id(&hold_marker("c1", 7)));
/// assert!(!is_permit_id("permits"));
/// ```
pub fn is_permit_id(id: &str) -> bool {
    id.len() > 1 && id.starts_with('#')
}

/// Reply of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The permits were taken.
    Acquired {
        /// The permits still free afterwards.
        available: u64,
    },
    /// Too few permits are free, or others wait ahead in the line.
    Busy {
        /// Milliseconds until the earliest holder's lease ends; `None` when unknown.
        retry_ms: Option<u64>,
        /// The server's clock when the script ran (Unix ms): a grant's expiry is read against it.
        now_ms: u64,
    },
    /// Refused: more permits were asked for than the semaphore has in total.
    MoreThanTotal {
        /// The semaphore's total permits.
        total: u64,
    },
    /// Refused: the semaphore's permits were never set (or were lost), and the request carried
    /// no configured total to set them to.
    NotSet,
}

impl AcquireReply {
    /// Decodes the script's `{status, value}` reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [1, available] if available >= 0 => Ok(Self::Acquired {
                available: available.unsigned_abs(),
            }),
            [0, wait, now] if wait >= -1 && now >= 0 => Ok(Self::Busy {
                retry_ms: (wait >= 0).then_some(wait.unsigned_abs()),
                now_ms: now.unsigned_abs(),
            }),
            [2, total] if total >= 0 => Ok(Self::MoreThanTotal {
                total: total.unsigned_abs(),
            }),
            [3, 0] => Ok(Self::NotSet),
            _ => Err(DecodeError::new(ACQUIRE.name(), reply)),
        }
    }
}

/// Decodes [`TRY_SET_PERMITS`]'s reply: whether this call set the total.
pub fn decode_try_set_permits(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(TRY_SET_PERMITS.name(), reply)),
    }
}

/// Reply of [`ADD_PERMITS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddReply {
    /// Done.
    Added {
        /// The new total.
        total: u64,
    },
    /// Refused: the total would go below zero.
    BelowZero {
        /// The current total.
        total: u64,
    },
    /// Refused: the total would exceed the largest accepted.
    AboveMax {
        /// The current total.
        total: u64,
    },
}

impl AddReply {
    /// Decodes the script's `{status, total}` reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        let total = |total: i64| total.unsigned_abs();
        match *reply {
            [1, t] if t >= 0 => Ok(Self::Added { total: total(t) }),
            [0, t] if t >= 0 => Ok(Self::BelowZero { total: total(t) }),
            [2, t] if t >= 0 => Ok(Self::AboveMax { total: total(t) }),
            _ => Err(DecodeError::new(ADD_PERMITS.name(), reply)),
        }
    }
}

/// Reply of [`AVAILABLE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AvailableReply {
    /// The permits were never set.
    NotSet,
    /// The permits free now, and the total.
    Set {
        /// Free permits.
        available: u64,
        /// Total permits.
        total: u64,
    },
}

impl AvailableReply {
    /// Decodes the script's `{set, available, total}` reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [0, 0, 0] => Ok(Self::NotSet),
            [1, available, total] if available >= 0 && total >= 0 => Ok(Self::Set {
                available: available.unsigned_abs(),
                total: total.unsigned_abs(),
            }),
            _ => Err(DecodeError::new(AVAILABLE.name(), reply)),
        }
    }
}

/// Decodes [`UPDATE_LEASE`]'s reply: whether the hold was there (and its lease updated).
pub fn decode_update_lease(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(UPDATE_LEASE.name(), reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_acquire() {
        assert_eq!(
            AcquireReply::decode(&[1, 2]),
            Ok(AcquireReply::Acquired { available: 2 })
        );
        assert_eq!(
            AcquireReply::decode(&[0, 150, 7]),
            Ok(AcquireReply::Busy {
                retry_ms: Some(150),
                now_ms: 7
            })
        );
        assert_eq!(
            AcquireReply::decode(&[0, -1, 7]),
            Ok(AcquireReply::Busy {
                retry_ms: None,
                now_ms: 7
            })
        );
        assert!(AcquireReply::decode(&[0, 150]).is_err());
        assert_eq!(
            AcquireReply::decode(&[2, 5]),
            Ok(AcquireReply::MoreThanTotal { total: 5 })
        );
        assert_eq!(AcquireReply::decode(&[3, 0]), Ok(AcquireReply::NotSet));
        for bad in [
            &[][..],
            &[1],
            &[1, -1],
            &[0, -2],
            &[2, -1],
            &[3, 1],
            &[4, 0],
        ] {
            assert!(AcquireReply::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decodes_release_and_renew_by_the_shared_conventions() {
        use crate::lock::{decode_renew, ReleaseReply};
        assert_eq!(ReleaseReply::decode(&[1, 0]), Ok(ReleaseReply::Freed));
        assert_eq!(ReleaseReply::decode(&[0, 0]), Ok(ReleaseReply::NotHeld));
        assert_eq!(decode_renew(&[1, 0], 2), Ok(vec![true, false]));
    }

    #[test]
    fn decodes_the_administrative_replies() {
        assert_eq!(decode_try_set_permits(&[1]), Ok(true));
        assert_eq!(decode_try_set_permits(&[0]), Ok(false));
        assert!(decode_try_set_permits(&[2]).is_err());

        assert_eq!(AddReply::decode(&[1, 7]), Ok(AddReply::Added { total: 7 }));
        assert_eq!(
            AddReply::decode(&[0, 3]),
            Ok(AddReply::BelowZero { total: 3 })
        );
        assert_eq!(
            AddReply::decode(&[2, 3]),
            Ok(AddReply::AboveMax { total: 3 })
        );
        assert!(AddReply::decode(&[1, -1]).is_err());
        assert!(AddReply::decode(&[3, 0]).is_err());

        assert_eq!(
            AvailableReply::decode(&[0, 0, 0]),
            Ok(AvailableReply::NotSet)
        );
        assert_eq!(
            AvailableReply::decode(&[1, 2, 5]),
            Ok(AvailableReply::Set {
                available: 2,
                total: 5
            })
        );
        assert!(AvailableReply::decode(&[1, 2]).is_err());
        assert!(AvailableReply::decode(&[0, 1, 0]).is_err());

        assert_eq!(decode_update_lease(&[1]), Ok(true));
        assert_eq!(decode_update_lease(&[0]), Ok(false));
        assert!(decode_update_lease(&[]).is_err());
    }

    #[test]
    fn every_script_is_the_helpers_then_its_documented_operation() {
        let lib = concat!(
            include_str!("scripts/line_lib.lua"),
            include_str!("scripts/semaphore_lib.lua")
        );
        for script in SCRIPTS {
            let src = script.source();
            let op = src.strip_prefix(lib).expect("starts with the helpers");
            assert!(
                op.starts_with(&format!("-- {}:", script.name())),
                "{}",
                script.name()
            );
            assert!(
                op.contains("KEYS[") && op.contains("Reply"),
                "{}",
                script.name()
            );
        }
    }

    #[test]
    fn permit_ids_are_markers() {
        assert!(is_permit_id("#c:1"));
        for bad in ["", "#", "used", "permits", "c:1"] {
            assert!(!is_permit_id(bad), "{bad:?}");
        }
    }
}
