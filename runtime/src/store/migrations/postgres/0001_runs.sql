-- Runs, their events and their journal: the same tables as SQLite's 0001, in PostgreSQL's
-- types. Times are text in the store's sortable form (YYYY-MM-DDTHH:MM:SS.mmmZ) on both.
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    route_id TEXT NOT NULL,
    status TEXT NOT NULL,
    request TEXT NOT NULL,
    result TEXT,
    reason_class TEXT,
    question TEXT,
    next_seq BIGINT NOT NULL DEFAULT 1,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX runs_by_route_status ON runs (route_id, status, created_at);
CREATE INDEX runs_by_status ON runs (status, created_at);

CREATE TABLE run_events (
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    seq BIGINT NOT NULL,
    kind TEXT NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (run_id, seq)
);

CREATE TABLE run_journal (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL REFERENCES runs (run_id),
    entry TEXT NOT NULL
);
CREATE INDEX run_journal_by_run ON run_journal (run_id, id);
