//! Generated client-level programs (issue 27, §4): what the script-level models cannot see, run
//! through real `lockkit::Client`s on a real `redis-server`, and judged against the server's own
//! state (every key of the object, read at one instant with the server's clock).
//!
//! - **dropped futures** (`dropped_acquires_*`): acquires of `Lock`, `FairLock`, `FencedLock`,
//!   `Semaphore`, `ReadWriteLock` (read and write) and `Election::campaign`, on free or taken
//!   objects, polled a generated number of times (each poll when the future is woken, so it stops
//!   at one of its await points) and then dropped, inside the runtime or moved to a plain thread
//!   and dropped there, outside any runtime. Then nothing of the dropping client may stay in the
//!   object's keys past its own deadline: a place in line (waiting set, fair queue) must go
//!   before its keep-alive deadline runs out, and anything held before its lease ends (the guide:
//!   "a call that gives up (timeout, dropped future, shutdown) leaves the set at once"). And once
//!   the holder lets go, another waiter gets the object.
//! - **time** (`granted_fixed_lease_ends_at_grant_plus_lease`): a fixed lease longer than the
//!   grant's probation, granted by a release (direct grant) to a waiting `Lock`, `FencedLock` and
//!   `Election` campaign: the client confirms it at half the probation, and the hold must then end
//!   when it was granted plus the lease (`#[locked(lease = …)]` and "fixed lease, no renewal" mean
//!   the lease asked for, counted from when the hold began), read from the grant message's own
//!   `now` and the hold's expiry in the main key.
//! - **outages** (`a_try_cut_off_by_a_frozen_server_leaves_nothing_held`): a waiting try whose
//!   retry is written into a server frozen with `SIGSTOP` after `SCRIPT FLUSH` (the cache of a
//!   fresh, restarted or failed-over server), cut off by the command timeout; the server resumes
//!   and runs it. Whatever it took must be given back before its lease ends.
//!
//! Budget: `LOCKKIT_MODEL_CASES` scales the case counts (`lockkit_suite::model_io::cases_scaled`);
//! `LOCKKIT_MODEL_SEED` replays a run. These read `PEXPIRETIME` (Redis 7.0+, like the other
//! model tests).

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::Client;
use lockkit_suite::checker::model_seed;
use lockkit_suite::model_io::{cases_scaled, read_state, RawKey};
use lockkit_suite::{raw, spawned, unique, within, RedisServer};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// The lease the dropping client asks for: whatever it may have taken lapses after it.
const LEASE: Duration = Duration::from_secs(10);
/// A hold that outlives any program.
const LONG: Duration = Duration::from_secs(60);
/// How long a waiting call may wait: longer than any program.
const WAIT: Duration = Duration::from_secs(30);
/// A hang guard, far above every bound a check relies on.
const HANG: Duration = Duration::from_secs(60);

// === the environment ===

struct Env {
    rt: tokio::runtime::Runtime,
    server: RedisServer,
    redis: fred::clients::Client,
    /// The client whose calls are cut short.
    a: Client,
    /// Holds the objects while `a` waits.
    holder: Client,
    /// The next waiter, after `a` gave up.
    other: Client,
    /// How often each kind of case came up (printed at the end: what was covered).
    seen: std::sync::Mutex<std::collections::BTreeMap<String, u64>>,
}

impl Env {
    fn start(command_timeout: Option<Duration>) -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (server, redis, a, holder, other) = rt.block_on(async {
            let server = spawned().await;
            let url = server.url();
            let redis = raw(&url).await;
            let mut builder = Client::builder().url(url.clone());
            if let Some(timeout) = command_timeout {
                builder = builder.command_timeout(timeout);
            }
            let a = builder.build().await.expect("client a");
            let holder = lockkit_suite::client(&url).await;
            let other = lockkit_suite::client(&url).await;
            (server, redis, a, holder, other)
        });
        Env {
            rt,
            server,
            redis,
            a,
            holder,
            other,
            seen: std::sync::Mutex::default(),
        }
    }

    fn count(&self, what: String) {
        if let Ok(mut seen) = self.seen.lock() {
            *seen.entry(what).or_default() += 1;
        }
    }
}

/// The runner: `cases` cases, the seed from `LOCKKIT_MODEL_SEED` or a fresh one; few shrink
/// iterations (a failing case waits on real time: a keep-alive, a lease).
fn runner(cases: u32, max_shrink_iters: u32) -> (TestRunner, u64) {
    let seed = model_seed();
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters,
        ..Config::default()
    };
    (TestRunner::new(config), seed)
}

// === the primitives ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prim {
    Lock,
    FairLock,
    FencedLock,
    Semaphore,
    Read,
    Write,
    Campaign,
}

impl Prim {
    fn kind(self) -> Kind {
        match self {
            Prim::Lock => Kind::Lock,
            Prim::FairLock => Kind::FairLock,
            Prim::FencedLock => Kind::FencedLock,
            Prim::Semaphore => Kind::Semaphore,
            Prim::Read | Prim::Write => Kind::ReadWriteLock,
            Prim::Campaign => Kind::Election,
        }
    }

    fn keys(self, name: &str) -> ObjectKeys {
        Namespace::default()
            .object(self.kind(), name)
            .expect("valid keys")
    }
}

/// Whatever an acquire gave.
enum Held {
    Guard(lockkit::LockGuard),
    Permit(lockkit::SemaphorePermit),
    Leader(lockkit::Leadership),
}

impl Held {
    async fn let_go(self) -> Result<(), lockkit::Error> {
        match self {
            Held::Guard(guard) => guard.unlock().await,
            Held::Permit(permit) => permit.release().await,
            Held::Leader(leadership) => leadership.resign().await,
        }
    }
}

type Acquire = Pin<Box<dyn Future<Output = Result<Option<Held>, lockkit::Error>> + Send>>;

/// `client`'s acquire of `prim`'s object `name`: waiting up to `wait`, for a fixed `lease`.
fn acquire(client: &Client, prim: Prim, name: &str, wait: Duration, lease: Duration) -> Acquire {
    let client = client.clone();
    let name = name.to_owned();
    let lease = Some(lease);
    Box::pin(async move {
        Ok(match prim {
            Prim::Lock => client
                .lock(name)
                .try_lock(wait, lease)
                .await?
                .map(Held::Guard),
            Prim::FairLock => client
                .fair_lock(name)
                .try_lock(wait, lease)
                .await?
                .map(Held::Guard),
            Prim::FencedLock => client
                .fenced_lock(name)
                .try_lock(wait, lease)
                .await?
                .map(Held::Guard),
            Prim::Semaphore => client
                .semaphore(name)
                .with_permits(1)?
                .try_acquire(1, wait, lease)
                .await?
                .map(Held::Permit),
            Prim::Read => client
                .read_write_lock(name)
                .try_read_lock(wait, lease)
                .await?
                .map(Held::Guard),
            Prim::Write => client
                .read_write_lock(name)
                .try_write_lock(wait, lease)
                .await?
                .map(Held::Guard),
            Prim::Campaign => client
                .election(name)
                .try_campaign(format!("{} leads", client.id()), wait, lease)
                .await?
                .map(Held::Leader),
        })
    })
}

/// The holder takes the object so that `prim`'s acquire waits (a reader waits for a writer).
async fn take(env: &Env, prim: Prim, name: &str) -> Held {
    let prim = if prim == Prim::Read {
        Prim::Write
    } else {
        prim
    };
    acquire(&env.holder, prim, name, Duration::ZERO, LONG)
        .await
        .expect("no error")
        .expect("a free object")
}

// === what a client left in the object's keys ===

/// Something of one client in an object's keys: where, and when it ends on its own (server ms).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Trace {
    role: String,
    item: String,
    deadline: u64,
}

/// A time in server ms (not a count, not a µs score).
fn as_ms(n: &str) -> Option<u64> {
    n.parse::<u64>()
        .ok()
        .filter(|n| (1_000_000_000_000..10_000_000_000_000).contains(n))
}

/// What of client `id` the object's keys hold, each with its own deadline: a hold (a main hash
/// field `<marker> = <expiry> <owner>`, or a marker whose expiry a ZSET keeps), a place in line
/// (a waiting set's or fair queue's entry, whose deadline the timeouts ZSET keeps), a reservation
/// (the handoff key, until it expires). Fields and values without a deadline of their own (an
/// owner's count, the leader record) go with those.
fn traces(keys: &ObjectKeys, raw: &[RawKey], id: &str) -> Vec<Trace> {
    let roles: Vec<&str> = std::iter::once("main")
        .chain(keys.suffixes.iter().copied())
        .collect();
    // Every ZSET member's score that is a time in ms, whichever key keeps it.
    let mut scores = std::collections::BTreeMap::new();
    for k in raw.iter().filter(|k| k.ty == "zset") {
        for pair in k.items.chunks(2) {
            if let Some(at) = pair.get(1).and_then(|s| as_ms(s)) {
                scores.insert(pair[0].clone(), at);
            }
        }
    }
    let mut found = Vec::new();
    for (k, role) in raw.iter().zip(&roles) {
        let mut note = |item: &str, deadline: Option<u64>| {
            if let Some(deadline) = deadline {
                found.push(Trace {
                    role: (*role).to_owned(),
                    item: item.to_owned(),
                    deadline,
                });
            }
        };
        match k.ty.as_str() {
            "hash" => {
                for pair in k.items.chunks(2) {
                    let (field, value) = (&pair[0], pair.get(1).cloned().unwrap_or_default());
                    if field.contains(id) || value.contains(id) {
                        let own = value.split(' ').next().and_then(as_ms);
                        note(field, own.or_else(|| scores.get(field).copied()));
                    }
                }
            }
            "zset" => {
                for pair in k.items.chunks(2) {
                    if pair[0].contains(id) {
                        note(&pair[0], scores.get(&pair[0]).copied());
                    }
                }
            }
            "list" => {
                for item in k.items.iter().filter(|item| item.contains(id)) {
                    note(item, scores.get(item).copied());
                }
            }
            "string" if *role != "token" && k.items.iter().any(|item| item.contains(id)) => {
                note(&k.items.join(" "), u64::try_from(k.expire_at).ok());
            }
            _ => {}
        }
    }
    found
}

/// Waits until nothing of client `id` is left in the object's keys; `Err` when something stays
/// there until its own deadline (it lapsed instead of being given back): seen at or past it, or
/// gone only once it had passed. `Ok`: the roles it was first seen in.
async fn until_gone(
    redis: &fred::clients::Client,
    keys: &ObjectKeys,
    id: &str,
) -> Result<Vec<String>, String> {
    within(HANG, "the client's traces to go", async {
        let mut last: Vec<Trace> = Vec::new();
        let mut first: Option<Vec<String>> = None;
        loop {
            let (raw, now) = read_state(redis, &keys.keys).await;
            let left = traces(keys, &raw, id);
            let lapsed = left
                .iter()
                .find(|t| t.deadline <= now)
                .or_else(|| last.iter().find(|t| !left.contains(t) && t.deadline <= now));
            if let Some(stale) = lapsed {
                return Err(format!(
                    "{stale:?} stayed in the keys until its own deadline (read {} ms after it): it was not given back",
                    now - stale.deadline
                ));
            }
            let roles = first.get_or_insert_with(|| {
                let mut roles: Vec<String> = left.iter().map(|t| t.role.clone()).collect();
                roles.dedup();
                roles
            });
            if left.is_empty() {
                return Ok(roles.clone());
            }
            last = left;
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

// === dropped futures ===

/// One acquire cut short: polled when woken, at most `polls` times and for at most `for_ms`,
/// then dropped (with whatever it returned).
#[derive(Debug, Clone)]
struct Cut {
    prim: Prim,
    /// The object is held by another client: the acquire waits.
    contended: bool,
    polls: usize,
    for_ms: u64,
}

fn cut() -> impl Strategy<Value = Cut> {
    (
        prop_oneof![
            Just(Prim::Lock),
            Just(Prim::FairLock),
            Just(Prim::FencedLock),
            Just(Prim::Semaphore),
            Just(Prim::Read),
            Just(Prim::Write),
            Just(Prim::Campaign),
        ],
        prop::bool::weighted(0.7),
        1usize..12,
        prop_oneof![0u64..10, 10u64..60],
    )
        .prop_map(|(prim, contended, polls, for_ms)| Cut {
            prim,
            contended,
            polls,
            for_ms,
        })
}

/// Polls `fut` each time it is woken, at most `polls` times, for at most `for_ms`: its output
/// if it finished.
async fn poll_some<F: Future + Unpin>(fut: &mut F, polls: usize, for_ms: u64) -> Option<F::Output> {
    let mut left = polls;
    let stop = tokio::time::sleep(Duration::from_millis(for_ms));
    tokio::pin!(stop);
    std::future::poll_fn(|cx| {
        if left == 0 || stop.as_mut().poll(cx).is_ready() {
            return Poll::Ready(None);
        }
        left -= 1;
        Pin::new(&mut *fut).poll(cx).map(Some)
    })
    .await
}

/// Runs one program of cut-short acquires; `off_runtime`: each future (and anything it gave) is
/// dropped on a plain thread, outside any runtime.
async fn dropped(env: &Env, cuts: &[Cut], off_runtime: bool) -> Result<(), String> {
    let id = env.a.id().to_owned();
    for (i, cut) in cuts.iter().enumerate() {
        let name = unique("dropped");
        let keys = cut.prim.keys(&name);
        let held = if cut.contended {
            Some(take(env, cut.prim, &name).await)
        } else {
            None
        };
        let mut fut = acquire(&env.a, cut.prim, &name, WAIT, LEASE);
        let out = poll_some(&mut fut, cut.polls, cut.for_ms).await;
        let finished = out.is_some();
        if off_runtime {
            let dropped = std::thread::spawn(move || {
                assert!(tokio::runtime::Handle::try_current().is_err());
                drop(fut);
                drop(out);
            })
            .join();
            if dropped.is_err() {
                return Err("dropping panicked".to_owned());
            }
        } else {
            drop(fut);
            drop(out);
        }
        let place = if off_runtime {
            "outside any runtime"
        } else {
            "inside the runtime"
        };
        let left = until_gone(&env.redis, &keys, &id).await.map_err(|why| {
            let item8 = if off_runtime
                && matches!(
                    cut.prim,
                    Prim::Lock | Prim::FairLock | Prim::FencedLock | Prim::Campaign
                ) {
                "issue 27 item 8 (Drop for Queued cancels only through Handle::try_current): "
            } else {
                ""
            };
            format!(
                "{item8}cut {i}, {cut:?}, dropped {place} ({}): {why}",
                if finished {
                    "after it finished"
                } else {
                    "unfinished"
                }
            )
        })?;
        env.count(format!(
            "{:?} {}, {}",
            cut.prim,
            if finished { "finished" } else { "unfinished" },
            if left.is_empty() {
                "nothing left to give back".to_owned()
            } else {
                format!("gave back {}", left.join("+"))
            }
        ));
        // Once the holder lets go, the next waiter gets the object.
        if let Some(held) = held {
            held.let_go()
                .await
                .map_err(|e| format!("the holder's release: {e}"))?;
        }
        let next = within(
            HANG,
            "the next waiter",
            acquire(&env.other, cut.prim, &name, WAIT, LONG),
        )
        .await
        .map_err(|e| format!("cut {i}: the next waiter failed: {e}"))?
        .ok_or_else(|| format!("cut {i}, {cut:?}: the next waiter did not get the object"))?;
        next.let_go()
            .await
            .map_err(|e| format!("the next waiter's release: {e}"))?;
    }
    Ok(())
}

fn run_dropped(name: &str, off_runtime: bool) {
    let env = Env::start(None);
    let cases = cases_scaled(16);
    let (mut runner, seed) = runner(cases, 4);
    let result = runner.run(&prop::collection::vec(cut(), 1..5), |cuts| {
        env.rt
            .block_on(dropped(&env, &cuts, off_runtime))
            .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => eprintln!(
            "{name}: {cases} cases passed (seed {seed}); {:#?}",
            env.seen.lock().map(|s| s.clone()).unwrap_or_default()
        ),
        Err(TestError::Fail(why, cuts)) => {
            panic!("{name}: FAILED (LOCKKIT_MODEL_SEED={seed}).\nShrunk program: {cuts:#?}\n{why}")
        }
        Err(TestError::Abort(why)) => panic!("{name} aborted (seed {seed}): {why}"),
    }
}

/// Acquire futures dropped inside the runtime, at a generated await point: nothing of theirs
/// stays in line or held, and the next waiter gets the object.
#[test]
fn dropped_acquires_inside_the_runtime_leave_nothing_behind() {
    run_dropped("dropped inside the runtime", false);
}

/// The same futures moved to a plain thread and dropped there, outside any runtime (issue 27,
/// item 8: `Drop for Queued` leaves its place in line only through `Handle::try_current()`, so
/// the entry stays until its keep-alive runs out and a release may grant the lock to it).
#[test]
fn dropped_acquires_outside_any_runtime_leave_nothing_behind() {
    run_dropped("dropped outside any runtime", true);
}

// === time: a granted fixed lease ===

/// How far the granted hold's end may be from its grant plus its lease: the confirmation's
/// round trip and the servers' clock reads, nothing like the 2.5 s of half the probation.
const SLACK_MS: u64 = 250;

/// A fixed lease granted by a release: the hold must end at the grant plus the lease, once the
/// client has confirmed it (issue 27, item 7).
async fn granted_lease(env: &Env, prim: Prim, lease_ms: u64) -> Result<(), String> {
    let name = unique("granted");
    let keys = prim.keys(&name);
    let id = env.a.id().to_owned();
    // The grant message goes to `a`'s own channel for the object: its `now` is the grant's.
    let channel = format!("{}:{id}", keys.channel);
    let subscriber = raw(&env.server.url()).await;
    let mut messages = {
        use fred::interfaces::{EventInterface, PubsubInterface};
        let messages = subscriber.message_rx();
        subscriber
            .subscribe(channel.as_str())
            .await
            .map_err(|e| e.to_string())?;
        messages
    };
    let held = take(env, prim, &name).await;
    let lease = Duration::from_millis(lease_ms);
    let waiting = tokio::spawn(acquire(&env.a, prim, &name, WAIT, lease));
    // `a` stands in line.
    within(HANG, "the waiter to stand in line", async {
        loop {
            let (raw, _) = read_state(&env.redis, &keys.keys).await;
            if traces(&keys, &raw, &id)
                .iter()
                .any(|t| t.role == "timeouts")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await;
    held.let_go()
        .await
        .map_err(|e| format!("the holder's release: {e}"))?;
    let grant = within(HANG, "the grant message", async {
        loop {
            let message = messages.recv().await.expect("a message");
            let payload = message.value.as_string().unwrap_or_default();
            let parts: Vec<&str> = payload.split(':').collect();
            if parts.first() == Some(&"g") {
                return parts.get(3).and_then(|n| n.parse::<u64>().ok());
            }
        }
    })
    .await
    .ok_or("a grant message without its time")?;
    let guard = within(HANG, "the waiter", waiting)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the waiter failed: {e}"))?
        .ok_or("the waiter was not granted the object")?;
    let want = grant + lease_ms;
    // The hold's end, as the main key has it, until it settles at the grant plus the lease (the
    // confirmation at half the probation), or goes past it.
    let verdict = within(HANG, "the granted hold's confirmation", async {
        loop {
            let (raw, now) = read_state(&env.redis, &keys.keys).await;
            let end = traces(&keys, &raw, &id)
                .into_iter()
                .find(|t| t.role == "main")
                .map(|t| t.deadline);
            match end {
                None => return Err(format!("the granted hold is gone at {now} ms")),
                Some(end) if end > want + SLACK_MS => {
                    return Err(format!(
                        "issue 27 item 7: {prim:?} granted at {grant} ms with a fixed lease of {lease_ms} ms now ends at {end} ms, {} ms after the grant plus its lease (the confirmation at half the probation renews to its own now + lease)",
                        end - want
                    ))
                }
                Some(end) if end + SLACK_MS >= want => return Ok(()),
                Some(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await;
    let _ = guard.let_go().await;
    verdict
}

/// Time (issue 27, item 7): `Lock`, `FencedLock` and an `Election` campaign, each waiting with a
/// fixed lease longer than the probation, granted by a release; all cases run at once (each
/// waits half the probation for the client's confirmation).
#[test]
fn granted_fixed_lease_ends_at_grant_plus_lease() {
    let env = Env::start(None);
    let cases = cases_scaled(2);
    let (mut runner, seed) = runner(1, 0);
    let strategy = prop::collection::vec(
        (
            prop_oneof![
                Just(Prim::Lock),
                Just(Prim::FencedLock),
                Just(Prim::Campaign)
            ],
            5_500u64..9_000,
        ),
        (cases * 3) as usize,
    );
    let result = runner.run(&strategy, |programs| {
        let mut all: Vec<(Prim, u64)> = programs.clone();
        // Every primitive at least once.
        for (i, prim) in [Prim::Lock, Prim::FencedLock, Prim::Campaign]
            .into_iter()
            .enumerate()
        {
            all[i].0 = prim;
        }
        let env = &env;
        let verdicts = env.rt.block_on(async {
            futures::future::join_all(all.iter().map(|(prim, lease)| async move {
                (*prim, *lease, granted_lease(env, *prim, *lease).await)
            }))
            .await
        });
        let failed: Vec<String> = verdicts
            .into_iter()
            .filter_map(|(prim, lease, v)| {
                v.err()
                    .map(|why| format!("{prim:?}, lease {lease} ms: {why}"))
            })
            .collect();
        if failed.is_empty() {
            Ok(())
        } else {
            Err(TestCaseError::fail(failed.join("\n")))
        }
    });
    match result {
        Ok(()) => eprintln!(
            "granted fixed leases: {} holds passed (seed {seed})",
            cases * 3
        ),
        Err(TestError::Fail(why, _)) => {
            panic!("granted fixed leases: FAILED (LOCKKIT_MODEL_SEED={seed}).\n{why}")
        }
        Err(TestError::Abort(why)) => panic!("aborted (seed {seed}): {why}"),
    }
}

// === outages: a frozen server with an empty script cache ===

/// One try cut off by a frozen server: the holder's lease (ms) ends while the waiting call's
/// retry goes out; the server is frozen `freeze_at` ms into the wait, for `frozen` ms.
#[derive(Debug, Clone)]
struct Frozen {
    prim: Prim,
    holder_ms: u64,
    freeze_at: u64,
    frozen: u64,
}

fn frozen() -> impl Strategy<Value = Frozen> {
    (
        prop_oneof![
            Just(Prim::Lock),
            Just(Prim::FairLock),
            Just(Prim::FencedLock),
            Just(Prim::Semaphore),
            Just(Prim::Write),
            Just(Prim::Campaign),
        ],
        200u64..400,
        50u64..150,
        1_300u64..2_000,
    )
        .prop_map(|(prim, holder_ms, freeze_at, frozen)| Frozen {
            prim,
            holder_ms,
            freeze_at,
            frozen,
        })
}

/// The command timeout of the client whose try is cut off.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// Its lease: what stays held, if anything, ends after it.
const FROZEN_LEASE: Duration = Duration::from_secs(6);

async fn frozen_try(env: &Env, f: &Frozen) -> Result<(), String> {
    let name = unique("frozen");
    let keys = f.prim.keys(&name);
    let id = env.a.id().to_owned();
    // A fresh (restarted, failed-over) server's empty script cache.
    let flushed = env
        .server
        .command(&["SCRIPT", "FLUSH"])
        .await
        .map_err(|e| e.to_string())?;
    if flushed.is_error() {
        return Err(format!("SCRIPT FLUSH: {flushed:?}"));
    }
    // The holder's hold lapses on its own (it is never released: its release script stays
    // unloaded).
    let prim = if f.prim == Prim::Read {
        Prim::Write
    } else {
        f.prim
    };
    let held = acquire(
        &env.holder,
        prim,
        &name,
        Duration::ZERO,
        Duration::from_millis(f.holder_ms),
    )
    .await
    .map_err(|e| e.to_string())?
    .ok_or("the holder did not get the object")?;
    let call = tokio::spawn(acquire(
        &env.a,
        f.prim,
        &name,
        Duration::from_millis(f.freeze_at + f.frozen + 1_000),
        FROZEN_LEASE,
    ));
    tokio::time::sleep(Duration::from_millis(f.freeze_at)).await;
    env.server.pause().map_err(|e| e.to_string())?;
    tokio::time::sleep(Duration::from_millis(f.frozen)).await;
    env.server.resume().map_err(|e| e.to_string())?;
    let out = within(HANG, "the cut-off call", call)
        .await
        .map_err(|e| e.to_string())?;
    let returned = match &out {
        Ok(Some(_)) => "Ok(held)",
        Ok(None) => "Ok(None)",
        Err(_) => "Err",
    };
    if let Ok(Some(held)) = out {
        let _ = held.let_go().await;
    }
    let verdict = until_gone(&env.redis, &keys, &id)
        .await
        .map(|left| {
            env.count(format!(
                "{:?}: returned {returned}, {}",
                f.prim,
                if left.is_empty() {
                    "nothing left to give back".to_owned()
                } else {
                    format!("gave back {}", left.join("+"))
                }
            ));
        })
        .map_err(|why| {
            format!("issue 27 item 12: the call returned {returned} after the frozen server resumed; {why}")
        });
    // Only now: its release would load the release script.
    drop(held);
    verdict
}

/// Outages (issue 27, item 12): a try cut off while the server was frozen runs when it resumes;
/// with an empty script cache, its give-back goes out as `EVALSHA` and meets `NOSCRIPT`. Nothing
/// may stay held for a whole lease by a client whose call gave up.
#[test]
fn a_try_cut_off_by_a_frozen_server_leaves_nothing_held() {
    let env = Env::start(Some(COMMAND_TIMEOUT));
    let cases = cases_scaled(4);
    let (mut runner, seed) = runner(cases, 0);
    let result = runner.run(&frozen(), |f| {
        env.rt
            .block_on(frozen_try(&env, &f))
            .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => eprintln!(
            "frozen tries: {cases} cases passed (seed {seed}); {:#?}",
            env.seen.lock().map(|s| s.clone()).unwrap_or_default()
        ),
        Err(TestError::Fail(why, f)) => {
            panic!("frozen tries: FAILED (LOCKKIT_MODEL_SEED={seed}).\nShrunk: {f:?}\n{why}")
        }
        Err(TestError::Abort(why)) => panic!("aborted (seed {seed}): {why}"),
    }
}
