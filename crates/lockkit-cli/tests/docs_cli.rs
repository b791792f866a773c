//! `lockkit list` (issue 29), tested from the documentation only: the guide's "Command-line
//! tool" and "Is anything held?", and the crate README. Runs the real binary against a real
//! redis-server (harness as in tests/cli.rs).

mod common;

use std::process::Output;
use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit::Client;
use serde_json::Value;

use common::*;

/// The rows of a text `list` (header dropped), split on whitespace.
fn rows(output: &Output) -> Vec<Vec<String>> {
    stdout(output)
        .lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty())
        .map(|line| line.split_whitespace().map(str::to_owned).collect())
        .collect()
}

fn row<'a>(rows: &'a [Vec<String>], kind: &str, name: &str) -> &'a Vec<String> {
    let found: Vec<&Vec<String>> = rows
        .iter()
        .filter(|r| {
            r.first().map(String::as_str) == Some(kind)
                && r.get(1).map(String::as_str) == Some(name)
        })
        .collect();
    assert_eq!(found.len(), 1, "one {kind} {name} row in {rows:?}");
    found[0]
}

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

/// Guide, "Is anything held?": "Keys that stay after a release are no holds: a fenced lock's
/// counter and an election's term counter [...], a semaphore's total. A latch's count is not a
/// hold either [...], nor a `once_per` mark" and "`--held` keeps the held ones and exits 5 when
/// there is one, 0 when there is none"; "5 | held: [...] an answer, not an error, so nothing is
/// written to standard error". Every leftover at once, with a prefix: `list` shows them, `list
/// --held` shows none and exits 0; `--json` says `"held": false` for each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leftovers_of_every_kind_are_listed_but_not_held() {
    let redis = server().await;
    let url = redis.url();
    let c = client(&url).await;
    let fenced = c.fenced_lock("fenced-left");
    fenced.lock().await.unwrap().unlock().await.unwrap();
    let election = c.election("election-left");
    election
        .campaign("x")
        .await
        .unwrap()
        .resign()
        .await
        .unwrap();
    let sem = c.semaphore("sem-left").with_permits(3).unwrap();
    sem.acquire(2).await.unwrap().release().await.unwrap();
    let pes = c
        .permit_expirable_semaphore("pes-left")
        .with_permits(2)
        .unwrap();
    pes.acquire(Duration::from_secs(60))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let latch = c.count_down_latch("latch-left");
    assert!(latch.try_set_count(3).await.unwrap());
    let ran = c
        .once_per("once-left", Duration::from_secs(600), || async {})
        .await
        .unwrap();
    assert!(!ran.is_skipped());
    // Released plain kinds leave nothing, or nothing held.
    c.lock("lock-left")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();
    c.spin_lock("spin-left")
        .lock()
        .await
        .unwrap()
        .unlock()
        .await
        .unwrap();

    let all = lockkit(&url, &["list"]).await;
    assert_eq!(
        all.status.code(),
        Some(0),
        "{} / {}",
        stdout(&all),
        stderr(&all)
    );
    let listed = rows(&all);
    for (kind, name) in [
        ("fenced", "fenced-left"),
        ("semaphore", "sem-left"),
        ("latch", "latch-left"),
        ("once", "once-left"),
    ] {
        let r = row(&listed, kind, name);
        assert_eq!(r.last().map(String::as_str), Some("-"), "no holders: {r:?}");
    }

    let held = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(
        held.status.code(),
        Some(0),
        "nothing is held: {} / {}",
        stdout(&held),
        stderr(&held)
    );
    assert_eq!(rows(&held), Vec::<Vec<String>>::new(), "{}", stdout(&held));

    let as_json = json(&lockkit(&url, &["--json", "list"]).await);
    let objects = as_json.as_array().expect("an array");
    assert!(!objects.is_empty(), "{as_json}");
    for object in objects {
        assert_eq!(object["held"], Value::Bool(false), "{object}");
    }
    let held_json = lockkit(&url, &["--json", "list", "--held"]).await;
    assert_eq!(held_json.status.code(), Some(0));
    assert_eq!(json(&held_json), serde_json::json!([]));
}

/// Guide, "Is anything held?": "An object is **held** when it has a holder: [...] an election with
/// a leader (announced, its value shown before the holder, ...)" and "`list --held` found an
/// object held" → exit 5, "nothing is written to standard error"; `HOLDERS` written
/// `"pod-1": <owner> (×1)`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_election_with_a_leader_is_held_and_exits_5() {
    let redis = server().await;
    let url = redis.url();
    let c = client(&url).await;
    let election = c.election("scheduler");
    let leadership = election.campaign("pod-1").await.unwrap();

    let out = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(
        out.status.code(),
        Some(5),
        "{} / {}",
        stdout(&out),
        stderr(&out)
    );
    assert_eq!(stderr(&out), "", "exit 5 is an answer, not an error");
    let listed = rows(&out);
    let r = row(&listed, "election", "scheduler");
    let line = r.join(" ");
    assert!(
        line.contains("\"pod-1\":"),
        "the value before the holder: {line}"
    );
    assert!(line.contains(c.id()), "the holder's owner: {line}");
    assert!(line.contains("(×1)"), "{line}");

    let as_json = json(&lockkit(&url, &["--json", "list", "--held"]).await);
    let objects = as_json.as_array().expect("an array");
    assert_eq!(objects.len(), 1, "{as_json}");
    assert_eq!(objects[0]["held"], Value::Bool(true));
    assert_eq!(objects[0]["leader"]["value"], "pod-1");
    assert_eq!(objects[0]["leader"]["term"], leadership.term());

    leadership.resign().await.unwrap();
    let out = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(out.status.code(), Some(0), "resigned: {}", stdout(&out));
    c.shutdown().await.unwrap();
}

/// Guide, "Is anything held?": "An object is **held** when it has a holder: a `Lock`,
/// `FencedLock`, `FairLock`, `ReadWriteLock` or `SpinLock` with an owner, a semaphore with a
/// permit taken"; "Per object: its waiters, the longest lease left among its holders, and its
/// holders"; "`WAITERS` is `-` where Redis keeps no list of them (spin lock, latch, `once_per`)";
/// "Holders are written `<owner> (×<holds>)` (a semaphore's: the permits it took; a read-write
/// lock's `(read ×1)`)". Each kind held alone, `--held` exits 5 each time and 0 once released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_held_kind_is_listed_with_its_holders_and_waiters() {
    let redis = server().await;
    let url = redis.url();
    let c = client(&url).await;
    let w = client(&url).await;

    // A lock held twice (a re-entry) with two waiters.
    let lock = c.lock("order:42");
    let first = lock.lock().await.unwrap();
    let second = first.scope(lock.lock()).await.unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let l = w.lock("order:42");
            tokio::spawn(async move { l.lock().await.map(drop) })
        })
        .collect();
    until_waiting(&c, Kind::Lock, "order:42", 2).await;
    let out = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(out.status.code(), Some(5), "{}", stdout(&out));
    let listed = rows(&out);
    let r = row(&listed, "lock", "order:42");
    assert_eq!(r[2], "2", "WAITERS: {r:?}");
    assert!(r.join(" ").contains("(×2)"), "a hold and a re-entry: {r:?}");
    second.unlock().await.unwrap();
    first.unlock().await.unwrap();
    for task in waiting {
        within("a waiter", task).await.unwrap().unwrap();
    }

    // A read-write lock held for read; a spin lock; a semaphore with 2 permits taken.
    let rw = c.read_write_lock("rw").read_lock().await.unwrap();
    let spin = c.spin_lock("spin").lock().await.unwrap();
    let permit = c
        .semaphore("gpus")
        .with_permits(4)
        .unwrap()
        .acquire(2)
        .await
        .unwrap();
    let fixed = c
        .fair_lock("fair")
        .lock_with_lease(Duration::from_secs(600))
        .await
        .unwrap();
    let fenced = c.fenced_lock("fenced").lock().await.unwrap();
    let out = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(out.status.code(), Some(5), "{}", stdout(&out));
    let listed = rows(&out);
    assert!(row(&listed, "rwlock", "rw").join(" ").contains("(read ×1)"));
    assert_eq!(
        row(&listed, "spin", "spin")[2],
        "-",
        "a spin lock keeps no waiters"
    );
    assert!(row(&listed, "semaphore", "gpus").join(" ").contains("(×2)"));
    row(&listed, "fair", "fair");
    row(&listed, "fenced", "fenced");
    assert_eq!(listed.len(), 5, "{listed:?}");
    let held_json = json(&lockkit(&url, &["--json", "list", "--held"]).await);
    assert_eq!(held_json.as_array().map(Vec::len), Some(5), "{held_json}");

    rw.unlock().await.unwrap();
    spin.unlock().await.unwrap();
    permit.release().await.unwrap();
    fixed.unlock().await.unwrap();
    fenced.unlock().await.unwrap();
    let out = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "all released: {} / {}",
        stdout(&out),
        stderr(&out)
    );
    c.shutdown().await.unwrap();
    w.shutdown().await.unwrap();
}

/// Guide: "`lockkit list --held >/dev/null && echo "nothing held"      # exit 5: something is;
/// 3: Redis error`" and the exit-code table "3 | Redis error: cannot connect, a command failed".
/// A Redis error is not "nothing held".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_held_exits_3_when_redis_cannot_be_reached() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let url = format!("redis://127.0.0.1:{port}");
    let out = lockkit(&url, &["list", "--held"]).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{} / {}",
        stdout(&out),
        stderr(&out)
    );
    let out = lockkit(&url, &["list"]).await;
    assert_eq!(
        out.status.code(),
        Some(3),
        "{} / {}",
        stdout(&out),
        stderr(&out)
    );
}

/// Guide: "`lockkit list [pattern] [--held]`: the objects whose name matches a glob" and
/// `--prefix` "(the application's `ClientBuilder::key_prefix`, default `lockkit`)": `--held`
/// with a pattern only answers for the matching objects, and for the given prefix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_held_with_a_pattern_and_a_prefix_answers_for_those_only() {
    let redis = server().await;
    let url = redis.url();
    let c = client(&url).await;
    let guard = c.lock("order:1").lock().await.unwrap();
    let out = lockkit(&url, &["list", "--held", "order:*"]).await;
    assert_eq!(out.status.code(), Some(5), "{}", stdout(&out));
    let out = lockkit(&url, &["list", "--held", "report:*"]).await;
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let out = lockkit(&url, &["--prefix", "other", "list", "--held"]).await;
    assert_eq!(
        out.status.code(),
        Some(0),
        "another prefix: {}",
        stdout(&out)
    );
    let other = Client::builder()
        .url(url.as_str())
        .key_prefix("other")
        .build()
        .await
        .unwrap();
    let g2 = other.lock("job").lock().await.unwrap();
    let out = lockkit(&url, &["--prefix", "other", "list", "--held"]).await;
    assert_eq!(out.status.code(), Some(5), "{}", stdout(&out));
    assert_eq!(rows(&out).len(), 1, "{}", stdout(&out));
    g2.unlock().await.unwrap();
    guard.unlock().await.unwrap();
    other.shutdown().await.unwrap();
    c.shutdown().await.unwrap();
}
