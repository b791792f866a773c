//! Every documented bound holds while Redis is down (issue 19 §5): an acquire returns within its
//! `wait` (plus one round trip), `unlock` and `shutdown` within the command timeout, `connect`
//! within the connect timeout, and each says what it could not do.
//!
//! Each bound is measured against an event, the call returning: the clock starts just before
//! the call and stops when it returns. The assertion is the documented bound plus a generous
//! allowance ([`SLACK`]) for a loaded machine, never a sleep. Every case runs under each
//! [`Fault`]: a killed server, a black hole (connections accepted, nothing ever answered), a
//! refused connection (nothing listens any more), and a slow link (every chunk delayed by more
//! than the bound). The measured times are printed (`bound …` lines, run with `--no-capture`)
//! and recorded in `docs/reliability.md`, "Bounds while Redis is down".

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::join_all;
use lockkit::{Client, ClientBuilder, ConnectFailure, Error};
use lockkit_suite::{spawned, unique, within};
use lockkit_testkit::{FaultProxy, RedisServer};
use tokio::time::Instant;

/// Allowance on top of a documented bound, for a loaded test machine.
const SLACK: Duration = Duration::from_secs(1);
/// Hang guard around every call (never a performance assertion).
const HANG: Duration = Duration::from_secs(60);
/// The command timeout of the unlock and shutdown cases.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The connect timeout of every client here.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// The `wait` of the acquire cases.
const WAIT: Duration = Duration::from_secs(1);
/// The most a try is given beyond an acquire's deadline, and a lost guard's release
/// (`exec::ROUND_TRIP`, at most the command timeout).
const ROUND_TRIP: Duration = Duration::from_secs(1);
/// The delay of the slow link, per chunk and direction: longer than any bound measured here.
const SLOW: Duration = Duration::from_secs(4);

/// How Redis goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The server process is killed: open connections break, reconnects are refused.
    Killed,
    /// Connections are accepted, but nothing is ever delivered either way.
    BlackHole,
    /// Nothing listens at the address any more: open connections break, reconnects are refused
    /// (the server itself still runs).
    Refused,
    /// Every chunk is delayed by [`SLOW`] in each direction.
    Slow,
}

const FAULTS: [Fault; 4] = [Fault::Killed, Fault::BlackHole, Fault::Refused, Fault::Slow];

/// A server, and the proxy in front of it for the faults that need one.
struct Setup {
    fault: Fault,
    server: RedisServer,
    proxy: Option<FaultProxy>,
}

impl Setup {
    async fn new(fault: Fault) -> Self {
        let server = spawned().await;
        let proxy = match fault {
            Fault::Killed => None,
            _ => Some(FaultProxy::start(server.addr()).await.unwrap()),
        };
        Self {
            fault,
            server,
            proxy,
        }
    }

    /// Where the client under test connects.
    fn url(&self) -> String {
        self.proxy
            .as_ref()
            .map_or_else(|| self.server.url(), FaultProxy::url)
    }

    /// Redis goes away.
    fn apply(&mut self) {
        match self.fault {
            Fault::Killed => self.server.kill(),
            Fault::BlackHole => self.proxy().pause(),
            Fault::Refused => drop(self.proxy.take()),
            Fault::Slow => self.proxy().set_delay(SLOW),
        }
    }

    fn proxy(&self) -> &FaultProxy {
        self.proxy.as_ref().expect("this fault has a proxy")
    }
}

fn builder(url: &str) -> ClientBuilder {
    Client::builder().url(url).connect_timeout(CONNECT_TIMEOUT)
}

async fn build(builder: ClientBuilder) -> Client {
    within(HANG, "connect", builder.build()).await.unwrap()
}

/// Runs `call`, prints and returns how long it took, and asserts it took at most `bound` plus
/// [`SLACK`].
async fn measured<T>(
    what: &str,
    fault: Fault,
    bound: Duration,
    call: impl Future<Output = T>,
) -> (T, Duration) {
    let started = Instant::now();
    let out = within(HANG, what, call).await;
    let elapsed = started.elapsed();
    println!(
        "bound {what:<32} {fault:<10} bound {:>5.1}s measured {:>6.3}s",
        bound.as_secs_f64(),
        elapsed.as_secs_f64(),
        fault = format!("{fault:?}"),
    );
    assert!(
        elapsed <= bound + SLACK,
        "{what} under {fault:?} took {elapsed:?}, over its bound of {bound:?} (+{SLACK:?})"
    );
    (out, elapsed)
}

/// An acquire that met no answer: an ambiguous, timed-out `Error::Redis` naming the object.
#[track_caller]
fn assert_no_answer<T: std::fmt::Debug>(result: Result<T, Error>, name: &str, fault: Fault) {
    match result {
        Err(Error::Redis(err)) => {
            assert!(err.is_timeout(), "{fault:?}: {err:?}");
            assert!(err.is_ambiguous(), "{fault:?}: {err:?}");
            assert_eq!(err.object(), Some(name), "{fault:?}: {err:?}");
            let shown = chain(&err);
            assert!(shown.contains(&format!("`{name}`")), "{shown}");
            assert!(shown.contains("no answer from Redis within"), "{shown}");
        }
        other => panic!("{fault:?}: expected Redis not to answer, got {other:?}"),
    }
}

/// An error and its sources, joined by `: `.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut shown = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        shown.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    shown
}

/// `try_lock(1 s)` and `try_lock(0)` return within the wait plus one round trip, with an error
/// that names the lock (not `Ok(None)`, which would say someone else holds it). The client has
/// the default 5 s command timeout, so a try bounded only by it would take 5 s.
#[tokio::test]
async fn an_acquire_returns_within_its_wait_whatever_redis_does() {
    for fault in FAULTS {
        let mut setup = Setup::new(fault).await;
        let client = build(builder(&setup.url())).await;
        let name = unique("bounded-acquire");
        // Scripts cached, connection warm.
        drop(client.lock(unique("warm")).lock().await.unwrap());
        setup.apply();
        let lock = client.lock(&name);
        let (result, _) = measured(
            "try_lock(1s)",
            fault,
            WAIT + ROUND_TRIP,
            lock.try_lock(WAIT, None),
        )
        .await;
        assert_no_answer(result, &name, fault);
        let (result, _) = measured(
            "try_lock(0s)",
            fault,
            ROUND_TRIP,
            lock.try_lock(Duration::ZERO, None),
        )
        .await;
        assert_no_answer(result, &name, fault);
        // Nothing is waiting or held afterwards.
        assert_eq!(client.waiting_count(), 0, "{fault:?}");
    }
}

/// Every primitive's `try_*` goes through the shared acquire loop and keeps the same bound.
#[tokio::test]
async fn every_primitive_s_try_keeps_its_wait_in_a_black_hole() {
    for fault in [Fault::BlackHole, Fault::Killed] {
        let mut setup = Setup::new(fault).await;
        let client = build(builder(&setup.url())).await;
        let n = |kind: &str| unique(&format!("bounded-{kind}"));
        let names = [
            n("fair"),
            n("read"),
            n("write"),
            n("fenced"),
            n("spin"),
            n("semaphore"),
            n("expirable"),
            n("latch"),
            n("multi-a"),
            n("multi-b"),
        ];
        drop(client.lock(unique("warm")).lock().await.unwrap());
        setup.apply();
        let c = &client;
        type Try<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + 'a>>;
        // (what, the name its error must carry, the call)
        let tries: Vec<(&str, &str, Try<'_>)> = vec![
            (
                "fair try_lock(1s)",
                &names[0],
                Box::pin(async { c.fair_lock(&names[0]).try_lock(WAIT, None).await.map(drop) }),
            ),
            (
                "rw try_read_lock(1s)",
                &names[1],
                Box::pin(async {
                    c.read_write_lock(&names[1])
                        .try_read_lock(WAIT, None)
                        .await
                        .map(drop)
                }),
            ),
            (
                "rw try_write_lock(1s)",
                &names[2],
                Box::pin(async {
                    c.read_write_lock(&names[2])
                        .try_write_lock(WAIT, None)
                        .await
                        .map(drop)
                }),
            ),
            (
                "fenced try_lock(1s)",
                &names[3],
                Box::pin(async {
                    c.fenced_lock(&names[3])
                        .try_lock(WAIT, None)
                        .await
                        .map(drop)
                }),
            ),
            (
                "spin try_lock(1s)",
                &names[4],
                Box::pin(async { c.spin_lock(&names[4]).try_lock(WAIT, None).await.map(drop) }),
            ),
            (
                "semaphore try_acquire(1s)",
                &names[5],
                Box::pin(async {
                    c.semaphore(&names[5])
                        .try_acquire(1, WAIT, None)
                        .await
                        .map(drop)
                }),
            ),
            (
                "expirable try_acquire(1s)",
                &names[6],
                Box::pin(async {
                    c.permit_expirable_semaphore(&names[6])
                        .try_acquire(WAIT, Duration::from_secs(10))
                        .await
                        .map(drop)
                }),
            ),
            (
                "latch wait(1s)",
                &names[7],
                Box::pin(async { c.count_down_latch(&names[7]).wait(WAIT).await.map(drop) }),
            ),
            // The multi-lock's first member is the one that meets no answer.
            (
                "multi try_lock(1s)",
                &names[8],
                Box::pin(async {
                    c.multi_lock([c.lock(&names[8]), c.lock(&names[9])])
                        .try_lock(WAIT, None)
                        .await
                        .map(drop)
                }),
            ),
        ];
        let results = join_all(tries.into_iter().map(|(what, name, call)| async move {
            let (result, _) = measured(what, fault, WAIT + ROUND_TRIP, call).await;
            (name, result)
        }))
        .await;
        for (name, result) in results {
            assert_no_answer(result, name, fault);
        }
    }
}

/// A client for the unlock and shutdown cases: a 2 s command timeout.
async fn holder(setup: &Setup) -> Client {
    build(builder(&setup.url()).command_timeout(COMMAND_TIMEOUT)).await
}

/// `unlock` takes at most the command timeout, all its resends included, and says the release
/// is of unknown outcome (the lease frees the lock).
#[tokio::test]
async fn an_unlock_returns_within_the_command_timeout_whatever_redis_does() {
    for fault in FAULTS {
        let mut setup = Setup::new(fault).await;
        let client = holder(&setup).await;
        let name = unique("bounded-unlock");
        let guard = client
            .lock(&name)
            .lock_with_lease(Duration::from_secs(60))
            .await
            .unwrap();
        setup.apply();
        let (result, _) = measured("unlock", fault, COMMAND_TIMEOUT, guard.unlock()).await;
        match result {
            Err(Error::Redis(err)) => {
                assert!(err.is_ambiguous(), "{fault:?}: {err:?}");
                assert_eq!(err.object(), Some(name.as_str()), "{fault:?}: {err:?}");
            }
            other => panic!("{fault:?}: expected an ambiguous Redis error, got {other:?}"),
        }
        assert_eq!(client.held_count(), 0, "{fault:?}: no longer renewed");
    }
}

/// `unlock` on a guard already known lost answers `NotHeld` within one round trip, without
/// waiting the command timeout (the default 5 s here) for an unreachable Redis.
#[tokio::test]
async fn an_unlock_of_a_lost_guard_answers_within_a_round_trip_whatever_redis_does() {
    for fault in FAULTS {
        let mut setup = Setup::new(fault).await;
        let client = build(builder(&setup.url())).await;
        let name = unique("bounded-lost");
        let guard = client
            .lock(&name)
            .lock_with_lease(Duration::from_millis(300))
            .await
            .unwrap();
        // The event: the lease ran out by the guard's own clock.
        within(HANG, "the lease to run out", guard.lost()).await;
        assert!(guard.is_lost());
        setup.apply();
        let (result, _) = measured("unlock (lost guard)", fault, ROUND_TRIP, guard.unlock()).await;
        assert!(
            matches!(&result, Err(Error::NotHeld { name: held }) if *held == name),
            "{fault:?}: {result:?}"
        );
    }
}

/// `shutdown` takes at most the command timeout, and names every hold it could not give back:
/// the guards still held and a dropped guard whose background release was under way.
#[tokio::test]
async fn a_shutdown_returns_within_the_command_timeout_and_names_what_it_did_not_release() {
    for fault in FAULTS {
        let mut setup = Setup::new(fault).await;
        let client = holder(&setup).await;
        let held = [unique("bounded-shutdown-a"), unique("bounded-shutdown-b")];
        let dropped = unique("bounded-shutdown-dropped");
        let lease = Duration::from_secs(60);
        let _a = client.lock(&held[0]).lock_with_lease(lease).await.unwrap();
        // Watchdog mode: renewal rounds run (or are under way) during the outage too.
        let _b = client.lock(&held[1]).lock().await.unwrap();
        let gone = client.lock(&dropped).lock_with_lease(lease).await.unwrap();
        setup.apply();
        drop(gone); // released in the background, into the outage
        let (result, _) = measured("shutdown", fault, COMMAND_TIMEOUT, client.shutdown()).await;
        match result {
            Err(Error::NotReleased {
                mut names, source, ..
            }) => {
                names.sort();
                let mut expected = vec![held[0].clone(), held[1].clone(), dropped.clone()];
                expected.sort();
                assert_eq!(names, expected, "{fault:?}");
                assert!(
                    matches!(&*source, Error::Redis(err) if err.is_ambiguous()),
                    "{fault:?}: {source:?}"
                );
            }
            other => panic!("{fault:?}: expected NotReleased, got {other:?}"),
        }
        // Shut down all the same.
        assert!(matches!(
            client.lock(&held[0]).try_lock(Duration::ZERO, None).await,
            Err(Error::Shutdown)
        ));
    }
}

/// `connect` takes at most the connect timeout, and a timeout names the time actually spent.
/// A command timeout shorter than the connect timeout does not end the connect early.
#[tokio::test]
async fn a_connect_returns_within_the_connect_timeout_and_names_the_time_spent() {
    for fault in FAULTS {
        let mut setup = Setup::new(fault).await;
        let url = setup.url();
        setup.apply();
        // A command timeout longer than the connect timeout: closing the client that gave up
        // must not wait for it.
        let slow_commands = builder(&url)
            .command_timeout(Duration::from_secs(3))
            .build();
        let (result, elapsed) = measured("connect", fault, CONNECT_TIMEOUT, slow_commands).await;
        match (fault, result) {
            (Fault::Killed | Fault::Refused, Err(Error::Connect { reason, .. })) => {
                assert_eq!(reason, ConnectFailure::Refused, "{fault:?}");
            }
            (Fault::BlackHole | Fault::Slow, Err(err @ Error::Connect { .. })) => {
                assert_timed_out(&err, elapsed, CONNECT_TIMEOUT);
            }
            (_, other) => panic!("{fault:?}: expected a connect error, got {other:?}"),
        }
    }
    // The newcomer's case: connect timeout 2 s, command timeout 1 s. Connecting takes the
    // connect timeout, and says so.
    for fault in [Fault::BlackHole, Fault::Slow] {
        let mut setup = Setup::new(fault).await;
        let url = setup.url();
        setup.apply();
        let connect = Duration::from_secs(2);
        let mixed = Client::builder()
            .url(&url)
            .connect_timeout(connect)
            .command_timeout(Duration::from_secs(1))
            .build();
        let (result, elapsed) =
            measured("connect (command timeout < connect)", fault, connect, mixed).await;
        let err = result.expect_err("connected through a fault");
        assert_timed_out(&err, elapsed, connect);
        assert!(
            elapsed >= connect,
            "{fault:?}: gave up after {elapsed:?}, before the connect timeout of {connect:?}"
        );
    }
}

/// A connect timeout whose reported time is the time spent (to the tenth of a second shown).
#[track_caller]
fn assert_timed_out(err: &Error, elapsed: Duration, timeout: Duration) {
    let Error::Connect {
        reason: ConnectFailure::TimedOut(after),
        ..
    } = err
    else {
        panic!("expected a connect timeout, got {err:?}");
    };
    let gap = elapsed.abs_diff(*after);
    assert!(
        gap < Duration::from_millis(200),
        "reported {after:?}, spent {elapsed:?}: {err}"
    );
    assert!(*after >= timeout, "reported {after:?} < {timeout:?}: {err}");
    let shown = err.to_string();
    assert!(
        shown.contains(&format!(
            "no answer within {:.1}s (the connect timeout",
            after.as_secs_f64()
        )),
        "{shown}"
    );
}
