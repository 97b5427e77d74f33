-- System prompts stored once, by digest (store/prompts.rs): a model reply's journal entry names
-- its prompt's SHA-256, and the prompt's text is one row here, shared by every run that used it.
-- `body` is the text as a JSON string (PostgreSQL's text cannot hold NUL). Rows written before
-- this migration have no `prompt` and hold the whole entry.
CREATE TABLE run_prompts (
    digest TEXT PRIMARY KEY,
    body TEXT NOT NULL
);
ALTER TABLE run_journal ADD COLUMN prompt TEXT;
