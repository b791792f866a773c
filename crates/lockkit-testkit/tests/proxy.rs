//! `FaultProxy` between raw clients and a real redis-server.

mod common;

use std::time::Duration;

use common::{bulk, simple, Conn};
use lockkit_testkit::{encode_command, send_command, FaultProxy, RedisServer};
use tokio::io::AsyncWriteExt;

async fn setup() -> (RedisServer, FaultProxy) {
    let server = RedisServer::start().await.unwrap();
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    (server, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_both_ways() {
    let (server, proxy) = setup().await;
    assert_eq!(proxy.upstream(), server.addr());
    assert_ne!(proxy.addr(), server.addr());
    assert_eq!(
        proxy.url(),
        format!("redis://127.0.0.1:{}", proxy.addr().port())
    );

    let set = send_command(proxy.addr(), &["SET", "k", "through-proxy"]).await;
    assert_eq!(set.unwrap(), simple("OK"));
    assert_eq!(
        server.command(&["GET", "k"]).await.unwrap(),
        bulk("through-proxy")
    );

    let mut conn = Conn::connect(proxy.addr()).await;
    let big = "x".repeat(200_000);
    assert_eq!(conn.command(&["SET", "big", &big]).await, simple("OK"));
    assert_eq!(conn.command(&["GET", "big"]).await, bulk(&big));
    // The first connection may still be closing.
    assert!(proxy.connection_count() >= 1);
    assert_eq!(proxy.total_connections(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_closes_current_connections_only() {
    let (_server, proxy) = setup().await;
    let mut a = Conn::connect(proxy.addr()).await;
    let mut b = Conn::connect(proxy.addr()).await;
    assert_eq!(a.command(&["PING"]).await, simple("PONG"));
    assert_eq!(b.command(&["PING"]).await, simple("PONG"));
    assert_eq!(proxy.connection_count(), 2);

    proxy.cut();
    a.expect_closed().await;
    b.expect_closed().await;

    let mut c = Conn::connect(proxy.addr()).await;
    assert_eq!(c.command(&["PING"]).await, simple("PONG"));
    assert_eq!(proxy.total_connections(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_refuses_until_unblocked() {
    let (_server, proxy) = setup().await;
    let mut before = Conn::connect(proxy.addr()).await;
    assert_eq!(before.command(&["PING"]).await, simple("PONG"));

    proxy.block();
    before.expect_closed().await;
    let mut refused = Conn::connect(proxy.addr()).await;
    // The write may or may not fail depending on when the close arrives.
    let _ = refused.stream.write_all(&encode_command(&["PING"])).await;
    refused.expect_closed().await;
    assert!(send_command(proxy.addr(), &["PING"]).await.is_err());

    proxy.unblock();
    let mut after = Conn::connect(proxy.addr()).await;
    assert_eq!(after.command(&["PING"]).await, simple("PONG"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delay_and_jitter_keep_order() {
    let (_server, proxy) = setup().await;
    proxy.set_delay(Duration::from_millis(2));
    proxy.set_jitter(Duration::from_millis(3));
    let mut conn = Conn::connect(proxy.addr()).await;
    // Separate writes, so the proxy sees many chunks.
    for i in 0..40 {
        conn.send(&["ECHO", &i.to_string()]).await;
    }
    for i in 0..40 {
        assert_eq!(conn.reply().await, bulk(&i.to_string()));
    }
    proxy.set_delay(Duration::ZERO);
    proxy.set_jitter(Duration::ZERO);
    assert_eq!(conn.command(&["PING"]).await, simple("PONG"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_bytes_until_resume() {
    let (server, proxy) = setup().await;
    let mut conn = Conn::connect(proxy.addr()).await;
    assert_eq!(conn.command(&["PING"]).await, simple("PONG"));

    proxy.pause();
    conn.send(&["SET", "paused", "1"]).await;
    conn.send(&["GET", "paused"]).await;
    assert_eq!(conn.reply_within(Duration::from_millis(200)).await, None);
    assert!(server.command(&["GET", "paused"]).await.unwrap().is_nil());

    proxy.resume();
    assert_eq!(conn.reply().await, simple("OK"));
    assert_eq!(conn.reply().await, bulk("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_to_matching_request_is_dropped() {
    let (server, proxy) = setup().await;
    let mut bystander = Conn::connect(proxy.addr()).await;
    assert_eq!(bystander.command(&["PING"]).await, simple("PONG"));

    proxy.cut_after_request_containing("fatal-key");
    assert!(!proxy.triggered());
    let mut victim = Conn::connect(proxy.addr()).await;
    assert_eq!(
        victim.command(&["SET", "harmless", "1"]).await,
        simple("OK")
    );
    victim.send(&["SET", "fatal-key", "v"]).await;
    victim.expect_closed().await;
    proxy.wait_triggered().await;
    assert!(proxy.triggered());

    // The server executed the request the client never saw answered.
    assert_eq!(
        server.command(&["GET", "fatal-key"]).await.unwrap(),
        bulk("v")
    );
    // Other connections are untouched, and the trigger was one-shot.
    assert_eq!(bystander.command(&["GET", "fatal-key"]).await, bulk("v"));
    let mut again = Conn::connect(proxy.addr()).await;
    assert_eq!(
        again.command(&["SET", "fatal-key", "w"]).await,
        simple("OK")
    );

    // Arming again resets the flag.
    proxy.cut_after_request_containing("other-key");
    assert!(!proxy.triggered());
    assert_eq!(again.command(&["GET", "x"]).await, common::nil());
    again.send(&["GET", "other-key"]).await;
    again.expect_closed().await;
    proxy.wait_triggered().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_closes_everything() {
    let (_server, proxy) = setup().await;
    let addr = proxy.addr();
    let mut conn = Conn::connect(addr).await;
    assert_eq!(conn.command(&["PING"]).await, simple("PONG"));
    drop(proxy);
    conn.expect_closed().await;
    assert!(send_command(addr, &["PING"]).await.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_upstream_closes_client() {
    let (mut server, proxy) = setup().await;
    server.kill();
    let mut conn = Conn::connect(proxy.addr()).await;
    conn.expect_closed().await;
    server.start_again().await.unwrap();
    let mut conn = Conn::connect(proxy.addr()).await;
    assert_eq!(conn.command(&["PING"]).await, simple("PONG"));
}
