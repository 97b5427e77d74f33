//! Source files: finding the YAML files of a directory and reading them with a bound.
//!
//! A leaf beside [`crate::diag`]: the catalogue, the prompt packs and the stub scripts are all
//! read through it, so each gets the same limits and the same located errors.

use std::path::{Path, PathBuf};

use crate::diag::{Diagnostic, Diagnostics, Pos};

/// One file's path and text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: PathBuf,
    pub text: String,
}

/// Reads every YAML file below `dir`; unreadable ones are reported, listed in `unloaded` and
/// skipped (a missing directory too).
pub fn read_sources(dir: &Path, diags: &mut Diagnostics, unloaded: &mut Vec<Diagnostic>) -> Vec<SourceFile> {
    let mark = diags.len();
    let paths = yaml_files(dir, diags);
    unloaded.extend(diags.since(mark).iter().cloned());
    paths
        .into_iter()
        .filter_map(|path| {
            let mark = diags.len();
            let text = read_text(&path, diags);
            unloaded.extend(diags.since(mark).iter().cloned());
            text.map(|text| SourceFile { path, text })
        })
        .collect()
}

/// Every `*.yaml` / `*.yml` file below `dir`, sorted, so loading is deterministic. Hidden
/// entries (`.git`, Kubernetes' `..data` of a mounted ConfigMap) are skipped, and a directory
/// reached twice through symlinks is read once.
pub fn yaml_files(dir: &Path, diags: &mut Diagnostics) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut visited = std::collections::HashSet::new();
    let root = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    while let Some(d) = stack.pop() {
        let real = std::fs::canonicalize(&d).unwrap_or_else(|_| d.clone());
        if !visited.insert(real.clone()) {
            continue;
        }
        // A symlinked folder may lead anywhere (`ln -s / routes/all`): only the tree below the
        // directory itself is read.
        if !real.starts_with(&root) {
            diags.warning(&d, Pos::FILE, format!("skipped: this folder leads outside {} (a symlink)", dir.display()));
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
