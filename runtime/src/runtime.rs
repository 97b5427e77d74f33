//! The facade: one embeddable runtime that `fabric`, `fabric serve` and the Python package are
//! thin shells over.
//!
//! A [`Runtime`] is built once ([`Runtime::builder`]) from settings (the environment by
//! default), a catalogue and the stub scripts; it owns the loaded catalogue, the model stacks
//! (the seeded stub, or the configured provider and, when opted in, one stack per model
//! profile), the in-process tools and the tool client. It starts runs, checks routes, validates
//! replies the way stages do and probes the provider. Everything it decides (stub or provider,
//! strict-stub checks, which profile may run) is here, not in a front end.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Map, Value};

use crate::cancel::{Cancel, CancelHandle};
use crate::catalogue::{self, Catalogue, Layers, RouteEntry, SourceFile};
use crate::config::{ConfigError, ProviderKind, ProviderTarget, Settings, Tuning, choose_model};
use crate::defs::ProfileDef;
use crate::diag::{Diagnostic, Pos, Severity};
use crate::events::{EventSink, NullSink, RunEvents};
use crate::exec::{Begin, Problems, ProfileError, ProfileStack, RunHistory, RunRequest, RunResult, Runner, StartError, VarLookup};
use crate::failure::ReasonClass;
use crate::hydrate::{NodeKind, Route};
use crate::llm::flow::Flow;
use crate::llm::providers::backend_for;
use crate::llm::stub::StubLlm;
use crate::llm::{Llm, LlmError, LlmRequest, ModelInfo, OutputSpec, ReplyValue, stack};
use crate::store::{Fenced, Holder, IdempotencyKey, Lease, RunStore, StoreError, StoredRun, StoredStatus};
use crate::tools::{HttpPort, Tool};

/// Where stub scripts are read from when no directory is given.
pub const DEFAULT_STUB_DIR: &str = "stub";

/// Why a runtime could not be built: nothing ran, and a front end says so (exit 2, HTTP 500 at
/// start-up, a Python exception).
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("bad configuration: {0}")]
    Config(#[from] ConfigError),
    #[error("stub scripts: {0}")]
    Stub(String),
    #[error("{0}")]
    Client(#[from] crate::failure::ClientError),
    /// Catalogue or prompt pack directories that do not exist (every one of them); a front end
    /// adds which of its settings names them.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    MissingDirs(Vec<catalogue::MissingDir>),
}

/// Where the catalogue comes from.
#[derive(Debug)]
enum CatalogueSource {
    Dirs { catalogue: Layers, packs: Layers },
    Texts { files: Vec<SourceFile>, packs: Vec<SourceFile> },
    Loaded(Arc<Catalogue>),
}

/// Builds a [`Runtime`]. Defaults: settings from the process environment, the catalogue in
/// `routes/` with packs in `prompt-packs/`, stub scripts in `stub/` when it exists, `${VAR}` of
/// tool URLs from the process environment, no in-process tools.
pub struct RuntimeBuilder {
    settings: Option<Settings>,
    catalogue: CatalogueSource,
    stub_dir: Option<PathBuf>,
    stub: Option<StubLlm>,
    vars: Option<VarLookup>,
    tools: HashMap<String, Arc<dyn Tool>>,
    backend: Option<Arc<dyn Llm>>,
    http: Option<Arc<dyn HttpPort>>,
    store: Option<Arc<dyn RunStore>>,
    run_ids: Option<crate::exec::RunIds>,
}

impl std::fmt::Debug for RuntimeBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuntimeBuilder").field("catalogue", &self.catalogue).field("tools", &self.tools.keys().collect::<Vec<_>>()).finish_non_exhaustive()
    }
}

impl RuntimeBuilder {
    /// The settings to use instead of the process environment.
    pub fn settings(mut self, settings: Settings) -> Self {
        self.settings = Some(settings);
        self
    }

    /// The catalogue and prompt pack directories: one each, or [`Layers`] of several (later
    /// ones adding definitions to the earlier ones). Each must exist.
    pub fn catalogue_dirs(mut self, catalogue: impl Into<Layers>, packs: impl Into<Layers>) -> Self {
        self.catalogue = CatalogueSource::Dirs { catalogue: catalogue.into(), packs: packs.into() };
        self
    }

    /// A catalogue from texts in memory.
    pub fn catalogue_texts(mut self, files: Vec<SourceFile>, packs: Vec<SourceFile>) -> Self {
        self.catalogue = CatalogueSource::Texts { files, packs };
        self
    }

    /// A catalogue already loaded.
    pub fn catalogue(mut self, catalogue: Arc<Catalogue>) -> Self {
        self.catalogue = CatalogueSource::Loaded(catalogue);
        self
    }

    /// Stub scripts from this directory, which must exist (with the stub on).
    pub fn stub_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.stub_dir = Some(dir.into());
        self
    }

    /// This stub instead of scripts from a directory (with the stub on, or to force the stub).
    pub fn stub(mut self, stub: StubLlm) -> Self {
        self.stub = Some(stub);
        self
    }

    /// Resolves `${VAR}` in tool URLs (the process environment by default).
    pub fn vars(mut self, vars: impl Fn(&str) -> Option<String> + Send + Sync + 'static) -> Self {
        self.vars = Some(Arc::new(vars));
        self
    }

    /// Registers an in-process tool for the catalogue capability `name` (one without `invoke`),
    /// with the same input-schema contract as an HTTP tool.
    pub fn tool(mut self, name: &str, tool: Arc<dyn Tool>) -> Self {
        self.tools.insert(name.to_owned(), tool);
        self
    }

    /// A model backend of the embedder's own (wrapped in the same retry and telemetry layers).
    pub fn backend(mut self, backend: Arc<dyn Llm>) -> Self {
        self.backend = Some(backend);
        self
    }

    /// HTTP tool calls through this port instead of the real client.
    pub fn http(mut self, http: Arc<dyn HttpPort>) -> Self {
        self.http = Some(http);
        self
    }

    /// New run ids from `ids` instead of time-ordered UUIDv7s ([`crate::exec::RunIds`] says
    /// what an id must be): a simulation's seeded source.
    pub fn run_ids(mut self, ids: impl Fn() -> String + Send + Sync + 'static) -> Self {
        self.run_ids = Some(Arc::new(ids));
        self
    }

    /// Records runs in this store ([`Runtime::accept`], [`Runtime::execute`], replies).
    pub fn store(mut self, store: Arc<dyn RunStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// Loads the catalogue, builds every model stack (so a missing key stops here, before any
    /// inference) and the tool client.
    pub fn build(self) -> Result<Runtime, BuildError> {
        let settings = match self.settings {
            Some(s) => s,
            None => Settings::from_env()?,
        };
        let mut warnings = settings.warnings.clone();
        let catalogue = match self.catalogue {
            CatalogueSource::Dirs { catalogue, packs } => {
                let missing = catalogue::missing_dirs(&catalogue, &packs);
                if !missing.is_empty() {
                    return Err(BuildError::MissingDirs(missing));
                }
                Arc::new(catalogue::load_layers(&catalogue, &packs))
            }
            CatalogueSource::Texts { files, packs } => Arc::new(catalogue::load_from_texts(&files, &packs)),
            CatalogueSource::Loaded(c) => c,
        };
        let mut stub = None;
        let mut profile_llms = HashMap::new();
        let flow = Flow::new(settings.flow.clone());
        let llm = if let Some(backend) = self.backend {
            let gate = flow.gate(&backend.info(), false);
            stack::gated(backend, settings.retry, gate)
        } else if settings.stub || self.stub.is_some() {
            // A stub given by the embedder is used as it is; one read from scripts takes the
            // latency and strictness of the settings.
            let s = match (self.stub, self.stub_dir) {
                (Some(s), _) => s,
                (None, dir) => {
                    let scripts = match dir {
                        Some(dir) => load_stub(&dir)?,
                        None if Path::new(DEFAULT_STUB_DIR).is_dir() => load_stub(Path::new(DEFAULT_STUB_DIR))?,
                        None => {
                            warnings.push(format!("no stub script directory `{DEFAULT_STUB_DIR}` here; every stub reply is generated from the stage's schema"));
                            StubLlm::default()
                        }
                    };
                    let mut scripts = scripts.with_latency(settings.stub_latency).strict(settings.stub_strict);
                    check_scripts(&mut scripts, &catalogue, &mut warnings)?;
                    scripts
                }
            };
            stub = Some(s.clone());
            let gate = flow.gate(&s.info(), false);
            stack::gated(s, settings.retry, gate)
        } else {
            let client = stack::client().map_err(BuildError::Client)?;
            if settings.honor_model_profile {
                profile_llms = profile_stacks(&settings, &client, catalogue.profiles(), &flow);
            }
            provider_stack(&settings, &client, &flow)?
        };
        check_tpm(&flow, &catalogue, &llm, &profile_llms)?;
        let vars = self.vars.unwrap_or_else(|| Arc::new(|k: &str| std::env::var(k).ok()));
        let runner = match self.http {
            Some(http) => Runner::with_port(catalogue, llm, vars, http),
            None => Runner::new(catalogue, llm, vars).map_err(BuildError::Client)?,
        };
        let mut runner = runner.with_fleet(settings.fleet.clone()).with_profile_llms(profile_llms).with_tool_timeout(settings.tool_timeout);
        if let Some(ids) = self.run_ids {
            runner = runner.with_run_ids(ids);
        }
        for (name, tool) in self.tools {
            runner = runner.with_tool(&name, tool);
        }
        let holder = Holder::new(settings.service.run_lease);
        Ok(Runtime { runner, settings, stub, warnings, store: self.store, holder, flow })
    }
}

/// Script keys that name nothing the catalogue has: a file named after no route, a stage key
/// that is no stage of its route. The stub would answer such calls with generated replies, so
/// the mistake would pass unseen: warnings, or, with `FABRIC_LLM_STUB_STRICT`, errors (a file
/// of no route stops the build; a stray stage key breaks its route's script). The diagnostics
/// are errors in form either way: a front end says "warning" before a warning's line.
fn check_scripts(stub: &mut StubLlm, catalogue: &Catalogue, warnings: &mut Vec<String>) -> Result<(), BuildError> {
    let strict = stub.is_strict();
    let mut stray_files = Vec::new();
    let mut broken: Vec<(String, Vec<Diagnostic>)> = Vec::new();
    for file in stub.files() {
        let Ok(route) = catalogue.route(&file.route_id) else {
            if catalogue.get(&file.route_id).is_some() {
                continue; // a broken route: its own problems say enough
            }
            let id = |r: &RouteEntry| match r {
                RouteEntry::Ready(r) => r.id().to_owned(),
                RouteEntry::Broken(b) => b.id.clone(),
            };
            let known: Vec<String> = catalogue.routes().map(id).collect();
            let message = format!("stub script `{}` is named after no route of the catalogue (routes: {})", file.route_id, known.join(", "));
            stray_files.push(Diagnostic { path: file.path.clone(), pos: Pos::FILE, severity: Severity::Error, message });
            continue;
        };
        let stages: Vec<&str> = route.nodes().map(|(_, n)| n.id()).collect();
        let stray: Vec<Diagnostic> = file
            .stages
            .iter()
            .filter(|(key, _)| !stages.contains(&key.as_str()))
            .map(|(key, pos)| Diagnostic {
                path: file.path.clone(),
                pos: *pos,
                severity: Severity::Error,
                message: format!("stage `{key}` is no stage of route `{}` (stages: {}); its replies are never used", file.route_id, stages.join(", ")),
            })
            .collect();
        if !stray.is_empty() {
            broken.push((file.route_id.clone(), stray));
        }
    }
    if strict && !stray_files.is_empty() {
        return Err(BuildError::Stub(stray_files.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")));
    }
    warnings.extend(stray_files.iter().map(ToString::to_string));
    for (route, problems) in broken {
        if strict {
            stub.break_script(&route, problems);
        } else {
            warnings.extend(problems.iter().map(ToString::to_string));
        }
    }
    Ok(())
}

fn load_stub(dir: &Path) -> Result<StubLlm, BuildError> {
    StubLlm::load(dir).map_err(|problems| BuildError::Stub(problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")))
}

/// The default provider stack of the configuration (`FABRIC_LLM_MODEL` / `OLLAMA_MODEL`).
fn provider_stack(settings: &Settings, client: &reqwest::Client, flow: &Flow) -> Result<Arc<dyn Llm>, ConfigError> {
    let target = settings.target.clone().ok_or_else(|| ConfigError { var: settings.model_string.1.to_owned(), message: "no provider is configured".into() })?;
    Ok(hosted_stack(settings, client, target, Tuning::default(), flow))
}

/// A provider backend in its stack, through its model's gate.
fn hosted_stack(settings: &Settings, client: &reqwest::Client, target: ProviderTarget, tuning: Tuning, flow: &Flow) -> Arc<dyn Llm> {
    let backend = backend_for(client.clone(), target, tuning, settings.max_reply_bytes);
    let gate = flow.gate(&backend.info(), true);
    stack::gated(backend, settings.retry, gate)
}

/// A TPM limit below one call's input could never let that call through: refused at start,
/// naming the limit, the model, and the route and stage whose system prompt alone exceeds it.
fn check_tpm(flow: &Flow, catalogue: &Catalogue, llm: &Arc<dyn Llm>, profiles: &HashMap<String, ProfileStack>) -> Result<(), ConfigError> {
    let plan = flow.plan();
    if !plan.any() {
        return Ok(());
    }
    for route in catalogue.routes().filter_map(|r| if let RouteEntry::Ready(r) = r { Some(r) } else { None }) {
        let llm = match profiles.get(route.model_profile()) {
            Some(Ok(l)) => l,
            Some(Err(_)) => continue,
            None => llm,
        };
        let key = crate::llm::flow::key_of(&llm.info());
        let Some(tpm) = plan.limits(&key).tpm else { continue };
        let model_stages = route.nodes().map(|(_, n)| n).filter(|n| n.role() != crate::defs::LlmRole::None || matches!(n.kind(), NodeKind::Decision));
        for stage in model_stages {
            let need = stage.prompt().system_text().len().div_ceil(4) as u64;
            if need > tpm {
                let var = if plan.models.get(&key).is_some_and(|l| l.tpm.is_some()) { "FABRIC_CONFIG" } else { "FABRIC_LLM_TPM" };
                return Err(ConfigError {
                    var: var.to_owned(),
                    message: format!(
                        "a TPM of {tpm} for {key} can never let a call of route `{}` stage `{}` through: its system prompt alone is about {need} tokens",
                        route.id(),
                        stage.id()
                    ),
                });
            }
        }
    }
    Ok(())
}

/// Where a model profile sends its calls when profiles are honoured
/// (`FABRIC_HONOR_MODEL_PROFILE=1`): routing (provider, model, base URL, key variable) is taken
/// from the profile as one unit, or entirely from the process configuration when the profile
/// names no routing; tuning (temperature, max tokens) merges field by field over the defaults.
/// The loader has already checked what needs no environment (see `loader::decode`).
fn profile_target(settings: &Settings, name: &str, profile: &ProfileDef) -> Result<(ProviderTarget, Tuning), ProfileError> {
    let what = format!("model profile `{name}` ({}:{}:{})", profile.origin.path.display(), profile.origin.pos.line, profile.origin.pos.col);
    let has_routing = profile.provider.is_some() || profile.model.is_some() || profile.base_url.is_some() || profile.api_key_env.is_some();
    let target = if !has_routing {
        settings.target.clone().ok_or(ProfileError::NoProvider { profile: what })?
    } else {
        let model = profile.model.as_deref().ok_or_else(|| ProfileError::NoModel { profile: what.clone() })?;
        let (kind, model) = match &profile.provider {
            Some(p) => {
                let kind = ProviderKind::from_key(p).ok_or_else(|| ProfileError::UnknownProvider { profile: what.clone(), provider: p.clone() })?;
                (kind, model.to_owned())
            }
            None => {
                let c = choose_model(&what, model)?;
                (c.provider, c.model)
            }
        };
        settings.resolve_target(kind, model, profile.base_url.as_deref(), profile.api_key_env.as_deref())?
    };
    let defaults = Tuning::default();
    let tuning = Tuning { temperature: profile.temperature.unwrap_or(defaults.temperature), max_tokens: profile.max_tokens.unwrap_or(defaults.max_tokens) };
    Ok((target, tuning))
}

/// One stack per model profile, all built before any inference. A profile that cannot be used
/// here (its key variable is unset, say) keeps its error: runs of the routes that use it are
/// refused at start, every other route runs.
fn profile_stacks<'a>(
    settings: &Settings,
    client: &reqwest::Client,
    profiles: impl Iterator<Item = (&'a String, &'a ProfileDef)>,
    flow: &Flow,
) -> HashMap<String, ProfileStack> {
    profiles
        .map(|(name, profile)| {
            let stack = profile_target(settings, name, profile).map(|(target, tuning)| hosted_stack(settings, client, target, tuning, flow));
            (name.clone(), stack)
        })
        .collect()
}

/// A finished run as a front end reports it.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub result: RunResult,
    /// Strict stub only: script lines the run left unused (a test expected calls that did not
    /// happen); front ends treat a non-empty list as a failure.
    pub unused_script_lines: Vec<String>,
}

/// What a stage makes of a raw reply against an output schema ([`validate`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Validation {
    /// The slot value: compact JSON, or the unwrapped string of a text envelope.
    Accepted(String),
    /// The schema is not bindable: a stage with it runs as a plain text call and keeps the
    /// reply as it is.
    PlainText { why: String, text: String },
    /// Refused with `invalid_json` or `schema_validation`.
    Refused { class: crate::failure::ReasonClass, detail: String },
}

/// What a stage with `schema` makes of `raw`: the same decision (bindable or plain text) and the
/// same reading as a model call's ([`OutputSpec::from_schema`], [`crate::llm::finish_reply`]).
pub fn validate(schema: &Value, raw: &str) -> Validation {
    let output = OutputSpec::from_schema(schema);
    match crate::llm::finish_reply(&output, raw.to_owned(), crate::llm::ReplyMeta::default()) {
        Ok(reply) => match (&output, reply.value) {
            (OutputSpec::Unbindable { why }, ReplyValue::Text(text)) => Validation::PlainText { why: why.clone(), text },
            (_, value) => Validation::Accepted(value.slot_value()),
        },
        Err(e) => Validation::Refused { class: e.class, detail: e.message },
    }
}

/// A model profile as this process would use it ([`Runtime::profiles`]).
#[derive(Debug, Clone)]
pub struct ProfileStatus {
    pub name: String,
    /// Where its calls go, or why it cannot be used here.
    pub model: Result<ModelInfo, ProfileError>,
}

/// The result of [`Runtime::probe`].
#[derive(Debug, Clone)]
pub struct Probe {
    pub provider: String,
    pub model: String,
    pub reply: String,
    pub elapsed: Duration,
}

/// The embeddable runtime (see the module docs).
mod accepting;
mod cancelling;
mod flow;
mod retention;
pub use crate::llm::flow::GateStatus;
pub use cancelling::{CancelError, Cancelling, DEFAULT_CANCEL_REASON, MAX_CANCEL_REASON};
pub use retention::{EXPIRED_REASON, PRUNE_BATCH};

pub struct Runtime {
    runner: Runner,
    settings: Settings,
    stub: Option<StubLlm>,
    warnings: Vec<String>,
    store: Option<Arc<dyn RunStore>>,
    /// This process as the store's claims name it.
    holder: Holder,
    /// The gates of the models this process calls.
    flow: Arc<Flow>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("runner", &self.runner).field("stub", &self.stub.is_some()).finish_non_exhaustive()
    }
}

impl Runtime {
    pub fn builder() -> RuntimeBuilder {
        RuntimeBuilder {
            settings: None,
            catalogue: CatalogueSource::Dirs { catalogue: Layers::one("routes"), packs: Layers::one("prompt-packs") },
            stub_dir: None,
            stub: None,
            vars: None,
            tools: HashMap::new(),
            backend: None,
            http: None,
            store: None,
            run_ids: None,
        }
    }

    pub fn catalogue(&self) -> &Catalogue {
        self.runner.catalogue()
    }

    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Problems that did not stop the build (a model string ignored with the stub, a missing
    /// stub directory); front ends show them.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Checks that `route_id` can start here: it exists and is not broken, this fleet serves it,
    /// its in-process tools are registered, its model profile is usable, its stub script loaded.
    pub fn check_route(&self, route_id: &str) -> Result<&Arc<Route>, StartError> {
        let route = self.runner.route(route_id)?;
        if let Some(problems) = self.stub.as_ref().and_then(|s| s.problems(route_id)) {
            return Err(StartError::StubScriptBroken { route: route_id.to_owned(), problems: Problems(problems.to_vec()) });
        }
        Ok(route)
    }

    /// Runs a route to its end; `cancel` interrupts it (a signal, a shutdown). Failures of the
    /// run itself are in the result; an `Err` means it could not start (nothing ran).
    pub async fn run(&self, req: RunRequest, sink: Arc<dyn EventSink>, cancel: Cancel) -> Result<RunOutcome, StartError> {
        // The runner checks the rest of `check_route` itself.
        if let Some(problems) = self.stub.as_ref().and_then(|s| s.problems(&req.route_id)) {
            return Err(StartError::StubScriptBroken { route: req.route_id.clone(), problems: Problems(problems.to_vec()) });
        }
        let result = self.runner.execute(req, Begin::New { run_id: self.runner.new_id() }, sink, cancel, None).await?;
        let unused_script_lines = self.stub.as_ref().filter(|s| s.is_strict()).map(|s| s.unconsumed(&result.llm_calls)).unwrap_or_default();
        Ok(RunOutcome { result, unused_script_lines })
    }

    /// The run store, when the runtime records runs.
    pub fn store(&self) -> Option<&Arc<dyn RunStore>> {
        self.store.as_ref()
    }

    /// The run store, for what needs one.
    fn run_store(&self) -> Result<&Arc<dyn RunStore>, StoreError> {
        self.store.as_ref().ok_or_else(|| StoreError::Database("this runtime has no run store".into()))
    }

    /// This process as it holds runs in the store (a new name at every start).
    /// The gates of the models this process calls: their limits, waiters and pauses.
    pub fn flow(&self) -> &Arc<Flow> {
        &self.flow
    }

    /// Each gate as it is now (metrics, `fabric doctor`).
    pub fn flow_status(&self) -> Vec<GateStatus> {
        self.flow.gates().iter().map(|g| g.status()).collect()
    }

    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// Runs an accepted run this process holds, recording it in the store as it goes (every
    /// write fenced by the lease).
    pub async fn execute(&self, lease: &Lease, req: &StartRequest, sink: Arc<dyn EventSink>, cancel: Cancel) -> Result<RunOutcome, StartError> {
        let fenced = self.store.as_deref().map(|store| Fenced { store, lease });
        let journal = fenced.as_ref().map(|f| f as &dyn crate::exec::RunJournal);
        let result = self.runner.execute(req.run_request(), Begin::New { run_id: lease.run_id.clone() }, sink, cancel, journal).await?;
        Ok(RunOutcome { result, unused_script_lines: Vec::new() })
    }

    /// Accepts `req` and runs it here at once, recorded in the store as the service records a
    /// run, holding its lease until it ends: the lease is renewed every third of its length, so
    /// a service on the same store does not take the run over; if another process took it
    /// anyway, `handle` (the one of `cancel`) stops the run with the reason "lease lost". What
    /// `fabric run --store` does.
    pub async fn run_recorded(&self, req: &StartRequest, sink: Arc<dyn EventSink>, handle: &CancelHandle, cancel: Cancel) -> Result<RunOutcome, AcceptError> {
        let lease = self.accept_here(req).await?.lease.ok_or(AcceptError::NotClaimed)?;
        let leases = [lease.clone()];
        tokio::select! {
            biased;
            outcome = self.execute(&lease, req, sink, cancel) => Ok(outcome?),
            never = self.hold_leases(&leases, handle) => match never {},
        }
    }

    /// [`Runtime::run_recorded`] once per idempotency key: the first call with `key` runs the
    /// route here (recorded, holding its lease); a later one with the same contract, from any
    /// process of the store, runs nothing and gets that run once it ended or asked (waiting for
    /// one still running elsewhere, until `cancel`); another contract is
    /// [`AcceptError::KeyReused`]. What the Python package's `run(..., idempotency_key=)` does.
    pub async fn run_recorded_once(
        &self,
        req: &StartRequest,
        key: &IdempotencyKey,
        sink: Arc<dyn EventSink>,
        handle: &CancelHandle,
        cancel: Cancel,
    ) -> Result<RecordedOnce, AcceptError> {
        let mut run = match self.accept_once_here(req, key).await? {
            Started::New(accepted) => {
                let lease = accepted.lease.ok_or(AcceptError::NotClaimed)?;
                let leases = [lease.clone()];
                return tokio::select! {
                    biased;
                    outcome = self.execute(&lease, req, sink, cancel) => Ok(RecordedOnce::Ran(Box::new(outcome?))),
                    never = self.hold_leases(&leases, handle) => match never {},
                };
            }
            Started::Replayed(run) => run,
        };
        let store = self.run_store()?;
        // Queued or running on another process: its end (or question) is what this call answers.
        while matches!(run.status, StoredStatus::Queued | StoredStatus::Running) && cancel.requested().is_none() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            run = Box::new(
                store.get_run(&run.run_id).await?.ok_or_else(|| StoreError::Database(format!("run {} was removed while it was awaited", run.run_id)))?,
            );
        }
        Ok(RecordedOnce::Replayed(run))
    }

    /// Renews `leases` every third of the lease for as long as it is polled: in the same task as
    /// the run it holds (no task of its own to outlive it), dropped with the run. A lease another
    /// process took anyway stops `handle` ("lease lost"); a cancel request on the run, found at
    /// the same beat, cancels it (it ends `cancelled`).
    async fn hold_leases(&self, leases: &[Lease], handle: &CancelHandle) -> std::convert::Infallible {
        let mut tick = tokio::time::interval(self.holder.lease / 3);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            tick.tick().await;
            if self.renew(leases).await.is_ok_and(|lost| !lost.is_empty()) {
                handle.cancel("lease lost");
            }
            if let Ok(asked) = self.cancel_requests().await
                && let Some((_, reason)) = asked.iter().find(|(l, _)| leases.contains(l))
            {
                handle.cancel_run(reason);
            }
        }
    }

    /// Continues a run that asked with the user's `message`, here, recorded in the store,
    /// holding its lease until it ends or asks again (renewed every third of it; if another
    /// process takes the run anyway, `handle` stops it with "lease lost"). What
    /// `fabric runs reply` does; the service does the same over its replicas' leases.
    pub async fn reply_recorded(
        &self,
        run_id: &str,
        message: String,
        sink: Arc<dyn EventSink>,
        handle: &CancelHandle,
        cancel: Cancel,
    ) -> Result<RunOutcome, ReplyError> {
        let claimed = self.claim_reply(run_id, message).await?;
        let leases = [claimed.lease().clone()];
        tokio::select! {
            biased;
            outcome = self.continue_run(claimed, sink, cancel) => Ok(outcome?),
            never = self.hold_leases(&leases, handle) => match never {},
        }
    }

    /// The routes whose runs this process may claim: those [`Runtime::check_route`] accepts.
    pub fn claimable_routes(&self) -> Vec<String> {
        self.catalogue()
            .routes()
            .filter_map(|entry| match entry {
                crate::catalogue::RouteEntry::Ready(r) if self.check_route(r.id()).is_ok() => Some(r.id().to_owned()),
                _ => None,
            })
            .collect()
    }

    /// Claims up to `limit` runnable runs of the routes this process serves: queued runs, and
    /// runs whose process stopped renewing its lease (died, or stalled past it), to
    /// [`Runtime::resume`] each.
    pub async fn claim_runs(&self, limit: usize) -> Result<Vec<ClaimedRun>, StoreError> {
        let store = self.run_store()?;
        let routes = self.claimable_routes();
        Ok(store
            .claim_runs(&self.holder, &routes, limit)
            .await?
            .into_iter()
            .map(|claimed| {
                let request = serde_json::from_value::<StartRequest>(claimed.run.request);
                let (lease, cancel) = (Lease { run_id: claimed.run.run_id, token: claimed.token }, claimed.run.cancel_reason);
                ClaimedRun { lease, route_id: claimed.run.route_id, request, cancel }
            })
            .collect())
    }

    /// Executes a claimed run from where its journal ends: recorded model replies and completed
    /// stages and tool calls are taken from the journal (not done again), events go on after
    /// the last one written. A run that cannot go on here, or that was taken over more than
    /// [`MAX_TAKEOVERS`] times (it may be what kills its processes), is failed, keeping what it
    /// did. When its journal cannot be read the run is let go for another claim, and the
    /// outcome says `store_error` (nothing recorded).
    pub async fn resume(&self, claimed: ClaimedRun, sink: Arc<dyn EventSink>, cancel: Cancel) -> RunOutcome {
        let ClaimedRun { lease, route_id, request, cancel: asked } = claimed;
        let done = |result| RunOutcome { result, unused_script_lines: Vec::new() };
        // Someone asked to cancel it (its holder died first, or it was let go): it ends so.
        if let Some(reason) = asked {
            return match self.end_cancelled(&lease, &route_id, &reason, sink).await {
                Ok(result) => done(result),
                Err(e) => done(crate::exec::result_from_journal(&lease.run_id, &route_id, &[], ReasonClass::StoreError, &e.to_string())),
            };
        }
        let Some(store) = self.store.as_deref() else {
            return done(crate::exec::result_from_journal(&lease.run_id, &route_id, &[], ReasonClass::StoreError, "this runtime has no run store"));
        };
        let history = match read_history(store, &lease.run_id).await {
            Ok(h) => h,
            Err(e) => {
                let _ = store.release(&lease).await;
                let why = format!("the run's record could not be read: {e}");
                return done(crate::exec::result_from_journal(&lease.run_id, &route_id, &[], ReasonClass::StoreError, &why));
            }
        };
        let fenced = Fenced { store, lease: &lease };
        let why = match request {
            Ok(_) if lease.token > MAX_TAKEOVERS => format!("it was taken over {} times", lease.token - 1),
            Ok(req) => match self.runner.execute(req.run_request(), Begin::Recover(history.clone()), sink.clone(), cancel, Some(&fenced)).await {
                Ok(result) => return done(result),
                Err(e) => format!("it cannot go on here: {e}"),
            },
            Err(e) => format!("its start contract does not read: {e}"),
        };
        done(self.runner.abandon(&route_id, history, ReasonClass::Interrupted, &format!("the run was taken over, but {why}"), sink, &fenced).await)
    }

    /// Extends the leases of the runs this process executes; returns the runs another process
    /// took over (this one must stop them).
    pub async fn renew(&self, leases: &[Lease]) -> Result<Vec<String>, StoreError> {
        let store = self.run_store()?;
        if leases.is_empty() {
            return Ok(Vec::new());
        }
        store.renew(&self.holder, leases).await
    }

    /// Lets a run go that this process stopped without an end (its last write failed): it can
    /// be claimed again at once.
    pub async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        match &self.store {
            Some(store) => store.release(lease).await,
            None => Ok(()),
        }
    }

    /// Claims a run that awaits the user for `message`: only one reply can claim it.
    pub async fn claim_reply(&self, run_id: &str, message: String) -> Result<ClaimedReply, ReplyError> {
        let store = self.store.as_ref().ok_or(ReplyError::NoStore)?;
        let run = store.get_run(run_id).await?.ok_or_else(|| ReplyError::NotFound(run_id.to_owned()))?;
        if run.status != StoredStatus::AwaitingInput {
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: run.status.as_str() });
        }
        // Someone asked to cancel it while it was running, and it asked before its holder saw
        // the request: the request stands, so the run ends `cancelled` now instead of going on.
        if let Some(reason) = &run.cancel_reason {
            let _ = self.cancel(run_id, Some(reason), Arc::new(NullSink)).await;
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: StoredStatus::Cancelled.as_str() });
        }
        // Everything that could stop the continuation is checked before the run is claimed: a
        // claimed run that cannot go on would be stuck `running`.
        let request: StartRequest =
            serde_json::from_value(run.request).map_err(|e| StoreError::Database(format!("the start contract of run {run_id} does not read: {e}")))?;
        self.check_route(&request.route_id)?;
        if self.catalogue().route(&request.route_id).is_ok_and(|r| r.path() != crate::hydrate::RoutePath::DecisionLoop) {
            return Err(StartError::NotResumable { route: request.route_id.clone() }.into());
        }
        let Some(lease) = store.claim_reply(run_id, &self.holder).await? else {
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: "running" });
        };
        // Read after the claim: between a read and the claim another process could have
        // continued the run and seen it ask again, and this claim would go on from stale history.
        match read_history(store.as_ref(), run_id).await {
            Ok(history) => Ok(ClaimedReply { request, lease, history, reply: message }),
            Err(e) => {
                let _ = store.reopen_reply(&lease).await;
                Err(e.into())
            }
        }
    }

    /// Continues a claimed run: the decision loop goes on with the reply as a note.
    pub async fn continue_run(&self, claimed: ClaimedReply, sink: Arc<dyn EventSink>, cancel: Cancel) -> Result<RunOutcome, StartError> {
        let ClaimedReply { request, lease, history, reply } = claimed;
        let fenced = self.store.as_deref().map(|store| Fenced { store, lease: &lease });
        let journal = fenced.as_ref().map(|f| f as &dyn crate::exec::RunJournal);
        match self.runner.execute(request.run_request(), Begin::Continue { history, reply }, sink, cancel, journal).await {
            Ok(result) => Ok(RunOutcome { result, unused_script_lines: Vec::new() }),
            Err(e) => {
                // Not started after all (the catalogue changed since the check): it still waits.
                if let Some(store) = &self.store {
                    let _ = store.reopen_reply(&lease).await;
                }
                Err(e)
            }
        }
    }

    /// Re-executes a finished run from its journal with no model and no tool call, on this
    /// runtime's catalogue, and reports every divergence: a prompt, a user message, a result or
    /// a path that differs from what was recorded, and an end that differs from the stored one.
    pub async fn replay(&self, run_id: &str) -> Result<crate::exec::ReplayReport, ReplyError> {
        let store = self.store.as_ref().ok_or(ReplyError::NoStore)?;
        let run = store.get_run(run_id).await?.ok_or_else(|| ReplyError::NotFound(run_id.to_owned()))?;
        if run.status == StoredStatus::Running {
            return Err(ReplyError::NotWaiting { run_id: run_id.to_owned(), status: "running" });
        }
        let request: StartRequest =
            serde_json::from_value(run.request).map_err(|e| StoreError::Database(format!("the start contract of run {run_id} does not read: {e}")))?;
        let history = store.journal(run_id).await?;
        let result = self.runner.execute(request.run_request(), Begin::Replay(history), Arc::new(NullSink), Cancel::never(), None).await?;
        let mut report = crate::exec::ReplayReport::from(result);
        let recorded = run.result.unwrap_or(Value::Null);
        let now = serde_json::to_value(&report.result).unwrap_or(Value::Null);
        for key in ["status", "output", "question"] {
            if recorded.get(key) != now.get(key) {
                let (was, is) = (recorded.get(key).cloned().unwrap_or(Value::Null), now.get(key).cloned().unwrap_or(Value::Null));
                report.divergences.push(format!("the run's `{key}` differs: recorded {was}, now {is}"));
            }
        }
        Ok(report)
    }

    /// A run with a goal and nothing else: no events, no cancellation.
    pub async fn run_goal(&self, route_id: &str, goal: Map<String, Value>) -> Result<RunOutcome, StartError> {
        self.run(RunRequest { route_id: route_id.to_owned(), goal, prefetch: Vec::new() }, Arc::new(NullSink), Cancel::never()).await
    }

    /// The model profiles' stacks when profiles are honoured: each profile's provider and
    /// model, or why it cannot be used. Empty when profiles are metadata only.
    pub fn profiles(&self) -> Vec<ProfileStatus> {
        if !self.settings.honor_model_profile || self.stub.is_some() {
            return Vec::new();
        }
        let Ok(client) = stack::client() else { return Vec::new() };
        let mut out: Vec<ProfileStatus> = profile_stacks(&self.settings, &client, self.catalogue().profiles(), &self.flow)
            .into_iter()
            .map(|(name, stack)| ProfileStatus { name, model: stack.map(|l| l.info()) })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// One tiny structured call to the configured backend (`fabric doctor --probe`).
    pub async fn probe(&self) -> Result<Probe, LlmError> {
        let schema = serde_json::json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]});
        let output = OutputSpec::from_schema(&schema);
        let events = RunEvents::new("probe", "doctor", None, Arc::new(NullSink));
        let never = Cancel::never();
        let cx = opentelemetry::Context::current();
        let req = LlmRequest {
            events: &events,
            route_id: "doctor",
            stage_id: "probe",
            turn: 0,
            priority: 0,
            system: "Reply with JSON only.",
            user: "Reply with {\"ok\": true}.",
            output: &output,
            cx: &cx,
            cancel: &never,
        };
        let llm = self.runner.llm();
        let info = llm.info();
        let started = Instant::now();
        let reply = llm.complete(&req).await?;
        Ok(Probe { provider: info.provider, model: info.model, reply: reply.value.slot_value(), elapsed: started.elapsed() })
    }
}

/// The start contract of a run, as a service accepts it: `{route_id, goal, model_profile,
/// prefetch?, session_id?, webhook_url?}`. `model_profile` must name a defined profile and is
/// recorded with the run; the route's own profile decides the model (as in the Python runtime).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StartRequest {
    pub route_id: String,
    pub goal: Map<String, Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_profile: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefetch: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// Where this run's ends are posted, instead of the fleet's `FABRIC_WEBHOOK_URL`: its origin
    /// must be one of `FABRIC_WEBHOOK_ALLOWED_ORIGINS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook_url: Option<String>,
    /// What this start does while its session has a live run, instead of the fleet's
    /// `FABRIC_SESSION_POLICY` (only with a `session_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multitask: Option<crate::config::SessionPolicy>,
}

impl StartRequest {
    fn run_request(&self) -> RunRequest {
        RunRequest { route_id: self.route_id.clone(), goal: self.goal.clone(), prefetch: self.prefetch.clone() }
    }
}

/// Why a run was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("model profile `{0}` is not defined in the catalogue")]
    UnknownProfile(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    WebhookNotAllowed(#[from] crate::config::WebhookRefused),
    #[error("this runtime has no run store")]
    NoStore,
    #[error("the store did not let this process claim the run it accepted")]
    NotClaimed,
    /// The idempotency key started run `run_id` with another start contract.
    #[error("this idempotency key started run {run_id} with another start contract; use a new key for a new run")]
    KeyReused { run_id: String },
    /// `reject`: the session has this live run.
    #[error("session `{session}` has a live run, {run_id}; its policy (multitask `reject`) refuses another until it ends")]
    SessionBusy { session: String, run_id: String },
    #[error("`session_id` {0}")]
    BadSession(&'static str),
}

/// Why a reply was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReplyError {
    #[error("no run `{0}`")]
    NotFound(String),
    #[error("run `{run_id}` is {status}, not awaiting the user")]
    NotWaiting { run_id: String, status: &'static str },
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Start(#[from] StartError),
    #[error("this runtime has no run store")]
    NoStore,
}

/// A run a reply may continue: claimed in the store (no other reply can take it).
#[derive(Debug)]
pub struct ClaimedReply {
    request: StartRequest,
    lease: Lease,
    /// The run's record so far, read after the claim.
    history: RunHistory,
    /// The user's reply.
    reply: String,
}

impl ClaimedReply {
    pub fn run_id(&self) -> &str {
        &self.history.run_id
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }
}

/// What a keyed start ([`Runtime::accept_once`]) did: accepted a new run, or found the run the
/// first start with its key accepted.
#[derive(Debug, Clone)]
pub enum Started {
    New(AcceptedRun),
    Replayed(Box<StoredRun>),
}

/// What [`Runtime::run_recorded_once`] did: ran the route, or found the key's run (as it is now:
/// ended or asking, unless the call was cancelled while it waited).
#[derive(Debug)]
pub enum RecordedOnce {
    Ran(Box<RunOutcome>),
    Replayed(Box<StoredRun>),
}

/// An accepted run: its id, and its lease when this process claimed it at once.
#[derive(Debug, Clone)]
pub struct AcceptedRun {
    pub run_id: String,
    pub lease: Option<Lease>,
    /// The session's live runs it interrupted (a cancel is requested on each; `interrupt`).
    pub interrupted: Vec<String>,
}

/// A run this process claimed from the store ([`Runtime::claim_runs`]), to [`Runtime::resume`].
#[derive(Debug)]
pub struct ClaimedRun {
    lease: Lease,
    route_id: String,
    /// The start contract, or why it does not read.
    request: Result<StartRequest, serde_json::Error>,
    /// A cancel request's reason: the run is ended `cancelled`, not resumed.
    cancel: Option<String>,
}

impl ClaimedRun {
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    pub fn route_id(&self) -> &str {
        &self.route_id
    }

    /// Whether another process held the run before (it is taken over, not started).
    pub fn is_takeover(&self) -> bool {
        self.lease.token > 1
    }
}

/// A run's journal and the `seq` its next event gets, as a run taken up again needs them.
async fn read_history(store: &dyn RunStore, run_id: &str) -> Result<RunHistory, StoreError> {
    Ok(RunHistory { run_id: run_id.to_owned(), entries: store.journal(run_id).await?, next_seq: store.next_seq(run_id).await? })
}

/// How many times a run may be taken over before the next claim fails it instead: a run that
/// takes its process down with it (a panic, memory) must not take the fleet down one by one.
pub const MAX_TAKEOVERS: i64 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validate_takes_the_stage_path() {
        let schema = serde_json::json!({"type": "object", "properties": {"text": {"type": "string"}}});
        assert_eq!(validate(&schema, r#"{"text": "hi", "x": 1}"#), Validation::Accepted("hi".into()));
        let refused = validate(&schema, "not json");
        assert!(matches!(refused, Validation::Refused { class: crate::failure::ReasonClass::InvalidJson, .. }), "{refused:?}");
        let nested = serde_json::json!({"type": "object", "properties": {"a": {"type": "object"}}});
        assert!(matches!(validate(&nested, "anything"), Validation::PlainText { ref text, .. } if text == "anything"));
    }

    #[test]
    fn the_tool_timeouts_are_the_documented_ones() {
        // Defined once (`vocab`), for in-process and HTTP tools alike.
        assert_eq!(crate::config::DEFAULT_TOOL_TIMEOUT_MS, 10_000);
        assert_eq!(crate::catalogue::DEFAULT_TOOL_TIMEOUT_MS, 10_000);
        assert_eq!(crate::config::MAX_TOOL_TIMEOUT_MS, 600_000);
    }
}
