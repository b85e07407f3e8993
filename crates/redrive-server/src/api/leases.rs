//! Consuming: `POST /v1/queues/{queue}/leases`, ack, nack, release, extend, and the batch
//! forms of ack and nack. A call with the token of a lease that is no longer live is a 409
//! naming why: `lease_mismatch` (another token: the message was leased again, or the token
//! is garbage), `lease_settled` (this lease was already acked, nacked, released or ended
//! by a kill; `settled` says which) or `lease_expired` (it ran out).

use super::contract::Ranges;
use super::limits::{message_bound_bytes, JsonArray, MESSAGE_FIXED_BYTES};
use super::messages::failure;
use super::{
    due_after, duration_field, message_id, queue_name, ApiError, ApiJson, AppState, ErrorBody,
};
use crate::Config;
use axum::extract::{Path, State};
use axum::response::Response;
use axum::Json;
use redrive_core::{ErrorClass, Failure, LastError, Message, Timestamp};
use redrive_storage::{LeaseRef, Nack, Release, ReleaseBy, StoreError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::ToSchema;

/// A lease request. Every field is optional.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseBody {
    /// At most this many messages (default 1, at most `max_batch`).
    #[serde(default, deserialize_with = "super::contract::opt_integral")]
    #[schema(value_type = Option<u32>)]
    pub max: Option<i64>,
    /// Lease length (default: the queue's `lease`, else 30s; at most `max_lease`).
    pub lease: Option<String>,
    /// Long-poll up to this long when nothing is ready (default 0s, at most `max_wait`).
    pub wait: Option<String>,
}

/// A leased message.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeasedMessage {
    /// Message id.
    pub id: String,
    /// The lease token to present to ack / nack / release / extend.
    pub lease: String,
    /// This delivery's attempt number (1 = first).
    pub attempt: u32,
    /// The attempt number of the last try: when `attempt == max_attempts`, a failure of
    /// this attempt that counts makes the message dead (`max_attempts`). The queue's
    /// `max_attempts` until a redrive (a fresh budget, the attempt numbers going on) or
    /// uncharged rate limits move it on; `max_age` or a permanent failure can end the
    /// message before it.
    pub max_attempts: u32,
    /// The payload.
    #[schema(value_type = Object)]
    pub payload: serde_json::Value,
    /// Headers.
    pub headers: BTreeMap<String, String>,
    /// Ordering key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Queue.
    pub queue: String,
    /// Priority.
    pub priority: u8,
    /// Publish time (RFC 3339).
    pub created_at: String,
    /// When the lease expires (RFC 3339).
    pub lease_expires_at: String,
    /// The previous attempt's error, on a retry.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub last_error: Option<LastError>,
}

/// The answer to a lease request.
#[derive(Debug, Serialize, ToSchema)]
pub struct LeaseResponse {
    /// Possibly empty.
    pub messages: Vec<LeasedMessage>,
}

/// Lease ready messages, optionally long-polling. The answer stays under
/// `max_response_bytes`: fewer than `max` messages (at least one when any is ready) rather
/// than more bytes.
#[utoipa::path(post, path = "/v1/queues/{queue}/leases", tag = "leases",
    params(("queue" = String, Path, description = "Queue name")),
    request_body(content = LeaseBody, description = "Optional"),
    responses((status = 200, body = LeaseResponse), (status = 400, description = "Bad input", body = ErrorBody),
        (status = 409, description = "push_queue / bridge_queue: redrive itself delivers the queue (push or a bridge), it has no pull consumers", body = ErrorBody)))]
pub async fn lease(
    State(s): State<AppState>,
    Path(queue): Path<String>,
    ApiJson(body): ApiJson<LeaseBody>,
) -> Result<Response, ApiError> {
    queue_name(&queue)?;
    if let Some(bridge) = s.engine.bridges().serves(&queue) {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "bridge_queue",
            format!(
                "queue {queue} is delivered by bridge {bridge}: redrive republishes its messages \
                 to RabbitMQ, there is nothing to lease (see GET /v1/bridges)"
            ),
        ));
    }
    if s.engine.push().is_push(&queue) {
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "push_queue",
            format!(
                "queue {queue} has delivery = \"push\": redrive delivers its messages to its endpoint, \
                 there is nothing to lease (see GET /v1/endpoints)"
            ),
        ));
    }
    let cfg = &*s.config;
    let max = body.max.unwrap_or(1);
    let max = match u32::try_from(max) {
        Ok(m) if m >= 1 && m as usize <= cfg.max_batch => m,
        _ => {
            return Err(ApiError::bad_request(
                "invalid_max",
                format!("max: {max} is not in 1..={} (max_batch)", cfg.max_batch),
            ))
        }
    };
    let ranges = Ranges::of(cfg);
    let lease_ms = match &body.lease {
        Some(l) => Some(duration_field("lease", l, ranges.lease)?),
        None => None,
    };
    let wait_ms = match &body.wait {
        Some(w) => duration_field("wait", w, ranges.wait)?,
        None => 0,
    };
    // The store stops before the messages' stored JSON passes what is left of
    // `max_response_bytes` after each message's fixed part (see `limits`): fewer than `max`
    // rather than a larger answer, and never a leased message that is not in the answer.
    // It leases at least one, which the config guarantees fits (`message_bound_bytes`).
    let mut out = JsonArray::new("{\"messages\":");
    let mut wait = wait_ms;
    loop {
        let want = max as usize - out.count();
        let left = cfg.max_response_bytes.saturating_sub(out.bytes());
        let room = left.saturating_sub(want.saturating_mul(MESSAGE_FIXED_BYTES));
        if want == 0 || (out.count() > 0 && room == 0) {
            break;
        }
        // When `want` messages of the largest possible size fit anyway, the store need not
        // read their sizes first (the usual case: max ≤ 58 with the default limits).
        let surely_fits = want.saturating_mul(message_bound_bytes(cfg)) <= left;
        let max_bytes = (!surely_fits).then_some(room as u64);
        let leased = match s
            .engine
            .lease(&queue, want as u32, max_bytes, lease_ms, wait)
            .await
        {
            Ok(l) => l,
            Err(e) if out.count() == 0 => return Err(e.into()),
            Err(e) => {
                // The messages leased so far are answered; their consumer holds the leases.
                tracing::warn!(error = %e, "a follow-up lease failed; answering what was leased");
                break;
            }
        };
        let got = leased.len();
        for l in leased {
            out.push(&LeasedMessage {
                id: l.message.id.to_string(),
                lease: l.token,
                attempt: l.attempt,
                max_attempts: l.max_attempts,
                payload: l.message.payload,
                headers: l.message.headers,
                key: l.message.key,
                queue: l.message.queue,
                priority: l.message.priority,
                created_at: l.message.created_at.to_rfc3339(),
                lease_expires_at: l.expires_at.to_rfc3339(),
                last_error: l.message.last_error,
            })?;
        }
        if got < want {
            break; // nothing more is ready
        }
        wait = 0; // only the first request long-polls
    }
    Ok(out.finish("}"))
}

/// An ack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckBody {
    /// The lease token.
    pub lease: String,
}

/// The error of a nack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NackError {
    /// `transient`, `rate_limited` or `permanent`.
    pub class: String,
    /// What went wrong (cut to `max_error_message_bytes`, saying so).
    pub message: Option<String>,
    /// For `rate_limited`: earliest retry, e.g. `"10s"` (bounded by the policy's `max_retry_after`).
    pub retry_after: Option<String>,
}

/// A nack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NackBody {
    /// The lease token.
    pub lease: String,
    /// What went wrong (default: transient, no message).
    pub error: Option<NackError>,
}

/// A release: the lease handed back unattempted.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    /// The lease token.
    pub lease: String,
    /// Leasable again after this long, e.g. `"10s"` (default `"0s"`: ready at once, in
    /// its place). At most `max_schedule_ahead`.
    pub delay: Option<String>,
}

/// A lease extension.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendBody {
    /// The lease token.
    pub lease: String,
    /// The lease then expires this long from now (never earlier than before).
    pub by: String,
}

fn nack_failure(field: &str, e: Option<&NackError>, cfg: &Config) -> Result<Failure, ApiError> {
    match e {
        Some(e) => failure(
            field,
            &e.class,
            e.message.clone(),
            e.retry_after.as_deref(),
            cfg,
        ),
        None => Ok(Failure {
            class: ErrorClass::Transient,
            message: None,
            retry_after_ms: None,
            code: None,
        }),
    }
}

fn first<T>(mut v: Vec<Result<T, StoreError>>) -> Result<T, ApiError> {
    v.pop()
        .ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "empty result",
            )
        })?
        .map_err(ApiError::from)
}

/// Ack a leased message: it is done.
#[utoipa::path(post, path = "/v1/messages/{id}/ack", tag = "leases",
    params(("id" = String, Path, description = "Message id")), request_body = AckBody,
    responses((status = 200, description = "The message, now done"),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "lease_mismatch (another token), lease_settled (this lease was already acked, nacked, released or ended by a kill: `settled` says which) or lease_expired", body = ErrorBody)))]
pub async fn ack(
    State(s): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<AckBody>,
) -> Result<Json<Message>, ApiError> {
    let id = message_id(&id)?;
    let out = s
        .engine
        .ack(vec![LeaseRef {
            id,
            token: body.lease,
        }
        .into()])
        .await?;
    Ok(Json(first(out)?.message))
}

/// Nack a leased message: the policy schedules a retry or makes it dead.
#[utoipa::path(post, path = "/v1/messages/{id}/nack", tag = "leases",
    params(("id" = String, Path, description = "Message id")), request_body = NackBody,
    responses((status = 200, description = "The message with its new state and due_at or dead_reason"),
        (status = 400, description = "Bad error class or duration", body = ErrorBody),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "lease_mismatch (another token), lease_settled (this lease was already acked, nacked, released or ended by a kill: `settled` says which) or lease_expired", body = ErrorBody)))]
pub async fn nack(
    State(s): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<NackBody>,
) -> Result<Json<Message>, ApiError> {
    let id = message_id(&id)?;
    let failure = nack_failure("error", body.error.as_ref(), &s.config)?;
    let out = s
        .engine
        .nack(vec![Nack {
            response: None,
            waited: Vec::new(),
            lease: LeaseRef {
                id,
                token: body.lease,
            },
            failure,
        }])
        .await?;
    Ok(Json(first(out)?.message))
}

/// Hand a leased message back unattempted (a consumer shutting down, a deploy): `ready`
/// again in its place, or `scheduled` after `delay`; the attempt is not charged and no
/// history entry is written. Bounded like uncharged rate-limited attempts: after the
/// queue's `max_rate_limited` uncharged releases (since the publish or the last redrive),
/// a release counts as a failed attempt (a history entry coded `released`, the policy's
/// delay if longer than `delay`, dead after `max_attempts`), so a consumer that releases
/// all it leases cannot keep a message in a hot loop.
#[utoipa::path(post, path = "/v1/messages/{id}/release", tag = "leases",
    params(("id" = String, Path, description = "Message id")), request_body = ReleaseBody,
    responses((status = 200, description = "The message, ready (or scheduled) again with its attempt count as before the lease; past the bound, the message as the failed attempt left it"),
        (status = 400, description = "Bad delay", body = ErrorBody),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "lease_mismatch (another token), lease_settled (this lease was already acked, nacked, released or ended by a kill: `settled` says which) or lease_expired", body = ErrorBody)))]
pub async fn release(
    State(s): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ReleaseBody>,
) -> Result<Json<Message>, ApiError> {
    let id = message_id(&id)?;
    let delay_ms = match &body.delay {
        Some(d) => duration_field("delay", d, Ranges::of(&s.config).ahead)?,
        None => 0,
    };
    let until = due_after(s.engine.clock().now(), delay_ms);
    let out = s
        .engine
        .release(vec![Release {
            lease: LeaseRef {
                id,
                token: body.lease,
            },
            until,
            by: ReleaseBy::Consumer,
            waited: Vec::new(),
        }])
        .await?;
    Ok(Json(first(out)?))
}

/// The answer to an extension.
#[derive(Debug, Serialize, ToSchema)]
pub struct Extended {
    /// Message id.
    pub id: String,
    /// New lease expiry (RFC 3339).
    pub lease_expires_at: String,
}

/// Extend a lease.
#[utoipa::path(post, path = "/v1/messages/{id}/extend", tag = "leases",
    params(("id" = String, Path, description = "Message id")), request_body = ExtendBody,
    responses((status = 200, body = Extended),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "lease_mismatch (another token), lease_settled (this lease was already acked, nacked, released or ended by a kill: `settled` says which) or lease_expired", body = ErrorBody)))]
pub async fn extend(
    State(s): State<AppState>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<ExtendBody>,
) -> Result<Json<Extended>, ApiError> {
    let id = message_id(&id)?;
    let by = duration_field("by", &body.by, Ranges::of(&s.config).extend_by)?;
    let at: Timestamp = s
        .engine
        .extend(
            LeaseRef {
                id,
                token: body.lease,
            },
            by,
        )
        .await?;
    Ok(Json(Extended {
        id: id.to_string(),
        lease_expires_at: at.to_rfc3339(),
    }))
}

/// One item of a batch ack or nack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    /// Message id.
    pub id: String,
    /// Lease token.
    pub lease: String,
    /// Nack only: the error (default transient).
    pub error: Option<NackError>,
}

/// A batch ack or nack.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchBody {
    /// The items, answered in order.
    pub items: Vec<BatchItem>,
}

/// One item's answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResult {
    /// Message id as given.
    pub id: String,
    /// The HTTP status this item would have had alone.
    pub status: u16,
    /// The message after the transition, on success.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub message: Option<Message>,
    /// The error, on failure.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<super::error::ErrorDetail>,
    /// True when `message` was left out to keep the answer under `max_response_bytes`
    /// (the transition happened all the same: see `status`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub message_omitted: bool,
}

/// Answers of a batch, one per item in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResponse {
    /// One per item.
    pub items: Vec<BatchResult>,
}

fn check_batch(s: &AppState, body: &BatchBody) -> Result<(), ApiError> {
    let max = s.config.max_batch;
    if body.items.is_empty() || body.items.len() > max {
        return Err(ApiError::bad_request(
            "batch_too_large",
            format!(
                "items: {} items, a batch needs 1 to {max} (max_batch)",
                body.items.len()
            ),
        ));
    }
    Ok(())
}

fn item_result(id: String, r: Result<Message, ApiError>) -> BatchResult {
    match r {
        Ok(m) => BatchResult {
            id,
            status: 200,
            message: Some(m),
            error: None,
            message_omitted: false,
        },
        Err(e) => BatchResult {
            id,
            status: e.status.as_u16(),
            message: None,
            error: Some(e.body().error),
            message_omitted: false,
        },
    }
}

/// Run a batch: items whose id does not parse get their own 400; the rest go to the store.
async fn run_batch<T, F, Fut>(
    items: Vec<(String, Result<T, ApiError>)>,
    max_response_bytes: usize,
    call: F,
) -> Result<Response, ApiError>
where
    F: FnOnce(Vec<T>) -> Fut,
    Fut: std::future::Future<Output = Result<Vec<Result<Message, StoreError>>, StoreError>>,
{
    let mut ids = Vec::with_capacity(items.len());
    let mut valid = Vec::new();
    let mut slots: Vec<Option<ApiError>> = Vec::with_capacity(items.len());
    for (id, parsed) in items {
        ids.push(id);
        match parsed {
            Ok(v) => {
                valid.push(v);
                slots.push(None);
            }
            Err(e) => slots.push(Some(e)),
        }
    }
    let mut results = call(valid).await?.into_iter();
    // Every item is answered; past `max_response_bytes`, without its message (see `limits`).
    let mut out = JsonArray::new("{\"items\":");
    for (id, slot) in ids.into_iter().zip(slots) {
        let mut item = match slot {
            Some(e) => item_result(id, Err(e)),
            None => {
                let r = results
                    .next()
                    .unwrap_or_else(|| Err(StoreError::Backend("missing batch result".into())))
                    .map_err(ApiError::from);
                item_result(id, r)
            }
        };
        if !out.push_within(&item, max_response_bytes)? {
            item.message = None;
            item.message_omitted = true;
            out.push(&item)?;
        }
    }
    Ok(out.finish("}"))
}

/// Ack many leases; each item answered on its own.
#[utoipa::path(post, path = "/v1/messages/ack", tag = "leases", request_body = BatchBody,
    responses((status = 200, body = BatchResponse), (status = 400, description = "Malformed batch", body = ErrorBody)))]
pub async fn ack_batch(
    State(s): State<AppState>,
    ApiJson(body): ApiJson<BatchBody>,
) -> Result<Response, ApiError> {
    check_batch(&s, &body)?;
    let items = body
        .items
        .into_iter()
        .map(|i| {
            let parsed = message_id(&i.id).map(|id| LeaseRef { id, token: i.lease });
            (i.id, parsed)
        })
        .collect();
    let engine = s.engine.clone();
    run_batch(items, s.config.max_response_bytes, |refs| async move {
        Ok(engine
            .ack(refs.into_iter().map(Into::into).collect())
            .await?
            .into_iter()
            .map(|r| r.map(|a| a.message))
            .collect())
    })
    .await
}

/// Nack many leases; each item answered on its own.
#[utoipa::path(post, path = "/v1/messages/nack", tag = "leases", request_body = BatchBody,
    responses((status = 200, body = BatchResponse), (status = 400, description = "Malformed batch", body = ErrorBody)))]
pub async fn nack_batch(
    State(s): State<AppState>,
    ApiJson(body): ApiJson<BatchBody>,
) -> Result<Response, ApiError> {
    check_batch(&s, &body)?;
    let items = body
        .items
        .into_iter()
        .enumerate()
        .map(|(n, i)| {
            let parsed = message_id(&i.id).and_then(|id| {
                let failure =
                    nack_failure(&format!("items[{n}].error"), i.error.as_ref(), &s.config)?;
                Ok(Nack {
                    response: None,
                    waited: Vec::new(),
                    lease: LeaseRef { id, token: i.lease },
                    failure,
                })
            });
            (i.id, parsed)
        })
        .collect();
    let engine = s.engine.clone();
    run_batch(items, s.config.max_response_bytes, |nacks| async move {
        Ok(engine
            .nack(nacks)
            .await?
            .into_iter()
            .map(|r| r.map(|f| f.message))
            .collect())
    })
    .await
}
