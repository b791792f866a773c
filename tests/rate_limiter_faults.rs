//! The rate limiter under faults (issue 30, target 4), against real redis-server processes: Redis
//! restarted empty under load, a client killed mid-acquire, the script cache flushed under load,
//! a frozen server, and a cut-off try whose give-back meets an empty script cache. Admitted
//! moments are the server's (`RateAdmission::admitted_at`), checked with
//! `lockkit_suite::rate_window`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit::{RateLimit, RateLimiter};
use lockkit_suite::rate_window::{assert_no_window_over, busiest_window};
use lockkit_suite::{client, spawned, unique, within};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(60);

/// One caller's task: its admissions (server moment, permits) and how many calls failed.
type Caller = tokio::task::JoinHandle<(Vec<(SystemTime, u64)>, u64)>;

/// The server's clock.
async fn server_now(server: &lockkit_suite::RedisServer) -> SystemTime {
    let t = server.command(&["TIME"]).await.expect("TIME");
    let part = |i: usize| -> u64 {
        t.as_array()
            .and_then(|a| a.get(i))
            .and_then(|p| p.as_str())
            .and_then(|p| p.parse().ok())
            .expect("TIME")
    };
    UNIX_EPOCH + Duration::from_micros(part(0) * 1_000_000 + part(1))
}

/// Callers asking with `acquire(1)` until `stop`, each admission recorded with its server moment;
/// errors (a server restarting) are counted and asked again.
fn callers(limiters: &[RateLimiter], count: usize, stop: Arc<AtomicBool>) -> Vec<Caller> {
    (0..count)
        .map(|i| {
            let limiter = limiters[i % limiters.len()].clone();
            let stop = Arc::clone(&stop);
            tokio::spawn(async move {
                let (mut admitted, mut errors) = (Vec::new(), 0);
                while !stop.load(Ordering::SeqCst) {
                    match limiter.acquire(1).await {
                        Ok(a) => admitted.push((a.admitted_at(), a.permits())),
                        Err(_) => {
                            errors += 1;
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                    }
                }
                (admitted, errors)
            })
        })
        .collect()
}

async fn collect(tasks: Vec<Caller>) -> (Vec<(SystemTime, u64)>, u64) {
    let (mut all, mut errors) = (Vec::new(), 0);
    for task in tasks {
        let (admitted, e) = within(HANG, "a caller", task).await.expect("a caller");
        all.extend(admitted);
        errors += e;
    }
    (all, errors)
}

/// (a) Redis restarted EMPTY while callers hold reservations and others keep asking: the limit
/// comes back from the handles' `with_limit`, no window holds more than one extra window's worth
/// (`2 × (rate + burst)`, `lockkit_model::rate_limiter::most_per_window` with one reset), and
/// every window that starts one interval after the restart holds at most `rate + burst`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_empty_under_load_over_admits_at_most_one_window() {
    let mut server = spawned().await;
    let url = server.url();
    let name = unique("restart-empty");
    let limit = RateLimit::new(10, Duration::from_millis(100))
        .unwrap()
        .with_burst(2)
        .unwrap();
    let mut limiters = Vec::new();
    for _ in 0..4 {
        limiters.push(client(&url).await.rate_limiter(&name).with_limit(limit));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = callers(&limiters, 8, Arc::clone(&stop));
    // Reservations are held (8 callers ask faster than 10 per 100 ms).
    within(HANG, "reservations", async {
        while limiters[0].waiting().await.unwrap_or(0) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.restart_empty().await.expect("a restart");
    let restarted = server_now(&server).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    stop.store(true, Ordering::SeqCst);
    let (admitted, errors) = collect(tasks).await;
    assert_eq!(
        limiters[0].limit().await.unwrap(),
        Some(limit),
        "the limit came back"
    );
    let after: Vec<_> = admitted
        .iter()
        .copied()
        .filter(|(at, _)| *at >= restarted + limit.interval())
        .collect();
    assert!(
        !after.is_empty(),
        "callers were admitted after the restart ({errors} errors)"
    );
    let per_window = limit.permits() + limit.burst();
    assert_no_window_over(&admitted, limit.interval(), 2 * per_window);
    assert_no_window_over(&after, limit.interval(), per_window);
    println!(
        "restart empty: {} admissions, busiest window {} (at most {}), {errors} errors during the \
         restart",
        admitted.len(),
        busiest_window(&admitted, limit.interval()).0,
        2 * per_window
    );
}

/// (b) A client killed mid-acquire — its runtime dropped while its call sleeps on a reservation,
/// and another's while its request is in flight (held by a frozen proxy): the survivors keep
/// being admitted, and no window of their admissions holds more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_mid_acquire_admits_nothing_more_and_the_others_go_on() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("killed");
    let limit = RateLimit::new(5, Duration::from_millis(100))
        .unwrap()
        .with_burst(1)
        .unwrap();
    let mut limiters = Vec::new();
    for _ in 0..2 {
        limiters.push(client(&url).await.rate_limiter(&name).with_limit(limit));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = callers(&limiters, 4, Arc::clone(&stop));
    // The victims, each on a runtime of its own: one reserved and sleeping, one in flight.
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let (direct, frozen) = (url.clone(), proxy.url());
    let name_v = name.clone();
    let victims = std::thread::spawn(move || {
        let mut reserved = Vec::new();
        for (i, url) in [direct, frozen].into_iter().enumerate() {
            let rt = tokio::runtime::Runtime::new().expect("a runtime");
            let name = name_v.clone();
            let limiter =
                rt.block_on(async { client(&url).await.rate_limiter(&name).with_limit(limit) });
            reserved.push((rt, limiter, i));
        }
        reserved
    })
    .join()
    .expect("the victims' clients");
    let mut runtimes = Vec::new();
    for (rt, limiter, i) in victims {
        if i == 1 {
            proxy.pause();
        }
        rt.spawn(async move {
            let _ = limiter.acquire(2).await;
        });
        runtimes.push(rt);
    }
    tokio::time::sleep(Duration::from_millis(60)).await;
    // Killed: the runtimes go, their tasks with them, without running any give-back.
    for rt in runtimes {
        rt.shutdown_background();
    }
    proxy.resume();
    let killed = server_now(&server).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, Ordering::SeqCst);
    let (admitted, _) = collect(tasks).await;
    let after = admitted
        .iter()
        .filter(|(at, _)| *at > killed + limit.interval())
        .count();
    assert!(after > 0, "the survivors went on after the kill");
    assert_no_window_over(&admitted, limit.interval(), limit.permits() + limit.burst());
}

/// (c) The script cache flushed every 75 ms under load: no call fails, no window holds more than
/// the limit, and the limiter does not stall (the callers, always asking, were admitted at least
/// half the rate over the span of the admissions, on the server's clock).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_cache_flushed_under_load_breaks_nothing() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("flushed");
    let limit = RateLimit::new(20, Duration::from_millis(100))
        .unwrap()
        .with_burst(3)
        .unwrap();
    let mut limiters = Vec::new();
    for _ in 0..4 {
        limiters.push(client(&url).await.rate_limiter(&name).with_limit(limit));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let tasks = callers(&limiters, 8, Arc::clone(&stop));
    let mut flushes = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(75)).await;
        assert!(!server
            .command(&["SCRIPT", "FLUSH"])
            .await
            .unwrap()
            .is_error());
        flushes += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let (admitted, errors) = collect(tasks).await;
    assert_eq!(errors, 0, "no call failed across {flushes} flushes");
    assert_no_window_over(&admitted, limit.interval(), limit.permits() + limit.burst());
    let first = admitted.iter().map(|a| a.0).min().expect("admissions");
    let last = admitted.iter().map(|a| a.0).max().expect("admissions");
    let span = last.duration_since(first).unwrap_or_default();
    let full = span.as_secs_f64() / limit.interval().as_secs_f64() * limit.permits() as f64;
    let got: u64 = admitted.iter().map(|a| a.1).sum();
    assert!(
        got as f64 >= full / 2.0,
        "{got} permits admitted over {span:?}, where the limit admits {full:.0}"
    );
}

/// A client whose commands time out after `timeout`.
async fn client_timing_out(url: &str, timeout: Duration) -> lockkit::Client {
    lockkit::Client::builder()
        .url(url)
        .command_timeout(timeout)
        .build()
        .await
        .expect("a client")
}

/// A try cut off by a frozen server: it returns an error within its bound — the command timeout
/// (500 ms), far inside the 30 s it was allowed to wait (hang guard: 10 s) — and once the server
/// resumes and runs the request, nothing is left reserved or charged: the limit (1 an hour) has
/// its permit free again. With `flush`, the script cache holds only the acquire script when the
/// server freezes: the give-back meets `NOSCRIPT` and must still go through.
async fn frozen_try(flush: bool) {
    let server = spawned().await;
    let url = server.url();
    let name = unique(if flush { "frozen-flushed" } else { "frozen" });
    let limit = RateLimit::new(1, Duration::from_secs(3600)).unwrap();
    let watcher = client(&url).await.rate_limiter(&name).with_limit(limit);
    assert_eq!(watcher.available().await.unwrap(), 1);
    let caller = client_timing_out(&url, Duration::from_millis(500)).await;
    let limiter = caller.rate_limiter(&name).with_limit(limit);
    if flush {
        assert!(!server
            .command(&["SCRIPT", "FLUSH"])
            .await
            .unwrap()
            .is_error());
        let src = lockkit::protocol::rate_limiter::ACQUIRE.source();
        assert!(!server
            .command(&["SCRIPT", "LOAD", src])
            .await
            .unwrap()
            .is_error());
    }
    server.pause().unwrap();
    let out = within(
        Duration::from_secs(10),
        "a try on a frozen server (its bound: the 500 ms command timeout)",
        limiter.try_acquire(1, Duration::from_secs(30)),
    )
    .await;
    server.resume().unwrap();
    assert!(out.is_err(), "a frozen server's try returned {out:?}");
    within(HANG, "the give-back of the cut-off try", async {
        loop {
            let (available, waiting) = (
                watcher.available().await.unwrap(),
                watcher.waiting().await.unwrap(),
            );
            if available == 1 && waiting == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
}

/// (d) A frozen server: `try_acquire` returns within its bound with an error, nothing reserved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_on_a_frozen_server_returns_within_its_bound_and_leaves_nothing_reserved() {
    frozen_try(false).await;
}

/// (e) The same, the give-back meeting an empty script cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_try_gives_back_through_an_empty_script_cache() {
    frozen_try(true).await;
}
