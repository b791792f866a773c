//! Model-based test of the leader election (issue 22), in the style of `model_locks.rs`:
//! generated programs of campaign / proclaim / resign / leader / renew / cancel / clock steps by
//! three candidates run against the real scripts (the fenced lock's acquire, release and cancel
//! on the election's first five keys, and `election_renew`, `election_proclaim`,
//! `election_resign`, `election_leader`) on a real `redis-server`, and against `lockkit_model::election::ElectionSpec`.
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
//!
//! Issue 27, §4: checks that explore what the programs above did not — each a test of its own, so
//! a failure names the promise it breaks:
//! - **duplicates** (`election_duplicate_deliveries_change_nothing`): `Op::Duplicate` delivers the
//!   previous request again, exactly (same script, KEYS and ARGV), as fred does after a lost reply
//!   for the scripts the client sends with `Resend::Allowed` (every election script but the
//!   release). The second delivery must answer as the first did (or as the client treats the
//!   same), change no key beyond moving an expiry on by the time that passed, and publish
//!   nothing;
//! - **time** (`election_record_lives_as_long_as_its_leadership`): the fenced scripts are given a
//!   token counter TTL of a few ms (as `token_counter_ttl` gives it to them; before issue 27 the
//!   proclaim took the same TTL for the record), leases are mostly longer and renewed by
//!   `election_renew`, and time passes: whenever the leader that last announced itself still
//!   holds its live hold, the record must be there and name it (and, as in every program, expire
//!   exactly with that hold);
//! - **rollbacks** (`election_terms_never_go_back_after_a_restart_from_a_snapshot`): `SAVE`, more
//!   steps, then the server killed and started again from that snapshot (an empty script cache
//!   too): the model goes back with the keys, the terms it handed out do not, and every new term
//!   must exceed them all;
//! - **the observer's state** (`observer_*`): a real `Election::observe` stream of a lockkit client
//!   (behind a `FaultProxy` whose delay spreads its reads among the steps) is part of the program.
//!   A `MONITOR` connection places each of its reads of the leader among the program's script
//!   calls, so what the stream may deliver follows from the model: `Current`/`Resynced` what a
//!   read found, then exactly the changes published after that read, each once, terms never going
//!   back (see [`judge_observer`]).

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
use lockkit::LeaderChange;
use lockkit_model::election::ElectionSpec;
use lockkit_model::lock::{Acquired, Now, Released, Request, WrongType};
use lockkit_suite::checker::{model_seed, save_model_cases};
use lockkit_suite::model_io::{
    absent, as_i64, cases, cases_scaled, hash_lock_key, key, lapsed_nothing, read_state, time,
    unchanged_keys, Monitor, Monitored, RawKey, ANY, CLIENTS, DUMP_KEYS,
};
use lockkit_suite::{raw_like_lockkit, spawned, unique, RedisServer};
use lockkit_testkit::{FaultProxy, RespValue};
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
    /// As `Retry`, of a campaign never elected: what the client sends (a waiter's retry, or the
    /// claim of a grant it heard). The client never sends a leader's acquire again after its
    /// proclaim; `Retry` may, and that extends the hold without its record (see
    /// `observer_delivers_every_proclaim_of_a_long_leadership`), so the checks of the record's
    /// lifetime and of the observer use this one.
    RetryWaiter { call: usize },
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
    /// The watchdog's renewal of the last campaign that was elected (the leader, unless it
    /// resigned or lapsed since).
    RenewLeader { lease_ms: u64 },
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
    /// ...`RESTORE` of it later (a restart from an older snapshot), in one script.
    Restore,
    /// The previous request delivered again, exactly (fred re-sending it after a lost reply).
    Duplicate,
    /// `SAVE`: the server's snapshot on disk...
    Save,
    /// ...and, later, the server killed and started again from it (every key of the server goes
    /// back to it, the script cache is empty, every connection is re-established).
    Restart,
    /// The real observer starts (programs with one; later ones do nothing).
    Observe,
    /// Every connection of the observer's client is cut (it reconnects and resyncs).
    Cut,
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
    addr: std::net::SocketAddr,
    /// Behind a lock for `Op::Restart`.
    server: tokio::sync::Mutex<RedisServer>,
    /// The steps' connection (it reconnects after a restart).
    redis: Fred,
    /// Its address, as `MONITOR` names its commands.
    redis_addr: String,
    /// Programs with an observer: a lockkit client behind a proxy (its delay spreads the
    /// observer's reads among the steps; `Op::Cut` cuts its connections).
    watcher: Option<(FaultProxy, lockkit::Client)>,
}

impl Env {
    fn start(observers: bool) -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (server, redis, redis_addr, watcher) = rt.block_on(async {
            let server = spawned().await;
            let redis = raw_like_lockkit(&server.url()).await;
            let info: String = redis
                .custom(
                    CustomCommand::new_static("CLIENT", ClusterHash::Random, false),
                    vec!["INFO"],
                )
                .await
                .expect("CLIENT INFO");
            let redis_addr = info
                .split(' ')
                .find_map(|field| field.strip_prefix("addr="))
                .expect("an addr in CLIENT INFO")
                .to_owned();
            let watcher = if observers {
                let proxy = FaultProxy::start(server.addr()).await.expect("a proxy");
                let client = lockkit_suite::client(&proxy.url()).await;
                Some((proxy, client))
            } else {
                None
            };
            (server, redis, redis_addr, watcher)
        });
        Env {
            seen: std::cell::RefCell::default(),
            rt,
            addr: server.addr(),
            server: tokio::sync::Mutex::new(server),
            redis,
            redis_addr,
            watcher,
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
                None => match view.resigned {
                    // A resigned term whose hold is not released yet.
                    Some((term, expiry)) => {
                        key("hash", vec![format!("resigned={term}")], as_i64(expiry))
                    }
                    None => absent(),
                },
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
    /// Every key of the election put back as in the snapshot, in one script (`RESTORE …
    /// REPLACE ABSTTL`, `DEL` for the keys it did not have).
    Restore(Box<Snapshot>),
    /// Every key of the election deleted (the observer programs' last leader starts afresh).
    Clear,
}

impl Call {
    /// Whether the client sends it with `Resend::Allowed` (fred may deliver it twice): every
    /// election script but the fenced release.
    fn resendable(&self) -> bool {
        matches!(
            self,
            Call::Acquire(_)
                | Call::Proclaim { .. }
                | Call::Resign { .. }
                | Call::Leader
                | Call::Renew(..)
                | Call::Cancel(_)
        )
    }
}

/// The keys of the election at one instant (`DUMP`s, hex-encoded for the restore script's ARGV,
/// and `PEXPIRETIME`s) and the model then.
#[derive(Clone)]
struct Snapshot {
    dumps: Vec<(Option<String>, i64)>,
    model: ElectionSpec,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = self.dumps.iter().filter(|(d, _)| d.is_some()).count();
        write!(f, "<snapshot of {keys} keys>")
    }
}

/// Puts an object's keys back: `ARGV[2i-1]` is key `i`'s `DUMP` in hex (empty: the key did not
/// exist), `ARGV[2i]` its `PEXPIRETIME` (not positive: none).
static RESTORE_KEYS: Script = Script::new(
    "model_restore_keys",
    r"
for i, key in ipairs(KEYS) do
  local hex, at = ARGV[2 * i - 1], tonumber(ARGV[2 * i])
  redis.call('DEL', key)
  if hex ~= '' then
    local dump = hex:gsub('..', function(h) return string.char(tonumber(h, 16)) end)
    if at > 0 then
      redis.call('RESTORE', key, at, dump, 'REPLACE', 'ABSTTL')
    else
      redis.call('RESTORE', key, 0, dump, 'REPLACE')
    end
  end
end
return {1}
",
);

/// Deletes an object's keys.
static CLEAR_KEYS: Script = Script::new(
    "model_clear_keys",
    r"
for _, key in ipairs(KEYS) do
  redis.call('DEL', key)
end
return {1}
",
);

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
        Call::Restore(snapshot) => {
            model.restore(&snapshot.model);
            Expected::Flag(true)
        }
        Call::Clear => {
            let empty = ElectionSpec::new(&model.channel);
            model.restore(&empty);
            Expected::Flag(true)
        }
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
        Call::Restore(_) => "restore",
        Call::Clear => "clear",
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

/// What a program is run with, and checked for beyond its model.
#[derive(Debug, Clone, Copy)]
struct Setup {
    /// The token counter TTL the fenced scripts are given (the client's `token_counter_ttl`).
    /// Since issue 27 the record takes no TTL: it expires with its hold.
    ttl_ms: u64,
    /// Issue 27, item 1: whenever the leader that announced itself last still holds its live
    /// hold, the record must be there and name it.
    record_lives: bool,
    /// A real observer: its client's proxy delay (ms), and whether each `Op::Cut` waits for the
    /// resynchronisation before the program goes on (so no announcement is in flight when the
    /// observer reads the leader again).
    observer: Option<(u64, bool)>,
    /// The observer starts before the first step and its `Current` is awaited (nothing in flight
    /// at its first read).
    observe_first: bool,
    /// The observer starts before the first step, and the steps go on while its first read is
    /// on its way (the proxy's delay): what they publish meanwhile is older than that read.
    observe_early: bool,
    /// Every campaign has an owner of its own, so no leadership is re-entered by its owner. The
    /// observer programs use this: after a re-entered leadership resigns, the leader's term goes
    /// back and an observer may deliver announcements older than its read (see
    /// `observer_of_a_re_entered_election_drops_what_came_before_its_read`).
    distinct_owners: bool,
}

impl Setup {
    fn plain() -> Setup {
        Setup {
            ttl_ms: lockkit_model::lock::COUNTER_TTL_MS,
            record_lives: false,
            observer: None,
            observe_first: false,
            observe_early: false,
            distinct_owners: false,
        }
    }
}

/// The first delivery of the request `Op::Duplicate` delivers again, and what it left.
#[derive(Debug, Clone)]
struct Delivered {
    call: Call,
    reply: Result<Vec<String>, String>,
    expected: Expected,
    /// The keys right after it (as read), and the server's clock just before it was sent (ms).
    keys: Vec<RawKey>,
    at: u64,
}

struct Program<'a> {
    env: &'a Env,
    setup: Setup,
    name: String,
    keys: ObjectKeys,
    roles: Vec<&'static str>,
    changes: String,
    channels: [String; 2],
    model: ElectionSpec,
    calls: Vec<Campaign>,
    subscriber: Subscriber,
    snapshot: Option<Snapshot>,
    /// The model when `Op::Save` wrote the server's snapshot.
    saved: Option<ElectionSpec>,
    /// The last request, if the last op ended with it (for `Op::Duplicate`).
    last: Option<Delivered>,
    /// The hold (marker, owner, term) of the last successful proclaim, until its resign.
    announced: Option<(String, String, u64)>,
    watch: Option<Watch>,
    sequence: u64,
    /// Proclaim requests so far (each gets the next id).
    requests: u64,
    /// The last proclaim sent, for [`Op::Resend`].
    last_proclaim: Option<Call>,
    log: Vec<String>,
}

impl<'a> Program<'a> {
    async fn new(env: &'a Env, setup: Setup) -> Program<'a> {
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
        model.lock.counter_ttl_ms = setup.ttl_ms;
        let mut subscriber = Subscriber::connect(env.addr).await;
        for channel in [&keys.channel, &changes, &channels[0], &channels[1]] {
            assert!(subscriber.listen(channel, true).await.is_empty());
            model.lock.listen(channel, true);
        }
        let watch = match setup.observer {
            Some(_) => Some(Watch::new(env, &keys, model.clone()).await),
            None => None,
        };
        Program {
            env,
            setup,
            name,
            keys,
            roles,
            changes,
            channels,
            model,
            calls: Vec::new(),
            subscriber,
            snapshot: None,
            saved: None,
            last: None,
            announced: None,
            watch,
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
        // The client gives every fenced script of an election its token counter TTL (a grant
        // mints). The proclaim takes none: the record expires with its hold.
        let ttl = self.setup.ttl_ms.to_string();
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
                    ttl,
                ],
            ),
            Call::Release(marker) => (
                &fenced_lock::RELEASE,
                self.lock_keys(),
                vec![marker.clone(), self.keys.channel.clone(), flag, ttl],
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
                vec![entry.clone(), self.keys.channel.clone(), flag, ttl],
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
            Call::Restore(snapshot) => (
                &RESTORE_KEYS,
                self.keys.keys.clone(),
                snapshot
                    .dumps
                    .iter()
                    .flat_map(|(dump, at)| [dump.clone().unwrap_or_default(), at.to_string()])
                    .collect(),
            ),
            Call::Clear => (&CLEAR_KEYS, self.keys.keys.clone(), Vec::new()),
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
        self.deliver(call, None).await
    }

    /// Runs a script call on Redis and on the model. `again`: the call is a second delivery of
    /// that earlier one, which must change nothing (see [`second_delivery`]).
    async fn deliver(&mut self, call: &Call, again: Option<Delivered>) -> Result<Expected, String> {
        let redis = &self.env.redis;
        let (script, keys, args) = self.script(call);
        let t0 = time(redis).await;
        let actual = run(redis, script, keys, args).await;
        let t1 = time(redis).await;
        let got = self.subscriber.drain().await;
        let (raw, now) = read_state(redis, &self.keys.keys).await;
        if let Some(first) = &again {
            let after = normalize(&raw, &self.roles);
            // What ended between the two deliveries, as the model has it (a key may be gone
            // already when the keys were read after the first).
            // `now`: the clock of the keys read, which is what a lapse is judged against.
            let window = first.at.saturating_sub(2)..=now + 2;
            let lock = &self.model.lock;
            let lapsed = lock
                .holds
                .values()
                .map(|h| h.expiry)
                .chain(lock.timeouts.items.values().copied())
                .chain(self.model.record.as_ref().map(|r| r.expiry))
                .chain(lock.handoff.as_ref().map(|(_, until)| *until))
                .any(|at| window.contains(&at));
            match second_delivery(first, &actual, &got, &after, &self.roles, now, lapsed) {
                Ok(true) => self.env.count("duplicate: changed nothing"),
                Ok(false) => self.env.count("duplicate: not compared (something lapsed)"),
                Err(why) => {
                    self.log.push(format!(
                        "{call:?} delivered again -> {actual:?}, heard {got:?}"
                    ));
                    return Err(why);
                }
            }
        }
        // A fenced mint uses the µs of the script's own TIME: the counter after shows it, and so
        // do the tokens the reply and the grants carry (the counter may be gone already when
        // the scripts are given a TTL of a few ms).
        let mut clocks = vec![None];
        let mut minted: Vec<u64> = raw[1]
            .items
            .first()
            .and_then(|c| c.parse::<u64>().ok())
            .into_iter()
            .collect();
        if let (Call::Acquire(_), Ok(reply)) = (call, &actual) {
            minted.extend(reply.get(2).and_then(|t| t.parse::<u64>().ok()));
        }
        minted.extend(got.iter().filter_map(|(_, payload)| {
            payload
                .strip_prefix("g:")?
                .split(':')
                .nth(1)?
                .parse::<u64>()
                .ok()
        }));
        let mints = self.model.lock.waiting.items.len() as u64 + 1;
        for counter in minted {
            clocks.extend(
                (1..=mints)
                    .filter_map(|k| counter.checked_sub(k))
                    .filter(|us| (t0.us..=t1.us).contains(us))
                    .map(Some),
            );
        }
        clocks.sort();
        clocks.dedup();
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
        if let (true, Some(first)) = (candidates.is_empty(), &again) {
            // A second delivery that changed nothing, where the model would have: the model
            // stays as it was.
            candidates.push((self.model.clone(), first.expected.clone()));
        }
        let again_note = if again.is_some() {
            " (delivered again)"
        } else {
            ""
        };
        self.log
            .push(format!("{call:?}{again_note} -> {actual:?}, heard {got:?}"));
        if candidates.is_empty() {
            let (expected, sent) = first.expect("one instant at least");
            return Err(format!(
                "reply of {call:?}: Redis said {actual:?} and the subscriber heard {got:?}; the model {expected:?}, heard {sent:?} (at {} ms)\nmodel before: {:#?}",
                t0.ms, self.model
            ));
        }
        // The record's lifetime (issue 27, item 1) is named before the keys' comparison, which
        // would report it only as a different record.
        let (model, expected) = &candidates[0];
        self.check_record(model, self.announcement(call, expected).as_ref(), &raw, now)?;
        let expected = self
            .settle(&raw, now, candidates)
            .map_err(|why| match &again {
                Some(_) => format!(
                "a second delivery of {call:?} (something lapsed since the first, so its reply \
                 was not compared) left keys that neither a first run nor no change explains: {why}"
            ),
                None => why,
            })?;
        self.announced = self.announcement(call, &expected);
        self.check_record(&self.model, self.announced.as_ref(), &raw, now)?;
        if let Some(watch) = &mut self.watch {
            let changes: Vec<String> = got
                .iter()
                .filter(|(channel, _)| *channel == self.changes)
                .map(|(_, payload)| payload.clone())
                .collect();
            watch.events.push(Event {
                model: self.model.clone(),
                messages: changes,
                rollback: matches!(call, Call::Restore(_)),
            });
        }
        self.last = call.resendable().then(|| Delivered {
            call: call.clone(),
            reply: actual,
            expected: expected.clone(),
            keys: normalize(&raw, &self.roles),
            at: t0.ms,
        });
        Ok(expected)
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

    /// The leader that announced itself last (for [`Program::check_record`]), after `call`.
    fn announcement(&self, call: &Call, expected: &Expected) -> Option<(String, String, u64)> {
        match (call, expected) {
            (
                Call::Proclaim {
                    marker,
                    owner,
                    term,
                    ..
                },
                Expected::Flag(true),
            ) => Some((marker.clone(), owner.clone(), *term)),
            (Call::Resign { .. }, Expected::Flag(true)) | (Call::Clear, _) => None,
            (Call::Restore(snapshot), _) => snapshot
                .model
                .record
                .as_ref()
                .map(|r| (r.marker.clone(), r.owner.clone(), r.term)),
            _ => self.announced.clone(),
        }
    }

    /// Issue 27, item 1 (with `Setup::record_lives`): while the leader that announced itself
    /// last holds its live hold (as the model has it, a few ms from its end at the least), the
    /// record must be there and name it.
    fn check_record(
        &self,
        model: &ElectionSpec,
        announced: Option<&(String, String, u64)>,
        raw: &[RawKey],
        now: u64,
    ) -> Result<(), String> {
        if !self.setup.record_lives {
            return Ok(());
        }
        let Some((marker, owner, term)) = announced else {
            return Ok(());
        };
        let Some(hold) = model.lock.holds.get(marker).filter(|hold| {
            hold.owner == *owner && hold.token == Some(*term) && hold.expiry > now + 2
        }) else {
            return Ok(());
        };
        let record = &raw[5];
        let names = |field: &str, want: &str| {
            record
                .items
                .chunks(2)
                .any(|pair| pair[0] == field && pair.get(1).is_some_and(|v| v == want))
        };
        if record.ty == "hash" && names("term", &term.to_string()) && names("marker", marker) {
            return Ok(());
        }
        Err(format!(
            "issue 27 item 1: the leader record is {record:?} at {now} ms, while the leader of \
             term {term} that announced itself last ({marker}) still holds its hold until {} \
             (the token counter TTL given to the scripts is {} ms): `leader()` answers None, a \
             new observer starts with Current(None), and the next proclaim starts the record's \
             version again",
            hold.expiry, self.setup.ttl_ms
        ))
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
                    owner: if self.setup.distinct_owners {
                        format!("{client}:{}", 2000 + self.sequence)
                    } else {
                        format!("{client}:{}", 1000 + cand)
                    },
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
            Op::RetryWaiter { call } => {
                let waiting: Vec<usize> = (0..self.calls.len())
                    .filter(|i| self.calls[*i].term.is_none())
                    .collect();
                if waiting.is_empty() {
                    return Ok(());
                }
                return self.campaign(waiting[call % waiting.len()]).await;
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
            Op::RenewLeader { lease_ms } => self
                .calls
                .iter()
                .rev()
                .find(|c| c.term.is_some())
                .map(|c| Call::Renew(c.req.marker.clone(), *lease_ms)),
            Op::Cancel { call } => self.pick(*call).map(|c| Call::Cancel(c.req.entry())),
            Op::Restore => self
                .snapshot
                .clone()
                .map(|snapshot| Call::Restore(Box::new(snapshot))),
            Op::Duplicate => {
                if let Some(first) = self.last.take() {
                    let call = first.call.clone();
                    let expected = self.deliver(&call, Some(first)).await?;
                    self.env
                        .count(&format!("{} (again)", outcome(&expected, &call)));
                }
                return Ok(());
            }
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
        self.last = None;
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
                let now = time(&self.env.redis).await.ms;
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
                    .evalsha_with_reload(
                        &self.env.redis,
                        self.keys.keys.clone(),
                        Vec::<String>::new(),
                    )
                    .await
                    .map_err(|e| e.to_string())?;
                let dumps = dumps
                    .into_array()
                    .into_iter()
                    .map(|entry| {
                        let mut entry = entry.into_array().into_iter();
                        let dump = entry.next().and_then(|v| v.as_bytes().map(hex));
                        let at = entry.next().and_then(|v| v.as_i64()).unwrap_or(-2);
                        (dump, at)
                    })
                    .collect();
                self.snapshot = Some(Snapshot {
                    dumps,
                    model: self.model.clone(),
                });
            }
            Op::Save => {
                let reply = self
                    .env
                    .server
                    .lock()
                    .await
                    .command(&["SAVE"])
                    .await
                    .map_err(|e| e.to_string())?;
                if reply.is_error() {
                    return Err(format!("SAVE: {reply:?}"));
                }
                self.saved = Some(self.model.clone());
            }
            Op::Restart => {
                let Some(saved) = self.saved.clone() else {
                    return Ok(());
                };
                self.env
                    .server
                    .lock()
                    .await
                    .restart_from_disk()
                    .await
                    .map_err(|e| e.to_string())?;
                // Every key went back to the snapshot (this election's included), the script
                // cache is empty, and the subscriber listens again.
                self.model.restore(&saved);
                self.announced = saved
                    .record
                    .as_ref()
                    .map(|r| (r.marker.clone(), r.owner.clone(), r.term));
                self.subscriber = Subscriber::connect(self.env.addr).await;
                let listening: Vec<String> = self.model.lock.listening.iter().cloned().collect();
                for channel in &listening {
                    let stray = self.subscriber.listen(channel, true).await;
                    if !stray.is_empty() {
                        return Err(format!("a new subscriber heard {stray:?}"));
                    }
                }
                // The steps' connection is back (fred reconnects on its own).
                lockkit_suite::within(Duration::from_secs(30), "the reconnection", async {
                    while self.env.redis.ping::<String>(None).await.is_err() {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
                .await;
                // What the server loaded must be what the model went back to.
                let (raw, now) = read_state(&self.env.redis, &self.keys.keys).await;
                self.settle(&raw, now, vec![(self.model.clone(), Expected::Flag(true))])
                    .map_err(|why| format!("after the restart: {why}"))?;
                self.check_record(&self.model, self.announced.as_ref(), &raw, now)?;
            }
            Op::Observe => self.observe(false).await?,
            Op::Cut => {
                if let Some((proxy, _)) = &self.env.watcher {
                    let resync = self.watch.as_ref().is_some_and(|w| w.started.is_some())
                        && self.setup.observer.is_some_and(|(_, wait)| wait);
                    proxy.cut();
                    if resync {
                        let watch = self.watch.as_mut().expect("a watch");
                        watch.until_resynced().await?;
                    }
                }
            }
            _ => {}
        }
        let got = self.subscriber.drain().await;
        if !got.is_empty() {
            return Err(format!("after {op:?} the subscriber heard {got:?}"));
        }
        Ok(())
    }

    /// Starts the program's observer (once): it subscribes, then reads the leader. `settled`:
    /// wait for its first item (so nothing is in flight when it reads); else wait only until
    /// its subscription is there, and let the program go on while its read is on its way.
    async fn observe(&mut self, settled: bool) -> Result<(), String> {
        let Some(watch) = &mut self.watch else {
            return Ok(());
        };
        if watch.started.is_some() {
            return Ok(());
        }
        let (proxy, client) = self.env.watcher.as_ref().expect("an observer client");
        proxy.set_delay(Duration::from_millis(
            self.setup.observer.map_or(0, |(d, _)| d),
        ));
        watch.start(client, &self.name);
        if settled {
            watch.until_delivered(|_| true).await?;
        } else {
            let redis = &self.env.redis;
            let changes = self.changes.clone();
            lockkit_suite::within(
                Duration::from_secs(30),
                "the observer's subscription",
                async {
                    loop {
                        let reply: Vec<Value> = redis
                            .custom(
                                CustomCommand::new_static("PUBSUB", ClusterHash::Random, false),
                                vec!["NUMSUB", changes.as_str()],
                            )
                            .await
                            .expect("PUBSUB NUMSUB");
                        // This program's subscriber and the observer's.
                        if reply.get(1).and_then(Value::as_i64) == Some(2) {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                },
            )
            .await;
        }
        Ok(())
    }

    /// The end of a program with an observer: a last leader of a new term announces itself, the
    /// observer must deliver it, and then everything it delivered is judged against the steps.
    async fn finish(&mut self) -> Result<(), String> {
        if self.watch.is_none() {
            return Ok(());
        }
        self.observe(false).await?;
        // Its first read done (else it may read only the last leader).
        let watch = self.watch.as_mut().expect("a watch");
        if watch.delivered.is_empty() {
            watch.until_delivered(|_| true).await?;
        }
        self.call(&Call::Clear).await?;
        self.sequence += 1;
        let client = CLIENTS[0];
        let req = Request {
            owner: format!("{client}:9999"),
            marker: hold_marker(client, self.sequence),
            lease_ms: LONG_MS,
            keepalive_ms: 0,
            waiter: String::new(),
            channel: self.channels[0].clone(),
            look: false,
        };
        self.calls.push(Campaign {
            req,
            value: LAST_VALUE.to_owned(),
            term: None,
        });
        self.campaign(self.calls.len() - 1).await?;
        let Some(term) = self.calls.last().and_then(|c| c.term) else {
            return Err("the last campaign was not elected".to_owned());
        };
        let watch = self.watch.as_mut().expect("a watch");
        watch
            .until_delivered(|change| leader_of(change).is_some_and(|l| l.term == term))
            .await?;
        let marker = format!("end {}", self.name);
        let _: String = self
            .env
            .redis
            .custom(
                CustomCommand::new_static("ECHO", ClusterHash::Random, false),
                vec![marker.as_str()],
            )
            .await
            .map_err(|e| e.to_string())?;
        let watch = self.watch.as_mut().expect("a watch");
        let commands = watch.monitor.until_echo(&marker).await;
        let reads = watch.reads(&commands, &self.env.redis_addr)?;
        for change in &watch.delivered {
            self.env
                .count(&format!("observer: {}", change_kind(change)));
        }
        let verdict = judge_observer(&watch.events, &reads, &watch.delivered);
        watch.stop();
        verdict.map_err(|why| {
            format!(
                "{why}\nthe observer delivered: {:?}\nits reads (after step script #, at ms): {:?}\nthe change messages by step script: {:?}",
                watch.delivered,
                reads.iter().map(|r| (r.after, r.us / 1000)).collect::<Vec<_>>(),
                watch
                    .events
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| !e.messages.is_empty() || e.rollback)
                    .map(|(i, e)| (i, &e.messages, e.rollback))
                    .collect::<Vec<_>>()
            )
        })
    }
}

/// Issue 27, item 2: a second delivery of `first`'s request (its reply `actual`, the messages
/// `heard` meanwhile, the keys `after` it, the server's clock `at` just after it) must answer as
/// the first did (or as the client treats the same), publish nothing, and change no key beyond
/// moving an expiry on by the time that passed. `Ok(false)`: not compared, something lapsed
/// between the two deliveries (`lapsed`: as the model has it), so the second one may rightly
/// differ.
fn second_delivery(
    first: &Delivered,
    actual: &Result<Vec<String>, String>,
    heard: &[Got],
    after: &[RawKey],
    roles: &[&str],
    at: u64,
    lapsed: bool,
) -> Result<bool, String> {
    // A refusal names what is left of the leader's lease: if that ran out meanwhile, the second
    // delivery may rightly elect.
    let refusal_ran_out = matches!(
        (&first.call, &first.reply),
        (Call::Acquire(_), Ok(reply))
            if reply.first().is_some_and(|r| r == "0")
                && reply.get(1).and_then(|l| l.parse::<u64>().ok()).is_some_and(|left| left <= at.saturating_sub(first.at) + 2)
    );
    if lapsed || refusal_ran_out || !lapsed_nothing(roles, &first.keys, at) {
        return Ok(false);
    }
    let what = match &first.call {
        Call::Proclaim { .. } => "issue 27 item 2: a second delivery of election_proclaim",
        Call::Acquire(_) => "a second delivery of the campaign's fenced_lock_acquire",
        Call::Resign { .. } => "a second delivery of election_resign",
        Call::Leader => "a second delivery of election_leader",
        Call::Renew(..) => "a second delivery of election_renew",
        Call::Cancel(_) => "a second delivery of lock_cancel",
        _ => "a second delivery",
    };
    if !same_answer(&first.call, &first.reply, actual) {
        return Err(format!(
            "{what} answered {actual:?} where the first answered {:?}",
            first.reply
        ));
    }
    if !heard.is_empty() {
        return Err(format!(
            "{what} published {heard:?} again (an observer delivers it twice)"
        ));
    }
    unchanged_keys(roles, &first.keys, after, at.saturating_sub(first.at) + 2)
        .map_err(|change| format!("{what} changed {change}"))?;
    Ok(true)
}

/// Whether two answers to the same request are the same, or ones the client treats alike.
fn same_answer(
    call: &Call,
    first: &Result<Vec<String>, String>,
    again: &Result<Vec<String>, String>,
) -> bool {
    let (Ok(first), Ok(again)) = (first, again) else {
        return first == again;
    };
    match call {
        // The same hold and token; or refused both times.
        Call::Acquire(_) => match (
            AcquireReply::decode(&ints(first)),
            AcquireReply::decode(&ints(again)),
        ) {
            (Ok(a @ AcquireReply::Acquired { .. }), Ok(b)) => a == b,
            (
                Ok(AcquireReply::Busy { .. } | AcquireReply::Reserved { .. }),
                Ok(AcquireReply::Busy { .. } | AcquireReply::Reserved { .. }),
            ) => true,
            _ => false,
        },
        // `resign` and a waiter's leave only check that the reply decodes.
        Call::Resign { .. } | Call::Cancel(_) => {
            lock::decode_cancel(&ints(again)).is_ok() || ints(again) == [0] || ints(again) == [1]
        }
        _ => first == again,
    }
}

// === the observer ===

/// The value the last leader of an observer program announces.
const LAST_VALUE: &str = "the last leader";

/// What one step script did: the model after it, the change messages it published (in order),
/// and whether it put older keys back.
struct Event {
    model: ElectionSpec,
    messages: Vec<String>,
    rollback: bool,
}

/// A read of the leader by the observer: after how many step scripts (0: before the first),
/// and when (the server's µs).
#[derive(Debug, Clone, Copy)]
struct Read {
    after: usize,
    us: u64,
}

/// What the observer task forwards: the stream's items.
type Deliveries = tokio::sync::mpsc::UnboundedReceiver<Result<LeaderChange, lockkit::Error>>;

/// A real observer of a program's election, the `MONITOR` stream that places its reads among
/// the program's step scripts, and what each step script did.
struct Watch {
    monitor: Monitor,
    record_key: String,
    /// The step scripts (SHA1 and source): every script the program's steps run.
    steps: BTreeMap<String, String>,
    /// `events[0]`: before the first step script; `events[i]`: after the `i`-th.
    events: Vec<Event>,
    started: Option<(Deliveries, tokio::task::JoinHandle<()>)>,
    delivered: Vec<LeaderChange>,
    errors: Vec<String>,
}

impl Watch {
    async fn new(env: &Env, keys: &ObjectKeys, model: ElectionSpec) -> Watch {
        let monitor = Monitor::start(env.addr).await;
        let steps = [
            &fenced_lock::ACQUIRE,
            &fenced_lock::RELEASE,
            &election::RENEW,
            &lock::CANCEL,
            &election::PROCLAIM,
            &election::RESIGN,
            &election::LEADER,
            &RESTORE_KEYS,
            &CLEAR_KEYS,
        ]
        .iter()
        .map(|s| (s.sha1().to_owned(), s.source().to_owned()))
        .collect();
        Watch {
            monitor,
            record_key: keys.keys[5].clone(),
            steps,
            events: vec![Event {
                model,
                messages: Vec::new(),
                rollback: false,
            }],
            started: None,
            delivered: Vec::new(),
            errors: Vec::new(),
        }
    }

    fn start(&mut self, client: &lockkit::Client, name: &str) {
        use futures::StreamExt;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let election = client.election(name.to_owned());
        let task = tokio::spawn(async move {
            let mut changes = election.observe();
            while let Some(change) = changes.next().await {
                if tx.send(change).is_err() {
                    return;
                }
            }
        });
        self.started = Some((rx, task));
    }

    /// Collects the observer's items until one satisfies `done` (a generous hang guard).
    async fn until_delivered(
        &mut self,
        done: impl Fn(&LeaderChange) -> bool,
    ) -> Result<(), String> {
        let Some((rx, _)) = &mut self.started else {
            return Err("the observer was not started".to_owned());
        };
        let (delivered, errors) = (&mut self.delivered, &mut self.errors);
        let wait = async {
            loop {
                match rx.recv().await {
                    Some(Ok(change)) => {
                        let stop = done(&change);
                        delivered.push(change);
                        if stop {
                            return Ok(());
                        }
                    }
                    Some(Err(err)) => errors.push(err.to_string()),
                    None => return Err("the observer's stream ended".to_owned()),
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(20), wait).await {
            Ok(result) => result,
            Err(_) => Err(format!(
                "the observer did not deliver what was awaited within 20 s (it delivered {:?}; errors {:?})",
                self.delivered, self.errors
            )),
        }
    }

    /// Waits for the observer's next `Current` or `Resynced`.
    async fn until_resynced(&mut self) -> Result<(), String> {
        self.until_delivered(|change| {
            matches!(change, LeaderChange::Current(_) | LeaderChange::Resynced(_))
        })
        .await
    }

    fn stop(&mut self) {
        if let Some((_, task)) = self.started.take() {
            task.abort();
        }
    }

    /// The observer's reads of the leader, placed among the step scripts `MONITOR` saw run
    /// (`redis_addr`'s; a script that ran is followed by its own commands, source `lua`).
    fn reads(&self, commands: &[Monitored], redis_addr: &str) -> Result<Vec<Read>, String> {
        let mut steps = 0;
        let mut reads = Vec::new();
        for (i, command) in commands.iter().enumerate() {
            let script = command.is("EVALSHA") || command.is("EVAL");
            let ran = commands.get(i + 1).is_some_and(|next| next.source == "lua");
            if command.source == "lua" || !script || !ran {
                continue;
            }
            let Some(body) = command.args.get(1) else {
                continue;
            };
            if command.source == redis_addr {
                let ours = if command.is("EVALSHA") {
                    self.steps.contains_key(&body.to_ascii_lowercase())
                } else {
                    self.steps.values().any(|source| source == body)
                };
                if ours {
                    steps += 1;
                }
            } else if command.args.contains(&self.record_key) {
                reads.push(Read {
                    after: steps,
                    us: command.us,
                });
            }
        }
        if steps + 1 != self.events.len() {
            return Err(format!(
                "MONITOR saw {steps} step scripts run; the program ran {}",
                self.events.len() - 1
            ));
        }
        Ok(reads)
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The leader an item names, if any.
fn leader_of(change: &LeaderChange) -> Option<&lockkit::Leader> {
    match change {
        LeaderChange::Current(leader) | LeaderChange::Resynced(leader) => leader.as_ref(),
        LeaderChange::Elected(leader) | LeaderChange::Proclaimed(leader) => Some(leader),
        _ => None,
    }
}

fn change_kind(change: &LeaderChange) -> &'static str {
    match change {
        LeaderChange::Current(_) => "Current",
        LeaderChange::Resynced(_) => "Resynced",
        LeaderChange::Elected(_) => "Elected",
        LeaderChange::Proclaimed(_) => "Proclaimed",
        LeaderChange::Resigned { .. } => "Resigned",
        _ => "other",
    }
}

/// A change message: `l:<term>:<version>:<value>` or `r:<term>`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Msg {
    Announced { term: u64, value: String },
    Resigned { term: u64 },
}

impl Msg {
    fn parse(payload: &str) -> Option<Msg> {
        if let Some(rest) = payload.strip_prefix("l:") {
            let mut parts = rest.splitn(3, ':');
            let term = parts.next()?.parse().ok()?;
            let _version: u64 = parts.next()?.parse().ok()?;
            let value = parts.next()?.to_owned();
            return Some(Msg::Announced { term, value });
        }
        let term = payload.strip_prefix("r:")?.parse().ok()?;
        Some(Msg::Resigned { term })
    }

    fn term(&self) -> u64 {
        match self {
            Msg::Announced { term, .. } | Msg::Resigned { term } => *term,
        }
    }

    /// Whether `change` delivers this message.
    fn delivered_as(&self, change: &LeaderChange) -> bool {
        match (self, change) {
            (
                Msg::Announced { term, value },
                LeaderChange::Elected(leader) | LeaderChange::Proclaimed(leader),
            ) => leader.term == *term && leader.value == *value,
            (Msg::Resigned { term }, LeaderChange::Resigned { term: t }) => term == t,
            _ => false,
        }
    }
}

/// The observer's contract (`Election::observe`'s rustdoc, the guide's "Observing"), judged from
/// what it delivered, where its reads of the leader ran among the step scripts, and what each
/// step script did:
/// - `Current` first and only first; each `Current`/`Resynced` is what one of its reads found
///   (in order), unless that read found a term older than one already delivered (what it makes
///   of such a read is its own, but it may not go back);
/// - after a read, exactly the changes published after it, in order, each once (issue 27, item 3:
///   none published before it, even when the read found nobody); a change may be left out only
///   when it is older than what was delivered: a lower term, the same term after the keys were
///   rolled back since the read, or a term that already resigned (issue 27, item 1: an
///   announcement under the same term whose record version started again is not older);
/// - terms never go back over everything delivered (issue 27, item 4);
/// - `Elected` carries a new term, `Proclaimed` the term of the last item.
///
/// A read whose reply was lost (its connection cut) is followed by another: when more than one
/// read explains an item, each is tried in turn.
fn judge_observer(
    events: &[Event],
    reads: &[Read],
    delivered: &[LeaderChange],
) -> Result<(), String> {
    let msgs: Vec<(usize, Msg)> = events
        .iter()
        .enumerate()
        .flat_map(|(step, e)| {
            e.messages
                .iter()
                .filter_map(|payload| Msg::parse(payload))
                .map(move |m| (step, m))
        })
        .collect();
    let judge = Judge {
        events,
        reads,
        delivered,
        msgs,
    };
    judge.from(Judged::default(), 0)
}

/// What [`judge_observer`] judges with.
struct Judge<'a> {
    events: &'a [Event],
    reads: &'a [Read],
    delivered: &'a [LeaderChange],
    /// Every change message, with the step script that published it.
    msgs: Vec<(usize, Msg)>,
}

/// Where the judgement stands after some items.
#[derive(Debug, Clone, Default)]
struct Judged {
    /// The greatest term delivered.
    max_term: Option<u64>,
    /// The term of the last item (none after `Current(None)`/`Resynced(None)`).
    last_term: Option<u64>,
    /// A term whose resignation was delivered since the last read.
    resigned: Option<u64>,
    /// The step script the last read came after.
    read_at: Option<usize>,
    /// The next message that may be delivered.
    cursor: usize,
    /// The next read that may explain a `Current`/`Resynced`.
    next_read: usize,
}

impl Judge<'_> {
    /// What `read` found: the leader at each instant it may have run at.
    fn found(&self, read: &Read) -> Vec<Option<(u64, String)>> {
        (0..=3)
            .map(|late| {
                let ms = read.us / 1000 + late;
                let mut model = self.events[read.after].model.clone();
                model
                    .leader(Now {
                        ms,
                        us: read.us + late * 1000,
                        keys_ms: ms,
                    })
                    .map(|(term, _, value)| (term, value))
            })
            .collect()
    }

    /// Whether an undelivered message may be left out: older than what was delivered (a lower
    /// term; or its own term after a rollback, or after a resignation deleted the record, so
    /// its version started again: a re-entered leadership of the same owner may do that).
    fn droppable(&self, m: &Msg, step: usize, st: &Judged, read_at: usize) -> bool {
        let older = st.max_term.is_some_and(|max| m.term() < max);
        let restarted = self.events[read_at + 1..=step]
            .iter()
            .any(|e| e.rollback || e.messages.iter().any(|p| p.starts_with("r:")));
        older
            || (restarted && st.max_term.is_some_and(|max| m.term() <= max))
            || st.resigned == Some(m.term())
    }

    /// Judges the items from `i` on.
    fn from(&self, mut st: Judged, start: usize) -> Result<(), String> {
        let older = |term: u64, st: &Judged| st.max_term.is_some_and(|max| term < max);
        for (i, change) in self.delivered.iter().enumerate().skip(start) {
            match change {
                LeaderChange::Current(leader) | LeaderChange::Resynced(leader) => {
                    let current = matches!(change, LeaderChange::Current(_));
                    if current != (i == 0) {
                        return Err(format!(
                            "item {i} is {change:?}: `Current` comes first, once"
                        ));
                    }
                    let want = leader.as_ref().map(|l| (l.term, l.value.clone()));
                    if let Some((term, _)) = &want {
                        if older(*term, &st) {
                            return Err(format!(
                                "issue 27 item 4: terms went back: item {i}, {change:?}, after term {} was delivered (the keys were rolled back; one client's observer must not go back)",
                                st.max_term.unwrap_or_default()
                            ));
                        }
                    }
                    let explains = |read: &Read| {
                        let found = self.found(read);
                        found.contains(&want)
                            || found
                                .iter()
                                .all(|f| f.as_ref().is_some_and(|(t, _)| older(*t, &st)))
                    };
                    let candidates: Vec<usize> = (st.next_read..self.reads.len())
                        .filter(|j| explains(&self.reads[*j]))
                        .collect();
                    if candidates.is_empty() {
                        return Err(format!(
                            "item {i}, {change:?}, is not what any read of the leader found (the reads after the last one used found {:?})",
                            self.reads[st.next_read..]
                                .iter()
                                .map(|r| self.found(r)[0].clone())
                                .collect::<Vec<_>>()
                        ));
                    }
                    let mut first_error = None;
                    for j in candidates {
                        let read = self.reads[j];
                        let mut next = st.clone();
                        next.next_read = j + 1;
                        if let Some((term, _)) = &want {
                            next.max_term = next.max_term.max(Some(*term));
                        }
                        next.last_term = want.as_ref().map(|(term, _)| *term);
                        next.resigned = None;
                        next.read_at = Some(read.after);
                        // Before a resync changes may have been missed; none before the read
                        // is due.
                        next.cursor = self
                            .msgs
                            .iter()
                            .position(|(step, _)| *step > read.after)
                            .unwrap_or(self.msgs.len());
                        match self.from(next, i + 1) {
                            Ok(()) => return Ok(()),
                            Err(why) => {
                                first_error.get_or_insert(why);
                            }
                        }
                    }
                    return Err(first_error.unwrap_or_default());
                }
                LeaderChange::Elected(_)
                | LeaderChange::Proclaimed(_)
                | LeaderChange::Resigned { .. } => {
                    let Some(at) = st.read_at else {
                        return Err(format!("item {i}, {change:?}, came before `Current`"));
                    };
                    let cursor = st.cursor;
                    match self.msgs[cursor..]
                        .iter()
                        .position(|(_, m)| m.delivered_as(change))
                    {
                        Some(p) => {
                            for (step, m) in &self.msgs[cursor..cursor + p] {
                                if !self.droppable(m, *step, &st, at) {
                                    return Err(format!(
                                        "{}the change {m:?} (published by step script #{step}, after the read at #{at}) was not delivered; item {i}, {change:?}, came after it",
                                        if st.max_term == Some(m.term()) { "issue 27 item 1: " } else { "" }
                                    ));
                                }
                            }
                            st.cursor = cursor + p + 1;
                        }
                        None if self.msgs[..cursor]
                            .iter()
                            .any(|(_, m)| m.delivered_as(change)) =>
                        {
                            return Err(format!(
                                "issue 27 item 3: item {i}, {change:?}, was published before the read of the leader the stream started from (after step script #{at}), which it must drop, also when the read found nobody"
                            ));
                        }
                        None => {
                            return Err(format!(
                                "item {i}, {change:?}, was published by no step (or delivered twice)"
                            ));
                        }
                    }
                    let term = match change {
                        LeaderChange::Elected(l) | LeaderChange::Proclaimed(l) => l.term,
                        LeaderChange::Resigned { term } => *term,
                        _ => unreachable!("matched above"),
                    };
                    if older(term, &st) {
                        return Err(format!(
                            "issue 27 item 4: terms went back: item {i}, {change:?}, after term {} was delivered",
                            st.max_term.unwrap_or_default()
                        ));
                    }
                    match change {
                        LeaderChange::Elected(_)
                            if st.last_term.is_some_and(|last| last >= term) =>
                        {
                            return Err(format!(
                                "item {i}, {change:?}: `Elected` under a term not newer than the last item's"
                            ));
                        }
                        LeaderChange::Proclaimed(_) if st.last_term != Some(term) => {
                            return Err(format!(
                                "item {i}, {change:?}: `Proclaimed` under a term other than the last item's ({:?})",
                                st.last_term
                            ));
                        }
                        LeaderChange::Resigned { .. } => st.resigned = Some(term),
                        _ => {}
                    }
                    st.last_term = Some(term);
                    st.max_term = st.max_term.max(Some(term));
                }
                _ => {}
            }
        }
        let Some(at) = st.read_at else {
            return Err("the observer delivered no `Current`".to_owned());
        };
        for (step, m) in &self.msgs[st.cursor..] {
            if !self.droppable(m, *step, &st, at) {
                return Err(format!(
                    "the change {m:?} (published by step script #{step}, after the read at #{at}) was never delivered"
                ));
            }
        }
        Ok(())
    }
}

// === the runner ===

/// Runs one program, step by step, and (with an observer) its end; `Err` says what broke.
fn run_one(env: &Env, setup: Setup, ops: &[Op]) -> Result<(), String> {
    let mut program = env.rt.block_on(Program::new(env, setup));
    let fail = |program: &Program, why: String| {
        format!("{why}\nsteps run:\n  {}", program.log.join("\n  "))
    };
    if setup.observe_first || setup.observe_early {
        if let Err(why) = env.rt.block_on(program.observe(setup.observe_first)) {
            return Err(fail(&program, format!("starting the observer: {why}")));
        }
    }
    for (i, op) in ops.iter().enumerate() {
        if let Err(why) = env.rt.block_on(program.step(op)) {
            return Err(fail(&program, format!("step {i} disagrees: {why}")));
        }
    }
    if let Err(why) = env.rt.block_on(program.finish()) {
        return Err(fail(
            &program,
            format!("the observer broke its contract: {why}"),
        ));
    }
    Ok(())
}

/// Runs `cases` generated programs of `ops` (with a setup from `setups`), each checked step by
/// step, and (with an observer) at its end; panics with the seed and the shrunk program.
fn run_programs(
    name: &str,
    cases: u32,
    setups: impl Strategy<Value = Setup>,
    ops: impl Strategy<Value = Op>,
) {
    run_programs_after(name, cases, setups, ops, Vec::new());
}

/// As [`run_programs`], after the `known` programs (the issue's own, run first as they are).
fn run_programs_after(
    name: &str,
    cases: u32,
    setups: impl Strategy<Value = Setup>,
    ops: impl Strategy<Value = Op>,
    known: Vec<(&str, Setup, Vec<Op>)>,
) {
    let observers = name.starts_with("observer");
    let env = Env::start(observers);
    for (what, setup, ops) in known {
        if let Err(why) = run_one(&env, setup, &ops) {
            panic!("{name}: FAILED on {what}.\nProgram: {setup:?}\n{ops:#?}\n{why}");
        }
    }
    let seed = model_seed();
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: if observers { 48 } else { 512 },
        ..Config::default()
    });
    let result = runner.run(
        &(setups, prop::collection::vec(ops, 1..50)),
        |(setup, ops)| run_one(&env, setup, &ops).map_err(TestCaseError::fail),
    );
    match result {
        Ok(()) => {
            eprintln!(
                "{name}: {cases} cases passed (seed {seed}); steps: {:?}",
                env.seen.borrow()
            );
        }
        Err(TestError::Fail(why, (setup, ops))) => panic!(
            "{name}: FAILED (LOCKKIT_MODEL_SEED={seed}).\nShrunk program: {setup:?}\n{ops:#?}\n{why}"
        ),
        Err(TestError::Abort(why)) => panic!("{name} aborted (seed {seed}): {why}"),
    }
}

#[test]
fn election_agrees_with_its_model() {
    run_programs("election", cases(), Just(Setup::plain()), op());
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
    run_programs(
        "election (contended)",
        cases(),
        Just(Setup::plain()),
        contended,
    );
}

// === issue 27, §4 ===

/// Campaigns that mostly lead longer than the program (and than any short TTL).
fn long_campaign() -> impl Strategy<Value = Op> {
    (
        0usize..3,
        prop_oneof![1 => 3u64..40, 4 => Just(LONG_MS)],
        prop_oneof![1 => Just(None), 3 => Just(Some(LONG_MS))],
        0usize..5,
    )
        .prop_map(|(cand, lease_ms, keepalive_ms, value)| Op::Campaign {
            cand,
            lease_ms,
            keepalive_ms,
            value,
        })
}

/// Campaigns whose leaderships mostly begin with a short lease and live on through renewals
/// ([`Op::RenewLeader`], as the watchdog keeps them), or begin long.
fn renewed_campaign() -> impl Strategy<Value = Op> {
    (
        0usize..3,
        prop_oneof![3 => 3u64..40, 1 => Just(LONG_MS)],
        prop_oneof![1 => Just(None), 3 => Just(Some(LONG_MS))],
        0usize..5,
    )
        .prop_map(|(cand, lease_ms, keepalive_ms, value)| Op::Campaign {
            cand,
            lease_ms,
            keepalive_ms,
            value,
        })
}

/// Renewals of the leader, mostly to a long lease.
fn renew_leader() -> impl Strategy<Value = Op> {
    prop_oneof![1 => 20u64..60, 3 => Just(LONG_MS)]
        .prop_map(|lease_ms| Op::RenewLeader { lease_ms })
}

/// Duplicates (issue 27, item 2): every op of the election's programs, and after many a second
/// delivery of the request it ended with.
#[test]
fn election_duplicate_deliveries_change_nothing() {
    let ops = prop_oneof![
        6 => op(),
        3 => Just(Op::Duplicate),
        2 => (any::<usize>(), 0usize..5).prop_map(|(call, value)| Op::Proclaim { call, value }),
        1 => any::<usize>().prop_map(|call| Op::ResignOnly { call }),
    ];
    run_programs(
        "election, delivered twice",
        cases_scaled(30),
        Just(Setup::plain()),
        ops,
    );
}

/// Time (issue 27, item 1): the token counter TTL the scripts are given is a few ms (before the
/// fix, the proclaim gave the record the same TTL), leaderships mostly outlive it and their first
/// lease (renewed by `election_renew`, or long), and time passes: the record must live as long as
/// the leadership it names.
#[test]
fn election_record_lives_as_long_as_its_leadership() {
    let setups = (3u64..30).prop_map(|ttl_ms| Setup {
        ttl_ms,
        record_lives: true,
        ..Setup::plain()
    });
    let ops = prop_oneof![
        6 => renewed_campaign(),
        3 => any::<usize>().prop_map(|call| Op::RetryWaiter { call }),
        4 => (any::<usize>(), 0usize..5).prop_map(|(call, value)| Op::Proclaim { call, value }),
        3 => Just(Op::Leader),
        2 => (any::<usize>(), prop_oneof![3u64..40, Just(LONG_MS)])
            .prop_map(|(call, lease_ms)| Op::Renew { call, lease_ms }),
        4 => renew_leader(),
        2 => any::<usize>().prop_map(|call| Op::Resign { call }),
        4 => (1u64..45).prop_map(|ms| Op::Sleep { ms }),
        1 => Just(Op::LapseHolds),
    ];
    run_programs(
        "election, leaderships past their TTLs",
        cases_scaled(15),
        setups,
        ops,
    );
}

/// Rollbacks: `SAVE`, more steps, a restart from that snapshot (the terms the model handed out
/// stay; each new one must exceed them), again and again.
#[test]
fn election_terms_never_go_back_after_a_restart_from_a_snapshot() {
    let ops = prop_oneof![
        10 => op(),
        1 => Just(Op::Save),
        1 => Just(Op::Restart),
    ];
    run_programs(
        "election, restarted from snapshots",
        cases_scaled(15),
        Just(Setup::plain()),
        ops,
    );
}

/// The ops of the observer programs.
fn observed_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => long_campaign(),
        4 => any::<usize>().prop_map(|call| Op::RetryWaiter { call }),
        4 => (any::<usize>(), 0usize..5).prop_map(|(call, value)| Op::Proclaim { call, value }),
        5 => any::<usize>().prop_map(|call| Op::Resign { call }),
        1 => any::<usize>().prop_map(|call| Op::Release { call }),
        2 => Just(Op::Leader),
        1 => any::<usize>().prop_map(|call| Op::Cancel { call }),
        2 => (1u64..20).prop_map(|ms| Op::Sleep { ms }),
        2 => Just(Op::LapseHolds),
    ]
}

/// The observer, started before the first step (nothing in flight at its read): it delivers
/// exactly the changes after its read, in order, each once.
#[test]
fn observer_agrees_with_its_model() {
    let setups = (0u64..10).prop_map(|delay| Setup {
        observer: Some((delay, true)),
        distinct_owners: true,
        observe_first: true,
        ..Setup::plain()
    });
    run_programs("observer", cases_scaled(12), setups, observed_op());
}

/// The observer starts (and, cut off, resyncs) while announcements are on their way: its read
/// of the leader lands a few steps after its subscription (the proxy's delay), and what was
/// published before the read must not be delivered, also when the read finds nobody (issue 27,
/// item 3).
#[test]
fn observer_drops_announcements_older_than_its_read() {
    let setups = (5u64..40, any::<bool>()).prop_map(|(delay, observe_early)| Setup {
        observer: Some((delay, false)),
        distinct_owners: true,
        observe_early,
        ..Setup::plain()
    });
    let ops = prop_oneof![
        10 => observed_op(),
        2 => Just(Op::Observe),
        1 => Just(Op::Cut),
    ];
    // The issue's own: a leader elected and resigned between the subscription and the read.
    let known = vec![(
        "a leader elected and resigned while the observer's read is on its way",
        Setup {
            observer: Some((40, false)),
            distinct_owners: true,
            ..Setup::plain()
        },
        vec![
            Op::Observe,
            Op::Campaign {
                cand: 0,
                lease_ms: LONG_MS,
                keepalive_ms: None,
                value: 0,
            },
            Op::Resign { call: 0 },
        ],
    )];
    run_programs_after(
        "observer, reads among announcements",
        cases_scaled(15),
        setups,
        ops,
        known,
    );
}

/// Rollbacks seen by an observer: keys put back from an older snapshot, and the observer's
/// connections cut (it reads the leader again, as after a restart; the program waits for that
/// read). Terms never go back for what it delivers (issue 27, item 4).
#[test]
fn observer_terms_never_go_back_after_a_rollback() {
    let setups = (0u64..10).prop_map(|delay| Setup {
        observer: Some((delay, true)),
        distinct_owners: true,
        observe_first: true,
        ..Setup::plain()
    });
    let ops = prop_oneof![
        10 => observed_op(),
        2 => Just(Op::Snapshot),
        2 => Just(Op::Restore),
        2 => Just(Op::Cut),
    ];
    // The issue's own: `a` leads at the snapshot, resigns, `b` leads, the keys go back, the
    // observer reconnects.
    let campaign = |cand| Op::Campaign {
        cand,
        lease_ms: LONG_MS,
        keepalive_ms: None,
        value: cand,
    };
    let known = vec![(
        "a restore to a snapshot taken while the resigned leader led",
        Setup {
            observer: Some((0, true)),
            distinct_owners: true,
            observe_first: true,
            ..Setup::plain()
        },
        vec![
            campaign(0),
            Op::Snapshot,
            Op::Resign { call: 0 },
            campaign(1),
            Op::Restore,
            Op::Cut,
        ],
    )];
    run_programs_after(
        "observer, after rollbacks",
        cases_scaled(6),
        setups,
        ops,
        known,
    );
}

/// An observer of leaderships that outlive the token counter TTL and their first lease (renewed
/// by `election_renew`): every proclaim after its read must be delivered (issue 27, item 1: a
/// record that expires while its leader leads comes back at version 1 with the next proclaim,
/// and the observer takes it for an old one).
#[test]
fn observer_delivers_every_proclaim_of_a_long_leadership() {
    let setups = (3u64..30).prop_map(|ttl_ms| Setup {
        ttl_ms,
        observer: Some((0, true)),
        distinct_owners: true,
        observe_first: true,
        ..Setup::plain()
    });
    let ops = prop_oneof![
        6 => renewed_campaign(),
        3 => any::<usize>().prop_map(|call| Op::RetryWaiter { call }),
        5 => (any::<usize>(), 0usize..5).prop_map(|(call, value)| Op::Proclaim { call, value }),
        2 => (any::<usize>(), Just(LONG_MS)).prop_map(|(call, lease_ms)| Op::Renew { call, lease_ms }),
        3 => renew_leader(),
        2 => any::<usize>().prop_map(|call| Op::Resign { call }),
        4 => (1u64..45).prop_map(|ms| Op::Sleep { ms }),
    ];
    run_programs(
        "observer, leaderships past their TTLs",
        cases_scaled(12),
        setups,
        ops,
    );
}

/// Found while porting the checks above (not fixed here): a leadership re-entered by its own
/// owner breaks the observer's order. `a` leads under term 1 (`l:1:1`), campaigns again in the
/// same scope and leads re-entered under term 2 (`l:2:2`), resigns term 2 (`r:2`) and announces
/// again under term 1 (`l:1:1`: the record was deleted). The leader's term went from 2 back to
/// 1, so an observer whose read found term 1 (or, read before that proclaim, `{0, term 1, 0}`)
/// stands at term 1 and takes term 2's announcements still in flight, published before its
/// read, for new ones: `Elected(term 2)`, `Resigned(term 2)` (and a client that saw term 2 then
/// reports no leader while term 1 leads). Fails 3 of 3 on main. The client never sends this:
/// [`Leadership`](lockkit::Leadership) has no `scope`, so no campaign re-enters a leadership;
/// only raw script calls (as here) do.
#[test]
#[ignore = "a leadership re-entered by its owner, which the public API never does (Leadership has no scope): terms go back from the nested term (reported, not fixed)"]
fn observer_of_a_re_entered_election_drops_what_came_before_its_read() {
    let env = Env::start(true);
    let setup = Setup {
        observer: Some((40, false)),
        ..Setup::plain()
    };
    let campaign = |value| Op::Campaign {
        cand: 0,
        lease_ms: LONG_MS,
        keepalive_ms: None,
        value,
    };
    let ops = vec![
        Op::Observe,
        campaign(0),
        campaign(1),
        Op::Resign { call: 1 },
        Op::Proclaim { call: 0, value: 2 },
    ];
    if let Err(why) = run_one(&env, setup, &ops) {
        panic!("{why}");
    }
}
