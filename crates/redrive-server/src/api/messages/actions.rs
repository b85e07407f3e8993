//! Operator actions on one message: `GET`/`DELETE /v1/messages/{id}`,
//! `POST /v1/messages/{id}/redrive` and `/kill`.

use crate::api::auth::Caller;
use crate::api::limits::truncate_opt;
use crate::api::{message_id, ApiError, ApiJson, AppState, ErrorBody};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::{Extension, Json};
use redrive_core::Message;
use redrive_storage::{NewAudit, StoreError};
use serde::Deserialize;
use utoipa::ToSchema;

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
    load(&s, &id).await.map(Json)
}

/// The message whose id is `raw` (as given in a path), with its history; 404 when none.
pub(crate) async fn load(s: &AppState, raw: &str) -> Result<Message, ApiError> {
    let id = message_id(raw)?;
    Ok(s.engine
        .store()
        .get(id)
        .await?
        .ok_or_else(|| StoreError::NotFound(id.to_string()))?)
}

/// Delete a message (any state). Its idempotency key is forgotten.
#[utoipa::path(delete, path = "/v1/messages/{id}", tag = "messages",
    params(("id" = String, Path, description = "Message id")),
    responses((status = 200, description = "Deleted; the message as it was"),
        (status = 404, description = "No such message", body = ErrorBody)))]
pub async fn delete(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let m = act(&s, &caller, &id, Action::Delete).await?;
    Ok(Json(serde_json::json!({"deleted": true, "message": m})))
}

/// The body of a redrive (optional).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RedriveBody {
    /// A new payload to redrive the message with (an operator's fix); the history says it
    /// was edited. At most `max_payload_bytes` of JSON.
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Value>,
}

/// Redrive: a dead or scheduled message becomes ready now, with a fresh attempt budget;
/// with `payload`, its payload is replaced first.
#[utoipa::path(post, path = "/v1/messages/{id}/redrive", tag = "messages",
    params(("id" = String, Path, description = "Message id")),
    request_body(content = RedriveBody, description = "Optional"),
    responses((status = 200, description = "The message, now ready"),
        (status = 400, description = "Payload too large", body = ErrorBody),
        (status = 404, description = "No such message", body = ErrorBody),
        (status = 409, description = "Not dead or scheduled", body = ErrorBody)))]
pub async fn redrive(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<RedriveBody>,
) -> Result<Json<Message>, ApiError> {
    act(&s, &caller, &id, Action::Redrive(body.payload))
        .await
        .map(Json)
}

/// An operator action on one message.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// Redrive, with a new payload when given.
    Redrive(Option<serde_json::Value>),
    /// Kill, with a reason (already cut to `max_error_message_bytes`).
    Kill(Option<String>),
    /// Delete.
    Delete,
}

/// Do `action` to message `id` (as given in a path) and record it in the audit log as
/// `caller`'s: the one path of the API's and the console's single-message actions.
pub(crate) async fn act(
    s: &AppState,
    caller: &Caller,
    id: &str,
    action: Action,
) -> Result<Message, ApiError> {
    let id = message_id(id)?;
    let (m, name, detail) = match action {
        Action::Redrive(payload) => {
            if let Some(p) = &payload {
                let bytes = serde_json::to_string(p).map_or(0, |t| t.len());
                if bytes > s.config.max_payload_bytes {
                    return Err(ApiError::new(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        format!(
                            "payload: {bytes} bytes of JSON, more than max_payload_bytes ({})",
                            s.config.max_payload_bytes
                        ),
                    ));
                }
            }
            let name = if payload.is_some() {
                "message.edit_redrive"
            } else {
                "message.redrive"
            };
            (s.engine.redrive(id, payload).await?, name, None)
        }
        Action::Kill(reason) => (
            s.engine.kill(id, reason.clone()).await?,
            "message.kill",
            reason,
        ),
        Action::Delete => (s.engine.delete(id).await?, "message.delete", None),
    };
    audit_one(s, caller, name, &m, detail).await;
    Ok(m)
}

/// Record an action on one message in the audit log.
async fn audit_one(
    s: &AppState,
    caller: &Caller,
    action: &str,
    m: &Message,
    detail: Option<String>,
) {
    s.engine
        .audit(NewAudit {
            actor: caller.name.clone(),
            action: action.to_owned(),
            target: Some(m.id.to_string()),
            filter: Some(serde_json::json!({ "queue": m.queue })),
            count: 1,
            detail,
            node: Some(s.engine.node().to_owned()),
        })
        .await;
}

/// The body of a kill.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct KillBody {
    /// Why, for the history (cut to `max_error_message_bytes`, saying so).
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
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<KillBody>,
) -> Result<Json<Message>, ApiError> {
    let reason = truncate_opt(body.reason, s.config.max_error_message_bytes);
    act(&s, &caller, &id, Action::Kill(reason)).await.map(Json)
}
