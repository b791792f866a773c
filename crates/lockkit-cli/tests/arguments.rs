//! The `lockkit` command line itself: suggestions for typos, `--kind` values, shell completions,
//! and `REDIS_URL` as the default of `--url`.

use std::future::Future;
use std::process::{Output, Stdio};
use std::time::Duration;

use lockkit_testkit::RedisServer;
use serde_json::Value;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_lockkit");

/// Fails the test (instead of hanging it) when `future` takes longer than 30 s.
async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(30), future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// Runs `lockkit <args>` with no standard input, `REDIS_URL` set to `redis_url` (or unset).
async fn lockkit(redis_url: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command.args(args).stdin(Stdio::null());
    match redis_url {
        Some(url) => command.env("REDIS_URL", url),
        None => command.env_remove("REDIS_URL"),
    };
    within("the lockkit command", command.output())
        .await
        .expect("lockkit runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A `redis://` URL on a loopback port nobody listens on.
fn unreachable_url() -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    format!("redis://127.0.0.1:{port}")
}

#[tokio::test]
async fn a_mistyped_subcommand_option_or_kind_gets_a_suggestion() {
    let output = lockkit(None, &["inspct", "x"]).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let text = stderr(&output);
    assert!(
        text.contains("similar subcommand") && text.contains("'inspect'"),
        "{text}"
    );

    let output = lockkit(None, &["force-unlock", "--yess", "x"]).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let text = stderr(&output);
    assert!(text.contains("'--yes'"), "{text}");

    let output = lockkit(None, &["inspect", "--kind", "fencd", "x"]).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
    let text = stderr(&output);
    assert!(
        text.contains("similar value") && text.contains("'fenced'"),
        "{text}"
    );
    // clap lists the kinds (every one of lockkit's, by key segment).
    assert!(
        text.contains("possible values") && text.contains("psemaphore"),
        "{text}"
    );
}

#[tokio::test]
async fn every_kind_is_a_kind_value() {
    let help = lockkit(None, &["inspect", "--help"]).await;
    assert_eq!(help.status.code(), Some(0), "{help:?}");
    let help = stdout(&help);
    for kind in lockkit::protocol::keys::Kind::ALL {
        assert!(help.contains(kind.segment()), "{kind:?} in {help}");
    }
}

#[tokio::test]
async fn completions_print_a_script_for_each_shell_without_redis() {
    // REDIS_URL points nowhere: completions never connect.
    let nowhere = unreachable_url();
    let bash = lockkit(Some(&nowhere), &["completions", "bash"]).await;
    assert_eq!(bash.status.code(), Some(0), "{bash:?}");
    let script = stdout(&bash);
    assert!(script.contains("complete -F _lockkit"), "{script}");
    for word in [
        "inspect",
        "force-unlock",
        "completions",
        "--kind",
        "psemaphore",
    ] {
        assert!(script.contains(word), "{word} in {script}");
    }

    for (shell, marker) in [
        ("zsh", "#compdef lockkit"),
        ("fish", "complete -c lockkit"),
        ("elvish", "lockkit"),
        ("powershell", "lockkit"),
    ] {
        let output = lockkit(None, &["completions", shell]).await;
        assert_eq!(output.status.code(), Some(0), "{shell}: {output:?}");
        assert!(stdout(&output).contains(marker), "{shell}: {output:?}");
    }

    let output = lockkit(None, &["completions", "tcsh"]).await;
    assert_eq!(output.status.code(), Some(2), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_url_from_the_environment_is_the_default_and_url_overrides_it() {
    let redis = RedisServer::start().await.expect("redis-server starts");
    let url = redis.url();

    // From the environment alone.
    let listed = lockkit(Some(&url), &["--json", "list"]).await;
    assert_eq!(listed.status.code(), Some(0), "{listed:?}");
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert!(listed.is_array(), "{listed}");

    // Pointing nowhere, it fails as a Redis error (3)...
    let nowhere = unreachable_url();
    let refused = lockkit(Some(&nowhere), &["list"]).await;
    assert_eq!(refused.status.code(), Some(3), "{refused:?}");

    // ... unless --url says otherwise.
    let overridden = lockkit(Some(&nowhere), &["--url", &url, "list"]).await;
    assert_eq!(overridden.status.code(), Some(0), "{overridden:?}");

    // `--help` names the variable but never prints its value (it may carry a password).
    let help = lockkit(
        Some("redis://user:s3cret-password@127.0.0.1:1"),
        &["--help"],
    )
    .await;
    assert_eq!(help.status.code(), Some(0), "{help:?}");
    let help = stdout(&help);
    assert!(help.contains("REDIS_URL"), "{help}");
    assert!(!help.contains("s3cret"), "{help}");
}

/// The exit codes `lockkit --help` lists are the guide's table's and the README's, no more and no
/// fewer (issue 29 added 5, `list --held` found something held).
#[tokio::test]
async fn the_guide_and_readme_list_the_exit_codes_help_lists() {
    let help = stdout(&lockkit(None, &["--help"]).await);
    let codes: Vec<String> = help
        .split_once("Exit codes:\n")
        .expect("an exit code section")
        .1
        .lines()
        .map_while(|line| {
            line.trim_start()
                .split_once("  ")
                .map(|(code, _)| code.to_owned())
        })
        .collect();
    assert!(codes.contains(&"5".to_owned()), "{help}");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    let guide = std::fs::read_to_string(format!("{root}/docs/guide.md")).expect("the guide");
    let table = guide
        .split_once("**Exit codes**")
        .expect("the guide's exit codes")
        .1;
    let rows: Vec<String> = table
        .lines()
        .skip_while(|line| !line.starts_with("| code"))
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| line.split('|').nth(1).map(|code| code.trim().to_owned()))
        .collect();
    assert_eq!(rows, codes, "the guide's table");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("the README");
    let line = readme
        .split_once("Exit codes: ")
        .expect("the README's exit codes")
        .1
        .split_once(". ")
        .expect("a sentence")
        .0;
    let listed: Vec<String> = line
        .split(", ")
        .filter_map(|part| part.split_whitespace().next().map(str::to_owned))
        .collect();
    assert_eq!(listed, codes, "the README's: {line}");
}
