//! The login-node half: configuration, registry resolution, Slurm, ledger, dedup and verdicts.
//! `main.rs` only wires commands; everything reusable lives here.

pub mod cancel;
pub mod cli;
pub mod config;
pub mod decide;
pub mod domain;
pub mod executor;
pub mod gpuhours;
pub mod ledger;
pub mod lint;
pub mod names;
pub mod node_binary;
pub mod notify;
pub mod observe;
pub mod output;
pub mod plan_text;
pub mod planner;
pub mod preflight;
pub mod queue;
pub mod readiness;
pub mod registry;
pub mod remediate;
pub mod selection;
pub mod settings;
pub mod slurm;
pub mod snapshot;
pub mod spec_build;
pub mod stage;
pub mod stats;
pub mod sync;
pub mod team;
pub mod term;
pub mod text;
pub mod verify;

#[cfg(test)]
mod testkit;
