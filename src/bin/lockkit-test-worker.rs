//! Test support for the reliability suite: a worker process that runs one critical section on a
//! [`Store`], step by step, so a test can kill or pause it at a chosen point. Every timestamp is
//! `CLOCK_MONOTONIC` ([`now`]), the same clock the test reads.
//!
//! `lockkit-test-worker <lock-url> <store-url> <resource> <lock-name> <lock|fenced> <watchdog-ms> [fixed-lease-ms]`
//!
//! 1. takes the lock (watchdog mode, or the fixed lease) and prints
//!    `HELD <acquired> <token|-> <invoked>` (`invoked`: when it called the acquire);
//! 2. reads the counter and checks its guard, and prints `READ <value> <lost 0|1>`;
//! 3. waits for a line `GO` on stdin (a test pauses or kills the worker here);
//! 4. writes `value + 1` (with its token, for a fenced lock, which the store checks) and prints
//!    `WROTE <accepted 0|1> <written-at> <lost 0|1> <checked-at>`;
//! 5. unlocks and prints `UNLOCKED ok|notheld|<error>`.

use std::time::Duration;

use lockkit_suite::checker::{now, Store};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [lock_url, store_url, resource, name, kind, watchdog_ms, rest @ ..] = args.as_slice()
    else {
        return Err(
            "usage: lockkit-test-worker <lock-url> <store-url> <resource> <lock-name> \
                    <lock|fenced> <watchdog-ms> [fixed-lease-ms]"
                .into(),
        );
    };
    let client = lockkit::Client::builder()
        .url(lock_url)
        .watchdog_timeout(Duration::from_millis(watchdog_ms.parse()?))
        .build()
        .await?;
    let store = Store::connect(store_url, resource).await;
    let lease = match rest.first() {
        Some(ms) => Some(Duration::from_millis(ms.parse()?)),
        None => None,
    };
    let wait = Duration::MAX;
    let invoked = now();
    let guard = match kind.as_str() {
        "lock" => client.lock(name).try_lock(wait, lease).await?,
        "fenced" => client
            .fenced_lock(name)
            .try_lock(wait, lease)
            .await?
            .map(lockkit::LockGuard::from),
        other => return Err(format!("unknown kind {other:?}").into()),
    }
    .ok_or("acquire without a bound returned nothing")?;
    let token = guard.fencing_token();
    let token_text = token.map_or_else(|| "-".to_owned(), |t| t.to_string());
    println!("HELD {} {token_text} {invoked}", now());

    let read = store.read().await?;
    println!("READ {read} {}", u8::from(guard.is_lost()));

    // Blocking read on a thread of its own: the runtime (and the watchdog) keep running.
    let go = tokio::task::spawn_blocking(|| {
        std::io::stdin()
            .lines()
            .any(|line| line.is_ok_and(|line| line.trim() == "GO"))
    });
    if !go.await? {
        return Err("stdin closed before GO".into());
    }

    let section = format!("worker-{}", std::process::id());
    let accepted = store.write(&section, read, token).await?;
    let written_at = now();
    let lost = guard.is_lost();
    println!(
        "WROTE {} {written_at} {} {}",
        u8::from(accepted),
        u8::from(lost),
        now()
    );
    match guard.unlock().await {
        Ok(()) => println!("UNLOCKED ok"),
        Err(lockkit::Error::NotHeld { .. }) => println!("UNLOCKED notheld"),
        Err(err) => println!("UNLOCKED {err}"),
    }
    client.shutdown().await?;
    Ok(())
}
