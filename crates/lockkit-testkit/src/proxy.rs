//! A TCP proxy that injects faults between a client and a server.

use std::collections::HashMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::TestkitError;

/// Delays and jitter are clamped to this, so deadlines never overflow.
const MAX_DELAY: Duration = Duration::from_secs(24 * 60 * 60);
/// Size of the buffer each direction of a connection reads into.
const CHUNK: usize = 16 * 1024;

/// A TCP proxy on a free `127.0.0.1` port that forwards every connection to
/// an upstream address and can delay, pause, cut or refuse traffic.
///
/// Every control is a synchronous `&self` method that takes effect at once,
/// for open connections and new ones alike. Each connection is served by one
/// task per direction, which reads a chunk, waits for the configured delay,
/// waits while the proxy is paused and then writes the chunk, so bytes keep
/// their order. Dropping the proxy stops its listener and closes every
/// connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), lockkit_testkit::TestkitError> {
/// use lockkit_testkit::{FaultProxy, RedisServer};
///
/// let server = RedisServer::start().await?;
/// let proxy = FaultProxy::start(server.addr()).await?;
/// // Point the client under test at `proxy.url()`, then:
/// proxy.block(); // the server is "unreachable"
/// proxy.unblock();
/// # Ok(())
/// # }
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    accept_task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free `127.0.0.1` port forwarding to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<FaultProxy, TestkitError> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| TestkitError::io("binding the fault proxy to 127.0.0.1:0", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| TestkitError::io("reading the fault proxy's address", e))?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                conns: HashMap::new(),
                blocked: false,
                closed: false,
                trigger: Trigger::Idle,
                trigger_generation: 0,
                shots_left: 0,
                fires: 0,
            }),
            delay_nanos: AtomicU64::new(0),
            jitter_nanos: AtomicU64::new(0),
            paused: watch::Sender::new(false),
            fired: watch::Sender::new(false),
            total: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
        });
        let accept_task = tokio::spawn(accept_loop(listener, Arc::clone(&shared), upstream));
        tracing::debug!(%addr, %upstream, "fault proxy started");
        Ok(FaultProxy {
            addr,
            upstream,
            shared,
            accept_task,
        })
    }

    /// The address clients should connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy's address as a Redis URL, `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// The address every connection is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Adds `delay` of latency to every chunk in both directions (zero for
    /// none). Clamped to one day.
    pub fn set_delay(&self, delay: Duration) {
        self.shared
            .delay_nanos
            .store(duration_to_nanos(delay), Ordering::Relaxed);
    }

    /// Adds a random extra latency between zero and `max` to every chunk in
    /// both directions; bytes still keep their order. Clamped to one day.
    pub fn set_jitter(&self, max: Duration) {
        self.shared
            .jitter_nanos
            .store(duration_to_nanos(max), Ordering::Relaxed);
    }

    /// Stops forwarding bytes on every connection. Nothing is dropped: bytes
    /// wait in the proxy and the kernel until [`resume`](FaultProxy::resume).
    pub fn pause(&self) {
        tracing::debug!(addr = %self.addr, "fault proxy paused");
        self.shared.paused.send_replace(true);
    }

    /// Forwards bytes again after [`pause`](FaultProxy::pause).
    pub fn resume(&self) {
        tracing::debug!(addr = %self.addr, "fault proxy resumed");
        self.shared.paused.send_replace(false);
    }

    /// Closes every open connection, on both sides. New connections are
    /// still accepted.
    pub fn cut(&self) {
        let state = self.shared.state.lock();
        tracing::debug!(addr = %self.addr, connections = state.conns.len(), "cutting connections");
        state.kill_all();
    }

    /// Makes the server unreachable: closes every open connection and, until
    /// [`unblock`](FaultProxy::unblock), closes new connections right after
    /// accepting them.
    pub fn block(&self) {
        let mut state = self.shared.state.lock();
        tracing::debug!(addr = %self.addr, connections = state.conns.len(), "blocking");
        state.blocked = true;
        state.kill_all();
    }

    /// Accepts and forwards new connections again after
    /// [`block`](FaultProxy::block).
    pub fn unblock(&self) {
        tracing::debug!(addr = %self.addr, "unblocking");
        self.shared.state.lock().blocked = false;
    }

    /// Arms a one-shot trigger: on the first connection whose client sends
    /// bytes containing `pattern` (possibly split across reads), once those
    /// bytes have been forwarded to the server, the next bytes coming back
    /// from the server are discarded and the connection is closed on both
    /// sides. The server executed the request; the client never sees the
    /// reply, only the connection closing.
    ///
    /// Meant for request/response traffic: if the client pipelines, the
    /// discarded bytes may belong to the reply of an earlier request still
    /// in flight. Arming again replaces the pattern and resets
    /// [`triggered`](FaultProxy::triggered) to `false`.
    pub fn cut_after_request_containing(&self, pattern: impl Into<Vec<u8>>) {
        self.cut_after_requests_containing(pattern, 1);
    }

    /// As [`cut_after_request_containing`](FaultProxy::cut_after_request_containing), for the
    /// next `times` requests containing `pattern` (at least one): each firing re-arms the
    /// trigger before it closes the connection, so the client's next such request, on a new
    /// connection, loses its reply too. [`triggered`](FaultProxy::triggered) is `true` from the
    /// first firing; [`times_triggered`](FaultProxy::times_triggered) counts them.
    pub fn cut_after_requests_containing(&self, pattern: impl Into<Vec<u8>>, times: u32) {
        let pattern: Arc<[u8]> = pattern.into().into();
        let mut state = self.shared.state.lock();
        tracing::debug!(addr = %self.addr, pattern = %String::from_utf8_lossy(&pattern), times, "trigger armed");
        state.trigger = Trigger::Armed(pattern);
        state.trigger_generation += 1;
        state.shots_left = times.saturating_sub(1);
        state.fires = 0;
        self.shared.fired.send_replace(false);
    }

    /// Whether the trigger armed by
    /// [`cut_after_request_containing`](FaultProxy::cut_after_request_containing)
    /// has fired.
    pub fn triggered(&self) -> bool {
        *self.shared.fired.borrow()
    }

    /// How many times the trigger armed last has fired.
    pub fn times_triggered(&self) -> u32 {
        self.shared.state.lock().fires
    }

    /// Resolves once the armed trigger has fired (at once if it already has).
    pub async fn wait_triggered(&self) {
        let mut fired = self.shared.fired.subscribe();
        // The sender lives in `self.shared`, so this cannot fail while
        // `self` is borrowed.
        let _ = fired.wait_for(|fired| *fired).await;
    }

    /// How many proxied connections are open now.
    pub fn connection_count(&self) -> usize {
        self.shared.state.lock().conns.len()
    }

    /// How many connections were accepted since the proxy started, including
    /// those refused while [blocked](FaultProxy::block).
    pub fn total_connections(&self) -> usize {
        self.shared.total.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.upstream)
            .field("connections", &self.connection_count())
            .field("triggered", &self.triggered())
            .finish_non_exhaustive()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept_task.abort();
        let mut state = self.shared.state.lock();
        state.closed = true;
        state.kill_all();
        tracing::debug!(addr = %self.addr, "fault proxy stopped");
    }
}

/// State shared by the proxy handle, its accept loop and its connections.
struct Shared {
    state: Mutex<State>,
    delay_nanos: AtomicU64,
    jitter_nanos: AtomicU64,
    paused: watch::Sender<bool>,
    fired: watch::Sender<bool>,
    total: AtomicUsize,
    next_id: AtomicU64,
}

struct State {
    conns: HashMap<u64, Arc<Conn>>,
    blocked: bool,
    closed: bool,
    trigger: Trigger,
    /// Counts arming, so a claim made before re-arming cannot fire the new
    /// trigger. Starts at 1 with the first arming; 0 means "no claim".
    trigger_generation: u64,
    /// Firings still to come after the one armed or claimed now.
    shots_left: u32,
    /// Firings of the trigger armed last.
    fires: u32,
}

impl State {
    fn kill_all(&self) {
        for conn in self.conns.values() {
            conn.kill();
        }
    }
}

enum Trigger {
    Idle,
    Armed(Arc<[u8]>),
    /// A connection matched (the pattern, to re-arm); it fires when the
    /// server answers.
    Claimed(Arc<[u8]>),
    Fired,
}

impl Shared {
    /// Registers a new connection, unless the proxy is blocked or closed.
    fn register(self: &Arc<Self>) -> Option<Lease> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            id,
            kill: watch::Sender::new(false),
            doomed: AtomicU64::new(0),
        });
        {
            let mut state = self.state.lock();
            if state.blocked || state.closed {
                return None;
            }
            state.conns.insert(id, Arc::clone(&conn));
        }
        Some(Lease {
            conn,
            shared: Arc::clone(self),
        })
    }

    fn delay(&self) -> Duration {
        Duration::from_nanos(self.delay_nanos.load(Ordering::Relaxed))
    }

    fn jitter(&self) -> Duration {
        Duration::from_nanos(self.jitter_nanos.load(Ordering::Relaxed))
    }

    fn armed_pattern(&self) -> Option<Arc<[u8]>> {
        match &self.state.lock().trigger {
            Trigger::Armed(pattern) => Some(Arc::clone(pattern)),
            _ => None,
        }
    }

    /// Claims the armed trigger for one connection: its generation, or
    /// `None` if it is not armed (any more).
    fn claim_trigger(&self) -> Option<u64> {
        let mut state = self.state.lock();
        let Trigger::Armed(pattern) = &state.trigger else {
            return None;
        };
        let pattern = Arc::clone(pattern);
        state.trigger = Trigger::Claimed(pattern);
        Some(state.trigger_generation)
    }

    /// Fires the trigger claimed as `generation` (and arms it again while
    /// shots are left); false if it was re-armed since.
    fn fire_trigger(&self, generation: u64) -> bool {
        let mut state = self.state.lock();
        let pattern = match &state.trigger {
            Trigger::Claimed(pattern) if state.trigger_generation == generation => {
                Arc::clone(pattern)
            }
            _ => return false,
        };
        state.trigger = if state.shots_left > 0 {
            state.shots_left -= 1;
            Trigger::Armed(pattern)
        } else {
            Trigger::Fired
        };
        state.fires += 1;
        self.fired.send_replace(true);
        true
    }
}

/// Controls of one proxied connection.
struct Conn {
    id: u64,
    kill: watch::Sender<bool>,
    /// The generation of the trigger this connection claimed, or 0: the
    /// next bytes from the server are dropped and the connection is closed.
    doomed: AtomicU64,
}

impl Conn {
    fn kill(&self) {
        self.kill.send_replace(true);
    }
}

/// Held by both direction tasks of a connection; unregisters it when the
/// last one ends.
struct Lease {
    conn: Arc<Conn>,
    shared: Arc<Shared>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.shared.state.lock().conns.remove(&self.conn.id);
        tracing::debug!(conn = self.conn.id, "proxied connection closed");
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, upstream: SocketAddr) {
    loop {
        let (client, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(err) => {
                // E.g. out of file descriptors: back off instead of spinning.
                tracing::warn!(%err, "fault proxy accept failed");
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        shared.total.fetch_add(1, Ordering::SeqCst);
        match shared.register() {
            Some(lease) => {
                tracing::debug!(conn = lease.conn.id, %peer, "proxied connection accepted");
                tokio::spawn(run_connection(client, upstream, lease));
            }
            None => {
                tracing::debug!(%peer, "fault proxy blocked: refusing connection");
                drop(client);
            }
        }
    }
}

async fn run_connection(client: TcpStream, upstream: SocketAddr, lease: Lease) {
    let mut kill = lease.conn.kill.subscribe();
    let server = tokio::select! {
        biased;
        () = killed(&mut kill) => return,
        connected = TcpStream::connect(upstream) => match connected {
            Ok(server) => server,
            Err(err) => {
                tracing::debug!(conn = lease.conn.id, %upstream, %err, "upstream connect failed");
                return;
            }
        },
    };
    // Latency is what the proxy injects; Nagle's algorithm would add more.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let lease = Arc::new(lease);
    tokio::spawn(pump(
        client_read,
        server_write,
        Direction::ToServer,
        Arc::clone(&lease),
    ));
    pump(server_read, client_write, Direction::ToClient, lease).await;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// Forwards one direction of a connection until EOF, an error or a kill.
async fn pump(
    mut src: OwnedReadHalf,
    mut dst: OwnedWriteHalf,
    direction: Direction,
    lease: Arc<Lease>,
) {
    let conn = &lease.conn;
    let shared = &lease.shared;
    let mut kill = conn.kill.subscribe();
    let mut paused = shared.paused.subscribe();
    let mut rng = XorShift::new(conn.id.wrapping_mul(2).wrapping_add(direction as u64));
    let mut buf = vec![0u8; CHUNK];
    // The last bytes sent to the server, to find a pattern split across reads.
    let mut tail: Vec<u8> = Vec::new();

    loop {
        let read = tokio::select! {
            biased;
            () = killed(&mut kill) => break,
            read = src.read(&mut buf) => read,
        };
        let n = match read {
            Ok(0) => {
                // Half-close: pass the EOF on once not paused, keep the
                // other direction going.
                let forward = tokio::select! {
                    biased;
                    () = killed(&mut kill) => false,
                    // The watch guard is dropped here, never held across an await.
                    resumed = paused.wait_for(|paused| !*paused) => resumed.is_ok(),
                };
                if forward {
                    let _ = dst.shutdown().await;
                }
                break;
            }
            Ok(n) => n,
            Err(err) => {
                tracing::debug!(conn = conn.id, ?direction, %err, "read failed; closing connection");
                conn.kill();
                break;
            }
        };
        let read_at = Instant::now();
        let chunk = &buf[..n];

        if direction == Direction::ToClient {
            let claimed = conn.doomed.swap(0, Ordering::SeqCst);
            if claimed != 0 && shared.fire_trigger(claimed) {
                tracing::info!(
                    conn = conn.id,
                    bytes = n,
                    "trigger fired: reply dropped, closing connection"
                );
                conn.kill();
                break;
            }
        }
        let matched = direction == Direction::ToServer
            && scan_for_pattern(shared.armed_pattern().as_deref(), &mut tail, chunk);

        let delay = shared.delay() + rng.below(shared.jitter());
        if !delay.is_zero() {
            tokio::select! {
                biased;
                () = killed(&mut kill) => break,
                () = tokio::time::sleep_until(read_at + delay) => {}
            }
        }
        let resumed = tokio::select! {
            biased;
            () = killed(&mut kill) => break,
            resumed = paused.wait_for(|paused| !*paused) => resumed.is_ok(),
        };
        if !resumed {
            break;
        }
        // Claimed right before forwarding so a reply to an earlier request
        // is not mistaken for the reply to this one.
        if matched {
            if let Some(generation) = shared.claim_trigger() {
                tracing::debug!(conn = conn.id, "trigger pattern forwarded to the server");
                conn.doomed.store(generation, Ordering::SeqCst);
            }
        }
        let written = tokio::select! {
            biased;
            () = killed(&mut kill) => break,
            written = dst.write_all(chunk) => written,
        };
        if let Err(err) = written {
            tracing::debug!(conn = conn.id, ?direction, %err, "write failed; closing connection");
            conn.kill();
            break;
        }
    }
}

/// Whether the armed pattern occurs in the client's bytes so far (`tail`
/// followed by `chunk`); keeps the end of them in `tail`.
fn scan_for_pattern(pattern: Option<&[u8]>, tail: &mut Vec<u8>, chunk: &[u8]) -> bool {
    let Some(pattern) = pattern else {
        tail.clear();
        return false;
    };
    tail.extend_from_slice(chunk);
    let found = pattern.is_empty() || tail.windows(pattern.len()).any(|w| w == pattern);
    let keep = pattern.len().saturating_sub(1);
    let drop_len = tail.len().saturating_sub(keep);
    tail.drain(..drop_len);
    found
}

/// Resolves once the connection is killed.
async fn killed(kill: &mut watch::Receiver<bool>) {
    // An error means the sender is gone, which also ends the connection.
    let _ = kill.wait_for(|killed| *killed).await;
}

fn duration_to_nanos(duration: Duration) -> u64 {
    u64::try_from(duration.min(MAX_DELAY).as_nanos()).unwrap_or(u64::MAX)
}

/// A small xorshift generator for jitter; statistical quality is irrelevant.
struct XorShift(u64);

impl XorShift {
    fn new(salt: u64) -> Self {
        let time = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        // splitmix64 of the seed, so close seeds give unrelated streams.
        let mut z = time ^ salt.wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        XorShift(z | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }

    /// A random duration in `0..=max`.
    fn below(&mut self, max: Duration) -> Duration {
        let max = duration_to_nanos(max);
        if max == 0 {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.next() % max.saturating_add(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_range() {
        let mut rng = XorShift::new(7);
        let max = Duration::from_millis(3);
        for _ in 0..1000 {
            assert!(rng.below(max) <= max);
        }
        assert_eq!(rng.below(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn pattern_is_found_across_chunks() {
        let pattern: Option<&[u8]> = Some(b"needle");
        let mut tail = Vec::new();
        assert!(!scan_for_pattern(pattern, &mut tail, b"hay ne"));
        assert!(tail.len() < 6);
        assert!(!scan_for_pattern(pattern, &mut tail, b"e"));
        assert!(scan_for_pattern(pattern, &mut tail, b"dle hay"));

        let mut tail = Vec::new();
        for byte in b"xxneedlexx".chunks(1) {
            if scan_for_pattern(pattern, &mut tail, byte) {
                return;
            }
        }
        panic!("pattern split into single bytes was not found");
    }

    #[test]
    fn no_pattern_means_no_match() {
        let mut tail = b"old".to_vec();
        assert!(!scan_for_pattern(None, &mut tail, b"needle"));
        assert!(tail.is_empty());
    }

    #[test]
    fn huge_delays_are_clamped() {
        assert_eq!(
            duration_to_nanos(Duration::MAX),
            MAX_DELAY.as_nanos() as u64
        );
    }
}
