//! The watchdog: one background worker per client that renews every watchdog-mode hold, checks
//! fixed-lease holds, and releases the holds of dropped guards.
//!
//! Implementation notes for maintainers:
//!
//! - Renewal runs every `watchdog_timeout / 3`, **batched**: one `lock_renew` script call carries
//!   up to `batch` holds (grouped by cluster slot on a cluster, since a script may only touch one
//!   slot). A round still running when the next tick comes is not doubled up.
//! - On a cluster that is one script call per slot in use, not per node: Redis refuses a script
//!   whose keys span slots (`CROSSSLOT`), so a per-node batch would need one call per slot anyway.
//!   All calls of a round are issued at once; fred pipelines them on its one connection per
//!   primary, so a round costs about one round-trip time per node, not one per slot.
//! - Renewal cannot revive a released hold: the script extends a key only while the hold's own
//!   marker is in it, and the release deletes that marker atomically. A renewal reply for a hold
//!   that was unregistered in the meantime is ignored, so a released guard is never reported lost.
//! - A hold is lost when renewal finds its marker gone, or when its conservative local deadline
//!   (send time of the last successful acquire/renewal + lease) passes without a renewal.
//! - Releases of dropped guards (and of what an acquire cut off may have taken) come in over an
//!   unbounded channel (`Drop` cannot await) and run as tasks of the worker. Such a give-back
//!   keeps going until Redis answers ([`crate::hold::give_back`]): a frozen server that resumes
//!   first runs what it was sent before (a try that takes the object), then the give-back, so
//!   one cut off by a deadline would leave the object held for a whole lease. When every client
//!   handle and guard is gone, the worker stops them (each then takes at most the command
//!   timeout), then closes the Redis connection.
//! - Nothing piles up while Redis is down: a round still running skips the next tick, every
//!   renewal gives up after the command timeout, and a give-back has one command in flight at
//!   a time. The shutdown takes at most the command timeout: it releases the registered holds at
//!   once, all together, stops the give-backs under way (each is given at most the command
//!   timeout from then) and waits for them; it reports every hold of either kind that it could
//!   not give back ([`crate::Error::NotReleased`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::EventInterface;
use futures::future::join_all;
use lockkit_protocol::keys::Kind;
use lockkit_protocol::lock::decode_renew;
use lockkit_protocol::slot::key_slot;
use parking_lot::Mutex;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::exec::{Exec, Resend};
use crate::hold::{give_back, release, Hold};
use crate::hold_table::{HoldTable, Registered};

/// The holds being renewed or checked (see [`HoldTable`]: a hold granted after the shutdown
/// drained them is refused rather than registered into a registry nobody will release).
type Registry = Arc<Mutex<HoldTable<Arc<Hold>>>>;

impl Registered for Arc<Hold> {
    fn seq(&self) -> u64 {
        self.seq
    }
}

/// A hold the shutdown could not give back.
#[derive(Debug)]
pub(crate) struct Unreleased {
    /// Its object's name.
    pub(crate) name: Arc<str>,
    /// Whether it was granted; `false` for what an acquire cut short may have taken.
    pub(crate) granted: bool,
    /// Why it was not given back.
    pub(crate) err: crate::Error,
}

enum Command {
    Release(Arc<Hold>),
    Shutdown(oneshot::Sender<Vec<Unreleased>>),
}

/// Handle to the client's watchdog worker.
pub(crate) struct Watchdog {
    tx: mpsc::UnboundedSender<Command>,
    registry: Registry,
    /// Releases asked of the worker and not finished yet ([`release_in_background`]).
    pending: Arc<std::sync::atomic::AtomicUsize>,
}

/// One release asked of the worker ([`Watchdog::release_in_background`]): lowers the count when
/// dropped.
struct PendingRelease(Arc<AtomicUsize>);

impl Drop for PendingRelease {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Settings of the worker.
#[derive(Debug, Clone)]
pub(crate) struct WatchdogConfig {
    pub(crate) timeout: Duration,
    pub(crate) batch: usize,
    pub(crate) clustered: bool,
    /// The client's outage state: a renewal that fails while it is down is no warning of its own.
    pub(crate) outage: Arc<crate::core::Outage>,
}

impl Watchdog {
    /// Spawns the worker on the current tokio runtime.
    pub(crate) fn spawn(exec: Exec, config: WatchdogConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let registry = Registry::default();
        let pending = Arc::new(AtomicUsize::new(0));
        let worker = Worker {
            exec,
            config,
            registry: Arc::clone(&registry),
            rx,
            releases: JoinSet::new(),
            stop: CancellationToken::new(),
            round: None,
            pending: Arc::clone(&pending),
        };
        tokio::spawn(worker.run());
        Self {
            tx,
            registry,
            pending,
        }
    }

    /// Starts renewing (or checking) `hold`; `false` (and nothing registered) once the shutdown
    /// has taken the registry's holds.
    #[must_use]
    pub(crate) fn register(&self, hold: Arc<Hold>) -> bool {
        self.registry.lock().register(hold)
    }

    /// Stops renewing the hold `seq`.
    pub(crate) fn unregister(&self, seq: u64) {
        self.registry.lock().unregister(seq);
    }

    /// Stops renewing `hold` and gives it back in the background.
    pub(crate) fn release_in_background(&self, hold: Arc<Hold>) {
        self.unregister(hold.seq);
        // Counted before it is sent, so that no moment shows the worker idle while it is due.
        self.pending.fetch_add(1, Ordering::AcqRel);
        if let Err(mpsc::error::SendError(Command::Release(hold))) =
            self.tx.send(Command::Release(hold))
        {
            // The worker is gone (the client shut down): its lease runs out on its own.
            self.pending.fetch_sub(1, Ordering::AcqRel);
            hold.finish();
        }
    }

    /// Whether no release is asked of the worker or under way: the command connection is not
    /// needed any more once the last handle is gone.
    pub(crate) fn idle(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    /// The number of holds being renewed or checked.
    pub(crate) fn holds(&self) -> usize {
        self.registry.lock().len()
    }

    /// Stops renewing and releases every registered hold; returns the holds whose release failed
    /// (registered ones, and those of dropped guards whose release was still under way).
    pub(crate) async fn shutdown(&self) -> Vec<Unreleased> {
        let (done, finished) = oneshot::channel();
        if self.tx.send(Command::Shutdown(done)).is_err() {
            return Vec::new();
        }
        finished.await.unwrap_or_default()
    }
}

struct Worker {
    exec: Exec,
    config: WatchdogConfig,
    registry: Registry,
    rx: mpsc::UnboundedReceiver<Command>,
    /// Releases of dropped guards under way; each yields the hold it failed to give back.
    releases: JoinSet<Option<Unreleased>>,
    /// Cancelled when the client shuts down or is gone: the give-backs under way then end within
    /// the command timeout.
    stop: CancellationToken,
    round: Option<JoinHandle<()>>,
    /// The handle's count of releases asked and not finished: each release task lowers it.
    pending: Arc<AtomicUsize>,
}

impl Worker {
    async fn run(mut self) {
        let period = self.config.timeout / 3;
        let mut tick = tokio::time::interval_at(Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // After a reconnect, check every hold at once rather than at the next tick: a Redis that
        // restarted empty (or failed over) is then reported within one round trip.
        let mut reconnects = self.exec.redis().reconnect_rx();
        let mut reconnects_open = true;
        loop {
            tokio::select! {
                _ = tick.tick() => self.start_round(),
                reconnect = reconnects.recv(), if reconnects_open => match reconnect {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        tracing::debug!("reconnected; checking every hold now");
                        self.start_round();
                    }
                    Err(RecvError::Closed) => reconnects_open = false,
                },
                command = self.rx.recv() => match command {
                    Some(Command::Release(hold)) => self.spawn_release(hold),
                    Some(Command::Shutdown(done)) => {
                        self.stop.cancel();
                        let errors = self.release_all().await;
                        let _ = done.send(errors);
                        // No more renewals; keep serving the releases of guards that are still
                        // around (an acquire in flight during the shutdown gives its hold back
                        // through here) until the last handle is gone.
                        self.drain().await;
                        break;
                    }
                    None => break,
                },
                Some(_) = self.releases.join_next(), if !self.releases.is_empty() => {}
            }
        }
        if let Some(round) = self.round.take() {
            round.abort();
        }
        self.stop.cancel();
        while self.releases.join_next().await.is_some() {}
        // Closed already when the last handle went with no release under way
        // (`ClientInner`'s drop, `Exec::quit_now`); else now, after the last release.
        if !self.exec.quit_sent() {
            let _ = fred::interfaces::ClientLike::quit(self.exec.redis()).await;
        }
    }

    async fn drain(&mut self) {
        while let Some(command) = self.rx.recv().await {
            match command {
                Command::Release(hold) => self.spawn_release(hold),
                Command::Shutdown(done) => {
                    let _ = done.send(Vec::new());
                }
            }
        }
    }

    /// Gives back `hold` in a task, until Redis answers or the worker stops.
    fn spawn_release(&mut self, hold: Arc<Hold>) {
        let exec = self.exec.clone();
        let stop = self.stop.clone();
        // Lowered when the release ends, however it ends (also when the task is dropped).
        let pending = PendingRelease(Arc::clone(&self.pending));
        self.releases.spawn(async move {
            let _pending = pending;
            let result = give_back(&exec, &hold, &stop).await;
            let failed = match result {
                Ok(()) => {
                    tracing::debug!(name = %hold.name, "released a dropped guard");
                    None
                }
                Err(crate::Error::NotHeld { .. }) => {
                    tracing::debug!(name = %hold.name, "dropped guard's hold was already gone");
                    None
                }
                Err(err) => {
                    tracing::warn!(
                        name = %hold.name,
                        "could not release a dropped guard before the client stopped, its lease \
                         will run out: {}",
                        crate::error::Chain(&err)
                    );
                    unreleased(&hold, err)
                }
            };
            hold.finish();
            failed
        });
    }

    fn start_round(&mut self) {
        if self
            .round
            .as_ref()
            .is_some_and(|round| !round.is_finished())
        {
            tracing::debug!("previous renewal round still running; skipping this tick");
            return;
        }
        let holds = self.registry.lock().snapshot();
        if holds.is_empty() {
            return;
        }
        let exec = self.exec.clone();
        let registry = Arc::clone(&self.registry);
        let config = self.config.clone();
        self.round = Some(tokio::spawn(renew_round(exec, registry, config, holds)));
    }

    async fn release_all(&mut self) -> Vec<Unreleased> {
        if let Some(round) = self.round.take() {
            round.abort();
        }
        let holds = self.registry.lock().close();
        let exec = &self.exec;
        // Every release is bounded by the command timeout, and they all run at once.
        let results = join_all(holds.iter().map(|hold| async move {
            let result = release(exec, hold).await;
            let failed = match result {
                Ok(()) | Err(crate::Error::NotHeld { .. }) => None,
                Err(err) => unreleased(hold, err),
            };
            hold.finish();
            failed
        }))
        .await;
        let mut failed: Vec<Unreleased> = results.into_iter().flatten().collect();
        while let Some(joined) = self.releases.join_next().await {
            if let Ok(Some(hold)) = joined {
                failed.push(hold);
            }
        }
        failed
    }
}

/// Confirms a hold a release granted (direct grant) while it is on probation
/// ([`lockkit_protocol::lock::GRANT_PROBATION`]): `after` this long, unless it was released or
/// lost meanwhile, renews it with one call of its kind's renew script to `until`, the end of its
/// lease counted from the grant (not from the confirmation: a fixed lease lasts the lease asked
/// for, whoever granted it). Should that fail, its local deadline (the end of the probation)
/// marks it lost, as Redis drops it then.
pub(crate) fn confirm_later(exec: Exec, hold: Arc<Hold>, after: Duration, until: LeaseEnd) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        tokio::select! {
            () = hold.lost_signal() => return,
            () = tokio::time::sleep(after) => {}
        }
        if hold.is_lost() {
            return;
        }
        let keys: Vec<&str> = hold.keys.keys.iter().map(String::as_str).collect();
        // The renew scripts' absolute form: extend to this server instant.
        let target = format!("@{}", until.server_ms);
        let reply = exec
            .ints(
                hold.kind.renew,
                hold.kind.kind,
                &keys,
                &[&hold.marker, &target],
                Resend::Allowed,
            )
            .await
            .and_then(|reply| Ok(decode_renew(&reply, 1)?));
        match reply {
            Ok(present) if present == [true] => hold.confirmed_until(until.local),
            Ok(_) => hold.mark_lost("confirming a granted hold found it gone"),
            Err(err) => tracing::warn!(
                name = %hold.name,
                "could not confirm a granted hold; it ends with its probation: {}",
                crate::error::Chain(&err)
            ),
        }
    });
}

/// The end of a granted hold's lease, counted from its grant: by the server's clock (what the
/// confirmation asks Redis for) and by the local one (conservative: never later than the
/// server's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LeaseEnd {
    /// Server time, Unix ms.
    pub(crate) server_ms: u64,
    /// The same instant read against a local anchor, never later than the server's.
    pub(crate) local: Instant,
}

/// A failed release as the shutdown reports it: `None` for a hold known lost (its lease ran out
/// by the local clock, so Redis has freed it already, whatever the release did).
fn unreleased(hold: &Hold, err: crate::Error) -> Option<Unreleased> {
    if hold.is_lost() {
        None
    } else {
        Some(Unreleased {
            name: Arc::clone(&hold.name),
            granted: hold.was_granted(),
            err,
        })
    }
}

/// One renewal round over a snapshot of the registry.
async fn renew_round(
    exec: Exec,
    registry: Registry,
    config: WatchdogConfig,
    holds: Vec<Arc<Hold>>,
) {
    let now = Instant::now();
    // One script call may only touch one slot (on a cluster) and run one kind's renew script.
    // Kinds that share a renew script may differ in their number of keys per hold (the script's
    // stride), so the kind is part of the group too.
    let mut groups: HashMap<(&'static str, Kind, u16), Vec<Arc<Hold>>> = HashMap::new();
    for hold in holds {
        if hold.is_lost() {
            if now >= hold.expires_at() {
                hold.mark_lost(crate::hold::ran_out(hold.watchdog));
            }
            continue;
        }
        let slot = if config.clustered {
            key_slot(hold.key())
        } else {
            0
        };
        groups
            .entry((hold.kind.renew.name(), hold.kind.kind, slot))
            .or_default()
            .push(hold);
    }
    let batches = groups
        .into_values()
        .flat_map(|group| {
            group
                .chunks(config.batch.max(1))
                .map(<[Arc<Hold>]>::to_vec)
                .collect::<Vec<_>>()
        })
        .map(|batch| renew_batch(&exec, &registry, &config, batch));
    join_all(batches).await;
}

async fn renew_batch(
    exec: &Exec,
    registry: &Registry,
    config: &WatchdogConfig,
    batch: Vec<Arc<Hold>>,
) {
    let timeout = config.timeout;
    let Some(first) = batch.first() else {
        return;
    };
    let kind = first.kind;
    let keys: Vec<&str> = batch
        .iter()
        .flat_map(|hold| hold.keys.keys.iter().map(String::as_str))
        .collect();
    let lease = timeout.as_millis().to_string();
    let mut args: Vec<&str> = Vec::with_capacity(batch.len() * 2);
    for hold in &batch {
        args.push(&hold.marker);
        args.push(if hold.watchdog { &lease } else { "0" });
    }
    let sent = Instant::now();
    let reply = exec
        .ints(kind.renew, kind.kind, &keys, &args, Resend::Allowed)
        .await
        .and_then(|reply| Ok(decode_renew(&reply, batch.len())?));
    match reply {
        Ok(present) => {
            let mut renewed = 0;
            let gone = "renewal found the hold gone (expired, force-unlocked, or lost by Redis)";
            // Only holds still registered: one released while the round was in flight is skipped.
            registry
                .lock()
                .apply_reply(&batch, present, |hold, present| {
                    if !present {
                        hold.mark_lost(gone);
                    } else if hold.watchdog {
                        hold.confirmed_at(sent);
                        renewed += 1;
                    }
                });
            crate::metrics::renewed(kind.kind.segment(), renewed);
        }
        Err(err) => {
            if config.outage.is_down() {
                // The outage is reported once, by the waiter hub; a lease it costs is warned
                // of by `mark_lost`.
                tracing::debug!(
                    holds = batch.len(),
                    "lease renewal failed while the connection is down, will retry next tick: {}",
                    crate::error::Chain(&err)
                );
            } else {
                tracing::warn!(
                    holds = batch.len(),
                    "lease renewal failed, will retry next tick: {}",
                    crate::error::Chain(&err)
                );
            }
            let now = Instant::now();
            for hold in &batch {
                if now >= hold.expires_at() {
                    hold.mark_lost("the lease ran out while Redis could not be reached");
                }
            }
        }
    }
}
