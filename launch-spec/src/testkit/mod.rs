//! Test fixtures shared by payload's unit tests, submitter's integration tests and the end-to-end
//! tests (tests/README.md, "Fixtures"): [`TestSpec`] for launch specs, [`RunDir`] for run
//! directories (and [`world`] for the environment prefix, dataset and secrets a spec points at), both built from this crate's typed records so a renamed field breaks the fixtures
//! at compile time instead of silently testing an old format. Compiled only with the `testkit`
//! feature, which the other crates enable for their tests alone.

pub mod rundir;
pub mod spec;
pub mod world;

pub use rundir::{Counters, Finished, HarborJob, JobResult, RunDir, Stage, Trial, VllmLog, assert_typed_event_line};
pub use spec::{TestSpec, unit_spec};
