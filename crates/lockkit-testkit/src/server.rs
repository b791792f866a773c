//! Real `redis-server` processes on free loopback ports.

use std::fs::{self, File};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use tempfile::TempDir;
use tokio::net::TcpSocket;
use tokio::time::Instant;

use crate::resp::{exchange, exchange_unix, COMMAND_TIMEOUT};
use crate::{Profile, RespValue, TestCertificates, TestkitError};

/// How many fresh ports [`RedisServer::start_with`] tries.
const PORT_ATTEMPTS: usize = 5;
/// How often a restart on the same port is tried when the port is taken.
const RESTART_ATTEMPTS: usize = 5;
/// What a server persists in its directory: the RDB snapshot (`SAVE`) and the
/// AOF directory (Redis 7, `--appendonly yes`).
const PERSISTENCE_FILES: [&str; 2] = ["dump.rdb", "appendonlydir"];
/// How many lines of each log file go into an error.
const LOG_TAIL_LINES: usize = 20;
/// Upper bound of one readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Options of a [`RedisServer`].
///
/// Extra arguments are passed to `redis-server` after the kit's own, so they
/// override them:
///
/// ```
/// use lockkit_testkit::ServerOptions;
///
/// let options = ServerOptions::default()
///     .arg("--requirepass")
///     .arg("secret")
///     .args(["--maxmemory", "64mb"]);
/// assert_eq!(options.password(), Some("secret"));
/// ```
#[derive(Debug, Clone)]
pub struct ServerOptions {
    args: Vec<String>,
    binary: Option<PathBuf>,
    startup_timeout: Duration,
    tls: Option<Box<TlsFiles>>,
    /// `None`: the profile named by `LOCKKIT_TEST_PROFILE`, read when the server starts.
    profile: Option<Profile>,
}

/// The files of a TLS server: what `--tls-*-file` points at.
#[derive(Debug, Clone)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
    auth_clients: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            args: Vec::new(),
            binary: None,
            startup_timeout: Duration::from_secs(10),
            tls: None,
            profile: None,
        }
    }
}

impl ServerOptions {
    /// The default options: no extra arguments, the binary found through
    /// `REDIS_SERVER_BIN` or `PATH`, a 10 second startup timeout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one argument to the `redis-server` command line, e.g.
    /// `.arg("--requirepass").arg("secret")`.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Appends several arguments to the `redis-server` command line.
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Uses this `redis-server` executable instead of looking one up.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// Makes the server speak **only TLS** on its port, with the server certificate of `certs`
    /// (`--port 0 --tls-port <port>`); [`RedisServer::url`] is then `rediss://127.0.0.1:<port>`.
    /// Clients are not asked for a certificate unless
    /// [`require_client_certificates`](ServerOptions::require_client_certificates) is set.
    ///
    /// The kit itself (readiness probe, [`RedisServer::command`]) talks to such a server over a
    /// Unix socket in the server's directory, so it needs no TLS of its own. `certs` must live
    /// as long as the server (and across [`RedisServer::start_again`]).
    pub fn tls(mut self, certs: &TestCertificates) -> Self {
        self.tls = Some(Box::new(TlsFiles {
            cert: certs.server_cert(),
            key: certs.server_key(),
            ca: certs.ca_cert(),
            auth_clients: false,
        }));
        self
    }

    /// With [`tls`](ServerOptions::tls): clients must present a certificate signed by the test CA
    /// (`--tls-auth-clients yes`, Redis's own default).
    pub fn require_client_certificates(mut self) -> Self {
        if let Some(tls) = &mut self.tls {
            tls.auth_clients = true;
        }
        self
    }

    /// Whether the server speaks TLS (see [`tls`](ServerOptions::tls)).
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// Starts the server with `profile`'s restrictions (a managed service's blocked commands, or
    /// no scripting) instead of the profile named by [`PROFILE_ENV`](crate::PROFILE_ENV).
    ///
    /// ```
    /// use lockkit_testkit::{Profile, ServerOptions};
    ///
    /// let options = ServerOptions::new().profile(Profile::ManagedService);
    /// assert_eq!(options.chosen_profile(), Some(Profile::ManagedService));
    /// ```
    pub fn profile(mut self, profile: Profile) -> Self {
        self.profile = Some(profile);
        self
    }

    /// The profile set with [`profile`](ServerOptions::profile), if any (`None`: the server
    /// takes the one [`PROFILE_ENV`](crate::PROFILE_ENV) names when it starts).
    pub fn chosen_profile(&self) -> Option<Profile> {
        self.profile
    }

    /// How long to wait for a started server to answer `PING` (default 10 s).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// The extra arguments given so far.
    pub fn extra_args(&self) -> &[String] {
        &self.args
    }

    /// The password set with `--requirepass <password>` among the extra
    /// arguments (the last one wins), if any and not empty.
    pub fn password(&self) -> Option<&str> {
        self.args
            .windows(2)
            .rev()
            .find(|pair| pair[0].eq_ignore_ascii_case("--requirepass"))
            .map(|pair| pair[1].as_str())
            .filter(|password| !password.is_empty())
    }
}

/// A `redis-server` child process listening on `127.0.0.1` on a port of its
/// own, in a temporary directory of its own (its `--dir`).
///
/// The server saves nothing on its own (`--save ""`, `--appendonly no`), but a
/// `SAVE` or `BGSAVE` sent to it writes `dump.rdb` into its directory, and a
/// server started again on that directory loads it, as a real Redis that
/// restarts from an older snapshot does:
/// [`restart_from_disk`](RedisServer::restart_from_disk) restarts it that way,
/// [`restart_empty`](RedisServer::restart_empty) with no data.
///
/// On drop the process is killed with `SIGKILL` and reaped, and the
/// directory is removed. [`kill`](RedisServer::kill) keeps the port number,
/// so [`start_again`](RedisServer::start_again) brings the server back on the
/// same address.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// Keeps the port ours while the server is killed (see `reserve_port`).
    _reservation: TcpSocket,
    // Declared before `dir`: the process dies before its directory goes.
    process: Option<Process>,
    dir: TempDir,
    binary: PathBuf,
    options: ServerOptions,
    generation: u32,
}

impl RedisServer {
    /// Starts a server with default [`ServerOptions`].
    pub async fn start() -> Result<RedisServer, TestkitError> {
        Self::start_with(ServerOptions::default()).await
    }

    /// Starts a server on a free port and waits until it answers `PING`.
    ///
    /// The port is reserved for the life of the returned value, also while
    /// the server is [killed](RedisServer::kill), so concurrent tests do not
    /// get it. Should the server still fail to bind it, a new port is tried,
    /// up to 5 times.
    pub async fn start_with(mut options: ServerOptions) -> Result<RedisServer, TestkitError> {
        if options.profile.is_none() {
            options.profile = Some(Profile::from_env()?);
        }
        let binary = find_binary(&options)?;
        let dir = temp_dir()?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (reservation, port) = reserve_port()?;
            let generation = u32::try_from(attempt).unwrap_or(u32::MAX);
            match start_on(&binary, port, dir.path(), generation, &options).await {
                Ok(process) => {
                    return Ok(RedisServer {
                        port,
                        _reservation: reservation,
                        process: Some(process),
                        dir,
                        binary,
                        options,
                        generation,
                    });
                }
                Err(TestkitError::PortInUse { .. }) if attempt < PORT_ATTEMPTS => {
                    tracing::debug!(
                        port,
                        "port taken before redis-server could bind it; retrying"
                    );
                }
                Err(last @ TestkitError::PortInUse { .. }) => {
                    return Err(TestkitError::PortsExhausted {
                        attempts: attempt,
                        last: Box::new(last),
                    });
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// The TCP port of the server.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address of the server, `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// The URL of the server, `redis://127.0.0.1:<port>` (`rediss://` for a
    /// [TLS](ServerOptions::tls) server). It carries no password even if one
    /// was set: see [`password`](RedisServer::password).
    pub fn url(&self) -> String {
        let scheme = if self.options.is_tls() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// The process id, or `None` while the server is killed.
    pub fn pid(&self) -> Option<u32> {
        self.process.as_ref().map(|p| p.pid)
    }

    /// Whether the server process is currently started (it may be paused).
    pub fn is_running(&self) -> bool {
        self.process.is_some()
    }

    /// The password given with `--requirepass` in the options, if any.
    pub fn password(&self) -> Option<&str> {
        self.options.password()
    }

    /// The profile the server was started with.
    pub fn profile(&self) -> Profile {
        self.options.profile.unwrap_or_default()
    }

    /// The temporary directory of the server (its `--dir` and its logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kills the server with `SIGKILL`, starts a new one with no data on the
    /// same port and waits until it answers. What a `SAVE` wrote to the
    /// server's directory is deleted first.
    pub async fn restart_empty(&mut self) -> Result<(), TestkitError> {
        self.kill();
        for file in PERSISTENCE_FILES {
            let path = self.dir.path().join(file);
            let removed = if path.is_dir() {
                fs::remove_dir_all(&path)
            } else {
                fs::remove_file(&path)
            };
            match removed {
                Ok(()) => tracing::debug!(path = %path.display(), "persisted data removed"),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(err) => {
                    return Err(TestkitError::io(
                        format!("removing {}", path.display()),
                        err,
                    ))
                }
            }
        }
        self.start_again().await
    }

    /// Kills the server with `SIGKILL` (a crash: nothing is saved on the way
    /// out), starts it again on the same port and directory, and waits until
    /// it answers. The new server loads what was last persisted there: the
    /// data as of the last `SAVE`/`BGSAVE` (or an AOF, with `--appendonly yes`
    /// among the options), else nothing. Writes made after that are lost, as
    /// when a real Redis restarts from an older snapshot.
    pub async fn restart_from_disk(&mut self) -> Result<(), TestkitError> {
        self.kill();
        self.start_again().await
    }

    /// Kills the server with `SIGKILL` and reaps it now. The port stays
    /// reserved in this value so [`start_again`](RedisServer::start_again)
    /// can reuse it. Does nothing if the server is already killed.
    pub fn kill(&mut self) {
        if let Some(process) = self.process.take() {
            tracing::debug!(port = self.port, pid = process.pid, "killing redis-server");
            drop(process);
        }
    }

    /// Starts the server again on the same port and directory after
    /// [`kill`](RedisServer::kill) and waits until it answers; it loads what
    /// was persisted in the directory (see
    /// [`restart_from_disk`](RedisServer::restart_from_disk)), if anything. A
    /// server that is still running is killed first.
    pub async fn start_again(&mut self) -> Result<(), TestkitError> {
        self.kill();
        let mut attempt = 0;
        loop {
            attempt += 1;
            self.generation = self.generation.saturating_add(1);
            match start_on(
                &self.binary,
                self.port,
                self.dir.path(),
                self.generation,
                &self.options,
            )
            .await
            {
                Ok(process) => {
                    self.process = Some(process);
                    return Ok(());
                }
                Err(TestkitError::PortInUse { .. }) if attempt < RESTART_ATTEMPTS => {
                    tracing::debug!(port = self.port, attempt, "port still taken; retrying");
                    tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Stops the server process with `SIGSTOP`: it keeps its connections but
    /// answers nothing until [`resume`](RedisServer::resume).
    pub fn pause(&self) -> Result<(), TestkitError> {
        self.signal("STOP")
    }

    /// Continues a paused server with `SIGCONT`.
    pub fn resume(&self) -> Result<(), TestkitError> {
        self.signal("CONT")
    }

    /// Sends one command over a fresh connection and returns the parsed
    /// reply; authenticates first if a password was set in the options.
    ///
    /// On a server whose [`Profile`] renamed the command away (`CONFIG` on a managed-service
    /// imitation), it is sent under the operator's name, so the kit keeps the access a client
    /// under test lacks.
    ///
    /// Error replies are returned as [`RespValue::Error`], not as `Err`.
    /// Gives up after 10 seconds (e.g. while the server is paused).
    pub async fn command(&self, args: &[&str]) -> Result<RespValue, TestkitError> {
        if self.process.is_none() {
            return Err(TestkitError::NotRunning { port: self.port });
        }
        let mut commands = Vec::with_capacity(2);
        if let Some(password) = self.password() {
            commands.push(vec!["AUTH", password]);
        }
        let args = self.profile().as_operator(args);
        commands.push(args.iter().map(AsRef::as_ref).collect());
        let unix = unix_socket(self.dir.path(), self.generation, &self.options);
        let mut replies = match unix {
            Some(path) => exchange_unix(&path, self.addr(), &commands, COMMAND_TIMEOUT).await?,
            None => exchange(self.addr(), &commands, COMMAND_TIMEOUT).await?,
        };
        replies.pop().ok_or_else(|| TestkitError::Protocol {
            addr: self.addr(),
            detail: "no reply".to_owned(),
        })
    }

    fn signal(&self, signal: &'static str) -> Result<(), TestkitError> {
        let pid = self
            .pid()
            .ok_or(TestkitError::NotRunning { port: self.port })?;
        send_signal(signal, pid)
    }
}

/// A Redis server for a test: an external one named by the `REDIS_URL`
/// environment variable, or else one spawned for the test (or, with the
/// `testcontainers` feature and `LOCKKIT_TEST_BACKEND=docker`, one in a Docker
/// container).
#[derive(Debug)]
pub enum TestRedis {
    /// A server started by the kit, killed when this value is dropped.
    Spawned(RedisServer),
    /// The URL of a server the kit does not control (from `REDIS_URL`).
    External(String),
    /// A server in a Docker container, removed when this value is dropped.
    #[cfg(feature = "testcontainers")]
    #[cfg_attr(docsrs, doc(cfg(feature = "testcontainers")))]
    Container(crate::RedisContainer),
}

impl TestRedis {
    /// The URL of the server.
    pub fn url(&self) -> String {
        match self {
            TestRedis::Spawned(server) => server.url(),
            TestRedis::External(url) => url.clone(),
            #[cfg(feature = "testcontainers")]
            TestRedis::Container(container) => container.url(),
        }
    }

    /// The spawned server, or `None` for an external one or a container.
    pub fn server(&self) -> Option<&RedisServer> {
        match self {
            TestRedis::Spawned(server) => Some(server),
            _ => None,
        }
    }
}

/// The environment variable that chooses how [`redis_url`] provides a server
/// when `REDIS_URL` is not set: `process` (the default) spawns `redis-server`,
/// `docker` starts a `RedisContainer` (feature `testcontainers`).
pub const BACKEND_ENV: &str = "LOCKKIT_TEST_BACKEND";

/// How [`redis_url`] provides a server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Backend {
    /// A spawned `redis-server`.
    Process,
    /// A Docker container.
    #[cfg(feature = "testcontainers")]
    Docker,
}

/// The backend named by a value of [`BACKEND_ENV`] (unset or empty: the default).
fn backend(value: Option<&str>) -> Result<Backend, TestkitError> {
    let error = |detail: &str| TestkitError::Backend {
        value: value.unwrap_or_default().to_owned(),
        detail: detail.to_owned(),
    };
    match value.map(str::trim).unwrap_or_default() {
        "" | "process" => Ok(Backend::Process),
        #[cfg(feature = "testcontainers")]
        "docker" => Ok(Backend::Docker),
        #[cfg(not(feature = "testcontainers"))]
        "docker" => Err(error(
            "lockkit-testkit was built without its `testcontainers` feature; build with \
             `--features lockkit-testkit/testcontainers`",
        )),
        _ => Err(error("expected `process` (the default) or `docker`")),
    }
}

/// A Redis server for a test: if the environment variable `REDIS_URL` is set
/// (and not empty), [`TestRedis::External`] with its value and no process is
/// started; otherwise a new [`RedisServer`] with default options, or, when
/// [`LOCKKIT_TEST_BACKEND`](BACKEND_ENV) is `docker` (feature
/// `testcontainers`), a new `RedisContainer`.
///
/// # Errors
/// When the server cannot be started, or `LOCKKIT_TEST_BACKEND` names a
/// backend this build does not have ([`TestkitError::Backend`]).
pub async fn redis_url() -> Result<TestRedis, TestkitError> {
    if let Ok(url) = std::env::var("REDIS_URL") {
        if !url.trim().is_empty() {
            return Ok(TestRedis::External(url));
        }
    }
    let value = std::env::var(BACKEND_ENV).ok();
    match backend(value.as_deref())? {
        Backend::Process => Ok(TestRedis::Spawned(RedisServer::start().await?)),
        #[cfg(feature = "testcontainers")]
        Backend::Docker => Ok(TestRedis::Container(crate::RedisContainer::start().await?)),
    }
}

/// Sends `SIG<signal>` to `pid` with the `kill` command.
fn send_signal(signal: &'static str, pid: u32) -> Result<(), TestkitError> {
    let output = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TestkitError::Signal {
            signal,
            pid,
            detail: format!("running `kill`: {e}"),
        })?;
    if output.status.success() {
        tracing::debug!(pid, signal, "signal sent");
        Ok(())
    } else {
        Err(TestkitError::Signal {
            signal,
            pid,
            detail: format!(
                "`kill` {}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

/// A spawned `redis-server`, killed with `SIGKILL` and reaped on drop.
#[derive(Debug)]
struct Process {
    child: Child,
    pid: u32,
    log: PathBuf,
    stdio: PathBuf,
}

impl Process {
    /// The last lines of the server's log file and of its standard streams.
    fn log_tail(&self) -> String {
        let sections: Vec<String> = [("log", &self.log), ("stdout/stderr", &self.stdio)]
            .into_iter()
            .filter_map(|(label, path)| {
                let tail = tail_of(path)?;
                Some(format!("--- {label} ({}) ---\n{tail}", path.display()))
            })
            .collect();
        if sections.is_empty() {
            "(the server wrote nothing)".to_owned()
        } else {
            sections.join("\n")
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // Errors are ignored on purpose: the child may already have exited,
        // and a destructor has no one to report to.
        if let Err(err) = self.child.kill() {
            tracing::debug!(pid = self.pid, %err, "SIGKILL failed");
        }
        match self.child.wait() {
            Ok(status) => tracing::trace!(pid = self.pid, %status, "redis-server reaped"),
            Err(err) => tracing::warn!(pid = self.pid, %err, "reaping redis-server failed"),
        }
    }
}

/// Spawns a server on `port` and waits until it is ready.
async fn start_on(
    binary: &Path,
    port: u16,
    dir: &Path,
    generation: u32,
    options: &ServerOptions,
) -> Result<Process, TestkitError> {
    let mut process = spawn(binary, port, dir, generation, options)?;
    let unix = unix_socket(dir, generation, options);
    wait_ready(&mut process, port, unix.as_deref(), options).await?;
    tracing::debug!(port, pid = process.pid, "redis-server ready");
    Ok(process)
}

fn spawn(
    binary: &Path,
    port: u16,
    dir: &Path,
    generation: u32,
    options: &ServerOptions,
) -> Result<Process, TestkitError> {
    let log = dir.join(format!("redis-{generation}.log"));
    let stdio = dir.join(format!("stdio-{generation}.log"));
    let out = File::create(&stdio)
        .map_err(|e| TestkitError::io(format!("creating {}", stdio.display()), e))?;
    let err = out
        .try_clone()
        .map_err(|e| TestkitError::io(format!("duplicating {}", stdio.display()), e))?;
    let mut command = Command::new(binary);
    match (&options.tls, unix_socket(dir, generation, options)) {
        (Some(tls), Some(unix)) => {
            command
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(&tls.cert)
                .arg("--tls-key-file")
                .arg(&tls.key)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args([
                    "--tls-auth-clients",
                    if tls.auth_clients { "yes" } else { "no" },
                ])
                .arg("--unixsocket")
                .arg(&unix)
                .args(["--unixsocketperm", "700"]);
        }
        _ => {
            command.args(["--port", &port.to_string()]);
        }
    }
    let child = command
        .args(["--bind", "127.0.0.1"])
        .args(["--protected-mode", "no"])
        .args(["--daemonize", "no"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(&log)
        .args(options.profile.unwrap_or_default().server_args())
        .args(&options.args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| TestkitError::io(format!("spawning {}", binary.display()), e))?;
    let pid = child.id();
    tracing::debug!(port, pid, binary = %binary.display(), "redis-server spawned");
    Ok(Process {
        child,
        pid,
        log,
        stdio,
    })
}

/// Polls until the server answers `PING` (or `-NOAUTH`), it exits, or the
/// startup timeout passes.
async fn wait_ready(
    process: &mut Process,
    port: u16,
    unix: Option<&Path>,
    options: &ServerOptions,
) -> Result<(), TestkitError> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let timeout = options.startup_timeout;
    let deadline = Instant::now() + timeout;
    let mut backoff = Duration::from_millis(5);
    loop {
        let exited = process
            .child
            .try_wait()
            .map_err(|e| TestkitError::io("checking on redis-server", e))?;
        if let Some(status) = exited {
            let log_tail = process.log_tail();
            return Err(if is_address_in_use(&log_tail) {
                TestkitError::PortInUse { port, log_tail }
            } else {
                TestkitError::StartupFailed {
                    port,
                    status: status.to_string(),
                    log_tail,
                }
            });
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(TestkitError::StartupTimeout {
                port,
                timeout,
                log_tail: process.log_tail(),
            });
        }
        let probe_timeout = PROBE_TIMEOUT.min(deadline - now);
        if probe(addr, unix, process.pid, options.password(), probe_timeout).await {
            return Ok(());
        }
        let now = Instant::now();
        tokio::time::sleep(backoff.min(deadline.saturating_duration_since(now))).await;
        backoff = (backoff * 2).min(Duration::from_millis(100));
    }
}

/// Whether the server on `addr` (reached through the Unix socket `unix` if given) is up and is
/// the process `pid`.
async fn probe(
    addr: SocketAddr,
    unix: Option<&Path>,
    pid: u32,
    password: Option<&str>,
    timeout: Duration,
) -> bool {
    let mut commands = Vec::with_capacity(3);
    if let Some(password) = password {
        commands.push(vec!["AUTH", password]);
    }
    commands.push(vec!["PING"]);
    commands.push(vec!["INFO", "server"]);
    let replies = match unix {
        Some(path) => exchange_unix(path, addr, &commands, timeout).await,
        None => exchange(addr, &commands, timeout).await,
    };
    let replies = match replies {
        Ok(replies) => replies,
        Err(err) => {
            tracing::trace!(%addr, %err, "redis-server not ready yet");
            return false;
        }
    };
    let mut replies = replies.iter().rev();
    let (Some(info), Some(ping)) = (replies.next(), replies.next()) else {
        return false;
    };
    match ping {
        RespValue::Simple(pong) if pong == "PONG" => {
            // Make sure the answer came from our process, not from a server
            // of a concurrent test that grabbed the port first.
            let expected = format!("process_id:{pid}");
            let ours = info
                .as_str()
                .is_some_and(|text| text.lines().any(|line| line.trim() == expected));
            if !ours {
                tracing::debug!(%addr, pid, "another process answers on this port");
            }
            ours
        }
        // The server is up but wants a password we do not know.
        RespValue::Error(err) if err.starts_with("NOAUTH") => true,
        _ => false,
    }
}

/// The Unix socket through which the kit talks to a TLS server of this generation; `None` for a
/// plain server, reached on its TCP port.
fn unix_socket(dir: &Path, generation: u32, options: &ServerOptions) -> Option<PathBuf> {
    options
        .is_tls()
        .then(|| dir.join(format!("redis-{generation}.sock")))
}

fn is_address_in_use(log: &str) -> bool {
    log.contains("Address already in use") || log.contains("Failed listening on port")
}

/// The last lines of a file; `None` if it is missing or blank.
fn tail_of(path: &Path) -> Option<String> {
    let text = match fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(err) if err.kind() == io::ErrorKind::NotFound => return None,
        Err(err) => return Some(format!("(could not read it: {err})")),
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .collect();
    if lines.is_empty() {
        return None;
    }
    let start = lines.len().saturating_sub(LOG_TAIL_LINES);
    Some(lines[start..].join("\n"))
}

/// Reserves a free port for the life of a [`RedisServer`].
///
/// The socket is bound to `127.0.0.1:0` with `SO_REUSEADDR` and never listens.
/// Linux then never hands the port out again to another `bind` to port 0 or
/// to an outgoing connection, so concurrent tests cannot take it, not even
/// while the server is killed; yet `redis-server`, which sets `SO_REUSEADDR`
/// too, can bind it, and connecting to it while no server listens is refused.
pub(crate) fn reserve_port() -> Result<(TcpSocket, u16), TestkitError> {
    let socket = TcpSocket::new_v4().map_err(|e| TestkitError::io("creating a TCP socket", e))?;
    socket
        .set_reuseaddr(true)
        .map_err(|e| TestkitError::io("setting SO_REUSEADDR", e))?;
    socket
        .bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
        .map_err(|e| TestkitError::io("binding 127.0.0.1:0 to reserve a port", e))?;
    let port = socket
        .local_addr()
        .map_err(|e| TestkitError::io("reading the address of a bound socket", e))?
        .port();
    Ok((socket, port))
}

/// The `redis-server` to run: from the options, `REDIS_SERVER_BIN`, or `PATH`.
fn find_binary(options: &ServerOptions) -> Result<PathBuf, TestkitError> {
    if let Some(binary) = &options.binary {
        return if binary.is_file() {
            Ok(binary.clone())
        } else {
            Err(TestkitError::BinaryNotFound {
                searched: format!("ServerOptions::binary {} is not a file", binary.display()),
            })
        };
    }
    if let Some(binary) = std::env::var_os("REDIS_SERVER_BIN").filter(|v| !v.is_empty()) {
        let binary = PathBuf::from(binary);
        return if binary.is_file() {
            Ok(binary)
        } else {
            Err(TestkitError::BinaryNotFound {
                searched: format!("REDIS_SERVER_BIN={} is not a file", binary.display()),
            })
        };
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path)
        .chain(["/usr/bin", "/usr/local/bin", "/usr/sbin"].map(PathBuf::from))
        .map(|dir| dir.join("redis-server"))
        .find(|candidate| candidate.is_file());
    found.ok_or_else(|| TestkitError::BinaryNotFound {
        searched: format!(
            "REDIS_SERVER_BIN is not set and no redis-server in PATH={}",
            path.to_string_lossy()
        ),
    })
}

/// A new directory `lockkit-testkit-*` under the system temporary directory, removed when the
/// returned value is dropped.
pub(crate) fn temp_dir() -> Result<TempDir, TestkitError> {
    tempfile::Builder::new()
        .prefix("lockkit-testkit-")
        .tempdir()
        .map_err(|source| TestkitError::TempDir {
            base: std::env::temp_dir(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_defaults_to_a_spawned_process() {
        assert_eq!(backend(None).unwrap(), Backend::Process);
        assert_eq!(backend(Some("")).unwrap(), Backend::Process);
        assert_eq!(backend(Some(" process ")).unwrap(), Backend::Process);
    }

    #[test]
    fn an_unknown_backend_is_a_clear_error() {
        let err = backend(Some("podman")).unwrap_err();
        assert!(matches!(err, TestkitError::Backend { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("\"podman\"") && text.contains("docker"),
            "{text}"
        );
    }

    #[cfg(feature = "testcontainers")]
    #[test]
    fn docker_selects_the_container_backend() {
        assert_eq!(backend(Some("docker")).unwrap(), Backend::Docker);
    }

    #[cfg(not(feature = "testcontainers"))]
    #[test]
    fn docker_without_the_feature_says_how_to_enable_it() {
        let err = backend(Some("docker")).unwrap_err();
        assert!(
            err.to_string()
                .contains("--features lockkit-testkit/testcontainers"),
            "{err}"
        );
    }

    #[test]
    fn password_is_parsed_from_args() {
        assert_eq!(ServerOptions::new().password(), None);
        let options = ServerOptions::new().args(["--requirepass", "a", "--requirepass", "b"]);
        assert_eq!(options.password(), Some("b"));
        assert_eq!(
            ServerOptions::new().args(["--requirepass", ""]).password(),
            None
        );
    }

    #[test]
    fn temp_dirs_are_unique_and_removed() {
        let a = temp_dir().unwrap();
        let b = temp_dir().unwrap();
        assert_ne!(a.path(), b.path());
        let path = a.path().to_owned();
        assert!(path.is_dir());
        drop(a);
        assert!(!path.exists());
    }
}
