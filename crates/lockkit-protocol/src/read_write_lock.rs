//! The read-write lock: many readers or one writer, reentrant per owner, every hold with an
//! expiry of its own, and a FIFO line of waiting calls granted directly by releases.
//!
//! Four keys per lock (see `scripts/rwlock_acquire.lua`). The main key is a HASH:
//!
//! | field         | value |
//! |---------------|-------|
//! | `mode`        | `read` (only read holds) or `write` (one owner's write holds, plus maybe that owner's read holds) |
//! | `r:<owner>`   | that owner's read hold count |
//! | `w:<owner>`   | that owner's write hold count (one owner at most) |
//! | `#<hold id>`  | one outstanding hold (its marker); the value is the count field it belongs to, `r:<owner>` or `w:<owner>`, so it records the hold's mode and owner |
//!
//! The `expiries` key is a ZSET of the hold markers scored by each hold's **own** expiry, in
//! milliseconds of the server's clock (`TIME`). Every script first purges the holds whose expiry
//! has come, so a crashed reader's hold runs out on schedule however busy the other readers are
//! renewing theirs; both keys expire with the latest hold. Markers make every script idempotent
//! per request, as in [`lock`](crate::lock).
//!
//! The `waiting` and `timeouts` ZSETs are the line of waiting calls (`scripts/line_lib.lua`, the
//! lock's and the semaphores' line), a request being `<marker> <lease ms> <r|w>:<owner>
//! <channel>`. The line is **FIFO** (task-fair, as tokio's `RwLock`): a call that is not a
//! re-entry takes the lock only when nobody waits ahead of it, so a waiting writer holds back the
//! readers that come after it and is never starved by a stream of readers. Whatever frees the
//! lock (a release, a hold's lease found run out, a cancelled waiter's unclaimed grant, a forced
//! unlock) grants the line from its head (`grant_line` in `scripts/rwlock_lib.lua`): the head
//! writer when the lock is free, or every reader at the head up to the next writer while no writer
//! holds, each as a hold on probation told on its client's own channel with a
//! [`Grant`](crate::wake::Grant) message. Nobody else is told anything.
//!
//! | script | KEYS | ARGV | reply |
//! |---|---|---|---|
//! | [`ACQUIRE`] | hash, expiries, waiting, timeouts | owner, marker, lease ms, `r`/`w`, client channel, sharded?, keep-alive ms | [`AcquireReply`] |
//! | [`RELEASE`] | hash, expiries, waiting, timeouts | marker, channel, sharded? | [`ReleaseReply`](crate::lock::ReleaseReply) |
//! | [`RENEW`] | (hash, expiries, waiting, timeouts)… | (marker, lease ms, 0 or `@<server ms>`)… | one `1`/`0` per hold: [`decode_renew`](crate::lock::decode_renew) |
//! | [`STATUS`] | hash, expiries, … | owners | [`Status`] |
//! | [`FORCE_UNLOCK`] | hash, expiries, waiting, timeouts | channel, sharded? | [`decode_force_unlock`] |
//! | [`CANCEL`] | hash, expiries, waiting, timeouts | request, channel, sharded? | [`decode_cancel`] |

use crate::script::{with_prelude, Script};
use crate::DecodeError;

/// Take one read or write hold.
pub static ACQUIRE: Script = with_prelude!(["line_lib", "rwlock_lib"], "rwlock_acquire");
/// Give back one hold, read or write, and grant the line what that frees.
pub static RELEASE: Script = with_prelude!(["line_lib", "rwlock_lib"], "rwlock_release");
/// Extend or check many holds at once (the watchdog's batch, any number of keys per hold; also
/// the confirmation of a granted hold).
pub static RENEW: Script = with_prelude!(["line_lib", "rwlock_lib"], "rwlock_renew");
/// Report the mode and one owner's hold counts.
pub static STATUS: Script = with_prelude!(["line_lib", "rwlock_lib"], "rwlock_status");
/// Delete the lock whoever holds it, and grant it to the line.
pub static FORCE_UNLOCK: Script = with_prelude!(["line_lib", "rwlock_lib"], "rwlock_force_unlock");
/// Take a waiting call's request out of the line, giving back a grant it did not claim.
pub static CANCEL: Script = with_prelude!(["line_lib", "rwlock_lib"], "rwlock_cancel");

/// The two kinds of hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Shared with other readers.
    Read,
    /// Exclusive (except for the writer's own read holds).
    Write,
}

impl Mode {
    /// The mode as [`ACQUIRE`] takes it in `ARGV[4]`.
    ///
    /// ```
    /// use lockkit_protocol::read_write_lock::Mode;
    /// assert_eq!((Mode::Read.arg(), Mode::Write.arg()), ("r", "w"));
    /// ```
    pub fn arg(self) -> &'static str {
        match self {
            Mode::Read => "r",
            Mode::Write => "w",
        }
    }
}

/// Reply of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// The hold was taken.
    Acquired {
        /// The owner's hold count in the requested mode, including this hold.
        hold_count: u32,
    },
    /// Another owner's holds conflict, or others wait ahead of this call in the line.
    Busy {
        /// How long the holds in the way can last at most, in milliseconds; `None` when the key
        /// has no expiry (not written by lockkit).
        wait_ms: Option<u64>,
        /// The server's clock when the script ran, in milliseconds (a later grant's expiry is
        /// read against it).
        now_ms: u64,
    },
    /// A write hold was asked by an owner that holds only read holds: an upgrade, which could
    /// never be granted (the owner's own read holds block it).
    UpgradeRefused {
        /// The owner's read hold count.
        read_holds: u32,
    },
}

impl AcquireReply {
    /// Decodes the script's `{status, value}` (or `{0, wait, now}`) reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [1, count] if count > 0 => Ok(Self::Acquired {
                hold_count: saturate(count),
            }),
            [0, wait, now] if wait >= -1 && now >= 0 => Ok(Self::Busy {
                wait_ms: (wait >= 0).then_some(wait.unsigned_abs()),
                now_ms: now.unsigned_abs(),
            }),
            [2, count] if count > 0 => Ok(Self::UpgradeRefused {
                read_holds: saturate(count),
            }),
            _ => Err(DecodeError::new(ACQUIRE.name(), reply)),
        }
    }
}

/// Reply of [`STATUS`]: the lock's mode and the holds of the owners asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// `None` when the lock is free.
    pub mode: Option<Mode>,
    /// The owners' read hold count, summed.
    pub read_holds: u32,
    /// The owners' write hold count, summed.
    pub write_holds: u32,
    /// The lock's remaining TTL in milliseconds (the latest hold's expiry): `None` when free,
    /// `Some(u64::MAX)` when the key has no expiry (not written by lockkit).
    pub pttl_ms: Option<u64>,
}

impl Status {
    /// Decodes the script's `{mode, read_holds, write_holds, pttl}` reply.
    ///
    /// ```
    /// use lockkit_protocol::read_write_lock::{Mode, Status};
    /// let status = Status::decode(&[2, 1, 1, 900]).unwrap();
    /// assert_eq!(status.mode, Some(Mode::Write));
    /// assert_eq!(Status::decode(&[0, 0, 0, -2]).unwrap().mode, None);
    /// ```
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        let err = || DecodeError::new(STATUS.name(), reply);
        let [mode, read, write, pttl] = *reply else {
            return Err(err());
        };
        if read < 0 || write < 0 {
            return Err(err());
        }
        let mode = match (mode, pttl) {
            (0, -2) => None,
            (1, -1 | 0..) => Some(Mode::Read),
            (2, -1 | 0..) => Some(Mode::Write),
            _ => return Err(err()),
        };
        Ok(Self {
            mode,
            read_holds: saturate(read),
            write_holds: saturate(write),
            pttl_ms: match pttl {
                -2 => None,
                -1 => Some(u64::MAX),
                ms => Some(ms.unsigned_abs()),
            },
        })
    }
}

/// Decodes [`FORCE_UNLOCK`]'s reply: whether the lock was held.
pub fn decode_force_unlock(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(FORCE_UNLOCK.name(), reply)),
    }
}

/// Decodes [`CANCEL`]'s reply: whether the request was waiting (or granted) and left.
pub fn decode_cancel(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(CANCEL.name(), reply)),
    }
}

fn saturate(count: i64) -> u32 {
    u32::try_from(count).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::ReleaseReply;

    const SCRIPTS: [&Script; 6] = [&ACQUIRE, &RELEASE, &RENEW, &STATUS, &FORCE_UNLOCK, &CANCEL];

    #[test]
    fn decodes_acquire() {
        assert_eq!(
            AcquireReply::decode(&[1, 2]),
            Ok(AcquireReply::Acquired { hold_count: 2 })
        );
        assert_eq!(
            AcquireReply::decode(&[0, 0, 7]),
            Ok(AcquireReply::Busy {
                wait_ms: Some(0),
                now_ms: 7
            })
        );
        assert_eq!(
            AcquireReply::decode(&[0, 250, 9]),
            Ok(AcquireReply::Busy {
                wait_ms: Some(250),
                now_ms: 9
            })
        );
        assert_eq!(
            AcquireReply::decode(&[0, -1, 9]),
            Ok(AcquireReply::Busy {
                wait_ms: None,
                now_ms: 9
            })
        );
        assert_eq!(
            AcquireReply::decode(&[2, 3]),
            Ok(AcquireReply::UpgradeRefused { read_holds: 3 })
        );
        for bad in [
            &[1, 0][..],
            &[0, -2, 1],
            &[0, 5],
            &[0, 5, -1],
            &[2, 0],
            &[3, 1],
            &[1],
            &[1, 1, 1],
            &[],
        ] {
            assert!(AcquireReply::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn release_replies_follow_the_shared_convention() {
        // The runtime's release path decodes every kind's release with `lock::ReleaseReply`.
        assert_eq!(ReleaseReply::decode(&[1, 0]), Ok(ReleaseReply::Freed));
        assert_eq!(
            ReleaseReply::decode(&[2, 2]),
            Ok(ReleaseReply::StillHeld { hold_count: 2 })
        );
        assert_eq!(ReleaseReply::decode(&[0, 0]), Ok(ReleaseReply::NotHeld));
        let src = RELEASE.source();
        for reply in ["{1, 0}", "{2, held}", "{0, 0}"] {
            assert!(src.contains(reply), "{reply}");
        }
    }

    #[test]
    fn decodes_status() {
        assert_eq!(
            Status::decode(&[1, 2, 0, 1500]),
            Ok(Status {
                mode: Some(Mode::Read),
                read_holds: 2,
                write_holds: 0,
                pttl_ms: Some(1500),
            })
        );
        assert_eq!(
            Status::decode(&[0, 0, 0, -2]),
            Ok(Status {
                mode: None,
                read_holds: 0,
                write_holds: 0,
                pttl_ms: None,
            })
        );
        assert_eq!(
            Status::decode(&[2, 0, 1, -1]).map(|s| s.pttl_ms),
            Ok(Some(u64::MAX))
        );
        for bad in [
            &[3, 0, 0, 10][..],
            &[0, 0, 0, 10],
            &[1, 0, 0, -2],
            &[1, -1, 0, 10],
            &[1, 0, 0],
        ] {
            assert!(Status::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn decodes_force_unlock() {
        assert_eq!(decode_force_unlock(&[1]), Ok(true));
        assert_eq!(decode_force_unlock(&[0]), Ok(false));
        assert!(decode_force_unlock(&[2]).is_err());
        assert!(decode_force_unlock(&[]).is_err());
    }

    #[test]
    fn decodes_cancel() {
        assert_eq!(decode_cancel(&[1]), Ok(true));
        assert_eq!(decode_cancel(&[0]), Ok(false));
        assert!(decode_cancel(&[2]).is_err());
    }

    /// The helpers are written once (`line_lib.lua`, `rwlock_lib.lua`) and put in front of every
    /// script.
    #[test]
    fn every_script_is_the_helpers_then_its_documented_operation() {
        let lib = concat!(
            include_str!("scripts/line_lib.lua"),
            include_str!("scripts/rwlock_lib.lua")
        );
        assert!(lib.contains("local function purge"));
        for script in SCRIPTS {
            let op = script
                .source()
                .strip_prefix(lib)
                .expect("starts with the helpers");
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
            // Every script purges before it looks at the holds.
            assert!(op.contains("purge(key, expiries, "), "{}", script.name());
        }
    }
}
