//! [`FairLock`]: a reentrant lock granted in request order (FIFO) across clients.

use crate::client::Client;
use crate::object::Object;
use lockkit_protocol::keys::Kind;

/// A reentrant lock granted in request order (FIFO) across clients.
#[derive(Clone, Debug)]
pub struct FairLock {
    object: Object,
}

impl FairLock {
    pub(crate) fn new(client: Client, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::FairLock, name),
        }
    }

    /// The object's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }
}
