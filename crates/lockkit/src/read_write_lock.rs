//! [`ReadWriteLock`]: a reentrant read-write lock: many readers or one writer.

use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::{hold_marker, WAITER_KEEPALIVE};
use lockkit_protocol::read_write_lock::{
    decode_cancel, decode_force_unlock, AcquireReply, Mode, Status, ACQUIRE, CANCEL, FORCE_UNLOCK,
    RELEASE, RENEW, STATUS,
};
use lockkit_protocol::wake::Grant;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::acquire::{acquire, Attempt, Outcome};
use crate::core::ClientInner;
use crate::error::During;
use crate::error::Error;
use crate::exec::Resend;
use crate::guard::{lease_mode, HoldGuard};
use crate::hold::{lease_millis, HoldKind};
use crate::object::Object;
use crate::queued::{Leave, Queued};
use crate::LockGuard;

/// How holds of a [`ReadWriteLock`] (read and write alike) are released and renewed.
pub(crate) static RW_LOCK_HOLDS: HoldKind = HoldKind {
    kind: Kind::ReadWriteLock,
    release: &RELEASE,
    renew: &RENEW,
};

/// How a waiter that gives up leaves the lock's line (and hands on a hold a release granted it).
static RW_LOCK_LEAVE: Leave = Leave {
    script: &CANCEL,
    keys: key_refs,
    decode: decode_cancel,
};

/// Every key of the lock, as script `KEYS`.
fn key_refs(keys: &ObjectKeys) -> Vec<&str> {
    keys.keys.iter().map(String::as_str).collect()
}

/// A reentrant read-write lock: any number of readers, or one writer.
///
/// Get one with [`Client::read_write_lock`](crate::Client::read_write_lock). The handle is cheap, `Clone + Send + Sync`, and sends
/// nothing until used. Use it where reads are frequent, may take a while, and can safely run side
/// by side (rebuilding a cache from a shared table while writers update it rarely); where every
/// caller writes, a plain [`Lock`](crate::Lock) is simpler and as fast.
///
/// # Rules
/// - A **read** hold is granted unless another owner holds a write hold.
/// - A **write** hold is granted when nobody else holds the lock in either mode.
/// - Ownership is as for [`Lock`](crate::Lock): every plain acquire is an owner of its own, and
///   re-entry happens inside a holder's [scope](LockGuard::scope). Both modes are **reentrant**
///   there: each hold is one [`LockGuard`] and is released on its own;
///   [`LockGuard::hold_count`] is the owner's count *in that mode*.
/// - **Downgrade** is allowed: inside a write hold's scope the writer may also take read holds,
///   and releasing its write holds leaves the read holds, so it keeps reading what it wrote while
///   other readers come in.
/// - **Upgrade** is refused: inside a read hold's scope, a write request (the owner holds only
///   read holds) fails at once with [`Error::Refused`], whether from
///   [`write_lock`](ReadWriteLock::write_lock) or [`try_write_lock`](ReadWriteLock::try_write_lock).
///   Waiting could never succeed (the owner's own read holds block it, the classic
///   self-deadlock), and two readers upgrading at once would deadlock each other. Release the
///   read holds, then take the write lock, and re-check what you read.
/// - Outside a scope, a task that holds a read guard and asks for the write lock is just another
///   owner: the request waits for every reader to leave (a zero-wait try returns `None`), and the
///   self-wait warning is logged, since the task's own read guard blocks it.
/// - Waiting calls are served first come, first served (see **Waiting**): a writer that waits
///   holds back the readers that come after it, so readers never starve a writer. A task that
///   holds a plain read guard and asks for another read *outside* its scope is another owner and
///   may queue behind a waiting writer that waits for the first guard; take the second read hold
///   inside the first's scope, where it is a re-entry, granted at once.
///
/// # Leases
/// Every hold has a lease of its **own**, in watchdog mode (`lease: None`) or fixed, as for
/// [`Lock`](crate::Lock). A reader that crashes loses its hold when that hold's lease ends, even
/// while other readers keep renewing theirs.
///
/// # Waiting: a FIFO line with direct grant
/// A call that finds the lock taken, or others waiting ahead of it, joins the lock's line in
/// Redis and takes the lock only from its head, as tokio's `RwLock` serves its waiters (the
/// reason: one order for readers and writers, so no reader overtakes a writer that came earlier,
/// and no writer starves). Whatever frees the lock (a release, a hold whose lease ran out, a
/// waiter that gave up with a grant unclaimed, [`force_unlock`](ReadWriteLock::force_unlock))
/// grants the line in the same script: the head writer when the lock is free, or every reader at
/// the head up to the next writer while no writer holds. Each granted call holds the lock at once;
/// its client is told with one message on its own channel, however many of its calls were
/// granted; nobody else is told anything. A
/// re-entry inside a holder's scope never waits in the line. A grant is on probation (5 s) until
/// the waiter confirms it; a grant nobody heard is undone at once. A call whose wait ran out, or
/// whose future was dropped, leaves the line at once; a zero-`wait` try never joins it and is
/// refused while anyone waits ahead of it.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// let prices = client.read_write_lock("prices");
/// // Many pods may read at once ...
/// let read = prices.read_lock().await?;
/// // ... read the price table ...
/// read.unlock().await?;
///
/// // ... and one pod at a time rewrites it, while no one reads.
/// if let Some(write) = prices.try_write_lock(Duration::from_secs(5), None).await? {
///     // ... rewrite the price table ...
///     write.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    object: Object,
}

impl ReadWriteLock {
    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::ReadWriteLock, name),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    fn keys(&self) -> Result<&Arc<ObjectKeys>, Error> {
        self.object.keys()
    }

    /// Waits as long as it takes, then holds a read hold in watchdog mode.
    ///
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never a holder's lease later.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future at any point leaves no hold behind (a hold the acquire
    /// script may already have taken is released in the background).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails, [`Error::Shutdown`] once the client is shut down,
    /// [`Error::InvalidArgument`] for an invalid name, [`Error::WrongType`] when the lock's key
    /// holds something else.
    #[doc(alias = "read", alias = "read_owned")]
    pub async fn read_lock(&self) -> Result<LockGuard, Error> {
        self.wait_for(Mode::Read, None).await.during("read_lock")
    }

    /// Waits as long as it takes, then holds a read hold for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`read_lock`](ReadWriteLock::read_lock).
    ///
    /// # Errors
    /// As [`read_lock`](ReadWriteLock::read_lock); [`Error::InvalidArgument`] for a lease shorter
    /// than [`MIN_LEASE`](crate::MIN_LEASE) (1 ms) or over [`MAX_LEASE`](crate::MAX_LEASE).
    pub async fn read_lock_with_lease(&self, lease: Duration) -> Result<LockGuard, Error> {
        self.wait_for(Mode::Read, Some(lease))
            .await
            .during("read_lock_with_lease")
    }

    /// Tries to take a read hold, waiting at most `wait` while another owner writes.
    ///
    /// - `wait = Duration::ZERO` makes one attempt and never waits;
    /// - `lease = None` takes it in watchdog mode, `Some(lease)` with a fixed lease.
    ///
    /// Returns `Ok(None)` when no read hold was granted within `wait`. A `wait` too long to
    /// represent as a deadline waits without bound.
    ///
    /// # Cancel safety
    /// As [`read_lock`](ReadWriteLock::read_lock).
    ///
    /// # Errors
    /// As [`read_lock_with_lease`](ReadWriteLock::read_lock_with_lease).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// let config = client.read_write_lock("config");
    /// match config.try_read_lock(Duration::from_millis(200), None).await? {
    ///     Some(guard) => {
    ///         // ... read the configuration ...
    ///         guard.unlock().await?;
    ///     }
    ///     None => println!("a writer is updating the configuration; using the cached copy"),
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "try_read", alias = "try_read_owned")]
    pub async fn try_read_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>, Error> {
        self.acquire(Mode::Read, Some(wait), lease)
            .await
            .during("try_read_lock")
    }

    /// Waits as long as it takes, then holds the write hold in watchdog mode.
    ///
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never a holder's lease later.
    ///
    /// # Cancel safety
    /// As [`read_lock`](ReadWriteLock::read_lock).
    ///
    /// # Errors
    /// [`Error::Refused`] at once when called inside a read hold's [scope](LockGuard::scope)
    /// whose owner holds no write hold (a reader cannot upgrade: it would wait for itself
    /// forever); otherwise as
    /// [`read_lock`](ReadWriteLock::read_lock).
    #[doc(alias = "write", alias = "write_owned")]
    pub async fn write_lock(&self) -> Result<LockGuard, Error> {
        self.wait_for(Mode::Write, None).await.during("write_lock")
    }

    /// Waits as long as it takes, then holds the write hold for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`read_lock`](ReadWriteLock::read_lock).
    ///
    /// # Errors
    /// As [`write_lock`](ReadWriteLock::write_lock); [`Error::InvalidArgument`] for a lease
    /// shorter than [`MIN_LEASE`](crate::MIN_LEASE) (1 ms) or over [`MAX_LEASE`](crate::MAX_LEASE).
    pub async fn write_lock_with_lease(&self, lease: Duration) -> Result<LockGuard, Error> {
        self.wait_for(Mode::Write, Some(lease))
            .await
            .during("write_lock_with_lease")
    }

    /// Tries to take the write hold, waiting at most `wait` while others hold the lock.
    ///
    /// `wait` and `lease` as in [`try_read_lock`](ReadWriteLock::try_read_lock). Returns
    /// `Ok(None)` when the write hold was not granted within `wait`.
    ///
    /// An upgrade (inside a read hold's scope) is an error, not `Ok(None)`: no wait
    /// could ever end in success, and treating it as "busy" would hide the bug.
    ///
    /// # Cancel safety
    /// As [`read_lock`](ReadWriteLock::read_lock).
    ///
    /// # Errors
    /// [`Error::Refused`] at once for an upgrade, whatever `wait`; otherwise as
    /// [`write_lock_with_lease`](ReadWriteLock::write_lock_with_lease).
    #[doc(alias = "try_write", alias = "try_write_owned")]
    pub async fn try_write_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>, Error> {
        self.acquire(Mode::Write, Some(wait), lease)
            .await
            .during("try_write_lock")
    }

    async fn wait_for(&self, mode: Mode, lease: Option<Duration>) -> Result<LockGuard, Error> {
        loop {
            if let Some(guard) = self.acquire(mode, None, lease).await? {
                return Ok(guard);
            }
        }
    }

    async fn acquire(
        &self,
        mode: Mode,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>, Error> {
        let keys = self.keys()?;
        let inner = self.object.inner();
        let (lease, watchdog) = lease_mode(inner, lease)?;
        let owner = inner.owner_for(&keys.key);
        let seq = inner.next_sequence();
        let marker = hold_marker(&inner.id, seq);
        let channel = keys.client_channel(&inner.id);
        let lease_ms = lease_millis(lease).to_string();
        let request = format!("{marker} {lease_ms} {}:{owner} {channel}", mode.arg());
        // A try with a zero wait never joins the line: a release must not grant the lock to a
        // call that has returned.
        let keepalive = if wait == Some(Duration::ZERO) {
            Duration::ZERO
        } else {
            WAITER_KEEPALIVE
        };
        let attempt = RwAttempt {
            client: inner,
            name: &self.object.name,
            keys,
            owner,
            mode,
            lease,
            lease_ms,
            watchdog,
            seq,
            marker,
            channel,
            anchor: Mutex::new(None),
            queued: Queued::new(
                inner,
                Kind::ReadWriteLock,
                &self.object.name,
                keys,
                &RW_LOCK_LEAVE,
                request,
            ),
            keepalive,
            keepalive_ms: lease_millis(keepalive).to_string(),
        };
        acquire(inner, &attempt, wait).await
    }

    /// Whether anyone holds the lock, in either mode. Holds whose lease has run out do not count.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the key holds something else.
    pub async fn is_locked(&self) -> Result<bool, Error> {
        Ok(self.status().await.during("is_locked")?.mode.is_some())
    }

    /// Whether someone holds a write hold.
    ///
    /// # Errors
    /// As [`is_locked`](ReadWriteLock::is_locked).
    pub async fn is_write_locked(&self) -> Result<bool, Error> {
        Ok(self.status().await.during("is_write_locked")?.mode == Some(Mode::Write))
    }

    /// The read holds of the owners the calling code acts as through this client (the enclosing
    /// scope's owner, or the owners of the guards the calling task acquired and has not released,
    /// counting every re-entry made inside their scopes, as
    /// [`Lock::hold_count`](crate::Lock::hold_count)); 0 when none.
    ///
    /// # Errors
    /// As [`is_locked`](ReadWriteLock::is_locked).
    pub async fn read_hold_count(&self) -> Result<u32, Error> {
        Ok(self.status().await.during("read_hold_count")?.read_holds)
    }

    /// How many write holds the calling code has through this client (counted as
    /// [`read_hold_count`](ReadWriteLock::read_hold_count)); 0 when none.
    ///
    /// # Errors
    /// As [`is_locked`](ReadWriteLock::is_locked).
    pub async fn write_hold_count(&self) -> Result<u32, Error> {
        Ok(self.status().await.during("write_hold_count")?.write_holds)
    }

    async fn status(&self) -> Result<Status, Error> {
        let keys = self.keys()?;
        let inner = self.object.inner();
        let key_refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
        let owners = inner.current_owners(&keys.key);
        let owner_refs: Vec<&str> = owners.iter().map(|owner| &**owner).collect();
        let reply = inner
            .exec
            .ints(
                &STATUS,
                Kind::ReadWriteLock,
                &key_refs,
                &owner_refs,
                Resend::Allowed,
            )
            .await?;
        Ok(Status::decode(&reply)?)
    }

    /// Deletes the lock whoever holds it, readers and writer alike, and grants it to the line as a
    /// release does; returns whether it was held.
    ///
    /// This is an administrative operation: the holders are not asked. Their guards find out at
    /// the next renewal (watchdog mode) or check (fixed lease), report
    /// [`is_lost`](LockGuard::is_lost) from then on, and get [`Error::NotHeld`] from
    /// [`unlock`](LockGuard::unlock).
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

/// One acquire call's tries at taking a hold: yields the hold, taken by a try or granted by a
/// release. Every try carries the call's one hold marker, which is also its request's in the
/// lock's line (`scripts/line_lib.lua`).
struct RwAttempt<'a> {
    client: &'a Arc<ClientInner>,
    name: &'a Arc<str>,
    keys: &'a Arc<ObjectKeys>,
    owner: Arc<str>,
    mode: Mode,
    lease: Duration,
    lease_ms: String,
    watchdog: bool,
    /// The sequence number and marker of the one hold this call takes, in every try and grant.
    seq: u64,
    marker: String,
    /// This client's own channel for the lock: grants to its waiters are published there.
    channel: String,
    /// When the latest refused try was sent, and the server's clock when it ran (a grant's
    /// expiry is read against it).
    anchor: Mutex<Option<(Instant, u64)>>,
    /// The call's request in the line, left when the call gives up.
    queued: Queued<'a>,
    /// The request's keep-alive; zero: try once, never join.
    keepalive: Duration,
    keepalive_ms: String,
}

impl RwAttempt<'_> {
    /// The guard of the call's one hold (its marker), armed: made before each try is sent, and
    /// for a grant.
    fn hold_guard(&self) -> HoldGuard {
        HoldGuard::prepare_marked(
            self.client,
            &RW_LOCK_HOLDS,
            self.name,
            self.keys,
            (self.lease, self.watchdog),
            Some(&self.owner),
            self.seq,
        )
    }

    /// One run of the acquire script; `keepalive_ms` = "0" never joins the line.
    async fn try_once(&self, keepalive_ms: &str) -> Result<Outcome<LockGuard>, Error> {
        let client = self.client;
        // Armed before sending: if this future is dropped, or the reply is lost, whatever the
        // script may have taken is given back.
        let guard = self.hold_guard();
        if keepalive_ms != "0" {
            self.queued.joining();
        }
        let sent = Instant::now();
        let reply = client
            .exec
            .ints(
                &ACQUIRE,
                Kind::ReadWriteLock,
                &key_refs(self.keys),
                &[
                    &self.owner,
                    &self.marker,
                    &self.lease_ms,
                    self.mode.arg(),
                    &self.channel,
                    client.exec.publish_flag(),
                    keepalive_ms,
                ],
                Resend::Allowed,
            )
            .await?;
        match AcquireReply::decode(&reply)? {
            AcquireReply::Acquired { hold_count } => {
                // Taking the hold takes the request out of the line in the same script.
                self.queued.granted();
                Ok(Outcome::Acquired(LockGuard::new(
                    guard.granted(sent)?.replicated().await?,
                    hold_count,
                    None,
                )))
            }
            AcquireReply::Busy { wait_ms, now_ms } => {
                guard.disarm();
                *self.anchor.lock() = Some((sent, now_ms));
                // Retry (and so keep the request alive, and serve the line when a holder's lease
                // runs out unseen) well before the request's keep-alive runs out.
                let refresh = self.keepalive / 3;
                Ok(Outcome::Busy {
                    retry_in: Some(
                        wait_ms.map_or(refresh, |ms| Duration::from_millis(ms).min(refresh)),
                    ),
                })
            }
            AcquireReply::UpgradeRefused { read_holds } => {
                // The script took the request out of the line.
                self.queued.granted();
                guard.disarm();
                Err(Error::Refused {
                    kind: Kind::ReadWriteLock.describe(),
                    name: self.name.to_string(),
                    reason: format!(
                        "this read hold's scope holds {read_holds} read hold(s) and no write \
                         hold; a reader cannot upgrade to a write hold (release the read holds \
                         first)"
                    ),
                })
            }
        }
    }
}

impl Attempt for RwAttempt<'_> {
    type Output = LockGuard;

    /// Leaves the line (the client shut down while it waited).
    async fn leave(&self) {
        self.queued.leave_now().await;
    }

    /// This client's own channel for the lock.
    fn channel(&self) -> &str {
        &self.channel
    }

    fn object(&self) -> (Kind, &str) {
        (Kind::ReadWriteLock, self.name)
    }

    /// A release grants the lock to the head of the line and names the call by its marker: its
    /// client wakes that very waiter.
    fn waiter_tag(&self) -> Option<&str> {
        Some(&self.marker)
    }

    fn owned_key(&self) -> Option<&str> {
        Some(&self.keys.key)
    }

    async fn attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        self.try_once(&self.keepalive_ms).await
    }

    /// A try that leaves the line when refused (keep-alive 0): the wait ran out, so no release
    /// may grant the lock to this call any more.
    async fn last_attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        let outcome = self.try_once("0").await?;
        if !matches!(outcome, Outcome::Acquired(_)) {
            // The script took the request out: nothing is left to leave.
            self.queued.granted();
        }
        Ok(outcome)
    }

    /// The hold is this call's already: the release that freed the lock made the call's request
    /// a hold and said so on this client's channel, with the owner's count in that mode.
    async fn claim(&self, grant: Grant) -> Result<Option<LockGuard>, Error> {
        let anchor = *self.anchor.lock();
        let Some(guard) = self.hold_guard().claim_grant(anchor, grant)? else {
            return Ok(None);
        };
        // The grant took the request out of the line.
        self.queued.granted();
        let guard = guard.replicated().await?;
        Ok(Some(LockGuard::new(guard, grant.hold_count, None)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<ReadWriteLock>();
    }
}
