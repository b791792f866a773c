//! Every call that can time out says so in words a user can act on (issue 27 §3, item 13): its
//! text names the operation, the object and the bound that ran out, with its value, never fred's
//! bare "Request timed out" (fred's own command timeout, of the same length, used to race
//! lockkit's deadline and win about half the time).
//!
//! Each call is made against a server that does not answer, frozen (`SIGSTOP`) or paused
//! (`CLIENT PAUSE … ALL`), by a client with a short command timeout. The operation is always the
//! method the user called (`is_locked`, `try_lock`, `unlock`, `available_permits`, `count_down`,
//! `campaign`, `once_per`, ...), never the script or command lockkit ran for it (`EXISTS`,
//! `lock_acquire`, `fenced_lock_acquire`, `semaphore_available`, `latch_count`) (issue 29 §2).
//!
//! The other error paths of issue 29 §2 follow: a server that refuses connections (the error
//! says so, with the address), a shutdown after acquires were cut short (it says "may" for what
//! they may have taken), a port out of range in the URL, and a server that is not Redis.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use futures::future::join_all;
use lockkit::{Client, Error};
use lockkit_suite::{spawned, unique, within};

/// The command timeout of the client under test.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The `wait` of the `try_*` calls: with its round trip for a try in flight (1 s), shorter than
/// the command timeout, so the wait is the bound that runs out.
const WAIT: Duration = Duration::from_millis(500);
/// Hang guard.
const HANG: Duration = Duration::from_secs(60);

/// How Redis stops answering.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// `SIGSTOP`: connections stay open, nothing is read.
    Frozen,
    /// `CLIENT PAUSE … ALL`: commands are read but not run.
    Paused,
}

/// The bound a call's error must name.
#[derive(Debug, Clone, Copy)]
enum Bound {
    Command,
    Wait,
}

impl Bound {
    fn text(self) -> String {
        match self {
            Bound::Command => format!("(the command timeout is {COMMAND_TIMEOUT:?})"),
            Bound::Wait => {
                format!("(the wait was {WAIT:?}, plus at most one round trip for a try in flight)")
            }
        }
    }
}

type Call<'a> = Pin<Box<dyn Future<Output = Result<(), Error>> + 'a>>;

/// One call: what the user called, the operation and object its error must name, the bound.
struct Case<'a> {
    what: &'static str,
    operation: &'static str,
    object: String,
    bound: Bound,
    call: Call<'a>,
}

fn case<'a>(
    what: &'static str,
    operation: &'static str,
    object: &str,
    bound: Bound,
    call: impl Future<Output = Result<(), Error>> + 'a,
) -> Case<'a> {
    Case {
        what,
        operation,
        object: object.to_owned(),
        bound,
        call: Box::pin(call),
    }
}

#[tokio::test]
async fn every_call_that_times_out_names_its_operation_object_and_bound() {
    for fault in [Fault::Frozen, Fault::Paused] {
        walk(fault).await;
    }
}

async fn walk(fault: Fault) {
    use Bound::{Command, Wait};
    let server = spawned().await;
    let c = &within(
        HANG,
        "connect",
        Client::builder()
            .url(server.url())
            .command_timeout(COMMAND_TIMEOUT)
            .build(),
    )
    .await
    .unwrap();
    let n = |what: &str| unique(&format!("texts-{what}"));
    let (lock, fair, fenced, spin, rw) = (n("lock"), n("fair"), n("fenced"), n("spin"), n("rw"));
    let (sem, pes, latch, election, once) = (
        n("semaphore"),
        n("permits"),
        n("latch"),
        n("election"),
        n("once"),
    );
    let multi = [n("multi-a"), n("multi-b")];
    let lease = Duration::from_secs(60);

    // What the release paths release: held before Redis stops answering.
    let held_lock = c.lock(n("held-lock")).lock().await.unwrap();
    let held_lock_name = held_lock.name().to_owned();
    let held_fair = c.fair_lock(n("held-fair")).lock().await.unwrap();
    let held_fair_name = held_fair.name().to_owned();
    let held_spin = c.spin_lock(n("held-spin")).lock().await.unwrap();
    let held_spin_name = held_spin.name().to_owned();
    let held_rw = c.read_write_lock(n("held-rw")).read_lock().await.unwrap();
    let held_rw_name = held_rw.name().to_owned();
    let held_sem_name = n("held-semaphore");
    let held_sem = c
        .semaphore(&held_sem_name)
        .with_permits(2)
        .unwrap()
        .acquire(1)
        .await
        .unwrap();
    let held_pes_name = n("held-permits");
    let slots = c.permit_expirable_semaphore(&held_pes_name);
    slots.try_set_permits(3).await.unwrap();
    let held_pes = slots.acquire(lease).await.unwrap();
    let by_id = slots.acquire(lease).await.unwrap().into_id();
    let held_multi_names = [n("held-multi-a"), n("held-multi-b")];
    let held_multi = c
        .multi_lock([c.lock(&held_multi_names[0]), c.lock(&held_multi_names[1])])
        .lock()
        .await
        .unwrap();
    let leading = [n("leading-a"), n("leading-b")];
    let leadership = c.election(&leading[0]).campaign("a").await.unwrap();
    let handle = leadership.handle();
    let resigning = c.election(&leading[1]).campaign("b").await.unwrap();
    let semaphore = c.semaphore(&sem);
    let expirable = c.permit_expirable_semaphore(&pes);

    match fault {
        Fault::Frozen => server.pause().unwrap(),
        Fault::Paused => {
            server
                .command(&["CLIENT", "PAUSE", "600000", "ALL"])
                .await
                .unwrap();
        }
    }

    let cases: Vec<Case<'_>> = vec![
        // Lock
        case("lock()", "lock", &lock, Command, async {
            c.lock(&lock).lock().await.map(drop)
        }),
        case("try_lock(wait)", "try_lock", &lock, Wait, async {
            c.lock(&lock).try_lock(WAIT, None).await.map(drop)
        }),
        case("is_locked()", "is_locked", &lock, Command, async {
            c.lock(&lock).is_locked().await.map(drop)
        }),
        case(
            "is_held_by_current_task()",
            "is_held_by_current_task",
            &lock,
            Command,
            async { c.lock(&lock).is_held_by_current_task().await.map(drop) },
        ),
        case("hold_count()", "hold_count", &lock, Command, async {
            c.lock(&lock).hold_count().await.map(drop)
        }),
        case("remaining_ttl()", "remaining_ttl", &lock, Command, async {
            c.lock(&lock).remaining_ttl().await.map(drop)
        }),
        case("force_unlock()", "force_unlock", &lock, Command, async {
            c.lock(&lock).force_unlock().await.map(drop)
        }),
        case("unlock()", "unlock", &held_lock_name, Command, async {
            held_lock.unlock().await
        }),
        // FairLock
        case("fair lock()", "lock", &fair, Command, async {
            c.fair_lock(&fair).lock().await.map(drop)
        }),
        case("fair try_lock(wait)", "try_lock", &fair, Wait, async {
            c.fair_lock(&fair).try_lock(WAIT, None).await.map(drop)
        }),
        case("fair is_locked()", "is_locked", &fair, Command, async {
            c.fair_lock(&fair).is_locked().await.map(drop)
        }),
        case("fair unlock()", "unlock", &held_fair_name, Command, async {
            held_fair.unlock().await
        }),
        // FencedLock
        case("fenced lock()", "lock", &fenced, Command, async {
            c.fenced_lock(&fenced).lock().await.map(drop)
        }),
        case("fenced try_lock(wait)", "try_lock", &fenced, Wait, async {
            c.fenced_lock(&fenced).try_lock(WAIT, None).await.map(drop)
        }),
        case(
            "fenced force_unlock()",
            "force_unlock",
            &fenced,
            Command,
            async { c.fenced_lock(&fenced).force_unlock().await.map(drop) },
        ),
        // SpinLock
        case("spin lock()", "lock", &spin, Command, async {
            c.spin_lock(&spin).lock().await.map(drop)
        }),
        case("spin try_lock(wait)", "try_lock", &spin, Wait, async {
            c.spin_lock(&spin).try_lock(WAIT, None).await.map(drop)
        }),
        case("spin is_locked()", "is_locked", &spin, Command, async {
            c.spin_lock(&spin).is_locked().await.map(drop)
        }),
        case("spin unlock()", "unlock", &held_spin_name, Command, async {
            held_spin.unlock().await
        }),
        // ReadWriteLock
        case("read_lock()", "read_lock", &rw, Command, async {
            c.read_write_lock(&rw).read_lock().await.map(drop)
        }),
        case("write_lock()", "write_lock", &rw, Command, async {
            c.read_write_lock(&rw).write_lock().await.map(drop)
        }),
        case("try_read_lock(wait)", "try_read_lock", &rw, Wait, async {
            c.read_write_lock(&rw)
                .try_read_lock(WAIT, None)
                .await
                .map(drop)
        }),
        case("try_write_lock(wait)", "try_write_lock", &rw, Wait, async {
            c.read_write_lock(&rw)
                .try_write_lock(WAIT, None)
                .await
                .map(drop)
        }),
        case(
            "rw is_write_locked()",
            "is_write_locked",
            &rw,
            Command,
            async { c.read_write_lock(&rw).is_write_locked().await.map(drop) },
        ),
        case("rw unlock()", "unlock", &held_rw_name, Command, async {
            held_rw.unlock().await
        }),
        // Semaphore
        case("acquire(1)", "acquire", &sem, Command, async {
            semaphore.acquire(1).await.map(drop)
        }),
        case("try_acquire(1, wait)", "try_acquire", &sem, Wait, async {
            semaphore.try_acquire(1, WAIT, None).await.map(drop)
        }),
        case(
            "available_permits()",
            "available_permits",
            &sem,
            Command,
            async { semaphore.available_permits().await.map(drop) },
        ),
        case(
            "try_set_permits()",
            "try_set_permits",
            &sem,
            Command,
            async { semaphore.try_set_permits(2).await.map(drop) },
        ),
        case("add_permits()", "add_permits", &sem, Command, async {
            semaphore.add_permits(1).await.map(drop)
        }),
        case(
            "permit release()",
            "release",
            &held_sem_name,
            Command,
            async { held_sem.release().await },
        ),
        // PermitExpirableSemaphore
        case(
            "expirable acquire(lease)",
            "acquire",
            &pes,
            Command,
            async { expirable.acquire(lease).await.map(drop) },
        ),
        case(
            "expirable try_acquire(wait)",
            "try_acquire",
            &pes,
            Wait,
            async { expirable.try_acquire(WAIT, lease).await.map(drop) },
        ),
        case(
            "expirable release(id)",
            "release",
            &held_pes_name,
            Command,
            async { slots.release(&by_id).await },
        ),
        case(
            "expirable update_lease(id)",
            "update_lease",
            &held_pes_name,
            Command,
            async { slots.update_lease(&by_id, lease).await.map(drop) },
        ),
        case(
            "expirable permit release()",
            "release",
            &held_pes_name,
            Command,
            async { held_pes.release().await },
        ),
        // CountDownLatch
        case("count_down()", "count_down", &latch, Command, async {
            c.count_down_latch(&latch).count_down().await.map(drop)
        }),
        case("count()", "count", &latch, Command, async {
            c.count_down_latch(&latch).count().await.map(drop)
        }),
        case("try_set_count()", "try_set_count", &latch, Command, async {
            c.count_down_latch(&latch).try_set_count(3).await.map(drop)
        }),
        case("latch wait(timeout)", "wait", &latch, Wait, async {
            c.count_down_latch(&latch).wait(WAIT).await.map(drop)
        }),
        // Election
        case("campaign()", "campaign", &election, Command, async {
            c.election(&election).campaign("x").await.map(drop)
        }),
        case(
            "campaign_with_lease()",
            "campaign_with_lease",
            &election,
            Command,
            async {
                c.election(&election)
                    .campaign_with_lease("x", lease)
                    .await
                    .map(drop)
            },
        ),
        case(
            "try_campaign(wait)",
            "try_campaign",
            &election,
            Wait,
            async {
                c.election(&election)
                    .try_campaign("x", WAIT, None)
                    .await
                    .map(drop)
            },
        ),
        case("leader()", "leader", &election, Command, async {
            c.election(&election).leader().await.map(drop)
        }),
        case("proclaim()", "proclaim", &leading[0], Command, async {
            leadership.proclaim("y").await
        }),
        case(
            "handle proclaim()",
            "proclaim",
            &leading[0],
            Command,
            async { handle.proclaim("z").await },
        ),
        case("resign()", "resign", &leading[1], Command, async {
            resigning.resign().await
        }),
        // MultiLock: the member that met no answer, named with the call's own bound (the
        // command timeout of a call with no wait; the wait of a `try_lock`), not the round trip
        // of the member's one try (the docs-only suite, tests/docs_errors.rs, found that).
        case("multi lock()", "lock", &multi[0], Command, async {
            c.multi_lock([c.lock(&multi[0]), c.lock(&multi[1])])
                .lock()
                .await
                .map(drop)
        }),
        case("multi try_lock(wait)", "try_lock", &multi[0], Wait, async {
            c.multi_lock([c.lock(&multi[0]), c.lock(&multi[1])])
                .try_lock(WAIT, None)
                .await
                .map(drop)
        }),
        case(
            "multi unlock()",
            "unlock",
            &held_multi_names[0],
            Command,
            async { held_multi.unlock().await },
        ),
        // Jobs
        case("once_per()", "once_per", &once, Command, async {
            c.once_per(&once, lease, || async {}).await.map(drop)
        }),
    ];

    let results = within(
        HANG,
        "every call",
        join_all(cases.into_iter().map(|case| async move {
            let Case {
                what,
                operation,
                object,
                bound,
                call,
            } = case;
            (what, operation, object, bound, call.await)
        })),
    )
    .await;
    let mut wrong = Vec::new();
    for (what, operation, object, bound, result) in results {
        let err = match result {
            Err(Error::Redis(err)) if err.is_timeout() && err.is_ambiguous() => err,
            other => {
                wrong.push(format!("{what}: expected a timeout, got {other:?}"));
                continue;
            }
        };
        let text = err.to_string();
        let start =
            format!("redis error during {operation} of `{object}`: no answer from Redis within ");
        let good = text.starts_with(&start)
            && text.ends_with(&bound.text())
            && err.operation() == operation
            && err.object() == Some(object.as_str());
        println!("{fault:?} {what:<28} {text}");
        if !good {
            wrong.push(format!(
                "{what}: `{text}` (expected `{start}…{}`)",
                bound.text()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{fault:?}: {} call(s) do not name their operation, object and bound:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// The top line of `err`, checked to be an ambiguous Redis error.
fn redis_text(what: &str, result: Result<(), Error>) -> String {
    match result {
        Err(Error::Redis(err)) => err.to_string(),
        other => panic!("{what}: expected a Redis error, got {other:?}"),
    }
}

/// Against a server that refuses connections (killed: nothing listens at its port), a call whose
/// bound runs out says that the connection is refused, naming the address, besides its
/// operation, object and bound: not only "no answer from Redis within 1.0s", which reads like a
/// slow or frozen server.
#[tokio::test]
async fn a_call_against_a_refusing_server_says_the_connection_is_refused() {
    let mut server = spawned().await;
    let url = server.url();
    let addr = url.trim_start_matches("redis://").to_owned();
    let c = &within(
        HANG,
        "connect",
        Client::builder()
            .url(&url)
            .command_timeout(Duration::from_secs(1))
            .build(),
    )
    .await
    .unwrap();
    let (lock, sem, latch, election) = (
        unique("refused-lock"),
        unique("refused-semaphore"),
        unique("refused-latch"),
        unique("refused-election"),
    );
    server.kill();
    let wait = Duration::from_millis(500);
    let cases: Vec<(&str, String, Call<'_>)> = vec![
        (
            "try_lock",
            lock.clone(),
            Box::pin(async { c.lock(&lock).try_lock(wait, None).await.map(drop) }),
        ),
        (
            "is_locked",
            lock.clone(),
            Box::pin(async { c.lock(&lock).is_locked().await.map(drop) }),
        ),
        (
            "acquire",
            sem.clone(),
            Box::pin(async { c.semaphore(&sem).acquire(1).await.map(drop) }),
        ),
        (
            "count_down",
            latch.clone(),
            Box::pin(async { c.count_down_latch(&latch).count_down().await.map(drop) }),
        ),
        (
            "campaign",
            election.clone(),
            Box::pin(async { c.election(&election).campaign("x").await.map(drop) }),
        ),
    ];
    let mut wrong = Vec::new();
    for (operation, object, call) in cases {
        let text = redis_text(operation, within(HANG, operation, call).await);
        println!("{text}");
        let start = format!("redis error during {operation} of `{object}`: ");
        if !(text.starts_with(&start) && text.contains(&format!("connection refused by {addr}"))) {
            wrong.push(format!(
                "`{text}` (expected `{start}…connection refused by {addr}…`)"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// A client whose acquires were cut off (no answer in time) gives back at its shutdown what they
/// *may* have taken; if that fails too, the error says "may" for those, and names for sure only
/// the holds it had.
#[tokio::test]
async fn a_shutdown_says_may_for_what_cut_off_acquires_may_have_taken() {
    let server = spawned().await;
    let c = within(
        HANG,
        "connect",
        Client::builder()
            .url(server.url())
            .command_timeout(Duration::from_secs(1))
            .build(),
    )
    .await
    .unwrap();
    let held = unique("shutdown-held");
    let _guard = c.lock(&held).lock().await.unwrap();
    let cut_off = unique("shutdown-cut-off");
    server.pause().unwrap();
    let cut_off_lock = c.lock(&cut_off);
    let attempt = cut_off_lock.try_lock(Duration::from_millis(300), None);
    let attempt = within(HANG, "an acquire against a frozen server", attempt)
        .await
        .map(drop);
    assert!(
        matches!(&attempt, Err(Error::Redis(err)) if err.is_ambiguous()),
        "{attempt:?}"
    );
    let err = match within(HANG, "the shutdown", c.shutdown()).await {
        Err(err) => err,
        Ok(()) => panic!("a shutdown against a frozen server released everything"),
    };
    let text = err.to_string();
    server.resume().unwrap();
    assert_eq!(
        text,
        format!(
            "shutdown could not release 1 hold(s), freed when their leases run out: `{held}`; \
             nor give back what 1 acquire(s) cut short may have taken: `{cut_off}` (freed the \
             same way if taken)"
        )
    );
}

/// A URL with a port out of range is refused before anything is sent, saying so with the URL.
#[tokio::test]
async fn a_port_out_of_range_is_named_with_the_url() {
    let url = "redis://127.0.0.1:99999";
    let err = match Client::connect(url).await {
        Err(err) => err,
        Ok(_) => panic!("connected to port 99999"),
    };
    assert_eq!(
        err.to_string(),
        "invalid argument: invalid Redis URL \"redis://127.0.0.1:99999\": the port `99999` is \
         not a number from 1 to 65535"
    );
}

/// Something that is not Redis (an HTTP server) on the port: the error says that the server
/// does not speak the Redis protocol, not fred's "Decode Error: frame_type: Invalid frame type".
#[tokio::test]
async fn a_server_that_is_not_redis_is_called_so() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let http = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                let _ = socket.read(&mut buf).await;
                let _ = socket
                    .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    let url = format!("redis://{addr}");
    let result = within(
        HANG,
        "connect to an HTTP server",
        Client::builder()
            .url(&url)
            .connect_timeout(Duration::from_secs(5))
            .build(),
    )
    .await;
    http.abort();
    let err = match result {
        Err(err) => err,
        Ok(_) => panic!("connected to an HTTP server"),
    };
    assert_eq!(
        err.to_string(),
        format!(
            "cannot connect to {addr}: the server does not speak the Redis protocol (is it \
             Redis? something else listens at the address in the URL this program gave lockkit)"
        )
    );
}
