//! MCP tools in hydration: a capability's `invoke: {mcp, tool}` completed from its server's
//! `tools/list` (description and input schema, where the catalogue gives none), and a decision
//! loop's `tools_from` (with `only`) made into one capability per tool. Without the servers'
//! listings (a catalogue checked without `--connect`) only what the files say is checked.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use super::BoundCapability;
use crate::defs::*;
use crate::diag::{Diagnostic, Diagnostics};
use crate::loader::{Defs, known_names as names};
use crate::vocab::{DEFAULT_TOOL_TIMEOUT_MS, OutputSpec};

/// The tools a server's listing gives, or `None` (with the problem reported or inherited) when
/// the route cannot use the server; `Some(None)` when there is no listing to check against.
fn server_tools<'l>(
    defs: &Defs,
    listings: Option<&'l McpListings>,
    server: &Ref,
    path: &Path,
    diags: &mut Diagnostics,
    inherited: &mut Vec<Diagnostic>,
) -> Option<Option<&'l [McpToolDef]>> {
    match defs.mcp_servers.get(&server.name) {
        None => {
            diags.error(path, server.pos, format!("MCP server `{}` is not declared (mcp_servers: {})", server.name, names(defs.mcp_servers.keys())));
            return None;
        }
        Some(Err(o)) => {
            inherited.extend(o.problems.iter().cloned());
            return None;
        }
        Some(Ok(s)) if s.origin.is_broken() => {
            inherited.extend(s.origin.problems.iter().filter(|d| d.is_error()).cloned());
            return None;
        }
        Some(Ok(_)) => {}
    }
    match listings.map(|l| l.get(&server.name)) {
        None => Some(None),
        Some(Some(McpListing::Tools(tools))) => Some(Some(tools)),
        Some(Some(McpListing::Unavailable(why))) => {
            diags.error(path, server.pos, format!("MCP server `{}` could not list its tools: {why}", server.name));
            None
        }
        Some(None) => {
            diags.error(path, server.pos, format!("MCP server `{}` was not listed", server.name));
            None
        }
    }
}

fn missing_tool(server: &str, tool: &Ref, tools: &[McpToolDef]) -> String {
    let have: Vec<&String> = tools.iter().map(|t| &t.name).collect();
    format!("MCP server `{server}` has no tool `{}` (its tools: {})", tool.name, names(have.into_iter()))
}

fn validator(schema: &Value) -> Option<Arc<jsonschema::Validator>> {
    jsonschema::validator_for(schema).ok().map(Arc::new)
}

/// A capability as a route uses it: when it calls an MCP tool, with its server checked and its
/// description and input schema taken from the listing where the file gives none. `None` when
/// the route cannot use it (the problem reported or inherited).
pub(super) fn bind(
    defs: &Defs,
    listings: Option<&McpListings>,
    c: &Arc<CapabilityDef>,
    diags: &mut Diagnostics,
    inherited: &mut Vec<Diagnostic>,
) -> Option<Arc<CapabilityDef>> {
    let Some(mcp) = &c.mcp else { return Some(c.clone()) };
    let path = c.origin.path.clone();
    let tools = server_tools(defs, listings, &mcp.server, &path, diags, inherited)?;
    let Some(tools) = tools else { return Some(c.clone()) };
    let Some(tool) = tools.iter().find(|t| t.name == mcp.tool.name) else {
        diags.error(&path, mcp.tool.pos, missing_tool(&mcp.server.name, &mcp.tool, tools));
        return None;
    };
    if c.input_schema.is_some() && !c.description.is_empty() {
        return Some(c.clone());
    }
    let mut def = (**c).clone();
    if def.description.is_empty() {
        def.description.clone_from(&tool.description);
    }
    if def.input_schema.is_none() {
        def.input_validator = validator(&tool.input_schema);
        def.input_schema = Some(tool.input_schema.clone());
    }
    Some(Arc::new(def))
}

/// The tools of `tools_from` (all of the server's, or those of `only`, in its order), each a
/// capability named after the tool. `None` when the route cannot use the server.
pub(super) fn tools_from(
    defs: &Defs,
    listings: Option<&McpListings>,
    from: &ToolsFrom,
    path: &Path,
    diags: &mut Diagnostics,
    inherited: &mut Vec<Diagnostic>,
) -> Option<Vec<BoundCapability>> {
    let tools = server_tools(defs, listings, &from.server, path, diags, inherited)?;
    let origin = match defs.mcp_servers.get(&from.server.name) {
        Some(Ok(s)) => Origin { path: s.origin.path.clone(), pos: from.server.pos, problems: Vec::new() },
        _ => return None,
    };
    let bound = |name: &str, pos, description: &str, schema: Option<&Value>| BoundCapability {
        name: name.to_owned(),
        def: Arc::new(CapabilityDef {
            origin: Origin { pos, ..origin.clone() },
            description: description.to_owned(),
            input_schema: schema.cloned(),
            input_validator: schema.and_then(validator),
            output: OutputSpec::Text,
            invoke: None,
            mcp: Some(McpInvoke {
                server: from.server.clone(),
                tool: Ref { name: name.to_owned(), pos },
                timeout: std::time::Duration::from_millis(DEFAULT_TOOL_TIMEOUT_MS),
            }),
            a2a: None,
        }),
    };
    let Some(tools) = tools else {
        // Not connected: the tools `only` names, their schemas unknown.
        return Some(from.only.iter().flatten().map(|r| bound(&r.name, r.pos, "", None)).collect());
    };
    match &from.only {
        None => Some(tools.iter().map(|t| bound(&t.name, from.server.pos, &t.description, Some(&t.input_schema))).collect()),
        Some(only) => {
            let mut out = Vec::new();
            let mut ok = true;
            for r in only {
                match tools.iter().find(|t| t.name == r.name) {
                    Some(t) => out.push(bound(&t.name, r.pos, &t.description, Some(&t.input_schema))),
                    None => {
                        diags.error(path, r.pos, missing_tool(&from.server.name, r, tools));
                        ok = false;
                    }
                }
            }
            ok.then_some(out)
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::catalogue::{Catalogue, RouteEntry, SourceFile, load_from_texts_listed};
    use crate::defs::{McpListing, McpListings, McpToolDef};

    const BASE: &str = "profiles: {p: {}}\nmcp_servers:\n  kb: {command: [python3, server.py], env: {TOKEN: \"${KB_TOKEN}\"}}\n  web: {url: \"https://${KB_HOST}/mcp\", headers: {Authorization: \"Bearer ${KB_TOKEN}\"}}\ncapabilities:\n  status: {invoke: {mcp: kb, tool: lookup, timeout_ms: 500}}\n";

    fn load(routes: &str, listings: Option<&McpListings>) -> Catalogue {
        let files = [SourceFile { path: "r/a.yaml".into(), text: format!("{BASE}{routes}") }];
        load_from_texts_listed(&files, &[SourceFile { path: "packs/s.yaml".into(), text: "host: H\nagent: \"A {tools}\"\n".into() }], listings)
    }

    fn listings() -> McpListings {
        let tool = |name: &str| McpToolDef {
            name: name.into(),
            description: format!("{name} it"),
            input_schema: json!({"type": "object", "properties": {"q": {"type": "string"}}}),
        };
        McpListings::from([
            ("kb".to_owned(), McpListing::Tools(vec![tool("search"), tool("lookup")])),
            ("web".to_owned(), McpListing::Unavailable("refused".into())),
        ])
    }

    fn problems(cat: &Catalogue, id: &str) -> Vec<String> {
        match cat.get(id) {
            Some(RouteEntry::Broken(b)) => b.problems.iter().map(ToString::to_string).collect(),
            other => panic!("{id}: {other:?}"),
        }
    }

    const LOOP: &str = "routes:\n  r: {model_profile: p, prompt_pack: s, decision_loop: {tools: [status], tools_from: kb, only: [search, serch]}}\n";

    #[test]
    fn a_tool_the_server_lacks_is_located_once_listed() {
        let cat = load(LOOP, Some(&listings()));
        assert_eq!(problems(&cat, "r"), ["r/a.yaml:8:105: MCP server `kb` has no tool `serch` (its tools: search, lookup)"]);
        // Unlisted, only the files are checked: the tools `only` names.
        let cat = load(LOOP, None);
        let Some(RouteEntry::Ready(r)) = cat.get("r") else { panic!("{:?}", cat.diagnostics()) };
        assert_eq!(r.tools().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["status", "search", "serch"]);
    }

    #[test]
    fn listed_tools_take_the_server_s_description_and_schema() {
        let cat = load("routes:\n  r: {model_profile: p, prompt_pack: s, decision_loop: {tools: [status], tools_from: kb}}\n", Some(&listings()));
        let Some(RouteEntry::Ready(r)) = cat.get("r") else { panic!("{:?}", cat.diagnostics()) };
        let tools: Vec<_> = r.tools().collect();
        assert_eq!(tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["status", "search", "lookup"]);
        assert_eq!(tools[0].def.description, "lookup it");
        assert!(tools[0].def.input_validator.is_some());
        assert_eq!(tools[0].def.mcp.as_ref().map(|m| (m.server.name.as_str(), m.tool.name.as_str(), m.timeout.as_millis())), Some(("kb", "lookup", 500)));
        assert_eq!(tools[1].def.mcp.as_ref().map(|m| m.tool.name.as_str()), Some("search"));
    }

    #[test]
    fn an_unlisted_or_undeclared_server_breaks_the_routes_that_use_it() {
        let cat = load(
            "routes:\n  r: {model_profile: p, prompt_pack: s, decision_loop: {tools_from: web}}\n  u: {model_profile: p, prompt_pack: s, decision_loop: {tools_from: nope}}\n",
            Some(&listings()),
        );
        assert_eq!(problems(&cat, "r"), ["r/a.yaml:8:69: MCP server `web` could not list its tools: refused"]);
        assert_eq!(problems(&cat, "u"), ["r/a.yaml:9:69: MCP server `nope` is not declared (mcp_servers: kb, web)"]);
    }

    #[test]
    fn bad_server_declarations_are_located() {
        let files = [SourceFile {
            path: "r/b.yaml".into(),
            text: "mcp_servers:\n  both: {command: [x], url: \"http://h/mcp\"}\n  none: {}\n  bad: {command: [\"${A-B}\"]}\n  file: {url: \"file:///x\"}\n"
                .into(),
        }];
        let cat = load_from_texts_listed(&files, &[], None);
        let got: Vec<String> = cat.diagnostics().iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            [
                "r/b.yaml:2:29: MCP server `both` has both `command` (stdio) and `url` (Streamable HTTP); pick one",
                "r/b.yaml:3:9: MCP server `none` needs `command` (stdio) or `url` (Streamable HTTP)",
                "r/b.yaml:4:19: `command` names `${A-B}`, which is not an environment variable name",
                "r/b.yaml:5:15: `url` `file:///x` must start with http:// or https://",
            ]
        );
        assert!(cat.mcp_servers().is_empty());
    }
}
