-- 0006 remediation records (docs/verification.md "Remediation"), PostgreSQL dialect. Keep in step
-- with 0006_remediation.sqlite.sql.

-- One row per act of the remediation loop: a cancel, a retry (with the change it makes to the
-- pair's next launch), a hold, or a person's release of a held pair. A pair is held while its
-- newest hold/release row is a hold; its adjustment is the newest retry's since the last release.
CREATE TABLE remediations (
    id               BIGINT      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    model            TEXT        NOT NULL,
    benchmark_family TEXT        NOT NULL,
    agent            TEXT        NOT NULL,
    cluster          TEXT        NOT NULL,
    -- The attempt whose diagnosis caused it; NULL for a release.
    attempt_id       BIGINT      REFERENCES attempts (id),
    -- The diagnosis (a finding id, `outcome.<class>[.<cause>]`), or `release`.
    finding          TEXT        NOT NULL,
    action           TEXT        NOT NULL CHECK (action IN ('cancel', 'retry', 'hold', 'release')),
    change           TEXT        NOT NULL DEFAULT '',
    adjustment       JSONB,
    reason           TEXT        NOT NULL DEFAULT '',
    username         TEXT        NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL
);

-- One act per attempt, so two loops judging the same job record it once.
CREATE UNIQUE INDEX remediations_once_per_attempt ON remediations (attempt_id) WHERE attempt_id IS NOT NULL;
CREATE INDEX remediations_pair ON remediations (model, benchmark_family, agent, id);
