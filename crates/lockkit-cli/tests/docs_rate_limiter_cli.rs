//! The `lockkit` command's documented promises about rate limiters (docs/guide.md, "Command-line
//! tool"), checked from the guide alone: `inspect` (text and `--json`), `list --held`, `watch`,
//! and the exit codes.

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::{client, code, json, lockkit, server, stdout, within, BIN};
use lockkit::{RateLimit, RateMode};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// "Here the SMS gateway allows 10 messages a minute, all taken, and one client has two calls
/// waiting for the next ones": the guide's `inspect --kind ratelimiter sms-gateway` output, line
/// by line ("the tool prints [the client id] whole"); the waiters soonest first, each `in <n>ms`
/// at most 6 s and 12 s ahead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_the_limit_available_and_the_waiters_as_the_guide_does() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let limiter = client
        .rate_limiter("sms-gateway")
        .with_limit(RateLimit::per_minute(10).unwrap());
    limiter.acquire(1).await.unwrap();
    let mut calls = Vec::new();
    for n in 1..=2 {
        let call = limiter.clone();
        calls.push(tokio::spawn(async move { call.acquire(1).await }));
        within("the reservation", async {
            while limiter.waiting().await.unwrap() != n {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }
    let output = lockkit(&url, &["inspect", "--kind", "ratelimiter", "sms-gateway"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let text = stdout(&output);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.first().copied(),
        Some("rate limiter \"sms-gateway\"  (key lockkit:ratelimiter:{sms-gateway})"),
        "{text}"
    );
    assert!(
        lines.contains(&"  limit          10 per 60s, burst 0 (up to 1 at once), overall"),
        "{text}"
    );
    assert!(lines.contains(&"  available      0"), "{text}");
    let first = lines
        .iter()
        .find_map(|l| l.strip_prefix("  waiters        1. "))
        .unwrap_or_else(|| panic!("no first waiter: {text}"));
    let second = lines
        .iter()
        .find_map(|l| l.trim_start().strip_prefix("2. "))
        .unwrap_or_else(|| panic!("no second waiter: {text}"));
    let ahead = |entry: &str| -> u64 {
        let (id, ms) = entry.split_once(" in ").expect("`<id> in <n>ms`");
        assert_eq!(id, client.id(), "{text}");
        ms.strip_suffix("ms").unwrap().parse().unwrap()
    };
    let (one, two) = (ahead(first), ahead(second));
    assert!(one <= 6000 && two <= 12_000 && one < two, "{text}");
    // Shut down: the reservations are given back, the calls end with Error::Shutdown.
    client.shutdown().await.unwrap();
    for call in calls {
        assert!(matches!(call.await.unwrap(), Err(lockkit::Error::Shutdown)));
    }
}

/// `--json`: "`rate_limit`, a rate limiter's, `{"permits", "interval_ms", "burst", "mode":
/// "overall" | "per_client"}` or `null`, and `available`"; "In the per-client mode (`per
/// client`) ... `available` is what a client that has asked nothing within the last interval
/// could take".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_json_and_the_per_client_mode() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let limit = RateLimit::new(10_000, Duration::from_secs(86_400))
        .unwrap()
        .with_burst(49)
        .unwrap()
        .with_mode(RateMode::PerClient);
    let limiter = client.rate_limiter("exports").with_limit(limit);
    limiter.acquire(50).await.unwrap();
    assert_eq!(limiter.available().await.unwrap(), 0);
    let output = lockkit(
        &url,
        &["--json", "inspect", "--kind", "ratelimiter", "exports"],
    )
    .await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let report = json(&output);
    let object = &report[0];
    assert_eq!(object["kind"], "ratelimiter");
    assert_eq!(object["name"], "exports");
    assert_eq!(
        object["rate_limit"],
        serde_json::json!({"permits": 10_000, "interval_ms": 86_400_000, "burst": 49, "mode": "per_client"})
    );
    // This client took everything; one that asked nothing could take burst + 1.
    assert_eq!(object["available"], 50, "{report}");
    assert_eq!(object["waiters_listed"], true);

    let text = stdout(&lockkit(&url, &["inspect", "--kind", "ratelimiter", "exports"]).await);
    assert!(
        text.contains("10000 per 86400s, burst 49 (up to 50 at once), per client")
            || text.contains("10000 per 1d, burst 49 (up to 50 at once), per client")
            || text.contains("10000 per 86400000ms, burst 49 (up to 50 at once), per client"),
        "{text}"
    );
}

/// "A rate limiter has no holders ...: it is **held while calls wait on it** ... its stored
/// limit alone is no hold"; `list --held` "exits 5 when there is one, 0 when there is none";
/// "`limit` says `none stored` when only reservations are left (the limit's key was lost ...)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_held_counts_a_limiter_held_only_while_calls_wait_and_none_stored_is_shown() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let limiter = client
        .rate_limiter("partner-api")
        .with_limit(RateLimit::new(1, Duration::from_secs(2)).unwrap());
    limiter.acquire(1).await.unwrap();
    // Only the limit (and spent permits): listed, not held.
    let output = lockkit(&url, &["--json", "list"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let listed = json(&output);
    assert_eq!(listed[0]["kind"], "ratelimiter", "{listed}");
    assert_eq!(listed[0]["held"], false, "{listed}");
    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(0), "nothing held: {output:?}");

    let sleeping = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    within("the reservation", async {
        while limiter.waiting().await.unwrap() != 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(5), "a call waits: {output:?}");
    assert!(stdout(&output).contains("partner-api"), "{output:?}");
    assert!(output.stderr.is_empty(), "{output:?}");

    // The limit's key lost while the call waits.
    redis
        .command(&["DEL", "lockkit:ratelimiter:{partner-api}"])
        .await
        .unwrap();
    let output = lockkit(&url, &["inspect", "--kind", "ratelimiter", "partner-api"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let text = stdout(&output);
    assert!(
        text.lines()
            .any(|l| l.starts_with("  limit          none stored")),
        "{text}"
    );
    let object = json(
        &lockkit(
            &url,
            &["--json", "inspect", "--kind", "ratelimiter", "partner-api"],
        )
        .await,
    );
    assert_eq!(object[0]["rate_limit"], Value::Null);
    assert_eq!(object[0]["available"], Value::Null);
    within("the sleeping call", sleeping)
        .await
        .unwrap()
        .unwrap();
}

/// Exit codes: "1 | not found: `inspect` of a missing object"; "3 | Redis error: ... a key
/// holding a value of another type".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_exit_codes_for_a_missing_limiter_and_a_wrong_type() {
    let redis = server().await;
    let url = redis.url();
    let output = lockkit(&url, &["inspect", "--kind", "ratelimiter", "nothing-here"]).await;
    assert_eq!(code(&output), Some(1), "{output:?}");
    redis
        .command(&["SET", "lockkit:ratelimiter:{taken}", "x"])
        .await
        .unwrap();
    let output = lockkit(&url, &["inspect", "--kind", "ratelimiter", "taken"]).await;
    assert_eq!(code(&output), Some(3), "{output:?}");
}

/// "`watch` prints a line when the limit, `available` or who waits changes — `available` also
/// grows back on its own as time passes"; "re-reads ... every second".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_a_line_when_a_call_waits_and_when_available_grows_back() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    // One every 1.5 s, up to 2 at once.
    let limit = RateLimit::new(2, Duration::from_secs(3))
        .unwrap()
        .with_burst(1)
        .unwrap();
    let limiter = client.rate_limiter("gateway").with_limit(limit);
    limiter.acquire(2).await.unwrap();
    let mut watch = Command::new(BIN)
        .args([
            "--url",
            &url,
            "--json",
            "watch",
            "--kind",
            "ratelimiter",
            "gateway",
            "--count",
            "2",
        ])
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut next = async || -> Value {
        let line = within("a watch line", lines.next_line())
            .await
            .unwrap()
            .expect("a line");
        serde_json::from_str(&line).unwrap()
    };
    let first = next().await;
    let object = &first["objects"][0];
    assert_eq!(object["available"], 0, "{first}");
    // A call waits: a line with its reservation.
    let sleeping = {
        let limiter = limiter.clone();
        tokio::spawn(async move { limiter.acquire(1).await })
    };
    let second = next().await;
    assert_eq!(
        second["objects"][0]["waiters"].as_array().map(Vec::len),
        Some(1),
        "{second}"
    );
    within("the sleeping call", sleeping)
        .await
        .unwrap()
        .unwrap();
    assert!(within("watch", watch.wait()).await.unwrap().success());

    // Nothing else happens: `available` grows back on its own, and watch says so.
    let mut watch = Command::new(BIN)
        .args([
            "--url",
            &url,
            "--json",
            "watch",
            "--kind",
            "ratelimiter",
            "gateway",
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
    let first: Value =
        serde_json::from_str(&within("a line", lines.next_line()).await.unwrap().unwrap()).unwrap();
    let before = first["objects"][0]["available"].as_u64().unwrap();
    let grown: Value =
        serde_json::from_str(&within("a line", lines.next_line()).await.unwrap().unwrap()).unwrap();
    let after = grown["objects"][0]["available"].as_u64().unwrap();
    assert!(after > before && after <= 2, "{first} then {grown}");
    assert!(within("watch", watch.wait()).await.unwrap().success());
}
