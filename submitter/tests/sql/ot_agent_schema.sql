-- The team's database as the replaced system (OT-Agent) uses it: the tables and columns its code
-- reads and writes (docs/ledger.md, "The team's database"). Written for the tests from those field
-- lists; no real data. Applied inside a per-test schema (search_path).

CREATE TABLE models (
    id             UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    name           TEXT NOT NULL,
    base_model_id  UUID REFERENCES models (id),
    created_by     TEXT,
    duplicate_of   UUID REFERENCES models (id),
    creation_time  TIMESTAMPTZ,
    created_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    weights_location TEXT,
    training_parameters JSONB,
    url            TEXT,
    hf_url         TEXT
);

CREATE TABLE benchmarks (
    id           UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    name         TEXT NOT NULL,
    duplicate_of UUID REFERENCES benchmarks (id),
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE sandbox_jobs (
    id              UUID PRIMARY KEY DEFAULT gen_random_uuid(),
    job_name        TEXT,
    username        TEXT,
    job_status      TEXT CHECK (job_status IN ('Pending', 'Started', 'Finished', 'Failed')),
    submitted_at    TIMESTAMPTZ,
    started_at      TIMESTAMPTZ,
    ended_at        TIMESTAMPTZ,
    slurm_job_id    TEXT,
    config          JSONB,
    metrics         JSONB,
    stats           JSONB,
    model_id        UUID REFERENCES models (id),
    benchmark_id    UUID REFERENCES benchmarks (id),
    agent_id        UUID,
    n_trials        INTEGER,
    n_rep_eval      INTEGER,
    package_version TEXT,
    hf_traces_link  TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now()
);
