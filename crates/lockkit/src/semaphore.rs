//! [`Semaphore`]: a counting semaphore whose permits are leased.

use crate::client::Client;
use crate::object::Object;
use lockkit_protocol::keys::Kind;

/// A counting semaphore whose permits are leased.
#[derive(Clone, Debug)]
pub struct Semaphore {
    object: Object,
}

impl Semaphore {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::Semaphore, name),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }
}

/// A held permit (work in progress).
#[derive(Debug)]
pub struct SemaphorePermit {
    _private: (),
}
