//! The generated world of the simulation (issue 25): a random, valid catalogue (profiles,
//! capabilities, workflows, manifests, decision loops, prompt packs), the tools it names, the
//! variables it reads (a secret among them), the stub scripts of its decision loops and the runs
//! to start. Everything is drawn from one `ChaCha8Rng`, so a seed gives the same world byte for
//! byte; only documented catalogue features are used (docs/catalogue.md), so every world loads
//! with every route ready.

use std::collections::BTreeSet;

use fabric::source::SourceFile;
use rand::Rng;
use rand::seq::IndexedRandom;
use rand_chacha::ChaCha8Rng;
use serde_json::{Map, Value, json};

pub struct World {
    /// Catalogue files (`routes/profiles.yaml`, then `routes/sim-N.yaml`), YAML text.
    pub routes: Vec<SourceFile>,
    /// Prompt packs (`packs/NAME.yaml`); every route names one.
    pub packs: Vec<SourceFile>,
    /// Every tool the catalogue names (HTTP through the port, in-process to register).
    pub tools: Vec<ToolSpec>,
    pub starts: Vec<Start>,
    /// The value of `SIM_TOOL_KEY`, which every HTTP tool URL carries in its query.
    pub secret: String,
    pub vars: Vec<(String, String)>,
    /// Stub script lines (the decision loops' turns), for `StubLlm::script`; every other model
    /// call gets the stub's schema-derived reply.
    pub scripts: Vec<Script>,
    /// What this world exercises (for the coverage test and for a failing seed's report).
    pub features: BTreeSet<Feature>,
}

impl World {
    /// Every catalogue and pack file, each under a `--- PATH` line: what a failing seed prints.
    pub fn files(&self) -> String {
        self.routes.iter().chain(&self.packs).map(|f| format!("--- {}\n{}", f.path.display(), f.text)).collect()
    }
}

pub struct ToolSpec {
    pub name: String,
    /// An HTTP tool (catalogue `invoke` URL) or in-process (registered with `RuntimeBuilder::tool`).
    pub http: bool,
}

pub struct Start {
    pub route_id: String,
    pub goal: Map<String, Value>,
    pub prefetch: Vec<String>,
}

/// One route stage's scripted replies, one per call in a run.
pub struct Script {
    pub route_id: String,
    pub stage_id: String,
    pub replies: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Feature {
    Linear,
    Branched,
    Loop,
    Manifest,
    DecisionLoop,
    HttpTool,
    HttpPost,
    InProcessTool,
    QueryFormulation,
    ChildRun,
    Prefetch,
    Envelope,
    Ask,
    FlatSchema,
    EnumSchema,
    ArraySchema,
    UnbindableSchema,
    PromptPackAgent,
}

impl Feature {
    pub const ALL: [Feature; 18] = [
        Feature::Linear,
        Feature::Branched,
        Feature::Loop,
        Feature::Manifest,
        Feature::DecisionLoop,
        Feature::HttpTool,
        Feature::HttpPost,
        Feature::InProcessTool,
        Feature::QueryFormulation,
        Feature::ChildRun,
        Feature::Prefetch,
        Feature::Envelope,
        Feature::Ask,
        Feature::FlatSchema,
        Feature::EnumSchema,
        Feature::ArraySchema,
        Feature::UnbindableSchema,
        Feature::PromptPackAgent,
    ];
}

/// The variable holding the tools' origin, and the one holding the secret key.
const BASE_VAR: &str = "SIM_TOOL_BASE";
const KEY_VAR: &str = "SIM_TOOL_KEY";
const WORDS: [&str; 10] = ["refund", "invoice", "login", "vpn", "printer", "charge", "order", "password", "delivery", "upgrade"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Linear,
    Branched,
    Manifest,
    DecisionLoop,
}

/// A property of a flat schema, as the stub fills it and a condition tests it.
#[derive(Clone)]
enum Field {
    Str,
    Int,
    Num,
    Bool,
    Enum(Vec<String>),
    Strings,
}

/// The bindable fields of a stage's output (empty for text and unbindable schemas).
type Fields = Vec<(String, Field)>;

pub fn generate(rng: &mut ChaCha8Rng) -> World {
    let secret = format!("sk-sim-{:016x}", rng.random::<u64>());
    let mut g = Gen { rng, features: BTreeSet::new(), tools: Vec::new(), scripts: Vec::new(), depths: Vec::new() };
    let packs = g.packs();
    let pack_names: Vec<String> = (0..packs.len()).map(|i| format!("sim-pack-{i}")).collect();
    let mut routes = vec![SourceFile {
        path: "routes/profiles.yaml".into(),
        text: "profiles:\n  default:\n    description: \"The simulated fleet's model.\"\n  small:\n    temperature: 0.2\n    max_tokens: 512\n".into(),
    }];
    let n_routes = g.rng.random_range(1..=6);
    for i in 0..n_routes {
        let pack = pack_names.choose(g.rng).unwrap().clone();
        routes.push(g.route(i, &pack));
    }
    let mut starts = Vec::new();
    for _ in 0..g.rng.random_range(1..=6) {
        let route_id = format!("sim-{}", g.rng.random_range(0..n_routes));
        let goal = g.goal();
        let prefetch = if g.rng.random_bool(0.4) {
            g.features.insert(Feature::Prefetch);
            (0..g.rng.random_range(1..=3)).map(|k| format!("chunk {k}: {} policy", WORDS.choose(g.rng).unwrap())).collect()
        } else {
            Vec::new()
        };
        starts.push(Start { route_id, goal, prefetch });
    }
    let vars = vec![(BASE_VAR.to_owned(), "http://tools.sim.invalid".to_owned()), (KEY_VAR.to_owned(), secret.clone())];
    World { routes, packs, tools: g.tools, starts, secret, vars, scripts: g.scripts, features: g.features }
}

struct Gen<'a> {
    rng: &'a mut ChaCha8Rng,
    features: BTreeSet<Feature>,
    tools: Vec<ToolSpec>,
    scripts: Vec<Script>,
    /// Each route's child-run nesting (0: starts no child run); nesting stops at depth 4.
    depths: Vec<usize>,
}

impl Gen<'_> {
    fn packs(&mut self) -> Vec<SourceFile> {
        (0..self.rng.random_range(1..=2))
            .map(|i| {
                let mut p = Map::new();
                p.insert("description".into(), json!(format!("Simulated pack {i}.")));
                if self.rng.random_bool(0.8) {
                    p.insert("host".into(), json!(format!("You are simulated assistant {i}.\nBe brief.")));
                }
                let mut roles = Map::new();
                for role in ["classify", "query_formulation", "synthesis"] {
                    if self.rng.random_bool(0.5) {
                        roles.insert(role.into(), json!(format!("{{{{host}}}}\nDo the {role} step.\n{{{{ rules }}}}")));
                    }
                }
                if !roles.is_empty() {
                    p.insert("roles".into(), Value::Object(roles));
                }
                if self.rng.random_bool(0.5) {
                    p.insert("synthesis".into(), json!("{{host}}\nWrite the answer from the prior stage outputs."));
                }
                if self.rng.random_bool(0.6) {
                    p.insert("rules".into(), json!(["Never reveal credentials.", "Ask when the order is unclear."]));
                }
                if self.rng.random_bool(0.5) {
                    self.features.insert(Feature::PromptPackAgent);
                    // Sometimes a wrapper that leaves placeholders out: the loader adds them and warns.
                    let agent = if self.rng.random_bool(0.7) {
                        "{{host}}\nRules:\n{{rules}}\nTools:\n{{tools}}\nDecide the next step."
                    } else {
                        "Decide the next step."
                    };
                    p.insert("agent".into(), json!(agent));
                }
                SourceFile { path: format!("packs/sim-pack-{i}.yaml").into(), text: yaml(&p) }
            })
            .collect()
    }

    fn route(&mut self, i: usize, pack: &str) -> SourceFile {
        let id = format!("sim-{i}");
        let kind =
            *[(Kind::Linear, 3), (Kind::Branched, 3), (Kind::Manifest, 2), (Kind::DecisionLoop, 3)].choose_weighted(self.rng, |k| k.1).map(|k| &k.0).unwrap();
        let mut caps = Map::new();
        let mut route = Map::new();
        route.insert("description".into(), json!(format!("Simulated route {i}.")));
        route.insert("model_profile".into(), json!(*["default", "small"].choose(self.rng).unwrap()));
        route.insert("prompt_pack".into(), json!(pack));
        let mut file = Map::new();
        let mut depth = 0;
        match kind {
            Kind::DecisionLoop => {
                self.features.insert(Feature::DecisionLoop);
                let steps = self.decision_loop(&id, &mut caps);
                route.insert("decision_loop".into(), json!({"tools": caps.keys().collect::<Vec<_>>()}));
                route.insert("max_loop_steps".into(), json!(steps));
            }
            Kind::Linear | Kind::Branched | Kind::Manifest => {
                let n = self.rng.random_range(1..=6);
                let (stages, d) = self.stages(i, n, kind, &mut caps);
                depth = d;
                file.insert("workflows".into(), json!({format!("w{i}"): {"stages": stages}}));
                if kind == Kind::Manifest {
                    self.features.insert(Feature::Manifest);
                    let mut synthesis = Map::new();
                    if self.rng.random_bool(0.5) {
                        synthesis.insert("id".into(), json!("memo"));
                    }
                    if self.rng.random_bool(0.6) {
                        let (schema, _) = self.output_schema(false);
                        caps.insert(format!("c{i}_memo"), json!({"output_schema": schema}));
                        synthesis.insert("capability".into(), json!(format!("c{i}_memo")));
                    }
                    let mut manifest = Map::new();
                    manifest.insert("workflow".into(), json!(format!("w{i}")));
                    if !synthesis.is_empty() {
                        manifest.insert("synthesis".into(), Value::Object(synthesis));
                    }
                    file.insert("manifests".into(), json!({format!("m{i}"): manifest}));
                    route.insert("manifest".into(), json!(format!("m{i}")));
                } else {
                    self.features.insert(if kind == Kind::Linear { Feature::Linear } else { Feature::Branched });
                    route.insert("workflow".into(), json!(format!("w{i}")));
                }
                if self.rng.random_bool(0.3) {
                    route.insert("max_loop_steps".into(), json!(self.rng.random_range(2..=8)));
                }
            }
        }
        if self.rng.random_bool(0.3) {
            route.insert("conversation".into(), json!(*["none", "session"].choose(self.rng).unwrap()));
        }
        self.depths.push(depth);
        // Sections in the documented order: capabilities, workflows, manifests, routes.
        let mut out = Map::new();
        if !caps.is_empty() {
            out.insert("capabilities".into(), Value::Object(caps));
        }
        out.extend(file);
        out.insert("routes".into(), json!({id.clone(): route}));
        SourceFile { path: format!("routes/{id}.yaml").into(), text: yaml(&out) }
    }

    /// A decision loop's tools (into `caps`) and its `decide` script; the step budget.
    fn decision_loop(&mut self, route_id: &str, caps: &mut Map<String, Value>) -> usize {
        let n_tools = self.rng.random_range(1..=3);
        let mut tools = Vec::new();
        for k in 0..n_tools {
            let name = format!("{route_id}_t{k}").replace('-', "_");
            let fields = self.fields(0..=3);
            let required: Vec<&String> = fields.iter().map(|(n, _)| n).filter(|_| self.rng.random_bool(0.5)).collect();
            let props: Map<String, Value> = fields.iter().map(|(n, f)| (n.clone(), field_schema(f))).collect();
            let mut cap = Map::new();
            cap.insert("description".into(), json!(format!("Simulated tool {k}.")));
            cap.insert("input_schema".into(), json!({"type": "object", "properties": props, "required": required}));
            let http = self.rng.random_bool(0.5);
            if http {
                cap.insert("invoke".into(), self.invoke(&name, false));
            } else {
                self.features.insert(Feature::InProcessTool);
            }
            caps.insert(name.clone(), Value::Object(cap));
            self.tools.push(ToolSpec { name: name.clone(), http });
            tools.push((name, fields));
        }
        let calls = self.rng.random_range(0..=3);
        let mut replies = Vec::new();
        for _ in 0..calls {
            let (name, fields) = tools.choose(self.rng).unwrap();
            let args = if self.rng.random_bool(0.1) && !fields.is_empty() {
                // Arguments the input schema refuses: a tool error the model sees, never the run's end.
                Value::Object(fields.iter().map(|(n, _)| (n.clone(), json!({"nested": [1, 2]}))).collect())
            } else {
                Value::Object(fields.iter().map(|(n, f)| (n.clone(), self.value(f))).collect())
            };
            replies.push(format!("CALL {name} {args}"));
        }
        let ask = self.rng.random_bool(0.35);
        if ask {
            replies.push(format!("ASK Which {} do you mean?", WORDS.choose(self.rng).unwrap()));
        }
        // After an `ASK`, the turn that follows the user's reply.
        replies.push(format!("DONE the {} is handled", WORDS.choose(self.rng).unwrap()));
        // Sometimes no script: the stub's generated decision (`DONE`).
        if self.rng.random_bool(0.9) {
            if ask {
                self.features.insert(Feature::Ask);
            }
            self.scripts.push(Script { route_id: route_id.to_owned(), stage_id: "decide".into(), replies });
        }
        // Usually enough turns for the script; sometimes too few (`loop_budget_exceeded`).
        if self.rng.random_bool(0.85) { self.rng.random_range(calls + 1..=8) } else { self.rng.random_range(1..=calls + 1) }
    }

    /// `n` stages of workflow `w{i}` and the child-run depth they give the route.
    fn stages(&mut self, i: usize, n: usize, kind: Kind, caps: &mut Map<String, Value>) -> (Vec<Value>, usize) {
        let mut stages = Vec::new();
        let mut outputs: Vec<Fields> = Vec::new();
        let mut depth = 0;
        for s in 0..n {
            let mut stage = Map::new();
            stage.insert("id".into(), json!(format!("s{s}")));
            let cap = format!("c{i}_{s}");
            let children: Vec<usize> = (0..i).filter(|&j| self.depths[j] < 3).collect();
            let roles = [("classify", 3), ("synthesis", 3), ("query_formulation", 2), ("none", 2), ("child_run", if children.is_empty() { 0 } else { 2 })];
            let role = roles.choose_weighted(self.rng, |r| r.1).unwrap().0;
            let mut fields = Vec::new();
            match role {
                "child_run" => {
                    self.features.insert(Feature::ChildRun);
                    let child = *children.choose(self.rng).unwrap();
                    depth = depth.max(self.depths[child] + 1);
                    stage.insert("llm_role".into(), json!("none"));
                    stage.insert("kind".into(), json!("child_run"));
                    stage.insert("route".into(), json!(format!("sim-{child}")));
                }
                "none" => {
                    stage.insert("llm_role".into(), json!("none"));
                    if self.rng.random_bool(0.6) {
                        // An HTTP tool called with the goal as its arguments (the goal always has `ticket`).
                        let mut c = Map::new();
                        if self.rng.random_bool(0.5) {
                            c.insert("input_schema".into(), json!({"type": "object", "properties": {"ticket": {"type": "string"}}, "required": ["ticket"]}));
                        }
                        c.insert("invoke".into(), self.invoke(&cap, false));
                        caps.insert(cap.clone(), Value::Object(c));
                        self.tools.push(ToolSpec { name: cap.clone(), http: true });
                        stage.insert("capability".into(), json!(cap));
                    }
                }
                "query_formulation" => {
                    self.features.insert(Feature::QueryFormulation);
                    stage.insert("llm_role".into(), json!(role));
                    let mut c = Map::new();
                    if self.rng.random_bool(0.7) {
                        let (schema, f) = self.output_schema(true);
                        c.insert("output_schema".into(), schema);
                        fields = f;
                    }
                    let http = self.rng.random_bool(0.7);
                    if http {
                        c.insert("invoke".into(), self.invoke(&cap, true));
                        self.tools.push(ToolSpec { name: cap.clone(), http: true });
                        // The tool's response is the slot: no fields to test.
                        fields = Vec::new();
                    }
                    caps.insert(cap.clone(), Value::Object(c));
                    stage.insert("capability".into(), json!(cap));
                }
                _ => {
                    stage.insert("llm_role".into(), json!(role));
                    if self.rng.random_bool(0.8) {
                        let (schema, f) = self.output_schema(false);
                        caps.insert(cap.clone(), json!({"description": format!("Stage {s} of route {i}."), "output_schema": schema}));
                        stage.insert("capability".into(), json!(cap));
                        fields = f;
                    }
                }
            }
            outputs.push(fields);
            stages.push(stage);
        }
        if kind == Kind::Branched {
            for (s, stage) in stages.iter_mut().enumerate() {
                // The first stage always branches, so the workflow is branched even with one stage.
                if s > 0 && self.rng.random_bool(0.4) {
                    continue;
                }
                stage.extend(self.flow(s, n, &outputs));
            }
        }
        (stages.into_iter().map(Value::Object).collect(), depth)
    }

    /// A branched stage's `next` or `branches`. Unconditional transitions only go forward (or to
    /// `end`), so every cycle has a conditional arm and can be left.
    fn flow(&mut self, s: usize, n: usize, outputs: &[Fields]) -> Map<String, Value> {
        let mut flow = Map::new();
        // Mostly the next stage, so few stages are left unreachable (a warning, not an error).
        let forward = |rng: &mut ChaCha8Rng| match s + 1 < n && rng.random_bool(0.8) {
            true if rng.random_bool(0.6) => format!("s{}", s + 1),
            true => format!("s{}", rng.random_range(s + 1..n)),
            false => "end".to_owned(),
        };
        if self.rng.random_bool(0.25) {
            flow.insert("next".into(), json!(forward(self.rng)));
            return flow;
        }
        let mut arms = Vec::new();
        for _ in 0..self.rng.random_range(1..=3) {
            let slot = if self.rng.random_bool(0.8) { s } else { self.rng.random_range(0..=s) };
            let when = self.condition(slot, &outputs[slot]);
            let goto = if self.rng.random_bool(0.15) {
                self.features.insert(Feature::Loop);
                format!("s{}", self.rng.random_range(0..=s))
            } else {
                forward(self.rng)
            };
            arms.push(json!({"when": when, "goto": goto}));
        }
        // Without a last arm lacking `when`, a run may end `no_branch_matched` (documented).
        if self.rng.random_bool(0.85) {
            arms.push(json!({"goto": forward(self.rng)}));
        }
        flow.insert("branches".into(), Value::Array(arms));
        flow
    }

    fn condition(&mut self, s: usize, fields: &Fields) -> Value {
        let Some((name, field)) = fields.choose(self.rng) else {
            return if self.rng.random_bool(0.5) {
                json!({"slot": format!("s{s}"), "contains": "stub"})
            } else {
                json!({"slot": format!("s{s}"), "exists": true})
            };
        };
        let slot = format!("s{s}.{name}");
        match field {
            Field::Enum(members) => match self.rng.random_range(0..3) {
                0 => json!({"slot": slot, "equals": members.choose(self.rng).unwrap()}),
                1 => json!({"slot": slot, "not_equals": members.choose(self.rng).unwrap()}),
                _ => json!({"slot": slot, "in": members[..self.rng.random_range(1..=members.len())]}),
            },
            Field::Bool => json!({"slot": slot, "equals": self.rng.random_bool(0.5)}),
            Field::Int => json!({"slot": slot, "not_equals": self.rng.random_range(0..100)}),
            Field::Num => json!({"slot": slot, "exists": self.rng.random_bool(0.8)}),
            Field::Str => json!({"slot": slot, "contains": format!("s{s}")}),
            Field::Strings => json!({"slot": slot, "exists": true}),
        }
    }

    /// An output schema of a random shape and its bindable fields. `query`: a query
    /// formulation's, which must have a string `query` property when bindable.
    fn output_schema(&mut self, query: bool) -> (Value, Fields) {
        match self.rng.random_range(0..10) {
            0..=5 => {
                self.features.insert(Feature::FlatSchema);
                let mut fields = self.fields(1..=4);
                if query {
                    fields.insert(0, ("query".into(), Field::Str));
                }
                let props: Map<String, Value> = fields.iter().map(|(n, f)| (n.clone(), field_schema(f))).collect();
                let required: Vec<&String> = fields.iter().map(|(n, _)| n).filter(|n| *n == "query" || self.rng.random_bool(0.6)).collect();
                let mut schema = json!({"type": "object", "properties": props, "required": required});
                if self.rng.random_bool(0.3) {
                    schema.as_object_mut().unwrap().remove("type");
                }
                (schema, fields)
            }
            6 | 7 if !query => {
                self.features.insert(Feature::Envelope);
                let name = *["text", "message"].choose(self.rng).unwrap();
                (json!({"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}), vec![(name.to_owned(), Field::Str)])
            }
            _ => {
                self.features.insert(Feature::UnbindableSchema);
                let schema = match self.rng.random_range(0..4) {
                    0 => json!({"type": "object", "properties": {"inner": {"type": "object", "properties": {"x": {"type": "string"}}}}}),
                    1 => json!({"type": "object"}),
                    2 => json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object"}}}}),
                    _ => json!({"type": "object", "properties": {"value": {"type": ["string", "null"]}}}),
                };
                (schema, Vec::new())
            }
        }
    }

    fn fields(&mut self, n: std::ops::RangeInclusive<usize>) -> Fields {
        let n = self.rng.random_range(n);
        (0..n)
            .map(|k| {
                let field = match self.rng.random_range(0..6) {
                    0 => Field::Str,
                    1 => Field::Int,
                    2 => Field::Num,
                    3 => Field::Bool,
                    4 => {
                        self.features.insert(Feature::EnumSchema);
                        let n = self.rng.random_range(1..=4);
                        Field::Enum((0..n).map(|m| format!("{}{m}", WORDS.choose(self.rng).unwrap())).collect())
                    }
                    _ => {
                        self.features.insert(Feature::ArraySchema);
                        Field::Strings
                    }
                };
                (format!("f{k}"), field)
            })
            .collect()
    }

    /// A value `field` accepts (a tool's argument).
    fn value(&mut self, field: &Field) -> Value {
        match field {
            Field::Str => json!(*WORDS.choose(self.rng).unwrap()),
            Field::Int => json!(self.rng.random_range(-5..100)),
            Field::Num => json!(f64::from(self.rng.random_range(0..1000)) / 8.0),
            Field::Bool => json!(self.rng.random_bool(0.5)),
            Field::Enum(members) => json!(members.choose(self.rng).unwrap()),
            Field::Strings => json!(vec![*WORDS.choose(self.rng).unwrap(); self.rng.random_range(0..3)]),
        }
    }

    /// An HTTP tool's `invoke`: the origin from one variable, the secret key from another, in
    /// the query where a real configuration keeps it.
    fn invoke(&mut self, name: &str, query_param: bool) -> Value {
        self.features.insert(Feature::HttpTool);
        let url = if self.rng.random_bool(0.5) {
            format!("${{{BASE_VAR}}}/{name}?api_key=${{{KEY_VAR}}}")
        } else {
            format!("http://tools.sim.invalid/v1/{name}?region=eu&key=${{{KEY_VAR}}}")
        };
        let mut invoke = Map::new();
        invoke.insert("url".into(), json!(url));
        if self.rng.random_bool(0.4) {
            self.features.insert(Feature::HttpPost);
            invoke.insert("method".into(), json!("POST"));
        }
        if self.rng.random_bool(0.5) {
            invoke.insert("timeout_ms".into(), json!(self.rng.random_range(100..=5000)));
        }
        if self.rng.random_bool(0.3) {
            invoke.insert("max_response_bytes".into(), json!(self.rng.random_range(1024..=1 << 20)));
        }
        if query_param && self.rng.random_bool(0.5) {
            invoke.insert("query_param".into(), json!(*["q", "query", "search"].choose(self.rng).unwrap()));
        }
        Value::Object(invoke)
    }

    fn goal(&mut self) -> Map<String, Value> {
        let mut goal = Map::new();
        let words: Vec<&str> = (0..self.rng.random_range(1..=5)).map(|_| *WORDS.choose(self.rng).unwrap()).collect();
        goal.insert("ticket".into(), json!(format!("My {} is broken", words.join(" "))));
        if self.rng.random_bool(0.5) {
            goal.insert("order_id".into(), json!(self.rng.random_range(1000..9999)));
        }
        if self.rng.random_bool(0.3) {
            goal.insert("lang".into(), json!(*["en", "de", "fr"].choose(self.rng).unwrap()));
        }
        goal
    }
}

fn field_schema(field: &Field) -> Value {
    match field {
        Field::Str => json!({"type": "string"}),
        Field::Int => json!({"type": "integer"}),
        Field::Num => json!({"type": "number"}),
        Field::Bool => json!({"type": "boolean"}),
        Field::Enum(members) => json!({"type": "string", "enum": members}),
        Field::Strings => json!({"type": "array", "items": {"type": "string"}}),
    }
}

/// Block YAML for the nesting of sections, definitions and stages; flow (JSON, which YAML 1.2
/// reads) for schemas, conditions and lists of scalars, the way hand-written catalogues mix them.
fn yaml(map: &Map<String, Value>) -> String {
    let mut out = String::new();
    block(&mut out, map, 0, false);
    out
}

fn block(out: &mut String, map: &Map<String, Value>, indent: usize, mut first_inline: bool) {
    const FLOW: [&str; 3] = ["input_schema", "output_schema", "when"];
    for (key, value) in map {
        if !first_inline {
            out.push_str(&" ".repeat(indent));
        }
        first_inline = false;
        out.push_str(key);
        out.push(':');
        match value {
            Value::Object(m) if !m.is_empty() && !FLOW.contains(&key.as_str()) => {
                out.push('\n');
                block(out, m, indent + 2, false);
            }
            Value::Array(items) if !items.is_empty() && items.iter().all(Value::is_object) => {
                out.push('\n');
                for item in items {
                    out.push_str(&" ".repeat(indent + 2));
                    out.push_str("- ");
                    block(out, item.as_object().unwrap(), indent + 4, true);
                }
            }
            Value::String(text) if plain(text) => {
                out.push(' ');
                out.push_str(text);
                out.push('\n');
            }
            other => {
                out.push(' ');
                out.push_str(&other.to_string());
                out.push('\n');
            }
        }
    }
}

/// A string YAML reads back as the same string without quotes: a catalogue name (`s0`, `end`,
/// `sim-3`), not a number, a boolean or null.
fn plain(text: &str) -> bool {
    let mut chars = text.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-'))
        && !matches!(text.to_ascii_lowercase().as_str(), "true" | "false" | "null")
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use fabric::cancel::Cancel;
    use fabric::catalogue::{RouteEntry, load_from_texts};
    use fabric::config::Settings;
    use fabric::defs::Invoke;
    use fabric::events::NullSink;
    use fabric::exec::{RunRequest, RunStatus};
    use fabric::failure::{BoxFuture, ReasonClass};
    use fabric::llm::stub::StubLlm;
    use fabric::runtime::Runtime;
    use fabric::tools::{FnTool, HttpPort, ToolError, ToolOutput};
    use rand::SeedableRng;

    use super::*;

    const SEEDS: std::ops::Range<u64> = 0..300;

    fn world(seed: u64) -> World {
        generate(&mut ChaCha8Rng::seed_from_u64(seed))
    }

    fn dump(w: &World) -> String {
        w.files()
    }

    /// An HTTP port that answers every call with its arguments, never touching the network, and
    /// counts the calls.
    struct Echo(Arc<AtomicUsize>);

    impl HttpPort for Echo {
        fn call<'a>(&'a self, _: &'a Invoke, _: &'a str, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
            self.0.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move {
                let text = json!({"echo": args}).to_string();
                Ok(ToolOutput { status: 200, bytes: text.len(), text, duration: Duration::ZERO })
            })
        }
    }

    /// HTTP and in-process tool calls made through [`runtime`]'s ports.
    #[derive(Default)]
    struct Calls {
        http: Arc<AtomicUsize>,
        in_process: Arc<AtomicUsize>,
    }

    fn runtime(w: &World) -> Runtime {
        runtime_counting(w, &Calls::default())
    }

    fn runtime_counting(w: &World, calls: &Calls) -> Runtime {
        let settings = Settings::load(|k| (k == "FABRIC_LLM_STUB").then(|| "1".to_owned())).unwrap();
        let mut stub = StubLlm::default();
        for s in &w.scripts {
            let replies: Vec<&str> = s.replies.iter().map(String::as_str).collect();
            stub = stub.script(&s.route_id, &s.stage_id, &replies);
        }
        let vars = w.vars.clone();
        let mut builder = Runtime::builder()
            .settings(settings)
            .catalogue_texts(w.routes.clone(), w.packs.clone())
            .stub(stub)
            .vars(move |k| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
            .http(Arc::new(Echo(calls.http.clone())));
        for t in w.tools.iter().filter(|t| !t.http) {
            let count = calls.in_process.clone();
            let tool = FnTool(move |args: &Map<String, Value>| {
                count.fetch_add(1, Ordering::Relaxed);
                Ok(json!({"ok": true, "args": args.len()}))
            });
            builder = builder.tool(&t.name, Arc::new(tool));
        }
        builder.build().unwrap()
    }

    #[test]
    fn every_world_loads_with_every_route_ready() {
        for seed in SEEDS {
            let w = world(seed);
            let catalogue = load_from_texts(&w.routes, &w.packs);
            let errors: Vec<String> = catalogue.diagnostics().iter().filter(|d| d.is_error()).map(ToString::to_string).collect();
            assert!(errors.is_empty() && catalogue.unloaded().is_empty(), "seed {seed}: {}\n{}", errors.join("\n"), dump(&w));
            let routes: Vec<&RouteEntry> = catalogue.routes().collect();
            assert_eq!(routes.len(), w.routes.len() - 1, "seed {seed}");
            for r in routes {
                if let RouteEntry::Broken(b) = r {
                    panic!("seed {seed}: route {} is broken: {:?}\n{}", b.id, b.problems, dump(&w));
                }
            }
            let rt = runtime(&w);
            for start in &w.starts {
                if let Err(e) = rt.check_route(&start.route_id) {
                    panic!("seed {seed}: {} cannot start: {e}\n{}", start.route_id, dump(&w));
                }
            }
        }
    }

    #[test]
    fn a_seed_gives_the_same_world_byte_for_byte() {
        for seed in [0, 1, 7, 299, 12_345] {
            let (a, b) = (world(seed), world(seed));
            assert_eq!(dump(&a), dump(&b), "seed {seed}");
            assert_eq!(a.secret, b.secret);
            let starts = |w: &World| w.starts.iter().map(|s| format!("{} {:?} {:?}", s.route_id, s.goal, s.prefetch)).collect::<Vec<_>>();
            assert_eq!(starts(&a), starts(&b));
            let scripts = |w: &World| w.scripts.iter().map(|s| format!("{} {} {:?}", s.route_id, s.stage_id, s.replies)).collect::<Vec<_>>();
            assert_eq!(scripts(&a), scripts(&b));
        }
        assert_ne!(dump(&world(1)), dump(&world(2)), "different seeds, different worlds");
    }

    #[test]
    fn the_seed_range_covers_every_feature() {
        let mut counts: Vec<(Feature, usize)> = Feature::ALL.iter().map(|f| (*f, 0)).collect();
        for seed in SEEDS {
            let w = world(seed);
            for (f, n) in &mut counts {
                *n += usize::from(w.features.contains(f));
            }
            // The secret sits in the catalogue only as a variable, never as its value.
            assert!(!dump(&w).contains(&w.secret), "seed {seed}");
            assert!(w.tools.iter().all(|t| !t.http) || dump(&w).contains("${SIM_TOOL_KEY}"), "seed {seed}");
        }
        // The route kinds as the loader reads them, not only as the generator meant them.
        let mut paths = std::collections::BTreeMap::new();
        for seed in SEEDS {
            let w = world(seed);
            for r in load_from_texts(&w.routes, &w.packs).routes() {
                if let RouteEntry::Ready(r) = r {
                    *paths.entry(r.path().as_str()).or_insert(0usize) += 1;
                }
            }
        }
        assert_eq!(paths.len(), 4, "route paths loaded: {paths:?}");
        let missing: Vec<_> = counts.iter().filter(|(_, n)| *n == 0).collect();
        assert!(missing.is_empty(), "features no world of seeds {SEEDS:?} has: {missing:?} (all: {counts:?})");
    }

    #[test]
    fn every_start_runs_to_a_documented_end() {
        let allowed = [ReasonClass::NoBranchMatched, ReasonClass::LoopBudgetExceeded, ReasonClass::ChildRunFailed];
        let tokio = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut ends = [0usize; 3];
        let calls = Calls::default();
        let mut reasons = std::collections::BTreeMap::new();
        for seed in SEEDS {
            let w = world(seed);
            let rt = runtime_counting(&w, &calls);
            for start in &w.starts {
                let req = RunRequest { route_id: start.route_id.clone(), goal: start.goal.clone(), prefetch: start.prefetch.clone() };
                let outcome = tokio.block_on(rt.run(req, Arc::new(NullSink), Cancel::never()));
                let result = match outcome {
                    Ok(o) => o.result,
                    Err(e) => panic!("seed {seed}: {} was refused: {e}\n{}", start.route_id, dump(&w)),
                };
                match result.status() {
                    RunStatus::Completed => ends[0] += 1,
                    RunStatus::AwaitingInput => ends[2] += 1,
                    RunStatus::Cancelled => panic!("seed {seed}: {} was cancelled, and nothing cancels it here", start.route_id),
                    RunStatus::Failed => {
                        let failure = result.error().unwrap();
                        assert!(allowed.contains(&failure.reason_class), "seed {seed}: {} failed: {failure:?}\n{}", start.route_id, dump(&w));
                        ends[1] += 1;
                        *reasons.entry(failure.reason_class.as_str()).or_insert(0usize) += 1;
                    }
                }
            }
        }
        // Each kind of end is reached somewhere in the range.
        let (http, in_process) = (calls.http.load(Ordering::Relaxed), calls.in_process.load(Ordering::Relaxed));
        eprintln!("seeds {SEEDS:?}: completed, failed, awaiting input {ends:?} (failed: {reasons:?}); tool calls: {http} HTTP, {in_process} in process");
        assert!(ends.iter().all(|n| *n > 0), "completed, failed, awaiting input: {ends:?}");
        assert!(http > 0 && in_process > 0, "tool calls: {http} HTTP, {in_process} in process");
    }
}
