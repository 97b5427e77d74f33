//! The bench's own catalogue (the BENCH.md routes), its prompt pack and stub scripts, and the
//! runtime every in-process scenario drives.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};

use fabric::catalogue::{self, Catalogue, SourceFile};
use fabric::config::Settings;
use fabric::events::{EventSink, JsonLinesSink, NullSink};
use fabric::llm::stub::StubLlm;
use fabric::runtime::Runtime;

use crate::options::BenchOptions;

/// The BENCH.md routes: `staged` (three structured stages) and `loop` / `loop-http` (the decision loop
/// with the `add` tool in process, or over HTTP on loopback).
pub const CATALOGUE: &str = r#"
profiles:
  bench: {}
capabilities:
  classify_ticket:
    output_schema:
      type: object
      properties:
        category: {type: string, enum: [billing, technical, other]}
        urgency: {type: string, enum: [low, high]}
      required: [category, urgency]
  kb_search:
    output_schema: {type: object, properties: {query: {type: string}}, required: [query]}
    invoke: {url: "${BENCH_TOOL_URL}/search", timeout_ms: 30000}
  answer_text:
    output_schema: {type: object, properties: {text: {type: string}}, required: [text]}
  add:
    description: Add two numbers.
    input_schema: {type: object, properties: {a: {type: number}, b: {type: number}}, required: [a, b]}
  add_http:
    description: Add two numbers.
    input_schema: {type: object, properties: {a: {type: number}, b: {type: number}}, required: [a, b]}
    invoke: {url: "${BENCH_TOOL_URL}/add", timeout_ms: 30000}
workflows:
  staged:
    stages:
      - {id: intake, llm_role: classify, capability: classify_ticket}
      - {id: lookup, llm_role: query_formulation, capability: kb_search}
      - {id: answer, llm_role: synthesis, capability: answer_text}
routes:
  staged: {model_profile: bench, prompt_pack: bench, workflow: staged}
  loop: {model_profile: bench, prompt_pack: bench, decision_loop: {tools: [add]}}
  loop-http: {model_profile: bench, prompt_pack: bench, decision_loop: {tools: [add_http]}}
"#;

pub const PACK: &str = "host: You are the support desk assistant. Be accurate and brief.\nroles:\n  classify: \"{{host}} Classify the ticket.\"\n";

/// The staged route's script as a stub file (scenario S runs it in the service process).
pub const STAGED_SCRIPT: &str = "stages:\n  intake: ['{\"category\":\"billing\",\"urgency\":\"high\"}']\n  lookup: ['{\"query\":\"duplicate subscription charge refund\"}']\n  answer: ['{\"text\":\"You were charged twice; the duplicate charge has been refunded.\"}']\n";

pub fn stub(latency: Duration) -> StubLlm {
    StubLlm::default()
        .with_latency(latency)
        .script("staged", "intake", &[r#"{"category":"billing","urgency":"high"}"#])
        .script("staged", "lookup", &[r#"{"query":"duplicate subscription charge refund"}"#])
        .script("staged", "answer", &[r#"{"text":"You were charged twice; the duplicate charge has been refunded."}"#])
        .script("loop", "decide", &[r#"CALL add {"a":2,"b":3}"#, r#"CALL add {"a":5,"b":7}"#, "DONE 12"])
        .script("loop-http", "decide", &[r#"CALL add_http {"a":2,"b":3}"#, r#"CALL add_http {"a":5,"b":7}"#, "DONE 12"])
}

/// The bench catalogue's text, streaming (as the routes are written) or not (`--no-stream`).
pub fn catalogue_text(stream: bool) -> String {
    if stream {
        return CATALOGUE.to_owned();
    }
    CATALOGUE
        .replace("{id: answer, llm_role: synthesis, capability: answer_text}", "{id: answer, llm_role: synthesis, capability: answer_text, stream: false}")
        .replace("decision_loop: {tools: [add]}", "decision_loop: {tools: [add], stream: false}")
        .replace("decision_loop: {tools: [add_http]}", "decision_loop: {tools: [add_http], stream: false}")
}

pub fn bench_catalogue(stream: bool) -> Arc<Catalogue> {
    let files = [SourceFile { path: PathBuf::from("bench/catalogue.yaml"), text: catalogue_text(stream) }];
    let packs = [SourceFile { path: PathBuf::from("bench/bench.yaml"), text: PACK.to_owned() }];
    Arc::new(catalogue::load_from_texts(&files, &packs))
}

/// The runtime every scenario drives: the library facade, as `fabric run` and the service use it.
pub fn runner(latency: Duration, tool_url: Option<String>, stream: bool) -> Result<Runtime, String> {
    // Default settings, whatever the environment says: the figures must not depend on it.
    let settings = Settings::load(|_| None).map_err(|e| e.to_string())?;
    Runtime::builder()
        .settings(settings)
        .catalogue(bench_catalogue(stream))
        .stub(stub(latency))
        .vars(move |k: &str| if k == "BENCH_TOOL_URL" { tool_url.clone() } else { None })
        .tool("add", fabric::tools::builtin_add())
        .build()
        .map_err(|e| e.to_string())
}

/// The event consumer of the runs: none, or every event serialised (`--events`).
pub fn sink(opts: &BenchOptions) -> Arc<dyn EventSink> {
    if opts.events { Arc::new(JsonLinesSink::new(Box::new(std::io::sink()))) } else { Arc::new(NullSink) }
}

pub fn goal() -> Map<String, Value> {
    json!({"ticket": "I was charged twice for my subscription"}).as_object().cloned().unwrap_or_default()
}

/// Writes `n` generated routes (one file each, with their own workflow) plus shared capabilities.
pub fn generate_catalogue(dir: &Path, n: usize) -> std::io::Result<()> {
    std::fs::create_dir_all(dir.join("routes"))?;
    std::fs::create_dir_all(dir.join("packs"))?;
    std::fs::write(dir.join("packs/bench.yaml"), PACK)?;
    let shared = CATALOGUE.split("workflows:").next().unwrap_or_default();
    std::fs::write(dir.join("routes/shared.yaml"), shared)?;
    for i in 0..n {
        let text = format!(
            "workflows:\n  wf-{i}:\n    stages:\n      - {{id: intake, llm_role: classify, capability: classify_ticket, branches: [{{when: {{slot: intake.urgency, equals: high}}, goto: answer}}, {{goto: lookup}}]}}\n      - {{id: lookup, llm_role: query_formulation, capability: kb_search}}\n      - {{id: answer, llm_role: synthesis, capability: answer_text}}\nroutes:\n  route-{i}:\n    description: Generated route {i}.\n    model_profile: bench\n    prompt_pack: bench\n    workflow: wf-{i}\n    activation_target: fleet-{}\n",
            i % 4
        );
        std::fs::write(dir.join(format!("routes/route-{i:05}.yaml")), text)?;
    }
    Ok(())
}
