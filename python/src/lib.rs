//! `fabric_runtime._native`: the runtime facade ([`fabric::runtime::Runtime`]) for Python. A thin
//! shell like `fabric` and `fabric serve`: it turns Python values into the facade's inputs and
//! its outputs into Python values, and decides nothing itself.
//!
//! Values cross as JSON (Python's own `json` module on this side), so a result is exactly the
//! object `fabric run` prints. A run executes with the GIL released: the calling thread drives it
//! (`block_on`), its tasks run on the runtime's tokio threads, and Python tools are called back
//! with the GIL held, each on a blocking thread.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use fabric::cancel::CancelHandle;
use fabric::catalogue::{DirKind, Layers};
use fabric::config::Settings;
use fabric::events::{EventSink, MemorySink};
use fabric::exec::RunRequest;
use fabric::failure::BoxFuture;
use fabric::runtime::{Runtime as Core, Validation};
use fabric::tools::{Tool, ToolFailure};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::types::{IntoPyDict, PyDict, PyList, PyString, PyTuple};
use serde_json::{Map, Value};

mod evaluate;
mod schedules;
mod stream;

pyo3::create_exception!(_native, FabricError, PyException, "Every error of the runtime; `reason_class` says which.");
pyo3::create_exception!(_native, ConfigError, FabricError, "The runtime could not be built (`reason_class` `config`).");
pyo3::create_exception!(_native, StartError, FabricError, "A run could not start; nothing ran.");
pyo3::create_exception!(_native, ValidationError, FabricError, "A reply a stage would refuse (`invalid_json`, `schema_validation`).");

/// An exception of class `E` with its `reason_class`.
pub(crate) fn error<E: pyo3::PyTypeInfo>(py: Python<'_>, reason_class: &str, message: String) -> PyErr {
    let err = PyErr::new::<E, _>(message);
    let _ = err.value(py).setattr("reason_class", reason_class);
    err
}

/// A Python value as JSON, through Python's `json` (what a caller passes is what a stage gets).
/// A value that is not JSON (a set, NaN, a circular reference, a number past 64 bits) is
/// `error` with `reason_class`, its cause chained.
pub(crate) fn to_json<E: pyo3::PyTypeInfo>(py: Python<'_>, value: &Bound<'_, PyAny>, reason_class: &str) -> PyResult<Value> {
    let dumped = py.import("json")?.call_method("dumps", (value,), Some(&[("allow_nan", false)].into_py_dict(py)?));
    let not_json = |why: String, cause: Option<PyErr>| {
        let e = error::<E>(py, reason_class, format!("not JSON: {why}"));
        e.set_cause(py, cause);
        e
    };
    let text: String = match dumped {
        Ok(t) => t.extract()?,
        Err(cause) => return Err(not_json(cause.value(py).to_string(), Some(cause))),
    };
    let value: Value = serde_json::from_str(&text).map_err(|e| not_json(e.to_string(), None))?;
    if has_wide_integer(&value) {
        return Err(not_json("an integer does not fit in 64 bits".into(), None));
    }
    Ok(value)
}

/// Whether an integer was read as a float because it does not fit in 64 bits (it would come
/// back rounded: refused rather than changed).
fn has_wide_integer(v: &Value) -> bool {
    match v {
        Value::Number(n) => n.is_f64() && n.as_f64().is_some_and(|f| f.fract() == 0.0 && f.abs() >= 9.223_372_036_854_776e18),
        Value::Array(items) => items.iter().any(has_wide_integer),
        Value::Object(map) => map.values().any(has_wide_integer),
        _ => false,
    }
}

/// JSON as a Python value.
pub(crate) fn from_json<'py>(py: Python<'py>, text: &str) -> PyResult<Bound<'py, PyAny>> {
    py.import("json")?.call_method1("loads", (text,))
}

/// A Python callable as an in-process tool: called with the arguments as keywords; returns a
/// JSON value (a coroutine function's result is awaited on an event loop of its own).
struct PyTool(Arc<Py<PyAny>>);

impl Tool for PyTool {
    fn call<'a>(&'a self, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<Value, ToolFailure>> {
        let (function, args) = (self.0.clone(), Value::Object(args.clone()).to_string());
        Box::pin(async move {
            let called = tokio::task::spawn_blocking(move || {
                Python::attach(|py| -> PyResult<Value> {
                    let kwargs = from_json(py, &args)?;
                    let kwargs = kwargs.cast::<PyDict>()?;
                    let mut out = function.bind(py).call((), Some(kwargs))?;
                    if py.import("inspect")?.call_method1("isawaitable", (&out,))?.is_truthy()? {
                        out = py.import("asyncio")?.call_method1("run", (out,))?;
                    }
                    to_json::<FabricError>(py, &out, "tool_failed")
                })
                .map_err(|e| {
                    // "ValueError: no adding today": what the model is told went wrong.
                    Python::attach(|py| {
                        let name = e.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "Exception".into());
                        let text = e.value(py).str().map(|t| t.to_string()).unwrap_or_default();
                        if text.is_empty() { name } else { format!("{name}: {text}") }
                    })
                })
            })
            .await;
            Ok(called.map_err(|e| format!("the tool's thread failed: {e}"))??)
        })
    }
}

/// The settings of `**settings`: `llm_stub=True` is `FABRIC_LLM_STUB=1`; a name in capitals is
/// taken as it is (`OLLAMA_MODEL`); then the process environment, as `fabric` reads it.
fn settings_from(py: Python<'_>, given: Option<&Bound<'_, PyDict>>) -> PyResult<Settings> {
    let mut vars: HashMap<String, String> = HashMap::new();
    if let Some(given) = given {
        for (k, v) in given.iter() {
            let key: String = k.extract()?;
            let name = if key.chars().any(|c| c.is_ascii_uppercase()) { key.clone() } else { format!("FABRIC_{}", key.to_ascii_uppercase()) };
            // A misspelt setting must not be ignored in silence (the runtime would go on with
            // the default it was meant to change).
            if !fabric::config::VARIABLES.contains(&name.as_str()) {
                return Err(error::<ConfigError>(py, "config", format!("`{key}` is not a setting (it would be {name}); see docs/configuration.md")));
            }
            let value = if let Ok(b) = v.extract::<bool>() { if b { "1".into() } else { "0".into() } } else { v.str()?.to_string() };
            vars.insert(name, value);
        }
    }
    Settings::load(move |k| vars.get(k).cloned().or_else(|| std::env::var(k).ok())).map_err(|e| error::<ConfigError>(py, "config", e.to_string()))
}

/// `catalogue=` / `prompt_packs=`: a `str` is `a:b`, as `--catalogue` reads it; a path-like
/// object is one directory (a `pathlib.Path` is a path, never a list); a list or tuple holds one
/// directory per item, in layer order.
fn layers(py: Python<'_>, value: Option<&Bound<'_, PyAny>>, default: &str, arg: &str) -> PyResult<Layers> {
    let Some(value) = value else { return Ok(Layers::one(default)) };
    let bad = |why: String| error::<ConfigError>(py, "config", format!("`{arg}`: {why}"));
    if value.is_instance_of::<PyString>() {
        return Layers::parse(&value.extract::<String>()?).map_err(|e| bad(e.to_string()));
    }
    if value.is_instance_of::<PyList>() || value.is_instance_of::<PyTuple>() {
        let dirs: Vec<PathBuf> = value.extract().map_err(|_| bad("each item must be a path (a str or an os.PathLike)".into()))?;
        return Layers::new(dirs).map_err(|e| bad(e.to_string()));
    }
    let dir: PathBuf = value.extract().map_err(|_| bad("expected a path, an `a:b` str or a list of paths".into()))?;
    Ok(Layers::one(dir))
}

/// Why the runtime could not be built; a missing directory names the argument that gave it.
fn build_error(py: Python<'_>, e: fabric::runtime::BuildError) -> PyErr {
    let message = match e {
        fabric::runtime::BuildError::MissingDirs(missing) => missing
            .iter()
            .map(|m| format!("{m} (the `{}` argument of Runtime)", if m.kind == DirKind::Catalogue { "catalogue" } else { "prompt_packs" }))
            .collect::<Vec<_>>()
            .join("; "),
        e => e.to_string(),
    };
    error::<ConfigError>(py, "config", message)
}

/// The embeddable runtime: a catalogue, its prompt packs, the settings.
#[pyclass(subclass, module = "fabric_runtime._native")]
struct Runtime {
    core: Arc<Core>,
    /// The same runtime with its run store, when `store=` named one.
    durable: Option<Arc<fabric::runtime::Durable>>,
    /// Taken at drop: see `Drop`.
    tokio: Option<Arc<tokio::runtime::Runtime>>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        shut_down(self.tokio.take());
    }
}

/// Stops the runtime's threads when this was the last holder of them (a `Runtime`, or a stream
/// of one of its runs). Without waiting: a Python tool still running (its run was interrupted)
/// needs the GIL, which the dropping thread holds; waiting for it would never end.
fn shut_down(tokio: Option<Arc<tokio::runtime::Runtime>>) {
    if let Some(tokio) = tokio.and_then(|t| Arc::try_unwrap(t).ok()) {
        tokio.shutdown_background();
    }
}

impl Runtime {
    /// `run(..., idempotency_key=key)`: recorded in the store, once per key
    /// ([`fabric::runtime::Durable::run_recorded_once`]); a repeat gets the key's run, `idempotent_replayed: True`.
    fn run_once<'py>(
        &self,
        py: Python<'py>,
        route_id: String,
        goal: Map<String, Value>,
        prefetch: Option<Vec<String>>,
        cancel: Option<PyRef<'py, CancelToken>>,
        key: &str,
    ) -> PyResult<Bound<'py, PyAny>> {
        let key = fabric::store::IdempotencyKey::parse(key).map_err(|e| error::<StartError>(py, "invalid_idempotency_key", format!("idempotency_key {e}")))?;
        let Some(durable) = self.durable.clone() else {
            return Err(error::<StartError>(py, "no_store", "idempotency_key needs a run store: Runtime(..., store=\"sqlite://runs.db\")".into()));
        };
        let tokio = self.tokio.clone().ok_or_else(|| error::<FabricError>(py, "runtime", "this runtime is shut down".into()))?;
        let sink = Arc::new(MemorySink::default());
        let events: Arc<dyn EventSink> = sink.clone();
        let req = fabric::runtime::StartRequest { route_id, goal, prefetch: prefetch.unwrap_or_default(), ..Default::default() };
        let (handle, token) = cancel_of(cancel);
        let done = py.detach(move || {
            tokio.block_on(async move {
                let store = durable.store();
                let done = durable.run_recorded_once(&req, &key, events, &handle, token).await;
                match done {
                    Ok(fabric::runtime::RecordedOnce::Replayed(run)) => {
                        let stored = store.events_after(&run.run_id, 0).await.unwrap_or_default();
                        Ok((None, Some((run, stored))))
                    }
                    Ok(fabric::runtime::RecordedOnce::Ran(outcome)) => Ok((Some(outcome), None)),
                    Err(e) => Err(e),
                }
            })
        });
        let accept_error = |e: fabric::runtime::AcceptError| {
            let class = match &e {
                fabric::runtime::AcceptError::Start(s) => s.code(),
                fabric::runtime::AcceptError::KeyReused { .. } => "idempotency_key_reused",
                fabric::runtime::AcceptError::Store(_) => "store_error",
                _ => "cannot_start",
            };
            error::<StartError>(py, class, e.to_string())
        };
        let mut result = match done.map_err(accept_error)? {
            (Some(outcome), _) => {
                let mut r = serde_json::to_value(&outcome.result).unwrap_or(Value::Null);
                if let Value::Object(map) = &mut r {
                    map.insert("events".into(), Value::Array(event_lines(&sink)));
                }
                r
            }
            (None, Some((run, stored))) => {
                let mut r = match &run.result {
                    Some(result) => serde_json::to_value(result).unwrap_or(Value::Null),
                    None => serde_json::json!({"run_id": run.run_id, "status": run.status.as_str()}),
                };
                if let Value::Object(map) = &mut r {
                    let events = stored.iter().map(|e| serde_json::from_str(&e.body).unwrap_or(Value::Null)).collect();
                    map.insert("events".into(), Value::Array(events));
                    map.insert("idempotent_replayed".into(), Value::Bool(true));
                }
                r
            }
            (None, None) => Value::Null,
        };
        if let Value::Object(map) = &mut result {
            map.entry("idempotent_replayed").or_insert(Value::Bool(false));
        }
        from_json(py, &result.to_string())
    }
}

/// The goal of a run: a dict, as a JSON object.
fn goal_of(py: Python<'_>, goal: &Bound<'_, PyAny>) -> PyResult<Map<String, Value>> {
    match to_json::<StartError>(py, goal, "invalid_goal")? {
        Value::Object(goal) => Ok(goal),
        _ => Err(error::<StartError>(py, "invalid_goal", "`goal` must be a dict".into())),
    }
}

/// What cancels a run: the caller's token, else one of its own.
fn cancel_of(cancel: Option<PyRef<'_, CancelToken>>) -> (CancelHandle, fabric::cancel::Cancel) {
    match cancel {
        Some(token) => (token.handle.clone(), token.handle.token()),
        None => CancelHandle::new(),
    }
}

/// The events a memory sink kept, as JSON lines read back.
fn event_lines(sink: &MemorySink) -> Vec<Value> {
    sink.events()
        .iter()
        .map(|e| {
            let mut line = Vec::with_capacity(256);
            e.write_json_line(&mut line);
            serde_json::from_slice(&line).unwrap_or(Value::Null)
        })
        .collect()
}

#[pymethods]
impl Runtime {
    #[new]
    #[pyo3(signature = (catalogue = None, prompt_packs = None, *, stub_dir = None, tools = None, store = None, **settings))]
    fn new(
        py: Python<'_>,
        catalogue: Option<&Bound<'_, PyAny>>,
        prompt_packs: Option<&Bound<'_, PyAny>>,
        stub_dir: Option<PathBuf>,
        tools: Option<&Bound<'_, PyDict>>,
        store: Option<String>,
        settings: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        let settings = settings_from(py, settings)?;
        let catalogue = layers(py, catalogue, "routes", "catalogue")?;
        let prompt_packs = layers(py, prompt_packs, "prompt-packs", "prompt_packs")?;
        let tokio = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("fabric")
            .build()
            .map_err(|e| error::<FabricError>(py, "runtime", format!("cannot start the runtime's threads: {e}")))?;
        let mut builder = Core::builder().settings(settings).catalogue_dirs(catalogue, prompt_packs);
        if let Some(dir) = stub_dir {
            builder = builder.stub_dir(dir);
        }
        let store = match store {
            // The URL's credentials never reach the message.
            Some(url) => Some(
                tokio
                    .block_on(fabric::store::open(&url))
                    .map_err(|e| error::<ConfigError>(py, "config", format!("store {}: {e}", fabric::redact::redact_url(&url))))?,
            ),
            None => None,
        };
        for (name, function) in tools.map(|t| t.iter().collect::<Vec<_>>()).unwrap_or_default() {
            let name: String = name.extract()?;
            if !function.is_callable() {
                return Err(error::<ConfigError>(py, "config", format!("tool `{name}` is not callable")));
            }
            builder = builder.tool(&name, Arc::new(PyTool(Arc::new(function.unbind()))));
        }
        // The catalogue is read and the stacks built on the runtime's threads (some need one).
        let _guard = tokio.enter();
        let core = Arc::new(builder.build().map_err(|e| build_error(py, e))?);
        let durable = store.map(|store| Arc::new(fabric::runtime::Durable::new(core.clone(), store)));
        Ok(Runtime { core, durable, tokio: Some(Arc::new(tokio)) })
    }

    /// Runs every case of `dataset` (a path, or the dataset as a dict or list: ours,
    /// pydantic_evals' or LangSmith's) as an experiment recorded in the runtime's store, graded
    /// by its evaluators and `evaluators` (ours, as dicts); returns the report (docs/evals.md).
    #[pyo3(signature = (dataset, evaluators = None, *, repeat = 1, concurrency = 4))]
    fn evaluate<'py>(
        &self,
        py: Python<'py>,
        dataset: &Bound<'py, PyAny>,
        evaluators: Option<&Bound<'py, PyAny>>,
        repeat: u32,
        concurrency: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let options = fabric::eval::RunOptions { concurrency: concurrency.max(1), repeat: repeat.max(1) };
        evaluate::Evaluate { durable: self.durable.clone(), tokio: self.tokio.clone() }.run(py, dataset, evaluators, options)
    }

    /// Runs `route_id` with `goal` to its end; the result object of `fabric run`, with its
    /// `events`. A run that fails is a result (`status` `failed`); a run that cannot start
    /// raises `StartError`.
    #[pyo3(signature = (route_id, goal, *, prefetch = None, cancel = None, idempotency_key = None))]
    fn run<'py>(
        &self,
        py: Python<'py>,
        route_id: String,
        goal: &Bound<'py, PyAny>,
        prefetch: Option<Vec<String>>,
        cancel: Option<PyRef<'py, CancelToken>>,
        idempotency_key: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let goal = goal_of(py, goal)?;
        if let Some(key) = idempotency_key {
            return self.run_once(py, route_id, goal, prefetch, cancel, &key);
        }
        let core = self.core.clone();
        let tokio = self.tokio.clone().ok_or_else(|| error::<FabricError>(py, "runtime", "this runtime is shut down".into()))?;
        let sink = Arc::new(MemorySink::default());
        let events: Arc<dyn EventSink> = sink.clone();
        let req = RunRequest { route_id, goal, prefetch: prefetch.unwrap_or_default() };
        // The GIL is released while the run executes: Python tools and other threads go on.
        // Every 100 ms the run looks at Python's signals: Ctrl-C interrupts it (it ends
        // `interrupted`, as `fabric run` does on SIGINT) and raises `KeyboardInterrupt`.
        let (handle, cancel) = cancel_of(cancel);
        let (outcome, interrupted) = py.detach(move || {
            tokio.block_on(async move {
                let run = core.run(req, events, cancel);
                tokio::pin!(run);
                let mut interrupted: Option<PyErr> = None;
                loop {
                    tokio::select! {
                        outcome = &mut run => return (outcome, interrupted),
                        _ = tokio::time::sleep(Duration::from_millis(100)), if interrupted.is_none() => {
                            if let Err(e) = Python::attach(|py| py.check_signals()) {
                                handle.cancel("KeyboardInterrupt");
                                interrupted = Some(e);
                            }
                        }
                    }
                }
            })
        });
        if let Some(e) = interrupted {
            return Err(e);
        }
        let outcome = outcome.map_err(|e| error::<StartError>(py, e.code(), e.to_string()))?;
        let mut result = serde_json::to_value(&outcome.result).unwrap_or(Value::Null);
        let lines = event_lines(&sink);
        if let Value::Object(map) = &mut result {
            map.insert("events".into(), Value::Array(lines));
            if !outcome.unused_script_lines.is_empty() {
                map.insert("unused_script_lines".into(), outcome.unused_script_lines.into());
            }
        }
        from_json(py, &result.to_string())
    }

    /// Starts `route_id` with `goal` and returns its events as they happen: an iterator of
    /// dicts (deltas included), ending after the run's last event; the stream's `result` is the
    /// run's result then. Closing the stream before (`close()`, leaving a `with` block, or
    /// dropping it: `break` out of a `for` loop) cancels the run. Raises `StartError` when the
    /// route cannot run.
    #[pyo3(signature = (route_id, goal, *, prefetch = None, cancel = None))]
    fn stream<'py>(
        &self,
        py: Python<'py>,
        route_id: String,
        goal: &Bound<'py, PyAny>,
        prefetch: Option<Vec<String>>,
        cancel: Option<PyRef<'py, CancelToken>>,
    ) -> PyResult<stream::RunStream> {
        let goal = goal_of(py, goal)?;
        let tokio = self.tokio.clone().ok_or_else(|| error::<FabricError>(py, "runtime", "this runtime is shut down".into()))?;
        self.core.check_route(&route_id).map_err(|e| error::<StartError>(py, e.code(), e.to_string()))?;
        let (handle, token) = cancel_of(cancel);
        let core = self.core.clone();
        let req = RunRequest { route_id, goal, prefetch: prefetch.unwrap_or_default() };
        Ok(stream::RunStream::start(tokio, handle, move |sink| async move {
            match core.run(req, sink, token).await {
                Ok(outcome) => Ok(serde_json::to_value(&outcome.result).unwrap_or(Value::Null)),
                Err(e) => Err((e.code(), e.to_string())),
            }
        }))
    }

    /// Stores a schedule on the run store (`store=`): a `fabric serve` on that store runs
    /// `route_id` with `goal` on the cron expression, once per fire time (docs/operations.md,
    /// "Scheduled runs"). Returns the schedule as a dict (`id`, `next_fires`, ...).
    #[pyo3(signature = (route_id, goal, cron, *, timezone = None, overlap = None, catchup = None, catchup_window = None, max_catchup_runs = None, model_profile = None, session_id = None, webhook_url = None, paused = false))]
    #[allow(clippy::too_many_arguments)]
    fn create_schedule<'py>(
        &self,
        py: Python<'py>,
        route_id: String,
        goal: &Bound<'py, PyAny>,
        cron: String,
        timezone: Option<String>,
        overlap: Option<String>,
        catchup: Option<String>,
        catchup_window: Option<String>,
        max_catchup_runs: Option<u32>,
        model_profile: Option<String>,
        session_id: Option<String>,
        webhook_url: Option<String>,
        paused: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        let durable = schedules::durable(py, self.durable.as_ref())?;
        let tokio = self.tokio.clone().ok_or_else(|| error::<FabricError>(py, "runtime", "this runtime is shut down".into()))?;
        let mut def = Map::new();
        def.insert("route_id".into(), Value::String(route_id));
        def.insert("goal".into(), Value::Object(goal_of(py, goal)?));
        def.insert("cron".into(), Value::String(cron));
        let texts = [("timezone", timezone), ("overlap", overlap), ("catchup", catchup), ("catchup_window", catchup_window), ("model_profile", model_profile)];
        for (k, v) in texts.into_iter().chain([("session_id", session_id), ("webhook_url", webhook_url)]) {
            if let Some(v) = v {
                def.insert(k.into(), Value::String(v));
            }
        }
        if let Some(n) = max_catchup_runs {
            def.insert("max_catchup_runs".into(), Value::from(n));
        }
        from_json(py, &schedules::create(py, &tokio, durable, def, paused)?)
    }

    /// The schedules of the run store, by id: each a dict with its next fires.
    fn schedules<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let durable = schedules::durable(py, self.durable.as_ref())?;
        let tokio = self.tokio.clone().ok_or_else(|| error::<FabricError>(py, "runtime", "this runtime is shut down".into()))?;
        from_json(py, &schedules::list(py, &tokio, durable)?)
    }

    /// A schedule's fire records, newest first (`fire_time`, `outcome`, `run_id`, `why`, ...).
    #[pyo3(signature = (schedule_id, limit = 50))]
    fn schedule_fires<'py>(&self, py: Python<'py>, schedule_id: String, limit: usize) -> PyResult<Bound<'py, PyAny>> {
        let durable = schedules::durable(py, self.durable.as_ref())?;
        let tokio = self.tokio.clone().ok_or_else(|| error::<FabricError>(py, "runtime", "this runtime is shut down".into()))?;
        from_json(py, &schedules::fires(py, &tokio, durable, &schedule_id, limit)?)
    }

    /// The routes of the catalogue that can run here.
    fn routes(&self) -> Vec<String> {
        self.core.claimable_routes()
    }

    /// The catalogue version runs start on (docs/catalogue.md, "Versions").
    #[getter]
    fn catalogue_version(&self) -> String {
        self.core.version().to_string()
    }

    fn __repr__(&self) -> String {
        format!("Runtime({} routes)", self.core.catalogue().routes().count())
    }
}

/// Cancels the run it is given to (`run(..., cancel=token)`): the run ends with the status
/// `cancelled` (reason class `cancelled`, a last `run.cancelled` event), its model or tool call in
/// flight aborted, keeping what it did. Thread-safe; cancelling twice is harmless (the first
/// reason stays). Ctrl-C is not a cancel: it interrupts (`interrupted`).
#[pyclass(module = "fabric_runtime._native", frozen)]
struct CancelToken {
    handle: CancelHandle,
}

#[pymethods]
impl CancelToken {
    #[new]
    fn new() -> Self {
        CancelToken { handle: CancelHandle::new().0 }
    }

    #[pyo3(signature = (reason = "cancelled".to_owned()))]
    fn cancel(&self, reason: String) {
        self.handle.cancel_run(&reason);
    }
}

/// What a stage does with a reply: the slot value (compact JSON, or the unwrapped text of a
/// text envelope), or `ValidationError` with the stage's reason class.
#[pyfunction]
fn validate(py: Python<'_>, schema: &Bound<'_, PyAny>, raw: &Bound<'_, PyString>) -> PyResult<String> {
    let schema = to_json::<ValidationError>(py, schema, "invalid_schema")?;
    match fabric::runtime::validate(&schema, raw.to_str()?) {
        Validation::Accepted(value) => Ok(value),
        Validation::PlainText { text, .. } => Ok(text),
        Validation::Refused { class, detail } => Err(error::<ValidationError>(py, class.as_str(), detail)),
    }
}

/// A model string as LangChain's `init_chat_model` reads it: `(provider, model)`, or `None`
/// when no provider can be told.
#[pyfunction]
fn parse_model(s: &str) -> Option<(String, String)> {
    fabric::llm::model::parse_model_string(s)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<Runtime>()?;
    m.add_class::<CancelToken>()?;
    m.add_class::<stream::RunStream>()?;
    m.add_function(wrap_pyfunction!(validate, m)?)?;
    m.add_function(wrap_pyfunction!(parse_model, m)?)?;
    m.add("FabricError", py.get_type::<FabricError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("StartError", py.get_type::<StartError>())?;
    m.add("ValidationError", py.get_type::<ValidationError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
