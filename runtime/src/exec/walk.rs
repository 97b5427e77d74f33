//! The run and the graph walk: a run's start and end (its events, span, result and last commit),
//! the walk of a workflow route from stage to stage, and the branch conditions it evaluates.

use opentelemetry::trace::SpanKind;
use opentelemetry::{Context, KeyValue};
use serde_json::Value;

use super::agent::Asked;
use super::state::{Finish, Last, Run, RunState, StageFailure, Staged};
use super::{JournalBatch, RunEnd, RunFailure, RunResult, Runner};
use crate::defs::{CondOp, Condition};
use crate::events::EventData;
use crate::failure::{BoxFuture, ReasonClass};
use crate::hydrate::{NextStep, RoutePath};
use crate::llm::telemetry::round_ms;

impl Runner {
    pub(super) fn run_route<'a>(&'a self, run: Run<'a>, parent_cx: &'a Context, mut state: RunState, resumed: Option<&'a str>) -> BoxFuture<'a, RunResult> {
        Box::pin(async move {
            let Run { route, prefetch, events, .. } = run;
            // A decision-loop run is an agent in the GenAI conventions: `invoke_agent {route}`.
            let agent = route.path() == RoutePath::DecisionLoop;
            let run_cx = crate::otel::child(
                parent_cx,
                || crate::otel::run_span_name(route.id(), agent),
                SpanKind::Internal,
                || {
                    let mut attributes = vec![
                        KeyValue::new("fabric.run_id", events.run_id().to_owned()),
                        KeyValue::new("fabric.route_id", route.id().to_owned()),
                        KeyValue::new("fabric.model_profile", route.model_profile().to_owned()),
                    ];
                    if agent {
                        attributes.push(KeyValue::new("gen_ai.operation.name", "invoke_agent"));
                        attributes.push(KeyValue::new("gen_ai.agent.name", route.id().to_owned()));
                    }
                    attributes
                },
            );
            let started = events.stopwatch();
            if let Some(reply) = resumed {
                events.emit_new(None, || EventData::RunResumed { reply: reply.to_owned() });
            } else {
                events.emit(None, || EventData::RunStarted {
                    model_profile: route.model_profile().to_owned(),
                    path: route.path().as_str(),
                    prefetch_chunks: prefetch.len(),
                    source: route.source().map(str::to_owned),
                    activation_target: route.activation_target().map(str::to_owned),
                });
            }
            let outcome = if route.path() == RoutePath::DecisionLoop {
                self.decision_loop(&run, &mut state, &run_cx).await
            } else {
                self.walk(&run, &mut state, &run_cx).await
            };
            let duration_ms = round_ms(started.elapsed().as_secs_f64() * 1000.0);
            let pending = std::mem::take(&mut state.pending);
            let divergences = std::mem::take(&mut state.source).finish();
            let mut llm_calls = std::mem::take(&mut state.llm_calls);
            llm_calls.append(&mut state.child_calls);
            let cancelled = match &outcome {
                // A run that got to its end before it saw the request keeps its end.
                Ok(Finish::Completed) => None,
                _ => run.cancel.requested(),
            };
            let end = match outcome {
                _ if let Some(reason) = cancelled => {
                    crate::otel::fail_cx(&run_cx, ReasonClass::Cancelled.as_str());
                    events.emit(None, || EventData::RunCancelled { reason: reason.clone(), duration_ms: Some(duration_ms) });
                    RunEnd::cancelled(&reason)
                }
                Ok(Finish::Completed) => {
                    let output = match state.last_output {
                        Some(Last::Slot(at)) => state.slots.get_index(at).map(|(_, v)| v.clone()),
                        Some(Last::Answer(answer)) => Some(answer),
                        None => None,
                    };
                    events.emit(None, || EventData::RunCompleted { output: output.clone(), duration_ms });
                    RunEnd::Completed { output }
                }
                Ok(Finish::AwaitingInput(question)) => {
                    events.emit(None, || EventData::RunAwaitingInput { question: question.clone(), duration_ms });
                    RunEnd::AwaitingInput { question }
                }
                Err((stage_id, f)) => {
                    crate::otel::fail_cx(&run_cx, f.class.as_str());
                    let (reason_class, detail) = (f.class, f.detail);
                    let message = &f.message;
                    events.emit(stage_id.as_deref(), move || EventData::RunFailed {
                        reason_class,
                        message: message.clone(),
                        duration_ms: Some(duration_ms),
                        decisions: detail,
                    });
                    RunEnd::Failed(RunFailure { reason_class: f.class, message: f.message, stage_id })
                }
            };
            let mut result = RunResult {
                run_id: events.run_id().to_owned(),
                route_id: route.id().to_owned(),
                end,
                slots: state.slots,
                notes: state.notes,
                llm_calls,
                divergences,
            };
            crate::otel::end(&run_cx);
            if let Some(journal) = run.journal {
                let taken = events.take_recorded();
                let durable = events.on_durable(&taken);
                let batch = JournalBatch { events: taken, entries: pending, end: Some(result.clone()) };
                match journal.commit(events.run_id(), batch).await {
                    Ok(()) => durable.map_or((), |d| d()),
                    // The record lacks the end: the caller must not take the run as settled.
                    Err(e) => result.fail(ReasonClass::StoreError, format!("the run's end could not be recorded: {e}")),
                }
            }
            result
        })
    }

    pub(super) async fn walk(&self, run: &Run<'_>, state: &mut RunState, run_cx: &Context) -> Result<Finish, (Option<String>, StageFailure)> {
        let route = run.route;
        let mut node = route.entry();
        // A user's reply (a run continued after a stage's agent asked) is recorded before the
        // walk goes on: a process that dies on the way loses the walk, not the reply.
        if !state.pending.is_empty() {
            self.checkpoint(run, state).await.map_err(|f| (Some(route.entry_node().id().to_owned()), f))?;
        }
        loop {
            let stage = &route.graph()[node];
            // A stage that makes no call (a passthrough) does not race the token: checked here,
            // a stopped run starts no further stage.
            if let Some(why) = run.cancel.reason() {
                return Err((Some(stage.id().to_owned()), StageFailure::new(ReasonClass::Interrupted, format!("the run was interrupted ({why})"))));
            }
            if state.visits.len() <= node.index() {
                state.visits.resize(route.graph().node_count(), 0);
            }
            let visits = &mut state.visits[node.index()];
            *visits += 1;
            // A branched workflow may loop; each stage runs at most max_loop_steps times per run.
            if *visits > run.budget {
                let why = format!("stage `{}` would run more than max_loop_steps ({}) times", stage.id(), run.budget);
                return Err(self.refuse_stage(run, stage, StageFailure::new(ReasonClass::LoopBudgetExceeded, why)));
            }
            // A stage calling an agent takes its recorded questions and the user's replies before
            // it opens, so that a run going on from them shows its start.
            let asked = match stage.agent() {
                Some(_) => match super::agent::recorded_asks(state, stage.id(), run.events) {
                    Asked::Answered(asked) => asked,
                    Asked::Unanswered(question) => return Ok(Finish::AwaitingInput(question)),
                },
                None => None,
            };
            let open = self.begin_stage(run, stage, state, run_cx);
            match self.run_stage(run, stage, state, asked, &open.cx).await {
                Ok(Staged::Value(value)) => self.end_stage(run, open, Ok(value), state, true),
                // The stage's agent asks: so does the run, whose last commit records the ask.
                Ok(Staged::Asks(ask)) => return Ok(Finish::AwaitingInput(self.agent_asks(run, state, open, ask))),
                Err(f) => {
                    self.end_stage(run, open, Err(&f), state, true);
                    return Err((Some(stage.id().to_owned()), f));
                }
            }
            // `checkpoint` checks this too; checked here, a run without a journal makes no
            // checkpoint future per stage (its state and poll showed in scenario A's count).
            if run.journal.is_some() {
                self.checkpoint(run, state).await.map_err(|f| (Some(stage.id().to_owned()), f))?;
            }
            match route.next_step(node, |c| condition_holds(c, state)) {
                NextStep::Go(next) => node = next,
                NextStep::End => return Ok(Finish::Completed),
                NextStep::NoMatch => {
                    let why = format!("no branch of stage `{}` matched and it has no branch without `when`", stage.id());
                    return Err((Some(stage.id().to_owned()), StageFailure::new(ReasonClass::NoBranchMatched, why)));
                }
            }
        }
    }
}

/// Evaluates a branch condition against the run's slots.
fn condition_holds(c: &Condition, state: &RunState) -> bool {
    let value: Option<Value> = match &c.field {
        Some(field) => state
            .structured
            .iter()
            .find(|(id, _)| **id == *c.slot.name)
            .and_then(|(_, compact)| serde_json::from_str::<Value>(compact).ok())
            .and_then(|mut v| v.get_mut(field).map(Value::take))
            .filter(|v| !v.is_null()),
        None => state.slots.get(&c.slot.name).map(|s| Value::String(s.clone())),
    };
    match &c.op {
        CondOp::Exists(want) => value.is_some() == *want,
        CondOp::Equals(want) => value.as_ref().is_some_and(|v| loosely_equal(v, want)),
        CondOp::NotEquals(want) => !value.as_ref().is_some_and(|v| loosely_equal(v, want)),
        CondOp::In(options) => value.as_ref().is_some_and(|v| options.iter().any(|o| loosely_equal(v, o))),
        CondOp::Contains(needle) => match &value {
            Some(Value::String(s)) => s.contains(needle.as_str()),
            Some(Value::Array(items)) => items.iter().any(|i| i.as_str() == Some(needle)),
            _ => false,
        },
    }
}

/// Numbers compare by value (`3` equals `3.0`); everything else exactly.
fn loosely_equal(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}
