//! What a release message says: whom to wake.
//!
//! Scripts publish one of these payloads on an object's channel; every client subscribed to it
//! decodes the payload and wakes that many of its **own** waiters (or the one waiter named).
//!
//! | payload  | meaning |
//! |----------|---------|
//! | `one`    | one waiter may proceed (a lock was freed) |
//! | `n:<k>`  | up to `k` waiters may proceed (`k` permits came back) |
//! | `all`    | every waiter should re-check (a latch reached zero, a mode changed) |
//! | `w:<id>` | the waiter with this id is next (fair lock); nobody else |
//! | `p:<id>` | the lock is reserved for the waiter with this id for the handoff window: its client wakes it; every other client wakes one waiter only if the window passes without a `taken` |
//! | `taken`  | the waiter a lock was reserved for took it: nobody else need try |
//!
//! An unknown payload wakes one waiter: waking too many only costs a retry, waking nobody could
//! cost a whole lease.

/// A decoded release message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// Wake one waiter.
    One,
    /// Wake up to this many waiters.
    Many(u32),
    /// Wake every waiter.
    All,
    /// Wake only the waiter with this id.
    Waiter(String),
    /// The lock is reserved for the waiter with this id (for the handoff window): wake it if it
    /// is among them; else wake one waiter once the window has passed, unless
    /// [`Taken`](Wake::Taken) comes first (a reserved waiter whose client died costs one window).
    Prefer(String),
    /// The reserved waiter took the lock: wake nobody, and cancel the pending wake-up a
    /// [`Prefer`](Wake::Prefer) naming another client's waiter armed.
    Taken,
}

impl Wake {
    /// Decodes a payload.
    ///
    /// ```
    /// use lockkit_protocol::wake::Wake;
    /// assert_eq!(Wake::decode("n:3"), Wake::Many(3));
    /// assert_eq!(Wake::decode("w:abc"), Wake::Waiter("abc".into()));
    /// assert_eq!(Wake::decode("garbage"), Wake::One);
    /// ```
    pub fn decode(payload: &str) -> Wake {
        match payload {
            "one" => Wake::One,
            "all" => Wake::All,
            "taken" => Wake::Taken,
            _ => {
                if let Some(count) = payload.strip_prefix("n:") {
                    return count.parse().map_or(Wake::One, Wake::Many);
                }
                if let Some(id) = payload.strip_prefix("w:") {
                    return Wake::Waiter(id.to_owned());
                }
                if let Some(id) = payload.strip_prefix("p:") {
                    return Wake::Prefer(id.to_owned());
                }
                Wake::One
            }
        }
    }

    /// Encodes a payload (scripts build the same strings in Lua).
    pub fn encode(&self) -> String {
        match self {
            Wake::One => "one".to_owned(),
            Wake::All => "all".to_owned(),
            Wake::Many(count) => format!("n:{count}"),
            Wake::Waiter(id) => format!("w:{id}"),
            Wake::Prefer(id) => format!("p:{id}"),
            Wake::Taken => "taken".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Wake;

    #[test]
    fn round_trips() {
        for wake in [
            Wake::One,
            Wake::All,
            Wake::Many(7),
            Wake::Waiter("c1:9".into()),
            Wake::Prefer("c1:ThreadId(3)".into()),
            Wake::Taken,
        ] {
            assert_eq!(Wake::decode(&wake.encode()), wake);
        }
        assert_eq!(Wake::decode("n:x"), Wake::One);
        assert_eq!(Wake::decode("unlocked"), Wake::One);
    }
}
