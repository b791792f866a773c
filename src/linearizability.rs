//! Concurrent histories and a linearizability checker over the reference models
//! ([`lockkit_model::spec::Spec`]), with the progress measure built on it (stalls).
//!
//! # Histories
//!
//! A [`History`] records what clients saw: each operation's invocation and response, stamped with
//! the suite's one clock ([`now`]), the process (client or worker) that made it and the object it
//! was made on. An operation that never returned (a crashed or timed-out call, a guard dropped and
//! released in the background) is **pending**: it may or may not have taken effect, at any time
//! after its invocation, with any of the results it was given when it was abandoned
//! ([`History::abandon`]).
//!
//! # Linearizability
//!
//! [`check_object`] is the Wing–Gong search with Lowe's memoization, as Knossos and Porcupine do
//! it: the call and return events are sorted on the clock (a call before a return at the same
//! instant, so touching operations count as concurrent); the search linearizes any operation whose
//! call comes before the first remaining return, steps the model, and backtracks when a return is
//! reached whose operation is not linearized yet. A pair (set of linearized operations, model
//! state) seen once is never explored again. The history is linearizable when every operation that
//! returned is linearized; pending operations may be linearized (with one of their possible
//! results) or left out. The search is bounded by a step [`Budget`]: past it, the answer is
//! [`Verdict::Unknown`], never a hang.
//!
//! [`check`] partitions a history per object first (P-compositionality: a history is
//! linearizable iff each object's sub-history is), which keeps each search small.
//!
//! # Stalls
//!
//! [`stalls`] replays a linearization the checker found and measures, for every waiting operation
//! (an acquire that waits), the intervals during which the model says it could have been served
//! (its grant would have been a legal step) while it had not returned yet. The times are taken
//! conservatively: a state is counted only from the latest instant the operation before it can
//! have taken effect to the earliest instant the operation after it can have, so a stall is an
//! interval in which the resource was certainly free for the waiter. Intervals overlapping an
//! excluded window (a fault, when the contract allows delays) are cut out.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, PoisonError};

use lockkit_model::spec::Spec;

pub use crate::checker::now;

/// The stall bound of the contract: the handoff window plus 100 ms, in nanoseconds. A waiter left
/// unserved longer than this while the resource was free for it, with no fault active, is a
/// progress bug.
pub const STALL_BOUND_NS: u64 =
    lockkit_protocol::lock::HANDOFF_WINDOW.as_nanos() as u64 + 100_000_000;

/// An operation's handle between its invocation and its response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Call(usize);

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome<Ret> {
    /// It returned `ret` at `at` ([`now`]).
    Returned {
        /// When the response arrived.
        at: u64,
        /// What it returned.
        ret: Ret,
    },
    /// It never returned: it may have taken effect, with one of `may_have`, at any time after its
    /// invocation, or not at all.
    Pending {
        /// The results it may have had (none: it can only have had no effect).
        may_have: Vec<Ret>,
        /// When the client stopped waiting for it (its deadline, a crash), if it did.
        abandoned: Option<u64>,
    },
}

/// One operation of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Operation<Op, Ret> {
    /// The process (client, worker) that invoked it.
    pub process: u64,
    /// The object it was invoked on: histories are checked per object.
    pub object: String,
    /// The operation, with its arguments.
    pub op: Op,
    /// When it was invoked ([`now`]).
    pub call: u64,
    /// How it ended.
    pub outcome: Outcome<Ret>,
}

impl<Op, Ret> Operation<Op, Ret> {
    /// When it returned, if it did.
    pub fn returned_at(&self) -> Option<u64> {
        match self.outcome {
            Outcome::Returned { at, .. } => Some(at),
            Outcome::Pending { .. } => None,
        }
    }

    /// Until when it was outstanding: its response, else when it was abandoned, else never.
    pub fn end(&self) -> u64 {
        match self.outcome {
            Outcome::Returned { at, .. } => at,
            Outcome::Pending { abandoned, .. } => abandoned.unwrap_or(u64::MAX),
        }
    }
}

/// A concurrent history, shared by the recording tasks (`Clone` shares it).
#[derive(Debug)]
pub struct History<Op, Ret> {
    ops: Arc<Mutex<Vec<Operation<Op, Ret>>>>,
}

impl<Op, Ret> Clone for History<Op, Ret> {
    fn clone(&self) -> Self {
        History {
            ops: Arc::clone(&self.ops),
        }
    }
}

impl<Op, Ret> Default for History<Op, Ret> {
    fn default() -> Self {
        History {
            ops: Arc::new(Mutex::new(Vec::new())),
        }
    }
}

impl<Op: Clone, Ret: Clone> History<Op, Ret> {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    fn ops(&self) -> std::sync::MutexGuard<'_, Vec<Operation<Op, Ret>>> {
        self.ops.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records the invocation of `op` by `process` on `object`, now. Until [`respond`](Self::respond)
    /// or [`abandon`](Self::abandon), the operation is pending with no known result.
    pub fn invoke(&self, process: u64, object: &str, op: Op) -> Call {
        self.invoke_at(process, object, op, now())
    }

    /// [`invoke`](Self::invoke) at a given time (for histories written by hand).
    pub fn invoke_at(&self, process: u64, object: &str, op: Op, at: u64) -> Call {
        let mut ops = self.ops();
        ops.push(Operation {
            process,
            object: object.to_owned(),
            op,
            call: at,
            outcome: Outcome::Pending {
                may_have: Vec::new(),
                abandoned: None,
            },
        });
        Call(ops.len() - 1)
    }

    /// Records the response `ret` of `call`, now.
    pub fn respond(&self, call: Call, ret: Ret) {
        self.respond_at(call, ret, now());
    }

    /// [`respond`](Self::respond) at a given time.
    pub fn respond_at(&self, call: Call, ret: Ret, at: u64) {
        self.ops()[call.0].outcome = Outcome::Returned { at, ret };
    }

    /// Records that `call` will never return (its future was dropped, its reply lost, its process
    /// killed): it may have taken effect with one of `may_have`, or not at all.
    pub fn abandon(&self, call: Call, may_have: Vec<Ret>) {
        self.ops()[call.0].outcome = Outcome::Pending {
            may_have,
            abandoned: Some(now()),
        };
    }

    /// Changes the recorded operation of `call` (e.g. to mark, after the fact, that the hold an
    /// acquire took was reported lost).
    pub fn amend(&self, call: Call, change: impl FnOnce(&mut Op)) {
        change(&mut self.ops()[call.0].op);
    }

    /// Every operation so far.
    pub fn operations(&self) -> Vec<Operation<Op, Ret>> {
        self.ops().clone()
    }

    /// The history partitioned per object, each part in invocation order.
    pub fn per_object(&self) -> BTreeMap<String, Vec<Operation<Op, Ret>>> {
        let mut parts: BTreeMap<String, Vec<Operation<Op, Ret>>> = BTreeMap::new();
        for op in self.ops().iter() {
            parts.entry(op.object.clone()).or_default().push(op.clone());
        }
        for part in parts.values_mut() {
            part.sort_by_key(|op| op.call);
        }
        parts
    }
}

/// How much search a check may spend before it answers [`Verdict::Unknown`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Search steps per object history (one step: try to linearize or undo one operation).
    pub steps: u64,
}

impl Default for Budget {
    /// Two million steps per object: well under a second for the suite's histories.
    fn default() -> Self {
        Budget { steps: 2_000_000 }
    }
}

/// The answer for one object's history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<Ret> {
    /// Linearizable; `order` is a witness: operations (indices into the checked slice) with the
    /// result each had, in linearization order.
    Linearizable {
        /// The witness linearization.
        order: Vec<(usize, Ret)>,
    },
    /// Not linearizable. `longest` is the longest prefix the search could linearize; the
    /// operations in `stuck` returned, yet none of them could follow it.
    Violation {
        /// The longest linearizable prefix found.
        longest: Vec<(usize, Ret)>,
        /// Returned operations left out of `longest`.
        stuck: Vec<usize>,
    },
    /// The budget ran out first.
    Unknown {
        /// Steps spent.
        steps: u64,
    },
}

impl<Ret> Verdict<Ret> {
    /// A violation?
    pub fn is_violation(&self) -> bool {
        matches!(self, Verdict::Violation { .. })
    }

    /// Undecided within the budget?
    pub fn is_unknown(&self) -> bool {
        matches!(self, Verdict::Unknown { .. })
    }
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Call(usize),
    Return(usize),
}

struct Frame<S> {
    event: usize,
    state: S,
    candidate: usize,
}

/// Checks one object's operations against the model starting at `init`.
pub fn check_object<S: Spec>(
    init: &S,
    ops: &[Operation<S::Op, S::Ret>],
    budget: Budget,
) -> Verdict<S::Ret> {
    // Events sorted on the clock, a call before a return at the same instant.
    let mut events: Vec<(u64, u8, Event)> = Vec::with_capacity(ops.len() * 2);
    for (i, op) in ops.iter().enumerate() {
        events.push((op.call, 0, Event::Call(i)));
        if let Some(at) = op.returned_at() {
            events.push((at.max(op.call), 1, Event::Return(i)));
        }
    }
    events.sort_by_key(|&(at, kind, _)| (at, kind));
    let events: Vec<Event> = events.into_iter().map(|(_, _, e)| e).collect();
    let n = events.len();
    // A doubly linked list over the events: `head` = n, `tail` = n + 1.
    let (head, tail) = (n, n + 1);
    let mut next: Vec<usize> = (1..=n + 1).collect();
    next.push(0); // head -> first (fixed below)
    next.push(tail);
    let mut prev: Vec<usize> = (0..n).map(|i| if i == 0 { head } else { i - 1 }).collect();
    prev.push(head);
    prev.push(if n == 0 { head } else { n - 1 });
    next[head] = if n == 0 { tail } else { 0 };
    if n > 0 {
        next[n - 1] = tail;
    }
    let mut return_of = vec![usize::MAX; ops.len()];
    for (j, e) in events.iter().enumerate() {
        if let Event::Return(i) = e {
            return_of[*i] = j;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, x: usize| {
        let (p, q) = (prev[x], next[x]);
        next[p] = q;
        prev[q] = p;
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, x: usize| {
        let (p, q) = (prev[x], next[x]);
        next[p] = x;
        prev[q] = x;
    };

    let words = ops.len().div_ceil(64).max(1);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, S)> = HashSet::new();
    let mut stack: Vec<Frame<S>> = Vec::new();
    let mut longest: Vec<(usize, S::Ret)> = Vec::new();
    let mut state = init.clone();
    let mut remaining_returns = return_of.iter().filter(|&&r| r != usize::MAX).count();
    let mut cur = next[head];
    let mut first_candidate = 0usize;
    let mut steps = 0u64;
    let chosen = |stack: &[Frame<S>]| -> Vec<(usize, S::Ret)> {
        stack
            .iter()
            .map(|f| {
                let Event::Call(i) = events[f.event] else {
                    unreachable!("frames hold calls")
                };
                (i, candidates(&ops[i])[f.candidate].clone())
            })
            .collect()
    };
    loop {
        if remaining_returns == 0 {
            return Verdict::Linearizable {
                order: chosen(&stack),
            };
        }
        steps += 1;
        if steps > budget.steps {
            return Verdict::Unknown { steps };
        }
        let event = if cur == tail { None } else { Some(events[cur]) };
        match event {
            Some(Event::Call(i)) => {
                let options = candidates(&ops[i]);
                let mut advanced = false;
                for (c, ret) in options.iter().enumerate().skip(first_candidate) {
                    let Some(after) = state.step(&ops[i].op, ret) else {
                        continue;
                    };
                    linearized[i / 64] |= 1 << (i % 64);
                    if cache.insert((linearized.clone(), after.clone())) {
                        let before = std::mem::replace(&mut state, after);
                        stack.push(Frame {
                            event: cur,
                            state: before,
                            candidate: c,
                        });
                        unlink(&mut next, &mut prev, cur);
                        if return_of[i] != usize::MAX {
                            unlink(&mut next, &mut prev, return_of[i]);
                            remaining_returns -= 1;
                        }
                        if stack.len() > longest.len() {
                            longest = chosen(&stack);
                        }
                        advanced = true;
                        break;
                    }
                    linearized[i / 64] &= !(1 << (i % 64));
                }
                first_candidate = 0;
                cur = if advanced { next[head] } else { next[cur] };
            }
            // A return whose operation is not linearized yet (or the end): undo the last step.
            Some(Event::Return(_)) | None => {
                let Some(frame) = stack.pop() else {
                    let done: HashSet<usize> = longest.iter().map(|(i, _)| *i).collect();
                    let stuck = (0..ops.len())
                        .filter(|i| return_of[*i] != usize::MAX && !done.contains(i))
                        .collect();
                    return Verdict::Violation { longest, stuck };
                };
                let Event::Call(i) = events[frame.event] else {
                    unreachable!("frames hold calls")
                };
                if return_of[i] != usize::MAX {
                    relink(&mut next, &mut prev, return_of[i]);
                    remaining_returns += 1;
                }
                relink(&mut next, &mut prev, frame.event);
                linearized[i / 64] &= !(1 << (i % 64));
                state = frame.state;
                cur = frame.event;
                first_candidate = frame.candidate + 1;
            }
        }
    }
}

/// The results an operation may be linearized with: its own, or those it may have had.
fn candidates<Op, Ret>(op: &Operation<Op, Ret>) -> &[Ret] {
    match &op.outcome {
        Outcome::Returned { ret, .. } => std::slice::from_ref(ret),
        Outcome::Pending { may_have, .. } => may_have,
    }
}

/// The result of checking one object.
#[derive(Debug, Clone)]
pub struct ObjectReport<Op, Ret> {
    /// The object's operations, in invocation order (the verdict's indices point here).
    pub ops: Vec<Operation<Op, Ret>>,
    /// The verdict.
    pub verdict: Verdict<Ret>,
}

/// The result of checking a whole history, per object.
#[derive(Debug, Clone)]
pub struct Report<Op, Ret> {
    /// Per object.
    pub objects: BTreeMap<String, ObjectReport<Op, Ret>>,
}

impl<Op: Debug, Ret: Debug> Report<Op, Ret> {
    /// Object histories checked.
    pub fn histories(&self) -> usize {
        self.objects.len()
    }

    /// Operations checked.
    pub fn operations(&self) -> usize {
        self.objects.values().map(|o| o.ops.len()).sum()
    }

    /// The longest object history (operations).
    pub fn longest(&self) -> usize {
        self.objects
            .values()
            .map(|o| o.ops.len())
            .max()
            .unwrap_or(0)
    }

    /// Object histories that are not linearizable.
    pub fn violations(&self) -> usize {
        self.objects
            .values()
            .filter(|o| o.verdict.is_violation())
            .count()
    }

    /// Object histories the budget did not decide.
    pub fn unknown(&self) -> usize {
        self.objects
            .values()
            .filter(|o| o.verdict.is_unknown())
            .count()
    }

    /// A readable account of each violation: the longest linearizable prefix's tail, and the
    /// returned operations that could not follow it.
    pub fn explain(&self) -> String {
        let mut out = String::new();
        for (object, report) in &self.objects {
            if let Verdict::Violation { longest, stuck } = &report.verdict {
                out.push_str(&format!(
                    "{object}: not linearizable; {} of {} operations linearized, last ones:\n",
                    longest.len(),
                    report.ops.len()
                ));
                for (i, ret) in longest.iter().rev().take(6).rev() {
                    let op = &report.ops[*i];
                    out.push_str(&format!(
                        "    p{} {:?} -> {ret:?} [{}..{:?}]\n",
                        op.process,
                        op.op,
                        op.call,
                        op.returned_at()
                    ));
                }
                out.push_str("  cannot follow:\n");
                for i in stuck.iter().take(6) {
                    let op = &report.ops[*i];
                    out.push_str(&format!(
                        "    p{} {:?} -> {:?} [{}..{:?}]\n",
                        op.process,
                        op.op,
                        candidates(op),
                        op.call,
                        op.returned_at()
                    ));
                }
            }
        }
        out
    }
}

/// Checks `history` per object, each against the model `init(object)` returns.
pub fn check<S: Spec>(
    history: &History<S::Op, S::Ret>,
    init: impl Fn(&str) -> S,
    budget: Budget,
) -> Report<S::Op, S::Ret> {
    let objects = history
        .per_object()
        .into_iter()
        .map(|(object, ops)| {
            let verdict = check_object(&init(&object), &ops, budget);
            (object, ObjectReport { ops, verdict })
        })
        .collect();
    Report { objects }
}

/// An interval in which a waiter could have been served and was not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stall {
    /// The waiting operation (index into the object's operations).
    pub waiter: usize,
    /// From (ns, [`now`]).
    pub from: u64,
    /// To.
    pub to: u64,
}

impl Stall {
    /// Its length in nanoseconds.
    pub fn len_ns(&self) -> u64 {
        self.to - self.from
    }
}

/// The stalls of one object: the maximal intervals, outside `excluded`, in which a waiter was
/// outstanding and the model, replaying the witness `order`, says its grant `serve(op)` would have
/// been a legal step. `serve` returns `None` for operations that do not wait. Every interval is
/// returned, short ones too; compare with [`STALL_BOUND_NS`].
pub fn stalls<S: Spec>(
    init: &S,
    ops: &[Operation<S::Op, S::Ret>],
    order: &[(usize, S::Ret)],
    serve: impl Fn(&S::Op) -> Option<S::Ret>,
    excluded: &[(u64, u64)],
) -> Vec<Stall> {
    let n = order.len();
    // Earliest and latest instants each linearized operation can have taken effect at.
    let mut earliest = vec![0u64; n];
    let mut latest = vec![u64::MAX; n];
    for k in 0..n {
        let call = ops[order[k].0].call;
        earliest[k] = if k == 0 {
            call
        } else {
            call.max(earliest[k - 1])
        };
    }
    for k in (0..n).rev() {
        let ret = ops[order[k].0].returned_at().unwrap_or(u64::MAX);
        latest[k] = if k + 1 == n {
            ret
        } else {
            ret.min(latest[k + 1])
        };
    }
    // states[k]: the state before order[k] (states[n]: after the last).
    let mut states = Vec::with_capacity(n + 1);
    states.push(init.clone());
    for (i, ret) in order {
        let next = states[states.len() - 1]
            .step(&ops[*i].op, ret)
            .unwrap_or_else(|| panic!("the witness does not replay at {:?}", ops[*i].op));
        states.push(next);
    }
    let position: BTreeMap<usize, usize> = order
        .iter()
        .enumerate()
        .map(|(k, (i, _))| (*i, k))
        .collect();
    let mut found = Vec::new();
    for (w, waiter) in ops.iter().enumerate() {
        let Some(grant) = serve(&waiter.op) else {
            continue;
        };
        let (start, end) = (waiter.call, waiter.end());
        // A waiter that took effect (was granted) is counted up to its own step, from which on
        // it holds; one that did not (timed out, never linearized) through every state.
        let granted_at = position
            .get(&w)
            .copied()
            .filter(|&p| states[p + 1] != states[p]);
        let last = granted_at.unwrap_or(n);
        // Only the states that can overlap the waiter's interval (both bounds are monotone):
        // from the first that can end after its call to the last that can begin before its end.
        let first = earliest.partition_point(|&e| e <= start).min(last);
        let until = latest.partition_point(|&l| l < end).min(last);
        let free: Vec<bool> = (first..=until.max(first))
            .map(|k| states[k].step(&waiter.op, &grant).is_some())
            .collect();
        let free = |k: usize| free[k - first];
        let mut run: Option<u64> = None;
        for k in first..=until.max(first) {
            if !free(k) {
                run = None;
                continue;
            }
            let from = if k == 0 { 0 } else { latest[k - 1] };
            let begin = *run.get_or_insert(from);
            if k == until.max(first) || !free(k + 1) {
                let to = if k == last { end } else { earliest[k] };
                push_clipped(&mut found, w, begin.max(start), to.min(end), excluded);
                run = None;
            }
        }
    }
    found
}

/// Adds the parts of `[from, to)` outside every excluded window.
fn push_clipped(
    found: &mut Vec<Stall>,
    waiter: usize,
    from: u64,
    to: u64,
    excluded: &[(u64, u64)],
) {
    let mut pieces = vec![(from, to)];
    for &(a, b) in excluded {
        let mut rest = Vec::new();
        for (x, y) in pieces {
            if b <= x || a >= y {
                rest.push((x, y));
                continue;
            }
            if a > x {
                rest.push((x, a));
            }
            if b < y {
                rest.push((b, y));
            }
        }
        pieces = rest;
    }
    for (x, y) in pieces {
        if y > x {
            found.push(Stall {
                waiter,
                from: x,
                to: y,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read/write register.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Register(i64);

    #[derive(Debug, Clone)]
    enum RegOp {
        Write(i64),
        Read,
    }

    impl Spec for Register {
        type Op = RegOp;
        type Ret = i64;
        fn step(&self, op: &RegOp, ret: &i64) -> Option<Register> {
            match op {
                RegOp::Write(v) => Some(Register(*v)),
                RegOp::Read => (*ret == self.0).then(|| self.clone()),
            }
        }
    }

    /// A mutex: acquire is granted (true) only when free, or refused (false) when held.
    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct Mutex(Option<u64>);

    #[derive(Debug, Clone)]
    enum MutexOp {
        Acquire(u64),
        Release(u64),
    }

    impl Spec for Mutex {
        type Op = MutexOp;
        type Ret = bool;
        fn step(&self, op: &MutexOp, ret: &bool) -> Option<Mutex> {
            match (op, ret, self.0) {
                (MutexOp::Acquire(p), true, None) => Some(Mutex(Some(*p))),
                (MutexOp::Acquire(_), false, Some(_)) => Some(self.clone()),
                (MutexOp::Release(p), true, Some(q)) if *p == q => Some(Mutex(None)),
                (MutexOp::Release(p), false, h) if h != Some(*p) => Some(self.clone()),
                _ => None,
            }
        }
    }

    fn op<Op, Ret>(process: u64, op: Op, call: u64, ret: Option<(u64, Ret)>) -> Operation<Op, Ret> {
        Operation {
            process,
            object: "x".to_owned(),
            op,
            call,
            outcome: match ret {
                Some((at, ret)) => Outcome::Returned { at, ret },
                None => Outcome::Pending {
                    may_have: Vec::new(),
                    abandoned: None,
                },
            },
        }
    }

    fn pending<Op, Ret>(process: u64, o: Op, call: u64, may_have: Vec<Ret>) -> Operation<Op, Ret> {
        Operation {
            process,
            object: "x".to_owned(),
            op: o,
            call,
            outcome: Outcome::Pending {
                may_have,
                abandoned: None,
            },
        }
    }

    fn reg(ops: &[Operation<RegOp, i64>]) -> Verdict<i64> {
        check_object(&Register(0), ops, Budget::default())
    }

    #[test]
    fn an_empty_history_is_linearizable() {
        assert!(matches!(reg(&[]), Verdict::Linearizable { order } if order.is_empty()));
    }

    #[test]
    fn a_read_concurrent_with_a_write_may_see_either_value() {
        for seen in [0, 1] {
            let ops = [
                op(1, RegOp::Write(1), 0, Some((10, 0))),
                op(2, RegOp::Read, 5, Some((15, seen))),
            ];
            assert!(matches!(reg(&ops), Verdict::Linearizable { .. }), "{seen}");
        }
    }

    #[test]
    fn a_stale_read_after_a_write_returned_is_a_violation() {
        let ops = [
            op(1, RegOp::Write(1), 0, Some((10, 0))),
            op(2, RegOp::Read, 11, Some((15, 0))),
        ];
        let Verdict::Violation { longest, stuck } = reg(&ops) else {
            panic!("not caught")
        };
        assert_eq!(longest.len(), 1);
        assert_eq!(stuck, vec![1]);
    }

    #[test]
    fn the_classic_new_old_inversion_is_a_violation() {
        // Knossos' example: two reads overlap a write; the first sees the new value, the second,
        // which starts after the first returned, sees the old one.
        let ops = [
            op(1, RegOp::Write(1), 0, Some((100, 0))),
            op(2, RegOp::Read, 10, Some((20, 1))),
            op(3, RegOp::Read, 30, Some((40, 0))),
        ];
        assert!(reg(&ops).is_violation());
        // Both reads of the new value, or old then new, are fine.
        let ops = [
            op(1, RegOp::Write(1), 0, Some((100, 0))),
            op(2, RegOp::Read, 10, Some((20, 0))),
            op(3, RegOp::Read, 30, Some((40, 1))),
        ];
        assert!(matches!(reg(&ops), Verdict::Linearizable { .. }));
    }

    #[test]
    fn a_value_never_written_is_a_violation() {
        let ops = [
            op(1, RegOp::Write(1), 0, Some((10, 0))),
            op(2, RegOp::Read, 0, Some((10, 7))),
        ];
        assert!(reg(&ops).is_violation());
    }

    #[test]
    fn a_pending_write_may_or_may_not_have_taken_effect() {
        // A write whose reply never came: a later read may see it...
        let ops = [
            pending(1, RegOp::Write(3), 0, vec![0]),
            op(2, RegOp::Read, 50, Some((60, 3))),
        ];
        assert!(matches!(reg(&ops), Verdict::Linearizable { .. }));
        // ... or not; and a read may see it late, then keep seeing it.
        let ops = [
            pending(1, RegOp::Write(3), 0, vec![0]),
            op(2, RegOp::Read, 50, Some((60, 0))),
            op(2, RegOp::Read, 70, Some((80, 3))),
            op(2, RegOp::Read, 90, Some((95, 3))),
        ];
        let Verdict::Linearizable { order } = reg(&ops) else {
            panic!("rejected")
        };
        assert_eq!(order.len(), 4, "the pending write is in the witness");
        // But it cannot be undone once seen.
        let ops = [
            pending(1, RegOp::Write(3), 0, vec![0]),
            op(2, RegOp::Read, 50, Some((60, 3))),
            op(2, RegOp::Read, 70, Some((80, 0))),
        ];
        assert!(reg(&ops).is_violation());
        // A pending operation with no possible result can only have had no effect.
        let ops = [
            pending(1, RegOp::Write(3), 0, Vec::new()),
            op(2, RegOp::Read, 50, Some((60, 3))),
        ];
        assert!(reg(&ops).is_violation());
    }

    #[test]
    fn a_mutex_granted_twice_at_once_is_a_violation() {
        let ops = [
            op(1, MutexOp::Acquire(1), 0, Some((10, true))),
            op(2, MutexOp::Acquire(2), 5, Some((15, true))),
            op(1, MutexOp::Release(1), 20, Some((30, true))),
            op(2, MutexOp::Release(2), 20, Some((30, true))),
        ];
        assert!(check_object(&Mutex(None), &ops, Budget::default()).is_violation());
    }

    #[test]
    fn a_mutex_handed_over_with_overlapping_calls_is_linearizable() {
        // p2's acquire was invoked while p1 held, and returned after p1's release was invoked:
        // release then grant is a valid order.
        let ops = [
            op(1, MutexOp::Acquire(1), 0, Some((10, true))),
            op(2, MutexOp::Acquire(2), 5, Some((40, true))),
            op(3, MutexOp::Acquire(3), 6, Some((8, false))),
            op(1, MutexOp::Release(1), 20, Some((30, true))),
            op(2, MutexOp::Release(2), 50, Some((60, true))),
        ];
        let Verdict::Linearizable { order } = check_object(&Mutex(None), &ops, Budget::default())
        else {
            panic!("rejected")
        };
        let positions: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
        let at = |i: usize| positions.iter().position(|&p| p == i).unwrap();
        assert!(
            at(3) < at(1),
            "release before the second grant: {positions:?}"
        );
    }

    #[test]
    fn a_dropped_guards_background_release_explains_a_later_grant() {
        let ops = [
            op(1, MutexOp::Acquire(1), 0, Some((10, true))),
            pending(1, MutexOp::Release(1), 20, vec![true, false]),
            op(2, MutexOp::Acquire(2), 30, Some((40, true))),
        ];
        assert!(matches!(
            check_object(&Mutex(None), &ops, Budget::default()),
            Verdict::Linearizable { .. }
        ));
        // Not before the drop.
        let ops = [
            op(1, MutexOp::Acquire(1), 0, Some((10, true))),
            op(2, MutexOp::Acquire(2), 12, Some((18, true))),
            pending(1, MutexOp::Release(1), 20, vec![true, false]),
        ];
        assert!(check_object(&Mutex(None), &ops, Budget::default()).is_violation());
    }

    #[test]
    fn the_budget_turns_a_long_search_into_unknown() {
        // Many concurrent writes and a read that sees none of their values: every order fails.
        let mut ops: Vec<_> = (0..11)
            .map(|i| op(i, RegOp::Write(i as i64 + 1), 0, Some((100, 0))))
            .collect();
        ops.push(op(99, RegOp::Read, 200, Some((210, -1))));
        assert!(check_object(&Register(0), &ops, Budget { steps: 1000 }).is_unknown());
        assert!(check_object(&Register(0), &ops, Budget::default()).is_violation());
    }

    #[test]
    fn histories_are_partitioned_per_object() {
        let history: History<RegOp, i64> = History::new();
        // Object a is fine; object b has a stale read. Interleaved in time.
        let w = history.invoke_at(1, "a", RegOp::Write(1), 0);
        let v = history.invoke_at(2, "b", RegOp::Write(2), 1);
        history.respond_at(w, 0, 10);
        history.respond_at(v, 0, 11);
        let r = history.invoke_at(3, "a", RegOp::Read, 20);
        let s = history.invoke_at(3, "b", RegOp::Read, 21);
        history.respond_at(r, 1, 30);
        history.respond_at(s, 0, 31);
        let report = check(&history, |_| Register(0), Budget::default());
        assert_eq!(report.histories(), 2);
        assert_eq!(report.operations(), 4);
        assert_eq!(report.longest(), 2);
        assert_eq!(report.violations(), 1);
        assert!(report.objects["b"].verdict.is_violation());
        assert!(!report.objects["a"].verdict.is_violation());
        assert!(
            report.explain().contains("b: not linearizable"),
            "{}",
            report.explain()
        );
        // Without partitioning, a read of b's value on a would be accepted by a register
        // spanning both; per object it is not.
        let history: History<RegOp, i64> = History::new();
        let w = history.invoke_at(1, "b", RegOp::Write(2), 0);
        history.respond_at(w, 0, 10);
        let r = history.invoke_at(3, "a", RegOp::Read, 20);
        history.respond_at(r, 2, 30);
        assert_eq!(
            check(&history, |_| Register(0), Budget::default()).violations(),
            1
        );
    }

    #[test]
    fn a_long_sequential_history_is_checked_quickly() {
        let history: History<MutexOp, bool> = History::new();
        let mut t = 0;
        for i in 0..2000u64 {
            let p = i % 7;
            let a = history.invoke_at(p, "m", MutexOp::Acquire(p), t);
            // Another process tries while it is held, concurrently.
            let b = history.invoke_at(p + 100, "m", MutexOp::Acquire(p + 100), t + 1);
            history.respond_at(a, true, t + 2);
            history.respond_at(b, false, t + 3);
            let r = history.invoke_at(p, "m", MutexOp::Release(p), t + 4);
            history.respond_at(r, true, t + 5);
            t += 6;
        }
        let report = check(&history, |_| Mutex(None), Budget::default());
        assert_eq!(report.violations(), 0);
        assert_eq!(report.unknown(), 0);
        assert_eq!(report.longest(), 6000);
    }

    fn serve(op: &MutexOp) -> Option<bool> {
        matches!(op, MutexOp::Acquire(_)).then_some(true)
    }

    fn witness(ops: &[Operation<MutexOp, bool>]) -> Vec<(usize, bool)> {
        match check_object(&Mutex(None), ops, Budget::default()) {
            Verdict::Linearizable { order } => order,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_waiter_left_waiting_on_a_free_lock_is_a_stall() {
        // p1 holds until its release returns at 30; p2 waits from 5 and is granted only at 500.
        let ops = [
            op(1, MutexOp::Acquire(1), 0, Some((10, true))),
            op(2, MutexOp::Acquire(2), 5, Some((500, true))),
            op(1, MutexOp::Release(1), 20, Some((30, true))),
        ];
        let found = stalls(&Mutex(None), &ops, &witness(&ops), serve, &[]);
        // The first acquire's own round trip (free, not yet answered) counts too: 10.
        assert_eq!(
            found,
            vec![
                Stall {
                    waiter: 0,
                    from: 0,
                    to: 10
                },
                Stall {
                    waiter: 1,
                    from: 30,
                    to: 500
                }
            ]
        );
        // A fault window over the middle of it cuts it in two.
        let found = stalls(&Mutex(None), &ops, &witness(&ops), serve, &[(100, 400)]);
        assert_eq!(found.iter().map(Stall::len_ns).max(), Some(100));
    }

    #[test]
    fn a_waiter_behind_a_holder_is_not_stalled() {
        // The holder releases at 480..490; the waiter is granted at 500: 10 of free waiting.
        let ops = [
            op(1, MutexOp::Acquire(1), 0, Some((10, true))),
            op(2, MutexOp::Acquire(2), 5, Some((500, true))),
            op(1, MutexOp::Release(1), 480, Some((490, true))),
        ];
        let found = stalls(&Mutex(None), &ops, &witness(&ops), serve, &[]);
        assert_eq!(found.iter().map(Stall::len_ns).max(), Some(10));
    }

    #[test]
    fn a_waiter_that_timed_out_on_a_free_lock_stalled_until_its_deadline() {
        let ops = [
            op(1, MutexOp::Acquire(1), 0, Some((10, true))),
            op(1, MutexOp::Release(1), 20, Some((30, true))),
            // Waiting from 5 (refused, as if it had looked while held), gave up at 900.
            op(2, MutexOp::Acquire(2), 5, Some((900, false))),
        ];
        let found = stalls(&Mutex(None), &ops, &witness(&ops), serve, &[]);
        assert_eq!(
            found.last(),
            Some(&Stall {
                waiter: 2,
                from: 30,
                to: 900
            })
        );
    }
}
