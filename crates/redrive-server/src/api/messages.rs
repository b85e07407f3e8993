//! `/v1/queues/{queue}/messages` (publish) and `/v1/messages…` (inspect, search,
//! export, redrive, kill, delete).

use super::{
    duration_field, from_value, message_id, queue_name, timestamp_field, ApiError, ApiJson,
    AppState, ErrorBody,
};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use redrive_core::{ErrorClass, Failure, Message, NewMessage, State as MsgState, Timestamp};
use redrive_storage::MessageFilter;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

/// Longest ordering key or idempotency key, bytes.
const MAX_KEY_BYTES: usize = 512;
/// Default and largest page of a search.
const DEFAULT_PAGE: u32 = 100;
const MAX_PAGE: u32 = 1_000;
/// Rows fetched per store call while streaming an export.
const EXPORT_CHUNK: u32 = 500;

/// A failure seen elsewhere, reported at publish (S1).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FailedReport {
    /// `transient`, `rate_limited` or `permanent`.
    pub class: String,
    /// What went wrong.
    pub message: Option<String>,
    /// For `rate_limited`: earliest retry, e.g. `"10s"`.
    pub retry_after: Option<String>,
}

/// One message to publish. `payload` is required; `delay` and `deliver_at` exclude each other.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishItem {
    /// Any JSON value.
    #[schema(value_type = Object)]
    pub payload: Option<serde_json::Value>,
    /// String headers.
    pub headers: Option<BTreeMap<String, String>>,
    /// Ordering / partition key.
    pub key: Option<String>,
    /// Idempotency key (per queue, within the idempotency window).
    pub idempotency_key: Option<String>,
    /// 0–9, higher first. Default 0.
    pub priority: Option<i64>,
    /// Deliver after this delay, e.g. `"30s"`.
    pub delay: Option<String>,
    /// Deliver at this RFC 3339 time.
    pub deliver_at: Option<String>,
    /// A failure seen elsewhere: recorded as attempt 1 and scheduled by the policy.
    pub failed: Option<FailedReport>,
}

/// A batch publish: all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishBatch {
    /// The messages.
    pub messages: Vec<serde_json::Value>,
}

/// Parse a failure class.
pub fn error_class(field: &str, raw: &str) -> Result<ErrorClass, ApiError> {
    ErrorClass::parse(raw).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_error_class",
            format!("{field}: {raw:?} is not one of transient, rate_limited, permanent"),
        )
    })
}

/// A failure from its API form; `field` prefixes error messages.
pub fn failure(
    field: &str,
    class: &str,
    message: Option<String>,
    retry_after: Option<&str>,
) -> Result<Failure, ApiError> {
    let class = error_class(&format!("{field}.class"), class)?;
    let retry_after_ms = match retry_after {
        Some(r) => Some(duration_field(&format!("{field}.retry_after"), r)?),
        None => None,
    };
    Ok(Failure {
        class,
        message,
        retry_after_ms,
        code: None,
    })
}

fn parse_item(
    s: &AppState,
    queue: &str,
    value: serde_json::Value,
    prefix: &str,
    now: Timestamp,
) -> Result<NewMessage, ApiError> {
    let has_payload = value.as_object().is_some_and(|o| o.contains_key("payload"));
    let item: PublishItem = from_value(value, prefix)?;
    let field = |f: &str| {
        if prefix.is_empty() {
            f.to_owned()
        } else {
            format!("{prefix}.{f}")
        }
    };
    if !has_payload {
        return Err(ApiError::bad_request(
            "invalid_body",
            format!(
                "{}: missing (any JSON value, null included)",
                field("payload")
            ),
        ));
    }
    let payload = item.payload.unwrap_or(serde_json::Value::Null);
    let size = serde_json::to_vec(&payload)
        .map(|v| v.len())
        .unwrap_or(usize::MAX);
    let limit = s.config.max_payload_bytes;
    if size > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "{}: {size} bytes, the limit is {limit} (max_payload_bytes)",
                field("payload")
            ),
        ));
    }
    let priority = match item.priority {
        None => 0,
        Some(p @ 0..=9) => p as u8,
        Some(p) => {
            return Err(ApiError::bad_request(
                "invalid_priority",
                format!("{}: {p} is not in 0..=9", field("priority")),
            ))
        }
    };
    for (name, v) in [
        ("key", &item.key),
        ("idempotency_key", &item.idempotency_key),
    ] {
        if let Some(v) = v {
            if v.is_empty() || v.len() > MAX_KEY_BYTES {
                return Err(ApiError::bad_request(
                    "invalid_key",
                    format!("{}: must have 1 to {MAX_KEY_BYTES} bytes", field(name)),
                ));
            }
        }
    }
    let deliver_at = match (&item.delay, &item.deliver_at) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!(
                    "{} and {}: give one or the other",
                    field("delay"),
                    field("deliver_at")
                ),
            ))
        }
        (Some(d), None) => Some(now.plus_ms(duration_field(&field("delay"), d)?)),
        (None, Some(t)) => Some(timestamp_field(&field("deliver_at"), t)?),
        (None, None) => None,
    };
    let failed = match &item.failed {
        Some(f) => Some(failure(
            &field("failed"),
            &f.class,
            f.message.clone(),
            f.retry_after.as_deref(),
        )?),
        None => None,
    };
    Ok(NewMessage {
        queue: queue.to_owned(),
        payload,
        headers: item.headers.unwrap_or_default(),
        key: item.key,
        idempotency_key: item.idempotency_key,
        priority,
        deliver_at,
        failed,
    })
}

/// Publish one message, or a batch (`{"messages": [...]}`, all or nothing).
#[utoipa::path(post, path = "/v1/queues/{queue}/messages", tag = "messages",
    params(("queue" = String, Path, description = "Queue name, [A-Za-z0-9._:-]{1,128}")),
    request_body(content = PublishItem, description = "One message, or {\"messages\": [PublishItem, …]} for a batch"),
    responses(
        (status = 201, description = "Created: the message, or {\"messages\": [...]}"),
        (status = 200, description = "Idempotent replay: the original message(s)"),
        (status = 400, description = "Bad input, naming the field (and item index)", body = ErrorBody),
        (status = 409, description = "Idempotency key reused with a different payload", body = ErrorBody),
        (status = 413, description = "Payload or body too large", body = ErrorBody)))]
pub async fn publish(
    State(s): State<AppState>,
    Path(queue): Path<String>,
    ApiJson(value): ApiJson<serde_json::Value>,
) -> Result<Response, ApiError> {
    queue_name(&queue)?;
    let now = s.engine.clock().now();
    let is_batch = value
        .as_object()
        .is_some_and(|o| o.contains_key("messages") && !o.contains_key("payload"));
    if is_batch {
        let batch: PublishBatch = from_value(value, "")?;
        let max = s.config.max_batch;
        if batch.messages.is_empty() || batch.messages.len() > max {
            return Err(ApiError::bad_request(
                "batch_too_large",
                format!(
                    "messages: {} items, a batch needs 1 to {max} (max_batch)",
                    batch.messages.len()
                ),
            ));
        }
        let items = batch
            .messages
            .into_iter()
            .enumerate()
            .map(|(i, v)| parse_item(&s, &queue, v, &format!("messages[{i}]"), now))
            .collect::<Result<Vec<_>, _>>()?;
        let out = s.engine.publish(items).await?;
        let status = if out.iter().all(|p| p.replayed) {
            StatusCode::OK
        } else {
            StatusCode::CREATED
        };
        let messages: Vec<Message> = out.into_iter().map(|p| p.message).collect();
        return Ok((status, Json(serde_json::json!({ "messages": messages }))).into_response());
    }
    let item = parse_item(&s, &queue, value, "", now)?;
    let mut out = s.engine.publish(vec![item]).await?;
    let p = out.pop().ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "empty publish result",
        )
    })?;
    let status = if p.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(p.message)).into_response())
}

/// One message with its whole history.
#[utoipa::path(get, path = "/v1/messages/{id}", tag = "messages",
    params(("id" = String, Path, description = "Message id")),
    responses((status = 200, description = "The message with `history`"),
        (status = 400, description = "Not a message id", body = ErrorBody),
        (status = 404, description = "No such message", body = ErrorBody)))]
pub async fn get(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Message>, ApiError> {
    let id = message_id(&id)?;
    match s.engine.store().get(id).await? {
        Some(m) => Ok(Json(m)),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no message with id {id}"),
        )),
    }
}

/// Delete a message (any state). Its idempotency key is forgotten.
#[utoipa::path(delete, path = "/v1/messages/{id}", tag = "messages",
    params(("id" = String, Path, description = "Message id")),
    responses((status = 200, description = "Deleted; the message as it was"),
        (status = 404, description = "No such message", body = ErrorBody)))]
pub async fn delete(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let id = message_id(&id)?;
    let m = s.engine.delete(id).await?;
    Ok(Json(serde_json::json!({"deleted": true, "message": m})))
}

/// Redrive: a dead or scheduled message becomes ready now, with a fresh attempt budget.
#[utoipa::path(post, path = "/v1/messages/{id}/redrive", tag = "messages",
    params(("id" = String, Path, description = "Message id")),
    responses((status = 200, description = "The message, now ready"),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "Not dead or scheduled", body = ErrorBody)))]
pub async fn redrive(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Json<Message>, ApiError> {
    let id = message_id(&id)?;
    Ok(Json(s.engine.redrive(id).await?))
}

/// The body of a kill.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillBody {
    /// Why, for the history.
    pub reason: Option<String>,
}

/// Kill: the message becomes dead with reason `killed`.
#[utoipa::path(post, path = "/v1/messages/{id}/kill", tag = "messages",
    params(("id" = String, Path, description = "Message id")),
    request_body(content = KillBody, description = "Optional"),
    responses((status = 200, description = "The message, now dead"),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "Already done or dead", body = ErrorBody)))]
pub async fn kill(
    State(s): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<KillBody>,
) -> Result<Json<Message>, ApiError> {
    let id = message_id(&id)?;
    Ok(Json(s.engine.kill(id, body.reason).await?))
}

/// Search filters (all optional, ANDed).
#[derive(Debug, Default, Deserialize, IntoParams, ToSchema)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct SearchQuery {
    /// Queue name.
    pub queue: Option<String>,
    /// scheduled | ready | leased | done | dead.
    pub state: Option<String>,
    /// Ordering key.
    pub key: Option<String>,
    /// Class of the last error: transient | rate_limited | permanent.
    pub error_class: Option<String>,
    /// Text in the payload or in the last error message (case-insensitive for ASCII).
    pub q: Option<String>,
    /// Created at or after (RFC 3339).
    pub since: Option<String>,
    /// Created before (RFC 3339).
    pub until: Option<String>,
    /// Page size (default 100, at most 1000).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Export only: `csv` (default) or `jsonl`.
    pub format: Option<String>,
}

fn filter_of(q: &SearchQuery) -> Result<MessageFilter, ApiError> {
    if let Some(queue) = &q.queue {
        queue_name(queue)?;
    }
    let state = match &q.state {
        Some(st) => Some(MsgState::parse(st).ok_or_else(|| {
            ApiError::bad_request(
                "invalid_state",
                format!("state: {st:?} is not one of scheduled, ready, leased, done, dead"),
            )
        })?),
        None => None,
    };
    let error_class = match &q.error_class {
        Some(c) => Some(error_class("error_class", c)?),
        None => None,
    };
    if let Some(c) = &q.cursor {
        if c.parse::<i64>().is_err() {
            return Err(ApiError::bad_request(
                "invalid_cursor",
                format!("cursor: {c:?} is not a cursor from next_cursor"),
            ));
        }
    }
    Ok(MessageFilter {
        queue: q.queue.clone(),
        state,
        key: q.key.clone(),
        error_class,
        text: q.q.clone().filter(|t| !t.is_empty()),
        since: q
            .since
            .as_deref()
            .map(|t| timestamp_field("since", t))
            .transpose()?,
        until: q
            .until
            .as_deref()
            .map(|t| timestamp_field("until", t))
            .transpose()?,
    })
}

fn query(q: Result<Query<SearchQuery>, QueryRejection>) -> Result<SearchQuery, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
}

/// A page of search results.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchPage {
    /// Messages, newest first, without history.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Message>,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}

/// Search messages, newest first, with a cursor.
#[utoipa::path(get, path = "/v1/messages", tag = "messages", params(SearchQuery),
    responses((status = 200, body = SearchPage), (status = 400, description = "Bad filter, naming it", body = ErrorBody)))]
pub async fn search(
    State(s): State<AppState>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Json<SearchPage>, ApiError> {
    let q = query(q)?;
    if q.format.is_some() {
        return Err(ApiError::bad_request(
            "invalid_query",
            "format: only for /v1/messages/export",
        ));
    }
    let filter = filter_of(&q)?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if limit == 0 || limit > MAX_PAGE {
        return Err(ApiError::bad_request(
            "invalid_query",
            format!("limit: {limit} is not in 1..={MAX_PAGE}"),
        ));
    }
    let page = s.engine.store().search(filter, limit, q.cursor).await?;
    Ok(Json(SearchPage {
        messages: page.messages,
        next_cursor: page.next_cursor,
    }))
}

const CSV_COLUMNS: &str = "id,queue,state,priority,attempts,key,idempotency_key,created_at,updated_at,due_at,finished_at,dead_reason,error_class,last_error,headers,payload\n";

fn csv_field(out: &mut String, v: &str) {
    if v.contains([',', '"', '\n', '\r']) {
        out.push('"');
        out.push_str(&v.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(v);
    }
}

fn csv_row(m: &Message) -> String {
    let ts = |t: Option<Timestamp>| t.map(|t| t.to_rfc3339()).unwrap_or_default();
    let fields = [
        m.id.to_string(),
        m.queue.clone(),
        m.state.as_str().to_owned(),
        m.priority.to_string(),
        m.attempts.to_string(),
        m.key.clone().unwrap_or_default(),
        m.idempotency_key.clone().unwrap_or_default(),
        m.created_at.to_rfc3339(),
        m.updated_at.to_rfc3339(),
        ts(m.due_at),
        ts(m.finished_at),
        m.dead_reason
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default(),
        m.last_error
            .as_ref()
            .map(|e| e.class.as_str().to_owned())
            .unwrap_or_default(),
        m.last_error
            .as_ref()
            .and_then(|e| e.message.clone())
            .unwrap_or_default(),
        if m.headers.is_empty() {
            String::new()
        } else {
            serde_json::to_string(&m.headers).unwrap_or_default()
        },
        serde_json::to_string(&m.payload).unwrap_or_default(),
    ];
    let mut out = String::new();
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        csv_field(&mut out, f);
    }
    out.push('\n');
    out
}

/// Export every message matching the filters, streamed (CSV or JSON lines).
#[utoipa::path(get, path = "/v1/messages/export", tag = "messages", params(SearchQuery),
    responses((status = 200, description = "The whole result set, streamed", content_type = "text/csv"),
        (status = 400, description = "Bad filter", body = ErrorBody)))]
pub async fn export(
    State(s): State<AppState>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = query(q)?;
    let filter = filter_of(&q)?;
    let csv = match q.format.as_deref().unwrap_or("csv") {
        "csv" => true,
        "jsonl" => false,
        other => {
            return Err(ApiError::bad_request(
                "invalid_query",
                format!("format: {other:?} is not csv or jsonl"),
            ))
        }
    };
    let store = s.engine.store().clone();
    struct Cursor {
        next: Option<String>,
        first: bool,
        done: bool,
    }
    let start = Cursor {
        next: q.cursor.clone(),
        first: true,
        done: false,
    };
    let stream = futures_util::stream::unfold(start, move |mut c| {
        let store = store.clone();
        let filter = filter.clone();
        async move {
            if c.done {
                return None;
            }
            let mut chunk = String::new();
            if c.first && csv {
                chunk.push_str(CSV_COLUMNS);
            }
            c.first = false;
            match store.search(filter, EXPORT_CHUNK, c.next.take()).await {
                Ok(page) => {
                    for m in &page.messages {
                        if csv {
                            chunk.push_str(&csv_row(m));
                        } else {
                            chunk.push_str(&serde_json::to_string(m).unwrap_or_default());
                            chunk.push('\n');
                        }
                    }
                    c.next = page.next_cursor;
                    c.done = c.next.is_none();
                    Some((Ok::<Bytes, std::io::Error>(Bytes::from(chunk)), c))
                }
                Err(e) => {
                    tracing::error!(error = %e, "export failed mid-stream");
                    c.done = true;
                    Some((Err(std::io::Error::other("export failed")), c))
                }
            }
        }
    });
    let (ctype, ext) = if csv {
        ("text/csv; charset=utf-8", "csv")
    } else {
        ("application/x-ndjson", "jsonl")
    };
    Ok((
        [
            (header::CONTENT_TYPE, ctype.to_owned()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"redrive-export.{ext}\""),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_quotes_when_needed() {
        let mut s = String::new();
        csv_field(&mut s, "a,b \"c\"");
        assert_eq!(s, "\"a,b \"\"c\"\"\"");
        let mut s = String::new();
        csv_field(&mut s, "plain");
        assert_eq!(s, "plain");
    }
}
