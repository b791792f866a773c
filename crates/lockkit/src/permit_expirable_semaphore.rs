//! [`PermitExpirableSemaphore`]: a semaphore whose permits have ids and leases of their own, and
//! its [`ExpirablePermit`].
//!
//! Same data and scripts as [`Semaphore`](crate::Semaphore) (see `semaphore.rs`); a permit is a
//! hold of one permit, and its id is the hold's marker.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::Kind;
use lockkit_protocol::semaphore::{
    decode_update_lease, is_permit_id, RELEASE, RENEW, UPDATE_LEASE,
};

use crate::acquire::acquire;
use crate::core::ClientInner;
use crate::error::During;
use crate::error::Error;
use crate::exec::Resend;
use crate::guard::HoldGuard;
use crate::hold::{lease_millis, release_marker, validate_lease, HoldKind};
use crate::object::Object;
use crate::semaphore::{self, key_refs, PermitAttempt, MAX_PERMITS};

/// How permits of a [`PermitExpirableSemaphore`] are released and checked (never renewed: their
/// leases are fixed).
pub(crate) static PERMIT_HOLDS: HoldKind = HoldKind {
    kind: Kind::PermitExpirableSemaphore,
    release: &RELEASE,
    renew: &RENEW,
};

/// A semaphore whose permits have **ids** and **leases of their own**: a permit can be released
/// by id from anywhere (another task, client or process), and its lease changed by id.
///
/// Get one with [`Client::permit_expirable_semaphore`](crate::Client::permit_expirable_semaphore). The handle is cheap,
/// `Clone + Send + Sync`, and sends nothing until used. Give it its total with
/// [`with_permits`](Self::with_permits) (or set it once with
/// [`try_set_permits`](Self::try_set_permits)), then take permits one at a time with
/// [`acquire`](Self::acquire) or [`try_acquire`](Self::try_acquire).
///
/// After Redis loses the semaphore's keys, the first acquire sets the total again from the one
/// the client remembers, as for [`Semaphore`](crate::Semaphore) (see its "Data loss" section).
/// Permits taken before the loss are gone: `release(id)` and `update_lease(id, ..)` of their ids
/// find nothing, and guards report them lost.
///
/// Use it when a permit must outlive the code that took it: a job queue hands out work slots, and
/// whichever worker finishes the job releases the slot by id; or a permit stored next to the work
/// (`into_id`) is released by a clean-up process. When permits are taken and given back by the
/// same code, [`Semaphore`](crate::Semaphore) is simpler, and its watchdog keeps long holds alive.
///
/// # Waiting: a FIFO line
/// Waiting acquire calls stand in one line in Redis, as a [`Semaphore`](crate::Semaphore)'s do
/// (see its [Waiting](crate::Semaphore#waiting-a-fifo-line) section): a release (by guard or by
/// id), an [`add_permits`](Self::add_permits) or a lease found run out grants the freed permits
/// to the head of the line, first come first served, with one message to the granted call's
/// client and none to the others. [`try_acquire`](Self::try_acquire) with a zero `wait` is
/// refused while anyone waits, even with a permit free: it does not jump the line (the reason,
/// as for tokio's `Semaphore`: no waiter is starved by newcomers).
///
/// # Leases
/// Every permit has a fixed lease, chosen at acquisition and changeable by id with
/// [`update_lease`](Self::update_lease). There is no watchdog mode: a permit's id may travel to
/// other processes, which the client that took it cannot know about, so no client can tell for how
/// long to keep renewing it. When the lease ends, the permit comes back on its own.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// let slots = client.permit_expirable_semaphore("transcoder-slots");
/// slots.try_set_permits(4).await?;
/// // Take a slot for up to 10 minutes and hand its id to the worker that does the job.
/// let id = slots.acquire(Duration::from_secs(600)).await?.into_id();
/// // ... later, in the worker (any process): the job took longer than planned ...
/// slots.update_lease(&id, Duration::from_secs(600)).await?;
/// // ... and when it is done:
/// slots.release(&id).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct PermitExpirableSemaphore {
    object: Object,
}

impl PermitExpirableSemaphore {
    /// The most permits a semaphore can have in total: 4,294,967,295.
    pub const MAX_PERMITS: u64 = MAX_PERMITS;

    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::PermitExpirableSemaphore, name),
        }
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    /// Configures the total: an acquire that finds no total (never set, or lost with Redis's
    /// data) sets it first. As [`Semaphore::with_permits`](crate::Semaphore::with_permits).
    ///
    /// # Errors
    /// As [`Semaphore::with_permits`](crate::Semaphore::with_permits).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// let slots = client.permit_expirable_semaphore("transcoder-slots").with_permits(4)?;
    /// let permit = slots.acquire(Duration::from_secs(600)).await?;
    /// permit.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn with_permits(self, permits: u64) -> Result<Self, Error> {
        semaphore::configure(&self.object, permits)?;
        Ok(self)
    }

    /// The total this client would set the semaphore to if its keys were gone. As
    /// [`Semaphore::configured_permits`](crate::Semaphore::configured_permits).
    pub fn configured_permits(&self) -> Option<u64> {
        semaphore::configured_permits(&self.object)
    }

    /// Sets the total number of permits, only if it was never set; returns whether this call set
    /// it; either way the client remembers the total. As
    /// [`Semaphore::try_set_permits`](crate::Semaphore::try_set_permits).
    ///
    /// # Cancel safety
    /// The request is sent at most once; dropping the future after that leaves it to run or not.
    ///
    /// # Errors
    /// As [`Semaphore::try_set_permits`](crate::Semaphore::try_set_permits).
    pub async fn try_set_permits(&self, permits: u64) -> Result<bool, Error> {
        semaphore::try_set_permits(&self.object, permits)
            .await
            .during("try_set_permits")
    }

    /// Adds `permits` to the total (a negative number takes them away) and returns the new total.
    /// As [`Semaphore::add_permits`](crate::Semaphore::add_permits).
    ///
    /// # Cancel safety
    /// As [`try_set_permits`](Self::try_set_permits).
    ///
    /// # Errors
    /// As [`Semaphore::add_permits`](crate::Semaphore::add_permits).
    pub async fn add_permits(&self, permits: i64) -> Result<u64, Error> {
        semaphore::add_permits(&self.object, permits)
            .await
            .during("add_permits")
    }

    /// How many permits are free now (when the total is absent: the
    /// [configured total](Self::configured_permits), which an acquire would set, or 0). Permits
    /// whose lease has ended are given back first.
    ///
    /// # Cancel safety
    /// Cancel-safe.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the semaphore's keys hold
    /// something else.
    pub async fn available_permits(&self) -> Result<u64, Error> {
        semaphore::available_permits(&self.object)
            .await
            .during("available_permits")
    }

    /// Waits as long as it takes, then holds one permit for `lease`.
    ///
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never a holder's lease later.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future at any point leaves no permit taken (a permit the acquire
    /// script may already have taken is given back in the background).
    ///
    /// # Errors
    /// - [`Error::InvalidArgument`] for a lease shorter than [`MIN_LEASE`](crate::MIN_LEASE)
    ///   (1 ms) or over [`MAX_LEASE`](crate::MAX_LEASE), or an invalid name;
    /// - [`Error::Refused`] at once when the semaphore has no permits in total, or its permits
    ///   were never set and no total is [configured](Self::with_permits); also, at once, when
    ///   the total is lowered to zero while waiting;
    /// - [`Error::Redis`] when Redis fails, [`Error::Shutdown`] once the client is shut down.
    pub async fn acquire(&self, lease: Duration) -> Result<ExpirablePermit, Error> {
        loop {
            if let Some(permit) = self.acquire_within(None, lease).await.during("acquire")? {
                return Ok(permit);
            }
        }
    }

    /// Tries to take one permit for `lease`, waiting at most `wait`.
    ///
    /// `wait = Duration::ZERO` makes one attempt and never waits: it takes a permit only if one
    /// is free **and nobody waits ahead of it** (the line is FIFO), and never joins the line.
    /// Returns `Ok(None)` when no permit was free for this call within `wait`. A `wait` too long to represent as a deadline waits without
    /// bound.
    ///
    /// # Cancel safety
    /// As [`acquire`](Self::acquire).
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    ///
    /// ```no_run
    /// # async fn demo(slots: lockkit::PermitExpirableSemaphore) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// match slots.try_acquire(Duration::ZERO, Duration::from_secs(60)).await? {
    ///     Some(permit) => {
    ///         println!("got slot {}", permit.id());
    ///         permit.release().await?;
    ///     }
    ///     None => println!("every slot is busy"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(
        &self,
        wait: Duration,
        lease: Duration,
    ) -> Result<Option<ExpirablePermit>, Error> {
        self.acquire_within(Some(wait), lease)
            .await
            .during("try_acquire")
    }

    async fn acquire_within(
        &self,
        wait: Option<Duration>,
        lease: Duration,
    ) -> Result<Option<ExpirablePermit>, Error> {
        let keys = self.object.keys()?;
        let inner = self.object.inner();
        let lease = validate_lease(lease)?;
        let attempt =
            PermitAttempt::new(&self.object, keys, &PERMIT_HOLDS, 1, (lease, false), wait)?;
        Ok(acquire(inner, &attempt, wait)
            .await?
            .map(|guard| ExpirablePermit {
                guard,
                client: Arc::clone(inner),
            }))
    }

    /// Releases the permit with this id, whoever took it: it goes to the head of the line.
    ///
    /// A guard of that permit that is still alive (in this or another process) finds out at its
    /// client's next watchdog check: it reports [`is_lost`](ExpirablePermit::is_lost), and its
    /// own release fails with [`Error::NotHeld`].
    ///
    /// # Cancel safety
    /// The release may or may not happen if the future is dropped before it completes.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when no such permit is held (its lease ended, it was released already,
    /// or the id is of another semaphore); [`Error::InvalidArgument`] for a string that is no
    /// permit id; [`Error::Redis`] when Redis fails.
    pub async fn release(&self, id: &str) -> Result<(), Error> {
        check_id(id)?;
        let keys = self.object.keys()?;
        release_marker(
            &self.object.inner().exec,
            &PERMIT_HOLDS,
            keys,
            &self.object.name,
            id,
            || false,
        )
        .await
        .during("release")
    }

    /// Sets the lease of the permit with this id to end `lease` from now (earlier or later than
    /// before); returns whether the permit was still held.
    ///
    /// A guard of that permit that is still alive keeps judging its lease by the one it was
    /// acquired with: after a lengthening it reports [`is_lost`](ExpirablePermit::is_lost) at the
    /// original end (too early, never too late); after a shortening, at its watchdog's next
    /// check after the permit is gone, or at the original end. To manage a permit's lease by id,
    /// let go of its guard with [`into_id`](ExpirablePermit::into_id).
    ///
    /// # Cancel safety
    /// Cancel-safe: re-sending the update is harmless.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a lease shorter than [`MIN_LEASE`](crate::MIN_LEASE) (1 ms)
    /// or over [`MAX_LEASE`](crate::MAX_LEASE), or a string that is no permit id; [`Error::Redis`] when Redis fails.
    pub async fn update_lease(&self, id: &str, lease: Duration) -> Result<bool, Error> {
        check_id(id)?;
        let lease = validate_lease(lease)?;
        let keys = self.object.keys()?;
        let reply = self
            .object
            .inner()
            .exec
            .ints(
                &UPDATE_LEASE,
                self.object.kind,
                &key_refs(keys),
                &[
                    id,
                    &lease_millis(lease).to_string(),
                    &keys.channel,
                    self.object.inner().exec.publish_flag(),
                ],
                Resend::Allowed,
            )
            .await
            .during("update_lease")?;
        Ok(decode_update_lease(&reply)?)
    }
}

fn check_id(id: &str) -> Result<(), Error> {
    if is_permit_id(id) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "{id:?} is not a permit id (ids come from ExpirablePermit::id)"
        )))
    }
}

/// One permit of a [`PermitExpirableSemaphore`]. Gives it back when dropped, unless turned into
/// its id with [`into_id`](ExpirablePermit::into_id).
///
/// Prefer [`release`](ExpirablePermit::release), which reports whether the permit was still held;
/// a permit that is merely dropped is released in the background (never leaked), and the
/// release's result only goes to the log.
#[must_use = "the permit is given back as soon as the guard is dropped; use `into_id` to keep it"]
pub struct ExpirablePermit {
    guard: HoldGuard,
    client: Arc<ClientInner>,
}

impl std::fmt::Debug for ExpirablePermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hold = self.guard.hold();
        f.debug_struct("ExpirablePermit")
            .field("name", &hold.name)
            .field("id", &hold.marker)
            .field("lease", &hold.lease)
            .field("lost", &hold.is_lost())
            .finish()
    }
}

impl ExpirablePermit {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.guard.hold().name
    }

    /// The permit's id, for [`PermitExpirableSemaphore::release`] and
    /// [`update_lease`](PermitExpirableSemaphore::update_lease) from anywhere. Unique per
    /// acquisition and unguessable (it contains the client's random id).
    pub fn id(&self) -> &str {
        &self.guard.hold().marker
    }

    /// Whether the lease is known to be gone: it ran out, or the client's watchdog found the
    /// permit released by id. Once `true`, it stays `true`.
    ///
    /// The local clock starts the lease when the acquire is *sent*, so the guard reports a lost
    /// lease no later than Redis gives the permit back.
    pub fn is_lost(&self) -> bool {
        self.guard.hold().is_lost()
    }

    /// Resolves when [`is_lost`](ExpirablePermit::is_lost) becomes true (or the permit is
    /// released). The future does not borrow the guard and may be moved into another task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.guard.hold().lost_signal()
    }

    /// Gives the permit back now: it goes to the head of the line.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release goes on in the background.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the permit was already gone (its lease ran out, or it was released
    /// by id). [`Error::Shutdown`] after [`Client::shutdown`](crate::Client::shutdown), which already released it.
    /// [`Error::Redis`] when Redis fails; the permit then comes back when its lease ends.
    pub async fn release(self) -> Result<(), Error> {
        self.guard.release().await.during("release")
    }

    /// Lets go of the guard and returns the permit's id: the permit stays held until its lease
    /// ends or someone releases it by id. Nothing is sent to Redis, and this client stops
    /// watching the permit.
    pub fn into_id(self) -> String {
        let Self { guard, client } = self;
        let hold = Arc::clone(guard.hold());
        client.watchdog.unregister(hold.seq);
        guard.disarm();
        hold.marker.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}
    fn send_static<T: Send + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<PermitExpirableSemaphore>();
        send_static::<ExpirablePermit>();
    }

    #[test]
    fn ids_are_checked() {
        assert!(check_id("#c:1").is_ok());
        assert!(matches!(check_id(""), Err(Error::InvalidArgument(_))));
        assert!(matches!(
            check_id("permits"),
            Err(Error::InvalidArgument(_))
        ));
    }
}
