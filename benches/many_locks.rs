//! Many locks (issue 6, workload 3): T = 1000 tasks on T distinct locks through **one**
//! `lockkit::Client`, each task taking and releasing its own lock in a loop, against the floor of
//! raw pipelined `EVALSHA` throughput.
//!
//! Everything runs in one process, against one `redis-server` spawned for the run on a loopback
//! port, on one tokio runtime (current-thread by default, as `benches/latency.rs`):
//!
//! - `raw_evalsha_x1000` (the floor): T tasks each send one `EVALSHA` of the trivial script
//!   `return {1, 1}` through one plain fred client configured as lockkit configures its own (fred
//!   pipelines the concurrent commands on its one connection), with a frame shaped like lockkit's
//!   acquire (one key per task, three arguments of the same lengths);
//! - `lock_unlock_x1000`: T tasks each run `lock()` (watchdog mode) + `unlock()` once on their own
//!   lock, all through one lockkit client.
//!
//! One criterion iteration is one batch: T tasks spawned, each doing its one operation, joined.
//! Criterion reports elements (operations) per second.
//!
//! Then, in the same process, the summary measures **sustained** throughput: T long-lived tasks
//! loop for a window, counting operations; raw and lockkit windows alternate (4 rounds of each,
//! the order rotating) so drift hits both alike. One lock + unlock is two `EVALSHA`s, so the
//! comparison is `acquisitions/s / (raw EVALSHA/s / 2)`; the target is ≥ 0.80. Last it checks the
//! commands one batch sends (`INFO commandstats`).
//!
//! Run: `cargo bench --bench many_locks`. Knobs: `LOCKKIT_BENCH_RUNTIME=multi_thread`;
//! `LOCKKIT_BENCH_TASKS=<T>` (default 1000); `LOCKKIT_BENCH_SECS=<s>` (window of one summary
//! round, default 1.5); `LOCKKIT_BENCH_LOOP=<op>:<seconds>` (`raw_evalsha` or `lock_unlock`) runs
//! only that op, sustained, for a profiler (`perf record`). Without `--bench` (`cargo test --benches`) it runs a short smoke pass:
//! 100 tasks, no criterion measurement beyond one iteration, short windows.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput};
use fred::interfaces::{ClientLike, LuaInterface};
use fred::prelude::Client as RedisClient;
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit::protocol::keys::Namespace;
use lockkit::protocol::lock::hold_marker;
use lockkit::protocol::slot::key_slot;
use lockkit::{Client, Lock};
use lockkit_suite::RedisServer;
use nix::sys::resource::{getrusage, UsageWho};
use nix::sys::time::TimeVal;
use tokio::runtime::Runtime;
use tokio::task::JoinSet;

/// The trivial script of the floor.
const TRIVIAL: &str = "return {1, 1}";
/// Summary rounds (each: one raw window and one lockkit window).
const ROUNDS: usize = 4;

/// One frame of the floor, with its routing.
struct RawFrame {
    frame: Vec<Value>,
    route: ClusterHash,
}

/// What every measurement uses: T locks on one lockkit client, T raw frames on one fred client.
struct Fixture {
    /// The one lockkit client under test.
    client: Client,
    /// One lock per task.
    locks: Arc<Vec<Lock>>,
    /// A plain fred client, configured like lockkit's command client.
    raw: RedisClient,
    /// One trivial-script frame per task, each on its own key.
    frames: Arc<Vec<RawFrame>>,
}

impl Fixture {
    async fn new(url: &str, tasks: usize) -> Fixture {
        let client = lockkit_suite::client(url).await;
        let base = lockkit_suite::unique("bench-many");
        let locks: Vec<Lock> = (0..tasks)
            .map(|i| client.lock(format!("{base}:{i}")))
            .collect();

        // The same fred settings as `lockkit::ClientBuilder::build` with its defaults.
        let raw = lockkit_suite::raw_like_lockkit(url).await;
        let sha: String = raw.script_load(TRIVIAL).await.expect("SCRIPT LOAD");

        // Keys, owner and marker of the same shapes as the ones lockkit sends.
        let namespace = Namespace::default();
        let owner = format!("{}:{:?}", client.id(), std::thread::current().id());
        let marker = hold_marker(client.id(), 1_000_000);
        let lease = client.watchdog_timeout().as_millis().to_string();
        let raw_base = lockkit_suite::unique("bench-many-raw");
        let frames = (0..tasks)
            .map(|i| {
                let key = namespace
                    .lock(&format!("{raw_base}:{i}"))
                    .expect("a valid name")
                    .key;
                let mut frame = vec![Value::from(sha.as_str()), Value::from(1_i64)];
                frame.push(Value::from(key.as_str()));
                frame.extend([&owner, &marker, &lease].map(|arg| Value::from(arg.as_str())));
                RawFrame {
                    frame,
                    route: ClusterHash::Custom(key_slot(&key)),
                }
            })
            .collect();
        Fixture {
            client,
            locks: Arc::new(locks),
            raw,
            frames: Arc::new(frames),
        }
    }
}

/// One `EVALSHA` of the trivial script, sent as lockkit sends scripts (a fred custom command).
async fn raw_evalsha(raw: &RedisClient, frame: &RawFrame) {
    let command = CustomCommand::new_static("EVALSHA", frame.route.clone(), false);
    let reply: Vec<i64> = raw
        .custom::<Vec<i64>, Value>(command, frame.frame.clone())
        .await
        .expect("EVALSHA");
    debug_assert_eq!(reply, [1, 1]);
}

/// One lock + unlock of an uncontended lock, watchdog mode.
async fn lock_unlock(lock: &Lock) {
    let guard = lock.lock().await.expect("lock");
    guard.unlock().await.expect("unlock");
}

/// The two operations compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    /// One trivial `EVALSHA` per task (the floor).
    RawEvalsha,
    /// One lock + unlock per task.
    LockUnlock,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::RawEvalsha => "raw_evalsha",
            Op::LockUnlock => "lock_unlock",
        }
    }
}

/// One batch: every task spawned, each doing `op` once on its own lock or key, all joined.
async fn batch(fixture: &Fixture, op: Op) {
    let mut set = JoinSet::new();
    match op {
        Op::RawEvalsha => {
            for i in 0..fixture.frames.len() {
                let raw = fixture.raw.clone();
                let frames = Arc::clone(&fixture.frames);
                set.spawn(async move { raw_evalsha(&raw, &frames[i]).await });
            }
        }
        Op::LockUnlock => {
            for i in 0..fixture.locks.len() {
                let locks = Arc::clone(&fixture.locks);
                set.spawn(async move { lock_unlock(&locks[i]).await });
            }
        }
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("a task panicked");
    }
}

/// CPU time of the whole process so far (user + system, every thread).
fn process_cpu() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let time = |tv: TimeVal| {
        Duration::from_secs(u64::try_from(tv.tv_sec()).unwrap_or(0))
            + Duration::from_micros(u64::try_from(tv.tv_usec()).unwrap_or(0))
    };
    time(usage.user_time()) + time(usage.system_time())
}

/// CPU time of the spawned server so far: the sum over its threads of the first field of
/// `/proc/<pid>/task/<tid>/schedstat` (nanoseconds on a CPU). Zero when unknown.
fn server_cpu(pid: Option<u32>) -> Duration {
    let Some(pid) = pid else {
        return Duration::ZERO;
    };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Duration::ZERO;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|task| std::fs::read_to_string(task.path().join("schedstat")).ok())
        .filter_map(|stat| stat.split_whitespace().next()?.parse::<u64>().ok())
        .map(Duration::from_nanos)
        .sum()
}

/// One sustained window: operations per second, and CPU time per operation in the server and in
/// this process.
#[derive(Debug, Clone, Copy)]
struct Rate {
    per_second: f64,
    server_cpu_per_op: Duration,
    client_cpu_per_op: Duration,
    /// Server CPU time over wall time (1.0: one core busy all the time).
    server_load: f64,
    /// This process's CPU time over wall time.
    client_load: f64,
}

/// Sustained throughput: every task loops `op` until `window` has passed; operations per second
/// counts operations that started before the deadline, over the time until the last one ended.
async fn sustained(fixture: &Fixture, op: Op, window: Duration, server_pid: Option<u32>) -> Rate {
    let done = Arc::new(AtomicU64::new(0));
    let server_before = server_cpu(server_pid);
    let client_before = process_cpu();
    let start = Instant::now();
    let deadline = start + window;
    let mut set = JoinSet::new();
    let tasks = fixture.locks.len();
    for i in 0..tasks {
        let done = Arc::clone(&done);
        let raw = fixture.raw.clone();
        let frames = Arc::clone(&fixture.frames);
        let locks = Arc::clone(&fixture.locks);
        set.spawn(async move {
            let mut count = 0;
            while Instant::now() < deadline {
                match op {
                    Op::RawEvalsha => raw_evalsha(&raw, &frames[i]).await,
                    Op::LockUnlock => lock_unlock(&locks[i]).await,
                }
                count += 1;
            }
            done.fetch_add(count, Ordering::Relaxed);
        });
    }
    while let Some(joined) = set.join_next().await {
        joined.expect("a task panicked");
    }
    let elapsed = start.elapsed();
    let server = server_cpu(server_pid) - server_before;
    let client = process_cpu() - client_before;
    let ops = done.load(Ordering::Relaxed).max(1);
    Rate {
        per_second: ops as f64 / elapsed.as_secs_f64(),
        server_cpu_per_op: server / u32::try_from(ops).unwrap_or(u32::MAX),
        client_cpu_per_op: client / u32::try_from(ops).unwrap_or(u32::MAX),
        server_load: server.as_secs_f64() / elapsed.as_secs_f64(),
        client_load: client.as_secs_f64() / elapsed.as_secs_f64(),
    }
}

fn runtime() -> Runtime {
    let multi = std::env::var("LOCKKIT_BENCH_RUNTIME").is_ok_and(|rt| rt == "multi_thread");
    let mut builder = if multi {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().expect("a tokio runtime")
}

fn env_number(name: &str) -> Option<f64> {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse::<f64>().ok())
        .filter(|value| value.is_finite() && *value > 0.0)
}

fn criterion_benches(c: &mut Criterion, rt: &Runtime, fixture: &Fixture) {
    let tasks = fixture.locks.len();
    let mut group = c.benchmark_group("many_locks");
    group.throughput(Throughput::Elements(tasks as u64));
    group.bench_function(format!("raw_evalsha_x{tasks}"), |b| {
        b.to_async(rt).iter(|| batch(fixture, Op::RawEvalsha));
    });
    group.bench_function(format!("lock_unlock_x{tasks}"), |b| {
        b.to_async(rt).iter(|| batch(fixture, Op::LockUnlock));
    });
    group.finish();
}

/// Top-level commands (and `EVALSHA` server time) for one batch of `op`, from
/// `INFO commandstats`, per operation (the `CONFIG` and `INFO` of the check left out).
async fn commands_per_op(server: &RedisServer, fixture: &Fixture, op: Op) -> String {
    const BATCHES: usize = 5;
    server
        .command(&["CONFIG", "RESETSTAT"])
        .await
        .expect("CONFIG RESETSTAT");
    for _ in 0..BATCHES {
        batch(fixture, op).await;
    }
    let ops = (BATCHES * fixture.locks.len()) as f64;
    let stats = server
        .command(&["INFO", "commandstats"])
        .await
        .expect("INFO commandstats");
    let mut per_op = Vec::new();
    for line in stats.as_str().unwrap_or_default().lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if name.starts_with("config") || name == "info" {
            continue;
        }
        let field = |key: &str| -> f64 {
            rest.split(',')
                .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
                .and_then(|value| value.parse().ok())
                .unwrap_or(f64::NAN)
        };
        let calls = field("calls") / ops;
        if name.starts_with("eval") {
            let usec = field("usec_per_call");
            per_op.push(format!("{name} {calls:.3} (server time {usec:.2} µs each)"));
        } else {
            per_op.push(format!("{name} {calls:.3}"));
        }
    }
    per_op.join(", ")
}

async fn summary(server: &RedisServer, fixture: &Fixture, window: Duration) {
    let tasks = fixture.locks.len();
    let pid = server.pid();
    // Warm-up of both (connections, script caches, allocator).
    for op in [Op::RawEvalsha, Op::LockUnlock] {
        sustained(fixture, op, window / 4, pid).await;
    }
    let mut rates: [Vec<Rate>; 2] = [Vec::new(), Vec::new()];
    for round in 0..ROUNDS {
        let order = if round % 2 == 0 {
            [Op::RawEvalsha, Op::LockUnlock]
        } else {
            [Op::LockUnlock, Op::RawEvalsha]
        };
        for op in order {
            let rate = sustained(fixture, op, window, pid).await;
            rates[usize::from(op == Op::LockUnlock)].push(rate);
        }
    }
    let mean = |v: &[Rate], f: fn(&Rate) -> f64| v.iter().map(f).sum::<f64>() / v.len() as f64;
    let raw = mean(&rates[0], |r| r.per_second);
    let locks = mean(&rates[1], |r| r.per_second);
    let flavor = match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        _ => "multi_thread",
    };
    println!();
    println!(
        "summary (workload 3, many locks): T = {tasks} tasks, T distinct locks, one lockkit \
         client; sustained, {ROUNDS} alternating rounds of {:.1} s each; one {flavor} runtime; \
         redis-server on {}",
        window.as_secs_f64(),
        server.addr()
    );
    println!();
    println!("| measure | per round | mean |");
    println!("|---|---|---:|");
    let show = |v: &[Rate]| {
        v.iter()
            .map(|r| format!("{:.0}", r.per_second))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "| raw EVALSHA/s (floor, {tasks} tasks, one fred client) | {} | {raw:.0} |",
        show(&rates[0])
    );
    println!(
        "| floor for lock+unlock = raw EVALSHA/s ÷ 2 | | {:.0} |",
        raw / 2.0
    );
    println!(
        "| lockkit acquisitions/s (lock + unlock, {tasks} tasks, one client) | {} | {locks:.0} |",
        show(&rates[1])
    );
    println!(
        "| **ratio acquisitions/s ÷ (raw EVALSHA/s ÷ 2)** (target ≥ 0.80) | | **{:.2}** |",
        locks / (raw / 2.0)
    );
    println!();
    println!("where the time goes (means over the rounds; CPU per operation, load = CPU ÷ wall):");
    println!();
    println!("| operation | server CPU µs/op | client CPU µs/op | server load | client load |");
    println!("|---|---:|---:|---:|---:|");
    for (op, v) in [(Op::RawEvalsha, &rates[0]), (Op::LockUnlock, &rates[1])] {
        println!(
            "| {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            op.name(),
            mean(v, |r| micros(r.server_cpu_per_op)),
            mean(v, |r| micros(r.client_cpu_per_op)),
            mean(v, |r| r.server_load),
            mean(v, |r| r.client_load),
        );
    }
    let server_raw = mean(&rates[0], |r| micros(r.server_cpu_per_op));
    let server_lock = mean(&rates[1], |r| micros(r.server_cpu_per_op));
    if server_lock > 0.0 {
        println!();
        println!(
            "bound if the server is the bottleneck: 2 × server CPU per raw EVALSHA ÷ server CPU per \
             lock+unlock = {:.2}",
            2.0 * server_raw / server_lock
        );
    }
    println!();
    for op in [Op::RawEvalsha, Op::LockUnlock] {
        println!(
            "commands per {} (one batch of {tasks}, 5 batches): {}",
            op.name(),
            commands_per_op(server, fixture, op).await
        );
    }
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs each benchmark without `--bench`: a smoke pass then.
    let bench_mode = args.iter().any(|arg| arg == "--bench");
    if args.iter().any(|arg| arg == "--list") {
        return;
    }
    let tasks = if bench_mode {
        env_number("LOCKKIT_BENCH_TASKS").map_or(1000, |t| t as usize)
    } else {
        100
    };
    let window = if bench_mode {
        Duration::from_secs_f64(env_number("LOCKKIT_BENCH_SECS").unwrap_or(1.5))
    } else {
        Duration::from_millis(100)
    };

    let rt = runtime();
    let server = rt.block_on(lockkit_suite::spawned());
    let fixture = rt.block_on(Fixture::new(&server.url(), tasks));

    if let Ok(spec) = std::env::var("LOCKKIT_BENCH_LOOP") {
        // `<op>:<seconds>`: only this op, sustained, for a profiler; no criterion, no summary.
        let (name, secs) = spec
            .split_once(':')
            .expect("LOCKKIT_BENCH_LOOP=<op>:<seconds>");
        let op = [Op::RawEvalsha, Op::LockUnlock]
            .into_iter()
            .find(|op| op.name() == name)
            .expect("raw_evalsha or lock_unlock");
        let secs: f64 = secs.parse().expect("seconds");
        let rate = rt.block_on(sustained(
            &fixture,
            op,
            Duration::from_secs_f64(secs),
            server.pid(),
        ));
        println!("{name}: {rate:?}");
        rt.block_on(fixture.client.shutdown()).expect("shutdown");
        return;
    }

    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(5))
        .sample_size(30)
        .configure_from_args();
    criterion_benches(&mut criterion, &rt, &fixture);
    criterion.final_summary();
    rt.block_on(summary(&server, &fixture, window));

    rt.block_on(async {
        fixture.client.shutdown().await.expect("shutdown");
        let _ = fixture.raw.quit().await;
    });
    drop(fixture);
    drop(server);
}
