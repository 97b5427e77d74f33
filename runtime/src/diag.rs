//! Located diagnostics: every problem found while loading files, as `path:line:col: message`.
//!
//! Loaders never stop at the first problem; they push into a [`Diagnostics`] collector and carry
//! on, so one `fabric routes check` shows everything that is wrong at once.

use std::fmt;
use std::path::{Path, PathBuf};

/// A 1-based position in a source file. `line == 0` means "the file as a whole".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl Pos {
    pub const FILE: Pos = Pos { line: 0, col: 0 };
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    Error,
    Warning,
}

/// One problem in one file. `Display` gives `path:line:col: message` (warnings say so).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub path: PathBuf,
    pub pos: Pos,
    pub severity: Severity,
    pub message: String,
}

impl Diagnostic {
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let line = self.pos.line.max(1);
        let col = self.pos.col.max(1);
        write!(f, "{}:{line}:{col}: ", self.path.display())?;
        if self.severity == Severity::Warning {
            f.write_str("warning: ")?;
        }
        f.write_str(&self.message)
    }
}

/// Collects diagnostics for one file at a time (`path` is the file being read).
#[derive(Debug, Default)]
pub struct Diagnostics {
    items: Vec<Diagnostic>,
}

impl Diagnostics {
    pub fn error(&mut self, path: &Path, pos: Pos, message: impl Into<String>) {
        self.push(path, pos, Severity::Error, message.into());
    }

    pub fn warning(&mut self, path: &Path, pos: Pos, message: impl Into<String>) {
        self.push(path, pos, Severity::Warning, message.into());
    }

    fn push(&mut self, path: &Path, pos: Pos, severity: Severity, message: String) {
        self.items.push(Diagnostic { path: path.to_path_buf(), pos, severity, message });
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    pub fn error_count_since(&self, mark: usize) -> usize {
        self.items[mark..].iter().filter(|d| d.is_error()).count()
    }

    pub fn since(&self, mark: usize) -> &[Diagnostic] {
        &self.items[mark..]
    }

    pub fn into_vec(mut self) -> Vec<Diagnostic> {
        // Stable, reader-friendly order: by file, then position; insertion order breaks ties.
        self.items.sort_by(|a, b| (&a.path, a.pos).cmp(&(&b.path, b.pos)));
        self.items
    }
}
