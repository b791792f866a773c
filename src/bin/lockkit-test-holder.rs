//! Test support: a process that takes a lock, says `HELD`, and holds it until it is killed.
//!
//! `lockkit-test-holder <url> <name> <watchdog-timeout-ms> [fixed-lease-ms]`

use std::time::Duration;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, name, timeout, rest @ ..] = args.as_slice() else {
        return Err(
            "usage: lockkit-test-holder <url> <name> <watchdog-timeout-ms> [fixed-lease-ms]".into(),
        );
    };
    let client = lockkit::Client::builder()
        .url(url)
        .watchdog_timeout(Duration::from_millis(timeout.parse()?))
        .build()
        .await?;
    let lock = client.lock(name);
    let guard = match rest.first() {
        Some(lease) => {
            lock.lock_with_lease(Duration::from_millis(lease.parse()?))
                .await?
        }
        None => lock.lock().await?,
    };
    println!("HELD");
    guard.lost().await;
    println!("LOST");
    Ok(())
}
