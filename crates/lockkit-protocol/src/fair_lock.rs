//! The fair lock: a reentrant lock (same HASH as [`crate::lock`]) granted in request order, with a
//! queue of waiters that keep their place alive.
//!
//! Three keys per lock, in the order the scripts take them (see `scripts/fair_lock_acquire.lua`):
//!
//! | key | type | content |
//! |-----|------|---------|
//! | `<prefix>:fair:{name}` | HASH | `<owner id>` → hold count, `#<hold id>` → `<expiry> <owner>` (as the reentrant lock: every hold has its own lease); expires with the latest live hold |
//! | `<prefix>:fair.queue:{name}` | LIST | waiter ids in request order; the head is next in line |
//! | `<prefix>:fair.timeouts:{name}` | ZSET | waiter id → deadline, in server milliseconds (`TIME`) |
//!
//! A waiter id ([`waiter_id`]) is unique per acquire *call*, so every retry of one call keeps its
//! place. A waiter is in the queue exactly when it has a deadline; each retry pushes the deadline
//! to now + the waiter's keep-alive, and every script first drops waiters at the head whose
//! deadline has passed: a waiter that dies keeps its place for at most its keep-alive.
//!
//! The lock is granted to its owner again (re-entry) at any time; otherwise only when it is free
//! and the queue is empty or headed by the caller. A release that frees the lock publishes
//! `w:<id of the head>` ([`Wake::Waiter`](crate::wake::Wake::Waiter)) on the head's own client's
//! channel for the lock ([`ObjectKeys::client_channel`](crate::keys::ObjectKeys::client_channel),
//! the client id being what precedes `:w` in the waiter id), so only the next waiter's client
//! hears it and only that waiter wakes; nothing when nobody is queued. Each client subscribes to
//! its own channel only.
//!
//! Release and renewal follow the conventions every hold kind shares: release replies are decoded
//! by [`ReleaseReply`](crate::lock::ReleaseReply); holds are renewed by the reentrant lock's
//! [`RENEW`](crate::lock::RENEW) (three keys per hold), whose replies
//! [`decode_renew`](crate::lock::decode_renew) decodes.

use crate::script::{with_prelude, Script};
use crate::DecodeError;

/// Take one hold, or join (or stay in) the queue.
pub static ACQUIRE: Script = with_prelude!(["hold_lib", "fair_lib"], "fair_lock_acquire");
/// Give back one hold; when the lock is freed, name the next waiter.
pub static RELEASE: Script = with_prelude!(["hold_lib", "fair_lib"], "fair_lock_release");
/// Delete a fair lock whoever holds it; the queue is kept and its head woken.
pub static FORCE_UNLOCK: Script = with_prelude!("fair_lib", "fair_lock_force_unlock");
/// Take a waiter that stopped waiting out of the queue, and pass its turn on.
pub static CANCEL: Script = with_prelude!("fair_lib", "fair_lock_cancel");

/// The id of one waiter (one acquire call) of a fair lock.
///
/// ```
/// assert_eq!(lockkit_protocol::fair_lock::waiter_id("c1", 7), "c1:w7");
/// ```
pub fn waiter_id(client_id: &str, sequence: u64) -> String {
    format!("{client_id}:w{sequence}")
}

/// Reply of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The hold was taken; the owner now holds the lock `hold_count` times.
    Acquired {
        /// The owner's hold count including this hold.
        hold_count: u32,
    },
    /// Not granted (and, unless the request asked to try once, the waiter is queued).
    Busy {
        /// For how long, at most, nothing changes for this waiter unless a message says so: the
        /// holder's remaining lease while the lock is held, else the time the waiter first in line
        /// has left to take it. `None` when the lock key has no expiry.
        wait_ms: Option<u64>,
    },
}

impl AcquireReply {
    /// Decodes the script's `{status, value}` reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [1, count] if count > 0 => Ok(Self::Acquired {
                hold_count: u32::try_from(count).unwrap_or(u32::MAX),
            }),
            [0, wait] if wait >= 0 => Ok(Self::Busy {
                wait_ms: Some(wait.unsigned_abs()),
            }),
            [0, -1] => Ok(Self::Busy { wait_ms: None }),
            _ => Err(DecodeError::new(ACQUIRE.name(), reply)),
        }
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

/// Decodes [`CANCEL`]'s reply: whether the waiter was still queued.
pub fn decode_cancel(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(CANCEL.name(), reply)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::{Kind, Namespace};

    #[test]
    fn decodes_acquire() {
        assert_eq!(
            AcquireReply::decode(&[1, 3]),
            Ok(AcquireReply::Acquired { hold_count: 3 })
        );
        assert_eq!(
            AcquireReply::decode(&[0, 250]),
            Ok(AcquireReply::Busy { wait_ms: Some(250) })
        );
        assert_eq!(
            AcquireReply::decode(&[0, 0]),
            Ok(AcquireReply::Busy { wait_ms: Some(0) })
        );
        assert_eq!(
            AcquireReply::decode(&[0, -1]),
            Ok(AcquireReply::Busy { wait_ms: None })
        );
        assert!(AcquireReply::decode(&[1, 0]).is_err());
        assert!(AcquireReply::decode(&[0, -2]).is_err());
        assert!(AcquireReply::decode(&[2, 1]).is_err());
        assert!(AcquireReply::decode(&[1]).is_err());
        assert!(AcquireReply::decode(&[]).is_err());
    }

    #[test]
    fn decodes_force_unlock_and_cancel() {
        assert_eq!(decode_force_unlock(&[1]), Ok(true));
        assert_eq!(decode_force_unlock(&[0]), Ok(false));
        assert!(decode_force_unlock(&[2]).is_err());
        assert_eq!(decode_cancel(&[1]), Ok(true));
        assert_eq!(decode_cancel(&[0]), Ok(false));
        assert!(decode_cancel(&[1, 0]).is_err());
        let err = decode_cancel(&[]).unwrap_err();
        assert_eq!(err.script, "fair_lock_cancel");
    }

    #[test]
    fn keys_come_in_script_order() {
        let keys = Namespace::default()
            .object(Kind::FairLock, "order:42")
            .unwrap();
        assert_eq!(
            keys.keys,
            [
                "lockkit:fair:{order:42}",
                "lockkit:fair.queue:{order:42}",
                "lockkit:fair.timeouts:{order:42}",
            ]
        );
    }

    #[test]
    fn every_script_documents_its_contract() {
        for script in [&ACQUIRE, &RELEASE, &FORCE_UNLOCK, &CANCEL] {
            let src = crate::lock::strip_preludes(script.source());
            assert!(
                src.starts_with(&format!("-- {}:", script.name())),
                "{}",
                script.name()
            );
            assert!(
                src.contains("KEYS[") && src.contains("ARGV[") && src.contains("Reply"),
                "{}",
                script.name()
            );
        }
    }

    #[test]
    fn scripts_that_free_or_reorder_purge_stale_waiters_by_server_time() {
        for script in [&ACQUIRE, &RELEASE, &FORCE_UNLOCK, &CANCEL] {
            let src = script.source();
            assert!(
                src.contains("redis.call('TIME')") && src.contains("LPOP"),
                "{}",
                script.name()
            );
        }
    }
}
