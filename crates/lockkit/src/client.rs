//! The client: one per process (a "pod"), shared by every lock it hands out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::prelude::{ClientLike, Config, ReconnectPolicy};
use fred::types::Builder;
use lockkit_protocol::keys::{Namespace, DEFAULT_PREFIX};
use tokio_util::sync::CancellationToken;

use crate::error::{redis, Error};
use crate::exec::Exec;
use crate::lock::Lock;
use crate::waiters::WaiterHub;
use crate::watchdog::{Watchdog, WatchdogConfig};
use crate::{
    CountDownLatch, FairLock, FencedLock, MultiLock, PermitExpirableSemaphore, ReadWriteLock,
    Semaphore, SpinLock,
};

/// The default lease of watchdog-mode locks; renewed every third of it.
pub const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest watchdog timeout accepted.
pub const MIN_WATCHDOG_TIMEOUT: Duration = Duration::from_millis(100);
/// The longest lease (fixed or watchdog) accepted: 365 days.
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_RENEW_BATCH: usize = 256;

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

/// Settings fixed when the client is built.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) watchdog_timeout: Duration,
    pub(crate) namespace: Namespace,
}

pub(crate) struct ClientInner {
    pub(crate) id: String,
    pub(crate) settings: Settings,
    pub(crate) exec: Exec,
    pub(crate) hub: WaiterHub,
    pub(crate) watchdog: Watchdog,
    /// Cancelled by [`Client::shutdown`].
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the last handle is gone: stops the hub.
    closed: CancellationToken,
    sequence: AtomicU64,
}

impl ClientInner {
    /// A client-unique number for a new hold.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.sequence.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn is_shut_down(&self) -> bool {
        self.shutdown.is_cancelled()
    }

    pub(crate) fn check_open(&self) -> Result<(), Error> {
        if self.is_shut_down() {
            Err(Error::Shutdown)
        } else {
            Ok(())
        }
    }
}

impl Drop for ClientInner {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

impl Client {
    /// Connects to the Redis server at `url` with default settings.
    ///
    /// `redis://[user:password@]host:port[/db]`; see [`ClientBuilder::url`] for the other schemes.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a malformed URL, [`Error::Redis`] when the server cannot be
    /// reached or refuses the credentials.
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
        Lock::new(self.clone(), name.into())
    }

    /// A handle on the fenced lock called `name`: a reentrant lock whose every acquisition carries
    /// a strictly increasing fencing token.
    pub fn fenced_lock(&self, name: impl Into<String>) -> FencedLock {
        FencedLock::new(self.clone(), name.into())
    }

    /// A handle on the fair lock called `name`: granted in request order across clients.
    pub fn fair_lock(&self, name: impl Into<String>) -> FairLock {
        FairLock::new(self.clone(), name.into())
    }

    /// A handle on the read-write lock called `name`: many readers or one writer.
    pub fn read_write_lock(&self, name: impl Into<String>) -> ReadWriteLock {
        ReadWriteLock::new(self.clone(), name.into())
    }

    /// A handle on the spin lock called `name`: a plain non-reentrant lock that waits by backoff,
    /// without pub/sub.
    pub fn spin_lock(&self, name: impl Into<String>) -> SpinLock {
        SpinLock::new(self.clone(), name.into())
    }

    /// A lock over several locks, taken all-or-nothing.
    pub fn multi_lock(&self, locks: impl IntoIterator<Item = Lock>) -> MultiLock {
        MultiLock::new(locks.into_iter().collect())
    }

    /// A handle on the semaphore called `name`, whose permits are leased.
    pub fn semaphore(&self, name: impl Into<String>) -> Semaphore {
        Semaphore::new(self.clone(), name.into())
    }

    /// A handle on the permit-expirable semaphore called `name`: permits have ids and leases of
    /// their own.
    pub fn permit_expirable_semaphore(&self, name: impl Into<String>) -> PermitExpirableSemaphore {
        PermitExpirableSemaphore::new(self.clone(), name.into())
    }

    /// A handle on the count-down latch called `name`.
    pub fn count_down_latch(&self, name: impl Into<String>) -> CountDownLatch {
        CountDownLatch::new(self.clone(), name.into())
    }

    /// The number of holds this client currently renews or watches.
    pub fn held_count(&self) -> usize {
        self.inner.watchdog.holds()
    }

    /// The number of this client's tasks currently waiting for a release.
    pub fn waiting_count(&self) -> usize {
        self.inner.hub.waiting()
    }

    /// Stops renewing, releases every hold this client still has, and wakes every waiting task
    /// with [`Error::Shutdown`]. Later calls on this client (and its locks and guards) return
    /// [`Error::Shutdown`]; an acquire that was in flight gives back what it took. The subscriber
    /// connection closes now, the command connection once the last handle and guard are dropped.
    /// Calling it again does nothing.
    ///
    /// # Errors
    /// The first error of a release that could not be sent; such a hold is left to run out its
    /// lease.
    pub async fn shutdown(&self) -> Result<(), Error> {
        if self.inner.shutdown.is_cancelled() {
            return Ok(());
        }
        self.inner.shutdown.cancel();
        let mut errors = self.inner.watchdog.shutdown().await;
        self.inner.closed.cancel();
        tracing::debug!(client = %self.inner.id, "client shut down");
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors.swap_remove(0))
        }
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
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    url: Option<String>,
    watchdog_timeout: Duration,
    key_prefix: String,
    command_timeout: Duration,
    connect_timeout: Duration,
    renew_batch: usize,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            url: None,
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            key_prefix: DEFAULT_PREFIX.to_owned(),
            command_timeout: DEFAULT_COMMAND_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            renew_batch: DEFAULT_RENEW_BATCH,
        }
    }
}

impl ClientBuilder {
    /// The server's URL (default `redis://127.0.0.1:6379`):
    /// - `redis://[[user]:password@]host:port[/db]`: one server;
    /// - `redis-cluster://[[user]:password@]host:port?node=host2:port2`: a Redis Cluster;
    /// - `redis-sentinel://[[user]:password@]host:port/db?sentinelServiceName=name&node=host2:port2`:
    ///   primaries found through Sentinel.
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

    /// How long one command may take, reconnection included, before it fails (default 5 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }

    /// How long connecting may take (default 5 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How many holds one renewal round trip carries at most (default 256).
    pub fn renew_batch_size(mut self, holds: usize) -> Self {
        self.renew_batch = holds;
        self
    }

    /// Connects and starts the client's background tasks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for bad settings, [`Error::Redis`] when the server cannot be
    /// reached in time or refuses the credentials.
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
        if self.renew_batch == 0 {
            return Err(Error::InvalidArgument(
                "renew batch size must be positive".into(),
            ));
        }
        let namespace = Namespace::new(self.key_prefix)?;
        let url = self
            .url
            .unwrap_or_else(|| "redis://127.0.0.1:6379".to_owned());
        check_scheme(&url)?;
        let config = Config::from_url(&url).map_err(|err| {
            Error::InvalidArgument(format!(
                "invalid Redis URL {:?}: {}",
                redact(&url),
                err.details()
            ))
        })?;
        let clustered = config.server.is_clustered();

        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|conn| {
                conn.connection_timeout = self.connect_timeout;
                conn.internal_command_timeout = self.command_timeout;
            })
            .with_performance_config(|perf| {
                perf.default_command_timeout = self.command_timeout;
            })
            // Without a reconnect policy fred never reconnects.
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));

        let redis_client = builder.build().map_err(redis("connect"))?;
        let sub = builder
            .build_subscriber_client()
            .map_err(redis("connect"))?;
        connect(&redis_client, self.connect_timeout).await?;
        if let Err(err) = connect(&sub, self.connect_timeout).await {
            let _ = redis_client.quit().await;
            return Err(err);
        }
        // Resubscribes to the tracked channels after a reconnect.
        let _resubscriber = sub.manage_subscriptions();

        let exec = Exec::new(redis_client);
        let closed = CancellationToken::new();
        let id = uuid::Uuid::new_v4().simple().to_string();
        let watchdog = Watchdog::spawn(
            exec.clone(),
            WatchdogConfig {
                timeout: self.watchdog_timeout,
                batch: self.renew_batch,
                clustered,
            },
        );
        let hub = WaiterHub::start(sub, closed.clone());
        tracing::debug!(client = %id, url = %redact(&url), "lockkit client connected");
        Ok(Client {
            inner: Arc::new(ClientInner {
                id,
                settings: Settings {
                    watchdog_timeout: self.watchdog_timeout,
                    namespace,
                },
                exec,
                hub,
                watchdog,
                shutdown: CancellationToken::new(),
                closed,
                sequence: AtomicU64::new(0),
            }),
        })
    }
}

/// Connects a fred client, giving up after `timeout`.
async fn connect<C: ClientLike>(client: &C, timeout: Duration) -> Result<(), Error> {
    match tokio::time::timeout(timeout, client.init()).await {
        Ok(Ok(_task)) => Ok(()),
        Ok(Err(err)) => Err(redis("connect")(err)),
        Err(_elapsed) => {
            let _ = client.quit().await;
            Err(redis("connect")(fred::error::Error::new(
                fred::error::ErrorKind::Timeout,
                format!("could not connect within {timeout:?}"),
            )))
        }
    }
}

/// Accepts the schemes lockkit supports; rejects the rest (fred would read `http://` as Redis,
/// and without TLS support compiled in a `rediss://` URL must not fall back to plain text).
fn check_scheme(url: &str) -> Result<(), Error> {
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    match scheme {
        Some("redis" | "redis-cluster" | "redis-sentinel") => Ok(()),
        Some("rediss" | "rediss-cluster" | "rediss-sentinel") => Err(Error::InvalidArgument(format!(
            "TLS URLs ({:?}) are not supported by this build of lockkit",
            redact(url)
        ))),
        _ => Err(Error::InvalidArgument(format!(
            "invalid Redis URL {:?}: the scheme must be redis://, redis-cluster:// or redis-sentinel://",
            redact(url)
        ))),
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
    use super::redact;

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact("redis://u:secret@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
