//! Executable reference models of lockkit's primitives.
//!
//! One model per primitive, each written from the documented contract (`docs/guide.md`,
//! `docs/design.md`), not from the Lua scripts: pure Rust, sequential, no I/O, time as a logical
//! clock in milliseconds. They are the single source of truth of two kinds of tests:
//!
//! - **model-based tests** (`tests/model_*.rs`): generated operation sequences run against the
//!   real scripts on a real `redis-server` and against the model; every reply and the decoded
//!   key state must agree after every step;
//! - **linearizability checks** ([`spec::Spec`], `lockkit_suite::linearizability`): concurrent
//!   histories recorded by the soak and the fault suite must be explainable by some sequential
//!   order of the model's steps.
//!
//! Each module's documentation says which contract it encodes.

pub mod election;
pub mod latch;
pub mod lock;
pub mod multi;
pub mod rate_limiter;
pub mod rwlock;
pub mod semaphore;
pub mod spec;
pub mod spin;
pub mod timed;
