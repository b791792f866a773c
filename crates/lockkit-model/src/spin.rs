//! The `SpinLock`: the plain, non-reentrant `SET NX PX` lock.
//!
//! The contract encoded here, from `docs/guide.md` ("SpinLock — the plain `SET NX PX` lock") and
//! `docs/design.md` (the lock family table: *"STRING = marker, `SET NX PX`"*):
//!
//! - *"It is **not reentrant**, not even inside a guard's `scope`"*: a second acquire by the same
//!   holder is refused like anyone else's; only a re-sent request (the same hold marker) finds
//!   its own hold and is granted again, without touching the lease.
//! - *"The release is compare-and-delete: a holder whose lease ran out can never delete the next
//!   holder's lock (its `unlock()` returns `Err(NotHeld)`)"*.
//! - *"Leases, watchdog renewal and lost-lease signals as for `Lock`"*: a renewal extends only
//!   the holder's own lease, never shortens it, and never revives an ended one.
//! - A value of another type at the key is reported (`WRONGTYPE`) and left alone; the renewal
//!   counts it as gone.
//!
//! Time is the server's clock in milliseconds; the key exists while the clock has not passed its
//! expiry (Redis deletes a key once the clock is past it).

/// The spin lock's key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct SpinLock {
    /// The holder's marker and its lease's expiry (server ms).
    pub holder: Option<(String, u64)>,
    /// A value of another type sits at the key.
    pub foreign: bool,
}

/// What a spin-lock acquire answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SpinAcquired {
    /// Taken (or a re-sent request found its own hold).
    Granted,
    /// Held by another hold until this server time (ms).
    Busy {
        /// When the holder's lease ends.
        until: u64,
    },
}

pub use crate::lock::WrongType;

impl SpinLock {
    /// A free spin lock.
    pub fn new() -> Self {
        Self::default()
    }

    /// The key as Redis shows it at `now`.
    pub fn view(&self, now: u64) -> Self {
        let mut view = self.clone();
        view.expire(now);
        view
    }

    fn expire(&mut self, now: u64) {
        if self.holder.as_ref().is_some_and(|(_, at)| now > *at) {
            self.holder = None;
        }
    }

    /// Acquire with hold marker `marker` and a lease of `lease_ms` (> 0).
    pub fn acquire(
        &mut self,
        now: u64,
        marker: &str,
        lease_ms: u64,
    ) -> Result<SpinAcquired, WrongType> {
        self.expire(now);
        if self.foreign {
            return Err(WrongType);
        }
        match &self.holder {
            None => {
                self.holder = Some((marker.to_owned(), now + lease_ms));
                Ok(SpinAcquired::Granted)
            }
            Some((held, _)) if held == marker => Ok(SpinAcquired::Granted),
            Some((_, until)) => Ok(SpinAcquired::Busy { until: *until }),
        }
    }

    /// Release (compare-and-delete): `true` when `marker` held it.
    pub fn release(&mut self, now: u64, marker: &str) -> Result<bool, WrongType> {
        self.expire(now);
        if self.foreign {
            return Err(WrongType);
        }
        if self.holder.as_ref().is_some_and(|(held, _)| held == marker) {
            self.holder = None;
            return Ok(true);
        }
        Ok(false)
    }

    /// Renewal of the hold `marker` to `now + lease_ms` (never shortening; 0 only checks):
    /// `true` when it still holds the lock.
    pub fn renew(&mut self, now: u64, marker: &str, lease_ms: u64) -> bool {
        self.expire(now);
        match &mut self.holder {
            Some((held, until)) if !self.foreign && held == marker => {
                if lease_ms > 0 && until.saturating_sub(now) < lease_ms {
                    *until = now + lease_ms;
                }
                true
            }
            _ => false,
        }
    }

    /// Force-unlock: whatever is at the key is deleted; `true` when something was.
    pub fn force_unlock(&mut self, now: u64) -> bool {
        self.expire(now);
        let existed = self.foreign || self.holder.is_some();
        *self = Self::default();
        existed
    }

    /// A value of another type is written over the key.
    pub fn put_foreign(&mut self) {
        self.holder = None;
        self.foreign = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_reentrant_and_compare_and_delete() {
        let mut spin = SpinLock::new();
        assert_eq!(spin.acquire(0, "#a", 100), Ok(SpinAcquired::Granted));
        assert_eq!(
            spin.acquire(1, "#b", 100),
            Ok(SpinAcquired::Busy { until: 100 })
        );
        // A re-sent request finds its own hold, without moving the lease.
        assert_eq!(spin.acquire(50, "#a", 100), Ok(SpinAcquired::Granted));
        assert_eq!(spin.holder, Some(("#a".to_owned(), 100)));
        // The lease ends; the next holder cannot be deleted by the old one.
        assert_eq!(spin.acquire(101, "#b", 100), Ok(SpinAcquired::Granted));
        assert_eq!(spin.release(102, "#a"), Ok(false));
        assert!(!spin.renew(102, "#a", 100));
        assert!(spin.renew(102, "#b", 500));
        assert_eq!(spin.holder, Some(("#b".to_owned(), 602)));
        assert_eq!(spin.release(103, "#b"), Ok(true));
        spin.put_foreign();
        assert_eq!(spin.acquire(104, "#c", 100), Err(WrongType));
        assert!(!spin.renew(104, "#c", 100));
    }
}
