//! Decoding of a capability's `invoke: {a2a: URL, skill: ID, token_env: VAR, timeout_ms: N,
//! max_response_bytes: N}`: another agent as a tool, called over A2A (docs/a2a.md, "Calling other
//! agents"). The URL is a `${VAR}` template like an HTTP tool's; the token is named by the
//! variable that holds it, so no secret sits in a catalogue file.

use std::time::Duration;

use super::decode::{DEFAULT_MAX_RESPONSE_BYTES, url_template};
use crate::defs::A2aInvoke;
use crate::vocab::MAX_TOOL_TIMEOUT_MS;
use crate::yaml::{Ctx, Node, Value};

/// An agent's task takes longer than an HTTP tool's answer: a minute unless the catalogue says.
pub const DEFAULT_A2A_TIMEOUT_MS: u64 = 60_000;

/// Whether an `invoke` mapping names an agent (`a2a:`) rather than a URL or an MCP server.
pub(super) fn is_a2a_invoke(node: &Node) -> bool {
    matches!(&node.value, Value::Map(entries) if entries.iter().any(|(k, _)| k.name == "a2a"))
}

/// `invoke: {a2a: URL, skill: ID, token_env: VAR, timeout_ms: N, max_response_bytes: N}`.
pub(super) fn invoke(ctx: &mut Ctx<'_>, node: &Node) -> Option<A2aInvoke> {
    let mut f = ctx.map(node, "`invoke`")?;
    let url = f.require(ctx, "a2a").and_then(|n| url_template(ctx, n, "`invoke.a2a`"));
    let skill = f.require(ctx, "skill").and_then(|n| {
        let s = ctx.string(n, "`invoke.skill`")?;
        if s.trim().is_empty() {
            ctx.error(n.pos, "`invoke.skill` must name the agent's skill");
            return None;
        }
        Some(s)
    });
    let token_env = match f.get("token_env") {
        None => Some(None),
        Some(n) => ctx.string(n, "`invoke.token_env`").and_then(|s| {
            if super::mcp::env_name(&s) {
                Some(Some(s))
            } else {
                ctx.error(
                    n.pos,
                    format!("`invoke.token_env` `{s}` is not an environment variable name (name the variable that holds the token, not the token)"),
                );
                None
            }
        }),
    };
    let timeout_ms = f.get("timeout_ms").map_or(Some(DEFAULT_A2A_TIMEOUT_MS), |n| ctx.uint(n, "`invoke.timeout_ms`", 1, MAX_TOOL_TIMEOUT_MS));
    let max_bytes = f.get("max_response_bytes").map_or(Some(DEFAULT_MAX_RESPONSE_BYTES), |n| ctx.uint(n, "`invoke.max_response_bytes`", 1, 64 * 1024 * 1024));
    f.finish(ctx);
    Some(A2aInvoke { url: url?, skill: skill?, token_env: token_env?, timeout: Duration::from_millis(timeout_ms?), max_response_bytes: max_bytes? as usize })
}
