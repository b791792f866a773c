//! The one acquire loop shared by every primitive that waits on a release channel.
//!
//! A primitive supplies an [`Attempt`]: one atomic try in Redis that either takes the object or
//! says how long the current holder may still hold it. The loop does the rest, in the order that
//! closes the lost-wakeup race (see [`crate::waiters`]): try; if busy, register on the channel and
//! confirm the subscription; try again; sleep until woken, the holder's lease ends, the
//! [recheck interval](crate::ClientBuilder::recheck_interval) passes, or the deadline passes;
//! repeat. On a channel that is subscribed already, the waiter registers before
//! its first try instead, and needs no second.
//!
//! # The bound
//!
//! A call with a `wait` returns within it, whatever Redis does ([`WaitBound`]): every network
//! step of the loop (a try, the subscription) is cut off at the deadline, except that a try is
//! always given one round trip (at most [`ROUND_TRIP`](crate::exec::ROUND_TRIP), or the command
//! timeout if shorter), so
//! that a `wait` of zero, or a last try just before the deadline, still gets its answer from a
//! healthy Redis. A try cut off is dropped, and gives back what its script may have taken
//! ([`Attempt::attempt`] is cancel-safe); the call fails with an ambiguous [`Error::Redis`] that
//! names the object and says how long it waited: Redis did not answer, which is not the same as
//! "someone else holds it" (`Ok(None)`).
//!
//! # The outage bound of a wait
//!
//! A wait without a deadline (`lock()`, `acquire()`, `wait(Duration::MAX)`), and a long one,
//! fails soon once Redis is gone, whatever the holder's lease says, because it never sleeps long
//! without trying, and every try is bounded by the command timeout:
//! - a lost connection (command or subscriber) wakes every waiter of the client at once
//!   ([`crate::waiters`]): each tries now, and fails within the command timeout unless Redis is
//!   back by then;
//! - a Redis that stops answering without closing the connection (frozen, `CLIENT PAUSE`, a
//!   black hole) closes nothing: every waiter looks again at least every
//!   [recheck interval](crate::ClientBuilder::recheck_interval) ([`sleep_at_most`]), so it
//!   fails within that interval plus the command timeout. The same look finds what no message
//!   announces, such as permits freed by data loss.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::Instrument;

use crate::core::ClientInner;
use crate::error::Error;
use crate::exec::{Bound, Deadline};
use lockkit_protocol::keys::Kind;
use lockkit_protocol::wake::Grant;

use crate::metrics;

/// The result of one try.
pub(crate) enum Outcome<T> {
    /// Taken.
    Acquired(T),
    /// Held by someone else, for at most `retry_in` (unknown: `None`).
    Busy { retry_in: Option<Duration> },
    /// Free, but reserved for another waiter for `window` (a lock's handoff). Once this client
    /// has heard of the reservation, its end is announced (the reserved waiter took it, or the
    /// window passed and a waiter here is woken), so the waiter sleeps until woken, or at most
    /// `refresh`; otherwise until the window ends.
    Reserved { window: Duration, refresh: Duration },
}

/// One primitive's way of trying to take its object.
pub(crate) trait Attempt {
    /// What a successful try yields (a guard).
    type Output;
    /// The channel on which releases of the object are announced.
    fn channel(&self) -> &str;
    /// The object's kind and name (for the `lockkit.acquire` span and the metrics).
    fn object(&self) -> (Kind, &str);
    /// This waiter's id, for objects whose release messages name the next waiter (fair lock).
    fn waiter_tag(&self) -> Option<&str> {
        None
    }
    /// The main key of an object whose holds have owners (the lock kinds), for the self-wait
    /// warning: a task about to wait for a lock it took itself and has not released is told so.
    fn owned_key(&self) -> Option<&str> {
        None
    }
    /// How much of the object this waiter needs (a semaphore's permits; 1 by default). A waiter
    /// that is woken and refused hands its wake-up to a local waiter that needs less
    /// ([`crate::waiters::Waiter::tried`]).
    fn need(&self) -> u64 {
        1
    }
    /// One try. Must be cancel-safe: dropping it mid-flight must give back whatever it took.
    fn attempt(&self) -> impl Future<Output = Result<Outcome<Self::Output>, Error>> + Send;
    /// The last try of a wait whose deadline has passed: as [`attempt`](Attempt::attempt), but a
    /// kind whose releases grant leaves its waiting entry in the same script when refused, so no
    /// release grants the object to a call that is returning.
    fn last_attempt(&self) -> impl Future<Output = Result<Outcome<Self::Output>, Error>> + Send {
        self.attempt()
    }
    /// Leaves the object's line now, and waits for it: the call ends without the object (the
    /// client shut down), and its entry must be gone when it returns, not some time after (a
    /// release would grant the object to a call that is no longer there, or keep waiters behind
    /// it). Kinds whose waiters keep no entry in Redis have nothing to do.
    fn leave(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// Takes what a release granted this waiter (a lock's direct grant: the lock is already its
    /// own in Redis). `None`: this kind cannot use the grant as it is, and tries instead (which
    /// finds the granted hold). Must be cancel-safe as [`attempt`](Attempt::attempt) is.
    fn claim(
        &self,
        grant: Grant,
    ) -> impl Future<Output = Result<Option<Self::Output>, Error>> + Send {
        let _ = grant;
        async { Ok(None) }
    }
}

/// Tries until acquired or until `wait` has passed (`None`: no bound). `Ok(None)`: not acquired
/// in time.
pub(crate) async fn acquire<A>(
    client: &ClientInner,
    attempt: &A,
    wait: Option<Duration>,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt + Sync,
{
    let kind = attempt.object().0.segment();
    let result = instrumented(
        client,
        attempt,
        wait,
        acquire_loop(client, attempt, wait, kind),
    )
    .await;
    if matches!(result, Err(Error::Shutdown)) {
        // Out of the line before the call returns, not in the background after it (bounded by
        // the command timeout, as every script call is): a grant it was given goes on to the
        // next waiter. (A wait that ends otherwise leaves in its last try's script, or, cut off
        // by its bound, in the background: its bound does not wait for Redis.)
        attempt.leave().await;
    }
    result
}

/// One try of `attempt`, as [`acquire`] with a `wait` of zero, bounded by `bound` (the bound of
/// the call the try is part of: a multi-lock's member taken in a round, which its error names),
/// not by one round trip. `Ok(None)`: not taken.
pub(crate) async fn acquire_once<A>(
    client: &ClientInner,
    attempt: &A,
    bound: Deadline,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt + Sync,
{
    let kind = attempt.object().0.segment();
    let wait = Some(Duration::ZERO);
    instrumented(
        client,
        attempt,
        wait,
        acquire_loop_within(client, attempt, wait, kind, Some(bound)),
    )
    .await
}

/// Runs the same loop as [`acquire`] for an attempt that takes nothing: a multi-lock waiting,
/// holding nothing, until a member would be granted to it. No acquisition is counted in the
/// metrics or spanned, since none is made; the wait itself is (`Waiting`).
pub(crate) async fn wait_until<A>(
    client: &ClientInner,
    attempt: &A,
    wait: Option<Duration>,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt + Sync,
{
    client.check_open()?;
    let (kind, name) = attempt.object();
    acquire_loop(client, attempt, wait, kind.segment())
        .await
        .map_err(|err| shut_down_or(client, err, name))
}

/// Whatever broke while the client was shutting down, the reason is the shutdown; any other
/// error names the object it was about.
fn shut_down_or(client: &ClientInner, err: Error, name: &str) -> Error {
    if client.is_shut_down() {
        Error::Shutdown
    } else {
        client.exec.explain(err.naming(name))
    }
}

/// Runs one acquire call's loop: refused once the client is shut down, inside the
/// `lockkit.acquire` span (debug level: the object's kind and name, the wait; the lease and mode
/// are recorded when a hold is granted, [`crate::guard::HoldGuard::granted`]), with an error seen
/// while the client shuts down reported as [`Error::Shutdown`], and its outcome counted in the
/// metrics.
async fn instrumented<A, F>(
    client: &ClientInner,
    attempt: &A,
    wait: Option<Duration>,
    waiting: F,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt,
    F: Future<Output = Result<Option<A::Output>, Error>>,
{
    client.check_open()?;
    let (kind, name) = attempt.object();
    let started = metrics::Stopwatch::start();
    let span = tracing::debug_span!(
        ACQUIRE_SPAN,
        kind = kind.segment(),
        name,
        wait = ?wait,
        lease = tracing::field::Empty,
        watchdog = tracing::field::Empty,
    );
    let result = waiting
        .instrument(span)
        .await
        .map_err(|err| shut_down_or(client, err, name));
    match &result {
        Ok(Some(_)) => metrics::acquired(kind.segment(), &started),
        Ok(None) => metrics::timed_out(kind.segment()),
        Err(_) => {}
    }
    result
}

/// The name of the span around an acquire call.
pub(crate) const ACQUIRE_SPAN: &str = "lockkit.acquire";

/// Keeps every network step of an acquire call within the call's `wait` (see the module
/// documentation): a step is cut off at the deadline, or one round trip after it starts if
/// that is later.
struct WaitBound {
    /// `None`: no deadline (a `wait` too long to represent, or none at all).
    deadline: Option<Instant>,
    started: Instant,
    wait: Duration,
    round_trip: Duration,
    /// The bound of the call this one is part of, which every step keeps to instead
    /// ([`acquire_once`]).
    call: Option<Deadline>,
}

impl WaitBound {
    fn new(client: &ClientInner, wait: Option<Duration>) -> Self {
        let started = Instant::now();
        let wait_or_zero = wait.unwrap_or_default();
        Self {
            // A wait too long to represent is no bound at all.
            deadline: wait.and_then(|wait| started.checked_add(wait)),
            started,
            wait: wait_or_zero,
            round_trip: client.exec.round_trip(),
            call: None,
        }
    }

    /// Runs one step of the call within the bound, counted from now. Boxed, as
    /// [`Exec::ints_within`](crate::exec::Exec::ints_within) is: the step is an attempt future
    /// that nests script calls, and the futures of user code that nests acquires must stay
    /// shallow and small.
    fn run<'a, T: 'a>(
        &self,
        step: impl Future<Output = Result<T, Error>> + Send + 'a,
    ) -> BoxFuture<'a, Result<T, Error>> {
        if let Some(call) = self.call {
            return Box::pin(call.run("acquire", step));
        }
        match self.deadline {
            None => Box::pin(step),
            Some(deadline) => {
                let at = deadline.max(Instant::now() + self.round_trip);
                let bound = Bound::of_wait(self.wait, self.round_trip);
                Box::pin(Deadline::at(at, self.started, bound).run("acquire", step))
            }
        }
    }
}

async fn acquire_loop<A>(
    client: &ClientInner,
    attempt: &A,
    wait: Option<Duration>,
    kind: &'static str,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt + Sync,
{
    acquire_loop_within(client, attempt, wait, kind, None).await
}

/// [`acquire_loop`], its steps bounded by `call` when given ([`acquire_once`]).
async fn acquire_loop_within<A>(
    client: &ClientInner,
    attempt: &A,
    wait: Option<Duration>,
    kind: &'static str,
    call: Option<Deadline>,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt + Sync,
{
    let bound = WaitBound {
        call,
        ..WaitBound::new(client, wait)
    };
    let deadline = bound.deadline;
    let (channel, tag, need) = (attempt.channel(), attempt.waiter_tag(), attempt.need());
    // On a channel subscribed already, register before the first try (a caller that will not
    // wait has nothing to register for).
    let early = if wait == Some(Duration::ZERO) {
        None
    } else {
        client.hub.register_now(channel, tag, need)
    };
    // How long to sleep at most after a refused try (`None`: no known bound).
    let sleep_bound = |outcome: Outcome<A::Output>| match outcome {
        Outcome::Acquired(out) => Ok(out),
        Outcome::Busy { retry_in } => Err(retry_in),
        // Heard of: the reservation's end is announced (`taken`, or the window's end wakes a
        // waiter here).
        Outcome::Reserved { window, refresh } => {
            Err(Some(if client.hub.reservation_announced(channel) {
                refresh
            } else {
                window
            }))
        }
    };
    let first = match sleep_bound(bound.run(attempt.attempt()).await?) {
        Ok(out) => return Ok(Some(out)),
        Err(bound) => bound,
    };
    if wait == Some(Duration::ZERO) {
        return Ok(None);
    }
    warn_if_waiting_on_itself(client, attempt);
    // Registered before the first try: a release after it wakes this waiter, so the try that
    // closes the lost-wakeup race is not needed.
    let (waiter, mut known) = match early {
        Some(waiter) => (waiter, Some(first)),
        None => {
            // The subscription is given the command timeout at most, as a try is, however long
            // the wait: it re-sends a `SUBSCRIBE` that could not be routed for several seconds
            // (`exec::resend_unsent`), and a wait must not spend them on a Redis that is gone.
            let subscribing = client
                .exec
                .command_deadline()
                .run("subscribe", client.hub.register(channel, tag, need));
            (bound.run(subscribing).await?, None)
        }
    };
    let _waiting = metrics::Waiting::new(kind);
    // A lock a release granted this waiter while it slept: taken without a try.
    let mut granted: Option<Grant> = None;
    loop {
        if let Some(grant) = granted.take() {
            // Not claimed: the try below settles the wake-up.
            if let Some(out) = bound.run(attempt.claim(grant)).await? {
                waiter.tried(false);
                return Ok(Some(out));
            }
        }
        let retry_in = match known.take() {
            Some(retry_in) => retry_in,
            None => {
                let last = deadline.is_some_and(|deadline| Instant::now() >= deadline);
                let outcome = if last {
                    bound.run(attempt.last_attempt()).await?
                } else {
                    bound.run(attempt.attempt()).await?
                };
                // A wake-up this try acted on is used up; one that was refused goes on to a
                // waiter that needs less. (Dropped before here, the waiter passes a wake-up in
                // hand on.)
                waiter.tried(!matches!(outcome, Outcome::Acquired(_)));
                match sleep_bound(outcome) {
                    Ok(out) => return Ok(Some(out)),
                    Err(bound) => bound,
                }
            }
        };
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            return Ok(None);
        }
        let bound = sleep_at_most(client, retry_in);
        let mut wake_at = now + bound;
        if let Some(deadline) = deadline {
            wake_at = wake_at.min(deadline);
        }
        tokio::select! {
            grant = waiter.woken() => granted = grant,
            () = tokio::time::sleep_until(wake_at) => {}
            () = client.shutdown.cancelled() => return Err(Error::Shutdown),
        }
    }
}

/// How long a refused waiter sleeps at most before it looks again, woken or not: until the
/// holder's lease ends (`retry_in`; unknown: `None`), and never longer than the client's
/// [recheck interval](crate::ClientBuilder::recheck_interval), whatever the lease says. What no
/// message announces is found by looking: permits or a latch freed by data loss, a Redis that
/// stopped answering without closing the connection (the look fails within the command
/// timeout). At least 1 ms.
fn sleep_at_most(client: &ClientInner, retry_in: Option<Duration>) -> Duration {
    let recheck = client.settings.recheck_interval;
    retry_in
        .map_or(recheck, |retry_in| retry_in.min(recheck))
        .max(Duration::from_millis(1))
}

/// Logs the self-wait warning (once per acquire call: called before its first wait) when the
/// calling task holds the object itself.
fn warn_if_waiting_on_itself<A: Attempt>(client: &ClientInner, attempt: &A) {
    if let Some(key) = attempt.owned_key() {
        let (kind, name) = attempt.object();
        client.taken.warn_if_waiting_on_itself(kind, key, name);
    }
}

/// Backoff of the polling loop: the first pause, doubling up to the cap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    pub(crate) first: Duration,
    pub(crate) cap: Duration,
}

/// Like [`acquire`], but waits by polling with capped exponential backoff and jitter instead of
/// pub/sub (for the spin lock, where pub/sub traffic is unwelcome). Each pause is also bounded by
/// the holder's remaining lease, the recheck interval and the deadline.
pub(crate) async fn acquire_polling<A>(
    client: &ClientInner,
    attempt: &A,
    wait: Option<Duration>,
    backoff: Backoff,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt + Sync,
{
    instrumented(
        client,
        attempt,
        wait,
        poll_loop(client, attempt, wait, backoff),
    )
    .await
}

async fn poll_loop<A>(
    client: &ClientInner,
    attempt: &A,
    wait: Option<Duration>,
    backoff: Backoff,
) -> Result<Option<A::Output>, Error>
where
    A: Attempt + Sync,
{
    let bound = WaitBound::new(client, wait);
    let deadline = bound.deadline;
    let mut pause = backoff.first;
    let mut warned = false;
    loop {
        let retry_in = match bound.run(attempt.attempt()).await? {
            Outcome::Acquired(out) => return Ok(Some(out)),
            Outcome::Busy { retry_in } => retry_in,
            Outcome::Reserved { window, .. } => Some(window),
        };
        let now = Instant::now();
        if wait == Some(Duration::ZERO) || deadline.is_some_and(|deadline| now >= deadline) {
            return Ok(None);
        }
        if !warned {
            warned = true;
            warn_if_waiting_on_itself(client, attempt);
        }
        // Full jitter in [pause/2, pause], so pollers spread out.
        let jittered = pause / 2 + pause.mul_f64(jitter() / 2.0);
        let mut wake_at = now + sleep_at_most(client, retry_in).min(jittered);
        if let Some(deadline) = deadline {
            wake_at = wake_at.min(deadline);
        }
        tokio::select! {
            () = tokio::time::sleep_until(wake_at) => {}
            () = client.shutdown.cancelled() => return Err(Error::Shutdown),
        }
        pause = (pause * 2).min(backoff.cap);
    }
}

/// A random number in `[0, 1)`, from the standard library's randomly seeded hasher.
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let bits = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    (bits >> 11) as f64 / (1u64 << 53) as f64
}
