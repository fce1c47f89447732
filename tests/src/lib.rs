//! test support

pub mod standin;
pub mod sshd;
