//! The one error shape the run sequence ends with: an outcome class (which decides the exit code),
//! an optional cause, a one-line message, and for engine failures the last lines of `vllm.log`.
//!
//! Every module keeps its own `thiserror` enum and converts into [`Failure`] at the run layer.

use launch_spec::OutcomeClass;

#[derive(Debug, Clone, PartialEq)]
pub struct Failure {
    pub class: OutcomeClass,
    pub cause: Option<String>,
    pub message: String,
    pub engine_log_tail: Vec<String>,
}

impl Failure {
    pub fn new(class: OutcomeClass, message: impl Into<String>) -> Self {
        Self { class, cause: None, message: message.into(), engine_log_tail: Vec::new() }
    }

    pub(crate) fn with_cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    pub(crate) fn with_log_tail(mut self, tail: Vec<String>) -> Self {
        self.engine_log_tail = tail;
        self
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.class.as_str(), self.message)
    }
}

impl std::error::Error for Failure {}
