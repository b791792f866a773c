//! Scheduled-job guards: [`Client::run_exclusive`] (run on one instance, skip on the others) and
//! [`Client::once_per`] (run at most once per window across instances).

use std::future::Future;
use std::time::Duration;

use fred::interfaces::KeysInterface;
use fred::types::{Expiration, SetOptions};
use lockkit_protocol::keys::Kind;

use crate::client::Client;
use crate::error::During;
use crate::error::{command_error, Error};
use crate::hold::lease_millis;
use crate::object::Object;
use crate::scoped::Lease;

/// Whether a guarded job ran here or was skipped because another instance has it: the result of
/// [`Client::run_exclusive`] and [`Client::once_per`].
///
/// ```
/// use lockkit::JobOutcome;
///
/// fn log(outcome: JobOutcome<usize>) -> String {
///     match outcome {
///         JobOutcome::Ran(rows) => format!("report written here: {rows} rows"),
///         JobOutcome::Skipped => "another instance has the report".to_owned(),
///     }
/// }
///
/// // `client.run_exclusive("report:daily", |_lease| build_report()).await?` returns one of these.
/// assert_eq!(log(JobOutcome::Ran(12)), "report written here: 12 rows");
/// assert_eq!(log(JobOutcome::Skipped), "another instance has the report");
/// assert!(JobOutcome::Ran(12).ran());
/// assert_eq!(JobOutcome::<usize>::Skipped.into_output(), None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a skipped job did not run"]
pub enum JobOutcome<T> {
    /// The job ran on this instance and returned this.
    Ran(T),
    /// Another instance runs (or, for [`Client::once_per`], already ran) the job: it did not run
    /// here.
    Skipped,
}

impl<T> JobOutcome<T> {
    /// Whether the job ran here.
    pub fn ran(&self) -> bool {
        matches!(self, JobOutcome::Ran(_))
    }

    /// Whether the job was skipped.
    pub fn is_skipped(&self) -> bool {
        matches!(self, JobOutcome::Skipped)
    }

    /// The job's output, if it ran here.
    pub fn into_output(self) -> Option<T> {
        match self {
            JobOutcome::Ran(out) => Some(out),
            JobOutcome::Skipped => None,
        }
    }
}

impl Client {
    /// Runs `job` here unless another instance is running it now: takes the lock `name` (a
    /// [`Lock`](crate::Lock), [`Client::lock`]) with one attempt and no waiting, in watchdog mode,
    /// so the lock is kept for as long as the job runs, however long that is; releases it when the
    /// job's future completes. When the lock is taken, returns [`JobOutcome::Skipped`] at once.
    ///
    /// This is the guard for a job every instance starts on the same schedule (the 02:00 report):
    /// one runs it, the others skip. Runs that do not overlap all run: for "at most once per day"
    /// even when the instances' schedules disagree, use [`once_per`](Client::once_per).
    ///
    /// `job` gets the hold's [`Lease`]: a job that must not go on once the lock is lost (Redis
    /// unreachable for longer than the watchdog timeout) can watch [`Lease::lost`].
    ///
    /// The job runs inside the hold's [scope](crate::LockGuard::scope): a `run_exclusive` of the
    /// same name called from within the job re-enters and runs its inner job too. Two calls that
    /// are not nested (two futures of one `join!`, two spawned tasks) exclude each other: one
    /// runs, the other is skipped. Panic or cancellation of the job releases
    /// the lock in the background.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an invalid name, [`Error::Redis`] when Redis fails,
    /// [`Error::Shutdown`] after [`Client::shutdown`]; [`Error::NotHeld`] when the lease was lost
    /// while the job ran (it may have overlapped with another instance's run; the job's output is
    /// discarded).
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// # async fn build_report() -> usize { 0 }
    /// use lockkit::JobOutcome;
    ///
    /// match client.run_exclusive("report:daily", |_lease| build_report()).await? {
    ///     JobOutcome::Ran(rows) => println!("report written: {rows} rows"),
    ///     JobOutcome::Skipped => println!("another instance is writing the report"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn run_exclusive<F, Fut, T>(
        &self,
        name: impl Into<String>,
        job: F,
    ) -> Result<JobOutcome<T>, Error>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let outcome = self
            .lock(name)
            .try_with_lock(Duration::ZERO, None, job)
            .await
            .during("run_exclusive")?;
        Ok(match outcome {
            Some(out) => JobOutcome::Ran(out),
            None => {
                tracing::debug!("job skipped: another instance holds its lock");
                JobOutcome::Skipped
            }
        })
    }

    /// Runs `job` at most once per `window` across every instance that uses this name and Redis.
    ///
    /// The first instance to call it sets a mark in Redis, `<prefix>:once:{name}`, with
    /// `SET NX PX window`, and runs the job; every call anywhere while the mark lives returns
    /// [`JobOutcome::Skipped`] without running it. The mark is **not** removed when the job ends:
    /// it expires `window` after it was set. So instances whose clocks or cron ticks disagree by
    /// seconds still run the job once, as long as the disagreement is shorter than the window
    /// (for a daily job, a window of a few hours is a good choice).
    ///
    /// **At most once**: if the job fails, panics or is cancelled, the mark stays and no instance
    /// runs the job again before the window ends. Handle retries inside the job if they are
    /// needed. The window is measured by Redis, not by the instances' clocks.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for an invalid name, or a window shorter than
    /// [`MIN_LEASE`](crate::MIN_LEASE) (1 ms) or longer than [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`Error::WrongType`] when the key holds something else; [`Error::Redis`] when Redis fails
    /// (the job did not run; the mark may or may not have been set); [`Error::Shutdown`] after
    /// [`Client::shutdown`].
    ///
    /// ```no_run
    /// # async fn demo(client: lockkit::Client) -> Result<(), lockkit::Error> {
    /// # async fn send_digest() {}
    /// use std::time::Duration;
    ///
    /// // Every instance's cron fires around 08:00; the digest goes out once.
    /// let outcome = client
    ///     .once_per("digest:morning", Duration::from_secs(6 * 3600), send_digest)
    ///     .await?;
    /// if outcome.is_skipped() {
    ///     println!("the digest already went out from another instance");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn once_per<F, Fut, T>(
        &self,
        name: impl Into<String>,
        window: Duration,
        job: F,
    ) -> Result<JobOutcome<T>, Error>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T>,
    {
        let window = validate_window(window)?;
        let object = Object::new(
            std::sync::Arc::clone(&self.inner),
            Kind::OnceMark,
            name.into(),
        );
        let keys = object.keys()?;
        let key = keys.key.as_str();
        let inner = object.inner();
        // Unique to this call: a `SET` re-sent after a reconnect finds its own mark, not another
        // instance's.
        let token = format!("{}:{}", inner.id, inner.next_sequence());
        let window_ms = i64::try_from(lease_millis(window)).unwrap_or(i64::MAX);
        let exec = &inner.exec;
        let redis = exec.redis();
        // Setting the mark, and reading it when it was there: one command timeout in all.
        let claim = async {
            let set: Option<String> = redis
                .set(
                    key,
                    token.as_str(),
                    Some(Expiration::PX(window_ms)),
                    Some(SetOptions::NX),
                    false,
                )
                .await
                .map_err(command_error("once_per", key, Kind::OnceMark))?;
            if set.is_some() {
                return Ok(true);
            }
            let mark: Option<String> =
                redis
                    .get(key)
                    .await
                    .map_err(command_error("once_per", key, Kind::OnceMark))?;
            Ok(mark.as_deref() == Some(token.as_str()))
        };
        let ours = exec.command("once_per", &object.name, claim).await?;
        if !ours {
            tracing::debug!(name = %object.name, "job skipped: it already ran in this window");
            return Ok(JobOutcome::Skipped);
        }
        tracing::debug!(name = %object.name, ?window, "window mark set; running the job");
        Ok(JobOutcome::Ran(job().await))
    }
}

/// Checks a once-per window as a lease is checked: at least [`MIN_LEASE`](crate::MIN_LEASE) and
/// at most [`MAX_LEASE`](crate::MAX_LEASE); the message names the window.
fn validate_window(window: Duration) -> Result<Duration, Error> {
    crate::hold::validate_duration("once_per window", window)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_validated() {
        assert!(validate_window(Duration::ZERO).is_err());
        assert!(validate_window(Duration::MAX).is_err());
        assert!(validate_window(Duration::from_micros(10)).is_err());
        assert_eq!(
            validate_window(Duration::from_millis(1)).ok(),
            Some(Duration::from_millis(1))
        );
    }
}
