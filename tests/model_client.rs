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
//! - **time** (`a_multi_locks_unused_reservation_goes_on_to_the_next_waiter`): a release reserves
//!   a member for a waiting multi-lock that cannot use it yet; the member must go on to the next
//!   waiter at once, before that waiter's own next keep-alive retry is due.
//! - **outages** (`unbounded_waits_keep_their_outage_bound`): every unbounded wait of the guide's
//!   "Bounds" table at once, on held objects, with Redis killed or frozen a generated time into
//!   the wait: each must return before the holder's lease would have ended, not only when it
//!   looks again then.
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
    Expirable(lockkit::ExpirablePermit),
    Leader(lockkit::Leadership),
}

impl Held {
    async fn let_go(self) -> Result<(), lockkit::Error> {
        match self {
            Held::Guard(guard) => guard.unlock().await,
            Held::Permit(permit) => permit.release().await,
            Held::Expirable(permit) => permit.release().await,
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
                .map(|guard| Held::Guard(guard.into())),
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
    let cases = cases_scaled(3);
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

// === outages: every unbounded wait keeps its bound ===

/// The unbounded waits of the guide's "Bounds" table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    Lock,
    FairLock,
    FencedLock,
    Semaphore,
    ExpirableSemaphore,
    Read,
    Write,
    Latch,
    Campaign,
    MultiLock,
}

const WAITS: [Wait; 10] = [
    Wait::Lock,
    Wait::FairLock,
    Wait::FencedLock,
    Wait::Semaphore,
    Wait::ExpirableSemaphore,
    Wait::Read,
    Wait::Write,
    Wait::Latch,
    Wait::Campaign,
    Wait::MultiLock,
];

/// How Redis goes away while the calls wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `SIGKILL`: every connection closes.
    Kill,
    /// `SIGSTOP`: the connections stay open, nothing answers.
    Freeze,
}

/// The holder's fixed lease: the waits under test must not learn of the outage only when it
/// ends (they then look again, and fail a command timeout later).
const HOLDER_LEASE: Duration = Duration::from_secs(8);

/// The holder takes what `wait` waits for (a latch: sets it, never to count down); what it
/// holds is dropped after the case.
async fn block(env: &Env, wait: Wait, name: &str) -> Result<Option<Held>, String> {
    let holder = &env.holder;
    let lease = Some(HOLDER_LEASE);
    let held = match wait {
        Wait::Latch => {
            let set = holder
                .count_down_latch(name.to_owned())
                .try_set_count(1)
                .await;
            return match set {
                Ok(true) => Ok(None),
                other => Err(format!("the latch was not set: {other:?}")),
            };
        }
        Wait::ExpirableSemaphore => {
            let semaphore = holder
                .permit_expirable_semaphore(name.to_owned())
                .with_permits(1)
                .map_err(|e| e.to_string())?;
            let permit = semaphore
                .try_acquire(Duration::ZERO, HOLDER_LEASE)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("the expirable semaphore was not free")?;
            Some(Held::Expirable(permit))
        }
        Wait::MultiLock => holder
            .lock(format!("{name}:0"))
            .try_lock(Duration::ZERO, lease)
            .await
            .map_err(|e| e.to_string())?
            .map(Held::Guard),
        Wait::Lock => holder
            .lock(name)
            .try_lock(Duration::ZERO, lease)
            .await
            .map_err(|e| e.to_string())?
            .map(Held::Guard),
        Wait::FairLock => holder
            .fair_lock(name)
            .try_lock(Duration::ZERO, lease)
            .await
            .map_err(|e| e.to_string())?
            .map(Held::Guard),
        Wait::FencedLock => holder
            .fenced_lock(name)
            .try_lock(Duration::ZERO, lease)
            .await
            .map_err(|e| e.to_string())?
            .map(|guard| Held::Guard(guard.into())),
        Wait::Semaphore => holder
            .semaphore(name)
            .with_permits(1)
            .map_err(|e| e.to_string())?
            .try_acquire(1, Duration::ZERO, lease)
            .await
            .map_err(|e| e.to_string())?
            .map(Held::Permit),
        Wait::Read | Wait::Write => holder
            .read_write_lock(name)
            .try_write_lock(Duration::ZERO, lease)
            .await
            .map_err(|e| e.to_string())?
            .map(Held::Guard),
        Wait::Campaign => holder
            .election(name)
            .try_campaign("the holder", Duration::ZERO, lease)
            .await
            .map_err(|e| e.to_string())?
            .map(Held::Leader),
    };
    held.map(Some)
        .ok_or_else(|| format!("{wait:?}: the holder did not get the object"))
}

/// `a`'s unbounded wait for `wait`'s object: `Ok` with what it got, or its error.
async fn unbounded(a: Client, wait: Wait, name: String) -> Result<&'static str, lockkit::Error> {
    match wait {
        Wait::Lock => a.lock(name).lock().await.map(|_| "held"),
        Wait::FairLock => a.fair_lock(name).lock().await.map(|_| "held"),
        Wait::FencedLock => a.fenced_lock(name).lock().await.map(|_| "held"),
        Wait::Semaphore => a
            .semaphore(name)
            .with_permits(1)?
            .acquire(1)
            .await
            .map(|_| "held"),
        Wait::ExpirableSemaphore => a
            .permit_expirable_semaphore(name)
            .with_permits(1)?
            .acquire(LEASE)
            .await
            .map(|_| "held"),
        Wait::Read => a.read_write_lock(name).read_lock().await.map(|_| "held"),
        Wait::Write => a.read_write_lock(name).write_lock().await.map(|_| "held"),
        Wait::Latch => a
            .count_down_latch(name)
            .wait(Duration::MAX)
            .await
            .map(|open| if open { "open" } else { "timed out" }),
        Wait::Campaign => a.election(name).campaign("a").await.map(|_| "leads"),
        Wait::MultiLock => {
            let locks = (0..2).map(|i| a.lock(format!("{name}:{i}")));
            a.multi_lock(locks).lock().await.map(|_| "held")
        }
    }
}

/// Every unbounded wait at once, Redis gone `after_ms` into them: each must return (an error,
/// as the guide's "Bounds" table says: after the command timeout) before the holder's lease
/// would have ended, not a command timeout after it.
async fn outage(env: &mut Env, fault: Fault, after_ms: u64) -> Result<(), String> {
    let mut names = Vec::new();
    let mut blockers = Vec::new();
    for wait in WAITS {
        let name = unique("outage");
        blockers.push(block(env, wait, &name).await?);
        names.push(name);
    }
    let held_at = tokio::time::Instant::now();
    let calls: Vec<_> = WAITS
        .iter()
        .zip(&names)
        .map(|(wait, name)| {
            let (a, wait, name) = (env.a.clone(), *wait, name.clone());
            tokio::spawn(async move {
                let out = unbounded(a, wait, name).await;
                (wait, out, tokio::time::Instant::now())
            })
        })
        .collect();
    lockkit_suite::until_waiting(&env.a, WAITS.len()).await;
    tokio::time::sleep(Duration::from_millis(after_ms)).await;
    let faulted = tokio::time::Instant::now();
    match fault {
        Fault::Kill => env.server.kill(),
        Fault::Freeze => env.server.pause().map_err(|e| e.to_string())?,
    }
    let mut late = Vec::new();
    for call in calls {
        let (wait, out, at) = within(HANG, "a wait under the outage", call)
            .await
            .map_err(|e| e.to_string())?;
        let took = at - faulted;
        if at >= held_at + HOLDER_LEASE {
            late.push(format!(
                "{wait:?} returned {} {took:?} after Redis was {} ({} ms into the wait), past the end of the holder's {HOLDER_LEASE:?} lease: it learnt of the outage only when it looked again",
                match &out {
                    Ok(what) => (*what).to_owned(),
                    Err(e) => format!("Err({e})"),
                },
                match fault {
                    Fault::Kill => "killed",
                    Fault::Freeze => "frozen",
                },
                after_ms
            ));
        }
    }
    match fault {
        Fault::Kill => env.server.start_again().await.map_err(|e| e.to_string())?,
        Fault::Freeze => env.server.resume().map_err(|e| e.to_string())?,
    }
    drop(blockers);
    // Every client is back before the next case.
    for client in [&env.a, &env.holder, &env.other] {
        within(HANG, "the clients to reconnect", async {
            while client.lock("ping").is_locked().await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
    }
    if late.is_empty() {
        Ok(())
    } else {
        Err(format!("issue 27 item 11:\n{}", late.join("\n")))
    }
}

/// Outages (issue 27, item 11): the locks, the fair lock, both semaphores, the read-write lock,
/// the latch, a campaign and a multi-lock, each waiting without bound on a held object, with
/// Redis killed or frozen a generated time into the wait; each wait must learn of the outage
/// within its own bound (well within the holder's 8 s lease, with a 500 ms command timeout), not
/// only when it looks again at the lease's end.
#[test]
fn unbounded_waits_keep_their_outage_bound() {
    let mut env = Env::start(Some(COMMAND_TIMEOUT));
    let cases = cases_scaled(2);
    let (mut runner, seed) = runner(cases, 0);
    let strategy = (
        prop_oneof![Just(Fault::Kill), Just(Fault::Freeze)],
        100u64..600,
    );
    let env = std::cell::RefCell::new(&mut env);
    let result = runner.run(&strategy, |(fault, after_ms)| {
        let mut env = env.borrow_mut();
        let rt = env.rt.handle().clone();
        rt.block_on(outage(&mut env, fault, after_ms))
            .map_err(|why| TestCaseError::fail(format!("{fault:?} {after_ms} ms in: {why}")))
    });
    match result {
        Ok(()) => eprintln!("outage bounds: {cases} cases passed (seed {seed})"),
        Err(TestError::Fail(why, _)) => {
            panic!("outage bounds: FAILED (LOCKKIT_MODEL_SEED={seed}).\n{why}")
        }
        Err(TestError::Abort(why)) => panic!("aborted (seed {seed}): {why}"),
    }
}

// === time: a multi-lock's reservation that it cannot use goes on ===

/// A multi-lock waits for `members` locks, all held; a plain waiter waits on member `released`
/// behind it; the holder releases that member (the others stay held). The release reserves it
/// for the multi-lock (whose requests only look); the multi-lock cannot use it yet. The member
/// must then go on to the plain waiter at once, as `MultiLock`'s rustdoc says, not at the
/// waiter's next keep-alive retry (issue 27, item 9).
async fn reservation(env: &Env, members: usize, released: usize) -> Result<(), String> {
    let name = unique("reserved");
    let names: Vec<String> = (0..members).map(|i| format!("{name}:{i}")).collect();
    let keys: Vec<ObjectKeys> = names.iter().map(|n| Prim::Lock.keys(n)).collect();
    let mut held = Vec::new();
    for n in &names {
        let guard = env
            .holder
            .lock(n.clone())
            .try_lock(Duration::ZERO, Some(LONG))
            .await
            .map_err(|e| e.to_string())?
            .ok_or("the holder did not get a member")?;
        held.push(Some(guard));
    }
    let (a, other) = (env.a.id().to_owned(), env.other.id().to_owned());
    let in_line = |id: String, keys: ObjectKeys| async move {
        within(HANG, "a waiter to stand in line", async {
            loop {
                let (raw, _) = read_state(&env.redis, &keys.keys).await;
                if let Some(t) = traces(&keys, &raw, &id)
                    .into_iter()
                    .find(|t| t.role == "timeouts")
                {
                    return t.deadline;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
        .await
    };
    let locks: Vec<lockkit::Lock> = names.iter().map(|n| env.a.lock(n.clone())).collect();
    let multi = env.a.multi_lock(locks);
    let multi = tokio::spawn(async move { multi.try_lock(WAIT, Some(LONG)).await });
    in_line(a.clone(), keys[released].clone()).await;
    // Less than the probation: a grant's hold and a take's end alike at the start plus it.
    let lease_ms = 4_000;
    let waiter = env.other.lock(names[released].clone());
    let waiter = tokio::spawn(async move {
        waiter
            .try_lock(WAIT, Some(Duration::from_millis(lease_ms)))
            .await
    });
    // Right after its try: its next one is due a third of the keep-alive later; and the
    // multi-lock's own next try (whichever comes first would find the lapsed reservation and
    // hand the member on). Their last tries are when their deadlines were last pushed.
    let deadline = in_line(other.clone(), keys[released].clone()).await;
    let keepalive = lockkit::protocol::lock::WAITER_KEEPALIVE.as_millis() as u64;
    let (raw, _) = read_state(&env.redis, &keys[released].keys).await;
    let last_try = traces(&keys[released], &raw, &a)
        .into_iter()
        .chain(traces(&keys[released], &raw, &other))
        .filter(|t| t.role == "timeouts")
        .map(|t| t.deadline)
        .min()
        .unwrap_or(deadline)
        .min(deadline)
        - keepalive;
    let retry_due = last_try + keepalive / 3;
    if let Some(guard) = held[released].take() {
        guard.unlock().await.map_err(|e| e.to_string())?;
    }
    let guard = within(HANG, "the plain waiter", waiter)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("the plain waiter failed: {e}"))?
        .ok_or("the plain waiter did not get the member")?;
    let (raw, _) = read_state(&env.redis, &keys[released].keys).await;
    let taken = traces(&keys[released], &raw, &other)
        .into_iter()
        .find(|t| t.role == "main")
        .map(|t| t.deadline - lease_ms)
        .ok_or("the plain waiter's hold is not in the member's key")?;
    let verdict = if taken >= retry_due {
        Err(format!(
            "issue 27 item 9: member {released} of {members}, released right after its waiters' tries, went to the plain waiter {} ms after the earlier of them, at a waiter's next retry (due {} ms after it): the multi-lock's reservation lapsed and nobody was told",
            taken + 1 - last_try,
            keepalive / 3
        ))
    } else {
        Ok(())
    };
    // Everyone lets go; the multi-lock then gets them all.
    guard.unlock().await.map_err(|e| e.to_string())?;
    for guard in held.into_iter().flatten() {
        guard.unlock().await.map_err(|e| e.to_string())?;
    }
    let all = within(HANG, "the multi-lock", multi)
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?
        .ok_or("the multi-lock did not get its members")?;
    all.unlock().await.map_err(|e| e.to_string())?;
    verdict
}

/// Time (issue 27, item 9): a multi-lock's reservation of a member it cannot use yet goes on to
/// the next waiter at once. Generated: how many members, which one is released.
#[test]
fn a_multi_locks_unused_reservation_goes_on_to_the_next_waiter() {
    let env = Env::start(None);
    let cases = cases_scaled(3);
    let (mut runner, seed) = runner(cases, 0);
    let strategy = (2usize..4).prop_flat_map(|members| (Just(members), 0..members));
    let result = runner.run(&strategy, |(members, released)| {
        env.rt
            .block_on(reservation(&env, members, released))
            .map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => eprintln!("multi-lock reservations: {cases} cases passed (seed {seed})"),
        Err(TestError::Fail(why, (members, released))) => panic!(
            "multi-lock reservations: FAILED (LOCKKIT_MODEL_SEED={seed}), {members} members, member {released} released.\n{why}"
        ),
        Err(TestError::Abort(why)) => panic!("aborted (seed {seed}): {why}"),
    }
}
