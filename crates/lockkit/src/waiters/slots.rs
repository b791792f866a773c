//! Sharded mode: noticing that a waited channel's slot moved to another node.
//!
//! When a slot moves to another node (resharding: `CLUSTER SETSLOT … NODE`), the old owner drops
//! the slot's shard subscriptions and tells the subscriber with an `sunsubscribe` push. fred 10.1
//! gives no signal for that push (`check_pubsub_message` drops every `sunsubscribe` frame as an
//! "unused subscription response", and its tracked shard channels do not change), so the hub
//! watches the slot owners instead: it records the owner of each waited channel's slot when it
//! subscribes, and re-reads the subscriber client's routing table whenever fred reports a
//! cluster-state change (a `MOVED` makes fred re-read `CLUSTER SLOTS`) and, while anyone waits,
//! every [`CHECK_INTERVAL`] after a `CLUSTER SLOTS` of its own (a pure waiter sends nothing
//! that could draw a `MOVED`). When a slot's owner changed, the hub subscribes to that slot's
//! channels again (fred routes the `SSUBSCRIBE` to the new owner) and wakes their waiters to
//! re-check, since a release published on the new owner before that was missed.
//!
//! Owns: the slot owners recorded at `SSUBSCRIBE` ([`record_owner`]) and the checks that compare
//! them with the routing table ([`spawn_check`]). Does not own: subscribing and the events that
//! trigger a check (the transport, [`super::transport`]), nor the waiters it wakes (the table and
//! [`super::wake`]).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{ClusterInterface, PubsubInterface};
use fred::types::config::Server;
use lockkit_protocol::slot::key_slot;

use super::HubInner;

/// How often, while at least one task waits, the hub re-reads the cluster's slot owners to
/// notice a slot that moved (see the module documentation).
pub(super) const CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// Records where the `SSUBSCRIBE` of `channel` goes, as far as the client knows: a later change of
/// owner means the subscription was dropped (see [`check_slot_owners`]). The first record of a
/// slot stands until a check replaces it.
pub(super) fn record_owner(hub: &HubInner, channel: &str) {
    let slot = key_slot(channel);
    let owner = slot_owner(&hub.sub, slot);
    hub.slot_owners.lock().entry(slot).or_insert(owner);
}

/// The node serving `slot` according to the subscriber client's routing table.
fn slot_owner(sub: &SubscriberClient, slot: u16) -> Option<Server> {
    sub.cached_cluster_state()
        .and_then(|state| state.get_server(slot).cloned())
}

/// Runs [`check_slot_owners`] in the background unless a check is already running.
pub(super) fn spawn_check(hub: Arc<HubInner>, refresh: bool) {
    if hub.checking.swap(true, Ordering::AcqRel) {
        return;
    }
    tokio::spawn(async move {
        check_slot_owners(&hub, refresh).await;
        hub.checking.store(false, Ordering::Release);
    });
}

/// Finds the waited and listened shard channels whose slot moved to another node since the hub
/// subscribed, subscribes to them again (on the new owner), wakes their waiters to re-check and
/// tells their listeners that messages may have been missed. `refresh`
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
    // Listened channels (an election's observers) move with their slot too.
    for channel in hub.listened.lock().keys() {
        waited
            .entry(key_slot(channel))
            .or_default()
            .push(channel.clone());
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
        let mut channels: Vec<fred::types::Key> = hub
            .channels
            .lock()
            .channels()
            .filter(|channel| key_slot(channel) == slot)
            .map(|channel| channel.to_owned().into())
            .collect();
        let listened: Vec<String> = hub
            .listened
            .lock()
            .keys()
            .filter(|channel| key_slot(channel) == slot)
            .cloned()
            .collect();
        channels.extend(listened.iter().map(|channel| channel.clone().into()));
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
        for channel in listened {
            // No listener left: nothing to tell.
            let _ = hub.moved.send(channel);
        }
    }
}

#[cfg(test)]
mod tests {
    use fred::types::config::Server;
    use lockkit_protocol::slot::key_slot;

    use super::check_slot_owners;
    use crate::Client;

    /// Sharded mode: a slot-owner check re-subscribes and wakes the waiters of a slot whose owner
    /// changed since the hub subscribed (a release published on the new owner meanwhile was
    /// missed), and leaves the waiters of a slot whose owner did not change asleep.
    #[tokio::test]
    async fn a_slot_check_wakes_the_waiters_of_a_moved_slot_and_no_others() {
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
}
