-- A reply that could not start puts its run back to awaiting input with the same question and
-- result (`reopen_reply`): that tells nothing new, so it adds no delivery (a receiver could not
-- drop it as a duplicate: it would have a new webhook-id). A run that asks again after a reply
-- has a new result (the reply is in its notes).
DROP TRIGGER run_webhooks_on_status;
CREATE TRIGGER run_webhooks_on_status AFTER UPDATE OF status ON runs
WHEN NEW.webhook_url IS NOT NULL AND NEW.status <> OLD.status
    AND NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_input')
    AND NOT (NEW.status = 'awaiting_input' AND NEW.result IS OLD.result)
BEGIN
    INSERT INTO run_webhooks (run_id, status, result, reason_class, question, at, url)
    VALUES (NEW.run_id, NEW.status, NEW.result, NEW.reason_class, NEW.question, NEW.updated_at, NEW.webhook_url);
END;
