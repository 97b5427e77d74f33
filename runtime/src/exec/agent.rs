//! A2A agents as tools: one message to an agent through the [`A2aPort`](crate::tools::a2a::A2aPort)
//! (the tool's arguments, or the user's reply to the agent's question), with the tool's events and
//! span; and, in the decision loop, a tool turn whose agent asks (the run asks its user, the
//! agent's task recorded with the ask so the reply goes to it) or is answered.

use opentelemetry::Context;
use serde_json::{Map, Value};

use super::Runner;
use super::journal::{JournalEntry, ToolAsk};
use super::state::{Run, RunState, StageFailure};
use super::tool::{Done, end_call, interrupted, tool_span};
use crate::defs::A2aInvoke;
use crate::events::{EventData, ToolStatus};
use crate::failure::ReasonClass;
use crate::hydrate::StageNode;
use crate::tools::ToolError;
use crate::tools::a2a::{A2aAnswer, A2aMessage, Content};

/// What an agent was sent: a new task's arguments under the call's id, or the reply to its
/// recorded question.
pub(super) enum AgentCall<'a> {
    Start { call: String, args: &'a Map<String, Value> },
    Reply { ask: &'a ToolAsk, reply: &'a str },
}

/// Where an agent's task stands after a message.
pub(super) enum AgentOutcome {
    Result(String),
    Asked(ToolAsk),
}

/// The id of a call's first message: the run, the stage and the call's place in the run, so a
/// call made again after a crash sends the same id (an agent that keys on it starts no second task).
pub(super) fn call_id(run_id: &str, stage_id: &str, place: u32) -> String {
    format!("fabric:{run_id}:{stage_id}:{place}")
}

impl Runner {
    /// Sends A2A tool calls through `a2a` (the process's [`crate::tools::a2a::A2aAgents`]).
    pub fn with_a2a(mut self, a2a: Option<std::sync::Arc<dyn crate::tools::a2a::A2aPort>>) -> Runner {
        self.a2a = a2a;
        self
    }

    pub(super) async fn call_agent(
        &self,
        run: &Run<'_>,
        stage: &StageNode,
        a2a: &A2aInvoke,
        call: AgentCall<'_>,
        cx: &Context,
    ) -> Result<AgentOutcome, StageFailure> {
        let (events, cancel) = (run.events, run.cancel);
        let tool = stage.capability().map_or(stage.id(), |c| c.name.as_str());
        let url = a2a.url.resolve(&|v| (self.vars)(v));
        events.emit(Some(stage.id()), || EventData::ToolStarted {
            tool: tool.to_owned(),
            mcp_server: None,
            method: "a2a",
            url: url.as_deref().map(crate::tools::display_url),
        });
        // The agent runs the tool outside this process: an `extension` in the GenAI conventions.
        let span = tool_span(cx, events.run_id(), tool, "extension");
        let token = a2a.token_env.as_deref().map(|v| (v, (self.vars)(v).filter(|t| !t.is_empty())));
        let (message_id, content, asked) = match &call {
            AgentCall::Start { call, args } => (call.clone(), Content::Start(args), 0),
            AgentCall::Reply { ask, reply } => {
                let content = Content::Reply { task_id: &ask.task_id, context_id: ask.context_id.as_deref(), text: reply };
                (format!("{}:reply:{}", ask.call, ask.asked), content, ask.asked)
            }
        };
        let outcome = match (&self.a2a, url.as_deref(), token) {
            (None, ..) => Err(connection("no A2A client in this runtime".into())),
            (_, None, _) => Err(connection(format!("the agent's URL `{}` is not configured (a variable in it is unset)", a2a.url.raw))),
            (_, _, Some((var, None))) => Err(connection(format!("the token variable `{var}` is unset or empty"))),
            (Some(port), Some(url), token) => {
                let token = token.and_then(|(_, t)| t);
                let message = A2aMessage { invoke: a2a, url, token: token.as_deref(), message_id: &message_id, content };
                match cancel.race(port.send(message)).await {
                    Ok(r) => r,
                    Err(why) => Err(interrupted(why)),
                }
            }
        };
        let (done, asked) = match outcome {
            Ok(out) => match out.answer {
                A2aAnswer::Completed(text) => (Ok(Done { bytes: text.len(), text, status: ToolStatus::InProcess, duration: out.duration }), None),
                A2aAnswer::InputRequired { task_id, context_id, question } => {
                    let call = match &call {
                        AgentCall::Start { call, .. } => call.clone(),
                        AgentCall::Reply { ask, .. } => ask.call.clone(),
                    };
                    let ask = ToolAsk { stage_id: stage.id().to_owned(), call, asked: asked + 1, task_id, context_id, question: question.clone() };
                    (Ok(Done { bytes: out.bytes, text: question, status: ToolStatus::InProcess, duration: out.duration }), Some(ask))
                }
            },
            Err(e) => (Err(e), None),
        };
        let text = end_call(run, stage, tool, None, &span, done)?;
        Ok(match asked {
            Some(ask) => AgentOutcome::Asked(ask),
            None => AgentOutcome::Result(text),
        })
    }

    /// A workflow's tool stage calling an agent: its result; a question fails the stage (a
    /// workflow has no user to ask: call such an agent from a decision loop).
    pub(super) async fn agent_stage(
        &self,
        run: &Run<'_>,
        stage: &StageNode,
        a2a: Option<&A2aInvoke>,
        call: String,
        args: &Map<String, Value>,
        cx: &Context,
    ) -> Result<String, StageFailure> {
        let Some(a2a) = a2a else { return Err(StageFailure::new(ReasonClass::ToolFailed, format!("stage `{}` calls no agent", stage.id()))) };
        match self.call_agent(run, stage, a2a, AgentCall::Start { call, args }, cx).await? {
            AgentOutcome::Result(text) => Ok(text),
            AgentOutcome::Asked(ask) => Err(StageFailure::new(
                ReasonClass::ToolFailed,
                format!("the agent asked `{}`: a workflow stage has no user to ask (call the agent from a decision loop)", ask.question),
            )),
        }
    }

    /// An agent's question in the decision loop: recorded (journalled runs), and the question
    /// the run asks. The tool stage stays open until the reply's call ends it.
    pub(super) fn agent_asks(&self, run: &Run<'_>, state: &mut RunState, ask: ToolAsk) -> String {
        let question = ask.question.clone();
        if run.journal.is_some() {
            state.pending.push(JournalEntry::ToolAsked(ask));
        }
        question
    }
}

fn connection(message: String) -> ToolError {
    ToolError { class: ReasonClass::ToolConnection, message }
}
