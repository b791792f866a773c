//! [`RateLimiter`]: at most `n` permits per interval across every client, waiting without polling.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::hold_marker;
use lockkit_protocol::rate_limiter::{
    client_state_key, decode_cancel, decode_set_limit, AcquireReply, StatusReply, ACQUIRE, CANCEL,
    MODE_OVERALL, MODE_PER_CLIENT, SET_LIMIT, STATUS,
};
use tokio::time::Instant;

use crate::error::{command_error, Error};
use crate::exec::{far_or, Bound, Deadline, Resend};
use crate::metrics;
use crate::object::Object;
use crate::queued::{Leave, Queued};
use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand};
use futures::TryFutureExt;
use lockkit_protocol::slot::key_slot;

/// How a rate limiter's request is given back: its cancel script, on the limit HASH and the
/// waiting ZSET (the caller's own schedule key follows them).
static RATE_LEAVE: Leave = Leave {
    script: &CANCEL,
    keys: |keys| keys.keys.iter().map(String::as_str).collect(),
    decode: decode_cancel,
};

/// Whether a limit counts the permits of every client together, or of each client alone.
///
/// ```
/// use lockkit::{RateLimit, RateMode};
///
/// // Each pod its own 10 a second, set in one place for all of them.
/// let each = RateLimit::per_second(10)?.with_mode(RateMode::PerClient);
/// assert_eq!(each.mode(), RateMode::PerClient);
/// assert_eq!(RateLimit::per_second(10)?.mode(), RateMode::Overall);
/// # Ok::<(), lockkit::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RateMode {
    /// One limit for every client of the rate limiter together (Redisson's `OVERALL`): ten pods
    /// share the 100 requests a second a partner allows.
    Overall,
    /// The limit applies to each client on its own (Redisson's `PER_CLIENT`): each
    /// [`Client`](crate::Client) gets `n` per interval, set in one place for all of them.
    PerClient,
}

/// A rate limit: `permits` per `interval`, with an optional `burst`.
///
/// In every window of one `interval`, at most `permits + burst` permits are admitted, counted on
/// the server's clock, across every client (or each client, [`RateMode::PerClient`]). Permits
/// are spread evenly: one every `interval / permits`. The burst lets a limiter that was idle
/// admit up to `burst + 1` permits at once, and `burst + 1` is the most one request may ask for
/// ([`max_per_request`](RateLimit::max_per_request)).
///
/// ```
/// use std::time::Duration;
/// use lockkit::RateLimit;
///
/// // 100 requests a second, spread evenly: one every 10 ms.
/// let partner = RateLimit::per_second(100)?;
/// assert_eq!(partner.max_per_request(), 1);
/// // 10 000 a day, up to 50 in one go.
/// let daily = RateLimit::new(10_000, Duration::from_secs(86_400))?.with_burst(49)?;
/// assert_eq!(daily.max_per_request(), 50);
/// assert!(RateLimit::per_second(0).is_err());
/// # Ok::<(), lockkit::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RateLimit {
    permits: u64,
    interval: Duration,
    burst: u64,
    mode: RateMode,
}

impl RateLimit {
    /// The longest interval: 366 days.
    pub const MAX_INTERVAL: Duration = Duration::from_secs(366 * 24 * 60 * 60);
    /// The largest burst: 1,000,000,000 permits.
    pub const MAX_BURST: u64 = 1_000_000_000;

    /// `permits` per `interval`, no burst, [`RateMode::Overall`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero permits, an interval under 1 ms, over
    /// [`MAX_INTERVAL`](RateLimit::MAX_INTERVAL) or not a whole number of milliseconds, or more
    /// than one permit per microsecond.
    pub fn new(permits: u64, interval: Duration) -> Result<Self, Error> {
        if permits == 0 {
            return Err(Error::InvalidArgument(
                "a rate limit of zero permits admits nothing: give at least 1".into(),
            ));
        }
        if interval < Duration::from_millis(1) || interval > Self::MAX_INTERVAL {
            return Err(Error::InvalidArgument(format!(
                "a rate limit's interval must be in 1ms..={:?}, not {interval:?}",
                Self::MAX_INTERVAL
            )));
        }
        if !interval.subsec_nanos().is_multiple_of(1_000_000) {
            return Err(Error::InvalidArgument(format!(
                "a rate limit's interval is kept in whole milliseconds, not {interval:?}"
            )));
        }
        if u128::from(permits) > interval.as_micros() {
            return Err(Error::InvalidArgument(format!(
                "{permits} permits per {interval:?} is more than one a microsecond, the finest \
                 a rate limiter keeps"
            )));
        }
        Ok(Self {
            permits,
            interval,
            burst: 0,
            mode: RateMode::Overall,
        })
    }

    /// `permits` per second (see [`new`](RateLimit::new)).
    ///
    /// # Errors
    /// As [`new`](RateLimit::new).
    pub fn per_second(permits: u64) -> Result<Self, Error> {
        Self::new(permits, Duration::from_secs(1))
    }

    /// `permits` per minute (see [`new`](RateLimit::new)).
    ///
    /// # Errors
    /// As [`new`](RateLimit::new).
    pub fn per_minute(permits: u64) -> Result<Self, Error> {
        Self::new(permits, Duration::from_secs(60))
    }

    /// The same limit with `burst` permits more allowed in a window, and up to `burst + 1` at
    /// once.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a burst over [`MAX_BURST`](RateLimit::MAX_BURST), or one
    /// whose `burst + 1` emission intervals (`interval / permits` each) span more than
    /// [`MAX_INTERVAL`](RateLimit::MAX_INTERVAL).
    pub fn with_burst(self, burst: u64) -> Result<Self, Error> {
        if burst > Self::MAX_BURST {
            return Err(Error::InvalidArgument(format!(
                "a rate limit's burst must be at most {}, not {burst}",
                Self::MAX_BURST
            )));
        }
        // The schedule is kept in µs as a double: a burst's span, (burst + 1) emission intervals,
        // stays within MAX_INTERVAL, so every figure a script computes is exact to a fraction
        // of a µs.
        let span = u128::from(burst + 1) * self.interval.as_micros() / u128::from(self.permits);
        if span > Self::MAX_INTERVAL.as_micros() {
            return Err(Error::InvalidArgument(format!(
                "a burst of {burst} at {} permits per {:?} spans more than {:?} (burst + 1 \
                 emission intervals): give a smaller burst or a higher rate",
                self.permits,
                self.interval,
                Self::MAX_INTERVAL
            )));
        }
        Ok(Self { burst, ..self })
    }

    /// The same limit in `mode`.
    pub fn with_mode(self, mode: RateMode) -> Self {
        Self { mode, ..self }
    }

    /// Permits per interval.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// The interval.
    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// Permits a window may admit on top of [`permits`](RateLimit::permits).
    pub fn burst(&self) -> u64 {
        self.burst
    }

    /// Whether the limit counts every client together or each on its own.
    pub fn mode(&self) -> RateMode {
        self.mode
    }

    /// The most permits one request may ask for: `burst + 1`.
    pub fn max_per_request(&self) -> u64 {
        self.burst + 1
    }

    /// The limit as the scripts take it: rate, interval ms, burst, mode.
    fn args(&self) -> [String; 4] {
        [
            self.permits.to_string(),
            self.interval.as_millis().to_string(),
            self.burst.to_string(),
            match self.mode {
                RateMode::Overall => MODE_OVERALL,
                RateMode::PerClient => MODE_PER_CLIENT,
            }
            .to_owned(),
        ]
    }
}

/// A rate limiter shared by every client that uses the same name and Redis: at most `n` permits
/// per interval, counted on the server's clock, however many pods ask.
///
/// Get one with [`Client::rate_limiter`](crate::Client::rate_limiter). The handle is cheap,
/// `Clone + Send + Sync`, and sends nothing until used. The limit is stored in Redis: set it once
/// with [`set_limit`](RateLimiter::set_limit) or [`try_set_limit`](RateLimiter::try_set_limit),
/// or configure it on the handle with [`with_limit`](RateLimiter::with_limit) so it is set up
/// again should Redis lose it.
///
/// # How it works
/// One script call per request decides at once, on the server's clock, when the permits are
/// admitted: now, or at a moment ahead (a *reservation*). A reserved caller sleeps until its
/// moment and asks Redis nothing more: no polling, no pub/sub message, and callers are served in
/// the order their requests reached Redis. Should Redis lose its data, a caller whose moment is
/// more than one interval ahead learns it (the first request that stores the limit again
/// announces it; a restart reconnects its client), finds its reservation gone and asks again, so
/// the loss over-admits at most the reservations of one window. See `docs/design.md` for the
/// algorithm (GCRA) and its bounds.
///
/// ```no_run
/// # async fn call_partner() {}
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
/// use lockkit::RateLimit;
///
/// // Every pod: 100 requests a second to the partner, for all pods together.
/// let partner = client.rate_limiter("partner-api").with_limit(RateLimit::per_second(100)?);
/// partner.acquire(1).await?;
/// call_partner().await;
///
/// // Or give up when the next permit is more than 50 ms away (decided at once).
/// if partner.try_acquire(1, Duration::from_millis(50)).await? {
///     call_partner().await;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RateLimiter {
    object: Object,
}

impl RateLimiter {
    pub(crate) fn new(client: Arc<crate::core::ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::RateLimiter, name),
        }
    }

    /// The rate limiter's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    /// Configures `limit` for this rate limiter in this client: every request passes it, so a
    /// rate limiter whose limit is not stored (never set, or lost with Redis' data) is set up
    /// with it. A limit already stored is kept: change it with
    /// [`set_limit`](RateLimiter::set_limit). Sends nothing.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use lockkit::RateLimit;
    ///
    /// // Every pod, at start-up: no call needed, the first request stores the limit.
    /// let partner = client.rate_limiter("partner-api").with_limit(RateLimit::per_second(100)?);
    /// assert_eq!(partner.configured_limit(), Some(RateLimit::per_second(100)?));
    /// # Ok(()) }
    /// ```
    pub fn with_limit(self, limit: RateLimit) -> Self {
        self.remember(limit);
        self
    }

    /// The limit configured in this client (by [`with_limit`](RateLimiter::with_limit),
    /// [`set_limit`](RateLimiter::set_limit) or [`try_set_limit`](RateLimiter::try_set_limit)).
    pub fn configured_limit(&self) -> Option<RateLimit> {
        let keys = self.object.keys().ok()?;
        self.object.inner().configured_rate(&keys.key)
    }

    fn remember(&self, limit: RateLimit) {
        if let Ok(keys) = self.object.keys() {
            self.object.inner().remember_rate(&keys.key, limit);
        }
    }

    /// Stores `limit` in place of any stored one, and configures it in this client. Permits
    /// already admitted or reserved keep their moments; the new limit applies from the next
    /// request on.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use lockkit::RateLimit;
    ///
    /// let partner = client.rate_limiter("partner-api");
    /// // The partner raised the account's limit: from the next request on.
    /// partner.set_limit(RateLimit::per_second(200)?).await?;
    /// assert_eq!(partner.limit().await?, Some(RateLimit::per_second(200)?));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the key holds something else.
    pub async fn set_limit(&self, limit: RateLimit) -> Result<(), Error> {
        self.store(limit, false, "set_limit").await.map(|_| ())
    }

    /// Stores `limit` only if no limit is stored; returns whether it did. Configures `limit` in
    /// this client either way (it is what this pod means the limit to be, should Redis lose it).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use lockkit::RateLimit;
    ///
    /// // Every pod may call this at start-up: only the first one stores the limit.
    /// let sms = client.rate_limiter("sms-gateway");
    /// if !sms.try_set_limit(RateLimit::per_minute(10)?).await? {
    ///     println!("kept the stored limit: {:?}", sms.limit().await?);
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`set_limit`](RateLimiter::set_limit).
    pub async fn try_set_limit(&self, limit: RateLimit) -> Result<bool, Error> {
        self.store(limit, true, "try_set_limit").await
    }

    async fn store(
        &self,
        limit: RateLimit,
        only_if_absent: bool,
        method: &'static str,
    ) -> Result<bool, Error> {
        let keys = self.object.keys()?;
        self.remember(limit);
        let args = limit.args();
        let inner = self.object.inner();
        let marker = hold_marker(&inner.id, inner.next_sequence());
        let reply = self
            .object
            .inner()
            .exec
            .ints(
                &SET_LIMIT,
                Kind::RateLimiter,
                &[keys.key.as_str()],
                &[
                    &args[0],
                    &args[1],
                    &args[2],
                    &args[3],
                    if only_if_absent { "1" } else { "0" },
                    &marker,
                ],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.during(method))?;
        Ok(decode_set_limit(&reply)?)
    }

    /// The limit stored in Redis (`None`: none is stored).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the keys hold something else.
    pub async fn limit(&self) -> Result<Option<RateLimit>, Error> {
        let status = self.status("limit").await?;
        status.limit.map(stored_limit).transpose()
    }

    /// How many permits one request could take now (at most
    /// [`max_per_request`](RateLimit::max_per_request)). A limit configured in this client but
    /// not stored yet counts as stored (the next request stores it). In the per-client mode,
    /// what this client could take.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use lockkit::RateLimit;
    ///
    /// let partner = client.rate_limiter("partner-api").with_limit(RateLimit::per_second(100)?.with_burst(9)?);
    /// // Up to 10 now after an idle spell (the burst + 1); how many calls sleep on a reservation.
    /// println!("{} available, {} waiting", partner.available().await?, partner.waiting().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::Refused`] when no limit is stored or configured; [`Error::Redis`] when Redis
    /// fails; [`Error::WrongType`] when the keys hold something else.
    pub async fn available(&self) -> Result<u64, Error> {
        let status = self.status("available").await?;
        match (status.limit, self.configured_limit()) {
            (Some(_), _) => Ok(status.available),
            (None, Some(configured)) => Ok(configured.max_per_request()),
            (None, None) => Err(self.no_limit()),
        }
    }

    /// How many reservations are still to come: callers sleeping until their moment.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the keys hold something else.
    pub async fn waiting(&self) -> Result<u64, Error> {
        Ok(self.status("waiting").await?.waiting)
    }

    pub(crate) async fn status(&self, method: &'static str) -> Result<StatusReply, Error> {
        let keys = self.object.keys()?;
        let own = self.own_key()?;
        let reply = self
            .object
            .inner()
            .exec
            .ints(
                &STATUS,
                Kind::RateLimiter,
                &[keys.keys[0].as_str(), keys.keys[1].as_str(), own.as_str()],
                &[],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.during(method))?;
        Ok(StatusReply::decode(&reply)?)
    }

    /// Waits until `permits` are admitted, however long that takes, and returns the admission.
    ///
    /// The wait is decided at once by one script call: the call then sleeps until its moment,
    /// sending nothing, however far ahead the moment is. Callers are admitted in the order their
    /// requests reached Redis. Only when Redis loses its data while a call sleeps more than one
    /// interval ahead does it send more: one check that its reservation is gone, and the request
    /// again.
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped future gives its reservation back, in the background, when no later
    /// request was placed after it; otherwise its permits stay spent (the limiter stays exact,
    /// admitting that many fewer).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for zero permits (before anything is sent), or more than the
    /// stored limit admits at once ([`max_per_request`](RateLimit::max_per_request); the stored
    /// limit decides, this client's configured one only when none is stored); [`Error::Refused`] when no limit is
    /// stored or configured; [`Error::Redis`] when Redis fails (within the
    /// [command timeout](crate::ClientBuilder::command_timeout)); [`Error::Shutdown`] once the
    /// client is shut down (a reservation is given back first); [`Error::WrongType`] when the
    /// keys hold something else.
    pub async fn acquire(&self, permits: u64) -> Result<RateAdmission, Error> {
        match self.admit(permits, None, "acquire").await? {
            Some(admission) => Ok(admission),
            None => Err(Error::Refused {
                kind: Kind::RateLimiter.describe(),
                name: self.object.name.to_string(),
                reason: "acquire was refused without a bound to its wait".into(),
            }),
        }
    }

    /// Takes `permits` if they can be admitted within `wait`, waiting for them; `false` at once
    /// when they cannot (the server knows when they could). `wait = Duration::ZERO` takes only
    /// permits free now.
    ///
    /// Returns within `wait` plus at most one round trip.
    ///
    /// # Cancel safety
    /// As [`acquire`](RateLimiter::acquire).
    ///
    /// # Errors
    /// As [`acquire`](RateLimiter::acquire).
    pub async fn try_acquire(&self, permits: u64, wait: Duration) -> Result<bool, Error> {
        Ok(self
            .admit(permits, Some(wait), "try_acquire")
            .await?
            .is_some())
    }

    /// As [`try_acquire`](RateLimiter::try_acquire), returning the admission (its moment, and a
    /// way to give its permits back) rather than `true`.
    ///
    /// ```no_run
    /// # async fn send_batch(_: &[String]) -> usize { 0 }
    /// # async fn demo(client: lockkit::Client, messages: Vec<String>) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// use lockkit::RateLimit;
    ///
    /// let sms = client.rate_limiter("sms-gateway").with_limit(RateLimit::per_minute(60)?.with_burst(9)?);
    /// if let Some(admission) = sms.try_admission(10, Duration::from_secs(1)).await? {
    ///     if send_batch(&messages).await == 0 {
    ///         // Nothing was sent: the permits go back if no request came since (else `false`,
    ///         // and they stay spent: the limiter stays exact).
    ///         admission.give_back().await?;
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`acquire`](RateLimiter::acquire).
    pub async fn try_admission(
        &self,
        permits: u64,
        wait: Duration,
    ) -> Result<Option<RateAdmission>, Error> {
        self.admit(permits, Some(wait), "try_admission").await
    }

    /// This client's schedule key (per-client mode).
    fn own_key(&self) -> Result<String, Error> {
        let inner = self.object.inner();
        Ok(client_state_key(
            &inner.settings.namespace,
            &self.object.name,
            &inner.id,
        )?)
    }

    fn no_limit(&self) -> Error {
        Error::Refused {
            kind: Kind::RateLimiter.describe(),
            name: self.object.name.to_string(),
            reason: "no limit is set: set one with set_limit or try_set_limit, or configure one \
                     with with_limit"
                .into(),
        }
    }

    async fn admit(
        &self,
        permits: u64,
        wait: Option<Duration>,
        method: &'static str,
    ) -> Result<Option<RateAdmission>, Error> {
        // The stored limit decides the most one request may take (the script refuses more); this
        // client's configured one only stands in when none is stored.
        let configured = self.configured_limit();
        check_permits(permits)?;
        let keys = self.object.keys()?;
        let inner = self.object.inner();
        let started = Instant::now();
        let stopwatch = metrics::Stopwatch::start();
        let until = wait.map(|wait| far_or(started, wait));
        let marker = hold_marker(&inner.id, inner.next_sequence());
        let own: Arc<str> = self.own_key()?.into();
        let queued = Queued::new(
            inner,
            Kind::RateLimiter,
            &self.object.name,
            keys,
            &RATE_LEAVE,
            marker.clone(),
        )
        .with_own_key(Arc::clone(&own));
        let limit_args = configured.map(|limit| limit.args());
        let (rate, interval, burst, mode) = match &limit_args {
            Some([rate, interval, burst, mode]) => (
                rate.as_str(),
                interval.as_str(),
                burst.as_str(),
                mode.as_str(),
            ),
            None => ("", "", "", ""),
        };
        let permits_arg = permits.to_string();
        loop {
            let now = Instant::now();
            let wait_us = match until {
                None => "-1".to_owned(),
                Some(until) => until.saturating_duration_since(now).as_micros().to_string(),
            };
            // A try is bounded by the command timeout, and by the caller's wait plus one round
            // trip.
            let deadline = match (until, wait) {
                (Some(until), Some(wait)) => inner.exec.command_deadline().min(Deadline::at(
                    far_or(until, inner.exec.round_trip()),
                    started,
                    Bound::of_wait(wait, inner.exec.round_trip()),
                )),
                _ => inner.exec.command_deadline(),
            };
            queued.joining();
            let reply = inner
                .exec
                .ints_within(
                    &ACQUIRE,
                    Kind::RateLimiter,
                    &[keys.keys[0].as_str(), keys.keys[1].as_str(), &own],
                    &[
                        &permits_arg,
                        &wait_us,
                        &marker,
                        rate,
                        interval,
                        burst,
                        mode,
                        &keys.channel,
                        inner.exec.publish_flag(),
                    ],
                    Resend::Allowed,
                    deadline,
                )
                .await
                .map_err(|err| err.during(method))?;
            match AcquireReply::decode(&reply)? {
                AcquireReply::Admitted {
                    delay_us,
                    at_us,
                    far,
                } => {
                    if delay_us > 0 {
                        let _waiting = metrics::Waiting::new(Kind::RateLimiter.segment());
                        tracing::trace!(name = %self.object.name, permits, delay_us, far, "reserved");
                        let until = far_or(Instant::now(), Duration::from_micros(delay_us));
                        match self.sleep_until(until, far, keys, &marker).await {
                            Slept::Until => {}
                            Slept::Lost => {
                                // The reservation went with the data: ask again, in the schedule
                                // that starts afresh.
                                tracing::debug!(
                                    name = %self.object.name,
                                    "a reservation was lost with Redis' data; asking again"
                                );
                                queued.granted();
                                continue;
                            }
                            Slept::Shutdown => {
                                queued.leave_now().await;
                                return Err(Error::Shutdown);
                            }
                        }
                    }
                    queued.granted();
                    metrics::acquired(Kind::RateLimiter.segment(), &stopwatch);
                    return Ok(Some(RateAdmission {
                        object: self.object.clone(),
                        marker,
                        own,
                        permits,
                        at: UNIX_EPOCH + Duration::from_micros(at_us),
                    }));
                }
                AcquireReply::Refused { earliest_us } => {
                    queued.granted();
                    metrics::timed_out(Kind::RateLimiter.segment());
                    tracing::trace!(name = %self.object.name, permits, earliest_us, "refused");
                    return Ok(None);
                }
                AcquireReply::NoLimit => {
                    queued.granted();
                    return Err(self.no_limit());
                }
                AcquireReply::TooMany { most } => {
                    queued.granted();
                    return Err(Error::InvalidArgument(format!(
                        "rate limiter `{}`: {permits} permits is more than its limit ever admits \
                         at once ({most}: the burst + 1)",
                        self.object.name
                    )));
                }
            }
        }
    }
}

/// How a reserved caller's sleep ended.
enum Slept {
    /// Its moment came.
    Until,
    /// Its reservation is gone (Redis lost its data): it asks again.
    Lost,
    /// The client was shut down.
    Shutdown,
}

impl RateLimiter {
    /// Sleeps until `until`, the moment of the reservation `marker`. A reservation `far` ahead
    /// (more than one interval) listens meanwhile on the limiter's channel, where the first
    /// request that finds the limit missing announces the loss, and to its client's reconnects
    /// (a restart): woken so, it re-checks that its marker is still among the reservations to
    /// come, and reports [`Slept::Lost`] when it is not. Nothing else is sent while it sleeps.
    async fn sleep_until(
        &self,
        until: Instant,
        far: bool,
        keys: &ObjectKeys,
        marker: &str,
    ) -> Slept {
        let inner = self.object.inner();
        // Listening narrows the loss bound; it is never a reason to fail: a sleeper that cannot
        // subscribe sleeps as a near one does.
        let waiter = if far {
            match inner.hub.register(&keys.channel, None, 1).await {
                Ok(waiter) => Some(waiter),
                Err(err) => {
                    tracing::debug!(
                        name = %self.object.name,
                        "a far reservation sleeps without listening for a data loss: {}",
                        crate::error::Chain(&err)
                    );
                    None
                }
            }
        } else {
            None
        };
        loop {
            let woken = async {
                match &waiter {
                    Some(waiter) => {
                        waiter.woken().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = tokio::time::sleep_until(until) => return Slept::Until,
                () = inner.shutdown.cancelled() => return Slept::Shutdown,
                () = woken => {}
            }
            if let Some(waiter) = &waiter {
                waiter.tried(false);
            }
            if !self.still_reserved(keys, marker).await {
                return Slept::Lost;
            }
        }
    }

    /// Whether the reservation `marker` is still among the reservations to come. An error (Redis
    /// unreachable) counts as still reserved: the caller keeps its moment.
    async fn still_reserved(&self, keys: &ObjectKeys, marker: &str) -> bool {
        let exec = &self.object.inner().exec;
        let waiting = keys.keys[1].as_str();
        let score = exec.redis().custom::<Option<String>, &str>(
            CustomCommand::new_static("ZSCORE", ClusterHash::Custom(key_slot(waiting)), false),
            vec![waiting, marker],
        );
        let score = score.map_err(command_error("acquire", waiting, Kind::RateLimiter));
        match exec.command("acquire", &self.object.name, score).await {
            Ok(score) => score.is_some(),
            Err(err) => {
                tracing::debug!(
                    name = %self.object.name,
                    "could not re-check a reservation; keeping its moment: {}",
                    crate::error::Chain(&err)
                );
                true
            }
        }
    }
}

/// Zero permits is refused before anything is sent.
fn check_permits(permits: u64) -> Result<(), Error> {
    if permits == 0 {
        return Err(Error::InvalidArgument(
            "a rate limiter request must ask for at least 1 permit".into(),
        ));
    }
    Ok(())
}

/// The stored limit as a [`RateLimit`].
pub(crate) fn stored_limit(
    stored: lockkit_protocol::rate_limiter::StoredLimit,
) -> Result<RateLimit, Error> {
    let limit = RateLimit::new(stored.rate, Duration::from_millis(stored.interval_ms))?
        .with_burst(stored.burst)?;
    Ok(limit.with_mode(if stored.per_client {
        RateMode::PerClient
    } else {
        RateMode::Overall
    }))
}

/// Permits a [`RateLimiter`] admitted: when, and a way to give them back unused.
///
/// Dropping it does nothing: the permits were used.
#[derive(Debug)]
pub struct RateAdmission {
    object: Object,
    marker: String,
    own: Arc<str>,
    permits: u64,
    at: SystemTime,
}

impl RateAdmission {
    /// How many permits were admitted.
    pub fn permits(&self) -> u64 {
        self.permits
    }

    /// When they were admitted, on the server's clock.
    pub fn admitted_at(&self) -> SystemTime {
        self.at
    }

    /// Gives the permits back, unused; returns whether they went back. That is sound only for
    /// the last request of the schedule (every later one was placed after it), so a later
    /// request makes this `false`: the limiter stays exact, admitting that many fewer.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the keys hold something else.
    pub async fn give_back(self) -> Result<bool, Error> {
        let keys: &ObjectKeys = self.object.keys()?;
        let exec = &self.object.inner().exec;
        let reply = exec
            .ints(
                &CANCEL,
                Kind::RateLimiter,
                &[keys.keys[0].as_str(), keys.keys[1].as_str(), &self.own],
                &[&self.marker, "", ""],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.during("give_back"))?;
        Ok(decode_cancel(&reply)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<RateLimiter>();
        bounds::<RateLimit>();
    }

    #[test]
    fn limits_are_checked() {
        assert!(RateLimit::new(1, Duration::ZERO).is_err());
        assert!(RateLimit::new(1, Duration::from_micros(1500)).is_err());
        assert!(RateLimit::new(1001, Duration::from_millis(1)).is_err());
        assert!(RateLimit::new(1000, Duration::from_millis(1)).is_ok());
        assert!(RateLimit::new(1, RateLimit::MAX_INTERVAL + Duration::from_secs(1)).is_err());
        assert!(RateLimit::per_second(1)
            .unwrap()
            .with_burst(RateLimit::MAX_BURST + 1)
            .is_err());
        // A burst's span (burst + 1 emission intervals) stays within MAX_INTERVAL.
        let yearly = RateLimit::new(1, RateLimit::MAX_INTERVAL).unwrap();
        assert!(yearly.with_burst(0).is_ok());
        assert!(yearly.with_burst(1).is_err());
        assert!(RateLimit::per_second(1_000_000)
            .unwrap()
            .with_burst(RateLimit::MAX_BURST)
            .is_ok());
        assert!(check_permits(0).is_err());
        assert!(check_permits(2).is_ok());
    }
}
