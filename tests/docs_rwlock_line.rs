//! Issue 28's promises about `ReadWriteLock`'s waiting — a FIFO line with direct grant — tested
//! from the docs alone: README, the guide ("ReadWriteLock — many readers or one writer",
//! "Ownership and re-entry", the command-line tool's "Waiters, by kind", "Metrics and tracing")
//! and the rustdoc of `ReadWriteLock`, `LockGuard` and `Inspection`.
//!
//! Every waiting call runs on a client of its own built with `client_woken_only` (no recheck
//! within the test's time), so a call that gets in was granted by what the docs say grants it,
//! not by a periodic look. Holds are taken with a fixed lease longer than any hang guard, unless
//! the test is about leases.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use lockkit::protocol::keys::Kind;
use lockkit::{Client, Error, Inspection, LockGuard};
use lockkit_suite::{client, client_with, client_woken_only, spawned, unique, within};
use tokio::task::JoinHandle;

const HANG: Duration = Duration::from_secs(60);
/// Longer than the hang guard: a hold taken with it is never given back by its lease.
const LEASE: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
}

impl Mode {
    fn word(self) -> &'static str {
        match self {
            Mode::Read => "read",
            Mode::Write => "write",
        }
    }
}

/// The lock as `inspect` sees it (it must exist).
async fn inspected(observer: &Client, name: &str) -> Inspection {
    let found = observer
        .inspect(Some(Kind::ReadWriteLock), name)
        .await
        .unwrap();
    found
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no read-write lock {name:?} in Redis"))
}

/// The lock's line as `inspect` lists it, head first.
async fn line(observer: &Client, name: &str) -> Vec<String> {
    match observer.inspect(Some(Kind::ReadWriteLock), name).await {
        Ok(found) => found.into_iter().flat_map(|o| o.waiters).collect(),
        Err(err) => panic!("inspect {name}: {err}"),
    }
}

/// Waits (hang guard) until the line has exactly `count` entries.
async fn until_line(observer: &Client, name: &str, count: usize) {
    lockkit_suite::until_waiters_in_redis(observer, Kind::ReadWriteLock, name, count).await;
}

/// Whether a listed waiter is an acquire call of `client` asking for `mode`.
fn entry_of(entry: &str, client: &Client, mode: Mode) -> bool {
    entry.starts_with(&format!("{}:", client.id()))
        && entry.ends_with(&format!(" for {}", mode.word()))
}

/// Whether a holder listed by `inspect` is a hold of `client` in `mode`.
fn holder_of(holder: &lockkit::Holder, client: &Client, mode: Mode) -> bool {
    holder.owner.starts_with(&format!("{}:", client.id()))
        && holder.access.as_deref() == Some(mode.word())
}

/// One acquire call waiting on a client of its own.
struct Waiter {
    client: Client,
    call: JoinHandle<Result<LockGuard, Error>>,
}

/// Starts `mode`'s waiting acquire (fixed lease) on a new client, and waits until it stands in
/// the line as its `position`-th entry (1-based: the line then has `position` entries).
async fn queue(url: &str, observer: &Client, name: &str, mode: Mode, position: usize) -> Waiter {
    let client = client_woken_only(url).await;
    let rw = client.read_write_lock(name);
    let call = tokio::spawn(async move {
        match mode {
            Mode::Read => rw.read_lock_with_lease(LEASE).await,
            Mode::Write => rw.write_lock_with_lease(LEASE).await,
        }
    });
    until_line(observer, name, position).await;
    let listed = line(observer, name).await;
    assert!(
        entry_of(&listed[position - 1], &client, mode),
        "the new call stands last in line as `{} for {}`: {listed:?}",
        client.id(),
        mode.word()
    );
    Waiter { client, call }
}

impl Waiter {
    async fn granted(self, what: &str) -> (LockGuard, Client) {
        let guard = within(HANG, what, self.call).await.unwrap().unwrap();
        (guard, self.client)
    }
}

// ---------------------------------------------------------------------------------------------
// 1. FIFO: a waiting writer holds back the readers that come after it.
// ---------------------------------------------------------------------------------------------

/// Guide: "a writer that waits holds back the readers that come after it, so a steady stream of
/// readers never starves a writer"; "a reader that came after a writer never enters before it".
/// The lock is read-held (a read could be shared right now), a writer waits, three readers
/// arrive: they queue behind the writer, which gets in first when the reader leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_writer_holds_back_readers_that_come_after_it() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("writer-first");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let first = rw.read_lock_with_lease(LEASE).await.unwrap();

    let writer = queue(&url, &observer, &name, Mode::Write, 1).await;
    let mut readers = Vec::new();
    for i in 0..3 {
        readers.push(queue(&url, &observer, &name, Mode::Read, 2 + i).await);
    }
    // A waiting try (non-zero wait) arriving now queues too, and its wait runs out.
    let late = client_woken_only(&url).await;
    let late_try = late
        .read_write_lock(&name)
        .try_read_lock(Duration::from_millis(500), Some(LEASE))
        .await
        .unwrap();
    assert!(late_try.is_none(), "a reader overtook the waiting writer");

    assert!(rw.is_locked().await.unwrap() && !rw.is_write_locked().await.unwrap());
    assert!(!writer.call.is_finished());
    assert!(
        readers.iter().all(|r| !r.call.is_finished()),
        "a reader got in"
    );
    let holders = inspected(&observer, &name).await.holders;
    assert_eq!(holders.len(), 1, "only the first reader holds: {holders:?}");

    first.unlock().await.unwrap();
    let (w, _cw) = writer.granted("the writer").await;
    assert!(rw.is_write_locked().await.unwrap());
    assert_eq!(
        line(&observer, &name).await.len(),
        3,
        "the readers still wait"
    );
    assert!(readers.iter().all(|r| !r.call.is_finished()));

    w.unlock().await.unwrap();
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.granted("a reader after the writer").await);
    }
    let holders = inspected(&observer, &name).await.holders;
    assert_eq!(
        holders.len(),
        3,
        "the three readers read together: {holders:?}"
    );
    for (g, _c) in guards {
        g.unlock().await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// 2. A writer's release grants every reader at the head, up to the next writer.
// ---------------------------------------------------------------------------------------------

/// Guide: whatever frees the lock "grants the line in the same script: the head writer when the
/// lock is free, or every reader at the head of the line up to the next writer while no writer
/// holds". Line R1 R2 R3 W4 R5 behind a writer: its release lets R1–R3 in together; W4 waits for
/// all three, and R5 (a reader, though the lock is read-held) stays behind W4.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writers_release_grants_every_reader_at_the_head_up_to_the_next_writer() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("reader-batch");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let w0 = rw.write_lock_with_lease(LEASE).await.unwrap();

    let r1 = queue(&url, &observer, &name, Mode::Read, 1).await;
    let r2 = queue(&url, &observer, &name, Mode::Read, 2).await;
    let r3 = queue(&url, &observer, &name, Mode::Read, 3).await;
    let w4 = queue(&url, &observer, &name, Mode::Write, 4).await;
    let r5 = queue(&url, &observer, &name, Mode::Read, 5).await;

    w0.unlock().await.unwrap();
    // Granted in the releasing script: when `unlock` returns, the three readers are out of the
    // line and hold the lock.
    let after = inspected(&observer, &name).await;
    assert_eq!(after.waiters.len(), 2, "{after:?}");
    assert!(
        entry_of(&after.waiters[0], &w4.client, Mode::Write),
        "{after:?}"
    );
    assert!(
        entry_of(&after.waiters[1], &r5.client, Mode::Read),
        "{after:?}"
    );

    let (g1, c1) = r1.granted("R1").await;
    let (g2, c2) = r2.granted("R2").await;
    let (g3, c3) = r3.granted("R3").await;
    // Inside together.
    let holders = inspected(&observer, &name).await.holders;
    assert_eq!(holders.len(), 3, "{holders:?}");
    for c in [&c1, &c2, &c3] {
        assert!(
            holders.iter().any(|h| holder_of(h, c, Mode::Read)),
            "{holders:?}"
        );
    }
    assert!(!w4.call.is_finished() && !r5.call.is_finished());

    // The writer behind them waits until every one of them has left.
    g1.unlock().await.unwrap();
    g2.unlock().await.unwrap();
    assert_eq!(line(&observer, &name).await.len(), 2);
    assert!(!w4.call.is_finished());
    g3.unlock().await.unwrap();
    let (g4, _c4) = w4.granted("W4 after the readers").await;
    assert!(rw.is_write_locked().await.unwrap());
    assert!(!r5.call.is_finished(), "R5 came after W4");
    g4.unlock().await.unwrap();
    let (g5, _c5) = r5.granted("R5").await;
    g5.unlock().await.unwrap();
}

/// The same at scale: twenty readers on twenty clients wait behind a writer, a writer behind
/// them; one release lets all twenty in together, and the writer waits for the last of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_writers_release_lets_twenty_waiting_readers_in_together() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("many-readers");
    let observer = client(&url).await;
    let held = observer
        .read_write_lock(&name)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    let mut readers = Vec::new();
    for i in 0..20 {
        readers.push(queue(&url, &observer, &name, Mode::Read, i + 1).await);
    }
    let writer = queue(&url, &observer, &name, Mode::Write, 21).await;
    held.unlock().await.unwrap();
    assert_eq!(line(&observer, &name).await.len(), 1);
    let mut guards = Vec::new();
    for r in readers {
        guards.push(r.granted("a reader of the batch").await);
    }
    assert_eq!(inspected(&observer, &name).await.holders.len(), 20);
    let last = guards.pop().unwrap();
    for (g, _c) in guards {
        g.unlock().await.unwrap();
    }
    assert!(!writer.call.is_finished(), "one reader still holds");
    last.0.unlock().await.unwrap();
    let (w, _c) = writer.granted("the writer").await;
    w.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 3. The last reader's release grants the head writer.
// ---------------------------------------------------------------------------------------------

/// Guide: "the last hold's release grants the head writer". Two readers hold, a writer and a
/// reader wait: the first reader's release grants nobody; the last one's grants the writer in
/// its script (the writer is out of the line when `unlock` returns), and the reader behind it
/// still waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_last_readers_release_grants_the_head_writer() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("last-reader");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let other = client(&url).await;
    let ra = rw.read_lock_with_lease(LEASE).await.unwrap();
    let rb = other
        .read_write_lock(&name)
        .read_lock_with_lease(LEASE)
        .await
        .unwrap();
    let writer = queue(&url, &observer, &name, Mode::Write, 1).await;
    let reader = queue(&url, &observer, &name, Mode::Read, 2).await;

    ra.unlock().await.unwrap();
    assert_eq!(
        line(&observer, &name).await.len(),
        2,
        "one reader still holds"
    );
    assert!(!writer.call.is_finished());

    rb.unlock().await.unwrap();
    let listed = line(&observer, &name).await;
    assert_eq!(listed.len(), 1, "granted by the last release: {listed:?}");
    assert!(entry_of(&listed[0], &reader.client, Mode::Read));
    let (w, _cw) = writer.granted("the head writer").await;
    assert!(rw.is_write_locked().await.unwrap());
    assert!(!reader.call.is_finished());
    w.unlock().await.unwrap();
    let (r, _cr) = reader.granted("the reader").await;
    r.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 4. Order follows arrival.
// ---------------------------------------------------------------------------------------------

/// Guide: "Waiting calls are served first come, first served". Five writers on five clients
/// queue behind a writer; each release grants the next in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn writers_are_served_in_arrival_order_across_clients() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("writer-order");
    let observer = client(&url).await;
    let held = observer
        .read_write_lock(&name)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..5usize {
        let c = client_woken_only(&url).await;
        let rw = c.read_write_lock(&name);
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let g = rw.write_lock_with_lease(LEASE).await.unwrap();
            tx.send(i).unwrap();
            g.unlock().await.unwrap();
            c
        }));
        until_line(&observer, &name, i + 1).await;
    }
    held.unlock().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(within(HANG, "the grants", rx.recv()).await.unwrap());
    }
    assert_eq!(order, vec![0, 1, 2, 3, 4]);
    for t in tasks {
        within(HANG, "the writers", t).await.unwrap();
    }
}

/// Guide: "it keeps one order for readers and writers". A mixed line R W R R W R (six clients)
/// behind a writer is served R, W, {R R}, W, R: each writer after the readers that came before
/// it, each reader after the writers that came before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_line_is_served_in_arrival_order() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("mixed-order");
    let observer = client(&url).await;
    let held = observer
        .read_write_lock(&name)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    let modes = [
        Mode::Read,
        Mode::Write,
        Mode::Read,
        Mode::Read,
        Mode::Write,
        Mode::Read,
    ];
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        let c = client_woken_only(&url).await;
        let rw = c.read_write_lock(&name);
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let g = match mode {
                Mode::Read => rw.read_lock_with_lease(LEASE).await,
                Mode::Write => rw.write_lock_with_lease(LEASE).await,
            }
            .unwrap();
            tx.send(i).unwrap();
            g.unlock().await.unwrap();
            c
        }));
        until_line(&observer, &name, i + 1).await;
    }
    held.unlock().await.unwrap();
    let mut order = Vec::new();
    for _ in 0..modes.len() {
        order.push(within(HANG, "the grants", rx.recv()).await.unwrap());
    }
    assert_eq!(&order[..2], &[0, 1], "{order:?}");
    assert_eq!(
        order[2..4].iter().copied().collect::<BTreeSet<_>>(),
        BTreeSet::from([2, 3]),
        "{order:?}"
    );
    assert_eq!(&order[4..], &[4, 5], "{order:?}");
    for t in tasks {
        within(HANG, "the calls", t).await.unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// 5. Re-entry never waits in the line.
// ---------------------------------------------------------------------------------------------

/// Guide: "A re-entry inside a holder's scope is granted at once and never waits in the line";
/// "Take the second read hold inside the first's scope (`guard.scope(lock.read_lock())`)". A
/// reader holds, a writer waits for it: inside the reader's scope `read_lock()` and a zero-wait
/// `try_read_lock` re-enter (the writer waits for this very reader, so a re-entry that queued
/// behind it would never end); outside the scope the same zero-wait try is another owner and is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_re_entry_in_a_read_scope_is_granted_at_once_while_a_writer_waits() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("reenter-read");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let outer = rw.read_lock_with_lease(LEASE).await.unwrap();
    let writer = queue(&url, &observer, &name, Mode::Write, 1).await;

    let (inner, tried, line_inside) = within(
        HANG,
        "the re-entries",
        outer.scope(async {
            let inner = rw.read_lock_with_lease(LEASE).await.unwrap();
            let tried = rw.try_read_lock(Duration::ZERO, Some(LEASE)).await.unwrap();
            let line_inside = line(&observer, &name).await;
            (inner, tried, line_inside)
        }),
    )
    .await;
    assert_eq!(inner.hold_count(), 2);
    let tried = tried.expect("a zero-wait try inside the scope is a re-entry");
    assert_eq!(tried.hold_count(), 3);
    assert_eq!(
        line_inside.len(),
        1,
        "the re-entries did not queue: {line_inside:?}"
    );
    assert!(!writer.call.is_finished());

    // Outside the scope: another owner, behind the waiting writer.
    assert!(rw
        .try_read_lock(Duration::ZERO, Some(LEASE))
        .await
        .unwrap()
        .is_none());

    tried.unlock().await.unwrap();
    inner.unlock().await.unwrap();
    assert!(!writer.call.is_finished(), "the outer hold is still there");
    outer.unlock().await.unwrap();
    let (w, _c) = writer.granted("the writer").await;
    w.unlock().await.unwrap();
}

/// Guide: "Inside a write hold's scope the writer may also take read holds (downgrade)", a
/// re-entry "granted at once and never waits in the line" — even with a reader and a writer
/// waiting. Rustdoc: "releasing its write holds leaves the read holds, so it keeps reading what
/// it wrote while other readers come in": the write release lets the head reader in beside the
/// downgraded hold, and the writer behind waits for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_downgrade_is_granted_at_once_and_the_write_release_lets_the_head_readers_in() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("downgrade");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let write = rw.write_lock_with_lease(LEASE).await.unwrap();
    let reader = queue(&url, &observer, &name, Mode::Read, 1).await;
    let writer = queue(&url, &observer, &name, Mode::Write, 2).await;

    let (again, read) = within(
        HANG,
        "the write re-entry and the downgrade",
        write.scope(async {
            let again = rw.write_lock_with_lease(LEASE).await.unwrap();
            let read = rw.read_lock_with_lease(LEASE).await.unwrap();
            (again, read)
        }),
    )
    .await;
    assert_eq!(again.hold_count(), 2, "a write re-entry");
    assert_eq!(line(&observer, &name).await.len(), 2, "did not queue");
    again.unlock().await.unwrap();
    assert!(!reader.call.is_finished(), "a write hold is left");
    assert!(!reader.call.is_finished());

    write.unlock().await.unwrap();
    let (r, cr) = reader
        .granted("the head reader after the write release")
        .await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.mode.as_deref(), Some("read"), "{state:?}");
    assert!(
        state
            .holders
            .iter()
            .any(|h| holder_of(h, &observer, Mode::Read)),
        "{state:?}"
    );
    assert!(
        state.holders.iter().any(|h| holder_of(h, &cr, Mode::Read)),
        "{state:?}"
    );
    assert_eq!(state.waiters.len(), 1, "{state:?}");
    assert!(!writer.call.is_finished());

    read.unlock().await.unwrap();
    assert!(!writer.call.is_finished(), "the head reader still holds");
    r.unlock().await.unwrap();
    let (w, _cw) = writer.granted("the writer").await;
    w.unlock().await.unwrap();
}

/// Guide: "a task that holds a plain read guard and calls `read_lock()` again outside that
/// guard's scope is another owner, so its request queues behind the waiting writer". Rustdoc:
/// "take the second read hold inside the first's scope, where it is a re-entry, granted at once".
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_second_read_outside_the_scope_queues_behind_a_waiting_writer() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("second-read");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let first = rw.read_lock_with_lease(LEASE).await.unwrap();
    let writer = queue(&url, &observer, &name, Mode::Write, 1).await;

    // Outside the scope, in the same task, a waiting read queues behind the writer (which waits
    // for `first`), and its wait runs out.
    let (second, listed) = tokio::join!(
        rw.try_read_lock(Duration::from_secs(3), Some(LEASE)),
        async {
            until_line(&observer, &name, 2).await;
            line(&observer, &name).await
        }
    );
    assert!(
        second.unwrap().is_none(),
        "the second read overtook the writer"
    );
    assert!(
        entry_of(&listed[0], &writer.client, Mode::Write),
        "{listed:?}"
    );
    assert!(entry_of(&listed[1], &observer, Mode::Read), "{listed:?}");
    assert_eq!(line(&observer, &name).await.len(), 1);

    // Inside the scope it is a re-entry.
    let again = within(HANG, "the re-entry", first.scope(rw.read_lock()))
        .await
        .unwrap();
    assert_eq!(again.hold_count(), 2);
    again.unlock().await.unwrap();
    first.unlock().await.unwrap();
    let (w, _c) = writer.granted("the writer").await;
    w.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 6. A zero-wait try never joins the line.
// ---------------------------------------------------------------------------------------------

/// Guide: "`try_read_lock` / `try_write_lock` with a zero `wait` never joins the line and is
/// refused while anyone waits ahead of it, even if the lock could be shared right now". Readers
/// hold, a writer waits: zero-wait tries (another client's and the reader's own client's,
/// outside its scope) are refused, the line keeps one entry, and none of them is granted later:
/// once the writer has come and gone, nobody holds the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_zero_wait_try_never_joins_the_line_and_is_refused_while_anyone_waits() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("zero-wait");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let held = rw.read_lock_with_lease(LEASE).await.unwrap();
    let writer = queue(&url, &observer, &name, Mode::Write, 1).await;

    let other = client_woken_only(&url).await;
    let orw = other.read_write_lock(&name);
    for _ in 0..5 {
        assert!(orw
            .try_read_lock(Duration::ZERO, Some(LEASE))
            .await
            .unwrap()
            .is_none());
        assert!(orw
            .try_read_lock(Duration::ZERO, None)
            .await
            .unwrap()
            .is_none());
        assert!(orw
            .try_write_lock(Duration::ZERO, Some(LEASE))
            .await
            .unwrap()
            .is_none());
        assert!(rw
            .try_read_lock(Duration::ZERO, Some(LEASE))
            .await
            .unwrap()
            .is_none());
    }
    let listed = line(&observer, &name).await;
    assert_eq!(
        listed.len(),
        1,
        "a zero-wait try joined the line: {listed:?}"
    );
    let holders = inspected(&observer, &name).await.holders;
    assert_eq!(holders.len(), 1, "{holders:?}");

    held.unlock().await.unwrap();
    let (w, _c) = writer.granted("the writer").await;
    w.unlock().await.unwrap();
    // Had a try been left in line, this release would have granted it.
    assert!(
        !rw.is_locked().await.unwrap(),
        "a refused try was granted later"
    );
    assert!(line(&observer, &name).await.is_empty());
    // Nobody waits now: a zero-wait try gets in.
    let got = orw
        .try_read_lock(Duration::ZERO, Some(LEASE))
        .await
        .unwrap();
    got.expect("a free lock with nobody waiting")
        .unlock()
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// 7. A call that gives up leaves the line at once.
// ---------------------------------------------------------------------------------------------

/// Guide: "A waiter whose wait ran out ... leaves the line at once." A writer's waiting try runs
/// out behind a writer, with a reader behind it: when it returns `None` it is no longer listed,
/// the holder's release grants the reader, and the try holds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_call_whose_wait_ran_out_leaves_the_line_at_once() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("ran-out");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let held = rw.write_lock_with_lease(LEASE).await.unwrap();

    let ca = client_woken_only(&url).await;
    let arw = ca.read_write_lock(&name);
    let a = tokio::spawn(async move {
        arw.try_write_lock(Duration::from_secs(3), Some(LEASE))
            .await
    });
    until_line(&observer, &name, 1).await;
    let b = queue(&url, &observer, &name, Mode::Read, 2).await;

    assert!(within(HANG, "the try's wait", a)
        .await
        .unwrap()
        .unwrap()
        .is_none());
    let listed = line(&observer, &name).await;
    assert_eq!(
        listed.len(),
        1,
        "the call that gave up is still listed: {listed:?}"
    );
    assert!(entry_of(&listed[0], &b.client, Mode::Read), "{listed:?}");

    held.unlock().await.unwrap();
    let (g, cb) = b.granted("the reader behind").await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert!(holder_of(&state.holders[0], &cb, Mode::Read), "{state:?}");
    g.unlock().await.unwrap();
    assert!(!rw.is_locked().await.unwrap(), "something was left held");
}

/// Guide: "A waiter ... whose future was dropped, leaves the line at once." A waiting writer's
/// future is dropped (its task aborted) between two waiters: it leaves the line, the holder's
/// release grants the reader behind it, and nothing is left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dropped_waiting_call_leaves_the_line() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("dropped");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let held = rw.write_lock_with_lease(LEASE).await.unwrap();
    let a = queue(&url, &observer, &name, Mode::Write, 1).await;
    let b = queue(&url, &observer, &name, Mode::Read, 2).await;

    a.call.abort();
    assert!(a.call.await.unwrap_err().is_cancelled());
    until_line(&observer, &name, 1).await;
    let listed = line(&observer, &name).await;
    assert!(entry_of(&listed[0], &b.client, Mode::Read), "{listed:?}");

    held.unlock().await.unwrap();
    let (g, cb) = b.granted("the reader behind").await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert!(holder_of(&state.holders[0], &cb, Mode::Read), "{state:?}");
    g.unlock().await.unwrap();
    assert!(!rw.is_locked().await.unwrap(), "something was left held");
}

/// Guide: whatever frees the lock includes "a waiter that gave up with a grant unclaimed": a
/// waiting writer dropped right as the release granted it the lock (before or after it heard)
/// hands it on to the readers behind it, and nothing leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_dropped_as_it_is_granted_hands_the_lock_on() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("dropped-grant");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    for round in 0..8 {
        let held = rw.write_lock_with_lease(LEASE).await.unwrap();
        let a = queue(&url, &observer, &name, Mode::Write, 1).await;
        let b = queue(&url, &observer, &name, Mode::Read, 2).await;
        let c = queue(&url, &observer, &name, Mode::Read, 3).await;
        held.unlock().await.unwrap(); // grants A in the same script
        a.call.abort();
        let _ = a.call.await; // cancelled, or finished and its guard dropped
        let (gb, _cb) = b.granted("B after A went away").await;
        let (gc, _cc) = c.granted("C after A went away").await;
        let holders = inspected(&observer, &name).await.holders;
        assert_eq!(holders.len(), 2, "round {round}: {holders:?}");
        assert!(holders.iter().all(|h| h.access.as_deref() == Some("read")));
        gb.unlock().await.unwrap();
        gc.unlock().await.unwrap();
        assert!(
            !rw.is_locked().await.unwrap(),
            "round {round}: A's grant leaked"
        );
    }
}

/// Guide: a call that gives up leaves the line and "gives back a grant that was on its way to
/// it" (the `Lock` section, which the read-write lock's line follows: "as a `Lock`'s waiters
/// do"); whatever frees the lock includes "a waiter that gave up with a grant unclaimed". A
/// writer's try runs out at about the moment the holder's release grants it the lock, round
/// after round: either the try returns the lock (and the reader behind waits for it), or it
/// returns `None` and the reader behind gets the lock; nothing is ever left held.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_try_that_runs_out_as_it_is_granted_never_strands_the_lock() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("ran-out-race");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let ca = client_woken_only(&url).await;
    let (mut got, mut missed) = (0, 0);
    for round in 0..16u64 {
        let held = rw.write_lock_with_lease(LEASE).await.unwrap();
        let arw = ca.read_write_lock(&name);
        let wait = Duration::from_millis(200);
        let a = tokio::spawn(async move { arw.try_write_lock(wait, Some(LEASE)).await });
        until_line(&observer, &name, 1).await;
        let b = queue(&url, &observer, &name, Mode::Read, 2).await;
        // Not synchronisation: the release is aimed around the try's deadline to make the race.
        tokio::time::sleep(Duration::from_millis(150 + round * 7)).await;
        held.unlock().await.unwrap();
        match within(HANG, "the try", a).await.unwrap().unwrap() {
            Some(guard) => {
                got += 1;
                assert!(!b.call.is_finished(), "round {round}: B overtook A's hold");
                guard.unlock().await.unwrap();
            }
            None => missed += 1,
        }
        let (g, _cb) = b.granted("the reader behind").await;
        let holders = inspected(&observer, &name).await.holders;
        assert_eq!(holders.len(), 1, "round {round}: {holders:?}");
        g.unlock().await.unwrap();
        assert!(!rw.is_locked().await.unwrap(), "round {round}: left held");
        assert!(line(&observer, &name).await.is_empty(), "round {round}");
    }
    println!("the try got the lock {got} times, gave up {missed} times");
}

/// Guide (`Lock`, whose line the read-write lock's waiters share): "a call that gives up
/// (timeout, dropped future, shutdown) leaves the set at once". A waiting call whose client is
/// shut down fails with `Error::Shutdown`, is no longer listed, and the holder's release grants
/// the call behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiting_call_whose_client_shuts_down_leaves_the_line() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("shutdown");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let held = rw.write_lock_with_lease(LEASE).await.unwrap();
    let a = queue(&url, &observer, &name, Mode::Write, 1).await;
    let b = queue(&url, &observer, &name, Mode::Read, 2).await;
    within(HANG, "the shutdown", a.client.shutdown())
        .await
        .unwrap();
    assert!(matches!(
        within(HANG, "the call", a.call).await.unwrap(),
        Err(Error::Shutdown)
    ));
    let listed = line(&observer, &name).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert!(entry_of(&listed[0], &b.client, Mode::Read), "{listed:?}");
    held.unlock().await.unwrap();
    let (g, _c) = b.granted("the reader behind").await;
    g.unlock().await.unwrap();
    assert!(!rw.is_locked().await.unwrap());
}

/// Guide: a call "takes the lock only from the head"; while no writer holds, the readers at the
/// head are let in, and a waiter's own look "grants the line". A reader stands behind a writer
/// whose try runs out while only readers hold: once the writer has left, the reader at the head
/// gets in beside the readers, with no release.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_left_at_the_head_by_a_writer_that_gave_up_joins_the_readers() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("head-reader");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let held = rw.read_lock_with_lease(LEASE).await.unwrap();
    let ca = client_woken_only(&url).await;
    let arw = ca.read_write_lock(&name);
    let a = tokio::spawn(async move {
        arw.try_write_lock(Duration::from_secs(2), Some(LEASE))
            .await
    });
    until_line(&observer, &name, 1).await;
    let b = queue(&url, &observer, &name, Mode::Read, 2).await;
    assert!(within(HANG, "the writer's try", a)
        .await
        .unwrap()
        .unwrap()
        .is_none());
    let right_after = line(&observer, &name).await;
    let (g, cb) = b.granted("the reader at the head").await;
    println!("line right after the writer gave up: {right_after:?}");
    let holders = inspected(&observer, &name).await.holders;
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert!(holders.iter().any(|h| holder_of(h, &cb, Mode::Read)));
    assert!(!held.is_lost());
    g.unlock().await.unwrap();
    held.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 8. force_unlock grants the line.
// ---------------------------------------------------------------------------------------------

/// Guide: "`force_unlock()` removes every hold, readers and writer alike, and grants the lock to
/// the line as a release does". A writer holds, R1 R2 W3 wait: the force-unlock lets R1 and R2
/// in together (in its own script), W3 waits; the old writer's `unlock` reports `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_unlock_of_a_writer_grants_the_head_readers() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("force-w");
    let observer = client(&url).await;
    let old = observer
        .read_write_lock(&name)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    let r1 = queue(&url, &observer, &name, Mode::Read, 1).await;
    let r2 = queue(&url, &observer, &name, Mode::Read, 2).await;
    let w3 = queue(&url, &observer, &name, Mode::Write, 3).await;

    let admin = client(&url).await;
    assert!(admin.read_write_lock(&name).force_unlock().await.unwrap());
    let listed = line(&observer, &name).await;
    assert_eq!(listed.len(), 1, "granted by the force-unlock: {listed:?}");
    assert!(entry_of(&listed[0], &w3.client, Mode::Write), "{listed:?}");
    let (g1, _c1) = r1.granted("R1").await;
    let (g2, _c2) = r2.granted("R2").await;
    assert_eq!(inspected(&observer, &name).await.holders.len(), 2);
    assert!(!w3.call.is_finished());
    assert!(matches!(old.unlock().await, Err(Error::NotHeld { .. })));
    g1.unlock().await.unwrap();
    g2.unlock().await.unwrap();
    let (g3, _c3) = w3.granted("W3").await;
    g3.unlock().await.unwrap();
}

/// The same with readers holding: the force-unlock grants the head writer; the reader behind it
/// waits; the readers' `unlock` reports `NotHeld`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn force_unlock_of_readers_grants_the_head_writer() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("force-r");
    let observer = client(&url).await;
    let rw = observer.read_write_lock(&name);
    let ra = rw.read_lock_with_lease(LEASE).await.unwrap();
    let rb = rw.read_lock_with_lease(LEASE).await.unwrap();
    let w = queue(&url, &observer, &name, Mode::Write, 1).await;
    let r = queue(&url, &observer, &name, Mode::Read, 2).await;

    let admin = client(&url).await;
    assert!(admin.read_write_lock(&name).force_unlock().await.unwrap());
    let listed = line(&observer, &name).await;
    assert_eq!(listed.len(), 1, "granted by the force-unlock: {listed:?}");
    let (gw, cw) = w.granted("the writer").await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert!(holder_of(&state.holders[0], &cw, Mode::Write), "{state:?}");
    assert!(!r.call.is_finished());
    assert!(matches!(ra.unlock().await, Err(Error::NotHeld { .. })));
    assert!(matches!(rb.unlock().await, Err(Error::NotHeld { .. })));
    gw.unlock().await.unwrap();
    let (gr, _cr) = r.granted("the reader").await;
    gr.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// 9. inspect lists the line.
// ---------------------------------------------------------------------------------------------

/// Guide, "Waiters, by kind": a read-write lock's waiters are listed "one per waiting call ...
/// as `<owner> for read` or `<owner> for write`, head of the line first"; an owner is
/// `<client id>:<sequence>`; `Inspection::waiters_listed` says the list is the waiters.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn inspect_lists_the_line_head_first_as_owner_for_read_or_write() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("inspect");
    let observer = client(&url).await;
    let held = observer
        .read_write_lock(&name)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    let modes = [Mode::Read, Mode::Write, Mode::Read, Mode::Write];
    let mut waiters = Vec::new();
    for (i, mode) in modes.into_iter().enumerate() {
        waiters.push(queue(&url, &observer, &name, mode, i + 1).await);
    }
    // Two waiting calls of one client are two entries, each its own owner.
    let extra = waiters[0].client.read_write_lock(&name);
    let extra_call = tokio::spawn(async move { extra.read_lock_with_lease(LEASE).await });
    until_line(&observer, &name, 5).await;

    let state = inspected(&observer, &name).await;
    assert_eq!(state.kind, Kind::ReadWriteLock);
    assert!(state.waiters_listed, "{state:?}");
    assert_eq!(state.mode.as_deref(), Some("write"), "{state:?}");
    assert_eq!(state.waiters.len(), 5, "{state:?}");
    for (i, (w, mode)) in waiters.iter().zip(modes).enumerate() {
        assert!(entry_of(&state.waiters[i], &w.client, mode), "{state:?}");
    }
    assert!(entry_of(&state.waiters[4], &waiters[0].client, Mode::Read));
    let owners: BTreeSet<&str> = state
        .waiters
        .iter()
        .map(|w| w.rsplit_once(" for ").unwrap().0)
        .collect();
    assert_eq!(owners.len(), 5, "one owner per waiting call: {state:?}");
    for w in &state.waiters {
        let owner = w.rsplit_once(" for ").unwrap().0;
        let (client_id, seq) = owner.rsplit_once(':').unwrap();
        assert_eq!(client_id.len(), 32, "{w}");
        assert!(client_id.chars().all(|c| c.is_ascii_hexdigit()), "{w}");
        assert!(seq.parse::<u64>().is_ok(), "{w}");
    }

    // After the release, the head reader holds and the rest of the line is listed in order.
    held.unlock().await.unwrap();
    let mut waiters = waiters.into_iter();
    let first = waiters.next().unwrap();
    let (g0, c0) = first.granted("the head reader").await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.mode.as_deref(), Some("read"), "{state:?}");
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert!(holder_of(&state.holders[0], &c0, Mode::Read), "{state:?}");
    assert_eq!(state.waiters.len(), 4, "{state:?}");
    g0.unlock().await.unwrap();
    for w in waiters {
        let (g, _c) = w.granted("the rest of the line").await;
        g.unlock().await.unwrap();
    }
    within(HANG, "the extra reader", extra_call)
        .await
        .unwrap()
        .unwrap()
        .unlock()
        .await
        .unwrap();
}

// ---------------------------------------------------------------------------------------------
// 10. A dead holder hands on when its lease ends.
// ---------------------------------------------------------------------------------------------

/// A client on a runtime of its own thread that takes a hold in watchdog mode (`watchdog`
/// timeout), reports it, and on `freeze` blocks that thread for good: its watchdog stops
/// renewing, its connections stay open (a frozen VM). Returns the client's id.
async fn frozen_holder(
    url: &str,
    name: &str,
    mode: Mode,
    watchdog: Duration,
    freeze: tokio::sync::oneshot::Receiver<()>,
) -> String {
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<String>();
    let (url, name) = (url.to_owned(), name.to_owned());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = client_with(&url, watchdog).await;
            let rw = c.read_write_lock(&name);
            let _guard = match mode {
                Mode::Read => rw.read_lock().await,
                Mode::Write => rw.write_lock().await,
            }
            .unwrap();
            held_tx.send(c.id().to_owned()).unwrap();
            let _ = freeze.await;
            // Blocks the runtime: nothing of this client runs again.
            std::thread::sleep(Duration::from_secs(600));
        });
    });
    within(HANG, "the holder to take its hold", held_rx)
        .await
        .unwrap()
}

/// Guide: a holder's lease that runs out (a crashed client) "is found by the waiters themselves
/// ... and that check grants the line". A watchdog-mode writer (3 s watchdog timeout) freezes;
/// with no release at all, its lease ends and the line R1 R2 W3 is served: R1 and R2 together,
/// W3 after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_writers_lease_ends_and_the_line_is_granted_without_a_release() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("frozen-writer");
    let observer = client(&url).await;
    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel();
    let dead = frozen_holder(&url, &name, Mode::Write, Duration::from_secs(3), freeze_rx).await;
    let r1 = queue(&url, &observer, &name, Mode::Read, 1).await;
    let r2 = queue(&url, &observer, &name, Mode::Read, 2).await;
    let w3 = queue(&url, &observer, &name, Mode::Write, 3).await;
    freeze_tx.send(()).unwrap();

    let (g1, _c1) = r1.granted("R1 after the dead writer's lease").await;
    let (g2, _c2) = r2.granted("R2 with R1").await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.holders.len(), 2, "{state:?}");
    assert!(
        state.holders.iter().all(|h| !h.owner.starts_with(&dead)),
        "{state:?}"
    );
    assert_eq!(state.waiters.len(), 1, "{state:?}");
    assert!(!w3.call.is_finished());
    g1.unlock().await.unwrap();
    g2.unlock().await.unwrap();
    let (g3, _c3) = w3.granted("W3").await;
    g3.unlock().await.unwrap();
}

/// Guide: "Every hold expires on its own ... A reader that crashes loses its hold when *that
/// hold's* lease ends, however busily the other readers renew theirs; a writer waiting behind it
/// gets in then." A frozen reader and a live reader (both 3 s watchdog, the live one renewing
/// every second) hold, a writer waits: the frozen reader's hold goes, the live one's stays and
/// the writer still waits for it; its release grants the writer.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_frozen_readers_hold_ends_while_another_reader_renews() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("frozen-reader");
    let observer = client(&url).await;
    let watchdog = Duration::from_secs(3);
    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel();
    let dead = frozen_holder(&url, &name, Mode::Read, watchdog, freeze_rx).await;
    let live = client_with(&url, watchdog).await;
    let live_read = live.read_write_lock(&name).read_lock().await.unwrap();
    let writer = queue(&url, &observer, &name, Mode::Write, 1).await;
    freeze_tx.send(()).unwrap();

    within(HANG, "the frozen reader's hold to end", async {
        loop {
            let state = inspected(&observer, &name).await;
            if !state.holders.iter().any(|h| h.owner.starts_with(&dead)) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert!(holder_of(&state.holders[0], &live, Mode::Read), "{state:?}");
    assert_eq!(state.waiters.len(), 1, "{state:?}");
    assert!(!live_read.is_lost());
    assert!(!writer.call.is_finished());

    live_read.unlock().await.unwrap();
    let (w, _c) = writer.granted("the writer").await;
    w.unlock().await.unwrap();
}

/// The same with a fixed lease: a holder that never releases (its guard forgotten) leaves the
/// lock to the line when its lease ends, with no release: the head writer gets in, the reader
/// behind it waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_fixed_lease_that_runs_out_hands_the_lock_to_the_head() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("lease-ends");
    let observer = client(&url).await;
    let holder = client(&url).await;
    let forgotten = holder
        .read_write_lock(&name)
        .read_lock_with_lease(Duration::from_secs(2))
        .await
        .unwrap();
    std::mem::forget(forgotten); // never released
    let writer = queue(&url, &observer, &name, Mode::Write, 1).await;
    let reader = queue(&url, &observer, &name, Mode::Read, 2).await;
    let (w, _cw) = writer.granted("the head writer after the lease").await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert_eq!(state.waiters.len(), 1, "{state:?}");
    assert!(!reader.call.is_finished());
    w.unlock().await.unwrap();
    let (r, _cr) = reader.granted("the reader").await;
    r.unlock().await.unwrap();
}

/// Guide: "A grant is on probation for 5 s until the waiter confirms it ... so a waiter whose
/// client died costs the others at most that." The head writer's client freezes (connections
/// open, so the grant counts as heard) just before the release grants it the lock with a 300 s
/// lease; the reader behind it gets in once the probation is over, long before that lease (the
/// hang guard, 60 s, is far below it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_grant_to_a_frozen_waiter_costs_the_next_the_probation_not_the_lease() {
    let server = spawned().await;
    let url = server.url();
    let name = unique("frozen-grantee");
    let observer = client(&url).await;
    let held = observer
        .read_write_lock(&name)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();

    let (freeze_tx, freeze_rx) = tokio::sync::oneshot::channel::<()>();
    let (frozen_tx, frozen_rx) = tokio::sync::oneshot::channel::<String>();
    let (url_a, name_a) = (url.clone(), name.clone());
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let c = client_woken_only(&url_a).await;
            let rw = c.read_write_lock(&name_a);
            let _waiting = tokio::spawn(async move { rw.write_lock_with_lease(LEASE).await });
            let _ = freeze_rx.await;
            // Said, then frozen at once: nothing of this runtime runs in between.
            frozen_tx.send(c.id().to_owned()).unwrap();
            std::thread::sleep(Duration::from_secs(600));
        });
    });
    until_line(&observer, &name, 1).await;
    let b = queue(&url, &observer, &name, Mode::Read, 2).await;
    freeze_tx.send(()).unwrap();
    let dead = within(HANG, "the freeze", frozen_rx).await.unwrap();
    held.unlock().await.unwrap(); // grants the frozen head
    let listed = line(&observer, &name).await;
    assert_eq!(listed.len(), 1, "the frozen head was granted: {listed:?}");
    assert!(entry_of(&listed[0], &b.client, Mode::Read), "{listed:?}");

    let (g, cb) = b.granted("the reader after the probation").await;
    let state = inspected(&observer, &name).await;
    assert_eq!(state.holders.len(), 1, "{state:?}");
    assert!(holder_of(&state.holders[0], &cb, Mode::Read), "{state:?}");
    assert!(!state.holders[0].owner.starts_with(&dead));
    g.unlock().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// One message per granted call, nobody else told anything.
// ---------------------------------------------------------------------------------------------

/// Counts `lockkit_pubsub_messages_total` (guide, "Metrics and tracing": "pub/sub messages this
/// process's clients received on objects' channels ... the messages Redis writes to this
/// process because its tasks wait").
#[derive(Default)]
struct MessageCounter(Arc<AtomicU64>);

struct MessageCell(Arc<AtomicU64>);

impl metrics::CounterFn for MessageCell {
    fn increment(&self, value: u64) {
        self.0.fetch_add(value, Ordering::SeqCst);
    }
    fn absolute(&self, value: u64) {
        self.0.store(value, Ordering::SeqCst);
    }
}

impl metrics::Recorder for MessageCounter {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, key: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        if key.name() == "lockkit_pubsub_messages_total" {
            metrics::Counter::from_arc(Arc::new(MessageCell(self.0.clone())))
        } else {
            metrics::Counter::noop()
        }
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        metrics::Histogram::noop()
    }
}

/// Guide: "Each granted call holds the lock at once; its client is told with one message on its
/// own channel, however many of its calls were granted; nobody else is told anything, however
/// many wait." Observed through the documented `lockkit_pubsub_messages_total` of this process,
/// where every waiter's client lives: W0 holds; R1 R1b R2 W3 R4 W5 wait (R1 and R1b on one
/// client). Each release is followed by one message per client it granted something, and no
/// more. The test runs on one thread with a thread-local
/// recorder, so only its own clients are counted.
#[tokio::test(flavor = "current_thread")]
async fn each_grant_is_one_message_to_the_granted_client_and_nobody_else_hears() {
    let counter = MessageCounter::default();
    let count = counter.0.clone();
    let _recorder = metrics::set_default_local_recorder(&counter);
    let messages = || count.load(Ordering::SeqCst);

    let server = spawned().await;
    let url = server.url();
    let name = unique("messages");
    let observer = client(&url).await;
    let held = observer
        .read_write_lock(&name)
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    let r1 = queue(&url, &observer, &name, Mode::Read, 1).await;
    // A second waiting call of R1's client: granted in the same release, told in the same message.
    let r1b = {
        let rw = r1.client.read_write_lock(&name);
        tokio::spawn(async move { rw.read_lock_with_lease(LEASE).await })
    };
    until_line(&observer, &name, 2).await;
    let r2 = queue(&url, &observer, &name, Mode::Read, 3).await;
    let w3 = queue(&url, &observer, &name, Mode::Write, 4).await;
    let r4 = queue(&url, &observer, &name, Mode::Read, 5).await;
    let w5 = queue(&url, &observer, &name, Mode::Write, 6).await;
    assert_eq!(messages(), 0, "nothing was granted yet");

    // A window in which a message nobody should get could arrive; it only widens what the
    // assertions after it can see, they do not depend on it.
    let settle = || tokio::time::sleep(Duration::from_millis(300));

    held.unlock().await.unwrap(); // grants R1, R1b and R2
    let (g1, _c1) = r1.granted("R1").await;
    let g1b = within(HANG, "R1b", r1b).await.unwrap().unwrap();
    let (g2, _c2) = r2.granted("R2").await;
    settle().await;
    assert_eq!(
        messages(),
        2,
        "three granted calls of two clients, two messages"
    );

    g1.unlock().await.unwrap(); // grants nobody
    g1b.unlock().await.unwrap(); // grants nobody
    settle().await;
    assert_eq!(messages(), 2, "a release that grants nobody tells nobody");
    g2.unlock().await.unwrap(); // grants W3
    let (g3, _c3) = w3.granted("W3").await;
    settle().await;
    assert_eq!(messages(), 3);

    g3.unlock().await.unwrap(); // grants R4
    let (g4, _c4) = r4.granted("R4").await;
    settle().await;
    assert_eq!(messages(), 4);
    g4.unlock().await.unwrap(); // grants W5
    let (g5, _c5) = w5.granted("W5").await;
    settle().await;
    assert_eq!(messages(), 5);
    g5.unlock().await.unwrap(); // grants nobody: the line is empty
    settle().await;
    assert_eq!(
        messages(),
        5,
        "six granted calls, five clients told, five messages in all"
    );
}

// ---------------------------------------------------------------------------------------------
// 11. The docs' examples run as written.
// ---------------------------------------------------------------------------------------------

/// The guide's ReadWriteLock example, verbatim (only the hidden `#` lines are un-hidden).
async fn guide_example(client: lockkit::Client) -> Result<(), lockkit::Error> {
    let prices = client.read_write_lock("prices");

    // Any number of pods read at once.
    let read = prices.read_lock().await?;
    // ... read the price table ...
    read.unlock().await?;

    // One pod rewrites it, alone; wait at most 5 s for the readers to leave.
    if let Some(write) = prices.try_write_lock(Duration::from_secs(5), None).await? {
        // ... rewrite the price table ...
        // Downgrade: inside the write hold's scope, take a read hold; it outlives the write hold,
        // so we keep reading what we wrote while other readers come back in.
        let read = write.scope(prices.read_lock()).await?;
        write.unlock().await?;
        // ... publish the new prices from what we read ...
        read.unlock().await?;
    }

    // A reader cannot upgrade: inside its scope, asking for the write lock is an error, at once,
    // not a wait that could never end.
    let read = prices.read_lock().await?;
    let upgrade = read.scope(prices.write_lock()).await;
    assert!(matches!(upgrade, Err(lockkit::Error::Refused { .. })));
    read.unlock().await?;
    Ok(())
}

/// The rustdoc example of `ReadWriteLock`, verbatim.
async fn rustdoc_type_example(client: lockkit::Client) -> Result<(), lockkit::Error> {
    let prices = client.read_write_lock("prices");
    // Many pods may read at once ...
    let read = prices.read_lock().await?;
    // ... read the price table ...
    read.unlock().await?;

    // ... and one pod at a time rewrites it, while no one reads.
    if let Some(write) = prices.try_write_lock(Duration::from_secs(5), None).await? {
        // ... rewrite the price table ...
        write.unlock().await?;
    }
    Ok(())
}

/// The rustdoc example of `try_read_lock`, verbatim; returns which branch it took.
async fn rustdoc_try_read_example(client: lockkit::Client) -> Result<bool, lockkit::Error> {
    let config = client.read_write_lock("config");
    match config
        .try_read_lock(Duration::from_millis(200), None)
        .await?
    {
        Some(guard) => {
            // ... read the configuration ...
            guard.unlock().await?;
            return Ok(true);
        }
        None => println!("a writer is updating the configuration; using the cached copy"),
    }
    Ok(false)
}

/// The guide's and the rustdoc's examples, run against a real server, and again while other
/// pods read (the writer's 5 s wait covers a reader that leaves) and while a writer holds
/// `config` (the try's `None` branch).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_docs_examples_run_as_written() {
    let server = spawned().await;
    let url = server.url();
    let c = client(&url).await;
    within(HANG, "the guide's example", guide_example(c.clone()))
        .await
        .unwrap();
    within(HANG, "the type's example", rustdoc_type_example(c.clone()))
        .await
        .unwrap();
    assert!(within(
        HANG,
        "try_read_lock's example",
        rustdoc_try_read_example(c.clone())
    )
    .await
    .unwrap());

    // Another pod reads "prices" and leaves after the example's writer started to wait: the
    // writer gets in within its 5 s.
    let pod = client(&url).await;
    let observer = client(&url).await;
    let reading = pod.read_write_lock("prices").read_lock().await.unwrap();
    let example = tokio::spawn(guide_example(c.clone()));
    // The example's first read gets in beside the pod's; its writer then waits in line.
    within(HANG, "the example's writer to wait", async {
        loop {
            let listed = line(&observer, "prices").await;
            if listed.iter().any(|w| entry_of(w, &c, Mode::Write)) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    reading.unlock().await.unwrap();
    within(HANG, "the guide's example with a reader", example)
        .await
        .unwrap()
        .unwrap();

    // A writer holds "config": the try takes its `None` branch after its 200 ms.
    let writing = pod
        .read_write_lock("config")
        .write_lock_with_lease(LEASE)
        .await
        .unwrap();
    assert!(!within(
        HANG,
        "try_read_lock's example, busy",
        rustdoc_try_read_example(c.clone())
    )
    .await
    .unwrap());
    assert!(
        line(&observer, "config").await.is_empty(),
        "the try left the line"
    );
    writing.unlock().await.unwrap();
    assert!(!observer
        .read_write_lock("config")
        .is_locked()
        .await
        .unwrap());
    assert!(!observer
        .read_write_lock("prices")
        .is_locked()
        .await
        .unwrap());
}
