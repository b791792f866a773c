//! What every primitive's handle has: the client, the object's name and its keys.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use futures::TryFutureExt;
use lockkit_protocol::script::Script;
use lockkit_protocol::DecodeError;

use lockkit_protocol::keys::{KeyError, Kind, ObjectKeys};

use crate::core::ClientInner;
use crate::error::{command_error, Error};
use crate::exec::Resend;

/// The common part of every handle (`Lock`, `Semaphore`, ...). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Object {
    pub(crate) client: Arc<ClientInner>,
    pub(crate) kind: Kind,
    pub(crate) name: Arc<str>,
    keys: Result<Arc<ObjectKeys>, KeyError>,
}

impl Object {
    /// The object of `kind` called `name`. An invalid name is reported by [`Object::keys`].
    pub(crate) fn new(client: Arc<ClientInner>, kind: Kind, name: String) -> Self {
        let keys = client.settings.namespace.object(kind, &name).map(Arc::new);
        Self {
            client,
            kind,
            name: name.into(),
            keys,
        }
    }

    /// The client's shared state.
    pub(crate) fn inner(&self) -> &Arc<ClientInner> {
        &self.client
    }

    /// The object's keys, once the client is known to be open and the name valid.
    pub(crate) fn keys(&self) -> Result<&Arc<ObjectKeys>, Error> {
        self.client.check_open()?;
        self.keys.as_ref().map_err(|err| Error::from(err.clone()))
    }
}

/// Inspection and administration shared by the primitives whose state lives in the main key.
impl Object {
    /// Whether the main key exists (the object is held / set): a lock kind's `is_locked`.
    pub(crate) async fn exists(&self) -> Result<bool, Error> {
        let keys = self.keys()?;
        let exec = &self.inner().exec;
        let exists = exec.redis().exists::<i64, _>(keys.key.as_str());
        let exists = exists.map_err(command_error("is_locked", &keys.key, self.kind));
        Ok(exec.command("is_locked", &self.name, exists).await? > 0)
    }

    /// The hold count of the calling context in the main HASH of a reentrant lock: the owners'
    /// reentrant counts (every live hold of the enclosing scope's owner, or of the owners of holds
    /// the calling task took and has not released, whoever made them), added up (see
    /// `ClientInner::current_owners`).
    pub(crate) async fn hold_count(&self) -> Result<u32, Error> {
        let keys = self.keys()?;
        let owners = self.inner().current_owners(&keys.key);
        let owner_refs: Vec<&str> = owners.iter().map(|owner| &**owner).collect();
        self.hold_count_of(&owner_refs).await
    }

    /// The live holds of `owners` in the main HASH of a reentrant lock, added up.
    pub(crate) async fn hold_count_of(&self, owners: &[&str]) -> Result<u32, Error> {
        let keys = self.keys()?;
        // Sent even without an owner to count: a key of another type is reported.
        let reply = self
            .inner()
            .exec
            .ints(
                &lockkit_protocol::lock::HOLD_COUNT,
                self.kind,
                &[keys.key.as_str()],
                owners,
                Resend::Allowed,
            )
            .await?;
        Ok(lockkit_protocol::lock::decode_hold_count(&reply)?)
    }

    /// The main key's remaining TTL: `None` when it does not exist, `Some(Duration::MAX)` when it
    /// has no expiry.
    pub(crate) async fn remaining_ttl(&self) -> Result<Option<Duration>, Error> {
        let keys = self.keys()?;
        let exec = &self.inner().exec;
        let pttl = exec.redis().pttl::<i64, _>(keys.key.as_str());
        let pttl = pttl.map_err(command_error("remaining_ttl", &keys.key, self.kind));
        Ok(
            match exec.command("remaining_ttl", &self.name, pttl).await? {
                -2 => None,
                -1 => Some(Duration::MAX),
                ms => Some(Duration::from_millis(ms.unsigned_abs())),
            },
        )
    }

    /// Runs the kind's force-unlock `script` (KEYS = every key of the object; ARGV = channel,
    /// sharded flag) and decodes its `{1}`/`{0}` reply with `decode`: whether the object was held.
    pub(crate) async fn force_unlock(
        &self,
        script: &'static Script,
        decode: fn(&[i64]) -> Result<bool, DecodeError>,
    ) -> Result<bool, Error> {
        let keys = self.keys()?;
        let key_refs: Vec<&str> = keys.keys.iter().map(String::as_str).collect();
        let exec = &self.inner().exec;
        let mut args = vec![keys.channel.as_str(), exec.publish_flag()];
        // A fenced lock's force-unlock may grant the lock to a waiter, minting its token.
        args.extend(exec.counter_ttl_arg(self.kind));
        let reply = exec
            .ints(script, self.kind, &key_refs, &args, Resend::Never)
            .await?;
        Ok(decode(&reply)?)
    }
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(self.kind.describe())
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
