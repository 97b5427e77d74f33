-- The order of a session's starts under a policy, as the store took them (one at a time per
-- session): a run waiting behind its session waits for the runs started before it, in that
-- order, not in the order of run ids (made by each replica before the start reached the store).
ALTER TABLE runs ADD COLUMN session_seq INTEGER;
CREATE INDEX runs_by_session_seq ON runs (session_id, session_seq) WHERE session_seq IS NOT NULL;
-- Cancel requests on runs that are not running (an interrupting start whose replica died, or
-- whose client went away, before it ended them): each replica's poll ends them.
CREATE INDEX runs_cancel_pending ON runs (run_id) WHERE cancel_reason IS NOT NULL AND status IN ('queued', 'awaiting_input');
