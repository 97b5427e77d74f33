//! Experiments: every case of a dataset run through a [`Durable`] (recorded in its store like any
//! run, and tagged with the experiment), then graded from what the store recorded; and the same
//! grading again of an experiment's recorded runs ([`regrade`]), which makes no model call.

use std::sync::Arc;

use futures_util::StreamExt;

use super::dataset::{Dataset, DatasetError};
use super::grade::RunRecord;
use super::report::{Graded, Report, build};
use crate::cancel::CancelHandle;
use crate::diag::Diagnostic;
use crate::events::NullSink;
use crate::runtime::{AcceptError, Durable, StartRequest};
use crate::store::experiments::{CaseRun, ExperimentStore, StoredExperiment};
use crate::store::{RunStore, StoreError};

/// How an experiment runs its cases.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Runs at once (at least 1).
    pub concurrency: usize,
    /// Runs per case (at least 1).
    pub repeat: u32,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions { concurrency: 4, repeat: 1 }
    }
}

/// Why an experiment could not be run or graded.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// The dataset does not fit the runtime: every problem, located, found before any run.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Refused(Vec<Diagnostic>),
    #[error("this run store keeps no experiments")]
    NoExperiments,
    #[error("no experiment `{0}`")]
    NotFound(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A case's run could not start (after the checks: the catalogue changed, the store refused).
    #[error("case `{case}`: {error}")]
    NotStarted { case: String, error: Box<AcceptError> },
}

/// The experiments' part of a run store.
pub fn experiments(store: &dyn RunStore) -> Result<&dyn ExperimentStore, EvalError> {
    store.experiments().ok_or(EvalError::NoExperiments)
}

/// Runs every case of `dataset` (`text` as read, kept with the experiment) `options.repeat`
/// times on `durable`, recorded and tagged with a new experiment, and grades the runs. The
/// dataset is checked first ([`super::check`]): a problem refuses it before any run. `handle`
/// stops the runs (a signal).
pub async fn run(durable: &Durable, dataset: &Dataset, text: &str, options: &RunOptions, handle: &CancelHandle) -> Result<Report, EvalError> {
    let problems = super::check::check(dataset, durable.runtime());
    if !problems.is_empty() {
        return Err(EvalError::Refused(problems));
    }
    let store = experiments(durable.store().as_ref())?;
    let experiment_id = new_experiment(store, dataset, text).await?;
    let jobs = dataset.cases.iter().flat_map(|case| (0..options.repeat.max(1)).map(move |repeat| Job { case, repeat, seed: None })).collect();
    let runs = run_jobs(durable, store, &experiment_id, jobs, options, handle).await?;
    grade_runs(durable.store().as_ref(), store, &experiment_id, dataset, runs, Some(durable.runtime())).await
}

/// Keeps a new experiment of `dataset` (`text` as read); its id.
pub(super) async fn new_experiment(store: &dyn ExperimentStore, dataset: &Dataset, text: &str) -> Result<String, EvalError> {
    let experiment_id = crate::exec::new_run_id();
    let row = StoredExperiment {
        experiment_id: experiment_id.clone(),
        name: dataset.name.clone(),
        dataset: dataset.path.display().to_string(),
        dataset_text: text.to_owned(),
        created_at: String::new(),
        report: None,
    };
    store.put_experiment(&row).await?;
    Ok(experiment_id)
}

/// One run of a case to make: its repeat, and the journal entries it starts from (a partial
/// re-run, [`super::rerun`]; `None`: a new run from its first stage).
pub(super) struct Job<'d> {
    pub case: &'d super::Case,
    pub repeat: u32,
    pub seed: Option<Vec<crate::exec::JournalEntry>>,
}

/// Makes the runs of `jobs`, `options.concurrency` at a time, each recorded and tagged with
/// experiment `id`; a seeded run's first live stage is its `started_from`.
pub(super) async fn run_jobs(
    durable: &Durable,
    store: &dyn ExperimentStore,
    id: &str,
    jobs: Vec<Job<'_>>,
    options: &RunOptions,
    handle: &CancelHandle,
) -> Result<Vec<CaseRun>, EvalError> {
    let ran: Vec<Result<CaseRun, EvalError>> = futures_util::stream::iter(jobs)
        .map(|Job { case, repeat, seed }| async move {
            let req =
                StartRequest { route_id: case.route_id.clone(), goal: case.goal.clone(), model_profile: case.model_profile.clone(), ..StartRequest::default() };
            let seeded = seed.as_ref().map(Vec::len);
            let outcome = match seed {
                None => durable.run_recorded(&req, Arc::new(NullSink), handle, handle.token()).await,
                Some(seed) => durable.run_seeded(&req, seed, Arc::new(NullSink), handle, handle.token()).await,
            };
            let run_id = outcome.map_err(|error| EvalError::NotStarted { case: case.id.clone(), error: Box::new(error) })?.result.run_id;
            let started_from = match seeded {
                // The first entry the run did not take from its seed: where it went live.
                Some(n) => durable.store().journal(&run_id).await?.get(n).and_then(super::rerun::stage_of).map(str::to_owned),
                None => None,
            };
            let run = CaseRun { case_id: case.id.clone(), repeat, run_id, started_from };
            store.add_case_run(id, &run).await?;
            Ok(run)
        })
        .buffer_unordered(options.concurrency.max(1))
        .collect()
        .await;
    ran.into_iter().collect()
}

/// Grades experiment `experiment_id`'s recorded runs again with `dataset` (else the dataset it
/// was run with), reading only the store: no model is called. The report is kept as its last.
pub async fn regrade(runs_store: &dyn RunStore, experiment_id: &str, dataset: Option<&Dataset>) -> Result<Report, EvalError> {
    let store = experiments(runs_store)?;
    let stored_dataset;
    let dataset = match dataset {
        Some(d) => d,
        None => {
            stored_dataset = stored(store, experiment_id).await?;
            &stored_dataset
        }
    };
    let runs = store.case_runs(experiment_id).await?;
    if runs.is_empty() && store.experiment(experiment_id).await?.is_none() {
        return Err(EvalError::NotFound(experiment_id.to_owned()));
    }
    grade_runs(runs_store, store, experiment_id, dataset, runs, None).await
}

/// The dataset experiment `experiment_id` was run with, as it was read then.
pub async fn stored(store: &dyn ExperimentStore, experiment_id: &str) -> Result<Dataset, EvalError> {
    let row = store.experiment(experiment_id).await?.ok_or_else(|| EvalError::NotFound(experiment_id.to_owned()))?;
    Ok(Dataset::parse(std::path::Path::new(&row.dataset), &row.dataset_text)?)
}

/// The last report kept of experiment `experiment_id`.
pub async fn last_report(runs_store: &dyn RunStore, experiment_id: &str) -> Result<Report, EvalError> {
    let store = experiments(runs_store)?;
    let row = store.experiment(experiment_id).await?.ok_or_else(|| EvalError::NotFound(experiment_id.to_owned()))?;
    let text = row.report.ok_or_else(|| EvalError::NotFound(format!("{experiment_id} (it was never graded)")))?;
    serde_json::from_str(&text).map_err(|e| EvalError::Store(StoreError::Database(format!("experiment {experiment_id}: its report does not read: {e}"))))
}

/// Grades `runs` with `dataset` and keeps the report as the experiment's last. A judge's verdict
/// kept for a run is read; one not kept yet is asked of `judge`'s model, or, without it
/// (regrading), reported as not judged.
pub(super) async fn grade_runs(
    runs_store: &dyn RunStore,
    store: &dyn ExperimentStore,
    experiment_id: &str,
    dataset: &Dataset,
    runs: Vec<CaseRun>,
    judge: Option<&crate::runtime::Runtime>,
) -> Result<Report, EvalError> {
    let mut graded = Vec::with_capacity(runs.len());
    let mut cost = super::judge::JudgeCost::default();
    for run in runs {
        let record = match record_of(runs_store, &run.run_id).await {
            Ok(record) => record,
            // Pruned since (`fabric runs prune`, the service's retention): graded as gone.
            Err(StoreError::NotFound(_)) => RunRecord {
                run_id: run.run_id.clone(),
                status: "missing".into(),
                error: Some("the run is no longer in the store".into()),
                ..RunRecord::default()
            },
            Err(e) => return Err(e.into()),
        };
        let mut extra = Vec::new();
        if let Some(case) = dataset.cases.iter().find(|c| c.id == run.case_id) {
            for evaluator in dataset.evaluators_of(case).filter(|e| matches!(e.check, super::Check::LlmJudge { .. })) {
                let (verdict, spent) = super::judge::judge(judge, store, evaluator, case, &record).await?;
                extra.push(verdict);
                cost.calls += spent.calls;
                cost.tokens += spent.tokens;
            }
        }
        graded.push(Graded { case_id: run.case_id, repeat: run.repeat, record, started_from: run.started_from, extra });
    }
    let mut report = build(experiment_id, dataset, graded);
    (report.judge_calls, report.judge_tokens) = (cost.calls, cost.tokens);
    let json = serde_json::to_string(&report).map_err(|e| StoreError::Database(format!("experiment {experiment_id}: the report: {e}")))?;
    store.set_report(experiment_id, &json).await?;
    Ok(report)
}

/// What grading reads of a stored run: its end and slots from its result, its duration from its
/// last event, its tokens and model calls from its `run.llm.completed` events.
pub async fn record_of(store: &dyn RunStore, run_id: &str) -> Result<RunRecord, StoreError> {
    let run = store.get_run(run_id).await?.ok_or_else(|| StoreError::NotFound(run_id.to_owned()))?;
    let mut record = RunRecord { run_id: run_id.to_owned(), status: run.status.as_str().to_owned(), ..RunRecord::default() };
    if let Some(result) = &run.result {
        record.output = result.output().map(str::to_owned);
        record.stages = result.slots.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        record.error = result.error().map(|e| format!("{}: {}", e.reason_class, e.message));
    }
    for event in store.events_after(run_id, 0).await? {
        let body = || serde_json::from_str::<serde_json::Value>(&event.body).unwrap_or_default();
        match event.kind.as_str() {
            "run.llm.completed" => {
                let body = body();
                let count = |k: &str| body.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
                record.tokens += count("input_tokens") + count("output_tokens");
                record.llm_calls += 1;
            }
            "run.completed" | "run.failed" | "run.awaiting_input" | "run.cancelled" => {
                record.duration_ms = body().get("duration_ms").and_then(serde_json::Value::as_f64);
            }
            _ => {}
        }
    }
    Ok(record)
}
