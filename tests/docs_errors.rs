//! Error texts as the documentation promises them (issue 29 §2), written from the documentation
//! only: README's "Errors" bullet, the guide's "Errors" and "Bounds while Redis is down", and the
//! rustdoc of `Error`, `ConnectFailure`, `RedisError`, `Client::shutdown` and `ClientBuilder`.
//!
//! The promise: an error's top line (`err.to_string()`) names the object (or the URL / address for
//! connection errors), the operation as the public method the user called (never the script or
//! Redis command run for it), and, for a timeout, which bound ran out and its value. With Redis
//! down, the line says why there is no connection before the bound. The guide's and rustdoc's
//! quoted samples are checked for their shape against what the library prints.
//!
//! Every primitive's main operations are walked against (a) a frozen server (a [`FaultProxy`]
//! that forwards nothing) and (b) a killed server (connections refused), all calls of a fault at
//! once. Timings are never asserted, except the connect timeout's lower bound, which is itself
//! the promise (`TimedOut(spent)`: the time actually spent).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::join_all;
use futures::StreamExt;
use lockkit::{Client, ConnectFailure, Error};
use lockkit_suite::{spawned, unique, within};
use lockkit_testkit::FaultProxy;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// The command timeout of the clients under test (whole seconds: the docs print `2s`).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The wait of every `try_*` call: shorter than the command timeout, so the two bounds differ.
const WAIT: Duration = Duration::from_secs(1);
/// A short recheck interval, so that waits without bound end soon on a frozen server.
const RECHECK: Duration = Duration::from_secs(1);
/// Hang guard (never a performance assertion).
const HANG: Duration = Duration::from_secs(60);
/// Leases of the holds taken before the fault: far longer than the test.
const LEASE: Duration = Duration::from_secs(600);

/// Which bound the documentation says runs out.
#[derive(Clone, Copy, Debug)]
enum Bound {
    /// A `try_*` (or `wait(timeout)`): "the wait was 1s".
    Wait,
    /// Every other call: "the command timeout is 2s".
    Command,
    /// A try that does not wait (`wait = 0`, `run_exclusive`): "that one round trip".
    NoWait,
    /// The docs name no bound for it (the observer's stream items).
    Unnamed,
}

type Call<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + Send + 'a>>;

struct Case<'a> {
    op: &'static str,
    object: String,
    bound: Bound,
    call: Call<'a>,
}

fn case<'a, T, F>(op: &'static str, object: &str, bound: Bound, fut: F) -> Case<'a>
where
    F: Future<Output = Result<T, Error>> + Send + 'a,
{
    Case {
        op,
        object: object.to_owned(),
        bound,
        call: Box::pin(async move { fut.await.map(|_| ()) }),
    }
}

/// Internal names (scripts, Redis commands) that a top line must never show as the operation.
const INTERNAL: &[&str] = &[
    "evalsha",
    "eval ",
    "fcall",
    "script",
    "exists",
    "pttl",
    "hget",
    "hset",
    "hincrby",
    "zadd",
    "publish",
    "fenced_lock_",
    "latch_",
    "semaphore_",
    "rwlock_",
    "lock_acquire",
    "_release",
    "renew",
];

/// Checks one outcome against the documented shape; returns the problems found.
fn check(
    op: &str,
    object: &str,
    bound: Bound,
    refused_by: Option<&str>,
    outcome: Result<(), Error>,
) -> Vec<String> {
    let mut problems = Vec::new();
    let err = match outcome {
        Ok(()) => return vec![format!("{op} of `{object}`: returned Ok during the fault")],
        Err(err) => err,
    };
    let text = err.to_string();
    let label = format!("{op} of `{object}`: {text:?}");
    let Error::Redis(redis) = &err else {
        return vec![format!("{label}: not Error::Redis ({err:?})")];
    };
    if text.contains('\n') {
        problems.push(format!("{label}: more than one line"));
    }
    if redis.operation() != op {
        problems.push(format!(
            "{label}: operation() is {:?}, the method called is {op:?}",
            redis.operation()
        ));
    }
    if redis.object() != Some(object) {
        problems.push(format!("{label}: object() is {:?}", redis.object()));
    }
    let head = format!("redis error during {op} of `{object}`: ");
    if !text.starts_with(&head) {
        problems.push(format!("{label}: does not start with {head:?}"));
    }
    let lower = text.replace(object, "<object>").to_lowercase();
    for word in INTERNAL {
        if lower.contains(word) {
            problems.push(format!("{label}: shows the internal name {word:?}"));
        }
    }
    match bound {
        Bound::Wait | Bound::Command => {
            if !redis.is_timeout() {
                problems.push(format!("{label}: is_timeout() is false"));
            }
            if !redis.is_ambiguous() {
                problems.push(format!("{label}: is_ambiguous() is false"));
            }
            if !text.contains("no answer from Redis within ") {
                problems.push(format!("{label}: says no \"no answer from Redis within\""));
            }
            let named = match bound {
                Bound::Wait => format!("(the wait was {}s", WAIT.as_secs()),
                _ => format!("(the command timeout is {}s)", COMMAND_TIMEOUT.as_secs()),
            };
            if !text.contains(&named) {
                problems.push(format!("{label}: does not name the bound: {named:?}"));
            }
        }
        Bound::NoWait => {
            if !redis.is_timeout() || !text.contains("one round trip") {
                problems.push(format!(
                    "{label}: does not name the one round trip of a try"
                ));
            }
        }
        Bound::Unnamed => {}
    }
    if let (Bound::Unnamed, Some(_)) = (bound, refused_by) {
        // The observer's items name no bound; a refusing server is still said to refuse.
        if !text.to_lowercase().contains("refused") {
            problems.push(format!("{label}: does not say the server refuses"));
        }
    } else if let Some(addr) = refused_by {
        let why = format!("connection refused by {addr}");
        if !text.contains(&why) {
            problems.push(format!(
                "{label}: does not say why there is no connection: {why:?}"
            ));
        } else if let Some(at) = text.find("no answer from Redis") {
            if text.find(&why).is_some_and(|w| w > at) {
                problems.push(format!("{label}: gives the reason after the bound"));
            }
        }
    }
    problems
}

/// Whether `text` is `prefix` + a number with one decimal + `suffix` (the docs' `1.0s` shape).
fn shaped(text: &str, prefix: &str, suffix: &str) -> bool {
    let Some(middle) = text
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(suffix))
    else {
        return false;
    };
    match middle.split_once('.') {
        Some((whole, tenth)) => {
            !whole.is_empty()
                && whole.bytes().all(|b| b.is_ascii_digit())
                && tenth.len() == 1
                && tenth.bytes().all(|b| b.is_ascii_digit())
        }
        None => false,
    }
}

async fn test_client(url: &str, command_timeout: Duration) -> Client {
    match Client::builder()
        .url(url)
        .command_timeout(command_timeout)
        .recheck_interval(RECHECK)
        .build()
        .await
    {
        Ok(client) => client,
        Err(err) => panic!("cannot connect to {url}: {err}"),
    }
}

/// The objects of the walk, some of them held before the fault.
struct Objects {
    lock: String,
    fenced: String,
    fair: String,
    rw: String,
    spin: String,
    member_a: String,
    member_b: String,
    sem: String,
    pes: String,
    latch: String,
    election: String,
    led: String,
    held: String,
    once: String,
    job: String,
}

impl Objects {
    fn new() -> Self {
        Objects {
            lock: unique("errdocs-lock"),
            fenced: unique("errdocs-fenced"),
            fair: unique("errdocs-fair"),
            rw: unique("errdocs-rw"),
            spin: unique("errdocs-spin"),
            member_a: unique("errdocs-member-a"),
            member_b: unique("errdocs-member-b"),
            sem: unique("errdocs-sem"),
            pes: unique("errdocs-pes"),
            latch: unique("errdocs-latch"),
            election: unique("errdocs-election"),
            led: unique("errdocs-led"),
            held: unique("errdocs-held"),
            once: unique("errdocs-once"),
            job: unique("errdocs-job"),
        }
    }
}

/// Runs the walk: sets up the objects, calls `fault`, then every operation at once; returns the
/// problems found.
async fn walk(
    multi_only: bool,
    client: &Client,
    fault: impl FnOnce(),
    after_fault: Option<Call<'_>>,
    refused_by: Option<&str>,
) -> Vec<String> {
    let o = Objects::new();
    // Set up while Redis answers.
    let setup = async {
        let sem = client.semaphore(&o.sem);
        assert!(sem.try_set_permits(2).await.unwrap());
        let permit = sem.acquire_with_lease(1, LEASE).await.unwrap();
        let pes = client.permit_expirable_semaphore(&o.pes);
        assert!(pes.try_set_permits(2).await.unwrap());
        let expirable = pes.acquire(LEASE).await.unwrap();
        let latch = client.count_down_latch(&o.latch);
        assert!(latch.try_set_count(3).await.unwrap());
        let guard = client.lock(&o.held).lock_with_lease(LEASE).await.unwrap();
        let leadership = client
            .election(&o.led)
            .campaign_with_lease("me", LEASE)
            .await
            .unwrap();
        let mut observer = client.election(&o.election).observe();
        let first = observer.next().await;
        assert!(matches!(first, Some(Ok(_))), "{first:?}");
        (permit, expirable, guard, leadership, observer)
    };
    let (permit, expirable, guard, leadership, mut observer) = within(HANG, "setup", setup).await;
    let expirable_id = expirable.id().to_owned();
    // Keep the expirable permit's guard alive: its id is released by id below.
    let _expirable = expirable;

    fault();
    if let Some(first) = after_fault {
        // A first call that meets the fault: the client has seen the connection go.
        let _ = within(HANG, "the first call after the fault", first).await;
    }

    let lock = client.lock(&o.lock);
    let fenced = client.fenced_lock(&o.fenced);
    let fair = client.fair_lock(&o.fair);
    let rw = client.read_write_lock(&o.rw);
    let spin = client.spin_lock(&o.spin);
    let multi = client.multi_lock([client.lock(&o.member_a), client.lock(&o.member_b)]);
    let sem = client.semaphore(&o.sem);
    let pes = client.permit_expirable_semaphore(&o.pes);
    let latch = client.count_down_latch(&o.latch);
    let election = client.election(&o.election);
    let cases = vec![
        // Lock
        case("lock", &o.lock, Bound::Command, lock.lock()),
        case(
            "lock_with_lease",
            &o.lock,
            Bound::Command,
            lock.lock_with_lease(LEASE),
        ),
        case("try_lock", &o.lock, Bound::Wait, lock.try_lock(WAIT, None)),
        case("is_locked", &o.lock, Bound::Command, lock.is_locked()),
        case(
            "is_held_by_current_task",
            &o.lock,
            Bound::Command,
            lock.is_held_by_current_task(),
        ),
        case("hold_count", &o.lock, Bound::Command, lock.hold_count()),
        case(
            "remaining_ttl",
            &o.lock,
            Bound::Command,
            lock.remaining_ttl(),
        ),
        case("force_unlock", &o.lock, Bound::Command, lock.force_unlock()),
        case(
            "with_lock",
            &o.lock,
            Bound::Command,
            lock.with_lock(|_lease| async {}),
        ),
        case(
            "try_with_lock",
            &o.lock,
            Bound::Wait,
            lock.try_with_lock(WAIT, None, |_lease| async {}),
        ),
        case("unlock", &o.held, Bound::Command, guard.unlock()),
        // FencedLock
        case("lock", &o.fenced, Bound::Command, fenced.lock()),
        case(
            "try_lock",
            &o.fenced,
            Bound::Wait,
            fenced.try_lock(WAIT, None),
        ),
        case("is_locked", &o.fenced, Bound::Command, fenced.is_locked()),
        case(
            "remaining_ttl",
            &o.fenced,
            Bound::Command,
            fenced.remaining_ttl(),
        ),
        // FairLock
        case("lock", &o.fair, Bound::Command, fair.lock()),
        case("try_lock", &o.fair, Bound::Wait, fair.try_lock(WAIT, None)),
        case("is_locked", &o.fair, Bound::Command, fair.is_locked()),
        case("hold_count", &o.fair, Bound::Command, fair.hold_count()),
        // ReadWriteLock
        case("read_lock", &o.rw, Bound::Command, rw.read_lock()),
        case("write_lock", &o.rw, Bound::Command, rw.write_lock()),
        case(
            "try_read_lock",
            &o.rw,
            Bound::Wait,
            rw.try_read_lock(WAIT, None),
        ),
        case(
            "try_write_lock",
            &o.rw,
            Bound::Wait,
            rw.try_write_lock(WAIT, None),
        ),
        case("is_locked", &o.rw, Bound::Command, rw.is_locked()),
        case(
            "is_write_locked",
            &o.rw,
            Bound::Command,
            rw.is_write_locked(),
        ),
        case(
            "read_hold_count",
            &o.rw,
            Bound::Command,
            rw.read_hold_count(),
        ),
        case(
            "write_hold_count",
            &o.rw,
            Bound::Command,
            rw.write_hold_count(),
        ),
        // SpinLock
        case("lock", &o.spin, Bound::Command, spin.lock()),
        case("try_lock", &o.spin, Bound::Wait, spin.try_lock(WAIT, None)),
        case("is_locked", &o.spin, Bound::Command, spin.is_locked()),
        case("force_unlock", &o.spin, Bound::Command, spin.force_unlock()),
        // Semaphore
        case("acquire", &o.sem, Bound::Command, sem.acquire(1)),
        case(
            "try_acquire",
            &o.sem,
            Bound::Wait,
            sem.try_acquire(1, WAIT, None),
        ),
        case(
            "available_permits",
            &o.sem,
            Bound::Command,
            sem.available_permits(),
        ),
        case("add_permits", &o.sem, Bound::Command, sem.add_permits(1)),
        case(
            "try_set_permits",
            &o.sem,
            Bound::Command,
            sem.try_set_permits(5),
        ),
        case("release", &o.sem, Bound::Command, permit.release()),
        // PermitExpirableSemaphore
        case("acquire", &o.pes, Bound::Command, pes.acquire(LEASE)),
        case(
            "try_acquire",
            &o.pes,
            Bound::Wait,
            pes.try_acquire(WAIT, LEASE),
        ),
        case(
            "available_permits",
            &o.pes,
            Bound::Command,
            pes.available_permits(),
        ),
        case(
            "release",
            &o.pes,
            Bound::Command,
            pes.release(&expirable_id),
        ),
        case(
            "update_lease",
            &o.pes,
            Bound::Command,
            pes.update_lease(&expirable_id, LEASE),
        ),
        // CountDownLatch
        case("count_down", &o.latch, Bound::Command, latch.count_down()),
        case("count", &o.latch, Bound::Command, latch.count()),
        case("wait", &o.latch, Bound::Wait, latch.wait(WAIT)),
        case("wait", &o.latch, Bound::Command, latch.wait(Duration::MAX)),
        case(
            "try_set_count",
            &o.latch,
            Bound::Command,
            latch.try_set_count(9),
        ),
        // Election
        case(
            "campaign",
            &o.election,
            Bound::Command,
            election.campaign("v"),
        ),
        case(
            "try_campaign",
            &o.election,
            Bound::Wait,
            election.try_campaign("v", WAIT, None),
        ),
        case("leader", &o.election, Bound::Command, election.leader()),
        case("proclaim", &o.led, Bound::Command, async move {
            leadership.proclaim("new").await?;
            Ok(leadership)
        }),
        case("observe", &o.election, Bound::Unnamed, async move {
            while let Some(item) = observer.next().await {
                item?;
            }
            Ok(())
        }),
        // MultiLock: the member's name.
        case("lock", &o.member_a, Bound::Command, multi.lock()),
        case(
            "try_lock",
            &o.member_a,
            Bound::Wait,
            multi.try_lock(WAIT, None),
        ),
        // Jobs
        case(
            "once_per",
            &o.once,
            Bound::Command,
            client.once_per(&o.once, LEASE, || async {}),
        ),
        case(
            "run_exclusive",
            &o.job,
            Bound::NoWait,
            client.run_exclusive(&o.job, |_lease| async {}),
        ),
        case(
            "try_lock",
            &o.lock,
            Bound::NoWait,
            lock.try_lock(Duration::ZERO, None),
        ),
    ];
    let (labels, calls): (Vec<_>, Vec<_>) = cases
        .into_iter()
        .filter(|c| (c.object == o.member_a) == multi_only)
        .map(|c| ((c.op, c.object, c.bound), c.call))
        .unzip();
    let outcomes = within(HANG, "every call during the fault", join_all(calls)).await;
    let mut problems = Vec::new();
    for ((op, object, bound), outcome) in labels.into_iter().zip(outcomes) {
        // A multi-lock names one of its members: either is the object.
        let object = if object == o.member_a {
            match &outcome {
                Err(Error::Redis(e)) if e.object() == Some(o.member_b.as_str()) => {
                    o.member_b.clone()
                }
                _ => object,
            }
        } else {
            object
        };
        problems.extend(check(op, &object, bound, refused_by, outcome));
    }
    problems
}

async fn frozen(multi_only: bool) {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = test_client(&proxy.url(), COMMAND_TIMEOUT).await;
    let problems = walk(multi_only, &client, || proxy.pause(), None, None).await;
    proxy.resume();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

async fn killed(multi_only: bool) {
    let mut server = spawned().await;
    let client = test_client(&server.url(), COMMAND_TIMEOUT).await;
    let addr = server.addr().to_string();
    let first_lock = client.lock(unique("errdocs-first"));
    let first = first_lock.is_locked();
    let problems = walk(
        multi_only,
        &client,
        || server.kill(),
        Some(Box::pin(async move { first.await.map(|_| ()) })),
        Some(&addr),
    )
    .await;
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// (a) A frozen server: every call's top line names its method, its object and the bound that
/// ran out, with its value (guide, "Bounds while Redis is down"; rustdoc of `RedisError`):
/// Lock, FencedLock, FairLock, ReadWriteLock, SpinLock, Semaphore, PermitExpirableSemaphore,
/// CountDownLatch, Election (and its observer), once_per, run_exclusive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_every_call_names_its_method_object_and_bound() {
    frozen(false).await;
}

/// (a) for MultiLock: `lock()` is a wait without bound (the guide names the command timeout),
/// `try_lock(1s)` a try whose wait was 1s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_server_multi_lock_names_its_method_object_and_bound() {
    frozen(true).await;
}

/// (b) A killed server (connections refused): every call's top line says why there is no
/// connection (`connection refused by <address>`) before the bound, and names its method,
/// object and bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_every_call_says_refused_and_names_its_method_and_object() {
    killed(false).await;
}

/// (b) for MultiLock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_server_multi_lock_says_refused_and_names_its_method_and_bound() {
    killed(true).await;
}

/// The guide's samples of `Redis` errors, frozen server, the default command timeout for the
/// tries (wait 1s) and a 1 s one for the others:
/// ``redis error during try_acquire of `gpus`: no answer from Redis within 1.0s (the wait was 1s,
/// plus at most one round trip for a try in flight)``, the same for `try_lock`,
/// ``redis error during acquire of `exports`: no answer from Redis within 1.0s (the command
/// timeout is 1s)``, ``redis error during count_down of `batch:7`: ... (the command timeout is
/// 5s)`` (here 1s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guide_samples_of_timeouts_have_their_shape() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    // The try samples: the default command timeout (5 s), longer than the wait.
    let tries = test_client(&proxy.url(), lockkit::DEFAULT_COMMAND_TIMEOUT).await;
    let client = test_client(&proxy.url(), Duration::from_secs(1)).await;
    let gpus = unique("gpus");
    let exports = unique("exports");
    let batch = unique("batch");
    let order = unique("order");
    within(HANG, "setup", async {
        client.semaphore(&gpus).try_set_permits(1).await.unwrap();
        client.semaphore(&exports).try_set_permits(1).await.unwrap();
        client
            .count_down_latch(&batch)
            .try_set_count(2)
            .await
            .unwrap();
    })
    .await;
    proxy.pause();
    let one = Duration::from_secs(1);
    let (gpus_sem, exports_sem) = (tries.semaphore(&gpus), client.semaphore(&exports));
    let (batch_latch, order_lock) = (client.count_down_latch(&batch), tries.lock(&order));
    let (a, b, c, d) = within(HANG, "the calls", async {
        tokio::join!(
            gpus_sem.try_acquire(1, one, None),
            exports_sem.acquire(1),
            batch_latch.count_down(),
            order_lock.try_lock(one, None),
        )
    })
    .await;
    proxy.resume();
    let try_tail = "s (the wait was 1s, plus at most one round trip for a try in flight)";
    let cmd_tail = "s (the command timeout is 1s)";
    let checks = [
        (
            a.map(|_| ()),
            format!("redis error during try_acquire of `{gpus}`: no answer from Redis within "),
            try_tail,
        ),
        (
            b.map(|_| ()),
            format!("redis error during acquire of `{exports}`: no answer from Redis within "),
            cmd_tail,
        ),
        (
            c.map(|_| ()),
            format!("redis error during count_down of `{batch}`: no answer from Redis within "),
            cmd_tail,
        ),
        (
            d.map(|_| ()),
            format!("redis error during try_lock of `{order}`: no answer from Redis within "),
            try_tail,
        ),
    ];
    let mut problems = Vec::new();
    for (outcome, prefix, suffix) in checks {
        match outcome {
            Err(err) if shaped(&err.to_string(), &prefix, suffix) => {}
            other => problems.push(format!(
                "expected {prefix}N.N{suffix}, got {other:?} / {}",
                other
                    .as_ref()
                    .err()
                    .map(ToString::to_string)
                    .unwrap_or_default()
            )),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The guide's sample with Redis down: ``redis error during is_locked of `order:42`: connection
/// refused by 127.0.0.1:6379 (reconnecting); no answer from Redis within 1.0s (the command
/// timeout is 1s)``.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guide_sample_of_a_refused_reconnection_has_its_shape() {
    let mut server = spawned().await;
    let client = test_client(&server.url(), Duration::from_secs(1)).await;
    let order = unique("order");
    let lock = client.lock(&order);
    within(HANG, "setup", lock.is_locked()).await.unwrap();
    server.kill();
    // The first call meets the lost connection; the next one is made while reconnecting.
    let _ = within(HANG, "the first call", lock.is_locked()).await;
    let err = within(HANG, "is_locked", lock.is_locked())
        .await
        .expect_err("is_locked with Redis killed");
    let text = err.to_string();
    let prefix = format!(
        "redis error during is_locked of `{order}`: connection refused by {} (reconnecting); no answer from Redis within ",
        server.addr()
    );
    assert!(
        shaped(&text, &prefix, "s (the command timeout is 1s)"),
        "got {text:?}"
    );
}

/// `shutdown()`'s `NotReleased` names the holds not given back and says "may" for what an
/// acquire cut short may have taken (guide table; rustdoc sample: ``shutdown could not release 1
/// hold(s), freed when their leases run out: `a`; nor give back what 1 acquire(s) cut short may
/// have taken: `b` (freed the same way if taken)``).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_not_released_names_holds_and_says_may() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = test_client(&proxy.url(), COMMAND_TIMEOUT).await;
    let a = unique("a");
    let b = unique("b");
    let guard = within(HANG, "lock a", client.lock(&a).lock_with_lease(LEASE))
        .await
        .unwrap();
    proxy.pause();
    let cut = within(
        HANG,
        "try_lock b",
        client.lock(&b).try_lock(WAIT, Some(LEASE)),
    )
    .await;
    assert!(
        matches!(&cut, Err(Error::Redis(e)) if e.is_ambiguous()),
        "try_lock of b on a frozen server: {cut:?}"
    );
    let err = within(HANG, "shutdown", client.shutdown())
        .await
        .expect_err("shutdown with Redis frozen");
    proxy.resume();
    drop(guard);
    let text = err.to_string();
    match &err {
        Error::NotReleased {
            names, maybe_taken, ..
        } => {
            assert_eq!(names, &vec![a.clone()], "{text}");
            assert_eq!(maybe_taken, &vec![b.clone()], "{text}");
        }
        other => panic!("expected NotReleased, got {other:?}"),
    }
    let expected = format!(
        "shutdown could not release 1 hold(s), freed when their leases run out: `{a}`; nor give back what 1 acquire(s) cut short may have taken: `{b}` (freed the same way if taken)"
    );
    assert!(
        text.starts_with(&expected),
        "expected {expected:?}, got {text:?}"
    );
    assert!(!text.contains('\n'), "{text:?}");
}

/// Guide, README and rustdoc sample: a server refusing connections is said to refuse, with the
/// address of the URL: `cannot connect to 127.0.0.1:6379: connection refused (is Redis running
/// at that address? it is the one in the URL this program gave lockkit)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_to_a_refusing_address_says_refused() {
    let mut server = spawned().await;
    server.kill();
    let url = server.url();
    let err = within(HANG, "connect", Client::connect(url.clone()))
        .await
        .expect_err("connect to a killed server");
    let addr = server.addr().to_string();
    match &err {
        Error::Connect {
            addr: named,
            reason,
            ..
        } => {
            assert_eq!(named, &addr);
            assert_eq!(*reason, ConnectFailure::Refused);
        }
        other => panic!("expected Connect, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!("cannot connect to {addr}: connection refused (is Redis running at that address? it is the one in the URL this program gave lockkit)")
    );
}

/// Guide sample: `invalid argument: invalid Redis URL "redis://127.0.0.1:99999": the port
/// `99999` is not a number from 1 to 65535`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_url_with_a_port_out_of_range_names_the_url_and_the_port() {
    let url = "redis://127.0.0.1:99999";
    let err = within(HANG, "connect", Client::connect(url))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(
        err.to_string(),
        "invalid argument: invalid Redis URL \"redis://127.0.0.1:99999\": the port `99999` is not a number from 1 to 65535"
    );
}

/// The same promise for other bad ports: the URL and the port are named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_bad_ports_name_the_url_and_the_port() {
    let mut problems = Vec::new();
    for port in ["65536", "abc", "-1", "6379x"] {
        let url = format!("redis://127.0.0.1:{port}");
        let outcome = within(HANG, "connect", Client::builder().url(&url).build()).await;
        match outcome {
            Err(err @ Error::InvalidArgument(_)) => {
                let text = err.to_string();
                if !text.contains(&format!("\"{url}\"")) || !text.contains(&format!("`{port}`")) {
                    problems.push(format!("{url}: {text:?}"));
                }
            }
            Err(err) => problems.push(format!("{url}: not InvalidArgument: {err:?} / {err}")),
            Ok(_) => problems.push(format!("{url}: connected")),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Port 0 is not "a number from 1 to 65535" either (the guide's sample for 99999): it should be
/// refused as such, naming the URL and the port, not tried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_zero_names_the_url_and_the_port() {
    let url = "redis://127.0.0.1:0";
    let err = within(HANG, "connect", Client::connect(url))
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, Error::InvalidArgument(_)),
        "{err:?} / {text:?}"
    );
    assert!(
        text.contains("\"redis://127.0.0.1:0\"") && text.contains("`0`"),
        "{text:?}"
    );
}

/// A tiny TCP listener playing another program; `answer` is what it writes, `read_first`
/// whether it waits for the client's bytes first, `close` whether it closes afterwards.
async fn not_redis(
    answer: &'static [u8],
    read_first: bool,
    close: bool,
) -> (String, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let task = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut socket, _)) = listener.accept().await {
            if read_first {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
            }
            let _ = socket.write_all(answer).await;
            if close {
                let _ = socket.shutdown().await;
            } else {
                open.push(socket);
            }
        }
    });
    (addr, task)
}

async fn expect_not_redis(answer: &'static [u8], read_first: bool, close: bool) {
    let (addr, task) = not_redis(answer, read_first, close).await;
    let err = within(
        HANG,
        "connect",
        Client::builder()
            .url(format!("redis://{addr}"))
            .connect_timeout(Duration::from_secs(5))
            .build(),
    )
    .await
    .expect_err("connect to a server that is not Redis");
    task.abort();
    let text = err.to_string();
    assert!(
        matches!(
            &err,
            Error::Connect {
                reason: ConnectFailure::NotRedis,
                ..
            }
        ),
        "expected reason NotRedis, got {err:?} / {text:?}"
    );
    assert_eq!(
        text,
        format!("cannot connect to {addr}: the server does not speak the Redis protocol (is it Redis? something else listens at the address in the URL this program gave lockkit)")
    );
}

const HTTP_400: &[u8] =
    b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nContent-Length: 11\r\nConnection: close\r\n\r\nBad Request";

/// Guide sample: `cannot connect to 127.0.0.1:8080: the server does not speak the Redis protocol
/// (is it Redis? something else listens at the address in the URL this program gave lockkit)`:
/// an HTTP server that answers and closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_answers_and_closes_is_not_redis() {
    expect_not_redis(HTTP_400, true, true).await;
}

/// The same, an HTTP server that answers and keeps the connection open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_that_answers_and_stays_open_is_not_redis() {
    expect_not_redis(HTTP_400, true, false).await;
}

/// The same, a program that greets first (an SSH server's banner), then waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_greeting_in_another_protocol_is_not_redis() {
    expect_not_redis(b"SSH-2.0-OpenSSH_9.6\r\n", false, false).await;
}

/// The guide's sample, which `Error::Connect`'s rustdoc quotes too (it left out "connected, but"
/// until a docs-only test found it): `cannot connect to 127.0.0.1:6379: connected, but the Redis
/// handshake failed: ERR DB index is out of range`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_database_number_reads_as_the_guide_sample() {
    let server = spawned().await;
    let err = within(
        HANG,
        "connect",
        Client::connect(format!("{}/99", server.url())),
    )
    .await
    .expect_err("database 99");
    assert!(
        matches!(
            &err,
            Error::Connect {
                reason: ConnectFailure::Handshake,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to {}: connected, but the Redis handshake failed: ERR DB index is out of range",
            server.addr()
        )
    );
}

/// Guide sample: `cannot connect to 127.0.0.1:6379: authentication failed: the URL gives a
/// password, but the server asks for none (it would ignore it) (check the user name and
/// password in the URL)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_for_a_server_without_one_reads_as_the_guide_sample() {
    let server = spawned().await;
    let url = format!("redis://:secret@{}", server.addr());
    let err = within(HANG, "connect", Client::connect(url))
        .await
        .expect_err("a password for a server without one");
    assert!(
        matches!(
            &err,
            Error::Connect {
                reason: ConnectFailure::Auth,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to {}: authentication failed: the URL gives a password, but the server asks for none (it would ignore it) (check the user name and password in the URL)",
            server.addr()
        )
    );
}

/// Guide: `Err(Connect { reason: TimedOut(spent), .. })`: `no answer within 1.0s (the connect
/// timeout; …)`, the time actually spent. A listener that accepts and never answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_server_times_out_naming_the_connect_timeout_and_the_time_spent() {
    let (addr, task) = not_redis(b"", false, false).await;
    let timeout = Duration::from_secs(1);
    let err = within(
        HANG,
        "connect",
        Client::builder()
            .url(format!("redis://{addr}"))
            .connect_timeout(timeout)
            .build(),
    )
    .await
    .expect_err("a server that never answers");
    task.abort();
    let text = err.to_string();
    let Error::Connect {
        addr: named,
        reason: ConnectFailure::TimedOut(spent),
        ..
    } = &err
    else {
        panic!("expected Connect/TimedOut, got {err:?} / {text:?}");
    };
    assert_eq!(named, &addr);
    // The bound is the promise: the time spent is at least the connect timeout.
    assert!(*spent >= timeout, "spent {spent:?} < {timeout:?}: {text:?}");
    let prefix = format!(
        "cannot connect to {addr}: no answer within {:.1}s (the connect timeout; ",
        spent.as_secs_f64()
    );
    assert!(
        text.starts_with(&prefix),
        "expected {prefix:?}..., got {text:?}"
    );
}
