//! Tool calls: an HTTP tool through the [`HttpPort`](crate::tools::HttpPort), an in-process
//! [`Tool`](crate::tools::Tool) under its timeout, and a decision loop's call with its arguments
//! checked against the tool's input schema first; each with its events and `execute_tool` span.

use opentelemetry::trace::SpanKind;
use opentelemetry::{Context, KeyValue};
use serde_json::{Map, Value};

use super::Runner;
use super::state::{Run, StageFailure};
use crate::defs::{Invoke, McpInvoke};
use crate::events::{EventData, ToolStatus};
use crate::failure::ReasonClass;
use crate::hydrate::{BoundCapability, StageNode};
use crate::llm::telemetry::round_ms;
use crate::tools::{ToolError, display_url};

/// The `execute_tool {tool}` span of one tool call, under its stage's span. `tool_type` is the
/// GenAI convention's: `function` for an in-process tool, `extension` for an HTTP one.
pub(super) fn tool_span(cx: &Context, run_id: &str, tool: &str, tool_type: &'static str) -> Context {
    crate::otel::child(
        cx,
        || format!("execute_tool {tool}").into(),
        SpanKind::Internal,
        || {
            vec![
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", tool.to_owned()),
                KeyValue::new("gen_ai.tool.type", tool_type),
                KeyValue::new("fabric.run_id", run_id.to_owned()),
            ]
        },
    )
}

/// A tool call's answer, as its `run.tool.completed` tells it.
pub(super) struct Done {
    pub(super) text: String,
    pub(super) status: ToolStatus,
    pub(super) bytes: usize,
    pub(super) duration: std::time::Duration,
}

pub(super) fn interrupted(why: impl std::fmt::Display) -> ToolError {
    ToolError { class: ReasonClass::Interrupted, message: format!("the run was interrupted ({why})") }
}

/// The end of an HTTP or MCP tool call: its span closed, its `run.tool.completed` or
/// `run.tool.failed` (naming the MCP server, when it is one), the result or the stage's failure.
pub(super) fn end_call(
    run: &Run<'_>,
    stage: &StageNode,
    tool: &str,
    server: Option<&str>,
    span: &Context,
    outcome: Result<Done, ToolError>,
) -> Result<String, StageFailure> {
    if let Err(e) = &outcome {
        crate::otel::fail_cx(span, e.class.as_str());
    }
    crate::otel::end(span);
    let mcp_server = || server.map(str::to_owned);
    match outcome {
        Ok(done) => {
            run.events.emit(Some(stage.id()), || EventData::ToolCompleted {
                tool: tool.to_owned(),
                mcp_server: mcp_server(),
                status: done.status,
                bytes: done.bytes,
                duration_ms: round_ms(done.duration.as_secs_f64() * 1000.0),
            });
            Ok(done.text)
        }
        Err(e) => {
            run.events.emit(Some(stage.id()), || EventData::ToolFailed {
                tool: tool.to_owned(),
                mcp_server: mcp_server(),
                reason_class: e.class,
                message: e.message.clone(),
            });
            let of = server.map(|s| format!(" of MCP server `{s}`")).unwrap_or_default();
            Err(StageFailure::new(e.class, format!("tool `{tool}`{of}: {}", e.message)))
        }
    }
}

impl Runner {
    pub(super) fn tool_url<'s>(&self, stage: &'s StageNode) -> Option<(&'s Invoke, String)> {
        let invoke = stage.capability()?.def.invoke.as_ref()?;
        let url = invoke.url.resolve(&|v| (self.vars)(v))?;
        Some((invoke, url))
    }

    pub(super) async fn call_tool(
        &self,
        run: &Run<'_>,
        stage: &StageNode,
        invoke: &Invoke,
        url: &str,
        args: &Map<String, Value>,
        cx: &Context,
    ) -> Result<String, StageFailure> {
        let (events, cancel) = (run.events, run.cancel);
        let tool = stage.capability().map_or("", |c| c.name.as_str());
        events.emit(Some(stage.id()), || EventData::ToolStarted {
            tool: tool.to_owned(),
            mcp_server: None,
            method: invoke.method.as_str(),
            url: Some(display_url(url)),
        });
        // An HTTP tool runs here and calls out: an `extension` in the GenAI conventions.
        let span = tool_span(cx, events.run_id(), tool, "extension");
        let outcome = match cancel.race(self.http.call(invoke, url, args)).await {
            Ok(r) => r.map(|out| Done { text: out.text, status: ToolStatus::Http(out.status), bytes: out.bytes, duration: out.duration }),
            Err(why) => Err(interrupted(why)),
        };
        end_call(run, stage, tool, None, &span, outcome)
    }

    /// Calls a registered in-process tool, with the same events as an HTTP tool.
    pub(super) async fn call_in_process_tool(&self, run: &Run<'_>, stage: &StageNode, args: &Map<String, Value>, cx: &Context) -> Result<String, StageFailure> {
        let (events, cancel) = (run.events, run.cancel);
        let name = stage.capability().map_or(stage.id(), |c| c.name.as_str());
        let Some(tool) = self.tools.get(name) else {
            return Err(StageFailure::new(ReasonClass::ToolFailed, format!("tool `{name}` has no in-process implementation registered")));
        };
        events.emit(Some(stage.id()), || EventData::ToolStarted { tool: name.to_owned(), mcp_server: None, method: "in_process", url: None });
        let span = tool_span(cx, events.run_id(), name, "function");
        let started = events.stopwatch();
        let outcome = match cancel.race(tokio::time::timeout(self.tool_timeout, tool.call(args))).await {
            Ok(Ok(r)) => r.map_err(|failure| (ReasonClass::ToolFailed, failure.0)),
            Ok(Err(_)) => Err((ReasonClass::ToolTimeout, format!("no result within {} ms", self.tool_timeout.as_millis()))),
            Err(why) => Err((ReasonClass::Interrupted, format!("the run was interrupted ({why})"))),
        };
        if let Err((class, _)) = &outcome {
            crate::otel::fail_cx(&span, class.as_str());
        }
        crate::otel::end(&span);
        match outcome {
            Ok(value) => {
                let text = match value {
                    Value::String(s) => s,
                    other => other.to_string(),
                };
                events.emit(Some(stage.id()), || EventData::ToolCompleted {
                    tool: name.to_owned(),
                    mcp_server: None,
                    status: ToolStatus::InProcess,
                    bytes: text.len(),
                    duration_ms: round_ms(started.elapsed().as_secs_f64() * 1000.0),
                });
                Ok(text)
            }
            Err((class, message)) => {
                events.emit(Some(stage.id()), || EventData::ToolFailed {
                    tool: name.to_owned(),
                    mcp_server: None,
                    reason_class: class,
                    message: message.clone(),
                });
                Err(StageFailure::new(class, format!("tool `{name}`: {message}")))
            }
        }
    }

    /// Calls a tool of an MCP server through the [`McpPort`](crate::tools::mcp::McpPort), with
    /// the same events (naming the server too) and span as an HTTP tool.
    pub(super) async fn call_mcp_tool(
        &self,
        run: &Run<'_>,
        stage: &StageNode,
        mcp: &McpInvoke,
        args: &Map<String, Value>,
        cx: &Context,
    ) -> Result<String, StageFailure> {
        let (events, cancel) = (run.events, run.cancel);
        let name = stage.capability().map_or(stage.id(), |c| c.name.as_str());
        events.emit(Some(stage.id()), || EventData::ToolStarted { tool: name.to_owned(), mcp_server: Some(mcp.server.name.clone()), method: "mcp", url: None });
        // The server runs the tool outside this process: an `extension` in the GenAI conventions.
        let span = tool_span(cx, events.run_id(), name, "extension");
        let declared = self.catalogue.mcp_servers().get(&mcp.server.name);
        let outcome = match (&self.mcp, declared) {
            (None, _) | (_, None) => {
                Err(ToolError { class: ReasonClass::ToolConnection, message: format!("no MCP client in this runtime for server `{}`", mcp.server.name) })
            }
            (Some(port), Some(def)) => match cancel.race(port.call(&mcp.server.name, &def.transport, &mcp.tool.name, args, mcp.timeout)).await {
                Ok(r) => r.map(|out| Done { bytes: out.text.len(), text: out.text, status: ToolStatus::InProcess, duration: out.duration }),
                Err(why) => Err(interrupted(why)),
            },
        };
        end_call(run, stage, name, Some(&mcp.server.name), &span, outcome)
    }

    /// Checks a tool's arguments against its input schema, before anything is sent; a
    /// mismatch is `invalid_tool_arguments` (with its `run.tool.failed`).
    pub(super) fn check_args(&self, run: &Run<'_>, tool: &StageNode, cap: &BoundCapability, args: &Map<String, Value>) -> Result<(), StageFailure> {
        let Some(validator) = &cap.def.input_validator else { return Ok(()) };
        let problems = crate::defs::schema_problems(validator, &Value::Object(args.clone()));
        if problems.is_empty() {
            return Ok(());
        }
        let mcp_server = cap.def.mcp.as_ref().map(|m| m.server.name.clone());
        run.events.emit(Some(tool.id()), || EventData::ToolFailed {
            tool: cap.name.clone(),
            mcp_server,
            reason_class: ReasonClass::InvalidToolArguments,
            message: problems.join("; "),
        });
        Err(StageFailure::new(ReasonClass::InvalidToolArguments, format!("arguments do not match the input schema: {}", problems.join("; "))))
    }

    pub(super) async fn run_loop_tool(&self, run: &Run<'_>, tool: &StageNode, args: &Map<String, Value>, cx: &Context) -> Result<String, StageFailure> {
        let Some(cap) = &tool.capability() else { return Err(StageFailure::new(ReasonClass::UnknownTool, format!("tool `{}` has no capability", tool.id()))) };
        self.check_args(run, tool, cap, args)?;
        if let Some(mcp) = &cap.def.mcp {
            return self.call_mcp_tool(run, tool, mcp, args, cx).await;
        }
        if let Some(invoke) = &cap.def.invoke {
            return match self.tool_url(tool) {
                Some((invoke, url)) => self.call_tool(run, tool, invoke, &url, args, cx).await,
                None => Err(StageFailure::new(
                    ReasonClass::ToolConnection,
                    format!("the tool's URL `{}` is not configured (a variable in it is unset)", invoke.url.raw),
                )),
            };
        }
        self.call_in_process_tool(run, tool, args, cx).await
    }
}
