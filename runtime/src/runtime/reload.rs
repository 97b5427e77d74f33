//! Loading the catalogue again without a restart ([`Runtime::reload`]): the directories it was
//! built from are read again, with the stub's scripts where the stub answers. A catalogue with
//! any problem (an error or a warning of its files, a stub script that does not read) is
//! refused whole and the current edition stays; a good one becomes the current
//! edition at once, whole (new runs start on it), and the one it replaces stays built for the
//! runs still on it.

use std::sync::Arc;

use super::Runtime;
use crate::catalogue;
use crate::version::CatalogueVersion;

/// What a reload did.
#[derive(Debug, Clone)]
pub struct Reloaded {
    /// The version in force now.
    pub version: CatalogueVersion,
    /// The version before the reload (the same when nothing changed).
    pub previous: CatalogueVersion,
    /// Problems that do not refuse a catalogue (a stub script key naming no stage, say).
    pub warnings: Vec<String>,
}

impl Reloaded {
    /// Whether the reload changed the version (the files read are not those of the current one).
    pub fn changed(&self) -> bool {
        self.version != self.previous
    }
}

/// Why a reload changed nothing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ReloadError {
    #[error("the catalogue was not loaded from directories here, so there is nothing to load again")]
    NotFromDirs,
    /// Every problem found, each located (`path:line:col: message`) where it has a place.
    #[error("the catalogue was refused ({} problem(s)); version {} stays in force", problems.len(), kept.short())]
    Refused { problems: Vec<String>, kept: CatalogueVersion },
}

impl Runtime {
    /// The version the files on disk make now, read but not loaded (what
    /// `FABRIC_CATALOGUE_WATCH` compares with the version in force); `None` when the catalogue
    /// was not loaded from directories.
    pub fn version_on_disk(&self) -> Option<CatalogueVersion> {
        let (dirs, packs) = self.dirs.as_ref()?;
        let sources =
            crate::version::Sources { routes: crate::source::read_named(dirs), packs: crate::source::read_named(packs), stub: self.parts.stub_on_disk() };
        Some(sources.version())
    }

    /// Reads the catalogue (and the stub's scripts) again; see the module docs. One reload at a
    /// time: a second waits for the first. The files are read, parsed and hydrated on a blocking
    /// thread, not the runtime's.
    pub async fn reload(self: &Arc<Self>) -> Result<Reloaded, ReloadError> {
        if self.dirs.is_none() {
            return Err(ReloadError::NotFromDirs);
        }
        let _one = self.reloading.lock().await;
        let runtime = self.clone();
        tokio::task::spawn_blocking(move || runtime.load_again()).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
    }

    fn load_again(&self) -> Result<Reloaded, ReloadError> {
        let Some((dirs, packs)) = &self.dirs else { return Err(ReloadError::NotFromDirs) };
        let previous = self.current();
        let refused = |problems: Vec<String>| ReloadError::Refused { problems, kept: previous.version().clone() };
        let missing = catalogue::missing_dirs(dirs, packs);
        if !missing.is_empty() {
            return Err(refused(missing.iter().map(ToString::to_string).collect()));
        }
        let loaded = super::building::listed(catalogue::load_layers(dirs, packs), &self.parts.mcp, |l| catalogue::load_layers_listed(dirs, packs, Some(l)));
        let mut warnings = Vec::new();
        let read = self.parts.read_stub(&mut warnings);
        let scripts = read.as_ref().ok().cloned().flatten();
        let unchanged = Reloaded { version: previous.version().clone(), previous: previous.version().clone(), warnings: Vec::new() };
        let candidate = crate::version::Sources {
            routes: loaded.texts().routes.clone(),
            packs: loaded.texts().packs.clone(),
            stub: scripts.as_ref().map(|s| s.texts().to_vec()),
        };
        // The files of the version in force: nothing to load, whatever problems it has (it was
        // loaded at the start, where a broken route is refused on its own).
        if read.is_ok() && candidate.version() == *previous.version() {
            return Ok(unchanged);
        }
        // Stricter than a start, which runs every route that builds: a live fleet takes no
        // catalogue with a problem in it, a warning included (an unbindable schema would turn
        // its stages into plain text calls).
        let mut problems: Vec<String> = loaded.diagnostics().iter().map(ToString::to_string).collect();
        if let Err(e) = &read {
            problems.push(e.to_string());
        }
        // The stub's scripts gone from where they were read: every reply would be generated.
        if previous.sources().stub.as_ref().is_some_and(|s| !s.is_empty()) && candidate.stub.as_ref().is_some_and(Vec::is_empty) {
            problems.append(&mut warnings);
            problems.push("the stub's scripts are gone: the version in force has some, the files read have none".into());
        }
        if !problems.is_empty() {
            return Err(refused(problems));
        }
        let edition = self.parts.edition(&self.settings, &self.flow, Arc::new(loaded), scripts, &mut warnings).map_err(|e| refused(vec![e.to_string()]))?;
        // A script broken by its own errors, or (strict stub) by a key naming no stage.
        let broken: Vec<String> = edition.stub().map(|s| s.broken().map(ToString::to_string).collect()).unwrap_or_default();
        if !broken.is_empty() {
            return Err(refused(broken));
        }
        let version = edition.version().clone();
        if version != *previous.version() {
            *self.current.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(edition);
            self.keep_built(previous.clone());
        }
        Ok(Reloaded { version, previous: previous.version().clone(), warnings })
    }
}
