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

/// Directories read as one, in order, written `a:b` as `PATH` is: a later one adds files to the
/// earlier ones (a team's routes beside the shipped profiles). Never empty, no empty entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layers(Vec<PathBuf>);

impl Layers {
    /// One directory (a path with a `:` in it stays one path).
    pub fn one(dir: impl Into<PathBuf>) -> Layers {
        Layers(vec![dir.into()])
    }

    /// These directories, in order; refused when there is none or one is empty.
    pub fn new(dirs: Vec<PathBuf>) -> Result<Layers, LayersError> {
        if dirs.is_empty() {
            return Err(LayersError::NoDirectory);
        }
        // An empty entry would read the working directory, as an empty entry of `PATH` does:
        // nobody means that by a stray `:`.
        if let Some(i) = dirs.iter().position(|d| d.as_os_str().is_empty()) {
            return Err(LayersError::EmptyEntry { number: i + 1, of: dirs.len() });
        }
        Ok(Layers(dirs))
    }

    /// `a:b:c`: directories separated by `:`.
    pub fn parse(list: &str) -> Result<Layers, LayersError> {
        Layers::new(list.split(':').map(PathBuf::from).collect()).map_err(|e| LayersError::InList { list: list.to_owned(), problem: Box::new(e) })
    }

    pub fn dirs(&self) -> &[PathBuf] {
        &self.0
    }

    /// The directories that are not there (or are not directories).
    pub fn missing(&self) -> impl Iterator<Item = &Path> {
        self.0.iter().map(PathBuf::as_path).filter(|d| !d.is_dir())
    }

    /// `path` named as a catalogue version keeps it: relative to the first of these directories
    /// it is below (`/`-separated), so that two replicas with the same files in different places
    /// name them alike; a path below none of them as it is.
    pub fn name_of(&self, path: &Path) -> String {
        let rel = self.0.iter().find_map(|d| path.strip_prefix(d).ok()).unwrap_or(path);
        rel.components().map(|c| c.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/")
    }
}

/// A file of a catalogue version: its name (relative to its directory, [`Layers::name_of`]) and
/// its text, as the run store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct NamedText {
    pub name: String,
    pub text: String,
}

impl NamedText {
    /// The source file a rebuilt catalogue reads it as: its name is its path.
    pub fn to_source(&self) -> SourceFile {
        SourceFile { path: PathBuf::from(&self.name), text: self.text.clone() }
    }
}

/// Why directories are no [`Layers`] (`--catalogue`, `catalogue=` of the Python package).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayersError {
    #[error("no directory given")]
    NoDirectory,
    /// Entry `number` (from 1) of `of` is empty.
    #[error("directory {number} of {of} is empty (a stray `:`?)")]
    EmptyEntry { number: usize, of: usize },
    /// A list written `a:b` ([`Layers::parse`]), named before what is wrong with it.
    #[error("`{list}`: {problem}")]
    InList { list: String, problem: Box<LayersError> },
}

impl std::str::FromStr for Layers {
    type Err = LayersError;

    fn from_str(s: &str) -> Result<Layers, LayersError> {
        Layers::parse(s)
    }
}

impl std::fmt::Display for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{}", d.display())?;
        }
        Ok(())
    }
}

impl From<&Layers> for Layers {
    fn from(layers: &Layers) -> Layers {
        layers.clone()
    }
}

impl From<PathBuf> for Layers {
    fn from(dir: PathBuf) -> Layers {
        Layers::one(dir)
    }
}

impl From<&PathBuf> for Layers {
    fn from(dir: &PathBuf) -> Layers {
        Layers::one(dir.clone())
    }
}

impl From<&Path> for Layers {
    fn from(dir: &Path) -> Layers {
        Layers::one(dir)
    }
}

/// One path, not split: use [`Layers::parse`] for `a:b`.
impl From<&str> for Layers {
    fn from(dir: &str) -> Layers {
        Layers::one(dir)
    }
}

/// Reads every YAML file of every layer, the layers in order and each one's files sorted. A file
/// reached through two layers (`routes:routes`, or a layer inside another) is read once, where
/// it is first reached: reading it again would make each of its names a duplicate of itself.
pub fn read_layers(layers: &Layers, diags: &mut Diagnostics, unloaded: &mut Vec<Diagnostic>) -> Vec<SourceFile> {
    let mut seen = std::collections::HashSet::new();
    let mut paths = Vec::new();
    for dir in layers.dirs() {
        let mark = diags.len();
        let found = yaml_files(dir, diags);
        unloaded.extend(diags.since(mark).iter().cloned());
        paths.extend(found.into_iter().filter(|p| seen.insert(std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))));
    }
    read_paths(paths, diags, unloaded)
}

/// Every YAML file of every layer as [`read_layers`] reads it, named as a catalogue version
/// keeps it ([`Layers::name_of`]); problems are left to the load that follows.
pub fn read_named(layers: &Layers) -> Vec<NamedText> {
    let files = read_layers(layers, &mut Diagnostics::default(), &mut Vec::new());
    files.into_iter().map(|f| NamedText { name: layers.name_of(&f.path), text: f.text }).collect()
}

/// Reads every YAML file below `dir`; unreadable ones are reported, listed in `unloaded` and
/// skipped (a missing directory too).
pub fn read_sources(dir: &Path, diags: &mut Diagnostics, unloaded: &mut Vec<Diagnostic>) -> Vec<SourceFile> {
    let mark = diags.len();
    let paths = yaml_files(dir, diags);
    unloaded.extend(diags.since(mark).iter().cloned());
    read_paths(paths, diags, unloaded)
}

fn read_paths(paths: Vec<PathBuf>, diags: &mut Diagnostics, unloaded: &mut Vec<Diagnostic>) -> Vec<SourceFile> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_are_written_as_path_is_and_never_empty() {
        let l = Layers::parse("routes:../team-routes").unwrap();
        assert_eq!(l.dirs(), [PathBuf::from("routes"), PathBuf::from("../team-routes")]);
        assert_eq!(l.to_string(), "routes:../team-routes");
        assert_eq!(Layers::parse("routes").unwrap(), Layers::one("routes"));
        // A single path is never split: only `parse` reads `:`.
        assert_eq!(Layers::from("a:b").dirs(), [PathBuf::from("a:b")]);
        assert_eq!(Layers::parse("a::b").unwrap_err().to_string(), "`a::b`: directory 2 of 3 is empty (a stray `:`?)");
        assert_eq!(Layers::parse("").unwrap_err().to_string(), "``: directory 1 of 1 is empty (a stray `:`?)");
        assert!(Layers::new(vec![]).is_err());
    }

    #[test]
    fn a_file_reached_through_two_layers_is_read_once() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        std::fs::write(dir.path().join("a.yaml"), "routes: {}\n").unwrap();
        std::fs::write(sub.join("b.yaml"), "routes: {}\n").unwrap();
        let layers = Layers::new(vec![dir.path().into(), sub.clone(), dir.path().into()]).unwrap();
        let (mut diags, mut unloaded) = (Diagnostics::default(), Vec::new());
        let files: Vec<PathBuf> = read_layers(&layers, &mut diags, &mut unloaded).into_iter().map(|f| f.path).collect();
        assert_eq!(files, [dir.path().join("a.yaml"), sub.join("b.yaml")]);
        assert!(diags.is_empty() && unloaded.is_empty());
    }
}
