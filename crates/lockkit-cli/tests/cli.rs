//! The `lockkit` binary against a real redis-server: its JSON output and its exit codes.

mod common;

use std::process::{Output, Stdio};
use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit::{Client, Error};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use common::*;

/// The one object of `kind` in an `inspect --json` array.
fn object<'a>(found: &'a Value, kind: &str) -> &'a Value {
    let objects = found.as_array().expect("an array");
    let matching: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(matching.len(), 1, "one {kind} in {found}");
    matching[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_hold_counts_queued_waiters_and_the_fencing_counter() {
    let redis = server().await;
    let url = redis.url();
    let owner = client(&url).await;
    let other = client(&url).await;

    // A Lock held twice by one owner: a re-entry in the first hold's scope.
    let lock = owner.lock("order:42");
    let first = lock.lock().await.unwrap();
    let second = first.scope(lock.lock()).await.unwrap();
    let found = json(&lockkit(&url, &["--json", "inspect", "order:42"]).await);
    let held = object(&found, "lock");
    assert_eq!(held["name"], "order:42");
    assert_eq!(held["key"], "lockkit:lock:{order:42}");
    assert_eq!(held["holders"].as_array().unwrap().len(), 1, "{held}");
    assert_eq!(held["holders"][0]["holds"], 2);
    let holder = held["holders"][0]["owner"].as_str().unwrap();
    assert!(
        holder.starts_with(owner.id()),
        "{holder} is {}'s",
        owner.id()
    );
    assert!(
        held["ttl_ms"].as_u64().unwrap() > 0,
        "a watchdog lease: {held}"
    );
    assert_eq!(held["waiters"], Value::Array(vec![]));

    // A FairLock with one waiter queued behind its holder.
    let fair = owner.fair_lock("queue:1");
    let fair_guard = fair.lock().await.unwrap();
    let waiter = tokio::spawn({
        let fair = other.fair_lock("queue:1");
        async move { fair.lock().await.map(|guard| guard.is_lost()) }
    });
    // The waiter registers with its client's hub only after its first try queued it in Redis.
    within("the waiter to queue", async {
        while other.waiting_count() < 1 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let found = json(&lockkit(&url, &["--json", "inspect", "--kind", "fair", "queue:1"]).await);
    let queue = object(&found, "fair");
    assert_eq!(queue["holders"][0]["holds"], 1);
    let waiters = queue["waiters"].as_array().unwrap();
    assert_eq!(waiters.len(), 1, "{queue}");
    assert!(
        waiters[0].as_str().unwrap().starts_with(other.id()),
        "{queue}"
    );

    // A FencedLock after 3 acquisitions: the counter is the last token.
    let fenced = owner.fenced_lock("stock");
    for _ in 0..2 {
        fenced.lock().await.unwrap().unlock().await.unwrap();
    }
    let fenced_guard = fenced.lock().await.unwrap();
    let token = fenced_guard.fencing_token();
    let found = json(&lockkit(&url, &["--json", "inspect", "stock"]).await);
    assert_eq!(object(&found, "fenced")["fencing_token"], token);

    // The human table says the same.
    let table = lockkit(&url, &["inspect", "order:42"]).await;
    assert_eq!(code(&table), Some(0));
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("lock \"order:42\""), "{table}");
    assert!(table.contains(holder), "{table}");

    // Free locks keep no state: after the releases the lock is gone.
    fair_guard.unlock().await.unwrap();
    assert!(!within("the waiter", waiter).await.unwrap().unwrap());
    second.unlock().await.unwrap();
    first.unlock().await.unwrap();
    let gone = lockkit(&url, &["--json", "inspect", "--kind", "lock", "order:42"]).await;
    assert_eq!(code(&gone), Some(1));
    assert_eq!(json(&gone), Value::Array(vec![]));
    fenced_guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_finds_objects_and_a_pattern_filters_them() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let _a = client.lock("order:1").lock().await.unwrap();
    let _b = client.fair_lock("order:2").lock().await.unwrap();
    let _c = client.fenced_lock("cart:{user7}").lock().await.unwrap();
    // Another application's keys are not listed.
    let other = Client::builder()
        .url(url.clone())
        .key_prefix("billing")
        .build()
        .await
        .unwrap();
    let _d = other.lock("order:3").lock().await.unwrap();

    let listed = |output: Output| -> Vec<(String, String)> {
        assert_eq!(code(&output), Some(0), "{output:?}");
        json(&output)
            .as_array()
            .unwrap()
            .iter()
            .map(|o| {
                (
                    o["kind"].as_str().unwrap().to_owned(),
                    o["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    let pair = |kind: &str, name: &str| (kind.to_owned(), name.to_owned());
    assert_eq!(
        listed(lockkit(&url, &["--json", "list"]).await),
        vec![
            pair("lock", "order:1"),
            pair("fenced", "cart:{user7}"),
            pair("fair", "order:2"),
        ]
    );
    assert_eq!(
        listed(lockkit(&url, &["--json", "list", "order:*"]).await),
        vec![pair("lock", "order:1"), pair("fair", "order:2")]
    );
    assert_eq!(
        listed(lockkit(&url, &["--json", "--prefix", "billing", "list"]).await),
        vec![pair("lock", "order:3")]
    );
    let table = lockkit(&url, &["list", "cart:*"]).await;
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("fenced       cart:{user7}"), "{table}");
    assert!(!table.contains("order"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_needs_confirmation_and_the_holder_loses_the_lock() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let lock = client.lock("stuck");
    let guard = lock.lock().await.unwrap();

    // No terminal and no --yes: refused, the lock still held.
    let refused = lockkit(&url, &["force-unlock", "stuck"]).await;
    assert_eq!(code(&refused), Some(4), "{refused:?}");
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--yes"));
    assert!(lock.is_locked().await.unwrap());
    assert!(!guard.is_lost());

    let done = lockkit(&url, &["force-unlock", "--yes", "stuck"]).await;
    assert_eq!(code(&done), Some(0), "{done:?}");
    assert!(!lock.is_locked().await.unwrap());
    assert!(matches!(guard.unlock().await, Err(Error::NotHeld { .. })));

    // A free lock: nothing to unlock.
    let free = lockkit(&url, &["force-unlock", "--yes", "stuck"]).await;
    assert_eq!(code(&free), Some(1), "{free:?}");
}

/// `force-unlock` of a name that is no lock says what is there, rather than "no lock is held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_of_a_semaphore_says_it_is_no_lock() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let semaphore = client.semaphore("pool");
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let _permit = semaphore.acquire(1).await.unwrap();
    let output = lockkit(&url, &["force-unlock", "--yes", "pool"]).await;
    assert_eq!(code(&output), Some(2), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "lockkit: \"pool\" is a semaphore, not a lock: force-unlock is for locks (lock, fenced, \
         fair, rwlock, spin)\n"
    );
    let missing = lockkit(&url, &["force-unlock", "--yes", "nobody"]).await;
    assert_eq!(code(&missing), Some(1), "{missing:?}");
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("nothing is named \"nobody\""),
        "{missing:?}"
    );
}

/// `inspect` of a semaphore with waiting tasks says that Redis does not keep its waiters and how
/// many clients wait, instead of `waiters none`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_of_a_semaphore_with_waiting_tasks_does_not_say_none() {
    let redis = server().await;
    let url = redis.url();
    let holder = client(&url).await;
    let semaphore = holder.semaphore("gpus");
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let permit = semaphore.acquire(1).await.unwrap();
    let pod = client(&url).await;
    let mut waiting = Vec::new();
    for _ in 0..28 {
        let semaphore = pod.semaphore("gpus");
        waiting.push(tokio::spawn(async move {
            semaphore.acquire(1).await?.release().await
        }));
    }
    // Issue 28: a semaphore's waiters stand in a line in Redis, listed head first.
    let expected = " for 1\n";
    let text = within("the waiting client to show", async {
        loop {
            let output = lockkit(&url, &["inspect", "--kind", "semaphore", "gpus"]).await;
            assert_eq!(code(&output), Some(0), "{output:?}");
            let text = String::from_utf8_lossy(&output.stdout).into_owned();
            // What it printed before: a bare "none".
            assert!(!text.contains("waiters        none\n"), "{text}");
            if text.contains(expected) {
                break text;
            }
        }
    })
    .await;
    assert!(pod.waiting_count() > 0, "{text}");
    let output = lockkit(&url, &["--json", "inspect", "--kind", "semaphore", "gpus"]).await;
    let gpus = object(&json(&output), "semaphore").clone();
    assert_eq!(gpus["waiters_listed"], true, "{gpus}");
    permit.release().await.unwrap();
    for task in waiting {
        within("the waiting tasks", task).await.unwrap().unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_for_missing_objects_bad_usage_and_unreachable_redis() {
    let redis = server().await;
    let url = redis.url();

    let missing = lockkit(&url, &["inspect", "nobody"]).await;
    assert_eq!(code(&missing), Some(1), "{missing:?}");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no object named \"nobody\""));

    let usage = lockkit(&url, &["inspect"]).await;
    assert_eq!(code(&usage), Some(2), "{usage:?}");
    let bad_kind = lockkit(&url, &["inspect", "--kind", "mutex", "x"]).await;
    assert_eq!(code(&bad_kind), Some(2), "{bad_kind:?}");
    let empty_name = lockkit(&url, &["inspect", ""]).await;
    assert_eq!(code(&empty_name), Some(2), "{empty_name:?}");

    let help = lockkit(&url, &["--help"]).await;
    assert_eq!(code(&help), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).contains("4  refused"));

    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let unreachable = lockkit(&format!("redis://127.0.0.1:{port}"), &["list"]).await;
    assert_eq!(code(&unreachable), Some(3), "{unreachable:?}");

    // A key of another type where a lock would be.
    let raw = fred::prelude::Client::new(
        fred::prelude::Config::from_url(&url).unwrap(),
        None,
        None,
        None,
    );
    fred::interfaces::ClientLike::init(&raw).await.unwrap();
    fred::interfaces::KeysInterface::set::<(), _, _>(
        &raw,
        "lockkit:lock:{typed}",
        "x",
        None,
        None,
        false,
    )
    .await
    .unwrap();
    let wrong = lockkit(&url, &["inspect", "--kind", "lock", "typed"]).await;
    assert_eq!(code(&wrong), Some(3), "{wrong:?}");
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("another type"),
        "{wrong:?}"
    );
}

/// With nothing listening at `REDIS_URL`, the command says so in one line, the library's
/// message, and exits with the Redis error code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_prints_one_readable_line() {
    // A free loopback port: bound, then released, so nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut command = Command::new(BIN);
    command
        .arg("list")
        .env("REDIS_URL", format!("redis://127.0.0.1:{port}"))
        .stdin(Stdio::null());
    let output = within("the lockkit command", command.output())
        .await
        .expect("lockkit runs");
    assert_eq!(code(&output), Some(3), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!(
            "lockkit: cannot connect to 127.0.0.1:{port}: connection refused \
             (is Redis running at that address? it is the one in the URL this program gave \
             lockkit); the URL comes from --url, else REDIS_URL\n"
        )
    );
    assert!(output.stdout.is_empty(), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_prints_a_holder_change() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let mut watch = Command::new(BIN)
        .args([
            "--url", &url, "--json", "watch", "--kind", "lock", "job", "--count", "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // The first line is the state before: no such object.
    let before = within("the first state", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    let before: Value = serde_json::from_str(&before).unwrap();
    assert_eq!(before["objects"], Value::Array(vec![]));

    let guard = client.lock("job").lock().await.unwrap();
    let after = within("the change", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    let after: Value = serde_json::from_str(&after).unwrap();
    let owner = after["objects"][0]["holders"][0]["owner"].as_str().unwrap();
    assert!(owner.starts_with(client.id()), "{after}");
    let status = within("watch to stop after one change", watch.wait())
        .await
        .unwrap();
    assert!(status.success());
    guard.unlock().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_sells_every_ticket_once() {
    let redis = server().await;
    let url = redis.url();
    let output = lockkit(
        &url,
        &[
            "--json",
            "demo",
            "--clients",
            "2",
            "--tasks",
            "4",
            "--tickets",
            "30",
        ],
    )
    .await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let report = json(&output);
    assert_eq!(report["total"], 30);
    assert_eq!(report["left"], 0);
    assert_eq!(report["oversold"], false);
    assert_eq!(report["sold"].as_array().unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_inspect_on_a_cluster_see_every_primary() {
    let cluster = lockkit_testkit::RedisCluster::start(3, 0)
        .await
        .expect("a redis cluster starts");
    let url = cluster.url();
    let client = client(&url).await;
    // Enough names that every primary owns some of them.
    let names: Vec<String> = (0..24).map(|i| format!("job:{i}")).collect();
    let mut guards = Vec::new();
    for name in &names {
        guards.push(client.lock(name.as_str()).lock().await.unwrap());
    }
    let slots: std::collections::HashSet<Option<usize>> = primaries_of(&cluster, &names).await;
    assert_eq!(slots.len(), 3, "the names cover every primary");

    let output = lockkit(&url, &["--json", "list", "job:*"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let mut listed: Vec<String> = json(&output)
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut expected = names.clone();
    expected.sort();
    assert_eq!(listed, expected);

    let found = json(&lockkit(&url, &["--json", "inspect", "job:7"]).await);
    assert_eq!(object(&found, "lock")["holders"][0]["holds"], 1);
}

/// The primaries that own the lock keys of `names`.
async fn primaries_of(
    cluster: &lockkit_testkit::RedisCluster,
    names: &[String],
) -> std::collections::HashSet<Option<usize>> {
    let namespace = lockkit::protocol::keys::Namespace::default();
    let mut nodes = std::collections::HashSet::new();
    for name in names {
        let key = namespace.lock(name).unwrap().key;
        let slot = lockkit::protocol::slot::key_slot(&key);
        nodes.insert(cluster.node_for_slot(slot).await);
    }
    nodes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_reads_semaphores_read_write_locks_latches_spin_locks_and_once_marks() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let inspect = |kind: &'static str, name: &'static str| {
        let url = url.clone();
        async move {
            let output = lockkit(&url, &["--json", "inspect", "--kind", kind, name]).await;
            assert_eq!(code(&output), Some(0), "{output:?}");
            object(&json(&output), kind).clone()
        }
    };

    let semaphore = client.semaphore("pool");
    assert!(semaphore.try_set_permits(5).await.unwrap());
    let _permits = semaphore.acquire(2).await.unwrap();
    let pool = inspect("semaphore", "pool").await;
    assert_eq!(
        (pool["permits"].as_u64(), pool["used_permits"].as_u64()),
        (Some(5), Some(2)),
        "{pool}"
    );
    assert_eq!(pool["holders"][0]["holds"], 2, "{pool}");
    assert!(
        pool["holders"][0]["lease_ms"].as_u64().unwrap() > 0,
        "{pool}"
    );

    let rw = client.read_write_lock("config");
    let _read = rw.read_lock().await.unwrap();
    let _again = _read.scope(rw.read_lock()).await.unwrap();
    let config = inspect("rwlock", "config").await;
    assert_eq!(config["mode"], "read", "{config}");
    assert_eq!(config["holders"][0]["access"], "read", "{config}");
    assert_eq!(config["holders"][0]["holds"], 2, "{config}");

    let latch = client.count_down_latch("boot");
    assert!(latch.try_set_count(3).await.unwrap());
    assert_eq!(inspect("latch", "boot").await["count"], 3);

    let _spin = client.spin_lock("cron").lock().await.unwrap();
    let cron = inspect("spin", "cron").await;
    assert_eq!(cron["holders"].as_array().unwrap().len(), 1, "{cron}");

    let ran = client
        .once_per("nightly", Duration::from_secs(60), || async {})
        .await
        .unwrap();
    assert!(matches!(ran, lockkit::JobOutcome::Ran(())));
    let nightly = inspect("once", "nightly").await;
    let mark = nightly["holders"][0]["owner"].as_str().unwrap();
    assert!(mark.starts_with(client.id()), "{nightly}");
    assert!(nightly["ttl_ms"].as_u64().unwrap() > 0, "{nightly}");
}

/// A semaphore on a server whose `maxmemory-policy` may evict one of its keys, after one such
/// eviction was repaired: `inspect` prints the warnings and the repair count, as text and JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_flags_a_semaphore_at_risk_of_eviction_and_its_repairs() {
    let redis = server().await;
    assert_eq!(
        redis
            .command(&["CONFIG", "SET", "maxmemory-policy", "allkeys-lru"])
            .await
            .unwrap(),
        lockkit_testkit::RespValue::Simple("OK".into())
    );
    let url = redis.url();
    let client = client(&url).await;
    let semaphore = client.semaphore("exports");
    assert!(semaphore.try_set_permits(2).await.unwrap());
    let _held = semaphore
        .try_acquire(2, Duration::ZERO, Some(Duration::from_secs(120)))
        .await
        .unwrap()
        .expect("two free permits");
    // Simulate the eviction of the leases key; the next acquire repairs the semaphore.
    let leases = lockkit::protocol::keys::Namespace::default()
        .object(lockkit::protocol::keys::Kind::Semaphore, "exports")
        .unwrap()
        .keys[1]
        .clone();
    assert_eq!(
        redis.command(&["DEL", &leases]).await.unwrap(),
        lockkit_testkit::RespValue::Int(1)
    );
    let _permit = semaphore
        .try_acquire(1, Duration::ZERO, None)
        .await
        .unwrap()
        .expect("the stranded permits came back");

    let output = lockkit(
        &url,
        &["--json", "inspect", "--kind", "semaphore", "exports"],
    )
    .await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let found = json(&output);
    let exports = object(&found, "semaphore");
    assert_eq!(exports["evictions"], 1, "{exports}");
    let warnings: Vec<&str> = exports["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        warnings.iter().any(|w| w.contains("allkeys-lru")),
        "{exports}"
    );

    let output = lockkit(&url, &["inspect", "--kind", "semaphore", "exports"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(text.contains("evictions      1"), "{text}");
    assert!(
        text.contains("warnings") && text.contains("maxmemory-policy is allkeys-lru"),
        "{text}"
    );
}

/// An election held by one client with two candidates queued: `inspect` shows its leader (the
/// value it announced), term, lease and candidates in FIFO order, as JSON and as a table, and
/// `list` lists it as an `election`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_and_list_show_an_election_with_its_leader_term_lease_and_candidates() {
    let redis = server().await;
    let url = redis.url();
    let leader = client(&url).await;
    let second = client(&url).await;
    let third = client(&url).await;
    let leadership = leader
        .election("scheduler")
        .campaign("pod-a")
        .await
        .unwrap();
    let mut candidates = Vec::new();
    for (candidate, value) in [(&second, "pod-b"), (&third, "pod-c")] {
        let election = candidate.election("scheduler");
        candidates.push(tokio::spawn(async move {
            let leadership = election.campaign(value).await?;
            leadership.resign().await
        }));
        // In this order: the second's request is in the waiting set before the third's.
        within("the candidate to queue", async {
            while candidate.waiting_count() < 1 {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }

    let found = json(&lockkit(&url, &["--json", "inspect", "scheduler"]).await);
    let election = object(&found, "election");
    assert_eq!(
        election["key"], "lockkit:election:{scheduler}",
        "{election}"
    );
    assert_eq!(election["leader"]["value"], "pod-a", "{election}");
    assert_eq!(election["leader"]["term"], leadership.term(), "{election}");
    assert_eq!(election["fencing_token"], leadership.term(), "{election}");
    let holder = election["holders"][0]["owner"].as_str().unwrap();
    assert!(holder.starts_with(leader.id()), "{election}");
    assert!(
        election["holders"][0]["lease_ms"].as_u64().unwrap() > 0,
        "{election}"
    );
    let waiting: Vec<&str> = election["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|waiter| waiter.as_str().unwrap())
        .collect();
    assert_eq!(waiting.len(), 2, "{election}");
    assert!(waiting[0].starts_with(second.id()), "{election}");
    assert!(waiting[1].starts_with(third.id()), "{election}");

    let table = lockkit(&url, &["inspect", "--kind", "election", "scheduler"]).await;
    assert_eq!(code(&table), Some(0), "{table:?}");
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with("election \"scheduler\""), "{table}");
    assert!(table.contains("  leader         \"pod-a\"\n"), "{table}");
    assert!(
        table.contains(&format!("  term           {}\n", leadership.term())),
        "{table}"
    );
    assert!(
        table.contains(&format!("  held by        {holder}\n")),
        "{table}"
    );
    assert!(table.contains("  lease          "), "{table}");
    assert!(
        table.contains(&format!("  candidates     1. {}", second.id())),
        "{table}"
    );
    assert!(table.contains(&format!("2. {}", third.id())), "{table}");

    // Not a lock: force-unlock says what it is (with the right article) and changes nothing.
    let refused = lockkit(&url, &["force-unlock", "--yes", "scheduler"]).await;
    assert_eq!(code(&refused), Some(2), "{refused:?}");
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "lockkit: \"scheduler\" is an election, not a lock: force-unlock is for locks (lock, \
         fenced, fair, rwlock, spin)\n"
    );
    assert!(!leadership.is_lost());

    let listed = json(&lockkit(&url, &["--json", "list", "sched*"]).await);
    assert_eq!(listed.as_array().unwrap().len(), 1, "{listed}");
    let election = listed_object(&listed, "election", "scheduler");
    assert_eq!(election["held"], true, "{election}");
    assert_eq!(election["leader"]["value"], "pod-a", "{election}");
    assert_eq!(
        election["waiters"].as_array().unwrap().len(),
        2,
        "{election}"
    );

    // Every candidate leads in turn and resigns; then no one leads.
    leadership.resign().await.unwrap();
    for candidate in candidates {
        within("the candidates", candidate).await.unwrap().unwrap();
    }
    let found = json(&lockkit(&url, &["--json", "inspect", "scheduler"]).await);
    let election = object(&found, "election");
    assert_eq!(election["leader"], Value::Null, "{election}");
    assert_eq!(election["holders"], Value::Array(vec![]), "{election}");
    let table = lockkit(&url, &["inspect", "scheduler"]).await;
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("  leader         none\n"), "{table}");
    assert!(table.contains("  candidates     none\n"), "{table}");
}

/// The next line of a `watch --json`, parsed.
async fn next_json(lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>) -> Value {
    let line = within("a line of watch", lines.next_line())
        .await
        .unwrap()
        .expect("watch printed a line");
    serde_json::from_str(&line).unwrap()
}

/// `watch` of an election: the leader when it starts, then one line per change (elected, a new
/// value under the same term, resigned), in order, and `--count` stops it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_of_an_election_prints_each_leader_change_in_order() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let mut watch = Command::new(BIN)
        .args([
            "--url", &url, "--json", "watch", "--kind", "election", "jobs", "--count", "4",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    // Printed once watch listens: no leader yet.
    let first = next_json(&mut lines).await;
    assert_eq!(first["change"], "current", "{first}");
    assert_eq!(first["leader"], Value::Null, "{first}");

    let election = client.election("jobs");
    let leadership = election.campaign("pod-a").await.unwrap();
    let term = leadership.term();
    let elected = next_json(&mut lines).await;
    assert_eq!(elected["change"], "elected", "{elected}");
    assert_eq!(
        elected["leader"],
        serde_json::json!({"term": term, "value": "pod-a"})
    );

    leadership.proclaim("pod-a:9090").await.unwrap();
    let proclaimed = next_json(&mut lines).await;
    assert_eq!(proclaimed["change"], "proclaimed", "{proclaimed}");
    assert_eq!(
        proclaimed["leader"],
        serde_json::json!({"term": term, "value": "pod-a:9090"})
    );

    leadership.resign().await.unwrap();
    let resigned = next_json(&mut lines).await;
    assert_eq!(resigned["change"], "resigned", "{resigned}");
    assert_eq!(resigned["term"], term, "{resigned}");

    let next_term = election.campaign("pod-b").await.unwrap();
    let again = next_json(&mut lines).await;
    assert_eq!(again["change"], "elected", "{again}");
    assert_eq!(again["leader"]["value"], "pod-b", "{again}");
    assert!(again["leader"]["term"].as_u64().unwrap() > term, "{again}");
    let status = within("watch to stop after four changes", watch.wait())
        .await
        .unwrap();
    assert!(status.success());
    next_term.resign().await.unwrap();
}

/// `watch` of an election (found by its name alone) says in words who leads, and after its
/// subscription was cut, that changes may have been missed, with the leader then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_of_an_election_says_when_changes_may_have_been_missed() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let election = client.election("feed");
    let leadership = election.campaign("pod-a").await.unwrap();
    let term = leadership.term();
    let mut watch = Command::new(BIN)
        .args(["--url", &url, "watch", "feed", "--count", "1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = within("the first line", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(
        first.ends_with(&format!("election \"feed\": leader \"pod-a\", term {term}")),
        "{first}"
    );

    // Cut every subscriber connection (the test's client's too): watch's reconnects.
    lockkit_testkit::send_command(redis.addr(), &["CLIENT", "KILL", "TYPE", "pubsub"])
        .await
        .unwrap();
    let resynced = within("the resync line", lines.next_line())
        .await
        .unwrap()
        .unwrap();
    assert!(
        resynced.ends_with(&format!(
            "election \"feed\": reconnected, changes may have been missed; now: leader \
             \"pod-a\", term {term}"
        )),
        "{resynced}"
    );
    let status = within("watch to stop", watch.wait()).await.unwrap();
    assert!(status.success());
    leadership.resign().await.unwrap();
}

/// On a cluster (sharded pub/sub where the servers have it), `watch` of an election hears its
/// election and `inspect` finds its leader on the election's node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_inspect_of_an_election_on_a_cluster() {
    let cluster = lockkit_testkit::RedisCluster::start(3, 0)
        .await
        .expect("a redis cluster starts");
    let url = cluster.url();
    let client = client(&url).await;
    let mut watch = Command::new(BIN)
        .args([
            "--url", &url, "--json", "watch", "--kind", "election", "shard", "--count", "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = next_json(&mut lines).await;
    assert_eq!(first["change"], "current", "{first}");
    let leadership = client.election("shard").campaign("pod-a").await.unwrap();
    let elected = next_json(&mut lines).await;
    assert_eq!(
        elected["leader"],
        serde_json::json!({"term": leadership.term(), "value": "pod-a"}),
        "{elected}"
    );
    let status = within("watch to stop", watch.wait()).await.unwrap();
    assert!(status.success());

    let found = json(&lockkit(&url, &["--json", "inspect", "shard"]).await);
    assert_eq!(object(&found, "election")["leader"]["value"], "pod-a");
    leadership.resign().await.unwrap();
}

/// `watch` of an election rides out an outage (issue 27 §3.14): while Redis is down it prints
/// what went wrong and keeps watching, and once Redis is back it says changes may have been
/// missed, with the leader then. (It used to end at the first error the observer yielded.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_of_an_election_keeps_watching_through_an_outage() {
    let mut redis = server().await;
    let url = redis.url();
    let mut watch = Command::new(BIN)
        .args([
            "--url", &url, "--json", "watch", "--kind", "election", "ride", "--count", "1",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(watch.stdout.take().unwrap()).lines();
    let first = next_json(&mut lines).await;
    assert_eq!(first["change"], "current", "{first}");

    redis.kill();
    let error = next_json(&mut lines).await;
    assert_eq!(error["change"], "error", "{error}");
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|text| text.contains("ride")),
        "the error names the election: {error}"
    );
    redis.start_again().await.unwrap();
    // Errors while Redis stays down may repeat; then the resync.
    let resynced = loop {
        let line = next_json(&mut lines).await;
        if line["change"] != "error" {
            break line;
        }
    };
    assert_eq!(resynced["change"], "resynced", "{resynced}");
    assert_eq!(resynced["leader"], Value::Null, "{resynced}");
    let status = within("watch to stop after the resync", watch.wait())
        .await
        .unwrap();
    assert!(status.success());
}

/// Polls `client.inspect` (server state, no sleeps) until the `kind` object `name` has
/// `waiters` waiters listed.
async fn until_waiting(client: &Client, kind: Kind, name: &str, waiters: usize) {
    within("the waiters to show in Redis", async {
        loop {
            let found = client.inspect(Some(kind), name).await.unwrap();
            if found.iter().any(|object| object.waiters.len() == waiters) {
                break;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// The objects of a `list --json` array by `(kind, name)`.
fn listed_object<'a>(listed: &'a Value, kind: &str, name: &str) -> &'a Value {
    let matching: Vec<&Value> = listed
        .as_array()
        .expect("an array")
        .iter()
        .filter(|o| o["kind"] == kind && o["name"] == name)
        .collect();
    assert_eq!(matching.len(), 1, "one {kind} {name:?} in {listed}");
    matching[0]
}

/// Issue 29: `list` shows, per object, its holders and waiters (text and JSON), and
/// `list --held` lists the held ones and exits 5 while one is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_shows_the_holders_and_waiters_of_a_held_lock_and_semaphore() {
    let redis = server().await;
    let url = redis.url();
    let owner = client(&url).await;
    let other = client(&url).await;

    let guard = owner.lock("order:42").lock().await.unwrap();
    let lock_waiter = tokio::spawn({
        let lock = other.lock("order:42");
        async move { lock.lock().await?.unlock().await }
    });
    let semaphore = owner.semaphore("gpus");
    assert!(semaphore.try_set_permits(2).await.unwrap());
    let permit = semaphore.acquire(1).await.unwrap();
    let permit_waiter = tokio::spawn({
        let semaphore = other.semaphore("gpus");
        async move { semaphore.acquire(2).await?.release().await }
    });
    until_waiting(&owner, Kind::Lock, "order:42", 1).await;
    until_waiting(&owner, Kind::Semaphore, "gpus", 1).await;
    let lock_owner = owner.inspect(Some(Kind::Lock), "order:42").await.unwrap()[0].holders[0]
        .owner
        .clone();
    let marker = owner.inspect(Some(Kind::Semaphore), "gpus").await.unwrap()[0].holders[0]
        .owner
        .clone();

    let output = lockkit(&url, &["--json", "list"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let listed = json(&output);
    let lock = listed_object(&listed, "lock", "order:42");
    assert_eq!(lock["held"], true, "{lock}");
    assert_eq!(lock["holders"][0]["owner"], lock_owner.as_str(), "{lock}");
    assert_eq!(lock["waiters"].as_array().unwrap().len(), 1, "{lock}");
    assert!(
        lock["waiters"][0].as_str().unwrap().starts_with(other.id()),
        "{lock}"
    );
    let gpus = listed_object(&listed, "semaphore", "gpus");
    assert_eq!(gpus["held"], true, "{gpus}");
    assert_eq!(gpus["holders"][0]["owner"], marker.as_str(), "{gpus}");
    assert_eq!(gpus["holders"][0]["holds"], 1, "{gpus}");
    assert_eq!(gpus["waiters"].as_array().unwrap().len(), 1, "{gpus}");

    // The table: one row per object, its waiters counted, its holders named.
    let output = lockkit(&url, &["list"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let table = String::from_utf8_lossy(&output.stdout).into_owned();
    let row = |kind: &str, name: &str| -> String {
        table
            .lines()
            .find(|line| line.split_whitespace().take(2).eq([kind, name]))
            .unwrap_or_else(|| panic!("no {kind} {name} row in {table}"))
            .to_owned()
    };
    assert!(table.starts_with("KIND "), "{table}");
    // The guide's sample has these columns (its NAME column is as wide as its longest name).
    let guide =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/guide.md"))
            .expect("the guide");
    let sample = guide
        .split_once("$ lockkit list\n")
        .expect("the guide's list sample")
        .1;
    let words = |text: &str| -> Vec<String> {
        let header = text.lines().next().unwrap_or_default();
        header.split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(words(sample), words(&table), "the guide's header");
    assert!(
        table.lines().next().unwrap().contains(" HOLDERS"),
        "{table}"
    );
    let lock_row = row("lock", "order:42");
    assert_eq!(lock_row.split_whitespace().nth(2), Some("1"), "{table}");
    assert!(lock_row.contains(&format!("{lock_owner} (×1)")), "{table}");
    let gpus_row = row("semaphore", "gpus");
    assert_eq!(gpus_row.split_whitespace().nth(2), Some("1"), "{table}");
    assert!(gpus_row.contains(&format!("{marker} (×1)")), "{table}");

    // `--held`: both, and exit 5 (something is held).
    let output = lockkit(&url, &["--json", "list", "--held"]).await;
    assert_eq!(code(&output), Some(5), "{output:?}");
    assert_eq!(output.stderr, b"", "an answer, not an error: {output:?}");
    let held = json(&output);
    assert_eq!(held.as_array().unwrap().len(), 2, "{held}");
    listed_object(&held, "lock", "order:42");
    listed_object(&held, "semaphore", "gpus");

    guard.unlock().await.unwrap();
    within("the lock waiter", lock_waiter)
        .await
        .unwrap()
        .unwrap();
    permit.release().await.unwrap();
    within("the permit waiter", permit_waiter)
        .await
        .unwrap()
        .unwrap();
    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
}

/// Issue 29: "nothing held" is exit 0 for `list --held`, although keys remain: a fenced lock's
/// counter and an election's term counter (kept a day), a semaphore's total, a latch's count, a
/// `once_per` mark. One lock taken makes it exit 5, listing that lock only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_held_exits_0_when_only_counters_and_totals_are_left() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;

    client
        .lock("order:1")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    let fenced = client.fenced_lock("account:7");
    fenced.lock().await.unwrap().unlock().await.unwrap();
    let election = client.election("scheduler");
    election
        .campaign("pod-a")
        .await
        .unwrap()
        .resign()
        .await
        .unwrap();
    let semaphore = client.semaphore("gpus");
    assert!(semaphore.try_set_permits(2).await.unwrap());
    semaphore.acquire(2).await.unwrap().release().await.unwrap();
    assert!(client
        .count_down_latch("start")
        .try_set_count(3)
        .await
        .unwrap());
    let ran = client
        .once_per("nightly", Duration::from_secs(60), || async {})
        .await
        .unwrap();
    assert!(ran.ran());

    // Every one is listed, none held.
    let output = lockkit(&url, &["--json", "list"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    let listed = json(&output);
    for (kind, name) in [
        ("fenced", "account:7"),
        ("election", "scheduler"),
        ("semaphore", "gpus"),
        ("latch", "start"),
        ("once", "nightly"),
    ] {
        let object = listed_object(&listed, kind, name);
        assert_eq!(object["held"], false, "{object}");
    }
    assert_eq!(listed.as_array().unwrap().len(), 5, "{listed}");

    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).lines().count(),
        1,
        "the header only: {output:?}"
    );
    let output = lockkit(&url, &["--json", "list", "--held"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
    assert_eq!(json(&output), Value::Array(vec![]));

    // One fenced lock held: exit 5, and only it is listed.
    let guard = fenced.lock().await.unwrap();
    let output = lockkit(&url, &["--json", "list", "--held"]).await;
    assert_eq!(code(&output), Some(5), "{output:?}");
    let held = json(&output);
    assert_eq!(held.as_array().unwrap().len(), 1, "{held}");
    assert_eq!(listed_object(&held, "fenced", "account:7")["held"], true);
    // An election with a leader is held.
    let leadership = election.campaign("pod-b").await.unwrap();
    guard.unlock().await.unwrap();
    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(5), "{output:?}");
    let table = String::from_utf8_lossy(&output.stdout);
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(
        table.lines().nth(1).unwrap().starts_with("election "),
        "{table}"
    );
    assert!(table.contains("\"pod-b\": "), "the leader's value: {table}");
    leadership.resign().await.unwrap();
    let output = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(code(&output), Some(0), "{output:?}");
}

/// Issue 29: `Inspection::leader` is an election's leader (term and value), `None` once it
/// resigned, although the election's term counter is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspection_has_a_running_elections_leader_and_none_after_resign() {
    let redis = server().await;
    let url = redis.url();
    let client = client(&url).await;
    let observer = self::client(&url).await;
    let leadership = client
        .election("scheduler")
        .campaign("pod-a")
        .await
        .unwrap();
    let found = observer
        .inspect(Some(Kind::Election), "scheduler")
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let leader = found[0].leader.clone().expect("a leader");
    assert_eq!(leader.term, leadership.term());
    assert_eq!(leader.value, "pod-a");
    // Other kinds have none.
    let _guard = client.lock("scheduler").lock().await.unwrap();
    for object in observer.inspect(None, "scheduler").await.unwrap() {
        if object.kind != Kind::Election {
            assert_eq!(object.leader, None, "{object:?}");
        }
    }
    leadership.resign().await.unwrap();
    let found = observer
        .inspect(Some(Kind::Election), "scheduler")
        .await
        .unwrap();
    assert_eq!(found.len(), 1, "the term counter remains: {found:?}");
    assert_eq!(found[0].fencing_token, Some(leader.term), "{found:?}");
    assert_eq!(found[0].leader, None, "{found:?}");
}
