//! Real Redis servers and network faults for integration tests.
//!
//! `lockkit-testkit` lets tests talk to real `redis-server` processes
//! instead of mocks, and put a fault-injecting TCP proxy between a client and
//! a server:
//!
//! * [`RedisServer`] starts `redis-server` on a free `127.0.0.1` port, with no
//!   persistence and a temporary directory of its own, and kills it on drop.
//!   It can be killed, restarted empty on the same port, paused with
//!   `SIGSTOP` and resumed, and inspected with raw commands through
//!   [`RedisServer::command`].
//! * [`RedisCluster`] starts a Redis Cluster (primaries with replicas) of such servers, and can
//!   kill or pause a node and trigger a failover.
//! * [`RedisSentinelGroup`] starts a primary, its replicas and sentinels, and can kill the
//!   primary or force a failover.
//! * [`redis_url`] gives a server for a test: the one named by the `REDIS_URL`
//!   environment variable if set, else a spawned one (or a Docker container:
//!   see below).
//! * [`TestCertificates`] makes a CA with server and client certificates at
//!   test time, and [`ServerOptions::tls`] starts a server that speaks only
//!   TLS (`rediss://`).
//! * [`FaultProxy`] forwards TCP connections to a server and can add latency
//!   and jitter, pause traffic, cut connections, refuse new ones, or drop the
//!   reply to one chosen request after the server executed it.
//!
//! The `redis-server` binary is taken from the `REDIS_SERVER_BIN` environment
//! variable, else from `PATH`; on Debian it comes with the package
//! `redis-server`.
//!
//! ```no_run
//! use lockkit_testkit::{FaultProxy, RedisServer, RespValue};
//!
//! # async fn demo() -> Result<(), lockkit_testkit::TestkitError> {
//! let server = RedisServer::start().await?;
//! server.command(&["SET", "key", "value"]).await?;
//! let value = server.command(&["GET", "key"]).await?;
//! assert_eq!(value.as_str(), Some("value"));
//!
//! let proxy = FaultProxy::start(server.addr()).await?;
//! proxy.cut_after_request_containing("critical-key");
//! // ... run the client under test against `proxy.url()` ...
//! proxy.wait_triggered().await;
//! # Ok(())
//! # }
//! ```
//!
//! With the `testcontainers` feature (off by default: it pulls in a Docker
//! client), `RedisContainer` runs Redis in a Docker container of the pinned
//! image `redis:7.4.2` instead, for machines with Docker and no `redis-server`,
//! and [`redis_url`] uses it when the environment variable
//! `LOCKKIT_TEST_BACKEND` ([`BACKEND_ENV`]) is `docker`:
//!
//! ```text
//! LOCKKIT_TEST_BACKEND=docker cargo test --workspace --features lockkit-testkit/testcontainers
//! ```
//!
//! Everything here is meant for tests: servers listen on loopback only and
//! run without a password unless one is passed in [`ServerOptions`].

// docs.rs (`--cfg docsrs`, nightly) marks every feature-gated item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod cluster;
#[cfg(feature = "testcontainers")]
mod container;
mod error;
mod profile;
mod proxy;
mod resp;
mod sentinel;
mod server;
mod tls;

pub use cluster::RedisCluster;
#[cfg(feature = "testcontainers")]
#[cfg_attr(docsrs, doc(cfg(feature = "testcontainers")))]
pub use container::{RedisContainer, REDIS_IMAGE, REDIS_IMAGE_TAG};
pub use error::TestkitError;
pub use profile::{
    operator_alias, Profile, MANAGED_BLOCKED_COMMANDS, MANAGED_CLIENT_SUBCOMMANDS, PROFILE_ENV,
    SCRIPTING_COMMANDS,
};
pub use proxy::FaultProxy;
pub use resp::{encode_command, send_command, send_commands, RespValue};
pub use sentinel::{RedisSentinelGroup, SENTINEL_SERVICE_NAME};
pub use server::{redis_url, RedisServer, ServerOptions, TestRedis, BACKEND_ENV};
pub use tls::TestCertificates;
