//! The events' wire form, pinned: one snapshot of the exact JSON lines runs emit, with every
//! event type and every optional field at least once, through the real code paths (the stub,
//! a local tool server, in-process tools, a child run, a retried call, a run that asks and is
//! continued through a SQLite store). The lines are what `--events-out`, the store's rows and
//! the service's Server-Sent Events carry; the store's bodies are checked to be those lines.

use std::io::Write;
use std::sync::{Arc, Mutex};

use fabric::cancel::Cancel;
use fabric::config::RetryPolicy;
use fabric::events::{EventKind, EventSink, FanOut, JsonLinesSink, MemorySink};
use fabric::exec::{JournalBatch, RunHistory, RunJournal, RunRequest, Runner};
use fabric::failure::{BoxFuture, ReasonClass};
use fabric::llm::stub::StubLlm;
use fabric::llm::{Llm, LlmError, LlmReply, LlmRequest, ModelInfo};
use fabric::runtime::{Runtime, StartRequest};
use fabric::tools::{FnTool, builtin_add};
use serde_json::{Map, Value, json};

use crate::support::{catalogue_with, kb_server, packs_dir, repo, routes_dir, stub_dir};

/// The lines a [`JsonLinesSink`] wrote.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// One scenario's events: the JSON lines as written, and the events themselves.
struct Capture {
    lines: Buffer,
    memory: Arc<MemorySink>,
    sink: Arc<dyn EventSink>,
}

fn capture() -> Capture {
    let lines = Buffer::default();
    let memory = Arc::new(MemorySink::default());
    let sink: Arc<dyn EventSink> = Arc::new(FanOut(vec![Arc::new(JsonLinesSink::new(Box::new(lines.clone()))), memory.clone()]));
    Capture { lines, memory, sink }
}

/// Everything the scenarios wrote, normalised, and the kinds seen.
#[derive(Default)]
struct Record {
    text: String,
    ids: Vec<String>,
    kinds: Vec<EventKind>,
}

impl Record {
    /// Adds a scenario's lines; each must be its event's value form too.
    fn add(&mut self, title: &str, c: &Capture) -> Vec<String> {
        let bytes = c.lines.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        let lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let events = c.memory.events();
        assert_eq!(lines.len(), events.len(), "{title}");
        for (line, e) in lines.iter().zip(&events) {
            assert_eq!(*line, e.to_json().to_string(), "{title}: the line is the value form");
            self.kinds.push(e.kind);
        }
        self.text.push_str(&format!("# {title}\n"));
        for line in &lines {
            let line = normalise(line, &mut self.ids);
            self.text.push_str(&line);
            self.text.push('\n');
        }
        lines
    }
}

/// Run ids become `<id-N>` (by first appearance), timestamps `<ts>`, durations `<float>` or
/// `<int>` (their JSON type is kept, not their value), a loopback port `<port>`, a catalogue
/// version (64 hex digits, which change with any fixture) `<version-N>`.
fn normalise(line: &str, ids: &mut Vec<String>) -> String {
    let mut out = String::with_capacity(line.len());
    let b = line.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if let Some(id) = uuid_at(line, i) {
            let n = match ids.iter().position(|x| x == id) {
                Some(n) => n,
                None => {
                    ids.push(id.to_owned());
                    ids.len() - 1
                }
            };
            out.push_str(&format!("<id-{n}>"));
            i += 36;
        } else if let Some(v) = line.get(i..i + 64).filter(|v| v.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))) {
            let n = ids.iter().position(|x| x == v).unwrap_or_else(|| {
                ids.push(v.to_owned());
                ids.len() - 1
            });
            out.push_str(&format!("<version-{n}>"));
            i += 64;
        } else if line[i..].starts_with("\"ts\":\"") {
            out.push_str("\"ts\":\"<ts>\"");
            i += 6 + 24 + 1;
        } else if let Some(field) = ["\"duration_ms\":", "\"waited_ms\":"].into_iter().find(|f| line[i..].starts_with(f)) {
            out.push_str(field);
            i += field.len();
            let end = line[i..].find([',', '}']).map_or(line.len(), |e| i + e);
            let number = &line[i..end];
            if number.parse::<f64>().is_ok() {
                out.push_str(if number.contains(['.', 'e']) { "<float>" } else { "<int>" });
            } else {
                out.push_str(number);
            }
            i = end;
        } else if line[i..].starts_with("127.0.0.1:") {
            out.push_str("127.0.0.1:<port>");
            i += 10;
            while i < b.len() && b[i].is_ascii_digit() {
                i += 1;
            }
        } else {
            let c = line[i..].chars().next().unwrap();
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

/// A hyphenated lowercase UUID starting at byte `i`.
fn uuid_at(s: &str, i: usize) -> Option<&str> {
    let cand = s.get(i..i + 36)?;
    let ok = cand.bytes().enumerate().all(|(k, c)| if [8, 13, 18, 23].contains(&k) { c == b'-' } else { c.is_ascii_hexdigit() && !c.is_ascii_uppercase() });
    ok.then_some(cand)
}

fn goal(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn request(route: &str, goal_value: Value, prefetch: Vec<String>) -> RunRequest {
    RunRequest { route_id: route.into(), goal: goal(goal_value), prefetch }
}

fn ticket() -> Value {
    json!({"ticket": "I was charged twice for my subscription"})
}

/// The stub, whose first call of stage `answer` streams a piece of text and then fails with a
/// 503 (a retry after 1 ms: the retry's text starts again), and whose replies of stage `lookup`
/// say nothing of their tokens.
struct Flaky {
    inner: StubLlm,
    failed: Mutex<bool>,
}

impl Llm for Flaky {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(async move {
            if req.stage_id == "answer" && !std::mem::replace(&mut *self.failed.lock().unwrap(), true) {
                if let Some(deltas) = req.stream {
                    deltas.push("The first attempt's text");
                    deltas.flush();
                }
                let mut e = LlmError::new(ReasonClass::ServerError, "HTTP 503 from stub");
                e.retry_after = Some(fabric::llm::Wait { after: std::time::Duration::from_millis(1), from: "retry-after" });
                return Err(e);
            }
            let mut reply = self.inner.complete(req).await?;
            if req.stage_id == "lookup" {
                reply.meta.usage = None;
            }
            Ok(reply)
        })
    }

    fn info(&self) -> ModelInfo {
        self.inner.info()
    }
}

/// A model that is down: every call a 503.
struct Down;

impl Llm for Down {
    fn complete<'a>(&'a self, _req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(async { Err(LlmError::new(ReasonClass::ServerError, "HTTP 503 from down")) })
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "down".into(), model: "m".into(), ..ModelInfo::default() }
    }
}

/// A journal that keeps nothing (the abandoned run's last batch).
struct Discard;

impl RunJournal for Discard {
    fn append<'a>(&'a self, _: &'a str, _: JournalBatch) -> BoxFuture<'a, Result<(), fabric::exec::JournalError>> {
        Box::pin(async { Ok(()) })
    }

    fn commit<'a>(&'a self, _: &'a str, _: JournalBatch) -> BoxFuture<'a, Result<(), fabric::exec::JournalError>> {
        Box::pin(async { Ok(()) })
    }
}

fn runner(cat: Arc<fabric::catalogue::Catalogue>, llm: Arc<dyn Llm>, kb: Option<String>) -> Runner {
    Runner::new(cat, llm, Arc::new(move |k: &str| (k == "KB_SEARCH_URL").then(|| kb.clone()).flatten())).unwrap().with_tool("add", builtin_add())
}

fn shipped() -> Arc<fabric::catalogue::Catalogue> {
    Arc::new(fabric::catalogue::load(&routes_dir(), &packs_dir()))
}

fn stack(stub: StubLlm) -> Arc<dyn Llm> {
    fabric::llm::stack::build(stub, RetryPolicy::default())
}

async fn run(record: &mut Record, title: &str, runner: &Runner, req: RunRequest) {
    let c = capture();
    runner.run(req, c.sink.clone()).await.unwrap();
    record.add(title, &c);
}

#[tokio::test]
async fn every_event_type_keeps_its_wire_form() {
    let kb = kb_server().await;
    let mut record = Record::default();
    let fixture_stub = || StubLlm::load(&stub_dir()).unwrap().strict(true);

    // A staged route with an HTTP tool and a prefetch chunk.
    let triage = runner(shipped(), stack(fixture_stub()), Some(kb.clone()));
    run(&mut record, "staged, an HTTP tool", &triage, request("support-triage", ticket(), vec!["a chunk".into()])).await;
    // A branched route and a manifest.
    run(&mut record, "branched", &triage, request("ticket-router", ticket(), vec![])).await;
    run(&mut record, "manifest", &triage, request("refund-review", json!({"order": 42}), vec![])).await;
    // A fallback chain whose first model is down: the stub behind it answers each call.
    let flow = fabric::llm::flow::Flow::new(Default::default());
    let once = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
    let (down, stub) = (fabric::llm::stack::member(Down, once, &flow, false), fabric::llm::stack::member(fixture_stub(), once, &flow, false));
    let chain = runner(shipped(), fabric::llm::stack::chain(down, vec![stub], Default::default()), Some(kb.clone()));
    run(&mut record, "a fallback chain, its first model down", &chain, request("support-triage", ticket(), vec![])).await;

    // The decision loop: an HTTP tool that fails, arguments that do not match, an in-process
    // tool that fails and one that works, a done.
    let script =
        [r#"CALL kb_search {"q":"boom"}"#, r#"CALL add {"a":"two","b":3}"#, r#"CALL fail {"why":"no"}"#, r#"CALL add {"a":2,"b":3}"#, "DONE The sum is 5."];
    let cat = catalogue_with(
        &["support-triage.yaml", "support-agent.yaml"],
        "capabilities:\n  fail: {description: Always fails., input_schema: {type: object}}\nroutes:\n  agent-with-fail:\n    model_profile: default\n    prompt_pack: support\n    \
         decision_loop: {tools: [kb_search, add, fail]}\n    max_loop_steps: 8\n",
    );
    let stub = StubLlm::default().strict(true).script("agent-with-fail", "decide", &script);
    let failing = FnTool(|_: &Map<String, Value>| Err("the tool said no".into()));
    let agent = runner(cat, stack(stub), Some(kb.clone())).with_tool("fail", Arc::new(failing));
    run(&mut record, "decision loop, tool failures", &agent, request("agent-with-fail", json!({"question": "sum?"}), vec![])).await;

    // The decision loop out of steps: the refused stage and the run's decisions.
    let calls: Vec<String> = (0..8).map(|i| format!(r#"CALL add {{"a":{i},"b":1}}"#)).collect();
    let calls: Vec<&str> = calls.iter().map(String::as_str).collect();
    let budget = runner(shipped(), stack(StubLlm::default().strict(true).script("support-agent", "decide", &calls)), None);
    run(&mut record, "decision loop, out of steps", &budget, request("support-agent", json!({"question": "sum?"}), vec![])).await;

    // A reply that is not JSON: the failed call shows it.
    let bad = StubLlm::default().strict(true).script("support-triage", "intake", &["not json {"]);
    let bad = runner(shipped(), stack(bad), None);
    run(&mut record, "a reply that is not JSON", &bad, request("support-triage", ticket(), vec![])).await;

    // An HTTP tool that fails a workflow stage.
    let boom = StubLlm::default().strict(true).script("support-triage", "intake", &[r#"{"category":"billing","urgency":"high"}"#]).script(
        "support-triage",
        "lookup",
        &[r#"{"query":"boom"}"#],
    );
    run(&mut record, "an HTTP tool fails the stage", &runner(shipped(), stack(boom), Some(kb.clone())), request("support-triage", ticket(), vec![])).await;

    // A retried call, and a call whose reply says nothing of its tokens.
    let flaky = Flaky { inner: fixture_stub(), failed: Mutex::new(false) };
    let flaky = runner(shipped(), fabric::llm::stack::build(flaky, RetryPolicy::default()), None);
    run(&mut record, "a retried call", &flaky, request("support-triage", ticket(), vec![])).await;

    // A call that waited for room at its model's gate: one call at a time, the room held here.
    use fabric::llm::flow::{Flow, FlowPlan, Limits};
    let flow = Flow::new(FlowPlan { default: Limits { max_concurrency: Some(1), ..Limits::default() }, ..FlowPlan::default() });
    let stub = fixture_stub();
    let gate = flow.gate(&stub.info(), false).unwrap();
    let (held, _) = gate.acquire("elsewhere", 0, 0, std::time::Duration::from_secs(60)).await.unwrap();
    let gated = runner(shipped(), fabric::llm::stack::gated(stub, RetryPolicy::default(), Some(gate.clone())), None);
    // Given back once the run's call waits (not after a time: a busy machine may start it late).
    let release = tokio::spawn(async move {
        while gate.status().waiting.is_empty() {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        drop(held);
    });
    run(&mut record, "a call that waited for room", &gated, request("ticket-router", ticket(), vec![])).await;
    release.await.unwrap();

    // A child run.
    let cat = catalogue_with(
        &["support-triage.yaml", "ticket-router.yaml"],
        "workflows:\n  parent-flow:\n    stages:\n      - {id: delegate, llm_role: none, kind: child_run, route: ticket-router}\n\
         routes:\n  parent-flow: {model_profile: default, prompt_pack: support, workflow: parent-flow}\n",
    );
    run(&mut record, "a child run", &runner(cat, stack(fixture_stub()), None), request("parent-flow", ticket(), vec![])).await;

    // A recovered run given up: its last event.
    let c = capture();
    let history = RunHistory { run_id: fabric::exec::new_run_id(), entries: Vec::new(), next_seq: 4, open: None };
    triage.abandon("gone-route", history, ReasonClass::StoreError, "the route `gone-route` is not in the catalogue", c.sink.clone(), &Discard).await;
    record.add("a recovered run given up", &c);

    // A run cancelled on request before its first stage, and a queued run cancelled (ended
    // without a walk).
    let c = capture();
    let (asked, token) = fabric::cancel::CancelHandle::new();
    asked.cancel_run("the user left");
    let req = request("support-triage", ticket(), vec![]);
    triage.execute(req, fabric::exec::Begin::New { run_id: fabric::exec::new_run_id() }, c.sink.clone(), token, None).await.unwrap();
    record.add("a run cancelled on request", &c);
    let c = capture();
    let history = RunHistory { run_id: fabric::exec::new_run_id(), entries: Vec::new(), next_seq: 1, open: None };
    triage.end_cancelled("support-triage", history, "cancelled by request", c.sink.clone(), &Discard).await;
    record.add("a queued run cancelled", &c);

    // A run that asks, continued after the reply, through a SQLite store: the store's rows are
    // the lines.
    let dir = tempfile::tempdir().unwrap();
    let store = fabric::store::open(&format!("sqlite://{}", dir.path().join("fabric.db").display())).await.unwrap();
    let stubs = tempfile::tempdir().unwrap();
    std::fs::copy(repo().join("examples/stub-asking/support-agent.yaml"), stubs.path().join("support-agent.yaml")).unwrap();
    let settings = fabric::config::Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
    let rt = fabric::runtime::Durable::new(
        Runtime::builder().settings(settings).catalogue_dirs(routes_dir(), packs_dir()).stub_dir(stubs.path()).tool("add", builtin_add()).build().unwrap(),
        store.clone(),
    );
    let req: StartRequest = serde_json::from_value(json!({"route_id": "support-agent", "goal": {"question": "refund?"}, "model_profile": "default"})).unwrap();
    let accepted = rt.accept(&req, true).await.unwrap();
    let c = capture();
    rt.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, c.sink.clone(), Cancel::never()).await.unwrap();
    let mut lines = record.add("a run that asks (stored)", &c);
    let claimed = rt.claim_reply(&accepted.run_id, "order 42".into()).await.unwrap();
    let c = capture();
    rt.continue_run(claimed, c.sink.clone(), Cancel::never()).await.unwrap();
    lines.extend(record.add("the reply continues it (stored)", &c));
    let stored: Vec<String> = store.events_after(&accepted.run_id, 0).await.unwrap().into_iter().map(|e| e.body).collect();
    assert_eq!(stored, lines, "the store keeps the lines as written");

    // A run that asked, continued by a replica that loaded another catalogue and goes on on it
    // (`FABRIC_RESUME_ON=current`): its events say so before it goes on.
    let accepted = rt.accept(&req, true).await.unwrap();
    rt.execute(&accepted.lease.clone().unwrap(), &req, &accepted.edition, Arc::new(fabric::events::NullSink), Cancel::never()).await.unwrap();
    let changed = crate::support::temp_copy(&packs_dir());
    let pack = changed.path().join("support.yaml");
    std::fs::write(&pack, std::fs::read_to_string(&pack).unwrap() + "\n# changed\n").unwrap();
    let settings = fabric::config::Settings::load(|k| match k {
        "FABRIC_LLM_STUB" => Some("1".to_owned()),
        "FABRIC_RESUME_ON" => Some("current".to_owned()),
        _ => None,
    })
    .unwrap();
    let other = fabric::runtime::Durable::new(
        Runtime::builder().settings(settings).catalogue_dirs(routes_dir(), changed.path()).stub_dir(stubs.path()).tool("add", builtin_add()).build().unwrap(),
        store.clone(),
    );
    assert_ne!(&other.runtime().version(), accepted.edition.version(), "the replica loaded another version");
    let claimed = other.claim_reply(&accepted.run_id, "order 42".into()).await.unwrap();
    let c = capture();
    other.continue_run(claimed, c.sink.clone(), Cancel::never()).await.unwrap();
    let lines = record.add("continued on another catalogue version (FABRIC_RESUME_ON=current)", &c);
    assert!(lines[0].contains("\"type\":\"run.catalogue_moved\""), "{}", lines[0]);

    let missing: Vec<&str> = EventKind::ALL.iter().filter(|k| !record.kinds.contains(k)).map(|k| k.as_str()).collect();
    assert!(missing.is_empty(), "every event type is pinned; missing: {missing:?}");
    insta::assert_snapshot!("every_event_type", record.text);
}
