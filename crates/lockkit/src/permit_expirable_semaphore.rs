//! [`PermitExpirableSemaphore`]: a semaphore whose permits have ids and leases of their own.

use crate::client::Client;
use crate::object::Object;
use lockkit_protocol::keys::Kind;

/// A semaphore whose permits have ids and leases of their own.
#[derive(Clone, Debug)]
pub struct PermitExpirableSemaphore {
    object: Object,
}

impl PermitExpirableSemaphore {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::PermitExpirableSemaphore, name),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }
}

/// A held permit (work in progress).
#[derive(Debug)]
pub struct ExpirablePermit {
    _private: (),
}
