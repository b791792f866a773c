//! Shared helpers of the lockkit integration suite (tests and benches).
//!
//! Every test talks to a real `redis-server`: [`redis`] starts one on a free loopback port (or
//! uses `REDIS_URL` when set), and [`unique`] gives each test its own object names so tests can
//! share an external server.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

pub use lockkit_testkit::{RedisServer, TestRedis};

pub mod checker;
pub mod linearizability;
pub mod model_io;
pub mod rate_window;

/// A Redis for one test: spawned, or the external one named by `REDIS_URL`.
///
/// # Panics
/// When no server can be started (the suite's tests cannot run without one).
pub async fn redis() -> TestRedis {
    match lockkit_testkit::redis_url().await {
        Ok(redis) => redis,
        Err(err) => panic!("cannot get a Redis for the test: {err}"),
    }
}

/// A spawned server (for tests that kill, pause or restart it).
///
/// # Panics
/// When no server can be started.
pub async fn spawned() -> RedisServer {
    match RedisServer::start().await {
        Ok(server) => server,
        Err(err) => panic!("cannot start redis-server: {err}"),
    }
}

/// A name no other test (or test run) uses.
pub fn unique(name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{name}:{}-{nanos:x}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A client with default settings.
///
/// # Panics
/// When it cannot connect.
pub async fn client(url: &str) -> lockkit::Client {
    client_with(url, lockkit::DEFAULT_WATCHDOG_TIMEOUT).await
}

/// A client with the given watchdog timeout.
///
/// # Panics
/// When it cannot connect.
pub async fn client_with(url: &str, watchdog_timeout: Duration) -> lockkit::Client {
    match lockkit::Client::builder()
        .url(url)
        .watchdog_timeout(watchdog_timeout)
        .build()
        .await
    {
        Ok(client) => client,
        Err(err) => panic!("cannot connect to {url}: {err}"),
    }
}

/// The recheck interval of [`client_woken_only`]: longer than any test's hang guard.
pub const NO_RECHECK: Duration = Duration::from_secs(3600);

/// A client whose waiting calls do not look again on their own within a test's time (a
/// [recheck interval](lockkit::ClientBuilder::recheck_interval) of an hour), for tests of what
/// wakes a waiter: with the default interval (≈ 1.7 s), a waiter that missed its wake-up would
/// still get in long before the test's hang guard, and the test could not fail. (Waiters of the
/// lock kinds still look again every third of their keep-alive: that is their place in line.)
///
/// # Panics
/// When it cannot connect.
pub async fn client_woken_only(url: &str) -> lockkit::Client {
    match lockkit::Client::builder()
        .url(url)
        .recheck_interval(NO_RECHECK)
        .build()
        .await
    {
        Ok(client) => client,
        Err(err) => panic!("cannot connect to {url}: {err}"),
    }
}

/// Fails a test that would otherwise hang: `future` must finish within `limit`. The limit is a
/// hang guard, never a performance assertion; keep it far above the expected time.
///
/// # Panics
/// When `future` does not finish within `limit`.
pub async fn within<F: std::future::Future>(limit: Duration, what: &str, future: F) -> F::Output {
    match tokio::time::timeout(limit, future).await {
        Ok(out) => out,
        Err(_) => panic!("hung: {what} did not finish within {limit:?}"),
    }
}

/// A plain fred client, to look at and tamper with what lockkit stores.
///
/// # Panics
/// When it cannot connect.
pub async fn raw(url: &str) -> fred::clients::Client {
    use fred::interfaces::ClientLike;
    let config = match fred::types::config::Config::from_url(url) {
        Ok(config) => config,
        Err(err) => panic!("bad url {url}: {err}"),
    };
    let client = fred::types::Builder::from_config(config)
        .build()
        .unwrap_or_else(|err| panic!("cannot build a fred client: {err}"));
    if let Err(err) = client.init().await {
        panic!("cannot connect to {url}: {err}");
    }
    client
}

/// A fred builder with the settings `lockkit::ClientBuilder::build` applies by default (5 s
/// connect and command timeouts, the same reconnect policy): the benches' baselines are measured
/// through a client configured like lockkit's own.
///
/// # Panics
/// For an invalid URL.
pub fn raw_builder(url: &str) -> fred::types::Builder {
    let config = match fred::types::config::Config::from_url(url) {
        Ok(config) => config,
        Err(err) => panic!("bad url {url}: {err}"),
    };
    let mut builder = fred::types::Builder::from_config(config);
    builder
        .with_connection_config(|conn| {
            conn.connection_timeout = Duration::from_secs(5);
            conn.internal_command_timeout = Duration::from_secs(5);
        })
        .with_performance_config(|perf| {
            perf.default_command_timeout = Duration::from_secs(5);
        })
        .set_policy(fred::prelude::ReconnectPolicy::new_exponential(
            0, 50, 2_000, 2,
        ));
    builder
}

/// A connected plain fred client built by [`raw_builder`].
///
/// # Panics
/// When it cannot connect.
pub async fn raw_like_lockkit(url: &str) -> fred::clients::Client {
    use fred::interfaces::ClientLike;
    let client = raw_builder(url)
        .build()
        .unwrap_or_else(|err| panic!("cannot build a fred client: {err}"));
    if let Err(err) = client.init().await {
        panic!("cannot connect to {url}: {err}");
    }
    client
}

/// The Redis key of the lock called `name` (default prefix).
///
/// # Panics
/// For an invalid name.
pub fn lock_key(name: &str) -> String {
    match lockkit::protocol::keys::Namespace::default().lock(name) {
        Ok(keys) => keys.key,
        Err(err) => panic!("invalid lock name {name:?}: {err}"),
    }
}

/// Waits (with a hang guard) until `client` has at least `waiters` tasks registered as waiting.
///
/// # Panics
/// When that does not happen within a minute.
pub async fn until_waiting(client: &lockkit::Client, waiters: usize) {
    within(Duration::from_secs(60), "waiters to register", async {
        while client.waiting_count() < waiters {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Waits (with a hang guard) until the lock-kind object `name` of `kind` has exactly `count` live
/// waiting entries in Redis, as [`lockkit::Client::inspect`] lists them.
///
/// # Panics
/// When that does not happen within a minute, or the inspection fails.
pub async fn until_waiters_in_redis(
    observer: &lockkit::Client,
    kind: lockkit::protocol::keys::Kind,
    name: &str,
    count: usize,
) {
    within(Duration::from_secs(60), "the waiting entries", async {
        loop {
            let objects = match observer.inspect(Some(kind), name).await {
                Ok(objects) => objects,
                Err(err) => panic!("inspect {name}: {err}"),
            };
            if objects.first().map_or(0, |object| object.waiters.len()) == count {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// One `EVAL` of `script` over an object's `keys`, as a command of a pipelined exchange
/// ([`lockkit_testkit::send_commands`]): for tests that drive the protocol's scripts directly, in
/// a `MULTI` where no time passes between them.
///
/// # Panics
/// For more than nine keys.
pub fn eval<'a>(script: &'a str, keys: &'a [String], args: &[&'a str]) -> Vec<&'a str> {
    let numkeys = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"][keys.len()];
    let mut command = vec!["EVAL", script, numkeys];
    command.extend(keys.iter().map(String::as_str));
    command.extend_from_slice(args);
    command
}

/// The integers of one script reply.
///
/// # Panics
/// When the reply is not an array of integers.
pub fn ints(reply: &lockkit_testkit::RespValue) -> Vec<i64> {
    match reply.as_array() {
        Some(items) => items
            .iter()
            .map(|v| {
                v.as_int()
                    .unwrap_or_else(|| panic!("not an integer: {v:?}"))
            })
            .collect(),
        None => panic!("not a script reply: {reply:?}"),
    }
}

/// A `TIME` reply (from [`lockkit_testkit::send_commands`]) in milliseconds: the server's clock,
/// for tests that wait for a server-side deadline to pass.
///
/// # Panics
/// When the reply is not a `TIME` reply.
pub fn server_ms(reply: &lockkit_testkit::RespValue) -> u64 {
    let part = |i: usize| {
        reply
            .as_array()
            .and_then(|time| time.get(i))
            .and_then(|part| part.as_str())
            .and_then(|part| part.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("not a TIME reply: {reply:?}"))
    };
    part(0) * 1000 + part(1) / 1000
}

/// A `tracing` subscriber that records the WARN (and ERROR) events of the thread it is the
/// default subscriber of (`tracing::subscriber::set_default`): for tests of lockkit's warnings.
#[derive(Clone, Default)]
pub struct Warnings(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Warnings {
    /// The events recorded since the last call, each as `field=value` pairs.
    ///
    /// # Panics
    /// If a thread panicked while recording.
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

struct FieldText(String);

impl tracing::field::Visit for FieldText {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={value:?} ", field.name()));
    }
}

impl tracing::Subscriber for Warnings {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut text = FieldText(String::new());
        event.record(&mut text);
        self.0.lock().unwrap().push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
