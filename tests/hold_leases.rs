//! No hold outlives its own lease (issue 11, item 2), for every reentrant hash lock (lock, fenced
//! lock, fair lock): a re-entry with a short fixed lease inside a watchdog hold, and a watchdog
//! re-entry inside a short fixed hold, each end on time, checked from another client; a hold whose
//! lease ended is gone (`NotHeld`), and renewal neither revives it nor keeps another hold alive.

use std::time::Duration;

use lockkit::{Client, Error, LockGuard};
use lockkit_suite::{client, eval, ints, redis, server_ms, spawned, unique, within};

const HANG: Duration = Duration::from_secs(60);
/// How long the other client may wait for the lock: far longer than the short leases below (1 to
/// 2 s), far shorter than the watchdog lease (30 s) that used to keep the lock.
const OTHER_WAITS: Duration = Duration::from_secs(5);

/// A handle on one of the reentrant hash locks.
#[derive(Clone)]
enum Handle {
    Lock(lockkit::Lock),
    Fenced(lockkit::FencedLock),
    Fair(lockkit::FairLock),
}

impl Handle {
    fn all(client: &Client, name: &str) -> [Handle; 3] {
        [
            Handle::Lock(client.lock(format!("{name}:lock"))),
            Handle::Fenced(client.fenced_lock(format!("{name}:fenced"))),
            Handle::Fair(client.fair_lock(format!("{name}:fair"))),
        ]
    }

    /// The same lock through another client.
    fn on(&self, client: &Client) -> Handle {
        match self {
            Handle::Lock(lock) => Handle::Lock(client.lock(lock.name())),
            Handle::Fenced(lock) => Handle::Fenced(client.fenced_lock(lock.name())),
            Handle::Fair(lock) => Handle::Fair(client.fair_lock(lock.name())),
        }
    }

    fn name(&self) -> &str {
        match self {
            Handle::Lock(lock) => lock.name(),
            Handle::Fenced(lock) => lock.name(),
            Handle::Fair(lock) => lock.name(),
        }
    }

    async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<LockGuard>, Error> {
        match self {
            Handle::Lock(lock) => lock.try_lock(wait, lease).await,
            Handle::Fenced(lock) => lock
                .try_lock(wait, lease)
                .await
                .map(|guard| guard.map(LockGuard::from)),
            Handle::Fair(lock) => lock.try_lock(wait, lease).await,
        }
    }

    /// Takes the lock at once (it is free), or fails the test.
    async fn take(&self, lease: Option<Duration>) -> LockGuard {
        let guard = within(HANG, "acquire", self.try_lock(Duration::ZERO, lease)).await;
        guard.unwrap().expect("the lock is free")
    }

    /// Re-enters inside `outer`'s scope, or fails the test.
    async fn reenter(&self, outer: &LockGuard, lease: Option<Duration>) -> LockGuard {
        let inner = outer.scope(self.take(lease)).await;
        assert_eq!(inner.hold_count(), 2, "{}: a re-entry", self.name());
        inner
    }
}

/// Outer hold in watchdog mode, inner re-entry with a fixed 1 s lease. Once the outer hold is
/// given back, only the inner hold keeps the lock, for what is left of its own second: another
/// client gets the lock then, not after the watchdog's 30 s. The inner guard's unlock finds its
/// hold gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_reentry_inside_a_watchdog_hold_ends_with_its_own_lease() {
    one_hold_outlives_the_other(None, Some(Duration::from_secs(1)), "short-inner").await;
}

/// Outer hold with a fixed 2 s lease, inner re-entry in watchdog mode. Once the inner hold is
/// given back, the lock frees when the outer lease ends, not 30 s later; the outer guard's
/// unlock then finds its hold gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchdog_reentry_inside_a_short_hold_does_not_stretch_it() {
    one_hold_outlives_the_other(Some(Duration::from_secs(2)), None, "short-outer").await;
}

/// For each kind: an outer hold with `outer` lease and a re-entry with `inner` lease; the one in
/// watchdog mode (`None`) is given back first. The hold left has a short fixed lease: another
/// client gets the lock once it ends, and its guard's unlock then finds it gone.
async fn one_hold_outlives_the_other(outer: Option<Duration>, inner: Option<Duration>, name: &str) {
    let redis = redis().await;
    let (holder, other) = (client(&redis.url()).await, client(&redis.url()).await);
    for lock in Handle::all(&holder, &unique(name)) {
        let outer_guard = lock.take(outer).await;
        let inner_guard = lock.reenter(&outer_guard, inner).await;
        let (released, left) = if outer.is_none() {
            (outer_guard, inner_guard)
        } else {
            (inner_guard, outer_guard)
        };
        released.unlock().await.unwrap();

        let next = within(
            HANG,
            "the other client",
            lock.on(&other).try_lock(OTHER_WAITS, None),
        )
        .await
        .unwrap();
        let next = next.unwrap_or_else(|| {
            panic!(
                "{}: still held {OTHER_WAITS:?} after the watchdog hold was given back, although \
                 the only hold left had a lease of {:?}",
                lock.name(),
                outer.or(inner)
            )
        });
        let unlocked = left.unlock().await;
        assert!(
            matches!(unlocked, Err(Error::NotHeld { .. })),
            "{}: the short hold's lease ended: {unlocked:?}",
            lock.name()
        );
        next.unlock().await.unwrap();
    }
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// The scripts themselves, for each kind: renewal moves only the renewed hold's expiry, and never
/// revives a hold whose own lease ended while another hold of the same owner keeps the lock; the
/// release of that hold finds it gone, and giving back the last live hold frees the lock.
#[tokio::test]
async fn renewal_extends_only_the_named_hold_and_never_revives_an_expired_one() {
    use lockkit::protocol::keys::{Kind, Namespace};
    use lockkit::protocol::lock::HoldEntry;
    use lockkit::protocol::{fair_lock, fenced_lock, lock};

    let server = spawned().await;
    let addr = server.addr();
    for (kind, acquire, release) in [
        (Kind::Lock, &lock::ACQUIRE, &lock::RELEASE),
        (
            Kind::FencedLock,
            &fenced_lock::ACQUIRE,
            &fenced_lock::RELEASE,
        ),
        (Kind::FairLock, &fair_lock::ACQUIRE, &fair_lock::RELEASE),
    ] {
        let keys = Namespace::default().object(kind, &unique("renew")).unwrap();
        let (k, channel) = (&keys.keys, keys.channel.as_str());
        let (acquire, release, renew) = (acquire.source(), release.source(), lock::RENEW.source());
        // The acquire's ARGV after owner, marker and lease: try once, never wait.
        let once: &[&str] = if kind == Kind::FairLock {
            &["A:w1", "0", channel, "0"]
        } else {
            &["0"]
        };
        let take = |marker: &'static str, lease: &'static str| {
            let mut args = vec!["A", marker, lease];
            args.extend_from_slice(once);
            eval(acquire, k, &args)
        };

        // Two holds of 2 s; renewing the second to a minute leaves the first's expiry alone.
        let replies = run(
            addr,
            &[
                take("#A:1", "2000"),
                take("#A:2", "2000"),
                eval(renew, k, &["#A:2", "60000"]),
                vec!["HGET", &keys.key, "#A:1"],
                vec!["HGET", &keys.key, "#A:2"],
            ],
        )
        .await;
        assert_eq!(ints(&replies[2]), [1], "{kind:?}: renewed");
        let expiry = |reply: &lockkit_testkit::RespValue, marker: &str| {
            HoldEntry::parse(marker, reply.as_str().expect("a marker value"))
                .unwrap_or_else(|| panic!("{kind:?}: {marker} holds its expiry: {reply:?}"))
                .expiry_ms
        };
        let (first, second) = (expiry(&replies[3], "#A:1"), expiry(&replies[4], "#A:2"));
        assert!(
            second >= first + 50_000,
            "{kind:?}: only the renewed hold moved: {first} / {second}"
        );

        // A third hold of 1 ms, whose lease ends while the renewed hold keeps the lock: the
        // server's clock passes it.
        let replies = run(addr, &[take("#A:3", "1"), vec!["TIME"]]).await;
        let taken = server_ms(&replies[1]);
        within(HANG, "the 1 ms lease to end", async {
            while server_ms(&run(addr, &[vec!["TIME"]]).await[0]) <= taken + 1 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        let replies = run(
            addr,
            &[
                eval(renew, k, &["#A:3", "60000"]),
                eval(release, k, &["#A:3", channel, "0"]),
                eval(release, k, &["#A:1", channel, "0"]),
                eval(release, k, &["#A:2", channel, "0"]),
                vec!["EXISTS", &keys.key],
            ],
        )
        .await;
        assert_eq!(
            ints(&replies[0]),
            [0],
            "{kind:?}: an ended hold is not revived"
        );
        assert_eq!(ints(&replies[1]), [0, 0], "{kind:?}: nor released");
        assert_eq!(ints(&replies[2]), [2, 1], "{kind:?}: one live hold left");
        assert_eq!(ints(&replies[3]), [1, 0], "{kind:?}: the last one frees it");
        assert_eq!(replies[4].as_int(), Some(0), "{kind:?}: nothing left");
    }
}

/// Sends `commands` in one pipelined exchange; their replies.
async fn run(
    addr: std::net::SocketAddr,
    commands: &[Vec<&str>],
) -> Vec<lockkit_testkit::RespValue> {
    lockkit_testkit::send_commands(addr, commands)
        .await
        .unwrap()
}

/// A guard that has reported itself lost answers `NotHeld` from `unlock()`, even when its
/// conservative local deadline passed before Redis expired the hold and the release still found
/// it there. A proxy delays every chunk by 300 ms, so the acquire reaches Redis at least 300 ms
/// after it was sent: Redis ends the hold at least 300 ms after the guard's own deadline, and the
/// unlock sent right after `lost()` resolved finds it there every time. The release still frees
/// the lock at once.
#[tokio::test]
async fn a_guard_that_reported_itself_lost_unlocks_with_not_held_every_time() {
    let server = spawned().await;
    let proxy = lockkit_testkit::FaultProxy::start(server.addr())
        .await
        .unwrap();
    let holder = client(&proxy.url()).await;
    let other = client(&server.url()).await;
    // Scripts cached before the delay: a `NOSCRIPT` answer would double the delayed round trip
    // of a try, past the one round trip (1 s) an acquire is given beyond its `wait` of zero.
    for spin in [false, true] {
        let name = unique("lost-unlock-warm-up");
        if spin {
            let guard = holder.spin_lock(&name).try_lock(Duration::ZERO, None).await;
            guard.unwrap().expect("free").unlock().await.unwrap();
        } else {
            let guard = holder.lock(&name).try_lock(Duration::ZERO, None).await;
            guard.unwrap().expect("free").unlock().await.unwrap();
        }
    }
    for spin in [false, true] {
        let name = unique(&format!("lost-unlock-{spin}"));
        // Far longer than the delayed round trip (a few chunks of 300 ms each way).
        let lease = Some(Duration::from_secs(3));
        proxy.set_delay(Duration::from_millis(300));
        let guard = if spin {
            holder
                .spin_lock(&name)
                .try_lock(Duration::ZERO, lease)
                .await
        } else {
            holder.lock(&name).try_lock(Duration::ZERO, lease).await
        };
        let guard = guard.unwrap().expect("free");
        proxy.set_delay(Duration::ZERO);
        assert!(
            !guard.is_lost(),
            "spin = {spin}: lost before its lease could end"
        );
        within(HANG, "the guard's lost signal", guard.lost()).await;
        assert!(guard.is_lost());
        let unlocked = guard.unlock().await;
        assert!(
            matches!(unlocked, Err(Error::NotHeld { .. })),
            "spin = {spin}: a lost guard's unlock must say NotHeld, got {unlocked:?}"
        );
        // The release still went through: the lock is free before Redis would have expired it.
        let taken = if spin {
            other
                .spin_lock(&name)
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .is_some()
        } else {
            other
                .lock(&name)
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .is_some()
        };
        assert!(taken, "spin = {spin}: the lost hold was still released");
    }
}

/// An acquire cancelled after its script was sent, before the reply, never had a lease: its hold
/// is given back in the background without being reported lost (no "lease lost" warning), and
/// the lock is free afterwards.
#[tokio::test]
async fn a_cancelled_acquires_hold_is_given_back_without_a_lost_lease() {
    let warnings = lockkit_suite::Warnings::default();
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    let server = spawned().await;
    let proxy = lockkit_testkit::FaultProxy::start(server.addr())
        .await
        .unwrap();
    let holder = client(&proxy.url()).await;
    let other = client(&server.url()).await;
    let name = unique("cancelled-acquire");
    proxy.pause();
    let lock = holder.lock(&name);
    let attempt = lock.try_lock(Duration::ZERO, Some(Duration::from_secs(60)));
    // The request is written and held in the proxy; the future is dropped before any reply.
    assert!(tokio::time::timeout(Duration::from_millis(200), attempt)
        .await
        .is_err());
    proxy.resume();
    let lock = other.lock(&name);
    let freed = within(
        HANG,
        "the cancelled acquire's hold to be given back",
        async {
            loop {
                if let Some(guard) = lock.try_lock(Duration::from_secs(1), None).await.unwrap() {
                    break guard;
                }
            }
        },
    )
    .await;
    freed.unlock().await.unwrap();
    let seen = warnings.take();
    assert!(
        !seen.iter().any(|text| text.contains("lease lost")),
        "a hold that was never granted was reported lost: {seen:?}"
    );
}

/// A hold in its last millisecond counts as ended (`hold_lib.lua`'s `live`). Redis expires the
/// lock key with its latest hold, on a clock that can pass a millisecond boundary during a script
/// that read `TIME` before it: a release that took the owner's other hold, 1 ms from its expiry,
/// for live found the owner's count gone with the key and replied `{2, nil}` (about 2 % of such
/// releases; `model_locks` found it), and a re-entry was refused. Here the other hold is written
/// to expire 1 ms after the release's `TIME` (or already at it, if a millisecond passed between
/// the two scripts): the release frees the lock, never "still held" with a count, never `{2, nil}`.
#[tokio::test]
async fn a_hold_in_its_last_millisecond_counts_as_ended() {
    use lockkit::protocol::keys::{Kind, Namespace};
    use lockkit::protocol::{fair_lock, fenced_lock, lock};

    // Two holds of owner A: #A:1 ends 1 ms after the script's TIME, #A:2 a minute later.
    const SETUP: &str = "local t = redis.call('TIME') \
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
        redis.call('HSET', KEYS[1], 'A', 2, '#A:1', string.format('%d', now + 1) .. ' A', \
          '#A:2', string.format('%d', now + 60000) .. ' A') \
        redis.call('PEXPIREAT', KEYS[1], now + 60000) \
        return {now}";
    let server = spawned().await;
    for (kind, release) in [
        (Kind::Lock, &lock::RELEASE),
        (Kind::FencedLock, &fenced_lock::RELEASE),
        (Kind::FairLock, &fair_lock::RELEASE),
    ] {
        for round in 0..50 {
            let keys = Namespace::default()
                .object(kind, &unique("last-millisecond"))
                .unwrap();
            let (k, channel) = (&keys.keys, keys.channel.as_str());
            let replies = run(
                server.addr(),
                &[
                    eval(SETUP, &k[..1], &[]),
                    eval(release.source(), k, &["#A:2", channel, "0"]),
                ],
            )
            .await;
            assert_eq!(
                ints(&replies[1]),
                [1, 0],
                "{kind:?}, round {round}: the hold in its last millisecond is not live"
            );
        }
    }
}

/// The same rule in the release's common path (`lock_release_last.lua`, the one hold of a lock
/// nobody waits for, given back before the libraries are defined): the lock's one hold, written
/// to expire 1 ms after the release's `TIME` (the key kept longer, as Redis' own expiry clock may
/// still keep it at that instant), is not live: the release says "not held", as the library's
/// `live` does, and never "released".
#[tokio::test]
async fn the_last_hold_in_its_last_millisecond_counts_as_ended_in_the_common_path() {
    use lockkit::protocol::keys::{Kind, Namespace};
    use lockkit::protocol::lock;

    const SETUP: &str = "local t = redis.call('TIME') \
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) \
        redis.call('HSET', KEYS[1], 'A', 1, '#A:1', string.format('%d', now + 1) .. ' A') \
        redis.call('PEXPIREAT', KEYS[1], now + 60000) \
        return {now}";
    let server = spawned().await;
    for round in 0..20 {
        let keys = Namespace::default()
            .object(Kind::Lock, &unique("last-millisecond-common"))
            .unwrap();
        let (k, channel) = (&keys.keys, keys.channel.as_str());
        let replies = run(
            server.addr(),
            &[
                eval(SETUP, &k[..1], &[]),
                eval(lock::RELEASE.source(), k, &["#A:1", channel, "0"]),
            ],
        )
        .await;
        assert_eq!(
            ints(&replies[1]),
            [0, 0],
            "round {round}: the hold in its last millisecond was released as live"
        );
    }
}
