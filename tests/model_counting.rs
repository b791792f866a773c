//! Model-based tests (issue 12 §2) of the read-write lock, both semaphores and the latch:
//! generated operation sequences run against the **real scripts** on a real `redis-server` and
//! against the reference models of `lockkit-model`; every reply and the decoded keys must agree
//! after every step.
//!
//! Each step is one `MULTI`: `TIME`, the script (`EVALSHA`, reloaded after `NOSCRIPT` as fred's
//! `evalsha_with_reload` does), `TIME`, and the reads of the object's keys. The script's clock
//! lies between the two `TIME`s, and the model steps at each instant in between until one
//! explains the reply and the keys (usually both `TIME`s are the same millisecond).
//!
//! Sequences mix several owners (ids and hold markers as the runtime makes them), re-sent
//! requests (the same marker again), short leases with sleeps (the lease lapses on the server),
//! batched renewals, force-unlock, `SCRIPT FLUSH`, a restore of an older state of the object's
//! keys (`DUMP`/`RESTORE … REPLACE ABSTTL`), a value of another type at the main key, evicted
//! semaphore keys (the documented repair), and bad inputs sent through the public API (rejected
//! before anything is sent: the keys must not change).
//!
//! A failure prints the seed and the shrunk sequence. `LOCKKIT_MODEL_CASES` sets the number of
//! cases per primitive (default: a CI budget), `LOCKKIT_MODEL_SEED` replays a seed.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::script::Script;
use lockkit::protocol::{latch as platch, read_write_lock as prw, semaphore as psem};
use lockkit_model::latch::{Latch, LatchOp, LatchRet, REQUEST_WINDOW_MS};
use lockkit_model::rwlock::{member as rw_member, Mode, RwLock, RwOp, RwRet, MAX_LEASE_MS};
use lockkit_model::semaphore::{Key, SemOp, SemRet, Semaphore, MAX_PERMITS};
use lockkit_suite::checker::save_model_cases as save_cases;
use lockkit_suite::model_io::cases_scaled;
use lockkit_suite::{eval, ints, raw, server_ms, spawned, unique, RedisServer};
use lockkit_testkit::RespValue;
use proptest::prelude::*;
use proptest::strategy::Union;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
use proptest_state_machine::ReferenceStateMachine;

/// Steps per generated sequence, at most.
const MAX_STEPS: usize = 28;
/// A long lease: never lapses within a test.
const LONG: u64 = 60_000;

// === the harness ===

/// One redis-server per test fn, a raw fred client (DUMP/RESTORE), a lockkit client (bad
/// inputs through the public API), and a runtime to drive them from proptest's closures.
struct Harness {
    rt: tokio::runtime::Runtime,
    server: RedisServer,
    raw: fred::clients::Client,
    client: lockkit::Client,
}

impl Harness {
    fn start() -> Self {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let (server, raw, client) = rt.block_on(async {
            let server = spawned().await;
            let raw = raw(&server.url()).await;
            let client = lockkit_suite::client(&server.url()).await;
            (server, raw, client)
        });
        Self {
            rt,
            server,
            raw,
            client,
        }
    }

    /// Runs `body` on generated sequences of `M`, and fails with the seed and the shrunk
    /// sequence.
    fn run<M: ReferenceStateMachine>(
        &self,
        what: &str,
        primitive: &str,
        default_cases: u32,
        body: impl Fn(&Self, &[M::Transition], &dyn Fn()) -> Result<(), String>,
    ) {
        let cases = std::env::var("LOCKKIT_MODEL_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default_cases);
        let seed = lockkit_suite::checker::model_seed();
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = Config {
            cases,
            max_shrink_iters: 2_000,
            failure_persistence: None,
            ..Config::default()
        };
        let mut runner =
            TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
        let strategy = M::sequential_strategy(1..=MAX_STEPS);
        let result = runner.run(&strategy, |(_, transitions, seen)| {
            // Tells the shrinker how many steps ran before a failure.
            let step = || {
                if let Some(seen) = &seen {
                    seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            };
            body(self, &transitions, &step).map_err(TestCaseError::fail)
        });
        if let Err(err) = result {
            panic!("{what}: model and scripts disagree (LOCKKIT_MODEL_SEED={seed}):\n{err}");
        }
        println!("{what}: {cases} cases passed (LOCKKIT_MODEL_SEED={seed})");
        // The duplicates' runs (no primitive given) are not the model cases the report counts.
        if !primitive.is_empty() {
            save_cases(primitive, cases);
        }
    }
}

/// What one step saw: the server clock before and after the script, its reply, and the reads.
struct Exchange {
    t0: u64,
    t1: u64,
    reply: Option<RespValue>,
    reads: Vec<RespValue>,
}

/// One `MULTI`: `TIME`, `script` (if any) by `EVALSHA`, `TIME`, then `reads`.
async fn exchange(
    h: &Harness,
    script: Option<&Script>,
    keys: &[String],
    args: &[String],
    reads: &[Vec<String>],
) -> Exchange {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    loop {
        let mut commands: Vec<Vec<&str>> = vec![vec!["MULTI"], vec!["TIME"]];
        if let Some(script) = script {
            let mut call = eval(script.sha1(), keys, &args);
            call[0] = "EVALSHA";
            commands.push(call);
        }
        commands.push(vec!["TIME"]);
        commands.extend(reads.iter().map(|r| r.iter().map(String::as_str).collect()));
        commands.push(vec!["EXEC"]);
        let replies = lockkit_testkit::send_commands(h.server.addr(), &commands)
            .await
            .expect("an exchange");
        let Some(out) = replies.last().and_then(RespValue::as_array) else {
            panic!("EXEC failed: {replies:?}");
        };
        let mut out = out.iter().cloned();
        let mut next = || out.next().expect("one reply per command");
        let t0 = server_ms(&next());
        let reply = script.map(|_| next());
        let t1 = server_ms(&next());
        if let (Some(script), Some(RespValue::Error(e))) = (script, &reply) {
            if e.starts_with("NOSCRIPT") {
                // What fred's evalsha_with_reload does after a SCRIPT FLUSH or a restart.
                let loaded = h
                    .server
                    .command(&["SCRIPT", "LOAD", script.source()])
                    .await
                    .expect("SCRIPT LOAD");
                assert_eq!(loaded.as_str(), Some(script.sha1()));
                continue;
            }
        }
        return Exchange {
            t0,
            t1,
            reply,
            reads: out.collect(),
        };
    }
}

/// The object's keys as read back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Keys {
    main: Main,
    /// The auxiliary ZSET (leases, expiries, requests): member → score.
    aux: BTreeMap<String, u64>,
    /// `PEXPIRETIME` of both keys (-2: absent, -1: no expiry).
    expire: (i64, i64),
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Main {
    Absent,
    Hash(BTreeMap<String, String>),
    Str(String),
}

fn reads(keys: &ObjectKeys) -> Vec<Vec<String>> {
    let (k, aux) = (keys.keys[0].clone(), keys.keys[1].clone());
    let cmd = |parts: &[&str]| parts.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    vec![
        cmd(&["TYPE", &k]),
        cmd(&["HGETALL", &k]),
        cmd(&["GET", &k]),
        cmd(&["ZRANGE", &aux, "0", "-1", "WITHSCORES"]),
        cmd(&["PEXPIRETIME", &k]),
        cmd(&["PEXPIRETIME", &aux]),
    ]
}

fn strings(v: &RespValue) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v:?}"))
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

fn decode_keys(reads: &[RespValue]) -> Keys {
    let main = match reads[0].as_str() {
        Some("none") => Main::Absent,
        Some("hash") => {
            let flat = strings(&reads[1]);
            Main::Hash(
                flat.chunks(2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect(),
            )
        }
        Some("string") => Main::Str(reads[2].as_str().expect("a string").to_owned()),
        other => panic!("unexpected type {other:?}"),
    };
    let flat = strings(&reads[3]);
    let aux = flat
        .chunks(2)
        .map(|kv| (kv[0].clone(), kv[1].parse().expect("an integer score")))
        .collect();
    let int = |v: &RespValue| v.as_int().expect("PEXPIRETIME");
    Keys {
        main,
        aux,
        expire: (int(&reads[4]), int(&reads[5])),
    }
}

/// The model stepped at each instant the script may have run at, until one explains the reply
/// and the keys; the model then moves on from there.
fn check<M: Clone + Debug, R: Debug>(
    ex: &Exchange,
    observed: &R,
    model: &mut M,
    apply: impl Fn(&mut M, u64) -> R,
    same: impl Fn(&R, &R, u64) -> bool,
    expected_keys: impl Fn(&M, u64) -> Keys,
    observed_keys: impl Fn(u64) -> Keys,
) -> Result<(), String> {
    let slack = ex.t1 - ex.t0;
    let mut seen = Vec::new();
    for t in ex.t0..=ex.t1 {
        let mut m = model.clone();
        let expected = apply(&mut m, t);
        let (want, got) = (expected_keys(&m, t), observed_keys(t));
        // Redis deletes an expired key only once its clock is *past* the expiry (`now > when`),
        // and the clock it expires keys on can trail the script's `TIME` by 1-2 ms (the two
        // clocks of tests/model_locks.rs): a key may still be there up to 2 ms after the
        // model's instant. Never the other way round: a key gone early still disagrees.
        let keys_agree = want == got
            || (t.saturating_sub(2)..t).any(|keys_ms| expected_keys(&m, keys_ms) == got);
        if same(&expected, observed, slack) && keys_agree {
            *model = m;
            return Ok(());
        }
        seen.push(format!(
            "at {t}: model replied {expected:?}, scripts {observed:?}\n  model keys   {want:?}\n  scripts keys {got:?}\n  model {m:?}"
        ));
    }
    Err(seen.join("\n"))
}

/// Steps every primitive shares.
#[derive(Debug, Clone, PartialEq)]
enum Common {
    /// Let time pass on the server (short leases lapse).
    Sleep(u64),
    ScriptFlush,
    /// Remember the object's keys (and the model).
    Snapshot,
    /// Put the remembered keys back (`RESTORE … REPLACE ABSTTL`): a restart from an older
    /// snapshot, a failover to a lagging replica.
    Restore,
    /// A value of another type at the main key (the aux key gone).
    Foreign,
    /// Both keys deleted.
    Clear,
    /// The previous script call delivered again, exactly, right after it (fred re-sends the
    /// scripts the client sends with `Resend::Allowed`): it must answer alike and change no key
    /// beyond moving an expiry on (issue 27, §4). Handled by each sequence ([`Last`]).
    Duplicate,
}

fn common(snapshot_taken: bool, sleeps: bool, duplicates: bool) -> BoxedStrategy<Common> {
    let mut options: Vec<(u32, BoxedStrategy<Common>)> = vec![
        (1, Just(Common::ScriptFlush).boxed()),
        (1, Just(Common::Snapshot).boxed()),
        (1, Just(Common::Foreign).boxed()),
        (1, Just(Common::Clear).boxed()),
    ];
    if sleeps {
        options.push((2, (20u64..=130).prop_map(Common::Sleep).boxed()));
    }
    if snapshot_taken {
        options.push((1, Just(Common::Restore).boxed()));
    }
    if duplicates {
        options.push((6, Just(Common::Duplicate).boxed()));
    }
    Union::new_weighted(options).boxed()
}

/// The scripts the client sends with `Resend::Allowed` (among those the sequences run as one
/// call on the object's keys): a duplicate may deliver them twice.
const RESENT: [&str; 9] = [
    "rwlock_acquire",
    "rwlock_status",
    "rwlock_cancel",
    "semaphore_acquire",
    "semaphore_available",
    "semaphore_update_lease",
    "semaphore_cancel",
    "latch_try_set_count",
    "latch_count_down",
];

/// The last script call of a sequence, as sent, and what it saw (for `Common::Duplicate`).
struct Last<O> {
    script: &'static Script,
    args: Vec<String>,
    op: O,
    ex: Exchange,
    /// The call granted the line something a subscriber heard (a read-write lock's grant to
    /// another call of the caller's owner may make the second delivery a re-entry).
    granted: bool,
}

impl<O> Last<O> {
    /// The call, when the client may send it twice.
    fn of(script: Option<&'static Script>, args: &[String], op: O, ex: Exchange) -> Option<Self> {
        let script = script.filter(|s| RESENT.contains(&s.name()))?;
        Some(Self {
            script,
            args: args.to_vec(),
            op,
            ex,
            granted: false,
        })
    }
}

/// A second delivery (`again`) of the call that saw `first`: it must answer alike (the same
/// reply, or a refusal again, its figures moved on) and change no key beyond moving a lease or a
/// key's expiry on by the time that passed. `Ok(false)`: not compared, something lapsed between
/// the two (the second may then rightly differ).
fn second_delivery(script: &Script, first: &Exchange, again: &Exchange) -> Result<bool, String> {
    let what = format!("a second delivery of {}", script.name());
    let (before, after) = (decode_keys(&first.reads), decode_keys(&again.reads));
    let lapsed = |ms: i64| ms > 0 && u64::try_from(ms).is_ok_and(|ms| ms <= again.t1 + 2);
    let times = before
        .aux
        .values()
        .map(|s| i64::try_from(*s).unwrap_or(i64::MAX))
        .chain([before.expire.0, before.expire.1]);
    if times.into_iter().any(lapsed) {
        return Ok(false);
    }
    let slack = again.t1.saturating_sub(first.t0) + 2;
    let figures = |reply: &Option<RespValue>| -> Option<Vec<i64>> {
        reply
            .as_ref()?
            .as_array()?
            .iter()
            .map(RespValue::as_int)
            .collect()
    };
    let (a, b) = (figures(&first.reply), figures(&again.reply));
    let refused = |r: &Option<Vec<i64>>| r.as_ref().and_then(|r| r.first()) == Some(&0);
    // A refusal's wait (what is left of a holder's lease) that ran out meanwhile: the second
    // delivery may rightly take.
    if refused(&a)
        && a.as_ref()
            .and_then(|a| a.get(1))
            .is_some_and(|wait| (0..=i64::try_from(slack).unwrap_or(i64::MAX)).contains(wait))
    {
        return Ok(false);
    }
    // The same figures, but for a time (the status' TTL, its last figure) moved on by the time
    // that passed.
    let timed = (script.name() == "rwlock_status")
        .then(|| a.as_ref().map_or(0, Vec::len).checked_sub(1))
        .flatten();
    // A cancel's second delivery finds nothing left to remove ({1} then {0}); the client only
    // logs it (queued.rs).
    let cancel = ["semaphore_cancel", "rwlock_cancel"].contains(&script.name())
        && a.as_deref() == Some(&[1][..])
        && b.as_deref() == Some(&[0][..]);
    let alike = cancel
        || match (&a, &b) {
            (Some(a), Some(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .zip(b)
                        .enumerate()
                        .all(|(i, (x, y))| x == y || (Some(i) == timed && x.abs_diff(*y) <= slack))
            }
            _ => first.reply == again.reply,
        };
    if !(alike || (refused(&a) && refused(&b))) {
        return Err(format!(
            "{what} answered {:?} where the first answered {:?}",
            again.reply, first.reply
        ));
    }
    let slack = i64::try_from(slack).unwrap_or(i64::MAX);
    let moved = |a: i64, b: i64| a == b || (a > 0 && b >= a && b - a <= slack);
    let same_aux = before.aux.len() == after.aux.len()
        && before.aux.iter().all(|(member, score)| {
            after.aux.get(member).is_some_and(|later| {
                moved(
                    i64::try_from(*score).unwrap_or(i64::MAX),
                    i64::try_from(*later).unwrap_or(i64::MAX),
                )
            })
        });
    if before.main != after.main
        || !same_aux
        || !moved(before.expire.0, after.expire.0)
        || !moved(before.expire.1, after.expire.1)
    {
        return Err(format!(
            "{what} changed the keys: {before:?} became {after:?}"
        ));
    }
    Ok(true)
}

type Dump = Vec<(String, Option<fred::types::Value>, i64)>;

/// Runs a shared step against Redis and the model.
async fn common_step<M: Clone>(
    h: &Harness,
    keys: &ObjectKeys,
    step: &Common,
    foreign: &str,
    model: &mut M,
    saved: &mut Option<(Dump, M)>,
    // The model's own step for a foreign value (`true`) or deleted keys (`false`).
    touch: impl FnOnce(&mut M, bool),
) {
    match step {
        Common::Sleep(ms) => tokio::time::sleep(Duration::from_millis(*ms)).await,
        Common::ScriptFlush => {
            h.server.command(&["SCRIPT", "FLUSH"]).await.expect("flush");
        }
        Common::Snapshot => {
            let mut dump = Vec::new();
            for key in &keys.keys {
                let value: fred::types::Value = h.raw.dump(key.as_str()).await.expect("DUMP");
                let at = h
                    .server
                    .command(&["PEXPIRETIME", key])
                    .await
                    .expect("PEXPIRETIME")
                    .as_int()
                    .expect("an integer");
                dump.push((key.clone(), (!value.is_null()).then_some(value), at));
            }
            *saved = Some((dump, model.clone()));
        }
        Common::Restore => {
            let Some((dump, old)) = saved.clone() else {
                return;
            };
            for (key, value, at) in dump {
                let _: () = h.raw.del(key.as_str()).await.expect("DEL");
                if let Some(value) = value {
                    let ttl = at.max(0);
                    let _: fred::types::Value = h
                        .raw
                        .restore(key.as_str(), ttl, value, true, ttl > 0, None, None)
                        .await
                        .expect("RESTORE");
                }
            }
            *model = old;
        }
        Common::Foreign => {
            h.server
                .command(&["DEL", &keys.keys[0], &keys.keys[1]])
                .await
                .expect("DEL");
            let value = if foreign == "hash" {
                h.server.command(&["HSET", &keys.keys[0], "x", "1"]).await
            } else {
                h.server.command(&["SET", &keys.keys[0], "foreign"]).await
            };
            assert!(!value.expect("a foreign value").is_error());
            touch(model, true);
        }
        Common::Clear => {
            h.server
                .command(&["DEL", &keys.keys[0], &keys.keys[1]])
                .await
                .expect("DEL");
            touch(model, false);
        }
        // Each sequence delivers its last call again itself.
        Common::Duplicate => {}
    }
}

fn undecodable<T>(op: &dyn Debug, err: impl Debug) -> T {
    panic!("undecodable reply to {op:?}: {err:?}")
}

fn wrong_type(reply: &RespValue) -> bool {
    reply.as_error().is_some_and(|e| e.contains("WRONGTYPE"))
}

fn to_args(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

fn object(kind: Kind, name: &str) -> ObjectKeys {
    Namespace::default().object(kind, name).expect("keys")
}

fn lease() -> impl Strategy<Value = u64> {
    prop_oneof![2 => Just(LONG), 1 => 40u64..=120]
}

/// A caller's configured semaphore total (issue 19, §6): mostly none, so `NotSet` stays common.
fn configured() -> impl Strategy<Value = Option<u64>> {
    prop_oneof![2 => Just(None), 1 => (0u64..=4).prop_map(Some)]
}

/// A configured total as the scripts' argument (`''`: none).
fn configured_arg(configured: Option<u64>) -> String {
    configured.map_or_else(String::new, |total| total.to_string())
}

// === read-write lock ===

const CLIENTS: [&str; 3] = ["A", "A", "B"];
const OWNERS: [&str; 3] = ["A:1", "A:2", "B:1"];

#[derive(Debug, Clone, PartialEq)]
enum RwStep {
    Acquire {
        owner: usize,
        hold: String,
        mode: Mode,
        lease_ms: u64,
    },
    /// An acquire by a call that waits if refused (it joins the line), through its owner's
    /// client: `A` (whose channel has a subscriber: a grant there is heard) or `B` (nobody
    /// listens: a grant there is undone at once).
    Wait {
        owner: usize,
        hold: String,
        mode: Mode,
        lease_ms: u64,
        keepalive_ms: u64,
    },
    /// The last try of the waiting call with this marker (keep-alive 0: it leaves the line).
    LastTry(String),
    /// The waiting call with this marker gives up (`rwlock_cancel`).
    Cancel(String),
    Release(String),
    Renew(Vec<(String, u64)>),
    ForceUnlock,
    Status(Vec<usize>),
    /// Through the public API: a lease of zero or beyond `MAX_LEASE`.
    BadLease(Mode, u64),
    Common(Common),
}

/// What the generator has issued so far: the past requests (for re-sending) and their markers.
#[derive(Debug, Clone)]
struct Issued<T> {
    seq: u64,
    requests: Vec<T>,
    markers: Vec<String>,
    snapshot: bool,
    foreign: bool,
}

impl<T: Clone + Debug + 'static> Issued<T> {
    fn start() -> BoxedStrategy<Self> {
        Just(Self {
            seq: 0,
            requests: Vec::new(),
            markers: Vec::new(),
            snapshot: false,
            foreign: false,
        })
        .boxed()
    }

    /// A past marker, or one never issued.
    fn marker(&self) -> BoxedStrategy<String> {
        let mut markers = self.markers.clone();
        markers.push("#Z:404".to_owned());
        prop::sample::select(markers).boxed()
    }

    /// Re-sends a past request exactly (the reconnect case), if there is one.
    fn resend(&self, weight: u32, options: &mut Vec<(u32, BoxedStrategy<T>)>) {
        if !self.requests.is_empty() {
            options.push((weight, prop::sample::select(self.requests.clone()).boxed()));
        }
    }

    fn note(&mut self, marker: &str, request: &T) {
        if !self.markers.iter().any(|m| m == marker) {
            self.seq += 1;
            self.markers.push(marker.to_owned());
            self.requests.push(request.clone());
        }
    }

    fn common(&mut self, step: &Common) {
        match step {
            Common::Snapshot => self.snapshot = true,
            Common::Foreign => self.foreign = true,
            Common::Clear => self.foreign = false,
            _ => {}
        }
    }
}

/// `DUPS`: with `Common::Duplicate` steps.
struct RwMachine<const DUPS: bool>;

impl<const DUPS: bool> ReferenceStateMachine for RwMachine<DUPS> {
    type State = Issued<Self::Transition>;
    type Transition = RwStep;

    fn init_state() -> BoxedStrategy<Self::State> {
        Issued::start()
    }

    fn transitions(state: &Self::State) -> BoxedStrategy<RwStep> {
        let seq = state.seq;
        let mode = prop_oneof![Just(Mode::Read), Just(Mode::Write)];
        let acquire = (0..OWNERS.len(), mode.clone(), lease()).prop_map(move |(o, mode, l)| {
            RwStep::Acquire {
                owner: o,
                hold: format!("#{}:{}", CLIENTS[o], 100 + seq),
                mode,
                lease_ms: l,
            }
        });
        let wait = (
            0..OWNERS.len(),
            mode.clone(),
            lease(),
            prop_oneof![Just(LONG), 40u64..=150],
        )
            .prop_map(move |(o, mode, lease_ms, keepalive_ms)| RwStep::Wait {
                owner: o,
                hold: format!("#{}:{}", CLIENTS[o], 100 + seq),
                mode,
                lease_ms,
                keepalive_ms,
            });
        let mut options: Vec<(u32, BoxedStrategy<RwStep>)> = vec![
            (4, acquire.boxed()),
            (5, wait.boxed()),
            (2, state.marker().prop_map(RwStep::Cancel).boxed()),
            (1, state.marker().prop_map(RwStep::LastTry).boxed()),
            (4, state.marker().prop_map(RwStep::Release).boxed()),
            (
                2,
                prop::collection::vec(
                    (
                        state.marker(),
                        prop_oneof![Just(0u64), Just(LONG), 40u64..=120],
                    ),
                    1..=3,
                )
                .prop_map(RwStep::Renew)
                .boxed(),
            ),
            (1, Just(RwStep::ForceUnlock).boxed()),
            (
                1,
                prop::sample::subsequence(vec![0, 1, 2], 0..=3)
                    .prop_map(RwStep::Status)
                    .boxed(),
            ),
            (
                1,
                (mode, prop_oneof![Just(0u64), Just(MAX_LEASE_MS + 1)])
                    .prop_map(|(m, l)| RwStep::BadLease(m, l))
                    .boxed(),
            ),
            (
                2,
                common(state.snapshot, true, DUPS)
                    .prop_map(RwStep::Common)
                    .boxed(),
            ),
        ];
        state.resend(2, &mut options);
        Union::new_weighted(options).boxed()
    }

    fn apply(mut state: Self::State, step: &RwStep) -> Self::State {
        match step {
            RwStep::Acquire { hold, .. } | RwStep::Wait { hold, .. } => state.note(hold, step),
            RwStep::Common(c) => state.common(c),
            _ => {}
        }
        state
    }

    fn preconditions(state: &Self::State, step: &RwStep) -> bool {
        !matches!(step, RwStep::Common(Common::Restore)) || state.snapshot
    }
}

fn rw_decode(reply: &RespValue, op: &RwOp) -> RwRet {
    if wrong_type(reply) {
        return RwRet::WrongType;
    }
    let v = ints(reply);
    match op {
        RwOp::Cancel { .. } => {
            RwRet::Cancelled(prw::decode_cancel(&v).unwrap_or_else(|e| undecodable(op, e)))
        }
        RwOp::Acquire { .. } | RwOp::Wait { .. } => {
            match prw::AcquireReply::decode(&v).unwrap_or_else(|e| undecodable(op, e)) {
                prw::AcquireReply::Acquired { hold_count } => RwRet::Acquired {
                    hold_count: Some(hold_count),
                },
                prw::AcquireReply::Busy { wait_ms, .. } => RwRet::Busy { wait_ms },
                prw::AcquireReply::UpgradeRefused { read_holds } => RwRet::Refused { read_holds },
            }
        }
        RwOp::Release { .. } => {
            match lockkit::protocol::lock::ReleaseReply::decode(&v)
                .unwrap_or_else(|e| undecodable(op, e))
            {
                lockkit::protocol::lock::ReleaseReply::Freed => RwRet::Released { still_held: 0 },
                lockkit::protocol::lock::ReleaseReply::StillHeld { hold_count } => {
                    RwRet::Released {
                        still_held: hold_count,
                    }
                }
                lockkit::protocol::lock::ReleaseReply::NotHeld => RwRet::NotHeld,
            }
        }
        RwOp::Renew { holds } => RwRet::Renewed(
            lockkit::protocol::lock::decode_renew(&v, holds.len())
                .unwrap_or_else(|e| undecodable(op, e)),
        ),
        RwOp::ForceUnlock => RwRet::ForceUnlocked(
            prw::decode_force_unlock(&v).unwrap_or_else(|e| undecodable(op, e)),
        ),
        RwOp::Status { .. } => {
            let s = prw::Status::decode(&v).unwrap_or_else(|e| undecodable(op, e));
            RwRet::Status {
                mode: s.mode.map(|m| match m {
                    prw::Mode::Read => Mode::Read,
                    prw::Mode::Write => Mode::Write,
                }),
                read_holds: s.read_holds,
                write_holds: s.write_holds,
            }
        }
        RwOp::Foreign | RwOp::Clear => RwRet::Done,
    }
}

fn rw_same(expected: &RwRet, observed: &RwRet, slack: u64) -> bool {
    match (expected, observed) {
        (RwRet::Busy { wait_ms: Some(e) }, RwRet::Busy { wait_ms: Some(o) }) => {
            e.abs_diff(*o) <= slack
        }
        _ => expected == observed,
    }
}

/// The keys the model's state stands for (`docs/design.md`, the lock family's table).
fn rw_keys(m: &RwLock, now: u64) -> Keys {
    if m.is_foreign() {
        return Keys {
            main: Main::Str("foreign".into()),
            aux: BTreeMap::new(),
            expire: (-1, -2),
        };
    }
    // Both keys expire with the latest hold (a script purges the others first).
    let latest = m.holds().values().map(|h| h.expiry).max().unwrap_or(0);
    let (Some(mode), true) = (m.mode(), latest > now) else {
        return Keys {
            main: Main::Absent,
            aux: BTreeMap::new(),
            expire: (-2, -2),
        };
    };
    let mut hash = BTreeMap::new();
    let mut aux = BTreeMap::new();
    let mode = if mode == Mode::Write { "write" } else { "read" };
    hash.insert("mode".to_owned(), mode.to_owned());
    for (marker, hold) in m.holds() {
        let field = match hold.mode {
            Mode::Read => format!("r:{}", hold.owner),
            Mode::Write => format!("w:{}", hold.owner),
        };
        *hash.entry(field.clone()).or_insert_with(|| "0".into()) =
            m.count(&hold.owner, hold.mode).to_string();
        hash.insert(marker.clone(), field);
        aux.insert(marker.clone(), hold.expiry);
    }
    Keys {
        main: Main::Hash(hash),
        aux,
        expire: (latest as i64, latest as i64),
    }
}

fn rw_sequence(h: &Harness, steps: &[RwStep], seen: &dyn Fn()) -> Result<(), String> {
    let name = unique("model-rw");
    let keys = object(Kind::ReadWriteLock, &name);
    let lock = h.client.read_write_lock(name.clone());
    let reads = reads(&keys);
    let mut model = RwLock::new();
    // A subscriber on the lock's channel and on client A's own channel (B's has none): what it
    // receives is compared with the messages of the model.
    let channel = |o: usize| keys.client_channel(CLIENTS[o]);
    let listener = Messages::start(h, &[&keys.channel, &channel(0)]);
    model.listen(&channel(0));
    // The waiting calls issued, by marker: their last try and their cancel.
    let mut waits: BTreeMap<String, RwOp> = BTreeMap::new();
    let mut saved = None;
    let mut last: Option<Last<RwOp>> = None;
    let acquire_args = |op: &RwOp| match op {
        RwOp::Acquire {
            owner,
            hold,
            mode,
            lease_ms,
        } => to_args(&[owner, hold, &lease_ms.to_string(), mode.arg(), "", "0", "0"]),
        RwOp::Wait {
            owner,
            hold,
            mode,
            lease_ms,
            channel,
            keepalive_ms,
        } => to_args(&[
            owner,
            hold,
            &lease_ms.to_string(),
            mode.arg(),
            channel,
            "0",
            &keepalive_ms.to_string(),
        ]),
        _ => unreachable!("an acquire"),
    };
    for (i, step) in steps.iter().enumerate() {
        seen();
        let fail = |e: String| format!("step {i} {step:?}:\n{e}");
        let previous = last.take();
        let mut again = None;
        let (script, args, op) = match step {
            RwStep::Common(Common::Duplicate) => {
                let Some(first) = previous else {
                    continue;
                };
                let call = (first.script, first.args.clone(), first.op.clone());
                again = Some(first);
                call
            }
            RwStep::Acquire {
                owner,
                hold,
                mode,
                lease_ms,
            } => {
                let op = RwOp::Acquire {
                    owner: OWNERS[*owner].into(),
                    hold: hold.clone(),
                    mode: *mode,
                    lease_ms: *lease_ms,
                };
                (&prw::ACQUIRE, acquire_args(&op), op)
            }
            RwStep::Wait {
                owner,
                hold,
                mode,
                lease_ms,
                keepalive_ms,
            } => {
                let op = RwOp::Wait {
                    owner: OWNERS[*owner].into(),
                    hold: hold.clone(),
                    mode: *mode,
                    lease_ms: *lease_ms,
                    channel: channel(*owner),
                    keepalive_ms: *keepalive_ms,
                };
                waits.insert(hold.clone(), op.clone());
                (&prw::ACQUIRE, acquire_args(&op), op)
            }
            RwStep::LastTry(hold) => {
                let Some(RwOp::Wait {
                    owner,
                    hold,
                    mode,
                    lease_ms,
                    channel,
                    ..
                }) = waits.get(hold).cloned()
                else {
                    continue;
                };
                let op = RwOp::Wait {
                    owner,
                    hold,
                    mode,
                    lease_ms,
                    channel,
                    keepalive_ms: 0,
                };
                (&prw::ACQUIRE, acquire_args(&op), op)
            }
            RwStep::Cancel(hold) => {
                let op = match waits.get(hold).cloned() {
                    Some(RwOp::Wait {
                        owner,
                        hold,
                        mode,
                        lease_ms,
                        channel,
                        ..
                    }) => RwOp::Cancel {
                        owner,
                        hold,
                        mode,
                        lease_ms,
                        channel,
                    },
                    _ => RwOp::Cancel {
                        owner: OWNERS[0].into(),
                        hold: hold.clone(),
                        mode: Mode::Read,
                        lease_ms: LONG,
                        channel: channel(0),
                    },
                };
                let RwOp::Cancel {
                    owner,
                    hold,
                    mode,
                    lease_ms,
                    channel,
                } = &op
                else {
                    unreachable!("a cancel")
                };
                let member = rw_member(hold, *lease_ms, *mode, owner, channel);
                (
                    &prw::CANCEL,
                    to_args(&[&member, &keys.channel, "0"]),
                    op.clone(),
                )
            }
            RwStep::Release(hold) => (
                &prw::RELEASE,
                to_args(&[hold, &keys.channel, "0"]),
                RwOp::Release { hold: hold.clone() },
            ),
            RwStep::Renew(holds) => {
                // The batch names the object's two first keys once per hold (the renewal takes
                // any stride).
                let args: Vec<String> = holds
                    .iter()
                    .flat_map(|(m, l)| [m.clone(), l.to_string()])
                    .collect();
                let op = RwOp::Renew {
                    holds: holds.clone(),
                };
                let batch: Vec<String> =
                    holds.iter().flat_map(|_| keys.keys[..2].to_vec()).collect();
                let ex =
                    h.rt.block_on(exchange(h, Some(&prw::RENEW), &batch, &args, &reads));
                let heard = listener.drain(h);
                rw_check(&ex, &heard, &mut model, &op).map_err(fail)?;
                continue;
            }
            RwStep::ForceUnlock => (
                &prw::FORCE_UNLOCK,
                to_args(&[&keys.channel, "0"]),
                RwOp::ForceUnlock,
            ),
            RwStep::Status(owners) => (
                &prw::STATUS,
                owners.iter().map(|o| OWNERS[*o].to_owned()).collect(),
                RwOp::Status {
                    owners: owners.iter().map(|o| OWNERS[*o].to_owned()).collect(),
                },
            ),
            RwStep::BadLease(mode, lease_ms) => {
                let lease = Some(Duration::from_millis(*lease_ms));
                let result = h.rt.block_on(async {
                    match mode {
                        Mode::Read => lock.try_read_lock(Duration::ZERO, lease).await,
                        Mode::Write => lock.try_write_lock(Duration::ZERO, lease).await,
                    }
                });
                let observed = match result {
                    Err(lockkit::Error::InvalidArgument(_)) => RwRet::InvalidArgument,
                    other => return Err(fail(format!("the API answered {other:?}"))),
                };
                let ex = h.rt.block_on(exchange(h, None, &keys.keys, &[], &reads));
                let op = RwOp::Acquire {
                    owner: OWNERS[0].into(),
                    hold: "#bad".into(),
                    mode: *mode,
                    lease_ms: *lease_ms,
                };
                check(
                    &ex,
                    &observed,
                    &mut model,
                    |m, t| m.apply(t, &op),
                    rw_same,
                    rw_keys,
                    |_| decode_keys(&ex.reads),
                )
                .map_err(fail)?;
                continue;
            }
            RwStep::Common(c) => {
                let (foreign, clear) = (RwOp::Foreign, RwOp::Clear);
                let touch = |m: &mut RwLock, foreign_value: bool| {
                    m.apply(0, if foreign_value { &foreign } else { &clear });
                };
                h.rt.block_on(common_step(
                    h, &keys, c, "string", &mut model, &mut saved, touch,
                ));
                continue;
            }
        };
        let ex =
            h.rt.block_on(exchange(h, Some(script), &keys.keys, &args, &reads));
        let heard = listener.drain(h);
        let unchanged = match &again {
            // What the first delivery granted may change what the second one finds: the model
            // judges it.
            Some(first) if first.granted => false,
            Some(first) => {
                let unchanged = second_delivery(script, &first.ex, &ex).map_err(fail)?;
                if unchanged && !heard.is_empty() {
                    return Err(fail(format!("a second delivery published {heard:?}")));
                }
                unchanged
            }
            None => false,
        };
        let checked = rw_check(&ex, &heard, &mut model, &op);
        // A second delivery that changed nothing, where the model would have: it stays.
        if !unchanged {
            checked.map_err(fail)?;
        }
        let granted = !heard.is_empty();
        last = Last::of(Some(script), &args, op, ex).map(|last| Last { granted, ..last });
    }
    Ok(())
}

/// Checks one script step: `op` against the reply, the keys and the messages the subscriber got
/// (`heard`: channel, payload), which must be the model's messages that reached a subscriber, in
/// order.
fn rw_check(
    ex: &Exchange,
    heard: &[(String, String)],
    model: &mut RwLock,
    op: &RwOp,
) -> Result<(), String> {
    let observed = (
        rw_decode(ex.reply.as_ref().expect("a reply"), op),
        heard.to_vec(),
    );
    check(
        ex,
        &observed,
        model,
        |m, t| {
            let ret = m.apply(t, op);
            let published = m
                .take_messages()
                .into_iter()
                .filter(|message| message.heard)
                .map(|message| (message.channel, message.payload))
                .collect::<Vec<_>>();
            (ret, published)
        },
        |e, o, slack| rw_same(&e.0, &o.0, slack) && e.1 == o.1,
        rw_keys,
        |_| decode_keys(&ex.reads),
    )
}

#[test]
fn read_write_lock_agrees_with_its_model() {
    let h = Harness::start();
    h.run::<RwMachine<false>>("read-write lock", "rw", 256, rw_sequence);
}

// === semaphores ===

#[derive(Debug, Clone, PartialEq)]
enum SemStep {
    TrySet(u64),
    /// The change, and the caller's configured total.
    Add(i64, Option<u64>),
    Acquire {
        hold: String,
        permits: u64,
        lease_ms: u64,
        /// The caller's configured total (`None`: none).
        configured: Option<u64>,
    },
    /// An acquire by a call that waits if refused (it joins the line): through client `A`
    /// (`client` 0, whose channel has a subscriber: a grant there is heard) or `B` (1: nobody
    /// listens, a grant there is undone at once).
    Wait {
        hold: String,
        permits: u64,
        lease_ms: u64,
        client: usize,
        keepalive_ms: u64,
    },
    /// The waiting call with this marker gives up (`semaphore_cancel`).
    Cancel(String),
    Release(String),
    Renew(Vec<(String, u64)>),
    UpdateLease(String, u64),
    Available,
    Evict(Key),
    /// Through the public API: zero or too many permits, a zero or absurd lease, a total beyond
    /// the maximum, a string that is no permit id.
    Bad(BadSem),
    Common(Common),
}

#[derive(Debug, Clone, PartialEq)]
enum BadSem {
    Acquire(u64, u64),
    TrySet(u64),
    ReleaseId(String),
    UpdateLease(u64),
}

/// `DUPS`: with `Common::Duplicate` steps.
struct SemMachine<const EXPIRABLE: bool, const DUPS: bool>;

impl<const EXPIRABLE: bool, const DUPS: bool> ReferenceStateMachine
    for SemMachine<EXPIRABLE, DUPS>
{
    type State = Issued<Self::Transition>;
    type Transition = SemStep;

    fn init_state() -> BoxedStrategy<Self::State> {
        Issued::start()
    }

    fn transitions(state: &Self::State) -> BoxedStrategy<SemStep> {
        let seq = state.seq;
        let permits = if EXPIRABLE { 1..=1u64 } else { 1..=3u64 };
        let acquire = (0..2usize, permits, lease(), configured()).prop_map(
            move |(c, permits, lease_ms, configured)| SemStep::Acquire {
                hold: format!("#{}:{}", ["A", "B"][c], 100 + seq),
                permits,
                lease_ms,
                configured,
            },
        );
        let permits = if EXPIRABLE { 1..=1u64 } else { 1..=3u64 };
        let wait = (
            0..2usize,
            permits,
            lease(),
            prop_oneof![Just(LONG), 40u64..=150],
        )
            .prop_map(move |(c, permits, lease_ms, keepalive_ms)| SemStep::Wait {
                hold: format!("#{}:{}", ["A", "B"][c], 100 + seq),
                permits,
                lease_ms,
                client: c,
                keepalive_ms,
            });
        let bad = if EXPIRABLE {
            prop_oneof![
                Just(BadSem::Acquire(1, 0)),
                Just(BadSem::Acquire(1, MAX_LEASE_MS + 1)),
                Just(BadSem::TrySet(MAX_PERMITS + 1)),
                Just(BadSem::ReleaseId("permits".into())),
                Just(BadSem::ReleaseId(String::new())),
                Just(BadSem::UpdateLease(0)),
            ]
            .boxed()
        } else {
            prop_oneof![
                Just(BadSem::Acquire(0, LONG)),
                Just(BadSem::Acquire(MAX_PERMITS + 1, LONG)),
                Just(BadSem::Acquire(1, 0)),
                Just(BadSem::Acquire(1, MAX_LEASE_MS + 1)),
                Just(BadSem::TrySet(MAX_PERMITS + 1)),
            ]
            .boxed()
        };
        let mut options: Vec<(u32, BoxedStrategy<SemStep>)> = vec![
            (
                2,
                prop_oneof![0u64..=4, Just(MAX_PERMITS)]
                    .prop_map(SemStep::TrySet)
                    .boxed(),
            ),
            (
                1,
                (
                    prop_oneof![-3i64..=3, Just(MAX_PERMITS as i64)],
                    configured(),
                )
                    .prop_map(|(delta, configured)| SemStep::Add(delta, configured))
                    .boxed(),
            ),
            (4, acquire.boxed()),
            (5, wait.boxed()),
            (2, state.marker().prop_map(SemStep::Cancel).boxed()),
            (4, state.marker().prop_map(SemStep::Release).boxed()),
            (
                2,
                prop::collection::vec(
                    (
                        state.marker(),
                        prop_oneof![Just(0u64), Just(LONG), 40u64..=120],
                    ),
                    1..=3,
                )
                .prop_map(SemStep::Renew)
                .boxed(),
            ),
            (1, Just(SemStep::Available).boxed()),
            (
                1,
                prop_oneof![Just(Key::Main), Just(Key::Leases)]
                    .prop_map(SemStep::Evict)
                    .boxed(),
            ),
            (1, bad.prop_map(SemStep::Bad).boxed()),
            (
                2,
                common(state.snapshot, true, DUPS)
                    .prop_map(SemStep::Common)
                    .boxed(),
            ),
        ];
        if EXPIRABLE {
            options.push((
                2,
                (state.marker(), lease())
                    .prop_map(|(m, l)| SemStep::UpdateLease(m, l))
                    .boxed(),
            ));
        }
        state.resend(2, &mut options);
        Union::new_weighted(options).boxed()
    }

    fn apply(mut state: Self::State, step: &SemStep) -> Self::State {
        match step {
            SemStep::Acquire { hold, .. } | SemStep::Wait { hold, .. } => state.note(hold, step),
            SemStep::Common(c) => state.common(c),
            _ => {}
        }
        state
    }

    fn preconditions(state: &Self::State, step: &SemStep) -> bool {
        match step {
            SemStep::Common(Common::Restore) => state.snapshot,
            // Evicting a foreign value is not a semaphore's eviction.
            SemStep::Evict(_) => !state.foreign,
            _ => true,
        }
    }
}

fn sem_decode(reply: &RespValue, op: &SemOp) -> SemRet {
    if wrong_type(reply) {
        return SemRet::WrongType;
    }
    let v = ints(reply);
    match op {
        SemOp::TrySetPermits { .. } => {
            SemRet::Set(psem::decode_try_set_permits(&v).unwrap_or_else(|e| undecodable(op, e)))
        }
        SemOp::AddPermits { .. } => {
            match psem::AddReply::decode(&v).unwrap_or_else(|e| undecodable(op, e)) {
                psem::AddReply::Added { total } => SemRet::Added { total },
                psem::AddReply::BelowZero { total } => SemRet::BelowZero { total },
                psem::AddReply::AboveMax { total } => SemRet::AboveMax { total },
            }
        }
        SemOp::Acquire { .. } | SemOp::Wait { .. } => {
            match psem::AcquireReply::decode(&v).unwrap_or_else(|e| undecodable(op, e)) {
                psem::AcquireReply::Acquired { available } => SemRet::Acquired {
                    available: Some(available),
                },
                psem::AcquireReply::Busy { .. } => SemRet::Busy,
                psem::AcquireReply::MoreThanTotal { total } => SemRet::MoreThanTotal { total },
                psem::AcquireReply::NotSet => SemRet::NotSet,
            }
        }
        SemOp::Release { .. } => {
            match lockkit::protocol::lock::ReleaseReply::decode(&v)
                .unwrap_or_else(|e| undecodable(op, e))
            {
                lockkit::protocol::lock::ReleaseReply::NotHeld => SemRet::NotHeld,
                _ => SemRet::Released,
            }
        }
        SemOp::Renew { holds } => SemRet::Renewed(
            lockkit::protocol::lock::decode_renew(&v, holds.len())
                .unwrap_or_else(|e| undecodable(op, e)),
        ),
        SemOp::UpdateLease { .. } => SemRet::LeaseUpdated(
            psem::decode_update_lease(&v).unwrap_or_else(|e| undecodable(op, e)),
        ),
        SemOp::Cancel { .. } => SemRet::Cancelled(
            lockkit::protocol::lock::decode_cancel(&v).unwrap_or_else(|e| undecodable(op, e)),
        ),
        SemOp::Available | SemOp::Evict(_) => {
            match psem::AvailableReply::decode(&v).unwrap_or_else(|e| undecodable(op, e)) {
                psem::AvailableReply::NotSet => SemRet::NotSet,
                psem::AvailableReply::Set { available, total } => {
                    SemRet::Available { available, total }
                }
            }
        }
        SemOp::Foreign | SemOp::Clear => SemRet::Done,
    }
}

/// The semaphore's keys as the model sees them at `now`: holds whose lease ended are left out
/// (two scripts, the renewal and `try_set_permits`, do not purge; every other one does).
fn sem_keys(m: &Semaphore, now: u64) -> Keys {
    if m.is_foreign() {
        return Keys {
            main: Main::Str("foreign".into()),
            aux: BTreeMap::new(),
            expire: (-1, -2),
        };
    }
    let mut hash = BTreeMap::new();
    let mut aux = BTreeMap::new();
    if let Some(total) = m.total() {
        hash.insert("permits".to_owned(), total.to_string());
    }
    if m.evicted() > 0 {
        hash.insert("evicted".to_owned(), m.evicted().to_string());
    }
    let mut used = 0;
    for (marker, hold) in m.holds().iter().filter(|(_, h)| h.expiry > now) {
        hash.insert(marker.clone(), hold.permits.to_string());
        aux.insert(marker.clone(), hold.expiry);
        used += hold.permits;
    }
    if used > 0 {
        hash.insert("used".to_owned(), used.to_string());
    }
    let exists = |b: bool| if b { -1 } else { -2 };
    Keys {
        expire: (exists(!hash.is_empty()), exists(!aux.is_empty())),
        main: if hash.is_empty() {
            Main::Absent
        } else {
            Main::Hash(hash)
        },
        aux,
    }
}

/// The keys read back, seen at `now`: holds whose lease ended left out, `used` recounted from
/// the live holds — after checking that `used` counts exactly the holds in the hash and that
/// every lease has its hold and every hold its lease.
fn sem_observed(keys: &Keys, now: u64) -> Result<Keys, String> {
    let Main::Hash(hash) = &keys.main else {
        return Ok(keys.clone());
    };
    let markers: BTreeMap<&String, u64> = hash
        .iter()
        .filter(|(k, _)| k.starts_with('#'))
        .map(|(k, v)| (k, v.parse().unwrap_or(u64::MAX)))
        .collect();
    let used: u64 = hash
        .get("used")
        .map_or(0, |u| u.parse().unwrap_or(u64::MAX));
    if used != markers.values().sum::<u64>() || !markers.keys().copied().eq(keys.aux.keys()) {
        return Err(format!("inconsistent semaphore keys: {keys:?}"));
    }
    let mut live = hash.clone();
    live.remove("used");
    let mut used = 0;
    for (marker, permits) in markers {
        if keys.aux[marker] <= now {
            live.remove(marker);
        } else {
            used += permits;
        }
    }
    if used > 0 {
        live.insert("used".to_owned(), used.to_string());
    }
    let aux: BTreeMap<String, u64> = keys
        .aux
        .iter()
        .filter(|(_, e)| **e > now)
        .map(|(k, e)| (k.clone(), *e))
        .collect();
    let exists = |b: bool| if b { -1 } else { -2 };
    let expire = |raw: i64, live: bool| if raw >= 0 { raw } else { exists(live) };
    Ok(Keys {
        expire: (
            expire(keys.expire.0, !live.is_empty()),
            expire(keys.expire.1, !aux.is_empty()),
        ),
        main: if live.is_empty() {
            Main::Absent
        } else {
            Main::Hash(live)
        },
        aux,
    })
}

/// A subscriber's messages, for comparing with a model's: subscribed to the given channels and
/// to a mark of its own, published after each step so that everything a step published has
/// arrived when the mark does.
struct Messages {
    /// The subscribed connection (kept open).
    _client: fred::clients::Client,
    rx: std::sync::Mutex<tokio::sync::broadcast::Receiver<fred::types::Message>>,
    mark: String,
}

impl Messages {
    fn start(h: &Harness, channels: &[&str]) -> Self {
        use fred::interfaces::{EventInterface, PubsubInterface};
        let mark = unique("model-mark");
        h.rt.block_on(async {
            let client = raw(&h.server.url()).await;
            let rx = client.message_rx();
            for channel in channels.iter().copied().chain([mark.as_str()]) {
                client.subscribe(channel).await.expect("SUBSCRIBE");
            }
            Self {
                _client: client,
                rx: std::sync::Mutex::new(rx),
                mark,
            }
        })
    }

    /// The messages since the last call (channel, payload), in order; a message with several
    /// payloads (one per line) counts as that many.
    fn drain(&self, h: &Harness) -> Vec<(String, String)> {
        use fred::interfaces::PubsubInterface;
        let mut rx = self.rx.lock().expect("one reader");
        h.rt.block_on(async {
            // From another connection: a subscribed one may only subscribe.
            let _: i64 = h
                .raw
                .publish(self.mark.as_str(), "mark")
                .await
                .expect("PUBLISH");
            let mut got = Vec::new();
            let wait = Duration::from_secs(30);
            loop {
                let message = tokio::time::timeout(wait, rx.recv())
                    .await
                    .expect("the mark within 30 s")
                    .expect("the message stream");
                if *message.channel == *self.mark {
                    return got;
                }
                // A message may carry several grants to one client, one per line
                // (lockkit_protocol::wake::Wake::decode_all): compared grant by grant.
                let payload = message.value.as_string().unwrap_or_default();
                for line in payload.split('\n') {
                    got.push((message.channel.to_string(), line.to_owned()));
                }
            }
        })
    }
}

fn sem_sequence<const EXPIRABLE: bool>(
    h: &Harness,
    steps: &[SemStep],
    seen: &dyn Fn(),
) -> Result<(), String> {
    let kind = if EXPIRABLE {
        Kind::PermitExpirableSemaphore
    } else {
        Kind::Semaphore
    };
    let name = unique("model-sem");
    let keys = object(kind, &name);
    let counting = h.client.semaphore(name.clone());
    let expirable = h.client.permit_expirable_semaphore(name.clone());
    let reads = reads(&keys);
    let mut model = Semaphore::new();
    // A subscriber on the semaphore's channel and on client A's own channel (B's has none): what
    // it receives is compared with the messages of the model.
    let channels = [keys.client_channel("A"), keys.client_channel("B")];
    let listener = Messages::start(h, &[&keys.channel, &channels[0]]);
    model.listen(&channels[0]);
    let mut waits: BTreeMap<String, SemOp> = BTreeMap::new();
    let mut saved = None;
    let mut last: Option<Last<SemOp>> = None;
    let max = MAX_PERMITS.to_string();
    for (i, step) in steps.iter().enumerate() {
        seen();
        let fail = |e: String| format!("step {i} {step:?}:\n{e}");
        let previous = last.take();
        let mut again = None;
        let (script, args, op) = match step {
            SemStep::Common(Common::Duplicate) => {
                let Some(first) = previous else {
                    continue;
                };
                let call = (first.script, first.args.clone(), first.op.clone());
                again = Some(first);
                call
            }
            SemStep::TrySet(n) => (
                &psem::TRY_SET_PERMITS,
                to_args(&[&n.to_string(), &keys.channel, "0"]),
                SemOp::TrySetPermits { permits: *n },
            ),
            SemStep::Add(d, configured) => (
                &psem::ADD_PERMITS,
                to_args(&[
                    &d.to_string(),
                    &max,
                    &keys.channel,
                    "0",
                    &configured_arg(*configured),
                ]),
                SemOp::AddPermits {
                    delta: *d,
                    configured: *configured,
                },
            ),
            SemStep::Acquire {
                hold,
                permits,
                lease_ms,
                configured,
            } => (
                &psem::ACQUIRE,
                to_args(&[
                    hold,
                    &permits.to_string(),
                    &lease_ms.to_string(),
                    &keys.channel,
                    "0",
                    &configured_arg(*configured),
                ]),
                SemOp::Acquire {
                    hold: hold.clone(),
                    permits: *permits,
                    lease_ms: *lease_ms,
                    configured: *configured,
                },
            ),
            SemStep::Wait {
                hold,
                permits,
                lease_ms,
                client,
                keepalive_ms,
            } => {
                waits.insert(
                    hold.clone(),
                    SemOp::Cancel {
                        hold: hold.clone(),
                        permits: *permits,
                        lease_ms: *lease_ms,
                        channel: channels[*client].clone(),
                    },
                );
                (
                    &psem::ACQUIRE,
                    to_args(&[
                        hold,
                        &permits.to_string(),
                        &lease_ms.to_string(),
                        &channels[*client],
                        "0",
                        "",
                        &keepalive_ms.to_string(),
                    ]),
                    SemOp::Wait {
                        hold: hold.clone(),
                        permits: *permits,
                        lease_ms: *lease_ms,
                        configured: None,
                        channel: channels[*client].clone(),
                        keepalive_ms: *keepalive_ms,
                    },
                )
            }
            SemStep::Cancel(hold) => {
                let op = waits.get(hold).cloned().unwrap_or_else(|| SemOp::Cancel {
                    hold: hold.clone(),
                    permits: 1,
                    lease_ms: LONG,
                    channel: channels[0].clone(),
                });
                let SemOp::Cancel {
                    permits,
                    lease_ms,
                    channel,
                    ..
                } = &op
                else {
                    unreachable!("a cancel")
                };
                let member = format!("{hold} {lease_ms} {permits} {channel}");
                (
                    &psem::CANCEL,
                    to_args(&[&member, &keys.channel, "0"]),
                    op.clone(),
                )
            }
            SemStep::Release(hold) => (
                &psem::RELEASE,
                to_args(&[hold, &keys.channel, "0"]),
                SemOp::Release { hold: hold.clone() },
            ),
            SemStep::Renew(holds) => {
                let args: Vec<String> = holds
                    .iter()
                    .flat_map(|(m, l)| [m.clone(), l.to_string()])
                    .collect();
                let op = SemOp::Renew {
                    holds: holds.clone(),
                };
                // The renewal reads a hold's first two keys (main, leases) whatever its stride:
                // two per hold keep a batch of three within `eval`'s nine keys.
                let batch: Vec<String> =
                    holds.iter().flat_map(|_| keys.keys[..2].to_vec()).collect();
                let ex =
                    h.rt.block_on(exchange(h, Some(&psem::RENEW), &batch, &args, &reads));
                let heard = listener.drain(h);
                sem_check(&ex, &heard, &mut model, &op, &[]).map_err(fail)?;
                continue;
            }
            SemStep::UpdateLease(hold, lease_ms) => (
                &psem::UPDATE_LEASE,
                to_args(&[hold, &lease_ms.to_string(), &keys.channel, "0"]),
                SemOp::UpdateLease {
                    hold: hold.clone(),
                    lease_ms: *lease_ms,
                },
            ),
            SemStep::Available => (
                &psem::AVAILABLE,
                to_args(&[&keys.channel, "0"]),
                SemOp::Available,
            ),
            SemStep::Evict(key) => {
                let which = match key {
                    Key::Main => &keys.keys[0],
                    Key::Leases => &keys.keys[1],
                };
                h.rt.block_on(h.server.command(&["DEL", which]))
                    .expect("DEL");
                // The next script notices and repairs.
                let args = to_args(&[&keys.channel, "0"]);
                let ex = h.rt.block_on(exchange(
                    h,
                    Some(&psem::AVAILABLE),
                    &keys.keys,
                    &args,
                    &reads,
                ));
                let heard = listener.drain(h);
                sem_check(
                    &ex,
                    &heard,
                    &mut model,
                    &SemOp::Evict(*key),
                    &[SemOp::Available],
                )
                .map_err(fail)?;
                continue;
            }
            SemStep::Bad(bad) => {
                let (op, result) = h.rt.block_on(sem_bad(bad, &counting, &expirable));
                let observed = match result {
                    Err(lockkit::Error::InvalidArgument(_)) => SemRet::InvalidArgument,
                    other => return Err(fail(format!("the API answered {other:?}"))),
                };
                let ex = h.rt.block_on(exchange(h, None, &keys.keys, &[], &reads));
                check(
                    &ex,
                    &observed,
                    &mut model,
                    |m, t| m.apply(t, &op),
                    |e, o, _| e == o,
                    sem_keys,
                    |t| sem_observed(&decode_keys(&ex.reads), t).unwrap_or_else(|e| panic!("{e}")),
                )
                .map_err(fail)?;
                continue;
            }
            SemStep::Common(c) => {
                let (foreign, clear) = (SemOp::Foreign, SemOp::Clear);
                let touch = |m: &mut Semaphore, foreign_value: bool| {
                    m.apply(0, if foreign_value { &foreign } else { &clear });
                };
                h.rt.block_on(common_step(
                    h, &keys, c, "string", &mut model, &mut saved, touch,
                ));
                continue;
            }
        };
        let ex =
            h.rt.block_on(exchange(h, Some(script), &keys.keys, &args, &reads));
        let heard = listener.drain(h);
        let unchanged = match &again {
            Some(first) => {
                let unchanged = second_delivery(script, &first.ex, &ex).map_err(fail)?;
                if unchanged && !heard.is_empty() {
                    return Err(fail(format!("a second delivery published {heard:?}")));
                }
                unchanged
            }
            None => false,
        };
        let checked = sem_check(&ex, &heard, &mut model, &op, &[]);
        // A second delivery that changed nothing, where the model would have: it stays.
        if !unchanged {
            checked.map_err(fail)?;
        }
        last = Last::of(Some(script), &args, op, ex);
    }
    Ok(())
}

/// Checks one script step: `op` (then `then`, at the same instant) against the reply, the keys
/// and the messages the subscriber got (`heard`: channel, payload), which must be the model's
/// messages that reached a subscriber, in order.
fn sem_check(
    ex: &Exchange,
    heard: &[(String, String)],
    model: &mut Semaphore,
    op: &SemOp,
    then: &[SemOp],
) -> Result<(), String> {
    let observed = (
        sem_decode(
            ex.reply.as_ref().expect("a reply"),
            then.last().unwrap_or(op),
        ),
        heard.to_vec(),
    );
    let keys = decode_keys(&ex.reads);
    sem_observed(&keys, ex.t0)?;
    check(
        ex,
        &observed,
        model,
        |m, t| {
            let ret = m.apply(t, op);
            let ret = then.iter().fold(ret, |_, next| m.apply(t, next));
            let published = m
                .take_messages()
                .into_iter()
                .filter(|message| message.heard)
                .map(|message| (message.channel, message.payload))
                .collect::<Vec<_>>();
            (ret, published)
        },
        |e, o, _| e == o,
        sem_keys,
        |t| sem_observed(&keys, t).unwrap_or_else(|e| panic!("{e}")),
    )
}

async fn sem_bad(
    bad: &BadSem,
    counting: &lockkit::Semaphore,
    expirable: &lockkit::PermitExpirableSemaphore,
) -> (SemOp, Result<(), lockkit::Error>) {
    let ms = Duration::from_millis;
    match bad {
        BadSem::Acquire(permits, lease) => {
            let op = SemOp::Acquire {
                hold: "#bad".into(),
                permits: *permits,
                lease_ms: *lease,
                configured: None,
            };
            let result = if *permits == 1 && (*lease == 0 || *lease > MAX_LEASE_MS) {
                // The same through both kinds: counting semaphores with a fixed lease, and the
                // permit-expirable one.
                let a = counting
                    .try_acquire(1, Duration::ZERO, Some(ms(*lease)))
                    .await
                    .map(drop);
                let b = expirable
                    .try_acquire(Duration::ZERO, ms(*lease))
                    .await
                    .map(drop);
                a.and(b)
            } else {
                counting
                    .try_acquire(*permits, Duration::ZERO, Some(ms(*lease)))
                    .await
                    .map(drop)
            };
            (op, result)
        }
        BadSem::TrySet(n) => {
            let a = counting.try_set_permits(*n).await.map(drop);
            let b = expirable.try_set_permits(*n).await.map(drop);
            (SemOp::TrySetPermits { permits: *n }, a.and(b))
        }
        BadSem::ReleaseId(id) => (
            SemOp::Release { hold: id.clone() },
            expirable.release(id).await,
        ),
        BadSem::UpdateLease(lease) => (
            SemOp::UpdateLease {
                hold: "#A:1".into(),
                lease_ms: *lease,
            },
            expirable.update_lease("#A:1", ms(*lease)).await.map(drop),
        ),
    }
}

#[test]
fn semaphore_agrees_with_its_model() {
    let h = Harness::start();
    h.run::<SemMachine<false, false>>("semaphore", "semaphore", 256, sem_sequence::<false>);
}

#[test]
fn permit_expirable_semaphore_agrees_with_its_model() {
    let h = Harness::start();
    h.run::<SemMachine<true, false>>(
        "permit-expirable semaphore",
        "permit",
        192,
        sem_sequence::<true>,
    );
}

// === count-down latch ===

#[derive(Debug, Clone, PartialEq)]
enum LatchStep {
    TrySet {
        request: String,
        count: u64,
    },
    CountDown {
        request: String,
    },
    Count,
    /// Through the public API: a count of zero or beyond the maximum.
    BadCount(u64),
    Common(Common),
}

/// `DUPS`: with `Common::Duplicate` steps.
struct LatchMachine<const DUPS: bool>;

impl<const DUPS: bool> ReferenceStateMachine for LatchMachine<DUPS> {
    type State = Issued<Self::Transition>;
    type Transition = LatchStep;

    fn init_state() -> BoxedStrategy<Self::State> {
        Issued::start()
    }

    fn transitions(state: &Self::State) -> BoxedStrategy<LatchStep> {
        let seq = state.seq;
        let request = move |c: usize| format!("#{}:{}", ["A", "B"][c], 100 + seq);
        let mut options: Vec<(u32, BoxedStrategy<LatchStep>)> = vec![
            (
                3,
                (0..2usize, 1u64..=3)
                    .prop_map(move |(c, count)| LatchStep::TrySet {
                        request: request(c),
                        count,
                    })
                    .boxed(),
            ),
            (
                6,
                (0..2usize)
                    .prop_map(move |c| LatchStep::CountDown {
                        request: request(c),
                    })
                    .boxed(),
            ),
            (1, Just(LatchStep::Count).boxed()),
            (
                1,
                prop_oneof![Just(0u64), Just(u64::from(u32::MAX) + 1)]
                    .prop_map(LatchStep::BadCount)
                    .boxed(),
            ),
            (
                2,
                common(state.snapshot, false, DUPS)
                    .prop_map(LatchStep::Common)
                    .boxed(),
            ),
        ];
        state.resend(3, &mut options);
        Union::new_weighted(options).boxed()
    }

    fn apply(mut state: Self::State, step: &LatchStep) -> Self::State {
        match step {
            LatchStep::TrySet { request, .. } | LatchStep::CountDown { request } => {
                state.note(request, step)
            }
            LatchStep::Common(c) => state.common(c),
            _ => {}
        }
        state
    }

    fn preconditions(state: &Self::State, step: &LatchStep) -> bool {
        match step {
            LatchStep::Common(Common::Restore) => state.snapshot,
            // A re-send over a foreign value: the contract does not say which error wins.
            LatchStep::TrySet { request, .. } | LatchStep::CountDown { request } => {
                !state.foreign || !state.markers.contains(request)
            }
            _ => true,
        }
    }
}

fn latch_keys(m: &Latch, _now: u64) -> Keys {
    let main = if m.is_foreign() {
        Main::Hash(BTreeMap::from([("x".to_owned(), "1".to_owned())]))
    } else if m.count() == 0 {
        Main::Absent
    } else {
        Main::Str(m.count().to_string())
    };
    let aux: BTreeMap<String, u64> = m.requests().clone();
    let expire = (
        if main == Main::Absent { -2 } else { -1 },
        aux.values()
            .max()
            .map_or(-2, |at| (at + REQUEST_WINDOW_MS) as i64),
    );
    Keys { main, aux, expire }
}

/// The latch's keys read back; the requests' expiry is set by `PEXPIRE` on the server's own
/// clock, which may be a millisecond past the script's `TIME` (at most `t1`).
fn latch_observed(ex: &Exchange) -> Keys {
    let mut keys = decode_keys(&ex.reads);
    if let Some(latest) = keys.aux.values().max() {
        let (from, to) = (latest + REQUEST_WINDOW_MS, ex.t1 + REQUEST_WINDOW_MS);
        if (from..=to).contains(&keys.expire.1.unsigned_abs()) {
            keys.expire.1 = from as i64;
        }
    }
    keys
}

fn latch_sequence(h: &Harness, steps: &[LatchStep], seen: &dyn Fn()) -> Result<(), String> {
    let name = unique("model-latch");
    let keys = object(Kind::CountDownLatch, &name);
    let latch = h.client.count_down_latch(name.clone());
    let reads = reads(&keys);
    let window = REQUEST_WINDOW_MS.to_string();
    let mut model = Latch::new();
    let mut saved = None;
    let mut last: Option<Last<LatchOp>> = None;
    for (i, step) in steps.iter().enumerate() {
        seen();
        let fail = |e: String| format!("step {i} {step:?}:\n{e}");
        let previous = last.take();
        let mut again = None;
        let (script, args, op) = match step {
            LatchStep::Common(Common::Duplicate) => {
                let Some(first) = previous else {
                    continue;
                };
                let call = (Some(first.script), first.args.clone(), first.op.clone());
                again = Some(first);
                call
            }
            LatchStep::TrySet { request, count } => (
                Some(&platch::TRY_SET_COUNT),
                to_args(&[request, &count.to_string(), &window]),
                LatchOp::TrySetCount {
                    request: request.clone(),
                    count: *count,
                },
            ),
            LatchStep::CountDown { request } => (
                Some(&platch::COUNT_DOWN),
                to_args(&[request, &window, &keys.channel, "0"]),
                LatchOp::CountDown {
                    request: request.clone(),
                },
            ),
            LatchStep::Count => (None, vec![], LatchOp::Count),
            LatchStep::BadCount(n) => {
                let observed = match h.rt.block_on(latch.try_set_count(*n)) {
                    Err(lockkit::Error::InvalidArgument(_)) => LatchRet::InvalidArgument,
                    other => return Err(fail(format!("the API answered {other:?}"))),
                };
                let ex = h.rt.block_on(exchange(h, None, &keys.keys, &[], &reads));
                let op = LatchOp::TrySetCount {
                    request: "#bad".into(),
                    count: *n,
                };
                check(
                    &ex,
                    &observed,
                    &mut model,
                    |m, t| m.apply(t, &op),
                    |e, o, _| e == o,
                    latch_keys,
                    |_| latch_observed(&ex),
                )
                .map_err(fail)?;
                continue;
            }
            LatchStep::Common(c) => {
                let (foreign, clear) = (LatchOp::Foreign, LatchOp::Clear);
                let touch = |m: &mut Latch, foreign_value: bool| {
                    m.apply(0, if foreign_value { &foreign } else { &clear });
                };
                h.rt.block_on(common_step(
                    h, &keys, c, "hash", &mut model, &mut saved, touch,
                ));
                continue;
            }
        };
        let ex =
            h.rt.block_on(exchange(h, script, &keys.keys, &args, &reads));
        let unchanged = match (&again, script) {
            (Some(first), Some(script)) => second_delivery(script, &first.ex, &ex).map_err(fail)?,
            _ => false,
        };
        let observed = match &ex.reply {
            Some(reply) if wrong_type(reply) => LatchRet::WrongType,
            Some(reply) => {
                let v = ints(reply);
                match op {
                    LatchOp::TrySetCount { .. } => LatchRet::Set(
                        platch::decode_try_set_count(&v).map_err(|e| fail(format!("{e:?}")))?,
                    ),
                    _ => match platch::CountDownReply::decode(&v)
                        .map_err(|e| fail(format!("{e:?}")))?
                    {
                        platch::CountDownReply::Counted { count } => LatchRet::Counted { count },
                        platch::CountDownReply::AlreadyZero => LatchRet::AlreadyZero,
                    },
                }
            }
            // `count()` reads the key: the public API's answer.
            None => match h.rt.block_on(latch.count()) {
                Ok(n) => LatchRet::Count(n),
                Err(lockkit::Error::WrongType { .. }) => LatchRet::WrongType,
                Err(e) => return Err(fail(format!("count(): {e}"))),
            },
        };
        let checked = check(
            &ex,
            &observed,
            &mut model,
            |m, t| m.apply(t, &op),
            |e, o, _| e == o,
            latch_keys,
            |_| latch_observed(&ex),
        );
        // A second delivery that changed nothing, where the model would have: it stays.
        if !unchanged {
            checked.map_err(fail)?;
        }
        last = Last::of(script, &args, op, ex);
    }
    Ok(())
}

#[test]
fn count_down_latch_agrees_with_its_model() {
    let h = Harness::start();
    h.run::<LatchMachine<false>>("count-down latch", "latch", 512, latch_sequence);
}

// === issue 27, §4: duplicates ===

/// Every step of the read-write lock's sequences, and after many a second delivery of the call
/// it made (acquire, status: what the client sends with `Resend::Allowed`).
#[test]
fn read_write_lock_duplicate_deliveries_change_nothing() {
    let h = Harness::start();
    h.run::<RwMachine<true>>(
        "read-write lock, delivered twice",
        "",
        cases_scaled(48),
        rw_sequence,
    );
}

/// Both semaphores (acquire, available, update lease), and the latch (try set count, count
/// down), each call delivered twice as above.
#[test]
fn semaphore_and_latch_duplicate_deliveries_change_nothing() {
    let h = Harness::start();
    h.run::<SemMachine<false, true>>(
        "semaphore, delivered twice",
        "",
        cases_scaled(32),
        sem_sequence::<false>,
    );
    h.run::<SemMachine<true, true>>(
        "permit-expirable semaphore, delivered twice",
        "",
        cases_scaled(32),
        sem_sequence::<true>,
    );
    h.run::<LatchMachine<true>>(
        "count-down latch, delivered twice",
        "",
        cases_scaled(48),
        latch_sequence,
    );
}
