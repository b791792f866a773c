//! Metrics, through the [`metrics`](https://docs.rs/metrics) facade, behind the `metrics` feature.
//!
//! Every metric but `lockkit_pubsub_messages_total` is labelled `kind`, the object kind's key
//! segment (`lock`, `fenced`, `fair`, `rwlock`, `spin`, `semaphore`, `psemaphore`, `latch`,
//! `ratelimiter`). The
//! messages are counted where the subscriber connection delivers them, by channel name only, and a
//! channel's kind can not be read back from its name without the client's key prefix (the prefix
//! and the name may both contain `:`); what they measure is the load on the connection anyway:
//!
//! | metric | type | what |
//! | --- | --- | --- |
//! | `lockkit_wait_seconds` | histogram | from the acquire call to the acquisition (a rate limiter: to the admission, its reservation's sleep included) |
//! | `lockkit_hold_seconds` | histogram | from the acquisition to the release (or the lease's loss) |
//! | `lockkit_acquisitions_total` | counter | acquisitions (a rate limiter: requests admitted, however many permits each) |
//! | `lockkit_acquire_timeouts_total` | counter | acquire calls that gave up at their `wait` (also `wait = 0` tries that found the object taken; a rate limiter: `try_acquire` / `try_admission` calls refused because their permits come later than their `wait`) |
//! | `lockkit_renewals_total` | counter | watchdog renewals that extended a lease |
//! | `lockkit_leases_lost_total` | counter | holds whose lease was lost before they were released |
//! | `lockkit_waiters` | gauge | tasks currently waiting for a release (a rate limiter: calls sleeping until their reservation's moment, or until they may ask again) |
//! | `lockkit_pubsub_messages_total` | counter | pub/sub messages the clients' waiter hubs received (every message on an object's channel, whether it woke a waiter or not); no label |
//! | `lockkit_leader_changes_total` | counter | times this client became the leader of an election (`kind="election"`) |
//! | `lockkit_is_leader` | gauge | elections this client leads now: from the election until the [`Leadership`](crate::Leadership) is resigned or dropped (`kind="election"`) |
//!
//! Without the feature every function here is an empty inline function and the types are empty:
//! nothing is measured and nothing is stored.

#[cfg(feature = "metrics")]
mod imp {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::OnceLock;
    use std::time::Duration;

    use tokio::time::Instant;

    /// When an acquire call started.
    pub(crate) struct Stopwatch(Instant);

    impl Stopwatch {
        pub(crate) fn start() -> Self {
            Self(Instant::now())
        }

        fn elapsed(&self) -> Duration {
            self.0.elapsed()
        }
    }

    pub(crate) fn acquired(kind: &'static str, since: &Stopwatch) {
        metrics::counter!("lockkit_acquisitions_total", "kind" => kind).increment(1);
        metrics::histogram!("lockkit_wait_seconds", "kind" => kind)
            .record(since.elapsed().as_secs_f64());
    }

    pub(crate) fn timed_out(kind: &'static str) {
        metrics::counter!("lockkit_acquire_timeouts_total", "kind" => kind).increment(1);
    }

    pub(crate) fn renewed(kind: &'static str, holds: u64) {
        if holds > 0 {
            metrics::counter!("lockkit_renewals_total", "kind" => kind).increment(holds);
        }
    }

    /// The waiter hub received a message (on any channel).
    pub(crate) fn pubsub_message() {
        metrics::counter!("lockkit_pubsub_messages_total").increment(1);
    }

    /// One leadership of an election: counted in `lockkit_leader_changes_total` when it begins,
    /// and in `lockkit_is_leader` while it lives.
    pub(crate) struct Leading(&'static str);

    impl Leading {
        pub(crate) fn new(kind: &'static str) -> Self {
            metrics::counter!("lockkit_leader_changes_total", "kind" => kind).increment(1);
            metrics::gauge!("lockkit_is_leader", "kind" => kind).increment(1.0);
            Self(kind)
        }
    }

    impl Drop for Leading {
        fn drop(&mut self) {
            metrics::gauge!("lockkit_is_leader", "kind" => self.0).decrement(1.0);
        }
    }

    /// One task waiting for a release: counted in `lockkit_waiters` while it lives.
    pub(crate) struct Waiting(&'static str);

    impl Waiting {
        pub(crate) fn new(kind: &'static str) -> Self {
            metrics::gauge!("lockkit_waiters", "kind" => kind).increment(1.0);
            Self(kind)
        }
    }

    impl Drop for Waiting {
        fn drop(&mut self) {
            metrics::gauge!("lockkit_waiters", "kind" => self.0).decrement(1.0);
        }
    }

    /// A hold's time from its grant to its end, recorded once.
    #[derive(Debug, Default)]
    pub(crate) struct HoldClock {
        granted: OnceLock<Instant>,
        ended: AtomicBool,
    }

    impl HoldClock {
        pub(crate) fn new() -> Self {
            Self::default()
        }

        pub(crate) fn granted(&self) {
            let _ = self.granted.set(Instant::now());
        }

        /// The hold was released (or the client shut down): records `lockkit_hold_seconds`,
        /// unless the hold already ended.
        pub(crate) fn ended(&self, kind: &'static str) {
            if !self.ended.swap(true, Ordering::AcqRel) {
                self.record_hold(kind);
            }
        }

        /// The hold's lease was lost: counts it in `lockkit_leases_lost_total` and records
        /// `lockkit_hold_seconds`, unless the hold already ended.
        pub(crate) fn lost(&self, kind: &'static str) {
            if !self.ended.swap(true, Ordering::AcqRel) {
                metrics::counter!("lockkit_leases_lost_total", "kind" => kind).increment(1);
                self.record_hold(kind);
            }
        }

        fn record_hold(&self, kind: &'static str) {
            if let Some(granted) = self.granted.get() {
                metrics::histogram!("lockkit_hold_seconds", "kind" => kind)
                    .record(granted.elapsed().as_secs_f64());
            }
        }
    }
}

#[cfg(not(feature = "metrics"))]
mod imp {
    /// When an acquire call started (nothing, without the `metrics` feature).
    pub(crate) struct Stopwatch;

    impl Stopwatch {
        #[inline(always)]
        pub(crate) fn start() -> Self {
            Self
        }
    }

    #[inline(always)]
    pub(crate) fn acquired(_kind: &'static str, _since: &Stopwatch) {}

    #[inline(always)]
    pub(crate) fn timed_out(_kind: &'static str) {}

    #[inline(always)]
    pub(crate) fn renewed(_kind: &'static str, _holds: u64) {}

    #[inline(always)]
    pub(crate) fn pubsub_message() {}

    /// One leadership (nothing, without the `metrics` feature).
    pub(crate) struct Leading;

    impl Leading {
        #[inline(always)]
        pub(crate) fn new(_kind: &'static str) -> Self {
            Self
        }
    }

    /// One waiting task (nothing, without the `metrics` feature).
    pub(crate) struct Waiting;

    impl Waiting {
        #[inline(always)]
        pub(crate) fn new(_kind: &'static str) -> Self {
            Self
        }
    }

    /// A hold's time (nothing, without the `metrics` feature).
    #[derive(Debug, Default)]
    pub(crate) struct HoldClock;

    impl HoldClock {
        #[inline(always)]
        pub(crate) fn new() -> Self {
            Self
        }

        #[inline(always)]
        pub(crate) fn granted(&self) {}

        #[inline(always)]
        pub(crate) fn ended(&self, _kind: &'static str) {}

        #[inline(always)]
        pub(crate) fn lost(&self, _kind: &'static str) {}
    }
}

pub(crate) use imp::{
    acquired, pubsub_message, renewed, timed_out, HoldClock, Leading, Stopwatch, Waiting,
};
