//! The replica acknowledgement policy: after an acquire, `WAIT` until enough replicas have the
//! write, or give the hold back.
//!
//! Redis replicates asynchronously: a primary answers an acquire before any replica has it, and a
//! failover in that window promotes a replica that never saw the lock. With a policy set
//! ([`ClientBuilder::replica_ack`](crate::ClientBuilder::replica_ack)), every acquire is followed
//! by `WAIT <k> <timeout>` on the node that owns the object's key. All of one client's commands
//! to a node share one multiplexed connection, and `WAIT` counts the replicas that acknowledged
//! every earlier write of *that connection*, so it covers the acquire script that just ran.

use std::time::Duration;

use fred::interfaces::ClientLike;
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit_protocol::slot::key_slot;

use crate::error::{redis, Error};
use crate::exec::Exec;

/// How many replicas must have an acquisition before it counts as held.
///
/// Set with [`ClientBuilder::replica_ack`](crate::ClientBuilder::replica_ack); the default is
/// [`ReplicaAck::None`]. See
/// [`docs/topologies.md`](https://github.com/lockkit-rs/lockkit/blob/main/docs/topologies.md) for
/// what it buys and what it costs.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// use lockkit::{Client, Error, ReplicaAck};
///
/// let client = Client::builder()
///     .url("redis-sentinel://10.0.0.5:26379/0?sentinelServiceName=locks")
///     // An acquisition counts only once a replica has it too (within 50 ms), so a failover
///     // right after it does not lose it.
///     .replica_ack(ReplicaAck::AtLeast(1), Duration::from_millis(50))
///     .build()
///     .await?;
/// match client.lock("order:42").try_lock(Duration::from_secs(5), None).await {
///     Ok(Some(guard)) => {
///         // ... the critical section ...
///         guard.unlock().await?;
///     }
///     Ok(None) => println!("another instance holds it"),
///     // Replication lagged: the hold was given back, nothing is held. Try again later.
///     Err(Error::NotReplicated { acknowledged, required, .. }) => {
///         println!("only {acknowledged} of {required} replica(s) acknowledged in time")
///     }
///     Err(err) => return Err(err),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum ReplicaAck {
    /// No waiting: an acquisition counts once the primary has it (Redis's asynchronous
    /// replication; the default, and no extra round trip).
    #[default]
    None,
    /// At least this many replicas must acknowledge the acquisition (`WAIT n`). `AtLeast(0)` is
    /// the same as [`ReplicaAck::None`].
    AtLeast(u32),
    /// Every replica connected to the key's primary at acquire time, as listed by `ROLE` there
    /// (one more round trip per acquisition). With no replica connected nothing is waited for:
    /// there is then also no replica a failover could promote.
    All,
}

/// The policy with its timeout, as stored in the client's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaPolicy {
    pub(crate) ack: ReplicaAck,
    pub(crate) timeout: Duration,
}

impl ReplicaPolicy {
    /// The policy, or `None` when it asks for no waiting.
    pub(crate) fn new(ack: ReplicaAck, timeout: Duration) -> Option<Self> {
        match ack {
            ReplicaAck::None | ReplicaAck::AtLeast(0) => None,
            ReplicaAck::AtLeast(_) | ReplicaAck::All => Some(Self { ack, timeout }),
        }
    }
}

/// The outcome of one `WAIT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acknowledged {
    /// Replicas that acknowledged the write.
    pub(crate) acknowledged: u32,
    /// Replicas the policy required.
    pub(crate) required: u32,
}

impl Acknowledged {
    pub(crate) fn is_met(self) -> bool {
        self.acknowledged >= self.required
    }
}

/// Waits until the replicas that `policy` requires acknowledged every earlier write of this
/// client on the node that owns `key`, or `policy.timeout` passes.
pub(crate) async fn wait_for_replicas(
    exec: &Exec,
    key: &str,
    policy: ReplicaPolicy,
) -> Result<Acknowledged, Error> {
    let route = ClusterHash::Custom(key_slot(key));
    let required = match policy.ack {
        ReplicaAck::None => {
            return Ok(Acknowledged {
                acknowledged: 0,
                required: 0,
            })
        }
        ReplicaAck::AtLeast(n) => n,
        ReplicaAck::All => connected_replicas(exec, &route).await?,
    };
    if required == 0 {
        return Ok(Acknowledged {
            acknowledged: 0,
            required: 0,
        });
    }
    // WAIT's timeout is in milliseconds, 0 meaning "forever": never send 0.
    let timeout_ms = policy.timeout.as_millis().clamp(1, i64::MAX as u128) as i64;
    let wait = CustomCommand::new_static("WAIT", route, true);
    let reply: i64 = exec
        .redis()
        .custom(
            wait,
            vec![Value::from(i64::from(required)), Value::from(timeout_ms)],
        )
        .await
        .map_err(redis("replica_wait"))?;
    let acknowledged = u32::try_from(reply.max(0)).unwrap_or(u32::MAX);
    tracing::trace!(acknowledged, required, key, "WAIT answered");
    Ok(Acknowledged {
        acknowledged,
        required,
    })
}

/// The number of replicas connected to the node at `route`, from `ROLE`
/// (`["master", offset, [[ip, port, offset], ...]]`).
async fn connected_replicas(exec: &Exec, route: &ClusterHash) -> Result<u32, Error> {
    let role = CustomCommand::new_static("ROLE", route.clone(), false);
    let reply: Value = exec
        .redis()
        .custom(role, Vec::<Value>::new())
        .await
        .map_err(redis("replica_role"))?;
    let Value::Array(parts) = reply else {
        return Err(role_error("not an array"));
    };
    match parts.first().and_then(Value::as_str).as_deref() {
        Some("master") => {}
        Some(other) => {
            return Err(role_error(&format!(
                "the key's node is a {other}, not a primary"
            )))
        }
        None => return Err(role_error("no role")),
    }
    match parts.get(2) {
        Some(Value::Array(replicas)) => Ok(u32::try_from(replicas.len()).unwrap_or(u32::MAX)),
        _ => Err(role_error("no replica list")),
    }
}

fn role_error(what: &str) -> Error {
    Error::Redis(crate::error::RedisError::new(
        "replica_role",
        fred::error::Error::new(
            fred::error::ErrorKind::Protocol,
            format!("unexpected ROLE reply: {what}"),
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_policy_means_no_wait() {
        let t = Duration::from_secs(1);
        assert_eq!(ReplicaPolicy::new(ReplicaAck::None, t), None);
        assert_eq!(ReplicaPolicy::new(ReplicaAck::AtLeast(0), t), None);
        assert!(ReplicaPolicy::new(ReplicaAck::AtLeast(1), t).is_some());
        assert!(ReplicaPolicy::new(ReplicaAck::All, t).is_some());
    }

    #[test]
    fn met_when_enough_acknowledged() {
        let ack = |acknowledged, required| Acknowledged {
            acknowledged,
            required,
        };
        assert!(ack(1, 1).is_met());
        assert!(ack(2, 1).is_met());
        assert!(!ack(0, 1).is_met());
    }
}
