//! The waiter hub: event-driven waiting on release channels, one subscriber connection per client.
//!
//! Implementation notes for maintainers. The lost-wakeup race and how the order of steps closes
//! it (as in tokio's `Notify`: register interest before checking the condition):
//!
//! 1. A waiter registers on the object's channel. The first waiter of a channel subscribes; every
//!    waiter of that channel waits until the subscription is **confirmed** by a `PING` on the
//!    subscriber connection (fred's `subscribe` returns before Redis has registered it).
//! 2. Only then does the waiter try to acquire again. A release that happened before step 1
//!    completed is seen by this attempt; a release after it is published to a channel we are
//!    subscribed to.
//! 3. The waiter sleeps until it is woken or until the holder's remaining lease (the bound: a
//!    missed message costs at most that, never a hang).
//!
//! Each release message says whom to wake ([`Wake`]): usually **one** local waiter of that
//! channel, the longest-registered one not already woken (no thundering herd); `k` of them when
//! `k` permits came back; all of them when every waiter must re-check; or the one waiter named by
//! id (fair lock). A woken waiter that goes away without using up its
//! wake-up (before it ran, or while its try was in flight) passes it on. The bookkeeping (who
//! waits where, whom a message wakes, where a wake-up goes next) is [`WaitTable`], kept apart
//! from the transport so the model checker can drive it.
//!
//! A woken waiter that is refused hands the wake-up on ([`Waiter::tried`]) to a waiter that
//! needs less; a lock's release wakes only the waiter it reserved the lock for, and the other
//! clients wake one waiter once the handoff window has passed unless told it was `taken`. What
//! each message does, and why, is the wake policy ([`wake`]).
//!
//! When messages may have been lost (the broadcast channel lagged, or
//! the subscriber connection was re-established) every waiter is woken to re-check; after a
//! reconnect, once the hub has subscribed again to every channel it tracks.
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
//! the channel stayed idle for the whole linger ([`WaitTable::retire`]), so a late
//! `UNSUBSCRIBE` never cancels a newer subscription.
//!
//! **Registering first.** Step 2 costs a script call on every wait, wasted unless a release
//! slipped in between the first try and step 1. When the channel is subscribed already
//! (confirmed, and not retired), the waiter registers **before** its first try instead
//! ([`WaiterHub::register_now`]), as tokio's `Notify` has it: a release after that try is
//! published after the waiter registered, and wakes it; one before it is seen by the try. So it
//! sleeps after a busy first try, without a second. A waiter whose first try takes the object
//! leaves at once (a wake-up it got meanwhile goes on, as from any waiter that leaves).

mod slots;
pub(crate) mod table;
mod wake;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClientLike, EventInterface, PubsubInterface};
use fred::types::config::Server;
use fred::types::Value;
use lockkit_protocol::slot::key_slot;
use lockkit_protocol::wake::Wake;
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{Notify, OnceCell};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::error::{redis, Error};
use crate::exec::resend_unsent;
use table::{Retire, WaitTable, WaiterId};
use wake::{Fallbacks, FALLBACK_DELAY};

/// How long a channel stays subscribed after its last local waiter left (see the module
/// documentation).
pub(crate) const SUBSCRIPTION_LINGER: Duration = Duration::from_secs(2);

/// The client's waiter hub.
pub(crate) struct WaiterHub {
    inner: Arc<HubInner>,
}

struct HubInner {
    sub: SubscriberClient,
    /// `SSUBSCRIBE` rather than `SUBSCRIBE`.
    sharded: bool,
    /// The waiters, with each channel's subscription (initialised once it is confirmed).
    channels: Mutex<WaitTable<Arc<OnceCell<()>>>>,
    subscribe_lock: tokio::sync::Mutex<()>,
    /// Sharded mode: the owner of each waited channel's slot when the hub last looked (`None`:
    /// not known then).
    slot_owners: Mutex<HashMap<u16, Option<Server>>>,
    /// A slot-owner check is running (at most one at a time).
    checking: AtomicBool,
    /// The runtime the client was built on (the hub's dispatcher runs there): a waiter dropped
    /// outside any runtime still schedules its channel's retirement through it.
    runtime: tokio::runtime::Handle,
}

impl WaiterHub {
    /// Starts the hub on a connected subscriber client; `closed` stops it and closes the
    /// connection.
    /// `sharded` selects sharded pub/sub (`SSUBSCRIBE`).
    ///
    /// Must be called inside a tokio runtime (the client's `build`): the hub runs there.
    pub(crate) fn start(sub: SubscriberClient, sharded: bool, closed: CancellationToken) -> Self {
        let runtime = tokio::runtime::Handle::current();
        let inner = Arc::new(HubInner {
            sub: sub.clone(),
            sharded,
            channels: Mutex::new(WaitTable::default()),
            subscribe_lock: tokio::sync::Mutex::new(()),
            slot_owners: Mutex::new(HashMap::new()),
            checking: AtomicBool::new(false),
            runtime: runtime.clone(),
        });
        runtime.spawn(dispatch(Arc::downgrade(&inner), sub, closed));
        Self { inner }
    }

    /// Registers interest in `channel` and returns once the subscription is confirmed. `tag`
    /// names the waiter for messages that wake one waiter by id; `need` is how much of the object
    /// it needs (see [`Waiter::tried`]).
    pub(crate) async fn register(
        &self,
        channel: &str,
        tag: Option<&str>,
        need: u64,
    ) -> Result<Waiter, Error> {
        let registered = self.inner.channels.lock().register(channel, tag, need);
        let subscribed = registered.data;
        // From here on, dropping `waiter` (an error, or the caller going away) unregisters.
        let waiter = Waiter {
            hub: Arc::clone(&self.inner),
            channel: channel.to_owned(),
            id: registered.id,
            signal: registered.signal,
        };
        subscribed
            .get_or_try_init(|| async {
                let _serial = self.inner.subscribe_lock.lock().await;
                // SUBSCRIBE is idempotent: one that could not even be routed (no connection at
                // that instant) is simply sent again once the client has reconnected.
                resend_unsent(|| async {
                    if self.inner.sharded {
                        slots::record_owner(&self.inner, channel);
                        // SSUBSCRIBE returns once Redis has replied: nothing more to confirm.
                        return self
                            .inner
                            .sub
                            .ssubscribe(channel)
                            .await
                            .map_err(redis("ssubscribe"));
                    }
                    self.inner
                        .sub
                        .subscribe(channel)
                        .await
                        .map_err(redis("subscribe"))?;
                    // Confirms that Redis has processed the SUBSCRIBE sent before it.
                    self.inner
                        .sub
                        .ping::<Value>(None)
                        .await
                        .map_err(redis("subscribe"))?;
                    Ok::<(), Error>(())
                })
                .await
            })
            .await?;
        Ok(waiter)
    }

    /// The number of tasks waiting on any channel.
    pub(crate) fn waiting(&self) -> usize {
        self.inner.channels.lock().waiting()
    }

    /// Whether this client heard of a reservation on `channel` whose end will be announced
    /// ([`WaitTable::reservation_announced`]).
    pub(crate) fn reservation_announced(&self, channel: &str) -> bool {
        self.inner.channels.lock().reservation_announced(channel)
    }

    /// Registers on `channel` at once if it is subscribed already (confirmed, and not retired);
    /// `None` otherwise. A waiter registered so before its first try needs no second try (see
    /// the module documentation).
    pub(crate) fn register_now(
        &self,
        channel: &str,
        tag: Option<&str>,
        need: u64,
    ) -> Option<Waiter> {
        let registered =
            self.inner
                .channels
                .lock()
                .register_if(channel, tag, need, |subscribed| subscribed.initialized())?;
        Some(Waiter {
            hub: Arc::clone(&self.inner),
            channel: channel.to_owned(),
            id: registered.id,
            signal: registered.signal,
        })
    }
}

/// One task's registration on one channel.
pub(crate) struct Waiter {
    hub: Arc<HubInner>,
    channel: String,
    id: WaiterId,
    signal: Arc<Notify>,
}

impl Waiter {
    /// Resolves when a release on the channel woke this waiter (possibly before this call). The
    /// wake-up is then in hand: the next try settles it ([`tried`](Waiter::tried)); dropped
    /// before that, the waiter passes it on.
    pub(crate) async fn woken(&self) {
        self.signal.notified().await;
        self.hub.channels.lock().take_wake(&self.channel, self.id);
    }

    /// This waiter's try ended, `refused` or not. A wake-up it had in hand is used up; if the
    /// try was refused, it goes on to the longest-registered waiter of the channel that needs
    /// less and is not already woken (see the module documentation).
    pub(crate) fn tried(&self, refused: bool) {
        if self
            .hub
            .channels
            .lock()
            .tried(&self.channel, self.id, refused)
        {
            tracing::debug!(
                channel = %self.channel,
                "woken but refused; handed the wake-up to a waiter that needs less"
            );
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        // A wake-up this waiter had not used up goes on to the next one.
        let now = tokio::time::Instant::now();
        if !self.hub.channels.lock().cancel(&self.channel, self.id, now) {
            return;
        }
        // Through the client's runtime, not the caller's: a waiter may be dropped outside any
        // runtime (a future dropped on a plain thread), and the channel is marked as retiring
        // now, so no later idle period would retire it if this one did not.
        let hub = Arc::downgrade(&self.hub);
        let channel = std::mem::take(&mut self.channel);
        self.hub.runtime.spawn(retire(hub, channel));
    }
}

/// Unsubscribes from `channel` once it has been idle (no local waiter) for
/// [`SUBSCRIPTION_LINGER`]; keeps it if a waiter comes back first.
async fn retire(hub: Weak<HubInner>, channel: String) {
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

/// Routes release messages to waiters until `closed`, then closes the subscriber connection.
async fn dispatch(hub: Weak<HubInner>, sub: SubscriberClient, closed: CancellationToken) {
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
                    let wake = message.value.as_str().map_or(Wake::One, |payload| Wake::decode(&payload));
                    let armed = hub.channels.lock().apply(&message.channel, &wake);
                    if let Some(fallback) = armed {
                        let first = fallbacks.arm(message.channel, fallback, Instant::now());
                        if let Some(due) = first {
                            fallback_timer.as_mut().reset(due);
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
                    tracing::info!("subscriber connection re-established; re-subscribing and waking every waiter to re-check");
                    if let Some(hub) = hub.upgrade() {
                        tokio::spawn(resubscribe(hub));
                    }
                }
                Err(RecvError::Closed) => break,
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
                if !hub.channels.lock().is_empty() {
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
            // Confirmed by a PING, as in `register`, before the waiters re-check.
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

fn wake_all(hub: &Weak<HubInner>) {
    if let Some(hub) = hub.upgrade() {
        hub.channels.lock().wake_all();
    }
}

#[cfg(test)]
mod tests {
    use fred::interfaces::PubsubInterface;

    use super::Waiter;
    use crate::Client;

    impl Waiter {
        /// Woken, and not yet run.
        pub(super) fn is_pending(&self) -> bool {
            self.hub.channels.lock().is_pending(&self.channel, self.id)
        }
    }

    fn woken(waiters: &[Waiter]) -> usize {
        waiters.iter().filter(|waiter| waiter.is_pending()).count()
    }

    /// Messages reach the subscriber connection in publish order, and the dispatcher handles
    /// them in that order: once a marker channel's waiter is woken, every earlier message has
    /// been dispatched, and we can count who it woke.
    async fn publish_then_sync(client: &Client, channel: &str, marker: &str) {
        let hub = &client.inner.hub;
        let sync = hub.register(marker, None, 1).await.unwrap();
        let redis = client.inner.exec.redis();
        let _: i64 = redis.publish(channel, "released").await.unwrap();
        let _: i64 = redis.publish(marker, "released").await.unwrap();
        sync.woken().await;
    }

    #[tokio::test]
    async fn one_release_wakes_one_waiter_and_a_dropped_waiter_passes_it_on() {
        let redis = lockkit_testkit::redis_url().await.unwrap();
        let client = Client::connect(redis.url()).await.unwrap();
        let channel = format!("test:herd:{}", client.id());
        let marker = format!("{channel}:marker");
        let mut waiters = Vec::new();
        for _ in 0..3 {
            waiters.push(client.inner.hub.register(&channel, None, 1).await.unwrap());
        }
        assert_eq!(woken(&waiters), 0);

        publish_then_sync(&client, &channel, &marker).await;
        assert_eq!(woken(&waiters), 1, "no thundering herd");
        assert!(waiters[0].is_pending(), "longest waiting first");

        // The woken waiter leaves without acting on it: the next one inherits the wake-up.
        waiters.remove(0);
        assert_eq!(woken(&waiters), 1);
        waiters[0].woken().await;
        assert_eq!(woken(&waiters), 0, "consumed");

        drop(waiters);
        assert_eq!(client.waiting_count(), 0);
    }

    #[tokio::test]
    async fn a_refused_waiter_hands_its_wake_up_only_to_one_that_needs_less() {
        let redis = lockkit_testkit::redis_url().await.unwrap();
        let client = Client::connect(redis.url()).await.unwrap();
        let channel = format!("test:need:{}", client.id());
        let marker = format!("{channel}:marker");
        let hub = &client.inner.hub;
        let waiters = vec![
            hub.register(&channel, None, 2).await.unwrap(),
            hub.register(&channel, None, 1).await.unwrap(),
            hub.register(&channel, None, 1).await.unwrap(),
        ];

        publish_then_sync(&client, &channel, &marker).await;
        assert!(waiters[0].is_pending());
        assert_eq!(woken(&waiters), 1);
        waiters[0].woken().await;

        // Refused with 2 needed: the first waiter that needs less inherits the wake-up.
        waiters[0].tried(true);
        assert!(waiters[1].is_pending());
        assert_eq!(woken(&waiters), 1);
        waiters[1].woken().await;

        // Refused with 1 needed: a waiter that needs as much would be refused too.
        waiters[1].tried(true);
        assert_eq!(woken(&waiters), 0, "no hand-over between equal needs");
    }

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
