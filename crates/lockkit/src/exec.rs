//! Script execution, written once for every primitive.
//!
//! Scripts go out as `EVALSHA`; a `NOSCRIPT` answer (the script cache is empty after a restart or
//! failover) is followed by `EVAL` with the source, which also caches it on that server.
//!
//! fred re-sends commands that were in flight when a connection dropped. Each call says whether
//! that is allowed ([`Resend`]): acquire and renew scripts are idempotent per request (hold
//! markers), so they may be re-sent; releases are sent once and retried by the caller, who then
//! knows that an earlier attempt may have run.

use fred::clients::WithOptions;
use fred::interfaces::ClientLike;
use fred::prelude::{Client as RedisClient, Options};
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit_protocol::keys::Kind;
use lockkit_protocol::script::Script;
use lockkit_protocol::slot::key_slot;

use crate::error::{Error, RedisError};

/// Whether fred may re-send a script after a reconnect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// The script is idempotent per request: re-sending it is harmless.
    Allowed,
    /// Send at most once; a broken connection surfaces as an ambiguous error.
    Never,
}

/// Runs protocol scripts on one fred client.
#[derive(Clone)]
pub(crate) struct Exec {
    redis: RedisClient,
    resending: WithOptions<RedisClient>,
    sending_once: WithOptions<RedisClient>,
    /// Whether release announcements go out by `SPUBLISH` (sharded pub/sub).
    sharded: bool,
}

impl Exec {
    /// `sharded`: whether scripts announce releases with `SPUBLISH` rather than `PUBLISH`.
    pub(crate) fn new(redis: RedisClient, sharded: bool) -> Self {
        let once = Options {
            max_attempts: Some(1),
            ..Options::default()
        };
        Self {
            resending: redis.with_options(&Options::default()),
            sending_once: redis.with_options(&once),
            redis,
            sharded,
        }
    }

    /// The sharded flag every announcing script takes in `ARGV`: `"1"` for `SPUBLISH`, `"0"` for
    /// `PUBLISH`.
    pub(crate) fn publish_flag(&self) -> &'static str {
        if self.sharded {
            "1"
        } else {
            "0"
        }
    }

    /// The underlying fred client.
    pub(crate) fn redis(&self) -> &RedisClient {
        &self.redis
    }

    /// Runs `script` and returns its reply, which must be an array of integers (every lockkit
    /// script answers so). `kind` names the object type for [`Error::WrongType`].
    pub(crate) async fn ints(
        &self,
        script: &'static Script,
        kind: Kind,
        keys: &[&str],
        args: &[&str],
        resend: Resend,
    ) -> Result<Vec<i64>, Error> {
        // Routed by the slot of the first key, which every key of one call shares.
        let route = keys.first().map_or(ClusterHash::Random, |key| {
            ClusterHash::Custom(key_slot(key))
        });
        let client = match resend {
            Resend::Allowed => &self.resending,
            Resend::Never => &self.sending_once,
        };
        // A script that could not even be routed was never sent: sending it again is safe for
        // every script, whatever its `Resend` policy.
        resend_unsent(|| async {
            let evalsha = CustomCommand::new_static("EVALSHA", route.clone(), false);
            let result = match client
                .custom::<Vec<i64>, Value>(evalsha, frame(script.sha1(), keys, args))
                .await
            {
                Err(err) if err.details().starts_with("NOSCRIPT") => {
                    tracing::debug!(
                        script = script.name(),
                        "script not cached on the server; sending its source"
                    );
                    let eval = CustomCommand::new_static("EVAL", route.clone(), false);
                    client
                        .custom::<Vec<i64>, Value>(eval, frame(script.source(), keys, args))
                        .await
                }
                other => other,
            };
            result.map_err(|source| {
                if source.details().starts_with("WRONGTYPE") {
                    Error::WrongType {
                        key: keys
                            .first()
                            .map_or_else(String::new, |key| (*key).to_owned()),
                        kind: kind.describe(),
                    }
                } else {
                    Error::Redis(RedisError::new(script.name(), source))
                }
            })
        })
        .await
    }
}

/// `EVALSHA`/`EVAL` arguments: the script (or its SHA1), the key count, the keys, the arguments.
fn frame(script: &str, keys: &[&str], args: &[&str]) -> Vec<Value> {
    let mut frame = Vec::with_capacity(2 + keys.len() + args.len());
    frame.push(Value::from(script));
    frame.push(Value::from(keys.len() as i64));
    frame.extend(keys.iter().map(|key| Value::from(*key)));
    frame.extend(args.iter().map(|arg| Value::from(*arg)));
    frame
}

/// Runs `op` again (after a short, doubling pause: 50 ms … 3.2 s, about 6 s in all) for as long
/// as it fails because the command could not even be routed, i.e. was certainly never sent
/// (no connection at that instant, during a reconnect). Only for operations that are idempotent
/// or were never sent; any other outcome is returned as it is.
pub(crate) async fn resend_unsent<T, F, Fut>(mut op: F) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut pause = UNSENT_FIRST_PAUSE;
    let mut tries = 0;
    loop {
        match op().await {
            Err(Error::Redis(err)) if err.was_not_sent() && tries < UNSENT_RETRIES => {
                tracing::debug!("{}; sending again in {pause:?}", crate::error::Chain(&err));
                tokio::time::sleep(pause).await;
                pause *= 2;
                tries += 1;
            }
            other => return other,
        }
    }
}

/// How often a command that could not be routed is tried again, and the first pause.
const UNSENT_RETRIES: u32 = 7;
const UNSENT_FIRST_PAUSE: std::time::Duration = std::time::Duration::from_millis(50);
