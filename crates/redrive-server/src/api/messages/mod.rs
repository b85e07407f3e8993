//! `/v1/queues/{queue}/messages` (publish) and `/v1/messages…` (inspect, search,
//! export, redrive, kill, delete), one file per sub-resource:
//! [`publish`], [`actions`] (get, redrive, kill, delete), [`search`], [`export`].
//! The parsers shared by several of them (an error class, a reported failure) live here.

pub(crate) mod actions;
pub(crate) mod export;
mod publish;
pub(crate) mod search;

pub use actions::{
    __path_delete, __path_get, __path_kill, __path_redrive, delete, get, kill, redrive,
};
pub use export::{__path_export, export};
pub use publish::{__path_publish, publish, PublishBatch, MAX_REPORTED_ATTEMPTS};
pub(crate) use search::filter_of;
pub use search::{__path_search, search, SearchQuery, CURSOR_PATTERN, MAX_PAGE};

use super::contract::Ranges;
use super::limits::truncate_opt;
use super::{duration_field, ApiError};
use crate::Config;
use redrive_core::{ErrorClass, Failure};

/// Parse a failure class.
pub fn error_class(field: &str, raw: &str) -> Result<ErrorClass, ApiError> {
    ErrorClass::parse(raw).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_error_class",
            format!("{field}: {raw:?} is not one of transient, rate_limited, permanent"),
        )
    })
}

/// A failure from its API form; `field` prefixes error messages. A message longer than
/// `max_error_message_bytes` is cut, saying so (see [`crate::api::limits`]).
pub fn failure(
    field: &str,
    class: &str,
    message: Option<String>,
    retry_after: Option<&str>,
    cfg: &Config,
) -> Result<Failure, ApiError> {
    let class = error_class(&format!("{field}.class"), class)?;
    let retry_after_ms = match retry_after {
        Some(r) => Some(duration_field(
            &format!("{field}.retry_after"),
            r,
            Ranges::of(cfg).ahead,
        )?),
        None => None,
    };
    Ok(Failure {
        class,
        message: truncate_opt(message, cfg.max_error_message_bytes),
        retry_after_ms,
        code: None,
    })
}
