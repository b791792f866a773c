//! A freed permit reaches a waiter that can use it (issue 11, item 4).
//!
//! A release of `k` permits wakes `k` waiters of each client, the longest-registered first. When
//! the one woken needs more than is free, it is refused; the wake-up must then go on to a waiter
//! of the same client that needs less, instead of leaving it asleep until its deadline or the
//! holders' leases end.
//!
//! Every scenario: a semaphore of 2 permits, both held with a long fixed lease (so no lease end
//! wakes anyone), waiters registered in a given order across one or two clients, then one permit
//! released. A 1-permit waiter must get it. The waiters' own wait (`PATIENCE`) is far longer
//! than the test's bound (`BOUND`), and their clients do not look again on their own
//! (`client_woken_only`): a waiter that is not woken by the release sleeps past the bound, and
//! the test fails with a timeout instead of passing late.

use std::time::Duration;

use lockkit::{Client, SemaphorePermit};
use lockkit_suite::{client, client_woken_only, spawned, unique, within};
use tokio::task::JoinHandle;

/// The waiters' patience: longer than the test's bound.
const PATIENCE: Duration = Duration::from_secs(60);
/// The holders' lease: longer than every other bound, so no lease end wakes a waiter.
const LEASE: Duration = Duration::from_secs(120);
/// The test's own bound on the outcome (a hang guard, not a latency threshold).
const BOUND: Duration = Duration::from_secs(10);

/// One waiter of a scenario: which client it uses, and how many permits it wants.
#[derive(Clone, Copy, Debug)]
struct Wants {
    client: usize,
    permits: u64,
}

const fn wants(client: usize, permits: u64) -> Wants {
    Wants { client, permits }
}

type Waiting = JoinHandle<Result<Option<SemaphorePermit>, lockkit::Error>>;

/// Registers the waiters in `order`, each one only once the previous one is registered and has
/// made the try that follows its registration, then releases one of the two held permits and
/// requires a 1-permit waiter to get it within [`BOUND`].
async fn a_freed_permit_reaches_a_one_permit_waiter(clients: usize, order: &[Wants]) {
    let redis = spawned().await;
    let url = redis.url();
    let holder = client(&url).await;
    let mut waiters: Vec<Client> = Vec::new();
    for _ in 0..clients {
        waiters.push(client_woken_only(&url).await);
    }
    let name = unique("wakeups");
    let semaphore = holder.semaphore(&name);
    assert!(semaphore.try_set_permits(2).await.unwrap());
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            semaphore
                .try_acquire(1, Duration::ZERO, Some(LEASE))
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }

    let mut tasks: Vec<(Wants, Waiting)> = Vec::new();
    for &want in order {
        let client = &waiters[want.client];
        let registered = client.waiting_count();
        let semaphore = client.semaphore(&name);
        let task =
            tokio::spawn(async move { semaphore.try_acquire(want.permits, PATIENCE, None).await });
        within(BOUND, "the waiter to register", async {
            while client.waiting_count() <= registered {
                tokio::task::yield_now().await;
            }
        })
        .await;
        // The waiter sends its post-registration try in the same poll as it registers; a
        // command sent now on the same connection is answered after that try, so the try has
        // run in Redis (and found no permit) before anything is released.
        assert_eq!(
            client.semaphore(&name).available_permits().await.unwrap(),
            0
        );
        tasks.push((want, task));
    }

    held.pop().expect("two held").release().await.unwrap();

    // Exactly one permit is free: one of the 1-permit waiters must get it.
    let (mut ones, others): (Vec<_>, Vec<_>) =
        tasks.into_iter().partition(|(want, _)| want.permits == 1);
    let (index, outcome) = tokio::time::timeout(BOUND, async {
        let (outcome, index, _) =
            futures::future::select_all(ones.iter_mut().map(|(_, task)| task)).await;
        (index, outcome)
    })
    .await
    .unwrap_or_else(|_| {
        panic!(
            "{order:?}: the freed permit reached no 1-permit waiter within {BOUND:?} \
             (the 2-permit waiter took the only wake-up)"
        )
    });
    let permit = outcome
        .unwrap()
        .unwrap()
        .expect("acquired within the waiter's patience");
    assert_eq!(permit.permits(), 1);
    let (winner, _) = ones.remove(index);
    for (want, task) in others.iter().chain(&ones) {
        assert!(
            !task.is_finished(),
            "{order:?}: {want:?} has nothing free after {winner:?} took the permit"
        );
    }

    // Give everything back: every waiter finishes (the 2-permit ones once two are free).
    for (_, task) in others.into_iter().chain(ones) {
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
    }
    permit.release().await.unwrap();
    for permit in held {
        permit.release().await.unwrap();
    }
    assert_eq!(
        within(BOUND, "the permits", semaphore.available_permits())
            .await
            .unwrap(),
        2
    );
}

/// The case: in one client a waiter for 2 registers first, then a waiter for 1.
#[tokio::test]
async fn in_one_client_a_refused_two_permit_waiter_passes_the_wake_up_on() {
    a_freed_permit_reaches_a_one_permit_waiter(1, &[wants(0, 2), wants(0, 1)]).await;
}

/// Several waiters that need more registered first: the wake-up travels past all of them.
#[tokio::test]
async fn the_wake_up_travels_past_every_waiter_that_needs_more() {
    a_freed_permit_reaches_a_one_permit_waiter(1, &[wants(0, 2), wants(0, 2), wants(0, 1)]).await;
}

/// The 2-permit waiter in one client, the 1-permit waiter in another, in both orders. Each client
/// gets its own message, so this works without passing wake-ups on; it guards that passing them
/// on does not break delivery across clients.
#[tokio::test]
async fn across_clients_the_one_permit_waiter_gets_the_freed_permit() {
    for order in [[wants(0, 2), wants(1, 1)], [wants(1, 1), wants(0, 2)]] {
        a_freed_permit_reaches_a_one_permit_waiter(2, &order).await;
    }
}

/// Both kinds of waiter in both clients, in both orders within each client. Where every client
/// registered its 2-permit waiter first, each client's only wake-up goes to a waiter that cannot
/// use it.
#[tokio::test]
async fn with_both_kinds_of_waiter_in_both_clients_a_one_permit_waiter_gets_it() {
    let orders = [
        [wants(0, 2), wants(0, 1), wants(1, 2), wants(1, 1)],
        [wants(0, 2), wants(1, 2), wants(1, 1), wants(0, 1)],
        [wants(0, 1), wants(0, 2), wants(1, 2), wants(1, 1)],
        [wants(1, 1), wants(0, 2), wants(1, 2), wants(0, 1)],
    ];
    for order in orders {
        a_freed_permit_reaches_a_one_permit_waiter(2, &order).await;
    }
}
