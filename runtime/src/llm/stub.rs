//! The seeded stub: a backend that answers from scripts under `stub/`, never the network.
//!
//! `stub/<route_id>.yaml` lists replies per stage, one per call of that stage in a run (a
//! decision-loop route scripts its `decide` node turn by turn, in the `CALL` / `ASK` / `DONE` text
//! protocol):
//!
//! ```yaml
//! stages:
//!   intake:
//!     - '{"category":"billing","urgency":"high"}'
//! ```
//!
//! Without a script line the stub generates a deterministic reply from the stage's schema:
//! the same route, stage, turn and user message always give the same reply. In strict mode
//! (tests) a call past a stage's script fails loudly, and [`StubLlm::unconsumed`] lists script
//! lines a run never used.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use indexmap::IndexMap;

use super::{BoxFuture, Llm, LlmError, LlmReply, LlmRequest, ModelInfo, ReasonClass, ReplyMeta, ReplyValue, Usage, finish_shared_reply};
use crate::diag::{Diagnostic, Diagnostics};
use crate::llm::OutputSpec;
use crate::source::NamedText;
use crate::structured::{FieldType, Scalar};
use crate::yaml::{self, Ctx, Value};

/// A route's script: stage id → replies in call order.
type Script = IndexMap<String, Vec<Arc<str>>, foldhash::fast::RandomState>;

#[derive(Debug, Default, Clone)]
pub struct StubLlm {
    /// route id → stage id → replies in call order. Looked up by every model call: a fast
    /// hasher (the names come from the catalogue and the script files).
    scripts: HashMap<String, Script, foldhash::fast::RandomState>,
    /// Routes whose script file has errors, with them: only these routes' runs are refused.
    broken: HashMap<String, Vec<Diagnostic>>,
    latency: Duration,
    strict: bool,
    /// Where each script came from and the stage keys it named (with their places), for the
    /// check against the catalogue ([`StubLlm::keys`]).
    files: Vec<ScriptFile>,
    /// The scripts as read, for the catalogue version ([`StubLlm::texts`]).
    texts: Vec<NamedText>,
}

/// A script file as read: its route (the file's name), path and stage keys.
#[derive(Debug, Clone)]
pub struct ScriptFile {
    pub route_id: String,
    pub path: std::path::PathBuf,
    pub stages: Vec<(String, crate::diag::Pos)>,
}

impl StubLlm {
    /// Loads every script of `dir`. A script with errors breaks only its own route (see
    /// [`StubLlm::problems`]); a directory that cannot be read is an error.
    pub fn load(dir: &Path) -> Result<StubLlm, Vec<Diagnostic>> {
        let mut diags = Diagnostics::default();
        if !dir.is_dir() {
            diags.error(dir, crate::diag::Pos::FILE, "the stub script directory does not exist (or is not a directory)");
            return Err(diags.into_vec());
        }
        let layers = crate::source::Layers::one(dir);
        let mut read = Vec::new();
        for path in crate::source::yaml_files(dir, &mut diags) {
            let text = crate::source::read_text(&path, &mut diags);
            read.push((path, text));
        }
        let texts = read.iter().filter_map(|(path, text)| Some(NamedText { name: layers.name_of(path), text: text.clone()? })).collect();
        Ok(StubLlm::from_read(read, diags, texts))
    }

    /// The stub of scripts already read (a catalogue version's, rebuilt from the run store): each
    /// file's name is its path, and names its route.
    pub fn from_texts(files: &[NamedText]) -> StubLlm {
        let read = files.iter().map(|f| (std::path::PathBuf::from(&f.name), Some(f.text.clone()))).collect();
        StubLlm::from_read(read, Diagnostics::default(), files.to_vec())
    }

    /// The scripts it was read from, named as a catalogue version keeps them (none for a stub
    /// built in code).
    pub fn texts(&self) -> &[NamedText] {
        &self.texts
    }

    fn from_read(read: Vec<(std::path::PathBuf, Option<String>)>, mut diags: Diagnostics, texts: Vec<NamedText>) -> StubLlm {
        let mut scripts = HashMap::default();
        let mut broken: HashMap<String, Vec<Diagnostic>> = HashMap::new();
        let mut first_path: HashMap<String, std::path::PathBuf> = HashMap::new();
        let mut files = Vec::new();
        for (path, text) in read {
            let Some(route_id) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else { continue };
            let mark = diags.len();
            if let Some(first) = first_path.get(&route_id) {
                diags.error(&path, crate::diag::Pos::FILE, format!("route `{route_id}` already has a stub script, {}", first.display()));
            } else {
                first_path.insert(route_id.clone(), path.clone());
                let mut keys = Vec::new();
                if let Some(stages) = text.and_then(|text| Self::load_file(&path, &text, &route_id, &mut diags, &mut keys)) {
                    scripts.insert(route_id.clone(), stages);
                }
                files.push(ScriptFile { route_id: route_id.clone(), path: path.clone(), stages: keys });
            }
            if diags.error_count_since(mark) > 0 {
                broken.entry(route_id).or_default().extend(diags.since(mark).iter().filter(|d| d.is_error()).cloned());
            }
        }
        StubLlm { scripts, broken, latency: Duration::ZERO, strict: false, files, texts }
    }

    /// The problems of `route_id`'s script file, when it has any: its runs are refused.
    pub fn problems(&self, route_id: &str) -> Option<&[Diagnostic]> {
        if self.broken.is_empty() {
            return None;
        }
        self.broken.get(route_id).map(Vec::as_slice)
    }

    /// Every problem of every broken script, route by route in name order.
    pub fn broken(&self) -> impl Iterator<Item = &Diagnostic> {
        let mut routes: Vec<_> = self.broken.iter().collect();
        routes.sort_by(|a, b| a.0.cmp(b.0));
        routes.into_iter().flat_map(|(_, problems)| problems)
    }

    /// The script files read, with the stage keys each named: what the runtime checks against
    /// the catalogue (a file named after no route, a key naming no stage is a mistake the stub
    /// would otherwise hide behind generated replies).
    pub fn files(&self) -> &[ScriptFile] {
        &self.files
    }

    /// Breaks `route_id`'s script with these problems (strict mode: its runs are refused).
    pub fn break_script(&mut self, route_id: &str, problems: Vec<Diagnostic>) {
        self.broken.entry(route_id.to_owned()).or_default().extend(problems);
    }

    fn load_file(path: &Path, text: &str, route_id: &str, diags: &mut Diagnostics, keys: &mut Vec<(String, crate::diag::Pos)>) -> Option<Script> {
        {
            {
                let root = yaml::parse(path, text, diags)?;
                let mut ctx = Ctx { path, diags };
                let mut f = ctx.map(&root, &format!("stub script `{route_id}`"))?;
                let mut stages = Script::default();
                if let Some(node) = f.get("stages") {
                    for (key, replies) in yaml::entries(&mut ctx, node, "stages") {
                        keys.push((key.name.clone(), key.pos));
                        let Some(items) = ctx.seq(replies, &format!("replies of stage `{}`", key.name)) else { continue };
                        let lines = items.iter().filter_map(|i| match &i.value {
                            // A mapping is accepted and sent as its compact JSON, for readability.
                            Value::Map(_) => Some(yaml::to_json(i).to_string().into()),
                            _ => ctx.string(i, "a scripted reply").map(Arc::from),
                        });
                        stages.insert(key.name.clone(), lines.collect());
                    }
                }
                f.get("description");
                f.finish(&mut ctx);
                Some(stages)
            }
        }
    }

    pub fn with_latency(mut self, latency: Duration) -> StubLlm {
        self.latency = latency;
        self
    }

    pub fn strict(mut self, strict: bool) -> StubLlm {
        self.strict = strict;
        self
    }

    pub fn is_strict(&self) -> bool {
        self.strict
    }

    /// Adds or replaces a route's script (library users and tests).
    pub fn script(mut self, route_id: &str, stage_id: &str, replies: &[&str]) -> StubLlm {
        self.scripts.entry(route_id.to_owned()).or_default().insert(stage_id.to_owned(), replies.iter().map(|s| Arc::from(*s)).collect());
        self
    }

    /// Script lines a run left unused, given how often it called each (route, stage).
    pub fn unconsumed(&self, calls: &[(std::sync::Arc<str>, std::sync::Arc<str>, u32)]) -> Vec<String> {
        let mut out = Vec::new();
        let mut routes: Vec<&str> = calls.iter().map(|(r, _, _)| &**r).collect();
        routes.dedup();
        for route in routes {
            let Some(stages) = self.scripts.get(route) else { continue };
            for (stage, replies) in stages {
                let made = calls.iter().filter(|(r, s, _)| &**r == route && **s == **stage).map(|c| c.2).sum::<u32>() as usize;
                if made < replies.len() {
                    out.push(format!("route `{route}` stage `{stage}`: {} of {} scripted replies unused", replies.len() - made, replies.len()));
                }
            }
        }
        out
    }

    fn reply_for(&self, req: &LlmRequest<'_>) -> Result<Arc<str>, LlmError> {
        if let Some(problems) = self.problems(req.route_id) {
            // Runs are refused at start; a child run of such a route ends here.
            let first = problems.first().map(ToString::to_string).unwrap_or_default();
            return Err(LlmError::new(ReasonClass::ProviderError, format!("the stub script of route `{}` has errors: {first}", req.route_id)));
        }
        if let Some(replies) = self.scripts.get(req.route_id).and_then(|s| s.get(req.stage_id)) {
            if let Some(r) = replies.get(req.turn as usize) {
                return Ok(r.clone());
            }
            if self.strict {
                return Err(LlmError::new(
                    ReasonClass::StubScriptExhausted,
                    format!(
                        "unexpected call {} to stage `{}` of route `{}`: its script has {} replies",
                        req.turn + 1,
                        req.stage_id,
                        req.route_id,
                        replies.len()
                    ),
                ));
            }
        } else if self.strict && self.scripts.contains_key(req.route_id) {
            return Err(LlmError::new(
                ReasonClass::StubScriptExhausted,
                format!("unexpected call to stage `{}` of route `{}`: it has no script", req.stage_id, req.route_id),
            ));
        }
        Ok(generated_reply(req).into())
    }
}

impl Llm for StubLlm {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(self.call(req))
    }

    async fn call<'a>(&'a self, req: &'a LlmRequest<'a>) -> Result<LlmReply, LlmError> {
        let raw = self.reply_for(req)?;
        match req.stream {
            // Streamed in seeded pieces, the latency spread over them as a model's would be. A stub
            // without latency writes its reply at once: the telemetry layer shows it as one delta.
            Some(deltas) if !self.latency.is_zero() => Box::pin(stream_reply(deltas, req, &raw, self.latency)).await,
            Some(_) => {}
            None if !self.latency.is_zero() => {
                // Boxed: most calls have no latency, and the timer would make every call's future
                // (boxed once per call, copied into its box) larger.
                Box::pin(tokio::time::sleep(self.latency)).await;
            }
            None => {}
        }
        // Token counts the way a real reply would report them, so telemetry has figures.
        let usage = Usage { input_tokens: approx_tokens(req.system) + approx_tokens(req.user), output_tokens: approx_tokens(&raw) };
        let meta = ReplyMeta { usage: Some(usage), ..ReplyMeta::default() };
        match req.output {
            // The stub speaks the text protocol for decisions (`CALL` / `ASK` / `DONE`).
            OutputSpec::Decision(spec) => match spec.parse_text(&raw) {
                Ok(decision) => Ok(LlmReply { value: ReplyValue::Decision(decision), meta, raw: Some(raw), served_by: None }),
                Err(e) => Err(LlmError::from(e).with_reply(meta, raw.to_string())),
            },
            _ => finish_shared_reply(req.output, &raw, meta),
        }
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "stub".into(), model: "seeded-stub".into(), ..ModelInfo::default() }
    }
}

/// The reply's text in pieces of 1 to 16 characters, their lengths drawn from the call's seed (the
/// same call gives the same pieces every time), `latency` spread over them.
async fn stream_reply(deltas: &super::stream::Deltas<'_>, req: &LlmRequest<'_>, raw: &str, latency: Duration) {
    let turn = req.turn.to_string();
    let mut seed = fnv1a(&[req.route_id, req.stage_id, &turn, req.user]);
    let mut pieces = Vec::new();
    let mut rest = raw;
    while !rest.is_empty() {
        seed = seed.rotate_left(5) ^ 0x9e37_79b9_7f4a_7c15;
        let want = 1 + (seed % 16) as usize;
        let cut = rest.char_indices().nth(want).map_or(rest.len(), |(i, _)| i);
        pieces.push(&rest[..cut]);
        rest = &rest[cut..];
    }
    let each = latency / (pieces.len().max(1) as u32);
    for piece in pieces {
        if !each.is_zero() {
            tokio::time::sleep(each).await;
        }
        deltas.push(piece);
    }
}

fn approx_tokens(text: &str) -> u64 {
    text.len().div_ceil(4) as u64
}

/// FNV-1a: stable across platforms and releases, unlike `DefaultHasher`.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain(std::iter::once(0xff)) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The deterministic fallback reply for a call that has no script line.
pub fn generated_reply(req: &LlmRequest<'_>) -> String {
    let turn = req.turn.to_string();
    let seed = fnv1a(&[req.route_id, req.stage_id, &turn, req.user]);
    match req.output {
        OutputSpec::Bindable(schema) => {
            let mut obj = serde_json::Map::new();
            for (idx, field) in schema.fields().iter().enumerate() {
                let pick = seed.rotate_left(idx as u32 * 7);
                let value = match &field.ty {
                    FieldType::Scalar(s) => scalar_value(s, field.name(), req.stage_id, pick),
                    FieldType::Array(s) => serde_json::Value::Array(vec![scalar_value(s, field.name(), req.stage_id, pick)]),
                };
                obj.insert(field.name().to_owned(), value);
            }
            serde_json::Value::Object(obj).to_string()
        }
        OutputSpec::Decision(_) => format!("DONE [stub {:08x}] no scripted decision for {}", seed as u32, req.route_id),
        OutputSpec::Text | OutputSpec::Unbindable { .. } => format!("[stub {:08x}] {} reply for {}", seed as u32, req.stage_id, req.route_id),
    }
}

fn scalar_value(s: &Scalar, field: &str, stage: &str, pick: u64) -> serde_json::Value {
    match s {
        Scalar::String => format!("{stage} {field} {:04x}", pick as u16).into(),
        Scalar::Integer => ((pick % 100) as i64).into(),
        Scalar::Number => ((pick % 1000) as f64 / 10.0).into(),
        Scalar::Boolean => pick.is_multiple_of(2).into(),
        Scalar::Enum(members) => members[(pick % members.len() as u64) as usize].clone(),
    }
}
