//! [`CountDownLatch`]: a count-down latch; tasks wait until it reaches zero.

use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use futures::TryFutureExt;
use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::latch::{
    decode_try_set_count, CountDownReply, COUNT_DOWN, REQUEST_WINDOW_MS, TRY_SET_COUNT,
};
use lockkit_protocol::lock::hold_marker;

use crate::acquire::{acquire, Attempt, Outcome};
use crate::core::ClientInner;
use crate::error::{command_error, Error};
use crate::exec::Resend;
use crate::object::Object;
use crate::semaphore::key_refs;

/// A count-down latch shared by every client that uses the same name and Redis: tasks
/// [`wait`](CountDownLatch::wait) until the count, set with
/// [`try_set_count`](CountDownLatch::try_set_count), has been counted down to zero by
/// [`count_down`](CountDownLatch::count_down).
///
/// Get one with [`Client::count_down_latch`](crate::Client::count_down_latch). The handle is cheap, `Clone + Send + Sync`, and
/// sends nothing until used. A latch at zero does not exist in Redis: it can be set again, for a
/// new round.
///
/// There is no guard and nothing is leased: a latch is a shared count, not something held. A
/// worker that crashes before counting down leaves the latch closed; waiters see that as their
/// `wait` timing out.
///
/// # Waiting
/// A waiting task subscribes to the latch's channel; the count-down that reaches zero wakes every
/// waiter of every client at once. Should that message be lost (a reconnect), or the count be
/// lost with the data (an absent count is zero: the latch is open), waiters re-check the count at
/// least every [recheck interval](crate::ClientBuilder::recheck_interval) (≈ 1.7 s by default).
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use std::time::Duration;
///
/// // The coordinator: wait for 3 shards to be loaded, on whichever pods load them.
/// let loaded = client.count_down_latch("nightly-load");
/// loaded.try_set_count(3).await?;
/// if loaded.wait(Duration::from_secs(600)).await? {
///     println!("all shards loaded");
/// }
///
/// // Each loader, when its shard is in:
/// loaded.count_down().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct CountDownLatch {
    object: Object,
}

impl CountDownLatch {
    /// The largest count accepted: 4,294,967,295.
    pub const MAX_COUNT: u64 = u32::MAX as u64;

    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(client, Kind::CountDownLatch, name),
        }
    }

    /// The latch's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    /// Starts the latch at `count`, only if it is at zero; returns whether this call set it.
    ///
    /// # Cancel safety
    /// Cancel-safe. The request carries a marker, so a copy re-sent after a dropped connection is
    /// recognised: it reports `true` rather than "already counting".
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a count of zero or above
    /// [`MAX_COUNT`](CountDownLatch::MAX_COUNT), or an invalid name; [`Error::Redis`] when Redis
    /// fails; [`Error::WrongType`] when the latch's keys hold something else.
    pub async fn try_set_count(&self, count: u64) -> Result<bool, Error> {
        if count == 0 || count > Self::MAX_COUNT {
            return Err(Error::InvalidArgument(format!(
                "a latch's count must be in 1..={}, not {count}",
                Self::MAX_COUNT
            )));
        }
        let keys = self.object.keys()?;
        let marker = self.request_marker();
        let reply = self
            .object
            .inner()
            .exec
            .ints(
                &TRY_SET_COUNT,
                Kind::CountDownLatch,
                &key_refs(keys),
                &[&marker, &count.to_string(), &REQUEST_WINDOW_MS.to_string()],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.during("try_set_count"))?;
        Ok(decode_try_set_count(&reply)?)
    }

    /// Counts the latch down by one and returns the new count. The count-down that reaches zero
    /// opens the latch: every waiter, in every client, returns `true`.
    ///
    /// # Cancel safety
    /// Cancel-safe in the sense that matters: the request carries a marker, so a copy re-sent after
    /// a dropped connection never counts twice. A future dropped after sending may or may not have
    /// counted.
    ///
    /// # Errors
    /// [`Error::Refused`] when the latch is already at zero (never set, or opened): nothing is
    /// counted. [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the latch's keys hold
    /// something else.
    pub async fn count_down(&self) -> Result<u64, Error> {
        let keys = self.object.keys()?;
        let marker = self.request_marker();
        let reply = self
            .object
            .inner()
            .exec
            .ints(
                &COUNT_DOWN,
                Kind::CountDownLatch,
                &key_refs(keys),
                &[
                    &marker,
                    &REQUEST_WINDOW_MS.to_string(),
                    &keys.channel,
                    self.object.inner().exec.publish_flag(),
                ],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.during("count_down"))?;
        match CountDownReply::decode(&reply)? {
            CountDownReply::Counted { count } => Ok(count),
            CountDownReply::AlreadyZero => Err(Error::Refused {
                kind: Kind::CountDownLatch.describe(),
                name: self.object.name.to_string(),
                reason: "cannot count down: the count is already zero".into(),
            }),
        }
    }

    /// The current count (0: the latch is open, or was never set).
    ///
    /// # Cancel safety
    /// Cancel-safe.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails; [`Error::WrongType`] when the latch's key holds
    /// something else.
    pub async fn count(&self) -> Result<u64, Error> {
        let keys = self.object.keys()?;
        read_count(&self.object, keys)
            .await
            .map_err(|err| err.during("count"))
    }

    /// Waits until the count is zero, at most `timeout`; returns whether it reached zero in time.
    /// Returns `true` at once when the latch is already at zero (or was never set).
    ///
    /// `timeout = Duration::ZERO` only checks. A `timeout` too long to represent as a deadline
    /// (`Duration::MAX`) waits without bound while Redis answers. In an outage it fails with
    /// [`Error::Redis`] within the [command timeout](crate::ClientBuilder::command_timeout) once
    /// a connection to Redis is lost, or the
    /// [recheck interval](crate::ClientBuilder::recheck_interval) plus the command timeout when
    /// Redis stops answering (frozen, paused).
    ///
    /// # Cancel safety
    /// Cancel-safe: a dropped wait leaves nothing behind.
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails, [`Error::Shutdown`] once the client is shut down,
    /// [`Error::WrongType`] when the latch's key holds something else.
    ///
    /// ```no_run
    /// # async fn demo(latch: lockkit::CountDownLatch) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// if !latch.wait(Duration::from_secs(30)).await? {
    ///     eprintln!("still {} to go after 30 s", latch.count().await?);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn wait(&self, timeout: Duration) -> Result<bool, Error> {
        let keys = self.object.keys()?;
        let attempt = ZeroAttempt {
            object: &self.object,
            keys,
        };
        Ok(acquire(self.object.inner(), &attempt, Some(timeout))
            .await
            .map_err(|err| err.during("wait"))?
            .is_some())
    }

    /// A marker naming one request, so a re-sent copy is recognised.
    fn request_marker(&self) -> String {
        let inner = self.object.inner();
        hold_marker(&inner.id, inner.next_sequence())
    }
}

/// The count, read within the command timeout (its error says `count`; a caller that is
/// another method renames it).
async fn read_count(object: &Object, keys: &ObjectKeys) -> Result<u64, Error> {
    let exec = &object.inner().exec;
    let get = exec.redis().get::<Option<String>, _>(keys.key.as_str());
    let get = get.map_err(command_error("count", &keys.key, Kind::CountDownLatch));
    match exec.command("count", &object.name, get).await? {
        None => Ok(0),
        Some(count) => count.parse::<i64>().map_or_else(
            |_| {
                Err(Error::WrongType {
                    key: keys.key.clone(),
                    kind: Kind::CountDownLatch.describe(),
                })
            },
            |count| Ok(count.max(0).unsigned_abs()),
        ),
    }
}

/// "The count is zero", as an attempt of the shared acquire loop: succeeds when the count is zero;
/// otherwise busy with no known bound, so a lost message costs at most the client's recheck
/// interval.
struct ZeroAttempt<'a> {
    object: &'a Object,
    keys: &'a ObjectKeys,
}

impl Attempt for ZeroAttempt<'_> {
    type Output = ();

    fn channel(&self) -> &str {
        &self.keys.channel
    }

    fn object(&self) -> (Kind, &str) {
        (self.object.kind, &self.object.name)
    }

    async fn attempt(&self) -> Result<Outcome<()>, Error> {
        Ok(if read_count(self.object, self.keys).await? == 0 {
            Outcome::Acquired(())
        } else {
            Outcome::Busy { retry_in: None }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<CountDownLatch>();
    }
}
