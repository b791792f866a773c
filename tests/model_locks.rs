//! Model-based tests of the reentrant locks (`Lock`, `FencedLock`, `FairLock`) and the
//! `SpinLock` (issue 12, §2): generated operation sequences from several owners run against the
//! real scripts on a real `redis-server` and against the reference models of `lockkit-model`
//! (written from the documented contract); every reply and the decoded key state (hash fields,
//! hold expiries, tokens, the counter, the waiting set, its deadlines, the reservation, the fair
//! queue, the key's expiry) must agree after every step.
//!
//! The `Lock` and `FencedLock` hand a free lock over by direct grant (issue 20): a grant or a
//! looker's notice is published on the waiting client's own channel, and stands only when a
//! subscriber heard it. Each sequence has a real subscriber connection that listens on some of
//! its clients' channels (`Op::Listen` changes which), and on the object's own channel, where
//! nothing may arrive; after every step the messages it got must be exactly the ones the model
//! says were heard, on the same channels, in the same order.
//!
//! The model's clock follows the server's: each script call is bracketed by two `TIME` reads,
//! and a step passes when the model, run at some millisecond of that bracket, gives the same
//! reply and the same keys. Leases lapse for real (short leases, short sleeps), so the keys
//! Redis expires on its own are compared too.
//!
//! Budget: `LOCKKIT_MODEL_CASES` cases per primitive (default
//! `lockkit_suite::model_io::DEFAULT_CASES`); `LOCKKIT_MODEL_SEED` replays a run. A failure prints the seed and the shrunk sequence.

use std::collections::BTreeMap;
use std::time::Duration;

use fred::clients::Client as Fred;
use fred::interfaces::ClientLike;
use fred::types::scripts::Script as FredScript;
use fred::types::{ClusterHash, CustomCommand, Value};
use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::lock::{hold_marker, AcquireReply, ReleaseReply};
use lockkit::protocol::script::Script;
use lockkit::protocol::wake::Wake;
use lockkit::protocol::{fair_lock, fenced_lock, lock, spin_lock};
use lockkit_model::lock::{
    Acquired, Entry, HashLock, LockKind, Now, Released, Request, WrongType, HANDOFF_WINDOW_MS,
    PROBATION_MS,
};
use lockkit_model::spin::{SpinAcquired, SpinLock};
use lockkit_suite::checker::{model_seed, save_model_cases as save_cases};
use lockkit_suite::model_io::{
    absent, as_i64, cases, cases_scaled, hash_lock_key, key, lapsed_nothing, read_state, time,
    unchanged_keys, Dump, RawKey, ANY, CLIENTS, DUMP_KEYS,
};
use lockkit_suite::{raw, spawned, unique, RedisServer};
use lockkit_testkit::RespValue;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};

/// Cases per primitive in CI (about 8 s each on the 2-core machine); `LOCKKIT_MODEL_CASES` runs
/// more.
/// A lease that outlives any sequence.
const LONG_MS: u64 = 60_000;

// === the generated operations ===

/// A lease: short enough to lapse during a sequence, or longer than it.
#[derive(Debug, Clone, Copy)]
enum Lease {
    Short(u64),
    Long,
}

impl Lease {
    fn ms(self) -> u64 {
        match self {
            Lease::Short(ms) => ms,
            Lease::Long => LONG_MS,
        }
    }
}

/// Bad input given to the public API: refused before anything is sent.
#[derive(Debug, Clone, Copy)]
enum Bad {
    ZeroLease,
    HugeLease,
    EmptyName,
}

/// One generated operation. Indices pick among what the sequence made so far (modulo its
/// length), so a shrunk sequence stays meaningful.
#[derive(Debug, Clone)]
enum Op {
    /// A new acquire call by owner `owner` (0..3; the same owner again is a re-entry in its
    /// scope): keep-alive `None` tries once, `Some` waits (joins the waiting set / queue). `look`
    /// (a plain `Lock` only): a multi-lock member's call that only looks.
    Acquire {
        owner: usize,
        lease: Lease,
        keepalive: Option<Lease>,
        look: bool,
    },
    /// The next try of an earlier call (a waiter's retry: the same marker, as every try of one
    /// call has).
    Retry {
        call: usize,
    },
    /// The last request again (fred re-sending it after a reconnect).
    Resend,
    /// The previous script call delivered again, exactly, right after it (fred re-sends every
    /// script the client sends with `Resend::Allowed`: acquire, renew, cancel, hold count): the
    /// second delivery must answer alike, publish nothing and change no key beyond moving an
    /// expiry on (issue 27, §4).
    Duplicate,
    /// The last try of an earlier call whose wait ran out: its request with keep-alive 0.
    LastTry {
        call: usize,
    },
    /// The subscriber starts (`on`) or stops listening on client `client`'s channel (`Lock`,
    /// `FencedLock`: a grant to a call of that client is heard, or undone).
    Listen {
        client: usize,
        on: bool,
    },
    /// Release of one hold marker sent so far (taken, refused or released already).
    Release {
        hold: usize,
    },
    /// Release of one of the holds the model has (a guard's unlock).
    ReleaseHeld {
        hold: usize,
    },
    /// The watchdog's batched renewal (lease `None`: check only). `until` (the hash locks): the
    /// confirmation's form, `@<server ms>`, extending to an instant (the last step's server
    /// time + the lease) rather than to now + lease.
    Renew {
        holds: Vec<usize>,
        lease: Option<Lease>,
        until: bool,
    },
    /// A waiting call gives up.
    Cancel {
        call: usize,
    },
    /// The waiter first in line gives up: the call last handed the lock (granted it or reserved
    /// for), else the longest waiting (the fair queue's head), as the model has them.
    CancelFirst,
    /// `ReleaseHeld` then, at once, `CancelFirst`: the waiter a release just granted the lock
    /// (or reserved it for) gives up before it claims it (issue 11, item 6).
    ReleaseThenCancelFirst {
        hold: usize,
    },
    ForceUnlock,
    HoldCount {
        owner: usize,
    },
    /// Time passes (leases, keep-alives and the handoff window lapse on the server).
    Sleep {
        ms: u64,
    },
    /// Time passes until every hold has lapsed, when they all end within 60 ms (the lock falls
    /// free with no release to hand it over: the next acquire does).
    LapseHolds,
    /// `SCRIPT FLUSH`: the next call must reload its script.
    FlushScripts,
    /// `DUMP` of every key of the object...
    Snapshot,
    /// ...and `RESTORE … REPLACE` of it later (a restart from an older snapshot).
    Restore,
    /// A value of another type written over the object's main key, for the next `steps` steps
    /// (then deleted, as its owner would).
    Foreign {
        steps: usize,
    },
    BadInput(Bad),
}

fn lease() -> impl Strategy<Value = Lease> {
    prop_oneof![2 => (3u64..40).prop_map(Lease::Short), 3 => Just(Lease::Long)]
}

/// A waiter's keep-alive: mostly longer than the sequence (so waiters are still there when the
/// lock falls free), sometimes short enough to go stale.
fn keepalive() -> impl Strategy<Value = Option<Lease>> {
    let lease = prop_oneof![1 => (3u64..40).prop_map(Lease::Short), 4 => Just(Lease::Long)];
    prop::option::weighted(0.7, lease)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (0usize..3, lease(), keepalive(), prop::bool::weighted(0.2))
            .prop_map(|(owner, lease, keepalive, look)| Op::Acquire { owner, lease, keepalive, look }),
        4 => any::<usize>().prop_map(|call| Op::Retry { call }),
        1 => Just(Op::Resend),
        1 => any::<usize>().prop_map(|call| Op::LastTry { call }),
        2 => (0usize..2, any::<bool>()).prop_map(|(client, on)| Op::Listen { client, on }),
        3 => any::<usize>().prop_map(|hold| Op::Release { hold }),
        5 => any::<usize>().prop_map(|hold| Op::ReleaseHeld { hold }),
        2 => (prop::collection::vec(any::<usize>(), 1..4), prop::option::of(lease()), prop::bool::weighted(0.3))
            .prop_map(|(holds, lease, until)| Op::Renew { holds, lease, until }),
        2 => any::<usize>().prop_map(|call| Op::Cancel { call }),
        2 => Just(Op::CancelFirst),
        2 => any::<usize>().prop_map(|hold| Op::ReleaseThenCancelFirst { hold }),
        1 => Just(Op::ForceUnlock),
        1 => (0usize..3).prop_map(|owner| Op::HoldCount { owner }),
        3 => (1u64..45).prop_map(|ms| Op::Sleep { ms }),
        1 => Just(Op::FlushScripts),
        1 => Just(Op::Snapshot),
        1 => Just(Op::Restore),
        1 => (1usize..6).prop_map(|steps| Op::Foreign { steps }),
        1 => prop_oneof![Just(Bad::ZeroLease), Just(Bad::HugeLease), Just(Bad::EmptyName)]
            .prop_map(Op::BadInput),
    ]
}

// === the environment: one server per test fn ===

struct Env {
    /// How often each kind of step and outcome came up (printed at the end: what was covered).
    seen: std::cell::RefCell<BTreeMap<String, u64>>,
    rt: tokio::runtime::Runtime,
    url: String,
    server: RedisServer,
    redis: Fred,
    lockkit: lockkit::Client,
}

impl Env {
    fn start() -> Env {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime");
        let (server, redis, lockkit) = rt.block_on(async {
            let server = spawned().await;
            let url = server.url();
            let redis = raw(&url).await;
            let lockkit = lockkit_suite::client(&url).await;
            (server, redis, lockkit)
        });
        Env {
            seen: std::cell::RefCell::default(),
            url: server.url(),
            rt,
            server,
            redis,
            lockkit,
        }
    }
}

/// A connection in subscribed mode (RESP2): the listener of the sequence's channels.
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

    async fn send(&mut self, args: &[&str]) {
        use tokio::io::AsyncWriteExt;
        self.conn
            .write_all(&lockkit_testkit::encode_command(args))
            .await
            .expect("a command to the subscriber connection");
    }

    /// The next value the server sent.
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

    /// Sends `args` and reads up to the reply whose kind (first element) is `kind`; the messages
    /// that came before it.
    async fn until(&mut self, args: &[&str], kind: &str) -> Vec<Got> {
        self.send(args).await;
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
                Some("message" | "smessage") if parts.len() == 3 => {
                    got.push((parts[1].clone(), parts[2].clone()));
                }
                Some(k) if k == kind => return got,
                _ => panic!("unexpected on the subscriber connection: {value:?}"),
            }
        }
    }

    /// Every message delivered so far: the server answers a `PING` after the messages it wrote
    /// before it (a script's `PUBLISH` writes to the subscriber before the script replies).
    async fn drain(&mut self) -> Vec<Got> {
        self.until(&["PING"], "pong").await
    }

    /// Subscribes to `channel` (`on`) or unsubscribes, as a shard channel when `sharded`; the
    /// messages that came before.
    async fn listen(&mut self, channel: &str, on: bool, sharded: bool) -> Vec<Got> {
        match (on, sharded) {
            (true, false) => self.until(&["SUBSCRIBE", channel], "subscribe").await,
            (false, false) => self.until(&["UNSUBSCRIBE", channel], "unsubscribe").await,
            (true, true) => self.until(&["SSUBSCRIBE", channel], "ssubscribe").await,
            (false, true) => self.until(&["SUNSUBSCRIBE", channel], "sunsubscribe").await,
        }
    }
}

fn custom(name: &'static str) -> CustomCommand {
    CustomCommand::new_static(name, ClusterHash::FirstKey, false)
}

/// Runs a protocol script by `EVALSHA`, loading it on `NOSCRIPT` (as the runtime does): its
/// integer reply, or the error Redis gave.
async fn run(
    redis: &Fred,
    script: &Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<Vec<i64>, String> {
    let script = FredScript::from_lua(script.source());
    match script
        .evalsha_with_reload::<Value, _, _>(redis, keys, args)
        .await
    {
        Ok(value) => Ok(value
            .into_array()
            .iter()
            .map(|v| v.as_i64().expect("an integer reply"))
            .collect()),
        Err(err) => Err(err.details().to_owned()),
    }
}

// === the model side ===

#[derive(Debug, Clone)]
enum Model {
    Hash(Box<HashLock>),
    Spin(SpinLock),
}

/// An operation with its names resolved.
#[derive(Debug, Clone)]
enum Call {
    Acquire(Request),
    Release(String),
    Renew(Vec<(String, Renewal)>),
    Cancel(String),
    ForceUnlock,
    HoldCount(String),
}

/// What a renewal asks for one hold (the renew script's `ARGV[2i]`).
#[derive(Debug, Clone, Copy)]
enum Renewal {
    /// `<ms>`: now + lease (0: only check).
    Lease(u64),
    /// `@<server ms>`: that instant (a granted hold's confirmation).
    Until(u64),
}

impl Renewal {
    fn arg(self) -> String {
        match self {
            Renewal::Lease(ms) => ms.to_string(),
            Renewal::Until(at) => format!("@{at}"),
        }
    }
}

/// What the model says a script call answers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expected {
    Acquire(Result<Acquired, WrongType>),
    SpinAcquire(Result<SpinAcquired, WrongType>),
    Release(Result<Released, WrongType>),
    SpinRelease(Result<bool, WrongType>),
    Renew(Vec<bool>),
    Flag(bool),
    Cancel(Result<bool, WrongType>),
    Count(Result<u32, WrongType>),
}

impl Model {
    fn apply(&mut self, call: &Call, now: Now) -> Expected {
        let ms = now.ms;
        match (self, call) {
            (Model::Hash(m), Call::Acquire(req)) => Expected::Acquire(m.acquire(now, req)),
            (Model::Hash(m), Call::Release(marker)) => Expected::Release(m.release(now, marker)),
            (Model::Hash(m), Call::Renew(holds)) => Expected::Renew(
                holds
                    .iter()
                    .map(|(h, renewal)| match *renewal {
                        Renewal::Lease(l) => m.renew(ms, h, l),
                        Renewal::Until(at) => m.renew_until(ms, h, at),
                    })
                    .collect(),
            ),
            (Model::Hash(m), Call::Cancel(waiter)) => Expected::Cancel(m.cancel(now, waiter)),
            (Model::Hash(m), Call::ForceUnlock) => Expected::Flag(m.force_unlock(now)),
            (Model::Hash(m), Call::HoldCount(owner)) => {
                Expected::Count(m.hold_count(ms, &[owner.as_str()]))
            }
            (Model::Spin(m), Call::Acquire(req)) => {
                Expected::SpinAcquire(m.acquire(ms, &req.marker, req.lease_ms))
            }
            (Model::Spin(m), Call::Release(marker)) => Expected::SpinRelease(m.release(ms, marker)),
            (Model::Spin(m), Call::Renew(holds)) => Expected::Renew(
                holds
                    .iter()
                    .map(|(h, renewal)| match *renewal {
                        Renewal::Lease(l) => m.renew(ms, h, l),
                        Renewal::Until(_) => unreachable!("the spin lock's renewal takes leases"),
                    })
                    .collect(),
            ),
            (Model::Spin(m), Call::ForceUnlock) => Expected::Flag(m.force_unlock(ms)),
            (Model::Spin(_), Call::Cancel(_) | Call::HoldCount(_)) => {
                unreachable!("not a spin-lock operation")
            }
        }
    }

    /// The messages the step published: those a subscriber heard, and how many nobody did.
    fn messages(&mut self) -> (Vec<Got>, usize) {
        let Model::Hash(m) = self else {
            return (Vec::new(), 0);
        };
        let all = m.take_messages();
        let unheard = all.iter().filter(|m| !m.heard).count();
        let heard = all
            .into_iter()
            .filter(|m| m.heard)
            .map(|m| (m.channel, m.payload))
            .collect();
        (heard, unheard)
    }

    /// The object's keys as the model says Redis shows them at `now`, normalized as
    /// [`normalize`] does with what Redis shows.
    fn keys(&self, roles: &[&str], now: u64) -> Vec<RawKey> {
        match self {
            Model::Spin(m) => {
                let view = m.view(now);
                vec![match (&view.holder, view.foreign) {
                    (_, true) => key("hash", vec!["f=v".to_owned()], -1),
                    (Some((marker, until)), _) => {
                        key("string", vec![marker.clone()], as_i64(*until))
                    }
                    (None, _) => absent(),
                }]
            }
            Model::Hash(m) => {
                let view = m.view(now);
                roles
                    .iter()
                    .map(|role| hash_lock_key(&view, role))
                    .collect()
            }
        }
    }
}

/// What Redis shows, in the form [`Model::keys`] gives: hash fields as sorted `field=value`,
/// the waiting set as its members in order (its scores are microseconds), deadlines as sorted
/// `member=score`, and no expiry for the auxiliary keys.
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
                "main" => k.expire_at,
                _ if k.ty == "none" || k.ty == "string" && *role == "token" => k.expire_at,
                _ => ANY,
            };
            key(&k.ty, items, expire_at)
        })
        .collect()
}

/// Whether Redis' reply is the one the model gives (at `now`, the model's instant of the call).
fn agrees(prim: Prim, expected: &Expected, actual: &Result<Vec<i64>, String>, now: u64) -> bool {
    let wrong_type = |actual: &Result<Vec<i64>, String>| matches!(actual, Err(message) if message.contains("WRONGTYPE"));
    // The busy reply's TTL: Redis' PTTL may differ by its millisecond rounding.
    let ttl = |until: Option<u64>, pttl: Option<u64>| match (until, pttl) {
        (None, None) => true,
        (Some(until), Some(pttl)) => (as_i64(until) - as_i64(now) - as_i64(pttl)).abs() <= 1,
        _ => false,
    };
    // A lock's refusal: the server's clock, exactly the model's instant, and what is left. Left
    // is `until - now` from the script's clock, or a key's PTTL (when the acquire handed the lock
    // over in this very script, or a reservation's window), which counts from Redis' own clock:
    // seen up to 2 ms off either way.
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
    let Ok(reply) = actual else {
        return match expected {
            Expected::Acquire(Err(WrongType))
            | Expected::SpinAcquire(Err(WrongType))
            | Expected::Release(Err(WrongType))
            | Expected::SpinRelease(Err(WrongType))
            | Expected::Cancel(Err(WrongType))
            | Expected::Count(Err(WrongType)) => wrong_type(actual),
            _ => false,
        };
    };
    match expected {
        Expected::Acquire(Ok(Acquired::Granted { count, token })) if prim == Prim::Fair => {
            token.is_none()
                && fair_lock::AcquireReply::decode(reply)
                    == Ok(fair_lock::AcquireReply::Acquired { hold_count: *count })
        }
        Expected::Acquire(Ok(Acquired::Busy { until })) if prim == Prim::Fair => matches!(
            fair_lock::AcquireReply::decode(reply),
            Ok(fair_lock::AcquireReply::Busy { wait_ms }) if ttl(*until, wait_ms)
        ),
        Expected::Acquire(Ok(_)) if prim == Prim::Fair => false,
        Expected::Acquire(Ok(Acquired::Granted { count, token })) => matches!(
            AcquireReply::decode(reply),
            Ok(AcquireReply::Acquired { hold_count, token: t }) if hold_count == *count && t == *token
        ),
        Expected::Acquire(Ok(Acquired::Busy { until })) => matches!(
            AcquireReply::decode(reply),
            Ok(AcquireReply::Busy { pttl_ms, now_ms }) if refusal(*until, pttl_ms, now_ms)
        ),
        Expected::Acquire(Ok(Acquired::Reserved { until })) => matches!(
            AcquireReply::decode(reply),
            Ok(AcquireReply::Reserved { window_ms, now_ms })
                if refusal(Some(*until), Some(window_ms), now_ms)
        ),
        Expected::Acquire(Ok(Acquired::Available)) => lock::decode_look(reply) == Ok(None),
        Expected::SpinAcquire(Ok(SpinAcquired::Granted)) => {
            spin_lock::AcquireReply::decode(reply) == Ok(spin_lock::AcquireReply::Acquired)
        }
        Expected::SpinAcquire(Ok(SpinAcquired::Busy { until })) => matches!(
            spin_lock::AcquireReply::decode(reply),
            Ok(spin_lock::AcquireReply::Busy { pttl_ms }) if ttl(Some(*until), pttl_ms)
        ),
        Expected::Release(Ok(released)) => {
            let want = match released {
                Released::Freed => ReleaseReply::Freed,
                Released::StillHeld(hold_count) => ReleaseReply::StillHeld {
                    hold_count: *hold_count,
                },
                Released::NotHeld => ReleaseReply::NotHeld,
            };
            ReleaseReply::decode(reply) == Ok(want)
        }
        Expected::SpinRelease(Ok(released)) => {
            let want = if *released {
                ReleaseReply::Freed
            } else {
                ReleaseReply::NotHeld
            };
            ReleaseReply::decode(reply) == Ok(want)
        }
        Expected::Renew(live) => lock::decode_renew(reply, live.len()).as_ref() == Ok(live),
        Expected::Flag(flag) => lock::decode_force_unlock(reply) == Ok(*flag),
        Expected::Cancel(Ok(flag)) => lock::decode_cancel(reply) == Ok(*flag),
        Expected::Count(Ok(count)) => lock::decode_hold_count(reply) == Ok(*count),
        Expected::Acquire(Err(_))
        | Expected::SpinAcquire(Err(_))
        | Expected::Release(Err(_))
        | Expected::SpinRelease(Err(_))
        | Expected::Cancel(Err(_))
        | Expected::Count(Err(_)) => false,
    }
}

/// A short name of an outcome, for the coverage count.
fn outcome(expected: &Expected) -> &'static str {
    match expected {
        Expected::Acquire(Ok(Acquired::Granted { count: 1, .. })) => "acquire: granted",
        Expected::Acquire(Ok(Acquired::Granted { .. })) => "acquire: granted (re-entry)",
        Expected::Acquire(Ok(Acquired::Busy { .. }))
        | Expected::SpinAcquire(Ok(SpinAcquired::Busy { .. })) => "acquire: busy",
        Expected::Acquire(Ok(Acquired::Reserved { .. })) => "acquire: reserved for another",
        Expected::Acquire(Ok(Acquired::Available)) => "acquire: only looked, available",
        Expected::SpinAcquire(Ok(SpinAcquired::Granted)) => "acquire: granted",
        Expected::Release(Ok(Released::Freed)) | Expected::SpinRelease(Ok(true)) => {
            "release: freed"
        }
        Expected::Release(Ok(Released::StillHeld(_))) => "release: still held",
        Expected::Release(Ok(Released::NotHeld)) | Expected::SpinRelease(Ok(false)) => {
            "release: not held"
        }
        Expected::Renew(live) if live.iter().any(|l| *l) => "renew: some live",
        Expected::Renew(_) => "renew: all gone",
        Expected::Flag(true) => "force-unlock: true",
        Expected::Flag(false) => "force-unlock: false",
        Expected::Cancel(Ok(true)) => "cancel: true",
        Expected::Cancel(Ok(false)) => "cancel: false",
        Expected::Count(Ok(_)) => "hold count",
        Expected::Acquire(Err(_))
        | Expected::SpinAcquire(Err(_))
        | Expected::Release(Err(_))
        | Expected::SpinRelease(Err(_))
        | Expected::Cancel(Err(_))
        | Expected::Count(Err(_)) => "wrong type",
    }
}

// === one sequence ===

/// The primitive under test, with its scripts and key layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Prim {
    Lock,
    Fenced,
    Fair,
    Spin,
}

impl Prim {
    /// The primitive's id in the reliability report.
    fn id(self) -> &'static str {
        match self {
            Prim::Lock => "lock",
            Prim::Fenced => "fenced",
            Prim::Fair => "fair",
            Prim::Spin => "spin",
        }
    }

    fn kind(self) -> Kind {
        match self {
            Prim::Lock => Kind::Lock,
            Prim::Fenced => Kind::FencedLock,
            Prim::Fair => Kind::FairLock,
            Prim::Spin => Kind::SpinLock,
        }
    }

    fn model(self) -> Model {
        let hash = |kind| Model::Hash(Box::new(HashLock::new(kind)));
        match self {
            Prim::Lock => hash(LockKind::Lock),
            Prim::Fenced => hash(LockKind::Fenced),
            Prim::Fair => hash(LockKind::Fair),
            Prim::Spin => Model::Spin(SpinLock::new()),
        }
    }

    /// Whether it hands over by direct grant (and so has per-client channels to listen on).
    fn grants(self) -> bool {
        matches!(self, Prim::Lock | Prim::Fenced)
    }
}

struct Sequence<'a> {
    env: &'a Env,
    prim: Prim,
    name: String,
    keys: ObjectKeys,
    roles: Vec<&'static str>,
    model: Model,
    /// Every acquire call so far (each with its one marker).
    calls: Vec<Request>,
    last: Option<Request>,
    /// Each client's own channel for the object (`<object channel>:<client id>`).
    channels: [String; 2],
    /// `Lock`, `FencedLock`: the connection listening on some of `channels` (and on the object's
    /// channel, where nothing may arrive).
    subscriber: Option<Subscriber>,
    /// The entry of the call a heard message last handed the lock (granted or reserved).
    handed: Option<String>,
    /// `Lock`, `FencedLock`: sharded pub/sub (the scripts `SPUBLISH`, the subscriber
    /// `SSUBSCRIBE`s).
    sharded: bool,
    snapshot: Option<(Vec<Dump>, Model)>,
    sequence: u64,
    log: Vec<String>,
    /// Steps left before the foreign value is deleted.
    foreign_for: Option<usize>,
    /// The server's clock (ms) after the last step: `Op::Renew`'s `until` instants are counted
    /// from it.
    clock_ms: u64,
    /// The last step's script call, if the client may send it twice (for `Op::Duplicate`).
    delivered: Option<Delivered>,
    /// `FencedLock`: the token counter TTL given to the scripts (`None`: none, their default).
    counter_ttl: Option<u64>,
    /// `FencedLock`: the greatest token any step handed out (every later one must exceed it).
    max_token: u64,
}

/// A script call as first delivered, and what it left (for `Op::Duplicate`).
#[derive(Debug, Clone)]
struct Delivered {
    call: Call,
    reply: Result<Vec<i64>, String>,
    /// The object's keys right after it (normalized), and the server's clock just before it was sent (ms).
    keys: Vec<RawKey>,
    at: u64,
}

impl Call {
    /// Whether the client sends it with `Resend::Allowed` (fred may deliver it twice).
    fn resendable(&self) -> bool {
        matches!(
            self,
            Call::Acquire(_) | Call::Renew(_) | Call::Cancel(_) | Call::HoldCount(_)
        )
    }
}

/// Whether two answers to the same request are the same, or ones the client treats alike: a
/// taken hold (same count, same token) again, a refusal again (its figures may move on), the
/// same renewal and hold count; a cancel is only logged.
fn same_answer(
    call: &Call,
    first: &Result<Vec<i64>, String>,
    again: &Result<Vec<i64>, String>,
) -> bool {
    let (Ok(first), Ok(again)) = (first, again) else {
        return first == again;
    };
    match call {
        Call::Acquire(_) if first.first() == Some(&0) => again.first() == Some(&0),
        Call::Cancel(_) => again.len() == 1 && again[0] >= 0,
        _ => first == again,
    }
}

impl<'a> Sequence<'a> {
    async fn new(env: &'a Env, prim: Prim, sharded: bool) -> Self {
        // A space in the name, so in the channels: a request's channel is its last field.
        let name = unique("model obj");
        let keys = Namespace::default()
            .object(prim.kind(), &name)
            .expect("valid keys");
        let mut roles = vec!["main"];
        roles.extend(keys.suffixes.iter().copied());
        let channels = CLIENTS.map(|client| format!("{}:{client}", keys.channel));
        let mut model = prim.model();
        let mut subscriber = None;
        if prim.grants() {
            // Client 0 listens from the start; `Op::Listen` changes that.
            let mut sub = Subscriber::connect(env.server.addr()).await;
            for channel in [&keys.channel, &channels[0]] {
                assert!(sub.listen(channel, true, sharded).await.is_empty());
                if let Model::Hash(m) = &mut model {
                    m.listen(channel, true);
                }
            }
            subscriber = Some(sub);
        }
        Self {
            env,
            prim,
            name,
            keys,
            roles,
            model,
            calls: Vec::new(),
            last: None,
            channels,
            subscriber,
            handed: None,
            sharded,
            snapshot: None,
            sequence: 0,
            log: Vec::new(),
            foreign_for: None,
            clock_ms: 0,
            delivered: None,
            counter_ttl: None,
            max_token: 0,
        }
    }

    fn client(owner: usize) -> usize {
        owner % 2
    }

    fn owner(i: usize) -> String {
        format!("{}:{}", CLIENTS[Self::client(i)], 1000 + i)
    }

    fn next_marker(&mut self, owner: usize) -> (String, String) {
        self.sequence += 1;
        let client = CLIENTS[Self::client(owner)];
        (
            hold_marker(client, self.sequence),
            fair_lock::waiter_id(client, self.sequence),
        )
    }

    /// A fenced script's token counter TTL argument, when the sequence gives one.
    fn fenced_ttl(&self) -> Option<String> {
        (self.prim == Prim::Fenced)
            .then_some(self.counter_ttl)
            .flatten()
            .map(|ttl| ttl.to_string())
    }

    /// The scripts' pub/sub flag (`1`: `SPUBLISH`).
    fn flag(&self) -> String {
        if self.sharded { "1" } else { "0" }.to_owned()
    }

    /// The keys a script of this kind takes, by the suffixes it names.
    fn keys_of(&self, suffixes: &[&str]) -> Vec<String> {
        let mut keys = vec![self.keys.key.clone()];
        keys.extend(
            suffixes
                .iter()
                .map(|s| self.keys.aux(s).expect("a key of the object").to_owned()),
        );
        keys
    }

    /// The waiter that gives up in `CancelFirst`: the call last handed the lock, else the
    /// longest waiting (the fair queue's head).
    fn first_waiter(&mut self) -> Option<String> {
        let Model::Hash(m) = &self.model else {
            return None;
        };
        if self.prim == Prim::Fair {
            return m.queue.items.first().cloned();
        }
        self.handed
            .take()
            .or_else(|| m.waiting_order().into_iter().next())
    }

    /// Resolves a generated op to a script call (or `None` for the ops that are not one).
    fn resolve(&mut self, op: &Op) -> Option<Call> {
        match op {
            Op::Acquire {
                owner,
                lease,
                keepalive,
                look,
            } => {
                let (marker, waiter) = self.next_marker(*owner);
                let req = Request {
                    owner: Self::owner(*owner),
                    marker,
                    lease_ms: lease.ms(),
                    keepalive_ms: keepalive.map_or(0, Lease::ms),
                    waiter,
                    channel: self.channels[Self::client(*owner)].clone(),
                    look: *look && self.prim == Prim::Lock,
                };
                self.calls.push(req.clone());
                Some(self.send(req))
            }
            Op::Retry { call } if !self.calls.is_empty() => {
                let req = self.calls[call % self.calls.len()].clone();
                Some(self.send(req))
            }
            Op::Resend => self.last.clone().map(Call::Acquire),
            Op::LastTry { call } if !self.calls.is_empty() => {
                let mut req = self.calls[call % self.calls.len()].clone();
                req.keepalive_ms = 0;
                Some(self.send(req))
            }
            Op::Release { hold } if !self.calls.is_empty() => Some(Call::Release(
                self.calls[hold % self.calls.len()].marker.clone(),
            )),
            Op::Renew {
                holds,
                lease,
                until,
            } if !self.calls.is_empty() => Some(Call::Renew(
                holds
                    .iter()
                    .map(|h| {
                        let marker = self.calls[h % self.calls.len()].marker.clone();
                        let renewal = match lease {
                            Some(lease) if *until && self.prim != Prim::Spin => {
                                Renewal::Until(self.clock_ms + lease.ms())
                            }
                            lease => Renewal::Lease(lease.map_or(0, Lease::ms)),
                        };
                        (marker, renewal)
                    })
                    .collect(),
            )),
            Op::Cancel { call } if !self.calls.is_empty() && self.prim != Prim::Spin => {
                let req = &self.calls[call % self.calls.len()];
                let waiter = if self.prim == Prim::Fair {
                    req.waiter.clone()
                } else {
                    req.entry()
                };
                Some(Call::Cancel(waiter))
            }
            Op::ReleaseHeld { hold } => {
                let held: Vec<String> = match &self.model {
                    Model::Hash(m) => m.holds.keys().cloned().collect(),
                    Model::Spin(m) => m.holder.iter().map(|(h, _)| h.clone()).collect(),
                };
                (!held.is_empty()).then(|| Call::Release(held[hold % held.len()].clone()))
            }
            Op::CancelFirst => self.first_waiter().map(Call::Cancel),
            Op::ForceUnlock => Some(Call::ForceUnlock),
            Op::HoldCount { owner } if self.prim != Prim::Spin => {
                Some(Call::HoldCount(Self::owner(*owner)))
            }
            _ => None,
        }
    }

    fn send(&mut self, req: Request) -> Call {
        self.last = Some(req.clone());
        Call::Acquire(req)
    }

    /// The script and its KEYS and ARGV for a call.
    fn script(&self, call: &Call) -> (&'static Script, Vec<String>, Vec<String>) {
        let channel = self.keys.channel.clone();
        let hash_renew = |holds: &[(String, Renewal)], renew: &'static Script| {
            let keys = vec![self.keys.key.clone(); holds.len()];
            let args = holds
                .iter()
                .flat_map(|(m, renewal)| [m.clone(), renewal.arg()])
                .collect();
            (renew, keys, args)
        };
        let lock_keys = ["handoff", "waiting", "timeouts"];
        match (self.prim, call) {
            (Prim::Lock | Prim::Fenced, Call::Acquire(r)) => {
                let (script, keys) = if self.prim == Prim::Lock {
                    (&lock::ACQUIRE, self.keys_of(&lock_keys))
                } else {
                    (&fenced_lock::ACQUIRE, self.keys.keys.clone())
                };
                let mut args = vec![
                    r.owner.clone(),
                    r.marker.clone(),
                    r.lease_ms.to_string(),
                    r.keepalive_ms.to_string(),
                    r.channel.clone(),
                    self.flag(),
                ];
                if r.look {
                    args.push("1".to_owned());
                } else if let (Prim::Fenced, Some(ttl)) = (self.prim, self.counter_ttl) {
                    args.push(ttl.to_string());
                }
                (script, keys, args)
            }
            (Prim::Lock | Prim::Fenced, Call::Release(marker)) => {
                let (script, keys) = if self.prim == Prim::Lock {
                    (&lock::RELEASE, self.keys_of(&lock_keys))
                } else {
                    (&fenced_lock::RELEASE, self.keys.keys.clone())
                };
                let mut args = vec![marker.clone(), channel, self.flag()];
                args.extend(self.fenced_ttl());
                (script, keys, args)
            }
            (Prim::Lock | Prim::Fenced, Call::Cancel(entry)) => {
                let keys = if self.prim == Prim::Lock {
                    self.keys_of(&lock_keys)
                } else {
                    self.keys_of(&["handoff", "waiting", "timeouts", "token"])
                };
                let mut args = vec![entry.clone(), channel, self.flag()];
                args.extend(self.fenced_ttl());
                (&lock::CANCEL, keys, args)
            }
            (Prim::Lock | Prim::Fenced | Prim::Spin, Call::ForceUnlock) => {
                let mut args = vec![channel, self.flag()];
                args.extend(self.fenced_ttl());
                (&lock::FORCE_UNLOCK, self.keys.keys.clone(), args)
            }
            (Prim::Fair, Call::Acquire(r)) => (
                &fair_lock::ACQUIRE,
                self.keys.keys.clone(),
                vec![
                    r.owner.clone(),
                    r.marker.clone(),
                    r.lease_ms.to_string(),
                    r.waiter.clone(),
                    r.keepalive_ms.to_string(),
                    channel,
                    "0".to_owned(),
                ],
            ),
            (Prim::Fair, Call::Release(marker)) => (
                &fair_lock::RELEASE,
                self.keys.keys.clone(),
                vec![marker.clone(), channel, "0".to_owned()],
            ),
            (Prim::Fair, Call::Cancel(waiter)) => (
                &fair_lock::CANCEL,
                self.keys.keys.clone(),
                vec![waiter.clone(), channel, "0".to_owned()],
            ),
            (Prim::Fair, Call::ForceUnlock) => (
                &fair_lock::FORCE_UNLOCK,
                self.keys.keys.clone(),
                vec![channel, "0".to_owned()],
            ),
            (_, Call::Renew(holds)) if self.prim == Prim::Spin => {
                hash_renew(holds, &spin_lock::RENEW)
            }
            (_, Call::Renew(holds)) => hash_renew(holds, &lock::RENEW),
            (_, Call::HoldCount(owner)) => (
                &lock::HOLD_COUNT,
                vec![self.keys.key.clone()],
                vec![owner.clone()],
            ),
            (Prim::Spin, Call::Acquire(r)) => (
                &spin_lock::ACQUIRE,
                vec![self.keys.key.clone()],
                vec![r.marker.clone(), r.lease_ms.to_string()],
            ),
            (Prim::Spin, Call::Release(marker)) => (
                &spin_lock::RELEASE,
                vec![self.keys.key.clone()],
                vec![marker.clone(), channel, "0".to_owned()],
            ),
            (Prim::Spin, Call::Cancel(_)) => unreachable!("resolve gives none"),
        }
    }

    /// Runs one op on Redis and on the model (after deleting a foreign value whose time is up);
    /// `Err` says how they disagree.
    async fn step(&mut self, op: &Op) -> Result<(), String> {
        match self.foreign_for {
            Some(0) => {
                self.foreign_for = None;
                self.delivered = None;
                // Unless a restore or a force-unlock removed it already.
                let foreign = match &mut self.model {
                    Model::Hash(m) => std::mem::take(&mut m.foreign),
                    Model::Spin(m) => std::mem::take(&mut m.foreign),
                };
                if foreign {
                    let _: i64 = self
                        .env
                        .redis
                        .custom(custom("DEL"), vec![self.keys.key.as_str()])
                        .await
                        .map_err(|e| e.to_string())?;
                }
            }
            Some(n) => self.foreign_for = Some(n - 1),
            None => {}
        }
        self.one_step(op).await
    }

    /// The messages the subscriber got since the last look (none without a subscriber).
    async fn heard(&mut self) -> Vec<Got> {
        match &mut self.subscriber {
            Some(sub) => sub.drain().await,
            None => Vec::new(),
        }
    }

    /// The fencing counter as Redis has it after the step.
    fn counter_seen(&self, raw: &[RawKey]) -> Option<u64> {
        let at = self.roles.iter().position(|r| *r == "token")?;
        raw[at].items.first()?.parse().ok()
    }

    async fn one_step(&mut self, op: &Op) -> Result<(), String> {
        let redis = &self.env.redis;
        let first = match op {
            Op::Duplicate => self.delivered.take(),
            _ => None,
        };
        let call = match (op, &first) {
            (Op::Duplicate, Some(first)) => Some(first.call.clone()),
            _ => self.resolve(op),
        };
        self.delivered = None;
        let mut ran = None;
        if let Some(call) = &call {
            let (script, keys, args) = self.script(call);
            let t0 = time(redis).await;
            let actual = run(redis, script, keys, args).await;
            let t1 = time(redis).await;
            ran = Some((actual, t0, t1));
        } else {
            self.count(
                format!("{op:?}")
                    .split([' ', '('])
                    .next()
                    .unwrap_or_default(),
            );
            self.other(op).await?;
        }
        let got = self.heard().await;
        let (raw, now) = read_state(redis, &self.keys.keys).await;
        self.clock_ms = now;
        let mut candidates = vec![];
        let mut delivered = None;
        match (&call, ran) {
            (Some(call), Some((actual, t0, t1))) => {
                if let Some(first) = &first {
                    // `now`: the clock of the keys read (after the messages were drained), which
                    // is what a lapse must be judged against, not the end of the script.
                    self.second_delivery(first, &actual, &got, &raw, now)?;
                }
                if call.resendable() {
                    delivered = Some(Delivered {
                        call: call.clone(),
                        reply: actual.clone(),
                        keys: normalize(&raw, &self.roles),
                        at: t0.ms,
                    });
                }
                // A fenced script mints with the microsecond of its own `TIME` read: the counter
                // after the step shows it (`max(counter, µs) + 1` for its last mint; the model
                // mints every token of one step from one µs, so k mints end at µs + k).
                // The tokens the reply and the heard grants carry show it too (with a counter
                // TTL of a few ms, the counter may be gone by the time the keys are read).
                let mut clocks = vec![None];
                if self.prim == Prim::Fenced {
                    let mints = match &self.model {
                        Model::Hash(m) => m.waiting.items.len() as u64 + 1,
                        Model::Spin(_) => 1,
                    };
                    let mut minted: Vec<u64> = self.counter_seen(&raw).into_iter().collect();
                    if let (Call::Acquire(_), Ok(reply)) = (call, &actual) {
                        minted.extend(reply.get(2).and_then(|t| u64::try_from(*t).ok()));
                    }
                    minted.extend(got.iter().filter_map(|(_, payload)| {
                        payload
                            .strip_prefix("g:")?
                            .split(':')
                            .nth(1)?
                            .parse::<u64>()
                            .ok()
                    }));
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
                }
                let mut first_expected = None;
                // Redis' own clock (key expiry, `PX`, `PTTL`) is cached per event-loop turn, so it
                // may lag the `TIME` read just before the call by a millisecond or two; and a key
                // expiring within the millisecond the script's `TIME` read may already be expired
                // for Redis' lookups: a hold expiring at that boundary may count as either.
                // Redis expires whole keys on that cached clock (`keys_ms`), which is not ahead
                // of the script's `TIME`.
                let instants = (t0.ms.saturating_sub(2)..=t1.ms + 2).flat_map(|ms| {
                    (t0.ms.saturating_sub(2)..=ms).map(move |keys_ms| (ms, keys_ms))
                });
                for ((ms, keys_ms), clock) in
                    instants.flat_map(|i| clocks.iter().map(move |c| (i, *c)))
                {
                    let now = Now {
                        ms,
                        us: clock.unwrap_or_else(|| t0.us.max(ms * 1000)),
                        keys_ms,
                    };
                    let mut model = self.model.clone();
                    let expected = model.apply(call, now);
                    let (sent, unheard) = model.messages();
                    first_expected.get_or_insert_with(|| (expected.clone(), sent.clone()));
                    if agrees(self.prim, &expected, &actual, ms) && sent == got {
                        if candidates.is_empty() {
                            self.count(outcome(&expected));
                            if unheard > 0 {
                                self.count("(a message nobody heard: grant undone)");
                            }
                        }
                        candidates.push(model);
                    }
                }
                let again = if first.is_some() {
                    " (delivered again)"
                } else {
                    ""
                };
                self.log
                    .push(format!("{call:?}{again} -> {actual:?}, heard {got:?}"));
                if candidates.is_empty() && first.is_some() {
                    // A second delivery that changed nothing, where the model would have.
                    candidates.push(self.model.clone());
                }
                if let (Prim::Fenced, Ok(reply)) = (self.prim, &actual) {
                    // Issue 27, §4: tokens never go back, past the counter's TTL and restores.
                    let token = match call {
                        Call::Acquire(_) if reply.first() == Some(&1) && first.is_none() => {
                            reply.get(2).and_then(|t| u64::try_from(*t).ok())
                        }
                        _ => None,
                    };
                    let granted = got.iter().filter_map(|(_, payload)| {
                        payload
                            .strip_prefix("g:")?
                            .split(':')
                            .nth(1)?
                            .parse::<u64>()
                            .ok()
                    });
                    for token in token.into_iter().chain(granted) {
                        if token <= self.max_token
                            && !matches!(call, Call::Acquire(r) if self.model_holds(&r.marker, token))
                        {
                            return Err(format!(
                                "a token went back: {token} after {} was handed out",
                                self.max_token
                            ));
                        }
                        self.max_token = self.max_token.max(token);
                    }
                }
                if candidates.is_empty() {
                    let (expected, sent) =
                        first_expected.unwrap_or((Expected::Flag(false), Vec::new()));
                    return Err(format!(
                        "reply of {call:?}: Redis said {actual:?} and the subscriber heard {got:?}; the model {expected:?}, heard {sent:?} (at {} ms)\nmodel before: {:#?}",
                        t0.ms, self.model
                    ));
                }
            }
            _ => {
                self.log.push(format!("{op:?}"));
                if !got.is_empty() {
                    return Err(format!("after {op:?} the subscriber heard {got:?}"));
                }
                candidates.push(self.model.clone());
            }
        }
        let seen = normalize(&raw, &self.roles);
        // Each key is judged at an instant of its own near the read: Redis expires a key when
        // its cached clock passes the expiry, and `RESTORE` drops a key whose expiry is not in
        // the future, so a key whose expiry falls within a millisecond or two of the read may
        // be there or not.
        let fits = |model: &Model| {
            let views: Vec<Vec<RawKey>> = (now - 2..=now + 2)
                .map(|at| model.keys(&self.roles, at))
                .collect();
            (0..seen.len()).all(|i| views.iter().any(|view| view[i] == seen[i]))
        };
        for model in &candidates {
            if fits(model) {
                self.model = model.clone();
                self.follow_expiries(&raw);
                self.follow_handoffs(&got);
                self.delivered = delivered;
                return Ok(());
            }
        }
        Err(format!(
            "keys after {op:?} (at {now} ms):\nRedis:  {seen:?}\nmodel:  {:?}\nmodel state: {:#?}",
            candidates[0].keys(&self.roles, now),
            candidates[0]
        ))
    }

    /// A second delivery of `first`'s request (its reply `actual`, the messages `heard`, the
    /// keys `raw` after it, the server's clock `at` just after it) must answer alike, publish
    /// nothing, and change no key beyond moving an expiry on by the time that passed; not
    /// compared when something lapsed between the two.
    fn second_delivery(
        &self,
        first: &Delivered,
        actual: &Result<Vec<i64>, String>,
        heard: &[Got],
        raw: &[RawKey],
        at: u64,
    ) -> Result<(), String> {
        // A refusal names what is left of the holder's lease (or the reservation's window): if
        // that ran out meanwhile, the second delivery may rightly take the lock.
        // (Or it was gone already when the keys were read after the first delivery.)
        let refusal_ran_out = matches!(
            (&first.call, &first.reply),
            (Call::Acquire(_), Ok(reply))
                if reply.first() == Some(&0)
                    && (reply.get(1).is_none_or(|left| *left <= i64::try_from(at.saturating_sub(first.at) + 2).unwrap_or(i64::MAX))
                        || first.keys.first().is_some_and(|main| main.ty == "none"))
        );
        // What ended between the two deliveries, as the model has it (a key may be gone already
        // when the keys were read after the first).
        let window = first.at.saturating_sub(2)..=at + 2;
        let lapsed = match &self.model {
            Model::Hash(m) => m
                .holds
                .values()
                .map(|h| h.expiry)
                .chain(m.timeouts.items.values().copied())
                .chain(m.handoff.as_ref().map(|(_, until)| *until))
                .any(|t| window.contains(&t)),
            Model::Spin(m) => m
                .holder
                .as_ref()
                .is_some_and(|(_, until)| window.contains(until)),
        };
        if lapsed || refusal_ran_out || !lapsed_nothing(&self.roles, &first.keys, at) {
            self.count("duplicate: not compared (something lapsed)");
            return Ok(());
        }
        let (script, _, _) = self.script(&first.call);
        let what = format!("a second delivery of {} ({:?})", script.name(), self.prim);
        if !same_answer(&first.call, &first.reply, actual) {
            return Err(format!(
                "{what} answered {actual:?} where the first answered {:?}",
                first.reply
            ));
        }
        if !heard.is_empty() {
            return Err(format!("{what} published {heard:?} again"));
        }
        let after = normalize(raw, &self.roles);
        unchanged_keys(
            &self.roles,
            &first.keys,
            &after,
            at.saturating_sub(first.at) + 2,
        )
        .map_err(|change| format!("{what} changed {change}"))?;
        self.count("duplicate: changed nothing");
        Ok(())
    }

    /// Whether the model has the hold `marker` with the token `token` (a re-sent acquire's
    /// reply, or a claimed grant's, carries its hold's token again).
    fn model_holds(&self, marker: &str, token: u64) -> bool {
        matches!(&self.model, Model::Hash(m) if m.holds.get(marker).is_some_and(|h| h.token == Some(token)))
    }

    /// Notes what the step's heard messages handed over (for `CancelFirst`), and counts them.
    fn follow_handoffs(&mut self, got: &[Got]) {
        for (_, payload) in got {
            let marker = match Wake::decode(payload) {
                Wake::Grant { waiter, .. } => {
                    self.count("(a grant was heard)");
                    waiter
                }
                Wake::Prefer(marker) => {
                    self.count("(a looker was told of its reservation)");
                    marker
                }
                _ => continue,
            };
            self.handed = self
                .calls
                .iter()
                .find(|c| c.marker == marker)
                .map(Request::entry);
        }
        if let Model::Hash(m) = &self.model {
            if m.handoff.is_some() {
                self.count("(a reservation stands)");
            }
        }
    }

    fn count(&self, what: &str) {
        *self
            .env
            .seen
            .borrow_mut()
            .entry(what.to_owned())
            .or_default() += 1;
    }

    /// Takes the exact expiry instants of the keys Redis expires by a relative TTL (the
    /// reservation's `PX`, the waiting keys' `PEXPIRE`) from Redis: the model set them from the
    /// script's `TIME`, Redis from its cached clock.
    fn follow_expiries(&mut self, raw: &[RawKey]) {
        let Model::Hash(model) = &mut self.model else {
            return;
        };
        for (role, k) in self.roles.iter().zip(raw) {
            let Ok(at) = u64::try_from(k.expire_at) else {
                continue;
            };
            match *role {
                "handoff" => {
                    if let Some((_, until)) = &mut model.handoff {
                        *until = at;
                    }
                }
                "waiting" => model.waiting.expiry = Some(at),
                "timeouts" => model.timeouts.expiry = Some(at),
                "queue" => model.queue.expiry = Some(at),
                _ => {}
            }
        }
    }

    /// The ops that are not a script call.
    async fn other(&mut self, op: &Op) -> Result<(), String> {
        let redis = &self.env.redis;
        let command = |name| custom(name);
        match op {
            Op::Sleep { ms } => tokio::time::sleep(Duration::from_millis(*ms)).await,
            Op::LapseHolds => {
                let latest = match &self.model {
                    Model::Hash(m) => m.key_expiry(),
                    Model::Spin(m) => m.holder.as_ref().map(|(_, until)| *until),
                };
                let now = time(redis).await.ms;
                if let Some(left) = latest.map(|at| at.saturating_sub(now)) {
                    if left <= 60 {
                        // A hold in its last millisecond already counts as ended (`live`).
                        tokio::time::sleep(Duration::from_millis(left + 1)).await;
                    }
                }
            }
            Op::Listen { client, on } => {
                let channel = &self.channels[*client];
                if let (Some(sub), Model::Hash(m)) = (&mut self.subscriber, &mut self.model) {
                    let stray = sub.listen(channel, *on, self.sharded).await;
                    if !stray.is_empty() {
                        return Err(format!(
                            "the subscriber heard {stray:?} after the last step"
                        ));
                    }
                    m.listen(channel, *on);
                }
            }
            Op::FlushScripts => {
                let _: Value = redis
                    .custom(
                        CustomCommand::new_static("SCRIPT", ClusterHash::Random, false),
                        vec!["FLUSH"],
                    )
                    .await
                    .map_err(|e| e.to_string())?;
            }
            Op::Snapshot => {
                // One script, so no key expires between its DUMP and its PEXPIRETIME.
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
                let Some((dumps, model)) = self.snapshot.clone() else {
                    return Ok(());
                };
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
                match (&mut self.model, model) {
                    (Model::Hash(now), Model::Hash(then)) => now.restore(&then),
                    (model, then) => *model = then,
                }
            }
            Op::Foreign { steps } => {
                self.foreign_for = Some(*steps);
                let key = self.keys.key.as_str();
                if let Model::Spin(m) = &mut self.model {
                    let _: i64 = redis
                        .custom(command("DEL"), vec![key])
                        .await
                        .map_err(|e| e.to_string())?;
                    let _: i64 = redis
                        .custom(command("HSET"), vec![key, "f", "v"])
                        .await
                        .map_err(|e| e.to_string())?;
                    m.put_foreign();
                } else if let Model::Hash(m) = &mut self.model {
                    let _: Value = redis
                        .custom(command("SET"), vec![key, "foreign"])
                        .await
                        .map_err(|e| e.to_string())?;
                    m.put_foreign();
                }
            }
            Op::BadInput(bad) => {
                let (name, lease) = match bad {
                    Bad::ZeroLease => (self.name.as_str(), Duration::ZERO),
                    Bad::HugeLease => (self.name.as_str(), Duration::from_secs(400 * 86_400)),
                    Bad::EmptyName => ("", Duration::from_secs(1)),
                };
                let client = &self.env.lockkit;
                let wait = Duration::ZERO;
                let result = match self.prim {
                    Prim::Lock => client.lock(name).try_lock(wait, Some(lease)).await,
                    Prim::Fenced => client
                        .fenced_lock(name)
                        .try_lock(wait, Some(lease))
                        .await
                        .map(|guard| guard.map(lockkit::LockGuard::from)),
                    Prim::Fair => client.fair_lock(name).try_lock(wait, Some(lease)).await,
                    Prim::Spin => client.spin_lock(name).try_lock(wait, Some(lease)).await,
                };
                if !matches!(result, Err(lockkit::Error::InvalidArgument(_))) {
                    return Err(format!("{bad:?} was not refused: {result:?}"));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

// === the runner ===

/// The runner's settings: `cases` cases, the seed from `LOCKKIT_MODEL_SEED` or a fresh one
/// (returned, to be printed with any failure).
fn runner(cases: u32) -> (TestRunner, u64) {
    let seed = model_seed();
    let config = Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        max_shrink_iters: 512,
        ..Config::default()
    };
    (TestRunner::new(config), seed)
}

/// Runs generated sequences of `prim` until the budget is spent; on a disagreement, panics with
/// the seed (to replay: `LOCKKIT_MODEL_SEED`) and the shrunk sequence.
fn check(prim: Prim) {
    check_with(prim, Just(false), op(), true);
}

/// [`check`] with the ops drawn from `ops`, and pub/sub sharded or not as `sharded` draws it;
/// `save`: record the cases in the reliability report.
fn check_with(
    prim: Prim,
    sharded: impl Strategy<Value = bool>,
    ops: impl Strategy<Value = Op>,
    save: bool,
) {
    check_budget(prim, sharded, Just(None), ops, save, cases());
}

/// [`check_with`] for `cases` cases, the fenced lock's scripts given a token counter TTL drawn
/// from `counter_ttl` (`None`: none, their default of a day).
fn check_budget(
    prim: Prim,
    sharded: impl Strategy<Value = bool>,
    counter_ttl: impl Strategy<Value = Option<u64>>,
    ops: impl Strategy<Value = Op>,
    save: bool,
    cases: u32,
) {
    let env = Env::start();
    let (mut runner, seed) = runner(cases);
    let strategy = (sharded, counter_ttl, prop::collection::vec(ops, 1..50));
    let result = runner.run(&strategy, |(sharded, counter_ttl, ops)| {
        let mut sequence = env.rt.block_on(Sequence::new(&env, prim, sharded));
        sequence.counter_ttl = counter_ttl;
        if let (Model::Hash(m), Some(ttl)) = (&mut sequence.model, counter_ttl) {
            m.counter_ttl_ms = ttl;
        }
        if sharded {
            sequence.count("(a sequence on sharded pub/sub)");
        }
        let steps = ops.iter().flat_map(|op| match op {
            Op::ReleaseThenCancelFirst { hold } => {
                vec![Op::ReleaseHeld { hold: *hold }, Op::CancelFirst]
            }
            op => vec![op.clone()],
        });
        for (i, op) in steps.enumerate() {
            if let Err(why) = env.rt.block_on(sequence.step(&op)) {
                return Err(TestCaseError::fail(format!(
                    "step {i} disagrees: {why}\nsteps run:\n  {}",
                    sequence.log.join("\n  ")
                )));
            }
        }
        Ok(())
    });
    match result {
        Ok(()) => {
            eprintln!(
                "{prim:?}: {cases} cases passed (seed {seed}); steps: {:?}",
                env.seen.borrow()
            );
            if save {
                save_cases(prim.id(), cases);
            }
        }
        Err(TestError::Fail(why, (sharded, counter_ttl, ops))) => panic!(
            "{prim:?} disagrees with its model (LOCKKIT_MODEL_SEED={seed}).\nShrunk sequence (sharded: {sharded}, counter TTL: {counter_ttl:?}): {ops:#?}\n{why}"
        ),
        Err(TestError::Abort(why)) => panic!("{prim:?} aborted (seed {seed}): {why}"),
    }
}

/// The model's window and probation are the protocol's (and so the scripts', which
/// `lockkit-protocol`'s own tests check).
#[test]
fn the_model_uses_the_protocol_constants() {
    assert_eq!(
        u128::from(HANDOFF_WINDOW_MS),
        lock::HANDOFF_WINDOW.as_millis()
    );
    assert_eq!(u128::from(PROBATION_MS), lock::GRANT_PROBATION.as_millis());
}

#[test]
fn lock_agrees_with_its_model() {
    check(Prim::Lock);
}

#[test]
fn fenced_lock_agrees_with_its_model() {
    check(Prim::Fenced);
}

/// Runs fixed op sequences (no shrinking) on `prim`, each step checked as in [`check`].
fn scenarios(prim: Prim, cases: &[(&str, Vec<Op>)]) {
    let env = Env::start();
    for (what, ops) in cases {
        for sharded in [false, true] {
            let mut sequence = env.rt.block_on(Sequence::new(&env, prim, sharded));
            for (i, op) in ops.iter().enumerate() {
                if let Err(why) = env.rt.block_on(sequence.step(op)) {
                    panic!(
                        "{prim:?}, {what} (sharded: {sharded}): step {i} disagrees: {why}\nsteps run:\n  {}",
                        sequence.log.join("\n  ")
                    );
                }
            }
        }
    }
    eprintln!("{prim:?}: steps: {:?}", env.seen.borrow());
}

/// Handoffs set up on purpose (owners 0 and 2 are client 0's, which listens; owner 1 is client
/// 1's, which does not): the random runs meet them only now and then.
fn handoff_scenarios(prim: Prim) {
    let take = |owner, lease| Op::Acquire {
        owner,
        lease,
        keepalive: None,
        look: false,
    };
    let wait = |owner, look| Op::Acquire {
        owner,
        lease: Lease::Long,
        keepalive: Some(Lease::Long),
        look,
    };
    let mut cases = vec![
        (
            "a release undoes an unheard grant and grants the next request",
            vec![
                take(2, Lease::Long),
                wait(1, false),
                wait(0, false),
                Op::ReleaseHeld { hold: 0 },
                Op::Retry { call: 2 },
            ],
        ),
        (
            "an acquire that finds the lock free hands it over up to its own request, then takes it",
            vec![
                take(2, Lease::Short(15)),
                wait(1, false),
                wait(0, false),
                Op::LapseHolds,
                Op::Retry { call: 2 },
                Op::HoldCount { owner: 0 },
            ],
        ),
        (
            "a wait's refused last try leaves the line: the release grants nobody",
            vec![
                take(2, Lease::Long),
                wait(0, false),
                Op::LastTry { call: 1 },
                Op::ReleaseHeld { hold: 0 },
            ],
        ),
        (
            "a grant not yet claimed is given back by the call's cancel and handed on",
            vec![
                take(2, Lease::Long),
                wait(0, false),
                Op::Listen { client: 1, on: true },
                wait(1, false),
                Op::ReleaseHeld { hold: 0 },
                Op::CancelFirst,
                Op::Retry { call: 2 },
            ],
        ),
    ];
    if prim == Prim::Lock {
        cases.push((
            "a looker is told and reserved for; the others wait; its give-up hands on",
            vec![
                take(2, Lease::Long),
                wait(0, true),
                Op::Listen {
                    client: 1,
                    on: true,
                },
                wait(1, false),
                Op::ReleaseHeld { hold: 0 },
                Op::Retry { call: 2 },
                Op::CancelFirst,
                Op::Retry { call: 2 },
            ],
        ));
    }
    scenarios(prim, &cases);
}

#[test]
fn lock_handoff_scenarios_agree_with_its_model() {
    handoff_scenarios(Prim::Lock);
}

#[test]
fn fenced_lock_handoff_scenarios_agree_with_its_model() {
    handoff_scenarios(Prim::Fenced);
}

/// Ops that keep the lock contended: calls that wait, releases, give-ups and changes of who
/// listens, and little else, so that most releases hand the lock over.
fn contended_op() -> impl Strategy<Value = Op> {
    let wait = prop_oneof![1 => (3u64..40).prop_map(Lease::Short), 6 => Just(Lease::Long)];
    prop_oneof![
        8 => (0usize..3, lease(), prop::option::weighted(0.9, wait), prop::bool::weighted(0.2))
            .prop_map(|(owner, lease, keepalive, look)| Op::Acquire { owner, lease, keepalive, look }),
        4 => any::<usize>().prop_map(|call| Op::Retry { call }),
        2 => any::<usize>().prop_map(|call| Op::LastTry { call }),
        6 => any::<usize>().prop_map(|hold| Op::ReleaseHeld { hold }),
        1 => any::<usize>().prop_map(|hold| Op::Release { hold }),
        2 => any::<usize>().prop_map(|call| Op::Cancel { call }),
        2 => Just(Op::CancelFirst),
        2 => any::<usize>().prop_map(|hold| Op::ReleaseThenCancelFirst { hold }),
        3 => (0usize..2, any::<bool>()).prop_map(|(client, on)| Op::Listen { client, on }),
        1 => (prop::collection::vec(any::<usize>(), 1..3), prop::option::of(lease()), prop::bool::weighted(0.3))
            .prop_map(|(holds, lease, until)| Op::Renew { holds, lease, until }),
        1 => Just(Op::ForceUnlock),
        3 => (1u64..45).prop_map(|ms| Op::Sleep { ms }),
        2 => Just(Op::LapseHolds),
    ]
}

/// The handoff by direct grant under steady contention (issue 20): most releases grant the lock
/// to a waiter, or undo a grant nobody heard and go on. Half the sequences use sharded pub/sub.
#[test]
fn lock_grants_agree_with_its_model() {
    check_with(Prim::Lock, any::<bool>(), contended_op(), false);
}

#[test]
fn fenced_lock_grants_agree_with_its_model() {
    check_with(Prim::Fenced, any::<bool>(), contended_op(), false);
}

#[test]
fn fair_lock_agrees_with_its_model() {
    check(Prim::Fair);
}

#[test]
fn spin_lock_agrees_with_its_model() {
    check(Prim::Spin);
}

// === the multi-lock ===

/// What another client does to the members while a multi-lock waits.
#[derive(Debug, Clone, Copy)]
enum Other {
    Take(usize),
    Release(usize),
}

/// The multi-lock's owners' places in its members' waiting sets (it is waiting for that member
/// while it stands in line there), and the members its owners hold: all read at one instant (one
/// script over every member's keys; a standalone server allows keys of several slots).
///
/// A place in line is a request (`<marker> <lease> <owner> <channel>`) whose owner is one of the
/// multi-lock's; a release that reserves a member for the multi-lock (its requests only look)
/// takes the request out of the line at once. A multi-lock waits for all its members at once
/// (issue 19, §4), so it may keep such a reservation while it still stands in another member's
/// line; what it never does is hold a member there.
async fn multi_state(
    redis: &Fred,
    members: &[ObjectKeys],
    prefix: &str,
) -> (Vec<(usize, String)>, std::collections::BTreeSet<String>) {
    let all: Vec<String> = members.iter().flat_map(|k| k.keys.clone()).collect();
    let (raw, _) = read_state(redis, &all).await;
    let mut raw = raw.into_iter();
    let mut waiting = Vec::new();
    let mut held = std::collections::BTreeSet::new();
    for (i, keys) in members.iter().enumerate() {
        for suffix in std::iter::once(&"main").chain(keys.suffixes) {
            let k = raw.next().expect("every key read");
            let ours = |item: &&String| item.starts_with(prefix);
            match *suffix {
                "main" if k.ty == "hash" && k.items.iter().step_by(2).any(|f| ours(&f)) => {
                    held.insert(keys.key.clone());
                }
                "waiting" => waiting.extend(
                    k.items
                        .iter()
                        .step_by(2)
                        .filter(|member| {
                            Entry::parse(member).is_some_and(|r| r.owner.starts_with(prefix))
                        })
                        .map(|member| (i, member.clone())),
                ),
                _ => {}
            }
        }
    }
    (waiting, held)
}

/// A multi-lock over three locks waits while another client takes and releases them: whenever
/// it is seen waiting for a member, it holds none (issue 11, item 3; `lockkit_model::multi`),
/// and once the others let go it holds them all.
#[test]
fn multi_lock_never_holds_a_subset_while_it_waits() {
    use lockkit_model::multi::MultiLock;
    let env = Env::start();
    let other = env.rt.block_on(lockkit_suite::client(&env.url));
    let hang = Duration::from_secs(30);
    let lease = Some(Duration::from_secs(60));
    let strategy = (
        prop::collection::vec(any::<bool>(), 3),
        prop::collection::vec(
            prop_oneof![
                (0usize..3).prop_map(Other::Take),
                (0usize..3).prop_map(Other::Release)
            ],
            1..8,
        ),
    );
    // Cheap cases (a few ms each): twice the budget.
    let (mut runner, seed) = runner(cases() * 2);
    let result = runner.run(&strategy, |(initial, actions)| {
        env.rt.block_on(async {
            let mut names: Vec<String> = (0..3).map(|_| unique("multi")).collect();
            names.sort();
            let members: Vec<ObjectKeys> = names
                .iter()
                .map(|n| Namespace::default().lock(n).expect("valid keys"))
                .collect();
            let model = MultiLock::new(members.iter().map(|k| k.key.clone()));
            let mut guards = BTreeMap::new();
            for (i, hold) in initial.iter().enumerate() {
                if *hold {
                    let guard = other
                        .lock(names[i].clone())
                        .try_lock(Duration::ZERO, lease)
                        .await;
                    guards.insert(i, guard.expect("no error").expect("a free lock"));
                }
            }
            let multi = env
                .lockkit
                .multi_lock(names.iter().map(|n| env.lockkit.lock(n.clone())));
            let task = tokio::spawn(async move { multi.try_lock(hang, lease).await });
            let prefix = format!("{}:", env.lockkit.id());
            let mut last: Vec<(usize, String)> = Vec::new();
            let mut log = vec![format!("others hold {initial:?}")];
            for action in std::iter::once(None).chain(actions.iter().map(Some)) {
                let mut wakes = action.is_none();
                match action {
                    Some(Other::Take(i)) if !guards.contains_key(i) => {
                        if let Ok(Some(guard)) = other
                            .lock(names[*i].clone())
                            .try_lock(Duration::ZERO, lease)
                            .await
                        {
                            guards.insert(*i, guard);
                        }
                    }
                    Some(Other::Release(i)) => {
                        if let Some(guard) = guards.remove(i) {
                            wakes = last.iter().any(|(m, _)| m == i);
                            guard.unlock().await.expect("held");
                        }
                    }
                    _ => {}
                }
                log.push(format!("{action:?}"));
                // Until the multi-lock has reacted: finished, or waiting again elsewhere.
                let seen = lockkit_suite::within(hang, "the multi-lock to settle", async {
                    loop {
                        let (waiting, held) = multi_state(&env.redis, &members, &prefix).await;
                        if task.is_finished()
                            || (!waiting.is_empty() && (!wakes || waiting != last))
                        {
                            return (waiting, held);
                        }
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                })
                .await;
                let (waiting, held) = seen;
                if task.is_finished() {
                    break;
                }
                log.push(format!("waits for {waiting:?} holding {held:?}"));
                if let Err(violation) = model.observe(&held, !waiting.is_empty()) {
                    for (_, guard) in std::mem::take(&mut guards) {
                        let _ = guard.unlock().await;
                    }
                    let _ = task.await;
                    return Err(TestCaseError::fail(format!(
                        "{violation:?}\n{}",
                        log.join("\n")
                    )));
                }
                last = waiting;
            }
            for (_, guard) in std::mem::take(&mut guards) {
                guard.unlock().await.expect("held");
            }
            let guard = lockkit_suite::within(hang, "the multi-lock", task)
                .await
                .expect("no panic")
                .expect("no error")
                .expect("granted once the others let go");
            let (_, held) = multi_state(&env.redis, &members, &prefix).await;
            prop_assert_eq!(held.len(), 3, "a multi-lock granted with a subset");
            guard.unlock().await.expect("held");
            Ok(())
        })
    });
    if let Err(err) = result {
        panic!("the multi-lock broke its contract (LOCKKIT_MODEL_SEED={seed}): {err}");
    }
    save_cases("multi", cases() * 2);
}

// === issue 27, §4 ===

/// Duplicates: every op of the random programs, and after many a second delivery of the script
/// call the step made (acquire, renew, cancel, hold count: what the client sends with
/// `Resend::Allowed`). The second delivery must answer alike, publish nothing, and change no key
/// beyond moving an expiry on by the time that passed.
///
/// No multi-lock lookers here: a second delivery of one looker's cancel may end the reservation
/// a release made for another looker of the same owner, which
/// `lock_cancel_delivered_twice_keeps_the_next_lookers_reservation` shows on its own.
#[test]
fn lock_family_duplicate_deliveries_change_nothing() {
    for prim in [Prim::Lock, Prim::Fenced, Prim::Fair, Prim::Spin] {
        let takers = op().prop_map(|op| match op {
            Op::Acquire {
                owner,
                lease,
                keepalive,
                look: _,
            } => Op::Acquire {
                owner,
                lease,
                keepalive,
                look: false,
            },
            op => op,
        });
        let ops = prop_oneof![6 => takers, 3 => Just(Op::Duplicate)];
        let sharded = if prim.grants() {
            any::<bool>().boxed()
        } else {
            Just(false).boxed()
        };
        check_budget(prim, sharded, Just(None), ops, false, cases_scaled(10));
    }
}

/// Time and rollbacks for fencing tokens: the scripts are given a token counter TTL of a few ms
/// (as `token_counter_ttl` gives it to them), the counter expires between acquisitions, and the
/// keys go back to older snapshots: every token handed out (reply or grant) exceeds every one
/// before it.
#[test]
fn fenced_lock_tokens_never_go_back_past_the_counter_ttl_or_a_restore() {
    let ops = prop_oneof![
        10 => contended_op(),
        3 => (1u64..45).prop_map(|ms| Op::Sleep { ms }),
        2 => Just(Op::Snapshot),
        2 => Just(Op::Restore),
        1 => Just(Op::Duplicate),
    ];
    check_budget(
        Prim::Fenced,
        any::<bool>(),
        (3u64..30).prop_map(Some),
        ops,
        false,
        cases_scaled(20),
    );
}

/// Found by the duplicates above (not among issue 27's items): `lock_cancel` ends a reservation
/// made for the cancelled request's *owner*, not for the request. Two lookers of one owner wait
/// (two multi-lock calls of one task over the same lock); a release reserves the lock for the
/// first; the first gives up, and its cancel hands the reservation on to the second (`p:` to
/// it); the same cancel delivered again (fred re-sends it: `Resend::Allowed`; or any cancel of
/// another request of that owner) then deletes the second's reservation, unannounced, inside its
/// 10 ms window. Run in one `MULTI` (no time passes), so it does not depend on the window.
/// Ignored: it fails on main, and is not part of issue 27.
#[test]
#[ignore = "not among issue 27's items: lock_cancel ends another request's reservation of the same owner (see the report)"]
fn lock_cancel_delivered_twice_keeps_the_next_lookers_reservation() {
    let env = Env::start();
    env.rt.block_on(async {
        use fred::interfaces::PubsubInterface;
        let keys = Namespace::default()
            .object(Kind::Lock, &unique("reservation"))
            .expect("valid keys");
        let lock_keys: Vec<String> = keys.keys.clone();
        let channel = |client: &str| format!("{}:{client}", keys.channel);
        // The lookers' client listens (a reservation nobody hears is not made).
        let listener = lockkit_suite::raw(&env.url).await;
        listener
            .subscribe(channel(CLIENTS[0]))
            .await
            .expect("SUBSCRIBE");
        let holder = format!("{}:1", CLIENTS[1]);
        let looker = format!("{}:7", CLIENTS[0]);
        let look = |seq| Request {
            owner: looker.clone(),
            marker: hold_marker(CLIENTS[0], seq),
            lease_ms: LONG_MS,
            keepalive_ms: LONG_MS,
            waiter: String::new(),
            channel: channel(CLIENTS[0]),
            look: true,
        };
        let (first, second) = (look(2), look(3));
        let acquire = |r: &Request| {
            vec![
                r.owner.clone(),
                r.marker.clone(),
                r.lease_ms.to_string(),
                r.keepalive_ms.to_string(),
                r.channel.clone(),
                "0".to_owned(),
                "1".to_owned(),
            ]
        };
        let take = vec![
            holder.clone(),
            hold_marker(CLIENTS[1], 1),
            LONG_MS.to_string(),
            "0".to_owned(),
            channel(CLIENTS[1]),
            "0".to_owned(),
        ];
        let release = vec![hold_marker(CLIENTS[1], 1), keys.channel.clone(), "0".to_owned()];
        let cancel = vec![first.entry(), keys.channel.clone(), "0".to_owned()];
        let (a1, a2) = (acquire(&first), acquire(&second));
        let get = vec!["GET".to_owned(), keys.keys[1].clone()];
        fn strs(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        let (take, a1, a2, release, cancel, get_handoff) =
            (strs(&take), strs(&a1), strs(&a2), strs(&release), strs(&cancel), strs(&get));
        let commands: Vec<Vec<&str>> = vec![
            vec!["MULTI"],
            lockkit_suite::eval(lock::ACQUIRE.source(), &lock_keys, &take),
            lockkit_suite::eval(lock::ACQUIRE.source(), &lock_keys, &a1),
            lockkit_suite::eval(lock::ACQUIRE.source(), &lock_keys, &a2),
            lockkit_suite::eval(lock::RELEASE.source(), &lock_keys, &release),
            get_handoff.clone(),
            lockkit_suite::eval(lock::CANCEL.source(), &lock_keys, &cancel),
            get_handoff.clone(),
            lockkit_suite::eval(lock::CANCEL.source(), &lock_keys, &cancel),
            get_handoff,
            vec!["EXEC"],
        ];
        let replies = lockkit_testkit::send_commands(env.server.addr(), &commands)
            .await
            .expect("the exchange");
        let out = replies
            .last()
            .and_then(RespValue::as_array)
            .expect("EXEC's replies")
            .to_vec();
        let handoff = |i: usize| out[i].as_str().map(str::to_owned);
        assert_eq!(handoff(4), Some(looker.clone()), "the release reserves for the first looker: {out:?}");
        assert_eq!(handoff(6), Some(looker.clone()), "its cancel hands the reservation on to the second: {out:?}");
        assert_eq!(
            handoff(8),
            Some(looker),
            "a second delivery of the first looker's cancel ended the reservation handed on to the second looker of the same owner: {out:?}"
        );
    });
}
