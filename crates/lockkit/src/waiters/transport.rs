//! The waiter hub's transport: the one subscriber connection, and what goes over it.
//!
//! Owns: subscribing to a channel and confirming it ([`subscribe`]); unsubscribing once a channel
//! has stayed idle for the linger ([`retire`]); subscribing again after the connection was
//! re-established ([`resubscribe`]); and the dispatcher ([`dispatch`]), the task that reads the
//! message stream and the connection's events, hands each release message to the wake policy and
//! runs the end-of-window timer. Classic (`SUBSCRIBE`) and sharded (`SSUBSCRIBE`) pub/sub differ
//! only here and in [`super::slots`].
//!
//! Does not own: who waits where (the bookkeeping, [`super::table`]); whom a message wakes and
//! when an end-of-window wake-up is due (the wake policy, [`super::wake`]); noticing a slot that
//! moved (sharded mode, [`super::slots`]).
//!
//! In sharded mode ([`PubSubMode::Sharded`](crate::PubSubMode)) the hub uses `SSUBSCRIBE` /
//! `SUNSUBSCRIBE`, which fred routes to the node owning the channel's slot (channels carry the
//! object's `{name}` hash tag, so that is the object's node) and which wait for Redis's reply, so
//! no `PING` is needed to confirm them. Messages arrive as `smessage` and are dispatched like
//! `message`: by channel name.
//!
//! Subscriptions live while at least one local task waits on the channel, and for
//! [`SUBSCRIPTION_LINGER`] after the last one left, so a task that waits on the same object again
//! soon (a worker taking one lock in a loop) finds it still subscribed. `SUBSCRIBE` and
//! `UNSUBSCRIBE` are serialised by one async mutex, and an unsubscribe re-checks under it that
//! the channel stayed idle for the whole linger
//! ([`WaitTable::retire`](super::table::WaitTable::retire)), so a late `UNSUBSCRIBE` never
//! cancels a newer subscription.
//!
//! When messages may have been lost (the broadcast channel lagged, or the subscriber connection
//! was re-established) every waiter is woken to re-check; after a reconnect, once the hub has
//! subscribed again to every channel it tracks. When a connection of the client (subscriber or
//! command) is lost, every waiter is woken too, so that it tries at once and fails within the
//! command timeout if Redis is gone ([`connection_lost`]).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit_protocol::slot::key_slot;
use lockkit_protocol::wake::Wake;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::table::Retire;
use super::wake::{Fallbacks, FALLBACK_DELAY};
use super::{slots, ConnectionErrors, HubInner};
use crate::error::{redis, Error};
use crate::exec::resend_unsent;

/// How long a channel stays subscribed after its last local waiter left (see the module
/// documentation).
pub(super) const SUBSCRIPTION_LINGER: Duration = Duration::from_secs(2);

/// Subscribes to `channel` and returns once Redis has registered the subscription: classic
/// pub/sub confirms it with a `PING` on the subscriber connection (fred's `subscribe` returns
/// before Redis has registered it); sharded pub/sub needs nothing more (`SSUBSCRIBE` returns once
/// Redis has replied). Serialised with unsubscribes and resubscriptions.
///
/// On a cluster, fred sends a classic `SUBSCRIBE` to the node that owns the slot of the
/// subscriber client's id, so the confirming `PING` goes there too: a `PING` routed to any other
/// node confirmed nothing, and the waiter could try the lock before its subscription existed
/// (and miss the grant of a release in between).
pub(super) async fn subscribe(hub: &HubInner, channel: &str) -> Result<(), Error> {
    let _serial = hub.subscribe_lock.lock().await;
    // SUBSCRIBE is idempotent: one that could not even be routed (no connection at that instant)
    // is simply sent again once the client has reconnected.
    resend_unsent(|| async {
        if hub.sharded {
            slots::record_owner(hub, channel);
            // SSUBSCRIBE returns once Redis has replied: nothing more to confirm.
            return hub
                .sub
                .ssubscribe(channel)
                .await
                .map_err(redis("ssubscribe"));
        }
        hub.sub
            .subscribe(channel)
            .await
            .map_err(redis("subscribe"))?;
        // Confirms that Redis has processed the SUBSCRIBE sent before it, on the same node.
        if hub.sub.is_clustered() {
            let slot = key_slot(hub.sub.id());
            let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
            hub.sub
                .custom::<Value, Vec<Value>>(ping, Vec::new())
                .await
                .map_err(redis("subscribe"))?;
        } else {
            hub.sub
                .ping::<Value>(None)
                .await
                .map_err(redis("subscribe"))?;
        }
        Ok::<(), Error>(())
    })
    .await
}

/// Unsubscribes from `channel` once it has been idle (no local waiter) for
/// [`SUBSCRIPTION_LINGER`]; keeps it if a waiter comes back first.
pub(super) async fn retire(hub: Weak<HubInner>, channel: String) {
    let mut linger = SUBSCRIPTION_LINGER;
    loop {
        tokio::time::sleep(linger).await;
        let Some(hub) = hub.upgrade() else { return };
        let _serial = hub.subscribe_lock.lock().await;
        let now = tokio::time::Instant::now();
        match hub
            .channels
            .lock()
            .retire(&channel, now, SUBSCRIPTION_LINGER)
        {
            Retire::Retired => {}
            // Idle again since more recently: look again once that has lingered.
            Retire::Later(left) => {
                linger = left;
                continue;
            }
            Retire::Kept => return, // someone waits again; keep the subscription
        }
        let result = if hub.sharded {
            hub.sub.sunsubscribe(channel.as_str()).await
        } else {
            hub.sub.unsubscribe(channel.as_str()).await
        };
        if let Err(err) = result {
            tracing::debug!(%channel, "unsubscribe failed: {}", crate::error::Chain(&err));
        }
        return;
    }
}

/// Unsubscribes from a channel whose last [`Listener`](super::Listener) is gone, unless a new
/// listener came meanwhile (serialised with its subscription).
pub(super) async fn unlisten(hub: Weak<HubInner>, channel: String) {
    let Some(hub) = hub.upgrade() else { return };
    let _serial = hub.subscribe_lock.lock().await;
    if hub.listened.lock().contains_key(&channel) {
        return;
    }
    let result = if hub.sharded {
        hub.sub.sunsubscribe(channel.as_str()).await
    } else {
        hub.sub.unsubscribe(channel.as_str()).await
    };
    if let Err(err) = result {
        tracing::debug!(%channel, "unsubscribe failed: {}", crate::error::Chain(&err));
    }
}

/// The connection errors the dispatcher watches: each wakes every waiter ([`connection_lost`]).
pub(super) struct Lost {
    /// The subscriber connection's.
    pub(super) subscriber: ConnectionErrors,
    /// The command connection's (every node's, on a cluster).
    pub(super) commands: ConnectionErrors,
    /// The command connection's reconnections.
    pub(super) commands_back: tokio::sync::broadcast::Receiver<fred::types::config::Server>,
    /// The client's outage state, which the dispatcher keeps and reports ([`Down`]).
    pub(super) outage: Arc<crate::core::Outage>,
}

/// Which of the client's two connections are down, for the outage's two events: one warning
/// when the first goes down, one info event when the last comes back, whatever fred reports in
/// between (an error per failed reconnection attempt, per node, per connection).
struct Down {
    subscriber: bool,
    commands: bool,
    outage: Arc<crate::core::Outage>,
}

impl Down {
    fn lost(&mut self, which: &'static str, shown: &str) {
        match which {
            "subscriber" => self.subscriber = true,
            _ => self.commands = true,
        }
        if self.outage.begin() {
            tracing::warn!(
                connection = which,
                "lost the connection to Redis ({shown}); reconnecting. Waiting calls try again \
                 and fail within the command timeout while it is down; held leases are renewed \
                 once it is back, if they have not run out"
            );
        }
    }

    fn back(&mut self, which: &'static str) {
        match which {
            "subscriber" => self.subscriber = false,
            _ => self.commands = false,
        }
        if !self.subscriber && !self.commands && self.outage.end() {
            tracing::info!("the connection to Redis is back");
        }
    }
}

/// Routes release messages to waiters until `closed`, then closes the subscriber connection and
/// cancels `sub_closed`. A lost connection (`lost`) wakes every waiter.
pub(super) async fn dispatch(
    hub: Weak<HubInner>,
    sub: SubscriberClient,
    lost: Lost,
    closed: CancellationToken,
    sub_closed: CancellationToken,
) {
    let Lost {
        subscriber: mut subscriber_errors,
        commands: mut command_errors,
        commands_back: mut command_reconnects,
        outage,
    } = lost;
    let mut down = Down {
        subscriber: false,
        commands: false,
        outage,
    };
    // A stream that closed (its client is gone) is no longer watched.
    let (mut subscriber_open, mut commands_open) = (true, true);
    let mut messages = sub.message_rx();
    let mut reconnects = sub.reconnect_rx();
    let mut cluster_changes = sub.cluster_change_rx();
    let sharded = hub.upgrade().is_some_and(|hub| hub.sharded);
    let mut slot_check = tokio::time::interval(slots::CHECK_INTERVAL);
    slot_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The armed end-of-window wake-ups, and one timer for the first of them.
    let mut fallbacks = Fallbacks::default();
    let fallback_timer = tokio::time::sleep(FALLBACK_DELAY);
    tokio::pin!(fallback_timer);
    loop {
        tokio::select! {
            () = closed.cancelled() => break,
            message = messages.recv() => match message {
                Ok(message) => {
                    let Some(hub) = hub.upgrade() else { break };
                    crate::metrics::pubsub_message();
                    // One message may carry several grants to this client, one per line
                    // (Wake::decode_all's format), applied in order without collecting them.
                    let payload = message.value.as_str();
                    let wakes = payload
                        .as_deref()
                        .map(|payload| payload.split('\n').map(Wake::decode))
                        .into_iter()
                        .flatten()
                        .chain(payload.is_none().then_some(Wake::One));
                    for wake in wakes {
                        let armed = hub.channels.lock().apply(&message.channel, &wake);
                        if let Some(fallback) = armed {
                            let first = fallbacks.arm(message.channel.clone(), fallback, Instant::now());
                            if let Some(due) = first {
                                fallback_timer.as_mut().reset(due);
                            }
                        }
                    }
                }
                Err(RecvError::Lagged(missed)) => {
                    tracing::warn!(missed, "release messages were dropped; waking every waiter to re-check");
                    wake_all(&hub);
                }
                Err(RecvError::Closed) => break,
            },
            reconnect = reconnects.recv() => match reconnect {
                Ok(_) | Err(RecvError::Lagged(_)) => {
                    tracing::debug!("subscriber connection re-established; re-subscribing and waking every waiter to re-check");
                    down.back("subscriber");
                    if let Some(hub) = hub.upgrade() {
                        tokio::spawn(resubscribe(hub));
                    }
                }
                Err(RecvError::Closed) => break,
            },
            error = subscriber_errors.recv(), if subscriber_open => {
                subscriber_open = connection_lost(&hub, "subscriber", error, &mut down);
            },
            error = command_errors.recv(), if commands_open => {
                commands_open = connection_lost(&hub, "command", error, &mut down);
            },
            back = command_reconnects.recv(), if commands_open => match back {
                Ok(_) | Err(RecvError::Lagged(_)) => down.back("command"),
                Err(RecvError::Closed) => commands_open = false,
            },
            change = cluster_changes.recv(), if sharded => match change {
                Ok(_) | Err(RecvError::Lagged(_)) => {
                    if let Some(hub) = hub.upgrade() {
                        slots::spawn_check(hub, false);
                    }
                }
                Err(RecvError::Closed) => break,
            },
            _ = slot_check.tick(), if sharded => {
                let Some(hub) = hub.upgrade() else { break };
                let watched = !hub.channels.lock().is_empty() || !hub.listened.lock().is_empty();
                if watched {
                    slots::spawn_check(hub, true);
                }
            },
            () = &mut fallback_timer, if !fallbacks.is_empty() => {
                let Some(hub) = hub.upgrade() else { break };
                fallbacks.fire_due(&hub.channels, Instant::now());
                if let Some(next) = fallbacks.next_due() {
                    fallback_timer.as_mut().reset(next);
                }
            },
        }
    }
    let _ = sub.quit().await;
    sub_closed.cancel();
}

/// Restores the subscriptions after the subscriber connection was re-established, then wakes
/// every waiter to re-check (a release may have been published while the connection was down).
///
/// Done here rather than by fred's `manage_subscriptions`, which also sends `PSUBSCRIBE` with no
/// patterns: the error reply to that was taken as the reply to a waiter's own subscription, so
/// waits failed with a Redis error after reconnects
/// (`tests/reliability.rs`, `waiting_across_reconnects_never_fails_with_a_subscribe_error`).
async fn resubscribe(hub: Arc<HubInner>) {
    if hub.sharded {
        resubscribe_sharded(&hub).await;
    } else {
        let _serial = hub.subscribe_lock.lock().await;
        let channels: Vec<fred::types::Key> = hub
            .sub
            .tracked_channels()
            .into_iter()
            .map(Into::into)
            .collect();
        if !channels.is_empty() {
            // Confirmed by a PING, as in `subscribe`, before the waiters re-check.
            let restored = match hub.sub.subscribe(channels).await {
                Ok(()) => hub.sub.ping::<Value>(None).await.map(drop),
                Err(err) => Err(err),
            };
            if let Err(err) = restored {
                tracing::warn!(
                    "re-subscribing after a reconnect failed: {}",
                    crate::error::Chain(&err)
                );
            }
        }
    }
    hub.channels.lock().wake_all();
}

/// The sharded half of [`resubscribe`]: every shard channel that fred tracks or that has a local
/// waiter, one `SSUBSCRIBE` per slot (Redis refuses one that spans slots). The channels with
/// waiters are included because a failover or a slot migration may have dropped a subscription
/// on the server's side (Redis then sends `sunsubscribe`) without the client asking for it.
async fn resubscribe_sharded(hub: &HubInner) {
    let _serial = hub.subscribe_lock.lock().await;
    let mut by_slot: BTreeMap<u16, BTreeSet<String>> = BTreeMap::new();
    let tracked = hub
        .sub
        .tracked_shard_channels()
        .into_iter()
        .map(|channel| channel.to_string());
    let waited: Vec<String> = hub.channels.lock().channels().map(str::to_owned).collect();
    for channel in tracked.chain(waited) {
        by_slot
            .entry(key_slot(&channel))
            .or_default()
            .insert(channel);
    }
    for (slot, channels) in by_slot {
        let channels: Vec<fred::types::Key> = channels.into_iter().map(Into::into).collect();
        if let Err(err) = hub.sub.ssubscribe(channels).await {
            tracing::warn!(
                slot,
                "re-subscribing shard channels after a reconnect failed: {}",
                crate::error::Chain(&err)
            );
        }
    }
}

/// One of the client's connections (`which`) was lost, or could not be re-established: every
/// waiter of the client is woken, whatever channel it waits on. Each tries again at once: while
/// Redis is gone its try fails within the command timeout and so does its wait, instead of
/// sleeping until a holder's lease would have ended; after a blip, it finds the object as it is
/// and sleeps again (and once the subscriber connection is back, [`resubscribe`] wakes everyone
/// once more). Returns whether the stream is still open.
fn connection_lost(
    hub: &Weak<HubInner>,
    which: &'static str,
    error: Result<(fred::error::Error, Option<fred::types::config::Server>), RecvError>,
    down: &mut Down,
) -> bool {
    let shown = match &error {
        Ok((error, _)) => error.to_string(),
        Err(RecvError::Lagged(missed)) => format!("{missed} connection errors"),
        Err(RecvError::Closed) => return false,
    };
    down.lost(which, &shown);
    let Some(hub) = hub.upgrade() else {
        return false;
    };
    let mut table = hub.channels.lock();
    if table.waiting() > 0 {
        tracing::debug!(
            connection = which,
            waiters = table.waiting(),
            "a connection to Redis was lost ({shown}); waking every waiter to try again"
        );
        table.wake_all();
    }
    true
}

/// The `Lagged` handler: release messages were dropped, so every waiter re-checks.
fn wake_all(hub: &Weak<HubInner>) {
    if let Some(hub) = hub.upgrade() {
        hub.channels.lock().wake_all();
    }
}

#[cfg(test)]
mod tests {
    use fred::interfaces::PubsubInterface;

    use crate::waiters::tests::woken;
    use crate::Client;

    /// How many subscribers Redis has for `channel` (PUBLISH answers how many got the message;
    /// `n:0` wakes nobody).
    async fn subscribers(client: &Client, channel: &str) -> i64 {
        client
            .inner
            .exec
            .redis()
            .publish(channel, "n:0")
            .await
            .unwrap()
    }

    /// Until Redis has no subscriber for `channel`. A hang guard, not a time bound: the
    /// unsubscribe runs in a spawned task after the linger, and there is no event to wait on.
    async fn until_unsubscribed(client: &Client, channel: &str) {
        let gone = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while subscribers(client, channel).await != 0 {
                tokio::task::yield_now().await;
            }
        })
        .await;
        assert!(gone.is_ok(), "still subscribed after the last waiter left");
    }

    /// Subscriptions live while a local task waits on the channel: when the last waiter leaves,
    /// the hub unsubscribes (in the background), so Redis stops sending the channel's releases
    /// to this client; a waiter that leaves while another waits keeps the subscription.
    #[tokio::test]
    async fn the_last_waiter_to_leave_unsubscribes() {
        let redis = lockkit_testkit::redis_url().await.unwrap();
        let client = Client::connect(redis.url()).await.unwrap();
        let channel = format!("test:unsubscribe:{}", client.id());
        let hub = &client.inner.hub;

        let only = hub.register(&channel, None, 1).await.unwrap();
        assert_eq!(subscribers(&client, &channel).await, 1);
        drop(only);
        until_unsubscribed(&client, &channel).await;

        let first = hub.register(&channel, None, 1).await.unwrap();
        let second = hub.register(&channel, None, 1).await.unwrap();
        assert_eq!(
            subscribers(&client, &channel).await,
            1,
            "one subscription for both waiters"
        );
        drop(first);
        assert_eq!(
            subscribers(&client, &channel).await,
            1,
            "the other waiter still waits"
        );
        drop(second);
        assert_eq!(client.waiting_count(), 0);
        until_unsubscribed(&client, &channel).await;
    }

    /// Issue 19, §4: a waiter dropped outside any runtime (here on a plain thread) still gets
    /// its channel retired. It used to mark the channel as retiring without being able to spawn
    /// the retirement, and since a channel has at most one retirement under way, no later idle
    /// period retired it either: the subscription stayed for the client's lifetime.
    #[tokio::test]
    async fn a_waiter_dropped_outside_a_runtime_still_unsubscribes() {
        let redis = lockkit_testkit::redis_url().await.unwrap();
        let client = Client::connect(redis.url()).await.unwrap();
        let channel = format!("test:unsubscribe:thread:{}", client.id());
        let hub = &client.inner.hub;

        let waiter = hub.register(&channel, None, 1).await.unwrap();
        assert_eq!(subscribers(&client, &channel).await, 1);
        let dropped = std::thread::spawn(move || {
            assert!(
                tokio::runtime::Handle::try_current().is_err(),
                "no runtime here"
            );
            drop(waiter);
        })
        .join();
        assert!(dropped.is_ok());
        assert_eq!(client.waiting_count(), 0);
        until_unsubscribed(&client, &channel).await;

        // And the channel's later idle periods retire it as usual.
        let again = hub.register(&channel, None, 1).await.unwrap();
        assert_eq!(subscribers(&client, &channel).await, 1);
        drop(again);
        until_unsubscribed(&client, &channel).await;
    }

    /// When the dispatcher falls behind the subscriber's message channel (more than
    /// `SUBSCRIBER_QUEUE` messages), messages are dropped and it gets `Lagged`; its handler must
    /// wake every waiter of every channel to re-check, including those whose release message
    /// may be among the dropped ones. The handler is called directly: stalling the real
    /// dispatcher means blocking a runtime worker, which can leave nobody driving the runtime's
    /// I/O (such a test hung in 3 of 16 runs next to other test processes).
    #[tokio::test]
    async fn the_lag_handler_wakes_every_waiter_of_every_channel() {
        use std::sync::Arc;

        let redis = lockkit_testkit::redis_url().await.unwrap();
        let client = Client::connect(redis.url()).await.unwrap();
        let hub = &client.inner.hub;
        let waiters = [
            hub.register(&format!("test:lag:a:{}", client.id()), None, 1)
                .await
                .unwrap(),
            hub.register(&format!("test:lag:a:{}", client.id()), None, 2)
                .await
                .unwrap(),
            hub.register(&format!("test:lag:b:{}", client.id()), None, 1)
                .await
                .unwrap(),
        ];
        assert_eq!(woken(&waiters), 0);
        super::wake_all(&Arc::downgrade(&hub.inner));
        assert_eq!(woken(&waiters), 3, "every waiter re-checks");
    }
}
