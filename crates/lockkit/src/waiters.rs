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
//! Waiters of one channel may need different amounts of the object (a semaphore waiter asks for
//! `k` permits). A wake-up goes to the longest-registered waiter whatever it needs, so it may
//! reach one that needs more than came back while a waiter behind it needs less:
//!
//! 1. two permits are held; a waiter for 2 registers, then a waiter for 1;
//! 2. one permit is released and announced (`n:1`): the waiter for 2 is woken, tries, and is
//!    refused;
//! 3. without more, the waiter for 1 sleeps until its deadline or the holders' leases end.
//!
//! So a woken waiter that is refused hands the wake-up on ([`Waiter::tried`]) to the
//! longest-registered waiter of the channel that is not already woken and **needs less** than it
//! does. The chain ends, since every hand-over goes to a smaller need. Waiters that all need the
//! same (every lock, where a refusal means the object was taken) never hand a wake-up on, so a
//! release still wakes at most one waiter per client, not a herd (a lock's release: only the
//! reserved waiter, see below). When messages may have been lost (the broadcast channel lagged, or
//! the subscriber connection was re-established) every waiter is woken to re-check; after a
//! reconnect, once the hub has subscribed again to every channel it tracks.
//!
//! In sharded mode ([`PubSubMode::Sharded`](crate::PubSubMode)) the hub uses `SSUBSCRIBE` /
//! `SUNSUBSCRIBE`, which fred routes to the node owning the channel's slot (channels carry the
//! object's `{name}` hash tag, so that is the object's node) and which wait for Redis's reply, so
//! no `PING` is needed to confirm them. Messages arrive as `smessage` and are dispatched like
//! `message`: by channel name.
//!
//! When a slot moves to another node (resharding: `CLUSTER SETSLOT … NODE`), the old owner drops
//! the slot's shard subscriptions and tells the subscriber with an `sunsubscribe` push. fred 10.1
//! gives no signal for that push (`check_pubsub_message` drops every `sunsubscribe` frame as an
//! "unused subscription response", and its tracked shard channels do not change), so the hub
//! watches the slot owners instead: it records the owner of each waited channel's slot when it
//! subscribes, and re-reads the subscriber client's routing table whenever fred reports a
//! cluster-state change (a `MOVED` makes fred re-read `CLUSTER SLOTS`) and, while anyone waits,
//! every [`SLOT_CHECK_INTERVAL`] after a `CLUSTER SLOTS` of its own (a pure waiter sends nothing
//! that could draw a `MOVED`). When a slot's owner changed, the hub subscribes to that slot's
//! channels again (fred routes the `SSUBSCRIBE` to the new owner) and wakes their waiters to
//! re-check, since a release published on the new owner before that was missed.
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
//!
//! **Reservations.** A lock's release reserves the free lock for its longest-waiting owner for the
//! handoff window and names it (`p:<owner>`). Only the client holding that waiter wakes it; every
//! other waiter would be refused for the window, so they sleep on, and every client arms a
//! wake-up for the end of the window ([`Fallback`]). The reserved owner taking the lock
//! publishes `taken`, which disarms it; if it never comes (the reserved owner's client died),
//! one waiter per client tries when the window has passed. A waiter that tries during the window
//! is told the lock is reserved; if its client heard of the reservation, it sleeps until woken
//! (the end is announced either way), else until the window ends. So a handoff costs no wasted
//! try, and a dead reserved waiter costs one window.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use fred::bytes_utils::Str;
use fred::clients::SubscriberClient;
use fred::interfaces::ClusterInterface;
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
use crate::wait_table::{Fallback, Retire, WaitTable, WaiterId};

/// How long a channel stays subscribed after its last local waiter left (see the module
/// documentation).
pub(crate) const SUBSCRIPTION_LINGER: Duration = Duration::from_secs(2);

/// When a [`Fallback`] wake-up is due after the message that armed it: the handoff window (the
/// reservation was made just before the message was sent, so it has ended by then) and a
/// millisecond for the server's clock.
const FALLBACK_DELAY: Duration =
    lockkit_protocol::lock::HANDOFF_WINDOW.saturating_add(Duration::from_millis(1));

/// How often, in sharded mode and while at least one task waits, the hub re-reads the cluster's
/// slot owners to notice a slot that moved (see the module documentation).
pub(crate) const SLOT_CHECK_INTERVAL: Duration = Duration::from_secs(1);

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
                        // Where the SSUBSCRIBE goes, as far as the client knows: a later change
                        // of owner means the subscription was dropped (see `check_slot_owners`).
                        let slot = key_slot(channel);
                        let owner = slot_owner(&self.inner.sub, slot);
                        self.inner.slot_owners.lock().entry(slot).or_insert(owner);
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
    let mut slot_check = tokio::time::interval(SLOT_CHECK_INTERVAL);
    slot_check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The armed end-of-window wake-ups, in the order they fall due (every one is due
    // FALLBACK_DELAY after its message), and one timer for the first of them: no task or timer
    // per message.
    let mut fallbacks: VecDeque<(Instant, Str, Fallback)> = VecDeque::new();
    let fallback_timer = tokio::time::sleep(FALLBACK_DELAY);
    tokio::pin!(fallback_timer);
    loop {
        tokio::select! {
            () = closed.cancelled() => break,
            message = messages.recv() => match message {
                Ok(message) => {
                    let Some(hub) = hub.upgrade() else { break };
                    crate::metrics::pubsub_message();
                    let wake = message.value.as_str().map_or(Wake::One, |payload| Wake::decode(&payload));
                    let armed = hub.channels.lock().apply(&message.channel, &wake);
                    if let Some(fallback) = armed {
                        let due = Instant::now() + FALLBACK_DELAY;
                        if fallbacks.is_empty() {
                            fallback_timer.as_mut().reset(due);
                        }
                        fallbacks.push_back((due, message.channel, fallback));
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
                        spawn_slot_check(hub, false);
                    }
                }
                Err(RecvError::Closed) => break,
            },
            _ = slot_check.tick(), if sharded => {
                let Some(hub) = hub.upgrade() else { break };
                if !hub.channels.lock().is_empty() {
                    spawn_slot_check(hub, true);
                }
            },
            () = &mut fallback_timer, if !fallbacks.is_empty() => {
                let Some(hub) = hub.upgrade() else { break };
                fire_due(&hub, &mut fallbacks, Instant::now());
                if let Some((next, _, _)) = fallbacks.front() {
                    fallback_timer.as_mut().reset(*next);
                }
            },
        }
    }
    let _ = sub.quit().await;
}

/// Takes the wake-ups due by `now` off the front of `fallbacks` and fires them: each wakes one
/// waiter of its channel unless it was disarmed meanwhile (`taken`, or a newer message).
fn fire_due(hub: &HubInner, fallbacks: &mut VecDeque<(Instant, Str, Fallback)>, now: Instant) {
    while fallbacks.front().is_some_and(|(due, _, _)| *due <= now) {
        let Some((_, channel, fallback)) = fallbacks.pop_front() else {
            return;
        };
        if hub.channels.lock().fallback_due(&channel, fallback) {
            tracing::debug!(
                %channel,
                "the waiter a lock was reserved for did not take it within the handoff window; \
                 waking a waiter here"
            );
        }
    }
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

/// The node serving `slot` according to the subscriber client's routing table.
fn slot_owner(sub: &SubscriberClient, slot: u16) -> Option<Server> {
    sub.cached_cluster_state()
        .and_then(|state| state.get_server(slot).cloned())
}

/// Runs [`check_slot_owners`] in the background unless a check is already running.
fn spawn_slot_check(hub: Arc<HubInner>, refresh: bool) {
    if hub.checking.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async move {
        check_slot_owners(&hub, refresh).await;
        hub.checking.store(false, Ordering::Release);
    });
}

/// Finds the waited shard channels whose slot moved to another node since the hub subscribed,
/// subscribes to them again (on the new owner) and wakes their waiters to re-check. `refresh`
/// first re-reads `CLUSTER SLOTS` into the subscriber client's routing table.
async fn check_slot_owners(hub: &HubInner, refresh: bool) {
    if refresh {
        if let Err(err) = hub.sub.sync_cluster().await {
            tracing::debug!(
                "reading the cluster's slot owners failed: {}",
                crate::error::Chain(&err)
            );
            return;
        }
    }
    let mut waited: BTreeMap<u16, Vec<String>> = BTreeMap::new();
    for channel in hub.channels.lock().channels() {
        waited
            .entry(key_slot(channel))
            .or_default()
            .push(channel.to_owned());
    }
    let mut moved = Vec::new();
    {
        let mut owners = hub.slot_owners.lock();
        owners.retain(|slot, _| waited.contains_key(slot));
        for &slot in waited.keys() {
            let now = slot_owner(&hub.sub, slot);
            if let Some(before) = owners.insert(slot, now.clone()) {
                if before != now {
                    moved.push((slot, before, now));
                }
            }
        }
    }
    for (slot, before, now) in moved {
        let before = before.map_or_else(|| "unknown".to_owned(), |server| server.to_string());
        let now = now.map_or_else(|| "unknown".to_owned(), |server| server.to_string());
        tracing::info!(
            slot,
            %before,
            %now,
            "the slot of waited shard channels moved; re-subscribing and waking their waiters"
        );
        let _serial = hub.subscribe_lock.lock().await;
        let channels: Vec<fred::types::Key> = hub
            .channels
            .lock()
            .channels()
            .filter(|channel| key_slot(channel) == slot)
            .map(|channel| channel.to_owned().into())
            .collect();
        if channels.is_empty() {
            continue;
        }
        if let Err(err) = hub.sub.ssubscribe(channels).await {
            tracing::warn!(
                slot,
                "re-subscribing shard channels after their slot moved failed: {}",
                crate::error::Chain(&err)
            );
        }
        hub.channels
            .lock()
            .wake_all_where(|channel| key_slot(channel) == slot);
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
        fn is_pending(&self) -> bool {
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

    /// Sharded mode: a slot-owner check re-subscribes and wakes the waiters of a slot whose owner
    /// changed since the hub subscribed (a release published on the new owner meanwhile was
    /// missed), and leaves the waiters of a slot whose owner did not change asleep.
    #[tokio::test]
    async fn a_slot_check_wakes_the_waiters_of_a_moved_slot_and_no_others() {
        use fred::types::config::Server;
        use lockkit_protocol::slot::key_slot;

        use super::check_slot_owners;
        use crate::PubSubMode;

        let redis = lockkit_testkit::redis_url().await.unwrap();
        let client = Client::builder()
            .url(redis.url())
            .pubsub(PubSubMode::Sharded)
            .build()
            .await
            .unwrap();
        let hub = &client.inner.hub;
        let channel = format!("test:slot:{{{}}}", client.id());
        let waiter = hub.register(&channel, None, 1).await.unwrap();

        // One server, not a cluster: the subscriber client routes no slot, so the owner recorded
        // at SSUBSCRIBE (none) is still the owner now.
        check_slot_owners(&hub.inner, false).await;
        assert!(
            !waiter.is_pending(),
            "the slot did not move: nobody re-checks"
        );

        // As if the slot had been served elsewhere when the hub subscribed.
        hub.inner
            .slot_owners
            .lock()
            .insert(key_slot(&channel), Some(Server::new("192.0.2.1", 6379)));
        check_slot_owners(&hub.inner, false).await;
        assert!(waiter.is_pending(), "the moved slot's waiter re-checks");
    }

    /// The end-of-window wake-ups fall due in the order they were armed: `fire_due` fires those
    /// due by `now` (each wakes a waiter unless disarmed) and leaves the later ones queued.
    #[tokio::test]
    async fn only_the_due_end_of_window_wake_ups_fire() {
        use std::collections::VecDeque;
        use std::time::Duration;

        use lockkit_protocol::wake::Wake;
        use tokio::time::Instant;

        let redis = lockkit_testkit::redis_url().await.unwrap();
        let client = Client::connect(redis.url()).await.unwrap();
        let hub = &client.inner.hub;
        let (early, late) = (
            format!("test:fallback:a:{}", client.id()),
            format!("test:fallback:b:{}", client.id()),
        );
        let waiters = [
            hub.register(&early, None, 1).await.unwrap(),
            hub.register(&late, None, 1).await.unwrap(),
        ];
        let arm = |channel: &str| {
            hub.inner
                .channels
                .lock()
                .apply(channel, &Wake::Prefer("elsewhere".into()))
                .expect("armed")
        };
        let now = Instant::now();
        let mut queue = VecDeque::from([
            (now, early.as_str().into(), arm(&early)),
            (
                now + Duration::from_secs(3600),
                late.as_str().into(),
                arm(&late),
            ),
        ]);
        super::fire_due(&hub.inner, &mut queue, now);
        assert!(waiters[0].is_pending(), "the due wake-up fired");
        assert!(!waiters[1].is_pending(), "the later one did not");
        assert_eq!(queue.len(), 1);
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
