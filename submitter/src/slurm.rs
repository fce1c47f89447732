//! Slurm client: being written.
