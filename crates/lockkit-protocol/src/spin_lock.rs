//! The spin lock: the seed's plain `SET key marker NX PX lease` with a compare-and-delete
//! release. Not reentrant, no pub/sub: waiters poll with capped exponential backoff.

use crate::script::Script;
use crate::DecodeError;

/// Take the lock.
pub static ACQUIRE: Script = Script::new(
    "spin_lock_acquire",
    include_str!("scripts/spin_lock_acquire.lua"),
);
/// Give it back (compare-and-delete); replies as [`crate::lock::ReleaseReply`].
pub static RELEASE: Script = Script::new(
    "spin_lock_release",
    include_str!("scripts/spin_lock_release.lua"),
);
/// Extend or check many holds (the watchdog's batch); decoded by [`crate::lock::decode_renew`].
pub static RENEW: Script = Script::new(
    "spin_lock_renew",
    include_str!("scripts/spin_lock_renew.lua"),
);

/// Reply of [`ACQUIRE`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireReply {
    /// Taken.
    Acquired,
    /// Held; the holder's remaining lease in ms (`None`: no expiry).
    Busy {
        /// The holder's remaining lease in milliseconds.
        pttl_ms: Option<u64>,
    },
}

impl AcquireReply {
    /// Decodes the script's reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [1] => Ok(Self::Acquired),
            [0, pttl] if pttl >= 0 => Ok(Self::Busy {
                pttl_ms: Some(pttl.unsigned_abs()),
            }),
            [0, -1] => Ok(Self::Busy { pttl_ms: None }),
            _ => Err(DecodeError::new(ACQUIRE.name(), reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_acquire() {
        assert_eq!(AcquireReply::decode(&[1]), Ok(AcquireReply::Acquired));
        assert_eq!(
            AcquireReply::decode(&[0, 9]),
            Ok(AcquireReply::Busy { pttl_ms: Some(9) })
        );
        assert!(AcquireReply::decode(&[0, -2]).is_err());
        assert!(AcquireReply::decode(&[2]).is_err());
    }

    #[test]
    fn scripts_document_their_contract() {
        for script in [&ACQUIRE, &RELEASE, &RENEW] {
            let src = script.source();
            assert!(src.starts_with(&format!("-- {}:", script.name())));
            assert!(src.contains("KEYS[") && src.contains("Reply"));
        }
    }
}
