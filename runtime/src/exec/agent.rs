//! A2A agents as tools: one message to an agent through the [`A2aPort`](crate::tools::a2a::A2aPort)
//! (the tool's arguments, or the user's reply to the agent's question), with the tool's events and
//! span; and, in the decision loop, a tool turn whose agent asks (the run asks its user, the
//! agent's task recorded with the ask so the reply goes to it) or is answered.

use opentelemetry::Context;
use serde_json::{Map, Value};

use super::Runner;
use super::journal::{JournalEntry, ToolAsk};
use super::state::{OpenStage, Run, RunState, StageFailure};
use super::tool::{Done, end_call, interrupted, tool_span};
use crate::defs::A2aInvoke;
use crate::events::{EventData, ToolStatus};
use crate::failure::ReasonClass;
use crate::hydrate::StageNode;
use crate::llm::telemetry::round_ms;
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

    /// An agent's question in the decision loop: the tool's stage ends with it as its output (an
    /// event only: no slot, no journal entry of a completion, which would be taken as the tool's
    /// result), the ask is recorded (journalled runs), and the question is what the run asks.
    pub(super) fn agent_asks(&self, run: &Run<'_>, state: &mut RunState, open: OpenStage<'_>, ask: ToolAsk) -> String {
        let OpenStage { stage, started, cx } = open;
        let duration_ms = round_ms(started.elapsed().as_secs_f64() * 1000.0);
        let question = ask.question.clone();
        run.events.emit(Some(stage.id()), || EventData::StageCompleted { duration_ms, output: question.clone(), output_chars: question.chars().count() });
        crate::otel::end(&cx);
        if run.journal.is_some() {
            state.pending.push(JournalEntry::ToolAsked(ask));
        }
        question
    }
}

fn connection(message: String) -> ToolError {
    ToolError { class: ReasonClass::ToolConnection, message }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use serde_json::json;

    use super::super::*;
    use crate::catalogue::{self, SourceFile};
    use crate::events::NullSink;
    use crate::failure::BoxFuture;
    use crate::llm::stub::StubLlm;
    use crate::tools::ToolError;
    use crate::tools::a2a::{A2aAnswer, A2aMessage, A2aOutput, A2aPort, Content};

    /// An agent that asks once, then answers; every message it got: (message id, task replied to).
    #[derive(Default)]
    struct Asking(Mutex<Vec<(String, Option<String>)>>);

    impl A2aPort for Asking {
        fn send<'a>(&'a self, m: A2aMessage<'a>) -> BoxFuture<'a, Result<A2aOutput, ToolError>> {
            let (task, answer) = match m.content {
                Content::Start(_) => (None, A2aAnswer::InputRequired { task_id: "t1".into(), context_id: Some("c1".into()), question: "Which order?".into() }),
                Content::Reply { task_id, text, .. } => (Some(task_id.to_owned()), A2aAnswer::Completed(format!("order {text} refunded"))),
            };
            self.0.lock().unwrap().push((m.message_id.to_owned(), task));
            Box::pin(async move { Ok(A2aOutput { answer, bytes: 1, duration: std::time::Duration::ZERO }) })
        }
    }

    /// A journal in memory: its batches' entries.
    #[derive(Default)]
    struct Entries(Mutex<Vec<Vec<JournalEntry>>>);

    impl RunJournal for Entries {
        fn append<'a>(&'a self, _: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
            self.0.lock().unwrap().push(batch.entries);
            Box::pin(async { Ok(()) })
        }

        fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
            self.append(run_id, batch)
        }
    }

    const CATALOGUE: &str = r#"
profiles: {p: {}}
capabilities:
  partner:
    input_schema: {type: object, properties: {q: {type: string}}}
    invoke: {a2a: "http://partner/a2a/r", skill: r}
routes:
  relay: {model_profile: p, prompt_pack: pack, decision_loop: {tools: [partner]}}
"#;

    fn runner(agent: Arc<Asking>) -> Runner {
        let files = [SourceFile { path: "t/c.yaml".into(), text: CATALOGUE.into() }];
        let cat = catalogue::load_from_texts(&files, &[SourceFile { path: "t/pack.yaml".into(), text: "host: H\n".into() }]);
        assert_eq!(cat.error_count(), 0, "{:?}", cat.diagnostics());
        let stub = StubLlm::default().script("relay", "decide", &[r#"CALL partner {"q":"x"}"#, "DONE ok"]);
        Runner::new(Arc::new(cat), crate::llm::stack::build(stub, Default::default()), Arc::new(|_: &str| None)).unwrap().with_a2a(Some(agent))
    }

    #[tokio::test]
    async fn an_agents_question_is_the_runs_and_its_task_is_resumed_from_the_journal_never_started_again() {
        let (agent, journal) = (Arc::new(Asking::default()), Entries::default());
        let r = runner(agent.clone());
        let req = RunRequest { route_id: "relay".into(), goal: json!({"q": "x"}).as_object().unwrap().clone(), prefetch: vec![] };
        let run = |begin| r.execute(req.clone(), begin, Arc::new(NullSink), Cancel::never(), Some(&journal));
        let asked = run(Begin::New { run_id: "run-1".into() }).await.unwrap();
        assert_eq!((asked.status(), asked.question()), (RunStatus::AwaitingInput, Some("Which order?")));
        let entries: Vec<JournalEntry> = journal.0.lock().unwrap().concat();
        let Some(JournalEntry::ToolAsked(ask)) = entries.last() else { panic!("the task is recorded with the ask: {entries:?}") };
        assert_eq!((ask.task_id.as_str(), ask.asked, ask.call.as_str()), ("t1", 1, "fabric:run-1:partner:1"));
        let history = RunHistory { run_id: "run-1".into(), entries, next_seq: 100, open: None };
        let done = run(Begin::Continue { history, reply: "42".into() }).await.unwrap();
        assert_eq!((done.status(), done.output()), (RunStatus::Completed, Some("ok")), "{done:?}");
        assert!(done.notes.iter().any(|n| n == "partner: order 42 refunded"), "{done:?}");
        let sent = agent.0.lock().unwrap().clone();
        assert_eq!(sent, [("fabric:run-1:partner:1".into(), None), ("fabric:run-1:partner:1:reply:1".into(), Some("t1".into()))]);
        // Recovered from every cut after the reply: the reply goes to the same task (same id) or,
        // once its result is recorded, nothing is sent; a new task is never started.
        let batches = journal.0.lock().unwrap().clone();
        let replied = batches.iter().position(|b| b.iter().any(|e| matches!(e, JournalEntry::UserReply { .. }))).unwrap();
        let mut kinds = std::collections::BTreeSet::new();
        for cut in replied + 1..batches.len() {
            let (agent, again) = (Arc::new(Asking::default()), Entries::default());
            let history = RunHistory { run_id: "run-1".into(), entries: batches[..cut].concat(), next_seq: 100, open: None };
            let recovered =
                runner(agent.clone()).execute(req.clone(), Begin::Recover(history), Arc::new(NullSink), Cancel::never(), Some(&again)).await.unwrap();
            assert_eq!(recovered.output(), Some("ok"), "cut {cut}: {recovered:?}");
            let sent = agent.0.lock().unwrap().clone();
            let recorded = batches[..cut].concat().iter().any(|e| matches!(e, JournalEntry::StageCompleted { stage_id, .. } if stage_id == "partner"));
            let expected: Vec<(String, Option<String>)> = if recorded { vec![] } else { vec![("fabric:run-1:partner:1:reply:1".into(), Some("t1".into()))] };
            assert_eq!(sent, expected, "cut {cut}");
            kinds.insert(recorded);
        }
        assert_eq!(kinds.len(), 2, "cuts before and after the result was recorded");
        // A replay of the whole journal calls no agent.
        let agent = Arc::new(Asking::default());
        let replayed = runner(agent.clone()).execute(req.clone(), Begin::Replay(batches.concat()), Arc::new(NullSink), Cancel::never(), None).await.unwrap();
        assert_eq!(replayed.output(), Some("ok"));
        assert!(agent.0.lock().unwrap().is_empty());
    }
}
