//! Histories of the soak and the fault suite: what every client invoked and saw, per object, on
//! the suite's one clock, checked for linearizability and for stalls
//! (`lockkit_suite::linearizability`).
//!
//! The histories are written in a small vocabulary of exclusive and weighted holds (`Op`, `Ret`)
//! and judged by the reference models' time-free specs (`lockkit-model`, issue 12 §1), chosen per
//! primitive by `Model`: `LockSpec` for the reentrant locks, the fenced lock (tokens strictly
//! increase in grant order) and a multi-lock's members, `LockSpec` without re-entry for the spin
//! lock, `RwSpec` for the read-write lock (a write acquire is recorded with the whole weight) and
//! `PermitSpec` for the semaphore.
//!
//! Leases: a hold whose guard reported itself lost (or whose release said `NotHeld` or failed) may
//! have lapsed at any time (`may_lapse`); every other hold lived until its release, so a grant
//! that needs it gone is a violation. A guard dropped without `unlock` is released in the
//! background: a pending release that may take effect at any time after the drop. An acquire that
//! failed with an error is pending with no known result: it may not have taken effect (the
//! acquire's cancel path gives back what it took). A timed-out acquire is always a legal step:
//! whether it should have been served is the stall measure's question, not linearizability's.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use lockkit_model::lock::{LockOp, LockRet, LockSpec};
use lockkit_model::rwlock::{Mode, RwHistoryOp, RwSpec};
use lockkit_model::semaphore::{PermitHistoryOp, PermitSpec};
use lockkit_model::spec::Spec;
use lockkit_suite::checker::Record;
use lockkit_suite::linearizability::{
    check, stalls, Budget, Call, History, Stall, Verdict, STALL_BOUND_NS,
};

/// An operation on one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Op {
    /// Take `weight` of the capacity for `owner` (one owner per acquire). `waits`: the acquire
    /// waits for the resource (a wait longer than one attempt), so it can stall.
    Acquire {
        owner: u64,
        /// The hold it creates: unique per acquire (the owner's first hold has the owner's id;
        /// a re-entry inside the holder's scope, a new one).
        hold: u64,
        weight: u64,
        waits: bool,
        /// Set after the fact: the hold was reported lost, so it may have lapsed at any time.
        lapsable: bool,
    },
    /// Give back one hold.
    Release { hold: u64 },
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Ret {
    Granted {
        token: Option<u64>,
    },
    TimedOut,
    /// The acquire was refused (`Error::Refused`: the read-write lock's no-upgrade rule).
    Refused,
    Released,
    NotHeld,
}

/// Which reference model judges a primitive's histories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Model {
    /// `Lock`, `FencedLock`, `FairLock`, a multi-lock's members: `LockSpec` (reentrant).
    Lock,
    /// `SpinLock`: `LockSpec` without re-entry.
    Spin,
    /// `ReadWriteLock`: `RwSpec`; an acquire of weight `capacity` is a write, any other a read.
    ReadWrite { capacity: u64 },
    /// `Semaphore` of `permits`: `PermitSpec`.
    Semaphore { permits: u64 },
}

impl Model {
    /// The model's initial state: nothing held.
    pub fn spec(self) -> Checked {
        match self {
            Model::Lock => Checked::Lock(LockSpec::new(true)),
            Model::Spin => Checked::Lock(LockSpec::new(false)),
            Model::ReadWrite { capacity } => Checked::ReadWrite {
                capacity,
                spec: RwSpec::new(),
            },
            Model::Semaphore { permits } => Checked::Permits(PermitSpec::new(permits)),
        }
    }
}

/// A model's state, stepped with this vocabulary (`Op`, `Ret`) translated to the model's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Checked {
    Lock(LockSpec),
    ReadWrite { capacity: u64, spec: RwSpec },
    Permits(PermitSpec),
}

impl Spec for Checked {
    type Op = Op;
    type Ret = Ret;

    fn step(&self, op: &Op, ret: &Ret) -> Option<Checked> {
        let token = match ret {
            Ret::Granted { token } => *token,
            _ => None,
        };
        let ret = match ret {
            Ret::Granted { .. } => LockRet::Granted(None),
            Ret::TimedOut => LockRet::TimedOut,
            Ret::Refused => LockRet::Refused,
            Ret::Released => LockRet::Released,
            Ret::NotHeld => LockRet::NotHeld,
        };
        match self {
            Checked::Lock(spec) => {
                let op = match op {
                    Op::Acquire {
                        owner,
                        hold,
                        lapsable,
                        ..
                    } => LockOp::Acquire {
                        owner: owner.to_string(),
                        hold: hold.to_string(),
                        may_lapse: *lapsable,
                    },
                    Op::Release { hold } => LockOp::Release {
                        hold: hold.to_string(),
                    },
                };
                let ret = match ret {
                    LockRet::Granted(_) => LockRet::Granted(token),
                    other => other,
                };
                spec.step(&op, &ret).map(Checked::Lock)
            }
            Checked::ReadWrite { capacity, spec } => {
                let op = match op {
                    Op::Acquire {
                        owner,
                        hold,
                        weight,
                        lapsable,
                        ..
                    } => RwHistoryOp::Acquire {
                        owner: owner.to_string(),
                        hold: hold.to_string(),
                        mode: if weight == capacity {
                            Mode::Write
                        } else {
                            Mode::Read
                        },
                        may_lapse: *lapsable,
                    },
                    Op::Release { hold } => RwHistoryOp::Release {
                        hold: hold.to_string(),
                    },
                };
                spec.step(&op, &ret).map(|spec| Checked::ReadWrite {
                    capacity: *capacity,
                    spec,
                })
            }
            Checked::Permits(spec) => {
                let op = match op {
                    Op::Acquire {
                        hold,
                        weight,
                        lapsable,
                        ..
                    } => PermitHistoryOp::Acquire {
                        hold: hold.to_string(),
                        permits: *weight,
                        may_lapse: *lapsable,
                    },
                    Op::Release { hold } => PermitHistoryOp::Release {
                        hold: hold.to_string(),
                    },
                };
                spec.step(&op, &ret).map(Checked::Permits)
            }
        }
    }
}

/// The grant a waiting acquire is waiting for (for the stall measure).
pub fn serve(op: &Op) -> Option<Ret> {
    match op {
        Op::Acquire { waits: true, .. } => Some(Ret::Granted { token: None }),
        _ => None,
    }
}

/// One primitive's history.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    pub history: History<Op, Ret>,
    /// When each waiting acquire (by hold id) had surely joined its object's line: see
    /// [`Recording::joining`].
    joined: Arc<Mutex<HashMap<u64, u64>>>,
}

static OWNERS: AtomicU64 = AtomicU64::new(1);

/// A pending acquire: its calls (one per object, e.g. a multi-lock's members), its owner and the
/// hold it creates.
#[derive(Debug, Clone)]
pub struct Acquiring {
    calls: Vec<Call>,
    pub owner: u64,
    hold: u64,
}

/// A granted hold: the acquire calls (to mark lost), its owner and its own id.
#[derive(Debug, Clone)]
pub struct Hold {
    calls: Vec<Call>,
    objects: Vec<String>,
    process: u64,
    pub owner: u64,
    id: u64,
}

impl Hold {
    /// The process that holds it.
    pub fn process(&self) -> u64 {
        self.process
    }

    /// The hold's id (its releases name it).
    pub fn id(&self) -> u64 {
        self.id
    }
}

impl Recording {
    pub fn new() -> Recording {
        Recording::default()
    }

    /// An acquire of `weight` on each of `objects` (all at once: a multi-lock), by an owner of
    /// its own.
    pub fn acquire(&self, process: u64, objects: &[&str], weight: u64, waits: bool) -> Acquiring {
        let owner = OWNERS.fetch_add(1, Ordering::Relaxed);
        self.invoke_acquire(process, objects, (owner, owner), weight, waits, None)
    }

    /// A re-entry inside `held`'s scope: an acquire by the same owner, creating a hold of its own.
    pub fn reenter(&self, held: &Hold, waits: bool) -> Acquiring {
        let objects: Vec<&str> = held.objects.iter().map(String::as_str).collect();
        let hold = OWNERS.fetch_add(1, Ordering::Relaxed);
        self.invoke_acquire(held.process, &objects, (held.owner, hold), 1, waits, None)
    }

    fn invoke_acquire(
        &self,
        process: u64,
        objects: &[&str],
        (owner, hold): (u64, u64),
        weight: u64,
        waits: bool,
        at: Option<u64>,
    ) -> Acquiring {
        let op = Op::Acquire {
            owner,
            hold,
            weight,
            waits,
            lapsable: false,
        };
        let calls = objects
            .iter()
            .map(|object| match at {
                Some(at) => self.history.invoke_at(process, object, op.clone(), at),
                None => self.history.invoke(process, object, op.clone()),
            })
            .collect();
        Acquiring { calls, owner, hold }
    }

    pub fn granted(
        &self,
        acquiring: &Acquiring,
        process: u64,
        objects: &[&str],
        token: Option<u64>,
    ) -> Hold {
        for call in &acquiring.calls {
            self.history.respond(*call, Ret::Granted { token });
        }
        Hold {
            calls: acquiring.calls.clone(),
            objects: objects.iter().map(|o| (*o).to_owned()).collect(),
            process,
            owner: acquiring.owner,
            id: acquiring.hold,
        }
    }

    pub fn timed_out(&self, acquiring: &Acquiring) {
        for call in &acquiring.calls {
            self.history.respond(*call, Ret::TimedOut);
        }
    }

    /// Runs `acquire`, the library call of `acquiring`, and records when it had surely joined
    /// its object's line: the moment the call began to wait (after a refused first try), as the
    /// library counts it in its `lockkit_waiters` gauge ([`line_joined`]). A FIFO object orders
    /// its line by when calls first found it busy, which the invocation order does not give: a
    /// call's first try may reach Redis after a later call's (a `NOSCRIPT` reload, a slow
    /// scheduler), so the stall measure asks which waiters may be ahead of this one by this time.
    pub async fn joining<F: std::future::Future>(
        &self,
        acquiring: &Acquiring,
        acquire: F,
    ) -> F::Output {
        let (out, joined) = line_joined(acquire).await;
        if let Some(at) = joined {
            self.joined_at(acquiring, at);
        }
        out
    }

    /// The waiting acquire `acquiring` had surely joined its object's line at `at`.
    pub fn joined_at(&self, acquiring: &Acquiring, at: u64) {
        self.joined.lock().unwrap().insert(acquiring.hold, at);
    }

    /// The acquire was refused (`Error::Refused`): nothing taken.
    pub fn refused(&self, acquiring: &Acquiring) {
        for call in &acquiring.calls {
            self.history.respond(*call, Ret::Refused);
        }
    }

    /// The acquire failed with an error: no known result.
    pub fn failed(&self, acquiring: &Acquiring) {
        for call in &acquiring.calls {
            self.history.abandon(*call, Vec::new());
        }
    }

    /// The hold was reported lost: it may have lapsed at any time.
    pub fn lost(&self, hold: &Hold) {
        for call in &hold.calls {
            self.history.amend(*call, |op| {
                if let Op::Acquire { lapsable, .. } = op {
                    *lapsable = true;
                }
            });
        }
    }

    /// Releases `hold` through `release`, recording the invocation and the answer: `Ok(true)`
    /// released, `Ok(false)` not held, `Err` unknown.
    pub async fn release<E>(
        &self,
        hold: &Hold,
        release: impl std::future::Future<Output = Result<bool, E>>,
    ) -> Result<bool, E> {
        let calls: Vec<Call> = hold
            .objects
            .iter()
            .map(|object| {
                self.history
                    .invoke(hold.process, object, Op::Release { hold: hold.id })
            })
            .collect();
        let result = release.await;
        for call in calls {
            match result {
                Ok(true) => self.history.respond(call, Ret::Released),
                Ok(false) => self.history.respond(call, Ret::NotHeld),
                Err(_) => self
                    .history
                    .abandon(call, vec![Ret::Released, Ret::NotHeld]),
            }
        }
        if !matches!(result, Ok(true)) {
            self.lost(hold);
        }
        result
    }

    /// The guard was dropped: released in the background, some time from now.
    pub fn dropped(&self, hold: &Hold) {
        for object in &hold.objects {
            let call = self
                .history
                .invoke(hold.process, object, Op::Release { hold: hold.id });
            self.history
                .abandon(call, vec![Ret::Released, Ret::NotHeld]);
        }
    }
}

/// Operations made by another process (the fault suite's worker processes), recorded after the
/// fact with the times that process reported on the same clock.
impl Recording {
    /// [`acquire`](Recording::acquire), invoked at `at`.
    pub fn acquire_at(
        &self,
        process: u64,
        objects: &[&str],
        weight: u64,
        waits: bool,
        at: u64,
    ) -> Acquiring {
        let owner = OWNERS.fetch_add(1, Ordering::Relaxed);
        self.invoke_acquire(process, objects, (owner, owner), weight, waits, Some(at))
    }

    /// [`granted`](Recording::granted), answered at `at`.
    pub fn granted_at(
        &self,
        acquiring: &Acquiring,
        process: u64,
        objects: &[&str],
        token: Option<u64>,
        at: u64,
    ) -> Hold {
        for call in &acquiring.calls {
            self.history.respond_at(*call, Ret::Granted { token }, at);
        }
        Hold {
            calls: acquiring.calls.clone(),
            objects: objects.iter().map(|o| (*o).to_owned()).collect(),
            process,
            owner: acquiring.owner,
            id: acquiring.hold,
        }
    }
}

/// What the checks found in one primitive's histories.
#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub histories: usize,
    pub operations: usize,
    pub longest: usize,
    pub violations: usize,
    pub unknown: usize,
    /// Stalls longer than the bound, outside the excluded windows.
    pub stalls: usize,
    /// The longest interval a waiter was left unserved while the resource was free for it
    /// (outside the excluded windows), in ms; below the bound unless `stalls > 0`.
    pub longest_stall_ms: f64,
    /// Windows in which the test process was not scheduled
    /// ([`scheduling_lags`](lockkit_suite::checker::scheduling_lags)), cut out of the stall
    /// measure like faults.
    pub scheduling_lags: usize,
    /// Violations and stalls, readable.
    pub explain: String,
}

/// Checks `recording` per object against `model(object)`, and measures stalls beyond `bound_ns`
/// outside `excluded`.
pub fn examine(
    recording: &Recording,
    model: impl Fn(&str) -> Model,
    bound_ns: u64,
    excluded: &[(u64, u64)],
) -> Figures {
    // A semaphore and a read-write lock serve their line first come first served (issue 28): a
    // waiter is not due while a waiter that came before it still waits (it may need more than is
    // free, or be a writer that readers behind it must not overtake).
    let fifo = recording.history.operations().first().is_some_and(|op| {
        matches!(
            model(&op.object),
            Model::Semaphore { .. } | Model::ReadWrite { .. }
        )
    });
    let joined = recording.joined.lock().unwrap().clone();
    let line = |op: &Op| match op {
        Op::Acquire { hold, .. } => joined.get(hold).copied(),
        Op::Release { .. } => None,
    };
    examine_fifo(
        &recording.history,
        |object| model(object).spec(),
        serve,
        bound_ns,
        excluded,
        fifo.then_some(&line as &Joined<'_, Op>),
    )
}

/// Checks any history per object against `spec(object)`, and measures the stalls of the waiting
/// operations (`serve`: the result a waiting operation waits for) beyond `bound_ns` outside
/// `excluded`.
pub fn examine_history<S: Spec>(
    history: &History<S::Op, S::Ret>,
    spec: impl Fn(&str) -> S,
    serve: impl Fn(&S::Op) -> Option<S::Ret> + Copy,
    bound_ns: u64,
    excluded: &[(u64, u64)],
) -> Figures {
    examine_fifo(history, spec, serve, bound_ns, excluded, None)
}

/// By when a waiting operation had surely joined its object's line (`None`: not known).
pub type Joined<'a, Op> = dyn Fn(&Op) -> Option<u64> + 'a;

/// As [`examine_history`]; with `line`, the objects serve their waiters in line (a semaphore's or
/// a read-write lock's FIFO line, issue 28), ordered by when each call first found the object
/// busy, and `line(op)` says by when the waiting operation `op` had surely joined it (`None`: not
/// known, taken as its return). A waiter's stall counts only while no other waiting operation
/// that may be ahead of it in the line is still outstanding: one invoked before the waiter had
/// surely joined. That loses no stall of a FIFO object: the head of the line is never excused by
/// a waiter behind it (invoked after the head had joined), and when the resource is free for the
/// head, its own stall is counted. (The invocation order alone does not give the line's order:
/// a call's first try may reach Redis after a later call's, delayed by a `NOSCRIPT` reload or
/// the scheduler, and the later call is then ahead of it.)
pub fn examine_fifo<S: Spec>(
    history: &History<S::Op, S::Ret>,
    spec: impl Fn(&str) -> S,
    serve: impl Fn(&S::Op) -> Option<S::Ret> + Copy,
    bound_ns: u64,
    excluded: &[(u64, u64)],
    line: Option<&Joined<'_, S::Op>>,
) -> Figures {
    let report = check(history, &spec, budget());
    let mut figures = Figures {
        histories: report.histories(),
        operations: report.operations(),
        longest: report.longest(),
        violations: report.violations(),
        unknown: report.unknown(),
        explain: report.explain(),
        ..Figures::default()
    };
    // Windows in which the machine did not run this process are no library's stall.
    let mut excluded = excluded.to_vec();
    let lags = lockkit_suite::checker::scheduling_lags();
    figures.scheduling_lags = lags.len();
    excluded.extend(lags);
    for (object, checked) in &report.objects {
        let Verdict::Linearizable { order } = &checked.verdict else {
            continue;
        };
        for stall in stalls(&spec(object), &checked.ops, order, serve, &excluded) {
            let stall = if let Some(line) = line {
                // The windows in which a waiter that may be ahead in the line still waited
                // excuse this one.
                let waiter = &checked.ops[stall.waiter];
                let joined = line(&waiter.op).unwrap_or_else(|| waiter.end());
                let ahead: Vec<(u64, u64)> = checked
                    .ops
                    .iter()
                    .enumerate()
                    .filter(|(i, op)| {
                        *i != stall.waiter && serve(&op.op).is_some() && op.call < joined
                    })
                    .map(|(_, op)| (op.call, op.end()))
                    .collect();
                match longest_outside(stall.from, stall.to, &ahead) {
                    Some((from, to)) => Stall { from, to, ..stall },
                    None => continue,
                }
            } else {
                stall
            };
            let ms = stall.len_ns() as f64 / 1e6;
            figures.longest_stall_ms = figures.longest_stall_ms.max(ms);
            if stall.len_ns() > bound_ns {
                figures.stalls += 1;
                let waiter = &checked.ops[stall.waiter];
                figures.explain.push_str(&format!(
                    "{object}: stall of {ms:.1} ms: p{} {:?} [{}..{:?}] unserved from {} to {} while the resource was free for it\n",
                    waiter.process, waiter.op, waiter.call, waiter.returned_at(), stall.from, stall.to
                ));
            }
        }
    }
    figures
}

/// The longest part of `[from, to)` outside every window of `windows`; `None` when nothing is
/// left.
fn longest_outside(from: u64, to: u64, windows: &[(u64, u64)]) -> Option<(u64, u64)> {
    let mut pieces = vec![(from, to)];
    for &(a, b) in windows {
        pieces = pieces
            .into_iter()
            .flat_map(|(x, y)| {
                if b <= x || a >= y {
                    vec![(x, y)]
                } else {
                    [(x, a.max(x)), (b.min(y), y)]
                        .into_iter()
                        .filter(|(p, q)| p < q)
                        .collect()
                }
            })
            .collect();
    }
    pieces.into_iter().max_by_key(|(x, y)| y - x)
}

/// The check budget: `LOCKKIT_LIN_BUDGET` search steps per object history, default 2 million.
pub fn budget() -> Budget {
    std::env::var("LOCKKIT_LIN_BUDGET")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .map_or_else(Budget::default, |steps| Budget { steps })
}

/// The stall bound of the primitives that wait on pub/sub: the handoff window + 100 ms.
pub const BOUND_NS: u64 = STALL_BOUND_NS;

/// The spin lock polls by design (2 ms doubling to 128 ms, with jitter): its bound is twice the
/// backoff cap + 100 ms.
pub const SPIN_BOUND_NS: u64 = 2 * 128_000_000 + 100_000_000;

/// Adds one primitive's figures to a record, as `lin_<primitive>_<measure>`.
pub fn to_record(record: Record, primitive: &str, figures: &Figures) -> Record {
    let key = |measure: &str| format!("lin_{primitive}_{measure}");
    record
        .num(&key("histories"), figures.histories as f64)
        .num(&key("operations"), figures.operations as f64)
        .num(&key("longest"), figures.longest as f64)
        .num(&key("violations"), figures.violations as f64)
        .num(&key("unknown"), figures.unknown as f64)
        .num(&key("stalls"), figures.stalls as f64)
        .num(&key("longest_stall"), figures.longest_stall_ms)
        .num(&key("scheduling_lags"), figures.scheduling_lags as f64)
}

/// Prints one primitive's figures (marker `HISTORY`).
pub fn report(primitive: &str, figures: &Figures) {
    println!(
        "HISTORY {primitive}: {} histories, {} operations (longest {}), {} violations, {} unknown, {} stalls (longest {:.1} ms)",
        figures.histories,
        figures.operations,
        figures.longest,
        figures.violations,
        figures.unknown,
        figures.stalls,
        figures.longest_stall_ms
    );
}

// === When a waiting call joined its line ===

tokio::task_local! {
    /// The moment ([`now`](lockkit_suite::checker::now)) the scoped acquire call began to wait.
    static JOINED: Arc<AtomicU64>;
}

/// Runs `acquire` (one library acquire call) and returns its output with the moment it began to
/// wait, if it did: its first try was refused and it registered as a waiter, which the library
/// counts in its `lockkit_waiters` gauge inside the call (the `metrics` feature). The request
/// is in the object's line from that first try on, so it had surely joined by then.
pub async fn line_joined<F: std::future::Future>(acquire: F) -> (F::Output, Option<u64>) {
    install_join_recorder();
    let joined = Arc::new(AtomicU64::new(0));
    let out = JOINED.scope(Arc::clone(&joined), acquire).await;
    let at = joined.load(Ordering::SeqCst);
    (out, (at != 0).then_some(at))
}

/// The `lockkit_waiters` gauge as [`line_joined`] reads it: an increment inside a scoped call
/// is the moment that call began to wait (its first, if it waits more than once).
struct JoinGauge;

impl metrics::GaugeFn for JoinGauge {
    fn increment(&self, _: f64) {
        let _ = JOINED.try_with(|joined| {
            let _ = joined.compare_exchange(
                0,
                lockkit_suite::checker::now(),
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        });
    }
    fn decrement(&self, _: f64) {}
    fn set(&self, _: f64) {}
}

struct JoinRecorder;

impl metrics::Recorder for JoinRecorder {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        metrics::Counter::noop()
    }
    fn register_gauge(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        if key.name() == "lockkit_waiters" {
            metrics::Gauge::from_arc(Arc::new(JoinGauge))
        } else {
            metrics::Gauge::noop()
        }
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// Installs [`JoinRecorder`] as the process's metrics recorder, once.
fn install_join_recorder() {
    static INSTALLED: OnceLock<()> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        metrics::set_global_recorder(JoinRecorder)
            .expect("no other metrics recorder in a history-recording test binary");
    });
}
