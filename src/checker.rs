//! The reliability suite's checker, in the spirit of Jepsen's lock tests.
//!
//! Workers in several clients (and, for the crash and pause faults, in separate processes) run
//! critical sections on a resource the lock does **not** protect by itself: a read-modify-write
//! counter and an append-only history list in a separate Redis (the [`Store`]), so faults injected
//! into the lock's Redis never touch the evidence. Each critical section is recorded as a
//! [`Section`] with timestamps from one clock ([`now`]), and [`check`] turns the sections and the
//! store's history into a [`Verdict`]:
//!
//! - **overlaps**: a section entered while the resource was already at capacity (1 for a lock,
//!   N for a semaphore). Each overlap is classified by what the holders already inside knew:
//!   *fenced* (one of them had a write rejected by the fencing check), *signalled* (one of them
//!   had been told its lease was lost by the time the other entered), *late* (one of them was told,
//!   but only after the other entered: the known limits of a lease lock, a paused process or
//!   Redis losing its data), or *silent* (nobody was ever told: a library fault);
//! - **lost updates**: two accepted writes that read the same counter value;
//! - **stale writes**: with fencing tokens, a write accepted with a token not larger than the
//!   last accepted one;
//! - **token regressions**: a section that began after another one ended, with a token not
//!   larger than that one's.
//!
//! [`Verdict::violations`] adds up silent overlaps, lost updates, stale writes and token
//! regressions: what a correct lock must never produce.
//!
//! # One clock
//!
//! Every timestamp is `CLOCK_MONOTONIC` in nanoseconds ([`now`]). On Linux it is one clock for the
//! whole machine, so the timestamps of the test process and of its worker processes compare
//! directly (tokio's and std's `Instant` read the same clock). It never jumps with wall-clock
//! changes. The store's history list adds a second, independent order: the order in which the
//! store's Redis executed the writes.
//!
//! Each test appends its counts to a JSON-lines file ([`Record`]), from which
//! `scripts/reliability-report` builds the tables of `docs/reliability.md`.

use std::collections::{BTreeMap, HashSet};
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::interfaces::LuaInterface;
use lockkit_testkit::{encode_command, RespValue};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: the one clock of every timestamp in the suite.
///
/// The first call starts the [scheduling-lag monitor](scheduling_lags), so it watches every
/// history from its first timestamp.
///
/// # Panics
/// If the clock cannot be read (it always can on Linux).
pub fn now() -> u64 {
    lag_monitor();
    monotonic()
}

/// How late the lag monitor's thread may wake from its 1 ms sleep before the gap counts as a
/// window in which the machine did not run this process.
pub const SCHEDULING_LAG_NS: u64 = 20_000_000;

/// The windows (`now` timestamps, start and end) in which this test process was not scheduled:
/// a thread that sleeps 1 ms at a time woke more than [`SCHEDULING_LAG_NS`] late. On a loaded
/// machine (two cores shared with builds and other tests) the test's clients, its recorder and
/// Redis all stand still for tens of milliseconds now and then; a stall measure cuts these
/// windows out, as it cuts out faults, because no library can serve a waiter whose process does
/// not run. Windows since the first [`now`].
pub fn scheduling_lags() -> Vec<(u64, u64)> {
    lag_monitor()
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// The lag monitor's windows, the thread started on the first call.
fn lag_monitor() -> &'static std::sync::Mutex<Vec<(u64, u64)>> {
    static LAGS: std::sync::OnceLock<std::sync::Mutex<Vec<(u64, u64)>>> =
        std::sync::OnceLock::new();
    LAGS.get_or_init(|| {
        // The monitor is best effort: without its thread no window is cut out.
        let _ = std::thread::Builder::new()
            .name("lag-monitor".into())
            .spawn(|| loop {
                let before = monotonic();
                std::thread::sleep(std::time::Duration::from_millis(1));
                let after = monotonic();
                if after.saturating_sub(before) > SCHEDULING_LAG_NS {
                    lag_monitor()
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((before, after));
                }
            });
        std::sync::Mutex::new(Vec::new())
    })
}

/// `CLOCK_MONOTONIC` in nanoseconds.
fn monotonic() -> u64 {
    use nix::time::{clock_gettime, ClockId};
    match clock_gettime(ClockId::CLOCK_MONOTONIC) {
        Ok(ts) => {
            let secs = u64::try_from(ts.tv_sec()).unwrap_or(0);
            let nanos = u64::try_from(ts.tv_nsec()).unwrap_or(0);
            secs * 1_000_000_000 + nanos
        }
        Err(err) => panic!("cannot read CLOCK_MONOTONIC: {err}"),
    }
}

/// Milliseconds between two [`now`] timestamps (negative when `to` is earlier).
pub fn millis_between(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / 1e6
}

// === Store ===

/// Writes the counter and appends to the history in one step (the write itself is atomic; the
/// read-modify-write around it is not).
const WRITE: &str = "\
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[2] .. '|-|1')
return 1";

/// The storage-side fencing check: accept a write only with a token larger than the last one
/// accepted. A rejected write is recorded too.
const FENCED_WRITE: &str = "\
local token = tonumber(ARGV[3])
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
if token > last then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('SET', KEYS[3], ARGV[3])
  redis.call('RPUSH', KEYS[2], ARGV[2] .. '|' .. ARGV[3] .. '|1')
  return 1
end
redis.call('RPUSH', KEYS[2], ARGV[2] .. '|' .. ARGV[3] .. '|0')
return 0";

const READ: &str = "return tonumber(redis.call('GET', KEYS[1]) or '0')";
const HISTORY: &str = "return redis.call('LRANGE', KEYS[1], 0, -1)";

/// The unprotected resource: a counter and a history list in a Redis that no fault touches.
#[derive(Clone)]
pub struct Store {
    redis: fred::clients::Client,
    counter: String,
    history: String,
    fence: String,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("counter", &self.counter)
            .finish_non_exhaustive()
    }
}

/// One write in the store's history, in the order the store executed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The section that wrote.
    pub section: String,
    /// The counter value the section read before writing `read + 1`.
    pub read: i64,
    /// The fencing token sent with the write, for fenced writes.
    pub token: Option<u64>,
    /// Whether the write was applied (always, unless the fencing check rejected it).
    pub accepted: bool,
}

impl Store {
    /// The resource called `name` in the Redis at `url`.
    ///
    /// # Panics
    /// When it cannot connect.
    pub async fn connect(url: &str, name: &str) -> Store {
        Store {
            redis: crate::raw(url).await,
            counter: format!("resource:{{{name}}}:counter"),
            history: format!("resource:{{{name}}}:history"),
            fence: format!("resource:{{{name}}}:fence"),
        }
    }

    /// Reads the counter (the "read" of a read-modify-write).
    pub async fn read(&self) -> Result<i64, fred::error::Error> {
        self.redis.eval(READ, vec![self.counter.clone()], ()).await
    }

    /// Writes `read + 1` and appends the write to the history; with a token, only if the token
    /// is larger than the last accepted one. Returns whether the write was applied.
    pub async fn write(
        &self,
        section: &str,
        read: i64,
        token: Option<u64>,
    ) -> Result<bool, fred::error::Error> {
        let entry = format!("{section}|{read}");
        let value = (read + 1).to_string();
        match token {
            None => {
                let _: i64 = self
                    .redis
                    .eval(
                        WRITE,
                        vec![self.counter.clone(), self.history.clone()],
                        vec![value, entry],
                    )
                    .await?;
                Ok(true)
            }
            Some(token) => {
                let applied: i64 = self
                    .redis
                    .eval(
                        FENCED_WRITE,
                        vec![
                            self.counter.clone(),
                            self.history.clone(),
                            self.fence.clone(),
                        ],
                        vec![value, entry, token.to_string()],
                    )
                    .await?;
                Ok(applied == 1)
            }
        }
    }

    /// Every write so far, in the order the store executed them.
    ///
    /// # Panics
    /// When the store cannot be read or holds something else.
    pub async fn history(&self) -> Vec<Write> {
        let entries: Vec<String> = self
            .redis
            .eval(HISTORY, vec![self.history.clone()], ())
            .await
            .unwrap_or_else(|err| panic!("cannot read the history: {err}"));
        entries.iter().map(|entry| parse_write(entry)).collect()
    }

    /// The counter's current value.
    ///
    /// # Panics
    /// When the store cannot be read.
    pub async fn counter(&self) -> i64 {
        self.read()
            .await
            .unwrap_or_else(|err| panic!("cannot read the counter: {err}"))
    }
}

fn parse_write(entry: &str) -> Write {
    let parts: Vec<&str> = entry.rsplitn(4, '|').collect();
    let [accepted, token, read, section] = parts.as_slice() else {
        panic!("malformed history entry {entry:?}");
    };
    Write {
        section: (*section).to_owned(),
        read: read
            .parse()
            .unwrap_or_else(|_| panic!("malformed read in {entry:?}")),
        token: token.parse().ok(),
        accepted: *accepted == "1",
    }
}

// === Sections ===

/// One critical section, as its worker saw it. Timestamps are [`now`] values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Unique id, also written into the store's history (no `|`).
    pub id: String,
    /// When the acquire returned.
    pub acquired: u64,
    /// When the worker stopped touching the resource (after its last write, before releasing).
    pub released: u64,
    /// The fencing token of the hold, if any.
    pub token: Option<u64>,
    /// When the worker first learned that its lease was lost (`is_lost()`, `lost()`, or
    /// `Err(NotHeld)` from the release), if it did.
    pub lost: Option<u64>,
    /// How much of the resource's capacity the section takes (1 for a lock; the permits of a
    /// semaphore hold; the whole capacity for a writer).
    pub weight: u64,
}

impl Section {
    /// A section of weight 1 without token or lost signal.
    pub fn new(id: impl Into<String>, acquired: u64, released: u64) -> Section {
        Section {
            id: id.into(),
            acquired,
            released,
            token: None,
            lost: None,
            weight: 1,
        }
    }
}

/// Collects sections from many tasks.
#[derive(Debug, Clone, Default)]
pub struct Recorder {
    sections: Arc<Mutex<Vec<Section>>>,
}

impl Recorder {
    /// An empty recorder.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Records one section.
    pub fn record(&self, section: Section) {
        self.lock().push(section);
    }

    /// Every section recorded so far.
    pub fn sections(&self) -> Vec<Section> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Section>> {
        self.sections
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// What a worker did inside one critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Wrote; `accepted` is false when the fencing check rejected the write.
    Wrote {
        /// Whether the store applied the write.
        accepted: bool,
    },
    /// Saw its lease lost before writing and wrote nothing.
    Aborted,
}

/// The body every in-process worker runs while holding: read the counter, work for `work`,
/// and write `read + 1` unless `is_lost` says the lease is gone (a careful application checks
/// right before writing; only fencing closes the gap between that check and the write).
///
/// Returns the outcome and when the section ended.
pub async fn critical_section(
    store: &Store,
    section: &str,
    token: Option<u64>,
    work: Duration,
    is_lost: impl Fn() -> bool,
) -> Result<(Outcome, u64), fred::error::Error> {
    let read = store.read().await?;
    if !work.is_zero() {
        tokio::time::sleep(work).await;
    }
    if is_lost() {
        return Ok((Outcome::Aborted, now()));
    }
    let accepted = store.write(section, read, token).await?;
    Ok((Outcome::Wrote { accepted }, now()))
}

// === Checking ===

/// How an overlap came about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OverlapKind {
    /// A holder already inside had its conflicting write rejected by the fencing check.
    Fenced,
    /// A holder already inside had been told its lease was lost when the other entered.
    Signalled,
    /// A holder already inside was told its lease was lost, but only after the other entered (a
    /// paused process, Redis losing its data: the limits of any lease lock).
    Late,
    /// Nobody was told: the lock granted what it must not have.
    Silent,
}

/// One section entered while the resource was at capacity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Overlap {
    /// The section that entered.
    pub entered: String,
    /// The sections already inside.
    pub inside: Vec<String>,
    /// How it came about.
    pub kind: OverlapKind,
}

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Verdict {
    /// Sections checked.
    pub sections: usize,
    /// Writes in the history (accepted and rejected).
    pub writes: usize,
    /// Writes rejected by the fencing check.
    pub rejected: usize,
    /// Sections whose worker learned its lease was lost.
    pub lost_signals: usize,
    /// Overlaps, each classified.
    pub overlaps: Vec<Overlap>,
    /// Accepted writes that read a value another accepted write had read.
    pub lost_updates: usize,
    /// Accepted writes whose token was not larger than the previous accepted one.
    pub stale_writes: usize,
    /// Sections that began after another ended, with a token not larger than its token.
    pub token_regressions: usize,
}

impl Verdict {
    /// Overlaps of one kind.
    pub fn overlaps_of(&self, kind: OverlapKind) -> usize {
        self.overlaps.iter().filter(|o| o.kind == kind).count()
    }

    /// What a correct lock never produces: silent overlaps, lost updates, stale writes accepted,
    /// token regressions.
    pub fn violations(&self) -> usize {
        self.overlaps_of(OverlapKind::Silent)
            + self.lost_updates
            + self.stale_writes
            + self.token_regressions
    }

    /// Adds another resource's verdict to this one.
    pub fn merge(&mut self, other: Verdict) {
        self.sections += other.sections;
        self.writes += other.writes;
        self.rejected += other.rejected;
        self.lost_signals += other.lost_signals;
        self.overlaps.extend(other.overlaps);
        self.lost_updates += other.lost_updates;
        self.stale_writes += other.stale_writes;
        self.token_regressions += other.token_regressions;
    }

    /// Adds this verdict's counts to a record.
    pub fn to_record(&self, record: Record) -> Record {
        record
            .num("operations", self.sections as f64)
            .num("writes", self.writes as f64)
            .num("violations", self.violations() as f64)
            .num("overlaps", self.overlaps.len() as f64)
            .num(
                "overlaps_signalled",
                self.overlaps_of(OverlapKind::Signalled) as f64,
            )
            .num("overlaps_late", self.overlaps_of(OverlapKind::Late) as f64)
            .num(
                "overlaps_fenced",
                self.overlaps_of(OverlapKind::Fenced) as f64,
            )
            .num("lost_updates", self.lost_updates as f64)
            .num("stale_writes", self.stale_writes as f64)
            .num("token_regressions", self.token_regressions as f64)
            .num("rejected_writes", self.rejected as f64)
            .num("lost_signals", self.lost_signals as f64)
    }
}

/// Checks the sections of one resource of `capacity` against its store's history.
pub fn check(sections: &[Section], history: &[Write], capacity: u64) -> Verdict {
    let rejected_sections: HashSet<&str> = history
        .iter()
        .filter(|w| !w.accepted)
        .map(|w| w.section.as_str())
        .collect();
    let mut verdict = Verdict {
        sections: sections.len(),
        writes: history.len(),
        rejected: history.iter().filter(|w| !w.accepted).count(),
        lost_signals: sections.iter().filter(|s| s.lost.is_some()).count(),
        ..Verdict::default()
    };

    // Overlaps: sweep the sections in entry order, keeping those still inside.
    let mut by_entry: Vec<&Section> = sections.iter().collect();
    by_entry.sort_by_key(|s| (s.acquired, s.released));
    let mut inside: Vec<&Section> = Vec::new();
    for section in by_entry {
        inside.retain(|other| other.released > section.acquired);
        let load: u64 = inside.iter().map(|s| s.weight).sum();
        if load + section.weight > capacity {
            let kind = if inside
                .iter()
                .any(|s| rejected_sections.contains(s.id.as_str()))
            {
                OverlapKind::Fenced
            } else if inside
                .iter()
                .any(|s| s.lost.is_some_and(|lost| lost <= section.acquired))
            {
                OverlapKind::Signalled
            } else if inside.iter().any(|s| s.lost.is_some()) {
                OverlapKind::Late
            } else {
                OverlapKind::Silent
            };
            verdict.overlaps.push(Overlap {
                entered: section.id.clone(),
                inside: inside.iter().map(|s| s.id.clone()).collect(),
                kind,
            });
        }
        inside.push(section);
    }

    // Lost updates and stale writes, from the store's order.
    let mut reads = HashSet::new();
    let mut last_token: Option<u64> = None;
    for write in history.iter().filter(|w| w.accepted) {
        if !reads.insert(write.read) {
            verdict.lost_updates += 1;
        }
        if let Some(token) = write.token {
            if last_token.is_some_and(|last| token <= last) {
                verdict.stale_writes += 1;
            }
            last_token = Some(last_token.map_or(token, |last| last.max(token)));
        }
    }

    // Token regressions: compare each section with the largest token of those that ended before
    // it began.
    let mut tokened: Vec<&Section> = sections.iter().filter(|s| s.token.is_some()).collect();
    let mut by_release = tokened.clone();
    by_release.sort_by_key(|s| s.released);
    tokened.sort_by_key(|s| s.acquired);
    let mut ended = by_release.iter().peekable();
    let mut max_before: Option<u64> = None;
    for section in tokened {
        while let Some(done) = ended.peek() {
            if done.released >= section.acquired {
                break;
            }
            max_before = max_before.max(done.token);
            ended.next();
        }
        if let (Some(before), Some(token)) = (max_before, section.token) {
            if token <= before {
                verdict.token_regressions += 1;
            }
        }
    }
    verdict
}

// === Key events ===

/// Keyspace notifications of one key in a Redis the test controls, each stamped with [`now`]:
/// `expire` (a TTL was set: an acquire or a renewal), `expired`, `del`, `hset`, `hincrby`, ...
#[derive(Debug)]
pub struct KeyEvents {
    rx: mpsc::UnboundedReceiver<(String, u64)>,
    task: tokio::task::JoinHandle<()>,
}

impl KeyEvents {
    /// Enables keyspace notifications on the server at `addr` and subscribes to `key`'s; returns
    /// once the subscription is confirmed by the server.
    ///
    /// # Panics
    /// When the server cannot be reached or refuses.
    pub async fn subscribe(addr: SocketAddr, key: &str) -> KeyEvents {
        let config =
            lockkit_testkit::send_command(addr, &["CONFIG", "SET", "notify-keyspace-events", "KA"])
                .await
                .unwrap_or_else(|err| panic!("CONFIG SET notify-keyspace-events: {err}"));
        assert!(!config.is_error(), "CONFIG SET refused: {config:?}");
        let mut stream = TcpStream::connect(addr)
            .await
            .unwrap_or_else(|err| panic!("connecting to {addr}: {err}"));
        let channel = format!("__keyspace@0__:{key}");
        stream
            .write_all(&encode_command(&["SUBSCRIBE", channel.as_str()]))
            .await
            .unwrap_or_else(|err| panic!("SUBSCRIBE: {err}"));
        let mut buf = Vec::new();
        // The first reply confirms the subscription: from here on every event reaches us.
        let confirmation = read_reply(&mut stream, &mut buf)
            .await
            .unwrap_or_else(|| panic!("no SUBSCRIBE confirmation"));
        assert_eq!(
            confirmation
                .as_array()
                .and_then(|a| a.first())
                .and_then(RespValue::as_str),
            Some("subscribe"),
            "{confirmation:?}"
        );
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            while let Some(message) = read_reply(&mut stream, &mut buf).await {
                let at = now();
                let event = message
                    .as_array()
                    .and_then(|a| a.get(2))
                    .and_then(RespValue::as_str)
                    .map(str::to_owned);
                if let Some(event) = event {
                    if tx.send((event, at)).is_err() {
                        return;
                    }
                }
            }
        });
        KeyEvents { rx, task }
    }

    /// The next event and when it arrived; `None` when the connection closed.
    pub async fn next(&mut self) -> Option<(String, u64)> {
        self.rx.recv().await
    }

    /// Waits for the event called `name`; returns its time and every event before it.
    ///
    /// # Panics
    /// When the connection closes first.
    pub async fn until(&mut self, name: &str) -> (u64, Vec<String>) {
        let mut before = Vec::new();
        loop {
            match self.next().await {
                Some((event, at)) if event == name => return (at, before),
                Some((event, _)) => before.push(event),
                None => panic!("keyspace events ended before {name:?}"),
            }
        }
    }
}

impl Drop for KeyEvents {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn read_reply(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Option<RespValue> {
    loop {
        match RespValue::parse(buf) {
            Ok(Some((value, used))) => {
                buf.drain(..used);
                return Some(value);
            }
            Ok(None) => {}
            Err(_) => return None,
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

// === Results ===

/// One line of the suite's results: a fault, and what its test counted.
///
/// Written by [`Record::save`] as one JSON object per line to
/// `target/reliability/results.jsonl` (or the file named by `LOCKKIT_RELIABILITY_OUT`), and
/// printed with the marker `RELIABILITY `.
#[derive(Debug, Clone)]
pub struct Record {
    fields: BTreeMap<String, String>,
}

impl Record {
    /// A record for `fault` (a short id such as `sigkill-watchdog`) from the test `test`.
    pub fn new(fault: &str, test: &str) -> Record {
        let mut record = Record {
            fields: BTreeMap::new(),
        };
        record.set("fault", json_string(fault));
        record.set("test", json_string(test));
        record.set("runs", "1".to_owned());
        record
    }

    fn set(&mut self, key: &str, json: String) {
        self.fields.insert(key.to_owned(), json);
    }

    /// Sets a number.
    pub fn num(mut self, key: &str, value: f64) -> Record {
        self.set(key, json_number(value));
        self
    }

    /// Sets a list of numbers (e.g. recovery times in ms).
    pub fn nums(mut self, key: &str, values: &[f64]) -> Record {
        let items: Vec<String> = values.iter().map(|v| json_number(*v)).collect();
        self.set(key, format!("[{}]", items.join(",")));
        self
    }

    /// Sets a string.
    pub fn text(mut self, key: &str, value: &str) -> Record {
        self.set(key, json_string(value));
        self
    }

    /// The record as one line of JSON.
    pub fn to_json(&self) -> String {
        let fields: Vec<String> = self
            .fields
            .iter()
            .map(|(key, value)| format!("{}:{value}", json_string(key)))
            .collect();
        format!("{{{}}}", fields.join(","))
    }

    /// Prints the record and appends it to the results file.
    ///
    /// # Panics
    /// When the file cannot be written.
    pub fn save(&self) {
        let line = self.to_json();
        println!("RELIABILITY {line}");
        let path = results_path();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .unwrap_or_else(|err| panic!("creating {}: {err}", dir.display()));
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap_or_else(|err| panic!("opening {}: {err}", path.display()));
        // One write per line: appends from concurrent test processes do not interleave.
        file.write_all(format!("{line}\n").as_bytes())
            .unwrap_or_else(|err| panic!("writing {}: {err}", path.display()));
    }
}

/// The seed of a model-based test run: `LOCKKIT_MODEL_SEED` (to replay a failure), else a
/// fresh one from the clock. Print it with any failure.
pub fn model_seed() -> u64 {
    std::env::var("LOCKKIT_MODEL_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        })
}

/// Records that the model-based tests (`tests/model_*.rs`) ran `cases` generated cases of
/// `primitive` against its model and the real scripts: `lin_<primitive>_cases`, the "model cases"
/// column of the reliability report's history table. The record's fault is `model`, which the
/// report keeps out of its fault table.
pub fn save_model_cases(primitive: &str, cases: u32) {
    Record::new("model", &format!("{primitive} agrees with its model"))
        .num(&format!("lin_{primitive}_cases"), f64::from(cases))
        .save();
}

/// Where [`Record::save`] appends: `LOCKKIT_RELIABILITY_OUT`, else
/// `<target dir>/reliability/results.jsonl`.
pub fn results_path() -> PathBuf {
    if let Some(path) = std::env::var_os("LOCKKIT_RELIABILITY_OUT").filter(|p| !p.is_empty()) {
        return PathBuf::from(path);
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .filter(|p| !p.is_empty())
        .map_or_else(
            || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"),
            PathBuf::from,
        );
    target.join("reliability").join("results.jsonl")
}

fn json_number(value: f64) -> String {
    if value.is_finite() {
        // Three decimals are plenty for milliseconds.
        let rounded = (value * 1000.0).round() / 1000.0;
        format!("{rounded}")
    } else {
        "null".to_owned()
    }
}

fn json_string(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A small xorshift generator for the soak's random choices; quality is irrelevant.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded from `seed` (e.g. [`now`] and a worker number).
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, so close seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A number in `low..high` (`low` when the range is empty).
    pub fn range(&mut self, low: u64, high: u64) -> u64 {
        if high <= low {
            return low;
        }
        low + self.next_u64() % (high - low)
    }

    /// A duration in `low..high` milliseconds.
    pub fn millis(&mut self, low: u64, high: u64) -> Duration {
        Duration::from_millis(self.range(low, high))
    }

    /// True with probability `1 / n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.range(0, n.max(1)) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(section: &str, read: i64, token: Option<u64>, accepted: bool) -> Write {
        Write {
            section: section.to_owned(),
            read,
            token,
            accepted,
        }
    }

    #[test]
    fn a_serial_history_is_clean() {
        let sections = [Section::new("a", 0, 10), Section::new("b", 11, 20)];
        let history = [write("a", 0, None, true), write("b", 1, None, true)];
        let verdict = check(&sections, &history, 1);
        assert_eq!(verdict.violations(), 0);
        assert!(verdict.overlaps.is_empty());
    }

    #[test]
    fn overlaps_are_classified() {
        let silent = check(
            &[Section::new("a", 0, 10), Section::new("b", 5, 20)],
            &[],
            1,
        );
        assert_eq!(silent.overlaps_of(OverlapKind::Silent), 1);
        assert_eq!(silent.violations(), 1);

        let mut told = Section::new("a", 0, 10);
        told.lost = Some(4);
        let signalled = check(&[told.clone(), Section::new("b", 5, 20)], &[], 1);
        assert_eq!(signalled.overlaps_of(OverlapKind::Signalled), 1);
        assert_eq!(signalled.violations(), 0);

        told.lost = Some(8);
        let late = check(&[told, Section::new("b", 5, 20)], &[], 1);
        assert_eq!(late.overlaps_of(OverlapKind::Late), 1);
        assert_eq!(late.violations(), 0);

        let fenced = check(
            &[Section::new("a", 0, 10), Section::new("b", 5, 20)],
            &[write("b", 0, Some(2), true), write("a", 0, Some(1), false)],
            1,
        );
        assert_eq!(fenced.overlaps_of(OverlapKind::Fenced), 1);
        assert_eq!(fenced.violations(), 0);
    }

    #[test]
    fn capacity_allows_that_many_inside() {
        let sections = [
            Section::new("a", 0, 10),
            Section::new("b", 1, 10),
            Section::new("c", 2, 10),
        ];
        assert!(check(&sections, &[], 3).overlaps.is_empty());
        assert_eq!(check(&sections, &[], 2).overlaps.len(), 1);
    }

    #[test]
    fn lost_updates_stale_writes_and_regressions_are_found() {
        let history = [
            write("a", 0, Some(5), true),
            write("b", 0, Some(6), true),
            write("c", 1, Some(6), true),
        ];
        let verdict = check(&[], &history, 1);
        assert_eq!(verdict.lost_updates, 1);
        assert_eq!(verdict.stale_writes, 1);

        let mut a = Section::new("a", 0, 10);
        a.token = Some(7);
        let mut b = Section::new("b", 11, 20);
        b.token = Some(7);
        assert_eq!(check(&[a, b], &[], 1).token_regressions, 1);
    }

    #[test]
    fn history_entries_parse() {
        assert_eq!(parse_write("w|1#2|3|-|1"), write("w|1#2", 3, None, true));
        assert_eq!(parse_write("x|0|42|0"), write("x", 0, Some(42), false));
    }

    #[test]
    fn records_are_json() {
        let record = Record::new("f\"x", "t")
            .num("n", 1.5)
            .nums("l", &[1.0, 2.25]);
        assert_eq!(
            record.to_json(),
            r#"{"fault":"f\"x","l":[1,2.25],"n":1.5,"runs":1,"test":"t"}"#
        );
    }

    #[test]
    fn the_clock_moves_forward() {
        let a = now();
        let b = now();
        assert!(b >= a);
    }
}
