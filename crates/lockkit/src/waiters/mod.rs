//! The waiter hub: event-driven waiting on release channels, one subscriber connection per client.
//!
//! This file is what the rest of the crate uses: [`WaiterHub`] (register a waiter, count the
//! waiters) and [`Waiter`] (wait to be woken, report a try, leave by being dropped). The hub's
//! parts, each in its own file:
//!
//! - [`transport`]: the subscriber connection. Subscribe and confirm, unsubscribe after the
//!   linger, resubscribe after a reconnect, and the dispatcher reading the message stream;
//!   classic or sharded pub/sub.
//! - [`slots`]: sharded mode. Noticing that a waited channel's slot moved to another node.
//! - [`table`]: the bookkeeping. Who waits where, the counts, each wake-up's state (pending, in
//!   hand), idle channels and their retirement.
//! - [`wake`]: the wake policy. Whom each release message wakes, hand-on to a smaller need, the
//!   end-of-window wake-ups.
//!
//! The table and the wake policy do no I/O and hold no lock (the hub keeps the table behind one
//! mutex), so the model checker (`crate::shuttle_tests`) drives them with a fake transport.
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
//! Each release message says whom to wake (`lockkit_protocol::wake::Wake`): usually **one** local
//! waiter of that channel, the longest-registered one not already woken (no thundering herd); `k`
//! of them when `k` permits came back; all of them when every waiter must re-check; or the one
//! waiter named by id (fair lock; a lock's reservation). A woken waiter that goes away without
//! using up its wake-up (before it ran, or while its try was in flight) passes it on; one that is
//! refused hands it to a waiter that needs less ([`Waiter::tried`]). When messages may have been
//! lost (the broadcast channel lagged, or the subscriber connection was re-established) every
//! waiter is woken to re-check; after a reconnect, once the hub has subscribed again to every
//! channel it tracks. The rules and their reasons are in [`wake`].
//!
//! **Outages.** When either of the client's connections is lost (closed, broken, or a
//! reconnection failed), every waiter of the client is woken at once, whatever channel it waits
//! on: its next try then fails within the command timeout if Redis is still gone, so no waiter
//! sleeps through an outage until a holder's lease would have ended. This is the one place where
//! a lost connection reaches the waiters, for every primitive. A Redis that stops answering
//! without closing anything (frozen, paused) sends no event: the waiters' own looks at least
//! every recheck interval find it ([`crate::acquire`]).
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
mod transport;
mod wake;

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use fred::clients::SubscriberClient;
use fred::interfaces::EventInterface;
use fred::types::config::Server;
use lockkit_protocol::wake::Grant;
use parking_lot::Mutex;
use tokio::sync::{Notify, OnceCell};
use tokio_util::sync::CancellationToken;

use crate::error::Error;
use table::{WaitTable, WaiterId};

/// The connection errors of one fred client ([`EventInterface::error_rx`]): a connection
/// closed or broken, a reconnection that failed.
pub(crate) type ConnectionErrors =
    tokio::sync::broadcast::Receiver<(fred::error::Error, Option<Server>)>;

/// The events of the client's command connection the hub follows: its losses wake every waiter,
/// and with its reconnections they make the client's one "lost" and one "back" event.
pub(crate) struct CommandEvents {
    pub(crate) errors: ConnectionErrors,
    pub(crate) reconnects: tokio::sync::broadcast::Receiver<Server>,
}

/// The client's waiter hub.
pub(crate) struct WaiterHub {
    inner: Arc<HubInner>,
    /// Cancelled once the dispatcher has closed the subscriber connection (its `QUIT` answered
    /// or failed): [`Client::shutdown`](crate::Client::shutdown) waits for it.
    sub_closed: CancellationToken,
}

struct HubInner {
    sub: SubscriberClient,
    /// `SSUBSCRIBE` rather than `SUBSCRIBE`.
    sharded: bool,
    /// The waiters, with each channel's subscription (initialised once it is confirmed).
    channels: Mutex<WaitTable<Arc<OnceCell<()>>>>,
    /// Serialises subscribing, unsubscribing and resubscribing ([`transport`]).
    subscribe_lock: tokio::sync::Mutex<()>,
    /// Sharded mode: the owner of each waited channel's slot when the hub last looked (`None`:
    /// not known then; [`slots`]).
    slot_owners: Mutex<HashMap<u16, Option<Server>>>,
    /// A slot-owner check is running (at most one at a time; [`slots`]).
    checking: AtomicBool,
    /// The runtime the client was built on (the hub's dispatcher runs there): a waiter dropped
    /// outside any runtime still schedules its channel's retirement through it.
    runtime: tokio::runtime::Handle,
    /// The channels [`Listener`]s listen to, with their number of listeners (an election's
    /// change channel, one entry however many observers it has).
    listened: Mutex<HashMap<String, usize>>,
    /// Sharded mode: the listened channels whose slot moved, sent once the hub has subscribed
    /// to them again on the new owner (their listeners may have missed messages; [`slots`]).
    moved: tokio::sync::broadcast::Sender<String>,
}

impl WaiterHub {
    /// The runtime the client was built on: what a `Drop` that must send something (a waiter
    /// leaving its line, a leader resigning) spawns onto, since it may run outside any runtime
    /// (a future or guard dropped on a plain thread), where `Handle::try_current` finds none.
    pub(crate) fn runtime(&self) -> &tokio::runtime::Handle {
        &self.inner.runtime
    }

    /// Starts the hub on a connected subscriber client; `closed` stops it and closes the
    /// connection. `command_errors` are the connection errors of the client's command
    /// connection: like the subscriber connection's own, each wakes every waiter
    /// ([`transport::dispatch`]). `sharded` selects sharded pub/sub (`SSUBSCRIBE`).
    ///
    /// Must be called inside a tokio runtime (the client's `build`): the hub runs there.
    pub(crate) fn start(
        sub: SubscriberClient,
        commands: CommandEvents,
        sharded: bool,
        closed: CancellationToken,
        outage: Arc<crate::core::Outage>,
    ) -> Self {
        let runtime = tokio::runtime::Handle::current();
        let inner = Arc::new(HubInner {
            sub: sub.clone(),
            sharded,
            channels: Mutex::new(WaitTable::default()),
            subscribe_lock: tokio::sync::Mutex::new(()),
            slot_owners: Mutex::new(HashMap::new()),
            checking: AtomicBool::new(false),
            runtime: runtime.clone(),
            listened: Mutex::new(HashMap::new()),
            moved: tokio::sync::broadcast::channel(64).0,
        });
        let lost = transport::Lost {
            subscriber: sub.error_rx(),
            commands: commands.errors,
            commands_back: commands.reconnects,
            outage,
        };
        let sub_closed = CancellationToken::new();
        runtime.spawn(transport::dispatch(
            Arc::downgrade(&inner),
            sub,
            lost,
            closed,
            sub_closed.clone(),
        ));
        Self { inner, sub_closed }
    }

    /// Returns once the subscriber connection is closed (after the client was closed).
    pub(crate) async fn sub_closed(&self) {
        self.sub_closed.cancelled().await;
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
        if !subscribed.initialized() {
            // The subscription runs in a task of its own, not in this registrant's future: a
            // registrant whose task stops being polled mid-way (user code that blocks its task,
            // `block_in_place` in one branch of a `join!` while this branch subscribes) must not
            // hold up the other waiters of the channel, or every subscription of the hub (found
            // by `tests/model_scopes.rs`: a waiter's registration waited on a frozen one's until
            // its bound ran out). Each registrant awaits its own task; the first to run
            // subscribes, the others find the cell initialised or wait for it.
            let hub = Arc::clone(&self.inner);
            let cell = Arc::clone(&subscribed);
            let name = channel.to_owned();
            let task = self.inner.runtime.spawn(async move {
                cell.get_or_try_init(|| transport::subscribe(&hub, &name))
                    .await
                    .map(|_| ())
            });
            match task.await {
                Ok(result) => result?,
                Err(err) => {
                    if err.is_panic() {
                        tracing::error!(%channel, "the subscription task panicked");
                    }
                    return Err(Error::Shutdown);
                }
            }
        }
        Ok(waiter)
    }

    /// Listens to every message of `channel` on the hub's subscriber connection, which wakes
    /// no waiter with them: returns once the subscription is confirmed. The listener gets the
    /// connection's messages and reconnect events from before the subscription on, so nothing
    /// published after it returns is missed unless it reports a reconnect or a lag. The channel
    /// is unsubscribed once its last listener is dropped.
    pub(crate) async fn listen(&self, channel: &str) -> Result<Listener, Error> {
        let listener = Listener {
            messages: self.inner.sub.message_rx(),
            reconnects: self.inner.sub.reconnect_rx(),
            errors: self.inner.sub.error_rx(),
            moved: self.inner.moved.subscribe(),
            hub: Arc::clone(&self.inner),
            channel: channel.to_owned(),
        };
        *self
            .inner
            .listened
            .lock()
            .entry(channel.to_owned())
            .or_default() += 1;
        // Dropped on an error: the count goes back down.
        listener.resubscribe().await?;
        Ok(listener)
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

/// A listener of one channel ([`WaiterHub::listen`]): the subscriber connection's messages (of
/// every channel: the listener picks its own) and reconnect events.
pub(crate) struct Listener {
    hub: Arc<HubInner>,
    channel: String,
    /// Every message the subscriber connection receives.
    pub(crate) messages: tokio::sync::broadcast::Receiver<fred::types::Message>,
    /// The subscriber connection's reconnects: messages may have been lost meanwhile.
    pub(crate) reconnects: tokio::sync::broadcast::Receiver<Server>,
    /// The subscriber connection's errors: a connection that broke (`Some(server)`), an attempt
    /// to connect again that failed (`None`). On a cluster they may be about any node's
    /// connection (see [`Listener::one_connection`]).
    pub(crate) errors: tokio::sync::broadcast::Receiver<(fred::error::Error, Option<Server>)>,
    /// Listened channels whose slot moved to another node (sharded mode): the old owner dropped
    /// the subscription, so messages may have been lost until the hub subscribed again.
    pub(crate) moved: tokio::sync::broadcast::Receiver<String>,
}

impl Listener {
    /// The channel listened to.
    pub(crate) fn channel(&self) -> &str {
        &self.channel
    }

    /// Subscribes to the channel again and waits for the confirmation (after a reconnect: the
    /// hub re-subscribes too, but a listener must know when it is done before it re-reads).
    /// The future owns what it needs, so the listener's receivers stay free meanwhile.
    pub(crate) fn resubscribe(
        &self,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send + 'static {
        let hub = Arc::clone(&self.hub);
        let channel = self.channel.clone();
        async move { transport::subscribe(&hub, &channel).await }
    }

    /// Whether the subscriber client has one connection (a standalone server, or the primary
    /// that Sentinel names), so that each of its [`errors`](Listener::errors) is about the
    /// connection that carries this channel; on a cluster it has one per node.
    pub(crate) fn one_connection(&self) -> bool {
        use fred::interfaces::ClientLike as _;
        !self.hub.sub.is_clustered()
    }

    /// A `PING` on the subscriber connection that carries the channel's messages (on a cluster:
    /// the node of the channel's slot in sharded mode, else the node the classic subscriptions
    /// go to): whether that connection still answers. A connection can stay open to a server
    /// that answers nothing (frozen, `CLIENT PAUSE`), which no connection event reports.
    /// Bounded by fred's command timeout only; the caller puts its own deadline around it.
    pub(crate) fn ping(
        &self,
    ) -> impl std::future::Future<Output = Result<(), Error>> + Send + 'static {
        let hub = Arc::clone(&self.hub);
        let channel = self.channel.clone();
        async move {
            use fred::interfaces::ClientLike as _;
            use fred::types::{ClusterHash, CustomCommand, Value};
            let answered = if hub.sub.is_clustered() {
                let slot = if hub.sharded {
                    lockkit_protocol::slot::key_slot(&channel)
                } else {
                    lockkit_protocol::slot::key_slot(hub.sub.id())
                };
                let ping = CustomCommand::new_static("PING", ClusterHash::Custom(slot), false);
                hub.sub.custom::<Value, Vec<Value>>(ping, Vec::new()).await
            } else {
                hub.sub.ping::<Value>(None).await
            };
            answered.map(drop).map_err(crate::error::redis("observe"))
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let last = {
            let mut listened = self.hub.listened.lock();
            match listened.get_mut(&self.channel) {
                Some(count) if *count > 1 => {
                    *count -= 1;
                    false
                }
                Some(_) => {
                    listened.remove(&self.channel);
                    true
                }
                None => false,
            }
        };
        if last {
            let hub = Arc::downgrade(&self.hub);
            let channel = std::mem::take(&mut self.channel);
            self.hub.runtime.spawn(transport::unlisten(hub, channel));
        }
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
    /// Resolves when a release on the channel woke this waiter (possibly before this call),
    /// with the lock a release granted it, if it did (a lock's direct grant). The wake-up is then
    /// in hand: the next try settles it ([`tried`](Waiter::tried)); dropped before that, the
    /// waiter passes it on.
    pub(crate) async fn woken(&self) -> Option<Grant> {
        self.signal.notified().await;
        self.hub.channels.lock().take_wake(&self.channel, self.id)
    }

    /// This waiter's try ended, `refused` or not. A wake-up it had in hand is used up; if the
    /// try was refused, it goes on to the longest-registered waiter of the channel that needs
    /// less and is not already woken (see [`wake`]).
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
        self.hub.runtime.spawn(transport::retire(hub, channel));
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

    pub(super) fn woken(waiters: &[Waiter]) -> usize {
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
}
