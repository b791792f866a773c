//! What the tests of the `lockkit` binary share: the binary, a hang guard, a server and a client,
//! and running the tool against a server with no standard input (so no terminal).

#![allow(dead_code)]

use std::future::Future;
use std::process::{Output, Stdio};
use std::time::Duration;

use lockkit::Client;
use lockkit_testkit::RedisServer;
use serde_json::Value;
use tokio::process::Command;

/// The `lockkit` binary of this build.
pub const BIN: &str = env!("CARGO_BIN_EXE_lockkit");

/// Fails the test (instead of hanging it) when `future` takes longer than 60 s.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(60), future).await {
        Ok(value) => value,
        Err(_) => panic!("timed out waiting for {what}"),
    }
}

/// A redis-server of the test's own.
pub async fn server() -> RedisServer {
    RedisServer::start().await.expect("redis-server starts")
}

/// A client of the server at `url`.
pub async fn client(url: &str) -> Client {
    Client::connect(url).await.expect("client connects")
}

/// Runs `lockkit --url <url> <args>` with no standard input (so no terminal).
pub async fn lockkit(url: &str, args: &[&str]) -> Output {
    let mut command = Command::new(BIN);
    command
        .arg("--url")
        .arg(url)
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null());
    within("the lockkit command", command.output())
        .await
        .expect("lockkit runs")
}

/// The tool's exit code.
pub fn code(output: &Output) -> Option<i32> {
    output.status.code()
}

/// The tool's standard output.
pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The tool's standard error.
pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The tool's standard output, read as JSON.
pub fn json(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!(
            "stdout is not JSON ({err}): {:?} / stderr {:?}",
            stdout(output),
            stderr(output)
        )
    })
}
