//! The catalogue resource: `GET /v1/catalogue` (the version in force),
//! `POST /v1/catalogue/reload`, and [`AppState::reload_catalogue`], the one way a serving replica
//! reloads (the endpoint, `SIGHUP` and `FABRIC_CATALOGUE_WATCH` all go through it): counted in
//! the metrics and logged, a refusal with every located problem; `GET /v1/catalogue/diff`, what
//! changed between two versions (a run's and the one in force, say), as `fabric routes diff`
//! tells it.

use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::catalogue::{Catalogue, Texts};
use crate::diff::CatalogueDiff;
use crate::runtime::{ReloadError, Reloaded};
use crate::version::CatalogueVersion;

/// The reloads of this replica, by outcome (`fabric_catalogue_reloads_total`).
#[derive(Debug, Default)]
pub(super) struct Reloads {
    applied: AtomicU64,
    unchanged: AtomicU64,
    refused: AtomicU64,
}

impl Reloads {
    /// The counters and the version in force, as Prometheus text.
    pub(super) fn render(&self, version: &str, text: &mut String) {
        text.push_str("# HELP fabric_catalogue_reloads_total Catalogue reloads (endpoint, SIGHUP, watch) by outcome: applied (a new version), unchanged, refused (a problem in it; the old version stays).\n# TYPE fabric_catalogue_reloads_total counter\n");
        for (outcome, n) in [("applied", &self.applied), ("unchanged", &self.unchanged), ("refused", &self.refused)] {
            text.push_str(&format!("fabric_catalogue_reloads_total{{outcome=\"{outcome}\"}} {}\n", n.load(Ordering::Relaxed)));
        }
        text.push_str(
            "# HELP fabric_catalogue_version The catalogue version new runs start on (1 for the version in force).\n# TYPE fabric_catalogue_version gauge\n",
        );
        text.push_str(&format!("fabric_catalogue_version{{version=\"{version}\"}} 1\n"));
    }
}

/// The catalogue in force.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CatalogueInfo {
    /// The version new runs start on: the SHA-256 of its route files, prompt packs and (with the
    /// stub) stub scripts.
    pub version: String,
    pub routes_ready: usize,
    pub routes_broken: usize,
}

/// What a reload did.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CatalogueReloaded {
    /// The version in force now.
    pub version: String,
    /// The version before the reload.
    pub previous: String,
    /// Whether the files read make a new version (false: nothing changed).
    pub changed: bool,
    /// Problems that do not refuse a catalogue.
    pub warnings: Vec<String>,
}

impl AppState {
    /// Reloads the catalogue (see [`crate::runtime::Runtime::reload`]), counted and logged;
    /// `trigger` says what asked (`endpoint`, `sighup`, `watch`).
    pub async fn reload_catalogue(&self, trigger: &'static str) -> Result<Reloaded, ReloadError> {
        let reloads = &self.inner.reloads;
        let outcome = self.runtime().reload().await;
        match &outcome {
            Ok(r) if r.changed() => {
                reloads.applied.fetch_add(1, Ordering::Relaxed);
                tracing::info!(trigger, version = %r.version, previous = %r.previous, "catalogue reloaded: new runs start on the new version");
            }
            Ok(r) => {
                reloads.unchanged.fetch_add(1, Ordering::Relaxed);
                tracing::info!(trigger, version = %r.version, "catalogue reload: nothing changed");
            }
            Err(e) => {
                reloads.refused.fetch_add(1, Ordering::Relaxed);
                let problems = match e {
                    ReloadError::Refused { problems, .. } => problems.join("; "),
                    ReloadError::NotFromDirs => String::new(),
                };
                tracing::warn!(trigger, error = %e, problems, "catalogue reload refused");
            }
        }
        for w in outcome.iter().flat_map(|r| &r.warnings) {
            tracing::warn!(warning = %w, "catalogue reload");
        }
        outcome
    }
}

impl AppState {
    /// Asks the replica's catalogue loop to reload ([`AppState::watch_catalogue`]): what
    /// `SIGHUP` does. A request made while a reload runs is not lost: one more follows it.
    pub fn ask_reload(&self) {
        self.inner.reload_wake.notify_one();
    }

    /// The replica's catalogue loop: a reload for each [`AppState::ask_reload`], and with
    /// `FABRIC_CATALOGUE_WATCH`, one when the files on disk make another version than the one in
    /// force, once two polls [`WATCH_POLL`] apart read the same (a change written as several
    /// files is loaded whole). A version refused is not tried again until the files change or
    /// another version comes into force (a reload by other means).
    pub async fn watch_catalogue(self) {
        let watch = self.runtime().settings().service.catalogue_watch;
        let mut tick = tokio::time::interval(crate::config::WATCH_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The files' version last seen, and the last one refused with the version then in force.
        let (mut seen, mut refused) = (None, None);
        loop {
            tokio::select! {
                () = self.inner.reload_wake.notified() => {
                    let _ = self.reload_catalogue("sighup").await;
                }
                _ = tick.tick(), if watch => {
                    // Reading the files blocks: off the runtime's threads.
                    let runtime = self.runtime().clone();
                    let Ok(Some(disk)) = tokio::task::spawn_blocking(move || runtime.version_on_disk()).await else { continue };
                    let stable = seen.as_ref() == Some(&disk);
                    seen = Some(disk.clone());
                    let in_force = self.runtime().version();
                    if stable && disk != in_force && refused != Some((disk.clone(), in_force.clone())) {
                        refused = self.reload_catalogue("watch").await.is_err().then_some((disk, in_force));
                    }
                }
            }
        }
    }
}

/// The catalogue version in force here, and its routes.
#[utoipa::path(get, path = "/v1/catalogue", responses((status = 200, body = CatalogueInfo), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn catalogue_info(State(state): State<AppState>) -> Json<CatalogueInfo> {
    let edition = state.runtime().current();
    let ready = edition.catalogue().routes().filter(|r| matches!(r, RouteEntry::Ready(_))).count();
    Json(CatalogueInfo { version: edition.version().to_string(), routes_ready: ready, routes_broken: edition.catalogue().routes().count() - ready })
}

/// Loads the catalogue again from this replica's disk: a good one becomes the version new runs start on (runs in flight keep theirs); one with any problem is refused whole, with every located problem, and the version in force stays.
#[utoipa::path(post, path = "/v1/catalogue/reload", responses((status = 200, body = CatalogueReloaded),
    (status = 422, description = "`catalogue_refused`: the catalogue read has problems (`error.problems`, each `path:line:col: message`); nothing changed", body = ErrorBody),
    (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn reload(State(state): State<AppState>) -> Result<Json<CatalogueReloaded>, ApiError> {
    match state.reload_catalogue("endpoint").await {
        Ok(r) => Ok(Json(CatalogueReloaded { changed: r.changed(), version: r.version.to_string(), previous: r.previous.to_string(), warnings: r.warnings })),
        Err(e) => {
            let mut err = ApiError::new(ErrorCode::CatalogueRefused, e.to_string());
            if let ReloadError::Refused { problems, .. } = e {
                err.problems = problems;
            }
            Err(err)
        }
    }
}

/// The versions `GET /v1/catalogue/diff` compares.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DiffParams {
    /// The version compared from (a run's `catalogue_version`, say): 64 lowercase hex digits.
    pub from: String,
    /// The version compared to: 64 lowercase hex digits; default the version in force here.
    pub to: Option<String>,
}

/// What changed from one catalogue version to another.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct CatalogueChanges {
    /// The version compared from.
    pub from: String,
    /// The version compared to (the one in force, when the request named none).
    pub to: String,
    /// Every route that differs, as `fabric routes diff --format json` prints it
    /// (`{"routes": [...]}`, docs/catalogue.md, "Comparing two catalogues").
    #[schema(value_type = Object)]
    pub differences: CatalogueDiff,
    /// The same as `fabric routes diff` prints it: one line per change, the lines of a prompt or
    /// schema that differ under it; empty when nothing differs.
    pub text: String,
}

/// What changed between two catalogue versions, route by route and stage by stage: prompts, roles, schemas, edges, tools. A version is the one in force here, one this replica keeps built, or one the run store keeps (every version a run started on), rebuilt from its sources.
#[utoipa::path(get, path = "/v1/catalogue/diff", params(DiffParams), responses((status = 200, body = CatalogueChanges),
    (status = 400, description = "`invalid_request`: no `from`, or a `from` or `to` that is no catalogue version (64 lowercase hex digits)", body = ErrorBody),
    (status = 404, description = "`not_found`: a version neither in force here nor kept in the run store (the message names it)", body = ErrorBody),
    (status = 401, body = ErrorBody), (status = 503, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn catalogue_diff(State(state): State<AppState>, p: Result<Query<DiffParams>, QueryRejection>) -> Result<Json<CatalogueChanges>, ApiError> {
    let p = query(p)?;
    let from = version_param("from", &p.from)?;
    let to = match p.to.as_deref() {
        Some(to) => version_param("to", to)?,
        None => state.runtime().current().version().clone(),
    };
    let (old, new) = (catalogue_of(&state, &from).await?, catalogue_of(&state, &to).await?);
    // Both catalogues are hydrated; comparing them walks every route: off the runtime's threads.
    let changes = tokio::task::spawn_blocking(move || crate::diff::diff(&old, &new)).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    Ok(Json(CatalogueChanges { from: from.to_string(), to: to.to_string(), text: changes.to_string(), differences: changes }))
}

fn version_param(name: &str, text: &str) -> Result<CatalogueVersion, ApiError> {
    CatalogueVersion::parse(text)
        .map_err(|_| ApiError::new(ErrorCode::InvalidRequest, format!("`{name}` is not a catalogue version (64 lowercase hex digits): `{}`", echo_id(text))))
}

/// The catalogue of `version`: the edition in force or one this replica keeps built, else the
/// version's sources from the run store, rebuilt (off the runtime's threads: every route is
/// hydrated).
async fn catalogue_of(state: &AppState, version: &CatalogueVersion) -> Result<Arc<Catalogue>, ApiError> {
    if let Some(edition) = state.runtime().built(version) {
        return Ok(edition.catalogue().clone());
    }
    let Some(sources) = state.durable().store().catalogue(version).await.map_err(store_error)? else {
        return Err(ApiError::new(ErrorCode::NotFound, format!("no catalogue version {version}: not in force here, and not kept in the run store")));
    };
    let texts = Texts { routes: sources.routes, packs: sources.packs };
    // One rebuild at a time: a client asking for old versions again and again takes one blocking
    // thread, not all of them.
    static REBUILDS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);
    let _one = REBUILDS.acquire().await.map_err(|_| ApiError::new(ErrorCode::NotReady, "shutting down"))?;
    Ok(tokio::task::spawn_blocking(move || Arc::new(Catalogue::rebuild(&texts))).await.unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic())))
}
