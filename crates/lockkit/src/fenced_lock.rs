//! [`FencedLock`]: a reentrant lock whose acquisitions carry strictly increasing fencing tokens.

use crate::client::Client;
use crate::object::Object;
use lockkit_protocol::keys::Kind;

/// A reentrant lock whose acquisitions carry strictly increasing fencing tokens.
#[derive(Clone, Debug)]
pub struct FencedLock {
    object: Object,
}

impl FencedLock {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::FencedLock, name),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }
}
