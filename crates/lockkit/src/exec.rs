//! Script execution, written once for every primitive.
//!
//! Scripts go out as `EVALSHA`; a `NOSCRIPT` answer (the script cache is empty after a restart or
//! failover) is followed by `EVAL` with the source, which also caches it on that server.
//!
//! fred re-sends commands that were in flight when a connection dropped. Each call says whether
//! that is allowed ([`Resend`]): acquire and renew scripts are idempotent per request (hold
//! markers), so they may be re-sent; releases are sent once and retried by the caller, who then
//! knows that an earlier attempt may have run.
//!
//! Every script call is bounded by a [`Deadline`], the one place where "run this, but give up
//! when a documented bound runs out" is written: by default the client's command timeout,
//! counted from the call and covering every resend and reconnect; an acquire passes its own,
//! shorter one (its wait), a release one shared by all its attempts. A call cut off by its
//! deadline is dropped (cancel-safe callers give back what it may have taken) and fails with an
//! ambiguous [`Error::Redis`] whose text names the object, says how long it waited and which
//! bound ran out. The only exception is a give-back in the background
//! ([`ints_until_answered`](Exec::ints_until_answered)), which waits for Redis' answer however
//! late it comes.
//!
//! fred's own per-command timeout is off for script calls: it would race the deadline (they
//! are of the same length) and, when it won, its bare "Request timed out" would reach the user
//! instead of the bound. Plain commands (a `GET`, an `EXISTS`) keep it as a backstop and run
//! under [`Exec::command`], which gives them the same deadline and the same message.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::WithOptions;
use fred::interfaces::ClientLike;
use fred::prelude::{Client as RedisClient, Options};
use fred::types::{ClusterHash, CustomCommand, FromValue, Value};
use futures::future::BoxFuture;
use futures::FutureExt;
use lockkit_protocol::fenced_lock::DEFAULT_COUNTER_TTL;
use lockkit_protocol::keys::{Kind, Namespace};
use lockkit_protocol::script::Script;
use lockkit_protocol::slot::key_slot;
use tokio::time::Instant;

use crate::error::{Error, RedisError};

/// Whether fred may re-send a script after a reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// The script is idempotent per request: re-sending it is harmless.
    Allowed,
    /// Send at most once; a broken connection surfaces as an ambiguous error.
    Never,
}

/// Runs protocol scripts on one fred client.
#[derive(Clone)]
pub(crate) struct Exec {
    redis: RedisClient,
    resending: WithOptions<RedisClient>,
    sending_once: WithOptions<RedisClient>,
    /// Whether release announcements go out by `SPUBLISH` (sharded pub/sub).
    sharded: bool,
    /// Whether the server is a cluster: there, a classic `PUBLISH` reaches the subscribers of
    /// every node, but its reply counts only those of the node that ran it.
    clustered: bool,
    /// The client's command timeout: the default [`Deadline`] of a call.
    command_timeout: Duration,
    /// The fenced locks' token counter TTL in ms, as their minting scripts take it in `ARGV`.
    token_counter_ttl_ms: Arc<str>,
    /// The client's key space: a failed call's keys read back into the name of the object it
    /// was for, which its error names.
    namespace: Namespace,
    /// The command connection's `QUIT` was sent ([`quit_now`](Exec::quit_now)).
    quit_sent: Arc<std::sync::atomic::AtomicBool>,
    /// The server's address and the last connection error: a call cut off while the client
    /// cannot reconnect says why ([`explain`](Exec::explain)).
    link: Arc<Link>,
}

/// Where the client connects, and why it could not the last time it tried.
#[derive(Debug, Default)]
struct Link {
    /// `host:port` as the URL names it.
    addr: String,
    /// The last connection error since the last (re)connect, in the system's words
    /// (`Connection refused`); `None` while connected.
    down: parking_lot::Mutex<Option<String>>,
}

impl Exec {
    /// `sharded`: whether scripts announce releases with `SPUBLISH` rather than `PUBLISH`;
    /// `clustered`: whether the server is a cluster;
    /// `command_timeout`: the longest a call may take unless its caller gives a deadline.
    pub(crate) fn new(
        redis: RedisClient,
        sharded: bool,
        clustered: bool,
        command_timeout: Duration,
    ) -> Self {
        // No fred timeout on script calls: their deadline is their bound (see the module
        // documentation).
        let resending = Options {
            timeout: Some(Duration::ZERO),
            ..Options::default()
        };
        let once = Options {
            max_attempts: Some(1),
            ..resending.clone()
        };
        Self {
            resending: redis.with_options(&resending),
            sending_once: redis.with_options(&once),
            redis,
            sharded,
            clustered,
            command_timeout,
            token_counter_ttl_ms: DEFAULT_COUNTER_TTL.as_millis().to_string().into(),
            namespace: Namespace::default(),
            quit_sent: Arc::default(),
            link: Arc::default(),
        }
    }

    /// The same, for the server at `addr` (`host:port` as the URL names it), watching its
    /// connection (a task that ends with the client): a call cut off while the client cannot
    /// reconnect says why, naming `addr`.
    pub(crate) fn watching(mut self, addr: String) -> Self {
        let link = Arc::new(Link {
            addr,
            down: parking_lot::Mutex::default(),
        });
        self.link = Arc::clone(&link);
        let mut errors = fred::interfaces::EventInterface::error_rx(&self.redis);
        let mut reconnects = fred::interfaces::EventInterface::reconnect_rx(&self.redis);
        tokio::spawn(async move {
            use tokio::sync::broadcast::error::RecvError;
            loop {
                tokio::select! {
                    error = errors.recv() => match error {
                        Ok((err, _server)) => {
                            *link.down.lock() = Some(crate::error::fred_reason(&err));
                        }
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => break,
                    },
                    reconnect = reconnects.recv() => match reconnect {
                        Ok(_) => *link.down.lock() = None,
                        Err(RecvError::Lagged(_)) => {}
                        Err(RecvError::Closed) => break,
                    },
                }
            }
        });
        self
    }

    /// Adds to a call cut off by one of lockkit's bounds while the client had no connection
    /// (it was reconnecting) why it had none, with the server's address: `connection refused by
    /// 127.0.0.1:6379 (reconnecting); no answer from Redis within 1.0s (...)`. Without it, a
    /// server that refuses connections would read like a frozen or slow one. Other errors, and
    /// calls cut off while connected, as they are.
    pub(crate) fn explain(&self, err: Error) -> Error {
        let Error::Redis(redis_err) = err else {
            return err;
        };
        if !redis_err.names_its_bound()
            || redis_err.has_connection_cause()
            || self.redis.state() == fred::types::ClientState::Connected
        {
            return Error::Redis(redis_err);
        }
        let Some(reason) = self.link.down.lock().clone() else {
            return Error::Redis(redis_err);
        };
        let addr = &self.link.addr;
        let cause = if reason.eq_ignore_ascii_case("connection refused") {
            format!("connection refused by {addr} (reconnecting)")
        } else {
            format!("no connection to {addr} (reconnecting; the last attempt: {reason})")
        };
        Error::Redis(redis_err.with_connection_cause(&cause))
    }

    /// Sends the command connection's `QUIT` now, synchronously, without waiting for its answer:
    /// for the moment the last handle of the client is dropped, which may be just before the
    /// program's runtime ends. A `QUIT` left to a task then could find fred's router task gone
    /// with the runtime, and fred would warn ("Fatal error sending QUIT command to router").
    /// Sent through a client whose commands have no timeout, its first poll sets no timer, so it
    /// needs no runtime. At most once.
    pub(crate) fn quit_now(&self) {
        use std::sync::atomic::Ordering;
        if self.quit_sent.swap(true, Ordering::AcqRel) {
            return;
        }
        // One poll sends the command to fred's router; the answer is not awaited.
        let _ = ClientLike::quit(&self.sending_once).now_or_never();
    }

    /// Whether [`quit_now`](Exec::quit_now) sent the `QUIT` already.
    pub(crate) fn quit_sent(&self) -> bool {
        self.quit_sent.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The same, with the client's key space (for the object names in errors).
    pub(crate) fn with_namespace(mut self, namespace: Namespace) -> Self {
        self.namespace = namespace;
        self
    }

    /// The same, with the fenced locks' token counter TTL `ttl` (validated by the caller; see
    /// [`ClientBuilder::token_counter_ttl`](crate::ClientBuilder::token_counter_ttl)).
    pub(crate) fn with_token_counter_ttl(mut self, ttl: Duration) -> Self {
        self.token_counter_ttl_ms = ttl.as_millis().to_string().into();
        self
    }

    /// The last `ARGV` of a script of an object of `kind` that may mint a fencing token (a
    /// fenced lock's or an election's acquire, release, cancel and force-unlock): the token
    /// counter TTL in ms; `None` for the other kinds, which mint nothing.
    pub(crate) fn counter_ttl_arg(&self, kind: Kind) -> Option<&str> {
        matches!(kind, Kind::FencedLock | Kind::Election).then_some(&*self.token_counter_ttl_ms)
    }

    /// What one try is given when a caller's own bound leaves it no time: [`ROUND_TRIP`], or
    /// the command timeout if that is shorter.
    pub(crate) fn round_trip(&self) -> Duration {
        self.command_timeout.min(ROUND_TRIP)
    }

    /// The client's command timeout.
    pub(crate) fn command_timeout(&self) -> Duration {
        self.command_timeout
    }

    /// A deadline one command timeout from now.
    pub(crate) fn command_deadline(&self) -> Deadline {
        Deadline::after(Bound::CommandTimeout(self.command_timeout))
    }

    /// Runs `call`, plain commands sent through [`redis`](Exec::redis) for the object called
    /// `object`, within one command timeout; its error names the object and `operation`, and a
    /// timeout says how long it waited and that the command timeout ran out. fred's own timeout
    /// (of the same length, on each command) may fire first: its error says the same.
    pub(crate) fn command<'a, T: 'a>(
        &self,
        operation: &'static str,
        object: &'a str,
        call: impl Future<Output = Result<T, Error>> + 'a,
    ) -> impl Future<Output = Result<T, Error>> + 'a {
        let deadline = self.command_deadline();
        let exec = self.clone();
        deadline.run(operation, call).map(move |result| {
            result.map_err(|err| match err {
                Error::Redis(err) if err.is_timeout() && !err.names_its_bound() => {
                    exec.explain(deadline.expired(operation).naming(object))
                }
                other => exec.explain(other.naming(object)),
            })
        })
    }

    /// The sharded flag every announcing script takes in `ARGV`: `"1"` for `SPUBLISH`, `"0"` for
    /// `PUBLISH`, `"2"` for `PUBLISH` on a cluster, whose receiver count is that of one node
    /// only (a grant's "nobody heard it" must not be read from it).
    pub(crate) fn publish_flag(&self) -> &'static str {
        match (self.sharded, self.clustered) {
            (true, _) => "1",
            (false, true) => "2",
            (false, false) => "0",
        }
    }

    /// The underlying fred client.
    pub(crate) fn redis(&self) -> &RedisClient {
        &self.redis
    }

    /// Runs `script` and returns its reply, which must be an array of integers (every lockkit
    /// script answers so). `kind` names the object type for [`Error::WrongType`]. Bounded by
    /// the command timeout, resends and reconnects included.
    ///
    /// (Not an `async fn`: a wrapper future would store its inner future twice in a debug build,
    /// and acquire futures nest several such layers.)
    pub(crate) fn ints<'a>(
        &'a self,
        script: &'static Script,
        kind: Kind,
        keys: &'a [&'a str],
        args: &'a [&'a str],
        resend: Resend,
    ) -> impl Future<Output = Result<Vec<i64>, Error>> + 'a {
        self.ints_within(script, kind, keys, args, resend, self.command_deadline())
    }

    /// As [`ints`](Exec::ints), bounded by `deadline` (and never longer than the command
    /// timeout from now).
    ///
    /// Boxed: one allocation per script call, against a round trip, keeps the futures that
    /// nest script calls (an acquire inside a closure helper inside a user's `async fn`) small
    /// and of a shallow type; unboxed, their layout overflowed the compiler's query depth limit
    /// in ordinary user code.
    pub(crate) fn ints_within<'a>(
        &'a self,
        script: &'static Script,
        kind: Kind,
        keys: &'a [&'a str],
        args: &'a [&'a str],
        resend: Resend,
        deadline: Deadline,
    ) -> BoxFuture<'a, Result<Vec<i64>, Error>> {
        Box::pin(self.call_unboxed(script, kind, keys, args, resend, Some(deadline)))
    }

    /// As [`ints`](Exec::ints), sent once (a give-back), with no deadline at all: it waits for
    /// Redis' answer however late that comes (a frozen server that resumes runs what it was
    /// sent, and answers then), and a `NOSCRIPT` answer is followed by `EVAL` however late it
    /// came. It ends early only when the connection breaks or the command cannot be routed.
    /// The caller bounds it when it must (a shutdown).
    pub(crate) fn ints_until_answered<'a>(
        &'a self,
        script: &'static Script,
        kind: Kind,
        keys: &'a [&'a str],
        args: &'a [&'a str],
    ) -> BoxFuture<'a, Result<Vec<i64>, Error>> {
        Box::pin(self.call_unboxed(script, kind, keys, args, Resend::Never, None))
    }

    /// As [`ints`](Exec::ints), for a script whose reply is an array of strings (an election's
    /// leader read: its value is any string).
    pub(crate) fn strings<'a>(
        &'a self,
        script: &'static Script,
        kind: Kind,
        keys: &'a [&'a str],
        args: &'a [&'a str],
        resend: Resend,
    ) -> BoxFuture<'a, Result<Vec<String>, Error>> {
        let deadline = self.command_deadline();
        Box::pin(self.call_unboxed(script, kind, keys, args, resend, Some(deadline)))
    }

    async fn call_unboxed<R: FromValue + Send>(
        &self,
        script: &'static Script,
        kind: Kind,
        keys: &[&str],
        args: &[&str],
        resend: Resend,
        deadline: Option<Deadline>,
    ) -> Result<R, Error> {
        // Routed by the slot of the first key, which every key of one call shares.
        let route = keys.first().map_or(ClusterHash::Random, |key| {
            ClusterHash::Custom(key_slot(key))
        });
        let client = match resend {
            Resend::Allowed => &self.resending,
            Resend::Never => &self.sending_once,
        };
        // A script that could not even be routed was never sent: sending it again is safe for
        // every script, whatever its `Resend` policy.
        let call = || async {
            let evalsha = CustomCommand::new_static("EVALSHA", route.clone(), false);
            let result = match client
                .custom::<R, Value>(evalsha, frame(script.sha1(), keys, args))
                .await
            {
                Err(err) if err.details().starts_with("NOSCRIPT") => {
                    tracing::debug!(
                        script = script.name(),
                        "script not cached on the server; sending its source"
                    );
                    let eval = CustomCommand::new_static("EVAL", route.clone(), false);
                    client
                        .custom::<R, Value>(eval, frame(script.source(), keys, args))
                        .await
                }
                other => other,
            };
            result.map_err(|source| {
                if crate::error::is_wrong_type(&source) {
                    Error::WrongType {
                        key: keys
                            .first()
                            .map_or_else(String::new, |key| (*key).to_owned()),
                        kind: kind.describe(),
                    }
                } else {
                    Error::Redis(RedisError::new(script.name(), source))
                }
            })
        };
        let result = match deadline {
            Some(deadline) => {
                deadline
                    .min(self.command_deadline())
                    .run(script.name(), resend_unsent(call))
                    .await
            }
            None => resend_unsent(call).await,
        };
        result.map_err(|err| match self.object_name(kind, keys) {
            Some(name) => self.explain(err.naming(&name)),
            None => self.explain(err),
        })
    }

    /// The name of the one object of `kind` whose keys a script call took (its main key first),
    /// read back from the main key; `None` for a call over several objects' keys (a renewal
    /// batch) or keys of no object.
    fn object_name(&self, kind: Kind, keys: &[&str]) -> Option<String> {
        // A rate limiter's calls also take the caller's own schedule key.
        let own = usize::from(kind == Kind::RateLimiter);
        if keys.len() > 1 + kind.aux_suffixes().len() + own {
            return None;
        }
        let parsed = self.namespace.parse(keys.first()?)?;
        (parsed.kind == kind && parsed.suffix.is_none()).then_some(parsed.name)
    }
}

/// The most time one try (a script call, with its `NOSCRIPT` reload) is given beyond a caller's
/// own bound, unless the command timeout is shorter: an acquire's try in flight at its deadline
/// (or any try of a `wait` of zero), the release of a guard already known lost. A round trip to
/// a healthy Redis takes well under a millisecond on a LAN and a few hundred across regions; a
/// Redis that has not answered by then is treated as unreachable.
pub(crate) const ROUND_TRIP: Duration = Duration::from_secs(1);

/// A documented bound on how long an operation may take, for the error that says it ran out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Bound {
    /// The client's command timeout
    /// ([`ClientBuilder::command_timeout`](crate::ClientBuilder::command_timeout)).
    CommandTimeout(Duration),
    /// An acquire's `wait`.
    Wait(Duration),
    /// The one round trip given to a try that does not wait (a `wait` of zero, a multi-lock's
    /// member taken without waiting): [`ROUND_TRIP`], or the command timeout if shorter.
    RoundTrip(Duration),
}

impl Bound {
    /// The bound of an acquire that waits `wait`, its tries given `round_trip` at the deadline.
    pub(crate) fn of_wait(wait: Duration, round_trip: Duration) -> Self {
        if wait.is_zero() {
            Bound::RoundTrip(round_trip)
        } else {
            Bound::Wait(wait)
        }
    }
}

impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::CommandTimeout(timeout) => write!(f, "the command timeout is {timeout:?}"),
            Bound::Wait(wait) => write!(
                f,
                "the wait was {wait:?}, plus at most one round trip for a try in flight"
            ),
            Bound::RoundTrip(round_trip) => write!(
                f,
                "a try that does not wait is given one round trip, {round_trip:?}"
            ),
        }
    }
}

/// When an operation must have ended: the instant, when it started (for the time spent), and
/// the bound it enforces (for the message).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Instant,
    started: Instant,
    bound: Bound,
}

impl Deadline {
    /// A deadline `bound` from now.
    pub(crate) fn after(bound: Bound) -> Self {
        let started = Instant::now();
        let length = match bound {
            Bound::CommandTimeout(length) | Bound::Wait(length) | Bound::RoundTrip(length) => {
                length
            }
        };
        Self::at(far_or(started, length), started, bound)
    }

    /// A deadline at `at`, for an operation that started at `started`.
    pub(crate) fn at(at: Instant, started: Instant, bound: Bound) -> Self {
        Self { at, started, bound }
    }

    /// The earlier of two deadlines (the other one's start and bound if it is earlier).
    pub(crate) fn min(self, other: Deadline) -> Deadline {
        if other.at < self.at {
            other
        } else {
            self
        }
    }

    /// Runs `op`, `operation` in the error if the deadline passes first (and `op` is dropped).
    pub(crate) fn run<T>(
        self,
        operation: &'static str,
        op: impl Future<Output = Result<T, Error>>,
    ) -> impl Future<Output = Result<T, Error>> {
        tokio::time::timeout_at(self.at, op).map(move |result| match result {
            Ok(result) => result,
            Err(_elapsed) => Err(self.expired(operation)),
        })
    }

    /// The error of an operation cut off by this deadline.
    pub(crate) fn expired(&self, operation: &'static str) -> Error {
        let spent = self.started.elapsed();
        tracing::debug!(
            operation,
            ?spent,
            "no answer from Redis in time; {}",
            self.bound
        );
        Error::Redis(RedisError::timed_out(
            operation,
            format!(
                "no answer from Redis within {:.1}s ({})",
                spent.as_secs_f64(),
                self.bound
            ),
        ))
    }
}

/// `start + length`, or a far-off instant when that is too late to represent.
pub(crate) fn far_or(start: Instant, length: Duration) -> Instant {
    start
        .checked_add(length)
        .unwrap_or_else(|| start + Duration::from_secs(100 * 365 * 24 * 60 * 60))
}

/// `EVALSHA`/`EVAL` arguments: the script (or its SHA1), the key count, the keys, the arguments.
fn frame(script: &str, keys: &[&str], args: &[&str]) -> Vec<Value> {
    let mut frame = Vec::with_capacity(2 + keys.len() + args.len());
    frame.push(Value::from(script));
    frame.push(Value::from(keys.len() as i64));
    frame.extend(keys.iter().map(|key| Value::from(*key)));
    frame.extend(args.iter().map(|arg| Value::from(*arg)));
    frame
}

/// Runs `op` again (after a short, doubling pause: 50 ms … 3.2 s, about 6 s in all) for as long
/// as it fails because the command could not even be routed, i.e. was certainly never sent
/// (no connection at that instant, during a reconnect). Only for operations that are idempotent
/// or were never sent; any other outcome is returned as it is.
pub(crate) async fn resend_unsent<T, F, Fut>(mut op: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut pause = UNSENT_FIRST_PAUSE;
    let mut tries = 0;
    loop {
        match op().await {
            Err(Error::Redis(err)) if err.was_not_sent() && tries < UNSENT_RETRIES => {
                tracing::debug!("{}; sending again in {pause:?}", crate::error::Chain(&err));
                tokio::time::sleep(pause).await;
                pause *= 2;
                tries += 1;
            }
            other => return other,
        }
    }
}

/// How often a command that could not be routed is tried again, and the first pause.
const UNSENT_RETRIES: u32 = 7;
const UNSENT_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
