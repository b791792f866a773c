//! The count-down latch: a count in a STRING, and the markers of recent requests in a ZSET.
//!
//! | key | type | content |
//! |---|---|---|
//! | `<prefix>:latch:{name}` | STRING | the count; absent = zero (the latch is open) |
//! | `<prefix>:latch.requests:{name}` | ZSET | member = request marker, score = when it ran (server ms) |
//!
//! Reaching zero deletes the count and publishes `all` on the latch's channel: every waiter
//! re-checks. Waiting itself reads the count (`GET`); only setting and counting down are scripts.
//!
//! Counting down is not naturally idempotent: fred re-sends a command that was in flight when a
//! connection dropped, and a second `DECR` would open the latch early. So every `try_set_count`
//! and `count_down` request carries a marker (unique per request), remembered for
//! [`REQUEST_WINDOW_MS`]: a re-send within that window finds its marker and changes nothing. The
//! markers outlive the count (a re-send that arrives after the latch opened is still recognised)
//! and expire on their own.

use crate::script::Script;
use crate::DecodeError;

/// Start the latch at a count, only if it is at zero.
pub static TRY_SET_COUNT: Script = Script::new(
    "latch_try_set_count",
    include_str!("scripts/latch_try_set_count.lua"),
);
/// Count down by one; at zero, delete and announce.
pub static COUNT_DOWN: Script = Script::new(
    "latch_count_down",
    include_str!("scripts/latch_count_down.lua"),
);

/// How long request markers are remembered, in milliseconds (10 minutes): far longer than a
/// re-send can be delayed (a command is re-sent within its command timeout, 5 s by default).
pub const REQUEST_WINDOW_MS: u64 = 10 * 60 * 1000;

/// Decodes [`TRY_SET_COUNT`]'s reply: whether this request set the count.
pub fn decode_try_set_count(reply: &[i64]) -> Result<bool, DecodeError> {
    match *reply {
        [1] => Ok(true),
        [0] => Ok(false),
        _ => Err(DecodeError::new(TRY_SET_COUNT.name(), reply)),
    }
}

/// Reply of [`COUNT_DOWN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountDownReply {
    /// Counted down; `count` is the new count (0: the latch opened and its waiters were woken).
    Counted {
        /// The count afterwards.
        count: u64,
    },
    /// Refused: the latch was already at zero.
    AlreadyZero,
}

impl CountDownReply {
    /// Decodes the script's `{status, count}` reply.
    pub fn decode(reply: &[i64]) -> Result<Self, DecodeError> {
        match *reply {
            [1, count] if count >= 0 => Ok(Self::Counted {
                count: count.unsigned_abs(),
            }),
            [0, 0] => Ok(Self::AlreadyZero),
            _ => Err(DecodeError::new(COUNT_DOWN.name(), reply)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_try_set_count() {
        assert_eq!(decode_try_set_count(&[1]), Ok(true));
        assert_eq!(decode_try_set_count(&[0]), Ok(false));
        assert!(decode_try_set_count(&[1, 0]).is_err());
    }

    #[test]
    fn decodes_count_down() {
        assert_eq!(
            CountDownReply::decode(&[1, 2]),
            Ok(CountDownReply::Counted { count: 2 })
        );
        assert_eq!(
            CountDownReply::decode(&[1, 0]),
            Ok(CountDownReply::Counted { count: 0 })
        );
        assert_eq!(
            CountDownReply::decode(&[0, 0]),
            Ok(CountDownReply::AlreadyZero)
        );
        for bad in [&[][..], &[1], &[1, -1], &[0, 1], &[2, 0]] {
            assert!(CountDownReply::decode(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_script_documents_its_contract() {
        for script in [&TRY_SET_COUNT, &COUNT_DOWN] {
            let src = script.source();
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
