-- A reply that could not start puts its run back to awaiting input with the same question and
-- result (`reopen_reply`): that tells nothing new, so it adds no delivery (a receiver could not
-- drop it as a duplicate: it would have a new webhook-id). A run that asks again after a reply
-- has a new result (the reply is in its notes).
DROP TRIGGER run_webhooks_on_status ON runs;
CREATE TRIGGER run_webhooks_on_status AFTER UPDATE OF status ON runs FOR EACH ROW
WHEN (NEW.webhook_url IS NOT NULL AND NEW.status IS DISTINCT FROM OLD.status
    AND NEW.status IN ('completed', 'failed', 'cancelled', 'awaiting_input')
    AND NOT (NEW.status = 'awaiting_input' AND NEW.result IS NOT DISTINCT FROM OLD.result))
EXECUTE FUNCTION fabric_run_webhook();
