//! The one error type of lockkit.
//!
//! Every error's top line carries what a user can act on: `{err}` alone is a complete sentence
//! with the cause in the server's or the system's words (`cannot connect to 127.0.0.1:6379:
//! connected, but the Redis handshake failed: ERR DB index is out of range`, `redis error during try_acquire of
//! `gpus`: no answer from Redis within 1.0s ...`): the object (or the server's address), the
//! method the user called, and for a timeout the bound that ran out. And it keeps to the Rust API guidelines' rule
//! for chains (C-GOOD-ERR): what is in the text is not returned again by
//! [`source`](std::error::Error::source), so reporters that walk the chain (`anyhow`, `eyre`, the
//! `lockkit` command) show each cause once.

use std::fmt;
use std::time::Duration;

use lockkit_protocol::{keys::KeyError, DecodeError};

/// Everything that can go wrong in lockkit.
///
/// Bad input is reported as [`Error::InvalidArgument`] before anything is sent to Redis; a lock
/// that is no longer yours is [`Error::NotHeld`]; a server that cannot be reached when the client
/// is built is [`Error::Connect`]; Redis trouble afterwards is [`Error::Redis`], which says what
/// lockkit was doing at the time.
///
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a catch-all arm.
///
/// ```no_run
/// use lockkit::Error;
///
/// # async fn demo(client: lockkit::Client) -> Result<(), Error> {
/// let guard = client.lock("order:42").lock().await?;
/// // ... the critical section ...
/// match guard.unlock().await {
///     Ok(()) => {}
///     // The lease ran out (or the lock was force-unlocked) before the release: another holder
///     // may have run at the same time. Reconcile instead of assuming exclusivity.
///     Err(Error::NotHeld { name, .. }) => eprintln!("`{name}` was lost before its release"),
///     // The connection broke or the command timed out: the release may or may not have run.
///     // Either way the hold is no longer renewed; the release goes on in the background until
///     // Redis answers (if it never does, the hold frees when its lease runs out).
///     Err(Error::Redis(err)) if err.is_ambiguous() => eprintln!("release of unknown outcome: {err}"),
///     Err(err) => return Err(err),
/// }
/// # Ok(()) }
/// ```
///
/// The first error a new setup usually meets, with no Redis running, reads:
///
/// ```
/// # async fn demo() {
/// # let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
/// # let url = format!("redis://127.0.0.1:{port}");
/// match lockkit::Client::connect(&url).await {
///     Err(err @ lockkit::Error::Connect { .. }) => {
///         // "cannot connect to 127.0.0.1:6379: connection refused (is Redis running at that
///         // address? it is the one in the URL this program gave lockkit)"
///         # assert_eq!(err.to_string(), format!("cannot connect to 127.0.0.1:{port}: connection refused (is Redis running at that address? it is the one in the URL this program gave lockkit)"));
///         eprintln!("error: {err}");
///     }
///     other => panic!("expected a connect error, got {other:?}"),
/// }
/// # }
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(demo());
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The hold being released or extended is no longer in Redis: its lease ran out, the lock was
    /// force-unlocked, it was released already (a permit released by id twice), or Redis lost it
    /// (a restart without persistence, a failover). Returned for a guard's hold and for a
    /// permit named by its id alike.
    #[error("the hold of `{name}` is gone: its lease ran out, it was released or force-unlocked, or Redis lost it")]
    NotHeld {
        /// The object's name.
        name: String,
    },
    /// The lock was not acquired within the time allowed: someone else held it all along. Returned
    /// by code that turns "not acquired in time" into an error, such as the `#[locked]` attribute
    /// with a `wait` (the `try_*` methods return `Ok(None)` instead).
    #[error("`{name}` was not acquired within {waited:?}: another owner held it")]
    NotAcquired {
        /// The object's name.
        name: String,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The acquisition reached the primary, but fewer replicas than the client's replica
    /// acknowledgement policy requires
    /// ([`ClientBuilder::replica_ack`](crate::ClientBuilder::replica_ack)) acknowledged it within
    /// the policy's timeout. The hold was given back: nothing is held.
    #[error("`{name}` was acquired on the primary but only {acknowledged} replica(s) acknowledged it in time ({required} required by the replica acknowledgement policy); it was released")]
    NotReplicated {
        /// The object's name.
        name: String,
        /// How many replicas acknowledged the acquisition.
        acknowledged: u32,
        /// How many the policy required.
        required: u32,
    },
    /// An argument was rejected before anything was sent to Redis.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The key that lockkit uses for an object holds a Redis value of another type, written by
    /// something else.
    #[error("the key `{key}` holds a value of another type than a lockkit {kind} uses (written by someone else?)")]
    WrongType {
        /// The Redis key.
        key: String,
        /// The kind of lockkit object that was expected there.
        kind: &'static str,
    },
    /// The object's current state does not allow the operation: asking a semaphore for more
    /// permits than it has, counting a latch down past zero, upgrading a read hold to a write
    /// hold.
    #[error("{kind} `{name}`: {reason}")]
    Refused {
        /// The kind of object.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// Why the operation was refused.
        reason: String,
    },
    /// Building a client ([`Client::connect`](crate::Client::connect),
    /// [`ClientBuilder::build`](crate::ClientBuilder::build)) could not connect to Redis.
    ///
    /// Shown as `cannot connect to <host:port>: <reason>[: <cause>] [(<hint>)]`, the address
    /// being the one in the URL the program gave lockkit, for instance
    /// `cannot connect to 127.0.0.1:6379: connection refused (is Redis running at that address?
    /// it is the one in the URL this program gave lockkit)` or
    /// `cannot connect to 127.0.0.1:6379: connected, but the Redis handshake failed: ERR DB
    /// index is out of range`. Nothing was sent, so nothing is held.
    ///
    /// The cause's text (Redis' reply, the resolver's answer) is part of the message, so the
    /// top line alone says what to fix; for that reason it is not also returned by
    /// [`source`](std::error::Error::source), and reporters that print the chain show it once.
    /// The cause itself is the `cause` field.
    #[error("{}", connect_message(addr, reason, cause.as_deref()))]
    #[non_exhaustive]
    Connect {
        /// The server's `host:port` as the URL names it (a cluster's or Sentinel group's
        /// addresses, separated by `, `).
        addr: String,
        /// Why, as far as lockkit can tell.
        reason: ConnectFailure,
        /// The underlying error where it says more than `reason` does: Redis' reply to refused
        /// credentials or to the handshake, the TLS library's reason for refusing a certificate,
        /// the name resolver's answer. `None` when `reason` is the whole story (refused,
        /// unreachable, timed out). Its text is in the message.
        cause: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    },
    /// Redis could not be reached, did not answer in time, or refused a command, once the client
    /// was connected. [`RedisError::is_ambiguous`] says whether the command may have run.
    #[error(transparent)]
    Redis(#[from] RedisError),
    /// The client was shut down with [`Client::shutdown`](crate::Client::shutdown).
    #[error("the lockkit client has been shut down")]
    Shutdown,
    /// [`Client::shutdown`](crate::Client::shutdown) could not give back some holds within the
    /// command timeout (Redis did not answer, or failed). None of them is renewed any more: each
    /// frees when its lease runs out (a watchdog-mode hold within the watchdog timeout). The
    /// client is shut down all the same.
    ///
    /// Holds the client had are in `names`; what an acquire cut short (no answer in time, an
    /// ambiguous error) *may* have taken, and could not be given back either, is in
    /// `maybe_taken`, and the message says "may" for those:
    /// ``shutdown could not release 1 hold(s), freed when their leases run out: `a`; nor give
    /// back what 1 acquire(s) cut short may have taken: `b` (freed the same way if taken)``.
    #[error("{}", not_released_message(names, maybe_taken))]
    NotReleased {
        /// The names of the objects whose holds were not given back, one per hold.
        names: Vec<String>,
        /// The names of the objects that an acquire cut short may have taken (its outcome is
        /// unknown) and whose give-back failed too, one per such acquire.
        maybe_taken: Vec<String>,
        /// Why the first of them was not.
        #[source]
        source: Box<Error>,
    },
    /// A script answered with a reply of the wrong shape: a bug, or another program using the same
    /// keys.
    #[error(transparent)]
    Protocol(#[from] DecodeError),
}

impl Error {
    /// Names the object of a [`Error::Redis`] that does not name one yet; other errors as they
    /// are.
    pub(crate) fn naming(self, name: &str) -> Self {
        match self {
            Error::Redis(mut err) if err.object.is_none() => {
                err.object = Some(name.to_owned());
                Error::Redis(err)
            }
            other => other,
        }
    }

    /// Says that a [`Error::Redis`] happened during `operation`, the method the user called
    /// (`campaign`, `count_down`), rather than the script or command lockkit was running for
    /// it; other errors as they are.
    pub(crate) fn during(self, operation: &'static str) -> Self {
        match self {
            Error::Redis(mut err) => {
                err.operation = operation;
                Error::Redis(err)
            }
            other => other,
        }
    }
}

/// The message of [`Error::NotReleased`]: the holds for sure, then, with "may", what cut-off
/// acquires may have taken.
fn not_released_message(names: &[String], maybe_taken: &[String]) -> String {
    let list = |names: &[String]| {
        names
            .iter()
            .map(|name| format!("`{name}`"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match (names.is_empty(), maybe_taken.is_empty()) {
        (_, true) => format!(
            "shutdown could not release {} hold(s), freed when their leases run out: {}",
            names.len(),
            list(names)
        ),
        (true, false) => format!(
            "shutdown could not give back what {} acquire(s) cut short may have taken, freed \
             when their leases run out if taken: {}",
            maybe_taken.len(),
            list(maybe_taken)
        ),
        (false, false) => format!(
            "shutdown could not release {} hold(s), freed when their leases run out: {}; nor \
             give back what {} acquire(s) cut short may have taken: {} (freed the same way if \
             taken)",
            names.len(),
            list(names),
            maybe_taken.len(),
            list(maybe_taken)
        ),
    }
}

/// Names the public method a call's [`Error::Redis`] happened in ([`Error::during`]), on a
/// whole result: every public method of every primitive ends with it, so that an error names
/// the operation in the user's terms (`try_lock`, `available_permits`, `unlock`) and not the
/// script or command lockkit ran for it (`lock_acquire`, `semaphore_available`, `EXISTS`).
pub(crate) trait During {
    /// See [`Error::during`].
    fn during(self, operation: &'static str) -> Self;
}

impl<T> During for Result<T, Error> {
    fn during(self, operation: &'static str) -> Self {
        self.map_err(|err| err.during(operation))
    }
}

impl From<KeyError> for Error {
    fn from(err: KeyError) -> Self {
        Error::InvalidArgument(err.to_string())
    }
}

/// Why a client could not connect, the `reason` of [`Error::Connect`].
///
/// Its `Display` is the part of the message after the address, with a hint where one fits. The
/// hints speak of the URL the program gave lockkit: lockkit itself reads no environment
/// variable, so where the URL comes from (a setting, `REDIS_URL`, a flag) is the program's to
/// say.
///
/// ```
/// use lockkit::ConnectFailure;
///
/// assert_eq!(
///     ConnectFailure::Refused.to_string(),
///     "connection refused (is Redis running at that address? it is the one in the URL this \
///      program gave lockkit)"
/// );
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConnectFailure {
    /// Nothing listens at the address (the TCP connection was refused): Redis is not running
    /// there, or the URL names the wrong host or port.
    Refused,
    /// The host or its network cannot be reached (no route).
    Unreachable,
    /// The host name does not resolve.
    UnknownHost,
    /// Neither connected nor refused within the connect timeout
    /// ([`ClientBuilder::connect_timeout`](crate::ClientBuilder::connect_timeout)): a firewall
    /// that drops packets, a paused server, a wrong address that nobody answers, a server that
    /// accepts the connection but never answers the handshake. Holds the time actually spent
    /// connecting (the connect timeout, give or take the scheduler), shown to a tenth of a
    /// second: `no answer within 1.0s (the connect timeout; is Redis running at that address?
    /// ...)`.
    TimedOut(Duration),
    /// Redis refused the credentials (`WRONGPASS`, or `NOAUTH`: a password is needed), or the
    /// URL carries a password for a server that has none (Redis answers
    /// `AUTH ... called without any password configured`).
    Auth,
    /// The TLS handshake failed: the server's certificate is not trusted or does not name the
    /// host, the server asks for a client certificate that was not given, or the server does not
    /// speak TLS.
    Tls,
    /// The server accepted the connection but the Redis handshake failed: it closed the
    /// connection (a TLS-only server reached by `redis://`, something else listening on the
    /// port that closes it; one that answers in another protocol is [`NotRedis`](Self::NotRedis)), or answered with an error (a database number the server does not have, a cluster
    /// URL for a server without cluster mode, a Sentinel group that does not know the service).
    Handshake,
    /// The server answered in something other than the Redis protocol: another program (an HTTP
    /// server, a database of another kind) listens at the address. fred's decoding error
    /// ("Decode Error: frame_type: Invalid frame type") would say only that a byte was
    /// unexpected, so it is not carried.
    NotRedis,
    /// The server runs no Lua scripts: it refused `EVAL` (scripting disabled or renamed away, as
    /// some managed services do, or Valkey without its Lua module). Every lockkit primitive is a
    /// Lua script, so no client is built. The message carries the server's reply.
    NoScripting,
    /// The [replica acknowledgement policy](crate::ClientBuilder::replica_ack) was asked for,
    /// but the server refuses `WAIT` (ElastiCache Serverless, some proxies). The message carries
    /// the server's reply.
    NoWait,
    /// Anything else; the error's message says more.
    Other,
}

/// The hint of a server that does not answer.
const RUNNING: &str = "is Redis running at that address? it is the one in the URL this program \
                       gave lockkit";

impl ConnectFailure {
    /// What failed, and the hint shown after the cause (if any).
    fn parts(&self) -> (String, Option<&'static str>) {
        match self {
            ConnectFailure::Refused => ("connection refused".into(), Some(RUNNING)),
            ConnectFailure::Unreachable => ("host unreachable".into(), Some(RUNNING)),
            ConnectFailure::UnknownHost => (
                "unknown host".into(),
                Some("check the host name in the URL this program gave lockkit"),
            ),
            ConnectFailure::TimedOut(after) => (
                format!("no answer within {:.1}s", after.as_secs_f64()),
                Some(TIMED_OUT),
            ),
            ConnectFailure::Auth => (
                "authentication failed".into(),
                Some("check the user name and password in the URL"),
            ),
            ConnectFailure::Tls => (
                "the TLS handshake failed".into(),
                Some(
                    "is the server's CA trusted? see ClientBuilder::tls_root_certificates_pem; \
                     is the certificate valid for this host? does the server want a client \
                     certificate?",
                ),
            ),
            ConnectFailure::Handshake => ("connected, but the Redis handshake failed".into(), None),
            ConnectFailure::NotRedis => (
                "the server does not speak the Redis protocol".into(),
                Some(
                    "is it Redis? something else listens at the address in the URL this program \
                     gave lockkit",
                ),
            ),
            ConnectFailure::NoScripting => (
                "the server runs no Lua scripts (it refuses `EVAL`)".into(),
                Some("every lockkit primitive is a Lua script"),
            ),
            ConnectFailure::NoWait => (
                "the replica acknowledgement policy needs `WAIT`, which the server refuses".into(),
                Some("build the client without replica_ack"),
            ),
            ConnectFailure::Other => ("the connection failed".into(), None),
        }
    }
}

/// The hint of a connect that timed out.
const TIMED_OUT: &str = "the connect timeout; is Redis running at that address? it is the one \
                         in the URL this program gave lockkit";

impl fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (what, hint) = self.parts();
        f.write_str(&what)?;
        if let Some(hint) = hint {
            write!(f, " ({hint})")?;
        }
        Ok(())
    }
}

/// The message of [`Error::Connect`]: what failed, the cause's own words, then the hint.
fn connect_message(
    addr: &str,
    reason: &ConnectFailure,
    cause: Option<&(dyn std::error::Error + Send + Sync + 'static)>,
) -> String {
    let (what, hint) = reason.parts();
    let mut message = format!("cannot connect to {addr}: {what}");
    if let Some(cause) = cause {
        let text = match cause.downcast_ref::<fred::error::Error>() {
            Some(fred) => fred_reason(fred),
            None => Chain(cause).to_string(),
        };
        if !text.is_empty() {
            message.push_str(": ");
            message.push_str(&text);
        }
    }
    if let Some(hint) = hint {
        message.push_str(&format!(" ({hint})"));
    }
    message
}

/// What a fred error says, in the server's or the operating system's words: Redis' reply as it
/// came (`ERR DB index is out of range`), an I/O error's message (`Connection refused`), a
/// timeout's detail; the kind's name where fred gave no words.
pub(crate) fn fred_reason(err: &fred::error::Error) -> String {
    let details = err.details().trim().trim_end_matches('.');
    // fred keeps an I/O error as the `Debug` text of `std::io::Error`:
    // `Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }`.
    // `Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }` (a TLS refusal).
    let io_message = details
        .split_once("message: \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(message, _)| message)
        .or_else(|| {
            details
                .strip_prefix("Custom {")
                .and_then(|rest| rest.split_once("error: "))
                .map(|(_, error)| error.trim_end_matches('}').trim())
        });
    match io_message {
        Some(message) => message.to_owned(),
        None if details.is_empty() => format!("{:?}", err.kind()),
        None => details.to_owned(),
    }
}

/// A Redis failure after the client connected, with what lockkit was doing when it happened.
///
/// Shown as ``redis error during <operation>[ of `<object>`]: <reason>``, the reason in Redis' or
/// the system's own words (`ERR DB index is out of range`, `Connection refused`, `no answer
/// from Redis within 1.0s (the wait was 1s)`), so the line alone says what went wrong. The
/// reason being in the message, [`source`](std::error::Error::source) is `None`: reporters that
/// print the chain show it once.
#[derive(Debug)]
pub struct RedisError {
    operation: &'static str,
    /// The object the operation was for, where known.
    object: Option<String>,
    source: fred::error::Error,
    /// A timeout of one of lockkit's bounds, whose text names the bound (fred's own timeout
    /// says only "Request timed out").
    names_its_bound: bool,
    /// Whether the text says why the client had no connection (see `Exec::explain`).
    connection_cause: bool,
}

impl RedisError {
    pub(crate) fn new(operation: &'static str, source: fred::error::Error) -> Self {
        Self {
            operation,
            object: None,
            source,
            names_its_bound: false,
            connection_cause: false,
        }
    }

    /// The same timeout, its text led by `cause`, why the client had no connection then.
    pub(crate) fn with_connection_cause(self, cause: &str) -> Self {
        let detail = format!("{cause}; {}", self.source.details());
        Self {
            source: fred::error::Error::new(self.source.kind().clone(), detail),
            connection_cause: true,
            ..self
        }
    }

    /// Whether [`with_connection_cause`](RedisError::with_connection_cause) was applied.
    pub(crate) fn has_connection_cause(&self) -> bool {
        self.connection_cause
    }

    /// An operation that Redis did not answer in time: cut off by one of lockkit's bounds (an
    /// acquire's wait, the command timeout). `detail` says how long and which bound. Ambiguous:
    /// the command may have run.
    pub(crate) fn timed_out(operation: &'static str, detail: String) -> Self {
        Self {
            names_its_bound: true,
            ..Self::new(
                operation,
                fred::error::Error::new(fred::error::ErrorKind::Timeout, detail),
            )
        }
    }

    /// Whether this is a timeout of one of lockkit's bounds, whose text says which bound ran
    /// out and how long it waited (not fred's own, bare one).
    pub(crate) fn names_its_bound(&self) -> bool {
        self.names_its_bound
    }

    /// What was being done: the public method the user called (`lock`, `try_lock`,
    /// `is_locked`, `unlock`, `acquire`, `available_permits`, `count_down`, `campaign`,
    /// `once_per`, `inspect`, ...), never the script or Redis command lockkit ran for it. An
    /// election observer's reads, which no call waits for, name `observe`.
    pub fn operation(&self) -> &'static str {
        self.operation
    }

    /// The name of the object the operation was for (a lock's, a semaphore's, ...): every call
    /// on one object names it (a multi-lock's, the member's; [`Client::inspect`](crate::Client::inspect)
    /// and [`Client::list`](crate::Client::list) name none).
    pub fn object(&self) -> Option<&str> {
        self.object.as_deref()
    }

    /// Whether Redis did not answer in time: the command timeout or an acquire's wait ran out
    /// (the connection hangs, or the client could not reconnect in time). Such a failure is
    /// also [ambiguous](RedisError::is_ambiguous).
    pub fn is_timeout(&self) -> bool {
        self.source.kind() == &fred::error::ErrorKind::Timeout
    }

    /// Whether the command was certainly not sent by its last attempt: fred had no connection to
    /// route it to (a reconnect was under way). A command sent at most once (releases) was then
    /// never sent, and sending it again cannot run it twice; a command fred may re-send
    /// (acquires, renewals, subscriptions) may have been written by an earlier attempt, which is
    /// harmless because those are idempotent per request.
    ///
    /// fred 10 has no error kind for this: it reports the failure as `ErrorKind::Unknown` (as it
    /// does Redis' own error replies and "Too many failed write attempts", which may follow a
    /// send), or as `ErrorKind::Routing` with its `replicas` feature (as it does "Max attempts
    /// reached"). Only the message tells it apart, so it is matched here and pinned by the test
    /// `error::tests::an_unroutable_command_is_reported_as_not_sent` against a real
    /// `redis-server`: if fred rewords the message, that test fails instead of this method
    /// silently answering `false` (which would turn a safe resend into an error for the caller).
    pub(crate) fn was_not_sent(&self) -> bool {
        use fred::error::ErrorKind;
        matches!(self.source.kind(), ErrorKind::Unknown | ErrorKind::Routing)
            && self.source.details().starts_with(UNROUTABLE)
    }

    /// Whether the failure leaves the outcome unknown: the connection broke, the command timed
    /// out, or a command sent at most once would have had to be sent again (a cluster node
    /// redirected it with `MOVED`, or the connection was re-established), so the command may or
    /// may not have run.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// let exports = client.semaphore("exports");
    /// // `try_set_permits` sets the total only if none is set, so asking again after an
    /// // ambiguous failure cannot set it twice (it answers `false` if the first try did set it).
    /// let set_here = loop {
    ///     match exports.try_set_permits(3).await {
    ///         Ok(set) => break set,
    ///         Err(lockkit::Error::Redis(err)) if err.is_ambiguous() => continue,
    ///         Err(err) => return Err(err),
    ///     }
    /// };
    /// # let _ = set_here;
    /// # Ok(()) }
    /// ```
    pub fn is_ambiguous(&self) -> bool {
        use fred::error::ErrorKind;
        matches!(
            self.source.kind(),
            ErrorKind::IO | ErrorKind::Timeout | ErrorKind::Canceled
        ) || (*self.source.kind() == ErrorKind::Unknown
            && self.source.details().starts_with(RESEND_REFUSED))
    }
}

/// The start of fred's message for a command that was written once and that it may not write
/// again (`max_attempts` used up): after a `MOVED` redirect (the command did not run) or a
/// reconnect (it may have run). Either way the outcome is unknown to the caller.
const RESEND_REFUSED: &str = "Too many failed write attempts";

/// The start of fred's message for a command it had no connection to route to
/// (`fred::router::commands::write_command`).
const UNROUTABLE: &str = "Failed to route command";

impl fmt::Display for RedisError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis error during {}", self.operation)?;
        if let Some(object) = &self.object {
            write!(f, " of `{object}`")?;
        }
        // The reason is here, not in `source()`: the top line carries what to act on, and
        // reporters that print the chain show it once.
        write!(f, ": {}", fred_reason(&self.source))
    }
}

impl std::error::Error for RedisError {}

/// An error followed by its sources, joined by `: `, for log lines (where no reporter walks the
/// chain).
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// Wraps a fred error with the operation it interrupted.
pub(crate) fn redis(operation: &'static str) -> impl FnOnce(fred::error::Error) -> Error {
    move |source| Error::Redis(RedisError::new(operation, source))
}

/// Whether Redis refused a command because a key holds another type: `WRONGTYPE …` from a plain
/// command, or from a script on Redis 7 and Valkey; Redis 6.2 wraps a script's error as
/// `ERR Error running script (call to f_…): @user_script:69: WRONGTYPE …`.
pub(crate) fn is_wrong_type(source: &fred::error::Error) -> bool {
    let details = source.details();
    details.starts_with("WRONGTYPE")
        || (details.starts_with("ERR Error running script") && details.contains(": WRONGTYPE "))
}

/// Maps the error of a plain command on `key`: `WRONGTYPE` becomes [`Error::WrongType`], anything
/// else [`Error::Redis`] naming `operation`.
pub(crate) fn command_error<'a>(
    operation: &'static str,
    key: &'a str,
    kind: lockkit_protocol::keys::Kind,
) -> impl FnOnce(fred::error::Error) -> Error + 'a {
    move |source| {
        if is_wrong_type(&source) {
            Error::WrongType {
                key: key.to_owned(),
                kind: kind.describe(),
            }
        } else {
            Error::Redis(RedisError::new(operation, source))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::time::Duration;

    use fred::error::{Error as FredError, ErrorKind};
    use lockkit_protocol::DecodeError;

    use super::{ConnectFailure, Error, RedisError};

    /// One value of every `ConnectFailure`; the match fails to compile when one is added.
    fn every_connect_failure() -> Vec<ConnectFailure> {
        let all = [
            ConnectFailure::Refused,
            ConnectFailure::Unreachable,
            ConnectFailure::UnknownHost,
            ConnectFailure::TimedOut(Duration::from_secs(5)),
            ConnectFailure::Auth,
            ConnectFailure::Tls,
            ConnectFailure::Handshake,
            ConnectFailure::NotRedis,
            ConnectFailure::NoScripting,
            ConnectFailure::NoWait,
            ConnectFailure::Other,
        ];
        for reason in all {
            match reason {
                ConnectFailure::Refused
                | ConnectFailure::Unreachable
                | ConnectFailure::UnknownHost
                | ConnectFailure::TimedOut(_)
                | ConnectFailure::Auth
                | ConnectFailure::Tls
                | ConnectFailure::Handshake
                | ConnectFailure::NotRedis
                | ConnectFailure::NoScripting
                | ConnectFailure::NoWait
                | ConnectFailure::Other => {}
            }
        }
        all.to_vec()
    }

    /// Every variant of `Error` that can be built, each with the kinds of sources it carries in
    /// practice (the texts are fred's and Redis' own).
    fn every_error() -> Vec<Error> {
        let redis = |operation, kind, details: &str| {
            Error::Redis(RedisError::new(
                operation,
                FredError::new(kind, details.to_owned()),
            ))
        };
        let mut errors = vec![
            Error::NotHeld {
                name: "order:42".into(),
            },
            Error::NotAcquired {
                name: "order:42".into(),
                waited: Duration::from_secs(5),
            },
            Error::NotReplicated {
                name: "order:42".into(),
                acknowledged: 0,
                required: 1,
            },
            Error::InvalidArgument("the name is empty".into()),
            Error::WrongType {
                key: "lockkit:lock:{order:42}".into(),
                kind: "lock",
            },
            Error::Refused {
                kind: "semaphore",
                name: "gpus".into(),
                reason: "3 permits asked, 2 in all".into(),
            },
            redis(
                "lock_acquire",
                ErrorKind::Unknown,
                "NOPERM this user has no permissions to access one of the keys used as arguments",
            ),
            redis(
                "lock_release",
                ErrorKind::IO,
                "Os { code: 104, kind: ConnectionReset, message: \"Connection reset by peer\" }",
            ),
            redis("subscribe", ErrorKind::Timeout, "Request timed out."),
            redis("lock_renew", ErrorKind::Unknown, "Failed to route command."),
            Error::Shutdown,
            Error::NotReleased {
                names: vec!["order:42".into(), "gpus".into()],
                maybe_taken: vec!["jobs".into()],
                source: Box::new(
                    Error::Redis(RedisError::timed_out(
                        "lock_release",
                        "no answer from Redis within 5.0s (the command timeout is 5s)".into(),
                    ))
                    .naming("order:42"),
                ),
            },
            Error::Protocol(DecodeError {
                script: "lock_acquire",
                detail: "[7, 7]".into(),
            }),
        ];
        for reason in every_connect_failure() {
            errors.push(Error::Connect {
                addr: "127.0.0.1:6379".into(),
                reason,
                cause: None,
            });
            errors.push(Error::Connect {
                addr: "127.0.0.1:6379".into(),
                reason,
                cause: Some(Box::new(FredError::new(
                    ErrorKind::Auth,
                    "WRONGPASS invalid username-password pair or user is disabled.",
                ))),
            });
        }
        // Fails to compile when a variant is added, so this list cannot fall behind.
        for err in &errors {
            match err {
                Error::NotHeld { .. }
                | Error::NotAcquired { .. }
                | Error::NotReplicated { .. }
                | Error::InvalidArgument(_)
                | Error::WrongType { .. }
                | Error::Refused { .. }
                | Error::Connect { .. }
                | Error::Redis(_)
                | Error::Shutdown
                | Error::NotReleased { .. }
                | Error::Protocol(_) => {}
            }
        }
        errors
    }

    #[test]
    fn a_wrong_type_is_recognised_as_every_server_words_it() {
        let plain = FredError::new(
            ErrorKind::InvalidArgument,
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        );
        // Redis 6.2 wraps a script's error.
        let script_6_2 = FredError::new(
            ErrorKind::Unknown,
            "ERR Error running script (call to f_18f8d9e22cc4df17b2e892ac4f9cb993a6cc23d5): \
             @user_script:69: WRONGTYPE Operation against a key holding the wrong kind of value",
        );
        let other = FredError::new(ErrorKind::Unknown, "ERR unknown command 'WRONGTYPE'");
        assert!(super::is_wrong_type(&plain));
        assert!(super::is_wrong_type(&script_6_2));
        assert!(!super::is_wrong_type(&other));
    }

    #[test]
    fn bounds() {
        fn error<T: std::error::Error + Send + Sync + 'static>() {}
        error::<Error>();
        error::<RedisError>();
    }

    /// The API guidelines' rule: an error's `Display` does not repeat its source's, so reporters
    /// that print the chain (anyhow, eyre, the CLI) show each cause once.
    #[test]
    fn display_never_repeats_a_source() {
        for err in every_error() {
            let mut level: &(dyn std::error::Error + 'static) = &err;
            loop {
                let shown = level.to_string();
                assert!(!shown.is_empty(), "{err:?}");
                let mut below = level.source();
                while let Some(source) = below {
                    let text = source.to_string();
                    assert!(
                        !shown.contains(&text),
                        "{err:?}: `{shown}` repeats the text of its source `{text}`"
                    );
                    below = source.source();
                }
                match level.source() {
                    Some(source) => level = source,
                    None => break,
                }
            }
        }
    }

    #[test]
    fn a_refused_connection_reads_as_one_sentence_with_no_source() {
        let err = Error::Connect {
            addr: "127.0.0.1:6379".into(),
            reason: ConnectFailure::Refused,
            cause: None,
        };
        assert_eq!(
            err.to_string(),
            "cannot connect to 127.0.0.1:6379: connection refused (is Redis running at that \
             address? it is the one in the URL this program gave lockkit)"
        );
        assert!(err.source().is_none());
    }

    /// The server's reply is on the top line, before the hint, and not again in a source.
    #[test]
    fn a_connect_error_carries_the_server_s_reason_on_its_top_line() {
        let err = Error::Connect {
            addr: "127.0.0.1:6379".into(),
            reason: ConnectFailure::Auth,
            cause: Some(Box::new(FredError::new(
                ErrorKind::Auth,
                "WRONGPASS invalid username-password pair or user is disabled.",
            ))),
        };
        assert_eq!(
            err.to_string(),
            "cannot connect to 127.0.0.1:6379: authentication failed: WRONGPASS invalid \
             username-password pair or user is disabled (check the user name and password in \
             the URL)"
        );
        assert!(err.source().is_none());
        let io = Error::Connect {
            addr: "db.invalid:6379".into(),
            reason: ConnectFailure::UnknownHost,
            cause: Some(Box::new(std::io::Error::other("Name or service not known"))),
        };
        assert_eq!(
            io.to_string(),
            "cannot connect to db.invalid:6379: unknown host: Name or service not known (check \
             the host name in the URL this program gave lockkit)"
        );
    }

    #[test]
    fn a_redis_error_carries_fred_s_reason_on_its_top_line() {
        let err = Error::Redis(RedisError::new(
            "lock_acquire",
            FredError::new(ErrorKind::Unknown, "NOPERM no permissions"),
        ));
        assert_eq!(
            err.to_string(),
            "redis error during lock_acquire: NOPERM no permissions"
        );
        assert!(err.source().is_none());
        assert_eq!(
            super::Chain(&err).to_string(),
            "redis error during lock_acquire: NOPERM no permissions"
        );
        let broken = Error::Redis(RedisError::new(
            "semaphore_acquire",
            FredError::new(
                ErrorKind::IO,
                "Os { code: 111, kind: ConnectionRefused, message: \"Connection refused\" }",
            ),
        ));
        assert_eq!(
            broken.to_string(),
            "redis error during semaphore_acquire: Connection refused"
        );
        let tls = FredError::new(
            ErrorKind::IO,
            "Custom { kind: InvalidData, error: InvalidCertificate(UnknownIssuer) }",
        );
        assert_eq!(
            super::fred_reason(&tls),
            "InvalidCertificate(UnknownIssuer)"
        );
    }

    /// A call cut off by one of lockkit's bounds: a timeout, ambiguous, naming its object in the
    /// text and the time and bound in its source; a shutdown that could not release names every
    /// hold.
    #[test]
    fn a_timed_out_call_names_its_object_and_a_failed_shutdown_every_hold() {
        let err = Error::Redis(RedisError::timed_out(
            "acquire",
            "no answer from Redis within 1.0s (the wait was 1s)".into(),
        ))
        .naming("order:42");
        assert_eq!(
            err.to_string(),
            "redis error during acquire of `order:42`: no answer from Redis within 1.0s (the \
             wait was 1s)"
        );
        assert_eq!(super::Chain(&err).to_string(), err.to_string());
        let Error::Redis(inner) = &err else {
            panic!("{err:?}");
        };
        assert!(inner.is_timeout() && inner.is_ambiguous());
        assert_eq!(inner.object(), Some("order:42"));
        // A name given once stays.
        assert!(err
            .naming("other")
            .to_string()
            .starts_with("redis error during acquire of `order:42`: "));

        let shutdown = Error::NotReleased {
            names: vec!["order:42".into(), "gpus".into()],
            maybe_taken: Vec::new(),
            source: Box::new(Error::Shutdown),
        };
        assert_eq!(
            shutdown.to_string(),
            "shutdown could not release 2 hold(s), freed when their leases run out: `order:42`, \
             `gpus`"
        );
    }

    /// `was_not_sent` recognises fred's unroutable-command error by its message (fred 10 has no
    /// error kind of its own for it). This pins that message against a real server: a command
    /// aimed at a server the client has no connection to takes fred's "no connection to route
    /// to" path in `write_command` (the same as a command that meets a dropped connection before
    /// the reconnect), and must come back as not sent. If fred rewords the message or changes
    /// its kind, this fails instead of the resend of unsent commands silently stopping.
    #[tokio::test]
    async fn an_unroutable_command_is_reported_as_not_sent() {
        use fred::interfaces::{ClientLike, KeysInterface};
        use fred::prelude::{Config, Options, ReconnectPolicy, Server};
        use fred::types::Builder;

        let server = lockkit_testkit::RedisServer::start()
            .await
            .unwrap_or_else(|err| panic!("redis-server: {err:?}"));
        let config = Config::from_url(&server.url()).unwrap_or_else(|err| panic!("{err}"));
        let client = Builder::from_config(config)
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2))
            .build()
            .unwrap_or_else(|err| panic!("{err}"));
        client.init().await.unwrap_or_else(|err| panic!("{err}"));

        // A port where no server of this client is: nothing to route to.
        let elsewhere = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap_or_else(|err| panic!("{err}"))
            .port();
        let unroutable = Options {
            cluster_node: Some(Server::new("127.0.0.1", elsewhere)),
            // As lockkit's sent-at-most-once commands (releases).
            max_attempts: Some(1),
            ..Options::default()
        };
        let result = client
            .with_options(&unroutable)
            .incr::<i64, _>("pinned:unsent")
            .await;
        let err = match result {
            Err(err) => RedisError::new("pin", err),
            Ok(value) => panic!("an unroutable INCR answered {value}"),
        };
        assert!(
            err.was_not_sent(),
            "fred's unroutable-command error changed: {:?}; update `RedisError::was_not_sent`",
            err.source
        );
        assert!(!err.is_ambiguous(), "{:?}", err.source);

        // It really was not sent: the key was never incremented.
        let value: Option<i64> = tokio::time::timeout(
            Duration::from_secs(10),
            client.get::<Option<i64>, _>("pinned:unsent"),
        )
        .await
        .unwrap_or_else(|_| panic!("GET after the reconnect timed out"))
        .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(value, None);

        // Ordinary failures are not mistaken for it: a Redis error reply, a broken connection.
        let reply: Result<i64, _> = client
            .custom(
                fred::types::CustomCommand::new_static("NOSUCHCOMMAND", None, false),
                Vec::<String>::new(),
            )
            .await;
        match reply {
            Err(err) => assert!(!RedisError::new("pin", err).was_not_sent()),
            Ok(value) => panic!("an unknown command answered {value}"),
        }
        let broken = FredError::new(ErrorKind::IO, "Connection closed abruptly");
        assert!(!RedisError::new("pin", broken).was_not_sent());
        let _ = client.quit().await;
    }
}
