//! The fenced lock: a reentrant lock (same layout as [`crate::lock`]) whose every acquisition
//! mints a fencing token from a counter that only grows.
//!
//! Replies are decoded by [`crate::lock::AcquireReply`] and [`crate::lock::ReleaseReply`].
//! Release and renewal follow the plain lock's scripts' conventions: the fenced release also drops
//! the hold's token field; renewal uses `lock_renew` (it looks at the first key of each hold).

use crate::script::Script;

/// Take one hold and mint its token.
pub static ACQUIRE: Script = Script::new(
    "fenced_lock_acquire",
    include_str!("scripts/fenced_lock_acquire.lua"),
);
/// Give back one hold.
pub static RELEASE: Script = Script::new(
    "fenced_lock_release",
    include_str!("scripts/fenced_lock_release.lua"),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_document_their_contract() {
        for script in [&ACQUIRE, &RELEASE] {
            let src = script.source();
            assert!(src.starts_with(&format!("-- {}:", script.name())));
            assert!(src.contains("KEYS[") && src.contains("Reply"));
        }
    }
}
