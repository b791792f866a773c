//! Quiet logs (issue 29): with a subscriber that shows INFO and up, fred's `log` records
//! included (what the README's `tracing_subscriber::fmt::init()` installs), normal operation logs
//! no warning from any crate, and an outage logs one lockkit event when the connection is lost and
//! one when it is back.
//!
//! The events are caught by a small subscriber of this file ([`Captured`]), installed for the
//! whole process, together with a `log` logger that records fred's records as events of their
//! target (what `tracing-log`'s bridge does). Each test runs its program in a runtime of its own
//! and drops it at the end, as a program's `main` returns: what the program's background tasks
//! log while it ends is caught too. The tests take turns ([`SERIAL`]): the capture is global.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use futures::StreamExt;
use std::time::Duration;

use lockkit::{Client, ConnectFailure, Error};
use lockkit_suite::{spawned, unique, until_waiting, within};
use lockkit_testkit::{FaultProxy, RedisServer, ServerOptions};

const HANG: Duration = Duration::from_secs(60);

/// One captured event.
#[derive(Debug, Clone)]
struct Event {
    level: tracing::Level,
    target: String,
    text: String,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.level, self.target, self.text)
    }
}

/// Every event at INFO and up, from `tracing` and from `log`.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<Event>>>);

impl Captured {
    fn push(&self, event: Event) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(event);
    }

    /// The events so far, left in place.
    fn peek(&self) -> Vec<Event> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn take(&self) -> Vec<Event> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?} "));
        } else {
            self.0.push_str(&format!("{}={value:?} ", field.name()));
        }
    }
}

impl tracing::Subscriber for Captured {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::INFO
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut fields = Fields(String::new());
        event.record(&mut fields);
        self.push(Event {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            text: fields.0.trim_end().to_owned(),
        });
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

impl log::Log for Captured {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Info
    }
    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let level = match record.level() {
            log::Level::Error => tracing::Level::ERROR,
            log::Level::Warn => tracing::Level::WARN,
            _ => tracing::Level::INFO,
        };
        self.push(Event {
            level,
            target: record.target().to_owned(),
            text: record.args().to_string(),
        });
    }
    fn flush(&self) {}
}

/// The process-wide capture, installed once.
fn captured() -> &'static Captured {
    static CAPTURED: OnceLock<Captured> = OnceLock::new();
    CAPTURED.get_or_init(|| {
        let captured = Captured::default();
        tracing::subscriber::set_global_default(captured.clone())
            .expect("no other subscriber in this test binary");
        log::set_boxed_logger(Box::new(captured.clone()))
            .expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Info);
        captured
    })
}

/// One test at a time: the capture is global.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `program` as a program's `main` would: in a runtime of its own, dropped when it returns.
/// Returns what it returned and every event logged meanwhile (the runtime's end included).
fn run<T>(program: impl std::future::Future<Output = T>) -> (T, Vec<Event>) {
    let captured = captured();
    captured.take();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let out = runtime.block_on(program);
    drop(runtime);
    (out, captured.take())
}

/// The events at WARN and up.
fn warnings(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|event| event.level <= tracing::Level::WARN)
        .map(ToString::to_string)
        .collect()
}

/// Connect, a lock, a semaphore, an election (observed and led), shutdown: no warning from any
/// crate. Twelve programs in a row: the newcomer saw fred's "Fatal error sending QUIT command to
/// router" in 2 runs of 12 (a `QUIT` still under way when `main` returned).
#[test]
fn a_clean_run_and_shutdown_log_no_warning() {
    let _serial = serial();
    let server = within_blocking(RedisServer::start()).expect("redis-server");
    let url = server.url();
    for round in 0..12 {
        let (result, events) = run(async {
            let client = Client::connect(url.as_str()).await?;
            let lock = client.lock(unique("quiet-lock"));
            let guard = lock.lock().await?;
            guard.unlock().await?;
            let semaphore = client.semaphore(unique("quiet-sem")).with_permits(2)?;
            let permit = semaphore.acquire(1).await?;
            permit.release().await?;
            let election = client.election(unique("quiet-election"));
            let mut observer = election.observe();
            let first = within(HANG, "the observer's first change", observer.next()).await;
            assert!(matches!(first, Some(Ok(_))), "{first:?}");
            let leadership = election.campaign("me").await?;
            let led = within(HANG, "the observer's second change", observer.next()).await;
            assert!(matches!(led, Some(Ok(_))), "{led:?}");
            leadership.resign().await?;
            client.shutdown().await
        });
        result.unwrap_or_else(|err| panic!("round {round}: {err}"));
        assert_eq!(warnings(&events), Vec::<String>::new(), "round {round}");
    }
}

/// A refused connection, a connect timeout and a wrong or superfluous password: the error is
/// returned, and nothing is logged at WARN beside it.
#[test]
fn a_failed_connect_logs_no_warning_beside_its_error() {
    let _serial = serial();
    // Refused: a port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let (result, events) = run(Client::connect(format!("redis://127.0.0.1:{port}")));
    assert!(
        matches!(
            result,
            Err(Error::Connect {
                reason: ConnectFailure::Refused,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(warnings(&events), Vec::<String>::new(), "refused");

    // Timed out: a proxy that accepts and forwards nothing.
    let server = within_blocking(RedisServer::start()).expect("redis-server");
    let (result, events) = run(async {
        let proxy = FaultProxy::start(server.addr()).await.expect("a proxy");
        proxy.pause();
        Client::builder()
            .url(proxy.url())
            .connect_timeout(Duration::from_millis(500))
            .build()
            .await
    });
    assert!(
        matches!(
            result,
            Err(Error::Connect {
                reason: ConnectFailure::TimedOut(_),
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(warnings(&events), Vec::<String>::new(), "timed out");

    // A password the server would ignore (it has none).
    let (result, events) = run(Client::connect(format!(
        "redis://:secret@127.0.0.1:{}",
        server.port()
    )));
    assert!(
        matches!(
            result,
            Err(Error::Connect {
                reason: ConnectFailure::Auth,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(
        warnings(&events),
        Vec::<String>::new(),
        "a password for a server without one"
    );

    // A wrong password.
    let guarded = within_blocking(RedisServer::start_with(
        ServerOptions::new().arg("--requirepass").arg("right"),
    ))
    .expect("redis-server with a password");
    let (result, events) = run(Client::connect(format!(
        "redis://:wrong@127.0.0.1:{}",
        guarded.port()
    )));
    assert!(
        matches!(
            result,
            Err(Error::Connect {
                reason: ConnectFailure::Auth,
                ..
            })
        ),
        "{result:?}"
    );
    assert_eq!(warnings(&events), Vec::<String>::new(), "a wrong password");
}

/// An outage with held locks and waiting tasks: each client logs one warning when its
/// connection is lost and one info event when it is back, whatever the number of commands,
/// connections and failed reconnection attempts in between. fred's own lines about the closed
/// connections are WARN (one per connection: "Broadcasting error"); the guide's filter
/// (`fred=error`, "Logging") keeps them out, and nothing of fred's at ERROR is left.
#[test]
fn an_outage_logs_one_event_when_lost_and_one_when_back() {
    let _serial = serial();
    let (result, events) = run(async {
        let mut server = spawned().await;
        let url = server.url();
        let client = Client::connect(url.as_str()).await?;
        let holder = Client::connect(url.as_str()).await?;
        let name = unique("quiet-outage");
        let held = holder.lock(&name).lock().await?;
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let lock = client.lock(&name);
                tokio::spawn(async move { lock.lock().await.map(drop) })
            })
            .collect();
        until_waiting(&client, 3).await;
        server.kill();
        server.start_again().await.expect("redis-server back");
        drop(held);
        for waiter in waiters {
            let _ = within(HANG, "a waiter", waiter).await;
        }
        // Both clients have both connections back: each has logged its one "back" event.
        within(HANG, "both clients to be back", async {
            while captured()
                .peek()
                .iter()
                .filter(|event| event.text.contains("connection to Redis is back"))
                .count()
                < 2
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        client.shutdown().await?;
        holder.shutdown().await
    });
    let _ = result;
    for event in &events {
        eprintln!("{event}");
    }
    let lockkit = |level: tracing::Level, text: &str| {
        events
            .iter()
            .filter(|event| {
                event.target.starts_with("lockkit")
                    && event.level == level
                    && event.text.contains(text)
            })
            .count()
    };
    assert_eq!(
        lockkit(tracing::Level::WARN, "lost the connection to Redis"),
        2,
        "one per client: {events:#?}"
    );
    assert_eq!(
        lockkit(tracing::Level::INFO, "the connection to Redis is back"),
        2,
        "one per client: {events:#?}"
    );
    // Through the guide's filter (`fred=error`): no other warning but a lease the restart cost.
    let filtered: Vec<String> = events
        .iter()
        .filter(|event| !(event.target.starts_with("fred") && event.level > tracing::Level::ERROR))
        .filter(|event| event.level <= tracing::Level::WARN)
        .filter(|event| !event.text.contains("lost the connection to Redis"))
        .filter(|event| !event.text.contains("lease"))
        .map(ToString::to_string)
        .collect();
    assert_eq!(filtered, Vec::<String>::new());
}

/// Runs `future` on a runtime of its own (the servers outlive the programs' runtimes).
fn within_blocking<T>(future: impl std::future::Future<Output = T>) -> T {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime")
        })
        .block_on(future)
}
