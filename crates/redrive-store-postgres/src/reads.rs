//! Reads: one message, the operator's search and counts, queue statistics, idempotency
//! keys by prefix, and the next wake-up. They run on a pooled connection outside any
//! transaction of ours (each statement sees what was committed when it started).

use crate::error::E;
use crate::row::{columns, history_column, where_id, Row};
use crate::sql::{query, query_opt};
use crate::transitions::{earliest_wake, next_lease_expiry, scheduled_queues};
use deadpool_postgres::GenericClient;
use redrive_core::{fingerprint, LastError, Message, MessageId, State, Timestamp};
use redrive_storage::filter_text::{like_pattern, prefix_end};
use redrive_storage::{MessageFilter, Page, QueueStats, StoreError};
use tokio_postgres::types::ToSql;

/// The earliest scheduled due time or lease expiry, ms.
pub async fn next_wake<C: GenericClient>(c: &C) -> Result<Option<i64>, E> {
    let (scheduled, lease_expiry) = tokio::join!(scheduled_queues(c), next_lease_expiry(c));
    Ok(earliest_wake(&scheduled?, lease_expiry?))
}

/// One message with its history.
pub async fn get<C: GenericClient>(c: &C, id: &MessageId) -> Result<Option<Message>, E> {
    let sql = concat!(
        "SELECT ",
        columns!(),
        ", ",
        history_column!(),
        " FROM messages",
        where_id!()
    );
    match query_opt(c, sql, &[&id.to_string()]).await? {
        Some(r) => Ok(Some(crate::row::message_from_pg(&r)?)),
        None => Ok(None),
    }
}

/// The live idempotency keys of `queue` beginning with `prefix`, in key order: a range of
/// the primary key (`COLLATE "C"`: byte order, which is code point order for UTF-8).
pub async fn idempotency_keys<C: GenericClient>(
    c: &C,
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
                "SELECT ikey, message_id FROM idempotency WHERE queue = $1 AND ikey >= $2 \
                 AND ikey < $3 AND expires_at > $4 ORDER BY ikey LIMIT $5",
                &[&queue, &prefix, &end, &t, &limit],
            )
            .await?
        }
        None => {
            query(
                c,
                "SELECT ikey, message_id FROM idempotency WHERE queue = $1 AND ikey >= $2 \
                 AND expires_at > $3 ORDER BY ikey LIMIT $4",
                &[&queue, &prefix, &t, &limit],
            )
            .await?
        }
    };
    rows.iter()
        .map(|r| {
            let id: String = r.try_get(1)?;
            Ok((r.try_get(0)?, crate::row::parse_id(&id)?))
        })
        .collect()
}

/// A statement's parameters, built with its `WHERE`.
type Args = Vec<Box<dyn ToSql + Sync + Send>>;

/// The `WHERE` conditions of `filter` but its fingerprint (that is computed from each row
/// read, in Rust: [`fingerprint::of_parts`], the function failure groups use) and their
/// arguments, numbered from `$1`.
fn conditions(filter: &MessageFilter, args: &mut Args) -> Vec<String> {
    let mut clauses = Vec::new();
    let arg = |args: &mut Args, v: Box<dyn ToSql + Sync + Send>| {
        args.push(v);
        format!("${}", args.len())
    };
    if let Some(q) = &filter.queue {
        let p = arg(args, Box::new(q.clone()));
        // `mi_queue` for the queue's index of `message_ids` ([`source`]), `queue` so that
        // the planner may start from a partial index of a state instead.
        clauses.push(format!("mi_queue = {p} AND queue = {p}"));
    }
    // A literal, so the planner can use the partial index of that state.
    if let Some(s) = filter.state {
        clauses.push(format!("state = {}", s.code()));
    }
    if let Some(k) = &filter.key {
        let p = arg(args, Box::new(k.clone()));
        clauses.push(format!("msg_key = {p}"));
    }
    if let Some(c) = filter.error_class {
        let p = arg(args, Box::new(c.as_str().to_owned()));
        clauses.push(format!("error_class = {p}"));
    }
    if let Some(t) = &filter.text {
        // ILIKE: case-insensitive like the SQLite store's LIKE.
        let p = arg(args, Box::new(like_pattern(t)));
        clauses.push(format!(
            "(payload ILIKE {p} OR (last_error::jsonb ->> 'message') ILIKE {p})"
        ));
    }
    let times = [
        (filter.since, "created_at >="),
        (filter.until, "created_at <"),
        (filter.finished_since, "finished_at >="),
        (filter.finished_until, "finished_at <"),
    ];
    for (t, cond) in times {
        if let Some(t) = t {
            let p = arg(args, Box::new(t.as_millis()));
            clauses.push(format!("{cond} {p}"));
        }
    }
    clauses
}

/// Where a read of the messages matching `filter` starts, and the column it is ordered
/// and paged by: with a queue, that queue's entries of `message_ids` (its index on
/// `(mi_queue, mi_seq)`, newest first) joined to their rows, since `messages` has no index
/// of its own by queue (schema v10); else `messages` alone (its primary key, or a partial
/// index of a state).
fn source(filter: &MessageFilter) -> (&'static str, &'static str) {
    if filter.queue.is_some() {
        ("message_ids JOIN messages ON seq = mi_seq", "mi_seq")
    } else {
        ("messages", "seq")
    }
}

fn params(args: &Args) -> Vec<&(dyn ToSql + Sync)> {
    args.iter().map(|a| &**a as &(dyn ToSql + Sync)).collect()
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
pub async fn count<C: GenericClient>(c: &C, filter: &MessageFilter) -> Result<u64, E> {
    let mut args: Args = Vec::new();
    let clauses = conditions(filter, &mut args);
    let where_ = |extra: Option<String>| {
        let mut all = clauses.clone();
        all.extend(extra);
        if all.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", all.join(" AND "))
        }
    };
    let (from, order) = source(filter);
    let Some(fp) = &filter.fingerprint else {
        let sql = format!("SELECT count(*) FROM {from} {}", where_(None));
        let r = query(c, &sql, &params(&args)).await?;
        let n: i64 = r.first().map(|r| r.try_get(0)).transpose()?.unwrap_or(0);
        return Ok(n.max(0) as u64);
    };
    let mut n = 0u64;
    let mut before = i64::MAX;
    loop {
        let mut a: Args = Vec::new();
        let clauses_here = conditions(filter, &mut a);
        a.push(Box::new(before));
        let pb = a.len();
        a.push(Box::new(FINGERPRINT_CHUNK));
        let pl = a.len();
        let mut all = clauses_here;
        all.push(format!("{order} < ${pb}"));
        let sql = format!(
            "SELECT seq, last_error, dead_reason FROM {from} WHERE {} ORDER BY {order} DESC LIMIT ${pl}",
            all.join(" AND ")
        );
        let rows = query(c, &sql, &params(&a)).await?;
        for r in &rows {
            let le: Option<String> = r.try_get(1)?;
            let dr: Option<String> = r.try_get(2)?;
            if row_fingerprint(le.as_deref(), dr.as_deref())? == *fp {
                n += 1;
            }
            before = r.try_get(0)?;
        }
        if (rows.len() as i64) < FINGERPRINT_CHUNK {
            return Ok(n);
        }
    }
}

/// Messages matching `filter`, newest first, `limit` at a time (see
/// [`redrive_storage::Store::search`]); the cursor is the `seq` of the last row handed out.
pub async fn search<C: GenericClient>(
    c: &C,
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
    let (from, order) = source(filter);
    'read: loop {
        let mut args: Args = Vec::new();
        let mut clauses = conditions(filter, &mut args);
        args.push(Box::new(before));
        clauses.push(format!("{order} < ${}", args.len()));
        args.push(Box::new(chunk));
        let sql = format!(
            concat!(
                "SELECT ",
                columns!(),
                " FROM {} WHERE {} ORDER BY {} DESC LIMIT ${}"
            ),
            from,
            clauses.join(" AND "),
            order,
            args.len()
        );
        let got = query(c, &sql, &params(&args)).await?;
        let n = got.len();
        for r in &got {
            let row = crate::row::from_pg(r)?;
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
pub async fn queue_stats<C: GenericClient>(c: &C) -> Result<Vec<QueueStats>, E> {
    let rows = query(
        c,
        "SELECT queue, state, count(*), min(due_at) FILTER (WHERE state = 1) \
         FROM messages GROUP BY queue, state ORDER BY queue",
        &[],
    )
    .await?;
    let mut out: Vec<QueueStats> = Vec::new();
    for r in &rows {
        let queue: String = r.try_get(0)?;
        let code: i16 = r.try_get(1)?;
        let n: i64 = r.try_get(2)?;
        let oldest: Option<i64> = r.try_get(3)?;
        let state = u8::try_from(code)
            .ok()
            .and_then(State::from_code)
            .ok_or_else(|| E::Db(StoreError::Backend(format!("state code {code}"))))?;
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

#[cfg(test)]
mod tests {
    use redrive_storage::filter_text::prefix_end;

    #[test]
    fn prefix_end_bounds_every_string_with_the_prefix() {
        assert_eq!(prefix_end("amqp:b:1f:").as_deref(), Some("amqp:b:1f;"));
        assert_eq!(prefix_end(""), None);
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
    }
}
