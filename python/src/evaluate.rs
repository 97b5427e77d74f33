//! `Runtime.evaluate`: a dataset run as an experiment in the runtime's store (issue 51), the
//! report returned as Python objects. The dataset is a path (ours, pydantic_evals' YAML,
//! LangSmith's JSON) or the same as a dict or list; `evaluators` (a list of ours, as dicts) are
//! added to the dataset's and kept with it, so the experiment regrades with them.

use std::path::PathBuf;
use std::sync::Arc;

use fabric::eval::{self, Dataset};
use pyo3::prelude::*;

use crate::{FabricError, StartError, error, from_json, to_json};

/// What `Runtime.evaluate` runs on.
pub(crate) struct Evaluate {
    pub durable: Option<Arc<fabric::runtime::Durable>>,
    pub tokio: Option<Arc<tokio::runtime::Runtime>>,
}

/// A dataset problem, every located line of it, as `StartError` (`invalid_dataset`): nothing ran.
fn refused(py: Python<'_>, e: impl std::fmt::Display) -> PyErr {
    error::<StartError>(py, "invalid_dataset", e.to_string())
}

impl Evaluate {
    pub(crate) fn run<'py>(
        &self,
        py: Python<'py>,
        dataset: &Bound<'py, PyAny>,
        added: Option<&Bound<'py, PyAny>>,
        options: eval::RunOptions,
    ) -> PyResult<Bound<'py, PyAny>> {
        let Some(durable) = self.durable.clone() else {
            return Err(error::<StartError>(py, "no_store", "evaluate needs a run store: Runtime(..., store=\"sqlite://evals.db\")".into()));
        };
        let tokio = self.tokio.clone().ok_or_else(|| error::<FabricError>(py, "runtime", "this runtime is shut down".into()))?;
        let (path, text) = match dataset.extract::<PathBuf>() {
            Ok(path) => {
                (path.clone(), fabric::textfile::read_bounded(&path, eval::MAX_DATASET_BYTES).map_err(|e| refused(py, format!("{}: {e}", path.display())))?)
            }
            Err(_) => (PathBuf::from("dataset.json"), to_json::<StartError>(py, dataset, "invalid_dataset")?.to_string()),
        };
        let mut dataset = Dataset::parse(&path, &text).map_err(|e| refused(py, e))?;
        let text = match added {
            None => text,
            Some(list) => {
                let list = to_json::<StartError>(py, list, "invalid_dataset")?.to_string();
                dataset.evaluators.extend(Dataset::parse_evaluators(&PathBuf::from("evaluators="), &list).map_err(|e| refused(py, e))?);
                // Kept with the experiment as one dataset of ours: it regrades with them.
                eval::to_fabric_yaml(&dataset)
            }
        };
        let report = py.detach(move || {
            tokio.block_on(async move {
                let (handle, _) = fabric::cancel::CancelHandle::new();
                eval::run(&durable, &dataset, &text, &options, &handle).await
            })
        });
        let report = report.map_err(|e| match e {
            eval::EvalError::Refused(_) | eval::EvalError::Dataset(_) => refused(py, e),
            other => error::<FabricError>(py, "store_error", other.to_string()),
        })?;
        from_json(py, &serde_json::to_string(&report).unwrap_or_default())
    }
}
