//! `lockkit inspect`, `list` and `watch` of a rate limiter (issue 30): the stored limit, the
//! permits one request could take now, and who waits (its reservations still to come, with the
//! waiting client's id and how far ahead); `list --held` counts a rate limiter with waiting calls
//! as held. Runs the real binary against a real redis-server.

mod common;

use std::process::Stdio;
use std::time::Duration;

use lockkit::{RateLimit, RateLimiter, RateMode};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;
use tokio::task::JoinHandle;

use common::*;

/// 2 permits a minute, burst 1: one every 30 s, up to 2 at once. Nothing refills during a test.
fn slow_limit() -> RateLimit {
    RateLimit::new(2, Duration::from_secs(60))
        .unwrap()
        .with_burst(1)
        .unwrap()
}

/// Until the server counts `n` reservations still to come.
async fn until_waiting(limiter: &RateLimiter, n: u64) {
    within("the reservations to show in Redis", async {
        while limiter.waiting().await.unwrap() != n {
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// Takes both permits of [`slow_limit`] (so none is available), then starts a call of `other`
/// that reserves the next one, 30 s ahead; returns once Redis has the reservation.
async fn spent_with_a_waiting_call(
    limiter: &RateLimiter,
    other: &RateLimiter,
) -> JoinHandle<Result<lockkit::RateAdmission, lockkit::Error>> {
    limiter.acquire(2).await.unwrap();
    let waiter = tokio::spawn({
        let other = other.clone();
        async move { other.acquire(1).await }
    });
    until_waiting(limiter, 1).await;
    waiter
}

/// Cancels the waiting call (a dropped acquire gives its reservation back) and waits until
/// Redis has no reservation left.
async fn cancel(
    waiter: JoinHandle<Result<lockkit::RateAdmission, lockkit::Error>>,
    limiter: &RateLimiter,
) {
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    until_waiting(limiter, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_limit_what_is_available_and_who_waits() {
    let redis = server().await;
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let limiter = a.rate_limiter("partner-api").with_limit(slow_limit());
    let other = b.rate_limiter("partner-api").with_limit(slow_limit());

    // Before any request nothing is stored: no object.
    let output = lockkit(&url, &["inspect", "--kind", "ratelimiter", "partner-api"]).await;
    assert_eq!(code(&output), Some(1), "{output:?}");

    assert!(limiter.try_set_limit(slow_limit()).await.unwrap());
    let output = lockkit(&url, &["--json", "inspect", "partner-api"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let found = json(&output);
    let object = &found[0];
    assert_eq!(object["kind"], "ratelimiter", "{found}");
    assert_eq!(
        object["rate_limit"],
        serde_json::json!({"permits": 2, "interval_ms": 60000, "burst": 1, "mode": "overall"}),
        "{found}"
    );
    assert_eq!(object["available"], 2, "an idle limiter: the burst + 1");
    assert_eq!(object["waiters"], Value::Array(vec![]));
    assert_eq!(object["waiters_listed"], true);

    let waiter = spent_with_a_waiting_call(&limiter, &other).await;
    let output = lockkit(
        &url,
        &["--json", "inspect", "--kind", "ratelimiter", "partner-api"],
    )
    .await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let found = json(&output);
    assert_eq!(found[0]["available"], 0, "{found}");
    let waiters = found[0]["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1, "{found}");
    // `<client id> in <n>ms`: the waiting call's client, and its moment 30 s ahead at most.
    let waiter_text = waiters[0].as_str().unwrap();
    let (who, ahead) = waiter_text.split_once(" in ").unwrap();
    assert_eq!(who, b.id(), "{found}");
    let ahead: u64 = ahead.strip_suffix("ms").unwrap().parse().unwrap();
    assert!(ahead > 0 && ahead <= 30_000, "{waiter_text}");

    let output = lockkit(&url, &["inspect", "partner-api"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let text = stdout(&output);
    assert!(
        text.starts_with("rate limiter \"partner-api\"  (key lockkit:ratelimiter:{partner-api})\n"),
        "{text}"
    );
    assert!(
        text.contains("  limit          2 per 60s, burst 1 (up to 2 at once), overall\n"),
        "{text}"
    );
    assert!(text.contains("  available      0\n"), "{text}");
    assert!(
        text.contains(&format!("  waiters        1. {} in ", b.id())),
        "{text}"
    );

    cancel(waiter, &limiter).await;
    let output = lockkit(&url, &["inspect", "partner-api"]).await;
    assert!(
        stdout(&output).contains("  waiters        none\n"),
        "{output:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_of_a_per_client_limit_says_so() {
    let redis = server().await;
    let url = redis.url();
    let c = client(&url).await;
    let limit = RateLimit::per_second(100)
        .unwrap()
        .with_mode(RateMode::PerClient);
    assert!(c.rate_limiter("sms").try_set_limit(limit).await.unwrap());
    let output = lockkit(&url, &["--json", "inspect", "sms"]).await;
    let found = json(&output);
    assert_eq!(found[0]["rate_limit"]["mode"], "per_client", "{found}");
    assert_eq!(found[0]["rate_limit"]["interval_ms"], 1000, "{found}");
    let output = lockkit(&url, &["inspect", "sms"]).await;
    assert!(
        stdout(&output)
            .contains("  limit          100 per 1s, burst 0 (up to 1 at once), per client\n"),
        "{output:?}"
    );
}

/// `list` shows a rate limiter with its number of waiting calls; `--held` counts it as held
/// while calls wait (exit 5), not once none does (exit 0), though its limit stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_held_means_calls_are_waiting() {
    let redis = server().await;
    let url = redis.url();
    let (a, b) = (client(&url).await, client(&url).await);
    let limiter = a.rate_limiter("partner-api").with_limit(slow_limit());
    let other = b.rate_limiter("partner-api").with_limit(slow_limit());
    let waiter = spent_with_a_waiting_call(&limiter, &other).await;

    let output = lockkit(&url, &["list"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let rows: Vec<Vec<String>> = stdout(&output)
        .lines()
        .skip(1)
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect();
    assert_eq!(
        rows,
        vec![vec!["ratelimiter", "partner-api", "1", "-", "-"]]
    );
    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(5), "{output:?}");
    assert!(
        stdout(&output).contains("ratelimiter  partner-api"),
        "{output:?}"
    );
    assert!(output.stderr.is_empty(), "{output:?}");
    let output = lockkit(&url, &["--json", "list"]).await;
    assert_eq!(json(&output)[0]["held"], true, "{output:?}");

    cancel(waiter, &limiter).await;
    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    assert_eq!(
        stdout(&output).lines().count(),
        1,
        "the header only: {output:?}"
    );
    let output = lockkit(&url, &["--json", "list"]).await;
    let listed = json(&output);
    assert_eq!(listed[0]["kind"], "ratelimiter", "{listed}");
    assert_eq!(listed[0]["held"], false, "{listed}");
}

/// `watch` prints the state, then the change a request makes: the permits it took.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_follows_a_rate_limiter() {
    let redis = server().await;
    let url = redis.url();
    let c = client(&url).await;
    let limiter = c.rate_limiter("partner-api").with_limit(slow_limit());
    assert!(limiter.try_set_limit(slow_limit()).await.unwrap());
    let mut watch = Command::new(BIN)
        .args([
            "--url",
            &url,
            "watch",
            "--kind",
            "ratelimiter",
            "partner-api",
            "--count",
            "1",
        ])
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let before = within("the first state", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(
        before.ends_with(
            "rate limiter \"partner-api\": 2 per 60s, burst 1 (up to 2 at once), overall; \
             2 available, 0 waiting"
        ),
        "{before}"
    );
    limiter.acquire(1).await.unwrap();
    let after = within("the change", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(after.ends_with("; 1 available, 0 waiting"), "{after}");
    let status = within("watch to stop after one change", watch.wait())
        .await
        .unwrap();
    assert!(status.success());
}
