//! API errors: `{"error": {"code": "snake_case", "message": "…"}}` with the right status.
//! Internal details (backend errors) are logged, never sent. One error adds a field for
//! programs: `lease_settled` says how the lease was settled in `settled` (`acked`,
//! `nacked`, `released`, `killed`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use redrive_storage::StoreError;
use serde::Serialize;
use utoipa::ToSchema;

/// The error body of every non-2xx answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// Code and message of an error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// Stable snake_case code for programs.
    pub code: String,
    /// What went wrong, for people; names the field at fault.
    pub message: String,
    /// With `lease_settled` only: how the lease was settled (`acked`, `nacked`,
    /// `released`, `killed`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled: Option<String>,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// snake_case code.
    pub code: &'static str,
    /// Human message.
    pub message: String,
    /// With `lease_settled` only: how (`acked`, `nacked`, `released`, `killed`), sent as
    /// `settled` beside `code`.
    pub settled: Option<&'static str>,
}

impl ApiError {
    /// An error with status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            settled: None,
        }
    }

    /// 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// The JSON body of this error.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message.clone(),
                settled: self.settled.map(str::to_owned),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.body())).into_response()
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        let msg = e.to_string();
        match e {
            StoreError::NotFound(_) => Self::new(StatusCode::NOT_FOUND, "not_found", msg),
            StoreError::LeaseMismatch => Self::new(StatusCode::CONFLICT, "lease_mismatch", msg),
            StoreError::LeaseExpired => Self::new(StatusCode::CONFLICT, "lease_expired", msg),
            StoreError::LeaseSettled(how) => Self {
                settled: Some(how.as_str()),
                ..Self::new(StatusCode::CONFLICT, "lease_settled", msg)
            },
            StoreError::InvalidState { .. } => {
                Self::new(StatusCode::CONFLICT, "invalid_state", msg)
            }
            StoreError::IdempotencyConflict { .. } => {
                Self::new(StatusCode::CONFLICT, "idempotency_conflict", msg)
            }
            StoreError::Poisoned(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_poisoned", msg)
            }
            StoreError::Unavailable(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_unavailable", msg)
            }
            StoreError::Superseded(_) => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "store_superseded", msg)
            }
            StoreError::Closed => Self::new(StatusCode::SERVICE_UNAVAILABLE, "shutting_down", msg),
            StoreError::Fenced { .. } => {
                Self::new(StatusCode::SERVICE_UNAVAILABLE, "not_leader", msg)
            }
            StoreError::InvalidCursor(_) => Self::bad_request("invalid_cursor", msg),
            StoreError::TaskNotFound(_) => Self::new(StatusCode::NOT_FOUND, "not_found", msg),
            StoreError::InvalidTaskState { .. } => {
                Self::new(StatusCode::CONFLICT, "invalid_task_state", msg)
            }
            // `StoreError` is non-exhaustive: a kind this build does not know is a 500.
            other => {
                let detail = other.to_string();
                tracing::error!(%detail, "storage backend error");
                Self::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "internal",
                    "internal error (logged on the server)",
                )
            }
        }
    }
}
