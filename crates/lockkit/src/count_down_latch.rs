//! [`CountDownLatch`]: a count-down latch.

use crate::client::Client;
use crate::object::Object;
use lockkit_protocol::keys::Kind;

/// A count-down latch.
#[derive(Clone, Debug)]
pub struct CountDownLatch {
    object: Object,
}

impl CountDownLatch {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::CountDownLatch, name),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }
}
