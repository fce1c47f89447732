//! test support

mod fresh;
pub mod harness;
pub mod sshd;
pub mod standin;
pub mod vllm_oracle;
