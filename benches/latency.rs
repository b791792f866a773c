//! Latency of one uncontended lock + unlock, against its floor: raw `EVALSHA` round trips.
//!
//! Everything runs in one process, against one `redis-server` spawned for the run on a loopback
//! port, on one tokio runtime:
//!
//! - `raw_evalsha`: one `EVALSHA` of a trivial script (`return {1, 1}`) through a plain fred client
//!   configured as lockkit configures its own, with a frame of the same shape as lockkit's
//!   acquire (one key, three arguments of the same lengths). This is the floor of one script call:
//!   one round trip, no script work.
//! - `lock_unlock`: `try_lock(Duration::ZERO, None)` + `unlock()` on one uncontended lock.
//! - `lock_unlock_fixed_lease`: the same with a fixed 30 s lease.
//!
//! Criterion measures the three. Then, in the same process, every operation (plus two
//! diagnostics) runs N = 2000 times sequentially, interleaved in rounds to cancel drift, and a
//! summary of medians and the ratio `lock+unlock / (2 × raw EVALSHA)` is printed, followed by a
//! check of the commands one lock + unlock sends (`INFO commandstats`).
//!
//! Run: `cargo bench --bench latency` (see `docs/benchmarks.md` for CPU pinning). Knobs:
//!
//! - `LOCKKIT_BENCH_RUNTIME=multi_thread`: a multi-thread runtime instead of a current-thread one;
//! - `LOCKKIT_BENCH_REDIS_CPUS=<list>`: pins the spawned server to these CPUs (`taskset`);
//! - `LOCKKIT_BENCH_LOOP=<op>:<count>`: only runs `op` `count` times, for a profiler.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::Criterion;
use fred::interfaces::{ClientLike, LuaInterface};
use fred::prelude::Client as RedisClient;
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit::protocol::keys::Namespace;
use lockkit::protocol::lock::{hold_marker, ACQUIRE, RELEASE};
use lockkit::protocol::slot::key_slot;
use lockkit::{Client, Lock};
use lockkit_suite::RedisServer;
use tokio::runtime::Runtime;

/// Operations per kind in the summary.
const N: usize = 2000;
/// Operations per kind in one round of the summary.
const ROUND: usize = 50;
/// The fixed lease of `lock_unlock_fixed_lease`.
const FIXED_LEASE: Duration = Duration::from_secs(30);
/// The trivial script of the floor.
const TRIVIAL: &str = "return {1, 1}";

/// The clients, the lock and the prepared frames every measurement uses.
struct Fixture {
    /// The lockkit client under test.
    client: Client,
    /// The one (uncontended) lock all lockkit measurements take and release.
    lock: Lock,
    /// A plain fred client, configured like lockkit's command client.
    raw: RedisClient,
    /// `EVALSHA <trivial> 1 <key> <owner> <marker> <lease>`, shaped like lockkit's acquire.
    trivial_frame: Vec<Value>,
    /// The real acquire script on a key another owner holds: it only reads (diagnostic).
    busy_frame: Vec<Value>,
    /// The real acquire and release scripts, as lockkit sends them for an uncontended lock
    /// (diagnostic: lockkit's two scripts without lockkit's client-side code).
    acquire_frame: Vec<Value>,
    release_frame: Vec<Value>,
    /// Routing of the frames (lockkit routes by the slot of the first key).
    route: ClusterHash,
    busy_route: ClusterHash,
}

impl Fixture {
    async fn new(url: &str) -> Fixture {
        let client = lockkit_suite::client(url).await;
        let lock = client.lock(lockkit_suite::unique("bench-latency"));

        // The same fred settings as `lockkit::ClientBuilder::build` with its defaults.
        let raw = lockkit_suite::raw_like_lockkit(url).await;

        let trivial_sha: String = raw.script_load(TRIVIAL).await.expect("SCRIPT LOAD");
        let acquire_sha: String = raw
            .script_load(ACQUIRE.source())
            .await
            .expect("SCRIPT LOAD");
        let release_sha: String = raw
            .script_load(RELEASE.source())
            .await
            .expect("SCRIPT LOAD");
        assert_eq!(acquire_sha, ACQUIRE.sha1());
        assert_eq!(release_sha, RELEASE.sha1());

        // Keys, owner and marker of the same shapes as the ones lockkit sends.
        let namespace = Namespace::default();
        let free = namespace
            .lock(&lockkit_suite::unique("bench-latency-raw"))
            .expect("a valid name");
        let busy = namespace
            .lock(&lockkit_suite::unique("bench-latency-busy"))
            .expect("a valid name");
        let owner = format!("{}:{:?}", client.id(), std::thread::current().id());
        let marker = hold_marker(client.id(), 1_000_000);
        let lease = client.watchdog_timeout().as_millis().to_string();
        // Every key of the lock (the lock HASH and its handoff key), as lockkit sends them.
        let frame = |sha: &str, keys: &[String], args: &[&str]| -> Vec<Value> {
            let mut frame = vec![Value::from(sha), Value::from(keys.len() as i64)];
            frame.extend(keys.iter().map(|key| Value::from(key.as_str())));
            frame.extend(args.iter().map(|arg| Value::from(*arg)));
            frame
        };
        // The acquire's fourth argument, the keep-alive: 0, a try that never joins the waiting set.
        let trivial_frame = frame(&trivial_sha, &free.keys, &[&owner, &marker, &lease]);
        let acquire_frame = frame(&acquire_sha, &free.keys, &[&owner, &marker, &lease, "0"]);
        let release_frame = frame(&release_sha, &free.keys, &[&marker, &free.channel, "0"]);
        let busy_frame = frame(&acquire_sha, &busy.keys, &[&owner, &marker, &lease, "0"]);

        let fixture = Fixture {
            client,
            lock,
            raw,
            trivial_frame,
            busy_frame,
            acquire_frame,
            release_frame,
            route: ClusterHash::Custom(key_slot(&free.key)),
            busy_route: ClusterHash::Custom(key_slot(&busy.key)),
        };

        // Another owner holds the busy key for the whole run.
        let other = frame(
            &acquire_sha,
            &busy.keys,
            &["someone-else", "#someone-else:1", "3600000", "0"],
        );
        let taken = fixture.evalsha(&other, &fixture.busy_route).await;
        assert_eq!(taken, [1, 1], "the busy key could not be taken");
        assert_eq!(
            fixture.raw_acquire_busy().await[0],
            0,
            "the busy key is not busy"
        );
        fixture
    }

    /// One `EVALSHA`, sent as lockkit sends it (a fred custom command), through the plain client.
    async fn evalsha(&self, frame: &[Value], route: &ClusterHash) -> Vec<i64> {
        let command = CustomCommand::new_static("EVALSHA", route.clone(), false);
        self.raw
            .custom::<Vec<i64>, Value>(command, frame.to_vec())
            .await
            .expect("EVALSHA")
    }

    /// The floor: one `EVALSHA` round trip of a trivial script.
    async fn raw_evalsha(&self) -> Vec<i64> {
        self.evalsha(&self.trivial_frame, &self.route).await
    }

    /// Diagnostic: the real acquire script finding the lock held by someone else.
    async fn raw_acquire_busy(&self) -> Vec<i64> {
        self.evalsha(&self.busy_frame, &self.busy_route).await
    }

    /// Diagnostic: the real acquire + release scripts through the plain client.
    async fn raw_acquire_release(&self) -> Vec<i64> {
        let acquired = self.evalsha(&self.acquire_frame, &self.route).await;
        debug_assert_eq!(acquired, [1, 1]);
        self.evalsha(&self.release_frame, &self.route).await
    }

    /// One uncontended lock + unlock through lockkit.
    async fn lock_unlock(&self, lease: Option<Duration>) {
        let guard = self
            .lock
            .try_lock(Duration::ZERO, lease)
            .await
            .expect("try_lock")
            .expect("the lock is uncontended");
        guard.unlock().await.expect("unlock");
    }

    async fn run(&self, op: Op) {
        match op {
            Op::RawEvalsha => {
                black_box(self.raw_evalsha().await);
            }
            Op::LockUnlock => self.lock_unlock(None).await,
            Op::LockUnlockFixedLease => self.lock_unlock(Some(FIXED_LEASE)).await,
            Op::RawAcquireBusy => {
                black_box(self.raw_acquire_busy().await);
            }
            Op::RawAcquireRelease => {
                black_box(self.raw_acquire_release().await);
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    RawEvalsha,
    LockUnlock,
    LockUnlockFixedLease,
    RawAcquireBusy,
    RawAcquireRelease,
}

impl Op {
    const ALL: [Op; 5] = [
        Op::RawEvalsha,
        Op::LockUnlock,
        Op::LockUnlockFixedLease,
        Op::RawAcquireBusy,
        Op::RawAcquireRelease,
    ];

    fn name(self) -> &'static str {
        match self {
            Op::RawEvalsha => "raw_evalsha",
            Op::LockUnlock => "lock_unlock",
            Op::LockUnlockFixedLease => "lock_unlock_fixed_lease",
            Op::RawAcquireBusy => "raw_acquire_busy",
            Op::RawAcquireRelease => "raw_acquire_release",
        }
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

fn criterion_benches(c: &mut Criterion, rt: &Runtime, fixture: &Fixture) {
    c.bench_function("raw_evalsha", |b| {
        b.to_async(rt).iter(|| fixture.run(Op::RawEvalsha));
    });
    c.bench_function("lock_unlock", |b| {
        b.to_async(rt).iter(|| fixture.run(Op::LockUnlock));
    });
    c.bench_function("lock_unlock_fixed_lease", |b| {
        b.to_async(rt)
            .iter(|| fixture.run(Op::LockUnlockFixedLease));
    });
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The `q`-quantile of sorted samples.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let index = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[index]
}

/// Every op N times, one at a time, interleaved in rounds of [`ROUND`] (the order rotating from
/// round to round); returns the sorted samples of each op, in the order of [`Op::ALL`].
async fn interleaved(fixture: &Fixture) -> Vec<Vec<Duration>> {
    for op in Op::ALL {
        for _ in 0..ROUND * 4 {
            fixture.run(op).await;
        }
    }
    let mut samples = vec![Vec::with_capacity(N); Op::ALL.len()];
    for round in 0..N / ROUND {
        for k in 0..Op::ALL.len() {
            let index = (round + k) % Op::ALL.len();
            let op = Op::ALL[index];
            for _ in 0..ROUND {
                let start = Instant::now();
                fixture.run(op).await;
                samples[index].push(start.elapsed());
            }
        }
    }
    for op in &mut samples {
        op.sort_unstable();
    }
    samples
}

/// Commands the server ran for `count` repetitions of `op`, per repetition, from
/// `INFO commandstats` (the `CONFIG` and `INFO` of the check itself left out).
async fn commands_per_op(server: &RedisServer, fixture: &Fixture, op: Op, count: usize) -> String {
    server
        .command(&["CONFIG", "RESETSTAT"])
        .await
        .expect("CONFIG RESETSTAT");
    for _ in 0..count {
        fixture.run(op).await;
    }
    let stats = server
        .command(&["INFO", "commandstats"])
        .await
        .expect("INFO commandstats");
    let stats = stats.as_str().unwrap_or_default();
    let mut per_op = Vec::new();
    for line in stats.lines() {
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
        let calls = field("calls") / count as f64;
        if name.starts_with("eval") {
            // Server-side execution time of the script, nested calls included.
            let usec = field("usec_per_call");
            per_op.push(format!("{name} {calls:.3} (server time {usec:.2} µs each)"));
        } else {
            per_op.push(format!("{name} {calls:.3}"));
        }
    }
    per_op.join(", ")
}

async fn info_field(server: &RedisServer, section: &str, field: &str) -> String {
    let info = server.command(&["INFO", section]).await.expect("INFO");
    info.as_str()
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or("?")
        .trim()
        .to_owned()
}

async fn summary(server: &RedisServer, fixture: &Fixture) {
    let version = info_field(server, "server", "redis_version").await;
    let samples = interleaved(fixture).await;
    let median = |op: Op| {
        let index = Op::ALL.iter().position(|o| *o == op).unwrap_or_default();
        micros(quantile(&samples[index], 0.5))
    };

    let flavor = match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        _ => "multi_thread",
    };
    println!();
    println!(
        "summary: N={N} per op, sequential, interleaved in rounds of {ROUND}; one process, one \
         {flavor} runtime, redis-server {version} on {}",
        server.addr()
    );
    println!(
        "{:<34} {:>10} {:>10} {:>10}",
        "op", "median µs", "p10 µs", "p90 µs"
    );
    for (op, sorted) in Op::ALL.iter().zip(&samples) {
        let diagnostic = matches!(op, Op::RawAcquireBusy | Op::RawAcquireRelease);
        println!(
            "{:<34} {:>10.1} {:>10.1} {:>10.1}",
            format!(
                "{}{}",
                op.name(),
                if diagnostic { " (diagnostic)" } else { "" }
            ),
            micros(quantile(sorted, 0.5)),
            micros(quantile(sorted, 0.1)),
            micros(quantile(sorted, 0.9)),
        );
    }
    let floor = 2.0 * median(Op::RawEvalsha);
    println!(
        "ratio lock+unlock / (2 × raw EVALSHA) = {:.2}",
        median(Op::LockUnlock) / floor
    );
    println!(
        "ratio lock+unlock fixed lease / (2 × raw EVALSHA) = {:.2}",
        median(Op::LockUnlockFixedLease) / floor
    );
    println!(
        "above the floor: {:.1} µs per lock+unlock = {:.1} µs in the two scripts (raw acquire + \
         release − 2 × raw EVALSHA) + {:.1} µs in lockkit's client code (lock+unlock − raw \
         acquire + release)",
        median(Op::LockUnlock) - floor,
        median(Op::RawAcquireRelease) - floor,
        median(Op::LockUnlock) - median(Op::RawAcquireRelease),
    );
    for op in [Op::RawEvalsha, Op::LockUnlock, Op::LockUnlockFixedLease] {
        println!(
            "commands per {}: {}",
            op.name(),
            commands_per_op(server, fixture, op, 1000).await
        );
    }
}

/// `LOCKKIT_BENCH_REDIS_CPUS`: pins the spawned server (all its threads) to these CPUs, e.g. to
/// run the client and the server on different cores reproducibly (`taskset -c 0 cargo bench
/// --bench latency` with `LOCKKIT_BENCH_REDIS_CPUS=1`).
fn pin_server(server: &RedisServer) {
    let (Ok(cpus), Some(pid)) = (std::env::var("LOCKKIT_BENCH_REDIS_CPUS"), server.pid()) else {
        return;
    };
    let status = std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", &cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("taskset");
    assert!(status.success(), "taskset failed: {status}");
}

/// `LOCKKIT_BENCH_LOOP=<op>:<count>`: runs only `op` `count` times and prints the mean, for
/// profilers (`perf record`, `heaptrack`); no criterion, no summary.
async fn profile_loop(fixture: &Fixture, spec: &str) {
    let (name, count) = spec
        .split_once(':')
        .expect("LOCKKIT_BENCH_LOOP=<op>:<count>");
    let count: usize = count.parse().expect("a count");
    let op = Op::ALL
        .into_iter()
        .find(|op| op.name() == name)
        .expect("an op name: raw_evalsha, lock_unlock, ...");
    for _ in 0..ROUND * 4 {
        fixture.run(op).await;
    }
    let start = Instant::now();
    for _ in 0..count {
        fixture.run(op).await;
    }
    let mean = micros(start.elapsed()) / count as f64;
    println!("{name} x{count}: mean {mean:.2} µs");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    // `cargo test --benches` runs each benchmark once, without `--bench`: skip the summary then.
    let bench_mode = args.iter().any(|arg| arg == "--bench") && !args.iter().any(|a| a == "--list");

    let rt = runtime();
    let server = rt.block_on(lockkit_suite::spawned());
    pin_server(&server);
    let fixture = rt.block_on(Fixture::new(&server.url()));

    if let Ok(spec) = std::env::var("LOCKKIT_BENCH_LOOP") {
        rt.block_on(profile_loop(&fixture, &spec));
    } else {
        let mut criterion = Criterion::default()
            .warm_up_time(Duration::from_secs(2))
            .measurement_time(Duration::from_secs(5))
            .sample_size(50)
            .configure_from_args();
        criterion_benches(&mut criterion, &rt, &fixture);
        criterion.final_summary();
        if bench_mode {
            rt.block_on(summary(&server, &fixture));
        }
    }

    rt.block_on(async {
        fixture.client.shutdown().await.expect("shutdown");
        let _ = fixture.raw.quit().await;
    });
    drop(fixture);
    drop(server);
}
