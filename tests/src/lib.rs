//! test support

pub mod harness;
pub mod standin;
pub mod sshd;
