//! The fenced lock: a reentrant lock (same layout as [`crate::lock`], per-hold leases included)
//! whose every acquisition mints a fencing token.
//!
//! A token is `max(counter, server clock in µs) + 1`, so tokens never repeat even when the counter
//! goes back: Redis restarted from an older RDB/AOF snapshot, or failed over to a replica that had
//! not seen the last increments. The one assumption left: the server clock does not step back
//! further than such a restore rolled the counter back (and fewer than a million acquisitions
//! happen per second on average, or the counter runs ahead of the clock by that much).
//!
//! Replies are decoded by [`crate::lock::AcquireReply`] and [`crate::lock::ReleaseReply`].
//! Release, cancel and renewal follow the plain lock's scripts' conventions: the fenced release
//! also drops the hold's token field; renewal uses `lock_renew` (it looks at the first key of each
//! hold) and leaving the waiting set `lock_cancel`.

use crate::script::{with_prelude, Script};

/// Take one hold and mint its token.
pub static ACQUIRE: Script = with_prelude!(["hold_lib", "handoff_lib"], "fenced_lock_acquire");
/// Give back one hold.
pub static RELEASE: Script = with_prelude!(["hold_lib", "handoff_lib"], "fenced_lock_release");

#[cfg(test)]
mod tests {
    use super::*;

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
