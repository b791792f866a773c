//! `RedisServer` against a real redis-server.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{bulk, simple, Conn};
use lockkit_testkit::{send_command, RedisServer, RespValue, ServerOptions, TestkitError};

fn process_exists(pid: u32) -> bool {
    Command::new("kill")
        .args(["-0", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status()
        .expect("running kill -0")
        .success()
}

#[tokio::test]
async fn starts_answers_and_is_killed_on_drop() {
    let server = RedisServer::start().await.unwrap();
    assert_eq!(server.addr().port(), server.port());
    assert!(server.addr().ip().is_loopback());
    assert_eq!(server.url(), format!("redis://127.0.0.1:{}", server.port()));
    assert_eq!(server.command(&["PING"]).await.unwrap(), simple("PONG"));
    let pid = server.pid().unwrap();
    assert!(process_exists(pid));
    let dir = server.dir().to_path_buf();
    assert!(dir.is_dir());

    // No persistence.
    let save = server.command(&["CONFIG", "GET", "save"]).await.unwrap();
    assert_eq!(save.as_array().unwrap()[1], bulk(""));
    let aof = server
        .command(&["CONFIG", "GET", "appendonly"])
        .await
        .unwrap();
    assert_eq!(aof.as_array().unwrap()[1], bulk("no"));

    let addr = server.addr();
    drop(server);
    assert!(!process_exists(pid), "redis-server {pid} survived drop");
    assert!(!dir.exists(), "temporary directory survived drop");
    assert!(send_command(addr, &["PING"]).await.is_err());
}

#[tokio::test]
async fn restart_empty_loses_data_and_keeps_the_port() {
    let mut server = RedisServer::start().await.unwrap();
    let port = server.port();
    let old_pid = server.pid().unwrap();
    server.command(&["SET", "k", "v"]).await.unwrap();
    assert_eq!(server.command(&["GET", "k"]).await.unwrap(), bulk("v"));

    server.restart_empty().await.unwrap();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), Some(old_pid));
    assert!(!process_exists(old_pid));
    assert!(server.command(&["GET", "k"]).await.unwrap().is_nil());
    // The same address answers, also without the kit's help.
    let pong = send_command(format!("127.0.0.1:{port}").parse().unwrap(), &["PING"]);
    assert_eq!(pong.await.unwrap(), simple("PONG"));
}

#[tokio::test]
async fn restart_from_disk_brings_back_the_last_save_and_restart_empty_does_not() {
    let mut server = RedisServer::start().await.unwrap();
    server.command(&["SET", "k", "saved"]).await.unwrap();
    assert_eq!(server.command(&["SAVE"]).await.unwrap(), simple("OK"));
    server
        .command(&["SET", "k", "after the save"])
        .await
        .unwrap();

    server.restart_from_disk().await.unwrap();
    assert_eq!(server.command(&["GET", "k"]).await.unwrap(), bulk("saved"));

    server.restart_empty().await.unwrap();
    assert!(server.command(&["GET", "k"]).await.unwrap().is_nil());
    assert!(!server.dir().join("dump.rdb").exists());
}

#[tokio::test]
async fn kill_then_start_again() {
    let mut server = RedisServer::start().await.unwrap();
    let pid = server.pid().unwrap();
    server.command(&["SET", "k", "v"]).await.unwrap();

    server.kill();
    assert_eq!(server.pid(), None);
    assert!(!server.is_running());
    assert!(!process_exists(pid));
    assert!(matches!(
        server.command(&["PING"]).await,
        Err(TestkitError::NotRunning { .. })
    ));
    assert!(send_command(server.addr(), &["PING"]).await.is_err());
    assert!(matches!(
        server.pause(),
        Err(TestkitError::NotRunning { .. })
    ));
    server.kill(); // idempotent

    server.start_again().await.unwrap();
    assert_eq!(server.command(&["PING"]).await.unwrap(), simple("PONG"));
    assert!(server.command(&["GET", "k"]).await.unwrap().is_nil());
}

#[tokio::test]
async fn pause_and_resume() {
    let server = RedisServer::start().await.unwrap();
    let mut conn = Conn::connect(server.addr()).await;
    assert_eq!(conn.command(&["PING"]).await, simple("PONG"));

    server.pause().unwrap();
    conn.send(&["ECHO", "held"]).await;
    assert_eq!(conn.reply_within(Duration::from_millis(200)).await, None);

    server.resume().unwrap();
    assert_eq!(conn.reply().await, bulk("held"));
    assert_eq!(server.command(&["PING"]).await.unwrap(), simple("PONG"));
}

#[tokio::test]
async fn paused_server_is_still_killed_on_drop() {
    let server = RedisServer::start().await.unwrap();
    let pid = server.pid().unwrap();
    server.pause().unwrap();
    drop(server);
    assert!(!process_exists(pid));
}

#[tokio::test]
async fn command_parses_every_reply_type() {
    let server = RedisServer::start().await.unwrap();
    let cmd = |args: &'static [&'static str]| server.command(args);

    assert_eq!(cmd(&["SET", "s", "v"]).await.unwrap(), simple("OK"));
    assert_eq!(cmd(&["GET", "s"]).await.unwrap(), bulk("v"));
    assert_eq!(cmd(&["GET", "s"]).await.unwrap().as_str(), Some("v"));
    assert!(cmd(&["GET", "missing"]).await.unwrap().is_nil());
    assert_eq!(
        cmd(&["INCRBY", "n", "-5"]).await.unwrap().as_int(),
        Some(-5)
    );
    assert_eq!(cmd(&["SET", "empty", ""]).await.unwrap(), simple("OK"));
    assert_eq!(cmd(&["GET", "empty"]).await.unwrap(), bulk(""));

    let err = cmd(&["HSET", "s", "f", "v"]).await.unwrap();
    assert!(err.is_error());
    assert!(err.as_error().unwrap().starts_with("WRONGTYPE"), "{err:?}");

    cmd(&["HSET", "h", "f1", "a", "f2", "b"]).await.unwrap();
    let all = cmd(&["HGETALL", "h"]).await.unwrap();
    let mut fields: Vec<_> = all
        .as_array()
        .unwrap()
        .chunks(2)
        .map(|pair| {
            (
                pair[0].as_str().unwrap().to_owned(),
                pair[1].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    fields.sort();
    assert_eq!(
        fields,
        [("f1".into(), "a".into()), ("f2".into(), "b".into())]
    );
    assert_eq!(
        cmd(&["KEYS", "nomatch*"]).await.unwrap(),
        RespValue::Array(Some(vec![]))
    );

    // A nil array: BLPOP on an empty list times out.
    let nil = cmd(&["BLPOP", "no-list", "0.01"]).await.unwrap();
    assert_eq!(nil, RespValue::Array(None));

    cmd(&["SET", "ttl", "v", "PX", "100000"]).await.unwrap();
    let pttl = cmd(&["PTTL", "ttl"]).await.unwrap().as_int().unwrap();
    assert!(pttl > 0 && pttl <= 100_000, "{pttl}");
}

#[tokio::test]
async fn requirepass_is_honoured() {
    let options = ServerOptions::default().arg("--requirepass").arg("secret");
    let server = RedisServer::start_with(options).await.unwrap();
    assert_eq!(server.password(), Some("secret"));
    // The kit authenticates its own commands...
    assert_eq!(server.command(&["PING"]).await.unwrap(), simple("PONG"));
    // ...but the server really wants the password.
    let denied = send_command(server.addr(), &["PING"]).await.unwrap();
    assert!(
        denied.as_error().unwrap().starts_with("NOAUTH"),
        "{denied:?}"
    );
    let mut conn = Conn::connect(server.addr()).await;
    assert!(conn.command(&["AUTH", "wrong"]).await.is_error());
    assert_eq!(conn.command(&["AUTH", "secret"]).await, simple("OK"));
    assert_eq!(conn.command(&["PING"]).await, simple("PONG"));
}

#[tokio::test]
async fn invalid_config_fails_with_the_log() {
    let options = ServerOptions::default().args(["--no-such-directive", "1"]);
    let err = RedisServer::start_with(options).await.unwrap_err();
    assert!(matches!(err, TestkitError::StartupFailed { .. }), "{err:?}");
    assert!(err.to_string().contains("no-such-directive"), "{err}");
}

#[tokio::test]
async fn missing_binary_is_a_clear_error() {
    let options = ServerOptions::default().binary("/nonexistent/redis-server");
    let err = RedisServer::start_with(options).await.unwrap_err();
    assert!(
        matches!(err, TestkitError::BinaryNotFound { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("apt-get install redis-server"), "{text}");
    assert!(text.contains("REDIS_SERVER_BIN"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_servers_start_in_parallel() {
    let starts = (0..6).map(|_| tokio::spawn(RedisServer::start()));
    let mut servers = Vec::new();
    for start in starts {
        servers.push(start.await.unwrap().unwrap());
    }
    let mut ports: Vec<u16> = servers.iter().map(RedisServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), servers.len());
    for (i, server) in servers.iter().enumerate() {
        let value = i.to_string();
        server.command(&["SET", "id", &value]).await.unwrap();
    }
    for (i, server) in servers.iter().enumerate() {
        assert_eq!(
            server.command(&["GET", "id"]).await.unwrap(),
            bulk(&i.to_string())
        );
    }
}
