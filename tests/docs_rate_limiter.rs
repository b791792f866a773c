//! The rate limiter's documented promises, checked the way a user reading only the documentation
//! would try to break them: README.md, docs/guide.md ("RateLimiter — at most N per interval,
//! across every pod", its CLI and metrics parts), docs/design.md ("The rate limiter (issue 30)"),
//! CHANGELOG.md and the rustdoc of `RateLimiter`, `RateLimit`, `RateMode` and `RateAdmission`.
//! Each test quotes the sentence it checks. (The CLI's promises are checked in
//! `crates/lockkit-cli/tests/docs_rate_limiter_cli.rs`, where the `lockkit` binary is built.)
//!
//! Windows are counted on the admitted moments the server reported (`RateAdmission::admitted_at`)
//! with `src/rate_window.rs`. The only timing bound asserted is the documented one of
//! `try_acquire` ("returns within `wait` plus at most one round trip").

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockkit::protocol::keys::Kind;
use lockkit::{Client, Error, RateAdmission, RateLimit, RateLimiter, RateMode};
use lockkit_suite::rate_window::{assert_no_window_over, busiest_window};
use lockkit_suite::{client, server_ms, spawned, unique, within, RedisServer};
use lockkit_testkit::FaultProxy;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};

const HANG: Duration = Duration::from_secs(60);

/// The metrics are global to this test binary: the metrics test takes this for writing, every
/// other test that uses a rate limiter for reading (so it also holds under `cargo test`'s threads).
static METRICS_GATE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The limiter's key, as the guide shows it (`lockkit:ratelimiter:{sms-gateway}`).
fn limiter_key(name: &str) -> String {
    format!("lockkit:ratelimiter:{{{name}}}")
}

/// The server's clock.
async fn server_now(server: &RedisServer) -> SystemTime {
    let reply = server.command(&["TIME"]).await.expect("TIME");
    UNIX_EPOCH + Duration::from_millis(server_ms(&reply))
}

async fn cmd(server: &RedisServer, args: &[&str]) {
    server.command(args).await.expect("the command runs");
}

/// Waits (hang guard) until `limiter.waiting()` is `count`: the reservations placed in Redis.
async fn until_reserved(limiter: &RateLimiter, count: u64) {
    within(HANG, "the reservations", async {
        while limiter.waiting().await.expect("waiting()") != count {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

fn is_invalid(result: &Result<impl std::fmt::Debug, Error>) -> bool {
    matches!(result, Err(Error::InvalidArgument(..)))
}

// ---------------------------------------------------------------------------------------------
// The limit: RateLimit's constructors and bounds.
// ---------------------------------------------------------------------------------------------

/// "`RateLimit::new` refuses zero permits, an interval under 1 ms, over 366 days or not whole
/// milliseconds, and more than one permit per microsecond (`Error::InvalidArgument`)";
/// "`MAX_INTERVAL`: 366 days"; "`MAX_BURST` = 1,000,000,000"; "`with_burst`: InvalidArgument
/// for a burst over MAX_BURST"; "`burst + 1` is the most one request may ask for".
#[test]
fn rate_limit_refuses_the_documented_bad_values_and_accepts_the_edges() {
    let day = Duration::from_secs(86_400);
    assert_eq!(RateLimit::MAX_INTERVAL, 366 * day);
    assert!(is_invalid(&RateLimit::new(0, Duration::from_secs(1))));
    assert!(is_invalid(&RateLimit::per_second(0)));
    assert!(is_invalid(&RateLimit::per_minute(0)));
    assert!(is_invalid(&RateLimit::new(1, Duration::ZERO)));
    assert!(is_invalid(&RateLimit::new(1, Duration::from_micros(999))));
    assert!(RateLimit::new(1, Duration::from_millis(1)).is_ok());
    assert!(RateLimit::new(1, RateLimit::MAX_INTERVAL).is_ok());
    assert!(is_invalid(&RateLimit::new(
        1,
        RateLimit::MAX_INTERVAL + Duration::from_millis(1)
    )));
    assert!(is_invalid(&RateLimit::new(1, Duration::MAX)));
    assert!(is_invalid(&RateLimit::new(1, Duration::from_micros(1500))));
    assert!(is_invalid(&RateLimit::new(
        1,
        Duration::from_secs(1) + Duration::from_nanos(1)
    )));
    // One permit per microsecond is allowed, more is not.
    assert!(RateLimit::new(1000, Duration::from_millis(1)).is_ok());
    assert!(is_invalid(&RateLimit::new(1001, Duration::from_millis(1))));
    assert!(RateLimit::per_second(1_000_000).is_ok());
    assert!(is_invalid(&RateLimit::per_second(1_000_001)));
    assert!(is_invalid(&RateLimit::new(
        u64::MAX,
        RateLimit::MAX_INTERVAL
    )));
    // Bursts.
    let limit = RateLimit::per_second(10).unwrap();
    assert_eq!(limit.burst(), 0);
    assert_eq!(limit.max_per_request(), 1);
    assert_eq!(limit.mode(), RateMode::Overall);
    assert_eq!(limit.interval(), Duration::from_secs(1));
    assert_eq!(limit.permits(), 10);
    assert_eq!(
        RateLimit::per_minute(10).unwrap().interval(),
        Duration::from_secs(60)
    );
    // MAX_BURST at a rate whose burst + 1 emission intervals fit in MAX_INTERVAL (10 a second
    // does not: 3 years).
    assert!(is_invalid(&limit.with_burst(RateLimit::MAX_BURST)));
    let max = RateLimit::per_second(1_000)
        .unwrap()
        .with_burst(RateLimit::MAX_BURST)
        .unwrap();
    assert_eq!(RateLimit::MAX_BURST, 1_000_000_000);
    assert_eq!(max.max_per_request(), RateLimit::MAX_BURST + 1);
    assert!(is_invalid(&limit.with_burst(RateLimit::MAX_BURST + 1)));
    assert!(is_invalid(&limit.with_burst(u64::MAX)));
    let per_client = limit.with_burst(4).unwrap().with_mode(RateMode::PerClient);
    assert_eq!(per_client.mode(), RateMode::PerClient);
    assert_eq!(per_client.burst(), 4);
    assert_eq!(per_client.max_per_request(), 5);
}

// ---------------------------------------------------------------------------------------------
// Bad input: an error at once, never a hang.
// ---------------------------------------------------------------------------------------------

/// A client whose connection to Redis is frozen (bytes held in the proxy) and a handle with a
/// limit configured (burst 3): a call that sent anything would wait for the command timeout and
/// fail as `Error::Redis`.
async fn frozen_limiter() -> (RedisServer, FaultProxy, Client, RateLimiter) {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = client(&proxy.url()).await;
    let limit = RateLimit::per_second(10).unwrap().with_burst(3).unwrap();
    let limiter = client.rate_limiter(unique("docs-rl-bad")).with_limit(limit);
    proxy.pause();
    (server, proxy, client, limiter)
}

/// "Bad input is an error at once, never a hang: ... `acquire(0)` ... `Error::InvalidArgument`
/// before anything is sent".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_permits_are_refused_before_anything_is_sent() {
    let _gate = METRICS_GATE.read().await;
    let (_server, proxy, _client, limiter) = frozen_limiter().await;
    within(HANG, "the refusals", async {
        assert!(is_invalid(&limiter.acquire(0).await), "acquire(0)");
        assert!(is_invalid(&limiter.try_acquire(0, Duration::ZERO).await));
        assert!(is_invalid(&limiter.try_admission(0, Duration::MAX).await));
    })
    .await;
    proxy.resume();
    // Nothing was taken: a fresh limiter still admits burst + 1 at once.
    assert!(limiter.try_acquire(4, Duration::ZERO).await.unwrap());
}

/// The same refusal against a live Redis: `Error::InvalidArgument` for burst + 2 and beyond
/// (at the first script call at the latest), and nothing taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_than_burst_plus_one_is_invalid_argument_and_takes_nothing() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limit = RateLimit::per_second(10).unwrap().with_burst(3).unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-bad-live"))
        .with_limit(limit);
    within(HANG, "the refusals", async {
        assert!(is_invalid(&limiter.acquire(5).await), "burst + 2");
        assert!(is_invalid(&limiter.acquire(6).await), "burst + 3");
        assert!(is_invalid(&limiter.acquire(u64::MAX).await), "u64::MAX");
        assert!(is_invalid(&limiter.try_acquire(5, Duration::MAX).await));
        assert!(is_invalid(&limiter.try_admission(5, Duration::ZERO).await));
    })
    .await;
    assert_eq!(limiter.waiting().await.unwrap(), 0);
    assert!(limiter.try_acquire(4, Duration::ZERO).await.unwrap());
}

/// "`burst + 1` is also the most one request may ask for" and "a limiter that was idle admits up
/// to `b + 1` at once"; `available()`: "How many permits one request could take now (at most the
/// burst + 1)"; `waiting()` 0 when nobody sleeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_limiter_admits_burst_plus_one_at_once_and_no_more() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    // One permit every 6 minutes: nothing grows back during the test.
    let limit = RateLimit::new(10, Duration::from_secs(3600))
        .unwrap()
        .with_burst(4)
        .unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-burst"))
        .with_limit(limit);
    assert_eq!(limiter.available().await.unwrap(), 5);
    assert_eq!(limiter.waiting().await.unwrap(), 0);
    let first = limiter.try_admission(3, Duration::ZERO).await.unwrap();
    assert_eq!(first.as_ref().map(RateAdmission::permits), Some(3));
    assert_eq!(limiter.available().await.unwrap(), 2);
    // burst + 1 = 5 were free: 2 are left, a request for 3 is refused at once.
    assert!(!limiter.try_acquire(3, Duration::ZERO).await.unwrap());
    assert!(limiter.try_acquire(2, Duration::ZERO).await.unwrap());
    assert_eq!(limiter.available().await.unwrap(), 0);
    assert!(!limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert_eq!(limiter.waiting().await.unwrap(), 0);
}

/// "A name that is not valid (empty, or longer than MAX_NAME_LEN bytes) is reported by the first
/// operation on the handle as Error::InvalidArgument" (Client's handles); "Bad input is an error
/// at once, never a hang".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_or_over_long_name_is_invalid_argument_on_every_call() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limit = RateLimit::per_second(10).unwrap();
    let long = "x".repeat(lockkit::protocol::keys::MAX_NAME_LEN + 1);
    for name in [String::new(), long] {
        let limiter = client.rate_limiter(name.clone()).with_limit(limit);
        within(HANG, "the refusals", async {
            assert!(is_invalid(&limiter.acquire(1).await), "acquire {name:?}");
            assert!(is_invalid(&limiter.try_acquire(1, Duration::ZERO).await));
            assert!(is_invalid(&limiter.available().await));
            assert!(is_invalid(&limiter.waiting().await));
            assert!(is_invalid(&limiter.limit().await));
            assert!(is_invalid(&limiter.set_limit(limit).await));
            assert!(is_invalid(&limiter.try_set_limit(limit).await));
        })
        .await;
    }
}

/// "A handle with no limit configured meets a limiter without one as `Error::Refused` ("no limit
/// is set")"; `available()`: "Error::Refused when no limit is stored or configured"; `limit()`:
/// "None: none is stored".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limiter_without_any_limit_refuses_rather_than_admits() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limiter = client.rate_limiter(unique("docs-rl-nolimit"));
    assert_eq!(limiter.configured_limit(), None);
    assert_eq!(limiter.limit().await.unwrap(), None);
    for result in [
        limiter.acquire(1).await.map(|_| ()),
        limiter.try_acquire(1, Duration::ZERO).await.map(|_| ()),
        limiter.try_admission(1, Duration::MAX).await.map(|_| ()),
        limiter.available().await.map(|_| ()),
    ] {
        match result {
            Err(Error::Refused { ref reason, .. }) => {
                assert!(reason.contains("no limit"), "reason: {reason}")
            }
            other => panic!("expected Refused (no limit is set), got {other:?}"),
        }
    }
    assert_eq!(limiter.waiting().await.unwrap(), 0);
}

/// `limit()`, `set_limit`, `available()`, `waiting()`, `acquire`: "Error::WrongType when the key
/// holds something else" — a STRING at the limiter's key (and at its waiting set's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_string_at_the_limiters_key_is_wrong_type_for_every_call() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let name = unique("docs-rl-wrongtype");
    cmd(&server, &["SET", &limiter_key(&name), "not a rate limiter"]).await;
    let limit = RateLimit::per_second(10).unwrap();
    let limiter = client.rate_limiter(&name).with_limit(limit);
    let wrong = |what: &str, result: Result<(), Error>| match result {
        Err(Error::WrongType { .. }) => {}
        other => panic!("{what}: expected WrongType, got {other:?}"),
    };
    wrong("acquire", limiter.acquire(1).await.map(|_| ()));
    wrong(
        "try_acquire",
        limiter.try_acquire(1, Duration::ZERO).await.map(|_| ()),
    );
    wrong("limit", limiter.limit().await.map(|_| ()));
    wrong("set_limit", limiter.set_limit(limit).await);
    wrong(
        "try_set_limit",
        limiter.try_set_limit(limit).await.map(|_| ()),
    );
    wrong("available", limiter.available().await.map(|_| ()));
    // The key is left as it was.
    let value = server.command(&["GET", &limiter_key(&name)]).await.unwrap();
    assert_eq!(value.as_str(), Some("not a rate limiter"));

    // The waiting set's key (`ratelimiter.waiting:{n}`, design.md) holding a STRING.
    let other = unique("docs-rl-wrongtype-waiting");
    cmd(
        &server,
        &[
            "SET",
            &format!("lockkit:ratelimiter.waiting:{{{other}}}"),
            "x",
        ],
    )
    .await;
    let limiter = client.rate_limiter(&other).with_limit(limit);
    wrong("waiting", limiter.waiting().await.map(|_| ()));
}

/// "`acquire(0)`, and a request for more than the burst + 1 ... (or, against a stored limit that
/// differs from the handle's, at the first script call)"; rustdoc of `acquire`: "more than the
/// stored limit admits at once (max_per_request; the stored limit decides, this client's
/// configured one only when none is stored)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stored_limit_not_the_handles_decides_the_most_per_request() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let hour = Duration::from_secs(3600);
    let wide = RateLimit::new(10, hour).unwrap().with_burst(4).unwrap();
    let narrow = RateLimit::new(10, hour).unwrap();

    // Stored: burst 4. The handle of b says burst 0: 3 at once is still admitted.
    let name = unique("docs-rl-stored-decides");
    a.rate_limiter(&name).set_limit(wide).await.unwrap();
    let b_handle = b.rate_limiter(&name).with_limit(narrow);
    let admitted = b_handle.try_admission(3, Duration::ZERO).await;
    assert!(
        matches!(admitted, Ok(Some(ref adm)) if adm.permits() == 3),
        "the stored burst 4 admits 3 at once: {admitted:?}"
    );
    assert_eq!(b_handle.limit().await.unwrap(), Some(wide));

    // Stored: burst 0. The handle of b says burst 4: 3 at once is InvalidArgument, nothing taken.
    let name = unique("docs-rl-stored-decides");
    a.rate_limiter(&name).set_limit(narrow).await.unwrap();
    let b_handle = b.rate_limiter(&name).with_limit(wide);
    assert!(is_invalid(&b_handle.acquire(3).await));
    assert!(is_invalid(&b_handle.try_acquire(3, Duration::ZERO).await));
    assert_eq!(b_handle.available().await.unwrap(), 1);
    assert!(b_handle.try_acquire(1, Duration::ZERO).await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// try_acquire's bounds.
// ---------------------------------------------------------------------------------------------

/// "`try_acquire(k, wait)` ... returns `false` **at once** when they cannot: the server knows when
/// they could, so it never waits in vain (`wait = Duration::ZERO`: only permits free now)". The
/// next permit is an hour away and the waits are 59 minutes and longer than a day's worth of
/// `Duration`: a call that waited in vain would meet the hang guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_is_false_at_once_when_the_wait_cannot_be_met() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limit = RateLimit::new(1, Duration::from_secs(3600)).unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-false"))
        .with_limit(limit);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    within(HANG, "false at once", async {
        assert!(!limiter.try_acquire(1, Duration::ZERO).await.unwrap());
        assert!(!limiter
            .try_acquire(1, Duration::from_millis(1))
            .await
            .unwrap());
        assert!(!limiter
            .try_acquire(1, Duration::from_secs(59 * 60))
            .await
            .unwrap());
        assert!(limiter
            .try_admission(1, Duration::from_secs(3500))
            .await
            .unwrap()
            .is_none());
    })
    .await;
    // Refusals change nothing: nobody waits, and nothing more is available.
    assert_eq!(limiter.waiting().await.unwrap(), 0);
    assert_eq!(limiter.available().await.unwrap(), 0);
}

/// "Returns within wait plus at most one round trip" (rustdoc of `try_acquire`); the guide's
/// bounds table: "`wait`, plus at most one round trip for a try in flight then (1 s, or the
/// command timeout if shorter)", `Err(Redis(err))`, `err.is_timeout()`, naming the method. Redis
/// frozen (a black hole) for the whole call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_against_a_frozen_redis_returns_within_wait_plus_one_round_trip() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = client(&proxy.url()).await;
    let name = unique("docs-rl-frozen");
    let limiter = client
        .rate_limiter(&name)
        .with_limit(RateLimit::per_second(10).unwrap());
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    for wait in [Duration::ZERO, Duration::from_millis(1500)] {
        proxy.pause();
        let started = Instant::now();
        let result = within(HANG, "the frozen try", limiter.try_acquire(1, wait)).await;
        let took = started.elapsed();
        proxy.resume();
        match result {
            Err(Error::Redis(ref err)) => {
                assert!(err.is_timeout(), "not a timeout: {err}");
                let text = result.as_ref().unwrap_err().to_string();
                assert!(text.contains("try_acquire"), "{text}");
            }
            other => panic!("expected a Redis timeout, got {other:?}"),
        }
        // The documented bound: wait + one round trip (1 s); 250 ms for the scheduler.
        let bound = wait + Duration::from_secs(1) + Duration::from_millis(250);
        assert!(took <= bound, "took {took:?}, bound {bound:?}");
    }
}

/// The guide's errors: "A `Redis` error names the method that was called ..., and the object";
/// `err.object()`: "the object"; the bounds table's own rate limiter line: ``redis error during
/// acquire of `exports`: no answer from Redis within 1.0s (the command timeout is 1s)``.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiters_redis_error_names_the_object() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let client = lockkit::Client::builder()
        .url(proxy.url())
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let name = unique("docs-rl-named");
    let limiter = client
        .rate_limiter(&name)
        .with_limit(RateLimit::per_second(10).unwrap());
    proxy.pause();
    let tried = within(HANG, "try_acquire", limiter.try_acquire(1, Duration::ZERO)).await;
    let acquired = within(HANG, "acquire", limiter.acquire(1))
        .await
        .map(|_| ());
    let available = within(HANG, "available", limiter.available()).await;
    proxy.resume();
    for (what, result) in [
        ("try_acquire", tried.map(|_| ())),
        ("acquire", acquired),
        ("available", available.map(|_| ())),
    ] {
        match result {
            Err(Error::Redis(ref err)) => {
                let text = result.as_ref().unwrap_err().to_string();
                assert!(
                    text.contains(&format!("during {what} of `{name}`")),
                    "{what}: {text}"
                );
                assert_eq!(err.object(), Some(name.as_str()), "{what}: {text}");
            }
            other => panic!("{what}: expected a Redis error, got {other:?}"),
        }
    }
}

/// Design: "Its sleep uses the delay the server computed, from the moment the reply arrives, so
/// the caller never proceeds before its server-side moment"; permits "spread evenly: one every
/// `interval / n`". A reserved `try_admission` and `acquire` return at or after their
/// `admitted_at` on the server's clock, and the moments are `interval / n` apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_call_never_returns_before_its_admitted_moment() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    // One every 400 ms.
    let limit = RateLimit::new(5, Duration::from_secs(2)).unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-moment"))
        .with_limit(limit);
    let first = limiter.acquire(1).await.unwrap();
    let second = limiter
        .try_admission(1, Duration::from_secs(1))
        .await
        .unwrap()
        .expect("the next permit is 400 ms away, within the wait of 1 s");
    let after_second = server_now(&server).await;
    let third = limiter.acquire(1).await.unwrap();
    let after_third = server_now(&server).await;
    let gap = |a: &RateAdmission, b: &RateAdmission| {
        b.admitted_at().duration_since(a.admitted_at()).unwrap()
    };
    // TIME is read in whole ms here: allow the truncation.
    let ms = Duration::from_millis(1);
    assert!(after_second + ms >= second.admitted_at());
    assert!(after_third + ms >= third.admitted_at());
    assert!(gap(&first, &second) >= Duration::from_millis(400));
    assert!(gap(&second, &third) >= Duration::from_millis(400));
}

// ---------------------------------------------------------------------------------------------
// Exactness: every window of one interval, server clock, several clients.
// ---------------------------------------------------------------------------------------------

/// Runs `tasks` callers per limiter until their admissions pass `until` (server clock),
/// each asking for 1..=max permits in turn, alternating `acquire` and `try_admission` with a
/// short wait; returns every admission.
async fn hammer(
    limiters: &[RateLimiter],
    tasks: usize,
    max: u64,
    until: SystemTime,
    on_admission: Arc<dyn Fn(SystemTime) + Send + Sync>,
) -> Vec<(SystemTime, u64, usize)> {
    let mut handles = Vec::new();
    for (which, limiter) in limiters.iter().enumerate() {
        for task in 0..tasks {
            let limiter = limiter.clone();
            let on_admission = on_admission.clone();
            handles.push(tokio::spawn(async move {
                let mut seen = Vec::new();
                let mut round = task as u64;
                loop {
                    round += 1;
                    let k = 1 + round % max;
                    let admission = if round.is_multiple_of(3) {
                        match limiter
                            .try_admission(k, Duration::from_millis(30))
                            .await
                            .unwrap()
                        {
                            Some(admission) => admission,
                            None => continue,
                        }
                    } else {
                        limiter.acquire(k).await.unwrap()
                    };
                    let at = admission.admitted_at();
                    seen.push((at, admission.permits(), which));
                    on_admission(at);
                    if at >= until {
                        return seen;
                    }
                }
            }));
        }
    }
    let mut all = Vec::new();
    for handle in handles {
        all.extend(within(HANG, "the callers", handle).await.unwrap());
    }
    all
}

/// "in every window of one `interval`, on the server's clock, at most `n + b` permits are
/// admitted — every window, not only the ones that start at a round second"; `RateMode::Overall`
/// "counts every client together". Three clients, four callers each, over more than three
/// intervals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_window_admits_at_most_n_plus_burst_across_clients() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let interval = Duration::from_millis(500);
    let limit = RateLimit::new(20, interval).unwrap().with_burst(5).unwrap();
    let name = unique("docs-rl-exact");
    let mut clients = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..3 {
        let c = client(&server.url()).await;
        limiters.push(c.rate_limiter(&name).with_limit(limit));
        clients.push(c);
    }
    let until = server_now(&server).await + interval * 3 + interval / 2;
    let admitted = hammer(&limiters, 4, 6, until, Arc::new(|_| {})).await;
    let pairs: Vec<_> = admitted.iter().map(|&(at, k, _)| (at, k)).collect();
    assert_no_window_over(&pairs, interval, 25);
    // The limit was used, not starved: some window saw more than the bare rate.
    let (busiest, _) = busiest_window(&pairs, interval);
    assert!(busiest > 20, "busiest window {busiest}");
}

/// `RateMode::PerClient`: "gives each `Client` (each pod) `n` per interval of its own"; each
/// client's admissions stay within `n + b` in every window, while all together exceed it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_mode_bounds_each_client_on_its_own() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let interval = Duration::from_millis(500);
    let limit = RateLimit::new(10, interval)
        .unwrap()
        .with_burst(2)
        .unwrap()
        .with_mode(RateMode::PerClient);
    let name = unique("docs-rl-perclient");
    let mut clients = Vec::new();
    let mut limiters = Vec::new();
    for _ in 0..3 {
        let c = client(&server.url()).await;
        limiters.push(c.rate_limiter(&name).with_limit(limit));
        clients.push(c);
    }
    let until = server_now(&server).await + interval * 3;
    let admitted = hammer(&limiters, 3, 3, until, Arc::new(|_| {})).await;
    for which in 0..3 {
        let mine: Vec<_> = admitted
            .iter()
            .filter(|a| a.2 == which)
            .map(|&(at, k, _)| (at, k))
            .collect();
        assert_no_window_over(&mine, interval, 12);
    }
    let all: Vec<_> = admitted.iter().map(|&(at, k, _)| (at, k)).collect();
    let (busiest, _) = busiest_window(&all, interval);
    assert!(busiest > 12, "three clients together: {busiest}");
}

/// `RateMode::PerClient`: "each `Client` (each pod) its own n"; `available()`: "In the per-client
/// mode, what this client could take". Two handles of one client share that client's schedule.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_schedules_are_per_client_not_per_handle() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let name = unique("docs-rl-perclient-handles");
    let limit = RateLimit::new(10, Duration::from_secs(3600))
        .unwrap()
        .with_burst(1)
        .unwrap()
        .with_mode(RateMode::PerClient);
    let a1 = a.rate_limiter(&name).with_limit(limit);
    let a2 = a.rate_limiter(&name).with_limit(limit);
    let b1 = b.rate_limiter(&name).with_limit(limit);
    assert!(a1.try_acquire(2, Duration::ZERO).await.unwrap());
    assert_eq!(a1.available().await.unwrap(), 0);
    assert_eq!(a2.available().await.unwrap(), 0);
    assert!(!a2.try_acquire(1, Duration::ZERO).await.unwrap());
    assert_eq!(b1.available().await.unwrap(), 2);
    assert!(b1.try_acquire(2, Duration::ZERO).await.unwrap());
    // Overall mode, same setup: the second client finds nothing left.
    let overall = RateLimit::new(10, Duration::from_secs(3600))
        .unwrap()
        .with_burst(1)
        .unwrap();
    let name = unique("docs-rl-overall-handles");
    assert!(a
        .rate_limiter(&name)
        .with_limit(overall)
        .try_acquire(2, Duration::ZERO)
        .await
        .unwrap());
    let b_overall = b.rate_limiter(&name).with_limit(overall);
    assert_eq!(b_overall.available().await.unwrap(), 0);
    assert!(!b_overall.try_acquire(1, Duration::ZERO).await.unwrap());
}

// ---------------------------------------------------------------------------------------------
// Order.
// ---------------------------------------------------------------------------------------------

/// "Callers are served in the order their requests reached Redis": three callers of two clients
/// whose reservations are placed one after the other are admitted in that order, `interval / n`
/// apart; a big request is not overtaken by a smaller one behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_are_admitted_in_the_order_their_requests_reached_redis() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let name = unique("docs-rl-order");
    // One every 300 ms; three reservations reach 900 ms ahead, within the interval.
    let limit = RateLimit::new(4, Duration::from_millis(1200)).unwrap();
    let la = a.rate_limiter(&name).with_limit(limit);
    let lb = b.rate_limiter(&name).with_limit(limit);
    let first = la.acquire(1).await.unwrap();
    let mut tasks = Vec::new();
    for (i, limiter) in [&lb, &la, &lb].into_iter().enumerate() {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move { limiter.acquire(1).await }));
        until_reserved(&la, i as u64 + 1).await;
    }
    let mut moments = vec![first.admitted_at()];
    for task in tasks {
        moments.push(
            within(HANG, "a caller", task)
                .await
                .unwrap()
                .unwrap()
                .admitted_at(),
        );
    }
    for pair in moments.windows(2) {
        let gap = pair[1].duration_since(pair[0]);
        assert!(
            matches!(gap, Ok(gap) if gap >= Duration::from_millis(300)),
            "out of order or too close: {moments:?}"
        );
    }

    // A request for burst + 1 placed first is not overtaken by a request for 1 placed after.
    let name = unique("docs-rl-order-big");
    let limit = RateLimit::new(4, Duration::from_secs(2))
        .unwrap()
        .with_burst(3)
        .unwrap();
    let la = a.rate_limiter(&name).with_limit(limit);
    let lb = b.rate_limiter(&name).with_limit(limit);
    assert!(la.try_acquire(4, Duration::ZERO).await.unwrap());
    let big = {
        let la = la.clone();
        tokio::spawn(async move { la.acquire(4).await })
    };
    until_reserved(&la, 1).await;
    let small = lb.acquire(1).await.unwrap();
    let big = within(HANG, "the big request", big).await.unwrap().unwrap();
    assert!(
        small.admitted_at() >= big.admitted_at(),
        "the small request overtook the big one: {:?} < {:?}",
        small.admitted_at(),
        big.admitted_at()
    );
}

// ---------------------------------------------------------------------------------------------
// give_back.
// ---------------------------------------------------------------------------------------------

/// "`admission.give_back()` returns the permits of a request that turned out not to need them,
/// and says whether it did. That is sound only for the **last** request of the schedule ... once
/// another request came, `give_back()` returns `false` and the permits stay spent".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_back_is_true_for_the_last_request_only() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let limit = RateLimit::new(10, Duration::from_secs(3600))
        .unwrap()
        .with_burst(2)
        .unwrap();

    // The last request: given back, available again.
    let name = unique("docs-rl-giveback");
    let la = a.rate_limiter(&name).with_limit(limit);
    let lb = b.rate_limiter(&name).with_limit(limit);
    let adm = la.try_admission(2, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(la.available().await.unwrap(), 1);
    assert!(adm.give_back().await.unwrap(), "the last request goes back");
    assert_eq!(lb.available().await.unwrap(), 3);
    assert!(lb.try_acquire(3, Duration::ZERO).await.unwrap());

    // Another request came (of another client): false, and the permits stay spent.
    let name = unique("docs-rl-giveback-late");
    let la = a.rate_limiter(&name).with_limit(limit);
    let lb = b.rate_limiter(&name).with_limit(limit);
    let early = la.try_admission(1, Duration::ZERO).await.unwrap().unwrap();
    let late = lb.try_admission(1, Duration::ZERO).await.unwrap().unwrap();
    assert!(!early.give_back().await.unwrap(), "an earlier request");
    assert_eq!(la.available().await.unwrap(), 1);
    // The later one is the last: it goes back. Then the earlier one's turn never comes again.
    assert!(late.give_back().await.unwrap());
    assert_eq!(la.available().await.unwrap(), 2);

    // "Twice": give back the last, then the one before it, which had a request after it.
    let name = unique("docs-rl-giveback-twice");
    let la = a.rate_limiter(&name).with_limit(limit);
    let one = la.try_admission(1, Duration::ZERO).await.unwrap().unwrap();
    let two = la.try_admission(1, Duration::ZERO).await.unwrap().unwrap();
    assert!(two.give_back().await.unwrap());
    assert!(
        !one.give_back().await.unwrap(),
        "another request came after it (since given back)"
    );
    assert_eq!(la.available().await.unwrap(), 2);

    // A refused try is no request: the admission before it is still the last.
    let name = unique("docs-rl-giveback-refused");
    let la = a.rate_limiter(&name).with_limit(limit);
    let all = la.try_admission(3, Duration::ZERO).await.unwrap().unwrap();
    assert!(!la.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(all.give_back().await.unwrap());
    assert_eq!(la.available().await.unwrap(), 3);
}

/// Per-client mode: give_back is "sound only for the last request of the schedule", and each
/// client has "a schedule of its own": another client's request does not stop it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_client_give_back_is_judged_on_the_clients_own_schedule() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let limit = RateLimit::new(10, Duration::from_secs(3600))
        .unwrap()
        .with_burst(2)
        .unwrap()
        .with_mode(RateMode::PerClient);
    let name = unique("docs-rl-giveback-perclient");
    let la = a.rate_limiter(&name).with_limit(limit);
    let lb = b.rate_limiter(&name).with_limit(limit);
    let mine = la.try_admission(2, Duration::ZERO).await.unwrap().unwrap();
    assert!(lb.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(mine.give_back().await.unwrap());
    assert_eq!(la.available().await.unwrap(), 3);
    assert_eq!(lb.available().await.unwrap(), 2);
}

/// "Dropping it does nothing: the permits were used" (rustdoc of `RateAdmission`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_an_admission_gives_nothing_back() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limit = RateLimit::new(10, Duration::from_secs(3600))
        .unwrap()
        .with_burst(2)
        .unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-drop-admission"))
        .with_limit(limit);
    drop(
        limiter
            .try_admission(2, Duration::ZERO)
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(limiter.available().await.unwrap(), 1);
}

// ---------------------------------------------------------------------------------------------
// Cancel safety and shutdown.
// ---------------------------------------------------------------------------------------------

/// A limiter with one permit every 2 s whose first permit is taken now: the next moment is
/// `first + 2 s`, the one after `first + 4 s`.
async fn two_second_limiter(client: &Client, name: &str) -> (RateLimiter, SystemTime) {
    let limit = RateLimit::new(1, Duration::from_secs(2)).unwrap();
    let limiter = client.rate_limiter(name).with_limit(limit);
    let first = limiter.acquire(1).await.unwrap();
    (limiter, first.admitted_at())
}

/// The next admission of `limiter` must take the slot at `first + 2 s` (given back), not the one
/// at `first + 4 s`.
async fn assert_next_slot_was_given_back(limiter: &RateLimiter, first: SystemTime, what: &str) {
    let next = within(HANG, "the next admission", limiter.acquire(1))
        .await
        .unwrap();
    let offset = next.admitted_at().duration_since(first).unwrap();
    assert!(
        offset < Duration::from_secs(3),
        "{what}: the reservation was not given back (next admitted {offset:?} after the first)"
    );
}

/// "Dropping an `acquire` future (a `select!` branch that lost, a request cancelled) leaves
/// nothing taken where that is sound: its reservation is given back in the background when no
/// later request was placed after it" — dropped in a `select!`, and by aborting its task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_or_aborted_acquire_gives_its_reservation_back() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;

    // select!: the other branch wins once the reservation is placed.
    let name = unique("docs-rl-cancel-select");
    let (limiter, first) = two_second_limiter(&a, &name).await;
    let observer = b
        .rate_limiter(&name)
        .with_limit(RateLimit::new(1, Duration::from_secs(2)).unwrap());
    tokio::select! {
        result = limiter.acquire(1) => panic!("admitted before its moment: {result:?}"),
        () = until_reserved(&observer, 1) => {}
    }
    until_reserved(&observer, 0).await;
    assert_next_slot_was_given_back(&observer, first, "select!").await;

    // abort(): the task sleeping on its reservation is cancelled.
    let name = unique("docs-rl-cancel-abort");
    let (limiter, first) = two_second_limiter(&a, &name).await;
    let observer = b
        .rate_limiter(&name)
        .with_limit(RateLimit::new(1, Duration::from_secs(2)).unwrap());
    let task = tokio::spawn(async move { limiter.acquire(1).await });
    until_reserved(&observer, 1).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    until_reserved(&observer, 0).await;
    assert_next_slot_was_given_back(&observer, first, "abort").await;
}

/// "Dropping an `acquire` future ... leaves nothing taken": a future never polled sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_future_dropped_before_its_first_poll_takes_nothing() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limit = RateLimit::new(10, Duration::from_secs(3600))
        .unwrap()
        .with_burst(2)
        .unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-unpolled"))
        .with_limit(limit);
    drop(limiter.acquire(3));
    drop(limiter.try_acquire(3, Duration::ZERO));
    assert_eq!(limiter.limit().await.unwrap(), None, "nothing was sent");
    assert_eq!(limiter.available().await.unwrap(), 3);
}

/// "a reservation with later ones behind it stays spent" (and the limiter stays exact): after
/// the first of two reservations is dropped, a new request comes after the second, not in the
/// dropped one's slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_reservation_with_a_later_one_behind_it_stays_spent() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let name = unique("docs-rl-cancel-behind");
    // One every 300 ms; reservations up to 900 ms ahead fit in the interval.
    let limit = RateLimit::new(4, Duration::from_millis(1200)).unwrap();
    let la = a.rate_limiter(&name).with_limit(limit);
    let lb = b.rate_limiter(&name).with_limit(limit);
    la.acquire(1).await.unwrap();
    let dropped = {
        let la = la.clone();
        tokio::spawn(async move { la.acquire(1).await })
    };
    until_reserved(&lb, 1).await;
    let behind = {
        let lb = lb.clone();
        tokio::spawn(async move { lb.acquire(1).await })
    };
    until_reserved(&lb, 2).await;
    dropped.abort();
    let _ = dropped.await;
    let behind = within(HANG, "the later reservation", behind)
        .await
        .unwrap()
        .unwrap();
    let next = lb.acquire(1).await.unwrap();
    let gap = next.admitted_at().duration_since(behind.admitted_at());
    assert!(
        matches!(gap, Ok(gap) if gap >= Duration::from_millis(300)),
        "the dropped slot was reused: {:?} vs {:?}",
        next.admitted_at(),
        behind.admitted_at()
    );
}

/// "`Client::shutdown` wakes sleeping callers with `Error::Shutdown`, giving their reservations
/// back first"; "Later calls on this client ... return Error::Shutdown".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_wakes_a_sleeping_caller_and_gives_its_reservation_back() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let name = unique("docs-rl-shutdown");
    let (limiter, first) = two_second_limiter(&a, &name).await;
    let observer = b
        .rate_limiter(&name)
        .with_limit(RateLimit::new(1, Duration::from_secs(2)).unwrap());
    let sleeping = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    until_reserved(&observer, 1).await;
    within(HANG, "shutdown", a.shutdown()).await.unwrap();
    let woken = within(HANG, "the sleeping caller", sleeping).await.unwrap();
    assert!(matches!(woken, Err(Error::Shutdown)), "{woken:?}");
    // "giving their reservations back first": gone by the time the caller returned.
    assert_eq!(observer.waiting().await.unwrap(), 0);
    assert!(matches!(limiter.acquire(1).await, Err(Error::Shutdown)));
    assert!(matches!(
        limiter.try_acquire(1, Duration::ZERO).await,
        Err(Error::Shutdown)
    ));
    assert_next_slot_was_given_back(&observer, first, "shutdown").await;
}

// ---------------------------------------------------------------------------------------------
// Limits: with_limit, set_limit, try_set_limit, limit().
// ---------------------------------------------------------------------------------------------

/// "`with_limit(limit)` configures it on the handle and sends nothing: the next request stores it
/// if no limit is stored"; "A limit already stored is kept"; `available()`: "A limit configured
/// in this client but not stored yet counts as stored".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_limit_sends_nothing_and_the_next_request_stores_it_unless_one_is_stored() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let mine = RateLimit::per_minute(60).unwrap().with_burst(9).unwrap();
    let name = unique("docs-rl-withlimit");
    let la = a.rate_limiter(&name).with_limit(mine);
    assert_eq!(la.configured_limit(), Some(mine));
    assert_eq!(la.limit().await.unwrap(), None);
    assert_eq!(la.available().await.unwrap(), 10);
    assert_eq!(
        la.limit().await.unwrap(),
        None,
        "available() stores nothing"
    );
    la.acquire(1).await.unwrap();
    assert_eq!(la.limit().await.unwrap(), Some(mine));

    // A stored limit is kept: b's handle configures another, and its request does not replace it.
    let theirs = RateLimit::per_second(5).unwrap();
    let lb = b.rate_limiter(&name).with_limit(theirs);
    lb.acquire(1).await.unwrap();
    assert_eq!(lb.limit().await.unwrap(), Some(mine));
    assert_eq!(lb.configured_limit(), Some(theirs));
}

/// "`set_limit(limit)` stores a limit in place of any stored one"; "`try_set_limit(limit)` stores
/// it only when none is stored and says whether it did; both also configure it on the handle";
/// "`limit()` reads the stored one".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_limit_replaces_and_try_set_limit_stores_only_when_none_is_stored() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let name = unique("docs-rl-setlimit");
    let limiter = client.rate_limiter(&name);
    let one = RateLimit::per_second(100).unwrap();
    let two = RateLimit::new(10_000, Duration::from_secs(86_400))
        .unwrap()
        .with_burst(49)
        .unwrap()
        .with_mode(RateMode::PerClient);
    assert!(limiter.try_set_limit(one).await.unwrap());
    assert_eq!(limiter.limit().await.unwrap(), Some(one));
    assert_eq!(limiter.configured_limit(), Some(one));
    assert!(!limiter.try_set_limit(two).await.unwrap());
    assert_eq!(limiter.limit().await.unwrap(), Some(one));
    assert_eq!(
        limiter.configured_limit(),
        Some(two),
        "try_set_limit configures its limit in this client either way"
    );
    limiter.set_limit(two).await.unwrap();
    assert_eq!(limiter.limit().await.unwrap(), Some(two));
    limiter.set_limit(one).await.unwrap();
    assert_eq!(limiter.limit().await.unwrap(), Some(one));
    // The extremes are stored and read back exactly.
    let extreme = RateLimit::new(RateLimit::MAX_BURST + 1, RateLimit::MAX_INTERVAL)
        .unwrap()
        .with_burst(RateLimit::MAX_BURST)
        .unwrap();
    limiter.set_limit(extreme).await.unwrap();
    assert_eq!(limiter.limit().await.unwrap(), Some(extreme));
    let fast = RateLimit::new(1000, Duration::from_millis(1)).unwrap();
    limiter.set_limit(fast).await.unwrap();
    assert_eq!(limiter.limit().await.unwrap(), Some(fast));
}

/// "`try_set_limit` ... Every pod may call this at start-up: only the first one stores the
/// limit": two pods racing with different limits, exactly one `true`, and the stored limit is
/// the winner's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_racing_try_set_limit_exactly_one_stores() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let la_limit = RateLimit::per_second(10).unwrap();
    let lb_limit = RateLimit::per_minute(10).unwrap().with_burst(2).unwrap();
    for _ in 0..20 {
        let name = unique("docs-rl-race");
        let la = a.rate_limiter(&name);
        let lb = b.rate_limiter(&name);
        let (ra, rb) = tokio::join!(la.try_set_limit(la_limit), lb.try_set_limit(lb_limit));
        let (ra, rb) = (ra.unwrap(), rb.unwrap());
        assert!(ra ^ rb, "exactly one stores: {ra} {rb}");
        let stored = la.limit().await.unwrap();
        assert_eq!(stored, Some(if ra { la_limit } else { lb_limit }));
    }
}

/// "`set_limit` ... Permits already admitted or reserved keep their moments; the new limit
/// applies from the next request on": a caller sleeping on its reservation is admitted (not
/// refused, not woken early) when the limit changes, and the new limit's burst governs the next
/// request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_limit_keeps_reservations_and_applies_from_the_next_request() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let name = unique("docs-rl-setlimit-reserved");
    let slow = RateLimit::new(1, Duration::from_secs(2)).unwrap();
    let la = a.rate_limiter(&name).with_limit(slow);
    let first = la.acquire(1).await.unwrap();
    let sleeping = {
        let la = la.clone();
        tokio::spawn(async move { la.acquire(1).await })
    };
    until_reserved(&la, 1).await;
    let fast = RateLimit::new(100, Duration::from_secs(2))
        .unwrap()
        .with_burst(9)
        .unwrap();
    let lb = b.rate_limiter(&name);
    lb.set_limit(fast).await.unwrap();
    assert_eq!(lb.configured_limit(), Some(fast));
    let reserved = within(HANG, "the reserved caller", sleeping)
        .await
        .unwrap()
        .unwrap();
    let offset = reserved
        .admitted_at()
        .duration_since(first.admitted_at())
        .unwrap();
    assert!(
        offset >= Duration::from_secs(2),
        "the reservation kept its moment: {offset:?}"
    );
    // From the next request on: up to 10 per request (burst 9), from b's handle (set_limit
    // configured it) and from a's (the stored limit decides).
    assert!(lb.acquire(10).await.is_ok());
    assert!(la.acquire(10).await.is_ok());
    assert!(is_invalid(&lb.acquire(11).await));
}

// ---------------------------------------------------------------------------------------------
// Data loss.
// ---------------------------------------------------------------------------------------------

/// "The limit comes back from the handle: a handle configured with `with_limit` (or `set_limit` /
/// `try_set_limit` in this client) stores it again at its next request"; `try_set_limit`
/// "Configures limit in this client either way". FLUSHALL, and an empty restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_data_loss_the_next_request_stores_the_handles_limit_again() {
    let _gate = METRICS_GATE.read().await;
    let mut server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let stored = RateLimit::per_second(50).unwrap();
    let other = RateLimit::per_minute(7).unwrap().with_burst(1).unwrap();

    let by_with = unique("docs-rl-loss-with");
    let by_set = unique("docs-rl-loss-set");
    let by_try = unique("docs-rl-loss-try");
    let lw = a.rate_limiter(&by_with).with_limit(stored);
    lw.acquire(1).await.unwrap();
    let ls = a.rate_limiter(&by_set);
    ls.set_limit(stored).await.unwrap();
    b.rate_limiter(&by_try).set_limit(stored).await.unwrap();
    let lt = a.rate_limiter(&by_try);
    assert!(!lt.try_set_limit(other).await.unwrap());
    let nothing = b.rate_limiter(&by_with); // no limit configured in b

    for round in ["FLUSHALL", "restart empty"] {
        if round == "FLUSHALL" {
            cmd(&server, &["FLUSHALL"]).await;
        } else {
            server.restart_empty().await.unwrap();
        }
        assert_eq!(nothing.limit().await.unwrap(), None, "{round}: lost");
        match nothing.acquire(1).await {
            Err(Error::Refused { .. }) => {}
            other => panic!("{round}: a handle without a limit: {other:?}"),
        }
        within(HANG, "the requests after the loss", async {
            lw.acquire(1).await.unwrap();
            ls.acquire(1).await.unwrap();
            lt.acquire(1).await.unwrap();
        })
        .await;
        assert_eq!(
            lw.limit().await.unwrap(),
            Some(stored),
            "{round}: with_limit"
        );
        assert_eq!(
            ls.limit().await.unwrap(),
            Some(stored),
            "{round}: set_limit"
        );
        assert_eq!(
            lt.limit().await.unwrap(),
            Some(other),
            "{round}: try_set_limit's limit, configured though it returned false"
        );
    }
}

/// "The schedule starts afresh, so the loss can over-admit what was already reserved before it —
/// and reservations reach at most one interval ahead, so that is **at most one window's worth**":
/// callers of two clients keep the limiter busy across a FLUSHALL; no window sees more than
/// twice `n + b`, and windows that do not reach back before the loss stay within `n + b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_over_admits_at_most_one_window() {
    let _gate = METRICS_GATE.read().await;
    let server = Arc::new(spawned().await);
    let interval = Duration::from_millis(500);
    let limit = RateLimit::new(10, interval).unwrap().with_burst(2).unwrap();
    let name = unique("docs-rl-loss-window");
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    let limiters = [
        a.rate_limiter(&name).with_limit(limit),
        b.rate_limiter(&name).with_limit(limit),
    ];
    let start = server_now(&server).await;
    let flush_at = start + interval * 2;
    let until = start + interval * 5;
    // The flush is triggered by the first admission past `flush_at` (an event, not a sleep).
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let tx = Mutex::new(Some(tx));
    let trigger: Arc<dyn Fn(SystemTime) + Send + Sync> = Arc::new(move |at| {
        if at >= flush_at {
            if let Some(tx) = tx.lock().unwrap().take() {
                let _ = tx.send(());
            }
        }
    });
    let flusher = {
        let server = server.clone();
        tokio::spawn(async move {
            if rx.await.is_ok() {
                let moment = server_now(&server).await;
                cmd(&server, &["FLUSHALL"]).await;
                Some(moment)
            } else {
                None
            }
        })
    };
    let admitted = hammer(&limiters, 4, 3, until, trigger).await;
    let flushed = within(HANG, "the flush", flusher)
        .await
        .unwrap()
        .expect("the flush ran");
    let pairs: Vec<_> = admitted.iter().map(|&(at, k, _)| (at, k)).collect();
    assert_no_window_over(&pairs, interval, 2 * 12);
    // Well after the loss (one interval for the old reservations to run out), exact again.
    let after: Vec<_> = pairs
        .iter()
        .copied()
        .filter(|&(at, _)| at >= flushed + interval + Duration::from_millis(2))
        .collect();
    assert_no_window_over(&after, interval, 12);
    let before: Vec<_> = pairs
        .iter()
        .copied()
        .filter(|&(at, _)| at < flushed)
        .collect();
    assert_no_window_over(&before, interval, 12);
    assert_eq!(limiters[0].limit().await.unwrap(), Some(limit));
}

/// "However far ahead the moment is, the caller asks nothing more while it sleeps";
/// `Inspection::waiters`: "its reservations still to come ... each as `<client id> in <n>ms`".
/// With 12 callers queued four intervals deep, every one is reserved at once (`waiting()` and the
/// listing reach 11), every listed one is `<client id> in <n>ms`, and every caller is admitted in
/// the end. (Written first against "a moment more than one interval ahead is not reserved", which
/// the library no longer does: those callers polled.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_reach_any_distance_ahead() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let observer = client(&server.url()).await;
    let interval = Duration::from_millis(600);
    // One every 200 ms: 12 callers queue 2.4 s deep, four intervals.
    let limit = RateLimit::new(3, interval).unwrap();
    let name = unique("docs-rl-horizon");
    let limiter = a.rate_limiter(&name).with_limit(limit);
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let limiter = limiter.clone();
            tokio::spawn(async move { limiter.acquire(1).await })
        })
        .collect();
    let mut checked = 0;
    let mut most = 0;
    let mut all_done = false;
    while !all_done {
        let found = observer
            .inspect(Some(Kind::RateLimiter), &name)
            .await
            .unwrap();
        if let Some(object) = found.first() {
            assert!(object.waiters_listed);
            most = most.max(object.waiters.len());
            for waiter in &object.waiters {
                let (id, ms) = waiter.rsplit_once(" in ").expect("`<id> in <n>ms`");
                assert_eq!(id, a.id(), "{waiter}");
                // The format only: the listing reads the clock and the reservations with
                // separate commands ("one `inspect` may mix two moments"), so under load an
                // entry was seen to say 602ms of 600. The bound is checked with `waiting()`.
                assert!(
                    ms.strip_suffix("ms")
                        .and_then(|ms| ms.parse::<u64>().ok())
                        .is_some(),
                    "not `<n>ms`: {waiter}"
                );
                checked += 1;
            }
        }
        most = most.max(limiter.waiting().await.unwrap() as usize);
        all_done = tasks.iter().all(|t| t.is_finished());
        tokio::task::yield_now().await;
    }
    let mut moments = Vec::new();
    for task in tasks {
        moments.push((task.await.unwrap().unwrap().admitted_at(), 1));
    }
    assert!(checked > 0, "no reservation was ever listed");
    assert_eq!(most, 11, "every caller but the first reserved at once");
    assert_no_window_over(&moments, interval, 3);
}

// ---------------------------------------------------------------------------------------------
// waiting(), inspect, list.
// ---------------------------------------------------------------------------------------------

/// `waiting()`: "How many reservations are still to come: callers sleeping until their moment";
/// `Client::inspect`: "rate limit and available permits"; `Inspection::rate_limit`: "as
/// RateLimiter::limit reads it. None when no limit is stored"; `available`: "None when no limit
/// is stored"; `list`: "An object is listed once per kind when any of its keys exists". The
/// guide: "`limit` says `none stored` when only reservations are left (the limit's key was
/// lost)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_inspect_and_list_describe_the_limiter() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let observer = client(&server.url()).await;
    let name = unique("docs-rl-inspect");
    let limit = RateLimit::new(1, Duration::from_secs(3)).unwrap();
    let limiter = a.rate_limiter(&name).with_limit(limit);
    assert!(observer
        .inspect(Some(Kind::RateLimiter), &name)
        .await
        .unwrap()
        .is_empty());
    limiter.acquire(1).await.unwrap();
    let found = observer
        .inspect(Some(Kind::RateLimiter), &name)
        .await
        .unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].rate_limit, Some(limit));
    assert_eq!(found[0].available, Some(0));
    assert!(found[0].waiters.is_empty());
    assert!(found[0].holders.is_empty(), "a rate limiter has no holders");
    let listed = observer.list(Some(&name)).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].kind, Kind::RateLimiter);

    let sleeping = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    until_reserved(&limiter, 1).await;
    let found = observer
        .inspect(Some(Kind::RateLimiter), &name)
        .await
        .unwrap();
    assert_eq!(found[0].waiters.len(), 1);
    assert!(
        found[0].waiters[0].starts_with(a.id()),
        "{:?}",
        found[0].waiters
    );

    // The limit's key lost while a reservation is left: `none stored`, the waiter still listed.
    cmd(&server, &["DEL", &limiter_key(&name)]).await;
    let found = observer
        .inspect(Some(Kind::RateLimiter), &name)
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "the reservation's key still exists");
    assert_eq!(found[0].rate_limit, None);
    assert_eq!(found[0].available, None);
    assert_eq!(found[0].waiters.len(), 1);
    within(HANG, "the sleeping caller", sleeping)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(limiter.waiting().await.unwrap(), 0);
}

// ---------------------------------------------------------------------------------------------
// Metrics.
// ---------------------------------------------------------------------------------------------

#[derive(Default)]
struct Store(Mutex<HashMap<String, f64>>);

impl Store {
    fn update(&self, key: &str, f: impl FnOnce(&mut f64)) {
        f(self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(key.to_owned())
            .or_insert(0.0));
    }
    fn get(&self, key: &str) -> f64 {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .copied()
            .unwrap_or(0.0)
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
    fn record(&self, _: f64) {
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

/// The guide's metrics: "`lockkit_acquisitions_total` counts the requests it **admitted** (one
/// per call, however many permits), `lockkit_acquire_timeouts_total` those it **refused** (a
/// `try_acquire` or `try_admission` whose permits come later than its `wait`),
/// `lockkit_wait_seconds` how long each admitted call **waited** ..., and `lockkit_waiters` the
/// calls sleeping until their reservation's moment ... A rate limiter holds nothing: no
/// `lockkit_hold_seconds`."
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_metrics_count_admitted_and_refused_calls_and_sleepers() {
    let _gate = METRICS_GATE.write().await;
    let store = store();
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limit = RateLimit::new(2, Duration::from_secs(2))
        .unwrap()
        .with_burst(2)
        .unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-metrics"))
        .with_limit(limit);
    let get = |m: &str| store.get(&format!("{m}{{ratelimiter}}"));
    let (acq, timeouts, waits) = (
        get("lockkit_acquisitions_total"),
        get("lockkit_acquire_timeouts_total"),
        get("lockkit_wait_seconds"),
    );
    // One call for 3 permits: one acquisition.
    limiter.acquire(3).await.unwrap();
    assert_eq!(get("lockkit_acquisitions_total") - acq, 1.0);
    assert_eq!(get("lockkit_wait_seconds") - waits, 1.0);
    // Refused tries: timeouts, not acquisitions.
    assert!(!limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(limiter
        .try_admission(2, Duration::from_millis(10))
        .await
        .unwrap()
        .is_none());
    assert_eq!(get("lockkit_acquire_timeouts_total") - timeouts, 2.0);
    assert_eq!(get("lockkit_acquisitions_total") - acq, 1.0);
    // A sleeper is counted while it sleeps.
    let gauge = get("lockkit_waiters");
    let sleeping = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    until_reserved(&limiter, 1).await;
    within(HANG, "the gauge", async {
        while get("lockkit_waiters") - gauge != 1.0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    within(HANG, "the sleeper", sleeping)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(get("lockkit_waiters") - gauge, 0.0);
    assert_eq!(get("lockkit_acquisitions_total") - acq, 2.0);
    assert_eq!(get("lockkit_wait_seconds") - waits, 2.0);
    assert_eq!(
        get("lockkit_hold_seconds"),
        0.0,
        "a rate limiter holds nothing"
    );
}

// ---------------------------------------------------------------------------------------------
// The examples, run against a real Redis (the rustdoc's are `no_run` there: compiled only).
// ---------------------------------------------------------------------------------------------

/// The guide's example of the section "RateLimiter — at most N per interval, across every pod",
/// verbatim but for the stubs it hides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_example_runs() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    async fn call_partner() {}
    async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
        // Every pod configures the same limit on its handle: stored by the first request, and stored
        // again should Redis lose it. 100 a second for all pods together, spread evenly.
        let partner = client
            .rate_limiter("partner-api")
            .with_limit(RateLimit::per_second(100)?);

        partner.acquire(1).await?; // waits for its moment, however long
        call_partner().await;

        // At most 50 ms of waiting; `false` at once when the next permit is further away.
        if partner.try_acquire(1, Duration::from_millis(50)).await? {
            call_partner().await;
        }

        // 10 000 a day, up to 50 in one go; each pod (client) its own 10 000.
        let daily = RateLimit::new(10_000, Duration::from_secs(86_400))?
            .with_burst(49)?
            .with_mode(RateMode::PerClient);
        let export = client.rate_limiter("exports").with_limit(daily);
        let batch = export.acquire(50).await?;
        println!(
            "50 permits admitted at {:?} (server clock)",
            batch.admitted_at()
        );
        Ok(())
    }
    within(HANG, "the guide's example", demo(client.clone()))
        .await
        .unwrap();
}

/// The rustdoc examples of `RateLimiter` (the type, `with_limit`, `set_limit`, `try_set_limit`,
/// `available`, `try_admission`), verbatim but for the stubs they hide.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rustdoc_examples_run() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    async fn call_partner() {}
    async fn send_batch(_: &[&str]) -> usize {
        0
    }
    async fn type_doc(client: &Client) -> Result<(), Error> {
        // Every pod: 100 requests a second to the partner, for all pods together.
        let partner = client
            .rate_limiter("partner-api")
            .with_limit(RateLimit::per_second(100)?);
        partner.acquire(1).await?;
        call_partner().await;

        // Or give up when the next permit is more than 50 ms away (decided at once).
        if partner.try_acquire(1, Duration::from_millis(50)).await? {
            call_partner().await;
        }
        Ok(())
    }
    async fn with_limit_doc(client: &Client) -> Result<(), Error> {
        // Every pod, at start-up: no call needed, the first request stores the limit.
        let partner = client
            .rate_limiter("partner-api")
            .with_limit(RateLimit::per_second(100)?);
        assert_eq!(
            partner.configured_limit(),
            Some(RateLimit::per_second(100)?)
        );
        Ok(())
    }
    async fn set_limit_doc(client: &Client) -> Result<(), Error> {
        let partner = client.rate_limiter("partner-api");
        // The partner raised the account's limit: from the next request on.
        partner.set_limit(RateLimit::per_second(200)?).await?;
        assert_eq!(partner.limit().await?, Some(RateLimit::per_second(200)?));
        Ok(())
    }
    async fn try_set_limit_doc(client: &Client) -> Result<(), Error> {
        // Every pod may call this at start-up: only the first one stores the limit.
        let sms = client.rate_limiter("sms-gateway");
        if !sms.try_set_limit(RateLimit::per_minute(10)?).await? {
            println!("kept the stored limit: {:?}", sms.limit().await?);
        }
        Ok(())
    }
    async fn available_doc(client: &Client) -> Result<(), Error> {
        let partner = client
            .rate_limiter("partner-api")
            .with_limit(RateLimit::per_second(100)?.with_burst(9)?);
        // Up to 10 now after an idle spell (the burst + 1); how many calls sleep on a reservation.
        println!(
            "{} available, {} waiting",
            partner.available().await?,
            partner.waiting().await?
        );
        Ok(())
    }
    async fn try_admission_doc(client: &Client) -> Result<(), Error> {
        let messages = ["hello"];
        let sms = client
            .rate_limiter("sms-gateway")
            .with_limit(RateLimit::per_minute(60)?.with_burst(9)?);
        if let Some(admission) = sms.try_admission(10, Duration::from_secs(1)).await? {
            if send_batch(&messages).await == 0 {
                // Nothing was sent: the permits go back if no request came since (else `false`,
                // and they stay spent: the limiter stays exact).
                admission.give_back().await?;
            }
        }
        Ok(())
    }
    within(HANG, "the rustdoc examples", async {
        type_doc(&client).await.unwrap();
        with_limit_doc(&client).await.unwrap();
        set_limit_doc(&client).await.unwrap();
        // A fresh Redis for the examples that read "sms-gateway" as if first.
        try_set_limit_doc(&client).await.unwrap();
        available_doc(&client).await.unwrap();
        cmd(&server, &["FLUSHALL"]).await;
        try_admission_doc(&client).await.unwrap();
        // Run again on a stored limit: the examples hold whatever another pod stored first.
        try_set_limit_doc(&client).await.unwrap();
        try_admission_doc(&client).await.unwrap();
    })
    .await;
}

// ---------------------------------------------------------------------------------------------
// Edge values.
// ---------------------------------------------------------------------------------------------

/// `acquire`: "Waits until permits are admitted, however long that takes ... (a moment more than
/// one interval ahead costs one more call per interval)"; `try_acquire(k, Duration::MAX)`: takes
/// them "if they can be admitted within wait". Callers queued three intervals deep with
/// `Duration::MAX` waits are all admitted, in every window within the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duration_max_waits_beyond_one_interval_are_served() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let interval = Duration::from_millis(500);
    // One every 250 ms: 8 callers reach 2 s ahead, four intervals.
    let limit = RateLimit::new(2, interval).unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-max-wait"))
        .with_limit(limit);
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let limiter = limiter.clone();
            tokio::spawn(async move {
                match i % 3 {
                    0 => limiter.acquire(1).await.map(|a| a.admitted_at()),
                    1 => limiter
                        .try_admission(1, Duration::MAX)
                        .await
                        .map(|a| a.expect("Duration::MAX is long enough").admitted_at()),
                    _ => {
                        assert!(limiter.try_acquire(1, Duration::MAX).await?);
                        Ok(SystemTime::now())
                    }
                }
            })
        })
        .collect();
    let mut moments = Vec::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let at = within(HANG, "a caller", task).await.unwrap().unwrap();
        if i % 3 != 2 {
            moments.push((at, 1));
        }
    }
    assert_no_window_over(&moments, interval, 2);
    assert_eq!(limiter.waiting().await.unwrap(), 0);
}

/// The extremes the docs allow: `MAX_BURST`, whose `burst + 1` emission intervals must span at
/// most `MAX_INTERVAL` (so `MAX_INTERVAL` itself takes no burst). "a limiter that was idle admits
/// up to `b + 1` at once"; `available()`: "How many permits one request could take now". After
/// `MAX_BURST` of the `MAX_BURST + 1` are taken, `available()` says 1, and a request for 1 must
/// then be admitted (time only adds permits). (Written first with `MAX_INTERVAL` and `MAX_BURST`,
/// which the library accepted then and which failed 1 run in 2 to 3.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_extreme_limiter_admits_burst_plus_one_in_two_requests() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let yearly = RateLimit::new(1, RateLimit::MAX_INTERVAL).unwrap();
    assert!(matches!(
        yearly.with_burst(1),
        Err(Error::InvalidArgument(_))
    ));
    // The largest burst at the longest interval: MAX_BURST + 1 permits per MAX_INTERVAL, whose
    // burst + 1 emission intervals span exactly MAX_INTERVAL (one permit every 31.6 ms).
    let huge = RateLimit::new(RateLimit::MAX_BURST + 1, RateLimit::MAX_INTERVAL)
        .unwrap()
        .with_burst(RateLimit::MAX_BURST)
        .unwrap();
    // Several limiters: the failure depends on the moment.
    for _ in 0..10 {
        let limiter = client
            .rate_limiter(unique("docs-rl-extreme"))
            .with_limit(huge);
        assert_eq!(limiter.available().await.unwrap(), RateLimit::MAX_BURST + 1);
        assert!(limiter
            .try_acquire(RateLimit::MAX_BURST, Duration::ZERO)
            .await
            .unwrap());
        // Time only adds permits (one every 31.6 ms).
        assert!(limiter.available().await.unwrap() >= 1);
        assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    }
}

/// One permit per microsecond, the fastest limit `RateLimit::new` accepts: never more than
/// 1000 in a window of 1 ms, and one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_permit_per_microsecond_keeps_the_window_promise() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    // 1000 per ms, no burst: one at a time, and never more than 1000 in a window of 1 ms.
    let fast = RateLimit::new(1000, Duration::from_millis(1)).unwrap();
    let limiter = client.rate_limiter(unique("docs-rl-fast")).with_limit(fast);
    let mut moments = Vec::new();
    for _ in 0..200 {
        moments.push((limiter.acquire(1).await.unwrap().admitted_at(), 1));
    }
    assert_no_window_over(&moments, Duration::from_millis(1), 1000);
    assert!(is_invalid(&limiter.acquire(2).await));
}

/// "once another request came, `give_back()` returns `false` and the permits stay spent — the
/// limiter ... stays exact"; "the loss can over-admit ... **at most one window's worth**". An
/// admission from before a FLUSHALL given back afterwards must not hand out permits the new
/// schedule already admitted: a window sees at most twice `n + b`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn give_back_after_data_loss_never_over_admits() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let a = client(&server.url()).await;
    let b = client(&server.url()).await;
    // n + b = 3 per hour, all 3 at once after an idle spell.
    let limit = RateLimit::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_burst(2)
        .unwrap();
    for another_request in [false, true] {
        let name = unique("docs-rl-giveback-loss");
        let la = a.rate_limiter(&name).with_limit(limit);
        let lb = b.rate_limiter(&name).with_limit(limit);
        let before = la.try_admission(3, Duration::ZERO).await.unwrap().unwrap();
        cmd(&server, &["FLUSHALL"]).await;
        if another_request {
            assert!(lb.try_acquire(3, Duration::ZERO).await.unwrap());
            assert!(
                !before.give_back().await.unwrap(),
                "another request came after it"
            );
        } else {
            let _ = before.give_back().await.unwrap();
            assert!(lb.try_acquire(3, Duration::ZERO).await.unwrap());
        }
        // 6 admitted within the hour: the one window's worth the loss may cost, and no more.
        assert!(
            !lb.try_acquire(1, Duration::ZERO).await.unwrap(),
            "another request: {another_request}"
        );
        assert!(lb.available().await.unwrap() == 0);
    }
}

/// The longest interval, `MAX_INTERVAL` (which takes no burst: `burst + 1` emission intervals
/// must span at most `MAX_INTERVAL`): after its 1 permit, no request in that window is admitted
/// ("in every window of one `interval` ... at most `n + b`"). (Written first with `MAX_BURST`,
/// which the library accepted then.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extreme_limit_admits_nothing_after_burst_plus_one() {
    let _gate = METRICS_GATE.read().await;
    let server = spawned().await;
    let client = client(&server.url()).await;
    let yearly = RateLimit::new(1, RateLimit::MAX_INTERVAL).unwrap();
    let limiter = client
        .rate_limiter(unique("docs-rl-extreme-over"))
        .with_limit(yearly);
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    let mut more = 0;
    for _ in 0..100 {
        if limiter.try_acquire(1, Duration::ZERO).await.unwrap() {
            more += 1;
        }
    }
    assert_eq!(more, 0, "more admitted in the window of the first");
}
