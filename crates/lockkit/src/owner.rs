//! Owners and scopes: who holds a hold, and where re-entry happens.
//!
//! Implementation notes for maintainers:
//!
//! - **A plain acquire is an owner of its own.** Its owner id is `<client id>:<sequence>`, fresh
//!   for every `lock()` / `try_lock()` / `lock_with_lease()` call made outside a scope. Two
//!   futures of one task (`join!`, `join_all`, `select!`) or a dispatcher that moves its guards
//!   into spawned workers therefore never share an owner: the second acquire waits, as with
//!   `tokio::sync::Mutex`. (The first version used the tokio task as the owner, and let both in.)
//! - **Re-entry happens inside a holder's scope.** [`in_scope`] runs a future with a task-local
//!   frame that names the holder's client, object key and owner id. An acquire of the same object
//!   through the same client made while that future (or anything it awaits) is polled finds the
//!   frame and acquires as that owner, so the script re-enters and counts a hold. Frames nest
//!   (a scope inside a scope of another lock keeps both). `tokio::spawn` does not carry
//!   task-locals, so a future spawned from inside a scope is outside it.
//! - **Holds taken per task.** [`Taken`] remembers, per tokio task (per thread outside a task),
//!   the lock holds that task acquired and has not released, whatever task their guards moved
//!   to. It serves two things: the self-wait warning (a task about to wait for a lock it holds
//!   itself is the likely self-deadlock) and `hold_count()` outside a scope.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use parking_lot::Mutex;

tokio::task_local! {
    /// The innermost holder's scope of the running future, if any.
    static SCOPE: Arc<Frame>;
}

/// One holder's scope.
pub(crate) struct Frame {
    /// The id of the client the hold was taken through.
    client_id: Arc<str>,
    /// The object's main key.
    key: Arc<str>,
    /// The holder's owner id.
    owner: Arc<str>,
    /// The enclosing scope.
    parent: Option<Arc<Frame>>,
}

impl Frame {
    fn find(&self, client_id: &str, key: &str) -> Option<Arc<str>> {
        let mut frame = Some(self);
        while let Some(here) = frame {
            if &*here.key == key && &*here.client_id == client_id {
                return Some(Arc::clone(&here.owner));
            }
            frame = here.parent.as_deref();
        }
        None
    }
}

/// The owner of the innermost enclosing scope of `key` through the client `client_id`.
pub(crate) fn scoped(client_id: &str, key: &str) -> Option<Arc<str>> {
    SCOPE
        .try_with(|frame| frame.find(client_id, key))
        .ok()
        .flatten()
}

/// Runs `fut` inside the scope of `owner`'s hold on `key` through the client `client_id`.
///
/// A plain function returning tokio's task-local future, not an `async fn`: an `async fn` would
/// keep `fut` twice in its state (the argument and the awaited future), and nested scopes would
/// multiply the size of the caller's future.
pub(crate) fn in_scope<F: Future>(
    client_id: Arc<str>,
    key: Arc<str>,
    owner: Arc<str>,
    fut: F,
) -> tokio::task::futures::TaskLocalFuture<Arc<Frame>, F> {
    let parent = SCOPE.try_with(Arc::clone).ok();
    let frame = Frame {
        client_id,
        key,
        owner,
        parent,
    };
    SCOPE.scope(Arc::new(frame), fut)
}

/// Whether holds of `kind` have owners that can wait for themselves: the lock kinds.
pub(crate) fn is_lock_kind(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Lock | Kind::FencedLock | Kind::FairLock | Kind::ReadWriteLock | Kind::SpinLock
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
    seq: u64,
    keys: Arc<ObjectKeys>,
    owner: Option<Arc<str>>,
}

/// The lock holds each task took and has not released (see the module notes). Kept per taker
/// in a short list (a task holds few locks at once), so recording a grant and forgetting it
/// clone two `Arc`s and allocate nothing per object key.
#[derive(Debug, Default)]
pub(crate) struct Taken {
    holds: Mutex<HashMap<Taker, Vec<TakenHold>>>,
}

impl Taken {
    /// Records that `taker` took hold `seq` of the object at `keys` as `owner`.
    pub(crate) fn insert(
        &self,
        taker: Taker,
        keys: &Arc<ObjectKeys>,
        seq: u64,
        owner: Option<Arc<str>>,
    ) {
        self.holds.lock().entry(taker).or_default().push(TakenHold {
            seq,
            keys: Arc::clone(keys),
            owner,
        });
    }

    /// Forgets hold `seq` (released, or its guard dropped).
    pub(crate) fn remove(&self, taker: Taker, seq: u64) {
        let mut holds = self.holds.lock();
        if let Some(list) = holds.get_mut(&taker) {
            list.retain(|hold| hold.seq != seq);
            if list.is_empty() {
                holds.remove(&taker);
            }
        }
    }

    /// Whether the calling task took a hold of the object at `key` that is not released yet.
    pub(crate) fn current_holds(&self, key: &str) -> bool {
        self.holds
            .lock()
            .get(&Taker::current())
            .is_some_and(|list| list.iter().any(|hold| hold.keys.key == key))
    }

    /// The distinct owners of the holds of `key` the calling task took and has not released.
    pub(crate) fn current_owners(&self, key: &str) -> Vec<Arc<str>> {
        let holds = self.holds.lock();
        let mut owners: Vec<Arc<str>> = Vec::new();
        if let Some(list) = holds.get(&Taker::current()) {
            let of_key = list.iter().filter(|hold| hold.keys.key == key);
            for owner in of_key.filter_map(|hold| hold.owner.as_ref()) {
                if !owners.contains(owner) {
                    owners.push(Arc::clone(owner));
                }
            }
        }
        owners
    }

    /// Logs the self-wait warning when the calling task is about to wait for `key`, a lock it
    /// took itself and has not released.
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

    #[tokio::test]
    async fn taken_holds_are_per_task_and_forgotten_on_removal() {
        let taken = Arc::new(Taken::default());
        let keys = match lockkit_protocol::keys::Namespace::default().object(Kind::Lock, "k") {
            Ok(keys) => Arc::new(keys),
            Err(err) => panic!("keys: {err}"),
        };
        let key = keys.key.clone();
        taken.insert(Taker::current(), &keys, 1, Some(arc("c:1")));
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
}
