//! Loading: source files → located YAML trees → definitions → cross-checks.
//!
//! The result is [`Loaded`]: every definition decoded (or where it was and why it could not be),
//! with the problems found, which [`crate::catalogue`] then hydrates into runnable routes. One
//! broken definition only breaks what uses it; every problem is kept, located.

use indexmap::IndexMap;
use petgraph::graph::DiGraph;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

pub mod a2a;
pub mod decode;
pub mod fallbacks;
pub mod mcp;
mod schedules;

use crate::defs::*;
use crate::diag::{Diagnostic, Diagnostics, Pos};
use crate::prompt::{self, PromptPack};
use crate::source::{Layers, SourceFile, read_layers};
use crate::structured::FieldType;
use crate::vocab::OutputSpec;
use crate::yaml::{self, Ctx};

/// A definition, or where it was and why it could not be decoded.
pub type Entry<T> = Result<T, Origin>;

/// Everything decoded from the catalogue and pack directories.
#[derive(Debug, Default)]
pub struct Defs {
    pub packs: IndexMap<String, Option<Arc<PromptPack>>>,
    pub profiles: IndexMap<String, Entry<ProfileDef>>,
    pub capabilities: IndexMap<String, Entry<Arc<CapabilityDef>>>,
    pub workflows: IndexMap<String, Entry<WorkflowDef>>,
    pub manifests: IndexMap<String, Entry<ManifestDef>>,
    pub routes: IndexMap<String, Entry<RouteDef>>,
    pub mcp_servers: IndexMap<String, Entry<McpServerDef>>,
}

const SECTIONS: [&str; 6] = ["profiles", "capabilities", "workflows", "manifests", "routes", "mcp_servers"];

/// Everything read from the catalogue and pack directories: the definitions, every problem,
/// and the files that could not be loaded at all.
#[derive(Debug, Default)]
pub struct Loaded {
    pub defs: Defs,
    pub diags: Diagnostics,
    pub unloaded: Vec<Diagnostic>,
}

/// Reads and decodes the catalogue of the `catalogue` directories with the prompt packs of the `packs` directories. The
/// layers' files are taken in order as one catalogue, so a name defined in two layers is a duplicate like one defined in
/// two files of one directory. The files read are handed back with it, in the order they were taken: what the catalogue's
/// version is made of.
pub fn load_dirs(catalogue: &Layers, packs: &Layers) -> (Loaded, Vec<SourceFile>, Vec<SourceFile>) {
    let mut diags = Diagnostics::default();
    let mut unloaded = Vec::new();
    let packs = read_layers(packs, &mut diags, &mut Vec::new());
    let files = read_layers(catalogue, &mut diags, &mut unloaded);
    (load_sources(&files, &packs, diags, unloaded), files, packs)
}

/// Decodes a catalogue from texts already in memory (benchmarks, fuzzing, embedders).
pub fn load_texts(files: &[SourceFile], packs: &[SourceFile]) -> Loaded {
    load_sources(files, packs, Diagnostics::default(), Vec::new())
}

/// The names defined, for an "is not defined" message: which names would have been right.
pub(crate) fn known_names<'a>(it: impl Iterator<Item = &'a String>) -> String {
    let v: Vec<&str> = it.map(String::as_str).collect();
    if v.is_empty() { "none defined".into() } else { v.join(", ") }
}

/// The singular of a section name, for messages.
fn singular(section: &str) -> &'static str {
    match section {
        "profiles" => "model profile",
        "capabilities" => "capability",
        "workflows" => "workflow",
        "manifests" => "manifest",
        "mcp_servers" => "MCP server",
        _ => "route",
    }
}

fn load_sources(files: &[SourceFile], packs: &[SourceFile], mut diags: Diagnostics, mut unloaded: Vec<Diagnostic>) -> Loaded {
    let mut defs = Defs { packs: prompt::load_packs(packs, &mut diags), ..Defs::default() };
    let mut seen: HashMap<(&'static str, String), (Arc<PathBuf>, Pos)> = HashMap::new();
    // A name defined twice is broken, with every definition's place: picking one would run
    // something its author did not mean.
    let mut duplicated: IndexMap<(&'static str, String), Vec<Diagnostic>> = IndexMap::new();
    for SourceFile { path, text } in files {
        let mark = diags.len();
        let Some(root) = yaml::parse(path, text, &mut diags) else {
            unloaded.extend(diags.since(mark).iter().cloned());
            continue;
        };
        let shared_path = Arc::new(path.clone());
        let mut ctx = Ctx { path, diags: &mut diags };
        let Some(mut file) = ctx.map(&root, "a catalogue file") else {
            unloaded.extend(ctx.diags.since(mark).iter().cloned());
            continue;
        };
        for section in SECTIONS {
            let Some(node) = file.get(section) else { continue };
            if !matches!(node.value, yaml::Value::Map(_) | yaml::Value::Null) {
                // Its definitions cannot be read: count the file with those that did not load,
                // so a missing route points here.
                let mark = ctx.diags.len();
                yaml::entries(&mut ctx, node, section);
                unloaded.extend(ctx.diags.since(mark).iter().cloned());
                continue;
            }
            for (key, node) in yaml::entries(&mut ctx, node, section) {
                let singular = singular(section);
                if let Some((first_path, first_pos)) = seen.get(&(section, key.name.clone())) {
                    let mark = ctx.diags.len();
                    ctx.error(
                        key.pos,
                        format!(
                            "{singular} `{}` is already defined at {}:{}:{}; a name may be defined once (neither definition is used)",
                            key.name,
                            first_path.display(),
                            first_pos.line,
                            first_pos.col
                        ),
                    );
                    duplicated.entry((section, key.name.clone())).or_default().extend(ctx.diags.since(mark).iter().cloned());
                    continue;
                }
                seen.insert((section, key.name.clone()), (shared_path.clone(), key.pos));
                let mark = ctx.diags.len();
                let origin = Origin { path: shared_path.clone(), pos: key.pos, problems: Vec::new() };
                let name = key.name.clone();
                macro_rules! decode_into {
                    ($map:expr, $f:path, $wrap:expr) => {{
                        let def = $f(&mut ctx, &name, node, origin.clone());
                        let problems = ctx.diags.since(mark).to_vec();
                        let entry = match def {
                            Some(mut d) => {
                                d.origin.problems = problems;
                                Ok($wrap(d))
                            }
                            None => Err(Origin { problems, ..origin }),
                        };
                        $map.insert(name, entry);
                    }};
                }
                match section {
                    "profiles" => decode_into!(defs.profiles, decode::profile, |d| d),
                    "capabilities" => decode_into!(defs.capabilities, decode::capability, Arc::new),
                    "workflows" => decode_into!(defs.workflows, decode::workflow, |d| d),
                    "manifests" => decode_into!(defs.manifests, decode::manifest, |d| d),
                    "mcp_servers" => decode_into!(defs.mcp_servers, mcp::server, |d| d),
                    _ => decode_into!(defs.routes, decode::route, |d| d),
                }
            }
        }
        file.finish(&mut ctx);
    }
    // The first definition stays (its own problems are still checked and reported) but is
    // broken by the duplicate, and so is everything that uses it.
    for ((section, name), problems) in duplicated {
        let origin = match section {
            "profiles" => defs.profiles.get_mut(&name).map(|e| e.as_mut().map_or_else(|o| o, |d| &mut d.origin)),
            "capabilities" => defs.capabilities.get_mut(&name).map(|e| e.as_mut().map_or_else(|o| o, |d| &mut Arc::make_mut(d).origin)),
            "workflows" => defs.workflows.get_mut(&name).map(|e| e.as_mut().map_or_else(|o| o, |d| &mut d.origin)),
            "manifests" => defs.manifests.get_mut(&name).map(|e| e.as_mut().map_or_else(|o| o, |d| &mut d.origin)),
            "mcp_servers" => defs.mcp_servers.get_mut(&name).map(|e| e.as_mut().map_or_else(|o| o, |d| &mut d.origin)),
            _ => defs.routes.get_mut(&name).map(|e| e.as_mut().map_or_else(|o| o, |d| &mut d.origin)),
        };
        if let Some(origin) = origin {
            origin.problems.extend(problems);
        }
    }
    fallbacks::check(&mut defs, &mut diags);
    check_workflows(&mut defs, &mut diags);
    check_manifests(&mut defs, &mut diags);
    Loaded { defs, diags, unloaded }
}

/// Output field names of a capability's bindable schema, if it has one.
fn schema_fields(defs: &Defs, capability: &str) -> Option<Vec<(String, bool)>> {
    match defs.capabilities.get(capability)? {
        Ok(cap) => match &cap.output {
            OutputSpec::Bindable(s) => {
                Some(s.fields().iter().map(|f| (f.name().to_owned(), matches!(f.ty, FieldType::Scalar(crate::structured::Scalar::String)))).collect())
            }
            _ => None,
        },
        Err(_) => None,
    }
}

fn check_workflows(defs: &mut Defs, diags: &mut Diagnostics) {
    let ids: Vec<String> = defs.workflows.keys().cloned().collect();
    for id in ids {
        let Some(Ok(wf)) = defs.workflows.get(&id) else { continue };
        let path = wf.origin.path.clone();
        let mut ctx = Ctx { path: &path, diags };
        let mark = ctx.diags.len();
        let mut inherited = Vec::new();
        let mut stage_ids: HashMap<&str, usize> = HashMap::new();
        for (idx, stage) in wf.stages.iter().enumerate() {
            if stage.id == "end" {
                ctx.error(stage.pos, "`end` is reserved for `next: end` / `goto: end`; rename this stage");
            }
            if stage_ids.insert(&stage.id, idx).is_some() {
                ctx.error(stage.pos, format!("stage id `{}` is used twice in workflow `{id}`", stage.id));
            }
        }
        for stage in &wf.stages {
            if let Some(cap) = &stage.capability {
                match defs.capabilities.get(&cap.name) {
                    None => ctx.error(cap.pos, format!("capability `{}` is not defined (capabilities: {})", cap.name, known_names(defs.capabilities.keys()))),
                    Some(Err(origin)) => inherited.extend(origin.problems.iter().cloned()),
                    Some(Ok(c)) => {
                        inherited.extend(c.origin.problems.iter().filter(|d| d.is_error()).cloned());
                        if stage.role == Some(LlmRole::QueryFormulation)
                            && let Some(fields) = schema_fields(defs, &cap.name)
                            && !fields.iter().any(|(n, is_str)| n == "query" && *is_str)
                        {
                            ctx.error(
                                cap.pos,
                                format!("stage `{}` is query_formulation, but the output_schema of `{}` has no string `query` property", stage.id, cap.name),
                            );
                        }
                    }
                }
            }
            if let StageKindDef::ChildRun { route } = &stage.kind
                && !defs.routes.contains_key(&route.name)
            {
                ctx.error(
                    route.pos,
                    format!("route `{}` (the child run of stage `{}`) is not defined (routes: {})", route.name, stage.id, known_names(defs.routes.keys())),
                );
            }
            let check_target = |ctx: &mut Ctx<'_>, t: &Target| {
                if let Target::Stage(r) = t
                    && !stage_ids.contains_key(r.name.as_str())
                {
                    ctx.error(r.pos, format!("stage `{}` is not in workflow `{id}`", r.name));
                }
            };
            match &stage.flow {
                Flow::FallThrough => {}
                Flow::Next(t) => check_target(&mut ctx, t),
                Flow::Branches(arms) => {
                    let mut unconditional_seen = false;
                    for arm in arms {
                        if unconditional_seen {
                            ctx.error(arm.pos, "this branch can never be taken: an earlier branch has no `when`");
                        }
                        unconditional_seen |= arm.when.is_none();
                        check_target(&mut ctx, &arm.goto);
                        if let Some(cond) = &arm.when {
                            match stage_ids.get(cond.slot.name.as_str()) {
                                None => ctx.error(cond.slot.pos, format!("slot `{}` is not a stage of workflow `{id}`", cond.slot.name)),
                                Some(&slot_idx) => {
                                    let slot_stage = &wf.stages[slot_idx];
                                    if let Some(field) = &cond.field {
                                        let fields = slot_stage.capability.as_ref().and_then(|c| schema_fields(defs, &c.name));
                                        match fields {
                                            None => ctx.error(
                                                cond.slot.pos,
                                                format!("slot `{}` has no fields to test: its stage has no bindable output_schema", cond.slot.name),
                                            ),
                                            Some(fields) if !fields.iter().any(|(n, _)| n == field) => ctx.error(
                                                cond.slot.pos,
                                                format!(
                                                    "`{field}` is not a property of the output of stage `{}`; it has: {}",
                                                    cond.slot.name,
                                                    fields.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(", ")
                                                ),
                                            ),
                                            Some(_) => {}
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        // The shape checks need a decoded, non-empty stage list (a stage that failed to decode
        // is missing from it, and the workflow is already broken).
        if ctx.diags.error_count_since(mark) == 0 && !wf.origin.is_broken() && !wf.stages.is_empty() {
            check_flow_shape(&mut ctx, &id, wf);
        }
        let problems = ctx.diags.since(mark).to_vec();
        if let Some(Ok(wf)) = defs.workflows.get_mut(&id) {
            wf.origin.problems.extend(problems);
            wf.origin.problems.extend(inherited);
        }
    }
}

/// Successors of each stage (`None` = the run ends there).
pub fn successors(wf: &WorkflowDef) -> Vec<Vec<Option<usize>>> {
    let index: HashMap<&str, usize> = wf.stages.iter().enumerate().map(|(i, s)| (s.id.as_str(), i)).collect();
    let resolve = |t: &Target| match t {
        Target::End => None,
        Target::Stage(r) => index.get(r.name.as_str()).copied(),
    };
    wf.stages
        .iter()
        .enumerate()
        .map(|(idx, stage)| match &stage.flow {
            Flow::FallThrough => vec![(idx + 1 < wf.stages.len()).then_some(idx + 1)],
            Flow::Next(t) => vec![resolve(t)],
            Flow::Branches(arms) => arms.iter().map(|a| resolve(&a.goto)).collect(),
        })
        .collect()
}

/// Unreachable stages (warning) and cycles that can never be left (error).
fn check_flow_shape(ctx: &mut Ctx<'_>, id: &str, wf: &WorkflowDef) {
    let succ = successors(wf);
    let mut graph = DiGraph::<usize, ()>::new();
    let nodes: Vec<_> = (0..wf.stages.len()).map(|i| graph.add_node(i)).collect();
    for (from, targets) in succ.iter().enumerate() {
        for to in targets.iter().flatten() {
            graph.add_edge(nodes[from], nodes[*to], ());
        }
    }
    let mut reachable = vec![false; wf.stages.len()];
    let mut dfs = petgraph::visit::Dfs::new(&graph, nodes[0]);
    while let Some(n) = dfs.next(&graph) {
        reachable[graph[n]] = true;
    }
    for (idx, stage) in wf.stages.iter().enumerate() {
        if !reachable[idx] {
            ctx.warning(stage.pos, format!("stage `{}` of workflow `{id}` can never run: no path leads to it", stage.id));
        }
    }
    for scc in petgraph::algo::tarjan_scc(&graph) {
        let members: Vec<usize> = scc.iter().map(|n| graph[*n]).collect();
        let is_cycle = members.len() > 1 || succ[members[0]].contains(&Some(members[0]));
        if !is_cycle {
            continue;
        }
        // A branch with conditions may also find no match, which fails the run: that is an exit too.
        let has_exit = members.iter().any(|&m| {
            let conditional = matches!(&wf.stages[m].flow, Flow::Branches(arms) if arms.iter().all(|a| a.when.is_some()));
            conditional || succ[m].iter().any(|t| t.is_none_or(|t| !members.contains(&t)))
        });
        if !has_exit {
            let mut names: Vec<&str> = members.iter().map(|&m| wf.stages[m].id.as_str()).collect();
            names.sort_by_key(|n| wf.stages.iter().position(|s| s.id == *n));
            let first = members.iter().min().copied().unwrap_or(0);
            ctx.error(wf.stages[first].pos, format!("workflow `{id}` has a cycle with no way out: {} -> {}", names.join(" -> "), names[0]));
        }
    }
}

fn check_manifests(defs: &mut Defs, diags: &mut Diagnostics) {
    let ids: Vec<String> = defs.manifests.keys().cloned().collect();
    for id in ids {
        let Some(Ok(m)) = defs.manifests.get(&id) else { continue };
        let path = m.origin.path.clone();
        let mut ctx = Ctx { path: &path, diags };
        let mark = ctx.diags.len();
        let mut inherited = Vec::new();
        match defs.workflows.get(&m.workflow.name) {
            None => ctx.error(m.workflow.pos, format!("workflow `{}` is not defined (workflows: {})", m.workflow.name, known_names(defs.workflows.keys()))),
            Some(Err(o)) => inherited.extend(o.problems.iter().cloned()),
            Some(Ok(wf)) => {
                inherited.extend(wf.origin.problems.iter().filter(|d| d.is_error()).cloned());
                if wf.branched {
                    ctx.error(m.workflow.pos, format!("manifest `{id}` needs a linear workflow, but `{}` uses `next` or `branches`", m.workflow.name));
                }
                if wf.stages.iter().any(|s| s.id == m.synthesis_stage_id) {
                    ctx.error(
                        m.origin.pos,
                        format!(
                            "the appended synthesis node `{}` clashes with a stage of workflow `{}`; set `synthesis.id`",
                            m.synthesis_stage_id, m.workflow.name
                        ),
                    );
                }
            }
        }
        if let Some(cap) = &m.synthesis_capability {
            match defs.capabilities.get(&cap.name) {
                None => ctx.error(cap.pos, format!("capability `{}` is not defined (capabilities: {})", cap.name, known_names(defs.capabilities.keys()))),
                Some(Err(o)) => inherited.extend(o.problems.iter().cloned()),
                Some(Ok(c)) => inherited.extend(c.origin.problems.iter().filter(|d| d.is_error()).cloned()),
            }
        }
        let problems = ctx.diags.since(mark).to_vec();
        if let Some(Ok(m)) = defs.manifests.get_mut(&id) {
            m.origin.problems.extend(problems);
            m.origin.problems.extend(inherited);
        }
    }
}
