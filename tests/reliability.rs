//! The fault-injection suite: workers run critical sections on a resource the lock does not
//! protect by itself (a counter and a history in a separate Redis), faults are injected into the
//! lock's Redis and the network to it, and the checker (`lockkit_suite::checker`) looks for
//! overlapping sections, lost updates and stale fenced writes. Every test but the broken-lock
//! control also records its clients' lock operations as a history ([`Observed`], `tests/history`)
//! and checks it for linearizability and for stalls outside the fault's windows. Each test
//! appends its counts to `target/reliability/results.jsonl`, from which
//! `scripts/reliability-report` writes the tables of `docs/reliability.md`.
//!
//! Durations (recovery times, signal lead times) are recorded, never asserted against a number;
//! what is asserted is what must hold: no violation, and orderings on the one clock
//! (`checker::now`, `CLOCK_MONOTONIC`).

use std::collections::HashMap;
use std::future::Future;
use std::process::Stdio;
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface, LuaInterface};
use lockkit::{Error, LockGuard};
use lockkit_model::election::{ElectionOp, ElectionRet, LeadershipSpec};
use lockkit_model::latch::{LatchOp, LatchRet, LatchSpec};
use lockkit_suite::checker::{
    check, critical_section, millis_between, now, KeyEvents, Outcome, OverlapKind, Record,
    Recorder, Section, Store, Verdict,
};
use lockkit_suite::linearizability::History;
use lockkit_suite::{client, client_with, lock_key, raw, spawned, unique, until_waiting, within};
use lockkit_testkit::FaultProxy;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

mod history;

const HANG: Duration = Duration::from_secs(60);

// === Worker processes ===

/// A `lockkit-test-worker` process, driven line by line.
struct Worker {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn spawn(
        lock_url: &str,
        store_url: &str,
        resource: &str,
        name: &str,
        kind: &str,
        watchdog_ms: u64,
        lease_ms: Option<u64>,
    ) -> Worker {
        let mut command = Command::new(env!("CARGO_BIN_EXE_lockkit-test-worker"));
        command
            .args([lock_url, store_url, resource, name, kind])
            .arg(watchdog_ms.to_string());
        if let Some(lease) = lease_ms {
            command.arg(lease.to_string());
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        Worker {
            child,
            lines: BufReader::new(stdout).lines(),
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id().unwrap()).unwrap())
    }

    /// The fields of the next line, which must start with `word`.
    async fn expect(&mut self, word: &str) -> Vec<String> {
        let line = within(HANG, word, self.lines.next_line())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("worker exited before {word}"));
        let fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        assert_eq!(fields.first().map(String::as_str), Some(word), "{line}");
        fields
    }

    async fn go(&mut self) {
        let stdin = self.child.stdin.as_mut().unwrap();
        stdin.write_all(b"GO\n").await.unwrap();
        stdin.flush().await.unwrap();
    }

    fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).unwrap();
    }
}

fn field<T: std::str::FromStr>(fields: &[String], i: usize) -> T {
    fields[i]
        .parse()
        .unwrap_or_else(|_| panic!("field {i} of {fields:?}"))
}

fn token_field(fields: &[String], i: usize) -> Option<u64> {
    fields[i].parse().ok()
}

/// The lock's remaining TTL in ms, read directly from the server, and when the command was sent.
async fn pttl(url: &str, key: &str) -> (u64, i64) {
    let redis = raw(url).await;
    let sent = now();
    let ttl: i64 = redis.pttl(key).await.unwrap();
    (sent, ttl)
}

fn name_of_test() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unknown")
        .rsplit("::")
        .next()
        .unwrap_or("unknown")
        .to_owned()
}

// === Histories (`tests/history`) ===

/// The primitives whose histories this suite checks: every one in the contention run, the lock
/// and the fenced lock in the fault tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Primitive {
    Lock,
    Fenced,
    Fair,
    Spin,
    Semaphore,
    /// `PermitExpirableSemaphore`: one permit per hold.
    Permits,
    ReadWrite,
}

impl Primitive {
    fn id(self) -> &'static str {
        match self {
            Primitive::Lock => "lock",
            Primitive::Fenced => "fenced",
            Primitive::Fair => "fair",
            Primitive::Spin => "spin",
            Primitive::Semaphore => "semaphore",
            Primitive::Permits => "permit",
            Primitive::ReadWrite => "rw",
        }
    }

    fn capacity(self) -> u64 {
        match self {
            Primitive::Semaphore | Primitive::Permits => CONTENTION_PERMITS,
            Primitive::ReadWrite => CONTENTION_CLIENTS * 2,
            _ => 1,
        }
    }

    /// The reference model that judges its histories.
    fn model(self) -> history::Model {
        match self {
            Primitive::Semaphore | Primitive::Permits => history::Model::Semaphore {
                permits: self.capacity(),
            },
            Primitive::ReadWrite => history::Model::ReadWrite {
                capacity: self.capacity(),
            },
            Primitive::Spin => history::Model::Spin,
            _ => history::Model::Lock,
        }
    }

    /// The stall bound: the spin lock polls by design.
    fn stall_bound_ns(self) -> u64 {
        if self == Primitive::Spin {
            history::SPIN_BOUND_NS
        } else {
            history::BOUND_NS
        }
    }
}

/// Checks one primitive's history, with stalls inside `excluded` (fault windows) left out: the
/// one call of `history::examine` in this file.
fn examine(
    recording: &history::Recording,
    kind: Primitive,
    excluded: &[(u64, u64)],
) -> history::Figures {
    history::examine(recording, |_| kind.model(), kind.stall_bound_ns(), excluded)
}

/// A release's answer for the history: released, not held (the hold was gone), unknown.
fn released(result: Result<(), Error>) -> Result<bool, Error> {
    match result {
        Ok(()) => Ok(true),
        Err(Error::NotHeld { .. }) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The history of one primitive's lock operations in a fault test: the test's clients acquire
/// and unlock through it, and each invocation and answer is recorded on the one clock.
#[derive(Clone)]
struct Observed {
    kind: Primitive,
    recording: history::Recording,
}

/// A guard with its hold in the history.
struct Held {
    guard: LockGuard,
    hold: history::Hold,
}

impl std::ops::Deref for Held {
    type Target = LockGuard;

    fn deref(&self) -> &LockGuard {
        &self.guard
    }
}

impl Observed {
    fn new(kind: Primitive) -> Observed {
        Observed {
            kind,
            recording: history::Recording::new(),
        }
    }

    /// An acquire that waits without bound (`lock()`, `lock_with_lease`) by `process` on `name`,
    /// recorded as [`try_lock`](Observed::try_lock) records one that waits.
    fn lock<'a>(
        &'a self,
        process: u64,
        name: &'a str,
        acquire: impl Future<Output = Result<LockGuard, Error>> + 'a,
    ) -> impl Future<Output = Result<Held, Error>> + 'a {
        let acquire = Box::pin(acquire);
        let held = self.try_lock(process, name, true, async { acquire.await.map(Some) });
        async {
            Ok(held
                .await?
                .expect("an acquire without a bound returns a guard"))
        }
    }

    /// An acquire (`waits`: with a wait longer than zero), recorded: invoked when first polled,
    /// answered granted (with the guard's fencing token) or timed out when it returns; an error
    /// leaves it pending with no known result. (`acquire` is boxed: the acquire futures are large
    /// in a debug build, and nested in a test's future they overflowed the test thread's stack.)
    fn try_lock<'a>(
        &'a self,
        process: u64,
        name: &'a str,
        waits: bool,
        acquire: impl Future<Output = Result<Option<LockGuard>, Error>> + 'a,
    ) -> impl Future<Output = Result<Option<Held>, Error>> + 'a {
        let acquiring = self.recording.acquire(process, &[name], 1, waits);
        self.answer(process, name, acquiring, acquire)
    }

    /// A re-entry inside `held`'s scope (`acquire` runs in it), recorded as an acquire by the
    /// same owner that creates a hold of its own.
    fn reenter<'a>(
        &'a self,
        held: &'a Held,
        acquire: impl Future<Output = Result<LockGuard, Error>> + 'a,
    ) -> impl Future<Output = Result<Held, Error>> + 'a {
        let acquiring = self.recording.reenter(&held.hold, true);
        let name = held.guard.name();
        let answered = self.answer(held.hold.process(), name, acquiring, async {
            held.guard.scope(acquire).await.map(Some)
        });
        async {
            Ok(answered
                .await?
                .expect("an acquire without a bound returns a guard"))
        }
    }

    /// Records how the acquire `acquiring` ended.
    fn answer<'a>(
        &'a self,
        process: u64,
        name: &'a str,
        acquiring: history::Acquiring,
        acquire: impl Future<Output = Result<Option<LockGuard>, Error>> + 'a,
    ) -> impl Future<Output = Result<Option<Held>, Error>> + 'a {
        let acquire = Box::pin(acquire);
        async move {
            match self.recording.joining(&acquiring, acquire).await {
                Ok(Some(guard)) => {
                    let token = guard.fencing_token();
                    let hold = self.recording.granted(&acquiring, process, &[name], token);
                    Ok(Some(Held { guard, hold }))
                }
                Ok(None) => {
                    self.recording.timed_out(&acquiring);
                    Ok(None)
                }
                Err(err) => {
                    self.recording.failed(&acquiring);
                    Err(err)
                }
            }
        }
    }

    /// `try_lock` of a plain lock without a wait ("is it free?"), recorded.
    async fn try_now(&self, process: u64, lock: &lockkit::Lock) -> Result<Option<Held>, Error> {
        let acquire = lock.try_lock(Duration::ZERO, None);
        self.try_lock(process, lock.name(), false, acquire).await
    }

    /// The acquire a worker process reported in its `HELD` line (invoked and granted at the times
    /// it read on the same clock), by `process` on `name`.
    fn held_by_worker(&self, process: u64, name: &str, held: &[String]) -> history::Hold {
        let acquiring = self
            .recording
            .acquire_at(process, &[name], 1, true, field(held, 3));
        self.recording.granted_at(
            &acquiring,
            process,
            &[name],
            token_field(held, 2),
            field(held, 1),
        )
    }

    /// The guard reported itself lost: its hold may have lapsed at any time.
    fn lost(&self, held: &Held) {
        self.recording.lost(&held.hold);
    }

    /// `unlock()`, recorded (a guard that reports itself lost by then is recorded lost first).
    async fn unlock(&self, held: Held) -> Result<(), Error> {
        let Held { guard, hold } = held;
        if guard.is_lost() {
            self.recording.lost(&hold);
        }
        let mut answer = None;
        let unlocking = Box::pin(guard.unlock());
        let _ = self
            .recording
            .release(&hold, async {
                let result = unlocking.await;
                let seen = match &result {
                    Ok(()) => Ok(true),
                    Err(Error::NotHeld { .. }) => Ok(false),
                    Err(_) => Err(()),
                };
                answer = Some(result);
                seen
            })
            .await;
        answer.expect("the release ran")
    }

    /// Checks the history, leaving out stalls inside `excluded` (the fault's windows, extended by
    /// a lease where the contract lets a waiter wait one out after the fault), prints the
    /// figures and adds them to `record`. Save the record, then [`assert_clean`].
    fn examine(&self, record: Record, excluded: &[(u64, u64)]) -> (Record, history::Figures) {
        let figures = examine(&self.recording, self.kind, excluded);
        history::report(self.kind.id(), &figures);
        (
            history::to_record(record, self.kind.id(), &figures),
            figures,
        )
    }
}

/// A history's violations for a record's `violations`, as the soak counts them: violations of
/// the model and stalls.
fn history_violations(figures: &history::Figures) -> usize {
    figures.violations + figures.stalls
}

/// Fails the test on a violation, a stall, or a history the check could not decide within its
/// budget (the fault tests' histories are small: each must be decided).
fn assert_clean(figures: &history::Figures) {
    assert_eq!(
        history_violations(figures) + figures.unknown,
        0,
        "{} violations, {} stalls, {} undecided:\n{}",
        figures.violations,
        figures.stalls,
        figures.unknown,
        figures.explain
    );
}

// === The checker can fail ===

/// A semaphore history written by hand on the suite's clock (ms from an origin far from any
/// scheduling lag): 2 permits; a holder keeps 1 from 0 to 400 ms; `early` (1 permit) is invoked
/// at 5 ms and joins the line at `early_joined`; `late` (2 permits) is invoked at 10 ms and joins
/// at 12 ms; at 400 ms the holder releases, and both are served: `late` first (it was ahead),
/// then `early` at 401 ms. One permit was free the whole time, which `early` alone would fit.
fn fifo_history(early_joined: Option<u64>) -> history::Figures {
    const MS: u64 = 1_000_000;
    let at = |ms: u64| 1_000 * MS + ms * MS;
    let recording = history::Recording::new();
    let object = "fifo";
    let holder = recording.acquire_at(0, &[object], 1, false, at(0));
    let held = recording.granted_at(&holder, 0, &[object], None, at(0));
    let early = recording.acquire_at(1, &[object], 1, true, at(5));
    if let Some(ms) = early_joined {
        recording.joined_at(&early, at(ms));
    }
    let late = recording.acquire_at(2, &[object], 2, true, at(10));
    recording.joined_at(&late, at(12));
    let release =
        recording
            .history
            .invoke_at(0, object, history::Op::Release { hold: held.id() }, at(400));
    recording
        .history
        .respond_at(release, history::Ret::Released, at(400));
    let late_held = recording.granted_at(&late, 2, &[object], None, at(400));
    let release = recording.history.invoke_at(
        2,
        object,
        history::Op::Release {
            hold: late_held.id(),
        },
        at(400),
    );
    recording
        .history
        .respond_at(release, history::Ret::Released, at(401));
    recording.granted_at(&early, 1, &[object], None, at(401));
    history::examine(
        &recording,
        |_| history::Model::Semaphore { permits: 2 },
        history::BOUND_NS,
        &[],
    )
}

/// The FIFO stall measure orders a semaphore's line by when calls joined it, not by when they
/// were invoked: a call invoked first whose first try reached Redis after a later call's (a
/// `NOSCRIPT` reload, a slow scheduler) is behind it, and waits for it without stalling.
#[test]
fn a_waiter_invoked_first_but_joined_second_waits_for_the_head_without_stalling() {
    let figures = fifo_history(Some(20));
    assert_eq!(figures.stalls, 0, "{}", figures.explain);
    // Not known when it joined: taken as its return, which excuses as much.
    let figures = fifo_history(None);
    assert_eq!(figures.stalls, 0, "{}", figures.explain);
}

/// ... and the head of the line is never excused by a waiter behind it: the call that joined
/// first, left waiting while the one permit it needs was free, stalled.
#[test]
fn the_head_of_a_line_left_waiting_while_it_fits_is_a_stall() {
    let figures = fifo_history(Some(6));
    assert_eq!(figures.stalls, 1, "{}", figures.explain);
    assert!(figures.explain.contains("p1 "), "{}", figures.explain);
}

/// A deliberately broken lock: `SET NX PX` with a lease shorter than the critical section and a
/// release that deletes the key whoever holds it. The checker must catch it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checker_catches_a_deliberately_broken_lock() {
    let lock_server = spawned().await;
    let store_server = spawned().await;
    let resource = unique("broken");
    let store = Store::connect(&store_server.url(), &resource).await;
    let key = format!("broken:{{{resource}}}");
    let lease = Duration::from_millis(40);
    let recorder = Recorder::new();
    let mut tasks = Vec::new();
    for worker in 0..3 {
        let (url, key, store, recorder) = (
            lock_server.url(),
            key.clone(),
            store.clone(),
            recorder.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let redis = raw(&url).await;
            for round in 0..4 {
                let id = format!("w{worker}#{round}");
                loop {
                    let set: Option<String> = redis
                        .set(
                            &key,
                            id.as_str(),
                            Some(fred::types::Expiration::PX(lease.as_millis() as i64)),
                            Some(fred::types::SetOptions::NX),
                            false,
                        )
                        .await
                        .unwrap();
                    if set.is_some() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let acquired = now();
                // The critical section outlives the lease, and nothing tells the holder.
                let (_, released) = critical_section(&store, &id, None, lease * 3, || false)
                    .await
                    .unwrap();
                recorder.record(Section::new(id, acquired, released));
                let _: i64 = redis.del(&key).await.unwrap(); // no ownership check
            }
        }));
    }
    for task in tasks {
        within(HANG, "broken-lock workers", task).await.unwrap();
    }
    let verdict = check(&recorder.sections(), &store.history().await, 1);
    verdict
        .to_record(Record::new("broken-lock", &name_of_test()))
        .text(
            "lock",
            "SET NX PX 40 ms, critical section 120 ms, DEL release",
        )
        .save();
    assert!(
        verdict.overlaps_of(OverlapKind::Silent) > 0,
        "the checker missed the overlaps: {verdict:?}"
    );
    assert!(verdict.lost_updates > 0, "{verdict:?}");
    assert!(verdict.violations() > 0);
}

// === Holder killed ===

/// Kills a holder process inside its critical section, `rounds` times; another process (this
/// one) must get the lock only after the dead holder's lease ended on the server. History: the
/// killed worker's acquire (p1), a hold that only its lease ends (as a lost one: it may lapse at
/// any time); the survivor's (p2) try-lock without a wait, its acquire and its unlock. Fault
/// window: from the kill to a lease after it (the last renewal or the fixed lease's start came
/// before the kill), so a survivor left waiting once the lease certainly ended is a stall.
async fn kill_a_holder(fault: &str, watchdog_ms: u64, lease_ms: Option<u64>) {
    let lock_server = spawned().await;
    let store_server = spawned().await;
    let resource = unique("kill");
    let store = Store::connect(&store_server.url(), &resource).await;
    let survivor = client(&lock_server.url()).await;
    let recorder = Recorder::new();
    let observed = Observed::new(Primitive::Lock);
    let lease = Duration::from_millis(lease_ms.unwrap_or(watchdog_ms));
    let mut windows = Vec::new();
    let mut recovery = Vec::new();
    let mut lease_left = Vec::new();
    let rounds = 3;
    for round in 0..rounds {
        let name = unique("killed-holder");
        let mut worker = Worker::spawn(
            &lock_server.url(),
            &store_server.url(),
            &resource,
            &name,
            "lock",
            watchdog_ms,
            lease_ms,
        );
        let held = worker.expect("HELD").await;
        let hold = observed.held_by_worker(1, &name, &held);
        worker.expect("READ").await; // inside its critical section
        let killed_at = now();
        worker.signal(Signal::SIGKILL);
        worker.child.wait().await.unwrap();
        let dead_at = now();
        // Nobody will release it: its lease ends it.
        observed.recording.lost(&hold);
        windows.push((killed_at, killed_at + lease.as_nanos() as u64));
        recorder.record(Section::new(
            format!("killed#{round}"),
            field(&held, 1),
            dead_at,
        ));

        // The dead holder's lease still protects the lock...
        let (sent, ttl) = pttl(&lock_server.url(), &lock_key(&name)).await;
        assert!(ttl > 0, "the killed holder's lock has a lease left: {ttl}");
        let lock = survivor.lock(&name);
        assert!(observed.try_now(2, &lock).await.unwrap().is_none());
        // ... until it ends, not before.
        let guard = within(
            HANG,
            "acquire after the kill",
            observed.lock(2, &name, lock.lock()),
        )
        .await
        .unwrap();
        let entered = now();
        let lease_end = sent + u64::try_from(ttl).unwrap() * 1_000_000;
        assert!(
            entered > lease_end,
            "got in {:.3} ms before the dead holder's lease ended",
            millis_between(entered, lease_end)
        );
        let id = format!("survivor#{round}");
        let (outcome, released) =
            critical_section(&store, &id, None, Duration::ZERO, || guard.is_lost())
                .await
                .unwrap();
        assert_eq!(outcome, Outcome::Wrote { accepted: true });
        recorder.record(Section::new(id, entered, released));
        observed.unlock(guard).await.unwrap();
        recovery.push(millis_between(killed_at, entered));
        lease_left.push(ttl as f64);
    }
    let verdict = check(&recorder.sections(), &store.history().await, 1);
    let (record, figures) = observed.examine(Record::new(fault, &name_of_test()), &windows);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations() + history_violations(&figures)) as f64,
        )
        .num("runs", f64::from(rounds))
        .nums("recovery_ms", &recovery)
        .nums("lease_left_at_kill_ms", &lease_left)
        .num("lease_ms", lease.as_millis() as f64)
        .save();
    assert_eq!(verdict.violations(), 0, "{verdict:?}");
    assert_clean(&figures);
}

#[tokio::test]
async fn a_killed_watchdog_holder_is_replaced_after_its_lease_not_before() {
    kill_a_holder("sigkill-watchdog", 600, None).await;
}

#[tokio::test]
async fn a_killed_fixed_lease_holder_is_replaced_after_its_lease_not_before() {
    kill_a_holder("sigkill-fixed-lease", 30_000, Some(600)).await;
}

// === Holder paused ===

/// The paused holder's watchdog lease.
const PAUSED_LEASE: Duration = Duration::from_millis(500);

struct Paused {
    verdict: Verdict,
    late_write_accepted: bool,
    lost_after_resume: bool,
    unlock: String,
    worker_token: Option<u64>,
    other_token: Option<u64>,
    paused_ms: f64,
    /// From the pause to a lease after it (the paused holder's last renewal came before it): the
    /// other holder may wait that lease out.
    window: (u64, u64),
}

/// Pauses a holder process (`SIGSTOP`) between its read and its write, longer than its lease;
/// another holder gets in and writes; then the paused one resumes and makes its late write.
/// History (`observed`): the worker's acquire (p1), the other holder's acquire and unlock (p2),
/// the worker's lost signal and its unlock.
async fn pause_a_holder(kind: &str, observed: &Observed) -> Paused {
    let lock_server = spawned().await;
    let store_server = spawned().await;
    let resource = unique("pause");
    let store = Store::connect(&store_server.url(), &resource).await;
    let name = unique("paused-holder");
    let mut worker = Worker::spawn(
        &lock_server.url(),
        &store_server.url(),
        &resource,
        &name,
        kind,
        PAUSED_LEASE.as_millis() as u64,
        None,
    );
    let held = worker.expect("HELD").await;
    let hold = observed.held_by_worker(1, &name, &held);
    let read = worker.expect("READ").await;
    assert_eq!(read[2], "0", "not lost before the pause");
    worker.signal(Signal::SIGSTOP);
    let stopped_at = now();

    let other = client(&lock_server.url()).await;
    let acquire = async {
        match kind {
            "fenced" => other.fenced_lock(&name).lock().await.map(LockGuard::from),
            _ => other.lock(&name).lock().await,
        }
    };
    let guard = within(
        HANG,
        "acquire while the holder is paused",
        observed.lock(2, &name, acquire),
    )
    .await
    .unwrap();
    let entered = now();
    let (outcome, released) = critical_section(
        &store,
        "other",
        guard.fencing_token(),
        Duration::ZERO,
        || guard.is_lost(),
    )
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Wrote { accepted: true });
    let other_token = guard.fencing_token();
    observed.unlock(guard).await.unwrap();

    worker.go().await;
    worker.signal(Signal::SIGCONT);
    let resumed_at = now();
    // The worker's unlock, recorded from its resumption to its answer (`UNLOCKED`).
    let mut lines = None;
    let _ = observed
        .recording
        .release(&hold, async {
            let wrote = worker.expect("WROTE").await;
            let unlocked = worker.expect("UNLOCKED").await;
            let answer = match unlocked[1].as_str() {
                "ok" => Ok(true),
                "notheld" => Ok(false),
                _ => Err(()),
            };
            lines = Some((wrote, unlocked));
            answer
        })
        .await;
    let (wrote, unlocked) = lines.expect("the worker's lines");
    worker.child.wait().await.unwrap();

    let lost_after_resume = wrote[3] == "1";
    if lost_after_resume {
        observed.recording.lost(&hold);
    }
    let mut paused = Section::new("paused", field(&held, 1), field(&wrote, 2));
    paused.token = token_field(&held, 2);
    paused.lost = lost_after_resume.then(|| field(&wrote, 4));
    let mut other_section = Section::new("other", entered, released);
    other_section.token = other_token;
    let sections = [paused.clone(), other_section];
    let history: Vec<_> = store
        .history()
        .await
        .into_iter()
        .map(|mut write| {
            // The worker names its section after its pid.
            if write.section.starts_with("worker-") {
                write.section = "paused".to_owned();
            }
            write
        })
        .collect();
    Paused {
        verdict: check(&sections, &history, 1),
        late_write_accepted: wrote[1] == "1",
        lost_after_resume,
        unlock: unlocked[1].clone(),
        worker_token: paused.token,
        other_token,
        paused_ms: millis_between(stopped_at, resumed_at),
        window: (stopped_at, stopped_at + PAUSED_LEASE.as_nanos() as u64),
    }
}

/// Each pause test runs the fault this many times.
const PAUSES: u32 = 3;

#[tokio::test]
async fn a_paused_fenced_holder_is_lost_and_its_late_write_is_rejected() {
    let observed = Observed::new(Primitive::Fenced);
    let mut verdict = Verdict::default();
    let mut paused_ms = Vec::new();
    let mut windows = Vec::new();
    for _ in 0..PAUSES {
        let paused = pause_a_holder("fenced", &observed).await;
        assert!(paused.lost_after_resume, "the resumed guard reports lost");
        assert_eq!(paused.unlock, "notheld");
        assert!(paused.worker_token < paused.other_token);
        assert!(
            !paused.late_write_accepted,
            "the fencing check rejects the late write"
        );
        let one = paused.verdict;
        assert_eq!(one.overlaps_of(OverlapKind::Fenced), 1, "{one:?}");
        assert_eq!(one.violations(), 0, "{one:?}");
        verdict.merge(one);
        paused_ms.push(paused.paused_ms);
        windows.push(paused.window);
    }
    let record = Record::new("sigstop-fenced", &name_of_test());
    let (record, figures) = observed.examine(record, &windows);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations() + history_violations(&figures)) as f64,
        )
        .num("runs", f64::from(PAUSES))
        .nums("paused_ms", &paused_ms)
        .save();
    assert_clean(&figures);
}

/// The limit no lease lock removes: without fencing, the same pause overlaps and loses an update.
/// The checker must see it; the guard reports lost only after the fact. The clients' history is
/// still linearizable: a hold whose guard reported itself lost may have lapsed at any time, and
/// the lock's own answers (the other holder's grant, the paused holder's `NotHeld`) agree with
/// that. The overlap is the application's, outside the lock.
#[tokio::test]
async fn a_paused_unfenced_holder_overlaps_and_the_checker_sees_it() {
    let observed = Observed::new(Primitive::Lock);
    let mut verdict = Verdict::default();
    let mut paused_ms = Vec::new();
    let mut windows = Vec::new();
    for _ in 0..PAUSES {
        let paused = pause_a_holder("lock", &observed).await;
        assert!(paused.lost_after_resume);
        assert_eq!(paused.unlock, "notheld");
        assert!(
            paused.late_write_accepted,
            "nothing stops an unfenced late write"
        );
        let one = paused.verdict;
        assert_eq!(one.overlaps_of(OverlapKind::Late), 1, "{one:?}");
        assert_eq!(one.lost_updates, 1, "{one:?}");
        verdict.merge(one);
        paused_ms.push(paused.paused_ms);
        windows.push(paused.window);
    }
    let record = Record::new("sigstop-unfenced", &name_of_test());
    let (record, figures) = observed.examine(record, &windows);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations() + history_violations(&figures)) as f64,
        )
        .num("runs", f64::from(PAUSES))
        .nums("paused_ms", &paused_ms)
        .text("expected", "known limit: a pause without fencing")
        .save();
    assert_clean(&figures);
}

// === Connection cuts ===

/// History: the holder's acquire (p1), the other client's try-locks without a wait during and
/// after the cuts (p2), the holder's unlock. Fault windows: the cuts.
#[tokio::test]
async fn a_cut_shorter_than_the_lease_is_survived_and_renewals_resume() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let timeout = Duration::from_millis(1500);
    let holder = client_with(&proxy.url(), timeout).await;
    let other = client(&server.url()).await;
    let name = unique("short-cut");
    let observed = Observed::new(Primitive::Lock);
    let mut events = KeyEvents::subscribe(server.addr(), &lock_key(&name)).await;
    let guard = observed
        .lock(1, &name, holder.lock(&name).lock())
        .await
        .unwrap();
    let mut resumed = Vec::new();
    let mut windows = Vec::new();
    let rounds = 3;
    for _ in 0..rounds {
        let blocked = now();
        proxy.block();
        // The fault's length: a fifth of the lease.
        tokio::time::sleep(timeout / 5).await;
        let at_once = observed.try_now(2, &other.lock(&name)).await;
        assert!(at_once.unwrap().is_none());
        proxy.unblock();
        let unblocked = now();
        windows.push((blocked, unblocked));
        // A renewal after the cut: the key's TTL is set again.
        let renewed = loop {
            let (at, _) = within(HANG, "a renewal after the cut", events.until("expire")).await;
            if at > unblocked {
                break at;
            }
        };
        resumed.push(millis_between(unblocked, renewed));
        assert!(!guard.is_lost());
    }
    let at_once = observed.try_now(2, &other.lock(&name)).await;
    assert!(at_once.unwrap().is_none());
    observed.unlock(guard).await.unwrap();
    let record = Record::new("cut-shorter-than-lease", &name_of_test());
    let (record, figures) = observed.examine(record, &windows);
    record
        .num("runs", f64::from(rounds))
        .num("operations", f64::from(rounds))
        .num("violations", history_violations(&figures) as f64)
        .num("lost_signals", 0.0)
        .nums("recovery_ms", &resumed)
        .num("cut_ms", (timeout / 5).as_millis() as f64)
        .num("lease_ms", timeout.as_millis() as f64)
        .save();
    assert_clean(&figures);
}

/// History, per round: the holder's acquire (p1), the other client's acquire (p2) and its
/// unlock, the holder's lost signal and its unlock. Fault windows: from each cut to a lease after
/// its start (the holder's last renewal came before it; the other client may wait the lease out).
#[tokio::test]
async fn a_cut_longer_than_the_lease_marks_the_guard_lost_before_another_holder_gets_in() {
    let server = spawned().await;
    let store_server = spawned().await;
    let resource = unique("long-cut");
    let store = Store::connect(&store_server.url(), &resource).await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let timeout = Duration::from_millis(600);
    let holder = client_with(&proxy.url(), timeout).await;
    let other = client(&server.url()).await;
    let recorder = Recorder::new();
    let observed = Observed::new(Primitive::Lock);
    let mut windows = Vec::new();
    let mut lead = Vec::new();
    let mut recovery = Vec::new();
    let rounds = 3;
    for round in 0..rounds {
        let name = unique("long-cut");
        let guard = observed
            .lock(1, &name, holder.lock(&name).lock())
            .await
            .unwrap();
        let acquired = now();
        let lost = guard.lost();
        let lost_task = tokio::spawn(async move {
            lost.await;
            now()
        });
        proxy.block();
        let blocked = now();
        let next = within(
            HANG,
            "acquire after the lease",
            observed.lock(2, &name, other.lock(&name).lock()),
        )
        .await
        .unwrap();
        let entered = now();
        // The order that matters, on one clock: when the other holder is in, the first guard
        // already reports lost.
        assert!(
            guard.is_lost(),
            "another holder got in before the guard reported lost"
        );
        observed.lost(&guard);
        let lost_at = within(HANG, "lost() after the cut", lost_task)
            .await
            .unwrap();
        lead.push(millis_between(lost_at, entered));
        recovery.push(millis_between(blocked, entered));
        // The careful holder stopped at lost(); the other one writes.
        let mut first = Section::new(format!("cut#{round}"), acquired, lost_at);
        first.lost = Some(lost_at);
        recorder.record(first);
        let id = format!("next#{round}");
        let (outcome, released) =
            critical_section(&store, &id, None, Duration::ZERO, || next.is_lost())
                .await
                .unwrap();
        assert_eq!(outcome, Outcome::Wrote { accepted: true });
        recorder.record(Section::new(id, entered, released));
        observed.unlock(next).await.unwrap();
        proxy.unblock();
        windows.push((blocked, blocked + timeout.as_nanos() as u64));
        let unlocked = observed.unlock(guard).await;
        assert!(
            matches!(unlocked, Err(Error::NotHeld { .. })),
            "{unlocked:?}"
        );
    }
    let verdict = check(&recorder.sections(), &store.history().await, 1);
    let lost_first = lead.iter().filter(|ms| **ms >= 0.0).count();
    let record = Record::new("cut-longer-than-lease", &name_of_test());
    let (record, figures) = observed.examine(record, &windows);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations() + history_violations(&figures)) as f64,
        )
        .num("runs", f64::from(rounds))
        .nums("recovery_ms", &recovery)
        .nums("lost_signal_lead_ms", &lead)
        .num("lost_future_before_entry", lost_first as f64)
        .num("lease_ms", timeout.as_millis() as f64)
        .save();
    assert_eq!(verdict.violations(), 0, "{verdict:?}");
    assert_clean(&figures);
}

// === Redis restarted empty ===

/// History: per lock, the holder's acquire (p1), the waiter's acquire (p2) and unlock, the
/// holder's lost signal and its unlock; then each holder's client takes a lock again (p3). The
/// fenced lock's history is checked on its own. Fault window: from the restart to a lease after
/// the server answers again (a waiter may wait out the lease it was told of).
#[tokio::test]
async fn a_restart_that_empties_redis_loses_every_guard_and_waiters_recover() {
    let mut server = spawned().await;
    let store_server = spawned().await;
    let url = server.url();
    let timeout = Duration::from_millis(600);
    let names: Vec<String> = (0..3).map(|_| unique("restart")).collect();
    // One resource (and one check) per lock.
    let mut stores = Vec::new();
    for name in &names {
        stores.push(Store::connect(&store_server.url(), name).await);
    }
    // The first lock is fenced.
    let (fenced, plain) = (
        Observed::new(Primitive::Fenced),
        Observed::new(Primitive::Lock),
    );
    let observed = |i: usize| if i == 0 { &fenced } else { &plain };
    let mut holders = Vec::new();
    let mut guards = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let holder = client_with(&url, timeout).await;
        let acquire = async {
            if i == 0 {
                holder.fenced_lock(name).lock().await.map(LockGuard::from)
            } else {
                holder.lock(name).lock().await
            }
        };
        let guard = observed(i).lock(1, name, acquire).await.unwrap();
        guards.push((guard, now()));
        holders.push(holder);
    }
    let token_before = guards[0].0.fencing_token().unwrap();
    let mut waiters = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let waiter = client(&url).await;
        let (lock, fenced) = (waiter.lock(name), waiter.fenced_lock(name));
        let (observed, name) = (observed(i).clone(), name.clone());
        let task = tokio::spawn(async move {
            let acquire = async {
                if i == 0 {
                    fenced.lock().await.map(LockGuard::from)
                } else {
                    lock.lock().await
                }
            };
            let guard = observed.lock(2, &name, acquire).await?;
            Ok::<_, Error>((guard, now()))
        });
        until_waiting(&waiter, 1).await;
        waiters.push((waiter, task));
    }

    // Each guard's lost() is watched by a task of its own, so each is stamped when it resolves.
    let lost_tasks: Vec<_> = guards
        .iter()
        .map(|(guard, _)| {
            let lost = guard.lost();
            tokio::spawn(async move {
                lost.await;
                now()
            })
        })
        .collect();
    let restarting = now();
    server.restart_empty().await.unwrap();
    let restarted = now();
    let window = (restarting, restarted + timeout.as_nanos() as u64);
    let recorders: Vec<Recorder> = names.iter().map(|_| Recorder::new()).collect();
    let mut signal_ms = Vec::new();
    for (i, ((guard, acquired), lost_task)) in guards.iter().zip(lost_tasks).enumerate() {
        let lost_at = within(HANG, "lost after the restart", lost_task)
            .await
            .unwrap();
        assert!(guard.is_lost());
        observed(i).lost(guard);
        signal_ms.push(millis_between(restarted, lost_at));
        let mut section = Section::new(format!("holder#{i}"), *acquired, lost_at);
        section.lost = Some(lost_at);
        recorders[i].record(section);
    }
    let mut recovery = Vec::new();
    for (i, (waiter, task)) in waiters.into_iter().enumerate() {
        let (guard, entered) = within(HANG, "a waiter after the restart", task)
            .await
            .unwrap()
            .unwrap();
        recovery.push(millis_between(restarted, entered));
        if i == 0 {
            assert!(
                guard.fencing_token().unwrap() > token_before,
                "fencing tokens keep growing after Redis lost its data"
            );
        }
        let id = format!("waiter#{i}");
        let (outcome, released) = critical_section(
            &stores[i],
            &id,
            guard.fencing_token(),
            Duration::ZERO,
            || guard.is_lost(),
        )
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Wrote { accepted: true });
        let mut section = Section::new(id, entered, released);
        section.token = guard.fencing_token();
        recorders[i].record(section);
        observed(i).unlock(guard).await.unwrap();
        drop(waiter);
    }
    // The same clients take locks again, without being restarted themselves.
    for holder in &holders {
        let name = unique("again");
        let again = within(
            HANG,
            "a new acquire after the restart",
            plain.lock(3, &name, holder.lock(&name).lock()),
        )
        .await
        .unwrap();
        assert!(!again.is_lost());
        plain.unlock(again).await.unwrap();
    }
    for (i, (guard, _)) in guards.into_iter().enumerate() {
        let unlocked = observed(i).unlock(guard).await;
        assert!(
            matches!(unlocked, Err(Error::NotHeld { .. })),
            "{unlocked:?}"
        );
    }
    let mut verdict = Verdict::default();
    for (store, recorder) in stores.iter().zip(&recorders) {
        verdict.merge(check(&recorder.sections(), &store.history().await, 1));
    }
    let record = Record::new("restart-empty", &name_of_test());
    let (record, fenced_figures) = fenced.examine(record, &[window]);
    let (record, figures) = plain.examine(record, &[window]);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations()
                + history_violations(&fenced_figures)
                + history_violations(&figures)) as f64,
        )
        .nums("recovery_ms", &recovery)
        .nums("lost_signal_after_restart_ms", &signal_ms)
        .num("guards_lost", signal_ms.len() as f64)
        .save();
    assert_eq!(verdict.violations(), 0, "{verdict:?}");
    assert_clean(&fenced_figures);
    assert_clean(&figures);
}

// === Slow network ===

/// History: every worker's acquires (p0-p3; half of them wait at most 15 ms) and unlocks. No
/// fault window: the delay is there throughout and small (3-10 ms per chunk), so the stall bound
/// applies as without a fault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_network_grants_no_lock_twice_and_waits_end() {
    let server = spawned().await;
    let store_server = spawned().await;
    let resource = unique("slow");
    let store = Store::connect(&store_server.url(), &resource).await;
    let name = unique("slow");
    let recorder = Recorder::new();
    let observed = Observed::new(Primitive::Lock);
    let mut proxies = Vec::new();
    let mut tasks = Vec::new();
    for worker in 0..4u64 {
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        proxy.set_delay(Duration::from_millis(3));
        proxy.set_jitter(Duration::from_millis(7));
        let client = client_with(&proxy.url(), Duration::from_secs(3)).await;
        proxies.push(proxy);
        let (name, store, recorder, observed) = (
            name.clone(),
            store.clone(),
            recorder.clone(),
            observed.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let lock = client.lock(&name);
            let (mut timed_out, mut done) = (0u32, 0u32);
            for round in 0..10 {
                // Half the workers are impatient: their waits must end, acquired or not.
                let wait = if worker % 2 == 0 {
                    Duration::from_secs(30)
                } else {
                    Duration::from_millis(15)
                };
                let acquire = lock.try_lock(wait, None);
                let Some(guard) = observed
                    .try_lock(worker, &name, true, acquire)
                    .await
                    .unwrap()
                else {
                    timed_out += 1;
                    continue;
                };
                let acquired = now();
                let id = format!("w{worker}#{round}");
                let (outcome, released) =
                    critical_section(&store, &id, None, Duration::from_millis(2), || {
                        guard.is_lost()
                    })
                    .await
                    .unwrap();
                assert_eq!(outcome, Outcome::Wrote { accepted: true });
                recorder.record(Section::new(id, acquired, released));
                observed.unlock(guard).await.unwrap();
                done += 1;
            }
            (done, timed_out)
        }));
    }
    let mut timed_out = 0;
    for task in tasks {
        let (_, missed) = within(HANG, "workers on a slow network", task)
            .await
            .unwrap();
        timed_out += missed;
    }
    let history = store.history().await;
    let verdict = check(&recorder.sections(), &history, 1);
    assert_eq!(store.counter().await, history.len() as i64);
    let record = Record::new("slow-network", &name_of_test());
    let (record, figures) = observed.examine(record, &[]);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations() + history_violations(&figures)) as f64,
        )
        .num("timed_out_waits", f64::from(timed_out))
        .text(
            "network",
            "3 ms delay + 0-7 ms jitter per chunk, each direction",
        )
        .save();
    assert_eq!(verdict.violations(), 0, "{verdict:?}");
    assert_clean(&figures);
}

// === Replies lost ===

/// The server runs an acquire or a release, the proxy drops the reply and cuts the connection;
/// fred re-sends the acquire, lockkit retries the release. Nothing may count twice, be released
/// twice, or stay stuck.
///
/// History, per round: the holder's acquire (p1), its re-entry inside the holder's scope and the
/// re-entry's release (one of the two has its reply dropped), its final unlock, the other
/// client's try-locks without a wait while it is held and after (p2), and the other's unlock.
/// Fault windows: from arming the drop to the answer of the operation whose reply was dropped.
#[tokio::test]
async fn lost_replies_count_nothing_twice_and_leave_nothing_stuck() {
    let server = spawned().await;
    let store_server = spawned().await;
    let resource = unique("lost-reply");
    let store = Store::connect(&store_server.url(), &resource).await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let holder = client(&proxy.url()).await;
    let other = client(&server.url()).await;
    let warm = holder.lock(unique("warm-up")).lock().await.unwrap();
    warm.unlock().await.unwrap();
    let redis = raw(&server.url()).await;
    let recorder = Recorder::new();
    let observed = Observed::new(Primitive::Lock);
    let mut windows = Vec::new();
    let mut fired = 0;
    let rounds = 12;
    for round in 0..rounds {
        let name = unique("lost-reply");
        let key = lock_key(&name);
        let lock = holder.lock(&name);
        let drop_acquire = round % 2 == 0;
        let armed = now();
        if drop_acquire {
            proxy.cut_after_request_containing(key.clone());
        }
        let guard = within(HANG, "acquire", observed.lock(1, &name, lock.lock()))
            .await
            .unwrap();
        let acquired = now();
        if drop_acquire {
            windows.push((armed, acquired));
        }
        let inner = within(HANG, "re-entry", observed.reenter(&guard, lock.lock()))
            .await
            .unwrap();
        if drop_acquire {
            fired += usize::from(proxy.triggered());
        }
        let fields: HashMap<String, String> = redis.hgetall(&key).await.unwrap();
        assert_eq!(
            fields.len(),
            3,
            "one owner count and two markers: {fields:?}"
        );
        assert_eq!(lock.hold_count().await.unwrap(), 2, "no hold counted twice");
        let at_once = observed.try_now(2, &other.lock(&name)).await;
        assert!(at_once.unwrap().is_none());
        let id = format!("r#{round}");
        let (outcome, released) =
            critical_section(&store, &id, None, Duration::ZERO, || guard.is_lost())
                .await
                .unwrap();
        assert_eq!(outcome, Outcome::Wrote { accepted: true });
        let armed = now();
        if !drop_acquire {
            proxy.cut_after_request_containing(key.clone());
        }
        within(HANG, "release of the inner hold", observed.unlock(inner))
            .await
            .unwrap();
        if !drop_acquire {
            fired += usize::from(proxy.triggered());
            windows.push((armed, now()));
        }
        assert_eq!(
            lock.hold_count().await.unwrap(),
            1,
            "no hold released twice"
        );
        within(HANG, "release", observed.unlock(guard))
            .await
            .unwrap();
        recorder.record(Section::new(id, acquired, released));
        // Nothing stuck: another client gets it at once.
        let next = observed
            .try_now(2, &other.lock(&name))
            .await
            .unwrap()
            .expect("the lock is free after the releases");
        let entered = now();
        observed.unlock(next).await.unwrap();
        recorder.record(Section::new(format!("o#{round}"), entered, now()));
    }
    assert_eq!(fired, rounds, "every armed reply was really dropped");
    let verdict = check(&recorder.sections(), &store.history().await, 1);
    let record = Record::new("reply-lost", &name_of_test());
    let (record, figures) = observed.examine(record, &windows);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations() + history_violations(&figures)) as f64,
        )
        .num("runs", rounds as f64)
        .num("replies_dropped", fired as f64)
        .save();
    assert_eq!(verdict.violations(), 0, "{verdict:?}");
    assert_clean(&figures);
}

// === Watchdog starved ===

/// A client on a current-thread runtime that is blocked longer than its lease: its watchdog
/// cannot run. Its guard must report lost, another client gets in, and when the starved runtime
/// runs again its watchdog must not extend the other owner's lock.
///
/// History: the starved client's acquire (p1), the other client's acquire (p2), the starved
/// guard's lost signal, both unlocks (each finds its hold gone). Fault window: from the block to
/// a lease after it (no renewal came after it; the other client may wait the starved lease out).
#[tokio::test]
async fn a_starved_watchdog_reports_lost_and_renews_nothing_another_owner_holds() {
    let server = spawned().await;
    let store_server = spawned().await;
    let resource = unique("starved");
    let store = Store::connect(&store_server.url(), &resource).await;
    let url = server.url();
    let name = unique("starved");
    let key = lock_key(&name);
    let timeout = Duration::from_millis(600);
    let mut events = KeyEvents::subscribe(server.addr(), &key).await;

    let (acquired_tx, acquired_rx) = tokio::sync::oneshot::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (resumed_tx, resumed_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    let observed = Observed::new(Primitive::Lock);
    let starved = {
        let (url, name, store, observed) =
            (url.clone(), name.clone(), store.clone(), observed.clone());
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let client = client_with(&url, timeout).await;
                let guard = observed
                    .lock(1, &name, client.lock(&name).lock())
                    .await
                    .unwrap();
                let acquired = now();
                let read = store.read().await.unwrap();
                // No await from here to the block: no renewal after `blocking`.
                let blocking = now();
                acquired_tx.send((acquired, blocking)).unwrap();
                // Blocks the only runtime thread (no watchdog, no I/O) until the other client
                // is in: far longer than the lease.
                go_rx.recv().unwrap();
                let resumed = now();
                let lost_on_resume = guard.is_lost();
                if lost_on_resume {
                    observed.lost(&guard);
                }
                // A careful application checks before writing, and so writes nothing.
                let wrote = if guard.is_lost() {
                    None
                } else {
                    Some(store.write("starved", read, None).await.unwrap())
                };
                resumed_tx.send((resumed, lost_on_resume, wrote)).unwrap();
                // Keeps the guard (and the watchdog ticking) until the other owner's lease ended.
                finish_rx.await.unwrap();
                let unlocked = observed.unlock(guard).await;
                client.shutdown().await.unwrap();
                unlocked
            })
        })
    };

    let (starved_acquired, blocking) = within(HANG, "the starved client acquires", acquired_rx)
        .await
        .unwrap();
    let fields: HashMap<String, String> = raw(&url).await.hgetall(&key).await.unwrap();
    let marker = fields
        .keys()
        .find(|field| field.starts_with('#'))
        .cloned()
        .expect("the starved hold's marker");

    let other = client(&url).await;
    let other_lease = timeout * 4;
    let guard = within(
        HANG,
        "the other client acquires",
        observed.lock(2, &name, other.lock(&name).lock_with_lease(other_lease)),
    )
    .await
    .unwrap();
    let entered = now();
    // The starved lease ran out (event), then the other owner took it and set its TTL (event).
    events.until("expired").await;
    let (_, _) = events.until("expire").await;
    go_tx.send(()).unwrap();
    let (resumed, lost_on_resume, wrote) = within(HANG, "the starved runtime resumes", resumed_rx)
        .await
        .unwrap();
    assert!(lost_on_resume, "the starved guard reports lost");
    assert_eq!(wrote, None);

    // The renewal the starved watchdog would send, replayed by hand: the marker check refuses.
    let renewed: Vec<i64> = raw(&url)
        .await
        .eval(
            lockkit::protocol::lock::RENEW.source(),
            vec![key.clone()],
            vec![marker, timeout.as_millis().to_string()],
        )
        .await
        .unwrap();
    assert_eq!(
        renewed,
        vec![0],
        "a renewal by the starved hold's marker finds nothing"
    );

    let (outcome, released) =
        critical_section(&store, "other", None, Duration::ZERO, || guard.is_lost())
            .await
            .unwrap();
    assert_eq!(outcome, Outcome::Wrote { accepted: true });
    // While the starved client runs again, with its watchdog ticking every 200 ms, nothing sets
    // the other owner's TTL again: its fixed lease runs out on the server as it was set.
    let (other_expired_at, between) = within(
        HANG,
        "the other owner's lease to end",
        events.until("expired"),
    )
    .await;
    let extended = between.iter().filter(|event| *event == "expire").count();
    finish_tx.send(()).unwrap();
    let starved_unlock = starved.join().unwrap();
    assert!(
        matches!(starved_unlock, Err(Error::NotHeld { .. })),
        "{starved_unlock:?}"
    );
    let unlocked = observed.unlock(guard).await;
    assert!(
        matches!(unlocked, Err(Error::NotHeld { .. })),
        "{unlocked:?}"
    );
    assert_eq!(
        extended, 0,
        "something extended the other owner's lock: {between:?}"
    );

    let mut starved_section = Section::new("starved", starved_acquired, resumed);
    starved_section.lost = Some(resumed);
    let sections = [starved_section, Section::new("other", entered, released)];
    let verdict = check(&sections, &store.history().await, 1);
    let window = (blocking, blocking + timeout.as_nanos() as u64);
    let record = Record::new("watchdog-starved", &name_of_test());
    let (record, figures) = observed.examine(record, &[window]);
    verdict
        .to_record(record)
        .num(
            "violations",
            (verdict.violations() + extended + history_violations(&figures)) as f64,
        )
        .num("extensions_of_other_owner", extended as f64)
        .nums("recovery_ms", &[millis_between(starved_acquired, entered)])
        .num("blocked_ms", millis_between(starved_acquired, resumed))
        .num(
            "watchdog_window_ms",
            millis_between(resumed, other_expired_at),
        )
        .save();
    assert_eq!(verdict.violations(), 0, "{verdict:?}");
    assert_clean(&figures);
}

/// Found by the soak: after the subscriber connection is re-established, fred's
/// `manage_subscriptions` re-subscribes with a `PSUBSCRIBE` of no patterns, whose error reply
/// surfaced as the failure of a waiter's subscription ("redis error during subscribe: ERR wrong
/// number of arguments for 'psubscribe'"). Waiting across reconnects must never fail that way.
///
/// History: the holder's acquires and unlocks (p1), the waiter client's waits (p2; an error
/// leaves one pending), the parked waiter's acquire (p3), granted when the first lock is unlocked
/// after every cut: a wake-up lost across the reconnects would show as a stall there. Fault
/// windows: from each cut to the end of the wait across it.
#[tokio::test]
async fn waiting_across_reconnects_never_fails_with_a_subscribe_error() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let waiter = client(&proxy.url()).await;
    let holder = client(&server.url()).await;
    let observed = Observed::new(Primitive::Lock);
    let busy_name = unique("busy");
    let busy = observed
        .lock(1, &busy_name, holder.lock(&busy_name).lock())
        .await
        .unwrap();
    // A waiter that stays registered, so the subscriber has a channel to restore.
    let lock = waiter.lock(&busy_name);
    let parked = {
        let observed = observed.clone();
        tokio::spawn(async move { observed.lock(3, &busy_name, lock.lock()).await })
    };
    until_waiting(&waiter, 1).await;
    let mut errors = Vec::new();
    let mut windows = Vec::new();
    let rounds = 30;
    for _ in 0..rounds {
        let name = unique("busy-too");
        let held = observed
            .lock(1, &name, holder.lock(&name).lock())
            .await
            .unwrap();
        let cut = now();
        proxy.cut();
        let lock = waiter.lock(&name);
        let wait = observed.try_lock(
            2,
            &name,
            true,
            lock.try_lock(Duration::from_millis(100), None),
        );
        match within(HANG, "a wait across a reconnect", wait).await {
            Ok(None) => {}
            Ok(Some(_)) => panic!("acquired a held lock"),
            Err(err) => errors.push(err.to_string()),
        }
        windows.push((cut, now()));
        observed.unlock(held).await.unwrap();
    }
    // The parked waiter's channel (its client's own for the lock) was subscribed again after
    // the cuts.
    let channel = lockkit::protocol::keys::Namespace::default()
        .lock(busy.name())
        .unwrap()
        .client_channel(waiter.id());
    within(
        HANG,
        "the parked waiter's channel to be subscribed again",
        async {
            loop {
                let reply =
                    lockkit_testkit::send_command(server.addr(), &["PUBSUB", "NUMSUB", &channel])
                        .await
                        .unwrap();
                let subscribers = reply
                    .as_array()
                    .and_then(|a| a.get(1))
                    .and_then(|n| n.as_int());
                if subscribers == Some(1) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        },
    )
    .await;
    observed.unlock(busy).await.unwrap();
    let parked = within(HANG, "the parked waiter", parked)
        .await
        .unwrap()
        .unwrap();
    observed.unlock(parked).await.unwrap();
    let record = Record::new("reconnect-while-waiting", &name_of_test());
    let (record, figures) = observed.examine(record, &windows);
    record
        .num("runs", f64::from(rounds))
        .num("operations", f64::from(rounds))
        .num("violations", history_violations(&figures) as f64)
        .num("errors", errors.len() as f64)
        .save();
    assert!(
        errors.is_empty(),
        "{} of {rounds}: {errors:?}",
        errors.len()
    );
    assert_clean(&figures);
}

// === Histories under contention, no fault: linearizability and stalls ===

/// The primitives of the contention run.
const CONTENDED: [Primitive; 7] = [
    Primitive::Lock,
    Primitive::Fenced,
    Primitive::Fair,
    Primitive::Spin,
    Primitive::Semaphore,
    Primitive::Permits,
    Primitive::ReadWrite,
];
const CONTENTION_CLIENTS: u64 = 3;
const CONTENTION_PERMITS: u64 = 3;

/// A release's answer in the contention run, which no error may be (none is expected, whatever
/// runs beside the run): released, or not held (for the model to judge).
fn answered(kind: Primitive, result: Result<bool, Error>) {
    if let Err(err) = result {
        panic!("{kind:?} release failed: {err}");
    }
}

/// One worker of the contention run: random waits (some a single attempt), holds of 5-150 ms,
/// some guards dropped instead of unlocked; every invocation and answer goes to `recording`.
async fn contention_worker(
    client: lockkit::Client,
    kind: Primitive,
    name: String,
    process: u64,
    recording: history::Recording,
    end: tokio::time::Instant,
) {
    let mut rng = lockkit_suite::checker::Rng::new(now() ^ (process << 24));
    let object = name.as_str();
    while tokio::time::Instant::now() < end {
        let wait = if rng.one_in(5) {
            Duration::ZERO
        } else {
            rng.millis(50, 2000)
        };
        let lease = if rng.one_in(2) {
            None
        } else {
            Some(Duration::from_secs(5))
        };
        // Semaphore holds are longer: releases are rarer, so a wake-up that goes astray leaves
        // a waiter unserved long enough to show.
        let hold_for = if matches!(kind, Primitive::Semaphore | Primitive::Permits) {
            rng.millis(20, 400)
        } else {
            rng.millis(5, 150)
        };
        let drop_it = rng.one_in(6);
        let waits = !wait.is_zero();
        match kind {
            Primitive::Semaphore => {
                let permits = rng.range(1, 3);
                let acquiring = recording.acquire(process, &[object], permits, waits);
                let semaphore = client.semaphore(object);
                match recording
                    .joining(&acquiring, semaphore.try_acquire(permits, wait, lease))
                    .await
                {
                    Ok(Some(permit)) => {
                        let hold = recording.granted(&acquiring, process, &[object], None);
                        tokio::time::sleep(hold_for).await;
                        if drop_it {
                            recording.dropped(&hold);
                            drop(permit);
                        } else {
                            answered(
                                kind,
                                recording
                                    .release(&hold, async { released(permit.release().await) })
                                    .await,
                            );
                        }
                    }
                    Ok(None) => recording.timed_out(&acquiring),
                    Err(err) => panic!("semaphore acquire failed: {err}"),
                }
            }
            Primitive::Permits => {
                let acquiring = recording.acquire(process, &[object], 1, waits);
                let semaphore = client.permit_expirable_semaphore(object);
                let lease = lease.unwrap_or(Duration::from_secs(5));
                match recording
                    .joining(&acquiring, semaphore.try_acquire(wait, lease))
                    .await
                {
                    Ok(Some(permit)) => {
                        let hold = recording.granted(&acquiring, process, &[object], None);
                        tokio::time::sleep(hold_for).await;
                        if drop_it {
                            // Released by id, as another part of the program would: the guard
                            // lets go of the permit, which lives on until the release.
                            let id = permit.into_id();
                            answered(
                                kind,
                                recording
                                    .release(&hold, async {
                                        released(semaphore.release(&id).await)
                                    })
                                    .await,
                            );
                        } else {
                            answered(
                                kind,
                                recording
                                    .release(&hold, async { released(permit.release().await) })
                                    .await,
                            );
                        }
                    }
                    Ok(None) => recording.timed_out(&acquiring),
                    Err(err) => panic!("permit acquire failed: {err}"),
                }
            }
            Primitive::ReadWrite => {
                let writer = rng.one_in(3);
                let weight = if writer { kind.capacity() } else { 1 };
                let acquiring = recording.acquire(process, &[object], weight, waits);
                let rw = client.read_write_lock(object);
                let acquired = recording
                    .joining(&acquiring, async {
                        if writer {
                            rw.try_write_lock(wait, lease).await
                        } else {
                            rw.try_read_lock(wait, lease).await
                        }
                    })
                    .await;
                match acquired {
                    Ok(Some(guard)) => {
                        let hold = recording.granted(&acquiring, process, &[object], None);
                        tokio::time::sleep(hold_for).await;
                        answered(
                            kind,
                            recording
                                .release(&hold, async { released(guard.unlock().await) })
                                .await,
                        );
                    }
                    Ok(None) => recording.timed_out(&acquiring),
                    // Every acquire here is an owner of its own, holding nothing: the model says
                    // whether a refusal (the no-upgrade rule) was right.
                    Err(Error::Refused { .. }) => recording.refused(&acquiring),
                    Err(err) => panic!("rw acquire failed: {err}"),
                }
            }
            _ => {
                let acquiring = recording.acquire(process, &[object], 1, waits);
                let acquired = match kind {
                    Primitive::Lock => client.lock(object).try_lock(wait, lease).await,
                    Primitive::Fenced => client
                        .fenced_lock(object)
                        .try_lock(wait, lease)
                        .await
                        .map(|guard| guard.map(LockGuard::from)),
                    Primitive::Fair => client.fair_lock(object).try_lock(wait, lease).await,
                    _ => client.spin_lock(object).try_lock(wait, lease).await,
                };
                match acquired {
                    Ok(Some(guard)) => {
                        let token = guard.fencing_token();
                        let hold = recording.granted(&acquiring, process, &[object], token);
                        tokio::time::sleep(hold_for).await;
                        if drop_it {
                            recording.dropped(&hold);
                            drop(guard);
                        } else {
                            answered(
                                kind,
                                recording
                                    .release(&hold, async { released(guard.unlock().await) })
                                    .await,
                            );
                        }
                    }
                    Ok(None) => recording.timed_out(&acquiring),
                    Err(err) => panic!("{kind:?} acquire failed: {err}"),
                }
            }
        }
    }
}

/// The latch's part of the contention run: rounds of `try_set_count(3)` by a coordinator, three
/// count-downs after random delays from the three clients, and two waiters with random timeouts,
/// until `end`; every invocation and answer is recorded on one latch, checked against
/// `LatchSpec` (a wait that returns `true` needs the count at zero; a waiter left waiting while
/// the latch was open is a stall).
async fn latch_rounds(
    clients: Vec<lockkit::Client>,
    name: String,
    history: History<LatchOp, LatchRet>,
    end: tokio::time::Instant,
) {
    let mut rng = lockkit_suite::checker::Rng::new(now());
    while tokio::time::Instant::now() < end {
        let coordinator = clients[0].count_down_latch(&name);
        let call = history.invoke(
            100,
            &name,
            LatchOp::TrySetCount {
                request: String::new(),
                count: 3,
            },
        );
        let set = coordinator
            .try_set_count(3)
            .await
            .unwrap_or_else(|err| panic!("latch call failed: {err}"));
        history.respond(call, LatchRet::Set(set));
        let mut tasks = Vec::new();
        for i in 0..5u64 {
            let latch = clients[i as usize % clients.len()].count_down_latch(&name);
            let history = history.clone();
            let (delay, timeout) = (rng.millis(0, 120), rng.millis(40, 400));
            let object = name.clone();
            tasks.push(tokio::spawn(async move {
                if i < 3 {
                    tokio::time::sleep(delay).await;
                    let down = LatchOp::CountDown {
                        request: String::new(),
                    };
                    let call = history.invoke(101 + i, &object, down);
                    let ret = match latch.count_down().await {
                        Ok(count) => LatchRet::Counted { count },
                        Err(Error::Refused { .. }) => LatchRet::AlreadyZero,
                        Err(err) => panic!("count_down failed: {err}"),
                    };
                    history.respond(call, ret);
                } else {
                    let call = history.invoke(101 + i, &object, LatchOp::Wait);
                    let opened = latch
                        .wait(timeout)
                        .await
                        .unwrap_or_else(|err| panic!("latch call failed: {err}"));
                    let ret = if opened {
                        LatchRet::Opened
                    } else {
                        LatchRet::TimedOut
                    };
                    history.respond(call, ret);
                }
            }));
        }
        for task in tasks {
            within(HANG, "a latch round", task).await.unwrap();
        }
    }
}

/// The result a waiting latch operation waits for (for the stall measure).
fn latch_serve(op: &LatchOp) -> Option<LatchRet> {
    matches!(op, LatchOp::Wait).then_some(LatchRet::Opened)
}

/// How long the contention run lasts: `LOCKKIT_HISTORY_SECS`, default 8 s per primitive (all
/// primitives run at once).
fn history_secs() -> u64 {
    std::env::var("LOCKKIT_HISTORY_SECS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(8)
}

/// The contention run on the Redis at `url`, until `end`: three clients, two workers each per
/// primitive (three for the semaphore), and rounds of a latch. Every primitive's history is
/// checked for linearizability (against its reference model, through `tests/history`) and for
/// waiters left unserved longer than the handoff window + 100 ms (the spin lock: twice its
/// backoff cap + 100 ms) while the resource was free for them. Returns `record` with the figures
/// added, and the explanation of every violation and stall (empty when there is none). An error
/// returned to a worker by any operation fails the run: none is expected, whatever runs beside it.
async fn contention_run(url: &str, end: tokio::time::Instant, record: Record) -> (Record, String) {
    let mut clients = Vec::new();
    for _ in 0..CONTENTION_CLIENTS {
        clients.push(client(url).await);
    }
    let mut runs = Vec::new();
    let mut tasks = Vec::new();
    for kind in CONTENDED {
        let name = unique(&format!("contended-{}", kind.id()));
        if kind == Primitive::Semaphore {
            assert!(clients[0]
                .semaphore(&name)
                .try_set_permits(CONTENTION_PERMITS)
                .await
                .unwrap());
        }
        if kind == Primitive::Permits {
            assert!(clients[0]
                .permit_expirable_semaphore(&name)
                .try_set_permits(CONTENTION_PERMITS)
                .await
                .unwrap());
        }
        let recording = history::Recording::new();
        for (c, client) in clients.iter().enumerate() {
            // Three semaphore workers per client: waiters for 1 and 2 permits in one client.
            let workers = if kind == Primitive::Semaphore { 3 } else { 2 };
            let mut batch = Vec::new();
            for w in 0..workers {
                let worker = contention_worker(
                    client.clone(),
                    kind,
                    name.clone(),
                    c as u64 * 10 + w,
                    recording.clone(),
                    end,
                );
                // The first client runs its workers as futures of ONE task (`join_all`, as a
                // batch handler would): each plain acquire must still be an owner of its own.
                // (With the task as the owner, they entered together: a violation here.)
                if c == 0 {
                    batch.push(worker);
                } else {
                    tasks.push(tokio::spawn(worker));
                }
            }
            if !batch.is_empty() {
                tasks.push(tokio::spawn(async move {
                    futures::future::join_all(batch).await;
                }));
            }
        }
        runs.push((kind, recording));
    }
    let latch_history = History::<LatchOp, LatchRet>::new();
    tasks.push(tokio::spawn(latch_rounds(
        clients.clone(),
        unique("contended-latch"),
        latch_history.clone(),
        end,
    )));
    for task in tasks {
        within(HANG, "a contention worker", task).await.unwrap();
    }
    let mut record = record;
    let mut failures = String::new();
    let (mut operations, mut violations) = (0, 0);
    for (kind, recording) in &runs {
        let figures = examine(recording, *kind, &[]);
        history::report(kind.id(), &figures);
        operations += figures.operations;
        record = history::to_record(record, kind.id(), &figures);
        violations += figures.violations + figures.stalls;
        if figures.violations + figures.stalls > 0 {
            failures.push_str(&figures.explain);
        }
    }
    let figures = history::examine_history(
        &latch_history,
        |_| LatchSpec::new(),
        latch_serve,
        history::BOUND_NS,
        &[],
    );
    history::report("latch", &figures);
    operations += figures.operations;
    record = history::to_record(record, "latch", &figures);
    violations += figures.violations + figures.stalls;
    if figures.violations + figures.stalls > 0 {
        failures.push_str(&figures.explain);
    }
    let record = record
        .num("operations", operations as f64)
        .num("violations", violations as f64)
        .num("clients", CONTENTION_CLIENTS as f64);
    (record, failures)
}

/// The contention run on one Redis with no fault: this is where a lost, swallowed or misdirected
/// wake-up, or a reservation for a waiter that is gone, shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_under_contention_are_linearizable_and_never_stall() {
    let server = spawned().await;
    let end = tokio::time::Instant::now() + Duration::from_secs(history_secs());
    let record = Record::new("history-contention", &name_of_test());
    let (record, failures) = contention_run(&server.url(), end, record).await;
    record.save();
    assert!(failures.is_empty(), "{failures}");
}

// === The script cache emptied under load ===

/// How often the flush run empties the script cache.
const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// Sends `SCRIPT FLUSH` to `server` every [`FLUSH_EVERY`] until `end`; returns how many it sent.
async fn flush_scripts_until(
    server: &lockkit_testkit::RedisServer,
    end: tokio::time::Instant,
) -> u64 {
    let mut ticks = tokio::time::interval(FLUSH_EVERY);
    let mut flushes = 0;
    loop {
        ticks.tick().await;
        if tokio::time::Instant::now() >= end {
            return flushes;
        }
        let reply = server.command(&["SCRIPT", "FLUSH"]).await.unwrap();
        assert_eq!(
            reply.as_str(),
            Some("OK"),
            "SCRIPT FLUSH answered {reply:?}"
        );
        flushes += 1;
    }
}

/// How many `NOSCRIPT` errors `server` has answered (`INFO errorstats`).
async fn noscript_replies(server: &lockkit_testkit::RedisServer) -> u64 {
    let reply = server.command(&["INFO", "errorstats"]).await.unwrap();
    let info = reply.as_str().unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("errorstat_NOSCRIPT:count="))
        .map_or(0, |count| count.trim().parse().unwrap())
}

/// The contention run (every primitive, three clients, a latch) while another connection sends
/// `SCRIPT FLUSH` every 100 ms, as a managed service's failover or a maintenance job may empty
/// the script cache under load. Every script call that meets the empty cache gets `NOSCRIPT`
/// and must be sent again with its source: no operation may return an error (the workers fail
/// the run on any), no waiter may be left unserved while the resource is free for it (stalls),
/// and every history must stay linearizable. The server's `NOSCRIPT` count shows that the
/// flushes did hit script calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_cache_flushed_every_100ms_under_contention_costs_no_error_and_no_wakeup() {
    let server = spawned().await;
    let end = tokio::time::Instant::now() + Duration::from_secs(history_secs());
    let record = Record::new("script-flush", &name_of_test());
    let url = server.url();
    let ((record, failures), flushes) = tokio::join!(
        contention_run(&url, end, record),
        flush_scripts_until(&server, end)
    );
    let noscript = noscript_replies(&server).await;
    println!("SCRIPT FLUSH sent {flushes} times; the server answered NOSCRIPT {noscript} times");
    record
        .num("script_flushes", flushes as f64)
        .num("noscript_replies", noscript as f64)
        .save();
    assert!(failures.is_empty(), "{failures}");
    assert!(
        flushes > 0 && noscript > 0,
        "the flushes must meet script calls: {flushes} flushes, {noscript} NOSCRIPT replies"
    );
}

// === The election under faults (issue 22) ===

/// The watchdog timeout (so the lease) of the election run's candidates.
const ELECTION_LEASE: Duration = Duration::from_millis(600);
/// How long a candidate waits to lead before it gives up and campaigns again.
const ELECTION_WAIT: Duration = Duration::from_millis(1_500);

/// A fault of the election run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ElectionFault {
    /// The leader's client dies (SIGKILL, at the client level): its connection goes silent
    /// (its proxy blocked for good) and its tasks are aborted, so its leadership is neither
    /// resigned nor released: another candidate leads once the lease ran out.
    KillLeader,
    /// The server stops answering (`SIGSTOP`) for a while.
    PauseServer,
    /// The leader's connection is cut off for longer than the lease.
    CutLeader,
    /// Redis restarts empty.
    Restart,
    /// The script cache is emptied (`SCRIPT FLUSH`, as on a restarted or failed-over server),
    /// then the server stops answering for a while: what was sent meanwhile runs when it
    /// resumes, and every script the clients send next meets `NOSCRIPT` first (issue 27, §4).
    FlushAndPause,
}

type ElectionHistory = History<ElectionOp, ElectionRet>;

/// What the election run shares between its candidates: who leads (process, hold, campaign
/// call), and every leadership with when it began and ended, for the fault windows.
#[derive(Default)]
struct Leaders {
    current: Option<(u64, String)>,
    /// Leaderships: hold → (its campaign's call, invoked at, ended at).
    all: HashMap<String, (lockkit_suite::linearizability::Call, u64, u64)>,
    /// Holds the history shows may have ended on their own (lost, NotHeld, an error).
    lapsed: std::collections::HashSet<String>,
    /// Each candidate's operation in flight, with the results it may have had if its client
    /// dies before the answer.
    in_flight: HashMap<u64, (lockkit_suite::linearizability::Call, Vec<ElectionRet>)>,
}

/// Records `op` invoked by candidate `process`, in flight until [`settled`].
fn invoked(
    history: &ElectionHistory,
    shared: &SharedLeaders,
    process: u64,
    name: &str,
    op: ElectionOp,
) -> lockkit_suite::linearizability::Call {
    // A killed client's campaign may have won (term unknown); its proclaim or resign may have
    // run.
    let may_have = match op {
        ElectionOp::Campaign { .. } => vec![ElectionRet::Error],
        ElectionOp::Proclaim { .. } | ElectionOp::Resign { .. } => vec![ElectionRet::Done],
        ElectionOp::Lost { .. } | ElectionOp::Leader => Vec::new(),
    };
    let call = history.invoke(process, name, op);
    leaders(shared).in_flight.insert(process, (call, may_have));
    call
}

/// The answer of candidate `process`'s operation in flight.
fn settled(
    history: &ElectionHistory,
    shared: &SharedLeaders,
    process: u64,
    call: lockkit_suite::linearizability::Call,
    ret: ElectionRet,
) {
    leaders(shared).in_flight.remove(&process);
    history.respond(call, ret);
}

type SharedLeaders = std::sync::Arc<std::sync::Mutex<Leaders>>;

fn leaders(shared: &SharedLeaders) -> std::sync::MutexGuard<'_, Leaders> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn election_ret(result: Result<(), Error>) -> ElectionRet {
    match result {
        Ok(()) => ElectionRet::Done,
        Err(Error::NotHeld { .. }) => ElectionRet::NotHeld,
        Err(_) => ElectionRet::Error,
    }
}

/// One candidate: campaigns (bounded wait, watchdog lease), and while it leads proclaims a few
/// values, then resigns; every operation recorded.
async fn election_candidate(
    process: u64,
    client: lockkit::Client,
    name: String,
    history: ElectionHistory,
    shared: SharedLeaders,
    end: tokio::time::Instant,
) {
    let election = client.election(&name);
    let mut rng = lockkit_suite::checker::Rng::new(process * 7_919 + now() % 1_000);
    let mut n = 0u64;
    while tokio::time::Instant::now() < end {
        n += 1;
        let hold = format!("p{process}-{n}");
        let value = format!("v{process}-{n}");
        let invoked_at = now();
        let call = invoked(
            &history,
            &shared,
            process,
            &name,
            ElectionOp::Campaign {
                hold: hold.clone(),
                value: value.clone(),
                may_lapse: false,
            },
        );
        let leadership = match election.try_campaign(value, ELECTION_WAIT, None).await {
            Ok(Some(leadership)) => {
                {
                    let mut leaders = leaders(&shared);
                    leaders.current = Some((process, hold.clone()));
                    leaders
                        .all
                        .insert(hold.clone(), (call, invoked_at, u64::MAX));
                }
                settled(
                    &history,
                    &shared,
                    process,
                    call,
                    ElectionRet::Elected(leadership.term()),
                );
                leadership
            }
            Ok(None) => {
                settled(&history, &shared, process, call, ElectionRet::TimedOut);
                continue;
            }
            Err(err) => {
                let ret = if matches!(err, Error::NotHeld { .. }) {
                    ElectionRet::NotHeld
                } else {
                    ElectionRet::Error
                };
                settled(&history, &shared, process, call, ret);
                {
                    let mut leaders = leaders(&shared);
                    leaders.all.insert(hold.clone(), (call, invoked_at, now()));
                    leaders.lapsed.insert(hold);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        for k in 0..rng.range(0, 4) {
            tokio::time::sleep(rng.millis(2, 40)).await;
            if leadership.is_lost() {
                let at = now();
                let lost =
                    history.invoke_at(process, &name, ElectionOp::Lost { hold: hold.clone() }, at);
                history.respond_at(lost, ElectionRet::Signalled, at);
                leaders(&shared).lapsed.insert(hold.clone());
                break;
            }
            let call = invoked(
                &history,
                &shared,
                process,
                &name,
                ElectionOp::Proclaim {
                    hold: hold.clone(),
                    value: format!("v{process}-{n}-{k}"),
                },
            );
            let ret = election_ret(leadership.proclaim(format!("v{process}-{n}-{k}")).await);
            if ret != ElectionRet::Done {
                leaders(&shared).lapsed.insert(hold.clone());
            }
            settled(&history, &shared, process, call, ret);
        }
        let call = invoked(
            &history,
            &shared,
            process,
            &name,
            ElectionOp::Resign { hold: hold.clone() },
        );
        {
            let mut leaders = leaders(&shared);
            if let Some(entry) = leaders.all.get_mut(&hold) {
                entry.2 = now();
            }
        }
        let ret = election_ret(leadership.resign().await);
        {
            let mut leaders = leaders(&shared);
            if ret != ElectionRet::Done {
                leaders.lapsed.insert(hold.clone());
            }
            if leaders.current.as_ref().is_some_and(|(_, h)| *h == hold) {
                leaders.current = None;
            }
        }
        settled(&history, &shared, process, call, ret);
        tokio::time::sleep(rng.millis(0, 10)).await;
    }
}

/// Reads the leader in a loop, recording what it saw.
async fn election_reader(
    process: u64,
    client: lockkit::Client,
    name: String,
    history: ElectionHistory,
    end: tokio::time::Instant,
) {
    let election = client.election(&name);
    while tokio::time::Instant::now() < end {
        let call = history.invoke(process, &name, ElectionOp::Leader);
        let ret = match election.leader().await {
            Ok(leader) => ElectionRet::Leader(leader.map(|l| (l.term, l.value))),
            Err(_) => ElectionRet::Error,
        };
        history.respond(call, ret);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What one observer delivered, in order.
type ObservedChanges = std::sync::Arc<std::sync::Mutex<Vec<lockkit::LeaderChange>>>;

/// Follows the election's changes until `end`, keeping every item it delivers.
async fn election_observer(
    client: lockkit::Client,
    name: String,
    seen: ObservedChanges,
    end: tokio::time::Instant,
) {
    use futures::StreamExt;
    let mut changes = client.election(&name).observe();
    while let Ok(Some(item)) = tokio::time::timeout_at(end, changes.next()).await {
        match item {
            Ok(change) => seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(change),
            Err(_) => break,
        }
    }
}

/// The observers' deliveries against the contract: terms never go back; an `Elected` term
/// exceeds every term delivered before it; every term delivered was a campaign's (when no
/// campaign's outcome is unknown); and two observers that never reported a resync saw the same
/// sequence of elected terms over the span both followed (no gap, no reordering).
fn observer_violations(observed: &[ObservedChanges], elected: &[u64], exact: bool) -> Vec<String> {
    let mut found = Vec::new();
    let known: std::collections::HashSet<u64> = elected.iter().copied().collect();
    let mut clean = Vec::new();
    for (i, seen) in observed.iter().enumerate() {
        let seen = seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let mut last = 0u64;
        let mut resynced = false;
        let mut terms = Vec::new();
        for change in &seen {
            let term = match change {
                lockkit::LeaderChange::Current(leader) => leader.as_ref().map(|l| l.term),
                lockkit::LeaderChange::Resynced(leader) => {
                    resynced = true;
                    leader.as_ref().map(|l| l.term)
                }
                lockkit::LeaderChange::Elected(leader) => {
                    if leader.term <= last {
                        found.push(format!(
                            "observer {i}: Elected term {} after term {last}",
                            leader.term
                        ));
                    }
                    terms.push(leader.term);
                    Some(leader.term)
                }
                lockkit::LeaderChange::Proclaimed(leader) => Some(leader.term),
                lockkit::LeaderChange::Resigned { term } => Some(*term),
                other => {
                    found.push(format!("observer {i}: unknown change {other:?}"));
                    None
                }
            };
            if let Some(term) = term {
                if term < last {
                    found.push(format!("observer {i}: term {term} after term {last}"));
                }
                if exact && !known.contains(&term) {
                    found.push(format!(
                        "observer {i}: term {term} no campaign was elected with"
                    ));
                }
                last = last.max(term);
            }
        }
        if !resynced {
            clean.push((i, terms));
        }
    }
    for (i, a) in &clean {
        for (j, b) in &clean {
            let (Some(lo), Some(hi)) = (
                a.first().max(b.first()).copied(),
                a.last().min(b.last()).copied(),
            ) else {
                continue;
            };
            let span = |t: &Vec<u64>| -> Vec<u64> {
                t.iter()
                    .copied()
                    .filter(|x| (lo..=hi).contains(x))
                    .collect()
            };
            if i < j && span(a) != span(b) {
                found.push(format!(
                    "observers {i} and {j} saw different terms over [{lo}, {hi}]: {:?} and {:?}",
                    span(a),
                    span(b)
                ));
            }
        }
    }
    found
}

/// One candidate's client (through a proxy of its own, so it can be cut off or killed) and its
/// tasks.
struct ElectionClient {
    proxy: FaultProxy,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    observed: ObservedChanges,
}

async fn election_client(
    server: &lockkit_testkit::RedisServer,
    process: u64,
    name: &str,
    history: &ElectionHistory,
    shared: &SharedLeaders,
    end: tokio::time::Instant,
) -> ElectionClient {
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = client_with(&proxy.url(), ELECTION_LEASE).await;
    let observed = ObservedChanges::default();
    let tasks = vec![
        tokio::spawn(election_observer(
            client.clone(),
            name.to_owned(),
            observed.clone(),
            end,
        )),
        tokio::spawn(election_candidate(
            process,
            client.clone(),
            name.to_owned(),
            history.clone(),
            shared.clone(),
            end,
        )),
        tokio::spawn(election_reader(
            process + 100,
            client,
            name.to_owned(),
            history.clone(),
            end,
        )),
    ];
    ElectionClient {
        proxy,
        tasks,
        observed,
    }
}

/// One election run with `fault` injected once the candidates are under way: three candidates
/// (each also reading the leader), the history checked against `LeadershipSpec` (at most one
/// leader at any instant, terms strictly increasing, `leader()` only while the leader's hold is
/// live) and for stalls outside the fault's window (the fault plus one lease). Returns the
/// figures and the terms seen.
async fn election_run(
    server: &mut lockkit_testkit::RedisServer,
    fault: ElectionFault,
    secs: u64,
) -> (
    history::Figures,
    Vec<(u64, u64, u64)>,
    (u64, u64),
    Vec<String>,
) {
    let name = unique(&format!("election-{fault:?}"));
    let history = ElectionHistory::new();
    let shared = SharedLeaders::default();
    let end = tokio::time::Instant::now() + Duration::from_secs(secs);
    let mut clients = Vec::new();
    for p in 0..3 {
        clients.push(election_client(server, p, &name, &history, &shared, end).await);
    }
    tokio::time::sleep(Duration::from_secs(secs) / 3).await;
    // The fault.
    let started = now();
    match fault {
        ElectionFault::KillLeader | ElectionFault::CutLeader => {
            let leader = within(HANG, "a leader to fault", async {
                loop {
                    if let Some((process, _)) = leaders(&shared).current.clone() {
                        return process;
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            })
            .await;
            let victim = &mut clients[leader as usize];
            victim.proxy.block();
            {
                // Its leaderships (the one it had, or the next it took before the block) may
                // lapse.
                let mut leaders = leaders(&shared);
                let theirs: Vec<String> = leaders
                    .all
                    .iter()
                    .filter(|(h, (_, _, to))| {
                        h.starts_with(&format!("p{leader}-")) && *to >= started
                    })
                    .map(|(h, _)| h.clone())
                    .collect();
                leaders.lapsed.extend(theirs);
            }
            if fault == ElectionFault::KillLeader {
                for task in victim.tasks.drain(..) {
                    task.abort();
                    let _ = within(HANG, "a killed task", task).await;
                }
                // What it had in flight may have run, or not.
                let in_flight = leaders(&shared).in_flight.remove(&leader);
                if let Some((call, may_have)) = in_flight {
                    history.abandon(call, may_have);
                }
                // A replacement pod joins the election.
                clients.push(election_client(server, 3, &name, &history, &shared, end).await);
            } else {
                tokio::time::sleep(ELECTION_LEASE * 2).await;
                clients[leader as usize].proxy.unblock();
            }
        }
        ElectionFault::PauseServer => {
            server.pause().unwrap();
            tokio::time::sleep(ELECTION_LEASE / 2).await;
            server.resume().unwrap();
        }
        ElectionFault::Restart => server.restart_empty().await.unwrap(),
        ElectionFault::FlushAndPause => {
            let flushed = server.command(&["SCRIPT", "FLUSH"]).await.unwrap();
            assert!(!flushed.is_error(), "SCRIPT FLUSH: {flushed:?}");
            server.pause().unwrap();
            tokio::time::sleep(ELECTION_LEASE / 2).await;
            server.resume().unwrap();
        }
    }
    let window = (started, now() + (ELECTION_LEASE * 2).as_nanos() as u64);
    let observed: Vec<ObservedChanges> = clients.iter().map(|c| c.observed.clone()).collect();
    for client in clients {
        for task in client.tasks {
            match within(HANG, "an election client", task).await {
                Ok(()) => {}
                Err(err) if err.is_cancelled() => {}
                Err(err) => panic!("an election task failed: {err}"),
            }
        }
        drop(client.proxy);
    }
    // Leaderships that the history shows may have lapsed (reported lost, a proclaim or resign
    // that answered NotHeld or failed, a campaign that failed), and the faulted leader's: every
    // other one lived until its resign, and keeps the others out until then. (Every leadership
    // ends with a resign but the killed leader's, so one that a fault ended shows it.)
    // Waiting while such a leadership may still have kept its lease is no stall: its life plus
    // one lease is excluded from the stall measure, as the fault's window is.
    let leaders = leaders(&shared);
    let mut excluded = vec![window];
    let lease = ELECTION_LEASE.as_nanos() as u64;
    for (hold, (call, from, to)) in &leaders.all {
        if leaders.lapsed.contains(hold) {
            excluded.push((*from, to.saturating_add(lease)));
            history.amend(*call, |op| {
                if let ElectionOp::Campaign { may_lapse, .. } = op {
                    *may_lapse = true;
                }
            });
        }
    }
    let figures = history::examine_history(
        &history,
        |_| LeadershipSpec::new(),
        |op| matches!(op, ElectionOp::Campaign { .. }).then_some(ElectionRet::Elected(u64::MAX)),
        history::BOUND_NS,
        &excluded,
    );
    let terms = history
        .operations()
        .into_iter()
        .filter_map(|op| match (op.op, op.outcome) {
            (
                ElectionOp::Campaign { .. },
                lockkit_suite::linearizability::Outcome::Returned {
                    at,
                    ret: ElectionRet::Elected(term),
                },
            ) => Some((op.call, at, term)),
            _ => None,
        })
        .collect::<Vec<_>>();
    // Exact terms only when every campaign's outcome is known (none failed, none pending).
    let exact = history.operations().iter().all(|op| {
        !matches!(op.op, ElectionOp::Campaign { .. })
            || matches!(
                op.outcome,
                lockkit_suite::linearizability::Outcome::Returned { ref ret, .. }
                    if *ret != ElectionRet::Error
            )
    });
    let elected: Vec<u64> = terms.iter().map(|t: &(u64, u64, u64)| t.2).collect();
    let changes: usize = observed
        .iter()
        .map(|o| {
            o.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .len()
        })
        .sum();
    println!(
        "ELECTION {fault:?}: {changes} changes delivered to {} observers",
        observed.len()
    );
    let observers = observer_violations(&observed, &elected, exact);
    (figures, terms, window, observers)
}

/// Terms never repeat, and a leader elected after another was elected has the greater term
/// (by the recorded intervals: campaign A returned before campaign B was invoked).
fn term_order_violations(terms: &[(u64, u64, u64)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for (_, _, term) in terms {
        if !seen.insert(*term) {
            found.push(format!("term {term} handed out twice"));
        }
    }
    for a in terms {
        for b in terms {
            if a.1 < b.0 && a.2 >= b.2 {
                found.push(format!("term {} elected after term {}", b.2, a.2));
            }
        }
    }
    found
}

/// Candidates campaign, proclaim, resign and read the leader in a loop while a fault runs (the
/// leader killed, the server paused, the leader's connection cut for longer than its lease,
/// Redis restarted empty, the script cache emptied and then the server paused); each run's
/// history is checked: linearizable against the reference
/// model (`LeadershipSpec`: at most one leader at any instant, terms strictly increasing,
/// `leader()` reports only a live leadership, a non-leader's proclaim changes nothing), terms
/// unique and increasing in real-time order, and no candidate left waiting while it could have
/// led, outside the fault's window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn election_histories_under_faults_are_linearizable_and_never_stall() {
    let mut server = spawned().await;
    let secs = (history_secs() / 2).max(3);
    let mut record = Record::new("history-election", &name_of_test());
    let mut failures = String::new();
    let mut total = history::Figures::default();
    for fault in [
        ElectionFault::KillLeader,
        ElectionFault::PauseServer,
        ElectionFault::CutLeader,
        ElectionFault::Restart,
        ElectionFault::FlushAndPause,
    ] {
        let (figures, terms, window, observers) = election_run(&mut server, fault, secs).await;
        for violation in observers {
            failures.push_str(&format!("{fault:?}: {violation}\n"));
        }
        history::report(&format!("election ({fault:?})"), &figures);
        println!(
            "ELECTION {fault:?}: {} leaderships, fault window {window:?}",
            terms.len()
        );
        if figures.violations + figures.stalls + figures.unknown > 0 {
            failures.push_str(&format!("{fault:?}:\n{}", figures.explain));
        }
        for violation in term_order_violations(&terms) {
            failures.push_str(&format!("{fault:?}: {violation}\n"));
        }
        if terms.len() < 2 {
            failures.push_str(&format!("{fault:?}: only {} leaderships\n", terms.len()));
        }
        total.histories += figures.histories;
        total.operations += figures.operations;
        total.longest = total.longest.max(figures.longest);
        total.violations += figures.violations;
        total.unknown += figures.unknown;
        total.stalls += figures.stalls;
        total.longest_stall_ms = total.longest_stall_ms.max(figures.longest_stall_ms);
    }
    record = history::to_record(record, "election", &total);
    record.save();
    assert!(failures.is_empty(), "{failures}");
}
