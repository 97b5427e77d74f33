//! The routes resource: `GET /v1/routes` and a route's graph as SVG.

use super::*;

/// The routes of the catalogue version in force here (each replica says which version it runs).
#[utoipa::path(get, path = "/v1/routes", responses((status = 200, body = [RouteInfo],
    headers(("fabric-catalogue-version" = String, description = "The catalogue version the routes are of"))), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn list_routes(State(state): State<AppState>) -> Response {
    // One edition for the whole answer: a reload meanwhile does not mix two versions in it.
    let edition = state.runtime().current();
    let version = edition.version().to_string();
    let routes: Vec<RouteInfo> = edition
        .catalogue()
        .routes()
        .map(|entry| match entry {
            RouteEntry::Ready(r) => RouteInfo {
                id: r.id().to_owned(),
                fleet: r.activation_target().map(str::to_owned),
                kind: r.path().as_str().to_owned(),
                description: r.description().to_owned(),
                runs_here: edition.check_route(r.id()).is_ok(),
                catalogue_version: version.clone(),
            },
            RouteEntry::Broken(b) => RouteInfo {
                id: b.id.clone(),
                fleet: None,
                kind: "broken".into(),
                description: String::new(),
                runs_here: false,
                catalogue_version: version.clone(),
            },
        })
        .collect();
    ([(header::HeaderName::from_static(VERSION_HEADER), version)], Json(routes)).into_response()
}

/// The header that names the catalogue version of an answer.
pub(super) const VERSION_HEADER: &str = "fabric-catalogue-version";

/// A route's graph as a self-contained SVG 1.1 document: stages, roles, prompt references, edges and their conditions.
// Served with `nosniff` and a CSP that allows nothing but inline styling, so the picture stays a
// picture even when opened on its own; everything from the catalogue in it is escaped.
#[utoipa::path(get, path = "/v1/routes/{route_id}/graph.svg", params(("route_id" = String, Path, description = "The route id")),
    responses((status = 200, description = "The graph, SVG 1.1", content_type = "image/svg+xml", body = String,
        headers(("x-content-type-options" = String, description = "`nosniff`"), ("content-security-policy" = String, description = "`default-src 'none'; style-src 'unsafe-inline'`"))), (status = 404, description = "Unknown route", body = ErrorBody),
        (status = 422, description = "A broken route", body = ErrorBody), (status = 400, description = PATH_400, body = ErrorBody), (status = 401, body = ErrorBody)), security(("bearer" = [])))]
pub(super) async fn route_graph_svg(State(state): State<AppState>, PathText(route_id): PathText) -> Result<Response, ApiError> {
    let catalogue = state.inner.durable.runtime().catalogue();
    let route = catalogue.route(&route_id).map_err(|e| match e {
        RouteLookupError::Unknown { known, .. } => {
            ApiError::new(ErrorCode::NotFound, format!("unknown route `{}`; known routes: {}", echo_id(&route_id), crate::catalogue::name_list(&known)))
        }
        RouteLookupError::Broken(b) => {
            let mut e = ApiError::new(ErrorCode::BrokenRoute, format!("route `{}` cannot run: the catalogue has errors in it", echo_id(&route_id)));
            e.problems = b.problems.iter().flat_map(|d| d.to_string().lines().map(|l| l.trim().to_owned()).collect::<Vec<_>>()).collect();
            e
        }
    })?;
    let headers = [
        (header::CONTENT_TYPE, "image/svg+xml"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CONTENT_SECURITY_POLICY, "default-src 'none'; style-src 'unsafe-inline'"),
    ];
    Ok((headers, crate::svg::render_svg(route)).into_response())
}
