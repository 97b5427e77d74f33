//! Micro-benchmarks of the hot pieces of a run (criterion): `cargo bench -p fabric-runtime`.

use std::hint::black_box;
use std::path::PathBuf;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use fabric::catalogue::{SourceFile, load_from_texts};
use fabric::events::{JsonLinesSink, RunEvents};
use fabric::exec::message::user_message;
use fabric::llm::OutputSpec;
use fabric::llm::stub::StubLlm;
use fabric::llm::{Llm, LlmRequest};
use fabric::structured::{FlatSchema, decode_reply};
use serde_json::{Map, Value, json};

fn repo_file(rel: &str) -> SourceFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
    SourceFile { text: std::fs::read_to_string(&path).unwrap(), path }
}

fn classify_schema() -> FlatSchema {
    FlatSchema::from_json(&json!({"type": "object", "properties": {
        "category": {"type": "string", "enum": ["billing", "technical", "other"]},
        "urgency": {"type": "string", "enum": ["low", "high"]}}, "required": ["category", "urgency"]}))
    .unwrap()
}

fn goal() -> Map<String, Value> {
    json!({"ticket": "I was charged twice for my subscription", "customer": 4711}).as_object().unwrap().clone()
}

fn micro(c: &mut Criterion) {
    let notes = vec![r#"intake: {"category":"billing","urgency":"high"}"#.to_owned(), r#"lookup: {"query":"duplicate subscription charge refund"}"#.to_owned()];
    let g = fabric::exec::message::goal_json(&goal());
    c.bench_function("user_message", |b| b.iter(|| user_message(black_box(&g), &[], black_box(&notes))));

    let schema = classify_schema();
    c.bench_function("structured_decode", |b| b.iter(|| decode_reply(black_box(&schema), black_box(r#"{"category":"billing","urgency":"high","extra":1}"#))));

    let files: Vec<SourceFile> =
        ["routes/profiles.yaml", "routes/support-triage.yaml", "routes/ticket-router.yaml", "routes/refund-review.yaml", "routes/support-agent.yaml"]
            .iter()
            .map(|f| repo_file(f))
            .collect();
    let packs: Vec<SourceFile> = ["prompt-packs/support.yaml", "prompt-packs/refunds.yaml"].iter().map(|f| repo_file(f)).collect();
    c.bench_function("catalogue_load_and_hydrate_4_routes", |b| b.iter(|| load_from_texts(black_box(&files), black_box(&packs))));

    let sink = Arc::new(JsonLinesSink::new(Box::new(std::io::sink())));
    let events = RunEvents::new("01a22917-7780-75cc-9b60-666354e79b18", "support-triage", None, sink);
    c.bench_function("event_emit_json", |b| {
        b.iter(|| {
            events.emit(Some("intake"), || fabric::events::EventData::StageCompleted {
                duration_ms: 0.123,
                output: r#"{"category":"billing","urgency":"high"}"#.to_owned(),
                output_chars: 39,
            })
        })
    });

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let stub = StubLlm::default().script("support-triage", "intake", &[r#"{"category":"billing","urgency":"high"}"#]);
    let output = OutputSpec::Bindable(Arc::new(classify_schema()));
    let quiet = RunEvents::new("run", "support-triage", None, Arc::new(fabric::events::NullSink));
    let cx = opentelemetry::Context::new();
    let never = fabric::cancel::Cancel::never();
    let user = user_message(&g, &[], &[]);
    let request = || LlmRequest {
        events: &quiet,
        route_id: "support-triage",
        stage_id: "intake",
        turn: 0,
        priority: 0,
        system: "You classify.",
        user: &user,
        output: &output,
        cx: &cx,
        cancel: &never,
        stream: None,
    };
    c.bench_function("stub_call_structured", |b| {
        b.iter(|| {
            let req = request();
            rt.block_on(stub.complete(black_box(&req))).unwrap()
        })
    });

    // Flow control's cost per call: a gate with every limit set, never full (what a call pays
    // when there is room), alone and as the layer of a stack over the stub.
    use fabric::llm::flow::{Flow, FlowPlan, Limits};
    let limits = Limits { max_concurrency: Some(100_000), rpm: Some(100_000_000), tpm: Some(1_000_000_000_000) };
    let flow = Flow::new(FlowPlan { default: limits, ..FlowPlan::default() });
    let gate = flow.gate(&stub.info(), false).unwrap();
    c.bench_function("gate_acquire_release", |b| {
        b.iter(|| rt.block_on(async { drop(gate.acquire(black_box("support-triage"), 0, 120, std::time::Duration::from_secs(60)).await.unwrap()) }))
    });
    for (name, gated) in [("stack_call_ungated", None), ("stack_call_gated", Some(gate.clone()))] {
        let llm = fabric::llm::stack::gated(stub.clone(), fabric::llm::model::RetryPolicy::default(), gated);
        c.bench_function(name, |b| {
            b.iter(|| {
                let req = request();
                rt.block_on(llm.complete(black_box(&req))).unwrap()
            })
        });
    }
}

criterion_group!(benches, micro);
criterion_main!(benches);
