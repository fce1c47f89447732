//! payload: runs inside the Slurm job. Serves the model with vLLM, verifies it truly serves, runs
//! Harbor, supervises all of it to the end, and leaves a machine-readable record (docs/design.md §6).
//!
//! The deciding parts are pure functions with unit tests next to them (argv building, start-failure
//! classification, the `model_info` clamp, the Daytona org choice, port choice, the run's phases
//! and outcome in [`phases`]); [`prepare`] turns a spec into everything the run does, which
//! [`plan`] renders and [`run`] executes; the effects live in [`supervisor`] (process groups,
//! signals, teardown), [`engine`]'s watchdog (probes), [`records`] (files) and [`run`].

mod bounded;
mod childenv;
mod engine;
pub mod exit;
mod failure;
pub mod gpu;
mod gputime;
mod harbor;
pub mod liveness;
pub mod logsink;
pub mod multinode;
mod phases;
pub mod plan;
mod ports;
mod postrun;
pub mod prepare;
mod provenance;
pub mod records;
pub mod run;
mod runlock;
mod scratch;
mod secrets;
pub mod supervisor;
mod timings;
mod tls;
mod tunnel;

pub use failure::Failure;
