//! The rmcp adapter: one MCP client session with a server, over stdio (a child process, the
//! only place the library starts a process) or Streamable HTTP. The rmcp types stay here: what
//! leaves is a [`Session`], its tools as [`McpToolDef`]s, a call's text or an [`McpError`].

use std::collections::HashMap;
use std::process::Stdio;

use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use serde_json::{Map, Value};
use tokio::io::AsyncBufReadExt;

use super::McpError;
use crate::defs::{McpToolDef, McpTransportDef};

/// How `${VAR}`s of a server's definition are resolved.
pub(super) type Vars<'a> = &'a (dyn Fn(&str) -> Option<String> + Send + Sync);

/// A connected client session.
pub(super) struct Session {
    service: RunningService<RoleClient, ()>,
}

/// Starts the server (stdio) or opens its session (HTTP), and initialises the protocol.
pub(super) async fn connect(server: &str, transport: &McpTransportDef, vars: Vars<'_>, max_bytes: usize) -> Result<Session, McpError> {
    let unset = |e: crate::defs::UnsetVar<'_>| McpError::Config(format!("MCP server `{server}`: {e}"));
    let service = match transport {
        McpTransportDef::Stdio { command, env } => {
            let mut words = Vec::with_capacity(command.len());
            for w in command {
                words.push(w.resolve_text(vars).map_err(unset)?);
            }
            let mut cmd = tokio::process::Command::new(&words[0]);
            cmd.args(&words[1..]).kill_on_drop(true);
            for (k, v) in env {
                cmd.env(k, v.resolve_text(vars).map_err(unset)?);
            }
            let (child, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| McpError::Connection(format!("MCP server `{server}` could not be started (`{}`): {e}", words[0])))?;
            if let Some(stderr) = stderr {
                let name = server.to_owned();
                // The server's own log, line by line, into ours (never onto our stdout/stderr).
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::debug!(target: "fabric::mcp", server = %name, "{line}");
                    }
                });
            }
            ().serve(child).await.map_err(|e| McpError::Connection(format!("MCP server `{server}` did not initialise: {e}")))?
        }
        McpTransportDef::Http { url, headers } => {
            let url = url.resolve_text(vars).map_err(unset)?;
            let mut map = HashMap::new();
            for (k, v) in headers {
                let value = v.resolve_text(vars).map_err(unset)?;
                let name =
                    reqwest::header::HeaderName::from_bytes(k.as_bytes()).map_err(|e| McpError::Config(format!("MCP server `{server}`: header `{k}`: {e}")))?;
                let value = reqwest::header::HeaderValue::from_str(&value)
                    .map_err(|_| McpError::Config(format!("MCP server `{server}`: header `{k}` has a value no header may carry")))?;
                map.insert(name, value);
            }
            let config = StreamableHttpClientTransportConfig::with_uri(url)
                .custom_headers(map)
                .reinit_on_expired_session(true)
                .max_json_response_size(max_bytes)
                .max_sse_event_size(max_bytes);
            let transport = StreamableHttpClientTransport::from_config(config);
            ().serve(transport).await.map_err(|e| McpError::Connection(format!("MCP server `{server}` did not initialise: {e}")))?
        }
    };
    Ok(Session { service })
}

impl Session {
    /// Whether the connection is gone (the process died, the transport closed).
    pub(super) fn is_closed(&self) -> bool {
        self.service.is_closed()
    }

    /// Every tool of the server (all pages of `tools/list`).
    pub(super) async fn list(&self) -> Result<Vec<McpToolDef>, McpError> {
        let tools = self.service.peer().list_all_tools().await.map_err(service_error)?;
        Ok(tools
            .into_iter()
            .map(|t| McpToolDef {
                name: t.name.into_owned(),
                description: t.description.map(|d| d.into_owned()).unwrap_or_default(),
                input_schema: Value::Object((*t.input_schema).clone()),
            })
            .collect())
    }

    /// One `tools/call`: `structuredContent` as compact JSON, else the text content; `isError`
    /// is the tool's failure in its own words.
    pub(super) async fn call(&self, tool: &str, args: &Map<String, Value>, max_bytes: usize) -> Result<String, McpError> {
        let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args.clone());
        let result = self.service.peer().call_tool(params).await.map_err(service_error)?;
        let text = result_text(&result);
        if text.len() > max_bytes {
            return Err(McpError::TooLarge(max_bytes));
        }
        if result.is_error == Some(true) {
            return Err(McpError::ToolError(if text.is_empty() { "the tool reported an error".into() } else { text }));
        }
        Ok(text)
    }

    /// Ends the session: a child process is stopped (killed as its transport is dropped).
    pub(super) fn close(&self) {
        self.service.cancellation_token().cancel();
    }
}

fn result_text(result: &CallToolResult) -> String {
    if let Some(structured) = &result.structured_content
        && !structured.is_null()
    {
        return structured.to_string();
    }
    let texts: Vec<&str> = result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect();
    texts.join("\n")
}

fn service_error(e: ServiceError) -> McpError {
    match e {
        ServiceError::McpError(data) => McpError::Protocol(format!("{} (code {})", data.message, data.code.0)),
        ServiceError::Timeout { .. } => McpError::Timeout,
        ServiceError::TransportClosed | ServiceError::TransportSend(_) => McpError::Connection(format!("the connection to the server is gone ({e})")),
        other => McpError::Protocol(other.to_string()),
    }
}
