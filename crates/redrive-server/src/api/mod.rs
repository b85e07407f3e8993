//! The HTTP API v1 (SPEC §5), one file per resource.
//!
//! Request bodies are parsed by [`ApiJson`]: malformed JSON is a 400
//! `malformed_json`, an unknown field is a 400 `invalid_body` naming it
//! (unknown fields are rejected so that a typo such as `"dealy"` is not
//! silently ignored), a body over `max_request_bytes` is a 413. Every error
//! is `{"error": {"code", "message"}}`. Before any route runs, the browser guard
//! (`api/browser.rs`) refuses DNS-rebinding `Host`s, cross-site requests and non-JSON bodies. The OpenAPI document at
//! `/openapi.json` is generated from the handlers' annotations by
//! `utoipa-axum`, so it lists exactly the routes that exist.

pub mod auth;
mod bridges;
pub(crate) mod browser;
mod cluster;
pub(crate) mod contract;
pub(crate) mod endpoints;
mod error;
pub(crate) mod groups;
mod health;
mod leases;
pub(crate) mod limits;
pub(crate) mod messages;
pub(crate) mod queues;
pub mod tasks;

pub use browser::BrowserGuard;

pub(crate) use browser::host_name;
pub use error::{ApiError, ErrorBody};
pub use limits::message_bound_bytes;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use redrive_core::{MessageId, Timestamp};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

pub use crate::http::AppState;

#[derive(OpenApi)]
#[openapi(
    info(title = "redrive", description = "Durable retry and dead-letter server. Errors are {\"error\": {\"code\", \"message\"}}."),
    tags(
        (name = "messages", description = "Publish, inspect and act on messages"),
        (name = "leases", description = "Consume: lease, ack, nack, release, extend"),
        (name = "queues", description = "Queue counts and policies, push endpoints"),
        (name = "tasks", description = "Bulk actions as durable tasks, and the audit log"),
        (name = "ops", description = "Health, readiness, metrics, the cluster")
    ),
    components(schemas(ErrorBody, messages::PublishBatch))
)]
struct ApiDoc;

/// The routes of `/v1` and their OpenAPI document.
fn v1() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(messages::publish))
        .routes(routes!(messages::search))
        .routes(routes!(messages::export))
        .routes(routes!(messages::get, messages::delete))
        .routes(routes!(messages::redrive))
        .routes(routes!(messages::kill))
        .routes(routes!(leases::lease))
        .routes(routes!(leases::ack))
        .routes(routes!(leases::nack))
        .routes(routes!(leases::release))
        .routes(routes!(leases::extend))
        .routes(routes!(leases::ack_batch))
        .routes(routes!(leases::nack_batch))
        .routes(routes!(queues::list))
        .routes(routes!(queues::get))
        .routes(routes!(endpoints::list))
        .routes(routes!(bridges::list))
        .routes(routes!(cluster::get))
        .routes(routes!(groups::list))
        .routes(routes!(tasks::create_task, tasks::list))
        .routes(routes!(tasks::get))
        .routes(routes!(tasks::pause))
        .routes(routes!(tasks::resume))
        .routes(routes!(tasks::cancel))
        .routes(routes!(tasks::audit))
}

/// Liveness, readiness and metrics: open even when API tokens are configured.
fn ops() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics))
}

/// The API's routes: `/v1` behind its token check, the open operations routes, and the
/// OpenAPI document of exactly these (rendered once). `crate::http` composes them with the
/// console into the server's application.
pub(crate) fn routes(state: &AppState) -> (axum::Router<AppState>, axum::Router<AppState>) {
    let tokens = state.tokens.clone();
    let (v1_router, v1_doc) = v1().split_for_parts();
    let v1_router = v1_router.layer(axum::middleware::from_fn(
        move |req: Request, next: Next| {
            let tokens = tokens.clone();
            async move { auth::authorize(tokens, req, next).await }
        },
    ));
    let (ops, ops_doc) = ops().split_for_parts();
    let mut doc = ApiDoc::openapi();
    doc.merge(v1_doc);
    doc.merge(ops_doc);
    let doc_json = Arc::new(contract::document(&state.config, &doc));
    let ops = ops.route(
        "/openapi.json",
        axum::routing::get(move || {
            let doc_json = doc_json.clone();
            async move {
                (
                    [(header::CONTENT_TYPE, "application/json")],
                    doc_json.as_ref().clone(),
                )
            }
        }),
    );
    (v1_router, ops)
}

/// No such route: a JSON 404.
pub(crate) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// A route without this method: a JSON 405.
pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

/// A JSON body with redrive's error answers; an empty body counts as `{}`.
#[derive(Debug)]
pub struct ApiJson<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "body_too_large",
                    "request body exceeds max_request_bytes",
                )
            } else {
                ApiError::bad_request("malformed_body", e.body_text())
            }
        })?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// Parse a JSON body; empty (no bytes at all) means `{}`. A body of only whitespace is not
/// JSON and is refused like any other (schemathesis sent `\t` to a lease and got 200).
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    // A body that deserializes straight into `T` is taken as it is: one pass, no tree of
    // values built first and walked again (a second pass over every body, the second of a
    // publish's three). Only a body that does not is read again, as below, for the error
    // to name what is wrong.
    if let Ok(v) = serde_json::from_slice::<T>(bytes) {
        return Ok(v);
    }
    // Check the syntax of the whole body first: deserializing straight into `T` would
    // report a truncated body as e.g. an unknown field (the first key it read).
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request("malformed_json", format!("body is not valid JSON: {e}"))
    })?;
    from_value(value, "")
}

/// Turn a JSON value into `T`; the error names the field's path (`messages[2].priority: …`),
/// prefixed with `prefix` when given.
pub fn from_value<T: DeserializeOwned>(
    value: serde_json::Value,
    prefix: &str,
) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = match (prefix.is_empty(), path == ".") {
            (true, true) => String::new(),
            (true, false) => format!("{path}: "),
            (false, true) => format!("{prefix}: "),
            (false, false) => format!("{prefix}.{path}: "),
        };
        ApiError::bad_request("invalid_body", format!("{path}{}", e.inner()))
    })
}

/// Wrap any error answer that is not already JSON (axum's own rejections: a path segment
/// that is not UTF-8, a body that cannot be buffered …) in the `{"error": …}` envelope.
pub(crate) async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json") || v.starts_with("text/html"));
    // (An HTML error is a console page: it stays HTML.)
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let text = match axum::body::to_bytes(resp.into_body(), 64 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(_) => String::new(),
    };
    let code = match status.as_u16() {
        400 => "bad_request",
        404 => "not_found",
        405 => "method_not_allowed",
        408 => "request_timeout",
        413 => "body_too_large",
        415 => "unsupported_media_type",
        422 => "invalid_body",
        _ if status.is_server_error() => "internal",
        _ => "bad_request",
    };
    let message = if text.trim().is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    ApiError::new(status, code, message).into_response()
}

/// Parse a duration field (see `api/contract.rs` for the grammar) within `range`, naming it on error.
pub fn duration_field(
    field: &str,
    value: &str,
    range: contract::DurationRange,
) -> Result<u64, ApiError> {
    contract::duration_in(field, value, range)
}

/// When something `delay_ms` from `now` (this node's clock) is due: a zero delay is due at
/// once by the store's clock ([`Timestamp::EPOCH`]), not at `now`, which a store on the
/// database's clock may not have reached yet and would then leave scheduled (MariaDB's
/// lagged by a millisecond).
pub fn due_after(now: Timestamp, delay_ms: u64) -> Timestamp {
    if delay_ms == 0 {
        Timestamp::EPOCH
    } else {
        now.plus_ms(delay_ms)
    }
}

/// Parse a timestamp field (RFC 3339, see `api/contract.rs`), naming it on error.
pub fn timestamp_field(field: &str, value: &str) -> Result<Timestamp, ApiError> {
    let bad = || {
        ApiError::bad_request(
            "invalid_timestamp",
            format!("{field}: {value:?} is not an RFC 3339 time such as \"2026-01-31T12:00:00Z\""),
        )
    };
    if !contract::timestamp_shape_ok(value) {
        return Err(bad());
    }
    Timestamp::parse(value).map_err(|_| bad())
}

/// Parse a message id from the path: a hyphenated UUID, as ids are printed.
pub fn message_id(raw: &str) -> Result<MessageId, ApiError> {
    let hyphenated = raw.len() == 36
        && raw.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    let parsed = if hyphenated { raw.parse().ok() } else { None };
    parsed.ok_or_else(|| {
        ApiError::bad_request(
            "invalid_id",
            format!(
                "{raw:?} is not a message id (a UUID such as 0190b5c2-7d1e-7c3a-9f00-1a2b3c4d5e6f)"
            ),
        )
    })
}

/// Check a queue name from the path.
pub fn queue_name(raw: &str) -> Result<(), ApiError> {
    redrive_core::validate_queue_name(raw)
        .map_err(|e| ApiError::bad_request("invalid_queue", e.to_string()))
}
