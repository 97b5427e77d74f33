-- Experiments (issue 51, runtime/src/eval): a dataset run through the runtime, each case's runs
-- recorded as ordinary runs and tagged here. `dataset_text` is the dataset as read, so that an
-- experiment can be graded again (`fabric eval regrade`) without its file; `report` is the last
-- grading, as JSON. `started_from`: the stage a partial re-run (`--from`) went live at.
CREATE TABLE experiments (
    experiment_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    dataset TEXT NOT NULL,
    dataset_text TEXT NOT NULL,
    created_at TEXT NOT NULL,
    report TEXT
);
CREATE TABLE experiment_runs (
    experiment_id TEXT NOT NULL,
    case_id TEXT NOT NULL,
    repeat_idx INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    started_from TEXT,
    PRIMARY KEY (experiment_id, case_id, repeat_idx)
);
CREATE INDEX experiment_runs_by_run ON experiment_runs (run_id);
-- An `llm_judge`'s verdict on a run, kept once per run and judge (its profile, rubric and
-- options, hashed into `judge_key`): grading the run again reads it instead of asking the model.
CREATE TABLE judgements (
    run_id TEXT NOT NULL,
    judge_key TEXT NOT NULL,
    verdict TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    created_at TEXT NOT NULL,
    PRIMARY KEY (run_id, judge_key)
);
