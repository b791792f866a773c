//! One hold on a Redis object: what the watchdog renews and what a release gives back (the
//! object's key, the hold's marker, its lease and its lost-signal), the lease checks, and the
//! release itself. The guard that owns a hold in a client is [`crate::guard::HoldGuard`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::ReleaseReply;
use lockkit_protocol::script::Script;
use parking_lot::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::exec::{Deadline, Exec, Resend};
use crate::limits::{MAX_LEASE, MIN_LEASE};

/// Checks a fixed lease: at least [`MIN_LEASE`] and at most [`MAX_LEASE`]; a lease that is not
/// a whole number of milliseconds is rounded up.
pub(crate) fn validate_lease(lease: Duration) -> Result<Duration, Error> {
    validate_duration("lease", lease)
}

/// Checks a duration used as a lease (`what`: how the message names it, `lease`, `once_per
/// window`): at least [`MIN_LEASE`] and at most [`MAX_LEASE`].
pub(crate) fn validate_duration(what: &str, lease: Duration) -> Result<Duration, Error> {
    if lease < MIN_LEASE {
        return Err(Error::InvalidArgument(format!(
            "{what} {lease:?} is shorter than the minimum of {MIN_LEASE:?} (the granularity of \
             Redis' PEXPIRE): it would be gone at once"
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::InvalidArgument(format!(
            "{what} {lease:?} is longer than the maximum of {MAX_LEASE:?}"
        )));
    }
    Ok(lease)
}

/// Why a hold whose lease ran out by the local clock is lost, for the lease-lost warning: a
/// watchdog-mode hold was not renewed in time; a fixed lease is never renewed, it just ended.
pub(crate) fn ran_out(watchdog: bool) -> &'static str {
    if watchdog {
        "the lease ran out before it could be renewed"
    } else {
        "its fixed lease ran out (fixed leases are never renewed; the critical section outlived it)"
    }
}

/// Round-up milliseconds of a validated lease.
pub(crate) fn lease_millis(lease: Duration) -> u128 {
    lease.as_nanos().div_ceil(1_000_000)
}

/// How many times a release is sent when the connection breaks under it, within its command
/// timeout.
const RELEASE_ATTEMPTS: u32 = 3;

/// The pause before a give-back in the background is sent again after a failed attempt: the
/// first, doubling up to the cap.
const GIVE_BACK_FIRST_PAUSE: Duration = Duration::from_millis(50);
const GIVE_BACK_PAUSE_CAP: Duration = Duration::from_secs(2);

/// How long a release may take.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience<'a> {
    /// Every attempt within one command timeout from the start: someone waits for the answer
    /// (`unlock`, a permit released by id, a shutdown).
    CommandTimeout,
    /// A give-back in the background (a dropped guard, a try cut off, whose hold may exist):
    /// each attempt waits for Redis' answer however late it comes (a frozen server runs the
    /// try it was sent, then the give-back, when it resumes; a `NOSCRIPT` answer is followed
    /// by the script's source then), and an attempt that fails without an answer (the
    /// connection broke, no connection, an error reply) is sent again after a pause (50 ms,
    /// doubling up to 2 s), until an answer says the hold was released or is not held. Once
    /// `stop` is cancelled (the client shuts down, or is gone), what is left takes at most one
    /// command timeout.
    UntilAnswered(&'a CancellationToken),
}

/// Where a release is: bounded by a deadline, or waiting for an answer until `stop`.
#[derive(Clone, Copy)]
enum Mode<'a> {
    Bounded(Deadline),
    Patient(&'a CancellationToken),
}

/// How holds of one kind of object are released and renewed.
///
/// Conventions every kind's scripts follow, so the release path and the watchdog are written once:
/// - release: `KEYS` = the hold's keys; `ARGV` = marker, channel, sharded flag (`0`/`1`); reply
///   decoded by [`ReleaseReply`];
/// - renew (batched): for the i-th hold, `KEYS[stride·(i−1)+1 ..= stride·i]` = its keys and
///   `ARGV[2i−1]`, `ARGV[2i]` = its marker and lease in ms (`0`: only check); reply: one `1`/`0`
///   per hold (present / gone). The lock kinds' renew script (`lock_renew`) also takes
///   `@<server ms>` for `ARGV[2i]`, an instant to extend to: the confirmation of a granted hold
///   ([`crate::watchdog::confirm_later`]).
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
    /// Set once the hold was granted: before that, its deadline means nothing (a cancelled
    /// acquire's hold is not "lost").
    granted: AtomicBool,
}

impl Hold {
    /// A new hold, not yet granted: its local deadline is now until a grant moves it.
    #[allow(clippy::too_many_arguments)] // one field each; a builder would only rename them
    pub(crate) fn new(
        seq: u64,
        name: Arc<str>,
        kind: &'static HoldKind,
        keys: Arc<ObjectKeys>,
        marker: String,
        owner: Option<Arc<str>>,
        lease: Duration,
        watchdog: bool,
    ) -> Self {
        Self {
            seq,
            name,
            kind,
            keys,
            marker,
            owner,
            lease,
            watchdog,
            lost: CancellationToken::new(),
            expires_at: Mutex::new(Instant::now()),
            clock: crate::metrics::HoldClock::new(),
            granted: AtomicBool::new(false),
        }
    }

    /// The main key.
    pub(crate) fn key(&self) -> &str {
        &self.keys.key
    }

    /// Records a successful acquire or renewal that was sent at `sent`.
    pub(crate) fn confirmed_at(&self, sent: Instant) {
        self.confirmed_until(sent + self.lease);
    }

    /// Records that the hold lives at least until `deadline` (local, conservative): a grant on
    /// probation ([`lockkit_protocol::lock::GRANT_PROBATION`]).
    pub(crate) fn confirmed_until(&self, deadline: Instant) {
        let mut expires_at = self.expires_at.lock();
        if deadline > *expires_at {
            *expires_at = deadline;
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
        if self.granted.load(Ordering::Acquire) && Instant::now() >= self.expires_at() {
            self.mark_lost(ran_out(self.watchdog));
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

    /// Records the grant: from now on the local deadline counts (and the hold time, for the
    /// metrics). Call after [`confirmed_at`](Hold::confirmed_at).
    /// Whether the hold was granted: `false` for the hold of an acquire cut short, which may or
    /// may not have taken it.
    pub(crate) fn was_granted(&self) -> bool {
        self.granted.load(Ordering::Acquire)
    }

    pub(crate) fn granted(&self) {
        self.clock.granted();
        self.granted.store(true, Ordering::Release);
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
                            hold.mark_lost(ran_out(hold.watchdog));
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Gives back `hold` in Redis, within the command timeout.
///
/// A hold already known lost ([`Hold::is_lost`]: its lease ran out by the local, conservative
/// clock, or renewal found it gone) is still given back, so that the lock frees at once if Redis
/// has not ended it yet, but the answer is [`Error::NotHeld`] every time: the critical section
/// may have outlived the lease, whichever side of the race the release landed on.
pub(crate) async fn release(exec: &Exec, hold: &Hold) -> Result<(), Error> {
    release_with(exec, hold, Patience::CommandTimeout).await
}

/// Gives back `hold` in the background ([`Patience::UntilAnswered`]): a dropped guard's hold,
/// or what a try cut off may have taken. Ends with an answer from Redis, or, once `stop` is
/// cancelled, within one command timeout more.
pub(crate) async fn give_back(
    exec: &Exec,
    hold: &Hold,
    stop: &CancellationToken,
) -> Result<(), Error> {
    release_with(exec, hold, Patience::UntilAnswered(stop)).await
}

/// [`release`] or [`give_back`], as `patience` says.
async fn release_with(exec: &Exec, hold: &Hold, patience: Patience<'_>) -> Result<(), Error> {
    use tracing::Instrument;
    let span = tracing::debug_span!(
        "lockkit.release",
        kind = hold.kind.kind.segment(),
        name = &*hold.name,
    );
    let lost_before = hold.is_lost();
    release_marker_with(
        exec,
        hold.kind,
        &hold.keys,
        &hold.name,
        &hold.marker,
        || hold.is_lost(),
        patience,
    )
    .instrument(span)
    .await
    .map_err(|err| err.naming(&hold.name))?;
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
///
/// All attempts together take at most the command timeout: past it, the release fails with an
/// ambiguous [`Error::Redis`] (it may have run) and the hold is left to its lease.
pub(crate) async fn release_marker(
    exec: &Exec,
    kind: &HoldKind,
    keys: &ObjectKeys,
    name: &str,
    marker: &str,
    known_lost: impl Fn() -> bool,
) -> Result<(), Error> {
    let patience = Patience::CommandTimeout;
    release_marker_with(exec, kind, keys, name, marker, known_lost, patience).await
}

/// [`release_marker`], as `patience` says: within the command timeout, or (a give-back in the
/// background) until Redis answers.
async fn release_marker_with(
    exec: &Exec,
    kind: &HoldKind,
    keys: &ObjectKeys,
    name: &str,
    marker: &str,
    known_lost: impl Fn() -> bool,
    patience: Patience<'_>,
) -> Result<(), Error> {
    let key_refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
    let mut args = vec![marker, &keys.channel, exec.publish_flag()];
    // A fenced lock's release may grant the lock to a waiter, minting its token.
    args.extend(exec.counter_ttl_arg(kind.kind));
    let mut ambiguous = false;
    let mut resent = 0;
    // One deadline for every attempt, from the start or (a give-back) from the stop.
    let mut mode = match patience {
        Patience::UntilAnswered(stop) if !stop.is_cancelled() => Mode::Patient(stop),
        Patience::CommandTimeout | Patience::UntilAnswered(_) => {
            Mode::Bounded(exec.command_deadline())
        }
    };
    let mut pause = GIVE_BACK_FIRST_PAUSE;
    loop {
        let result = match mode {
            Mode::Bounded(deadline) => {
                exec.ints_within(
                    kind.release,
                    kind.kind,
                    &key_refs,
                    &args,
                    Resend::Never,
                    deadline,
                )
                .await
            }
            Mode::Patient(stop) => {
                let mut call = exec.ints_until_answered(kind.release, kind.kind, &key_refs, &args);
                tokio::select! {
                    biased;
                    result = &mut call => result,
                    () = stop.cancelled() => {
                        // The same attempt goes on, now bounded.
                        let deadline = exec.command_deadline();
                        mode = Mode::Bounded(deadline);
                        deadline.run(kind.release.name(), call).await
                    }
                }
            }
        };
        let err = match result {
            Ok(reply) => {
                return match ReleaseReply::decode(&reply)? {
                    ReleaseReply::Freed | ReleaseReply::StillHeld { .. } => Ok(()),
                    ReleaseReply::NotHeld if ambiguous && !known_lost() => Ok(()),
                    ReleaseReply::NotHeld => Err(Error::NotHeld {
                        name: name.to_owned(),
                    }),
                };
            }
            Err(Error::Redis(err)) => err,
            Err(err) => return Err(err),
        };
        ambiguous |= err.is_ambiguous();
        match mode {
            // A timeout used up the deadline: no time is left for another attempt.
            Mode::Bounded(_)
                if err.is_ambiguous() && !err.is_timeout() && resent + 1 < RELEASE_ATTEMPTS =>
            {
                tracing::debug!(
                    name,
                    "release interrupted ({}); sending it again",
                    crate::error::Chain(&err)
                );
                resent += 1;
            }
            Mode::Bounded(_) => return Err(Error::Redis(err)),
            // No answer: the hold may be there.
            Mode::Patient(stop) => {
                tracing::debug!(
                    name,
                    "giving back a hold failed ({}); sending it again in {pause:?}",
                    crate::error::Chain(&err)
                );
                tokio::select! {
                    () = tokio::time::sleep(pause) => {}
                    () = stop.cancelled() => mode = Mode::Bounded(exec.command_deadline()),
                }
                pause = (pause * 2).min(GIVE_BACK_PAUSE_CAP);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_validated() {
        assert!(validate_lease(Duration::ZERO).is_err());
        assert!(validate_lease(Duration::MAX).is_err());
        assert!(validate_lease(MAX_LEASE + Duration::from_secs(1)).is_err());
        assert_eq!(validate_lease(MIN_LEASE).ok(), Some(MIN_LEASE));
        assert_eq!(lease_millis(Duration::from_micros(1500)), 2);
    }

    /// A lease below the floor is refused, naming the floor (it used to be rounded up to 1 ms and
    /// lost at once).
    #[test]
    fn a_lease_below_the_floor_is_refused_naming_it() {
        for short in [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(999),
        ] {
            match validate_lease(short) {
                Err(Error::InvalidArgument(why)) => {
                    assert!(why.starts_with("lease "), "{why}");
                    assert!(why.contains("minimum of 1ms"), "{why}");
                }
                other => panic!("{short:?}: {other:?}"),
            }
        }
    }

    /// The lease-lost warning of a fixed lease does not speak of renewal.
    #[test]
    fn a_fixed_lease_that_ran_out_is_not_said_to_be_unrenewed() {
        assert!(ran_out(true).contains("renewed"));
        assert!(ran_out(false).starts_with("its fixed lease ran out"));
        assert!(!ran_out(false).contains("could not be renewed"));
    }

    /// The longest lease accepted is the documented 365 days (`MAX_LEASE`), not a day less.
    #[test]
    fn a_lease_of_365_days_is_the_longest_accepted() {
        let year = Duration::from_secs(365 * 24 * 60 * 60);
        assert_eq!(validate_lease(year).ok(), Some(year));
        assert!(validate_lease(year + Duration::from_millis(1)).is_err());
    }
}
