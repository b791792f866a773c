//! What every primitive's handle has: the client, the object's name and its keys.

use std::sync::Arc;

use lockkit_protocol::keys::{KeyError, Kind, ObjectKeys};

use crate::client::{Client, ClientInner};
use crate::error::Error;

/// The common part of every handle (`Lock`, `Semaphore`, ...). Cheap to clone.
#[derive(Clone)]
pub(crate) struct Object {
    pub(crate) client: Client,
    pub(crate) kind: Kind,
    pub(crate) name: Arc<str>,
    keys: Result<Arc<ObjectKeys>, KeyError>,
}

impl Object {
    /// The object of `kind` called `name`. An invalid name is reported by [`Object::keys`].
    pub(crate) fn new(client: Client, kind: Kind, name: String) -> Self {
        let keys = client
            .inner
            .settings
            .namespace
            .object(kind, &name)
            .map(Arc::new);
        Self {
            client,
            kind,
            name: name.into(),
            keys,
        }
    }

    /// The client's shared state.
    pub(crate) fn inner(&self) -> &Arc<ClientInner> {
        &self.client.inner
    }

    /// The object's keys, once the client is known to be open and the name valid.
    pub(crate) fn keys(&self) -> Result<&Arc<ObjectKeys>, Error> {
        self.client.inner.check_open()?;
        self.keys.as_ref().map_err(|err| Error::from(err.clone()))
    }
}

impl std::fmt::Debug for Object {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(self.kind.describe())
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}
