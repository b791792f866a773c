//! The reentrant lock: a HASH per lock with per-owner hold counts and one marker per hold, each
//! hold with a lease of its own.
//!
//! Layout of the lock key (see `scripts/hold_lib.lua`):
//!
//! | field              | value                                                      |
//! |--------------------|------------------------------------------------------------|
//! | `<owner id>`       | that owner's hold count                                    |
//! | `#<hold id>`       | `<expiry> <owner id>`: the hold's own expiry, its owner     |
//!
//! The expiry is in server milliseconds (`TIME`, never a client clock). A hold is live while its
//! expiry is in the future; every script that reads the hash first ends the holds whose lease ran
//! out (each gives back one count of its owner), and the key expires with the latest live hold
//! (`PEXPIREAT`), so the lock is held exactly while one of its holds is, and no hold outlives its
//! own lease: a short re-entry inside a long hold, or a long one inside a short hold, ends on
//! time. Renewal moves only the renewed hold's expiry.
//!
//! An owner id is opaque to the scripts (never parsed); a hold id is `<client id>:<sequence>`,
//! unique per acquire request. The marker makes every script idempotent per request: an acquire
//! re-sent after a dropped connection finds its marker and does not count twice, a release takes
//! away exactly the hold it names, and a renewal never revives a released hold.
//!
//! Three more keys serve handoffs under contention (`scripts/handoff_lib.lua`):
//! `<prefix>:lock.waiting:{name}`, a ZSET of the waiting acquire calls ("requests",
//! `<marker> <lease ms> <owner> <channel>`) by when they first found the lock taken;
//! `<prefix>:lock.timeouts:{name}`, a ZSET of the same requests' keep-alive deadlines, pushed on
//! by each of their retries ([`WAITER_KEEPALIVE`]); and `<prefix>:lock.handoff:{name}`, the owner
//! of a multi-lock member a release reserved the free lock for, for [`HANDOFF_WINDOW`].
//!
//! **Direct grant.** A release that frees the lock while requests wait makes the longest-waiting
//! one the holder in the same script (its marker, its lease, on [`GRANT_PROBATION`]) and
//! publishes one message ([`Wake::Grant`](crate::wake::Wake::Grant)) on that request's channel,
//! which only its client subscribes to: the waiter owns the lock when it hears it. A grant no
//! subscriber heard is undone and the next request gets it. A waiter that gives up leaves at once
//! and hands back a grant it had not claimed ([`CANCEL`]); one whose client died is dropped when
//! its deadline passes. The three keys are absent while nobody waits, so an uncontended acquire
//! costs four commands (`EXISTS`, `TIME`, `HSET`, `PEXPIREAT`), and the release of its one hold
//! four (`EXISTS` of the waiting set, `TIME`, `HGETALL`, `DEL`). Both are written out in front of
//! the libraries (`scripts/lock_acquire_free.lua`, `scripts/lock_release_last.lua`) and return
//! before any library function is defined: defining them all, on every run, cost Redis more
//! than the four commands (issue 28).

use crate::script::{with_prelude, Script};
use crate::DecodeError;

/// Take one hold.
pub static ACQUIRE: Script = with_prelude!(
    first "lock_acquire_free",
    ["hold_lib", "line_lib", "handoff_lib"],
    "lock_acquire"
);
/// Give back one hold.
pub static RELEASE: Script = with_prelude!(
    first "lock_release_last",
    ["hold_lib", "line_lib", "handoff_lib"],
    "lock_release"
);
/// Extend or check many holds at once (the watchdog's batch), for every kind whose main key is a
/// lock HASH: lock, fenced lock and fair lock.
pub static RENEW: Script = with_prelude!("hold_lib", "lock_renew");
/// Take an owner that stopped waiting out of the waiting set, and hand on its reservation (lock
/// and fenced lock).
pub static CANCEL: Script = with_prelude!(["hold_lib", "line_lib", "handoff_lib"], "lock_cancel");
/// The live hold count of some owners (lock, fenced lock and fair lock).
pub static HOLD_COUNT: Script = with_prelude!("hold_lib", "lock_hold_count");
/// Delete a lock whoever holds it.
pub static FORCE_UNLOCK: Script =
    with_prelude!(["hold_lib", "line_lib", "handoff_lib"], "lock_force_unlock");

/// How long a release reserves the free lock for a multi-lock member waiting in the waiting set
/// (a request that only looks, see `scripts/handoff_lib.lua`): the member's client is woken and
/// takes every lock of its multi-lock at once, or the reservation ends with the window. Requests
/// that take a hold are granted the lock instead, with no window.
pub const HANDOFF_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

/// How long a grant lasts until its client confirms it: a release grants the lock to the
/// longest-waiting request with a lease of `min(lease, GRANT_PROBATION)`, and the client renews
/// it to its whole lease counted from the grant (grant time + lease, with [`RENEW`]'s
/// `@<server ms>` form), while it still holds it, once half of the probation has passed. So a grant to a client that died without closing its connection costs
/// the other waiters at most this long, never a whole lease. Equal to [`WAITER_KEEPALIVE`]: a
/// dead client's request is dropped after that long anyway.
pub const GRANT_PROBATION: std::time::Duration = WAITER_KEEPALIVE;

/// How long a waiter of a lock or fenced lock stays in the waiting set without retrying (its
/// keep-alive): a waiter retries at least every third of it, and one that stops (its client died)
/// is dropped once it has passed, so a release never reserves the lock for it.
pub const WAITER_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// The marker field of a hold, from its hold id.
///
/// ```
/// assert_eq!(lockkit_protocol::lock::hold_marker("c1", 7), "#c1:7");
/// ```
pub fn hold_marker(client_id: &str, sequence: u64) -> String {
    format!("#{client_id}:{sequence}")
}

/// Whether a field of a lock hash is a hold marker (as opposed to an owner's count).
pub fn is_marker_field(field: &str) -> bool {
    field.starts_with('#')
}

/// One hold read back from a lock hash: the value of a hold marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HoldEntry {
    /// When the hold's own lease ends, in server milliseconds (Unix time).
    pub expiry_ms: u64,
    /// The owner the hold counts for.
    pub owner: String,
}

impl HoldEntry {
    /// Reads a field and its value back: `Some` for a hold marker (`#…` → `<expiry> <owner>`),
    /// `None` for any other field (an owner's count, a fenced lock's token).
    ///
    /// ```
    /// use lockkit_protocol::lock::HoldEntry;
    /// let hold = HoldEntry::parse("#c1:7", "1700000000000 c1:3").unwrap();
    /// assert_eq!((hold.expiry_ms, hold.owner.as_str()), (1_700_000_000_000, "c1:3"));
    /// assert_eq!(HoldEntry::parse("c1:3", "1"), None);
    /// assert_eq!(HoldEntry::parse("#c1:7:token", "42"), None);
    /// ```
    pub fn parse(field: &str, value: &str) -> Option<Self> {
        if !is_marker_field(field) {
            return None;
        }
        let (expiry, owner) = value.split_once(' ')?;
        if expiry.is_empty() || !expiry.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self {
            expiry_ms: expiry.parse().ok()?,
            owner: owner.to_owned(),
        })
    }
}

/// Reply of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The hold was taken; the owner now holds the lock `hold_count` times.
    Acquired {
        /// The owner's hold count including this hold.
        hold_count: u32,
        /// The acquisition's fencing token (fenced locks only).
        token: Option<u64>,
    },
    /// Another owner holds the lock.
    Busy {
        /// The holder's remaining lease in milliseconds; `None` when the key has no expiry.
        pttl_ms: Option<u64>,
        /// The server's clock when the script ran (Unix ms): the anchor a grant's expiry is
        /// read against.
        now_ms: u64,
    },
    /// The lock is free, but a release reserved it for a multi-lock member for the rest of the
    /// handoff window.
    Reserved {
        /// What is left of the handoff window, in milliseconds.
        window_ms: u64,
        /// The server's clock when the script ran (Unix ms).
        now_ms: u64,
    },
}

impl AcquireReply {
    /// Decodes the reply of [`ACQUIRE`] (`{1, count}` / `{0, pttl, now}` /
    /// `{0, window, now, 1}`) or of [`fenced_lock::ACQUIRE`](crate::fenced_lock::ACQUIRE)
    /// (`{1, count, token}` / the same refusals).
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [1, count] if count > 0 => Ok(Self::Acquired {
                hold_count: u32::try_from(count).unwrap_or(u32::MAX),
                token: None,
            }),
            [1, count, token] if count > 0 && token > 0 => Ok(Self::Acquired {
                hold_count: u32::try_from(count).unwrap_or(u32::MAX),
                token: Some(token.unsigned_abs()),
            }),
            // -2 (key vanished between two calls of one script) cannot happen inside a script;
            // -1 means no expiry.
            [0, pttl, now] if pttl >= 0 && now >= 0 => Ok(Self::Busy {
                pttl_ms: Some(pttl.unsigned_abs()),
                now_ms: now.unsigned_abs(),
            }),
            [0, -1, now] if now >= 0 => Ok(Self::Busy {
                pttl_ms: None,
                now_ms: now.unsigned_abs(),
            }),
            [0, window, now, 1] if window >= 0 && now >= 0 => Ok(Self::Reserved {
                window_ms: window.unsigned_abs(),
                now_ms: now.unsigned_abs(),
            }),
            _ => Err(DecodeError::new(ACQUIRE.name(), reply)),
        }
    }
}

/// Reply of [`RELEASE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseReply {
    /// The last hold was given back: the lock is free and the release was announced.
    Freed,
    /// The hold was given back; the same owner still holds the lock `hold_count` times.
    StillHeld {
        /// The owner's remaining holds.
        hold_count: u32,
    },
    /// The hold was not there.
    NotHeld,
}

impl ReleaseReply {
    /// Decodes the script's `{status, value}` reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [1, 0] => Ok(Self::Freed),
            [2, count] if count > 0 => Ok(Self::StillHeld {
                hold_count: u32::try_from(count).unwrap_or(u32::MAX),
            }),
            [0, 0] => Ok(Self::NotHeld),
            _ => Err(DecodeError::new(RELEASE.name(), reply)),
        }
    }
}

/// Decodes [`ACQUIRE`]'s reply to a try that only looks (`ARGV[7]` = `1`, a multi-lock waiting
/// for all its members at once): `None` when the lock would have been acquired (`{2}`), else the
/// busy or reserved reply (the owner joined or stayed in the waiting set, as for a wait).
pub fn decode_look(reply: &[i64]) -> Result<Option<AcquireReply>, DecodeError> {
    if *reply == [2] {
        return Ok(None);
    }
    match AcquireReply::decode(reply) {
        Ok(AcquireReply::Acquired { .. }) | Err(_) => Err(DecodeError::new(ACQUIRE.name(), reply)),
        Ok(busy) => Ok(Some(busy)),
    }
}

/// Decodes [`RENEW`]'s reply: for each hold, whether it is still there.
pub fn decode_renew(reply: &[i64], holds: usize) -> Result<Vec<bool>, DecodeError> {
    if reply.len() != holds || reply.iter().any(|v| *v != 0 && *v != 1) {
        return Err(DecodeError::new(RENEW.name(), reply));
    }
    Ok(reply.iter().map(|v| *v == 1).collect())
}

/// Decodes [`CANCEL`]'s reply: whether the owner was still waiting (or reserved for).
pub fn decode_cancel(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(CANCEL.name(), reply)),
    }
}

/// Decodes [`HOLD_COUNT`]'s reply: the owners' live holds.
pub fn decode_hold_count(reply: &[i64]) -> Result<u32, DecodeError> {
    match *reply {
        [count] if count >= 0 => Ok(u32::try_from(count).unwrap_or(u32::MAX)),
        _ => Err(DecodeError::new(HOLD_COUNT.name(), reply)),
    }
}

/// Decodes [`FORCE_UNLOCK`]'s reply: whether the lock existed.
pub fn decode_force_unlock(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(FORCE_UNLOCK.name(), reply)),
    }
}

/// `source` without the helper files a script may start with (tests).
#[cfg(test)]
pub(crate) fn strip_preludes(source: &str) -> &str {
    let mut src = source;
    for lib in [
        include_str!("scripts/lock_acquire_free.lua"),
        include_str!("scripts/lock_release_last.lua"),
        include_str!("scripts/hold_lib.lua"),
        include_str!("scripts/line_lib.lua"),
        include_str!("scripts/handoff_lib.lua"),
        include_str!("scripts/fair_lib.lua"),
        include_str!("scripts/election_lib.lua"),
    ] {
        src = src.strip_prefix(lib).unwrap_or(src);
    }
    src
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_acquire() {
        assert_eq!(
            AcquireReply::decode(&[1, 2]),
            Ok(AcquireReply::Acquired {
                hold_count: 2,
                token: None
            })
        );
        assert_eq!(
            AcquireReply::decode(&[1, 1, 42]),
            Ok(AcquireReply::Acquired {
                hold_count: 1,
                token: Some(42)
            })
        );
        assert!(AcquireReply::decode(&[1, 1, 0]).is_err());
        assert_eq!(
            AcquireReply::decode(&[0, 10, 5]),
            Ok(AcquireReply::Busy {
                pttl_ms: Some(10),
                now_ms: 5
            })
        );
        assert_eq!(
            AcquireReply::decode(&[0, -1, 5]),
            Ok(AcquireReply::Busy {
                pttl_ms: None,
                now_ms: 5
            })
        );
        assert_eq!(
            AcquireReply::decode(&[0, 7, 5, 1]),
            Ok(AcquireReply::Reserved {
                window_ms: 7,
                now_ms: 5
            })
        );
        assert!(AcquireReply::decode(&[0, -1, 5, 1]).is_err());
        assert!(AcquireReply::decode(&[0, 7, 5, 2]).is_err());
        assert!(
            AcquireReply::decode(&[0, 7]).is_err(),
            "busy without the server clock"
        );
        assert!(AcquireReply::decode(&[1, 0]).is_err());
        assert!(AcquireReply::decode(&[0, -2, 5]).is_err());
        assert!(AcquireReply::decode(&[]).is_err());
    }

    #[test]
    fn decodes_release() {
        assert_eq!(ReleaseReply::decode(&[1, 0]), Ok(ReleaseReply::Freed));
        assert_eq!(
            ReleaseReply::decode(&[2, 1]),
            Ok(ReleaseReply::StillHeld { hold_count: 1 })
        );
        assert_eq!(ReleaseReply::decode(&[0, 0]), Ok(ReleaseReply::NotHeld));
        assert!(ReleaseReply::decode(&[2, 0]).is_err());
        assert!(ReleaseReply::decode(&[3]).is_err());
    }

    #[test]
    fn decodes_renew_and_force_unlock() {
        assert_eq!(decode_renew(&[1, 0, 1], 3), Ok(vec![true, false, true]));
        assert!(decode_renew(&[1, 0], 3).is_err());
        assert!(decode_renew(&[2], 1).is_err());
        assert_eq!(decode_force_unlock(&[1]), Ok(true));
        assert_eq!(decode_force_unlock(&[0]), Ok(false));
        assert!(decode_force_unlock(&[]).is_err());
        assert_eq!(decode_cancel(&[1]), Ok(true));
        assert_eq!(decode_cancel(&[0]), Ok(false));
        assert!(decode_cancel(&[2]).is_err());
    }

    #[test]
    fn hold_entries_are_read_back() {
        assert_eq!(
            HoldEntry::parse("#c:1", "12 an owner with spaces"),
            Some(HoldEntry {
                expiry_ms: 12,
                owner: "an owner with spaces".into()
            })
        );
        for (field, value) in [
            ("#c:1", "c:task-1"),
            ("#c:1", " x"),
            ("#c:1", "1x y"),
            ("o", "1 x"),
        ] {
            assert_eq!(HoldEntry::parse(field, value), None, "{field} {value}");
        }
    }

    #[test]
    fn the_scripts_use_the_window_and_probation_of_this_crate() {
        let window = format!("local HANDOFF_WINDOW_MS = {}\n", HANDOFF_WINDOW.as_millis());
        let probation = format!("local PROBATION_MS = {}\n", GRANT_PROBATION.as_millis());
        for script in [
            &RELEASE,
            &CANCEL,
            &FORCE_UNLOCK,
            &crate::fenced_lock::RELEASE,
        ] {
            assert!(script.source().contains("hand_over("), "{}", script.name());
            assert!(script.source().contains(&window), "{}", script.name());
            assert!(script.source().contains(&probation), "{}", script.name());
        }
    }

    #[test]
    fn every_script_documents_its_contract() {
        for script in [&ACQUIRE, &RELEASE, &RENEW, &CANCEL, &FORCE_UNLOCK] {
            // Most start with the hold and handoff helpers, written once.
            let src = strip_preludes(script.source());
            assert!(
                src.starts_with(&format!("-- {}:", script.name())),
                "{}",
                script.name()
            );
            assert!(
                src.contains("KEYS[") && src.contains("Reply"),
                "{}",
                script.name()
            );
        }
    }
}
