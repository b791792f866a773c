//! The seed's order service: stock is decremented under a **fenced** lock, and the storage
//! refuses any write whose fencing token is older than the last one it accepted —
//! `UPDATE stock SET qty = :qty, last_fence = :fence WHERE id = 42 AND last_fence <= :fence`
//! (`<=`: the holder may write more than once under one acquisition, with the same token).
//!
//! The scenario: worker A takes the lock with a short lease, reads the stock, then "pauses" (a GC
//! pause, a stalled VM) past its lease. Worker B takes the lock, sells one item and writes. When A
//! wakes up and writes its stale view, the storage rejects it because A's token is older. Without
//! the token check, A's write would silently undo B's sale.
//!
//! ```text
//! cargo run -p lockkit-examples --example order_service -- --url redis://127.0.0.1:6379
//! ```
//!
//! Exits with status 1 if the stale write was accepted (or B's sale is not the stock's final
//! state), 2 on bad arguments.

use std::process::ExitCode;
use std::time::Duration;

use fred::interfaces::{ClientLike, HashesInterface, LuaInterface};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: order_service [--url URL]

  --url URL   Redis to use (default: $REDIS_URL, else redis://127.0.0.1:6379)";

/// The storage's conditional write: the record keeps the token of the last accepted write.
const FENCED_UPDATE: &str = r"
local last = tonumber(redis.call('HGET', KEYS[1], 'last_fence') or '0')
if tonumber(ARGV[2]) < last then return 0 end
redis.call('HSET', KEYS[1], 'qty', ARGV[1], 'last_fence', ARGV[2])
return 1";

#[tokio::main]
async fn main() -> ExitCode {
    // lockkit reports through `tracing`: print its warnings (the README's advice).
    tracing_subscriber::fmt::init();
    let mut url =
        std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_owned());
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("-h" | "--help", _) => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            ("--url", Some(value)) => url = value,
            _ => {
                eprintln!("order_service: unexpected argument {arg:?}\n\n{USAGE}");
                return ExitCode::from(2);
            }
        }
    }
    match run(&url).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("order_service: {err}");
            ExitCode::FAILURE
        }
    }
}

async fn run(url: &str) -> Result<bool, BoxError> {
    let run_id = format!("{:x}", std::process::id());
    let record = format!("order-service:{run_id}:stock:42");
    let lock_name = format!("order-service:{run_id}:stock:42");

    let store =
        fred::types::Builder::from_config(fred::types::config::Config::from_url(url)?).build()?;
    store
        .init()
        .await
        .map_err(|err| format!("cannot connect to {url}: {err}"))?;
    let _: () = store
        .hset(&record, [("qty", "10"), ("last_fence", "0")])
        .await?;

    let pod_a = lockkit::Client::connect(url).await?;
    let pod_b = lockkit::Client::connect(url).await?;
    let write = |qty: i64, fence: u64| {
        let (store, record) = (store.clone(), record.clone());
        async move {
            let ok: i64 = store
                .eval(
                    FENCED_UPDATE,
                    vec![record],
                    vec![qty.to_string(), fence.to_string()],
                )
                .await?;
            Ok::<bool, BoxError>(ok == 1)
        }
    };

    // A takes the lock for 300 ms and reads the stock...
    let a = pod_a
        .fenced_lock(&lock_name)
        .lock_with_lease(Duration::from_millis(300))
        .await?;
    let a_token = a.fencing_token();
    let a_seen: i64 = store.hget(&record, "qty").await?;
    println!("A: lock taken, token {a_token}, sees qty = {a_seen}; now A pauses...");
    a.lost().await; // ... and is paused past its lease.
    println!(
        "A: (still paused) its lease has ended: lost = {}",
        a.is_lost()
    );

    // B gets the lock and sells one item.
    let b = pod_b.fenced_lock(&lock_name).lock().await?;
    let b_token = b.fencing_token();
    let qty: i64 = store.hget(&record, "qty").await?;
    let accepted = write(qty - 1, b_token).await?;
    println!(
        "B: lock taken, token {b_token}, sells one: qty {qty} -> {} (accepted: {accepted})",
        qty - 1
    );
    b.unlock().await?;

    // A wakes up and writes its stale view: it sells three from the 10 it saw.
    let stale_accepted = write(a_seen - 3, a_token).await?;
    println!(
        "A: wakes up and writes qty = {} with token {a_token}: {}",
        a_seen - 3,
        if stale_accepted {
            "ACCEPTED (lost update!)"
        } else {
            "rejected by the token check"
        }
    );
    let final_qty: i64 = store.hget(&record, "qty").await?;

    let _: i64 = fred::interfaces::KeysInterface::del(&store, &record).await?;
    pod_a.shutdown().await?;
    pod_b.shutdown().await?;

    println!();
    if accepted && !stale_accepted && final_qty == 9 {
        println!("OK: final qty = {final_qty}: B's sale is kept, A's stale write was refused.");
        Ok(true)
    } else {
        println!(
            "FAILED: final qty = {final_qty} (expected 9); B's write accepted: {accepted}, A's \
             stale write accepted: {stale_accepted}"
        );
        Ok(false)
    }
}
