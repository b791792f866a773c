//! [`Election`]: one leader at a time among candidates, announced with a value, fenced by its
//! term; [`Leadership`], the leader's guard; [`Observer`], the stream of leadership changes.
//!
//! An election's leadership is a fenced hold of its main key (see
//! [`lockkit_protocol::election`]): campaigning is acquiring the fenced-flavoured lock on the
//! election's keys (FIFO among candidates by the direct grant, per-hold leases, watchdog), the
//! term is the hold's fencing token, and the new leader then announces its value
//! (`election_proclaim`: the leader record and a message on the change channel).
//!
//! **Observing goes through the client's waiter hub.** An [`Observer`] subscribes to the
//! election's change channel on the subscriber connection the client already has (one
//! subscription per channel however many observers share it, unsubscribed when the last one
//! goes), and reads that connection's messages and reconnect events itself. A dedicated
//! subscriber connection per observer would cost a connection (and a handshake, TLS included)
//! per stream for nothing the shared one cannot carry; the hub already re-subscribes after a
//! reconnect and uses sharded pub/sub when the client does.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use lockkit_protocol::election::{self as protocol, Change, Record};
use lockkit_protocol::fenced_lock::{ACQUIRE, RELEASE};
use lockkit_protocol::keys::{Kind, ObjectKeys};
use lockkit_protocol::lock::RENEW;
use lockkit_protocol::DecodeError;
use tokio::sync::broadcast::error::RecvError;

use crate::core::ClientInner;
use crate::error::Error;
use crate::exec::Resend;
use crate::hold::{Hold, HoldKind};
use crate::lock::{Flavor, Lock, LockGuard, FENCED_LEAVE};
use crate::object::Object;
use crate::waiters::Listener;

/// The election's flavour of the reentrant lock: the fenced lock's scripts on the election's
/// keys (their first five are the fenced lock's).
static ELECTION: Flavor = Flavor {
    kind: Kind::Election,
    acquire: &ACQUIRE,
    holds: HoldKind {
        kind: Kind::Election,
        release: &RELEASE,
        renew: &RENEW,
    },
    leave: &FENCED_LEAVE,
};

/// The longest an [`Observer`] waits before it tries again after it failed to subscribe or to
/// read the leader.
const MAX_RETRY: Duration = Duration::from_secs(2);
/// The first such wait.
const FIRST_RETRY: Duration = Duration::from_millis(50);

/// A leader election shared by every client that uses the same name and Redis: at most one
/// candidate leads at a time, the others wait in line (FIFO), everyone can ask who leads or
/// [observe](Election::observe) the changes.
///
/// Get one with [`Client::election`](crate::Client::election). The handle is cheap,
/// `Clone + Send + Sync`, and sends nothing until used.
///
/// - [`campaign`](Election::campaign) waits to lead and returns a [`Leadership`] guard: its
///   [`term`](Leadership::term) is a fencing token (strictly increasing across leaders, never
///   repeated, also after Redis was restored from an older snapshot), and the leader announces a
///   value ([`proclaim`](Leadership::proclaim) changes it). [`resign`](Leadership::resign) hands
///   leadership to the next candidate at once; dropping the guard does the same in the
///   background.
/// - Leadership has a lease like every hold: renewed by the watchdog (the default), or fixed
///   ([`campaign_with_lease`](Election::campaign_with_lease)). When it is lost (the leader was
///   paused or cut off past its lease), [`Leadership::lost`] resolves, and another candidate
///   leads within one lease.
/// - [`lead`](Election::lead) is the loop a service that should always have a leader runs:
///   campaign, run the body while leading, stop it when leadership is lost, campaign again.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// let election = client.election("scheduler");
/// let leadership = election.campaign("pod-a").await?;
/// // Writes to storage carry the term: a deposed leader's late write has a smaller one.
/// let fence = leadership.term();
/// # let _ = fence;
/// leadership.resign().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    lock: Lock,
    object: Object,
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name())
            .finish()
    }
}

impl Election {
    pub(crate) fn new(client: Arc<ClientInner>, name: String) -> Self {
        Self {
            object: Object::new(Arc::clone(&client), Kind::Election, name.clone()),
            lock: Lock::with_flavor(client, name, &ELECTION),
        }
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.object.name
    }

    fn inner(&self) -> &Arc<ClientInner> {
        self.object.inner()
    }

    fn keys(&self) -> Result<&Arc<ObjectKeys>, Error> {
        self.object.keys()
    }

    /// Waits as long as it takes to lead, in FIFO order among the candidates (no starvation),
    /// then announces `value` (any string, the empty one included) and returns the leader's
    /// guard. Leadership is held in watchdog mode: renewed for as long as the guard lives.
    ///
    /// # Cancel safety
    /// Cancel-safe: dropping the future leaves no candidacy and no leadership behind (a
    /// leadership already granted is resigned in the background).
    ///
    /// # Errors
    /// [`Error::Redis`] when Redis fails, [`Error::Shutdown`] once the client is shut down,
    /// [`Error::InvalidArgument`] for an invalid name (empty, or too long),
    /// [`Error::WrongType`] when the election's keys hold something else.
    /// [`Error::NotHeld`] when leadership was lost between its grant and the announcement of
    /// `value` (its lease ran out in between): nothing was announced; campaign again.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// let leadership = client.election("shard:7").campaign("10.0.0.5:8080").await?;
    /// println!("leading shard 7 in term {}", leadership.term());
    /// # Ok(()) }
    /// ```
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership, Error> {
        let during = |err: Error| err.during("campaign");
        let guard = self.lock.lock().await.map_err(during)?;
        self.announce(guard, value.into()).await.map_err(during)
    }

    /// As [`campaign`](Election::campaign), holding leadership for `lease` without renewal:
    /// it ends by itself when the lease runs out, guard or no guard.
    ///
    /// # Cancel safety
    /// As [`campaign`](Election::campaign).
    ///
    /// # Errors
    /// As [`campaign`](Election::campaign); [`Error::InvalidArgument`] for a lease shorter than
    /// [`MIN_LEASE`](crate::MIN_LEASE) (1 ms, so a zero lease is refused) or over
    /// [`MAX_LEASE`](crate::MAX_LEASE).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// let election = client.election("scheduler");
    /// let leadership = election.campaign_with_lease("pod-a", Duration::from_secs(10)).await?;
    /// // Leads for at most 10 s.
    /// # drop(leadership);
    /// # Ok(()) }
    /// ```
    pub async fn campaign_with_lease(
        &self,
        value: impl Into<String>,
        lease: Duration,
    ) -> Result<Leadership, Error> {
        let during = |err: Error| err.during("campaign_with_lease");
        let guard = self.lock.lock_with_lease(lease).await.map_err(during)?;
        self.announce(guard, value.into()).await.map_err(during)
    }

    /// Campaigns, waiting at most `wait` to lead (`Duration::ZERO`: one try, never joins the
    /// line); `lease: None` is watchdog mode. `Ok(None)` when another candidate led all along.
    ///
    /// Returns within `wait` plus one round trip for a try in flight, as every `try_*` method
    /// (see [`Lock::try_lock`](crate::Lock::try_lock)).
    ///
    /// # Cancel safety
    /// As [`campaign`](Election::campaign).
    ///
    /// # Errors
    /// As [`campaign_with_lease`](Election::campaign_with_lease); a Redis that does not answer
    /// in time is an [`Error::Redis`], never `Ok(None)`.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use std::time::Duration;
    /// match client.election("scheduler").try_campaign("pod-a", Duration::ZERO, None).await? {
    ///     Some(leadership) => leadership.resign().await?,
    ///     None => println!("someone else leads"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn try_campaign(
        &self,
        value: impl Into<String>,
        wait: Duration,
        lease: Option<Duration>,
    ) -> Result<Option<Leadership>, Error> {
        let during = |err: Error| err.during("try_campaign");
        match self.lock.try_lock(wait, lease).await.map_err(during)? {
            Some(guard) => self
                .announce(guard, value.into())
                .await
                .map(Some)
                .map_err(during),
            None => Ok(None),
        }
    }

    /// The new leader's first announcement. The leadership guard exists before it is sent, so a
    /// campaign dropped meanwhile resigns (its drop) whether or not the announcement ran.
    async fn announce(&self, guard: LockGuard, value: String) -> Result<Leadership, Error> {
        let term = guard.fencing_token().ok_or_else(|| {
            Error::Protocol(DecodeError {
                script: ACQUIRE.name(),
                detail: "an election's leadership came without a term (fencing token)".into(),
            })
        })?;
        let hold = Arc::clone(guard.hold());
        let leadership = Leadership {
            shared: Arc::new(Shared {
                election: self.clone(),
                hold,
                term,
                value: parking_lot::Mutex::new(String::new()),
                proclaiming: tokio::sync::Mutex::new(()),
            }),
            guard: Some(guard),
            _leading: crate::metrics::Leading::new(Kind::Election.segment()),
        };
        leadership.shared.proclaim(value).await?;
        tracing::debug!(election = %self.name(), term, "elected");
        Ok(leadership)
    }

    /// The current leader: its term and the value it announced; `None` when nobody leads (or the
    /// leader has not announced itself yet: a new leader announces right after its grant).
    ///
    /// A leader whose lease ran out is not reported, even before another takes over.
    ///
    /// # Errors
    /// [`Error::Redis`], [`Error::Shutdown`], [`Error::InvalidArgument`] for an invalid name,
    /// [`Error::WrongType`] when the election's keys hold something else.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// if let Some(leader) = client.election("scheduler").leader().await? {
    ///     println!("{} leads (term {})", leader.value, leader.term);
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn leader(&self) -> Result<Option<Leader>, Error> {
        let record = self.record().await.map_err(|err| err.during("leader"))?;
        Ok(record.map(Leader::from))
    }

    async fn record(&self) -> Result<Option<Record>, Error> {
        let keys = self.keys()?;
        let reply = self
            .inner()
            .exec
            .strings(
                &protocol::LEADER,
                Kind::Election,
                &[&keys.key, leader_key(keys)],
                &[],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.naming(self.name()))?;
        Ok(protocol::decode_leader(&reply)?)
    }

    /// A stream of the election's leadership changes, in order, each once.
    ///
    /// The stream subscribes to the election's change channel when it is first polled, then
    /// reads the leader, and yields:
    /// 1. [`LeaderChange::Current`] with the leader at that moment (or `None`);
    /// 2. then every change after it: [`Elected`](LeaderChange::Elected) (a new term),
    ///    [`Proclaimed`](LeaderChange::Proclaimed) (a new value under the same term),
    ///    [`Resigned`](LeaderChange::Resigned).
    ///
    /// Terms never go back and nothing is delivered twice: a message older than what the stream
    /// already delivered (one still in flight when it read the leader) is dropped. Nothing is
    /// invented either: a leader whose lease ran out without resigning shows only as the next
    /// leader's `Elected`.
    ///
    /// When messages may have been missed (the subscriber connection was re-established, this
    /// stream fell more than the connection's queue behind, or on a cluster with sharded pub/sub
    /// the change channel's slot moved to another node, which drops its subscribers; the client
    /// notices within about a second), the stream subscribes again,
    /// reads the leader again and yields [`LeaderChange::Resynced`] with it, then goes on.
    ///
    /// An error (Redis unreachable while subscribing or reading the leader) is yielded as an
    /// item and the stream tries again, waiting a little longer each time (up to 2 s); it ends
    /// after yielding [`Error::Shutdown`] once the client is shut down, or after an
    /// [`Error::InvalidArgument`] for an invalid name.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use futures::StreamExt;
    /// use lockkit::LeaderChange;
    ///
    /// let mut changes = client.election("scheduler").observe();
    /// while let Some(change) = changes.next().await {
    ///     match change? {
    ///         LeaderChange::Current(leader) | LeaderChange::Resynced(leader) => {
    ///             println!("leader now: {leader:?}")
    ///         }
    ///         LeaderChange::Elected(leader) => println!("{} leads, term {}", leader.value, leader.term),
    ///         LeaderChange::Proclaimed(leader) => println!("the leader now says {}", leader.value),
    ///         LeaderChange::Resigned { term } => println!("the leader of term {term} resigned"),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> Observer {
        let state = ObserveState {
            election: self.clone(),
            listener: None,
            sync: Some(Reading::Initial),
            last: None,
            retry: None,
            done: false,
        };
        Observer {
            stream: Box::pin(futures::stream::unfold(state, ObserveState::next)),
        }
    }

    /// Leads for as long as the service runs: campaigns (watchdog mode), runs `body` while
    /// leading, and when leadership is lost drops the body's future and campaigns again. When
    /// the body returns, resigns and returns its result.
    ///
    /// This is client-go's leader-election loop without the callbacks: the body is
    /// `OnStartedLeading`, its end (returned or dropped) `OnStoppedLeading`;
    /// [`observe`](Election::observe) gives `OnNewLeader`.
    ///
    /// The body gets a [`LeadershipHandle`] (term, value, [`lost`](LeadershipHandle::lost)). The
    /// body's future is polled before the lost signal, so a body that `select!`s on
    /// [`lost`](LeadershipHandle::lost) can stop cleanly first; but a body that *returns* ends
    /// `lead` (that is what returning means). To be stopped and led again, let it be dropped.
    ///
    /// # Errors
    /// The body's error, or a campaign's error converted with `E: From<Error>`
    /// ([`Error::Redis`] when Redis fails, [`Error::Shutdown`], [`Error::InvalidArgument`]):
    /// `lead` does not retry a campaign that failed (but campaigns again when leadership was
    /// lost before its announcement, [`Error::NotHeld`] from a campaign). A resignation that fails after the body
    /// returned is logged (the leadership then runs out its lease), and the body's result is
    /// returned.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// # async fn consume_queue(_term: u64) {}
    /// let election = client.election("queue-consumer");
    /// election
    ///     .lead("pod-a", |leadership| async move {
    ///         tokio::select! {
    ///             () = consume_queue(leadership.term()) => {}
    ///             () = leadership.lost() => {}
    ///         }
    ///         Ok::<(), lockkit::Error>(())
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn lead<T, E, F, Fut>(&self, value: impl Into<String>, mut body: F) -> Result<T, E>
    where
        F: FnMut(LeadershipHandle) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<Error>,
    {
        let value = value.into();
        loop {
            let leadership = match self.campaign(value.clone()).await {
                Ok(leadership) => leadership,
                // Lost between its grant and its announcement: campaign again.
                Err(Error::NotHeld { .. }) => continue,
                Err(err) => return Err(err.into()),
            };
            let lost = leadership.lost();
            let run = body(leadership.handle());
            tokio::select! {
                biased;
                result = run => {
                    match leadership.resign().await {
                        Ok(()) | Err(Error::NotHeld { .. }) => {}
                        Err(err) => tracing::warn!(
                            election = %self.name(),
                            "resigning after the body returned failed; the leadership runs out its lease: {}",
                            crate::error::Chain(&err)
                        ),
                    }
                    return result;
                }
                () = lost => {
                    tracing::warn!(
                        election = %self.name(),
                        term = leadership.term(),
                        "leadership lost; the body was stopped, campaigning again"
                    );
                }
            }
        }
    }
}

/// The leader record's key (the election's sixth key).
fn leader_key(keys: &ObjectKeys) -> &str {
    keys.aux("leader").unwrap_or_default()
}

/// A leader: its term (fencing token) and the value it announced.
///
/// ```no_run
/// # async fn demo(election: lockkit::Election) -> Result<(), lockkit::Error> {
/// match election.leader().await? {
///     Some(lockkit::Leader { term, value }) => println!("{value} leads in term {term}"),
///     None => println!("nobody leads"),
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Leader {
    /// The leader's term: a fencing token, strictly increasing across the election's leaders.
    pub term: u64,
    /// The value the leader announced (at its election, or by its latest proclaim).
    pub value: String,
}

impl From<Record> for Leader {
    fn from(record: Record) -> Self {
        Self {
            term: record.term,
            value: record.value,
        }
    }
}

/// One change of an election's leadership, as [`Election::observe`] yields it.
///
/// ```no_run
/// # async fn demo(election: lockkit::Election) -> Result<(), lockkit::Error> {
/// use futures::StreamExt;
/// use lockkit::LeaderChange;
///
/// let mut changes = election.observe();
/// while let Some(change) = changes.next().await {
///     if let LeaderChange::Resynced(_) = change? {
///         eprintln!("changes may have been missed (reconnected)");
///     }
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaderChange {
    /// The first item: the leader when the stream started (`None`: nobody led).
    Current(Option<Leader>),
    /// After the stream may have missed changes (the subscriber connection was re-established,
    /// the stream fell behind, or the change channel's slot moved): the leader now. Changes between the last item before it and
    /// this one were not seen.
    Resynced(Option<Leader>),
    /// A new leader (a new, greater term) announced itself.
    Elected(Leader),
    /// The leader announced a new value under the same term.
    Proclaimed(Leader),
    /// The leader of `term` resigned.
    Resigned {
        /// The term that ended.
        term: u64,
    },
}

/// What every view of one leadership shares: the election, the hold, the term and the value.
struct Shared {
    election: Election,
    hold: Arc<Hold>,
    term: u64,
    value: parking_lot::Mutex<String>,
    /// One proclaim at a time, so the local value is the last one announced.
    proclaiming: tokio::sync::Mutex<()>,
}

impl Shared {
    async fn proclaim(&self, value: String) -> Result<(), Error> {
        let _one = self.proclaiming.lock().await;
        let election = &self.election;
        let keys = election.keys()?;
        let inner = election.inner();
        let term = self.term.to_string();
        let channel = protocol::changes_channel(keys);
        let owner = self.hold.owner.as_deref().unwrap_or_default();
        let reply = inner
            .exec
            .ints(
                &protocol::PROCLAIM,
                Kind::Election,
                &[&keys.key, leader_key(keys)],
                &[
                    &self.hold.marker,
                    owner,
                    &term,
                    &value,
                    &channel,
                    inner.exec.publish_flag(),
                    inner
                        .exec
                        .counter_ttl_arg(Kind::Election)
                        .unwrap_or_default(),
                ],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.during("proclaim").naming(election.name()))?;
        if !protocol::decode_proclaim(&reply)? {
            return Err(Error::NotHeld {
                name: election.name().to_owned(),
            });
        }
        *self.value.lock() = value;
        Ok(())
    }

    /// Deletes the record if it is still this term's, and says so on the change channel.
    async fn resign(&self) -> Result<(), Error> {
        let election = &self.election;
        let keys = election.keys()?;
        let inner = election.inner();
        let term = self.term.to_string();
        let channel = protocol::changes_channel(keys);
        let reply = inner
            .exec
            .ints(
                &protocol::RESIGN,
                Kind::Election,
                &[&keys.key, leader_key(keys)],
                &[
                    &self.hold.marker,
                    &term,
                    &channel,
                    inner.exec.publish_flag(),
                ],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.naming(election.name()))?;
        protocol::decode_resign(&reply)?;
        Ok(())
    }
}

/// The leader's guard, from [`Election::campaign`]: this client leads while it lives and its
/// lease holds.
///
/// Dropping it resigns in the background (the next candidate leads at once); prefer
/// [`resign`](Leadership::resign), which reports the outcome.
///
/// It has no `scope` (unlike [`LockGuard::scope`]): a campaign inside it would re-enter the
/// hold and mint a second term for the same leader.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// # async fn run_scheduler(_term: u64) {}
/// let leadership = client.election("scheduler").campaign("pod-a").await?;
/// tokio::select! {
///     () = run_scheduler(leadership.term()) => leadership.resign().await?,
///     () = leadership.lost() => eprintln!("no longer the leader"),
/// }
/// # Ok(()) }
/// ```
#[must_use = "leadership is resigned as soon as the guard is dropped"]
pub struct Leadership {
    shared: Arc<Shared>,
    /// `None` once resigned.
    guard: Option<LockGuard>,
    _leading: crate::metrics::Leading,
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.shared.election.name())
            .field("term", &self.shared.term)
            .field("value", &*self.shared.value.lock())
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl Leadership {
    /// The leader's term: the fencing token of this leadership, greater than every earlier
    /// leader's (never repeated, also after Redis was restored from an older snapshot). Write it
    /// with every change to shared storage and have the storage refuse a smaller one: a deposed
    /// leader that was paused past its lease is then stopped.
    ///
    /// ```no_run
    /// # async fn demo(leadership: lockkit::Leadership) {
    /// let fence = leadership.term();
    /// // UPDATE jobs SET state = 'done', last_term = :fence WHERE id = 7 AND last_term <= :fence
    /// # let _ = fence;
    /// # }
    /// ```
    pub fn term(&self) -> u64 {
        self.shared.term
    }

    /// The value this leader announced last.
    pub fn value(&self) -> String {
        self.shared.value.lock().clone()
    }

    /// Announces `value` in place of the current one, under the same term: observers see
    /// [`LeaderChange::Proclaimed`], [`Election::leader`] returns it.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when this client does not lead any more (its lease ran out). The
    /// value is then not announced, with one exception: a call whose connection broke is sent
    /// again, and if the lease ran out in between, the first send may have announced the value
    /// (observers saw it under this term) before the answer says `NotHeld`. Either way the
    /// leadership is over. [`Error::Redis`], [`Error::Shutdown`].
    ///
    /// ```no_run
    /// # async fn demo(leadership: lockkit::Leadership) -> Result<(), lockkit::Error> {
    /// leadership.proclaim("pod-a, draining").await?;
    /// assert_eq!(leadership.value(), "pod-a, draining");
    /// # Ok(()) }
    /// ```
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<(), Error> {
        self.shared.proclaim(value.into()).await
    }

    /// Steps down: the leader record goes (observers see [`LeaderChange::Resigned`]), then the
    /// leadership is released, which makes the longest-waiting candidate the leader at once, with
    /// no wait for a lease.
    ///
    /// # Cancel safety
    /// If the future is dropped before it completes, the release goes on in the background.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when the leadership was already lost (its lease ran out): another
    /// leader may have led meanwhile. [`Error::Redis`] when Redis fails (the leadership is then
    /// no longer renewed and runs out its lease), [`Error::Shutdown`].
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// let leadership = client.election("scheduler").campaign("pod-a").await?;
    /// leadership.resign().await?;
    /// # Ok(()) }
    /// ```
    pub async fn resign(mut self) -> Result<(), Error> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        let resigned = self.shared.resign().await;
        let released = guard.unlock().await;
        resigned.and(released).map_err(|err| err.during("resign"))
    }

    /// Whether the leadership is known to be lost: its lease ran out or Redis lost it (as
    /// [`LockGuard::is_lost`]). Once `true`, it stays `true`.
    pub fn is_lost(&self) -> bool {
        self.shared.hold.is_lost()
    }

    /// Resolves when [`is_lost`](Leadership::is_lost) becomes true (or leadership ended): stop
    /// acting as the leader then.
    ///
    /// ```no_run
    /// # async fn demo(leadership: lockkit::Leadership) {
    /// # async fn run_scheduler() {}
    /// tokio::select! {
    ///     () = run_scheduler() => {}
    ///     () = leadership.lost() => eprintln!("no longer the leader"),
    /// }
    /// # }
    /// ```
    ///
    /// The future does not borrow the guard and may be moved into another task.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.shared.hold.lost_signal()
    }

    /// A cheap, cloneable view of this leadership (term, value, lost signal, proclaim) for the
    /// tasks that act as the leader.
    pub fn handle(&self) -> LeadershipHandle {
        LeadershipHandle {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        // Resign, then release, in the background; without a runtime the guard's own drop
        // releases (and the record is left to name a hold that is gone: no one is reported).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = Arc::clone(&self.shared);
            runtime.spawn(async move {
                if let Err(err) = shared.resign().await {
                    tracing::debug!(
                        election = %shared.election.name(),
                        "background resignation failed: {}",
                        crate::error::Chain(&err)
                    );
                }
                drop(guard);
            });
        }
    }
}

/// A view of a [`Leadership`] (from [`Leadership::handle`], or the body of
/// [`Election::lead`]): term, value, lost signal, proclaim. Cheap to clone; it does not keep
/// the leadership: that ends with its guard.
///
/// ```no_run
/// # async fn demo(leadership: lockkit::Leadership) {
/// let handle = leadership.handle();
/// tokio::spawn(async move {
///     handle.lost().await;
///     eprintln!("term {} is over", handle.term());
/// });
/// # }
/// ```
#[derive(Clone)]
pub struct LeadershipHandle {
    shared: Arc<Shared>,
}

impl fmt::Debug for LeadershipHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeadershipHandle")
            .field("election", &self.shared.election.name())
            .field("term", &self.shared.term)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LeadershipHandle {
    /// The leadership's term, as [`Leadership::term`].
    pub fn term(&self) -> u64 {
        self.shared.term
    }

    /// The value announced last, as [`Leadership::value`].
    pub fn value(&self) -> String {
        self.shared.value.lock().clone()
    }

    /// As [`Leadership::is_lost`].
    pub fn is_lost(&self) -> bool {
        self.shared.hold.is_lost()
    }

    /// As [`Leadership::lost`]; also resolves once the leadership was resigned.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.shared.hold.lost_signal()
    }

    /// As [`Leadership::proclaim`].
    ///
    /// # Errors
    /// As [`Leadership::proclaim`].
    pub async fn proclaim(&self, value: impl Into<String>) -> Result<(), Error> {
        self.shared.proclaim(value.into()).await
    }
}

/// The stream of an election's leadership changes, from [`Election::observe`]: a
/// [`futures::Stream`] of `Result<LeaderChange, Error>`.
///
/// ```no_run
/// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
/// use futures::StreamExt;
/// let mut observer: lockkit::Observer = client.election("scheduler").observe();
/// let first = observer.next().await; // Some(Ok(LeaderChange::Current(..)))
/// # let _ = first;
/// # Ok(()) }
/// ```
#[must_use = "streams do nothing unless polled"]
pub struct Observer {
    stream: Pin<Box<dyn Stream<Item = Result<LeaderChange, Error>> + Send>>,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer").finish_non_exhaustive()
    }
}

impl Stream for Observer {
    type Item = Result<LeaderChange, Error>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.stream.as_mut().poll_next(cx)
    }
}

/// Why an observer reads the leader.
#[derive(Debug, Clone, Copy)]
enum Reading {
    /// Its first item.
    Initial,
    /// Messages may have been missed.
    Resync,
}

/// The last announcement an observer delivered: `(term, version)`, or a resignation of `term`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    term: u64,
    /// The record's version; `u64::MAX` once the term resigned (nothing of it comes after).
    version: u64,
}

struct ObserveState {
    election: Election,
    listener: Option<Listener>,
    /// A read of the leader is due.
    sync: Option<Reading>,
    last: Option<Position>,
    /// Wait this long before the next try (after an error).
    retry: Option<Duration>,
    done: bool,
}

impl ObserveState {
    async fn next(mut self) -> Option<(Result<LeaderChange, Error>, Self)> {
        loop {
            if self.done {
                return None;
            }
            let shutdown = self.election.inner().shutdown.clone();
            if shutdown.is_cancelled() {
                self.done = true;
                return Some((Err(Error::Shutdown), self));
            }
            if let Some(sync) = self.sync {
                if let Some(wait) = self.retry {
                    tokio::select! {
                        () = shutdown.cancelled() => continue,
                        () = tokio::time::sleep(wait) => {}
                    }
                }
                match self.synchronise().await {
                    Ok(record) => {
                        self.sync = None;
                        self.retry = None;
                        self.last = record.as_ref().map(|record| Position {
                            term: record.term,
                            version: record.version,
                        });
                        let leader = record.map(Leader::from);
                        let change = match sync {
                            Reading::Initial => LeaderChange::Current(leader),
                            Reading::Resync => LeaderChange::Resynced(leader),
                        };
                        return Some((Ok(change), self));
                    }
                    Err(err) => {
                        if matches!(err, Error::Shutdown | Error::InvalidArgument(_)) {
                            self.done = true;
                        }
                        self.retry = Some(
                            self.retry
                                .map_or(FIRST_RETRY, |wait| (wait * 2).min(MAX_RETRY)),
                        );
                        return Some((Err(err), self));
                    }
                }
            }
            let Some(listener) = self.listener.as_mut() else {
                self.sync = Some(Reading::Resync);
                continue;
            };
            tokio::select! {
                biased;
                () = shutdown.cancelled() => continue,
                moved = listener.moved.recv() => match moved {
                    Ok(channel) if channel != listener.channel() => {}
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        tracing::debug!(election = %self.election.name(), "the change channel's slot moved; reading the leader again");
                        self.sync = Some(Reading::Resync);
                    }
                    Err(RecvError::Closed) => {
                        self.done = true;
                        return Some((Err(Error::Shutdown), self));
                    }
                },
                reconnect = listener.reconnects.recv() => match reconnect {
                    Ok(_) | Err(RecvError::Lagged(_)) => {
                        tracing::debug!(election = %self.election.name(), "subscriber connection re-established; reading the leader again");
                        self.sync = Some(Reading::Resync);
                    }
                    Err(RecvError::Closed) => {
                        self.done = true;
                        return Some((Err(Error::Shutdown), self));
                    }
                },
                message = listener.messages.recv() => match message {
                    Ok(message) => {
                        if &*message.channel != listener.channel() {
                            continue;
                        }
                        let change = message.value.as_str().and_then(|text| Change::parse(&text));
                        if let Some(change) = change.and_then(|change| self.accept(change)) {
                            return Some((Ok(change), self));
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
                        tracing::debug!(election = %self.election.name(), missed, "the observer fell behind; reading the leader again");
                        self.sync = Some(Reading::Resync);
                    }
                    Err(RecvError::Closed) => {
                        self.done = true;
                        return Some((Err(Error::Shutdown), self));
                    }
                },
            }
        }
    }

    /// Subscribes (again), waits for the confirmation, then reads the leader: every change
    /// published after the read reaches this observer.
    async fn synchronise(&mut self) -> Result<Option<Record>, Error> {
        match &self.listener {
            Some(listener) => listener.resubscribe().await?,
            None => {
                let keys = self.election.keys()?;
                let channel = protocol::changes_channel(keys);
                let listener = self.election.inner().hub.listen(&channel).await?;
                self.listener = Some(listener);
            }
        }
        self.election.record().await
    }

    /// The change a message makes for this observer, if any: older than what it delivered, or
    /// the same, is dropped.
    fn accept(&mut self, change: Change) -> Option<LeaderChange> {
        match change {
            Change::Announced {
                term,
                version,
                value,
            } => {
                let position = Position { term, version };
                let change = match self.last {
                    Some(last) if position <= last => return None,
                    Some(last) if last.term == term => {
                        LeaderChange::Proclaimed(Leader { term, value })
                    }
                    _ => LeaderChange::Elected(Leader { term, value }),
                };
                self.last = Some(position);
                Some(change)
            }
            Change::Resigned { term } => {
                let position = Position {
                    term,
                    version: u64::MAX,
                };
                if self.last.is_some_and(|last| position <= last) {
                    return None;
                }
                self.last = Some(position);
                Some(LeaderChange::Resigned { term })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bounds<T: Send + Sync + Clone + 'static>() {}
    fn send_static<T: Send + 'static>() {}

    #[test]
    fn bounds_hold() {
        bounds::<Election>();
        bounds::<LeadershipHandle>();
        send_static::<Leadership>();
        send_static::<Observer>();
    }
}
