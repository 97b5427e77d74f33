-- The webhook outbox rows are written by the store's writer, in the transaction and with the
-- statement data of each end (the one statement that ends a run or makes it ask), not by a
-- trigger: a trigger on `runs` makes SQLite keep a statement journal for every UPDATE of a
-- run's status, about 17,000 instructions per run whether it has a webhook or not.
DROP TRIGGER run_webhooks_on_status;
