//! Datasets: a YAML file (`cases:` and the dataset's `evaluators:`) or JSONL (one case per line),
//! or another tool's (`interop`: pydantic_evals' YAML, LangSmith's examples as JSON),
//! decoded from located trees into [`Dataset`] and [`Case`]s, every problem of the file found
//! in one read, each `path:line:col`.
//!
//! ```yaml
//! name: triage-regressions
//! evaluators:
//!   - equals: {path: category}
//! routes:                          # every case of a route
//!   support-triage: {evaluators: [{duration_max: {ms: 5000}}]}
//! cases:
//!   - id: double-charge
//!     route_id: support-triage
//!     goal: {ticket: "I was charged twice"}
//!     expected:
//!       output: {text: "..."}
//!       stages: {intake: {category: billing}}
//! ```

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

use super::evaluator::{Evaluator, decode_evaluators};
use super::interop;
use crate::diag::{Diagnostic, Diagnostics, Pos};
use crate::yaml::{self, Ctx, Node};

/// The largest dataset file read.
pub const MAX_DATASET_BYTES: u64 = 64 * 1024 * 1024;

/// A dataset: its cases and the evaluators every case is graded with.
#[derive(Debug, Clone)]
pub struct Dataset {
    /// Its `name`, else the file's stem.
    pub name: String,
    /// The file it was read from, as given.
    pub path: PathBuf,
    pub evaluators: Vec<Evaluator>,
    /// Evaluators of every case of a route (`routes: {ROUTE: {evaluators: [...]}}`), with where
    /// the route was named.
    pub route_evaluators: Vec<RouteEvaluators>,
    pub cases: Vec<Case>,
}

/// The evaluators a dataset declares for every case of one route.
#[derive(Debug, Clone)]
pub struct RouteEvaluators {
    pub route_id: String,
    pub at: Pos,
    pub evaluators: Vec<Evaluator>,
}

/// One case: a route, a goal, and what is expected of the run.
#[derive(Debug, Clone)]
pub struct Case {
    pub id: String,
    pub route_id: String,
    pub goal: Map<String, Value>,
    /// A model profile the run is started with (it must be defined in the catalogue).
    pub model_profile: Option<String>,
    pub expected: Expected,
    pub metadata: Option<Value>,
    /// Evaluators of this case only (after the dataset's).
    pub evaluators: Vec<Evaluator>,
    /// Where each part was written, for the checks against a catalogue.
    pub at: CaseAt,
}

/// What a case expects: the route's output, and values of its stages (stage id → value).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Expected {
    pub output: Option<Value>,
    pub stages: Vec<(String, Value)>,
}

impl Expected {
    /// The expected value of `stage`.
    pub fn stage(&self, stage: &str) -> Option<&Value> {
        self.stages.iter().find(|(s, _)| s == stage).map(|(_, v)| v)
    }
}

/// The positions of a case's parts in its file.
#[derive(Debug, Clone, Default)]
pub struct CaseAt {
    pub case: Pos,
    pub route_id: Pos,
    pub goal: Pos,
    pub model_profile: Pos,
    pub output: Pos,
    /// Each expected stage's key.
    pub stages: Vec<Pos>,
}

/// Why a dataset could not be had: its file does not read, or its problems, all of them.
#[derive(Debug, Clone, thiserror::Error)]
pub enum DatasetError {
    #[error("{path}: {why}")]
    Unreadable { path: String, why: String },
    #[error("{}", lines(.0))]
    Invalid(Vec<Diagnostic>),
}

fn lines(problems: &[Diagnostic]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n")
}

impl Dataset {
    /// Reads and decodes `path` (`.jsonl`: one case per line; anything else: YAML).
    pub fn load(path: &Path) -> Result<Dataset, DatasetError> {
        let text = crate::textfile::read_bounded(path, MAX_DATASET_BYTES)
            .map_err(|e| DatasetError::Unreadable { path: path.display().to_string(), why: e.to_string() })?;
        Dataset::parse(path, &text)
    }

    /// Decodes `text`, read from `path` (its extension says JSONL or YAML).
    pub fn parse(path: &Path, text: &str) -> Result<Dataset, DatasetError> {
        let mut diags = Diagnostics::default();
        let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "dataset".into());
        let mut dataset = Dataset { name: stem, path: path.to_owned(), evaluators: Vec::new(), route_evaluators: Vec::new(), cases: Vec::new() };
        if path.extension().is_some_and(|e| e == "jsonl") {
            let mut unparsed = Vec::new();
            for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
                // A line's syntax error is found at its place in the line: moved to the file's.
                let mut of_line = Diagnostics::default();
                let parsed = yaml::parse(path, line, &mut of_line);
                unparsed.extend(of_line.into_vec().into_iter().map(|mut d| {
                    d.pos.line = d.pos.line.max(1) + n as u32;
                    d
                }));
                let Some(mut node) = parsed else { continue };
                shift(&mut node, n as u32);
                let mut ctx = Ctx { path, diags: &mut diags };
                dataset.cases.extend(decode_case(&mut ctx, &node));
            }
            let mut problems = diags.into_vec();
            problems.extend(unparsed);
            problems.sort_by_key(|d| d.pos);
            return finish(dataset, problems);
        }
        if let Some(root) = yaml::parse(path, text, &mut diags) {
            let mut ctx = Ctx { path, diags: &mut diags };
            match interop::kind(&root) {
                interop::Kind::Ours => decode_root(&mut ctx, &root, &mut dataset),
                interop::Kind::Pydantic => interop::decode_pydantic(&mut ctx, &root, &mut dataset),
                interop::Kind::LangSmith => interop::decode_langsmith(&mut ctx, &root, &mut dataset),
            }
        }
        finish(dataset, diags.into_vec())
    }

    /// A list of evaluators given apart from a dataset (`text`, YAML or JSON, read from `path`),
    /// to add to its own (the Python package's `evaluate(..., evaluators=)`).
    pub fn parse_evaluators(path: &Path, text: &str) -> Result<Vec<Evaluator>, DatasetError> {
        let mut diags = Diagnostics::default();
        let evaluators = match yaml::parse(path, text, &mut diags) {
            Some(node) => decode_evaluators(&mut Ctx { path, diags: &mut diags }, &node),
            None => Vec::new(),
        };
        let problems = diags.into_vec();
        if problems.iter().any(Diagnostic::is_error) { Err(DatasetError::Invalid(problems)) } else { Ok(evaluators) }
    }

    /// Every evaluator a case is graded with: the dataset's, its route's, then its own.
    pub fn evaluators_of<'a>(&'a self, case: &'a Case) -> impl Iterator<Item = &'a Evaluator> {
        let route = self.route_evaluators.iter().filter(move |r| r.route_id == case.route_id).flat_map(|r| &r.evaluators);
        self.evaluators.iter().chain(route).chain(&case.evaluators)
    }
}

fn finish(dataset: Dataset, mut problems: Vec<Diagnostic>) -> Result<Dataset, DatasetError> {
    let mut seen = std::collections::HashMap::new();
    for case in &dataset.cases {
        if let Some(first) = seen.insert(case.id.as_str(), case.at.case) {
            let message = format!("case id `{}` is used twice (first at line {})", case.id, first.line);
            problems.push(Diagnostic { path: dataset.path.clone(), pos: case.at.case, severity: crate::diag::Severity::Error, message });
        }
    }
    if dataset.cases.is_empty() && problems.is_empty() {
        let message = "the dataset has no cases".to_owned();
        problems.push(Diagnostic { path: dataset.path.clone(), pos: Pos::FILE, severity: crate::diag::Severity::Error, message });
    }
    if problems.iter().any(Diagnostic::is_error) { Err(DatasetError::Invalid(problems)) } else { Ok(dataset) }
}

/// Moves a tree parsed from line `n` (0-based) of a file to its place in the file.
fn shift(node: &mut Node, n: u32) {
    node.pos.line += n;
    match &mut node.value {
        yaml::Value::Seq(items) => items.iter_mut().for_each(|i| shift(i, n)),
        yaml::Value::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
            k.pos.line += n;
            shift(v, n);
        }),
        _ => {}
    }
}

fn decode_root(ctx: &mut Ctx<'_>, root: &Node, dataset: &mut Dataset) {
    let Some(mut fields) = ctx.map(root, "a dataset") else { return };
    if let Some(name) = fields.get("name").and_then(|n| ctx.string(n, "`name`")) {
        dataset.name = name;
    }
    if let Some(node) = fields.get("evaluators") {
        dataset.evaluators = decode_evaluators(ctx, node);
    }
    if let Some(routes) = fields.get("routes") {
        for (key, node) in yaml::entries(ctx, routes, "route") {
            let Some(mut route) = ctx.map(node, &format!("route `{}`", key.name)) else { continue };
            let evaluators = route.require(ctx, "evaluators").map(|n| decode_evaluators(ctx, n)).unwrap_or_default();
            route.finish(ctx);
            dataset.route_evaluators.push(RouteEvaluators { route_id: key.name.clone(), at: key.pos, evaluators });
        }
    }
    if let Some(cases) = fields.require(ctx, "cases").and_then(|n| ctx.seq(n, "`cases`")) {
        dataset.cases = cases.iter().filter_map(|c| decode_case(ctx, c)).collect();
    }
    fields.finish(ctx);
}

fn decode_case(ctx: &mut Ctx<'_>, node: &Node) -> Option<Case> {
    let mut fields = ctx.map(node, "a case")?;
    let mut at = CaseAt { case: node.pos, ..CaseAt::default() };
    let id = fields.require(ctx, "id").and_then(|n| ctx.ident(n, "a case's `id`"));
    let route_id = fields.require(ctx, "route_id").and_then(|n| {
        at.route_id = n.pos;
        ctx.ident(n, "`route_id`")
    });
    let goal = fields.require(ctx, "goal").and_then(|n| {
        at.goal = n.pos;
        match yaml::to_json(n) {
            Value::Object(goal) => Some(goal),
            _ => {
                ctx.error(n.pos, format!("`goal` must be a mapping (the route's goal object), found {}", n.value.kind()));
                None
            }
        }
    });
    let model_profile = fields.get("model_profile").and_then(|n| {
        at.model_profile = n.pos;
        ctx.ident(n, "`model_profile`")
    });
    let expected = fields.get("expected").map(|n| decode_expected(ctx, n, &mut at)).unwrap_or_default();
    let metadata = fields.get("metadata").map(yaml::to_json);
    let evaluators = fields.get("evaluators").map(|n| decode_evaluators(ctx, n)).unwrap_or_default();
    fields.finish(ctx);
    Some(Case { id: id?, route_id: route_id?, goal: goal?, model_profile, expected, metadata, evaluators, at })
}

fn decode_expected(ctx: &mut Ctx<'_>, node: &Node, at: &mut CaseAt) -> Expected {
    let mut expected = Expected::default();
    let Some(mut fields) = ctx.map(node, "`expected`") else { return expected };
    if let Some(output) = fields.get("output") {
        at.output = output.pos;
        expected.output = Some(yaml::to_json(output));
    }
    if let Some(stages) = fields.get("stages") {
        for (key, value) in yaml::entries(ctx, stages, "stage") {
            at.stages.push(key.pos);
            expected.stages.push((key.name.clone(), yaml::to_json(value)));
        }
    }
    fields.finish(ctx);
    expected
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "name: triage\nevaluators:\n  - equals: {path: category}\ncases:\n  - id: a\n    route_id: support-triage\n    goal: {ticket: hi}\n    expected:\n      output: {text: done}\n      stages: {intake: {category: billing}}\n    metadata: {team: billing}\n";

    #[test]
    fn a_yaml_dataset_decodes_with_its_places() {
        let d = Dataset::parse(Path::new("d.yaml"), GOOD).unwrap();
        assert_eq!(d.name, "triage");
        assert_eq!(d.evaluators.len(), 1);
        let case = &d.cases[0];
        assert_eq!((case.id.as_str(), case.route_id.as_str()), ("a", "support-triage"));
        assert_eq!(case.goal["ticket"], "hi");
        assert_eq!(case.expected.output, Some(serde_json::json!({"text": "done"})));
        assert_eq!(case.expected.stage("intake"), Some(&serde_json::json!({"category": "billing"})));
        assert_eq!(case.at.route_id.line, 6);
        let routed = "evaluators: [equals]\nroutes:\n  r: {evaluators: [schema: {schema: {}}, contains: {text: x}]}\n  other: {evaluators: [regex: {pattern: a}]}\n\
                      cases:\n  - {id: a, route_id: r, goal: {}, evaluators: [tokens_max: {tokens: 1}]}\n";
        let d = Dataset::parse(Path::new("d.yaml"), routed).unwrap();
        let kinds: Vec<&str> = d.evaluators_of(&d.cases[0]).map(|e| e.check.kind()).collect();
        assert_eq!(kinds, ["equals", "schema", "contains", "tokens_max"], "the dataset's, the route's, the case's");
    }

    #[test]
    fn every_problem_is_located_at_once() {
        let text = "cases:\n  - id: a\n    goal: 3\n  - id: a\n    route_id: r\n    goal: {}\n    colour: red\n";
        let DatasetError::Invalid(problems) = Dataset::parse(Path::new("d.yaml"), text).unwrap_err() else { panic!() };
        let shown: Vec<String> = problems.iter().map(ToString::to_string).collect();
        assert!(shown.contains(&"d.yaml:2:5: a case is missing the required field `route_id`".to_owned()), "{shown:#?}");
        assert!(shown.iter().any(|s| s.starts_with("d.yaml:3:11: `goal` must be a mapping")), "{shown:#?}");
        assert!(shown.iter().any(|s| s.starts_with("d.yaml:7:5: unknown field `colour` in a case")), "{shown:#?}");
    }

    #[test]
    fn a_jsonl_dataset_is_located_by_line() {
        let text = "{\"id\": \"a\", \"route_id\": \"r\", \"goal\": {}}\n\n{\"id\": \"b\", \"route_id\": \"r\", \"goal\": []}\n";
        let DatasetError::Invalid(problems) = Dataset::parse(Path::new("d.jsonl"), text).unwrap_err() else { panic!() };
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert_eq!(problems[0].pos.line, 3);
        assert!(problems[0].message.contains("`goal` must be a mapping"), "{}", problems[0]);
        let good = Dataset::parse(Path::new("d.jsonl"), "{\"id\": \"a\", \"route_id\": \"r\", \"goal\": {\"x\": 1}}\n").unwrap();
        assert_eq!(good.cases[0].goal["x"], 1);
        assert_eq!(good.name, "d");
        let DatasetError::Invalid(broken) =
            Dataset::parse(Path::new("d.jsonl"), "{\"id\": \"a\", \"route_id\": \"r\", \"goal\": {}}\n{\"id\": \"b\"\n").unwrap_err()
        else {
            panic!()
        };
        assert_eq!(broken[0].pos.line, 2, "{broken:?}");
    }

    #[test]
    fn a_dataset_without_cases_or_with_a_case_twice_is_refused() {
        assert!(Dataset::parse(Path::new("d.yaml"), "cases: []\n").unwrap_err().to_string().contains("no cases"));
        let twice = "cases:\n  - {id: a, route_id: r, goal: {}}\n  - {id: a, route_id: r, goal: {}}\n";
        assert!(Dataset::parse(Path::new("d.yaml"), twice).unwrap_err().to_string().contains("d.yaml:3:5: case id `a` is used twice (first at line 2)"));
    }
}
