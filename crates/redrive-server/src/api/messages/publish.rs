//! `POST /v1/queues/{queue}/messages`: publish one message or a batch (all or nothing).

use super::failure;
use crate::api::contract::Ranges;
use crate::api::limits::{check_headers, MAX_KEY_CHARS};
use crate::api::{
    due_after, duration_field, from_value, queue_name, timestamp_field, ApiError, ApiJson,
    AppState, ErrorBody,
};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use redrive_core::{Message, NewMessage, Timestamp};
use serde::Deserialize;
use std::collections::BTreeMap;
use utoipa::ToSchema;

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
    /// Attempts already made elsewhere, this failure included (1 to 1,000,000; default 1):
    /// the message arrives with that many attempts in its count, and the policy's
    /// `max_attempts` counts them all (a retry table's `fail_times`, an `x-retry-count`).
    #[serde(default, deserialize_with = "crate::api::contract::opt_integral")]
    pub attempts: Option<i64>,
}

/// The largest `failed.attempts`: far above any retry budget, far below `u32::MAX`.
pub const MAX_REPORTED_ATTEMPTS: i64 = 1_000_000;

/// One message to publish. `payload` is required; `delay` and `deliver_at` exclude each other.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishItem {
    /// Any JSON value.
    #[schema(value_type = Object)]
    pub payload: Option<serde_json::Value>,
    /// String headers. `[]` counts as none (PHP's `json_encode` of an empty array); any
    /// other array is refused.
    #[serde(default, deserialize_with = "headers_or_empty_array")]
    #[schema(value_type = Option<BTreeMap<String, String>>)]
    pub headers: Option<BTreeMap<String, String>>,
    /// Ordering / partition key.
    pub key: Option<String>,
    /// Idempotency key (per queue, within the idempotency window).
    pub idempotency_key: Option<String>,
    /// 0–9, higher first. Default 0.
    #[serde(default, deserialize_with = "crate::api::contract::opt_integral")]
    pub priority: Option<i64>,
    /// Deliver after this delay, e.g. `"30s"` (at most `max_schedule_ahead`).
    pub delay: Option<String>,
    /// Deliver at this RFC 3339 time (at most `max_schedule_ahead` from now).
    pub deliver_at: Option<String>,
    /// A failure seen elsewhere: recorded as attempt `failed.attempts` (default 1) and
    /// scheduled by the policy — at `deliver_at` (or after `delay`) when one is given, else
    /// after the policy's delay; dead at once when the policy ends it (permanent, attempts
    /// spent, past `max_age`).
    pub failed: Option<FailedReport>,
    /// Push delivery: this message's own endpoint (`http://` or `https://`, at most 2048
    /// characters), used instead of the queue's `url`. Only on a push queue with
    /// `allow_message_targets = true`.
    pub target_url: Option<String>,
}

/// `headers`: a map of strings, `null`, or an empty array taken as no headers — what PHP's
/// `json_encode` makes of an empty `array()` / `[]`, since PHP has one type for lists and
/// maps (issue 15). A non-empty array is still a 400: its items have no names.
fn headers_or_empty_array<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    struct Headers;
    impl<'de> serde::de::Visitor<'de> for Headers {
        type Value = Option<BTreeMap<String, String>>;

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a map of strings (an empty array [] counts as no headers)")
        }

        fn visit_unit<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_none<E: serde::de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
            BTreeMap::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(Some)
        }

        fn visit_seq<A: serde::de::SeqAccess<'de>>(
            self,
            mut seq: A,
        ) -> Result<Self::Value, A::Error> {
            match seq.next_element::<serde::de::IgnoredAny>()? {
                None => Ok(None),
                Some(_) => Err(serde::de::Error::invalid_type(
                    serde::de::Unexpected::Seq,
                    &"a map of strings (only an empty array [] is taken, as no headers)",
                )),
            }
        }
    }
    d.deserialize_any(Headers)
}

/// A batch publish: all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PublishBatch {
    /// The messages.
    pub messages: Vec<serde_json::Value>,
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
            if v.is_empty() || v.chars().count() > MAX_KEY_CHARS {
                return Err(ApiError::bad_request(
                    "invalid_key",
                    format!("{}: must have 1 to {MAX_KEY_CHARS} characters", field(name)),
                ));
            }
        }
    }
    // A schedule beyond `max_schedule_ahead` is refused (issue 5, defect 12): a typo such as
    // "3000d" would otherwise park a message for years, and past year 9999 a due time no
    // longer renders as RFC 3339.
    let max_ahead = s.config.max_schedule_ahead;
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
        (Some(d), None) => {
            let ms = duration_field(&field("delay"), d, Ranges::of(&s.config).ahead)?;
            // A zero delay is due now by the store's clock; with `failed` it is still the
            // caller's time for the next try, not the policy's delay.
            (ms > 0 || item.failed.is_some()).then(|| due_after(now, ms))
        }
        (None, Some(t)) => {
            let at = timestamp_field(&field("deliver_at"), t)?;
            if at > now.plus_ms(max_ahead.ms()) {
                return Err(ApiError::bad_request(
                    "invalid_timestamp",
                    format!(
                        "{}: {t} is more than {max_ahead} ahead (max_schedule_ahead)",
                        field("deliver_at")
                    ),
                ));
            }
            Some(at)
        }
        (None, None) => None,
    };
    let (failed, attempts_before) = match &item.failed {
        Some(f) => {
            let attempts = match f.attempts {
                None => 1,
                Some(n @ 1..=MAX_REPORTED_ATTEMPTS) => n as u32,
                Some(n) => {
                    return Err(ApiError::bad_request(
                        "invalid_attempts",
                        format!(
                            "{}: {n} is not in 1..={MAX_REPORTED_ATTEMPTS} (attempts made elsewhere, this failure included)",
                            field("failed.attempts")
                        ),
                    ))
                }
            };
            let failure = failure(
                &field("failed"),
                &f.class,
                f.message.clone(),
                f.retry_after.as_deref(),
                &s.config,
            )?;
            (Some(failure), attempts - 1)
        }
        None => (None, 0),
    };
    let headers = item.headers.unwrap_or_default();
    check_headers(&field("headers"), &headers, &s.config)?;
    check_push_headers(&field("headers"), &headers, queue, s)?;
    let target_url = match item.target_url {
        None => None,
        Some(t) => Some(target_url(&field("target_url"), t, queue, s)?),
    };
    Ok(NewMessage {
        attempts_before,
        target_url,
        queue: queue.to_owned(),
        payload,
        headers,
        key: item.key,
        idempotency_key: item.idempotency_key,
        priority,
        deliver_at,
        failed,
    })
}

/// On a push queue, refuse a header the push request owns (SPEC §10: transport and hop-by-hop
/// headers, `content-type`, `webhook-*`, `redrive-*`), naming it: it would not be sent.
fn check_push_headers(
    field: &str,
    headers: &BTreeMap<String, String>,
    queue: &str,
    s: &AppState,
) -> Result<(), ApiError> {
    if !s.engine.push().is_push(queue) {
        return Ok(());
    }
    match headers
        .keys()
        .find(|n| redrive_push::send::is_server_owned_header(n))
    {
        None => Ok(()),
        Some(name) => Err(ApiError::bad_request(
            "reserved_header",
            format!(
                "{field}.{name}: queue {queue} is a push queue, and its requests' {name} header is redrive's (transport and hop-by-hop headers, content-type, webhook-* and redrive-* are set by the server); leave it out"
            ),
        )),
    }
}

/// Longest `target_url`.
const MAX_TARGET_URL_CHARS: usize = 2048;

/// Check a message's `target_url`: the queue must allow it, and it must be an http(s) URL.
/// Where it may connect is the SSRF guard's business, at connect time.
fn target_url(field: &str, t: String, queue: &str, s: &AppState) -> Result<String, ApiError> {
    if !s.engine.push().allows_message_targets(queue) {
        return Err(ApiError::bad_request(
            "target_not_allowed",
            format!(
                "{field}: queue {queue} does not take message targets (it needs delivery = \"push\" \
                 and allow_message_targets = true in [queues.{queue}.push])"
            ),
        ));
    }
    let bad = |why: &str| ApiError::bad_request("invalid_target_url", format!("{field}: {why}"));
    if t.chars().count() > MAX_TARGET_URL_CHARS {
        return Err(bad(&format!(
            "longer than {MAX_TARGET_URL_CHARS} characters"
        )));
    }
    let url = redrive_push::Url::parse(&t).map_err(|e| bad(&format!("not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(bad("must be an http:// or https:// URL with a host"));
    }
    Ok(url.to_string())
}

/// Publish one message, or a batch (`{"messages": [...]}`, all or nothing).
#[utoipa::path(post, path = "/v1/queues/{queue}/messages", tag = "messages",
    params(("queue" = String, Path, description = "Queue name, [A-Za-z0-9._:-]{1,128}")),
    request_body(content = PublishItem, description = "One message, or {\"messages\": [PublishItem, …]} for a batch"),
    responses(
        (status = 201, description = "Created: the message, or {\"messages\": [...], \"replayed\": [bool, …]} (`replayed[i]`: item i was an idempotent replay)"),
        (status = 200, description = "Idempotent replay: the original message(s); for a batch, every item was one"),
        (status = 400, description = "Bad input, naming the field (and item index); on a push queue, `reserved_header` for a header the push request owns", body = ErrorBody),
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
        let replayed: Vec<bool> = out.iter().map(|p| p.replayed).collect();
        let messages: Vec<Message> = out.into_iter().map(|p| p.message).collect();
        return Ok((
            status,
            Json(serde_json::json!({ "messages": messages, "replayed": replayed })),
        )
            .into_response());
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
