//! Prompt packs: the texts a route's model calls are given, and how a node's prompt is resolved.
//!
//! A pack is one YAML file `prompt-packs/<name>.yaml`. Templates may use `{{host}}` and
//! `{{rules}}`; the agent wrapper may also use `{{tools}}`. Unknown placeholders are load errors.

use crate::defs::LlmRole;
use crate::diag::Pos;
use crate::yaml::{self, Ctx, Node};

/// The system text used at the provider call when a node's prompt resolves to empty.
pub const DEFAULT_SYSTEM_TEXT: &str = "Follow the user request. Reply with the result only.";

/// Used for an appended synthesis node when the pack has neither a synthesis template nor a host.
pub const BUILTIN_SYNTHESIS_PROMPT: &str = "Write the final answer to the goal for the user, using the prior stage outputs. Reply with the answer only.";

/// Wraps the host for decision-loop routes when the pack has no `agent` template.
pub const BUILTIN_AGENT_WRAPPER: &str = "{{host}}\n\n{{rules}}\n\nYou decide the next step of the task. Either call one tool, ask the user one question, or finish with the answer.\n\nTools:\n{{tools}}";

#[derive(Debug, Clone)]
pub struct PromptPack {
    name: String,
    host: String,
    classify: Option<String>,
    query_formulation: Option<String>,
    synthesis_role: Option<String>,
    synthesis: Option<String>,
    agent: Option<String>,
    rules: Vec<String>,
}

/// Where a node's prompt text came from (shown by `fabric hydrate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptSource {
    RoleTemplate,
    Host,
    SynthesisTemplate,
    BuiltinSynthesis,
    AgentWrapper,
    BuiltinAgentWrapper,
    /// Nothing resolved: the provider call gets [`DEFAULT_SYSTEM_TEXT`].
    Empty,
    /// The node does not call the model.
    NotApplicable,
}

impl PromptSource {
    pub fn as_str(self) -> &'static str {
        match self {
            PromptSource::RoleTemplate => "role template",
            PromptSource::Host => "host prompt",
            PromptSource::SynthesisTemplate => "synthesis template",
            PromptSource::BuiltinSynthesis => "built-in synthesis default",
            PromptSource::AgentWrapper => "agent wrapper",
            PromptSource::BuiltinAgentWrapper => "built-in agent wrapper",
            PromptSource::Empty => "empty (provider default system text)",
            PromptSource::NotApplicable => "no model call",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ResolvedPrompt {
    pub text: String,
    pub source: PromptSource,
}

impl ResolvedPrompt {
    pub fn none() -> ResolvedPrompt {
        ResolvedPrompt { text: String::new(), source: PromptSource::NotApplicable }
    }

    /// The system text actually sent: empty prompts are replaced by the default.
    pub fn system_text(&self) -> &str {
        if self.text.trim().is_empty() { DEFAULT_SYSTEM_TEXT } else { &self.text }
    }
}

impl PromptPack {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn rules(&self) -> &[String] {
        &self.rules
    }

    fn role_template(&self, role: LlmRole) -> Option<&str> {
        match role {
            LlmRole::Classify => self.classify.as_deref(),
            LlmRole::QueryFormulation => self.query_formulation.as_deref(),
            LlmRole::Synthesis => self.synthesis_role.as_deref(),
            LlmRole::None => None,
        }
        .filter(|t| !t.trim().is_empty())
    }

    /// Fills `{{host}}`, `{{rules}}` and `{{tools}}` (spaces inside the braces allowed, as the
    /// load check allows them); anything else is left as written (the load check refuses it).
    fn expand(&self, template: &str, tools: &str) -> String {
        let mut out = String::with_capacity(template.len() + self.host.len());
        let mut rest = template;
        while let Some(start) = rest.find("{{") {
            let Some(end) = rest[start + 2..].find("}}") else { break };
            out.push_str(&rest[..start]);
            match rest[start + 2..start + 2 + end].trim() {
                "host" => out.push_str(self.host.trim_end()),
                "rules" => out.push_str(&self.rules_text()),
                "tools" => out.push_str(tools),
                _ => out.push_str(&rest[start..start + 4 + end]),
            }
            rest = &rest[start + 4 + end..];
        }
        out.push_str(rest);
        out
    }

    fn rules_text(&self) -> String {
        self.rules.iter().map(|r| format!("- {r}")).collect::<Vec<_>>().join("\n")
    }

    fn host_prompt(&self) -> Option<ResolvedPrompt> {
        (!self.host.trim().is_empty()).then(|| ResolvedPrompt { text: self.host.clone(), source: PromptSource::Host })
    }

    /// Workflow-only and branched paths: the role template, else the host prompt.
    pub fn resolve_workflow_stage(&self, role: LlmRole) -> ResolvedPrompt {
        if role == LlmRole::None {
            return ResolvedPrompt::none();
        }
        match self.role_template(role) {
            Some(t) => ResolvedPrompt { text: self.expand(t, ""), source: PromptSource::RoleTemplate },
            None => self.host_prompt().unwrap_or(ResolvedPrompt { text: String::new(), source: PromptSource::Empty }),
        }
    }

    /// Manifest plus linear workflow: the role template only, never the host.
    pub fn resolve_manifest_stage(&self, role: LlmRole) -> ResolvedPrompt {
        if role == LlmRole::None {
            return ResolvedPrompt::none();
        }
        match self.role_template(role) {
            Some(t) => ResolvedPrompt { text: self.expand(t, ""), source: PromptSource::RoleTemplate },
            None => ResolvedPrompt { text: String::new(), source: PromptSource::Empty },
        }
    }

    /// Appended synthesis node: the synthesis template, else the host, else the built-in default.
    pub fn resolve_appended_synthesis(&self) -> ResolvedPrompt {
        if let Some(t) = self.synthesis.as_deref().filter(|t| !t.trim().is_empty()) {
            return ResolvedPrompt { text: self.expand(t, ""), source: PromptSource::SynthesisTemplate };
        }
        self.host_prompt().unwrap_or(ResolvedPrompt { text: BUILTIN_SYNTHESIS_PROMPT.to_owned(), source: PromptSource::BuiltinSynthesis })
    }

    /// The decision loop: the host (with enterprise rules) wrapped in the agent prompt with the tool list.
    /// The decision prompt always carries host, rules and tools: a pack template that leaves one
    /// out gets it added (host before, rules and tools after), as the load warning says.
    pub fn resolve_agent(&self, tools_text: &str) -> ResolvedPrompt {
        match self.agent.as_deref().filter(|t| !t.trim().is_empty()) {
            Some(t) => {
                let used = placeholders(t);
                let mut text = self.expand(t, tools_text);
                if !used.contains(&"host") && !self.host.trim().is_empty() {
                    text = format!("{}\n\n{text}", self.host.trim_end());
                }
                if !used.contains(&"rules") && !self.rules.is_empty() {
                    text = format!("{}\n\nRules:\n{}", text.trim_end(), self.rules_text());
                }
                if !used.contains(&"tools") {
                    text = format!("{}\n\nTools:\n{tools_text}", text.trim_end());
                }
                ResolvedPrompt { text, source: PromptSource::AgentWrapper }
            }
            None => ResolvedPrompt { text: tidy_blank_lines(&self.expand(BUILTIN_AGENT_WRAPPER, tools_text)), source: PromptSource::BuiltinAgentWrapper },
        }
    }
}

/// Collapses the blank lines an empty `{{rules}}` or host leaves behind.
fn tidy_blank_lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.trim().lines() {
        if line.trim().is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim_end().to_owned()
}

/// Decodes one pack file. Errors go to `ctx`; `None` when the file cannot give a usable pack.
pub fn decode_pack(ctx: &mut Ctx<'_>, name: &str, root: &Node) -> Option<PromptPack> {
    let mark = ctx.diags.len();
    let mut fields = ctx.map(root, &format!("prompt pack `{name}`"))?;
    let text = |ctx: &mut Ctx<'_>, node: Option<&Node>, what: &str, allow_tools: bool| -> Option<String> {
        let node = node?;
        let s = ctx.string(node, what)?;
        check_placeholders(ctx, node.pos, &s, what, allow_tools);
        Some(s)
    };
    let host = match fields.get("host") {
        Some(node) => ctx.string(node, "`host`").unwrap_or_default(),
        None => String::new(),
    };
    if host.contains("{{") {
        ctx.error(fields.pos, "`host` cannot use placeholders; it is what `{{host}}` stands for");
    }
    let mut classify = None;
    let mut query_formulation = None;
    let mut synthesis_role = None;
    if let Some(roles) = fields.get("roles")
        && let Some(mut role_fields) = ctx.map(roles, "`roles`")
    {
        classify = text(ctx, role_fields.get("classify"), "`roles.classify`", false);
        query_formulation = text(ctx, role_fields.get("query_formulation"), "`roles.query_formulation`", false);
        synthesis_role = text(ctx, role_fields.get("synthesis"), "`roles.synthesis`", false);
        role_fields.finish(ctx);
    }
    let synthesis = text(ctx, fields.get("synthesis"), "`synthesis`", false);
    let agent_node = fields.get("agent");
    let agent = text(ctx, agent_node, "`agent`", true);
    if let (Some(t), Some(node)) = (&agent, agent_node) {
        let used = placeholders(t);
        let missing: Vec<&str> = ["host", "rules", "tools"].into_iter().filter(|p| !used.contains(p)).collect();
        if !missing.is_empty() && !t.trim().is_empty() {
            let names: Vec<String> = missing.iter().map(|m| format!("{{{{{m}}}}}")).collect();
            ctx.warning(node.pos, format!("`agent` does not use {}; the decision prompt always carries them, so they are added around it", names.join(", ")));
        }
    }
    let mut rules = Vec::new();
    if let Some(node) = fields.get("rules")
        && let Some(items) = ctx.seq(node, "`rules`")
    {
        rules = items.iter().filter_map(|item| ctx.string(item, "each rule")).collect();
    }
    fields.get("description");
    fields.finish(ctx);
    (ctx.diags.error_count_since(mark) == 0).then(|| PromptPack {
        name: name.to_owned(),
        host,
        classify,
        query_formulation,
        synthesis_role,
        synthesis,
        agent,
        rules,
    })
}

/// The placeholder names a template uses (trimmed), in order.
fn placeholders(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        out.push(after[..end].trim());
        rest = &after[end + 2..];
    }
    out
}

fn check_placeholders(ctx: &mut Ctx<'_>, pos: Pos, text: &str, what: &str, allow_tools: bool) {
    let mut rest = text;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else {
            ctx.error(pos, format!("{what} has an unclosed `{{{{`"));
            return;
        };
        let name = after[..end].trim();
        let ok = matches!(name, "host" | "rules") || (allow_tools && name == "tools");
        if !ok {
            let allowed = if allow_tools { "{{host}}, {{rules}}, {{tools}}" } else { "{{host}}, {{rules}}" };
            ctx.error(pos, format!("{what} uses the unknown placeholder `{{{{{name}}}}}`; allowed: {allowed}"));
        }
        rest = &after[end + 2..];
    }
}

/// Decodes every pack file, named by file stem.
pub fn load_packs(files: &[crate::source::SourceFile], diags: &mut crate::diag::Diagnostics) -> indexmap::IndexMap<String, Option<std::sync::Arc<PromptPack>>> {
    let mut packs = indexmap::IndexMap::new();
    let mut first_path: std::collections::HashMap<String, &std::path::Path> = std::collections::HashMap::new();
    for file in files {
        let path = &file.path;
        let Some(name) = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned) else { continue };
        let mut ctx = Ctx { path, diags };
        if !yaml::is_ident(&name) {
            ctx.error(Pos::FILE, format!("prompt pack file name `{name}` is not a valid name (letters, digits, `_`, `-`, `.`)"));
            continue;
        }
        if let Some(first) = first_path.get(&name) {
            // `a.yaml` and `a.yml`, or two folders (or two layers of `--prompt-packs a:b`) with
            // an `a.yaml`: neither is used, as for a name defined twice in the catalogue.
            ctx.error(
                Pos::FILE,
                format!("prompt pack `{name}` is already defined at {}:1:1; a pack name may be used once (neither pack is used)", first.display()),
            );
            packs.insert(name, None);
            continue;
        }
        first_path.insert(name.clone(), path);
        let pack = yaml::parse(path, &file.text, ctx.diags).and_then(|root| decode_pack(&mut ctx, &name, &root));
        packs.insert(name, pack.map(std::sync::Arc::new));
    }
    packs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diag::Diagnostics;

    fn pack(text: &str) -> (Option<PromptPack>, Vec<String>) {
        let mut diags = Diagnostics::default();
        let path = std::path::Path::new("p.yaml");
        let root = yaml::parse(path, text, &mut diags).unwrap();
        let mut ctx = Ctx { path, diags: &mut diags };
        let pack = decode_pack(&mut ctx, "p", &root);
        (pack, diags.into_vec().iter().map(ToString::to_string).collect())
    }

    #[test]
    fn the_four_paths_resolve_as_the_spec_says() {
        let (p, _) = pack("host: H\nroles: {classify: 'C {{ host }}'}\nrules: [r1]\n");
        let p = p.unwrap();
        assert_eq!(p.resolve_workflow_stage(LlmRole::Classify).text, "C H");
        assert_eq!(p.resolve_workflow_stage(LlmRole::Synthesis).source, PromptSource::Host);
        assert_eq!(p.resolve_manifest_stage(LlmRole::Synthesis).source, PromptSource::Empty);
        assert_eq!(p.resolve_manifest_stage(LlmRole::None).source, PromptSource::NotApplicable);
        assert_eq!(p.resolve_appended_synthesis().source, PromptSource::Host);
        let agent = p.resolve_agent("- t");
        assert_eq!(
            (agent.source, agent.text.as_str()),
            (
                PromptSource::BuiltinAgentWrapper,
                "H\n\n- r1\n\nYou decide the next step of the task. Either call one tool, ask the user one question, or finish with the answer.\n\nTools:\n- t"
            )
        );
        let (empty, _) = pack("description: nothing\n");
        assert_eq!(empty.unwrap().resolve_appended_synthesis().text, BUILTIN_SYNTHESIS_PROMPT);
        assert_eq!(ResolvedPrompt { text: " ".into(), source: PromptSource::Empty }.system_text(), DEFAULT_SYSTEM_TEXT);
    }

    #[test]
    fn placeholders_are_checked_and_filled() {
        let (p, diags) = pack("host: H\nroles: {classify: '{{hots}}'}\n");
        assert!(p.is_none());
        assert!(diags[0].contains("unknown placeholder `{{hots}}`"), "{diags:?}");
        let (p, diags) = pack("host: H\nagent: 'Only {{tools}}'\n");
        assert!(diags[0].contains("warning: `agent` does not use {{host}}"), "{diags:?}");
        let text = p.unwrap().resolve_agent("- t").text;
        assert_eq!(text, "H\n\nOnly - t");
        let (p, _) = pack("host: H\nrules: [a, b]\nsynthesis: '{{rules}}|{{ host }}|x'\n");
        assert_eq!(p.unwrap().resolve_appended_synthesis().text, "- a\n- b|H|x");
        let (p, diags) = pack("host: H\nsynthesis: '{{ host'\n");
        assert!(p.is_none() && diags[0].contains("unclosed"), "{diags:?}");
    }
}
