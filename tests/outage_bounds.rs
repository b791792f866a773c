//! Every waiting call keeps an outage bound, whatever its kind (issue 27, items 10 and 11).
//!
//! The guide's "Bounds while Redis is down": a wait without a deadline fails within the command
//! timeout once a connection to Redis is lost (every waiter of the client is woken to try again),
//! and within the recheck interval plus the command timeout when Redis stops answering without
//! closing anything (each waiter looks again at least every recheck interval, whatever the
//! holder's lease says). Before, a waiter slept until the holder's lease ended: a semaphore
//! waiter failed 21.5 s into an outage with a 20 s lease on the holder.
//!
//! Every case: a holder holds the object with a lease far longer than the test's hang guard
//! ([`LEASE`] > [`HANG`]); a waiter with a short command timeout waits; then Redis goes away for
//! longer than the hang guard. The wait must return an error that names the command timeout,
//! while the fault still lasts: a wait that looks again only when the holder's lease ends hangs
//! past the guard. Each fault has its own server, and its waits run at once.
//!
//! - **killed** (`SIGKILL`): both connections are lost. The waiter's client has a recheck
//!   interval far longer than the guard, so only the wake-up on a lost connection can end a
//!   wait in time (the lock kinds also keep their place in line every 1.7 s, so they would
//!   end anyway).
//! - **frozen** (`SIGSTOP`) and **paused** (`CLIENT PAUSE … ALL`): no connection is lost, and
//!   nothing tells the client. The default recheck interval (≈ 1.7 s) finds it.
//!
//! Item 10: permits freed by data loss (`FLUSHALL`) reach a waiter within the recheck interval,
//! not when the old holder's lease would have ended.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::join_all;
use lockkit::{Client, Error};
use lockkit_suite::{client, spawned, unique, until_waiting, within};
use lockkit_testkit::RedisServer;

/// The holders' fixed lease: far longer than the hang guard, so no wait may end by it.
const LEASE: Duration = Duration::from_secs(60);
/// The hang guard around each wait (never a performance assertion): well below [`LEASE`], and
/// shorter than every fault lasts.
const HANG: Duration = Duration::from_secs(25);
/// The wait of a bounded waiter: longer than the hang guard, shorter than the lease.
const PATIENCE: Duration = Duration::from_secs(50);
/// The waiter client's command timeout.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// How long `CLIENT PAUSE` lasts: longer than the hang guard.
const PAUSE: Duration = Duration::from_secs(40);
/// A recheck interval longer than the hang guard: a wait that ends in time was woken.
const NO_RECHECK: Duration = Duration::from_secs(600);

/// How Redis goes away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `SIGKILL`: connections close, reconnections are refused.
    Killed,
    /// `SIGSTOP`: connections stay open, nothing is answered.
    Frozen,
    /// `CLIENT PAUSE <ms> ALL`: connections stay open, no command is answered.
    Paused,
}

impl Fault {
    /// The waiter client's recheck interval: the default, except where the test must show that
    /// a lost connection alone ends the wait.
    fn recheck(self) -> Option<Duration> {
        match self {
            Fault::Killed => Some(NO_RECHECK),
            Fault::Frozen | Fault::Paused => None,
        }
    }

    async fn apply(self, server: &mut RedisServer) {
        match self {
            Fault::Killed => server.kill(),
            Fault::Frozen => server.pause().unwrap(),
            Fault::Paused => {
                let ms = PAUSE.as_millis().to_string();
                let reply = server.command(&["CLIENT", "PAUSE", &ms, "ALL"]).await;
                assert!(
                    reply.as_ref().is_ok_and(|reply| !reply.is_error()),
                    "{reply:?}"
                );
            }
        }
    }
}

/// The waiting client: a short command timeout, and a watchdog timeout far longer than the hang
/// guard. It holds nothing, so its watchdog renews nothing; a wait must not depend on it
/// (before, a latch's waiter looked again every third of it).
async fn waiter_client(url: &str, recheck: Option<Duration>) -> Client {
    let mut builder = Client::builder()
        .url(url)
        .command_timeout(COMMAND_TIMEOUT)
        .watchdog_timeout(3 * LEASE);
    if let Some(recheck) = recheck {
        builder = builder.recheck_interval(recheck);
    }
    within(HANG, "connect", builder.build()).await.unwrap()
}

type Wait = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

/// What the holder keeps until the end of the test.
type Held = Vec<Box<dyn std::any::Any + Send>>;

/// One waiting call: what it is, the name its error must carry, the call, and a short wait on
/// the same object before it (`None`: the spin lock, which polls), which leaves the object's
/// channel subscribed: the call then registers before its first try and sleeps after it, with
/// no subscription or second try in flight when the fault comes.
struct Case {
    what: &'static str,
    name: String,
    warm: Option<Wait>,
    wait: Wait,
}

/// How long a warm-up waits: it only subscribes.
const WARM: Duration = Duration::from_millis(10);

/// A warm-up call that must find the object taken.
fn warm<T, F>(call: F) -> Option<Wait>
where
    T: std::fmt::Debug,
    F: Future<Output = Result<Option<T>, Error>> + Send + 'static,
{
    Some(Box::pin(async move {
        let got = call.await?;
        assert!(got.is_none(), "the warm-up took the object: {got:?}");
        Ok(())
    }))
}

/// Takes every object with a [`LEASE`] on `holder`, and returns the waiting calls of `waiter`
/// for them (all of them wait without a deadline).
async fn cases(holder: &Client, waiter: &Client, held: &mut Held) -> Vec<Case> {
    let n = |kind: &str| unique(&format!("outage-{kind}"));
    let mut cases = Vec::new();

    let name = n("lock");
    held.push(Box::new(
        holder.lock(&name).lock_with_lease(LEASE).await.unwrap(),
    ));
    let lock = waiter.lock(&name);
    cases.push(Case {
        what: "Lock::lock",
        name,
        warm: warm({
            let lock = lock.clone();
            async move { lock.try_lock(WARM, None).await }
        }),
        wait: Box::pin(async move { lock.lock().await.map(drop) }),
    });

    let name = n("fair");
    held.push(Box::new(
        holder
            .fair_lock(&name)
            .lock_with_lease(LEASE)
            .await
            .unwrap(),
    ));
    let fair = waiter.fair_lock(&name);
    cases.push(Case {
        what: "FairLock::lock",
        name,
        warm: warm({
            let fair = fair.clone();
            async move { fair.try_lock(WARM, None).await }
        }),
        wait: Box::pin(async move { fair.lock().await.map(drop) }),
    });

    let name = n("fenced");
    held.push(Box::new(
        holder
            .fenced_lock(&name)
            .lock_with_lease(LEASE)
            .await
            .unwrap(),
    ));
    let fenced = waiter.fenced_lock(&name);
    cases.push(Case {
        what: "FencedLock::lock",
        name,
        warm: warm({
            let fenced = fenced.clone();
            async move { fenced.try_lock(WARM, None).await }
        }),
        wait: Box::pin(async move { fenced.lock().await.map(drop) }),
    });

    let name = n("spin");
    held.push(Box::new(
        holder
            .spin_lock(&name)
            .lock_with_lease(LEASE)
            .await
            .unwrap(),
    ));
    let spin = waiter.spin_lock(&name);
    cases.push(Case {
        what: "SpinLock::lock",
        name,
        warm: None,
        wait: Box::pin(async move { spin.lock().await.map(drop) }),
    });

    // A writer holds: a reader waits.
    let name = n("rw-read");
    held.push(Box::new(
        holder
            .read_write_lock(&name)
            .write_lock_with_lease(LEASE)
            .await
            .unwrap(),
    ));
    let read = waiter.read_write_lock(&name);
    cases.push(Case {
        what: "ReadWriteLock::read_lock",
        name,
        warm: warm({
            let read = read.clone();
            async move { read.try_read_lock(WARM, None).await }
        }),
        wait: Box::pin(async move { read.read_lock().await.map(drop) }),
    });

    // A reader holds: a writer waits.
    let name = n("rw-write");
    held.push(Box::new(
        holder
            .read_write_lock(&name)
            .read_lock_with_lease(LEASE)
            .await
            .unwrap(),
    ));
    let write = waiter.read_write_lock(&name);
    cases.push(Case {
        what: "ReadWriteLock::write_lock",
        name,
        warm: warm({
            let write = write.clone();
            async move { write.try_write_lock(WARM, None).await }
        }),
        wait: Box::pin(async move { write.write_lock().await.map(drop) }),
    });

    let name = n("semaphore");
    let semaphore = holder.semaphore(&name).with_permits(1).unwrap();
    held.push(Box::new(
        semaphore.acquire_with_lease(1, LEASE).await.unwrap(),
    ));
    let semaphore = waiter.semaphore(&name).with_permits(1).unwrap();
    cases.push(Case {
        what: "Semaphore::acquire",
        name,
        warm: warm({
            let semaphore = semaphore.clone();
            async move { semaphore.try_acquire(1, WARM, None).await }
        }),
        wait: Box::pin(async move { semaphore.acquire(1).await.map(drop) }),
    });

    let name = n("expirable");
    let slots = holder
        .permit_expirable_semaphore(&name)
        .with_permits(1)
        .unwrap();
    held.push(Box::new(slots.acquire(LEASE).await.unwrap()));
    let slots = waiter
        .permit_expirable_semaphore(&name)
        .with_permits(1)
        .unwrap();
    cases.push(Case {
        what: "PermitExpirableSemaphore::acquire",
        name,
        warm: warm({
            let slots = slots.clone();
            async move { slots.try_acquire(WARM, LEASE).await }
        }),
        wait: Box::pin(async move { slots.acquire(LEASE).await.map(drop) }),
    });

    // Nothing is held: the count is 1 and nobody counts down.
    let name = n("latch");
    assert!(holder
        .count_down_latch(&name)
        .try_set_count(1)
        .await
        .unwrap());
    let latch = waiter.count_down_latch(&name);
    cases.push(Case {
        what: "CountDownLatch::wait(MAX)",
        name,
        warm: warm({
            let latch = latch.clone();
            async move { Ok(latch.wait(WARM).await?.then_some(())) }
        }),
        wait: Box::pin(async move {
            let opened = latch.wait(Duration::MAX).await?;
            panic!("the latch opened: {opened}");
        }),
    });

    // The second member is held: the multi-lock waits for it.
    let (free, busy) = (n("multi-free"), n("multi-busy"));
    held.push(Box::new(
        holder.lock(&busy).lock_with_lease(LEASE).await.unwrap(),
    ));
    let multi = waiter.multi_lock([waiter.lock(&free), waiter.lock(&busy)]);
    cases.push(Case {
        what: "MultiLock::lock",
        warm: warm({
            let member = waiter.lock(&busy);
            async move { member.try_lock(WARM, None).await }
        }),
        name: busy,
        wait: Box::pin(async move { multi.lock().await.map(drop) }),
    });

    let name = n("election");
    held.push(Box::new(
        holder
            .election(&name)
            .campaign_with_lease("holder", LEASE)
            .await
            .unwrap(),
    ));
    let election = waiter.election(&name);
    cases.push(Case {
        what: "Election::campaign",
        name,
        warm: warm({
            let election = election.clone();
            async move { election.try_campaign("warm", WARM, None).await }
        }),
        wait: Box::pin(async move { election.campaign("waiter").await.map(drop) }),
    });
    cases
}

/// The error of a waiting call cut off by an outage: a timed-out, ambiguous [`Error::Redis`]
/// whose text names the bound that ran out (the command timeout) and the object.
fn check(fault: Fault, case: &str, name: &str, result: Result<(), Error>) -> Result<(), String> {
    let err = match result {
        Err(Error::Redis(err)) => err,
        other => {
            return Err(format!(
                "{case} under {fault:?}: expected Err(Redis), got {other:?}"
            ))
        }
    };
    let shown = chain(&err);
    let bound = format!("the command timeout is {COMMAND_TIMEOUT:?}");
    if !err.is_timeout() || !shown.contains(&bound) || !shown.contains(&format!("`{name}`")) {
        return Err(format!(
            "{case} under {fault:?}: the error must be a timeout naming `{name}` and \
             \"{bound}\": {shown}"
        ));
    }
    Ok(())
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

/// Every waiting call, under `fault`.
async fn every_wait_fails_within_its_outage_bound(fault: Fault) {
    let mut server = spawned().await;
    let url = server.url();
    let holder = client(&url).await;
    let waiter = waiter_client(&url, fault.recheck()).await;
    let mut held = Held::new();
    let cases = cases(&holder, &waiter, &mut held).await;
    let barrier = unique("outage-barrier");
    // Every waiting call but the spin lock's (it polls) registers with the waiter hub.
    let registered = cases.iter().filter(|case| case.warm.is_some()).count();
    let mut waits = Vec::new();
    for case in cases {
        if let Some(warm) = case.warm {
            within(HANG, case.what, warm).await.unwrap();
        }
        waits.push((case.what, case.name, tokio::spawn(case.wait)));
    }
    until_waiting(&waiter, registered).await;
    // Each waiting call registered on its subscribed channel, then sent its first try in the
    // same poll: a command sent now on the same connection is answered after every one of them,
    // so every call sleeps when the fault comes.
    assert_eq!(waiter.count_down_latch(&barrier).count().await.unwrap(), 0);
    let started = tokio::time::Instant::now();
    fault.apply(&mut server).await;
    let results = join_all(waits.into_iter().map(|(what, name, task)| async move {
        let result = within(HANG, what, task).await.unwrap();
        // The time from the fault to the error, for docs/reliability.md (never asserted).
        println!(
            "outage {what:<34} {fault:<7} {:>6.3}s",
            started.elapsed().as_secs_f64(),
            fault = format!("{fault:?}"),
        );
        check(fault, what, &name, result)
    }))
    .await;
    let failures: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    if fault == Fault::Frozen {
        server.resume().unwrap();
    }
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_fails_when_redis_is_killed_without_waiting_for_a_recheck() {
    every_wait_fails_within_its_outage_bound(Fault::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_fails_when_redis_is_frozen() {
    every_wait_fails_within_its_outage_bound(Fault::Frozen).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_wait_fails_when_redis_is_paused() {
    every_wait_fails_within_its_outage_bound(Fault::Paused).await;
}

/// Item 10: the holders' permits vanish with the data (`FLUSHALL`), with every permit free from
/// then on and nothing to announce it. A waiter finds them at its next look, within the recheck
/// interval, and gets its permit before the old holder's lease could have ended: an unbounded
/// `acquire` and a `try_acquire` whose wait ([`PATIENCE`]) is longer than the hang guard both
/// return a permit within the guard. (A waiter that slept until the lease's end would hang
/// past it; so would the bounded one until its last try at its deadline.)
#[tokio::test]
async fn permits_freed_by_data_loss_reach_a_waiter_before_the_old_lease_could_end() {
    let server = spawned().await;
    let url = server.url();
    let holder = client(&url).await;
    let waiting = client(&url).await;
    let name = unique("outage-flushall");
    let semaphore = holder.semaphore(&name).with_permits(2).unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(semaphore.acquire_with_lease(1, LEASE).await.unwrap());
    }
    let unbounded = {
        let semaphore = waiting.semaphore(&name).with_permits(2).unwrap();
        tokio::spawn(async move { semaphore.acquire(1).await })
    };
    let bounded = {
        let semaphore = waiting.semaphore(&name).with_permits(2).unwrap();
        tokio::spawn(async move { semaphore.try_acquire(1, PATIENCE, None).await })
    };
    until_waiting(&waiting, 2).await;
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);

    server.command(&["FLUSHALL"]).await.unwrap();
    let first = within(HANG, "the unbounded acquire", unbounded)
        .await
        .unwrap()
        .unwrap();
    let second = within(HANG, "the bounded acquire", bounded)
        .await
        .unwrap()
        .unwrap()
        .expect("a permit within the wait");
    assert_eq!((first.permits(), second.permits()), (1, 1));
    // The old holds are gone: the two new ones are all that is taken.
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);
    drop(held);
}
