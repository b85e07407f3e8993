//! `GET /v1/messages`: search with filters and a cursor. The filters are shared with
//! the export ([`super::export`]).

use super::error_class;
use crate::api::contract::time_filter_in;
use crate::api::limits::{fitting, message_bound_bytes, JsonArray};
use crate::api::{queue_name, ApiError, AppState, ErrorBody};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::Response;
use redrive_core::{Message, State as MsgState, Timestamp};
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
    /// Created at or after: an RFC 3339 time, or a duration meaning that long ago (`12h`).
    pub since: Option<String>,
    /// Created before: an RFC 3339 time, or a duration ago (`30m`).
    pub until: Option<String>,
    /// Finished (became done or dead) at or after: an RFC 3339 time, or a duration ago. A
    /// message not finished (not done nor dead, or redriven since) never matches.
    pub finished_since: Option<String>,
    /// Finished before: an RFC 3339 time, or a duration ago.
    pub finished_until: Option<String>,
    /// A failure group's fingerprint (`GET /v1/failure-groups`), exact: the messages whose
    /// last error (or, without one, dead reason) has it. Computed for every row the other
    /// filters select: narrow it with `state=dead` and `queue`.
    pub fingerprint: Option<String>,
    /// Page size (default 100, at most 1000).
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Export only: `csv` (default) or `jsonl`.
    pub format: Option<String>,
}

/// The store's filter of `q`, every field checked (an error names it); relative times are
/// counted back from `now`.
pub(crate) fn filter_of(q: &SearchQuery, now: Timestamp) -> Result<MessageFilter, ApiError> {
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
    let time = |field: &str, v: &Option<String>| {
        v.as_deref()
            .map(|t| time_filter_in(field, t, now))
            .transpose()
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
        since: time("since", &q.since)?,
        until: time("until", &q.until)?,
        finished_since: time("finished_since", &q.finished_since)?,
        finished_until: time("finished_until", &q.finished_until)?,
        fingerprint: q.fingerprint.clone().filter(|f| !f.is_empty()),
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
    let filter = filter_of(&q, s.engine.clock().now())?;
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
