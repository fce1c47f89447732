//! The submitter's single integration-test binary (one link on 2 cores); modules by concern.

mod broken;
mod catalogue;
mod edge;
mod exit_codes;
mod ledger;
mod multinode;
mod multinode_slurm;
#[path = "../common/pg.rs"]
mod pg;
mod queueing;
mod registry;
mod slurm_real;
mod snapshots;
mod support;
mod team;
mod verify;
