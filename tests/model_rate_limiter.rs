//! Model-based tests (issue 30, target 4) of the rate limiter: generated programs run the **real
//! scripts** (`rate_limiter_acquire`, `_cancel`, `_set_limit`, `_status`) on a real
//! `redis-server` and step `lockkit_model::rate_limiter::RateLimiterSpec` alongside; every reply
//! and the decoded keys must agree after every step.
//!
//! **Time.** The scripts read `TIME` themselves. Each step is one `MULTI`: `TIME`, the script
//! (`EVALSHA`, reloaded after `NOSCRIPT` as fred's `evalsha_with_reload` does), `TIME`, and the
//! reads of the keys. The instant the script decided at is in its reply (an admission's
//! `at − delay`, a refusal's or a too-far's `now`, the status' `now`); it must lie between the two
//! `TIME`s, and the spec is stepped at exactly that instant. So the comparison does not depend on
//! how fast the machine is: a loaded machine only makes the programs' real sleeps (1–60 ms, with
//! intervals of 5–50 ms: spans many intervals long) land elsewhere, which the spec follows.
//!
//! **Faults in the programs.** Every script call may be delivered twice (`Step::Duplicate`: the
//! previous call again, exactly; fred re-sends the rate limiter's calls); `SCRIPT FLUSH`; `SAVE`
//! and a restart from that snapshot (the schedule rolls back with the spec); a restart with
//! nothing saved, and `FLUSHALL` (data loss: the configured limit comes back, the schedule starts
//! afresh); give-backs of any earlier request, in any order; `set_limit`/`try_set_limit`; the
//! per-client mode.
//!
//! **Sliding window.** Every program's admitted moments (a request admitted twice counted
//! twice, a given-back one not at all) are checked with `lockkit_suite::rate_window`: in a
//! program whose limit never changed, no window of one interval holds more than
//! `(rate + burst) × (1 + resets)` permits, `resets` the restarts and `FLUSHALL`s of the program
//! (`lockkit_model::rate_limiter::most_per_window`: one extra window per rollback or loss; with no
//! reset, exactly `rate + burst`).
//!
//! A failure prints the seed and the program. `LOCKKIT_MODEL_CASES` scales the number of programs
//! (`lockkit_suite::model_io::cases_scaled`), `LOCKKIT_MODEL_SEED` replays a seed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, UNIX_EPOCH};

use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::rate_limiter::{self as prl, client_state_key};
use lockkit::protocol::script::Script;
use lockkit_model::rate_limiter::{
    most_per_window, Limit, RateLimiterSpec, RateOp, RateRet, PRECISION_US,
};
use lockkit_suite::checker::save_model_cases;
use lockkit_suite::model_io::cases_scaled;
use lockkit_suite::rate_window::busiest_window;
use lockkit_suite::{eval, spawned, RedisServer};
use lockkit_testkit::RespValue;

/// Steps per program, at most.
const MAX_STEPS: usize = 40;
/// The client ids of the programs' two clients.
const CLIENTS: [&str; 2] = ["c0ffee00-aaaa", "c0ffee01-bbbb"];

/// splitmix64: the programs' generator (seeded per program: replayable).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[usize::try_from(self.below(items.len() as u64)).unwrap_or(0)]
    }
}

#[derive(Debug, Clone)]
enum Step {
    /// A request of `client` (its handle configured with the program's limit, or not).
    Acquire {
        client: usize,
        permits: u64,
        wait_us: Option<u64>,
        configured: bool,
    },
    /// Give back the `nth` request from the end (0: the last).
    Cancel {
        client: usize,
        nth: usize,
    },
    SetLimit {
        limit: Limit,
        only_if_absent: bool,
    },
    Status {
        client: usize,
    },
    /// Real time passes (ms).
    Sleep(u64),
    /// The previous script call delivered again, exactly.
    Duplicate,
    ScriptFlush,
    /// `SAVE`: the snapshot a later restart comes back to.
    Save,
    /// Killed and started again from the last `SAVE` (empty when none).
    Restart,
    /// `FLUSHALL`.
    FlushAll,
}

fn random_limit(rng: &mut Rng, per_client: bool) -> Limit {
    Limit {
        rate: rng.pick(&[1, 2, 3, 5]),
        interval_ms: rng.pick(&[5, 10, 20, 50]),
        burst: rng.pick(&[0, 0, 1, 2]),
        per_client,
    }
}

/// One program: the configured limit, whether the limit may change, and the steps.
fn program(rng: &mut Rng, restarts: bool) -> (Limit, bool, Vec<Step>) {
    let per_client = rng.below(5) == 0;
    let configured = random_limit(rng, per_client);
    let changes = rng.below(2) == 0;
    let len = 8 + rng.below(MAX_STEPS as u64 - 8);
    let mut steps = Vec::new();
    for _ in 0..len {
        let horizon = configured.interval_ms * 1000;
        let step = match rng.below(100) {
            0..=39 => Step::Acquire {
                client: usize::from(rng.below(2) == 1),
                permits: 1 + rng.below(configured.burst + 2),
                wait_us: match rng.below(4) {
                    0 => None,
                    1 => Some(0),
                    2 => Some(rng.below(horizon / 2 + 1)),
                    _ => Some(rng.below(2 * horizon + 1)),
                },
                configured: rng.below(6) != 0,
            },
            40..=49 => Step::Cancel {
                client: usize::from(rng.below(2) == 1),
                nth: usize::from(rng.below(3) == 0) * usize::try_from(rng.below(4)).unwrap_or(0),
            },
            50..=53 => Step::SetLimit {
                limit: if changes {
                    let per_client = rng.below(5) == 0;
                    random_limit(rng, per_client)
                } else {
                    configured
                },
                only_if_absent: rng.below(2) == 0,
            },
            54..=59 => Step::Status {
                client: usize::from(rng.below(2) == 1),
            },
            60..=74 => Step::Sleep(1 + rng.below(60)),
            75..=89 => Step::Duplicate,
            90..=92 => Step::ScriptFlush,
            93..=94 => Step::FlushAll,
            95..=96 if restarts => Step::Save,
            97..=99 if restarts => Step::Restart,
            _ => Step::Sleep(1 + rng.below(10)),
        };
        steps.push(step);
    }
    (configured, changes, steps)
}

fn limit_args(limit: &Limit) -> [String; 4] {
    [
        limit.rate.to_string(),
        limit.interval_ms.to_string(),
        limit.burst.to_string(),
        if limit.per_client {
            prl::MODE_PER_CLIENT
        } else {
            prl::MODE_OVERALL
        }
        .to_owned(),
    ]
}

/// What one script call saw: the server's clock (µs) before and after it, its reply, and the
/// keys (main HASH, waiting ZSET, each client's HASH) read right after it.
struct Exchange {
    t0: u64,
    t1: u64,
    reply: RespValue,
    main: BTreeMap<String, String>,
    waiting: BTreeMap<String, u64>,
    clients: Vec<BTreeMap<String, String>>,
}

fn time_us(reply: &RespValue) -> u64 {
    let part = |i: usize| {
        reply
            .as_array()
            .and_then(|t| t.get(i))
            .and_then(RespValue::as_str)
            .and_then(|p| p.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("not a TIME reply: {reply:?}"))
    };
    part(0) * 1_000_000 + part(1)
}

fn hash(v: &RespValue) -> BTreeMap<String, String> {
    let flat: Vec<String> = v
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {v:?}"))
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect();
    flat.chunks(2)
        .map(|kv| (kv[0].clone(), kv[1].clone()))
        .collect()
}

/// The keys of the object as the scripts take them, per client.
fn script_keys(keys: &ObjectKeys, name: &str, client: usize) -> Vec<String> {
    vec![
        keys.keys[0].clone(),
        keys.keys[1].clone(),
        client_state_key(&Namespace::default(), name, CLIENTS[client]).expect("a valid name"),
    ]
}

async fn exchange(
    server: &RedisServer,
    script: &Script,
    keys: &[String],
    args: &[String],
    name: &str,
) -> Exchange {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (main, waiting) = (keys[0].clone(), keys[1].clone());
    let client_keys: Vec<String> = (0..CLIENTS.len())
        .map(|c| client_state_key(&Namespace::default(), name, CLIENTS[c]).expect("a valid name"))
        .collect();
    loop {
        let mut call = eval(script.sha1(), keys, &args);
        call[0] = "EVALSHA";
        let mut commands: Vec<Vec<&str>> = vec![vec!["MULTI"], vec!["TIME"], call, vec!["TIME"]];
        commands.push(vec!["HGETALL", &main]);
        commands.push(vec!["ZRANGE", &waiting, "0", "-1", "WITHSCORES"]);
        for key in &client_keys {
            commands.push(vec!["HGETALL", key]);
        }
        commands.push(vec!["EXEC"]);
        let replies = lockkit_testkit::send_commands(server.addr(), &commands)
            .await
            .expect("an exchange");
        let Some(out) = replies.last().and_then(RespValue::as_array) else {
            panic!("EXEC failed: {replies:?}");
        };
        if out[1].as_error().is_some_and(|e| e.starts_with("NOSCRIPT")) {
            let loaded = server
                .command(&["SCRIPT", "LOAD", script.source()])
                .await
                .expect("SCRIPT LOAD");
            assert_eq!(loaded.as_str(), Some(script.sha1()));
            continue;
        }
        let zset = hash(&out[4])
            .into_iter()
            // The moment in ms with its µs as the fraction: read back as µs.
            .map(|(m, s)| {
                let ms: f64 = s.parse().expect("a score");
                (m, (ms * 1000.0).round() as u64)
            })
            .collect();
        return Exchange {
            t0: time_us(&out[0]),
            t1: time_us(&out[2]),
            reply: out[1].clone(),
            main: hash(&out[3]),
            waiting: zset,
            clients: out[5..].iter().map(hash).collect(),
        };
    }
}

/// The reply as the spec's result, and the instant the script decided at (`None`: the reply
/// does not depend on it).
fn decode(op: &RateOp, reply: &RespValue) -> Result<(RateRet, Option<u64>), String> {
    let ints: Vec<i64> = reply
        .as_array()
        .ok_or_else(|| format!("not an array: {reply:?}"))?
        .iter()
        .map(|v| {
            v.as_int()
                .ok_or_else(|| format!("not an integer: {reply:?}"))
        })
        .collect::<Result<_, _>>()?;
    let u = |v: i64| u64::try_from(v).map_err(|_| format!("negative figure in {ints:?}"));
    Ok(match op {
        RateOp::Acquire { .. } => match *ints.as_slice() {
            [1, delay, at, far @ (0 | 1)] => (
                RateRet::Admitted {
                    delay_us: u(delay)?,
                    at_us: u(at)?,
                    far: far == 1,
                },
                Some(u(at)? - u(delay)?),
            ),
            [0, e, now] => (
                RateRet::Refused {
                    earliest_us: u(e)?,
                    now_us: u(now)?,
                },
                Some(u(now)?),
            ),
            [-1] => (RateRet::NoLimit, None),
            [-2, most] => (RateRet::TooMany { most: u(most)? }, None),
            _ => return Err(format!("an acquire reply {ints:?}")),
        },
        RateOp::Cancel { .. } => (
            RateRet::GivenBack(prl::decode_cancel(&ints).map_err(|e| e.to_string())?),
            None,
        ),
        RateOp::SetLimit { .. } => (
            RateRet::Stored(prl::decode_set_limit(&ints).map_err(|e| e.to_string())?),
            None,
        ),
        RateOp::Status { .. } => {
            let s = prl::StatusReply::decode(&ints).map_err(|e| e.to_string())?;
            (
                RateRet::Status {
                    limit: s.limit.map(|l| Limit {
                        rate: l.rate,
                        interval_ms: l.interval_ms,
                        burst: l.burst,
                        per_client: l.per_client,
                    }),
                    available: s.available,
                    now_us: s.now_us,
                    waiting: s.waiting,
                },
                Some(s.now_us),
            )
        }
        RateOp::Lose => (RateRet::Done, None),
    })
}

/// The keys as the spec has them: `Err` names the first difference (µs figures, and the waiting
/// ZSET's scores, ms with the µs as the fraction, within the spec's precision; entries of the
/// waiting ZSET already past are not compared, as its expiry may have dropped them).
fn keys_agree(spec: &RateLimiterSpec, ex: &Exchange) -> Result<(), String> {
    let eps = lockkit_model::rate_limiter::PRECISION_US as f64 + 1.0;
    let near = |got: Option<&String>, want: Option<f64>, what: &str| -> Result<(), String> {
        match (got.and_then(|g| g.parse::<f64>().ok()), want) {
            (None, None) => Ok(()),
            (Some(g), Some(w)) if (g - w).abs() <= eps => Ok(()),
            (g, w) => Err(format!("{what}: the key has {g:?}, the spec {w:?}")),
        }
    };
    let schedule = |fields: &BTreeMap<String, String>, client: &str| -> Result<(), String> {
        near(fields.get("tat"), spec.tat_us(client), "tat")?;
        let last = spec.last(client);
        if fields.get("last") != last.as_ref().map(|l| &l.0) {
            return Err(format!(
                "last: the key has {:?}, the spec {last:?}",
                fields.get("last")
            ));
        }
        near(
            fields.get("last_at"),
            last.as_ref().map(|l| l.1 as f64),
            "last_at",
        )?;
        near(
            fields.get("last_cost"),
            last.as_ref().map(|l| l.2),
            "last_cost",
        )
    };
    match spec.limit() {
        None => {
            if ex.main.contains_key("rate") {
                return Err(format!(
                    "a limit is stored, the spec has none: {:?}",
                    ex.main
                ));
            }
        }
        Some(limit) => {
            let args = limit_args(&limit);
            for (field, want) in ["rate", "interval", "burst", "mode"].iter().zip(&args) {
                if ex.main.get(*field) != Some(want) {
                    return Err(format!(
                        "{field}: the key has {:?}, the spec {want}",
                        ex.main
                    ));
                }
            }
            if limit.per_client {
                for (c, id) in CLIENTS.iter().enumerate() {
                    schedule(&ex.clients[c], id).map_err(|e| format!("client {c}: {e}"))?;
                }
            } else {
                schedule(&ex.main, CLIENTS[0])?;
            }
        }
    }
    let later = ex.t1 + 2000;
    let future = |z: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        z.iter()
            .filter(|(_, at)| **at > later)
            .map(|(m, s)| (m.clone(), *s))
            .collect()
    };
    let (got, want) = (future(&ex.waiting), future(spec.waiting()));
    let same = got.len() == want.len()
        && got
            .iter()
            .zip(&want)
            .all(|((a, x), (b, y))| a == b && x.abs_diff(*y) <= PRECISION_US);
    if !same {
        return Err(format!(
            "the waiting ZSET: the key has {got:?}, the spec {want:?}"
        ));
    }
    Ok(())
}

struct Run {
    server: RedisServer,
    name: String,
    keys: ObjectKeys,
    spec: RateLimiterSpec,
    saved: Option<RateLimiterSpec>,
    configured: Limit,
    /// Requests sent so far, per client: (marker, the request).
    markers: Vec<Vec<String>>,
    sequence: u64,
    /// The previous script call: script, client, args, op.
    last_call: Option<(&'static Script, usize, Vec<String>, RateOp)>,
    /// Admissions: marker → (moment µs, permits), each delivery that admitted counted once per
    /// distinct moment.
    admitted: Vec<(String, u64, u64)>,
    resets: u64,
    log: String,
}

impl Run {
    async fn call(
        &mut self,
        script: &'static Script,
        client: usize,
        args: Vec<String>,
        op: RateOp,
    ) -> Result<(), String> {
        let keys = script_keys(&self.keys, &self.name, client);
        let ex = exchange(&self.server, script, &keys, &args, &self.name).await;
        let (observed, at) = decode(&op, &ex.reply)?;
        // A re-sent copy answers with its first moment, which may have passed (delay 0): then
        // only the TIMEs around it bound the instant, and the answer is the same at any of them.
        let past =
            |now: u64| matches!(observed, RateRet::Admitted { delay_us: 0, .. }) && now < ex.t0;
        let now = match at {
            Some(now) if past(now) => ex.t0,
            Some(now) => {
                if now < ex.t0 || now > ex.t1 {
                    return Err(format!(
                        "the script's instant {now} is not between the TIMEs around it ({}, {})",
                        ex.t0, ex.t1
                    ));
                }
                now
            }
            None => ex.t0,
        };
        let outcomes = self.spec.outcomes(now, &op);
        let Some((_, next)) = outcomes
            .iter()
            .find(|(expected, _)| RateLimiterSpec::accepts(expected, &observed))
        else {
            return Err(format!(
                "{op:?} at {now}: the scripts answered {observed:?}, the spec {:?}\n  spec {:?}",
                outcomes.iter().map(|(r, _)| r).collect::<Vec<_>>(),
                self.spec
            ));
        };
        self.spec = next.clone();
        keys_agree(&self.spec, &ex).map_err(|e| format!("after {op:?} -> {observed:?}: {e}"))?;
        let _ = writeln!(self.log, "    {op:?} -> {observed:?}");
        match (&op, &observed) {
            (
                RateOp::Acquire {
                    marker, permits, ..
                },
                RateRet::Admitted { at_us, .. },
            ) if !self
                .admitted
                .iter()
                .any(|(m, at, _)| m == marker && at == at_us) =>
            {
                self.admitted.push((marker.clone(), *at_us, *permits));
            }
            (RateOp::Cancel { marker, .. }, RateRet::GivenBack(true)) => {
                if let Some(i) = self.admitted.iter().rposition(|(m, _, _)| m == marker) {
                    self.admitted.remove(i);
                }
            }
            _ => {}
        }
        self.last_call = Some((script, client, args, op));
        Ok(())
    }

    async fn step(&mut self, step: &Step) -> Result<(), String> {
        let _ = writeln!(self.log, "  {step:?}");
        match step {
            Step::Acquire {
                client,
                permits,
                wait_us,
                configured,
            } => {
                self.sequence += 1;
                let marker = format!("{}:{}", CLIENTS[*client], self.sequence);
                self.markers[*client].push(marker.clone());
                let limit = configured.then_some(self.configured);
                let cfg = limit.as_ref().map(limit_args);
                let mut args = vec![
                    permits.to_string(),
                    wait_us.map_or_else(|| "-1".to_owned(), |w| w.to_string()),
                    marker.clone(),
                ];
                match cfg {
                    Some(cfg) => args.extend(cfg),
                    None => args.extend(["", "", "", ""].map(str::to_owned)),
                }
                args.extend([self.keys.channel.clone(), "0".to_owned()]);
                let op = RateOp::Acquire {
                    client: CLIENTS[*client].to_owned(),
                    marker,
                    permits: *permits,
                    wait_us: *wait_us,
                    configured: limit,
                };
                self.call(&prl::ACQUIRE, *client, args, op).await
            }
            Step::Cancel { client, nth } => {
                let mine = &self.markers[*client];
                let Some(marker) = mine.len().checked_sub(nth + 1).map(|i| mine[i].clone()) else {
                    return Ok(());
                };
                let op = RateOp::Cancel {
                    client: CLIENTS[*client].to_owned(),
                    marker: marker.clone(),
                };
                self.call(
                    &prl::CANCEL,
                    *client,
                    vec![marker, String::new(), String::new()],
                    op,
                )
                .await
            }
            Step::SetLimit {
                limit,
                only_if_absent,
            } => {
                self.sequence += 1;
                let marker = format!("{}:{}", CLIENTS[0], self.sequence);
                let mut args = limit_args(limit).to_vec();
                args.push(if *only_if_absent { "1" } else { "0" }.to_owned());
                args.push(marker.clone());
                let op = RateOp::SetLimit {
                    limit: *limit,
                    only_if_absent: *only_if_absent,
                    marker,
                };
                self.call(&prl::SET_LIMIT, 0, args, op).await
            }
            Step::Status { client } => {
                let op = RateOp::Status {
                    client: CLIENTS[*client].to_owned(),
                };
                self.call(&prl::STATUS, *client, Vec::new(), op).await
            }
            Step::Sleep(ms) => {
                tokio::time::sleep(Duration::from_millis(*ms)).await;
                Ok(())
            }
            Step::Duplicate => {
                let Some((script, client, args, op)) = self.last_call.clone() else {
                    return Ok(());
                };
                // The spec answers a copy whose marker is still the schedule's last as the first
                // run did (the same moment, nothing charged), and any other as a new request.
                self.call(script, client, args, op).await?;
                Ok(())
            }
            Step::ScriptFlush => {
                self.server
                    .command(&["SCRIPT", "FLUSH"])
                    .await
                    .expect("SCRIPT FLUSH");
                Ok(())
            }
            Step::Save => {
                let ok = self.server.command(&["SAVE"]).await.expect("SAVE");
                assert_eq!(ok.as_str(), Some("OK"), "SAVE");
                self.saved = Some(self.spec.clone());
                Ok(())
            }
            Step::Restart => {
                self.server.restart_from_disk().await.expect("a restart");
                let mut back = self.saved.clone().unwrap_or_default();
                if self.saved.is_none() {
                    back.apply(0, &RateOp::Lose);
                }
                self.spec = back;
                self.resets += 1;
                self.last_call = None;
                Ok(())
            }
            Step::FlushAll => {
                self.server.command(&["FLUSHALL"]).await.expect("FLUSHALL");
                self.spec.apply(0, &RateOp::Lose);
                self.resets += 1;
                // The snapshot on disk stays (FLUSHALL does not rewrite it without a SAVE).
                Ok(())
            }
        }
    }
}

/// Runs `cases` programs on one server; panics with the seed and the program on a disagreement.
fn run_programs(what: &str, default_cases: u32, restarts: bool) {
    let cases = cases_scaled(default_cases);
    let seed = lockkit_suite::checker::model_seed();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    rt.block_on(async {
        let mut server = Some(spawned().await);
        let (mut steps_run, mut admissions, mut windows) = (0usize, 0usize, 0usize);
        for case in 0..cases {
            let case_seed = seed.wrapping_add(u64::from(case));
            let mut rng = Rng(case_seed);
            let (configured, changes, steps) = program(&mut rng, restarts);
            let name = format!("model-rl-{case_seed:x}");
            let mut run = Run {
                server: server.take().expect("the server"),
                name: name.clone(),
                keys: Namespace::default()
                    .object(Kind::RateLimiter, &name)
                    .expect("keys"),
                spec: RateLimiterSpec::new(),
                saved: None,
                configured,
                markers: vec![Vec::new(), Vec::new()],
                sequence: 0,
                last_call: None,
                admitted: Vec::new(),
                resets: 0,
                log: String::new(),
            };
            // A snapshot of an earlier program is of other keys: as good as none.
            run.server.command(&["FLUSHALL"]).await.expect("FLUSHALL");
            run.server.command(&["SAVE"]).await.expect("SAVE");
            run.saved = Some(RateLimiterSpec::new());
            for step in &steps {
                if let Err(err) = run.step(step).await {
                    panic!(
                        "{what}: model and scripts disagree (LOCKKIT_MODEL_SEED={case_seed}, \
                         LOCKKIT_MODEL_CASES=1 replays it):\n{err}\nconfigured {configured:?}\nprogram:\n{}",
                        run.log
                    );
                }
                steps_run += 1;
            }
            // The sliding window, where one limit held throughout.
            if !changes && !configured.per_client {
                let moments: Vec<_> = run
                    .admitted
                    .iter()
                    .map(|(_, at, permits)| (UNIX_EPOCH + Duration::from_micros(*at), *permits))
                    .collect();
                let interval = Duration::from_millis(configured.interval_ms);
                let most = most_per_window(&configured, run.resets);
                let (busiest, at) = busiest_window(&moments, interval);
                assert!(
                    busiest <= most,
                    "{what}: {busiest} permits in the window of {interval:?} from {at:?} (at most \
                     {most}; LOCKKIT_MODEL_SEED={case_seed}):\n{}",
                    run.log
                );
                windows += 1;
            }
            admissions += run.admitted.len();
            server = Some(run.server);
        }
        println!(
            "{what}: {cases} programs, {steps_run} steps, {admissions} admissions, {windows} \
             sliding-window checks passed (LOCKKIT_MODEL_SEED={seed})"
        );
    });
    save_model_cases("rate_limiter", cases);
}

/// Programs of every step but restarts: requests (often delivered twice), give-backs, limits
/// set and changed, status, real waits longer than the interval, `SCRIPT FLUSH`, `FLUSHALL`.
#[test]
fn rate_limiter_agrees_with_its_model() {
    run_programs("rate limiter", 100, false);
}

/// As above, with `SAVE` and restarts from that snapshot: the schedule rolls back with the spec,
/// and no window holds more than one extra window's worth per restart.
#[test]
fn rate_limiter_agrees_with_its_model_across_restarts() {
    run_programs("rate limiter across restarts", 25, true);
}
