-- 0001 initial schema (docs/design.md §7.2), PostgreSQL dialect. Keep in step with 0001_initial.sqlite.sql:
-- the same tables, columns, constraints and indexes; only the types differ (timestamptz, jsonb).

CREATE TABLE attempts (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model            TEXT        NOT NULL,
    benchmark        TEXT        NOT NULL,
    benchmark_family TEXT        NOT NULL,
    cluster          TEXT        NOT NULL,
    username         TEXT        NOT NULL,
    run_tag          TEXT        NOT NULL,
    slurm_job_id     TEXT,
    status           TEXT        NOT NULL
        CHECK (status IN ('pending', 'started', 'finished', 'failed', 'cancelled')),
    reason           TEXT        NOT NULL DEFAULT '',
    config           JSONB       NOT NULL DEFAULT '{}'::jsonb,
    metrics          JSONB,
    attempt          INTEGER     NOT NULL CHECK (attempt >= 1),
    submitted_at     TIMESTAMPTZ NOT NULL,
    started_at       TIMESTAMPTZ,
    ended_at         TIMESTAMPTZ,
    updated_at       TIMESTAMPTZ NOT NULL
);

-- The dedup guarantee: at most one active attempt per (model, family), enforced here so that two
-- submitters racing on one pair — on one login node or on two clusters — cannot both insert.
CREATE UNIQUE INDEX attempts_one_active ON attempts (model, benchmark_family)
    WHERE status IN ('pending', 'started');

-- Each pair's newest attempt (latest_per_pair's probe), attempts_for, the next attempt number.
CREATE INDEX attempts_pair_recency ON attempts (model, benchmark_family, submitted_at DESC, id DESC);

-- Covering for latest_per_pair's per-pair counts and for unevaluated's "finished in this family?".
CREATE INDEX attempts_pair_status ON attempts (model, benchmark_family, status);

CREATE INDEX attempts_run_tag ON attempts (run_tag);

CREATE TABLE models (
    id            TEXT PRIMARY KEY,
    size_class    TEXT,
    registered_at TIMESTAMPTZ NOT NULL,
    base_model    TEXT
);

CREATE INDEX models_registered ON models (registered_at, id);

-- benchmark → family; a benchmark without a row is its own family.
CREATE TABLE benchmark_families (
    benchmark TEXT PRIMARY KEY,
    family    TEXT NOT NULL
);

INSERT INTO benchmark_families (benchmark, family) VALUES
    ('dev_set_v2', 'dev_set_v2'),
    ('DCAgent_dev_set_v2', 'dev_set_v2'),
    ('dev_set_v2_2.0x', 'dev_set_v2'),
    ('openthoughts-tblite', 'dev_set_v2');
