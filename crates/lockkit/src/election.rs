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
//! reconnect and uses sharded pub/sub when the client does. An observer also reads that
//! connection's errors, and while it is quiet (no message for a second) sends a `PING` on it:
//! a frozen or paused server breaks no connection, and the observer must still report the
//! outage (issue 27).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use lockkit_protocol::election::{self as protocol, Change, LeaderRead, Record};
use lockkit_protocol::fenced_lock::{ACQUIRE, RELEASE};
use lockkit_protocol::keys::{Kind, ObjectKeys};
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
/// keys (their first five are the fenced lock's), and the election's renewal, which keeps the
/// leader record alive exactly as long as the hold it names.
static ELECTION: Flavor = Flavor {
    kind: Kind::Election,
    acquire: &ACQUIRE,
    holds: HoldKind {
        kind: Kind::Election,
        release: &RELEASE,
        // The lock's renewal, with the leader record's expiry following the hold's.
        renew: &protocol::RENEW,
    },
    leave: &FENCED_LEAVE,
};

/// The longest an [`Observer`] waits before it tries again after it failed to subscribe or to
/// read the leader, and [`Election::lead`] after a campaign failed.
const MAX_RETRY: Duration = Duration::from_secs(2);
/// The first such wait.
const FIRST_RETRY: Duration = Duration::from_millis(50);
/// How long an [`Observer`]'s subscriber connection may stay quiet (no message on any channel)
/// before the observer asks it for a `PING`: a frozen or paused server breaks no connection and
/// reports no error, so only a request it leaves unanswered shows the outage.
const CHECK_INTERVAL: Duration = Duration::from_secs(1);

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
///   campaign, run the body while leading, stop it when leadership is lost, campaign again,
///   also through Redis outages (with a backoff), until the client shuts down.
/// - The leader record (what [`leader`](Election::leader) and observers read) lives exactly as
///   long as the leadership it names: renewed with it, gone with it.
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
    /// In an outage it fails with [`Error::Redis`] within the
    /// [command timeout](crate::ClientBuilder::command_timeout) once a connection to Redis is
    /// lost, or the [recheck interval](crate::ClientBuilder::recheck_interval) plus the command
    /// timeout when Redis stops answering (frozen, paused), never the leader's lease later.
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
                requests: AtomicU64::new(0),
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
    /// Terms never go back for one client: a leader whose term is smaller than one this client
    /// has already seen lead (here or in an [`observe`](Election::observe) stream) is not
    /// reported: `None`, until a leader with a greater term leads. That happens only when Redis
    /// went back to older data (a restart from an older snapshot, a failover to a replica that
    /// missed writes): the smaller term is then a leadership from before the rollback, brought
    /// back for the rest of its lease, whose writes fenced with its term are refused by storage
    /// that saw the greater one. The next leader's term exceeds every earlier one (see
    /// [`Leadership::term`]). A client that never saw the greater term reports what Redis says.
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
        Ok(
            match self.record().await.map_err(|err| err.during("leader"))? {
                LeaderRead::Leads(record) if self.see(record.term) => Some(Leader::from(record)),
                LeaderRead::Leads(_) | LeaderRead::Nobody(_) => None,
            },
        )
    }

    /// Reads the leader, or where the change channel stands when nobody announced leads.
    async fn record(&self) -> Result<LeaderRead, Error> {
        let keys = self.keys()?;
        let reply = self
            .inner()
            .exec
            .strings(
                &protocol::LEADER,
                Kind::Election,
                &[&keys.key, leader_key(keys), token_key(keys)],
                &[],
                Resend::Allowed,
            )
            .await
            .map_err(|err| err.naming(self.name()))?;
        Ok(protocol::decode_read(&reply)?)
    }

    /// The greatest term this client has seen lead the election (0: none).
    fn seen_term(&self) -> u64 {
        self.keys()
            .map_or(0, |keys| self.inner().seen_term(&keys.key))
    }

    /// Whether this client may report `term` as the election's leader: not when it has seen a
    /// greater term lead (Redis went back to older data). Notes `term` when it may.
    fn see(&self, term: u64) -> bool {
        self.keys()
            .map_or(true, |keys| self.inner().see_term(&keys.key, term))
    }

    /// Runs `op` (an observer's step) within the command timeout: a timeout, fred's or
    /// lockkit's, says which bound ran out, and the error names the election.
    async fn within_command_timeout<T>(
        &self,
        op: impl Future<Output = Result<T, Error>>,
    ) -> Result<T, Error> {
        let deadline = self.inner().exec.command_deadline();
        let result = match deadline.run("observe", op).await {
            Err(Error::Redis(err)) if err.is_timeout() => Err(deadline.expired("observe")),
            other => other,
        };
        result.map_err(|err| self.inner().exec.explain(err.naming(self.name())))
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
    /// Nothing is delivered twice, and nothing from before the read: a message at or before
    /// where the stream stands is dropped (one still in flight when it read the leader). The
    /// read gives that position whether or not someone leads: the leader's term and record
    /// version, else the term of a leader that has not announced itself yet, else the
    /// election's last term (its token counter), all of whose announcements came before the
    /// read. Nothing is invented either: a leader whose lease ran out without resigning shows
    /// only as the next leader's `Elected`, and `Resigned` only follows its own term's
    /// `Current`, `Resynced`, `Elected` or `Proclaimed`.
    ///
    /// Terms never go back for one client: `Current` and `Resynced` report no leader (`None`)
    /// rather than one whose term is smaller than one this client has already seen lead (a
    /// rollback of Redis' data, see [`leader`](Election::leader)); the stream then stands at
    /// that greater term, and the next leader, whose term is greater still, comes as `Elected`.
    ///
    /// When messages may have been missed (the subscriber connection was re-established, this
    /// stream fell more than the connection's queue behind, or on a cluster with sharded pub/sub
    /// the change channel's slot moved to another node, which drops its subscribers; the client
    /// notices within about a second), the stream subscribes again,
    /// reads the leader again and yields [`LeaderChange::Resynced`] with it, then goes on.
    ///
    /// **While Redis does not answer**, the stream says so. It yields an [`Error::Redis`]
    /// naming the election within the [command
    /// timeout](crate::ClientBuilder::command_timeout) plus 1 s of Redis ceasing to answer
    /// (killed, cut off, frozen, `CLIENT PAUSE`d): at once when its subscriber connection breaks
    /// and cannot be re-established (on a cluster, within the command timeout, as a try then
    /// goes unanswered); when the connection stays open to a server that answers
    /// nothing, through a `PING` it sends on that connection after 1 s without a message. It
    /// then tries again (subscribe, read the leader; each step within the command timeout),
    /// waiting 50 ms before the first try and twice as long before each next one, up to 2 s,
    /// and yields an error for every try that fails. Once a try succeeds, it yields
    /// [`LeaderChange::Resynced`] and goes on. A connection that breaks and is re-established
    /// at once (a killed connection, a quick restart) gives only the `Resynced`.
    ///
    /// The stream ends after yielding [`Error::Shutdown`] once the client is shut down, or
    /// after an [`Error::InvalidArgument`] for an invalid name; after any other error it goes
    /// on, so keep polling it (a `?` on its items would end the loop at the first outage).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// use futures::StreamExt;
    /// use lockkit::{Error, LeaderChange};
    ///
    /// let mut changes = client.election("scheduler").observe();
    /// while let Some(change) = changes.next().await {
    ///     match change {
    ///         Ok(LeaderChange::Current(leader) | LeaderChange::Resynced(leader)) => {
    ///             println!("leader now: {leader:?}")
    ///         }
    ///         Ok(LeaderChange::Elected(leader)) => {
    ///             println!("{} leads, term {}", leader.value, leader.term)
    ///         }
    ///         Ok(LeaderChange::Proclaimed(leader)) => {
    ///             println!("the leader now says {}", leader.value)
    ///         }
    ///         Ok(LeaderChange::Resigned { term }) => {
    ///             println!("the leader of term {term} resigned")
    ///         }
    ///         Ok(_) => {}
    ///         // Redis does not answer: the stream tries again by itself.
    ///         Err(Error::Redis(err)) => eprintln!("{err}; trying again"),
    ///         // Shut down, or an invalid name: the stream has ended.
    ///         Err(err) => return Err(err),
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
            check: None,
            done: false,
        };
        Observer {
            stream: Box::pin(futures::stream::unfold(state, ObserveState::next)),
        }
    }

    /// Leads for as long as the service runs: campaigns (watchdog mode), runs `body` while
    /// leading, and when leadership is lost stops the body and campaigns again. It returns only
    /// when the body returns *while still leading* (it then resigns and returns the body's
    /// result), on [`Error::Shutdown`], or on an error that trying again cannot cure.
    ///
    /// This is client-go's leader-election loop (`RunOrDie`) without the callbacks: the body is
    /// `OnStartedLeading`, its end (returned or dropped) `OnStoppedLeading`;
    /// [`observe`](Election::observe) gives `OnNewLeader`.
    ///
    /// The body gets a [`LeadershipHandle`] (term, value, [`lost`](LeadershipHandle::lost)).
    /// When leadership is lost (its lease ran out, Redis lost it: a restart, a `FLUSHALL`, a
    /// stall longer than the lease):
    /// - a body that `select!`s on [`lost`](LeadershipHandle::lost) and returns, as in the
    ///   example below, is a loss, not an end: a body that returns once its leadership is
    ///   [lost](LeadershipHandle::is_lost) has its result dropped, and `lead` campaigns again;
    /// - a body still running is dropped (the body's future is polled before the lost signal,
    ///   so a body that watches `lost()` can stop cleanly first), and `lead` campaigns again.
    ///
    /// **Redis outages.** A campaign that fails with [`Error::Redis`] (Redis unreachable, a
    /// command timeout, a failover under way) or [`Error::NotReplicated`] is tried again, after
    /// a pause that starts at 50 ms and doubles up to 2 s (back to 50 ms after a campaign that
    /// succeeds); each failure is logged as a warning. So `lead` rides out an outage of any
    /// length and leads again once Redis is back (after the old leadership's lease, if Redis
    /// kept it).
    ///
    /// # Errors
    /// Converted with `E: From<Error>`: [`Error::Shutdown`] once the client is shut down (also
    /// while leading: the shutdown ends the leadership, and the next campaign reports it; and
    /// while pausing between campaigns); [`Error::InvalidArgument`] for an invalid name,
    /// [`Error::WrongType`] when the election's keys hold something else, and any other error
    /// a campaign returns that is not one of those tried again above. Or the body's own error,
    /// when it returns one while still leading. A resignation that fails after the body
    /// returned is logged (the leadership then runs out its lease), and the body's result is
    /// returned.
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// # async fn consume_queue(_term: u64) {}
    /// let election = client.election("queue-consumer");
    /// // Returns only on shutdown (or if `consume_queue` ever returns while leading).
    /// election
    ///     .lead("pod-a", |leadership| async move {
    ///         tokio::select! {
    ///             () = consume_queue(leadership.term()) => {}
    ///             () = leadership.lost() => {} // leadership lost: `lead` campaigns again
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
        let shutdown = self.inner().shutdown.clone();
        let mut retry: Option<Duration> = None;
        loop {
            let leadership = match self.campaign(value.clone()).await {
                Ok(leadership) => {
                    retry = None;
                    leadership
                }
                // Lost between its grant and its announcement: campaign again.
                Err(Error::NotHeld { .. }) => continue,
                Err(err @ (Error::Redis(_) | Error::NotReplicated { .. })) => {
                    let wait = retry.map_or(FIRST_RETRY, |wait| (wait * 2).min(MAX_RETRY));
                    retry = Some(wait);
                    tracing::warn!(
                        election = %self.name(),
                        retry_in = ?wait,
                        "campaign failed; campaigning again: {}",
                        crate::error::Chain(&err)
                    );
                    tokio::select! {
                        () = shutdown.cancelled() => return Err(Error::Shutdown.into()),
                        () = tokio::time::sleep(wait) => continue,
                    }
                }
                Err(err) => return Err(err.into()),
            };
            let lost = leadership.lost();
            let run = body(leadership.handle());
            tokio::select! {
                biased;
                result = run => {
                    if leadership.is_lost() {
                        // The natural body returns once `lost()` fired: a loss, not an end.
                        tracing::warn!(
                            election = %self.name(),
                            term = leadership.term(),
                            "leadership lost; the body returned, campaigning again"
                        );
                        continue;
                    }
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

/// The token counter's key (the election's second key): the terms are its tokens.
fn token_key(keys: &ObjectKeys) -> &str {
    keys.aux("token").unwrap_or_default()
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
    /// The first item: the leader when the stream started (`None`: nobody led, or only a
    /// leader with a smaller term than this client has already seen lead; see
    /// [`Election::leader`]).
    Current(Option<Leader>),
    /// After the stream may have missed changes (the subscriber connection was re-established,
    /// or did not answer; the stream fell behind; or the change channel's slot moved): the
    /// leader now, `None` as in `Current`. Changes between the last item before it and this one
    /// were not seen.
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
    /// Proclaim calls so far: the next one's request id (with the hold's marker, it names one
    /// call in the leader record, so a re-sent call changes nothing).
    requests: AtomicU64,
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
        // One id per call, the same for every send of it (fred re-sends it after a reconnect).
        let request = (self.requests.fetch_add(1, Ordering::Relaxed) + 1).to_string();
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
                    &request,
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
    /// A call whose connection broke before its answer came is sent again; the call is
    /// idempotent: a second delivery of one call finds the first one's mark in the leader record
    /// and changes and publishes nothing, so observers see the value once, under one record
    /// version, and the call answers as the first delivery did.
    ///
    /// # Errors
    /// [`Error::NotHeld`] when this client does not lead any more (its lease ran out). The
    /// value is then not announced, with one exception: if the lease ran out between a first
    /// delivery that announced the value and the second one (the record expires with the
    /// leadership), the answer says `NotHeld` although observers saw the value under this term.
    /// Either way the leadership is over. [`Error::Redis`], [`Error::Shutdown`].
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
        let Some(mut guard) = self.guard.take() else {
            return;
        };
        // Let go of it now: this task campaigning again while the resignation runs is no
        // self-wait.
        guard.forget_taken();
        // Resign, then release, in the background, through the client's runtime (the guard,
        // or a campaign future announcing, may be dropped outside any runtime). Should the
        // client's runtime be gone, the guard's own drop releases (and the record is left to
        // name a hold that is gone: no one is reported).
        let shared = Arc::clone(&self.shared);
        let runtime = shared.election.inner().hub.runtime().clone();
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

/// Where an observer stands on the change channel: every message at or before it was published
/// before what the observer delivered last, and is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Position {
    term: u64,
    /// The record's version; [`UNANNOUNCED`] when nothing of `term` was delivered (a read found
    /// its hold leading, not yet announced); [`OVER`] once the term resigned, or when a read
    /// found nobody leading (nothing of it comes after).
    version: u64,
}

/// [`Position::version`] of a term that leads but was not announced to the observer.
const UNANNOUNCED: u64 = 0;
/// [`Position::version`] of a term that is over.
const OVER: u64 = u64::MAX;

impl Position {
    /// Where a read of the leader left the change channel (see [`protocol::LeaderRead`]).
    fn of(read: &LeaderRead) -> Self {
        match read {
            LeaderRead::Leads(record) => Position {
                term: record.term,
                version: record.version,
            },
            LeaderRead::Nobody(nobody) => Position {
                term: nobody.term,
                version: if nobody.over { OVER } else { UNANNOUNCED },
            },
        }
    }
}

/// A boxed check of the subscriber connection (see [`CHECK_INTERVAL`]).
type Check = Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>;

struct ObserveState {
    election: Election,
    listener: Option<Listener>,
    /// A read of the leader is due.
    sync: Option<Reading>,
    /// Where the stream stands; `None` until its first read.
    last: Option<Position>,
    /// Wait this long before the next try (after an error).
    retry: Option<Duration>,
    /// The check of the subscriber connection that runs while it is quiet; a new one (after
    /// [`CHECK_INTERVAL`]) whenever a message arrives.
    check: Option<Check>,
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
                let result = tokio::select! {
                    () = shutdown.cancelled() => continue,
                    result = self.synchronise() => result,
                };
                match result {
                    Ok(read) => {
                        self.sync = None;
                        self.retry = None;
                        self.check = None;
                        let leader = self.admit(&read);
                        let change = match sync {
                            Reading::Initial => LeaderChange::Current(leader),
                            Reading::Resync => LeaderChange::Resynced(leader),
                        };
                        return Some((Ok(change), self));
                    }
                    Err(err) => return Some((Err(self.failed(err)), self)),
                }
            }
            let Some(listener) = self.listener.as_mut() else {
                self.sync = Some(Reading::Resync);
                continue;
            };
            let check = self
                .check
                .get_or_insert_with(|| quiet_check(&self.election, listener));
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
                // The connection broke: read the leader again once it is back. The error is
                // yielded only if that fails (a reconnection that fails, or no answer in time):
                // a connection re-established at once (a killed connection, a server that
                // restarted) is only a `Resynced`. On a cluster an error may be about another
                // node's connection: there the check and the timeouts tell.
                error = listener.errors.recv(), if listener.one_connection() => match error {
                    Ok((err, _)) => {
                        tracing::debug!(election = %self.election.name(), "the subscriber connection failed ({}); reading the leader again", crate::error::fred_reason(&err));
                        self.sync = Some(Reading::Resync);
                    }
                    Err(RecvError::Lagged(_)) => self.sync = Some(Reading::Resync),
                    Err(RecvError::Closed) => {
                        self.done = true;
                        return Some((Err(Error::Shutdown), self));
                    }
                },
                message = listener.messages.recv() => match message {
                    Ok(message) => {
                        // Any message shows that the connection works: the check starts again.
                        self.check = None;
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
                checked = check => {
                    self.check = None;
                    if let Err(err) = checked {
                        tracing::debug!(election = %self.election.name(), "the subscriber connection does not answer; reading the leader again: {}", crate::error::Chain(&err));
                        self.sync = Some(Reading::Resync);
                        return Some((Err(self.failed(err)), self));
                    }
                }
            }
        }
    }

    /// The error of a failed try, with the wait before the next one (or the end of the stream
    /// after [`Error::Shutdown`] or an invalid name).
    fn failed(&mut self, err: Error) -> Error {
        if matches!(err, Error::Shutdown | Error::InvalidArgument(_)) {
            self.done = true;
        }
        self.retry = Some(
            self.retry
                .map_or(FIRST_RETRY, |wait| (wait * 2).min(MAX_RETRY)),
        );
        err
    }

    /// Subscribes (again), waits for the confirmation, then reads the leader: every change
    /// published after the read reaches this observer.
    ///
    /// Once subscribed: the connection events from before the try are covered by it, and
    /// dropped. A failure of the subscriber connection during the try (an attempt to connect
    /// again that failed; not on a cluster, where it may be another node's) ends it at once;
    /// else the command timeout does. A reconnection during the try starts it again (up to
    /// `MAX_RESTARTS` times), so that a connection that comes back while the observer tries
    /// (the usual end of an outage) makes one `Resynced`, not two.
    async fn synchronise(&mut self) -> Result<LeaderRead, Error> {
        /// How often a reconnection starts a try again.
        const MAX_RESTARTS: usize = 3;
        let election = &self.election;
        let Some(listener) = self.listener.as_mut() else {
            let keys = election.keys()?;
            let channel = protocol::changes_channel(keys);
            let listen = election.inner().hub.listen(&channel);
            let listener = election.within_command_timeout(listen).await?;
            self.listener = Some(listener);
            return self.election.record().await;
        };
        let one_connection = listener.one_connection();
        let mut restarts = 0;
        loop {
            listener.errors = listener.errors.resubscribe();
            listener.reconnects = listener.reconnects.resubscribe();
            listener.moved = listener.moved.resubscribe();
            let resubscribe = listener.resubscribe();
            let attempt = async {
                election.within_command_timeout(resubscribe).await?;
                election.record().await
            };
            tokio::select! {
                result = attempt => return result,
                err = connection_error(&mut listener.errors), if one_connection => {
                    return Err(crate::error::redis("observe")(err).naming(election.name()));
                }
                _ = listener.reconnects.recv(), if restarts < MAX_RESTARTS => {
                    tracing::debug!(election = %election.name(), "subscriber connection re-established while reading the leader; reading again");
                    restarts += 1;
                }
            }
        }
    }

    /// What a read reports, and where it leaves the stream. A leader whose term is smaller than
    /// one this client has seen lead (Redis went back to older data) is not reported: the stream
    /// stands at that greater term, which is over for this data (the next leader's is greater).
    fn admit(&mut self, read: &LeaderRead) -> Option<Leader> {
        let floor = self.election.seen_term();
        let mut position = Position::of(read);
        let leader = match read {
            LeaderRead::Leads(record) if self.election.see(record.term) => {
                Some(Leader::from(record.clone()))
            }
            LeaderRead::Leads(_) | LeaderRead::Nobody(_) => None,
        };
        if position.term < floor {
            tracing::debug!(
                election = %self.election.name(),
                read = position.term,
                seen = floor,
                "the election's data went back to a smaller term than this client saw lead; reporting no leader"
            );
            position = Position {
                term: floor,
                version: OVER,
            };
        }
        self.last = Some(position);
        leader
    }

    /// The change a message makes for this observer, if any. A message at or before where the
    /// stream stands is dropped; so is a resignation of a term the stream has not delivered (it
    /// was published before the read that started the stream: a term is announced before it
    /// resigns).
    fn accept(&mut self, change: Change) -> Option<LeaderChange> {
        let last = self.last?;
        match change {
            Change::Announced {
                term,
                version,
                value,
            } => {
                let position = Position { term, version };
                if position <= last {
                    return None;
                }
                // Noted for this client's reads; an observer itself follows its channel's order.
                self.election.see(term);
                let change = if last.term == term && last.version != UNANNOUNCED {
                    LeaderChange::Proclaimed(Leader { term, value })
                } else {
                    LeaderChange::Elected(Leader { term, value })
                };
                self.last = Some(position);
                Some(change)
            }
            Change::Resigned { term } => {
                if last.term != term || last.version == UNANNOUNCED || last.version == OVER {
                    return None;
                }
                self.last = Some(Position {
                    term,
                    version: OVER,
                });
                Some(LeaderChange::Resigned { term })
            }
        }
    }
}

/// The next failure of the subscriber connection in `errors` (never, once the client is gone:
/// the shutdown ends the stream).
async fn connection_error(
    errors: &mut tokio::sync::broadcast::Receiver<(
        fred::error::Error,
        Option<fred::types::config::Server>,
    )>,
) -> fred::error::Error {
    loop {
        match errors.recv().await {
            Ok((err, _)) => return err,
            Err(RecvError::Lagged(_)) => {}
            Err(RecvError::Closed) => return std::future::pending().await,
        }
    }
}

/// Once the subscriber connection has been quiet for [`CHECK_INTERVAL`]: a `PING` on it, within
/// the command timeout. A server that is frozen or paused breaks no connection and sends no
/// error; only a request left unanswered shows it.
fn quiet_check(election: &Election, listener: &Listener) -> Check {
    let ping = listener.ping();
    let election = election.clone();
    Box::pin(async move {
        tokio::time::sleep(CHECK_INTERVAL).await;
        election.within_command_timeout(ping).await
    })
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
