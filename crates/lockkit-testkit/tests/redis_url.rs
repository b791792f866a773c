//! `redis_url` and `REDIS_URL`. Alone in its test binary because it changes
//! the process environment.

use lockkit_testkit::{redis_url, TestRedis};

#[tokio::test]
async fn honours_redis_url() {
    let saved = std::env::var_os("REDIS_URL");

    std::env::remove_var("REDIS_URL");
    let spawned = redis_url().await.unwrap();
    let server = spawned.server().expect("a server is spawned");
    assert_eq!(spawned.url(), server.url());
    assert_eq!(
        server.command(&["PING"]).await.unwrap().as_str(),
        Some("PONG")
    );
    assert!(matches!(spawned, TestRedis::Spawned(_)));

    std::env::set_var("REDIS_URL", "redis://example.invalid:6379");
    let external = redis_url().await.unwrap();
    assert!(external.server().is_none());
    assert_eq!(external.url(), "redis://example.invalid:6379");

    match saved {
        Some(value) => std::env::set_var("REDIS_URL", value),
        None => std::env::remove_var("REDIS_URL"),
    }
}
