//! Grading: pure functions of an evaluator, a case and a run's record ([`RunRecord`]: its end,
//! output, stage values, duration and tokens) into a [`Verdict`]. No model call and no I/O, so
//! a recorded run graded twice gets the same verdicts (`fabric eval regrade`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::dataset::Case;
use super::evaluator::{Check, Evaluator, JsonPath};

/// What grading reads of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    pub run_id: String,
    /// `completed`, `failed`, `awaiting_input`, `cancelled` (the store's spelling).
    pub status: String,
    pub output: Option<String>,
    /// Each completed stage's value, in completion order.
    pub stages: Vec<(String, String)>,
    /// Why a run that did not complete ended so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub duration_ms: Option<f64>,
    /// Input and output tokens of its model calls, as the providers reported them.
    pub tokens: u64,
    /// Model calls made (not taken from a journal).
    pub llm_calls: u32,
}

/// One evaluator's verdict on one run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Verdict {
    pub evaluator: String,
    pub pass: bool,
    /// 0 to 1: 1 or 0 for a check, the share of fields matched for `json_subset`, the judge's
    /// score for `llm_judge`.
    pub score: f64,
    pub reason: String,
}

impl Verdict {
    fn of(evaluator: &Evaluator, pass: bool, reason: impl Into<String>) -> Verdict {
        Verdict { evaluator: evaluator.name.clone(), pass, score: if pass { 1.0 } else { 0.0 }, reason: reason.into() }
    }
}

/// A JSON text as its value, anything else as a string.
pub fn as_json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// Grades `record` with `evaluator` for `case`. An `llm_judge` is graded by
/// [`super::judge`] (a model call); here it only says so.
pub fn grade(evaluator: &Evaluator, case: &Case, record: &RunRecord) -> Verdict {
    let v = |pass, reason: String| Verdict::of(evaluator, pass, reason);
    // What needs the run's output fails without it.
    let output = || -> Result<Value, Verdict> {
        match (&record.output, record.status.as_str()) {
            (Some(o), "completed") => Ok(as_json(o)),
            (None, "completed") => Err(v(false, "the run completed without an output".into())),
            (_, status) => Err(v(false, format!("the run is {status}{}", record.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default()))),
        }
    };
    let expected = |value: &Option<Value>, path: &JsonPath| -> Result<Value, Verdict> {
        match value {
            Some(v) => Ok(v.clone()),
            None => case.expected.output.as_ref().and_then(|o| path.get(o)).cloned().ok_or_else(|| v(false, format!("the case expects no output at {path}"))),
        }
    };
    let at = |out: &Value, path: &JsonPath| -> Result<Value, Verdict> {
        path.get(out).cloned().ok_or_else(|| v(false, format!("the output has nothing at {path}")))
    };
    let result = (|| -> Result<Verdict, Verdict> {
        Ok(match &evaluator.check {
            Check::Equals { path, value } => {
                let (want, got) = (expected(value, path)?, at(&output()?, path)?);
                v(same(&want, &got), format!("expected {want} at {path}, got {got}"))
            }
            Check::Schema { validator, .. } => {
                let out = output()?;
                let problems: Vec<String> = validator.iter_errors(&out).map(|e| format!("{}: {e}", e.instance_path())).collect();
                v(problems.is_empty(), if problems.is_empty() { "the output matches the schema".into() } else { problems.join("; ") })
            }
            Check::Contains { path, text } => {
                let want = match text {
                    Some(t) => t.clone(),
                    None => text_of(&expected(&None, path)?),
                };
                let got = text_of(&at(&output()?, path)?);
                v(got.contains(&want), format!("{path} {} {want:?}", if got.contains(&want) { "contains" } else { "does not contain" }))
            }
            Check::Regex { path, pattern } => {
                let got = text_of(&at(&output()?, path)?);
                let hit = pattern.is_match(&got);
                v(hit, format!("{path} {} /{}/", if hit { "matches" } else { "does not match" }, pattern.as_str()))
            }
            Check::JsonSubset { path, value } => {
                let (want, got) = (expected(value, path)?, at(&output()?, path)?);
                let (matched, total, missing) = subset(&want, &got, "$".into());
                let mut verdict = v(missing.is_empty(), if missing.is_empty() { format!("all {total} expected field(s) match") } else { missing.join("; ") });
                verdict.score = if total == 0 { 1.0 } else { matched as f64 / total as f64 };
                verdict
            }
            Check::NumericClose { path, value, tolerance } => {
                let want = match value {
                    Some(n) => *n,
                    None => expected(&None, path)?.as_f64().ok_or_else(|| v(false, format!("the case's expected value at {path} is not a number")))?,
                };
                let got = at(&output()?, path)?;
                match number_of(&got) {
                    Some(n) => v((n - want).abs() <= *tolerance, format!("{n} at {path}, expected {want} ± {tolerance}")),
                    None => v(false, format!("{path} is {got}, not a number")),
                }
            }
            Check::StageEquals { stage, path, value } => {
                let Some((_, got)) = record.stages.iter().find(|(s, _)| s == stage) else {
                    return Err(v(false, format!("stage `{stage}` did not complete")));
                };
                let got = at(&as_json(got), path)?;
                let want = match value {
                    Some(w) => w.clone(),
                    None => case
                        .expected
                        .stage(stage)
                        .and_then(|e| path.get(e))
                        .cloned()
                        .ok_or_else(|| v(false, format!("the case expects no value of stage `{stage}` at {path}")))?,
                };
                v(same(&want, &got), format!("stage `{stage}`: expected {want} at {path}, got {got}"))
            }
            Check::DurationMax { ms } => match record.duration_ms {
                Some(d) => v(d <= *ms, format!("{d:.0} ms, at most {ms} ms")),
                None => v(false, "the run's duration is not recorded".into()),
            },
            Check::TokensMax { tokens } => v(record.tokens <= *tokens, format!("{} tokens, at most {tokens}", record.tokens)),
            Check::LlmJudge { .. } => v(false, "not judged: a judge's verdict comes from its model call".into()),
        })
    })();
    result.unwrap_or_else(|verdict| verdict)
}

/// Equal as JSON, numbers as numbers (`1` and `1.0` are the same).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| same(a, b))),
        _ => a == b,
    }
}

/// How many of `want`'s leaves `got` has equal, how many there are, and which are not.
fn subset(want: &Value, got: &Value, at: String) -> (usize, usize, Vec<String>) {
    match want {
        Value::Object(fields) if !fields.is_empty() => fields.iter().fold((0, 0, Vec::new()), |(m, t, mut miss), (k, w)| {
            let (m2, t2, miss2) = match got.get(k) {
                Some(g) => subset(w, g, format!("{at}.{k}")),
                None => (0, leaves(w), vec![format!("{at}.{k} is missing")]),
            };
            miss.extend(miss2);
            (m + m2, t + t2, miss)
        }),
        _ if same(want, got) => (1, 1, Vec::new()),
        _ => (0, 1, vec![format!("{at}: expected {want}, got {got}")]),
    }
}

fn leaves(v: &Value) -> usize {
    match v {
        Value::Object(f) if !f.is_empty() => f.values().map(leaves).sum(),
        _ => 1,
    }
}

/// A value as text: a string as itself, anything else as JSON.
fn text_of(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

/// A number, or a string that reads as one.
fn number_of(v: &Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::Dataset;

    const DATASET: &str = r#"
evaluators:
  - equals: {path: category}
  - json_subset
  - stage_equals: {stage: intake, path: urgency}
  - contains: {path: note, text: refund}
  - regex: {path: note, pattern: '^We'}
  - numeric_close: {path: amount, tolerance: 0.01}
  - duration_max: {ms: 50}
  - tokens_max: {tokens: 40}
  - schema: {schema: {type: object, required: [category]}}
cases:
  - id: a
    route_id: r
    goal: {}
    expected:
      output: {category: billing, amount: 9.99}
      stages: {intake: {urgency: high}}
"#;

    fn record(output: Value) -> RunRecord {
        RunRecord {
            run_id: "r1".into(),
            status: "completed".into(),
            output: Some(output.to_string()),
            stages: vec![("intake".into(), r#"{"urgency":"high"}"#.into())],
            duration_ms: Some(20.0),
            tokens: 40,
            ..RunRecord::default()
        }
    }

    fn grades(r: &RunRecord) -> Vec<(String, bool)> {
        let d = Dataset::parse(std::path::Path::new("d.yaml"), DATASET).unwrap();
        d.evaluators_of(&d.cases[0]).map(|e| grade(e, &d.cases[0], r)).map(|v| (v.evaluator, v.pass)).collect()
    }

    #[test]
    fn a_right_answer_passes_every_check() {
        let out = serde_json::json!({"category": "billing", "amount": 9.99, "note": "We refund it"});
        let failed: Vec<_> = grades(&record(out)).into_iter().filter(|(_, p)| !p).collect();
        assert!(failed.is_empty(), "{failed:?}");
    }

    #[test]
    fn a_wrong_answer_fails_each_check_with_a_reason() {
        let mut r = record(serde_json::json!({"category": "technical", "amount": "12", "note": "No"}));
        r.stages[0].1 = r#"{"urgency":"low"}"#.into();
        r.duration_ms = Some(51.0);
        r.tokens = 41;
        let passed: Vec<_> = grades(&r).into_iter().filter(|(_, p)| *p).map(|(n, _)| n).collect();
        assert_eq!(passed, ["schema"]);
        let d = Dataset::parse(std::path::Path::new("d.yaml"), DATASET).unwrap();
        let subset = grade(&d.evaluators[1], &d.cases[0], &r);
        assert_eq!(subset.score, 0.0);
        assert_eq!(subset.reason, "$.category: expected \"billing\", got \"technical\"; $.amount: expected 9.99, got \"12\"");
    }

    #[test]
    fn a_failed_run_fails_what_needs_its_output() {
        let r = RunRecord { status: "failed".into(), error: Some("provider_error: boom".into()), tokens: 0, duration_ms: Some(1.0), ..RunRecord::default() };
        let d = Dataset::parse(std::path::Path::new("d.yaml"), DATASET).unwrap();
        let v = grade(&d.evaluators[0], &d.cases[0], &r);
        assert_eq!((v.pass, v.reason.as_str()), (false, "the run is failed: provider_error: boom"));
        assert!(grade(&d.evaluators[7], &d.cases[0], &r).pass, "tokens_max needs no output");
    }
}
