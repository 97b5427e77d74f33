//! Decoding of catalogue sections from the located YAML tree into [`super::defs`].

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value as Json;

use crate::defs::*;
use crate::diag::Pos;
use crate::structured::FlatSchema;
use crate::vocab::{DEFAULT_TOOL_TIMEOUT_MS, MAX_TOOL_TIMEOUT_MS, OutputSpec, ProviderKind, choose_model, parse_base_url};
use crate::yaml::{self, Ctx, Node, Value};

pub const DEFAULT_MAX_LOOP_STEPS: u32 = 8;
pub const DEFAULT_MAX_RESPONSE_BYTES: u64 = 1024 * 1024;

pub(super) fn reference(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<Ref> {
    ctx.ident(node, what).map(|name| Ref { name, pos: node.pos })
}

fn opt_string(ctx: &mut Ctx<'_>, node: Option<&Node>, what: &str) -> Option<String> {
    node.and_then(|n| ctx.string(n, what))
}

pub fn profile(ctx: &mut Ctx<'_>, name: &str, node: &Node, origin: Origin) -> Option<ProfileDef> {
    let mut f = ctx.map(node, &format!("model profile `{name}`"))?;
    let mut located = |ctx: &mut Ctx<'_>, key: &'static str| f.get(key).and_then(|n| ctx.string(n, &format!("`{key}`")).map(|s| (s, n.pos)));
    let provider = located(ctx, "provider");
    let model = located(ctx, "model");
    let base_url = located(ctx, "base_url");
    let api_key_env = located(ctx, "api_key_env");
    let temperature = f.get("temperature").and_then(|n| match n.value {
        Value::Float(x) if (0.0..=2.0).contains(&x) => Some(x),
        Value::Int(x) if (0..=2).contains(&x) => Some(x as f64),
        Value::UInt(x) if x <= 2 => Some(x as f64),
        _ => {
            ctx.error(n.pos, "`temperature` must be a number from 0 to 2");
            None
        }
    });
    let max_tokens = f.get("max_tokens").and_then(|n| ctx.uint(n, "`max_tokens`", 1, 1_000_000)).map(|n| n as u32);
    f.get("description");
    let fallbacks = super::fallbacks::decode(ctx, &mut f);
    check_profile_routing(ctx, f.pos, &provider, &model, &base_url, &api_key_env);
    f.finish(ctx);
    let text = |v: Option<(String, Pos)>| v.map(|(s, _)| s);
    Some(ProfileDef {
        origin,
        provider: text(provider),
        model: text(model),
        base_url: text(base_url),
        api_key_env: text(api_key_env),
        temperature,
        max_tokens,
        fallbacks,
    })
}

/// What can be known about a profile's routing without the environment: it moves as one unit
/// (a model whenever anything else is set), the provider is one with a backend, a bare model
/// string names a provider, the base URL is http(s), the key variable is a variable name.
fn check_profile_routing(
    ctx: &mut Ctx<'_>,
    at: Pos,
    provider: &Option<(String, Pos)>,
    model: &Option<(String, Pos)>,
    base_url: &Option<(String, Pos)>,
    key_env: &Option<(String, Pos)>,
) {
    if model.is_none() && (provider.is_some() || base_url.is_some() || key_env.is_some()) {
        ctx.error(at, "routing moves as one unit: a profile that sets provider, base_url or api_key_env must also set model");
    }
    match (provider, model) {
        (Some((p, pos)), _) if ProviderKind::from_key(p).is_none() => {
            ctx.error(*pos, format!("provider `{p}` is not supported: it is none of init_chat_model's provider keys (docs/providers.md lists them)"));
        }
        (None, Some((m, pos))) => {
            if let Err(e) = choose_model("model", m) {
                ctx.error(*pos, format!("`model` {}", e.message));
            }
        }
        _ => {}
    }
    if let Some((u, pos)) = base_url
        && let Err(e) = parse_base_url("base_url", u)
    {
        ctx.error(*pos, format!("`base_url` {}", e.message));
    }
    if let Some((v, pos)) = key_env
        && (v.is_empty() || !v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'))
    {
        ctx.error(*pos, format!("`api_key_env` `{v}` is not an environment variable name"));
    }
}

/// A string with `${VAR}`s from the environment (`what` names it in messages).
pub(super) fn template(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<UrlTemplate> {
    let raw = ctx.string(node, what)?;
    let mut parts = Vec::new();
    let mut rest = raw.as_str();
    while let Some(start) = rest.find("${") {
        if start > 0 {
            parts.push(UrlPart::Lit(rest[..start].to_owned()));
        }
        let Some(end) = rest[start..].find('}') else {
            ctx.error(node.pos, format!("{what} has an unclosed `${{`"));
            return None;
        };
        let var = &rest[start + 2..start + end];
        if var.is_empty() || !var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            ctx.error(node.pos, format!("{what} names `${{{var}}}`, which is not an environment variable name"));
            return None;
        }
        parts.push(UrlPart::Var(var.to_owned()));
        rest = &rest[start + end + 1..];
    }
    if !rest.is_empty() {
        parts.push(UrlPart::Lit(rest.to_owned()));
    }
    Some(UrlTemplate { raw, parts })
}

/// A URL template (`what` names it): literal parts checked now to start with `http(s)://`.
pub(super) fn url_template(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<UrlTemplate> {
    let t = template(ctx, node, what)?;
    let parts = &t.parts;
    // A literal URL is checked now; a templated one when it is resolved at run time.
    if let [UrlPart::Lit(lit)] = parts.as_slice()
        && !(lit.starts_with("http://") || lit.starts_with("https://"))
    {
        ctx.error(node.pos, format!("{what} `{lit}` must start with http:// or https://"));
        return None;
    }
    if let Some(UrlPart::Lit(first)) = parts.first()
        && parts.len() > 1
        && !(first.starts_with("http://") || first.starts_with("https://"))
    {
        ctx.error(node.pos, format!("{what} must start with http://, https:// or a `${{VAR}}` that holds the origin"));
        return None;
    }
    Some(t)
}

fn invoke(ctx: &mut Ctx<'_>, node: &Node) -> Option<Invoke> {
    let mut f = ctx.map(node, "`invoke`")?;
    let url = f.require(ctx, "url").and_then(|n| url_template(ctx, n, "`invoke.url`"));
    let method = match f.get("method") {
        None => Some(HttpMethod::Get),
        Some(n) => match ctx.string(n, "`invoke.method`").as_deref() {
            Some("GET" | "get") => Some(HttpMethod::Get),
            Some("POST" | "post") => Some(HttpMethod::Post),
            Some(other) => {
                ctx.error(n.pos, format!("`invoke.method` `{other}` is not supported; use GET or POST"));
                None
            }
            None => None,
        },
    };
    let timeout_ms = f.get("timeout_ms").map_or(Some(DEFAULT_TOOL_TIMEOUT_MS), |n| ctx.uint(n, "`invoke.timeout_ms`", 1, MAX_TOOL_TIMEOUT_MS));
    let max_bytes = f.get("max_response_bytes").map_or(Some(DEFAULT_MAX_RESPONSE_BYTES), |n| ctx.uint(n, "`invoke.max_response_bytes`", 1, 64 * 1024 * 1024));
    let query_param = f.get("query_param").map_or(Some("q".to_owned()), |n| ctx.ident(n, "`invoke.query_param`"));
    f.finish(ctx);
    Some(Invoke { url: url?, method: method?, timeout: Duration::from_millis(timeout_ms?), max_response_bytes: max_bytes? as usize, query_param: query_param? })
}

/// `schema` (read from `node`) compiled, or an error at `node` saying why it is no JSON Schema.
fn compiled(ctx: &mut Ctx<'_>, node: &Node, schema: &Json, what: &str) -> Option<Arc<jsonschema::Validator>> {
    match jsonschema::validator_for(schema) {
        Ok(v) => Some(Arc::new(v)),
        Err(e) => {
            ctx.error(node.pos, format!("{what} is not a valid JSON Schema: {e}"));
            None
        }
    }
}

/// A route's `goal_schema`: a JSON Schema of an object (a goal is always one), compiled.
fn goal_schema(ctx: &mut Ctx<'_>, node: &Node, route: &str) -> Option<GoalSchema> {
    let schema = schema(ctx, node, "`goal_schema`")?;
    let object = |t: &Json| t.as_str() == Some("object");
    let ty = schema.get("type");
    if ty.is_some_and(|t| !object(t) && !t.as_array().is_some_and(|a| a.iter().any(object))) {
        ctx.error(node.pos, format!("`goal_schema` of route `{route}` must describe an object (`type: object`): a goal is always a JSON object"));
        return None;
    }
    let validator = compiled(ctx, node, &schema, &format!("`goal_schema` of route `{route}`"))?;
    Some(GoalSchema { schema, validator })
}

fn schema(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<Json> {
    match node.value {
        Value::Map(_) => Some(yaml::to_json(node)),
        ref other => {
            ctx.error(node.pos, format!("{what} must be a JSON Schema object, found {}", other.kind()));
            None
        }
    }
}

pub fn capability(ctx: &mut Ctx<'_>, name: &str, node: &Node, origin: Origin) -> Option<CapabilityDef> {
    let mut f = ctx.map(node, &format!("capability `{name}`"))?;
    let description = opt_string(ctx, f.get("description"), "`description`").unwrap_or_default();
    let input_node = f.get("input_schema");
    let input_schema = input_node.and_then(|n| schema(ctx, n, "`input_schema`"));
    let input_validator = match (&input_schema, input_node) {
        (Some(s), Some(n)) => compiled(ctx, n, s, &format!("`input_schema` of capability `{name}`")),
        _ => None,
    };
    let output = match f.get("output_schema") {
        None => OutputSpec::Text,
        Some(n) => match schema(ctx, n, "`output_schema`") {
            None => OutputSpec::Text,
            Some(s) => match FlatSchema::from_json(&s) {
                Ok(flat) => OutputSpec::Bindable(Arc::new(flat)),
                Err(why) => {
                    ctx.warning(
                        n.pos,
                        format!("`output_schema` of capability `{name}` is not bindable ({why}); model stages using it run as plain text calls"),
                    );
                    OutputSpec::Unbindable { why: why.to_string() }
                }
            },
        },
    };
    let (invoke, mcp, a2a) = match f.get("invoke") {
        Some(n) if super::mcp::is_mcp_invoke(n) => (None, super::mcp::invoke(ctx, n), None),
        Some(n) if super::a2a::is_a2a_invoke(n) => (None, None, super::a2a::invoke(ctx, n)),
        Some(n) => (invoke(ctx, n), None, None),
        None => (None, None, None),
    };
    f.finish(ctx);
    Some(CapabilityDef { origin, description, input_schema, input_validator, output, invoke, mcp, a2a })
}

fn target(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<Target> {
    let name = ctx.ident(node, what)?;
    Some(if name == "end" { Target::End } else { Target::Stage(Ref { name, pos: node.pos }) })
}

fn scalar_json(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<Json> {
    match node.value {
        Value::Seq(_) | Value::Map(_) => {
            ctx.error(node.pos, format!("{what} must be a scalar value"));
            None
        }
        _ => Some(yaml::to_json(node)),
    }
}

fn condition(ctx: &mut Ctx<'_>, node: &Node) -> Option<Condition> {
    let mut f = ctx.map(node, "`when`")?;
    let slot_node = f.require(ctx, "slot");
    let mut ops = Vec::new();
    if let Some(n) = f.get("equals") {
        ops.push((n.pos, scalar_json(ctx, n, "`equals`").map(CondOp::Equals)));
    }
    if let Some(n) = f.get("not_equals") {
        ops.push((n.pos, scalar_json(ctx, n, "`not_equals`").map(CondOp::NotEquals)));
    }
    if let Some(n) = f.get("in") {
        let values = ctx.seq(n, "`in`").map(|items| items.iter().filter_map(|i| scalar_json(ctx, i, "each `in` value")).collect());
        ops.push((n.pos, values.map(CondOp::In)));
    }
    if let Some(n) = f.get("exists") {
        ops.push((n.pos, ctx.bool(n, "`exists`").map(CondOp::Exists)));
    }
    if let Some(n) = f.get("contains") {
        ops.push((n.pos, ctx.string(n, "`contains`").map(CondOp::Contains)));
    }
    f.finish(ctx);
    if ops.len() != 1 {
        ctx.error(node.pos, "`when` needs exactly one test: equals, not_equals, in, exists or contains");
        return None;
    }
    let op = ops.pop()?.1?;
    // `slot: intake.category` tests the `category` field of stage `intake`'s output.
    let slot_text = ctx.string(slot_node?, "`slot`")?;
    let (slot, field) = match slot_text.split_once('.') {
        Some((s, fld)) => (s.to_owned(), Some(fld.to_owned())),
        None => (slot_text.clone(), None),
    };
    if !yaml::is_ident(&slot) || field.as_deref().is_some_and(|f| f.is_empty()) {
        ctx.error(slot_node?.pos, format!("`slot` `{slot_text}` must be `STAGE_ID` or `STAGE_ID.FIELD`"));
        return None;
    }
    Some(Condition { slot: Ref { name: slot, pos: slot_node?.pos }, field, op })
}

fn stage(ctx: &mut Ctx<'_>, workflow: &str, node: &Node) -> Option<StageDef> {
    let mut f = ctx.map(node, &format!("a stage of workflow `{workflow}`"))?;
    let id = f.require(ctx, "id").and_then(|n| ctx.ident(n, "stage `id`"));
    let role = f.require(ctx, "llm_role").and_then(|n| {
        let s = ctx.string(n, "`llm_role`")?;
        let role = LlmRole::parse(&s);
        if role.is_none() {
            ctx.error(
                n.pos,
                format!("unknown llm_role `{s}`; expected one of: none, classify, synthesis, query_formulation (runs of routes using this stage fail)"),
            );
        }
        role
    });
    let capability = f.get("capability").and_then(|n| reference(ctx, n, "`capability`"));
    let kind = match f.get("kind") {
        None => Some(StageKindDef::Task),
        Some(n) => match ctx.string(n, "`kind`").as_deref() {
            Some("task") => Some(StageKindDef::Task),
            Some(spelling @ ("child_run" | "agent")) => {
                if spelling == "agent" {
                    ctx.warning(n.pos, "`kind: agent` is deprecated: write `kind: child_run` (the stage starts a child run of another route)");
                }
                let route = f.get("route");
                match route {
                    Some(r) => reference(ctx, r, "`route`").map(|route| StageKindDef::ChildRun { route }),
                    None => {
                        ctx.error(n.pos, "a `kind: child_run` stage needs `route`: the route its child run starts");
                        None
                    }
                }
            }
            Some(other) => {
                ctx.error(n.pos, format!("unknown stage `kind` `{other}`; expected task or child_run"));
                None
            }
            None => None,
        },
    };
    if matches!(kind, Some(StageKindDef::Task))
        && let Some(r) = f.get("route")
    {
        ctx.error(r.pos, "`route` is only for `kind: child_run` stages");
    }
    if let (Some(StageKindDef::ChildRun { .. }), Some(r)) = (&kind, role)
        && r != LlmRole::None
    {
        ctx.error(node.pos, "a `kind: child_run` stage must have `llm_role: none` (the child run calls the model)");
    }
    let next = f.get("next");
    let branches = f.get("branches");
    let flow = match (next, branches) {
        (Some(n), Some(_)) => {
            ctx.error(n.pos, "a stage has either `next` or `branches`, not both");
            None
        }
        (Some(n), None) => target(ctx, n, "`next`").map(Flow::Next),
        (None, Some(b)) => ctx.seq(b, "`branches`").map(|items| {
            let arms: Vec<BranchDef> = items.iter().filter_map(|item| branch(ctx, item)).collect();
            if items.is_empty() {
                ctx.error(b.pos, "`branches` is empty");
            }
            Flow::Branches(arms)
        }),
        (None, None) => Some(Flow::FallThrough),
    };
    let stream = f.get("stream").and_then(|n| ctx.bool(n, "`stream`"));
    f.finish(ctx);
    Some(StageDef { id: id?, pos: node.pos, role, kind: kind?, capability, flow: flow?, stream })
}

fn branch(ctx: &mut Ctx<'_>, node: &Node) -> Option<BranchDef> {
    let mut f = ctx.map(node, "a branch")?;
    let when = f.get("when").map(|n| condition(ctx, n));
    let goto = f.require(ctx, "goto").and_then(|n| target(ctx, n, "`goto`"));
    f.finish(ctx);
    Some(BranchDef {
        pos: node.pos,
        when: match when {
            None => None,
            Some(c) => Some(c?),
        },
        goto: goto?,
    })
}

pub fn workflow(ctx: &mut Ctx<'_>, name: &str, node: &Node, origin: Origin) -> Option<WorkflowDef> {
    let mut f = ctx.map(node, &format!("workflow `{name}`"))?;
    let stages_node = f.require(ctx, "stages");
    f.get("description");
    f.finish(ctx);
    let items = ctx.seq(stages_node?, "`stages`")?;
    if items.is_empty() {
        ctx.error(stages_node?.pos, format!("workflow `{name}` has no stages"));
    }
    let stages: Vec<StageDef> = items.iter().filter_map(|item| stage(ctx, name, item)).collect();
    let branched = stages.iter().any(|s| !matches!(s.flow, Flow::FallThrough));
    Some(WorkflowDef { origin, stages, branched })
}

pub fn manifest(ctx: &mut Ctx<'_>, name: &str, node: &Node, origin: Origin) -> Option<ManifestDef> {
    let mut f = ctx.map(node, &format!("manifest `{name}`"))?;
    let workflow = f.require(ctx, "workflow").and_then(|n| reference(ctx, n, "`workflow`"));
    let mut synthesis_stage_id = Some("synthesis".to_owned());
    let mut synthesis_capability = None;
    if let Some(n) = f.get("synthesis")
        && let Some(mut s) = ctx.map(n, "`synthesis`")
    {
        if let Some(id) = s.get("id") {
            synthesis_stage_id = ctx.ident(id, "`synthesis.id`");
        }
        synthesis_capability = s.get("capability").and_then(|c| reference(ctx, c, "`synthesis.capability`"));
        s.finish(ctx);
    }
    f.get("description");
    f.finish(ctx);
    Some(ManifestDef { origin, workflow: workflow?, synthesis_stage_id: synthesis_stage_id?, synthesis_capability })
}

pub fn route(ctx: &mut Ctx<'_>, name: &str, node: &Node, origin: Origin) -> Option<RouteDef> {
    let mut f = ctx.map(node, &format!("route `{name}`"))?;
    let description = opt_string(ctx, f.get("description"), "`description`").unwrap_or_default();
    let model_profile = f.require(ctx, "model_profile").and_then(|n| reference(ctx, n, "`model_profile`"));
    let prompt_pack = f.require(ctx, "prompt_pack").and_then(|n| reference(ctx, n, "`prompt_pack`"));
    let activation_target = f.get("activation_target").and_then(|n| ctx.ident(n, "`activation_target`"));
    let max_loop_steps = f.get("max_loop_steps").map_or(Some(DEFAULT_MAX_LOOP_STEPS as u64), |n| ctx.uint(n, "`max_loop_steps`", 1, 1000));
    let priority = f.get("priority").map_or(Some(0), |n| ctx.uint(n, "`priority`", 0, 9));
    let goal_schema = f.get("goal_schema").and_then(|n| goal_schema(ctx, n, name));
    let schedules = f.get("schedules").map(|n| super::schedules::decode(ctx, n, name)).unwrap_or_default();
    let conversation = match f.get("conversation") {
        None => Conversation::None,
        Some(n) => match ctx.string(n, "`conversation`").as_deref() {
            Some("none") | None => Conversation::None,
            Some("session") => Conversation::Session,
            Some(other) => {
                ctx.error(n.pos, format!("`conversation` `{other}` is not one of: none, session"));
                Conversation::None
            }
        },
    };
    let mut bodies = Vec::new();
    if let Some(n) = f.get("workflow") {
        bodies.push((n.pos, reference(ctx, n, "`workflow`").map(RouteBodyDef::Workflow)));
    }
    if let Some(n) = f.get("manifest") {
        bodies.push((n.pos, reference(ctx, n, "`manifest`").map(RouteBodyDef::Manifest)));
    }
    for key in ["decision_loop", "agent"] {
        let Some(n) = f.get(key) else { continue };
        if key == "agent" {
            ctx.warning(n.pos, "route field `agent` is deprecated: write `decision_loop` (the model drives a tool loop)");
        }
        let body = ctx.map(n, &format!("`{key}`")).and_then(|mut a| {
            let tools_from = super::mcp::tools_from(ctx, &mut a, key);
            // With `tools_from`, `tools` may be left out (the server's tools are the list).
            let tools = match a.get("tools") {
                Some(t) => ctx.seq(t, &format!("`{key}.tools`")).map(|items| items.iter().filter_map(|i| reference(ctx, i, "a tool name")).collect::<Vec<_>>()),
                None if tools_from.is_some() => Some(Vec::new()),
                None => a.require(ctx, "tools").and(None),
            };
            let stream = a.get("stream").and_then(|n| ctx.bool(n, &format!("`{key}.stream`")));
            a.finish(ctx);
            tools.map(|tools| RouteBodyDef::DecisionLoop { tools, tools_from, stream })
        });
        bodies.push((n.pos, body));
    }
    f.finish(ctx);
    let body = match bodies.len() {
        0 => {
            ctx.error(origin.pos, format!("route `{name}` needs one of `workflow`, `manifest` or `decision_loop`"));
            None
        }
        1 => bodies.pop().and_then(|(_, b)| b),
        _ => {
            ctx.error(bodies[1].0, format!("route `{name}` has more than one of `workflow`, `manifest` and `decision_loop`; pick one"));
            None
        }
    };
    Some(RouteDef {
        origin,
        description,
        model_profile,
        prompt_pack,
        activation_target,
        max_loop_steps: max_loop_steps.unwrap_or(DEFAULT_MAX_LOOP_STEPS as u64) as u32,
        priority: priority.unwrap_or(0) as u8,
        conversation,
        goal_schema,
        body,
        schedules,
    })
}
