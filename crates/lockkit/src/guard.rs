//! The guard core that every primitive's guard wraps: a [`HoldGuard`] owns one [`Hold`] in one
//! client. Dropping it releases the hold in the background, [`HoldGuard::release`] releases it
//! now. A guard exists from just before the acquire script is sent, so an acquire future dropped
//! mid-flight gives back whatever the script may have taken.

use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::ObjectKeys;
use lockkit_protocol::lock::hold_marker;
use tokio::time::Instant;

use crate::core::ClientInner;
use crate::error::Error;
use crate::hold::{release, validate_lease, Hold, HoldKind};
use crate::owner::{self, Taker};

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
        Self::prepare_marked(client, kind, name, keys, (lease, watchdog), owner, seq)
    }

    /// As [`prepare_for`](HoldGuard::prepare_for), for the hold with sequence number `seq` (its
    /// marker): one acquire call that waits for a lock tries again and again with one marker,
    /// the one its waiting request is granted with.
    pub(crate) fn prepare_marked(
        client: &Arc<ClientInner>,
        kind: &'static HoldKind,
        name: &Arc<str>,
        keys: &Arc<ObjectKeys>,
        (lease, watchdog): (Duration, bool),
        owner: Option<&Arc<str>>,
        seq: u64,
    ) -> Self {
        let hold = Hold::new(
            seq,
            Arc::clone(name),
            kind,
            Arc::clone(keys),
            hold_marker(&client.id, seq),
            owner.cloned(),
            lease,
            watchdog,
        );
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
    pub(crate) fn granted(self, sent: Instant) -> Result<Self, Error> {
        self.hold.confirmed_at(sent);
        self.register()
    }

    /// As [`granted`](HoldGuard::granted), for a hold a release granted this waiter (direct
    /// grant) that lives at least until `deadline` (local, conservative) and is on probation
    /// until then: when its lease is longer, it is confirmed once half of the probation has
    /// passed, if it is still held, to `lease_end`: its lease counted from the grant.
    pub(crate) fn granted_until(
        self,
        deadline: Instant,
        lease_end: crate::watchdog::LeaseEnd,
    ) -> Result<Self, Error> {
        self.hold.confirmed_until(deadline);
        let guard = self.register()?;
        let probation = lockkit_protocol::lock::GRANT_PROBATION;
        if guard.hold.lease > probation {
            crate::watchdog::confirm_later(
                guard.client.exec.clone(),
                Arc::clone(&guard.hold),
                probation / 2,
                lease_end,
            );
        }
        Ok(guard)
    }

    /// Takes a hold a release granted this waiter (direct grant, `grant`: its message), read
    /// against `anchor`: when the waiter's latest refused try was sent and the server's clock
    /// when it ran. The server's clock then was at most what it said when that try was sent, so
    /// the local deadline of the grant's expiry is never later than Redis' own. The hold's lease
    /// is counted from the grant (the server's time in the message), as an uncontended acquire's
    /// is counted from its script: the confirmation of a longer lease asks for grant + lease.
    /// `None` (the guard is disarmed): no anchor, or heard too late (the message was held up past
    /// the grant's probation: the hold may be gone, and another waiter may hold the object), and
    /// the caller tries instead, as the same call.
    pub(crate) fn claim_grant(
        self,
        anchor: Option<(Instant, u64)>,
        grant: lockkit_protocol::wake::Grant,
    ) -> Result<Option<Self>, Error> {
        let Some((sent, server_ms)) = anchor else {
            self.disarm();
            return Ok(None);
        };
        let local = |server: u64| sent + Duration::from_millis(server.saturating_sub(server_ms));
        let deadline = local(grant.expiry_ms);
        let lease_ms =
            u64::try_from(crate::hold::lease_millis(self.hold.lease)).unwrap_or(u64::MAX);
        let lease_end_ms = grant.now_ms.saturating_add(lease_ms);
        let lease_end = crate::watchdog::LeaseEnd {
            server_ms: lease_end_ms,
            local: local(lease_end_ms),
        };
        if Instant::now() >= deadline {
            self.disarm();
            return Ok(None);
        }
        self.granted_until(deadline, lease_end).map(Some)
    }

    /// Records the grant and hands the hold to the watchdog (see
    /// [`granted`](HoldGuard::granted)).
    fn register(mut self) -> Result<Self, Error> {
        self.hold.granted();
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
            self.client.taken.insert(taker, &self.hold);
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
            tracing::warn!(name = %name, "giving back an unreplicated hold failed: {}", crate::error::Chain(&err));
        }
        Err(Error::NotReplicated {
            name,
            acknowledged: outcome.acknowledged,
            required: outcome.required,
        })
    }

    /// Forgets the hold in the per-task registry of holds taken ([`owner::Taken`]) now, ahead
    /// of the guard's drop: for a guard whose release goes on in the background after its owner
    /// let go of it (a dropped [`Leadership`](crate::Leadership) resigns first, then drops the
    /// guard), so that its task campaigning again is not taken for a self-wait.
    pub(crate) fn forget_taken(&mut self) {
        if let Some(taker) = self.taker.take() {
            self.client.taken.remove(taker, self.hold.seq);
        }
    }

    /// Releases the hold now.
    ///
    /// Cancel safety: if the returned future is dropped before it completes, the release goes on
    /// in the background.
    ///
    /// A hold that has reported itself lost answers [`Error::NotHeld`] every time (see
    /// [`release`]), within one round trip ([`ROUND_TRIP`](crate::exec::ROUND_TRIP)): the answer
    /// is known already, and its release (which frees the object at once if Redis has not ended
    /// the hold yet) is only given that long before it goes on in the background, so an
    /// unreachable Redis cannot hold up the answer. Any other release takes at most the command
    /// timeout; one that ends without an answer (an ambiguous [`Error::Redis`]: no reply in
    /// time, or the connection broke) goes on in the background
    /// ([`give_back`](crate::hold::give_back)) until Redis answers, so a hold whose release was
    /// only late (a frozen server that resumes) does not stay for its whole lease.
    pub(crate) async fn release(mut self) -> Result<(), Error> {
        if self.client.is_shut_down() {
            self.armed = false;
            return Err(Error::Shutdown);
        }
        self.client.watchdog.unregister(self.hold.seq);
        if self.hold.is_lost() {
            let name = self.hold.name.to_string();
            let quick = self.client.exec.round_trip();
            match tokio::time::timeout(quick, release(&self.client.exec, &self.hold)).await {
                Ok(result) => {
                    if let Err(err @ Error::Redis(_)) = result {
                        tracing::debug!(
                            name = %name,
                            "releasing a lost hold failed, its lease will run out: {}",
                            crate::error::Chain(&err)
                        );
                    }
                    self.armed = false;
                    self.hold.finish();
                }
                // Still armed: dropping `self` hands the release to the watchdog's worker.
                Err(_elapsed) => {}
            }
            return Err(Error::NotHeld { name });
        }
        let result = release(&self.client.exec, &self.hold).await;
        self.hold.finish();
        // Still armed after no answer: dropping `self` hands the release to the watchdog's
        // worker, which gives it back once Redis answers.
        if !matches!(&result, Err(Error::Redis(err)) if err.is_ambiguous()) {
            self.armed = false;
        }
        result
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        if let Some(taker) = self.taker.take() {
            self.client.taken.remove(taker, self.hold.seq);
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
    use crate::exec::Resend;
    use lockkit_protocol::keys::Kind;

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
        let owner = inner.fresh_owner();
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
}
