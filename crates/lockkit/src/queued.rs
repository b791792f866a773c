//! A waiter's entry in Redis, and leaving it when the wait ends.
//!
//! A waiter of a fair lock stands in its queue, a waiter of a lock or fenced lock in its waiting
//! set; releases reserve the lock for (or name) those entries. So an entry must go the moment its
//! wait ends without the lock — the wait timed out, the acquire future was dropped, the client
//! shut down — or releases would keep the lock for a waiter that is no longer there. A
//! [`Queued`] is part of one acquire call: set before an attempt that may join the entry is sent,
//! cleared when a grant (which takes the entry out in the same script) is seen. Dropped while set,
//! it runs the kind's cancel script in the background, on the client's runtime (also when it is
//! dropped outside any runtime). Should that fail (Redis unreachable, the client's runtime gone),
//! the entry's keep-alive deadline runs out on its own and the next script drops it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::script::Script;
use lockkit_protocol::DecodeError;

use crate::core::ClientInner;
use crate::exec::Resend;

/// How a kind leaves its waiting structure: the cancel script, the keys it takes and its reply
/// decoder. The script's ARGV are the entry's id, the release channel and the sharded flag; its
/// reply says whether the entry was there.
#[derive(Debug)]
pub(crate) struct Leave {
    pub(crate) script: &'static Script,
    pub(crate) keys: fn(&ObjectKeys) -> Vec<&str>,
    pub(crate) decode: fn(&[i64]) -> Result<bool, DecodeError>,
}

/// One acquire call's entry in the waiting structure of an object (see the module docs).
pub(crate) struct Queued<'a> {
    client: &'a Arc<ClientInner>,
    kind: Kind,
    name: &'a Arc<str>,
    keys: &'a Arc<ObjectKeys>,
    leave: &'static Leave,
    /// The id the entry is filed under (a fair lock's waiter id, a lock's owner id).
    id: String,
    /// A key of the caller's own, passed after the kind's keys (a rate limiter's per-client
    /// schedule).
    own_key: Option<Arc<str>>,
    /// Whether the entry may be in Redis.
    joined: AtomicBool,
}

impl<'a> Queued<'a> {
    pub(crate) fn new(
        client: &'a Arc<ClientInner>,
        kind: Kind,
        name: &'a Arc<str>,
        keys: &'a Arc<ObjectKeys>,
        leave: &'static Leave,
        id: String,
    ) -> Self {
        Self {
            client,
            kind,
            name,
            keys,
            leave,
            id,
            own_key: None,
            joined: AtomicBool::new(false),
        }
    }

    /// The same, with a key of the caller's own passed to the leave script after the kind's.
    pub(crate) fn with_own_key(mut self, key: Arc<str>) -> Self {
        self.own_key = Some(key);
        self
    }

    /// The entry's id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// An attempt that may join the entry is about to be sent.
    pub(crate) fn joining(&self) {
        self.joined.store(true, Ordering::Release);
    }

    /// A grant was seen: the script that granted took the entry out.
    pub(crate) fn granted(&self) {
        self.joined.store(false, Ordering::Release);
    }
}

impl Queued<'_> {
    /// Leaves now, and waits for it (nothing to do when no attempt may have joined): the entry goes, and whatever a release gave it (a grant it
    /// did not claim, a reservation) goes on to the next waiter. The entry may join again with
    /// the next attempt. Errors are only logged: an entry that could not leave runs out after
    /// its keep-alive.
    pub(crate) async fn leave_now(&self) {
        if !self.joined.swap(false, Ordering::AcqRel) {
            return;
        }
        leave(
            Arc::clone(self.client),
            self.kind,
            Arc::clone(self.name),
            Arc::clone(self.keys),
            self.leave,
            self.id.clone(),
            self.own_key.clone(),
        )
        .await;
    }
}

/// Runs the kind's leave script for the entry `id`, logging the outcome.
async fn leave(
    client: Arc<ClientInner>,
    kind: Kind,
    name: Arc<str>,
    keys: Arc<ObjectKeys>,
    leave: &'static Leave,
    id: String,
    own_key: Option<Arc<str>>,
) {
    let mut key_refs = (leave.keys)(&keys);
    key_refs.extend(own_key.as_deref());
    let mut args = vec![id.as_str(), &keys.channel, client.exec.publish_flag()];
    // A fenced lock's leaving waiter may hand on a grant, minting the next waiter's token.
    args.extend(client.exec.counter_ttl_arg(kind));
    let result = client
        .exec
        .ints(leave.script, kind, &key_refs, &args, Resend::Allowed)
        .await
        .and_then(|reply| Ok((leave.decode)(&reply)?));
    match result {
        Ok(removed) => tracing::debug!(
            kind = kind.segment(),
            %name,
            waiter = %id,
            removed,
            "a waiter that gave up left"
        ),
        Err(err) => tracing::debug!(
            kind = kind.segment(),
            %name,
            waiter = %id,
            "a waiter that gave up could not leave; its entry runs out on its own: {}",
            crate::error::Chain(&err)
        ),
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        if !*self.joined.get_mut() {
            return;
        }
        // Gave up (timed out, cancelled, failed, shut down) while waiting: leave in the
        // background, through the client's runtime, not the caller's: the future may be dropped
        // outside any runtime (on a plain thread), and an entry left behind would be granted the
        // lock (a lock's) or named next (a fair lock's) until its keep-alive ran out.
        let runtime = self.client.hub.runtime().clone();
        let client = Arc::clone(self.client);
        let keys = Arc::clone(self.keys);
        let name = Arc::clone(self.name);
        let (kind, leave_as, id) = (self.kind, self.leave, std::mem::take(&mut self.id));
        let own_key = self.own_key.take();
        runtime.spawn(leave(client, kind, name, keys, leave_as, id, own_key));
    }
}
