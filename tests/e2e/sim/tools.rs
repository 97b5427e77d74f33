//! The tools of the simulation: in-process tools (the `Tool` port) and HTTP tools (the
//! `HttpPort`, so no socket is opened), each answering from the seed, with the tool faults:
//! latency, hanging (past the call's timeout), a failure, a reset connection, 429 and 5xx, a
//! truncated body, invalid JSON.

use std::sync::Arc;
use std::time::Duration;

use fabric::defs::Invoke;
use fabric::failure::{BoxFuture, ReasonClass};
use fabric::tools::{HttpPort, Tool, ToolError, ToolFailure, ToolOutput};
use serde_json::{Map, Value, json};

use super::faults::Faults;
use super::trace::Trace;

#[derive(Debug, Clone, Copy)]
enum Fault {
    Latency,
    Hang,
    Failure,
    Reset,
    RateLimited,
    ServerError,
    Truncated,
    InvalidJson,
}

const FAULTS: [Fault; 8] =
    [Fault::Latency, Fault::Hang, Fault::Failure, Fault::Reset, Fault::RateLimited, Fault::ServerError, Fault::Truncated, Fault::InvalidJson];

fn answer(faults: &Faults, site: &str, args: &Map<String, Value>) -> Value {
    json!({"result": format!("sim {}", faults.pick(&format!("{site}:answer"), 1000)), "args": args.len()})
}

/// An in-process tool named `name`.
pub struct SimTool {
    pub name: String,
    pub faults: Arc<Faults>,
    pub trace: Arc<Trace>,
}

impl Tool for SimTool {
    fn call<'a>(&'a self, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<Value, ToolFailure>> {
        Box::pin(async move {
            let site = format!("tool:{}", self.name);
            let fault = self.faults.fault(&site, self.faults.rates.tool, &FAULTS);
            self.trace.log(format!("tool {}: {fault:?}", self.name));
            match fault {
                Some(Fault::Latency) => tokio::time::sleep(Duration::from_millis(100 + self.faults.pick(&site, 3000) as u64)).await,
                // The executor's timeout ends it (FABRIC_TOOL_TIMEOUT_MS).
                Some(Fault::Hang) => std::future::pending::<()>().await,
                Some(Fault::Failure | Fault::Reset | Fault::RateLimited | Fault::ServerError) => return Err(ToolFailure::from("sim: the tool failed")),
                Some(Fault::Truncated | Fault::InvalidJson) => return Ok(Value::String("{\"cut".into())),
                None => {}
            }
            Ok(answer(&self.faults, &site, args))
        })
    }
}

/// Every HTTP tool call.
pub struct SimHttp {
    pub faults: Arc<Faults>,
    pub trace: Arc<Trace>,
}

impl HttpPort for SimHttp {
    fn call<'a>(&'a self, invoke: &'a Invoke, url: &'a str, args: &'a Map<String, Value>) -> BoxFuture<'a, Result<ToolOutput, ToolError>> {
        Box::pin(async move {
            // The site is the URL's path (its query may carry a secret: never in the trace).
            let path = url.split('?').next().unwrap_or_default().rsplit('/').next().unwrap_or_default().to_owned();
            let site = format!("http:{path}");
            let fault = self.faults.fault(&site, self.faults.rates.tool, &FAULTS);
            self.trace.log(format!("http {path}: {fault:?}"));
            let err = |class, message: &str| Err(ToolError { class, message: message.to_owned() });
            let out = |status: u16, text: String| Ok(ToolOutput { status, bytes: text.len(), text, duration: Duration::ZERO });
            match fault {
                Some(Fault::Latency) => tokio::time::sleep(Duration::from_millis(100 + self.faults.pick(&site, 3000) as u64)).await,
                Some(Fault::Hang) => {
                    // The real port gives up at the tool's timeout.
                    tokio::time::sleep(invoke.timeout).await;
                    return err(ReasonClass::ToolTimeout, "sim: the tool did not answer in time");
                }
                Some(Fault::Failure | Fault::Reset) => return err(ReasonClass::ToolConnection, "sim: connection reset by peer"),
                Some(Fault::RateLimited) => return err(ReasonClass::ToolHttpStatus, "sim: HTTP 429"),
                Some(Fault::ServerError) => return err(ReasonClass::ToolHttpStatus, "sim: HTTP 503"),
                Some(Fault::Truncated) => return out(200, "{\"result\": \"cu".into()),
                Some(Fault::InvalidJson) => return out(200, "not json".into()),
                None => {}
            }
            out(200, answer(&self.faults, &site, args).to_string())
        })
    }
}
