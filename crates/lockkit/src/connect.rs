//! Connecting a fred client, and saying in words why it failed ([`Error::Connect`]).
//!
//! fred reports a refused TCP connection as `ErrorKind::IO` with the `Debug` text of the
//! `std::io::Error` as its message, so the `io::ErrorKind` is gone. Rather than parse that text,
//! a failed connect that fred calls an I/O error is followed by a TCP probe of the same addresses:
//! its `io::ErrorKind` tells a refused port from an unreachable host or a name that does not
//! resolve, and a probe that connects shows the trouble lies beyond TCP (TLS, the Redis
//! handshake). The probe runs only after a failure, once per address.
//!
//! Connecting takes at most the connect timeout in all, counted from [`Target::new`]: the
//! connections, the probe and (on a cluster) the pub/sub check share one deadline, and a client
//! that gave up is closed in the background (fred's `QUIT` waits for its own command timeout).
//! A timeout names the time actually spent.

use std::io;
use std::time::Duration;

use fred::error::ErrorKind;
use fred::prelude::{ClientLike, Config, ServerConfig};
use tokio::time::Instant;

use crate::error::{ConnectFailure, Error};

/// The longest a probe of one address may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Where a client connects, for its error messages.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// `host:port` of every server the URL names.
    hosts: Vec<(String, u16)>,
    /// Whether the URL asks for TLS.
    tls: bool,
    /// The connect timeout.
    timeout: Duration,
    /// When connecting started.
    started: Instant,
}

impl Target {
    pub(crate) fn new(config: &Config, tls: bool, timeout: Duration) -> Self {
        let mut hosts: Vec<(String, u16)> = config
            .server
            .hosts()
            .into_iter()
            .map(|server| (server.host.to_string(), server.port))
            .collect();
        // fred lists a cluster's or Sentinel group's `?node=` hosts first and the URL's own host
        // last; show them in the URL's order.
        if !matches!(config.server, ServerConfig::Centralized { .. }) {
            hosts.rotate_right(1);
        }
        Self {
            hosts,
            tls,
            timeout,
            started: Instant::now(),
        }
    }

    /// When connecting must have ended: one connect timeout after it started.
    pub(crate) fn deadline(&self) -> Instant {
        crate::exec::far_or(self.started, self.timeout)
    }

    /// [`Error::Connect`] for a connect that ran out of time, naming the time spent.
    pub(crate) fn timed_out(&self) -> Error {
        self.error(ConnectFailure::TimedOut(self.started.elapsed()), None)
    }

    /// The servers' addresses as the message shows them: `host:port`, IPv6 hosts in brackets,
    /// several separated by `, `.
    pub(crate) fn addr(&self) -> String {
        let shown: Vec<String> = self
            .hosts
            .iter()
            .map(|(host, port)| {
                // An IPv6 address needs brackets (fred keeps the URL's).
                if host.contains(':') && !host.starts_with('[') {
                    format!("[{host}]:{port}")
                } else {
                    format!("{host}:{port}")
                }
            })
            .collect();
        shown.join(", ")
    }

    /// [`Error::Connect`] for this target.
    pub(crate) fn error(
        &self,
        reason: ConnectFailure,
        cause: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Error {
        Error::Connect {
            addr: self.addr(),
            reason,
            cause,
        }
    }

    /// [`Error::Connect`] for a failure that fred reported as `err`, probing the addresses when
    /// fred's error does not say enough.
    pub(crate) async fn failed(&self, err: fred::error::Error) -> Error {
        let reason = match err.kind() {
            ErrorKind::Auth => ConnectFailure::Auth,
            // fred's own timeouts (the TCP connection, the handshake) are the connect timeout too.
            ErrorKind::Timeout => ConnectFailure::TimedOut(self.started.elapsed()),
            #[cfg(feature = "tls")]
            ErrorKind::Tls => ConnectFailure::Tls,
            ErrorKind::IO => match self.probe().await {
                Probe::Failed(reason, None) => return self.error(reason, None),
                Probe::Failed(reason, Some(io)) => return self.error(reason, Some(Box::new(io))),
                Probe::Connected if self.tls => ConnectFailure::Tls,
                Probe::Connected => ConnectFailure::Handshake,
                Probe::Inconclusive => ConnectFailure::Other,
            },
            // Bytes that are not RESP: something else than Redis answered.
            ErrorKind::Protocol if err.details().starts_with("Decode Error") => {
                ConnectFailure::NotRedis
            }
            ErrorKind::Config | ErrorKind::Protocol | ErrorKind::Sentinel | ErrorKind::Cluster => {
                ConnectFailure::Handshake
            }
            // Redis answered the handshake with an error (`SELECT 99`: `ERR DB index is out of
            // range`).
            _ if is_error_reply(err.details()) => ConnectFailure::Handshake,
            _ => ConnectFailure::Other,
        };
        let cause: Option<Box<dyn std::error::Error + Send + Sync>> = match reason {
            // The reason says it all; fred's text would only repeat it.
            ConnectFailure::TimedOut(_) | ConnectFailure::NotRedis => None,
            _ => Some(Box::new(err)),
        };
        self.error(reason, cause)
    }

    /// Tries a TCP connection to each address in turn.
    async fn probe(&self) -> Probe {
        let mut first_failure = None;
        for (host, port) in &self.hosts {
            let probe = probe_one(host, *port);
            let until = self.deadline().min(Instant::now() + PROBE_TIMEOUT);
            match tokio::time::timeout_at(until, probe).await {
                Ok(Probe::Connected) => return Probe::Connected,
                Ok(failure @ Probe::Failed(..)) => {
                    first_failure.get_or_insert(failure);
                }
                Ok(Probe::Inconclusive) | Err(_) => {}
            }
        }
        first_failure.unwrap_or(Probe::Inconclusive)
    }
}

/// Whether `details` is a Redis error reply: its first word is an upper-case error code (`ERR`,
/// `NOPERM`, `LOADING`, ...).
fn is_error_reply(details: &str) -> bool {
    details.split(' ').next().is_some_and(|code| {
        code.len() >= 2 && code.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

/// What a TCP probe of the server found.
#[derive(Debug)]
enum Probe {
    /// A TCP connection was established: the trouble lies beyond it.
    Connected,
    /// It failed for a reason that [`ConnectFailure`] names, with the error worth keeping.
    Failed(ConnectFailure, Option<io::Error>),
    /// It failed in another way, or took too long.
    Inconclusive,
}

async fn probe_one(host: &str, port: u16) -> Probe {
    let addrs: Vec<std::net::SocketAddr> = match tokio::net::lookup_host((host, port)).await {
        Ok(addrs) => addrs.collect(),
        // The resolver's answer ("Name or service not known", "Temporary failure in name
        // resolution") says more than the reason.
        Err(err) => return Probe::Failed(ConnectFailure::UnknownHost, Some(err)),
    };
    match tokio::net::TcpStream::connect(&addrs[..]).await {
        Ok(_stream) => Probe::Connected,
        Err(err) => match err.kind() {
            io::ErrorKind::ConnectionRefused => Probe::Failed(ConnectFailure::Refused, None),
            io::ErrorKind::HostUnreachable | io::ErrorKind::NetworkUnreachable => {
                Probe::Failed(ConnectFailure::Unreachable, None)
            }
            _ => Probe::Inconclusive,
        },
    }
}

/// Connects a fred client, giving up at `deadline` (the target's, shared by every connection of
/// one client). A client that failed is not left running: fred stops one whose `init` failed
/// (see [`init_within`] for one that ran out of time). Closing a stopped client again would only
/// make fred log a warning ("Attempted to quit client that was already stopped"), which a
/// program with a subscriber would show next to the error: the caller closes only the clients
/// that connected.
pub(crate) async fn connect<C: ClientLike + Clone + 'static>(
    client: &C,
    target: &Target,
    deadline: Instant,
) -> Result<(), Error> {
    match init_within(client, deadline).await {
        Some(Ok(())) => Ok(()),
        Some(Err(err)) => Err(target.failed(err).await),
        None => Err(target.timed_out()),
    }
}

/// Runs fred's `init` of `client` until `deadline`; `None` when it ran out of time. The `init`
/// runs in a task of its own, which a timeout leaves running: fred's own connect timeouts (the
/// connect timeout too) end it soon after, and the task closes the client only if it connected
/// after all. Quitting it at the deadline instead raced fred's own failure: a `QUIT` to a client
/// that had just stopped made fred warn "Attempted to quit client that was already stopped".
async fn init_within<C: ClientLike + Clone + 'static>(
    client: &C,
    deadline: Instant,
) -> Option<Result<(), fred::error::Error>> {
    let mut init = {
        let client = client.clone();
        tokio::spawn(async move { client.init().await.map(drop) })
    };
    match tokio::time::timeout_at(deadline, &mut init).await {
        Ok(Ok(result)) => Some(result),
        // The task panicked (or its runtime is shutting down): nothing connected.
        Ok(Err(joined)) => Some(Err(fred::error::Error::new(
            ErrorKind::Unknown,
            format!("connecting stopped: {joined}"),
        ))),
        Err(_elapsed) => {
            let client = client.clone();
            tokio::spawn(async move {
                if let Ok(Ok(())) = init.await {
                    let _ = client.quit().await;
                }
            });
            None
        }
    }
}

/// Refuses a URL whose password the server would ignore: Redis answers `AUTH <password>` on a
/// server without a password with an error that fred drops (it logs it at most), so a
/// misconfigured URL would connect without a word. When the URL gives a password for the
/// default user, a second connection without it is tried: if the server lets that one in, it
/// has no password and [`Error::Connect`] with [`ConnectFailure::Auth`] says so. A server that
/// asks for the password (`NOAUTH`), or a probe that fails in any other way, lets the client be.
pub(crate) async fn refuse_ignored_password(
    config: &Config,
    target: &Target,
    deadline: Instant,
) -> Result<(), Error> {
    let default_user = config
        .username
        .as_deref()
        .is_none_or(|user| user == "default");
    if config.password.is_none() || !default_user {
        return Ok(());
    }
    let mut bare = config.clone();
    bare.password = None;
    bare.username = None;
    let Ok(probe) = fred::types::Builder::from_config(bare).build() else {
        return Ok(());
    };
    // An `init` that failed stopped the probe already; one that ran out of time is closed by
    // `init_within` if it connects after all.
    if !matches!(init_within(&probe, deadline).await, Some(Ok(()))) {
        return Ok(());
    }
    let pinged = tokio::time::timeout_at(deadline, probe.ping::<String>(None)).await;
    // A server that answered (`PONG` or `NOAUTH`) answers `QUIT` too (Redis lets an
    // unauthenticated client quit): closed here rather than in the background, so that no
    // `QUIT` is left under way when the program ends.
    if pinged.is_ok() {
        let _ = tokio::time::timeout_at(deadline, probe.quit()).await;
    } else {
        quit_in_background(&probe);
    }
    let let_in = matches!(pinged, Ok(Ok(_)));
    if let_in {
        return Err(target.error(
            ConnectFailure::Auth,
            Some(Box::new(fred::error::Error::new(
                ErrorKind::Auth,
                "the URL gives a password, but the server asks for none (it would ignore it)",
            ))),
        ));
    }
    Ok(())
}

/// Closes a fred client without waiting: its `QUIT` waits up to the command timeout for an
/// answer that an unreachable server never gives, and until it is sent the client would go on
/// reconnecting.
pub(crate) fn quit_in_background<C: ClientLike + Clone + 'static>(client: &C) {
    let client = client.clone();
    tokio::spawn(async move {
        let _ = client.quit().await;
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use fred::prelude::Config;

    use super::Target;

    fn target(url: &str) -> Target {
        let config = Config::from_url(url).unwrap();
        Target::new(&config, false, Duration::from_secs(1))
    }

    #[test]
    fn addresses_are_shown_as_the_url_names_them() {
        assert_eq!(target("redis://127.0.0.1:6379").addr(), "127.0.0.1:6379");
        assert_eq!(
            target("redis://u:pw@cache.internal:7000/2").addr(),
            "cache.internal:7000"
        );
        assert_eq!(target("redis://[::1]:6380").addr(), "[::1]:6380");
        assert_eq!(
            target("redis-cluster://h1:7001?node=h2:7002").addr(),
            "h1:7001, h2:7002"
        );
        assert_eq!(
            target("redis-sentinel://s1:26379/0?sentinelServiceName=m&node=s2:26380").addr(),
            "s1:26379, s2:26380"
        );
    }
}
