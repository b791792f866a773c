//! [`FairLock`]: a reentrant lock granted in request order (FIFO) across clients.

use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::fair_lock::{
    decode_cancel, decode_force_unlock, waiter_id, AcquireReply, ACQUIRE, CANCEL, FORCE_UNLOCK,
    RELEASE,
};
use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::RENEW;
use tokio::time::Instant;

use crate::acquire::{acquire, Attempt, Outcome};
use crate::core::ClientInner;
use crate::error::During;
use crate::error::Error;
use crate::exec::Resend;
use crate::guard::{lease_mode, HoldGuard};
use crate::hold::{lease_millis, HoldKind};
use crate::limits::MAX_LEASE;
use crate::lock::LockGuard;
use crate::object::Object;
use crate::queued::{Leave, Queued};

/// How holds of a [`FairLock`] are released and renewed.
static FAIR_HOLDS: HoldKind = HoldKind {
    kind: Kind::FairLock,
    release: &RELEASE,
    renew: &RENEW,
};

/// How a waiter that gives up leaves the queue (and passes its turn on).
static FAIR_LEAVE: Leave = Leave {
    script: &CANCEL,
    keys: |keys| keys.keys.iter().map(String::as_str).collect(),
    decode: decode_cancel,
};

/// A reentrant lock granted in request order (FIFO) across clients.
///
/// Get one with [`Client::fair_lock`](crate::Client::fair_lock). It behaves as
/// [`Lock`](crate::Lock) — same ownership (every plain acquire is an owner of its own; re-entry
/// inside the holder's [scope](LockGuard::scope)), same leases and watchdog, same [`LockGuard`] —
/// with one difference:
/// when several tasks, in any number of clients, wait for it, they get it **in the order they
/// asked for it**. A plain `Lock` lets whoever retries first after a release win, so under steady
/// contention one pod can starve the others; a `FairLock` cannot starve anyone.
///
/// Use it when waiters must be served in turn (a device or an API that serves one caller at a
/// time, a queue of jobs per tenant). Handoffs cost the same as a plain lock's, but queued waiters
/// keep their place alive with a retry every third of the
/// [waiter timeout](FairLock::with_waiter_timeout), and a crashed waiter can hold the queue up for
/// that timeout; prefer `Lock` where order does not matter.
///
/// # Order
/// A task that finds the lock taken joins a queue in Redis (one entry per acquire call, kept by
/// all of that call's retries). The lock is granted only to the waiter at the head of the queue,
/// or to anyone while the queue is empty; an acquire inside the holder's [scope](LockGuard::scope)
/// re-enters at any time, past the queue (a second plain acquire queues like any other).
/// A release wakes only the next waiter, by name: no thundering herd, no race for the lock.
/// [`try_lock`](FairLock::try_lock) with a zero `wait` never queues and never jumps the queue: it
/// gets the lock only when it is free and nobody waits for it.
///
/// # Waiters that die
/// A queued waiter keeps its place by retrying at least every third of its waiter timeout (5 s
/// by default, so every ≈1.7 s); every script drops the waiters at the head whose timeout has run
/// out without a retry. A waiter that gives up leaves the queue at once and passes its turn on:
/// a `wait` that runs out leaves in its last try, in the same script (so even a client that
/// vanishes right after leaves nothing behind), an acquire future that is dropped leaves in the
/// background. One whose process dies while it waits keeps its place for at most the waiter
/// timeout.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// let lock = client.fair_lock("printer:3");
/// // Wait our turn, at most 30 s; hold with a fixed lease of 10 s.
/// if let Some(guard) = lock.try_lock(Duration::from_secs(30), Some(Duration::from_secs(10))).await? {
///     // ... print ...
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct FairLock {
    object: Object,
    waiter_timeout: Duration,
}

impl FairLock {
    /// How long a queued waiter keeps its place without retrying, unless
    /// [`with_waiter_timeout`](FairLock::with_waiter_timeout) says otherwise.
    pub const DEFAULT_WAITER_TIMEOUT: Duration = Duration::from_secs(5);

    /// The shortest waiter timeout accepted.
    pub const MIN_WAITER_TIMEOUT: Duration = Duration::from_millis(100);

    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::FairLock, name),
            waiter_timeout: Self::DEFAULT_WAITER_TIMEOUT,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    /// This handle with another waiter timeout: how long a waiter that stops retrying (its process
    /// died, or cannot reach Redis) keeps its place in the queue before it is dropped. Waiters
    /// retry every third of it while queued. The default, 5 s, is
    /// [`DEFAULT_WAITER_TIMEOUT`](FairLock::DEFAULT_WAITER_TIMEOUT).
    ///
    /// Shorter frees the queue sooner after a crash, but costs more retries and drops waiters
    /// that are merely slow (a waiter that was dropped joins the queue again at its end on its
    /// next retry). Each waiter carries its own timeout, so handles with different timeouts can
    /// wait for the same lock.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a timeout under
    /// [`MIN_WAITER_TIMEOUT`](FairLock::MIN_WAITER_TIMEOUT) or over [`MAX_LEASE`].
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// let lock = client.fair_lock("printer:3").with_waiter_timeout(Duration::from_secs(2))?;
    /// let guard = lock.lock().await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_waiter_timeout(mut self, timeout: Duration) -> Result<Self, Error> {
        if timeout < Self::MIN_WAITER_TIMEOUT || timeout > MAX_LEASE {
            return Err(Error::InvalidArgument(format!(
                "waiter timeout {timeout:?} must be between {:?} and {MAX_LEASE:?}",
                Self::MIN_WAITER_TIMEOUT
            )));
        }
        self.waiter_timeout = timeout;
        Ok(self)
    }

    /// The waiter timeout of this handle.
    pub fn waiter_timeout(&self) -> Duration {
        self.waiter_timeout
    }

    /// Waits for its turn as long as it takes, then holds the lock in watchdog mode.
    ///
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never a holder's lease later.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future at any point leaves no hold behind (a hold the acquire
    /// script may already have taken is released in the background), and takes the waiter out of
    /// the queue in the background (should that fail, its place runs out after the waiter
    /// timeout).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails, [`Error::Shutdown`] once the client is shut down,
    /// [`Error::InvalidArgument`] for an invalid name, [`Error::WrongType`] when one of the lock's
    /// keys holds something else.
    pub async fn lock(&self) -> Result<LockGuard, Error> {
        self.lock_inner(None).await.during("lock")
    }

    /// Waits for its turn as long as it takes, then holds the lock for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`lock`](FairLock::lock).
    ///
    /// # Errors
    /// As [`lock`](FairLock::lock); [`Error::InvalidArgument`] for a lease shorter than
    /// [`MIN_LEASE`](crate::MIN_LEASE) (1 ms) or over [`MAX_LEASE`].
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<LockGuard, Error> {
        self.lock_inner(Some(lease)).await.during("lock_with_lease")
    }

    async fn lock_inner(&self, lease: Option<Duration>) -> Result<LockGuard, Error> {
        loop {
            if let Some(guard) = self.acquire(None, lease).await? {
                return Ok(guard);
            }
        }
    }

    /// Tries to take the lock, waiting for its turn at most `wait`.
    ///
    /// - `wait = Duration::ZERO` makes one attempt and never queues: it succeeds only when the
    ///   lock is free and nobody is waiting for it (or it runs inside the holder's
    ///   [scope](LockGuard::scope), and re-enters);
    /// - `lease = None` takes it in watchdog mode, `Some(lease)` with a fixed lease.
    ///
    /// Returns `Ok(None)` when the lock was not acquired within `wait`; the waiter has then left
    /// the queue. A `wait` too long to represent as a deadline waits without bound.
    ///
    /// # Cancel safety
    /// As [`lock`](FairLock::lock).
    ///
    /// # Errors
    /// As [`lock_with_lease`](FairLock::lock_with_lease).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// let lock = client.fair_lock("tenant:7:jobs");
    /// match lock.try_lock(Duration::from_secs(5), None).await? {
    ///     Some(guard) => guard.unlock().await?,
    ///     None => println!("not our turn within 5 s"),
    /// }
    /// # Ok(()) }
    /// ```
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
        // A single attempt must not leave a queue entry behind that would hold others up.
        let keepalive = if wait == Some(Duration::ZERO) {
            Duration::ZERO
        } else {
            self.waiter_timeout
        };
        let attempt = FairAttempt {
            client: inner,
            name: &self.object.name,
            keys,
            owner: inner.owner_for(&keys.key),
            lease,
            lease_ms: lease_millis(lease).to_string(),
            watchdog,
            waiter: Queued::new(
                inner,
                Kind::FairLock,
                &self.object.name,
                keys,
                &FAIR_LEAVE,
                waiter_id(&inner.id, inner.next_sequence()),
            ),
            keepalive,
            keepalive_ms: lease_millis(keepalive).to_string(),
            // Releases name the next waiter on its own client's channel.
            channel: keys.client_channel(&inner.id),
        };
        acquire(inner, &attempt, wait).await
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool, Error> {
        self.object.exists().await.during("is_locked")
    }

    /// Whether the calling code holds the lock through this client, counted as
    /// [`hold_count`](FairLock::hold_count).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the key holds something else.
    pub async fn is_held_by_current_task(&self) -> Result<bool, Error> {
        Ok(self.hold_count().await.during("is_held_by_current_task")? > 0)
    }

    /// The reentrant count of the owners the calling code acts as, through this client (0: none):
    /// inside a holder's [scope](LockGuard::scope), that owner's count; outside any scope, the
    /// owners of the guards the calling task acquired and has not released, wherever they were
    /// moved. Every re-entry made inside an owner's scope counts, whoever made it. As
    /// [`Lock::hold_count`](crate::Lock::hold_count).
    ///
    /// # Errors
    /// As [`is_held_by_current_task`](FairLock::is_held_by_current_task).
    pub async fn hold_count(&self) -> Result<u32, Error> {
        self.object.hold_count().await.during("hold_count")
    }

    /// How long the current holder's lease still runs; `None` when the lock is free.
    /// `Some(Duration::MAX)` if the key exists without expiry (not written by lockkit).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, Error> {
        self.object.remaining_ttl().await.during("remaining_ttl")
    }

    /// Deletes the lock whoever holds it and wakes the waiter first in line; returns whether it
    /// was locked. The queue is kept: waiters are served in order as before.
    ///
    /// This is an administrative operation: the holders are not asked. Their guards find out at
    /// the next renewal (watchdog mode), report [`is_lost`](LockGuard::is_lost) from then on, and
    /// get [`Error::NotHeld`] from [`unlock`](LockGuard::unlock).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails (the outcome is then unknown).
    pub async fn force_unlock(&self) -> Result<bool, Error> {
        self.object
            .force_unlock(&FORCE_UNLOCK, decode_force_unlock)
            .await
            .during("force_unlock")
    }
}

/// One acquire call: every retry runs as the same waiter, so it keeps its place in the queue.
struct FairAttempt<'a> {
    client: &'a Arc<ClientInner>,
    name: &'a Arc<str>,
    keys: &'a Arc<ObjectKeys>,
    owner: Arc<str>,
    lease: Duration,
    lease_ms: String,
    watchdog: bool,
    /// The waiter's place in the queue, left when the call gives up.
    waiter: Queued<'a>,
    /// How long the queue entry lives without a retry; zero: try once, never queue.
    keepalive: Duration,
    keepalive_ms: String,
    /// This client's own channel for the lock, where its waiters are named.
    channel: String,
}

impl Attempt for FairAttempt<'_> {
    type Output = LockGuard;

    /// Leaves the line (the client shut down while it waited).
    async fn leave(&self) {
        self.waiter.leave_now().await;
    }

    fn channel(&self) -> &str {
        &self.channel
    }

    fn object(&self) -> (Kind, &str) {
        (Kind::FairLock, self.name)
    }

    fn waiter_tag(&self) -> Option<&str> {
        Some(self.waiter.id())
    }

    fn owned_key(&self) -> Option<&str> {
        Some(&self.keys.key)
    }

    async fn attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        self.try_once(&self.keepalive_ms).await
    }

    /// A try that leaves the queue when refused (keep-alive 0), in the same script: the wait ran
    /// out, so its place must not hold the others up, even when no cancel can follow (the client
    /// vanished after this reply).
    async fn last_attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        let outcome = self.try_once("0").await?;
        if !matches!(outcome, Outcome::Acquired(_)) {
            // The script took the waiter out: nothing is left to leave.
            self.waiter.granted();
        }
        Ok(outcome)
    }
}

impl FairAttempt<'_> {
    /// One run of the acquire script; `keepalive_ms` = "0" never queues, and leaves the queue.
    async fn try_once(&self, keepalive_ms: &str) -> Result<Outcome<LockGuard>, Error> {
        let client = self.client;
        // Armed before sending: if this future is dropped, or the reply is lost, whatever the
        // script may have taken is given back.
        let guard = HoldGuard::prepare_for(
            client,
            &FAIR_HOLDS,
            self.name,
            self.keys,
            self.lease,
            self.watchdog,
            Some(&self.owner),
        );
        if keepalive_ms != "0" {
            self.waiter.joining();
        }
        let keys: Vec<&str> = self.keys.keys.iter().map(String::as_str).collect();
        let sent = Instant::now();
        let reply = client
            .exec
            .ints(
                &ACQUIRE,
                Kind::FairLock,
                &keys,
                &[
                    &self.owner,
                    &guard.hold().marker,
                    &self.lease_ms,
                    self.waiter.id(),
                    keepalive_ms,
                    &self.keys.channel,
                    client.exec.publish_flag(),
                ],
                Resend::Allowed,
            )
            .await?;
        match AcquireReply::decode(&reply)? {
            AcquireReply::Acquired { hold_count } => {
                // A grant takes the waiter out of the queue in the same script.
                self.waiter.granted();
                Ok(Outcome::Acquired(LockGuard::new(
                    guard.granted(sent)?.replicated().await?,
                    hold_count,
                    None,
                )))
            }
            AcquireReply::Busy { wait_ms } => {
                guard.disarm();
                // Retry (and so refresh the queue entry) well before it runs out, even when no
                // message comes and the holder's lease is long.
                let refresh = self.keepalive / 3;
                Ok(Outcome::Busy {
                    retry_in: Some(
                        wait_ms.map_or(refresh, |ms| Duration::from_millis(ms).min(refresh)),
                    ),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<FairLock>();
    }
}
