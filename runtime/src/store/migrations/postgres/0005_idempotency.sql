-- A start's idempotency key (`Idempotency-Key`): unique across the store, so two replicas racing
-- on one key create one run (the second insert finds the key taken and answers with that run).
-- Kept as long as its run. NULL (no key) never conflicts.
ALTER TABLE runs ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX runs_by_idempotency_key ON runs (idempotency_key);
