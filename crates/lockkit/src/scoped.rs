//! Closure helpers: run a future under a lock and release the lock afterwards, whatever happens.
//!
//! [`Lock::with_lock`], [`FencedLock::with_lock`] and [`FairLock::with_lock`] (and their
//! `try_with_lock`) take the lock, hand the closure a [`Lease`] (the hold's lost-signal and
//! fencing token), await the closure's future, then unlock. The work is written once here: the
//! three lock types only differ in how they acquire, and each returns a [`LockGuard`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::error::During;
use crate::error::Error;
use crate::hold::Hold;
use crate::{FairLock, FencedLock, Lock, LockGuard};

/// The hold a closure runs under, as [`with_lock`](Lock::with_lock) hands it to the closure.
///
/// Cheap to clone, `Send + Sync + 'static`: it can be moved into spawned tasks. It does not keep
/// the lock: the lock is released when the closure's future completes, whatever clones remain.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// # async fn step(_i: u32) {}
/// let done = client
///     .lock("reindex")
///     .with_lock(|lease| async move {
///         for i in 0..1000 {
///             if lease.is_lost() {
///                 return false; // stop: another instance may hold the lock now
///             }
///             step(i).await;
///         }
///         true
///     })
///     .await?;
/// # let _ = done;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Lease {
    hold: Arc<Hold>,
    fencing_token: Option<u64>,
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("name", &self.hold.name)
            .field("watchdog", &self.hold.watchdog)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.hold.is_lost())
            .finish()
    }
}

impl Lease {
    fn of(guard: &LockGuard) -> Self {
        Self {
            hold: Arc::clone(guard.hold()),
            fencing_token: guard.fencing_token(),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// Whether the lease is known to be gone (see [`LockGuard::is_lost`]). Once `true`, it stays
    /// `true`; it also becomes `true` once the closure has returned and the lock was released.
    pub fn is_lost(&self) -> bool {
        self.hold.is_lost()
    }

    /// Resolves when [`is_lost`](Lease::is_lost) becomes true (see [`LockGuard::lost`]). Race it
    /// against the work with `tokio::select!` to stop a critical section that must not outlive
    /// its lease. Does not borrow the lease.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.hold.lost_signal()
    }

    /// The fencing token of the acquisition: `Some` under a [`FencedLock`], `None` otherwise.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }
}

/// Runs `f` under `guard`, inside the guard's [scope](LockGuard::scope), then unlocks it.
///
/// If `f`'s future panics or is dropped, `guard` is dropped with it and released in the
/// background (the guard's own drop behaviour).
async fn run_under<F, Fut, T>(guard: LockGuard, f: F) -> Result<T, Error>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = T>,
{
    let lease = Lease::of(&guard);
    // The body runs in the holder's scope: acquires of this lock inside it re-enter.
    let out = guard.scope(f(lease.clone())).await;
    // Read before unlocking: a released hold reports itself lost.
    let lost = lease.is_lost();
    let released = guard.unlock().await;
    match released {
        Ok(()) if !lost => Ok(out),
        Ok(()) | Err(Error::NotHeld { .. }) => {
            tracing::warn!(
                name = %lease.name(),
                "the lease was lost while the closure ran; its result is discarded"
            );
            Err(Error::NotHeld {
                name: lease.name().to_owned(),
            })
        }
        Err(err) => Err(err),
    }
}

macro_rules! closure_helpers {
    ($ty:ident) => {
        impl $ty {
            /// Waits as long as it takes for the lock (watchdog mode), runs `f` under it, then
            /// releases it and returns what `f`'s future returned.
            ///
            /// `f` gets a [`Lease`]: check [`Lease::is_lost`] or race [`Lease::lost`] to stop a
            /// long section whose lease is gone.
            ///
            /// `f`'s future runs inside the hold's [scope](LockGuard::scope): an acquire of the
            /// same lock through the same client anywhere inside it (a nested `with_lock`, a
            /// plain `lock()` or `try_lock()`, a `#[locked]` function) re-enters. Two
            /// `with_lock` calls that are not nested (two futures of one `join!`) exclude each
            /// other.
            ///
            /// If the future panics, or the future returned by `with_lock` is dropped (cancelled),
            /// the lock is released in the background, as when a guard is dropped.
            ///
            /// # Errors
            /// As `lock()`. [`Error::NotHeld`] when the lease was lost while `f` ran (the section
            /// may have overlapped with another holder's; `f`'s result is discarded). An error of
            /// the release itself ([`Error::Redis`]: the hold then runs out its lease;
            /// [`Error::Shutdown`]) is returned as well, and `f`'s result discarded.
            pub async fn with_lock<F, Fut, T>(&self, f: F) -> Result<T, Error>
            where
                F: FnOnce(Lease) -> Fut,
                Fut: Future<Output = T>,
            {
                let guard = self.lock().await.during("with_lock")?;
                run_under(guard.into(), f).await
            }

            /// Like [`with_lock`](Self::with_lock), but waits at most `wait` for the lock and
            /// holds it with `lease` (`None`: watchdog mode; `Some`: a fixed lease, as in
            /// `try_lock`). Returns `Ok(None)` without running `f` when the lock was not
            /// acquired in time.
            ///
            /// # Errors
            /// As `try_lock` and [`with_lock`](Self::with_lock).
            pub async fn try_with_lock<F, Fut, T>(
                &self,
                wait: Duration,
                lease: Option<Duration>,
                f: F,
            ) -> Result<Option<T>, Error>
            where
                F: FnOnce(Lease) -> Fut,
                Fut: Future<Output = T>,
            {
                match self.try_lock(wait, lease).await.during("try_with_lock")? {
                    Some(guard) => run_under(guard.into(), f).await.map(Some),
                    None => Ok(None),
                }
            }
        }
    };
}

closure_helpers!(Lock);
closure_helpers!(FencedLock);
closure_helpers!(FairLock);

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn lease_is_a_cheap_owned_handle() {
        bounds::<Lease>();
    }
}
