//! A holder process that crashes (SIGKILL) keeps the lock only until its lease ends.

use std::process::Stdio;
use std::time::Duration;

use lockkit_suite::{client, redis, unique, within};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const HANG: Duration = Duration::from_secs(60);

async fn crash_a_holder(mode: &[&str]) {
    let redis = redis().await;
    let url = redis.url();
    let name = unique("crash");
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockkit-test-holder"))
        .arg(&url)
        .arg(&name)
        .args(mode)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let first = within(HANG, "holder start", lines.next_line())
        .await
        .unwrap();
    assert_eq!(first.as_deref(), Some("HELD"));

    child.kill().await.unwrap(); // SIGKILL: no release, no goodbye

    let survivor = client(&url).await;
    let lock = survivor.lock(&name);
    assert!(
        lock.try_lock(Duration::ZERO, None).await.unwrap().is_none(),
        "the crashed holder's lease still protects the lock"
    );
    assert!(lock.remaining_ttl().await.unwrap().is_some());
    let guard = within(HANG, "acquire after the crash", lock.lock())
        .await
        .unwrap();
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_crashed_watchdog_holder_frees_the_lock_when_its_lease_ends() {
    crash_a_holder(&["600"]).await;
}

#[tokio::test]
async fn a_crashed_fixed_lease_holder_frees_the_lock_when_its_lease_ends() {
    crash_a_holder(&["30000", "600"]).await;
}
