//! Owners and scopes: who holds a hold, and where re-entry happens.
//!
//! Implementation notes for maintainers:
//!
//! - **A plain acquire is an owner of its own.** Its owner id is `<client id>:<sequence>`, fresh
//!   for every `lock()` / `try_lock()` / `lock_with_lease()` call made outside a scope. Two
//!   futures of one task (`join!`, `join_all`, `select!`) or a dispatcher that moves its guards
//!   into spawned workers therefore never share an owner: the second acquire waits, as with
//!   `tokio::sync::Mutex`. (The first version used the tokio task as the owner, and let both in.)
//! - **Re-entry happens inside a holder's scope.** [`in_scope`] runs a future inside a frame
//!   that names the holder's client, object key and owner id. An acquire of the same object
//!   through the same client made while that future (or anything it awaits) is polled finds the
//!   frame and acquires as that owner, so the script re-enters and counts a hold. Frames nest
//!   (a scope inside a scope of another lock keeps both).
//! - **A scope is entered where it runs.** The chain of frames is a thread-local that each
//!   scope future sets for the duration of one poll of its inner future, on top of the chain
//!   current where *it* is polled ([`InScope`]). Nothing is read when `scope(..)` is called:
//!   arguments are evaluated first, so `a.scope(b.scope(fut))` creates `b`'s scope before `a`'s
//!   is entered, and a scope future made inside a scope may be spawned into another task. Each
//!   frame is tagged with the tokio task that polls it, and only that task sees it: a spawned
//!   task (even one a `LocalSet` polls from inside the scope's poll) is outside the scope.
//! - **Holds taken per task.** [`Taken`] remembers, per tokio task (per thread outside a task),
//!   the lock holds that task acquired and has not released, whatever task their guards moved
//!   to. It serves two things: the self-wait warning (a task about to wait for a lock it holds
//!   itself is the likely self-deadlock) and `hold_count()` outside a scope. A hold known lost
//!   (its lease ran out, or renewal found it gone) cannot make its task wait for itself: the
//!   warning ignores it (an election's `lead` that campaigns again after a loss is no
//!   self-wait).

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use lockkit_protocol::keys::Kind;
use parking_lot::Mutex;

use crate::hold::Hold;

thread_local! {
    /// The innermost holder's scope of the future being polled on this thread, with the tokio
    /// task polling it. Set by [`InScope::poll`] for the duration of one poll of its inner
    /// future and restored afterwards, so it is only ever seen from inside that poll.
    static CURRENT: RefCell<Option<Entered>> = const { RefCell::new(None) };
}

/// What [`CURRENT`] holds while a scope's future is polled.
#[derive(Clone)]
struct Entered {
    /// The task that polls the scope (`None` outside a tokio task). A task polled from inside
    /// another task's poll (a `LocalSet` driven by `run_until`) has another id and is outside.
    task: Option<tokio::task::Id>,
    frame: Arc<Frame>,
}

/// The scope chain current where the caller runs: the innermost frame when the calling code is
/// polled inside a scope of the same task.
fn current() -> Option<Arc<Frame>> {
    CURRENT
        .try_with(|current| {
            let current = current.borrow();
            let entered = current.as_ref()?;
            (entered.task == tokio::task::try_id()).then(|| Arc::clone(&entered.frame))
        })
        .ok()
        .flatten()
}

/// The holder a scope is of.
struct Holder {
    /// The id of the client the hold was taken through.
    client_id: Arc<str>,
    /// The object's main key.
    key: Arc<str>,
    /// The holder's owner id.
    owner: Arc<str>,
}

/// One holder's scope, placed in the chain of the scopes it runs in.
pub(crate) struct Frame {
    holder: Arc<Holder>,
    /// The enclosing scope where this scope's future was polled.
    parent: Option<Arc<Frame>>,
}

impl Frame {
    fn find(&self, client_id: &str, key: &str) -> Option<Arc<str>> {
        let mut frame = Some(self);
        while let Some(here) = frame {
            let holder = &here.holder;
            if &*holder.key == key && &*holder.client_id == client_id {
                return Some(Arc::clone(&holder.owner));
            }
            frame = here.parent.as_deref();
        }
        None
    }
}

/// The owner of the innermost enclosing scope of `key` through the client `client_id`, where
/// the calling code runs.
pub(crate) fn scoped(client_id: &str, key: &str) -> Option<Arc<str>> {
    current()?.find(client_id, key)
}

/// Runs `fut` inside the scope of `owner`'s hold on `key` through the client `client_id`.
///
/// The scope takes its place in the tree of scopes where it runs, not where it is made: the
/// enclosing scope is read each time the returned future is polled (see [`InScope`]).
pub(crate) fn in_scope<F: Future>(
    client_id: Arc<str>,
    key: Arc<str>,
    owner: Arc<str>,
    fut: F,
) -> InScope<F> {
    InScope {
        holder: Arc::new(Holder {
            client_id,
            key,
            owner,
        }),
        frame: None,
        fut,
    }
}

pin_project_lite::pin_project! {
    /// A future run inside a holder's scope (see [`in_scope`]).
    ///
    /// A plain future, not an `async fn`: an `async fn` would keep `fut` twice in its state
    /// (the argument and the awaited future), and nested scopes would multiply the size of the
    /// caller's future.
    ///
    /// Each poll reads the scope chain current where it is polled (`parent`), enters this
    /// holder's frame on top of it for the duration of the inner poll, and restores the chain
    /// afterwards (also when the inner poll panics). The frame is made again only when the
    /// parent changed, so a scope polled in one place allocates once. Reading the chain at poll
    /// time, not when `scope(..)` is called, is what keeps two things right that Rust's
    /// argument order would break: in `a.scope(b.scope(fut))` the inner scope is created
    /// before the outer one is entered, yet runs inside it; and a scope future created inside
    /// a scope and spawned into another task carries no trace of where it was made.
    pub(crate) struct InScope<F> {
        holder: Arc<Holder>,
        frame: Option<Arc<Frame>>,
        #[pin]
        fut: F,
    }
}

impl<F: Future> Future for InScope<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let parent = current();
        let frame = match this.frame {
            Some(frame) if same_frame(frame.parent.as_ref(), parent.as_ref()) => Arc::clone(frame),
            _ => {
                let frame = Arc::new(Frame {
                    holder: Arc::clone(this.holder),
                    parent,
                });
                *this.frame = Some(Arc::clone(&frame));
                frame
            }
        };
        let entered = Entered {
            task: tokio::task::try_id(),
            frame,
        };
        match CURRENT.try_with(|current| current.replace(Some(entered))) {
            Ok(outer) => {
                let _restore = Restore(outer);
                this.fut.poll(cx)
            }
            // The thread is being torn down: no scope can be entered any more.
            Err(_) => this.fut.poll(cx),
        }
    }
}

fn same_frame(a: Option<&Arc<Frame>>, b: Option<&Arc<Frame>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b),
        (None, None) => true,
        _ => false,
    }
}

/// Puts the enclosing scope back when a poll of [`InScope`] ends, also by a panic.
struct Restore(Option<Entered>);

impl Drop for Restore {
    fn drop(&mut self) {
        let outer = self.0.take();
        let _ = CURRENT.try_with(|current| *current.borrow_mut() = outer);
    }
}

/// Whether holds of `kind` have owners that can wait for themselves: the lock kinds.
pub(crate) fn is_lock_kind(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Lock
            | Kind::FencedLock
            | Kind::FairLock
            | Kind::ReadWriteLock
            | Kind::SpinLock
            | Kind::Election
    )
}

/// Who took a hold: the tokio task, or the thread outside any task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Taker {
    Task(tokio::task::Id),
    Thread(std::thread::ThreadId),
}

impl Taker {
    pub(crate) fn current() -> Self {
        match tokio::task::try_id() {
            Some(task) => Taker::Task(task),
            None => Taker::Thread(std::thread::current().id()),
        }
    }
}

/// A hold the taker has not released yet.
#[derive(Debug)]
struct TakenHold {
    hold: Arc<Hold>,
}

/// The lock holds each task took and has not released (see the module notes). Kept per taker
/// in a short list (a task holds few locks at once), so recording a grant and forgetting it
/// clone two `Arc`s and allocate nothing per object key.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    holds: Mutex<HashMap<Taker, Vec<TakenHold>>>,
}

impl Taken {
    /// Records that `taker` took `hold`.
    pub(crate) fn insert(&self, taker: Taker, hold: &Arc<Hold>) {
        self.holds.lock().entry(taker).or_default().push(TakenHold {
            hold: Arc::clone(hold),
        });
    }

    /// Forgets hold `seq` (released, or its guard dropped).
    pub(crate) fn remove(&self, taker: Taker, seq: u64) {
        let mut holds = self.holds.lock();
        if let Some(list) = holds.get_mut(&taker) {
            list.retain(|taken| taken.hold.seq != seq);
            if list.is_empty() {
                holds.remove(&taker);
            }
        }
    }

    /// Whether the calling task took a hold of the object at `key` that is not released yet
    /// and not known lost.
    pub(crate) fn current_holds(&self, key: &str) -> bool {
        self.holds
            .lock()
            .get(&Taker::current())
            .is_some_and(|list| {
                list.iter()
                    .any(|taken| taken.hold.key() == key && !taken.hold.is_lost())
            })
    }

    /// The distinct owners of the holds of `key` the calling task took and has not released.
    pub(crate) fn current_owners(&self, key: &str) -> Vec<Arc<str>> {
        let holds = self.holds.lock();
        let mut owners: Vec<Arc<str>> = Vec::new();
        if let Some(list) = holds.get(&Taker::current()) {
            let of_key = list.iter().filter(|taken| taken.hold.key() == key);
            for owner in of_key.filter_map(|taken| taken.hold.owner.as_ref()) {
                if !owners.contains(owner) {
                    owners.push(Arc::clone(owner));
                }
            }
        }
        owners
    }

    /// Logs the self-wait warning when the calling task is about to wait for `key`, a lock it
    /// took itself and has not released (a hold known lost does not count: it is not renewed,
    /// so it cannot keep its own task waiting).
    pub(crate) fn warn_if_waiting_on_itself(&self, kind: Kind, key: &str, name: &str) {
        if self.current_holds(key) {
            tracing::warn!(
                kind = kind.describe(),
                name,
                "this task waits for {} `{name}`, which it acquired itself and has not released: \
                 unless that guard was moved to another task that will release it, this waits \
                 until the hold's lease ends (forever in watchdog mode). To re-enter, acquire \
                 inside the holder's scope (`guard.scope(fut)`, `with_lock`, `#[locked]`); \
                 otherwise release the guard before locking again",
                kind.describe()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arc(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[tokio::test]
    async fn scopes_nest_and_do_not_leak_into_spawned_tasks() {
        assert!(scoped("c", "k1").is_none());
        let found = in_scope(arc("c"), arc("k1"), arc("c:1"), async {
            let inner = in_scope(arc("c"), arc("k2"), arc("c:2"), async {
                (scoped("c", "k1"), scoped("c", "k2"), scoped("other", "k1"))
            })
            .await;
            let spawned = tokio::spawn(async { scoped("c", "k1") })
                .await
                .unwrap_or_default();
            (inner, spawned)
        })
        .await;
        let ((k1, k2, other_client), spawned) = found;
        assert_eq!(k1.as_deref(), Some("c:1"));
        assert_eq!(k2.as_deref(), Some("c:2"));
        assert_eq!(other_client, None);
        assert_eq!(spawned, None, "a spawned task is outside the scope");
        assert!(
            scoped("c", "k1").is_none(),
            "the scope ends with its future"
        );
    }

    #[tokio::test]
    async fn a_scope_created_before_its_parent_is_entered_runs_inside_it() {
        // `a.scope(b.scope(fut))`: the argument (b's scope) is made before a's scope exists.
        let inner = in_scope(arc("c"), arc("kb"), arc("c:b"), async {
            (scoped("c", "ka"), scoped("c", "kb"))
        });
        let (a, b) = in_scope(arc("c"), arc("ka"), arc("c:a"), inner).await;
        assert_eq!(a.as_deref(), Some("c:a"), "the outer scope is kept");
        assert_eq!(b.as_deref(), Some("c:b"));
    }

    #[tokio::test]
    #[allow(clippy::async_yields_async)] // the point: a scope future returned out of a scope
    async fn a_scope_made_inside_a_scope_and_polled_outside_it_has_only_its_own_frame() {
        let made_inside = in_scope(arc("c"), arc("ka"), arc("c:a"), async {
            in_scope(arc("c"), arc("kb"), arc("c:b"), async {
                (scoped("c", "ka"), scoped("c", "kb"))
            })
        })
        .await;
        let (a, b) = made_inside.await;
        assert_eq!(a, None, "polled outside a's scope");
        assert_eq!(b.as_deref(), Some("c:b"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_scope_future_spawned_from_inside_a_scope_does_not_carry_it() {
        let spawned = in_scope(arc("c"), arc("ka"), arc("c:a"), async {
            let made_here = in_scope(arc("c"), arc("kb"), arc("c:b"), async {
                (scoped("c", "ka"), scoped("c", "kb"))
            });
            tokio::spawn(made_here).await
        })
        .await;
        let Ok((a, b)) = spawned else {
            panic!("the spawned task failed");
        };
        assert_eq!(a, None, "the spawned task is outside a's scope");
        assert_eq!(b.as_deref(), Some("c:b"));
    }

    #[tokio::test]
    async fn a_local_task_polled_from_inside_a_scope_is_outside_it() {
        let local = tokio::task::LocalSet::new();
        let (spawned, same_task) = in_scope(arc("c"), arc("ka"), arc("c:a"), async {
            local
                .run_until(async {
                    let spawned = tokio::task::spawn_local(async { scoped("c", "ka") }).await;
                    (spawned, scoped("c", "ka"))
                })
                .await
        })
        .await;
        assert_eq!(same_task.as_deref(), Some("c:a"));
        assert!(
            matches!(spawned, Ok(None)),
            "a local task is a task of its own"
        );
    }

    #[tokio::test]
    async fn a_scope_first_polled_inside_another_and_finished_outside_it_leaves_it() {
        let mut inner = Box::pin(in_scope(arc("c"), arc("kb"), arc("c:b"), async {
            let first = scoped("c", "ka");
            tokio::task::yield_now().await;
            (first, scoped("c", "ka"), scoped("c", "kb"))
        }));
        // One poll inside a's scope (the inner future is left pending after its first read)...
        in_scope(arc("c"), arc("ka"), arc("c:a"), async {
            std::future::poll_fn(|cx| {
                assert!(inner.as_mut().poll(cx).is_pending());
                Poll::Ready(())
            })
            .await;
        })
        .await;
        // ...and the rest outside it: the chain is read again at each poll.
        let (first, later, own) = inner.await;
        assert_eq!(first.as_deref(), Some("c:a"));
        assert_eq!(later, None, "polled outside a's scope now");
        assert_eq!(own.as_deref(), Some("c:b"));
    }

    #[tokio::test]
    async fn a_scope_whose_future_panics_leaves_the_chain_as_it_was() {
        use futures::FutureExt;
        let outer = in_scope(arc("c"), arc("ka"), arc("c:a"), async {
            let caught =
                std::panic::AssertUnwindSafe(in_scope(arc("c"), arc("kb"), arc("c:b"), async {
                    panic!("the body panics")
                }))
                .catch_unwind()
                .await;
            (caught.is_err(), scoped("c", "ka"), scoped("c", "kb"))
        });
        let (panicked, a, b) = outer.await;
        assert!(panicked);
        assert_eq!(a.as_deref(), Some("c:a"), "the enclosing scope is back");
        assert_eq!(b, None, "the panicked scope is gone");
        assert!(scoped("c", "ka").is_none());
    }

    #[test]
    fn a_scope_polled_outside_any_runtime_still_nests() {
        let inner = in_scope(arc("c"), arc("kb"), arc("c:b"), async {
            (scoped("c", "ka"), scoped("c", "kb"))
        });
        let (a, b) = futures::executor::block_on(in_scope(arc("c"), arc("ka"), arc("c:a"), inner));
        assert_eq!(a.as_deref(), Some("c:a"));
        assert_eq!(b.as_deref(), Some("c:b"));
        assert!(scoped("c", "ka").is_none(), "restored after the poll");
    }

    #[tokio::test]
    async fn two_futures_of_one_task_are_not_in_each_others_scope() {
        let (a, b) = tokio::join!(
            in_scope(arc("c"), arc("k"), arc("c:1"), async {
                tokio::task::yield_now().await;
                scoped("c", "k")
            }),
            async {
                tokio::task::yield_now().await;
                scoped("c", "k")
            }
        );
        assert_eq!(a.as_deref(), Some("c:1"));
        assert_eq!(b, None);
    }

    static LOCK_HOLDS: crate::hold::HoldKind = crate::hold::HoldKind {
        kind: Kind::Lock,
        release: &lockkit_protocol::lock::RELEASE,
        renew: &lockkit_protocol::lock::RENEW,
    };

    /// A granted watchdog-mode hold `seq` of lock `k` as `owner`, live for a minute.
    fn hold(seq: u64, owner: &str) -> Arc<Hold> {
        let keys = match lockkit_protocol::keys::Namespace::default().object(Kind::Lock, "k") {
            Ok(keys) => Arc::new(keys),
            Err(err) => panic!("keys: {err}"),
        };
        let hold = Hold::new(
            seq,
            arc("k"),
            &LOCK_HOLDS,
            keys,
            format!("#{seq}"),
            Some(arc(owner)),
            std::time::Duration::from_secs(60),
            true,
        );
        hold.confirmed_at(tokio::time::Instant::now());
        hold.granted();
        Arc::new(hold)
    }

    #[tokio::test]
    async fn taken_holds_are_per_task_and_forgotten_on_removal() {
        let taken = Arc::new(Taken::default());
        let held = hold(1, "c:1");
        let key = held.key().to_owned();
        taken.insert(Taker::current(), &held);
        assert!(taken.current_holds(&key));
        assert!(!taken.current_holds("another key"));
        assert_eq!(taken.current_owners(&key), vec![arc("c:1")]);
        let elsewhere = Arc::clone(&taken);
        let probe = key.clone();
        let other = tokio::spawn(async move { elsewhere.current_holds(&probe) })
            .await
            .unwrap_or(true);
        assert!(!other, "another task took nothing");
        taken.remove(Taker::current(), 1);
        assert!(!taken.current_holds(&key));
    }

    /// A hold known lost cannot keep its task waiting: no self-wait. Its owner is still one of
    /// the task's (`hold_count` asks Redis, which knows whether it is gone).
    #[tokio::test]
    async fn a_hold_known_lost_is_no_self_wait() {
        let taken = Taken::default();
        let held = hold(1, "c:1");
        let key = held.key().to_owned();
        taken.insert(Taker::current(), &held);
        assert!(taken.current_holds(&key));
        held.mark_lost("the test");
        assert!(!taken.current_holds(&key));
        assert_eq!(taken.current_owners(&key), vec![arc("c:1")]);
    }
}
