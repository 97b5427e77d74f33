//! Partial re-runs (`fabric eval run DATASET --from EXPERIMENT`): each case is run again on the
//! catalogue loaded now only from the first stage whose prompt or definition changed since its
//! run in the base experiment (`diff` between the catalogue version that run recorded and the one
//! loaded); the stages before it are taken from that run's journal, so they cost no inference.

use std::collections::HashMap;
use std::sync::Arc;

use super::dataset::{Case, Dataset};
use super::experiment::{EvalError, Job, RunOptions, experiments, grade_runs, new_experiment, run_jobs};
use super::report::Report;
use crate::cancel::CancelHandle;
use crate::catalogue::{Catalogue, Texts};
use crate::diff::RouteChange;
use crate::exec::JournalEntry;
use crate::runtime::Durable;
use crate::store::{RunStore, StoreError};

/// Runs `dataset` as a new experiment whose cases start from experiment `base`'s runs of them
/// (a case `base` has no run of is run whole); each run's report says the stage it went live
/// at. Checked first, as [`super::run`].
pub async fn rerun(durable: &Durable, base: &str, dataset: &Dataset, text: &str, options: &RunOptions, handle: &CancelHandle) -> Result<Report, EvalError> {
    let problems = super::check::check(dataset, durable.runtime());
    if !problems.is_empty() {
        return Err(EvalError::Refused(problems));
    }
    let store = experiments(durable.store().as_ref())?;
    if store.experiment(base).await?.is_none() {
        return Err(EvalError::NotFound(base.to_owned()));
    }
    let base_runs = store.case_runs(base).await?;
    // Each case's seed, decided before any run (the old catalogues rebuilt once each).
    let now = durable.runtime().catalogue();
    let mut old: HashMap<String, Arc<Catalogue>> = HashMap::new();
    let mut jobs = Vec::new();
    for case in &dataset.cases {
        for repeat in 0..options.repeat.max(1) {
            let from = base_runs.iter().find(|r| r.case_id == case.id && r.repeat == repeat).or_else(|| base_runs.iter().find(|r| r.case_id == case.id));
            let seed = match from {
                Some(r) => seed(durable.store().as_ref(), &r.run_id, case, &now, &mut old).await?,
                None => Vec::new(),
            };
            jobs.push(Job { case, repeat, seed: Some(seed) });
        }
    }
    let experiment_id = new_experiment(store, dataset, text).await?;
    let runs = run_jobs(durable, store, &experiment_id, jobs, options, handle).await?;
    grade_runs(durable.store().as_ref(), store, &experiment_id, dataset, runs, Some(durable.runtime())).await
}

/// The journal entries of `run_id` a new run of `case` on `now` can start with: those of the
/// stages before the first one that changed between the catalogue the run recorded and `now`.
/// None when the run was of another route or goal, or its version cannot be had.
async fn seed(
    store: &dyn RunStore,
    run_id: &str,
    case: &Case,
    now: &Catalogue,
    old: &mut HashMap<String, Arc<Catalogue>>,
) -> Result<Vec<JournalEntry>, StoreError> {
    let Some(run) = store.get_run(run_id).await? else { return Ok(Vec::new()) };
    if run.request.route_id != case.route_id || run.request.goal != case.goal {
        return Ok(Vec::new());
    }
    let Some(version) = run.catalogue_version else { return Ok(Vec::new()) };
    let then = match old.get(version.as_str()) {
        Some(c) => c.clone(),
        None => {
            let Some(sources) = store.catalogue(&version).await? else { return Ok(Vec::new()) };
            let rebuilt = Arc::new(Catalogue::rebuild(&Texts { routes: sources.routes, packs: sources.packs }));
            old.insert(version.as_str().to_owned(), rebuilt.clone());
            rebuilt
        }
    };
    let changed: Option<Vec<String>> = match crate::diff::diff(&then, now).routes.into_iter().find(|r| r.route == case.route_id).map(|r| r.change) {
        None => Some(Vec::new()),
        Some(RouteChange::Changed { settings, stages }) if settings.is_empty() => Some(stages.into_iter().map(|s| s.stage).collect()),
        // Its settings, or the route as a whole: nothing of the old run holds.
        Some(_) => None,
    };
    let Some(changed) = changed else { return Ok(Vec::new()) };
    let journal = store.journal(run_id).await?;
    let cut = journal.iter().position(|e| stage_of(e).is_none_or(|s| changed.iter().any(|c| c == s))).unwrap_or(journal.len());
    Ok(journal[..cut].to_vec())
}

/// The stage a journal entry is of (none for a note or a user's reply).
pub(super) fn stage_of(entry: &JournalEntry) -> Option<&str> {
    match entry {
        JournalEntry::ModelReply { stage_id, .. } | JournalEntry::StageCompleted { stage_id, .. } => Some(stage_id),
        JournalEntry::ToolAsked(ask) => Some(&ask.stage_id),
        JournalEntry::Note { .. } | JournalEntry::UserReply { .. } => None,
    }
}
