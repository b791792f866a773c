//! A waiter whose request a change of the total made impossible is refused at once (issue 19, §3).
//!
//! The guide: "Asking for more permits than the semaphore has in total […]: `Error::Refused` at
//! once, not a wait that can never end; a waiter is refused too when `add_permits` lowers the
//! total below its request." Every change of a total that can make a waiter's request impossible
//! announces `all`, so every waiter tries once more: `add_permits(-n)`, a `try_set_permits` that
//! sets a total, and an acquire that sets the total again from its configured one after the keys
//! were lost.
//!
//! In every scenario the holders **keep holding** (a release would wake the waiter and hide a
//! missing announcement), with leases far longer than the test's hang guard (`BOUND`), and the
//! waiting client does not look again on its own (`client_woken_only`): a waiter that is not told
//! sleeps past the guard, and the test fails with a timeout. Each scenario runs with a bounded
//! `try_acquire` and with an unbounded `acquire`.
//!
//! The latch has no such change: its count only goes down, and the count-down that reaches zero
//! announces `all` already (`tests/count_down_latch.rs`); what happens when its key is lost is in
//! `tests/data_loss.rs`.

use std::future::Future;
use std::time::Duration;

use lockkit::{Client, Error};
use lockkit_suite::{client, client_woken_only, spawned, unique, within};

/// The waiters' own patience, for the bounded variant: longer than the guard.
const PATIENCE: Duration = Duration::from_secs(60);
/// The fixed leases of holders: longer than everything else, so no lease end wakes a waiter.
const LEASE: Duration = Duration::from_secs(120);
/// The test's bound on the refusal: a hang guard, not a latency threshold. A watchdog-mode holder's
/// lease (30 s by default, renewed) ends far later.
const BOUND: Duration = Duration::from_secs(10);

/// Whether a waiter uses a bounded `try_acquire` or an unbounded `acquire`.
#[derive(Clone, Copy, Debug)]
enum Wait {
    Bounded,
    Unbounded,
}

const BOTH: [Wait; 2] = [Wait::Bounded, Wait::Unbounded];

/// Spawns a waiter on `client`'s semaphore `name` for `permits` permits, and returns once it is
/// registered and its try after registering has run in Redis (a command sent afterwards on the
/// same connection is answered after it).
async fn waiter(
    client: &Client,
    name: &str,
    permits: u64,
    wait: Wait,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let before = client.waiting_count();
    let semaphore = client.semaphore(name);
    let task = tokio::spawn(async move {
        match wait {
            Wait::Bounded => semaphore
                .try_acquire(permits, PATIENCE, None)
                .await
                .map(|permit| panic!("{permits} permits granted: {permit:?}")),
            Wait::Unbounded => semaphore
                .acquire(permits)
                .await
                .map(|permit| panic!("{permits} permits granted: {permit:?}")),
        }
    });
    within(BOUND, "the waiter to register", async {
        while client.waiting_count() <= before {
            tokio::task::yield_now().await;
        }
    })
    .await;
    client.semaphore(name).available_permits().await.unwrap();
    task
}

/// As [`waiter`], for one permit of a permit-expirable semaphore.
async fn expirable_waiter(
    client: &Client,
    name: &str,
    wait: Wait,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let before = client.waiting_count();
    let semaphore = client.permit_expirable_semaphore(name);
    let task = tokio::spawn(async move {
        match wait {
            Wait::Bounded => semaphore
                .try_acquire(PATIENCE, LEASE)
                .await
                .map(|permit| panic!("a permit granted: {permit:?}")),
            Wait::Unbounded => semaphore
                .acquire(LEASE)
                .await
                .map(|permit| panic!("a permit granted: {permit:?}")),
        }
    });
    within(BOUND, "the waiter to register", async {
        while client.waiting_count() <= before {
            tokio::task::yield_now().await;
        }
    })
    .await;
    client
        .permit_expirable_semaphore(name)
        .available_permits()
        .await
        .unwrap();
    task
}

/// The waiter's outcome must be `Refused` naming the new total, within [`BOUND`].
async fn refused_at_once(
    what: &str,
    task: impl Future<Output = Result<Result<(), Error>, tokio::task::JoinError>>,
    total: u64,
) {
    // Called right after the change returned: how long the waiter took to hear is reported (not
    // asserted: the guard is the test's only bound).
    let changed = std::time::Instant::now();
    let outcome = within(BOUND, what, task).await.unwrap();
    eprintln!("{what}: refused {:?} after the change", changed.elapsed());
    match outcome {
        Err(Error::Refused { reason, .. }) => assert!(
            reason.contains(&format!("only {total} in total")),
            "{what}: {reason}"
        ),
        other => panic!("{what}: expected Refused, got {other:?}"),
    }
}

#[tokio::test]
async fn add_permits_below_a_waiters_request_refuses_it_while_the_holder_still_holds() {
    let redis = spawned().await;
    let (holder, waiting, admin) = (
        client(&redis.url()).await,
        client_woken_only(&redis.url()).await,
        client(&redis.url()).await,
    );
    for wait in BOTH {
        let name = unique("shrink");
        let semaphore = holder.semaphore(&name);
        assert!(semaphore.try_set_permits(2).await.unwrap());
        // Watchdog mode, as in the issue: its lease is renewed for as long as it is held.
        let held = semaphore.acquire(1).await.unwrap();

        let task = waiter(&waiting, &name, 2, wait).await;
        assert_eq!(admin.semaphore(&name).add_permits(-1).await.unwrap(), 1);
        refused_at_once(&format!("{wait:?} waiter for 2"), task, 1).await;

        // The holder was never disturbed.
        assert!(!held.is_lost());
        held.release().await.unwrap();
        assert_eq!(semaphore.available_permits().await.unwrap(), 1);
    }
}

#[tokio::test]
async fn a_waiter_that_still_fits_the_lowered_total_keeps_waiting_and_gets_its_permit() {
    let redis = spawned().await;
    let (holder, waiting) = (
        client(&redis.url()).await,
        client_woken_only(&redis.url()).await,
    );
    let name = unique("shrink-fits");
    let semaphore = holder.semaphore(&name);
    assert!(semaphore.try_set_permits(3).await.unwrap());
    let first = semaphore
        .try_acquire(1, Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .expect("free");
    let second = semaphore
        .try_acquire(1, Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .expect("free");
    let before = waiting.waiting_count();
    let task = {
        let semaphore = waiting.semaphore(&name);
        tokio::spawn(async move { semaphore.try_acquire(2, PATIENCE, None).await })
    };
    within(BOUND, "the waiter to register", async {
        while waiting.waiting_count() <= before {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // 3 -> 2: the waiter for 2 is told, tries, and waits on (2 is still possible).
    assert_eq!(semaphore.add_permits(-1).await.unwrap(), 2);
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);
    assert!(!task.is_finished());
    first.release().await.unwrap();
    second.release().await.unwrap();
    let permit = within(BOUND, "the waiter's permits", task)
        .await
        .unwrap()
        .unwrap()
        .expect("granted within its patience");
    assert_eq!(permit.permits(), 2);
    permit.release().await.unwrap();
}

#[tokio::test]
async fn add_permits_to_zero_refuses_a_permit_expirable_waiter_while_the_permit_is_held() {
    let redis = spawned().await;
    let (holder, waiting) = (
        client(&redis.url()).await,
        client_woken_only(&redis.url()).await,
    );
    for wait in BOTH {
        let name = unique("pes-shrink");
        let slots = holder.permit_expirable_semaphore(&name);
        assert!(slots.try_set_permits(1).await.unwrap());
        let held = slots.acquire(LEASE).await.unwrap();

        let task = expirable_waiter(&waiting, &name, wait).await;
        assert_eq!(slots.add_permits(-1).await.unwrap(), 0);
        refused_at_once(&format!("{wait:?} permit-expirable waiter"), task, 0).await;

        held.release().await.unwrap();
    }
}

#[tokio::test]
async fn a_total_set_after_the_keys_were_lost_refuses_a_waiter_that_asks_for_more() {
    let redis = spawned().await;
    let (holder, waiting, admin) = (
        client(&redis.url()).await,
        client_woken_only(&redis.url()).await,
        client(&redis.url()).await,
    );
    for wait in BOTH {
        let name = unique("reset");
        let semaphore = holder.semaphore(&name);
        assert!(semaphore.try_set_permits(2).await.unwrap());
        let _held = semaphore
            .try_acquire(2, Duration::ZERO, Some(LEASE))
            .await
            .unwrap()
            .expect("free");
        // The waiter's client remembers no total: it waits on what Redis says.
        let task = waiter(&waiting, &name, 2, wait).await;

        // The data is lost while the waiter sleeps (no announcement can come from that), then
        // a pod sets a smaller total, on the semaphore and on its permit-expirable twin.
        redis.command(&["FLUSHALL"]).await.unwrap();
        assert!(admin.semaphore(&name).try_set_permits(1).await.unwrap());
        refused_at_once(&format!("{wait:?} waiter for 2"), task, 1).await;
    }
    for wait in BOTH {
        let name = unique("pes-reset");
        let slots = holder.permit_expirable_semaphore(&name);
        assert!(slots.try_set_permits(1).await.unwrap());
        let _held = slots.acquire(LEASE).await.unwrap();
        let task = expirable_waiter(&waiting, &name, wait).await;
        redis.command(&["FLUSHALL"]).await.unwrap();
        assert!(admin
            .permit_expirable_semaphore(&name)
            .try_set_permits(0)
            .await
            .unwrap());
        refused_at_once(&format!("{wait:?} permit-expirable waiter"), task, 0).await;
    }
}

#[tokio::test]
async fn an_acquire_that_sets_the_lost_total_again_refuses_a_waiter_that_asks_for_more() {
    let redis = spawned().await;
    let (holder, waiting, other) = (
        client(&redis.url()).await,
        client_woken_only(&redis.url()).await,
        client(&redis.url()).await,
    );
    for wait in BOTH {
        let name = unique("reinit");
        let semaphore = holder.semaphore(&name);
        assert!(semaphore.try_set_permits(2).await.unwrap());
        let _held = semaphore
            .try_acquire(2, Duration::ZERO, Some(LEASE))
            .await
            .unwrap()
            .expect("free");
        let task = waiter(&waiting, &name, 2, wait).await;

        redis.command(&["FLUSHALL"]).await.unwrap();
        // Another pod, configured with 1 permit, acquires first: it sets the total to 1.
        let permit = other
            .semaphore(&name)
            .with_permits(1)
            .unwrap()
            .acquire(1)
            .await
            .unwrap();
        refused_at_once(&format!("{wait:?} waiter for 2"), task, 1).await;
        permit.release().await.unwrap();
    }
}
