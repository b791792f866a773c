//! The 02:00 report job on three pods: it must run once, not once per pod.
//!
//! Three "pods" (three separate [`lockkit::Client`]s) fire the same scheduled job at the same
//! instant. Each makes one attempt at the lock `report:daily:<date>` without waiting
//! (`try_lock(Duration::ZERO, None)`); the winner generates the report, the others skip it.
//!
//! ```text
//! cargo run --example daily_report -- --url redis://127.0.0.1:6379
//! ```
//!
//! The winner releases the lock when the report is done. That is enough when the pods fire
//! within the report's duration of each other, as here; a pod whose schedule lags by more than
//! that would find the lock free and run the report again. A job that must run once per day
//! should also record that it ran (a `report:daily:<date>:done` key, or a row in the database),
//! and check that record under the lock.
//!
//! Exits with status 1 unless exactly one pod ran the report.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Barrier;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: daily_report [--url URL] [--pods N]

  --url URL   Redis to use (default: $REDIS_URL, else redis://127.0.0.1:6379)
  --pods N    pods firing the job at once (default 3)";

/// How long "generating the report" takes.
const REPORT_TIME: Duration = Duration::from_millis(500);

#[tokio::main]
async fn main() -> ExitCode {
    let mut url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let mut pods = 3usize;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let value = inline.or_else(|| {
            if matches!(flag.as_str(), "--url" | "--pods") {
                args.next()
            } else {
                None
            }
        });
        match (flag.as_str(), value) {
            ("--url", Some(value)) => url = value,
            ("--pods", Some(value)) => match value.parse::<usize>() {
                Ok(n) if n > 0 => pods = n,
                _ => {
                    return usage_error(&format!(
                        "--pods expects a positive integer, got {value:?}"
                    ))
                }
            },
            ("-h" | "--help", _) => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            ("--url" | "--pods", None) => return usage_error(&format!("{flag} needs a value")),
            _ => return usage_error(&format!("unknown argument {arg:?}")),
        }
    }
    match run(&url, pods).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("daily_report: {err}");
            ExitCode::FAILURE
        }
    }
}

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("daily_report: {msg}\n\n{USAGE}");
    ExitCode::from(2)
}

async fn run(url: &str, pods: usize) -> Result<bool, BoxError> {
    let date = utc_date();
    let lock_name = format!("report:daily:{date}");
    println!(
        "Daily report: it is 02:00 and the same scheduled job fires on {pods} pods at once; each \
         tries the lock {lock_name:?} once, without waiting, so only one generates the report."
    );

    let mut clients = Vec::with_capacity(pods);
    for _ in 0..pods {
        let client = lockkit::Client::connect(url)
            .await
            .map_err(|err| format!("cannot connect to {url}: {err}"))?;
        clients.push(client);
    }

    let barrier = Arc::new(Barrier::new(pods));
    let began = Instant::now();
    let mut jobs = Vec::with_capacity(pods);
    for (i, client) in clients.iter().enumerate() {
        let client = client.clone();
        let barrier = Arc::clone(&barrier);
        let lock_name = lock_name.clone();
        let date = date.clone();
        jobs.push(tokio::spawn(async move {
            let pod = format!(
                "pod-{} {}",
                i + 1,
                client.id().get(..8).unwrap_or(client.id())
            );
            barrier.wait().await; // 02:00:00 on every pod
            let lock = client.lock(lock_name.as_str());
            let Some(guard) = lock.try_lock(Duration::ZERO, None).await? else {
                println!(
                    "[{pod}] {:>6.1?}  another pod is running the report; skipping",
                    began.elapsed()
                );
                return Ok::<bool, lockkit::Error>(false);
            };
            println!(
                "[{pod}] {:>6.1?}  got the lock: generating the report for {date}",
                began.elapsed()
            );
            tokio::time::sleep(REPORT_TIME).await; // query, render, mail
            let lost = guard.is_lost();
            guard.unlock().await?;
            println!(
                "[{pod}] {:>6.1?}  report sent; lock released{}",
                began.elapsed(),
                if lost {
                    " (WARNING: the lease was lost)"
                } else {
                    ""
                }
            );
            Ok(true)
        }));
    }

    let mut ran = Vec::new();
    for (i, job) in jobs.into_iter().enumerate() {
        if job.await?? {
            ran.push(format!("pod-{}", i + 1));
        }
    }
    for client in &clients {
        client.shutdown().await?;
    }

    println!();
    if ran.len() == 1 {
        println!(
            "OK: the report ran once (on {}); the other {} pod(s) skipped it.",
            ran[0],
            pods - 1
        );
        Ok(true)
    } else {
        println!(
            "FAILED: the report ran {} times (expected once): {}",
            ran.len(),
            ran.join(", ")
        );
        Ok(false)
    }
}

/// Today's date in UTC as `YYYY-MM-DD` (civil-from-days, without a date crate).
fn utc_date() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let days = i64::try_from(secs / 86_400).unwrap_or(0) + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}
