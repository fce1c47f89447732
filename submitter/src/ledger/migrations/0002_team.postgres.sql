-- 0002 one ledger for the team, PostgreSQL dialect. Keep in step with 0002_team.sqlite.sql.

-- One row per (cluster, submitter): when that submitter last reconciled its cluster's attempts with
-- its Slurm, and the bound after which other clusters flag those attempts as unattended.
CREATE TABLE heartbeats (
    cluster       TEXT        NOT NULL,
    submitter     TEXT        NOT NULL,
    refreshed_at  TIMESTAMPTZ NOT NULL,
    stale_after_s BIGINT      NOT NULL CHECK (stale_after_s >= 0),
    PRIMARY KEY (cluster, submitter)
);

-- Where an imported attempt came from (`<source>#<row id>`); NULL for the ledger's own attempts.
ALTER TABLE attempts ADD COLUMN source_id TEXT;

CREATE UNIQUE INDEX attempts_source ON attempts (source_id) WHERE source_id IS NOT NULL;

-- Per import source: the newest lifecycle time seen, where the next incremental import starts.
CREATE TABLE import_sources (
    source      TEXT        NOT NULL PRIMARY KEY,
    watermark   TIMESTAMPTZ,
    imported_at TIMESTAMPTZ NOT NULL
);
