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
//! | `p:<id>` | the lock is reserved for the waiter with this id (a multi-lock member) for the handoff window: its client wakes it |
//! | `taken`  | the waiter a lock was reserved for took it: nobody else need try (no script sends it since the direct grant; still understood) |
//! | `g:<count>:<token>:<now>:<expiry>:<id>` | the lock **is granted** to the waiter with this id (its hold marker): it holds it now, with `count` holds, fencing token `token` (0: none), granted at server time `now` until server time `expiry` (Unix ms) |
//!
//! A lock's and fenced lock's messages (`g:`, `p:`) go to the waiting client's own channel, so
//! only that client hears them. One message may carry several payloads, one per line
//! ([`Wake::decode_all`]): a release that grants several calls of one client tells it once.
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
    /// The lock is reserved for the waiter with this id (a multi-lock member, for the handoff
    /// window): wake it if it is among them; else wake one waiter once the window has passed,
    /// unless a newer message comes first. Sent only to the reserved waiter's own client.
    Prefer(String),
    /// The reserved waiter took the lock: wake nobody, and cancel the pending wake-up a
    /// [`Prefer`](Wake::Prefer) naming another waiter armed. No script sends it since the direct
    /// grant (reservations are announced to the reserved waiter's client only); still decoded.
    Taken,
    /// The lock is granted to the waiter with this id (a hold marker): it owns it now.
    Grant {
        /// The waiter's id: the hold marker of its acquire call.
        waiter: String,
        /// What it was granted.
        grant: Grant,
    },
}

/// A lock granted to a waiting acquire call by the release that freed it (direct grant, see
/// [`crate::lock`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// The owner's hold count with this hold.
    pub hold_count: u32,
    /// The hold's fencing token (fenced locks only).
    pub token: Option<u64>,
    /// The server's clock when the grant was made (Unix ms).
    pub now_ms: u64,
    /// When the granted hold expires unless renewed, by the server's clock (Unix ms).
    pub expiry_ms: u64,
}

impl Grant {
    /// Reads `<count>:<token>:<now>:<expiry>:<id>` back; `None` when it is not one.
    fn decode(text: &str) -> Option<(Grant, String)> {
        let mut parts = text.splitn(5, ':');
        let hold_count: u32 = parts.next()?.parse().ok()?;
        let token: u64 = parts.next()?.parse().ok()?;
        let now_ms: u64 = parts.next()?.parse().ok()?;
        let expiry_ms: u64 = parts.next()?.parse().ok()?;
        let waiter = parts.next()?;
        if hold_count == 0 || waiter.is_empty() {
            return None;
        }
        let grant = Grant {
            hold_count,
            token: (token > 0).then_some(token),
            now_ms,
            expiry_ms,
        };
        Some((grant, waiter.to_owned()))
    }
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
                if let Some((grant, waiter)) = payload.strip_prefix("g:").and_then(Grant::decode) {
                    return Wake::Grant { waiter, grant };
                }
                Wake::One
            }
        }
    }

    /// Decodes a message that may carry several payloads, one per line: a release that grants
    /// several calls of one client (readers at the head of a read-write lock's line, a
    /// semaphore's freed permits) tells that client once, with every grant in the message.
    ///
    /// ```
    /// use lockkit_protocol::wake::Wake;
    /// let wakes = Wake::decode_all("g:1:0:10:20:#a:1\ng:2:0:10:20:#a:2");
    /// assert_eq!(wakes.len(), 2);
    /// assert!(matches!(&wakes[1], Wake::Grant { waiter, .. } if waiter == "#a:2"));
    /// assert_eq!(Wake::decode_all("one"), vec![Wake::One]);
    /// ```
    pub fn decode_all(message: &str) -> Vec<Wake> {
        message.split('\n').map(Wake::decode).collect()
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
            Wake::Grant { waiter, grant } => format!(
                "g:{}:{}:{}:{}:{waiter}",
                grant.hold_count,
                grant.token.unwrap_or(0),
                grant.now_ms,
                grant.expiry_ms
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Grant, Wake};

    #[test]
    fn round_trips() {
        for wake in [
            Wake::One,
            Wake::All,
            Wake::Many(7),
            Wake::Waiter("c1:9".into()),
            Wake::Prefer("c1:ThreadId(3)".into()),
            Wake::Taken,
            Wake::Grant {
                waiter: "#c1:4".into(),
                grant: Grant {
                    hold_count: 1,
                    token: Some(9),
                    now_ms: 1_700_000_000_000,
                    expiry_ms: 1_700_000_005_000,
                },
            },
            Wake::Grant {
                waiter: "#c1:5".into(),
                grant: Grant {
                    hold_count: 2,
                    token: None,
                    now_ms: 1,
                    expiry_ms: 2,
                },
            },
        ] {
            assert_eq!(Wake::decode(&wake.encode()), wake);
        }
        // What handoff_lib.lua publishes.
        assert_eq!(
            Wake::decode("g:1:0:10:5010:#ab12:7"),
            Wake::Grant {
                waiter: "#ab12:7".into(),
                grant: Grant {
                    hold_count: 1,
                    token: None,
                    now_ms: 10,
                    expiry_ms: 5010
                }
            }
        );
        // A malformed grant wakes one waiter (which tries, and finds its grant if it has one).
        assert_eq!(Wake::decode("g:1:0:x:5:#a"), Wake::One);
        assert_eq!(Wake::decode("g:0:0:1:5:#a"), Wake::One);
        assert_eq!(Wake::decode("n:x"), Wake::One);
        assert_eq!(Wake::decode("unlocked"), Wake::One);
    }
}
