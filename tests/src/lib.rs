//! test support

pub mod standin;
