//! Evaluators as a dataset declares them, decoded once into [`Evaluator`]s (a regex compiled, a
//! schema compiled, a path parsed): grading never re-checks them.
//!
//! Each is a one-key mapping, the key its kind: `equals`, `schema`, `contains`, `regex`,
//! `json_subset`, `numeric_close`, `stage_equals`, `duration_max`, `tokens_max`, `llm_judge`;
//! any of them may have a `name` (the report's column, default the kind and its path).

use std::sync::Arc;

use serde_json::Value;

use crate::diag::Pos;
use crate::yaml::{self, Ctx, Fields, Node};

/// An evaluator: its name in reports and what it checks.
#[derive(Debug, Clone)]
pub struct Evaluator {
    pub name: String,
    pub check: Check,
    /// Where it was declared.
    pub at: Pos,
}

/// What an evaluator checks. A `value` left out is the case's expected value at the same place
/// (its `expected.output`, or for `stage_equals` its `expected.stages`).
#[derive(Debug, Clone)]
pub enum Check {
    /// The output (at `path`) equals the value (numbers compared as numbers).
    Equals { path: JsonPath, value: Option<Value> },
    /// The output validates against a JSON Schema.
    Schema { schema: Value, validator: Arc<jsonschema::Validator> },
    /// The output (at `path`, as text) contains the text.
    Contains { path: JsonPath, text: Option<String> },
    /// The output (at `path`, as text) matches the regular expression.
    Regex { path: JsonPath, pattern: regex::Regex },
    /// Every field of the value is in the output (at `path`) with the same value, recursively.
    JsonSubset { path: JsonPath, value: Option<Value> },
    /// The output (at `path`) is a number within `tolerance` of the value.
    NumericClose { path: JsonPath, value: Option<f64>, tolerance: f64 },
    /// The value of stage `stage` (at `path`) equals the value.
    StageEquals { stage: String, path: JsonPath, value: Option<Value> },
    /// The run took at most `ms` milliseconds.
    DurationMax { ms: f64 },
    /// The run's model calls used at most `tokens` tokens (input and output).
    TokensMax { tokens: u64 },
    /// A model profile grades the output with a rubric: a verdict `{pass, score, reason}`.
    LlmJudge { rubric: String, profile: String, include_goal: bool },
}

impl Check {
    /// The kind, as the dataset spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Check::Equals { .. } => "equals",
            Check::Schema { .. } => "schema",
            Check::Contains { .. } => "contains",
            Check::Regex { .. } => "regex",
            Check::JsonSubset { .. } => "json_subset",
            Check::NumericClose { .. } => "numeric_close",
            Check::StageEquals { .. } => "stage_equals",
            Check::DurationMax { .. } => "duration_max",
            Check::TokensMax { .. } => "tokens_max",
            Check::LlmJudge { .. } => "llm_judge",
        }
    }
}

/// The largest `tokens_max`.
const MAX_TOKENS: u64 = 1_000_000_000_000;

const KINDS: &str = "equals, schema, contains, regex, json_subset, numeric_close, stage_equals, duration_max, tokens_max, llm_judge";

/// A path into a JSON value: `category`, `items.0.name`, `$.items[0].name`; empty: the whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JsonPath(Vec<Step>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

impl JsonPath {
    /// Parses a path; `None` when a bracket does not close on a whole number.
    pub fn parse(text: &str) -> Option<JsonPath> {
        let text = text.strip_prefix('$').unwrap_or(text);
        let mut steps = Vec::new();
        for part in text.split('.').filter(|p| !p.is_empty()) {
            let (key, brackets) = part.split_once('[').map_or((part, None), |(k, r)| (k, Some(r)));
            if !key.is_empty() {
                steps.push(match key.parse::<usize>() {
                    Ok(i) => Step::Index(i),
                    Err(_) => Step::Key(key.to_owned()),
                });
            }
            let mut rest = brackets;
            while let Some(open) = rest {
                let (index, after) = open.split_once(']')?;
                steps.push(Step::Index(index.parse().ok()?));
                rest = match after {
                    "" => None,
                    _ => Some(after.strip_prefix('[')?),
                };
            }
        }
        Some(JsonPath(steps))
    }

    /// The value at this path in `value`.
    pub fn get<'v>(&self, value: &'v Value) -> Option<&'v Value> {
        self.0.iter().try_fold(value, |v, step| match step {
            Step::Key(k) => v.get(k.as_str()),
            Step::Index(i) => v.get(*i),
        })
    }

    pub fn is_whole(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::fmt::Display for JsonPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("$")?;
        for step in &self.0 {
            match step {
                Step::Key(k) => write!(f, ".{k}")?,
                Step::Index(i) => write!(f, "[{i}]")?,
            }
        }
        Ok(())
    }
}

/// A list of evaluators (a dataset's or a case's); a broken one is reported and left out.
pub fn decode_evaluators(ctx: &mut Ctx<'_>, node: &Node) -> Vec<Evaluator> {
    let Some(items) = ctx.seq(node, "`evaluators`") else { return Vec::new() };
    items.iter().filter_map(|item| decode_evaluator(ctx, item)).collect()
}

fn decode_evaluator(ctx: &mut Ctx<'_>, node: &Node) -> Option<Evaluator> {
    let entries = match &node.value {
        yaml::Value::Map(entries) => entries,
        // A kind alone: `- schema` is no use, but `- equals` is (the whole output).
        yaml::Value::Str(kind) => return decode_kind(ctx, kind, node.pos, None),
        other => {
            ctx.error(node.pos, format!("an evaluator must be a mapping with one key, its kind ({KINDS}), found {}", other.kind()));
            return None;
        }
    };
    let [(key, body)] = entries.as_slice() else {
        ctx.error(node.pos, format!("an evaluator is a mapping with one key, its kind ({KINDS}); found {} keys", entries.len()));
        return None;
    };
    decode_kind(ctx, &key.name, key.pos, Some(body))
}

fn decode_kind(ctx: &mut Ctx<'_>, kind: &str, at: Pos, body: Option<&Node>) -> Option<Evaluator> {
    let empty = Node { pos: at, value: yaml::Value::Map(Vec::new()) };
    let body = match body {
        Some(Node { value: yaml::Value::Null, .. }) | None => &empty,
        Some(b) => b,
    };
    let what = format!("evaluator `{kind}`");
    let mut fields = ctx.map(body, &what)?;
    let name = fields.get("name").and_then(|n| ctx.string(n, "an evaluator's `name`"));
    let path = path_field(ctx, &mut fields);
    let check = match kind {
        "equals" => Some(Check::Equals { path: path.clone(), value: fields.get("value").map(yaml::to_json) }),
        "json_subset" => Some(Check::JsonSubset { path: path.clone(), value: fields.get("value").map(yaml::to_json) }),
        "contains" => {
            let text = fields.get("text").and_then(|n| ctx.string(n, "`text`"));
            Some(Check::Contains { path: path.clone(), text })
        }
        "regex" => {
            let node = fields.require(ctx, "pattern");
            node.and_then(|n| Some((n.pos, ctx.string(n, "`pattern`")?))).and_then(|(pos, p)| match regex::Regex::new(&p) {
                Ok(pattern) => Some(Check::Regex { path: path.clone(), pattern }),
                Err(e) => {
                    ctx.error(
                        pos,
                        format!("`pattern` is not a regular expression: {}", e.to_string().lines().last().unwrap_or_default().trim_start_matches("error: ")),
                    );
                    None
                }
            })
        }
        "schema" => fields.require(ctx, "schema").and_then(|n| {
            let schema = yaml::to_json(n);
            match jsonschema::validator_for(&schema) {
                Ok(v) => Some(Check::Schema { schema, validator: Arc::new(v) }),
                Err(e) => {
                    ctx.error(n.pos, format!("`schema` is not a JSON Schema: {e}"));
                    None
                }
            }
        }),
        "numeric_close" => {
            let value = fields.get("value").and_then(|n| number(ctx, n, "`value`"));
            let tolerance = fields.get("tolerance").and_then(|n| number(ctx, n, "`tolerance`")).unwrap_or(1e-9);
            Some(Check::NumericClose { path: path.clone(), value, tolerance })
        }
        "stage_equals" => {
            let stage = fields.require(ctx, "stage").and_then(|n| ctx.ident(n, "`stage`"));
            stage.map(|stage| Check::StageEquals { stage, path: path.clone(), value: fields.get("value").map(yaml::to_json) })
        }
        "duration_max" => fields.require(ctx, "ms").and_then(|n| number(ctx, n, "`ms`")).map(|ms| Check::DurationMax { ms }),
        "tokens_max" => fields.require(ctx, "tokens").and_then(|n| ctx.uint(n, "`tokens`", 0, MAX_TOKENS)).map(|tokens| Check::TokensMax { tokens }),
        "llm_judge" => {
            let rubric = fields.require(ctx, "rubric").and_then(|n| ctx.string(n, "`rubric`"));
            let profile = fields.require(ctx, "profile").and_then(|n| ctx.ident(n, "`profile`"));
            let include_goal = fields.get("include_goal").and_then(|n| ctx.bool(n, "`include_goal`")).unwrap_or(true);
            rubric.zip(profile).map(|(rubric, profile)| Check::LlmJudge { rubric, profile, include_goal })
        }
        other => {
            ctx.error(at, format!("unknown evaluator `{other}`; expected one of: {KINDS}"));
            return None;
        }
    };
    fields.finish(ctx);
    let check = check?;
    let name = name.unwrap_or_else(|| default_name(&check));
    Some(Evaluator { name, check, at })
}

/// `path`, when the mapping has one (an empty path when not, or when it does not read).
fn path_field(ctx: &mut Ctx<'_>, fields: &mut Fields<'_>) -> JsonPath {
    let Some(node) = fields.get("path") else { return JsonPath::default() };
    let text = ctx.string(node, "`path`").unwrap_or_default();
    JsonPath::parse(&text).unwrap_or_else(|| {
        ctx.error(node.pos, format!("`path` `{text}` does not read: write `a.b.0` or `$.a.b[0]`"));
        JsonPath::default()
    })
}

fn number(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<f64> {
    match node.value {
        yaml::Value::Int(n) => Some(n as f64),
        yaml::Value::UInt(n) => Some(n as f64),
        yaml::Value::Float(f) => Some(f),
        ref other => {
            ctx.error(node.pos, format!("{what} must be a number, found {}", other.kind()));
            None
        }
    }
}

fn default_name(check: &Check) -> String {
    let kind = check.kind();
    match check {
        Check::Equals { path, .. }
        | Check::Contains { path, .. }
        | Check::Regex { path, .. }
        | Check::JsonSubset { path, .. }
        | Check::NumericClose { path, .. }
            if !path.is_whole() =>
        {
            format!("{kind}:{path}")
        }
        Check::StageEquals { stage, path, .. } if path.is_whole() => format!("{kind}:{stage}"),
        Check::StageEquals { stage, path, .. } => format!("{kind}:{stage}{}", &path.to_string()[1..]),
        _ => kind.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;

    fn decode(text: &str) -> (Vec<Evaluator>, Vec<String>) {
        let path = std::path::Path::new("d.yaml");
        let mut diags = Diagnostics::default();
        let node = yaml::parse(path, text, &mut diags).unwrap();
        let mut ctx = Ctx { path, diags: &mut diags };
        let out = decode_evaluators(&mut ctx, &node);
        (out, diags.into_vec().iter().map(ToString::to_string).collect())
    }

    #[test]
    fn every_kind_decodes_with_its_name() {
        let text = "- equals\n- equals: {path: a.b}\n- schema: {schema: {type: object}}\n- contains: {text: hi}\n- regex: {pattern: '^b'}\n- json_subset: {}\n\
                    - numeric_close: {path: n, tolerance: 0.5}\n- stage_equals: {stage: intake, path: category}\n- duration_max: {ms: 100}\n\
                    - tokens_max: {tokens: 10}\n- llm_judge: {rubric: polite, profile: judge, name: politeness}\n";
        let (evaluators, problems) = decode(text);
        assert!(problems.is_empty(), "{problems:#?}");
        let names: Vec<&str> = evaluators.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "equals",
                "equals:$.a.b",
                "schema",
                "contains",
                "regex",
                "json_subset",
                "numeric_close:$.n",
                "stage_equals:intake.category",
                "duration_max",
                "tokens_max",
                "politeness"
            ]
        );
    }

    #[test]
    fn broken_evaluators_are_located() {
        let (evaluators, problems) =
            decode("- regex: {pattern: '('}\n- nearly: {}\n- equals: {path: 'a[x]'}\n- tokens_max: {tokens: -1}\n- {equals: {}, regex: {}}\n");
        assert_eq!(evaluators.len(), 1, "equals with a bad path stays, its path reported");
        assert!(problems[0].starts_with("d.yaml:1:20: `pattern` is not a regular expression"), "{problems:#?}");
        assert_eq!(problems[1], format!("d.yaml:2:3: unknown evaluator `nearly`; expected one of: {KINDS}"));
        assert!(problems[2].starts_with("d.yaml:3:18: `path` `a[x]` does not read"), "{problems:#?}");
        assert!(problems[3].starts_with("d.yaml:4:24: `tokens` must be a whole number"), "{problems:#?}");
        assert!(problems[4].starts_with("d.yaml:5:3: an evaluator is a mapping with one key"), "{problems:#?}");
    }

    #[test]
    fn paths_read_both_ways() {
        let v = serde_json::json!({"items": [{"name": "x"}]});
        for p in ["items.0.name", "$.items[0].name", "items[0].name"] {
            assert_eq!(JsonPath::parse(p).unwrap().get(&v), Some(&serde_json::json!("x")), "{p}");
        }
        assert_eq!(JsonPath::parse("$").unwrap().get(&v), Some(&v));
        assert!(JsonPath::parse("a[").is_none());
        assert!(JsonPath::parse("a[0]x").is_none());
        assert_eq!(JsonPath::parse("items[0].name").unwrap().to_string(), "$.items[0].name");
    }
}
