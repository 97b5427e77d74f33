//! The API's one error shape: an [`ErrorCode`] (its status and its stable wire name, together),
//! a message, the located problems of a broken route, and a `Retry-After` when waiting helps.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

/// Every error the API answers with: its HTTP status and its stable `code`, decided once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    Unauthorized,
    NotFound,
    MethodNotAllowed,
    WrongFleet,
    InvalidRequest,
    InvalidContent,
    UnsupportedMediaType,
    BrokenRoute,
    CannotStart,
    NotWaiting,
    NotCancellable,
    IdempotencyKeyReused,
    WebhookNotAllowed,
    SessionBusy,
    TooLarge,
    TooManyRuns,
    TooManyStreams,
    StoreUnavailable,
    StoreError,
    NotReady,
    Timeout,
    RequestTimeout,
    CatalogueRefused,
}

impl ErrorCode {
    /// Every code, in the order `ErrorDetail.code` documents them.
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::Unauthorized,
        ErrorCode::NotFound,
        ErrorCode::MethodNotAllowed,
        ErrorCode::WrongFleet,
        ErrorCode::InvalidRequest,
        ErrorCode::InvalidContent,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::BrokenRoute,
        ErrorCode::CannotStart,
        ErrorCode::NotWaiting,
        ErrorCode::NotCancellable,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::WebhookNotAllowed,
        ErrorCode::SessionBusy,
        ErrorCode::TooLarge,
        ErrorCode::TooManyRuns,
        ErrorCode::TooManyStreams,
        ErrorCode::StoreUnavailable,
        ErrorCode::StoreError,
        ErrorCode::NotReady,
        ErrorCode::Timeout,
        ErrorCode::RequestTimeout,
        ErrorCode::CatalogueRefused,
    ];

    pub fn status(self) -> StatusCode {
        match self {
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::WrongFleet => StatusCode::CONFLICT,
            ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
            ErrorCode::InvalidContent => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::BrokenRoute => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::CannotStart => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::NotWaiting => StatusCode::CONFLICT,
            ErrorCode::NotCancellable => StatusCode::CONFLICT,
            ErrorCode::IdempotencyKeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::WebhookNotAllowed => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::SessionBusy => StatusCode::CONFLICT,
            ErrorCode::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::TooManyRuns => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::TooManyStreams => StatusCode::TOO_MANY_REQUESTS,
            ErrorCode::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StoreError => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotReady => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Timeout => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            ErrorCode::CatalogueRefused => StatusCode::UNPROCESSABLE_ENTITY,
        }
    }

    /// The wire name (`error.code`). A request the service reads but cannot take (422) and one it
    /// cannot read (400) are both `invalid_request`: the status tells them apart.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::WrongFleet => "wrong_fleet",
            ErrorCode::InvalidRequest => "invalid_request",
            ErrorCode::InvalidContent => "invalid_request",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::BrokenRoute => "broken_route",
            ErrorCode::CannotStart => "cannot_start",
            ErrorCode::NotWaiting => "not_waiting",
            ErrorCode::NotCancellable => "not_cancellable",
            ErrorCode::IdempotencyKeyReused => "idempotency_key_reused",
            ErrorCode::WebhookNotAllowed => "webhook_not_allowed",
            ErrorCode::SessionBusy => "session_busy",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::TooManyRuns => "too_many_runs",
            ErrorCode::TooManyStreams => "too_many_streams",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::StoreError => "store_error",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::Timeout => "timeout",
            ErrorCode::RequestTimeout => "request_timeout",
            ErrorCode::CatalogueRefused => "catalogue_refused",
        }
    }
}

/// The one error shape of the API.
#[derive(Debug)]
pub struct ApiError {
    pub(super) code: ErrorCode,
    pub(super) message: String,
    pub(super) problems: Vec<String>,
    pub(super) retry_after: Option<u64>,
}

impl ApiError {
    pub(super) fn new(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { code, message: message.into(), problems: Vec::new(), retry_after: None }
    }
}

/// The body of every error response.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// A stable code: `unauthorized`, `not_found`, `method_not_allowed`, `wrong_fleet`, `invalid_request`, `unsupported_media_type`, `broken_route`, `cannot_start`, `not_waiting`, `not_cancellable`, `idempotency_key_reused`, `webhook_not_allowed`, `session_busy`, `too_large`, `too_many_runs`, `too_many_streams`, `store_unavailable`, `store_error`, `not_ready`, `timeout`, `request_timeout`, `catalogue_refused`.
    pub code: String,
    pub message: String,
    /// Located problems (`path:line:col: message`) of a broken route or a refused catalogue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub problems: Vec<String>,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: ErrorDetail { code: self.code.as_str().to_owned(), message: self.message, problems: self.problems } };
        let mut response = (self.code.status(), Json(body)).into_response();
        if let Some(s) = self.retry_after {
            response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes `ErrorDetail.code` documents (and the OpenAPI document with it) are every code.
    #[test]
    fn the_documented_codes_are_every_code() {
        let doc = "unauthorized, not_found, method_not_allowed, wrong_fleet, invalid_request, unsupported_media_type, broken_route, cannot_start, not_waiting, not_cancellable, idempotency_key_reused, webhook_not_allowed, session_busy, too_large, too_many_runs, too_many_streams, store_unavailable, store_error, not_ready, timeout, request_timeout, catalogue_refused";
        let mut names: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.dedup();
        assert_eq!(names.join(", "), doc);
        for c in ErrorCode::ALL {
            assert!(c.status().is_client_error() || c.status().is_server_error(), "{c:?}");
        }
    }
}
