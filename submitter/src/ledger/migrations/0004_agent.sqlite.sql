-- 0004 the harness in an eval's identity, SQLite dialect. Keep in step with 0004_agent.postgres.sql.

-- The Harbor agent the attempt runs: (model, benchmark family, agent) is one eval, with its own
-- run tag, dedup slot and active attempt. Older rows take the agent their config recorded, else
-- terminus-2 (the default agent, the one imported history ran).
ALTER TABLE attempts ADD COLUMN agent TEXT NOT NULL DEFAULT 'terminus-2';
UPDATE attempts SET agent = json_extract(config, '$.agent')
    WHERE json_valid(config) AND json_type(config, '$.agent') = 'text' AND json_extract(config, '$.agent') <> '';

-- The dedup guarantee, now per (model, family, agent); the planner's indexes follow.
DROP INDEX attempts_one_active;
CREATE UNIQUE INDEX attempts_one_active ON attempts (model, benchmark_family, agent)
    WHERE status IN ('pending', 'started');
DROP INDEX attempts_pair_recency;
CREATE INDEX attempts_pair_recency ON attempts (model, benchmark_family, agent, submitted_at DESC, id DESC);
DROP INDEX attempts_pair_status;
CREATE INDEX attempts_pair_status ON attempts (model, benchmark_family, agent, status, resumable);
