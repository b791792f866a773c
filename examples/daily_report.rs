//! The 02:00 report job on three pods: it must run once, not once per pod.
//!
//! Three "pods" (three separate [`lockkit::Client`]s) run the same scheduled job, but their cron
//! ticks disagree: pod 2 fires 0.7 s after pod 1, pod 3 1.4 s after — later than the report takes
//! (0.5 s). A lock released when the report is done would let a late pod find it free and run the
//! report again. [`lockkit::Client::once_per`] sets a window mark in Redis (`SET NX PX`) that is
//! *not* removed when the job ends: the first pod runs the report, every pod that comes within the
//! window skips it, however late its tick.
//!
//! ```text
//! cargo run -p lockkit-examples --example daily_report -- --url redis://127.0.0.1:6379
//! ```
//!
//! Each run of the example uses its own job name (`report:daily:<date>:run-<n>`), so it can be run
//! again at once; a real job would use `report:daily:<date>` and a window of a few hours.
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
/// How far apart the pods' cron ticks are (longer than the report takes).
const TICK_SKEW: Duration = Duration::from_millis(700);
/// The window in which the report runs at most once.
const WINDOW: Duration = Duration::from_secs(3600);

#[tokio::main]
async fn main() -> ExitCode {
    // lockkit reports through `tracing`: print its warnings (the README's advice).
    tracing_subscriber::fmt::init();
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
    let run_id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let job_name = format!("report:daily:{date}:run-{run_id}");
    println!(
        "Daily report: the same scheduled job fires on {pods} pods, their cron ticks {TICK_SKEW:?} \
         apart; each calls once_per({job_name:?}, {WINDOW:?}), so only the first generates the \
         report."
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
        let job_name = job_name.clone();
        let date = date.clone();
        jobs.push(tokio::spawn(async move {
            let pod = format!(
                "pod-{} {}",
                i + 1,
                client.id().get(..8).unwrap_or(client.id())
            );
            barrier.wait().await;
            // This pod's clock is behind the first pod's by i × the skew: its 02:00 comes later.
            tokio::time::sleep(TICK_SKEW * u32::try_from(i).unwrap_or(u32::MAX)).await;
            println!(
                "[{pod}] {:>6.1?}  02:00 here: the job fires",
                began.elapsed()
            );
            let outcome = client
                .once_per(job_name.as_str(), WINDOW, || async {
                    println!(
                        "[{pod}] {:>6.1?}  first this window: generating the report for {date}",
                        began.elapsed()
                    );
                    tokio::time::sleep(REPORT_TIME).await; // query, render, mail
                    println!("[{pod}] {:>6.1?}  report sent", began.elapsed());
                })
                .await?;
            if outcome.is_skipped() {
                println!(
                    "[{pod}] {:>6.1?}  already done this window by another pod; skipping",
                    began.elapsed()
                );
            }
            Ok::<bool, lockkit::Error>(outcome.ran())
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
