//! Fencing tokens never repeat (issue 11, item 5), not even when Redis restarts from an older
//! snapshot: the token counter comes back rolled back, and the tokens minted after it are still
//! greater than every token handed out before the crash.

use std::time::Duration;

use lockkit_suite::{client, spawned, unique, within};

const HANG: Duration = Duration::from_secs(60);

#[tokio::test]
async fn tokens_never_repeat_after_a_restart_from_an_older_snapshot() {
    let mut server = spawned().await;
    let client = client(&server.url()).await;
    let name = unique("fencing-restore");
    let lock = client.fenced_lock(&name);
    let counter = lockkit::protocol::keys::Namespace::default()
        .object(lockkit::protocol::keys::Kind::FencedLock, &name)
        .unwrap()
        .aux("token")
        .expect("a token counter")
        .to_owned();

    let mut seen = Vec::new();
    let acquire = || async {
        let guard = within(HANG, "acquire", lock.lock()).await.unwrap();
        let token = guard.fencing_token();
        guard.unlock().await.unwrap();
        token
    };
    seen.push(acquire().await);
    // The snapshot: the counter as of the first token.
    let saved = server.command(&["SAVE"]).await.unwrap();
    assert!(!saved.is_error(), "SAVE: {saved:?}");
    for _ in 0..5 {
        seen.push(acquire().await);
    }

    // A crash, and a restart from the snapshot: the counter is back at the first token.
    server.restart_from_disk().await.unwrap();
    let restored = server.command(&["GET", &counter]).await.unwrap();
    assert_eq!(
        restored.as_str().and_then(|t| t.parse::<u64>().ok()),
        Some(seen[0]),
        "the counter came back from the snapshot"
    );

    let before = *seen.iter().max().expect("tokens");
    for _ in 0..3 {
        let token = acquire().await;
        assert!(
            token > before,
            "token {token} after the restore repeats or goes below one handed out before it \
             (up to {before}): {seen:?}"
        );
        seen.push(token);
    }
    assert!(
        seen.windows(2).all(|pair| pair[0] < pair[1]),
        "tokens strictly increase: {seen:?}"
    );
    client.shutdown().await.unwrap();
}
