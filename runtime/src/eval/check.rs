//! A dataset checked against the runtime it runs on, before any model call: every case's route
//! can start here, its goal is one the route's `goal_schema` takes, its model profile and every
//! judge's are defined, and what it expects of a stage names a stage of the route with a value
//! of the stage's output type. Every problem is located in the dataset's file, all of them at once.

use serde_json::Value;

use super::dataset::Dataset;
use super::evaluator::Check;
use crate::diag::{Diagnostic, Pos, Severity};
use crate::hydrate::Route;
use crate::llm::OutputSpec;
use crate::runtime::Runtime;

/// Every problem of `dataset` on `runtime` (empty: it can run).
pub fn check(dataset: &Dataset, runtime: &Runtime) -> Vec<Diagnostic> {
    let catalogue = runtime.catalogue();
    let profiles: Vec<&String> = catalogue.profiles().map(|(name, _)| name).collect();
    let mut problems = Vec::new();
    let mut say = |pos: Pos, message: String| problems.push(Diagnostic { path: dataset.path.clone(), pos, severity: Severity::Error, message });
    for case in &dataset.cases {
        let route = match runtime.check_route(&case.route_id) {
            Ok(route) => Some(route),
            Err(e) => {
                say(case.at.route_id, format!("case `{}`: {e}", case.id));
                None
            }
        };
        if let Some(profile) = &case.model_profile
            && !profiles.contains(&profile)
        {
            say(case.at.model_profile, format!("case `{}`: model profile `{profile}` is not defined in the catalogue", case.id));
        }
        for evaluator in dataset.evaluators_of(case) {
            match &evaluator.check {
                Check::LlmJudge { profile, .. } if !profiles.contains(&profile) => {
                    say(evaluator.at, format!("evaluator `{}`: judge profile `{profile}` is not defined in the catalogue", evaluator.name));
                }
                Check::StageEquals { stage, .. } if route.as_ref().is_some_and(|r| stage_of(r, stage).is_none()) => {
                    say(evaluator.at, format!("case `{}`: evaluator `{}`: route `{}` has no stage `{stage}`", case.id, evaluator.name, case.route_id));
                }
                Check::NumericClose { path, value: None, .. } => {
                    if let Some(want) = case.expected.output.as_ref().and_then(|o| path.get(o))
                        && !want.is_number()
                    {
                        say(case.at.output, format!("case `{}`: evaluator `{}` expects a number at {path}, found {want}", case.id, evaluator.name));
                    }
                }
                _ => {}
            }
        }
        let Some(route) = route else { continue };
        let goal = route.goal_problems(&case.goal);
        if !goal.is_empty() {
            say(case.at.goal, format!("case `{}`: the goal does not match the `goal_schema` of route `{}`: {}", case.id, case.route_id, goal.join("; ")));
        }
        for ((stage, want), pos) in case.expected.stages.iter().zip(&case.at.stages) {
            if let Some(why) = stage_problem(&route, stage, want) {
                say(*pos, format!("case `{}`: expected stage `{stage}`: {why}", case.id));
            }
        }
    }
    for routed in &dataset.route_evaluators {
        if let Err(e) = runtime.check_route(&routed.route_id) {
            say(routed.at, format!("`routes`: {e}"));
        }
    }
    // A dataset's evaluator is checked with each case: said once.
    problems.sort_by(|a, b| (a.pos, &a.message).cmp(&(b.pos, &b.message)));
    problems.dedup();
    problems
}

fn stage_of<'r>(route: &'r Route, stage: &str) -> Option<&'r crate::hydrate::StageNode> {
    route.nodes().map(|(_, n)| n).find(|n| n.id() == stage)
}

/// Why `want` cannot be a value of `stage` of `route`: no such stage, or a value of another
/// type than its output schema's (an object's fields checked that are given: a part may be
/// expected).
fn stage_problem(route: &Route, stage: &str, want: &Value) -> Option<String> {
    let Some(node) = stage_of(route, stage) else {
        let stages: Vec<&str> = route.nodes().map(|(_, n)| n).filter(|n| !matches!(n.kind(), crate::hydrate::NodeKind::End)).map(|n| n.id()).collect();
        return Some(format!("route `{}` has no such stage (its stages: {})", route.id(), stages.join(", ")));
    };
    let OutputSpec::Bindable(schema) = node.output() else { return None };
    if schema.is_text_envelope() {
        return (!want.is_string()).then(|| format!("the stage's value is text, the case expects {}", kind(want)));
    }
    let Value::Object(_) = want else { return Some(format!("the stage's value is an object, the case expects {}", kind(want))) };
    let mut partial = schema.source().clone();
    if let Some(obj) = partial.as_object_mut() {
        obj.remove("required");
    }
    let validator = jsonschema::validator_for(&partial).ok()?;
    let problems = crate::defs::schema_problems(&validator, want);
    (!problems.is_empty()).then(|| format!("the value does not match the stage's output schema: {}", problems.join("; ")))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
