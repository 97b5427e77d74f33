//! The chain against scripted in-process models: which failures move on, what is said, what the
//! breaker skips. (The real providers' forms of the schema: `tests/e2e/fallbacks.rs`.)

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Duration;

use super::*;
use crate::events::{EventKind, MemorySink, RunEvents};
use crate::llm::flow::{BreakerPolicy, BreakerState, Flow, FlowPlan};
use crate::llm::{OutputSpec, ReplyValue};

/// A model that answers from a script (`Ok(text)` or an error), then `ok` for ever; counts calls.
struct Scripted {
    model: &'static str,
    script: Mutex<VecDeque<Result<&'static str, LlmError>>>,
    calls: Mutex<u32>,
}

impl Scripted {
    fn new(model: &'static str, script: Vec<Result<&'static str, LlmError>>) -> Arc<Scripted> {
        Arc::new(Scripted { model, script: Mutex::new(script.into()), calls: Mutex::new(0) })
    }

    fn calls(&self) -> u32 {
        *self.calls.lock().unwrap()
    }
}

impl Llm for Scripted {
    fn complete<'a>(&'a self, _req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        *self.calls.lock().unwrap() += 1;
        let next = self.script.lock().unwrap().pop_front().unwrap_or(Ok("ok"));
        Box::pin(async move { next.map(|t| LlmReply { value: ReplyValue::Text(t.into()), meta: Default::default(), raw: None, served_by: None }) })
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "p".into(), model: self.model.into(), ..ModelInfo::default() }
    }
}

fn member(flow: &Flow, m: &Arc<Scripted>) -> Member {
    let key = format!("p:{}", m.model);
    Member { key: key.as_str().into(), llm: m.clone(), gate: None, breaker: flow.breaker(&key) }
}

fn flow(failures: u32) -> Arc<Flow> {
    Flow::new(FlowPlan { breaker: BreakerPolicy { failures, cooldown: Duration::from_secs(10) }, ..FlowPlan::default() })
}

/// One call of `llm`; its result and the `run.llm.fallback` events as `from>to:reason:class`.
async fn call(llm: &FallbackLlm) -> (Result<LlmReply, LlmError>, Vec<String>) {
    let sink = Arc::new(MemorySink::default());
    let events = RunEvents::new("run", "r", None, sink.clone());
    let (cx, never, output) = (opentelemetry::Context::current(), crate::cancel::Cancel::never(), OutputSpec::Text);
    let req = LlmRequest {
        events: &events,
        route_id: "r",
        stage_id: "s",
        turn: 0,
        priority: 0,
        system: "",
        user: "",
        output: &output,
        cx: &cx,
        cancel: &never,
        stream: None,
    };
    let result = llm.complete(&req).await;
    let said = sink
        .events()
        .iter()
        .filter(|e| e.kind == EventKind::LlmFallback)
        .map(|e| match &e.data {
            EventData::LlmFallback { from, to, reason, reason_class } => format!("{from}>{to}:{reason}:{reason_class}"),
            _ => unreachable!(),
        })
        .collect();
    (result, said)
}

fn error(class: ReasonClass) -> LlmError {
    LlmError::new(class, "scripted")
}

#[tokio::test]
async fn each_reason_moves_on_exactly_as_documented() {
    let cases: Vec<(LlmError, bool, Option<&str>)> = vec![
        (error(ReasonClass::ServerError), false, Some("unavailable:server_error")),
        (error(ReasonClass::Connection), false, Some("unavailable:connection")),
        (error(ReasonClass::RateLimited), false, Some("rate_limited:rate_limited")),
        (error(ReasonClass::Timeout), false, Some("timeout:timeout")),
        (error(ReasonClass::ClientError).refusing(Refused::Auth), false, Some("auth:client_error")),
        (error(ReasonClass::ProviderError).refusing(Refused::Content), false, Some("refused:provider_error")),
        (error(ReasonClass::SchemaValidation), true, Some("invalid:schema_validation")),
        (error(ReasonClass::InvalidJson), true, Some("invalid:invalid_json")),
        // Never: what another model cannot fix, or what the profile did not ask for.
        (error(ReasonClass::SchemaValidation), false, None),
        (error(ReasonClass::ClientError), true, None),
        (error(ReasonClass::ProviderError), true, None),
        (error(ReasonClass::Interrupted), true, None),
        (error(ReasonClass::Cancelled), true, None),
        (error(ReasonClass::StubScriptExhausted), true, None),
    ];
    for (e, on_invalid, moves) in cases {
        let flow = flow(100);
        let (a, b) = (Scripted::new("a", vec![Err(e.clone())]), Scripted::new("b", vec![]));
        let chain = FallbackLlm::new(member(&flow, &a), vec![member(&flow, &b)], ChainPolicy { on_invalid, prefer_available: false });
        let (result, said) = call(&chain).await;
        match moves {
            Some(why) => {
                assert_eq!(said, [format!("p:a>p:b:{why}")], "{e:?}");
                assert_eq!(result.unwrap().served_by.as_deref(), Some("p:b"));
                assert_eq!(b.calls(), 1);
            }
            None => {
                assert!(said.is_empty(), "{e:?}: {said:?}");
                assert_eq!(result.unwrap_err().class, e.class);
                assert_eq!(b.calls(), 0, "{e:?}");
            }
        }
    }
}

#[tokio::test]
async fn the_last_error_is_the_chains_and_the_first_model_that_answers_is_named() {
    let flow = flow(100);
    let (a, b, c) = (
        Scripted::new("a", vec![Err(error(ReasonClass::Timeout))]),
        Scripted::new("b", vec![Err(error(ReasonClass::ServerError))]),
        Scripted::new("c", vec![]),
    );
    let chain = FallbackLlm::new(member(&flow, &a), vec![member(&flow, &b), member(&flow, &c)], ChainPolicy::default());
    let (result, said) = call(&chain).await;
    assert_eq!(said, ["p:a>p:b:timeout:timeout", "p:b>p:c:unavailable:server_error"]);
    assert_eq!(result.unwrap().served_by.as_deref(), Some("p:c"));
    let all_down = FallbackLlm::new(
        member(&flow, &Scripted::new("d", vec![Err(error(ReasonClass::Timeout))])),
        vec![member(&flow, &Scripted::new("e", vec![Err(error(ReasonClass::ServerError))]))],
        ChainPolicy::default(),
    );
    assert_eq!(call(&all_down).await.0.unwrap_err().class, ReasonClass::ServerError, "the last model's error");
}

#[tokio::test(start_paused = true)]
async fn an_open_breaker_skips_its_model_until_the_cooldown_then_one_call_tries_it() {
    let flow = flow(2);
    let down = Scripted::new("a", (0..4).map(|_| Err(error(ReasonClass::ServerError))).collect());
    let backup = Scripted::new("b", vec![]);
    let chain = FallbackLlm::new(member(&flow, &down), vec![member(&flow, &backup)], ChainPolicy::default());
    for _ in 0..2 {
        assert_eq!(call(&chain).await.1, ["p:a>p:b:unavailable:server_error"]);
    }
    // Open: the model is not asked.
    for _ in 0..5 {
        let (result, said) = call(&chain).await;
        assert_eq!(said, ["p:a>p:b:circuit_open:server_error"]);
        assert!(result.is_ok());
    }
    assert_eq!(down.calls(), 2);
    assert_eq!(flow.breaker("p:a").status().state, BreakerState::Open);
    tokio::time::advance(Duration::from_secs(11)).await;
    // Half-open: one trial, which fails (the script's third error): open again.
    assert_eq!(call(&chain).await.1, ["p:a>p:b:unavailable:server_error"]);
    assert_eq!(down.calls(), 3);
    assert_eq!(call(&chain).await.1, ["p:a>p:b:circuit_open:server_error"]);
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(call(&chain).await.1, ["p:a>p:b:unavailable:server_error"], "the fourth error: a failed trial");
    tokio::time::advance(Duration::from_secs(11)).await;
    let (result, said) = call(&chain).await;
    assert!(said.is_empty(), "recovered: {said:?}");
    assert_eq!(result.unwrap().served_by.as_deref(), Some("p:a"));
    assert_eq!(flow.breaker("p:a").status().state, BreakerState::Closed);
    // Content and validation failures say nothing of the model's health.
    let picky = Scripted::new("c", (0..5).map(|_| Err(error(ReasonClass::ProviderError).refusing(Refused::Content))).collect());
    let chain = FallbackLlm::new(member(&flow, &picky), vec![member(&flow, &backup)], ChainPolicy::default());
    for _ in 0..5 {
        assert_eq!(call(&chain).await.1, ["p:c>p:b:refused:provider_error"]);
    }
    assert_eq!(flow.breaker("p:c").status().state, BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn every_model_skipped_the_last_is_asked_anyway() {
    let flow = flow(1);
    let (a, b) = (Scripted::new("a", vec![Err(error(ReasonClass::Timeout))]), Scripted::new("b", vec![Err(error(ReasonClass::Timeout))]));
    let chain = FallbackLlm::new(member(&flow, &a), vec![member(&flow, &b)], ChainPolicy::default());
    assert!(call(&chain).await.0.is_err(), "both time out: both breakers open");
    let (result, said) = call(&chain).await;
    assert_eq!(said, ["p:a>p:b:circuit_open:timeout"]);
    assert_eq!(result.unwrap().served_by.as_deref(), Some("p:b"), "asked although open");
}

#[tokio::test(start_paused = true)]
async fn a_paused_model_is_skipped_only_when_the_profile_prefers_an_available_one() {
    for prefer_available in [false, true] {
        let flow = flow(100);
        let (a, b) = (Scripted::new("a", vec![]), Scripted::new("b", vec![]));
        let info = ModelInfo { provider: "p".into(), model: "a".into(), ..ModelInfo::default() };
        let gate = flow.gate(&info, true).unwrap();
        gate.rate_limited(Some(crate::llm::Wait { after: Duration::from_secs(30), from: "retry-after" }));
        let mut first = member(&flow, &a);
        first.gate = Some(gate);
        let chain = FallbackLlm::new(first, vec![member(&flow, &b)], ChainPolicy { on_invalid: false, prefer_available });
        let (result, said) = call(&chain).await;
        if prefer_available {
            assert_eq!(said, ["p:a>p:b:paused:rate_limited"]);
            assert_eq!(result.unwrap().served_by.as_deref(), Some("p:b"));
        } else {
            // (This model's own stack would wait at its gate; the scripted one answers.)
            assert!(said.is_empty());
            assert_eq!(a.calls(), 1);
        }
    }
}
