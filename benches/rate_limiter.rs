//! The rate limiter (issue 30): its targets 1–3 and the choice of its algorithm, in one run
//! against one spawned `redis-server`.
//!
//! - **Exact** (target 1): `CALLERS` = 64 callers on 8 `lockkit::Client`s loop `acquire(1)` for
//!   `LOCKKIT_RL_SECS` (default 10 s) against a limit of `LOCKKIT_RL_RATE` per second (default
//!   500, burst 0). From the admitted moments on the server's clock
//!   ([`RateAdmission::admitted_at`](lockkit::RateAdmission::admitted_at)): the admitted rate over
//!   the whole intervals from the first admission (and `(N − 1) / (last − first)`), and the
//!   busiest window of one interval ([`busiest_window`]), against `rate + burst`. Then the same
//!   64 callers against `LOCKKIT_RL_LOW_RATE` (default 50/s): more callers than one interval
//!   holds, so some wait more than one interval ahead (far: they listen for a data loss).
//! - **Cheap** (target 2): over the same run, Redis' own count of script calls (`INFO
//!   commandstats`: `EVALSHA` + `EVAL`) per admission, and the pub/sub messages (`PUBLISH` and
//!   `SPUBLISH` calls, and lockkit's `lockkit_pubsub_messages_total`); then 16 callers of a limit
//!   of 10 a second reserve their moments (up to 1.5 s ahead) and Redis' count of every command
//!   but `INFO` is read twice, 1 s apart, while they sleep: what waiting costs Redis.
//! - **Throughput**: `try_acquire(1, ZERO)` of W = 16 and 64 callers on 8 clients, a limit that
//!   admits every try (10⁶/s) and one that refuses almost every try (100/s), against `PING` of
//!   the same W callers on 8 plain fred clients configured like lockkit's, in interleaved rounds;
//!   and, uncontended (one caller), `Lock::lock()` + `unlock()` and `try_acquire` against `PING`.
//! - **Fair** (target 3): 16 callers on 8 clients loop `acquire(1)` against 200/s for
//!   `LOCKKIT_RL_FAIR_SECS` (default 5 s): per-worker admitted min/max.
//! - **Algorithm**: three candidate scripts sent raw through plain fred clients, in interleaved
//!   rounds with `PING`: (i) lockkit's own acquire script ([`ACQUIRE`]), (ii) a sliding log (a
//!   ZSET of admitted moments: `ZREMRANGEBYSCORE`, `ZCARD`, `ZRANGE` for a reservation, `ZADD`),
//!   (iii) a fixed window counter (`INCR` + `PEXPIRE` on the first, Redisson's older
//!   `RRateLimiter`): throughput (W = 16 on 8 clients, admit-all and mostly-refused loads),
//!   `MEMORY USAGE` at 10 000 per interval, and the busiest window when `n − 1` tries come just
//!   before a window's end and `n` just after it (the fixed window admits about 2 n); and, on a
//!   load where every request reserves, lockkit's script against the same without its waiting
//!   ZSET.
//! - **Peers**: when installed (`scripts/bench-rate-limiter` installs them into
//!   `target/peers-rl`), node `rate-limiter-flexible` and python `limits` run the throughput rows
//!   through their own runners (`benches/peers/rl_runner.{js,py}`), against their own client's
//!   `PING`, and the boundary test.
//!
//! Run: `scripts/bench-rate-limiter` (or `cargo bench --bench rate_limiter`). The markdown table
//! goes to stdout, the JSON to `LOCKKIT_BENCH_OUT` (default
//! `target/bench-results/rate_limiter.json`). Without `--bench` (`cargo test --benches`) a short
//! smoke run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::interfaces::{ClientLike, LuaInterface};
use fred::prelude::Client as RedisClient;
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::protocol::rate_limiter::ACQUIRE;
use lockkit::{Client, RateLimit};
use lockkit_suite::rate_window::busiest_window;
use serde_json::json;

/// The lockkit clients (and plain fred clients) every contended row spreads its callers over.
const CLIENTS: usize = 8;
/// The start of the candidates' request markers: as long as lockkit's client ids (a UUID), so
/// the memory a log or a waiting set keeps per entry is what it would be.
const MARKER_PREFIX: &str = "5f0e8a7c-3b1d-4c2e-9f6a-0d8b7e6c5a4f";
/// Callers of the exactness row.
const CALLERS: usize = 64;

/// Candidate (ii): a sliding log. KEYS[1] a ZSET of admitted moments (µs, server clock);
/// ARGV limit, window (ms), member (unique per request), wait (µs, -1: none). A request is
/// admitted at the first moment its window holds fewer than `limit` entries: now, or when the
/// entry `count − limit` leaves it (a reservation, written into the log ahead).
const SLIDING_LOG: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2]) * 1000
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
local at = now
if count >= limit then
  local e = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')
  at = math.max(now, tonumber(e[2]) + window)
end
local delay = at - now
local wait = tonumber(ARGV[4])
if wait >= 0 and delay > wait then
  return {0, delay, now}
end
redis.call('ZADD', KEYS[1], at, ARGV[3])
redis.call('PEXPIRE', KEYS[1], math.ceil((at - now + window) / 1000))
return {1, delay, at}
";

/// Candidate (iii): a fixed window counter, as Redisson's `RRateLimiter` before its ZSET
/// rewrite: KEYS[1] a counter that expires one window after the window's first request; ARGV
/// limit, window (ms). No reservation: a refused caller is told when the window ends.
const FIXED_WINDOW: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local n = redis.call('INCR', KEYS[1])
if n == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
if n <= tonumber(ARGV[1]) then
  return {1, 0, now}
end
return {0, redis.call('PTTL', KEYS[1]) * 1000, now}
";

fn secs_env(name: &str, default: f64) -> Duration {
    Duration::from_secs_f64(
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default),
    )
}

/// The rate limiter's keys (limit HASH, waiting ZSET) under the default prefix.
fn limiter_keys(name: &str) -> (String, String) {
    let keys = Namespace::default()
        .object(Kind::RateLimiter, name)
        .expect("a valid name");
    (keys.keys[0].clone(), keys.keys[1].clone())
}

fn unique(name: &str) -> String {
    lockkit_suite::unique(name)
}

// ---------------------------------------------------------------------------------------------
// Redis' own counts

/// Redis' counts so far, from `INFO commandstats`.
#[derive(Debug, Clone, Default)]
struct Stats {
    calls: HashMap<String, u64>,
}

impl Stats {
    fn get(&self, name: &str) -> u64 {
        self.calls.get(name).copied().unwrap_or(0)
    }
    fn scripts(&self) -> u64 {
        ["evalsha", "eval", "evalsha_ro", "eval_ro", "fcall"]
            .iter()
            .map(|c| self.get(c))
            .sum()
    }
    fn publishes(&self) -> u64 {
        self.get("publish") + self.get("spublish")
    }
    /// Every command but `INFO` (this bench's own look).
    fn all_but_info(&self) -> u64 {
        self.calls
            .iter()
            .filter(|(name, _)| name.as_str() != "info" && !name.contains(' '))
            .map(|(_, n)| n)
            .sum()
    }
    fn since(&self, before: &Stats) -> Stats {
        Stats {
            calls: self
                .calls
                .iter()
                .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k))))
                .collect(),
        }
    }
}

async fn stats(raw: &RedisClient) -> Stats {
    let info: String = raw
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec!["commandstats"],
        )
        .await
        .expect("INFO commandstats");
    let mut calls = HashMap::new();
    for line in info.lines() {
        let Some((name, stats)) = line.split_once(':') else {
            continue;
        };
        let Some(name) = name.strip_prefix("cmdstat_") else {
            continue;
        };
        for (field, suffix) in [
            ("calls=", ""),
            ("failed_calls=", " (failed)"),
            ("rejected_calls=", " (rejected)"),
        ] {
            if let Some(count) = stats
                .split(',')
                .find_map(|kv| kv.strip_prefix(field))
                .and_then(|count| count.parse::<u64>().ok())
            {
                calls.insert(format!("{name}{suffix}"), count);
            }
        }
    }
    Stats { calls }
}

async fn memory_usage(raw: &RedisClient, key: &str) -> u64 {
    let v: Value = raw
        .custom(
            CustomCommand::new_static("MEMORY", ClusterHash::Random, false),
            vec!["USAGE", key, "SAMPLES", "0"],
        )
        .await
        .expect("MEMORY USAGE");
    v.as_u64().unwrap_or(0)
}

/// Pub/sub messages lockkit's clients received (`lockkit_pubsub_messages_total`).
static MESSAGES: AtomicU64 = AtomicU64::new(0);

struct MessageRecorder;
struct MessageCounter;

impl metrics::CounterFn for MessageCounter {
    fn increment(&self, value: u64) {
        MESSAGES.fetch_add(value, Ordering::Relaxed);
    }
    fn absolute(&self, value: u64) {
        MESSAGES.fetch_max(value, Ordering::Relaxed);
    }
}

impl metrics::Recorder for MessageRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        if key.name() == "lockkit_pubsub_messages_total" {
            metrics::Counter::from_arc(Arc::new(MessageCounter))
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

// ---------------------------------------------------------------------------------------------
// Target 1 (exact) and 2 (script calls, messages)

struct Exact {
    rate: u64,
    secs: f64,
    admitted: usize,
    /// Admissions in the whole intervals from the first, per interval.
    rate_whole: f64,
    whole_intervals: u64,
    /// (N − 1) / (last − first), per second.
    rate_span: f64,
    busiest: u64,
    scripts: u64,
    publishes: u64,
    messages: u64,
    errors: u64,
    /// The commands of the run, by name.
    breakdown: String,
    /// The warm-up's commands, by name.
    warm_up: String,
}

async fn exact(clients: &[Client], raw: &RedisClient, rate: u64, run: Duration) -> Exact {
    let name = unique("rl-exact");
    let limit = RateLimit::per_second(rate).expect("a limit");
    clients[0]
        .rate_limiter(name.clone())
        .set_limit(limit)
        .await
        .expect("set_limit");
    // Warm-up: the first calls on a server whose script cache is cold are answered NOSCRIPT and
    // sent again as EVAL (every caller that raced the first load: a one-off per server start,
    // counted apart); one acquire loads the script.
    let cold = stats(raw).await;
    clients[0]
        .rate_limiter(unique("rl-warm"))
        .with_limit(limit)
        .acquire(1)
        .await
        .expect("warm-up acquire");
    let warm_up = breakdown(&stats(raw).await.since(&cold));
    let before = stats(raw).await;
    let messages_before = MESSAGES.load(Ordering::Relaxed);
    let deadline = Instant::now() + run;
    let tasks: Vec<_> = (0..CALLERS)
        .map(|i| {
            let limiter = clients[i % clients.len()]
                .rate_limiter(name.clone())
                .with_limit(limit);
            tokio::spawn(async move {
                let mut moments = Vec::new();
                let mut errors = 0;
                while Instant::now() < deadline {
                    match limiter.acquire(1).await {
                        Ok(admission) => moments.push(admission.admitted_at()),
                        Err(err) => {
                            errors += 1;
                            eprintln!("acquire: {err}");
                        }
                    }
                }
                (moments, errors)
            })
        })
        .collect();
    let mut moments = Vec::new();
    let mut errors = 0;
    for task in tasks {
        let (m, e) = task.await.expect("a caller");
        moments.extend(m);
        errors += e;
    }
    let delta = stats(raw).await.since(&before);
    let messages = MESSAGES.load(Ordering::Relaxed) - messages_before;
    moments.sort();
    let interval = Duration::from_secs(1);
    let first = moments[0];
    let last = *moments.last().expect("admissions");
    let span = last.duration_since(first).expect("sorted");
    let whole = span.as_secs();
    let in_whole = moments
        .iter()
        .filter(|m| **m < first + interval * whole as u32)
        .count();
    let weighted: Vec<(SystemTime, u64)> = moments.iter().map(|m| (*m, 1)).collect();
    let (busiest, _) = busiest_window(&weighted, interval);
    Exact {
        rate,
        secs: run.as_secs_f64(),
        admitted: moments.len(),
        rate_whole: in_whole as f64 / whole.max(1) as f64,
        whole_intervals: whole,
        rate_span: (moments.len() - 1) as f64 / span.as_secs_f64(),
        busiest,
        scripts: delta.scripts(),
        publishes: delta.publishes(),
        messages,
        errors,
        breakdown: breakdown(&delta),
        warm_up,
    }
}

/// What 16 callers that reserved their moments cost Redis while they sleep.
struct Idle {
    rate: u64,
    callers: usize,
    /// Script calls for the 16 reservations.
    scripts: u64,
    /// Commands but INFO during the window in which every caller slept.
    commands_while_waiting: u64,
    window: Duration,
    /// Callers still asleep at the window's end (the window was one of waiting only if > 0).
    asleep_at_end: u64,
    /// Every caller admitted one emission interval after the previous.
    spaced: bool,
    commands_total: u64,
    /// The commands of the window and of the whole test, by name.
    window_breakdown: String,
    total_breakdown: String,
}

/// `name count` of every command but INFO that ran, by count.
fn breakdown(delta: &Stats) -> String {
    let mut v: Vec<_> = delta
        .calls
        .iter()
        .filter(|(name, n)| **n > 0 && name.as_str() != "info")
        .collect();
    v.sort_by(|a, b| b.1.cmp(a.1));
    v.iter()
        .map(|(name, n)| format!("{name} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn idle_waiting(clients: &[Client], raw: &RedisClient, rate: u64) -> Idle {
    let callers = 16;
    let name = unique("rl-idle");
    let limit = RateLimit::per_second(rate).expect("a limit");
    clients[0]
        .rate_limiter(name.clone())
        .set_limit(limit)
        .await
        .expect("set_limit");
    // Earlier rows' limiter channels are unsubscribed by the hub once idle for its linger
    // (2 s after their last waiter): that UNSUBSCRIBE belongs to them, so let it pass first.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = stats(raw).await;
    let done = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let limiter = clients[i % clients.len()]
                .rate_limiter(name.clone())
                .with_limit(limit);
            let done = Arc::clone(&done);
            tokio::spawn(async move {
                let at = limiter.acquire(1).await.expect("acquire").admitted_at();
                done.fetch_add(1, Ordering::SeqCst);
                at
            })
        })
        .collect();
    // Every caller has made its one script call (Redis' count), and the callers sleeping more
    // than one interval ahead have registered on the limiter's channel (one SUBSCRIBE per
    // client, right after its script call), then the window.
    loop {
        if stats(raw).await.since(&before).scripts() >= callers as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    // Half the span of the reservations: every caller but the first few still asleep.
    let window = Duration::from_millis((callers as u64 - 1) * 1000 / rate / 2);
    let start = stats(raw).await;
    tokio::time::sleep(window).await;
    let end = stats(raw).await;
    let asleep_at_end = callers as u64 - done.load(Ordering::SeqCst);
    let mut moments = Vec::new();
    for task in tasks {
        moments.push(task.await.expect("a caller"));
    }
    let total = stats(raw).await.since(&before);
    moments.sort();
    let step = Duration::from_secs(1) / rate as u32;
    let spaced = moments
        .windows(2)
        .all(|w| w[1].duration_since(w[0]).expect("sorted") >= step);
    Idle {
        rate,
        callers,
        scripts: total.scripts(),
        commands_while_waiting: end.all_but_info() - start.all_but_info(),
        window,
        asleep_at_end,
        spaced,
        commands_total: total.all_but_info(),
        window_breakdown: breakdown(&end.since(&start)),
        total_breakdown: breakdown(&total),
    }
}

/// Target 3: per-worker admitted counts.
struct Fair {
    callers: usize,
    rate: u64,
    secs: f64,
    min: u64,
    max: u64,
    busiest: u64,
}

async fn fair(clients: &[Client], run: Duration) -> Fair {
    let callers = 16;
    let rate = 200;
    let name = unique("rl-fair");
    let limit = RateLimit::per_second(rate).expect("a limit");
    let deadline = Instant::now() + run;
    let tasks: Vec<_> = (0..callers)
        .map(|i| {
            let limiter = clients[i % clients.len()]
                .rate_limiter(name.clone())
                .with_limit(limit);
            tokio::spawn(async move {
                let mut moments = Vec::new();
                while Instant::now() < deadline {
                    moments.push(limiter.acquire(1).await.expect("acquire").admitted_at());
                }
                moments
            })
        })
        .collect();
    let mut counts = Vec::new();
    let mut all = Vec::new();
    for task in tasks {
        let m = task.await.expect("a caller");
        counts.push(m.len() as u64);
        all.extend(m.into_iter().map(|at| (at, 1)));
    }
    let (busiest, _) = busiest_window(&all, Duration::from_secs(1));
    Fair {
        callers,
        rate,
        secs: run.as_secs_f64(),
        min: counts.iter().copied().min().unwrap_or(0),
        max: counts.iter().copied().max().unwrap_or(0),
        busiest,
    }
}

// ---------------------------------------------------------------------------------------------
// Throughput

/// What one caller does in a throughput row; returns whether it was admitted.
#[derive(Clone)]
enum Op {
    Ping(RedisClient),
    Try(lockkit::RateLimiter),
    /// `lock()` + `unlock()` of one contended lock (hold 0).
    Lock(lockkit::Lock),
    Script {
        raw: RedisClient,
        sha: String,
        keys: Vec<String>,
        args: Vec<String>,
        /// Index of a per-request unique argument, if any.
        marker: Option<usize>,
    },
}

impl Op {
    async fn run(&self, seq: &mut u64, tag: usize) -> bool {
        match self {
            Op::Ping(raw) => {
                let _: String = raw.ping(None).await.expect("PING");
                true
            }
            Op::Try(limiter) => limiter
                .try_acquire(1, Duration::ZERO)
                .await
                .expect("try_acquire"),
            Op::Lock(lock) => {
                lock.lock()
                    .await
                    .expect("lock")
                    .unlock()
                    .await
                    .expect("unlock");
                true
            }
            Op::Script {
                raw,
                sha,
                keys,
                args,
                marker,
            } => {
                let mut args = args.clone();
                if let Some(i) = marker {
                    *seq += 1;
                    args[*i] = format!("{MARKER_PREFIX}:b{tag}:{seq}");
                }
                let reply: Vec<i64> = raw
                    .evalsha(sha.as_str(), keys.clone(), args)
                    .await
                    .expect("EVALSHA");
                reply.first() == Some(&1)
            }
        }
    }
}

/// Runs `ops` (one per caller) for `run`: (calls per second, share admitted).
async fn throughput(ops: Vec<Op>, run: Duration) -> (f64, f64) {
    let start = Instant::now();
    let deadline = start + run;
    let tasks: Vec<_> = ops
        .into_iter()
        .enumerate()
        .map(|(tag, op)| {
            tokio::spawn(async move {
                let (mut calls, mut admitted, mut seq) = (0u64, 0u64, 0u64);
                while Instant::now() < deadline {
                    if op.run(&mut seq, tag).await {
                        admitted += 1;
                    }
                    calls += 1;
                }
                (calls, admitted)
            })
        })
        .collect();
    let (mut calls, mut admitted) = (0, 0);
    for task in tasks {
        let (c, a) = task.await.expect("a caller");
        calls += c;
        admitted += a;
    }
    let elapsed = start.elapsed().as_secs_f64();
    (
        calls as f64 / elapsed,
        admitted as f64 / calls.max(1) as f64,
    )
}

/// A named row of interleaved throughput rounds.
struct Row {
    name: String,
    callers: usize,
    ops: Box<dyn Fn() -> Vec<Op>>,
    rates: Vec<f64>,
    admitted: Vec<f64>,
}

impl Row {
    fn mean(&self) -> f64 {
        self.rates.iter().sum::<f64>() / self.rates.len().max(1) as f64
    }
    fn admitted(&self) -> f64 {
        self.admitted.iter().sum::<f64>() / self.admitted.len().max(1) as f64
    }
}

/// Runs every row once per round, in order, `rounds` times.
async fn interleaved(rows: &mut [Row], rounds: usize, run: Duration) {
    for _ in 0..rounds {
        for row in rows.iter_mut() {
            let (rate, admitted) = throughput((row.ops)(), run).await;
            row.rates.push(rate);
            row.admitted.push(admitted);
        }
    }
}

fn callers_on<T: Clone>(pool: &[T], callers: usize) -> Vec<T> {
    (0..callers).map(|i| pool[i % pool.len()].clone()).collect()
}

/// Uncontended: medians of one caller's lock + unlock, try_acquire and PING, interleaved.
struct Uncontended {
    lock_unlock: Duration,
    try_acquire: Duration,
    ping: Duration,
}

async fn uncontended(client: &Client, raw: &RedisClient, samples: usize) -> Uncontended {
    let lock = client.lock(unique("rl-uncontended-lock"));
    let limiter = client
        .rate_limiter(unique("rl-uncontended"))
        .with_limit(RateLimit::per_second(1_000_000).expect("a limit"));
    let (mut l, mut t, mut p) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..samples / 50 {
        for _ in 0..50 {
            let s = Instant::now();
            lock.lock()
                .await
                .expect("lock")
                .unlock()
                .await
                .expect("unlock");
            l.push(s.elapsed());
        }
        for _ in 0..50 {
            let s = Instant::now();
            limiter
                .try_acquire(1, Duration::ZERO)
                .await
                .expect("try_acquire");
            t.push(s.elapsed());
        }
        for _ in 0..50 {
            let s = Instant::now();
            let _: String = raw.ping(None).await.expect("PING");
            p.push(s.elapsed());
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    Uncontended {
        lock_unlock: median(&mut l),
        try_acquire: median(&mut t),
        ping: median(&mut p),
    }
}

// ---------------------------------------------------------------------------------------------
// The candidates

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Candidate {
    /// lockkit's script, burst 0.
    Gcra,
    /// lockkit's script with a burst of n − 1 (admits n at once, as the two others do).
    GcraBurst,
    SlidingLog,
    FixedWindow,
    /// lockkit's script without its waiting ZSET (the list of reservations to come that
    /// `waiting()` and `inspect` read), burst 0: what that list costs a reserving request.
    GcraNoWaiting,
}

impl Candidate {
    fn label(self) -> &'static str {
        match self {
            Candidate::Gcra => "GCRA + reservation (lockkit's script), burst 0",
            Candidate::GcraBurst => "GCRA + reservation (lockkit's script), burst n − 1",
            Candidate::SlidingLog => "sliding log (ZSET) + reservation",
            Candidate::FixedWindow => "fixed window counter (INCR + PEXPIRE)",
            Candidate::GcraNoWaiting => "GCRA + reservation without the waiting ZSET, burst 0",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Candidate::Gcra => "gcra",
            Candidate::GcraBurst => "gcra_burst",
            Candidate::SlidingLog => "sliding_log",
            Candidate::FixedWindow => "fixed_window",
            Candidate::GcraNoWaiting => "gcra_no_waiting",
        }
    }
}

/// The shas of the three scripts.
struct Shas {
    gcra: String,
    gcra_no_waiting: String,
    sliding: String,
    fixed: String,
}

async fn load(raw: &RedisClient) -> Shas {
    Shas {
        gcra: raw.script_load(ACQUIRE.source()).await.expect("load"),
        gcra_no_waiting: raw
            .script_load(without_waiting(ACQUIRE.source()))
            .await
            .expect("load"),
        sliding: raw.script_load(SLIDING_LOG).await.expect("load"),
        fixed: raw.script_load(FIXED_WINDOW).await.expect("load"),
    }
}

/// lockkit's acquire script without the block that lists a reservation in the waiting ZSET.
fn without_waiting(source: &str) -> String {
    let start = source
        .find("if delay > 0 then\n  local now_ms")
        .expect("the waiting block of the acquire script");
    let len = source[start..].find("\nend\n").expect("its end") + "\nend\n".len();
    format!("{}{}", &source[..start], &source[start + len..])
}

/// One request of `candidate` for a limit of `n` per `interval_ms` on `name`, waiting at most
/// `wait_us` (-1: any): (sha, keys, args, index of the marker argument).
fn request(
    shas: &Shas,
    candidate: Candidate,
    name: &str,
    n: u64,
    interval_ms: u64,
    wait_us: i64,
) -> (String, Vec<String>, Vec<String>, Option<usize>) {
    match candidate {
        Candidate::Gcra | Candidate::GcraBurst | Candidate::GcraNoWaiting => {
            let (k1, k2) = limiter_keys(name);
            let burst = if candidate == Candidate::GcraBurst {
                n - 1
            } else {
                0
            };
            let sha = if candidate == Candidate::GcraNoWaiting {
                &shas.gcra_no_waiting
            } else {
                &shas.gcra
            };
            (
                sha.clone(),
                vec![k1.clone(), k2, format!("{k1}:client:bench")],
                vec![
                    "1".into(),
                    wait_us.to_string(),
                    String::new(),
                    n.to_string(),
                    interval_ms.to_string(),
                    burst.to_string(),
                    "overall".into(),
                    format!("{k1}:released"),
                    "0".into(),
                ],
                Some(2),
            )
        }
        Candidate::SlidingLog => (
            shas.sliding.clone(),
            vec![format!("bench:slidinglog:{{{name}}}")],
            vec![
                n.to_string(),
                interval_ms.to_string(),
                String::new(),
                wait_us.to_string(),
            ],
            Some(2),
        ),
        Candidate::FixedWindow => (
            shas.fixed.clone(),
            vec![format!("bench:fixedwindow:{{{name}}}")],
            vec![n.to_string(), interval_ms.to_string()],
            None,
        ),
    }
}

fn script_op(raw: &RedisClient, req: &(String, Vec<String>, Vec<String>, Option<usize>)) -> Op {
    Op::Script {
        raw: raw.clone(),
        sha: req.0.clone(),
        keys: req.1.clone(),
        args: req.2.clone(),
        marker: req.3,
    }
}

/// Sends `count` requests of `candidate` at once (over the raw clients), returning the
/// admitted moments (server clock).
async fn burst_of(
    raws: &[RedisClient],
    req: &(String, Vec<String>, Vec<String>, Option<usize>),
    count: usize,
    tag: &str,
) -> Vec<SystemTime> {
    let calls = (0..count).map(|i| {
        let raw = raws[i % raws.len()].clone();
        let mut args = req.2.clone();
        if let Some(m) = req.3 {
            args[m] = format!("{MARKER_PREFIX}:{tag}:{i}");
        }
        let (sha, keys) = (req.0.clone(), req.1.clone());
        async move {
            let reply: Vec<i64> = raw.evalsha(sha, keys, args).await.expect("EVALSHA");
            (reply[0] == 1).then(|| UNIX_EPOCH + Duration::from_micros(reply[2] as u64))
        }
    });
    futures::future::join_all(calls)
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The boundary test: one try opens a window, `n − 1` come 40 ms before one interval later, `n`
/// 40 ms after it. The busiest window of one interval over the admitted moments.
async fn boundary(raws: &[RedisClient], shas: &Shas, candidate: Candidate, n: u64) -> (u64, usize) {
    let interval = Duration::from_millis(1000);
    let name = unique("rl-boundary");
    let req = request(shas, candidate, &name, n, 1000, 0);
    let start = Instant::now();
    let mut admitted = burst_of(raws, &req, 1, "first").await;
    tokio::time::sleep_until((start + interval - Duration::from_millis(40)).into()).await;
    admitted.extend(burst_of(raws, &req, n as usize - 1, "before").await);
    tokio::time::sleep_until((start + interval + Duration::from_millis(40)).into()).await;
    admitted.extend(burst_of(raws, &req, n as usize, "after").await);
    let weighted: Vec<_> = admitted.iter().map(|at| (*at, 1)).collect();
    (busiest_window(&weighted, interval).0, admitted.len())
}

/// `MEMORY USAGE` of a limiter of 10 000 per interval (60 s) after 10 000 requests: the keys of
/// the candidate, summed. `reserve`: GCRA's requests wait (they reserve, filling its waiting
/// ZSET) rather than try.
async fn memory(
    raws: &[RedisClient],
    raw: &RedisClient,
    shas: &Shas,
    candidate: Candidate,
    reserve: bool,
) -> u64 {
    let name = unique("rl-memory");
    let n = 10_000;
    let req = request(
        shas,
        candidate,
        &name,
        n,
        60_000,
        if reserve { -1 } else { 0 },
    );
    for chunk in 0..(n as usize / 500) {
        burst_of(raws, &req, 500, &format!("m{chunk}")).await;
    }
    let mut total = 0;
    for key in &req.1 {
        total += memory_usage(raw, key).await;
    }
    total
}

// ---------------------------------------------------------------------------------------------
// Peers

struct PeerRow {
    peer: String,
    row: String,
    callers: u64,
    rate: f64,
    ping: f64,
    admitted: f64,
}

fn peers_dir() -> PathBuf {
    std::env::var("LOCKKIT_RL_PEERS_DIR").map_or_else(
        |_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/peers-rl"),
        PathBuf::from,
    )
}

/// Runs every installed peer runner; each prints one JSON line per row.
fn run_peers(url: &str, secs: f64) -> (Vec<PeerRow>, Vec<(String, u64, usize)>) {
    let dir = peers_dir();
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/peers");
    let mut runners: Vec<(String, std::process::Command)> = Vec::new();
    let node = dir.join("node/node_modules/rate-limiter-flexible");
    if node.exists() {
        let mut cmd = std::process::Command::new("node");
        cmd.arg(here.join("rl_runner.js"))
            .env("NODE_PATH", dir.join("node/node_modules"));
        runners.push(("rate-limiter-flexible".into(), cmd));
    }
    let python = dir.join("venv/bin/python");
    if python.exists() {
        let mut cmd = std::process::Command::new(python);
        cmd.arg(here.join("rl_runner.py"));
        runners.push(("limits".into(), cmd));
    }
    let (mut rows, mut bounds) = (Vec::new(), Vec::new());
    for (peer, mut cmd) in runners {
        let out = cmd
            .arg(url)
            .arg(secs.to_string())
            .output()
            .expect("a peer runner");
        if !out.status.success() {
            eprintln!(
                "{peer}: runner failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            continue;
        }
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
                continue;
            };
            if let Some(b) = v.get("boundary_busiest").and_then(|b| b.as_u64()) {
                bounds.push((
                    format!("{peer} {}", v["row"].as_str().unwrap_or("")),
                    b,
                    v["n"].as_u64().unwrap_or(0) as usize,
                ));
                continue;
            }
            rows.push(PeerRow {
                peer: peer.clone(),
                row: v["row"].as_str().unwrap_or("").into(),
                callers: v["callers"].as_u64().unwrap_or(0),
                rate: v["rate"].as_f64().unwrap_or(0.0),
                ping: v["ping"].as_f64().unwrap_or(0.0),
                admitted: v["admitted"].as_f64().unwrap_or(0.0),
            });
        }
    }
    (rows, bounds)
}

// ---------------------------------------------------------------------------------------------

fn mark(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**missed**"
    }
}

async fn bench(url: &str, smoke: bool) {
    let rate: u64 = std::env::var("LOCKKIT_RL_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500);
    let exact_run = if smoke {
        Duration::from_secs(2)
    } else {
        secs_env("LOCKKIT_RL_SECS", 10.0)
    };
    let fair_run = if smoke {
        Duration::from_secs(1)
    } else {
        secs_env("LOCKKIT_RL_FAIR_SECS", 5.0)
    };
    let round = if smoke {
        Duration::from_millis(200)
    } else {
        secs_env("LOCKKIT_RL_ROUND_SECS", 1.0)
    };
    let rounds = if smoke { 1 } else { 3 };

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(lockkit_suite::client(url).await);
    }
    let mut raws = Vec::new();
    for _ in 0..CLIENTS {
        raws.push(lockkit_suite::raw_like_lockkit(url).await);
    }
    let raw = lockkit_suite::raw_like_lockkit(url).await;
    let started = SystemTime::now();

    eprintln!("exact: {CALLERS} callers on {CLIENTS} clients, {rate}/s, {exact_run:?}");
    let ex = exact(&clients, &raw, rate, exact_run).await;
    // The same 64 callers against a limit under 64 per interval: callers wait more than one
    // interval ahead (they listen for a data loss meanwhile, and send nothing).
    let low_rate: u64 = std::env::var("LOCKKIT_RL_LOW_RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    eprintln!("exact: {CALLERS} callers on {CLIENTS} clients, {low_rate}/s, {exact_run:?}");
    let low = exact(&clients, &raw, low_rate, exact_run).await;
    eprintln!("idle waiting");
    // 16 callers of 20/s: every moment within one interval; of 10/s: the last five lie beyond it
    // (far: they listen for a data loss, one subscription per client).
    let idles = [
        idle_waiting(&clients, &raw, 20).await,
        idle_waiting(&clients, &raw, 10).await,
    ];
    eprintln!("fair");
    let fa = fair(&clients, fair_run).await;

    eprintln!("throughput");
    let shas = load(&raw).await;
    let mut rows: Vec<Row> = Vec::new();
    for callers in [16, 64] {
        let raws_c = raws.clone();
        rows.push(Row {
            name: "PING (fred, configured like lockkit)".into(),
            callers,
            ops: Box::new(move || {
                callers_on(&raws_c, callers)
                    .into_iter()
                    .map(Op::Ping)
                    .collect()
            }),
            rates: vec![],
            admitted: vec![],
        });
        for (label, limit) in [
            (
                "try_acquire(1, ZERO), every try admitted (10⁶/s)",
                1_000_000,
            ),
            ("try_acquire(1, ZERO), most refused (100/s)", 100),
        ] {
            let limiters: Vec<_> = clients
                .iter()
                .map(|c| {
                    c.rate_limiter(format!("rl-tp-{callers}-{limit}"))
                        .with_limit(RateLimit::per_second(limit).expect("a limit"))
                })
                .collect();
            rows.push(Row {
                name: label.into(),
                callers,
                ops: Box::new(move || {
                    callers_on(&limiters, callers)
                        .into_iter()
                        .map(Op::Try)
                        .collect()
                }),
                rates: vec![],
                admitted: vec![],
            });
        }
        // The lock bench's contended row in this run: W callers on one lock, hold 0.
        let locks: Vec<_> = clients
            .iter()
            .map(|c| c.lock(format!("rl-tp-lock-{callers}")))
            .collect();
        rows.push(Row {
            name: "Lock::lock() + unlock(), one lock, hold 0 (the lock bench's contended row)"
                .into(),
            callers,
            ops: Box::new(move || {
                callers_on(&locks, callers)
                    .into_iter()
                    .map(Op::Lock)
                    .collect()
            }),
            rates: vec![],
            admitted: vec![],
        });
    }
    // The candidates, raw, W = 16.
    let callers = 16;
    for candidate in [
        Candidate::Gcra,
        Candidate::SlidingLog,
        Candidate::FixedWindow,
    ] {
        for (load_name, n, interval) in [
            ("every try admitted", 1_000_000_u64, 1000_u64),
            ("most refused", 100, 1000),
        ] {
            let req = request(
                &shas,
                candidate,
                &format!("rl-cand-{}-{n}", candidate.key()),
                n,
                interval,
                0,
            );
            let raws_c = raws.clone();
            rows.push(Row {
                name: format!("raw EVALSHA: {}, {load_name}", candidate.label()),
                callers,
                ops: Box::new(move || {
                    callers_on(&raws_c, callers)
                        .iter()
                        .map(|r| script_op(r, &req))
                        .collect()
                }),
                rates: vec![],
                admitted: vec![],
            });
        }
    }
    // Every request reserved (a limit of 10⁶ per 600 s: 1 667/s, fewer than the callers ask):
    // lockkit's script against the same without its waiting ZSET.
    for candidate in [Candidate::Gcra, Candidate::GcraNoWaiting] {
        let req = request(
            &shas,
            candidate,
            &format!("rl-reserve-{}", candidate.key()),
            1_000_000,
            600_000,
            -1,
        );
        let raws_c = raws.clone();
        rows.push(Row {
            name: format!("raw EVALSHA: {}, every request reserved", candidate.label()),
            callers,
            ops: Box::new(move || {
                callers_on(&raws_c, callers)
                    .iter()
                    .map(|r| script_op(r, &req))
                    .collect()
            }),
            rates: vec![],
            admitted: vec![],
        });
    }
    interleaved(&mut rows, rounds, round).await;
    let unc = uncontended(&clients[0], &raws[0], if smoke { 100 } else { 2000 }).await;

    eprintln!("memory and boundary");
    let n_boundary = 100;
    let mut bounds = Vec::new();
    let mut memories = Vec::new();
    for candidate in [
        Candidate::Gcra,
        Candidate::GcraBurst,
        Candidate::SlidingLog,
        Candidate::FixedWindow,
    ] {
        let (busiest, admitted) = boundary(&raws, &shas, candidate, n_boundary).await;
        bounds.push((candidate, busiest, admitted));
        if candidate != Candidate::GcraBurst {
            memories.push((
                candidate,
                false,
                memory(&raws, &raw, &shas, candidate, false).await,
            ));
        }
    }
    memories.push((
        Candidate::Gcra,
        true,
        memory(&raws, &raw, &shas, Candidate::Gcra, true).await,
    ));

    let (peer_rows, peer_bounds) =
        if smoke || std::env::var("LOCKKIT_RL_PEERS").as_deref() == Ok("none") {
            (vec![], vec![])
        } else {
            eprintln!("peers");
            run_peers(url, round.as_secs_f64())
        };

    // -----------------------------------------------------------------------------------------
    let ping_of = |callers: usize| {
        rows.iter()
            .find(|r| r.callers == callers && r.name.starts_with("PING"))
            .map_or(f64::NAN, Row::mean)
    };
    let rate_err = (ex.rate_whole - ex.rate as f64).abs() / ex.rate as f64;
    let per_admission = ex.scripts as f64 / ex.admitted as f64;
    let fair_ratio = fa.min as f64 / fa.max.max(1) as f64;
    let when = started
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());

    println!("## Issue 30's targets (rate limiter)\n");
    println!(
        "`cargo bench --bench rate_limiter`, one `redis-server`, run started at unix {when}.\n"
    );
    println!("| target | measured | |\n|---|---|---|");
    println!(
        "| 1. admitted rate within 1 % of the limit ({CALLERS} callers on {CLIENTS} clients, \
         `acquire(1)`, {} s, {}/s, burst 0; server clock, the {} whole intervals from the first \
         admission) | {:.1}/s ({:+.2} %); (N − 1)/(last − first) = {:.2}/s; {} admitted, {} \
         errors | {} |",
        ex.secs,
        ex.rate,
        ex.whole_intervals,
        ex.rate_whole,
        (ex.rate_whole - ex.rate as f64) / ex.rate as f64 * 100.0,
        ex.rate_span,
        ex.admitted,
        ex.errors,
        mark(rate_err <= 0.01 && ex.errors == 0)
    );
    println!(
        "| 1. every window of one interval ≤ rate + burst | busiest 1 s window {} ≤ {} (same run) \
         | {} |",
        ex.busiest,
        ex.rate,
        mark(ex.busiest <= ex.rate)
    );
    println!(
        "| 2. 1 script call per admitted acquisition (Redis' `EVALSHA` + `EVAL` calls over \
         admissions, same run, after one warm-up acquire that loaded the script: {}) | {:.3} ({} / {}; the run's commands: {}) | {} |",
        ex.warm_up,
        per_admission,
        ex.scripts,
        ex.admitted,
        ex.breakdown,
        mark(per_admission <= 1.0 + 1e-9)
    );
    println!(
        "| 2. 0 pub/sub messages (same run) | `PUBLISH` + `SPUBLISH` calls {}, messages lockkit \
         received {} | {} |",
        ex.publishes,
        ex.messages,
        mark(ex.publishes == 0 && ex.messages == 0)
    );
    let low_err = (low.rate_whole - low.rate as f64).abs() / low.rate as f64;
    let low_per = low.scripts as f64 / low.admitted as f64;
    println!(
        "| 1, 2. the same {CALLERS} callers against {}/s (more callers than one interval's \
         permits: some wait more than one interval ahead) | admitted {:.1}/s ({:+.2} %), busiest 1 s window \
         {} ≤ {}; {:.3} script calls per admission ({} / {}: {}); pub/sub {} + {} | {} |",
        low.rate,
        low.rate_whole,
        (low.rate_whole - low.rate as f64) / low.rate as f64 * 100.0,
        low.busiest,
        low.rate,
        low_per,
        low.scripts,
        low.admitted,
        low.breakdown,
        low.publishes,
        low.messages,
        mark(
            low_err <= 0.01 && low.busiest <= low.rate && low_per <= 1.0 + 1e-9 && low.errors == 0
        )
    );
    for idle in &idles {
        println!(
        "| 2. a waiting caller costs Redis nothing | {} callers of {}/s (their moments up to {} ms ahead; those more than one interval, 1 s, ahead listen for a data loss) reserved with {} script \
         calls, then in a {:?} window while {} of them slept: {} commands (all but `INFO`: {}); \
         all {} admitted one emission interval apart: {}; {} commands in all ({}) | {} |",
        idle.callers,
        idle.rate,
        (idle.callers as u64 - 1) * 1000 / idle.rate,
        idle.scripts,
        idle.window,
        idle.asleep_at_end,
        idle.commands_while_waiting,
        idle.window_breakdown,
        idle.callers,
        idle.spaced,
        idle.commands_total,
        idle.total_breakdown,
        mark(idle.commands_while_waiting == 0 && idle.asleep_at_end > 0 && idle.spaced)
    );
    }
    for callers in [16, 64] {
        let ping = ping_of(callers);
        let parts: Vec<String> = rows
            .iter()
            .filter(|r| {
                r.callers == callers
                    && (r.name.starts_with("try_acquire") || r.name.starts_with("Lock::"))
            })
            .map(|r| {
                format!(
                    "{}: {:.0}/s = {:.2} × PING ({:.0}/s), {:.0} % admitted",
                    r.name,
                    r.mean(),
                    r.mean() / ping,
                    ping,
                    r.admitted() * 100.0
                )
            })
            .collect();
        println!(
            "| 2. `try_acquire` throughput under contention, ratio to PING ({callers} callers on \
             {CLIENTS} clients, same run) | {} | reported |",
            parts.join("; ")
        );
    }
    println!(
        "| 2. uncontended (one caller, medians, interleaved) | `Lock::lock()` + `unlock()` {:.0} \
         µs = {:.2} × PING; `try_acquire(1, ZERO)` {:.0} µs = {:.2} × PING; PING {:.0} µs | \
         reported |",
        micros(unc.lock_unlock),
        micros(unc.lock_unlock) / micros(unc.ping),
        micros(unc.try_acquire),
        micros(unc.try_acquire) / micros(unc.ping),
        micros(unc.ping)
    );
    println!(
        "| 3. fair: per-worker min/max ≥ 0.9 ({} callers on {CLIENTS} clients asking faster than \
         {}/s, `acquire(1)`, {} s) | {:.3} ({} / {}); busiest 1 s window {} | {} |",
        fa.callers,
        fa.rate,
        fa.secs,
        fair_ratio,
        fa.min,
        fa.max,
        fa.busiest,
        mark(fair_ratio >= 0.9 && fa.busiest <= fa.rate)
    );

    println!(
        "\n### Every throughput row (calls/s, mean of {rounds} interleaved rounds of {round:?})\n"
    );
    println!("| row | callers | calls/s | ÷ PING | admitted |\n|---|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.0} % |",
            r.name,
            r.callers,
            r.mean(),
            r.mean() / ping_of(r.callers),
            r.admitted() * 100.0
        );
    }
    println!("\n### The candidates: memory and the window edge\n");
    println!("| candidate | `MEMORY USAGE` at 10 000 per interval (B) | busiest 1 s window, {} tries before an edge and {} after (n = {}) |\n|---|---:|---:|", n_boundary, n_boundary, n_boundary);
    for (candidate, busiest, admitted) in &bounds {
        let mem: Vec<String> = memories
            .iter()
            .filter(|(c, _, _)| c == candidate)
            .map(|(_, reserve, m)| {
                if *reserve {
                    format!("{m} (every request reserved: the waiting ZSET)")
                } else {
                    format!("{m}")
                }
            })
            .collect();
        println!(
            "| {} | {} | {busiest} ({admitted} admitted in all) |",
            candidate.label(),
            if mem.is_empty() {
                "as above".into()
            } else {
                mem.join("; ")
            }
        );
    }
    if !peer_rows.is_empty() || !peer_bounds.is_empty() {
        println!("\n### Peers (their own runner and client, ratio to that client's PING)\n");
        println!("| peer | row | callers | calls/s | ÷ own PING | admitted |\n|---|---|---:|---:|---:|---:|");
        for p in &peer_rows {
            println!(
                "| {} | {} | {} | {:.0} | {:.2} | {:.0} % |",
                p.peer,
                p.row,
                p.callers,
                p.rate,
                p.rate / p.ping,
                p.admitted * 100.0
            );
        }
        for (name, busiest, n) in &peer_bounds {
            println!("| {name} | busiest 1 s window at an edge (n = {n}) | | {busiest} | | |");
        }
    }

    if !smoke {
        let out = std::env::var("LOCKKIT_BENCH_OUT").map_or_else(
            |_| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("target/bench-results/rate_limiter.json")
            },
            PathBuf::from,
        );
        let doc = json!({
            "started_unix": when,
            "exact": {
                "callers": CALLERS, "clients": CLIENTS, "rate": ex.rate, "secs": ex.secs,
                "admitted": ex.admitted, "rate_whole_intervals": ex.rate_whole,
                "whole_intervals": ex.whole_intervals, "rate_span": ex.rate_span,
                "busiest_window": ex.busiest, "script_calls": ex.scripts,
                "script_calls_per_admission": per_admission, "publishes": ex.publishes,
                "pubsub_messages": ex.messages, "errors": ex.errors,
            },
            "exact_low_rate": {
                "callers": CALLERS, "clients": CLIENTS, "rate": low.rate, "secs": low.secs,
                "admitted": low.admitted, "rate_whole_intervals": low.rate_whole,
                "busiest_window": low.busiest, "script_calls": low.scripts,
                "script_calls_per_admission": low_per, "publishes": low.publishes,
                "pubsub_messages": low.messages, "errors": low.errors, "commands": low.breakdown,
            },
            "idle_waiting": idles.iter().map(|idle| json!({
                "callers": idle.callers, "rate": idle.rate, "script_calls": idle.scripts,
                "commands_while_waiting": idle.commands_while_waiting,
                "window_secs": idle.window.as_secs_f64(), "asleep_at_end": idle.asleep_at_end,
                "spaced": idle.spaced, "commands_total": idle.commands_total,
                "window_commands": idle.window_breakdown, "commands": idle.total_breakdown,
            })).collect::<Vec<_>>(),
            "fair": {
                "callers": fa.callers, "rate": fa.rate, "secs": fa.secs, "min": fa.min,
                "max": fa.max, "min_over_max": fair_ratio, "busiest_window": fa.busiest,
            },
            "uncontended_us": {
                "lock_unlock": micros(unc.lock_unlock), "try_acquire": micros(unc.try_acquire),
                "ping": micros(unc.ping),
            },
            "throughput": rows.iter().map(|r| json!({
                "row": r.name, "callers": r.callers, "calls_per_sec": r.mean(),
                "rounds": r.rates, "ratio_to_ping": r.mean() / ping_of(r.callers),
                "admitted_share": r.admitted(),
            })).collect::<Vec<_>>(),
            "candidates": bounds.iter().map(|(c, b, a)| json!({
                "candidate": c.key(), "boundary_n": n_boundary, "boundary_busiest": b,
                "boundary_admitted": a,
                "memory_bytes": memories.iter().filter(|(m, r, _)| m == c && !r).map(|(_, _, v)| *v).next(),
                "memory_bytes_reserved": memories.iter().filter(|(m, r, _)| m == c && *r).map(|(_, _, v)| *v).next(),
            })).collect::<Vec<_>>(),
            "peers": peer_rows.iter().map(|p| json!({
                "peer": p.peer, "row": p.row, "callers": p.callers, "calls_per_sec": p.rate,
                "ping_per_sec": p.ping, "ratio_to_own_ping": p.rate / p.ping,
                "admitted_share": p.admitted,
            })).collect::<Vec<_>>(),
            "peer_boundaries": peer_bounds.iter().map(|(n, b, k)| json!({"peer": n, "busiest": b, "n": k})).collect::<Vec<_>>(),
        });
        if let Some(dir) = out.parent() {
            std::fs::create_dir_all(dir).expect("the results directory");
        }
        std::fs::write(&out, serde_json::to_string_pretty(&doc).expect("json")).expect("write");
        eprintln!("saved: {}", out.display());
    }
    for client in &clients {
        client.shutdown().await.expect("shutdown");
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let bench_mode = args.iter().any(|arg| arg == "--bench");
    if args.iter().any(|arg| arg == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    metrics::set_global_recorder(MessageRecorder).expect("the only metrics recorder");
    let server = rt.block_on(lockkit_suite::spawned());
    rt.block_on(bench(&server.url(), !bench_mode));
    drop(server);
}
