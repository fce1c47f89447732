//! payload: runs inside the Slurm job. Serves the model with vLLM, verifies it truly serves, runs
//! Harbor, supervises all of it to the end, and leaves a machine-readable record (docs/design.md §6).
//!
//! The deciding parts are pure functions with unit tests next to them (argv building, start-failure
//! classification, the `model_info` clamp, the Daytona org choice, port choice); the effects live
//! in [`supervisor`] (processes, signals, teardown), [`records`] (files) and [`run`] (the sequence).

pub mod childenv;
pub mod engine;
pub mod failure;
pub mod gpu;
pub mod harbor;
pub mod logsink;
pub mod plan;
pub mod ports;
pub mod postrun;
pub mod records;
pub mod run;
pub mod runlock;
pub mod secrets;
pub mod supervisor;
pub mod timings;
pub mod tls;
pub mod tunnel;

#[cfg(test)]
pub(crate) mod testutil;

pub use failure::Failure;
