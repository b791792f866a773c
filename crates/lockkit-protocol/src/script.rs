//! A Lua script as a value: its name, source and SHA1, computed once.

use std::sync::OnceLock;

/// One Lua script of the protocol.
///
/// The runtime sends it with `EVALSHA` and falls back to `EVAL` (which also caches it) when the
/// server answers `NOSCRIPT`, as it does after a restart or failover.
///
/// ```
/// use lockkit_protocol::lock;
/// let script = &lock::ACQUIRE;
/// assert_eq!(script.name(), "lock_acquire");
/// assert_eq!(script.sha1().len(), 40);
/// ```
#[derive(Debug)]
pub struct Script {
    name: &'static str,
    source: &'static str,
    sha1: OnceLock<String>,
}

impl Script {
    /// A script with the given name (the file name without `.lua`) and source.
    pub const fn new(name: &'static str, source: &'static str) -> Self {
        Self {
            name,
            source,
            sha1: OnceLock::new(),
        }
    }

    /// The script's name, used in errors and traces.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The Lua source.
    pub fn source(&self) -> &'static str {
        self.source
    }

    /// The hex SHA1 of the source, as `SCRIPT LOAD` returns it.
    pub fn sha1(&self) -> &str {
        self.sha1
            .get_or_init(|| sha1_smol::Sha1::from(self.source).digest().to_string())
    }
}

/// A script assembled at compile time from shared preludes (`scripts/<prelude>.lua`: helper
/// functions written once, in the order given: a later prelude may use an earlier one's helpers)
/// followed by the operation's own file (`scripts/<name>.lua`, which starts with its
/// KEYS/ARGV/Reply header). `with_prelude!("lib", "name")` or
/// `with_prelude!(["lib_a", "lib_b"], "name")`.
///
/// `with_prelude!(first "common", ["lib_a"], "name")` puts `scripts/common.lua` in front of the
/// preludes: the operation's common case, written with no helper, which returns before Redis has
/// run a single prelude (each run of a script defines every function of its preludes anew, and
/// for a case of four commands that costs more than the commands).
macro_rules! with_prelude {
    ($prelude:literal, $name:literal) => {
        $crate::script::with_prelude!([$prelude], $name)
    };
    ([$($prelude:literal),+], $name:literal) => {
        $crate::script::Script::new(
            $name,
            concat!(
                $(include_str!(concat!("scripts/", $prelude, ".lua")),)+
                include_str!(concat!("scripts/", $name, ".lua"))
            ),
        )
    };
    (first $first:literal, [$($prelude:literal),+], $name:literal) => {
        $crate::script::Script::new(
            $name,
            concat!(
                include_str!(concat!("scripts/", $first, ".lua")),
                $(include_str!(concat!("scripts/", $prelude, ".lua")),)+
                include_str!(concat!("scripts/", $name, ".lua"))
            ),
        )
    };
}
pub(crate) use with_prelude;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_matches_known_digest() {
        // SHA1 of "return 1", as `redis-cli SCRIPT LOAD "return 1"` prints it.
        let s = Script::new("one", "return 1");
        assert_eq!(s.sha1(), "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
    }
}
