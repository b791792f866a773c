//! `#[lockkit::locked]`: an async fn run under a lock named after its arguments (the seed's
//! Spring `@DistributedLock(key = "#id", waitTime = 5, leaseTime = 3)`), against a real Redis.

use std::fmt::Display;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use lockkit::locked;
use lockkit_suite::{client, raw, redis, unique, within};
use tokio::sync::oneshot;

const HANG_GUARD: Duration = Duration::from_secs(120);

/// An application's error type: lock errors and storage errors, both through `?`.
#[derive(Debug)]
#[allow(dead_code)] // the fields are read through `Debug`, in failure messages
enum ShopError {
    Lock(lockkit::Error),
    Store(fred::error::Error),
    SoldOut,
}

impl From<lockkit::Error> for ShopError {
    fn from(err: lockkit::Error) -> Self {
        ShopError::Lock(err)
    }
}

impl From<fred::error::Error> for ShopError {
    fn from(err: fred::error::Error) -> Self {
        ShopError::Store(err)
    }
}

/// One instance ("pod") of the ticket shop: its own lockkit client, stock kept in Redis.
struct Shop {
    locks: lockkit::Client,
    store: fred::clients::Client,
    stock_key: String,
    sold_key: String,
}

impl Shop {
    /// The seed's `@DistributedLock(key = "#id")` method: a non-atomic read-modify-write that only
    /// the lock keeps from overselling. Waits without bound, watchdog mode.
    #[locked(client = self.locks, key = "ticket:{event}")]
    async fn buy(&self, event: &str) -> Result<(), ShopError> {
        let stock: i64 = self.store.get(&self.stock_key).await?;
        if stock <= 0 {
            return Err(ShopError::SoldOut);
        }
        tokio::task::yield_now().await; // widen the race window
        let _: () = self
            .store
            .set(&self.stock_key, stock - 1, None, None, false)
            .await?;
        let _: i64 = self.store.incr(&self.sold_key).await?;
        Ok(())
    }
}

/// 100 tickets, 50 concurrent buyers on two pods, 3 attempts each: exactly 100 sales, stock 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_hundred_tickets_fifty_buyers_never_oversell() {
    let redis = redis().await;
    let url = redis.url();
    let event = unique("concert");
    let stock_key = unique("stock");
    let sold_key = unique("sold");
    let store = raw(&url).await;
    let _: () = store.set(&stock_key, 100, None, None, false).await.unwrap();

    let mut pods = Vec::new();
    for _ in 0..2 {
        pods.push(Arc::new(Shop {
            locks: client(&url).await,
            store: raw(&url).await,
            stock_key: stock_key.clone(),
            sold_key: sold_key.clone(),
        }));
    }
    let mut buyers = Vec::new();
    for buyer in 0..50 {
        let shop = Arc::clone(&pods[buyer % 2]);
        let event = event.clone();
        buyers.push(tokio::spawn(async move {
            let mut bought = 0;
            for _ in 0..3 {
                match shop.buy(&event).await {
                    Ok(()) => bought += 1,
                    Err(ShopError::SoldOut) => {}
                    Err(err) => panic!("buy failed: {err:?}"),
                }
            }
            bought
        }));
    }
    let mut bought = 0;
    for buyer in buyers {
        bought += within(HANG_GUARD, "a buyer", buyer).await.unwrap();
    }
    let stock: i64 = store.get(&stock_key).await.unwrap();
    let sold: i64 = store.get(&sold_key).await.unwrap();
    assert_eq!(bought, 100, "successful purchases");
    assert_eq!(sold, 100, "sales recorded");
    assert_eq!(stock, 0, "final stock");
    for pod in &pods {
        assert!(!pod
            .locks
            .lock(format!("ticket:{event}"))
            .is_locked()
            .await
            .unwrap());
    }
}

/// Wait 100 ms, fixed lease; the body counts its runs.
#[locked(client = locks, key = "seat:{id}", wait = "100ms", lease = "30s")]
async fn reserve(
    locks: &lockkit::Client,
    id: &str,
    runs: &AtomicUsize,
) -> Result<(), lockkit::Error> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// Another client holds the key: the fn returns `Error::NotAcquired` naming the lock, and its
/// body never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_acquired_in_time_is_an_error_and_the_body_does_not_run() {
    let redis = redis().await;
    let (ours, theirs) = (client(&redis.url()).await, client(&redis.url()).await);
    let id = unique("seat");
    let name = format!("seat:{id}");
    let held = theirs.lock(&name).lock().await.unwrap();
    let runs = AtomicUsize::new(0);

    let err = within(HANG_GUARD, "reserve", reserve(&ours, &id, &runs))
        .await
        .unwrap_err();
    match &err {
        lockkit::Error::NotAcquired { name: got, waited } => {
            assert_eq!(got, &name);
            assert_eq!(*waited, Duration::from_millis(100));
        }
        other => panic!("expected NotAcquired, got {other:?}"),
    }
    assert!(err.to_string().contains(&name), "{err}");
    assert_eq!(
        runs.load(Ordering::SeqCst),
        0,
        "the body ran without the lock"
    );
    assert!(
        held.unlock().await.is_ok(),
        "the holder's lock was disturbed"
    );

    reserve(&ours, &id, &runs).await.unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

struct Order {
    id: u64,
    customer: Customer,
}

struct Customer {
    name: String,
}

struct Orders {
    locks: Arc<lockkit::Client>,
    shard: u32,
}

impl Orders {
    /// Field paths, the receiver's fields, a generic argument; one attempt (`wait = "0s"`).
    #[locked(
        client = self.locks,
        key = "order:{self.shard}:{order.customer.name}:{order.id}:{tag}",
        wait = "0s"
    )]
    async fn process<T: Display + Send + Sync>(
        &self,
        order: &Order,
        tag: T,
    ) -> Result<u64, lockkit::Error> {
        Ok(order.id)
    }

    /// A method taking `self` by value; the client is a field (an `Arc<Client>`).
    #[locked(client = self.locks, key = "shard:{self.shard}", wait = "0s")]
    async fn close(self) -> Result<u32, lockkit::Error> {
        Ok(self.shard)
    }
}

/// The key comes from the arguments: another client holding one order's lock blocks that order
/// only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_is_built_from_the_arguments() {
    let redis = redis().await;
    let orders = Orders {
        locks: Arc::new(client(&redis.url()).await),
        shard: 3,
    };
    let theirs = client(&redis.url()).await;
    let name = unique("ann");
    let order = |id| Order {
        id,
        customer: Customer { name: name.clone() },
    };
    let held = theirs
        .lock(format!("order:3:{name}:1:x"))
        .lock()
        .await
        .unwrap();

    // Another order, or another tag, is a different lock.
    assert_eq!(orders.process(&order(2), "x").await.unwrap(), 2);
    assert_eq!(orders.process(&order(1), 'y').await.unwrap(), 1);
    // The held one is not acquired, in one attempt.
    match orders.process(&order(1), "x").await {
        Err(lockkit::Error::NotAcquired { name: got, waited }) => {
            assert_eq!(got, format!("order:3:{name}:1:x"));
            assert_eq!(waited, Duration::ZERO);
        }
        other => panic!("expected NotAcquired, got {other:?}"),
    }
    held.unlock().await.unwrap();
    assert_eq!(orders.process(&order(1), "x").await.unwrap(), 1);
    assert_eq!(orders.close().await.unwrap(), 3);
}

/// Holds the lock until `commit` arrives, as a body that commits a transaction at its end.
#[locked(client = locks, key = "account:{account}")]
async fn transfer(
    locks: lockkit::Client,
    account: String,
    entered: oneshot::Sender<()>,
    commit: oneshot::Receiver<()>,
) -> Result<&'static str, lockkit::Error> {
    entered.send(()).unwrap();
    commit.await.unwrap();
    Ok("committed")
}

/// The lock is released only after the body's future completed: while the body waits for its
/// "commit", another client cannot take the lock; once the fn returned, it can.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_is_held_until_the_body_has_committed() {
    let redis = redis().await;
    let (ours, theirs) = (client(&redis.url()).await, client(&redis.url()).await);
    let account = unique("acct");
    let name = format!("account:{account}");
    let (entered_tx, entered_rx) = oneshot::channel();
    let (commit_tx, commit_rx) = oneshot::channel();
    let call = tokio::spawn(transfer(
        ours.clone(),
        account.clone(),
        entered_tx,
        commit_rx,
    ));

    within(HANG_GUARD, "the body to start", entered_rx)
        .await
        .unwrap();
    let lock = theirs.lock(&name);
    assert!(
        lock.try_lock(Duration::ZERO, None).await.unwrap().is_none(),
        "taken by another client while the body had not committed"
    );
    commit_tx.send(()).unwrap();
    let out = within(HANG_GUARD, "transfer", call).await.unwrap();
    assert_eq!(out.unwrap(), "committed");
    let guard = lock.try_lock(Duration::ZERO, None).await.unwrap();
    assert!(guard.is_some(), "not released after the fn returned");
}

/// The body's own error is returned (through `?`), and the lock is released all the same.
#[locked(client = &locks, key = "job:{name}", lease = "1h")]
async fn fails(
    locks: lockkit::Client,
    name: String,
    fail: bool,
) -> Result<Option<Duration>, ShopError> {
    let ttl = locks.lock(format!("job:{name}")).remaining_ttl().await?;
    if fail {
        Err(ShopError::SoldOut)?;
    }
    Ok(ttl)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_body_returns_its_error_and_releases() {
    let redis = redis().await;
    let locks = client(&redis.url()).await;
    let name = unique("job");
    let lock = locks.lock(format!("job:{name}"));

    // `lease = "1h"` is a fixed lease, longer than the watchdog's (30 s by default).
    let ttl = fails(locks.clone(), name.clone(), false).await.unwrap();
    assert!(
        ttl.is_some_and(|ttl| ttl > lockkit::DEFAULT_WATCHDOG_TIMEOUT),
        "{ttl:?}"
    );
    assert!(!lock.is_locked().await.unwrap());

    assert!(matches!(
        fails(locks.clone(), name.clone(), true).await,
        Err(ShopError::SoldOut)
    ));
    assert!(
        !lock.is_locked().await.unwrap(),
        "held after the body failed"
    );
}

/// The body "succeeds" but its lock was taken away meanwhile (force-unlocked here; a lease that
/// ran out is the same): the section may not have been exclusive, so the fn reports `NotHeld`.
#[locked(client = locks, key = "lost:{name}")]
async fn loses_its_lock(
    locks: &lockkit::Client,
    name: &str,
    ran: &AtomicBool,
) -> Result<(), lockkit::Error> {
    assert!(locks.lock(format!("lost:{name}")).force_unlock().await?);
    ran.store(true, Ordering::SeqCst);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_lost_during_the_body_is_an_error() {
    let redis = redis().await;
    let locks = client(&redis.url()).await;
    let name = unique("lost");
    let ran = AtomicBool::new(false);
    match loses_its_lock(&locks, &name, &ran).await {
        Err(lockkit::Error::NotHeld { name: got }) => assert_eq!(got, format!("lost:{name}")),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(ran.load(Ordering::SeqCst));
}

/// `kind = "fair"`: the body runs under a `FairLock` of that name (not a `Lock`).
#[locked(client = locks, key = "fair:{name}", kind = "fair", wait = "0s")]
async fn under_fair_lock(
    locks: &lockkit::Client,
    name: &str,
) -> Result<(bool, bool, bool), lockkit::Error> {
    let key = format!("fair:{name}");
    Ok((
        locks.fair_lock(&key).is_locked().await?,
        locks.lock(&key).is_locked().await?,
        locks.spin_lock(&key).is_locked().await?,
    ))
}

/// `kind = "spin"`: the body runs under a `SpinLock` of that name.
#[locked(client = locks, key = "spin:{name}", kind = "spin", lease = "1m")]
async fn under_spin_lock(
    locks: &lockkit::Client,
    name: &str,
) -> Result<(bool, bool, bool), lockkit::Error> {
    let key = format!("spin:{name}");
    Ok((
        locks.fair_lock(&key).is_locked().await?,
        locks.lock(&key).is_locked().await?,
        locks.spin_lock(&key).is_locked().await?,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kind_selects_the_lock() {
    let redis = redis().await;
    let locks = client(&redis.url()).await;
    let name = unique("kind");
    // (fair, lock, spin) held while the body runs
    assert_eq!(
        under_fair_lock(&locks, &name).await.unwrap(),
        (true, false, false)
    );
    assert_eq!(
        under_spin_lock(&locks, &name).await.unwrap(),
        (false, false, true)
    );
    assert!(!locks
        .fair_lock(format!("fair:{name}"))
        .is_locked()
        .await
        .unwrap());
    assert!(!locks
        .spin_lock(format!("spin:{name}"))
        .is_locked()
        .await
        .unwrap());
}
