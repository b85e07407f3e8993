//! Per-key ordering: which message of a key may be leased now (SPEC §4).
//!
//! Under `ordering = "key"` at most one message of a key is leasable: the oldest message
//! *taking part* in the key's order ([`KeyMode::takes_part`]), when it is ready and no
//! message of the key is leased. `messages.key_blocked` records the answer (NULL: takes no
//! part; false: the head, leasable when ready; true: waits), so `ix_ready` leaves waiting
//! messages out and a claim never walks a key's backlog. It is kept true by:
//!
//! - [`initial`] at insert and [`settle`] after every transition of one message that can
//!   change its key's head or lease (publish, ack, nack, expiry, release, redrive, kill,
//!   delete): a few index seeks whatever the key's backlog (the touched row, the first two
//!   of the key's order, whether the key has a lease);
//! - the claim itself: it only takes heads, and a leased head waits (`key_blocked` true);
//! - nothing for a promotion (scheduled → ready changes neither who takes part nor leases);
//! - [`reconcile`] at open, when a queue's `ordering` or `on_dead` changed since its rows
//!   were written (recorded in `meta`).
//!
//! Concurrency (several transactions, several nodes): `settle` first locks the key's
//! `key_heads` row, so settles of one key run one at a time, then locks the key's recorded
//! head (`key_heads.head_seq`), the only row a claim can be taking, so a claim in flight
//! has committed (or is skipped from then on) before the key's lease is looked at. A claim
//! locks only the message rows it takes (`SKIP LOCKED`) and waits for nothing, so it never
//! deadlocks with a settle. Two settles of one key whose messages are already locked can
//! deadlock on each other (each holds its message, one waits for the key): PostgreSQL
//! breaks that by failing one, which the store runs again (`error::E::Retry`).

use crate::error::E;
use crate::sql::{execute, query, query_one, query_opt};
use crate::Inner;
use deadpool_postgres::Transaction;
use redrive_core::{QueueCatalog, State};
use redrive_storage::rules::{KeyMode, KeyModes};
use redrive_storage::StoreError;

/// The `key_blocked` a new message is inserted with: NULL when it takes no part, waiting
/// otherwise ([`settle`] then makes it the head if it is one).
pub fn initial(mode: KeyMode, key: Option<&str>, state: State) -> Option<bool> {
    (key.is_some() && mode.takes_part(state)).then_some(true)
}

/// Make `key_blocked` true again for `key` of `queue` after a transition of the message
/// `seq` (changed, inserted or deleted), as the SQLite store's `key_order::settle`: the one
/// transition may have made it join or leave the key's order, changed the key's head, or
/// ended or started its lease, so the rows to look at are `seq` and the first two of the
/// key's order.
pub async fn settle(
    st: &Inner,
    tx: &Transaction<'_>,
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
    // The key's lock point.
    let recorded: Option<i64> = loop {
        if let Some(r) = query_opt(
            tx,
            "SELECT head_seq FROM key_heads WHERE queue = $1 AND msg_key = $2 FOR UPDATE",
            &[&queue, &key],
        )
        .await?
        {
            break r.try_get(0)?;
        }
        execute(
            tx,
            "INSERT INTO key_heads (queue, msg_key) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            &[&queue, &key],
        )
        .await?;
    };
    if let Some(h) = recorded.filter(|h| *h != seq) {
        // Wait for a claim of the head in flight; from now on claims skip it.
        query(
            tx,
            "SELECT 1 FROM messages WHERE seq = $1 FOR UPDATE",
            &[&h],
        )
        .await?;
    }
    let touched = query_opt(
        tx,
        "SELECT state, key_blocked FROM messages WHERE seq = $1",
        &[&seq],
    )
    .await?;
    let mut candidates: Vec<(i64, Option<bool>)> = Vec::with_capacity(3);
    if let Some(r) = touched {
        let code: i16 = r.try_get(0)?;
        let value: Option<bool> = r.try_get(1)?;
        let state = u8::try_from(code)
            .ok()
            .and_then(State::from_code)
            .ok_or_else(|| {
                E::Db(StoreError::Backend(format!(
                    "message {seq} has state code {code}"
                )))
            })?;
        match (mode.takes_part(state), value) {
            (false, Some(_)) => set(tx, seq, None).await?,
            (true, None) => {
                set(tx, seq, Some(true)).await?;
                candidates.push((seq, Some(true)));
            }
            (true, Some(v)) => candidates.push((seq, Some(v))),
            (false, None) => {}
        }
    }
    let first = query(
        tx,
        "SELECT seq, key_blocked FROM messages WHERE queue = $1 AND msg_key = $2 \
         AND key_blocked IS NOT NULL ORDER BY seq LIMIT 2",
        &[&queue, &key],
    )
    .await?;
    let mut first_two: Vec<(i64, Option<bool>)> = Vec::with_capacity(2);
    for r in &first {
        first_two.push((r.try_get(0)?, r.try_get(1)?));
    }
    let leased: bool = query_one(
        tx,
        "SELECT EXISTS (SELECT 1 FROM messages WHERE queue = $1 AND msg_key = $2 \
         AND msg_key IS NOT NULL AND state = 2)",
        &[&queue, &key],
    )
    .await?
    .try_get(0)?;
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
            set(tx, s, Some(wanted)).await?;
        }
    }
    if oldest != recorded {
        execute(
            tx,
            "UPDATE key_heads SET head_seq = $3 WHERE queue = $1 AND msg_key = $2",
            &[&queue, &key, &oldest],
        )
        .await?;
    }
    Ok(())
}

async fn set(tx: &Transaction<'_>, seq: i64, value: Option<bool>) -> Result<(), E> {
    execute(
        tx,
        "UPDATE messages SET key_blocked = $2 WHERE seq = $1",
        &[&seq, &value],
    )
    .await?;
    Ok(())
}

/// At open: when the ordering of a queue changed since its rows were written, rewrite their
/// `key_blocked` and `key_heads` (one pass over the queue's keyed messages), and record the
/// modes; one transaction under the schema's migration lock. Without it, messages of a
/// queue made unordered would stay blocked for ever, and those of a queue made ordered
/// would all be leasable at once. (The nodes of a cluster must agree on their queues'
/// ordering: each open under another configuration rewrites it.)
pub async fn reconcile(
    client: &mut deadpool_postgres::Client,
    schema: &str,
    catalog: &QueueCatalog,
) -> Result<(), E> {
    let now = KeyModes::of(catalog);
    let tx = client.transaction().await?;
    tx.execute(
        "SELECT pg_advisory_xact_lock($1)",
        &[&crate::schema::lock_key(schema)],
    )
    .await?;
    let recorded = query_opt(&tx, "SELECT v FROM meta WHERE k = 'key_order_modes'", &[]).await?;
    let before = match recorded {
        Some(r) => serde_json::from_str(&r.try_get::<_, String>(0)?)?,
        // A new schema: every row was written unordered (NULL), which is what
        // `Unordered` writes.
        None => KeyModes::unordered(),
    };
    if before == now {
        tx.commit().await?;
        return Ok(());
    }
    let queues = query(&tx, "SELECT DISTINCT mi_queue FROM message_ids", &[]).await?;
    for r in &queues {
        let queue: String = r.try_get(0)?;
        let mode = now.get(&queue);
        if before.get(&queue) != mode {
            rebuild(&tx, &queue, mode).await?;
            tracing::info!(
                queue,
                ?mode,
                "rewrote the per-key order of a queue whose ordering changed"
            );
        }
    }
    execute(
        &tx,
        "INSERT INTO meta (k, v) VALUES ('key_order_modes', $1) \
         ON CONFLICT (k) DO UPDATE SET v = EXCLUDED.v",
        &[&serde_json::to_string(&now)?],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Rewrite `key_blocked` and `key_heads` for every message of `queue` under `mode`.
async fn rebuild(tx: &Transaction<'_>, queue: &str, mode: KeyMode) -> Result<(), E> {
    execute(
        tx,
        "UPDATE messages SET key_blocked = NULL WHERE queue = $1 AND key_blocked IS NOT NULL",
        &[&queue],
    )
    .await?;
    execute(tx, "DELETE FROM key_heads WHERE queue = $1", &[&queue]).await?;
    let taking_part = match mode {
        KeyMode::Unordered => return Ok(()),
        KeyMode::Skip => "0, 1, 2",
        KeyMode::Block => "0, 1, 2, 4",
    };
    execute(
        tx,
        &format!(
            "UPDATE messages SET key_blocked = true WHERE queue = $1 AND msg_key IS NOT NULL \
             AND state IN ({taking_part})"
        ),
        &[&queue],
    )
    .await?;
    execute(
        tx,
        "INSERT INTO key_heads (queue, msg_key, head_seq) SELECT queue, msg_key, min(seq) \
         FROM messages WHERE queue = $1 AND key_blocked IS NOT NULL GROUP BY queue, msg_key",
        &[&queue],
    )
    .await?;
    execute(
        tx,
        "UPDATE messages SET key_blocked = false WHERE seq IN (SELECT head_seq FROM key_heads \
         WHERE queue = $1) AND NOT EXISTS (SELECT 1 FROM messages l WHERE l.queue = $1 \
         AND l.msg_key = messages.msg_key AND l.state = 2)",
        &[&queue],
    )
    .await?;
    Ok(())
}
