//! Reads: one message, the operator's search and counts, queue statistics, idempotency
//! keys by prefix, and the next wake-up. They run on a pooled connection outside any
//! transaction of ours (each statement sees what was committed when it started: `READ
//! COMMITTED`).

use crate::error::E;
use crate::row::{columns, state_of, Row};
use crate::sql::{args, col, query, query_opt, Db};
use crate::transitions::{next_lease_expiry, scheduled_queues};
use mysql_async::{Params, Value};
use redrive_core::{fingerprint, LastError, Message, MessageId, State, Timestamp};
use redrive_storage::filter_text::{like_pattern, prefix_end};
use redrive_storage::{MessageFilter, Page, QueueStats, StoreError};

/// The earliest scheduled due time or lease expiry, ms.
pub async fn next_wake<C: Db>(c: &mut C) -> Result<Option<i64>, E> {
    let due = scheduled_queues(c).await?.into_iter().map(|(_, d)| d).min();
    Ok(match (due, next_lease_expiry(c).await?) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    })
}

/// One message with its history.
pub async fn get<C: Db>(c: &mut C, id: &MessageId) -> Result<Option<Message>, E> {
    let sql = concat!("SELECT ", columns!(), " FROM messages WHERE id = ?");
    match query_opt(c, sql, args![id.to_string()]).await? {
        Some(r) => {
            let row = crate::row::from_my(&r)?;
            Ok(Some(crate::row::message_with_history(c, &row).await?))
        }
        None => Ok(None),
    }
}

/// The live idempotency keys of `queue` beginning with `prefix`, in key order: a range of
/// the primary key (`VARBINARY`: byte order, which is code point order for UTF-8).
pub async fn idempotency_keys<C: Db>(
    c: &mut C,
    queue: &str,
    prefix: &str,
    limit: u32,
    now: Timestamp,
) -> Result<Vec<(String, MessageId)>, E> {
    let limit = i64::from(limit);
    let t = now.as_millis();
    let rows = match prefix_end(prefix) {
        Some(end) => {
            query(
                c,
                "SELECT ikey, message_id FROM idempotency WHERE queue = ? AND ikey >= ? \
                 AND ikey < ? AND expires_at > ? ORDER BY ikey LIMIT ?",
                args![queue, prefix, end, t, limit],
            )
            .await?
        }
        None => {
            query(
                c,
                "SELECT ikey, message_id FROM idempotency WHERE queue = ? AND ikey >= ? \
                 AND expires_at > ? ORDER BY ikey LIMIT ?",
                args![queue, prefix, t, limit],
            )
            .await?
        }
    };
    rows.iter()
        .map(|r| {
            let id: String = col(r, 1)?;
            Ok((col(r, 0)?, crate::row::parse_id(&id)?))
        })
        .collect()
}

/// The `WHERE` conditions of `filter` but its fingerprint (that is computed from each row
/// read, in Rust: [`fingerprint::of_parts`], the function failure groups use), with their
/// arguments appended to `args`.
fn conditions(filter: &MessageFilter, args: &mut Vec<Value>) -> Vec<String> {
    let mut clauses = Vec::new();
    if let Some(q) = &filter.queue {
        args.push(q.as_str().into());
        clauses.push("queue = ?".to_owned());
    }
    if let Some(s) = filter.state {
        clauses.push(format!("state = {}", s.code()));
    }
    if let Some(k) = &filter.key {
        args.push(k.as_str().into());
        clauses.push("msg_key = ?".to_owned());
    }
    if let Some(c) = filter.error_class {
        args.push(c.as_str().into());
        clauses.push("error_class = ?".to_owned());
    }
    if let Some(t) = &filter.text {
        // Case-insensitive like the SQLite store's LIKE.
        let p = like_pattern(t).to_lowercase();
        args.push(p.as_str().into());
        args.push(p.as_str().into());
        clauses.push(
            "(LOWER(payload) LIKE ? OR LOWER(JSON_UNQUOTE(JSON_EXTRACT(last_error, '$.message'))) LIKE ?)"
                .to_owned(),
        );
    }
    let times = [
        (filter.since, "created_at >= ?"),
        (filter.until, "created_at < ?"),
        (filter.finished_since, "finished_at >= ?"),
        (filter.finished_until, "finished_at < ?"),
    ];
    for (t, cond) in times {
        if let Some(t) = t {
            args.push(t.as_millis().into());
            clauses.push(cond.to_owned());
        }
    }
    clauses
}

/// The fingerprint of a row's last error and dead reason.
fn row_fingerprint(last_error: Option<&str>, dead_reason: Option<&str>) -> Result<String, E> {
    let last: Option<LastError> = match last_error {
        Some(s) => Some(serde_json::from_str(s)?),
        None => None,
    };
    Ok(fingerprint::of_parts(
        last.as_ref().map(|e| (e.class, e.message.as_deref())),
        dead_reason.and_then(redrive_core::DeadReason::parse),
    ))
}

/// Rows read per statement while a fingerprint filter is applied to what was read.
const FINGERPRINT_CHUNK: i64 = 500;

/// How many messages match `filter`.
pub async fn count<C: Db>(c: &mut C, filter: &MessageFilter) -> Result<u64, E> {
    let Some(fp) = &filter.fingerprint else {
        let mut a = Vec::new();
        let clauses = conditions(filter, &mut a);
        let where_ = if clauses.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", clauses.join(" AND "))
        };
        let sql = format!("SELECT COUNT(*) FROM messages {where_}");
        let r = query(c, &sql, Params::Positional(a)).await?;
        let n: i64 = match r.first() {
            Some(r) => col(r, 0)?,
            None => 0,
        };
        return Ok(n.max(0) as u64);
    };
    let mut n = 0u64;
    let mut before = i64::MAX;
    loop {
        let mut a = Vec::new();
        let mut clauses = conditions(filter, &mut a);
        a.push(before.into());
        clauses.push("seq < ?".to_owned());
        a.push(FINGERPRINT_CHUNK.into());
        let sql = format!(
            "SELECT seq, last_error, dead_reason FROM messages WHERE {} ORDER BY seq DESC LIMIT ?",
            clauses.join(" AND ")
        );
        let rows = query(c, &sql, Params::Positional(a)).await?;
        for r in &rows {
            let le: Option<String> = col(r, 1)?;
            let dr: Option<String> = col(r, 2)?;
            if row_fingerprint(le.as_deref(), dr.as_deref())? == *fp {
                n += 1;
            }
            before = col(r, 0)?;
        }
        if (rows.len() as i64) < FINGERPRINT_CHUNK {
            return Ok(n);
        }
    }
}

/// Messages matching `filter`, newest first, `limit` at a time (see
/// [`redrive_storage::Store::search`]); the cursor is the `seq` of the last row handed out.
pub async fn search<C: Db>(
    c: &mut C,
    filter: &MessageFilter,
    limit: u32,
    cursor: Option<&str>,
) -> Result<Page, E> {
    let limit = limit.max(1) as usize;
    let mut before = match cursor {
        Some(cur) => parse_cursor(cur)?,
        None => i64::MAX,
    };
    let chunk = if filter.fingerprint.is_some() {
        FINGERPRINT_CHUNK
    } else {
        limit as i64 + 1
    };
    let mut rows: Vec<Row> = Vec::new();
    'read: loop {
        let mut a = Vec::new();
        let mut clauses = conditions(filter, &mut a);
        a.push(before.into());
        clauses.push("seq < ?".to_owned());
        a.push(chunk.into());
        let sql = format!(
            concat!(
                "SELECT ",
                columns!(),
                " FROM messages WHERE {} ORDER BY seq DESC LIMIT ?"
            ),
            clauses.join(" AND ")
        );
        let got = query(c, &sql, Params::Positional(a)).await?;
        let n = got.len();
        for r in &got {
            let row = crate::row::from_my(r)?;
            before = row.seq;
            let keep = match &filter.fingerprint {
                None => true,
                Some(fp) => {
                    let dead = row.life.dead_reason.map(|d| d.as_str());
                    row_fingerprint(row.last_error.as_deref(), dead)? == *fp
                }
            };
            if keep {
                rows.push(row);
                if rows.len() > limit {
                    break 'read;
                }
            }
        }
        if (n as i64) < chunk {
            break;
        }
    }
    let next_cursor = if rows.len() > limit {
        rows.truncate(limit);
        rows.last().map(|r| r.seq.to_string())
    } else {
        None
    };
    let messages = rows
        .iter()
        .map(|r| r.to_message(None, None))
        .collect::<Result<_, _>>()?;
    Ok(Page {
        messages,
        next_cursor,
    })
}

/// The `seq` of a cursor this store handed out: decimal digits only, a positive `i64`.
fn parse_cursor(c: &str) -> Result<i64, E> {
    let invalid = || E::Logic(StoreError::InvalidCursor(c.to_owned()));
    if c.is_empty() || !c.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match c.parse::<i64>() {
        Ok(seq) if seq > 0 => Ok(seq),
        _ => Err(invalid()),
    }
}

/// Counts per state of every queue that has messages, with its oldest ready due time.
pub async fn queue_stats<C: Db>(c: &mut C) -> Result<Vec<QueueStats>, E> {
    let rows = query(
        c,
        "SELECT queue, state, COUNT(*), MIN(CASE WHEN state = 1 THEN due_at END) \
         FROM messages GROUP BY queue, state ORDER BY queue, state",
        Params::Empty,
    )
    .await?;
    let mut out: Vec<QueueStats> = Vec::new();
    for r in &rows {
        let queue: String = col(r, 0)?;
        let state = state_of(col(r, 1)?)?;
        let n: i64 = col(r, 2)?;
        let oldest: Option<i64> = col(r, 3)?;
        if out.last().is_none_or(|s| s.queue != queue) {
            out.push(QueueStats {
                queue,
                counts: [0; 5],
                oldest_ready_due: None,
            });
        }
        if let Some(s) = out.last_mut() {
            s.counts[state.code() as usize] = n.max(0) as u64;
            if state == State::Ready {
                s.oldest_ready_due = oldest.map(Timestamp::from_millis);
            }
        }
    }
    Ok(out)
}
