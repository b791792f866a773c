//! One hold on a Redis object, and the guard core that every primitive's guard wraps.
//!
//! A [`Hold`] is what the watchdog renews and what a release gives back: the object's key, the
//! hold's marker, its lease and its lost-signal. A [`HoldGuard`] owns one hold: dropping it
//! releases the hold in the background, [`HoldGuard::release`] releases it now. A guard exists
//! from just before the acquire script is sent, so an acquire future dropped mid-flight gives back
//! whatever the script may have taken.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::{hold_marker, ReleaseReply};
use lockkit_protocol::script::Script;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::core::{ClientInner, MAX_LEASE};
use crate::error::Error;
use crate::exec::{Exec, Resend};
use crate::owner::{self, Taker};

/// Checks a fixed lease: positive and at most [`MAX_LEASE`]; sub-millisecond leases round up to
/// one millisecond.
pub(crate) fn validate_lease(lease: Duration) -> Result<Duration, Error> {
    if lease.is_zero() {
        return Err(Error::InvalidArgument("lease must be positive".into()));
    }
    if lease > MAX_LEASE {
        return Err(Error::InvalidArgument(format!(
            "lease {lease:?} is longer than the maximum of {MAX_LEASE:?}"
        )));
    }
    Ok(lease.max(Duration::from_millis(1)))
}

/// The lease and mode of a request: `None` is watchdog mode with the client's watchdog timeout;
/// `Some(lease)` a validated fixed lease. Returns `(lease, watchdog)`.
pub(crate) fn lease_mode(
    client: &ClientInner,
    lease: Option<Duration>,
) -> Result<(Duration, bool), Error> {
    match lease {
        None => Ok((client.settings.watchdog_timeout, true)),
        Some(lease) => Ok((validate_lease(lease)?, false)),
    }
}

/// Round-up milliseconds of a validated lease.
pub(crate) fn lease_millis(lease: Duration) -> u128 {
    lease.as_nanos().div_ceil(1_000_000)
}

/// How many times a release is sent when the connection breaks under it.
const RELEASE_ATTEMPTS: u32 = 3;

/// How holds of one kind of object are released and renewed.
///
/// Conventions every kind's scripts follow, so the release path and the watchdog are written once:
/// - release: `KEYS` = the hold's keys; `ARGV` = marker, channel, sharded flag (`0`/`1`); reply
///   decoded by [`ReleaseReply`];
/// - renew (batched): for the i-th hold, `KEYS[stride·(i−1)+1 ..= stride·i]` = its keys and
///   `ARGV[2i−1]`, `ARGV[2i]` = its marker and lease in ms (`0`: only check); reply: one `1`/`0`
///   per hold (present / gone).
#[derive(Debug)]
pub(crate) struct HoldKind {
    pub(crate) kind: Kind,
    pub(crate) release: &'static Script,
    pub(crate) renew: &'static Script,
}

/// One hold on one object.
#[derive(Debug)]
pub(crate) struct Hold {
    /// Client-unique sequence number; the registry key.
    pub(crate) seq: u64,
    pub(crate) name: Arc<str>,
    pub(crate) kind: &'static HoldKind,
    /// The object's keys, main key first (the kind's scripts' `KEYS`).
    pub(crate) keys: Arc<ObjectKeys>,
    pub(crate) marker: String,
    /// The owner id the hold was taken as (the lock kinds with owners); `None` for permits and
    /// spin-lock holds, which are known by their marker alone.
    pub(crate) owner: Option<Arc<str>>,
    pub(crate) lease: Duration,
    /// Renewed by the watchdog (watchdog mode) or left to expire (fixed lease).
    pub(crate) watchdog: bool,
    /// Cancelled when the hold is known lost, or once it was released.
    lost: CancellationToken,
    /// Local, conservative end of the lease: measured from when the last successful acquire or
    /// renewal was *sent*, so it is never later than the server's expiry.
    expires_at: Mutex<Instant>,
    /// Hold time, for the metrics (empty without the `metrics` feature).
    clock: crate::metrics::HoldClock,
}

impl Hold {
    /// The main key.
    pub(crate) fn key(&self) -> &str {
        &self.keys.key
    }

    /// Records a successful acquire or renewal that was sent at `sent`.
    pub(crate) fn confirmed_at(&self, sent: Instant) {
        let mut expires_at = self.expires_at.lock();
        let new = sent + self.lease;
        if new > *expires_at {
            *expires_at = new;
        }
    }

    pub(crate) fn expires_at(&self) -> Instant {
        *self.expires_at.lock()
    }

    /// Whether the lease is known to be gone, or the hold was released. Once `true`, it stays
    /// `true`: a local deadline that passed marks the hold lost, even if a renewal sent earlier
    /// comes back later.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.is_cancelled() {
            return true;
        }
        if Instant::now() >= self.expires_at() {
            self.mark_lost("the lease ran out before it could be renewed");
            return true;
        }
        false
    }

    /// Marks the hold lost and says so, once.
    pub(crate) fn mark_lost(&self, why: &str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(
                kind = self.kind.kind.describe(),
                name = %self.name,
                key = %self.keys.key,
                "lease lost: {why}"
            );
            // Counted before the lost-signal fires, so whoever it wakes sees the count.
            self.clock.lost(self.kind.kind.segment());
            self.lost.cancel();
        }
    }

    /// Ends the hold quietly: it was released (or the client shut down).
    pub(crate) fn finish(&self) {
        self.clock.ended(self.kind.kind.segment());
        self.lost.cancel();
    }

    /// Resolves once the hold is lost or released.
    pub(crate) fn lost_signal(self: &Arc<Self>) -> impl Future<Output = ()> + Send + 'static {
        let hold = Arc::clone(self);
        async move {
            loop {
                let deadline = hold.expires_at();
                tokio::select! {
                    () = hold.lost.cancelled() => return,
                    () = tokio::time::sleep_until(deadline) => {
                        if Instant::now() >= hold.expires_at() {
                            hold.mark_lost("the lease ran out before it could be renewed");
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Gives back `hold` in Redis.
///
/// A hold already known lost ([`Hold::is_lost`]: its lease ran out by the local, conservative
/// clock, or renewal found it gone) is still given back, so that the lock frees at once if Redis
/// has not ended it yet, but the answer is [`Error::NotHeld`] every time: the critical section
/// may have outlived the lease, whichever side of the race the release landed on.
pub(crate) async fn release(exec: &Exec, hold: &Hold) -> Result<(), Error> {
    use tracing::Instrument;
    let span = tracing::debug_span!(
        "lockkit.release",
        kind = hold.kind.kind.segment(),
        name = &*hold.name,
    );
    let lost_before = hold.is_lost();
    release_marker(
        exec,
        hold.kind,
        &hold.keys,
        &hold.name,
        &hold.marker,
        || hold.is_lost(),
    )
    .instrument(span)
    .await?;
    if lost_before {
        return Err(Error::NotHeld {
            name: hold.name.to_string(),
        });
    }
    Ok(())
}

/// Gives back the hold named by `marker` of an object of `kind` (also for holds known only by
/// their marker, like a permit released by id).
///
/// The release script is sent at most once per attempt; when the connection breaks under it, it is
/// sent again (the marker makes that safe). When an earlier attempt may have run and the next one
/// finds the hold gone, the hold counts as released unless `known_lost` says it was already gone.
pub(crate) async fn release_marker(
    exec: &Exec,
    kind: &HoldKind,
    keys: &ObjectKeys,
    name: &str,
    marker: &str,
    known_lost: impl Fn() -> bool,
) -> Result<(), Error> {
    let key_refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
    let mut ambiguous = false;
    let mut resent = 0;
    loop {
        let result = exec
            .ints(
                kind.release,
                kind.kind,
                &key_refs,
                &[marker, &keys.channel, exec.publish_flag()],
                Resend::Never,
            )
            .await;
        match result {
            Ok(reply) => {
                return match ReleaseReply::decode(&reply)? {
                    ReleaseReply::Freed | ReleaseReply::StillHeld { .. } => Ok(()),
                    ReleaseReply::NotHeld if ambiguous && !known_lost() => Ok(()),
                    ReleaseReply::NotHeld => Err(Error::NotHeld {
                        name: name.to_owned(),
                    }),
                };
            }
            Err(Error::Redis(err)) if err.is_ambiguous() && resent + 1 < RELEASE_ATTEMPTS => {
                tracing::debug!(name, "release interrupted ({err}); sending it again");
                ambiguous = true;
                resent += 1;
            }
            Err(err) => return Err(err),
        }
    }
}

/// Owns one hold: releases it on drop unless it was released or disarmed.
pub(crate) struct HoldGuard {
    client: Arc<ClientInner>,
    hold: Arc<Hold>,
    armed: bool,
    /// The task that took the hold, once granted, for a lock kind (see [`owner::Taken`]).
    taker: Option<Taker>,
}

impl HoldGuard {
    /// A new hold (fresh sequence number and marker), armed: call this *before* sending the
    /// request that may take it, so that dropping the request future gives back whatever the
    /// script took.
    pub(crate) fn prepare(
        client: &Arc<ClientInner>,
        kind: &'static HoldKind,
        name: &Arc<str>,
        keys: &Arc<ObjectKeys>,
        lease: Duration,
        watchdog: bool,
    ) -> Self {
        Self::prepare_for(client, kind, name, keys, lease, watchdog, None)
    }

    /// As [`prepare`](HoldGuard::prepare), for a hold taken as `owner`.
    pub(crate) fn prepare_for(
        client: &Arc<ClientInner>,
        kind: &'static HoldKind,
        name: &Arc<str>,
        keys: &Arc<ObjectKeys>,
        lease: Duration,
        watchdog: bool,
        owner: Option<&Arc<str>>,
    ) -> Self {
        let seq = client.next_sequence();
        let hold = Hold {
            seq,
            name: Arc::clone(name),
            kind,
            keys: Arc::clone(keys),
            marker: hold_marker(&client.id, seq),
            owner: owner.cloned(),
            lease,
            watchdog,
            lost: CancellationToken::new(),
            expires_at: Mutex::new(Instant::now()),
            clock: crate::metrics::HoldClock::new(),
        };
        Self {
            client: Arc::clone(client),
            hold: Arc::new(hold),
            armed: true,
            taker: None,
        }
    }

    pub(crate) fn hold(&self) -> &Arc<Hold> {
        &self.hold
    }

    /// The client the hold was taken through.
    pub(crate) fn client(&self) -> &Arc<ClientInner> {
        &self.client
    }

    /// The request took nothing: nothing to release.
    pub(crate) fn disarm(mut self) {
        self.armed = false;
    }

    /// The hold was granted: hand it to the watchdog. A grant that lands after the client was
    /// shut down is given back at once (the guard, still armed, is dropped and its release goes
    /// through the worker, which serves releases until the last handle is gone).
    pub(crate) fn granted(mut self, sent: Instant) -> Result<Self, Error> {
        self.hold.confirmed_at(sent);
        self.hold.clock.granted();
        let span = tracing::Span::current();
        if span
            .metadata()
            .is_some_and(|meta| meta.name() == crate::acquire::ACQUIRE_SPAN)
        {
            span.record("lease", tracing::field::debug(self.hold.lease));
            span.record("watchdog", self.hold.watchdog);
        }
        // Registration and shutdown exclude each other (one lock in the watchdog): either the
        // hold is registered before the shutdown drains the registry, and the shutdown releases
        // it, or the shutdown came first and the hold is given back here.
        if !self.client.watchdog.register(Arc::clone(&self.hold)) {
            return Err(Error::Shutdown);
        }
        if owner::is_lock_kind(self.hold.kind.kind) {
            let taker = Taker::current();
            self.client.taken.insert(
                taker,
                Arc::from(self.hold.key()),
                self.hold.seq,
                self.hold.owner.clone(),
            );
            self.taker = Some(taker);
        }
        Ok(self)
    }

    /// Applies the client's replica acknowledgement policy to a granted hold: with a policy,
    /// waits (`WAIT`) until enough replicas have the acquisition; when they do not within the
    /// policy's timeout, gives the hold back and fails with [`Error::NotReplicated`]. Without a
    /// policy it returns at once and sends nothing.
    ///
    /// Called by every primitive right after [`granted`](HoldGuard::granted). A failing `WAIT`
    /// returns its error and drops the guard, which releases the hold in the background.
    pub(crate) async fn replicated(self) -> Result<Self, Error> {
        let Some(policy) = self.client.settings.replica_ack else {
            return Ok(self);
        };
        let outcome =
            crate::replica::wait_for_replicas(&self.client.exec, self.hold.key(), policy).await?;
        if outcome.is_met() {
            return Ok(self);
        }
        let name = self.hold.name.to_string();
        tracing::warn!(
            name = %name,
            acknowledged = outcome.acknowledged,
            required = outcome.required,
            "acquisition not acknowledged by enough replicas; giving it back"
        );
        if let Err(err) = self.release().await {
            tracing::warn!(name = %name, "giving back an unreplicated hold failed: {err}");
        }
        Err(Error::NotReplicated {
            name,
            acknowledged: outcome.acknowledged,
            required: outcome.required,
        })
    }

    /// Releases the hold now.
    ///
    /// Cancel safety: if the returned future is dropped before it completes, the release goes on
    /// in the background.
    ///
    /// A hold that has reported itself lost answers [`Error::NotHeld`] every time (see
    /// [`release`]).
    pub(crate) async fn release(mut self) -> Result<(), Error> {
        if self.client.is_shut_down() {
            self.armed = false;
            return Err(Error::Shutdown);
        }
        self.client.watchdog.unregister(self.hold.seq);
        let result = release(&self.client.exec, &self.hold).await;
        self.armed = false;
        self.hold.finish();
        result
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(taker) = self.taker.take() {
            let key: Arc<str> = Arc::from(self.hold.key());
            self.client.taken.remove(taker, &key, self.hold.seq);
        }
        if self.armed {
            self.client
                .watchdog
                .release_in_background(Arc::clone(&self.hold));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interleaving `shutdown` could meet: an acquire's script took the hold, then the
    /// shutdown drained the watchdog's registry, then the acquire registers its grant. The grant
    /// must be refused and the hold given back; registered into the drained registry it would be
    /// released by nobody and kept for its whole (here one hour) lease.
    #[tokio::test]
    async fn a_grant_that_lands_after_the_shutdown_drained_the_registry_is_given_back() {
        use fred::interfaces::KeysInterface;
        use lockkit_protocol::lock::{AcquireReply, ACQUIRE};

        let server = lockkit_testkit::RedisServer::start()
            .await
            .unwrap_or_else(|err| panic!("redis-server: {err}"));
        let client = crate::Client::connect(server.url())
            .await
            .unwrap_or_else(|err| panic!("connect: {err}"));
        let inner = &client.inner;
        let name: Arc<str> = Arc::from("shutdown-race");
        let keys = Arc::new(
            inner
                .settings
                .namespace
                .object(Kind::Lock, &name)
                .unwrap_or_else(|err| panic!("keys: {err}")),
        );
        let owner = owner::fresh(inner);
        let lease = Duration::from_secs(3600);
        let guard = HoldGuard::prepare_for(
            inner,
            &crate::lock::PLAIN.holds,
            &name,
            &keys,
            lease,
            false,
            Some(&owner),
        );
        let key_refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
        let sent = Instant::now();
        let reply = inner
            .exec
            .ints(
                &ACQUIRE,
                Kind::Lock,
                &key_refs,
                &[&owner, &guard.hold().marker, "3600000", "0"],
                Resend::Allowed,
            )
            .await
            .unwrap_or_else(|err| panic!("acquire: {err}"));
        assert!(matches!(
            AcquireReply::decode(&reply),
            Ok(AcquireReply::Acquired { .. })
        ));

        // The shutdown drains the registry (before it marks the client closed for good).
        let errors = inner.watchdog.shutdown().await;
        assert!(errors.is_empty(), "{errors:?}");
        let granted = guard.granted(sent);
        assert!(
            matches!(granted, Err(Error::Shutdown)),
            "a grant after the registry was drained must be refused"
        );
        // And given back: the key goes (through the worker, which still serves releases).
        let redis = inner.exec.redis();
        let gone = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let exists: i64 = redis.exists(keys.key.as_str()).await.unwrap_or(1);
                if exists == 0 {
                    break;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(gone.is_ok(), "the refused grant's hold was never released");
    }

    #[test]
    fn leases_are_validated() {
        assert!(validate_lease(Duration::ZERO).is_err());
        assert!(validate_lease(Duration::MAX).is_err());
        assert!(validate_lease(MAX_LEASE + Duration::from_secs(1)).is_err());
        assert_eq!(
            validate_lease(Duration::from_micros(10)).ok(),
            Some(Duration::from_millis(1))
        );
        assert_eq!(lease_millis(Duration::from_micros(1500)), 2);
    }
}
