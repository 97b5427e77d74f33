//! Architecture invariants of `runtime/src` and `bench/src`, checked on the source: the library's
//! modules, the binary's and the bench's import each other in one direction (data-flow order),
//! the library does no process work, every module has a header, and the library's errors are
//! types (String errors only in the listed leaf parsers).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::support::repo;

/// Each top-level module of the library, in data-flow order, with exactly the `crate::` modules
/// it imports. A module may only name modules listed above it, so the graph has no cycle; the
/// tests below check the table, every import, and that no module is allowed more than it uses.
const LAYERS: &[(&str, &[&str])] = &[
    // Leaves: they import nothing of the crate (the events only name the failures' classes).
    ("diag", &[]),
    ("textfile", &[]),
    ("redact", &[]),
    ("cancel", &[]),
    ("failure", &[]),
    ("events", &["failure"]),
    ("structured", &[]),
    ("decision", &[]),
    // Scheduled runs' pure core: cron fire times, the planner (issue 50).
    ("schedule", &[]),
    // Built on leaves only: telemetry, the vocabulary the catalogue and the model port share,
    // the located vocabulary of source files.
    ("otel", &["redact"]),
    ("vocab", &["redact", "structured", "decision"]),
    ("yaml", &["diag"]),
    ("source", &["diag", "textfile"]),
    ("version", &["source"]),
    // The catalogue: files become definitions, prompts resolve, routes become graphs. It knows
    // no model port and no configuration.
    ("defs", &["diag", "vocab"]),
    ("prompt", &["diag", "yaml", "source", "defs"]),
    ("loader", &["diag", "structured", "vocab", "yaml", "source", "defs", "prompt"]),
    ("hydrate", &["diag", "decision", "vocab", "defs", "prompt", "loader"]),
    ("svg", &["defs", "prompt", "hydrate"]),
    ("catalogue", &["diag", "vocab", "source", "defs", "loader", "hydrate"]),
    // Two hydrated catalogues compared (`fabric routes diff`).
    ("diff", &["redact", "vocab", "defs", "prompt", "hydrate", "catalogue"]),
    // The model port and its configuration. They know no catalogue.
    ("llm", &["diag", "redact", "cancel", "failure", "events", "structured", "decision", "otel", "vocab", "yaml", "source"]),
    ("config", &["textfile", "redact", "vocab", "yaml", "llm"]),
    // Running them.
    ("tools", &["redact", "failure", "defs"]),
    ("exec", &["diag", "cancel", "failure", "events", "structured", "decision", "otel", "defs", "hydrate", "catalogue", "llm", "tools"]),
    ("store", &["redact", "failure", "events", "version", "config", "exec"]),
    (
        "runtime",
        &["cancel", "diag", "failure", "events", "schedule", "source", "version", "defs", "hydrate", "catalogue", "llm", "config", "tools", "exec", "store"],
    ),
    // Evaluations over datasets: cases run through the facade and graded from their record.
    ("eval", &["diag", "textfile", "cancel", "events", "yaml", "defs", "hydrate", "svg", "catalogue", "diff", "llm", "exec", "store", "runtime"]),
    // The service: HTTP over the facade.
    ("api", &["redact", "cancel", "failure", "events", "schedule", "version", "svg", "catalogue", "diff", "config", "exec", "store", "runtime", "eval"]),
    ("replica", &["api"]),
];

/// The modules of the `fabric` binary (`runtime/src/bin/fabric/`), in the same way: printing
/// below the commands, the commands below the argument parser, `main` at the bottom.
const BIN_LAYERS: &[(&str, &[&str])] = &[
    // Nothing of the binary.
    ("term", &[]),
    ("toolserver", &[]),
    // The terminal view of a run, the service, the hand-over to `fabric-bench`: they print
    // through `term`.
    ("progress", &["term"]),
    ("serve", &["term"]),
    ("forward", &["term"]),
    ("streamed", &["term"]),
    ("eval", &["term"]),
    // Arguments, dispatch, exit codes.
    ("cli", &["term", "progress", "streamed", "serve", "forward", "toolserver", "eval"]),
    ("main", &["cli"]),
];

/// The modules of the `fabric-bench` binary (`bench/src/`), in the same way: what the scenarios
/// share below them, the scenarios, `main` (the dispatch) at the bottom.
const BENCH_LAYERS: &[(&str, &[&str])] = &[
    // Nothing of the binary: the arguments, the clocks and `/proc`, the human table.
    ("options", &[]),
    ("measure", &[]),
    ("output", &[]),
    // The bench catalogue and the runtime over it.
    ("fixture", &["options"]),
    // The scenarios and the measures around them.
    ("ceiling", &["measure"]),
    ("inprocess", &["options", "measure", "fixture"]),
    ("service", &["options", "measure", "fixture"]),
    ("first_text", &["options", "measure", "fixture"]),
    ("instructions", &["options", "measure"]),
    ("main", &["options", "output", "ceiling", "inprocess", "service", "first_text", "instructions"]),
];

/// The catalogue's modules, and the model port's: neither side may import the other.
const CATALOGUE: &[&str] = &["defs", "prompt", "loader", "hydrate", "svg", "catalogue", "diff"];
const MODEL_PORT: &[&str] = &["llm", "config"];

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

/// The top-level module a file belongs to, from its path below the crate's source directory
/// (`llm/providers/mod.rs` → `llm`).
fn top_module(rel: &Path) -> String {
    let first = rel.components().next().unwrap().as_os_str().to_str().unwrap();
    first.trim_end_matches(".rs").to_owned()
}

/// Every `crate::NAME` a line names, in paths and in `use crate::{a, b::c}` groups; comments
/// are not code.
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
            out.insert(name);
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

/// The `crate::` modules each file of `dir` imports, by module, with the lines that do (unit
/// tests left out); `module_of` names a file's module, `None` for files outside any.
fn imports(dir: &Path, module_of: impl Fn(&Path) -> Option<String>) -> Vec<(String, PathBuf, usize, String, String)> {
    let mut out = Vec::new();
    for file in rust_files(dir) {
        let rel = file.strip_prefix(dir).unwrap().to_path_buf();
        let Some(module) = module_of(&rel) else { continue };
        if rel.file_name().is_some_and(|f| f == "tests.rs") {
            continue;
        }
        // Unit tests at the end of a file may use any module; the code above them may not.
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in code_lines(&text).enumerate() {
            for dep in crate_refs(line) {
                if dep != module {
                    out.push((module.clone(), rel.clone(), n + 1, dep, line.trim().to_owned()));
                }
            }
        }
    }
    out
}

/// Checks a table of layers against the imports found: the table only looks upwards, every
/// file's module is in it, every import is allowed, and every allowance is used (the table says
/// exactly what each module imports).
fn check_layers(layers: &[(&str, &[&str])], shown: &str, found: &[(String, PathBuf, usize, String, String)], files: &[String]) {
    for (idx, (module, allowed)) in layers.iter().enumerate() {
        for dep in *allowed {
            let pos = layers.iter().position(|(m, _)| m == dep).unwrap_or_else(|| panic!("`{module}` lists `{dep}`, which is not a module"));
            assert!(pos < idx, "`{module}` may import `{dep}`, which is not above it in the table");
        }
    }
    let mut offences = Vec::new();
    for module in files {
        if !layers.iter().any(|(m, _)| m == module) {
            offences.push(format!("module `{module}` ({shown}) is not in the table (tests/e2e/architecture.rs)"));
        }
    }
    for (module, rel, line_no, dep, line) in found {
        let Some((_, allowed)) = layers.iter().find(|(m, _)| m == module) else { continue };
        if !allowed.contains(&dep.as_str()) {
            offences.push(format!("{shown}/{}:{line_no}: `{module}` imports `{dep}`: {line}", rel.display()));
        }
    }
    for (module, allowed) in layers {
        for dep in *allowed {
            if !found.iter().any(|(m, _, _, d, _)| m == module && d == dep) {
                offences.push(format!("`{module}` may import `{dep}` but does not: take it out of the table (tests/e2e/architecture.rs)"));
            }
        }
    }
    assert!(offences.is_empty(), "imports against the data flow:\n{}", offences.join("\n"));
}

#[test]
fn modules_import_in_data_flow_order() {
    let src = repo().join("runtime/src");
    let module = |rel: &Path| (!rel.starts_with("bin") && rel != Path::new("lib.rs")).then(|| top_module(rel));
    let found = imports(&src, module);
    let files: BTreeSet<String> = rust_files(&src).iter().filter_map(|f| module(f.strip_prefix(&src).unwrap())).collect();
    check_layers(LAYERS, "runtime/src", &found, &files.into_iter().collect::<Vec<_>>());
}

/// Checks a binary's modules (`dir`, relative to the repository) against its table; `main.rs`
/// names its modules without `crate::` (`cli::main()`), so its lines are matched on the names it
/// declares.
fn check_binary(layers: &[(&str, &[&str])], dir: &str) {
    let bin = repo().join(dir);
    let mut found = imports(&bin, |rel| Some(top_module(rel)));
    let main = std::fs::read_to_string(bin.join("main.rs")).unwrap();
    let declared: Vec<&str> = main.lines().filter_map(|l| l.strip_prefix("mod ")).map(|m| m.trim_end_matches(';')).collect();
    for (n, line) in code_lines(&main).enumerate() {
        let code = line.split("//").next().unwrap_or_default();
        for m in &declared {
            let named =
                code.match_indices(&format!("{m}::")).any(|(i, _)| i == 0 || !code[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == ':'));
            if named {
                found.push(("main".into(), "main.rs".into(), n + 1, (*m).to_owned(), line.trim().to_owned()));
            }
        }
    }
    let files: Vec<String> = rust_files(&bin).iter().map(|f| top_module(f.strip_prefix(&bin).unwrap())).collect();
    check_layers(layers, dir, &found, &files);
}

#[test]
fn the_binary_imports_in_one_direction() {
    check_binary(BIN_LAYERS, "runtime/src/bin/fabric");
}

#[test]
fn the_bench_imports_in_one_direction() {
    check_binary(BENCH_LAYERS, "bench/src");
}

#[test]
fn the_catalogue_and_the_model_port_know_nothing_of_each_other() {
    for (module, allowed) in LAYERS {
        let other = if CATALOGUE.contains(module) {
            MODEL_PORT
        } else if MODEL_PORT.contains(module) {
            CATALOGUE
        } else {
            continue;
        };
        let crossing: Vec<&&str> = allowed.iter().filter(|d| other.contains(d)).collect();
        assert!(crossing.is_empty(), "`{module}` imports {crossing:?} across the catalogue / model port line");
    }
}

#[test]
fn every_library_module_is_in_the_table() {
    let lib = std::fs::read_to_string(repo().join("runtime/src/lib.rs")).unwrap();
    let declared: BTreeSet<&str> = lib.lines().filter_map(|l| l.strip_prefix("pub mod ")).map(|m| m.trim_end_matches(';')).collect();
    let listed: BTreeSet<&str> = LAYERS.iter().map(|(m, _)| *m).collect();
    assert_eq!(declared, listed);
}

/// The library's files that may start a process, each with why (path below `runtime/src`, why):
/// only a port's adapter, so that nothing else of the library spawns.
const PROCESS_WORK: &[(&str, &str)] = &[(
    "tools/mcp/client.rs",
    "the MCP adapter: a stdio server the catalogue declares is a child process (a `tokio::process::Command` and its `Stdio`, behind the `McpPort`)",
)];

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
            let allowed = |w: &&str| matches!(*w, "tokio::process" | "std::process::") && PROCESS_WORK.iter().any(|(f, _)| Path::new(f) == rel);
            if let Some(word) = forbidden.iter().filter(|w| !allowed(w)).find(|w| line.contains(*w)) {
                offences.push(format!("runtime/src/{}:{}: `{word}`", rel.display(), n + 1));
            }
        }
    }
    assert!(offences.is_empty(), "process work in the library:\n{}", offences.join("\n"));
}

/// The library's modules, the binary's (`runtime/src/bin/` is below `runtime/src`) and the
/// bench's (`bench/src`).
#[test]
fn every_module_has_a_header() {
    let mut files = rust_files(&repo().join("runtime/src"));
    files.extend(rust_files(&repo().join("bench/src")));
    assert!(files.iter().any(|f| f.ends_with("bin/fabric/main.rs")), "the binary's modules are checked too");
    assert!(files.iter().any(|f| f.ends_with("bench/src/main.rs")), "the bench's modules are checked too");
    let missing: Vec<PathBuf> = files.into_iter().filter(|p| !std::fs::read_to_string(p).unwrap().starts_with("//!")).collect();
    assert!(missing.is_empty(), "modules without a //! header: {missing:?}");
}

#[test]
fn the_executor_and_the_bench_are_split_by_concern() {
    // One concern per file (the walk, the stage handlers, the model call, the tool calls, the
    // reply source, ...; the bench's scenarios, measures and output): none grows past about 400
    // lines (its unit tests aside).
    let long: Vec<(PathBuf, usize)> = ["runtime/src/exec", "bench/src"]
        .into_iter()
        .flat_map(|dir| rust_files(&repo().join(dir)))
        .filter(|p| p.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text.split("\n#[cfg(test)]\nmod tests {").next().unwrap_or_default().lines().count())
        })
        .filter(|(_, n)| *n > 400)
        .collect();
    assert!(long.is_empty(), "exec and bench files over 400 lines: {long:?}");
}

/// The library's files over about 400 lines (their unit tests aside), each with why it is
/// still one file or what will split it. A file not listed that grows past 400 fails; a listed
/// one that shrinks below must leave the list. (path below `runtime/src`, why.)
const LONG_FILES: &[(&str, &str)] = &[
    ("bin/fabric/cli.rs", "the CLI's arguments and one function per command; to be split by command group (run, runs, routes, doctor)"),
    ("tools/http1.rs", "one HTTP/1.1 client (framing by RFC 9112): its reads are one state machine"),
    ("hydrate.rs", "`Route` and `StageNode` with `build`, their only constructor, and the text/DOT/Mermaid views of the same graph"),
    ("llm/flow/gate.rs", "one gate's state (buckets, pause, fair queues) behind one lock: its parts are read and changed together"),
    ("config.rs", "`Settings` from figment: one table of every variable, read in one place"),
    ("svg.rs", "one renderer: layout and escaping of one picture"),
    ("otel.rs", "the tracer, its exporter from the standard variables, and the flush: one outside world"),
    ("tools/mod.rs", "the `HttpPort` and its adapter: URL cache, redirects, caps"),
    ("loader/decode.rs", "one decoder per definition kind, sharing the decoding vocabulary"),
    ("events/data.rs", "one closed enum of event types and its wire form, variant by variant: the table docs/events.md mirrors"),
    ("llm/providers/mod.rs", "the one HTTP executor every codec shares: the request, the bounded read of the reply, the mapping of failures to reason classes"),
];

#[test]
fn library_files_stay_under_400_lines_or_say_why() {
    let mut long = Vec::new();
    for path in rust_files(&repo().join("runtime/src")) {
        if path.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let n = text.split("\n#[cfg(test)]\nmod tests {").next().unwrap_or_default().lines().count();
        let rel = path.strip_prefix(repo().join("runtime/src")).unwrap().to_string_lossy().into_owned();
        let listed = LONG_FILES.iter().any(|(f, _)| *f == rel);
        if n > 400 && !listed {
            long.push(format!("{rel}: {n} lines (split it, or list it in LONG_FILES with why)"));
        }
        if n <= 400 && listed {
            long.push(format!("{rel}: {n} lines, still in LONG_FILES: take it out"));
        }
    }
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// The `Result<_, String>`s the library may keep, each with why (file below `runtime/src`,
/// function, why): none today. The leaf parsers that had one (the goal, the prefetch pack, the
/// text protocol, a JSON schema, a reply field) return error enums whose messages are the ones
/// they wrote (issue 47); a new one is listed here only with a reason an enum would not do.
const STRING_ERRORS: &[(&str, &str, &str)] = &[];

/// Each `Result<…, String>` in `text` (types spanning lines too; comments are not code): the
/// 1-based line and the function it belongs to (the last `fn NAME` before it), or the line's text.
fn string_errors(text: &str) -> Vec<(usize, String)> {
    let code: String = code_lines(text).map(|l| format!("{}\n", l.split("//").next().unwrap_or_default())).collect();
    let mut out = Vec::new();
    for (start, _) in code.match_indices("Result<") {
        if code[..start].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue; // `SomeResult<`, another type
        }
        // The type's arguments at its own depth; the error is the last (a trailing comma aside).
        let (mut depth, mut args) = (1, vec![String::new()]);
        for c in code[start + "Result<".len()..].chars() {
            match c {
                '<' => depth += 1,
                '>' if depth == 1 => break,
                '>' => depth -= 1,
                ',' if depth == 1 => {
                    args.push(String::new());
                    continue;
                }
                _ => {}
            }
            args.last_mut().unwrap().push(c);
        }
        if args.iter().rev().map(|a| a.trim()).find(|a| !a.is_empty()) == Some("String") {
            let line = code[..start].matches('\n').count() + 1;
            let name = code[..start].rsplit_once("fn ").map(|(_, rest)| rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
            out.push((line, name.unwrap_or_else(|| code.lines().nth(line - 1).unwrap_or_default().trim().to_owned())));
        }
    }
    out
}

/// Issue 24: the library's contracts are types. A `Result<_, String>` outside the listed leaf
/// parsers fails here (unit tests and the binary, `src/bin/`, aside), and so does a listed one
/// that no longer exists.
#[test]
fn the_library_returns_typed_errors_outside_leaf_parsers() {
    let src = repo().join("runtime/src");
    let mut found = BTreeSet::new();
    let mut refused = Vec::new();
    for file in rust_files(&src) {
        let rel = file.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        if rel.starts_with("bin/") || rel.ends_with("/tests.rs") {
            continue;
        }
        for (line, name) in string_errors(&std::fs::read_to_string(&file).unwrap()) {
            if STRING_ERRORS.iter().any(|(f, n, _)| *f == rel && *n == name) {
                found.insert((rel.clone(), name));
            } else {
                refused.push(format!("runtime/src/{rel}:{line}: `{name}` returns Result<_, String>: give it an error type"));
            }
        }
    }
    assert!(refused.is_empty(), "String errors outside the leaf parsers (STRING_ERRORS):\n{}", refused.join("\n"));
    let stale: Vec<_> = STRING_ERRORS.iter().filter(|(f, n, _)| !found.contains(&((*f).to_owned(), (*n).to_owned()))).collect();
    assert!(stale.is_empty(), "allowed String errors that no longer exist: {stale:?}");
    // The scan itself: a type across lines, a nested one, and a look-alike.
    let probe = "fn a() -> Result<\n    Vec<u8>,\n    String,\n> {}\nfn b() -> Result<Result<(), String>, E> {}\nfn c() -> MyResult<u8, String> {}";
    assert_eq!(string_errors(probe), [(1, "a".to_owned()), (5, "b".to_owned())]);
}

/// Issue 47: no test runs cargo. A build inside a test waits for cargo's lock, builds with other
/// features than the tests' (a second build of every dependency) and hides a missing build
/// step; what a test needs is built before the tests run (`cargo test --workspace`, as
/// `.ci/test` runs it), and a test finds it or skips (`support::fabric_bench`).
#[test]
fn no_test_runs_cargo() {
    let mut files = rust_files(&repo().join("tests"));
    files.extend(rust_files(&repo().join("bench/tests")));
    // Split, so that this file does not find itself.
    let calls = [concat!("env!(\"CAR", "GO\")"), concat!("Command::new(\"car", "go\")")];
    let found: Vec<String> = files
        .iter()
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap();
            let hits: Vec<String> = text
                .lines()
                .enumerate()
                .filter(|(_, l)| calls.iter().any(|c| l.contains(c)))
                .map(|(i, l)| format!("{}:{}: {}", f.strip_prefix(repo()).unwrap().display(), i + 1, l.trim()))
                .collect();
            hits
        })
        .collect();
    assert!(found.is_empty(), "tests that run cargo (build it before the tests, and find it or skip):\n{}", found.join("\n"));
}
