//! Ownership: every plain acquire is an owner of its own; re-entry happens only inside a holder's
//! scope. Each test is ordinary user code that the first ownership model (the tokio task as
//! owner) let two critical sections into at once: `join_all` over a batch with duplicate keys,
//! `join!`, a dispatcher that moves its guards into spawned workers, a `#[tokio::main]`-style
//! body outside any task.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use futures::future::join_all;
use lockkit::{Error, JobOutcome};
use lockkit_suite::{client, raw, redis, unique, within, Warnings};
use std::sync::Mutex;

const HANG: Duration = Duration::from_secs(60);

/// Counts who is inside a critical section, and the most that ever were at once.
#[derive(Default)]
struct Section {
    inside: AtomicUsize,
    most: AtomicUsize,
}

impl Section {
    fn enter(&self) {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn most(&self) -> usize {
        self.most.load(Ordering::SeqCst)
    }
}

/// The oversold-stock critical section: read a counter in Redis, then write it back plus one (a
/// read-modify-write that is only correct under mutual exclusion), counting who is inside.
async fn read_modify_write(store: &fred::clients::Client, key: &str, section: &Section) {
    section.enter();
    let value: Option<i64> = store.get(key).await.unwrap();
    let _: () = store
        .set(key, value.unwrap_or(0) + 1, None, None, false)
        .await
        .unwrap();
    section.leave();
}

#[tokio::test]
async fn join_all_over_a_batch_with_duplicate_keys_never_lets_two_in() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let store = raw(&redis.url()).await;
    let prefix = unique("batch");
    // A batch handler's input: orders 1 and 2 appear three times each.
    let orders = [1, 2, 1, 3, 2, 1, 2];
    let sections: Vec<Arc<Section>> = (0..4).map(|_| Arc::default()).collect();
    let process = |order: usize| {
        let lock = client.lock(format!("{prefix}:order:{order}"));
        let store = store.clone();
        let section = Arc::clone(&sections[order]);
        let counter = format!("{prefix}:count:{order}");
        async move {
            let guard = lock.lock().await?;
            read_modify_write(&store, &counter, &section).await;
            guard.unlock().await
        }
    };
    let results = within(HANG, "the batch", join_all(orders.map(process))).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    for order in [1, 2, 3] {
        let expected = orders.iter().filter(|o| **o == order).count();
        assert_eq!(
            sections[order].most(),
            1,
            "order {order}: two sections of one task were inside at once"
        );
        let count: i64 = store.get(format!("{prefix}:count:{order}")).await.unwrap();
        assert_eq!(count, expected as i64, "order {order}: lost updates");
    }
}

#[tokio::test]
async fn join_of_two_plain_locks_in_one_task_waits() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("join"));
    let section = Section::default();
    let done = AtomicUsize::new(0);
    // Both futures alike: enter, stay inside until the other one is known to wait, has finished,
    // or has come in too (the bug), then leave.
    let critical = || async {
        let guard = lock.lock().await.unwrap();
        section.enter();
        within(HANG, "the other future to wait, finish or enter", async {
            while client.waiting_count() == 0
                && done.load(Ordering::SeqCst) == 0
                && section.inside.load(Ordering::SeqCst) < 2
            {
                tokio::task::yield_now().await;
            }
        })
        .await;
        section.leave();
        guard.unlock().await.unwrap();
        done.fetch_add(1, Ordering::SeqCst);
    };
    let (one, two) = (critical(), critical());
    within(HANG, "join!", async { tokio::join!(one, two) }).await;
    assert_eq!(section.most(), 1, "both futures of one task were inside");
}

#[tokio::test]
async fn join_of_two_run_exclusive_of_one_name_runs_one_job() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("job");
    let section = Section::default();
    let returned = AtomicUsize::new(0);
    let job = |_| async {
        section.enter();
        // Stay inside until the other call has returned (skipped) or come in (the bug).
        within(HANG, "the other job call", async {
            while returned.load(Ordering::SeqCst) == 0 && section.inside.load(Ordering::SeqCst) < 2
            {
                tokio::task::yield_now().await;
            }
        })
        .await;
        section.leave();
    };
    let call = || async {
        let outcome = client.run_exclusive(&name, job).await.unwrap();
        returned.fetch_add(1, Ordering::SeqCst);
        outcome
    };
    let (a, b) = within(HANG, "join!", async { tokio::join!(call(), call()) }).await;
    assert_eq!(section.most(), 1, "both jobs ran at once");
    assert_eq!(
        [a.ran(), b.ran()].iter().filter(|ran| **ran).count(),
        1,
        "one job runs, the other is skipped: {a:?} {b:?}"
    );
}

#[tokio::test]
async fn a_dispatcher_that_moves_guards_into_workers_runs_one_worker_at_a_time() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let store = raw(&redis.url()).await;
    let name = unique("dispatch");
    let counter = format!("{name}:count");
    let lock = client.lock(&name);
    let section = Arc::new(Section::default());
    let mut workers = Vec::new();
    for _ in 0..4 {
        let guard = within(HANG, "the dispatcher's lock()", lock.lock())
            .await
            .unwrap();
        let (store, section, counter, client) = (
            store.clone(),
            Arc::clone(&section),
            counter.clone(),
            client.clone(),
        );
        workers.push(tokio::spawn(async move {
            section.enter();
            // Work until the dispatcher waits for the next turn (or has come in: the bug).
            within(HANG, "the dispatcher to wait or enter", async {
                while client.waiting_count() == 0 && section.inside.load(Ordering::SeqCst) < 2 {
                    tokio::task::yield_now().await;
                }
            })
            .await;
            read_modify_write(&store, &counter, &Section::default()).await;
            section.leave();
            guard.unlock().await
        }));
    }
    // The dispatcher's next turn: the last worker's release lets it in.
    let last = within(HANG, "the dispatcher's last lock()", lock.lock())
        .await
        .unwrap();
    for worker in workers {
        within(HANG, "a worker", worker).await.unwrap().unwrap();
    }
    last.unlock().await.unwrap();
    assert_eq!(section.most(), 1, "two workers were inside at once");
    let count: i64 = store.get(&counter).await.unwrap();
    assert_eq!(count, 4, "lost updates");
}

#[test]
fn outside_any_task_two_joined_futures_exclude_each_other() {
    // The body of `#[tokio::main]` runs in `block_on`, outside any task: the first model made the
    // thread the owner there.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        assert!(
            tokio::task::try_id().is_none(),
            "block_on runs outside a task"
        );
        let redis = redis().await;
        let client = client(&redis.url()).await;
        let lock = client.lock(unique("main-body"));
        let first = lock.try_lock(Duration::ZERO, None).await.unwrap().unwrap();
        let second = lock.try_lock(Duration::ZERO, None).await.unwrap();
        assert!(
            second.is_none(),
            "a second plain acquire on the thread must not re-enter"
        );
        first.unlock().await.unwrap();
    });
}

#[tokio::test]
async fn nested_with_lock_reenters_and_still_excludes_other_clients() {
    let redis = redis().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("nested");
    let lock = a.lock(&name);
    let other = b.lock(&name);
    let counts = lock
        .with_lock(|_| async {
            let outer = lock.hold_count().await.unwrap();
            let inner = lock
                .with_lock(|_| async {
                    let count = lock.hold_count().await.unwrap();
                    let excluded = other
                        .try_lock(Duration::ZERO, None)
                        .await
                        .unwrap()
                        .is_none();
                    (count, excluded)
                })
                .await
                .unwrap();
            // A plain try_lock in the body re-enters too.
            let plain = lock
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .expect("a plain try_lock inside the scope re-enters");
            let plain_count = plain.hold_count();
            plain.unlock().await.unwrap();
            let still_excluded = other
                .try_lock(Duration::ZERO, None)
                .await
                .unwrap()
                .is_none();
            (outer, inner, plain_count, still_excluded)
        })
        .await
        .unwrap();
    assert_eq!(counts, (1, (2, true), 2, true));
    let after = other.try_lock(Duration::ZERO, None).await.unwrap();
    assert!(after.is_some(), "free once the outermost hold is released");
}

#[tokio::test]
async fn guard_scope_reenters_for_every_reentrant_kind() {
    let redis = redis().await;
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let name = unique("scope-kinds");

    let fenced = a.fenced_lock(&name);
    let guard = fenced.lock().await.unwrap();
    let inner = guard
        .scope(fenced.try_lock(Duration::ZERO, None))
        .await
        .unwrap()
        .expect("a fenced lock re-enters in its scope");
    assert_eq!(inner.hold_count(), 2);
    assert!(inner.fencing_token() > guard.fencing_token());
    assert!(b
        .fenced_lock(&name)
        .try_lock(Duration::ZERO, None)
        .await
        .unwrap()
        .is_none());
    inner.unlock().await.unwrap();
    guard.unlock().await.unwrap();

    let fair = a.fair_lock(&name);
    let guard = fair.lock().await.unwrap();
    assert!(
        fair.try_lock(Duration::ZERO, None).await.unwrap().is_none(),
        "outside the scope a second fair acquire waits"
    );
    let inner = guard
        .scope(fair.try_lock(Duration::ZERO, None))
        .await
        .unwrap()
        .expect("a fair lock re-enters in its scope");
    assert_eq!(inner.hold_count(), 2);
    inner.unlock().await.unwrap();
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_future_spawned_from_inside_a_scope_is_outside_it() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("spawned"));
    let guard = lock.lock().await.unwrap();
    let spawned = guard
        .scope(async {
            let lock = lock.clone();
            tokio::spawn(async move { lock.try_lock(Duration::ZERO, None).await })
                .await
                .unwrap()
        })
        .await
        .unwrap();
    assert!(spawned.is_none(), "a spawned task must not re-enter");
    guard.unlock().await.unwrap();
}

// A scope is entered where it runs (issue 19, §1): `a.scope(b.scope(fut))` evaluates its
// argument first, so `b`'s scope is made before `a`'s is entered. The three tests below are the
// review's scenarios; tests/model_scopes.rs generates the rest of the class.

#[tokio::test]
async fn nested_scopes_of_two_locks_keep_the_outer_one() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let a = client.lock(unique("nest-a"));
    let b = client.lock(unique("nest-b"));
    let ga = a.lock().await.unwrap();
    let gb = b.lock().await.unwrap();
    let (again_a, again_b) = within(
        HANG,
        "re-entries inside nested scopes",
        ga.scope(gb.scope(async {
            let again_a = a.try_lock(Duration::from_secs(5), None).await.unwrap();
            let again_b = b.try_lock(Duration::from_secs(5), None).await.unwrap();
            (again_a, again_b)
        })),
    )
    .await;
    let again_a = again_a.expect("the outer lock re-enters inside the inner scope");
    let again_b = again_b.expect("the inner lock re-enters");
    assert_eq!(again_a.hold_count(), 2);
    assert_eq!(again_b.hold_count(), 2);
    for guard in [again_a, again_b, gb, ga] {
        guard.unlock().await.unwrap();
    }
}

#[tokio::test]
async fn the_members_of_a_multi_lock_nest_as_scopes() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let from = client.lock(unique("account-1"));
    let to = client.lock(unique("account-2"));
    let both = client
        .multi_lock([from.clone(), to.clone()])
        .lock()
        .await
        .unwrap();
    let [first, second] = both.guards() else {
        panic!("two members");
    };
    let inner = first
        .scope(second.scope(async {
            let from_again = from.try_lock(Duration::from_secs(5), None).await.unwrap();
            let to_again = to.try_lock(Duration::from_secs(5), None).await.unwrap();
            (from_again, to_again)
        }))
        .await;
    let (Some(from_again), Some(to_again)) = inner else {
        panic!("both members re-enter inside their nested scopes: {inner:?}");
    };
    from_again.unlock().await.unwrap();
    to_again.unlock().await.unwrap();
    both.unlock().await.unwrap();
}

#[tokio::test]
async fn a_scope_future_made_inside_a_scope_and_spawned_does_not_carry_it() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let a = client.lock(unique("leak-a"));
    let b = client.lock(unique("leak-b"));
    let ga = a.lock().await.unwrap();
    let gb = b.lock().await.unwrap();
    let spawned = ga
        .scope(async {
            // Made here, inside a's scope; run by another task.
            let a = a.clone();
            let in_b = gb.scope(async move { a.try_lock(Duration::from_millis(200), None).await });
            tokio::spawn(in_b).await.unwrap()
        })
        .await
        .unwrap();
    assert!(
        spawned.is_none(),
        "the spawned task took `a` while this task holds it: {spawned:?}"
    );
    gb.unlock().await.unwrap();
    ga.unlock().await.unwrap();
}

#[tokio::test]
async fn an_upgrade_inside_nested_scopes_is_refused_at_once() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let rw = client.read_write_lock(unique("nest-rw"));
    let other = client.lock(unique("nest-other"));
    let read = rw.read_lock().await.unwrap();
    let held = other.lock().await.unwrap();
    // A wait far beyond the hang guard: only a refusal returns before it.
    let upgrade = within(
        HANG,
        "an upgrade inside nested scopes",
        read.scope(held.scope(rw.try_write_lock(HANG * 10, None))),
    )
    .await;
    assert!(matches!(upgrade, Err(Error::Refused { .. })), "{upgrade:?}");
    held.unlock().await.unwrap();
    read.unlock().await.unwrap();
}

#[tokio::test]
async fn read_write_lock_scopes_allow_downgrade_refuse_upgrade_and_plain_writes_wait() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let rw = client.read_write_lock(unique("rw-scope"));

    // Outside a scope, a task holding a plain read asks for the write lock: just another owner.
    let read = rw.read_lock().await.unwrap();
    let write = rw.try_write_lock(Duration::ZERO, None).await.unwrap();
    assert!(
        write.is_none(),
        "a plain write request waits for the reader"
    );
    // Inside the read hold's scope, asking for the write lock is an upgrade: refused.
    let upgrade = read
        .scope(rw.try_write_lock(Duration::from_secs(5), None))
        .await;
    assert!(matches!(upgrade, Err(Error::Refused { .. })), "{upgrade:?}");
    read.unlock().await.unwrap();

    // Inside a write hold's scope, read holds are granted (downgrade).
    let write = rw.write_lock().await.unwrap();
    let read = write
        .scope(rw.try_read_lock(Duration::ZERO, None))
        .await
        .unwrap()
        .expect("the writer reads inside its scope");
    assert!(
        rw.try_read_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none(),
        "outside the scope a reader waits for the writer"
    );
    write.unlock().await.unwrap();
    read.unlock().await.unwrap();
}

/// The owner a macro-locked function runs as, so nested calls can be checked.
#[lockkit::locked(client = client, key = "{name}")]
async fn outer_locked(
    client: &lockkit::Client,
    name: &str,
    counts: &Mutex<Vec<u32>>,
) -> Result<(), Error> {
    let count = client.lock(name).hold_count().await?;
    counts.lock().unwrap().push(count);
    inner_locked(client, name, counts).await
}

#[lockkit::locked(client = client, key = "{name}", wait = "5s")]
async fn inner_locked(
    client: &lockkit::Client,
    name: &str,
    counts: &Mutex<Vec<u32>>,
) -> Result<(), Error> {
    let count = client.lock(name).hold_count().await?;
    counts.lock().unwrap().push(count);
    Ok(())
}

#[tokio::test]
async fn nested_locked_functions_reenter() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("macro-nested");
    let counts = Mutex::new(Vec::new());
    within(
        HANG,
        "nested #[locked]",
        outer_locked(&client, &name, &counts),
    )
    .await
    .unwrap();
    assert_eq!(*counts.lock().unwrap(), vec![1, 2]);
    assert!(!client.lock(&name).is_locked().await.unwrap());
}

#[tokio::test]
async fn hold_count_outside_a_scope_counts_the_tasks_own_guards() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("count"));
    assert_eq!(lock.hold_count().await.unwrap(), 0);
    let guard = lock.lock().await.unwrap();
    assert!(lock.is_held_by_current_task().await.unwrap());
    assert_eq!(lock.hold_count().await.unwrap(), 1);
    let elsewhere = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.hold_count().await })
            .await
            .unwrap()
            .unwrap()
    };
    assert_eq!(elsewhere, 0, "another task took no guard");
    guard.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 0);
}

#[tokio::test]
async fn job_outcome_inside_its_own_job_reenters() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("job-nested");
    let inner = client
        .run_exclusive(&name, |_| async {
            client.run_exclusive(&name, |_| async { 7 }).await.unwrap()
        })
        .await
        .unwrap();
    assert_eq!(inner, JobOutcome::Ran(JobOutcome::Ran(7)));
}

fn self_wait_warnings(warnings: &[String], name: &str) -> usize {
    warnings
        .iter()
        .filter(|text| text.contains(name) && text.contains("acquired itself"))
        .count()
}

#[tokio::test]
async fn a_task_waiting_for_a_lock_it_holds_itself_is_warned_once_and_still_waits() {
    let warnings = Warnings::default();
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("self-wait");
    let lock = client.lock(&name);
    let guard = lock.lock().await.unwrap();

    // Another task waiting for it is not a self-wait.
    let other = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.try_lock(Duration::from_millis(200), None).await })
    };
    assert!(other.await.unwrap().unwrap().is_none());
    assert_eq!(self_wait_warnings(&warnings.take(), &name), 0);

    // The holder's own task: it still waits (the guard could be out in a worker), warned once.
    let again = lock
        .try_lock(Duration::from_millis(300), None)
        .await
        .unwrap();
    assert!(
        again.is_none(),
        "a plain acquire in the holder's task waits"
    );
    let seen = warnings.take();
    assert_eq!(self_wait_warnings(&seen, &name), 1, "{seen:?}");
    assert!(
        seen.iter().any(|text| text.contains("scope")),
        "the warning names the fix: {seen:?}"
    );

    // Released: no warning any more.
    guard.unlock().await.unwrap();
    let guard = lock.lock().await.unwrap();
    assert_eq!(self_wait_warnings(&warnings.take(), &name), 0);
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn a_spin_lock_waiting_for_itself_is_warned_too() {
    let warnings = Warnings::default();
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("spin-self-wait");
    let lock = client.spin_lock(&name);
    let guard = lock.lock().await.unwrap();
    let again = lock
        .try_lock(Duration::from_millis(300), None)
        .await
        .unwrap();
    assert!(again.is_none());
    let seen = warnings.take();
    assert_eq!(self_wait_warnings(&seen, &name), 1, "{seen:?}");
    guard.unlock().await.unwrap();
}

#[tokio::test]
async fn hold_count_counts_only_live_holds() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("count-live"));
    let guard = lock.lock().await.unwrap();
    let inner = guard
        .scope(lock.try_lock(Duration::ZERO, Some(Duration::from_millis(200))))
        .await
        .unwrap()
        .expect("re-entry in the scope");
    assert_eq!(guard.scope(lock.hold_count()).await.unwrap(), 2);
    inner.lost().await;
    // The guard's deadline is conservative (it runs from when the acquire was sent); Redis ends
    // the hold a round trip later. No event marks a server-side expiry: give it far more.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        guard.scope(lock.hold_count()).await.unwrap(),
        1,
        "a hold whose lease ended is not counted"
    );
    assert!(matches!(inner.unlock().await, Err(Error::NotHeld { .. })));
    guard.unlock().await.unwrap();
}

/// Issue 19, §4: `hold_count()` is the reentrant count of the owners the calling code acts as
/// (the design brief: "the current owner's (scope's) reentrant count"): inside a scope, the scope
/// owner's; outside, the owner of each guard the calling task acquired and has not released. An
/// owner's count is every live hold it has, so it includes re-entries made inside its scope by
/// other futures of the task (`join!`) and by other tasks running a future inside the scope
/// (`tokio::spawn(guard.scope(..))`); a task outside the scope that acquired nothing counts 0.
#[tokio::test]
async fn hold_count_is_the_owners_count_including_re_entries_made_by_others_in_its_scope() {
    use tokio::sync::oneshot;

    let redis = redis().await;
    let client = client(&redis.url()).await;
    let lock = client.lock(unique("count-owner"));
    let count_in_a_spawned_task = |lock: lockkit::Lock| async move {
        tokio::spawn(async move { lock.hold_count().await })
            .await
            .unwrap()
            .unwrap()
    };
    let guard = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 1);

    // Inside the scope: another future of the task re-enters and keeps its hold while this one
    // counts. The re-entry is the same owner's: it counts.
    let (entered, until_entered) = oneshot::channel();
    let (counted, until_counted) = oneshot::channel();
    let inside = guard
        .scope(async {
            let (reentry, count) = tokio::join!(
                async {
                    let inner = lock.lock().await.unwrap();
                    entered.send(()).unwrap();
                    until_counted.await.unwrap();
                    inner
                },
                async {
                    until_entered.await.unwrap();
                    let count = lock.hold_count().await.unwrap();
                    counted.send(()).unwrap();
                    count
                }
            );
            // A task spawned from inside the scope is outside it, and acquired nothing.
            let spawned = count_in_a_spawned_task(lock.clone()).await;
            reentry.unlock().await.unwrap();
            (count, spawned)
        })
        .await;
    assert_eq!(inside, (2, 0));

    // Another task runs a future inside the scope and re-enters there; while it keeps that hold,
    // the task that acquired the guard (outside the scope now) counts it too: same owner.
    let (entered, until_entered) = oneshot::channel();
    let (counted, until_counted) = oneshot::channel();
    let other_task = tokio::spawn(guard.scope({
        let lock = lock.clone();
        async move {
            let inner = lock.lock().await.unwrap();
            let count = lock.hold_count().await.unwrap();
            entered.send(()).unwrap();
            until_counted.await.unwrap();
            inner.unlock().await.unwrap();
            count
        }
    }));
    until_entered.await.unwrap();
    let outside = lock.hold_count().await.unwrap();
    let unrelated = count_in_a_spawned_task(lock.clone()).await;
    counted.send(()).unwrap();
    let in_other_task = within(HANG, "the other task's scope", other_task)
        .await
        .unwrap();
    assert_eq!(in_other_task, 2, "inside the scope, in the other task");
    assert_eq!(
        outside, 2,
        "the guard's owner, counted by the task that acquired it"
    );
    assert_eq!(
        unrelated, 0,
        "a task outside the scope that acquired nothing"
    );
    assert_eq!(
        lock.hold_count().await.unwrap(),
        1,
        "the re-entry is released"
    );
    guard.unlock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 0);
}
