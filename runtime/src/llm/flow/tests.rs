//! The gate on tokio's paused clock: counts, not timings.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::gate::{FIRST_BACKOFF, FLOOR};
use super::*;
use crate::llm::Wait;

fn gate(limits: Limits) -> Arc<Gate> {
    Gate::new("openai:m".into(), limits, DEFAULT_MAX_PAUSE, None)
}

fn hint(s: u64) -> Option<Wait> {
    Some(Wait { after: Duration::from_secs(s), from: "retry-after" })
}

const LONG: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn concurrency_holds_and_waiters_go_as_permits_come_back() {
    let g = gate(Limits { max_concurrency: Some(2), ..Limits::default() });
    let (a, w) = g.acquire("r", 0, 1, LONG).await.unwrap();
    assert!(w.is_none());
    let (_b, _) = g.acquire("r", 0, 1, LONG).await.unwrap();
    let g2 = g.clone();
    let third = tokio::spawn(async move { g2.acquire("r", 0, 1, LONG).await.map(|(_, w)| w) });
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(g.status().in_flight, 2);
    assert_eq!(g.status().waiting.get("r"), Some(&1));
    drop(a);
    let waited = third.await.unwrap().unwrap().unwrap();
    assert_eq!(waited.0, Held::Concurrency);
    assert_eq!(g.status().in_flight, 1, "the third's permit was dropped with its task");
}

#[tokio::test(start_paused = true)]
async fn rpm_lets_one_seconds_share_through_then_spreads_the_rest() {
    // 120 a minute: two a second, a burst of two.
    let g = gate(Limits { rpm: Some(120), ..Limits::default() });
    let start = Instant::now();
    let mut times = Vec::new();
    for _ in 0..8 {
        let (p, _) = g.acquire("r", 0, 1, LONG).await.unwrap();
        times.push(start.elapsed());
        drop(p);
    }
    assert!(times[1] < Duration::from_millis(10), "the burst: {times:?}");
    // The 8th call: 2 at once, then 6 more at 2 a second.
    assert!(times[7] >= Duration::from_millis(2990) && times[7] < Duration::from_millis(3200), "{times:?}");
    let in_first_second = times.iter().filter(|t| **t < Duration::from_secs(1)).count();
    assert!(in_first_second <= 3, "{times:?}");
}

#[tokio::test(start_paused = true)]
async fn tpm_takes_the_estimate_and_the_reply_corrects_it() {
    // 6000 a minute: 100 a second, the bucket holds 100.
    let g = gate(Limits { tpm: Some(6000), ..Limits::default() });
    let (mut p, _) = g.acquire("r", 0, 100, LONG).await.unwrap();
    p.used(10); // the reply used far fewer: 90 come back
    drop(p);
    let start = Instant::now();
    let (_p, w) = g.acquire("r", 0, 90, LONG).await.unwrap();
    assert!(w.is_none() && start.elapsed().is_zero(), "the correction gave the room back");
    let (_q, w) = g.acquire("r", 0, 50, LONG).await.unwrap();
    assert_eq!(w.map(|w| w.0), Some(Held::Tpm));
    assert!(start.elapsed() >= Duration::from_millis(400), "{:?}", start.elapsed());
}

#[tokio::test(start_paused = true)]
async fn a_429_pauses_every_call_for_its_hint_and_backs_off_without_one() {
    let g = gate(Limits::default());
    assert_eq!(g.rate_limited(hint(2)), Pause { length: Duration::from_secs(2), refused: None });
    let start = Instant::now();
    let (_p, w) = g.acquire("r", 0, 1, LONG).await.unwrap();
    assert_eq!(w.map(|w| w.0), Some(Held::Paused));
    assert!(start.elapsed() >= Duration::from_secs(2));
    assert_eq!(g.rate_limited(None).length, FIRST_BACKOFF);
    assert_eq!(g.rate_limited(None).length, FIRST_BACKOFF * 2);
    g.succeeded();
    assert_eq!(g.rate_limited(None).length, FIRST_BACKOFF, "a success starts the backoff again");
    assert_eq!(g.status().rate_limited, 4);
}

#[tokio::test(start_paused = true)]
async fn a_named_wait_past_the_longest_pause_is_refused_and_pauses_only_that_long() {
    let g = Gate::new("openai:m".into(), Limits::default(), Duration::from_secs(5), None);
    let p = g.rate_limited(hint(86_400));
    assert_eq!(p, Pause { length: Duration::from_secs(5), refused: hint(86_400) });
    let start = Instant::now();
    let (_p, w) = g.acquire("r", 0, 1, LONG).await.unwrap();
    assert_eq!(w.map(|w| w.0), Some(Held::Paused));
    assert!(start.elapsed() <= Duration::from_secs(5) + Duration::from_millis(10), "{:?}", start.elapsed());
    // The backoff without a hint is bounded the same way, and so is a fleet's pause.
    for _ in 0..10 {
        assert!(g.rate_limited(None).length <= Duration::from_secs(5));
    }
    g.pause_from_fleet(Duration::from_secs(600));
    assert!(g.status().paused_for.unwrap() <= Duration::from_secs(5));
    // Zero: a named wait fails its call, and nothing pauses.
    let z = Gate::new("openai:m".into(), Limits::default(), Duration::ZERO, None);
    assert_eq!(z.rate_limited(hint(1)), Pause { length: Duration::ZERO, refused: hint(1) });
    let start = Instant::now();
    z.acquire("r", 0, 1, LONG).await.unwrap();
    assert!(start.elapsed().is_zero());
}

#[tokio::test(start_paused = true)]
async fn a_reply_claiming_absurd_usage_costs_at_most_a_minute_of_tokens() {
    // 6000 a minute: 100 a second.
    let g = gate(Limits { tpm: Some(6000), ..Limits::default() });
    let (mut p, _) = g.acquire("r", 0, 10, LONG).await.unwrap();
    p.used(u64::MAX);
    drop(p);
    let start = Instant::now();
    let (_p, w) = g.acquire("r", 0, 10, LONG).await.unwrap();
    assert_eq!(w.map(|w| w.0), Some(Held::Tpm));
    let waited = start.elapsed();
    assert!(waited >= Duration::from_secs(60) && waited <= Duration::from_secs(61), "one minute of debt, then room: {waited:?}");
    // A request estimated far past the bucket is bounded the same way.
    let g = gate(Limits { tpm: Some(6000), ..Limits::default() });
    drop(g.acquire("r", 0, 10_000_000_000, LONG).await.unwrap());
    let start = Instant::now();
    g.acquire("r", 0, 1, LONG).await.unwrap();
    assert!(start.elapsed() <= Duration::from_secs(61), "{:?}", start.elapsed());
}

/// Queues `(route, priority, count)` in that order behind a held one-call gate, lets it go, and
/// returns the routes in the order they were served.
async fn served_order(batches: &[(&'static str, u8, usize)]) -> Vec<&'static str> {
    let g = gate(Limits { max_concurrency: Some(1), ..Limits::default() });
    let (hold, _) = g.acquire("first", 0, 1, LONG).await.unwrap();
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for &(route, priority, n) in batches {
        for _ in 0..n {
            let (g, order) = (g.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let (p, _) = g.acquire(route, priority, 1, LONG).await.unwrap();
                order.lock().unwrap().push(route);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(p);
            }));
            tokio::task::yield_now().await;
        }
    }
    drop(hold);
    for t in tasks {
        t.await.unwrap();
    }
    order.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn routes_are_served_round_robin() {
    // 50 of X queue first, then 5 of Y.
    let order = served_order(&[("x", 0, 50), ("y", 0, 5)]).await;
    let last_y = order.iter().rposition(|r| *r == "y").unwrap();
    assert!(last_y < 12, "Y is served between X's calls, not after them: {order:?}");
}

#[tokio::test(start_paused = true)]
async fn higher_priority_goes_first_but_lower_still_advances() {
    let order = served_order(&[("low", 0, 20), ("high", 5, 20)]).await;
    let first: Vec<&str> = order.iter().take(FLOOR as usize * 3).copied().collect();
    let low = first.iter().filter(|r| **r == "low").count();
    assert!((2..=4).contains(&low), "one in {FLOOR} is low priority while high waits: {first:?}");
    assert_eq!(first[0], "high");
}

#[tokio::test(start_paused = true)]
async fn a_wait_past_the_limit_fails_with_what_held_it() {
    let g = gate(Limits { max_concurrency: Some(1), ..Limits::default() });
    let (_hold, _) = g.acquire("r", 0, 1, LONG).await.unwrap();
    let (held, waited) = g.acquire("r", 0, 1, Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(held, Held::Concurrency);
    assert!(waited >= Duration::from_secs(5));
    assert_eq!(g.status().waiting.values().sum::<u32>(), 0, "a waiter that gave up is not counted");
}

#[tokio::test(start_paused = true)]
async fn a_fleet_share_scales_the_limits() {
    let g = gate(Limits { max_concurrency: Some(4), rpm: Some(600), ..Limits::default() });
    g.set_granted(Some(1));
    let (_a, _) = g.acquire("r", 0, 1, LONG).await.unwrap();
    assert!(g.acquire("r", 0, 1, Duration::from_millis(100)).await.is_err(), "one unit: one call");
    g.set_granted(Some(2));
    assert!(g.acquire("r", 0, 1, Duration::from_millis(100)).await.is_ok());
    assert_eq!(g.status().share, 0.5);
    g.set_granted(Some(0));
    assert!(g.acquire("r", 0, 1, Duration::from_millis(100)).await.is_err(), "no share: no call");
}

/// A backend that answers 429 (with a hint) the first time, then succeeds.
#[derive(Debug, Default)]
struct Once429(AtomicU32);

impl Llm for Once429 {
    fn complete<'a>(&'a self, _req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(async move {
            if self.0.fetch_add(1, Ordering::SeqCst) == 0 {
                let mut e = LlmError::new(ReasonClass::RateLimited, "HTTP 429");
                e.retry_after = Some(Wait { after: Duration::from_secs(2), from: "retry-after" });
                return Err(e);
            }
            Ok(LlmReply { value: super::super::ReplyValue::Text("ok".into()), meta: Default::default(), raw: None, served_by: None })
        })
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "openai".into(), model: "m".into(), ..ModelInfo::default() }
    }
}

#[tokio::test(start_paused = true)]
async fn the_decorator_pauses_its_gate_on_a_429_and_says_what_held_a_call() {
    let flow = Flow::new(FlowPlan { default: Limits { max_concurrency: Some(1), ..Limits::default() }, ..FlowPlan::default() });
    let backend = Once429::default();
    let gate = flow.gate(&backend.info(), true).unwrap();
    let llm = FlowLlm::new(backend, Some(gate.clone()), Duration::from_secs(60));
    let sink = Arc::new(crate::events::MemorySink::default());
    let events = crate::events::RunEvents::new("run", "r", None, sink.clone());
    let (cx, never) = (opentelemetry::Context::current(), crate::cancel::Cancel::never());
    let output = crate::llm::OutputSpec::Text;
    let req = bare_request(&events, &output, &cx, &never);
    let e = llm.call(&req).await.unwrap_err();
    assert_eq!(e.class, ReasonClass::RateLimited);
    assert!(gate.status().paused_for.is_some());
    let mut pauses = flow.take_pauses().unwrap();
    assert_eq!(pauses.try_recv().unwrap().1, Duration::from_secs(2), "the fleet is told");
    let start = Instant::now();
    llm.call(&req).await.unwrap();
    assert!(start.elapsed() >= Duration::from_secs(2));
    let kinds: Vec<String> = sink.events().iter().map(|e| format!("{} {:?}", e.kind, e.data)).collect();
    assert!(kinds.iter().any(|e| e.contains("run.llm.waiting") && e.contains("\"paused\"")), "{kinds:?}");
    // No gate: calls pass straight through.
    assert!(flow.gate(&ModelInfo { provider: "stub".into(), model: "x".into(), ..ModelInfo::default() }, false).is_some(), "limits apply to all");
    let none = Flow::new(FlowPlan::default());
    assert!(none.gate(&ModelInfo::default(), false).is_none());
}

/// A backend that always answers 429 naming a wait of a day.
#[derive(Debug, Default)]
struct DayLong(AtomicU32);

impl Llm for DayLong {
    fn complete<'a>(&'a self, _req: &'a LlmRequest<'a>) -> BoxFuture<'a, Result<LlmReply, LlmError>> {
        Box::pin(async move {
            self.0.fetch_add(1, Ordering::SeqCst);
            let mut e = LlmError::new(ReasonClass::RateLimited, "HTTP 429 from openai");
            e.retry_after = Some(Wait { after: crate::llm::providers::MAX_RETRY_AFTER, from: "retry-after" });
            Err(e)
        })
    }

    fn info(&self) -> ModelInfo {
        ModelInfo { provider: "openai".into(), model: "m".into(), ..ModelInfo::default() }
    }
}

#[tokio::test(start_paused = true)]
async fn a_call_told_to_wait_past_the_longest_pause_fails_at_once_and_is_not_retried() {
    let flow = Flow::new(FlowPlan::default());
    let backend = DayLong::default();
    let gate = flow.gate(&backend.info(), true).unwrap();
    let policy = crate::llm::model::RetryPolicy { jitter_seed: Some(1), ..Default::default() };
    let llm = crate::llm::retry::RetryLlm::new(FlowLlm::new(backend, Some(gate.clone()), Duration::from_secs(300)), policy);
    let events = crate::events::RunEvents::new("run", "r", None, Arc::new(crate::events::MemorySink::default()));
    let (cx, never) = (opentelemetry::Context::current(), crate::cancel::Cancel::never());
    let output = crate::llm::OutputSpec::Text;
    let req = bare_request(&events, &output, &cx, &never);
    let start = Instant::now();
    let e = llm.call(&req).await.unwrap_err();
    assert!(start.elapsed().is_zero(), "failed at once: {:?}", start.elapsed());
    assert_eq!(e.class, ReasonClass::RateLimited);
    assert!(e.give_up);
    for part in ["openai:m asked to wait a day or more (retry-after)", "FABRIC_LLM_MAX_PAUSE_S", "60 s"] {
        assert!(e.message.contains(part), "{part}: {}", e.message);
    }
    assert_eq!(llm.info().model, "m");
    assert!(gate.status().paused_for.unwrap() <= DEFAULT_MAX_PAUSE, "the model pauses at most the longest pause");
}

/// A call of stage `s` of route `r` with empty texts.
fn bare_request<'a>(
    events: &'a crate::events::RunEvents,
    output: &'a crate::llm::OutputSpec,
    cx: &'a opentelemetry::Context,
    cancel: &'a crate::cancel::Cancel,
) -> LlmRequest<'a> {
    LlmRequest { events, route_id: "r", stage_id: "s", turn: 0, priority: 0, system: "", user: "", output, cx, cancel, stream: None }
}
