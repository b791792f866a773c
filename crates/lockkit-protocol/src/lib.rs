//! The Redis protocol of [lockkit](https://docs.rs/lockkit): everything lockkit stores in Redis and
//! every script it runs there, with no I/O.
//!
//! - [`keys`]: how an object's name becomes Redis keys and pub/sub channels. Every key and channel of
//!   one object carries the same hash tag, so one script touches one cluster slot.
//! - [`slot`]: the Redis Cluster slot function (CRC16/XMODEM of the hash tag, modulo 16384).
//! - [`script`]: a Lua script as a value, with its SHA1 computed once.
//! - [`lock`]: the reentrant lock's scripts and their typed replies.
//! - [`rate_limiter`]: the rate limiter's scripts (GCRA with reservations).
//! - [`wake`]: the payloads of release messages: whom to wake.
//! - [`election`]: the election's leader record, change channel and scripts (its leadership is a
//!   fenced hold, [`fenced_lock`]).
//!
//! Each script lives in its own `.lua` file whose header lists its KEYS, ARGV and reply; the Rust
//! side decodes replies into enums defined next to the script, so no call site ever interprets raw
//! integers or nils.
//!
//! ```
//! use lockkit_protocol::{keys::Namespace, lock, slot};
//!
//! let ns = Namespace::default();
//! let keys = ns.lock("order:42").unwrap();
//! assert_eq!(keys.key, "lockkit:lock:{order:42}");
//! assert_eq!(slot::key_slot(&keys.key), slot::key_slot(&keys.channel));
//! // Busy for 1.5 s more, said the server at its clock's 1 700 000 000 000 ms.
//! let reply = lock::AcquireReply::decode(&[0, 1500, 1_700_000_000_000]).unwrap();
//! assert_eq!(
//!     reply,
//!     lock::AcquireReply::Busy { pttl_ms: Some(1500), now_ms: 1_700_000_000_000 }
//! );
//! ```

pub mod election;
pub mod fair_lock;
pub mod fenced_lock;
pub mod keys;
pub mod latch;
pub mod lock;
pub mod rate_limiter;
pub mod read_write_lock;
pub mod script;
pub mod semaphore;
pub mod slot;
pub mod spin_lock;
pub mod wake;

/// A reply that does not have the shape its script promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected reply from script `{script}`: {detail}")]
pub struct DecodeError {
    /// The script whose reply could not be decoded.
    pub script: &'static str,
    /// What was wrong with it.
    pub detail: String,
}

impl DecodeError {
    pub(crate) fn new(script: &'static str, reply: &[i64]) -> Self {
        Self {
            script,
            detail: format!("{reply:?}"),
        }
    }
}
