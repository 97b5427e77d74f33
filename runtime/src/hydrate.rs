//! Hydration: a route definition becomes a graph of stamped nodes (role + resolved prompt).
//!
//! Routes are hydrated once, at load; runs only walk the graph. The four prompt resolution
//! paths of the spec live in [`crate::prompt`]; this module decides which one each node takes.

use std::fmt::Write as _;
use std::sync::Arc;

use petgraph::graph::{DiGraph, NodeIndex};
use petgraph::visit::EdgeRef;

use crate::defs::LlmRole;
use crate::defs::*;
use crate::diag::{Diagnostic, Diagnostics};
use crate::loader::{Defs, known_names as names, successors};
use crate::prompt::{PromptPack, ResolvedPrompt};
use crate::vocab::OutputSpec;

mod mcp;

/// Which resolution path built the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoutePath {
    /// A workflow with no `next`/`branches`.
    Workflow,
    Branched,
    /// A manifest over a linear workflow, with a synthesis node appended.
    Manifest,
    /// The decision loop, the autonomous mode (`pattern1` on the wire).
    DecisionLoop,
}

impl RoutePath {
    pub fn as_str(self) -> &'static str {
        match self {
            RoutePath::Workflow => "workflow",
            RoutePath::Branched => "branched",
            RoutePath::Manifest => "manifest",
            RoutePath::DecisionLoop => "pattern1",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeKind {
    /// A workflow stage: a model call (its reply is the slot), or with `llm_role: none` a tool
    /// call or the prefetch pack.
    Stage,
    /// A workflow stage with `llm_role: query_formulation`: the model writes a query, which its
    /// capability's HTTP tool gets as the `query` field (`invoke.query_param`); the tool's answer
    /// is the slot (the reply is, when the capability has no tool). Shown as a workflow stage.
    QueryFormulation,
    /// A `kind: child_run` stage: runs a child route.
    ChildRun { route: String },
    /// The synthesis node a manifest appends.
    AppendedSynthesis,
    /// The model's turn in the decision loop.
    Decision,
    /// A tool the decision loop may call (`llm_role = none`).
    Tool,
    /// Where a workflow run completes.
    End,
}

/// A capability as a node uses it.
#[derive(Debug, Clone)]
pub struct BoundCapability {
    pub name: String,
    pub def: Arc<CapabilityDef>,
}

/// A node of a route's graph. Only hydration makes one, so its role, prompt and output
/// contract are always the ones the catalogue resolved.
#[derive(Debug, Clone)]
pub struct StageNode {
    /// Shared, not copied, by every run that names the stage (its slot, its model calls).
    id: Arc<str>,
    role: LlmRole,
    kind: NodeKind,
    capability: Option<BoundCapability>,
    prompt: ResolvedPrompt,
    /// What a model call of this node must return.
    output: OutputSpec,
    /// A branch condition reads a field of this stage's structured output (`slot: id.field`):
    /// only then does a run keep that output beside the slot.
    fields_read: bool,
    /// Whether its model calls stream their text (`stream:`; by default a synthesis and the
    /// decision loop's decisions stream).
    streams: bool,
}

impl StageNode {
    fn new(id: String, role: LlmRole, kind: NodeKind, capability: Option<BoundCapability>, prompt: ResolvedPrompt) -> StageNode {
        let output = capability.as_ref().map_or(OutputSpec::Text, |c| c.def.output.clone());
        let streams = role == LlmRole::Synthesis || kind == NodeKind::Decision;
        StageNode { id: id.into(), role, kind, capability, prompt, output, fields_read: false, streams }
    }

    /// Whether its model calls stream their text as it is written (`run.llm.delta`).
    pub fn streams(&self) -> bool {
        self.streams
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// The id as a run keeps it (a reference count, not a copy).
    pub fn shared_id(&self) -> &Arc<str> {
        &self.id
    }

    /// Whether a branch condition reads a field of this stage's structured output.
    pub fn fields_read(&self) -> bool {
        self.fields_read
    }

    pub fn role(&self) -> LlmRole {
        self.role
    }

    pub fn kind(&self) -> &NodeKind {
        &self.kind
    }

    pub fn capability(&self) -> Option<&BoundCapability> {
        self.capability.as_ref()
    }

    /// The A2A agent this stage calls: a decision loop's tool, or a workflow's `llm_role: none`
    /// stage whose capability is an agent. Such a stage may ask the run's user the agent's question.
    pub fn agent(&self) -> Option<&A2aInvoke> {
        let calls = self.kind == NodeKind::Tool || (self.kind == NodeKind::Stage && self.role == LlmRole::None);
        self.capability.as_ref().filter(|_| calls).and_then(|c| c.def.a2a.as_ref())
    }

    pub fn prompt(&self) -> &ResolvedPrompt {
        &self.prompt
    }

    pub fn output(&self) -> &OutputSpec {
        &self.output
    }

    /// The role events and views show: the catalogue's `llm_role`, except for the decision
    /// node of a decision-loop route, which calls the model as `decision`.
    pub fn role_name(&self) -> &'static str {
        if self.kind == NodeKind::Decision { "decision" } else { self.role.as_str() }
    }
}

/// An edge; at run time the first edge (by `order`) whose condition holds is taken.
#[derive(Debug, Clone)]
pub struct Edge {
    pub order: u16,
    pub when: Option<Condition>,
}

/// A hydrated, runnable route. Only [`build`] makes one; its fields are read through methods,
/// so nothing downstream can make a route that hydration did not check.
#[derive(Debug)]
pub struct Route {
    id: Arc<str>,
    description: String,
    model_profile: String,
    activation_target: Option<String>,
    max_loop_steps: u32,
    priority: u8,
    conversation: Conversation,
    goal_schema: Option<GoalSchema>,
    /// Its declared schedules (`schedules:`), as the loader checked them.
    schedules: Vec<crate::defs::DeclaredSchedule>,
    pack: Arc<PromptPack>,
    path: RoutePath,
    /// The workflow (or manifest) the route runs, for display and events.
    source: Option<String>,
    graph: DiGraph<StageNode, Edge>,
    entry: NodeIndex,
}

impl Route {
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The id as a run keeps it (a reference count, not a copy).
    pub fn shared_id(&self) -> &Arc<str> {
        &self.id
    }

    pub fn description(&self) -> &str {
        &self.description
    }

    /// The JSON Schema a start's goal must match (`goal_schema`), if the route has one.
    pub fn goal_schema(&self) -> Option<&serde_json::Value> {
        self.goal_schema.as_ref().map(|g| &g.schema)
    }

    /// What is wrong with `goal` under the route's `goal_schema` (empty: it matches, or the
    /// route has none).
    pub fn goal_problems(&self, goal: &serde_json::Map<String, serde_json::Value>) -> Vec<String> {
        match &self.goal_schema {
            Some(g) => crate::defs::schema_problems(&g.validator, &serde_json::Value::Object(goal.clone())),
            None => Vec::new(),
        }
    }

    /// The schedules the route declares (`schedules:`), kept in the run store by the service.
    pub fn schedules(&self) -> &[crate::defs::DeclaredSchedule] {
        &self.schedules
    }

    pub fn model_profile(&self) -> &str {
        &self.model_profile
    }

    /// The fleet that serves the route, if it names one.
    pub fn activation_target(&self) -> Option<&str> {
        self.activation_target.as_deref()
    }

    pub fn max_loop_steps(&self) -> u32 {
        self.max_loop_steps
    }

    /// At a model's gate: 0 to 9, higher first.
    pub fn priority(&self) -> u8 {
        self.priority
    }

    pub fn conversation(&self) -> Conversation {
        self.conversation
    }

    pub fn pack(&self) -> &PromptPack {
        &self.pack
    }

    pub fn path(&self) -> RoutePath {
        self.path
    }

    pub fn source(&self) -> Option<&str> {
        self.source.as_deref()
    }

    pub fn graph(&self) -> &DiGraph<StageNode, Edge> {
        &self.graph
    }

    pub fn entry(&self) -> NodeIndex {
        self.entry
    }

    /// The node runs start at (the decision node of a decision-loop route).
    pub fn entry_node(&self) -> &StageNode {
        &self.graph[self.entry]
    }

    pub fn node(&self, idx: NodeIndex) -> &StageNode {
        &self.graph[idx]
    }

    /// The tools of a decision-loop route: its tool nodes, the one list the decision schema, the
    /// prompt's tool list and the start checks are all made from.
    pub fn tools(&self) -> impl Iterator<Item = &BoundCapability> {
        self.graph.node_weights().filter(|n| n.kind == NodeKind::Tool).filter_map(|n| n.capability.as_ref())
    }

    /// The tool node called `name`, if the route has one.
    pub fn tool_node(&self, name: &str) -> Option<&StageNode> {
        self.graph.node_weights().find(|n| n.kind == NodeKind::Tool && &*n.id == name)
    }

    /// Where to go after `node`: the first edge (by `order`) whose condition holds.
    pub fn next_step(&self, node: NodeIndex, holds: impl Fn(&Condition) -> bool) -> NextStep {
        let mut best: Option<(u16, NodeIndex)> = None;
        let mut has_edges = false;
        for e in self.graph.edges(node) {
            has_edges = true;
            let w = e.weight();
            if best.is_some_and(|(o, _)| o < w.order) {
                continue;
            }
            if w.when.as_ref().is_none_or(&holds) {
                best = Some((w.order, e.target()));
            }
        }
        match best {
            Some((_, t)) if self.graph[t].kind == NodeKind::End => NextStep::End,
            Some((_, t)) => NextStep::Go(t),
            None if has_edges => NextStep::NoMatch,
            None => NextStep::End,
        }
    }

    /// Whether a run of this route can ask its user, and so be continued by a reply: a decision
    /// loop's model may always ask; a workflow asks only at a stage calling an agent that asks.
    pub fn can_ask(&self) -> bool {
        self.path == RoutePath::DecisionLoop || self.graph.node_weights().any(|n| n.agent().is_some())
    }

    /// Nodes in the order they were listed (the end marker last).
    pub fn nodes(&self) -> impl Iterator<Item = (NodeIndex, &StageNode)> {
        self.graph.node_indices().map(|i| (i, &self.graph[i]))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NextStep {
    Go(NodeIndex),
    End,
    /// Conditional branches only, and none held.
    NoMatch,
}

fn resolve_cap(defs: &Defs, r: &Ref) -> Option<BoundCapability> {
    match defs.capabilities.get(&r.name)? {
        Ok(def) => Some(BoundCapability { name: r.name.clone(), def: def.clone() }),
        Err(_) => None,
    }
}

fn end_node() -> StageNode {
    StageNode::new("end".into(), LlmRole::None, NodeKind::End, None, ResolvedPrompt::none())
}

/// Builds one route. Problems of the route itself go to `diags`; problems it inherits from
/// broken definitions it uses are returned (they are already in `diags` where they belong).
/// `listings` are the MCP servers' tool lists (see [`McpListings`]), when connected.
pub fn build(id: &str, def: &RouteDef, defs: &Defs, listings: Option<&McpListings>, diags: &mut Diagnostics) -> Result<Route, Vec<Diagnostic>> {
    let path = def.origin.path.as_path();
    let mut inherited: Vec<Diagnostic> = Vec::new();
    let mut broken = def.origin.is_broken();
    if let Some(p) = &def.model_profile {
        match defs.profiles.get(&p.name) {
            None => {
                diags.error(path, p.pos, format!("model_profile `{}` is not defined (profiles: {})", p.name, names(defs.profiles.keys())));
                broken = true;
            }
            Some(Err(o)) => inherited.extend(o.problems.iter().cloned()),
            Some(Ok(prof)) => inherited.extend(prof.origin.problems.iter().filter(|d| d.is_error()).cloned()),
        }
    }
    let pack = match &def.prompt_pack {
        None => None,
        Some(p) => match defs.packs.get(&p.name) {
            None => {
                diags.error(path, p.pos, format!("prompt pack `{}` is not defined (packs: {})", p.name, names(defs.packs.keys())));
                broken = true;
                None
            }
            Some(None) => {
                diags.error(path, p.pos, format!("prompt pack `{}` has errors", p.name));
                broken = true;
                None
            }
            Some(Some(pack)) => Some(pack.clone()),
        },
    };
    let mut graph: DiGraph<StageNode, Edge> = DiGraph::new();
    let mut tools = Vec::new();
    // Without its pack the route cannot be built, but its body is still checked so that every
    // problem in its way is reported (and counted) at once, not only the first.
    let pack_ref = pack.as_deref();
    let (route_path, source) = match &def.body {
        Some(RouteBodyDef::Workflow(w)) => match defs.workflows.get(&w.name) {
            None => {
                diags.error(path, w.pos, format!("workflow `{}` is not defined (workflows: {})", w.name, names(defs.workflows.keys())));
                return Err(inherited);
            }
            Some(Err(o)) => {
                inherited.extend(o.problems.iter().cloned());
                return Err(inherited);
            }
            Some(Ok(wf)) => {
                inherited.extend(wf.origin.problems.iter().filter(|d| d.is_error()).cloned());
                add_workflow(&mut graph, wf, defs, |role| pack_ref.map_or_else(ResolvedPrompt::none, |p| p.resolve_workflow_stage(role)));
                (if wf.branched { RoutePath::Branched } else { RoutePath::Workflow }, Some(w.name.clone()))
            }
        },
        Some(RouteBodyDef::Manifest(m)) => match defs.manifests.get(&m.name) {
            None => {
                diags.error(path, m.pos, format!("manifest `{}` is not defined (manifests: {})", m.name, names(defs.manifests.keys())));
                return Err(inherited);
            }
            Some(Err(o)) => {
                inherited.extend(o.problems.iter().cloned());
                return Err(inherited);
            }
            Some(Ok(man)) => {
                inherited.extend(man.origin.problems.iter().filter(|d| d.is_error()).cloned());
                let Some(Ok(wf)) = defs.workflows.get(&man.workflow.name) else { return Err(inherited) };
                if !inherited.is_empty() {
                    return Err(inherited);
                }
                let end = add_workflow(&mut graph, wf, defs, |role| pack_ref.map_or_else(ResolvedPrompt::none, |p| p.resolve_manifest_stage(role)));
                // The appended node takes the place of the end: every stage that ended now leads to it.
                let synth = graph.add_node(StageNode::new(
                    man.synthesis_stage_id.clone(),
                    LlmRole::Synthesis,
                    NodeKind::AppendedSynthesis,
                    man.synthesis_capability.as_ref().and_then(|c| resolve_cap(defs, c)),
                    pack_ref.map_or_else(ResolvedPrompt::none, PromptPack::resolve_appended_synthesis),
                ));
                let mut into_end: Vec<_> = graph.edges_directed(end, petgraph::Direction::Incoming).map(|e| (e.id(), e.source(), e.weight().clone())).collect();
                // `remove_edge` moves the last edge into the freed index: remove from the highest down.
                into_end.sort_by_key(|(eid, _, _)| std::cmp::Reverse(eid.index()));
                for (eid, from, w) in into_end {
                    graph.remove_edge(eid);
                    graph.add_edge(from, synth, w);
                }
                graph.add_edge(synth, end, Edge { order: 0, when: None });
                (RoutePath::Manifest, Some(m.name.clone()))
            }
        },
        Some(RouteBodyDef::DecisionLoop { tools: tool_refs, tools_from, stream }) => {
            for t in tool_refs {
                match defs.capabilities.get(&t.name) {
                    None => {
                        diags.error(path, t.pos, format!("tool `{}` is not a defined capability (capabilities: {})", t.name, names(defs.capabilities.keys())));
                        broken = true;
                    }
                    Some(Err(o)) => inherited.extend(o.problems.iter().cloned()),
                    Some(Ok(c)) => {
                        inherited.extend(c.origin.problems.iter().filter(|d| d.is_error()).cloned());
                        let Some(c) = mcp::bind(defs, listings, c, diags, &mut inherited) else {
                            broken = true;
                            continue;
                        };
                        // An MCP tool's schema comes from its server (unknown until connected).
                        if c.input_schema.is_none() && (c.mcp.is_none() || listings.is_some()) {
                            diags.error(
                                path,
                                t.pos,
                                format!("tool `{}` needs an `input_schema`: the model is shown it and arguments are checked against it", t.name),
                            );
                            broken = true;
                        }
                        tools.push(BoundCapability { name: t.name.clone(), def: c });
                    }
                }
            }
            if let Some(from) = tools_from {
                match mcp::tools_from(defs, listings, from, path, diags, &mut inherited) {
                    Some(more) => {
                        for t in more {
                            if tools.iter().any(|have| have.name == t.name) {
                                diags.error(
                                    path,
                                    from.server.pos,
                                    format!("tool `{}` of MCP server `{}` is listed twice; a route's tool names are one list", t.name, from.server.name),
                                );
                                broken = true;
                            } else {
                                tools.push(t);
                            }
                        }
                    }
                    None => broken = true,
                }
            }
            let prompt = pack_ref.map_or_else(ResolvedPrompt::none, |p| p.resolve_agent(&tools_text(&tools)));
            let mut decide_node = StageNode::new("decide".into(), LlmRole::None, NodeKind::Decision, None, prompt);
            // The schema's tool enum, the prompt's tool list and the tool nodes come from one list.
            decide_node.output = OutputSpec::Decision(Arc::new(crate::decision::DecisionSpec::new(tools.iter().map(|t| t.name.clone()).collect())));
            decide_node.streams = stream.unwrap_or(true);
            let decide = graph.add_node(decide_node);
            for (order, tool) in tools.iter().enumerate() {
                let n = graph.add_node(StageNode::new(tool.name.clone(), LlmRole::None, NodeKind::Tool, Some(tool.clone()), ResolvedPrompt::none()));
                graph.add_edge(decide, n, Edge { order: order as u16, when: None });
                graph.add_edge(n, decide, Edge { order: 0, when: None });
            }
            (RoutePath::DecisionLoop, None)
        }
        None => return Err(inherited),
    };
    // A workflow stage's MCP tool: its server and tool checked against the listing.
    for n in graph.node_indices() {
        let Some(cap) = graph[n].capability.clone().filter(|c| c.def.mcp.is_some() && graph[n].kind != NodeKind::Tool) else { continue };
        match mcp::bind(defs, listings, &cap.def, diags, &mut inherited) {
            Some(def) => graph[n].capability = Some(BoundCapability { name: cap.name, def }),
            None => broken = true,
        }
    }
    if broken || !inherited.is_empty() {
        return Err(inherited);
    }
    let Some(pack) = pack else { return Err(inherited) };
    // Which stages' structured outputs a condition reads a field of (most routes: none).
    let read: Vec<String> = graph.edge_weights().filter_map(|e| e.when.as_ref()).filter(|c| c.field.is_some()).map(|c| c.slot.name.clone()).collect();
    for node in graph.node_weights_mut() {
        node.fields_read = read.iter().any(|r| **r == *node.id);
    }
    Ok(Route {
        id: id.into(),
        description: def.description.clone(),
        model_profile: def.model_profile.as_ref().map(|p| p.name.clone()).unwrap_or_default(),
        activation_target: def.activation_target.clone(),
        max_loop_steps: def.max_loop_steps,
        priority: def.priority,
        conversation: def.conversation,
        goal_schema: def.goal_schema.clone(),
        schedules: def.schedules.clone(),
        pack,
        path: route_path,
        source,
        entry: NodeIndex::new(0),
        graph,
    })
}

/// Adds a workflow's stages (in listed order, so the first is node 0) and an end node.
fn add_workflow(graph: &mut DiGraph<StageNode, Edge>, wf: &WorkflowDef, defs: &Defs, resolve: impl Fn(LlmRole) -> ResolvedPrompt) -> NodeIndex {
    let nodes: Vec<NodeIndex> = wf
        .stages
        .iter()
        .map(|s| {
            let role = s.role.unwrap_or(LlmRole::None);
            let kind = match &s.kind {
                StageKindDef::Task if role == LlmRole::QueryFormulation => NodeKind::QueryFormulation,
                StageKindDef::Task => NodeKind::Stage,
                StageKindDef::ChildRun { route } => NodeKind::ChildRun { route: route.name.clone() },
            };
            let mut node = StageNode::new(s.id.clone(), role, kind, s.capability.as_ref().and_then(|c| resolve_cap(defs, c)), resolve(role));
            node.streams = s.stream.unwrap_or(node.streams);
            graph.add_node(node)
        })
        .collect();
    let end = graph.add_node(end_node());
    for (idx, targets) in successors(wf).iter().enumerate() {
        let conds: Vec<Option<Condition>> = match &wf.stages[idx].flow {
            Flow::Branches(arms) => arms.iter().map(|a| a.when.clone()).collect(),
            _ => vec![None],
        };
        for (order, (target, when)) in targets.iter().zip(conds).enumerate() {
            let to = target.map_or(end, |t| nodes[t]);
            graph.add_edge(nodes[idx], to, Edge { order: order as u16, when });
        }
    }
    end
}

/// The tool list shown to the model in the decision loop: name, description, input schema.
pub fn tools_text(tools: &[BoundCapability]) -> String {
    let mut out = String::new();
    for t in tools {
        let _ = write!(out, "- {}", t.name);
        if !t.def.description.is_empty() {
            let _ = write!(out, ": {}", t.def.description.trim());
        }
        let schema = t.def.input_schema.as_ref().map(|s| s.to_string()).unwrap_or_else(|| "{}".into());
        let _ = writeln!(out, "\n  input schema: {schema}");
    }
    out.trim_end().to_owned()
}

// ---- rendering for `fabric hydrate` ----

/// An edge's condition as the views show it (`intake.urgency == high`); empty when it has none.
pub fn edge_label(e: &Edge) -> String {
    match &e.when {
        None => String::new(),
        Some(c) => {
            let slot = match &c.field {
                Some(f) => format!("{}.{f}", c.slot.name),
                None => c.slot.name.clone(),
            };
            match &c.op {
                CondOp::Equals(v) => format!("{slot} == {v}"),
                CondOp::NotEquals(v) => format!("{slot} != {v}"),
                CondOp::In(vs) => format!("{slot} in {}", serde_json::Value::Array(vs.clone())),
                CondOp::Exists(b) => format!("{slot} {}", if *b { "exists" } else { "is absent" }),
                CondOp::Contains(s) => format!("{slot} contains {}", serde_json::Value::String(s.clone())),
            }
        }
    }
}

fn node_detail(n: &StageNode) -> String {
    let mut parts = vec![format!("llm_role={}", n.role_name())];
    match &n.kind {
        NodeKind::ChildRun { route } => parts.push(format!("kind=child_run route={route}")),
        NodeKind::AppendedSynthesis => parts.push("appended".into()),
        NodeKind::Decision => parts.push("decision".into()),
        NodeKind::Tool => parts.push("tool".into()),
        NodeKind::Stage | NodeKind::QueryFormulation | NodeKind::End => {}
    }
    if let Some(c) = &n.capability {
        let out = match &c.def.output {
            OutputSpec::Text => "text".to_owned(),
            OutputSpec::Bindable(s) => format!("structured: {}", s.fields().iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")),
            OutputSpec::Unbindable { .. } => "text (schema not bindable)".to_owned(),
            OutputSpec::Decision(_) => "decision".to_owned(),
        };
        parts.push(format!("capability={} ({out})", c.name));
        if let Some(inv) = &c.def.invoke {
            parts.push(format!("invoke={} {}", inv.method.as_str(), inv.url.raw));
        }
        if let Some(m) = &c.def.mcp {
            parts.push(format!("invoke=mcp {}/{}", m.server.name, m.tool.name));
        }
        if let Some(a) = &c.def.a2a {
            parts.push(format!("invoke=a2a {} skill={}", a.url.raw, a.skill));
        }
    }
    parts.join(" ")
}

fn sorted_edges(route: &Route, n: NodeIndex) -> Vec<(u16, NodeIndex, String)> {
    let mut v: Vec<_> = route.graph.edges(n).map(|e| (e.weight().order, e.target(), edge_label(e.weight()))).collect();
    v.sort_by_key(|(o, t, _)| (*o, t.index()));
    v
}

/// The edges of `n` in run order, as the pictures (DOT, Mermaid, SVG) label them: the
/// unconditioned arm of a node that branches is its `otherwise`; the text view keeps the bare edge.
pub fn picture_edges(route: &Route, n: NodeIndex) -> Vec<(u16, NodeIndex, String)> {
    let mut v = sorted_edges(route, n);
    if v.iter().any(|(_, _, l)| !l.is_empty()) {
        for (_, _, l) in v.iter_mut().filter(|(_, _, l)| l.is_empty()) {
            *l = "otherwise".into();
        }
    }
    v
}

/// Plain-text view: every node with its role, resolved prompt and outgoing edges.
pub fn render_text(route: &Route) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "route {} ({} path{})", route.id, route.path.as_str(), route.source.as_ref().map(|s| format!(", {s}")).unwrap_or_default());
    let _ = writeln!(
        out,
        "model_profile: {}  prompt_pack: {}  activation_target: {}  max_loop_steps: {}",
        route.model_profile,
        route.pack.name(),
        route.activation_target.as_deref().unwrap_or("(any fleet)"),
        route.max_loop_steps
    );
    for (number, (idx, node)) in route.nodes().filter(|(_, n)| n.kind != NodeKind::End).enumerate() {
        let _ = writeln!(out, "\n[{number}] {}  {}", node.id, node_detail(node));
        if node.role.calls_model() || node.kind == NodeKind::Decision {
            let _ = writeln!(out, "    prompt ({}):", node.prompt.source.as_str());
            for line in node.prompt.system_text().lines() {
                let _ = writeln!(out, "      | {line}");
            }
        }
        for (_, target, label) in sorted_edges(route, idx) {
            let when = if label.is_empty() { String::new() } else { format!("  when {label}") };
            let _ = writeln!(out, "    -> {}{when}", route.graph[target].id);
        }
    }
    out
}

fn quote(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

pub fn render_dot(route: &Route) -> String {
    let mut out = format!("digraph \"{}\" {{\n  rankdir=TB;\n  node [shape=box, fontname=\"monospace\"];\n", quote(&route.id));
    for (idx, node) in route.nodes() {
        let shape = if node.kind == NodeKind::End { ", shape=doublecircle" } else { "" };
        let label = if node.kind == NodeKind::End {
            "end".to_owned()
        } else {
            format!("{}\\n{}\\nprompt: {}", quote(&node.id), node.role_name(), node.prompt.source.as_str())
        };
        let _ = writeln!(out, "  n{} [label=\"{label}\"{shape}];", idx.index());
    }
    for (idx, _) in route.nodes() {
        for (_, target, label) in picture_edges(route, idx) {
            let _ = writeln!(out, "  n{} -> n{} [label=\"{}\"];", idx.index(), target.index(), quote(&label));
        }
    }
    out.push_str("}\n");
    out
}

pub fn render_mermaid(route: &Route) -> String {
    let mut out = String::from("flowchart TD\n");
    let esc = |s: &str| s.replace('"', "#quot;");
    for (idx, node) in route.nodes() {
        if node.kind == NodeKind::End {
            let _ = writeln!(out, "  n{}((end))", idx.index());
        } else {
            let _ = writeln!(out, "  n{}[\"{}<br/>{}<br/>prompt: {}\"]", idx.index(), esc(&node.id), node.role_name(), node.prompt.source.as_str());
        }
    }
    for (idx, _) in route.nodes() {
        for (_, target, label) in picture_edges(route, idx) {
            if label.is_empty() {
                let _ = writeln!(out, "  n{} --> n{}", idx.index(), target.index());
            } else {
                let _ = writeln!(out, "  n{} -->|\"{}\"| n{}", idx.index(), esc(&label), target.index());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::{RouteEntry, SourceFile, load_from_texts};

    fn route(yaml: &str, id: &str) -> Arc<Route> {
        let files = [SourceFile { path: "t/c.yaml".into(), text: format!("profiles: {{p: {{}}}}\n{yaml}") }];
        let packs = [SourceFile { path: "t/pack.yaml".into(), text: "host: HOST\nroles: {classify: 'CLASSIFY {{host}}'}\nsynthesis: SYNTH\n".into() }];
        let cat = load_from_texts(&files, &packs);
        match cat.get(id) {
            Some(RouteEntry::Ready(r)) => r.clone(),
            other => panic!("{other:?}: {:?}", cat.diagnostics()),
        }
    }

    const CAPS: &str = "capabilities:\n  c: {output_schema: {type: object, properties: {u: {type: string}}}}\n  t: {input_schema: {type: object}, invoke: {url: 'http://x/t'}}\n";

    #[test]
    fn a_manifest_ends_in_its_appended_synthesis() {
        let r = route(
            &format!(
                "{CAPS}workflows:\n  w: {{stages: [{{id: a, llm_role: classify, capability: c}}, {{id: b, llm_role: synthesis}}]}}\nmanifests:\n  m: {{workflow: w}}\nroutes:\n  r: {{model_profile: p, prompt_pack: pack, manifest: m}}\n"
            ),
            "r",
        );
        assert_eq!(r.path(), RoutePath::Manifest);
        let order: Vec<&str> = r.nodes().map(|(_, n)| n.id()).collect();
        assert_eq!(order, ["a", "b", "end", "synthesis"]);
        let NextStep::Go(after_b) = r.next_step(NodeIndex::new(1), |_| true) else { panic!() };
        assert_eq!(r.node(after_b).kind(), &NodeKind::AppendedSynthesis);
        assert_eq!(r.node(after_b).prompt().text, "SYNTH", "the synthesis template");
        // Manifest stages take the role template only: `b` has none, so it is empty.
        assert_eq!(r.node(NodeIndex::new(1)).prompt().source, crate::prompt::PromptSource::Empty);
        assert_eq!(r.next_step(after_b, |_| true), NextStep::End);
    }

    #[test]
    fn branches_are_taken_in_order_and_no_match_is_reported() {
        let r = route(
            &format!(
                "{CAPS}workflows:\n  w:\n    stages:\n      - {{id: a, llm_role: classify, capability: c, branches: [{{when: {{slot: a.u, equals: x}}, goto: b}}, {{when: {{slot: a.u, equals: y}}, goto: end}}]}}\n      - {{id: b, llm_role: classify, capability: c}}\nroutes:\n  r: {{model_profile: p, prompt_pack: pack, workflow: w}}\n"
            ),
            "r",
        );
        let a = r.entry();
        assert_eq!(r.next_step(a, |c| c.op == CondOp::Equals("x".into())), NextStep::Go(NodeIndex::new(1)));
        assert_eq!(r.next_step(a, |c| c.op == CondOp::Equals("y".into())), NextStep::End);
        assert_eq!(r.next_step(a, |_| false), NextStep::NoMatch);
        assert_eq!(r.entry_node().prompt().text, "CLASSIFY HOST");
    }

    #[test]
    fn a_route_priority_is_0_to_9_and_0_by_default() {
        let yaml = |extra: &str| format!("{CAPS}routes:\n  r: {{model_profile: p, prompt_pack: pack, decision_loop: {{tools: [t]}}{extra}}}\n");
        assert_eq!(route(&yaml(""), "r").priority(), 0);
        assert_eq!(route(&yaml(", priority: 9"), "r").priority(), 9);
        for bad in ["10", "-1", "high"] {
            let files = [SourceFile { path: "t/c.yaml".into(), text: format!("profiles: {{p: {{}}}}\n{}", yaml(&format!(", priority: {bad}"))) }];
            let packs = [SourceFile { path: "t/pack.yaml".into(), text: "host: HOST\nagent: A\n".into() }];
            let cat = load_from_texts(&files, &packs);
            assert!(cat.diagnostics().iter().any(|d| d.message.contains("`priority`")), "{bad}: {:?}", cat.diagnostics());
        }
    }

    #[test]
    fn a_decision_loop_has_one_list_of_tools() {
        let r = route(&format!("{CAPS}routes:\n  r: {{model_profile: p, prompt_pack: pack, decision_loop: {{tools: [t]}}}}\n"), "r");
        assert_eq!(r.path(), RoutePath::DecisionLoop);
        assert_eq!(r.tools().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["t"]);
        assert!(r.tool_node("t").is_some() && r.tool_node("c").is_none());
        let OutputSpec::Decision(spec) = r.entry_node().output() else { panic!("the entry decides") };
        assert_eq!(spec.tools(), ["t"]);
        assert_eq!(r.entry_node().role_name(), "decision");
        assert!(r.entry_node().prompt().text.contains("- t\n  input schema: {\"type\":\"object\"}"), "{}", r.entry_node().prompt().text);
        assert!(r.entry_node().streams(), "decisions stream unless told not to");
        let quiet = route(&format!("{CAPS}routes:\n  r: {{model_profile: p, prompt_pack: pack, decision_loop: {{tools: [t], stream: false}}}}\n"), "r");
        assert!(!quiet.entry_node().streams());
    }

    #[test]
    fn a_query_formulation_is_a_node_kind_of_its_own_shown_as_a_workflow_stage() {
        let caps = "capabilities:\n  q: {output_schema: {type: object, properties: {query: {type: string}}}, invoke: {url: 'http://x/q'}}\n";
        let r = route(
            &format!(
                "{caps}workflows:\n  w: {{stages: [{{id: a, llm_role: query_formulation, capability: q}}, {{id: b, llm_role: synthesis}}]}}\nroutes:\n  r: {{model_profile: p, prompt_pack: pack, workflow: w}}\n"
            ),
            "r",
        );
        let kinds: Vec<&NodeKind> = r.nodes().map(|(_, n)| n.kind()).collect();
        assert_eq!(kinds, [&NodeKind::QueryFormulation, &NodeKind::Stage, &NodeKind::End]);
        assert!(
            node_detail(r.entry_node()).starts_with("llm_role=query_formulation capability=q ("),
            "shown as a workflow stage: {}",
            node_detail(r.entry_node())
        );
    }
}
