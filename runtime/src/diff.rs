//! What changed between two catalogues, route by route and stage by stage: what a roll-out
//! would change (`fabric routes diff OLD NEW`). Both sides are hydrated, so the diff compares
//! what runs would see, not the YAML that spells it: a prompt pack edit shows at every stage
//! whose resolved prompt it changes, a capability edit at every stage bound to it, and a
//! definition moved to another file changes nothing. Stages are matched by id; a stage's parts
//! as the diff shows them are in `diff/views.rs`, the text view in `diff/text.rs`.

use std::collections::BTreeSet;

use petgraph::graph::NodeIndex;
use petgraph::visit::EdgeRef;
use serde::Serialize;
use serde_json::Value;

use crate::catalogue::{BrokenRoute, Catalogue, RouteEntry};
use crate::defs::LlmRole;
use crate::hydrate::{self, NodeKind, Route, StageNode};
use crate::prompt::PromptSource;
use crate::redact::redact_url;

mod text;
mod views;

pub use views::{AgentView, EdgeView, InvokeView, Output, StageKind};
use views::{role_name, source_name};

/// Every route that differs between two catalogues, by route id.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CatalogueDiff {
    pub routes: Vec<RouteDiff>,
}

impl CatalogueDiff {
    /// No route differs: the catalogues run the same.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteDiff {
    pub route: String,
    #[serde(flatten)]
    pub change: RouteChange,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum RouteChange {
    /// Only in the new catalogue; `broken` when it cannot run there.
    Added {
        broken: Option<Problems>,
    },
    /// Only in the old catalogue; `broken` when it could not run there either.
    Removed {
        broken: Option<Problems>,
    },
    BecameBroken {
        problems: Problems,
    },
    BecameReady,
    /// Broken on both sides, for other reasons: a broken route has no graph to compare.
    StillBroken {
        problems: Problems,
    },
    /// Ready on both sides, and something a run would see differs.
    Changed {
        settings: Vec<SettingChange>,
        stages: Vec<StageDiff>,
    },
}

/// Why a route cannot run, in short: how many problems, and the first (`path:line:col: message`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Problems {
    pub count: usize,
    pub first: Option<String>,
}

impl Problems {
    fn of(broken: &BrokenRoute) -> Problems {
        Problems { count: broken.problems.len(), first: broken.problems.first().map(ToString::to_string) }
    }
}

/// A route setting that differs; the values as JSON (`null` where the route sets none).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SettingChange {
    pub setting: Setting,
    pub old: Value,
    pub new: Value,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Setting {
    ModelProfile,
    /// The resolution path (`workflow`, `branched`, `manifest`, `pattern1`).
    Path,
    /// The workflow or manifest the route runs.
    Source,
    PromptPack,
    ActivationTarget,
    MaxLoopSteps,
    Priority,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageDiff {
    pub stage: String,
    #[serde(flatten)]
    pub change: StageChange,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "change", rename_all = "snake_case")]
pub enum StageChange {
    Added {
        #[serde(serialize_with = "role_name")]
        role: LlmRole,
        kind: StageKind,
    },
    Removed {
        #[serde(serialize_with = "role_name")]
        role: LlmRole,
        kind: StageKind,
    },
    Changed {
        fields: Vec<FieldChange>,
    },
}

/// One thing about a stage that differs, with both sides.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "field", rename_all = "snake_case")]
pub enum FieldChange {
    Role {
        #[serde(serialize_with = "role_name")]
        old: LlmRole,
        #[serde(serialize_with = "role_name")]
        new: LlmRole,
    },
    /// Whether its model calls stream their text (`stream:`).
    Stream {
        old: bool,
        new: bool,
    },
    Kind {
        old: StageKind,
        new: StageKind,
    },
    /// The capability the stage is bound to, by name.
    Capability {
        old: Option<String>,
        new: Option<String>,
    },
    /// Which resolution path the prompt took (`role template`, `host prompt`, ...).
    PromptSource {
        #[serde(serialize_with = "source_name")]
        old: PromptSource,
        #[serde(serialize_with = "source_name")]
        new: PromptSource,
    },
    /// The system text the model is sent; `None` on a side where the stage calls no model.
    SystemPrompt {
        old: Option<String>,
        new: Option<String>,
    },
    Output {
        old: Output,
        new: Output,
    },
    /// The stages that may follow, in the order a run tries them.
    Edges {
        old: Vec<EdgeView>,
        new: Vec<EdgeView>,
    },
    /// The HTTP call of the stage's capability (a tool, or a query formulation's search).
    Invoke {
        old: Option<InvokeView>,
        new: Option<InvokeView>,
    },
    /// The A2A agent of the stage's capability (`invoke.a2a`).
    Agent {
        old: Option<AgentView>,
        new: Option<AgentView>,
    },
    /// The tool's input schema, which the model is shown and its arguments are checked against.
    InputSchema {
        old: Option<Value>,
        new: Option<Value>,
    },
}

/// What changed from `old` to `new`, routes by id.
pub fn diff(old: &Catalogue, new: &Catalogue) -> CatalogueDiff {
    let ids: BTreeSet<&str> = old
        .routes()
        .chain(new.routes())
        .map(|entry| match entry {
            RouteEntry::Ready(route) => route.id(),
            RouteEntry::Broken(broken) => &broken.id,
        })
        .collect();
    let routes = ids.into_iter().filter_map(|id| route_change(old.get(id), new.get(id)).map(|change| RouteDiff { route: id.to_owned(), change })).collect();
    CatalogueDiff { routes }
}

fn broken(entry: &RouteEntry) -> Option<Problems> {
    match entry {
        RouteEntry::Ready(_) => None,
        RouteEntry::Broken(b) => Some(Problems::of(b)),
    }
}

fn route_change(old: Option<&RouteEntry>, new: Option<&RouteEntry>) -> Option<RouteChange> {
    match (old, new) {
        (None, None) => None,
        (None, Some(new)) => Some(RouteChange::Added { broken: broken(new) }),
        (Some(old), None) => Some(RouteChange::Removed { broken: broken(old) }),
        (Some(RouteEntry::Ready(_)), Some(RouteEntry::Broken(b))) => Some(RouteChange::BecameBroken { problems: Problems::of(b) }),
        (Some(RouteEntry::Broken(_)), Some(RouteEntry::Ready(_))) => Some(RouteChange::BecameReady),
        // The two sides' files lie in other directories: their problems are compared by message.
        (Some(RouteEntry::Broken(o)), Some(RouteEntry::Broken(n))) => {
            let messages = |b: &BrokenRoute| b.problems.iter().map(|d| d.message.clone()).collect::<Vec<_>>();
            (messages(o) != messages(n)).then(|| RouteChange::StillBroken { problems: Problems::of(n) })
        }
        (Some(RouteEntry::Ready(o)), Some(RouteEntry::Ready(n))) => {
            let (settings, stages) = (settings(o, n), stages(o, n));
            (!settings.is_empty() || !stages.is_empty()).then_some(RouteChange::Changed { settings, stages })
        }
    }
}

fn settings(old: &Route, new: &Route) -> Vec<SettingChange> {
    let of = |r: &Route| -> [(Setting, Value); 7] {
        [
            (Setting::ModelProfile, r.model_profile().into()),
            (Setting::Path, r.path().as_str().into()),
            (Setting::Source, r.source().into()),
            (Setting::PromptPack, r.pack().name().into()),
            (Setting::ActivationTarget, r.activation_target().into()),
            (Setting::MaxLoopSteps, r.max_loop_steps().into()),
            (Setting::Priority, r.priority().into()),
        ]
    };
    of(old).into_iter().zip(of(new)).filter(|((_, o), (_, n))| o != n).map(|((setting, old), (_, new))| SettingChange { setting, old, new }).collect()
}

/// The stages of both routes matched by id: the old route's in its order (changed or removed),
/// then the ones only the new route has, in its order.
fn stages(old: &Route, new: &Route) -> Vec<StageDiff> {
    let listed = |r: &Route| r.nodes().filter(|(_, n)| *n.kind() != NodeKind::End).map(|(idx, _)| idx).collect::<Vec<_>>();
    let (old_nodes, new_nodes) = (listed(old), listed(new));
    let find = |r: &Route, nodes: &[NodeIndex], id: &str| nodes.iter().copied().find(|&i| r.node(i).id() == id);
    let mut out = Vec::new();
    for &o in &old_nodes {
        let stage = old.node(o);
        let change = match find(new, &new_nodes, stage.id()) {
            None => StageChange::Removed { role: stage.role(), kind: StageKind::of(stage.kind()) },
            Some(n) => match fields(old, o, new, n) {
                fields if fields.is_empty() => continue,
                fields => StageChange::Changed { fields },
            },
        };
        out.push(StageDiff { stage: stage.id().to_owned(), change });
    }
    for &n in new_nodes.iter().filter(|&&n| find(old, &old_nodes, new.node(n).id()).is_none()) {
        let stage = new.node(n);
        out.push(StageDiff { stage: stage.id().to_owned(), change: StageChange::Added { role: stage.role(), kind: StageKind::of(stage.kind()) } });
    }
    out
}

fn fields(old: &Route, o: NodeIndex, new: &Route, n: NodeIndex) -> Vec<FieldChange> {
    let (os, ns) = (old.node(o), new.node(n));
    let mut out = Vec::new();
    if os.role() != ns.role() {
        out.push(FieldChange::Role { old: os.role(), new: ns.role() });
    }
    if os.streams() != ns.streams() {
        out.push(FieldChange::Stream { old: os.streams(), new: ns.streams() });
    }
    if os.kind() != ns.kind() {
        out.push(FieldChange::Kind { old: StageKind::of(os.kind()), new: StageKind::of(ns.kind()) });
    }
    let capability = |s: &StageNode| s.capability().map(|c| c.name.clone());
    if capability(os) != capability(ns) {
        out.push(FieldChange::Capability { old: capability(os), new: capability(ns) });
    }
    if os.prompt().source != ns.prompt().source {
        out.push(FieldChange::PromptSource { old: os.prompt().source, new: ns.prompt().source });
    }
    let (old_text, new_text) = (system_prompt(os), system_prompt(ns));
    if old_text != new_text {
        out.push(FieldChange::SystemPrompt { old: old_text, new: new_text });
    }
    let (old_output, new_output) = (Output::of(os.output()), Output::of(ns.output()));
    if old_output != new_output {
        out.push(FieldChange::Output { old: old_output, new: new_output });
    }
    let (old_edges, new_edges) = (edges(old, o), edges(new, n));
    if old_edges != new_edges {
        out.push(FieldChange::Edges { old: old_edges, new: new_edges });
    }
    // Compared as written, so that a change inside a part `redact` hides is still reported.
    let invoke = |s: &StageNode| s.capability().and_then(|c| c.def.invoke.as_ref()).map(|i| (i.method, i.url.raw.clone(), i.timeout));
    if invoke(os) != invoke(ns) {
        let view = |s: &StageNode| invoke(s).map(|(method, url, timeout)| InvokeView { method, url: redact_url(&url), timeout_ms: timeout.as_millis() as u64 });
        out.push(FieldChange::Invoke { old: view(os), new: view(ns) });
    }
    let agent = |s: &StageNode| s.capability().and_then(|c| c.def.a2a.clone());
    if agent(os) != agent(ns) {
        out.push(FieldChange::Agent { old: agent(os).map(AgentView::of), new: agent(ns).map(AgentView::of) });
    }
    let input_schema = |s: &StageNode| s.capability().and_then(|c| c.def.input_schema.clone());
    if input_schema(os) != input_schema(ns) {
        out.push(FieldChange::InputSchema { old: input_schema(os), new: input_schema(ns) });
    }
    out
}

/// The system text the stage's model call is sent (the default where the pack gives none), or
/// `None` when the stage calls no model.
fn system_prompt(stage: &StageNode) -> Option<String> {
    (stage.prompt().source != PromptSource::NotApplicable).then(|| stage.prompt().system_text().to_owned())
}

fn edges(route: &Route, idx: NodeIndex) -> Vec<EdgeView> {
    let mut out: Vec<_> = route
        .graph()
        .edges(idx)
        .map(|e| {
            let label = hydrate::edge_label(e.weight());
            (e.weight().order, EdgeView { to: route.node(e.target()).id().to_owned(), when: (!label.is_empty()).then_some(label) })
        })
        .collect();
    out.sort_by_key(|(order, _)| *order);
    out.into_iter().map(|(_, edge)| edge).collect()
}

#[cfg(test)]
mod tests;
