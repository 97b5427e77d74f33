//! The route catalogue: files under `routes/` and `prompt-packs/` → validated, hydrated routes.
//!
//! Loading never stops at the first problem. Each file is parsed into a located YAML tree
//! ([`yaml`]), each definition decoded on its own ([`decode`]), then cross-references are
//! checked. A definition with errors makes only the routes that use it unrunnable; every other
//! route loads. All problems are kept as [`Diagnostic`]s in file and position order.

mod decode;
pub mod defs;
pub mod load;
pub mod yaml;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;

pub use decode::{DEFAULT_MAX_LOOP_STEPS, DEFAULT_MAX_RESPONSE_BYTES, DEFAULT_TOOL_TIMEOUT_MS};
pub use load::{SourceFile, load, load_from_texts};

use crate::diag::{Diagnostic, Diagnostics, Pos};
use crate::hydrate::Route;

/// How a workflow stage executes. The set is closed: an unknown role is a load error and the
/// routes using it cannot run; it never falls back to another role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LlmRole {
    None,
    Classify,
    Synthesis,
    QueryFormulation,
}

impl LlmRole {
    pub fn parse(s: &str) -> Option<LlmRole> {
        match s {
            "none" => Some(LlmRole::None),
            "classify" => Some(LlmRole::Classify),
            "synthesis" => Some(LlmRole::Synthesis),
            "query_formulation" => Some(LlmRole::QueryFormulation),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LlmRole::None => "none",
            LlmRole::Classify => "classify",
            LlmRole::Synthesis => "synthesis",
            LlmRole::QueryFormulation => "query_formulation",
        }
    }

    pub fn calls_model(self) -> bool {
        self != LlmRole::None
    }
}

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
    routes: IndexMap<String, RouteEntry>,
    profiles: IndexMap<String, defs::ProfileDef>,
    diagnostics: Vec<Diagnostic>,
    /// Catalogue files (and directories) that could not be read or parsed at all: the routes
    /// in them are missing, and each is named wherever a missing route is reported.
    unloaded: Vec<Diagnostic>,
}

impl Catalogue {
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
    pub fn profiles(&self) -> impl Iterator<Item = (&String, &defs::ProfileDef)> {
        self.profiles.iter()
    }

    pub fn diagnostics(&self) -> &[Diagnostic] {
        &self.diagnostics
    }

    pub fn error_count(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.is_error()).count()
    }
}

#[derive(Debug)]
pub enum RouteLookupError<'a> {
    Unknown { known: Vec<&'a str>, unloaded: &'a [Diagnostic] },
    Broken(&'a BrokenRoute),
}

/// Every `*.yaml` / `*.yml` file below `dir`, sorted, so loading is deterministic. Hidden
/// entries (`.git`, Kubernetes' `..data` of a mounted ConfigMap) are skipped, and a directory
/// reached twice through symlinks is read once.
pub fn yaml_files(dir: &Path, diags: &mut Diagnostics) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut visited = std::collections::HashSet::new();
    while let Some(d) = stack.pop() {
        if !visited.insert(std::fs::canonicalize(&d).unwrap_or_else(|_| d.clone())) {
            continue;
        }
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(err) => {
                diags.error(&d, Pos::FILE, format!("cannot read directory: {err}"));
                continue;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
            } else if matches!(path.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Largest catalogue, pack or stub file accepted; bigger files are refused rather than parsed.
pub const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Reads one catalogue file (a regular file of at most [`MAX_FILE_BYTES`]); a problem becomes a
/// diagnostic on the file.
pub fn read_text(path: &Path, diags: &mut Diagnostics) -> Option<String> {
    match crate::textfile::read_bounded(path, MAX_FILE_BYTES) {
        Ok(text) => Some(text),
        Err(e) => {
            diags.error(path, Pos::FILE, format!("file {e}"));
            None
        }
    }
}
