//! The limits of leases and watchdog timeouts, public and checked everywhere a duration comes in.

use std::time::Duration;

/// The default lease of watchdog-mode locks; renewed every third of it.
pub const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest watchdog timeout accepted.
pub const MIN_WATCHDOG_TIMEOUT: Duration = Duration::from_millis(100);
/// The shortest lease (fixed lease, permit lease, `once_per` window) accepted: 1 ms, the
/// granularity of Redis' `PEXPIRE`. A shorter one would be gone before the call returned, so it
/// is refused with [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming this floor
/// rather than rounded up.
pub const MIN_LEASE: Duration = Duration::from_millis(1);
/// The longest lease (fixed or watchdog) accepted: 365 days.
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);
