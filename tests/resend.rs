//! Issue 27, §1.2: every script lockkit sends with re-sending allowed (`Resend::Allowed` in
//! `crates/lockkit/src`: fred sends it again when the connection dropped before its reply) is
//! idempotent per request. Each is run twice with the same `KEYS` and `ARGV`, in situations that
//! make it write (take, wait, grant, hand over, publish), and the second run must change nothing
//! observable: the object's keys (type, content, expiry), the messages published (a subscriber
//! on every channel), and the reply (except where the client does not read it, said per case).
//!
//! Both runs go in one `MULTI` with `TIME` before and after: a case whose two runs straddle a
//! millisecond is run again on fresh keys, so the scripts' server clock is the same for both and
//! the comparison is exact (a run one millisecond later would only refresh the expiries it
//! recomputes from the clock, as any later request does).
//!
//! The audit (the scripts sent with `Resend::Allowed` and where; each has a case below):
//! - `lock_acquire` (`Lock`, and a `MultiLock` member's look), `fenced_lock_acquire`
//!   (`FencedLock`, `Election` campaigns), `fair_lock_acquire`, `rwlock_acquire`,
//!   `spin_lock_acquire`, `semaphore_acquire` (both semaphores): the acquire tries (`lock.rs`,
//!   `fair_lock.rs`, `read_write_lock.rs`, `spin_lock.rs`, `semaphore.rs`);
//! - `lock_renew` (`Lock`, `FencedLock`, `FairLock`), `election_renew`, `rwlock_renew`,
//!   `spin_lock_renew`, `semaphore_renew`: the watchdog's rounds and the confirmation of a granted
//!   hold (`watchdog.rs`);
//! - `lock_cancel` (lock, fenced lock, election), `fair_lock_cancel` and `semaphore_cancel`
//!   (both semaphores): a waiter leaving its line (`queued.rs`);
//! - `lock_hold_count` (`object.rs`), `rwlock_status` (`read_write_lock.rs`),
//!   `semaphore_available` (`semaphore.rs`), `semaphore_update_lease`
//!   (`permit_expirable_semaphore.rs`), `latch_try_set_count` and `latch_count_down`
//!   (`count_down_latch.rs`);
//! - `election_proclaim`, `election_resign`, `election_leader` (`election.rs`).
//!
//! Found not idempotent, and fixed: `election_proclaim` (issue 27, §1.2: every run bumped the
//! record's version and published the value again; now a request id). Every other script passes.

use std::time::Duration;

use fred::interfaces::{EventInterface, PubsubInterface};
use lockkit::protocol::keys::{Kind, Namespace, ObjectKeys};
use lockkit::protocol::script::Script;
use lockkit::protocol::{
    election, fair_lock, fenced_lock, latch, lock, rate_limiter, read_write_lock, semaphore,
    spin_lock,
};
use lockkit_suite::model_io::READ_STATE;
use lockkit_suite::{eval, raw, server_ms, spawned, unique, within};
use lockkit_testkit::RespValue;

const HANG: Duration = Duration::from_secs(60);
/// A lease and a keep-alive that outlive the test.
const LONG: &str = "600000";

/// One script call: the script, its `KEYS`, its `ARGV`.
struct Call {
    script: &'static Script,
    keys: Vec<String>,
    args: Vec<String>,
}

fn call(script: &'static Script, keys: &[String], args: &[&str]) -> Call {
    Call {
        script,
        keys: keys.to_vec(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
    }
}

/// One situation: what runs first, a pause (a lease running out), and the call run twice.
struct Case {
    /// The keys whose state is compared.
    keys: Vec<String>,
    setup: Vec<Call>,
    pause: Duration,
    subject: Call,
    /// Why the two replies may differ (the client does not act on this reply); `None`: they
    /// must be equal.
    replies_may_differ: Option<&'static str>,
    /// The first run publishes (the case is about a message that must not go out twice).
    publishes: bool,
}

impl Case {
    fn new(keys: &ObjectKeys, setup: Vec<Call>, subject: Call) -> Case {
        Case {
            keys: keys.keys.clone(),
            setup,
            pause: Duration::ZERO,
            subject,
            replies_may_differ: None,
            publishes: false,
        }
    }

    fn publishes(mut self) -> Case {
        self.publishes = true;
        self
    }

    fn after(mut self, pause: Duration) -> Case {
        self.pause = pause;
        self
    }

    fn replies_may_differ(mut self, why: &'static str) -> Case {
        self.replies_may_differ = Some(why);
        self
    }
}

fn keys_of(kind: Kind, name: &str) -> ObjectKeys {
    Namespace::default().object(kind, name).unwrap()
}

/// The lock kinds' request member (`<marker> <lease> <owner> <channel>`, see handoff_lib.lua).
fn member(marker: &str, lease: &str, owner: &str, channel: &str) -> String {
    format!("{marker} {lease} {owner} {channel}")
}

/// Every case, on objects named after `name`.
#[allow(clippy::too_many_lines)] // one list, one case each
fn cases(name: &str) -> Vec<(&'static str, Case)> {
    let mut cases = Vec::new();
    let ttl = "86400000";

    // lock_acquire, lock_renew, lock_cancel, lock_hold_count: the lock.
    let k = keys_of(Kind::Lock, name);
    let (ka, kb, kc) = (
        k.client_channel("A"),
        k.client_channel("B"),
        k.client_channel("C"),
    );
    let acquire = |owner: &str, marker: &str, lease: &str, channel: &str| {
        call(
            &lock::ACQUIRE,
            &k.keys,
            &[owner, marker, lease, LONG, channel, "0"],
        )
    };
    let release = |marker: &str| call(&lock::RELEASE, &k.keys, &[marker, &k.channel, "0"]);
    cases.push((
        "lock_acquire: takes a free lock",
        Case::new(&k, vec![], acquire("A", "#A:1", LONG, &ka)),
    ));
    cases.push((
        "lock_acquire: joins the waiting set",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", LONG, &kb)],
            acquire("A", "#A:1", LONG, &ka),
        ),
    ));
    cases.push((
        "lock_acquire: claims the grant a release made it",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", LONG, &kb),
                acquire("A", "#A:1", LONG, &ka),
                release("#B:1"),
            ],
            acquire("A", "#A:1", LONG, &ka),
        ),
    ));
    cases.push((
        "lock_acquire: hands a free lock to the waiter at the head, then waits",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", "30", &kb),
                acquire("C", "#C:1", LONG, &kc),
            ],
            acquire("A", "#A:1", LONG, &ka),
        )
        .after(Duration::from_millis(60))
        .publishes(),
    ));
    cases.push((
        "lock_acquire (a multi-lock member's look): a free lock",
        Case::new(
            &k,
            vec![],
            call(
                &lock::ACQUIRE,
                &k.keys,
                &["A", "#A:1", LONG, LONG, &ka, "0", "1"],
            ),
        ),
    ));
    cases.push((
        "lock_acquire (a multi-lock member's look): joins the waiting set",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", LONG, &kb)],
            call(
                &lock::ACQUIRE,
                &k.keys,
                &["A", "#A:1", LONG, LONG, &ka, "0", "1"],
            ),
        ),
    ));
    cases.push((
        "lock_renew: extends a hold",
        Case::new(
            &k,
            vec![acquire("A", "#A:1", "30000", &ka)],
            call(&lock::RENEW, &k.keys, &["#A:1", LONG]),
        ),
    ));
    cases.push((
        "lock_renew: a hold that is gone",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", LONG, &kb)],
            call(&lock::RENEW, &k.keys, &["#A:1", LONG]),
        ),
    ));
    cases.push((
        "lock_hold_count",
        Case::new(
            &k,
            vec![acquire("A", "#A:1", LONG, &ka)],
            call(&lock::HOLD_COUNT, &k.keys[..1], &["A", "B"]),
        ),
    ));
    let lock_leave = vec![
        k.key.clone(),
        k.aux("handoff").unwrap().to_owned(),
        k.aux("waiting").unwrap().to_owned(),
        k.aux("timeouts").unwrap().to_owned(),
    ];
    let a_waits = member("#A:1", LONG, "A", &ka);
    cases.push((
        "lock_cancel: a waiting request leaves",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", LONG, &kb),
                acquire("A", "#A:1", LONG, &ka),
            ],
            call(&lock::CANCEL, &lock_leave, &[&a_waits, &k.channel, "0"]),
        )
        .replies_may_differ("{1} then {0} (nothing left to remove); queued.rs only logs it"),
    ));
    cases.push((
        "lock_cancel: a grant not claimed goes to the next request",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", LONG, &kb),
                acquire("A", "#A:1", LONG, &ka),
                acquire("C", "#C:1", LONG, &kc),
                release("#B:1"),
            ],
            call(&lock::CANCEL, &lock_leave, &[&a_waits, &k.channel, "0"]),
        )
        .replies_may_differ("{1} then {0} (nothing left to remove); queued.rs only logs it")
        .publishes(),
    ));

    // fenced_lock_acquire, lock_renew and lock_cancel on a fenced lock.
    let k = keys_of(Kind::FencedLock, name);
    let (ka, kb, kc) = (
        k.client_channel("A"),
        k.client_channel("B"),
        k.client_channel("C"),
    );
    let acquire = |owner: &str, marker: &str, channel: &str| {
        call(
            &fenced_lock::ACQUIRE,
            &k.keys,
            &[owner, marker, LONG, LONG, channel, "0", ttl],
        )
    };
    let release = |marker: &str| {
        call(
            &fenced_lock::RELEASE,
            &k.keys,
            &[marker, &k.channel, "0", ttl],
        )
    };
    cases.push((
        "fenced_lock_acquire: takes a free lock, mints a token",
        Case::new(&k, vec![], acquire("A", "#A:1", &ka)),
    ));
    cases.push((
        "fenced_lock_acquire: joins the waiting set",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", &kb)],
            acquire("A", "#A:1", &ka),
        ),
    ));
    cases.push((
        "fenced_lock_acquire: claims the grant (and its token) a release made it",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", &kb),
                acquire("A", "#A:1", &ka),
                release("#B:1"),
            ],
            acquire("A", "#A:1", &ka),
        ),
    ));
    cases.push((
        "lock_renew: a fenced lock's hold",
        Case::new(
            &k,
            vec![acquire("A", "#A:1", &ka)],
            call(&lock::RENEW, &k.keys, &["#A:1", LONG]),
        ),
    ));
    let fenced_leave = vec![
        k.key.clone(),
        k.aux("handoff").unwrap().to_owned(),
        k.aux("waiting").unwrap().to_owned(),
        k.aux("timeouts").unwrap().to_owned(),
        k.aux("token").unwrap().to_owned(),
    ];
    cases.push((
        "lock_cancel (fenced): a grant not claimed goes to the next request, with a token",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", &kb),
                acquire("A", "#A:1", &ka),
                acquire("C", "#C:1", &kc),
                release("#B:1"),
            ],
            call(
                &lock::CANCEL,
                &fenced_leave,
                &[&member("#A:1", LONG, "A", &ka), &k.channel, "0", ttl],
            ),
        )
        .replies_may_differ("{1} then {0} (nothing left to remove); queued.rs only logs it")
        .publishes(),
    ));

    // fair_lock_acquire, lock_renew and fair_lock_cancel: the fair lock.
    let k = keys_of(Kind::FairLock, name);
    let acquire = |owner: &str, marker: &str, waiter: &str| {
        call(
            &fair_lock::ACQUIRE,
            &k.keys,
            &[owner, marker, LONG, waiter, LONG, &k.channel, "0"],
        )
    };
    cases.push((
        "fair_lock_acquire: takes a free lock",
        Case::new(&k, vec![], acquire("A", "#A:1", "A:w1")),
    ));
    cases.push((
        "fair_lock_acquire: queues",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", "B:w1")],
            acquire("A", "#A:1", "A:w1"),
        ),
    ));
    cases.push((
        "fair_lock_acquire: the head of the queue takes the lock its holder released",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", "B:w1"),
                acquire("A", "#A:1", "A:w1"),
                acquire("C", "#C:1", "C:w1"),
                call(&fair_lock::RELEASE, &k.keys, &["#B:1", &k.channel, "0"]),
            ],
            acquire("A", "#A:1", "A:w1"),
        ),
    ));
    cases.push((
        "fair_lock_acquire: a queued waiter's last try (keep-alive 0) leaves the queue",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", "B:w1"),
                acquire("A", "#A:1", "A:w1"),
                acquire("C", "#C:1", "C:w1"),
            ],
            call(
                &fair_lock::ACQUIRE,
                &k.keys,
                &["A", "#A:1", LONG, "A:w1", "0", &k.channel, "0"],
            ),
        ),
    ));
    cases.push((
        "lock_renew: a fair lock's hold",
        Case::new(
            &k,
            vec![acquire("A", "#A:1", "A:w1")],
            call(&lock::RENEW, &k.keys, &["#A:1", LONG]),
        ),
    ));
    cases.push((
        "fair_lock_cancel: the head leaves a free lock, the next is named",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", "B:w1"),
                acquire("A", "#A:1", "A:w1"),
                acquire("C", "#C:1", "C:w1"),
                call(&fair_lock::RELEASE, &k.keys, &["#B:1", &k.channel, "0"]),
            ],
            call(&fair_lock::CANCEL, &k.keys, &["A:w1", &k.channel, "0"]),
        )
        .replies_may_differ("{1} then {0} (nothing left to remove); queued.rs only logs it")
        .publishes(),
    ));

    // rwlock_acquire, rwlock_renew, rwlock_status.
    let k = keys_of(Kind::ReadWriteLock, name);
    let rw_channel = format!("{}:A", k.channel);
    let acquire = |owner: &str, marker: &str, mode: &str| {
        call(
            &read_write_lock::ACQUIRE,
            &k.keys,
            &[owner, marker, LONG, mode, &rw_channel, "0", "0"],
        )
    };
    let waits = |owner: &str, marker: &str, mode: &str| {
        call(
            &read_write_lock::ACQUIRE,
            &k.keys,
            &[owner, marker, LONG, mode, &rw_channel, "0", LONG],
        )
    };
    cases.push((
        "rwlock_acquire: a read hold",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", "r")],
            acquire("A", "#A:1", "r"),
        ),
    ));
    cases.push((
        "rwlock_acquire: a write hold",
        Case::new(&k, vec![], acquire("A", "#A:1", "w")),
    ));
    cases.push((
        "rwlock_acquire: busy",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", "r")],
            acquire("A", "#A:1", "w"),
        ),
    ));
    cases.push((
        "rwlock_acquire: busy, joins the line",
        Case::new(&k, vec![acquire("B", "#B:1", "r")], waits("A", "#A:1", "w")),
    ));
    cases.push((
        "rwlock_acquire: a reader behind a waiting writer joins the line",
        Case::new(
            &k,
            vec![acquire("B", "#B:1", "r"), waits("C", "#C:1", "w")],
            waits("A", "#A:1", "r"),
        ),
    ));
    cases.push((
        "rwlock_acquire: claims the grant a release made it",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", "w"),
                waits("A", "#A:1", "r"),
                call(
                    &read_write_lock::RELEASE,
                    &k.keys,
                    &["#B:1", &k.channel, "0"],
                ),
            ],
            waits("A", "#A:1", "r"),
        ),
    ));
    cases.push((
        "rwlock_acquire: grants the head writer a lease that ran out, then waits",
        Case::new(
            &k,
            vec![
                call(
                    &read_write_lock::ACQUIRE,
                    &k.keys,
                    &["B", "#B:1", "30", "r", &rw_channel, "0", "0"],
                ),
                waits("C", "#C:1", "w"),
            ],
            waits("A", "#A:1", "r"),
        )
        .after(Duration::from_millis(60))
        .publishes(),
    ));
    cases.push((
        "rwlock_cancel: hands on an unclaimed grant",
        Case::new(
            &k,
            vec![
                acquire("B", "#B:1", "w"),
                waits("A", "#A:1", "r"),
                waits("C", "#C:1", "w"),
                call(
                    &read_write_lock::RELEASE,
                    &k.keys,
                    &["#B:1", &k.channel, "0"],
                ),
            ],
            call(
                &read_write_lock::CANCEL,
                &k.keys,
                &[&format!("#A:1 {LONG} r:A {rw_channel}"), &k.channel, "0"],
            ),
        )
        .replies_may_differ("{1} then {0} (nothing left to remove); queued.rs only logs it")
        .publishes(),
    ));
    cases.push((
        "rwlock_renew",
        Case::new(
            &k,
            vec![call(
                &read_write_lock::ACQUIRE,
                &k.keys,
                &["A", "#A:1", "30000", "r", &rw_channel, "0", "0"],
            )],
            call(&read_write_lock::RENEW, &k.keys, &["#A:1", LONG]),
        ),
    ));
    cases.push((
        "rwlock_status: purges an expired hold",
        Case::new(
            &k,
            vec![
                call(
                    &read_write_lock::ACQUIRE,
                    &k.keys,
                    &["B", "#B:1", "20", "r", &rw_channel, "0", "0"],
                ),
                acquire("A", "#A:1", "r"),
            ],
            call(&read_write_lock::STATUS, &k.keys, &["A"]),
        )
        .after(Duration::from_millis(50)),
    ));

    // spin_lock_acquire, spin_lock_renew.
    let k = keys_of(Kind::SpinLock, name);
    cases.push((
        "spin_lock_acquire: takes a free lock",
        Case::new(
            &k,
            vec![],
            call(&spin_lock::ACQUIRE, &k.keys, &["#A:1", LONG]),
        ),
    ));
    cases.push((
        "spin_lock_acquire: busy",
        Case::new(
            &k,
            vec![call(&spin_lock::ACQUIRE, &k.keys, &["#B:1", LONG])],
            call(&spin_lock::ACQUIRE, &k.keys, &["#A:1", LONG]),
        ),
    ));
    cases.push((
        "spin_lock_renew",
        Case::new(
            &k,
            vec![call(&spin_lock::ACQUIRE, &k.keys, &["#A:1", "30000"])],
            call(&spin_lock::RENEW, &k.keys, &["#A:1", LONG]),
        ),
    ));

    // semaphore_acquire, semaphore_renew, semaphore_available, semaphore_update_lease,
    // semaphore_cancel. A request in the line is `<marker> <lease> <permits> <channel>`.
    for kind in [Kind::Semaphore, Kind::PermitExpirableSemaphore] {
        let k = keys_of(kind, name);
        let (ka, kc, kd) = (
            k.client_channel("A"),
            k.client_channel("C"),
            k.client_channel("D"),
        );
        // A try that does not wait (keep-alive 0), on the semaphore's channel.
        let acquire = |marker: &str, permits: &str, lease: &str, configured: &str| {
            call(
                &semaphore::ACQUIRE,
                &k.keys,
                &[marker, permits, lease, &k.channel, "0", configured, "0"],
            )
        };
        // A try that waits in the line if refused, on the client's own channel.
        let waits = |marker: &str, permits: &str, channel: &str| {
            call(
                &semaphore::ACQUIRE,
                &k.keys,
                &[marker, permits, LONG, channel, "0", "", LONG],
            )
        };
        let release = |marker: &str| call(&semaphore::RELEASE, &k.keys, &[marker, &k.channel, "0"]);
        let set = |total: &str| {
            call(
                &semaphore::TRY_SET_PERMITS,
                &k.keys,
                &[total, &k.channel, "0"],
            )
        };
        cases.push((
            "semaphore_acquire: sets the configured total and takes permits",
            Case::new(&k, vec![], acquire("#A:1", "2", LONG, "3")),
        ));
        cases.push((
            "semaphore_acquire: takes permits, giving back an ended lease first",
            Case::new(
                &k,
                vec![set("3"), acquire("#B:1", "2", "20", "")],
                acquire("#A:1", "2", LONG, ""),
            )
            .after(Duration::from_millis(50)),
        ));
        cases.push((
            "semaphore_acquire: too few permits",
            Case::new(
                &k,
                vec![acquire("#B:1", "2", LONG, "3")],
                acquire("#A:1", "2", LONG, ""),
            ),
        ));
        cases.push((
            "semaphore_acquire: too few permits, joins the line",
            Case::new(
                &k,
                vec![acquire("#B:1", "2", LONG, "3")],
                waits("#A:1", "2", &ka),
            ),
        ));
        cases.push((
            "semaphore_acquire: grants the head the permits of an ended lease, then joins the line",
            Case::new(
                &k,
                vec![acquire("#B:1", "1", "20", "1"), waits("#C:1", "1", &kc)],
                waits("#A:1", "1", &ka),
            )
            .after(Duration::from_millis(50))
            .publishes(),
        ));
        cases.push((
            "semaphore_acquire: claims a grant",
            Case::new(
                &k,
                vec![
                    acquire("#B:1", "1", LONG, "1"),
                    waits("#C:1", "1", &kc),
                    release("#B:1"),
                ],
                waits("#C:1", "1", &kc),
            ),
        ));
        cases.push((
            "semaphore_cancel: gives back an unclaimed grant, which goes to the next in line",
            Case::new(
                &k,
                vec![
                    acquire("#B:1", "1", LONG, "1"),
                    waits("#C:1", "1", &kc),
                    waits("#D:1", "1", &kd),
                    release("#B:1"),
                ],
                call(
                    &semaphore::CANCEL,
                    &k.keys,
                    &[&format!("#C:1 {LONG} 1 {kc}"), &k.channel, "0"],
                ),
            )
            .replies_may_differ("{1} then {0} (nothing left to remove); queued.rs only logs it")
            .publishes(),
        ));
        cases.push((
            "semaphore_renew",
            Case::new(
                &k,
                vec![acquire("#A:1", "1", "30000", "3")],
                call(&semaphore::RENEW, &k.keys, &["#A:1", LONG]),
            ),
        ));
        cases.push((
            "semaphore_renew: confirms a grant to an instant",
            Case::new(
                &k,
                vec![acquire("#A:1", "1", "30000", "3")],
                call(&semaphore::RENEW, &k.keys, &["#A:1", "@99999999999999"]),
            ),
        ));
        cases.push((
            "semaphore_available: grants the head the permits of an ended lease",
            Case::new(
                &k,
                vec![acquire("#B:1", "2", "20", "3"), waits("#C:1", "3", &kc)],
                call(&semaphore::AVAILABLE, &k.keys, &[&k.channel, "0"]),
            )
            .after(Duration::from_millis(50))
            .publishes(),
        ));
        if kind == Kind::PermitExpirableSemaphore {
            cases.push((
                "semaphore_update_lease: shortens a lease",
                Case::new(
                    &k,
                    vec![acquire("#A:1", "1", LONG, "3")],
                    call(
                        &semaphore::UPDATE_LEASE,
                        &k.keys,
                        &["#A:1", "30000", &k.channel, "0"],
                    ),
                ),
            ));
        }
    }

    // latch_try_set_count, latch_count_down.
    let k = keys_of(Kind::CountDownLatch, name);
    let window = "600000";
    cases.push((
        "latch_try_set_count",
        Case::new(
            &k,
            vec![],
            call(&latch::TRY_SET_COUNT, &k.keys, &["#A:1", "2", window]),
        ),
    ));
    cases.push((
        "latch_count_down: counts down",
        Case::new(
            &k,
            vec![call(&latch::TRY_SET_COUNT, &k.keys, &["#A:1", "2", window])],
            call(
                &latch::COUNT_DOWN,
                &k.keys,
                &["#A:2", window, &k.channel, "0"],
            ),
        ),
    ));
    cases.push((
        "latch_count_down: opens the latch",
        Case::new(
            &k,
            vec![call(&latch::TRY_SET_COUNT, &k.keys, &["#A:1", "1", window])],
            call(
                &latch::COUNT_DOWN,
                &k.keys,
                &["#A:2", window, &k.channel, "0"],
            ),
        )
        .publishes(),
    ));

    // The rate limiter: rate_limiter_acquire (admitted now, reserved, per-client),
    // rate_limiter_cancel, rate_limiter_set_limit, rate_limiter_status.
    let k = keys_of(Kind::RateLimiter, name);
    let own = rate_limiter::client_state_key(&Namespace::default(), name, "A").unwrap();
    let mut rk = k.keys.clone();
    rk.push(own);
    let take = |marker: &str, mode: &str| {
        call(
            &rate_limiter::ACQUIRE,
            &rk,
            &[
                "1", "-1", marker, "2", "3600000", "0", mode, &k.channel, "0",
            ],
        )
    };
    let rate_case = |setup: Vec<Call>, subject: Call| Case {
        keys: rk.clone(),
        ..Case::new(&k, setup, subject)
    };
    cases.push((
        "rate_limiter_acquire: admitted now",
        rate_case(vec![], take("#A:1", "overall")),
    ));
    cases.push((
        "rate_limiter_acquire: reserved",
        rate_case(vec![take("#A:1", "overall")], take("#A:2", "overall"))
            .replies_may_differ("the delay counts from each run's clock; the moment is the same"),
    ));
    cases.push((
        "rate_limiter_acquire: per client",
        rate_case(vec![], take("#A:1", "per_client")),
    ));
    let give_back = call(&rate_limiter::CANCEL, &rk, &["#A:2", "", ""]);
    cases.push((
        "rate_limiter_cancel: gives a reservation back",
        rate_case(
            vec![take("#A:1", "overall"), take("#A:2", "overall")],
            give_back,
        ),
    ));
    cases.push((
        "rate_limiter_set_limit: only if absent",
        rate_case(
            vec![],
            call(
                &rate_limiter::SET_LIMIT,
                &rk,
                &["5", "1000", "1", "overall", "1", "#A:1"],
            ),
        ),
    ));
    cases.push((
        "rate_limiter_set_limit: in place",
        rate_case(
            vec![take("#A:1", "overall")],
            call(
                &rate_limiter::SET_LIMIT,
                &rk,
                &["5", "1000", "1", "overall", "0", "#A:2"],
            ),
        ),
    ));
    cases.push((
        "rate_limiter_status",
        rate_case(
            vec![take("#A:1", "overall"), take("#A:2", "overall")],
            call(&rate_limiter::STATUS, &rk, &[]),
        )
        .replies_may_differ("it reports the server's clock"),
    ));

    // The election: its campaign (fenced_lock_acquire on its keys), election_renew,
    // election_proclaim, election_resign, election_leader, and a waiting candidate leaving.
    let k = keys_of(Kind::Election, name);
    let (ka, kb) = (k.client_channel("A"), k.client_channel("B"));
    let changes = election::changes_channel(&k);
    let record = vec![k.key.clone(), k.aux("leader").unwrap().to_owned()];
    let campaign = |owner: &str, marker: &str, channel: &str| {
        call(
            &fenced_lock::ACQUIRE,
            &k.keys,
            &[owner, marker, LONG, LONG, channel, "0", ttl],
        )
    };
    // A's term is read from the main key by the setup: the proclaim takes it as an argument,
    // so the cases below use a term placeholder filled in at run time (see `run_case`).
    let proclaim = |value: &str, request: &str| {
        call(
            &election::PROCLAIM,
            &record,
            &["#A:1", "A", TERM, value, &changes, "0", request],
        )
    };
    cases.push((
        "fenced_lock_acquire: a campaign",
        Case::new(&k, vec![], campaign("A", "#A:1", &ka)),
    ));
    cases.push((
        "election_proclaim: the new leader announces itself",
        Case::new(&k, vec![campaign("A", "#A:1", &ka)], proclaim("pod-a", "1")).publishes(),
    ));
    cases.push((
        "election_proclaim: a new value",
        Case::new(
            &k,
            vec![campaign("A", "#A:1", &ka), proclaim("pod-a", "1")],
            proclaim("pod-a, draining", "2"),
        )
        .publishes(),
    ));
    cases.push((
        "election_renew: the record follows its hold",
        Case::new(
            &k,
            vec![
                call(
                    &fenced_lock::ACQUIRE,
                    &k.keys,
                    &["A", "#A:1", "30000", LONG, &ka, "0", ttl],
                ),
                proclaim("pod-a", "1"),
            ],
            call(&election::RENEW, &k.keys, &["#A:1", LONG]),
        ),
    ));
    cases.push((
        "election_leader",
        Case::new(
            &k,
            vec![campaign("A", "#A:1", &ka), proclaim("pod-a", "1")],
            call(&election::LEADER, &record, &[]),
        ),
    ));
    cases.push((
        "election_resign",
        Case::new(
            &k,
            vec![campaign("A", "#A:1", &ka), proclaim("pod-a", "1")],
            call(&election::RESIGN, &record, &["#A:1", TERM, &changes, "0"]),
        )
        .replies_may_differ("{1} then {0} (the record is gone); election.rs does not read it")
        .publishes(),
    ));
    let election_leave = vec![
        k.key.clone(),
        k.aux("handoff").unwrap().to_owned(),
        k.aux("waiting").unwrap().to_owned(),
        k.aux("timeouts").unwrap().to_owned(),
        k.aux("token").unwrap().to_owned(),
    ];
    cases.push((
        "lock_cancel (election): a waiting candidate leaves",
        Case::new(
            &k,
            vec![campaign("B", "#B:1", &kb), campaign("A", "#A:1", &ka)],
            call(
                &lock::CANCEL,
                &election_leave,
                &[&member("#A:1", LONG, "A", &ka), &k.channel, "0", ttl],
            ),
        )
        .replies_may_differ("{1} then {0} (nothing left to remove); queued.rs only logs it"),
    ));
    cases
}

/// Stands for the term of the election's hold `#A:1` in a case's arguments.
const TERM: &str = "<term of #A:1>";

/// The term of the election's hold `#A:1` (its token in the main key `key`), or `0`.
async fn term_of_a(addr: std::net::SocketAddr, key: &str) -> String {
    match lockkit_testkit::send_command(addr, &["HGET", key, "#A:1:token"])
        .await
        .unwrap()
    {
        RespValue::Bulk(Some(bytes)) => String::from_utf8(bytes).unwrap(),
        _ => "0".to_owned(),
    }
}

/// What one `EVAL` of `call` looks like in a pipeline, with `TERM` filled in.
fn eval_call<'a>(call: &'a Call, term: &'a str) -> Vec<&'a str> {
    let args: Vec<&str> = call
        .args
        .iter()
        .map(|a| if a == TERM { term } else { a.as_str() })
        .collect();
    eval(call.script.source(), &call.keys, &args)
}

/// One key as `READ_STATE` reads it, with the order of a hash's fields (which Redis does not
/// keep) taken out.
fn normalized(state: &RespValue) -> Vec<(String, Vec<String>, i64)> {
    let entries = state.as_array().expect("a state reply");
    // The last entry is the server's TIME.
    entries[..entries.len() - 1]
        .iter()
        .map(|entry| {
            let entry = entry.as_array().expect("a key's state");
            let ty = entry[0].as_str().unwrap_or_default().to_owned();
            let mut items: Vec<String> = entry[1]
                .as_array()
                .unwrap_or_default()
                .iter()
                .map(|v| {
                    v.as_str()
                        .map(str::to_owned)
                        .or_else(|| v.as_int().map(|i| i.to_string()))
                        .unwrap_or_default()
                })
                .collect();
            if ty == "hash" {
                let mut pairs: Vec<String> = items.chunks(2).map(|pair| pair.join("=")).collect();
                pairs.sort();
                items = pairs;
            }
            (ty, items, entry[2].as_int().unwrap_or(-3))
        })
        .collect()
}

/// The server's clock in ms from a `TIME` reply.
fn ms(reply: &RespValue) -> u64 {
    server_ms(reply)
}

/// Runs `case` (built for `name`): its setup, then both runs in one `MULTI`. `None` when the
/// runs straddled a millisecond (run it again on fresh keys); else what differs (empty: none).
async fn run_case(
    server: &lockkit_testkit::RedisServer,
    messages: &mut tokio::sync::broadcast::Receiver<fred::types::Message>,
    what: &str,
    case: &Case,
) -> Option<Vec<String>> {
    let addr = server.addr();
    for call in &case.setup {
        let term = term_of_a(addr, &case.keys[0]).await;
        let reply = lockkit_testkit::send_command(addr, &eval_call(call, &term))
            .await
            .unwrap();
        assert!(!reply.is_error(), "{what}: setup failed: {reply:?}");
    }
    if !case.pause.is_zero() {
        // The case is about a lease that ran out: the pause is that lease, with slack.
        tokio::time::sleep(case.pause).await;
    }
    let term = term_of_a(addr, &case.keys[0]).await;
    let read_state = eval(READ_STATE, &case.keys, &[]);
    let mark = "resend-audit:mark";
    let commands = vec![
        vec!["MULTI"],
        vec!["PUBLISH", mark, "start"],
        vec!["TIME"],
        eval_call(&case.subject, &term),
        read_state.clone(),
        vec!["PUBLISH", mark, "between"],
        eval_call(&case.subject, &term),
        read_state,
        vec!["TIME"],
        vec!["PUBLISH", mark, "end"],
        vec!["EXEC"],
    ];
    let replies = lockkit_testkit::send_commands(addr, &commands)
        .await
        .unwrap();
    let exec = replies.last().and_then(RespValue::as_array).expect("EXEC");
    let exec = &exec[1..]; // after the start mark
    let (first, second) = ((&exec[1], &exec[2]), (&exec[4], &exec[5]));
    // The messages from the start mark to the end mark: those after `between` came from the
    // second run.
    let mut first_run = None;
    let mut second_run = None;
    within(HANG, "the messages of both runs", async {
        loop {
            let message = messages.recv().await.unwrap();
            let text = message.value.as_string().unwrap_or_default();
            if &*message.channel == mark {
                match text.as_str() {
                    "start" => first_run = Some(Vec::new()),
                    "between" => second_run = Some(Vec::new()),
                    _ => return,
                }
            } else if let Some(seen) = second_run.as_mut() {
                seen.push(format!("{}: {text}", &*message.channel));
            } else if let Some(seen) = first_run.as_mut() {
                seen.push(text);
            }
        }
    })
    .await;
    if ms(&exec[0]) != ms(&exec[6]) {
        return None;
    }
    let first_run = first_run.unwrap_or_default();
    // What the first run did, for the record (`--no-capture`).
    eprintln!("{what}: replied {:?}, published {first_run:?}", first.0);
    let mut differences = Vec::new();
    assert!(
        !first.0.is_error(),
        "{what}: the first run failed: {:?}",
        first.0
    );
    if case.replies_may_differ.is_none() && first.0 != second.0 {
        differences.push(format!("the reply: {:?}, then {:?}", first.0, second.0));
    }
    let (before, after) = (normalized(first.1), normalized(second.1));
    for ((key, was), now) in case.keys.iter().zip(&before).zip(&after) {
        if was != now {
            differences.push(format!("key {key}: {was:?}, then {now:?}"));
        }
    }
    if case.publishes && first_run.is_empty() {
        differences
            .push("the first run published nothing: the case does not test its message".into());
    }
    let published = second_run.unwrap_or_default();
    if !published.is_empty() {
        differences.push(format!("the second run published {published:?}"));
    }
    Some(differences)
}

/// The scripts lockkit sends with `Resend::Allowed` (the audit in the module docs).
const AUDITED: &[&str] = &[
    "lock_acquire",
    "fenced_lock_acquire",
    "fair_lock_acquire",
    "rwlock_acquire",
    "spin_lock_acquire",
    "semaphore_acquire",
    "lock_renew",
    "election_renew",
    "rwlock_renew",
    "spin_lock_renew",
    "semaphore_renew",
    "lock_cancel",
    "fair_lock_cancel",
    "lock_hold_count",
    "rwlock_status",
    "semaphore_available",
    "semaphore_update_lease",
    "semaphore_cancel",
    "latch_try_set_count",
    "latch_count_down",
    "election_proclaim",
    "election_resign",
    "election_leader",
    "rate_limiter_acquire",
    "rate_limiter_cancel",
    "rate_limiter_set_limit",
    "rate_limiter_status",
];

#[test]
fn every_audited_script_has_a_case() {
    let covered: std::collections::BTreeSet<&str> = cases("covered")
        .iter()
        .map(|(_, case)| case.subject.script.name())
        .collect();
    let missing: Vec<&&str> = AUDITED.iter().filter(|s| !covered.contains(**s)).collect();
    assert!(missing.is_empty(), "no case runs {missing:?}");
}

/// Every script sent with re-sending allowed, run twice with the same arguments in situations
/// where it writes: the second run changes no key, publishes nothing and answers as the first.
/// Reads the keys' expiry with `PEXPIRETIME` (Redis 7.0+; `scripts/test` does not run it on 6.2).
#[tokio::test]
async fn every_script_that_may_be_resent_changes_nothing_the_second_time() {
    let server = spawned().await;
    let listener = raw(&server.url()).await;
    let mut messages = listener.message_rx();
    listener.psubscribe("*").await.unwrap();
    let mut failures = Vec::new();
    let count = cases("count").len();
    for index in 0..count {
        let mut outcome = None;
        for _ in 0..50 {
            let name = unique("resend-audit");
            let (what, case) = cases(&name).swap_remove(index);
            if let Some(differences) = run_case(&server, &mut messages, what, &case).await {
                outcome = Some((what, differences));
                break;
            }
        }
        let (what, differences) = outcome.expect("two runs within one millisecond in 50 tries");
        if !differences.is_empty() {
            failures.push(format!("{what}:\n    {}", differences.join("\n    ")));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {count} cases changed something on their second run:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
