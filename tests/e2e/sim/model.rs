//! The model port of the simulation: the seeded stub's schema-derived replies (decisions drawn
//! from the seed: call a tool of the route, ask, or finish), with the provider's faults on top:
//! latency, a timeout, a reset connection, 429 with and without `Retry-After`, 5xx, a truncated
//! body, invalid JSON, a reply that breaks the schema, an unknown tool. Faulty reply texts go
//! through `finish_reply`, the path every real backend ends with.
//!
//! It also checks, on every call, that a recovered or continued run asks the model nothing its
//! journal already has.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use fabric::failure::{BoxFuture, ReasonClass};
use fabric::llm::stub::StubLlm;
use fabric::llm::{Llm, LlmError, LlmReply, LlmRequest, ModelInfo, OutputSpec, ReplyMeta, finish_reply};
use serde_json::json;

use super::faults::Faults;
use super::store::Shared;
use super::trace::Trace;

#[derive(Debug, Clone, Copy)]
enum Fault {
    Latency,
    Timeout,
    Reset,
    RateLimited,
    RateLimitedAfter,
    ServerError,
    Truncated,
    InvalidJson,
    SchemaViolation,
    UnknownTool,
}

const FAULTS: [Fault; 10] = [
    Fault::Latency,
    Fault::Timeout,
    Fault::Reset,
    Fault::RateLimited,
    Fault::RateLimitedAfter,
    Fault::ServerError,
    Fault::Truncated,
    Fault::InvalidJson,
    Fault::SchemaViolation,
    Fault::UnknownTool,
];

pub struct SimModel {
    /// The world's stub: its scripts answer the decision loops that have one.
    pub stub: StubLlm,
    /// The (route, stage)s the world scripted; other decision stages draw from the seed.
    pub scripted: HashSet<(String, String)>,
    pub faults: Arc<Faults>,
    pub trace: Arc<Trace>,
    /// What the processes share: the journals as recovered runs read them, the stopped segments.
    pub shared: Arc<Shared>,
}

impl SimModel {
    async fn attempt(&self, req: &LlmRequest<'_>) -> Result<LlmReply, LlmError> {
        let site = format!("llm:{}:{}", req.route_id, req.stage_id);
        let fault = self.faults.fault(&site, self.faults.rates.llm, &FAULTS);
        let meta = ReplyMeta::default();
        let err = |class, message: &str| Err(LlmError::new(class, message));
        match fault {
            Some(Fault::Latency) => tokio::time::sleep(Duration::from_millis(200 + self.faults.pick(&site, 5000) as u64)).await,
            Some(Fault::Timeout) => {
                tokio::time::sleep(Duration::from_secs(60)).await;
                return err(ReasonClass::Timeout, "sim: the provider did not answer within 60 s");
            }
            Some(Fault::Reset) => return err(ReasonClass::Connection, "sim: connection reset by peer"),
            Some(Fault::RateLimited) => return err(ReasonClass::RateLimited, "sim: HTTP 429"),
            Some(Fault::RateLimitedAfter) => {
                let mut e = LlmError::new(ReasonClass::RateLimited, "sim: HTTP 429, Retry-After: 3");
                e.retry_after = Some(fabric::llm::Wait { after: Duration::from_secs(3), from: "retry-after" });
                return Err(e);
            }
            Some(Fault::ServerError) => return err(ReasonClass::ServerError, "sim: HTTP 503"),
            Some(Fault::InvalidJson) => return finish_reply(req.output, "{\"cut".to_owned(), meta),
            Some(Fault::SchemaViolation) if matches!(req.output, OutputSpec::Bindable(_)) => return finish_reply(req.output, "[1, 2]".to_owned(), meta),
            Some(Fault::UnknownTool) if matches!(req.output, OutputSpec::Decision(_)) => {
                let raw = json!({"action": "tool_call", "tool_name": "sim_no_such_tool", "arguments": {}, "message": null});
                return finish_reply(req.output, raw.to_string(), meta);
            }
            _ => {}
        }
        let good = match self.decision(req, &site) {
            Some(raw) => raw,
            None => {
                let reply = self.stub.complete(req).await?;
                if !matches!(fault, Some(Fault::Truncated)) {
                    return Ok(reply);
                }
                reply.raw_text()
            }
        };
        match fault {
            Some(Fault::Truncated) => {
                let cut: String = good.chars().take(good.chars().count() / 2).collect();
                finish_reply(req.output, cut, meta)
            }
            _ => finish_reply(req.output, good, meta),
        }
    }

    /// A decision drawn from the seed (call a tool of the route, ask, or finish), for a
    /// decision stage; `None` for the others (the stub answers them).
    fn decision(&self, req: &LlmRequest<'_>, site: &str) -> Option<String> {
        let OutputSpec::Decision(spec) = req.output else { return None };
        if self.scripted.contains(&(req.route_id.to_owned(), req.stage_id.to_owned())) {
            return None;
        }
        let tools = spec.tools();
        let choice = self.faults.pick(&format!("{site}:decide"), 20);
        let decision = match choice {
            0..=8 if !tools.is_empty() => {
                let tool = &tools[self.faults.pick(&format!("{site}:tool"), tools.len())];
                json!({"action": "tool_call", "tool_name": tool, "arguments": {}, "message": null})
            }
            9..=11 => json!({"action": "ask", "tool_name": null, "arguments": {}, "message": format!("sim question {}", req.turn)}),
            _ => json!({"action": "done", "tool_name": null, "arguments": {}, "message": format!("sim answer {}", req.turn)}),
        };
        Some(decision.to_string())
    }
}

impl Llm for SimModel {
    fn complete<'a>(&'a self, req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(async move {
            let run_id = req.events.run_id().to_owned();
            self.shared.check_going_on(req.events.sink(), &format!("the model was asked for {} turn {}", req.stage_id, req.turn));
            let known = self.shared.recorded.lock().unwrap().get(&run_id).is_some_and(|r| r.contains(&(req.stage_id.to_owned(), req.turn)));
            if known {
                self.shared.violation(format!("run {run_id}: the model was asked again for {} turn {}, which its journal has", req.stage_id, req.turn));
            }
            let done = self.attempt(req).await;
            let class = done.as_ref().err().map(|e| e.class);
            self.trace.log(format!("llm {run_id} {}/{}: {}", req.stage_id, req.turn, class.map_or("ok", ReasonClass::as_str)));
            done
        })
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "sim".into(), model: "seeded".into(), ..Default::default() }
    }
}
