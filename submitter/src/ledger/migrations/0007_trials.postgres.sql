-- 0007 per-trial facts (issue 35, docs/ledger.md "Schema (migration 7, trials)"), PostgreSQL dialect.
-- Keep in step with 0007_trials.sqlite.sql. Self-contained: two new tables, nothing else touched.

-- Which Harbor produced an attempt's trials (its job lock), written by sync with the trials.
CREATE TABLE trial_sets (
    attempt_id     BIGINT      PRIMARY KEY REFERENCES attempts (id),
    harbor_version TEXT,
    recorded_at    TIMESTAMPTZ NOT NULL
);

-- One row per finished trial: its task, its attempt number within the task (1, 2, … by start
-- time), its reward (0 when the verifier gave none) and Harbor's verdict on whether it counts.
CREATE TABLE trials (
    attempt_id BIGINT           NOT NULL REFERENCES trial_sets (attempt_id),
    task       TEXT             NOT NULL,
    attempt    INTEGER          NOT NULL CHECK (attempt >= 1),
    reward     DOUBLE PRECISION NOT NULL,
    valid      BOOLEAN          NOT NULL,
    PRIMARY KEY (attempt_id, task, attempt)
);
