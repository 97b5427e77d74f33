-- The webhook outbox rows are written by the store's writer, in the transaction and with the
-- statement data of each end (the one statement that ends a run or makes it ask), not by a
-- trigger: as on SQLite, where a trigger on `runs` costs a statement journal per status change.
DROP TRIGGER run_webhooks_on_status ON runs;
DROP FUNCTION fabric_run_webhook();
