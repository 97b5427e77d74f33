//! The wire types of the runs and routes endpoints: the start contract's body, what an accepted
//! run answers, a run as the service shows it, a page of runs, a reply, a route, the query
//! parameters. The OpenAPI document is generated from them.

use super::*;

/// The start contract as JSON: `{route_id, goal, model_profile, prefetch?, session_id?}`.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StartBody {
    pub route_id: String,
    /// A JSON object.
    #[schema(value_type = Object)]
    pub goal: Value,
    /// A model profile of the catalogue; recorded with the run (the route's profile chooses the model).
    pub model_profile: String,
    /// Prefetched chunks every model call of the run sees.
    #[serde(default)]
    pub prefetch: Option<Vec<String>>,
    #[serde(default)]
    pub session_id: Option<String>,
    /// Where this run's ends (and questions) are posted, signed, instead of the fleet's
    /// `FABRIC_WEBHOOK_URL`; its origin must be one of `FABRIC_WEBHOOK_ALLOWED_ORIGINS`, else
    /// `422 webhook_not_allowed`.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// With a `session_id`: what this start does while another run of the session is live
    /// (running, queued or awaiting input), instead of the fleet's `FABRIC_SESSION_POLICY`:
    /// `allow` (both run), `reject` (`409 session_busy`), `enqueue` (this run waits, queued, until
    /// the live ones ended) or `interrupt` (they are cancelled, reason `interrupted_by_session`,
    /// and this run starts once they ended).
    #[serde(default)]
    pub multitask: Option<crate::config::SessionPolicy>,
}

/// A run accepted (201), or accepted again by a reply (202).
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Accepted {
    pub run_id: String,
    /// `running`, or `queued` when every run slot of this process was taken (any replica with
    /// room claims it).
    pub status: AcceptedStatus,
}

/// Where an accepted run stands at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AcceptedStatus {
    Running,
    Queued,
}

/// Why a run failed: its reason class, what happened, and the stage where it did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunError {
    pub reason_class: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage_id: Option<String>,
}

/// A run: the same object as `fabric run` prints once it ended or asked (`output`, `slots`,
/// `notes`, `question`, `error`), and `created_at`/`updated_at` from the store.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunView {
    pub run_id: String,
    pub route_id: String,
    pub status: StoredStatus,
    #[serde(default)]
    pub output: Option<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    pub slots: Value,
    #[serde(default)]
    pub notes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub question: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<RunError>,
    pub created_at: String,
    pub updated_at: String,
    /// The catalogue version the run runs on: the one it started on, unless a
    /// `run.catalogue_moved` event moved it (`null` for a run accepted before versions were kept).
    #[serde(default)]
    pub catalogue_version: Option<String>,
}

impl RunView {
    /// The view of a stored run.
    pub fn of(run: StoredRun) -> RunView {
        let result = run.result.as_ref();
        let error = match result.and_then(crate::exec::RunResult::error) {
            Some(f) => Some(RunError { reason_class: f.reason_class.as_str().to_owned(), message: f.message.clone(), stage_id: f.stage_id.clone() }),
            // A run failed without a result of its own was ended by a claim (its process stopped).
            None => (run.status == StoredStatus::Failed && result.is_none()).then(|| RunError {
                reason_class: run.reason_class.map_or("interrupted", |c| c.as_str()).to_owned(),
                message: "the process running it stopped".into(),
                stage_id: None,
            }),
        };
        RunView {
            output: result.and_then(|r| r.output()).map(str::to_owned),
            slots: result.and_then(|r| serde_json::to_value(&r.slots).ok()).unwrap_or_else(|| json!({})),
            notes: result.map(|r| r.notes.clone()).unwrap_or_default(),
            run_id: run.run_id,
            route_id: run.route_id,
            status: run.status,
            question: run.question,
            error,
            created_at: run.created_at,
            updated_at: run.updated_at,
            catalogue_version: run.catalogue_version.map(|v| v.to_string()),
        }
    }
}

/// A page of runs, newest first.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    /// Pass as `before` for the next page; absent on the last.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The reply to a run that asked.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReplyBody {
    pub message: String,
}

/// A route of the catalogue.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RouteInfo {
    pub id: String,
    /// The fleet that serves it (`activation_target`), if it names one.
    #[serde(default)]
    pub fleet: Option<String>,
    /// `workflow`, `branched`, `manifest` or `pattern1`; `broken` when it cannot run.
    pub kind: String,
    pub description: String,
    /// Whether this runtime starts it (its fleet, and not broken).
    pub runs_here: bool,
    /// The catalogue version this replica serves it from (also the `Fabric-Catalogue-Version`
    /// header): new runs start on it.
    pub catalogue_version: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct WaitParam {
    /// Answer with the run once it ends or asks (at most the service's wait limit).
    #[serde(default)]
    pub wait: bool,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListParams {
    /// Runs of this route only (one with a control character names none: an empty page).
    pub route_id: Option<String>,
    /// `queued`, `running`, `completed`, `failed` or `awaiting_input`.
    pub status: Option<String>,
    /// A run id: list runs older than it (the `next` of the previous page); anything else is 400.
    pub before: Option<String>,
    /// Page size, 1 to 200 (default 50); anything else is 400.
    pub limit: Option<u32>,
}
