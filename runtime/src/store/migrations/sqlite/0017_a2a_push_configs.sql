-- A2A push notification configs (issue 52): where a task's (a run's) status changes are posted,
-- several per run, each with the token and `Authorization` its deliveries carry (`legacy`: made
-- through an A2A 0.3 method, so its bodies are 0.3's). An outbox row of a config names it in
-- `push_config`; the writer adds those rows in the transaction of the status change, as it does
-- the run's own webhook's. Deleted with the run at retention.
CREATE TABLE a2a_push_configs (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    config_id TEXT NOT NULL,
    url TEXT NOT NULL,
    token TEXT,
    auth_scheme TEXT,
    auth_credentials TEXT,
    legacy INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, config_id)
);
ALTER TABLE run_webhooks ADD COLUMN push_config TEXT;
