//! A partner API that allows N requests a second for the whole account, called from three pods.
//!
//! Three "pods" (three separate [`lockkit::Client`]s, each with its own id and connections, as
//! three processes would have) run several workers each. Every worker calls the partner as often
//! as it can, for a few seconds; before each call it takes one permit of the same
//! [`lockkit::RateLimiter`], which every pod configures with [`with_limit`]. Alone, each pod would
//! send N a second; together they must send N a second, not three times that.
//!
//! ```text
//! cargo run -p lockkit-examples --example partner_api -- --url redis://127.0.0.1:6379
//! cargo run -p lockkit-examples --example partner_api -- --rate 50 --workers 8 --seconds 5
//! cargo run -p lockkit-examples --example partner_api -- --per-pod   # a limiter per pod (exits 1)
//! ```
//!
//! It prints how many calls each pod made, then checks the admitted moments (the server's clock,
//! [`RateAdmission::admitted_at`]): no window of one second, starting anywhere, saw more than N
//! calls. Exits with status 1 when one did, or when a call failed.
//!
//! [`with_limit`]: lockkit::RateLimiter::with_limit
//! [`RateAdmission::admitted_at`]: lockkit::RateAdmission::admitted_at

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fred::prelude::{Builder, ClientLike, Config, KeysInterface};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::RateLimit;
use tokio::time::Instant;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: partner_api [--url URL] [--pods N] [--workers N] [--rate N] [--seconds N] [--per-pod]

  --url URL      Redis to use (default: $REDIS_URL, else redis://127.0.0.1:6379)
  --pods N       clients (\"pods\") calling the partner (default 3)
  --workers N    workers per pod, each calling as fast as the limit lets it (default 4)
  --rate N       the partner's limit: calls per second for the whole account (default 20)
  --seconds N    how long the workers keep calling (default 3)
  --per-pod      give each pod a limiter of its own, as a per-process limiter would: the
                 account then sees N calls a second per pod (exits 1)";

struct Args {
    url: String,
    pods: usize,
    workers: usize,
    rate: u64,
    seconds: u64,
    per_pod: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
        pods: 3,
        workers: 4,
        rate: 20,
        seconds: 3,
        per_pod: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--url" => args.url = value()?,
            "--pods" => args.pods = number(&flag, &value()?)?,
            "--workers" => args.workers = number(&flag, &value()?)?,
            "--rate" => args.rate = number(&flag, &value()?)?,
            "--seconds" => args.seconds = number(&flag, &value()?)?,
            "--per-pod" => args.per_pod = true,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if args.pods == 0 || args.workers == 0 || args.seconds == 0 {
        return Err("--pods, --workers and --seconds must be at least 1".into());
    }
    Ok(args)
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} expects a non-negative integer, got {value:?}"))
}

#[tokio::main]
async fn main() -> ExitCode {
    // lockkit reports through `tracing`: print its warnings (the README's advice).
    tracing_subscriber::fmt::init();
    let args = match parse_args() {
        Ok(args) => args,
        Err(msg) if msg.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("partner_api: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("partner_api: {err}");
            ExitCode::FAILURE
        }
    }
}

/// One admitted call: which pod made it, and when it was admitted (server clock, µs).
type Call = (usize, u64);

async fn run(args: Args) -> Result<bool, BoxError> {
    // `RateLimit::per_second` refuses a rate of 0 (and more than one a microsecond).
    let limit = RateLimit::per_second(args.rate)?;
    let name = format!("partner-api:{}", run_id());
    println!(
        "Partner API: {} calls a second for the whole account; {} pods x {} workers call it for \
         {} s, each call after one permit of the rate limiter {name:?}.\n",
        args.rate, args.pods, args.workers, args.seconds
    );

    if args.per_pod {
        println!(
            "--per-pod: each pod has a limiter of its own, so expect the account over its limit.\n"
        );
    }
    // The limiter's name per pod: the same for all, unless `--per-pod`.
    let names: Vec<String> = (0..args.pods)
        .map(|pod| {
            if args.per_pod {
                format!("{name}:pod-{}", pod + 1)
            } else {
                name.clone()
            }
        })
        .collect();
    let mut pods = Vec::with_capacity(args.pods);
    for _ in 0..args.pods {
        pods.push(
            lockkit::Client::connect(args.url.as_str())
                .await
                .map_err(|err| format!("cannot connect to {}: {err}", args.url))?,
        );
    }

    let calls: Arc<Mutex<Vec<Call>>> = Arc::default();
    let began = Instant::now();
    let until = began + Duration::from_secs(args.seconds);
    let mut workers = tokio::task::JoinSet::new();
    for (pod_index, pod) in pods.iter().enumerate() {
        for _ in 0..args.workers {
            // Every pod configures the same limit: the first request stores it, and a pod stores
            // it again should Redis lose it.
            let partner = pod
                .rate_limiter(names[pod_index].as_str())
                .with_limit(limit);
            let calls = Arc::clone(&calls);
            workers.spawn(async move {
                while Instant::now() < until {
                    let admission = partner.acquire(1).await?;
                    let at = admission
                        .admitted_at()
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |at| at.as_micros() as u64);
                    // The call to the partner would go here.
                    calls
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((pod_index, at));
                }
                Ok::<(), lockkit::Error>(())
            });
        }
    }
    let mut failures = Vec::new();
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(err)) => failures.push(err.to_string()),
            Err(err) => failures.push(format!("a worker panicked: {err}")),
        }
    }
    let elapsed = began.elapsed();

    // The limiter's keys (the limit has no expiry): removed, as a finished job would.
    let redis = Builder::from_config(Config::from_url(&args.url)?).build()?;
    redis.init().await?;
    for name in &names {
        let keys = Namespace::default().object(Kind::RateLimiter, name)?.keys;
        let _: i64 = redis.del(keys).await?;
    }
    redis.quit().await?;
    for pod in &pods {
        pod.shutdown().await?;
    }

    let mut calls = std::mem::take(
        &mut *calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    calls.sort_by_key(|(_, at)| *at);
    println!("pod     client id  calls");
    for (index, pod) in pods.iter().enumerate() {
        let made = calls.iter().filter(|(p, _)| *p == index).count();
        println!(
            "pod-{:<3} {:<9}  {made:>5}",
            index + 1,
            pod.id().get(..8).unwrap_or(pod.id()),
        );
    }
    let moments: Vec<u64> = calls.iter().map(|(_, at)| *at).collect();
    let (busiest, from) = busiest_second(&moments);
    let span = match (moments.first(), moments.last()) {
        (Some(first), Some(last)) if last > first => (last - first) as f64 / 1e6,
        _ => 0.0,
    };
    println!("total   {:>19}", moments.len());
    println!();
    println!(
        "admitted over {span:.2} s of server time ({:.1} a second; the limit is {}); took {:.2?}",
        if span > 0.0 {
            (moments.len() - 1) as f64 / span
        } else {
            0.0
        },
        args.rate,
        elapsed
    );
    let first = moments.first().copied().unwrap_or(0);
    println!(
        "the busiest window of one second (server clock) admitted {busiest} calls{}",
        from.map_or(String::new(), |from| format!(
            ", the one starting {:.3} s after the first call",
            (from - first) as f64 / 1e6
        ))
    );
    for failure in &failures {
        println!("  error: {failure}");
    }
    println!();
    if busiest as u64 > args.rate {
        println!(
            "OVER THE LIMIT: {busiest} calls within one second, the partner allows {}",
            args.rate
        );
        return Ok(false);
    }
    if !failures.is_empty() {
        println!("FAILED: {} worker(s) failed", failures.len());
        return Ok(false);
    }
    println!(
        "OK: {} pods x {} workers, and no second saw more than {} calls.",
        args.pods, args.workers, args.rate
    );
    Ok(true)
}

/// The most moments (sorted, µs) within any window of one second `[t, t + 1 s)`, and where the
/// first such window starts. A window that holds the most starts at one of the moments.
fn busiest_second(moments: &[u64]) -> (usize, Option<u64>) {
    let mut busiest = (0, None);
    let mut end = 0;
    for (start, from) in moments.iter().enumerate() {
        while end < moments.len() && moments[end] < from + 1_000_000 {
            end += 1;
        }
        if end - start > busiest.0 {
            busiest = (end - start, Some(*from));
        }
    }
    busiest
}

/// A short id that keeps this run's keys apart from other runs on the same Redis.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos & 0xffff_ffff)
}
