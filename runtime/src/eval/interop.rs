//! Datasets of other tools, read and written: `pydantic_evals`' dataset YAML (`cases:` of `name`,
//! `inputs`, `expected_output`, `metadata`, `evaluators`) and LangSmith's examples as JSON (a list
//! of `{inputs, outputs, metadata}`). A case's route is its `metadata.route_id` in both (`inputs`
//! is the goal). Read from the same located trees as a dataset of ours, every problem located.

use serde_json::{Map, Value, json};

use super::dataset::{Case, CaseAt, Dataset, Expected};
use super::evaluator::{Check, Evaluator, JsonPath};
use crate::yaml::{self, Ctx, Node};

/// Which tool's dataset a tree is.
pub(super) enum Kind {
    Ours,
    Pydantic,
    LangSmith,
}

/// A list is LangSmith's examples; `cases` whose first has `inputs` or `name` are pydantic_evals'.
pub(super) fn kind(root: &Node) -> Kind {
    let has = |node: &Node, key: &str| matches!(&node.value, yaml::Value::Map(e) if e.iter().any(|(k, _)| k.name == key));
    match &root.value {
        yaml::Value::Seq(_) => Kind::LangSmith,
        yaml::Value::Map(entries) => match entries.iter().find(|(k, _)| k.name == "cases").map(|(_, v)| &v.value) {
            Some(yaml::Value::Seq(cases)) if cases.first().is_some_and(|c| has(c, "inputs") || has(c, "name")) => Kind::Pydantic,
            _ => Kind::Ours,
        },
        _ => Kind::Ours,
    }
}

/// A case of another tool: its id, goal (`inputs`), expected output, metadata (with its route).
fn case(ctx: &mut Ctx<'_>, node: &Node, id: Option<String>, inputs: Option<&Node>, expected: Option<&Node>, metadata: Option<&Node>) -> Option<Case> {
    let mut at = CaseAt { case: node.pos, route_id: node.pos, ..CaseAt::default() };
    let goal = match inputs {
        Some(n) => match yaml::to_json(n) {
            Value::Object(goal) => Some(goal),
            _ => {
                ctx.error(n.pos, format!("`inputs` must be a mapping (the route's goal), found {}", n.value.kind()));
                None
            }
        },
        None => {
            ctx.error(node.pos, "a case is missing `inputs` (the route's goal)");
            None
        }
    };
    let route = metadata.and_then(|m| match &m.value {
        yaml::Value::Map(entries) => entries.iter().find(|(k, _)| k.name == "route_id").map(|(_, v)| v),
        _ => None,
    });
    let route_id = match route {
        Some(n) => {
            at.route_id = n.pos;
            ctx.ident(n, "`metadata.route_id`")
        }
        None => {
            ctx.error(node.pos, "a case names its route in `metadata.route_id`");
            None
        }
    };
    if let Some(e) = expected {
        at.output = e.pos;
    }
    let id = id.filter(|i| yaml::is_ident(i)).or_else(|| {
        ctx.error(node.pos, "a case needs a name of letters, digits, `_`, `-`, `.` (its `name` or `id`)");
        None
    });
    Some(Case {
        id: id?,
        route_id: route_id?,
        goal: goal?,
        model_profile: None,
        expected: Expected { output: expected.map(yaml::to_json), stages: Vec::new() },
        metadata: metadata.map(yaml::to_json),
        evaluators: Vec::new(),
        at,
    })
}

/// LangSmith's `outputs` `{"output": value}` (what a value that is not an object is written as)
/// is that value.
fn unwrapped(v: Value) -> Value {
    match v {
        Value::Object(mut m) if m.len() == 1 && m.contains_key("output") => m.remove("output").unwrap_or_default(),
        other => other,
    }
}

fn field<'n>(node: &'n Node, key: &str) -> Option<&'n Node> {
    match &node.value {
        yaml::Value::Map(entries) => entries.iter().find(|(k, _)| k.name == key).map(|(_, v)| v),
        _ => None,
    }
}

/// LangSmith's examples: `[{id?, inputs, outputs?, metadata}]`.
pub(super) fn decode_langsmith(ctx: &mut Ctx<'_>, root: &Node, dataset: &mut Dataset) {
    let Some(items) = ctx.seq(root, "LangSmith's examples") else { return };
    for (i, item) in items.iter().enumerate() {
        let text = |n: &Node| if let yaml::Value::Str(s) = &n.value { Some(s.clone()) } else { None };
        let id = field(item, "metadata").and_then(|m| field(m, "case_id")).and_then(text).or_else(|| field(item, "id").and_then(text));
        let id = id.or_else(|| Some(format!("example-{}", i + 1)));
        dataset.cases.extend(case(ctx, item, id, field(item, "inputs"), field(item, "outputs"), field(item, "metadata")).map(|mut c| {
            c.expected.output = c.expected.output.map(unwrapped);
            c
        }));
    }
}

/// pydantic_evals' dataset: `cases` (and their `evaluators`) and the dataset's `evaluators`.
pub(super) fn decode_pydantic(ctx: &mut Ctx<'_>, root: &Node, dataset: &mut Dataset) {
    if let Some(yaml::Value::Str(name)) = field(root, "name").map(|n| &n.value) {
        dataset.name = name.clone();
    }
    if let Some(evaluators) = field(root, "evaluators").and_then(|n| ctx.seq(n, "`evaluators`")) {
        dataset.evaluators = evaluators.iter().filter_map(|e| pydantic_evaluator(ctx, e)).collect();
    }
    let Some(cases) = field(root, "cases").and_then(|n| ctx.seq(n, "`cases`")) else { return };
    for (i, item) in cases.iter().enumerate() {
        let id = field(item, "name").and_then(|n| if let yaml::Value::Str(s) = &n.value { Some(s.clone()) } else { None });
        let id = id.or_else(|| Some(format!("case-{}", i + 1)));
        if let Some(mut c) = case(ctx, item, id, field(item, "inputs"), field(item, "expected_output"), field(item, "metadata")) {
            if let Some(list) = field(item, "evaluators").and_then(|n| ctx.seq(n, "`evaluators`")) {
                c.evaluators = list.iter().filter_map(|e| pydantic_evaluator(ctx, e)).collect();
            }
            dataset.cases.push(c);
        }
    }
}

/// One of pydantic_evals' evaluators as ours: `EqualsExpected`, `Equals`, `Contains`,
/// `MaxDuration`, `IsInstance`, `LLMJudge` (judged by the `default` profile unless its
/// `model` names a profile). Written as a name, `{Name: argument}` or `{Name: {field: ...}}`.
fn pydantic_evaluator(ctx: &mut Ctx<'_>, node: &Node) -> Option<Evaluator> {
    let (name, arg) = match &node.value {
        yaml::Value::Str(s) => (s.clone(), None),
        yaml::Value::Map(e) if e.len() == 1 => (e[0].0.name.clone(), Some(&e[0].1)),
        other => {
            ctx.error(node.pos, format!("an evaluator is a name or a mapping with one key, found {}", other.kind()));
            return None;
        }
    };
    let arg = arg.map(yaml::to_json);
    // The first positional argument, or the named one.
    let get = |key: &str| -> Option<Value> {
        match &arg {
            Some(Value::Object(m)) => m.get(key).cloned(),
            Some(v) if !v.is_null() => Some(v.clone()),
            _ => None,
        }
    };
    let whole = JsonPath::default();
    let check = match name.as_str() {
        "EqualsExpected" => Check::Equals { path: whole, value: None },
        "Equals" => Check::Equals { path: whole, value: get("value") },
        "Contains" => Check::Contains { path: whole, text: get("value").map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned)) },
        "MaxDuration" => Check::DurationMax { ms: get("seconds").and_then(|v| v.as_f64()).unwrap_or(0.0) * 1000.0 },
        "IsInstance" => {
            let ty = match get("type_name").and_then(|v| v.as_str().map(str::to_owned)).as_deref() {
                Some("str") => "string",
                Some("int") => "integer",
                Some("float") => "number",
                Some("bool") => "boolean",
                Some("dict") => "object",
                Some("list") => "array",
                other => {
                    ctx.error(node.pos, format!("IsInstance of {other:?} has no JSON type here (str, int, float, bool, dict, list)"));
                    return None;
                }
            };
            let schema = json!({"type": ty});
            let validator = std::sync::Arc::new(jsonschema::validator_for(&schema).ok()?);
            Check::Schema { schema, validator }
        }
        "LLMJudge" => Check::LlmJudge {
            rubric: get("rubric").and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default(),
            profile: get("model").and_then(|v| v.as_str().map(str::to_owned)).filter(|m| yaml::is_ident(m)).unwrap_or_else(|| "default".into()),
            include_goal: get("include_input").and_then(|v| v.as_bool()).unwrap_or(false),
        },
        other => {
            ctx.error(
                node.pos,
                format!("pydantic_evals evaluator `{other}` has no equivalent here (EqualsExpected, Equals, Contains, MaxDuration, IsInstance, LLMJudge)"),
            );
            return None;
        }
    };
    Some(Evaluator { name, check, at: node.pos })
}

/// A case's metadata with its route (and profile) in it, as the other tools keep them.
fn metadata_of(case: &Case) -> Value {
    let mut m = match &case.metadata {
        Some(Value::Object(m)) => m.clone(),
        _ => Map::new(),
    };
    m.insert("route_id".into(), Value::String(case.route_id.clone()));
    if let Some(p) = &case.model_profile {
        m.insert("model_profile".into(), Value::String(p.clone()));
    }
    Value::Object(m)
}

/// An evaluator as pydantic_evals writes it, when it has an equivalent there.
fn to_pydantic(e: &Evaluator) -> Option<Value> {
    Some(match &e.check {
        Check::Equals { path, value: None } if path.is_whole() => json!("EqualsExpected"),
        Check::Equals { path, value: Some(v) } if path.is_whole() => json!({"Equals": v}),
        Check::Contains { path, text: Some(t) } if path.is_whole() => json!({"Contains": t}),
        Check::DurationMax { ms } => json!({"MaxDuration": ms / 1000.0}),
        Check::LlmJudge { rubric, include_goal, .. } => json!({"LLMJudge": {"rubric": rubric, "include_input": include_goal}}),
        _ => return None,
    })
}

/// `dataset` as pydantic_evals' dataset YAML, and the evaluators left out (no equivalent there).
pub fn to_pydantic_yaml(dataset: &Dataset) -> (String, Vec<String>) {
    let mut left_out = Vec::new();
    let mut list = |evaluators: &[Evaluator]| -> Vec<Value> {
        evaluators
            .iter()
            .filter_map(|e| {
                let v = to_pydantic(e);
                if v.is_none() {
                    left_out.push(e.name.clone());
                }
                v
            })
            .collect()
    };
    let cases: Vec<Value> = dataset
        .cases
        .iter()
        .map(|c| {
            let mut case = json!({"name": c.id, "inputs": c.goal, "metadata": metadata_of(c)});
            if let Some(out) = &c.expected.output {
                case["expected_output"] = out.clone();
            }
            // pydantic_evals has no evaluators per route: each case of the route gets them.
            let route = dataset.route_evaluators.iter().filter(|r| r.route_id == c.route_id).flat_map(|r| r.evaluators.iter().cloned());
            let own = list(&route.chain(c.evaluators.iter().cloned()).collect::<Vec<_>>());
            if !own.is_empty() {
                case["evaluators"] = Value::Array(own);
            }
            case
        })
        .collect();
    let doc = json!({"name": dataset.name, "cases": cases, "evaluators": list(&dataset.evaluators)});
    left_out.sort();
    left_out.dedup();
    (serde_saphyr::to_string(&doc).unwrap_or_default(), left_out)
}

/// `dataset` as LangSmith's examples (JSON): `{inputs, outputs, metadata}` per case (`outputs`
/// an object: an expected value that is not one is `{"output": value}`).
pub fn to_langsmith_json(dataset: &Dataset) -> String {
    let examples: Vec<Value> = dataset
        .cases
        .iter()
        .map(|c| {
            let outputs = match &c.expected.output {
                Some(Value::Object(o)) => Value::Object(o.clone()),
                Some(other) => json!({"output": other}),
                None => json!({}),
            };
            let mut metadata = metadata_of(c);
            metadata["case_id"] = Value::String(c.id.clone());
            json!({"inputs": c.goal, "outputs": outputs, "metadata": metadata})
        })
        .collect();
    serde_json::to_string_pretty(&examples).unwrap_or_default()
}

/// An evaluator as our datasets write it, when it can be written back (a compiled schema is;
/// every kind is).
fn to_ours(e: &Evaluator) -> Value {
    let path = |p: &JsonPath| if p.is_whole() { None } else { Some(p.to_string()) };
    let mut body = match &e.check {
        Check::Equals { path: p, value } | Check::JsonSubset { path: p, value } => json!({"path": path(p), "value": value}),
        Check::Schema { schema, .. } => json!({"schema": schema}),
        Check::Contains { path: p, text } => json!({"path": path(p), "text": text}),
        Check::Regex { path: p, pattern } => json!({"path": path(p), "pattern": pattern.as_str()}),
        Check::NumericClose { path: p, value, tolerance } => json!({"path": path(p), "value": value, "tolerance": tolerance}),
        Check::StageEquals { stage, path: p, value } => json!({"stage": stage, "path": path(p), "value": value}),
        Check::DurationMax { ms } => json!({"ms": ms}),
        Check::TokensMax { tokens } => json!({"tokens": tokens}),
        Check::LlmJudge { rubric, profile, include_goal } => json!({"rubric": rubric, "profile": profile, "include_goal": include_goal}),
    };
    if let Value::Object(m) = &mut body {
        m.retain(|_, v| !v.is_null());
        m.insert("name".into(), Value::String(e.name.clone()));
    }
    json!({e.check.kind(): body})
}

/// `dataset` as a dataset YAML of ours.
pub fn to_fabric_yaml(dataset: &Dataset) -> String {
    let cases: Vec<Value> = dataset
        .cases
        .iter()
        .map(|c| {
            let mut case = json!({"id": c.id, "route_id": c.route_id, "goal": c.goal});
            if let Some(p) = &c.model_profile {
                case["model_profile"] = Value::String(p.clone());
            }
            let mut expected = Map::new();
            if let Some(out) = &c.expected.output {
                expected.insert("output".into(), out.clone());
            }
            if !c.expected.stages.is_empty() {
                expected.insert("stages".into(), Value::Object(c.expected.stages.iter().cloned().collect()));
            }
            if !expected.is_empty() {
                case["expected"] = Value::Object(expected);
            }
            if let Some(m) = &c.metadata {
                case["metadata"] = m.clone();
            }
            if !c.evaluators.is_empty() {
                case["evaluators"] = c.evaluators.iter().map(to_ours).collect();
            }
            case
        })
        .collect();
    let routes: Map<String, Value> =
        dataset.route_evaluators.iter().map(|r| (r.route_id.clone(), json!({"evaluators": r.evaluators.iter().map(to_ours).collect::<Vec<_>>()}))).collect();
    let mut doc = json!({"name": dataset.name, "evaluators": dataset.evaluators.iter().map(to_ours).collect::<Vec<_>>(), "cases": cases});
    if !routes.is_empty() {
        doc["routes"] = Value::Object(routes);
    }
    serde_saphyr::to_string(&doc).unwrap_or_default()
}
