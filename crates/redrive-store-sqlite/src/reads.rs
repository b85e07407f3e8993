//! Reads: a pool of read-only connections, and the queries operators run.

use crate::hot::{self, DueView, LeaseView, Views};
use crate::row::Row;
use crate::schema::{columns, COLUMNS};
use crate::sql_error::SqlResultExt;
use crate::transitions::Counts;
use crate::SqliteOptions;
use redrive_core::{fingerprint, DeadReason, ErrorClass, Message, MessageId, State, Timestamp};
use redrive_storage::filter_text::{like_pattern, prefix_end};
use redrive_storage::{MessageFilter, Page, QueueStats, StoreError};
use rusqlite::functions::FunctionFlags;
use rusqlite::types::Value;
use rusqlite::{params_from_iter, Connection, OptionalExtension};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Mutex;

/// Read connections kept open for reuse; more are opened on demand.
const MAX_IDLE_READERS: usize = 4;

/// Read-only connections, opened lazily and reused.
pub struct ReaderPool {
    path: PathBuf,
    opts: SqliteOptions,
    idle: Mutex<Vec<Connection>>,
}

impl ReaderPool {
    pub fn new(path: PathBuf, opts: SqliteOptions) -> Self {
        Self {
            path,
            opts,
            idle: Mutex::new(Vec::new()),
        }
    }

    /// Run `f` on a read connection (blocking).
    pub fn with<T>(
        &self,
        f: impl FnOnce(&Connection) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let conn = self.idle.lock().ok().and_then(|mut v| v.pop());
        let conn = match conn {
            Some(c) => c,
            None => crate::open_connection(&self.path, &self.opts, false)?,
        };
        let r = f(&conn);
        if let Ok(mut idle) = self.idle.lock() {
            if idle.len() < MAX_IDLE_READERS {
                idle.push(conn);
            }
        }
        r
    }
}

/// The SQL function `redrive_fingerprint(class, message, dead_reason)`: the failure
/// fingerprint of a row ([`fingerprint::of_parts`], the very function failure groups, alerts
/// and tasks use on a [`Message`]), so a search can filter on it in its `WHERE` with the
/// `LIMIT` and cursor of any other filter. `NULL` for a class no failure has.
pub const FINGERPRINT_FN: &str = "redrive_fingerprint";

/// Register the store's SQL functions on a connection (every connection: readers search,
/// and the writer may). Deterministic, so SQLite may evaluate it once per row.
pub fn register_functions(conn: &Connection) -> Result<(), StoreError> {
    conn.create_scalar_function(
        FINGERPRINT_FN,
        3,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx| {
            let class = ctx.get_raw(0).as_str_or_null()?;
            let message = ctx.get_raw(1).as_str_or_null()?;
            let reason = ctx.get_raw(2).as_str_or_null()?;
            let last_error = match class {
                None => None,
                Some(c) => match ErrorClass::parse(c) {
                    Some(c) => Some((c, message)),
                    None => return Ok(None),
                },
            };
            Ok(Some(fingerprint::of_parts(
                last_error,
                reason.and_then(DeadReason::parse),
            )))
        },
    )
    .db()
}

/// Count messages per queue and state (at open; afterwards the writer keeps counts).
pub fn load_counts(conn: &Connection) -> Result<Counts, StoreError> {
    // Counted here, row by row, not with `GROUP BY queue, state`: no index holds both
    // columns, so SQLite would sort every row first, and with `temp_store = MEMORY` its
    // sorter lived in RAM (measured: 667 MiB of RSS after opening 10,000,000 messages).
    let mut counts = Counts::new();
    let mut stmt = conn.prepare("SELECT queue, state FROM messages").db()?;
    let mut rows = stmt.query([]).db()?;
    while let Some(row) = rows.next().db()? {
        let code: u8 = row.get(1).db()?;
        let st = State::from_code(code).ok_or_else(|| crate::row::unknown_state(code))?;
        let queue = row
            .get_ref(0)
            .db()?
            .as_str()
            .map_err(|e| StoreError::Backend(e.to_string()))?;
        match counts.get_mut(queue) {
            Some(c) => c[st.code() as usize] += 1,
            None => {
                let mut c = [0; 5];
                c[st.code() as usize] = 1;
                counts.insert(queue.to_owned(), c);
            }
        }
    }
    Ok(counts)
}

/// The earliest lease expiry, ms: one index seek (`ix_leased`). With the earliest
/// scheduled due time (kept per queue by the writer, `promotion.rs`), the next wake-up.
pub fn next_lease_expiry(conn: &Connection) -> Result<Option<i64>, StoreError> {
    let v: Option<i64> = conn
        .prepare_cached("SELECT MIN(lease_expires_at) FROM messages WHERE state = 2")
        .db()?
        .query_row([], |r| r.get(0))
        .db()?;
    Ok(v)
}

/// The leases and the promotions held in memory as a read sees them, taken *before* it
/// reads rows: a row read after a later commit is newer than the view, and
/// [`hot::overlay`] / [`hot::overlay_due`] then leave it alone (each applies only to a row
/// as it was before its lease or promotion).
#[derive(Default)]
pub struct Held {
    views: HashMap<String, LeaseView>,
    due: HashMap<String, DueView>,
}

impl Held {
    pub fn of(views: &Views) -> Self {
        views.lock().map_or_else(
            |_| Self::default(),
            |v| Self {
                views: v.leases.clone(),
                due: v.due.clone(),
            },
        )
    }

    /// The view of one message only.
    pub fn one(views: &Views, id: &str) -> Self {
        let mut held = Self::default();
        if let Ok(v) = views.lock() {
            if let Some(l) = v.leases.get(id) {
                held.views.insert(id.to_owned(), l.clone());
            }
            if let Some(d) = v.due.get(id) {
                held.due.insert(id.to_owned(), d.clone());
            }
        }
        held
    }

    /// `row` as its lease or promotion held in memory made it, if it has one.
    pub fn apply(&self, row: &mut Row) {
        if let Some(v) = self.views.get(&row.id) {
            if hot::overlay(row, v) {
                return;
            }
        }
        if let Some(d) = self.due.get(&row.id) {
            hot::overlay_due(row, d);
        }
    }

    /// The rows leased in memory, as an SQL list of their `seq` (integers only).
    fn seq_list(&self) -> Option<String> {
        list(self.views.values().map(|v| v.seq))
    }

    /// The rows promoted in memory (not leased), as an SQL list of their `seq`.
    fn due_list(&self) -> Option<String> {
        list(self.due.values().map(|d| d.seq))
    }

    fn seqs(&self) -> HashSet<i64> {
        self.views.values().map(|v| v.seq).collect()
    }

    /// The earliest due time of `queue`'s rows promoted in memory (not leased).
    fn oldest_promoted(&self, queue: &str) -> Option<i64> {
        self.due
            .values()
            .filter(|d| d.queue == queue)
            .map(|d| d.due_at)
            .min()
    }
}

/// `seqs` as an SQL list (integers only); `None` when empty.
fn list(seqs: impl Iterator<Item = i64>) -> Option<String> {
    let list: Vec<String> = seqs.map(|s| s.to_string()).collect();
    (!list.is_empty()).then(|| list.join(","))
}

pub fn get(conn: &Connection, id: &MessageId, held: &Held) -> Result<Option<Message>, StoreError> {
    let sql = concat!(
        "SELECT ",
        columns!(),
        ", history FROM messages WHERE id = ?1"
    );
    let found: Option<(Row, String)> = conn
        .prepare_cached(sql)
        .db()?
        .query_row([id.to_string()], |r| {
            Ok((
                crate::row::from_sql(r)?,
                r.get(crate::schema::HISTORY_COLUMN)?,
            ))
        })
        .optional()
        .db()?;
    match found {
        Some((mut row, history)) => {
            held.apply(&mut row);
            Ok(Some(row.to_message(Some(&history), None)?))
        }
        None => Ok(None),
    }
}

/// The live idempotency keys of `queue` beginning with `prefix` (see
/// [`redrive_storage::Store::idempotency_keys`]): a range of the primary key `(queue, ikey)`, from
/// `prefix` to the first string past every string it begins.
pub fn idempotency_keys(
    conn: &Connection,
    queue: &str,
    prefix: &str,
    limit: u32,
    now: Timestamp,
) -> Result<Vec<(String, MessageId)>, StoreError> {
    let rows: Vec<(String, String)> = match prefix_end(prefix) {
        Some(end) => conn
            .prepare_cached(
                "SELECT ikey, message_id FROM idempotency WHERE queue = ?1 AND ikey >= ?2 \
                 AND ikey < ?3 AND expires_at > ?4 ORDER BY ikey LIMIT ?5",
            )
            .db()?
            .query_map(
                rusqlite::params![queue, prefix, end, now.as_millis(), limit],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .db()?
            .collect::<Result<_, _>>()
            .db()?,
        None => conn
            .prepare_cached(
                "SELECT ikey, message_id FROM idempotency WHERE queue = ?1 AND ikey >= ?2 \
                 AND expires_at > ?3 ORDER BY ikey LIMIT ?4",
            )
            .db()?
            .query_map(
                rusqlite::params![queue, prefix, now.as_millis(), limit],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .db()?
            .collect::<Result<_, _>>()
            .db()?,
    };
    rows.into_iter()
        .map(|(k, id)| {
            let id = id
                .parse::<MessageId>()
                .map_err(|e| StoreError::Backend(e.to_string()))?;
            Ok((k, id))
        })
        .collect()
}

/// The `WHERE` conditions of `filter` (joined with `AND`, none when empty) and their
/// arguments, shared by [`search`] and [`count`].
///
/// A row leased in memory is `ready` on disk (or `scheduled`, if it was promoted in
/// memory): a filter on `ready` leaves it out, one on `leased` takes it in (by its `seq`,
/// from `held`). A row promoted in memory and not leased is `scheduled` on disk: a filter
/// on `ready` takes it in, one on `scheduled` leaves it out.
fn conditions(filter: &MessageFilter, held: &Held) -> (Vec<String>, Vec<Value>) {
    let mut clauses: Vec<&str> = Vec::new();
    let mut args: Vec<Value> = Vec::new();
    if let Some(q) = &filter.queue {
        clauses.push("queue = ?");
        args.push(Value::Text(q.clone()));
    }
    // The state is inlined as a literal (it is a small integer of an enum, not user text):
    // SQLite uses a partial index (`ix_dead`, `ix_scheduled` …) only when the query's WHERE
    // literally implies the index's.
    let state_clause;
    if let Some(s) = filter.state {
        let (leased, due) = (held.seq_list(), held.due_list());
        state_clause = match (s, leased, due) {
            (State::Ready, None, None)
            | (State::Leased, None, _)
            | (State::Scheduled, None, None) => {
                format!("state = {}", s.code())
            }
            (State::Ready, leased, due) => {
                let ready = match due {
                    Some(due) => format!("(state = 1 OR (state = 0 AND seq IN ({due})))"),
                    None => "state = 1".to_owned(),
                };
                match leased {
                    Some(leased) => format!("{ready} AND seq NOT IN ({leased})"),
                    None => ready,
                }
            }
            (State::Leased, Some(leased), _) => {
                format!("(state = 2 OR (state IN (0, 1) AND seq IN ({leased})))")
            }
            (State::Scheduled, leased, due) => {
                let held: Vec<String> = leased.into_iter().chain(due).collect();
                format!("state = 0 AND seq NOT IN ({})", held.join(","))
            }
            _ => format!("state = {}", s.code()),
        };
        clauses.push(&state_clause);
    }
    if let Some(k) = &filter.key {
        clauses.push("msg_key = ?");
        args.push(Value::Text(k.clone()));
    }
    if let Some(c) = filter.error_class {
        clauses.push("error_class = ?");
        args.push(Value::Text(c.as_str().to_owned()));
    }
    if let Some(t) = &filter.text {
        clauses.push("(payload LIKE ? ESCAPE '\\' OR json_extract(last_error, '$.message') LIKE ? ESCAPE '\\')");
        let p = like_pattern(t);
        args.push(Value::Text(p.clone()));
        args.push(Value::Text(p));
    }
    if let Some(s) = filter.since {
        clauses.push("created_at >= ?");
        args.push(Value::Integer(s.as_millis()));
    }
    if let Some(u) = filter.until {
        clauses.push("created_at < ?");
        args.push(Value::Integer(u.as_millis()));
    }
    if let Some(s) = filter.finished_since {
        clauses.push("finished_at >= ?");
        args.push(Value::Integer(s.as_millis()));
    }
    if let Some(u) = filter.finished_until {
        clauses.push("finished_at < ?");
        args.push(Value::Integer(u.as_millis()));
    }
    // Last, after the cheap comparisons: the fingerprint is JSON and text work per row.
    if let Some(f) = &filter.fingerprint {
        clauses.push(
            "redrive_fingerprint(json_extract(last_error, '$.class'), \
             json_extract(last_error, '$.message'), dead_reason) = ?",
        );
        args.push(Value::Text(f.clone()));
    }
    (clauses.into_iter().map(str::to_owned).collect(), args)
}

/// How many messages match `filter`.
pub fn count(conn: &Connection, filter: &MessageFilter, held: &Held) -> Result<u64, StoreError> {
    let (clauses, args) = conditions(filter, held);
    let where_ = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let n: i64 = conn
        .prepare_cached(&format!("SELECT COUNT(*) FROM messages {where_}"))
        .db()?
        .query_row(params_from_iter(args), |r| r.get(0))
        .db()?;
    Ok(n.max(0) as u64)
}

pub fn search(
    conn: &Connection,
    filter: &MessageFilter,
    limit: u32,
    cursor: Option<&str>,
    held: &Held,
) -> Result<Page, StoreError> {
    let (mut clauses, mut args) = conditions(filter, held);
    if let Some(c) = cursor {
        let seq = parse_cursor(c)?;
        clauses.push("seq < ?".to_owned());
        args.push(Value::Integer(seq));
    }
    let where_ = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let limit = limit.max(1);
    args.push(Value::Integer(limit as i64 + 1));
    let sql = format!("SELECT {COLUMNS} FROM messages {where_} ORDER BY seq DESC LIMIT ?");
    let mut rows: Vec<Row> = conn
        .prepare_cached(&sql)
        .db()?
        .query_map(params_from_iter(args), crate::row::from_sql)
        .db()?
        .collect::<Result<_, _>>()
        .db()?;
    let next_cursor = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(|r| cursor_of(r.seq))
    } else {
        None
    };
    for row in &mut rows {
        held.apply(row);
    }
    let messages = rows
        .iter()
        .map(|r| r.to_message(None, None))
        .collect::<Result<_, _>>()?;
    Ok(Page {
        messages,
        next_cursor,
    })
}

/// The cursor of the page after the row `seq`. Opaque to callers; today the decimal `seq`
/// of the last row handed out (rows of the next page have smaller ones).
fn cursor_of(seq: i64) -> String {
    seq.to_string()
}

/// The `seq` of a cursor made by [`cursor_of`]: decimal digits only, a positive `i64`.
/// Anything else (a sign, spaces, overflow, text) was not handed out by this store.
fn parse_cursor(c: &str) -> Result<i64, StoreError> {
    let invalid = || StoreError::InvalidCursor(c.to_owned());
    if c.is_empty() || !c.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match c.parse::<i64>() {
        Ok(seq) if seq > 0 => Ok(seq),
        _ => Err(invalid()),
    }
}

pub fn queue_stats(
    conn: &Connection,
    counts: Vec<(String, [i64; 5])>,
    held: &Held,
) -> Result<Vec<QueueStats>, StoreError> {
    let mut out = Vec::with_capacity(counts.len());
    let leased = held.seqs();
    // With leases held in memory, the oldest ready row may be one of them: walk the
    // priority's rows in due order past them (as many as there are, at most).
    let mut walk = conn.prepare_cached(
        "SELECT seq, due_at FROM messages WHERE queue = ?1 AND state = 1 AND key_order IS NOT 1 \
         AND priority = ?2 ORDER BY due_at, seq",
    ).db()?;
    let mut stmt = conn.prepare_cached(
        "SELECT MIN(due_at) FROM messages WHERE queue = ?1 AND state = 1 AND key_order IS NOT 1 AND priority = ?2",
    ).db()?;
    let mut blocked = conn
        .prepare_cached(
            "SELECT MIN(due_at) FROM messages WHERE queue = ?1 AND state = 1 AND key_order = 1",
        )
        .db()?;
    for (queue, c) in counts {
        let mut oldest: Option<i64> = None;
        if c[State::Ready.code() as usize] > 0 {
            // One index seek per priority level on ix_ready, instead of a scan, and one on
            // ix_ready_blocked for the ready messages waiting behind their key's head.
            for p in 0..=9u8 {
                let v: Option<i64> = if leased.is_empty() {
                    stmt.query_row(rusqlite::params![queue, p], |r| r.get(0))
                        .db()?
                } else {
                    let mut rows = walk.query(rusqlite::params![queue, p]).db()?;
                    let mut first = None;
                    while let Some(r) = rows.next().db()? {
                        let seq: i64 = r.get(0).db()?;
                        if !leased.contains(&seq) {
                            first = r.get(1).db()?;
                            break;
                        }
                    }
                    first
                };
                if let Some(v) = v {
                    oldest = Some(oldest.map_or(v, |o| o.min(v)));
                }
            }
            let v: Option<i64> = blocked.query_row([&queue], |r| r.get(0)).db()?;
            // Promoted in memory: `scheduled` on disk, so not in `ix_ready`.
            for v in [v, held.oldest_promoted(&queue)].into_iter().flatten() {
                oldest = Some(oldest.map_or(v, |o| o.min(v)));
            }
        }
        out.push(QueueStats {
            queue,
            counts: c.map(|n| n.max(0) as u64),
            oldest_ready_due: oldest.map(Timestamp::from_millis),
        });
    }
    out.sort_by(|a, b| a.queue.cmp(&b.queue));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use redrive_storage::filter_text::prefix_end;

    #[test]
    fn prefix_end_bounds_every_string_with_the_prefix() {
        assert_eq!(prefix_end("amqp:b:1f:").as_deref(), Some("amqp:b:1f;"));
        assert_eq!(prefix_end("").as_deref(), None);
        let end = prefix_end("ké").unwrap();
        assert_eq!(end, "kê");
        for s in ["ké", "ké\u{10FFFF}", "ké~~~"] {
            assert!(s >= "ké" && s < end.as_str(), "{s}");
        }
        assert!("kê" >= end.as_str() && "kd" < "ké", "outside the range");
        // A last character without a successor is dropped, the one before moves on.
        assert_eq!(prefix_end("a\u{10FFFF}").as_deref(), Some("b"));
        assert_eq!(prefix_end("\u{10FFFF}").as_deref(), None);
    }
}
