//! The waiter hub's bookkeeping, apart from its transport: who waits on which channel, whom a
//! release message wakes, and where a wake-up goes when its waiter cannot use it.
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
//!    that needs less, see [`crate::waiters`]). A waiter with a wake-up in hand can be woken again
//!    (a release during its try must not be missed).
//!
//! Dropping an acquire future while its try is in flight used to lose the wake-up it had taken:
//! the try may never have reached Redis, and the next local waiter slept until its timer. The
//! in-hand state closes that (found by `shuttle_a_cancelled_waiter_passes_its_wake_up_on`).

use std::collections::HashMap;
use std::sync::Arc;

use lockkit_protocol::wake::Wake;
use tokio::sync::Notify;

/// A waiter's id in its table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaiterId(u64);

/// What [`WaitTable::register`] hands the new waiter.
pub(crate) struct Registered<C> {
    /// The waiter's id, for the table's other methods.
    pub(crate) id: WaiterId,
    /// The channel's generation at registration (see [`WaitTable::ready`]).
    pub(crate) generation: u64,
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
    channels: HashMap<String, Channel<C>>,
    next_id: u64,
    /// The source of generations, idle epochs and fallback sequence numbers: every value drawn is
    /// new, so one from an earlier incarnation of a channel never matches a later one.
    counter: u64,
}

struct Channel<C> {
    data: C,
    /// In registration order: the longest-registered first.
    waiters: Vec<Entry>,
    /// Drawn anew by every message that may wake a waiter, and by every wake-up of all waiters
    /// (messages may have been lost): unchanged between two readings means no wake-up meant for
    /// a waiter not yet registered came in between.
    generation: u64,
    /// Armed by a reservation naming another client's waiter ([`Wake::Prefer`]): the wake-up due
    /// when the handoff window passes without [`Wake::Taken`].
    fallback: Option<u64>,
    /// Set when the last waiter left: the epoch [`WaitTable::retire`] must be given.
    idle: Option<u64>,
}

struct Entry {
    id: WaiterId,
    /// The waiter's id, for messages that name the next waiter (fair lock) or the preferred one
    /// (lock).
    tag: Option<String>,
    /// How much of the object the waiter needs (a semaphore's permits; 1 for a lock).
    need: u64,
    /// Woken, and not yet running (see the module documentation).
    pending: bool,
    /// Took a wake-up and is trying; not yet told the outcome.
    in_hand: bool,
    signal: Arc<Notify>,
}

impl Entry {
    fn wake(&mut self) {
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

/// A wake-up a [`Wake::Prefer`] message armed in a client that does not hold the reserved
/// waiter: due once the handoff window has passed ([`WaitTable::fallback_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fallback(u64);

impl<C> Channel<C> {
    /// Wakes the longest-registered waiter not already woken that `fits`; whether there was one.
    fn wake_first(&mut self, fits: impl Fn(&Entry) -> bool) -> bool {
        match self
            .waiters
            .iter_mut()
            .find(|entry| !entry.pending && fits(entry))
        {
            Some(entry) => {
                entry.wake();
                true
            }
            None => false,
        }
    }

    fn wake_one(&mut self) -> bool {
        self.wake_first(|_| true)
    }

    fn wake_all(&mut self) {
        self.waiters.iter_mut().for_each(Entry::wake);
    }

    fn tagged(&mut self, id: &str) -> Option<&mut Entry> {
        self.waiters
            .iter_mut()
            .find(|entry| entry.tag.as_deref() == Some(id))
    }

    fn entry(&mut self, id: WaiterId) -> Option<&mut Entry> {
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
        let id = WaiterId(self.next_id);
        self.next_id += 1;
        let signal = Arc::new(Notify::new());
        let counter = &mut self.counter;
        let entry = self
            .channels
            .entry(channel.to_owned())
            .or_insert_with(|| Channel {
                data: C::default(),
                waiters: Vec::new(),
                generation: draw(counter),
                fallback: None,
                idle: None,
            });
        entry.idle = None;
        entry.waiters.push(Entry {
            id,
            tag: tag.map(str::to_owned),
            need,
            pending: false,
            in_hand: false,
            signal: Arc::clone(&signal),
        });
        Registered {
            id,
            generation: entry.generation,
            signal,
            data: entry.data.clone(),
        }
    }
}

/// The next value of `counter`.
fn draw(counter: &mut u64) -> u64 {
    *counter += 1;
    *counter
}

impl<C> WaitTable<C> {
    /// Acts on one release message on `channel`. Returns the wake-up a reservation for another
    /// client's waiter armed: the transport calls [`fallback_due`](WaitTable::fallback_due) with
    /// it once the handoff window has passed.
    pub(crate) fn apply(&mut self, channel: &str, wake: &Wake) -> Option<Fallback> {
        let Some(entry) = self.channels.get_mut(channel) else {
            return None;
        };
        if *wake == Wake::Taken {
            entry.fallback = None;
            return None;
        }
        entry.generation = draw(&mut self.counter);
        entry.fallback = None;
        match wake {
            Wake::One => {
                entry.wake_one();
            }
            Wake::Many(count) => {
                for _ in 0..*count {
                    if !entry.wake_one() {
                        break;
                    }
                }
            }
            Wake::All => entry.wake_all(),
            Wake::Waiter(id) => {
                if let Some(waiter) = entry.tagged(id) {
                    waiter.wake();
                }
            }
            Wake::Prefer(id) => {
                if let Some(waiter) = entry.tagged(id) {
                    waiter.wake();
                } else if !entry.waiters.is_empty() {
                    // Reserved for another client's waiter: this client's waiters would be
                    // refused for the window. If that waiter never comes (its client died), one
                    // of them tries when the window has passed.
                    let armed = Fallback(draw(&mut self.counter));
                    entry.fallback = Some(armed.0);
                    return Some(armed);
                }
            }
            Wake::Taken => {}
        }
        None
    }

    /// The handoff window of the reservation that armed `fallback` has passed: unless
    /// [`Wake::Taken`] or a newer message came first, wakes one waiter of `channel` (none if all
    /// are woken already). Returns whether it was still armed.
    pub(crate) fn fallback_due(&mut self, channel: &str, fallback: Fallback) -> bool {
        let Some(entry) = self.channels.get_mut(channel) else {
            return false;
        };
        if entry.fallback != Some(fallback.0) {
            return false;
        }
        entry.fallback = None;
        entry.generation = draw(&mut self.counter);
        entry.wake_one();
        true
    }

    /// The transport data and generation of `channel` while it is in the table (with waiters,
    /// or idle and not yet retired). A caller that reads the generation before its first try,
    /// finds the lock busy and registers with the same generation missed no wake-up meant for
    /// it, provided the channel was subscribed before that try.
    pub(crate) fn ready(&self, channel: &str) -> Option<(&C, u64)> {
        self.channels
            .get(channel)
            .map(|entry| (&entry.data, entry.generation))
    }

    /// Wakes every waiter of every channel (messages may have been lost).
    pub(crate) fn wake_all(&mut self) {
        self.wake_all_where(|_| true);
    }

    /// Wakes every waiter of the channels `selected` picks.
    pub(crate) fn wake_all_where(&mut self, selected: impl Fn(&str) -> bool) {
        for (channel, entry) in &mut self.channels {
            if selected(channel) {
                entry.generation = draw(&mut self.counter);
                entry.wake_all();
            }
        }
    }

    /// The waiter `id` ran after being signalled: its wake-up is now in hand (it tries again).
    pub(crate) fn take_wake(&mut self, channel: &str, id: WaiterId) {
        if let Some(entry) = self.channels.get_mut(channel).and_then(|c| c.entry(id)) {
            entry.pending = false;
            entry.in_hand = true;
        }
    }

    /// The waiter `id` finished a try; `refused` when it was refused. A wake-up it had in hand is
    /// used up; if refused, it goes on to the longest-registered waiter that needs less and is not
    /// already woken. Returns whether it went on.
    pub(crate) fn tried(&mut self, channel: &str, id: WaiterId, refused: bool) -> bool {
        let Some(entry) = self.channels.get_mut(channel) else {
            return false;
        };
        let Some(waiter) = entry.entry(id) else {
            return false;
        };
        if !std::mem::take(&mut waiter.in_hand) || !refused {
            return false;
        }
        let need = waiter.need;
        entry.wake_first(|other| other.need < need)
    }

    /// Removes the waiter `id` (its wait ended: acquired, timed out, cancelled, failed). A
    /// wake-up it had not used up goes on to the next waiter. When it was the channel's last
    /// waiter, the channel stays, idle, and the epoch to [`retire`](WaitTable::retire) it with
    /// is returned.
    pub(crate) fn cancel(&mut self, channel: &str, id: WaiterId) -> Option<u64> {
        let entry = self.channels.get_mut(channel)?;
        let index = entry.waiters.iter().position(|entry| entry.id == id)?;
        let gone = entry.waiters.remove(index);
        // Woken but gone before acting on it, or gone while acting on it: pass it on.
        for _ in 0..(u8::from(gone.pending) + u8::from(gone.in_hand)) {
            entry.wake_one();
        }
        if !entry.waiters.is_empty() {
            return None;
        }
        let epoch = draw(&mut self.counter);
        entry.idle = Some(epoch);
        entry.fallback = None;
        Some(epoch)
    }

    /// Removes `channel` if it has stayed idle since its last waiter left with `epoch`; whether
    /// it did (then the transport unsubscribes).
    pub(crate) fn retire(&mut self, channel: &str, epoch: u64) -> bool {
        let idle = self
            .channels
            .get(channel)
            .is_some_and(|entry| entry.idle == Some(epoch));
        if idle {
            self.channels.remove(channel);
        }
        idle
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
mod tests {
    use super::*;

    const CHANNEL: &str = "c";

    /// A table with two waiters needing `first` and `second`, in that order.
    fn two_waiters(first: u64, second: u64) -> (WaitTable<()>, WaiterId, WaiterId) {
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
        assert_eq!(table.cancel(CHANNEL, a), None);
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
        table.cancel(CHANNEL, a);
        assert!(!table.is_pending(CHANNEL, b));
        let epoch = table.cancel(CHANNEL, b);
        assert!(epoch.is_some(), "the last waiter empties the channel");
        assert!(!table.contains(CHANNEL));
        assert!(epoch.is_some_and(|epoch| table.retire(CHANNEL, epoch)));
        assert!(table.is_empty());
    }

    /// A release during a waiter's try wakes that waiter again (its try may have been refused
    /// before the release), and a refused waiter hands on only to a smaller need.
    #[test]
    fn a_trying_waiter_is_woken_again_and_refusals_go_to_smaller_needs() {
        let (mut table, two, one) = two_waiters(2, 1);
        table.apply(CHANNEL, &Wake::Many(1));
        table.take_wake(CHANNEL, two);
        table.apply(CHANNEL, &Wake::One);
        assert!(table.is_pending(CHANNEL, two));
        assert!(!table.is_pending(CHANNEL, one));
        table.take_wake(CHANNEL, two);
        assert!(table.tried(CHANNEL, two, true));
        assert!(table.is_pending(CHANNEL, one));
    }

    /// Only a refused try hands on, and only a wake-up the waiter had in hand: a try that
    /// acquired used its wake-up up, and a waiter refused on a try no wake-up prompted (its
    /// first, before it sleeps) has nothing to hand on.
    #[test]
    fn only_a_refused_try_with_a_wake_up_in_hand_hands_it_on() {
        let (mut table, two, one) = two_waiters(2, 1);
        assert!(!table.tried(CHANNEL, two, true), "no wake-up in hand");
        assert!(!table.is_pending(CHANNEL, one));

        table.apply(CHANNEL, &Wake::One);
        table.take_wake(CHANNEL, two);
        assert!(!table.tried(CHANNEL, two, false), "acquired: used up");
        assert!(!table.is_pending(CHANNEL, one));
    }

    /// `n:k` (k permits came back) wakes the k longest-registered waiters not already woken, and
    /// no more; fewer when fewer wait.
    #[test]
    fn a_release_of_k_wakes_k_waiters_not_already_woken() {
        let mut table = WaitTable::<()>::default();
        let ids: Vec<WaiterId> = (0..4)
            .map(|_| table.register(CHANNEL, None, 1).id)
            .collect();
        table.apply(CHANNEL, &Wake::One);
        table.apply(CHANNEL, &Wake::Many(2));
        let woken: Vec<bool> = ids
            .iter()
            .map(|&id| table.is_pending(CHANNEL, id))
            .collect();
        assert_eq!(
            woken,
            [true, true, true, false],
            "the first was already woken"
        );

        table.apply(CHANNEL, &Wake::Many(10));
        assert!(ids.iter().all(|&id| table.is_pending(CHANNEL, id)));
    }

    /// A message naming a waiter (`w:<id>`, the fair lock's next in line) wakes that waiter and
    /// nobody else, nobody when it does not wait here; so does one naming the waiter a lock is
    /// reserved for (`p:<id>`), which, when that waiter is not here, arms a wake-up for the end
    /// of the handoff window instead (see `a_reservation_elsewhere_*`).
    #[test]
    fn a_message_naming_a_waiter_wakes_that_waiter() {
        let mut table = WaitTable::<()>::default();
        let a = table.register(CHANNEL, Some("a"), 1).id;
        let b = table.register(CHANNEL, Some("b"), 1).id;
        let c = table.register(CHANNEL, Some("c"), 1).id;
        let pending = |table: &WaitTable<()>| -> Vec<bool> {
            [a, b, c]
                .iter()
                .map(|&id| table.is_pending(CHANNEL, id))
                .collect()
        };

        table.apply(CHANNEL, &Wake::Waiter("elsewhere".into()));
        assert_eq!(pending(&table), [false, false, false]);
        table.apply(CHANNEL, &Wake::Waiter("b".into()));
        assert_eq!(pending(&table), [false, true, false]);
        table.apply(CHANNEL, &Wake::Prefer("c".into()));
        assert_eq!(pending(&table), [false, true, true]);
        assert!(table.apply(CHANNEL, &Wake::Prefer("elsewhere".into())).is_some());
        assert_eq!(pending(&table), [false, true, true]);
    }

    /// A reservation for another client's waiter wakes nobody here at once (they would be
    /// refused for the window): it arms one wake-up, due when the window has passed, which
    /// `taken` (the reserved waiter took the lock) or any newer message disarms. Only the
    /// newest armed wake-up counts.
    #[test]
    fn a_reservation_elsewhere_wakes_one_waiter_after_the_window_unless_taken() {
        let (mut table, a, b) = two_waiters(1, 1);
        let pending = |table: &WaitTable<()>| [a, b].map(|id| table.is_pending(CHANNEL, id));

        let armed = table.apply(CHANNEL, &Wake::Prefer("elsewhere".into()));
        assert_eq!(pending(&table), [false, false], "nobody tries in the window");
        let armed = armed.expect("a wake-up is armed");
        assert!(table.fallback_due(CHANNEL, armed), "the reserved waiter never came");
        assert_eq!(pending(&table), [true, false], "one waiter tries after the window");
        assert!(!table.fallback_due(CHANNEL, armed), "due once");

        let (mut table, a, b) = two_waiters(1, 1);
        let taken = table.apply(CHANNEL, &Wake::Prefer("elsewhere".into()));
        assert_eq!(table.apply(CHANNEL, &Wake::Taken), None);
        assert!(taken.is_some_and(|armed| !table.fallback_due(CHANNEL, armed)));
        assert!(!table.is_pending(CHANNEL, a) && !table.is_pending(CHANNEL, b));

        let old = table.apply(CHANNEL, &Wake::Prefer("x".into()));
        let new = table.apply(CHANNEL, &Wake::Prefer("y".into()));
        assert!(old.is_some_and(|old| !table.fallback_due(CHANNEL, old)));
        assert!(new.is_some_and(|new| table.fallback_due(CHANNEL, new)));

        // A channel with no waiter left (idle) arms nothing: a waiter that registers later
        // sees the message in the generation and tries again.
        let mut table = WaitTable::<()>::default();
        let only = table.register(CHANNEL, None, 1).id;
        let armed = table.apply(CHANNEL, &Wake::Prefer("x".into()));
        assert!(table.cancel(CHANNEL, only).is_some());
        assert!(armed.is_some_and(|armed| !table.fallback_due(CHANNEL, armed)));
        assert_eq!(table.apply(CHANNEL, &Wake::Prefer("x".into())), None);
    }

    /// The generation a waiter reads before its first try is unchanged at its registration
    /// only if no message that may wake a waiter came in between: every such message, a
    /// wake-up of all waiters and a due fallback draw a new one; `taken` does not. A channel
    /// retired and registered again is a new channel with a new generation.
    #[test]
    fn the_generation_changes_with_every_message_that_may_wake_a_waiter() {
        let mut table = WaitTable::<()>::default();
        let holder = table.register(CHANNEL, Some("h"), 1);
        let generation = |table: &WaitTable<()>| table.ready(CHANNEL).map(|(_, g)| g);
        assert_eq!(generation(&table), Some(holder.generation));

        let mut seen = vec![holder.generation];
        let mut changed = |table: &mut WaitTable<()>, what: &str| {
            let now = generation(table).expect("the channel is in the table");
            assert!(!seen.contains(&now), "{what} left the generation as it was");
            seen.push(now);
        };
        for wake in [
            Wake::One,
            Wake::Many(2),
            Wake::All,
            Wake::Waiter("x".into()),
            Wake::Prefer("h".into()),
        ] {
            table.apply(CHANNEL, &wake);
            changed(&mut table, &wake.encode());
        }
        let armed = table.apply(CHANNEL, &Wake::Prefer("x".into()));
        changed(&mut table, "p:x");
        let before = generation(&table);
        table.apply(CHANNEL, &Wake::Taken);
        assert_eq!(generation(&table), before, "`taken` wakes nobody");
        let armed = table.apply(CHANNEL, &Wake::Prefer("x".into())).or(armed);
        changed(&mut table, "p:x");
        assert!(armed.is_some_and(|armed| table.fallback_due(CHANNEL, armed)));
        changed(&mut table, "a due fallback");
        table.wake_all();
        changed(&mut table, "wake_all");
        table.wake_all_where(|_| true);
        changed(&mut table, "wake_all_where");
        table.wake_all_where(|_| false);
        assert_eq!(generation(&table), seen.last().copied(), "not selected");

        // Idle, then retired: a waiter registering afterwards finds a new generation.
        let last = seen.last().copied();
        let epoch = table.cancel(CHANNEL, holder.id).expect("the last waiter left");
        assert_eq!(generation(&table), last, "idle: still subscribed");
        assert!(table.retire(CHANNEL, epoch));
        assert_eq!(generation(&table), None);
        let again = table.register(CHANNEL, None, 1);
        assert_ne!(Some(again.generation), last);
    }

    /// An idle channel (its last waiter left) is retired only if it stayed idle: a waiter that
    /// registered meanwhile keeps it, even if it left again (a newer epoch).
    #[test]
    fn an_idle_channel_is_retired_only_if_it_stayed_idle() {
        let mut table = WaitTable::<()>::default();
        let first = table.register(CHANNEL, None, 1).id;
        let epoch = table.cancel(CHANNEL, first).expect("the last waiter left");
        assert_eq!(table.channels().collect::<Vec<_>>(), [CHANNEL], "idle, kept");
        assert!(!table.is_empty());
        assert_eq!(table.waiting(), 0);

        let second = table.register(CHANNEL, None, 1).id;
        assert!(!table.retire(CHANNEL, epoch), "a waiter came back");
        let newer = table.cancel(CHANNEL, second).expect("the last waiter left");
        assert!(!table.retire(CHANNEL, epoch), "idle again, but since a newer epoch");
        assert!(table.retire(CHANNEL, newer));
        assert!(table.is_empty());
        assert!(!table.retire(CHANNEL, newer), "retired once");
    }

    /// `wake_all_where` (a slot that moved to another node) wakes every waiter of the channels it
    /// selects and no other.
    #[test]
    fn waking_the_selected_channels_wakes_only_their_waiters() {
        let mut table = WaitTable::<()>::default();
        let moved = [
            table.register("moved:1", None, 1).id,
            table.register("moved:1", None, 1).id,
            table.register("moved:2", None, 1).id,
        ];
        let stayed = table.register("stayed", None, 1).id;
        table.wake_all_where(|channel| channel.starts_with("moved:"));
        assert!(table.is_pending("moved:1", moved[0]));
        assert!(table.is_pending("moved:1", moved[1]));
        assert!(table.is_pending("moved:2", moved[2]));
        assert!(!table.is_pending("stayed", stayed));
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

        assert_eq!(table.cancel("a", a1), None, "a waiter of `a` is left");
        assert!(table.contains("a"));
        let idle_a = table.cancel("a", a2).expect("the last waiter of `a` is gone");
        assert!(!table.contains("a"));
        assert!(table.retire("a", idle_a));
        assert_eq!(table.channels().collect::<Vec<_>>(), ["b"]);
        assert_eq!(table.waiting(), 1);
        let idle_b = table.cancel("b", b).expect("the last waiter of `b` is gone");
        assert_eq!(table.waiting(), 0);
        assert!(table.retire("b", idle_b));
        assert!(table.is_empty());
    }
}
