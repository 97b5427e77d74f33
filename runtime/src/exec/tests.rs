//! Unit tests of the executor, without sockets: the model is the seeded stub, HTTP tools go
//! through a recording [`HttpPort`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::*;
use crate::catalogue::{self, SourceFile};
use crate::defs::Invoke;
use crate::events::{Event, EventKind, MemorySink};
use crate::failure::BoxFuture;
use crate::llm::stub::StubLlm;
use crate::tools::{ToolError, ToolOutput};

/// A replay of `history` on `r`, as `Durable::replay` runs it.
async fn replay(r: &Runner, req: RunRequest, history: Vec<JournalEntry>) -> ReplayReport {
    ReplayReport::from(r.execute(req, Begin::Replay(history), Arc::new(crate::events::NullSink), Cancel::never(), None).await.unwrap())
}

const CATALOGUE: &str = r#"
profiles: {p: {}}
capabilities:
  classify: {output_schema: {type: object, properties: {urgency: {type: string, enum: [low, high]}, score: {type: number}}, required: [urgency]}}
  search:
    input_schema: {type: object, properties: {q: {type: string}}, required: [q]}
    output_schema: {type: object, properties: {query: {type: string}}, required: [query]}
    invoke: {url: "${KB}/search"}
  answer: {output_schema: {type: object, properties: {text: {type: string}}, required: [text]}}
workflows:
  staged:
    stages:
      - {id: intake, llm_role: classify, capability: classify, branches: [{when: {slot: intake.score, equals: 3}, goto: answer}, {goto: lookup}]}
      - {id: lookup, llm_role: query_formulation, capability: search}
      - {id: answer, llm_role: synthesis, capability: answer}
routes:
  staged: {model_profile: p, prompt_pack: pack, workflow: staged}
  looped: {model_profile: p, prompt_pack: pack, decision_loop: {tools: [search]}, max_loop_steps: 5}
"#;

/// Records every call and answers with what `reply` says.
struct FakeHttp {
    calls: Mutex<Vec<(String, Map<String, Value>)>>,
    reply: Result<&'static str, ReasonClass>,
}

impl HttpPort for FakeHttp {
    fn call<'a>(&'a self, _: &'a Invoke, url: &'a str, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        self.calls.lock().unwrap().push((url.to_owned(), args.clone()));
        Box::pin(async move {
            match self.reply {
                Ok(text) => Ok(ToolOutput { status: 200, text: text.to_owned(), bytes: text.len(), duration: Duration::ZERO }),
                Err(class) => Err(ToolError { class, message: "down".into() }),
            }
        })
    }
}

fn runner(stub: StubLlm, http: Arc<FakeHttp>) -> Runner {
    let files = [SourceFile { path: "t/c.yaml".into(), text: CATALOGUE.into() }];
    let packs = [SourceFile { path: "t/pack.yaml".into(), text: "host: H\n".into() }];
    let cat = catalogue::load_from_texts(&files, &packs);
    assert_eq!(cat.error_count(), 0, "{:?}", cat.diagnostics());
    let llm = crate::llm::stack::build(stub, Default::default());
    Runner::new(Arc::new(cat), llm, Arc::new(|k: &str| (k == "KB").then(|| "http://kb".to_owned()))).unwrap().with_http(http)
}

fn http(reply: Result<&'static str, ReasonClass>) -> Arc<FakeHttp> {
    Arc::new(FakeHttp { calls: Mutex::default(), reply })
}

async fn run(r: &Runner, route: &str, cancel: Cancel) -> (RunResult, Vec<Event>) {
    let sink = Arc::new(MemorySink::default());
    let goal = json!({"ticket": "t"}).as_object().unwrap().clone();
    let result = r
        .execute(RunRequest { route_id: route.into(), goal, prefetch: vec![] }, Begin::New { run_id: new_run_id() }, sink.clone(), cancel, None)
        .await
        .unwrap();
    (result, sink.events())
}

#[tokio::test]
async fn the_query_goes_to_the_tool_port_and_its_answer_is_the_slot() {
    let stub = StubLlm::default()
        .script("staged", "intake", &[r#"{"urgency":"high","score":1}"#])
        .script("staged", "lookup", &[r#"{"query":"refund rules"}"#])
        .script("staged", "answer", &[r#"{"text":"Done."}"#]);
    let port = http(Ok(r#"{"hits":[1]}"#));
    let (result, _) = run(&runner(stub, port.clone()), "staged", Cancel::never()).await;
    assert_eq!(result.status(), RunStatus::Completed, "{result:?}");
    assert_eq!(result.slots["lookup"], r#"{"hits":[1]}"#);
    let calls = port.calls.lock().unwrap().clone();
    assert_eq!(calls, [("http://kb/search".to_owned(), json!({"q": "refund rules"}).as_object().unwrap().clone())]);
}

#[tokio::test]
async fn a_branch_on_a_number_compares_by_value() {
    let stub = StubLlm::default().script("staged", "intake", &[r#"{"urgency":"low","score":3.0}"#]).script("staged", "answer", &[r#"{"text":"Skipped."}"#]);
    let port = http(Ok("{}"));
    let (result, _) = run(&runner(stub, port.clone()), "staged", Cancel::never()).await;
    assert_eq!(result.slots.keys().collect::<Vec<_>>(), ["intake", "answer"], "score 3.0 equals 3");
    assert!(port.calls.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failing_tool_fails_a_workflow_stage_but_only_notes_a_loop_turn() {
    let stub = StubLlm::default().script("staged", "intake", &[r#"{"urgency":"high"}"#]).script("staged", "lookup", &[r#"{"query":"q"}"#]);
    let (result, events) = run(&runner(stub, http(Err(ReasonClass::ToolTimeout))), "staged", Cancel::never()).await;
    assert_eq!(result.error().map(|e| e.reason_class), Some(ReasonClass::ToolTimeout));
    assert_eq!(events.last().map(|e| e.kind), Some(EventKind::RunFailed));
    let stub = StubLlm::default().script("looped", "decide", &[r#"CALL search {"q":"x"}"#, "DONE gave up"]);
    let (result, _) = run(&runner(stub, http(Err(ReasonClass::ToolTimeout))), "looped", Cancel::never()).await;
    assert_eq!(result.status(), RunStatus::Completed);
    assert_eq!(result.output(), Some("gave up"));
    assert_eq!(result.notes, ["search: error: tool_timeout: tool `search`: down"]);
}

#[tokio::test]
async fn arguments_are_checked_before_the_port_is_called() {
    let stub = StubLlm::default().script("looped", "decide", &[r#"CALL search {"query":"x"}"#, "DONE ok"]);
    let port = http(Ok("{}"));
    let (result, _) = run(&runner(stub, port.clone()), "looped", Cancel::never()).await;
    assert!(port.calls.lock().unwrap().is_empty());
    assert!(result.notes[0].starts_with("search: error: invalid_tool_arguments:"), "{:?}", result.notes);
}

#[tokio::test]
async fn a_cancelled_run_fails_interrupted_and_keeps_what_it_did() {
    let stub = StubLlm::default().with_latency(Duration::from_secs(60)).script("staged", "intake", &[r#"{"urgency":"high"}"#]);
    let (handle, cancel) = crate::cancel::CancelHandle::new();
    let r = runner(stub, http(Ok("{}")));
    let (run_result, _) = tokio::join!(run(&r, "staged", cancel), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        handle.cancel("test");
    });
    let (result, events) = run_result;
    let error = result.error().unwrap();
    assert_eq!((error.reason_class, error.stage_id.as_deref()), (ReasonClass::Interrupted, Some("intake")));
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(&kinds[kinds.len() - 3..], [EventKind::LlmFailed, EventKind::StageFailed, EventKind::RunFailed]);
}

#[test]
fn goals_and_prefetch_packs_are_parsed_once() {
    assert!(parse_goal(r#"{"a":1}"#).is_ok());
    assert_eq!(parse_goal("[1]").unwrap_err().to_string(), "the goal must be a JSON object, got an array");
    assert_eq!(parse_prefetch(r#"["a","b"]"#).unwrap(), ["a", "b"]);
    assert_eq!(parse_prefetch(r#"{"chunks":["a"]}"#).unwrap(), ["a"]);
    assert_eq!(parse_prefetch(r#"[1]"#).unwrap_err().to_string(), "chunk 0 is not a string");
}

/// A journal in memory: every batch, in order.
#[derive(Default)]
struct MemoryJournal {
    batches: Mutex<Vec<JournalBatch>>,
}

impl RunJournal for MemoryJournal {
    fn append<'a>(&'a self, _: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
        self.batches.lock().unwrap().push(batch);
        Box::pin(async { Ok(()) })
    }

    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
        self.append(run_id, batch)
    }
}

impl MemoryJournal {
    fn entries(&self) -> Vec<JournalEntry> {
        self.batches.lock().unwrap().iter().flat_map(|b| b.entries.clone()).collect()
    }

    /// (entries, events) as a store would hold them after the first `n` batches.
    fn prefix(&self, n: usize) -> (Vec<JournalEntry>, Vec<Event>) {
        let b = self.batches.lock().unwrap();
        (b[..n].iter().flat_map(|b| b.entries.clone()).collect(), b[..n].iter().flat_map(|b| b.events.clone()).collect())
    }
}

/// A journal whose lease another process took: every write is refused.
struct LostJournal;

impl RunJournal for LostJournal {
    fn append<'a>(&'a self, _: &'a str, _: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
        Box::pin(async { Err(JournalError::LeaseLost("run run-1: its lease was lost".into())) })
    }

    fn commit<'a>(&'a self, run_id: &'a str, batch: JournalBatch) -> BoxFuture<'a, Result<(), JournalError>> {
        self.append(run_id, batch)
    }
}

#[tokio::test]
async fn a_run_whose_lease_is_lost_stops_after_its_first_write() {
    let r = runner(loop_stub(), http(Ok(r#"{"hits":[1]}"#)));
    let req = RunRequest { route_id: "staged".into(), goal: json!({"ticket": "t"}).as_object().unwrap().clone(), prefetch: vec![] };
    let result = r.execute(req, Begin::New { run_id: "run-1".into() }, Arc::new(crate::events::NullSink), Cancel::never(), Some(&LostJournal)).await.unwrap();
    let error = result.error().unwrap_or_else(|| panic!("{result:?}"));
    assert_eq!(error.reason_class, ReasonClass::StoreError);
    // The first stage's write fails, and so does the end's: the last failure is the one reported.
    assert_eq!(error.message, "the run's end could not be recorded: run run-1: its lease was lost");
    assert_eq!(result.llm_calls.len(), 1, "only the first stage ran: {result:?}");
}

/// Counts model calls of the stub it wraps.
struct Counting(StubLlm, Arc<std::sync::atomic::AtomicUsize>);

impl crate::llm::Llm for Counting {
    fn complete<'a>(&'a self, req: &'a crate::llm::LlmRequest<'a>) -> BoxFuture<'a, Result<crate::llm::LlmReply, crate::llm::LlmError>> {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.0.complete(req)
    }

    fn info(&self) -> crate::llm::ModelInfo {
        self.0.info()
    }
}

fn loop_stub() -> StubLlm {
    StubLlm::default()
        .script("staged", "intake", &[r#"{"urgency":"high","score":1}"#])
        .script("staged", "lookup", &[r#"{"query":"refund rules"}"#])
        .script("staged", "answer", &[r#"{"text":"Done."}"#])
        .script("looped", "decide", &[r#"CALL search {"q":"x"}"#, "ASK Which one?", r#"CALL search {"q":"y"}"#, "DONE found"])
}

fn counted_runner(calls: Arc<std::sync::atomic::AtomicUsize>) -> Runner {
    let mut r = runner(StubLlm::default(), http(Ok(r#"{"hits":[1]}"#)));
    r.llm = crate::llm::stack::build(Counting(loop_stub(), calls), Default::default());
    r
}

#[tokio::test]
async fn a_recovered_run_asks_for_nothing_recorded_and_its_events_go_on_without_a_gap() {
    for route in ["staged", "looped"] {
        // The original run, journalled, until it ends (the loop: it asks, and is answered).
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let r = counted_runner(calls.clone());
        let journal = MemoryJournal::default();
        let goal = json!({"ticket": "t"}).as_object().unwrap().clone();
        let req = RunRequest { route_id: route.into(), goal: goal.clone(), prefetch: vec![] };
        let mut result =
            r.execute(req.clone(), Begin::New { run_id: "run-1".into() }, Arc::new(crate::events::NullSink), Cancel::never(), Some(&journal)).await.unwrap();
        if result.status() == RunStatus::AwaitingInput {
            let all = journal.batches.lock().unwrap().len();
            let (history, events) = journal.prefix(all);
            let history = RunHistory { run_id: "run-1".into(), entries: history, next_seq: events.last().unwrap().seq + 1, open: None };
            result = r
                .execute(
                    req.clone(),
                    Begin::Continue { history, reply: "the second".into() },
                    Arc::new(crate::events::NullSink),
                    Cancel::never(),
                    Some(&journal),
                )
                .await
                .unwrap();
        }
        assert_eq!(result.status(), RunStatus::Completed, "{route}: {result:?}");
        let total_calls = calls.load(std::sync::atomic::Ordering::SeqCst);
        let batches = journal.batches.lock().unwrap().len();
        // Kill it after every batch, recover, and compare.
        for cut in 1..batches {
            let (history, events) = journal.prefix(cut);
            if history.is_empty() {
                continue;
            }
            let calls_after = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let again = counted_runner(calls_after.clone());
            let sink = Arc::new(MemorySink::default());
            let next_seq = events.last().map_or(1, |e| e.seq + 1);
            let recovered_journal = MemoryJournal::default();
            let recovery = RunHistory { run_id: "run-1".into(), entries: history.clone(), next_seq, open: None };
            let recovered = again.execute(req.clone(), Begin::Recover(recovery), sink.clone(), Cancel::never(), Some(&recovered_journal)).await.unwrap();
            let recorded_replies = history.iter().filter(|e| matches!(e, JournalEntry::ModelReply { .. })).count();
            if route == "looped" && !history.iter().any(|e| matches!(e, JournalEntry::UserReply { .. })) {
                // Cut before the user replied: the recovered run asks again, as it did.
                assert_eq!(recovered.status(), RunStatus::AwaitingInput, "{route} cut {cut}");
                assert_eq!(recovered.question(), Some("Which one?"));
                continue;
            }
            assert_eq!((recovered.status(), &recovered.output(), &recovered.slots), (result.status(), &result.output(), &result.slots), "{route} cut {cut}");
            assert_eq!(
                calls_after.load(std::sync::atomic::Ordering::SeqCst),
                total_calls - recorded_replies,
                "{route} cut {cut}: recorded replies are not asked again"
            );
            let seqs: Vec<u64> = sink.events().iter().map(|e| e.seq).collect();
            assert_eq!(seqs.first().copied(), Some(next_seq), "{route} cut {cut}: no gap, no duplicate");
            assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
            // The same events the run would have written, from where its record stops: none of
            // the replayed part again (a stage completed twice, say).
            let (_, all_events) = journal.prefix(batches);
            // Deltas are made only for a run someone watches: this one is, the first one was not.
            let shown = |e: &&crate::events::Event| e.kind != crate::events::EventKind::LlmDelta;
            let kinds = |e: &[crate::events::Event]| e.iter().filter(shown).map(|e| (e.kind, e.stage_id.clone())).collect::<Vec<_>>();
            assert_eq!(kinds(&sink.events()), kinds(&all_events[events.len()..]), "{route} cut {cut}: the events go on as they would have");
            let full = journal.entries();
            assert_eq!(recovered_journal.entries(), full[history.len()..], "{route} cut {cut}: the journal goes on where it stopped, nothing written twice");
        }
        // A strict replay of the whole journal: no model, no tool, no divergence.
        let replayer = runner(StubLlm::default(), http(Err(ReasonClass::ToolConnection)));
        let report = replay(&replayer, req.clone(), journal.entries()).await;
        assert!(report.divergences.is_empty(), "{route}: {:?}", report.divergences);
        assert_eq!(report.result.output(), result.output());
    }
}

#[tokio::test]
async fn a_replay_with_another_prompt_reports_it() {
    let journal = MemoryJournal::default();
    let r = runner(loop_stub(), http(Ok("{}")));
    let req = RunRequest { route_id: "staged".into(), goal: json!({"ticket": "t"}).as_object().unwrap().clone(), prefetch: vec![] };
    r.execute(req.clone(), Begin::New { run_id: "run-1".into() }, Arc::new(crate::events::NullSink), Cancel::never(), Some(&journal)).await.unwrap();
    let files = [SourceFile { path: "t/c.yaml".into(), text: CATALOGUE.into() }];
    let packs = [SourceFile { path: "t/pack.yaml".into(), text: "host: ANOTHER HOST\n".into() }];
    let cat = catalogue::load_from_texts(&files, &packs);
    let changed = Runner::new(Arc::new(cat), crate::llm::stack::build(StubLlm::default(), Default::default()), Arc::new(|_: &str| None)).unwrap();
    let report = replay(&changed, req, journal.entries()).await;
    assert!(report.divergences.iter().any(|d| d.contains("stage `intake` turn 0: the prompt differs")), "{:?}", report.divergences);
}

#[tokio::test]
async fn a_replay_asks_for_nothing_its_journal_lacks_and_fails_with_replay_diverged() {
    let journal = MemoryJournal::default();
    let r = runner(loop_stub(), http(Ok(r#"{"hits":[1]}"#)));
    let req = RunRequest { route_id: "staged".into(), goal: json!({"ticket": "t"}).as_object().unwrap().clone(), prefetch: vec![] };
    r.execute(req.clone(), Begin::New { run_id: "run-1".into() }, Arc::new(crate::events::NullSink), Cancel::never(), Some(&journal)).await.unwrap();
    let entries = journal.entries();
    let before = |pred: &dyn Fn(&JournalEntry) -> bool| entries[..entries.iter().position(pred).unwrap()].to_vec();
    let cases = [
        (
            before(&|e| matches!(e, JournalEntry::ModelReply { stage_id, .. } if stage_id == "answer")),
            "stage `answer` turn 0 calls the model where the journal has nothing more",
        ),
        (
            before(&|e| matches!(e, JournalEntry::StageCompleted { stage_id, .. } if stage_id == "lookup")),
            "stage `lookup` calls its tool where the journal has no result",
        ),
    ];
    for (history, divergence) in cases {
        let port = http(Ok("{}"));
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut replayer = runner(StubLlm::default(), port.clone());
        replayer.llm = crate::llm::stack::build(Counting(loop_stub(), calls.clone()), Default::default());
        let report = replay(&replayer, req.clone(), history).await;
        let error = report.result.error().unwrap();
        assert_eq!((error.reason_class, error.message.as_str()), (ReasonClass::ReplayDiverged, format!("replay: {divergence}").as_str()));
        assert_eq!(report.divergences, [divergence]);
        assert_eq!((calls.load(std::sync::atomic::Ordering::SeqCst), port.calls.lock().unwrap().len()), (0, 0), "no model call, no tool call");
    }
    // A tool call of the decision loop the journal lacks is noted, as a tool error is.
    let journal = MemoryJournal::default();
    let req = RunRequest { route_id: "looped".into(), ..req };
    r.execute(req.clone(), Begin::New { run_id: "run-2".into() }, Arc::new(crate::events::NullSink), Cancel::never(), Some(&journal)).await.unwrap();
    let history: Vec<JournalEntry> =
        journal.entries().into_iter().filter(|e| !matches!(e, JournalEntry::StageCompleted { stage_id, .. } if stage_id == "search")).collect();
    let report = replay(&runner(StubLlm::default(), http(Ok("{}"))), req, history).await;
    assert!(
        report.result.notes[0].starts_with("search: error: replay_diverged: replay: tool `search` is called where the journal has no result"),
        "{:?}",
        report.result.notes
    );
}
