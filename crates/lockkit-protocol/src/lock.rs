//! The reentrant lock: a HASH per lock with per-owner hold counts and one marker per hold.
//!
//! Layout of the lock key (see `scripts/lock_acquire.lua`):
//!
//! | field              | value                     |
//! |--------------------|---------------------------|
//! | `<owner id>`       | that owner's hold count   |
//! | `#<hold id>`       | the owner of that hold    |
//!
//! The key's TTL is the lease. An owner id is `<client id>:<task>`; a hold id is
//! `<client id>:<sequence>`, unique per acquire request. The marker makes every script idempotent
//! per request: an acquire re-sent after a dropped connection finds its marker and does not count
//! twice, a release takes away exactly the hold it names, and a renewal never revives a released
//! hold.
//!
//! Two more keys serve handoffs under contention: `<prefix>:lock.waiting:{name}`, a ZSET of the
//! owners that found the lock taken and wait, by when they first did, and
//! `<prefix>:lock.handoff:{name}`, the waiter a release reserved the free lock for, for
//! [`HANDOFF_WINDOW`]. Both are absent while nobody waits, so an uncontended acquire still costs
//! three commands.

use crate::script::{with_prelude, Script};
use crate::DecodeError;

/// Take one hold.
pub static ACQUIRE: Script = with_prelude!("handoff_lib", "lock_acquire");
/// Give back one hold.
pub static RELEASE: Script = with_prelude!("handoff_lib", "lock_release");
/// Extend or check many holds at once (the watchdog's batch).
pub static RENEW: Script = Script::new("lock_renew", include_str!("scripts/lock_renew.lua"));
/// Delete a lock whoever holds it.
pub static FORCE_UNLOCK: Script = Script::new(
    "lock_force_unlock",
    include_str!("scripts/lock_force_unlock.lua"),
);

/// How long a release that woke waiters reserves the free lock for the owner that has waited
/// longest (see `scripts/lock_release.lua`).
///
/// Every waiter is woken by a release, but they do not get the message at the same time: Redis
/// writes it to the newest subscriber first, and a task that locks again right after unlocking
/// needs no message at all. Without a reservation the newest waiters win every race and the
/// oldest starve. The reservation is short: a reserved waiter that does not come within the
/// window (it gave up, or its client died) loses its place and the lock is anyone's again.
pub const HANDOFF_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

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
    },
}

impl AcquireReply {
    /// Decodes the reply of [`ACQUIRE`] (`{1, count}` / `{0, pttl}`) or of
    /// [`fenced_lock::ACQUIRE`](crate::fenced_lock::ACQUIRE) (`{1, count, token}` / `{0, pttl}`).
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
            [0, pttl] if pttl >= 0 => Ok(Self::Busy {
                pttl_ms: Some(pttl.unsigned_abs()),
            }),
            [0, -1] => Ok(Self::Busy { pttl_ms: None }),
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

/// Decodes [`RENEW`]'s reply: for each hold, whether it is still there.
pub fn decode_renew(reply: &[i64], holds: usize) -> Result<Vec<bool>, DecodeError> {
    if reply.len() != holds || reply.iter().any(|v| *v != 0 && *v != 1) {
        return Err(DecodeError::new(RENEW.name(), reply));
    }
    Ok(reply.iter().map(|v| *v == 1).collect())
}

/// Decodes [`FORCE_UNLOCK`]'s reply: whether the lock existed.
pub fn decode_force_unlock(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(FORCE_UNLOCK.name(), reply)),
    }
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
            AcquireReply::decode(&[0, 10]),
            Ok(AcquireReply::Busy { pttl_ms: Some(10) })
        );
        assert_eq!(
            AcquireReply::decode(&[0, -1]),
            Ok(AcquireReply::Busy { pttl_ms: None })
        );
        assert!(AcquireReply::decode(&[1, 0]).is_err());
        assert!(AcquireReply::decode(&[0, -2]).is_err());
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
    }

    #[test]
    fn the_release_script_uses_the_handoff_window() {
        let line = format!("local HANDOFF_WINDOW_MS = {}\n", HANDOFF_WINDOW.as_millis());
        for script in [&RELEASE, &crate::fenced_lock::RELEASE] {
            assert!(
                script.source().contains("announce_release("),
                "{}",
                script.name()
            );
            assert!(script.source().contains(&line), "{}", script.name());
        }
    }

    #[test]
    fn every_script_documents_its_contract() {
        let lib = include_str!("scripts/handoff_lib.lua");
        for script in [&ACQUIRE, &RELEASE, &RENEW, &FORCE_UNLOCK] {
            // The acquire and the release start with the handoff helpers, written once.
            let src = script.source().strip_prefix(lib).unwrap_or(script.source());
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
