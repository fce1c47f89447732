-- 0005 GPU-seconds per attempt (issue 24), SQLite dialect. Keep in step with 0005_gpu_seconds.postgres.sql.

-- What the attempt's job spent on its GPUs, split by phase (queue wait is never in it), written by
-- sync when the attempt ends: `{"gpus", "shared", "slurm_elapsed_s", "by_phase": {prepare, load,
-- serving, idle, teardown, slurm_other}}` in GPU-seconds (docs/submitter.md "GPU-hours"). NULL for
-- older rows, imports, and attempts whose job recorded no GPU time.
ALTER TABLE attempts ADD COLUMN gpu_seconds TEXT;
