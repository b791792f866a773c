//! The one error type of lockkit.

use std::fmt;

use lockkit_protocol::{keys::KeyError, DecodeError};

/// Everything that can go wrong in lockkit.
///
/// Bad input is reported as [`Error::InvalidArgument`] before anything is sent to Redis; a lock
/// that is no longer yours is [`Error::NotHeld`]; Redis trouble is [`Error::Redis`], which says
/// what lockkit was doing at the time.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The hold being released or extended is no longer in Redis: its lease ran out, the lock was
    /// force-unlocked, or Redis lost it (a restart without persistence, a failover).
    #[error("`{name}` is no longer held by this guard: its lease ran out, it was force-unlocked, or Redis lost it")]
    NotHeld {
        /// The object's name.
        name: String,
    },
    /// The lock was not acquired within the time allowed: someone else held it all along. Returned
    /// by code that turns "not acquired in time" into an error, such as the `#[locked]` attribute
    /// with a `wait` (the `try_*` methods return `Ok(None)` instead).
    #[error("`{name}` was not acquired within {waited:?}: another owner held it")]
    NotAcquired {
        /// The object's name.
        name: String,
        /// How long the caller waited.
        waited: std::time::Duration,
    },
    /// The acquisition reached the primary, but fewer replicas than the client's replica
    /// acknowledgement policy requires
    /// ([`ClientBuilder::replica_ack`](crate::ClientBuilder::replica_ack)) acknowledged it within
    /// the policy's timeout. The hold was given back: nothing is held.
    #[error("`{name}` was acquired on the primary but only {acknowledged} replica(s) acknowledged it in time ({required} required by the replica acknowledgement policy); it was released")]
    NotReplicated {
        /// The object's name.
        name: String,
        /// How many replicas acknowledged the acquisition.
        acknowledged: u32,
        /// How many the policy required.
        required: u32,
    },
    /// An argument was rejected before anything was sent to Redis.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The key that lockkit uses for an object holds a Redis value of another type, written by
    /// something else.
    #[error("the key `{key}` holds a value of another type than a lockkit {kind} uses (written by someone else?)")]
    WrongType {
        /// The Redis key.
        key: String,
        /// The kind of lockkit object that was expected there.
        kind: &'static str,
    },
    /// The object's current state does not allow the operation: asking a semaphore for more
    /// permits than it has, counting a latch down past zero, upgrading a read hold to a write
    /// hold.
    #[error("{kind} `{name}`: {reason}")]
    Refused {
        /// The kind of object.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// Why the operation was refused.
        reason: String,
    },
    /// Redis could not be reached, did not answer in time, or refused a command.
    #[error(transparent)]
    Redis(#[from] RedisError),
    /// The client was shut down with [`Client::shutdown`](crate::Client::shutdown).
    #[error("the lockkit client has been shut down")]
    Shutdown,
    /// A script answered with a reply of the wrong shape: a bug, or another program using the same
    /// keys.
    #[error(transparent)]
    Protocol(#[from] DecodeError),
}

impl From<KeyError> for Error {
    fn from(err: KeyError) -> Self {
        Error::InvalidArgument(err.to_string())
    }
}

/// A Redis failure, with what lockkit was doing when it happened.
#[derive(Debug)]
pub struct RedisError {
    operation: &'static str,
    source: fred::error::Error,
}

impl RedisError {
    pub(crate) fn new(operation: &'static str, source: fred::error::Error) -> Self {
        Self { operation, source }
    }

    /// What lockkit was doing: a script's name (`lock_acquire`, ...), `connect`, `subscribe`, ...
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The underlying client error's own text.
    #[cfg(feature = "tls")]
    pub(crate) fn source_details(&self) -> &str {
        self.source.details()
    }

    /// Whether the command was certainly never sent: the client had no connection to route it
    /// to (during a reconnect). Sending it again is safe and cannot run it twice.
    pub(crate) fn was_not_sent(&self) -> bool {
        self.source.details().starts_with("Failed to route command")
    }

    /// Whether the failure leaves the outcome unknown: the connection broke or the command timed
    /// out, so the command may or may not have run.
    pub fn is_ambiguous(&self) -> bool {
        use fred::error::ErrorKind;
        matches!(
            self.source.kind(),
            ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled
        )
    }
}

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis error during {}: {}", self.operation, self.source)
    }
}

impl std::error::Error for RedisError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Wraps a fred error with the operation it interrupted.
pub(crate) fn redis(operation: &'static str) -> impl FnOnce(fred::error::Error) -> Error {
    move |source| Error::Redis(RedisError::new(operation, source))
}

/// Maps the error of a plain command on `key`: `WRONGTYPE` becomes [`Error::WrongType`], anything
/// else [`Error::Redis`] naming `operation`.
pub(crate) fn command_error<'a>(
    operation: &'static str,
    key: &'a str,
    kind: lockkit_protocol::keys::Kind,
) -> impl FnOnce(fred::error::Error) -> Error + 'a {
    move |source| {
        if source.details().starts_with("WRONGTYPE") {
            Error::WrongType {
                key: key.to_owned(),
                kind: kind.describe(),
            }
        } else {
            Error::Redis(RedisError::new(operation, source))
        }
    }
}
