//! Issue 28's promises about the semaphores' FIFO line and direct grant, tested from the docs
//! alone (README, guide, design, rustdoc of `Semaphore` and `PermitExpirableSemaphore`).

use std::time::{Duration, Instant};

use lockkit::protocol::keys::Kind;
use lockkit::Error;
use lockkit_suite::{client, client_woken_only, spawned, unique, until_waiters_in_redis, within};

const HANG: Duration = Duration::from_secs(60);
/// Longer than the hang guard: a permit held this long is never given back by its lease.
const LEASE: Duration = Duration::from_secs(300);

/// The semaphore's line as `inspect` lists it, head first.
async fn line(observer: &lockkit::Client, kind: Kind, name: &str) -> Vec<String> {
    let objects = observer.inspect(Some(kind), name).await.unwrap();
    objects.into_iter().flat_map(|o| o.waiters).collect()
}

/// Guide: "Waiting calls stand in one line in Redis, across every client, in the order they
/// first found too few permits"; a release grants the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiters_are_served_in_fifo_order_across_clients() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("fifo");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(1).unwrap();
    let holder = sem.acquire_with_lease(1, LEASE).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..4usize {
        let c = client_woken_only(&url).await;
        let s = c.semaphore(&name).with_permits(1).unwrap();
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let p = s.acquire_with_lease(1, LEASE).await.unwrap();
            tx.send(i).unwrap();
            p.release().await.unwrap();
            c
        }));
        until_waiters_in_redis(&observer, Kind::Semaphore, &name, i + 1).await;
    }
    holder.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..4 {
        order.push(within(HANG, "grants", rx.recv()).await.unwrap());
    }
    assert_eq!(order, vec![0, 1, 2, 3]);
    for t in tasks {
        t.await.unwrap();
    }
}

/// Guide: "A waiter for 3 at the head keeps a freed permit for itself even while a waiter for 1
/// behind it could use it"; `available_permits()` counts the kept permits as free; inspect lists
/// the line head first as `<hold marker> for <permits>`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn big_head_is_not_overtaken_and_line_is_listed() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("big-head");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(3).unwrap();
    let one = sem.acquire_with_lease(1, LEASE).await.unwrap();
    let two = sem.acquire_with_lease(2, LEASE).await.unwrap();

    let c3 = client_woken_only(&url).await;
    let s3 = c3.semaphore(&name).with_permits(3).unwrap();
    let big = tokio::spawn(async move { s3.acquire_with_lease(3, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let c1 = client_woken_only(&url).await;
    let s1 = c1.semaphore(&name).with_permits(3).unwrap();
    let small = tokio::spawn(async move { s1.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;

    let listed = line(&observer, Kind::Semaphore, &name).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed[0].ends_with(" for 3"), "head first: {listed:?}");
    assert!(listed[1].ends_with(" for 1"), "{listed:?}");

    one.release().await.unwrap();
    // The release's script decided: the small waiter behind must still be in line.
    assert_eq!(line(&observer, Kind::Semaphore, &name).await.len(), 2);
    assert_eq!(
        sem.available_permits().await.unwrap(),
        1,
        "kept permit counts as free"
    );
    // A zero-wait try does not jump the line and does not join it.
    assert!(sem
        .try_acquire(1, Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .is_none());
    assert_eq!(line(&observer, Kind::Semaphore, &name).await.len(), 2);
    assert!(!small.is_finished() && !big.is_finished());

    two.release().await.unwrap();
    let big = within(HANG, "the head's grant", big)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(big.permits(), 3);
    assert!(!small.is_finished());
    big.release().await.unwrap();
    let small = within(HANG, "the next grant", small)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(small.permits(), 1);
    small.release().await.unwrap();
}

/// Rustdoc: `try_acquire` with a zero wait "is refused while anyone waits, even with permits
/// free, and never joins the line".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn zero_wait_try_never_takes_permits_while_anyone_waits() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("zero-wait");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(4).unwrap();
    let held = sem.acquire_with_lease(3, LEASE).await.unwrap();
    let c = client_woken_only(&url).await;
    let s = c.semaphore(&name).with_permits(4).unwrap();
    let waiter = tokio::spawn(async move { s.acquire_with_lease(2, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let other = client(&url).await;
    let s2 = other.semaphore(&name).with_permits(4).unwrap();
    for _ in 0..5 {
        assert!(s2
            .try_acquire(1, Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
    }
    assert_eq!(line(&observer, Kind::Semaphore, &name).await.len(), 1);
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    held.release().await.unwrap();
    let got = within(HANG, "grant", waiter).await.unwrap().unwrap();
    assert_eq!(got.permits(), 2);
    // Nobody waits now: a zero-wait try takes free permits.
    let p = s2.try_acquire(2, Duration::ZERO, None).await.unwrap();
    assert!(p.is_some());
}

/// Rustdoc of `add_permits`: "Added permits are granted to the line's head while its request
/// fits", holders keep theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn add_permits_grants_the_head() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("add");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(2).unwrap();
    let held = sem.acquire_with_lease(2, LEASE).await.unwrap();
    let c = client_woken_only(&url).await;
    let s = c.semaphore(&name).with_permits(2).unwrap();
    let waiter = tokio::spawn(async move { s.acquire_with_lease(2, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    assert_eq!(sem.add_permits(1).await.unwrap(), 3);
    // One free, head wants 2: still waiting.
    assert_eq!(line(&observer, Kind::Semaphore, &name).await.len(), 1);
    assert_eq!(sem.add_permits(1).await.unwrap(), 4);
    let got = within(HANG, "grant by add_permits", waiter)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.permits(), 2);
    assert!(!held.is_lost());
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    held.release().await.unwrap();
    got.release().await.unwrap();
}

/// Guide: a holder's lease found run out "at the latest by a waiter's own look, every third of
/// its 5 s keep-alive" grants the head. The holder here never releases (a dead client).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dead_holders_permits_reach_the_head_within_the_documented_bound() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("dead");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(1).unwrap();
    let lease = Duration::from_secs(3);
    let started = Instant::now();
    let dead = sem.acquire_with_lease(1, lease).await.unwrap();
    std::mem::forget(dead); // the holder never gives it back
    let c = client_woken_only(&url).await;
    let s = c.semaphore(&name).with_permits(1).unwrap();
    let got = within(
        HANG,
        "grant after the lease",
        s.acquire_with_lease(1, LEASE),
    )
    .await
    .unwrap();
    let took = started.elapsed();
    // Bound: lease + a third of the 5 s keep-alive; 1 s slack for scheduling.
    let bound = lease + Duration::from_millis(5000 / 3) + Duration::from_secs(1);
    assert!(took <= bound, "took {took:?}, documented bound {bound:?}");
    got.release().await.unwrap();
}

/// Guide: "a waiting call that goes away (its future was dropped) leaves the line at once and
/// hands on permits granted to it".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn dropped_waiter_leaves_the_line_and_next_gets_permits() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("dropped");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(1).unwrap();
    let held = sem.acquire_with_lease(1, LEASE).await.unwrap();
    let ca = client_woken_only(&url).await;
    let sa = ca.semaphore(&name).with_permits(1).unwrap();
    let a = tokio::spawn(async move { sa.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let cb = client_woken_only(&url).await;
    let sb = cb.semaphore(&name).with_permits(1).unwrap();
    let b = tokio::spawn(async move { sb.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
    a.abort();
    assert!(a.await.unwrap_err().is_cancelled());
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    held.release().await.unwrap();
    let got = within(HANG, "next waiter's grant", b)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got.permits(), 1);
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    got.release().await.unwrap();
}

/// Guide: "the last try of a wait that ran out leaves the line in the same script": when
/// `try_acquire` returns `None`, its request is already gone, and the next gets the permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn timed_out_waiter_is_out_of_the_line_when_it_returns() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("timed-out");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(1).unwrap();
    let held = sem.acquire_with_lease(1, LEASE).await.unwrap();
    let ca = client_woken_only(&url).await;
    let sa = ca.semaphore(&name).with_permits(1).unwrap();
    let a =
        tokio::spawn(async move { sa.try_acquire(1, Duration::from_secs(3), Some(LEASE)).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let cb = client_woken_only(&url).await;
    let sb = cb.semaphore(&name).with_permits(1).unwrap();
    let b = tokio::spawn(async move { sb.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
    assert!(within(HANG, "timeout", a).await.unwrap().unwrap().is_none());
    let listed = line(&observer, Kind::Semaphore, &name).await;
    assert_eq!(
        listed.len(),
        1,
        "the timed-out call is still listed: {listed:?}"
    );
    held.release().await.unwrap();
    let got = within(HANG, "next waiter's grant", b)
        .await
        .unwrap()
        .unwrap();
    got.release().await.unwrap();
}

/// Guide: "`add_permits(-n)` lowers the total below its request ... takes each waiting request
/// that asks for more than the new total out of the line and wakes that one waiter, which is
/// refused at once; the others keep their place".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lowered_total_refuses_the_impossible_waiter_at_once() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("lowered");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(3).unwrap();
    let held = sem.acquire_with_lease(3, LEASE).await.unwrap();
    let cw = client_woken_only(&url).await;
    let sw = cw.semaphore(&name).with_permits(3).unwrap();
    let big = tokio::spawn(async move { sw.acquire_with_lease(3, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let cv = client_woken_only(&url).await;
    let sv = cv.semaphore(&name).with_permits(3).unwrap();
    let small = tokio::spawn(async move { sv.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
    assert_eq!(sem.add_permits(-1).await.unwrap(), 2);
    match within(HANG, "the refusal", big).await.unwrap() {
        Err(Error::Refused { .. }) => {}
        other => panic!("expected Refused, got {other:?}"),
    }
    let listed = line(&observer, Kind::Semaphore, &name).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(listed[0].ends_with(" for 1"), "{listed:?}");
    assert!(!held.is_lost(), "holders keep their permits");
    held.release().await.unwrap();
    let got = within(HANG, "the small waiter", small)
        .await
        .unwrap()
        .unwrap();
    got.release().await.unwrap();
}

/// `PermitExpirableSemaphore` rustdoc: "a release (by guard or by id) ... grants the freed
/// permits to the head of the line, first come first served"; zero-wait try refused while anyone
/// waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn expirable_release_by_id_grants_the_head_in_order() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("pexp");
    let observer = client(&url).await;
    let slots = observer
        .permit_expirable_semaphore(&name)
        .with_permits(1)
        .unwrap();
    let id = slots.acquire(LEASE).await.unwrap().into_id();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..3usize {
        let c = client_woken_only(&url).await;
        let s = c.permit_expirable_semaphore(&name).with_permits(1).unwrap();
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let p = s.acquire(LEASE).await.unwrap();
            tx.send(i).unwrap();
            p.release().await.unwrap();
            c
        }));
        until_waiters_in_redis(&observer, Kind::PermitExpirableSemaphore, &name, i + 1).await;
    }
    assert!(slots
        .try_acquire(Duration::ZERO, LEASE)
        .await
        .unwrap()
        .is_none());
    // Released by id from another client.
    let other = client(&url).await;
    other
        .permit_expirable_semaphore(&name)
        .release(&id)
        .await
        .unwrap();
    let mut order = Vec::new();
    for _ in 0..3 {
        order.push(within(HANG, "grants", rx.recv()).await.unwrap());
    }
    assert_eq!(order, vec![0, 1, 2]);
    for t in tasks {
        t.await.unwrap();
    }
}

/// The guide's `Semaphore` example and the `PermitExpirableSemaphore` example, as written.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guide_examples_run_as_written() {
    let server = spawned().await;
    let c = client(&server.url()).await;
    within(HANG, "semaphore example", guide_semaphore(c.clone()))
        .await
        .unwrap();
    within(HANG, "psemaphore example", guide_pexp(c.clone()))
        .await
        .unwrap();
    within(HANG, "rustdoc example", rustdoc_semaphore(c.clone()))
        .await
        .unwrap();
}

async fn guide_semaphore(client: lockkit::Client) -> Result<(), lockkit::Error> {
    let exports = client.semaphore("report-exports").with_permits(3)?;
    exports.try_set_permits(3).await?;
    if let Some(permit) = exports
        .try_acquire(1, Duration::from_secs(10), None)
        .await?
    {
        permit.release().await?;
    }
    let permit = exports
        .acquire_with_lease(2, Duration::from_secs(3600))
        .await?;
    assert_eq!(permit.permits(), 2);
    drop(permit);
    exports.add_permits(1).await?;
    println!("{} free", exports.available_permits().await?);
    Ok(())
}

async fn guide_pexp(client: lockkit::Client) -> Result<(), lockkit::Error> {
    let slots = client
        .permit_expirable_semaphore("transcoder-slots")
        .with_permits(4)?;
    let id: String = slots.acquire(Duration::from_secs(600)).await?.into_id();
    slots.update_lease(&id, Duration::from_secs(600)).await?;
    slots.release(&id).await?;
    if let Some(permit) = slots
        .try_acquire(Duration::ZERO, Duration::from_secs(60))
        .await?
    {
        println!("slot {}", permit.id());
        permit.release().await?;
    }
    Ok(())
}

async fn rustdoc_semaphore(client: lockkit::Client) -> Result<(), lockkit::Error> {
    let gpus = client.semaphore("gpus");
    gpus.try_set_permits(4).await?;
    if let Some(permit) = gpus
        .try_acquire(2, Duration::from_secs(30), Some(Duration::from_secs(3600)))
        .await?
    {
        assert_eq!(permit.permits(), 2);
        permit.release().await?;
    }
    Ok(())
}

/// Guide: a waiting call whose "client shut down" leaves the line at once, and the next gets the
/// permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiter_whose_client_shuts_down_leaves_the_line() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("shutdown");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(1).unwrap();
    let held = sem.acquire_with_lease(1, LEASE).await.unwrap();
    let ca = client_woken_only(&url).await;
    let sa = ca.semaphore(&name).with_permits(1).unwrap();
    let a = tokio::spawn(async move { sa.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let cb = client_woken_only(&url).await;
    let sb = cb.semaphore(&name).with_permits(1).unwrap();
    let b = tokio::spawn(async move { sb.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
    within(HANG, "shutdown", ca.shutdown()).await.unwrap();
    assert!(within(HANG, "the shut-down waiter", a)
        .await
        .unwrap()
        .is_err());
    let listed = line(&observer, Kind::Semaphore, &name).await;
    assert_eq!(
        listed.len(),
        1,
        "the shut-down client's call is still listed: {listed:?}"
    );
    held.release().await.unwrap();
    let got = within(HANG, "next waiter's grant", b)
        .await
        .unwrap()
        .unwrap();
    got.release().await.unwrap();
}

/// Design: the walk "grants the head, and the next head, while they fit ... stops at the first
/// head that does not fit": one release of 3 grants a 2, keeps 1 for the next 2, and the 1 behind
/// it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_release_grants_heads_while_they_fit_and_stops_at_the_first_that_does_not() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("walk");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(3).unwrap();
    let held = sem.acquire_with_lease(3, LEASE).await.unwrap();
    let mut waiters = Vec::new();
    for (i, k) in [1u64, 1, 2, 1].into_iter().enumerate() {
        let c = client_woken_only(&url).await;
        let s = c.semaphore(&name).with_permits(3).unwrap();
        waiters.push(tokio::spawn(async move {
            let p = s.acquire_with_lease(k, LEASE).await;
            (p, c)
        }));
        until_waiters_in_redis(&observer, Kind::Semaphore, &name, i + 1).await;
    }
    held.release().await.unwrap();
    // 1 + 1 granted, the 2 does not fit in the 1 left, the 1 behind it must not take it.
    let listed = line(&observer, Kind::Semaphore, &name).await;
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(
        listed[0].ends_with(" for 2") && listed[1].ends_with(" for 1"),
        "{listed:?}"
    );
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    let mut it = waiters.into_iter();
    let (p0, _c0) = within(HANG, "first", it.next().unwrap()).await.unwrap();
    let (p1, _c1) = within(HANG, "second", it.next().unwrap()).await.unwrap();
    let third = it.next().unwrap();
    let fourth = it.next().unwrap();
    assert!(!third.is_finished() && !fourth.is_finished());
    p0.unwrap().release().await.unwrap();
    let (p2, _c2) = within(HANG, "the 2", third).await.unwrap();
    assert_eq!(p2.as_ref().unwrap().permits(), 2);
    assert_eq!(line(&observer, Kind::Semaphore, &name).await.len(), 1);
    p1.unwrap().release().await.unwrap();
    let (p3, _c3) = within(HANG, "the last 1", fourth).await.unwrap();
    p3.unwrap().release().await.unwrap();
    p2.unwrap().release().await.unwrap();
}

/// Rustdoc of `try_set_permits`: "A total that is set serves the line (a waiter waiting since
/// the keys were lost is refused at once if it asks for more)".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_smaller_total_set_after_data_loss_refuses_the_waiter() {
    use fred::interfaces::ClientLike;
    let server = spawned().await;
    let url = server.url();
    let name = unique("lost-total");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(3).unwrap();
    let _held = sem.acquire_with_lease(3, LEASE).await.unwrap();
    let cw = client_woken_only(&url).await;
    let sw = cw.semaphore(&name).with_permits(3).unwrap();
    let waiter = tokio::spawn(async move { sw.acquire_with_lease(3, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let _: () = lockkit_suite::raw(&url)
        .await
        .flushall(false)
        .await
        .unwrap();
    let setter = client(&url).await;
    assert!(setter.semaphore(&name).try_set_permits(2).await.unwrap());
    match within(HANG, "the refusal", waiter).await.unwrap() {
        Err(Error::Refused { .. }) => {}
        other => panic!("expected Refused, got {other:?}"),
    }
}

/// Guide: a waiting call that goes away "hands on permits granted to it": a waiter dropped right
/// after a release granted it its permits (before or after it heard of the grant) leaves them to
/// the next in line; nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_dropped_as_it_is_granted_hands_the_permits_on() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("dropped-grant");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(2).unwrap();
    for _ in 0..10 {
        let held = sem.acquire_with_lease(2, LEASE).await.unwrap();
        let ca = client_woken_only(&url).await;
        let sa = ca.semaphore(&name).with_permits(2).unwrap();
        let a = tokio::spawn(async move { sa.acquire_with_lease(2, LEASE).await });
        until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
        let cb = client_woken_only(&url).await;
        let sb = cb.semaphore(&name).with_permits(2).unwrap();
        let b = tokio::spawn(async move { sb.acquire_with_lease(2, LEASE).await });
        until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
        held.release().await.unwrap(); // grants A in the same script
        a.abort();
        let _ = a.await; // cancelled, or finished and its guard dropped
        let got = within(HANG, "B after A went away", b)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(got.permits(), 2);
        assert_eq!(sem.available_permits().await.unwrap(), 0);
        got.release().await.unwrap();
        assert_eq!(sem.available_permits().await.unwrap(), 2, "nothing leaked");
    }
}

/// Guide: "a grant is on probation (a grantee that died unseen costs the others at most 5 s,
/// never its lease)". The head's client is frozen (its runtime thread blocked, its connections
/// open, so the grant's message counts as heard) just before the release grants it its permits;
/// the waiter behind it must get them within the 5 s probation (+1 s slack), not after the
/// grantee's 300 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grantee_that_died_unseen_costs_the_next_at_most_the_probation() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("probation");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(1).unwrap();
    let held = sem.acquire_with_lease(1, LEASE).await.unwrap();

    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel::<()>();
    let (url_a, name_a) = (url.clone(), name.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = client_woken_only(&url_a).await;
            let s = c.semaphore(&name_a).with_permits(1).unwrap();
            let _a = tokio::spawn(async move { s.acquire_with_lease(1, LEASE).await });
            let _ = freeze_rx.await;
            std::thread::sleep(Duration::from_secs(120)); // dead, unseen
        });
    });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let cb = client_woken_only(&url).await;
    let sb = cb.semaphore(&name).with_permits(1).unwrap();
    let b = tokio::spawn(async move { sb.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
    freeze_tx.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await; // let the frozen thread block
    let released = Instant::now();
    held.release().await.unwrap(); // grants the frozen head
    let listed = line(&observer, Kind::Semaphore, &name).await;
    assert_eq!(listed.len(), 1, "the frozen head was granted: {listed:?}");
    let got = within(HANG, "B after the probation", b)
        .await
        .unwrap()
        .unwrap();
    let took = released.elapsed();
    let bound = Duration::from_secs(5) + Duration::from_secs(1);
    assert!(
        took <= bound,
        "took {took:?}, documented bound 5 s (+1 s slack)"
    );
    got.release().await.unwrap();
}

/// Guide: waiting calls stand in line "in the order they first found too few permits"; a
/// `try_acquire` with a non-zero wait is a waiting call too: with a free permit kept for the head,
/// it does not take it, it queues behind the head.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_try_acquire_queues_behind_the_head() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("try-wait");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(3).unwrap();
    let held = sem.acquire_with_lease(2, LEASE).await.unwrap();
    let ch = client_woken_only(&url).await;
    let sh = ch.semaphore(&name).with_permits(3).unwrap();
    let head = tokio::spawn(async move { sh.acquire_with_lease(2, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let ct = client_woken_only(&url).await;
    let st = ct.semaphore(&name).with_permits(3).unwrap();
    let tail = tokio::spawn(async move {
        st.try_acquire(1, Duration::from_secs(120), Some(LEASE))
            .await
    });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
    let listed = line(&observer, Kind::Semaphore, &name).await;
    assert!(
        listed[0].ends_with(" for 2") && listed[1].ends_with(" for 1"),
        "{listed:?}"
    );
    assert_eq!(sem.available_permits().await.unwrap(), 1);
    assert!(!tail.is_finished());
    held.release().await.unwrap();
    let h = within(HANG, "head", head).await.unwrap().unwrap();
    let t = within(HANG, "tail", tail).await.unwrap().unwrap().unwrap();
    assert_eq!((h.permits(), t.permits()), (2, 1));
    assert_eq!(sem.available_permits().await.unwrap(), 0);
}

/// `available_permits` rustdoc: "Permits of holds whose lease has ended are given back first, and
/// granted to the line's head while it fits" (here a `PermitExpirableSemaphore` permit whose lease
/// `update_lease` cut to 1 ms): when the call returns, the head holds them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn available_permits_grants_an_ended_lease_to_the_head() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("avail-grant");
    let observer = client(&url).await;
    let slots = observer
        .permit_expirable_semaphore(&name)
        .with_permits(1)
        .unwrap();
    let id = slots.acquire(LEASE).await.unwrap().into_id();
    let cw = client_woken_only(&url).await;
    let sw = cw
        .permit_expirable_semaphore(&name)
        .with_permits(1)
        .unwrap();
    let waiter = tokio::spawn(async move { sw.acquire(LEASE).await });
    until_waiters_in_redis(&observer, Kind::PermitExpirableSemaphore, &name, 1).await;
    assert!(slots
        .update_lease(&id, Duration::from_millis(1))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await; // the 1 ms lease ends
    assert_eq!(
        slots.available_permits().await.unwrap(),
        0,
        "granted to the head"
    );
    let listed = line(&observer, Kind::PermitExpirableSemaphore, &name).await;
    assert!(listed.is_empty(), "{listed:?}");
    let got = within(HANG, "the head", waiter).await.unwrap().unwrap();
    got.release().await.unwrap();
    assert!(matches!(
        slots.release(&id).await,
        Err(Error::NotHeld { .. })
    ));
}

/// FIFO also among the waiting calls of one client (the line is per call, not per client).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_order_among_calls_of_one_client() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("fifo-one-client");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(2).unwrap();
    let holder = sem.acquire_with_lease(2, LEASE).await.unwrap();
    let c = client_woken_only(&url).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, k) in [2u64, 1, 2, 1, 1].into_iter().enumerate() {
        let s = c.semaphore(&name).with_permits(2).unwrap();
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let p = s.acquire_with_lease(k, LEASE).await.unwrap();
            tx.send(i).unwrap();
            p.release().await.unwrap();
        }));
        until_waiters_in_redis(&observer, Kind::Semaphore, &name, i + 1).await;
    }
    holder.release().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(within(HANG, "grants", rx.recv()).await.unwrap());
    }
    // 0 (2) alone; then 1 (1) — 2 (2) can't join it; 2 alone; then 3 and 4 together (either
    // may report first).
    assert_eq!(&order[..3], &[0, 1, 2], "{order:?}");
    for t in tasks {
        t.await.unwrap();
    }
}

/// Guide: a lowered total takes the impossible head out of the line; the permits it was
/// gathering are no longer kept for it, so the next request that fits gets them (within the
/// hang guard: the docs do not say whether the lowering script itself grants them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_the_impossible_head_is_refused_the_next_gets_the_free_permits() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("refused-head");
    let observer = client(&url).await;
    let sem = observer.semaphore(&name).with_permits(4).unwrap();
    let _held = sem.acquire_with_lease(1, LEASE).await.unwrap();
    let ch = client_woken_only(&url).await;
    let sh = ch.semaphore(&name).with_permits(4).unwrap();
    let head = tokio::spawn(async move { sh.acquire_with_lease(4, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let cn = client_woken_only(&url).await;
    let sn = cn.semaphore(&name).with_permits(4).unwrap();
    let next = tokio::spawn(async move { sn.acquire_with_lease(2, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 2).await;
    assert_eq!(sem.add_permits(-1).await.unwrap(), 3);
    let now_line = line(&observer, Kind::Semaphore, &name).await;
    let now_free = sem.available_permits().await.unwrap();
    assert!(matches!(
        within(HANG, "refusal", head).await.unwrap(),
        Err(Error::Refused { .. })
    ));
    let got = within(HANG, "next", next).await.unwrap().unwrap();
    assert_eq!(got.permits(), 2);
    println!("right after add_permits(-1): line {now_line:?}, free {now_free}");
}

/// Guide: "A holder that crashes gives its permits back when its lease ends (with the watchdog:
/// one watchdog timeout after its last renewal)", and the head gets them at the latest at its
/// own look, every third of its 5 s keep-alive. The holder's client (3 s watchdog timeout) is
/// frozen with its connections open; bound from the freeze: 3 s + 5/3 s (+1 s slack).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_watchdog_holder_hands_on_within_the_documented_bound() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("frozen-holder");
    let observer = client(&url).await;
    let watchdog = Duration::from_secs(3);
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<()>();
    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel::<()>();
    let (url_a, name_a) = (url.clone(), name.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = lockkit_suite::client_with(&url_a, watchdog).await;
            let s = c.semaphore(&name_a).with_permits(1).unwrap();
            let _permit = s.acquire(1).await.unwrap();
            held_tx.send(()).unwrap();
            let _ = freeze_rx.await;
            std::thread::sleep(Duration::from_secs(120)); // dead, unseen
        });
    });
    within(HANG, "the holder", held_rx).await.unwrap();
    let sem = observer.semaphore(&name).with_permits(1).unwrap();
    assert_eq!(sem.available_permits().await.unwrap(), 0);
    let cb = client_woken_only(&url).await;
    let sb = cb.semaphore(&name).with_permits(1).unwrap();
    let b = tokio::spawn(async move { sb.acquire_with_lease(1, LEASE).await });
    until_waiters_in_redis(&observer, Kind::Semaphore, &name, 1).await;
    let frozen = Instant::now();
    freeze_tx.send(()).unwrap();
    let got = within(HANG, "B after the frozen holder", b)
        .await
        .unwrap()
        .unwrap();
    let took = frozen.elapsed();
    let bound = watchdog + Duration::from_millis(5000 / 3) + Duration::from_secs(1);
    assert!(took <= bound, "took {took:?}, documented bound {bound:?}");
    got.release().await.unwrap();
}
