//! [`MultiLock`]: several locks taken all-or-nothing, released together.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::{join_all, select_all, try_join_all};
use lockkit_protocol::lock::HANDOFF_WINDOW;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::During;
use crate::error::Error;
use crate::exec::{Bound, Deadline};
use crate::lock::{Lock, LockGuard, Member};

/// Several [`Lock`]s taken **all-or-nothing**: a successful acquire holds every one of them, a
/// failed or timed-out one holds none.
///
/// Get one with [`Client::multi_lock`](crate::Client::multi_lock). The locks may come from
/// different clients. They are always taken in the order of their names, so two multi-locks over
/// overlapping sets cannot deadlock each other.
///
/// Acquiring: try to take every lock at once, in order, without waiting. If one is busy, give
/// back what was taken, then wait, holding nothing, **in every member's waiting set at once**
/// (event-driven, as [`Lock`]) until each lock would be granted to the multi-lock: free, or
/// reserved for it by a release (as a lock is handed to its longest waiter); then take them all
/// again. Each member keeps one owner for the whole call, so its place in a lock's line, and a
/// reservation made for it, outlast a round in which another member was still busy: under steady
/// contention on its members a multi-lock gets its turn like any other waiter, where trying the
/// other members once would find them always held or reserved for someone else.
///
/// A multi-lock **never holds some of its locks while it waits**, so it cannot deadlock with a
/// plain holder of one of them who wants another. A reservation for it is not a hold: it lasts
/// the handoff window at most (10 ms, [`HANDOFF_WINDOW`]); when another of its locks is still
/// busy then, the multi-lock hands the reserved one on to that lock's next waiter at once (it
/// joins the line again for it), so the others lose no time.
/// The returned [`MultiLockGuard`] releases all of them.
///
/// # Naming a lock twice
/// A lock named more than once **through the same client** is one member: it is taken once,
/// listed once by [`locks`](MultiLock::locks), and held by one guard in
/// [`MultiLockGuard::guards`]. So a transfer from an account to itself (`from == to`) simply
/// holds that account's lock. Members are told apart by client, kind and name; objects of
/// different kinds never share a key, so only [`Lock`]s with the same name are merged.
///
/// The same name **through two clients** is kept as two members: the clients may talk to two
/// different Redis deployments, where the names are two different locks. If they turn out to be
/// one lock (both clients use the same Redis and key prefix), the multi-lock would wait for
/// itself; instead the acquire fails with [`Error::InvalidArgument`] as soon as it finds the
/// second member held by its own first one, holding nothing.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
/// // Move money between two accounts: hold both or neither.
/// let both = client.multi_lock([client.lock("account:1"), client.lock("account:2")]);
/// if let Some(guard) = both.try_lock(Duration::from_secs(5), None).await? {
///     // ... debit one, credit the other ...
///     guard.unlock().await?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

impl MultiLock {
    pub(crate) fn new(mut locks: Vec<Lock>) -> Self {
        // A stable sort: same-named locks of different clients keep the caller's order.
        locks.sort_by(|a, b| a.name().cmp(b.name()));
        // A lock named twice through one client is one member (`from == to`).
        let mut members: Vec<Lock> = Vec::with_capacity(locks.len());
        for lock in locks {
            if !members.iter().any(|m| m.identity() == lock.identity()) {
                members.push(lock);
            }
        }
        Self { locks: members }
    }

    /// The distinct locks, in the order they are taken (by name): a lock named more than once
    /// through the same client is listed once.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Waits as long as it takes, then holds every lock in watchdog mode.
    ///
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never a holder's lease later.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future gives back every lock taken so far.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty multi-lock, an invalid name, or one lock named
    /// through two clients of the same Redis (see [the type's docs](MultiLock)); otherwise as
    /// [`Lock::lock`]. Nothing is held after an error.
    pub async fn lock(&self) -> Result<MultiLockGuard, Error> {
        loop {
            if let Some(guard) = self.acquire(None, None).await.during("lock")? {
                return Ok(guard);
            }
        }
    }

    /// Waits as long as it takes, then holds every lock for `lease`, without renewal.
    ///
    /// # Cancel safety
    /// As [`lock`](MultiLock::lock).
    ///
    /// # Errors
    /// As [`lock`](MultiLock::lock); [`Error::InvalidArgument`] for a bad lease.
    pub async fn lock_with_lease(&self, lease: Duration) -> Result<MultiLockGuard, Error> {
        loop {
            if let Some(guard) = self
                .acquire(None, Some(lease))
                .await
                .during("lock_with_lease")?
            {
                return Ok(guard);
            }
        }
    }

    /// Tries to take every lock within `wait`; `lease: None` is watchdog mode. `Ok(None)` (and
    /// nothing held) when they could not all be taken in time.
    ///
    /// # Cancel safety
    /// As [`lock`](MultiLock::lock).
    ///
    /// # Errors
    /// As [`lock_with_lease`](MultiLock::lock_with_lease).
    pub async fn try_lock(
        &self,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<MultiLockGuard>, Error> {
        // Each member's try keeps to what is left of `wait`; this bounds the rest (giving back a
        // partial acquisition) the same way, so the whole call returns within `wait` plus one
        // round trip. Cut off, the future is dropped, and what it held is released in the
        // background.
        let started = Instant::now();
        let at = crate::exec::far_or(started, wait) + crate::exec::ROUND_TRIP;
        let bound = Deadline::at(at, started, Bound::Wait(wait));
        // Boxed, to keep the future's type shallow (see `Exec::ints_within`).
        bound
            .run("acquire", Box::pin(self.acquire(Some(wait), lease)))
            .await
            .map_err(|err| err.naming(&self.names()))
            .during("try_lock")
    }

    /// The members' names, for errors.
    fn names(&self) -> String {
        let names: Vec<&str> = self.locks.iter().map(Lock::name).collect();
        names.join(", ")
    }

    async fn acquire(
        &self,
        wait: Option<Duration>,
        lease: Option<Duration>,
    ) -> Result<Option<MultiLockGuard>, Error> {
        if self.locks.is_empty() {
            return Err(Error::InvalidArgument(
                "a multi-lock needs at least one lock".into(),
            ));
        }
        let started = Instant::now();
        let deadline = wait.and_then(|wait| started.checked_add(wait));
        // One owner per member for the whole call: its place in a member's waiting set, and a
        // reservation a release made for it, outlast a round in which another member was busy.
        let members = self
            .locks
            .iter()
            .map(|lock| lock.member(lease))
            .collect::<Result<Vec<Member<'_>>, Error>>()?;
        loop {
            // Take every member now, in order, without waiting.
            let mut held: Vec<LockGuard> = Vec::with_capacity(members.len());
            let mut busy = None;
            for (index, member) in members.iter().enumerate() {
                // Each take keeps to the call's own bound, which its error names: the wait
                // (plus one round trip for a try in flight at its end), or with no wait, the
                // command timeout of each try.
                let bound = match wait {
                    Some(wait) => Deadline::at(
                        crate::exec::far_or(started, wait)
                            .max(Instant::now() + crate::exec::ROUND_TRIP),
                        started,
                        Bound::Wait(wait),
                    ),
                    None => member.command_deadline(),
                };
                match member.take(bound).await {
                    Ok(Some(guard)) => held.push(guard),
                    Ok(None) => {
                        busy = Some(index);
                        break;
                    }
                    Err(err) => {
                        release_all(held).await;
                        return Err(err);
                    }
                }
            }
            let Some(busy) = busy else {
                members.iter().for_each(Member::granted);
                return Ok(Some(MultiLockGuard { guards: held }));
            };
            // The members after the busy one were seen free or reserved for this call: hand
            // their reservations on (the next round looks again).
            join_all(members[busy + 1..].iter().map(Member::pass)).await;
            let lock = &self.locks[busy];
            // A member busy because this multi-lock holds it through another client is one lock
            // named through two clients of the same Redis: waiting for it could never end.
            let twin = holds_already(lock, held.iter()).await;
            // Never sit on a subset while waiting.
            release_all(held).await;
            if twin? {
                return Err(Error::InvalidArgument(format!(
                    "a multi-lock names lock `{}` through two clients connected to the same \
                     Redis, so it would wait for itself; name each lock once, through one client",
                    lock.name()
                )));
            }
            let remaining = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(None),
                },
            };
            // Holding nothing, wait in every member's waiting set at once until each would be
            // granted to this multi-lock (free, or reserved for it by a release), then take
            // them all in the next round.
            match until_all_free(&members, remaining).await {
                Ok(true) => {}
                Ok(false) => return Ok(None),
                Err(err) => {
                    // The client shut down while the call waited: out of every member's line
                    // before the call returns (`Client::shutdown`), not in the background after.
                    if matches!(err, Error::Shutdown) {
                        join_all(members.iter().map(Member::pass)).await;
                    }
                    return Err(err);
                }
            }
        }
    }
}

/// Waits, holding nothing, in every member's waiting set at once until each would be granted to
/// the call (free, or reserved for it by a release); `false` when one did not within `wait`. An
/// error on one member ends the others' waits.
///
/// A member whose turn came while another still waits keeps what a release reserved for it for
/// the handoff window at most (other members freed by the same holder come within it), then
/// passes it on ([`Member::pass`]): the lock goes to its next waiter at once, where a reservation
/// that lapsed would wake nobody (since the direct grant, the next waiter would only find the
/// lock free at its keep-alive retry). The next round takes every member again, and waits in
/// line again for one that went on.
async fn until_all_free(members: &[Member<'_>], wait: Option<Duration>) -> Result<bool, Error> {
    let waiting = AtomicUsize::new(members.len());
    let all_free = Notify::new();
    let looks = members.iter().map(|member| {
        let (waiting, all_free) = (&waiting, &all_free);
        async move {
            if !member.until_free(wait).await? {
                return Ok(false);
            }
            // Registered before the count is read: the last member's notification is not missed.
            let others_free = all_free.notified();
            if waiting.fetch_sub(1, Ordering::AcqRel) == 1 {
                all_free.notify_waiters();
                return Ok(true);
            }
            tokio::select! {
                () = others_free => {}
                () = tokio::time::sleep(HANDOFF_WINDOW) => {
                    if waiting.load(Ordering::Acquire) > 0 {
                        member.pass().await;
                    }
                }
            }
            Ok::<_, Error>(true)
        }
    });
    Ok(!try_join_all(looks).await?.contains(&false))
}

/// Whether one of `guards` (held by this multi-lock) is a hold of `busy` itself, taken through
/// another client (see [`Lock::is_held_by`]).
async fn holds_already<'a>(
    busy: &Lock,
    guards: impl Iterator<Item = &'a LockGuard>,
) -> Result<bool, Error> {
    for guard in guards {
        if busy.is_held_by(guard).await? {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Gives back every guard, ignoring holds that were already gone.
async fn release_all(guards: Vec<LockGuard>) {
    for result in join_all(guards.into_iter().map(LockGuard::unlock)).await {
        if let Err(err) = result {
            tracing::debug!(
                "multi-lock: releasing a partial acquisition: {}",
                crate::error::Chain(&err)
            );
        }
    }
}

/// Holds every lock of a [`MultiLock`]. Releases them all when dropped.
#[must_use = "the locks are released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MultiLockGuard {
    guards: Vec<LockGuard>,
}

impl MultiLockGuard {
    /// The guards of the individual locks, one per distinct member (a lock named twice through
    /// one client has one guard), in the order they were taken.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether any of the leases is known to be gone.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Resolves when any of the leases is lost (or a lock is released).
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        let signals: Vec<_> = self
            .guards
            .iter()
            .map(|guard| Box::pin(guard.lost()))
            .collect();
        async move {
            if !signals.is_empty() {
                select_all(signals).await;
            }
        }
    }

    /// Releases every lock.
    ///
    /// # Cancel safety
    /// Locks whose release had not finished are released in the background.
    ///
    /// # Errors
    /// The first error among the releases ([`Error::NotHeld`] when a lease was already gone);
    /// every lock is released regardless.
    pub async fn unlock(self) -> Result<(), Error> {
        let mut first = Ok(());
        for result in join_all(self.guards.into_iter().map(LockGuard::unlock)).await {
            if let (Ok(()), Err(err)) = (&first, result) {
                first = Err(err);
            }
        }
        first
    }
}
