//! Mode 1, the decision loop of Pattern 1 routes.
//!
//! Each turn the model returns one [`decision::AgentDecision`]. `tool_call` names a tool of the
//! hydrated list (checked inside the model call, so an unknown tool fails the call with
//! `unknown_tool`); its arguments are checked against the tool's input schema before anything is
//! sent; the tool's result, or its error, becomes a note and the model gets another turn. `ask`
//! ends the run awaiting the user; `done` completes it. `max_loop_steps` bounds the model turns.

pub mod decision;

use opentelemetry::Context;
use serde_json::{Map, Value};

use crate::exec::{Finish, Run, RunState, Runner, StageFailure};
use crate::hydrate::{NodeKind, StageNode};
use crate::llm::{ReasonClass, ReplyValue};
use decision::Action;

impl Runner {
    pub(crate) async fn agent_loop(&self, run: &Run<'_>, state: &mut RunState, run_cx: &Context) -> Result<Finish, (Option<String>, StageFailure)> {
        let route = run.route;
        let decide = &route.graph[route.entry];
        let mut decisions: Vec<Value> = Vec::new();
        let mut stage_idx = 0;
        loop {
            if state.turns >= run.budget {
                let f = StageFailure::new(ReasonClass::LoopBudgetExceeded, format!("no answer after max_loop_steps ({}) model turns", run.budget))
                    .with_detail(Value::Array(decisions));
                return Err(self.refuse_stage(run, decide, f));
            }
            state.turns += 1;
            let open = self.begin_stage(run, decide, stage_idx, run_cx);
            stage_idx += 1;
            let reply = self.call_model(run, decide, state, &open.cx).await;
            let decision = match reply {
                Ok(ReplyValue::Decision(d)) => d,
                Ok(_) => {
                    let f = StageFailure::new(ReasonClass::ProviderError, "the backend did not return a decision");
                    self.end_stage(run, open, Err(&f), state, false);
                    return Err((Some(decide.id.clone()), f));
                }
                Err(f) => {
                    self.end_stage(run, open, Err(&f), state, false);
                    return Err((Some(decide.id.clone()), f));
                }
            };
            let as_json = decision.to_json();
            decisions.push(as_json.clone());
            self.end_stage(run, open, Ok(as_json.to_string()), state, false);
            match decision.action {
                Action::Done => {
                    state.last_output = decision.message;
                    return Ok(Finish::Completed);
                }
                Action::Ask => return Ok(Finish::AwaitingInput(decision.message.unwrap_or_default())),
                Action::ToolCall => {
                    let name = decision.tool_name.unwrap_or_default();
                    // The name was checked against the tool list inside the model call.
                    let Some(tool) = route.nodes().map(|(_, n)| n).find(|n| n.kind == NodeKind::Tool && n.id == name) else {
                        return Err((
                            Some(decide.id.clone()),
                            StageFailure::new(ReasonClass::UnknownTool, format!("no tool `{name}` in route `{}`", route.id)),
                        ));
                    };
                    let open = self.begin_stage(run, tool, stage_idx, run_cx);
                    stage_idx += 1;
                    let outcome = self.run_agent_tool(run, tool, &decision.arguments).await;
                    match outcome {
                        Ok(text) => self.end_stage(run, open, Ok(text), state, true),
                        Err(f) => {
                            // A tool error never ends the run: the model sees it and decides again.
                            state.notes.push(crate::exec::message::compress_note(&format!("{}: error: {}: {}", tool.id, f.class.as_str(), f.message)));
                            self.end_stage(run, open, Err(&f), state, false);
                        }
                    }
                }
            }
        }
    }

    async fn run_agent_tool(&self, run: &Run<'_>, tool: &StageNode, args: &Map<String, Value>) -> Result<String, StageFailure> {
        let Some(cap) = &tool.capability else { return Err(StageFailure::new(ReasonClass::UnknownTool, format!("tool `{}` has no capability", tool.id))) };
        if let Some(validator) = &cap.def.input_validator {
            let instance = Value::Object(args.clone());
            let problems: Vec<String> = validator
                .iter_errors(&instance)
                .take(5)
                .map(|e| {
                    let at = e.instance_path().to_string();
                    if at.is_empty() { e.to_string() } else { format!("{at}: {e}") }
                })
                .collect();
            if !problems.is_empty() {
                run.events.emit(
                    "run.tool.failed",
                    Some(&tool.id),
                    || crate::fields! {"tool" => tool.id, "reason_class" => ReasonClass::InvalidToolArguments.as_str(), "message" => problems.join("; ")},
                );
                return Err(StageFailure::new(ReasonClass::InvalidToolArguments, format!("arguments do not match the input schema: {}", problems.join("; "))));
            }
        }
        if let Some(invoke) = &cap.def.invoke {
            return match self.tool_url(tool) {
                Some((invoke, url)) => self.call_tool(tool, invoke, &url, args, run.events, run.cancel).await,
                None => Err(StageFailure::new(
                    ReasonClass::ToolConnection,
                    format!("the tool's URL `{}` is not configured (a variable in it is unset)", invoke.url.raw),
                )),
            };
        }
        self.call_in_process_tool(tool, args, run.events, run.cancel).await
    }
}
