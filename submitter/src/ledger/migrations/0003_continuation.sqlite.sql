-- 0003 walltime continuation, SQLite dialect. Keep in step with 0003_continuation.postgres.sql.

-- 1 when the attempt ended by the walltime (or was otherwise resumable): the planner continues it
-- and it does not count toward the pair's failures (limits.max_attempts). An integer on both
-- backends so the planner's query is one text.
ALTER TABLE attempts ADD COLUMN resumable INTEGER NOT NULL DEFAULT 0 CHECK (resumable IN (0, 1));

-- The per-pair failure count now reads `resumable` too: keep latest_per_pair's scan covering.
DROP INDEX attempts_pair_status;
CREATE INDEX attempts_pair_status ON attempts (model, benchmark_family, status, resumable);
