-- 0007 per-trial facts (issue 35, docs/ledger.md "Schema (migration 7, trials)"), SQLite dialect. Keep in
-- step with 0007_trials.postgres.sql. Self-contained: two new tables, nothing else touched.

-- Which Harbor produced an attempt's trials (its job lock), written by sync with the trials.
CREATE TABLE trial_sets (
    attempt_id     INTEGER PRIMARY KEY REFERENCES attempts (id),
    harbor_version TEXT,
    recorded_at    TEXT    NOT NULL CHECK (recorded_at GLOB '????-??-??T??:??:??.??????Z')
);

-- One row per finished trial: its task, its attempt number within the task (1, 2, … by start
-- time), its reward (0 when the verifier gave none) and Harbor's verdict on whether it counts.
CREATE TABLE trials (
    attempt_id INTEGER NOT NULL REFERENCES trial_sets (attempt_id),
    task       TEXT    NOT NULL,
    attempt    INTEGER NOT NULL CHECK (attempt >= 1),
    reward     REAL    NOT NULL,
    valid      INTEGER NOT NULL CHECK (valid IN (0, 1)),
    PRIMARY KEY (attempt_id, task, attempt)
);
