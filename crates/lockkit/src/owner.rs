//! Owner ids: who holds a hold.
//!
//! An owner id is `<client id>:<task>`, where the task is tokio's task id or, outside any task
//! (the body of `#[tokio::main]` or `block_on`), the thread. The same task locking twice
//! re-enters; another task or another client waits. Guards remember the owner they acquired
//! with, so a guard can be unlocked from any task.

/// The owner id of the calling task.
pub(crate) fn current(client_id: &str) -> String {
    match tokio::task::try_id() {
        Some(task) => format!("{client_id}:task-{task}"),
        None => format!("{client_id}:{:?}", std::thread::current().id()),
    }
}

#[cfg(test)]
mod tests {
    use super::current;

    #[tokio::test]
    async fn tasks_get_distinct_owners_and_the_same_task_keeps_its_own() {
        let here = current("c");
        assert_eq!(here, current("c"));
        let there = tokio::spawn(async { current("c") })
            .await
            .unwrap_or_default();
        assert!(there.starts_with("c:task-"));
        assert_ne!(here, there);
    }

    #[test]
    fn outside_a_task_the_thread_owns() {
        let here = current("c");
        assert!(here.starts_with("c:ThreadId("), "{here}");
        let other = std::thread::spawn(|| current("c"))
            .join()
            .unwrap_or_default();
        assert_ne!(here, other);
    }
}
