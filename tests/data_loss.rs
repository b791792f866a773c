//! The counting primitives survive data loss (issue 19, §6).
//!
//! After Redis loses a semaphore's keys (an empty restart, `FLUSHALL`, eviction, a failover to a
//! lagging replica), the first acquire through a client that knows the semaphore's total sets it
//! again, inside the acquire script: the semaphore keeps working without application code. A
//! client knows the total it was configured with (`with_permits`), set (`try_set_permits`, the
//! guide's start-up pattern, whether or not its call was the first) or resized to
//! (`add_permits`), for every handle of that name. A latch whose key is lost is open.
//!
//! The contended runs: several workers on two clients take and give back permits while the data
//! is lost in the middle of the run, by `FLUSHALL` and by a real restart from empty. Afterwards
//! every worker must keep acquiring, the permits held never exceed the total, the permits held
//! across the loss report themselves lost, and the total is the configured one.
//!
//! The permits held at once are counted per *epoch* (before the loss, after it), because a hold
//! taken before the loss lives on in its holder's hands until its guard reports it lost, while the
//! semaphore's new data no longer counts it. A hold whose acquire was sent in one epoch and
//! returned in another cannot be placed, and is not counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockkit::{Client, Error};
use lockkit_suite::{client, client_with, spawned, unique, until_waiting, within};
use lockkit_testkit::RedisServer;

/// A hang guard, never a latency threshold.
const HANG: Duration = Duration::from_secs(60);
/// The workers' watchdog timeout: renewal every second, so a hold lost with the data is reported
/// within about a second.
const WATCHDOG: Duration = Duration::from_secs(3);
/// The semaphores' total.
const TOTAL: u64 = 3;
/// Workers per client (two clients).
const WORKERS: usize = 3;
/// Acquisitions every worker must make after the loss.
const AFTER: u64 = 5;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Counting,
    Expirable,
}

#[derive(Clone, Copy, Debug)]
enum Loss {
    Flushall,
    RestartEmpty,
}

/// One permit of either kind.
enum Permit {
    Counting(lockkit::SemaphorePermit),
    Expirable(lockkit::ExpirablePermit),
}

impl Permit {
    fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        match self {
            Permit::Counting(p) => futures::future::Either::Left(p.lost()),
            Permit::Expirable(p) => futures::future::Either::Right(p.lost()),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Permit::Counting(p) => p.is_lost(),
            Permit::Expirable(p) => p.is_lost(),
        }
    }

    async fn release(self) -> Result<(), Error> {
        match self {
            Permit::Counting(p) => p.release().await,
            Permit::Expirable(p) => p.release().await,
        }
    }
}

/// How a client's workers reach the semaphore: the first client configures its handle with the
/// total (`with_permits`); the second follows the guide's start-up pattern (`try_set_permits` once)
/// and then makes a new plain handle for every acquisition, as request handlers do.
async fn acquire(
    client: &Client,
    name: &str,
    kind: Kind,
    configured: bool,
) -> Result<Permit, Error> {
    match kind {
        Kind::Counting => {
            let semaphore = client.semaphore(name);
            let semaphore = if configured {
                semaphore.with_permits(TOTAL)?
            } else {
                semaphore
            };
            semaphore.acquire(1).await.map(Permit::Counting)
        }
        Kind::Expirable => {
            let slots = client.permit_expirable_semaphore(name);
            let slots = if configured {
                slots.with_permits(TOTAL)?
            } else {
                slots
            };
            slots
                .acquire(Duration::from_secs(10))
                .await
                .map(Permit::Expirable)
        }
    }
}

async fn available(client: &Client, name: &str, kind: Kind) -> u64 {
    match kind {
        Kind::Counting => client.semaphore(name).available_permits().await.unwrap(),
        Kind::Expirable => client
            .permit_expirable_semaphore(name)
            .available_permits()
            .await
            .unwrap(),
    }
}

/// What the workers share: the epoch (0 before the loss, 1 during it, 2 after), the permits held
/// now and at most in epochs 0 and 2, and each worker's acquisitions after the loss.
#[derive(Default)]
struct Shared {
    epoch: AtomicU64,
    live: [AtomicU64; 2],
    most: [AtomicU64; 2],
    after: Vec<AtomicU64>,
    total: AtomicU64,
    /// Errors while Redis was down (a real restart): the call failed, the worker tries again.
    outage_errors: AtomicU64,
    stop: std::sync::atomic::AtomicBool,
}

async fn worker(
    client: Client,
    name: String,
    kind: Kind,
    configured: bool,
    index: usize,
    shared: Arc<Shared>,
) {
    while !shared.stop.load(Ordering::SeqCst) {
        let sent_in = shared.epoch.load(Ordering::SeqCst);
        let permit = match within(
            HANG,
            "an acquire",
            acquire(&client, &name, kind, configured),
        )
        .await
        {
            Ok(permit) => permit,
            Err(Error::Redis(err)) if sent_in != 2 || shared.epoch.load(Ordering::SeqCst) != 2 => {
                // Redis was down (a real restart): the application retries.
                let _ = err;
                shared.outage_errors.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            Err(err) => panic!("worker {index}: acquire failed in epoch {sent_in}: {err}"),
        };
        let got_in = shared.epoch.load(Ordering::SeqCst);
        let counted = (sent_in == got_in && sent_in != 1).then_some((sent_in / 2) as usize);
        if let Some(bucket) = counted {
            let now = shared.live[bucket].fetch_add(1, Ordering::SeqCst) + 1;
            shared.most[bucket].fetch_max(now, Ordering::SeqCst);
        }
        shared.total.fetch_add(1, Ordering::SeqCst);
        // The work.
        tokio::time::sleep(Duration::from_millis(2)).await;
        if let Some(bucket) = counted {
            shared.live[bucket].fetch_sub(1, Ordering::SeqCst);
        }
        match permit.release().await {
            // NotHeld: the permit was lost with the data; Redis: Redis was down.
            Ok(()) | Err(Error::NotHeld { .. }) => {}
            Err(Error::Redis(_)) if got_in != 2 => {}
            Err(err) => panic!("worker {index}: release failed in epoch {got_in}: {err}"),
        }
        if sent_in == 2 {
            shared.after[index].fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The contended run described in the module docs, on a semaphore of `kind`, losing the data by
/// `loss` in the middle.
async fn contended_run_survives(kind: Kind, loss: Loss) {
    let mut redis: RedisServer = spawned().await;
    let url = redis.url();
    let name = unique("data-loss");
    let configured = client_with(&url, WATCHDOG).await;
    let started = client_with(&url, WATCHDOG).await;
    // The guide's pattern on the second client: set the total once at start-up.
    let set = match kind {
        Kind::Counting => started.semaphore(&name).try_set_permits(TOTAL).await,
        Kind::Expirable => {
            started
                .permit_expirable_semaphore(&name)
                .try_set_permits(TOTAL)
                .await
        }
    };
    assert!(set.unwrap());

    // One permit held across the loss (watchdog mode for the counting kind, a long fixed lease
    // for the other): its guard must report it lost.
    let long = acquire(&configured, &name, kind, true).await.unwrap();
    let long = match (kind, long) {
        (Kind::Counting, long) => long,
        (Kind::Expirable, short) => {
            short.release().await.unwrap();
            Permit::Expirable(
                configured
                    .permit_expirable_semaphore(&name)
                    .acquire(Duration::from_secs(600))
                    .await
                    .unwrap(),
            )
        }
    };
    let long_lost = tokio::spawn(long.lost());

    let shared = Arc::new(Shared {
        after: (0..2 * WORKERS).map(|_| AtomicU64::new(0)).collect(),
        ..Shared::default()
    });
    // The epoch-0 hold of the long holder counts too.
    shared.live[0].store(1, Ordering::SeqCst);
    shared.most[0].store(1, Ordering::SeqCst);
    let mut tasks = Vec::new();
    for index in 0..2 * WORKERS {
        let (client, is_configured) = if index < WORKERS {
            (configured.clone(), true)
        } else {
            (started.clone(), false)
        };
        tasks.push(tokio::spawn(worker(
            client,
            name.clone(),
            kind,
            is_configured,
            index,
            Arc::clone(&shared),
        )));
    }
    within(HANG, "acquisitions before the loss", async {
        while shared.total.load(Ordering::SeqCst) < 20 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;

    shared.epoch.store(1, Ordering::SeqCst);
    match loss {
        Loss::Flushall => {
            redis.command(&["FLUSHALL"]).await.unwrap();
        }
        Loss::RestartEmpty => redis.restart_empty().await.unwrap(),
    }
    shared.epoch.store(2, Ordering::SeqCst);

    within(HANG, "the held permit to report itself lost", long_lost)
        .await
        .unwrap();
    assert!(long.is_lost());
    assert!(matches!(long.release().await, Err(Error::NotHeld { .. })));
    shared.live[0].fetch_sub(1, Ordering::SeqCst);

    within(
        HANG,
        "every worker to keep acquiring after the loss",
        async {
            while shared
                .after
                .iter()
                .any(|after| after.load(Ordering::SeqCst) < AFTER)
            {
                // A worker only stops early by failing: report that now, not at the guard.
                if let Some(done) = tasks.iter_mut().find(|task| task.is_finished()) {
                    done.await.unwrap();
                    panic!("a worker stopped before it was told to");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
    shared.stop.store(true, Ordering::SeqCst);
    for task in tasks {
        within(HANG, "a worker to stop", task).await.unwrap();
    }

    let (before, after) = (
        shared.most[0].load(Ordering::SeqCst),
        shared.most[1].load(Ordering::SeqCst),
    );
    assert!(
        before <= TOTAL,
        "{before} permits held at once before the loss"
    );
    assert!(
        after <= TOTAL,
        "{after} permits held at once after the loss"
    );
    assert!(
        after >= 2,
        "the run after the loss was contended ({after} at once at most)"
    );
    // The total is the configured one, and every permit came back. A release that met the
    // outage goes on in the background until Redis answers; a shutdown waits for every one
    // under way (and fails naming any it could not finish), so the count is read after them.
    within(HANG, "the shutdowns", async {
        configured.shutdown().await.unwrap();
        started.shutdown().await.unwrap();
    })
    .await;
    let fresh = client_with(&url, WATCHDOG).await;
    assert_eq!(available(&fresh, &name, kind).await, TOTAL);
    eprintln!(
        "{kind:?} {loss:?}: {} acquisitions, at most {before} / {after} held before / after, \
         {} calls failed while Redis was down",
        shared.total.load(Ordering::SeqCst),
        shared.outage_errors.load(Ordering::SeqCst)
    );
}

#[tokio::test]
async fn a_semaphore_keeps_working_after_flushall_in_a_contended_run() {
    contended_run_survives(Kind::Counting, Loss::Flushall).await;
}

#[tokio::test]
async fn a_semaphore_keeps_working_after_an_empty_restart_in_a_contended_run() {
    contended_run_survives(Kind::Counting, Loss::RestartEmpty).await;
}

#[tokio::test]
async fn a_permit_expirable_semaphore_keeps_working_after_flushall_in_a_contended_run() {
    contended_run_survives(Kind::Expirable, Loss::Flushall).await;
}

#[tokio::test]
async fn a_permit_expirable_semaphore_keeps_working_after_an_empty_restart_in_a_contended_run() {
    contended_run_survives(Kind::Expirable, Loss::RestartEmpty).await;
}

#[tokio::test]
async fn the_client_remembers_the_total_it_was_given_set_or_resized_to() {
    let redis = spawned().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("remembered");
    assert_eq!(a.semaphore(&name).configured_permits(), None);
    // Remembered whether or not the call set the total, for every handle of the client.
    assert!(b.semaphore(&name).try_set_permits(2).await.unwrap());
    assert!(!a.semaphore(&name).try_set_permits(3).await.unwrap());
    assert_eq!(a.semaphore(&name).configured_permits(), Some(3));
    assert_eq!(b.semaphore(&name).configured_permits(), Some(2));
    assert_eq!(a.semaphore(&name).add_permits(2).await.unwrap(), 4);
    assert_eq!(a.semaphore(&name).configured_permits(), Some(4));
    let configured = a.semaphore(&name).with_permits(7).unwrap();
    assert_eq!(configured.configured_permits(), Some(7));
    assert_eq!(a.semaphore(&name).configured_permits(), Some(7));
    // Each kind has its own.
    assert_eq!(
        a.permit_expirable_semaphore(&name).configured_permits(),
        None
    );
    match a.semaphore(&name).with_permits(u64::MAX) {
        Err(Error::InvalidArgument(why)) => assert!(why.contains("permits"), "{why}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    // A total that is absent counts as the configured one: that is what an acquire would set.
    let fresh = unique("fresh");
    let handle = a.semaphore(&fresh).with_permits(5).unwrap();
    assert_eq!(handle.available_permits().await.unwrap(), 5);
    assert_eq!(b.semaphore(&fresh).available_permits().await.unwrap(), 0);
    // A first start needs no try_set_permits either.
    let permit = handle.acquire(2).await.unwrap();
    assert_eq!(b.semaphore(&fresh).available_permits().await.unwrap(), 3);
    permit.release().await.unwrap();
}

/// The guide's start-up pattern on its own (no other client to set the total again): a pod that
/// called `try_set_permits` once keeps working after the keys vanish, through any handle, with no
/// further call — also the pod whose call came second and answered `false`.
#[tokio::test]
async fn the_guides_start_up_pattern_recovers_with_no_further_call() {
    let redis = spawned().await;
    let (first, second) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("start-up");
    assert!(first.semaphore(&name).try_set_permits(2).await.unwrap());
    assert!(!second.semaphore(&name).try_set_permits(2).await.unwrap());
    assert!(first
        .permit_expirable_semaphore(&name)
        .try_set_permits(2)
        .await
        .unwrap());
    for pod in [&first, &second] {
        redis.command(&["FLUSHALL"]).await.unwrap();
        let permit = pod
            .semaphore(&name)
            .try_acquire(2, Duration::ZERO, None)
            .await
            .unwrap()
            .expect("the total is set again: 2 free");
        assert_eq!(pod.semaphore(&name).available_permits().await.unwrap(), 0);
        permit.release().await.unwrap();
    }
    redis.command(&["FLUSHALL"]).await.unwrap();
    let slots = first.permit_expirable_semaphore(&name);
    let one = slots
        .try_acquire(Duration::ZERO, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("the total is set again");
    assert_eq!(slots.available_permits().await.unwrap(), 1);
    one.release().await.unwrap();
}

#[tokio::test]
async fn after_data_loss_the_first_client_to_find_the_keys_gone_sets_the_total() {
    let redis = spawned().await;
    let (three, five, plain) = (
        client(&redis.url()).await,
        client(&redis.url()).await,
        client(&redis.url()).await,
    );
    let name = unique("first-wins");
    let small = three.semaphore(&name).with_permits(3).unwrap();
    let large = five.semaphore(&name).with_permits(5).unwrap();
    small.acquire(1).await.unwrap().release().await.unwrap();
    assert_eq!(large.available_permits().await.unwrap(), 3);

    redis.command(&["FLUSHALL"]).await.unwrap();
    // A client that knows no total is refused, with a reason that says what to do.
    match plain
        .semaphore(&name)
        .try_acquire(1, Duration::ZERO, None)
        .await
    {
        Err(Error::Refused { reason, .. }) => {
            assert!(reason.contains("with_permits"), "{reason}");
        }
        other => panic!("expected Refused, got {other:?}"),
    }
    // The client configured with 5 finds the keys gone first: 5 it is, for everyone.
    let four = large
        .try_acquire(4, Duration::ZERO, None)
        .await
        .unwrap()
        .expect("5 in total");
    assert_eq!(small.available_permits().await.unwrap(), 1);
    assert!(small
        .try_acquire(2, Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    four.release().await.unwrap();

    // add_permits on a lost total starts from the configured one.
    redis.command(&["FLUSHALL"]).await.unwrap();
    assert_eq!(small.add_permits(-1).await.unwrap(), 2);
    assert_eq!(small.configured_permits(), Some(2));
    assert_eq!(large.available_permits().await.unwrap(), 2);
}

/// A latch whose key is lost is open: `wait` returns `true` (absent = zero, as for a latch that
/// was never set), never waits on forever, and a `count_down` is refused. There is nothing to
/// announce the loss, so a waiter learns it at its next check: at once after a restart (the
/// client re-subscribes and wakes every waiter), within a third of the watchdog timeout after
/// a `FLUSHALL`.
async fn a_lost_latch_is_open(loss: Loss) {
    let mut redis = spawned().await;
    let url = redis.url();
    let (coordinator, waiting) = (client(&url).await, client_with(&url, WATCHDOG).await);
    let name = unique("latch-loss");
    let latch = coordinator.count_down_latch(&name);
    assert!(latch.try_set_count(3).await.unwrap());
    assert_eq!(latch.count_down().await.unwrap(), 2);
    let bounded = {
        let latch = waiting.count_down_latch(&name);
        tokio::spawn(async move { latch.wait(Duration::from_secs(600)).await })
    };
    let unbounded = {
        let latch = waiting.count_down_latch(&name);
        tokio::spawn(async move { latch.wait(Duration::MAX).await })
    };
    until_waiting(&waiting, 2).await;

    match loss {
        Loss::Flushall => {
            redis.command(&["FLUSHALL"]).await.unwrap();
        }
        Loss::RestartEmpty => redis.restart_empty().await.unwrap(),
    }
    assert!(within(HANG, "the bounded wait", bounded)
        .await
        .unwrap()
        .unwrap());
    assert!(within(HANG, "the unbounded wait", unbounded)
        .await
        .unwrap()
        .unwrap());
    let count = within(HANG, "count", async {
        loop {
            // After a restart the coordinator's connection may still be coming back.
            if let Ok(count) = latch.count().await {
                return count;
            }
        }
    })
    .await;
    assert_eq!(count, 0);
    assert!(matches!(
        latch.count_down().await,
        Err(Error::Refused { .. })
    ));
    // A new round can start.
    assert!(latch.try_set_count(1).await.unwrap());
}

#[tokio::test]
async fn a_latch_whose_key_was_flushed_is_open() {
    a_lost_latch_is_open(Loss::Flushall).await;
}

#[tokio::test]
async fn a_latch_after_an_empty_restart_is_open() {
    a_lost_latch_is_open(Loss::RestartEmpty).await;
}

/// What `docs/reliability.md` promises for the lock kinds after data loss: every holder learns its
/// hold is gone (its guard reports lost, its unlock is `NotHeld`), the lock is free for the next
/// caller at once, and a fenced lock's tokens keep growing. Watchdog-mode holds, one of each kind,
/// and a fixed lease for the spin lock (its holds are checked as well as renewed).
#[tokio::test]
async fn every_lock_kind_is_free_after_flushall_and_its_holders_report_lost() {
    let redis = spawned().await;
    let url = redis.url();
    let (holder, next) = (client_with(&url, WATCHDOG).await, client(&url).await);
    let names: Vec<String> = (0..6).map(|i| unique(&format!("lock-loss-{i}"))).collect();
    let guards = vec![
        holder.lock(&names[0]).lock().await.unwrap(),
        holder.fenced_lock(&names[1]).lock().await.unwrap().into(),
        holder.fair_lock(&names[2]).lock().await.unwrap(),
        holder
            .read_write_lock(&names[3])
            .write_lock()
            .await
            .unwrap(),
        holder.read_write_lock(&names[4]).read_lock().await.unwrap(),
        holder
            .spin_lock(&names[5])
            .lock_with_lease(Duration::from_secs(600))
            .await
            .unwrap(),
    ];
    let token_before = guards[1].fencing_token().expect("fenced");

    redis.command(&["FLUSHALL"]).await.unwrap();
    for (guard, name) in guards.iter().zip(&names) {
        within(
            HANG,
            &format!("the holder of {name} to report lost"),
            guard.lost(),
        )
        .await;
    }
    let zero = Duration::ZERO;
    let again = vec![
        next.lock(&names[0]).try_lock(zero, None).await.unwrap(),
        next.fenced_lock(&names[1])
            .try_lock(zero, None)
            .await
            .unwrap()
            .map(lockkit::LockGuard::from),
        next.fair_lock(&names[2])
            .try_lock(zero, None)
            .await
            .unwrap(),
        next.read_write_lock(&names[3])
            .try_write_lock(zero, None)
            .await
            .unwrap(),
        next.read_write_lock(&names[4])
            .try_write_lock(zero, None)
            .await
            .unwrap(),
        next.spin_lock(&names[5])
            .try_lock(zero, None)
            .await
            .unwrap(),
    ];
    let again: Vec<_> = again
        .into_iter()
        .zip(&names)
        .map(|(guard, name)| guard.unwrap_or_else(|| panic!("{name} is still taken")))
        .collect();
    assert!(
        again[1].fencing_token().expect("fenced") > token_before,
        "fencing tokens keep growing across the data loss"
    );
    for (guard, name) in guards.into_iter().zip(&names) {
        assert!(
            matches!(guard.unlock().await, Err(Error::NotHeld { .. })),
            "{name}: the lost holder's unlock"
        );
    }
    for guard in again {
        guard.unlock().await.unwrap();
    }
}
