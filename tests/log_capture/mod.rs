//! Capturing every event at INFO and up for the logging tests (`tests/quiet_logs.rs`,
//! `tests/docs_operability.rs`): a small subscriber ([`Captured`]), installed for the whole
//! process, together with a `log` logger that records fred's records as events of their target
//! (what `tracing-log`'s bridge does, and so what the README's `tracing_subscriber::fmt::init()`
//! shows). A test runs its program in a runtime of its own ([`run`]) and drops it at the end, as a
//! program's `main` returns: what background tasks log while it ends is caught too. The tests of
//! one binary take turns ([`serial`]): the capture is global.

#![allow(dead_code)]

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// One captured event.
#[derive(Debug, Clone)]
pub struct Event {
    pub level: tracing::Level,
    pub target: String,
    pub text: String,
}

impl std::fmt::Display for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.level, self.target, self.text)
    }
}

/// Every event at INFO and up, from `tracing` and from `log`.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<Event>>>);

impl Captured {
    fn push(&self, event: Event) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(event);
    }

    /// The events so far, left in place.
    pub fn peek(&self) -> Vec<Event> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub fn take(&self) -> Vec<Event> {
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
pub fn captured() -> &'static Captured {
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
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Runs `program` as a program's `main` would: in a runtime of its own, dropped when it returns.
/// Returns what it returned and every event logged meanwhile (the runtime's end included).
pub fn run<T>(program: impl std::future::Future<Output = T>) -> (T, Vec<Event>) {
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
pub fn warnings(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter(|event| event.level <= tracing::Level::WARN)
        .map(ToString::to_string)
        .collect()
}

/// Runs `future` on a runtime of its own (the servers outlive the programs' runtimes).
pub fn within_blocking<T>(future: impl std::future::Future<Output = T>) -> T {
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
