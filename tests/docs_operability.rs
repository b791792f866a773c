//! Issue 29's operability promises, tested from the documentation only (README, docs/guide.md,
//! rustdoc): logging (guide "Metrics and tracing", "Logging: fred's own lines"),
//! `Inspection::leader`, `FencedGuard`, `Client::shutdown`'s waiting calls and the default
//! timeouts. Each test quotes the sentence it checks.
//!
//! The logging tests capture every event at INFO and up with a subscriber of this file (the
//! harness is the one of `tests/quiet_logs.rs`): a `tracing` subscriber and a `log` logger, both
//! installed once for the process. They take turns ([`serial`]); run this file with nextest (a
//! process per test) so that no other test's events land in a capture.

use std::time::Duration;

use futures::StreamExt;
use lockkit::protocol::keys::Kind;
use lockkit::{Client, ConnectFailure, Error, FencedGuard, LockGuard};
use lockkit_suite::{spawned, unique, until_waiters_in_redis, until_waiting, within};
use lockkit_testkit::{FaultProxy, RedisServer};

mod log_capture;

use log_capture::{captured, run, serial, warnings, within_blocking, Event};

const HANG: Duration = Duration::from_secs(60);

/// What the guide's filter `RUST_LOG=info,fred=error` lets through.
fn through_fred_error_filter(events: &[Event]) -> Vec<Event> {
    events
        .iter()
        .filter(|event| !(event.target.starts_with("fred") && event.level > tracing::Level::ERROR))
        .cloned()
        .collect()
}

fn is_lost_connection(event: &Event) -> bool {
    event.target.starts_with("lockkit")
        && event.level == tracing::Level::WARN
        && event.text.contains("lost the connection to Redis")
}

fn is_back(event: &Event) -> bool {
    event.target.starts_with("lockkit")
        && event.level == tracing::Level::INFO
        && event.text.contains("the connection to Redis is back")
}

fn is_lease_lost(event: &Event) -> bool {
    event.target.starts_with("lockkit")
        && event.level == tracing::Level::WARN
        && event.text.contains("lease lost")
}

/// Polls the capture until `count` "back" events were logged since the program started.
async fn until_back_events(count: usize) {
    within(HANG, "the \"connection is back\" events", async {
        while captured().peek().iter().filter(|e| is_back(e)).count() < count {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Polls the capture until `count` "lost the connection" events were logged.
async fn until_lost_events(count: usize) {
    within(HANG, "the \"lost the connection\" events", async {
        while captured()
            .peek()
            .iter()
            .filter(|e| is_lost_connection(e))
            .count()
            < count
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

fn dump(events: &[Event]) {
    for event in events {
        eprintln!("{event}");
    }
}

// ---------------------------------------------------------------------------------------------
// 1. Logging
// ---------------------------------------------------------------------------------------------

/// Guide, "Logging: fred's own lines": "A clean run, a clean shutdown and a refused or timed-out
/// connect log nothing from it." and "Metrics and tracing": the WARNs are for a self-wait, a
/// lost lease, dropped release messages and a lost connection. A user's fault-free program
/// that touches every kind, with real contention (waiters woken by releases), then shuts down:
/// no warning from any crate.
#[test]
fn a_clean_run_over_every_kind_with_contention_logs_no_warning() {
    let _serial = serial();
    let server = within_blocking(RedisServer::start()).expect("redis-server");
    let url = server.url();
    for round in 0..3 {
        let (result, events) = run(async {
            let a = Client::connect(url.as_str()).await?;
            let b = Client::connect(url.as_str()).await?;
            // Lock with a waiter from another client, woken by the release.
            let name = unique("clean-lock");
            let held = a.lock(&name).lock().await?;
            let lock_b = b.lock(&name);
            let waiter = tokio::spawn(async move { lock_b.lock().await?.unlock().await });
            until_waiting(&b, 1).await;
            held.unlock().await?;
            within(HANG, "the lock waiter", waiter)
                .await
                .expect("task")?;
            // Fenced, with a re-entry.
            let fenced = a.fenced_lock(unique("clean-fenced"));
            let outer = fenced.lock().await?;
            let inner = outer.scope(fenced.lock()).await?;
            inner.unlock().await?;
            outer.unlock().await?;
            // Fair, read-write (both modes), spin.
            a.fair_lock(unique("clean-fair"))
                .lock()
                .await?
                .unlock()
                .await?;
            let rw = a.read_write_lock(unique("clean-rw"));
            rw.read_lock().await?.unlock().await?;
            rw.write_lock().await?.unlock().await?;
            a.spin_lock(unique("clean-spin"))
                .lock()
                .await?
                .unlock()
                .await?;
            // Semaphore with a waiter.
            let sem_name = unique("clean-sem");
            let permit = a.semaphore(&sem_name).with_permits(1)?.acquire(1).await?;
            let sem_b = b.semaphore(&sem_name).with_permits(1)?;
            let sem_waiter = tokio::spawn(async move { sem_b.acquire(1).await?.release().await });
            until_waiting(&b, 1).await;
            permit.release().await?;
            within(HANG, "the semaphore waiter", sem_waiter)
                .await
                .expect("task")?;
            // Permit-expirable semaphore, latch, once_per, multi-lock.
            let pes = a
                .permit_expirable_semaphore(unique("clean-pes"))
                .with_permits(2)?;
            pes.acquire(Duration::from_secs(30))
                .await?
                .release()
                .await?;
            let latch = a.count_down_latch(unique("clean-latch"));
            latch.try_set_count(1).await?;
            let latch_b = b.count_down_latch(latch.name());
            let latch_waiter = tokio::spawn(async move { latch_b.wait(HANG).await });
            until_waiting(&b, 1).await;
            latch.count_down().await?;
            assert!(within(HANG, "the latch waiter", latch_waiter)
                .await
                .expect("task")?);
            let outcome = a
                .once_per(unique("clean-once"), Duration::from_secs(60), || async {})
                .await?;
            assert!(!outcome.is_skipped());
            let multi = a.multi_lock([a.lock(unique("clean-m1")), a.lock(unique("clean-m2"))]);
            multi.lock().await?.unlock().await?;
            // Election: observed, led, handed over to a waiting candidate, resigned.
            let election_name = unique("clean-election");
            let election = a.election(&election_name);
            let mut observer = election.observe();
            let first = within(HANG, "the observer's first change", observer.next()).await;
            assert!(matches!(first, Some(Ok(_))), "{first:?}");
            let leadership = election.campaign("a").await?;
            let election_b = b.election(&election_name);
            let candidate = tokio::spawn(async move { election_b.campaign("b").await });
            until_waiting(&b, 1).await;
            leadership.resign().await?;
            let next = within(HANG, "the candidate", candidate)
                .await
                .expect("task")?;
            next.resign().await?;
            drop(observer);
            b.shutdown().await?;
            a.shutdown().await
        });
        if result.is_err() {
            dump(&events);
        }
        result.unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert_eq!(warnings(&events), Vec::<String>::new(), "round {round}");
    }
}

/// Guide, "Logging: fred's own lines": "a refused or timed-out connect log nothing from it",
/// here with the connect timeout a user would set and with the default one.
#[test]
fn a_refused_or_timed_out_connect_logs_no_warning() {
    let _serial = serial();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let (result, events) = run(async {
        Client::builder()
            .url(format!("redis://127.0.0.1:{port}"))
            .build()
            .await
    });
    assert!(
        matches!(
            result,
            Err(Error::Connect {
                reason: ConnectFailure::Refused,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(warnings(&events), Vec::<String>::new(), "refused");

    let server = within_blocking(RedisServer::start()).expect("redis-server");
    // The frozen server outlives the program, as a real one does (a proxy dropped inside the
    // program closed the connection fred was still handshaking on: a warning of the test's own
    // making, about a connection it closed).
    let proxy = within_blocking(FaultProxy::start(server.addr())).expect("a proxy");
    proxy.pause();
    let url = proxy.url();
    let (result, events) = run(async move {
        Client::builder()
            .url(url)
            .connect_timeout(Duration::from_millis(300))
            .build()
            .await
    });
    within_blocking(async move { drop(proxy) });
    assert!(
        matches!(
            result,
            Err(Error::Connect {
                reason: ConnectFailure::TimedOut(_),
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(warnings(&events), Vec::<String>::new(), "timed out");
}

/// Guide, "Metrics and tracing": "a lost connection to Redis: **one** `WARN` per client when the
/// first of its connections goes down [...], and **one** `INFO` when every one is back [...],
/// however many commands, connections and reconnection attempts there were in between.
/// Renewals that fail meanwhile are `DEBUG`; a lease the outage costs is its own `WARN`." and
/// "Logging": through `fred=error`, one line per outage.
///
/// Two outages in a row (kill, restart, back; kill, restart, back), with holds of several kinds
/// (lock, fenced lock, read-write lock, semaphore, election leader) and many waiters (lock, fair
/// lock, semaphore, election candidate) on two clients: two WARNs and two INFOs per client.
#[test]
fn two_outages_with_many_waiters_and_holds_log_one_warn_and_one_info_per_client_each() {
    let _serial = serial();
    let (result, events) = run(async {
        let mut server = spawned().await;
        let url = server.url();
        let build = || {
            Client::builder()
                .url(url.as_str())
                .command_timeout(Duration::from_secs(1))
                .watchdog_timeout(Duration::from_secs(3))
                .build()
        };
        let holder = build().await?;
        let waiter = build().await?;
        let lock_name = unique("outage-lock");
        let fair_name = unique("outage-fair");
        let sem_name = unique("outage-sem");
        let election_name = unique("outage-election");
        let lock_guard = holder.lock(&lock_name).lock().await?;
        let fair_guard = holder.fair_lock(&fair_name).lock().await?;
        let fenced_guard = holder.fenced_lock(unique("outage-fenced")).lock().await?;
        let rw_guard = holder
            .read_write_lock(unique("outage-rw"))
            .read_lock()
            .await?;
        let permit = holder
            .semaphore(&sem_name)
            .with_permits(1)?
            .acquire(1)
            .await?;
        let leadership = holder.election(&election_name).campaign("h").await?;
        let mut tasks = Vec::new();
        for _ in 0..4 {
            let lock = waiter.lock(&lock_name);
            tasks.push(tokio::spawn(async move { lock.lock().await.map(drop) }));
            let fair = waiter.fair_lock(&fair_name);
            tasks.push(tokio::spawn(async move { fair.lock().await.map(drop) }));
            let sem = waiter.semaphore(&sem_name).with_permits(1)?;
            tasks.push(tokio::spawn(async move { sem.acquire(1).await.map(drop) }));
        }
        let election = waiter.election(&election_name);
        let candidate = tokio::spawn(async move { election.campaign("w").await.map(drop) });
        until_waiting(&waiter, 13).await;

        // First outage.
        server.kill();
        until_lost_events(2).await;
        server.start_again().await.expect("redis-server back");
        for task in tasks {
            let _ = within(HANG, "a waiter", task).await;
        }
        let _ = within(HANG, "the candidate", candidate).await;
        until_back_events(2).await;

        // Second outage, with a new hold and new waiters.
        let again_name = unique("outage-again");
        let again = holder.lock(&again_name).lock().await?;
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let lock = waiter.lock(&again_name);
            tasks.push(tokio::spawn(async move { lock.lock().await.map(drop) }));
        }
        until_waiting(&waiter, 3).await;
        server.kill();
        until_lost_events(4).await;
        server.start_again().await.expect("redis-server back");
        for task in tasks {
            let _ = within(HANG, "a waiter", task).await;
        }
        until_back_events(4).await;
        drop((
            lock_guard,
            fair_guard,
            fenced_guard,
            rw_guard,
            permit,
            leadership,
            again,
        ));
        let _ = waiter.shutdown().await;
        let _ = holder.shutdown().await;
        Ok::<_, Error>(())
    });
    dump(&events);
    result.expect("the program");
    let lost = events.iter().filter(|e| is_lost_connection(e)).count();
    let back = events.iter().filter(|e| is_back(e)).count();
    assert_eq!(lost, 4, "one WARN per client and outage");
    assert_eq!(back, 4, "one INFO per client and outage");
    let left: Vec<String> = through_fred_error_filter(&events)
        .iter()
        .filter(|event| event.level <= tracing::Level::WARN)
        .filter(|event| !is_lost_connection(event) && !is_lease_lost(event))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        left,
        Vec::<String>::new(),
        "through fred=error: nothing but the lost connection and lost leases"
    );
}

/// Guide, "Metrics and tracing": "**one** `WARN` per client when the first of its connections
/// goes down [...], and **one** `INFO` when every one is back". A client that holds nothing and
/// has no waiter (no subscriber connection in use) is a client all the same.
#[test]
fn an_idle_client_without_waiters_logs_one_warn_and_one_info_for_an_outage() {
    let _serial = serial();
    let (result, events) = run(async {
        let mut server = spawned().await;
        let client = Client::builder()
            .url(server.url())
            .command_timeout(Duration::from_secs(1))
            .build()
            .await?;
        client.lock(unique("idle")).lock().await?.unlock().await?;
        server.kill();
        until_lost_events(1).await;
        server.start_again().await.expect("redis-server back");
        until_back_events(1).await;
        // It works again.
        within(HANG, "a lock after the outage", async {
            client
                .lock(unique("idle-after"))
                .lock()
                .await?
                .unlock()
                .await
        })
        .await?;
        client.shutdown().await
    });
    dump(&events);
    result.expect("the program");
    assert_eq!(events.iter().filter(|e| is_lost_connection(e)).count(), 1);
    assert_eq!(events.iter().filter(|e| is_back(e)).count(), 1);
    let left: Vec<String> = through_fred_error_filter(&events)
        .iter()
        .filter(|event| event.level <= tracing::Level::WARN)
        .filter(|event| !is_lost_connection(event))
        .map(ToString::to_string)
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

/// Guide, "Metrics and tracing": "however many commands, connections and reconnection attempts
/// there were in between. Renewals that fail meanwhile are `DEBUG`", and "Logging": through
/// `fred=error`, "one line per outage". A frozen server (the proxy forwards nothing, the
/// connections stay open) with a watchdog hold whose renewals fail, and waiters that time out:
/// at most one lost-connection WARN per client, an INFO for each such WARN once it answers
/// again, and no other warning than a lease the freeze cost.
#[test]
fn a_frozen_server_logs_at_most_one_warn_per_client_and_no_renewal_warnings() {
    let _serial = serial();
    let server = within_blocking(RedisServer::start()).expect("redis-server");
    let addr = server.addr();
    let (result, events) = run(async {
        let proxy = FaultProxy::start(addr).await.expect("a proxy");
        let build = || {
            Client::builder()
                .url(proxy.url())
                .command_timeout(Duration::from_secs(1))
                .recheck_interval(Duration::from_millis(500))
                .watchdog_timeout(Duration::from_secs(6))
                .build()
        };
        let holder = build().await?;
        let waiter = build().await?;
        let name = unique("frozen");
        let guard = holder.lock(&name).lock().await?;
        let tasks: Vec<_> = (0..3)
            .map(|_| {
                let lock = waiter.lock(&name);
                tokio::spawn(async move { lock.lock().await.map(drop) })
            })
            .collect();
        until_waiting(&waiter, 3).await;
        proxy.pause();
        // The freeze lasts until every waiting call has given up (recheck + command timeout).
        for task in tasks {
            let out = within(HANG, "a waiter to give up", task)
                .await
                .expect("task");
            assert!(matches!(out, Err(Error::Redis(_))), "{out:?}");
        }
        // And until a renewal round has failed: `is_locked` from the holder times out too.
        let probe = holder.lock(&name).is_locked().await;
        assert!(matches!(probe, Err(Error::Redis(_))), "{probe:?}");
        proxy.resume();
        // Both clients answer again.
        within(HANG, "the clients to answer again", async {
            loop {
                if holder.lock(&name).is_locked().await.is_ok()
                    && waiter.lock(&name).is_locked().await.is_ok()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        // Each client that logged a lost connection logs it is back.
        let lost = captured()
            .peek()
            .iter()
            .filter(|e| is_lost_connection(e))
            .count();
        until_back_events(lost).await;
        drop(guard);
        let _ = waiter.shutdown().await;
        let _ = holder.shutdown().await;
        drop(proxy);
        Ok::<_, Error>(())
    });
    dump(&events);
    result.expect("the program");
    let lost = events.iter().filter(|e| is_lost_connection(e)).count();
    let back = events.iter().filter(|e| is_back(e)).count();
    assert!(lost <= 2, "at most one WARN per client, got {lost}");
    assert_eq!(back, lost, "one INFO per WARN");
    let left: Vec<String> = through_fred_error_filter(&events)
        .iter()
        .filter(|event| event.level <= tracing::Level::WARN)
        .filter(|event| !is_lost_connection(event) && !is_lease_lost(event))
        .map(ToString::to_string)
        .collect();
    assert_eq!(left, Vec::<String>::new());
}

// ---------------------------------------------------------------------------------------------
// 3. Inspection::leader
// ---------------------------------------------------------------------------------------------

async fn election_inspection(client: &Client, name: &str) -> lockkit::Inspection {
    let found = client
        .inspect(Some(Kind::Election), name)
        .await
        .expect("inspect");
    assert_eq!(found.len(), 1, "{found:?}");
    found.into_iter().next().expect("one")
}

/// Rustdoc of `Inspection::leader`: "An election's leader: the term and value it announced, as
/// `Election::leader` reads them [...]. `None` when nobody leads [...]; `None` for the other
/// kinds." and "With the `serde` feature: `"leader": {"term": .., "value": ..}`, or `null`."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_leader_follows_the_running_election_and_is_none_elsewhere() {
    let redis = spawned().await;
    let client = Client::connect(redis.url()).await.expect("connect");
    let name = unique("docs-leader");
    let election = client.election(&name);
    let leadership = election.campaign("pod-1").await.expect("campaign");

    let found = election_inspection(&client, &name).await;
    let leader = found.leader.clone().expect("a leader");
    assert_eq!(leader.value, "pod-1");
    assert_eq!(leader.term, leadership.term());
    assert_eq!(
        Some(leader.clone()),
        election.leader().await.expect("leader")
    );
    let json = serde_json::to_value(&found).expect("serialize");
    assert_eq!(
        json["leader"],
        serde_json::json!({"term": leadership.term(), "value": "pod-1"}),
        "{json}"
    );

    // A new value under the same term.
    leadership.proclaim("pod-1:8080").await.expect("proclaim");
    let found = election_inspection(&client, &name).await;
    let leader = found.leader.expect("a leader");
    assert_eq!(leader.value, "pod-1:8080");
    assert_eq!(leader.term, leadership.term());

    // Other kinds, even under the same name: None, serialised as null.
    let lock = client.lock(&name).lock().await.expect("lock");
    let sem = client
        .semaphore(&name)
        .with_permits(1)
        .expect("permits")
        .acquire(1)
        .await
        .expect("acquire");
    let all = client.inspect(None, &name).await.expect("inspect");
    assert_eq!(all.len(), 3, "{all:?}");
    for object in &all {
        if object.kind == Kind::Election {
            assert!(object.leader.is_some());
        } else {
            assert_eq!(object.leader, None, "{object:?}");
            let json = serde_json::to_value(object).expect("serialize");
            assert_eq!(json["leader"], serde_json::Value::Null, "{json}");
        }
    }
    lock.unlock().await.expect("unlock");
    sem.release().await.expect("release");

    // Resigned: nobody leads (the term counter may stay).
    leadership.resign().await.expect("resign");
    let found = client
        .inspect(Some(Kind::Election), &name)
        .await
        .expect("inspect");
    for object in &found {
        assert_eq!(object.leader, None, "{object:?}");
        let json = serde_json::to_value(object).expect("serialize");
        assert_eq!(json["leader"], serde_json::Value::Null, "{json}");
    }

    // The next leader is the one shown, with a larger term.
    let next = election.campaign("pod-2").await.expect("campaign");
    let found = election_inspection(&client, &name).await;
    let leader = found.leader.expect("the next leader");
    assert_eq!(leader.value, "pod-2");
    assert_eq!(leader.term, next.term());
    next.resign().await.expect("resign");
    client.shutdown().await.expect("shutdown");
}

// ---------------------------------------------------------------------------------------------
// 4. FencedGuard
// ---------------------------------------------------------------------------------------------

/// Rustdoc of `FencedGuard`: "its `LockGuard` with the acquisition's fencing token, which a
/// fenced lock's acquisition always has (`fencing_token` is a `u64`). Everything else is the
/// lock guard's, through `Deref`: `is_lost`, `lost`, `scope`, `hold_count`, ... Code that treats
/// every kind of lock alike takes the `LockGuard` (`into_lock_guard`, or `.into()`), whose
/// `fencing_token` is then `Some` of the same token." and `FencedGuard::fencing_token`:
/// "greater than every token handed out before it for this lock (re-entries included)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_guard_tokens_grow_and_survive_the_conversion_to_a_lock_guard() {
    let redis = spawned().await;
    let a = Client::connect(redis.url()).await.expect("connect");
    let b = Client::connect(redis.url()).await.expect("connect");
    let name = unique("docs-fenced");
    let lock = a.fenced_lock(&name);
    let mut tokens: Vec<u64> = Vec::new();

    // Acquire, re-enter twice (nested), each re-entry a new larger token.
    let outer: FencedGuard = lock.lock().await.expect("lock");
    let first: u64 = outer.fencing_token();
    tokens.push(first);
    assert!(!outer.is_lost());
    assert!(outer.is_watchdog());
    assert_eq!(outer.hold_count(), 1);
    assert_eq!(outer.name(), name);
    let (inner, innermost) = outer
        .scope(async {
            let inner = lock.lock().await.expect("re-entry");
            let innermost = inner.scope(lock.lock()).await.expect("second re-entry");
            (inner, innermost)
        })
        .await;
    assert_eq!(inner.hold_count(), 2);
    assert_eq!(innermost.hold_count(), 3);
    tokens.push(inner.fencing_token());
    tokens.push(innermost.fencing_token());
    let inspected = a
        .inspect(Some(Kind::FencedLock), &name)
        .await
        .expect("inspect");
    assert_eq!(
        inspected[0].fencing_token,
        Some(innermost.fencing_token()),
        "the fencing counter is the last token minted"
    );

    // into_lock_guard and .into(): Some of the same token, same guard otherwise.
    let innermost_token = innermost.fencing_token();
    let as_lock: LockGuard = innermost.into_lock_guard();
    assert_eq!(as_lock.fencing_token(), Some(innermost_token));
    assert_eq!(as_lock.hold_count(), 3);
    as_lock.unlock().await.expect("unlock");
    let inner_token = inner.fencing_token();
    let as_lock: LockGuard = inner.into();
    assert_eq!(as_lock.fencing_token(), Some(inner_token));
    as_lock.unlock().await.expect("unlock");
    outer.unlock().await.expect("unlock");

    // Later acquisitions, from another client, with a lease, by try_lock: larger still.
    let other = b.fenced_lock(&name);
    let g = other.lock().await.expect("lock");
    tokens.push(g.fencing_token());
    g.unlock().await.expect("unlock");
    let g = lock
        .lock_with_lease(Duration::from_secs(30))
        .await
        .expect("lock_with_lease");
    assert!(!g.is_watchdog());
    tokens.push(g.fencing_token());
    // A waiter from the other client is granted with a larger token.
    let other2 = other.clone();
    let waiting = tokio::spawn(async move { other2.lock().await });
    until_waiting(&b, 1).await;
    g.unlock().await.expect("unlock");
    let granted = within(HANG, "the waiter", waiting)
        .await
        .expect("task")
        .expect("granted");
    tokens.push(granted.fencing_token());
    granted.unlock().await.expect("unlock");
    let g = lock
        .try_lock(Duration::ZERO, None)
        .await
        .expect("try_lock")
        .expect("free");
    tokens.push(g.fencing_token());
    // A plain Lock's guard has no token.
    let plain = a.lock(&name).lock().await.expect("plain lock");
    assert_eq!(plain.fencing_token(), None);
    plain.unlock().await.expect("unlock");
    g.unlock().await.expect("unlock");

    for pair in tokens.windows(2) {
        assert!(pair[0] < pair[1], "tokens must strictly grow: {tokens:?}");
    }
    a.shutdown().await.expect("shutdown");
    b.shutdown().await.expect("shutdown");
}

// ---------------------------------------------------------------------------------------------
// 5. Client::shutdown and waiting calls
// ---------------------------------------------------------------------------------------------

type Waiting = tokio::task::JoinHandle<Result<(), Error>>;

/// Shuts `waiter` down while `call` waits on the `kind` object `name` (held by `holder`), and
/// checks, as soon as the call has returned `Error::Shutdown`, that the object's line in Redis
/// is empty; then that the holder's release grants it to nobody.
async fn shutdown_leaves_the_line(
    observer: &Client,
    waiter: Client,
    kind: Kind,
    name: &str,
    call: Waiting,
    release: impl std::future::Future<Output = ()>,
) {
    until_waiters_in_redis(observer, kind, name, 1).await;
    let shutting = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.shutdown().await }
    });
    let out = within(HANG, "the waiting call to return", call)
        .await
        .expect("task");
    let found = observer.inspect(Some(kind), name).await.expect("inspect");
    let waiters: Vec<String> = found.iter().flat_map(|o| o.waiters.clone()).collect();
    assert!(matches!(out, Err(Error::Shutdown)), "{kind:?}: {out:?}");
    assert_eq!(
        waiters,
        Vec::<String>::new(),
        "{kind:?}: the call returned Error::Shutdown while still in the line"
    );
    let _ = within(HANG, "shutdown", shutting).await;
    release.await;
    let found = observer.inspect(Some(kind), name).await.expect("inspect");
    for object in &found {
        assert!(
            object.holders.is_empty(),
            "{kind:?}: the release granted the object to the shut-down waiter: {object:?}"
        );
    }
}

/// Rustdoc of `Client::shutdown`: "wakes every waiting task with `Error::Shutdown`; a waiting
/// call leaves its object's line before it returns that error (within the command timeout), so
/// that no release grants the object to it." Tried with every kind that waits in a line kept in
/// Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_call_has_left_its_line_when_it_returns_shutdown() {
    let redis = spawned().await;
    let url = redis.url();
    let holder = Client::connect(url.as_str()).await.expect("connect");
    let observer = Client::connect(url.as_str()).await.expect("connect");
    let connect = || async { Client::connect(url.as_str()).await.expect("connect") };

    // Lock.
    let name = unique("sd-lock");
    let held = holder.lock(&name).lock().await.expect("lock");
    let waiter = connect().await;
    let lock = waiter.lock(&name);
    let call: Waiting = tokio::spawn(async move { lock.lock().await.map(drop) });
    let release = async { held.unlock().await.expect("unlock") };
    shutdown_leaves_the_line(&observer, waiter, Kind::Lock, &name, call, release).await;

    // FencedLock.
    let name = unique("sd-fenced");
    let held = holder.fenced_lock(&name).lock().await.expect("lock");
    let waiter = connect().await;
    let lock = waiter.fenced_lock(&name);
    let call: Waiting = tokio::spawn(async move { lock.lock().await.map(drop) });
    let release = async { held.unlock().await.expect("unlock") };
    shutdown_leaves_the_line(&observer, waiter, Kind::FencedLock, &name, call, release).await;

    // FairLock.
    let name = unique("sd-fair");
    let held = holder.fair_lock(&name).lock().await.expect("lock");
    let waiter = connect().await;
    let lock = waiter.fair_lock(&name);
    let call: Waiting = tokio::spawn(async move { lock.lock().await.map(drop) });
    let release = async { held.unlock().await.expect("unlock") };
    shutdown_leaves_the_line(&observer, waiter, Kind::FairLock, &name, call, release).await;

    // ReadWriteLock, a read waiting behind a write.
    let name = unique("sd-rw-read");
    let held = holder
        .read_write_lock(&name)
        .write_lock()
        .await
        .expect("write");
    let waiter = connect().await;
    let lock = waiter.read_write_lock(&name);
    let call: Waiting = tokio::spawn(async move { lock.read_lock().await.map(drop) });
    let release = async { held.unlock().await.expect("unlock") };
    shutdown_leaves_the_line(&observer, waiter, Kind::ReadWriteLock, &name, call, release).await;

    // ReadWriteLock, a write waiting behind a read.
    let name = unique("sd-rw-write");
    let held = holder
        .read_write_lock(&name)
        .read_lock()
        .await
        .expect("read");
    let waiter = connect().await;
    let lock = waiter.read_write_lock(&name);
    let call: Waiting = tokio::spawn(async move { lock.write_lock().await.map(drop) });
    let release = async { held.unlock().await.expect("unlock") };
    shutdown_leaves_the_line(&observer, waiter, Kind::ReadWriteLock, &name, call, release).await;

    // Semaphore.
    let name = unique("sd-sem");
    let held = holder
        .semaphore(&name)
        .with_permits(1)
        .expect("permits")
        .acquire(1)
        .await
        .expect("acquire");
    let waiter = connect().await;
    let sem = waiter.semaphore(&name).with_permits(1).expect("permits");
    let call: Waiting = tokio::spawn(async move { sem.acquire(1).await.map(drop) });
    let release = async { held.release().await.expect("release") };
    shutdown_leaves_the_line(&observer, waiter, Kind::Semaphore, &name, call, release).await;

    // PermitExpirableSemaphore.
    let name = unique("sd-pes");
    let held = holder
        .permit_expirable_semaphore(&name)
        .with_permits(1)
        .expect("permits")
        .acquire(Duration::from_secs(60))
        .await
        .expect("acquire");
    let waiter = connect().await;
    let sem = waiter
        .permit_expirable_semaphore(&name)
        .with_permits(1)
        .expect("permits");
    let call: Waiting =
        tokio::spawn(async move { sem.acquire(Duration::from_secs(60)).await.map(drop) });
    let release = async { held.release().await.expect("release") };
    shutdown_leaves_the_line(
        &observer,
        waiter,
        Kind::PermitExpirableSemaphore,
        &name,
        call,
        release,
    )
    .await;

    // Election: a candidate waiting behind the leader.
    let name = unique("sd-election");
    let held = holder
        .election(&name)
        .campaign("leader")
        .await
        .expect("campaign");
    let waiter = connect().await;
    let election = waiter.election(&name);
    let call: Waiting = tokio::spawn(async move { election.campaign("candidate").await.map(drop) });
    let release = async { held.resign().await.expect("resign") };
    shutdown_leaves_the_line(&observer, waiter, Kind::Election, &name, call, release).await;

    holder.shutdown().await.expect("shutdown");
    observer.shutdown().await.expect("shutdown");
}

// ---------------------------------------------------------------------------------------------
// 6. Defaults
// ---------------------------------------------------------------------------------------------

/// Rustdoc: `DEFAULT_COMMAND_TIMEOUT` "The default command timeout: 5 s.",
/// `DEFAULT_CONNECT_TIMEOUT` "The default connect timeout: 5 s.", `DEFAULT_RECHECK_INTERVAL` "a
/// third of a lock waiter's keep-alive (`WAITER_KEEPALIVE`, 5 s)"; guide: "the command timeout
/// (5 s by default)", "the connect timeout (5 s by default)", "the recheck interval (≈ 1.7 s by
/// default, ...)"; `ClientBuilder::recheck_interval`: "default 5 s / 3 ≈ 1.7 s".
#[test]
fn the_default_constants_are_the_documented_values() {
    assert_eq!(lockkit::DEFAULT_COMMAND_TIMEOUT, Duration::from_secs(5));
    assert_eq!(lockkit::DEFAULT_CONNECT_TIMEOUT, Duration::from_secs(5));
    assert_eq!(
        lockkit::protocol::lock::WAITER_KEEPALIVE,
        Duration::from_secs(5)
    );
    assert_eq!(
        lockkit::DEFAULT_RECHECK_INTERVAL,
        lockkit::protocol::lock::WAITER_KEEPALIVE / 3
    );
    assert_eq!(
        lockkit::DEFAULT_RECHECK_INTERVAL,
        Duration::from_secs(5) / 3
    );
    // "≈ 1.7 s": rounds to 1.7 s at one decimal.
    let tenths = (lockkit::DEFAULT_RECHECK_INTERVAL.as_secs_f64() * 10.0).round();
    assert!((tenths - 17.0).abs() < f64::EPSILON, "{tenths}");
}

/// Guide, "Bounds while Redis is down": "every other call (`is_locked()`, ...) | the command
/// timeout | `Err(Redis(err))`, `err.is_timeout()`, naming the call or script, the object and
/// the bound: ``... no answer from Redis within 5.0s (the command timeout is 5s)``" and
/// "`Client::connect`, `ClientBuilder::build` | the connect timeout (5 s by default) |
/// `Err(Connect { reason: TimedOut(spent), .. })`: `no answer within 1.0s (the connect timeout;
/// …)`". A client built with no timeout set uses the default constants: its errors name them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_default_settings_uses_the_default_timeouts() {
    let redis = spawned().await;
    let proxy = FaultProxy::start(redis.addr()).await.expect("a proxy");
    let client = Client::connect(proxy.url()).await.expect("connect");
    let name = unique("docs-defaults");
    proxy.pause();
    let out = within(HANG, "is_locked on a frozen server", async {
        client.lock(&name).is_locked().await
    })
    .await;
    match out {
        Err(Error::Redis(err)) => {
            assert!(err.is_timeout(), "{err}");
            let text = err.to_string();
            assert!(
                text.contains("the command timeout is 5s"),
                "the default command timeout is named: {text}"
            );
        }
        other => panic!("expected a Redis timeout, got {other:?}"),
    }
    proxy.resume();
    drop(client);

    // The default connect timeout.
    let frozen = FaultProxy::start(redis.addr()).await.expect("a proxy");
    frozen.pause();
    let out = within(
        HANG,
        "a connect to a frozen server",
        Client::connect(frozen.url()),
    )
    .await;
    match out {
        Err(
            ref err @ Error::Connect {
                reason: ConnectFailure::TimedOut(spent),
                ..
            },
        ) => {
            let text = err.to_string();
            assert!(text.contains("the connect timeout"), "{spent:?}: {text}");
        }
        other => panic!("expected a connect timeout, got {other:?}"),
    }
}
