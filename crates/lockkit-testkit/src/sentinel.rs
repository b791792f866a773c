//! A Sentinel-managed primary: one primary, its replicas and a few sentinels, all real processes
//! on free loopback ports.

use std::fs::{self, File};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tokio::net::TcpSocket;
use tokio::time::Instant;

use crate::resp::{exchange, COMMAND_TIMEOUT};
use crate::server::{reserve_port, temp_dir};
use crate::{FaultProxy, RedisServer, RespValue, ServerOptions, TestkitError};

/// The service name the sentinels monitor.
pub const SENTINEL_SERVICE_NAME: &str = "mymaster";
/// How long a primary may be silent before a sentinel thinks it down.
const DOWN_AFTER_MS: u64 = 1_000;
/// Sentinel's failover timeout. Also how long a sentinel leaves a replica that points elsewhere
/// (here: at its replication proxy) alone before "fixing" it, so it must outlast a test.
const FAILOVER_TIMEOUT_MS: u64 = 60_000;
/// How long [`RedisSentinelGroup::start`] and the failover helpers wait for the group to settle.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

/// A primary, its replicas and its sentinels, for failover tests.
///
/// * The primary and the replicas are [`RedisServer`]s. Each replica replicates through a
///   [`FaultProxy`] of its own ([`replication_link`](RedisSentinelGroup::replication_link)), so a
///   test can hold replication back (`pause`, `block`) and make a write miss the replicas.
/// * The sentinels run `redis-server <conf> --sentinel` with a generated configuration: quorum 2
///   (or 1 with a single sentinel), `down-after-milliseconds 1000`, `resolve-hostnames no`.
///
/// [`start`](RedisSentinelGroup::start) returns once the replicas are in sync and every
/// sentinel knows every replica and every other sentinel. Everything is killed on drop.
#[derive(Debug)]
pub struct RedisSentinelGroup {
    // The sentinels die first, so they never see the servers go.
    sentinels: Vec<Sentinel>,
    links: Vec<FaultProxy>,
    servers: Vec<RedisServer>,
    primary_port: u16,
}

impl RedisSentinelGroup {
    /// Starts a primary, `replicas` replicas and `sentinels` sentinels (at least one of each) and
    /// waits until the group is ready.
    pub async fn start(replicas: usize, sentinels: usize) -> Result<Self, TestkitError> {
        if replicas == 0 || sentinels == 0 {
            return Err(sentinel_error(
                "a sentinel group needs at least one replica and one sentinel",
            ));
        }
        let primary = RedisServer::start().await?;
        let primary_port = primary.port();
        let mut servers = vec![primary];
        let mut links = Vec::with_capacity(replicas);
        for _ in 0..replicas {
            let link = FaultProxy::start(servers[0].addr()).await?;
            let replica = RedisServer::start_with(ServerOptions::new().args([
                "--replicaof".to_owned(),
                "127.0.0.1".to_owned(),
                link.addr().port().to_string(),
            ]))
            .await?;
            links.push(link);
            servers.push(replica);
        }
        for replica in &servers[1..] {
            wait_until(&format!("replica {} in sync", replica.port()), || async {
                let info = replica.command(&["INFO", "replication"]).await.ok()?;
                info.as_str()?
                    .contains("master_link_status:up")
                    .then_some(())
            })
            .await?;
        }
        let quorum = if sentinels == 1 { 1 } else { 2 };
        let mut group = RedisSentinelGroup {
            sentinels: Vec::with_capacity(sentinels),
            links,
            servers,
            primary_port,
        };
        for _ in 0..sentinels {
            let sentinel = Sentinel::start(primary_port, quorum).await?;
            group.sentinels.push(sentinel);
        }
        for sentinel in &group.sentinels {
            let port = sentinel.port;
            wait_until(
                &format!("sentinel {port} to know {replicas} replica(s) and the other sentinels"),
                || async {
                    let known_replicas = healthy_entries(port, "REPLICAS").await?;
                    let known_sentinels = healthy_entries(port, "SENTINELS").await?;
                    (known_replicas >= replicas && known_sentinels + 1 >= sentinels).then_some(())
                },
            )
            .await?;
        }
        tracing::debug!(primary_port, replicas, sentinels, "sentinel group ready");
        Ok(group)
    }

    /// The client URL: `redis-sentinel://127.0.0.1:<s1>/0?sentinelServiceName=mymaster&node=…`
    /// listing every sentinel.
    pub fn url(&self) -> String {
        let mut ports = self.sentinels.iter().map(|s| s.port);
        let first = ports.next().unwrap_or_default();
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{first}/0?sentinelServiceName={SENTINEL_SERVICE_NAME}"
        );
        for port in ports {
            url.push_str(&format!("&node=127.0.0.1:{port}"));
        }
        url
    }

    /// The current primary (as of the last failover this group saw through
    /// [`failover`](RedisSentinelGroup::failover) or
    /// [`kill_primary`](RedisSentinelGroup::kill_primary)).
    pub fn primary(&self) -> &RedisServer {
        self.servers
            .iter()
            .find(|server| server.port() == self.primary_port)
            .unwrap_or(&self.servers[0])
    }

    /// The running servers other than the current primary.
    pub fn replicas(&self) -> Vec<&RedisServer> {
        self.servers
            .iter()
            .filter(|server| server.port() != self.primary_port && server.is_running())
            .collect()
    }

    /// The proxy that the `i`-th replica (in start order) replicates through. It only matters
    /// while that replica replicates from the first primary.
    pub fn replication_link(&self, i: usize) -> Option<&FaultProxy> {
        self.links.get(i)
    }

    /// The sentinels' ports.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// Forces a failover with `SENTINEL FAILOVER mymaster` and waits until every sentinel
    /// names a new primary, that server answers `ROLE` as a master, and the old primary has been
    /// turned into its replica. Returns the new primary's port.
    pub async fn failover(&mut self) -> Result<u16, TestkitError> {
        let port = self
            .sentinels
            .first()
            .map(|s| s.port)
            .ok_or_else(|| sentinel_error("no sentinel"))?;
        let reply =
            sentinel_command(port, &["SENTINEL", "FAILOVER", SENTINEL_SERVICE_NAME]).await?;
        if let Some(err) = reply.as_error() {
            return Err(sentinel_error(&format!("SENTINEL FAILOVER refused: {err}")));
        }
        self.wait_new_primary().await
    }

    /// Kills the current primary with `SIGKILL` and waits until the sentinels have promoted a
    /// replica (as [`failover`](RedisSentinelGroup::failover)). Returns the new primary's port.
    pub async fn kill_primary(&mut self) -> Result<u16, TestkitError> {
        let old = self.primary_port;
        if let Some(server) = self.servers.iter_mut().find(|s| s.port() == old) {
            server.kill();
        }
        self.wait_new_primary().await
    }

    /// Waits until every sentinel names the same primary, other than the current one, and it
    /// answers `ROLE` as a master.
    async fn wait_new_primary(&mut self) -> Result<u16, TestkitError> {
        let old = self.primary_port;
        let ports = self.sentinel_ports();
        let new = wait_until("the sentinels to promote a new primary", || async {
            let mut named = None;
            for &port in &ports {
                let reply = sentinel_command(
                    port,
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SENTINEL_SERVICE_NAME],
                )
                .await
                .ok()?;
                let addr = reply.as_array()?;
                let primary: u16 = addr.get(1)?.as_str()?.parse().ok()?;
                if primary == old || named.is_some_and(|n| n != primary) {
                    return None;
                }
                named = Some(primary);
            }
            let primary = named?;
            let server = self.servers.iter().find(|s| s.port() == primary)?;
            let role = server.command(&["ROLE"]).await.ok()?;
            (role.as_array()?.first()?.as_str()? == "master").then_some(primary)
        })
        .await?;
        // A graceful failover leaves the old primary running: wait until the sentinels have
        // turned it into a replica of the new one (which also closes its client connections).
        if let Some(old_server) = self
            .servers
            .iter()
            .find(|s| s.port() == old && s.is_running())
        {
            let expected = new.to_string();
            wait_until("the old primary to become a replica", || async {
                let role = old_server.command(&["ROLE"]).await.ok()?;
                let role = role.as_array()?;
                (role.first()?.as_str()? == "slave"
                    && role.get(2)?.as_int().map(|p| p.to_string()) == Some(expected.clone()))
                .then_some(())
            })
            .await?;
        }
        tracing::debug!(old, new, "failover complete");
        self.primary_port = new;
        Ok(new)
    }
}

/// One `redis-server --sentinel` process, killed on drop.
#[derive(Debug)]
struct Sentinel {
    port: u16,
    child: Child,
    _reservation: TcpSocket,
    // After `child`: the process dies before its directory goes.
    _dir: tempfile::TempDir,
}

impl Sentinel {
    async fn start(primary_port: u16, quorum: usize) -> Result<Self, TestkitError> {
        let (reservation, port) = reserve_port()?;
        let dir = temp_dir()?;
        let conf = dir.path().join("sentinel.conf");
        let log = dir.path().join("sentinel.log");
        let text = format!(
            "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
             dir {dir}\nlogfile {log}\n\
             sentinel resolve-hostnames no\n\
             sentinel monitor {SENTINEL_SERVICE_NAME} 127.0.0.1 {primary_port} {quorum}\n\
             sentinel down-after-milliseconds {SENTINEL_SERVICE_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {SENTINEL_SERVICE_NAME} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {SENTINEL_SERVICE_NAME} 1\n",
            dir = dir.path().display(),
            log = log.display(),
        );
        fs::write(&conf, text)
            .map_err(|e| TestkitError::io(format!("writing {}", conf.display()), e))?;
        let stdio = dir.path().join("stdio.log");
        let out = File::create(&stdio)
            .map_err(|e| TestkitError::io(format!("creating {}", stdio.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| TestkitError::io(format!("duplicating {}", stdio.display()), e))?;
        let binary = sentinel_binary();
        let child = Command::new(&binary)
            .arg(&conf)
            .arg("--sentinel")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| {
                TestkitError::io(format!("spawning {} --sentinel", binary.display()), e)
            })?;
        let mut sentinel = Sentinel {
            port,
            child,
            _reservation: reservation,
            _dir: dir,
        };
        let deadline = Instant::now() + SETTLE_TIMEOUT;
        loop {
            if let Ok(Some(status)) = sentinel.child.try_wait() {
                return Err(sentinel_error(&format!(
                    "sentinel on port {port} exited during startup ({status}); see {}",
                    log.display()
                )));
            }
            if let Ok(reply) = sentinel_command(port, &["PING"]).await {
                if reply.as_str() == Some("PONG") {
                    return Ok(sentinel);
                }
            }
            if Instant::now() >= deadline {
                return Err(sentinel_error(&format!(
                    "sentinel on port {port} did not answer PING within {SETTLE_TIMEOUT:?}"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        // Errors are ignored on purpose: the child may already have exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `redis-server` binary (it becomes a sentinel with `--sentinel`).
fn sentinel_binary() -> PathBuf {
    std::env::var_os("REDIS_SERVER_BIN")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

/// One command to the sentinel on `port`.
async fn sentinel_command(port: u16, args: &[&str]) -> Result<RespValue, TestkitError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut replies = exchange(addr, &[args.to_vec()], COMMAND_TIMEOUT).await?;
    replies.pop().ok_or_else(|| TestkitError::Protocol {
        addr,
        detail: "no reply".to_owned(),
    })
}

/// How many entries of `SENTINEL <what> mymaster` are up (flags without `down` or
/// `disconnected`).
async fn healthy_entries(port: u16, what: &str) -> Option<usize> {
    let reply = sentinel_command(port, &["SENTINEL", what, SENTINEL_SERVICE_NAME])
        .await
        .ok()?;
    let entries = reply.as_array()?;
    Some(
        entries
            .iter()
            .filter(|entry| {
                let fields = entry.as_array().unwrap_or_default();
                fields.chunks(2).any(|pair| {
                    pair.first().and_then(RespValue::as_str) == Some("flags")
                        && pair
                            .get(1)
                            .and_then(RespValue::as_str)
                            .is_some_and(|flags| {
                                !flags.contains("down") && !flags.contains("disconnected")
                            })
                })
            })
            .count(),
    )
}

/// Polls `probe` until it yields a value, giving up after [`SETTLE_TIMEOUT`].
async fn wait_until<T, F, Fut>(what: &str, mut probe: F) -> Result<T, TestkitError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        if let Some(value) = probe().await {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(sentinel_error(&format!(
                "timed out after {SETTLE_TIMEOUT:?} waiting for {what}"
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn sentinel_error(detail: &str) -> TestkitError {
    TestkitError::Sentinel {
        detail: detail.to_owned(),
    }
}
