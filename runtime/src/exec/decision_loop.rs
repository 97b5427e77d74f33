//! The decision loop (a `decision_loop:` route, the autonomous mode), inside the executor.
//!
//! Each turn the model returns one [`AgentDecision`]. A tool call names a tool of the route's
//! list (checked inside the model call, so an unknown tool fails the call with `unknown_tool`);
//! its arguments are checked against the tool's input schema before anything is sent; the tool's
//! result, or its error, becomes a note and the model gets another turn. An ask ends the run
//! awaiting the user; done completes it. `max_loop_steps` bounds the model turns.

use opentelemetry::Context;
use serde_json::Value;

use super::Runner;
use super::agent::{AgentCall, AgentOutcome, call_id};
use super::state::{Finish, Last, Run, RunState, StageFailure};
use crate::decision::AgentDecision;
use crate::failure::ReasonClass;
use crate::hydrate::StageNode;
use crate::llm::ReplyValue;

impl Runner {
    pub(super) async fn decision_loop(&self, run: &Run<'_>, state: &mut RunState, run_cx: &Context) -> Result<Finish, (Option<String>, StageFailure)> {
        let route = run.route;
        let decide = route.entry_node();
        let mut decisions: Vec<Value> = Vec::new();
        // A user's reply is recorded before the turn it starts: a process that dies during that
        // turn loses the turn, not the reply (its successor goes on from it, not asks again).
        if !state.pending.is_empty() {
            self.checkpoint(run, state).await.map_err(|f| (Some(decide.id().to_owned()), f))?;
        }
        // The question the run asked was an agent's: the reply goes to the agent's task.
        if let Some((ask, reply)) = state.answered.take() {
            let Some(tool) = route.tool_node(&ask.stage_id) else {
                let f = StageFailure::new(ReasonClass::UnknownTool, format!("no tool `{}` in route `{}`", ask.stage_id, route.id()));
                return Err((Some(decide.id().to_owned()), f));
            };
            if let Some(question) = self.tool_turn(run, state, tool, AgentCall::Reply { ask: &ask, reply: &reply }, run_cx).await? {
                return Ok(Finish::AwaitingInput(question));
            }
        }
        loop {
            if state.turns >= run.budget {
                let f = StageFailure::new(ReasonClass::LoopBudgetExceeded, format!("no answer after max_loop_steps ({}) model turns", run.budget))
                    .with_detail(Value::Array(decisions));
                return Err(self.refuse_stage(run, decide, f));
            }
            state.turns += 1;
            let open = self.begin_stage(run, decide, state, run_cx);
            let reply = self.call_model(run, decide, state, &open.cx).await;
            let decision = match reply {
                Ok(ReplyValue::Decision(d)) => d,
                Ok(_) => {
                    let f = StageFailure::new(ReasonClass::ProviderError, "the backend did not return a decision");
                    self.end_stage(run, open, Err(&f), state, false);
                    return Err((Some(decide.id().to_owned()), f));
                }
                Err(f) => {
                    self.end_stage(run, open, Err(&f), state, false);
                    return Err((Some(decide.id().to_owned()), f));
                }
            };
            let as_json = decision.to_json();
            decisions.push(as_json.clone());
            self.end_stage(run, open, Ok(as_json.to_string()), state, false);
            // An ask ends the run, whose last commit records it; other turns commit here.
            if !matches!(decision, AgentDecision::Ask { .. }) {
                self.checkpoint(run, state).await.map_err(|f| (Some(decide.id().to_owned()), f))?;
            }
            match decision {
                AgentDecision::Done { answer } => {
                    state.last_output = Some(Last::Answer(answer));
                    return Ok(Finish::Completed);
                }
                AgentDecision::Ask { question } => {
                    // Recovered after the user replied: the reply is in the journal; go on.
                    if let Some(note) = state.source.user_reply(run.events) {
                        state.notes.push(note);
                        continue;
                    }
                    return Ok(Finish::AwaitingInput(question));
                }
                AgentDecision::ToolCall { tool: name, arguments } => {
                    // The name was checked against the route's tools inside the model call.
                    let Some(tool) = route.tool_node(&name) else {
                        let f = StageFailure::new(ReasonClass::UnknownTool, format!("no tool `{name}` in route `{}`", route.id()));
                        return Err((Some(decide.id().to_owned()), f));
                    };
                    let call = AgentCall::Start { call: call_id(run.events.run_id(), tool.id(), state.turns), args: &arguments };
                    if let Some(question) = self.tool_turn(run, state, tool, call, run_cx).await? {
                        return Ok(Finish::AwaitingInput(question));
                    }
                }
            }
        }
    }

    /// One tool call of the loop: its recorded outcome (a recovered or replayed run), else the
    /// call. A tool error becomes a note; an agent's question is what the run asks (`Some`).
    async fn tool_turn(
        &self,
        run: &Run<'_>,
        state: &mut RunState,
        tool: &StageNode,
        call: AgentCall<'_>,
        run_cx: &Context,
    ) -> Result<Option<String>, (Option<String>, StageFailure)> {
        let mut answered = None;
        if let AgentCall::Start { .. } = call {
            // The agent's recorded questions and the user's replies: the last reply goes to its
            // task; a question not yet answered (a replay of a run still asking) is asked again.
            // Taken before the stage opens, so that a run going on from them shows its start.
            match super::agent::recorded_asks(state, tool.id(), run.events) {
                super::agent::Asked::Answered(recorded) => answered = recorded,
                super::agent::Asked::Unanswered(question) => return Ok(Some(question)),
            }
        }
        let open = self.begin_stage(run, tool, state, run_cx);
        // A recovered or replayed run takes the tool's recorded error.
        if answered.is_none()
            && let AgentCall::Start { .. } = call
            && let Some(note) = state.source.tool_error_note()
        {
            state.notes.push(note);
            self.end_stage(run, open, Err(&StageFailure::new(ReasonClass::ToolFailed, "recorded")), state, false);
            // Taken after the stage's (muted) event: it was written before.
            state.source.advance(run.events);
            return Ok(None);
        }
        let call = match &answered {
            Some((ask, reply)) => AgentCall::Reply { ask, reply },
            None => call,
        };
        let outcome = match state.source.tool_result(tool.id(), || format!("tool `{}` is called", tool.id())) {
            Ok(Some(value)) => Ok(value),
            Ok(None) => match (tool.capability().and_then(|c| c.def.a2a.as_ref()), call) {
                (Some(a2a), call) => match self.call_agent(run, tool, a2a, call, &open.cx).await {
                    Ok(AgentOutcome::Result(text)) => Ok(text),
                    Ok(AgentOutcome::Asked(ask)) => {
                        return Ok(Some(self.agent_asks(run, state, open, ask)));
                    }
                    Err(f) => Err(f),
                },
                (None, AgentCall::Start { args, .. }) => self.run_loop_tool(run, tool, args, &open.cx).await,
                (None, AgentCall::Reply { .. }) => Err(StageFailure::new(ReasonClass::ToolFailed, format!("tool `{}` is no agent to reply to", tool.id()))),
            },
            Err(f) => Err(f),
        };
        match outcome {
            Ok(text) => self.end_stage(run, open, Ok(text), state, true),
            Err(f) => {
                // A tool error never ends the run: the model sees it and decides again.
                let note = super::message::compress_note(&format!("{}: error: {}: {}", tool.id(), f.class.as_str(), f.message));
                state.notes.push(note.clone());
                if run.journal.is_some() {
                    state.pending.push(super::JournalEntry::Note { note });
                }
                self.end_stage(run, open, Err(&f), state, false);
            }
        }
        self.checkpoint(run, state).await.map_err(|f| (Some(tool.id().to_owned()), f))?;
        Ok(None)
    }
}
