//! The rate limiter against a real redis-server: exactness on the server's clock, waiting
//! without polling, give-back, and the broken promises of Redisson's `RRateLimiter`, each as a
//! named test.

use std::time::{Duration, SystemTime};

use lockkit::{Error, RateLimit, RateMode};
use lockkit_suite::rate_window::assert_no_window_over;
use lockkit_suite::{client, redis, spawned, unique, within};

const HANG: Duration = Duration::from_secs(60);

/// Redisson #2072: the first call let through more permits than the rate. Here a fresh limiter of
/// 5 a second with a burst of 2 admits 3 at once (the burst + 1) and no more, however many ask.
#[tokio::test]
async fn redisson_2072_a_fresh_limiter_admits_no_more_than_the_burst_at_once() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let limit = RateLimit::per_second(5).unwrap().with_burst(2).unwrap();
    let limiter = client.rate_limiter(unique("first-call")).with_limit(limit);
    let mut admitted = 0;
    for _ in 0..20 {
        if limiter.try_acquire(1, Duration::ZERO).await.unwrap() {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
}

/// Redisson #1524: `acquire()` blocked for ever. Here the third acquire of a limit of 2 a second
/// returns, admitted one emission interval (500 ms, on the server's clock) after the second.
#[tokio::test]
async fn redisson_1524_acquire_returns_when_the_next_permit_frees() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let limiter = client
        .rate_limiter(unique("next-permit"))
        .with_limit(RateLimit::per_second(2).unwrap());
    within(HANG, "three acquires", async {
        let first = limiter.acquire(1).await.unwrap();
        let second = limiter.acquire(1).await.unwrap();
        let third = limiter.acquire(1).await.unwrap();
        let step = Duration::from_millis(500);
        assert!(second.admitted_at() >= first.admitted_at() + step);
        assert_eq!(
            third.admitted_at(),
            second.admitted_at() + step,
            "the third is admitted exactly one emission interval after the second"
        );
    })
    .await;
}

/// Redisson #1659: `tryAcquire(timeout)` blocked past its timeout. Here a limit of 1 an hour,
/// already used, refuses a try that may wait 59 minutes at once: the server knows the next permit
/// is an hour away (the hang guard is a minute).
#[tokio::test]
async fn redisson_1659_a_try_that_cannot_be_met_is_refused_at_once() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let limiter = client
        .rate_limiter(unique("refused-at-once"))
        .with_limit(RateLimit::new(1, Duration::from_secs(3600)).unwrap());
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    let refused = within(
        HANG,
        "a try that cannot be met",
        limiter.try_acquire(1, Duration::from_secs(59 * 60)),
    )
    .await
    .unwrap();
    assert!(!refused);
    assert_eq!(limiter.waiting().await.unwrap(), 0, "nothing was reserved");
}

/// Redisson #2931: permits taken at the end of one interval and the start of the next exceeded
/// the rate. Here 16 callers on 4 clients ask as fast as they can for 2.5 s of a limit of 20 a
/// second with a burst of 3: every window of one second, wherever it starts, holds at most 23.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_2931_no_window_of_one_interval_exceeds_the_rate_and_burst() {
    let redis = redis().await;
    let url = redis.url();
    let name = unique("windows");
    let limit = RateLimit::per_second(20).unwrap().with_burst(3).unwrap();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&url).await);
    }
    let stop = tokio::time::Instant::now() + Duration::from_millis(2500);
    let mut tasks = Vec::new();
    for i in 0..16 {
        let limiter = clients[i % 4].rate_limiter(&name).with_limit(limit);
        tasks.push(tokio::spawn(async move {
            let mut admitted = Vec::new();
            while tokio::time::Instant::now() < stop {
                let permits = 1 + (i as u64 % 2);
                let admission = limiter.acquire(permits).await.unwrap();
                admitted.push((admission.admitted_at(), admission.permits()));
            }
            admitted
        }));
    }
    let mut admitted: Vec<(SystemTime, u64)> = Vec::new();
    for task in tasks {
        admitted.extend(within(HANG, "callers", task).await.unwrap());
    }
    assert!(admitted.len() > 20, "{} admissions", admitted.len());
    assert_no_window_over(&admitted, Duration::from_secs(1), 23);
}

/// Redisson #4176: permits never came back after a crash. Here the limit configured on the handle
/// sets the limiter up again after its keys are lost (a flush stands in for the empty restart).
#[tokio::test]
async fn redisson_4176_the_limit_comes_back_after_the_data_is_lost() {
    let redis = spawned().await;
    let client = client(&redis.url()).await;
    let limiter = client
        .rate_limiter(unique("refills"))
        .with_limit(RateLimit::per_second(10).unwrap());
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    redis.command(&["FLUSHALL"]).await.unwrap();
    assert_eq!(
        limiter.limit().await.unwrap(),
        None,
        "the flush took the limit"
    );
    assert!(limiter.try_acquire(1, Duration::ZERO).await.unwrap());
    assert_eq!(
        limiter.limit().await.unwrap(),
        Some(RateLimit::per_second(10).unwrap()),
        "the handle's limit was stored again"
    );
}

/// Redisson #7342: released permits were discarded at the next recalculation. Here permits given
/// back by the last request are taken at once by the next one.
#[tokio::test]
async fn redisson_7342_permits_given_back_are_admitted_again() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let limiter = client.rate_limiter(unique("give-back")).with_limit(
        RateLimit::new(2, Duration::from_secs(3600))
            .unwrap()
            .with_burst(1)
            .unwrap(),
    );
    let first = limiter.acquire(2).await.unwrap();
    assert_eq!(limiter.available().await.unwrap(), 0);
    assert!(first.give_back().await.unwrap());
    assert_eq!(limiter.available().await.unwrap(), 2);
    let again = limiter.try_admission(2, Duration::ZERO).await.unwrap();
    let again = again.expect("the permits given back are admitted at once");
    // Only the last request can be given back: a later one, placed after it, makes it unsound.
    let later = limiter.clone();
    let later = tokio::spawn(async move { later.acquire(1).await });
    within(HANG, "the later reservation", async {
        while limiter.waiting().await.unwrap() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(!again.give_back().await.unwrap());
    later.abort();
}

/// Redisson #3025, #5516, #2987: `ERR Error running script … unpack` after a config change or
/// under concurrency. Here the limit changes 50 times while 8 callers take permits: no call fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_3025_5516_2987_limit_changes_under_concurrency_break_no_call() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("changes");
    let limiter = client
        .rate_limiter(&name)
        .with_limit(RateLimit::per_second(1000).unwrap().with_burst(10).unwrap());
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..100 {
                limiter
                    .try_acquire(1, Duration::from_millis(20))
                    .await
                    .unwrap();
            }
        }));
    }
    for i in 0..50u64 {
        let limit = RateLimit::per_second(500 + i * 10)
            .unwrap()
            .with_burst(i % 11)
            .unwrap()
            .with_mode(if i % 2 == 0 {
                RateMode::Overall
            } else {
                RateMode::PerClient
            });
        limiter.set_limit(limit).await.unwrap();
    }
    for task in tasks {
        within(HANG, "callers", task).await.unwrap();
    }
}

/// Bad input is a clear error at once: zero permits, more than the limit ever admits at once, no
/// limit at all.
#[tokio::test]
async fn bad_requests_are_refused_at_once() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let limiter = client
        .rate_limiter(unique("bad"))
        .with_limit(RateLimit::per_second(10).unwrap().with_burst(2).unwrap());
    assert!(matches!(
        limiter.acquire(0).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        limiter.acquire(4).await,
        Err(Error::InvalidArgument(_))
    ));
    // Stored by another pod, unknown to this handle: the script refuses it.
    let other = client.rate_limiter(unique("bad-stored"));
    assert!(matches!(other.acquire(1).await, Err(Error::Refused { .. })));
    other
        .set_limit(RateLimit::per_second(10).unwrap())
        .await
        .unwrap();
    let fresh = lockkit_suite::client(&redis.url()).await;
    let stranger = fresh.rate_limiter(other.name());
    assert!(matches!(
        stranger.acquire(2).await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(stranger.acquire(1).await.is_ok());
}

/// A dropped acquire future gives its reservation back: the next caller is admitted at the
/// moment the dropped one had.
#[tokio::test]
async fn a_dropped_acquire_gives_its_reservation_back() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let limiter = client
        .rate_limiter(unique("dropped"))
        .with_limit(RateLimit::per_second(1).unwrap());
    let first = limiter.acquire(1).await.unwrap();
    let waiting = limiter.clone();
    let task = tokio::spawn(async move { waiting.acquire(1).await });
    within(HANG, "the reservation", async {
        while limiter.waiting().await.unwrap() == 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    task.abort();
    let _ = task.await;
    within(HANG, "the give-back", async {
        while limiter.waiting().await.unwrap() != 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let next = within(HANG, "the next", limiter.acquire(1)).await.unwrap();
    assert_eq!(
        next.admitted_at(),
        first.admitted_at() + Duration::from_secs(1)
    );
}

/// In the per-client mode each client has the limit to itself.
#[tokio::test]
async fn per_client_limits_count_each_client_alone() {
    let redis = redis().await;
    let url = redis.url();
    let name = unique("per-client");
    let limit = RateLimit::new(1, Duration::from_secs(3600))
        .unwrap()
        .with_mode(RateMode::PerClient);
    let (a, b) = (client(&url).await, client(&url).await);
    let (la, lb) = (
        a.rate_limiter(&name).with_limit(limit),
        b.rate_limiter(&name).with_limit(limit),
    );
    assert!(la.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(!la.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(lb.try_acquire(1, Duration::ZERO).await.unwrap());
    assert!(!lb.try_acquire(1, Duration::ZERO).await.unwrap());
}

/// The stored limit decides: a handle configured with a smaller burst than the one stored by
/// another pod still takes what the stored limit admits at once, and one with a larger burst is
/// refused what the stored one does not admit.
#[tokio::test]
async fn the_stored_limit_decides_what_one_request_may_take() {
    let redis = redis().await;
    let url = redis.url();
    let name = unique("stored-decides");
    let admin = client(&url).await;
    admin
        .rate_limiter(&name)
        .set_limit(RateLimit::per_second(10).unwrap().with_burst(4).unwrap())
        .await
        .unwrap();
    let pod = client(&url).await;
    let small = pod
        .rate_limiter(&name)
        .with_limit(RateLimit::per_second(10).unwrap());
    assert!(small.try_acquire(3, Duration::ZERO).await.unwrap());
    let other = client(&url).await;
    let large = other
        .rate_limiter(&name)
        .with_limit(RateLimit::per_second(10).unwrap().with_burst(9).unwrap());
    assert!(matches!(
        large.acquire(6).await,
        Err(Error::InvalidArgument(_))
    ));
}

/// The script calls counted in `INFO commandstats` (EVALSHA and EVAL), and ZSCORE calls.
async fn script_and_zscore_calls(server: &lockkit_suite::RedisServer) -> (u64, u64) {
    let info = server.command(&["INFO", "commandstats"]).await.unwrap();
    let text = info.as_str().unwrap_or_default().to_owned();
    let calls = |name: &str| -> u64 {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{name}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (calls("evalsha") + calls("eval"), calls("zscore"))
}

/// One script call per admitted request, however far ahead its moment: 8 callers of a limit of 1
/// per 50 ms wait up to 350 ms (7 intervals), and the server ran exactly 8 scripts for them and
/// nothing while they slept (no re-check without a loss to re-check for).
#[tokio::test]
async fn a_caller_waiting_many_intervals_costs_one_script_call() {
    let server = spawned().await;
    let client = client(&server.url()).await;
    let limiter = client
        .rate_limiter(unique("far-cost"))
        .with_limit(RateLimit::new(1, Duration::from_millis(50)).unwrap());
    limiter
        .set_limit(limiter.configured_limit().unwrap())
        .await
        .unwrap();
    // The script cached (a first EVALSHA meets NOSCRIPT and is followed by EVAL: two calls).
    let warm = client
        .rate_limiter(unique("far-cost-warm"))
        .with_limit(RateLimit::per_second(1).unwrap());
    warm.acquire(1).await.unwrap();
    let (scripts_before, zscores_before) = script_and_zscore_calls(&server).await;
    let mut tasks = Vec::new();
    for _ in 0..8 {
        let limiter = limiter.clone();
        tasks.push(tokio::spawn(async move { limiter.acquire(1).await }));
    }
    for task in tasks {
        within(HANG, "the callers", task).await.unwrap().unwrap();
    }
    let (scripts_after, zscores_after) = script_and_zscore_calls(&server).await;
    assert_eq!(
        scripts_after - scripts_before,
        8,
        "script calls for 8 admissions"
    );
    assert_eq!(
        zscores_after - zscores_before,
        0,
        "re-checks without a loss"
    );
}

/// A reservation far ahead (more than one interval) that Redis loses is asked for again once the
/// loss is known: 10 callers of client A hold reservations up to 900 ms ahead of a limit of 1 per
/// 100 ms; the keys are flushed; 9 callers of client B then ask. B's first request stores the
/// limit again and announces the loss, A's far sleepers ask again, and every admission after the
/// flush is in one schedule: at most the near sleeper (within one interval, which keeps its moment)
/// stands closer than one emission interval to another. Without the re-check, A's eight far
/// moments and B's nine would pair up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn far_reservations_lost_with_the_data_are_asked_for_again() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("far-lost");
    let limit = RateLimit::new(1, Duration::from_millis(100)).unwrap();
    let (a, b) = (client(&url).await, client(&url).await);
    let la = a.rate_limiter(&name).with_limit(limit);
    let lb = b.rate_limiter(&name).with_limit(limit);
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let limiter = la.clone();
        tasks.push(tokio::spawn(async move { limiter.acquire(1).await }));
    }
    within(HANG, "nine reservations", async {
        while la.waiting().await.unwrap() < 9 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let t = server.command(&["TIME"]).await.unwrap();
    let part = |i: usize| -> u64 { t.as_array().unwrap()[i].as_str().unwrap().parse().unwrap() };
    let flushed = std::time::UNIX_EPOCH + Duration::from_micros(part(0) * 1_000_000 + part(1));
    server.command(&["FLUSHALL"]).await.unwrap();
    for _ in 0..9 {
        let limiter = lb.clone();
        tasks.push(tokio::spawn(async move { limiter.acquire(1).await }));
    }
    let mut after: Vec<SystemTime> = Vec::new();
    for task in tasks {
        let admitted = within(HANG, "the callers", task).await.unwrap().unwrap();
        if admitted.admitted_at() > flushed {
            after.push(admitted.admitted_at());
        }
    }
    after.sort();
    let step = Duration::from_millis(100);
    let close = after
        .windows(2)
        .filter(|pair| pair[1].duration_since(pair[0]).unwrap_or_default() < step)
        .count();
    assert!(
        close <= 2,
        "{close} admissions after the flush stood closer than one emission interval to the next: \
         {after:?}"
    );
}

/// Redisson #5687: under load the limit broke before the configured rate (callers were refused
/// while the rate was not reached). Here 64 callers on 8 clients keep asking a limit of 100 a
/// second for 2 s: counted on the server's clock over the whole intervals from the first
/// admission, exactly the rate is admitted (the schedule never runs dry while callers wait), and
/// never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redisson_5687_under_load_the_limit_is_reached_and_not_exceeded() {
    let redis = redis().await;
    let url = redis.url();
    let name = unique("under-load");
    let limit = RateLimit::per_second(100).unwrap();
    let mut clients = Vec::new();
    for _ in 0..8 {
        clients.push(client(&url).await);
    }
    let stop = tokio::time::Instant::now() + Duration::from_millis(2500);
    let mut tasks = Vec::new();
    for i in 0..64 {
        let limiter = clients[i % 8].rate_limiter(&name).with_limit(limit);
        tasks.push(tokio::spawn(async move {
            let mut admitted = Vec::new();
            while tokio::time::Instant::now() < stop {
                admitted.push(limiter.acquire(1).await.unwrap().admitted_at());
            }
            admitted
        }));
    }
    let mut admitted: Vec<SystemTime> = Vec::new();
    for task in tasks {
        admitted.extend(within(HANG, "callers", task).await.unwrap());
    }
    admitted.sort();
    let first = admitted[0];
    let whole = Duration::from_secs(2);
    let in_span = admitted.iter().filter(|at| **at < first + whole).count();
    assert_eq!(in_span, 200, "admitted in the 2 s from the first admission");
    let pairs: Vec<(SystemTime, u64)> = admitted.iter().map(|at| (*at, 1)).collect();
    assert_no_window_over(&pairs, Duration::from_secs(1), 100);
}
