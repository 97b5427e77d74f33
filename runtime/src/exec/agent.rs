//! A2A agents as tools: one message to an agent through the [`A2aPort`](crate::tools::a2a::A2aPort)
//! (the tool's arguments, or the user's reply to the agent's question), with the tool's events and
//! span; and, in the decision loop, a tool turn whose agent asks (the run asks its user, the
//! agent's task recorded with the ask so the reply goes to it) or is answered.

use opentelemetry::Context;
use serde_json::{Map, Value};

use super::Runner;
use super::journal::{JournalEntry, ToolAsk};
use super::state::{OpenStage, Run, RunState, StageFailure, Staged};
use super::tool::{Done, end_call, interrupted, tool_span};
use crate::defs::A2aInvoke;
use crate::events::{EventData, RunEvents, ToolStatus};
use crate::failure::ReasonClass;
use crate::hydrate::StageNode;
use crate::llm::telemetry::round_ms;
use crate::tools::ToolError;
use crate::tools::a2a::{A2aAnswer, A2aMessage, A2aTask, Content};

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
        // The task, once known: a reply's is, a new one's once the agent names it.
        let seen = std::sync::OnceLock::new();
        if let AgentCall::Reply { ask, .. } = &call {
            let _ = seen.set(ask.task_id.clone());
        }
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
                let message = A2aMessage { invoke: a2a, url, token: token.as_deref(), message_id: &message_id, content, seen: &seen };
                match cancel.race(port.send(message)).await {
                    Ok(r) => r,
                    Err(why) => {
                        // Cancelled on request (not stopped for a handover, after which the
                        // run's next holder waits for the same task): the agent's task goes too.
                        if cancel.requested().is_some()
                            && let Some(task_id) = seen.get()
                        {
                            port.cancel_task(A2aTask { invoke: a2a, url, token: token.as_deref(), task_id }).await;
                        }
                        Err(interrupted(why))
                    }
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

    /// A run cancelled while it asked its user an agent's question (its journal's last ask has no
    /// reply after it): the agent's task is cancelled too, best effort (see
    /// [`crate::tools::a2a::A2aPort::cancel_task`]).
    pub(super) async fn cancel_asked_agent(&self, route_id: &str, entries: &[JournalEntry]) {
        let Some(JournalEntry::ToolAsked(ask)) = entries.iter().rev().find(|e| matches!(e, JournalEntry::ToolAsked(_) | JournalEntry::UserReply { .. })) else {
            return;
        };
        let (Some(port), Ok(route)) = (&self.a2a, self.route(route_id)) else { return };
        let Some(a2a) = route.nodes().find(|(_, n)| n.id() == ask.stage_id).and_then(|(_, n)| n.capability()).and_then(|c| c.def.a2a.as_ref()) else {
            return;
        };
        let Some(url) = a2a.url.resolve(&|v| (self.vars)(v)) else { return };
        let token = a2a.token_env.as_deref().and_then(|v| (self.vars)(v)).filter(|t| !t.is_empty());
        port.cancel_task(A2aTask { invoke: a2a, url: &url, token: token.as_deref(), task_id: &ask.task_id }).await;
    }

    /// A workflow's stage calling an agent (the run's goal is the arguments): its recorded
    /// result (a recovered, continued or replayed run), else a message to the agent: the
    /// arguments, or the user's reply to the agent's last question (`answered`: recorded, or the
    /// reply this continuation was started with). The agent's result is the stage's value; its
    /// question is the run's.
    pub(super) async fn agent_stage(
        &self,
        run: &Run<'_>,
        stage: &StageNode,
        a2a: &A2aInvoke,
        state: &mut RunState,
        mut answered: Option<(ToolAsk, String)>,
        cx: &Context,
    ) -> Result<Staged, StageFailure> {
        // The reply this continuation was started with, to the question the stage asked last.
        if let Some((ask, reply)) = state.answered.take_if(|(ask, _)| ask.stage_id == stage.id()) {
            state.notes.push(super::message::compress_note(&format!("user: {reply}")));
            answered = Some((ask, reply));
        }
        let recorded = || format!("stage `{}` calls its agent", stage.id());
        if let Some(value) = state.source.tool_result(stage.id(), recorded)? {
            return Ok(Staged::Value(value));
        }
        let call = match &answered {
            Some((ask, reply)) => AgentCall::Reply { ask, reply },
            None => {
                if let Some(cap) = stage.capability() {
                    self.check_args(run, stage, cap, run.goal)?;
                }
                AgentCall::Start { call: call_id(run.events.run_id(), stage.id(), state.stages_started), args: run.goal }
            }
        };
        Ok(match self.call_agent(run, stage, a2a, call, cx).await? {
            AgentOutcome::Result(text) => Staged::Value(text),
            AgentOutcome::Asked(ask) => Staged::Asks(ask),
        })
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

/// What a run's journal holds of a stage's agent's questions and the user's replies.
pub(super) enum Asked {
    /// The last question answered: its reply goes to the agent's task (or its result follows).
    Answered(Option<(ToolAsk, String)>),
    /// A question recorded and not answered (a replay of a run that still asks): asked again.
    Unanswered(String),
}

/// The agent's questions recorded for `stage_id` and the user's replies, taken from the journal.
pub(super) fn recorded_asks(state: &mut RunState, stage_id: &str, events: &RunEvents) -> Asked {
    let mut answered = None;
    while let Some(ask) = state.source.tool_ask(stage_id, events) {
        let Some((reply, note)) = state.source.user_reply_message(events) else { return Asked::Unanswered(ask.question) };
        state.notes.push(note);
        answered = Some((ask, reply));
    }
    Asked::Answered(answered)
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

    /// An agent that asks once, then answers; every message it got: (message id, task replied
    /// to), and the tasks it was asked to cancel.
    #[derive(Default)]
    struct Asking(Mutex<Vec<(String, Option<String>)>>, Mutex<Vec<String>>);

    impl A2aPort for Asking {
        fn cancel_task<'a>(&'a self, task: crate::tools::a2a::A2aTask<'a>) -> BoxFuture<'a, ()> {
            self.1.lock().unwrap().push(task.task_id.to_owned());
            Box::pin(async {})
        }

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
        // Cancelled while it asks: the agent's task is cancelled too (and not once it was answered).
        let history = RunHistory { run_id: "run-1".into(), entries: entries.clone(), next_seq: 100, open: None };
        let ended = r.end_cancelled("relay", history, "stop", Arc::new(NullSink), &Entries::default()).await;
        assert_eq!(ended.status(), RunStatus::Cancelled);
        assert_eq!(*agent.1.lock().unwrap(), ["t1"]);
        let history = RunHistory { run_id: "run-1".into(), entries, next_seq: 100, open: None };
        let done = run(Begin::Continue { history, reply: "42".into() }).await.unwrap();
        assert_eq!((done.status(), done.output()), (RunStatus::Completed, Some("ok")), "{done:?}");
        assert!(done.notes.iter().any(|n| n == "partner: order 42 refunded"), "{done:?}");
        let answered = journal.0.lock().unwrap().concat();
        r.end_cancelled(
            "relay",
            RunHistory { run_id: "run-1".into(), entries: answered, next_seq: 200, open: None },
            "late",
            Arc::new(NullSink),
            &Entries::default(),
        )
        .await;
        assert_eq!(agent.1.lock().unwrap().len(), 1, "an answered question's task is not cancelled again");
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

    const WORKFLOW: &str = r#"
profiles: {p: {}}
capabilities:
  partner:
    input_schema: {type: object, properties: {q: {type: string}}}
    invoke: {a2a: "http://partner/a2a/r", skill: r}
workflows:
  relay:
    stages:
      - {id: intake, llm_role: synthesis}
      - {id: ask, llm_role: none, capability: partner}
      - {id: wrap, llm_role: synthesis}
routes:
  relay: {model_profile: p, prompt_pack: pack, workflow: relay}
"#;

    fn workflow_runner(agent: Arc<Asking>) -> Runner {
        let files = [SourceFile { path: "t/w.yaml".into(), text: WORKFLOW.into() }];
        let packs = [SourceFile { path: "t/pack.yaml".into(), text: "host: H\nsynthesis: SYNTH\n".into() }];
        let cat = catalogue::load_from_texts(&files, &packs);
        assert_eq!(cat.error_count(), 0, "{:?}", cat.diagnostics());
        let stub = StubLlm::default().script("relay", "intake", &["noted"]).script("relay", "wrap", &["wrapped"]);
        Runner::new(Arc::new(cat), crate::llm::stack::build(stub, Default::default()), Arc::new(|_: &str| None)).unwrap().with_a2a(Some(agent))
    }

    /// A workflow's stage calling an agent that asks: the run asks its user; the reply goes to
    /// the agent's task and the walk goes on from the journal (the stages before it are not
    /// done again, nor shown again); recovered from every cut after the reply it sends the reply
    /// once more at most and never starts a task; a replay calls nothing.
    #[tokio::test]
    async fn a_workflow_stage_whose_agent_asks_makes_the_run_ask_and_goes_on_with_the_reply() {
        let (agent, journal) = (Arc::new(Asking::default()), Entries::default());
        let r = workflow_runner(agent.clone());
        let req = RunRequest { route_id: "relay".into(), goal: json!({"q": "x"}).as_object().unwrap().clone(), prefetch: vec![] };
        let asked = r.execute(req.clone(), Begin::New { run_id: "run-1".into() }, Arc::new(NullSink), Cancel::never(), Some(&journal)).await.unwrap();
        assert_eq!((asked.status(), asked.question()), (RunStatus::AwaitingInput, Some("Which order?")), "{asked:?}");
        let entries: Vec<JournalEntry> = journal.0.lock().unwrap().concat();
        let Some(JournalEntry::ToolAsked(ask)) = entries.last() else { panic!("the task is recorded with the ask: {entries:?}") };
        assert_eq!((ask.task_id.as_str(), ask.stage_id.as_str()), ("t1", "ask"));
        let sink = Arc::new(crate::events::MemorySink::default());
        let history = RunHistory { run_id: "run-1".into(), entries, next_seq: 100, open: None };
        let done = r.execute(req.clone(), Begin::Continue { history, reply: "42".into() }, sink.clone(), Cancel::never(), Some(&journal)).await.unwrap();
        assert_eq!((done.status(), done.output()), (RunStatus::Completed, Some("wrapped")), "{done:?}");
        assert_eq!(done.slots.get("ask").map(String::as_str), Some("order 42 refunded"), "the agent's result is the stage's slot");
        assert_eq!(done.slots.get("intake").map(String::as_str), Some("noted"), "the stage before it is taken from the journal");
        let shown: Vec<(String, Option<String>)> = sink.events().iter().map(|e| (e.kind.as_str().to_owned(), e.stage_id.clone())).collect();
        let stage = |k: &str, s: &str| (k.to_owned(), Some(s.to_owned()));
        assert_eq!(shown[0], ("run.resumed".to_owned(), None), "{shown:?}");
        assert_eq!(shown[1], stage("run.stage.started", "ask"), "{shown:?}");
        assert!(!shown.iter().any(|(_, s)| s.as_deref() == Some("intake")), "the stage before is not shown again: {shown:?}");
        assert_eq!(shown.last().unwrap().0, "run.completed");
        assert_eq!(sink.events()[0].seq, 100, "numbered on from the run's last event");
        let sent = agent.0.lock().unwrap().clone();
        assert_eq!(sent.len(), 2, "{sent:?}");
        assert_eq!((sent[0].1.as_deref(), sent[1].1.as_deref()), (None, Some("t1")), "a task, then the reply to it: {sent:?}");
        assert_eq!(sent[1].0, format!("{}:reply:1", sent[0].0));

        // Recovered from every cut after the reply: the reply goes to the same task (the same
        // message id) or, once the agent's result is recorded, nothing is sent.
        let batches = journal.0.lock().unwrap().clone();
        let replied = batches.iter().position(|b| b.iter().any(|e| matches!(e, JournalEntry::UserReply { .. }))).unwrap();
        let mut kinds = std::collections::BTreeSet::new();
        for cut in replied + 1..batches.len() {
            let again = Arc::new(Asking::default());
            let history = RunHistory { run_id: "run-1".into(), entries: batches[..cut].concat(), next_seq: 100, open: None };
            let recovered = workflow_runner(again.clone())
                .execute(req.clone(), Begin::Recover(history), Arc::new(NullSink), Cancel::never(), Some(&Entries::default()))
                .await
                .unwrap();
            assert_eq!(recovered.output(), Some("wrapped"), "cut {cut}: {recovered:?}");
            let recorded = batches[..cut].concat().iter().any(|e| matches!(e, JournalEntry::StageCompleted { stage_id, .. } if stage_id == "ask"));
            let expected: Vec<(String, Option<String>)> = if recorded { vec![] } else { vec![sent[1].clone()] };
            assert_eq!(*again.0.lock().unwrap(), expected, "cut {cut}");
            kinds.insert(recorded);
        }
        assert_eq!(kinds.len(), 2, "cuts before and after the result was recorded");
        // A replay of the whole journal calls no agent; of the journal up to the ask, asks again.
        let again = Arc::new(Asking::default());
        let replayed =
            workflow_runner(again.clone()).execute(req.clone(), Begin::Replay(batches.concat()), Arc::new(NullSink), Cancel::never(), None).await.unwrap();
        assert_eq!((replayed.output(), replayed.divergences.len()), (Some("wrapped"), 0), "{replayed:?}");
        let asking =
            workflow_runner(again.clone()).execute(req, Begin::Replay(batches[..replied].concat()), Arc::new(NullSink), Cancel::never(), None).await.unwrap();
        assert_eq!(asking.question(), Some("Which order?"), "{asking:?}");
        assert!(again.0.lock().unwrap().is_empty());
    }
}
