//! Contention: W workers fighting for one lock, against the floor of one raw `EVALSHA` round trip.
//!
//! One process spawns one `redis-server` on a loopback port. For each of `Lock`, `FairLock` and
//! `SpinLock`, for each row (W workers, hold H, think T), W tokio tasks on one multi-thread
//! runtime, each with its **own** `lockkit::Client` (its own connections), loop for D seconds:
//! acquire (`lock()`, watchdog mode), hold H (a tokio sleep), release (`unlock()`), think T.
//!
//! Every event is timed on one monotonic clock (`std::time::Instant`). From the merged record
//! (ordered by the instants acquires returned; the lock is exclusive, so that is the order of
//! holds) it computes:
//!
//! - acquisitions in the window (acquire returned before the deadline), per worker min/max;
//! - owner changes: acquisitions by a different worker than the previous holder;
//! - handoff latency: for owner changes where the new holder was already waiting (its acquire
//!   call started before the previous holder called unlock), from the previous holder's unlock
//!   call to the new holder's acquire return; p50 and p99;
//! - the measured hold (acquire return to unlock call) and the net overhead per acquisition,
//!   `D / acquisitions − mean measured hold`.
//!
//! The floor is measured in the same run: the median of 200 `EVALSHA` round trips of a trivial
//! script through a plain fred client, configured and framed as in `benches/latency.rs`. Handoff
//! p50/p99 and net overhead are also given in those round trips (RTT). After the rows it measures
//! the floor again (drift check) and once more with a 10 ms sleep before each round trip
//! (diagnostic: what one round trip costs a process that was idle, as a waiter is during a hold).
//!
//! Run: `cargo bench --bench contention`. `LOCKKIT_BENCH_SECS` sets D (seconds, default 3).
//! Without `--bench` (`cargo test --benches`) it runs a short smoke test only.

use std::time::{Duration, Instant};

use fred::interfaces::{ClientLike, LuaInterface};
use fred::prelude::{Client as RedisClient, Config, ReconnectPolicy};
use fred::types::{Builder, ClusterHash, CustomCommand, Value};
use lockkit::protocol::keys::Namespace;
use lockkit::protocol::lock::hold_marker;
use lockkit::protocol::slot::key_slot;
use lockkit::{Client, Error, FairLock, Lock, LockGuard, SpinLock};

/// Round trips of the floor.
const RTT_SAMPLES: usize = 200;
/// The trivial script of the floor.
const TRIVIAL: &str = "return {1, 1}";
/// The most workers any row uses (one client each, built once).
const MAX_WORKERS: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Primitive {
    Lock,
    FairLock,
    SpinLock,
}

impl Primitive {
    const ALL: [Primitive; 3] = [Primitive::Lock, Primitive::FairLock, Primitive::SpinLock];

    fn name(self) -> &'static str {
        match self {
            Primitive::Lock => "Lock",
            Primitive::FairLock => "FairLock",
            Primitive::SpinLock => "SpinLock",
        }
    }
}

/// One worker's handle on the contended lock.
enum Handle {
    Lock(Lock),
    FairLock(FairLock),
    SpinLock(SpinLock),
}

impl Handle {
    fn new(client: &Client, primitive: Primitive, name: &str) -> Handle {
        match primitive {
            Primitive::Lock => Handle::Lock(client.lock(name)),
            Primitive::FairLock => Handle::FairLock(client.fair_lock(name)),
            Primitive::SpinLock => Handle::SpinLock(client.spin_lock(name)),
        }
    }

    /// Waits without bound, watchdog mode.
    async fn lock(&self) -> Result<LockGuard, Error> {
        match self {
            Handle::Lock(lock) => lock.lock().await,
            Handle::FairLock(lock) => lock.lock().await,
            Handle::SpinLock(lock) => lock.lock().await,
        }
    }
}

/// One row of the table: W workers, hold H, think T.
#[derive(Debug, Clone, Copy)]
struct Row {
    primitive: Primitive,
    workers: usize,
    hold: Duration,
    think: Duration,
}

/// One hold, as a worker saw it.
#[derive(Debug, Clone, Copy)]
struct Event {
    worker: usize,
    /// When the worker called acquire.
    called: Instant,
    /// When acquire returned (the hold starts).
    acquired: Instant,
    /// When the worker called unlock (the hold ends).
    unlocking: Instant,
}

/// What one row measured.
struct Outcome {
    row: Row,
    window: Duration,
    acquisitions: usize,
    min_max: f64,
    owner_changes: usize,
    handoffs: Vec<Duration>,
    mean_hold: Duration,
    /// Holds that began before the previous one ended (must be 0).
    overlaps: usize,
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The rows, in order: per primitive, W ∈ {4, 16} × H ∈ {0, 10 ms} with T = 0, then
/// W ∈ {4, 16} × T ∈ {5, 20 ms} with H = 5 ms.
fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for primitive in Primitive::ALL {
        for (hold, think) in [(0, 0), (10, 0), (5, 5), (5, 20)] {
            for workers in [4, MAX_WORKERS] {
                rows.push(Row {
                    primitive,
                    workers,
                    hold: ms(hold),
                    think: ms(think),
                });
            }
        }
    }
    rows
}

/// One worker: acquire, hold, release, think, until the deadline. After the deadline an acquire
/// that returns is released at once (not counted), so every worker ends within a handoff or so.
async fn worker(
    index: usize,
    handle: Handle,
    hold: Duration,
    think: Duration,
    deadline: Instant,
) -> Vec<Event> {
    let mut events = Vec::with_capacity(4096);
    while Instant::now() < deadline {
        let called = Instant::now();
        let guard = handle.lock().await.expect("lock");
        let acquired = Instant::now();
        if acquired < deadline && !hold.is_zero() {
            tokio::time::sleep(hold).await;
        }
        let unlocking = Instant::now();
        guard.unlock().await.expect("unlock");
        events.push(Event {
            worker: index,
            called,
            acquired,
            unlocking,
        });
        if !think.is_zero() && Instant::now() < deadline {
            tokio::time::sleep(think).await;
        }
    }
    events
}

async fn run_row(clients: &[Client], row: Row, window: Duration) -> Outcome {
    let name = lockkit_suite::unique(&format!("bench-contention-{}", row.primitive.name()));
    let start = Instant::now();
    let deadline = start + window;
    let tasks: Vec<_> = clients[..row.workers]
        .iter()
        .enumerate()
        .map(|(index, client)| {
            let handle = Handle::new(client, row.primitive, &name);
            tokio::spawn(worker(index, handle, row.hold, row.think, deadline))
        })
        .collect();
    let mut events = Vec::new();
    let mut per_worker = Vec::with_capacity(row.workers);
    let joined = lockkit_suite::within(
        window + Duration::from_secs(60),
        "the workers of a contention row",
        futures::future::join_all(tasks),
    )
    .await;
    for result in joined {
        let worker_events = result.expect("a worker panicked");
        per_worker.push(
            worker_events
                .iter()
                .filter(|e| e.acquired < deadline)
                .count(),
        );
        events.extend(worker_events);
    }
    events.sort_unstable_by_key(|e| e.acquired);

    let counted: Vec<&Event> = events.iter().filter(|e| e.acquired < deadline).collect();
    let acquisitions = counted.len();
    let total_hold: Duration = counted.iter().map(|e| e.unlocking - e.acquired).sum();
    let mean_hold = total_hold / u32::try_from(acquisitions.max(1)).unwrap_or(u32::MAX);
    let max = per_worker.iter().copied().max().unwrap_or(0);
    let min = per_worker.iter().copied().min().unwrap_or(0);
    let min_max = if max == 0 {
        0.0
    } else {
        min as f64 / max as f64
    };

    let mut owner_changes = 0;
    let mut overlaps = 0;
    let mut handoffs = Vec::new();
    for pair in events.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        if next.acquired < prev.unlocking {
            overlaps += 1;
        }
        if next.acquired >= deadline || next.worker == prev.worker {
            continue;
        }
        owner_changes += 1;
        if next.called <= prev.unlocking {
            handoffs.push(next.acquired.saturating_duration_since(prev.unlocking));
        }
    }
    handoffs.sort_unstable();
    Outcome {
        row,
        window,
        acquisitions,
        min_max,
        owner_changes,
        handoffs,
        mean_hold,
        overlaps,
    }
}

/// The floor: a plain fred client configured like lockkit's command client, sending
/// `EVALSHA <trivial> 1 <key> <owner> <marker> <lease>` (the shape of lockkit's acquire).
struct Floor {
    raw: RedisClient,
    frame: Vec<Value>,
    route: ClusterHash,
}

impl Floor {
    async fn new(url: &str, client: &Client) -> Floor {
        let config = Config::from_url(url).expect("a valid Redis URL");
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|conn| {
                conn.connection_timeout = Duration::from_secs(5);
                conn.internal_command_timeout = Duration::from_secs(5);
            })
            .with_performance_config(|perf| {
                perf.default_command_timeout = Duration::from_secs(5);
            })
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
        let raw = builder.build().expect("a fred client");
        let _connection = raw.init().await.expect("connected");
        let sha: String = raw.script_load(TRIVIAL).await.expect("SCRIPT LOAD");
        let key = Namespace::default()
            .lock(&lockkit_suite::unique("bench-contention-raw"))
            .expect("a valid name")
            .key;
        let owner = format!("{}:{:?}", client.id(), std::thread::current().id());
        let marker = hold_marker(client.id(), 1_000_000);
        let lease = client.watchdog_timeout().as_millis().to_string();
        let mut frame = vec![Value::from(sha), Value::from(1_i64), Value::from(&*key)];
        frame.extend([&owner, &marker, &lease].map(|arg| Value::from(arg.as_str())));
        Floor {
            raw,
            frame,
            route: ClusterHash::Custom(key_slot(&key)),
        }
    }

    async fn evalsha(&self) -> Vec<i64> {
        let command = CustomCommand::new_static("EVALSHA", self.route.clone(), false);
        self.raw
            .custom::<Vec<i64>, Value>(command, self.frame.clone())
            .await
            .expect("EVALSHA")
    }

    /// The median of [`RTT_SAMPLES`] round trips, one at a time, after as many for warm-up;
    /// each after `idle` of sleep when `idle` is not zero (diagnostic: a round trip from an idle
    /// process, as a waiter makes after a hold of H).
    async fn median(&self, idle: Duration) -> Duration {
        for _ in 0..RTT_SAMPLES {
            std::hint::black_box(self.evalsha().await);
        }
        let mut samples = Vec::with_capacity(RTT_SAMPLES);
        for _ in 0..RTT_SAMPLES {
            if !idle.is_zero() {
                tokio::time::sleep(idle).await;
            }
            let start = Instant::now();
            std::hint::black_box(self.evalsha().await);
            samples.push(start.elapsed());
        }
        samples.sort_unstable();
        quantile(&samples, 0.5)
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `q`-quantile of sorted samples (nearest rank).
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index]
}

fn print_table(outcomes: &[Outcome], rtt: Duration) {
    let rtt_us = micros(rtt);
    println!(
        "| primitive | W | H ms | T ms | acquisitions | acq/s | min/max | owner changes | handoffs \
         | handoff p50 µs | p99 µs | p50 RTT | p99 RTT | mean hold ms | net overhead µs | net RTT |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for o in outcomes {
        let (p50, p99) = if o.handoffs.is_empty() {
            ("–".to_owned(), "–".to_owned())
        } else {
            (
                format!("{:.0}", micros(quantile(&o.handoffs, 0.5))),
                format!("{:.0}", micros(quantile(&o.handoffs, 0.99))),
            )
        };
        let (p50_rtt, p99_rtt) = if o.handoffs.is_empty() {
            ("–".to_owned(), "–".to_owned())
        } else {
            (
                format!("{:.1}", micros(quantile(&o.handoffs, 0.5)) / rtt_us),
                format!("{:.1}", micros(quantile(&o.handoffs, 0.99)) / rtt_us),
            )
        };
        let per_acq = micros(o.window) / o.acquisitions.max(1) as f64;
        let net = per_acq - micros(o.mean_hold);
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {:.2} | {} | {} | {} | {} | {} | {} | {:.2} | {:.0} | {:.1} |",
            o.row.primitive.name(),
            o.row.workers,
            o.row.hold.as_millis(),
            o.row.think.as_millis(),
            o.acquisitions,
            o.acquisitions as f64 / o.window.as_secs_f64(),
            o.min_max,
            o.owner_changes,
            o.handoffs.len(),
            p50,
            p99,
            p50_rtt,
            p99_rtt,
            o.mean_hold.as_secs_f64() * 1e3,
            net,
            net / rtt_us,
        );
    }
    let overlaps: usize = outcomes.iter().map(|o| o.overlaps).sum();
    println!();
    println!(
        "floor: median raw EVALSHA round trip = {rtt_us:.1} µs; overlapping holds (must be 0): \
         {overlaps}"
    );
}

fn window() -> Duration {
    let secs = std::env::var("LOCKKIT_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

async fn bench(url: &str, smoke: bool) {
    let clients =
        futures::future::join_all((0..MAX_WORKERS).map(|_| lockkit_suite::client(url))).await;
    let floor = Floor::new(url, &clients[0]).await;
    let rtt = floor.median(Duration::ZERO).await;

    let (rows, window) = if smoke {
        let rows = rows()
            .into_iter()
            .filter(|r| r.workers == 4 && r.hold.is_zero())
            .collect();
        (rows, Duration::from_millis(200))
    } else {
        (rows(), window())
    };
    let flavor = match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        _ => "multi_thread",
    };
    println!(
        "contention: D = {:.1} s per row, one {flavor} runtime, one client per worker, \
         watchdog-mode lock(); {} rows",
        window.as_secs_f64(),
        rows.len()
    );
    let mut outcomes = Vec::with_capacity(rows.len());
    for row in rows {
        let outcome = run_row(&clients, row, window).await;
        eprintln!(
            "  {} W={} H={:?} T={:?}: {} acquisitions",
            row.primitive.name(),
            row.workers,
            row.hold,
            row.think,
            outcome.acquisitions
        );
        outcomes.push(outcome);
    }
    let rtt_after = floor.median(Duration::ZERO).await;
    let rtt_idle = if smoke {
        None
    } else {
        Some(floor.median(ms(10)).await)
    };
    println!();
    print_table(&outcomes, rtt);
    println!(
        "floor again after the rows: {:.1} µs (drift check; the table uses the first)",
        micros(rtt_after)
    );
    if let Some(idle) = rtt_idle {
        println!(
            "floor after 10 ms idle (diagnostic, each round trip preceded by a 10 ms sleep): \
             {:.1} µs",
            micros(idle)
        );
    }

    for client in &clients {
        client.shutdown().await.expect("shutdown");
    }
    let _ = floor.raw.quit().await;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs each benchmark without `--bench`: a short smoke run then.
    let bench_mode = args.iter().any(|arg| arg == "--bench");
    if args.iter().any(|arg| arg == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let server = rt.block_on(lockkit_suite::spawned());
    rt.block_on(bench(&server.url(), !bench_mode));
    drop(server);
}
