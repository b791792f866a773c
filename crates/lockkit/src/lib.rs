//! Distributed locks for async Rust, on Redis: reentrant, renewed by a watchdog, woken by
//! pub/sub, and honest about losing a lease.
//!
//! When an application runs as several instances, `tokio::sync::Mutex` protects nothing across
//! them: two pods both read `stock = 1` and both sell the last item; a 02:00 report job runs once
//! per pod. lockkit gives those instances one lock, kept in Redis.
//!
//! ```no_run
//! # async fn demo() -> Result<(), lockkit::Error> {
//! use std::time::Duration;
//!
//! let client = lockkit::Client::connect("redis://127.0.0.1:6379").await?;
//! let lock = client.lock("order:42");
//!
//! // Wait up to 5 s; hold in watchdog mode (30 s lease, renewed every 10 s while held).
//! if let Some(guard) = lock.try_lock(Duration::from_secs(5), None).await? {
//!     // ... read stock, decrement, write back ...
//!     guard.unlock().await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # A tour
//!
//! - [`Client`]: one per process. It owns the Redis connection, a **watchdog** task that renews
//!   every watchdog-mode hold in batches, and a **waiter hub** that subscribes to release
//!   channels while tasks wait. Build one with [`Client::connect`] or [`Client::builder`].
//! - [`Lock`]: a reentrant lock, from [`Client::lock`]. `lock()`, `lock_with_lease()`,
//!   `try_lock(wait, lease)`, plus `is_locked`, `hold_count`, `remaining_ttl`, `force_unlock`.
//! - [`LockGuard`]: one hold. `unlock()` releases it and tells you whether it was still yours;
//!   dropping it releases in the background. `is_lost()` and `lost()` tell you when the lease is
//!   gone, so a long critical section can stop.
//! - The rest of the family, with the same conventions (`try_*` with `wait` and
//!   `lease: Option<Duration>`, guards that release on drop and report lost leases):
//!   - [`FencedLock`]: every acquisition carries a strictly increasing fencing token, for storage
//!     that rejects a paused holder's late write;
//!   - [`FairLock`]: granted in request order across clients;
//!   - [`ReadWriteLock`]: many readers or one writer; each read hold expires on its own;
//!   - [`SpinLock`]: the plain `SET NX PX` lock, polling with backoff instead of pub/sub;
//!   - [`MultiLock`]: several locks, all or nothing;
//!   - [`Semaphore`]: at most N at a time, with **leased** permits that a crashed holder gives
//!     back; [`PermitExpirableSemaphore`]: permits with ids, released by id from anywhere;
//!   - [`CountDownLatch`]: wait until N things have happened;
//!   - [`Election`]: one leader among candidates, with a fencing term, a value everyone can
//!     read ([`Election::leader`]) and a stream of changes ([`Election::observe`]).
//!
//! - Around them:
//!   - closure helpers: [`Lock::with_lock`] / [`Lock::try_with_lock`] (also on [`FencedLock`] and
//!     [`FairLock`]) run a future under the lock and release it afterwards whatever happens; the
//!     future gets a [`Lease`] whose [`lost`](Lease::lost) signal lets it stop in time;
//!   - scheduled jobs: [`Client::run_exclusive`] (run on one instance, skip on the others) and
//!     [`Client::once_per`] (at most once per window across instances, whatever their clocks);
//!   - inspection: [`Client::inspect`] and [`Client::list`] (what the `lockkit` command prints);
//!   - the `#[lockkit::locked]` attribute (feature `macros`) and metrics (feature `metrics`).
//!
//! [The guide](https://github.com/lockkit-rs/lockkit/blob/main/docs/guide.md) says which to use
//! when, and how each behaves under failure.
//!
//! # Coming from `tokio::sync`
//!
//! The names follow tokio's where the behaviour matches; where lockkit's name differs, searching
//! the docs for tokio's name finds lockkit's method (`#[doc(alias)]`). Two differences matter
//! most: **`try_lock` takes a `wait`** and waits up to it (tokio's never waits: pass
//! `Duration::ZERO` for that), and every hold has a **lease** (`None`: renewed by the watchdog
//! while the guard lives).
//!
//! | `tokio::sync` (one process) | lockkit (every process sharing the Redis) |
//! |---|---|
//! | `Mutex::lock().await`, `lock_owned()` | [`Lock::lock`]: waits without bound; the guard is always owned (`'static`, `Send`), so it can move into `spawn` and be unlocked there |
//! | `Mutex::try_lock()` (never waits) | [`Lock::try_lock`]`(Duration::ZERO, None)` → `Ok(None)` when taken |
//! | `timeout(d, mutex.lock())` | [`Lock::try_lock`]`(d, None)` → `Ok(None)` after `d`; `Some(lease)` for a fixed lease instead of the watchdog |
//! | dropping the guard | dropping the guard releases in the background; [`LockGuard::unlock`] releases now and says whether the hold was still yours ([`Error::NotHeld`]) |
//! | (no counterpart: a lost lock is impossible in-process) | [`LockGuard::is_lost`], [`LockGuard::lost`]: the lease ran out or Redis lost it |
//! | `RwLock::read()`, `write()`, `try_read()`, `try_write()` | [`ReadWriteLock::read_lock`], [`write_lock`](ReadWriteLock::write_lock), [`try_read_lock`](ReadWriteLock::try_read_lock)`(wait, lease)`, [`try_write_lock`](ReadWriteLock::try_write_lock)`(wait, lease)` |
//! | `Semaphore::acquire_many(n)`, `acquire_many_owned(n)` | [`Semaphore::acquire`]`(n)`: leased permits, given back if the holder dies |
//! | `Semaphore::try_acquire_many(n)` (never waits) | [`Semaphore::try_acquire`]`(n, Duration::ZERO, None)` |
//! | `Semaphore::add_permits(n)`, `available_permits()` | [`Semaphore::add_permits`]`(n)` (negative to take away), [`Semaphore::available_permits`]; set the total once with [`Semaphore::try_set_permits`] |
//! | `Barrier::wait()` (N tasks wait for each other) | no direct counterpart; [`CountDownLatch`]: any number of waiters ([`wait`](CountDownLatch::wait)) until N [`count_down`](CountDownLatch::count_down) calls |
//! | re-locking a held `Mutex` in the same task deadlocks | the same outside the holder's scope; inside it ([`LockGuard::scope`], [`Lock::with_lock`], `#[locked]`) re-entry is granted |
//!
//! # Ownership
//!
//! Every plain acquire (`lock()`, `try_lock()`, `lock_with_lease()`) is an **owner of its own**.
//! A second acquire of the same lock waits until the first is released, even in the same task, as
//! with `tokio::sync::Mutex`: futures that one task polls together (`join_all` over a batch with
//! duplicate keys, `join!`, `select!`) take turns. The guard carries its owner, so it can be moved
//! into another task and unlocked there — no "not locked by current thread" — and a dispatcher
//! that hands each guard to a spawned worker runs one worker at a time.
//!
//! **Re-entry happens inside the holder's scope**: the body of [`Lock::with_lock`] /
//! [`Lock::try_with_lock`], of a `#[locked]` function or of [`Client::run_exclusive`], or a future
//! run with [`LockGuard::scope`]. Every acquire of the same lock through the same [`Client`] within
//! that future re-enters: it is granted at once, counts one more hold and gets a guard of its own.
//! A future spawned from inside the scope is outside it. The same holds for [`FencedLock`],
//! [`FairLock`] and both modes of [`ReadWriteLock`]; a [`SpinLock`] is not reentrant.
//!
//! ```no_run
//! # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
//! let lock = client.lock("order:42");
//! let guard = lock.lock().await?;
//! guard
//!     .scope(async {
//!         let inner = lock.lock().await?; // re-enters: granted at once
//!         assert_eq!(inner.hold_count(), 2);
//!         inner.unlock().await
//!     })
//!     .await?;
//! guard.unlock().await?;
//! # Ok(()) }
//! ```
//!
//! A task that starts to wait for a lock it acquired itself and has not released logs a warning
//! naming the lock and the fix; the acquire still waits, since the guard may be out in a worker
//! that will release it. [`Lock::hold_count`] and [`Lock::is_held_by_current_task`] count the
//! enclosing scope owner's live holds plus those of the guards the calling task acquired and has
//! not released.
//!
//! # What a Redis lock cannot do
//!
//! A lease-based lock is safe only while the holder finishes within its lease. A process paused
//! longer than its lease (GC, `SIGSTOP`, a swapped-out VM) can wake up believing it still holds
//! the lock; Redis replication is asynchronous, so a failover can lose a freshly taken lock. Watch
//! [`LockGuard::lost`] in long critical sections, and where a stale writer would do damage,
//! make the storage check a fencing token. If your data already lives in one database, that
//! database's own row locks or transactions are usually the better tool.
//!
//! # Cargo features
//!
//! - `tls`: `rediss://` (and `rediss-cluster://`, `rediss-sentinel://`) URLs, through rustls; see
//!   [`ClientBuilder::tls_root_certificates_pem`] and
//!   [`ClientBuilder::tls_client_certificate_pem`]. Off by default; without it TLS URLs are
//!   refused, never used in plain text. The two TLS methods exist in every build, so code
//!   compiles the same either way; without the feature, [`ClientBuilder::build`] refuses them.
//! - `metrics`: wait- and hold-time histograms, acquisition, timeout, renewal, lost-lease and
//!   received pub/sub message counters and a waiters gauge, labelled by kind, through the `metrics` crate facade (install
//!   any recorder). Off by default; `tracing` spans `lockkit.acquire` and `lockkit.release`
//!   (debug level) are always there. The feature adds no items to the API.
//! - `macros`: the `locked` attribute, `#[lockkit::locked(client = .., key = "ticket:{id}",
//!   wait = "5s")]` on an `async fn`: its body runs under a lock named after its arguments and
//!   released after the body completed; not acquired within `wait` is [`Error::NotAcquired`].
//!
//! On docs.rs every item that needs a feature says so.
//!
//! # Cancellation
//!
//! Every async method is cancel-safe: dropping an acquire future at any point leaves no hold
//! behind, and dropping an `unlock()` future lets the release finish in the background.

#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]
// docs.rs (`--cfg docsrs`, nightly) marks every feature-gated item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod acquire;
mod client;
mod connect;
mod core;
mod count_down_latch;
mod election;
mod error;
mod exec;
mod fair_lock;
mod fenced_lock;
mod guard;
mod hold;
mod hold_table;
mod inspect;
mod jobs;
mod limits;
mod lock;
mod metrics;
mod multi_lock;
mod object;
mod owner;
mod permit_expirable_semaphore;
mod probe;
mod queued;
mod rate_limiter;
mod read_write_lock;
mod replica;
mod scoped;
mod semaphore;
#[cfg(test)]
mod shuttle_tests;
mod spin_lock;
mod tls;
mod waiters;
mod watchdog;

pub use client::{
    Client, ClientBuilder, PubSubMode, DEFAULT_COMMAND_TIMEOUT, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RECHECK_INTERVAL, DEFAULT_WATCHDOG_TIMEOUT, MAX_LEASE, MIN_WATCHDOG_TIMEOUT,
};
pub use count_down_latch::CountDownLatch;
pub use election::{Election, Leader, LeaderChange, Leadership, LeadershipHandle, Observer};
pub use error::{ConnectFailure, Error, RedisError};
pub use fair_lock::FairLock;
pub use fenced_lock::{FencedGuard, FencedLock};
pub use inspect::{Holder, Inspection, ListedObject};
pub use jobs::JobOutcome;
pub use limits::MIN_LEASE;
pub use lock::{Lock, LockGuard};
pub use multi_lock::{MultiLock, MultiLockGuard};
pub use permit_expirable_semaphore::{ExpirablePermit, PermitExpirableSemaphore};
pub use rate_limiter::{RateAdmission, RateLimit, RateLimiter, RateMode};
pub use read_write_lock::ReadWriteLock;
pub use replica::ReplicaAck;
pub use scoped::Lease;
pub use semaphore::{Semaphore, SemaphorePermit};
pub use spin_lock::SpinLock;

#[cfg(feature = "macros")]
#[cfg_attr(docsrs, doc(cfg(feature = "macros")))]
#[doc(inline)]
pub use lockkit_macros::locked;
/// The protocol crate: scripts, key naming, cluster slots.
pub use lockkit_protocol as protocol;
