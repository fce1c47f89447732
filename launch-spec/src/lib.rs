//! Types both programs speak: the launch spec, the run records, GPU profiles, and the one YAML
//! entry point. Versioned; no secret values ever live in these types.

pub mod agents;
pub mod document;
pub mod envfile;
pub mod expand;
pub mod fsread;
pub mod gpu;
pub mod layout;
pub mod logging;
pub mod model_id;
pub mod placeholder;
pub mod pool;
pub mod records;
pub mod rundir;
pub mod settings;
pub mod shared;
pub mod spec;
mod strict_de;
#[cfg(feature = "testkit")]
pub mod testkit;
pub mod validate;
pub mod versions;
pub mod yaml;

pub use gpu::{GpuInfo, GpuProfile, GpuProfiles};
pub use model_id::{ModelId, ModelIdError};
pub use records::{OutcomeClass, Phase, RunStatus};
pub use spec::{LaunchSpec, SPEC_VERSION};
