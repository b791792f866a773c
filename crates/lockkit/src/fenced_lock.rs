//! [`FencedLock`]: a reentrant lock whose acquisitions carry strictly increasing fencing tokens.

use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::fenced_lock::{ACQUIRE, RELEASE};
use lockkit_protocol::keys::Kind;
use lockkit_protocol::lock::RENEW;
use lockkit_protocol::DecodeError;

use crate::core::ClientInner;
use crate::error::Error;
use crate::hold::HoldKind;
use crate::lock::{Flavor, Lock, LockGuard};

/// The fenced flavour of the reentrant lock: its own acquire (mints the token) and release (drops
/// the token field) scripts; renewal as the plain lock's.
static FENCED: Flavor = Flavor {
    kind: Kind::FencedLock,
    acquire: &ACQUIRE,
    holds: HoldKind {
        kind: Kind::FencedLock,
        release: &RELEASE,
        renew: &RENEW,
    },
    leave: &crate::lock::FENCED_LEAVE,
};

/// A reentrant lock whose every acquisition — re-entries included — carries a **fencing token**
/// greater than every token handed out before it for this lock.
///
/// A lease-based lock cannot stop a holder that was paused past its lease (GC, `SIGSTOP`, a
/// swapped-out VM) from waking up and writing as if it still held the lock. A fencing token lets
/// the *storage* reject that stale writer: store the token of the last accepted write next to the
/// data and accept a write only with a token at least as large (`UPDATE … WHERE last_fence <=
/// :fence`: `<=`, since the holder may write more than once under one acquisition).
///
/// Everything else is as [`Lock`](crate::Lock): same ownership (every plain acquire is an owner
/// of its own; re-entry inside the holder's [scope](LockGuard::scope)), leases, watchdog and
/// waiting. Its acquisitions return a [`FencedGuard`], whose
/// [`fencing_token`](FencedGuard::fencing_token) is the token (always there: a `u64`, not an
/// `Option`).
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// let lock = client.fenced_lock("stock:42");
/// let guard = lock.lock().await?;
/// let fence: u64 = guard.fencing_token();
/// // UPDATE stock SET qty = qty - 1, last_fence = :fence WHERE id = 42 AND last_fence <= :fence
/// # let _ = fence;
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
///
/// Tokens come from a counter in Redis; every acquisition mints
/// `max(counter, server clock in µs) + 1`. So tokens never repeat even when the counter goes back
/// or is lost: Redis restarted from an older RDB/AOF snapshot or without persistence, or failed
/// over to a replica that had not seen the last increments. The assumption left: the server
/// clock does not step back further than such a restore rolled the counter back.
///
/// The counter does not live forever: every acquisition (and every grant to a waiter) sets it to
/// expire once the server clock has passed the new token by the client's
/// [`token_counter_ttl`](crate::ClientBuilder::token_counter_ttl) (one day by default). The next
/// token is then minted from the clock, which is past every earlier token; so the expiry only
/// assumes that the server clock does not step back by more than that TTL after the counter
/// expired. No hold needs the counter: each hold keeps its own token.
#[derive(Clone, Debug)]
pub struct FencedLock {
    lock: Lock,
}

impl FencedLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            lock: Lock::with_flavor(client, name, &FENCED),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lock.name()
    }

    /// Waits as long as it takes, then holds the lock in watchdog mode.
    ///
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never a holder's lease later.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves no hold behind.
    ///
    /// # Errors
    /// As [`Lock::lock`].
    pub async fn lock(&self) -> Result<FencedGuard, Error> {
        FencedGuard::new(self.lock.lock().await?)
    }

    /// Waits as long as it takes, then holds the lock for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`lock`](FencedLock::lock).
    ///
    /// # Errors
    /// As [`Lock::lock_with_lease`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<FencedGuard, Error> {
        FencedGuard::new(self.lock.lock_with_lease(lease).await?)
    }

    /// Tries to take the lock, waiting at most `wait`; `lease: None` is watchdog mode. `Ok(None)`
    /// when not acquired in time.
    ///
    /// # Cancel safety
    /// As [`lock`](FencedLock::lock).
    ///
    /// # Errors
    /// As [`Lock::try_lock`].
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<FencedGuard>, Error> {
        self.lock
            .try_lock(wait, lease)
            .await?
            .map(FencedGuard::new)
            .transpose()
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool, Error> {
        self.lock.is_locked().await
    }

    /// Whether the calling code holds the lock through this client, as
    /// [`Lock::is_held_by_current_task`].
    ///
    /// # Errors
    /// [`Error::Redis`], [`Error::WrongType`].
    pub async fn is_held_by_current_task(&self) -> Result<bool, Error> {
        self.lock.is_held_by_current_task().await
    }

    /// The reentrant count of the owners the calling code acts as (the enclosing scope's owner,
    /// or the owners of the guards the calling task acquired and has not released), counting
    /// every re-entry made inside their scopes, as [`Lock::hold_count`].
    ///
    /// # Errors
    /// [`Error::Redis`], [`Error::WrongType`].
    pub async fn hold_count(&self) -> Result<u32, Error> {
        self.lock.hold_count().await
    }

    /// How long the current holder's lease still runs; `None` when free.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, Error> {
        self.lock.remaining_ttl().await
    }

    /// Deletes the lock whoever holds it and wakes its waiters; returns whether it was locked.
    /// The token counter is kept (with its expiry), so tokens keep growing.
    ///
    /// This is an administrative operation: the holders are not asked. Their guards find out at
    /// the next renewal (watchdog mode) or check (fixed lease), report
    /// [`is_lost`](LockGuard::is_lost) from then on, and get [`Error::NotHeld`] from
    /// [`unlock`](LockGuard::unlock). A holder that keeps writing meanwhile is stopped by the
    /// storage's token check, as the next holder's token is larger.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails (the outcome is then unknown).
    pub async fn force_unlock(&self) -> Result<bool, Error> {
        self.lock.force_unlock().await
    }
}

/// A held [`FencedLock`]: its [`LockGuard`] with the acquisition's fencing token, which a fenced
/// lock's acquisition always has ([`fencing_token`](FencedGuard::fencing_token) is a `u64`).
///
/// Everything else is the lock guard's, through `Deref`: [`is_lost`](LockGuard::is_lost),
/// [`lost`](LockGuard::lost), [`scope`](LockGuard::scope), [`hold_count`](LockGuard::hold_count),
/// ... [`unlock`](FencedGuard::unlock) releases it; dropped, it is released in the background.
/// Code that treats every kind of lock alike takes the [`LockGuard`]
/// ([`into_lock_guard`](FencedGuard::into_lock_guard), or `.into()`), whose
/// [`fencing_token`](LockGuard::fencing_token) is then `Some` of the same token.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// let guard = client.fenced_lock("account:7").lock().await?;
/// let fence = guard.fencing_token();
/// // UPDATE accounts SET balance = :b, last_fence = :fence WHERE id = 7 AND last_fence <= :fence
/// # let _ = fence;
/// assert!(!guard.is_lost());
/// guard.unlock().await?;
/// # Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct FencedGuard {
    guard: LockGuard,
    token: u64,
}

impl FencedGuard {
    /// The guard of a fenced lock's acquisition, which carries its token.
    fn new(guard: LockGuard) -> Result<Self, Error> {
        let Some(token) = guard.fencing_token() else {
            // The acquire script mints a token with every grant: a reply without one is a
            // script and client of different versions. The guard's drop gives the hold back.
            return Err(Error::Protocol(DecodeError {
                script: ACQUIRE.name(),
                detail: format!(
                    "the fenced lock `{}` was acquired without a fencing token",
                    guard.name()
                ),
            }));
        };
        Ok(Self { guard, token })
    }

    /// The fencing token of this acquisition: greater than every token handed out before it for
    /// this lock (re-entries included). Pass it to the storage with every write made under the
    /// lock, and have the storage refuse a write whose token is smaller than the last one it
    /// accepted.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Releases this hold, as [`LockGuard::unlock`].
    ///
    /// # Errors
    /// As [`LockGuard::unlock`].
    pub async fn unlock(self) -> Result<(), Error> {
        self.guard.unlock().await
    }

    /// The lock guard itself, for code that treats every kind of lock alike; its
    /// [`fencing_token`](LockGuard::fencing_token) is `Some(self.fencing_token())`.
    pub fn into_lock_guard(self) -> LockGuard {
        self.guard
    }
}

impl std::ops::Deref for FencedGuard {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl From<FencedGuard> for LockGuard {
    fn from(guard: FencedGuard) -> LockGuard {
        guard.guard
    }
}
