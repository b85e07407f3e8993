//! Per-key ordering bookkeeping: which message of a key may be leased now.
//!
//! SPEC §4: under `ordering = "key"` a ready message of a key may be leased only
//! when no earlier message of its key is pending (scheduled, ready or leased; dead
//! too under `on_dead = "block"`) and no message of its key is leased. So at most
//! one message per key is leasable: the oldest message *taking part* in the key's
//! order, when it is ready and nothing of the key is leased.
//!
//! Deciding that inside the lease query made a lease walk every blocked ready
//! message of a hot key (14 ms per lease with 20,000 blocked, on the writer thread
//! every queue shares). Instead, the `key_order` column records the answer
//! (see `schema.rs`: NULL takes no part, [`HEAD`] may be leased, [`BLOCKED`] waits)
//! and `ix_ready` leaves blocked messages out, so the lease query is the same index
//! range scan as on a queue without ordering. The column is kept true by:
//!
//! - [`initial`] when a message is inserted, and [`settle`] after every transition
//!   of one message that can change its key's head or lease (publish, ack, nack or
//!   lease expiry to scheduled / ready / dead, redrive, kill, delete). `settle`
//!   reads at most the first two messages of the key's order, the touched one and
//!   whether the key has a lease: a few index seeks, whatever the key's backlog.
//! - The lease statement itself: it only leases heads, and a leased head becomes
//!   [`BLOCKED`] (its key now has a lease); nothing else of its key changes.
//! - Nothing for a tick's promotion: scheduled → ready changes neither which
//!   messages take part nor whether the key has a lease.
//! - [`reconcile`] at open, when a queue's `ordering` or `on_dead` changed since the
//!   rows were written (or the store predates the column).

use crate::sql_error::SqlResultExt;
use redrive_core::{QueueCatalog, State};
use redrive_storage::StoreError;
use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `key_order` of the one message of a key that may be leased now.
pub const HEAD: i64 = 0;
/// `key_order` of a message that takes part in its key's order but waits.
pub const BLOCKED: i64 = 1;

/// How a queue orders the messages of a key: the rule is `redrive_storage::rules`'.
pub use redrive_storage::rules::KeyMode as Mode;

/// The `key_order` a new message is inserted with: NULL when it takes no part,
/// [`BLOCKED`] otherwise ([`settle`] then makes it the head if it is one).
pub fn initial(mode: Mode, key: Option<&str>, state: State) -> Option<i64> {
    (key.is_some() && mode.takes_part(state)).then_some(BLOCKED)
}

/// The state and `key_order` of the message a transition touched.
const TOUCHED_SQL: &str = "SELECT state, key_order FROM messages WHERE seq = ?1";
/// The first two messages of a key's order. INDEXED BY: `ix_key` could serve this
/// query too, but it walks every done message of the key; `ix_key_order` holds only
/// the ones taking part.
const FIRST_TWO_SQL: &str = "SELECT seq, key_order FROM messages INDEXED BY ix_key_order \
     WHERE queue = ?1 AND msg_key = ?2 AND key_order IS NOT NULL ORDER BY seq LIMIT 2";
/// Whether a message of a key is leased.
const LEASED_SQL: &str = "SELECT EXISTS (SELECT 1 FROM messages INDEXED BY ix_key_leased \
     WHERE queue = ?1 AND msg_key = ?2 AND msg_key IS NOT NULL AND state = 2)";

fn set(conn: &Connection, seq: i64, value: Option<i64>) -> Result<(), StoreError> {
    conn.prepare_cached("UPDATE messages SET key_order = ?2 WHERE seq = ?1")
        .db()?
        .execute(params![seq, value])
        .db()?;
    Ok(())
}

/// Make `key_order` true again for `key` of `queue` after a transition of the message
/// `seq` (changed, inserted or deleted): the one transition may have made it join or
/// leave the key's order, changed the key's head, or ended or started its lease.
///
/// Before the transition, the only [`HEAD`] of the key (if any) was its oldest
/// message taking part; the transition changed one message, so that old head is now
/// `seq` or one of the first two messages of the key's order (`seq` can have joined
/// before it, by redrive). Those are all the rows this needs to look at and fix.
pub fn settle(
    conn: &Connection,
    mode: Mode,
    queue: &str,
    key: &str,
    seq: i64,
) -> Result<(), StoreError> {
    if mode == Mode::Unordered {
        return Ok(());
    }
    let touched: Option<(u8, Option<i64>)> = conn
        .prepare_cached(TOUCHED_SQL)
        .db()?
        .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()
        .db()?;
    let mut candidates: Vec<(i64, Option<i64>)> = Vec::with_capacity(3);
    if let Some((code, value)) = touched {
        let state = State::from_code(code)
            .ok_or_else(|| StoreError::Backend(format!("message {seq} has state code {code}")))?;
        match (mode.takes_part(state), value) {
            (false, Some(_)) => set(conn, seq, None)?,
            (true, None) => {
                set(conn, seq, Some(BLOCKED))?;
                candidates.push((seq, Some(BLOCKED)));
            }
            (true, Some(v)) => candidates.push((seq, Some(v))),
            (false, None) => {}
        }
    }
    let first: Vec<(i64, Option<i64>)> = conn
        .prepare_cached(FIRST_TWO_SQL)
        .db()?
        .query_map(params![queue, key], |r| Ok((r.get(0)?, r.get(1)?)))
        .db()?
        .collect::<Result<_, _>>()
        .db()?;
    let leased: bool = conn
        .prepare_cached(LEASED_SQL)
        .db()?
        .query_row(params![queue, key], |r| r.get(0))
        .db()?;
    let head = if leased {
        None
    } else {
        first.first().map(|(s, _)| *s)
    };
    for (s, v) in first {
        if !candidates.iter().any(|(c, _)| *c == s) {
            candidates.push((s, v));
        }
    }
    for (s, v) in candidates {
        let wanted = if Some(s) == head { HEAD } else { BLOCKED };
        if v != Some(wanted) {
            set(conn, s, Some(wanted))?;
        }
    }
    Ok(())
}

/// The ordering mode of every queue, as recorded in `meta` next to the rows it
/// produced (`key_order_modes`), so that a changed configuration is noticed at open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Modes {
    default: Mode,
    queues: BTreeMap<String, Mode>,
}

impl Modes {
    fn of(catalog: &QueueCatalog) -> Self {
        // The empty name is not a valid queue name (`validate_queue_name`), so it is
        // never configured and gets the default settings.
        let default = Mode::of(catalog.get(""));
        let queues = catalog
            .configured()
            .map(|q| (q.to_owned(), Mode::of(catalog.get(q))))
            .filter(|(_, m)| *m != default)
            .collect();
        Self { default, queues }
    }

    fn get(&self, queue: &str) -> Mode {
        self.queues.get(queue).copied().unwrap_or(self.default)
    }
}

/// At open: when the ordering of a queue changed since its rows were written, rewrite
/// their `key_order` (one pass over the queue's keyed messages), and record the
/// modes. A store without a record (new, or from before schema version 3) has
/// `key_order` NULL everywhere, which is what [`Mode::Unordered`] writes.
pub fn reconcile(conn: &Connection, catalog: &QueueCatalog) -> Result<(), StoreError> {
    let now = Modes::of(catalog);
    let recorded: Option<String> = conn
        .query_row("SELECT v FROM meta WHERE k = 'key_order_modes'", [], |r| {
            r.get(0)
        })
        .optional()
        .db()?;
    let before = match recorded {
        Some(json) => serde_json::from_str(&json)?,
        None => Modes {
            default: Mode::Unordered,
            queues: BTreeMap::new(),
        },
    };
    if before == now {
        return Ok(());
    }
    conn.execute_batch("BEGIN IMMEDIATE").db()?;
    let r = (|| {
        let queues: Vec<String> = conn
            .prepare("SELECT DISTINCT queue FROM messages")
            .db()?
            .query_map([], |r| r.get(0))
            .db()?
            .collect::<Result<_, _>>()
            .db()?;
        for q in queues {
            let mode = now.get(&q);
            if before.get(&q) != mode {
                rebuild(conn, &q, mode)?;
            }
        }
        conn.execute(
            "INSERT OR REPLACE INTO meta (k, v) VALUES ('key_order_modes', ?1)",
            [serde_json::to_string(&now)?],
        )
        .db()?;
        Ok::<(), StoreError>(())
    })();
    conn.execute_batch(if r.is_ok() { "COMMIT" } else { "ROLLBACK" })
        .db()?;
    r
}

/// Rewrite `key_order` for every message of `queue` under `mode`.
fn rebuild(conn: &Connection, queue: &str, mode: Mode) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE messages SET key_order = NULL WHERE queue = ?1 AND key_order IS NOT NULL",
        [queue],
    )
    .db()?;
    let taking_part = match mode {
        Mode::Unordered => return Ok(()),
        Mode::Skip => "0, 1, 2",
        Mode::Block => "0, 1, 2, 4",
    };
    conn.execute(
        &format!(
            "UPDATE messages SET key_order = {BLOCKED} WHERE queue = ?1 AND msg_key IS NOT NULL \
             AND state IN ({taking_part})"
        ),
        [queue],
    )
    .db()?;
    conn.execute(
        &format!(
            "UPDATE messages SET key_order = {HEAD} WHERE seq IN \
             (SELECT MIN(seq) FROM messages WHERE queue = ?1 AND key_order IS NOT NULL GROUP BY msg_key) \
             AND NOT EXISTS (SELECT 1 FROM messages l WHERE l.queue = ?1 AND l.msg_key = messages.msg_key \
             AND l.state = 2)"
        ),
        [queue],
    ).db()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transitions::{lease_sql, Counts, WriterState};
    use crate::{open_connection, schema, Durability, SqliteOptions};
    use redrive_core::{NewMessage, Ordering, QueueSettings, Timestamp};
    use redrive_storage::{LeaseRef, LeaseRequest};
    use rusqlite::StatementStatus;
    use std::sync::{Arc, Mutex};

    const QUEUE: &str = "orders";

    /// A writer on a fresh store in `dir` whose queues are ordered by key (`Skip`).
    fn writer(dir: &std::path::Path) -> WriterState {
        let mut opts = SqliteOptions::new(dir);
        opts.durability = Durability::UnsafeBuffered;
        let settings = QueueSettings {
            ordering: Ordering::Key,
            ..QueueSettings::default()
        };
        opts.store.catalog = Arc::new(QueueCatalog::new(settings, Default::default()));
        let conn = open_connection(&dir.join("redrive.db"), &opts, true).expect("open");
        schema::migrate(&conn).expect("migrate");
        reconcile(&conn, &opts.store.catalog).expect("reconcile");
        WriterState::new(
            conn,
            1,
            opts.store.catalog.clone(),
            60_000,
            Arc::new(Mutex::new(Counts::new())),
        )
    }

    fn publish(w: &mut WriterState, key: &str, n: usize) {
        let items = (0..n)
            .map(|i| NewMessage {
                key: Some(key.to_owned()),
                ..NewMessage::new(QUEUE, serde_json::json!(i))
            })
            .collect();
        w.conn.execute_batch("BEGIN").expect("begin");
        w.publish(items, Timestamp::from_millis(1_000))
            .expect("publish");
        w.conn.execute_batch("COMMIT").expect("commit");
    }

    fn lease_one(w: &mut WriterState) -> Vec<redrive_storage::Leased> {
        let req = LeaseRequest {
            queue: QUEUE.into(),
            max: 1,
            lease_ms: 60_000,
            max_bytes: None,
        };
        w.lease(&req, Timestamp::from_millis(2_000))
            .expect("lease")
            .into_iter()
            .map(|l| l.into_leased().expect("leased"))
            .collect()
    }

    /// SQLite virtual machine steps `run` spends in the statements `sqls` (cached
    /// statements keep their counters): a measure of work that does not depend on the
    /// machine or its load.
    fn vm_steps(w: &mut WriterState, sqls: &[&str], run: impl FnOnce(&mut WriterState)) -> i32 {
        for sql in sqls {
            w.conn
                .prepare_cached(sql)
                .expect("prepare")
                .reset_status(StatementStatus::VmStep);
        }
        run(w);
        sqls.iter()
            .map(|sql| {
                w.conn
                    .prepare_cached(sql)
                    .expect("prepare")
                    .get_status(StatementStatus::VmStep)
            })
            .sum()
    }

    /// The work of leasing another key's message while `backlog` messages of one hot
    /// key wait behind its leased head, and `done` of its messages are kept done.
    fn lease_work(backlog: usize) -> i32 {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut w = writer(dir.path());
        publish(&mut w, "hot", backlog + 1);
        publish(&mut w, "cold", 2);
        assert_eq!(lease_one(&mut w)[0].message.key.as_deref(), Some("hot"));
        vm_steps(&mut w, &[lease_sql(Mode::Skip)], |w| {
            assert_eq!(lease_one(w)[0].message.key.as_deref(), Some("cold"));
        })
    }

    /// Issue 5, defect 6: leasing walked the hot key's blocked messages (14 ms at 20,000).
    #[test]
    fn lease_work_does_not_grow_with_a_hot_keys_backlog() {
        let small = lease_work(10);
        let large = lease_work(2_000);
        assert!(
            large <= small + 10,
            "lease work grows with the backlog: {small} VM steps at 10, {large} at 2,000"
        );
    }

    /// The work of `settle` when the hot key's leased head is acked, with `history`
    /// messages of the key already done and `backlog` waiting.
    fn ack_work(history: usize, backlog: usize) -> i32 {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut w = writer(dir.path());
        let now = Timestamp::from_millis(2_000);
        for _ in 0..history {
            publish(&mut w, "hot", 1);
            let l = lease_one(&mut w).remove(0);
            w.ack(
                &LeaseRef {
                    id: l.message.id,
                    token: l.token,
                }
                .into(),
                now,
            )
            .expect("ack");
        }
        publish(&mut w, "hot", backlog + 1);
        let l = lease_one(&mut w).remove(0);
        let work = vm_steps(&mut w, &[TOUCHED_SQL, FIRST_TWO_SQL, LEASED_SQL], |w| {
            let lease = LeaseRef {
                id: l.message.id,
                token: l.token,
            };
            w.ack(&lease.into(), now).expect("ack");
        });
        let next = lease_one(&mut w);
        assert_eq!(next.len(), 1, "the next message of the key heads it");
        work
    }

    /// Finding a key's next head reads neither its done history nor its backlog.
    #[test]
    fn next_head_work_does_not_grow_with_a_keys_history_or_backlog() {
        let small = ack_work(2, 2);
        let large = ack_work(300, 2_000);
        assert!(
            large <= small + 10,
            "settle work grows: {small} VM steps small, {large} large"
        );
    }

    /// Every state, with whether a keyed message in it takes part under each mode.
    #[test]
    fn dead_takes_part_only_under_block_and_done_never() {
        for state in State::ALL {
            assert!(!Mode::Unordered.takes_part(state));
            let pending = matches!(state, State::Scheduled | State::Ready | State::Leased);
            assert_eq!(Mode::Skip.takes_part(state), pending, "{state:?}");
            assert_eq!(
                Mode::Block.takes_part(state),
                pending || state == State::Dead,
                "{state:?}"
            );
        }
        assert_eq!(initial(Mode::Skip, None, State::Ready), None);
        assert_eq!(initial(Mode::Skip, Some("k"), State::Ready), Some(BLOCKED));
        assert_eq!(initial(Mode::Skip, Some("k"), State::Dead), None);
        assert_eq!(initial(Mode::Block, Some("k"), State::Dead), Some(BLOCKED));
    }
}
