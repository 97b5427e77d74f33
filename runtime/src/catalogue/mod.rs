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
            None => Err(RouteLookupError::Unknown { known: self.routes.keys().map(String::as_str).collect() }),
        }
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
    Unknown { known: Vec<&'a str> },
    Broken(&'a BrokenRoute),
}

/// Every `*.yaml` / `*.yml` file below `dir`, sorted, so loading is deterministic.
pub fn yaml_files(dir: &Path, diags: &mut Diagnostics) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(err) => {
                diags.error(&d, Pos::FILE, format!("cannot read directory: {err}"));
                continue;
            }
        };
        for entry in entries.flatten() {
            let path = entry.path();
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

/// Largest catalogue or pack file accepted; bigger files are refused rather than parsed.
const MAX_FILE_BYTES: u64 = 4 * 1024 * 1024;

pub fn read_text(path: &Path, diags: &mut Diagnostics) -> Option<String> {
    match std::fs::metadata(path) {
        Ok(m) if m.len() > MAX_FILE_BYTES => {
            diags.error(path, Pos::FILE, format!("file is {} bytes; the limit is {MAX_FILE_BYTES}", m.len()));
            return None;
        }
        _ => {}
    }
    match std::fs::read(path) {
        Ok(bytes) => match String::from_utf8(bytes) {
            Ok(text) => Some(text),
            Err(e) => {
                diags.error(path, Pos::FILE, format!("file is not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()));
                None
            }
        },
        Err(err) => {
            diags.error(path, Pos::FILE, format!("cannot read file: {err}"));
            None
        }
    }
}
