//! Support code for the vLLM and Harbor stand-in programs (`src/bin/vllm-standin.rs`,
//! `src/bin/harbor-standin.rs`). Test support only: never shipped as the product.
#![allow(unsafe_code)]
#![allow(clippy::print_stdout, clippy::print_stderr)]

pub mod argparse;
pub mod click;
pub mod common;
pub mod harbor_files;
pub mod harbor_model;
pub mod harbor_opts;
pub mod hub;
pub mod multinode;
pub mod vllm_flags;
