//! Scale (issue 6, workloads 4 and 5): the watchdog with many holds, and many waiters on one
//! client.
//!
//! One process spawns one `redis-server` on a loopback port and runs everything on one
//! multi-thread tokio runtime.
//!
//! **Workload 5, waiters at scale** (runs first, so its memory reading is not blurred by memory
//! the allocator kept from workload 4): a *holder* client takes L = 1000 locks (watchdog mode);
//! a second, *waiting* client gets W = 10 tasks per lock (10,000) blocked in `lock()`. It reports
//!
//! - the connections the waiting client opened (`CLIENT LIST` on the server, diffed against the
//!   list before the client was built; each new connection with its last command and its number
//!   of channel subscriptions);
//! - memory per waiter: the resident set (`VmRSS` of `/proc/self/status`, the same counter as
//!   `/proc/self/statm`'s second field) before spawning the waiting tasks and once all are
//!   registered, divided by their number; it covers the task, its `lock()` future, the lock handle
//!   and the hub's registration;
//! - the drain: the holder releases its L locks one after the other (each `unlock()` awaited);
//!   every waiter that gets its lock releases it at once, so the next waiter of that lock gets it.
//!   Drain time: from the first release call until the last waiter's `lock()` returned. A handoff
//!   is from the previous holder's `unlock()` call to the next holder's `lock()` return (L × W of
//!   them); their mean, p50 and p99, and the drain time divided by L × W (the rate with L chains
//!   in parallel). Each lock has a counter of current holders (incremented after `lock()` returns,
//!   decremented before `unlock()` is called): a hold that finds it non-zero is an overlap.
//! - the commands each phase sent (`INFO commandstats` deltas), per waiter or per handoff.
//!
//! **Workload 4, watchdog at scale:** one client holds N = 10,000 locks in watchdog mode with a
//! short watchdog timeout (3 s: renewal every 1 s), for several renew batch sizes, then with the
//! default 30 s. It measures over K whole renewal periods, the window placed half a period off
//! the ticks (the watchdog's interval starts when the client is built): `EVALSHA` calls
//! (`cmdstat_evalsha` delta; nothing else sends scripts then) per tick against the target
//! `ceil(N / batch)`, the server's time in them per tick, and the process's CPU time per tick
//! (`getrusage(RUSAGE_SELF)` user + system; the server is another process). At the end, after
//! K ≥ 5 ticks, every guard must say `is_lost() == false` and every key must have `PTTL > 0`.
//!
//! **Workload 6, handoffs by direct grant at scale** (issue 20): one lock with 16 waiting workers
//! (16 clients, the W = 16 baseline) and with 1,000 (50 clients × 20), each worker looping lock,
//! unlock until 3,000 acquisitions were made, every one of them a handoff to a waiter; then 10,000
//! locks held by one client with one waiter each (10 clients), all released at once. It reports
//! the handoff rate against the W = 16 row, `PUBLISH` calls per acquisition, script calls per
//! acquisition, the subscribers of the lock's channel and of each client's own channel for it
//! (`PUBSUB NUMSUB`: a grant published there reaches exactly that client), and lockkit's warnings.
//!
//! Run: `cargo bench --bench scale`. Knobs: `LOCKKIT_BENCH_ONLY=waiters|watchdog|grants` runs one
//! workload; `LOCKKIT_BENCH_SKIP_30S=1` skips the 30 s row (about a minute);
//! `LOCKKIT_BENCH_PER_LOCK=<n>` sets the waiters per lock of workload 5 (default 10). Without `--bench`
//! (`cargo test --benches`) it runs a quick smoke pass: 100 holds, 10 locks × 10 waiters.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, KeysInterface};
use futures::future::join_all;
use lockkit::{Client, Lock, LockGuard};
use lockkit_suite::RedisServer;
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;

/// Sizes of one run (full or smoke).
#[derive(Debug, Clone, Copy)]
struct Sizes {
    /// Workload 4: holds renewed by one client.
    holds: usize,
    /// Workload 4: the short watchdog timeout.
    short_timeout: Duration,
    /// Workload 4: renewal periods measured.
    ticks: u32,
    /// Workload 4: renew batch sizes measured with the short timeout (the default first).
    batches: &'static [usize],
    /// Workload 4: also measure the default 30 s watchdog timeout.
    default_timeout_row: bool,
    /// Workload 5: locks held by the other client.
    locks: usize,
    /// Workload 5: waiting tasks per lock.
    per_lock: usize,
    /// Workload 6: the one-lock rows, (clients, waiting tasks per client), the W = 16 baseline
    /// first.
    one_lock: &'static [(usize, usize)],
    /// Workload 6: acquisitions per one-lock row.
    acquisitions: usize,
    /// Workload 6: the many-locks row, (locks, clients): one waiter per lock.
    many_locks: (usize, usize),
}

const FULL: Sizes = Sizes {
    holds: 10_000,
    short_timeout: Duration::from_secs(3),
    ticks: 6,
    batches: &[256, 64, 1024],
    default_timeout_row: true,
    locks: 1000,
    per_lock: 10,
    one_lock: &[(16, 1), (50, 20)],
    acquisitions: 3000,
    many_locks: (10_000, 10),
};

const SMOKE: Sizes = Sizes {
    holds: 100,
    short_timeout: Duration::from_millis(300),
    ticks: 3,
    batches: &[256],
    default_timeout_row: false,
    locks: 10,
    per_lock: 10,
    one_lock: &[(4, 1), (5, 4)],
    acquisitions: 40,
    many_locks: (20, 2),
};

// ---------------------------------------------------------------------------------------------
// Measuring helpers
// ---------------------------------------------------------------------------------------------

/// The process's CPU time so far (user + system, every thread).
fn cpu_time() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let time = |tv: TimeVal| {
        Duration::from_secs(u64::try_from(tv.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(tv.tv_usec()).unwrap_or(0))
    };
    time(usage.user_time()) + time(usage.system_time())
}

/// Page faults of the process so far: (minor, major).
fn page_faults() -> (i64, i64) {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    (usage.minor_page_faults(), usage.major_page_faults())
}

/// The resident set size of this process, in bytes (`VmRSS`).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .expect("VmRSS in /proc/self/status")
        * 1024
}

/// `INFO commandstats`: for each command, (calls, microseconds in the server).
async fn command_stats(server: &RedisServer) -> HashMap<String, (u64, u64)> {
    let stats = server
        .command(&["INFO", "commandstats"])
        .await
        .expect("INFO commandstats");
    let mut out = HashMap::new();
    for line in stats.as_str().unwrap_or_default().lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let field = |key: &str| -> u64 {
            rest.split(',')
                .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
                .and_then(|value| value.parse().ok())
                .unwrap_or(0)
        };
        out.insert(name.to_owned(), (field("calls"), field("usec")));
    }
    out
}

/// Commands a client sends itself (round trips); `INFO commandstats` also counts the commands
/// scripts run inside (`redis.call`), which are not round trips.
const TOP_LEVEL: [&str; 7] = [
    "evalsha",
    "eval",
    "subscribe",
    "unsubscribe",
    "ssubscribe",
    "sunsubscribe",
    "ping",
];

/// Commands sent between two snapshots, divided by `per` (the check's own `INFO` and `CLIENT`
/// left out): `top level: name count, ...; inside scripts: name count, ...`.
fn command_delta(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
    per: usize,
) -> String {
    let mut names: Vec<&String> = after.keys().collect();
    names.sort();
    let counted: Vec<(&String, f64)> = names
        .into_iter()
        .filter(|name| name.as_str() != "info" && !name.starts_with("client"))
        .filter_map(|name| {
            let calls = after[name].0 - before.get(name).map_or(0, |b| b.0);
            (calls > 0).then_some((name, calls as f64 / per as f64))
        })
        .collect();
    let list = |top: bool| {
        counted
            .iter()
            .filter(|(name, _)| TOP_LEVEL.contains(&name.as_str()) == top)
            .map(|(name, count)| format!("{name} {count:.3}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("top level: {}; inside scripts: {}", list(true), list(false))
}

/// One connection in `CLIENT LIST`.
#[derive(Debug, Clone)]
struct Connection {
    id: String,
    name: String,
    /// The last command it sent.
    cmd: String,
    /// Channels it is subscribed to.
    sub: String,
}

async fn client_list(server: &RedisServer) -> Vec<Connection> {
    let list = server
        .command(&["CLIENT", "LIST"])
        .await
        .expect("CLIENT LIST");
    list.as_str()
        .unwrap_or_default()
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let field = |key: &str| -> String {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
                    .unwrap_or("")
                    .to_owned()
            };
            Connection {
                id: field("id"),
                name: field("name"),
                cmd: field("cmd"),
                sub: field("sub"),
            }
        })
        .collect()
}

/// Connections in `now` that were not in `before`, leaving out the one `CLIENT LIST` itself
/// came over (the testkit opens a connection per command).
fn new_connections(before: &[Connection], now: &[Connection]) -> Vec<Connection> {
    let known: HashSet<&str> = before.iter().map(|c| c.id.as_str()).collect();
    now.iter()
        .filter(|c| !known.contains(c.id.as_str()) && c.cmd != "client|list")
        .cloned()
        .collect()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `q`-quantile of sorted samples (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index]
}

/// lockkit's `WARN` (and higher) events so far, by message: the bench says how often, for
/// instance, the waiter hub found release messages dropped.
static WARNINGS: std::sync::Mutex<std::collections::BTreeMap<String, u64>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// A minimal tracing subscriber that counts warnings into [`WARNINGS`].
struct WarningCounter;

/// Collects an event's `message` field.
struct MessageVisitor(String);

impl tracing::field::Visit for MessageVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for WarningCounter {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut visitor = MessageVisitor(String::new());
        event.record(&mut visitor);
        *WARNINGS
            .lock()
            .expect("warnings")
            .entry(visitor.0)
            .or_default() += 1;
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The warnings counted so far.
fn warnings() -> std::collections::BTreeMap<String, u64> {
    WARNINGS.lock().expect("warnings").clone()
}

/// Warnings logged between two snapshots, as `count × message; ...` (`none` when none).
fn warning_delta(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> String {
    let lines: Vec<String> = after
        .iter()
        .filter_map(|(message, count)| {
            let new = count - before.get(message).copied().unwrap_or(0);
            (new > 0).then(|| format!("{new} × {message}"))
        })
        .collect();
    if lines.is_empty() {
        "none".to_owned()
    } else {
        lines.join("; ")
    }
}

// ---------------------------------------------------------------------------------------------
// Workload 5: waiters at scale
// ---------------------------------------------------------------------------------------------

/// One hold by a waiting task.
struct Event {
    lock: usize,
    acquired: Instant,
    unlocking: Instant,
}

/// What workload 5 measured.
struct WaitersOutcome {
    locks: usize,
    waiters: usize,
    /// Connections the waiting client opened when built / while everyone waits.
    built: Vec<Connection>,
    waiting: Vec<Connection>,
    rss_before: u64,
    rss_after: u64,
    /// Size of one `Lock::lock()` future.
    future_bytes: usize,
    register_time: Duration,
    register_commands: String,
    holder_release_time: Duration,
    drain: Duration,
    handoffs: Vec<Duration>,
    drain_commands: String,
    /// lockkit's warnings during the drain.
    drain_warnings: String,
    overlaps: usize,
}

async fn waiters(server: &RedisServer, url: &str, sizes: Sizes) -> WaitersOutcome {
    let locks = sizes.locks;
    let waiters = locks * sizes.per_lock;
    let holder = lockkit_suite::client(url).await;
    let base = lockkit_suite::unique("bench-scale-wait");
    let names: Vec<String> = (0..locks).map(|i| format!("{base}:{i}")).collect();
    let holder_locks: Vec<Lock> = names
        .iter()
        .map(|name| holder.lock(name.as_str()))
        .collect();
    let held: Vec<LockGuard> = join_all(holder_locks.iter().map(Lock::lock))
        .await
        .into_iter()
        .map(|guard| guard.expect("the holder's lock"))
        .collect();

    let before = client_list(server).await;
    let waiting = lockkit_suite::client(url).await;
    let built = new_connections(&before, &client_list(server).await);

    // Current holders per lock: the holder client holds each one now.
    let holders: Arc<Vec<AtomicUsize>> =
        Arc::new((0..locks).map(|_| AtomicUsize::new(1)).collect());
    let overlaps = Arc::new(AtomicUsize::new(0));
    // The state a waiting task keeps in its own allocation: the `lock()` future (never polled).
    let probe = waiting.lock(names[0].as_str());
    let future_bytes = std::mem::size_of_val(&probe.lock());
    drop(probe);
    let stats_before = command_stats(server).await;
    let rss_before = rss_bytes();
    let registering = Instant::now();
    let mut tasks = Vec::with_capacity(waiters);
    for w in 0..waiters {
        let index = w % locks;
        let lock = waiting.lock(names[index].as_str());
        let holders = Arc::clone(&holders);
        let overlaps = Arc::clone(&overlaps);
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.expect("a waiter's lock");
            let acquired = Instant::now();
            if holders[index].fetch_add(1, Ordering::SeqCst) != 0 {
                overlaps.fetch_add(1, Ordering::SeqCst);
            }
            holders[index].fetch_sub(1, Ordering::SeqCst);
            let unlocking = Instant::now();
            guard.unlock().await.expect("a waiter's unlock");
            Event {
                lock: index,
                acquired,
                unlocking,
            }
        }));
    }
    // Registered means: counted by the hub, its channel subscribed, and its second acquire
    // attempt made (the one after subscribing), i.e. 2 `EVALSHA`s per waiter and one `SUBSCRIBE`
    // per lock. `waiting_count` alone counts a waiter as soon as the hub has its entry, before
    // the subscription is confirmed.
    lockkit_suite::until_waiting(&waiting, waiters).await;
    let calls = |stats: &HashMap<String, (u64, u64)>, name: &str| {
        stats.get(name).map_or(0, |(calls, _)| *calls)
    };
    lockkit_suite::within(
        Duration::from_secs(300),
        "every waiter to subscribe",
        async {
            loop {
                let now = command_stats(server).await;
                let evalsha = calls(&now, "evalsha") - calls(&stats_before, "evalsha");
                let subscribe = calls(&now, "subscribe") - calls(&stats_before, "subscribe");
                if evalsha >= 2 * waiters as u64 && subscribe >= locks as u64 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    let register_time = registering.elapsed();
    let rss_after = rss_bytes();
    let stats_registered = command_stats(server).await;
    let waiting_connections = new_connections(&before, &client_list(server).await);

    // The drain: the holder releases its locks one after the other.
    let warnings_before = warnings();
    let drain_start = Instant::now();
    let mut released_at = Vec::with_capacity(locks);
    for (index, guard) in held.into_iter().enumerate() {
        holders[index].fetch_sub(1, Ordering::SeqCst);
        released_at.push(Instant::now());
        guard.unlock().await.expect("the holder's unlock");
    }
    let holder_release_time = drain_start.elapsed();
    let events: Vec<Event> = lockkit_suite::within(
        Duration::from_secs(300),
        "the waiters to drain",
        join_all(tasks),
    )
    .await
    .into_iter()
    .map(|joined| joined.expect("a waiter panicked"))
    .collect();
    let last = events
        .iter()
        .map(|e| e.acquired)
        .max()
        .unwrap_or(drain_start);
    let drain = last.saturating_duration_since(drain_start);
    let stats_drained = command_stats(server).await;
    let drain_warnings = warning_delta(&warnings_before, &warnings());

    // Handoffs along each lock's chain: holder, then its waiters in the order they got it.
    let mut chains: Vec<Vec<&Event>> = vec![Vec::new(); locks];
    for event in &events {
        chains[event.lock].push(event);
    }
    let mut handoffs = Vec::with_capacity(waiters);
    for (index, chain) in chains.iter_mut().enumerate() {
        chain.sort_unstable_by_key(|e| e.acquired);
        let mut previous = released_at[index];
        for event in chain.iter() {
            handoffs.push(event.acquired.saturating_duration_since(previous));
            previous = event.unlocking;
        }
    }
    handoffs.sort_unstable();

    waiting.shutdown().await.expect("shutdown");
    holder.shutdown().await.expect("shutdown");
    WaitersOutcome {
        locks,
        waiters,
        built,
        waiting: waiting_connections,
        rss_before,
        rss_after,
        future_bytes,
        register_time,
        register_commands: command_delta(&stats_before, &stats_registered, waiters),
        holder_release_time,
        drain,
        handoffs,
        drain_commands: command_delta(&stats_registered, &stats_drained, waiters),
        drain_warnings,
        overlaps: overlaps.load(Ordering::SeqCst),
    }
}

fn print_waiters(o: &WaitersOutcome) {
    let describe = |conns: &[Connection]| {
        conns
            .iter()
            .map(|c| {
                let name = if c.name.is_empty() { "-" } else { &c.name };
                format!("name={name} cmd={} sub={}", c.cmd, c.sub)
            })
            .collect::<Vec<_>>()
            .join("; ")
    };
    let per_waiter = (o.rss_after as f64 - o.rss_before as f64) / o.waiters as f64;
    let mean = o.handoffs.iter().sum::<Duration>()
        / u32::try_from(o.handoffs.len().max(1)).unwrap_or(u32::MAX);
    println!();
    println!(
        "workload 5, waiters at scale: {} waiting tasks on {} locks ({} per lock) in one client; \
         the locks held by another client",
        o.waiters,
        o.locks,
        o.waiters / o.locks
    );
    println!();
    println!("| measure | measured | target |");
    println!("|---|---:|---:|");
    println!(
        "| connections of the waiting client (built / all waiting) | {} / **{}** | 2 |",
        o.built.len(),
        o.waiting.len()
    );
    println!(
        "| RSS before → after registering the waiters | {:.1} → {:.1} MiB | |",
        o.rss_before as f64 / 1048576.0,
        o.rss_after as f64 / 1048576.0
    );
    println!(
        "| **memory per waiter** (RSS delta ÷ {}) | **{:.0} bytes** | |",
        o.waiters, per_waiter
    );
    println!(
        "| of which the `lock()` future (size_of_val; the task adds its header) | {} bytes | |",
        o.future_bytes
    );
    println!(
        "| time to register all waiters | {:.0} ms | |",
        o.register_time.as_secs_f64() * 1e3
    );
    println!(
        "| holder's {} releases, one after the other | {:.0} ms | |",
        o.locks,
        o.holder_release_time.as_secs_f64() * 1e3
    );
    println!(
        "| **drain time** (first release → last waiter's `lock()` returned) | **{:.0} ms** | |",
        o.drain.as_secs_f64() * 1e3
    );
    println!(
        "| drain time ÷ {} handoffs ({} chains in parallel) | {:.1} µs | |",
        o.handoffs.len(),
        o.locks,
        micros(o.drain) / o.handoffs.len().max(1) as f64
    );
    if !o.handoffs.is_empty() {
        println!(
            "| **handoff** (unlock call → next `lock()` returns): mean / p50 / p99 | **{:.0}** / {:.0} / {:.0} µs | |",
            micros(mean),
            micros(quantile(&o.handoffs, 0.5)),
            micros(quantile(&o.handoffs, 0.99))
        );
    }
    println!(
        "| overlapping holds (a lock's holder counter non-zero) | {} | 0 |",
        o.overlaps
    );
    println!();
    println!("connections when built: {}", describe(&o.built));
    println!("connections while all wait: {}", describe(&o.waiting));
    println!(
        "commands per waiter while registering: {}",
        o.register_commands
    );
    println!("commands per handoff while draining: {}", o.drain_commands);
    println!("lockkit warnings while draining: {}", o.drain_warnings);
}

// ---------------------------------------------------------------------------------------------
// Workload 4: watchdog at scale
// ---------------------------------------------------------------------------------------------

/// One row of workload 4.
#[derive(Debug, Clone, Copy)]
struct WatchdogRow {
    holds: usize,
    timeout: Duration,
    batch: usize,
    ticks: u32,
}

/// What one row of workload 4 measured.
struct WatchdogOutcome {
    row: WatchdogRow,
    acquire_time: Duration,
    evalsha_per_tick: f64,
    server_usec_per_tick: f64,
    cpu_per_tick: Duration,
    /// The same client's CPU per tick before it held anything.
    idle_cpu_per_tick: Duration,
    /// Page faults of the process per tick (minor, major).
    faults_per_tick: (f64, f64),
    lost: usize,
    /// `Client::held_count` at the end of the window (must equal the holds).
    registered: usize,
    pttl_not_positive: usize,
    min_pttl_ms: i64,
}

async fn watchdog_row(server: &RedisServer, url: &str, row: WatchdogRow) -> WatchdogOutcome {
    let client = Client::builder()
        .url(url)
        .watchdog_timeout(row.timeout)
        .renew_batch_size(row.batch)
        .build()
        .await
        .expect("a lockkit client");
    // The watchdog's ticks come every period from (about) now.
    let built = tokio::time::Instant::now();
    let period = row.timeout / 3;
    // Baseline: the same client holding nothing, over two whole periods.
    let idle_start = built + period / 2;
    tokio::time::sleep_until(idle_start).await;
    let idle_before = cpu_time();
    tokio::time::sleep_until(idle_start + period * 2).await;
    let idle_per_tick = (cpu_time() - idle_before) / 2;

    let base = lockkit_suite::unique("bench-scale-wd");
    let names: Vec<String> = (0..row.holds).map(|i| format!("{base}:{i}")).collect();
    let locks: Vec<Lock> = names
        .iter()
        .map(|name| client.lock(name.as_str()))
        .collect();
    let started = Instant::now();
    let guards: Vec<LockGuard> = join_all(locks.iter().map(Lock::lock))
        .await
        .into_iter()
        .map(|guard| guard.expect("lock"))
        .collect();
    let acquire_time = started.elapsed();

    // The window: K whole periods, from half a period after a tick.
    let since = built.elapsed().as_secs_f64() / period.as_secs_f64();
    let first = (since - 0.5).max(0.0).ceil() + 0.5;
    let window_start = built + period.mul_f64(first);
    let window_end = window_start + period * row.ticks;
    tokio::time::sleep_until(window_start).await;
    let cpu_before = cpu_time();
    let faults_before = page_faults();
    let stats_before = command_stats(server).await;
    tokio::time::sleep_until(window_end).await;
    let cpu_after = cpu_time();
    let faults_after = page_faults();
    let stats_after = command_stats(server).await;

    let evalsha =
        |stats: &HashMap<String, (u64, u64)>| stats.get("evalsha").copied().unwrap_or_default();
    let (calls_before, usec_before) = evalsha(&stats_before);
    let (calls_after, usec_after) = evalsha(&stats_after);
    let ticks = f64::from(row.ticks);

    let lost = guards.iter().filter(|guard| guard.is_lost()).count();
    let registered = client.held_count();
    let raw = lockkit_suite::raw(url).await;
    let pttls: Vec<i64> = join_all(
        names
            .iter()
            .map(|name| raw.pttl::<i64, _>(lockkit_suite::lock_key(name))),
    )
    .await
    .into_iter()
    .map(|pttl| pttl.expect("PTTL"))
    .collect();
    let _ = raw.quit().await;

    client.shutdown().await.expect("shutdown");
    drop(guards);
    WatchdogOutcome {
        row,
        acquire_time,
        evalsha_per_tick: (calls_after - calls_before) as f64 / ticks,
        server_usec_per_tick: (usec_after - usec_before) as f64 / ticks,
        cpu_per_tick: (cpu_after - cpu_before) / row.ticks,
        idle_cpu_per_tick: idle_per_tick,
        faults_per_tick: (
            (faults_after.0 - faults_before.0) as f64 / ticks,
            (faults_after.1 - faults_before.1) as f64 / ticks,
        ),
        lost,
        registered,
        pttl_not_positive: pttls.iter().filter(|pttl| **pttl <= 0).count(),
        min_pttl_ms: pttls.iter().copied().min().unwrap_or(-3),
    }
}

fn print_watchdog(outcomes: &[WatchdogOutcome]) {
    println!();
    println!(
        "workload 4, watchdog at scale: one client, holds in watchdog mode; per renewal tick over \
         K whole periods"
    );
    println!();
    println!(
        "| holds | watchdog timeout | period | renew batch | K ticks | EVALSHA per tick | target \
         ceil(N/batch) | server µs per tick | client CPU ms per tick | idle CPU ms per tick | page faults \
         per tick (minor/major) | CPU µs per hold | lost \
         guards | keys with PTTL ≤ 0 | min PTTL ms | holds registered | acquire all, s |"
    );
    println!(
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for o in outcomes {
        let row = o.row;
        let cpu_ms = o.cpu_per_tick.as_secs_f64() * 1e3;
        println!(
            "| {} | {} s | {:.2} s | {} | {} | **{:.2}** | {} | {:.0} | **{:.2}** | {:.2} | {:.0}/{:.0} | {:.2} | {} | {} | {} | {} | {:.2} |",
            row.holds,
            row.timeout.as_secs_f64(),
            (row.timeout / 3).as_secs_f64(),
            row.batch,
            row.ticks,
            o.evalsha_per_tick,
            row.holds.div_ceil(row.batch),
            o.server_usec_per_tick,
            cpu_ms,
            o.idle_cpu_per_tick.as_secs_f64() * 1e3,
            o.faults_per_tick.0,
            o.faults_per_tick.1,
            cpu_ms * 1e3 / row.holds as f64,
            o.lost,
            o.pttl_not_positive,
            o.min_pttl_ms,
            o.registered,
            o.acquire_time.as_secs_f64(),
        );
    }
}

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Workload 6: handoffs by direct grant at scale (issue 20)
// ---------------------------------------------------------------------------------------------

/// What one row of workload 6 measured.
struct GrantsOutcome {
    label: String,
    waiters: usize,
    clients: usize,
    acquisitions: usize,
    /// From the first handoff's release to the last acquisition.
    drain: Duration,
    /// `PUBLISH` calls (all from scripts) per acquisition.
    publishes: f64,
    /// Script calls sent by clients per acquisition (acquire tries and releases).
    scripts: f64,
    /// The subscribers of the lock's own channel, and of each client's channel for it, while
    /// everyone waits (one-lock rows: every client's channel has exactly its client).
    object_subscribers: i64,
    client_subscribers: Vec<i64>,
    warnings: String,
    overlaps: usize,
}

/// The subscribers of `channel` (`PUBSUB NUMSUB`).
async fn numsub(server: &RedisServer, channel: &str) -> i64 {
    let reply = server
        .command(&["PUBSUB", "NUMSUB", channel])
        .await
        .expect("PUBSUB NUMSUB");
    reply
        .as_array()
        .and_then(|items| items.get(1))
        .and_then(lockkit_testkit::RespValue::as_int)
        .unwrap_or(0)
}

/// Waits until the server has seen `want` more calls of `name` than in `before`.
async fn until_calls(
    server: &RedisServer,
    before: &HashMap<String, (u64, u64)>,
    name: &str,
    want: u64,
) {
    let calls = |stats: &HashMap<String, (u64, u64)>| stats.get(name).map_or(0, |(c, _)| *c);
    lockkit_suite::within(Duration::from_secs(300), "the waiters' tries", async {
        while calls(&command_stats(server).await) < calls(before) + want {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
}

/// What one row of workload 6 contends for: a lock, or a semaphore of one permit (issue 28: its
/// FIFO line grants as the lock's does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Contended {
    Lock,
    Semaphore,
}

/// What a worker of workload 6 holds.
enum Taken {
    Lock(LockGuard),
    Permit(lockkit::SemaphorePermit),
}

impl Taken {
    async fn take(client: &lockkit::Client, what: Contended, name: &str) -> Taken {
        match what {
            Contended::Lock => Taken::Lock(client.lock(name).lock().await.expect("a lock")),
            Contended::Semaphore => Taken::Permit(
                client
                    .semaphore(name)
                    .with_permits(1)
                    .expect("one permit")
                    .acquire(1)
                    .await
                    .expect("a permit"),
            ),
        }
    }

    async fn give_back(self) {
        match self {
            Taken::Lock(guard) => guard.unlock().await.expect("an unlock"),
            Taken::Permit(permit) => permit.release().await.expect("a release"),
        }
    }
}

/// One lock (or a semaphore of one permit), `clients` clients with `per_client` workers each,
/// every worker looping take, give back (nothing held in between: the cost of the handoffs alone)
/// until `acquisitions` were made in all. A holder keeps it until every worker waits, so every
/// acquisition in the row is a handoff to a waiter.
async fn grants_one_lock(
    server: &RedisServer,
    url: &str,
    what: Contended,
    (clients, per_client): (usize, usize),
    acquisitions: usize,
) -> GrantsOutcome {
    let name = lockkit_suite::unique("bench-scale-grant");
    let holder = lockkit_suite::client(url).await;
    let held = Taken::take(&holder, what, &name).await;
    let workers: Vec<lockkit::Client> =
        join_all((0..clients).map(|_| lockkit_suite::client(url))).await;
    let stats_before = command_stats(server).await;
    let made = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let mut tasks = Vec::with_capacity(clients * per_client);
    for client in &workers {
        for _ in 0..per_client {
            let (client, name) = (client.clone(), name.clone());
            let (made, inside, overlaps, last) = (
                Arc::clone(&made),
                Arc::clone(&inside),
                Arc::clone(&overlaps),
                Arc::clone(&last),
            );
            tasks.push(tokio::spawn(async move {
                loop {
                    let guard = Taken::take(&client, what, &name).await;
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    let count = made.fetch_add(1, Ordering::SeqCst) + 1;
                    if count == acquisitions {
                        *last.lock().expect("not poisoned") = Some(Instant::now());
                    }
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.give_back().await;
                    if count >= acquisitions {
                        return;
                    }
                }
            }));
        }
    }
    let waiters = clients * per_client;
    // Every worker has tried once (and waits): at least one busy try each.
    until_calls(server, &stats_before, "evalsha", waiters as u64).await;
    let kind = match what {
        Contended::Lock => lockkit::protocol::keys::Kind::Lock,
        Contended::Semaphore => lockkit::protocol::keys::Kind::Semaphore,
    };
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(kind, &name)
        .expect("a valid name");
    let object_subscribers = numsub(server, &keys.channel).await;
    let mut client_subscribers = Vec::with_capacity(clients);
    for client in &workers {
        client_subscribers.push(numsub(server, &keys.client_channel(client.id())).await);
    }
    let warnings_before = warnings();
    let stats_waiting = command_stats(server).await;
    let start = Instant::now();
    held.give_back().await;
    // Workers past the count stop at their next acquisition; the rest wait for a lock that is
    // handed on until every one of them has had it once more.
    lockkit_suite::within(Duration::from_secs(600), "the row", async {
        while last.lock().expect("not poisoned").is_none() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let end = last.lock().expect("not poisoned").unwrap_or(start);
    // Every worker stops after its next acquisition: each is handed the lock once more.
    lockkit_suite::within(
        Duration::from_secs(600),
        "the workers to stop",
        join_all(tasks),
    )
    .await
    .into_iter()
    .for_each(|joined| joined.expect("a worker"));
    let stats_done = command_stats(server).await;
    let made = made.load(Ordering::SeqCst);
    for client in &workers {
        client.shutdown().await.expect("shutdown");
    }
    holder.shutdown().await.expect("shutdown");
    let delta = |name: &str| {
        let calls = |stats: &HashMap<String, (u64, u64)>| stats.get(name).map_or(0, |(c, _)| *c);
        (calls(&stats_done) - calls(&stats_waiting)) as f64 / made as f64
    };
    GrantsOutcome {
        label: format!(
            "1 {}, {waiters} waiters",
            match what {
                Contended::Lock => "lock",
                Contended::Semaphore => "semaphore of 1 permit",
            }
        ),
        waiters,
        clients,
        acquisitions,
        drain: end.saturating_duration_since(start),
        publishes: delta("publish"),
        scripts: delta("evalsha"),
        object_subscribers,
        client_subscribers,
        warnings: warning_delta(&warnings_before, &warnings()),
        overlaps: overlaps.load(Ordering::SeqCst),
    }
}

/// `locks` locks held by one holder client, one waiter on each spread over `clients` clients;
/// the holder releases them all at once, and each waiter releases the lock it gets at once.
async fn grants_many_locks(
    server: &RedisServer,
    url: &str,
    locks: usize,
    clients: usize,
) -> GrantsOutcome {
    let base = lockkit_suite::unique("bench-scale-grants");
    let names: Vec<String> = (0..locks).map(|i| format!("{base}:{i}")).collect();
    let holder = lockkit_suite::client(url).await;
    let held: Vec<LockGuard> = join_all(names.iter().map(|name| {
        let lock = holder.lock(name.as_str());
        async move { lock.lock().await.expect("the holder's lock") }
    }))
    .await;
    let workers: Vec<lockkit::Client> =
        join_all((0..clients).map(|_| lockkit_suite::client(url))).await;
    let stats_before = command_stats(server).await;
    let acquired: Arc<std::sync::Mutex<Vec<Instant>>> =
        Arc::new(std::sync::Mutex::new(Vec::with_capacity(locks)));
    let mut tasks = Vec::with_capacity(locks);
    for (i, name) in names.iter().enumerate() {
        let lock = workers[i % clients].lock(name.as_str());
        let acquired = Arc::clone(&acquired);
        tasks.push(tokio::spawn(async move {
            let guard = lock.lock().await.expect("a waiter's lock");
            acquired.lock().expect("not poisoned").push(Instant::now());
            guard.unlock().await.expect("a waiter's unlock");
        }));
    }
    // Each waiter's channel is new: it tries, subscribes, and tries again.
    until_calls(server, &stats_before, "evalsha", 2 * locks as u64).await;
    for client in &workers {
        lockkit_suite::until_waiting(client, locks / clients).await;
    }
    let warnings_before = warnings();
    let stats_waiting = command_stats(server).await;
    let start = Instant::now();
    join_all(held.into_iter().map(LockGuard::unlock))
        .await
        .into_iter()
        .for_each(|released| released.expect("the holder's unlock"));
    lockkit_suite::within(Duration::from_secs(600), "the drain", join_all(tasks))
        .await
        .into_iter()
        .for_each(|joined| joined.expect("a waiter"));
    let end = acquired
        .lock()
        .expect("not poisoned")
        .iter()
        .copied()
        .max()
        .unwrap_or(start);
    let stats_done = command_stats(server).await;
    let warnings = warning_delta(&warnings_before, &warnings());
    for client in &workers {
        client.shutdown().await.expect("shutdown");
    }
    holder.shutdown().await.expect("shutdown");
    let delta = |name: &str| {
        let calls = |stats: &HashMap<String, (u64, u64)>| stats.get(name).map_or(0, |(c, _)| *c);
        (calls(&stats_done) - calls(&stats_waiting)) as f64 / locks as f64
    };
    GrantsOutcome {
        label: format!("{locks} locks, 1 waiter each"),
        waiters: locks,
        clients,
        acquisitions: locks,
        drain: end.saturating_duration_since(start),
        publishes: delta("publish"),
        scripts: delta("evalsha"),
        object_subscribers: 0,
        client_subscribers: Vec::new(),
        warnings,
        overlaps: 0,
    }
}

fn print_grants(outcomes: &[GrantsOutcome]) {
    println!();
    println!("workload 6: handoffs by direct grant at scale");
    println!();
    println!(
        "| row | clients | acquisitions | drain ms | handoffs/s | vs the first row of its kind | PUBLISH/acq | \
         script calls/acq (incl. release) | object channel subscribers | clients' channels: \
         subscribers each | lockkit warnings | overlaps |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|");
    let rate = |o: &GrantsOutcome| o.acquisitions as f64 / o.drain.as_secs_f64().max(1e-9);
    // Each row against the first row of its kind (the W = 16 baseline of a lock or a semaphore).
    let kind_of = |o: &GrantsOutcome| o.label.split(',').next().unwrap_or("").to_owned();
    for o in outcomes {
        let base = outcomes
            .iter()
            .find(|b| kind_of(b) == kind_of(o))
            .map_or(1.0, rate);
        let subscribers = if o.client_subscribers.is_empty() {
            "–".to_owned()
        } else {
            let min = o.client_subscribers.iter().min().copied().unwrap_or(0);
            let max = o.client_subscribers.iter().max().copied().unwrap_or(0);
            format!("{min}..={max} (of {})", o.client_subscribers.len())
        };
        println!(
            "| {} ({} waiting) | {} | {} | {:.0} | {:.0} | {:.2} | {:.3} | {:.3} | {} | {} | {} | {} |",
            o.label,
            o.waiters,
            o.clients,
            o.acquisitions,
            o.drain.as_secs_f64() * 1e3,
            rate(o),
            rate(o) / base,
            o.publishes,
            o.scripts,
            o.object_subscribers,
            subscribers,
            if o.warnings.is_empty() { "none" } else { &o.warnings },
            o.overlaps,
        );
    }
}

async fn bench(server: &RedisServer, sizes: Sizes, only: Option<&str>) {
    let url = server.url();
    println!(
        "scale: redis-server on {}, one multi-thread runtime ({} CPUs)",
        server.addr(),
        std::thread::available_parallelism().map_or(0, usize::from)
    );
    if only.is_none_or(|only| only == "waiters") {
        let outcome = waiters(server, &url, sizes).await;
        print_waiters(&outcome);
        assert_eq!(outcome.overlaps, 0, "two holders of one lock at once");
    }
    if only.is_none_or(|only| only == "grants") {
        let mut outcomes = Vec::new();
        for what in [Contended::Lock, Contended::Semaphore] {
            for &row in sizes.one_lock {
                eprintln!(
                    "  grants: 1 {what:?}, {} clients x {} waiters",
                    row.0, row.1
                );
                outcomes.push(grants_one_lock(server, &url, what, row, sizes.acquisitions).await);
            }
        }
        let (locks, clients) = sizes.many_locks;
        eprintln!("  grants: {locks} locks, {clients} clients");
        outcomes.push(grants_many_locks(server, &url, locks, clients).await);
        print_grants(&outcomes);
        for o in &outcomes {
            assert_eq!(o.overlaps, 0, "two holders of one lock at once");
        }
    }
    if only.is_none_or(|only| only == "watchdog") {
        let mut rows: Vec<WatchdogRow> = sizes
            .batches
            .iter()
            .map(|&batch| WatchdogRow {
                holds: sizes.holds,
                timeout: sizes.short_timeout,
                batch,
                ticks: sizes.ticks,
            })
            .collect();
        if sizes.default_timeout_row {
            // Scaling check: a tenth of the holds.
            rows.push(WatchdogRow {
                holds: sizes.holds / 10,
                timeout: sizes.short_timeout,
                batch: sizes.batches[0],
                ticks: sizes.ticks,
            });
        }
        let skip_default = std::env::var("LOCKKIT_BENCH_SKIP_30S").is_ok_and(|v| v == "1");
        if sizes.default_timeout_row && !skip_default {
            rows.push(WatchdogRow {
                holds: sizes.holds,
                timeout: lockkit::DEFAULT_WATCHDOG_TIMEOUT,
                batch: sizes.batches[0],
                ticks: 5,
            });
        }
        let mut outcomes = Vec::with_capacity(rows.len());
        for row in rows {
            eprintln!(
                "  watchdog: {} holds, timeout {:?}, batch {}, {} ticks",
                row.holds, row.timeout, row.batch, row.ticks
            );
            outcomes.push(watchdog_row(server, &url, row).await);
        }
        print_watchdog(&outcomes);
        for o in &outcomes {
            assert_eq!(o.lost + o.pttl_not_positive, 0, "a lease was lost");
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs each benchmark without `--bench`: a smoke pass then.
    let bench_mode = args.iter().any(|arg| arg == "--bench");
    if args.iter().any(|arg| arg == "--list") {
        return;
    }
    let mut sizes = if bench_mode { FULL } else { SMOKE };
    if let Some(per_lock) = std::env::var("LOCKKIT_BENCH_PER_LOCK")
        .ok()
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 0)
    {
        sizes.per_lock = per_lock;
    }
    let only = std::env::var("LOCKKIT_BENCH_ONLY").ok();
    tracing::subscriber::set_global_default(WarningCounter).expect("one tracing subscriber");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let server = rt.block_on(lockkit_suite::spawned());
    rt.block_on(bench(&server, sizes, only.as_deref()));
    drop(server);
}
