//! [`ReadWriteLock`]: a reentrant read-write lock: many readers or one writer.

use crate::client::Client;
use crate::object::Object;
use lockkit_protocol::keys::Kind;

/// A reentrant read-write lock: many readers or one writer.
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    object: Object,
}

impl ReadWriteLock {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::ReadWriteLock, name),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }
}
