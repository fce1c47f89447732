//! The submitter's single integration-test binary (one link on 2 cores); modules by concern.

mod architecture;
mod broken;
mod catalogue;
mod edge;
mod launch_path;
mod ledger;
#[path = "../common/pg.rs"]
mod pg;
mod queueing;
mod registry;
mod slurm_real;
mod support;
mod team;
mod verify;
