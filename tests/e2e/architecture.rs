//! Architecture invariants of `runtime/src`, checked on the source: modules import each other in
//! one direction (data-flow order), the library does no process work, every module has a header.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::repo;

/// Each top-level module of the library, in data-flow order, with the `crate::` modules it may
/// import. A module may only name modules listed above it, so the graph has no cycle; the test
/// below checks both the table and every import.
const LAYERS: &[(&str, &[&str])] = &[
    // Leaves: they import nothing of the crate.
    ("diag", &[]),
    ("textfile", &[]),
    ("redact", &[]),
    ("cancel", &[]),
    ("failure", &[]),
    ("events", &[]),
    ("otel", &["redact"]),
    ("structured", &[]),
    ("decision", &[]),
    // The located vocabulary of source files.
    ("yaml", &["diag"]),
    ("source", &["diag", "textfile"]),
    // The model port and its configuration.
    ("llm", &["diag", "redact", "cancel", "failure", "events", "otel", "structured", "decision", "yaml", "source"]),
    ("config", &["textfile", "redact", "yaml", "llm"]),
    // Files become definitions, prompts resolve, routes become graphs.
    ("defs", &["diag", "llm"]),
    ("prompt", &["diag", "yaml", "source", "defs"]),
    ("loader", &["diag", "structured", "yaml", "source", "llm", "defs", "prompt"]),
    ("hydrate", &["diag", "decision", "llm", "defs", "prompt", "loader"]),
    ("svg", &["defs", "prompt", "hydrate"]),
    ("catalogue", &["diag", "source", "defs", "loader", "hydrate"]),
    // Running them.
    ("tools", &["redact", "failure", "defs"]),
    ("exec", &["cancel", "failure", "events", "otel", "structured", "decision", "llm", "defs", "hydrate", "catalogue", "tools"]),
    ("store", &["redact", "failure", "events", "llm", "exec"]),
    ("runtime", &["cancel", "diag", "failure", "events", "llm", "config", "defs", "hydrate", "catalogue", "tools", "exec", "store"]),
    // The service: HTTP over the facade.
    ("api", &["cancel", "failure", "events", "svg", "catalogue", "exec", "store", "runtime"]),
];

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The top-level module a library file belongs to (`llm/providers/mod.rs` → `llm`).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_str().unwrap();
    first.trim_end_matches(".rs").to_owned()
}

/// Every `crate::NAME` a line names, in paths and in `use crate::{a, b::c}` groups; comments
/// are not code. The `fields!` macro is defined in `events`.
fn crate_refs(line: &str) -> BTreeSet<String> {
    let code = line.split("//").next().unwrap_or_default();
    let mut out = BTreeSet::new();
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            for item in group.split('}').next().unwrap_or_default().split(',') {
                let name = item.trim().split("::").next().unwrap_or_default();
                if !name.is_empty() {
                    out.insert(name.to_owned());
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_ascii_lowercase() || *c == '_').collect();
            out.insert(if name == "fields" { "events".into() } else { name });
        }
    }
    out
}

/// The lines of a file up to its inline unit-test module (`#[cfg(test)]` then `mod NAME {`).
fn code_lines(text: &str) -> impl Iterator<Item = &str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = lines.windows(2).position(|w| w[0].trim() == "#[cfg(test)]" && w[1].starts_with("mod ") && w[1].ends_with('{')).unwrap_or(lines.len());
    lines.into_iter().take(end)
}

#[test]
fn modules_import_in_data_flow_order() {
    // The table itself only looks upwards.
    for (idx, (module, allowed)) in LAYERS.iter().enumerate() {
        for dep in *allowed {
            let pos = LAYERS.iter().position(|(m, _)| m == dep).unwrap_or_else(|| panic!("`{module}` lists `{dep}`, which is not a module"));
            assert!(pos < idx, "`{module}` may import `{dep}`, which is not above it in LAYERS");
        }
    }
    let src = repo().join("runtime/src");
    let mut offences = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap().to_path_buf();
        if rel.starts_with("bin") || rel == Path::new("lib.rs") {
            continue;
        }
        let module = module_of(&src, &file);
        let Some((_, allowed)) = LAYERS.iter().find(|(m, _)| *m == module) else {
            offences.push(format!("{}: module `{module}` is not in LAYERS (tests/e2e/architecture.rs)", rel.display()));
            continue;
        };
        if rel.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        // Unit tests at the end of a file may use any module; the code above them may not.
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in code_lines(&text).enumerate() {
            for dep in crate_refs(line) {
                if dep != module && !allowed.contains(&dep.as_str()) {
                    offences.push(format!("runtime/src/{}:{}: `{module}` imports `{dep}`: {}", rel.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(offences.is_empty(), "imports against the data flow:\n{}", offences.join("\n"));
}

#[test]
fn every_library_module_is_in_the_table() {
    let lib = std::fs::read_to_string(repo().join("runtime/src/lib.rs")).unwrap();
    let declared: BTreeSet<&str> = lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).map(|m| m.trim_end_matches(';')).collect();
    let listed: BTreeSet<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    assert_eq!(declared, listed);
}

#[test]
fn the_library_does_no_process_work() {
    let src = repo().join("runtime/src");
    let forbidden = ["println!", "eprintln!", "print!(", "eprint!(", "std::process::", "tokio::process", "/proc/", "std::io::stdout", "std::io::stderr"];
    let mut offences = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap();
        if rel.starts_with("bin") {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        // Unit tests may print and spawn; the library may not.
        for (n, line) in code_lines(&text).enumerate() {
            let line = line.split("//").next().unwrap_or_default();
            if let Some(word) = forbidden.iter().find(|w| line.contains(*w)) {
                offences.push(format!("runtime/src/{}:{}: `{word}`", rel.display(), n + 1));
            }
        }
    }
    assert!(offences.is_empty(), "process work in the library:\n{}", offences.join("\n"));
}

#[test]
fn every_module_has_a_header() {
    let missing: Vec<PathBuf> =
        rust_files(&repo().join("runtime/src")).into_iter().filter(|p| !std::fs::read_to_string(p).unwrap().starts_with("//!")).collect();
    assert!(missing.is_empty(), "modules without a //! header: {missing:?}");
}

#[test]
fn the_executor_is_split_by_concern() {
    // One concern per file (the walk, the stage handlers, the model call, the tool calls, the
    // reply source, ...): none grows past about 400 lines (its unit tests aside).
    let exec = repo().join("runtime/src/exec");
    let long: Vec<(PathBuf, usize)> = rust_files(&exec)
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text.split("\n#[cfg(test)]\nmod tests {").next().unwrap_or_default().lines().count())
        })
        .filter(|(_, n)| *n > 400)
        .collect();
    assert!(long.is_empty(), "exec files over 400 lines: {long:?}");
}
