//! `lockkit`: look at lockkit's objects in Redis, watch them, force-unlock a stuck lock, and run
//! a small contention demo.
//!
//! Run `lockkit --help` for the commands and exit codes; `docs/guide.md` ("Command-line tool")
//! has examples.

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::builder::PossibleValue;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;
use fred::interfaces::{ClientLike, EventInterface, KeysInterface, PubsubInterface};
use futures::{StreamExt, TryStreamExt};
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::{Client, Error, Inspection, Leader, LeaderChange, PubSubMode};
use serde_json::{json, Value};

/// Exit code: the object does not exist (or the lock to force-unlock is free).
const NOT_FOUND: u8 = 1;
/// Exit code: bad command line or argument (clap uses it for its own usage errors).
const USAGE: u8 = 2;
/// Exit code: Redis could not be reached, or answered with an error.
const REDIS: u8 = 3;
/// Exit code: the operation was not confirmed.
const REFUSED: u8 = 4;
/// Exit code: `list --held` found an object held (none held: 0).
const HELD: u8 = 5;

const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  not found: inspect of a missing object, force-unlock of a free lock
  2  usage error: bad arguments or options
  3  Redis error: cannot connect, command failed, key of an unexpected type
  4  refused: force-unlock not confirmed (no terminal to ask on and no --yes)
  5  held: list --held found an object held (nothing held: 0)";

/// Inspect, list, watch and force-unlock lockkit's locks in Redis.
#[derive(Debug, Parser)]
#[command(name = "lockkit", version, after_help = EXIT_CODES)]
struct Cli {
    /// Redis URL (redis://, rediss://, redis-cluster://, redis-sentinel://)
    // `hide_env_values`: the URL may carry a password, which `--help` must not print.
    #[arg(
        long,
        global = true,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379"
    )]
    url: String,
    /// Key prefix of the application's objects (ClientBuilder::key_prefix)
    #[arg(long, global = true, default_value = lockkit::protocol::keys::DEFAULT_PREFIX)]
    prefix: String,
    /// Print JSON instead of tables (watch: one JSON document per line)
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show an object: kind, holders and hold counts, TTL, queued waiters, fencing counter; an
    /// election's leader, term, lease and candidates; a rate limiter's limit, the permits one
    /// request could take now, and its reservations still to come (who waits, how far ahead)
    Inspect {
        /// The object's name
        name: String,
        /// Only this kind
        #[arg(long)]
        kind: Option<KindArg>,
    },
    /// List the objects whose name matches a glob pattern (`*`, `?`), by SCAN (never KEYS), with
    /// their holders, waiters and lease
    ///
    /// An object is held when it has a holder: a lock of any kind, a semaphore with a permit
    /// taken, an election with a leader (announced or not); a rate limiter when calls wait on
    /// it (reservations still to come). A fencing counter or an election's term counter left
    /// after the release, a latch's count, a `once_per` mark and a rate limiter's limit are not
    /// holds.
    List {
        /// Glob over object names [default: every object]
        pattern: Option<String>,
        /// Only the held objects; exit 5 when there is one, 0 when nothing is held
        #[arg(long)]
        held: bool,
    },
    /// Print an object's state, then every change of its holders or waiters; an election's
    /// leader, then every change of leader (elected, new value, resigned); a rate limiter's
    /// limit, available permits and waiting calls, then every change of them
    ///
    /// An election (`--kind election`, or the only object of that name) is followed through its
    /// change channel: one line per change, in order; after a reconnection a line says that
    /// changes may have been missed, with the leader then.
    Watch {
        /// The object's name
        name: String,
        /// Only this kind
        #[arg(long)]
        kind: Option<KindArg>,
        /// Stop after this many changes [default: until Ctrl-C]
        #[arg(long)]
        count: Option<u64>,
    },
    /// Release a lock whoever holds it (its holders see their guards lost)
    ForceUnlock {
        /// The lock's name
        name: String,
        /// Only this kind (lock, fenced, fair, rwlock, spin)
        #[arg(long)]
        kind: Option<KindArg>,
        /// Do not ask for confirmation
        #[arg(long)]
        yes: bool,
    },
    /// Sell tickets from several clients under one Lock, and count who sold how many
    Demo {
        /// Clients (each one a "pod" with its own connection)
        #[arg(long, default_value_t = 3)]
        clients: u32,
        /// Buyer tasks per client
        #[arg(long, default_value_t = 10)]
        tasks: u32,
        /// Tickets on sale
        #[arg(long, default_value_t = 100)]
        tickets: u64,
    },
    /// Print a shell completion script
    ///
    /// For bash: `lockkit completions bash > ~/.local/share/bash-completion/completions/lockkit`
    Completions {
        /// The shell
        shell: Shell,
    },
}

/// A `--kind` value: one of lockkit's kinds, named by its key segment (`lock`, `fenced`,
/// `fair`, ...). The values are [`Kind::ALL`], so a new kind is accepted (and completed) without
/// a change here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KindArg(Kind);

/// [`Kind::ALL`] as `--kind` values.
const KIND_ARGS: [KindArg; Kind::ALL.len()] = {
    let mut args = [KindArg(Kind::Lock); Kind::ALL.len()];
    let mut index = 0;
    while index < args.len() {
        args[index] = KindArg(Kind::ALL[index]);
        index += 1;
    }
    args
};

impl ValueEnum for KindArg {
    fn value_variants<'a>() -> &'a [Self] {
        &KIND_ARGS
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(self.0.segment()))
    }
}

/// A failure with the exit code it maps to.
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An exit code that is an answer, not an error (`list --held` found something held): the
    /// output already says it, nothing goes to standard error.
    fn answer(code: u8) -> Self {
        Self::new(code, String::new())
    }
}

impl From<Error> for Failure {
    fn from(err: Error) -> Self {
        let code = match err {
            Error::InvalidArgument(_) => USAGE,
            _ => REDIS,
        };
        let mut message = chain(&err);
        if matches!(err, Error::Connect { .. }) {
            // The library's hint speaks of "the URL this program gave lockkit": say where this
            // program takes it from.
            message.push_str("; the URL comes from --url, else REDIS_URL");
        }
        Failure::new(code, message)
    }
}

/// `err` and its sources on one line, joined by `: `. lockkit's errors carry their cause in
/// their own text and leave it out of `source()`, so each cause shows once: a refused
/// connection is the one line `cannot connect to 127.0.0.1:6379: connection refused (is Redis
/// running at that address? ...)`, a failed command `redis error during <operation>: <Redis'
/// reply>`.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut line = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        source = cause.source();
    }
    line
}

impl From<fred::error::Error> for Failure {
    fn from(err: fred::error::Error) -> Self {
        Failure::new(REDIS, format!("redis error: {err}"))
    }
}

/// Writes the completion script of `shell` to standard output (like `println!`, a failed write
/// panics).
fn completions(shell: Shell) {
    clap_complete::generate(
        shell,
        &mut Cli::command(),
        "lockkit",
        &mut std::io::stdout(),
    );
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // `--help` and `--version` exit 0, usage errors 2.
        Err(err) => err.exit(),
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("lockkit: cannot start the async runtime: {err}");
            return ExitCode::from(REDIS);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            if !failure.message.is_empty() {
                eprintln!("lockkit: {}", failure.message);
            }
            ExitCode::from(failure.code)
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if let Command::Completions { shell } = cli.command {
        // Needs no Redis.
        completions(shell);
        return Ok(());
    }
    let url = cli.url.clone();
    let client = Client::builder()
        .url(url.clone())
        .key_prefix(cli.prefix.clone())
        .connect_timeout(Duration::from_secs(5))
        .build()
        .await?;
    let result = match cli.command {
        Command::Inspect { ref name, kind } => {
            inspect(&client, &cli, kind.map(|k| k.0), name).await
        }
        Command::List { ref pattern, held } => list(&client, &cli, pattern.as_deref(), held).await,
        Command::Watch {
            ref name,
            kind,
            count,
        } => watch(&client, &cli, &url, kind.map(|k| k.0), name, count).await,
        Command::ForceUnlock {
            ref name,
            kind,
            yes,
        } => force_unlock(&client, &cli, kind.map(|k| k.0), name, yes).await,
        Command::Demo {
            clients,
            tasks,
            tickets,
        } => demo(&cli, &url, clients, tasks, tickets).await,
        // Printed above, without connecting.
        Command::Completions { .. } => Ok(()),
    };
    let _ = client.shutdown().await;
    result
}

async fn inspect(
    client: &Client,
    cli: &Cli,
    kind: Option<Kind>,
    name: &str,
) -> Result<(), Failure> {
    let found = client.inspect(kind, name).await?;
    if cli.json {
        println!("{}", serde_json::to_value(&found).map_err(json_error)?);
    } else {
        for object in &found {
            if object.kind == Kind::Election {
                print!("{}", election_table(object));
            } else if object.kind == Kind::RateLimiter {
                print!("{}", rate_limiter_table(object));
            } else {
                print!("{}", table(object));
            }
        }
    }
    if found.is_empty() {
        return Err(Failure::new(NOT_FOUND, format!("no object named {name:?}")));
    }
    Ok(())
}

/// Whether `object` is held, for `list`: it has a holder (a lock of any kind: an owner; a
/// semaphore: a permit taken; an election: its leader, announced or not). A latch's count and a
/// `once_per` mark (kept until its window ends, by design) are no holds; a fencing counter or
/// an election's term counter alone (kept a day after the release) has no holder. A rate
/// limiter has no holders (admitted permits are spent, not held): it counts as held while calls
/// wait on it, its reservations still to come, so that `list --held` after a shutdown says
/// whether a call is still about to hit the rate-limited service.
fn is_held(object: &Inspection) -> bool {
    match object.kind {
        Kind::CountDownLatch | Kind::OnceMark => false,
        Kind::RateLimiter => !object.waiters.is_empty(),
        _ => !object.holders.is_empty(),
    }
}

/// How many objects `list` reads at once.
const LIST_READS: usize = 16;

async fn list(
    client: &Client,
    cli: &Cli,
    pattern: Option<&str>,
    held_only: bool,
) -> Result<(), Failure> {
    let listed = client.list(pattern).await?;
    // Each object as `inspect` reads it (an object gone since the scan reads as nothing).
    let found: Vec<Vec<Inspection>> = futures::stream::iter(
        listed
            .iter()
            .map(|object| client.inspect(Some(object.kind), &object.name)),
    )
    .buffered(LIST_READS)
    .try_collect()
    .await?;
    let objects: Vec<Inspection> = found
        .into_iter()
        .flatten()
        .filter(|object| !held_only || is_held(object))
        .collect();
    if cli.json {
        let mut values = Vec::with_capacity(objects.len());
        for object in &objects {
            let mut value = serde_json::to_value(object).map_err(json_error)?;
            if let Some(map) = value.as_object_mut() {
                map.insert("held".into(), Value::Bool(is_held(object)));
            }
            values.push(value);
        }
        println!("{}", Value::Array(values));
    } else {
        print!("{}", list_table(&objects));
    }
    if held_only && !objects.is_empty() {
        return Err(Failure::answer(HELD));
    }
    Ok(())
}

/// `list`'s table: per object its kind, name, waiters, lease and holders.
fn list_table(objects: &[Inspection]) -> String {
    let name_width = objects
        .iter()
        .map(|object| object.name.chars().count())
        .max()
        .unwrap_or(0)
        .max("NAME".len());
    let mut out = format!(
        "{:<12} {:<name_width$}  {:>7}  {:<9}  HOLDERS\n",
        "KIND", "NAME", "WAITERS", "LEASE"
    );
    for object in objects {
        let waiters = if object.waiters_listed {
            object.waiters.len().to_string()
        } else {
            "-".to_owned()
        };
        let (lease, holders) = if is_held(object) && object.kind != Kind::RateLimiter {
            // The longest lease left among the holders; a holder without one never expires.
            let lease = if object.holders.iter().any(|holder| holder.lease.is_none()) {
                None
            } else {
                object
                    .holders
                    .iter()
                    .filter_map(|holder| holder.lease)
                    .max()
            };
            let holders: Vec<String> = object.holders.iter().map(holder_text).collect();
            let holders = match &object.leader {
                Some(leader) => format!("{:?}: {}", leader.value, holders.join(", ")),
                None => holders.join(", "),
            };
            (human(lease), holders)
        } else {
            ("-".to_owned(), "-".to_owned())
        };
        out.push_str(&format!(
            "{:<12} {:<name_width$}  {waiters:>7}  {lease:<9}  {holders}\n",
            object.kind.segment(),
            object.name,
        ));
    }
    out
}

/// A holder in words: its owner, access and holds (`4b1c…:17 (×2)`, `9e0a…:3 (read ×1)`).
fn holder_text(holder: &lockkit::Holder) -> String {
    match &holder.access {
        Some(access) => format!("{} ({access} ×{})", holder.owner, holder.holds),
        None => format!("{} (×{})", holder.owner, holder.holds),
    }
}

/// The kinds that can be force-unlocked.
const UNLOCKABLE: [Kind; 5] = [
    Kind::Lock,
    Kind::FencedLock,
    Kind::FairLock,
    Kind::ReadWriteLock,
    Kind::SpinLock,
];

async fn force_unlock(
    client: &Client,
    cli: &Cli,
    kind: Option<Kind>,
    name: &str,
    yes: bool,
) -> Result<(), Failure> {
    if let Some(kind) = kind.filter(|kind| !UNLOCKABLE.contains(kind)) {
        return Err(Failure::new(
            USAGE,
            format!("a {} cannot be force-unlocked", kind.describe()),
        ));
    }
    let found = client.inspect(kind, name).await?;
    let held: Vec<Kind> = found
        .iter()
        .filter(|object| UNLOCKABLE.contains(&object.kind) && !object.holders.is_empty())
        .map(|object| object.kind)
        .collect();
    let kind = match held.as_slice() {
        [] => return Err(nothing_to_unlock(&found, name)),
        [kind] => *kind,
        several => {
            let kinds: Vec<&str> = several.iter().map(|kind| kind.segment()).collect();
            return Err(Failure::new(
                USAGE,
                format!(
                    "several locks are named {name:?} ({}): choose one with --kind",
                    kinds.join(", ")
                ),
            ));
        }
    };
    if !yes {
        confirm(kind, name)?;
    }
    let was_held = match kind {
        Kind::Lock => client.lock(name).force_unlock().await?,
        Kind::FencedLock => client.fenced_lock(name).force_unlock().await?,
        Kind::FairLock => client.fair_lock(name).force_unlock().await?,
        Kind::ReadWriteLock => client.read_write_lock(name).force_unlock().await?,
        _ => client.spin_lock(name).force_unlock().await?,
    };
    if cli.json {
        println!(
            "{}",
            json!({"kind": kind.segment(), "name": name, "unlocked": was_held})
        );
    } else if was_held {
        println!("{} {name:?} force-unlocked", kind.describe());
    }
    if !was_held {
        return Err(Failure::new(
            NOT_FOUND,
            format!("{} {name:?} was already free", kind.describe()),
        ));
    }
    Ok(())
}

/// Why `force-unlock` has nothing to do, given the objects called `name` (`found`): the locks of
/// that name are free; or what is there is no lock (a semaphore, a latch, ...), which
/// force-unlock is not for; or nothing is called so.
fn nothing_to_unlock(found: &[Inspection], name: &str) -> Failure {
    let locks: Vec<&str> = found
        .iter()
        .filter(|object| UNLOCKABLE.contains(&object.kind))
        .map(|object| object.kind.describe())
        .collect();
    let others: Vec<String> = found
        .iter()
        .filter(|object| !UNLOCKABLE.contains(&object.kind))
        .map(|object| with_article(object.kind.describe()))
        .collect();
    if !locks.is_empty() {
        return Failure::new(
            NOT_FOUND,
            format!("the {} {name:?} is not held", locks.join(" and the ")),
        );
    }
    if !others.is_empty() {
        let unlockable: Vec<&str> = UNLOCKABLE.iter().map(|kind| kind.segment()).collect();
        return Failure::new(
            USAGE,
            format!(
                "{name:?} is {}, not a lock: force-unlock is for locks ({})",
                others.join(" and "),
                unlockable.join(", ")
            ),
        );
    }
    Failure::new(
        NOT_FOUND,
        format!("nothing is named {name:?}: no lock to unlock"),
    )
}

/// `what` with its indefinite article: "a semaphore", "an election".
fn with_article(what: &str) -> String {
    let article = if what.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    };
    format!("{article} {what}")
}

/// Asks for the name on a terminal; refuses without one.
fn confirm(kind: Kind, name: &str) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::new(
            REFUSED,
            "refusing to force-unlock without confirmation: no terminal to ask on; pass --yes",
        ));
    }
    eprint!(
        "Force-unlock the {} {name:?}? Its holders lose it. Type the name to confirm: ",
        kind.describe()
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    if stdin.lock().read_line(&mut answer).is_err() || answer.trim_end_matches(['\r', '\n']) != name
    {
        return Err(Failure::new(REFUSED, "not confirmed; nothing was changed"));
    }
    Ok(())
}

async fn watch(
    client: &Client,
    cli: &Cli,
    url: &str,
    kind: Option<Kind>,
    name: &str,
    count: Option<u64>,
) -> Result<(), Failure> {
    let election = match kind {
        Some(kind) => kind == Kind::Election,
        // The only object of that name is an election.
        None => {
            let found = client.inspect(None, name).await?;
            !found.is_empty() && found.iter().all(|object| object.kind == Kind::Election)
        }
    };
    if election {
        return watch_election(client, cli, name, count).await;
    }
    // Release messages trigger a re-read at once; a tick every second catches the rest
    // (acquisitions publish nothing, leases run out silently).
    let mut messages = match subscribe(client, url, kind, name, &cli.prefix).await {
        Ok(subscriber) => Some(subscriber),
        Err(err) => {
            eprintln!("lockkit: watching by polling only (cannot subscribe: {err})");
            None
        }
    };
    let started = Instant::now();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    let mut last: Option<Value> = None;
    let mut changes = 0;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let found = client.inspect(kind, name).await?;
        let objects = serde_json::to_value(&found).map_err(json_error)?;
        let essence = essence(objects.clone());
        if last.as_ref() != Some(&essence) {
            let elapsed = started.elapsed().as_secs_f64();
            if cli.json {
                println!("{}", json!({"elapsed_s": elapsed, "objects": objects}));
            } else if found.is_empty() {
                println!("[+{elapsed:.3}s] {name:?}: no such object");
            } else {
                for object in &found {
                    println!("[+{elapsed:.3}s] {}", summary(object));
                }
            }
            let _ = std::io::stdout().flush();
            if last.is_some() {
                changes += 1;
                if count.is_some_and(|count| changes >= count) {
                    break;
                }
            }
            last = Some(essence);
        }
        tokio::select! {
            _ = &mut interrupted => break,
            _ = ticks.tick() => {}
            _ = async {
                match messages.as_mut() {
                    Some((_, receiver)) => { let _ = receiver.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
    }
    if let Some((subscriber, _)) = messages {
        let _ = subscriber.quit().await;
    }
    Ok(())
}

/// `watch` of an election: its leader now, then one line per change, from
/// [`Election::observe`](lockkit::Election::observe).
async fn watch_election(
    client: &Client,
    cli: &Cli,
    name: &str,
    count: Option<u64>,
) -> Result<(), Failure> {
    let mut changes = client.election(name).observe();
    let started = Instant::now();
    let mut changes_seen = 0;
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    loop {
        let change = tokio::select! {
            _ = &mut interrupted => break,
            change = changes.next() => change,
        };
        let elapsed = started.elapsed().as_secs_f64();
        let change = match change {
            Some(Ok(change)) => change,
            // The client shut down (it does not while watching), or the stream ended.
            Some(Err(Error::Shutdown)) | None => break,
            // Redis is unreachable: the observer says so and tries again (backing off), then
            // yields `Resynced` once it is back. Watching goes on, as an operator expects of a
            // watch through an outage; the line says what happened.
            Some(Err(err @ Error::Redis(_))) => {
                if cli.json {
                    println!(
                        "{}",
                        json!({"change": "error", "error": err.to_string(), "elapsed_s": elapsed})
                    );
                } else {
                    println!("[+{elapsed:.3}s] election {name:?}: {err}; still watching");
                }
                let _ = std::io::stdout().flush();
                continue;
            }
            Some(Err(err)) => return Err(err.into()),
        };
        if cli.json {
            let mut line = change_json(&change);
            if let Some(map) = line.as_object_mut() {
                map.insert("elapsed_s".into(), json!(elapsed));
            }
            println!("{line}");
        } else {
            println!(
                "[+{elapsed:.3}s] election {name:?}: {}",
                change_text(&change)
            );
        }
        let _ = std::io::stdout().flush();
        // The first line (`Current`) is the state when watching began, not a change.
        if !matches!(change, LeaderChange::Current(_)) {
            changes_seen += 1;
            if count.is_some_and(|count| changes_seen >= count) {
                break;
            }
        }
    }
    Ok(())
}

/// A leader change as JSON, for `watch --json` (a leader as the library's `Serialize` of
/// [`Leader`] writes it, as in `inspect --json`): `{"change": "current" | "resynced" | "elected" |
/// "proclaimed", "leader": {"term", "value"} | null}` or `{"change": "resigned", "term": ..}`.
fn change_json(change: &LeaderChange) -> Value {
    match change {
        LeaderChange::Current(leader) => {
            json!({"change": "current", "leader": leader})
        }
        LeaderChange::Resynced(leader) => json!({
            "change": "resynced",
            "missed_changes": "possible: reconnected; this is the leader now",
            "leader": leader,
        }),
        LeaderChange::Elected(leader) => {
            json!({"change": "elected", "leader": leader})
        }
        LeaderChange::Proclaimed(leader) => {
            json!({"change": "proclaimed", "leader": leader})
        }
        LeaderChange::Resigned { term } => json!({"change": "resigned", "term": term}),
        other => json!({"change": format!("{other:?}")}),
    }
}

/// A leader change in words, for `watch`.
fn change_text(change: &LeaderChange) -> String {
    let leader = |leader: &Option<Leader>| match leader {
        Some(leader) => format!("leader {:?}, term {}", leader.value, leader.term),
        None => "no leader".to_owned(),
    };
    match change {
        LeaderChange::Current(now) => leader(now),
        LeaderChange::Resynced(now) => format!(
            "reconnected, changes may have been missed; now: {}",
            leader(now)
        ),
        LeaderChange::Elected(new) => {
            format!("{:?} elected, term {}", new.value, new.term)
        }
        LeaderChange::Proclaimed(new) => format!(
            "the leader of term {} now announces {:?}",
            new.term, new.value
        ),
        LeaderChange::Resigned { term } => format!("the leader of term {term} resigned"),
        other => format!("{other:?}"),
    }
}

type Subscription = (
    fred::clients::SubscriberClient,
    tokio::sync::broadcast::Receiver<fred::types::Message>,
);

/// Subscribes to the release channels of the object (of every kind when `kind` is `None`).
async fn subscribe(
    client: &Client,
    url: &str,
    kind: Option<Kind>,
    name: &str,
    prefix: &str,
) -> Result<Subscription, String> {
    let namespace = Namespace::new(prefix).map_err(|err| err.to_string())?;
    let config = fred::types::config::Config::from_url(url).map_err(|err| err.to_string())?;
    let subscriber = fred::types::Builder::from_config(config)
        .build_subscriber_client()
        .map_err(|err| err.to_string())?;
    let receiver = subscriber.message_rx();
    match tokio::time::timeout(Duration::from_secs(5), subscriber.init()).await {
        Ok(Ok(_)) => {}
        Ok(Err(err)) => return Err(err.to_string()),
        Err(_) => return Err("timed out connecting".into()),
    }
    let kinds = kind.map_or_else(|| Kind::ALL.to_vec(), |kind| vec![kind]);
    for kind in kinds {
        let channel = namespace
            .object(kind, name)
            .map_err(|err| err.to_string())?
            .channel;
        let subscribed = if client.pubsub_mode() == PubSubMode::Sharded {
            subscriber.ssubscribe(channel).await
        } else {
            subscriber.subscribe(channel).await
        };
        subscribed.map_err(|err| err.to_string())?;
    }
    Ok((subscriber, receiver))
}

/// A duration for people.
fn human(duration: Option<Duration>) -> String {
    match duration {
        Some(duration) => format!("{:.1}s", duration.as_secs_f64()),
        None => "no expiry".into(),
    }
}

/// A failure of `serde_json::to_value` on lockkit's inspections or listed objects (their shape
/// comes from lockkit's `serde` feature). Cannot happen for these types (plain fields, no maps);
/// reported should that ever change.
fn json_error(err: serde_json::Error) -> Failure {
    Failure::new(REDIS, format!("cannot write the reply as JSON: {err}"))
}

/// What `watch` compares: inspections (as JSON) without the times that change on their own.
fn essence(mut found: Value) -> Value {
    for object in found.as_array_mut().into_iter().flatten() {
        if let Some(map) = object.as_object_mut() {
            map.remove("ttl_ms");
            // A rate limiter's reservation comes nearer on its own: compared by who waits.
            if map.get("kind").and_then(Value::as_str) == Some(Kind::RateLimiter.segment()) {
                if let Some(Value::Array(waiters)) = map.get_mut("waiters") {
                    for waiter in waiters {
                        if let Some((client, _)) =
                            waiter.as_str().and_then(|w| w.split_once(" in "))
                        {
                            *waiter = Value::String(client.to_owned());
                        }
                    }
                }
            }
            if let Some(Value::Array(holders)) = map.get_mut("holders") {
                for holder in holders {
                    if let Some(holder) = holder.as_object_mut() {
                        holder.remove("lease_ms");
                    }
                }
            }
        }
    }
    found
}

/// One line about an object, for `watch`.
fn summary(object: &Inspection) -> String {
    if object.kind == Kind::RateLimiter {
        return rate_limiter_summary(object);
    }
    let holders = if object.holders.is_empty() {
        "free".to_owned()
    } else {
        let holders: Vec<String> = object.holders.iter().map(holder_text).collect();
        format!("held by {}", holders.join(", "))
    };
    let mut line = format!("{} {:?}: {holders}", object.kind.describe(), object.name);
    if !object.waiters.is_empty() {
        line.push_str(&format!(", {} waiting", object.waiters.len()));
    }
    if let Some(clients) = object.waiting_clients.filter(|clients| *clients > 0) {
        line.push_str(&format!(", {clients} client(s) waiting"));
    }
    if let Some(token) = object.fencing_token {
        line.push_str(&format!(", token {token}"));
    }
    if let Some(count) = object.count {
        line.push_str(&format!(", count {count}"));
    }
    for warning in &object.warnings {
        line.push_str(&format!("; warning: {warning}"));
    }
    line
}

/// What can be said of the waiters of a kind whose waiters Redis does not keep.
fn unlisted_waiters(object: &Inspection) -> String {
    let kind = object.kind.describe();
    match (object.kind, object.waiting_clients) {
        (Kind::OnceMark, _) => "none (once_per never waits)".into(),
        (Kind::SpinLock, _) => {
            format!("not kept in Redis for a {kind} (its waiters poll): cannot be listed")
        }
        (_, Some(0)) => "none (no client is subscribed to its channel)".into(),
        (_, Some(clients)) => format!(
            "not kept in Redis for a {kind}: {clients} client(s) subscribed to its channel, \
             each with one or more tasks waiting (or watching)"
        ),
        (_, None) => format!(
            "not kept in Redis for a {kind}, and its channel's subscribers could not be \
             counted: cannot be listed"
        ),
    }
}

/// An inspection as a small table.
fn table(object: &Inspection) -> String {
    let mut out = format!(
        "{} {:?}  (key {})\n",
        object.kind.describe(),
        object.name,
        object.key
    );
    let mut row = |label: &str, value: String| out.push_str(&format!("  {label:<14} {value}\n"));
    row("ttl", human(object.ttl));
    if let Some(mode) = &object.mode {
        row("mode", mode.clone());
    }
    if let Some(token) = object.fencing_token {
        row("fencing token", token.to_string());
    }
    if object.permits.is_some() || object.used_permits.is_some() {
        let permits = object
            .permits
            .map_or("unset".into(), |permits| permits.to_string());
        row(
            "permits",
            format!("{} used of {permits}", object.used_permits.unwrap_or(0)),
        );
    }
    if let Some(count) = object.count {
        row("count", count.to_string());
    }
    if object.holders.is_empty() {
        row("holders", "none".into());
    } else {
        row(
            "holders",
            format!("{:<44} {:>5}  {:<6} LEASE", "OWNER", "HOLDS", "ACCESS"),
        );
        for holder in &object.holders {
            row(
                "",
                format!(
                    "{:<44} {:>5}  {:<6} {}",
                    holder.owner,
                    holder.holds,
                    holder.access.as_deref().unwrap_or("-"),
                    human(holder.lease)
                ),
            );
        }
    }
    if !object.waiters_listed {
        row("waiters", unlisted_waiters(object));
    } else if object.waiters.is_empty() {
        row("waiters", "none".into());
    } else {
        for (index, waiter) in object.waiters.iter().enumerate() {
            row(
                if index == 0 { "waiters" } else { "" },
                format!("{}. {waiter}", index + 1),
            );
        }
    }
    if let Some(evictions) = object.evictions {
        row("evictions", evictions.to_string());
    }
    for (index, warning) in object.warnings.iter().enumerate() {
        row(if index == 0 { "warnings" } else { "" }, warning.clone());
    }
    out
}

/// A rate limit in words: `100 per 1s, burst 5 (up to 6 at once), overall`.
fn limit_text(limit: &lockkit::RateLimit) -> String {
    let interval = limit.interval();
    let interval = if interval.subsec_millis() == 0 {
        format!("{}s", interval.as_secs())
    } else {
        format!("{}ms", interval.as_millis())
    };
    let mode = match limit.mode() {
        lockkit::RateMode::PerClient => "per client",
        _ => "overall",
    };
    format!(
        "{} per {interval}, burst {} (up to {} at once), {mode}",
        limit.permits(),
        limit.burst(),
        limit.max_per_request()
    )
}

/// A rate limiter's stored limit, or that none is stored.
const NO_LIMIT: &str = "none stored (a handle's with_limit stores it at its next request)";

/// A rate limiter in one line, for `watch`.
fn rate_limiter_summary(object: &Inspection) -> String {
    let mut line = format!("rate limiter {:?}: ", object.name);
    match &object.rate_limit {
        Some(limit) => line.push_str(&limit_text(limit)),
        None => line.push_str("no limit stored"),
    }
    if let Some(available) = object.available {
        line.push_str(&format!("; {available} available"));
    }
    line.push_str(&format!(", {} waiting", object.waiters.len()));
    for warning in &object.warnings {
        line.push_str(&format!("; warning: {warning}"));
    }
    line
}

/// A rate limiter as a small table: its limit, the permits one request could take now, and its
/// reservations still to come (who waits, and how far ahead its permits are admitted).
fn rate_limiter_table(object: &Inspection) -> String {
    let mut out = format!("rate limiter {:?}  (key {})\n", object.name, object.key);
    let mut row = |label: &str, value: String| out.push_str(&format!("  {label:<14} {value}\n"));
    match &object.rate_limit {
        Some(limit) => row("limit", limit_text(limit)),
        None => row("limit", NO_LIMIT.into()),
    }
    if let Some(available) = object.available {
        row("available", available.to_string());
    }
    if object.waiters.is_empty() {
        row("waiters", "none".into());
    } else {
        for (index, waiter) in object.waiters.iter().enumerate() {
            row(
                if index == 0 { "waiters" } else { "" },
                format!("{}. {waiter}", index + 1),
            );
        }
    }
    for (index, warning) in object.warnings.iter().enumerate() {
        row(if index == 0 { "warnings" } else { "" }, warning.clone());
    }
    out
}

/// An election as a small table: its leader (from the leader record), term, lease and candidates
/// (the hold and waiting set of its fenced-lock side).
fn election_table(object: &Inspection) -> String {
    let mut out = format!("election {:?}  (key {})\n", object.name, object.key);
    let mut row = |label: &str, value: String| out.push_str(&format!("  {label:<14} {value}\n"));
    match &object.leader {
        Some(leader) => {
            row("leader", format!("{:?}", leader.value));
            row("term", leader.term.to_string());
        }
        None if object.holders.is_empty() => row("leader", "none".into()),
        // Granted, not announced yet (or its announcement belongs to an ended term).
        None => row("leader", "none announced".into()),
    }
    if let Some(token) = object.fencing_token {
        row("last term", token.to_string());
    }
    for holder in &object.holders {
        row("held by", holder.owner.clone());
        row("lease", human(holder.lease));
    }
    if object.waiters.is_empty() {
        row("candidates", "none".into());
    } else {
        for (index, candidate) in object.waiters.iter().enumerate() {
            row(
                if index == 0 { "candidates" } else { "" },
                format!("{}. {candidate}", index + 1),
            );
        }
    }
    for (index, warning) in object.warnings.iter().enumerate() {
        row(if index == 0 { "warnings" } else { "" }, warning.clone());
    }
    out
}

/// The ticket sale: `clients` clients × `tasks` buyers sell `tickets` tickets kept in one Redis
/// key, each sale under the same Lock; prints who sold how many and checks none was sold twice.
async fn demo(cli: &Cli, url: &str, clients: u32, tasks: u32, tickets: u64) -> Result<(), Failure> {
    if clients == 0 || tasks == 0 {
        return Err(Failure::new(
            USAGE,
            "--clients and --tasks must be positive",
        ));
    }
    let run = format!("{}-demo:{}", cli.prefix, std::process::id());
    let stock_key = format!("{run}:stock");
    let config = fred::types::config::Config::from_url(url)?;
    let redis = fred::types::Builder::from_config(config).build()?;
    redis.init().await?;
    redis
        .set::<(), _, _>(stock_key.as_str(), tickets, None, None, false)
        .await?;
    let mut pods = Vec::new();
    for _ in 0..clients {
        pods.push(
            Client::builder()
                .url(url)
                .key_prefix(cli.prefix.clone())
                .build()
                .await?,
        );
    }
    let started = Instant::now();
    let sold: Vec<Arc<AtomicU64>> = (0..clients).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let mut buyers = tokio::task::JoinSet::new();
    for (pod, sold) in pods.iter().zip(&sold) {
        for _ in 0..tasks {
            let (lock, redis, key, sold) = (
                pod.lock(format!("{run}:sale")),
                redis.clone(),
                stock_key.clone(),
                sold.clone(),
            );
            buyers.spawn(async move {
                loop {
                    let guard = lock.lock().await?;
                    let left: u64 = redis.get(key.as_str()).await?;
                    if left == 0 {
                        guard.unlock().await?;
                        return Ok::<(), Failure>(());
                    }
                    redis
                        .set::<(), _, _>(key.as_str(), left - 1, None, None, false)
                        .await?;
                    sold.fetch_add(1, Ordering::Relaxed);
                    guard.unlock().await?;
                }
            });
        }
    }
    let mut failure = None;
    while let Some(joined) = buyers.join_next().await {
        match joined {
            Ok(Ok(())) => {}
            Ok(Err(err)) => failure = Some(err),
            Err(err) => failure = Some(Failure::new(REDIS, format!("a buyer task failed: {err}"))),
        }
    }
    let elapsed = started.elapsed();
    let left: u64 = redis.get(stock_key.as_str()).await?;
    let _: i64 = redis.del(stock_key.as_str()).await?;
    for pod in &pods {
        let _ = pod.shutdown().await;
    }
    let _ = redis.quit().await;
    if let Some(failure) = failure {
        return Err(failure);
    }
    let counts: Vec<u64> = sold
        .iter()
        .map(|sold| sold.load(Ordering::Relaxed))
        .collect();
    let total: u64 = counts.iter().sum();
    let oversold = total + left != tickets;
    if cli.json {
        println!(
            "{}",
            json!({"tickets": tickets, "sold": counts, "total": total, "left": left,
                   "oversold": oversold, "elapsed_ms": elapsed.as_millis() as u64})
        );
    } else {
        println!(
            "{tickets} tickets, {clients} clients × {tasks} buyers, one Lock ({:.0} ms)",
            elapsed.as_secs_f64() * 1000.0
        );
        println!("{:<10} SOLD", "CLIENT");
        for (index, count) in counts.iter().enumerate() {
            println!("{:<10} {count}", format!("client-{}", index + 1));
        }
        println!("{:<10} {total} sold, {left} left", "total");
    }
    if oversold {
        return Err(Failure::new(
            REDIS,
            format!("{total} sold + {left} left != {tickets}: a ticket was sold twice"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// `watch` of a rate limiter prints a line when who waits changes, not as a reservation comes
    /// nearer on its own.
    #[test]
    fn a_reservation_coming_nearer_is_no_change() {
        let at = |ms: u64, waiters: &[&str]| {
            let waiters: Vec<String> = waiters.iter().map(|w| format!("{w} in {ms}ms")).collect();
            essence(json!([{"kind": "ratelimiter", "waiters": waiters, "ttl_ms": ms}]))
        };
        assert_eq!(at(2900, &["3f2a"]), at(1900, &["3f2a"]));
        assert_ne!(at(2900, &["3f2a"]), at(2900, &["3f2a", "3f2a"]));
        assert_ne!(at(2900, &["3f2a"]), at(2900, &["9e0a"]));
    }

    #[test]
    fn every_kind_is_a_value_named_by_its_key_segment() {
        assert_eq!(KindArg::value_variants().len(), Kind::ALL.len());
        for kind in Kind::ALL {
            assert_eq!(
                KindArg::from_str(kind.segment(), false),
                Ok(KindArg(kind)),
                "{kind:?}"
            );
        }
    }
}
