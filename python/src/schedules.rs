//! Scheduled runs from Python (issue 50): `Runtime(store=...).create_schedule(...)`,
//! `.schedules()` and `.schedule_fires(id)`, through the same facade as `/v1/schedules` and
//! `fabric schedules` (a definition checked against this runtime's catalogue). A `fabric serve`
//! on the same store fires them.

use std::sync::Arc;

use fabric::runtime::{Durable, ScheduleDef, ScheduleError};
use pyo3::prelude::*;
use serde_json::{Map, Value};

use crate::{StartError, error};

/// The reason class of a refused schedule.
fn refused(py: Python<'_>, e: ScheduleError) -> PyErr {
    let class = match &e {
        ScheduleError::Start(fabric::runtime::AcceptError::Start(s)) => s.code(),
        ScheduleError::Store(_) | ScheduleError::NoSchedules => "store_error",
        ScheduleError::NotFound(_) => "not_found",
        _ => "invalid_schedule",
    };
    error::<StartError>(py, class, e.to_string())
}

/// The store's runtime, or why there is none.
pub(crate) fn durable(py: Python<'_>, durable: Option<&Arc<Durable>>) -> PyResult<Arc<Durable>> {
    durable.cloned().ok_or_else(|| error::<StartError>(py, "no_store", "schedules live in a run store: Runtime(..., store=\"sqlite://runs.db\")".into()))
}

/// Stores a schedule of `definition` (the fields of `POST /v1/schedules`); its view as JSON.
pub(crate) fn create(py: Python<'_>, tokio: &tokio::runtime::Runtime, durable: Arc<Durable>, definition: Map<String, Value>, paused: bool) -> PyResult<String> {
    let def: ScheduleDef =
        serde_json::from_value(Value::Object(definition)).map_err(|e| error::<StartError>(py, "invalid_schedule", format!("the schedule: {e}")))?;
    let now = fabric::schedule::Clock::now(&fabric::schedule::SystemClock);
    let made = py.detach(|| tokio.block_on(durable.create_schedule(None, &def, paused, "api", now)));
    made.map(|v| serde_json::to_string(&v).unwrap_or_default()).map_err(|e| refused(py, e))
}

/// Every schedule of the store, as a JSON array.
pub(crate) fn list(py: Python<'_>, tokio: &tokio::runtime::Runtime, durable: Arc<Durable>) -> PyResult<String> {
    let listed = py.detach(|| tokio.block_on(durable.schedules(10_000)));
    listed.map(|v| serde_json::to_string(&v).unwrap_or_default()).map_err(|e| refused(py, e))
}

/// A schedule's fire records, newest first, as a JSON array.
pub(crate) fn fires(py: Python<'_>, tokio: &tokio::runtime::Runtime, durable: Arc<Durable>, id: &str, limit: usize) -> PyResult<String> {
    let fires = py.detach(|| tokio.block_on(durable.schedule_fires(id, limit.clamp(1, 10_000))));
    fires.map(|v| serde_json::to_string(&v).unwrap_or_default()).map_err(|e| refused(py, e))
}
