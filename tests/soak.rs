//! The soak: many clients, every primitive, random network faults, for a bounded time; it must end
//! with zero violations.
//!
//! Six clients, each behind a fault proxy of its own, run one worker per primitive: `Lock`,
//! `FencedLock` (fenced writes), `FairLock`, `ReadWriteLock` (readers and writers), `SpinLock`,
//! `MultiLock` (over two locks that single-lock workers also take), `Semaphore` (3 permits, holds
//! of 1 or 2) and `CountDownLatch` rounds. A chaos task keeps injecting faults into random proxies:
//! connection cuts, short partitions (shorter than the lease), latency with jitter, paused traffic,
//! and replies dropped after the server ran the command. Every critical section is recorded and
//! checked (`lockkit_suite::checker`); the counts go to `target/reliability/results.jsonl`.
//!
//! About a minute by default; `LOCKKIT_SOAK_SECS=<seconds>` runs it longer (or shorter).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use lockkit::{Client, Error};
use lockkit_suite::checker::{
    check, critical_section, now, Outcome, Record, Recorder, Rng, Section, Store, Verdict,
};
use lockkit_suite::{client_with, spawned, unique, within};
use lockkit_testkit::FaultProxy;
use tokio::time::Instant;

mod history;

const DEFAULT_SECS: u64 = 60;
const CLIENTS: usize = 6;
const SEMAPHORE_PERMITS: u64 = 3;
/// Watchdog timeout of every client: the partitions injected stay well below it.
const WATCHDOG: Duration = Duration::from_secs(3);
const FIXED_LEASE: Duration = Duration::from_secs(2);

fn soak_duration() -> Duration {
    let secs = std::env::var("LOCKKIT_SOAK_SECS")
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_SECS);
    Duration::from_secs(secs.max(1))
}

/// The primitives a worker can drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    Lock,
    Fenced,
    Fair,
    ReadWrite,
    Spin,
    Multi,
    /// A single lock on one of the multi-lock's members.
    Member,
    Semaphore,
}

const KINDS: [Kind; 8] = [
    Kind::Lock,
    Kind::Fenced,
    Kind::Fair,
    Kind::ReadWrite,
    Kind::Spin,
    Kind::Multi,
    Kind::Member,
    Kind::Semaphore,
];

/// One checked resource: a store (counter + history), the sections on it, its capacity.
struct Resource {
    store: Store,
    recorder: Recorder,
    capacity: u64,
}

/// Everything the workers share.
struct Soak {
    names: BTreeMap<&'static str, String>,
    resources: BTreeMap<&'static str, Resource>,
    /// Per primitive: every invocation and answer, per object (`tests/history`).
    histories: BTreeMap<&'static str, history::Recording>,
    /// When multi-lock acquires were in flight: each may take and give back members (its
    /// all-or-nothing tries), which the per-object histories do not show, so the stall measure
    /// of the members leaves these windows out.
    multi_in_flight: Mutex<Vec<(u64, u64)>>,
    end: Instant,
    /// Operations that failed with an error other than a lost lease, by description.
    errors: Mutex<BTreeMap<String, usize>>,
    acquired: Mutex<BTreeMap<Kind, usize>>,
    timed_out: AtomicUsize,
    not_held: AtomicUsize,
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Soak {
    fn name(&self, resource: &str) -> &str {
        &self.names[resource]
    }

    fn resource(&self, resource: &str) -> &Resource {
        &self.resources[resource]
    }

    fn error(&self, what: &str, err: &Error) {
        // Keep the kind of error, not every detail (request ids, ports).
        let text = format!("{what}: {err}");
        let key: String = text.chars().take(120).collect();
        *locked(&self.errors).entry(key).or_insert(0) += 1;
    }

    fn acquired(&self, kind: Kind) {
        *locked(&self.acquired).entry(kind).or_insert(0) += 1;
    }

    fn history(&self, primitive: &str) -> &history::Recording {
        &self.histories[primitive]
    }
}

/// The history of each primitive, and the reference model that judges it.
const PRIMITIVES: [(&str, history::Model); 7] = [
    ("lock", history::Model::Lock),
    ("fenced", history::Model::Lock),
    ("fair", history::Model::Lock),
    (
        "rw",
        history::Model::ReadWrite {
            capacity: CLIENTS as u64,
        },
    ),
    ("spin", history::Model::Spin),
    ("multi", history::Model::Lock),
    (
        "semaphore",
        history::Model::Semaphore {
            permits: SEMAPHORE_PERMITS,
        },
    ),
];

/// Records the end of an acquire in `recording`: granted (with the hold to release), timed out, or
/// failed (no known result).
fn acquire_outcome<G>(
    recording: &history::Recording,
    acquiring: &history::Acquiring,
    process: u64,
    objects: &[&str],
    result: &Result<Option<G>, Error>,
    token: impl Fn(&G) -> Option<u64>,
) -> Option<history::Hold> {
    match result {
        Ok(Some(guard)) => Some(recording.granted(acquiring, process, objects, token(guard))),
        Ok(None) => {
            recording.timed_out(acquiring);
            None
        }
        Err(_) => {
            recording.failed(acquiring);
            None
        }
    }
}

/// Runs the critical section of one exclusive (or weighted) hold on `resource` and records it.
/// `token` is checked by the store (fenced lock); `write` is false for readers and semaphore
/// holders, which share the resource and so only read.
async fn section(
    soak: &Soak,
    resource: &str,
    id: &str,
    token: Option<u64>,
    weight: u64,
    write: bool,
    is_lost: impl Fn() -> bool,
) {
    let res = soak.resource(resource);
    let acquired = now();
    let (outcome, released) = if write {
        match critical_section(&res.store, id, token, Duration::from_millis(1), &is_lost).await {
            Ok(done) => done,
            Err(err) => panic!("the store failed (no fault is injected there): {err}"),
        }
    } else {
        if let Err(err) = res.store.read().await {
            panic!("the store failed: {err}");
        }
        (Outcome::Wrote { accepted: true }, now())
    };
    let mut section = Section::new(id, acquired, released);
    section.token = token;
    section.weight = weight;
    if outcome == Outcome::Aborted {
        section.lost = Some(released);
    }
    res.recorder.record(section);
}

/// Releases through `release`, books the result and records it in `recording`'s history.
async fn finish<F>(
    soak: &Soak,
    what: &str,
    recording: &history::Recording,
    hold: &history::Hold,
    lost: bool,
    release: F,
) where
    F: std::future::Future<Output = Result<(), Error>>,
{
    if lost {
        recording.lost(hold);
    }
    let result = recording
        .release(hold, async {
            match release.await {
                Ok(()) => Ok(true),
                Err(Error::NotHeld { .. }) => Ok(false),
                Err(err) => Err(err),
            }
        })
        .await;
    match result {
        Ok(true) => {}
        Ok(false) => {
            soak.not_held.fetch_add(1, Ordering::Relaxed);
        }
        Err(err) => soak.error(what, &err),
    }
}

/// A guard dropped without unlock: released in the background, recorded as a pending release.
fn dropped(recording: &history::Recording, hold: &history::Hold, lost: bool) {
    if lost {
        recording.lost(hold);
    }
    recording.dropped(hold);
}

async fn worker(soak: Arc<Soak>, client: Client, kind: Kind, worker: usize) {
    let mut rng = Rng::new(now() ^ ((worker as u64) << 32) ^ kind as u64);
    let process = (worker as u64) * 16 + kind as u64;
    let mut round = 0u64;
    while Instant::now() < soak.end {
        round += 1;
        let id = format!("{kind:?}-{worker}#{round}");
        let lease = if rng.one_in(2) {
            None
        } else {
            Some(FIXED_LEASE)
        };
        let wait = rng.millis(20, 2000);
        let drop_it = rng.one_in(4);
        match kind {
            Kind::Lock | Kind::Fenced | Kind::Fair | Kind::Spin | Kind::Member => {
                let resource = match kind {
                    Kind::Lock => "lock",
                    Kind::Fenced => "fenced",
                    Kind::Fair => "fair",
                    Kind::Spin => "spin",
                    _ if rng.one_in(2) => "member-a",
                    _ => "member-b",
                };
                let name = soak.name(resource);
                let recording = soak.history(match kind {
                    Kind::Member => "multi",
                    _ => resource,
                });
                let acquiring = recording.acquire(process, &[name], 1, true);
                let acquired = match kind {
                    Kind::Lock | Kind::Member => client.lock(name).try_lock(wait, lease).await,
                    Kind::Fenced => client
                        .fenced_lock(name)
                        .try_lock(wait, lease)
                        .await
                        .map(|guard| guard.map(lockkit::LockGuard::from)),
                    Kind::Fair => client.fair_lock(name).try_lock(wait, lease).await,
                    _ => client.spin_lock(name).try_lock(wait, lease).await,
                };
                let hold =
                    acquire_outcome(recording, &acquiring, process, &[name], &acquired, |g| {
                        g.fencing_token()
                    });
                let guard = match acquired {
                    Ok(Some(guard)) => guard,
                    Ok(None) => {
                        soak.timed_out.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(err) => {
                        soak.error("acquire", &err);
                        continue;
                    }
                };
                soak.acquired(kind);
                let token = guard.fencing_token();
                section(&soak, resource, &id, token, 1, true, || guard.is_lost()).await;
                let hold = hold.expect("a granted acquire has a hold");
                if drop_it {
                    dropped(recording, &hold, guard.is_lost());
                    drop(guard);
                } else {
                    let lost = guard.is_lost();
                    finish(&soak, "unlock", recording, &hold, lost, guard.unlock()).await;
                }
            }
            Kind::ReadWrite => {
                let name = soak.name("rw");
                let rw = client.read_write_lock(name);
                let writer = rng.one_in(3);
                let recording = soak.history("rw");
                let weight = if writer { CLIENTS as u64 } else { 1 };
                let acquiring = recording.acquire(process, &[name], weight, true);
                let acquired = recording
                    .joining(&acquiring, async {
                        if writer {
                            rw.try_write_lock(wait, lease).await
                        } else {
                            rw.try_read_lock(wait, lease).await
                        }
                    })
                    .await;
                let hold =
                    acquire_outcome(recording, &acquiring, process, &[name], &acquired, |_| None);
                let guard = match acquired {
                    Ok(Some(guard)) => guard,
                    Ok(None) => {
                        soak.timed_out.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    // Every acquire here is a plain one, an owner of its own: a write request
                    // is never an upgrade, even when this task still has a read hold whose
                    // release failed (it waits instead). So `Refused` would be an error.
                    Err(err) => {
                        soak.error("rw acquire", &err);
                        continue;
                    }
                };
                soak.acquired(kind);
                // A writer takes the whole capacity; readers one share each.
                let weight = if writer { CLIENTS as u64 } else { 1 };
                section(&soak, "rw", &id, None, weight, writer, || guard.is_lost()).await;
                // Only a write hold is dropped: a dropped read hold is released in the
                // background, and this task's next write lock would meanwhile be refused as an
                // upgrade.
                let hold = hold.expect("a granted acquire has a hold");
                let lost = guard.is_lost();
                if drop_it && writer {
                    dropped(recording, &hold, lost);
                    drop(guard);
                } else {
                    finish(&soak, "rw unlock", recording, &hold, lost, guard.unlock()).await;
                }
            }
            Kind::Multi => {
                let multi = client.multi_lock([
                    client.lock(soak.name("member-a")),
                    client.lock(soak.name("member-b")),
                ]);
                let members = [soak.name("member-a"), soak.name("member-b")];
                let recording = soak.history("multi");
                // Not a waiter for the stall measure: it needs every member free at once, which
                // a per-object replay cannot judge.
                let acquiring = recording.acquire(process, &members, 1, false);
                let invoked = now();
                let acquired = multi.try_lock(wait, lease).await;
                locked(&soak.multi_in_flight).push((invoked, now()));
                let hold =
                    acquire_outcome(recording, &acquiring, process, &members, &acquired, |_| {
                        None
                    });
                let guard = match acquired {
                    Ok(Some(guard)) => guard,
                    Ok(None) => {
                        soak.timed_out.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(err) => {
                        soak.error("multi acquire", &err);
                        continue;
                    }
                };
                soak.acquired(kind);
                section(&soak, "member-a", &id, None, 1, true, || guard.is_lost()).await;
                section(&soak, "member-b", &id, None, 1, true, || guard.is_lost()).await;
                let hold = hold.expect("a granted acquire has a hold");
                let lost = guard.is_lost();
                if drop_it {
                    dropped(recording, &hold, lost);
                    drop(guard);
                } else {
                    finish(
                        &soak,
                        "multi unlock",
                        recording,
                        &hold,
                        lost,
                        guard.unlock(),
                    )
                    .await;
                }
            }
            Kind::Semaphore => {
                let permits = rng.range(1, 3);
                let name = soak.name("semaphore");
                let semaphore = client.semaphore(name);
                let recording = soak.history("semaphore");
                let acquiring = recording.acquire(process, &[name], permits, true);
                let acquired = recording
                    .joining(&acquiring, semaphore.try_acquire(permits, wait, lease))
                    .await;
                let hold =
                    acquire_outcome(recording, &acquiring, process, &[name], &acquired, |_| None);
                let permit = match acquired {
                    Ok(Some(permit)) => permit,
                    Ok(None) => {
                        soak.timed_out.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    Err(err) => {
                        soak.error("semaphore acquire", &err);
                        continue;
                    }
                };
                soak.acquired(kind);
                section(&soak, "semaphore", &id, None, permits, false, || {
                    permit.is_lost()
                })
                .await;
                let hold = hold.expect("a granted acquire has a hold");
                let lost = permit.is_lost();
                if drop_it {
                    dropped(recording, &hold, lost);
                    drop(permit);
                } else {
                    finish(
                        &soak,
                        "semaphore release",
                        recording,
                        &hold,
                        lost,
                        permit.release(),
                    )
                    .await;
                }
            }
        }
    }
}

/// Latch rounds: count 3, two waiters in two clients, three count-downs from three other clients,
/// one after the other. After each count-down the count must have gone down by exactly one (a
/// count-down re-sent after a dropped reply must not count twice, which would open the latch
/// early); at zero every waiter must see the latch open, and one more count-down must be refused.
/// Returns (rounds, violations).
async fn latch_rounds(soak: Arc<Soak>, clients: Vec<Client>) -> (usize, usize) {
    let (mut rounds, mut violations) = (0, 0);
    let violation = |what: &str| {
        *locked(&soak.errors)
            .entry(format!("latch violation: {what}"))
            .or_insert(0) += 1;
    };
    while Instant::now() < soak.end {
        rounds += 1;
        let name = unique("soak-latch");
        let observer = clients[0].count_down_latch(&name);
        match observer.try_set_count(3).await {
            Ok(true) => {}
            Ok(false) => {
                violation("a fresh latch could not be set");
                violations += 1;
                continue;
            }
            Err(err) => {
                soak.error("latch set", &err);
                continue;
            }
        }
        let waiters: Vec<_> = clients[1..3]
            .iter()
            .map(|client| {
                let latch = client.count_down_latch(&name);
                tokio::spawn(async move { latch.wait(Duration::from_secs(30)).await })
            })
            .collect();
        let mut failed = false;
        for (left, client) in (0..3u64).rev().zip(&clients[3..6]) {
            if let Err(err) = client.count_down_latch(&name).count_down().await {
                soak.error("latch count_down", &err);
                failed = true;
                break;
            }
            match observer.count().await {
                Ok(count) if count == left => {}
                Ok(count) => {
                    violation(&format!(
                        "count {count} after a count-down, expected {left}"
                    ));
                    violations += 1;
                    failed = true;
                    break;
                }
                Err(err) => {
                    soak.error("latch count", &err);
                    failed = true;
                    break;
                }
            }
        }
        for waiter in waiters {
            if failed {
                waiter.abort();
                continue;
            }
            match waiter.await {
                Ok(Ok(true)) => {}
                Ok(Ok(false)) => {
                    violation("the latch opened, yet a waiter timed out");
                    violations += 1;
                }
                Ok(Err(err)) => soak.error("latch wait", &err),
                Err(err) => panic!("latch waiter task: {err}"),
            }
        }
        if !failed {
            match observer.count_down().await {
                Err(Error::Refused { .. }) => {}
                Ok(_) => {
                    violation("counted down below zero");
                    violations += 1;
                }
                Err(err) => soak.error("latch extra count_down", &err),
            }
        }
    }
    (rounds, violations)
}

/// How long after a fault ended delays are still the fault's doing, for the stall measure: the
/// client's 5 s command timeout (a command sent into a paused or blocked connection waits that
/// long) covers reconnects and leases lapsing too. A dropped reply's fault lasts until it
/// triggers, unknown to the chaos task: twice that.
const FAULT_AFTERMATH_NS: u64 = 5_000_000_000;

/// Injects a random fault into a random proxy every 0.2–1.2 s until the end. Returns the faults
/// injected and the windows in which a fault (or its aftermath) was active.
async fn chaos(
    soak: Arc<Soak>,
    proxies: Vec<Arc<FaultProxy>>,
) -> (BTreeMap<&'static str, usize>, Vec<(u64, u64)>) {
    let mut rng = Rng::new(now());
    let mut faults = BTreeMap::new();
    let mut windows = Vec::new();
    let patterns: Vec<String> = soak.names.values().cloned().collect();
    loop {
        tokio::time::sleep(rng.millis(200, 1200)).await;
        if Instant::now() >= soak.end {
            break;
        }
        let proxy = &proxies[rng.range(0, proxies.len() as u64) as usize];
        let started = now();
        let fault = match rng.range(0, 5) {
            0 => {
                proxy.cut();
                "cut"
            }
            1 => {
                // A partition well inside the lease.
                proxy.block();
                tokio::time::sleep(rng.millis(100, 600)).await;
                proxy.unblock();
                "partition"
            }
            2 => {
                proxy.set_delay(rng.millis(2, 20));
                proxy.set_jitter(rng.millis(0, 20));
                tokio::time::sleep(rng.millis(300, 2000)).await;
                proxy.set_delay(Duration::ZERO);
                proxy.set_jitter(Duration::ZERO);
                "latency"
            }
            3 => {
                proxy.pause();
                tokio::time::sleep(rng.millis(50, 500)).await;
                proxy.resume();
                "pause"
            }
            _ => {
                let pattern = &patterns[rng.range(0, patterns.len() as u64) as usize];
                proxy.cut_after_request_containing(pattern.clone());
                "reply-dropped"
            }
        };
        let aftermath = if fault == "reply-dropped" {
            2 * FAULT_AFTERMATH_NS
        } else {
            FAULT_AFTERMATH_NS
        };
        windows.push((started, now() + aftermath));
        *faults.entry(fault).or_insert(0) += 1;
    }
    (faults, windows)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_every_primitive_under_random_faults_without_a_violation() {
    let duration = soak_duration();
    let lock_server = spawned().await;
    let store_server = spawned().await;

    let mut names = BTreeMap::new();
    let mut resources = BTreeMap::new();
    for resource in [
        "lock",
        "fenced",
        "fair",
        "rw",
        "spin",
        "member-a",
        "member-b",
        "semaphore",
    ] {
        let name = unique(&format!("soak-{resource}"));
        let capacity = match resource {
            "rw" => CLIENTS as u64,
            "semaphore" => SEMAPHORE_PERMITS,
            _ => 1,
        };
        resources.insert(
            resource,
            Resource {
                store: Store::connect(&store_server.url(), &name).await,
                recorder: Recorder::new(),
                capacity,
            },
        );
        names.insert(resource, name);
    }

    let mut proxies = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let proxy = Arc::new(FaultProxy::start(lock_server.addr()).await.unwrap());
        clients.push(client_with(&proxy.url(), WATCHDOG).await);
        proxies.push(proxy);
    }
    assert!(clients[0]
        .semaphore(&names["semaphore"])
        .try_set_permits(SEMAPHORE_PERMITS)
        .await
        .unwrap());

    let started = now();
    let soak = Arc::new(Soak {
        names,
        resources,
        histories: PRIMITIVES
            .iter()
            .map(|(primitive, _)| (*primitive, history::Recording::new()))
            .collect(),
        multi_in_flight: Mutex::new(Vec::new()),
        end: Instant::now() + duration,
        errors: Mutex::new(BTreeMap::new()),
        acquired: Mutex::new(BTreeMap::new()),
        timed_out: AtomicUsize::new(0),
        not_held: AtomicUsize::new(0),
    });
    let mut workers = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        for kind in KINDS {
            workers.push(tokio::spawn(worker(
                Arc::clone(&soak),
                client.clone(),
                kind,
                i,
            )));
        }
    }
    let latches = tokio::spawn(latch_rounds(Arc::clone(&soak), clients.clone()));
    let chaos = tokio::spawn(chaos(Arc::clone(&soak), proxies.clone()));

    let limit = duration + Duration::from_secs(120);
    let (faults, fault_windows) = within(limit, "the chaos task", chaos).await.unwrap();
    for proxy in &proxies {
        proxy.unblock();
        proxy.resume();
    }
    for task in workers {
        within(limit, "a soak worker", task).await.unwrap();
    }
    let (latch_rounds, latch_violations) =
        within(limit, "the latch rounds", latches).await.unwrap();
    let elapsed_ms = (now() - started) as f64 / 1e6;

    let mut verdict = Verdict::default();
    let mut record = Record::new(
        "soak",
        "soak_every_primitive_under_random_faults_without_a_violation",
    );
    for (resource, res) in &soak.resources {
        let sections = res.recorder.sections();
        let one = check(&sections, &res.store.history().await, res.capacity);
        record = record.num(&format!("violations_{resource}"), one.violations() as f64);
        verdict.merge(one);
    }
    // Histories: linearizable per object, and no stall beyond the bound outside the faults.
    let mut history_failures = String::new();
    let mut history_figures = Vec::new();
    for (primitive, model) in PRIMITIVES {
        let bound = if primitive == "spin" {
            history::SPIN_BOUND_NS
        } else {
            history::BOUND_NS
        };
        let mut excluded = fault_windows.clone();
        if primitive == "multi" {
            excluded.extend(locked(&soak.multi_in_flight).iter().copied());
        }
        let figures = history::examine(soak.history(primitive), |_| model, bound, &excluded);
        record = history::to_record(record, primitive, &figures);
        if figures.violations + figures.stalls > 0 {
            history_failures.push_str(&figures.explain);
        }
        history_figures.push((primitive, figures));
    }
    let acquired = locked(&soak.acquired).clone();
    for (kind, count) in &acquired {
        record = record.num(&format!("acquired_{kind:?}").to_lowercase(), *count as f64);
    }
    for (fault, count) in &faults {
        record = record.num(&format!("fault_{fault}"), *count as f64);
    }
    let errors = locked(&soak.errors).clone();
    let error_count: usize = errors.values().sum();
    let history_violations: usize = history_figures
        .iter()
        .map(|(_, f)| f.violations + f.stalls)
        .sum();
    let violations = verdict.violations() + latch_violations + history_violations;
    record = verdict
        .to_record(record)
        .num("violations", violations as f64)
        .num("latch_rounds", latch_rounds as f64)
        .num("latch_violations", latch_violations as f64)
        .num("operations", (verdict.sections + latch_rounds) as f64)
        .num(
            "timed_out_waits",
            soak.timed_out.load(Ordering::Relaxed) as f64,
        )
        .num(
            "unlock_not_held",
            soak.not_held.load(Ordering::Relaxed) as f64,
        )
        .num("errors", error_count as f64)
        .num("faults", faults.values().sum::<usize>() as f64)
        .num("duration_ms", elapsed_ms)
        .num("clients", CLIENTS as f64);
    if !errors.is_empty() {
        record = record.text("error_kinds", &format!("{errors:?}"));
    }
    record.save();

    for (primitive, figures) in &history_figures {
        history::report(primitive, figures);
    }
    assert!(history_failures.is_empty(), "{history_failures}");
    assert_eq!(verdict.violations(), 0, "{verdict:?}");
    assert_eq!(latch_violations, 0);
    for kind in KINDS {
        assert!(
            acquired.get(&kind).copied().unwrap_or(0) > 0,
            "{kind:?} never acquired: {acquired:?}"
        );
    }
    assert!(latch_rounds > 0);
}
