//! Model-based test of the leader election (issue 22), in the style of `model_locks.rs`:
//! generated programs of campaign / proclaim / resign / leader / renew / cancel / clock steps by
//! three candidates run against the real scripts (the fenced lock's acquire, release, renew and
//! cancel on the election's first five keys, and `election_proclaim`, `election_resign`,
//! `election_leader`) on a real `redis-server`, and against `lockkit_model::election::ElectionSpec`.
//! After every step the replies, the decoded keys (the fenced holds, the token counter, the
//! waiting set, the leader record) and the messages a real subscriber got (on the change channel
//! and on the candidates' own channels, where grants go) must agree, and the model's invariants
//! must hold: at most one leader at any instant, terms strictly increasing, `leader()` only while
//! the record's hold is live, a non-leader's proclaim changing nothing.
//!
//! Budget: `LOCKKIT_MODEL_CASES` cases (default `lockkit_suite::model_io::DEFAULT_CASES`);
//! `LOCKKIT_MODEL_SEED` replays a run. A failure prints the seed and the shrunk program.
//!
//! Issue 27: the leader record's expiry is compared exactly (it is its hold's, moved by the
//! election's renewal, `election_renew`, which the `Renew` step runs on all six keys), and a
//! `Resend` step sends the last proclaim again with its request id (a reply lost and re-sent):
//! it must change and publish nothing. Revert check: with `election_proclaim` back to the token
//! counter TTL (`PEXPIRE`), or without its request-id check, both tests fail within their first
//! cases (the record's expiry, resp. a second `l:` message heard).
//!
//! Revert check (issue 22): with `election_proclaim` stripped of its live-hold check, with
//! `election_resign` not comparing the record's term (and marker), or with `election_leader`
//! stripped of its live-hold check, both tests fail, 3 runs of 3 each, at the first such call
//! (`Redis said Ok(["1"]) … the model Flag(false)`, resp. `Leader(None)`).

use std::collections::BTreeMap;
use std::time::Duration;

use fred::clients::Client as Fred;
use fred::interfaces::ClientLike;
use fred::types::scripts::Script as FredScript;
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::lock::{hold_marker, AcquireReply, ReleaseReply};
use lockkit::protocol::script::Script;
use lockkit::protocol::{election, fenced_lock, lock};
use lockkit_model::election::ElectionSpec;
use lockkit_model::lock::{Acquired, Now, Released, Request, WrongType};
use lockkit_suite::checker::{model_seed, save_model_cases};
use lockkit_suite::model_io::{
    absent, as_i64, cases, hash_lock_key, key, read_state, time, Dump, RawKey, ANY, CLIENTS,
    DUMP_KEYS,
};
use lockkit_suite::{raw, spawned, unique, RedisServer};
use lockkit_testkit::RespValue;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// Cases in CI; `LOCKKIT_MODEL_CASES` runs more.
/// A lease that outlives any program.
const LONG_MS: u64 = 60_000;

// === the generated operations ===

#[derive(Debug, Clone)]
enum Op {
    /// A new campaign by candidate `cand` (0..3): the fenced acquire (keep-alive `Some`: it
    /// waits in line), then, when elected, its proclaim of `value`, as `campaign` does.
    Campaign {
        cand: usize,
        lease_ms: u64,
        keepalive_ms: Option<u64>,
        value: usize,
    },
    /// The next try of an earlier campaign (a waiter's retry, or claiming a grant it heard);
    /// when elected, its proclaim.
    Retry { call: usize },
    /// A proclaim by an earlier campaign with its term (or, never elected, the last term minted:
    /// a non-leader's proclaim).
    Proclaim { call: usize, value: usize },
    /// The last proclaim sent again, with the same request id (its reply was lost and fred
    /// re-sent it): it must change and publish nothing, and answer as the first did while the
    /// record still carries it.
    Resend,
    /// A proclaim under a term that is not the campaign's own (off by `by`).
    WrongTerm { call: usize, by: i64, value: usize },
    /// `resign()`: the resign script with the campaign's term, then the fenced release.
    Resign { call: usize },
    /// The resign script alone (a resign whose release has not run yet).
    ResignOnly { call: usize },
    /// A leadership dropped without resigning: the fenced release alone.
    Release { call: usize },
    /// `leader()`.
    Leader,
    /// The watchdog's renewal of a campaign's hold.
    Renew { call: usize, lease_ms: u64 },
    /// A waiting campaign gives up.
    Cancel { call: usize },
    /// The subscriber stops or starts listening on candidate client `client`'s channel.
    Listen { client: usize, on: bool },
    /// Time passes.
    Sleep { ms: u64 },
    /// Time passes until every hold has lapsed, when they all end within 60 ms.
    LapseHolds,
    /// `DUMP` of every key...
    Snapshot,
    /// ...`RESTORE` of it later (a restart from an older snapshot).
    Restore,
}

/// Values, some with spaces, colons or empty.
const VALUES: [&str; 5] = ["pod-a", "pod b", "", "x:y:z", "ünï"];

fn lease_ms() -> impl Strategy<Value = u64> {
    prop_oneof![2 => 3u64..40, 3 => Just(LONG_MS)]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0usize..3, lease_ms(), prop::option::weighted(0.7, prop_oneof![1 => 3u64..40, 4 => Just(LONG_MS)]), 0usize..5)
            .prop_map(|(cand, lease_ms, keepalive_ms, value)| Op::Campaign { cand, lease_ms, keepalive_ms, value }),
        4 => any::<usize>().prop_map(|call| Op::Retry { call }),
        5 => (any::<usize>(), 0usize..5).prop_map(|(call, value)| Op::Proclaim { call, value }),
        2 => Just(Op::Resend),
        1 => (any::<usize>(), prop_oneof![Just(-1i64), Just(1i64), Just(-1000i64)], 0usize..5)
            .prop_map(|(call, by, value)| Op::WrongTerm { call, by, value }),
        4 => any::<usize>().prop_map(|call| Op::Resign { call }),
        1 => any::<usize>().prop_map(|call| Op::ResignOnly { call }),
        2 => any::<usize>().prop_map(|call| Op::Release { call }),
        5 => Just(Op::Leader),
        2 => (any::<usize>(), lease_ms()).prop_map(|(call, lease_ms)| Op::Renew { call, lease_ms }),
        2 => any::<usize>().prop_map(|call| Op::Cancel { call }),
        2 => (0usize..2, any::<bool>()).prop_map(|(client, on)| Op::Listen { client, on }),
        3 => (1u64..45).prop_map(|ms| Op::Sleep { ms }),
        2 => Just(Op::LapseHolds),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Restore),
    ]
}

// === the environment ===

struct Env {
    seen: std::cell::RefCell<BTreeMap<String, u64>>,
    rt: tokio::runtime::Runtime,
    server: RedisServer,
    redis: Fred,
}

impl Env {
    fn start() -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (server, redis) = rt.block_on(async {
            let server = spawned().await;
            let redis = raw(&server.url()).await;
            (server, redis)
        });
        Env {
            seen: std::cell::RefCell::default(),
            rt,
            server,
            redis,
        }
    }

    fn count(&self, what: &str) {
        *self.seen.borrow_mut().entry(what.to_owned()).or_default() += 1;
    }
}

/// A connection in subscribed mode (RESP2): what a real subscriber sees.
struct Subscriber {
    conn: tokio::net::TcpStream,
    buf: Vec<u8>,
}

/// A message a subscriber got: its channel and payload.
type Got = (String, String);

impl Subscriber {
    async fn connect(addr: std::net::SocketAddr) -> Self {
        let conn = tokio::net::TcpStream::connect(addr)
            .await
            .expect("a subscriber connection");
        Self {
            conn,
            buf: Vec::new(),
        }
    }

    async fn next(&mut self) -> RespValue {
        use tokio::io::AsyncReadExt;
        loop {
            if let Some((value, used)) = RespValue::parse(&self.buf).expect("RESP") {
                self.buf.drain(..used);
                return value;
            }
            let mut chunk = [0u8; 4096];
            let n = lockkit_suite::within(Duration::from_secs(10), "the subscriber", async {
                self.conn.read(&mut chunk).await
            })
            .await
            .expect("reading the subscriber connection");
            assert!(n > 0, "the subscriber connection closed");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends `args` and reads up to the reply of kind `kind`; the messages before it.
    async fn until(&mut self, args: &[&str], kind: &str) -> Vec<Got> {
        use tokio::io::AsyncWriteExt;
        self.conn
            .write_all(&lockkit_testkit::encode_command(args))
            .await
            .expect("a command to the subscriber connection");
        let mut got = Vec::new();
        loop {
            let value = self.next().await;
            let parts: Vec<String> = value
                .as_array()
                .unwrap_or_default()
                .iter()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect();
            match parts.first().map(String::as_str) {
                Some("message") if parts.len() == 3 => {
                    got.push((parts[1].clone(), parts[2].clone()));
                }
                Some(k) if k == kind => return got,
                _ => panic!("unexpected on the subscriber connection: {value:?}"),
            }
        }
    }

    /// Every message delivered so far (a script's PUBLISH is written before its reply).
    async fn drain(&mut self) -> Vec<Got> {
        self.until(&["PING"], "pong").await
    }

    async fn listen(&mut self, channel: &str, on: bool) -> Vec<Got> {
        if on {
            self.until(&["SUBSCRIBE", channel], "subscribe").await
        } else {
            self.until(&["UNSUBSCRIBE", channel], "unsubscribe").await
        }
    }
}

/// A script's reply as strings (integers and bulk strings alike), or Redis' error.
async fn run(
    redis: &Fred,
    script: &Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Vec<String>, String> {
    let script = FredScript::from_lua(script.source());
    match script
        .evalsha_with_reload::<Value, _, _>(redis, keys, args)
        .await
    {
        Ok(value) => Ok(value
            .into_array()
            .iter()
            .map(|v| v.as_string().unwrap_or_default())
            .collect()),
        Err(err) => Err(err.details().to_owned()),
    }
}

fn ints(reply: &[String]) -> Vec<i64> {
    reply
        .iter()
        .map(|s| s.parse().unwrap_or(i64::MIN))
        .collect()
}

/// Redis' keys in the model's form: hash fields as sorted `field=value`, the waiting set as its
/// members in order, deadlines as sorted `member=score`, no expiry but the main key's and the
/// counter's.
fn normalize(raw: &[RawKey], roles: &[&str]) -> Vec<RawKey> {
    raw.iter()
        .zip(roles)
        .map(|(k, role)| {
            let pairs = |items: &[String]| -> Vec<String> {
                let mut pairs: Vec<String> = items
                    .chunks(2)
                    .map(|p| format!("{}={}", p[0], p.get(1).map_or("", String::as_str)))
                    .collect();
                pairs.sort();
                pairs
            };
            let items = match (k.ty.as_str(), *role) {
                ("hash", _) => pairs(&k.items),
                ("zset", "waiting") => k.items.iter().step_by(2).cloned().collect(),
                ("zset", _) => pairs(&k.items),
                _ => k.items.clone(),
            };
            let expire_at = match *role {
                "main" | "token" | "leader" => k.expire_at,
                _ if k.ty == "none" => k.expire_at,
                _ => ANY,
            };
            key(&k.ty, items, expire_at)
        })
        .collect()
}

/// The model's keys at `now`, in the same form.
fn model_keys(model: &ElectionSpec, roles: &[&str], now: u64) -> Vec<RawKey> {
    let view = model.view(now);
    let lock = &view.lock;
    roles
        .iter()
        .map(|role| match *role {
            "leader" => match &view.record {
                Some(r) => {
                    let mut items = vec![
                        format!("version={}", r.version),
                        format!("marker={}", r.marker),
                        format!("owner={}", r.owner),
                        format!("term={}", r.term),
                        format!("value={}", r.value),
                        format!("request={}", r.request),
                    ];
                    items.sort();
                    // It expires with its hold: the model knows when.
                    key("hash", items, as_i64(r.expiry))
                }
                None => absent(),
            },
            role => hash_lock_key(lock, role),
        })
        .collect()
}

// === one program ===

/// A script call, with its names resolved.
#[derive(Debug, Clone)]
enum Call {
    Acquire(Request),
    Proclaim {
        marker: String,
        owner: String,
        term: u64,
        value: String,
        request: String,
    },
    Resign {
        marker: String,
        term: u64,
    },
    Release(String),
    Leader,
    Renew(String, u64),
    Cancel(String),
}

/// What the model says a call answers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Acquire(Result<Acquired, WrongType>),
    Release(Result<Released, WrongType>),
    Flag(bool),
    /// The leader's term, version and value; or where the change channel stands.
    Leader(Result<(u64, u64, String), (u64, bool)>),
    Renew(bool),
    Cancel(Result<bool, WrongType>),
}

fn apply(model: &mut ElectionSpec, call: &Call, now: Now) -> Expected {
    match call {
        Call::Acquire(req) => Expected::Acquire(model.campaign(now, req)),
        Call::Proclaim {
            marker,
            owner,
            term,
            value,
            request,
        } => Expected::Flag(model.proclaim(now, marker, owner, *term, value, request)),
        Call::Resign { marker, term } => Expected::Flag(model.resign(now, marker, *term)),
        Call::Release(marker) => Expected::Release(model.release(now, marker)),
        Call::Leader => Expected::Leader(model.leader(now).ok_or_else(|| model.nobody(now))),
        Call::Renew(marker, lease) => Expected::Renew(model.renew(now.ms, marker, *lease)),
        Call::Cancel(entry) => Expected::Cancel(model.cancel(now, entry)),
    }
}

fn agrees(expected: &Expected, actual: &Result<Vec<String>, String>, now: u64) -> bool {
    let Ok(reply) = actual else {
        return false;
    };
    let n = ints(reply);
    let refusal = |until: Option<u64>, left: Option<u64>, at: u64| {
        at == now
            && match (until, left) {
                (None, None) => true,
                (Some(until), Some(left)) => {
                    (as_i64(left) - (as_i64(until) - as_i64(now))).abs() <= 2
                }
                _ => false,
            }
    };
    match expected {
        Expected::Acquire(Ok(Acquired::Granted { count, token })) => matches!(
            AcquireReply::decode(&n),
            Ok(AcquireReply::Acquired { hold_count, token: t }) if hold_count == *count && t == *token
        ),
        Expected::Acquire(Ok(Acquired::Busy { until })) => matches!(
            AcquireReply::decode(&n),
            Ok(AcquireReply::Busy { pttl_ms, now_ms }) if refusal(*until, pttl_ms, now_ms)
        ),
        Expected::Acquire(Ok(Acquired::Reserved { until })) => matches!(
            AcquireReply::decode(&n),
            Ok(AcquireReply::Reserved { window_ms, now_ms })
                if refusal(Some(*until), Some(window_ms), now_ms)
        ),
        Expected::Release(Ok(released)) => {
            let want = match released {
                Released::Freed => ReleaseReply::Freed,
                Released::StillHeld(hold_count) => ReleaseReply::StillHeld {
                    hold_count: *hold_count,
                },
                Released::NotHeld => ReleaseReply::NotHeld,
            };
            ReleaseReply::decode(&n) == Ok(want)
        }
        Expected::Flag(flag) => n == [i64::from(*flag)],
        Expected::Leader(Err((term, over))) => {
            election::decode_read(reply)
                == Ok(election::LeaderRead::Nobody(election::Nobody {
                    term: *term,
                    over: *over,
                }))
        }
        Expected::Leader(Ok((term, version, value))) => election::decode_leader(reply)
            .ok()
            .flatten()
            .is_some_and(|got| got.term == *term && got.version == *version && got.value == *value),
        Expected::Renew(live) => lock::decode_renew(&n, 1).as_ref() == Ok(&vec![*live]),
        Expected::Cancel(Ok(flag)) => lock::decode_cancel(&n) == Ok(*flag),
        Expected::Acquire(_) | Expected::Release(Err(_)) | Expected::Cancel(Err(_)) => false,
    }
}

fn outcome(expected: &Expected, call: &Call) -> String {
    let what = match call {
        Call::Acquire(_) => "campaign",
        Call::Proclaim { .. } => "proclaim",
        Call::Resign { .. } => "resign",
        Call::Release(_) => "release",
        Call::Leader => "leader",
        Call::Renew(..) => "renew",
        Call::Cancel(_) => "cancel",
    };
    let how = match expected {
        Expected::Acquire(Ok(Acquired::Granted { .. })) => "elected".to_owned(),
        Expected::Acquire(Ok(Acquired::Busy { .. })) => "busy".to_owned(),
        Expected::Acquire(r) => format!("{r:?}"),
        Expected::Release(Ok(r)) => format!("{r:?}"),
        Expected::Flag(f) | Expected::Renew(f) => f.to_string(),
        Expected::Leader(l) => if l.is_ok() { "some" } else { "none" }.to_owned(),
        Expected::Cancel(c) => format!("{c:?}"),
        Expected::Release(Err(_)) => "wrong type".to_owned(),
    };
    format!("{what}: {how}")
}

/// One campaign call: its request, value, and the term it was elected with.
#[derive(Debug, Clone)]
struct Campaign {
    req: Request,
    value: String,
    term: Option<u64>,
}

struct Program<'a> {
    env: &'a Env,
    keys: ObjectKeys,
    roles: Vec<&'static str>,
    changes: String,
    channels: [String; 2],
    model: ElectionSpec,
    calls: Vec<Campaign>,
    subscriber: Subscriber,
    snapshot: Option<(Vec<Dump>, ElectionSpec)>,
    sequence: u64,
    /// Proclaim requests so far (each gets the next id).
    requests: u64,
    /// The last proclaim sent, for [`Op::Resend`].
    last_proclaim: Option<Call>,
    log: Vec<String>,
}

impl<'a> Program<'a> {
    async fn new(env: &'a Env) -> Program<'a> {
        let name = unique("model election");
        let keys = Namespace::default()
            .object(Kind::Election, &name)
            .expect("valid keys");
        let mut roles = vec!["main"];
        roles.extend(keys.suffixes.iter().copied());
        assert_eq!(
            &roles[..6],
            ["main", "token", "handoff", "waiting", "timeouts", "leader"],
            "the election's keys"
        );
        let changes = election::changes_channel(&keys);
        let channels = CLIENTS.map(|client| format!("{}:{client}", keys.channel));
        let mut model = ElectionSpec::new(&changes);
        let mut subscriber = Subscriber::connect(env.server.addr()).await;
        for channel in [&keys.channel, &changes, &channels[0], &channels[1]] {
            assert!(subscriber.listen(channel, true).await.is_empty());
            model.lock.listen(channel, true);
        }
        Program {
            env,
            keys,
            roles,
            changes,
            channels,
            model,
            calls: Vec::new(),
            subscriber,
            snapshot: None,
            sequence: 0,
            requests: 0,
            last_proclaim: None,
            log: Vec::new(),
        }
    }

    fn lock_keys(&self) -> Vec<String> {
        self.keys.keys[..5].to_vec()
    }

    fn record_keys(&self) -> Vec<String> {
        vec![self.keys.key.clone(), self.keys.keys[5].clone()]
    }

    fn aux(&self, suffix: &str) -> String {
        self.keys
            .aux(suffix)
            .expect("a key of the election")
            .to_owned()
    }

    fn pick(&self, call: usize) -> Option<Campaign> {
        (!self.calls.is_empty()).then(|| self.calls[call % self.calls.len()].clone())
    }

    /// The term a campaign proclaims under: its own, or (never elected) the last one minted.
    fn term_of(&self, campaign: &Campaign) -> u64 {
        campaign.term.unwrap_or(self.model.lock.issued)
    }

    fn script(&self, call: &Call) -> (&'static Script, Vec<String>, Vec<String>) {
        let flag = "0".to_owned();
        match call {
            Call::Acquire(r) => (
                &fenced_lock::ACQUIRE,
                self.lock_keys(),
                vec![
                    r.owner.clone(),
                    r.marker.clone(),
                    r.lease_ms.to_string(),
                    r.keepalive_ms.to_string(),
                    r.channel.clone(),
                    flag,
                ],
            ),
            Call::Release(marker) => (
                &fenced_lock::RELEASE,
                self.lock_keys(),
                vec![marker.clone(), self.keys.channel.clone(), flag],
            ),
            // The election's renewal takes every key of the election (the record last).
            Call::Renew(marker, lease) => (
                &election::RENEW,
                self.keys.keys.clone(),
                vec![marker.clone(), lease.to_string()],
            ),
            Call::Cancel(entry) => (
                &lock::CANCEL,
                vec![
                    self.keys.key.clone(),
                    self.aux("handoff"),
                    self.aux("waiting"),
                    self.aux("timeouts"),
                    self.aux("token"),
                ],
                vec![entry.clone(), self.keys.channel.clone(), flag],
            ),
            Call::Proclaim {
                marker,
                owner,
                term,
                value,
                request,
            } => (
                &election::PROCLAIM,
                self.record_keys(),
                vec![
                    marker.clone(),
                    owner.clone(),
                    term.to_string(),
                    value.clone(),
                    self.changes.clone(),
                    flag,
                    request.clone(),
                ],
            ),
            Call::Resign { marker, term } => (
                &election::RESIGN,
                self.record_keys(),
                vec![marker.clone(), term.to_string(), self.changes.clone(), flag],
            ),
            Call::Leader => {
                let mut keys = self.record_keys();
                keys.push(self.aux("token"));
                (&election::LEADER, keys, Vec::new())
            }
        }
    }

    /// A new proclaim request id.
    fn next_request(&mut self) -> String {
        self.requests += 1;
        self.requests.to_string()
    }

    /// Runs one script call on Redis and on the model; `Err` says how they disagree.
    async fn call(&mut self, call: &Call) -> Result<Expected, String> {
        if matches!(call, Call::Proclaim { .. }) {
            self.last_proclaim = Some(call.clone());
        }
        let redis = &self.env.redis;
        let (script, keys, args) = self.script(call);
        let t0 = time(redis).await;
        let actual = run(redis, script, keys, args).await;
        let t1 = time(redis).await;
        let got = self.subscriber.drain().await;
        let (raw, now) = read_state(redis, &self.keys.keys).await;
        // A fenced mint uses the µs of the script's own TIME: the counter after shows it.
        let mut clocks = vec![None];
        if let Some(counter) = raw[1].items.first().and_then(|c| c.parse::<u64>().ok()) {
            let mints = self.model.lock.waiting.items.len() as u64 + 1;
            clocks.extend(
                (1..=mints)
                    .filter_map(|k| counter.checked_sub(k))
                    .filter(|us| (t0.us..=t1.us).contains(us))
                    .map(Some),
            );
        }
        let mut candidates = Vec::new();
        let mut first = None;
        let instants = (t0.ms.saturating_sub(2)..=t1.ms + 2)
            .flat_map(|ms| (t0.ms.saturating_sub(2)..=ms).map(move |keys_ms| (ms, keys_ms)));
        for ((ms, keys_ms), clock) in instants.flat_map(|i| clocks.iter().map(move |c| (i, *c))) {
            let now = Now {
                ms,
                us: clock.unwrap_or_else(|| t0.us.max(ms * 1000)),
                keys_ms,
            };
            let mut model = self.model.clone();
            let expected = apply(&mut model, call, now);
            let sent: Vec<Got> = model
                .lock
                .take_messages()
                .into_iter()
                .filter(|m| m.heard)
                .map(|m| (m.channel, m.payload))
                .collect();
            first.get_or_insert_with(|| (expected.clone(), sent.clone()));
            if agrees(&expected, &actual, ms) && sent == got {
                candidates.push((model, expected));
            }
        }
        self.log
            .push(format!("{call:?} -> {actual:?}, heard {got:?}"));
        if candidates.is_empty() {
            let (expected, sent) = first.expect("one instant at least");
            return Err(format!(
                "reply of {call:?}: Redis said {actual:?} and the subscriber heard {got:?}; the model {expected:?}, heard {sent:?} (at {} ms)\nmodel before: {:#?}",
                t0.ms, self.model
            ));
        }
        self.settle(&raw, now, candidates)
    }

    /// Picks the first candidate model whose keys are Redis' and whose invariants hold.
    fn settle(
        &mut self,
        raw: &[RawKey],
        now: u64,
        candidates: Vec<(ElectionSpec, Expected)>,
    ) -> Result<Expected, String> {
        let seen = normalize(raw, &self.roles);
        for (model, expected) in &candidates {
            let views: Vec<Vec<RawKey>> = (now - 2..=now + 2)
                .map(|at| model_keys(model, &self.roles, at))
                .collect();
            if (0..seen.len()).all(|i| views.iter().any(|view| view[i] == seen[i])) {
                model
                    .check(now)
                    .map_err(|why| format!("invariant: {why}"))?;
                self.model = model.clone();
                self.follow_expiries(raw);
                return Ok(expected.clone());
            }
        }
        Err(format!(
            "keys (at {now} ms):\nRedis:  {seen:?}\nmodel:  {:?}\nmodel state: {:#?}",
            model_keys(&candidates[0].0, &self.roles, now),
            candidates[0].0
        ))
    }

    /// Expiries Redis sets from its own clock (relative TTLs) are taken from Redis.
    fn follow_expiries(&mut self, raw: &[RawKey]) {
        for (role, k) in self.roles.iter().zip(raw) {
            let Ok(at) = u64::try_from(k.expire_at) else {
                continue;
            };
            match *role {
                "handoff" => {
                    if let Some((_, until)) = &mut self.model.lock.handoff {
                        *until = at;
                    }
                }
                "waiting" => self.model.lock.waiting.expiry = Some(at),
                "timeouts" => self.model.lock.timeouts.expiry = Some(at),
                // The leader record's expiry is its hold's: the model predicts it.
                _ => {}
            }
        }
    }

    /// A campaign's acquire, and its proclaim when elected (as `campaign` does).
    async fn campaign(&mut self, index: usize) -> Result<(), String> {
        let req = self.calls[index].req.clone();
        let expected = self.call(&Call::Acquire(req.clone())).await?;
        self.env
            .count(&outcome(&expected, &Call::Acquire(req.clone())));
        if let Expected::Acquire(Ok(Acquired::Granted {
            token: Some(term), ..
        })) = expected
        {
            self.calls[index].term = Some(term);
            let proclaim = Call::Proclaim {
                marker: req.marker.clone(),
                owner: req.owner.clone(),
                term,
                value: self.calls[index].value.clone(),
                request: self.next_request(),
            };
            let expected = self.call(&proclaim).await?;
            self.env.count(&outcome(&expected, &proclaim));
        }
        Ok(())
    }

    async fn step(&mut self, op: &Op) -> Result<(), String> {
        let call = match op {
            Op::Campaign {
                cand,
                lease_ms,
                keepalive_ms,
                value,
            } => {
                self.sequence += 1;
                let client = CLIENTS[cand % 2];
                let req = Request {
                    owner: format!("{client}:{}", 1000 + cand),
                    marker: hold_marker(client, self.sequence),
                    lease_ms: *lease_ms,
                    keepalive_ms: keepalive_ms.unwrap_or(0),
                    waiter: String::new(),
                    channel: self.channels[cand % 2].clone(),
                    look: false,
                };
                self.calls.push(Campaign {
                    req,
                    value: VALUES[*value].to_owned(),
                    term: None,
                });
                return self.campaign(self.calls.len() - 1).await;
            }
            Op::Retry { call } if !self.calls.is_empty() => {
                return self.campaign(call % self.calls.len()).await;
            }
            Op::Proclaim { call, value } => self.pick(*call).map(|c| Call::Proclaim {
                marker: c.req.marker.clone(),
                owner: c.req.owner.clone(),
                term: self.term_of(&c),
                value: VALUES[*value].to_owned(),
                request: self.next_request(),
            }),
            Op::Resend => self.last_proclaim.clone(),
            Op::WrongTerm { call, by, value } => self.pick(*call).map(|c| Call::Proclaim {
                marker: c.req.marker.clone(),
                owner: c.req.owner.clone(),
                term: self.term_of(&c).saturating_add_signed(*by),
                value: VALUES[*value].to_owned(),
                request: self.next_request(),
            }),
            Op::Resign { call } => {
                if let Some(c) = self.pick(*call) {
                    let resign = Call::Resign {
                        marker: c.req.marker.clone(),
                        term: self.term_of(&c),
                    };
                    let expected = self.call(&resign).await?;
                    self.env.count(&outcome(&expected, &resign));
                    let release = Call::Release(c.req.marker.clone());
                    let expected = self.call(&release).await?;
                    self.env.count(&outcome(&expected, &release));
                }
                return Ok(());
            }
            Op::ResignOnly { call } => self.pick(*call).map(|c| Call::Resign {
                marker: c.req.marker.clone(),
                term: self.term_of(&c),
            }),
            Op::Release { call } => self.pick(*call).map(|c| Call::Release(c.req.marker)),
            Op::Leader => Some(Call::Leader),
            Op::Renew { call, lease_ms } => self
                .pick(*call)
                .map(|c| Call::Renew(c.req.marker, *lease_ms)),
            Op::Cancel { call } => self.pick(*call).map(|c| Call::Cancel(c.req.entry())),
            other => {
                self.other(other).await?;
                None
            }
        };
        if let Some(call) = call {
            let expected = self.call(&call).await?;
            self.env.count(&outcome(&expected, &call));
        }
        Ok(())
    }

    async fn other(&mut self, op: &Op) -> Result<(), String> {
        let redis = &self.env.redis;
        self.log.push(format!("{op:?}"));
        self.env.count(
            format!("{op:?}")
                .split([' ', '('])
                .next()
                .unwrap_or_default(),
        );
        match op {
            Op::Sleep { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
            Op::LapseHolds => {
                let now = time(redis).await.ms;
                if let Some(left) = self
                    .model
                    .lock
                    .key_expiry()
                    .map(|at| at.saturating_sub(now))
                {
                    if left <= 60 {
                        tokio::time::sleep(Duration::from_millis(left + 1)).await;
                    }
                }
            }
            Op::Listen { client, on } => {
                let channel = self.channels[*client].clone();
                let stray = self.subscriber.listen(&channel, *on).await;
                if !stray.is_empty() {
                    return Err(format!(
                        "the subscriber heard {stray:?} after the last step"
                    ));
                }
                self.model.lock.listen(&channel, *on);
            }
            Op::Snapshot => {
                let dumps: Value = FredScript::from_lua(DUMP_KEYS)
                    .evalsha_with_reload(redis, self.keys.keys.clone(), Vec::<String>::new())
                    .await
                    .map_err(|e| e.to_string())?;
                let dumps = dumps
                    .into_array()
                    .into_iter()
                    .zip(&self.keys.keys)
                    .map(|(entry, key)| {
                        let mut entry = entry.into_array().into_iter();
                        let dump = entry.next().and_then(|v| v.as_bytes().map(<[u8]>::to_vec));
                        let at = entry.next().and_then(|v| v.as_i64()).unwrap_or(-2);
                        (key.clone(), dump, at)
                    })
                    .collect();
                self.snapshot = Some((dumps, self.model.clone()));
            }
            Op::Restore => {
                let Some((dumps, then)) = self.snapshot.clone() else {
                    return Ok(());
                };
                let command = |name| CustomCommand::new_static(name, ClusterHash::FirstKey, false);
                for (key, dump, at) in dumps {
                    match dump {
                        Some(bytes) => {
                            let _: Value = redis
                                .custom(
                                    command("RESTORE"),
                                    vec![
                                        Value::from(key.as_str()),
                                        Value::from(at.max(0)),
                                        Value::Bytes(bytes.into()),
                                        Value::from("REPLACE"),
                                        Value::from("ABSTTL"),
                                    ],
                                )
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                        None => {
                            let _: i64 = redis
                                .custom(command("DEL"), vec![key.as_str()])
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                    }
                }
                self.model.restore(&then);
                // A candidate's term from after the snapshot is not in the keys any more.
            }
            _ => {}
        }
        let got = self.subscriber.drain().await;
        if !got.is_empty() {
            return Err(format!("after {op:?} the subscriber heard {got:?}"));
        }
        Ok(())
    }
}

// === the runner ===

fn run_programs(name: &str, ops: impl Strategy<Value = Op>) {
    let env = Env::start();
    let seed = model_seed();
    let mut runner = TestRunner::new(Config {
        cases: cases(),
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    });
    let result = runner.run(&prop::collection::vec(ops, 1..50), |ops| {
        let mut program = env.rt.block_on(Program::new(&env));
        for (i, op) in ops.iter().enumerate() {
            if let Err(why) = env.rt.block_on(program.step(op)) {
                return Err(TestCaseError::fail(format!(
                    "step {i} disagrees: {why}\nsteps run:\n  {}",
                    program.log.join("\n  ")
                )));
            }
        }
        Ok(())
    });
    match result {
        Ok(()) => {
            eprintln!(
                "{name}: {} cases passed (seed {seed}); steps: {:?}",
                cases(),
                env.seen.borrow()
            );
        }
        Err(TestError::Fail(why, ops)) => panic!(
            "{name} disagrees with ElectionSpec (LOCKKIT_MODEL_SEED={seed}).\nShrunk program: {ops:#?}\n{why}"
        ),
        Err(TestError::Abort(why)) => panic!("{name} aborted (seed {seed}): {why}"),
    }
}

#[test]
fn election_agrees_with_its_model() {
    run_programs("election", op());
    save_model_cases("election", cases());
}

/// Programs that keep the election contended: campaigns that wait, resigns, proclaims from
/// leaders and deposed leaders, and lapses, so that most resigns hand leadership over.
#[test]
fn contended_election_agrees_with_its_model() {
    let contended = prop_oneof![
        8 => (0usize..3, lease_ms(), prop_oneof![1 => Just(None), 6 => Just(Some(LONG_MS))], 0usize..5)
            .prop_map(|(cand, lease_ms, keepalive_ms, value)| Op::Campaign { cand, lease_ms, keepalive_ms, value }),
        5 => any::<usize>().prop_map(|call| Op::Retry { call }),
        5 => (any::<usize>(), 0usize..5).prop_map(|(call, value)| Op::Proclaim { call, value }),
        2 => Just(Op::Resend),
        6 => any::<usize>().prop_map(|call| Op::Resign { call }),
        4 => Just(Op::Leader),
        2 => any::<usize>().prop_map(|call| Op::Cancel { call }),
        2 => (1u64..45).prop_map(|ms| Op::Sleep { ms }),
        3 => Just(Op::LapseHolds),
    ];
    run_programs("election (contended)", contended);
}
