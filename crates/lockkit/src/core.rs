//! The client's core: the state shared by every handle, guard and background task of one client,
//! and the settings and limits fixed when it is built.
//!
//! Dependencies point one way: the primitives (`lock.rs`, `semaphore.rs`, ...) and the shared
//! mechanisms (`acquire.rs`, `hold.rs`, `watchdog.rs`, `waiters/`, `owner.rs`) depend on this
//! core; the [`Client`](crate::Client) facade (`client.rs`) builds the core and hands out the
//! primitives. Nothing here names a primitive or the facade.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::keys::Namespace;
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::exec::Exec;
use crate::owner::{self, Taken};
use crate::replica::ReplicaPolicy;
use crate::waiters::WaiterHub;
use crate::watchdog::Watchdog;

/// How release notifications travel between clients: which pub/sub flavour the waiter hub
/// subscribes with and the release scripts publish with.
///
/// All clients of one deployment must use the same mode: a waiter subscribed with `SSUBSCRIBE`
/// does not hear a `PUBLISH`, and the other way round. A missed notification costs a waiter at
/// most the [recheck interval](crate::ClientBuilder::recheck_interval) (it looks again then),
/// never a hang, but it turns event-driven waiting into polling.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockkit::Error> {
/// use lockkit::{Client, PubSubMode};
///
/// // Every client of the deployment is built with the same explicit mode (they must agree),
/// // here classic pub/sub on a cluster, where `Auto` would pick sharded pub/sub.
/// let client = Client::builder()
///     .url("redis-cluster://10.0.0.1:7001?node=10.0.0.2:7002&node=10.0.0.3:7003")
///     .pubsub(PubSubMode::Classic)
///     .build()
///     .await?;
/// assert_eq!(client.pubsub_mode(), PubSubMode::Classic);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PubSubMode {
    /// Sharded pub/sub on a Redis Cluster whose servers support it (Redis 7.0 and later, found
    /// by probing `COMMAND INFO SSUBSCRIBE` when the client is built); classic pub/sub on a
    /// single server, through Sentinel, and on older clusters. The default.
    #[default]
    Auto,
    /// `SUBSCRIBE` / `PUBLISH`. On a cluster every message is broadcast to every node.
    Classic,
    /// `SSUBSCRIBE` / `SPUBLISH` (Redis 7.0 and later): on a cluster a message stays on the
    /// shard that owns the object's slot. Building the client fails if the server does not know
    /// `SSUBSCRIBE`.
    Sharded,
}

/// Settings fixed when the client is built.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    pub(crate) watchdog_timeout: Duration,
    /// The longest a waiting call sleeps without looking again
    /// ([`ClientBuilder::recheck_interval`](crate::ClientBuilder::recheck_interval)).
    pub(crate) recheck_interval: Duration,
    pub(crate) namespace: Namespace,
    /// The resolved mode: [`PubSubMode::Classic`] or [`PubSubMode::Sharded`], never `Auto`.
    pub(crate) pubsub: PubSubMode,
    /// The replica acknowledgement policy; `None`: no `WAIT` after acquires.
    pub(crate) replica_ack: Option<ReplicaPolicy>,
}

/// The state every handle, guard and background task of one client shares. Primitives depend on
/// this core; the [`Client`](crate::Client) facade builds it and hands out the primitives.
pub(crate) struct ClientInner {
    /// The client's random id, the first part of every owner id and hold marker.
    pub(crate) id: Arc<str>,
    pub(crate) settings: Settings,
    pub(crate) exec: Exec,
    pub(crate) hub: WaiterHub,
    pub(crate) watchdog: Watchdog,
    /// Cancelled by [`Client::shutdown`](crate::Client::shutdown).
    pub(crate) shutdown: CancellationToken,
    /// Cancelled when the last handle is gone (or at shutdown): stops the hub.
    closed: CancellationToken,
    sequence: AtomicU64,
    /// The lock holds each task took and has not released (self-wait warning, hold counts).
    pub(crate) taken: Taken,
    /// The total each counted object (by main key) was last configured with, set or resized to
    /// through this client: acquires pass it, so an object whose keys were lost is set up again
    /// with it (see [`ClientInner::configured_total`]).
    totals: parking_lot::Mutex<HashMap<String, u64>>,
    /// The limit each rate limiter (by main key) was last configured with or set to through this
    /// client: requests pass it, so a rate limiter whose limit was lost is set up again with it.
    rates: parking_lot::Mutex<HashMap<String, crate::RateLimit>>,
    /// The greatest term of each election (by main key) this client has seen lead, in a
    /// `leader()` answer or an observer's item: what it reports never goes back to a smaller
    /// one (see [`ClientInner::see_term`]). One entry per election the client read, kept for
    /// the client's lifetime (as `totals`).
    terms: parking_lot::Mutex<HashMap<String, u64>>,
}

impl ClientInner {
    pub(crate) fn new(
        id: Arc<str>,
        settings: Settings,
        exec: Exec,
        hub: WaiterHub,
        watchdog: Watchdog,
        closed: CancellationToken,
    ) -> Self {
        Self {
            id,
            settings,
            exec,
            hub,
            watchdog,
            shutdown: CancellationToken::new(),
            closed,
            sequence: AtomicU64::new(0),
            taken: Taken::default(),
            totals: parking_lot::Mutex::new(HashMap::new()),
            rates: parking_lot::Mutex::new(HashMap::new()),
            terms: parking_lot::Mutex::new(HashMap::new()),
        }
    }

    /// The greatest term this client has seen lead the election at `key` (0: none).
    pub(crate) fn seen_term(&self, key: &str) -> u64 {
        self.terms.lock().get(key).copied().unwrap_or(0)
    }

    /// Notes that `term` leads the election at `key`, as this client is about to report it;
    /// `false` (and nothing noted) when this client has already seen a greater term lead it: the
    /// data went back (a restore from an older snapshot, a failover to a replica that missed
    /// writes), and the smaller term must not be reported as the leader.
    pub(crate) fn see_term(&self, key: &str, term: u64) -> bool {
        let mut terms = self.terms.lock();
        match terms.get_mut(key) {
            Some(seen) if *seen > term => false,
            Some(seen) => {
                *seen = term;
                true
            }
            None => {
                terms.insert(key.to_owned(), term);
                true
            }
        }
    }

    /// The total remembered for the counted object at `key` (`None`: none configured, set or
    /// resized through this client).
    pub(crate) fn configured_total(&self, key: &str) -> Option<u64> {
        self.totals.lock().get(key).copied()
    }

    /// Remembers `total` for the counted object at `key`, in place of any earlier one.
    pub(crate) fn remember_total(&self, key: &str, total: u64) {
        self.totals.lock().insert(key.to_owned(), total);
    }

    /// The limit remembered for the rate limiter at `key`.
    pub(crate) fn configured_rate(&self, key: &str) -> Option<crate::RateLimit> {
        self.rates.lock().get(key).copied()
    }

    /// Remembers `limit` for the rate limiter at `key`, in place of any earlier one.
    pub(crate) fn remember_rate(&self, key: &str, limit: crate::RateLimit) {
        self.rates.lock().insert(key.to_owned(), limit);
    }

    /// Marks the client closed: the hub stops (the command connection closes with the watchdog).
    pub(crate) fn close(&self) {
        self.closed.cancel();
    }

    /// The owner an acquire of the object at `key` runs as: the holder's owner when it runs
    /// inside that holder's scope (re-entry), else a fresh owner of its own.
    pub(crate) fn owner_for(&self, key: &str) -> Arc<str> {
        owner::scoped(&self.id, key).unwrap_or_else(|| self.fresh_owner())
    }

    /// A new owner id, `<client id>:<sequence>`.
    pub(crate) fn fresh_owner(&self) -> Arc<str> {
        format!("{}:{}", self.id, self.next_sequence()).into()
    }

    /// The owners whose hold counts `hold_count()` adds up for the object at `key` in the
    /// calling context: the enclosing scope's owner, and the owners of holds the calling task
    /// took and has not released.
    pub(crate) fn current_owners(&self, key: &str) -> Vec<Arc<str>> {
        let mut owners = self.taken.current_owners(key);
        if let Some(owner) = owner::scoped(&self.id, key) {
            if !owners.contains(&owner) {
                owners.insert(0, owner);
            }
        }
        owners
    }

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
        // The last handle and guard are gone: close the command connection now, while the
        // program still runs, unless a release in the background still needs it (the watchdog's
        // worker closes it after that one).
        if self.watchdog.idle() {
            self.exec.quit_now();
        }
    }
}

/// Whether the client's connection to Redis is known to be down: set by the waiter hub when a
/// connection is lost (it logs the one warning of the outage), cleared when every lost connection
/// is back (it logs the one event of the recovery). The watchdog reads it to keep its failed
/// renewals out of the warnings while the outage is already reported.
#[derive(Debug, Default)]
pub(crate) struct Outage {
    down: std::sync::atomic::AtomicBool,
}

impl Outage {
    /// Marks the connection down; `true` if it was up (the outage is new).
    pub(crate) fn begin(&self) -> bool {
        !self.down.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Marks the connection back; `true` if it was down (an outage ended).
    pub(crate) fn end(&self) -> bool {
        self.down.swap(false, std::sync::atomic::Ordering::AcqRel)
    }

    /// Whether an outage is under way.
    pub(crate) fn is_down(&self) -> bool {
        self.down.load(std::sync::atomic::Ordering::Acquire)
    }
}
