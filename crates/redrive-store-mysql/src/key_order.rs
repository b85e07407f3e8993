//! Per-key ordering: which message of a key may be leased now (SPEC §4), as the PostgreSQL
//! store keeps it (its `key_order.rs` says why this shape).
//!
//! Under `ordering = "key"` at most one message of a key is leasable: the oldest message
//! *taking part* in the key's order ([`KeyMode::takes_part`]), when it is ready and no
//! message of the key is leased. `messages.key_blocked` records the answer (NULL: takes no
//! part; false: the head; true: waits), and only a head that is ready has a `ready` row, so
//! a claim never walks a key's backlog. It is kept true by [`initial`] at insert, [`settle`]
//! after every transition of one message that can change its key's head or lease, the
//! claim itself (it only takes heads, and a leased head waits), and [`reconcile`] at open
//! when a queue's `ordering` or `on_dead` changed since its rows were written.
//!
//! Concurrency: `settle` first locks the key's `key_heads` row, so settles of one key run
//! one at a time, then locks the key's recorded head (the only row a claim can be taking),
//! so a claim in flight has committed (or skips it from then on) before the key's lease is
//! looked at. A claim waits for no lock (`SKIP LOCKED` throughout), so it never deadlocks
//! with a settle; two settles of one key whose messages are already locked can, and InnoDB
//! breaks that by failing one (1213), which the store runs again.

use crate::error::E;
use crate::row::state_of;
use crate::sql::{args, col, execute, query, query_opt, Db};
use crate::transitions::{ready_delete, ready_insert};
use crate::Inner;
use redrive_core::{QueueCatalog, State};
use redrive_storage::rules::{KeyMode, KeyModes};

/// The `key_blocked` a new message is inserted with: NULL when it takes no part, waiting
/// otherwise ([`settle`] then makes it the head if it is one).
pub fn initial(mode: KeyMode, key: Option<&str>, state: State) -> Option<bool> {
    (key.is_some() && mode.takes_part(state)).then_some(true)
}

/// Make `key_blocked` (and `ready`) true again for `key` of `queue` after a transition of
/// the message `seq` (changed, inserted or deleted): the rows to look at are `seq` and the
/// first two of the key's order.
pub async fn settle<C: Db>(
    st: &Inner,
    tx: &mut C,
    queue: &str,
    key: Option<&str>,
    seq: i64,
) -> Result<(), E> {
    let Some(key) = key else {
        return Ok(());
    };
    let mode = KeyMode::of(st.catalog.get(queue));
    if mode == KeyMode::Unordered {
        return Ok(());
    }
    // The key's lock point (already held when the caller locked it first: `lock_keys`).
    let recorded = lock_key(tx, queue, key).await?;
    if let Some(h) = recorded.filter(|h| *h != seq) {
        // Wait for a claim of the head in flight; from now on claims skip it.
        query(
            tx,
            "SELECT seq FROM messages WHERE seq = ? FOR UPDATE",
            args![h],
        )
        .await?;
    }
    let touched = query_opt(
        tx,
        "SELECT state, key_blocked FROM messages WHERE seq = ?",
        args![seq],
    )
    .await?;
    let mut candidates: Vec<(i64, Option<bool>)> = Vec::with_capacity(3);
    if let Some(r) = touched {
        let state = state_of(col(&r, 0)?)?;
        let value: Option<bool> = col(&r, 1)?;
        match (mode.takes_part(state), value) {
            (false, Some(_)) => set(st, tx, seq, None).await?,
            (true, None) => {
                set(st, tx, seq, Some(true)).await?;
                candidates.push((seq, Some(true)));
            }
            (true, Some(v)) => candidates.push((seq, Some(v))),
            (false, None) => {}
        }
    }
    let first = query(
        tx,
        "SELECT seq, key_blocked FROM messages WHERE queue = ? AND msg_key = ? \
         AND key_blocked IS NOT NULL ORDER BY seq LIMIT 2",
        args![queue, key],
    )
    .await?;
    let mut first_two: Vec<(i64, Option<bool>)> = Vec::with_capacity(2);
    for r in &first {
        first_two.push((col(r, 0)?, col(r, 1)?));
    }
    let leased = query_opt(
        tx,
        "SELECT seq FROM messages WHERE queue = ? AND msg_key = ? AND state = 2 LIMIT 1",
        args![queue, key],
    )
    .await?
    .is_some();
    let oldest = first_two.first().map(|(s, _)| *s);
    let head = if leased { None } else { oldest };
    for (s, v) in first_two {
        if !candidates.iter().any(|(c, _)| *c == s) {
            candidates.push((s, v));
        }
    }
    for (s, v) in candidates {
        let wanted = Some(s) != head;
        if v != Some(wanted) {
            set(st, tx, s, Some(wanted)).await?;
        }
    }
    if oldest != recorded {
        execute(
            tx,
            "UPDATE key_heads SET head_seq = ? WHERE queue = ? AND msg_key = ?",
            args![oldest, queue, key],
        )
        .await?;
    }
    Ok(())
}

/// Lock the key's `key_heads` row (made if missing) until the commit; its recorded head.
async fn lock_key<C: Db>(tx: &mut C, queue: &str, key: &str) -> Result<Option<i64>, E> {
    loop {
        if let Some(r) = query_opt(
            tx,
            "SELECT head_seq FROM key_heads WHERE queue = ? AND msg_key = ? FOR UPDATE",
            args![queue, key],
        )
        .await?
        {
            return col(&r, 0);
        }
        execute(
            tx,
            "INSERT INTO key_heads (queue, msg_key) VALUES (?, ?) \
             ON DUPLICATE KEY UPDATE head_seq = head_seq",
            args![queue, key],
        )
        .await?;
    }
}

/// Lock the lock points of the ordered keys among `keys` (queue, key), in one order
/// (sorted) whatever the order of the call's items: every transaction that changes messages
/// of an ordered key locks its key *before* the messages (`transitions::lock_rows`), so two
/// transactions on the same keys queue on the first key they share instead of deadlocking
/// (each holding a message the other's settle waits for).
pub async fn lock_keys<C: Db>(
    st: &Inner,
    tx: &mut C,
    keys: impl IntoIterator<Item = (String, Option<String>)>,
) -> Result<(), E> {
    let mut wanted: Vec<(String, String)> = keys
        .into_iter()
        .filter_map(|(q, k)| {
            let k = k?;
            (KeyMode::of(st.catalog.get(&q)) != KeyMode::Unordered).then_some((q, k))
        })
        .collect();
    wanted.sort();
    wanted.dedup();
    for (q, k) in &wanted {
        lock_key(tx, q, k).await?;
    }
    Ok(())
}

/// Set a message's `key_blocked`, and its `ready` row with it.
async fn set<C: Db>(st: &Inner, tx: &mut C, seq: i64, value: Option<bool>) -> Result<(), E> {
    execute(
        tx,
        "UPDATE messages SET key_blocked = ? WHERE seq = ?",
        args![value, seq],
    )
    .await?;
    if value == Some(true) {
        ready_delete(tx, &[seq]).await
    } else {
        ready_insert(st, tx, &[seq]).await
    }
}

/// At open: when the ordering of a queue changed since its rows were written, rewrite their
/// `key_blocked`, `key_heads` and `ready` rows, and record the modes in `meta`; under the
/// database's migration lock. (The nodes of a cluster must agree on their queues'
/// ordering: each open under another configuration rewrites it.)
pub async fn reconcile(
    conn: &mut mysql_async::Conn,
    database: &str,
    catalog: &QueueCatalog,
) -> Result<(), E> {
    crate::schema::lock(conn, database).await?;
    let r = reconcile_locked(conn, catalog).await;
    let u = crate::schema::unlock(conn, database).await;
    r.and(u)
}

async fn reconcile_locked(conn: &mut mysql_async::Conn, catalog: &QueueCatalog) -> Result<(), E> {
    let now = KeyModes::of(catalog);
    let recorded = query_opt(
        conn,
        "SELECT v FROM meta WHERE k = 'key_order_modes'",
        mysql_async::Params::Empty,
    )
    .await?;
    let before = match recorded {
        Some(r) => serde_json::from_str(&col::<String>(&r, 0)?)?,
        // A new database: every row was written unordered (NULL).
        None => KeyModes::unordered(),
    };
    if before == now {
        return Ok(());
    }
    let mut tx = conn
        .start_transaction(mysql_async::TxOpts::default())
        .await?;
    let r: Result<(), E> = async {
        let queues = query(
            &mut tx,
            "SELECT DISTINCT queue FROM messages",
            mysql_async::Params::Empty,
        )
        .await?;
        for r in &queues {
            let queue: String = col(r, 0)?;
            let mode = now.get(&queue);
            if before.get(&queue) != mode {
                rebuild(&mut tx, &queue, mode).await?;
                tracing::info!(
                    queue,
                    ?mode,
                    "rewrote the per-key order of a queue whose ordering changed"
                );
            }
        }
        execute(
            &mut tx,
            "INSERT INTO meta (k, v) VALUES ('key_order_modes', ?) \
             ON DUPLICATE KEY UPDATE v = VALUES(v)",
            args![serde_json::to_string(&now)?],
        )
        .await?;
        Ok(())
    }
    .await;
    match r {
        Ok(()) => Ok(tx.commit().await?),
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// Rewrite `key_blocked`, `key_heads` and `ready` for every message of `queue` under `mode`.
async fn rebuild<C: Db>(tx: &mut C, queue: &str, mode: KeyMode) -> Result<(), E> {
    execute(
        tx,
        "UPDATE messages SET key_blocked = NULL WHERE queue = ? AND key_blocked IS NOT NULL",
        args![queue],
    )
    .await?;
    execute(tx, "DELETE FROM key_heads WHERE queue = ?", args![queue]).await?;
    let taking_part = match mode {
        KeyMode::Unordered => None,
        KeyMode::Skip => Some("0, 1, 2"),
        KeyMode::Block => Some("0, 1, 2, 4"),
    };
    if let Some(states) = taking_part {
        execute(
            tx,
            &format!(
                "UPDATE messages SET key_blocked = TRUE WHERE queue = ? AND msg_key IS NOT NULL \
                 AND state IN ({states})"
            ),
            args![queue],
        )
        .await?;
        execute(
            tx,
            "INSERT INTO key_heads (queue, msg_key, head_seq) SELECT queue, msg_key, MIN(seq) \
             FROM messages WHERE queue = ? AND key_blocked IS NOT NULL GROUP BY queue, msg_key",
            args![queue],
        )
        .await?;
        execute(
            tx,
            "UPDATE messages m JOIN key_heads h ON h.head_seq = m.seq SET m.key_blocked = FALSE \
             WHERE h.queue = ? AND NOT EXISTS (SELECT 1 FROM (SELECT msg_key FROM messages \
             WHERE queue = ? AND state = 2 AND msg_key IS NOT NULL) l WHERE l.msg_key = m.msg_key)",
            args![queue, queue],
        )
        .await?;
    }
    // The queue's ready set follows: every ready message not waiting behind its key.
    execute(tx, "DELETE FROM ready WHERE queue = ?", args![queue]).await?;
    execute(
        tx,
        &format!(
            "INSERT INTO ready (seq, queue, rnk, due_at, size, node) \
             SELECT seq, queue, 255 - priority, COALESCE(due_at, 0), {}, 0 FROM messages \
             WHERE queue = ? AND state = 1 AND key_blocked IS NOT TRUE",
            "OCTET_LENGTH(payload) + COALESCE(OCTET_LENGTH(headers), 0) \
             + COALESCE(OCTET_LENGTH(last_error), 0) + COALESCE(OCTET_LENGTH(msg_key), 0)"
        ),
        args![queue],
    )
    .await?;
    Ok(())
}
