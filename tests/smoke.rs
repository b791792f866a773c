use std::time::Duration;
use lockkit_suite::*;

#[tokio::test]
async fn smoke() {
    let redis = redis().await;
    let a = client(&redis.url()).await;
    let b = client(&redis.url()).await;
    let name = unique("smoke");
    let g = a.lock(&name).try_lock(Duration::ZERO, None).await.unwrap().unwrap();
    assert!(b.lock(&name).try_lock(Duration::ZERO, None).await.unwrap().is_none());
    let waiter = tokio::spawn({ let b = b.clone(); let name = name.clone(); async move { b.lock(&name).try_lock(Duration::from_secs(20), None).await } });
    tokio::time::sleep(Duration::from_millis(200)).await;
    g.unlock().await.unwrap();
    let g2 = waiter.await.unwrap().unwrap().unwrap();
    g2.unlock().await.unwrap();
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
