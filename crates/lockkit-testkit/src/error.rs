//! The error type of the test kit.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Everything that can go wrong while starting, controlling or talking to a
/// test `redis-server`, or while running a [`FaultProxy`](crate::FaultProxy).
///
/// A variant with an underlying error returns it from
/// [`source`](std::error::Error::source) and leaves its text out of its own
/// `Display`, so reporters that walk the chain show it once (`{err:?}` of an
/// `unwrap` shows both).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TestkitError {
    /// No `redis-server` executable could be found.
    #[error(
        "redis-server binary not found ({searched}); install the Debian package `redis-server` \
         (`apt-get install redis-server`), run scripts/test (which installs it), or set \
         REDIS_SERVER_BIN to the path of a redis-server executable"
    )]
    BinaryNotFound {
        /// Where the binary was looked for.
        searched: String,
    },

    /// An I/O operation failed.
    #[error("{context}")]
    Io {
        /// What the kit was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// The `redis-server` process exited during startup because its port was
    /// already taken (usually by a concurrently running test).
    #[error(
        "redis-server could not listen on port {port} (address in use); log tail:\n{log_tail}"
    )]
    PortInUse {
        /// The port that was tried.
        port: u16,
        /// The last lines of the server's log.
        log_tail: String,
    },

    /// The `redis-server` process exited during startup.
    #[error("redis-server on port {port} exited during startup ({status}); log tail:\n{log_tail}")]
    StartupFailed {
        /// The port the server was told to listen on.
        port: u16,
        /// The exit status of the process.
        status: String,
        /// The last lines of the server's log and standard streams.
        log_tail: String,
    },

    /// The `redis-server` process did not answer `PING` in time.
    #[error(
        "redis-server on port {port} did not answer PING within {timeout:?}; log tail:\n{log_tail}"
    )]
    StartupTimeout {
        /// The port the server was told to listen on.
        port: u16,
        /// How long the kit waited.
        timeout: Duration,
        /// The last lines of the server's log.
        log_tail: String,
    },

    /// Every attempt to start a server on a fresh port failed because the
    /// port was taken.
    #[error("redis-server could not be started after {attempts} attempts on fresh ports")]
    PortsExhausted {
        /// How many ports were tried.
        attempts: usize,
        /// The error of the last attempt.
        #[source]
        last: Box<TestkitError>,
    },

    /// The operation needs a running server, but it was killed.
    #[error("redis-server on port {port} is not running (it was killed)")]
    NotRunning {
        /// The port reserved for the server.
        port: u16,
    },

    /// Sending a signal to the server process failed.
    #[error("sending SIG{signal} to pid {pid} failed: {detail}")]
    Signal {
        /// The signal name without the `SIG` prefix, e.g. `STOP`.
        signal: &'static str,
        /// The target process id.
        pid: u32,
        /// What went wrong.
        detail: String,
    },

    /// The reply of a server could not be parsed as RESP2.
    #[error("protocol error talking to {addr}: {detail}")]
    Protocol {
        /// The address of the server.
        addr: SocketAddr,
        /// What was wrong with the reply.
        detail: String,
    },

    /// A command did not complete in time.
    #[error("command to {addr} did not complete within {timeout:?}")]
    CommandTimeout {
        /// The address of the server.
        addr: SocketAddr,
        /// How long the kit waited.
        timeout: Duration,
    },

    /// The server closed the connection before replying in full.
    #[error("connection to {addr} closed before a complete reply was received")]
    ConnectionClosed {
        /// The address of the server.
        addr: SocketAddr,
    },

    /// Test certificates ([`TestCertificates`](crate::TestCertificates)) could not be made.
    #[error("generating test certificates failed: {detail}")]
    Certificates {
        /// What went wrong.
        detail: String,
    },

    /// A Redis Cluster could not be formed, or did not reach the state asked for in time.
    #[error("redis cluster: {detail}")]
    Cluster {
        /// What went wrong, with the replies or states seen.
        detail: String,
    },

    /// A Sentinel group could not be started, or did not reach the state asked for in time.
    #[error("redis sentinel group: {detail}")]
    Sentinel {
        /// What went wrong.
        detail: String,
    },

    /// A temporary directory could not be created.
    #[error("creating temporary directory under {base}")]
    TempDir {
        /// The parent directory.
        base: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },

    /// A Redis container (feature `testcontainers`) could not be started or inspected: no
    /// Docker engine answered, the image could not be pulled, or the server did not start.
    #[error("{context} (a Docker engine is needed: is it running, and may this user use it?)")]
    Container {
        /// What the kit was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// A setting of the kit is wrong, e.g. `LOCKKIT_TEST_PROFILE` names no profile.
    #[error("{0}")]
    Config(String),

    /// The environment variable `LOCKKIT_TEST_BACKEND` names no backend this build has.
    #[error("LOCKKIT_TEST_BACKEND={value:?}: {detail}")]
    Backend {
        /// The variable's value.
        value: String,
        /// What is wrong with it and what is accepted.
        detail: String,
    },
}

impl TestkitError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        TestkitError::Io {
            context: context.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::io;
    use std::path::PathBuf;

    use super::TestkitError;

    fn io_error() -> io::Error {
        io::Error::new(
            io::ErrorKind::PermissionDenied,
            "permission denied on purpose",
        )
    }

    /// Every variant with a source, built with one: its `Display` must not repeat the source's.
    #[test]
    fn display_never_repeats_the_source() {
        let variants = [
            TestkitError::io("spawning redis-server", io_error()),
            TestkitError::PortsExhausted {
                attempts: 3,
                last: Box::new(TestkitError::NotRunning { port: 1 }),
            },
            TestkitError::TempDir {
                base: PathBuf::from("/tmp"),
                source: io_error(),
            },
            TestkitError::Container {
                context: "starting the container".into(),
                source: Box::new(io_error()),
            },
        ];
        for err in &variants {
            let shown = err.to_string();
            let source = err.source().map(ToString::to_string);
            let source = source.unwrap_or_else(|| panic!("{err:?} has a source"));
            assert!(
                !shown.contains(&source),
                "{err:?}: `{shown}` repeats its source `{source}`"
            );
        }
    }
}
