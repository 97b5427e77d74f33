//! The schedules resource (issue 50): `POST /v1/schedules`, `GET /v1/schedules`, `GET`, `PATCH`
//! and `DELETE /v1/schedules/{id}`, `POST /v1/schedules/{id}/trigger` and `GET
//! /v1/schedules/{id}/fires`. Each parses the request and asks the [`Durable`] facade; the
//! replica's `schedules` loop ([`super::scheduler`]) fires them.

use serde_json::Map;

use super::*;
use crate::runtime::{ScheduleDef, ScheduleError, ScheduleView};
use crate::schedule::{Clock, SystemClock};
use crate::store::schedules::FireRecord;

/// A new schedule: its definition, and whether it starts paused.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ScheduleBody {
    #[serde(flatten)]
    pub def: ScheduleDef,
    /// Stored paused: it fires once resumed (`PATCH {"paused": false}`).
    #[serde(default)]
    pub paused: bool,
}

/// Every schedule.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
}

/// A schedule's fire records, newest first.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct FireList {
    pub fires: Vec<FireRecord>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub struct FiresParams {
    /// At most this many (default 50, at most 1000).
    pub limit: Option<usize>,
}

/// A schedule's refusal, as the API answers it: a bad definition (a cron expression with the
/// column at fault, an unknown time zone, an unknown route, a goal its schema refuses) is 422.
fn schedule_error(e: ScheduleError) -> ApiError {
    match e {
        ScheduleError::Start(AcceptError::Start(StartError::UnknownRoute { route, known, .. })) => {
            ApiError::new(ErrorCode::InvalidContent, format!("`route_id`: unknown route `{}`; known routes: {known}", echo_id(&route)))
        }
        ScheduleError::Start(e) => accept_error(e),
        ScheduleError::NotFound(id) => ApiError::new(ErrorCode::NotFound, format!("no schedule `{}`", echo_id(&id))),
        ScheduleError::Store(e) => store_error(e),
        ScheduleError::NoSchedules => store_error("this run store keeps no schedules"),
        e @ (ScheduleError::Timing(_) | ScheduleError::Definition(_)) => ApiError::new(ErrorCode::InvalidContent, e.to_string()),
    }
}

/// A view as answered: the webhook URL without its credentials or query.
fn shown(mut v: ScheduleView) -> ScheduleView {
    v.def.webhook_url = v.def.webhook_url.as_deref().map(crate::redact::origin_and_path);
    v
}

/// Creates a schedule: checked like a start of its route (goal, profile, webhook URL) and its
/// timing parsed; it fires from now on.
#[utoipa::path(post, path = "/v1/schedules", request_body = ScheduleBody,
    responses(
        (status = 201, description = "Stored; `Location` names it", body = ScheduleView),
        (status = 422, description = "A cron expression that does not parse (the field and its column named), of 7 fields, or that never fires (such as `0 0 31 2 *`); an unknown time zone, overlap or catch-up policy; an unknown route; a goal its route's `goal_schema` refuses (`problems`); an unknown profile; a webhook URL not allowed", body = ErrorBody),
        (status = 401, description = "No valid bearer token", body = ErrorBody),
        (status = 503, description = "The run store cannot take writes now", body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn create_schedule(State(state): State<AppState>, body: Result<JsonBody<Map<String, Value>>, ApiError>) -> Result<Response, ApiError> {
    let JsonBody(mut body) = body?;
    // `paused` apart, so that the definition's own fields are checked strictly (a misspelt one is 422).
    let paused = match body.remove("paused") {
        None | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(ApiError::new(ErrorCode::InvalidContent, "`paused` is true or false")),
    };
    let def: ScheduleDef = serde_json::from_value(Value::Object(body)).map_err(|e| ApiError::new(ErrorCode::InvalidContent, format!("the schedule: {e}")))?;
    let view = state.inner.durable.create_schedule(None, &def, paused, "api", SystemClock.now()).await.map_err(schedule_error)?;
    let mut response = (StatusCode::CREATED, Json(shown(view.clone()))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/schedules/{}", view.id)) {
        response.headers_mut().insert(header::LOCATION, v);
    }
    Ok(response)
}

/// Every schedule, by id, with its next fire times.
#[utoipa::path(get, path = "/v1/schedules", responses((status = 200, body = ScheduleList), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn list_schedules(State(state): State<AppState>) -> Result<Json<ScheduleList>, ApiError> {
    let schedules = state.inner.durable.schedules(10_000).await.map_err(schedule_error)?;
    Ok(Json(ScheduleList { schedules: schedules.into_iter().map(shown).collect() }))
}

/// One schedule.
#[utoipa::path(get, path = "/v1/schedules/{id}", params(("id" = String, Path)),
    responses((status = 200, body = ScheduleView), (status = 404, body = ErrorBody), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn get_schedule(State(state): State<AppState>, PathText(id): PathText) -> Result<Json<ScheduleView>, ApiError> {
    Ok(Json(shown(state.inner.durable.schedule(&id).await.map_err(schedule_error)?)))
}

/// Changes a schedule: a JSON object of the fields to replace (`null` removes an optional one),
/// and `paused` (`true` pauses, `false` resumes). A new `cron` or `timezone`, or a resume,
/// fires from now on: the fires of a pause are not caught up.
#[utoipa::path(patch, path = "/v1/schedules/{id}", params(("id" = String, Path)), request_body(content = Object),
    responses((status = 200, body = ScheduleView), (status = 404, body = ErrorBody), (status = 422, description = "As for a new schedule", body = ErrorBody),
        (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn patch_schedule(
    State(state): State<AppState>,
    PathText(id): PathText,
    body: Result<JsonBody<Map<String, Value>>, ApiError>,
) -> Result<Json<ScheduleView>, ApiError> {
    let JsonBody(patch) = body?;
    Ok(Json(shown(state.inner.durable.patch_schedule(&id, &patch, SystemClock.now()).await.map_err(schedule_error)?)))
}

/// Deletes a schedule and its fire records; its runs stay.
#[utoipa::path(delete, path = "/v1/schedules/{id}", params(("id" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 404, body = ErrorBody), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn delete_schedule(State(state): State<AppState>, PathText(id): PathText) -> Result<StatusCode, ApiError> {
    state.inner.durable.delete_schedule(&id).await.map_err(schedule_error)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Fires a schedule now (even paused): a fire of its own (`manual`), `starting`, whose run a
/// replica starts within a second through the same path as the expression's fires.
#[utoipa::path(post, path = "/v1/schedules/{id}/trigger", params(("id" = String, Path)),
    responses((status = 202, description = "The fire, `starting`; `GET /v1/schedules/{id}/fires` shows its run", body = FireRecord), (status = 404, body = ErrorBody),
        (status = 422, description = "Its definition no longer starts (its route left the catalogue)", body = ErrorBody), (status = 401, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn trigger_schedule(State(state): State<AppState>, PathText(id): PathText) -> Result<(StatusCode, Json<FireRecord>), ApiError> {
    let fire = state.inner.durable.trigger_schedule(&id, SystemClock.now()).await.map_err(schedule_error)?;
    Ok((StatusCode::ACCEPTED, Json(fire)))
}

/// A schedule's fire records, newest first: each fire time's outcome (`starting`, `started` with
/// its run, `skipped`, `buffered`, `missed` or `failed`, with why) and lag.
#[utoipa::path(get, path = "/v1/schedules/{id}/fires", params(("id" = String, Path), FiresParams),
    responses((status = 200, body = FireList), (status = 404, body = ErrorBody), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn schedule_fires(
    State(state): State<AppState>,
    PathText(id): PathText,
    params: Result<Query<FiresParams>, QueryRejection>,
) -> Result<Json<FireList>, ApiError> {
    let limit = query(params)?.limit.unwrap_or(50).clamp(1, 1000);
    Ok(Json(FireList { fires: state.inner.durable.schedule_fires(&id, limit).await.map_err(schedule_error)? }))
}
