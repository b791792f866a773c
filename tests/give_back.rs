//! A try cut off while Redis is frozen gives back whatever it may have taken, whatever the
//! server's script cache holds and however late the server answers (issue 27 §3, item 12).
//!
//! The scenario of the outage suite: a holder holds each object with a short fixed lease; Redis
//! is frozen (`SIGSTOP`); a second client's `try_*` is written into the frozen server and cut off
//! by its bound, so the call returns an error. The server stays frozen past the holder's lease
//! and past every bound of the give-back's first attempt, then resumes: it runs the try, which
//! takes the object (its holder's lease is over), and then the give-back. The server's script
//! cache was empty at the start and no release script ever ran on it, so the give-back's
//! `EVALSHA` is answered `NOSCRIPT`. Every object must be free again long before the try's own
//! lease ([`LEASE`], one minute) would have freed it.
//!
//! The same holds for a release that got no answer in time (`unlock()` against the frozen
//! server): it goes on in the background until the server answers.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::join_all;
use lockkit::protocol::keys::Kind;
use lockkit::{Client, Error};
use lockkit_suite::{client, spawned, unique, within};
use lockkit_testkit::RespValue;
use tokio::time::Instant;

/// The command timeout of the client whose tries are cut off: the bound of its give-back's
/// first attempt.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(1);
/// The `wait` of every try.
const WAIT: Duration = Duration::from_millis(500);
/// The holder's fixed lease: over before the server resumes.
const HOLDER_LEASE: Duration = Duration::from_secs(1);
/// The tries' lease (a fixed lease, and the watchdog timeout of the watchdog-mode try): what
/// would keep an object that is not given back.
const LEASE: Duration = Duration::from_secs(60);
/// How long the server stays frozen after the tries returned: longer than the command timeout,
/// so that every bound of the give-back's first attempt has run out before the server answers.
const FROZEN_PAST_THE_TRIES: Duration = Duration::from_secs(3);
/// How long an object may take to be free after the server resumed: a hang guard, half of
/// [`LEASE`], so that an object kept for the try's lease fails here.
const FREED_WITHIN: Duration = Duration::from_secs(30);
/// Hang guard of the other steps.
const HANG: Duration = Duration::from_secs(60);

type Call<'a> = Pin<Box<dyn Future<Output = Result<bool, Error>> + 'a>>;

/// Every kind of object that a try can take: (what, the object's kind and name(s) as
/// `inspect` finds them).
struct Objects {
    lock: String,
    watchdog_lock: String,
    fair: String,
    fenced: String,
    spin: String,
    rw_read: String,
    rw_write: String,
    semaphore: String,
    permits: String,
    multi: [String; 2],
    election: String,
}

impl Objects {
    fn new() -> Self {
        let n = |what: &str| unique(&format!("give-back-{what}"));
        Self {
            lock: n("lock"),
            watchdog_lock: n("watchdog-lock"),
            fair: n("fair"),
            fenced: n("fenced"),
            spin: n("spin"),
            rw_read: n("rw-read"),
            rw_write: n("rw-write"),
            semaphore: n("semaphore"),
            permits: n("permits"),
            multi: [n("multi-a"), n("multi-b")],
            election: n("election"),
        }
    }

    /// Every object, with its kind, for `inspect`.
    fn all(&self) -> Vec<(Kind, &str)> {
        vec![
            (Kind::Lock, &self.lock),
            (Kind::Lock, &self.watchdog_lock),
            (Kind::FairLock, &self.fair),
            (Kind::FencedLock, &self.fenced),
            (Kind::SpinLock, &self.spin),
            (Kind::ReadWriteLock, &self.rw_read),
            (Kind::ReadWriteLock, &self.rw_write),
            (Kind::Semaphore, &self.semaphore),
            (Kind::PermitExpirableSemaphore, &self.permits),
            (Kind::Lock, &self.multi[0]),
            (Kind::Lock, &self.multi[1]),
            (Kind::Election, &self.election),
        ]
    }
}

/// Whether the server has the script with this SHA1 cached.
async fn cached(server: &lockkit_testkit::RedisServer, sha1: &str) -> bool {
    match server.command(&["SCRIPT", "EXISTS", sha1]).await.unwrap() {
        RespValue::Array(Some(flags)) => flags == [RespValue::Int(1)],
        other => panic!("SCRIPT EXISTS answered {other:?}"),
    }
}

/// Waits until none of `objects` has a holder, failing (naming those still held) if that takes
/// [`FREED_WITHIN`].
async fn until_free(observer: &Client, objects: &[(Kind, &str)]) {
    let give_up = Instant::now() + FREED_WITHIN;
    loop {
        let mut held_still = Vec::new();
        for (kind, name) in objects {
            let found = observer.inspect(Some(*kind), name).await.unwrap();
            if found.iter().any(|object| !object.holders.is_empty()) {
                held_still.push(format!("{kind:?} `{name}`"));
            }
        }
        if held_still.is_empty() {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "{} of {} objects still held {FREED_WITHIN:?} after the server resumed: {}",
            held_still.len(),
            objects.len(),
            held_still.join(", ")
        );
        tokio::task::yield_now().await;
    }
}

/// A client whose calls are cut off by [`COMMAND_TIMEOUT`], with a watchdog timeout of [`LEASE`].
async fn short_timeout_client(url: &str) -> Client {
    within(
        HANG,
        "connect",
        Client::builder()
            .url(url)
            .command_timeout(COMMAND_TIMEOUT)
            .watchdog_timeout(LEASE)
            .build(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_try_cut_off_by_a_frozen_server_gives_back_what_it_took_once_the_server_answers() {
    let server = spawned().await;
    let url = server.url();
    server.command(&["SCRIPT", "FLUSH"]).await.unwrap();
    let holder = client(&url).await;
    let observer = client(&url).await;
    let contender = short_timeout_client(&url).await;
    let o = Objects::new();

    // The holder holds every object (its acquire scripts are now cached; no release script is).
    let h = &holder;
    assert!(h.semaphore(&o.semaphore).try_set_permits(1).await.unwrap());
    assert!(h
        .permit_expirable_semaphore(&o.permits)
        .try_set_permits(1)
        .await
        .unwrap());
    let mut held: Vec<Box<dyn std::any::Any>> = Vec::new();
    held.push(Box::new(
        h.lock(&o.lock).lock_with_lease(HOLDER_LEASE).await.unwrap(),
    ));
    held.push(Box::new(
        h.lock(&o.watchdog_lock)
            .lock_with_lease(HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    held.push(Box::new(
        h.fair_lock(&o.fair)
            .lock_with_lease(HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    let fenced = h
        .fenced_lock(&o.fenced)
        .lock_with_lease(HOLDER_LEASE)
        .await
        .unwrap();
    let holder_token = fenced.fencing_token();
    held.push(Box::new(fenced));
    held.push(Box::new(
        h.spin_lock(&o.spin)
            .lock_with_lease(HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    held.push(Box::new(
        h.read_write_lock(&o.rw_read)
            .write_lock_with_lease(HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    held.push(Box::new(
        h.read_write_lock(&o.rw_write)
            .read_lock_with_lease(HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    held.push(Box::new(
        h.semaphore(&o.semaphore)
            .acquire_with_lease(1, HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    held.push(Box::new(
        h.permit_expirable_semaphore(&o.permits)
            .acquire(HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    held.push(Box::new(
        h.multi_lock([h.lock(&o.multi[0]), h.lock(&o.multi[1])])
            .lock_with_lease(HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    held.push(Box::new(
        h.election(&o.election)
            .campaign_with_lease("holder", HOLDER_LEASE)
            .await
            .unwrap(),
    ));
    // Every hold above ends by this instant on the server (each lease counts from when its
    // script ran, before its reply came back).
    let holders_gone_at = Instant::now() + HOLDER_LEASE;
    // The scenario's precondition: the tries' scripts are cached, the give-backs' are not.
    assert!(cached(&server, lockkit::protocol::lock::ACQUIRE.sha1()).await);
    assert!(!cached(&server, lockkit::protocol::lock::RELEASE.sha1()).await);

    server.pause().unwrap();
    let c = &contender;
    let lease = Some(LEASE);
    // (what, the call; `Ok(true)`: it acquired, `Ok(false)`: it timed out)
    let tries: Vec<(&str, Call<'_>)> = vec![
        (
            "lock",
            Box::pin(async { Ok(c.lock(&o.lock).try_lock(WAIT, lease).await?.is_some()) }),
        ),
        (
            "lock (watchdog mode)",
            Box::pin(async {
                Ok(c.lock(&o.watchdog_lock)
                    .try_lock(WAIT, None)
                    .await?
                    .is_some())
            }),
        ),
        (
            "fair lock",
            Box::pin(async { Ok(c.fair_lock(&o.fair).try_lock(WAIT, lease).await?.is_some()) }),
        ),
        (
            "fenced lock",
            Box::pin(async {
                Ok(c.fenced_lock(&o.fenced)
                    .try_lock(WAIT, lease)
                    .await?
                    .is_some())
            }),
        ),
        (
            "spin lock",
            Box::pin(async { Ok(c.spin_lock(&o.spin).try_lock(WAIT, lease).await?.is_some()) }),
        ),
        (
            "read lock",
            Box::pin(async {
                Ok(c.read_write_lock(&o.rw_read)
                    .try_read_lock(WAIT, lease)
                    .await?
                    .is_some())
            }),
        ),
        (
            "write lock",
            Box::pin(async {
                Ok(c.read_write_lock(&o.rw_write)
                    .try_write_lock(WAIT, lease)
                    .await?
                    .is_some())
            }),
        ),
        (
            "semaphore",
            Box::pin(async {
                Ok(c.semaphore(&o.semaphore)
                    .try_acquire(1, WAIT, lease)
                    .await?
                    .is_some())
            }),
        ),
        (
            "permit-expirable semaphore",
            Box::pin(async {
                Ok(c.permit_expirable_semaphore(&o.permits)
                    .try_acquire(WAIT, LEASE)
                    .await?
                    .is_some())
            }),
        ),
        (
            "multi-lock",
            Box::pin(async {
                Ok(c.multi_lock([c.lock(&o.multi[0]), c.lock(&o.multi[1])])
                    .try_lock(WAIT, lease)
                    .await?
                    .is_some())
            }),
        ),
        (
            "election",
            Box::pin(async {
                Ok(c.election(&o.election)
                    .try_campaign("contender", WAIT, lease)
                    .await?
                    .is_some())
            }),
        ),
    ];
    let results = within(
        HANG,
        "the tries",
        join_all(
            tries
                .into_iter()
                .map(|(what, call)| async move { (what, call.await) }),
        ),
    )
    .await;
    let returned = Instant::now();
    for (what, result) in results {
        match result {
            Err(Error::Redis(err)) => assert!(err.is_timeout(), "{what}: {err:?}"),
            other => panic!("{what}: expected no answer from the frozen server, got {other:?}"),
        }
    }
    assert_eq!(contender.held_count(), 0, "nothing registered");

    // Frozen past the holders' leases and past the give-backs' first bound.
    tokio::time::sleep_until(holders_gone_at.max(returned + FROZEN_PAST_THE_TRIES)).await;
    server.resume().unwrap();

    // Every object becomes free, long before the tries' leases would free them.
    until_free(&observer, &o.all()).await;
    // The late try did run and take the fenced lock (minting the token after the holder's)
    // before its give-back freed it: the scenario happened as described.
    let fenced = observer
        .inspect(Some(Kind::FencedLock), &o.fenced)
        .await
        .unwrap();
    let last_token = fenced.first().and_then(|object| object.fencing_token);
    assert!(
        last_token.is_some_and(|token| token > holder_token),
        "no token after the holder's {holder_token}: {fenced:?}"
    );
    drop(held);
}

/// The same for a release that got no answer in time: `unlock()` (and `release()`, `resign()`)
/// against the frozen server returns its ambiguous error after the command timeout, and the
/// release it sent runs when the server resumes, answered `NOSCRIPT`. The release goes on in the
/// background until Redis answers: every object is free as soon as the server is back, not when
/// its lease (one minute) ends.
#[tokio::test]
async fn an_unlock_that_got_no_answer_gives_back_once_the_server_answers() {
    let server = spawned().await;
    let url = server.url();
    server.command(&["SCRIPT", "FLUSH"]).await.unwrap();
    let observer = client(&url).await;
    let holder = short_timeout_client(&url).await;
    let o = Objects::new();
    let h = &holder;
    assert!(h.semaphore(&o.semaphore).try_set_permits(1).await.unwrap());
    assert!(h
        .permit_expirable_semaphore(&o.permits)
        .try_set_permits(1)
        .await
        .unwrap());
    let lock = h.lock(&o.lock).lock_with_lease(LEASE).await.unwrap();
    let watchdog_lock = h.lock(&o.watchdog_lock).lock().await.unwrap();
    let fair = h.fair_lock(&o.fair).lock_with_lease(LEASE).await.unwrap();
    let fenced = h
        .fenced_lock(&o.fenced)
        .lock_with_lease(LEASE)
        .await
        .unwrap();
    let spin = h.spin_lock(&o.spin).lock_with_lease(LEASE).await.unwrap();
    let read = h
        .read_write_lock(&o.rw_read)
        .read_lock_with_lease(LEASE)
        .await
        .unwrap();
    let write = h
        .read_write_lock(&o.rw_write)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    let permit = h
        .semaphore(&o.semaphore)
        .acquire_with_lease(1, LEASE)
        .await
        .unwrap();
    let expirable = h
        .permit_expirable_semaphore(&o.permits)
        .acquire(LEASE)
        .await
        .unwrap();
    let multi = h
        .multi_lock([h.lock(&o.multi[0]), h.lock(&o.multi[1])])
        .lock_with_lease(LEASE)
        .await
        .unwrap();
    let leadership = h
        .election(&o.election)
        .campaign_with_lease("holder", LEASE)
        .await
        .unwrap();
    assert!(!cached(&server, lockkit::protocol::lock::RELEASE.sha1()).await);

    server.pause().unwrap();
    let releases: Vec<(&str, Call<'_>)> = vec![
        (
            "lock",
            Box::pin(async { lock.unlock().await.map(|()| true) }),
        ),
        (
            "lock (watchdog mode)",
            Box::pin(async { watchdog_lock.unlock().await.map(|()| true) }),
        ),
        (
            "fair lock",
            Box::pin(async { fair.unlock().await.map(|()| true) }),
        ),
        (
            "fenced lock",
            Box::pin(async { fenced.unlock().await.map(|()| true) }),
        ),
        (
            "spin lock",
            Box::pin(async { spin.unlock().await.map(|()| true) }),
        ),
        (
            "read lock",
            Box::pin(async { read.unlock().await.map(|()| true) }),
        ),
        (
            "write lock",
            Box::pin(async { write.unlock().await.map(|()| true) }),
        ),
        (
            "semaphore",
            Box::pin(async { permit.release().await.map(|()| true) }),
        ),
        (
            "permit-expirable semaphore",
            Box::pin(async { expirable.release().await.map(|()| true) }),
        ),
        (
            "multi-lock",
            Box::pin(async { multi.unlock().await.map(|()| true) }),
        ),
        (
            "election",
            Box::pin(async { leadership.resign().await.map(|()| true) }),
        ),
    ];
    let results = within(
        HANG,
        "the releases",
        join_all(
            releases
                .into_iter()
                .map(|(what, call)| async move { (what, call.await) }),
        ),
    )
    .await;
    let returned = Instant::now();
    for (what, result) in results {
        match result {
            Err(Error::Redis(err)) => assert!(err.is_ambiguous(), "{what}: {err:?}"),
            other => panic!("{what}: expected no answer from the frozen server, got {other:?}"),
        }
    }
    assert_eq!(holder.held_count(), 0, "nothing renewed any more");

    // Frozen past every release's bound.
    tokio::time::sleep_until(returned + FROZEN_PAST_THE_TRIES).await;
    server.resume().unwrap();
    until_free(&observer, &o.all()).await;
}
