//! The count-down latch's model.
//!
//! Encodes `docs/guide.md`, "CountDownLatch — wait until N things have happened":
//!
//! > The coordinator starts a round (only if no round is running) […] A latch at zero does not
//! > exist in Redis: `wait` on it returns `true` at once, and `try_set_count` starts a new round.
//! > […] Reaching zero deletes the count and publishes `all`, which wakes every waiter.
//! > `count_down()` on a latch at zero (never set, or already opened): `Error::Refused`, nothing
//! > counted. `try_set_count(0)` or above 4,294,967,295: `Error::InvalidArgument`.
//! > **A count-down is never counted twice.** […] Every `count_down` and `try_set_count` request
//! > carries a marker, remembered in Redis for 10 minutes […] so the re-sent copy changes
//! > nothing. This holds even when the re-send arrives after the latch opened.
//! > A key holding something else (not an integer): `Error::WrongType`, and the value is left
//! > alone.
//!
//! A re-sent `try_set_count` that set the count reports `true` again; a re-sent `count_down`
//! reports the current count (`docs/design.md`, the latch row: "ZSET of recent count-down
//! request ids (idempotency, 10 min)").

use std::collections::BTreeMap;

use crate::spec::Spec;
use crate::timed::Timed;

/// The largest count (4,294,967,295).
pub const MAX_COUNT: u64 = u32::MAX as u64;

/// How long request markers are remembered (10 minutes), in ms.
pub const REQUEST_WINDOW_MS: u64 = 10 * 60 * 1000;

/// The state of one latch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Latch {
    count: u64,
    /// Request marker → when it took effect (server ms).
    requests: BTreeMap<String, u64>,
    foreign: bool,
}

/// An operation on a latch.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LatchOp {
    /// Start a round at `count`, only if the latch is at zero.
    TrySetCount {
        /// The request's marker (a re-send repeats it).
        request: String,
        /// The count.
        count: u64,
    },
    /// Count down by one.
    CountDown {
        /// The request's marker (a re-send repeats it).
        request: String,
    },
    /// Read the count.
    Count,
    /// Wait until the count is zero (a history records whether it opened in time).
    Wait,
    /// Another program replaces the keys with a value of another type at the count key.
    Foreign,
    /// The latch's keys are deleted (by an operator).
    Clear,
}

/// An operation's result.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum LatchRet {
    /// Whether this request set the count.
    Set(bool),
    /// Counted down (or a re-send recognised); the count afterwards.
    Counted {
        /// The count afterwards (0: the latch opened).
        count: u64,
    },
    /// Refused: the latch is at zero.
    AlreadyZero,
    /// The count.
    Count(u64),
    /// `Wait` returned `true`: the latch was at zero.
    Opened,
    /// `Wait` returned `false`: the latch was still counting when it gave up.
    TimedOut,
    /// Rejected before anything was sent.
    InvalidArgument,
    /// The key holds another type; nothing changed.
    WrongType,
    /// The call failed without saying whether it took effect.
    Error,
    /// Done (`Foreign`, `Clear`).
    Done,
}

impl Latch {
    /// A latch at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// The count (0: open).
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The request markers remembered, with when they took effect.
    pub fn requests(&self) -> &BTreeMap<String, u64> {
        &self.requests
    }

    /// Whether the count key holds a value of another type.
    pub fn is_foreign(&self) -> bool {
        self.foreign
    }

    fn forget(&mut self, now: u64) {
        self.requests
            .retain(|_, at| at.saturating_add(REQUEST_WINDOW_MS) > now);
    }

    /// The result of `op` at `now`, and the state it leaves (deterministic: the script's reply).
    pub fn apply(&mut self, now: u64, op: &LatchOp) -> LatchRet {
        match op {
            LatchOp::TrySetCount { count, .. } if *count == 0 || *count > MAX_COUNT => {
                return LatchRet::InvalidArgument
            }
            LatchOp::Foreign => {
                *self = Self::new();
                self.foreign = true;
                return LatchRet::Done;
            }
            LatchOp::Clear => {
                *self = Self::new();
                return LatchRet::Done;
            }
            _ => {}
        }
        self.forget(now);
        match op {
            LatchOp::TrySetCount { request, count } => {
                if self.requests.contains_key(request) {
                    LatchRet::Set(true)
                } else if self.foreign {
                    LatchRet::WrongType
                } else if self.count > 0 {
                    LatchRet::Set(false)
                } else {
                    self.count = *count;
                    self.requests.insert(request.clone(), now);
                    LatchRet::Set(true)
                }
            }
            LatchOp::CountDown { .. } | LatchOp::Count | LatchOp::Wait if self.foreign => {
                LatchRet::WrongType
            }
            LatchOp::CountDown { request } => {
                if self.requests.contains_key(request) {
                    LatchRet::Counted { count: self.count }
                } else if self.count == 0 {
                    LatchRet::AlreadyZero
                } else {
                    self.count -= 1;
                    self.requests.insert(request.clone(), now);
                    LatchRet::Counted { count: self.count }
                }
            }
            LatchOp::Count => LatchRet::Count(self.count),
            LatchOp::Wait if self.count == 0 => LatchRet::Opened,
            LatchOp::Wait => LatchRet::TimedOut,
            LatchOp::Foreign | LatchOp::Clear => LatchRet::Done,
        }
    }
}

impl Timed for Latch {
    type Op = LatchOp;
    type Ret = LatchRet;

    fn outcomes(&self, now: u64, op: &LatchOp) -> Vec<(LatchRet, Self)> {
        let mut after = self.clone();
        let ret = after.apply(now, op);
        let mut out = vec![(ret.clone(), after.clone())];
        if ret != LatchRet::InvalidArgument {
            let mut before = self.clone();
            before.forget(now);
            out.push((LatchRet::Error, before));
            out.push((LatchRet::Error, after));
        }
        out
    }

    fn deadlines(&self) -> Vec<u64> {
        self.requests
            .values()
            .map(|at| at.saturating_add(REQUEST_WINDOW_MS))
            .collect()
    }

    fn accepts(expected: &LatchRet, observed: &LatchRet) -> bool {
        expected == observed
    }
}

/// The latch's contract without time, for checking concurrent client histories (operations and
/// results as [`LatchOp`] / [`LatchRet`], request markers unused: every recorded request is sent
/// once by the client, and a re-send inside fred is the script's business, checked by the model
/// tests): a round starts only at zero; each count-down takes one off, and is refused at zero; a
/// `Wait` that returns `true` needs the count at zero at some instant of the call, while one that
/// gives up is always allowed (whether it should have been woken is the stall measure's question).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct LatchSpec {
    count: u64,
}

impl LatchSpec {
    /// A latch at zero.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Spec for LatchSpec {
    type Op = LatchOp;
    type Ret = LatchRet;

    fn step(&self, op: &LatchOp, ret: &LatchRet) -> Option<Self> {
        let count = self.count;
        let next = match (op, ret) {
            (LatchOp::TrySetCount { count: n, .. }, LatchRet::Set(set)) => {
                if *set != (count == 0) {
                    return None;
                }
                if *set {
                    *n
                } else {
                    count
                }
            }
            (LatchOp::CountDown { .. }, LatchRet::Counted { count: left })
                if count > 0 && *left == count - 1 =>
            {
                *left
            }
            (LatchOp::CountDown { .. }, LatchRet::AlreadyZero) if count == 0 => 0,
            (LatchOp::Count, LatchRet::Count(n)) if *n == count => count,
            (LatchOp::Wait, LatchRet::Opened) if count == 0 => 0,
            (LatchOp::Wait, LatchRet::TimedOut) => count,
            _ => return None,
        };
        Some(Self { count: next })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(request: &str, count: u64) -> LatchOp {
        LatchOp::TrySetCount {
            request: request.into(),
            count,
        }
    }

    fn down(request: &str) -> LatchOp {
        LatchOp::CountDown {
            request: request.into(),
        }
    }

    #[test]
    fn counts_down_once_per_request_and_opens_at_zero() {
        let mut l = Latch::new();
        assert_eq!(l.apply(0, &down("#0")), LatchRet::AlreadyZero);
        assert_eq!(l.apply(0, &set("#1", 2)), LatchRet::Set(true));
        assert_eq!(l.apply(0, &set("#2", 5)), LatchRet::Set(false));
        assert_eq!(l.apply(0, &set("#1", 2)), LatchRet::Set(true), "a re-send");
        assert_eq!(l.apply(1, &down("#3")), LatchRet::Counted { count: 1 });
        assert_eq!(l.apply(2, &down("#3")), LatchRet::Counted { count: 1 });
        assert_eq!(l.apply(2, &LatchOp::Wait), LatchRet::TimedOut);
        assert_eq!(l.apply(3, &down("#4")), LatchRet::Counted { count: 0 });
        assert_eq!(l.apply(3, &LatchOp::Wait), LatchRet::Opened);
        // Re-sent after the latch opened: nothing counted.
        assert_eq!(l.apply(4, &down("#4")), LatchRet::Counted { count: 0 });
        assert_eq!(l.apply(4, &down("#5")), LatchRet::AlreadyZero);
        // After the window the marker is forgotten.
        assert_eq!(
            l.apply(3 + REQUEST_WINDOW_MS, &down("#4")),
            LatchRet::AlreadyZero
        );
        assert_eq!(l.apply(5, &set("#6", 0)), LatchRet::InvalidArgument);
        l.apply(5, &LatchOp::Foreign);
        assert_eq!(l.apply(5, &set("#7", 1)), LatchRet::WrongType);
    }

    #[test]
    fn spec_opens_only_at_zero() {
        let set = |n| LatchOp::TrySetCount {
            request: String::new(),
            count: n,
        };
        let down = LatchOp::CountDown {
            request: String::new(),
        };
        let s = LatchSpec::new();
        assert!(s.step(&LatchOp::Wait, &LatchRet::Opened).is_some());
        let s = s.step(&set(2), &LatchRet::Set(true)).unwrap();
        assert!(s.step(&set(5), &LatchRet::Set(true)).is_none());
        assert!(s.step(&LatchOp::Wait, &LatchRet::Opened).is_none());
        assert!(s.step(&LatchOp::Wait, &LatchRet::TimedOut).is_some());
        let s = s.step(&down, &LatchRet::Counted { count: 1 }).unwrap();
        assert!(s.step(&down, &LatchRet::Counted { count: 1 }).is_none());
        let s = s.step(&down, &LatchRet::Counted { count: 0 }).unwrap();
        assert!(s.step(&down, &LatchRet::AlreadyZero).is_some());
        assert!(s.step(&LatchOp::Wait, &LatchRet::Opened).is_some());
        assert!(s.step(&LatchOp::Count, &LatchRet::Count(0)).is_some());
    }
}
