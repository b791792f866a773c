//! Freed permits go to the semaphore's FIFO line (issue 28; issue 11's "a freed permit reaches a
//! waiter that can use it" asserted the old order, in which a smaller request behind a bigger
//! one took the freed permit).
//!
//! Both semaphore kinds keep their waiting calls in one line in Redis (`scripts/line_lib.lua`, the
//! lock's line). Whatever frees permits grants them to the head of the line while the head's
//! request fits, in the same script, with one message on the granted call's client's own channel
//! and nothing to anyone else. A big request at the head is not overtaken by smaller ones behind
//! it (tokio's `Semaphore` makes the same choice: no starvation of `acquire_many`), and a call
//! that does not wait (`try_acquire` with a zero wait) does not jump the line either.
//!
//! The grants are made by the script that frees the permits, so the outcome is in Redis when the
//! release returns: the tests read it there (the permits left free, the line's length), not from
//! how fast a waiter wakes.

use std::collections::HashMap;
use std::time::Duration;

use fred::interfaces::{EventInterface, KeysInterface, PubsubInterface};
use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::wake::Wake;
use lockkit::{Client, Semaphore, SemaphorePermit};
use lockkit_suite::{client, raw, spawned, unique, within, RedisServer};
use tokio::task::JoinHandle;

/// The waiters' patience: longer than the test's bound.
const PATIENCE: Duration = Duration::from_secs(60);
/// The holders' lease: longer than every other bound, so no lease end frees anything.
const LEASE: Duration = Duration::from_secs(120);
/// The test's own bound on an outcome (a hang guard, not a latency threshold).
const BOUND: Duration = Duration::from_secs(10);

type Waiting = JoinHandle<Result<Option<SemaphorePermit>, lockkit::Error>>;

fn keys(name: &str) -> ObjectKeys {
    Namespace::default()
        .object(Kind::Semaphore, name)
        .expect("a valid name")
}

/// How many requests stand in the semaphore's line in Redis.
async fn line_length(redis: &RedisServer, name: &str) -> i64 {
    let keys = keys(name);
    redis
        .command(&["ZCARD", keys.aux("waiting").expect("a line key")])
        .await
        .unwrap()
        .as_int()
        .expect("a count")
}

/// Starts a waiter for `permits` through `client` and returns once its request stands in the line
/// (the line is one longer), so waiters join in the order they are started.
async fn join(redis: &RedisServer, client: &Client, name: &str, permits: u64) -> Waiting {
    let before = line_length(redis, name).await;
    let semaphore = client.semaphore(name);
    let task = tokio::spawn(async move { semaphore.try_acquire(permits, PATIENCE, None).await });
    within(BOUND, "the waiter to join the line", async {
        while line_length(redis, name).await <= before {
            tokio::task::yield_now().await;
        }
    })
    .await;
    task
}

/// A semaphore of `total` permits, all held with a long fixed lease.
async fn all_held(holder: &Client, name: &str, total: u64) -> (Semaphore, Vec<SemaphorePermit>) {
    let semaphore = holder.semaphore(name);
    assert!(semaphore.try_set_permits(total).await.unwrap());
    let mut held = Vec::new();
    for _ in 0..total {
        held.push(
            semaphore
                .try_acquire(1, Duration::ZERO, Some(LEASE))
                .await
                .unwrap()
                .expect("a free permit"),
        );
    }
    (semaphore, held)
}

async fn granted(task: Waiting, permits: u64) -> SemaphorePermit {
    let permit = within(BOUND, "the granted waiter", task)
        .await
        .unwrap()
        .unwrap()
        .expect("granted within the waiter's patience");
    assert_eq!(permit.permits(), permits);
    permit
}

/// A waiter for 2 at the head, a waiter for 1 behind it (in the same client or another): a freed
/// permit stays free for the head (the one behind does not take it, and neither does a
/// `try_acquire` with a zero wait), the second freed permit grants the head both, and the waiter
/// behind gets its permit when the head gives them back.
async fn a_big_request_at_the_head_is_not_overtaken(same_client: bool) {
    let redis = spawned().await;
    let url = redis.url();
    let holder = client(&url).await;
    let first = client(&url).await;
    let second = if same_client {
        first.clone()
    } else {
        client(&url).await
    };
    let name = unique("fifo");
    let (semaphore, mut held) = all_held(&holder, &name, 2).await;

    let big = join(&redis, &first, &name, 2).await;
    let small = join(&redis, &second, &name, 1).await;

    held.pop().expect("two held").release().await.unwrap();
    assert_eq!(
        semaphore.available_permits().await.unwrap(),
        1,
        "the freed permit is kept for the head (the waiter for 1 behind it took it)"
    );
    let newcomer = client(&url).await;
    assert!(
        newcomer
            .semaphore(&name)
            .try_acquire(1, Duration::ZERO, Some(LEASE))
            .await
            .unwrap()
            .is_none(),
        "a try with a zero wait jumped the line"
    );
    assert_eq!(
        line_length(&redis, &name).await,
        2,
        "the try joined the line"
    );
    assert!(!big.is_finished() && !small.is_finished());

    held.pop().expect("one held").release().await.unwrap();
    let big = granted(big, 2).await;
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);
    assert_eq!(line_length(&redis, &name).await, 1);
    assert!(!small.is_finished());

    big.release().await.unwrap();
    granted(small, 1).await.release().await.unwrap();
    assert_eq!(semaphore.available_permits().await.unwrap(), 2);
    assert_eq!(line_length(&redis, &name).await, 0);
}

#[tokio::test]
async fn in_one_client_a_big_request_at_the_head_is_not_overtaken() {
    a_big_request_at_the_head_is_not_overtaken(true).await;
}

#[tokio::test]
async fn across_clients_a_big_request_at_the_head_is_not_overtaken() {
    a_big_request_at_the_head_is_not_overtaken(false).await;
}

/// Added permits grant the line's head while it fits, in order: with the 3 permits held and
/// waiters for 1, 2, 1 and 3 in line, adding 4 permits grants the first three (1 + 2 + 1) and
/// keeps the fourth waiting (3 do not fit in the 0 left); the holder's release then grants it.
#[tokio::test]
async fn added_permits_grant_the_head_while_it_fits() {
    let redis = spawned().await;
    let url = redis.url();
    let holder = client(&url).await;
    let waiters = client(&url).await;
    let name = unique("fifo-add");
    let semaphore = holder.semaphore(&name);
    assert!(semaphore.try_set_permits(3).await.unwrap());
    let held = semaphore
        .try_acquire(3, Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .expect("three free permits");
    let mut line = Vec::new();
    for permits in [1, 2, 1, 3] {
        line.push((permits, join(&redis, &waiters, &name, permits).await));
    }
    assert_eq!(semaphore.add_permits(4).await.unwrap(), 7);
    assert_eq!(semaphore.available_permits().await.unwrap(), 0);
    assert_eq!(
        line_length(&redis, &name).await,
        1,
        "only the waiter for 3 is left"
    );
    let (last_permits, last) = line.pop().expect("four waiters");
    let mut permits = Vec::new();
    for (want, task) in line {
        permits.push(granted(task, want).await);
    }
    assert!(!last.is_finished());
    held.release().await.unwrap();
    granted(last, last_permits).await.release().await.unwrap();
    for permit in permits {
        permit.release().await.unwrap();
    }
    assert_eq!(semaphore.available_permits().await.unwrap(), 7);
}

/// One release, three clients waiting: exactly one message is published, on the channel of the
/// client whose call is at the head of the line, and it grants that call its permit. Nothing is
/// published on the semaphore's shared channel or to the other clients.
#[tokio::test]
async fn a_release_tells_only_the_granted_client() {
    let redis = spawned().await;
    let url = redis.url();
    let publisher = raw(&url).await;
    let holder = client(&url).await;
    let name = unique("fifo-messages");
    let keys = keys(&name);
    let (_semaphore, mut held) = all_held(&holder, &name, 1).await;
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let waiter = client(&url).await;
        tasks.push(join(&redis, &waiter, &name, 1).await);
        clients.push(waiter);
    }

    let listener = raw(&url).await;
    let mut messages = listener.message_rx();
    let pattern = format!("{}*", keys.channel);
    listener.psubscribe(pattern).await.unwrap();
    let end = format!("{}:end", keys.channel);

    let mut permit = held.pop().expect("one held");
    for (index, task) in tasks.into_iter().enumerate() {
        permit.release().await.unwrap();
        let _: i64 = publisher.publish(&end, "end").await.unwrap();
        let mut got: HashMap<String, Vec<String>> = HashMap::new();
        within(BOUND, "the release's messages", async {
            loop {
                let message = messages.recv().await.unwrap();
                if message.channel == end {
                    break;
                }
                got.entry(message.channel.to_string())
                    .or_default()
                    .push(message.value.as_string().unwrap_or_default());
            }
        })
        .await;
        let mine = keys.client_channel(clients[index].id());
        assert_eq!(got.len(), 1, "release {index}: {got:?}");
        let sent = got.get(&mine).unwrap_or_else(|| panic!("{index}: {got:?}"));
        assert_eq!(sent.len(), 1, "{sent:?}");
        assert!(
            matches!(Wake::decode(&sent[0]), Wake::Grant { grant, .. } if grant.hold_count == 1),
            "{sent:?}"
        );
        permit = granted(task, 1).await;
    }
    permit.release().await.unwrap();
    let _: () = publisher.del(keys.keys.clone()).await.unwrap();
}

/// A holder that dies holding the only permit (nobody releases it): when its lease has run out,
/// whichever script finds that first grants the permit to the head of the line, not to the
/// caller whose script found it. Here the waiter behind the head looks first (the acquire script
/// as its retry sends it, run directly, so the order does not depend on timers): it stays in
/// line, and the head holds the permit and is told so on its channel.
#[tokio::test]
async fn a_dead_holders_permit_goes_to_the_head_of_the_line() {
    use lockkit::protocol::semaphore::ACQUIRE;
    let redis = spawned().await;
    let url = redis.url();
    let holder = client(&url).await;
    let name = unique("fifo-dead-holder");
    let keys = keys(&name);
    let semaphore = holder.semaphore(&name);
    assert!(semaphore.try_set_permits(1).await.unwrap());
    let lease = Duration::from_millis(200);
    let dead = semaphore
        .try_acquire(1, Duration::ZERO, Some(lease))
        .await
        .unwrap()
        .expect("the free permit");
    // The holder "dies": its guard never releases.
    std::mem::forget(dead);
    let (head, behind) = (keys.client_channel("A"), keys.client_channel("B"));
    let listener = raw(&url).await;
    let mut messages = listener.message_rx();
    listener.subscribe(head.as_str()).await.unwrap();
    let try_as = |marker: &'static str, channel: &str| {
        let args = [marker, "1", "60000", channel, "0", "", "60000"];
        let command: Vec<String> = lockkit_suite::eval(ACQUIRE.source(), &keys.keys, &args)
            .into_iter()
            .map(str::to_owned)
            .collect();
        command
    };
    let run = |command: Vec<String>| {
        let redis = &redis;
        async move {
            let parts: Vec<&str> = command.iter().map(String::as_str).collect();
            lockkit_suite::ints(&redis.command(&parts).await.unwrap())
        }
    };
    assert_eq!(run(try_as("#A:1", &head)).await[0], 0, "the head waits");
    assert_eq!(run(try_as("#B:1", &behind)).await[0], 0, "the second waits");
    // The lease runs out: this pause is the lease itself (no event announces it).
    tokio::time::sleep(lease + Duration::from_millis(50)).await;
    assert_eq!(
        run(try_as("#B:1", &behind)).await[0],
        0,
        "the waiter behind took the dead holder's permit"
    );
    let held = redis
        .command(&["ZSCORE", &keys.keys[1], "#A:1"])
        .await
        .unwrap();
    assert!(
        held.as_str().is_some(),
        "the head does not hold it: {held:?}"
    );
    let grant = within(BOUND, "the grant to the head", messages.recv())
        .await
        .unwrap();
    assert_eq!(&*grant.channel, head.as_str());
    assert!(
        matches!(
            Wake::decode(&grant.value.as_string().unwrap_or_default()),
            Wake::Grant { waiter, .. } if waiter == "#A:1"
        ),
        "{grant:?}"
    );
    assert_eq!(line_length(&redis, &name).await, 1);
}

/// A granted permit starts on probation (it ends after 5 s unless confirmed); the client that
/// claimed it confirms it to its lease counted from the grant, so a fixed lease longer than the
/// probation outlives it while held, and a watchdog-mode permit too (its first renewal comes
/// after the probation would have ended).
#[tokio::test]
async fn a_granted_permit_outlives_its_probation_while_held() {
    use lockkit::protocol::lock::GRANT_PROBATION;
    let redis = spawned().await;
    let url = redis.url();
    let holder = client(&url).await;
    let waiter = client(&url).await;
    let name = unique("fifo-probation");
    let (semaphore, mut held) = all_held(&holder, &name, 2).await;
    let fixed = {
        let semaphore = waiter.semaphore(&name);
        let before = line_length(&redis, &name).await;
        let task = tokio::spawn(async move {
            semaphore
                .try_acquire(1, PATIENCE, Some(Duration::from_secs(60)))
                .await
        });
        within(BOUND, "the waiter to join the line", async {
            while line_length(&redis, &name).await <= before {
                tokio::task::yield_now().await;
            }
        })
        .await;
        task
    };
    let watchdog = join(&redis, &waiter, &name, 1).await;
    for permit in held.drain(..) {
        permit.release().await.unwrap();
    }
    let fixed = granted(fixed, 1).await;
    let watchdog = granted(watchdog, 1).await;
    // Time passing is the scenario: past the probation, both grants must have been confirmed.
    tokio::time::sleep(GRANT_PROBATION + Duration::from_secs(1)).await;
    assert!(!fixed.is_lost() && !watchdog.is_lost());
    assert_eq!(
        semaphore.available_permits().await.unwrap(),
        0,
        "both still held"
    );
    fixed.release().await.unwrap();
    watchdog.release().await.unwrap();
}

/// One release that frees permits for two waiting calls of one client tells that client once:
/// one message with both grants, one per line (`Wake::decode_all`); a client behind them that
/// does not fit is told nothing.
#[tokio::test]
async fn a_release_granting_two_calls_of_one_client_sends_it_one_message() {
    let redis = spawned().await;
    let url = redis.url();
    let publisher = raw(&url).await;
    let holder = client(&url).await;
    let name = unique("fifo-one-message");
    let keys = keys(&name);
    let semaphore = holder.semaphore(&name);
    assert!(semaphore.try_set_permits(2).await.unwrap());
    let both = semaphore
        .try_acquire(2, Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .expect("two free permits");
    let twice = client(&url).await;
    let first = join(&redis, &twice, &name, 1).await;
    let second = join(&redis, &twice, &name, 1).await;
    let behind = client(&url).await;
    let third = join(&redis, &behind, &name, 1).await;

    let listener = raw(&url).await;
    let mut messages = listener.message_rx();
    listener
        .psubscribe(format!("{}*", keys.channel))
        .await
        .unwrap();
    let end = format!("{}:end", keys.channel);
    both.release().await.unwrap();
    let _: i64 = publisher.publish(&end, "end").await.unwrap();
    let mut got: HashMap<String, Vec<String>> = HashMap::new();
    within(BOUND, "the release's messages", async {
        loop {
            let message = messages.recv().await.unwrap();
            if message.channel == end {
                break;
            }
            got.entry(message.channel.to_string())
                .or_default()
                .push(message.value.as_string().unwrap_or_default());
        }
    })
    .await;
    let mine = keys.client_channel(twice.id());
    assert_eq!(got.len(), 1, "only the granted client is told: {got:?}");
    let sent = got.get(&mine).unwrap_or_else(|| panic!("{got:?}"));
    assert_eq!(sent.len(), 1, "one message for both grants: {sent:?}");
    let wakes = Wake::decode_all(&sent[0]);
    assert_eq!(wakes.len(), 2, "{sent:?}");
    assert!(
        wakes.iter().all(|wake| matches!(wake, Wake::Grant { .. })),
        "{sent:?}"
    );
    let (a, b) = (granted(first, 1).await, granted(second, 1).await);
    assert_eq!(line_length(&redis, &name).await, 1, "the third waits on");
    a.release().await.unwrap();
    granted(third, 1).await.release().await.unwrap();
    b.release().await.unwrap();
    let _: () = publisher.del(keys.keys.clone()).await.unwrap();
}
