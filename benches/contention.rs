//! Contention: W workers fighting for one lock, lockkit's primitives and the peer libraries, against
//! the floors of one raw `EVALSHA` round trip and of one raw pub/sub handoff.
//!
//! One process spawns one `redis-server` on a loopback port. For each of `Lock`, `FencedLock`,
//! `FairLock`, `SpinLock`, `ReadWriteLock` (every worker a writer) and `Semaphore` (one permit),
//! for each row (W workers, hold H, think T), W tokio tasks on one multi-thread
//! runtime, each with its **own** `lockkit::Client` (its own connections), loop for D seconds:
//! acquire (`lock()`, watchdog mode), hold H ([`hold`]: exactly H, not the H + 1.2 ms of tokio's
//! 1 ms timer), release (`unlock()`), think T. Then every installed peer library
//! (`benches/peers/install`) runs the same rows against the same server through its runner
//! (`benches/peers/run <peer> ...`, one process per row, one client per worker), which prints its
//! events as one line of JSON. Last, two rows of W = 64 (H = 5 ms, T = 20 ms; H = 10 ms, T = 0): each of lockkit's
//! primitives but `SpinLock`, with the 64 workers split over 4 child processes of this bench
//! (`LOCKKIT_BENCH_CHILD`; their events are merged on the wall clock), and every peer as its
//! runner runs 64 workers (`LOCKKIT_BENCH_W64=0` skips the row, `LOCKKIT_BENCH_W64=only` runs
//! it alone).
//!
//! Every event is timed on one monotonic clock per process (nanoseconds since an origin). Every
//! row, lockkit's or a peer's, goes through [`analyse`]: from the merged record (ordered by the
//! instants acquires returned; for an exclusive lock that is the order of holds) it computes
//!
//! - acquisitions in the window (acquire returned before the deadline), per worker min/max;
//! - owner changes: acquisitions by a different worker than the previous holder;
//! - handoff latency: for owner changes where the new holder was already waiting (its acquire
//!   call started before the previous holder called unlock), from the previous holder's unlock
//!   call to the new holder's acquire return; p50 and p99;
//! - overlapping holds: a hold that began before the previous one ended (0 for a correct lock);
//! - the measured hold (acquire return to unlock call) and the net overhead per acquisition,
//!   `D / acquisitions − mean measured hold`;
//! - lockkit rows: **attempts per acquisition**, Redis' own count of script calls during the row
//!   (`INFO commandstats`) less one release per hold, over the holds: 1.0 is one acquire script
//!   per acquisition, anything above it is wasted tries (woken waiters that were refused, the
//!   spin lock's polls, waiters' keep-alive retries);
//! - lockkit rows: **pub/sub messages per acquisition**, the messages the waiter hubs of all the
//!   row's clients received (lockkit's `lockkit_pubsub_messages_total` metric, read by this
//!   process's metrics recorder, [`MessageRecorder`]; the child processes of the W = 64 rows
//!   report theirs), over the same holds; cross-checked with Redis: its count of `PUBLISH` and
//!   `SPUBLISH` calls during the row (`INFO commandstats` counts those a script makes; lockkit
//!   publishes only from scripts) and the subscribers of the object's channel at the middle of
//!   the window (`PUBSUB NUMSUB`), whose product is what Redis wrote.
//!
//! The floors are measured in the same run: the median of 200 `EVALSHA` round trips of a trivial
//! script through a plain fred client, configured and framed as in `benches/latency.rs` (RTT),
//! and the raw pub/sub handoff: a holder client sends `EVALSHA` of a script that publishes on a
//! channel, a waiter woken by the message on its own subscriber client sends one trivial
//! `EVALSHA`; from the holder's send to the waiter's reply, 200 samples, hot (back to back) and
//! after 10 ms idle. After the rows it measures the RTT again (drift check) and once more with a
//! 10 ms sleep before each round trip (diagnostic).
//!
//! Run: `cargo bench --bench contention` (or `scripts/bench-contention`, which installs the
//! peers first and plots). Environment: `LOCKKIT_BENCH_SECS` sets D (seconds, default 3);
//! `LOCKKIT_BENCH_ONLY` a comma list of lockkit primitives to run (`none`: no lockkit rows);
//! `LOCKKIT_BENCH_PEERS` a comma list of peers (`none`: no peers; default every installed one);
//! `LOCKKIT_PEERS_DIR` where the peers are installed (default `target/peers`);
//! `LOCKKIT_BENCH_OUT` the JSON output (default `target/bench-results/contention.json`).
//! Without `--bench` (`cargo test --benches`) it runs a short smoke test only (no peers).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, LuaInterface, PubsubInterface};
use fred::prelude::Client as RedisClient;
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::protocol::lock::hold_marker;
use lockkit::protocol::slot::key_slot;
use lockkit::{
    Client, Error, FairLock, FencedLock, Lock, LockGuard, ReadWriteLock, Semaphore,
    SemaphorePermit, SpinLock,
};
use serde_json::json;

/// Round trips of the floor, and samples of the pub/sub floor.
const RTT_SAMPLES: usize = 200;
/// The trivial script of the floor.
const TRIVIAL: &str = "return {1, 1}";
/// The holder's script of the pub/sub floor: publishes on the channel `KEYS[1]`.
const PUBLISH: &str = "redis.call('PUBLISH', KEYS[1], 'x') return {1, 1}";
/// The most workers any row uses (one client each, built once).
const MAX_WORKERS: usize = 16;
/// The peer libraries, in the order of the table.
const PEERS: [&str; 5] = [
    "redis-py",
    "python-redis-lock",
    "redis-semaphore",
    "redlock",
    "rslock",
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Primitive {
    Lock,
    FencedLock,
    FairLock,
    SpinLock,
    /// `ReadWriteLock`, every worker a writer.
    RwWriter,
    /// `Semaphore` of one permit, every worker taking it.
    Semaphore,
    /// `Semaphore` of four permits, every worker taking one.
    Semaphore4,
    /// `ReadWriteLock`, one writer per eight readers (worker `i` writes when `i % 9 == 0`).
    RwMixed,
}

/// How many holds of a primitive may overlap: the analysis counts the holds that overlap beyond
/// that (0 for a correct primitive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sharing {
    /// One hold at a time (a lock, a writer, a semaphore of one permit).
    Exclusive,
    /// Up to this many at once (a semaphore of that many permits, one each).
    Permits(usize),
    /// Readers share, a writer is alone ([`is_writer`] tells which worker writes).
    ReadWrite,
}

/// In a mixed row, whether worker `index` writes: one writer per eight readers.
fn is_writer(index: u64) -> bool {
    index.is_multiple_of(9)
}

impl Primitive {
    const ALL: [Primitive; 8] = [
        Primitive::Lock,
        Primitive::FencedLock,
        Primitive::FairLock,
        Primitive::SpinLock,
        Primitive::RwWriter,
        Primitive::Semaphore,
        Primitive::Semaphore4,
        Primitive::RwMixed,
    ];

    fn name(self) -> &'static str {
        match self {
            Primitive::Lock => "Lock",
            Primitive::FencedLock => "FencedLock",
            Primitive::FairLock => "FairLock",
            Primitive::SpinLock => "SpinLock",
            Primitive::RwWriter => "ReadWriteLock",
            Primitive::Semaphore => "Semaphore",
            Primitive::Semaphore4 => "Semaphore4",
            Primitive::RwMixed => "ReadWriteMixed",
        }
    }

    fn sharing(self) -> Sharing {
        match self {
            Primitive::Semaphore4 => Sharing::Permits(4),
            Primitive::RwMixed => Sharing::ReadWrite,
            _ => Sharing::Exclusive,
        }
    }

    /// The total of a semaphore row's semaphore.
    fn permits(self) -> Option<u64> {
        match self {
            Primitive::Semaphore => Some(1),
            Primitive::Semaphore4 => Some(4),
            _ => None,
        }
    }

    fn kind(self) -> Kind {
        match self {
            Primitive::Lock => Kind::Lock,
            Primitive::FencedLock => Kind::FencedLock,
            Primitive::FairLock => Kind::FairLock,
            Primitive::SpinLock => Kind::SpinLock,
            Primitive::RwWriter | Primitive::RwMixed => Kind::ReadWriteLock,
            Primitive::Semaphore | Primitive::Semaphore4 => Kind::Semaphore,
        }
    }

    /// The pub/sub channel of the object `name` of this primitive.
    fn channel(self, name: &str) -> String {
        Namespace::default()
            .object(self.kind(), name)
            .expect("a valid name")
            .channel
    }
}

/// One worker's handle on the contended object.
enum Handle {
    Lock(Lock),
    FencedLock(FencedLock),
    FairLock(FairLock),
    SpinLock(SpinLock),
    RwWriter(ReadWriteLock),
    RwReader(ReadWriteLock),
    Semaphore(Semaphore),
}

/// What a worker holds.
enum Held {
    Guard(LockGuard),
    Permit(SemaphorePermit),
}

impl Held {
    async fn unlock(self) -> Result<(), Error> {
        match self {
            Held::Guard(guard) => guard.unlock().await,
            Held::Permit(permit) => permit.release().await,
        }
    }
}

impl Handle {
    /// Worker `index`'s handle (a mixed row's role depends on it).
    fn new(client: &Client, primitive: Primitive, name: &str, index: u64) -> Handle {
        match primitive {
            Primitive::RwMixed if is_writer(index) => {
                Handle::RwWriter(client.read_write_lock(name))
            }
            Primitive::RwMixed => Handle::RwReader(client.read_write_lock(name)),
            Primitive::Semaphore4 => Handle::Semaphore(client.semaphore(name)),
            Primitive::Lock => Handle::Lock(client.lock(name)),
            Primitive::FencedLock => Handle::FencedLock(client.fenced_lock(name)),
            Primitive::FairLock => Handle::FairLock(client.fair_lock(name)),
            Primitive::SpinLock => Handle::SpinLock(client.spin_lock(name)),
            Primitive::RwWriter => Handle::RwWriter(client.read_write_lock(name)),
            Primitive::Semaphore => Handle::Semaphore(client.semaphore(name)),
        }
    }

    /// Waits without bound, watchdog mode.
    async fn lock(&self) -> Result<Held, Error> {
        match self {
            Handle::Lock(lock) => lock.lock().await.map(Held::Guard),
            Handle::FencedLock(lock) => lock.lock().await.map(|guard| Held::Guard(guard.into())),
            Handle::FairLock(lock) => lock.lock().await.map(Held::Guard),
            Handle::SpinLock(lock) => lock.lock().await.map(Held::Guard),
            Handle::RwWriter(lock) => lock.write_lock().await.map(Held::Guard),
            Handle::RwReader(lock) => lock.read_lock().await.map(Held::Guard),
            Handle::Semaphore(semaphore) => semaphore.acquire(1).await.map(Held::Permit),
        }
    }
}

/// The workload of one row: W workers, hold H, think T.
#[derive(Debug, Clone, Copy)]
struct Workload {
    workers: usize,
    hold: Duration,
    think: Duration,
}

/// One hold as a worker saw it, in nanoseconds since its process's origin:
/// `[worker, called, acquired, unlocking]` (the runners' JSON format).
type Event = [u64; 4];

/// A row's record, from lockkit's workers or from a peer's runner.
struct Record {
    /// The first column: the primitive or the peer library.
    library: String,
    /// The library's version.
    version: String,
    workload: Workload,
    /// How many holds may overlap.
    sharing: Sharing,
    /// The window's bounds on the record's clock.
    start_ns: u64,
    deadline_ns: u64,
    events: Vec<Event>,
    /// Failed acquires or releases the runner reported.
    errors: u64,
}

/// What one row measured.
struct Outcome {
    library: String,
    version: String,
    workload: Workload,
    window: Duration,
    acquisitions: usize,
    min_max: f64,
    owner_changes: usize,
    /// Sorted.
    handoffs: Vec<Duration>,
    mean_hold: Duration,
    /// The median and 99th percentile of the measured holds.
    hold_p50: Duration,
    hold_p99: Duration,
    /// Holds that began before the previous one ended (must be 0 for lockkit).
    overlaps: usize,
    errors: u64,
    /// lockkit rows: acquire script calls per acquisition (Redis' own count of `EVALSHA` calls
    /// during the row, less one release per hold, over the holds); 1.0 means no wasted try.
    /// `None` for the peers, whose commands are not comparable.
    attempts: Option<f64>,
    /// lockkit rows: the pub/sub messages of the row, counted by the clients and by Redis.
    messages: Option<Messages>,
    /// The floor (median raw `EVALSHA` round trip) measured just before this row: the yardstick
    /// of its RTT columns. It drifts by tens of percent within a run (CPU placement), so each row
    /// gets its own.
    rtt: Duration,
}

impl Outcome {
    fn handoff(&self, q: f64) -> Option<Duration> {
        (!self.handoffs.is_empty()).then(|| quantile(&self.handoffs, q))
    }

    /// `D / acquisitions − mean hold`.
    fn net_overhead_us(&self) -> f64 {
        micros(self.window) / self.acquisitions.max(1) as f64 - micros(self.mean_hold)
    }
}

/// What a lockkit row counted, from the end of its warm-up to the end of its last worker (the
/// interval of its attempts per acquisition), in every process of the row.
#[derive(Debug, Clone, Copy, Default)]
struct Counts {
    /// Script calls Redis counted.
    scripts: u64,
    /// `PUBLISH` and `SPUBLISH` calls Redis counted (all made by lockkit's scripts).
    publishes: u64,
    /// Messages the row's clients' waiter hubs received (`lockkit_pubsub_messages_total`).
    received: u64,
    /// Subscribers of the object's channel at the middle of the window (`PUBSUB NUMSUB`).
    subscribers: u64,
    /// Bytes Redis wrote to its clients.
    output_bytes: u64,
}

/// A lockkit row's pub/sub messages per acquisition (over the holds of [`Counts`]' interval).
#[derive(Debug, Clone, Copy)]
struct Messages {
    /// Messages the row's clients received, summed over clients and processes.
    received: f64,
    /// `PUBLISH` / `SPUBLISH` calls.
    publishes: f64,
    /// Subscribers of the object's channel at the middle of the window.
    subscribers: u64,
    /// What Redis wrote, by its own counts: publishes × subscribers (the cross-check of
    /// `received`, exact while the subscribers stay the same through the row).
    delivered: f64,
    /// Bytes Redis wrote to every client (replies and messages), per acquisition.
    output_bytes: f64,
}

/// The analysis of every row, lockkit's and the peers' alike.
fn analyse(record: Record) -> Outcome {
    let Record {
        library,
        version,
        workload,
        sharing,
        start_ns,
        deadline_ns,
        mut events,
        errors,
    } = record;
    const WORKER: usize = 0;
    const CALLED: usize = 1;
    const ACQUIRED: usize = 2;
    const UNLOCKING: usize = 3;
    events.sort_unstable_by_key(|e| e[ACQUIRED]);

    let mut per_worker = vec![0_usize; workload.workers];
    let mut acquisitions = 0;
    let mut total_hold = 0_u64;
    let mut holds = Vec::with_capacity(events.len());
    for e in events.iter().filter(|e| e[ACQUIRED] < deadline_ns) {
        acquisitions += 1;
        let hold = e[UNLOCKING].saturating_sub(e[ACQUIRED]);
        total_hold += hold;
        holds.push(Duration::from_nanos(hold));
        if let Some(count) = usize::try_from(e[WORKER])
            .ok()
            .and_then(|w| per_worker.get_mut(w))
        {
            *count += 1;
        }
    }
    let mean_hold = Duration::from_nanos(total_hold / acquisitions.max(1) as u64);
    holds.sort_unstable();
    let hold_quantile = |q| (!holds.is_empty()).then(|| quantile(&holds, q));
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
    // The holds open when each hold begins (measured inside the real hold: acquire returned,
    // unlock called), by the events' order of acquisition.
    let mut open: Vec<&Event> = Vec::new();
    for e in &events {
        open.retain(|o| o[UNLOCKING] > e[ACQUIRED]);
        let too_many = match sharing {
            Sharing::Exclusive => !open.is_empty(),
            Sharing::Permits(n) => open.len() >= n,
            Sharing::ReadWrite => {
                is_writer(e[WORKER]) && !open.is_empty()
                    || open.iter().any(|o| is_writer(o[WORKER]))
            }
        };
        if too_many {
            overlaps += 1;
        }
        open.push(e);
    }
    for pair in events.windows(2) {
        let (prev, next) = (&pair[0], &pair[1]);
        // Handoffs only where one hold follows another: exclusive rows.
        if sharing != Sharing::Exclusive
            || next[ACQUIRED] >= deadline_ns
            || next[WORKER] == prev[WORKER]
        {
            continue;
        }
        owner_changes += 1;
        if next[CALLED] <= prev[UNLOCKING] {
            handoffs.push(Duration::from_nanos(
                next[ACQUIRED].saturating_sub(prev[UNLOCKING]),
            ));
        }
    }
    handoffs.sort_unstable();
    Outcome {
        library,
        version,
        workload,
        window: Duration::from_nanos(deadline_ns.saturating_sub(start_ns)),
        acquisitions,
        min_max,
        owner_changes,
        handoffs,
        mean_hold,
        hold_p50: hold_quantile(0.5).unwrap_or_default(),
        hold_p99: hold_quantile(0.99).unwrap_or_default(),
        overlaps,
        errors,
        attempts: None,
        messages: None,
        rtt: Duration::ZERO,
    }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// The workloads, in order: W ∈ {4, 16} × H ∈ {0, 10 ms} with T = 0, then W ∈ {4, 16} ×
/// T ∈ {5, 20 ms} with H = 5 ms.
fn workloads() -> Vec<Workload> {
    let mut rows = Vec::new();
    for (hold, think) in [(0, 0), (10, 0), (5, 5), (5, 20)] {
        for workers in [4, MAX_WORKERS] {
            rows.push(Workload {
                workers,
                hold: ms(hold),
                think: ms(think),
            });
        }
    }
    rows
}

/// Before a lockkit row starts: every worker takes and gives back the object once, all at once,
/// so each client has waited on it once (subscribed to its channel, which lingers) before the
/// row's script calls are counted; the row then measures handoffs, not first waits (one
/// subscription and one extra try per client and object, reported apart in
/// `docs/benchmarks.md`).
async fn warm_up(handle: &Handle) {
    handle
        .lock()
        .await
        .expect("lock")
        .unlock()
        .await
        .expect("unlock");
}

/// How long before a hold's end [`hold`] stops sleeping on tokio's timer and starts yielding:
/// the timer has a 1 ms resolution and rounds up, so a sleep ends up to about 1.2 ms late.
const HOLD_SPIN: Duration = Duration::from_millis(2);

/// Holds until `end`, exactly: a tokio sleep until [`HOLD_SPIN`] before it (a plain
/// `tokio::time::sleep(H)` holds 11.2 ms for H = 10 ms), then yields to the runtime until `end`
/// (the other tasks run meanwhile; the yielding costs up to about a millisecond of CPU per
/// hold). The measured hold (acquire return to unlock call) is then H plus a few microseconds.
/// The rslock runner (`benches/peers/rslock`) holds the same way, so both Rust libraries hold
/// exactly H, as the Python and Node runners hold H plus about 0.15 ms.
async fn hold(end: Instant) {
    if let Some(early) = end.checked_sub(HOLD_SPIN) {
        tokio::time::sleep_until(early.into()).await;
    }
    while Instant::now() < end {
        std::hint::spin_loop();
        tokio::task::yield_now().await;
    }
}

/// One worker: acquire, hold, release, think, until the deadline. After the deadline an acquire
/// that returns is released at once (recorded, filtered out by the analysis), so every worker
/// ends within a handoff or so.
async fn worker(
    index: usize,
    handle: Handle,
    workload: Workload,
    origin: Instant,
    deadline: Instant,
) -> Vec<Event> {
    let ns = |t: Instant| u64::try_from(t.duration_since(origin).as_nanos()).unwrap_or(u64::MAX);
    let mut events = Vec::with_capacity(4096);
    while Instant::now() < deadline {
        let called = Instant::now();
        let held = handle.lock().await.expect("lock");
        let acquired = Instant::now();
        if acquired < deadline && !workload.hold.is_zero() {
            hold(acquired + workload.hold).await;
        }
        let unlocking = Instant::now();
        held.unlock().await.expect("unlock");
        events.push([index as u64, ns(called), ns(acquired), ns(unlocking)]);
        if !workload.think.is_zero() && Instant::now() < deadline {
            tokio::time::sleep(workload.think).await;
        }
    }
    events
}

/// One lockkit row.
async fn run_lockkit(
    clients: &[Client],
    raw: &RedisClient,
    primitive: Primitive,
    workload: Workload,
    window: Duration,
) -> Outcome {
    let name = lockkit_suite::unique(&format!("bench-contention-{}", primitive.name()));
    if let Some(permits) = primitive.permits() {
        let set = clients[0].semaphore(&name).try_set_permits(permits).await;
        assert!(set.expect("try_set_permits"), "a fresh semaphore");
    }
    let handles: Vec<Handle> = clients[..workload.workers]
        .iter()
        .enumerate()
        .map(|(index, client)| Handle::new(client, primitive, &name, index as u64))
        .collect();
    futures::future::join_all(handles.iter().map(warm_up)).await;
    let calls_before = command_calls(raw).await;
    let received_before = messages_received();
    let origin = Instant::now();
    let deadline = origin + window;
    let tasks: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(index, handle)| tokio::spawn(worker(index, handle, workload, origin, deadline)))
        .collect();
    let channel = primitive.channel(&name);
    let subscribers = async {
        tokio::time::sleep(window / 2).await;
        subscribers(raw, &channel).await
    };
    let workers = lockkit_suite::within(
        window + Duration::from_secs(60),
        "the workers of a contention row",
        futures::future::join_all(tasks),
    );
    let (joined, subscribers) = tokio::join!(workers, subscribers);
    let calls = command_calls(raw).await.since(calls_before);
    let counts = Counts {
        scripts: calls.scripts,
        publishes: calls.publishes,
        received: messages_received() - received_before,
        subscribers,
        output_bytes: calls.output_bytes,
    };
    let mut events = Vec::new();
    for result in joined {
        events.extend(result.expect("a worker panicked"));
    }
    let deadline_ns = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    lockkit_outcome(primitive, workload, (0, deadline_ns), events, counts)
}

/// A lockkit row's outcome: its events over the window `(start, deadline)` analysed, with
/// attempts per acquisition from the row's script calls (less one release per hold) and its
/// messages per acquisition, both over every hold recorded (the holds of the counts' interval).
fn lockkit_outcome(
    primitive: Primitive,
    workload: Workload,
    (start_ns, deadline_ns): (u64, u64),
    events: Vec<Event>,
    counts: Counts,
) -> Outcome {
    let holds = events.len().max(1) as f64;
    let attempts = (counts.scripts as f64 - events.len() as f64) / holds;
    let messages = Messages {
        received: counts.received as f64 / holds,
        publishes: counts.publishes as f64 / holds,
        subscribers: counts.subscribers,
        delivered: (counts.publishes * counts.subscribers) as f64 / holds,
        output_bytes: counts.output_bytes as f64 / holds,
    };
    let mut outcome = analyse(Record {
        library: primitive.name().to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        workload,
        sharing: primitive.sharing(),
        start_ns,
        deadline_ns,
        events,
        errors: 0,
    });
    outcome.attempts = Some(attempts);
    outcome.messages = Some(messages);
    outcome
}

/// The `events` array of a runner's JSON line (`[[worker, called, acquired, unlocking], ...]`).
fn parse_events(parsed: &serde_json::Value) -> Vec<Event> {
    parsed["events"]
        .as_array()
        .map(|events| {
            events
                .iter()
                .filter_map(|e| {
                    let e = e.as_array()?;
                    let get = |i: usize| e.get(i).and_then(serde_json::Value::as_u64);
                    Some([get(0)?, get(1)?, get(2)?, get(3)?])
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Redis' counts of calls so far, from `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default)]
struct Calls {
    /// Script calls (`EVALSHA`, `EVAL` and their read-only forms, `FCALL`): each counts one round
    /// trip that runs a script, so the difference over a row is the row's script calls.
    scripts: u64,
    /// `PUBLISH` and `SPUBLISH` calls, those made by scripts included (Redis counts every
    /// command a script runs).
    publishes: u64,
    /// Bytes Redis wrote to its clients (`INFO stats`, `total_net_output_bytes`): replies and
    /// pub/sub messages alike.
    output_bytes: u64,
}

impl Calls {
    /// The calls made since `before`.
    fn since(self, before: Calls) -> Calls {
        Calls {
            scripts: self.scripts.saturating_sub(before.scripts),
            publishes: self.publishes.saturating_sub(before.publishes),
            output_bytes: self.output_bytes.saturating_sub(before.output_bytes),
        }
    }
}

/// Redis' [`Calls`] so far.
async fn command_calls(raw: &RedisClient) -> Calls {
    let info: String = raw
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec!["commandstats"],
        )
        .await
        .expect("INFO commandstats");
    let mut calls = Calls::default();
    for line in info.lines() {
        let Some((name, stats)) = line.split_once(':') else {
            continue;
        };
        let Some(count) = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|count| count.parse::<u64>().ok())
        else {
            continue;
        };
        match name {
            "cmdstat_evalsha" | "cmdstat_eval" | "cmdstat_evalsha_ro" | "cmdstat_eval_ro"
            | "cmdstat_fcall" => calls.scripts += count,
            "cmdstat_publish" | "cmdstat_spublish" => calls.publishes += count,
            _ => {}
        }
    }
    let stats: String = raw
        .custom(
            CustomCommand::new_static("INFO", ClusterHash::Random, false),
            vec!["stats"],
        )
        .await
        .expect("INFO stats");
    calls.output_bytes = stats
        .lines()
        .find_map(|line| line.strip_prefix("total_net_output_bytes:"))
        .and_then(|bytes| bytes.trim().parse().ok())
        .unwrap_or(0);
    calls
}

/// The subscribers of `channel` (`PUBSUB NUMSUB`; lockkit's clients subscribe with `SUBSCRIBE`
/// on a single server).
async fn subscribers(raw: &RedisClient, channel: &str) -> u64 {
    let reply: Vec<Value> = raw
        .custom(
            CustomCommand::new_static("PUBSUB", ClusterHash::Random, false),
            vec!["NUMSUB", channel],
        )
        .await
        .expect("PUBSUB NUMSUB");
    reply.get(1).and_then(|count| count.as_u64()).unwrap_or(0)
}

/// Pub/sub messages this process's lockkit clients received: the `lockkit_pubsub_messages_total`
/// counter (lockkit's `metrics` feature), kept by [`MessageRecorder`].
static MESSAGES: AtomicU64 = AtomicU64::new(0);

/// The messages counted so far in [`MESSAGES`].
fn messages_received() -> u64 {
    MESSAGES.load(Ordering::Relaxed)
}

/// The process's metrics recorder: keeps `lockkit_pubsub_messages_total` (every kind) in
/// [`MESSAGES`] and drops every other metric.
struct MessageRecorder;

/// [`MessageRecorder`]'s counter.
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

/// Uncontended lock + unlock against each library's own `PING`: samples of each, interleaved.
const UNCONTENDED_SAMPLES: usize = 2000;
/// Samples of each operation per round of the interleaving.
const UNCONTENDED_ROUND: usize = 50;

/// One library's uncontended row: medians of its lock + unlock and of its own client's `PING`,
/// measured interleaved in one process; lockkit's rows also against two `EVALSHA` of an empty
/// script measured in the same rounds (issue 28's yardstick: what any lock of two script calls
/// costs at the least).
#[derive(Debug, Clone)]
struct Uncontended {
    library: String,
    ping: Duration,
    lock_unlock: Duration,
    /// Two `EVALSHA` of an empty script, in the same rounds (`None`: another process's row).
    empty_pair: Option<Duration>,
}

impl Uncontended {
    fn ratio(&self) -> f64 {
        self.lock_unlock.as_secs_f64() / self.ping.as_secs_f64()
    }

    /// lock + unlock ÷ two `EVALSHA` of an empty script.
    fn ratio_to_empty_pair(&self) -> Option<f64> {
        self.empty_pair
            .map(|pair| self.lock_unlock.as_secs_f64() / pair.as_secs_f64())
    }
}

/// The acquire half of the "commands only" floor: the commands `lock_acquire.lua` runs for a
/// free lock nobody waits for (`EXISTS` of its 4 keys, `TIME`, `HSET`, `PEXPIREAT`), with none of
/// the library's code around them.
const COMMANDS_ACQUIRE: &str =
    "if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4]) == 0 then \
    local t = redis.call('TIME') \
    local e = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + 30000 \
    redis.call('HSET', KEYS[1], ARGV[1], 1, ARGV[2], string.format('%d', e) .. ' ' .. ARGV[1]) \
    redis.call('PEXPIREAT', KEYS[1], e) return {1, 1} end return {0, 0, 0}";
/// The release half: the commands `lock_release.lua` runs to give back the one hold of a lock
/// nobody waits for (`TIME`, `HGETALL`, `DEL`, `EXISTS` of the waiting set).
const COMMANDS_RELEASE: &str = "redis.call('TIME') redis.call('HGETALL', KEYS[1]) \
    redis.call('DEL', KEYS[1]) redis.call('EXISTS', KEYS[3]) return {1, 0}";

/// lockkit's uncontended rows: `lock()` (watchdog mode) + `unlock()`, and the same with a fixed
/// 30 s lease (as rslock's), each against `PING` through a plain fred client configured as
/// lockkit's, [`UNCONTENDED_SAMPLES`] of each after as many for warm-up, interleaved in rounds
/// of [`UNCONTENDED_ROUND`]. Floors in the same rounds, through that plain client: lockkit's
/// own acquire and release scripts sent raw (what the protocol costs with no client around it);
/// two scripts of the same commands as their common path and nothing else (what the commands
/// cost); two `EVALSHA` of a trivial script, and of an empty one (what any lock of two script
/// calls costs: the yardstick of every row's last column).
#[allow(clippy::too_many_lines)] // one list of interleaved operations
async fn uncontended_lockkit(client: &Client, raw: &RedisClient) -> Vec<Uncontended> {
    let lock = client.lock(lockkit_suite::unique("bench-uncontended"));
    let watchdog = || async {
        lock.lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");
    };
    let fixed = || async {
        let guard = lock
            .lock_with_lease(Duration::from_secs(30))
            .await
            .expect("lock");
        guard.unlock().await.expect("unlock");
    };
    let ping = || async {
        raw.ping::<Value>(None).await.expect("PING");
    };
    let keys = Namespace::default()
        .lock(&lockkit_suite::unique("bench-uncontended-raw"))
        .expect("a lock name");
    let channel = keys.client_channel("bench");
    let load = |script: &'static str| async move {
        let sha: String = raw.script_load(script).await.expect("SCRIPT LOAD");
        sha
    };
    let acquire_sha = load(lockkit::protocol::lock::ACQUIRE.source()).await;
    let release_sha = load(lockkit::protocol::lock::RELEASE.source()).await;
    let trivial_sha = load(TRIVIAL).await;
    let empty_sha = load("").await;
    let commands_sha = [load(COMMANDS_ACQUIRE).await, load(COMMANDS_RELEASE).await];
    let sequence = AtomicU64::new(0);
    let raw_scripts = || async {
        let marker = hold_marker("bench", sequence.fetch_add(1, Ordering::Relaxed));
        let _: Value = raw
            .evalsha(
                &acquire_sha,
                keys.keys.clone(),
                vec!["bench:1", &marker, "30000", "5000", &channel, "0"],
            )
            .await
            .expect("acquire");
        let _: Value = raw
            .evalsha(
                &release_sha,
                keys.keys.clone(),
                vec![&marker, &channel, "0"],
            )
            .await
            .expect("release");
    };
    let commands = || async {
        let marker = hold_marker("bench", sequence.fetch_add(1, Ordering::Relaxed));
        for (sha, args) in commands_sha.iter().zip([
            vec!["bench:1", &marker, "30000", "5000", &channel, "0"],
            vec![&marker, &channel, "0"],
        ]) {
            let _: Value = raw
                .evalsha(sha, keys.keys.clone(), args)
                .await
                .expect("EVALSHA");
        }
    };
    let pair = |sha: &String| {
        let sha = sha.clone();
        let key = keys.key.clone();
        async move {
            for _ in 0..2 {
                let _: Value = raw
                    .evalsha(&sha, vec![key.as_str()], Vec::<&str>::new())
                    .await
                    .expect("EVALSHA");
            }
        }
    };
    let mut samples: [Vec<Duration>; 7] = Default::default();
    for warm in [true, false] {
        for _ in 0..UNCONTENDED_SAMPLES / UNCONTENDED_ROUND {
            for (i, sample) in samples.iter_mut().enumerate() {
                for _ in 0..UNCONTENDED_ROUND {
                    let start = Instant::now();
                    match i {
                        0 => ping().await,
                        1 => watchdog().await,
                        2 => fixed().await,
                        3 => raw_scripts().await,
                        4 => commands().await,
                        5 => pair(&trivial_sha).await,
                        _ => pair(&empty_sha).await,
                    }
                    if !warm {
                        sample.push(start.elapsed());
                    }
                }
            }
        }
    }
    let [ping, watchdog, fixed, raw_scripts, commands, trivial, empty] = samples.map(|mut s| {
        s.sort_unstable();
        quantile(&s, 0.5)
    });
    let row = |library: &str, lock_unlock: Duration| Uncontended {
        library: library.to_owned(),
        ping,
        lock_unlock,
        empty_pair: Some(empty),
    };
    vec![
        row("lockkit Lock lock()", watchdog),
        row("lockkit Lock lock_with_lease(30 s)", fixed),
        row(
            "floor: lockkit's acquire + release scripts, raw",
            raw_scripts,
        ),
        row(
            "floor: 2 × EVALSHA of the scripts' common-path commands only",
            commands,
        ),
        row("floor: 2 × EVALSHA of a trivial script", trivial),
        row("floor: 2 × EVALSHA of an empty script", empty),
    ]
}

/// A peer's uncontended row, from its runner's `--uncontended N` mode (rslock only).
async fn uncontended_peer(url: &str, peer: &str) -> Option<Uncontended> {
    let runner = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/peers/run");
    let name = lockkit_suite::unique(&format!("bench-uncontended-{peer}"));
    let output = tokio::process::Command::new(&runner)
        .arg(peer)
        .args(["--url", url, "--name", &name])
        .args(["--uncontended", &UNCONTENDED_SAMPLES.to_string()])
        .args(["--round", &UNCONTENDED_ROUND.to_string()])
        .env("LOCKKIT_PEERS_DIR", peers_dir())
        .output()
        .await
        .ok()?;
    if !output.status.success() {
        println!(
            "peer {peer}: uncontended run failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
        return None;
    }
    let line = String::from_utf8_lossy(&output.stdout);
    let doc: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    let ns = |key: &str| doc[key].as_u64().map(Duration::from_nanos);
    Some(Uncontended {
        library: peer.to_owned(),
        ping: ns("ping_p50_ns")?,
        lock_unlock: ns("lock_unlock_p50_ns")?,
        empty_pair: None,
    })
}

/// The many-process rows: W workers split over this many child processes of the bench.
const PROCESSES: usize = 4;
/// The workers of the many-process rows.
const MANY_WORKERS: usize = 64;
/// The environment variable that makes the bench a child of a many-process row.
const CHILD: &str = "LOCKKIT_BENCH_CHILD";

/// Nanoseconds since the Unix epoch: the clock the processes of one many-process row share.
fn wall_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

/// A child of a many-process row (`LOCKKIT_BENCH_CHILD=<url> <primitive> <name> <workers>
/// <hold ms> <think ms> <start> <deadline> <first worker index>`, times in [`wall_ns`]): runs its
/// workers, each with its own client, from `start` to `deadline`, and prints their events as the
/// peer runners do, on the shared wall clock, with the pub/sub messages its clients received from
/// `start` until they shut down (`messages`).
async fn child(spec: &str) {
    let parts: Vec<&str> = spec.split(' ').collect();
    let [url, primitive, name, workers, hold, think, start, deadline, first] = parts[..] else {
        panic!("bad {CHILD}: {spec:?}");
    };
    let number = |s: &str| -> u64 { s.parse().expect("a number") };
    let primitive = Primitive::ALL
        .into_iter()
        .find(|p| p.name() == primitive)
        .expect("a primitive");
    let workload = Workload {
        workers: usize::try_from(number(workers)).expect("workers"),
        hold: ms(number(hold)),
        think: ms(number(think)),
    };
    let clients =
        futures::future::join_all((0..workload.workers).map(|_| lockkit_suite::client(url))).await;
    // One instant, read on both clocks: the events are shifted onto the wall clock.
    let (origin, wall_origin) = (Instant::now(), wall_ns());
    let at = |wall: u64| origin + Duration::from_nanos(wall.saturating_sub(wall_origin));
    let first = number(first);
    let handles: Vec<Handle> = clients
        .iter()
        .enumerate()
        .map(|(index, client)| Handle::new(client, primitive, name, first + index as u64))
        .collect();
    // Warm up shortly before the start, so the subscriptions still linger then.
    let warm_at = at(number(start).saturating_sub(1_500_000_000));
    tokio::time::sleep_until(warm_at.into()).await;
    futures::future::join_all(handles.iter().map(warm_up)).await;
    tokio::time::sleep_until(at(number(start)).into()).await;
    let received_before = messages_received();
    let deadline_at = at(number(deadline));
    let tasks: Vec<_> = handles
        .into_iter()
        .enumerate()
        .map(|(index, handle)| tokio::spawn(worker(index, handle, workload, origin, deadline_at)))
        .collect();
    let mut events = Vec::new();
    for task in tasks {
        for mut event in task.await.expect("a worker panicked") {
            event[0] += first;
            for stamp in &mut event[1..] {
                *stamp += wall_origin;
            }
            events.push(event);
        }
    }
    for client in &clients {
        let _ = client.shutdown().await;
    }
    // Counted until the clients unsubscribed: the other children's releases still reach them
    // until then, and Redis counts those as well.
    let received = messages_received() - received_before;
    println!("{}", json!({ "events": events, "messages": received }));
}

/// One lockkit row of [`MANY_WORKERS`] workers split over [`PROCESSES`] child processes (each
/// worker still with its own client), merged on the wall clock.
async fn run_lockkit_processes(
    url: &str,
    (client, raw): (&Client, &RedisClient),
    primitive: Primitive,
    workload: Workload,
    window: Duration,
) -> Option<Outcome> {
    let name = lockkit_suite::unique(&format!("bench-contention-{}", primitive.name()));
    if let Some(permits) = primitive.permits() {
        let set = client.semaphore(&name).try_set_permits(permits).await;
        assert!(set.expect("try_set_permits"), "a fresh semaphore");
    }
    let exe = std::env::current_exe().ok()?;
    let per = workload.workers / PROCESSES;
    // Far enough ahead for every child to start, connect its clients and warm up.
    let start = wall_ns() + 5_000_000_000;
    let deadline = start + u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
    let children = (0..PROCESSES).map(|i| {
        let spec = format!(
            "{url} {} {name} {per} {} {} {start} {deadline} {}",
            primitive.name(),
            workload.hold.as_millis(),
            workload.think.as_millis(),
            i * per
        );
        tokio::process::Command::new(&exe)
            .env(CHILD, spec)
            .kill_on_drop(true)
            .output()
    });
    let children = futures::future::join_all(children);
    let channel = primitive.channel(&name);
    let at_start_and_middle = async {
        let left = start.saturating_sub(wall_ns());
        tokio::time::sleep(Duration::from_nanos(left)).await;
        let calls = command_calls(raw).await;
        tokio::time::sleep(window / 2).await;
        (calls, subscribers(raw, &channel).await)
    };
    let (outputs, (calls_before, subscribers)) = tokio::join!(children, at_start_and_middle);
    let calls = command_calls(raw).await.since(calls_before);
    let mut counts = Counts {
        scripts: calls.scripts,
        publishes: calls.publishes,
        received: 0,
        subscribers,
        output_bytes: calls.output_bytes,
    };
    let mut events: Vec<Event> = Vec::new();
    for output in outputs {
        let output = output.ok()?;
        if !output.status.success() {
            eprintln!(
                "  {} child failed: {}",
                primitive.name(),
                String::from_utf8_lossy(&output.stderr)
            );
            return None;
        }
        let parsed: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        events.extend(parse_events(&parsed));
        counts.received += parsed["messages"].as_u64().unwrap_or(0);
    }
    Some(lockkit_outcome(
        primitive,
        workload,
        (start, deadline),
        events,
        counts,
    ))
}

/// Handoffs per case of the reserved-waiter measurement.
const RESERVED_SAMPLES: usize = 20;

/// What a handoff costs when the longest waiter is alive (granted the lock, returns holding it)
/// and when it is gone (its client died while it waited, its connection closed: the grant nobody
/// hears is undone in the release and the next waiter gets it; until issue 20, a reservation for
/// it had to lapse first). Medians of [`RESERVED_SAMPLES`] handoffs each, from the
/// holder's `unlock()` call to the live waiter's `lock()` returning.
#[derive(Debug, Clone, Copy)]
struct ReservedCost {
    alive: Duration,
    gone: Duration,
    gone_max: Duration,
}

/// Measures [`ReservedCost`]: a holder (client 0) holds a lock; in the "gone" case a dead
/// owner joins the waiting set first (one raw acquire script with a 60 s keep-alive, from a
/// connection that never subscribes: a waiter whose client died), then a live waiter (client 1)
/// waits; the holder unlocks. The release grants the lock to the dead owner, hears that nobody
/// got the message, undoes it and grants it to the live waiter.
async fn reserved_cost(clients: &[Client], raw: &RedisClient) -> ReservedCost {
    use lockkit::protocol::lock::ACQUIRE;
    let mut samples: [Vec<Duration>; 2] = Default::default();
    for i in 0..RESERVED_SAMPLES * 2 {
        let gone = i % 2 == 1;
        let name = lockkit_suite::unique("bench-reserved");
        let keys = Namespace::default().lock(&name).expect("a valid name");
        let holder = clients[0].lock(&name).lock().await.expect("lock");
        if gone {
            let mut frame = vec![Value::from(ACQUIRE.source()), Value::from(4_i64)];
            frame.extend(keys.keys.iter().map(|k| Value::from(k.as_str())));
            frame.extend(["ghost", "#ghost:1", "30000", "60000"].map(Value::from));
            let command = CustomCommand::new_static("EVAL", ClusterHash::FirstKey, false);
            let busy: Vec<i64> = raw.custom(command, frame).await.expect("EVAL");
            assert_eq!(busy.first(), Some(&0), "the dead owner waits");
        }
        let waiter = {
            let lock = clients[1].lock(&name);
            tokio::spawn(async move {
                let guard = lock.lock().await.expect("lock");
                let at = Instant::now();
                guard.unlock().await.expect("unlock");
                at
            })
        };
        // Until the live waiter is in the waiting set (behind the dead one).
        let waiting = keys.aux("waiting").expect("a waiting key").to_owned();
        let want = if gone { 2 } else { 1 };
        let zcard = || async {
            let command = CustomCommand::new_static("ZCARD", ClusterHash::FirstKey, false);
            let count: i64 = raw
                .custom(command, vec![Value::from(waiting.as_str())])
                .await
                .expect("ZCARD");
            count
        };
        while zcard().await < want {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let start = Instant::now();
        holder.unlock().await.expect("unlock");
        let at = waiter.await.expect("the waiter");
        samples[usize::from(gone)].push(at.duration_since(start));
        let command = CustomCommand::new_static("DEL", ClusterHash::FirstKey, false);
        let keys: Vec<Value> = keys.keys.iter().map(|k| Value::from(k.as_str())).collect();
        let _: i64 = raw.custom(command, keys).await.expect("DEL");
    }
    let [mut alive, mut gone] = samples;
    alive.sort_unstable();
    gone.sort_unstable();
    ReservedCost {
        alive: quantile(&alive, 0.5),
        gone: quantile(&gone, 0.5),
        gone_max: gone.last().copied().unwrap_or_default(),
    }
}

/// Where `benches/peers/install` put the peers.
fn peers_dir() -> PathBuf {
    std::env::var_os("LOCKKIT_PEERS_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/peers"),
        PathBuf::from,
    )
}

/// The installed peers and their versions, from the install script's marker.
fn installed_peers() -> Vec<(String, String)> {
    let marker = peers_dir().join("installed");
    std::fs::read_to_string(marker)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (peer, version) = line.split_once(' ')?;
            Some((peer.to_owned(), version.trim().to_owned()))
        })
        .collect()
}

/// A comma list from the environment: `None` when unset (everything), empty for `none`.
fn selection(var: &str) -> Option<Vec<String>> {
    let value = std::env::var(var).ok()?;
    if value.trim().eq_ignore_ascii_case("none") {
        return Some(Vec::new());
    }
    Some(
        value
            .split(',')
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect(),
    )
}

/// One peer row: runs the peer's runner against the server and parses its JSON line.
async fn run_peer(url: &str, peer: &str, workload: Workload, window: Duration) -> Option<Outcome> {
    let runner = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/peers/run");
    let name = lockkit_suite::unique(&format!("bench-contention-{peer}"));
    let output = tokio::process::Command::new(&runner)
        .arg(peer)
        .args(["--url", url, "--name", &name])
        .args(["--workers", &workload.workers.to_string()])
        .args(["--hold-ms", &workload.hold.as_millis().to_string()])
        .args(["--think-ms", &workload.think.as_millis().to_string()])
        .args(["--secs", &window.as_secs_f64().to_string()])
        .env("LOCKKIT_PEERS_DIR", peers_dir())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(window + Duration::from_secs(120), output).await {
        Ok(Ok(output)) => output,
        Ok(Err(err)) => {
            eprintln!("  {peer}: cannot run {}: {err}", runner.display());
            return None;
        }
        Err(_) => {
            eprintln!("  {peer}: the runner hung; row skipped");
            return None;
        }
    };
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        eprintln!("  {peer}: the runner failed ({}):\n{stderr}", output.status);
        return None;
    }
    let parsed: serde_json::Value = match serde_json::from_slice(&output.stdout) {
        Ok(parsed) => parsed,
        Err(err) => {
            eprintln!("  {peer}: the runner's output is not JSON ({err}):\n{stderr}");
            return None;
        }
    };
    let number = |key: &str| parsed[key].as_u64().unwrap_or(0);
    let events = parse_events(&parsed);
    Some(analyse(Record {
        library: peer.to_owned(),
        version: parsed["version"].as_str().unwrap_or("?").to_owned(),
        workload,
        sharing: Sharing::Exclusive,
        start_ns: number("start_ns"),
        deadline_ns: number("deadline_ns"),
        events,
        errors: number("errors"),
    }))
}

/// A plain fred client configured like lockkit's command client, sending
/// `EVALSHA <script> 1 <key> <owner> <marker> <lease>` (the shape of lockkit's acquire).
struct Floor {
    raw: RedisClient,
    frame: Vec<Value>,
    route: ClusterHash,
}

impl Floor {
    /// The floor's client; `key` is the script's one key (a lock key, or the channel).
    async fn new(url: &str, client: &Client, script: &str, key: &str) -> Floor {
        let raw = lockkit_suite::raw_builder(url)
            .build()
            .expect("a fred client");
        let _connection = raw.init().await.expect("connected");
        let sha: String = raw.script_load(script).await.expect("SCRIPT LOAD");
        let owner = format!("{}:{:?}", client.id(), std::thread::current().id());
        let marker = hold_marker(client.id(), 1_000_000);
        let lease = client.watchdog_timeout().as_millis().to_string();
        let mut frame = vec![Value::from(sha), Value::from(1_i64), Value::from(key)];
        frame.extend([&owner, &marker, &lease].map(|arg| Value::from(arg.as_str())));
        Floor {
            raw,
            frame,
            route: ClusterHash::Custom(key_slot(key)),
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

/// The raw pub/sub handoff floor: p50 and p99.
#[derive(Debug, Clone, Copy)]
struct PubsubFloor {
    p50: Duration,
    p99: Duration,
}

/// Measures the raw pub/sub handoff: a holder client sends `EVALSHA` of [`PUBLISH`] on a channel;
/// a waiter task, woken by the message on its own [`SubscriberClient`], sends one `EVALSHA` of
/// [`TRIVIAL`] through a third client; each sample runs from the holder's send to the waiter's
/// reply. The holder sleeps `idle` before each sample (0: back to back). [`RTT_SAMPLES`] samples
/// after 20 for warm-up. Without `then_evalsha`, a sample ends when the waiter task has the
/// message: the floor of a direct grant, where the message is the lock.
async fn pubsub_floor(
    url: &str,
    client: &Client,
    idle: Duration,
    then_evalsha: bool,
) -> PubsubFloor {
    let channel = Namespace::default()
        .lock(&lockkit_suite::unique("bench-contention-pubsub"))
        .expect("a valid name")
        .key;
    let holder = Floor::new(url, client, PUBLISH, &channel).await;
    let waiter = Floor::new(url, client, TRIVIAL, &channel).await;
    let subscriber: SubscriberClient = lockkit_suite::raw_builder(url)
        .build_subscriber_client()
        .expect("a fred subscriber client");
    let _connection = subscriber.init().await.expect("connected");
    let mut messages = subscriber.message_rx();
    subscriber
        .subscribe(channel.as_str())
        .await
        .expect("SUBSCRIBE");
    // The subscription must be live at the server before the first publish, or that message is
    // lost and the waiter waits for ever (the start-up hang of earlier runs): wait until Redis
    // counts the subscriber.
    lockkit_suite::within(Duration::from_secs(30), "the floor's subscription", async {
        while subscribers(&holder.raw, &channel).await == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<Instant>();
    let total = RTT_SAMPLES + 20;
    let waiter_task = tokio::spawn(async move {
        for _ in 0..total {
            if messages.recv().await.is_err() {
                break;
            }
            if then_evalsha {
                std::hint::black_box(waiter.evalsha().await);
            }
            if done_tx.send(Instant::now()).is_err() {
                break;
            }
        }
        waiter
    });
    let mut samples = Vec::with_capacity(RTT_SAMPLES);
    for i in 0..total {
        if !idle.is_zero() {
            tokio::time::sleep(idle).await;
        }
        let sent = Instant::now();
        std::hint::black_box(holder.evalsha().await);
        let replied = lockkit_suite::within(
            Duration::from_secs(30),
            "the pub/sub floor's waiter",
            done_rx.recv(),
        )
        .await
        .expect("the waiter replied");
        if i >= 20 {
            samples.push(replied.saturating_duration_since(sent));
        }
    }
    let waiter = waiter_task.await.expect("the waiter task");
    let _ = subscriber.quit().await;
    let _ = holder.raw.quit().await;
    let _ = waiter.raw.quit().await;
    samples.sort_unstable();
    PubsubFloor {
        p50: quantile(&samples, 0.5),
        p99: quantile(&samples, 0.99),
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

/// The floors of one run.
struct Floors {
    rtt: Duration,
    pubsub_hot: PubsubFloor,
    pubsub_idle: Option<PubsubFloor>,
    /// The grant floors: publish, and the waiter woken by the message (no round trip after it).
    grant_hot: PubsubFloor,
    grant_idle: Option<PubsubFloor>,
    rtt_after: Duration,
    rtt_idle: Option<Duration>,
}

impl Floors {
    /// The pub/sub floor a row's handoffs compare with: hot for H = 0, after 10 ms idle else.
    fn pubsub_for(&self, workload: Workload) -> Option<PubsubFloor> {
        if workload.hold.is_zero() {
            Some(self.pubsub_hot)
        } else {
            self.pubsub_idle
        }
    }
}

fn fmt_opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.decimals$}"))
}

fn print_table(outcomes: &[Outcome], floors: &Floors) {
    let rtt_us = micros(floors.rtt);
    println!(
        "| library | W | H ms | T ms | acquisitions | acq/s | attempts/acq | msgs/acq | PUBLISH/acq \
         | bytes/acq | min/max | owner changes | handoffs \
         | handoff p50 µs | p99 µs | RTT µs | p50 RTT | p99 RTT | p50 / pubsub floor \
         | mean hold ms | net overhead µs | net RTT | overlaps |"
    );
    println!(
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for o in outcomes {
        let row_rtt_us = micros(o.rtt);
        let p50 = o.handoff(0.5).map(micros);
        let p99 = o.handoff(0.99).map(micros);
        let pubsub = floors.pubsub_for(o.workload).map(|f| micros(f.p50));
        let net = o.net_overhead_us();
        let library = if PEERS.contains(&o.library.as_str()) {
            format!("{} {}", o.library, o.version)
        } else {
            format!("lockkit {}", o.library)
        };
        let errors = if o.errors > 0 {
            format!(" ({} errors)", o.errors)
        } else {
            String::new()
        };
        println!(
            "| {library}{errors} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {:.2} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {:.2} | {:.0} | {:.1} | {} |",
            o.workload.workers,
            o.workload.hold.as_millis(),
            o.workload.think.as_millis(),
            o.acquisitions,
            o.acquisitions as f64 / o.window.as_secs_f64(),
            fmt_opt(o.attempts, 2),
            fmt_opt(o.messages.map(|m| m.received), 2),
            fmt_opt(o.messages.map(|m| m.publishes), 2),
            fmt_opt(o.messages.map(|m| m.output_bytes), 0),
            o.min_max,
            o.owner_changes,
            o.handoffs.len(),
            fmt_opt(p50, 0),
            fmt_opt(p99, 0),
            row_rtt_us,
            fmt_opt(p50.map(|p| p / row_rtt_us), 1),
            fmt_opt(p99.map(|p| p / row_rtt_us), 1),
            fmt_opt(p50.zip(pubsub).map(|(p, f)| p / f), 1),
            o.mean_hold.as_secs_f64() * 1e3,
            net,
            net / row_rtt_us,
            o.overlaps,
        );
    }
    let lockkit_overlaps: usize = outcomes
        .iter()
        .filter(|o| !PEERS.contains(&o.library.as_str()))
        .map(|o| o.overlaps)
        .sum();
    println!();
    println!(
        "msgs/acq: pub/sub messages all the row's clients received, per acquisition \
         (lockkit_pubsub_messages_total); PUBLISH/acq: Redis' PUBLISH and SPUBLISH calls per \
         acquisition (INFO commandstats); the JSON adds the channel's subscribers mid-row (PUBSUB \
         NUMSUB) and what Redis wrote, PUBLISH × subscribers, per acquisition"
    );
    println!(
        "floor: median raw EVALSHA round trip = {rtt_us:.1} µs at the start (each row's RTT \
         columns use the floor measured just before it); overlapping holds of lockkit \
         (must be 0): {lockkit_overlaps}"
    );
    let floor_lines = [
        (
            "pub/sub handoff floor (publish, then one EVALSHA from the woken waiter)",
            floors.pubsub_hot,
            floors.pubsub_idle,
        ),
        (
            "grant floor (publish, the waiter woken by the message; no round trip after it)",
            floors.grant_hot,
            floors.grant_idle,
        ),
    ];
    for (what, hot, idle) in floor_lines {
        println!(
            "{what}, hot: p50 {:.1} µs, p99 {:.1} µs",
            micros(hot.p50),
            micros(hot.p99)
        );
        if let Some(idle) = idle {
            println!(
                "{what}, after 10 ms idle: p50 {:.1} µs, p99 {:.1} µs",
                micros(idle.p50),
                micros(idle.p99)
            );
        }
    }
    println!(
        "floor again after the rows: {:.1} µs (drift check; the table uses the first)",
        micros(floors.rtt_after)
    );
    if let Some(idle) = floors.rtt_idle {
        println!(
            "floor after 10 ms idle (diagnostic, each round trip preceded by a 10 ms sleep): \
             {:.1} µs",
            micros(idle)
        );
    }
}

/// Writes every row and floor as JSON (`LOCKKIT_BENCH_OUT`, default
/// `target/bench-results/contention.json`).
fn write_json(
    outcomes: &[Outcome],
    floors: &Floors,
    uncontended: &[Uncontended],
    reserved: Option<ReservedCost>,
    window: Duration,
) {
    let path = std::env::var_os("LOCKKIT_BENCH_OUT").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-results/contention.json"),
        PathBuf::from,
    );
    let rows: Vec<_> = outcomes
        .iter()
        .map(|o| {
            let rtt_us = micros(o.rtt);
            let peer = PEERS.contains(&o.library.as_str());
            let p50 = o.handoff(0.5).map(micros);
            let p99 = o.handoff(0.99).map(micros);
            let pubsub = floors.pubsub_for(o.workload).map(|f| micros(f.p50));
            json!({
                "library": if peer { o.library.clone() } else { format!("lockkit {}", o.library) },
                "kind": if peer { "peer" } else { "lockkit" },
                "version": o.version,
                "workers": o.workload.workers,
                "hold_ms": o.workload.hold.as_millis() as u64,
                "think_ms": o.workload.think.as_millis() as u64,
                "window_s": o.window.as_secs_f64(),
                "acquisitions": o.acquisitions,
                "acq_per_s": o.acquisitions as f64 / o.window.as_secs_f64(),
                "attempts_per_acquisition": o.attempts,
                "messages_per_acquisition": o.messages.map(|m| m.received),
                "publishes_per_acquisition": o.messages.map(|m| m.publishes),
                "channel_subscribers": o.messages.map(|m| m.subscribers),
                "delivered_per_acquisition": o.messages.map(|m| m.delivered),
                "output_bytes_per_acquisition": o.messages.map(|m| m.output_bytes),
                "min_max": o.min_max,
                "owner_changes": o.owner_changes,
                "handoffs": o.handoffs.len(),
                "handoff_p50_us": p50,
                "handoff_p99_us": p99,
                "rtt_us": rtt_us,
                "handoff_p50_rtt": p50.map(|p| p / rtt_us),
                "handoff_p99_rtt": p99.map(|p| p / rtt_us),
                "handoff_p50_pubsub_floor": p50.zip(pubsub).map(|(p, f)| p / f),
                "mean_hold_ms": o.mean_hold.as_secs_f64() * 1e3,
                "hold_p50_ms": o.hold_p50.as_secs_f64() * 1e3,
                "hold_p99_ms": o.hold_p99.as_secs_f64() * 1e3,
                "net_overhead_us": o.net_overhead_us(),
                "net_overhead_rtt": o.net_overhead_us() / rtt_us,
                "overlaps": o.overlaps,
                "errors": o.errors,
            })
        })
        .collect();
    let doc = json!({
        "window_s": window.as_secs_f64(),
        "floors": {
            "rtt_us": micros(floors.rtt),
            "rtt_after_us": micros(floors.rtt_after),
            "rtt_after_10ms_idle_us": floors.rtt_idle.map(micros),
            "pubsub_hot_p50_us": micros(floors.pubsub_hot.p50),
            "pubsub_hot_p99_us": micros(floors.pubsub_hot.p99),
            "pubsub_idle_p50_us": floors.pubsub_idle.map(|f| micros(f.p50)),
            "pubsub_idle_p99_us": floors.pubsub_idle.map(|f| micros(f.p99)),
            "grant_hot_p50_us": micros(floors.grant_hot.p50),
            "grant_idle_p50_us": floors.grant_idle.map(|f| micros(f.p50)),
        },
        "rows": rows,
        "reserved_waiter": reserved.map(|cost| json!({
            "alive_p50_us": micros(cost.alive),
            "gone_p50_us": micros(cost.gone),
            "gone_max_us": micros(cost.gone_max),
            "handoff_window_ms": lockkit::protocol::lock::HANDOFF_WINDOW.as_millis() as u64,
        })),
        "uncontended": uncontended
            .iter()
            .map(|u| json!({
                "library": u.library,
                "lock_unlock_p50_us": micros(u.lock_unlock),
                "ping_p50_us": micros(u.ping),
                "ratio": u.ratio(),
                "ratio_to_empty_evalsha_pair": u.ratio_to_empty_pair(),
            }))
            .collect::<Vec<_>>(),
    });
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).expect("create the output directory");
    }
    let text = serde_json::to_string_pretty(&doc).expect("JSON");
    std::fs::write(&path, text + "\n").expect("write the JSON output");
    println!("rows and floors as JSON: {}", path.display());
}

fn window() -> Duration {
    let secs = std::env::var("LOCKKIT_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s > 0.0)
        .unwrap_or(3.0);
    Duration::from_secs_f64(secs)
}

/// The peers to run: the selected ones (all by default) that are installed; says so for the
/// others.
fn peers_to_run() -> Vec<String> {
    let installed = installed_peers();
    let selected = selection("LOCKKIT_BENCH_PEERS")
        .unwrap_or_else(|| PEERS.iter().map(|p| (*p).to_owned()).collect());
    let mut run = Vec::new();
    for peer in selected {
        if !PEERS.contains(&peer.as_str()) {
            println!("unknown peer {peer:?} in LOCKKIT_BENCH_PEERS (known: {PEERS:?})");
        } else if installed.iter().any(|(p, _)| *p == peer) {
            run.push(peer);
        } else {
            println!(
                "peer {peer} is not installed in {}: skipped (install it with \
                 `benches/peers/install {peer}`, or run `scripts/bench-contention`)",
                peers_dir().display()
            );
        }
    }
    run
}

async fn bench(url: &str, smoke: bool) {
    let clients =
        futures::future::join_all((0..MAX_WORKERS).map(|_| lockkit_suite::client(url))).await;
    let rtt_key = Namespace::default()
        .lock(&lockkit_suite::unique("bench-contention-raw"))
        .expect("a valid name")
        .key;
    let floor = Floor::new(url, &clients[0], TRIVIAL, &rtt_key).await;
    let rtt = floor.median(Duration::ZERO).await;
    let pubsub_hot = pubsub_floor(url, &clients[0], Duration::ZERO, true).await;
    let pubsub_idle = if smoke {
        None
    } else {
        Some(pubsub_floor(url, &clients[0], ms(10), true).await)
    };
    let grant_hot = pubsub_floor(url, &clients[0], Duration::ZERO, false).await;
    let grant_idle = if smoke {
        None
    } else {
        Some(pubsub_floor(url, &clients[0], ms(10), false).await)
    };

    let only = selection("LOCKKIT_BENCH_ONLY");
    let primitives: Vec<Primitive> = Primitive::ALL
        .into_iter()
        .filter(|p| {
            only.as_ref()
                .is_none_or(|only| only.iter().any(|o| o == p.name()))
        })
        .collect();
    let (workloads, window, peers) = if smoke {
        let rows = workloads()
            .into_iter()
            .filter(|w| w.workers == 4 && w.hold.is_zero())
            .collect();
        (rows, Duration::from_millis(200), Vec::new())
    } else {
        (workloads(), window(), peers_to_run())
    };
    let w64 = std::env::var("LOCKKIT_BENCH_W64").unwrap_or_default();
    let workloads = if w64 == "only" { Vec::new() } else { workloads };
    let flavor = match tokio::runtime::Handle::current().runtime_flavor() {
        tokio::runtime::RuntimeFlavor::CurrentThread => "current_thread",
        _ => "multi_thread",
    };
    println!(
        "contention: D = {:.1} s per row; lockkit: one {flavor} runtime, one client per worker, \
         watchdog-mode lock(), {:?}; peers: {peers:?}, one runner process per row, one client per \
         worker; {} rows each",
        window.as_secs_f64(),
        primitives.iter().map(|p| p.name()).collect::<Vec<_>>(),
        workloads.len()
    );
    let log = |o: &Outcome| {
        eprintln!(
            "  {} W={} H={:?} T={:?}: {} acquisitions, {} overlaps, {} errors",
            o.library,
            o.workload.workers,
            o.workload.hold,
            o.workload.think,
            o.acquisitions,
            o.overlaps,
            o.errors
        );
    };
    let mut uncontended = Vec::new();
    let mut reserved = None;
    if !smoke && primitives.contains(&Primitive::Lock) {
        reserved = Some(reserved_cost(&clients, &floor.raw).await);
        uncontended = uncontended_lockkit(&clients[0], &floor.raw).await;
        if peers.iter().any(|p| p == "rslock") {
            uncontended.extend(uncontended_peer(url, "rslock").await);
        }
    }
    let mut outcomes = Vec::new();
    for &primitive in &primitives {
        for &workload in &workloads {
            let rtt = floor.median(Duration::ZERO).await;
            let mut outcome = run_lockkit(&clients, &floor.raw, primitive, workload, window).await;
            outcome.rtt = rtt;
            log(&outcome);
            outcomes.push(outcome);
        }
    }
    for peer in &peers {
        for &workload in &workloads {
            let rtt = floor.median(Duration::ZERO).await;
            if let Some(mut outcome) = run_peer(url, peer, workload, window).await {
                outcome.rtt = rtt;
                log(&outcome);
                outcomes.push(outcome);
            }
        }
    }
    // W = 64: lockkit's workers over 4 processes; each peer as its runner runs W workers. Two
    // rows: H = 5 ms, T = 20 ms, and H = 10 ms, T = 0 (every acquisition a handoff, as in the
    // W = 4 and W = 16 rows of the same H and T, whose bytes per acquisition it is compared with).
    let many_rows = [(5, 20), (10, 0)];
    for (hold, think) in many_rows.into_iter().filter(|_| !smoke && w64 != "0") {
        let many = Workload {
            workers: MANY_WORKERS,
            hold: ms(hold),
            think: ms(think),
        };
        for &primitive in primitives.iter().filter(|p| **p != Primitive::SpinLock) {
            let rtt = floor.median(Duration::ZERO).await;
            if let Some(mut outcome) =
                run_lockkit_processes(url, (&clients[0], &floor.raw), primitive, many, window).await
            {
                outcome.rtt = rtt;
                log(&outcome);
                outcomes.push(outcome);
            }
        }
        for peer in &peers {
            let rtt = floor.median(Duration::ZERO).await;
            if let Some(mut outcome) = run_peer(url, peer, many, window).await {
                outcome.rtt = rtt;
                log(&outcome);
                outcomes.push(outcome);
            }
        }
    }
    let rtt_after = floor.median(Duration::ZERO).await;
    let rtt_idle = if smoke {
        None
    } else {
        Some(floor.median(ms(10)).await)
    };
    let floors = Floors {
        rtt,
        pubsub_hot,
        pubsub_idle,
        grant_hot,
        grant_idle,
        rtt_after,
        rtt_idle,
    };
    println!();
    print_table(&outcomes, &floors);
    if !uncontended.is_empty() {
        println!();
        println!(
            "| uncontended, {UNCONTENDED_SAMPLES} of each, interleaved | lock + unlock p50 µs | \
             its PING p50 µs | ratio | ÷ 2 × empty EVALSHA |"
        );
        println!("|---|---:|---:|---:|---:|");
        for row in &uncontended {
            println!(
                "| {} | {:.1} | {:.1} | {:.2} | {} |",
                row.library,
                micros(row.lock_unlock),
                micros(row.ping),
                row.ratio(),
                row.ratio_to_empty_pair()
                    .map_or_else(|| "–".to_owned(), |r| format!("{r:.2}")),
            );
        }
    }
    if let Some(cost) = reserved {
        println!();
        println!(
            "longest waiter, {RESERVED_SAMPLES} handoffs each: alive p50 {:.0} µs; gone (its \
             client died while it waited, its connection closed) p50 {:.0} µs, max {:.0} µs",
            micros(cost.alive),
            micros(cost.gone),
            micros(cost.gone_max),
        );
    }
    if !smoke {
        write_json(&outcomes, &floors, &uncontended, reserved, window);
    }
    // Peers' overlaps are findings to report; lockkit's would be a bug.
    let lockkit_overlaps: usize = outcomes
        .iter()
        .filter(|o| !PEERS.contains(&o.library.as_str()))
        .map(|o| o.overlaps)
        .sum();
    assert_eq!(lockkit_overlaps, 0, "lockkit's holds overlapped");

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
    metrics::set_global_recorder(MessageRecorder).expect("the only metrics recorder");
    if let Ok(spec) = std::env::var(CHILD) {
        rt.block_on(child(&spec));
        return;
    }
    let server = rt.block_on(lockkit_suite::spawned());
    rt.block_on(bench(&server.url(), !bench_mode));
    drop(server);
}
