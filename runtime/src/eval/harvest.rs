//! A dataset harvested from recorded runs (`fabric eval dataset from-runs`): each run's route and
//! goal become a case, and, when asked, its output the case's expected output (what the route
//! answered then is what it should answer now).

use std::path::PathBuf;

use super::dataset::{Case, CaseAt, Dataset, Expected};
use super::evaluator::{Check, Evaluator, JsonPath};
use super::grade::as_json;
use crate::store::{RunFilter, RunStore, StoreError, StoredStatus};

/// The newest `limit` runs of `route_id` (of `status`, when given) as a dataset named `name`;
/// with `expect_output`, each completed run's output is its case's expected output, compared
/// whole (`equals`).
pub async fn from_runs(
    store: &dyn RunStore,
    route_id: &str,
    status: Option<StoredStatus>,
    limit: u32,
    expect_output: bool,
    name: &str,
) -> Result<Dataset, StoreError> {
    let filter = RunFilter { route_id: Some(route_id.to_owned()), status, before: None, limit };
    let runs = store.list_runs(&filter).await?;
    let cases = runs
        .into_iter()
        .map(|run| {
            let output = run.result.as_ref().and_then(|r| r.output()).filter(|_| expect_output && run.status == StoredStatus::Completed).map(as_json);
            Case {
                id: format!("run-{}", run.run_id),
                route_id: run.route_id,
                goal: run.request.goal,
                model_profile: run.request.model_profile,
                expected: Expected { output, stages: Vec::new() },
                metadata: Some(serde_json::json!({"run_id": run.run_id, "created_at": run.created_at})),
                evaluators: Vec::new(),
                at: CaseAt::default(),
            }
        })
        .collect();
    // Expected outputs are compared whole.
    let evaluators = if expect_output {
        vec![Evaluator { name: "equals".into(), check: Check::Equals { path: JsonPath::default(), value: None }, at: crate::diag::Pos::FILE }]
    } else {
        Vec::new()
    };
    Ok(Dataset { name: name.to_owned(), path: PathBuf::from(format!("{name}.yaml")), evaluators, route_evaluators: Vec::new(), cases })
}
