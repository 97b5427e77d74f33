-- The idempotency keys' index made partial: runs without a key (NULL) are not in it, so a start
-- without one pays nothing for it (0005 indexed every row; a migration once applied is never
-- edited, so the change is this one).
DROP INDEX runs_by_idempotency_key;
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (idempotency_key) WHERE idempotency_key IS NOT NULL;
-- A cancel request (`POST /v1/runs/{id}/cancel`, `fabric runs cancel`): its reason, set once. A
-- running run's holder looks for the requests on its runs (the index holds only those rows) and
-- ends them `cancelled`; a claim of a run with a request ends it so, without a walk.
ALTER TABLE runs ADD COLUMN cancel_reason TEXT;
CREATE INDEX runs_cancel_requested ON runs (lease_owner) WHERE cancel_reason IS NOT NULL AND status = 'running';
