//! The fenced lock: a reentrant lock (same layout as [`crate::lock`]) whose every acquisition
//! mints a fencing token from a counter that only grows.
//!
//! Replies are decoded by [`crate::lock::AcquireReply`] and [`crate::lock::ReleaseReply`].
//! Release and renewal follow the plain lock's scripts' conventions: the fenced release also drops
//! the hold's token field; renewal uses `lock_renew` (it looks at the first key of each hold).

use crate::script::{with_prelude, Script};

/// Take one hold and mint its token.
pub static ACQUIRE: Script = with_prelude!("handoff_lib", "fenced_lock_acquire");
/// Give back one hold.
pub static RELEASE: Script = with_prelude!("handoff_lib", "fenced_lock_release");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_document_their_contract() {
        let lib = include_str!("scripts/handoff_lib.lua");
        for script in [&ACQUIRE, &RELEASE] {
            let src = script
                .source()
                .strip_prefix(lib)
                .expect("the handoff helpers first");
            assert!(src.starts_with(&format!("-- {}:", script.name())));
            assert!(src.contains("KEYS[") && src.contains("Reply"));
        }
    }
}
