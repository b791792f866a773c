//! [`MultiLock`]: several locks taken all-or-nothing, released together.

use std::future::Future;
use std::time::Duration;

use futures::future::{join_all, select_all};
use tokio::time::Instant;

use crate::error::Error;
use crate::exec::{Bound, Deadline};
use crate::lock::{Lock, LockGuard};

/// Several [`Lock`]s taken **all-or-nothing**: a successful acquire holds every one of them, a
/// failed or timed-out one holds none.
///
/// Get one with [`Client::multi_lock`](crate::Client::multi_lock). The locks may come from
/// different clients. They are always taken in the order of their names, so two multi-locks over
/// overlapping sets cannot deadlock each other.
///
/// Acquiring: try every lock without waiting; if one is busy, give back what was taken, wait
/// (event-driven, as [`Lock`]) for the busy one within what is left of `wait`, keep it, and try
/// the others again. If another lock is busy in that round, everything is given back again (the
/// lock waited for included) before the next wait: a multi-lock **never holds some of its locks
/// while it waits**, so it cannot deadlock with a plain holder of one of them who wants another.
/// The returned [`MultiLockGuard`] releases all of them.
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
        locks.sort_by(|a, b| a.name().cmp(b.name()));
        Self { locks }
    }

    /// The locks, in the order they are taken (by name).
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }

    /// Waits as long as it takes, then holds every lock in watchdog mode.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future gives back every lock taken so far.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an empty multi-lock or an invalid name; otherwise as
    /// [`Lock::lock`]. Nothing is held after an error.
    pub async fn lock(&self) -> Result<MultiLockGuard, Error> {
        loop {
            if let Some(guard) = self.acquire(None, None).await? {
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
            if let Some(guard) = self.acquire(None, Some(lease)).await? {
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
        let deadline = wait.and_then(|wait| Instant::now().checked_add(wait));
        // The lock waited for in the previous round, already held: (index, guard). It is put
        // back into `held` at its place in the order, or given back with `held` when an earlier
        // lock is busy: nothing is held across a wait (no hold-and-wait).
        let mut carried: Option<(usize, LockGuard)> = None;
        loop {
            let mut held: Vec<LockGuard> = Vec::with_capacity(self.locks.len());
            let mut busy = None;
            for (index, lock) in self.locks.iter().enumerate() {
                if let Some((_, guard)) = carried.take_if(|(i, _)| *i == index) {
                    held.push(guard);
                    continue;
                }
                match lock.try_lock(Duration::ZERO, lease).await {
                    Ok(Some(guard)) => held.push(guard),
                    Ok(None) => {
                        busy = Some((index, lock));
                        break;
                    }
                    Err(err) => {
                        held.extend(carried.take().map(|(_, guard)| guard));
                        release_all(held).await;
                        return Err(err);
                    }
                }
            }
            let Some((busy, lock)) = busy else {
                return Ok(Some(MultiLockGuard { guards: held }));
            };
            // Never sit on a subset while waiting: the carried lock too, when the busy one comes
            // before it in the order.
            held.extend(carried.take().map(|(_, guard)| guard));
            release_all(held).await;
            let remaining = match deadline {
                None => None,
                Some(deadline) => match deadline.checked_duration_since(Instant::now()) {
                    Some(left) if !left.is_zero() => Some(left),
                    _ => return Ok(None),
                },
            };
            let guard = match remaining {
                Some(left) => lock.try_lock(left, lease).await?,
                None => Some(match lease {
                    Some(lease) => lock.lock_with_lease(lease).await?,
                    None => lock.lock().await?,
                }),
            };
            match guard {
                Some(guard) => carried = Some((busy, guard)),
                None => return Ok(None),
            }
        }
    }
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
    /// The guards of the individual locks, in the order they were taken.
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
