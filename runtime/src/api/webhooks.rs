//! Completion webhooks: each replica's sender, and `GET /v1/runs/{run_id}/webhooks`.
//!
//! The store's outbox holds one delivery per end (or question) of a run accepted with a webhook
//! URL, written with the end itself. A replica's sender claims the due ones under its lease
//! (`FABRIC_RUN_LEASE_S`), posts each once, signed as Standard Webhooks says (its reference
//! library signs), and records the attempt: delivered on a 2xx answer; otherwise tried again after
//! the backoff, with the same `webhook-id`, until `FABRIC_WEBHOOK_MAX_ATTEMPTS`. Redirects are not
//! followed (the signed body is for the URL the run named). It wakes when a run ends here, and
//! every [`WEBHOOK_POLL`] for the rest: retries due, and what a replica that died left. A
//! delivery to an A2A push notification config is sent the same way, with A2A's body and the
//! config's headers ([`super::a2a::push_delivery`]).

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};

use super::body::{RunIdPath, no_run};
use super::{ApiError, AppState, ErrorBody, RUN_ID_PARAM, RunView, store_error};
use crate::config::WebhookSettings;
use crate::store::{Attempt, Delivery, DeliveryState};

/// How long one attempt may take, connection included; past it, the attempt failed.
pub const WEBHOOK_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a sender looks for due deliveries besides the ends of its own runs.
pub const WEBHOOK_POLL: Duration = Duration::from_secs(1);
/// Deliveries a replica sends at once.
const IN_FLIGHT: usize = 64;
/// Deliveries to one origin a replica sends at once: half of [`IN_FLIGHT`], so that a receiver
/// that never answers (each of its attempts held for [`WEBHOOK_TIMEOUT`]) leaves the other half
/// to every other receiver, while a fleet with one receiver still sends 32 at once, as before
/// this bound (issue 46). Claims are taken [`CLAIM_BATCH`] at a time, so an origin goes past it
/// by less than a batch.
const PER_ORIGIN: usize = 32;
/// Deliveries claimed at once.
const CLAIM_BATCH: usize = 8;
/// How much longer than an attempt's timeout a sender's claim on a delivery lasts, at least.
const WEBHOOK_LEASE_MARGIN: Duration = Duration::from_secs(10);

/// A delivery's body: `{type, timestamp, data}`, `data` the run as `GET /v1/runs/{id}` shows
/// it at that end or question.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookPayload {
    /// `run.completed`, `run.failed`, `run.cancelled` or `run.awaiting_input`.
    #[serde(rename = "type")]
    pub kind: String,
    /// When the run ended or asked (RFC 3339, UTC).
    pub timestamp: String,
    pub data: RunView,
}

/// One delivery of a run, as `GET /v1/runs/{run_id}/webhooks` lists it.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookView {
    /// The `webhook-id` header of every attempt (receivers drop duplicates by it).
    pub webhook_id: String,
    /// The payload's `type` (for an A2A push delivery, the state it tells: `run.running` is
    /// `working`).
    #[serde(rename = "type")]
    pub kind: String,
    /// Scheme, host, port and path (no credentials, no query).
    pub url: String,
    /// The A2A push notification config it goes to (its body is A2A's; docs/a2a.md), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a_push_config: Option<String>,
    pub state: DeliveryState,
    pub attempts: u32,
    /// The HTTP status of the last attempt's answer, if one came.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the run ended or asked.
    pub created_at: String,
    /// While pending: when the next attempt is due.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt_at: Option<String>,
    /// When it was delivered or given up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<String>,
}

/// A run's webhook deliveries.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WebhookList {
    pub webhooks: Vec<WebhookView>,
}

/// A run's webhook deliveries, oldest first: attempts, state, the last answer or error.
#[utoipa::path(get, path = "/v1/runs/{run_id}/webhooks", params(("run_id" = String, Path, description = RUN_ID_PARAM)),
    responses((status = 200, body = WebhookList), (status = 404, body = ErrorBody), (status = 400, description = "A path that does not parse", body = ErrorBody),
        (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)),
    security(("bearer" = [])))]
pub(super) async fn run_webhooks(State(state): State<AppState>, RunIdPath(run_id): RunIdPath) -> Result<Json<WebhookList>, ApiError> {
    let store = state.inner.durable.store();
    if store.get_run(run_id.as_str()).await.map_err(store_error)?.is_none() {
        return Err(no_run(run_id.as_str()));
    }
    let records = store.webhooks().deliveries(run_id.as_str()).await.map_err(store_error)?;
    let webhooks = records
        .into_iter()
        .map(|r| WebhookView {
            webhook_id: r.webhook_id,
            kind: format!("run.{}", r.status),
            url: crate::redact::origin_and_path(&r.url),
            a2a_push_config: r.push_config,
            state: r.state,
            attempts: r.attempts,
            last_status: r.last_status,
            last_error: r.last_error,
            created_at: r.at,
            next_attempt_at: r.next_attempt_ms.map(|ms| humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64)).to_string()),
            done_at: r.done_at,
        })
        .collect();
    Ok(Json(WebhookList { webhooks }))
}

/// What signs and sends.
struct Sender {
    client: reqwest::Client,
    signer: standardwebhooks::Webhook,
    settings: WebhookSettings,
    store: std::sync::Arc<dyn crate::store::RunStore>,
    /// This process, with the deliveries' lease: `FABRIC_RUN_LEASE_S`, but never shorter than
    /// an attempt may take (else a slow answer would be sent again by another replica before
    /// it is recorded).
    holder: crate::store::Holder,
    metrics: std::sync::Arc<super::Metrics>,
}

impl AppState {
    /// For ever, while webhooks are configured (a secret is set): claims due deliveries and
    /// sends them, at most [`IN_FLIGHT`] at once and [`PER_ORIGIN`] to one origin, each on its
    /// own (a slow receiver holds up only its own deliveries); it looks when a run ends here,
    /// when an attempt is done, and every [`WEBHOOK_POLL`].
    pub async fn deliver_webhooks(self) {
        let settings = self.inner.durable.runtime().settings().service.webhooks.clone();
        let Some(secret) = &settings.secret else { return };
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(WEBHOOK_TIMEOUT)
            .user_agent(concat!("fabric-runtime/", env!("CARGO_PKG_VERSION"), " (webhooks)"))
            // Receivers often close idle connections after a few seconds: one kept longer would
            // fail the next attempt at its first write.
            .pool_idle_timeout(Duration::from_secs(4))
            .build();
        let (client, signer) = match (client, standardwebhooks::Webhook::new(&secret.as_whsec())) {
            (Ok(c), Ok(s)) => (c, s),
            (Err(e), _) => return tracing::error!(error = %e.without_url(), "webhooks: the HTTP client could not be built; no webhook is sent"),
            (_, Err(_)) => return tracing::error!("webhooks: FABRIC_WEBHOOK_SECRET was refused by the signer; no webhook is sent"),
        };
        let store = self.inner.durable.store().clone();
        let mut holder = self.inner.durable.holder().clone();
        holder.lease = holder.lease.max(WEBHOOK_TIMEOUT + WEBHOOK_LEASE_MARGIN);
        let sender = std::sync::Arc::new(Sender { client, signer, settings, store, holder, metrics: self.inner.metrics.clone() });
        let mut in_flight = tokio::task::JoinSet::new();
        // Attempts in flight per origin; an origin's entry goes with its last attempt.
        let origins = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::<String, usize>::new()));
        loop {
            let room = IN_FLIGHT - in_flight.len();
            let mut claimed_all = false;
            if room > 0 && !self.inner.stopping.load(std::sync::atomic::Ordering::SeqCst) {
                let busy: Vec<String> =
                    origins.lock().unwrap_or_else(|p| p.into_inner()).iter().filter(|(_, n)| **n >= PER_ORIGIN).map(|(o, _)| o.clone()).collect();
                let batch = room.min(CLAIM_BATCH);
                match sender.store.webhooks().claim_deliveries(&sender.holder, batch, &busy).await {
                    Ok(due) => {
                        claimed_all = due.len() == batch;
                        for d in due {
                            let (sender, slot) = (sender.clone(), OriginSlot::take(&origins, origin_of(&d.url)));
                            in_flight.spawn(async move {
                                let _slot = slot;
                                sender.deliver(d).await
                            });
                        }
                    }
                    Err(e) => tracing::error!(error = %e, "run store: claiming webhook deliveries"),
                }
            }
            if claimed_all {
                // More may be due: claim again before waiting.
                continue;
            }
            tokio::select! {
                () = self.inner.webhook_wake.notified() => {}
                () = tokio::time::sleep(WEBHOOK_POLL) => {}
                Some(_) = in_flight.join_next(), if !in_flight.is_empty() => {}
            }
        }
    }

    /// Wakes this replica's sender: a run ended or asked here.
    pub(super) fn wake_webhooks(&self) {
        self.inner.webhook_wake.notify_one();
    }
}

/// The origin of a delivery's URL (`scheme://host[:port]`), as the claims skip it.
fn origin_of(url: &str) -> String {
    url::Url::parse(url).map_or_else(|_| url.to_owned(), |u| u.origin().ascii_serialization())
}

/// One attempt's place among its origin's; given back when the attempt's task ends, however.
struct OriginSlot {
    origins: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    origin: String,
}

impl OriginSlot {
    fn take(origins: &std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>, origin: String) -> OriginSlot {
        *origins.lock().unwrap_or_else(|p| p.into_inner()).entry(origin.clone()).or_default() += 1;
        OriginSlot { origins: origins.clone(), origin }
    }
}

impl Drop for OriginSlot {
    fn drop(&mut self) {
        let mut origins = self.origins.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = origins.get_mut(&self.origin) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                origins.remove(&self.origin);
            }
        }
    }
}

impl Sender {
    /// One attempt at `d`, recorded.
    async fn deliver(&self, d: Delivery) {
        let (attempt, outcome) = self.attempt(&d).await;
        self.metrics.webhook(outcome);
        match self.store.webhooks().record_attempt(&self.holder, d.id, &attempt).await {
            Ok(true) => {}
            // Its lease ran out and another sender took it, or an operator's `fabric runs prune`
            // deleted the ended run: this attempt is not the recorded one.
            Ok(false) => tracing::warn!(
                run_id = d.run.run_id,
                "webhook: this delivery was taken over by another sender (its lease ran out) or deleted meanwhile; this attempt is not recorded"
            ),
            Err(e) => tracing::error!(run_id = d.run.run_id, error = %e, "run store: recording a webhook attempt (it is sent again after the lease)"),
        }
    }

    /// One attempt at `d`, and its outcome's metric label.
    async fn attempt(&self, d: &Delivery) -> (Attempt, &'static str) {
        let id = d.webhook_id();
        let payload = WebhookPayload { kind: format!("run.{}", d.run.status.as_str()), timestamp: d.run.updated_at.clone(), data: RunView::of(d.run.clone()) };
        let made = d.attempts + 1;
        let failed = |status: Option<u16>, error: String| {
            let retry_in = (made < self.settings.max_attempts).then(|| self.settings.backoff(made, jitter()));
            let outcome = if retry_in.is_some() { "retrying" } else { "failed" };
            tracing::warn!(run_id = d.run.run_id, webhook_id = id, attempt = made, error, "webhook: delivery failed");
            (Attempt::Failed { status, error, retry_in }, outcome)
        };
        // An A2A push config's delivery: the A2A body, with the config's token and credentials.
        let (body, extra) = match &d.push {
            None => (serde_json::to_vec(&payload), Vec::new()),
            Some(config) => {
                let (body, headers) = super::a2a::push_delivery(&d.run, config);
                (serde_json::to_vec(&body), headers)
            }
        };
        let body = match body {
            Ok(b) => b,
            Err(e) => return failed(None, format!("the payload could not be written: {e}")),
        };
        let ts = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        let signature = match self.signer.sign(&id, ts, &body) {
            Ok(s) => s,
            Err(e) => return failed(None, format!("the payload could not be signed: {e}")),
        };
        let mut request = self
            .client
            .post(&d.url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(standardwebhooks::HEADER_WEBHOOK_ID, &id)
            .header(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP, ts.to_string())
            .header(standardwebhooks::HEADER_WEBHOOK_SIGNATURE, signature);
        for (name, value) in extra {
            request = request.header(name, value);
        }
        let sent = request.body(body).send().await;
        match sent {
            Ok(r) if r.status().is_success() => {
                tracing::info!(run_id = d.run.run_id, webhook_id = id, attempt = made, status = r.status().as_u16(), "webhook delivered");
                (Attempt::Delivered { status: r.status().as_u16() }, "delivered")
            }
            Ok(r) if r.status().is_redirection() => failed(Some(r.status().as_u16()), format!("answered {} (a redirect: not followed)", r.status().as_u16())),
            Ok(r) => failed(Some(r.status().as_u16()), format!("answered {}", r.status().as_u16())),
            Err(e) => failed(None, describe(&e)),
        }
    }
}

/// A failed request in words, without its URL (which may carry a secret).
fn describe(e: &reqwest::Error) -> String {
    let what = if e.is_timeout() {
        format!("no answer within {} s", WEBHOOK_TIMEOUT.as_secs())
    } else if e.is_connect() {
        "could not connect".to_owned()
    } else {
        "the request failed".to_owned()
    };
    let mut cause = std::error::Error::source(e);
    let mut last = None;
    while let Some(c) = cause {
        last = Some(c.to_string());
        cause = c.source();
    }
    match last {
        // The innermost cause (refused, reset, DNS): reqwest's own text holds the URL, its
        // causes (hyper's, the OS's) do not.
        Some(l) if !e.is_timeout() => format!("{what}: {l}"),
        _ => what,
    }
}

/// A number in [0, 1) that differs between calls: the jitter of the backoff (std's hasher keys
/// are random per process and per `RandomState`; no generator crate for one number).
fn jitter() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}
