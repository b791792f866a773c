//! Contention runner for `rslock` (lockkit's contention bench, `benches/contention.rs`).
//!
//! Usage (through `benches/peers/run`): `lockkit-peer-rslock rslock --url URL --name NAME
//! --workers W --hold-ms H --think-ms T --secs D`.
//!
//! W tokio tasks, each with its own `LockManager` (so its own connection), all started together,
//! loop until start + D: called = now; `LockManager::acquire` (loops until acquired; rslock's
//! defaults: 3 tries 0–200 ms apart per `lock` call, lease 30 s); acquired = now; hold H if still
//! before the deadline (exactly H, as lockkit's workers hold: see [`hold`]); unlocking = now; release; record `[worker, called, acquired, unlocking]`;
//! think T if still before the deadline. Prints one line of JSON on stdout; all instants are
//! nanoseconds of `Instant` since one origin.
//!
//! `lockkit-peer-rslock rslock --url URL --name NAME --uncontended N --round R`: the uncontended
//! row instead: one `LockManager` and one redis-rs connection; N lock + unlock (`acquire` +
//! `release`) and N `PING`s after as many for warm-up, interleaved in rounds of R of each; prints
//! `{"ping_p50_ns":..,"lock_unlock_p50_ns":..}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rslock::LockManager;

const LEASE: Duration = Duration::from_secs(30);

struct Args {
    url: String,
    name: String,
    workers: usize,
    hold: Duration,
    think: Duration,
    secs: f64,
}

fn parse() -> Args {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let (peer, rest) = argv.split_first().expect("usage: rslock --url URL ...");
    assert_eq!(peer, "rslock", "this runner only runs rslock");
    let mut map = HashMap::new();
    for pair in rest.chunks(2) {
        let key = pair[0].trim_start_matches("--").to_owned();
        let value = pair.get(1).unwrap_or_else(|| panic!("no value for {key}"));
        map.insert(key, value.clone());
    }
    let get = |key: &str| -> String {
        map.get(key)
            .cloned()
            .unwrap_or_else(|| panic!("missing --{key}"))
    };
    let num = |key: &str| -> f64 { get(key).parse().unwrap_or_else(|_| panic!("bad --{key}")) };
    Args {
        url: get("url"),
        name: get("name"),
        workers: num("workers") as usize,
        hold: Duration::from_secs_f64(num("hold-ms") / 1e3),
        think: Duration::from_secs_f64(num("think-ms") / 1e3),
        secs: num("secs"),
    }
}

/// How long before a hold's end [`hold`] stops sleeping on tokio's timer and starts yielding:
/// the timer has a 1 ms resolution and rounds up, so a sleep ends up to about 1.2 ms late.
const HOLD_SPIN: Duration = Duration::from_millis(2);

/// Holds until `end`, exactly: a tokio sleep until [`HOLD_SPIN`] before it (a plain
/// `tokio::time::sleep(H)` holds 11.2 ms for H = 10 ms), then yields to the runtime until `end`.
/// The same as lockkit's workers (`benches/contention.rs`, `hold`), so both Rust libraries hold
/// exactly H.
async fn hold(end: Instant) {
    if let Some(early) = end.checked_sub(HOLD_SPIN) {
        tokio::time::sleep_until(early.into()).await;
    }
    while Instant::now() < end {
        std::hint::spin_loop();
        tokio::task::yield_now().await;
    }
}

/// The uncontended row (see the module documentation), when `--uncontended` is given.
async fn uncontended() -> Option<()> {
    let argv: Vec<String> = std::env::args().collect();
    let arg = |key: &str| {
        let at = argv.iter().position(|a| a == key)?;
        argv.get(at + 1).cloned()
    };
    let samples: usize = arg("--uncontended")?.parse().expect("bad --uncontended");
    let round: usize = arg("--round").map_or(50, |r| r.parse().expect("bad --round"));
    let url = arg("--url").expect("missing --url");
    let name = arg("--name").expect("missing --name");
    let manager = LockManager::new(vec![url.clone()]);
    let client = redis::Client::open(url.as_str()).expect("a redis URL");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connected");
    let mut pings = Vec::with_capacity(samples);
    let mut locks = Vec::with_capacity(samples);
    for warm in [true, false] {
        for _ in 0..samples / round {
            for _ in 0..round {
                let start = Instant::now();
                let _: String = redis::cmd("PING")
                    .query_async(&mut con)
                    .await
                    .expect("PING");
                if !warm {
                    pings.push(start.elapsed());
                }
            }
            for _ in 0..round {
                let start = Instant::now();
                let guard = manager
                    .acquire(name.as_bytes(), LEASE)
                    .await
                    .expect("acquire");
                guard.release().await;
                if !warm {
                    locks.push(start.elapsed());
                }
            }
        }
    }
    let median = |mut v: Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2].as_nanos() as u64
    };
    let out = serde_json::json!({
        "peer": "rslock",
        "ping_p50_ns": median(pings),
        "lock_unlock_p50_ns": median(locks),
    });
    println!("{out}");
    Some(())
}

#[tokio::main]
async fn main() {
    if uncontended().await.is_some() {
        return;
    }
    let args = Arc::new(parse());
    let origin = Instant::now();
    let ns = move |t: Instant| t.duration_since(origin).as_nanos() as u64;
    let managers: Vec<LockManager> = (0..args.workers)
        .map(|_| LockManager::new(vec![args.url.clone()]))
        .collect();
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(args.secs);
    let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let tasks: Vec<_> = managers
        .into_iter()
        .enumerate()
        .map(|(index, manager)| {
            let args = Arc::clone(&args);
            let errors = Arc::clone(&errors);
            tokio::spawn(async move {
                let mut events = Vec::new();
                while Instant::now() < deadline {
                    let called = Instant::now();
                    let guard = match manager.acquire(args.name.as_bytes(), LEASE).await {
                        Ok(guard) => guard,
                        Err(err) => {
                            errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            eprintln!("rslock worker {index}: acquire failed: {err}");
                            continue;
                        }
                    };
                    let acquired = Instant::now();
                    if acquired < deadline && !args.hold.is_zero() {
                        hold(acquired + args.hold).await;
                    }
                    let unlocking = Instant::now();
                    guard.release().await;
                    events.push([index as u64, ns(called), ns(acquired), ns(unlocking)]);
                    if !args.think.is_zero() && Instant::now() < deadline {
                        tokio::time::sleep(args.think).await;
                    }
                }
                events
            })
        })
        .collect();
    let mut events = Vec::new();
    for task in tasks {
        events.extend(task.await.expect("a worker panicked"));
    }
    let out = serde_json::json!({
        "peer": "rslock",
        "version": "0.10.0",
        "workers": args.workers,
        "start_ns": ns(start),
        "deadline_ns": ns(deadline),
        "events": events,
        "errors": errors.load(std::sync::atomic::Ordering::Relaxed),
    });
    println!("{out}");
}
