//! PLACEHOLDER (replaced by the generator): a fixed small world.

use fabric::catalogue::SourceFile;
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};

pub struct World {
    pub routes: Vec<SourceFile>,
    pub packs: Vec<SourceFile>,
    pub tools: Vec<ToolSpec>,
    pub starts: Vec<Start>,
    pub secret: String,
    pub vars: Vec<(String, String)>,
}

pub struct ToolSpec {
    pub name: String,
    pub http: bool,
}

pub struct Start {
    pub route_id: String,
    pub goal: Map<String, Value>,
    pub prefetch: Vec<String>,
}

pub fn generate(_rng: &mut ChaCha8Rng) -> World {
    let text = "profiles: {default: {}}
capabilities:
  add: {description: Add., input_schema: {type: object, properties: {a: {type: number}, b: {type: number}}}}
workflows: {w: {stages: [{id: a, llm_role: synthesis}, {id: b, llm_role: synthesis}]}}
routes:
  r1: {model_profile: default, prompt_pack: p, workflow: w}
  agent: {model_profile: default, prompt_pack: p, decision_loop: {tools: [add]}, max_loop_steps: 6}
";
    let goal = |s: &str| json!({"question": s}).as_object().unwrap().clone();
    World {
        routes: vec![SourceFile { path: "routes/sim.yaml".into(), text: text.into() }],
        packs: vec![SourceFile { path: "packs/p.yaml".into(), text: "host: H\nagent: decide {{tools}}\n".into() }],
        tools: vec![ToolSpec { name: "add".into(), http: false }],
        starts: vec![
            Start { route_id: "r1".into(), goal: goal("one"), prefetch: vec![] },
            Start { route_id: "agent".into(), goal: goal("two"), prefetch: vec![] },
            Start { route_id: "r1".into(), goal: goal("three"), prefetch: vec![] },
        ],
        secret: "sim-secret-0000".into(),
        vars: vec![("SIM_TOKEN".into(), "sim-secret-0000".into())],
    }
}
