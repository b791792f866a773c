//! Scheduled-job guards on three instances (three clients): `run_exclusive` runs the job on one
//! instance and skips it on the others; `once_per` runs it at most once per window, even when the
//! instances start at different times.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use fred::interfaces::{HashesInterface, KeysInterface};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::{Error, JobOutcome};
use lockkit_suite::{client, raw, redis, unique, within};
use tokio::sync::oneshot;

const HANG: Duration = Duration::from_secs(60);
const DAY: Duration = Duration::from_secs(24 * 3600);

fn mark_key(name: &str) -> String {
    Namespace::default()
        .object(Kind::OnceMark, name)
        .unwrap()
        .key
}

async fn instances(url: &str) -> Vec<lockkit::Client> {
    vec![client(url).await, client(url).await, client(url).await]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_exclusive_runs_on_one_instance_and_skips_on_the_others() {
    let redis = redis().await;
    let pods = instances(&redis.url()).await;
    let name = unique("job-exclusive");
    let runs = Arc::new(AtomicUsize::new(0));

    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let first = {
        let (pod, name, runs) = (pods[0].clone(), name.clone(), Arc::clone(&runs));
        tokio::spawn(async move {
            pod.run_exclusive(name, |lease| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = started_tx.send(());
                let _ = finish_rx.await;
                assert!(!lease.is_lost());
                "report"
            })
            .await
        })
    };
    within(HANG, "the first run to start", started_rx)
        .await
        .unwrap();
    // While it runs, the other instances skip at once.
    for pod in &pods[1..] {
        let outcome = pod
            .run_exclusive(name.clone(), |_| async {
                runs.fetch_add(1, Ordering::SeqCst)
            })
            .await
            .unwrap();
        assert!(outcome.is_skipped(), "{outcome:?}");
    }
    finish_tx.send(()).unwrap();
    let outcome = within(HANG, "the first run", first).await.unwrap().unwrap();
    assert_eq!(outcome, JobOutcome::Ran("report"));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert!(
        !pods[0].lock(&name).is_locked().await.unwrap(),
        "released after the job"
    );

    // The next schedule: another instance can run it now.
    let outcome = pods[2]
        .run_exclusive(name.clone(), |_| async { 7 })
        .await
        .unwrap();
    assert_eq!(outcome.into_output(), Some(7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_runs_once_across_instances_with_skewed_starts() {
    let redis = redis().await;
    let pods = instances(&redis.url()).await;
    let name = unique("job-once-skewed");
    let runs = Arc::new(AtomicUsize::new(0));

    // Each instance waits for its own "cron tick"; the ticks come at different times.
    let mut ticks = Vec::new();
    let mut tasks = Vec::new();
    for pod in &pods {
        let (tick_tx, tick_rx) = oneshot::channel::<()>();
        ticks.push(tick_tx);
        let (pod, name, runs) = (pod.clone(), name.clone(), Arc::clone(&runs));
        tasks.push(tokio::spawn(async move {
            tick_rx.await.unwrap();
            pod.once_per(name, DAY, || async {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .await
        }));
    }
    let mut tasks = tasks.into_iter();
    let mut ticks = ticks.into_iter();
    // The first instance ticks early and finishes its job before the others tick.
    ticks.next().unwrap().send(()).unwrap();
    let first = within(HANG, "the early instance", tasks.next().unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(first.ran());
    // The mark outlives the job: it expires with the window, it is not released.
    let ttl: i64 = raw(&redis.url()).await.pttl(mark_key(&name)).await.unwrap();
    assert!(ttl > 0, "the window mark must stay after the job ({ttl})");
    // The late instances tick together, after the job ended, within the window: both skip.
    for tick in ticks {
        tick.send(()).unwrap();
    }
    for task in tasks {
        let outcome = within(HANG, "a late instance", task)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(outcome, JobOutcome::Skipped);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_per_runs_once_when_instances_race() {
    let redis = redis().await;
    let pods = instances(&redis.url()).await;
    for round in 0..10 {
        let name = unique(&format!("job-once-race-{round}"));
        let runs = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = pods
            .iter()
            .map(|pod| {
                let (pod, name, runs) = (pod.clone(), name.clone(), Arc::clone(&runs));
                tokio::spawn(async move {
                    pod.once_per(name, DAY, || async {
                        runs.fetch_add(1, Ordering::SeqCst);
                    })
                    .await
                })
            })
            .collect();
        let mut ran = 0;
        for task in tasks {
            if within(HANG, "a racing instance", task)
                .await
                .unwrap()
                .unwrap()
                .ran()
            {
                ran += 1;
            }
        }
        assert_eq!(ran, 1, "round {round}");
        assert_eq!(runs.load(Ordering::SeqCst), 1, "round {round}");
    }
}

#[tokio::test]
async fn a_failed_job_keeps_its_mark_and_the_window_ends_with_the_mark() {
    let redis = redis().await;
    let pods = instances(&redis.url()).await;
    let name = unique("job-once-failed");
    let window = Duration::from_millis(300);
    let failed = pods[0]
        .once_per(name.clone(), window, || async { Err::<(), _>("disk full") })
        .await
        .unwrap();
    assert_eq!(failed, JobOutcome::Ran(Err("disk full")));
    // At most once: the failure does not reopen the window.
    let outcome = pods[1]
        .once_per(name.clone(), window, || async { Ok::<(), &str>(()) })
        .await
        .unwrap();
    assert!(outcome.is_skipped());
    // Once Redis expires the mark, the next window's run goes ahead.
    let raw = raw(&redis.url()).await;
    within(HANG, "the window mark to expire", async {
        while raw.exists::<i64, _>(mark_key(&name)).await.unwrap() > 0 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let outcome = pods[2]
        .once_per(name.clone(), window, || async { "next window" })
        .await
        .unwrap();
    assert_eq!(outcome, JobOutcome::Ran("next window"));
}

#[tokio::test]
async fn bad_input_is_refused_before_the_job_runs() {
    let redis = redis().await;
    let client = client(&redis.url()).await;
    let name = unique("job-bad");
    for window in [Duration::ZERO, Duration::MAX, lockkit::MAX_LEASE * 2] {
        let result = client
            .once_per(name.clone(), window, || async { panic!("must not run") })
            .await;
        assert!(
            matches!(&result, Err(Error::InvalidArgument(msg)) if msg.contains("window")),
            "{window:?}: {result:?}"
        );
    }
    let result = client
        .once_per("", DAY, || async { panic!("must not run") })
        .await;
    assert!(
        matches!(result, Err(Error::InvalidArgument(_))),
        "{result:?}"
    );
    let result = client
        .run_exclusive("", |_| async { panic!("must not run") })
        .await;
    assert!(
        matches!(result, Err(Error::InvalidArgument(_))),
        "{result:?}"
    );

    // The mark's key holding something else is reported, not mistaken for a mark.
    let taken = unique("job-wrongtype");
    let raw = raw(&redis.url()).await;
    let _: i64 = raw.hset(mark_key(&taken), ("f", "v")).await.unwrap();
    let result = client
        .once_per(taken, DAY, || async { panic!("must not run") })
        .await;
    assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
}
