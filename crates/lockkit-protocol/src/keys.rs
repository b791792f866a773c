//! Key and channel naming.
//!
//! Every object (a lock, and in later primitives a semaphore, a latch, ...) is known by a user
//! name. Its main key is `<prefix>:<kind>:<tagged name>`, its other keys (a fair lock's queue, a
//! fenced lock's token counter, ...) `<prefix>:<kind>.<suffix>:<tagged name>`, and its channel
//! `<prefix>:<kind>:<tagged name>:released`, where the tagged name carries a Redis Cluster hash
//! tag:
//!
//! - a name that already holds a valid tag (`{` followed later by `}` with at least one byte
//!   between) keeps it, so users can co-locate objects on purpose (`cart:{user42}` and
//!   `wallet:{user42}` share a slot);
//! - any other name is wrapped whole: `order:42` becomes `{order:42}`;
//! - a name that contains `}` but no valid tag (say `}x`) would make an empty tag when wrapped, so
//!   its tag is the name with every `}` replaced by `_`, followed by the name itself:
//!   `}x` becomes `{_x}}x` (the *escaped* form).
//!
//! A name that is itself the wrapped or escaped form of another name (`{a}` is how `a` is
//! written, `{_x}}x` how `}x` is) is escaped too, rather than kept: `{a}` becomes `{{a_}{a}`.
//! So distinct names never share a key — not even names chosen to collide. The suffix of an
//! auxiliary key goes into the kind segment (`fair.queue`), never after the name: a name may end
//! in anything (`{a}:queue` is a valid name, kept as it is), so `<main key>:queue` could be the
//! main key of another object; no kind segment contains a `.`, so `<prefix>:fair.queue:…` can
//! not.
//!
//! The prefix may not contain braces, so the first `{` of every key is the tag's.

use std::borrow::Cow;

/// The longest object name accepted, in bytes.
pub const MAX_NAME_LEN: usize = 4096;

/// The default key prefix.
pub const DEFAULT_PREFIX: &str = "lockkit";

/// A name or prefix that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The object name is empty.
    #[error("the name is empty")]
    EmptyName,
    /// The object name is longer than [`MAX_NAME_LEN`].
    #[error("the name is {len} bytes long; at most {max} are accepted")]
    NameTooLong {
        /// The name's length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The prefix is empty or contains `{` or `}`.
    #[error("invalid key prefix {0:?}: it must be non-empty and contain no braces")]
    BadPrefix(String),
}

/// The key space of one application: a prefix shared by all of its keys and channels.
///
/// ```
/// use lockkit_protocol::keys::Namespace;
/// let ns = Namespace::new("billing").unwrap();
/// assert_eq!(ns.lock("invoice:7").unwrap().key, "billing:lock:{invoice:7}");
/// assert!(Namespace::new("bad{prefix").is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Namespace {
    prefix: String,
}

impl Default for Namespace {
    fn default() -> Self {
        Self {
            prefix: DEFAULT_PREFIX.to_owned(),
        }
    }
}

/// The kinds of object lockkit keeps in Redis. Each kind has its own key segment, so objects of
/// different kinds with the same name never collide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// A reentrant lock.
    Lock,
    /// A reentrant lock whose acquisitions carry fencing tokens.
    FencedLock,
    /// A reentrant lock granted in request order.
    FairLock,
    /// A reentrant read-write lock.
    ReadWriteLock,
    /// A plain, non-reentrant lock (`SET NX PX`).
    SpinLock,
    /// A counting semaphore with leased permits.
    Semaphore,
    /// A semaphore whose permits have ids and leases of their own.
    PermitExpirableSemaphore,
    /// A count-down latch.
    CountDownLatch,
    /// The mark of a job run at most once per window (`Client::once_per`): a plain string key
    /// set with `NX PX <window>`, left to expire.
    OnceMark,
    /// A leader election: its leadership is a fenced hold of its main key (the fenced lock's
    /// keys and scripts), the term is the hold's fencing token, and the leader's announced value
    /// lives in its own record (see [`crate::election`]).
    Election,
    /// A rate limiter: its limit and (in the overall mode) its schedule in one HASH, the
    /// reservations still to come in a ZSET (see [`crate::rate_limiter`]).
    RateLimiter,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 11] = [
        Kind::Lock,
        Kind::FencedLock,
        Kind::FairLock,
        Kind::ReadWriteLock,
        Kind::SpinLock,
        Kind::Semaphore,
        Kind::PermitExpirableSemaphore,
        Kind::CountDownLatch,
        Kind::OnceMark,
        Kind::Election,
        Kind::RateLimiter,
    ];

    /// The kind's segment in keys (`lockkit:<segment>:{name}`).
    pub fn segment(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::FencedLock => "fenced",
            Kind::FairLock => "fair",
            Kind::ReadWriteLock => "rwlock",
            Kind::SpinLock => "spin",
            Kind::Semaphore => "semaphore",
            Kind::PermitExpirableSemaphore => "psemaphore",
            Kind::CountDownLatch => "latch",
            Kind::OnceMark => "once",
            Kind::Election => "election",
            Kind::RateLimiter => "ratelimiter",
        }
    }

    /// A human name, for errors and logs.
    pub fn describe(self) -> &'static str {
        match self {
            Kind::Lock => "lock",
            Kind::FencedLock => "fenced lock",
            Kind::FairLock => "fair lock",
            Kind::ReadWriteLock => "read-write lock",
            Kind::SpinLock => "spin lock",
            Kind::Semaphore => "semaphore",
            Kind::PermitExpirableSemaphore => "permit-expirable semaphore",
            Kind::CountDownLatch => "count-down latch",
            Kind::OnceMark => "once-per-window job mark",
            Kind::Election => "election",
            Kind::RateLimiter => "rate limiter",
        }
    }

    /// The suffixes of the kind's keys after the main one, in the order its scripts take them.
    pub fn aux_suffixes(self) -> &'static [&'static str] {
        match self {
            Kind::FencedLock => &["token", "handoff", "waiting", "timeouts"],
            // The fenced lock's four first: its scripts run unchanged on KEYS[1..5].
            Kind::Election => &["token", "handoff", "waiting", "timeouts", "leader"],
            Kind::FairLock => &["queue", "timeouts"],
            Kind::Semaphore | Kind::PermitExpirableSemaphore => &["leases", "waiting", "timeouts"],
            Kind::ReadWriteLock => &["expiries", "waiting", "timeouts"],
            Kind::CountDownLatch => &["requests"],
            Kind::RateLimiter => &["waiting"],
            Kind::Lock => &["handoff", "waiting", "timeouts"],
            Kind::SpinLock | Kind::OnceMark => &[],
        }
    }
}

/// The keys and channel of one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectKeys {
    /// The main key: `<prefix>:<segment>:<tagged name>`.
    pub key: String,
    /// The pub/sub channel on which releases (or, for a latch, the count reaching zero) are
    /// announced.
    pub channel: String,
    /// Every key of the object, the main key first, in the order its scripts take them as `KEYS`.
    pub keys: Vec<String>,
    /// The suffixes of `keys[1..]`, in the same order ([`Kind::aux_suffixes`]).
    pub suffixes: &'static [&'static str],
}

impl ObjectKeys {
    /// The auxiliary key with this suffix (`queue`, `token`, ...), if the object has one.
    ///
    /// ```
    /// use lockkit_protocol::keys::{Kind, Namespace};
    /// let keys = Namespace::default().object(Kind::FairLock, "order:42").unwrap();
    /// assert_eq!(keys.aux("queue"), Some("lockkit:fair.queue:{order:42}"));
    /// assert_eq!(keys.aux("token"), None);
    /// ```
    pub fn aux(&self, suffix: &str) -> Option<&str> {
        let index = self.suffixes.iter().position(|s| *s == suffix)?;
        self.keys.get(index + 1).map(String::as_str)
    }

    /// The channel of one client for this object: `<channel>:<client id>`. A lock's or fenced
    /// lock's release grants the lock to one waiting client and tells only it, here (see
    /// [`crate::lock`]); it carries the object's hash tag, so a script may publish on it in a
    /// cluster.
    ///
    /// ```
    /// use lockkit_protocol::{keys::Namespace, slot::key_slot};
    /// let keys = Namespace::default().lock("order:42").unwrap();
    /// let mine = keys.client_channel("3f2a");
    /// assert_eq!(mine, "lockkit:lock:{order:42}:released:3f2a");
    /// assert_eq!(key_slot(&mine), key_slot(&keys.key));
    /// ```
    pub fn client_channel(&self, client_id: &str) -> String {
        format!("{}:{client_id}", self.channel)
    }
}

/// The keys of a reentrant lock: its HASH (owners, hold counts, hold markers) and channel.
pub type LockKeys = ObjectKeys;

impl Namespace {
    /// A namespace with the given prefix.
    pub fn new(prefix: impl Into<String>) -> Result<Self, KeyError> {
        let prefix = prefix.into();
        if prefix.is_empty() || prefix.contains(['{', '}']) {
            return Err(KeyError::BadPrefix(prefix));
        }
        Ok(Self { prefix })
    }

    /// The prefix of every key and channel.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The base `<prefix>:<kind>:<tagged name>` of an object's keys.
    pub fn object_base(&self, kind: &str, name: &str) -> Result<String, KeyError> {
        validate_name(name)?;
        let tagged = tagged_name(name);
        let mut base = String::with_capacity(self.prefix.len() + kind.len() + tagged.len() + 2);
        base.push_str(&self.prefix);
        base.push(':');
        base.push_str(kind);
        base.push(':');
        base.push_str(&tagged);
        Ok(base)
    }

    /// The keys of the object of `kind` called `name`.
    pub fn object(&self, kind: Kind, name: &str) -> Result<ObjectKeys, KeyError> {
        let key = self.object_base(kind.segment(), name)?;
        let channel = format!("{key}:released");
        let mut keys = Vec::with_capacity(1 + kind.aux_suffixes().len());
        keys.push(key.clone());
        for suffix in kind.aux_suffixes() {
            keys.push(self.object_base(&format!("{}.{suffix}", kind.segment()), name)?);
        }
        Ok(ObjectKeys {
            key,
            channel,
            keys,
            suffixes: kind.aux_suffixes(),
        })
    }

    /// The keys of the reentrant lock called `name`.
    pub fn lock(&self, name: &str) -> Result<LockKeys, KeyError> {
        self.object(Kind::Lock, name)
    }
}

/// Checks that `name` can name an object.
pub fn validate_name(name: &str) -> Result<(), KeyError> {
    if name.is_empty() {
        return Err(KeyError::EmptyName);
    }
    if name.len() > MAX_NAME_LEN {
        return Err(KeyError::NameTooLong {
            len: name.len(),
            max: MAX_NAME_LEN,
        });
    }
    Ok(())
}

/// The part of `key` that Redis Cluster hashes: the content of the first `{…}` when it is
/// non-empty, else the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// `name` with a hash tag, following the rules in the module docs.
pub fn tagged_name(name: &str) -> Cow<'_, str> {
    if hash_tag(name.as_bytes()).len() < name.len() && !is_tagged_form(name) {
        return Cow::Borrowed(name);
    }
    if !name.contains('}') {
        return Cow::Owned(format!("{{{name}}}"));
    }
    Cow::Owned(format!("{{{}}}{name}", name.replace('}', "_")))
}

/// Whether `name` has the shape of what [`tagged_name`] makes of a name it does not keep: the
/// wrapped form `{n}` (n without `}`) or the escaped form `{t}n` (n with a `}`, t = n with every
/// `}` replaced by `_`). Such a name must not be kept as it is, or it would share its key with
/// the name it looks like.
fn is_tagged_form(name: &str) -> bool {
    let Some(rest) = name.strip_prefix('{') else {
        return false;
    };
    if let Some(inner) = rest.strip_suffix('}') {
        if !inner.is_empty() && !inner.contains('}') {
            return true;
        }
    }
    // `}` and `_` are one byte each, so t and n have the same length.
    let half = rest.len().saturating_sub(1) / 2;
    match (
        rest.get(..half),
        rest.get(half..half + 1),
        rest.get(half + 1..),
    ) {
        (Some(tag), Some("}"), Some(inner)) if inner.len() == half && inner.contains('}') => {
            tag == inner.replace('}', "_")
        }
        _ => false,
    }
}

/// A key of lockkit's key space, read back by [`Namespace::parse`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ParsedKey {
    /// The kind of the object the key belongs to.
    pub kind: Kind,
    /// The object's name, as the user wrote it.
    pub name: String,
    /// `None` for the object's main key; else the auxiliary key's suffix (`queue`, `token`, ...),
    /// `released` for its channel, or `client` for a rate limiter's per-client schedule
    /// (`<prefix>:ratelimiter.client:<tagged name>:<client id>`).
    pub suffix: Option<&'static str>,
}

impl Namespace {
    /// Reads a key (or channel) of this namespace back into the object it belongs to: the inverse
    /// of [`Namespace::object`]. `None` for a key that no object of this namespace has.
    ///
    /// ```
    /// use lockkit_protocol::keys::{Kind, Namespace};
    /// let ns = Namespace::default();
    /// let parsed = ns.parse("lockkit:fair.queue:{order:42}").unwrap();
    /// assert_eq!((parsed.kind, parsed.name.as_str(), parsed.suffix), (Kind::FairLock, "order:42", Some("queue")));
    /// assert_eq!(ns.parse("lockkit:lock:{a}").unwrap().suffix, None);
    /// // A channel's text is also the main key of another name (`{a}:released`): it reads as that.
    /// assert_eq!(ns.parse("lockkit:lock:{a}:released").unwrap().name, "{a}:released");
    /// assert!(ns.parse("other:lock:{a}").is_none());
    /// let schedule = ns.parse("lockkit:ratelimiter.client:{api}:3f2a").unwrap();
    /// assert_eq!((schedule.kind, schedule.name.as_str(), schedule.suffix), (Kind::RateLimiter, "api", Some("client")));
    /// ```
    pub fn parse(&self, key: &str) -> Option<ParsedKey> {
        let rest = key.strip_prefix(self.prefix.as_str())?.strip_prefix(':')?;
        let (segment, tagged) = rest.split_once(':')?;
        let (segment, suffix) = match segment.split_once('.') {
            Some((segment, suffix)) => (segment, Some(suffix)),
            None => (segment, None),
        };
        let kind = Kind::ALL
            .into_iter()
            .find(|kind| kind.segment() == segment)?;
        if kind == Kind::RateLimiter && suffix == Some("client") {
            // A rate limiter's per-client schedule: `<tagged name>:<client id>`.
            let (tagged, _client) = tagged.rsplit_once(':')?;
            return untagged_name(tagged).map(|name| ParsedKey {
                kind,
                name,
                suffix: Some("client"),
            });
        }
        if let Some(suffix) = suffix {
            let suffix = *kind.aux_suffixes().iter().find(|s| **s == suffix)?;
            return untagged_name(tagged).map(|name| ParsedKey {
                kind,
                name,
                suffix: Some(suffix),
            });
        }
        if let Some(name) = untagged_name(tagged) {
            return Some(ParsedKey {
                kind,
                name,
                suffix: None,
            });
        }
        // A channel: the main key followed by `:released`.
        let name = untagged_name(tagged.strip_suffix(":released")?)?;
        Some(ParsedKey {
            kind,
            name,
            suffix: Some("released"),
        })
    }
}

/// The name whose [`tagged_name`] is `tagged`, if there is one.
pub fn untagged_name(tagged: &str) -> Option<String> {
    let candidate = match tagged.strip_prefix('{') {
        // The wrapped form `{n}`.
        Some(rest) if rest.len() > 1 && rest.find('}') == Some(rest.len() - 1) => {
            &rest[..rest.len() - 1]
        }
        // The escaped form `{t}n`, t and n of the same length.
        Some(rest) if is_tagged_form(tagged) => &rest[rest.len().saturating_sub(1) / 2 + 1..],
        _ => tagged,
    };
    (validate_name(candidate).is_ok() && tagged_name(candidate) == tagged)
        .then(|| candidate.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every name of 1 to `max_len` characters over `alphabet`.
    fn names(alphabet: &[char], max_len: usize) -> Vec<String> {
        let mut names = vec![String::new()];
        let mut all = Vec::new();
        for _ in 0..max_len {
            names = names
                .iter()
                .flat_map(|n| alphabet.iter().map(move |c| format!("{n}{c}")))
                .collect();
            all.extend(names.iter().cloned());
        }
        all
    }

    #[test]
    fn distinct_names_never_share_a_key() {
        // Every name of up to 6 characters over an alphabet of braces and two letters: 5,460
        // names, among them every tricky shape (`{a}`, `{_x}}x`, `}{`, `{{}}`, ...).
        let all = names(&['{', '}', 'a', '_'], 6);
        let mut seen = std::collections::HashMap::new();
        for name in &all {
            let tagged = tagged_name(name).into_owned();
            let tag = hash_tag(tagged.as_bytes());
            assert!(!tag.is_empty() && tag.len() < tagged.len(), "{name:?}");
            if let Some(other) = seen.insert(tagged.clone(), name) {
                panic!("{other:?} and {name:?} share the key part {tagged:?}");
            }
        }
    }

    #[test]
    fn no_key_of_one_object_is_a_key_of_another() {
        // Names over an alphabet that can spell suffixes (`{a}:queue`-like shapes need `:` and
        // letters): every key of every object of every kind, main and auxiliary, is distinct.
        let mut all = names(&['{', '}', 'a', ':'], 5);
        // The shapes that collided when suffixes followed the name.
        for kind in Kind::ALL {
            for suffix in kind.aux_suffixes() {
                all.push(format!("{{a}}:{suffix}"));
                all.push(format!("{{{{a_}}{{a}}:{suffix}"));
            }
        }
        all.sort_unstable();
        all.dedup();
        let ns = Namespace::default();
        let mut seen = std::collections::HashMap::new();
        for name in &all {
            for kind in Kind::ALL {
                for key in ns.object(kind, name).unwrap().keys {
                    if let Some(other) = seen.insert(key.clone(), (kind, name.clone())) {
                        panic!("{other:?} and {:?} share the key {key:?}", (kind, name));
                    }
                }
            }
        }
    }

    #[test]
    fn a_name_shaped_like_another_names_key_is_escaped() {
        assert_eq!(tagged_name("a"), "{a}");
        assert_eq!(tagged_name("{a}"), "{{a_}{a}");
        assert_eq!(tagged_name("}x"), "{_x}}x");
        assert_ne!(tagged_name("{_x}}x"), "{_x}}x");
        // Ordinary user tags are kept, wherever they stand.
        assert_eq!(tagged_name("{user42}:cart"), "{user42}:cart");
        assert_eq!(tagged_name("cart:{user42}"), "cart:{user42}");
    }

    #[test]
    fn wraps_plain_names() {
        assert_eq!(tagged_name("order:42"), "{order:42}");
    }

    #[test]
    fn keeps_a_users_tag() {
        assert_eq!(tagged_name("cart:{user42}"), "cart:{user42}");
    }

    #[test]
    fn names_with_stray_braces_get_a_non_empty_tag() {
        for name in ["}", "}x", "a{}b", "{}", "x}", "{", "{{}}", "}{"] {
            let tagged = tagged_name(name);
            let tag = hash_tag(tagged.as_bytes());
            assert!(
                !tag.is_empty() && tag.len() < tagged.len(),
                "{name:?} -> {tagged:?}"
            );
            assert!(tagged.contains(name), "{name:?} must stay in {tagged:?}");
        }
    }

    #[test]
    fn rejects_empty_and_overlong_names() {
        let ns = Namespace::default();
        assert_eq!(ns.lock(""), Err(KeyError::EmptyName));
        let long = "x".repeat(MAX_NAME_LEN + 1);
        assert!(matches!(ns.lock(&long), Err(KeyError::NameTooLong { .. })));
        assert!(ns.lock(&"x".repeat(MAX_NAME_LEN)).is_ok());
    }

    #[test]
    fn rejects_bad_prefixes() {
        assert!(Namespace::new("").is_err());
        assert!(Namespace::new("a}").is_err());
        assert_eq!(
            Namespace::new("app").map(|n| n.prefix().to_owned()),
            Ok("app".into())
        );
    }
    #[test]
    fn parse_reads_back_every_key_of_every_name() {
        let mut all = names(&['{', '}', 'a', ':'], 5);
        all.extend(["order:42", "cart:{user42}", "{user42}:cart", "}x", "{a}"].map(String::from));
        let ns = Namespace::new("app").unwrap();
        for name in &all {
            for kind in Kind::ALL {
                let keys = ns.object(kind, name).unwrap();
                let main = ns.parse(&keys.key).unwrap();
                assert_eq!(
                    (main.kind, main.name.as_str(), main.suffix),
                    (kind, name.as_str(), None),
                    "{name:?}"
                );
                for (key, suffix) in keys.keys[1..].iter().zip(kind.aux_suffixes()) {
                    let parsed = ns.parse(key).unwrap();
                    assert_eq!(
                        (parsed.kind, parsed.name.as_str(), parsed.suffix),
                        (kind, name.as_str(), Some(*suffix)),
                        "{key:?}"
                    );
                }
                // A channel's text may also be some other object's main key (channels and keys
                // live apart in Redis); then it reads as that key.
                let channel = ns.parse(&keys.channel).unwrap();
                if channel.suffix.is_some() {
                    assert_eq!(
                        (channel.name.as_str(), channel.suffix),
                        (name.as_str(), Some("released"))
                    );
                } else {
                    assert_eq!(ns.object(kind, &channel.name).unwrap().key, keys.channel);
                }
            }
        }
    }

    #[test]
    fn parse_rejects_foreign_keys() {
        let ns = Namespace::default();
        for key in [
            "lockkit",
            "lockkit:",
            "lockkit:lock",
            "lockkit:lock:",
            "lockkit:nokind:{a}",
            "other:lock:{a}",
            "lockkit2:lock:{a}",
            "lockkit:lock:{}",
            "lockkit:lock:plain",
            "lockkit:lock:a}b",
        ] {
            assert_eq!(ns.parse(key), None, "{key:?}");
        }
    }
}
