//! Script execution, written once for every primitive.
//!
//! Scripts go out as `EVALSHA`; a `NOSCRIPT` answer (the script cache is empty after a restart or
//! failover) is followed by `EVAL` with the source, which also caches it on that server.
//!
//! fred re-sends commands that were in flight when a connection dropped. Each call says whether
//! that is allowed ([`Resend`]): acquire and renew scripts are idempotent per request (hold
//! markers), so they may be re-sent; releases are sent once and retried by the caller, who then
//! knows that an earlier attempt may have run.

use fred::interfaces::ClientLike;
use fred::prelude::{Client as RedisClient, Options};
use fred::types::{ClusterHash, CustomCommand, Value};
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
    resend: Options,
    send_once: Options,
}

impl Exec {
    pub(crate) fn new(redis: RedisClient) -> Self {
        let send_once = Options {
            max_attempts: Some(1),
            ..Options::default()
        };
        Self {
            redis,
            resend: Options::default(),
            send_once,
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
        kind: &'static str,
        keys: Vec<String>,
        args: Vec<String>,
        resend: Resend,
    ) -> Result<Vec<i64>, Error> {
        // Routed by the slot of the first key, which every key of one call shares.
        let route = keys.first().map_or(ClusterHash::Random, |key| {
            ClusterHash::Custom(key_slot(key))
        });
        let mut frame = Vec::with_capacity(2 + keys.len() + args.len());
        frame.push(Value::from(script.sha1()));
        frame.push(Value::from(keys.len() as i64));
        let first_key = keys.first().cloned().unwrap_or_default();
        frame.extend(keys.into_iter().map(Value::from));
        frame.extend(args.into_iter().map(Value::from));

        let options = match resend {
            Resend::Allowed => &self.resend,
            Resend::Never => &self.send_once,
        };
        let client = self.redis.with_options(options);
        let evalsha = CustomCommand::new_static("EVALSHA", route.clone(), false);
        let result = match client
            .custom::<Vec<i64>, Value>(evalsha, frame.clone())
            .await
        {
            Err(err) if err.details().starts_with("NOSCRIPT") => {
                tracing::debug!(
                    script = script.name(),
                    "script not cached on the server; sending its source"
                );
                frame[0] = Value::from(script.source());
                let eval = CustomCommand::new_static("EVAL", route, false);
                client.custom::<Vec<i64>, Value>(eval, frame).await
            }
            other => other,
        };
        result.map_err(|source| {
            if source.details().starts_with("WRONGTYPE") {
                Error::WrongType {
                    key: first_key,
                    kind,
                }
            } else {
                Error::Redis(RedisError::new(script.name(), source))
            }
        })
    }
}
