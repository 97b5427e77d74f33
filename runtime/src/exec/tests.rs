//! Unit tests of the executor, without sockets: the model is the seeded stub, HTTP tools go
//! through a recording [`HttpPort`].

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::*;
use crate::catalogue::{self, SourceFile};
use crate::events::{Event, MemorySink};
use crate::llm::stub::StubLlm;
use crate::tools::ToolOutput;

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
  looped: {model_profile: p, prompt_pack: pack, decision_loop: {tools: [search]}, max_loop_steps: 3}
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
    let result = r.run_with_cancel(RunRequest { route_id: route.into(), goal, prefetch: vec![] }, sink.clone(), cancel).await.unwrap();
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
    assert_eq!(result.status, RunStatus::Completed, "{result:?}");
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
    assert_eq!(result.error.as_ref().map(|e| e.reason_class), Some(ReasonClass::ToolTimeout));
    assert_eq!(events.last().map(|e| e.kind), Some(EventKind::RunFailed));
    let stub = StubLlm::default().script("looped", "decide", &[r#"CALL search {"q":"x"}"#, "DONE gave up"]);
    let (result, _) = run(&runner(stub, http(Err(ReasonClass::ToolTimeout))), "looped", Cancel::never()).await;
    assert_eq!(result.status, RunStatus::Completed);
    assert_eq!(result.output.as_deref(), Some("gave up"));
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
    let error = result.error.unwrap();
    assert_eq!((error.reason_class, error.stage_id.as_deref()), (ReasonClass::Interrupted, Some("intake")));
    let kinds: Vec<EventKind> = events.iter().map(|e| e.kind).collect();
    assert_eq!(&kinds[kinds.len() - 3..], [EventKind::LlmFailed, EventKind::StageFailed, EventKind::RunFailed]);
}

#[test]
fn goals_and_prefetch_packs_are_parsed_once() {
    assert!(parse_goal(r#"{"a":1}"#).is_ok());
    assert_eq!(parse_goal("[1]").unwrap_err(), "the goal must be a JSON object, got an array");
    assert_eq!(parse_prefetch(r#"["a","b"]"#).unwrap(), ["a", "b"]);
    assert_eq!(parse_prefetch(r#"{"chunks":["a"]}"#).unwrap(), ["a"]);
    assert_eq!(parse_prefetch(r#"[1]"#).unwrap_err(), "chunk 0 is not a string");
}
