-- One run per session: a run's `session_id` (from its start contract) and whether a claim must
-- wait until every older live run of its session ended (`session_gate`: runs started under
-- `enqueue` or `interrupt`). The index holds only live runs of a session, which is what both a
-- start under `reject` and such a claim look for. Runs accepted before this migration have no
-- session here (a contract is not parsed in SQL: PostgreSQL's jsonb refuses a NUL a goal may hold).
ALTER TABLE runs ADD COLUMN session_id TEXT;
ALTER TABLE runs ADD COLUMN session_gate INTEGER NOT NULL DEFAULT 0;
CREATE INDEX runs_live_by_session ON runs (session_id, run_id)
WHERE session_id IS NOT NULL AND status IN ('queued', 'running', 'awaiting_input');
