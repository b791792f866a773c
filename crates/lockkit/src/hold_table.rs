//! The watchdog's registry, apart from its transport: the holds being renewed or checked, which
//! holds a renewal round covers, which replies still count, and the shutdown's drain.
//!
//! Implementation notes for maintainers. [`HoldTable`] holds no lock and does no I/O: the
//! watchdog ([`crate::watchdog`]) keeps it behind one mutex, and each method is one critical
//! section. The model checker (`crate::shuttle_tests`) drives this same table behind a `shuttle`
//! mutex, with a fake transport, against grants, releases, renewal rounds and the shutdown.
//!
//! Two rules keep a released hold from being renewed or reported lost, and the shutdown from
//! leaving a hold behind:
//!
//! - a renewal reply counts only for holds still registered when it is applied
//!   ([`HoldTable::apply_reply`], under the same lock as [`HoldTable::unregister`]): a hold
//!   released while the round was in flight is skipped;
//! - the shutdown drains the table and closes it in one step ([`HoldTable::close`]); a grant
//!   after that is refused ([`HoldTable::register`] returns `false`) and given back by its
//!   guard, never registered into a table nobody will release.

use std::collections::HashMap;

/// A hold as the table knows it: by its client-unique sequence number.
pub(crate) trait Registered: Clone {
    /// The hold's sequence number, its key in the table.
    fn seq(&self) -> u64;
}

/// The holds being renewed or checked, by sequence number, and whether the shutdown closed the
/// table.
pub(crate) struct HoldTable<H> {
    by_seq: HashMap<u64, H>,
    closed: bool,
}

impl<H> Default for HoldTable<H> {
    fn default() -> Self {
        Self {
            by_seq: HashMap::new(),
            closed: false,
        }
    }
}

impl<H: Registered> HoldTable<H> {
    /// Starts renewing (or checking) `hold`; `false`, and nothing registered, once the shutdown
    /// closed the table.
    #[must_use]
    pub(crate) fn register(&mut self, hold: H) -> bool {
        if self.closed {
            return false;
        }
        self.by_seq.insert(hold.seq(), hold);
        true
    }

    /// Stops renewing the hold `seq` (it is being released); returns it if it was registered.
    pub(crate) fn unregister(&mut self, seq: u64) -> Option<H> {
        self.by_seq.remove(&seq)
    }

    /// The holds a renewal round starts with.
    pub(crate) fn snapshot(&self) -> Vec<H> {
        self.by_seq.values().cloned().collect()
    }

    /// Closes the table for the shutdown and returns every hold it had (to be released).
    pub(crate) fn close(&mut self) -> Vec<H> {
        self.closed = true;
        self.by_seq.drain().map(|(_, hold)| hold).collect()
    }

    /// Applies a renewal round's reply for `batch`: `present[i]` says whether the i-th hold was
    /// still in Redis. `on_reply` runs (inside this critical section) for each hold that is still
    /// registered; holds released while the round was in flight are skipped.
    pub(crate) fn apply_reply<'a>(
        &self,
        batch: &'a [H],
        present: impl IntoIterator<Item = bool>,
        mut on_reply: impl FnMut(&'a H, bool),
    ) {
        for (hold, present) in batch.iter().zip(present) {
            if self.by_seq.contains_key(&hold.seq()) {
                on_reply(hold, present);
            }
        }
    }

    /// The number of holds registered.
    pub(crate) fn len(&self) -> usize {
        self.by_seq.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct H(u64);

    impl Registered for H {
        fn seq(&self) -> u64 {
            self.0
        }
    }

    fn sorted(mut holds: Vec<H>) -> Vec<H> {
        holds.sort_by_key(|hold| hold.0);
        holds
    }

    /// A renewal round starts with every registered hold; its reply reaches each hold still
    /// registered, with that hold's own presence, and skips a hold released meanwhile.
    #[test]
    fn a_round_covers_the_registered_holds_and_its_reply_only_those_still_registered() {
        let mut table = HoldTable::default();
        for seq in 1..=3 {
            assert!(table.register(H(seq)));
        }
        assert_eq!(table.len(), 3);
        let batch = sorted(table.snapshot());
        assert_eq!(batch, [H(1), H(2), H(3)]);

        // Hold 2 is released while the round is in flight; hold 3 is gone from Redis.
        assert_eq!(table.unregister(2), Some(H(2)));
        assert_eq!(table.unregister(2), None);
        assert_eq!(table.len(), 2);
        let present = batch.iter().map(|hold| hold.0 != 3);
        let mut replies = Vec::new();
        table.apply_reply(&batch, present, |hold, present| {
            replies.push((hold.0, present));
        });
        assert_eq!(replies, [(1, true), (3, false)]);
    }

    /// The shutdown takes every hold (to release them) and leaves nothing to renew; a grant
    /// after it is refused and not registered.
    #[test]
    fn the_shutdown_drains_the_table_and_refuses_later_grants() {
        let mut table = HoldTable::default();
        assert!(table.register(H(1)));
        assert!(table.register(H(2)));
        assert_eq!(sorted(table.close()), [H(1), H(2)]);
        assert_eq!(table.len(), 0);
        assert!(table.snapshot().is_empty());
        assert!(
            !table.register(H(3)),
            "a grant after the shutdown is refused"
        );
        assert_eq!(table.len(), 0);
        assert_eq!(table.unregister(3), None);
    }
}
