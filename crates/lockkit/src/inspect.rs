//! Read-only inspection of lockkit's objects in Redis: what an object is, who holds it, who
//! waits, and which objects exist. The `lockkit` command-line tool is built on it.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use fred::interfaces::{ClientLike, HashesInterface, KeysInterface};
use fred::prelude::Client as RedisClient;
use fred::types::{ClusterHash, CustomCommand};
use futures::{StreamExt, TryStreamExt};
use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::HoldEntry;
use lockkit_protocol::slot::key_slot;

use crate::client::Client;
use crate::election::Leader;
use crate::error::{command_error, redis as redis_failure, Error};

/// A snapshot of one object as it is in Redis, from [`Client::inspect`].
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use lockkit::protocol::keys::Kind;
///
/// // Who holds `order:42`, and for how much longer? (`None` would look at every kind.)
/// for found in client.inspect(Some(Kind::Lock), "order:42").await? {
///     println!("{} `{}` (key {}), lease left {:?}", found.kind.describe(), found.name, found.key, found.ttl);
///     for holder in &found.holders {
///         println!("  held {} time(s) by {}", holder.holds, holder.owner);
///     }
///     if !found.waiters.is_empty() {
///         println!("  {} waiting, longest first: {:?}", found.waiters.len(), found.waiters);
///     }
///     for warning in &found.warnings {
///         println!("  warning: {warning}");
///     }
/// }
/// # Ok(()) }
/// ```
///
/// Fields that do not apply to the object's kind are empty or `None`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[doc = ""]
#[doc = "With the `serde` feature it implements `serde::Serialize`, giving what"]
#[doc = "`lockkit inspect --json` prints: `kind` as its key segment (`\"lock\"`, `\"fenced\"`, ...),"]
#[doc = "`ttl` as `ttl_ms` and a holder's `lease` as `lease_ms` (whole milliseconds, `null` for none)."]
#[non_exhaustive]
pub struct Inspection {
    /// The object's kind.
    #[cfg_attr(feature = "serde", serde(serialize_with = "serde_fields::kind"))]
    pub kind: Kind,
    /// The object's name.
    pub name: String,
    /// The object's main Redis key.
    pub key: String,
    /// The main key's remaining time to live: the lease of a held lock. `None` when the main key
    /// does not exist or never expires.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "ttl_ms", serialize_with = "serde_fields::millis")
    )]
    pub ttl: Option<Duration>,
    /// Who holds the object, and how many times (or how many permits).
    pub holders: Vec<Holder>,
    /// The owners waiting for the object: a fair lock's queue in grant order, a lock's or fenced
    /// lock's waiting set, longest waiting first; for a semaphore or permit-expirable semaphore,
    /// its line, head first, each waiting call as `<hold marker> for <k>` (the permits it asks
    /// for); for a read-write lock, its line, head first, each waiting call as `<owner> for read`
    /// or `<owner> for write`. Only waiters whose keep-alive has not run out (a waiter that gave
    /// up leaves at once, one whose client died once its keep-alive passed). For a rate limiter,
    /// its reservations still to come (callers sleeping until their moment, which is already
    /// theirs), soonest first, each as `<client id> in <n>ms`: the id of the client whose call
    /// waits, and how far ahead its permits are admitted, on the server's clock. Empty for the
    /// other kinds, whose waiters Redis does not keep: see
    /// [`waiters_listed`](Inspection::waiters_listed) and
    /// [`waiting_clients`](Inspection::waiting_clients).
    pub waiters: Vec<String>,
    /// Whether [`waiters`](Inspection::waiters) lists this kind's waiters: `true` for a lock,
    /// fenced lock, fair lock, read-write lock, both semaphores and a rate limiter, whose waiters
    /// are kept in Redis. A count-down latch's waiters wait in their own clients for a message on the
    /// object's channel, and a spin lock's poll: Redis has no list of them, and `waiters` is
    /// empty however many there are.
    pub waiters_listed: bool,
    /// For a count-down latch: how
    /// many clients are subscribed to the object's channel (`PUBSUB NUMSUB`, or
    /// `PUBSUB SHARDNUMSUB` with sharded pub/sub), that is clients with one or more tasks
    /// waiting for it now, or until a moment ago (a client keeps an idle subscription for
    /// about two seconds), or watching it (`lockkit watch`). Tasks are not counted: one
    /// client may have many waiting. `None` for the other kinds, and where it cannot be
    /// counted (classic pub/sub on a cluster, whose subscribers may be on any node; a server
    /// that refused the command).
    pub waiting_clients: Option<u64>,
    /// A fenced lock's fencing counter: the last token minted.
    pub fencing_token: Option<u64>,
    /// A read-write lock's mode: `"read"` or `"write"`.
    pub mode: Option<String>,
    /// A semaphore's total number of permits (`None` when never set).
    pub permits: Option<u64>,
    /// A semaphore's permits in use by live holds.
    pub used_permits: Option<u64>,
    /// A count-down latch's count.
    pub count: Option<u64>,
    /// A rate limiter's stored limit: permits per interval, burst and mode, as
    /// [`RateLimiter::limit`](crate::RateLimiter::limit) reads it. `None` when no limit is stored
    /// (the next request of a handle configured with
    /// [`with_limit`](crate::RateLimiter::with_limit) stores one), and for the other kinds.
    ///
    /// With the `serde` feature: `"rate_limit": {"permits": .., "interval_ms": .., "burst": ..,
    /// "mode": "overall" | "per_client"}`, or `null`.
    #[cfg_attr(feature = "serde", serde(serialize_with = "serde_fields::rate_limit"))]
    pub rate_limit: Option<crate::RateLimit>,
    /// A rate limiter's permits that one request could take now, at most the burst + 1 (as
    /// [`RateLimiter::available`](crate::RateLimiter::available) counts them). In the per-client
    /// mode each client has a schedule of its own, and this is what a client that has asked
    /// nothing within the last interval could take. `None` when no limit is stored, and for
    /// the other kinds.
    pub available: Option<u64>,
    /// A semaphore's count of repairs after an eviction: how many times a script found one of
    /// its two keys evicted (by a `maxmemory-policy` of `allkeys-*`) and dropped the holds that
    /// were left without it. `None` when that never happened. See `docs/topologies.md`.
    pub evictions: Option<u64>,
    /// An election's leader: the term and value it announced, as
    /// [`Election::leader`](crate::Election::leader) reads them (the leader record, answered
    /// only while the record's hold is live and its term is not older than one this client has
    /// seen lead). `None` when nobody leads, or when a candidate was granted the leadership (it
    /// is in [`holders`](Inspection::holders)) but has not announced itself yet; `None` for the
    /// other kinds.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use lockkit::protocol::keys::Kind;
    ///
    /// for election in client.inspect(Some(Kind::Election), "scheduler").await? {
    ///     match &election.leader {
    ///         Some(leader) => println!("{} leads, term {}", leader.value, leader.term),
    ///         None if election.holders.is_empty() => println!("nobody leads"),
    ///         None => println!("a leader was granted but has not announced itself yet"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// With the `serde` feature: `"leader": {"term": .., "value": ..}`, or `null`.
    pub leader: Option<Leader>,
    /// Problems noticed while reading the object, in words for people (the CLI prints them).
    /// For a semaphore: the server's `maxmemory-policy` may evict one of its keys (an
    /// `allkeys-*` policy), or the policy could not be read (neither `CONFIG GET` nor
    /// `INFO memory` answered, as on services that block them; the line names both and why);
    /// one of its keys is missing now (an eviction the next script will repair); it was
    /// repaired after an eviction before. Empty when nothing was noticed.
    pub warnings: Vec<String>,
}

/// One holder of an object, in an [`Inspection`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[doc = ""]
#[doc = "With the `serde` feature it implements `serde::Serialize` (see [`Inspection`])."]
#[non_exhaustive]
pub struct Holder {
    /// The owner id, `<client id>:<sequence>`: one plain acquire and the re-entries made in its
    /// scope (one client holds a lock at most once per such owner); for a spin lock or a
    /// semaphore, the hold's marker (a
    /// permit-expirable semaphore's permit id); for a once-per-window mark, the mark of the call
    /// that ran the job (`<client id>:<sequence>`), held until the window ends.
    pub owner: String,
    /// The owner's hold count (for a lock, fenced lock or fair lock: its holds whose own lease has
    /// not run out); for a semaphore hold, the permits it took.
    pub holds: u64,
    /// For a read-write lock: `"read"` or `"write"`.
    pub access: Option<String>,
    /// What is left of the hold's lease (`None`: no expiry); for an owner with several holds of
    /// a lock, fenced lock or fair lock, of the latest one's.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "lease_ms", serialize_with = "serde_fields::millis")
    )]
    pub lease: Option<Duration>,
}

/// An object found by [`Client::list`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[doc = ""]
#[doc = "With the `serde` feature it implements `serde::Serialize`, giving what `lockkit list --json`"]
#[doc = "prints for it: `{\"kind\": \"lock\", \"name\": \"order:42\"}`."]
#[non_exhaustive]
pub struct ListedObject {
    /// The object's kind.
    #[cfg_attr(feature = "serde", serde(serialize_with = "serde_fields::kind"))]
    pub kind: Kind,
    /// The object's name.
    pub name: String,
}

impl Client {
    /// Reads the object called `name` from Redis, without changing anything: its kind, holders
    /// and hold counts, TTL, queued waiters and, per kind, its fencing counter, mode, permits,
    /// count, leader, or rate limit and available permits.
    ///
    /// With a `kind`, looks at that kind only; without one, at every kind, since objects of
    /// different kinds may share a name. Returns the objects that exist (any of their keys is
    /// in Redis), so an empty vector means there is no such object. A name that is not valid is
    /// [`Error::InvalidArgument`]; a key holding a value of another type, [`Error::WrongType`].
    ///
    /// The snapshot is taken with a few commands, not atomically: it may mix states of an object
    /// that changes while it is read.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// for object in client.inspect(None, "order:42").await? {
    ///     println!("{} held by {:?}", object.kind.describe(), object.holders);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, kind: Option<Kind>, name: &str) -> Result<Vec<Inspection>, Error> {
        self.inner.check_open()?;
        let kinds: Vec<Kind> = kind.map_or_else(|| Kind::ALL.to_vec(), |kind| vec![kind]);
        let namespace = &self.inner.settings.namespace;
        let objects = kinds
            .into_iter()
            .map(|kind| Ok((kind, namespace.object(kind, name)?)))
            .collect::<Result<Vec<(Kind, ObjectKeys)>, Error>>()?;
        let redis = self.inner.exec.redis();
        let found = futures::future::try_join_all(objects.iter().map(|(kind, keys)| async move {
            let count: i64 = redis
                .exists(keys.keys.clone())
                .await
                .map_err(command_error("inspect", &keys.key, *kind))?;
            Ok::<bool, Error>(count > 0)
        }))
        .await?;
        let sharded = self.inner.settings.pubsub == crate::client::PubSubMode::Sharded;
        let mut inspections = Vec::new();
        for ((kind, keys), found) in objects.iter().zip(found) {
            if found {
                let mut inspection = read(redis, *kind, name, keys, sharded).await?;
                if *kind == Kind::Election {
                    // The leader record, read as `Election::leader` reads it (its script, its
                    // checks), not a second copy of that read here.
                    inspection.leader = self.election(name).leader().await?;
                }
                if *kind == Kind::RateLimiter {
                    // The limit and what is available, read as `RateLimiter::limit` and
                    // `available` read them (the read-only status script).
                    let status = self.rate_limiter(name).status("inspect").await?;
                    if let Some(stored) = status.limit {
                        match crate::rate_limiter::stored_limit(stored) {
                            Ok(limit) => inspection.rate_limit = Some(limit),
                            Err(why) => inspection.warnings.push(format!(
                                "the stored limit ({} per {} ms, burst {}) is not one this \
                                 version can use: {why}",
                                stored.rate, stored.interval_ms, stored.burst
                            )),
                        }
                        inspection.available = Some(status.available);
                    }
                }
                inspections.push(inspection);
            }
        }
        tracing::debug!(name, found = inspections.len(), "inspected");
        Ok(inspections)
    }

    /// Lists the objects of this client's key prefix whose name matches `pattern`, by
    /// `SCAN` (never `KEYS`, so Redis stays responsive however many keys it holds); on a cluster,
    /// every primary is scanned.
    ///
    /// `pattern` is a glob over the object names: `*` matches any run of characters, `?` any one
    /// character, `\` escapes the next one; `None` lists everything. An object is listed once
    /// per kind when any of its keys exists. The result is sorted by kind, then name. Like any
    /// `SCAN`, a key created or deleted during the listing may or may not be in it.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// for object in client.list(Some("order:*")).await? {
    ///     println!("{} {}", object.kind.describe(), object.name);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn list(&self, pattern: Option<&str>) -> Result<Vec<ListedObject>, Error> {
        self.inner.check_open()?;
        let namespace = &self.inner.settings.namespace;
        let redis = self.inner.exec.redis();
        let matching = format!("{}:*", glob_escape(namespace.prefix()));
        let keys = if redis.is_clustered() {
            redis
                .scan_cluster_buffered(matching, Some(1000), None)
                .boxed()
        } else {
            redis.scan_buffered(matching, Some(1000), None).boxed()
        };
        let keys: Vec<fred::types::Key> =
            keys.try_collect().await.map_err(redis_failure("list"))?;
        let mut objects = HashSet::new();
        for key in &keys {
            let Some(parsed) = key.as_str().and_then(|key| namespace.parse(key)) else {
                continue;
            };
            if pattern.is_none_or(|pattern| glob_match(pattern, &parsed.name)) {
                objects.insert(ListedObject {
                    kind: parsed.kind,
                    name: parsed.name,
                });
            }
        }
        tracing::debug!(scanned = keys.len(), listed = objects.len(), "listed");
        let mut objects: Vec<ListedObject> = objects.into_iter().collect();
        objects.sort_by(|a, b| {
            let rank = |kind: Kind| Kind::ALL.iter().position(|other| *other == kind);
            (rank(a.kind), &a.name).cmp(&(rank(b.kind), &b.name))
        });
        Ok(objects)
    }
}

/// Runs a command that fred has no typed method for (with the features lockkit enables) on
/// `key`'s node.
async fn custom(
    redis: &RedisClient,
    kind: Kind,
    command: &'static str,
    key: &str,
    args: &[&str],
) -> Result<Vec<String>, Error> {
    let mut frame = Vec::with_capacity(1 + args.len());
    frame.push(key.to_owned());
    frame.extend(args.iter().map(|arg| (*arg).to_owned()));
    redis
        .custom::<Vec<String>, String>(
            CustomCommand::new_static(command, ClusterHash::Custom(key_slot(key)), false),
            frame,
        )
        .await
        .map_err(command_error("inspect", key, kind))
}

/// The server's clock of `key`'s node, in milliseconds.
async fn now_ms(redis: &RedisClient, key: &str) -> Result<u64, Error> {
    let time: Vec<String> = redis
        .custom(
            CustomCommand::new_static("TIME", ClusterHash::Custom(key_slot(key)), false),
            Vec::<String>::new(),
        )
        .await
        .map_err(redis_failure("inspect"))?;
    let part = |index: usize| time.get(index).and_then(|value| value.parse::<u64>().ok());
    match (part(0), part(1)) {
        (Some(seconds), Some(micros)) => Ok(seconds * 1000 + micros / 1000),
        _ => Err(Error::Protocol(lockkit_protocol::DecodeError {
            script: "TIME",
            detail: format!("{time:?}: not seconds and microseconds"),
        })),
    }
}

/// `ZRANGE key 0 -1 WITHSCORES` as (member, score) pairs, lowest score first.
async fn scored(redis: &RedisClient, kind: Kind, key: &str) -> Result<Vec<(String, f64)>, Error> {
    let flat = custom(redis, kind, "ZRANGE", key, &["0", "-1", "WITHSCORES"]).await?;
    Ok(flat
        .chunks_exact(2)
        .map(|pair| (pair[0].clone(), pair[1].parse::<f64>().unwrap_or(0.0)))
        .collect())
}

/// What is left until `end_ms` (server ms) at `now_ms`.
fn left(end_ms: f64, now_ms: u64) -> Option<Duration> {
    if end_ms.is_finite() {
        Some(Duration::from_millis(
            (end_ms.max(0.0) as u64).saturating_sub(now_ms),
        ))
    } else {
        None
    }
}

/// The holders of a lock hash at server time `now`: one per owner with a live hold, with its
/// number of live holds and what is left of the latest one's lease. Holds whose own lease ran out
/// are not counted (the next script ends them).
fn lock_holders(fields: &HashMap<String, String>, now: u64) -> Vec<Holder> {
    let mut holders: Vec<Holder> = Vec::new();
    for (field, value) in fields {
        let Some(hold) = HoldEntry::parse(field, value) else {
            continue;
        };
        if hold.expiry_ms <= now {
            continue;
        }
        let lease = Duration::from_millis(hold.expiry_ms - now);
        match holders.iter_mut().find(|holder| holder.owner == hold.owner) {
            Some(holder) => {
                holder.holds += 1;
                holder.lease = holder.lease.max(Some(lease));
            }
            None => holders.push(Holder {
                owner: hold.owner,
                holds: 1,
                access: None,
                lease: Some(lease),
            }),
        }
    }
    holders.sort_by(|a, b| a.owner.cmp(&b.owner));
    holders
}

/// How many clients are subscribed to `channel` (sharded: by `SSUBSCRIBE`), asked of the node of
/// the channel's slot; `None` when that cannot tell (classic pub/sub on a cluster: subscribers may
/// be on any node) or the server refused.
async fn subscribed_clients(redis: &RedisClient, channel: &str, sharded: bool) -> Option<u64> {
    if redis.is_clustered() && !sharded {
        return None;
    }
    let subcommand = if sharded { "SHARDNUMSUB" } else { "NUMSUB" };
    let reply: Result<Vec<fred::types::Value>, _> = redis
        .custom(
            CustomCommand::new_static("PUBSUB", ClusterHash::Custom(key_slot(channel)), false),
            vec![subcommand, channel],
        )
        .await;
    match reply {
        // `[channel, count]`.
        Ok(reply) => reply.get(1).and_then(fred::types::Value::as_u64),
        Err(err) => {
            tracing::debug!(
                channel,
                "inspect: cannot count the subscribers: {}",
                crate::error::Chain(&err)
            );
            None
        }
    }
}

/// Reads one object known to exist (`sharded`: the client's pub/sub mode is sharded).
async fn read(
    redis: &RedisClient,
    kind: Kind,
    name: &str,
    keys: &ObjectKeys,
    sharded: bool,
) -> Result<Inspection, Error> {
    let key = keys.key.as_str();
    // Every kind read below has the auxiliary keys asked for (`Kind::aux_suffixes`).
    let aux = |suffix: &str| keys.aux(suffix).unwrap_or_default().to_owned();
    let pttl: i64 = redis
        .pttl(key)
        .await
        .map_err(command_error("inspect", key, kind))?;
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    let mut inspection = Inspection {
        kind,
        name: name.to_owned(),
        key: key.to_owned(),
        ttl,
        holders: Vec::new(),
        waiters: Vec::new(),
        waiters_listed: matches!(
            kind,
            Kind::Lock
                | Kind::FencedLock
                | Kind::FairLock
                | Kind::Election
                | Kind::ReadWriteLock
                | Kind::Semaphore
                | Kind::PermitExpirableSemaphore
                | Kind::RateLimiter
        ),
        waiting_clients: None,
        fencing_token: None,
        mode: None,
        permits: None,
        used_permits: None,
        count: None,
        rate_limit: None,
        available: None,
        evictions: None,
        leader: None,
        warnings: Vec::new(),
    };
    let number = |value: Option<&String>| value.and_then(|value| value.parse::<u64>().ok());
    match kind {
        Kind::SpinLock | Kind::OnceMark | Kind::CountDownLatch => {
            let value: Option<String> = redis
                .get(key)
                .await
                .map_err(command_error("inspect", key, kind))?;
            if kind == Kind::CountDownLatch {
                inspection.count = number(value.as_ref());
            } else if let Some(marker) = value {
                inspection.holders.push(Holder {
                    owner: marker,
                    holds: 1,
                    access: None,
                    lease: ttl,
                });
            }
        }
        // An election's leadership is a fenced hold of its main key: read as a fenced lock.
        Kind::Lock | Kind::FencedLock | Kind::FairLock | Kind::Election => {
            let fields: HashMap<String, String> = redis
                .hgetall(key)
                .await
                .map_err(command_error("inspect", key, kind))?;
            let now = now_ms(redis, key).await?;
            inspection.holders = lock_holders(&fields, now);
            let waiting = if kind == Kind::FairLock {
                custom(redis, kind, "LRANGE", &aux("queue"), &["0", "-1"]).await?
            } else {
                scored(redis, kind, &aux("waiting"))
                    .await?
                    .into_iter()
                    .map(|(owner, _)| owner)
                    .collect()
            };
            inspection.waiters = live(redis, kind, &aux("timeouts"), waiting, now)
                .await?
                .into_iter()
                // A lock's waiting entry is a request, `<marker> <lease> <owner> <channel>`.
                .map(|waiter| match kind {
                    Kind::FairLock => waiter,
                    _ => waiter
                        .split(' ')
                        .nth(2)
                        .map_or(waiter.clone(), str::to_owned),
                })
                .collect();
            if matches!(kind, Kind::FencedLock | Kind::Election) {
                let token_key = aux("token");
                let token: Option<String> = redis
                    .get(token_key.as_str())
                    .await
                    .map_err(command_error("inspect", &token_key, kind))?;
                inspection.fencing_token = number(token.as_ref());
            }
        }
        Kind::ReadWriteLock => {
            let fields: HashMap<String, String> = redis
                .hgetall(key)
                .await
                .map_err(command_error("inspect", key, kind))?;
            let expiries = aux("expiries");
            let ends = scored(redis, kind, &expiries).await?;
            let now = now_ms(redis, key).await?;
            inspection.mode = fields.get("mode").cloned();
            let mut holders: Vec<Holder> = fields
                .iter()
                .filter_map(|(field, count)| {
                    let (access, owner) = match field.split_once(':') {
                        Some(("r", owner)) => ("read", owner),
                        Some(("w", owner)) => ("write", owner),
                        _ => return None,
                    };
                    // The hold's lease: the latest expiry among the markers counted in this field.
                    let end = ends
                        .iter()
                        .filter(|(marker, _)| fields.get(marker) == Some(field))
                        .map(|(_, end)| *end)
                        .fold(None, |latest: Option<f64>, end| {
                            Some(latest.map_or(end, |latest| latest.max(end)))
                        });
                    Some(Holder {
                        owner: owner.to_owned(),
                        holds: number(Some(count)).unwrap_or(0),
                        access: Some(access.to_owned()),
                        lease: end.and_then(|end| left(end, now)),
                    })
                })
                .collect();
            holders.sort_by(|a, b| (&a.access, &a.owner).cmp(&(&b.access, &b.owner)));
            inspection.holders = holders;
            // The line: requests `<marker> <lease> <r|w>:<owner> <channel>` (scripts/line_lib.lua).
            let line = scored(redis, kind, &aux("waiting"))
                .await?
                .into_iter()
                .map(|(request, _)| request)
                .collect();
            inspection.waiters = live(redis, kind, &aux("timeouts"), line, now)
                .await?
                .into_iter()
                .map(|request| match request.split(' ').nth(2) {
                    Some(ask) => match ask.split_once(':') {
                        Some(("r", owner)) => format!("{owner} for read"),
                        Some(("w", owner)) => format!("{owner} for write"),
                        _ => request.clone(),
                    },
                    None => request.clone(),
                })
                .collect();
        }
        Kind::Semaphore | Kind::PermitExpirableSemaphore => {
            let fields: HashMap<String, String> = redis
                .hgetall(key)
                .await
                .map_err(command_error("inspect", key, kind))?;
            let leases = aux("leases");
            let ends = scored(redis, kind, &leases).await?;
            let now = now_ms(redis, key).await?;
            inspection.permits = number(fields.get("permits"));
            inspection.used_permits = Some(number(fields.get("used")).unwrap_or(0));
            inspection.evictions = number(fields.get("evicted"));
            inspection.warnings = semaphore_warnings(redis, kind, key, &inspection, &ends).await;
            // The line: requests `<marker> <lease> <permits> <channel>` (scripts/line_lib.lua).
            let line = scored(redis, kind, &aux("waiting"))
                .await?
                .into_iter()
                .map(|(request, _)| request)
                .collect();
            inspection.waiters = live(redis, kind, &aux("timeouts"), line, now)
                .await?
                .into_iter()
                .map(|request| {
                    let mut fields = request.split(' ');
                    match (fields.next(), fields.nth(1)) {
                        (Some(marker), Some(permits)) => format!("{marker} for {permits}"),
                        _ => request.clone(),
                    }
                })
                .collect();
            // Live holds only: an ended lease is given back by the next script that runs.
            inspection.holders = ends
                .iter()
                .filter(|(_, end)| *end > now as f64)
                .map(|(marker, end)| Holder {
                    owner: marker.clone(),
                    holds: number(fields.get(marker)).unwrap_or(0),
                    access: None,
                    lease: left(*end, now),
                })
                .collect();
        }
        Kind::RateLimiter => {
            // The reservations still to come: member = the request's marker,
            // `#<client id>:<sequence>`, score = its moment (server ms). An entry already past
            // is admitted (the next request drops it).
            let now = now_ms(redis, key).await?;
            inspection.waiters = scored(redis, kind, &aux("waiting"))
                .await?
                .into_iter()
                .filter(|(_, at)| *at >= now as f64)
                .map(|(marker, at)| {
                    let client = marker
                        .strip_prefix('#')
                        .and_then(|owner| owner.rsplit_once(':'))
                        .map_or(marker.as_str(), |(client, _)| client);
                    let ahead = (at.max(0.0) as u64).saturating_sub(now);
                    format!("{client} in {ahead}ms")
                })
                .collect();
            // The limit and what is available: read by `Client::inspect` with the status script.
        }
        // A kind this version cannot read in detail: its TTL only.
        _ => {}
    }
    // The kinds whose waiters wait for a message on the object's channel, kept by no key.
    if kind == Kind::CountDownLatch {
        inspection.waiting_clients = subscribed_clients(redis, &keys.channel, sharded).await;
    }
    Ok(inspection)
}

/// The entries of `waiting` (in order) whose keep-alive deadline in the `timeouts` ZSET has not
/// passed by `now`: an entry past it belongs to a waiter that is gone (the next script drops it).
async fn live(
    redis: &RedisClient,
    kind: Kind,
    timeouts: &str,
    waiting: Vec<String>,
    now: u64,
) -> Result<Vec<String>, Error> {
    let deadlines: HashMap<String, f64> =
        scored(redis, kind, timeouts).await?.into_iter().collect();
    Ok(waiting
        .into_iter()
        .filter(|waiter| deadlines.get(waiter).is_some_and(|end| *end > now as f64))
        .collect())
}

/// What is wrong, or at risk, with a semaphore read into `inspection` (`ends`: its leases).
async fn semaphore_warnings(
    redis: &RedisClient,
    kind: Kind,
    key: &str,
    inspection: &Inspection,
    ends: &[(String, f64)],
) -> Vec<String> {
    let mut warnings = Vec::new();
    match maxmemory_policy(redis, key).await {
        Ok(policy) if policy.starts_with("allkeys-") => warnings.push(format!(
            "maxmemory-policy is {policy}: Redis may evict one of this {}'s two keys (neither \
             expires) and lose permits; use noeviction or a volatile-* policy \
             (docs/topologies.md)",
            kind.describe()
        )),
        Ok(_) => {}
        Err(why) => warnings.push(format!(
            "could not read the server's maxmemory-policy, so whether it may evict this {}'s \
             keys is unknown: {why}",
            kind.describe()
        )),
    }
    let used = inspection.used_permits.unwrap_or(0);
    if inspection.permits.is_some() && used > 0 && ends.is_empty() {
        warnings.push(format!(
            "{used} permits are counted as used but the leases key is missing (evicted?): the \
             next operation on it drops those holds and gives their permits back"
        ));
    }
    if inspection.permits.is_none() && !ends.is_empty() {
        warnings.push(
            "holds are leased but the total is missing (main key evicted?): the next operation \
             on it drops those holds; the total must be set again"
                .to_owned(),
        );
    }
    if let Some(evictions) = inspection.evictions {
        warnings.push(format!(
            "one of its keys was found evicted {evictions} time(s); the holds left without it \
             were dropped"
        ));
    }
    warnings
}

/// The `maxmemory-policy` of `key`'s node: by `CONFIG GET`, else (`CONFIG` renamed or refused
/// by an ACL, as on many managed services) from `INFO memory`, which those services allow. When
/// neither answers, says why, naming both commands.
async fn maxmemory_policy(redis: &RedisClient, key: &str) -> Result<String, String> {
    let on_node =
        |command| CustomCommand::new_static(command, ClusterHash::Custom(key_slot(key)), false);
    let config: Result<HashMap<String, String>, _> = redis
        .custom(on_node("CONFIG"), vec!["GET", "maxmemory-policy"])
        .await;
    let config_failed = match config {
        Ok(mut config) => match config.remove("maxmemory-policy") {
            Some(policy) => return Ok(policy),
            None => "CONFIG GET maxmemory-policy answered without it".to_owned(),
        },
        Err(err) => format!(
            "CONFIG GET maxmemory-policy failed ({})",
            crate::error::fred_reason(&err)
        ),
    };
    let info: Result<String, _> = redis.custom(on_node("INFO"), vec!["memory"]).await;
    let info_failed = match info {
        Ok(info) => match info_field(&info, "maxmemory_policy") {
            Some(policy) => {
                tracing::debug!("inspect: {config_failed}; read maxmemory_policy from INFO memory");
                return Ok(policy.to_owned());
            }
            None => "INFO memory has no maxmemory_policy".to_owned(),
        },
        Err(err) => format!("INFO memory failed ({})", crate::error::fred_reason(&err)),
    };
    Err(format!("{config_failed}, and {info_failed}"))
}

/// The value of `field` in an `INFO` reply (`field:value` lines).
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines()
        .filter_map(|line| line.trim_end_matches('\r').split_once(':'))
        .find(|(name, _)| *name == field)
        .map(|(_, value)| value.trim())
}

/// `text` with the glob characters of Redis' `MATCH` escaped.
fn glob_escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// Whether `text` matches the glob `pattern` (`*`, `?`, `\` escapes).
pub(crate) fn glob_match(pattern: &str, text: &str) -> bool {
    let pattern: Vec<char> = pattern.chars().collect();
    let text: Vec<char> = text.chars().collect();
    // Iterative matching with backtracking to the last `*`.
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        match pattern.get(p) {
            Some('*') => {
                star = Some((p, t));
                p += 1;
                continue;
            }
            Some('?') => {
                p += 1;
                t += 1;
                continue;
            }
            Some('\\') if pattern.get(p + 1) == Some(&text[t]) => {
                p += 2;
                t += 1;
                continue;
            }
            Some(c) if *c != '\\' && *c == text[t] => {
                p += 1;
                t += 1;
                continue;
            }
            _ => {}
        }
        match star {
            Some((star_p, star_t)) => {
                p = star_p + 1;
                t = star_t + 1;
                star = Some((star_p, star_t + 1));
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|c| *c == '*')
}

/// How the `serde` feature writes the fields that have no `Serialize` of their own, as the CLI's
/// JSON has them.
#[cfg(feature = "serde")]
mod serde_fields {
    use std::time::Duration;

    use lockkit_protocol::keys::Kind;

    /// A kind as its key segment (`"lock"`, `"fenced"`, ...).
    pub(super) fn kind<S: serde::Serializer>(
        kind: &Kind,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(kind.segment())
    }

    /// A rate limit as `{"permits", "interval_ms", "burst", "mode"}`, `None` as none.
    pub(super) fn rate_limit<S: serde::Serializer>(
        limit: &Option<crate::RateLimit>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let Some(limit) = limit else {
            return serializer.serialize_none();
        };
        let mut fields = serializer.serialize_struct("RateLimit", 4)?;
        fields.serialize_field("permits", &limit.permits())?;
        fields.serialize_field(
            "interval_ms",
            &u64::try_from(limit.interval().as_millis()).unwrap_or(u64::MAX),
        )?;
        fields.serialize_field("burst", &limit.burst())?;
        fields.serialize_field(
            "mode",
            match limit.mode() {
                crate::RateMode::PerClient => lockkit_protocol::rate_limiter::MODE_PER_CLIENT,
                crate::RateMode::Overall => lockkit_protocol::rate_limiter::MODE_OVERALL,
            },
        )?;
        fields.end()
    }

    /// A duration as whole milliseconds (saturating), `None` as none.
    pub(super) fn millis<S: serde::Serializer>(
        duration: &Option<Duration>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        match duration {
            Some(duration) => {
                serializer.serialize_some(&u64::try_from(duration.as_millis()).unwrap_or(u64::MAX))
            }
            None => serializer.serialize_none(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{glob_match, info_field};

    #[test]
    fn info_fields() {
        let info = "# Memory\r\nused_memory:1024\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(info_field(info, "maxmemory_policy"), Some("allkeys-lru"));
        assert_eq!(info_field(info, "maxmemory"), None);
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("order:*", "order:42"));
        assert!(!glob_match("order:*", "cart:42"));
        assert!(glob_match("*:4?", "order:42"));
        assert!(!glob_match("*:4?", "order:4"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "aXXbYY"));
        assert!(glob_match(r"a\*", "a*"));
        assert!(!glob_match(r"a\*", "ab"));
        assert!(glob_match("exact", "exact"));
        assert!(!glob_match("exact", "exactly"));
    }
}
