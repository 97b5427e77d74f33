//! The route catalogue: what [`crate::loader`] decoded, hydrated into runnable routes.
//!
//! Every route is either ready (a [`Route`] graph) or broken (with every problem that stands in
//! its way); one broken definition only breaks the routes that use it. All problems are kept as
//! [`Diagnostic`]s in file and position order, and files that could not be loaded at all are
//! named wherever a route goes missing.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;

pub use crate::loader::decode::{DEFAULT_MAX_LOOP_STEPS, DEFAULT_MAX_RESPONSE_BYTES};
pub use crate::source::{Layers, SourceFile};
pub use crate::vocab::DEFAULT_TOOL_TIMEOUT_MS;

use crate::defs::{McpListings, McpServerDef, ProfileDef};
use crate::diag::{Diagnostic, Pos};
use crate::hydrate::Route;
use crate::loader::{self, Loaded};
use crate::source::NamedText;

/// A route that could not be built, with every problem that stands in its way.
#[derive(Debug, Clone)]
pub struct BrokenRoute {
    pub id: String,
    pub path: Arc<PathBuf>,
    pub pos: Pos,
    pub problems: Vec<Diagnostic>,
}

#[derive(Debug, Clone)]
pub enum RouteEntry {
    Ready(Arc<Route>),
    Broken(BrokenRoute),
}

/// The loaded catalogue: every route, runnable or not, and every diagnostic.
#[derive(Debug, Default)]
pub struct Catalogue {
    /// Looked up by every run: a fast hasher (route ids are configuration).
    routes: IndexMap<String, RouteEntry, foldhash::fast::RandomState>,
    profiles: IndexMap<String, ProfileDef>,
    diagnostics: Vec<Diagnostic>,
    /// Catalogue files (and directories) that could not be read or parsed at all: the routes
    /// in them are missing, and each is named wherever a missing route is reported.
    unloaded: Vec<Diagnostic>,
    /// The route files and prompt packs it was loaded from, named as a version keeps them.
    texts: Texts,
    /// The MCP servers its files declare (those without errors).
    mcp_servers: IndexMap<String, McpServerDef>,
}

/// The route files and prompt packs a catalogue was loaded from, each in the order loading took
/// them, named relative to their directory ([`Layers::name_of`]): the catalogue's part of its
/// version ([`crate::version::Sources`]), from which [`Catalogue::rebuild`] loads it again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Texts {
    pub routes: Vec<NamedText>,
    pub packs: Vec<NamedText>,
}

impl Catalogue {
    /// What it was loaded from.
    pub fn texts(&self) -> &Texts {
        &self.texts
    }

    /// The catalogue `texts` make, as [`load_from_texts`] loads it (each file's name its path).
    pub fn rebuild(texts: &Texts) -> Catalogue {
        Catalogue::rebuild_listed(texts, None)
    }

    /// [`Catalogue::rebuild`] with the MCP servers' tool lists.
    pub fn rebuild_listed(texts: &Texts, listings: Option<&McpListings>) -> Catalogue {
        let sources = |files: &[NamedText]| files.iter().map(NamedText::to_source).collect::<Vec<_>>();
        load_from_texts_listed(&sources(&texts.routes), &sources(&texts.packs), listings)
    }

    /// The MCP servers the catalogue declares (`mcp_servers`), those without errors.
    pub fn mcp_servers(&self) -> &IndexMap<String, McpServerDef> {
        &self.mcp_servers
    }

    pub fn routes(&self) -> impl Iterator<Item = &RouteEntry> {
        self.routes.values()
    }

    pub fn get(&self, id: &str) -> Option<&RouteEntry> {
        self.routes.get(id)
    }

    /// A runnable route, or why not.
    pub fn route(&self, id: &str) -> Result<&Arc<Route>, RouteLookupError<'_>> {
        match self.routes.get(id) {
            Some(RouteEntry::Ready(r)) => Ok(r),
            Some(RouteEntry::Broken(b)) => Err(RouteLookupError::Broken(b)),
            None => Err(RouteLookupError::Unknown { known: self.routes.keys().map(String::as_str).collect(), unloaded: &self.unloaded }),
        }
    }

    /// Files and directories of the catalogue that could not be read or parsed.
    pub fn unloaded(&self) -> &[Diagnostic] {
        &self.unloaded
    }

    /// The model profiles that loaded without errors.
    pub fn profiles(&self) -> impl Iterator<Item = (&String, &ProfileDef)> {
        self.profiles.iter()
    }

    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.diagnostics
    }

    pub fn error_count(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }
}

/// How many names [`name_list`] shows before it only counts the rest.
pub const LISTED_NAMES: usize = 20;

/// Names for a message ("unknown route `x`; known routes: ..."): at most [`LISTED_NAMES`], then
/// "and N more", so a catalogue of a thousand routes does not make a thousand-name message.
pub fn name_list(names: &[&str]) -> String {
    if names.is_empty() {
        return "none".into();
    }
    let shown = names[..names.len().min(LISTED_NAMES)].join(", ");
    match names.len().saturating_sub(LISTED_NAMES) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

#[derive(Debug)]
pub enum RouteLookupError<'a> {
    Unknown { known: Vec<&'a str>, unloaded: &'a [Diagnostic] },
    Broken(&'a BrokenRoute),
}

/// Loads the catalogue below `catalogue_dir` with the prompt packs of `packs_dir`.
pub fn load(catalogue_dir: &Path, packs_dir: &Path) -> Catalogue {
    load_layers(&Layers::one(catalogue_dir), &Layers::one(packs_dir))
}

/// Loads the catalogue of several directories (later ones adding definitions to the earlier
/// ones) with the prompt packs of several directories. A name defined in two of them is refused
/// at both places, as one defined twice in one directory is.
pub fn load_layers(catalogue: &Layers, packs: &Layers) -> Catalogue {
    load_layers_listed(catalogue, packs, None)
}

/// [`load_layers`] with the MCP servers' tool lists (the tools of `tools_from`, the schemas of
/// `invoke.mcp`, and a tool the servers do not have reported where a route names it).
pub fn load_layers_listed(catalogue: &Layers, packs: &Layers, listings: Option<&McpListings>) -> Catalogue {
    let (loaded, files, pack_files) = loader::load_dirs(catalogue, packs);
    let named = |layers: &Layers, files: Vec<SourceFile>| files.into_iter().map(|f| NamedText { name: layers.name_of(&f.path), text: f.text }).collect();
    let texts = Texts { routes: named(catalogue, files), packs: named(packs, pack_files) };
    Catalogue::from_loaded(loaded, texts, listings)
}

/// Which directory setting a [`MissingDir`] is of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirKind {
    Catalogue,
    PromptPacks,
}

/// A catalogue or prompt pack directory that does not exist: loading it would give an empty
/// catalogue whose every route is "unknown", far from the setting that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} directory `{}` does not exist", match kind { DirKind::Catalogue => "catalogue", DirKind::PromptPacks => "prompt pack" }, dir.display())]
pub struct MissingDir {
    pub kind: DirKind,
    pub dir: PathBuf,
}

/// Every directory of `catalogue` and `packs` that does not exist, all at once.
pub fn missing_dirs(catalogue: &Layers, packs: &Layers) -> Vec<MissingDir> {
    let of = |kind, layers: &Layers| layers.missing().map(move |d| MissingDir { kind, dir: d.to_path_buf() }).collect::<Vec<_>>();
    let mut out = of(DirKind::Catalogue, catalogue);
    out.extend(of(DirKind::PromptPacks, packs));
    out
}

/// Loads a catalogue from texts already in memory (benchmarks, fuzzing, embedders).
pub fn load_from_texts(files: &[SourceFile], packs: &[SourceFile]) -> Catalogue {
    load_from_texts_listed(files, packs, None)
}

/// [`load_from_texts`] with the MCP servers' tool lists.
pub fn load_from_texts_listed(files: &[SourceFile], packs: &[SourceFile], listings: Option<&McpListings>) -> Catalogue {
    let named = |files: &[SourceFile]| files.iter().map(|f| NamedText { name: f.path.to_string_lossy().into_owned(), text: f.text.clone() }).collect();
    Catalogue::from_loaded(loader::load_texts(files, packs), Texts { routes: named(files), packs: named(packs) }, listings)
}

impl Catalogue {
    /// Hydrates every route of the loaded definitions; a route that cannot be built keeps every
    /// problem that stands in its way.
    fn from_loaded(loaded: Loaded, texts: Texts, listings: Option<&McpListings>) -> Catalogue {
        let Loaded { defs, mut diags, unloaded } = loaded;
        let mut routes = IndexMap::with_hasher(foldhash::fast::RandomState::default());
        let route_ids: Vec<String> = defs.routes.keys().cloned().collect();
        for id in route_ids {
            let entry = match &defs.routes[&id] {
                Ok(def) => {
                    let mark = diags.len();
                    let built = crate::hydrate::build(&id, def, &defs, listings, &mut diags);
                    let own = diags.since(mark).to_vec();
                    match built {
                        Ok(route) if own.iter().all(|d| !d.is_error()) => RouteEntry::Ready(Arc::new(route)),
                        result => {
                            let mut problems = def.origin.problems.clone();
                            problems.extend(own);
                            if let Err(inherited) = result {
                                problems.extend(inherited);
                            }
                            RouteEntry::Broken(BrokenRoute {
                                id: id.clone(),
                                path: def.origin.path.clone(),
                                pos: def.origin.pos,
                                problems: errors_only(problems),
                            })
                        }
                    }
                }
                Err(origin) => RouteEntry::Broken(BrokenRoute {
                    id: id.clone(),
                    path: origin.path.clone(),
                    pos: origin.pos,
                    problems: errors_only(origin.problems.clone()),
                }),
            };
            routes.insert(id, entry);
        }
        let profiles = defs.profiles.into_iter().filter_map(|(name, p)| p.ok().filter(|p| !p.origin.is_broken()).map(|p| (name, p))).collect();
        let mcp_servers = defs.mcp_servers.into_iter().filter_map(|(name, s)| s.ok().filter(|s| !s.origin.is_broken()).map(|s| (name, s))).collect();
        Catalogue { routes, profiles, diagnostics: diags.into_vec(), unloaded, texts, mcp_servers }
    }
}

fn errors_only(mut problems: Vec<Diagnostic>) -> Vec<Diagnostic> {
    problems.retain(Diagnostic::is_error);
    problems.dedup();
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(files: &[(&str, &str)]) -> Catalogue {
        let files: Vec<SourceFile> = files.iter().map(|(p, t)| SourceFile { path: (*p).into(), text: (*t).into() }).collect();
        load_from_texts(&files, &[SourceFile { path: "packs/s.yaml".into(), text: "host: H\n".into() }])
    }

    const BASE: &str = "profiles: {p: {}}\ncapabilities: {c: {}}\nworkflows: {w: {stages: [{id: a, llm_role: classify, capability: c}]}}\n";

    #[test]
    fn routes_are_ready_or_broken_with_their_problems() {
        let cat = load(&[
            ("r/base.yaml", BASE),
            ("r/routes.yaml", "routes:\n  ok: {model_profile: p, prompt_pack: s, workflow: w}\n  bad: {model_profile: nope, prompt_pack: s, workflow: w}\n"),
        ]);
        assert!(matches!(cat.route("ok"), Ok(r) if r.id() == "ok"));
        match cat.route("bad") {
            Err(RouteLookupError::Broken(b)) => assert!(b.problems[0].message.contains("model_profile `nope` is not defined"), "{:?}", b.problems),
            other => panic!("{other:?}"),
        }
        assert!(matches!(cat.route("nope"), Err(RouteLookupError::Unknown { known, .. }) if known == ["ok", "bad"]));
        assert_eq!(cat.error_count(), 1);
        assert_eq!(cat.profiles().count(), 1);
    }

    #[test]
    fn a_name_defined_twice_breaks_what_uses_it_and_an_unparsable_file_is_named() {
        let cat = load(&[
            ("r/base.yaml", BASE),
            ("r/more.yaml", "capabilities: {c: {}}\nroutes: {r: {model_profile: p, prompt_pack: s, workflow: w}}\n"),
            ("r/broken.yaml", "routes: {x: [\n"),
        ]);
        assert!(matches!(cat.route("r"), Err(RouteLookupError::Broken(_))), "the workflow uses the duplicated capability");
        assert_eq!(cat.unloaded().len(), 1);
        assert!(cat.unloaded()[0].to_string().starts_with("r/broken.yaml:"), "{}", cat.unloaded()[0]);
        match cat.route("x") {
            Err(RouteLookupError::Unknown { unloaded, .. }) => assert_eq!(unloaded.len(), 1),
            other => panic!("{other:?}"),
        }
    }
}
