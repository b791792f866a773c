//! [`SpinLock`]: a plain, non-reentrant lock (`SET NX PX`) that waits by backoff instead of pub/sub.

use crate::client::Client;
use crate::object::Object;
use lockkit_protocol::keys::Kind;

/// A plain, non-reentrant lock (`SET NX PX`) that waits by backoff instead of pub/sub.
#[derive(Clone, Debug)]
pub struct SpinLock {
    object: Object,
}

impl SpinLock {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::SpinLock, name),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }
}
