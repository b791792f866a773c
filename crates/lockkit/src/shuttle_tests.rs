//! The client's local concurrency core under the `shuttle` model checker.
//!
//! The waiter hub's table ([`WaitTable`]) and the watchdog's registry ([`HoldTable`]) are the
//! production types, each behind one `shuttle` mutex as production keeps them behind one
//! `parking_lot` mutex (every method is one critical section). Around them, a fake transport: an
//! in-memory "Redis" of one object with `permits` units (1: a lock) whose release publishes a
//! wake-up message to the hub, a renewal call that answers present/gone per hold, and a release
//! call. Every call is a round trip with a scheduling point before the request runs and one
//! before its reply is seen, so a future dropped there models an acquire or release cancelled
//! in flight. The tasks follow the production steps in order:
//!
//! - an acquire as in `acquire::acquire_loop`: on a channel already in the table (the fake's
//!   "subscribed"; it is never retired here), register; try; if busy: register unless
//!   registered, loop { try (skipped once when registered before the first); `tried`;
//!   `woken` },
//!   each try under a guard armed before the request is sent (`guard::HoldGuard`: granted →
//!   registered with the watchdog, refused after the shutdown → given back; busy → disarmed;
//!   dropped armed → unregistered and released in the background);
//! - a waiter as `waiters::Waiter` (`take_wake` when it runs, `tried` after each try, `cancel`
//!   when dropped);
//! - an unlock as `HoldGuard::release`, a renewal round as `watchdog::renew_round`, the shutdown
//!   as `Client::shutdown` + `Worker::release_all`.
//!
//! There are no timers: a waiter sleeps until a wake-up reaches it. So a lost wake-up is a
//! deadlock, which shuttle reports with the schedule that led to it (replay it with
//! `shuttle::replay`). The invariants:
//!
//! - no registered waiter is left asleep while a wake-up for it was delivered (no deadlock);
//! - no hold is both released and renewed: a renewal reply is applied only to registered holds,
//!   so a released hold is never marked lost or renewed (asserted where the reply is applied);
//! - the shutdown leaves nothing registered, and a grant after it is refused and given back;
//! - a cancelled acquire leaves no hold (the fake Redis is empty at the end of every run).
//!
//! Budget: `LOCKKIT_SHUTTLE_ITERATIONS` runs of the random scheduler and as many of PCT per test
//! (default [`DEFAULT_ITERATIONS`], a few seconds each).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};

use futures::future::select;
use lockkit_protocol::wake::Wake;
use shuttle::future::{self, JoinHandle};
use shuttle::rand::Rng;
use shuttle::sync::{Mutex, MutexGuard};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::hold_table::{HoldTable, Registered};
use crate::waiters::table::{WaitTable, WaiterId};

/// Runs of each scheduler per test unless `LOCKKIT_SHUTTLE_ITERATIONS` says otherwise.
const DEFAULT_ITERATIONS: usize = 1000;

/// The PCT scheduler's bug depth (number of priority change points).
const PCT_DEPTH: usize = 3;

/// The channel of the one object.
const CHANNEL: &str = "lockkit:{object}";

fn iterations() -> usize {
    std::env::var("LOCKKIT_SHUTTLE_ITERATIONS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(DEFAULT_ITERATIONS)
}

/// Explores `test` with shuttle's random scheduler, then with PCT.
fn check(test: impl Fn() + Send + Sync + 'static) {
    let test = Arc::new(test);
    let runs = iterations();
    let random = Arc::clone(&test);
    shuttle::check_random(move || random(), runs);
    shuttle::check_pct(move || test(), runs, PCT_DEPTH);
}

fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One round trip to the fake Redis: the request may be dropped before it runs, and its reply
/// before it is seen.
async fn round_trip<R>(request: impl FnOnce() -> R) -> R {
    future::yield_now().await;
    let reply = request();
    future::yield_now().await;
    reply
}

// === fake Redis ===

/// The object's state in the fake Redis: `permits` units, taken by holds (by sequence number).
struct Store {
    permits: u64,
    held: HashMap<u64, u64>,
}

impl Store {
    fn free(&self) -> u64 {
        self.permits - self.held.values().sum::<u64>()
    }

    /// The acquire script: takes `need` units for `seq` if they are free.
    fn take(&mut self, seq: u64, need: u64) -> bool {
        if self.free() < need {
            return false;
        }
        self.held.insert(seq, need);
        true
    }

    /// The release script: gives back the hold's units; the release message (`None`: not held).
    fn give_back(&mut self, seq: u64) -> Option<Wake> {
        let freed = self.held.remove(&seq)?;
        Some(Wake::Many(u32::try_from(freed).unwrap_or(u32::MAX)))
    }

    /// The renew script: present/gone per hold.
    fn renew(&self, holds: &[Arc<FakeHold>]) -> Vec<bool> {
        holds
            .iter()
            .map(|hold| self.held.contains_key(&hold.seq))
            .collect()
    }
}

/// A hold as the watchdog registry sees it, with what happened to it (for the invariants).
struct FakeHold {
    seq: u64,
    /// Unregistered for a release (set inside the registry's critical section).
    released: AtomicBool,
    /// Marked lost by a renewal reply.
    lost: AtomicBool,
}

impl Registered for Arc<FakeHold> {
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// One client's local core and the fake Redis behind it.
struct World {
    store: Mutex<Store>,
    hub: Mutex<WaitTable<()>>,
    registry: Mutex<HoldTable<Arc<FakeHold>>>,
    shut_down: AtomicBool,
    sequence: AtomicU64,
    /// Release messages still to lose (the broadcast channel lagged, or the subscriber
    /// connection dropped): each lost one is followed by a wake-all.
    to_lose: AtomicU32,
    /// Tasks that outlive their caller (message delivery, background releases): joined before
    /// the final checks.
    background: Mutex<Vec<JoinHandle<()>>>,
}

impl World {
    fn new(permits: u64) -> Arc<Self> {
        Arc::new(Self {
            store: Mutex::new(Store {
                permits,
                held: HashMap::new(),
            }),
            hub: Mutex::new(WaitTable::default()),
            registry: Mutex::new(HoldTable::default()),
            shut_down: AtomicBool::new(false),
            sequence: AtomicU64::new(0),
            to_lose: AtomicU32::new(0),
            background: Mutex::new(Vec::new()),
        })
    }

    fn background(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        locked(&self.background).push(future::spawn(task));
    }

    /// Redis publishes the message when the script runs; the hub gets it later. A lost message
    /// is followed by a wake-all (the dispatcher's `Lagged`, or the resubscribe after a
    /// reconnect).
    fn publish(self: &Arc<Self>, wake: Wake) {
        let lost = self
            .to_lose
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
        let world = Arc::clone(self);
        self.background(async move {
            future::yield_now().await;
            if lost {
                locked(&world.hub).wake_all();
            } else {
                locked(&world.hub).apply(CHANNEL, &wake);
            }
        });
    }

    /// A hold granted before the run starts (a holder in another client, or this one).
    fn held(self: &Arc<Self>, need: u64, registered: bool) -> Guard {
        let guard = Guard::prepare(self);
        assert!(locked(&self.store).take(guard.hold.seq, need));
        if registered {
            assert!(locked(&self.registry).register(Arc::clone(&guard.hold)));
        }
        guard
    }

    /// Stops renewing `hold` (it is being released), as `Watchdog::unregister`.
    fn unregister(&self, hold: &FakeHold) {
        let mut registry = locked(&self.registry);
        registry.unregister(hold.seq);
        hold.released.store(true, Ordering::Release);
    }

    /// The release script, which publishes its message as it runs.
    async fn release(self: &Arc<Self>, seq: u64) {
        round_trip(|| {
            if let Some(wake) = locked(&self.store).give_back(seq) {
                self.publish(wake);
            }
        })
        .await;
    }

    /// One acquire call, in the steps of `acquire::acquire_loop`. `None`: refused by the
    /// shutdown.
    async fn acquire(self: &Arc<Self>, need: u64) -> Option<Guard> {
        let early = ModelWaiter::register_now(self, need);
        match self.attempt(need).await {
            Attempt::Acquired(guard) => return Some(guard),
            Attempt::Shutdown => return None,
            Attempt::Busy => {}
        }
        let mut registered_first = early.is_some();
        let waiter = early.unwrap_or_else(|| ModelWaiter::register(self, need));
        loop {
            if !std::mem::take(&mut registered_first) {
                let outcome = self.attempt(need).await;
                waiter.tried(matches!(outcome, Attempt::Busy));
                match outcome {
                    Attempt::Acquired(guard) => return Some(guard),
                    Attempt::Shutdown => return None,
                    Attempt::Busy => {}
                }
            }
            waiter.woken().await;
        }
    }

    /// A task that acquires `need` units, then unlocks (`then` runs in between).
    fn user(self: &Arc<Self>, need: u64, then: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
        let world = Arc::clone(self);
        future::spawn(async move {
            let guard = world.acquire(need).await;
            then();
            if let Some(guard) = guard {
                guard.release().await;
            }
        })
    }

    /// One try, under a guard armed before the request is sent.
    async fn attempt(self: &Arc<Self>, need: u64) -> Attempt {
        let guard = Guard::prepare(self);
        let seq = guard.hold.seq;
        if !round_trip(|| locked(&self.store).take(seq, need)).await {
            guard.disarm();
            return Attempt::Busy;
        }
        match guard.granted() {
            Some(guard) => Attempt::Acquired(guard),
            None => Attempt::Shutdown,
        }
    }

    /// One renewal round, as `watchdog::renew_round` (one batch).
    async fn renew_round(self: &Arc<Self>) {
        let batch = locked(&self.registry).snapshot();
        if batch.is_empty() {
            return;
        }
        let present = round_trip(|| locked(&self.store).renew(&batch)).await;
        locked(&self.registry).apply_reply(&batch, present, |hold, present| {
            assert!(
                !hold.released.load(Ordering::Acquire),
                "a renewal reply was applied to hold {} after its release began",
                hold.seq
            );
            if !present {
                hold.lost.store(true, Ordering::Release);
            }
        });
    }

    /// `Client::shutdown`: refuse new work, then drain the registry and release what it had.
    async fn shutdown(self: &Arc<Self>) {
        self.shut_down.store(true, Ordering::Release);
        future::yield_now().await;
        let holds = {
            let mut registry = locked(&self.registry);
            let holds = registry.close();
            for hold in &holds {
                hold.released.store(true, Ordering::Release);
            }
            holds
        };
        for hold in holds {
            self.release(hold.seq).await;
        }
    }

    /// Joins the background tasks, then checks what every run must end with.
    async fn settle_and_check(&self) {
        loop {
            let tasks = std::mem::take(&mut *locked(&self.background));
            if tasks.is_empty() {
                break;
            }
            for task in tasks {
                let _ = task.await;
            }
        }
        let store = locked(&self.store);
        assert!(
            store.held.is_empty(),
            "holds left in Redis at the end: {:?}",
            store.held
        );
        assert_eq!(locked(&self.registry).len(), 0, "holds left registered");
        assert_eq!(locked(&self.hub).waiting(), 0, "waiters left registered");
    }
}

enum Attempt {
    Acquired(Guard),
    Busy,
    Shutdown,
}

// === the guard (guard::HoldGuard) ===

struct Guard {
    world: Arc<World>,
    hold: Arc<FakeHold>,
    armed: bool,
}

impl Guard {
    fn prepare(world: &Arc<World>) -> Self {
        let seq = world.sequence.fetch_add(1, Ordering::Relaxed);
        Self {
            world: Arc::clone(world),
            hold: Arc::new(FakeHold {
                seq,
                released: AtomicBool::new(false),
                lost: AtomicBool::new(false),
            }),
            armed: true,
        }
    }

    fn disarm(mut self) {
        self.armed = false;
    }

    /// Hands the hold to the watchdog; `None` (and the hold given back on drop) after the
    /// shutdown closed the registry.
    fn granted(self) -> Option<Self> {
        let registered = locked(&self.world.registry).register(Arc::clone(&self.hold));
        registered.then_some(self)
    }

    /// `unlock()`: after the shutdown, refused without sending (the shutdown released it).
    async fn release(mut self) {
        if self.world.shut_down.load(Ordering::Acquire) {
            self.armed = false;
            return;
        }
        self.world.unregister(&self.hold);
        self.world.release(self.hold.seq).await;
        self.armed = false;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if self.armed {
            self.world.unregister(&self.hold);
            let world = Arc::clone(&self.world);
            let seq = self.hold.seq;
            self.world
                .background(async move { world.release(seq).await });
        }
    }
}

// === the waiter (waiters::Waiter) ===

struct ModelWaiter {
    world: Arc<World>,
    id: WaiterId,
    signal: Arc<Notify>,
}

impl ModelWaiter {
    /// Registers; the fake subscription is confirmed at once.
    fn register(world: &Arc<World>, need: u64) -> Self {
        let registered = locked(&world.hub).register(CHANNEL, None, need);
        Self {
            world: Arc::clone(world),
            id: registered.id,
            signal: registered.signal,
        }
    }

    /// Registers at once if the channel is in the table, as `WaiterHub::register_now`.
    fn register_now(world: &Arc<World>, need: u64) -> Option<Self> {
        let registered = locked(&world.hub).register_if(CHANNEL, None, need, |()| true)?;
        Some(Self {
            world: Arc::clone(world),
            id: registered.id,
            signal: registered.signal,
        })
    }

    async fn woken(&self) {
        self.signal.notified().await;
        locked(&self.world.hub).take_wake(CHANNEL, self.id);
    }

    fn tried(&self, refused: bool) {
        locked(&self.world.hub).tried(CHANNEL, self.id, refused);
    }
}

impl Drop for ModelWaiter {
    fn drop(&mut self) {
        locked(&self.world.hub).cancel(CHANNEL, self.id, tokio::time::Instant::now());
    }
}

/// Explores `scenario` (see [`check`]), each run on a fresh world of `permits` units, settled
/// and checked at its end.
fn explore<F, Fut>(permits: u64, scenario: F)
where
    F: Fn(Arc<World>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()>,
{
    check(move || {
        let world = World::new(permits);
        future::block_on(async {
            scenario(Arc::clone(&world)).await;
            world.settle_and_check().await;
        });
    });
}

async fn join(tasks: Vec<JoinHandle<()>>) {
    for task in tasks {
        if let Err(err) = task.await {
            panic!("task failed: {err:?}");
        }
    }
}

// === the tests ===

/// Two permits, both held; a waiter for 2 and a waiter for 1 (in either order). One permit
/// comes back. The waiter for 1 must get it: the second holder keeps its permit until then (its
/// lease is long), so a wake-up swallowed by the waiter for 2 is a deadlock.
#[test]
fn shuttle_a_freed_permit_reaches_a_waiter_that_can_use_it() {
    explore(2, |world| async move {
        let first = world.held(1, false);
        let second = world.held(1, false);
        let served = CancellationToken::new();
        let tasks = vec![
            world.user(2, || {}),
            world.user(1, {
                let served = served.clone();
                move || served.cancel()
            }),
            future::spawn(first.release()),
            future::spawn(async move {
                served.cancelled().await;
                second.release().await;
            }),
        ];
        join(tasks).await;
    });
}

/// A lock, held, on a channel that is subscribed already (a waiter was there before and left);
/// a waiter comes, and the holder releases at any point of its steps. The waiter registers
/// before its first try and skips the second: a release between that try and a registration
/// made after it would be missed, and the waiter would sleep forever (found by reverting to a
/// late registration: a deadlock).
#[test]
fn shuttle_a_waiter_that_registers_first_misses_no_release() {
    explore(1, |world| async move {
        drop(ModelWaiter::register(&world, 1));
        let holder = world.held(1, true);
        let tasks = vec![world.user(1, || {}), future::spawn(holder.release())];
        join(tasks).await;
    });
}

/// A lock, held; two waiters, one of which is cancelled at any point (before it registers,
/// while woken, with its try in flight, holding the lock): some steps after the holder's
/// release. The other waiter must get the lock, and nothing may stay held.
#[test]
fn shuttle_a_cancelled_waiter_passes_its_wake_up_on() {
    explore(1, |world| async move {
        let holder = world.held(1, true);
        let (released, cancel) = (CancellationToken::new(), CancellationToken::new());
        let tasks = vec![
            world.user(1, || {}),
            future::spawn({
                let (world, cancel) = (Arc::clone(&world), cancel.clone());
                async move {
                    let section = async {
                        if let Some(guard) = world.acquire(1).await {
                            future::yield_now().await;
                            guard.release().await;
                        }
                    };
                    // Dropping the losing future is the cancellation; the token is polled
                    // first, so the section makes no step once it is cancelled.
                    let _ = select(Box::pin(cancel.cancelled()), Box::pin(section)).await;
                }
            }),
            future::spawn({
                let released = released.clone();
                async move {
                    holder.release().await;
                    released.cancel();
                }
            }),
            future::spawn(async move {
                released.cancelled().await;
                for _ in 0..shuttle::rand::thread_rng().gen_range(0..6) {
                    future::yield_now().await;
                }
                cancel.cancel();
            }),
        ];
        join(tasks).await;
    });
}

/// Two holders in watchdog mode and a third acquire in flight; the shutdown runs meanwhile, and
/// every holder unlocks at some point (refused without sending after the shutdown). A grant
/// that lands after the drain must be refused and given back: nothing may stay registered or
/// held.
#[test]
fn shuttle_the_shutdown_leaves_nothing_registered_or_held() {
    explore(3, |world| async move {
        let first = world.held(1, true);
        let second = world.held(1, true);
        let tasks = vec![
            world.user(1, || {}),
            future::spawn(first.release()),
            future::spawn(async move {
                future::yield_now().await;
                drop(second);
            }),
            future::spawn({
                let world = Arc::clone(&world);
                async move { world.shutdown().await }
            }),
        ];
        join(tasks).await;
    });
}

/// Two watchdog holds; renewal rounds run while one is unlocked and the other's lease lapses in
/// Redis (then its guard is dropped). A renewal reply must never reach a hold whose release
/// began (asserted where replies are applied), the lapsed hold may be marked lost only while
/// registered, and a hold unlocked cleanly is never marked lost.
#[test]
fn shuttle_a_renewal_reply_never_touches_a_released_hold() {
    explore(2, |world| async move {
        let unlocked = world.held(1, true);
        let lapsing = world.held(1, true);
        let unlocked_hold = Arc::clone(&unlocked.hold);
        let tasks = vec![
            future::spawn({
                let world = Arc::clone(&world);
                async move {
                    world.renew_round().await;
                    world.renew_round().await;
                }
            }),
            future::spawn(unlocked.release()),
            future::spawn({
                let world = Arc::clone(&world);
                async move {
                    let seq = lapsing.hold.seq;
                    round_trip(|| locked(&world.store).held.remove(&seq)).await;
                    drop(lapsing);
                }
            }),
        ];
        join(tasks).await;
        assert!(
            !unlocked_hold.lost.load(Ordering::Acquire),
            "a hold unlocked cleanly was reported lost"
        );
    });
}

/// A lock, held, and three waiters; release messages get lost (the broadcast channel lagged, the
/// subscriber reconnected) and are followed by a wake-all. Every waiter must still get the lock.
#[test]
fn shuttle_lost_messages_wake_every_waiter_to_re_check() {
    explore(1, |world| async move {
        world.to_lose.store(2, Ordering::Release);
        let holder = world.held(1, false);
        let mut tasks: Vec<JoinHandle<()>> = (0..3).map(|_| world.user(1, || {})).collect();
        tasks.push(future::spawn(holder.release()));
        join(tasks).await;
    });
}
