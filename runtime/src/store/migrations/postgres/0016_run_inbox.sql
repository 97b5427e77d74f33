-- Messages for a run that was not asking when they came (issue 52: an A2A message to a `working`
-- task). Each waits here, in the order it came (`queued_seq`), until the run asks: then the
-- oldest one waiting is its reply, taken (`taken_at`, and `taken_for`: the run's `next_seq` then,
-- so its `run.resumed` comes at or after it) in the transaction that claims the run to go on. A
-- taken message whose run asks again with no `run.resumed` since `taken_for` was never recorded
-- as the reply (its replica died first): it waits again. A run's messages go with it at
-- retention. `message_id` is the sender's: the same one again queues nothing twice.
CREATE TABLE run_inbox (
    queued_seq BIGSERIAL PRIMARY KEY,
    run_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    text TEXT NOT NULL,
    created_at TEXT NOT NULL,
    taken_at TEXT,
    taken_for BIGINT,
    UNIQUE (run_id, message_id)
);
CREATE INDEX run_inbox_waiting ON run_inbox (run_id) WHERE taken_at IS NULL;
