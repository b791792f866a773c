//! The 100-ticket sale: several pods sell from one stock, and only the lock keeps them from
//! overselling.
//!
//! Three "pods" (three separate [`lockkit::Client`]s, each with its own id and connections, as
//! three processes would have) serve 150 buyers between them, 50 each, all at once. The first
//! pod is a batch handler: its buyers are futures of one task, run together by `join_all`. The stock is
//! a plain Redis string that every buyer updates the naive way: `GET stock`, a tiny await, then
//! `SET stock stock-1`. That read-modify-write is deliberately not atomic, so nothing but the lock
//! `ticket-sale:<run id>` stops two buyers from selling the same ticket.
//!
//! ```text
//! cargo run -p lockkit-examples --example ticket_sale -- --url redis://127.0.0.1:6379
//! cargo run -p lockkit-examples --example ticket_sale -- --no-lock     # the same sale without the lock
//! ```
//!
//! Exits with status 1 when a ticket was oversold or the outcome is not the expected one
//! (`min(buyers, tickets)` sold, the rest turned away, stock down by exactly the number sold).

use std::process::ExitCode;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::prelude::{
    Builder, Client as RedisClient, ClientLike, Config, Expiration, KeysInterface,
};
use tokio::sync::Barrier;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: ticket_sale [--url URL] [--pods N] [--buyers N] [--tickets N] [--no-lock]

  --url URL      Redis to use (default: $REDIS_URL, else redis://127.0.0.1:6379)
  --pods N       clients (\"pods\") selling concurrently (default 3)
  --buyers N     buyers in total, spread evenly over the pods (default 150)
  --tickets N    tickets in stock (default 100)
  --no-lock      skip the lock, to see the oversell it prevents (exits 1)";

/// How long a buyer waits for the lock before giving up.
const LOCK_WAIT: Duration = Duration::from_secs(10);

struct Args {
    url: String,
    pods: usize,
    buyers: usize,
    tickets: u64,
    use_lock: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        url: std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned()),
        pods: 3,
        buyers: 150,
        tickets: 100,
        use_lock: true,
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
            "--buyers" => args.buyers = number(&flag, &value()?)?,
            "--tickets" => args.tickets = number(&flag, &value()?)?,
            "--no-lock" => args.use_lock = false,
            "-h" | "--help" => return Err(String::new()),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    if args.pods == 0 {
        return Err("--pods must be at least 1".into());
    }
    Ok(args)
}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value
        .parse()
        .map_err(|_| format!("{flag} expects a non-negative integer, got {value:?}"))
}

/// What happened to one buyer.
enum Outcome {
    Bought,
    SoldOut,
    GaveUp,
    Failed(String),
}

/// One pod: a lockkit client plus its own connection to the stock.
struct Pod {
    locks: lockkit::Client,
    store: RedisClient,
}

#[derive(Default)]
struct Tally {
    buyers: usize,
    sold: u64,
    turned_away: usize,
    gave_up: usize,
    failed: usize,
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
            eprintln!("ticket_sale: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("ticket_sale: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<bool, BoxError> {
    let guard_text = if args.use_lock {
        "only the lockkit lock stops them from overselling"
    } else {
        "WITHOUT the lock (--no-lock), so expect an oversell"
    };
    println!(
        "Ticket sale: {} pods (separate lockkit clients) serve {} buyers at once from {} tickets; \
         the stock is a plain Redis string updated by GET, await, SET, and {guard_text}.",
        args.pods, args.buyers, args.tickets
    );

    let run_id = run_id();
    let lock_name = format!("ticket-sale:{run_id}");
    let stock_key = format!("ticket-sale:{run_id}:stock");

    let mut pods = Vec::with_capacity(args.pods);
    for _ in 0..args.pods {
        let locks = lockkit::Client::connect(args.url.as_str())
            .await
            .map_err(|err| format!("cannot connect to {}: {err}", args.url))?;
        let store = Builder::from_config(Config::from_url(&args.url)?).build()?;
        store.init().await?;
        pods.push(Arc::new(Pod { locks, store }));
    }
    // The stock outlives a crashed run by an hour at most.
    let stock = i64::try_from(args.tickets)?;
    pods[0]
        .store
        .set::<(), _, _>(
            stock_key.as_str(),
            stock,
            Some(Expiration::EX(3600)),
            None,
            false,
        )
        .await?;
    println!(
        "run {run_id}: lock {lock_name:?}, stock key {stock_key:?} = {}\n",
        args.tickets
    );

    let inside = Arc::new(AtomicUsize::new(0));
    let max_inside = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(args.buyers));
    let began = Instant::now();
    let mut buyers = Vec::with_capacity(args.buyers);
    // The first pod is a batch handler: all its buyers are futures of ONE task, polled together
    // by `join_all` (as a handler of a batch of orders would). Each plain acquire is an owner of
    // its own, so they exclude each other exactly as buyers in separate tasks do. (lockkit 0.1.0
    // made the task the owner, and let every future of such a batch in at once.)
    let mut batch = Vec::new();
    for buyer in 0..args.buyers {
        let pod_index = buyer % args.pods;
        let pod = Arc::clone(&pods[pod_index]);
        let (lock_name, stock_key) = (lock_name.clone(), stock_key.clone());
        let (inside, max_inside, start) = (inside.clone(), max_inside.clone(), start.clone());
        let use_lock = args.use_lock;
        let purchase = async move {
            start.wait().await;
            let outcome = if use_lock {
                buy_with_lock(&pod, &lock_name, &stock_key, &inside, &max_inside).await
            } else {
                buy(&pod.store, &stock_key, &inside, &max_inside).await
            };
            (
                pod_index,
                outcome.unwrap_or_else(|err| Outcome::Failed(err.to_string())),
            )
        };
        if pod_index == 0 {
            batch.push(purchase);
        } else {
            buyers.push(tokio::spawn(purchase));
        }
    }
    let batch = tokio::spawn(futures::future::join_all(batch));

    let mut tallies: Vec<Tally> = (0..args.pods).map(|_| Tally::default()).collect();
    let mut failures = Vec::new();
    let mut outcomes = batch.await?;
    for buyer in buyers {
        outcomes.push(buyer.await?);
    }
    for (pod, outcome) in outcomes {
        let tally = &mut tallies[pod];
        tally.buyers += 1;
        match outcome {
            Outcome::Bought => tally.sold += 1,
            Outcome::SoldOut => tally.turned_away += 1,
            Outcome::GaveUp => tally.gave_up += 1,
            Outcome::Failed(err) => {
                tally.failed += 1;
                failures.push(format!("pod-{}: {err}", pod + 1));
            }
        }
    }
    let elapsed = began.elapsed();

    let final_stock: Option<i64> = pods[0].store.get(stock_key.as_str()).await?;
    let final_stock = final_stock.ok_or("the stock key vanished")?;
    let _: i64 = pods[0].store.del(stock_key.as_str()).await?;
    for pod in &pods {
        pod.locks.shutdown().await?;
        pod.store.quit().await?;
    }

    println!("pod     client id  buyers  tickets sold  turned away  gave up  errors");
    for (i, (tally, pod)) in tallies.iter().zip(&pods).enumerate() {
        println!(
            "pod-{:<3} {:<9}  {:>6}  {:>12}  {:>11}  {:>7}  {:>6}",
            i + 1,
            pod.locks.id().get(..8).unwrap_or(pod.locks.id()),
            tally.buyers,
            tally.sold,
            tally.turned_away,
            tally.gave_up,
            tally.failed
        );
    }
    for failure in &failures {
        println!("  error: {failure}");
    }

    let sold: u64 = tallies.iter().map(|t| t.sold).sum();
    let turned_away: usize = tallies.iter().map(|t| t.turned_away).sum();
    let gave_up: usize = tallies.iter().map(|t| t.gave_up).sum();
    let expected_sold = args.tickets.min(args.buyers as u64);
    let expected_stock = stock - i64::try_from(expected_sold)?;
    let expected_away = args.buyers - expected_sold as usize;
    let max_inside = max_inside.load(Ordering::Relaxed);

    println!();
    println!("final stock         {final_stock:>5}   (expected {expected_stock})");
    println!("tickets sold        {sold:>5}   (expected {expected_sold})");
    println!("buyers turned away  {turned_away:>5}   (expected {expected_away})");
    println!("max buyers inside the critical section at once: {max_inside}");
    println!("took {:.2?}", elapsed);
    println!();

    let mut problems = Vec::new();
    if sold > args.tickets {
        problems.push(format!(
            "OVERSOLD: buyers were sold {sold} tickets but only {} existed",
            args.tickets
        ));
    }
    let decrement = stock - final_stock;
    if i64::try_from(sold)? != decrement {
        problems.push(format!(
            "LOST UPDATES: {sold} tickets sold but the stock went down by {decrement}"
        ));
    }
    if final_stock < 0 {
        problems.push(format!("NEGATIVE STOCK: {final_stock}"));
    }
    if max_inside > 1 {
        problems.push(format!(
            "OVERLAP: {max_inside} buyers were in the critical section at the same time"
        ));
    }
    if problems.is_empty()
        && (sold != expected_sold
            || final_stock != expected_stock
            || turned_away != expected_away
            || gave_up > 0
            || !failures.is_empty())
    {
        problems.push(format!(
            "UNEXPECTED OUTCOME: {gave_up} buyers gave up waiting for the lock, {} failed",
            failures.len()
        ));
    }
    if problems.is_empty() {
        println!(
            "OK: no ticket oversold — the stock ended at {final_stock}, every sale accounted for."
        );
        Ok(true)
    } else {
        for problem in &problems {
            println!("{problem}");
        }
        Ok(false)
    }
}

/// A buyer under the lock: wait up to [`LOCK_WAIT`], then read-modify-write the stock.
async fn buy_with_lock(
    pod: &Pod,
    lock_name: &str,
    stock_key: &str,
    inside: &AtomicUsize,
    max_inside: &AtomicUsize,
) -> Result<Outcome, BoxError> {
    let lock = pod.locks.lock(lock_name);
    let Some(guard) = lock.try_lock(LOCK_WAIT, None).await? else {
        return Ok(Outcome::GaveUp);
    };
    let outcome = buy(&pod.store, stock_key, inside, max_inside).await;
    if guard.is_lost() {
        return Err(format!("lost the lease on {lock_name} inside the critical section").into());
    }
    // An `Err(NotHeld)` here would mean the hold ran out while we sold: report it.
    guard.unlock().await?;
    outcome
}

/// The naive sale: GET the stock, await, SET it one lower. Not atomic on purpose.
async fn buy(
    store: &RedisClient,
    stock_key: &str,
    inside: &AtomicUsize,
    max_inside: &AtomicUsize,
) -> Result<Outcome, BoxError> {
    let now_inside = inside.fetch_add(1, Ordering::SeqCst) + 1;
    max_inside.fetch_max(now_inside, Ordering::SeqCst);
    let result = async {
        let stock: Option<i64> = store.get(stock_key).await?;
        let stock = stock.ok_or("the stock key is missing")?;
        if stock <= 0 {
            return Ok(Outcome::SoldOut);
        }
        // Payment, seat assignment, ...: long enough for another buyer to read the same stock.
        tokio::time::sleep(Duration::from_millis(1)).await;
        store
            .set::<(), _, _>(stock_key, stock - 1, Some(Expiration::KEEPTTL), None, false)
            .await?;
        Ok(Outcome::Bought)
    }
    .await;
    inside.fetch_sub(1, Ordering::SeqCst);
    result
}

/// A short id that keeps this run's keys apart from other runs on the same Redis.
fn run_id() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{:x}-{:x}", std::process::id(), nanos & 0xffff_ffff)
}
