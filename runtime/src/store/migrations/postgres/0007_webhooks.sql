-- Completion webhooks: a run's webhook URL (the start contract's or the fleet's, chosen when it
-- was accepted), and the outbox of its deliveries. A row is added by the trigger in the same
-- transaction as the status change that ends the run or makes it ask, whichever statement made
-- it, so a crash between the change and the POST loses no delivery. A row holds the run as it
-- was then (a run that asked may have gone on before its delivery is sent); a sender claims due
-- rows under a lease (`lease_until`, milliseconds on the database's clock) and records each
-- attempt.
ALTER TABLE runs ADD COLUMN webhook_url TEXT;
CREATE TABLE run_webhooks (
    id BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    status TEXT NOT NULL,
    result TEXT,
    reason_class TEXT,
    question TEXT,
    at TEXT NOT NULL,
    url TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts BIGINT NOT NULL DEFAULT 0,
    next_attempt_ms BIGINT NOT NULL DEFAULT 0,
    lease_owner TEXT,
    lease_until BIGINT NOT NULL DEFAULT 0,
    last_status BIGINT,
    last_error TEXT,
    done_at TEXT
);
CREATE INDEX run_webhooks_due ON run_webhooks (next_attempt_ms) WHERE state = 'pending';
CREATE INDEX run_webhooks_by_run ON run_webhooks (run_id, id);
CREATE FUNCTION fabric_run_webhook() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO run_webhooks (run_id, status, result, reason_class, question, at, url)
    VALUES (NEW.run_id, NEW.status, NEW.result, NEW.reason_class, NEW.question, NEW.updated_at, NEW.webhook_url);
    RETURN NULL;
END
$$;
CREATE TRIGGER run_webhooks_on_status AFTER UPDATE OF status ON runs FOR EACH ROW
WHEN (NEW.webhook_url IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status
    AND NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_input'))
EXECUTE FUNCTION fabric_run_webhook();
