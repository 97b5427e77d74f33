//! The stage handlers: a stage's begin and end (events, span, slot, note, journal entry), the
//! checkpoint after it, and what each kind of stage does (a model stage, a query formulation, a
//! tool or passthrough stage, a child run), each asking the run's reply source first.

use opentelemetry::Context;
use opentelemetry::KeyValue;
use opentelemetry::trace::SpanKind;
use serde_json::{Map, Value};

use super::journal::ToolAsk;
use super::state::{Last, OpenStage, Run, RunState, StageFailure, Staged};
use super::{JournalBatch, JournalEntry, MAX_CHILD_DEPTH, RunEnd, Runner, message};
use crate::defs::LlmRole;
use crate::events::{EventData, RunEvents};
use crate::failure::ReasonClass;
use crate::hydrate::{NodeKind, StageNode};
use crate::llm::ReplyValue;
use crate::llm::telemetry::round_ms;

impl Runner {
    /// Opens a stage: its `run.stage.started` event and span.
    pub(super) fn begin_stage<'s>(&self, run: &Run<'_>, stage: &'s StageNode, state: &mut RunState, run_cx: &Context) -> OpenStage<'s> {
        let stage_idx = state.stages_started;
        state.stages_started += 1;
        run.events.emit(Some(stage.id()), || EventData::StageStarted { llm_role: stage.role_name(), stage_idx, kind: kind_name(stage.kind()) });
        let cx = crate::otel::child(
            run_cx,
            || "stage".into(),
            SpanKind::Internal,
            || {
                vec![
                    KeyValue::new("fabric.run_id", run.events.run_id().to_owned()),
                    KeyValue::new("fabric.stage_id", stage.id().to_owned()),
                    KeyValue::new("fabric.llm_role", stage.role_name()),
                ]
            },
        );
        OpenStage { stage, started: run.events.stopwatch(), cx }
    }

    /// Closes a stage: the slot (and, if `note`, a note) on success, the event, the span.
    pub(super) fn end_stage(&self, run: &Run<'_>, open: OpenStage<'_>, outcome: Result<String, &StageFailure>, state: &mut RunState, note: bool) {
        let OpenStage { stage, started, cx } = open;
        let cx = &cx;
        let duration_ms = round_ms(started.elapsed().as_secs_f64() * 1000.0);
        match outcome {
            Ok(value) => {
                let added = (note && !value.is_empty()).then(|| message::stage_note(stage.id(), &value));
                // A stage that completes its journal is taken from it after its (muted) event: the
                // event was written before, and a recovery goes on live only after it.
                let recorded_here = state.source.completion_recorded(stage.id(), &value, run.events);
                if !recorded_here && run.journal.is_some() {
                    let (stage_id, value, note) = (stage.id().to_owned(), value.clone(), added.clone());
                    state.pending.push(JournalEntry::StageCompleted { stage_id, value, note });
                }
                state.notes.extend(added);
                run.events.emit(Some(stage.id()), || EventData::StageCompleted { duration_ms, output: value.clone(), output_chars: value.chars().count() });
                let (at, _) = state.slots.insert_full(stage.id().to_owned(), value);
                state.last_output = Some(Last::Slot(at));
                if recorded_here {
                    state.source.advance(run.events);
                }
            }
            Err(f) => {
                crate::otel::fail_cx(cx, f.class.as_str());
                run.events.emit(Some(stage.id()), || EventData::StageFailed { reason_class: f.class, message: f.message.clone(), duration_ms });
            }
        }
        crate::otel::end(cx);
    }

    /// Hands what the run did since the last checkpoint to the journal (journalled runs only).
    pub(super) async fn checkpoint(&self, run: &Run<'_>, state: &mut RunState) -> Result<(), StageFailure> {
        let Some(journal) = run.journal else { return Ok(()) };
        let events = run.events.take_recorded();
        let durable = run.events.on_durable(&events);
        let batch = JournalBatch { events, entries: std::mem::take(&mut state.pending), end: None };
        journal
            .append_then(run.events.run_id(), batch, durable)
            .await
            .map_err(|e| StageFailure::new(ReasonClass::StoreError, format!("the run's record could not be written: {e}")))
    }

    /// A stage refused before it started (its step budget is spent): `run.stage.failed` alone,
    /// so that every failed run still names its failed stage.
    pub(super) fn refuse_stage(&self, run: &Run<'_>, stage: &StageNode, f: StageFailure) -> (Option<String>, StageFailure) {
        run.events.emit(Some(stage.id()), || EventData::StageFailed { reason_class: f.class, message: f.message.clone(), duration_ms: 0.0 });
        (Some(stage.id().to_owned()), f)
    }

    /// What a stage does, by its kind: each asks the run's reply source before it calls a
    /// model, a tool, an agent or a child run. Only a stage calling an agent may ask.
    /// `asked`: the last question of the stage's agent answered in the journal (`recorded_asks`).
    pub(super) async fn run_stage(
        &self,
        run: &Run<'_>,
        stage: &StageNode,
        state: &mut RunState,
        asked: Option<(ToolAsk, String)>,
        cx: &Context,
    ) -> Result<Staged, StageFailure> {
        match stage.agent() {
            Some(a2a) => self.agent_stage(run, stage, a2a, state, asked, cx).await,
            None => self.stage_value(run, stage, state, cx).await.map(Staged::Value),
        }
    }

    async fn stage_value(&self, run: &Run<'_>, stage: &StageNode, state: &mut RunState, cx: &Context) -> Result<String, StageFailure> {
        let Run { goal, prefetch, .. } = *run;
        match stage.kind() {
            NodeKind::ChildRun { route: child_id } => {
                let call = || format!("stage `{}` starts its child run", stage.id());
                match state.source.tool_result(stage.id(), call)? {
                    Some(value) => Ok(value),
                    None => self.child_run(run, child_id, state, cx).await,
                }
            }
            NodeKind::QueryFormulation => self.query_stage(run, stage, state, cx).await,
            _ if stage.role() == LlmRole::None => {
                // A tool of an MCP server (an agent's stage is `agent_stage`): the run's goal is
                // the arguments.
                if let Some(cap) = stage.capability()
                    && let Some(mcp) = &cap.def.mcp
                {
                    let call = || format!("stage `{}` calls its tool", stage.id());
                    if let Some(value) = state.source.tool_result(stage.id(), call)? {
                        return Ok(value);
                    }
                    self.check_args(run, stage, cap, goal)?;
                    return self.call_mcp_tool(run, stage, mcp, goal, cx).await;
                }
                if let Some((invoke, url)) = self.tool_url(stage) {
                    let call = || format!("stage `{}` calls its tool", stage.id());
                    return match state.source.tool_result(stage.id(), call)? {
                        Some(value) => Ok(value),
                        None => self.call_tool(run, stage, invoke, &url, goal, cx).await,
                    };
                }
                // Prefetch passthrough: the pack goes into the slot; notes stay free of it since
                // every user message already carries it as `packed chunks`.
                Ok(state
                    .source
                    .stage_result(stage.id())
                    .unwrap_or_else(|| if prefetch.is_empty() { String::new() } else { serde_json::to_string(prefetch).unwrap_or_default() }))
            }
            _ => {
                let reply = self.call_model(run, stage, state, cx).await?;
                if let ReplyValue::Structured(d) = &reply
                    && stage.fields_read()
                {
                    match state.structured.iter_mut().find(|(id, _)| **id == *stage.id()) {
                        Some(slot) => slot.1.clone_from(&d.compact),
                        None => state.structured.push((stage.shared_id().clone(), d.compact.clone())),
                    }
                }
                Ok(reply.into_slot_value())
            }
        }
    }

    /// A query formulation: the model's query goes to the capability's HTTP tool as its query
    /// parameter, and the tool's answer is the slot (the reply is, when there is no tool).
    async fn query_stage(&self, run: &Run<'_>, stage: &StageNode, state: &mut RunState, cx: &Context) -> Result<String, StageFailure> {
        let reply = self.call_model(run, stage, state, cx).await?;
        let Some((invoke, url)) = self.tool_url(stage) else {
            return Ok(state.source.stage_result(stage.id()).unwrap_or_else(|| reply.into_slot_value()));
        };
        let call = || format!("stage `{}` calls its tool", stage.id());
        if let Some(value) = state.source.tool_result(stage.id(), call)? {
            return Ok(value);
        }
        // The query, read out of the reply only when a tool is there to take it.
        let query = match &reply {
            ReplyValue::Structured(d) => {
                serde_json::from_str::<Value>(&d.compact).ok().and_then(|v| v.get("query").and_then(Value::as_str).map(str::to_owned)).unwrap_or_default()
            }
            other => other.slot_value().trim().to_owned(),
        };
        let mut args = Map::new();
        args.insert(invoke.query_param.clone(), Value::String(query));
        self.call_tool(run, stage, invoke, &url, &args, cx).await
    }

    pub(super) async fn child_run(&self, run: &Run<'_>, child_id: &str, state: &mut RunState, cx: &Context) -> Result<String, StageFailure> {
        let Run { goal, prefetch, events, depth, budget, cancel, .. } = *run;
        if depth + 1 > MAX_CHILD_DEPTH {
            return Err(StageFailure::new(ReasonClass::ChildRunFailed, format!("child runs nest deeper than {MAX_CHILD_DEPTH}")));
        }
        let route = self.route(child_id).map_err(|e| StageFailure::new(ReasonClass::ChildRunFailed, e.to_string()))?.clone();
        let child_events = RunEvents::new(&self.new_id(), route.shared_id().clone(), Some(events.run_id()), events.sink().clone());
        // The step budget is carried into the child: it never gets more than its parent has.
        // A child run is recorded in its parent's journal through the stage's result.
        let child =
            Run { route: &route, goal, prefetch, events: &child_events, depth: depth + 1, budget: budget.min(route.max_loop_steps()), cancel, journal: None };
        let result = self.run_route(child, cx, RunState::for_route(&route), None).await;
        state.child_calls.extend(result.llm_calls.iter().cloned());
        match result.end {
            RunEnd::Completed { output } => Ok(output.unwrap_or_default()),
            // The parent was interrupted with its child: say so, not "the child failed".
            RunEnd::Failed(_) | RunEnd::Cancelled(_) if cancel.reason().is_some() => {
                Err(StageFailure::new(ReasonClass::Interrupted, format!("the run was interrupted in child run {} of route `{}`", result.run_id, route.id())))
            }
            RunEnd::Failed(e) | RunEnd::Cancelled(e) => {
                let why = format!("{}: {}", e.reason_class, e.message);
                Err(StageFailure::new(ReasonClass::ChildRunFailed, format!("child run {} of route `{}` failed: {why}", result.run_id, route.id())))
            }
            RunEnd::AwaitingInput { .. } => {
                Err(StageFailure::new(ReasonClass::ChildRunFailed, format!("child run {} of route `{}` is awaiting user input", result.run_id, route.id())))
            }
        }
    }
}

/// The `kind` of a stage in events.
fn kind_name(kind: &NodeKind) -> &'static str {
    match kind {
        NodeKind::Stage | NodeKind::QueryFormulation => "task",
        NodeKind::ChildRun { .. } => "child_run",
        NodeKind::AppendedSynthesis => "appended_synthesis",
        NodeKind::Decision => "decision",
        NodeKind::Tool => "tool",
        NodeKind::End => "end",
    }
}
