//! [`Lock`]: the reentrant distributed lock, and its [`LockGuard`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::{
    decode_cancel, hold_marker, AcquireReply, ACQUIRE, CANCEL, RELEASE, RENEW, WAITER_KEEPALIVE,
};
use lockkit_protocol::script::Script;
use lockkit_protocol::wake::Grant;
use parking_lot::Mutex;
use tokio::time::Instant;

use crate::acquire::{acquire, Attempt, Outcome};
use crate::core::ClientInner;
use crate::error::During;
use crate::error::Error;
use crate::exec::{Deadline, Resend};
use crate::guard::{lease_mode, HoldGuard};
use crate::hold::{lease_millis, HoldKind};
use crate::object::Object;
use crate::owner;
use crate::queued::{Leave, Queued};

/// What distinguishes the reentrant hash locks that share this file's machinery: their kind
/// (key segment), acquire script and hold kind. Their data layout and replies are the same.
#[derive(Debug)]
pub(crate) struct Flavor {
    pub(crate) kind: Kind,
    pub(crate) acquire: &'static Script,
    pub(crate) holds: HoldKind,
    /// How a waiting request leaves (hands back a grant it did not claim).
    pub(crate) leave: &'static Leave,
}

/// How a waiter of a lock or fenced lock that gives up leaves the waiting set (and hands on a
/// reservation it was given).
static LOCK_LEAVE: Leave = Leave {
    script: &CANCEL,
    keys: |keys| {
        let aux = |suffix| keys.aux(suffix).unwrap_or_default();
        vec![&keys.key, aux("handoff"), aux("waiting"), aux("timeouts")]
    },
    decode: decode_cancel,
};

/// A fenced lock's waiting request leaving: as a lock's, with the token counter (a grant handed
/// on mints a token).
pub(crate) static FENCED_LEAVE: Leave = Leave {
    script: &CANCEL,
    keys: |keys| {
        let aux = |suffix| keys.aux(suffix).unwrap_or_default();
        vec![
            &keys.key,
            aux("handoff"),
            aux("waiting"),
            aux("timeouts"),
            aux("token"),
        ]
    },
    decode: decode_cancel,
};

/// The plain reentrant lock.
pub(crate) static PLAIN: Flavor = Flavor {
    kind: Kind::Lock,
    acquire: &ACQUIRE,
    holds: HoldKind {
        kind: Kind::Lock,
        release: &RELEASE,
        renew: &RENEW,
    },
    leave: &LOCK_LEAVE,
};

/// A reentrant lock shared by every client that uses the same name and Redis.
///
/// Get one with [`Client::lock`](crate::Client::lock). The handle is cheap, `Clone + Send + Sync`, and sends nothing
/// until used.
///
/// # Ownership and reentrancy
/// Every plain acquire (`lock()`, `try_lock()`, `lock_with_lease()`) is an **owner of its own**:
/// a second acquire waits until the first is released, even in the same task — two futures of
/// one task (`join!`, `join_all`, `select!`) never hold the lock together, as with
/// `tokio::sync::Mutex`. The returned [`LockGuard`] carries its owner, so it can be moved into
/// another task (`tokio::spawn`) and unlocked there.
///
/// **Re-entry happens inside the holder's scope**: the body of [`with_lock`](Lock::with_lock) /
/// [`try_with_lock`](Lock::try_with_lock), of a `#[locked]` function, of
/// [`Client::run_exclusive`](crate::Client::run_exclusive), or a future run with [`LockGuard::scope`]. An acquire of the same
/// lock through the same client made anywhere inside that future re-enters: it is granted at
/// once and counts one more hold, to be released on its own.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// let lock = client.lock("order:42");
/// lock.with_lock(|_lease| async {
///     // A helper that locks the same order again re-enters here.
///     let inner = lock.lock().await?;
///     assert_eq!(inner.hold_count(), 2);
///     inner.unlock().await
/// })
/// .await??;
/// # Ok(()) }
/// ```
///
/// A task that waits for a lock it acquired itself and has not released logs a warning naming
/// the lock: unless that guard was moved to a task that will release it, this is a
/// self-deadlock.
///
/// # Leases
/// Every hold has a lease of its own, so a crashed holder cannot keep the lock forever, and no
/// hold outlives its own lease (a re-entry with a short fixed lease ends on time inside a long
/// watchdog hold, and the other way round); the lock is held while at least one hold is live:
/// - **watchdog mode** (`lease: None`, [`lock`](Lock::lock)): the lease is the client's watchdog
///   timeout (30 s by default), renewed every third of it for as long as the guard lives;
/// - **fixed lease** (`Some(lease)`, [`lock_with_lease`](Lock::lock_with_lease)): the hold
///   expires after `lease`, guard or no guard.
///
/// When a lease is lost (renewal found the lock gone, or it ran out unrenewed), the guard says so:
/// [`LockGuard::is_lost`], [`LockGuard::lost`].
///
/// # Waiting
/// A task that finds the lock taken joins the lock's waiting set in Redis, subscribes to its
/// client's own channel for the lock and sleeps until a release wakes it, or at most until the
/// holder's lease would end; while it waits it retries every third of
/// [`WAITER_KEEPALIVE`](lockkit_protocol::lock::WAITER_KEEPALIVE) to show it is still there.
/// A release that frees the lock **grants** it, in the same script, to the call that has waited
/// longest: that call holds the lock from then on (its own hold, its own lease, counted from the
/// grant) and returns as soon as its client hears so, without another round trip. Nobody can
/// barge in between, not a newcomer and not the task that just unlocked, so waiters are served
/// in the order in which they first found the lock taken. A grant is on probation for
/// [`GRANT_PROBATION`](lockkit_protocol::lock::GRANT_PROBATION) (5 s) until the waiter's client
/// confirms it, which it does by itself: a grant to a client that died unseen costs the others
/// that long at most, never a lease. A waiter that gives up (its `wait` ran out, its future was
/// dropped, on the runtime or off it, the client shut down) leaves the set at once and gives
/// back a grant that was on its way to it; one whose client died is skipped by the next release
/// once its connection is closed, and dropped once its keep-alive has passed. (Only a
/// [`MultiLock`](crate::MultiLock) waiting for several locks at once is not granted a lock: a
/// release reserves it for the multi-lock for a few milliseconds instead, and a multi-lock that
/// cannot use it yet passes it on to the next waiter at once.)
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// let lock = client.lock("report:daily");
/// // The 02:00 job: run on whichever pod gets there first, skip on the others.
/// match lock.try_lock(Duration::ZERO, None).await? {
///     Some(guard) => {
///         // ... generate the report ...
///         guard.unlock().await?;
///     }
///     None => println!("another pod is running the report"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Lock {
    object: Object,
    flavor: &'static Flavor,
}

impl Lock {
    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self::with_flavor(client, name, &PLAIN)
    }

    pub(crate) fn with_flavor(
        client: Arc<ClientInner>,
        name: String,
        flavor: &'static Flavor,
    ) -> Self {
        Self {
            object: Object::new(client, flavor.kind, name),
            flavor,
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    fn keys(&self) -> Result<&Arc<ObjectKeys>, Error> {
        self.object.keys()
    }

    /// What makes two handles the same member of a multi-lock: the client they go through, the
    /// kind and the name (one client's kind and name make one key).
    pub(crate) fn identity(&self) -> (&str, Kind, &str) {
        (&self.object.client.id, self.flavor.kind, &self.object.name)
    }

    /// Whether `guard` is a hold of this very lock: it names the same key, and its owner holds
    /// this lock as seen through this handle's client. Tells a lock reached through two clients
    /// of one Redis (the same lock) from same-named locks on two deployments.
    pub(crate) async fn is_held_by(&self, guard: &LockGuard) -> Result<bool, Error> {
        let hold = guard.hold();
        let (Ok(keys), Some(owner)) = (self.keys(), hold.owner.as_deref()) else {
            return Ok(false);
        };
        if keys.key != hold.keys.key {
            return Ok(false);
        }
        Ok(self.object.hold_count_of(&[owner]).await? > 0)
    }

    /// Waits as long as it takes, then holds the lock in watchdog mode.
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
    /// [`Error::InvalidArgument`] for an invalid name.
    #[doc(alias = "lock_owned")]
    pub async fn lock(&self) -> Result<LockGuard, Error> {
        self.lock_inner(None).await.during("lock")
    }

    /// Waits as long as it takes, then holds the lock for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`lock`](Lock::lock).
    ///
    /// # Errors
    /// As [`lock`](Lock::lock); [`Error::InvalidArgument`] for a lease shorter than
    /// [`MIN_LEASE`](crate::MIN_LEASE) (1 ms) or over [`MAX_LEASE`](crate::MAX_LEASE).
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

    /// Tries to take the lock, waiting at most `wait`.
    ///
    /// - `wait = Duration::ZERO` makes one attempt and never waits;
    /// - `lease = None` takes it in watchdog mode, `Some(lease)` with a fixed lease.
    ///
    /// Returns `Ok(None)` when the lock was not acquired within `wait`: someone else held it. A
    /// `wait` too long to represent as a deadline waits without bound.
    ///
    /// Returns within `wait` whatever Redis does, plus at most one round trip for a try still in
    /// flight then (1 s, or the [command timeout](crate::ClientBuilder::command_timeout) if
    /// shorter); with `wait = Duration::ZERO`, within that one round trip. The same bound holds
    /// for every `try_*` method of every primitive.
    ///
    /// # Cancel safety
    /// As [`lock`](Lock::lock).
    ///
    /// # Errors
    /// As [`lock_with_lease`](Lock::lock_with_lease). When Redis did not answer within that
    /// bound (down, unreachable, too slow), [`Error::Redis`] with
    /// [`is_timeout`](crate::RedisError::is_timeout) and the lock's name in
    /// [`object`](crate::RedisError::object), never `Ok(None)`; nothing is held (a try cut off
    /// gives back in the background whatever it may have taken).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// let lock = client.lock("ticket:7");
    /// if let Some(guard) = lock.try_lock(Duration::from_secs(5), Some(Duration::from_secs(3))).await? {
    ///     // held for at most 3 s
    ///     guard.unlock().await?;
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
        // A single attempt (`try_lock(ZERO)`) never joins the waiting set: the lock must not be
        // reserved for a caller that is gone.
        let keepalive = if wait == Some(Duration::ZERO) {
            Duration::ZERO
        } else {
            WAITER_KEEPALIVE
        };
        let attempt = self.attempt(lease, keepalive, false)?;
        acquire(self.object.inner(), &attempt, wait).await
    }

    /// One acquire call's attempt, as the calling context's owner (see [`crate::owner`]), with
    /// one hold marker for all its tries; `looks`: a multi-lock member's, whose waiting request
    /// only looks.
    fn attempt(
        &self,
        lease: Option<Duration>,
        keepalive: Duration,
        looks: bool,
    ) -> Result<LockAttempt<'_>, Error> {
        let keys = self.keys()?;
        let inner = self.object.inner();
        let (lease, watchdog) = lease_mode(inner, lease)?;
        let owner = inner.owner_for(&keys.key);
        let seq = inner.next_sequence();
        let marker = hold_marker(&inner.id, seq);
        let lease_ms = lease_millis(lease).to_string();
        // Grants to this client's waiters come on a channel of its own, with the lock's hash tag.
        let channel = keys.client_channel(&inner.id);
        let request = request(
            &marker,
            if looks { "0" } else { &lease_ms },
            &owner,
            &channel,
        );
        Ok(LockAttempt {
            flavor: self.flavor,
            client: self.object.inner(),
            name: &self.object.name,
            keys,
            queued: Queued::new(
                inner,
                self.flavor.kind,
                &self.object.name,
                keys,
                self.flavor.leave,
                request,
            ),
            owner,
            seq,
            marker,
            channel,
            anchor: Mutex::new(None),
            lease,
            lease_ms,
            watchdog,
            keepalive,
            keepalive_ms: lease_millis(keepalive).to_string(),
        })
    }

    /// This lock as a member of one multi-lock acquire call (see [`Member`]).
    pub(crate) fn member(&self, lease: Option<Duration>) -> Result<Member<'_>, Error> {
        Ok(Member {
            attempt: self.attempt(lease, WAITER_KEEPALIVE, true)?,
        })
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails.
    pub async fn is_locked(&self) -> Result<bool, Error> {
        self.object.exists().await.during("is_locked")
    }

    /// Whether the calling code holds the lock through this client: inside a holder's
    /// [scope](LockGuard::scope), whether that holder still holds it; and whether a guard the
    /// calling task acquired and has not released (wherever it was moved) still holds it.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the key holds something else.
    pub async fn is_held_by_current_task(&self) -> Result<bool, Error> {
        Ok(self.hold_count().await.during("is_held_by_current_task")? > 0)
    }

    /// The reentrant count of the owners the calling code acts as on this lock, through this
    /// client (0: none): inside a holder's [scope](LockGuard::scope), that owner's count; outside
    /// any scope, the counts of the owners of the guards the calling task acquired and has not
    /// released (wherever they were moved), added up.
    ///
    /// An owner's count is every live hold it has: its first hold plus every re-entry made inside
    /// its scope, whichever future or task made it (another future of a `join!` in the scope,
    /// another task running [`LockGuard::scope`]). A task outside the scope that acquired nothing
    /// counts 0. A hold whose lease ended is not counted.
    ///
    /// ```no_run
    /// # async fn demo(lock: lockkit::Lock) -> Result<(), lockkit::Error> {
    /// let guard = lock.lock().await?;
    /// assert_eq!(lock.hold_count().await?, 1);
    /// guard
    ///     .scope(async {
    ///         let inner = lock.lock().await?; // re-enters: same owner
    ///         assert_eq!(lock.hold_count().await?, 2);
    ///         inner.unlock().await
    ///     })
    ///     .await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`is_held_by_current_task`](Lock::is_held_by_current_task).
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

    /// Deletes the lock whoever holds it and wakes its waiters; returns whether it was locked.
    ///
    /// This is an administrative operation: the holders are not asked. Their guards find out at
    /// the next renewal (watchdog mode), report [`is_lost`](LockGuard::is_lost) from then on, and
    /// get [`Error::NotHeld`] from [`unlock`](LockGuard::unlock).
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

/// A waiting request as the scripts file it (`scripts/handoff_lib.lua`):
/// `<marker> <lease ms> <owner> <channel>`, lease `0` for a request that only looks.
fn request(marker: &str, lease_ms: &str, owner: &str, channel: &str) -> String {
    format!("{marker} {lease_ms} {owner} {channel}")
}

struct LockAttempt<'a> {
    flavor: &'static Flavor,
    client: &'a Arc<ClientInner>,
    name: &'a Arc<str>,
    keys: &'a Arc<ObjectKeys>,
    owner: Arc<str>,
    /// The sequence number and marker of the one hold this acquire call takes, in every try and
    /// in a grant.
    seq: u64,
    marker: String,
    /// This client's own channel for the lock: grants to its waiters are published there.
    channel: String,
    /// When the latest refused try was sent, and the server's clock when it ran: a grant's
    /// expiry (server time) is read against it, conservatively.
    anchor: Mutex<Option<(Instant, u64)>>,
    /// The owner's entry in the lock's waiting set, left when the call gives up.
    queued: Queued<'a>,
    lease: Duration,
    lease_ms: String,
    watchdog: bool,
    /// How long the waiting-set entry lives without a retry; zero: try once, never join (a
    /// `try_lock(ZERO)` that fails must not be handed the lock later).
    keepalive: Duration,
    keepalive_ms: String,
}

impl LockAttempt<'_> {
    /// What a refused try means for the wait: sleep at most until the holder's lease ends (and
    /// retry well before the waiting-set entry's keep-alive runs out), or until the reservation
    /// for another waiter ends.
    fn refused<T>(&self, reply: AcquireReply) -> Outcome<T> {
        // A waiter retries (and so keeps its entry alive) well before the keep-alive runs out,
        // even when no message comes and the holder's lease is long.
        let refresh = self.keepalive / 3;
        match reply {
            AcquireReply::Busy { pttl_ms, .. } => Outcome::Busy {
                retry_in: Some(
                    pttl_ms.map_or(refresh, |ms| Duration::from_millis(ms).min(refresh)),
                ),
            },
            AcquireReply::Reserved { window_ms, .. } => Outcome::Reserved {
                window: Duration::from_millis(window_ms),
                refresh,
            },
            // Not a refusal: the callers match a grant first.
            AcquireReply::Acquired { .. } => Outcome::Busy { retry_in: None },
        }
    }
}

/// A lock as a member of one multi-lock acquire call ([`crate::MultiLock`]). Its owner is fixed
/// for the whole call, so its place in the lock's waiting set, and a reservation a release made
/// for it, outlast a round in which another member was busy. Dropped while the call still waits
/// (it gave up, failed or was cancelled), its entry leaves the waiting set and a reservation it
/// had goes on to the next waiter.
pub(crate) struct Member<'a> {
    attempt: LockAttempt<'a>,
}

impl Member<'_> {
    /// One command timeout from now: the bound of a take in a call with no wait.
    pub(crate) fn command_deadline(&self) -> Deadline {
        self.attempt.client.exec.command_deadline()
    }

    /// One try to take the lock now as the call's owner (a reservation for it included),
    /// bounded by `bound`, the call's own; `None` when it is held by another owner or reserved
    /// for one. Joins nothing.
    pub(crate) async fn take(&self, bound: Deadline) -> Result<Option<LockGuard>, Error> {
        let take = Take(&self.attempt);
        crate::acquire::acquire_once(self.attempt.client, &take, bound).await
    }

    /// Waits, holding nothing, until the lock would be granted to the call's owner: free, or
    /// reserved for it (which lasts the handoff window). Waits as a waiter of the lock does:
    /// in its waiting set, woken by its releases. `false`: not within `wait`.
    pub(crate) async fn until_free(&self, wait: Option<Duration>) -> Result<bool, Error> {
        let look = Look(&self.attempt);
        Ok(crate::acquire::wait_until(self.attempt.client, &look, wait)
            .await?
            .is_some())
    }

    /// The call took every member: the grants took its entries out of the waiting sets.
    pub(crate) fn granted(&self) {
        self.attempt.queued.granted();
    }

    /// The call cannot take this member now, which it had seen free or reserved for it (its
    /// round failed before it came to it, or another member was still busy when the handoff
    /// window ended): a reservation it holds goes on to the next waiter now, rather than keeping
    /// the lock from everyone until its window ends, and so does one that lapsed meanwhile,
    /// which would otherwise wake nobody. The member joins the line again with its next look.
    pub(crate) async fn pass(&self) {
        self.attempt.queued.leave_now().await;
    }
}

/// A member's one try to take the lock, which never joins its waiting set.
struct Take<'a, 'b>(&'b LockAttempt<'a>);

impl Attempt for Take<'_, '_> {
    type Output = LockGuard;

    fn channel(&self) -> &str {
        self.0.channel()
    }

    fn object(&self) -> (Kind, &str) {
        self.0.object()
    }

    async fn attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        self.0.try_once("0").await
    }
}

/// A member's look at the lock: "free for this owner", or join (stay in) the waiting set.
struct Look<'a, 'b>(&'b LockAttempt<'a>);

impl Attempt for Look<'_, '_> {
    type Output = ();

    fn channel(&self) -> &str {
        self.0.channel()
    }

    fn object(&self) -> (Kind, &str) {
        self.0.object()
    }

    fn waiter_tag(&self) -> Option<&str> {
        self.0.waiter_tag()
    }

    fn owned_key(&self) -> Option<&str> {
        self.0.owned_key()
    }

    async fn attempt(&self) -> Result<Outcome<()>, Error> {
        let attempt = self.0;
        let client = attempt.client;
        attempt.queued.joining();
        let keys: Vec<&str> = attempt.keys.keys.iter().map(String::as_str).collect();
        let reply = client
            .exec
            .ints(
                attempt.flavor.acquire,
                attempt.flavor.kind,
                &keys,
                &[
                    &attempt.owner,
                    // No hold is taken: the marker only names the waiting request.
                    &attempt.marker,
                    &attempt.lease_ms,
                    &attempt.keepalive_ms,
                    &attempt.channel,
                    client.exec.publish_flag(),
                    "1",
                ],
                Resend::Allowed,
            )
            .await?;
        Ok(match lockkit_protocol::lock::decode_look(&reply)? {
            None => Outcome::Acquired(()),
            Some(refused) => attempt.refused(refused),
        })
    }
}

impl Attempt for LockAttempt<'_> {
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
        (self.flavor.kind, self.name)
    }

    /// A release grants the lock to the request that has waited longest (or reserves it for a
    /// multi-lock member) and names it by its marker: its client wakes that very waiter.
    fn waiter_tag(&self) -> Option<&str> {
        Some(&self.marker)
    }

    fn owned_key(&self) -> Option<&str> {
        Some(&self.keys.key)
    }

    async fn attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        self.try_once(&self.keepalive_ms).await
    }

    /// A try that leaves the waiting set when refused (keep-alive 0): the wait ran out, so no
    /// release may grant the lock to this call any more.
    async fn last_attempt(&self) -> Result<Outcome<LockGuard>, Error> {
        let outcome = self.try_once("0").await?;
        if !matches!(outcome, Outcome::Acquired(_)) {
            // The script took the entry out: nothing is left to leave.
            self.queued.granted();
        }
        Ok(outcome)
    }

    /// The lock is this call's already: the release that freed it made the call's request the
    /// holder and said so on this client's channel ([`HoldGuard::claim_grant`], read against the
    /// latest refused try).
    async fn claim(&self, grant: Grant) -> Result<Option<LockGuard>, Error> {
        let anchor = *self.anchor.lock();
        let Some(guard) = self.hold_guard().claim_grant(anchor, grant)? else {
            return Ok(None);
        };
        // The grant took the request out of the waiting set.
        self.queued.granted();
        let guard = guard.replicated().await?;
        Ok(Some(LockGuard::new(guard, grant.hold_count, grant.token)))
    }
}

impl LockAttempt<'_> {
    /// The guard of the call's one hold (its marker), armed: made before each try is sent, and
    /// for a grant.
    fn hold_guard(&self) -> HoldGuard {
        HoldGuard::prepare_marked(
            self.client,
            &self.flavor.holds,
            self.name,
            self.keys,
            (self.lease, self.watchdog),
            Some(&self.owner),
            self.seq,
        )
    }

    /// One run of the acquire script; `keepalive_ms` = "0" never joins the waiting set.
    async fn try_once(&self, keepalive_ms: &str) -> Result<Outcome<LockGuard>, Error> {
        let client = self.client;
        // Armed before sending: if this future is dropped, or the reply is lost, whatever the
        // script may have taken is given back.
        let guard = self.hold_guard();
        if keepalive_ms != "0" {
            self.queued.joining();
        }
        let sent = Instant::now();
        let keys: Vec<&str> = self.keys.keys.iter().map(String::as_str).collect();
        let mut args: Vec<&str> = vec![
            &self.owner,
            &self.marker,
            &self.lease_ms,
            keepalive_ms,
            &self.channel,
            client.exec.publish_flag(),
        ];
        // A fenced acquire mints: the token counter's TTL.
        args.extend(client.exec.counter_ttl_arg(self.flavor.kind));
        let reply = client
            .exec
            .ints(
                self.flavor.acquire,
                self.flavor.kind,
                &keys,
                &args,
                Resend::Allowed,
            )
            .await?;
        match AcquireReply::decode(&reply)? {
            AcquireReply::Acquired { hold_count, token } => {
                // Taking the lock takes the owner out of the waiting set in the same script.
                self.queued.granted();
                Ok(Outcome::Acquired(LockGuard::new(
                    guard.granted(sent)?.replicated().await?,
                    hold_count,
                    token,
                )))
            }
            refused => {
                guard.disarm();
                if let AcquireReply::Busy { now_ms, .. } | AcquireReply::Reserved { now_ms, .. } =
                    refused
                {
                    *self.anchor.lock() = Some((sent, now_ms));
                }
                Ok(self.refused(refused))
            }
        }
    }
}

/// One hold on a [`Lock`]. Releases it when dropped.
///
/// Prefer [`unlock`](LockGuard::unlock), which reports whether the hold was still there; a guard
/// that is merely dropped is released in the background (never leaked), and the release's result
/// only goes to the log.
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    guard: HoldGuard,
    hold_count: u32,
    fencing_token: Option<u64>,
}

impl std::fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hold = self.guard.hold();
        f.debug_struct("LockGuard")
            .field("name", &hold.name)
            .field("watchdog", &hold.watchdog)
            .field("lease", &hold.lease)
            .field("hold_count", &self.hold_count)
            .field("lost", &hold.is_lost())
            .finish()
    }
}

impl LockGuard {
    pub(crate) fn new(guard: HoldGuard, hold_count: u32, fencing_token: Option<u64>) -> Self {
        Self {
            guard,
            hold_count,
            fencing_token,
        }
    }

    /// The hold behind this guard (for the closure helpers' [`Lease`](crate::Lease)).
    pub(crate) fn hold(&self) -> &Arc<crate::hold::Hold> {
        self.guard.hold()
    }

    /// See [`HoldGuard::forget_taken`].
    pub(crate) fn forget_taken(&mut self) {
        self.guard.forget_taken();
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.guard.hold().name
    }

    /// Whether the hold is renewed by the watchdog (`true`) or has a fixed lease.
    pub fn is_watchdog(&self) -> bool {
        self.guard.hold().watchdog
    }

    /// The hold count of the owner right after this hold was taken (1 for a first hold).
    pub fn hold_count(&self) -> u32 {
        self.hold_count
    }

    /// The fencing token of this acquisition: `Some` for a
    /// [`FencedLock`](crate::FencedLock)'s (strictly increasing across every acquisition of that
    /// lock, re-entries included), `None` for other locks. A fenced lock hands out a
    /// [`FencedGuard`](crate::FencedGuard), whose [`fencing_token`](crate::FencedGuard::fencing_token)
    /// is a plain `u64`; this one is `Some` once that guard is turned into a `LockGuard`.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// Whether the lease is known to be gone: renewal found the lock missing (force-unlocked,
    /// Redis restarted empty), or the lease ran out without being renewed (fixed lease past its
    /// end, Redis unreachable, the runtime too busy to renew). Once `true`, it stays `true`.
    ///
    /// The local clock starts a lease when the acquire or renewal is *sent*, so the guard reports
    /// a lost lease no later than Redis drops it.
    pub fn is_lost(&self) -> bool {
        self.guard.hold().is_lost()
    }

    /// Resolves when [`is_lost`](LockGuard::is_lost) becomes true (or the guard is released).
    /// Use it to abort a critical section that must not outlive the lease:
    ///
    /// ```no_run
    /// # async fn demo(lock: lockkit::Lock) -> Result<(), lockkit::Error> {
    /// # async fn long_job() {}
    /// let guard = lock.lock().await?;
    /// tokio::select! {
    ///     () = long_job() => guard.unlock().await?,
    ///     () = guard.lost() => eprintln!("lease lost; job aborted"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// The future does not borrow the guard and may be moved into another task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.hold().lost_signal()
    }

    /// Runs `fut` inside this hold's **scope**: every acquire of the same lock through the same
    /// [`Client`](crate::Client) made while `fut` runs — `lock()`, `try_lock()`, `lock_with_lease()`, the
    /// closure helpers, `#[locked]` functions, at any depth of the future tree — re-enters as
    /// this hold's owner: it is granted at once, counts one more hold, and gets a guard of its
    /// own to release. Outside the scope every acquire is an owner of its own and waits, as
    /// with `tokio::sync::Mutex`.
    ///
    /// **A scope is entered where it runs.** `scope(fut)` only wraps `fut`: the scope takes its
    /// place in the tree of scopes each time the returned future is polled, inside the scopes
    /// that poll runs in, never where `scope(..)` was called. So:
    /// - scopes nest, also across locks, whatever the order they were made in:
    ///   `ga.scope(gb.scope(fut))` makes the inner scope first (Rust evaluates arguments
    ///   first), and `fut` still runs inside both (this is how to re-enter the members of a
    ///   [`MultiLockGuard`](crate::MultiLockGuard));
    /// - a future spawned from inside the scope (`tokio::spawn`, a `LocalSet` task) is outside
    ///   it, even a scope future that was made inside it: a scope belongs to the task that
    ///   polls it.
    ///
    /// For a [`ReadWriteLock`](crate::ReadWriteLock) hold, a write hold's scope
    /// may take read holds (downgrade); a read hold's scope asking for the write lock gets
    /// [`Error::Refused`] (an upgrade could never be granted while it waits on itself). A spin
    /// lock is not reentrant: inside its scope the same lock waits as anywhere else.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// # async fn reserve(_lock: &lockkit::Lock) -> Result<(), lockkit::Error> { Ok(()) }
    /// let lock = client.lock("order:42");
    /// let guard = lock.lock().await?;
    /// // `reserve` may take the same lock again (a nested helper): inside the scope it re-enters.
    /// guard.scope(reserve(&lock)).await?;
    /// guard.unlock().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// Nested and spawned scopes:
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// let (a, b) = (client.lock("account:1"), client.lock("account:2"));
    /// let both = client.multi_lock([a.clone(), b.clone()]).lock().await?;
    /// let [ga, gb] = both.guards() else { unreachable!() };
    ///
    /// // Nested: inside both scopes, both locks re-enter.
    /// ga.scope(gb.scope(async {
    ///     let again = a.lock().await?; // re-enters `a` (hold count 2)
    ///     again.unlock().await
    /// }))
    /// .await?;
    ///
    /// // Spawned: made inside a's scope, run by another task, so outside it.
    /// let a2 = a.clone();
    /// let spawned = ga
    ///     .scope(async {
    ///         let in_b = gb.scope(async move { a2.try_lock(Duration::from_millis(100), None).await });
    ///         tokio::spawn(in_b).await // waits for `a`, which this task holds: Ok(Ok(None))
    ///     })
    ///     .await;
    /// assert!(matches!(spawned, Ok(Ok(None))));
    /// both.unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn scope<F: Future>(&self, fut: F) -> impl Future<Output = F::Output> {
        let hold = self.guard.hold();
        // A spin-lock hold has no owner to re-enter as: its scope is a frame nothing matches
        // (spin-lock acquires never look for one).
        let owner = hold.owner.clone().unwrap_or_else(|| Arc::from(""));
        owner::in_scope(
            Arc::clone(&self.guard.client().id),
            Arc::from(hold.key()),
            owner,
            fut,
        )
    }

    /// Releases this hold now.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release goes on in the background.
    ///
    /// Takes at most the [command timeout](crate::ClientBuilder::command_timeout), resends
    /// included, whatever Redis does; a guard already [lost](LockGuard::is_lost) answers within
    /// one round trip (1 s, or the command timeout if shorter).
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the hold was already gone (its lease ran out, or the lock was
    /// force-unlocked): the critical section may have overlapped with another holder's. A guard
    /// known lost answers so without waiting for an unreachable Redis (its release goes on in
    /// the background).
    /// [`Error::Shutdown`] after [`Client::shutdown`](crate::Client::shutdown), which already released it.
    /// [`Error::Redis`] when Redis fails or does not answer within the command timeout (naming the
    /// lock); the hold is then no longer renewed, and its release goes on in the background
    /// until Redis answers (if it never does, the hold frees when its lease runs out).
    pub async fn unlock(self) -> Result<(), Error> {
        self.guard.release().await.during("unlock")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}
    fn send_static<T: Send + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<Lock>();
        bounds::<crate::Client>();
        send_static::<LockGuard>();
    }
}
