//! Model-based test of the client's own ownership mechanism, the holder's **scope** (issue 19,
//! §1): generated programs of nested `scope`s, `tokio::spawn`, `spawn_local`, `join` and
//! `select!`, with scope futures made in one place and polled in another, acquire 2–3 locks of
//! the reentrant kinds (`Lock`, `FencedLock`, `FairLock`, `ReadWriteLock` in both modes) through
//! two clients on a real `redis-server`. Every acquire is checked against a small reference of
//! the ownership rule (the guide's "Ownership" section):
//!
//! - the reference places each acquire in the tree of scopes **where it runs**: a scope's body
//!   is inside that scope and inside every scope the scope future itself is polled in; a spawned
//!   task (or a `LocalSet` task) starts outside every scope, whatever it carries;
//! - inside a scope of the same lock through the same client, the acquire **re-enters** as the
//!   scope's owner and is granted at once; a write request inside a read hold's scope whose owner
//!   holds no write hold is **refused** (`Error::Refused`), never waited on;
//! - anywhere else the acquire is an owner of its own: it is granted only when no other owner
//!   holds the lock in a conflicting mode (checked against a shadow of the live holds), and a
//!   timed-out wait must have met a holder or a release in flight.
//!
//! Budget: `LOCKKIT_SCOPE_CASES` programs (default [`DEFAULT_CASES`]); `LOCKKIT_MODEL_SEED`
//! replays a run. A failure prints the seed, the shrunk program and what broke the rule.
//!
//! `LOCKKIT_SCOPE_SURVEY=1` (for revert checks) runs every program without stopping at the
//! first failure or shrinking, and fails with the number of violating programs per class of
//! violation (`[lost-scope]`, `[leaked-scope]`, `[upgrade-not-refused]`, ...) and the smallest
//! program of each class.

use std::cell::Cell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::future::{join_all, BoxFuture, FutureExt};
use lockkit::{Error, LockGuard};
use lockkit_suite::checker::{model_seed, save_model_cases as save_cases};
use lockkit_suite::{spawned, unique};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// Programs per run in CI (about 0.2 s each on the 2-core machine).
const DEFAULT_CASES: u32 = 120;
/// How long a generated `try_*` waits. A wait the reference expects to end in a timeout costs
/// this much; nothing is asserted about time.
const WAIT: Duration = Duration::from_millis(100);

/// `std`'s mutex without poisoning (a violation is reported, never a panic inside).
#[derive(Debug, Default)]
struct Mutex<T>(std::sync::Mutex<T>);

impl<T> Mutex<T> {
    fn lock(&self) -> std::sync::MutexGuard<'_, T> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

// === the generated programs ===

/// The kinds of reentrant lock a program's objects are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LockKind {
    Lock,
    Fenced,
    Fair,
    ReadWrite,
}

/// An acquire: object `lock` (modulo the program's objects) through client `client`, in write
/// mode (`write`, read-write locks only; the other kinds are exclusive).
#[derive(Debug, Clone, Copy)]
struct Target {
    lock: usize,
    client: usize,
    write: bool,
}

/// Where a scope future made in one place is polled.
#[derive(Debug, Clone, Copy)]
enum Place {
    /// `tokio::spawn(guard.scope(body))`: in a task of its own.
    Spawned,
    /// Made here, then polled inside the scope of another hold taken here.
    IntoScopeOf(Target),
    /// Made inside the scope of another hold, returned out of it, then polled outside it.
    OutOfScopeOf(Target),
}

#[derive(Debug, Clone)]
enum Node {
    /// Acquire `target` here; when granted, run `body` inside its scope (`scoped`) or beside
    /// it (a plain guard held while `body` runs), then unlock.
    Acquire {
        target: Target,
        scoped: bool,
        body: Vec<Node>,
    },
    /// Acquire `outer` and `inner` here, then `outer.scope(inner.scope(body))`.
    Nest {
        outer: Target,
        inner: Target,
        body: Vec<Node>,
    },
    /// Acquire `target` here and make its scope future of `body`; poll it `at`.
    Moved {
        target: Target,
        at: Place,
        body: Vec<Node>,
    },
    /// `tokio::spawn(body)`, awaited.
    Spawn(Vec<Node>),
    /// `spawn_local(body)` on a `LocalSet` driven from here, awaited.
    SpawnLocal(Vec<Node>),
    /// The branches polled together by one future (`join_all`).
    Join(Vec<Vec<Node>>),
    /// `tokio::select!` of `body` against a branch that never completes.
    Select(Vec<Node>),
}

#[derive(Debug, Clone)]
struct Program {
    kinds: Vec<LockKind>,
    nodes: Vec<Node>,
}

fn target() -> impl Strategy<Value = Target> {
    (0..3usize, prop::bool::weighted(0.15), any::<bool>()).prop_map(|(lock, other, write)| Target {
        lock,
        client: usize::from(other),
        write,
    })
}

fn place() -> impl Strategy<Value = Place> {
    prop_oneof![
        Just(Place::Spawned),
        target().prop_map(Place::IntoScopeOf),
        target().prop_map(Place::OutOfScopeOf),
    ]
}

fn node() -> impl Strategy<Value = Node> {
    let leaf = target().prop_map(|target| Node::Acquire {
        target,
        scoped: false,
        body: Vec::new(),
    });
    leaf.prop_recursive(4, 24, 3, |inner| {
        let body = prop::collection::vec(inner, 0..3);
        prop_oneof![
            4 => (target(), prop::bool::weighted(0.75), body.clone())
                .prop_map(|(target, scoped, body)| Node::Acquire { target, scoped, body }),
            3 => (target(), target(), body.clone())
                .prop_map(|(outer, inner, body)| Node::Nest { outer, inner, body }),
            3 => (target(), place(), body.clone())
                .prop_map(|(target, at, body)| Node::Moved { target, at, body }),
            1 => body.clone().prop_map(Node::Spawn),
            1 => body.clone().prop_map(Node::SpawnLocal),
            1 => prop::collection::vec(body.clone(), 2..=3).prop_map(Node::Join),
            1 => body.prop_map(Node::Select),
        ]
    })
}

fn program() -> impl Strategy<Value = Program> {
    let kind = prop_oneof![
        1 => Just(LockKind::Lock),
        1 => Just(LockKind::Fenced),
        1 => Just(LockKind::Fair),
        2 => Just(LockKind::ReadWrite),
    ];
    (
        prop::collection::vec(kind, 2..=3),
        prop::collection::vec(node(), 1..4),
    )
        .prop_map(|(kinds, nodes)| Program { kinds, nodes })
}

// === the reference ===

/// An owner, as the reference names them.
type Owner = u64;

/// The reference's scope chain: the scopes an acquire runs in, innermost first.
#[derive(Debug)]
struct Frame {
    lock: usize,
    client: usize,
    owner: Owner,
    parent: Ctx,
}

type Ctx = Option<Arc<Frame>>;

fn enter(ctx: &Ctx, held: &Held) -> Ctx {
    Some(Arc::new(Frame {
        lock: held.target.lock,
        client: held.target.client,
        owner: held.owner,
        parent: ctx.clone(),
    }))
}

fn find(ctx: &Ctx, lock: usize, client: usize) -> Option<Owner> {
    let mut frame = ctx.as_deref();
    while let Some(here) = frame {
        if here.lock == lock && here.client == client {
            return Some(here.owner);
        }
        frame = here.parent.as_deref();
    }
    None
}

/// What the ownership rule says of an acquire.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Reenter(Owner),
    Refused,
    Fresh,
}

/// The live holds of one lock, per owner, as the program has them (a hold counts from its grant
/// until its unlock is sent), and the releases in flight.
#[derive(Debug, Default)]
struct Shadow {
    /// Owner → (read holds, write holds); the exclusive kinds count writes.
    holds: HashMap<Owner, (u32, u32)>,
    releasing: u32,
    /// Acquires sent and not answered yet (one may hold the lock already: its task may be
    /// blocked before it can record the grant).
    acquiring: u32,
    /// Bumped on every grant and every release sent or answered.
    activity: u64,
}

impl Shadow {
    fn busy(&self) -> bool {
        self.releasing > 0 || self.acquiring > 0 || self.holds.values().any(|&(r, w)| r + w > 0)
    }

    /// Another owner holds the lock in a mode that excludes `write`.
    fn conflict(&self, owner: Owner, write: bool) -> Option<Owner> {
        self.holds
            .iter()
            .find(|&(&other, &(r, w))| other != owner && (w > 0 || (write && r > 0)))
            .map(|(&other, _)| other)
    }
}

/// A hold the program took.
struct Held {
    target: Target,
    owner: Owner,
    guard: LockGuard,
}

enum Object {
    Lock(lockkit::Lock),
    Fenced(lockkit::FencedLock),
    Fair(lockkit::FairLock),
    ReadWrite(lockkit::ReadWriteLock),
}

#[derive(Debug, Default)]
struct Counts {
    reentered: AtomicUsize,
    refused: AtomicUsize,
    fresh: AtomicUsize,
    timed_out: AtomicUsize,
}

struct Env {
    /// `objects[client][lock]`: the same names through each client.
    objects: Vec<Vec<Object>>,
    kinds: Vec<LockKind>,
    shadows: Vec<Mutex<Shadow>>,
    next_owner: AtomicU64,
    violations: Mutex<Vec<String>>,
    counts: Arc<Counts>,
}

impl Env {
    fn target(&self, target: Target) -> Target {
        let lock = target.lock % self.kinds.len();
        Target {
            lock,
            client: target.client,
            write: target.write || self.kinds[lock] != LockKind::ReadWrite,
        }
    }

    fn violation(&self, why: String) {
        self.violations.lock().push(why);
    }

    fn describe(&self, target: Target) -> String {
        let kind = self.kinds[target.lock];
        let mode = match (kind, target.write) {
            (LockKind::ReadWrite, true) => " (write)",
            (LockKind::ReadWrite, false) => " (read)",
            _ => "",
        };
        format!(
            "{kind:?} #{}{mode} through client {}",
            target.lock, target.client
        )
    }

    async fn try_acquire(&self, target: Target) -> Result<Option<LockGuard>, Error> {
        match &self.objects[target.client][target.lock] {
            Object::Lock(lock) => lock.try_lock(WAIT, None).await,
            Object::Fenced(lock) => lock
                .try_lock(WAIT, None)
                .await
                .map(|guard| guard.map(LockGuard::from)),
            Object::Fair(lock) => lock.try_lock(WAIT, None).await,
            Object::ReadWrite(lock) if target.write => lock.try_write_lock(WAIT, None).await,
            Object::ReadWrite(lock) => lock.try_read_lock(WAIT, None).await,
        }
    }

    /// Acquires `target` where the reference context is `ctx`, and checks the outcome against
    /// the ownership rule. `Some` when granted (and recorded in the shadow).
    async fn acquire(&self, ctx: &Ctx, target: Target) -> Option<Held> {
        let target = self.target(target);
        let what = self.describe(target);
        let (expect, busy_before, activity_before) = {
            let mut shadow = self.shadows[target.lock].lock();
            let expect = match find(ctx, target.lock, target.client) {
                Some(owner) => {
                    let (_, writes) = shadow.holds.get(&owner).copied().unwrap_or_default();
                    let upgrade = self.kinds[target.lock] == LockKind::ReadWrite
                        && target.write
                        && writes == 0;
                    if upgrade {
                        Expect::Refused
                    } else {
                        Expect::Reenter(owner)
                    }
                }
                None => Expect::Fresh,
            };
            let busy = shadow.busy();
            shadow.acquiring += 1;
            (expect, busy, shadow.activity)
        };
        let outcome = self.try_acquire(target).await;
        let mut shadow = self.shadows[target.lock].lock();
        shadow.acquiring -= 1;
        match (expect, outcome) {
            (Expect::Reenter(owner), Ok(Some(guard))) => {
                self.counts.reentered.fetch_add(1, Ordering::Relaxed);
                let (reads, writes) = shadow.holds.get(&owner).copied().unwrap_or_default();
                let before = if target.write { writes } else { reads };
                if before > 0 && guard.hold_count() < 2 {
                    self.violation(format!(
                        "[leaked-scope] {what}: a re-entry inside the scope of owner {owner} (who holds it \
                         {before} time(s) in this mode) got hold count {}: it was granted as \
                         another owner",
                        guard.hold_count()
                    ));
                }
                Some(record(&mut shadow, target, owner, guard))
            }
            (Expect::Reenter(owner), other) => {
                self.violation(format!(
                    "[lost-scope] {what}: inside the scope of its holder (owner {owner}) it must re-enter at \
                     once, but it returned {}",
                    show(&other)
                ));
                other.ok().flatten().map(|guard| {
                    let fresh = self.next_owner.fetch_add(1, Ordering::Relaxed);
                    record(&mut shadow, target, fresh, guard)
                })
            }
            (Expect::Refused, Err(Error::Refused { .. })) => {
                self.counts.refused.fetch_add(1, Ordering::Relaxed);
                None
            }
            (Expect::Refused, other) => {
                self.violation(format!(
                    "[upgrade-not-refused] {what}: a write request inside a read hold's scope must be refused at \
                     once (an upgrade), but it returned {}",
                    show(&other)
                ));
                other.ok().flatten().map(|guard| {
                    let fresh = self.next_owner.fetch_add(1, Ordering::Relaxed);
                    record(&mut shadow, target, fresh, guard)
                })
            }
            (Expect::Fresh, Ok(Some(guard))) => {
                self.counts.fresh.fetch_add(1, Ordering::Relaxed);
                let owner = self.next_owner.fetch_add(1, Ordering::Relaxed);
                if let Some(other) = shadow.conflict(owner, target.write) {
                    self.violation(format!(
                        "[leaked-scope] {what}: outside every scope of it, it is an owner of its own, but it \
                         was granted while owner {other} holds it (mutual exclusion broken; \
                         hold count {})",
                        guard.hold_count()
                    ));
                } else if guard.hold_count() != 1 {
                    self.violation(format!(
                        "[leaked-scope] {what}: outside every scope of it, it was granted with hold count {}: \
                         it re-entered someone else's hold",
                        guard.hold_count()
                    ));
                }
                Some(record(&mut shadow, target, owner, guard))
            }
            (Expect::Fresh, Ok(None)) => {
                self.counts.timed_out.fetch_add(1, Ordering::Relaxed);
                if !busy_before && !shadow.busy() && shadow.activity == activity_before {
                    self.violation(format!(
                        "[free-lock-timeout] {what}: the wait timed out while nobody held the lock"
                    ));
                }
                None
            }
            (Expect::Fresh, Err(err)) => {
                self.violation(format!(
                    "[{}] {what}: outside every scope of it, it must be granted or wait, but it \
                     failed: {err}",
                    if matches!(err, Error::Refused { .. }) {
                        "leaked-scope"
                    } else {
                        "error"
                    }
                ));
                None
            }
        }
    }

    async fn release(&self, held: Held) {
        let target = held.target;
        {
            let mut shadow = self.shadows[target.lock].lock();
            if let Some((reads, writes)) = shadow.holds.get_mut(&held.owner) {
                let count = if target.write { writes } else { reads };
                *count = count.saturating_sub(1);
            }
            shadow.holds.retain(|_, &mut (r, w)| r + w > 0);
            shadow.releasing += 1;
            shadow.activity += 1;
        }
        let released = held.guard.unlock().await;
        let mut shadow = self.shadows[target.lock].lock();
        shadow.releasing -= 1;
        shadow.activity += 1;
        drop(shadow);
        if let Err(err) = released {
            self.violation(format!(
                "[error] {}: unlock failed: {err}",
                self.describe(target)
            ));
        }
    }
}

fn record(shadow: &mut Shadow, target: Target, owner: Owner, guard: LockGuard) -> Held {
    let entry = shadow.holds.entry(owner).or_default();
    if target.write {
        entry.1 += 1;
    } else {
        entry.0 += 1;
    }
    shadow.activity += 1;
    Held {
        target,
        owner,
        guard,
    }
}

fn show(outcome: &Result<Option<LockGuard>, Error>) -> String {
    match outcome {
        Ok(Some(guard)) => format!("a guard (hold count {})", guard.hold_count()),
        Ok(None) => "Ok(None) after waiting".to_owned(),
        Err(err) => format!("Err({err})"),
    }
}

// === the interpreter ===

thread_local! {
    /// Whether this thread drives a generated `LocalSet`.
    static IN_LOCAL_SET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `nodes` one after another where the reference context is `ctx`.
fn run(env: Arc<Env>, ctx: Ctx, nodes: Vec<Node>) -> BoxFuture<'static, ()> {
    async move {
        for node in nodes {
            step(Arc::clone(&env), ctx.clone(), node).await;
        }
    }
    .boxed()
}

async fn step(env: Arc<Env>, ctx: Ctx, node: Node) {
    match node {
        Node::Acquire {
            target,
            scoped,
            body,
        } => {
            let Some(held) = env.acquire(&ctx, target).await else {
                return;
            };
            if scoped {
                let inner = enter(&ctx, &held);
                held.guard.scope(run(Arc::clone(&env), inner, body)).await;
            } else {
                run(Arc::clone(&env), ctx, body).await;
            }
            env.release(held).await;
        }
        Node::Nest { outer, inner, body } => {
            let outer = env.acquire(&ctx, outer).await;
            let inner = env.acquire(&ctx, inner).await;
            if let (Some(outer), Some(inner)) = (&outer, &inner) {
                let body_ctx = enter(&enter(&ctx, outer), inner);
                // The argument (the inner scope) is made before the outer scope is entered.
                outer
                    .guard
                    .scope(inner.guard.scope(run(Arc::clone(&env), body_ctx, body)))
                    .await;
            }
            for held in [inner, outer].into_iter().flatten() {
                env.release(held).await;
            }
        }
        Node::Moved { target, at, body } => moved(env, ctx, target, at, body).await,
        Node::Spawn(body) => {
            let task = tokio::spawn(run(Arc::clone(&env), None, body));
            if let Err(err) = task.await {
                env.violation(format!("a spawned task failed: {err}"));
            }
        }
        Node::SpawnLocal(body) => {
            if IN_LOCAL_SET.with(Cell::get) {
                // `block_in_place` cannot run inside a local task: a plain spawn instead.
                let task = tokio::spawn(run(Arc::clone(&env), None, body));
                if let Err(err) = task.await {
                    env.violation(format!("a spawned task failed: {err}"));
                }
                return;
            }
            // A `LocalSet` driven from inside this poll (so inside the scopes of `ctx`, on
            // this thread): its task is polled from within the scope's poll, yet is a task of
            // its own.
            let fut = run(Arc::clone(&env), None, body);
            let task = tokio::task::block_in_place(|| {
                IN_LOCAL_SET.with(|flag| flag.set(true));
                let local = tokio::task::LocalSet::new();
                let done = tokio::runtime::Handle::current()
                    .block_on(local.run_until(async { tokio::task::spawn_local(fut).await }));
                IN_LOCAL_SET.with(|flag| flag.set(false));
                done
            });
            if let Err(err) = task {
                env.violation(format!("a local task failed: {err}"));
            }
        }
        Node::Join(branches) => {
            join_all(
                branches
                    .into_iter()
                    .map(|branch| run(Arc::clone(&env), ctx.clone(), branch)),
            )
            .await;
        }
        Node::Select(body) => {
            tokio::select! {
                () = run(Arc::clone(&env), ctx, body) => {}
                () = std::future::pending::<()>() => {}
            }
        }
    }
}

// `OutOfScopeOf` returns a scope future out of another scope, on purpose.
#[allow(clippy::async_yields_async)]
async fn moved(env: Arc<Env>, ctx: Ctx, target: Target, at: Place, body: Vec<Node>) {
    let Some(held) = env.acquire(&ctx, target).await else {
        return;
    };
    match at {
        Place::Spawned => {
            // Made here (inside whatever scopes `ctx` has), polled in a task of its own.
            let fut = held
                .guard
                .scope(run(Arc::clone(&env), enter(&None, &held), body));
            if let Err(err) = tokio::spawn(fut).await {
                env.violation(format!("a spawned scope failed: {err}"));
            }
        }
        Place::IntoScopeOf(other) => {
            let fut_ctx_without = enter(&ctx, &held);
            match env.acquire(&ctx, other).await {
                Some(other) => {
                    let body_ctx = enter(&enter(&ctx, &other), &held);
                    let fut = held.guard.scope(run(Arc::clone(&env), body_ctx, body));
                    other.guard.scope(fut).await;
                    env.release(other).await;
                }
                None => {
                    held.guard
                        .scope(run(Arc::clone(&env), fut_ctx_without, body))
                        .await;
                }
            }
        }
        Place::OutOfScopeOf(other) => match env.acquire(&ctx, other).await {
            Some(other) => {
                let body_ctx = enter(&ctx, &held);
                let made_inside = {
                    let env = Arc::clone(&env);
                    let guard = &held.guard;
                    other
                        .guard
                        .scope(async move { guard.scope(run(env, body_ctx, body)) })
                        .await
                };
                // Polled outside `other`'s scope, where it was made.
                made_inside.await;
                env.release(other).await;
            }
            None => {
                let body_ctx = enter(&ctx, &held);
                held.guard
                    .scope(run(Arc::clone(&env), body_ctx, body))
                    .await;
            }
        },
    }
    env.release(held).await;
}

// === the runner ===

fn cases() -> u32 {
    std::env::var("LOCKKIT_SCOPE_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(DEFAULT_CASES)
}

async fn run_program(
    clients: &[lockkit::Client],
    counts: &Arc<Counts>,
    program: Program,
) -> Vec<String> {
    let names: Vec<String> = (0..program.kinds.len())
        .map(|i| unique(&format!("scope-{i}")))
        .collect();
    let objects = clients
        .iter()
        .map(|client| {
            program
                .kinds
                .iter()
                .zip(&names)
                .map(|(kind, name)| match kind {
                    LockKind::Lock => Object::Lock(client.lock(name)),
                    LockKind::Fenced => Object::Fenced(client.fenced_lock(name)),
                    LockKind::Fair => Object::Fair(client.fair_lock(name)),
                    LockKind::ReadWrite => Object::ReadWrite(client.read_write_lock(name)),
                })
                .collect()
        })
        .collect();
    let env = Arc::new(Env {
        objects,
        shadows: program.kinds.iter().map(|_| Mutex::default()).collect(),
        kinds: program.kinds,
        next_owner: AtomicU64::new(1),
        violations: Mutex::default(),
        counts: Arc::clone(counts),
    });
    // The program runs in a task of its own, as application code does.
    let task = tokio::spawn(run(Arc::clone(&env), None, program.nodes));
    if let Err(err) = task.await {
        env.violation(format!("the program's task failed: {err}"));
    }
    let violations = env.violations.lock().clone();
    violations
}

/// Runs every program (no shrinking), then fails with the violating programs per class.
fn survey(
    rt: &tokio::runtime::Runtime,
    clients: &[lockkit::Client],
    counts: &Arc<Counts>,
    runner: &mut TestRunner,
    seed: u64,
) {
    use proptest::strategy::ValueTree;
    // class -> (violating programs, the smallest one and its first violation of that class)
    let mut classes: std::collections::BTreeMap<String, (u32, String, String)> =
        std::collections::BTreeMap::new();
    for _ in 0..cases() {
        let program = match program().new_tree(runner) {
            Ok(tree) => tree.current(),
            Err(why) => panic!("generating a program: {why}"),
        };
        let shown = format!("{program:#?}");
        let violations = rt.block_on(run_program(clients, counts, program));
        let mut seen = std::collections::BTreeSet::new();
        for violation in violations {
            let class = violation
                .split(']')
                .next()
                .unwrap_or_default()
                .trim_start_matches('[')
                .to_owned();
            if !seen.insert(class.clone()) {
                continue;
            }
            let entry = classes
                .entry(class)
                .or_insert_with(|| (0, shown.clone(), violation.clone()));
            entry.0 += 1;
            if shown.len() < entry.1.len() {
                entry.1 = shown.clone();
                entry.2 = violation;
            }
        }
    }
    let mut report = format!("survey of {} programs (seed {seed}):\n", cases());
    for (class, (programs, smallest, violation)) in &classes {
        report.push_str(&format!("  [{class}]: {programs} program(s)\n"));
        report.push_str(&format!("    smallest: {smallest}\n    {violation}\n"));
    }
    assert!(classes.is_empty(), "{report}");
    println!("{report}no violation");
}

#[test]
fn scopes_follow_the_ownership_rule_where_they_run() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let server = rt.block_on(spawned());
    let url = server.url();
    let clients: Vec<lockkit::Client> = rt.block_on(async {
        let mut clients = Vec::new();
        for _ in 0..2 {
            clients.push(lockkit::Client::connect(&url).await.expect("connect"));
        }
        clients
    });
    let counts = Arc::new(Counts::default());
    let seed = model_seed();
    let config = Config {
        cases: cases(),
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 300,
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    if std::env::var("LOCKKIT_SCOPE_SURVEY").is_ok_and(|v| v == "1") {
        survey(&rt, &clients, &counts, &mut runner, seed);
        return;
    }
    let result = runner.run(&program(), |program| {
        let violations = rt.block_on(run_program(&clients, &counts, program));
        if violations.is_empty() {
            Ok(())
        } else {
            Err(TestCaseError::fail(violations.join("\n")))
        }
    });
    match result {
        Ok(()) => {
            println!(
                "{} programs passed (seed {seed}): {} re-entries, {} refusals, {} fresh \
                 grants, {} timed-out waits",
                cases(),
                counts.reentered.load(Ordering::Relaxed),
                counts.refused.load(Ordering::Relaxed),
                counts.fresh.load(Ordering::Relaxed),
                counts.timed_out.load(Ordering::Relaxed),
            );
            save_cases("scopes", cases());
        }
        Err(TestError::Fail(why, program)) => panic!(
            "a scope broke the ownership rule (LOCKKIT_MODEL_SEED={seed}).\nShrunk program: \
             {program:#?}\n{why}"
        ),
        Err(TestError::Abort(why)) => panic!("aborted (seed {seed}): {why}"),
    }
    rt.block_on(async {
        for client in clients {
            let _ = client.shutdown().await;
        }
    });
}
