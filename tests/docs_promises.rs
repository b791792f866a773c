//! Promises of the documentation (README, `docs/guide.md`, `docs/reliability.md`, rustdoc),
//! tested the way a user's code would run into them: each test is named after the promise and
//! quotes the sentence it checks. Written from the docs alone (issue 27's areas).
//!
//! Timing: no test asserts a duration except where a documented bound is itself the promise;
//! there the slack is stated next to the assertion.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures::StreamExt;
use lockkit::protocol::keys::Kind;
use lockkit::{Client, Error, LeaderChange};
use lockkit_suite::{client, client_with, spawned, unique, until_waiters_in_redis, within};
use lockkit_testkit::{FaultProxy, RedisServer, RespValue};

/// A generous hang guard (never a performance assertion).
const HANG: Duration = Duration::from_secs(60);

async fn builder_client(url: &str, command_timeout: Duration, recheck: Option<Duration>) -> Client {
    let mut builder = Client::builder().url(url).command_timeout(command_timeout);
    if let Some(recheck) = recheck {
        builder = builder.recheck_interval(recheck);
    }
    builder.build().await.expect("client")
}

async fn cmd(server: &RedisServer, args: &[&str]) -> RespValue {
    server.command(args).await.expect("command")
}

/// The next item of an observer, with a hang guard.
async fn next_change(observer: &mut lockkit::Observer, what: &str) -> Result<LeaderChange, Error> {
    within(HANG, what, observer.next())
        .await
        .expect("the observer's stream ended")
}

/// The next item that is not an error (errors are reported and skipped, as the guide's loop does).
async fn next_ok(observer: &mut lockkit::Observer, what: &str) -> LeaderChange {
    loop {
        match next_change(observer, what).await {
            Ok(change) => return change,
            Err(Error::Redis(err)) => eprintln!("observer error (skipped): {err}"),
            Err(err) => panic!("{what}: the stream ended with {err}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Election
// ---------------------------------------------------------------------------------------------

/// guide.md: "`leader()` reads the record and answers only while the record's hold is live" and
/// issue 27 §1.1's promise "The record must live exactly as long as the leadership it names":
/// a leader that leads longer than the token counter's TTL (`token_counter_ttl(60 s)`, the
/// shortest accepted) without proclaiming is still reported by `leader()`, by a new observer's
/// `Current`, and a running observer still delivers its next `proclaim`.
#[tokio::test]
async fn the_leader_record_lives_as_long_as_the_leadership_longer_than_the_token_counter_ttl() {
    let server = spawned().await;
    let leader_client = Client::builder()
        .url(server.url())
        .token_counter_ttl(Duration::from_secs(60))
        .build()
        .await
        .expect("client");
    let watcher = client(&server.url()).await;
    let name = unique("long-leader");
    let leadership = leader_client
        .election(&name)
        .campaign("a")
        .await
        .expect("campaign");
    let mut running = watcher.election(&name).observe();
    assert_eq!(
        next_ok(&mut running, "Current").await,
        LeaderChange::Current(Some(lockkit::Leader {
            term: leadership.term(),
            value: "a".into()
        }))
    );
    // Time passing is the point: lead past the token counter's TTL (the scripts' longest).
    tokio::time::sleep(Duration::from_secs(65)).await;
    assert!(
        !leadership.is_lost(),
        "the leadership itself is renewed by the watchdog"
    );
    let expected = lockkit::Leader {
        term: leadership.term(),
        value: "a".into(),
    };
    assert_eq!(
        watcher.election(&name).leader().await.expect("leader"),
        Some(expected.clone()),
        "leader() after 65 s of leading"
    );
    let mut fresh = watcher.election(&name).observe();
    assert_eq!(
        next_ok(&mut fresh, "a new observer's Current").await,
        LeaderChange::Current(Some(expected))
    );
    leadership.proclaim("a2").await.expect("proclaim");
    assert_eq!(
        next_ok(&mut running, "the proclaim after 65 s").await,
        LeaderChange::Proclaimed(lockkit::Leader {
            term: leadership.term(),
            value: "a2".into()
        })
    );
}

/// README: "idempotent under re-sent commands: yes", and `observe`'s rustdoc: "Nothing is
/// delivered twice". A `proclaim` whose reply is lost with its connection is re-sent; it
/// returns `Ok` and observers see its `Proclaimed` once.
#[tokio::test]
async fn a_proclaim_re_sent_after_a_lost_reply_is_announced_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let leader_client = client(&proxy.url()).await;
    let watcher = client(&server.url()).await;
    let name = unique("resent-proclaim");
    let leadership = leader_client
        .election(&name)
        .campaign("v1")
        .await
        .expect("campaign");
    let mut observer = watcher.election(&name).observe();
    assert!(matches!(
        next_ok(&mut observer, "Current").await,
        LeaderChange::Current(Some(_))
    ));

    proxy.cut_after_request_containing(b"v2-resent-marker".to_vec());
    leadership
        .proclaim("v2-resent-marker")
        .await
        .expect("the re-sent proclaim");
    assert!(proxy.triggered(), "the proclaim's reply was lost");
    leadership.proclaim("v3").await.expect("the next proclaim");

    let term = leadership.term();
    assert_eq!(
        next_ok(&mut observer, "the first Proclaimed").await,
        LeaderChange::Proclaimed(lockkit::Leader {
            term,
            value: "v2-resent-marker".into()
        })
    );
    assert_eq!(
        next_ok(&mut observer, "the next Proclaimed").await,
        LeaderChange::Proclaimed(lockkit::Leader {
            term,
            value: "v3".into()
        }),
        "the re-sent proclaim was announced twice"
    );
}

/// guide.md, Observing: "Messages published before the read (still in flight when it read the
/// leader) are dropped … a read that finds nobody leading still says where the channel stands
/// …, so a leader elected and resigned just before the read does not show up after
/// `Current(None)`." The observer's client is on a slow link (600 ms each way); a leader is
/// elected and resigns between the observer's subscription and its read.
#[tokio::test]
async fn an_observer_whose_first_read_found_nobody_drops_announcements_older_than_the_read() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.expect("proxy");
    let slow = client(&proxy.url()).await;
    let fast = client(&server.url()).await;
    let name = unique("old-news");
    proxy.set_delay(Duration::from_millis(600));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut observer = slow.election(&name).observe();
    let task = tokio::spawn(async move {
        while let Some(change) = observer.next().await {
            if tx.send(change).is_err() {
                return;
            }
        }
    });
    // The subscription is on the server: the read is at least one slow round trip away.
    within(HANG, "the observer's subscription", async {
        loop {
            let pattern = format!("*{name}*");
            if let RespValue::Array(Some(channels)) =
                cmd(&server, &["PUBSUB", "CHANNELS", &pattern]).await
            {
                if !channels.is_empty() {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let a = fast
        .election(&name)
        .campaign("a")
        .await
        .expect("campaign a");
    a.resign().await.expect("resign a");
    let first = within(HANG, "Current", rx.recv())
        .await
        .expect("item")
        .expect("ok");
    assert_eq!(
        first,
        LeaderChange::Current(None),
        "the read came after a's resignation"
    );
    let b = fast
        .election(&name)
        .campaign("b")
        .await
        .expect("campaign b");
    let second = within(HANG, "the next change", rx.recv())
        .await
        .expect("item")
        .expect("ok");
    assert_eq!(
        second,
        LeaderChange::Elected(lockkit::Leader {
            term: b.term(),
            value: "b".into()
        }),
        "an announcement from before the read was delivered after Current(None)"
    );
    task.abort();
}

/// guide.md: "**Terms never go back for one client.** `leader()`, `Current` and `Resynced` do
/// not report a leader whose term is smaller than one the same client has already seen lead".
/// Save while `a` leads; `a` resigns and `b` leads; Redis restarts from the snapshot.
#[tokio::test]
async fn observed_terms_never_go_back_for_one_client_after_a_restore_from_an_older_snapshot() {
    let mut server = spawned().await;
    let (ca, cb, cc) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    let name = unique("rollback");
    let a = ca.election(&name).campaign("a").await.expect("campaign a");
    let mut observer = cc.election(&name).observe();
    assert!(matches!(
        next_ok(&mut observer, "Current").await,
        LeaderChange::Current(Some(_))
    ));
    assert!(matches!(
        cmd(&server, &["SAVE"]).await,
        RespValue::Simple(_)
    ));
    a.resign().await.expect("resign a");
    let b = cb.election(&name).campaign("b").await.expect("campaign b");
    let b_term = b.term();
    loop {
        match next_ok(&mut observer, "b's Elected").await {
            LeaderChange::Elected(leader) if leader.term == b_term => break,
            LeaderChange::Resigned { .. } => {}
            other => panic!("unexpected before b's Elected: {other:?}"),
        }
    }
    server
        .restart_from_disk()
        .await
        .expect("restart from the snapshot");
    let resynced = loop {
        match next_ok(&mut observer, "the Resynced after the restore").await {
            LeaderChange::Resynced(leader) => break leader,
            other => eprintln!("after the restore: {other:?}"),
        }
    };
    assert!(
        resynced.as_ref().is_none_or(|leader| leader.term > b_term),
        "Resynced went back to {resynced:?} after term {b_term} was delivered"
    );
    let now = cc.election(&name).leader().await.expect("leader");
    assert!(
        now.as_ref().is_none_or(|leader| leader.term > b_term),
        "leader() went back to {now:?} after this client saw term {b_term}"
    );
    drop(b);
}

/// The guide's lead loop, copied as a user copies it; `run_scheduler` runs until stopped.
async fn guide_lead_loop(client: lockkit::Client) -> Result<(), lockkit::Error> {
    async fn run_scheduler(_term: u64) {
        std::future::pending::<()>().await;
    }
    client
        .election("scheduler")
        .lead("pod-a", |leadership| async move {
            tokio::select! {
                () = run_scheduler(leadership.term()) => {}
                () = leadership.lost() => {} // stop cleanly before the body is dropped
            }
            Ok::<(), lockkit::Error>(())
        })
        .await?;
    Ok(())
}

/// Waits until an observer sees `pod-a` lead with a term greater than `after`; returns it.
async fn until_pod_a_leads_after(observer: &mut lockkit::Observer, after: u64) -> u64 {
    loop {
        match next_ok(observer, "pod-a leading again").await {
            LeaderChange::Current(Some(l))
            | LeaderChange::Resynced(Some(l))
            | LeaderChange::Elected(l)
                if l.value == "pod-a" && l.term > after =>
            {
                return l.term;
            }
            _ => {}
        }
    }
}

/// guide.md, The lead loop: "A service that should always have a leader runs `lead`" and "when
/// leadership is lost drops the body's future and campaigns again". The guide's own example,
/// after a `FLUSHALL` takes its leadership, must lead again.
#[tokio::test]
async fn the_guides_lead_loop_keeps_leading_after_a_flushall() {
    let server = spawned().await;
    let pod = client_with(&server.url(), Duration::from_secs(3)).await;
    let watcher = client(&server.url()).await;
    let mut observer = watcher.election("scheduler").observe();
    let lead = tokio::spawn(guide_lead_loop(pod.clone()));
    let first = until_pod_a_leads_after(&mut observer, 0).await;
    assert!(matches!(
        cmd(&server, &["FLUSHALL"]).await,
        RespValue::Simple(_)
    ));
    let again = within(HANG, "the lead loop leading again", async {
        tokio::select! {
            term = until_pod_a_leads_after(&mut observer, first) => term,
            ended = lead => panic!("the lead loop ended after the FLUSHALL: {ended:?}"),
        }
    })
    .await;
    assert!(again > first);
}

/// guide.md, The lead loop: "A service that should always have a leader runs `lead`"; the
/// rustdoc: "Leads for as long as the service runs". The guide's own example, through a Redis
/// outage (killed for 3 s, three command timeouts), must lead again once Redis is back.
#[tokio::test]
async fn the_guides_lead_loop_keeps_leading_through_a_redis_outage() {
    let mut server = spawned().await;
    let pod = Client::builder()
        .url(server.url())
        .watchdog_timeout(Duration::from_secs(3))
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .expect("client");
    let watcher = client(&server.url()).await;
    let mut observer = watcher.election("scheduler").observe();
    let lead = tokio::spawn(guide_lead_loop(pod.clone()));
    let first = until_pod_a_leads_after(&mut observer, 0).await;
    server.kill();
    // The outage's length is the condition under test (longer than the lease and than every
    // command timeout), not a stand-in for an event.
    tokio::time::sleep(Duration::from_secs(5)).await;
    server.start_again().await.expect("start again");
    let again = within(HANG, "the lead loop leading again", async {
        tokio::select! {
            term = until_pod_a_leads_after(&mut observer, first) => term,
            ended = lead => panic!("the lead loop ended during the outage: {ended:?}"),
        }
    })
    .await;
    assert!(again > first);
}

/// Issue 27 §1.6 / README: "a task that waits for a lock it acquired itself and has not
/// released logs a warning" — a re-campaign of `lead` after a loss is not such a wait: no
/// warning of a self-wait is logged.
#[tokio::test]
async fn a_lead_loop_campaigning_again_after_a_loss_logs_no_self_wait_warning() {
    let warnings = lockkit_suite::Warnings::default();
    let _default = tracing::subscriber::set_default(warnings.clone());
    let server = spawned().await;
    let pod = client_with(&server.url(), Duration::from_secs(3)).await;
    let watcher = client(&server.url()).await;
    let mut observer = watcher.election("scheduler").observe();
    let lead = tokio::spawn(guide_lead_loop(pod.clone()));
    let first = until_pod_a_leads_after(&mut observer, 0).await;
    assert!(matches!(
        cmd(&server, &["FLUSHALL"]).await,
        RespValue::Simple(_)
    ));
    let led_again = within(HANG, "leading again", async {
        tokio::select! {
            term = until_pod_a_leads_after(&mut observer, first) => Some(term),
            _ = lead => None,
        }
    })
    .await;
    let self_waits: Vec<String> = warnings
        .take()
        .into_iter()
        .filter(|w| w.contains("acquired itself") || w.contains("acquire inside"))
        .collect();
    assert!(
        self_waits.is_empty(),
        "self-wait warnings on a re-campaign: {self_waits:?}"
    );
    assert!(
        led_again.is_some(),
        "the lead loop ended (see the lead-loop tests)"
    );
}

/// guide.md, Observing: "While Redis does not answer (killed, cut off, frozen, `CLIENT PAUSE`d),
/// the stream says so: it yields an `Error::Redis` naming the election within the command
/// timeout plus 1 s … once Redis answers it yields `Resynced` and goes on." Checked with the
/// server frozen (`SIGSTOP`), the case no disconnect reveals; bound 1 s command timeout + 1 s,
/// allowed 2× + 1 s = 5 s.
#[tokio::test]
async fn an_observer_yields_an_error_naming_the_election_within_its_bound_while_redis_is_frozen() {
    let server = spawned().await;
    let watcher = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let name = unique("frozen-observer");
    let mut observer = watcher.election(&name).observe();
    assert_eq!(
        next_ok(&mut observer, "Current").await,
        LeaderChange::Current(None)
    );
    server.pause().expect("SIGSTOP");
    let frozen_at = Instant::now();
    let first = next_change(&mut observer, "the error").await;
    let took = frozen_at.elapsed();
    server.resume().expect("SIGCONT");
    match first {
        Err(Error::Redis(err)) => {
            assert!(
                err.to_string().contains(&name),
                "the error names the election: {err}"
            );
        }
        other => panic!("expected an Error::Redis while frozen, got {other:?}"),
    }
    assert!(
        took <= Duration::from_secs(5),
        "the error came {took:?} into the freeze (bound 2 s)"
    );
    loop {
        match next_change(&mut observer, "the Resynced").await {
            Ok(LeaderChange::Resynced(None)) => break,
            Err(Error::Redis(_)) => {}
            other => panic!("expected Resynced(None) after the resume, got {other:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Bounds while Redis is down
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Killed,
    Frozen,
    Paused,
}

type Wait = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// The holders' fixed lease: longer than any bound and the hang guard.
const HOLDER_LEASE: Duration = Duration::from_secs(120);

/// Every waiting call without a `wait` of the guide's Bounds table, each on an object held for
/// [`HOLDER_LEASE`] by `holder`, started on `waiter`. Returns (object name, the wait).
async fn every_unbounded_wait(holder: &Client, waiter: &Client) -> Vec<(String, Wait)> {
    let mut waits: Vec<(String, Wait)> = Vec::new();
    let mut keep = Vec::new();

    let n = unique("b-lock");
    keep.push(
        holder
            .lock(&n)
            .lock_with_lease(HOLDER_LEASE)
            .await
            .expect("hold"),
    );
    let l = waiter.lock(&n);
    waits.push((n, Box::pin(async move { l.lock().await.map(drop) })));

    let n = unique("b-fenced");
    keep.push(
        holder
            .fenced_lock(&n)
            .lock_with_lease(HOLDER_LEASE)
            .await
            .expect("hold")
            .into(),
    );
    let l = waiter.fenced_lock(&n);
    waits.push((n, Box::pin(async move { l.lock().await.map(drop) })));

    let n = unique("b-fair");
    keep.push(
        holder
            .fair_lock(&n)
            .lock_with_lease(HOLDER_LEASE)
            .await
            .expect("hold"),
    );
    let l = waiter.fair_lock(&n);
    waits.push((n, Box::pin(async move { l.lock().await.map(drop) })));

    let n = unique("b-rw-read");
    keep.push(
        holder
            .read_write_lock(&n)
            .write_lock_with_lease(HOLDER_LEASE)
            .await
            .expect("hold"),
    );
    let l = waiter.read_write_lock(&n);
    waits.push((n, Box::pin(async move { l.read_lock().await.map(drop) })));

    let n = unique("b-rw-write");
    keep.push(
        holder
            .read_write_lock(&n)
            .read_lock_with_lease(HOLDER_LEASE)
            .await
            .expect("hold"),
    );
    let l = waiter.read_write_lock(&n);
    waits.push((n, Box::pin(async move { l.write_lock().await.map(drop) })));

    let n = unique("b-multi");
    let n2 = unique("b-multi-free");
    keep.push(
        holder
            .lock(&n)
            .lock_with_lease(HOLDER_LEASE)
            .await
            .expect("hold"),
    );
    let m = waiter.multi_lock([waiter.lock(&n), waiter.lock(&n2)]);
    waits.push((n, Box::pin(async move { m.lock().await.map(drop) })));

    let n = unique("b-sem");
    let sem = holder.semaphore(&n).with_permits(1).expect("permits");
    let permit = sem.acquire_with_lease(1, HOLDER_LEASE).await.expect("hold");
    let s = waiter.semaphore(&n).with_permits(1).expect("permits");
    waits.push((n, Box::pin(async move { s.acquire(1).await.map(drop) })));

    let n = unique("b-psem");
    let psem = holder
        .permit_expirable_semaphore(&n)
        .with_permits(1)
        .expect("permits");
    let ppermit = psem.acquire(HOLDER_LEASE).await.expect("hold");
    let s = waiter
        .permit_expirable_semaphore(&n)
        .with_permits(1)
        .expect("permits");
    waits.push((
        n,
        Box::pin(async move { s.acquire(Duration::from_secs(60)).await.map(drop) }),
    ));

    let n = unique("b-latch");
    assert!(holder
        .count_down_latch(&n)
        .try_set_count(1)
        .await
        .expect("set"));
    let latch = waiter.count_down_latch(&n);
    waits.push((
        n,
        Box::pin(async move {
            let opened = latch.wait(Duration::MAX).await?;
            panic!("the latch opened ({opened}) with nobody counting down");
        }),
    ));

    let n = unique("b-election");
    let leadership = holder
        .election(&n)
        .campaign_with_lease("holder", HOLDER_LEASE)
        .await
        .expect("lead");
    let e = waiter.election(&n);
    waits.push((
        n,
        Box::pin(async move { e.campaign("waiter").await.map(drop) }),
    ));

    // The holds live as long as the process: leak them into a task that never ends.
    tokio::spawn(async move {
        let _held = (keep, permit, ppermit, leadership);
        std::future::pending::<()>().await;
    });
    waits
}

/// Runs every unbounded wait, applies `fault`, and checks the guide's row: each fails with
/// `Err(Redis(err))`, `err.is_timeout()`, naming the object and the bound, within `bound`
/// (allowed 2× + 1 s), and none succeeds.
async fn unbounded_waits_keep_their_bound(
    fault: Fault,
    recheck: Option<Duration>,
    bound: Duration,
) {
    let mut server = spawned().await;
    let holder = client(&server.url()).await;
    let waiter = builder_client(&server.url(), Duration::from_secs(1), recheck).await;
    let waits = every_unbounded_wait(&holder, &waiter).await;
    let count = waits.len();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (name, wait) in waits {
        let tx = tx.clone();
        tokio::spawn(async move {
            let result = wait.await;
            let _ = tx.send((name, result, Instant::now()));
        });
    }
    lockkit_suite::until_waiting(&waiter, count).await;
    let started = Instant::now();
    match fault {
        Fault::Killed => server.kill(),
        Fault::Frozen => server.pause().expect("SIGSTOP"),
        Fault::Paused => {
            let reply = cmd(&server, &["CLIENT", "PAUSE", "20000", "ALL"]).await;
            assert!(matches!(reply, RespValue::Simple(_)), "{reply:?}");
        }
    }
    let allowed = bound * 2 + Duration::from_secs(1);
    let mut problems = Vec::new();
    for _ in 0..count {
        let Some((name, result, at)) = within(HANG, "every wait to end", rx.recv()).await else {
            break;
        };
        let took = at.duration_since(started);
        match result {
            Err(Error::Redis(err)) => {
                let text = err.to_string();
                if !err.is_timeout() {
                    problems.push(format!("{name}: not a timeout: {text}"));
                }
                if !text.contains(&name) || !text.contains("within") {
                    problems.push(format!(
                        "{name}: the message names not the object and bound: {text}"
                    ));
                }
                if took > allowed {
                    problems.push(format!(
                        "{name}: failed after {took:?} (bound {bound:?}): {text}"
                    ));
                }
            }
            other => problems.push(format!("{name}: {other:?} after {took:?}")),
        }
    }
    match fault {
        Fault::Killed => server.start_again().await.expect("start again"),
        Fault::Frozen => server.resume().expect("SIGCONT"),
        // The pause ends by itself (a new connection could not send `CLIENT UNPAUSE`).
        Fault::Paused => {}
    }
    assert!(
        problems.is_empty(),
        "{fault:?}: {} of {count} waits broke the bound:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// guide.md, Bounds while Redis is down: every wait without a `wait` fails with "**the command
/// timeout** after a connection is lost (Redis killed …: every waiting call of the client is
/// woken at once and tries)", as `Err(Redis(err))`, `err.is_timeout()`, "naming the object and
/// the bound". Command timeout 1 s; holders' leases 120 s; allowed 2× + 1 s = 3 s.
#[tokio::test]
async fn every_unbounded_wait_fails_within_the_command_timeout_when_redis_is_killed() {
    unbounded_waits_keep_their_bound(Fault::Killed, None, Duration::from_secs(1)).await;
}

/// guide.md, Bounds while Redis is down: "**the recheck interval + the command timeout** when
/// Redis stops answering without closing the connection (a frozen … server)", with
/// `ClientBuilder::recheck_interval` set to 3 s (rustdoc: "a waiting call fails within this
/// interval plus the command timeout"). Bound 3 s + 1 s, allowed 2× + 1 s = 9 s.
#[tokio::test]
async fn every_unbounded_wait_fails_within_the_recheck_interval_plus_the_command_timeout_when_redis_is_frozen(
) {
    let recheck = Duration::from_secs(3);
    unbounded_waits_keep_their_bound(
        Fault::Frozen,
        Some(recheck),
        recheck + Duration::from_secs(1),
    )
    .await;
}

/// guide.md, Bounds while Redis is down: "the recheck interval + the command timeout when Redis
/// stops answering without closing the connection (a … `CLIENT PAUSE`d server)"; default
/// recheck interval (≈ 1.7 s), command timeout 1 s: bound 2.7 s, allowed 2× + 1 s = 6.3 s.
#[tokio::test]
async fn every_unbounded_wait_fails_within_the_recheck_interval_plus_the_command_timeout_when_redis_is_paused(
) {
    unbounded_waits_keep_their_bound(Fault::Paused, None, Duration::from_millis(2_667)).await;
}

/// guide.md, Semaphore: "a `try_acquire(1, 10 s)` whose permits were freed by a `FLUSHALL` gets
/// them instead of timing out with every permit free" (also for the permit-expirable semaphore,
/// whose waiters follow the same recheck interval).
#[tokio::test]
async fn a_semaphore_waiter_gets_permits_freed_by_a_flushall_instead_of_timing_out() {
    let server = spawned().await;
    // Holders' watchdog leases of 300 s: a waiter that looked again only at a lease end, or
    // was woken only by the old holder's next renewal (100 s), would time out.
    let holder = client_with(&server.url(), Duration::from_secs(300)).await;
    let waiter = client(&server.url()).await;
    let (n, pn) = (unique("flushed-sem"), unique("flushed-psem"));
    let permits = holder
        .semaphore(&n)
        .with_permits(2)
        .expect("p")
        .acquire(2)
        .await
        .expect("hold");
    let ppermit = holder
        .permit_expirable_semaphore(&pn)
        .with_permits(1)
        .expect("p")
        .acquire(Duration::from_secs(120))
        .await
        .expect("hold");
    let sem = waiter.semaphore(&n).with_permits(2).expect("p");
    let psem = waiter
        .permit_expirable_semaphore(&pn)
        .with_permits(1)
        .expect("p");
    let wait = tokio::spawn(async move {
        tokio::join!(
            sem.try_acquire(1, Duration::from_secs(10), None),
            psem.try_acquire(Duration::from_secs(10), Duration::from_secs(60)),
        )
    });
    lockkit_suite::until_waiting(&waiter, 2).await;
    // A waiter registers before its first look; nothing announces that look, so give it
    // 500 ms (no event exists for "a waiter looked and found nothing free"): the FLUSHALL must
    // free what the waiter already found taken, not come before its first look.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(matches!(
        cmd(&server, &["FLUSHALL"]).await,
        RespValue::Simple(_)
    ));
    let (got, pgot) = within(HANG, "the waits", wait).await.expect("join");
    assert!(
        got.expect("semaphore").is_some(),
        "Semaphore::try_acquire(1, 10 s) timed out with every permit free"
    );
    assert!(
        pgot.expect("psem").is_some(),
        "PermitExpirableSemaphore::try_acquire timed out with every permit free"
    );
    drop((permits, ppermit));
}

/// guide.md, CountDownLatch: "A latch whose key is lost (data loss) is open … a waiter learns it
/// at its next check — … within the recheck interval after a `FLUSHALL`". A `wait(8 s)` on a
/// latch whose count a `FLUSHALL` removes returns `true` (default recheck ≈ 1.7 s, allowed
/// 2× + 1 s = 4.4 s < 8 s).
#[tokio::test]
async fn a_latch_waiter_finds_a_latch_opened_by_a_flushall_within_the_recheck_interval() {
    let server = spawned().await;
    // A watchdog timeout of 300 s: a waiter that looked again every third of it would miss the
    // 8 s wait; the recheck interval (default ≈ 1.7 s) is the documented bound.
    let c = client_with(&server.url(), Duration::from_secs(300)).await;
    let name = unique("flushed-latch");
    assert!(c
        .count_down_latch(&name)
        .try_set_count(1)
        .await
        .expect("set"));
    let latch = c.count_down_latch(&name);
    let wait = tokio::spawn(async move { latch.wait(Duration::from_secs(8)).await });
    lockkit_suite::until_waiting(&c, 1).await;
    // A waiter registers before its first look; nothing announces that look, so give it
    // 500 ms (no event exists for "a waiter looked and found nothing free"): the FLUSHALL must
    // free what the waiter already found taken, not come before its first look.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(matches!(
        cmd(&server, &["FLUSHALL"]).await,
        RespValue::Simple(_)
    ));
    let opened = within(HANG, "the latch wait", wait)
        .await
        .expect("join")
        .expect("wait");
    assert!(
        opened,
        "wait(8 s) returned false: the FLUSHALL was not found within the recheck interval"
    );
}

// ---------------------------------------------------------------------------------------------
// Leases and lines
// ---------------------------------------------------------------------------------------------

/// README: "`try_lock(wait, Some(lease))`: fixed lease, no renewal", the rustdoc of `try_lock`'s
/// example: "held for at most 3 s", and `campaign_with_lease`: "Leads for at most 10 s" — a
/// fixed lease granted by a release (the direct grant, with its probation) lasts the lease
/// asked for, from the grant. Lock, FencedLock, Election, lease 8 s: 4 s after the grant the
/// key's TTL (`inspect`) must be at most 4 s (+ 0.25 s for clock granularity).
#[tokio::test]
async fn a_fixed_lease_granted_by_a_release_lasts_the_lease_asked_for_counted_from_the_grant() {
    let server = spawned().await;
    let (ca, cb, cc) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    let lease = Duration::from_secs(8);
    let (ln, fnn, en) = (
        unique("granted-lease"),
        unique("granted-fenced"),
        unique("granted-election"),
    );
    let la = ca.lock(&ln).lock().await.expect("a");
    let fa = ca.fenced_lock(&fnn).lock().await.expect("a");
    let ea = ca.election(&en).campaign("a").await.expect("a");
    let (lb, fb, eb) = (cb.lock(&ln), cb.fenced_lock(&fnn), cb.election(&en));
    let waits = tokio::spawn(async move {
        let wait = Duration::from_secs(30);
        let l = async { (lb.try_lock(wait, Some(lease)).await, Instant::now()) };
        let f = async { (fb.try_lock(wait, Some(lease)).await, Instant::now()) };
        let e = async { (eb.campaign_with_lease("b", lease).await, Instant::now()) };
        tokio::join!(l, f, e)
    });
    until_waiters_in_redis(&cc, Kind::Lock, &ln, 1).await;
    until_waiters_in_redis(&cc, Kind::FencedLock, &fnn, 1).await;
    within(HANG, "b in the election's line", async {
        while cb.waiting_count() < 3 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    la.unlock().await.expect("unlock");
    fa.unlock().await.expect("unlock");
    ea.resign().await.expect("resign");
    let ((l, lt), (f, ft), (e, et)) = within(HANG, "the grants", waits).await.expect("join");
    let _held = (
        l.expect("lock").expect("granted"),
        f.expect("fenced").expect("granted"),
        e.expect("election"),
    );
    let probe = lease / 2;
    let mut problems = Vec::new();
    for (kind, name, granted) in [
        (Kind::Lock, &ln, lt),
        (Kind::FencedLock, &fnn, ft),
        (Kind::Election, &en, et),
    ] {
        tokio::time::sleep_until((granted + probe).into()).await;
        let ttl = cc.inspect(Some(kind), name).await.expect("inspect")[0].ttl;
        let since = granted.elapsed();
        let left_max = lease.saturating_sub(since) + Duration::from_millis(250);
        match ttl {
            Some(ttl) if ttl <= left_max => {}
            other => problems.push(format!("{kind:?}: {since:?} after the grant of an {lease:?} lease, TTL {other:?} (at most {left_max:?})")),
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// README: "dropping an acquire future mid-flight gives back whatever it took"; guide.md: "a
/// call that gives up (timeout, dropped future, shutdown) leaves the set at once". A waiter's
/// future dropped on a plain `std::thread` (no runtime) leaves the line: the next waiter gets
/// the lock at the release, with a `wait` (3 s) shorter than the grant probation (5 s) a ghost
/// in line would cost it. Lock and FairLock.
#[tokio::test]
async fn an_acquire_future_dropped_outside_a_runtime_leaves_its_place_in_line() {
    let server = spawned().await;
    let (ca, cb, cc, watcher) = (
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
        client(&server.url()).await,
    );
    for kind in [Kind::Lock, Kind::FairLock] {
        let name = unique("dropped-off-runtime");
        let held = match kind {
            Kind::Lock => ca.lock(&name).lock().await.expect("hold"),
            _ => ca.fair_lock(&name).lock().await.expect("hold"),
        };
        let (lb, fb) = (cb.lock(&name), cb.fair_lock(&name));
        let mut ghost: Pin<Box<dyn Future<Output = Result<lockkit::LockGuard, Error>> + Send>> =
            match kind {
                Kind::Lock => Box::pin(async move { lb.lock().await }),
                _ => Box::pin(async move { fb.lock().await }),
            };
        // Poll it until it is in line in Redis.
        tokio::select! {
            r = &mut ghost => panic!("acquired while held: {:?}", r.map(|_| ())),
            () = until_waiters_in_redis(&watcher, kind, &name, 1) => {}
        }
        std::thread::spawn(move || drop(ghost))
            .join()
            .expect("drop thread");
        let (lc, fc) = (cc.lock(&name), cc.fair_lock(&name));
        let next = tokio::spawn(async move {
            match kind {
                Kind::Lock => lc.try_lock(Duration::from_secs(3), None).await,
                _ => fc.try_lock(Duration::from_secs(3), None).await,
            }
        });
        within(HANG, "the next waiter in line", async {
            while cc.waiting_count() < 1 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        held.unlock().await.expect("unlock");
        let got = within(HANG, "the next waiter", next)
            .await
            .expect("join")
            .expect("try_lock");
        assert!(
            got.is_some(),
            "{kind:?}: the next waiter timed out: the dropped future kept its place"
        );
    }
}

/// `MultiLock` rustdoc: "A reservation for it is not a hold: it lasts the handoff window at
/// most, after which the lock goes to the next waiter"; guide.md: "a reservation for it lasts
/// the handoff window (10 ms) at most". A multi-lock waits on `x` and `y`; a plain waiter
/// waits on `x` behind it; `x` is released while `y` stays held: the plain waiter gets `x`
/// within the handoff window (allowed 2× + 1 s = 1.02 s, shorter than its own 1.7 s look-again,
/// so only the hand-on can meet it).
#[tokio::test]
async fn a_multi_lock_waiters_reservation_is_handed_on_to_the_next_waiter() {
    let server = spawned().await;
    let (holder, multi, plain, watcher) = (
        client(&server.url()).await,
        client(&server.url()).await,
        lockkit_suite::client_woken_only(&server.url()).await,
        client(&server.url()).await,
    );
    let (x, y) = (unique("handon-x"), unique("handon-y"));
    let hx = holder.lock(&x).lock().await.expect("x");
    let _hy = holder.lock(&y).lock().await.expect("y");
    let m = multi.multi_lock([multi.lock(&x), multi.lock(&y)]);
    let mwait = tokio::spawn(async move { m.lock().await.map(drop) });
    until_waiters_in_redis(&watcher, Kind::Lock, &x, 1).await;
    let px = plain.lock(&x);
    let pwait = tokio::spawn(async move {
        let guard = px.lock().await;
        (guard, Instant::now())
    });
    until_waiters_in_redis(&watcher, Kind::Lock, &x, 2).await;
    let released = Instant::now();
    hx.unlock().await.expect("unlock x");
    let (guard, at) = within(HANG, "the plain waiter", pwait).await.expect("join");
    let _guard = guard.expect("lock x");
    let took = at.duration_since(released);
    assert!(
        took <= Duration::from_millis(1_020),
        "x reached the next waiter {took:?} after its release (window 10 ms)"
    );
    mwait.abort();
}

// ---------------------------------------------------------------------------------------------
// Nothing is held after an error
// ---------------------------------------------------------------------------------------------

/// guide.md, Bounds table: "Nothing is held: a try cut off gives back in the background whatever
/// it may have taken", and the Errors table: "for an acquire: nothing is held (a hold it may have
/// taken is given back)". Tries are written into a frozen server (fresh: no release script ever
/// ran there), cut off by their `wait`, and the server resumes after the old holders' leases
/// ended, so the tries run and take the objects. Each object must then be free for another
/// client long before the tries' watchdog lease (30 s) would end: a 10 s try gets it.
#[tokio::test]
async fn nothing_is_held_after_a_try_cut_off_while_redis_was_frozen_with_no_release_script_cached()
{
    let server = spawned().await;
    let holder = client(&server.url()).await;
    let tryer = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let after = client(&server.url()).await;
    let short = Duration::from_secs(2);
    let names: Vec<(Kind, String)> = [
        Kind::Lock,
        Kind::FencedLock,
        Kind::FairLock,
        Kind::ReadWriteLock,
        Kind::SpinLock,
        Kind::Semaphore,
        Kind::PermitExpirableSemaphore,
        Kind::Election,
    ]
    .into_iter()
    .map(|k| (k, unique(&format!("cutoff-{k:?}"))))
    .collect();
    // The holders: fixed short leases, never released (their release scripts never run).
    let mut keep: Vec<Box<dyn std::any::Any + Send>> = Vec::new();
    for (kind, n) in &names {
        match kind {
            Kind::Lock => keep.push(Box::new(
                holder.lock(n).lock_with_lease(short).await.expect("h"),
            )),
            Kind::FencedLock => keep.push(Box::new(
                holder
                    .fenced_lock(n)
                    .lock_with_lease(short)
                    .await
                    .expect("h"),
            )),
            Kind::FairLock => keep.push(Box::new(
                holder.fair_lock(n).lock_with_lease(short).await.expect("h"),
            )),
            Kind::ReadWriteLock => keep.push(Box::new(
                holder
                    .read_write_lock(n)
                    .write_lock_with_lease(short)
                    .await
                    .expect("h"),
            )),
            Kind::SpinLock => keep.push(Box::new(
                holder
                    .spin_lock(n)
                    .try_lock(Duration::ZERO, Some(short))
                    .await
                    .expect("h")
                    .expect("free"),
            )),
            Kind::Semaphore => keep.push(Box::new(
                holder
                    .semaphore(n)
                    .with_permits(1)
                    .expect("p")
                    .acquire_with_lease(1, short)
                    .await
                    .expect("h"),
            )),
            Kind::PermitExpirableSemaphore => keep.push(Box::new(
                holder
                    .permit_expirable_semaphore(n)
                    .with_permits(1)
                    .expect("p")
                    .acquire(short)
                    .await
                    .expect("h"),
            )),
            _ => keep.push(Box::new(
                holder
                    .election(n)
                    .campaign_with_lease("h", short)
                    .await
                    .expect("h"),
            )),
        }
    }
    let frozen_at = Instant::now();
    server.pause().expect("SIGSTOP");
    let wait = Duration::from_millis(500);
    let mut tries = Vec::new();
    for (kind, n) in names.clone() {
        let t = tryer.clone();
        tries.push(tokio::spawn(async move {
            let r: Result<bool, Error> = match kind {
                Kind::Lock => t.lock(&n).try_lock(wait, None).await.map(|g| g.is_some()),
                Kind::FencedLock => t
                    .fenced_lock(&n)
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::FairLock => t
                    .fair_lock(&n)
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::ReadWriteLock => t
                    .read_write_lock(&n)
                    .try_write_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::SpinLock => t
                    .spin_lock(&n)
                    .try_lock(wait, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::Semaphore => t
                    .semaphore(&n)
                    .with_permits(1)
                    .expect("p")
                    .try_acquire(1, wait, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::PermitExpirableSemaphore => t
                    .permit_expirable_semaphore(&n)
                    .with_permits(1)
                    .expect("p")
                    .try_acquire(wait, Duration::from_secs(30))
                    .await
                    .map(|g| g.is_some()),
                _ => t
                    .election(&n)
                    .try_campaign("t", wait, None)
                    .await
                    .map(|g| g.is_some()),
            };
            (kind, n, r)
        }));
    }
    let mut results = Vec::new();
    for t in tries {
        results.push(within(HANG, "the cut-off tries", t).await.expect("join"));
    }
    // Stay frozen until the holders' leases have ended (the server's clock runs on).
    tokio::time::sleep_until((frozen_at + short + Duration::from_millis(500)).into()).await;
    server.resume().expect("SIGCONT");
    let mut problems = Vec::new();
    for (kind, n, r) in &results {
        if !matches!(r, Err(Error::Redis(_))) {
            problems.push(format!(
                "{kind:?} `{n}`: the try returned {r:?}, not an error"
            ));
        }
    }
    let mut checks = Vec::new();
    for (kind, n) in names.clone() {
        let a = after.clone();
        let patience = Duration::from_secs(10);
        checks.push(tokio::spawn(async move {
            let got: Result<bool, Error> = match kind {
                Kind::Lock => a
                    .lock(&n)
                    .try_lock(patience, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::FencedLock => a
                    .fenced_lock(&n)
                    .try_lock(patience, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::FairLock => a
                    .fair_lock(&n)
                    .try_lock(patience, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::ReadWriteLock => a
                    .read_write_lock(&n)
                    .try_write_lock(patience, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::SpinLock => a
                    .spin_lock(&n)
                    .try_lock(patience, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::Semaphore => a
                    .semaphore(&n)
                    .with_permits(1)
                    .expect("p")
                    .try_acquire(1, patience, None)
                    .await
                    .map(|g| g.is_some()),
                Kind::PermitExpirableSemaphore => a
                    .permit_expirable_semaphore(&n)
                    .with_permits(1)
                    .expect("p")
                    .try_acquire(patience, Duration::from_secs(30))
                    .await
                    .map(|g| g.is_some()),
                _ => a
                    .election(&n)
                    .try_campaign("after", patience, None)
                    .await
                    .map(|g| g.is_some()),
            };
            (kind, n, got)
        }));
    }
    for c in checks {
        let (kind, n, got) = within(HANG, "the checks", c).await.expect("join");
        if !matches!(got, Ok(true)) {
            problems.push(format!(
                "{kind:?} `{n}`: still held after the cut-off try's error: {got:?}"
            ));
        }
    }
    drop(keep);
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// As above, after `SCRIPT FLUSH` on a live server: guide/README "the script cache emptied
/// (failover, `SCRIPT FLUSH`)" needs nothing. Tries cut off by a `CLIENT PAUSE` (written into
/// the paused server, run when it unpauses) after the cache was flushed leave nothing held.
#[tokio::test]
async fn nothing_is_held_after_a_try_cut_off_by_a_client_pause_after_script_flush() {
    let server = spawned().await;
    let holder = client(&server.url()).await;
    let tryer = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let after = client(&server.url()).await;
    let short = Duration::from_secs(2);
    let names: Vec<String> = (0..4)
        .map(|i| unique(&format!("flush-cutoff-{i}")))
        .collect();
    let mut keep = Vec::new();
    for n in &names {
        keep.push(holder.lock(n).lock_with_lease(short).await.expect("hold"));
    }
    assert!(matches!(
        cmd(&server, &["SCRIPT", "FLUSH"]).await,
        RespValue::Simple(_)
    ));
    // Load the acquire script again (an uncontended acquire elsewhere), so the tries run when
    // the server answers again; no release script is loaded.
    let warm = tryer
        .lock(unique("warm"))
        .try_lock(Duration::ZERO, Some(Duration::from_secs(60)))
        .await
        .expect("warm");
    std::mem::forget(warm);
    let paused_at = Instant::now();
    let reply = cmd(&server, &["CLIENT", "PAUSE", "4000", "ALL"]).await;
    assert!(matches!(reply, RespValue::Simple(_)), "{reply:?}");
    let mut tries = Vec::new();
    for n in names.clone() {
        let t = tryer.clone();
        tries.push(tokio::spawn(async move {
            t.lock(&n)
                .try_lock(Duration::from_millis(300), None)
                .await
                .map(|g| g.is_some())
        }));
    }
    let mut problems = Vec::new();
    for t in tries {
        let r = within(HANG, "the tries", t).await.expect("join");
        if !matches!(r, Err(Error::Redis(_))) {
            problems.push(format!("a try during the pause returned {r:?}"));
        }
    }
    // The pause ends by itself at 4 s, after the holders' leases (2 s).
    let _ = paused_at;
    for n in &names {
        let got = after.lock(n).try_lock(Duration::from_secs(10), None).await;
        if !matches!(got, Ok(Some(_))) {
            problems.push(format!(
                "`{n}` still held after the cut-off try's error: {:?}",
                got.map(|g| g.is_some())
            ));
        }
    }
    drop(keep);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Error messages
// ---------------------------------------------------------------------------------------------

/// guide.md, Errors: "An error's `Display` says what went wrong *and why …*: … the bound that
/// ran out", and the Bounds table's example ``redis error during try_lock of `order:42`: no answer
/// from Redis within 1.0s (the wait was 1s, …)``. With the server frozen, the timeouts of
/// `try_lock`, `count_down`, `once_per`, `leader()` and `try_campaign` each name the object and
/// the bound ("within"), never fred's bare "Request timed out", and the election's never speaks
/// of a fenced lock.
#[tokio::test]
async fn timeout_errors_name_the_object_the_operation_and_the_bound() {
    let server = spawned().await;
    let c = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let names: Vec<String> = (0..5).map(|i| unique(&format!("named-{i}"))).collect();
    assert!(c
        .count_down_latch(&names[1])
        .try_set_count(3)
        .await
        .expect("set"));
    server.pause().expect("SIGSTOP");
    let mut errors: Vec<(String, Result<String, Error>)> = Vec::new();
    let one = Duration::from_secs(1);
    errors.push((
        names[0].clone(),
        c.lock(&names[0])
            .try_lock(one, None)
            .await
            .map(|g| format!("{:?}", g.is_some())),
    ));
    errors.push((
        names[1].clone(),
        c.count_down_latch(&names[1])
            .count_down()
            .await
            .map(|n| n.to_string()),
    ));
    errors.push((
        names[2].clone(),
        c.once_per(&names[2], Duration::from_secs(60), || async {})
            .await
            .map(|o| format!("ran={}", o.ran())),
    ));
    errors.push((
        names[3].clone(),
        c.election(&names[3])
            .leader()
            .await
            .map(|l| format!("{l:?}")),
    ));
    errors.push((
        names[4].clone(),
        c.election(&names[4])
            .try_campaign("x", one, None)
            .await
            .map(|l| format!("{:?}", l.is_some())),
    ));
    server.resume().expect("SIGCONT");
    let mut problems = Vec::new();
    for (name, result) in errors {
        match result {
            Err(err) => {
                let text = err.to_string();
                if !text.contains(&name)
                    || !text.contains("within")
                    || text.contains("fenced_lock")
                    || text.contains("latch_count")
                {
                    problems.push(text);
                }
            }
            Ok(value) => problems.push(format!("`{name}`: Ok({value}) from a frozen server")),
        }
    }
    assert!(
        problems.is_empty(),
        "messages that do not name the object and the bound:\n{}",
        problems.join("\n")
    );
}

// ---------------------------------------------------------------------------------------------
// Doc examples that are `no_run` in the docs, run here against a real server
// ---------------------------------------------------------------------------------------------

/// guide.md, Ownership and re-entry, the example copied verbatim: "Nested: inside both scopes,
/// both locks re-enter" and "Spawned: made inside a's scope, run by another task, so outside
/// it … waits for `a`, which this task holds: Ok(Ok(None))".
#[tokio::test]
async fn the_guides_scope_example_does_what_its_comments_say() {
    let server = spawned().await;
    let client = client(&server.url()).await;
    async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
        let (a, b) = (client.lock("account:1"), client.lock("account:2"));
        let both = client.multi_lock([a.clone(), b.clone()]).lock().await?;
        let [ga, gb] = both.guards() else {
            unreachable!()
        };

        // Nested: inside both scopes, both locks re-enter.
        ga.scope(gb.scope(async {
            let again = a.lock().await?; // re-enters a (hold count 2)
            again.unlock().await
        }))
        .await?;

        // Spawned: made inside a's scope, run by another task, so outside it.
        let a2 = a.clone();
        let spawned = ga
            .scope(async {
                let in_b =
                    gb.scope(async move { a2.try_lock(Duration::from_millis(100), None).await });
                tokio::spawn(in_b).await // waits for `a`, which this task holds: Ok(Ok(None))
            })
            .await;
        assert!(matches!(spawned, Ok(Ok(None))));
        both.unlock().await?;
        Ok(())
    }
    within(HANG, "the guide's scope example", demo(client))
        .await
        .expect("the example");
}

/// guide.md, Observing, the example loop: "The stream ends only after `Error::Shutdown` … so
/// handle its errors without leaving the loop" — the guide's loop (its `println!`s also sent to
/// the test) through an outage (Redis killed for 3 s, then started again): the loop keeps
/// running, sees the `Resynced`, then the next `Elected`.
#[tokio::test]
async fn the_guides_observe_loop_keeps_running_through_an_outage() {
    let mut server = spawned().await;
    let watcher = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    async fn demo(
        client: lockkit::Client,
        seen: tokio::sync::mpsc::UnboundedSender<String>,
    ) -> Result<(), lockkit::Error> {
        use futures::StreamExt;
        use lockkit::{Error, LeaderChange};
        let println = |line: String| {
            println!("{line}");
            let _ = seen.send(line);
        };

        let mut changes = client.election("scheduler").observe();
        while let Some(change) = changes.next().await {
            match change {
                Ok(LeaderChange::Elected(leader)) => println(format!("{} leads", leader.value)),
                Ok(other) => println(format!("{other:?}")),
                Err(Error::Redis(err)) => eprintln!("{err}; the observer tries again"),
                Err(err) => return Err(err), // shut down: the stream has ended
            }
        }
        Ok(())
    }
    let loop_task = tokio::spawn(demo(watcher.clone(), tx));
    assert_eq!(
        within(HANG, "Current", rx.recv()).await.as_deref(),
        Some("Current(None)")
    );
    server.kill();
    // The outage's length is the condition (three command timeouts), not a stand-in for an event.
    tokio::time::sleep(Duration::from_secs(3)).await;
    server.start_again().await.expect("start again");
    assert_eq!(
        within(HANG, "Resynced", rx.recv()).await.as_deref(),
        Some("Resynced(None)")
    );
    let leader_client = client(&server.url()).await;
    let _leadership = leader_client
        .election("scheduler")
        .campaign("pod-b")
        .await
        .expect("campaign");
    assert_eq!(
        within(HANG, "Elected", rx.recv()).await.as_deref(),
        Some("pod-b leads")
    );
    assert!(!loop_task.is_finished(), "the guide's observe loop ended");
}

/// guide.md, Observing: the observer "yields an `Error::Redis` naming the election within the
/// command timeout plus 1 s" — here with the server `CLIENT PAUSE`d (command timeout 1 s: bound
/// 2 s, allowed 2× + 1 s = 5 s), then `Resynced` once the pause ends.
#[tokio::test]
async fn an_observer_yields_an_error_naming_the_election_within_its_bound_while_redis_is_paused() {
    let server = spawned().await;
    let watcher = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let name = unique("paused-observer");
    let mut observer = watcher.election(&name).observe();
    assert_eq!(
        next_ok(&mut observer, "Current").await,
        LeaderChange::Current(None)
    );
    let reply = cmd(&server, &["CLIENT", "PAUSE", "8000", "ALL"]).await;
    assert!(matches!(reply, RespValue::Simple(_)), "{reply:?}");
    let paused_at = Instant::now();
    let first = next_change(&mut observer, "the error").await;
    let took = paused_at.elapsed();
    match first {
        Err(Error::Redis(err)) => assert!(
            err.to_string().contains(&name),
            "the error names the election: {err}"
        ),
        other => panic!("expected an Error::Redis while paused, got {other:?}"),
    }
    assert!(
        took <= Duration::from_secs(5),
        "the error came {took:?} into the pause (bound 2 s)"
    );
    loop {
        match next_change(&mut observer, "the Resynced").await {
            Ok(LeaderChange::Resynced(None)) => break,
            Err(Error::Redis(_)) => {}
            other => panic!("expected Resynced(None) after the pause, got {other:?}"),
        }
    }
}

/// guide.md, Bounds table, first row: "`try_lock(wait, ..)`, and every `try_*`, `wait(timeout)`
/// of the other primitives | `wait`, plus at most one round trip for a try in flight then (1 s,
/// or the command timeout if shorter) | `Err(Redis(err))`, `err.is_timeout()`, naming the
/// object". Server frozen, wait 2 s, command timeout 1 s: bound 3 s, allowed 2× + 1 s = 7 s.
#[tokio::test]
async fn every_try_with_a_wait_returns_an_error_naming_the_object_within_the_wait_plus_one_round_trip_when_redis_is_frozen(
) {
    let server = spawned().await;
    let c = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let wait = Duration::from_secs(2);
    let names: Vec<String> = (0..9).map(|i| unique(&format!("try-bound-{i}"))).collect();
    assert!(c
        .count_down_latch(&names[8])
        .try_set_count(1)
        .await
        .expect("set"));
    server.pause().expect("SIGSTOP");
    let started = Instant::now();
    let n = names.clone();
    let results: Vec<Result<bool, Error>> = within(HANG, "the tries", async {
        let (h0, h1, h2, h3, h4) = (
            c.lock(&n[0]),
            c.fenced_lock(&n[1]),
            c.fair_lock(&n[2]),
            c.read_write_lock(&n[3]),
            c.spin_lock(&n[4]),
        );
        let h5 = c.semaphore(&n[5]).with_permits(1).expect("p");
        let h6 = c
            .permit_expirable_semaphore(&n[6])
            .with_permits(1)
            .expect("p");
        let (h7, h8) = (c.election(&n[7]), c.count_down_latch(&n[8]));
        let r = tokio::join!(
            h0.try_lock(wait, None),
            h1.try_lock(wait, None),
            h2.try_lock(wait, None),
            h3.try_read_lock(wait, None),
            h4.try_lock(wait, None),
            h5.try_acquire(1, wait, None),
            h6.try_acquire(wait, Duration::from_secs(30)),
            h7.try_campaign("x", wait, None),
            h8.wait(wait),
        );
        vec![
            r.0.map(|g| g.is_some()),
            r.1.map(|g| g.is_some()),
            r.2.map(|g| g.is_some()),
            r.3.map(|g| g.is_some()),
            r.4.map(|g| g.is_some()),
            r.5.map(|g| g.is_some()),
            r.6.map(|g| g.is_some()),
            r.7.map(|g| g.is_some()),
            r.8,
        ]
    })
    .await;
    let took = started.elapsed();
    server.resume().expect("SIGCONT");
    let mut problems = Vec::new();
    for (name, result) in names.iter().zip(results) {
        match result {
            Err(Error::Redis(err))
                if err.is_timeout() && err.to_string().contains(name.as_str()) => {}
            other => problems.push(format!("`{name}`: {other:?}")),
        }
    }
    if took > wait * 3 + Duration::from_secs(1) {
        problems.push(format!("the tries took {took:?} (bound 3 s)"));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// guide.md, Bounds table: "`unlock()`, `release()` | the command timeout (5 s by default),
/// every resend included | `Err(Redis(err))`, ambiguous, naming the object". Server frozen,
/// command timeout 1 s, allowed 2× + 1 s = 3 s.
#[tokio::test]
async fn an_unlock_returns_an_ambiguous_error_naming_the_object_within_the_command_timeout_when_redis_is_frozen(
) {
    let server = spawned().await;
    let c = builder_client(&server.url(), Duration::from_secs(1), None).await;
    let (ln, sn) = (unique("unlock-frozen"), unique("release-frozen"));
    let guard = c.lock(&ln).lock().await.expect("lock");
    let permit = c
        .semaphore(&sn)
        .with_permits(1)
        .expect("p")
        .acquire(1)
        .await
        .expect("acquire");
    server.pause().expect("SIGSTOP");
    let started = Instant::now();
    let (unlocked, released) = within(HANG, "unlock and release", async {
        tokio::join!(guard.unlock(), permit.release())
    })
    .await;
    let took = started.elapsed();
    server.resume().expect("SIGCONT");
    for (name, result) in [(&ln, unlocked), (&sn, released)] {
        match result {
            Err(Error::Redis(err)) => {
                assert!(err.is_ambiguous(), "`{name}`: not ambiguous: {err}");
                assert!(
                    err.to_string().contains(name.as_str()),
                    "`{name}`: the message does not name it: {err}"
                );
            }
            other => panic!("`{name}`: {other:?} from a frozen server"),
        }
    }
    assert!(
        took <= Duration::from_secs(3),
        "unlock/release took {took:?} (command timeout 1 s)"
    );
}
