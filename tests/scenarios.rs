//! The seed scenarios: the oversold last ticket and the 02:00 job on three pods.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use lockkit_suite::{client, raw, redis, unique};

/// 3 clients (pods) × 50 buyers, 100 tickets kept in Redis and sold by a non-atomic
/// read-modify-write: only the lock stands between the buyers and an oversold event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_pods_selling_one_hundred_tickets_never_oversell() {
    let redis = redis().await;
    let url = redis.url();
    let stock_key = unique("tickets-stock");
    let sold_key = unique("tickets-sold");
    let lock_name = unique("tickets-lock");
    let store = raw(&url).await;
    let _: () = store.set(&stock_key, 100, None, None, false).await.unwrap();

    let mut buyers = Vec::new();
    for _pod in 0..3 {
        let pod = client(&url).await;
        let store = raw(&url).await;
        for _ in 0..50 {
            let lock = pod.lock(&lock_name);
            let (store, stock_key, sold_key) = (store.clone(), stock_key.clone(), sold_key.clone());
            buyers.push(tokio::spawn(async move {
                let guard = lock
                    .try_lock(Duration::from_secs(60), None)
                    .await
                    .unwrap()
                    .expect("every buyer gets a turn within the wait");
                let stock: i64 = store.get(&stock_key).await.unwrap();
                tokio::task::yield_now().await; // widen the race window
                let bought = stock > 0;
                if bought {
                    let _: () = store
                        .set(&stock_key, stock - 1, None, None, false)
                        .await
                        .unwrap();
                    let _: i64 = store.incr(&sold_key).await.unwrap();
                }
                guard.unlock().await.unwrap();
                bought
            }));
        }
    }
    let mut bought = 0;
    for buyer in buyers {
        if buyer.await.unwrap() {
            bought += 1;
        }
    }
    let stock: i64 = store.get(&stock_key).await.unwrap();
    let sold: i64 = store.get(&sold_key).await.unwrap();
    assert_eq!(
        (bought, sold, stock),
        (100, 100, 0),
        "exactly 100 sold, none oversold"
    );
}

/// The 02:00 report job fires on three pods at the same instant: it runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daily_report_runs_on_exactly_one_of_three_pods() {
    let redis = redis().await;
    let name = unique("report:daily");
    let runs = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(tokio::sync::Barrier::new(3));
    let mut pods = Vec::new();
    for _ in 0..3 {
        let client = client(&redis.url()).await;
        let (runs, barrier, name) = (Arc::clone(&runs), Arc::clone(&barrier), name.clone());
        pods.push(tokio::spawn(async move {
            barrier.wait().await;
            let lock = client.lock(&name);
            match lock.try_lock(Duration::ZERO, None).await.unwrap() {
                Some(guard) => {
                    runs.fetch_add(1, Ordering::SeqCst);
                    // The job holds the lock while it runs; the other pods have already decided.
                    barrier.wait().await;
                    guard.unlock().await.unwrap();
                }
                None => {
                    barrier.wait().await;
                }
            }
        }));
    }
    for pod in pods {
        pod.await.unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}
