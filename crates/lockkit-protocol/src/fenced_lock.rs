//! The fenced lock: a reentrant lock (same layout as [`crate::lock`], per-hold leases included)
//! whose every acquisition mints a fencing token.
//!
//! A token is `max(counter, server clock in µs) + 1`, so tokens never repeat even when the counter
//! goes back: Redis restarted from an older RDB/AOF snapshot, or failed over to a replica that had
//! not seen the last increments. The one assumption left: the server clock does not step back
//! further than such a restore rolled the counter back (and fewer than a million acquisitions
//! happen per second on average, or the counter runs ahead of the clock by that much).
//!
//! The counter expires ([`DEFAULT_COUNTER_TTL`], or the TTL each minting script is given): every
//! mint sets it to expire once the server clock has passed the new token by the TTL
//! (`PEXPIREAT <token in ms> + 1 + TTL`). A token minted after that is the clock + 1, greater than
//! every token before it; so the expiry adds no assumption but that the clock does not step back
//! by more than the TTL after the counter is gone. No hold needs the counter: a hold's token is
//! kept in its own field of the lock's hash.
//!
//! Replies are decoded by [`crate::lock::AcquireReply`] and [`crate::lock::ReleaseReply`].
//! Release, cancel and renewal follow the plain lock's scripts' conventions: the fenced release
//! also drops the hold's token field; renewal uses `lock_renew` (it looks at the first key of each
//! hold) and leaving the waiting set `lock_cancel`.

use crate::script::{with_prelude, Script};

/// How long the token counter lives, by default, once the server clock has passed its value: one
/// day. A lock unused for that long leaves no key behind.
pub const DEFAULT_COUNTER_TTL: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The shortest token counter TTL a client accepts: one minute. The TTL is the margin against the
/// server clock stepping back after the counter expired, so it should stay well above any clock
/// correction the servers may see.
pub const MIN_COUNTER_TTL: std::time::Duration = std::time::Duration::from_secs(60);

/// The longest token counter TTL the scripts accept: 365 days.
pub const MAX_COUNTER_TTL: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);

/// Take one hold and mint its token.
pub static ACQUIRE: Script = with_prelude!(
    ["hold_lib", "line_lib", "handoff_lib"],
    "fenced_lock_acquire"
);
/// Give back one hold.
pub static RELEASE: Script = with_prelude!(
    ["hold_lib", "line_lib", "handoff_lib"],
    "fenced_lock_release"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scripts_use_the_counter_ttls_of_this_crate() {
        let default = format!(
            "local COUNTER_TTL_MS = {}\n",
            DEFAULT_COUNTER_TTL.as_millis()
        );
        let max = format!(
            "local MAX_COUNTER_TTL_MS = {}\n",
            MAX_COUNTER_TTL.as_millis()
        );
        for script in [
            &ACQUIRE,
            &RELEASE,
            &crate::lock::CANCEL,
            &crate::lock::FORCE_UNLOCK,
        ] {
            let src = script.source();
            assert!(src.contains(&default), "{}", script.name());
            assert!(src.contains(&max), "{}", script.name());
            // Every script that may mint takes the TTL before it writes.
            let own = crate::lock::strip_preludes(src);
            assert!(own.contains("use_counter_ttl(ARGV["), "{}", script.name());
        }
    }

    #[test]
    fn scripts_document_their_contract() {
        for script in [&ACQUIRE, &RELEASE] {
            let src = crate::lock::strip_preludes(script.source());
            assert_ne!(src, script.source(), "the helpers first");
            assert!(src.starts_with(&format!("-- {}:", script.name())));
            assert!(src.contains("KEYS[") && src.contains("Reply"));
        }
    }
}
