//! [`MultiLock`]: several locks taken all-or-nothing.

use crate::lock::Lock;

/// Several locks taken all-or-nothing.
#[derive(Clone, Debug)]
pub struct MultiLock {
    locks: Vec<Lock>,
}

impl MultiLock {
    pub(crate) fn new(locks: Vec<Lock>) -> Self {
        Self { locks }
    }

    /// The locks, in the order they are taken.
    pub fn locks(&self) -> &[Lock] {
        &self.locks
    }
}

/// Holds every lock of a [`MultiLock`] (work in progress).
#[derive(Debug)]
pub struct MultiLockGuard {
    _private: (),
}
