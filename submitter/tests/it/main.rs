//! The submitter's single integration-test binary (one link on 2 cores); modules by concern.

mod architecture;
mod broken;
mod catalogue;
mod compare;
mod completions;
mod edge;
mod exit_codes;
mod finished_work;
mod first_hour;
mod footguns;
#[path = "../../../tests/src/fresh.rs"]
mod fresh;
mod hostile32;
mod hostile32_slurm;
mod launch_path;
mod ledger;
mod model_ids;
mod module_graph;
mod multinode;
mod multinode_slurm;
mod notify;
mod payload_binary;
#[path = "../common/pg.rs"]
mod pg;
#[path = "../common/pgproxy.rs"]
mod pgproxy;
mod pool_alloc;
mod queueing;
mod readiness;
mod real_harbor_launch;
mod reconcile;
mod registry;
mod remediation;
mod scale;
mod shared_alloc;
mod site;
mod site_facts;
mod slurm_real;
mod snapshots;
mod snapshots_ops;
mod support;
mod team;
mod team_tls;
mod team_view;
mod timeouts;
mod verify;
mod verify_rundirs;
