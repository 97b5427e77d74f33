//! Experiments of `fabric eval` (issue 51) as the service shows them: `GET /v1/experiments` (the
//! newest) and `GET /v1/experiments/{experiment_id}` (its last report), what the run inspector
//! lists and shows (`/ui/#/experiments`). Read from the store the runs are in.

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::{Deserialize, Serialize};

use super::error::ErrorCode;
use super::{ApiError, AppState, ErrorBody, store_error};
use crate::eval::{EvalError, Report};

/// One experiment as `GET /v1/experiments` lists it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExperimentView {
    pub experiment_id: String,
    pub name: String,
    /// The dataset's file, as it was named.
    pub dataset: String,
    pub created_at: String,
}

/// The newest experiments.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExperimentList {
    pub experiments: Vec<ExperimentView>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(super) struct ListQuery {
    /// At most this many (1 to 200, default 50).
    limit: Option<u32>,
}

/// The newest experiments of the store, newest first.
#[utoipa::path(get, path = "/v1/experiments", params(ListQuery),
    responses((status = 200, body = ExperimentList), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn list_experiments(State(state): State<AppState>, Query(q): Query<ListQuery>) -> Result<Json<ExperimentList>, ApiError> {
    let store = state.inner.durable.store();
    let Some(experiments) = store.experiments() else { return Ok(Json(ExperimentList { experiments: Vec::new() })) };
    let rows = experiments.list_experiments(q.limit.unwrap_or(50).clamp(1, 200)).await.map_err(store_error)?;
    let experiments =
        rows.into_iter().map(|e| ExperimentView { experiment_id: e.experiment_id, name: e.name, dataset: e.dataset, created_at: e.created_at }).collect();
    Ok(Json(ExperimentList { experiments }))
}

/// An experiment's last report: pass rates, every case's runs and verdicts (docs/evals.md).
#[utoipa::path(get, path = "/v1/experiments/{experiment_id}", params(("experiment_id" = String, Path, description = "An experiment's id")),
    responses((status = 200, body = Report), (status = 404, body = ErrorBody), (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn get_experiment(State(state): State<AppState>, Path(experiment_id): Path<String>) -> Result<Json<Report>, ApiError> {
    let missing = || ApiError::new(ErrorCode::NotFound, format!("no experiment `{}`", experiment_id.chars().take(64).collect::<String>()));
    if experiment_id.len() > 64 {
        return Err(missing());
    }
    match crate::eval::last_report(state.inner.durable.store().as_ref(), &experiment_id).await {
        Ok(report) => Ok(Json(report)),
        Err(EvalError::NotFound(_) | EvalError::NoExperiments) => Err(missing()),
        Err(EvalError::Store(e)) => Err(store_error(e)),
        Err(e) => Err(store_error(e.to_string().as_str())),
    }
}
