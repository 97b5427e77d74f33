//! The run inspector: a page of plain HTML, CSS and JavaScript embedded in the binary and served
//! at `/ui/` without authentication (the assets hold no data; every data call the page makes
//! carries the API's bearer token, kept in the browser's `sessionStorage`). Served with a
//! Content-Security-Policy that allows only the page's own script, style and connections.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

use super::AppState;

const INDEX_HTML: &str = include_str!("ui/index.html");
const APP_JS: &str = include_str!("ui/app.js");
const APP_CSS: &str = include_str!("ui/app.css");

/// The policy every asset is served with: no inline script or style, no other origin, no frames.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

pub(super) fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui/index.html", get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }))
        .route("/ui/app.js", get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }))
        .route("/ui/app.css", get(|| async { asset("text/css; charset=utf-8", APP_CSS) }))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}
