//! The rate limiter's concurrent histories, checked for linearizability (issue 30, target 4).
//!
//! Several clients × workers call `acquire`, `try_acquire` (waits of 0 to one interval),
//! `try_admission` and `give_back` on one limiter, against a real `redis-server`, with a fault per
//! run: none, connections cut (a `FaultProxy` per client: every connection closed now and then,
//! and replies of script calls lost after the server ran them), the script cache flushed every
//! 50 ms, and futures dropped at random points (a timeout around the call). Every call is
//! recorded on the suite's clock (`lockkit_suite::linearizability::History`) and the history is
//! checked with `check` against `lockkit_model::rate_limiter::RateHistorySpec`: a violation or an
//! `Unknown` verdict (the search budget, `LOCKKIT_LIN_BUDGET` steps, default 2 million, spent)
//! fails the test. The same run's admitted moments (`RateAdmission::admitted_at`, given-back
//! ones left out) go through the sliding-window check (`lockkit_suite::rate_window`): at most
//! `rate + burst` in any window of one interval.
//!
//! A call that failed or whose future was dropped is pending: it may have taken its permits at a
//! moment nobody saw (`Admitted { at_us: None }`), or nothing; and the give-back the library runs
//! for it in the background is a pending give-back, that may have given them back (or not run). Each run lasts
//! `LOCKKIT_RATE_HISTORY_SECS` seconds (default 2).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lockkit::{RateAdmission, RateLimit};
use lockkit_model::rate_limiter::{Limit, RateHistoryOp, RateHistoryRet, RateHistorySpec};
use lockkit_suite::checker::{now, Record, Rng};
use lockkit_suite::linearizability::{check, Budget, History, Outcome};
use lockkit_suite::rate_window::busiest_window;
use lockkit_suite::{client, spawned, unique, within};
use lockkit_testkit::FaultProxy;

#[path = "history/mod.rs"]
mod history;

type RateHistory = History<RateHistoryOp, RateHistoryRet>;

const HANG: Duration = Duration::from_secs(60);
const CLIENTS: u64 = 3;
const WORKERS: u64 = 3;

/// 20 permits per 200 ms (`T` = 10 ms, a whole number of µs), burst 2.
fn limit() -> RateLimit {
    RateLimit::new(20, Duration::from_millis(200))
        .unwrap()
        .with_burst(2)
        .unwrap()
}

fn model_limit(limit: &RateLimit) -> Limit {
    Limit {
        rate: limit.permits(),
        interval_ms: limit.interval().as_millis() as u64,
        burst: limit.burst(),
        per_client: false,
    }
}

fn secs() -> u64 {
    std::env::var("LOCKKIT_RATE_HISTORY_SECS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(2)
}

fn micros(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).unwrap().as_micros() as u64
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Cut,
    ScriptFlush,
    Drop,
}

/// A call that never answered: it may have taken its permits, at a moment nobody saw; the
/// library gives them back in the background (a pending give-back: `true`, or no effect, which is
/// what `false` is, so the checker is not made to try both).
fn abandoned(
    history: &RateHistory,
    process: u64,
    name: &str,
    call: lockkit_suite::linearizability::Call,
    marker: &str,
) {
    history.abandon(call, vec![RateHistoryRet::Admitted { at_us: None }]);
    let give = history.invoke(
        process,
        name,
        RateHistoryOp::GiveBack {
            marker: marker.to_owned(),
        },
    );
    history.abandon(give, vec![RateHistoryRet::GivenBack(true)]);
}

/// One worker: a random mix of calls until `end`, each recorded.
async fn worker(
    process: u64,
    limiter: lockkit::RateLimiter,
    history: RateHistory,
    fault: Fault,
    end: tokio::time::Instant,
) {
    let name = limiter.name().to_owned();
    let mut rng = Rng::new(process * 7_919 + now() % 10_000);
    let interval_us = limiter.configured_limit().unwrap().interval().as_micros() as u64;
    let mut n = 0;
    while tokio::time::Instant::now() < end {
        n += 1;
        let marker = format!("p{process}-{n}");
        let permits = rng.range(1, 4);
        let kind = rng.range(0, 3);
        let wait_us = match kind {
            0 => None,
            _ => Some([0, 5_000, 30_000, interval_us][rng.range(0, 4) as usize]),
        };
        let op = RateHistoryOp::Acquire {
            marker: marker.clone(),
            permits,
            wait_us,
            wait_floor_us: 0,
        };
        let wait = wait_us.map(Duration::from_micros);
        // With the Drop fault, one call in fifteen is given a few ms before its future is dropped.
        let cut_off = (fault == Fault::Drop && rng.range(0, 15) == 0).then(|| rng.millis(1, 25));
        let call = history.invoke(process, &name, op);
        let started = now();
        let run = async {
            match (kind, wait) {
                (0, _) => limiter.acquire(permits).await.map(|a| Some(Some(a))),
                (1, Some(wait)) => limiter
                    .try_acquire(permits, wait)
                    .await
                    .map(|taken| taken.then_some(None)),
                (_, Some(wait)) => limiter
                    .try_admission(permits, wait)
                    .await
                    .map(|admission| admission.map(Some)),
                _ => unreachable!(),
            }
        };
        // Ok(Some(Some(admission))): admitted, moment seen; Ok(Some(None)): admitted, moment
        // unseen; Ok(None): refused.
        let result: Option<Result<Option<Option<RateAdmission>>, lockkit::Error>> = match cut_off {
            Some(after) => tokio::time::timeout(after, run).await.ok(),
            None => Some(run.await),
        };
        let admission = match result {
            None | Some(Err(_)) => {
                abandoned(&history, process, &name, call, &marker);
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            Some(Ok(None)) => {
                // What the script was given is at least the wait less the whole call.
                let spent = (now() - started).div_ceil(1_000);
                history.amend(call, |op| {
                    if let RateHistoryOp::Acquire { wait_floor_us, .. } = op {
                        *wait_floor_us = wait_us.unwrap_or(0).saturating_sub(spent);
                    }
                });
                history.respond(call, RateHistoryRet::Refused);
                None
            }
            Some(Ok(Some(None))) => {
                history.respond(call, RateHistoryRet::Admitted { at_us: None });
                None
            }
            Some(Ok(Some(Some(admission)))) => {
                history.respond(
                    call,
                    RateHistoryRet::Admitted {
                        at_us: Some(micros(admission.admitted_at())),
                    },
                );
                Some(admission)
            }
        };
        if let Some(admission) = admission {
            if rng.range(0, 3) == 0 {
                let give = history.invoke(
                    process,
                    &name,
                    RateHistoryOp::GiveBack {
                        marker: marker.clone(),
                    },
                );
                match admission.give_back().await {
                    Ok(back) => history.respond(give, RateHistoryRet::GivenBack(back)),
                    Err(_) => history.abandon(give, vec![RateHistoryRet::GivenBack(true)]),
                }
            }
        }
        tokio::time::sleep(rng.millis(0, 8)).await;
    }
}

/// The admitted moments a history saw (`(moment, permits)`), but those given back.
fn admitted_moments(history: &RateHistory) -> Vec<(SystemTime, u64)> {
    let ops = history.operations();
    let given: std::collections::HashSet<String> = ops
        .iter()
        .filter_map(|op| match (&op.op, &op.outcome) {
            (
                RateHistoryOp::GiveBack { marker },
                Outcome::Returned {
                    ret: RateHistoryRet::GivenBack(true),
                    ..
                },
            ) => Some(marker.clone()),
            _ => None,
        })
        .collect();
    ops.iter()
        .filter_map(|op| match (&op.op, &op.outcome) {
            (
                RateHistoryOp::Acquire {
                    marker, permits, ..
                },
                Outcome::Returned {
                    ret: RateHistoryRet::Admitted { at_us: Some(at) },
                    ..
                },
            ) if !given.contains(marker) => {
                Some((UNIX_EPOCH + Duration::from_micros(*at), *permits))
            }
            _ => None,
        })
        .collect()
}

/// One run with `fault`: its figures, the busiest window of its admitted moments, and how many
/// admissions it saw.
async fn run(fault: Fault) -> (history::Figures, u64, usize) {
    let server = spawned().await;
    let name = unique(&format!("rate-history-{fault:?}"));
    let limit = limit();
    let history = RateHistory::new();
    let end = tokio::time::Instant::now() + Duration::from_secs(secs());
    let mut proxies = Vec::new();
    let mut tasks = Vec::new();
    for c in 0..CLIENTS {
        let proxy = FaultProxy::start(server.addr()).await.unwrap();
        let limiter = client(&proxy.url())
            .await
            .rate_limiter(&name)
            .with_limit(limit);
        for w in 0..WORKERS {
            tasks.push(tokio::spawn(worker(
                c * 10 + w,
                limiter.clone(),
                history.clone(),
                fault,
                end,
            )));
        }
        proxies.push(proxy);
    }
    let mut rng = Rng::new(now());
    while tokio::time::Instant::now() < end {
        match fault {
            Fault::None | Fault::Drop => tokio::time::sleep(Duration::from_millis(50)).await,
            Fault::ScriptFlush => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let flushed = server.command(&["SCRIPT", "FLUSH"]).await.unwrap();
                assert!(!flushed.is_error(), "SCRIPT FLUSH: {flushed:?}");
            }
            Fault::Cut => {
                tokio::time::sleep(rng.millis(100, 250)).await;
                let proxy = &proxies[rng.range(0, CLIENTS) as usize];
                if rng.range(0, 2) == 0 {
                    proxy.cut();
                } else {
                    // The server runs the next script call; its reply is lost.
                    proxy.cut_after_request_containing("EVALSHA");
                }
            }
        }
    }
    for task in tasks {
        within(HANG, "a worker", task).await.unwrap();
    }
    drop(proxies);
    let spec = RateHistorySpec::new(model_limit(&limit));
    let figures =
        history::examine_history(&history, |_| spec.clone(), |_| None, history::BOUND_NS, &[]);
    let admitted = admitted_moments(&history);
    let (busiest, _) = busiest_window(&admitted, limit.interval());
    (figures, busiest, admitted.len())
}

/// Histories of the rate limiter under each fault are linearizable (`RateHistorySpec`) and no
/// window of one interval holds more than `rate + burst` admitted permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limiter_histories_under_faults_are_linearizable() {
    let limit = limit();
    let most = limit.permits() + limit.burst();
    let mut failures = String::new();
    let mut total = history::Figures::default();
    for fault in [Fault::None, Fault::Cut, Fault::ScriptFlush, Fault::Drop] {
        let (figures, busiest, admissions) = run(fault).await;
        history::report(&format!("rate limiter ({fault:?})"), &figures);
        println!("RATE {fault:?}: {admissions} admissions seen, busiest window {busiest} (at most {most})");
        if figures.violations + figures.unknown > 0 {
            failures.push_str(&format!(
                "{fault:?}: {} violations, {} unknown\n{}",
                figures.violations, figures.unknown, figures.explain
            ));
        }
        if busiest > most {
            failures.push_str(&format!(
                "{fault:?}: {busiest} permits in one window (at most {most})\n"
            ));
        }
        if admissions < 10 {
            failures.push_str(&format!("{fault:?}: only {admissions} admissions seen\n"));
        }
        total.histories += figures.histories;
        total.operations += figures.operations;
        total.longest = total.longest.max(figures.longest);
        total.violations += figures.violations;
        total.unknown += figures.unknown;
    }
    let record = history::to_record(
        Record::new(
            "history-rate-limiter",
            "rate_limiter_histories_under_faults_are_linearizable",
        ),
        "rate_limiter",
        &total,
    );
    record.save();
    assert!(failures.is_empty(), "{failures}");
}

// === Hand-written histories through the checker ===

const S: u64 = 1_700_000_000_000_000;

fn acquire(marker: &str, permits: u64, wait_us: Option<u64>) -> RateHistoryOp {
    RateHistoryOp::Acquire {
        marker: marker.into(),
        permits,
        wait_us,
        wait_floor_us: wait_us.unwrap_or(0),
    }
}

fn seen(at: u64) -> RateHistoryRet {
    RateHistoryRet::Admitted { at_us: Some(at) }
}

/// 10 per second, burst 1.
fn hand_spec() -> RateHistorySpec {
    RateHistorySpec::new(Limit {
        rate: 10,
        interval_ms: 1000,
        burst: 1,
        per_client: false,
    })
}

/// Each entry: process, op, invoked, answered (None: pending, with `may_have`).
fn hand_history(entries: &[(u64, RateHistoryOp, u64, Option<RateHistoryRet>)]) -> RateHistory {
    let h = RateHistory::new();
    for (p, op, call, ret) in entries {
        let c = h.invoke_at(*p, "r", op.clone(), *call);
        match ret {
            Some(ret) => h.respond_at(c, ret.clone(), call + 10),
            None => h.abandon(c, vec![RateHistoryRet::Admitted { at_us: None }]),
        }
    }
    h
}

fn verdict(h: &RateHistory) -> (usize, usize) {
    let report = check(h, |_| hand_spec(), Budget::default());
    (report.violations(), report.unknown())
}

#[test]
fn a_legal_concurrent_history_is_linearizable() {
    let give = |m: &str| RateHistoryOp::GiveBack { marker: m.into() };
    // Two callers at once take the burst; a third reserves the next slot; a fourth is refused;
    // the reserved one gives back (it is the last); a pending call may or may not have run.
    let h = hand_history(&[
        (1, acquire("a", 1, Some(0)), 0, Some(seen(S))),
        (2, acquire("b", 1, None), 0, Some(seen(S))),
        (3, acquire("c", 1, None), 5, Some(seen(S + 100_000))),
        (
            4,
            acquire("d", 1, Some(1_000)),
            30,
            Some(RateHistoryRet::Refused),
        ),
        (3, give("c"), 50, Some(RateHistoryRet::GivenBack(true))),
        (5, acquire("e", 1, None), 60, None),
        (
            1,
            acquire("f", 1, Some(0)),
            200,
            Some(RateHistoryRet::Admitted { at_us: None }),
        ),
    ]);
    assert_eq!(verdict(&h), (0, 0));
}

#[test]
fn two_admissions_too_close_are_not_linearizable() {
    // Burst 1: two at S, and a third 50 ms later (the next slot is 100 ms after S).
    let h = hand_history(&[
        (1, acquire("a", 1, Some(0)), 0, Some(seen(S))),
        (2, acquire("b", 1, Some(0)), 0, Some(seen(S))),
        (3, acquire("c", 1, None), 5, Some(seen(S + 50_000))),
    ]);
    assert_eq!(verdict(&h), (1, 0));
}

#[test]
fn a_give_back_answered_true_when_not_last_is_not_linearizable() {
    let give = |m: &str| RateHistoryOp::GiveBack { marker: m.into() };
    let h = hand_history(&[
        (1, acquire("a", 1, Some(0)), 0, Some(seen(S))),
        (2, acquire("b", 1, Some(0)), 20, Some(seen(S))),
        (1, give("a"), 40, Some(RateHistoryRet::GivenBack(true))),
    ]);
    assert_eq!(verdict(&h), (1, 0));
}
