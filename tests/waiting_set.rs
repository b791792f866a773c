//! A waiter that gives up leaves at once (issue 11, item 6): the waiting set of a lock and a
//! fenced lock keeps no entry of a waiter whose wait timed out or was cancelled, a crashed
//! waiter's entry is dropped once its keep-alive passed, a release reserves the lock only for an
//! owner that still waits, and a waiter that gives up right after a release reserved the lock for
//! it hands the reservation on at once.

use std::time::Duration;

use fred::interfaces::{ClientLike, EventInterface, KeysInterface, PubsubInterface};
use fred::types::{ClusterHash, CustomCommand};
use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::{fenced_lock, lock};
use lockkit_suite::{
    client, eval, ints, raw, redis, server_ms, spawned, unique, until_waiting, within,
};
use lockkit_testkit::send_commands;

const HANG: Duration = Duration::from_secs(60);
/// Far longer than any test below: an entry with this keep-alive lives through the test.
const LONG: &str = "60000";

fn keys(kind: Kind, name: &str) -> ObjectKeys {
    Namespace::default().object(kind, name).unwrap()
}

/// The acquire and release scripts of a kind.
fn scripts(kind: Kind) -> (&'static str, &'static str) {
    if kind == Kind::FencedLock {
        (fenced_lock::ACQUIRE.source(), fenced_lock::RELEASE.source())
    } else {
        (lock::ACQUIRE.source(), lock::RELEASE.source())
    }
}

/// The `lock_cancel` call of `owner` over the object's keys.
fn cancel<'a>(keys: &'a ObjectKeys, cancel_keys: &'a [String], owner: &'a str) -> Vec<&'a str> {
    eval(
        lock::CANCEL.source(),
        cancel_keys,
        &[owner, &keys.channel, "0"],
    )
}

/// The keys `lock_cancel` takes: lock key, handoff, waiting, timeouts.
fn cancel_keys(keys: &ObjectKeys) -> Vec<String> {
    ["handoff", "waiting", "timeouts"]
        .iter()
        .map(|suffix| keys.aux(suffix).expect("an auxiliary key").to_owned())
        .fold(vec![keys.key.clone()], |mut all, key| {
            all.push(key);
            all
        })
}

/// The number of members of the sorted set `key`.
async fn zcard(raw: &fred::clients::Client, key: &str) -> u64 {
    raw.custom(
        CustomCommand::new_static("ZCARD", ClusterHash::FirstKey, false),
        vec![key],
    )
    .await
    .unwrap()
}

/// Waits until neither the waiting set nor the keep-alive deadlines hold an entry.
async fn until_no_entries(raw: &fred::clients::Client, keys: &ObjectKeys) {
    let sets: Vec<&str> = ["waiting", "timeouts"]
        .iter()
        .filter_map(|suffix| keys.aux(suffix))
        .collect();
    within(
        Duration::from_secs(20),
        "the waiters' entries to go",
        async {
            loop {
                let mut left = 0;
                for set in &sets {
                    left += zcard(raw, set).await;
                }
                if left == 0 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        },
    )
    .await;
}

/// Waiters whose wait runs out and waiters whose acquire future is dropped leave no entry; the
/// lock inspected meanwhile shows no ghost waiter; and once they are gone and the holder gives
/// the lock back, a zero-wait `try_lock` takes it at once (a subscriber on the release channel
/// makes the release reserve the lock, as a waiter elsewhere would).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_that_time_out_or_are_cancelled_leave_no_entries() {
    let redis = redis().await;
    let raw = raw(&redis.url()).await;
    let (holder, waiting, other) = (
        client(&redis.url()).await,
        client(&redis.url()).await,
        client(&redis.url()).await,
    );
    let name = unique("waiting-set");
    for kind in [Kind::Lock, Kind::FencedLock] {
        let name = format!("{name}:{kind:?}");
        let keys = keys(kind, &name);
        let subscriber = lockkit_suite::raw(&redis.url()).await;
        subscriber.subscribe(keys.channel.as_str()).await.unwrap();
        let (lock, waiter, next) = match kind {
            Kind::Lock => (
                Handle::Lock(holder.lock(&name)),
                Handle::Lock(waiting.lock(&name)),
                Handle::Lock(other.lock(&name)),
            ),
            _ => (
                Handle::Fenced(holder.fenced_lock(&name)),
                Handle::Fenced(waiting.fenced_lock(&name)),
                Handle::Fenced(other.fenced_lock(&name)),
            ),
        };
        let guard = lock.try_lock(Duration::ZERO).await.expect("free");

        // Eight waiters that time out, eight that are cancelled while they wait.
        let mut timed_out = Vec::new();
        let mut cancelled = Vec::new();
        for _ in 0..8 {
            let (first, second) = (waiter.clone(), waiter.clone());
            timed_out.push(tokio::spawn(async move {
                first.try_lock(Duration::from_secs(2)).await
            }));
            cancelled.push(tokio::spawn(async move {
                second.try_lock(Duration::from_secs(3600)).await
            }));
        }
        until_waiting(&waiting, 16).await;
        for task in &cancelled {
            task.abort();
        }
        for task in timed_out {
            let got = within(HANG, "a timed wait", task).await.unwrap();
            assert!(got.is_none(), "{kind:?}: the lock is held");
        }
        for task in cancelled {
            assert!(within(HANG, "a cancelled wait", task).await.is_err());
        }

        until_no_entries(&raw, &keys).await;
        let inspected = waiting.inspect(Some(kind), &name).await.unwrap();
        assert_eq!(inspected.len(), 1, "{kind:?}: {inspected:?}");
        assert!(
            inspected[0].waiters.is_empty(),
            "{kind:?}: no ghost waiters: {inspected:?}"
        );

        guard.unlock().await.unwrap();
        let got = next.try_lock(Duration::ZERO).await;
        assert!(
            got.is_some(),
            "{kind:?}: the free lock refused a zero-wait try after its waiters left"
        );
        drop(got);
        let _ = subscriber.quit().await;
    }
}

/// A waiter cancelled right after a release reserved the lock for it hands the reservation on:
/// to the next waiter, named in a message, or, with nobody left, to nobody. The release, the
/// cancels and the tries run in one `MULTI`, so no time passes between them and the outcome does
/// not depend on the handoff window.
#[tokio::test]
async fn a_waiter_that_gives_up_hands_its_reservation_on_at_once() {
    let server = spawned().await;
    for kind in [Kind::Lock, Kind::FencedLock] {
        let keys = keys(kind, &unique("handback"));
        let (acquire, release) = scripts(kind);
        let (k, ck) = (&keys.keys, cancel_keys(&keys));
        let handoff = keys.aux("handoff").unwrap();
        let lease = "30000";

        let subscriber = raw(&server.url()).await;
        let mut messages = subscriber.message_rx();
        subscriber.subscribe(keys.channel.as_str()).await.unwrap();
        let replies = send_commands(
            server.addr(),
            &[
                eval(acquire, k, &["A", "#A:1", lease, LONG]),
                eval(acquire, k, &["B", "#B:1", lease, LONG]),
                eval(acquire, k, &["C", "#C:1", lease, LONG]),
                vec!["MULTI"],
                eval(release, k, &["#A:1", &keys.channel, "0"]),
                vec!["GET", handoff],
                cancel(&keys, &ck, "B"),
                vec!["GET", handoff],
                eval(acquire, k, &["D", "#D:1", lease, "0"]),
                cancel(&keys, &ck, "C"),
                vec!["EXISTS", handoff],
                eval(acquire, k, &["D", "#D:2", lease, "0"]),
                vec!["EXEC"],
            ],
        )
        .await
        .unwrap();
        assert_eq!(ints(&replies[0])[..2], [1, 1], "{kind:?}: A holds");
        assert_eq!(ints(&replies[1])[0], 0, "{kind:?}: B waits");
        assert_eq!(ints(&replies[2])[0], 0, "{kind:?}: C waits");
        let exec = replies[12].as_array().expect("an EXEC reply");
        assert_eq!(ints(&exec[0]), [1, 0], "{kind:?}: A releases");
        assert_eq!(exec[1].as_str(), Some("B"), "{kind:?}: reserved for B");
        assert_eq!(ints(&exec[2]), [1], "{kind:?}: B gives up");
        assert_eq!(exec[3].as_str(), Some("C"), "{kind:?}: and hands it to C");
        assert_eq!(ints(&exec[4])[0], 0, "{kind:?}: so D is refused");
        assert_eq!(ints(&exec[5]), [1], "{kind:?}: C gives up");
        assert_eq!(
            exec[6].as_int(),
            Some(0),
            "{kind:?}: nobody is left to reserve for"
        );
        assert_eq!(
            ints(&exec[7])[..2],
            [1, 1],
            "{kind:?}: D takes the lock at once"
        );

        let mut named = Vec::new();
        within(HANG, "the release messages", async {
            while named.len() < 2 {
                let message = messages.recv().await.unwrap();
                named.push(message.value.as_string().unwrap_or_default());
            }
        })
        .await;
        assert_eq!(
            named,
            ["p:B", "p:C"],
            "{kind:?}: each reserved waiter is named"
        );
        let _ = subscriber.quit().await;
    }
}

/// A waiter whose client died (it stopped retrying: here an entry with a 1 ms keep-alive) is
/// dropped once its keep-alive passed: inspection does not show it, and the next release reserves
/// the lock for the live waiter behind it, not for the dead one.
#[tokio::test]
async fn a_crashed_waiters_entry_is_pruned() {
    let server = spawned().await;
    let client = client(&server.url()).await;
    for kind in [Kind::Lock, Kind::FencedLock] {
        let name = unique("crashed-waiter");
        let keys = keys(kind, &name);
        let (acquire, release) = scripts(kind);
        let k = &keys.keys;
        let (handoff, timeouts) = (keys.aux("handoff").unwrap(), keys.aux("timeouts").unwrap());
        let lease = "30000";
        let subscriber = raw(&server.url()).await;
        subscriber.subscribe(keys.channel.as_str()).await.unwrap();
        let replies = send_commands(
            server.addr(),
            &[
                eval(acquire, k, &["A", "#A:1", lease, LONG]),
                eval(acquire, k, &["dead", "#dead:1", lease, "1"]),
                eval(acquire, k, &["live", "#live:1", lease, LONG]),
                vec!["TIME"],
            ],
        )
        .await
        .unwrap();
        assert_eq!(ints(&replies[1])[0], 0, "{kind:?}: the dead waiter waited");
        // The server's clock passes the dead waiter's 1 ms keep-alive.
        let joined = server_ms(&replies[3]);
        within(HANG, "the dead waiter's keep-alive to pass", async {
            loop {
                let time = send_commands(server.addr(), &[vec!["TIME"]]).await.unwrap();
                if server_ms(&time[0]) > joined + 1 {
                    return;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;

        let inspected = client.inspect(Some(kind), &name).await.unwrap();
        assert_eq!(
            inspected[0].waiters,
            ["live"],
            "{kind:?}: the dead waiter is not shown"
        );
        let replies = send_commands(
            server.addr(),
            &[
                eval(release, k, &["#A:1", &keys.channel, "0"]),
                vec!["GET", handoff],
                vec!["ZSCORE", timeouts, "dead"],
            ],
        )
        .await
        .unwrap();
        assert_eq!(ints(&replies[0]), [1, 0], "{kind:?}: released");
        assert_eq!(
            replies[1].as_str(),
            Some("live"),
            "{kind:?}: reserved for the live waiter, not the dead one"
        );
        assert!(replies[2].is_nil(), "{kind:?}: the dead entry is gone");
        let _ = subscriber.quit().await;
        let _ = raw(&server.url()).await.del::<u64, _>(k.clone()).await;
    }
}

/// A lock or a fenced lock, through one client.
#[derive(Clone)]
enum Handle {
    Lock(lockkit::Lock),
    Fenced(lockkit::FencedLock),
}

impl Handle {
    async fn try_lock(&self, wait: Duration) -> Option<lockkit::LockGuard> {
        let got = match self {
            Handle::Lock(lock) => lock.try_lock(wait, None).await,
            Handle::Fenced(lock) => lock.try_lock(wait, None).await,
        };
        got.unwrap()
    }
}

/// The messages of the events logged on this thread while it is installed (a current-thread
/// test runtime runs every task of the test's clients on it).
#[derive(Default, Clone)]
struct Events(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Events {
    fn count(&self, text: &str) -> usize {
        let events = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        events
            .iter()
            .filter(|message| message.contains(text))
            .count()
    }
}

struct Message<'a>(&'a mut String);

impl tracing::field::Visit for Message<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            *self.0 = format!("{value:?}");
        }
    }
}

impl tracing::Subscriber for Events {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        metadata.target().starts_with("lockkit")
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut message = String::new();
        event.record(&mut Message(&mut message));
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(message);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Only the reserved waiter's client wakes on a release (`p:<owner>`); every other client's
/// waiters sleep through the handoff window. So when the reserved owner is gone (its client died
/// while it waited: here an owner that joined the waiting set from a raw connection and never
/// subscribed), the other clients must wake a waiter themselves once the window has passed, or
/// the lock sits free until their keep-alive refresh. The waiter gets the lock, and it is that
/// end-of-window wake-up that woke it (removing it fails this test: the waiter is then served by
/// its refresh, 1.7 s later). The bench measures what it costs (`benches/contention.rs`, the
/// reserved-waiter line: about one window).
#[tokio::test]
async fn a_reservation_for_a_gone_waiter_wakes_the_others_when_its_window_passes() {
    let events = Events::default();
    let _installed = tracing::subscriber::set_default(events.clone());
    let server = spawned().await;
    let (holder, waiter) = (client(&server.url()).await, client(&server.url()).await);
    let raw = raw(&server.url()).await;
    for (round, kind) in [Kind::Lock, Kind::FencedLock].into_iter().enumerate() {
        let name = unique("gone-reserved-waiter");
        let keys = keys(kind, &name);
        let (acquire, _) = scripts(kind);
        let held = match kind {
            Kind::Lock => within(HANG, "lock", holder.lock(&name).lock())
                .await
                .unwrap(),
            _ => within(HANG, "lock", holder.fenced_lock(&name).lock())
                .await
                .unwrap(),
        };
        let replies = send_commands(
            server.addr(),
            &[eval(
                acquire,
                &keys.keys,
                &["ghost", "#ghost:1", "30000", LONG],
            )],
        )
        .await
        .unwrap();
        assert_eq!(ints(&replies[0])[0], 0, "{kind:?}: the gone owner waits");
        let waiting = {
            let (waiter, name) = (waiter.clone(), name.clone());
            tokio::spawn(async move {
                if kind == Kind::Lock {
                    let guard = waiter.lock(&name).lock().await.unwrap();
                    guard.unlock().await.unwrap();
                } else {
                    let guard = waiter.fenced_lock(&name).lock().await.unwrap();
                    guard.unlock().await.unwrap();
                }
            })
        };
        // The live waiter is in the waiting set (behind the gone one) and subscribed.
        let waiting_key = keys.aux("waiting").unwrap();
        within(HANG, "the live waiter to wait and subscribe", async {
            loop {
                let subscribed: Vec<(String, i64)> =
                    raw.pubsub_numsub(keys.channel.as_str()).await.unwrap();
                if zcard(&raw, waiting_key).await == 2
                    && subscribed.first().is_some_and(|(_, n)| *n > 0)
                {
                    return;
                }
                tokio::task::yield_now().await;
            }
        })
        .await;
        held.unlock().await.unwrap();
        within(HANG, "the live waiter to get the lock", waiting)
            .await
            .unwrap();
        assert_eq!(
            events.count("did not take it within the handoff window"),
            round + 1,
            "{kind:?}: the end-of-window wake-up served the live waiter"
        );
        let _ = raw.del::<u64, _>(keys.keys.clone()).await;
    }
}

/// What a lock's channel carries: a release with nobody waiting publishes nothing; a release
/// with a waiter names it (`p:B`) and reserves the lock for it; the reserved waiter taking the
/// lock announces `taken` (which the other clients' end-of-window wake-ups wait for); a try
/// during the reservation is told so (`{0, window, 1}`). A marker published last ends the
/// record, so a message that should not be there shows up before it.
#[tokio::test]
async fn a_lock_channel_carries_a_release_only_when_someone_waits_and_then_taken() {
    let server = spawned().await;
    for kind in [Kind::Lock, Kind::FencedLock] {
        let keys = keys(kind, &unique("channel-record"));
        let (acquire, release) = scripts(kind);
        let (k, channel) = (&keys.keys, keys.channel.as_str());
        let lease = "30000";
        let subscriber = raw(&server.url()).await;
        let mut messages = subscriber.message_rx();
        subscriber.subscribe(channel).await.unwrap();
        let replies = send_commands(
            server.addr(),
            &[
                eval(acquire, k, &["A", "#A:1", lease, LONG, channel, "0"]),
                eval(release, k, &["#A:1", channel, "0"]),
                eval(acquire, k, &["A", "#A:2", lease, LONG, channel, "0"]),
                eval(acquire, k, &["B", "#B:1", lease, LONG, channel, "0"]),
                vec!["MULTI"],
                eval(release, k, &["#A:2", channel, "0"]),
                eval(acquire, k, &["C", "#C:1", lease, "0", channel, "0"]),
                eval(acquire, k, &["B", "#B:2", lease, LONG, channel, "0"]),
                vec!["EXEC"],
                vec!["PUBLISH", channel, "end"],
            ],
        )
        .await
        .unwrap();
        assert_eq!(
            ints(&replies[1]),
            [1, 0],
            "{kind:?}: released, nobody waits"
        );
        assert_eq!(ints(&replies[3])[0], 0, "{kind:?}: B waits");
        let exec = replies[8].as_array().expect("an EXEC reply");
        assert_eq!(ints(&exec[0]), [1, 0], "{kind:?}: A releases");
        let reserved = ints(&exec[1]);
        assert_eq!(
            (reserved[0], reserved.get(2)),
            (0, Some(&1)),
            "{kind:?}: C is told the lock is reserved for another"
        );
        assert_eq!(
            ints(&exec[2])[..2],
            [1, 1],
            "{kind:?}: B takes its reservation"
        );

        let mut record = Vec::new();
        within(HANG, "the channel's messages", async {
            while record.last().map(String::as_str) != Some("end") {
                let message = messages.recv().await.unwrap();
                record.push(message.value.as_string().unwrap_or_default());
            }
        })
        .await;
        assert_eq!(record, ["p:B", "taken", "end"], "{kind:?}");
        let _ = subscriber.quit().await;
    }
}

/// Issue 19, §4: a look (`lock_acquire` with `ARGV[7]` = `1`, how a multi-lock waits for all its
/// members at once) takes nothing. On a free lock it answers `{2}` and writes nothing; on a held
/// one it joins the waiting set and keeps its place on the next look; once a release has reserved
/// the lock for it, it answers `{2}` and leaves the reservation standing (others are still told
/// the lock is reserved) until the owner's real acquire takes it.
#[tokio::test]
async fn a_look_takes_nothing_keeps_its_place_and_leaves_its_reservation_standing() {
    let server = spawned().await;
    let raw = raw(&server.url()).await;
    let subscriber = lockkit_suite::raw(&server.url()).await;
    let name = unique("look");
    let keys = keys(Kind::Lock, &name);
    // A subscriber on the channel, so a release reserves the lock for the longest waiter.
    subscriber.subscribe(keys.channel.as_str()).await.unwrap();
    let (acquire, release) = scripts(Kind::Lock);
    let look = |owner: &'static str| {
        eval(
            acquire,
            &keys.keys,
            &[owner, "#look", "30000", LONG, &keys.channel, "0", "1"],
        )
    };
    let score = |owner: &'static str| {
        let raw = raw.clone();
        let waiting = keys.aux("waiting").unwrap().to_owned();
        async move {
            let score: Option<String> = raw
                .custom(
                    CustomCommand::new_static("ZSCORE", ClusterHash::FirstKey, false),
                    vec![waiting.as_str(), owner],
                )
                .await
                .unwrap();
            score
        }
    };
    let handoff = || async {
        let reserved: Option<String> = raw.get(keys.aux("handoff").unwrap()).await.unwrap();
        reserved
    };

    let free = send_commands(server.addr(), &[look("M")]).await.unwrap();
    assert_eq!(ints(&free[0]), [2], "free: it would be granted");
    assert_eq!(
        raw.exists::<u64, _>(keys.keys.clone()).await.unwrap(),
        0,
        "nothing written"
    );

    let held = send_commands(
        server.addr(),
        &[
            eval(
                acquire,
                &keys.keys,
                &["H", "#H:1", "30000", "0", &keys.channel, "0"],
            ),
            look("M"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(ints(&held[0]), [1, 1]);
    assert_eq!(ints(&held[1])[0], 0, "held by H: busy");
    let place = score("M").await.expect("M stands in line");
    let again = send_commands(server.addr(), &[look("M")]).await.unwrap();
    assert_eq!(ints(&again[0])[0], 0);
    assert_eq!(
        score("M").await,
        Some(place),
        "a second look keeps the place"
    );

    let released = send_commands(
        server.addr(),
        &[
            eval(release, &keys.keys, &["#H:1", &keys.channel, "0"]),
            look("M"),
            // In the same batch: the handoff window is 10 ms.
            vec!["GET", keys.aux("handoff").unwrap()],
            eval(
                acquire,
                &keys.keys,
                &["O", "#O:1", "30000", "0", &keys.channel, "0"],
            ),
        ],
    )
    .await
    .unwrap();
    assert_eq!(ints(&released[0]), [1, 0], "H released the lock");
    assert_eq!(
        ints(&released[1]),
        [2],
        "reserved for M: it would be granted"
    );
    assert_eq!(
        released[2],
        lockkit_testkit::RespValue::Bulk(Some(b"M".to_vec())),
        "the reservation stands"
    );
    assert_eq!(ints(&released[3])[0..1], [0], "another owner is refused");
    assert_eq!(
        ints(&released[3]).get(2),
        Some(&1),
        "... because it is reserved"
    );

    let taken = send_commands(
        server.addr(),
        &[eval(
            acquire,
            &keys.keys,
            &["M", "#M:1", "30000", "0", &keys.channel, "0"],
        )],
    )
    .await
    .unwrap();
    assert_eq!(ints(&taken[0]), [1, 1], "M's real acquire takes it");
    assert_eq!(handoff().await, None);
    assert_eq!(score("M").await, None, "M left the line");
}
