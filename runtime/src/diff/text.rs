//! The human view of a [`CatalogueDiff`]: one line per change (`route R: stage S: llm_role:
//! classify -> synthesis`); a change of a value of several lines (a prompt, a schema, the edges)
//! is followed by the lines that differ, `  - old` and `  + new`. The JSON view carries both
//! values whole.

use std::fmt::{self, Display, Formatter};

use serde_json::Value;

use super::{
    AgentView, CatalogueDiff, EdgeView, FieldChange, InvokeView, Output, Problems, RouteChange, RouteDiff, Setting, StageChange, StageDiff, StageKind,
};

/// How many `-`/`+` lines one change shows at most.
const MAX_EXCERPT_LINES: usize = 40;

/// Above this many cells (old lines × new lines, of the part between the common head and tail)
/// lines are not matched: the whole old part is shown removed and the new one added, so that a
/// rewritten ten-thousand-line prompt costs no hundred million steps.
const MAX_MATCHED_CELLS: usize = 250_000;

impl Display for CatalogueDiff {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        self.routes.iter().try_for_each(|route| write!(f, "{route}"))
    }
}

impl Display for RouteDiff {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        let at = format!("route {}", self.route);
        match &self.change {
            RouteChange::Added { broken: None } => writeln!(f, "{at}: added"),
            RouteChange::Added { broken: Some(problems) } => writeln!(f, "{at}: added, broken: {problems}"),
            RouteChange::Removed { broken: None } => writeln!(f, "{at}: removed"),
            RouteChange::Removed { broken: Some(problems) } => writeln!(f, "{at}: removed (it was broken: {problems})"),
            RouteChange::BecameBroken { problems } => writeln!(f, "{at}: became broken: {problems}"),
            RouteChange::BecameReady => writeln!(f, "{at}: became ready"),
            RouteChange::StillBroken { problems } => writeln!(f, "{at}: still broken, with other problems: {problems}"),
            RouteChange::Changed { settings, stages } => {
                for s in settings {
                    writeln!(f, "{at}: {}: {} -> {}", s.setting.as_str(), value_text(&s.old), value_text(&s.new))?;
                }
                stages.iter().try_for_each(|stage| write_stage(f, &at, stage))
            }
        }
    }
}

impl Display for Problems {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.count, if self.count == 1 { "problem" } else { "problems" })?;
        match &self.first {
            Some(first) => write!(f, ", the first: {first}"),
            None => Ok(()),
        }
    }
}

impl Setting {
    /// The route's key in the catalogue (`path`: the resolution path `fabric routes list` shows).
    pub fn as_str(self) -> &'static str {
        match self {
            Setting::ModelProfile => "model_profile",
            Setting::Path => "path",
            Setting::Source => "source",
            Setting::PromptPack => "prompt_pack",
            Setting::ActivationTarget => "activation_target",
            Setting::MaxLoopSteps => "max_loop_steps",
            Setting::Priority => "priority",
        }
    }
}

impl Display for StageKind {
    fn fmt(&self, f: &mut Formatter<'_>) -> fmt::Result {
        match self {
            StageKind::Stage => f.write_str("stage"),
            StageKind::QueryFormulation => f.write_str("query_formulation"),
            StageKind::ChildRun { route } => write!(f, "child_run of route {route}"),
            StageKind::AppendedSynthesis => f.write_str("appended synthesis"),
            StageKind::Decision => f.write_str("decision"),
            StageKind::Tool => f.write_str("tool"),
        }
    }
}

fn value_text(value: &Value) -> String {
    match value {
        Value::Null => "none".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn write_stage(f: &mut Formatter<'_>, route_at: &str, stage: &StageDiff) -> fmt::Result {
    let at = format!("{route_at}: stage {}", stage.stage);
    match &stage.change {
        StageChange::Added { role, kind } => writeln!(f, "{at}: added ({kind}, llm_role {})", role.as_str()),
        StageChange::Removed { role, kind } => writeln!(f, "{at}: removed (was {kind}, llm_role {})", role.as_str()),
        StageChange::Changed { fields } => fields.iter().try_for_each(|field| write_field(f, &at, field)),
    }
}

fn write_field(f: &mut Formatter<'_>, at: &str, field: &FieldChange) -> fmt::Result {
    let or_none = |name: &Option<String>| name.clone().unwrap_or_else(|| "none".into());
    match field {
        FieldChange::Role { old, new } => writeln!(f, "{at}: llm_role: {} -> {}", old.as_str(), new.as_str()),
        FieldChange::Stream { old, new } => writeln!(f, "{at}: stream: {old} -> {new}"),
        FieldChange::Kind { old, new } => writeln!(f, "{at}: kind: {old} -> {new}"),
        FieldChange::Capability { old, new } => writeln!(f, "{at}: capability: {} -> {}", or_none(old), or_none(new)),
        FieldChange::PromptSource { old, new } => writeln!(f, "{at}: prompt source: {} -> {}", old.as_str(), new.as_str()),
        FieldChange::SystemPrompt { old, new } => {
            let what = match (old, new) {
                (None, _) => "system prompt added (the stage now calls the model)",
                (_, None) => "system prompt removed (the stage no longer calls the model)",
                _ => "system prompt changed",
            };
            writeln!(f, "{at}: {what}")?;
            write_excerpt(f, old.as_deref().unwrap_or_default(), new.as_deref().unwrap_or_default())
        }
        FieldChange::Output { old, new } => {
            writeln!(f, "{at}: output schema changed")?;
            write_excerpt(f, &output_text(old), &output_text(new))
        }
        FieldChange::Edges { old, new } => {
            writeln!(f, "{at}: edges changed")?;
            write_excerpt(f, &edges_text(old), &edges_text(new))
        }
        FieldChange::Invoke { old, new } => {
            // Both views equal: what changed is a part of the URL `redact` does not show.
            let hidden = if old == new { " (in a part of the URL not shown)" } else { "" };
            writeln!(f, "{at}: tool call: {} -> {}{hidden}", invoke_text(old.as_ref()), invoke_text(new.as_ref()))
        }
        FieldChange::Agent { old, new } => {
            let hidden = if old == new { " (in a part of the URL not shown)" } else { "" };
            writeln!(f, "{at}: agent: {} -> {}{hidden}", agent_text(old.as_ref()), agent_text(new.as_ref()))
        }
        FieldChange::InputSchema { old, new } => {
            writeln!(f, "{at}: input schema changed")?;
            write_excerpt(f, &schema_text(old.as_ref()), &schema_text(new.as_ref()))
        }
    }
}

fn output_text(output: &Output) -> String {
    match output {
        Output::Text => "text (no output schema)".into(),
        Output::Structured(schema) => schema_text(Some(schema)),
        Output::Unbindable(why) => format!("text (the output schema is not bindable: {why})"),
        Output::Decision(tools) => format!("a decision over the tools {}", tools.join(", ")),
    }
}

/// A schema pretty-printed, so that a change shows as the lines of the properties it touches.
fn schema_text(schema: Option<&Value>) -> String {
    schema.map_or_else(|| "none".into(), |s| serde_json::to_string_pretty(s).unwrap_or_else(|_| s.to_string()))
}

fn edges_text(edges: &[EdgeView]) -> String {
    let line = |e: &EdgeView| match &e.when {
        Some(when) => format!("-> {} when {when}", e.to),
        None => format!("-> {}", e.to),
    };
    edges.iter().map(line).collect::<Vec<_>>().join("\n")
}

fn agent_text(agent: Option<&AgentView>) -> String {
    let token = |a: &AgentView| a.token_env.as_deref().map_or("no token".to_owned(), |v| format!("token from {v}"));
    agent.map_or_else(
        || "none".into(),
        |a| format!("{} skill {} ({}, timeout {} ms, at most {} bytes)", a.url, a.skill, token(a), a.timeout_ms, a.max_response_bytes),
    )
}

fn invoke_text(invoke: Option<&InvokeView>) -> String {
    invoke.map_or_else(|| "none".into(), |i| format!("{} {} (timeout {} ms)", i.method.as_str(), i.url, i.timeout_ms))
}

/// A line of an excerpt: only in the old text, or only in the new one.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line<'a> {
    Old(&'a str),
    New(&'a str),
    /// Lines both texts share were left out here.
    Gap,
}

/// The lines that differ between `old` and `new`, in order: the common head and tail are cut
/// off and the rest matched by a longest common subsequence (when small enough, see
/// [`MAX_MATCHED_CELLS`]); a run of shared lines between two changes becomes one [`Line::Gap`].
pub(super) fn changed_lines<'a>(old: &'a str, new: &'a str) -> Vec<Line<'a>> {
    let (old, new): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let head = old.iter().zip(&new).take_while(|(o, n)| o == n).count();
    let tail = old[head..].iter().rev().zip(new[head..].iter().rev()).take_while(|(o, n)| o == n).count();
    let (a, b) = (&old[head..old.len() - tail], &new[head..new.len() - tail]);
    if a.len().saturating_mul(b.len()) > MAX_MATCHED_CELLS {
        return a.iter().map(|l| Line::Old(l)).chain(b.iter().map(|l| Line::New(l))).collect();
    }
    // common[i * width + j]: the length of the longest common subsequence of a[i..] and b[j..].
    let width = b.len() + 1;
    let mut common = vec![0u32; (a.len() + 1) * width];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            common[i * width + j] = if a[i] == b[j] { common[(i + 1) * width + j + 1] + 1 } else { common[(i + 1) * width + j].max(common[i * width + j + 1]) };
        }
    }
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            if out.last().is_some_and(|l| *l != Line::Gap) {
                out.push(Line::Gap);
            }
            (i, j) = (i + 1, j + 1);
        } else if j == b.len() || (i < a.len() && common[(i + 1) * width + j] >= common[i * width + j + 1]) {
            out.push(Line::Old(a[i]));
            i += 1;
        } else {
            out.push(Line::New(b[j]));
            j += 1;
        }
    }
    out
}

fn write_excerpt(f: &mut Formatter<'_>, old: &str, new: &str) -> fmt::Result {
    let lines = changed_lines(old, new);
    if lines.is_empty() {
        return writeln!(f, "  (no line differs: the change is in line endings)");
    }
    for line in lines.iter().take(MAX_EXCERPT_LINES) {
        match line {
            Line::Old(text) => writeln!(f, "  - {text}")?,
            Line::New(text) => writeln!(f, "  + {text}")?,
            Line::Gap => writeln!(f, "  ...")?,
        }
    }
    match lines.len().saturating_sub(MAX_EXCERPT_LINES) {
        0 => Ok(()),
        more => writeln!(f, "  ... and {more} more lines"),
    }
}
