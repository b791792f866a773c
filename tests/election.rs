//! The election (issue 22): one leader at a time, FIFO among candidates, terms that only grow,
//! proclaim/resign/leader, lost leadership, cancel safety, `lead`, and the observer stream.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use lockkit::protocol::keys::Kind;
use lockkit::{Error, Leader, LeaderChange, Observer};
use lockkit_suite::{client, client_with, redis, spawned, unique, until_waiters_in_redis, within};
use lockkit_testkit::FaultProxy;

const HANG: Duration = Duration::from_secs(60);

fn leader(term: u64, value: &str) -> Leader {
    Leader {
        term,
        value: value.to_owned(),
    }
}

/// The observer's next item (a hang guard around it).
async fn next(observer: &mut Observer) -> LeaderChange {
    within(HANG, "the observer's next change", observer.next())
        .await
        .expect("the stream goes on")
        .expect("no error")
}

#[tokio::test]
async fn at_most_one_leader_at_a_time_under_contention_and_terms_increase() {
    let redis = redis().await;
    let name = unique("election-contention");
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for candidate in 0..6 {
        let client = client(&redis.url()).await;
        let (name, leading, terms) = (name.clone(), leading.clone(), terms.clone());
        tasks.push(tokio::spawn(async move {
            let election = client.election(&name);
            for round in 0..8 {
                let leadership = election
                    .campaign(format!("{candidate}/{round}"))
                    .await
                    .unwrap();
                let others = leading.fetch_add(1, Ordering::SeqCst);
                assert_eq!(others, 0, "two leaders at once");
                {
                    // The checker: this leader's term is the current one (greater than every
                    // earlier leader's), and the record says so.
                    let mut terms = terms.lock().unwrap();
                    if let Some(last) = terms.last() {
                        assert!(
                            leadership.term() > *last,
                            "term {} after {last}",
                            leadership.term()
                        );
                    }
                    terms.push(leadership.term());
                }
                let current = election.leader().await.unwrap();
                assert_eq!(
                    current,
                    Some(leader(leadership.term(), &format!("{candidate}/{round}")))
                );
                tokio::task::yield_now().await;
                leading.fetch_sub(1, Ordering::SeqCst);
                leadership.resign().await.unwrap();
            }
        }));
    }
    for task in tasks {
        within(HANG, "the candidates", task).await.unwrap();
    }
    assert_eq!(terms.lock().unwrap().len(), 48);
}

#[tokio::test]
async fn candidates_are_elected_in_the_order_they_campaigned() {
    let redis = redis().await;
    let name = unique("election-fifo");
    let first = client(&redis.url()).await;
    let holder = first.election(&name).campaign("holder").await.unwrap();
    let (order_tx, mut order_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for candidate in 0..4 {
        let client = client(&redis.url()).await;
        let (own_name, order) = (name.clone(), order_tx.clone());
        tasks.push(tokio::spawn(async move {
            let leadership = client
                .election(&own_name)
                .campaign(candidate.to_string())
                .await
                .unwrap();
            order.send(candidate).unwrap();
            leadership.resign().await.unwrap();
        }));
        // Each candidate is in line before the next one campaigns.
        until_waiters_in_redis(&first, Kind::Election, &name, candidate + 1).await;
    }
    holder.resign().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(
            within(HANG, "the next leader", order_rx.recv())
                .await
                .unwrap(),
        );
    }
    assert_eq!(order, vec![0, 1, 2, 3]);
    for task in tasks {
        task.await.unwrap();
    }
}

/// The leader's lease (300 s) is far longer than the hang guard: the next candidate leads only
/// because the resignation handed over.
#[tokio::test]
async fn resign_hands_over_without_waiting_for_the_lease() {
    let redis = redis().await;
    let name = unique("election-resign");
    let a = client(&redis.url()).await;
    let b = client(&redis.url()).await;
    let leadership = a
        .election(&name)
        .campaign_with_lease("a", Duration::from_secs(300))
        .await
        .unwrap();
    let election = b.election(&name);
    let next = tokio::spawn(async move { election.campaign("b").await });
    until_waiters_in_redis(&a, Kind::Election, &name, 1).await;
    let term = leadership.term();
    leadership.resign().await.unwrap();
    let next = within(HANG, "the next leader", next)
        .await
        .unwrap()
        .unwrap();
    assert!(next.term() > term);
    assert_eq!(
        b.election(&name).leader().await.unwrap(),
        Some(leader(next.term(), "b"))
    );
    next.resign().await.unwrap();
    assert_eq!(b.election(&name).leader().await.unwrap(), None);
}

#[tokio::test]
async fn terms_strictly_increase_across_an_empty_restart_and_a_restore_from_an_older_snapshot() {
    let mut server = spawned().await;
    let name = unique("election-restore");
    let mut seen = Vec::new();
    async fn term_of(url: &str, name: &str) -> u64 {
        let client = client(url).await;
        let leadership = within(HANG, "campaign", client.election(name).campaign("x"))
            .await
            .unwrap();
        let term = leadership.term();
        leadership.resign().await.unwrap();
        client.shutdown().await.unwrap();
        term
    }
    seen.push(term_of(&server.url(), &name).await);
    let saved = server.command(&["SAVE"]).await.unwrap();
    assert!(!saved.is_error(), "SAVE: {saved:?}");
    for _ in 0..4 {
        seen.push(term_of(&server.url(), &name).await);
    }
    // Restored from the snapshot: the token counter is back at the first term.
    server.restart_from_disk().await.unwrap();
    let before = *seen.iter().max().unwrap();
    let after_restore = term_of(&server.url(), &name).await;
    assert!(after_restore > before, "{after_restore} after {seen:?}");
    seen.push(after_restore);
    // Restarted empty: no counter at all.
    server.restart_empty().await.unwrap();
    let after_empty = term_of(&server.url(), &name).await;
    assert!(after_empty > after_restore, "{after_empty} after {seen:?}");
    seen.push(after_empty);
    assert!(seen.windows(2).all(|pair| pair[0] < pair[1]), "{seen:?}");
}

#[tokio::test]
async fn leader_follows_campaign_proclaim_and_resign() {
    let redis = redis().await;
    let name = unique("election-leader");
    let client = client(&redis.url()).await;
    let election = client.election(&name);
    assert_eq!(election.leader().await.unwrap(), None);
    let leadership = election.campaign("").await.unwrap();
    assert_eq!(leadership.value(), "");
    assert_eq!(
        election.leader().await.unwrap(),
        Some(leader(leadership.term(), ""))
    );
    leadership.proclaim("v:2 with spaces").await.unwrap();
    assert_eq!(leadership.value(), "v:2 with spaces");
    assert_eq!(
        election.leader().await.unwrap(),
        Some(leader(leadership.term(), "v:2 with spaces")),
        "proclaim keeps the term"
    );
    leadership.resign().await.unwrap();
    assert_eq!(election.leader().await.unwrap(), None);
}

#[tokio::test]
async fn proclaim_is_refused_once_the_lease_was_lost() {
    let redis = redis().await;
    let name = unique("election-proclaim-lost");
    let client = client(&redis.url()).await;
    let election = client.election(&name);
    let leadership = election
        .campaign_with_lease("a", Duration::from_millis(300))
        .await
        .unwrap();
    within(HANG, "the fixed lease to run out", leadership.lost()).await;
    assert!(leadership.is_lost());
    // The local deadline is never later than Redis' own, so wait until Redis agrees too.
    within(HANG, "the hold to be gone in Redis", async {
        while election.leader().await.unwrap().is_some() {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let refused = leadership.proclaim("b").await;
    assert!(matches!(refused, Err(Error::NotHeld { .. })), "{refused:?}");
    assert_eq!(leadership.value(), "a");
    assert_eq!(election.leader().await.unwrap(), None);
    assert!(matches!(
        leadership.resign().await,
        Err(Error::NotHeld { .. })
    ));
}

/// The leader's client is cut off (its proxy stops forwarding): its renewals do not arrive,
/// `lost()` fires, and another candidate leads with a greater term.
#[tokio::test]
async fn lost_fires_when_the_leaders_lease_runs_out_and_another_candidate_leads() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let name = unique("election-lost");
    let cut_off = client_with(&proxy.url(), Duration::from_millis(600)).await;
    let other = client(&server.url()).await;
    let leadership = cut_off.election(&name).campaign("a").await.unwrap();
    let election = other.election(&name);
    let next = tokio::spawn(async move { election.campaign("b").await });
    until_waiters_in_redis(&other, Kind::Election, &name, 1).await;
    proxy.pause();
    within(HANG, "lost()", leadership.lost()).await;
    assert!(leadership.is_lost());
    let next = within(HANG, "the next leader", next)
        .await
        .unwrap()
        .unwrap();
    assert!(next.term() > leadership.term());
    assert_eq!(
        other.election(&name).leader().await.unwrap(),
        Some(leader(next.term(), "b"))
    );
    proxy.resume();
    // The deposed leader, reachable again, cannot announce over the new one.
    let stale = leadership.proclaim("stale").await;
    assert!(matches!(stale, Err(Error::NotHeld { .. })), "{stale:?}");
    assert_eq!(
        other.election(&name).leader().await.unwrap(),
        Some(leader(next.term(), "b"))
    );
    next.resign().await.unwrap();
}

#[tokio::test]
async fn a_dropped_campaign_leaves_no_candidacy_and_no_leadership() {
    let redis = redis().await;
    let name = unique("election-cancel");
    let holder = client(&redis.url()).await;
    let dropped = client(&redis.url()).await;
    let leadership = holder.election(&name).campaign("holder").await.unwrap();
    let election = dropped.election(&name);
    let waiting = tokio::time::timeout(Duration::from_millis(200), election.campaign("gone")).await;
    assert!(waiting.is_err(), "still waiting when dropped");
    until_waiters_in_redis(&holder, Kind::Election, &name, 0).await;
    leadership.resign().await.unwrap();
    assert_eq!(holder.election(&name).leader().await.unwrap(), None);
    let objects = holder.inspect(Some(Kind::Election), &name).await.unwrap();
    assert!(
        objects.iter().all(|object| object.holders.is_empty()),
        "{objects:?}"
    );
    // A campaign dropped once it leads: its leadership is resigned in the background.
    let granted = election.campaign("dropped after the grant").await.unwrap();
    drop(granted);
    let next = within(
        HANG,
        "the dropped leadership to be given back",
        holder.election(&name).campaign("next"),
    )
    .await
    .unwrap();
    next.resign().await.unwrap();
}

#[tokio::test]
async fn an_observer_ends_with_shutdown_when_the_client_shuts_down() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let mut observer = client.election(unique("election-shutdown")).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    client.shutdown().await.unwrap();
    assert!(matches!(
        within(HANG, "the observer", observer.next()).await,
        Some(Err(Error::Shutdown))
    ));
    assert!(observer.next().await.is_none(), "the stream ends");
}

#[tokio::test]
async fn bad_input_is_a_clear_error() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let empty = client.election("");
    assert!(matches!(
        empty.campaign("x").await,
        Err(Error::InvalidArgument(_))
    ));
    assert!(matches!(
        empty.leader().await,
        Err(Error::InvalidArgument(_))
    ));
    let mut observer = empty.observe();
    assert!(matches!(
        within(HANG, "the observer", observer.next()).await,
        Some(Err(Error::InvalidArgument(_)))
    ));
    assert!(observer.next().await.is_none(), "the stream ends");
    let election = client.election(unique("election-bad-lease"));
    let zero = election.campaign_with_lease("x", Duration::ZERO).await;
    assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{zero:?}");
    let zero = election
        .try_campaign("x", Duration::ZERO, Some(Duration::ZERO))
        .await;
    assert!(matches!(zero, Err(Error::InvalidArgument(_))), "{zero:?}");
    assert_eq!(election.leader().await.unwrap(), None);
}

/// 16 observers (on 4 clients) each see `Current` first, then every change once, in order: the
/// same sequence of terms for all.
#[tokio::test]
async fn observers_see_every_change_once_in_order_and_agree() {
    let redis = redis().await;
    let name = unique("election-observe");
    let mut observers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&redis.url()).await);
    }
    for i in 0..16 {
        let mut observer = clients[i % 4].election(&name).observe();
        assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
        observers.push(observer);
    }
    let a = client(&redis.url()).await;
    let b = client(&redis.url()).await;
    let first = a.election(&name).campaign("a").await.unwrap();
    first.proclaim("a2").await.unwrap();
    let t1 = first.term();
    let election = b.election(&name);
    let second = tokio::spawn(async move { election.campaign("b").await });
    until_waiters_in_redis(&a, Kind::Election, &name, 1).await;
    first.resign().await.unwrap();
    let second = within(HANG, "b leads", second).await.unwrap().unwrap();
    let t2 = second.term();
    second.resign().await.unwrap();
    let expected = vec![
        LeaderChange::Elected(leader(t1, "a")),
        LeaderChange::Proclaimed(leader(t1, "a2")),
        LeaderChange::Resigned { term: t1 },
        LeaderChange::Elected(leader(t2, "b")),
        LeaderChange::Resigned { term: t2 },
    ];
    for observer in &mut observers {
        let mut seen = Vec::new();
        for _ in 0..expected.len() {
            seen.push(next(observer).await);
        }
        assert_eq!(seen, expected);
    }
    // Nothing more: a third leader's election is the very next item.
    let third = a.election(&name).campaign("c").await.unwrap();
    for observer in &mut observers {
        assert_eq!(
            next(observer).await,
            LeaderChange::Elected(leader(third.term(), "c"))
        );
    }
    third.resign().await.unwrap();
}

/// An observer that joins while a leader leads starts from it, and a message of that leader
/// still in flight is not delivered again.
#[tokio::test]
async fn an_observer_starts_from_the_current_leader() {
    let redis = redis().await;
    let name = unique("election-observe-current");
    let client = client(&redis.url()).await;
    let leadership = client.election(&name).campaign("a").await.unwrap();
    leadership.proclaim("a2").await.unwrap();
    let mut observer = client.election(&name).observe();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Current(Some(leader(leadership.term(), "a2")))
    );
    leadership.proclaim("a3").await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Proclaimed(leader(leadership.term(), "a3"))
    );
    let term = leadership.term();
    leadership.resign().await.unwrap();
    assert_eq!(next(&mut observer).await, LeaderChange::Resigned { term });
}

#[tokio::test]
async fn observers_resync_after_the_subscriber_connection_is_killed() {
    let server = spawned().await;
    let name = unique("election-resync");
    let watcher = client(&server.url()).await;
    let candidate = client(&server.url()).await;
    let mut observer = watcher.election(&name).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let leadership = candidate.election(&name).campaign("a").await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(leadership.term(), "a"))
    );
    lockkit_testkit::send_command(server.addr(), &["CLIENT", "KILL", "TYPE", "pubsub"])
        .await
        .unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Resynced(Some(leader(leadership.term(), "a")))
    );
    // Subscribed again: the next change arrives.
    leadership.proclaim("a2").await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Proclaimed(leader(leadership.term(), "a2"))
    );
    leadership.resign().await.unwrap();
}

/// `lead` runs the body while leading; when leadership is lost the body is dropped and `lead`
/// campaigns again; when the body returns, it resigns and returns the body's result.
#[tokio::test]
async fn lead_stops_the_body_when_leadership_is_lost_campaigns_again_and_returns_the_result() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let name = unique("election-lead");
    let leader_client = client_with(&proxy.url(), Duration::from_millis(600)).await;
    let other = client(&server.url()).await;
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    struct Dropped(tokio::sync::mpsc::UnboundedSender<&'static str>);
    impl Drop for Dropped {
        fn drop(&mut self) {
            let _ = self.0.send("stopped");
        }
    }
    let election = leader_client.election(&name);
    let runs = Arc::new(AtomicUsize::new(0));
    let lead = {
        let runs = runs.clone();
        tokio::spawn(async move {
            election
                .lead("pod", move |leadership| {
                    let events = events_tx.clone();
                    let run = runs.fetch_add(1, Ordering::SeqCst);
                    async move {
                        let _dropped = Dropped(events.clone());
                        events.send("started").unwrap();
                        if run == 0 {
                            // The first term runs until it is stopped.
                            std::future::pending::<()>().await;
                        }
                        assert!(!leadership.is_lost());
                        Ok::<u64, Error>(leadership.term())
                    }
                })
                .await
        })
    };
    assert_eq!(
        within(HANG, "the body", events.recv()).await,
        Some("started")
    );
    let first = other.election(&name).leader().await.unwrap().unwrap();
    proxy.pause();
    assert_eq!(
        within(HANG, "the body to be stopped", events.recv()).await,
        Some("stopped")
    );
    proxy.resume();
    assert_eq!(
        within(HANG, "the body again", events.recv()).await,
        Some("started")
    );
    let term = within(HANG, "lead to return", lead).await.unwrap().unwrap();
    assert!(term > first.term, "{term} after {}", first.term);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(
        other.election(&name).leader().await.unwrap(),
        None,
        "resigned"
    );
}

#[tokio::test]
async fn campaign_observe_and_resign_on_a_cluster() {
    let cluster = match lockkit_testkit::RedisCluster::start(3, 0).await {
        Ok(cluster) => cluster,
        Err(err) => panic!("cannot start a cluster: {err}"),
    };
    let name = unique("election-cluster");
    let a = client(&cluster.url()).await;
    let b = client(&cluster.url()).await;
    let mut observer = b.election(&name).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let leadership = a.election(&name).campaign("a").await.unwrap();
    let term = leadership.term();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(term, "a"))
    );
    assert_eq!(
        b.election(&name).leader().await.unwrap(),
        Some(leader(term, "a"))
    );
    leadership.resign().await.unwrap();
    assert_eq!(next(&mut observer).await, LeaderChange::Resigned { term });
    assert_eq!(b.election(&name).leader().await.unwrap(), None);
}

/// On a cluster with sharded pub/sub, the change channel's slot moves to another node by live
/// resharding: the old owner drops the observer's subscription. The client notices the move,
/// subscribes again on the new owner and says so (`Resynced`); the next leader is then seen.
/// (Before, listeners were not among the channels whose slot moves the client watches: the
/// observer never heard of another change.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_observer_follows_its_channel_to_another_node_when_the_slot_moves() {
    let cluster = match lockkit_testkit::RedisCluster::start(3, 0).await {
        Ok(cluster) => cluster,
        Err(err) => panic!("cannot start a redis cluster: {err}"),
    };
    let url = cluster.url();
    let (a, b) = (client(&url).await, client(&url).await);
    if b.pubsub_mode() != lockkit::PubSubMode::Sharded {
        // Classic pub/sub (Redis 6.2): subscriptions are not tied to a slot; nothing to follow.
        eprintln!("skipped: the cluster has no sharded pub/sub");
        return;
    }
    let name = unique("election-moved");
    let mut observer = b.election(&name).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let key = lockkit::protocol::keys::Namespace::default()
        .object(Kind::Election, &name)
        .unwrap()
        .key;
    let slot = lockkit::protocol::slot::key_slot(&key);
    let from = cluster.node_for_slot(slot).await.expect("slot served");
    let to = (from + 1) % cluster.primaries();
    within(HANG, "the slot migration", cluster.migrate_slot(slot, to))
        .await
        .unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Resynced(None),
        "the observer says it may have missed changes once it is subscribed on the new owner"
    );
    let leadership = a.election(&name).campaign("a").await.unwrap();
    let term = leadership.term();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(term, "a"))
    );
    leadership.resign().await.unwrap();
    assert_eq!(next(&mut observer).await, LeaderChange::Resigned { term });
}

/// Through sentinels, and across a forced failover: the same clients campaign, observe (a
/// reconnect: `Resynced`) and resign on the new primary, and terms keep growing.
#[tokio::test]
async fn campaign_observe_and_resign_through_sentinels_across_a_failover() {
    let mut group = match lockkit_testkit::RedisSentinelGroup::start(1, 3).await {
        Ok(group) => group,
        Err(err) => panic!("cannot start a sentinel group: {err}"),
    };
    let name = unique("election-sentinel");
    let a = client(&group.url()).await;
    let b = client(&group.url()).await;
    let mut observer = b.election(&name).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let first = a.election(&name).campaign("a").await.unwrap();
    let t1 = first.term();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(t1, "a"))
    );
    first.resign().await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Resigned { term: t1 }
    );

    within(HANG, "failover", group.failover()).await.unwrap();
    let second = within(
        HANG,
        "campaign after the failover",
        a.election(&name).campaign("a2"),
    )
    .await
    .unwrap();
    assert!(second.term() > t1);
    // The observer's connection may be re-established by the failover: it then reads the
    // leader again (`Resynced`, maybe more than once) and goes on.
    let elected = LeaderChange::Elected(leader(second.term(), "a2"));
    let current = LeaderChange::Resynced(Some(leader(second.term(), "a2")));
    skip_resyncs_until(&mut observer, &[elected, current]).await;
    assert_eq!(
        b.election(&name).leader().await.unwrap(),
        Some(leader(second.term(), "a2"))
    );
    let t2 = second.term();
    second.resign().await.unwrap();
    let resigned = LeaderChange::Resigned { term: t2 };
    skip_resyncs_until(&mut observer, &[resigned, LeaderChange::Resynced(None)]).await;
}

/// Reads the observer until one of `wanted` comes; only `Resynced` items may come before it.
async fn skip_resyncs_until(observer: &mut Observer, wanted: &[LeaderChange]) {
    loop {
        let seen = next(observer).await;
        if wanted.contains(&seen) {
            return;
        }
        assert!(
            matches!(seen, LeaderChange::Resynced(_)),
            "{seen:?}, wanted {wanted:?}"
        );
    }
}

/// Measures (prints, asserts nothing about time) how long after a leader's `resign()` 16
/// observers see the next leader's `Elected`, over 60 handovers between two candidates.
#[tokio::test]
async fn measure_handover_to_sixteen_observers() {
    let redis = redis().await;
    let name = unique("election-measure");
    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(client(&redis.url()).await);
    }
    let mut observers = Vec::new();
    for i in 0..16 {
        let mut observer = clients[i % 4].election(&name).observe();
        assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
        observers.push(observer);
    }
    let candidates = [client(&redis.url()).await, client(&redis.url()).await];
    let mut leadership = candidates[0].election(&name).campaign("0").await.unwrap();
    for observer in &mut observers {
        assert!(matches!(next(observer).await, LeaderChange::Elected(_)));
    }
    let mut samples = Vec::new();
    for round in 1..=60 {
        let election = candidates[round % 2].election(&name);
        let waiting = tokio::spawn(async move { election.campaign(round.to_string()).await });
        until_waiters_in_redis(&clients[0], Kind::Election, &name, 1).await;
        let start = tokio::time::Instant::now();
        let old = leadership.term();
        leadership.resign().await.unwrap();
        let mut seen = HashMap::new();
        for (i, observer) in observers.iter_mut().enumerate() {
            loop {
                match next(observer).await {
                    LeaderChange::Resigned { term } => assert_eq!(term, old),
                    LeaderChange::Elected(leader) => {
                        assert!(leader.term > old);
                        seen.insert(i, start.elapsed());
                        break;
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
        samples.push(seen.values().max().copied().unwrap_or_default());
        leadership = within(HANG, "the next leader", waiting)
            .await
            .unwrap()
            .unwrap();
    }
    leadership.resign().await.unwrap();
    samples.sort();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    println!(
        "election handover, resign() to the last of 16 observers seeing Elected, {} handovers: \
         p50 {:?}, p99 {:?}, max {:?}",
        samples.len(),
        at(0.5),
        at(0.99),
        samples.last().copied().unwrap_or_default()
    );
}

// === Issue 27 (§1 items 3 and 4, §3 item 14): the observer's position, terms that never go
// === back for one client, and an observer that speaks up during an outage.

/// The change channel of the election called `name` (default prefix).
fn changes_channel(name: &str) -> String {
    let keys = lockkit::protocol::keys::Namespace::default()
        .object(Kind::Election, name)
        .expect("a valid election name");
    lockkit::protocol::election::changes_channel(&keys)
}

/// Until the server at `addr` has at least one subscriber on `channel` (the observer's
/// `SUBSCRIBE` was processed). A hang guard, not a time bound.
async fn until_subscribed(addr: std::net::SocketAddr, channel: &str) {
    within(HANG, "the observer's subscription", async {
        loop {
            let reply = lockkit_testkit::send_command(addr, &["PUBSUB", "NUMSUB", channel])
                .await
                .unwrap();
            let count = reply
                .as_array()
                .and_then(|items| items.get(1))
                .and_then(|count| count.as_int());
            if count.is_some_and(|count| count >= 1) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
}

/// The observer's next item that is not an error (errors are what an observer yields while
/// Redis does not answer); with how many errors came before it.
async fn next_after_errors(observer: &mut Observer) -> (LeaderChange, usize) {
    let mut errors = 0;
    loop {
        match within(HANG, "the observer's next change", observer.next()).await {
            Some(Ok(change)) => return (change, errors),
            Some(Err(Error::Redis(_))) => errors += 1,
            other => panic!("the stream goes on with changes or Redis errors: {other:?}"),
        }
    }
}

/// Issue 27, item 3: an observer whose first read found nobody leading used to have no position,
/// so it delivered every message still in flight from before its read: `Current(None)`, then
/// `Elected(a)` and `Resigned(a)`, both published before the read. The read now also says where
/// the change channel stands when nobody leads (the token counter), and those are dropped.
///
/// The observer's client is on a slow link (600 ms each way), so between its subscription
/// reaching Redis and its read reaching Redis lie at least two crossings of the link (the
/// confirming `PING`'s answer, then the read): `a` is elected and resigns in between, on a
/// client with a direct connection.
#[tokio::test]
async fn i27_an_observer_whose_read_found_nobody_drops_what_was_published_before_the_read() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let name = unique("election-i27-position");
    let watcher = client(&proxy.url()).await;
    let candidate = client(&server.url()).await;
    proxy.set_delay(Duration::from_millis(600));
    let mut observer = watcher.election(&name).observe();
    let first = tokio::spawn(async move {
        let first = next(&mut observer).await;
        (first, observer)
    });
    until_subscribed(server.addr(), &changes_channel(&name)).await;
    let a = candidate.election(&name).campaign("a").await.unwrap();
    a.resign().await.unwrap();
    let (first, mut observer) = within(HANG, "the first item", first).await.unwrap();
    assert_eq!(
        first,
        LeaderChange::Current(None),
        "a resigned before the read"
    );
    proxy.set_delay(Duration::ZERO);
    let b = candidate.election(&name).campaign("b").await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(b.term(), "b")),
        "a's Elected and Resigned were published before the read: dropped"
    );
    let term = b.term();
    b.resign().await.unwrap();
    assert_eq!(next(&mut observer).await, LeaderChange::Resigned { term });
}

/// Issue 27, item 4: after Redis restarts from a snapshot saved while `a` led, `a`'s hold and
/// record are back (live for the rest of `a`'s lease), though `a` resigned and `b` led with a
/// greater term since. A client that saw `b`'s term does not report `a` any more: `leader()`
/// answers `None`, its observers `Resynced(None)` and `Current(None)`, until a leader with a
/// greater term than `b`'s is elected (new terms still exceed every earlier one), which they all
/// report. A client that never saw `b` reports what Redis says.
#[tokio::test]
async fn i27_terms_one_client_saw_never_go_back_after_a_restore_from_an_older_snapshot() {
    let mut server = spawned().await;
    let name = unique("election-i27-restore");
    let watcher = client(&server.url()).await;
    // a's lease: 10 s, renewed every 3.3 s, so its hold is live in the snapshot for the rest of
    // the test's restart, and ends by itself soon after.
    let a_client = client_with(&server.url(), Duration::from_secs(10)).await;
    let b_client = client(&server.url()).await;
    let election = watcher.election(&name);
    let mut observer = election.observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let a = a_client.election(&name).campaign("a").await.unwrap();
    let term_a = a.term();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(term_a, "a"))
    );
    let saved = server.command(&["SAVE"]).await.unwrap();
    assert!(!saved.is_error(), "SAVE: {saved:?}");
    let b_election = b_client.election(&name);
    let b = tokio::spawn(async move { b_election.campaign("b").await });
    until_waiters_in_redis(&watcher, Kind::Election, &name, 1).await;
    a.resign().await.unwrap();
    let b = within(HANG, "b leads", b).await.unwrap().unwrap();
    let term_b = b.term();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Resigned { term: term_a }
    );
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(term_b, "b"))
    );
    assert_eq!(election.leader().await.unwrap(), Some(leader(term_b, "b")));

    server.restart_from_disk().await.unwrap();
    let fresh = client(&server.url()).await;
    assert_eq!(
        fresh.election(&name).leader().await.unwrap(),
        Some(leader(term_a, "a")),
        "the premise: Redis names a again (its restored hold is live)"
    );
    assert_eq!(
        election.leader().await.unwrap(),
        None,
        "the watcher saw term {term_b}: a's term {term_a} is not reported"
    );
    let (resynced, _) = next_after_errors(&mut observer).await;
    assert_eq!(resynced, LeaderChange::Resynced(None));
    let mut late = election.observe();
    assert_eq!(next(&mut late).await, LeaderChange::Current(None));

    // New terms still increase: once a's restored hold has run out its lease, the next leader's
    // term exceeds b's, and everyone reports it.
    drop(b);
    let c_client = client(&server.url()).await;
    let c = within(
        HANG,
        "c leads once a's restored hold ended",
        c_client.election(&name).campaign("c"),
    )
    .await
    .unwrap();
    assert!(c.term() > term_b, "term {} after {term_b}", c.term());
    let elected = LeaderChange::Elected(leader(c.term(), "c"));
    assert_eq!(next(&mut observer).await, elected);
    assert_eq!(next(&mut late).await, elected);
    assert_eq!(
        election.leader().await.unwrap(),
        Some(leader(c.term(), "c"))
    );
    assert_eq!(
        fresh.election(&name).leader().await.unwrap(),
        Some(leader(c.term(), "c"))
    );
    c.resign().await.unwrap();
}

/// How Redis stops answering in the outage cases.
#[derive(Debug, Clone, Copy)]
enum Outage {
    /// The process is killed (`SIGKILL`): connections break, reconnections are refused.
    Killed,
    /// The process is stopped (`SIGSTOP`): connections stay open, nothing is answered.
    Frozen,
    /// `CLIENT PAUSE … ALL`: connections stay open, no command is answered until the pause ends.
    Paused,
}

/// The command timeout of the outage cases.
const OUTAGE_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// How long `CLIENT PAUSE` pauses Redis 7.0, which answers nothing, not even `CLIENT UNPAUSE`,
/// meanwhile: far longer than the observer's promise (the command timeout plus 1 s). That the
/// error came first is checked against an event, a `PING` sent during the pause.
const PAUSE: Duration = Duration::from_secs(12);

/// Issue 27, item 14: an observer used to stay silent for a whole outage (it yielded `Resynced`
/// after a restart, nothing while Redis was down or frozen). Now it yields an error while Redis
/// does not answer, tries again, and yields `Resynced` once Redis answers, then goes on.
async fn an_observer_reports_an_outage_and_resyncs_after_it(outage: Outage) {
    let mut server = spawned().await;
    let name = unique("election-i27-outage");
    let watcher = lockkit::Client::builder()
        .url(server.url())
        .command_timeout(OUTAGE_COMMAND_TIMEOUT)
        .build()
        .await
        .unwrap();
    let candidate = client(&server.url()).await;
    let mut observer = watcher.election(&name).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let a = candidate.election(&name).campaign("a").await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(a.term(), "a"))
    );
    // Redis stops answering; the observer must say so before Redis answers again.
    let back = match outage {
        Outage::Killed => {
            server.kill();
            None
        }
        Outage::Frozen => {
            server.pause().unwrap();
            None
        }
        Outage::Paused => {
            let pause = PAUSE.as_millis().to_string();
            let paused =
                lockkit_testkit::send_command(server.addr(), &["CLIENT", "PAUSE", &pause, "ALL"])
                    .await
                    .unwrap();
            assert!(!paused.is_error(), "CLIENT PAUSE: {paused:?}");
            // Answered only once the pause is over: the event "Redis answers again".
            let addr = server.addr();
            Some(tokio::spawn(async move {
                lockkit_testkit::send_command(addr, &["PING"]).await
            }))
        }
    };
    let item = match back {
        None => within(HANG, "an item during the outage", observer.next()).await,
        Some(mut back) => tokio::select! {
            item = observer.next() => item,
            _ = &mut back => panic!("Redis answered again before the observer said anything"),
        },
    };
    match item {
        Some(Err(Error::Redis(err))) => {
            assert_eq!(err.object(), Some(name.as_str()), "{err}");
            println!("{outage:?}: the observer yielded: {err}");
        }
        other => panic!("{outage:?}: an error while Redis does not answer, got {other:?}"),
    }
    match outage {
        Outage::Killed => server.start_again().await.unwrap(),
        Outage::Frozen => server.resume().unwrap(),
        Outage::Paused => {}
    }
    let (resynced, errors) = next_after_errors(&mut observer).await;
    println!("{outage:?}: {errors} more error(s), then {resynced:?}");
    let expected = match outage {
        // The restarted server is empty (nothing was saved).
        Outage::Killed => LeaderChange::Resynced(None),
        Outage::Frozen | Outage::Paused => LeaderChange::Resynced(Some(leader(a.term(), "a"))),
    };
    assert_eq!(resynced, expected);
    // And it goes on: the next change arrives.
    drop(a);
    let b = client(&server.url()).await;
    let b = within(HANG, "b leads", b.election(&name).campaign("b"))
        .await
        .unwrap();
    let (elected, _) = next_after_errors(&mut observer).await;
    let elected = match elected {
        LeaderChange::Resigned { .. } => next(&mut observer).await,
        other => other,
    };
    assert_eq!(elected, LeaderChange::Elected(leader(b.term(), "b")));
    b.resign().await.unwrap();
}

#[tokio::test]
async fn i27_an_observer_reports_a_killed_server_and_resyncs_after_its_restart() {
    an_observer_reports_an_outage_and_resyncs_after_it(Outage::Killed).await;
}

#[tokio::test]
async fn i27_an_observer_reports_a_frozen_server_and_resyncs_after_it_resumes() {
    an_observer_reports_an_outage_and_resyncs_after_it(Outage::Frozen).await;
}

#[tokio::test]
async fn i27_an_observer_reports_a_paused_server_and_resyncs_after_the_pause() {
    an_observer_reports_an_outage_and_resyncs_after_it(Outage::Paused).await;
}

/// Issue 27, item 4's data-loss window (measured for `docs/reliability.md`, "After data loss"):
/// after `FLUSHALL` while `a` leads, a new campaign leads at once, with a greater term (the
/// counter is seeded again from the server clock), and `a` learns that it lost at its next
/// watchdog round (a third of its 3 s watchdog timeout at most); until then both believe they
/// lead, which is why writes must be fenced with the term. An observer and `leader()` follow the
/// new leader (its term is greater than the one they saw). The times are printed, not asserted.
#[tokio::test]
async fn i27_after_flushall_a_new_leader_leads_at_once_and_the_old_one_learns_at_its_next_renewal()
{
    let server = spawned().await;
    let name = unique("election-i27-flushall");
    let a_client = client_with(&server.url(), Duration::from_secs(3)).await;
    let b_client = client(&server.url()).await;
    let watcher = client(&server.url()).await;
    let mut observer = watcher.election(&name).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let a = a_client.election(&name).campaign("a").await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(a.term(), "a"))
    );
    let a_lost = a.lost();
    let flushed = server.command(&["FLUSHALL"]).await.unwrap();
    assert!(!flushed.is_error(), "FLUSHALL: {flushed:?}");
    let start = tokio::time::Instant::now();
    let b = within(HANG, "b leads", b_client.election(&name).campaign("b"))
        .await
        .unwrap();
    let b_elected = start.elapsed();
    let a_still_leads = !a.is_lost();
    within(HANG, "a learns it lost", a_lost).await;
    let a_learned = start.elapsed();
    println!(
        "after FLUSHALL: b elected after {b_elected:?} (a still believed it led: \
         {a_still_leads}), a learned it lost after {a_learned:?} (watchdog timeout 3 s)"
    );
    assert!(b.term() > a.term(), "{} after {}", b.term(), a.term());
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(b.term(), "b"))
    );
    assert_eq!(
        watcher.election(&name).leader().await.unwrap(),
        Some(leader(b.term(), "b"))
    );
    assert!(matches!(a.resign().await, Err(Error::NotHeld { .. })));
    b.resign().await.unwrap();
}

// === issue 27, §1: the leader record's lifetime, re-sent proclaims, the lead loop ===

/// The election's keys (the default prefix).
fn election_keys(name: &str) -> lockkit::protocol::keys::ObjectKeys {
    lockkit::protocol::keys::Namespace::default()
        .object(Kind::Election, name)
        .unwrap()
}

/// A client with these watchdog and token counter TTLs.
async fn client_ttl(url: &str, watchdog: Duration, counter_ttl: Duration) -> lockkit::Client {
    lockkit::Client::builder()
        .url(url)
        .watchdog_timeout(watchdog)
        .token_counter_ttl(counter_ttl)
        .build()
        .await
        .unwrap()
}

/// The leader record's `field`.
async fn record_field(url: &str, name: &str, field: &str) -> Option<String> {
    use fred::interfaces::HashesInterface;
    let keys = election_keys(name);
    lockkit_suite::raw(url)
        .await
        .hget(keys.aux("leader").unwrap(), field)
        .await
        .unwrap()
}

/// At one instant (one `MULTI`): the expiry of the leader's hold (from its marker's value in the
/// main key) and the leader record's `PEXPIRETIME`.
async fn hold_and_record_expiry(
    addr: std::net::SocketAddr,
    name: &str,
    marker: &str,
) -> (i64, i64) {
    let keys = election_keys(name);
    let replies = lockkit_testkit::send_commands(
        addr,
        &[
            vec!["MULTI"],
            vec!["HGET", &keys.key, marker],
            vec!["PEXPIRETIME", keys.aux("leader").unwrap()],
            vec!["EXEC"],
        ],
    )
    .await
    .unwrap();
    let exec = replies[3].as_array().expect("an EXEC reply");
    let hold = exec[0].as_str().expect("the hold is there");
    let hold_expiry = hold.split(' ').next().unwrap().parse().unwrap();
    (hold_expiry, exec[1].as_int().unwrap())
}

/// Issue 27, §1.1: the leader record lives exactly as long as the leadership it names. It expires
/// with its hold (not after the token counter TTL), and every renewal of the hold moves the
/// record's expiry with it. Measured on server state: the hold's expiry (in the main key) and the
/// record's `PEXPIRETIME`, read in one `MULTI` (Redis 7.0+; `scripts/test` does not run it on 6.2,
/// where the next test checks the record's lifetime without it).
#[tokio::test]
async fn the_leader_record_expires_with_its_hold_and_follows_every_renewal() {
    let server = spawned().await;
    let name = unique("election-record-lifetime");
    let leader_client = client_ttl(
        &server.url(),
        Duration::from_millis(900),
        Duration::from_secs(60),
    )
    .await;
    let leadership = leader_client.election(&name).campaign("a").await.unwrap();
    let marker = record_field(&server.url(), &name, "marker").await.unwrap();
    let (hold, record) = hold_and_record_expiry(server.addr(), &name, &marker).await;
    assert_eq!(record, hold, "the record expires with the hold");
    // Three renewals (every 300 ms): the record's expiry follows each.
    let mut last = hold;
    for renewal in 0..3 {
        let (hold, record) = within(HANG, "the next renewal", async {
            loop {
                let (hold, record) = hold_and_record_expiry(server.addr(), &name, &marker).await;
                if hold > last {
                    return (hold, record);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        assert_eq!(
            record, hold,
            "renewal {renewal}: the record follows the hold"
        );
        last = hold;
    }
    assert!(!leadership.is_lost());
    leadership.resign().await.unwrap();
}

/// Issue 27, §1.1: a leader that leads longer than the token counter TTL (60 s, the shortest the
/// builder accepts) without proclaiming is still the leader for everyone: `leader()` names it, a
/// new observer starts from it, and an observer running since its election receives its next
/// proclaim (before, the record expired after the TTL: `leader()` said `None`, the new observer
/// `Current(None)`, and the record came back at version 1, which the running observer dropped as
/// older than what it had delivered). The wait past the TTL is the TTL under test.
#[tokio::test]
async fn a_leader_that_leads_longer_than_the_token_counter_ttl_stays_the_leader_for_everyone() {
    let server = spawned().await;
    let name = unique("election-long-leader");
    let ttl = Duration::from_secs(60);
    let leader_client = client_ttl(&server.url(), Duration::from_secs(3), ttl).await;
    let watcher = client(&server.url()).await;
    let mut running = watcher.election(&name).observe();
    assert_eq!(next(&mut running).await, LeaderChange::Current(None));
    let leadership = leader_client.election(&name).campaign("a").await.unwrap();
    let term = leadership.term();
    assert_eq!(
        next(&mut running).await,
        LeaderChange::Elected(leader(term, "a"))
    );
    let clock = |reply: lockkit_testkit::RespValue| lockkit_suite::server_ms(&reply);
    let elected_at = clock(server.command(&["TIME"]).await.unwrap());
    tokio::time::sleep(ttl + Duration::from_secs(1)).await;
    let now = clock(server.command(&["TIME"]).await.unwrap());
    assert!(now > elected_at + ttl.as_millis() as u64, "past the TTL");
    assert!(!leadership.is_lost(), "renewed all along");

    assert_eq!(
        watcher.election(&name).leader().await.unwrap(),
        Some(leader(term, "a")),
        "leader() after the TTL"
    );
    let mut late = watcher.election(&name).observe();
    assert_eq!(
        next(&mut late).await,
        LeaderChange::Current(Some(leader(term, "a"))),
        "a new observer after the TTL"
    );
    leadership.proclaim("a2").await.unwrap();
    leadership.resign().await.unwrap();
    for observer in [&mut running, &mut late] {
        assert_eq!(
            next(observer).await,
            LeaderChange::Proclaimed(leader(term, "a2")),
            "the proclaim after the TTL is delivered"
        );
        assert_eq!(next(observer).await, LeaderChange::Resigned { term });
    }
}

/// A fred client subscribed to `channel`, and its messages.
async fn tap(
    url: &str,
    channel: &str,
) -> (
    fred::clients::Client,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
) {
    use fred::interfaces::{EventInterface, PubsubInterface};
    let listener = lockkit_suite::raw(url).await;
    let messages = listener.message_rx();
    listener.subscribe(channel).await.unwrap();
    (listener, messages)
}

/// Every message `channel` carried up to an `end` published on it now (so a message that should
/// not be there shows up before it).
async fn carried(
    addr: std::net::SocketAddr,
    messages: &mut tokio::sync::broadcast::Receiver<fred::types::Message>,
    channel: &str,
) -> Vec<String> {
    lockkit_testkit::send_command(addr, &["PUBLISH", channel, "end"])
        .await
        .unwrap();
    let mut seen = Vec::new();
    within(HANG, "the end of the channel's messages", async {
        loop {
            let message = messages.recv().await.unwrap();
            let text = message.value.as_string().unwrap_or_default();
            if text == "end" {
                return;
            }
            seen.push(text);
        }
    })
    .await;
    seen
}

/// Issue 27, §1.2: the reply to `proclaim("v2")` is lost with its connection (the proxy cuts it
/// after the request went through) and fred sends the call again. The value is announced once:
/// one `l:` message, one record version more, observers see `Proclaimed(v2)` once.
#[tokio::test]
async fn a_proclaim_whose_reply_is_lost_is_announced_once() {
    let server = spawned().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let name = unique("election-resent-proclaim");
    let channel = lockkit::protocol::election::changes_channel(&election_keys(&name));
    // No renewal round during the test: only the proclaim carries the value through the proxy.
    let leader_client = client_with(&proxy.url(), Duration::from_secs(3600)).await;
    let watcher = client(&server.url()).await;
    let (_tap, mut messages) = tap(&server.url(), &channel).await;
    let mut observer = watcher.election(&name).observe();
    assert_eq!(next(&mut observer).await, LeaderChange::Current(None));
    let leadership = leader_client.election(&name).campaign("v1").await.unwrap();
    let term = leadership.term();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Elected(leader(term, "v1"))
    );

    let value = unique("v2");
    proxy.cut_after_request_containing(value.as_str());
    within(HANG, "a proclaim across a cut", leadership.proclaim(&value))
        .await
        .unwrap();
    assert!(proxy.triggered(), "the reply was really lost");
    assert_eq!(
        carried(server.addr(), &mut messages, &channel).await,
        vec![format!("l:{term}:1:v1"), format!("l:{term}:2:{value}")],
        "announced once"
    );
    assert_eq!(
        record_field(&server.url(), &name, "version")
            .await
            .as_deref(),
        Some("2")
    );
    leadership.resign().await.unwrap();
    assert_eq!(
        next(&mut observer).await,
        LeaderChange::Proclaimed(leader(term, &value))
    );
    assert_eq!(next(&mut observer).await, LeaderChange::Resigned { term });
}

/// Issue 27, §1.2, the script itself: `election_proclaim` run twice through fred with the same
/// arguments (the same request id) answers `{1}` both times, writes and publishes once.
#[tokio::test]
async fn election_proclaim_run_twice_with_the_same_request_changes_nothing_the_second_time() {
    use fred::interfaces::HashesInterface;
    use fred::types::scripts::Script as FredScript;
    let server = spawned().await;
    let name = unique("election-proclaim-twice");
    let keys = election_keys(&name);
    let channel = lockkit::protocol::election::changes_channel(&keys);
    let leader_client = client(&server.url()).await;
    let leadership = leader_client.election(&name).campaign("v1").await.unwrap();
    let record_key = keys.aux("leader").unwrap().to_owned();
    let raw = lockkit_suite::raw(&server.url()).await;
    let record: HashMap<String, String> = raw.hgetall(&record_key).await.unwrap();
    let (_tap, mut messages) = tap(&server.url(), &channel).await;
    let script = FredScript::from_lua(lockkit::protocol::election::PROCLAIM.source());
    let args = vec![
        record["marker"].clone(),
        record["owner"].clone(),
        leadership.term().to_string(),
        "v2".to_owned(),
        channel.clone(),
        "0".to_owned(),
        "request-7".to_owned(),
    ];
    let record_keys = vec![keys.key.clone(), record_key.clone()];
    let mut replies = Vec::new();
    let mut states = Vec::new();
    for _ in 0..2 {
        let reply: Vec<i64> = script
            .evalsha_with_reload(&raw, record_keys.clone(), args.clone())
            .await
            .unwrap();
        replies.push(reply);
        let state: HashMap<String, String> = raw.hgetall(&record_key).await.unwrap();
        states.push(state);
    }
    assert_eq!(replies, vec![vec![1], vec![1]], "answered as the first did");
    assert_eq!(states[0], states[1], "the second run wrote nothing");
    assert_eq!(states[1]["version"], "2");
    assert_eq!(states[1]["value"], "v2");
    assert_eq!(
        carried(server.addr(), &mut messages, &channel).await,
        vec![format!("l:{}:2:v2", leadership.term())],
        "published once"
    );
    leadership.resign().await.unwrap();
}

/// What a `lead` body in these tests reports.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Led {
    /// A pod's body started leading in this term.
    Started(&'static str, u64),
    /// A pod's body saw `lost()`.
    Lost(&'static str, u64),
}

/// A pod that runs the guide's lead loop ("The lead loop" in docs/guide.md) as users copy it:
/// `select!` on the work and on `lost()`, then return `Ok(())`. Its work (`run_scheduler`)
/// reports that it started and runs until stopped.
fn guide_pod(
    client: &lockkit::Client,
    name: &str,
    pod: &'static str,
    events: tokio::sync::mpsc::UnboundedSender<Led>,
) -> tokio::task::JoinHandle<Result<(), Error>> {
    let election = client.election(name);
    tokio::spawn(async move {
        election
            .lead(pod, move |leadership| {
                let events = events.clone();
                async move {
                    let run_scheduler = |term: u64| {
                        let events = events.clone();
                        async move {
                            let _ = events.send(Led::Started(pod, term));
                            std::future::pending::<()>().await;
                        }
                    };
                    tokio::select! {
                        () = run_scheduler(leadership.term()) => {}
                        () = leadership.lost() => {
                            let _ = events.send(Led::Lost(pod, leadership.term()));
                        }
                    }
                    Ok::<(), lockkit::Error>(())
                }
            })
            .await
    })
}

/// The next event of the pods, failing at once if a pod's `lead` returns meanwhile.
async fn next_led(
    events: &mut tokio::sync::mpsc::UnboundedReceiver<Led>,
    pods: &mut [&mut tokio::task::JoinHandle<Result<(), Error>>],
) -> Led {
    within(HANG, "the pods' next event", async {
        let finished = futures::future::select_all(pods.iter_mut().map(|pod| &mut **pod));
        tokio::select! {
            event = events.recv() => event.expect("the pods report"),
            (result, pod, _) = finished => panic!("pod {pod}'s lead returned: {result:?}"),
        }
    })
    .await
}

/// Issue 27, §1.5: the guide's lead loop, copied as users copy it (its body returns `Ok(())` when
/// `lost()` fires), keeps the service led after a `FLUSHALL`: the pod whose leadership Redis lost
/// campaigns again (a body that returns after its leadership was lost is a loss, not an end), a
/// pod leads again with a greater term, the other waits in line, and neither `lead` returns.
/// (Before, the deposed pod's `lead` resigned and returned `Ok(())`: it never campaigned again.)
#[tokio::test]
async fn the_guides_lead_loop_keeps_the_service_led_after_a_flushall() {
    let server = spawned().await;
    let name = unique("election-guide-flushall");
    let watchdog = Duration::from_millis(900);
    let (a, b) = (
        client_with(&server.url(), watchdog).await,
        client_with(&server.url(), watchdog).await,
    );
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut pod_a = guide_pod(&a, &name, "a", events_tx.clone());
    let first = next_led(&mut events, &mut [&mut pod_a]).await;
    let Led::Started("a", t1) = first else {
        panic!("{first:?}");
    };
    let mut pod_b = guide_pod(&b, &name, "b", events_tx);
    until_waiters_in_redis(&a, Kind::Election, &name, 1).await;

    let flushed = server.command(&["FLUSHALL"]).await.unwrap();
    assert!(!flushed.is_error(), "{flushed:?}");
    assert_eq!(
        next_led(&mut events, &mut [&mut pod_a, &mut pod_b]).await,
        Led::Lost("a", t1)
    );
    let again = next_led(&mut events, &mut [&mut pod_a, &mut pod_b]).await;
    let Led::Started(pod, t2) = again else {
        panic!("{again:?}");
    };
    assert!(t2 > t1, "term {t2} after {t1}");
    // The other pod campaigns too: it waits in line, its lead still running.
    within(HANG, "the other pod back in line", async {
        tokio::select! {
            () = until_waiters_in_redis(&a, Kind::Election, &name, 1) => {}
            result = &mut pod_a => panic!("pod a's lead returned: {result:?}"),
            result = &mut pod_b => panic!("pod b's lead returned: {result:?}"),
        }
    })
    .await;
    assert_eq!(
        a.election(&name).leader().await.unwrap(),
        Some(leader(t2, pod))
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    for pod in [pod_a, pod_b] {
        let ended = within(HANG, "lead to end with the shutdown", pod).await;
        assert!(matches!(ended, Ok(Err(Error::Shutdown))), "{ended:?}");
    }
}

/// Issue 27, §1.5: `lead` rides out a Redis outage. Redis is killed while a pod leads: its
/// leadership is lost, its campaigns fail (each logged) and are tried again with a backoff, and
/// once Redis is back the pod leads again, with a greater term. (Before, the first failed
/// campaign ended `lead`: the pod never led again.)
#[tokio::test]
async fn lead_rides_out_a_redis_restart_and_leads_again() {
    let warnings = lockkit_suite::Warnings::default();
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    let mut server = spawned().await;
    let name = unique("election-lead-restart");
    let pod = lockkit::Client::builder()
        .url(server.url())
        .watchdog_timeout(Duration::from_millis(600))
        .command_timeout(Duration::from_secs(1))
        .build()
        .await
        .unwrap();
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut lead = guide_pod(&pod, &name, "a", events_tx);
    let first = next_led(&mut events, &mut [&mut lead]).await;
    let Led::Started("a", t1) = first else {
        panic!("{first:?}");
    };

    server.kill();
    assert_eq!(
        next_led(&mut events, &mut [&mut lead]).await,
        Led::Lost("a", t1)
    );
    within(HANG, "a campaign to fail while Redis is down", async {
        loop {
            if warnings
                .take()
                .iter()
                .any(|w| w.contains("campaign failed") && w.contains(&name))
            {
                return;
            }
            if lead.is_finished() {
                panic!("lead returned: {:?}", (&mut lead).await);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(!lead.is_finished(), "lead goes on through the outage");

    server.start_again().await.unwrap();
    let again = next_led(&mut events, &mut [&mut lead]).await;
    let Led::Started("a", t2) = again else {
        panic!("{again:?}");
    };
    assert!(t2 > t1, "term {t2} after {t1}");
    assert_eq!(
        pod.election(&name).leader().await.unwrap(),
        Some(leader(t2, "a"))
    );
    pod.shutdown().await.unwrap();
    let ended = within(HANG, "lead to end with the shutdown", lead).await;
    assert!(matches!(ended, Ok(Err(Error::Shutdown))), "{ended:?}");
}

/// Issue 27, §1.5: `lead` ends with `Error::Shutdown` when its client shuts down, whether the pod
/// leads (the shutdown ends its leadership: the body returns, and the campaign that follows
/// reports the shutdown) or waits in line.
#[tokio::test]
async fn lead_returns_shutdown_when_the_client_shuts_down() {
    let redis = redis().await;
    let name = unique("election-lead-shutdown");
    let (a, b) = (client(&redis.url()).await, client(&redis.url()).await);
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut leading = guide_pod(&a, &name, "a", events_tx.clone());
    let first = next_led(&mut events, &mut [&mut leading]).await;
    assert!(matches!(first, Led::Started("a", _)), "{first:?}");
    let waiting = guide_pod(&b, &name, "b", events_tx);
    until_waiters_in_redis(&a, Kind::Election, &name, 1).await;

    b.shutdown().await.unwrap();
    let ended = within(HANG, "the waiting pod's lead", waiting).await;
    assert!(matches!(ended, Ok(Err(Error::Shutdown))), "{ended:?}");
    a.shutdown().await.unwrap();
    let ended = within(HANG, "the leading pod's lead", leading).await;
    assert!(matches!(ended, Ok(Err(Error::Shutdown))), "{ended:?}");
}

/// The self-wait warnings about the election `name` among `warnings`.
fn election_self_waits(warnings: &[String], name: &str) -> Vec<String> {
    warnings
        .iter()
        .filter(|w| w.contains(name) && w.contains("acquired itself"))
        .cloned()
        .collect()
}

/// Issue 27, §1.6: campaigning again after a loss is no self-wait. A task whose leadership was
/// lost campaigns again while another pod leads, so it waits: no "this task waits for election
/// …, which it acquired itself" warning, whether it still holds its lost `Leadership` (Redis lost
/// it: `FLUSHALL`) or it runs `lead`, which campaigns again by itself (its pod was cut off past
/// its lease; the next campaign's first try reaches Redis once the other pod leads, while the
/// lost leadership's background resignation is still under way).
#[tokio::test]
async fn campaigning_again_after_a_lost_leadership_is_no_self_wait() {
    let warnings = lockkit_suite::Warnings::default();
    let _subscriber = tracing::subscriber::set_default(warnings.clone());
    let server = spawned().await;
    let watchdog = Duration::from_millis(900);
    let (a, b) = (
        client_with(&server.url(), watchdog).await,
        client_with(&server.url(), watchdog).await,
    );

    // The lost leadership is still held (its guard alive) when its task campaigns again.
    let name = unique("election-no-self-wait");
    let election = a.election(&name);
    let lost = election.campaign("a").await.unwrap();
    assert!(server.command(&["FLUSHALL"]).await.is_ok());
    within(HANG, "the loss", lost.lost()).await;
    let other = within(HANG, "b's campaign", b.election(&name).campaign("b"))
        .await
        .unwrap();
    let again = election
        .try_campaign("a again", Duration::from_millis(200), None)
        .await
        .unwrap();
    assert!(again.is_none(), "b leads");
    let seen = warnings.take();
    assert_eq!(election_self_waits(&seen, &name), Vec::<String>::new());
    other.resign().await.unwrap();
    drop(lost);

    // `lead`, its pod cut off past its lease while the other pod waits in line.
    let name = unique("election-lead-no-self-wait");
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let cut_off = lockkit::Client::builder()
        .url(proxy.url())
        .watchdog_timeout(Duration::from_millis(600))
        .command_timeout(Duration::from_secs(30))
        .build()
        .await
        .unwrap();
    let (events_tx, mut events) = tokio::sync::mpsc::unbounded_channel();
    let mut lead = guide_pod(&cut_off, &name, "a", events_tx);
    let first = next_led(&mut events, &mut [&mut lead]).await;
    let Led::Started("a", t1) = first else {
        panic!("{first:?}");
    };
    let election = b.election(&name);
    let other = tokio::spawn(async move { election.campaign("b").await });
    until_waiters_in_redis(&b, Kind::Election, &name, 1).await;
    proxy.pause();
    assert_eq!(
        next_led(&mut events, &mut [&mut lead]).await,
        Led::Lost("a", t1)
    );
    let other = within(HANG, "b leads", other).await.unwrap().unwrap();
    proxy.resume();
    within(HANG, "a back in line", async {
        tokio::select! {
            () = until_waiters_in_redis(&b, Kind::Election, &name, 1) => {}
            result = &mut lead => panic!("lead returned: {result:?}"),
        }
    })
    .await;
    other.resign().await.unwrap();
    let again = next_led(&mut events, &mut [&mut lead]).await;
    assert!(
        matches!(again, Led::Started("a", t2) if t2 > t1),
        "{again:?}"
    );
    let seen = warnings.take();
    assert_eq!(election_self_waits(&seen, &name), Vec::<String>::new());
    cut_off.shutdown().await.unwrap();
    let ended = within(HANG, "lead to end with the shutdown", lead).await;
    assert!(matches!(ended, Ok(Err(Error::Shutdown))), "{ended:?}");
}
