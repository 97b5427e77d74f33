//! An edition: one catalogue version as this process runs it (the catalogue, the stub's scripts
//! where the stub answers, the runner over them), and what every edition of a runtime shares
//! ([`Parts`]: the provider's stacks, the tools, the tool client). A runtime runs new runs on its
//! current edition; a run recorded on another version finishes on that version's edition, rebuilt
//! from the sources the store keeps ([`Runtime::rebuild`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::building::{BuildError, DEFAULT_STUB_DIR, check_scripts, check_tpm, profile_stacks};
use super::{Problems, Runtime, StartError};
use crate::catalogue::Catalogue;
use crate::config::Settings;
use crate::exec::{ProfileStack, RunIds, Runner, VarLookup};
use crate::hydrate::Route;
use crate::llm::flow::Flow;
use crate::llm::stub::StubLlm;
use crate::llm::{Llm, stack};
use crate::tools::{HttpPort, Tool};
use crate::version::{CatalogueVersion, Sources};

/// A catalogue version as this process runs it (see the module docs).
pub struct Edition {
    version: CatalogueVersion,
    sources: Sources,
    runner: Runner,
    stub: Option<StubLlm>,
}

impl std::fmt::Debug for Edition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Edition").field("version", &self.version).field("runner", &self.runner).finish_non_exhaustive()
    }
}

impl Edition {
    pub fn version(&self) -> &CatalogueVersion {
        &self.version
    }

    /// What it is made of, as the store keeps it.
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

    pub fn catalogue(&self) -> &Arc<Catalogue> {
        self.runner.catalogue()
    }

    pub(super) fn runner(&self) -> &Runner {
        &self.runner
    }

    pub(super) fn stub(&self) -> Option<&StubLlm> {
        self.stub.as_ref()
    }

    /// The routes whose runs this process may claim on this edition: those
    /// [`Edition::check_route`] accepts.
    pub fn claimable_routes(&self) -> impl Iterator<Item = &str> {
        self.catalogue().routes().filter_map(|entry| match entry {
            crate::catalogue::RouteEntry::Ready(r) if self.check_route(r.id()).is_ok() => Some(r.id()),
            _ => None,
        })
    }

    /// Checks that `route_id` can start on this edition: it exists and is not broken, this fleet
    /// serves it, its in-process tools are registered, its model profile is usable, its stub
    /// script loaded.
    pub fn check_route(&self, route_id: &str) -> Result<&Arc<Route>, StartError> {
        let route = self.runner.route(route_id)?;
        if let Some(problems) = self.stub.as_ref().and_then(|s| s.problems(route_id)) {
            return Err(StartError::StubScriptBroken { route: route_id.to_owned(), problems: Problems(problems.to_vec()) });
        }
        Ok(route)
    }
}

/// Where a runtime's stub comes from, edition after edition.
pub(super) enum StubSource {
    /// No stub: a provider or an embedder's backend answers.
    None,
    /// The embedder's, used as it is by every edition (its scripts are code, not files).
    Given(StubLlm),
    /// Scripts from this directory (`stub/` when it exists, else none): read again by a reload,
    /// rebuilt from a version's sources for a run recorded on it.
    Scripts(Option<PathBuf>),
}

/// What every edition of a runtime shares.
pub(super) struct Parts {
    /// The stack of the provider or of the embedder's backend; `None` when the stub answers.
    pub llm: Option<Arc<dyn Llm>>,
    /// The client of the profiles' stacks (a provider with `FABRIC_HONOR_MODEL_PROFILE`).
    pub client: Option<reqwest::Client>,
    pub stub: StubSource,
    pub http: Arc<dyn HttpPort>,
    pub vars: VarLookup,
    pub tools: HashMap<String, Arc<dyn Tool>>,
    pub ids: Option<RunIds>,
    /// The MCP servers of every edition's catalogue: one client each, for the process.
    pub mcp: crate::tools::mcp::McpServers,
    /// The client of A2A agents called as tools.
    pub a2a: Arc<dyn crate::tools::a2a::A2aPort>,
}

impl Parts {
    /// The stub's scripts as this runtime reads them now (at its build, at a reload), before
    /// they are tuned; warnings say what is missing.
    pub fn read_stub(&self, warnings: &mut Vec<String>) -> Result<Option<StubLlm>, BuildError> {
        Ok(match &self.stub {
            StubSource::None => None,
            StubSource::Given(s) => Some(s.clone()),
            StubSource::Scripts(Some(dir)) => Some(load_stub(dir)?),
            StubSource::Scripts(None) if Path::new(DEFAULT_STUB_DIR).is_dir() => Some(load_stub(Path::new(DEFAULT_STUB_DIR))?),
            StubSource::Scripts(None) => {
                warnings.push(format!("no stub script directory `{DEFAULT_STUB_DIR}` here; every stub reply is generated from the stage's schema"));
                Some(StubLlm::default())
            }
        })
    }

    /// The stub's scripts as [`Parts::read_stub`] would read them now, for the version on disk.
    pub fn stub_on_disk(&self) -> Option<Vec<crate::source::NamedText>> {
        match &self.stub {
            StubSource::None => None,
            StubSource::Given(s) => Some(s.texts().to_vec()),
            StubSource::Scripts(dir) => Some(stub_scripts_on_disk(dir.as_deref())),
        }
    }

    /// The stub of a version's sources (its scripts), as [`Parts::read_stub`] would have read it.
    fn stub_of(&self, sources: &Sources) -> Option<StubLlm> {
        match (&self.stub, &sources.stub) {
            (StubSource::None, _) => None,
            (StubSource::Given(s), _) => Some(s.clone()),
            (StubSource::Scripts(_), Some(files)) => Some(StubLlm::from_texts(files)),
            (StubSource::Scripts(_), None) => Some(StubLlm::default()),
        }
    }

    /// An edition of `catalogue` answered by `stub` (as read: scripts get the settings' latency
    /// and strictness, and are checked against the catalogue) or by the shared stack.
    pub fn edition(
        &self,
        settings: &Settings,
        flow: &Flow,
        catalogue: Arc<Catalogue>,
        stub: Option<StubLlm>,
        warnings: &mut Vec<String>,
    ) -> Result<Edition, BuildError> {
        let mut profile_llms: HashMap<String, ProfileStack> = HashMap::new();
        let (llm, stub) = match (&self.llm, stub) {
            (Some(llm), _) => {
                if let Some(client) = self.client.as_ref().filter(|_| settings.honor_model_profile) {
                    profile_llms = profile_stacks(settings, client, catalogue.profiles(), flow);
                }
                (llm.clone(), None)
            }
            (None, stub) => {
                let mut s = stub.unwrap_or_default();
                if !matches!(self.stub, StubSource::Given(_)) {
                    s = s.with_latency(settings.stub_latency).strict(settings.stub_strict);
                    check_scripts(&mut s, &catalogue, warnings)?;
                }
                let gate = flow.gate(&s.info(), false);
                (stack::gated(s.clone(), settings.retry, gate), Some(s))
            }
        };
        check_tpm(flow, &catalogue, &llm, &profile_llms)?;
        let sources =
            Sources { routes: catalogue.texts().routes.clone(), packs: catalogue.texts().packs.clone(), stub: stub.as_ref().map(|s| s.texts().to_vec()) };
        let mut runner = Runner::with_port(catalogue, llm, self.vars.clone(), self.http.clone())
            .with_fleet(settings.fleet.clone())
            .with_profile_llms(profile_llms)
            .with_tool_timeout(settings.tool_timeout)
            .with_mcp(Some(Arc::new(self.mcp.clone())))
            .with_a2a(Some(self.a2a.clone()));
        if let Some(ids) = &self.ids {
            runner = runner.with_run_ids(ids.clone());
        }
        for (name, tool) in &self.tools {
            runner = runner.with_tool(name, tool.clone());
        }
        Ok(Edition { version: sources.version(), sources, runner, stub })
    }
}

/// The stub's scripts in `dir` (`stub/` when none is given), named as a version keeps them, read
/// but not loaded; none when the directory is not there.
pub fn stub_scripts_on_disk(dir: Option<&Path>) -> Vec<crate::source::NamedText> {
    let dir = dir.unwrap_or(Path::new(DEFAULT_STUB_DIR));
    if dir.is_dir() { crate::source::read_named(&crate::source::Layers::one(dir)) } else { Vec::new() }
}

fn load_stub(dir: &Path) -> Result<StubLlm, BuildError> {
    StubLlm::load(dir).map_err(|problems| BuildError::Stub(problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")))
}

/// How many editions other than the current one a process keeps built (runs in flight hold
/// theirs anyway): the ones replaced by the last reloads and rebuilt for runs recorded on them.
pub const KEPT_EDITIONS: usize = 8;

impl Runtime {
    /// The edition new runs start on.
    pub fn current(&self) -> Arc<Edition> {
        self.current.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The edition of `version` when this process has it built (the current one, or one kept).
    pub fn built(&self, version: &CatalogueVersion) -> Option<Arc<Edition>> {
        let current = self.current();
        if current.version() == version {
            return Some(current);
        }
        self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().find(|e| e.version() == version).cloned()
    }

    /// The edition of a version's `sources` (read from the store for a run recorded on it),
    /// built as this runtime builds its own and kept for the next run on it. Warnings are
    /// dropped: they were the current edition's when the version was loaded.
    pub fn rebuild(&self, sources: Sources) -> Result<Arc<Edition>, BuildError> {
        let version = sources.version();
        if let Some(built) = self.built(&version) {
            return Ok(built);
        }
        let texts = crate::catalogue::Texts { routes: sources.routes.clone(), packs: sources.packs.clone() };
        let catalogue = super::building::listed(Catalogue::rebuild(&texts), &self.parts.mcp, |l| Catalogue::rebuild_listed(&texts, Some(l)));
        let stub = self.parts.stub_of(&sources);
        let edition = Arc::new(self.parts.edition(&self.settings, &self.flow, Arc::new(catalogue), stub, &mut Vec::new())?);
        self.keep_built(edition.clone());
        Ok(edition)
    }

    /// The editions built other than the current one.
    pub fn others(&self) -> Vec<Arc<Edition>> {
        self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Keeps `edition` among the built ones, forgetting the oldest past [`KEPT_EDITIONS`].
    pub(super) fn keep_built(&self, edition: Arc<Edition>) {
        let mut others = self.others.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        others.retain(|e| e.version() != edition.version());
        others.push(edition);
        let excess = others.len().saturating_sub(KEPT_EDITIONS);
        others.drain(..excess);
    }
}
