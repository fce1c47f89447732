//! The login-node half: configuration, registry resolution, Slurm, ledger, dedup and verdicts.
//! `main.rs` only wires commands; everything reusable lives here.

mod cancel;
pub mod cli;
pub mod config;
pub mod decide;
pub mod domain;
pub mod executor;
pub mod gpuhours;
pub mod ledger;
mod lint;
pub mod names;
mod node_binary;
pub mod notify;
mod observe;
pub mod output;
pub mod plan_text;
pub mod planner;
pub mod pool;
mod preflight;
pub mod queue;
pub mod readiness;
pub mod registry;
pub mod remediate;
pub mod selection;
mod settings;
pub mod slurm;
pub mod snapshot;
pub mod spec_build;
mod stage;
pub mod stats;
pub mod sync;
pub mod team;
pub mod term;
mod text;
pub mod transition;
pub mod verify;

#[cfg(test)]
mod testkit;
