//! What the server can do, asked once while the client connects, so that a server that lacks
//! what lockkit (or a setting the user chose) needs is refused by
//! [`ClientBuilder::build`](crate::ClientBuilder::build), in one line naming the command, never
//! by the first lock.
//!
//! Managed services block commands (`WAIT` on ElastiCache Serverless, scripting on some
//! offerings, `CONFIG` nearly everywhere), and servers differ (`SSUBSCRIBE` needs Redis 7.0). The
//! probes send the command itself, harmlessly, rather than reading `COMMAND INFO`: a renamed or
//! ACL-blocked command is listed there all the same, and some services block `COMMAND` too.

use fred::interfaces::ClientLike as _;
use fred::prelude::Client as RedisClient;
use fred::types::{ClusterHash, CustomCommand, Value};

use crate::connect::Target;
use crate::core::PubSubMode;
use crate::error::{redis, ConnectFailure, Error};

/// A script that does nothing: sent with `EVAL`, it tells whether the server runs Lua scripts.
const NOOP_SCRIPT: &str = "return 1";

/// Everything the client needs to know about the server before it hands out objects.
pub(crate) struct Probed {
    /// How releases are announced: [`PubSubMode::Auto`] resolved.
    pub(crate) pubsub: PubSubMode,
}

/// Runs every probe: scripting always, `WAIT` when the client has a replica acknowledgement
/// policy, `SSUBSCRIBE` on a cluster unless classic pub/sub was asked for.
pub(crate) async fn probe(
    redis_client: &RedisClient,
    target: &Target,
    mode: PubSubMode,
    clustered: bool,
    needs_wait: bool,
) -> Result<Probed, Error> {
    let (scripting, wait, pubsub) = tokio::join!(
        check_scripting(redis_client, target),
        async {
            if needs_wait {
                check_wait(redis_client, target).await
            } else {
                Ok(())
            }
        },
        resolve_pubsub(redis_client, mode, clustered)
    );
    scripting?;
    wait?;
    Ok(Probed { pubsub: pubsub? })
}

/// Whether `err` is the server's refusal of the command (an error reply: unknown or renamed
/// command, `NOPERM`, a disabled scripting engine), as opposed to a failure to reach it.
fn is_refusal(err: &fred::error::Error) -> bool {
    use fred::error::ErrorKind;
    matches!(
        err.kind(),
        ErrorKind::Unknown | ErrorKind::InvalidCommand | ErrorKind::InvalidArgument
    )
}

/// `EVAL "return 1" 0`: every lockkit primitive is a Lua script.
async fn check_scripting(redis_client: &RedisClient, target: &Target) -> Result<(), Error> {
    let command = CustomCommand::new_static("EVAL", ClusterHash::Random, false);
    match redis_client
        .custom::<Value, _>(command, vec![NOOP_SCRIPT, "0"])
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if is_refusal(&err) => {
            tracing::error!(reply = %err.details(), "the server runs no Lua scripts");
            Err(target.error(ConnectFailure::NoScripting, Some(Box::new(err))))
        }
        Err(err) => Err(redis("probe scripting")(err)),
    }
}

/// `WAIT 0 0` (returns at once): the replica acknowledgement policy runs `WAIT` after every
/// acquire.
async fn check_wait(redis_client: &RedisClient, target: &Target) -> Result<(), Error> {
    let command = CustomCommand::new_static("WAIT", ClusterHash::Random, true);
    match redis_client
        .custom::<Value, _>(command, vec!["0", "0"])
        .await
    {
        Ok(_) => Ok(()),
        Err(err) if is_refusal(&err) => {
            tracing::error!(reply = %err.details(), "the server refuses WAIT");
            Err(target.error(ConnectFailure::NoWait, Some(Box::new(err))))
        }
        Err(err) => Err(redis("probe WAIT")(err)),
    }
}

/// Resolves [`PubSubMode::Auto`] (sharded on a cluster that knows `SSUBSCRIBE`) and checks that
/// an explicit [`PubSubMode::Sharded`] is supported.
async fn resolve_pubsub(
    redis_client: &RedisClient,
    mode: PubSubMode,
    clustered: bool,
) -> Result<PubSubMode, Error> {
    match mode {
        PubSubMode::Classic => Ok(PubSubMode::Classic),
        PubSubMode::Auto if !clustered => Ok(PubSubMode::Classic),
        PubSubMode::Auto | PubSubMode::Sharded => {
            let supported = supports_sharded_pubsub(redis_client).await?;
            match (mode, supported) {
                (_, true) => Ok(PubSubMode::Sharded),
                (PubSubMode::Sharded, false) => Err(Error::InvalidArgument(
                    "PubSubMode::Sharded was asked for, but the server does not know SSUBSCRIBE \
                     (sharded pub/sub needs Redis 7.0 or later); use PubSubMode::Auto or Classic"
                        .into(),
                )),
                _ => {
                    tracing::info!(
                        "the cluster does not support sharded pub/sub; using classic pub/sub"
                    );
                    Ok(PubSubMode::Classic)
                }
            }
        }
    }
}

/// Asks one server whether it knows `SSUBSCRIBE` (`COMMAND INFO` answers nil for an unknown
/// command). On a cluster the servers are assumed to run one version.
async fn supports_sharded_pubsub(redis_client: &RedisClient) -> Result<bool, Error> {
    let command = CustomCommand::new_static("COMMAND", ClusterHash::Random, false);
    let reply: Value = match redis_client
        .custom(command, vec!["INFO", "SSUBSCRIBE"])
        .await
    {
        Ok(reply) => reply,
        // A service that blocks COMMAND: classic pub/sub works everywhere.
        Err(err) if is_refusal(&err) => {
            tracing::info!(reply = %err.details(), "COMMAND INFO refused; assuming no sharded pub/sub");
            return Ok(false);
        }
        Err(err) => return Err(redis("probe sharded pub/sub")(err)),
    };
    Ok(match reply {
        Value::Array(entries) => entries.first().is_some_and(|entry| !entry.is_null()),
        _ => false,
    })
}
