//! The client: one per process (a "pod"), shared by every lock it hands out.

use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{Config, ReconnectPolicy};
use fred::types::Builder;
use lockkit_protocol::keys::{Namespace, DEFAULT_PREFIX};
use tokio_util::sync::CancellationToken;

use crate::connect::{connect, quit_in_background, refuse_ignored_password, Target};
use crate::core::ClientInner;
pub use crate::core::PubSubMode;
use crate::core::Settings;
use crate::error::{ConnectFailure, Error};
use crate::exec::Exec;
pub use crate::limits::{DEFAULT_WATCHDOG_TIMEOUT, MAX_LEASE, MIN_WATCHDOG_TIMEOUT};
use crate::lock::Lock;
use crate::replica::{ReplicaAck, ReplicaPolicy};
use crate::tls::TlsSettings;
use crate::waiters::WaiterHub;
use crate::watchdog::{Watchdog, WatchdogConfig};
use crate::{
    CountDownLatch, Election, FairLock, FencedLock, MultiLock, PermitExpirableSemaphore,
    RateLimiter, ReadWriteLock, Semaphore, SpinLock,
};

/// How many release messages the subscriber connection queues for the waiter hub (fred's default
/// is 32). Releases of many contended locks in a burst (the scale bench: ~11,000 in 2 s over
/// 1,000 locks) overflowed 32 and each overflow woke every waiter of the client; 1,024 slots cost
/// about 100 KB per broadcast channel of the subscriber client.
const SUBSCRIBER_QUEUE: usize = 1024;
/// The default [command timeout](ClientBuilder::command_timeout): 5 s.
///
/// ```
/// assert_eq!(lockkit::DEFAULT_COMMAND_TIMEOUT, std::time::Duration::from_secs(5));
/// ```
pub const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
/// The default [connect timeout](ClientBuilder::connect_timeout): 5 s.
///
/// ```
/// assert_eq!(lockkit::DEFAULT_CONNECT_TIMEOUT, std::time::Duration::from_secs(5));
/// ```
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_RENEW_BATCH: usize = 256;
/// The default [recheck interval](ClientBuilder::recheck_interval): a third of a lock waiter's
/// keep-alive ([`WAITER_KEEPALIVE`](lockkit_protocol::lock::WAITER_KEEPALIVE), 5 s), the period
/// at which the locks' waiters keep their place in line.
///
/// ```
/// let keepalive = lockkit::protocol::lock::WAITER_KEEPALIVE;
/// assert_eq!(lockkit::DEFAULT_RECHECK_INTERVAL, keepalive / 3);
/// ```
pub const DEFAULT_RECHECK_INTERVAL: Duration =
    Duration::from_nanos(lockkit_protocol::lock::WAITER_KEEPALIVE.as_nanos() as u64 / 3);
/// The shortest recheck interval accepted.
const MIN_RECHECK_INTERVAL: Duration = Duration::from_millis(1);

/// A connection to Redis that hands out locks.
///
/// Cheap to clone: clones share the connections, the watchdog and the waiter hub. Each `Client`
/// made by [`Client::connect`] or [`ClientBuilder::build`] gets a random [`id`](Client::id) that
/// is part of every owner id it uses, so two clients (two pods) never share a hold.
///
/// Connections: one multiplexed command connection per Redis server, plus one subscriber
/// connection used only while some task waits.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// let client = lockkit::Client::connect("redis://127.0.0.1:6379").await?;
/// let lock = client.lock("order:42");
/// if let Some(guard) = lock.try_lock(Duration::from_secs(5), None).await? {
///     // ... the critical section ...
///     guard.unlock().await?;
/// }
/// client.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("id", &self.inner.id)
            .field("prefix", &self.inner.settings.namespace.prefix())
            .finish_non_exhaustive()
    }
}

impl Client {
    /// Connects to the Redis server at `url` with default settings.
    ///
    /// `redis://[user:password@]host:port[/db]`; see [`ClientBuilder::url`] for the other schemes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed URL, [`Error::Connect`] when the server cannot be
    /// reached or refuses the credentials (or the URL gives a password that the server would
    /// ignore), for instance `cannot connect to 127.0.0.1:6379: connection refused (is Redis
    /// running at that address? it is the one in the URL this program gave lockkit)`. lockkit
    /// reads no environment variable: where the URL comes from is the program's choice.
    pub async fn connect(url: impl Into<String>) -> Result<Client, Error> {
        Self::builder().url(url).build().await
    }

    /// A builder for a client with non-default settings.
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// This client's random id, part of every owner id it uses.
    pub fn id(&self) -> &str {
        &self.inner.id
    }

    /// The lease of watchdog-mode holds.
    pub fn watchdog_timeout(&self) -> Duration {
        self.inner.settings.watchdog_timeout
    }

    /// The pub/sub flavour this client uses for release notifications, as resolved when it was
    /// built: [`PubSubMode::Classic`] or [`PubSubMode::Sharded`] (never `Auto`).
    pub fn pubsub_mode(&self) -> PubSubMode {
        self.inner.settings.pubsub
    }

    /// The key prefix shared by every key and channel of this client.
    pub fn key_prefix(&self) -> &str {
        self.inner.settings.namespace.prefix()
    }

    /// A handle on the reentrant lock called `name`. Cheap; nothing is sent to Redis.
    ///
    /// An invalid name (empty, or longer than
    /// [`MAX_NAME_LEN`](lockkit_protocol::keys::MAX_NAME_LEN) bytes) is reported by the first
    /// operation on the handle as [`Error::InvalidArgument`].
    pub fn lock(&self, name: impl Into<String>) -> Lock {
        Lock::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the fenced lock called `name`: a reentrant lock whose every acquisition carries
    /// a strictly increasing fencing token.
    pub fn fenced_lock(&self, name: impl Into<String>) -> FencedLock {
        FencedLock::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the leader election called `name`: one leader at a time among the
    /// candidates, announced with a value and fenced by its term. Cheap; nothing is sent to
    /// Redis. An invalid name is reported by the first operation as [`Error::InvalidArgument`].
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// let leadership = client.election("scheduler").campaign("pod-a").await?;
    /// # drop(leadership);
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the fair lock called `name`: granted in request order across clients.
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        FairLock::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the read-write lock called `name`: many readers or one writer.
    pub fn read_write_lock(&self, name: impl Into<String>) -> ReadWriteLock {
        ReadWriteLock::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the spin lock called `name`: a plain non-reentrant lock that waits by backoff,
    /// without pub/sub.
    pub fn spin_lock(&self, name: impl Into<String>) -> SpinLock {
        SpinLock::new(Arc::clone(&self.inner), name.into())
    }

    /// A lock over several locks, taken all-or-nothing.
    pub fn multi_lock(&self, locks: impl IntoIterator<Item = Lock>) -> MultiLock {
        MultiLock::new(locks.into_iter().collect())
    }

    /// A handle on the semaphore called `name`, whose permits are leased.
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the permit-expirable semaphore called `name`: permits have ids and leases of
    /// their own.
    pub fn permit_expirable_semaphore(&self, name: impl Into<String>) -> PermitExpirableSemaphore {
        PermitExpirableSemaphore::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the count-down latch called `name`.
    pub fn count_down_latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch::new(Arc::clone(&self.inner), name.into())
    }

    /// A handle on the rate limiter called `name`: at most `n` permits per interval across
    /// every client (see [`RateLimiter`]).
    pub fn rate_limiter(&self, name: impl Into<String>) -> RateLimiter {
        RateLimiter::new(Arc::clone(&self.inner), name.into())
    }

    /// The number of holds this client currently renews or watches.
    pub fn held_count(&self) -> usize {
        self.inner.watchdog.holds()
    }

    /// The number of waits on a release this client's tasks currently have: one per waiting
    /// acquire, and one per busy member for a waiting [`MultiLock`] (it waits on every busy
    /// member at once).
    pub fn waiting_count(&self) -> usize {
        self.inner.hub.waiting()
    }

    /// Stops renewing, releases every hold this client still has, and wakes every waiting task
    /// with [`Error::Shutdown`]; a waiting call leaves its object's line before it returns that
    /// error (within the command timeout), so that no release grants the object to it. Later calls on this client (and its locks and guards) return
    /// [`Error::Shutdown`]; an acquire that was in flight gives back what it took. The subscriber
    /// connection closes now, the command connection once the last handle and guard are dropped.
    /// Calling it again does nothing.
    ///
    /// It takes at most the [command timeout](ClientBuilder::command_timeout), whatever Redis
    /// does: the holds are released all at once, each release bounded by the command timeout
    /// (as are the releases of dropped guards that were still under way, which it waits for).
    ///
    /// # Errors
    /// [`Error::NotReleased`], naming every hold that could not be given back in that time
    /// (Redis did not answer, or failed), and apart from them what acquires cut short (an
    /// ambiguous error) may have taken and could not be given back either; the client is shut
    /// down all the same, and each such hold frees when its lease runs out.
    pub async fn shutdown(&self) -> Result<(), Error> {
        if self.inner.shutdown.is_cancelled() {
            return Ok(());
        }
        self.inner.shutdown.cancel();
        let bound = tokio::time::Instant::now() + self.inner.exec.command_timeout();
        let failed = self.inner.watchdog.shutdown().await;
        self.inner.close();
        // The subscriber connection's `QUIT` is under way in the hub's task: waiting for it
        // (within the same bound) keeps it from being cut short by a program that returns from
        // `main` right after this call, which makes fred warn ("Fatal error sending QUIT command
        // to router").
        let _ = tokio::time::timeout_at(bound, self.inner.hub.sub_closed()).await;
        tracing::debug!(client = %self.inner.id, "client shut down");
        let mut failed = failed.into_iter();
        let Some(first) = failed.next() else {
            return Ok(());
        };
        let (mut names, mut maybe_taken) = (Vec::new(), Vec::new());
        for unreleased in std::iter::once(&first).chain(failed.as_slice()) {
            let name = unreleased.name.to_string();
            if unreleased.granted {
                names.push(name);
            } else {
                maybe_taken.push(name);
            }
        }
        tracing::warn!(
            not_released = ?names,
            ?maybe_taken,
            "shutdown could not release every hold; their leases will free them"
        );
        Err(Error::NotReleased {
            names,
            maybe_taken,
            source: Box::new(first.err),
        })
    }
}

/// Builds a [`Client`] with non-default settings.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// let client = lockkit::Client::builder()
///     .url("redis://127.0.0.1:6379")
///     .watchdog_timeout(Duration::from_secs(30))
///     .key_prefix("billing")
///     .build()
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ClientBuilder {
    url: Option<String>,
    watchdog_timeout: Duration,
    key_prefix: String,
    command_timeout: Duration,
    connect_timeout: Duration,
    recheck_interval: Duration,
    renew_batch: usize,
    pubsub: PubSubMode,
    replica_ack: (ReplicaAck, Duration),
    token_counter_ttl: Duration,
    tls: TlsSettings,
}

/// Shows the URL without its password, and no key material.
impl std::fmt::Debug for ClientBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientBuilder")
            .field("url", &self.url.as_deref().map(redact))
            .field("watchdog_timeout", &self.watchdog_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("command_timeout", &self.command_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("recheck_interval", &self.recheck_interval)
            .field("renew_batch", &self.renew_batch)
            .field("pubsub", &self.pubsub)
            .field("replica_ack", &self.replica_ack)
            .field("token_counter_ttl", &self.token_counter_ttl)
            .field("tls", &self.tls)
            .finish()
    }
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            url: None,
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            key_prefix: DEFAULT_PREFIX.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            recheck_interval: DEFAULT_RECHECK_INTERVAL,
            renew_batch: DEFAULT_RENEW_BATCH,
            pubsub: PubSubMode::Auto,
            replica_ack: (ReplicaAck::None, Duration::ZERO),
            token_counter_ttl: lockkit_protocol::fenced_lock::DEFAULT_COUNTER_TTL,
            tls: TlsSettings::default(),
        }
    }
}

impl ClientBuilder {
    /// The server's URL (default `redis://127.0.0.1:6379`):
    /// - `redis://[[user]:password@]host:port[/db]`: one server;
    /// - `redis-cluster://[[user]:password@]host:port?node=host2:port2`: a Redis Cluster;
    /// - `redis-sentinel://[[user]:password@]host:port/db?sentinelServiceName=name&node=host2:port2`:
    ///   primaries found through Sentinel;
    /// - `rediss://`, `rediss-cluster://`, `rediss-sentinel://`: the same over TLS, with the `tls`
    ///   cargo feature (without it they are refused rather than used in plain text). The server's
    ///   certificate must be valid for the host as written in the URL (an IP address needs an IP
    ///   subject alternative name). See
    ///   [`tls_root_certificates_pem`](ClientBuilder::tls_root_certificates_pem) for the trusted
    ///   roots.
    pub fn url(mut self, url: impl Into<String>) -> Self {
        self.url = Some(url.into());
        self
    }

    /// The lease of watchdog-mode holds (default 30 s, at least 100 ms); the watchdog renews them
    /// every third of it.
    pub fn watchdog_timeout(mut self, timeout: Duration) -> Self {
        self.watchdog_timeout = timeout;
        self
    }

    /// The prefix of every key and channel (default `lockkit`), to keep applications that share
    /// one Redis apart. It may not be empty or contain braces.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// How long one command may take, resends and reconnection included, before it fails with
    /// an ambiguous [`Error::Redis`] (default 5 s). It bounds every script call, an
    /// [`unlock`](crate::LockGuard::unlock) with all its resends, and
    /// [`Client::shutdown`]; an acquire's `wait` bounds the acquire (see `docs/reliability.md`,
    /// "Bounds while Redis is down").
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long connecting may take in all (default 5 s): the TCP connection, TLS, and the Redis
    /// handshake, of the command and the subscriber connection, and (on a cluster) the pub/sub
    /// probe. [`build`](ClientBuilder::build) fails with
    /// [`ConnectFailure::TimedOut`](crate::ConnectFailure::TimedOut) when it runs out; the same
    /// timeout bounds each reconnection's handshake later.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How often a waiting call looks again on its own when nothing woke it (default 5 s / 3 ≈
    /// 1.7 s, the period at which a lock's waiters keep their place in line; accepted from 1 ms
    /// to 365 days). Every waiting call of every primitive ([`Lock::lock`](crate::Lock::lock),
    /// [`Semaphore::acquire`](crate::Semaphore::acquire),
    /// [`CountDownLatch::wait`](crate::CountDownLatch::wait), every `try_*` with a `wait`, ...)
    /// looks again at least this often, whatever the holder's lease says. It bounds what no
    /// message announces:
    /// - permits, a lock or a latch freed by **data loss** (`FLUSHALL`, an eviction, a restart
    ///   without the data): a waiter finds them free within this interval, never a lease later;
    /// - a Redis that **stops answering without closing the connection** (a frozen process, a
    ///   `CLIENT PAUSE`, a network that swallows packets): a waiting call fails within this
    ///   interval plus the [command timeout](ClientBuilder::command_timeout).
    ///
    /// A lost connection needs no look: it wakes every waiting call of the client at once, and
    /// each fails within the command timeout unless Redis is back by then (see the guide's
    /// "Bounds while Redis is down").
    ///
    /// Each look is one script call per waiting call. Raise it to lower the load of thousands of
    /// waiters, at the price of those two bounds; the waiters of a [`Lock`], [`FencedLock`],
    /// [`FairLock`], [`MultiLock`] and [`Election`] keep looking at least every third of their
    /// keep-alive whatever it says, since their place in line lives on it.
    pub fn recheck_interval(mut self, interval: Duration) -> Self {
        self.recheck_interval = interval;
        self
    }

    /// How many holds one renewal round trip carries at most (default 256).
    pub fn renew_batch_size(mut self, holds: usize) -> Self {
        self.renew_batch = holds;
        self
    }

    /// How release notifications are published and subscribed to (default
    /// [`PubSubMode::Auto`]: sharded pub/sub on a Redis Cluster that supports it, classic
    /// otherwise). Every client that shares the objects must end up with the same mode; see
    /// [`Client::pubsub_mode`].
    pub fn pubsub(mut self, mode: PubSubMode) -> Self {
        self.pubsub = mode;
        self
    }

    /// How long a [`FencedLock`](crate::FencedLock)'s token counter outlives its last token
    /// (default one day, accepted from one minute to 365 days): every acquisition (and every
    /// grant to a waiter) sets the counter to expire once the server clock has passed the new
    /// token by this much, so a lock left unused leaves no key behind. Tokens keep growing across
    /// the expiry: the next one is minted from the server clock, which is then past every earlier
    /// token. The TTL is the margin against the server clock stepping back after the counter
    /// expired. Clients that share locks should use the same value (the latest acquisition's
    /// sets the expiry).
    pub fn token_counter_ttl(mut self, ttl: Duration) -> Self {
        self.token_counter_ttl = ttl;
        self
    }

    /// The replica acknowledgement policy (default [`ReplicaAck::None`]): after every
    /// acquisition, of every primitive, wait with `WAIT` on the key's primary until the replicas
    /// that `ack` asks for have it, for at most `timeout`. An acquisition that did not reach them
    /// in time is given back and reported as [`Error::NotReplicated`], never returned as held.
    ///
    /// It narrows the window in which a failover loses a lock (Redis replicates asynchronously)
    /// at the price of one more round trip per acquisition, up to `timeout` when replicas lag;
    /// while a `WAIT` runs, the client's other commands to that primary queue behind it. It does
    /// not make Redis strongly consistent: see `docs/topologies.md`, and use fencing tokens
    /// ([`Client::fenced_lock`]) where a second holder must be harmless.
    ///
    /// `timeout` must be positive and shorter than the
    /// [command timeout](ClientBuilder::command_timeout) unless `ack` asks for nothing; otherwise
    /// [`build`](ClientBuilder::build) fails with [`Error::InvalidArgument`].
    pub fn replica_ack(mut self, ack: ReplicaAck, timeout: Duration) -> Self {
        self.replica_ack = (ack, timeout);
        self
    }

    /// Trusts the CA certificates in `pem` (one or more `BEGIN CERTIFICATE` blocks) for `rediss://`
    /// connections, **instead of** the system's root certificates. Calling it again adds more.
    ///
    /// By default a TLS client trusts the operating system's roots (through
    /// `rustls-native-certs`), which suits a managed Redis with a publicly trusted certificate.
    /// A self-hosted Redis usually has a private CA: give its certificate here, and only that CA
    /// is trusted.
    ///
    /// Needs the `tls` feature: without it, [`build`](ClientBuilder::build) fails with
    /// [`Error::InvalidArgument`]; so it does with a plain `redis://` URL, or a `pem` that holds
    /// no valid certificate.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = lockkit::Client::builder()
    ///     .url("rediss://redis.internal:6380")
    ///     .tls_root_certificates_pem(std::fs::read("/etc/redis/tls/ca.crt")?)
    ///     .build()
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn tls_root_certificates_pem(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.tls.roots_pem.push(pem.as_ref().to_vec());
        self
    }

    /// Presents this client certificate (`chain_pem`: the certificate, then any intermediates)
    /// and its private key (`key_pem`: PKCS#8, PKCS#1 or SEC1) to servers that ask for one —
    /// Redis does by default (`tls-auth-clients yes`).
    ///
    /// Needs the `tls` feature and a `rediss://` URL, as
    /// [`tls_root_certificates_pem`](ClientBuilder::tls_root_certificates_pem). The key is kept
    /// in memory only and never shown by `Debug`.
    pub fn tls_client_certificate_pem(
        mut self,
        chain_pem: impl AsRef<[u8]>,
        key_pem: impl AsRef<[u8]>,
    ) -> Self {
        self.tls.client_auth = Some((chain_pem.as_ref().to_vec(), key_pem.as_ref().to_vec()));
        self
    }

    /// Connects and starts the client's background tasks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad settings: among them a TLS URL or TLS settings in a
    /// build without the `tls` feature, TLS settings with a plain `redis://` URL, PEM input
    /// without a valid certificate or key. [`Error::Connect`] when the server cannot be reached
    /// in time, refuses the credentials, or fails the TLS handshake (an untrusted or mismatched
    /// certificate); its [`ConnectFailure`](crate::ConnectFailure) says which.
    /// [`Error::Redis`] when a connected server fails the pub/sub probe of
    /// [`PubSubMode::Auto`] on a cluster.
    pub async fn build(self) -> Result<Client, Error> {
        if self.watchdog_timeout < MIN_WATCHDOG_TIMEOUT || self.watchdog_timeout > MAX_LEASE {
            return Err(Error::InvalidArgument(format!(
                "watchdog timeout {:?} is outside {MIN_WATCHDOG_TIMEOUT:?}..={MAX_LEASE:?}",
                self.watchdog_timeout
            )));
        }
        for (what, value) in [
            ("command timeout", self.command_timeout),
            ("connect timeout", self.connect_timeout),
        ] {
            if value.is_zero() || value > MAX_LEASE {
                return Err(Error::InvalidArgument(format!(
                    "{what} {value:?} is outside (0s, {MAX_LEASE:?}]"
                )));
            }
        }
        if self.recheck_interval < MIN_RECHECK_INTERVAL || self.recheck_interval > MAX_LEASE {
            return Err(Error::InvalidArgument(format!(
                "recheck interval {:?} is outside {MIN_RECHECK_INTERVAL:?}..={MAX_LEASE:?}",
                self.recheck_interval
            )));
        }
        let (min_ttl, max_ttl) = (
            lockkit_protocol::fenced_lock::MIN_COUNTER_TTL,
            lockkit_protocol::fenced_lock::MAX_COUNTER_TTL,
        );
        if self.token_counter_ttl < min_ttl || self.token_counter_ttl > max_ttl {
            return Err(Error::InvalidArgument(format!(
                "token counter TTL {:?} is outside {min_ttl:?}..={max_ttl:?}",
                self.token_counter_ttl
            )));
        }
        if self.renew_batch == 0 {
            return Err(Error::InvalidArgument(
                "renew batch size must be positive".into(),
            ));
        }
        let replica_ack = ReplicaPolicy::new(self.replica_ack.0, self.replica_ack.1);
        if let Some(policy) = replica_ack {
            // WAIT runs as one command: it must end before the command timeout cuts it off.
            if policy.timeout.is_zero() || policy.timeout >= self.command_timeout {
                return Err(Error::InvalidArgument(format!(
                    "replica acknowledgement timeout {:?} must be positive and shorter than the \
                     command timeout {:?}",
                    policy.timeout, self.command_timeout
                )));
            }
        }
        let namespace = Namespace::new(self.key_prefix)?;
        let url = self
            .url
            .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
        let tls = check_scheme(&url, cfg!(feature = "tls"))?;
        if !tls && self.tls.is_set() {
            return Err(Error::InvalidArgument(format!(
                "TLS settings were given, but the URL {:?} is not a TLS URL (rediss://)",
                redact(&url)
            )));
        }
        // fred is given the plain scheme and lockkit's own TLS configuration: fred's default one
        // would load the system's roots with rustls' process-wide provider, which panics when
        // more than one provider is compiled in.
        let plain_url = if tls {
            url.replacen("rediss", "redis", 1)
        } else {
            url.clone()
        };
        #[cfg_attr(not(feature = "tls"), allow(unused_mut))]
        let mut config = Config::from_url(&plain_url).map_err(|err| {
            Error::InvalidArgument(format!(
                "invalid Redis URL {:?}: {}",
                redact(&url),
                url_problem(&url, err.details())
            ))
        })?;
        // Port 0 parses, but names no server: connecting to it could only be refused.
        if let Some(zero) = config.server.hosts().iter().find(|server| server.port == 0) {
            return Err(Error::InvalidArgument(format!(
                "invalid Redis URL {:?}: the port `0` of {} is not a number from 1 to 65535",
                redact(&url),
                zero.host
            )));
        }
        #[cfg(feature = "tls")]
        if tls {
            config.tls = Some(crate::tls::config(&self.tls)?);
        }
        let clustered = config.server.is_clustered();
        let target = Target::new(&config, tls, self.connect_timeout);

        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|conn| {
                conn.connection_timeout = self.connect_timeout;
                // The handshake (HELLO, AUTH, SELECT, CLUSTER SLOTS, ...) is part of connecting:
                // with the command timeout it could end a connect early, and name the wrong bound.
                conn.internal_command_timeout = self.connect_timeout;
            })
            .with_performance_config(|perf| {
                // A backstop for plain commands, which also run under a deadline of the same
                // length (`Exec::command`) that names the bound; script calls have no fred
                // timeout (see `exec`).
                perf.default_command_timeout = self.command_timeout;
            })
            // Without a reconnect policy fred never reconnects.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));

        let redis_client = builder
            .build()
            .map_err(|err| target.error(ConnectFailure::Other, Some(Box::new(err))))?;
        // The subscriber's message queue: when the hub falls behind by more than this, messages
        // are dropped and every waiter must re-check (a burst of refused attempts).
        builder.with_performance_config(|perf| {
            perf.broadcast_channel_capacity = SUBSCRIBER_QUEUE;
        });
        let sub = builder
            .build_subscriber_client()
            .map_err(|err| target.error(ConnectFailure::Other, Some(Box::new(err))))?;
        // A password the server would ignore is refused before the client's own connections
        // send it: fred logs a warning ("Dropping unused auth warning") for each `AUTH` that
        // Redis answers with "no password is set".
        let deadline = target.deadline();
        let config = fred::interfaces::ClientLike::client_config(&redis_client);
        refuse_ignored_password(&config, &target, deadline).await?;
        // Both connections at once, within one connect timeout in all.
        let (command, subscriber) = tokio::join!(
            connect(&redis_client, &target, deadline),
            connect(&sub, &target, deadline)
        );
        // A connection whose `init` failed is stopped already (quitting it only logs a warning
        // from fred); one that timed out was closed by `connect`.
        let running = (command.is_ok(), subscriber.is_ok());
        if let Err(err) = command.and(subscriber) {
            if running.0 {
                quit_in_background(&redis_client);
            }
            if running.1 {
                quit_in_background(&sub);
            }
            return Err(err);
        }
        // No `manage_subscriptions()`: the waiter hub re-subscribes after a reconnect itself.

        // What the server can do: scripting, WAIT when the policy needs it, sharded pub/sub.
        let probe = crate::probe::probe(
            &redis_client,
            &target,
            self.pubsub,
            clustered,
            replica_ack.is_some(),
        );
        let pubsub = match tokio::time::timeout_at(deadline, probe).await {
            Ok(Ok(probed)) => probed.pubsub,
            Ok(Err(err)) => {
                quit_in_background(&redis_client);
                quit_in_background(&sub);
                return Err(err);
            }
            Err(_elapsed) => {
                quit_in_background(&redis_client);
                quit_in_background(&sub);
                return Err(target.timed_out());
            }
        };
        let sharded = pubsub == PubSubMode::Sharded;
        let exec = Exec::new(redis_client, sharded, clustered, self.command_timeout)
            .with_token_counter_ttl(self.token_counter_ttl)
            .with_namespace(namespace.clone())
            .watching(target.addr());
        let closed = CancellationToken::new();
        let id: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
        let outage = Arc::new(crate::core::Outage::default());
        let watchdog = Watchdog::spawn(
            exec.clone(),
            WatchdogConfig {
                timeout: self.watchdog_timeout,
                batch: self.renew_batch,
                clustered,
                outage: Arc::clone(&outage),
            },
        );
        // Both connections' losses wake every waiter (see `WaiterHub::start`).
        let commands = crate::waiters::CommandEvents {
            errors: fred::interfaces::EventInterface::error_rx(exec.redis()),
            reconnects: fred::interfaces::EventInterface::reconnect_rx(exec.redis()),
        };
        let hub = WaiterHub::start(sub, commands, sharded, closed.clone(), outage);
        tracing::debug!(client = %id, url = %redact(&url), ?pubsub, "lockkit client connected");
        Ok(Client {
            inner: Arc::new(ClientInner::new(
                id,
                Settings {
                    watchdog_timeout: self.watchdog_timeout,
                    recheck_interval: self.recheck_interval,
                    namespace,
                    pubsub,
                    replica_ack,
                },
                exec,
                hub,
                watchdog,
                closed,
            )),
        })
    }
}

/// Accepts the schemes lockkit supports and says whether the URL asks for TLS; rejects the rest
/// (fred would read `http://` as Redis, and without TLS support compiled in (`tls_built`) a
/// `rediss://` URL must not fall back to plain text).
fn check_scheme(url: &str, tls_built: bool) -> Result<bool, Error> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        Some("redis" | "redis-cluster" | "redis-sentinel") => Ok(false),
        Some("rediss" | "rediss-cluster" | "rediss-sentinel") if tls_built => Ok(true),
        Some("rediss" | "rediss-cluster" | "rediss-sentinel") => {
            Err(Error::InvalidArgument(format!(
                "TLS URLs ({:?}) need lockkit's `tls` cargo feature, which this build lacks",
                redact(url)
            )))
        }
        _ => Err(Error::InvalidArgument(format!(
            "invalid Redis URL {:?}: the scheme must be redis://, redis-cluster:// or \
             redis-sentinel:// (or rediss… for TLS)",
            redact(url)
        ))),
    }
}

/// What is wrong with `url`, in words, from the `details` of fred's error: fred passes on the
/// URL parser's error by its `Debug` name (`InvalidPort`), which says neither what nor where.
fn url_problem(url: &str, details: &str) -> String {
    // `host:port`, or `[v6]:port`, as the URL gives it (no credentials, path or query).
    let authority = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let port = host_port
        .rsplit_once(':')
        .filter(|(host, _)| !host.starts_with('[') || host.ends_with(']'))
        .map_or("", |(_, port)| port);
    match details.trim() {
        "InvalidPort" => format!("the port `{port}` is not a number from 1 to 65535"),
        "EmptyHost" => "the URL names no host".into(),
        "InvalidIpv4Address" => "the host is not a valid IPv4 address".into(),
        "InvalidIpv6Address" => "the host is not a valid IPv6 address (in brackets: [::1])".into(),
        "InvalidDomainCharacter" | "IdnaError" => {
            "the host name holds a character a host name cannot have".into()
        }
        "RelativeUrlWithoutBase" => "it is not a URL (`redis://host:port`)".into(),
        other => other.to_owned(),
    }
}

/// `url` without its password.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::{check_scheme, redact, ClientBuilder};
    use crate::Error;

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }

    #[test]
    fn builder_debug_shows_no_secrets() {
        let builder = ClientBuilder::default()
            .url("rediss://app:hunter2@h:1")
            .tls_client_certificate_pem("CHAIN", "PRIVATE-KEY-BYTES");
        let shown = format!("{builder:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("PRIVATE-KEY-BYTES"), "{shown}");
        assert!(shown.contains("rediss://***@h:1"), "{shown}");
    }

    #[test]
    fn tls_schemes_need_the_tls_build() {
        for url in [
            "rediss://h:1",
            "rediss-cluster://h:1",
            "rediss-sentinel://h:1",
        ] {
            assert!(matches!(check_scheme(url, true), Ok(true)), "{url}");
            match check_scheme(url, false) {
                Err(Error::InvalidArgument(msg)) => assert!(msg.contains("`tls`"), "{msg}"),
                other => panic!("{url}: expected InvalidArgument, got {other:?}"),
            }
        }
        for url in ["redis://h:1", "redis-cluster://h:1", "redis-sentinel://h:1"] {
            for built in [false, true] {
                assert!(matches!(check_scheme(url, built), Ok(false)), "{url}");
            }
        }
        for url in ["http://h:1", "valkeys://h:1", "h:1", "redis+unix:///tmp/s"] {
            assert!(
                matches!(check_scheme(url, true), Err(Error::InvalidArgument(_))),
                "{url}"
            );
        }
    }
}
