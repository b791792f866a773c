//! The `metrics` feature: a small recorder installed for this test binary sees every metric
//! lockkit reports, labelled by kind.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use lockkit_suite::{client, client_with, redis, unique, until_waiting, within};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use tokio::sync::Notify;

const HANG: Duration = Duration::from_secs(60);

/// Counter totals, gauge values, histogram sample counts; keyed `name{kind}`.
#[derive(Default)]
struct Store {
    values: Mutex<HashMap<String, f64>>,
    changed: Notify,
}

impl Store {
    fn update(&self, key: &str, f: impl FnOnce(&mut f64)) {
        f(self
            .values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key.to_owned())
            .or_insert(0.0));
        self.changed.notify_waiters();
    }

    fn get(&self, key: &str) -> f64 {
        self.values
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .copied()
            .unwrap_or(0.0)
    }

    /// Waits (event-driven: every update notifies) until `key` satisfies `cond`.
    async fn until(&self, key: &str, cond: impl Fn(f64) -> bool) {
        within(HANG, key, async {
            loop {
                let changed = self.changed.notified();
                if cond(self.get(key)) {
                    return;
                }
                changed.await;
            }
        })
        .await;
    }
}

struct Cell {
    key: String,
    store: &'static Store,
}

impl CounterFn for Cell {
    fn increment(&self, value: u64) {
        self.store.update(&self.key, |v| *v += value as f64);
    }
    fn absolute(&self, value: u64) {
        self.store.update(&self.key, |v| *v = value as f64);
    }
}

impl GaugeFn for Cell {
    fn increment(&self, value: f64) {
        self.store.update(&self.key, |v| *v += value);
    }
    fn decrement(&self, value: f64) {
        self.store.update(&self.key, |v| *v -= value);
    }
    fn set(&self, value: f64) {
        self.store.update(&self.key, |v| *v = value);
    }
}

impl HistogramFn for Cell {
    fn record(&self, value: f64) {
        assert!(value >= 0.0, "{}: negative sample {value}", self.key);
        self.store.update(&self.key, |v| *v += 1.0);
    }
}

struct TestRecorder(&'static Store);

impl TestRecorder {
    fn cell(&self, key: &Key) -> Arc<Cell> {
        let kind = key
            .labels()
            .find(|label| label.key() == "kind")
            .map_or("?", |label| label.value());
        Arc::new(Cell {
            key: format!("{}{{{kind}}}", key.name()),
            store: self.0,
        })
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.cell(key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.cell(key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(self.cell(key))
    }
}

fn store() -> &'static Store {
    static STORE: OnceLock<&'static Store> = OnceLock::new();
    STORE.get_or_init(|| {
        let store: &'static Store = Box::leak(Box::default());
        metrics::set_global_recorder(TestRecorder(store)).expect("the only recorder");
        store
    })
}

// One test: the recorder is global to the binary, and the values are totals per kind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_waits_holds_renewals_timeouts_waiters_and_lost_leases_are_measured() {
    let store = store();
    let redis = redis().await;
    // A short watchdog timeout: renewals every 100 ms.
    let a = client_with(&redis.url(), Duration::from_millis(300)).await;
    let b = client(&redis.url()).await;
    let name = unique("metrics");

    let held = a.lock(&name).lock().await.unwrap();
    assert_eq!(store.get("lockkit_acquisitions_total{lock}"), 1.0);
    assert_eq!(store.get("lockkit_wait_seconds{lock}"), 1.0);

    // A try that finds it taken gives up: a timeout.
    assert!(b
        .lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    assert_eq!(store.get("lockkit_acquire_timeouts_total{lock}"), 1.0);

    // A waiter is counted while it waits.
    let waiter = {
        let lock = b.lock(&name);
        tokio::spawn(async move { lock.lock().await })
    };
    until_waiting(&b, 1).await;
    assert_eq!(store.get("lockkit_waiters{lock}"), 1.0);

    // The watchdog renews the hold.
    store
        .until("lockkit_renewals_total{lock}", |n| n >= 1.0)
        .await;

    held.unlock().await.unwrap();
    assert_eq!(store.get("lockkit_hold_seconds{lock}"), 1.0);
    let second = within(HANG, "the waiter", waiter).await.unwrap().unwrap();
    assert_eq!(store.get("lockkit_acquisitions_total{lock}"), 2.0);
    assert_eq!(store.get("lockkit_waiters{lock}"), 0.0);
    second.unlock().await.unwrap();
    assert_eq!(store.get("lockkit_hold_seconds{lock}"), 2.0);
    assert_eq!(store.get("lockkit_leases_lost_total{lock}"), 0.0);

    // Another kind, labelled as such: a fixed lease that runs out is a lost lease.
    let spin = a
        .spin_lock(unique("metrics-spin"))
        .try_lock(Duration::ZERO, Some(Duration::from_millis(50)))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.get("lockkit_acquisitions_total{spin}"), 1.0);
    within(HANG, "the spin lock's lease to end", spin.lost()).await;
    assert_eq!(store.get("lockkit_leases_lost_total{spin}"), 1.0);
    assert_eq!(store.get("lockkit_hold_seconds{spin}"), 1.0);
    assert!(spin.unlock().await.is_err(), "its lease ran out");
    assert_eq!(
        store.get("lockkit_hold_seconds{spin}"),
        1.0,
        "recorded once"
    );
}
