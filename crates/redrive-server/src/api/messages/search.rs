//! `GET /v1/messages`: search with filters and a cursor. The filters are shared with
//! the export ([`super::export`]).

use super::error_class;
use crate::api::limits::{fitting, message_bound_bytes, JsonArray};
use crate::api::{queue_name, timestamp_field, ApiError, AppState, ErrorBody};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Response;
use redrive_core::{Message, State as MsgState};
use redrive_storage::MessageFilter;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

/// Default page of a search.
const DEFAULT_PAGE: u32 = 100;
/// Largest page of a search (fewer when `max_response_bytes` is reached first).
pub const MAX_PAGE: u32 = 1_000;
/// A cursor as the store writes it in `next_cursor` (a row number); anything else is a 400
/// `invalid_cursor`. Stated in the OpenAPI document: it must follow the store's encoding.
pub const CURSOR_PATTERN: &str = "^[1-9][0-9]{0,17}$";

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

pub(crate) fn filter_of(q: &SearchQuery) -> Result<MessageFilter, ApiError> {
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
        let digits = c.bytes().all(|b| b.is_ascii_digit());
        if c.is_empty() || c.len() > 18 || !digits || c.starts_with('0') {
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

pub(super) fn query(
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<SearchQuery, ApiError> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request("invalid_query", e.body_text()))
}

/// A page of search results.
#[derive(Debug, Serialize, ToSchema)]
pub struct SearchPage {
    /// Messages, newest first, without history.
    #[schema(value_type = Vec<Object>)]
    pub messages: Vec<Message>,
    /// Pass as `cursor` for the next page; null at the end. A page may hold fewer than
    /// `limit` messages and still have one (the page reached `max_response_bytes`).
    pub next_cursor: Option<String>,
}

/// Search messages, newest first, with a cursor. A page stays under `max_response_bytes`:
/// it may hold fewer than `limit` messages and still have a `next_cursor`.
#[utoipa::path(get, path = "/v1/messages", tag = "messages", params(SearchQuery),
    responses((status = 200, body = SearchPage), (status = 400, description = "Bad filter, naming it", body = ErrorBody)))]
pub async fn search(
    State(s): State<AppState>,
    q: Result<Query<SearchQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
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
    // Fetch as many messages as surely fit in what is left of `max_response_bytes`, and
    // again while room is left (see `limits`): a page ends early, with a `next_cursor`,
    // rather than grow past the budget.
    let cfg = &s.config;
    let bound = message_bound_bytes(cfg);
    let mut out = JsonArray::new("{\"messages\":");
    let mut cursor = q.cursor;
    loop {
        let want = (limit as usize - out.count()).min(fitting(
            cfg.max_response_bytes.saturating_sub(out.bytes()),
            bound,
        ));
        if want == 0 {
            break;
        }
        let page = s
            .engine
            .store()
            .search(filter.clone(), want as u32, cursor)
            .await?;
        for m in &page.messages {
            out.push(m)?;
        }
        cursor = page.next_cursor;
        if cursor.is_none() {
            break;
        }
    }
    let next = serde_json::to_string(&cursor).unwrap_or_else(|_| "null".to_owned());
    Ok(out.finish(&format!(",\"next_cursor\":{next}}}")))
}
