//! The Docker backend (feature `testcontainers`). Needs a Docker engine, so it is ignored by
//! default; where Docker runs:
//!
//! ```text
//! cargo test -p lockkit-testkit --features testcontainers --test container -- --ignored
//! ```
#![cfg(feature = "testcontainers")]

use lockkit_testkit::{send_command, RedisContainer, RespValue, REDIS_IMAGE_TAG};

#[tokio::test]
#[ignore = "needs a Docker engine: cargo test -p lockkit-testkit --features testcontainers --test container -- --ignored"]
async fn a_container_serves_the_pinned_redis() {
    let redis = RedisContainer::start().await.unwrap();
    let url = redis.url();
    assert_eq!(url, format!("redis://127.0.0.1:{}", redis.port()));

    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], redis.port()));
    let ping = send_command(addr, &["PING"]).await.unwrap();
    assert_eq!(ping.as_str(), Some("PONG"));
    send_command(addr, &["SET", "lockkit:container", "yes"])
        .await
        .unwrap();
    let value = send_command(addr, &["GET", "lockkit:container"])
        .await
        .unwrap();
    assert_eq!(value.as_str(), Some("yes"));

    // The server is the pinned version, not whatever `latest` is.
    let info = send_command(addr, &["INFO", "server"]).await.unwrap();
    let info = match &info {
        RespValue::Bulk(Some(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        other => panic!("unexpected INFO reply {other:?}"),
    };
    assert!(
        info.contains(&format!("redis_version:{REDIS_IMAGE_TAG}")),
        "{info}"
    );

    // Removing the container (what a drop does too) frees its port.
    redis.remove().await.unwrap();
    assert!(
        send_command(addr, &["PING"]).await.is_err(),
        "the port still answers after the container was removed"
    );
}
