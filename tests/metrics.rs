//! The `metrics` feature: a small recorder installed for this test binary sees every metric
//! lockkit reports, labelled by kind (the received pub/sub messages unlabelled: `{?}`). And the `lockkit.acquire` / `lockkit.release` tracing
//! spans, seen by a small subscriber.

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
async fn acquisitions_waits_holds_renewals_timeouts_waiters_messages_and_lost_leases_are_measured()
{
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
    // Counted once the waiter's subscription is confirmed, just after the hub counts it.
    store.until("lockkit_waiters{lock}", |n| n == 1.0).await;

    // The watchdog renews the hold.
    store
        .until("lockkit_renewals_total{lock}", |n| n >= 1.0)
        .await;

    // Nothing was published on the lock's channel yet.
    assert_eq!(store.get("lockkit_pubsub_messages_total{?}"), 0.0);
    held.unlock().await.unwrap();
    assert_eq!(store.get("lockkit_hold_seconds{lock}"), 1.0);
    let second = within(HANG, "the waiter", waiter).await.unwrap().unwrap();
    // The release's message reached the waiter's client (counted before it woke the waiter); a
    // handoff sends at most 2 (issue 20).
    let messages = store.get("lockkit_pubsub_messages_total{?}");
    assert!((1.0..=2.0).contains(&messages), "{messages} messages");
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
    // The watchdog's check and the lost-signal may both find it lost; counted once, by either.
    store
        .until("lockkit_leases_lost_total{spin}", |n| n == 1.0)
        .await;
    store
        .until("lockkit_hold_seconds{spin}", |n| n == 1.0)
        .await;
    assert!(spin.unlock().await.is_err(), "its lease ran out");
    assert_eq!(
        store.get("lockkit_hold_seconds{spin}"),
        1.0,
        "recorded once"
    );
}

/// The spans seen: name and fields (recorded at creation or later), in creation order.
static SPANS: Mutex<Vec<(String, HashMap<String, String>)>> = Mutex::new(Vec::new());
/// Metadata of each span, by the same index.
static METADATA: Mutex<Vec<&'static tracing::Metadata<'static>>> = Mutex::new(Vec::new());

thread_local! {
    /// The spans entered on this thread, innermost last (for `Span::current`).
    static ENTERED: std::cell::RefCell<Vec<tracing::span::Id>> = const { std::cell::RefCell::new(Vec::new()) };
}

struct FieldVisitor<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for FieldVisitor<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

/// Records every span's name and fields; ids are indexes into [`SPANS`] (plus one).
struct SpanRecorder;

fn spans() -> std::sync::MutexGuard<'static, Vec<(String, HashMap<String, String>)>> {
    SPANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl tracing::Subscriber for SpanRecorder {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("lockkit")
    }
    fn new_span(&self, attrs: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        let mut fields = HashMap::new();
        attrs.record(&mut FieldVisitor(&mut fields));
        let mut spans = spans();
        spans.push((attrs.metadata().name().to_owned(), fields));
        METADATA
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(attrs.metadata());
        tracing::span::Id::from_u64(spans.len() as u64)
    }
    fn record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>) {
        let index = usize::try_from(id.into_u64()).unwrap() - 1;
        if let Some((_, fields)) = spans().get_mut(index) {
            values.record(&mut FieldVisitor(fields));
        }
    }
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, id: &tracing::span::Id) {
        ENTERED.with(|entered| entered.borrow_mut().push(id.clone()));
    }
    fn exit(&self, _: &tracing::span::Id) {
        ENTERED.with(|entered| entered.borrow_mut().pop());
    }
    fn current_span(&self) -> tracing_core::span::Current {
        let Some(id) = ENTERED.with(|entered| entered.borrow().last().cloned()) else {
            return tracing_core::span::Current::none();
        };
        let index = usize::try_from(id.into_u64()).unwrap() - 1;
        let metadata = METADATA
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)[index];
        tracing_core::span::Current::new(id, metadata)
    }
}

#[tokio::test]
async fn acquire_and_release_run_in_spans() {
    // Fails only if another test of this binary installed a subscriber first (none does).
    tracing::subscriber::set_global_default(SpanRecorder).unwrap();
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("spans");
    let guard = client
        .fenced_lock(&name)
        .try_lock(Duration::from_secs(5), None)
        .await
        .unwrap()
        .unwrap();
    guard.unlock().await.unwrap();

    let spans = spans();
    let of = |span: &str| {
        spans
            .iter()
            .filter(|(n, fields)| n == span && fields.get("name") == Some(&name))
            .map(|(_, fields)| fields.clone())
            .collect::<Vec<_>>()
    };
    let acquire = of("lockkit.acquire");
    assert_eq!(acquire.len(), 1, "{spans:?}");
    let fields = &acquire[0];
    assert_eq!(fields.get("kind").map(String::as_str), Some("fenced"));
    assert_eq!(fields.get("wait").map(String::as_str), Some("Some(5s)"));
    assert_eq!(
        fields.get("lease").map(String::as_str),
        Some("30s"),
        "{fields:?}"
    );
    assert_eq!(fields.get("watchdog").map(String::as_str), Some("true"));
    let release = of("lockkit.release");
    assert_eq!(release.len(), 1, "{spans:?}");
    assert_eq!(release[0].get("kind").map(String::as_str), Some("fenced"));
}

/// An election's leadership counts once in `lockkit_leader_changes_total` and in
/// `lockkit_is_leader` while it lasts (issue 22).
#[tokio::test]
async fn leadership_is_counted_while_it_lasts() {
    let store = store();
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("metrics-election");
    let before = store.get("lockkit_leader_changes_total{election}");
    let leadership = client.election(&name).campaign("a").await.unwrap();
    assert_eq!(
        store.get("lockkit_leader_changes_total{election}"),
        before + 1.0
    );
    assert!(store.get("lockkit_is_leader{election}") >= 1.0);
    let leading = store.get("lockkit_is_leader{election}");
    leadership.resign().await.unwrap();
    assert_eq!(store.get("lockkit_is_leader{election}"), leading - 1.0);
}

/// A rate limiter reports what it admitted (`lockkit_acquisitions_total`), refused
/// (`lockkit_acquire_timeouts_total`) and how long each admitted call waited
/// (`lockkit_wait_seconds`), and counts a call sleeping on its reservation in `lockkit_waiters`,
/// all with `kind="ratelimiter"` (issue 30).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiter_counts_admitted_refused_and_waited() {
    let store = store();
    let redis = redis().await;
    let client = client(&redis.url()).await;
    // One permit every 2 s: the second call waits for its reservation.
    let limit = lockkit::RateLimit::new(1, Duration::from_secs(2)).unwrap();
    let limiter = client
        .rate_limiter(unique("metrics-rate"))
        .with_limit(limit);

    limiter.acquire(1).await.unwrap();
    assert_eq!(store.get("lockkit_acquisitions_total{ratelimiter}"), 1.0);
    assert_eq!(store.get("lockkit_wait_seconds{ratelimiter}"), 1.0);

    // Refused at once: the next permit is 2 s away.
    assert!(!limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert_eq!(
        store.get("lockkit_acquire_timeouts_total{ratelimiter}"),
        1.0
    );
    assert_eq!(store.get("lockkit_acquisitions_total{ratelimiter}"), 1.0);

    // A reserved call sleeps until its moment: a waiter meanwhile, then an admission with its
    // wait measured.
    let waiter = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    store
        .until("lockkit_waiters{ratelimiter}", |n| n == 1.0)
        .await;
    assert_eq!(limiter.waiting().await.unwrap(), 1);
    let admission = within(HANG, "the reserved call", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(admission.permits(), 1);
    assert_eq!(store.get("lockkit_waiters{ratelimiter}"), 0.0);
    assert_eq!(store.get("lockkit_acquisitions_total{ratelimiter}"), 2.0);
    assert_eq!(store.get("lockkit_wait_seconds{ratelimiter}"), 2.0);
    assert_eq!(
        store.get("lockkit_acquire_timeouts_total{ratelimiter}"),
        1.0
    );
}
