//! A Redis Cluster of real `redis-server` processes on free loopback ports.
//!
//! [`RedisCluster::start`] spawns `primaries + primaries × replicas` servers with
//! `--cluster-enabled yes`, gives each primary an even share of the 16,384 slots
//! (`CLUSTER ADDSLOTS`), joins them (`CLUSTER MEET`), attaches the replicas
//! (`CLUSTER REPLICATE`) and waits until every node reports `cluster_state:ok` and every replica
//! is in sync. It needs no `redis-cli`: everything goes through [`RedisServer::command`].
//!
//! A slot moves by the classic resharding protocol ([`RedisCluster::migrate_slot`]) or, on
//! servers that have it (Valkey 9.0 and later), by atomic slot migration
//! ([`RedisCluster::migrate_slot_atomically`]).

use std::time::Duration;

use tokio::time::Instant;

use crate::{RedisServer, RespValue, ServerOptions, TestkitError};

/// The number of hash slots of a Redis Cluster.
const SLOTS: u32 = 16_384;
/// How often the kit polls the cluster's state while waiting for it.
const POLL: Duration = Duration::from_millis(20);
/// How long forming the cluster, or a failover, may take before the kit gives up.
const FORM_TIMEOUT: Duration = Duration::from_secs(30);
/// The default `cluster-node-timeout`: short, so failovers in tests take about a second.
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(1_000);

/// A Redis Cluster of real `redis-server` processes: `primaries` primaries, each with
/// `replicas_per_primary` replicas, all on `127.0.0.1`. Every process is killed on drop.
///
/// Node indexes: `0..primaries` are the primaries as started (primary `i` owns the `i`-th even
/// share of the slots), then the replicas, `primaries + i * replicas_per_primary + r` being
/// replica `r` of primary `i`. After a failover a replica may be a primary: see
/// [`node_for_slot`](RedisCluster::node_for_slot).
///
/// ```no_run
/// use lockkit_testkit::RedisCluster;
///
/// # async fn demo() -> Result<(), lockkit_testkit::TestkitError> {
/// let cluster = RedisCluster::start(3, 1).await?;
/// let url = cluster.url(); // redis-cluster://127.0.0.1:p1?node=127.0.0.1:p2&node=...
/// # let _ = url;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    primaries: usize,
    replicas_per_primary: usize,
    node_timeout: Duration,
}

impl RedisCluster {
    /// Starts a cluster with a 1 s `cluster-node-timeout` (a dead primary's replica takes over
    /// after about that long) and waits until it is ready.
    ///
    /// # Errors
    /// When a server cannot be started, or the cluster does not reach `cluster_state:ok` with
    /// every replica in sync within 30 s ([`TestkitError::Cluster`]).
    pub async fn start(
        primaries: usize,
        replicas_per_primary: usize,
    ) -> Result<RedisCluster, TestkitError> {
        Self::start_with(primaries, replicas_per_primary, DEFAULT_NODE_TIMEOUT).await
    }

    /// Starts a cluster with the given `cluster-node-timeout` (at least 100 ms).
    ///
    /// # Errors
    /// As [`start`](RedisCluster::start); also for fewer than one primary or more primaries than
    /// slots.
    pub async fn start_with(
        primaries: usize,
        replicas_per_primary: usize,
        node_timeout: Duration,
    ) -> Result<RedisCluster, TestkitError> {
        if primaries == 0 || primaries > SLOTS as usize {
            return Err(cluster_error(format!(
                "a cluster needs 1..={SLOTS} primaries, not {primaries}"
            )));
        }
        let node_timeout = node_timeout.max(Duration::from_millis(100));
        let total = primaries + primaries * replicas_per_primary;
        let options = ServerOptions::default().args([
            "--cluster-enabled".to_owned(),
            "yes".to_owned(),
            // Relative to the node's own `--dir`.
            "--cluster-config-file".to_owned(),
            "nodes.conf".to_owned(),
            "--cluster-node-timeout".to_owned(),
            node_timeout.as_millis().to_string(),
        ]);
        let mut nodes = Vec::with_capacity(total);
        for _ in 0..total {
            nodes.push(RedisServer::start_with(options.clone()).await?);
        }
        let cluster = RedisCluster {
            nodes,
            primaries,
            replicas_per_primary,
            node_timeout,
        };
        cluster.form().await?;
        Ok(cluster)
    }

    /// Assigns slots, joins the nodes, attaches replicas and waits for the cluster to be ready.
    async fn form(&self) -> Result<(), TestkitError> {
        let mut ids = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            ids.push(expect_str(node, &["CLUSTER", "MYID"]).await?);
        }
        for (i, node) in self.nodes.iter().take(self.primaries).enumerate() {
            // Distinct epochs, as redis-cli does, so no epoch collision has to be resolved.
            let epoch = (i + 1).to_string();
            expect_ok(node, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch]).await?;
            // `ADDSLOTS` with every slot rather than `ADDSLOTSRANGE`, which Redis 6.2 lacks.
            let (first, last) = slot_share(i, self.primaries);
            let slots: Vec<String> = (first..=last).map(|slot| slot.to_string()).collect();
            let mut args = vec!["CLUSTER", "ADDSLOTS"];
            args.extend(slots.iter().map(String::as_str));
            expect_ok(node, &args).await?;
        }
        let first = &self.nodes[0];
        for node in self.nodes.iter().skip(1) {
            let port = node.port().to_string();
            expect_ok(first, &["CLUSTER", "MEET", "127.0.0.1", &port]).await?;
        }
        // A replica can only follow a primary it knows.
        self.wait_until("every node to know every other node", |nodes| {
            nodes
                .iter()
                .all(|reply| reply.known_nodes == self.nodes.len())
        })
        .await?;
        for (primary, id) in ids.iter().take(self.primaries).enumerate() {
            for r in 0..self.replicas_per_primary {
                let replica = self.replica_index(primary, r);
                expect_ok(&self.nodes[replica], &["CLUSTER", "REPLICATE", id]).await?;
            }
        }
        self.wait_ready().await
    }

    /// Waits until every running node reports `cluster_state:ok` and every running replica's
    /// link to its primary is up.
    ///
    /// # Errors
    /// [`TestkitError::Cluster`] when that does not happen within 30 s.
    pub async fn wait_ready(&self) -> Result<(), TestkitError> {
        self.wait_until(
            "cluster_state:ok on every node, replicas in sync",
            |nodes| nodes.iter().all(|reply| reply.state_ok && reply.link_up),
        )
        .await
    }

    /// Polls every running node until `done` holds for their states.
    async fn wait_until(
        &self,
        what: &str,
        done: impl Fn(&[NodeState]) -> bool,
    ) -> Result<(), TestkitError> {
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let mut states = Vec::with_capacity(self.nodes.len());
            for node in self.nodes.iter().filter(|node| node.is_running()) {
                states.push(NodeState::read(node).await);
            }
            if done(&states) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let states: Vec<String> = states.iter().map(NodeState::describe).collect();
                return Err(cluster_error(format!(
                    "waited {FORM_TIMEOUT:?} for {what}; node states: {}",
                    states.join("; ")
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// `redis-cluster://127.0.0.1:<first>?node=127.0.0.1:<second>&node=…`, naming every node
    /// (killed ones too: a client skips those it cannot reach).
    pub fn url(&self) -> String {
        let mut url = String::from("redis-cluster://");
        for (i, node) in self.nodes.iter().enumerate() {
            match i {
                0 => url.push_str(&format!("127.0.0.1:{}", node.port())),
                1 => url.push_str(&format!("?node=127.0.0.1:{}", node.port())),
                _ => url.push_str(&format!("&node=127.0.0.1:{}", node.port())),
            }
        }
        url
    }

    /// Every node, primaries first (see the type's documentation for the order).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The number of primaries the cluster was started with.
    pub fn primaries(&self) -> usize {
        self.primaries
    }

    /// The index of replica `replica` of the `primary`-th started primary.
    pub fn replica_index(&self, primary: usize, replica: usize) -> usize {
        self.primaries + primary * self.replicas_per_primary + replica
    }

    /// The `cluster-node-timeout` the nodes run with.
    pub fn node_timeout(&self) -> Duration {
        self.node_timeout
    }

    /// The index of the node that currently serves `slot` as primary, as a running node sees it
    /// (`CLUSTER SLOTS`); `None` when no running node answers or the slot is unassigned.
    pub async fn node_for_slot(&self, slot: u16) -> Option<usize> {
        for node in self.nodes.iter().filter(|node| node.is_running()) {
            let Some(view) = slot_owner_seen_by(node, slot).await else {
                continue;
            };
            return view.and_then(|port| self.index_of_port(port));
        }
        None
    }

    fn index_of_port(&self, port: u16) -> Option<usize> {
        self.nodes.iter().position(|node| node.port() == port)
    }

    /// Moves `slot` to the primary node `to` with the resharding protocol `redis-cli --cluster
    /// reshard` uses: `CLUSTER SETSLOT <slot> IMPORTING` on the target, `MIGRATING` on the
    /// current owner, the slot's keys moved in batches of 100 (`CLUSTER GETKEYSINSLOT`, then
    /// `MIGRATE … KEYS …`), then `CLUSTER SETSLOT <slot> NODE <target>` on the target, the old
    /// owner and every other running primary. Returns once every running node reports the new
    /// owner.
    ///
    /// Clients see what a live resharding shows them: `ASK` for keys already moved while it is
    /// in progress, `MOVED` afterwards; the old owner drops its shard-channel subscriptions of
    /// the slot (each subscriber gets an `sunsubscribe`).
    ///
    /// # Errors
    /// [`TestkitError::Cluster`] when `to` is not a running primary, the slot has no owner, a
    /// step is refused, or the nodes do not agree on the new owner within 30 s.
    ///
    /// # Panics
    /// When `to` is out of range.
    pub async fn migrate_slot(&self, slot: u16, to: usize) -> Result<(), TestkitError> {
        let Some(Move {
            from,
            source_id,
            target_id,
        }) = self.plan_move(slot, to).await?
        else {
            return Ok(());
        };
        let source = &self.nodes[from];
        let target = &self.nodes[to];
        let slot_arg = slot.to_string();
        expect_ok(
            target,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &source_id],
        )
        .await?;
        expect_ok(
            source,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &target_id],
        )
        .await?;
        let target_port = target.port().to_string();
        loop {
            let reply = source
                .command(&["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"])
                .await?;
            let keys: Vec<&str> = reply
                .as_array()
                .ok_or_else(|| cluster_error(format!("CLUSTER GETKEYSINSLOT answered {reply:?}")))?
                .iter()
                .filter_map(RespValue::as_str)
                .collect();
            if keys.is_empty() {
                break;
            }
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &target_port,
                "",
                "0",
                "5000",
                "KEYS",
            ];
            args.extend(keys.iter().copied());
            match source.command(&args).await? {
                RespValue::Simple(ok) if ok == "OK" || ok == "NOKEY" => {}
                other => {
                    return Err(cluster_error(format!(
                        "MIGRATE of slot {slot} from port {} answered {other:?}",
                        source.port()
                    )))
                }
            }
        }
        expect_ok(
            target,
            &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id],
        )
        .await?;
        expect_ok(
            source,
            &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id],
        )
        .await?;
        for (i, node) in self.nodes.iter().enumerate() {
            if i == from || i == to || !node.is_running() {
                continue;
            }
            if is_primary(node).await? {
                expect_ok(node, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &target_id]).await?;
            }
        }
        self.wait_owner(slot, to).await
    }

    /// Moves `slot` to the primary node `to` by **atomic slot migration** (Valkey 9.0 and
    /// later): `CLUSTER MIGRATESLOTS SLOTSRANGE <slot> <slot> NODE <target>` on the current
    /// owner, which copies the slot's keys to the target and hands the slot over in one step;
    /// the kit polls the job (`CLUSTER GETSLOTMIGRATIONS` on the owner) until it succeeds, then
    /// returns once every running node reports the new owner.
    ///
    /// Unlike [`migrate_slot`](RedisCluster::migrate_slot), clients get no `ASK` while the slot
    /// moves: the old owner serves it until the handover, `MOVED` follows. As there, the old
    /// owner drops its shard-channel subscriptions of the slot (each subscriber gets an
    /// `sunsubscribe`).
    ///
    /// # Errors
    /// [`TestkitError::Cluster`] when the server has no `CLUSTER MIGRATESLOTS` (Redis, Valkey
    /// before 9.0: the message names the server and its version; see
    /// [`supports_atomic_slot_migration`](RedisCluster::supports_atomic_slot_migration)), when
    /// `to` is not a running primary, the slot has no owner, the job is refused, fails or is
    /// cancelled (with the server's message), or it does not complete and the nodes do not agree
    /// on the new owner within 30 s.
    ///
    /// # Panics
    /// When `to` is out of range.
    pub async fn migrate_slot_atomically(&self, slot: u16, to: usize) -> Result<(), TestkitError> {
        if !self.supports_atomic_slot_migration().await? {
            return Err(cluster_error(format!(
                "{} has no CLUSTER MIGRATESLOTS (atomic slot migration needs Valkey 9.0 or \
                 later); use migrate_slot",
                self.server_version().await?
            )));
        }
        let Some(Move {
            from,
            source_id,
            target_id,
        }) = self.plan_move(slot, to).await?
        else {
            return Ok(());
        };
        let source = &self.nodes[from];
        // The jobs the owner already lists: the new one is the one not among them.
        let earlier: Vec<String> = slot_migrations(source)
            .await?
            .into_iter()
            .map(|job| job.name)
            .collect();
        let slot_arg = slot.to_string();
        expect_ok(
            source,
            &[
                "CLUSTER",
                "MIGRATESLOTS",
                "SLOTSRANGE",
                &slot_arg,
                &slot_arg,
                "NODE",
                &target_id,
            ],
        )
        .await?;
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let job = slot_migrations(source)
                .await?
                .into_iter()
                .find(|job| !earlier.contains(&job.name) && job.target_node == target_id);
            match job {
                Some(job) if job.state == "success" => break,
                Some(job) if job.state == "failed" || job.state == "cancelled" => {
                    return Err(cluster_error(format!(
                        "the atomic migration of slot {slot} from node {from} ({source_id}) to \
                         node {to} ({target_id}) ended {}: {}",
                        job.state, job.message
                    )));
                }
                job => {
                    if Instant::now() >= deadline {
                        let state = job.map_or_else(|| "not listed".to_owned(), |job| job.state);
                        return Err(cluster_error(format!(
                            "the atomic migration of slot {slot} to node {to} did not complete \
                             within {FORM_TIMEOUT:?} (job state: {state})"
                        )));
                    }
                }
            }
            tokio::time::sleep(POLL).await;
        }
        self.wait_owner(slot, to).await
    }

    /// Whether the nodes can move a slot atomically, i.e. know `CLUSTER MIGRATESLOTS` (Valkey
    /// 9.0 and later), as the first running node's `COMMAND INFO` says.
    ///
    /// # Errors
    /// When no node is running or the node does not answer.
    pub async fn supports_atomic_slot_migration(&self) -> Result<bool, TestkitError> {
        let node = self.running_node()?;
        let reply = node
            .command(&["COMMAND", "INFO", "CLUSTER|MIGRATESLOTS"])
            .await?;
        if let Some(err) = reply.as_error() {
            return Err(cluster_error(format!(
                "COMMAND INFO on port {} answered an error: {err}",
                node.port()
            )));
        }
        // One entry per name asked for: nil for a command the server does not know.
        Ok(reply
            .as_array()
            .and_then(|entries| entries.first())
            .is_some_and(|entry| !entry.is_nil()))
    }

    /// The server the nodes run and its version, as the first running node's `INFO server`
    /// names them: `Valkey 9.1.2`, `Redis 7.0.15`.
    ///
    /// # Errors
    /// When no node is running or the node does not answer.
    pub async fn server_version(&self) -> Result<String, TestkitError> {
        let node = self.running_node()?;
        let reply = node.command(&["INFO", "server"]).await?;
        let info = reply.as_str().unwrap_or_default();
        Ok(match info_field(info, "valkey_version") {
            Some(version) => format!("Valkey {version}"),
            None => format!(
                "Redis {}",
                info_field(info, "redis_version").unwrap_or("(unknown version)")
            ),
        })
    }

    fn running_node(&self) -> Result<&RedisServer, TestkitError> {
        self.nodes
            .iter()
            .find(|node| node.is_running())
            .ok_or_else(|| cluster_error("no node is running".to_owned()))
    }

    /// The checks before a slot moves to `to`: `None` when `to` already owns it.
    async fn plan_move(&self, slot: u16, to: usize) -> Result<Option<Move>, TestkitError> {
        let target = &self.nodes[to];
        let from = self
            .node_for_slot(slot)
            .await
            .ok_or_else(|| cluster_error(format!("slot {slot} has no owner")))?;
        if from == to {
            return Ok(None);
        }
        if !is_primary(target).await? {
            return Err(cluster_error(format!(
                "node {to} (port {}) is not a primary; slots can only move to one",
                target.port()
            )));
        }
        Ok(Some(Move {
            from,
            source_id: expect_str(&self.nodes[from], &["CLUSTER", "MYID"]).await?,
            target_id: expect_str(target, &["CLUSTER", "MYID"]).await?,
        }))
    }

    /// Waits until every running node reports node `to` as the owner of `slot`.
    async fn wait_owner(&self, slot: u16, to: usize) -> Result<(), TestkitError> {
        let target = &self.nodes[to];
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let mut agreed = true;
            for node in self.nodes.iter().filter(|node| node.is_running()) {
                if slot_owner_seen_by(node, slot).await != Some(Some(target.port())) {
                    agreed = false;
                    break;
                }
            }
            if agreed {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(cluster_error(format!(
                    "the nodes did not agree within {FORM_TIMEOUT:?} that slot {slot} moved to \
                     node {to} (port {})",
                    target.port()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Kills node `index` with `SIGKILL` (its port stays reserved). After the node timeout its
    /// replica, if any, is promoted by the others: see [`wait_ready`](RedisCluster::wait_ready).
    ///
    /// # Panics
    /// When `index` is out of range.
    pub fn kill_node(&mut self, index: usize) {
        self.nodes[index].kill();
    }

    /// Stops node `index` with `SIGSTOP`: it keeps its connections but answers nothing until
    /// [`resume_node`](RedisCluster::resume_node); past the node timeout the others treat it as
    /// failed.
    ///
    /// # Errors
    /// When the node is not running or the signal cannot be sent.
    ///
    /// # Panics
    /// When `index` is out of range.
    pub fn pause_node(&self, index: usize) -> Result<(), TestkitError> {
        self.nodes[index].pause()
    }

    /// Continues a node stopped by [`pause_node`](RedisCluster::pause_node).
    ///
    /// # Errors
    /// When the node is not running or the signal cannot be sent.
    ///
    /// # Panics
    /// When `index` is out of range.
    pub fn resume_node(&self, index: usize) -> Result<(), TestkitError> {
        self.nodes[index].resume()
    }

    /// Makes replica node `index` take over from its primary with a coordinated
    /// `CLUSTER FAILOVER` (no writes lost), and waits until it reports itself primary and the
    /// cluster is ready again.
    ///
    /// # Errors
    /// [`TestkitError::Cluster`] when the node refuses (it is not a replica) or the failover
    /// does not complete within 30 s.
    ///
    /// # Panics
    /// When `index` is out of range.
    pub async fn failover(&self, index: usize) -> Result<(), TestkitError> {
        let node = &self.nodes[index];
        expect_ok(node, &["CLUSTER", "FAILOVER"]).await?;
        let deadline = Instant::now() + FORM_TIMEOUT;
        loop {
            let role = node.command(&["ROLE"]).await?;
            let is_primary = role
                .as_array()
                .and_then(|fields| fields.first())
                .and_then(RespValue::as_str)
                == Some("master");
            if is_primary {
                return self.wait_ready().await;
            }
            if Instant::now() >= deadline {
                return Err(cluster_error(format!(
                    "node {index} (port {}) did not become primary within {FORM_TIMEOUT:?}",
                    node.port()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// A slot move about to start: the current owner's index and node id, the target's node id.
struct Move {
    from: usize,
    source_id: String,
    target_id: String,
}

/// What the kit reads of one atomic slot migration job (`CLUSTER GETSLOTMIGRATIONS`).
#[derive(Debug, Default)]
struct SlotMigration {
    name: String,
    target_node: String,
    /// `success`, `failed`, `cancelled`, or a state of a job under way.
    state: String,
    message: String,
}

/// The atomic slot migration jobs `node` lists (`CLUSTER GETSLOTMIGRATIONS`: one flat
/// field/value array per job).
async fn slot_migrations(node: &RedisServer) -> Result<Vec<SlotMigration>, TestkitError> {
    let reply = node.command(&["CLUSTER", "GETSLOTMIGRATIONS"]).await?;
    let jobs = reply.as_array().ok_or_else(|| {
        cluster_error(format!(
            "CLUSTER GETSLOTMIGRATIONS on port {} answered {reply:?}",
            node.port()
        ))
    })?;
    Ok(jobs
        .iter()
        .filter_map(RespValue::as_array)
        .map(|fields| {
            let mut job = SlotMigration::default();
            for pair in fields.chunks_exact(2) {
                let value = pair[1].as_str().unwrap_or_default().to_owned();
                match pair[0].as_str() {
                    Some("name") => job.name = value,
                    Some("target_node") => job.target_node = value,
                    Some("state") => job.state = value,
                    Some("message") => job.message = value,
                    _ => {}
                }
            }
            job
        })
        .collect())
}

/// Whether `node` is a primary (`ROLE`).
async fn is_primary(node: &RedisServer) -> Result<bool, TestkitError> {
    let role = node.command(&["ROLE"]).await?;
    Ok(role
        .as_array()
        .and_then(|fields| fields.first())
        .and_then(RespValue::as_str)
        == Some("master"))
}

/// What the kit needs to know of one node while waiting.
#[derive(Debug)]
struct NodeState {
    port: u16,
    state_ok: bool,
    known_nodes: usize,
    /// True for a primary; for a replica, whether its link to the primary is up.
    link_up: bool,
    error: Option<String>,
}

impl NodeState {
    fn describe(&self) -> String {
        format!(
            "port {}: state ok {}, known nodes {}, replication link up {}{}",
            self.port,
            self.state_ok,
            self.known_nodes,
            self.link_up,
            self.error
                .as_deref()
                .map(|err| format!(", error: {err}"))
                .unwrap_or_default()
        )
    }

    async fn read(node: &RedisServer) -> NodeState {
        let mut state = NodeState {
            port: node.port(),
            state_ok: false,
            known_nodes: 0,
            link_up: false,
            error: None,
        };
        match node.command(&["CLUSTER", "INFO"]).await {
            Ok(reply) => {
                let info = reply.as_str().unwrap_or_default();
                state.state_ok = info_field(info, "cluster_state") == Some("ok");
                state.known_nodes = info_field(info, "cluster_known_nodes")
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
            }
            Err(err) => state.error = Some(err.to_string()),
        }
        match node.command(&["INFO", "replication"]).await {
            Ok(reply) => {
                let info = reply.as_str().unwrap_or_default();
                state.link_up = info_field(info, "role") == Some("master")
                    || info_field(info, "master_link_status") == Some("up");
            }
            Err(err) => state.error = Some(err.to_string()),
        }
        state
    }
}

/// The value of `field:value` in an `INFO`-style reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// The port of the primary serving `slot` as `node` sees it (`CLUSTER SLOTS`): `None` when the
/// node does not answer, `Some(None)` when it knows no owner.
async fn slot_owner_seen_by(node: &RedisServer, slot: u16) -> Option<Option<u16>> {
    let reply = node.command(&["CLUSTER", "SLOTS"]).await.ok()?;
    let ranges = reply.as_array()?;
    for range in ranges {
        let Some(fields) = range.as_array() else {
            continue;
        };
        let (Some(first), Some(last)) = (
            fields.first().and_then(RespValue::as_int),
            fields.get(1).and_then(RespValue::as_int),
        ) else {
            continue;
        };
        if (first..=last).contains(&i64::from(slot)) {
            return Some(
                fields
                    .get(2)
                    .and_then(RespValue::as_array)
                    .and_then(|primary| primary.get(1))
                    .and_then(RespValue::as_int)
                    .and_then(|port| u16::try_from(port).ok()),
            );
        }
    }
    Some(None)
}

/// The first and last slot of primary `i` of `n`.
fn slot_share(i: usize, n: usize) -> (u32, u32) {
    let n = n as u32;
    let i = i as u32;
    (SLOTS * i / n, SLOTS * (i + 1) / n - 1)
}

async fn expect_ok(node: &RedisServer, args: &[&str]) -> Result<(), TestkitError> {
    match node.command(args).await? {
        RespValue::Simple(ok) if ok == "OK" => Ok(()),
        other => Err(cluster_error(format!(
            "{} on port {} answered {other:?}",
            args.join(" "),
            node.port()
        ))),
    }
}

async fn expect_str(node: &RedisServer, args: &[&str]) -> Result<String, TestkitError> {
    let reply = node.command(args).await?;
    match reply.as_str() {
        Some(text) => Ok(text.to_owned()),
        None => Err(cluster_error(format!(
            "{} on port {} answered {reply:?}",
            args.join(" "),
            node.port()
        ))),
    }
}

fn cluster_error(detail: String) -> TestkitError {
    TestkitError::Cluster { detail }
}

#[cfg(test)]
mod tests {
    use super::{info_field, slot_share, SLOTS};

    #[test]
    fn slot_shares_cover_every_slot_once() {
        for n in 1..=7 {
            let mut next = 0;
            for i in 0..n {
                let (first, last) = slot_share(i, n);
                assert_eq!(first, next);
                assert!(last >= first);
                next = last + 1;
            }
            assert_eq!(next, SLOTS);
        }
    }

    #[test]
    fn reads_info_fields() {
        let info = "# Cluster\r\ncluster_state:ok\r\ncluster_known_nodes:6\r\n";
        assert_eq!(info_field(info, "cluster_state"), Some("ok"));
        assert_eq!(info_field(info, "cluster_known_nodes"), Some("6"));
        assert_eq!(info_field(info, "cluster_size"), None);
    }
}
