//! Redis in a Docker container, through the `testcontainers` crate (feature `testcontainers`).

use std::time::Duration;

use testcontainers::core::{ContainerPort, WaitFor};
use testcontainers::runners::AsyncRunner;
use testcontainers::{ContainerAsync, GenericImage, ImageExt};

use crate::TestkitError;

/// The Docker image [`RedisContainer::start`] runs.
pub const REDIS_IMAGE: &str = "redis";

/// The tag of [`REDIS_IMAGE`] that [`RedisContainer::start`] runs: pinned, so a test run does not
/// change with whatever `latest` is that day.
pub const REDIS_IMAGE_TAG: &str = "7.4.2";

/// The port Redis listens on inside the container.
const REDIS_PORT: ContainerPort = ContainerPort::Tcp(6379);

/// How long [`RedisContainer::start`] waits for the image pull and the server's start.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(120);

/// A `redis-server` in a Docker container, for machines with a Docker engine and no Redis
/// installed.
///
/// The container runs the pinned image [`REDIS_IMAGE`]`:`[`REDIS_IMAGE_TAG`] without
/// persistence, with its port 6379 published on a free host port. Dropping the value stops and
/// removes the container (the drop blocks on the Docker engine, so drop it inside a Tokio
/// runtime, as `#[tokio::test]` does); [`remove`](RedisContainer::remove) does the same and
/// reports failures.
///
/// Unlike a [`RedisServer`](crate::RedisServer) it cannot be killed, paused or restarted: use it
/// where a test only needs *a* Redis. [`redis_url`](crate::redis_url) picks it when the
/// environment variable `LOCKKIT_TEST_BACKEND` is `docker`.
///
/// ```no_run
/// use lockkit_testkit::RedisContainer;
///
/// # async fn demo() -> Result<(), lockkit_testkit::TestkitError> {
/// let redis = RedisContainer::start().await?;
/// let client = redis.url(); // redis://127.0.0.1:<published port>
/// # let _ = client;
/// # Ok(())
/// # }
/// ```
pub struct RedisContainer {
    // Boxed: the handle is large, and `TestRedis` holds a `RedisContainer` beside small variants.
    container: Box<ContainerAsync<GenericImage>>,
    host: String,
    port: u16,
}

impl std::fmt::Debug for RedisContainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisContainer")
            .field("id", &self.container.id())
            .field("host", &self.host)
            .field("port", &self.port)
            .finish()
    }
}

impl RedisContainer {
    /// Starts [`REDIS_IMAGE`]`:`[`REDIS_IMAGE_TAG`] and waits until the server is ready to accept
    /// connections (pulling the image first if the engine does not have it, for up to two
    /// minutes in all).
    ///
    /// # Errors
    /// [`TestkitError::Container`] when no Docker engine answers, the image cannot be pulled, or
    /// the server does not become ready in time.
    pub async fn start() -> Result<RedisContainer, TestkitError> {
        Self::start_tag(REDIS_IMAGE_TAG).await
    }

    /// Like [`start`](RedisContainer::start), with another tag of the `redis` image (for example
    /// `"7.2"` to test against an older server).
    ///
    /// # Errors
    /// As [`start`](RedisContainer::start); an empty tag is refused without calling Docker.
    pub async fn start_tag(tag: &str) -> Result<RedisContainer, TestkitError> {
        if tag.trim().is_empty() {
            return Err(TestkitError::Container {
                context: "starting a Redis container".to_owned(),
                source: "the image tag is empty".into(),
            });
        }
        let image = format!("{REDIS_IMAGE}:{tag}");
        let container = GenericImage::new(REDIS_IMAGE, tag)
            .with_exposed_port(REDIS_PORT)
            .with_wait_for(WaitFor::message_on_stdout("Ready to accept connections"))
            .with_cmd(["redis-server", "--save", "", "--appendonly", "no"])
            .with_startup_timeout(STARTUP_TIMEOUT)
            .start()
            .await
            .map_err(|err| container_error(format!("starting a container of {image}"), err))?;
        let port = container
            .get_host_port_ipv4(REDIS_PORT)
            .await
            .map_err(|err| container_error(format!("finding the host port of {image}"), err))?;
        let host = container
            .get_host()
            .await
            .map_err(|err| container_error(format!("finding the host of {image}"), err))?
            .to_string();
        // The engine may name its host `localhost`; the other backends' URLs use 127.0.0.1,
        // and the published port is bound on IPv4.
        let host = if host == "localhost" {
            "127.0.0.1".to_owned()
        } else {
            host
        };
        tracing::debug!(id = container.id(), %image, %host, port, "redis container ready");
        Ok(RedisContainer {
            container: Box::new(container),
            host,
            port,
        })
    }

    /// The URL of the server, `redis://<docker host>:<published port>` (usually
    /// `redis://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("redis://{}:{}", self.host, self.port)
    }

    /// The host port that the container's port 6379 is published on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The Docker id of the container.
    pub fn id(&self) -> &str {
        self.container.id()
    }

    /// Stops and removes the container, reporting a failure (a drop removes it too, but only
    /// logs one).
    ///
    /// # Errors
    /// [`TestkitError::Container`] when the Docker engine refuses or cannot be reached.
    pub async fn remove(self) -> Result<(), TestkitError> {
        let id = self.container.id().to_owned();
        self.container
            .rm()
            .await
            .map_err(|err| container_error(format!("removing the Redis container {id}"), err))
    }
}

fn container_error(context: String, err: testcontainers::TestcontainersError) -> TestkitError {
    TestkitError::Container {
        context,
        source: Box::new(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pinned_tag_is_redis_7_or_newer() {
        let major: u32 = REDIS_IMAGE_TAG
            .split('.')
            .next()
            .and_then(|major| major.parse().ok())
            .unwrap_or(0);
        assert!(
            major >= 7,
            "{REDIS_IMAGE}:{REDIS_IMAGE_TAG} is older than 7"
        );
        assert!(
            REDIS_IMAGE_TAG.split('.').count() == 3,
            "pin a full version, not a moving tag: {REDIS_IMAGE_TAG}"
        );
    }

    #[tokio::test]
    async fn an_empty_tag_is_refused_without_docker() {
        let err = RedisContainer::start_tag(" ").await.unwrap_err();
        assert!(
            matches!(err, TestkitError::Container { .. }),
            "unexpected error: {err}"
        );
        assert!(err.to_string().contains("tag is empty"), "{err}");
    }
}
