//! Building a [`Runtime`]: the settings, the catalogue (directories, texts or loaded), the stub
//! or the provider stacks (one per model profile when opted in, every one built before any
//! inference, so a missing key stops here), the checks of the stub's scripts and of the TPM
//! limits against the catalogue's prompts, the tools and the tool client.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use super::Runtime;
use super::edition::{Parts, StubSource};
use crate::catalogue::{self, Catalogue, Layers, RouteEntry, SourceFile};
use crate::config::{ConfigError, ProviderKind, ProviderTarget, Settings, Tuning, choose_model};
use crate::defs::ProfileDef;
use crate::diag::{Diagnostic, Pos, Severity};
use crate::exec::{ProfileError, ProfileStack, VarLookup};
use crate::hydrate::NodeKind;
use crate::llm::fallback::ChainPolicy;
use crate::llm::flow::Flow;
use crate::llm::providers::backend_for;
use crate::llm::stub::StubLlm;
use crate::llm::{Llm, stack};
use crate::tools::mcp::McpServers;
use crate::tools::{HttpPort, Tool};

/// `catalogue` as it is when it declares no MCP server; else its servers are connected and
/// listed (`mcp` keeps one client each) and the catalogue is loaded again by `with` with their
/// tool lists, so that its routes show and check the servers' tools.
pub(super) fn listed(catalogue: Catalogue, mcp: &McpServers, with: impl FnOnce(&crate::defs::McpListings) -> Catalogue) -> Catalogue {
    if catalogue.mcp_servers().is_empty() {
        return catalogue;
    }
    let listings = mcp.prepare(catalogue.mcp_servers());
    with(&listings)
}

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

    /// Loads the catalogue, builds every model stack (so a missing key stops here, before any
    /// inference) and the tool client.
    pub fn build(self) -> Result<Runtime, BuildError> {
        let settings = match self.settings {
            Some(s) => s,
            None => Settings::from_env()?,
        };
        let mut warnings = settings.warnings.clone();
        let mut dirs = None;
        let vars = self.vars.unwrap_or_else(|| Arc::new(|k: &str| std::env::var(k).ok()));
        let mcp = {
            let vars = vars.clone();
            McpServers::new(move |k| vars(k))
        };
        let catalogue = match self.catalogue {
            CatalogueSource::Dirs { catalogue, packs } => {
                let missing = catalogue::missing_dirs(&catalogue, &packs);
                if !missing.is_empty() {
                    return Err(BuildError::MissingDirs(missing));
                }
                let loaded = listed(catalogue::load_layers(&catalogue, &packs), &mcp, |l| catalogue::load_layers_listed(&catalogue, &packs, Some(l)));
                dirs = Some((catalogue, packs));
                Arc::new(loaded)
            }
            CatalogueSource::Texts { files, packs } => {
                Arc::new(listed(catalogue::load_from_texts(&files, &packs), &mcp, |l| catalogue::load_from_texts_listed(&files, &packs, Some(l))))
            }
            CatalogueSource::Loaded(c) => {
                // Hydrated by the embedder: its servers are still the process's to call.
                mcp.prepare(c.mcp_servers());
                c
            }
        };
        let flow = Flow::new(settings.flow.clone());
        let (llm, client, stub) = if let Some(backend) = self.backend {
            let gate = flow.gate(&backend.info(), false);
            (Some(stack::gated(backend, settings.retry, gate)), None, StubSource::None)
        } else if let Some(s) = self.stub {
            // A stub given by the embedder is used as it is; one read from scripts takes the
            // latency and strictness of the settings.
            (None, None, StubSource::Given(s))
        } else if settings.stub {
            (None, None, StubSource::Scripts(self.stub_dir))
        } else {
            let client = stack::client().map_err(BuildError::Client)?;
            let llm = provider_stack(&settings, &client, &flow)?;
            (Some(llm), Some(client), StubSource::None)
        };
        let http: Arc<dyn HttpPort> = match self.http {
            Some(http) => http,
            None => Arc::new(crate::tools::HttpTools::new().map_err(BuildError::Client)?),
        };
        let a2a: Arc<dyn crate::tools::a2a::A2aPort> = Arc::new(crate::tools::a2a::A2aAgents::new());
        let parts = Parts { llm, client, stub, http, vars, tools: self.tools, ids: self.run_ids, mcp, a2a };
        let scripts = parts.read_stub(&mut warnings)?;
        let edition = parts.edition(&settings, &flow, catalogue, scripts, &mut warnings)?;
        Ok(Runtime {
            settings,
            warnings,
            flow,
            parts,
            current: std::sync::RwLock::new(Arc::new(edition)),
            others: std::sync::Mutex::new(Vec::new()),
            dirs,
            reloading: tokio::sync::Mutex::new(()),
        })
    }
}

/// Script keys that name nothing the catalogue has: a file named after no route, a stage key
/// that is no stage of its route. The stub would answer such calls with generated replies, so
/// the mistake would pass unseen: warnings, or, with `FABRIC_LLM_STUB_STRICT`, errors (a file
/// of no route stops the build; a stray stage key breaks its route's script). The diagnostics
/// are errors in form either way: a front end says "warning" before a warning's line.
pub(super) fn check_scripts(stub: &mut StubLlm, catalogue: &Catalogue, warnings: &mut Vec<String>) -> Result<(), BuildError> {
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

/// The default provider stack of the configuration (`FABRIC_LLM_MODEL` / `OLLAMA_MODEL`), with
/// its fallbacks (`FABRIC_LLM_FALLBACKS`).
fn provider_stack(settings: &Settings, client: &reqwest::Client, flow: &Flow) -> Result<Arc<dyn Llm>, ConfigError> {
    let target = settings.target.clone().ok_or_else(|| ConfigError { var: settings.model_string.1.to_owned(), message: "no provider is configured".into() })?;
    let first = hosted_member(settings, client, target, Tuning::default(), flow);
    let fallbacks = settings.fallbacks.iter().map(|t| hosted_member(settings, client, t.clone(), Tuning::default(), flow)).collect();
    Ok(stack::chain(first, fallbacks, settings.fallback_policy))
}

/// A provider backend with its retries, through its model's gate: one model of a stack.
fn hosted_member(settings: &Settings, client: &reqwest::Client, target: ProviderTarget, tuning: Tuning, flow: &Flow) -> crate::llm::fallback::Member {
    let backend = backend_for(client.clone(), target, tuning, settings.reply_limits());
    stack::member(backend, settings.retry, flow, true)
}

/// A TPM limit below one call's input could never let that call through: refused at start,
/// naming the limit, the model, and the route and stage whose system prompt alone exceeds it.
pub(super) fn check_tpm(flow: &Flow, catalogue: &Catalogue, llm: &Arc<dyn Llm>, profiles: &HashMap<String, ProfileStack>) -> Result<(), ConfigError> {
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

/// One stack per model profile, all built before any inference: the profile's model, then its
/// fallbacks' chain (`loader::fallbacks::chain`), each a whole profile (provider, model, tuning).
/// A profile that cannot be used here (its key variable, or a fallback's, is unset, say) keeps
/// its error: runs of the routes that use it are refused at start, every other route runs.
pub(super) fn profile_stacks<'a>(
    settings: &Settings,
    client: &reqwest::Client,
    profiles: impl Iterator<Item = (&'a String, &'a ProfileDef)>,
    flow: &Flow,
) -> HashMap<String, ProfileStack> {
    let profiles: HashMap<&str, &ProfileDef> = profiles.map(|(n, p)| (n.as_str(), p)).collect();
    let member = |name: &str| -> Result<crate::llm::fallback::Member, ProfileError> {
        let profile =
            profiles.get(name).ok_or_else(|| ProfileError::NoProvider { profile: format!("model profile `{name}` (a fallback that did not load)") })?;
        profile_target(settings, name, profile).map(|(target, tuning)| hosted_member(settings, client, target, tuning, flow))
    };
    profiles
        .iter()
        .map(|(name, profile)| {
            let chain = crate::defs::fallback_chain(name, |n| profiles.get(n).copied());
            let stack = chain.iter().map(|n| member(n)).collect::<Result<Vec<_>, _>>().map(|mut members| {
                let first = members.remove(0);
                let policy = ChainPolicy { on_invalid: profile.fallbacks.on_invalid, prefer_available: profile.fallbacks.prefer_available };
                stack::chain(first, members, policy)
            });
            ((*name).to_owned(), stack)
        })
        .collect()
}

impl Runtime {
    /// A builder with the defaults ([`RuntimeBuilder`]).
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
            run_ids: None,
        }
    }
}
