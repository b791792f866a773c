//! [`SpinLock`]: the seed's plain, non-reentrant lock, waiting by backoff instead of pub/sub.

use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::spin_lock::{AcquireReply, ACQUIRE, RELEASE, RENEW};
use tokio::time::Instant;

use crate::acquire::{acquire_polling, Attempt, Backoff, Outcome};
use crate::core::ClientInner;
use crate::error::During;
use crate::error::Error;
use crate::exec::Resend;
use crate::guard::{lease_mode, HoldGuard};
use crate::hold::{lease_millis, HoldKind};
use crate::lock::LockGuard;
use crate::object::Object;

static SPIN_HOLDS: HoldKind = HoldKind {
    kind: Kind::SpinLock,
    release: &RELEASE,
    renew: &RENEW,
};

/// How a waiting [`SpinLock`] polls: 2 ms first, doubling up to 128 ms, with jitter; never
/// longer than the holder's remaining lease or the caller's deadline.
const BACKOFF: Backoff = Backoff {
    first: Duration::from_millis(2),
    cap: Duration::from_millis(128),
};

/// A plain, **non-reentrant** lock: `SET key marker NX PX lease`, released by compare-and-delete.
///
/// Use it where pub/sub traffic is unwelcome (large clusters, where every unlock message would
/// otherwise cross nodes) or to interoperate with code that uses the classic `SET NX PX` pattern.
/// Waiters poll with capped exponential backoff (2 ms doubling to 128 ms, with jitter), so a
/// handoff is slower than [`Lock`](crate::Lock)'s and polling costs round trips.
///
/// Not reentrant: a task that already holds it and locks again waits like anyone else (until its
/// own lease ends), and `try_lock` returns `None`. Leases, the watchdog, lost-lease signals and
/// cancellation behave as for [`Lock`](crate::Lock).
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
/// let lock = client.spin_lock("cron:cleanup");
/// if let Some(guard) = lock.try_lock(Duration::from_secs(1), None).await? {
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct SpinLock {
    object: Object,
}

impl SpinLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::SpinLock, name),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.object.name
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
    /// [`Error::Redis`], [`Error::Shutdown`], [`Error::InvalidArgument`] (name),
    /// [`Error::WrongType`].
    pub async fn lock(&self) -> Result<LockGuard, Error> {
        loop {
            if let Some(guard) = self.acquire(None, None).await.during("lock")? {
                return Ok(guard);
            }
        }
    }

    /// Waits as long as it takes, then holds the lock for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`lock`](SpinLock::lock).
    ///
    /// # Errors
    /// As [`lock`](SpinLock::lock); [`Error::InvalidArgument`] for a bad lease.
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard, Error> {
        loop {
            if let Some(guard) = self
                .acquire(None, Some(lease))
                .await
                .during("lock_with_lease")?
            {
                return Ok(guard);
            }
        }
    }

    /// Tries to take the lock, polling for at most `wait`; `lease: None` is watchdog mode.
    /// `Ok(None)` when not acquired in time.
    ///
    /// # Cancel safety
    /// As [`lock`](SpinLock::lock).
    ///
    /// # Errors
    /// As [`lock_with_lease`](SpinLock::lock_with_lease).
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>, Error> {
        self.acquire(Some(wait), lease).await.during("try_lock")
    }

    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>, Error> {
        let keys = self.object.keys()?;
        let inner = self.object.inner();
        let (lease, watchdog) = lease_mode(inner, lease)?;
        let attempt = SpinAttempt {
            client: inner,
            name: &self.object.name,
            keys,
            lease,
            lease_ms: lease_millis(lease).to_string(),
            watchdog,
        };
        acquire_polling(inner, &attempt, wait, BACKOFF).await
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool, Error> {
        self.object.exists().await.during("is_locked")
    }

    /// How long the current holder's lease still runs; `None` when free.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, Error> {
        self.object.remaining_ttl().await.during("remaining_ttl")
    }

    /// Deletes the lock whoever holds it; returns whether it was locked. Waiters notice at their
    /// next poll.
    ///
    /// This is an administrative operation: the holder is not asked. Its guard finds out at the
    /// next renewal (watchdog mode) or check (fixed lease), reports
    /// [`is_lost`](LockGuard::is_lost) from then on, and gets [`Error::NotHeld`] from
    /// [`unlock`](LockGuard::unlock).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails (the outcome is then unknown).
    pub async fn force_unlock(&self) -> Result<bool, Error> {
        self.object
            .force_unlock(
                &lockkit_protocol::lock::FORCE_UNLOCK,
                lockkit_protocol::lock::decode_force_unlock,
            )
            .await
            .during("force_unlock")
    }
}

struct SpinAttempt<'a> {
    client: &'a Arc<ClientInner>,
    name: &'a Arc<str>,
    keys: &'a Arc<ObjectKeys>,
    lease: Duration,
    lease_ms: String,
    watchdog: bool,
}

impl Attempt for SpinAttempt<'_> {
    type Output = LockGuard;

    fn channel(&self) -> &str {
        &self.keys.channel
    }

    fn object(&self) -> (Kind, &str) {
        (Kind::SpinLock, self.name)
    }

    fn owned_key(&self) -> Option<&str> {
        Some(&self.keys.key)
    }

    async fn attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        let guard = HoldGuard::prepare(
            self.client,
            &SPIN_HOLDS,
            self.name,
            self.keys,
            self.lease,
            self.watchdog,
        );
        let sent = Instant::now();
        let reply = self
            .client
            .exec
            .ints(
                &ACQUIRE,
                Kind::SpinLock,
                &[&self.keys.key],
                &[&guard.hold().marker, &self.lease_ms],
                Resend::Allowed,
            )
            .await?;
        match AcquireReply::decode(&reply)? {
            AcquireReply::Acquired => Ok(Outcome::Acquired(LockGuard::new(
                guard.granted(sent)?.replicated().await?,
                1,
                None,
            ))),
            AcquireReply::Busy { pttl_ms } => {
                guard.disarm();
                Ok(Outcome::Busy {
                    retry_in: pttl_ms.map(Duration::from_millis),
                })
            }
        }
    }
}
