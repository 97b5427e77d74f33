//! Decoding of the catalogue's MCP keys: the `mcp_servers` section (stdio `command`/`env`, or
//! Streamable HTTP `url`/`headers`, every string a `${VAR}` template), a capability's
//! `invoke: {mcp, tool, timeout_ms}`, and a decision loop's `tools_from` with `only`.

use std::time::Duration;

use super::decode::{reference, template, url_template};
use crate::defs::*;
use crate::vocab::{DEFAULT_TOOL_TIMEOUT_MS, MAX_TOOL_TIMEOUT_MS};
use crate::yaml::{Ctx, Fields, Node, Value};

/// Whether an `invoke` mapping names an MCP server (`mcp:`) rather than a URL.
pub(super) fn is_mcp_invoke(node: &Node) -> bool {
    matches!(&node.value, Value::Map(entries) if entries.iter().any(|(k, _)| k.name == "mcp"))
}

/// `invoke: {mcp: SERVER, tool: TOOL, timeout_ms: N}`.
pub(super) fn invoke(ctx: &mut Ctx<'_>, node: &Node) -> Option<McpInvoke> {
    let mut f = ctx.map(node, "`invoke`")?;
    let server = f.require(ctx, "mcp").and_then(|n| reference(ctx, n, "`invoke.mcp`"));
    let tool = f.require(ctx, "tool").and_then(|n| tool_name(ctx, n, "`invoke.tool`"));
    let timeout_ms = f.get("timeout_ms").map_or(Some(DEFAULT_TOOL_TIMEOUT_MS), |n| ctx.uint(n, "`invoke.timeout_ms`", 1, MAX_TOOL_TIMEOUT_MS));
    f.finish(ctx);
    Some(McpInvoke { server: server?, tool: tool?, timeout: Duration::from_millis(timeout_ms?) })
}

/// An MCP tool's name: any non-empty string (servers name tools as they like; the catalogue
/// only has to match them).
fn tool_name(ctx: &mut Ctx<'_>, node: &Node, what: &str) -> Option<Ref> {
    let name = ctx.string(node, what)?;
    if name.is_empty() {
        ctx.error(node.pos, format!("{what} must not be empty"));
        return None;
    }
    Some(Ref { name, pos: node.pos })
}

/// `tools_from: SERVER` and `only: [TOOL, ...]` of a decision loop.
pub(super) fn tools_from(ctx: &mut Ctx<'_>, f: &mut Fields<'_>, key: &str) -> Option<ToolsFrom> {
    let server = f.get("tools_from").and_then(|n| reference(ctx, n, &format!("`{key}.tools_from`")));
    let only = f.get("only").map(|n| (n, ctx.seq(n, &format!("`{key}.only`"))));
    match (server, only) {
        (Some(server), only) => {
            let only = only.and_then(|(_, items)| items).map(|items| items.iter().filter_map(|i| tool_name(ctx, i, "a tool name")).collect());
            Some(ToolsFrom { server, only })
        }
        (None, Some((n, _))) => {
            ctx.error(n.pos, format!("`{key}.only` picks tools of `tools_from`, which is missing"));
            None
        }
        (None, None) => None,
    }
}

/// A `{NAME: TEMPLATE}` mapping (`env`, `headers`), keys checked as `check` says.
fn pairs(ctx: &mut Ctx<'_>, node: &Node, what: &str, check: fn(&str) -> bool) -> Vec<(String, UrlTemplate)> {
    let mut out = Vec::new();
    let Value::Map(entries) = &node.value else {
        ctx.error(node.pos, format!("{what} must be a mapping, found {}", node.value.kind()));
        return out;
    };
    for (key, value) in entries {
        if !check(&key.name) {
            ctx.error(key.pos, format!("{what} key `{}` is not a valid name", key.name));
            continue;
        }
        if let Some(t) = template(ctx, value, &format!("{what}.{}", key.name)) {
            out.push((key.name.clone(), t));
        }
    }
    out
}

pub(super) fn env_name(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && !s.starts_with(|c: char| c.is_ascii_digit())
}

fn header_name(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// One server of `mcp_servers`: `{command: [...], env: {...}}` or `{url: ..., headers: {...}}`.
pub fn server(ctx: &mut Ctx<'_>, name: &str, node: &Node, origin: Origin) -> Option<McpServerDef> {
    let what = format!("MCP server `{name}`");
    let mut f = ctx.map(node, &what)?;
    let command = f.get("command");
    let url = f.get("url");
    let transport = match (command, url) {
        (Some(c), None) => {
            let items = ctx.seq(c, "`command`")?;
            if items.is_empty() {
                ctx.error(c.pos, "`command` must name a program");
                return None;
            }
            let command: Vec<UrlTemplate> = items.iter().filter_map(|i| template(ctx, i, "`command`")).collect();
            let env = f.get("env").map(|n| pairs(ctx, n, "`env`", env_name)).unwrap_or_default();
            (command.len() == items.len()).then_some(McpTransportDef::Stdio { command, env })
        }
        (None, Some(u)) => {
            let url = url_template(ctx, u, "`url`");
            let headers = f.get("headers").map(|n| pairs(ctx, n, "`headers`", header_name)).unwrap_or_default();
            url.map(|url| McpTransportDef::Http { url, headers })
        }
        (Some(_), Some(u)) => {
            ctx.error(u.pos, format!("{what} has both `command` (stdio) and `url` (Streamable HTTP); pick one"));
            None
        }
        (None, None) => {
            ctx.error(f.pos, format!("{what} needs `command` (stdio) or `url` (Streamable HTTP)"));
            None
        }
    };
    f.finish(ctx);
    Some(McpServerDef { origin, transport: transport? })
}
