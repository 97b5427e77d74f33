//! The OpenAPI 3.1 document of the service, generated from the handlers and types themselves
//! (utoipa), so it cannot drift from the code; `docs/openapi.json` is a copy a test keeps equal.

use serde_json::Value;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::*;

#[derive(OpenApi)]
#[openapi(
    info(title = "Fabric Runtime", description = "Runs staged LLM routes: the start contract, run records, live events, replies, cancels, webhooks, schedules, evaluations, A2A agents.", license(name = "Apache-2.0")),
    paths(start_run, list_runs, get_run, run_events, inspect::run_updates, inspect::run_record, reply, cancel::cancel_run, webhooks::run_webhooks, schedules::create_schedule, schedules::list_schedules, schedules::get_schedule, schedules::patch_schedule, schedules::delete_schedule, schedules::trigger_schedule, schedules::schedule_fires, list_routes, route_graph_svg, catalogue::catalogue_info, catalogue::reload, catalogue::catalogue_diff, experiments::list_experiments, experiments::get_experiment, healthz, readyz, metrics, openapi_json, a2a::card::fleet_card, a2a::card::route_card, a2a::endpoint),
    components(schemas(StartBody, Accepted, RunView, RunPage, ReplyBody, cancel::CancelBody, webhooks::WebhookList, webhooks::WebhookView, webhooks::WebhookPayload, schedules::ScheduleBody, schedules::ScheduleList, schedules::FireList, crate::runtime::ScheduleView, crate::runtime::ScheduleDef, crate::store::schedules::FireRecord, crate::schedule::Overlap, RouteInfo, catalogue::CatalogueInfo, catalogue::CatalogueReloaded, catalogue::CatalogueChanges, RunRecord, experiments::ExperimentList, experiments::ExperimentView, crate::eval::Report, crate::eval::EvaluatorSummary, crate::eval::CaseReport, crate::eval::RunReport, crate::eval::Spread, crate::eval::ScoreSpread, crate::eval::Verdict, ErrorBody, ErrorDetail)),
    modifiers(&Bearer)
)]
struct ApiDoc;

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
    }
}

/// The document as JSON, with the runtime's version.
pub fn document() -> Value {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_owned();
    serde_json::to_value(doc).unwrap_or(Value::Null)
}
