//! The nightly job of the seed's three pods, led by an election: one pod leads and runs the
//! scheduler, the others wait their turn, and the job's writes carry the leader's term, so a
//! deposed leader cannot overwrite its successor's work.
//!
//! The parent process starts three pods (processes of this example, `--pod pod-N`). Each calls
//! [`lockkit::Election::lead`] with its name: the leader runs the "nightly job" in a loop (one
//! "night" every few hundred milliseconds: read where the schedule is, do the work, record the
//! result), the other two wait in FIFO order as candidates. The result goes into a Redis hash,
//! standing in for the application's storage, through a conditional write that accepts it only
//! if its term is at least the last accepted one (a `UPDATE ... WHERE last_term <= :term`; here
//! a small Lua script).
//!
//! The parent watches the election with [`lockkit::Election::observe`], then kills the leading
//! pod with SIGKILL (no resignation: its lease must run out) and measures how long until another
//! pod leads. Then it delivers the killed pod's next write late, with its old term — as a pod
//! stalled by a long pause, or a write still in flight on the network, would — and checks that
//! the storage refuses it.
//!
//! ```text
//! cargo run -p lockkit-examples --example leader_scheduler -- --url redis://127.0.0.1:6379
//! ```
//!
//! Exits with status 1 when an invariant breaks: no pod took over within one lease (plus
//! [`REACTION`] for the pods and the observer to react on a busy machine), the new term is not
//! above the old one, the observed terms went back, or the storage accepted the stale write
//! (or lost the new leader's); 2 on bad arguments.

use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fred::interfaces::{ClientLike, HashesInterface, KeysInterface, LuaInterface};
use futures::StreamExt;
use lockkit::protocol::keys::{Kind, Namespace};
use lockkit::{Leader, LeaderChange};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::mpsc;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "\
usage: leader_scheduler [--url URL] [--lease-ms MS]

  --url URL      Redis to use (default: $REDIS_URL, else redis://127.0.0.1:6379)
  --lease-ms MS  the leader's lease, renewed by its watchdog (default 1500, at least 100)";

/// How many pods run the scheduler.
const PODS: usize = 3;
/// The default lease: short, so that a killed leader is replaced quickly.
const LEASE: Duration = Duration::from_millis(1500);
/// One "night" of the scheduler, compressed.
const NIGHT: Duration = Duration::from_millis(200);
/// How long the nightly job's work takes.
const JOB_TIME: Duration = Duration::from_millis(50);
/// How many nights the first leader runs before it is killed.
const NIGHTS_BEFORE_KILL: u32 = 3;
/// What the takeover may take beyond one lease: the candidate's retry, the new leader's
/// announcement and this process' reading of it, on a machine that may be busy.
const REACTION: Duration = Duration::from_millis(1000);
/// The bound on each wait for the pods (their start, a leader, a write), so that a broken run
/// fails instead of hanging.
const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// The storage's conditional write: the record keeps the term of the last accepted write, and a
/// write under an older term is refused. (`<`: the leader writes many times under one term.)
const TERM_FENCED_WRITE: &str = r"
local last = tonumber(redis.call('HGET', KEYS[1], 'term') or '0')
if tonumber(ARGV[2]) < last then return 0 end
redis.call('HSET', KEYS[1], 'night', ARGV[1], 'term', ARGV[2], 'by', ARGV[3])
return 1";

/// What the command line asks for.
enum Mode {
    /// The parent: start the pods and check the invariants.
    Parent { url: String, lease: Duration },
    /// One pod (started by the parent).
    Pod {
        url: String,
        lease: Duration,
        pod: String,
        election: String,
        store: String,
    },
}

fn parse_args() -> Result<Mode, String> {
    let mut url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let mut lease = LEASE;
    let (mut pod, mut election, mut store) = (None, None, None);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => {
                (flag.to_owned(), Some(value.to_owned()))
            }
            _ => (arg.clone(), None),
        };
        match flag.as_str() {
            "-h" | "--help" => return Err(String::new()),
            "--url" | "--lease-ms" | "--pod" | "--election" | "--store" => {}
            _ => return Err(format!("unknown argument {arg:?}")),
        }
        let value = inline
            .or_else(|| args.next())
            .ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--url" => url = value,
            "--lease-ms" => match value.parse::<u64>() {
                Ok(ms) if ms >= 100 => lease = Duration::from_millis(ms),
                _ => return Err(format!("--lease-ms expects at least 100, got {value:?}")),
            },
            // The pods' own arguments, given by the parent.
            "--pod" => pod = Some(value),
            "--election" => election = Some(value),
            _ => store = Some(value),
        }
    }
    match (pod, election, store) {
        (None, None, None) => Ok(Mode::Parent { url, lease }),
        (Some(pod), Some(election), Some(store)) => Ok(Mode::Pod {
            url,
            lease,
            pod,
            election,
            store,
        }),
        _ => Err("--pod, --election and --store go together (the parent passes them)".into()),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    // lockkit reports through `tracing`: print its warnings (the README's advice).
    tracing_subscriber::fmt::init();
    let mode = match parse_args() {
        Ok(mode) => mode,
        Err(msg) if msg.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("leader_scheduler: {msg}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let outcome = match mode {
        Mode::Parent { url, lease } => parent(&url, lease).await,
        Mode::Pod {
            url,
            lease,
            pod: name,
            election,
            store,
        } => pod(&url, lease, &name, &election, &store)
            .await
            .map(|()| true),
    };
    match outcome {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("leader_scheduler: {err}");
            ExitCode::FAILURE
        }
    }
}

/// A plain Redis connection for the storage.
async fn storage(url: &str) -> Result<fred::clients::Client, BoxError> {
    let store =
        fred::types::Builder::from_config(fred::types::config::Config::from_url(url)?).build()?;
    store
        .init()
        .await
        .map_err(|err| format!("cannot connect to {url}: {err}"))?;
    Ok(store)
}

/// Records night `night` as done by `pod` under `term`; whether the storage accepted it.
async fn record(
    store: &fred::clients::Client,
    key: &str,
    night: u64,
    term: u64,
    pod: &str,
) -> Result<bool, BoxError> {
    let accepted: i64 = store
        .eval(
            TERM_FENCED_WRITE,
            vec![key.to_owned()],
            vec![night.to_string(), term.to_string(), pod.to_owned()],
        )
        .await?;
    Ok(accepted == 1)
}

// ---- A pod ------------------------------------------------------------------------------------

/// One pod: campaigns with its name and, while it leads, runs the nightly job. It runs until
/// its standard input closes (the parent's way of stopping it) or it is killed.
async fn pod(
    url: &str,
    lease: Duration,
    name: &str,
    election: &str,
    store_key: &str,
) -> Result<(), BoxError> {
    let client = lockkit::Client::builder()
        .url(url)
        .watchdog_timeout(lease)
        .build()
        .await?;
    let store = storage(url).await?;
    let election = client.election(election);

    // Stopped by the parent: standard input reaches its end.
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = stop_tx.send(());
    });

    say(&format!("campaigns (lease {lease:?})"));
    // `lead` campaigns, runs the body while this pod leads, drops the body if the leadership is
    // lost and campaigns again. The body never returns: the scheduler runs until the pod stops.
    let leading = election.lead(name.to_owned(), |leadership| {
        let (store, key, name) = (store.clone(), store_key.to_owned(), name.to_owned());
        async move {
            let term = leadership.term();
            say(&format!("leads, term {term}"));
            loop {
                // The nightly job: where is the schedule, do the work, record it under the term.
                let done: Option<u64> = store.hget(&key, "night").await?;
                let night = done.unwrap_or(0) + 1;
                tokio::time::sleep(JOB_TIME).await;
                let accepted = record(&store, &key, night, term, &name).await?;
                say(&format!(
                    "night {night} written under term {term}: {}",
                    if accepted { "accepted" } else { "refused" }
                ));
                tokio::time::sleep(NIGHT).await;
            }
            #[allow(unreachable_code)]
            Ok::<(), BoxError>(())
        }
    });
    tokio::select! {
        led = leading => {
            led?;
        }
        _ = stop_rx => say("told to stop: stops campaigning (a leader hands over at once)"),
    }
    client.shutdown().await?;
    Ok(())
}

/// A line for the parent, which reads the pods' standard output.
fn say(line: &str) {
    println!("{line}");
}

// ---- The parent -------------------------------------------------------------------------------

/// What the parent hears: a pod's line, or a change of the election.
enum Event {
    Line { pod: usize, line: String },
    Change(Result<LeaderChange, lockkit::Error>),
}

struct Pod {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
}

async fn parent(url: &str, lease: Duration) -> Result<bool, BoxError> {
    let run_id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let election_name = format!("scheduler:nightly:run-{run_id}");
    let store_key = format!("scheduler:nightly:run-{run_id}:results");
    println!(
        "Leader scheduler: {PODS} pods campaign in the election {election_name:?} (lease \
         {lease:?}); the leader runs the nightly job, writing to {store_key:?} under its term."
    );
    let store = storage(url).await?;
    let client = lockkit::Client::connect(url)
        .await
        .map_err(|err| format!("cannot connect to {url}: {err}"))?;
    let election = client.election(election_name.as_str());

    let (events, mut heard) = mpsc::unbounded_channel();
    // Everyone may observe the election: this process follows its leaders from the start.
    let mut changes = election.observe();
    let observer = {
        let events = events.clone();
        tokio::spawn(async move {
            while let Some(change) = changes.next().await {
                if events.send(Event::Change(change)).is_err() {
                    break;
                }
            }
        })
    };

    let exe = std::env::current_exe()?;
    let mut pods = Vec::with_capacity(PODS);
    for index in 0..PODS {
        let name = format!("pod-{}", index + 1);
        let mut child = Command::new(&exe)
            .args(["--url", url, "--lease-ms"])
            .arg(lease.as_millis().to_string())
            .args(["--pod", &name, "--election", &election_name])
            .args(["--store", &store_key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| format!("cannot start {name}: {err}"))?;
        let stdin = child.stdin.take();
        if let Some(stdout) = child.stdout.take() {
            let events = events.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if events.send(Event::Line { pod: index, line }).is_err() {
                        break;
                    }
                }
            });
        }
        pods.push(Pod { name, child, stdin });
    }
    drop(events);

    let began = Instant::now();
    let mut watch = Watch {
        began,
        pods: pods.iter().map(|pod| pod.name.clone()).collect(),
        terms: Vec::new(),
        leader: None,
        failures: Vec::new(),
    };
    let outcome = scenario(&mut watch, &mut heard, &mut pods, &store, &store_key, lease).await;

    // Stop the pods that are left: their standard input closes, they stop campaigning and exit.
    for pod in &mut pods {
        pod.stdin = None;
    }
    for pod in &mut pods {
        match tokio::time::timeout(STEP_TIMEOUT, pod.child.wait()).await {
            Ok(Ok(_)) => {}
            _ => {
                let _ = pod.child.start_kill();
            }
        }
    }
    // What they said while stopping.
    while let Ok(event) = heard.try_recv() {
        watch.note(&event);
    }
    observer.abort();
    // The run leaves nothing behind: its storage and the election's keys (the term counter
    // would otherwise stay for a day).
    let _: i64 = store.del(&store_key).await.unwrap_or(0);
    if let Ok(keys) = Namespace::default().object(Kind::Election, &election_name) {
        let _: i64 = store.del(keys.keys).await.unwrap_or(0);
    }
    let _ = store.quit().await;
    client.shutdown().await?;

    outcome?;
    println!();
    if watch.failures.is_empty() {
        println!(
            "OK: the observed terms went up ({:?}); the killed leader was replaced within one \
             lease, and its late write was refused.",
            watch.terms
        );
        Ok(true)
    } else {
        for failure in &watch.failures {
            println!("FAILED: {failure}");
        }
        Ok(false)
    }
}

/// The parent's view of the run.
struct Watch {
    began: Instant,
    pods: Vec<String>,
    /// The terms of the leaders observed, in order.
    terms: Vec<u64>,
    /// The leader now, as observed.
    leader: Option<Leader>,
    failures: Vec<String>,
}

impl Watch {
    /// Prints `event` and follows the leader.
    fn note(&mut self, event: &Event) {
        let at = self.began.elapsed();
        match event {
            Event::Line { pod, line } => {
                let name = self.pods.get(*pod).map_or("pod-?", String::as_str);
                println!("[{name}] {at:>6.1?}  {line}");
            }
            Event::Change(Ok(change)) => {
                let leader = match change {
                    LeaderChange::Current(leader) | LeaderChange::Resynced(leader) => {
                        leader.clone()
                    }
                    LeaderChange::Elected(leader) | LeaderChange::Proclaimed(leader) => {
                        Some(leader.clone())
                    }
                    LeaderChange::Resigned { .. } => None,
                    _ => self.leader.clone(),
                };
                println!("[observer] {at:>6.1?}  {change:?}");
                if let Some(leader) = &leader {
                    if self.terms.last().is_some_and(|last| leader.term < *last) {
                        self.failures.push(format!(
                            "the observed term went back: {} after {:?}",
                            leader.term, self.terms
                        ));
                    }
                    if self.terms.last() != Some(&leader.term) {
                        self.terms.push(leader.term);
                    }
                }
                self.leader = leader;
            }
            Event::Change(Err(err)) => {
                println!("[observer] {at:>6.1?}  error: {err}");
            }
        }
    }
}

/// Waits (at most [`STEP_TIMEOUT`]) until `done` says yes of the watch after an event.
async fn until(
    what: &str,
    watch: &mut Watch,
    heard: &mut mpsc::UnboundedReceiver<Event>,
    mut done: impl FnMut(&Watch, &Event) -> bool,
) -> Result<(), BoxError> {
    let deadline = tokio::time::Instant::now() + STEP_TIMEOUT;
    loop {
        let event = match tokio::time::timeout_at(deadline, heard.recv()).await {
            Ok(Some(event)) => event,
            Ok(None) => return Err(format!("the pods and the observer ended before {what}").into()),
            Err(_) => return Err(format!("no {what} after {STEP_TIMEOUT:?}").into()),
        };
        watch.note(&event);
        if done(watch, &event) {
            return Ok(());
        }
    }
}

/// Whether `event` is a line of pod `index` saying it wrote under `term` and was accepted.
fn wrote(event: &Event, index: usize, term: u64) -> bool {
    matches!(event, Event::Line { pod, line }
        if *pod == index && line.ends_with(&format!("under term {term}: accepted")))
}

/// The night the line `night N written under term T: ...` names.
fn night_of(event: &Event) -> Option<u64> {
    match event {
        Event::Line { line, .. } => line.strip_prefix("night ")?.split(' ').next()?.parse().ok(),
        Event::Change(_) => None,
    }
}

async fn scenario(
    watch: &mut Watch,
    heard: &mut mpsc::UnboundedReceiver<Event>,
    pods: &mut [Pod],
    store: &fred::clients::Client,
    store_key: &str,
    lease: Duration,
) -> Result<(), BoxError> {
    // A leader, and its first night's result in the storage.
    until("leader", watch, heard, |watch, _| watch.leader.is_some()).await?;
    let first = watch.leader.clone().ok_or("no leader")?;
    let deposed = pods
        .iter()
        .position(|pod| pod.name == first.value)
        .ok_or_else(|| format!("the leader's value {:?} is no pod's name", first.value))?;
    let mut last_night = 0;
    let mut nights = 0;
    until("writes by the first leader", watch, heard, |_, event| {
        if wrote(event, deposed, first.term) {
            last_night = night_of(event).unwrap_or(0);
            nights += 1;
        }
        nights == NIGHTS_BEFORE_KILL
    })
    .await?;

    // SIGKILL: no resignation, no release; the lease has to run out.
    let killed = Instant::now();
    pods[deposed].child.start_kill()?;
    println!(
        "[parent] {:>6.1?}  SIGKILL {} (the leader, term {}); its lease is {lease:?}",
        watch.began.elapsed(),
        first.value,
        first.term
    );
    until("new leader", watch, heard, |watch, _| {
        watch
            .leader
            .as_ref()
            .is_some_and(|leader| leader.term > first.term)
    })
    .await?;
    let takeover = killed.elapsed();
    let second = watch.leader.clone().ok_or("no leader")?;
    println!(
        "[parent] {:>6.1?}  {} leads, term {}: {takeover:.2?} after the kill (lease {lease:?})",
        watch.began.elapsed(),
        second.value,
        second.term
    );
    if second.value == first.value {
        watch
            .failures
            .push(format!("{} leads again after being killed", first.value));
    }
    if takeover > lease + REACTION {
        watch.failures.push(format!(
            "the takeover took {takeover:.2?}: more than one lease ({lease:?}) + {REACTION:?}"
        ));
    }
    let successor = pods
        .iter()
        .position(|pod| pod.name == second.value)
        .ok_or_else(|| format!("the leader's value {:?} is no pod's name", second.value))?;
    until("write by the new leader", watch, heard, |_, event| {
        wrote(event, successor, second.term)
    })
    .await?;

    // The killed pod's next write arrives late, with its old term.
    let late = record(store, store_key, last_night + 1, first.term, &first.value).await?;
    println!(
        "[parent] {:>6.1?}  {}'s late write (night {}, term {}): {}",
        watch.began.elapsed(),
        first.value,
        last_night + 1,
        first.term,
        if late {
            "ACCEPTED (it overwrote its successor's result!)"
        } else {
            "refused by the storage's term check"
        }
    );
    if late {
        watch.failures.push(format!(
            "the storage accepted {}'s write under its old term {}",
            first.value, first.term
        ));
    }
    let term: Option<u64> = store.hget(store_key, "term").await?;
    let by: Option<String> = store.hget(store_key, "by").await?;
    if term < Some(second.term) || by.as_deref() != Some(second.value.as_str()) {
        watch.failures.push(format!(
            "the storage holds term {term:?} by {by:?}, not the new leader's (term {}, {})",
            second.term, second.value
        ));
    }
    Ok(())
}
