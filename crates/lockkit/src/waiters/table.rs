//! The waiter hub's bookkeeping: who waits on which channel, each waiter's wake-up state, and
//! when an idle channel may be retired.
//!
//! Owns: registration ([`WaitTable::register`], and [`register_if`](WaitTable::register_if)
//! before a first try), the waiters' order and counts, a waiter leaving
//! ([`WaitTable::cancel`]), and the idle, lingering channels the transport retires
//! ([`WaitTable::retire`]). Does not own: whom a release message wakes, where a refused waiter's
//! wake-up goes, or the end-of-window wake-ups (the wake policy, [`super::wake`]); nor the
//! subscriptions and the message stream (the transport, [`super::transport`]).
//!
//! Implementation notes for maintainers. [`WaitTable`] holds no lock and does no I/O: its owner
//! ([`crate::waiters`]) keeps it behind one mutex, and each method is one critical section. The
//! model checker (`crate::shuttle_tests`) drives this same table behind a `shuttle` mutex, with a
//! fake transport, so every interleaving of registering, waking, trying, cancelling and
//! re-subscribing it explores is one the production hub can meet.
//!
//! A waiter's wake-up goes through two states, and a waiter that goes away in either passes it
//! on, so a wake-up is never lost with its waiter:
//!
//! 1. **pending**: a release message chose the waiter and signalled it; it has not run yet. A
//!    message that wakes "one" skips pending waiters (one wake-up per waiter is enough).
//! 2. **in hand**: the waiter took the wake-up ([`WaitTable::take_wake`]) and is trying again.
//!    Its try ends in [`WaitTable::tried`]: acquired (used up), or refused (handed to a waiter
//!    that needs less, see [`super::wake`]). A waiter with a wake-up in hand can be woken again
//!    (a release during its try must not be missed).
//!
//! Dropping an acquire future while its try is in flight used to lose the wake-up it had taken:
//! the try may never have reached Redis, and the next local waiter slept until its timer. The
//! in-hand state closes that (found by `shuttle_a_cancelled_waiter_passes_its_wake_up_on`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use lockkit_protocol::wake::Grant;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::wake::Reservation;

/// A waiter's id in its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaiterId(u64);

/// What [`WaitTable::register`] hands the new waiter.
pub(crate) struct Registered<C> {
    /// The waiter's id, for the table's other methods.
    pub(crate) id: WaiterId,
    /// Signalled (`notify_one`) when the waiter is woken.
    pub(crate) signal: Arc<Notify>,
    /// The channel's transport data (the hub's subscription cell), shared by its waiters.
    pub(crate) data: C,
}

/// The waiters of every channel, by channel name; `C` is per-channel data of the transport,
/// created when a channel gets its first waiter. A channel whose last waiter left stays, idle,
/// until the transport retires it ([`WaitTable::retire`]), so a waiter that comes back soon finds
/// its subscription still there.
pub(crate) struct WaitTable<C> {
    pub(super) channels: HashMap<String, Channel<C>>,
    next_id: u64,
    /// The source of fallback sequence numbers ([`super::wake`]).
    pub(super) counter: u64,
}

/// What [`WaitTable::retire`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Retire {
    /// The channel was idle for the whole linger and is gone from the table: unsubscribe.
    Retired,
    /// Idle, but not for long enough: look again after this long.
    Later(Duration),
    /// Not idle (a waiter came back), or not in the table: nothing to do; the next time the
    /// channel falls idle, [`WaitTable::cancel`] asks for a new retirement.
    Kept,
}

/// One channel's waiters and state.
pub(super) struct Channel<C> {
    data: C,
    /// In registration order: the longest-registered first.
    pub(super) waiters: Vec<Entry>,
    /// What this client last heard of a lock's reservation (`p:<id>`, `taken`).
    pub(super) reservation: Reservation,
    /// When the last waiter left (`None` while someone waits).
    idle_since: Option<Instant>,
    /// A retirement is under way (the transport looks again later): at most one per channel.
    retiring: bool,
}

/// One waiter of a channel.
pub(super) struct Entry {
    id: WaiterId,
    /// The waiter's id, for messages that name the next waiter (fair lock) or the preferred one
    /// (lock).
    pub(super) tag: Option<String>,
    /// How much of the object the waiter needs (a semaphore's permits; 1 for a lock).
    pub(super) need: u64,
    /// Woken, and not yet running (see the module documentation).
    pub(super) pending: bool,
    /// Took a wake-up and is trying; not yet told the outcome.
    pub(super) in_hand: bool,
    /// A lock a release granted to this waiter (`g:` message), until the waiter runs and takes
    /// it ([`WaitTable::take_wake`]).
    pub(super) grant: Option<Grant>,
    signal: Arc<Notify>,
}

impl Entry {
    /// Marks the waiter pending and signals it.
    pub(super) fn wake(&mut self) {
        self.pending = true;
        self.signal.notify_one();
    }
}

impl<C> Default for WaitTable<C> {
    fn default() -> Self {
        Self {
            channels: HashMap::new(),
            next_id: 0,
            counter: 0,
        }
    }
}

impl<C> Channel<C> {
    /// The waiter `id` of this channel.
    pub(super) fn entry(&mut self, id: WaiterId) -> Option<&mut Entry> {
        self.waiters.iter_mut().find(|entry| entry.id == id)
    }
}

impl<C: Clone + Default> WaitTable<C> {
    /// Adds a waiter on `channel` (after the channel's earlier waiters). `tag` names it for
    /// messages that wake one waiter by id; `need` is how much of the object it needs.
    pub(crate) fn register(
        &mut self,
        channel: &str,
        tag: Option<&str>,
        need: u64,
    ) -> Registered<C> {
        let entry = self
            .channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                data: C::default(),
                waiters: Vec::new(),
                reservation: Reservation::None,
                idle_since: None,
                retiring: false,
            });
        Self::push(&mut self.next_id, entry, tag, need)
    }

    /// Like [`register`](WaitTable::register), but only if `channel` is in the table already and
    /// `ready` says so of its transport data (its subscription is confirmed); else registers
    /// nothing.
    pub(crate) fn register_if(
        &mut self,
        channel: &str,
        tag: Option<&str>,
        need: u64,
        ready: impl FnOnce(&C) -> bool,
    ) -> Option<Registered<C>> {
        let entry = self
            .channels
            .get_mut(channel)
            .filter(|entry| ready(&entry.data))?;
        Some(Self::push(&mut self.next_id, entry, tag, need))
    }

    fn push(
        next_id: &mut u64,
        entry: &mut Channel<C>,
        tag: Option<&str>,
        need: u64,
    ) -> Registered<C> {
        let id = WaiterId(*next_id);
        *next_id += 1;
        let signal = Arc::new(Notify::new());
        entry.idle_since = None;
        entry.waiters.push(Entry {
            id,
            tag: tag.map(str::to_owned),
            need,
            pending: false,
            in_hand: false,
            grant: None,
            signal: Arc::clone(&signal),
        });
        Registered {
            id,
            signal,
            data: entry.data.clone(),
        }
    }
}

impl<C> WaitTable<C> {
    /// The waiter `id` ran after being signalled: its wake-up is now in hand (it tries again, or
    /// takes the lock it was granted). Returns the grant a release made to it, if any.
    pub(crate) fn take_wake(&mut self, channel: &str, id: WaiterId) -> Option<Grant> {
        let entry = self.channels.get_mut(channel).and_then(|c| c.entry(id))?;
        entry.pending = false;
        entry.in_hand = true;
        entry.grant.take()
    }

    /// Removes the waiter `id` (its wait ended: acquired, timed out, cancelled, failed). A
    /// wake-up it had not used up goes on to the next waiter. When it was the channel's last
    /// waiter, the channel stays, idle since `now`; returns `true` when the transport is to
    /// [`retire`](WaitTable::retire) it later (no retirement is under way yet).
    pub(crate) fn cancel(&mut self, channel: &str, id: WaiterId, now: Instant) -> bool {
        let Some(entry) = self.channels.get_mut(channel) else {
            return false;
        };
        let Some(index) = entry.waiters.iter().position(|entry| entry.id == id) else {
            return false;
        };
        let gone = entry.waiters.remove(index);
        // Woken but gone before acting on it, or gone while acting on it: pass it on.
        for _ in 0..(u8::from(gone.pending) + u8::from(gone.in_hand)) {
            entry.wake_one();
        }
        if !entry.waiters.is_empty() {
            return false;
        }
        entry.idle_since = Some(now);
        !std::mem::replace(&mut entry.retiring, true)
    }

    /// Removes `channel` if it has been idle for at least `linger` by `now` (then the transport
    /// unsubscribes); see [`Retire`].
    pub(crate) fn retire(&mut self, channel: &str, now: Instant, linger: Duration) -> Retire {
        let Some(entry) = self.channels.get_mut(channel) else {
            return Retire::Kept;
        };
        let Some(since) = entry.idle_since else {
            entry.retiring = false;
            return Retire::Kept;
        };
        let idle = now.saturating_duration_since(since);
        if idle < linger {
            return Retire::Later(linger - idle);
        }
        self.channels.remove(channel);
        Retire::Retired
    }

    /// Whether `channel` has waiters.
    #[cfg(test)]
    pub(crate) fn contains(&self, channel: &str) -> bool {
        self.channels
            .get(channel)
            .is_some_and(|entry| !entry.waiters.is_empty())
    }

    /// The channels in the table: those with waiters and the idle ones not yet retired (all of
    /// them subscribed, or being subscribed).
    pub(crate) fn channels(&self) -> impl Iterator<Item = &str> {
        self.channels.keys().map(String::as_str)
    }

    /// Whether no channel is in the table (nobody waits, and no idle channel is left).
    pub(crate) fn is_empty(&self) -> bool {
        self.channels.is_empty()
    }

    /// The number of waiters on every channel.
    pub(crate) fn waiting(&self) -> usize {
        self.channels
            .values()
            .map(|entry| entry.waiters.len())
            .sum()
    }

    /// Whether the waiter `id` was woken and has not run yet.
    #[cfg(test)]
    pub(crate) fn is_pending(&self, channel: &str, id: WaiterId) -> bool {
        self.channels
            .get(channel)
            .and_then(|entry| entry.waiters.iter().find(|entry| entry.id == id))
            .is_some_and(|entry| entry.pending)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use lockkit_protocol::wake::Wake;

    use super::*;

    pub(in crate::waiters) const CHANNEL: &str = "c";

    /// A table with two waiters needing `first` and `second`, in that order.
    pub(in crate::waiters) fn two_waiters(
        first: u64,
        second: u64,
    ) -> (WaitTable<()>, WaiterId, WaiterId) {
        let mut table = WaitTable::<()>::default();
        let a = table.register(CHANNEL, None, first).id;
        let b = table.register(CHANNEL, None, second).id;
        (table, a, b)
    }

    /// The interleaving `shuttle_a_cancelled_waiter_passes_its_wake_up_on` found: a release wakes
    /// `a`; `a` runs and sends its try; its acquire future is dropped before the try reaches
    /// Redis. The wake-up must go on to `b`, or `b` sleeps until its timer.
    #[test]
    fn a_waiter_dropped_with_its_try_in_flight_passes_its_wake_up_on() {
        let (mut table, a, b) = two_waiters(1, 1);
        table.apply(CHANNEL, &Wake::One);
        assert!(table.is_pending(CHANNEL, a));
        table.take_wake(CHANNEL, a);
        assert!(!table.is_pending(CHANNEL, b));
        assert!(!table.cancel(CHANNEL, a, Instant::now()));
        assert!(table.is_pending(CHANNEL, b), "the wake-up in hand was lost");
    }

    /// A try that settled (acquired, or refused with nobody needing less) used its wake-up up:
    /// leaving afterwards wakes nobody.
    #[test]
    fn a_settled_try_uses_its_wake_up_up() {
        let (mut table, a, b) = two_waiters(1, 1);
        table.apply(CHANNEL, &Wake::One);
        table.take_wake(CHANNEL, a);
        assert!(!table.tried(CHANNEL, a, true), "equal needs never hand on");
        table.cancel(CHANNEL, a, Instant::now());
        assert!(!table.is_pending(CHANNEL, b));
        assert!(
            table.cancel(CHANNEL, b, Instant::now()),
            "the last waiter empties the channel"
        );
        assert!(!table.contains(CHANNEL));
    }

    /// A waiter registers before its first try only on a channel that is in the table and
    /// whose transport data says it is ready (subscribed); otherwise nothing is registered.
    #[test]
    fn registering_before_the_first_try_needs_a_ready_channel() {
        let mut table = WaitTable::<bool>::default();
        assert!(
            table.register_if(CHANNEL, None, 1, |_| true).is_none(),
            "unknown channel"
        );
        let first = table.register(CHANNEL, None, 1).id;
        assert!(
            table
                .register_if(CHANNEL, None, 1, |ready| *ready)
                .is_none(),
            "not subscribed"
        );
        assert_eq!(table.waiting(), 1);
        let early = table
            .register_if(CHANNEL, Some("e"), 1, |_| true)
            .map(|r| r.id);
        assert_eq!(table.waiting(), 2);

        // It is woken like any waiter: a release during its first try is not missed.
        table.apply(CHANNEL, &Wake::Prefer("e".into()));
        assert!(early.is_some_and(|early| table.is_pending(CHANNEL, early)));
        assert!(!table.is_pending(CHANNEL, first));
    }

    /// An idle channel (its last waiter left) is retired only once it has been idle for the
    /// whole linger; a waiter that comes back keeps it. One retirement at a time is asked for.
    #[test]
    fn an_idle_channel_is_retired_only_after_a_whole_linger() {
        let linger = Duration::from_secs(2);
        let start = Instant::now();
        let mut table = WaitTable::<()>::default();
        let first = table.register(CHANNEL, None, 1).id;
        assert!(table.cancel(CHANNEL, first, start), "retire it later");
        assert_eq!(
            table.channels().collect::<Vec<_>>(),
            [CHANNEL],
            "idle, kept"
        );
        assert!(!table.is_empty());
        assert_eq!(table.waiting(), 0);

        let second = table.register(CHANNEL, None, 1).id;
        let later = start + Duration::from_secs(1);
        assert!(
            !table.cancel(CHANNEL, second, later),
            "a retirement is under way"
        );
        assert_eq!(
            table.retire(CHANNEL, start + linger, linger),
            Retire::Later(Duration::from_secs(1)),
            "idle again only since a second"
        );
        assert_eq!(
            table.retire(CHANNEL, later + linger, linger),
            Retire::Retired
        );
        assert!(table.is_empty());
        assert_eq!(table.retire(CHANNEL, later + linger, linger), Retire::Kept);

        // A waiter that is there when the retirement looks keeps the channel; the next time it
        // falls idle, a new retirement is asked for.
        let third = table.register(CHANNEL, None, 1).id;
        assert!(table.cancel(CHANNEL, third, start));
        let fourth = table.register(CHANNEL, None, 1).id;
        assert_eq!(table.retire(CHANNEL, start + linger, linger), Retire::Kept);
        assert!(
            table.cancel(CHANNEL, fourth, start),
            "retire it later, again"
        );
    }

    /// What the hub reads from the table: which channels have waiters (to keep or drop their
    /// subscriptions, to re-subscribe them after a reconnect or a slot move), whether anyone
    /// waits, and how many wait (`Client::waiting_count`).
    #[test]
    fn the_table_knows_which_channels_have_waiters_and_how_many() {
        let mut table = WaitTable::<()>::default();
        assert!(table.is_empty());
        assert_eq!(table.waiting(), 0);
        assert!(!table.contains("a"));
        assert_eq!(table.channels().count(), 0);

        let a1 = table.register("a", None, 1).id;
        let a2 = table.register("a", None, 1).id;
        let b = table.register("b", None, 1).id;
        assert!(!table.is_empty());
        assert_eq!(table.waiting(), 3);
        assert!(table.contains("a") && table.contains("b"));
        assert!(!table.contains("c"));
        let mut channels: Vec<&str> = table.channels().collect();
        channels.sort_unstable();
        assert_eq!(channels, ["a", "b"]);

        let now = Instant::now();
        assert!(!table.cancel("a", a1, now), "a waiter of `a` is left");
        assert!(table.contains("a"));
        assert!(table.cancel("a", a2, now), "the last waiter of `a` is gone");
        assert!(!table.contains("a"));
        assert_eq!(table.retire("a", now, Duration::ZERO), Retire::Retired);
        assert_eq!(table.channels().collect::<Vec<_>>(), ["b"]);
        assert_eq!(table.waiting(), 1);
        assert!(table.cancel("b", b, now));
        assert_eq!(table.waiting(), 0);
        assert_eq!(table.retire("b", now, Duration::ZERO), Retire::Retired);
        assert!(table.is_empty());
    }
}
