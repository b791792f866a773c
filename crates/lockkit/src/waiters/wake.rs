//! The wake policy: what each release message does to this client's waiters of its channel,
//! where a refused waiter's wake-up goes, and the end-of-window wake-ups.
//!
//! Owns, per message ([`Wake`], decoded from the payloads of `lockkit_protocol::wake`):
//!
//! | message  | who is woken here |
//! |----------|-------------------|
//! | `one`    | the longest-registered waiter not already woken |
//! | `n:<k>`  | the `k` longest-registered waiters not already woken (fewer if fewer wait; no script sends it since issue 28) |
//! | `all`    | every waiter |
//! | `w:<id>` | the waiter tagged `<id>` (the fair lock's next), if it waits here |
//! | `g:…:<id>` | the waiter tagged `<id>`, handing it the lock a release granted it |
//! | `p:<id>` | the waiter tagged `<id>` (a multi-lock member), if it waits here; arms a [`Fallback`] |
//! | `taken`  | nobody; disarms the [`Fallback`] (no script publishes it since the direct grant) |
//!
//! Besides messages: a woken waiter that is refused hands its wake-up on
//! ([`WaitTable::tried`]), and when messages may have been lost every waiter is woken to
//! re-check ([`WaitTable::wake_all`]; [`WaitTable::wake_all_where`] for the channels of a slot
//! that moved). [`Fallbacks`] keeps the armed end-of-window wake-ups in the order they fall due,
//! so the dispatcher needs one timer for all of them.
//!
//! Does not own: the waiters' registration, their wake-up states (pending, in hand) and the
//! channels' retirement (the bookkeeping, [`super::table`]); where messages come from and when
//! they may have been lost (the transport, [`super::transport`] and [`super::slots`]).
//!
//! **Smaller needs.** Waiters of one channel may need different amounts of the object (a waiter
//! reports its need; a semaphore waiter's is its permits, though since issue 28 a semaphore's
//! permits are granted to its waiters by name, and no script sends `n:<k>` any more: the rule
//! stays for any message that wakes waiters by count). A wake-up goes to the longest-registered waiter
//! whatever it needs, so it may reach one that needs more than came back while a waiter behind it
//! needs less:
//!
//! 1. two permits are held; a waiter for 2 registers, then a waiter for 1;
//! 2. one permit is released and announced (`n:1`): the waiter for 2 is woken, tries, and is
//!    refused;
//! 3. without more, the waiter for 1 sleeps until its deadline or the holders' leases end.
//!
//! So a woken waiter that is refused hands the wake-up on to the longest-registered waiter of the
//! channel that is not already woken and **needs less** than it does. The chain ends, since every
//! hand-over goes to a smaller need. Waiters that all need the same (every lock, where a refusal
//! means the object was taken) never hand a wake-up on, so a release still wakes at most one
//! waiter per client, not a herd (a lock's release: only the granted waiter, see below).
//!
//! **Grants.** A lock's (fenced lock's, election's, and since issue 28 a semaphore's: permits)
//! release that frees it **grants** it, in the
//! same script, to the call that has waited longest, and says so on that call's client's own
//! channel for the lock (`g:…:<marker>`): no other client hears anything. Here the grant is
//! handed to the waiter tagged with the call's marker, which is woken and returns holding the
//! lock without a try. A grant for a waiter that is no longer here wakes nobody: that waiter left,
//! and its cancel script gives the grant back and hands the lock on in Redis
//! ([`crate::queued`]).
//!
//! **Reservations.** A multi-lock member that only looks (it takes nothing until every member is
//! free for it) is not granted the lock: it is reserved it for the handoff window, and told on
//! its client's own channel (`p:<marker>`). Here the tagged waiter is woken, and a wake-up for
//! one other waiter of the channel is armed for the end of the window ([`Fallback`]; disarmed by
//! any newer message). The multi-lock takes the lock within the window or hands it on to the
//! next waiter in Redis when the window ends ([`crate::multi_lock`]); the waiters of other
//! clients are not told of the reservation and need not be, as the lock comes to them by a
//! grant. A waiter that tries during the window is told the lock is reserved; if its client heard
//! of the reservation ([`WaitTable::reservation_announced`]), it sleeps until woken or its next
//! keep-alive retry, else until the window ends. (`taken`, once published when a reserved waiter
//! took the lock, is still understood: it disarms the wake-up, but no script sends it any more.)

use std::collections::VecDeque;
use std::time::Duration;

use fred::bytes_utils::Str;
use lockkit_protocol::wake::Wake;
use parking_lot::Mutex;
use tokio::time::Instant;

use super::table::{Channel, Entry, WaitTable, WaiterId};

/// When a [`Fallback`] wake-up is due after the message that armed it: the handoff window (the
/// reservation was made just before the message was sent, so it has ended by then) and a
/// millisecond for the server's clock.
pub(super) const FALLBACK_DELAY: Duration =
    lockkit_protocol::lock::HANDOFF_WINDOW.saturating_add(Duration::from_millis(1));

/// A wake-up a [`Wake::Prefer`] message armed: due once the handoff window has passed
/// ([`WaitTable::fallback_due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fallback(u64);

/// What a channel last heard of a lock's reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reservation {
    /// Nothing pending: no reservation was announced since the last other message, or its
    /// window passed.
    None,
    /// A reservation was announced; the wake-up armed with it is due at the end of its window.
    Armed(u64),
    /// The reserved waiter took the lock: its release will be announced.
    Taken,
}

impl<C> Channel<C> {
    /// Wakes the longest-registered waiter not already woken that `fits`; whether there was one.
    pub(super) fn wake_first(&mut self, fits: impl Fn(&Entry) -> bool) -> bool {
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

    pub(super) fn wake_one(&mut self) -> bool {
        self.wake_first(|_| true)
    }

    pub(super) fn wake_all(&mut self) {
        self.waiters.iter_mut().for_each(Entry::wake);
    }

    fn tagged(&mut self, id: &str) -> Option<&mut Entry> {
        self.waiters
            .iter_mut()
            .find(|entry| entry.tag.as_deref() == Some(id))
    }
}

impl<C> WaitTable<C> {
    /// Acts on one release message on `channel`. Returns the wake-up a reservation for another
    /// client's waiter armed: the dispatcher queues it in [`Fallbacks`], which calls
    /// [`fallback_due`](WaitTable::fallback_due) with it once the handoff window has passed.
    pub(crate) fn apply(&mut self, channel: &str, wake: &Wake) -> Option<Fallback> {
        let entry = self.channels.get_mut(channel)?;
        entry.reservation = Reservation::None;
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
                // Only the reserved waiter wakes (if it waits here): any other would be refused
                // for the window. If it never comes (its client died), one waiter here tries
                // when the window has passed; so does a waiter that registers meanwhile and is
                // told the lock is reserved (`reservation_announced`).
                if let Some(waiter) = entry.tagged(id) {
                    waiter.wake();
                }
                self.counter += 1;
                let armed = Fallback(self.counter);
                entry.reservation = Reservation::Armed(armed.0);
                return Some(armed);
            }
            Wake::Taken => entry.reservation = Reservation::Taken,
            Wake::Grant { waiter, grant } => {
                // The lock is this waiter's already; it takes the grant when it runs. A waiter
                // that left gave the grant back with its cancel script (crate::queued).
                if let Some(entry) = entry.tagged(waiter) {
                    entry.grant = Some(*grant);
                    entry.wake();
                }
            }
        }
        None
    }

    /// Whether `channel` heard of a reservation whose end will be announced: armed (its window's
    /// end wakes a waiter here) or taken (the holder's release will be announced).
    pub(crate) fn reservation_announced(&self, channel: &str) -> bool {
        self.channels
            .get(channel)
            .is_some_and(|entry| entry.reservation != Reservation::None)
    }

    /// The handoff window of the reservation that armed `fallback` has passed: unless
    /// [`Wake::Taken`] or a newer message came first, wakes one waiter of `channel` (none if all
    /// are woken already). Returns whether it was still armed.
    pub(crate) fn fallback_due(&mut self, channel: &str, fallback: Fallback) -> bool {
        let Some(entry) = self.channels.get_mut(channel) else {
            return false;
        };
        if entry.reservation != Reservation::Armed(fallback.0) {
            return false;
        }
        entry.reservation = Reservation::None;
        entry.wake_one();
        true
    }

    /// Wakes every waiter of every channel (messages may have been lost).
    pub(crate) fn wake_all(&mut self) {
        self.wake_all_where(|_| true);
    }

    /// Wakes every waiter of the channels `selected` picks.
    pub(crate) fn wake_all_where(&mut self, selected: impl Fn(&str) -> bool) {
        for (channel, entry) in &mut self.channels {
            if selected(channel) {
                entry.wake_all();
            }
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
}

/// The armed end-of-window wake-ups of every channel, in the order they fall due (every one is
/// due [`FALLBACK_DELAY`] after its message), so one timer of the dispatcher serves them all: no
/// task or timer per message.
#[derive(Default)]
pub(super) struct Fallbacks {
    queue: VecDeque<(Instant, Str, Fallback)>,
}

impl Fallbacks {
    /// Queues `fallback`, armed on `channel` by a message handled at `now`. Returns when it is
    /// due if it is now the first in the queue: the timer is to be set for it.
    pub(super) fn arm(
        &mut self,
        channel: Str,
        fallback: Fallback,
        now: Instant,
    ) -> Option<Instant> {
        let due = now + FALLBACK_DELAY;
        let first = self.queue.is_empty();
        self.queue.push_back((due, channel, fallback));
        first.then_some(due)
    }

    /// Whether no wake-up is queued (the timer is idle).
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// When the first queued wake-up is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.queue.front().map(|(due, _, _)| *due)
    }

    /// Takes the wake-ups due by `now` off the front of the queue and fires them: each wakes one
    /// waiter of its channel unless it was disarmed meanwhile (`taken`, or a newer message).
    pub(super) fn fire_due<C>(&mut self, table: &Mutex<WaitTable<C>>, now: Instant) {
        while self.queue.front().is_some_and(|(due, _, _)| *due <= now) {
            let Some((_, channel, fallback)) = self.queue.pop_front() else {
                return;
            };
            if table.lock().fallback_due(&channel, fallback) {
                tracing::debug!(
                    %channel,
                    "the waiter a lock was reserved for did not take it within the handoff window; \
                     waking a waiter here"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiters::table::tests::{two_waiters, CHANNEL};

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

    /// A grant goes to the waiter it names, and to nobody else: that waiter takes it (once)
    /// when it runs; a grant naming a waiter that is not here wakes nobody.
    #[test]
    fn a_grant_is_handed_to_the_waiter_it_names_and_to_nobody_else() {
        let mut table = WaitTable::<()>::default();
        let first = table.register(CHANNEL, Some("#c:1"), 1).id;
        let named = table.register(CHANNEL, Some("#c:2"), 1).id;
        let grant = lockkit_protocol::wake::Grant {
            hold_count: 1,
            token: Some(7),
            now_ms: 10,
            expiry_ms: 5010,
        };
        let message = |waiter: &str| Wake::Grant {
            waiter: waiter.to_owned(),
            grant,
        };
        table.apply(CHANNEL, &message("#c:9"));
        assert!(!table.is_pending(CHANNEL, first) && !table.is_pending(CHANNEL, named));

        table.apply(CHANNEL, &message("#c:2"));
        assert!(!table.is_pending(CHANNEL, first), "not the longest waiting");
        assert!(table.is_pending(CHANNEL, named));
        assert_eq!(table.take_wake(CHANNEL, named), Some(grant));
        assert_eq!(table.take_wake(CHANNEL, named), None, "taken once");
        assert_eq!(table.take_wake(CHANNEL, first), None);
    }

    /// A waiter cancelled with a grant pending passes its wake-up on, never the grant: the grant
    /// is its call's, and its cancel script gives it back in Redis.
    #[test]
    fn a_cancelled_grantee_passes_its_wake_up_on_but_not_the_grant() {
        let mut table = WaitTable::<()>::default();
        let granted = table.register(CHANNEL, Some("#c:1"), 1).id;
        let other = table.register(CHANNEL, Some("#c:2"), 1).id;
        table.apply(
            CHANNEL,
            &Wake::Grant {
                waiter: "#c:1".to_owned(),
                grant: lockkit_protocol::wake::Grant {
                    hold_count: 1,
                    token: None,
                    now_ms: 1,
                    expiry_ms: 2,
                },
            },
        );
        table.cancel(CHANNEL, granted, Instant::now());
        assert!(table.is_pending(CHANNEL, other), "the wake-up went on");
        assert_eq!(table.take_wake(CHANNEL, other), None, "the grant did not");
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
        assert!(table
            .apply(CHANNEL, &Wake::Prefer("elsewhere".into()))
            .is_some());
        assert_eq!(pending(&table), [false, true, true]);
        assert!(
            table.apply(CHANNEL, &Wake::Prefer("c".into())).is_some(),
            "armed too"
        );
    }

    /// A reservation for another client's waiter wakes nobody here at once (they would be
    /// refused for the window): it arms one wake-up, due when the window has passed, which
    /// `taken` (the reserved waiter took the lock) or any newer message disarms. Only the
    /// newest armed wake-up counts. A waiter that registers during the window is told whether
    /// the reservation's end will be announced.
    #[test]
    fn a_reservation_elsewhere_wakes_one_waiter_after_the_window_unless_taken() {
        let (mut table, a, b) = two_waiters(1, 1);
        let pending = |table: &WaitTable<()>| [a, b].map(|id| table.is_pending(CHANNEL, id));

        let armed = table.apply(CHANNEL, &Wake::Prefer("elsewhere".into()));
        assert_eq!(
            pending(&table),
            [false, false],
            "nobody tries in the window"
        );
        let armed = armed.expect("a wake-up is armed");
        assert!(
            table.fallback_due(CHANNEL, armed),
            "the reserved waiter never came"
        );
        assert_eq!(
            pending(&table),
            [true, false],
            "one waiter tries after the window"
        );
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

        // What a waiter told "reserved for another" asks: will the reservation's end be
        // announced here? Yes once it was heard (armed, or taken), and on an idle channel too (a
        // waiter may register during the window); no after any other message, or once the
        // armed wake-up went off.
        let mut table = WaitTable::<()>::default();
        assert!(!table.reservation_announced(CHANNEL), "unknown channel");
        let only = table.register(CHANNEL, None, 1).id;
        assert!(!table.reservation_announced(CHANNEL));
        assert!(table.cancel(CHANNEL, only, Instant::now()));
        let armed = table.apply(CHANNEL, &Wake::Prefer("x".into()));
        assert!(table.reservation_announced(CHANNEL), "armed while idle");
        table.apply(CHANNEL, &Wake::Taken);
        assert!(table.reservation_announced(CHANNEL), "taken");
        assert!(armed.is_some_and(|armed| !table.fallback_due(CHANNEL, armed)));
        table.apply(CHANNEL, &Wake::One);
        assert!(!table.reservation_announced(CHANNEL), "a newer message");
        let armed = table.apply(CHANNEL, &Wake::Prefer("x".into()));
        assert!(armed.is_some_and(|armed| table.fallback_due(CHANNEL, armed)));
        assert!(!table.reservation_announced(CHANNEL), "the window passed");
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

    /// The end-of-window wake-ups fall due in the order they were armed: `fire_due` fires those
    /// due by `now` (each wakes a waiter unless disarmed) and leaves the later ones queued.
    #[test]
    fn only_the_due_end_of_window_wake_ups_fire() {
        let table = Mutex::new(WaitTable::<()>::default());
        let (early, late) = ("early", "late");
        let waiters = [early, late].map(|channel| table.lock().register(channel, None, 1).id);
        let arm = |channel: &str| {
            table
                .lock()
                .apply(channel, &Wake::Prefer("elsewhere".into()))
                .expect("armed")
        };
        let start = Instant::now();
        let later = start + Duration::from_secs(3600);
        let mut fallbacks = Fallbacks::default();
        assert!(fallbacks.is_empty() && fallbacks.next_due().is_none());
        assert_eq!(
            fallbacks.arm(early.into(), arm(early), start),
            Some(start + FALLBACK_DELAY),
            "the first sets the timer"
        );
        assert_eq!(fallbacks.arm(late.into(), arm(late), later), None);
        fallbacks.fire_due(&table, start + FALLBACK_DELAY);
        assert!(
            table.lock().is_pending(early, waiters[0]),
            "the due wake-up fired"
        );
        assert!(
            !table.lock().is_pending(late, waiters[1]),
            "the later one did not"
        );
        assert_eq!(fallbacks.next_due(), Some(later + FALLBACK_DELAY));
        assert!(!fallbacks.is_empty(), "the timer stays armed for it");

        fallbacks.fire_due(&table, later + FALLBACK_DELAY);
        assert!(table.lock().is_pending(late, waiters[1]));
        assert!(fallbacks.is_empty() && fallbacks.next_due().is_none());
    }
}
