//! The `llm_judge` evaluator: a model profile grades a run's output with a rubric, replying with
//! a flat verdict `{pass, score, reason}`. The call goes through the profile's model stack
//! ([`Runtime::ask`]); its verdict is kept in the store under the run and the judge (profile,
//! rubric, options), so grading the run again reads it and asks no model: a judged experiment
//! is regraded for zero tokens.

use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::dataset::Case;
use super::evaluator::{Check, Evaluator};
use super::grade::{RunRecord, Verdict};
use crate::runtime::{Ask, Runtime};
use crate::store::StoreError;
use crate::store::experiments::ExperimentStore;

/// The route id a judge's call is known by (its events, spans, the stub's script
/// `stub/eval-judge.yaml`, by evaluator name).
pub const JUDGE_ROUTE: &str = "eval-judge";

/// What a judge is told, before the rubric.
const SYSTEM: &str = "You grade the output of an automated assistant against a rubric. Read the rubric, the task and the output; \
                      reply with JSON only: {\"pass\": true or false, \"score\": a number from 0 to 1, \"reason\": one short sentence}.";

fn schema() -> Value {
    json!({"type": "object", "properties": {"pass": {"type": "boolean"}, "score": {"type": "number"}, "reason": {"type": "string"}}, "required": ["pass", "score", "reason"]})
}

/// The judge's identity: a verdict is kept under it, so a changed rubric, profile or option is
/// a new judge.
pub fn judge_key(profile: &str, rubric: &str, include_goal: bool) -> String {
    let digest = Sha256::digest(format!("{profile}\n{include_goal}\n{rubric}").as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a judge's call cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JudgeCost {
    pub calls: u32,
    pub tokens: u64,
}

/// `evaluator` (an `llm_judge`) on `record`: the verdict kept for this run and judge, else, with
/// `runtime`, the judge asked now (and its verdict kept); without, a failed verdict saying the
/// run was not judged. A run that did not complete is failed without asking.
pub async fn judge(
    runtime: Option<&Runtime>,
    store: &dyn ExperimentStore,
    evaluator: &Evaluator,
    case: &Case,
    record: &RunRecord,
) -> Result<(Verdict, JudgeCost), StoreError> {
    let Check::LlmJudge { rubric, profile, include_goal } = &evaluator.check else {
        return Ok((super::grade::grade(evaluator, case, record), JudgeCost::default()));
    };
    let verdict = |pass: bool, score: f64, reason: String| Verdict { evaluator: evaluator.name.clone(), pass, score, reason };
    let Some(output) = record.output.as_deref().filter(|_| record.status == "completed") else {
        return Ok((verdict(false, 0.0, format!("the run is {}, with no output to judge", record.status)), JudgeCost::default()));
    };
    let key = judge_key(profile, rubric, *include_goal);
    if let Some((kept, _)) = store.judgement(&record.run_id, &key).await? {
        return Ok((read_verdict(&evaluator.name, &kept), JudgeCost::default()));
    }
    let Some(runtime) = runtime else {
        return Ok((verdict(false, 0.0, "not judged: this run has no verdict of this judge yet, and regrading asks no model".into()), JudgeCost::default()));
    };
    let mut user = format!("Rubric:\n{rubric}\n\n");
    if *include_goal {
        user.push_str(&format!("Task (the goal the assistant was given):\n{}\n\n", Value::Object(case.goal.clone())));
    }
    if let Some(expected) = &case.expected.output {
        user.push_str(&format!("A reference answer:\n{expected}\n\n"));
    }
    user.push_str(&format!("Output to grade:\n{output}\n"));
    let ask = Ask { profile, route_id: JUDGE_ROUTE, stage_id: &evaluator.name, system: SYSTEM, user: &user, schema: &schema() };
    match runtime.ask(ask).await {
        Ok((value, tokens)) => {
            store.put_judgement(&record.run_id, &key, &value, tokens).await?;
            Ok((read_verdict(&evaluator.name, &value), JudgeCost { calls: 1, tokens }))
        }
        // Not kept: a later grading with a runtime asks again.
        Err(e) => Ok((verdict(false, 0.0, format!("the judge failed: {e}")), JudgeCost { calls: 1, tokens: 0 })),
    }
}

/// A kept verdict (the judge's reply as validated against the verdict schema).
fn read_verdict(name: &str, text: &str) -> Verdict {
    let v: Value = serde_json::from_str(text).unwrap_or_default();
    let pass = v.get("pass").and_then(Value::as_bool).unwrap_or(false);
    let score = v.get("score").and_then(Value::as_f64).unwrap_or(if pass { 1.0 } else { 0.0 }).clamp(0.0, 1.0);
    let reason = v.get("reason").and_then(Value::as_str).unwrap_or("the judge gave no reason").to_owned();
    Verdict { evaluator: name.to_owned(), pass, score, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_judge_is_its_profile_rubric_and_options() {
        let k = judge_key("judge", "polite", true);
        assert_eq!(k.len(), 64);
        assert_ne!(k, judge_key("judge", "polite", false));
        assert_ne!(k, judge_key("judge", "polite.", true));
        assert_ne!(k, judge_key("other", "polite", true));
    }

    #[test]
    fn a_verdict_reads_with_its_score_bounded() {
        let v = read_verdict("j", r#"{"pass":true,"score":7,"reason":"fine"}"#);
        assert_eq!((v.pass, v.score, v.reason.as_str()), (true, 1.0, "fine"));
        let v = read_verdict("j", "not json");
        assert_eq!((v.pass, v.score), (false, 0.0));
    }
}
