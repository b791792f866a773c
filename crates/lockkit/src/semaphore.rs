//! [`Semaphore`]: a counting semaphore whose permits are leased, and its [`SemaphorePermit`].
//!
//! The machinery here (administration, the acquire attempt) is shared with
//! [`PermitExpirableSemaphore`](crate::PermitExpirableSemaphore): both kinds keep the same data and
//! run the same scripts (`lockkit_protocol::semaphore`).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::{decode_cancel, WAITER_KEEPALIVE};
use lockkit_protocol::semaphore::{
    decode_try_set_permits, AcquireReply, AddReply, AvailableReply, ACQUIRE, ADD_PERMITS,
    AVAILABLE, CANCEL, RELEASE, RENEW, TRY_SET_PERMITS,
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

/// The most permits a semaphore can have in total (and so the most one acquisition can take).
pub(crate) const MAX_PERMITS: u64 = u32::MAX as u64;

/// How holds of a [`Semaphore`] are released and renewed.
pub(crate) static SEMAPHORE_HOLDS: HoldKind = HoldKind {
    kind: Kind::Semaphore,
    release: &RELEASE,
    renew: &RENEW,
};

/// How a waiter of either semaphore kind that gives up leaves the line (and hands on permits a
/// release granted it).
static SEMAPHORE_LEAVE: Leave = Leave {
    script: &CANCEL,
    keys: key_refs,
    decode: decode_cancel,
};

/// A counting semaphore shared by every client that uses the same name and Redis: at most
/// `permits` permits are held at any time, across every task, client and process.
///
/// Get one with [`Client::semaphore`](crate::Client::semaphore). The handle is cheap, `Clone + Send + Sync`, and sends
/// nothing until used. Give it its total with [`with_permits`](Semaphore::with_permits) (or set
/// the total once with [`try_set_permits`](Semaphore::try_set_permits): every instance may call
/// it at start-up, only the first call sets it), then take permits with
/// [`acquire`](Semaphore::acquire) or [`try_acquire`](Semaphore::try_acquire).
///
/// # Data loss
/// The client remembers the total each semaphore was configured with
/// ([`with_permits`](Semaphore::with_permits)), set to
/// ([`try_set_permits`](Semaphore::try_set_permits), whether or not that call was the first) or
/// resized to ([`add_permits`](Semaphore::add_permits)), by name, for every handle of the client.
/// Every acquire passes it, and an acquire that finds the semaphore's keys gone (an empty restart,
/// `FLUSHALL`, an eviction, a failover to a lagging replica) sets the total again, atomically,
/// before it takes its permits: the semaphore keeps working without any application code. If
/// clients remember different totals, the first to find the keys gone sets it (as with
/// `try_set_permits`). Holds taken before the loss are gone with it: their guards report
/// [`is_lost`](SemaphorePermit::is_lost) at the next watchdog round, and their release is
/// [`Error::NotHeld`] (it gives nothing back twice).
///
/// # Leases
/// Unlike a classic semaphore, every hold of permits has a **lease**, as a lock's hold does, so a
/// holder that crashes gives its permits back when its lease ends instead of shrinking the
/// semaphore for good:
/// - **watchdog mode** (`lease: None`, [`acquire`](Semaphore::acquire)): the lease is the client's
///   watchdog timeout (30 s by default), renewed every third of it for as long as the
///   [`SemaphorePermit`] lives;
/// - **fixed lease** (`Some(lease)`, [`acquire_with_lease`](Semaphore::acquire_with_lease)): the
///   permits come back after `lease`, guard or no guard.
///
/// # Ownership
/// Permits are not owned by a task and there is no reentrancy: each acquisition is one hold of `k`
/// permits, given back by its [`SemaphorePermit`] (from any task), or when its lease ends.
///
/// # Waiting: a FIFO line
/// Waiting acquire calls stand in one line in Redis, in the order they first found too few
/// permits, across every client. Whatever frees permits — a release, an
/// [`add_permits`](Semaphore::add_permits), a holder's lease found run out (by any script on the
/// semaphore, at the latest by a waiter's own look, which it makes every third of its 5 s
/// keep-alive) — grants them, in the same script, to the head of the line while the head's
/// request fits: the granted call holds its permits at once and is told on its client's own
/// channel, with one message per client however many of its calls were granted; no other client
/// hears anything.
///
/// **A request for many permits at the head is not overtaken by smaller ones behind it**, even
/// when enough permits are free for them: the same choice as tokio's `Semaphore`, for the same
/// reason — otherwise a steady stream of small requests could starve an `acquire(k)` forever. A
/// call that does not wait is no exception: [`try_acquire`](Semaphore::try_acquire) with a zero
/// `wait` takes permits only when nobody waits ahead of it (it is refused while anyone waits, even
/// with permits free, and never joins the line), so it cannot take permits the head is gathering.
/// [`available_permits`](Semaphore::available_permits) counts the permits free, including those
/// kept for a head that needs more.
///
/// A waiting call that goes away (its wait ran out, its future was dropped, its client shut
/// down) leaves the line at once, and permits granted to it that it had not taken yet go on to
/// the next; the last try of a wait that ran out leaves the line in the same script. A grant
/// is on probation as a lock's is: a grantee that died unseen costs the others at most 5 s, never
/// its lease. A waiter also looks again on its own at least every
/// [recheck interval](crate::ClientBuilder::recheck_interval) (≈ 1.7 s by default): permits that
/// come back without a script on the semaphore (data loss) reach the line within it.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// // At most 3 report exports at a time, across every pod.
/// let exports = client.semaphore("report-exports");
/// exports.try_set_permits(3).await?; // false on every pod but the first: fine
/// if let Some(permit) = exports.try_acquire(1, Duration::from_secs(10), None).await? {
///     // ... export ...
///     permit.release().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct Semaphore {
    object: Object,
}

impl Semaphore {
    /// The most permits a semaphore can have in total: 4,294,967,295.
    pub const MAX_PERMITS: u64 = MAX_PERMITS;

    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::Semaphore, name),
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    /// Configures the semaphore's total: an acquire that finds no total (never set, or lost with
    /// Redis's data) sets it to `permits` first, atomically, so neither a first start nor a
    /// restart of Redis from empty needs a [`try_set_permits`](Semaphore::try_set_permits) call.
    /// A total already set is left as it is: the first initialiser wins.
    ///
    /// The total is remembered by the client for this name (every handle of the semaphore made
    /// from this client uses it, until [`try_set_permits`](Semaphore::try_set_permits) or
    /// [`add_permits`](Semaphore::add_permits) through this client replaces it). Sends nothing;
    /// it returns a `Result` so that a bad total is reported where it is configured (usually at
    /// start-up), not at the first acquire, which may run much later.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for more than [`MAX_PERMITS`](Semaphore::MAX_PERMITS) or an
    /// invalid name; [`Error::Shutdown`] once the client is shut down.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// let exports = client.semaphore("report-exports").with_permits(3)?;
    /// let permit = exports.acquire(1).await?; // no try_set_permits needed, even after a restart
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_permits(self, permits: u64) -> Result<Self, Error> {
        configure(&self.object, permits)?;
        Ok(self)
    }

    /// The total this client would set the semaphore to if its keys were gone: the last one given
    /// to [`with_permits`](Semaphore::with_permits) or
    /// [`try_set_permits`](Semaphore::try_set_permits), or returned by
    /// [`add_permits`](Semaphore::add_permits), through any handle of this client. `None` if
    /// there was none.
    pub fn configured_permits(&self) -> Option<u64> {
        configured_permits(&self.object)
    }

    /// Sets the total number of permits to `permits`, only if it was never set; returns whether
    /// this call set it. Either way, the client remembers `permits` as the semaphore's total (see
    /// [`with_permits`](Semaphore::with_permits)), so the semaphore is set up again with it if
    /// its keys are lost. A total that is set serves the line (a waiter waiting since the keys
    /// were lost is refused at once if it asks for more).
    ///
    /// Zero is accepted (no acquisition is possible until [`add_permits`](Semaphore::add_permits)
    /// adds some).
    ///
    /// # Cancel safety
    /// The request is sent at most once; dropping the future after that leaves it to run or not.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for more than [`MAX_PERMITS`](Semaphore::MAX_PERMITS) or an
    /// invalid name; [`Error::Redis`] when Redis fails — when the error
    /// [`is_ambiguous`](crate::RedisError::is_ambiguous) the total may or may not have been set
    /// (calling again answers `false` either way; [`available_permits`](Self::available_permits)
    /// tells).
    pub async fn try_set_permits(&self, permits: u64) -> Result<bool, Error> {
        try_set_permits(&self.object, permits)
            .await
            .during("try_set_permits")
    }

    /// Adds `permits` to the total (a negative number takes them away) and returns the new total.
    ///
    /// - On a semaphore whose total is absent (never set, or lost with the data), the total
    ///   starts from the [configured total](Semaphore::configured_permits), or from zero.
    /// - The client remembers the new total as the semaphore's configured total.
    /// - Added permits are granted to the line's head while its request fits (see
    ///   [Waiting](Semaphore#waiting-a-fifo-line)).
    /// - Taking permits away never takes them from holders: while holders keep more than the new
    ///   total, no permit is free, and they come back as holders release. A waiter that asks for
    ///   more than the new total leaves the line and is refused at once.
    ///
    /// # Cancel safety
    /// As [`try_set_permits`](Semaphore::try_set_permits).
    ///
    /// # Errors
    /// [`Error::Refused`] when the total would go below zero or above
    /// [`MAX_PERMITS`](Semaphore::MAX_PERMITS) (nothing changes); [`Error::Redis`] when Redis
    /// fails — when the error [`is_ambiguous`](crate::RedisError::is_ambiguous) the change may or
    /// may not have been made: the request is never re-sent, so it is never made twice.
    pub async fn add_permits(&self, permits: i64) -> Result<u64, Error> {
        add_permits(&self.object, permits)
            .await
            .during("add_permits")
    }

    /// How many permits are free now (when the total is absent: the
    /// [configured total](Semaphore::configured_permits), which an acquire would set, or 0).
    ///
    /// Permits of holds whose lease has ended are given back first, and granted to the line's
    /// head while it fits. Permits free while a waiter at the head needs more are counted: they
    /// are kept for it, and a new acquire does not get them (see
    /// [Waiting](Semaphore#waiting-a-fifo-line)).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the semaphore's keys hold
    /// something else.
    pub async fn available_permits(&self) -> Result<u64, Error> {
        available_permits(&self.object)
            .await
            .during("available_permits")
    }

    /// Waits as long as it takes, then holds `permits` permits in watchdog mode.
    ///
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never a holder's lease later.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future at any point leaves no permits taken (permits the acquire
    /// script may already have taken are given back in the background).
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] for zero permits, more than
    ///   [`MAX_PERMITS`](Semaphore::MAX_PERMITS), or an invalid name;
    /// - [`Error::Refused`] at once — not after waiting forever — when `permits` is more than the
    ///   semaphore's total, or its permits were never set and no total is
    ///   [configured](Semaphore::with_permits); also, at once, when the total is reduced below
    ///   `permits` while waiting;
    /// - [`Error::Redis`] when Redis fails, [`Error::Shutdown`] once the client is shut down.
    #[doc(alias = "acquire_many", alias = "acquire_many_owned")]
    pub async fn acquire(&self, permits: u64) -> Result<SemaphorePermit, Error> {
        self.acquire_unbounded(permits, None)
            .await
            .during("acquire")
    }

    /// Waits as long as it takes, then holds `permits` permits for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`acquire`](Semaphore::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Semaphore::acquire); [`Error::InvalidArgument`] for a lease shorter
    /// than [`MIN_LEASE`](crate::MIN_LEASE) (1 ms) or over [`MAX_LEASE`](crate::MAX_LEASE).
    pub async fn acquire_with_lease(
        &self,
        permits: u64,
        lease: Duration,
    ) -> Result<SemaphorePermit, Error> {
        self.acquire_unbounded(permits, Some(lease))
            .await
            .during("acquire_with_lease")
    }

    async fn acquire_unbounded(
        &self,
        permits: u64,
        lease: Option<Duration>,
    ) -> Result<SemaphorePermit, Error> {
        loop {
            if let Some(permit) = self.acquire_within(permits, None, lease).await? {
                return Ok(permit);
            }
        }
    }

    /// Tries to take `permits` permits, waiting at most `wait`.
    ///
    /// - `wait = Duration::ZERO` makes one attempt and never waits: it takes the permits only if
    ///   they are free **and nobody waits ahead of it** (the line is FIFO, see
    ///   [Waiting](Semaphore#waiting-a-fifo-line)), and never joins the line;
    /// - `lease = None` holds them in watchdog mode, `Some(lease)` with a fixed lease.
    ///
    /// Returns `Ok(None)` when too few permits were free within `wait`. A `wait` too long to
    /// represent as a deadline waits without bound.
    ///
    /// # Cancel safety
    /// As [`acquire`](Semaphore::acquire).
    ///
    /// # Errors
    /// As [`acquire_with_lease`](Semaphore::acquire_with_lease).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// let gpus = client.semaphore("gpus");
    /// // Two of the GPUs, for at most an hour even if this process dies.
    /// if let Some(permit) = gpus
    ///     .try_acquire(2, Duration::from_secs(30), Some(Duration::from_secs(3600)))
    ///     .await?
    /// {
    ///     assert_eq!(permit.permits(), 2);
    ///     permit.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    #[doc(alias = "try_acquire_many", alias = "try_acquire_many_owned")]
    pub async fn try_acquire(
        &self,
        permits: u64,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<SemaphorePermit>, Error> {
        self.acquire_within(permits, Some(wait), lease)
            .await
            .during("try_acquire")
    }

    async fn acquire_within(
        &self,
        permits: u64,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<SemaphorePermit>, Error> {
        let keys = self.object.keys()?;
        let inner = self.object.inner();
        let (lease, watchdog) = lease_mode(inner, lease)?;
        let attempt = PermitAttempt::new(
            &self.object,
            keys,
            &SEMAPHORE_HOLDS,
            permits,
            (lease, watchdog),
            wait,
        )?;
        Ok(acquire(inner, &attempt, wait)
            .await?
            .map(|guard| SemaphorePermit { guard, permits }))
    }
}

/// Checks a number of permits to set or take.
fn check_permits(permits: u64, what: &str) -> Result<(), Error> {
    if permits > MAX_PERMITS {
        return Err(Error::InvalidArgument(format!(
            "{what} {permits} permits: a semaphore has at most {MAX_PERMITS}"
        )));
    }
    Ok(())
}

fn refused(object: &Object, reason: String) -> Error {
    Error::Refused {
        kind: object.kind.describe(),
        name: object.name.to_string(),
        reason,
    }
}

/// `with_permits` of both semaphore kinds: remembers `permits` as the object's total.
pub(crate) fn configure(object: &Object, permits: u64) -> Result<(), Error> {
    check_permits(permits, "cannot configure")?;
    let keys = object.keys()?;
    object.inner().remember_total(&keys.key, permits);
    Ok(())
}

/// `configured_permits` of both semaphore kinds.
pub(crate) fn configured_permits(object: &Object) -> Option<u64> {
    let keys = object.keys().ok()?;
    object.inner().configured_total(&keys.key)
}

/// The configured total as a script argument (`''`: none).
fn configured_arg(object: &Object, keys: &ObjectKeys) -> String {
    object
        .inner()
        .configured_total(&keys.key)
        .map_or_else(String::new, |total| total.to_string())
}

/// `try_set_permits` of both semaphore kinds.
pub(crate) async fn try_set_permits(object: &Object, permits: u64) -> Result<bool, Error> {
    check_permits(permits, "cannot set")?;
    let keys = object.keys()?;
    // The pod's intended total, whichever pod's call sets it now.
    object.inner().remember_total(&keys.key, permits);
    let reply = object
        .inner()
        .exec
        .ints(
            &TRY_SET_PERMITS,
            object.kind,
            &key_refs(keys),
            &[
                &permits.to_string(),
                &keys.channel,
                object.inner().exec.publish_flag(),
            ],
            Resend::Never,
        )
        .await?;
    Ok(decode_try_set_permits(&reply)?)
}

/// `add_permits` of both semaphore kinds.
pub(crate) async fn add_permits(object: &Object, permits: i64) -> Result<u64, Error> {
    check_permits(permits.unsigned_abs(), "cannot add or remove")?;
    let keys = object.keys()?;
    let reply = object
        .inner()
        .exec
        .ints(
            &ADD_PERMITS,
            object.kind,
            &key_refs(keys),
            &[
                &permits.to_string(),
                &MAX_PERMITS.to_string(),
                &keys.channel,
                object.inner().exec.publish_flag(),
                &configured_arg(object, keys),
            ],
            Resend::Never,
        )
        .await?;
    match AddReply::decode(&reply)? {
        AddReply::Added { total } => {
            object.inner().remember_total(&keys.key, total);
            Ok(total)
        }
        AddReply::BelowZero { total } => Err(refused(
            object,
            format!(
                "cannot remove {} permits: the total is {total}",
                permits.unsigned_abs()
            ),
        )),
        AddReply::AboveMax { total } => Err(refused(
            object,
            format!("cannot add {permits} permits to {total}: the most a semaphore can have is {MAX_PERMITS}"),
        )),
    }
}

/// `available_permits` of both semaphore kinds.
pub(crate) async fn available_permits(object: &Object) -> Result<u64, Error> {
    let keys = object.keys()?;
    let reply = object
        .inner()
        .exec
        .ints(
            &AVAILABLE,
            object.kind,
            &key_refs(keys),
            &[&keys.channel, object.inner().exec.publish_flag()],
            Resend::Allowed,
        )
        .await?;
    Ok(match AvailableReply::decode(&reply)? {
        AvailableReply::NotSet => object.inner().configured_total(&keys.key).unwrap_or(0),
        AvailableReply::Set { available, .. } => available,
    })
}

/// Every key of the object, as script `KEYS`.
pub(crate) fn key_refs(keys: &ObjectKeys) -> Vec<&str> {
    keys.keys.iter().map(String::as_str).collect()
}

/// One acquire call's tries at taking permits, for both semaphore kinds: yields the hold, taken
/// by a try or granted by a release. Every try carries the call's one hold marker, which is also
/// its request's in the semaphore's line (`scripts/line_lib.lua`).
pub(crate) struct PermitAttempt<'a> {
    client: &'a Arc<ClientInner>,
    object: &'a Object,
    keys: &'a Arc<ObjectKeys>,
    holds: &'static HoldKind,
    permits: u64,
    permits_arg: String,
    lease: Duration,
    lease_ms: String,
    watchdog: bool,
    /// The sequence number and marker of the one hold this call takes, in every try and grant.
    seq: u64,
    marker: String,
    /// This client's own channel for the semaphore: grants to its waiters are published there.
    channel: String,
    /// When the latest refused try was sent, and the server's clock when it ran (a grant's
    /// expiry is read against it).
    anchor: Mutex<Option<(Instant, u64)>>,
    /// The call's request in the line, left when the call gives up.
    queued: Queued<'a>,
    /// The request's keep-alive in ms; "0": try once, never join (a `try_acquire` with a zero
    /// wait that fails must not be granted permits later).
    keepalive: Duration,
    keepalive_ms: String,
}

impl<'a> PermitAttempt<'a> {
    /// Checks `permits` (positive, at most [`MAX_PERMITS`]) and prepares the call's tries; `wait`
    /// is the call's (`Some(ZERO)`: one try, which never joins the line).
    pub(crate) fn new(
        object: &'a Object,
        keys: &'a Arc<ObjectKeys>,
        holds: &'static HoldKind,
        permits: u64,
        (lease, watchdog): (Duration, bool),
        wait: Option<Duration>,
    ) -> Result<Self, Error> {
        if permits == 0 {
            return Err(Error::InvalidArgument("cannot acquire zero permits".into()));
        }
        check_permits(permits, "cannot acquire")?;
        let client = object.inner();
        let seq = client.next_sequence();
        let marker = lockkit_protocol::lock::hold_marker(&client.id, seq);
        let channel = keys.client_channel(&client.id);
        let lease_ms = lease_millis(lease).to_string();
        let permits_arg = permits.to_string();
        let request = format!("{marker} {lease_ms} {permits_arg} {channel}");
        let keepalive = if wait == Some(Duration::ZERO) {
            Duration::ZERO
        } else {
            WAITER_KEEPALIVE
        };
        Ok(Self {
            client,
            object,
            keys,
            holds,
            permits,
            permits_arg,
            lease,
            lease_ms,
            watchdog,
            seq,
            marker,
            channel,
            anchor: Mutex::new(None),
            queued: Queued::new(
                client,
                object.kind,
                &object.name,
                keys,
                &SEMAPHORE_LEAVE,
                request,
            ),
            keepalive,
            keepalive_ms: lease_millis(keepalive).to_string(),
        })
    }

    /// The guard of the call's one hold, armed: made before each try is sent, and for a grant.
    fn hold_guard(&self) -> HoldGuard {
        HoldGuard::prepare_marked(
            self.client,
            self.holds,
            &self.object.name,
            self.keys,
            (self.lease, self.watchdog),
            None,
            self.seq,
        )
    }

    /// One run of the acquire script; `keepalive_ms` = "0" never joins the line.
    async fn try_once(&self, keepalive_ms: &str) -> Result<Outcome<HoldGuard>, Error> {
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
                self.object.kind,
                &key_refs(self.keys),
                &[
                    &self.marker,
                    &self.permits_arg,
                    &self.lease_ms,
                    &self.channel,
                    client.exec.publish_flag(),
                    // Read at each try: a total configured while waiting counts.
                    &configured_arg(self.object, self.keys),
                    keepalive_ms,
                ],
                Resend::Allowed,
            )
            .await?;
        let reason = match AcquireReply::decode(&reply)? {
            AcquireReply::Acquired { .. } => {
                // Taking the permits takes the request out of the line in the same script.
                self.queued.granted();
                return Ok(Outcome::Acquired(guard.granted(sent)?.replicated().await?));
            }
            AcquireReply::Busy { retry_ms, now_ms } => {
                guard.disarm();
                *self.anchor.lock() = Some((sent, now_ms));
                // Retry (and so keep the request alive) well before its keep-alive runs out.
                let refresh = self.keepalive / 3;
                return Ok(Outcome::Busy {
                    retry_in: Some(
                        retry_ms.map_or(refresh, |ms| Duration::from_millis(ms).min(refresh)),
                    ),
                });
            }
            AcquireReply::MoreThanTotal { total } => format!(
                "asked for {} {}, but it has only {total} in total",
                self.permits,
                if self.permits == 1 {
                    "permit"
                } else {
                    "permits"
                }
            ),
            AcquireReply::NotSet => "its permits were never set, or were lost with Redis's data, \
                 and this client has no total for it (configure one with with_permits, or call \
                 try_set_permits or add_permits)"
                .into(),
        };
        // Refused: the script took nothing, and took the request out of the line.
        self.queued.granted();
        guard.disarm();
        Err(refused(self.object, reason))
    }
}

impl Attempt for PermitAttempt<'_> {
    type Output = HoldGuard;

    /// Leaves the line (the client shut down while it waited).
    async fn leave(&self) {
        self.queued.leave_now().await;
    }

    /// This client's own channel for the semaphore.
    fn channel(&self) -> &str {
        &self.channel
    }

    fn object(&self) -> (Kind, &str) {
        (self.object.kind, &self.object.name)
    }

    /// A release grants permits to the line's head and names it by its marker: its client wakes
    /// that very waiter.
    fn waiter_tag(&self) -> Option<&str> {
        Some(&self.marker)
    }

    fn need(&self) -> u64 {
        self.permits
    }

    async fn attempt(&self) -> Result<Outcome<HoldGuard>, Error> {
        self.try_once(&self.keepalive_ms).await
    }

    /// A try that leaves the line when refused (keep-alive 0): the wait ran out, so no release
    /// may grant permits to this call any more.
    async fn last_attempt(&self) -> Result<Outcome<HoldGuard>, Error> {
        let outcome = self.try_once("0").await?;
        if !matches!(outcome, Outcome::Acquired(_)) {
            // The script took the request out: nothing is left to leave.
            self.queued.granted();
        }
        Ok(outcome)
    }

    /// The permits are this call's already: the release that freed them made the call's request
    /// a hold and said so on this client's channel.
    async fn claim(&self, grant: Grant) -> Result<Option<HoldGuard>, Error> {
        let anchor = *self.anchor.lock();
        let Some(guard) = self.hold_guard().claim_grant(anchor, grant)? else {
            return Ok(None);
        };
        // The grant took the request out of the line.
        self.queued.granted();
        Ok(Some(guard.replicated().await?))
    }
}

/// Permits held from a [`Semaphore`]. Gives them back when dropped.
///
/// Prefer [`release`](SemaphorePermit::release), which reports whether the permits were still
/// held; a permit that is merely dropped is released in the background (never leaked), and the
/// release's result only goes to the log.
#[must_use = "the permits are given back as soon as the guard is dropped"]
pub struct SemaphorePermit {
    guard: HoldGuard,
    permits: u64,
}

impl std::fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hold = self.guard.hold();
        f.debug_struct("SemaphorePermit")
            .field("name", &hold.name)
            .field("permits", &self.permits)
            .field("watchdog", &hold.watchdog)
            .field("lease", &hold.lease)
            .field("lost", &hold.is_lost())
            .finish()
    }
}

impl SemaphorePermit {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.guard.hold().name
    }

    /// How many permits this guard holds.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// Whether the lease is renewed by the watchdog (`true`) or fixed.
    pub fn is_watchdog(&self) -> bool {
        self.guard.hold().watchdog
    }

    /// Whether the lease is known to be gone: renewal found the hold missing, or the lease ran out
    /// without being renewed (fixed lease past its end, Redis unreachable). Once `true`, it stays
    /// `true`; the permits may then be held by someone else.
    ///
    /// The local clock starts a lease when the acquire or renewal is *sent*, so the guard reports
    /// a lost lease no later than Redis gives the permits back.
    pub fn is_lost(&self) -> bool {
        self.guard.hold().is_lost()
    }

    /// Resolves when [`is_lost`](SemaphorePermit::is_lost) becomes true (or the permits are
    /// released). Use it to abort work that must not outlive the lease:
    ///
    /// ```no_run
    /// # async fn demo(semaphore: lockkit::Semaphore) -> Result<(), lockkit::Error> {
    /// # async fn export() {}
    /// let permit = semaphore.acquire(1).await?;
    /// tokio::select! {
    ///     () = export() => permit.release().await?,
    ///     () = permit.lost() => eprintln!("lease lost; export aborted"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// The future does not borrow the guard and may be moved into another task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.hold().lost_signal()
    }

    /// Gives the permits back now: they are granted to the line's head while it fits.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release goes on in the background.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the permits were already gone (their lease ran out): others may
    /// have held them meanwhile. [`Error::Shutdown`] after [`Client::shutdown`](crate::Client::shutdown), which already
    /// released them. [`Error::Redis`] when Redis fails; the permits then come back when their
    /// lease ends.
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await.during("release")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}
    fn send_static<T: Send + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<Semaphore>();
        send_static::<SemaphorePermit>();
    }
}
