//! Cluster membership and leadership (tables `nodes` and `leader`), at the database's clock,
//! and the push endpoints' shared breakers (table `endpoint_trips`).
//!
//! A heartbeat is one transaction: upsert the node's row, forget nodes not seen for a day,
//! then lock the single `leader` row (`FOR UPDATE`) and apply
//! [`redrive_storage::cluster::next_leader`] to it: two nodes beating at once queue on that
//! row's lock, and under `READ COMMITTED` the second reads the row the first committed, so
//! at most one takes it. A trip is [`redrive_storage::cluster::next_trip`] in one upsert.

use crate::error::E;
use crate::sql::{args, col, execute, query, query_one, resolve_now, Db};
use mysql_async::Params;
use redrive_core::Timestamp;
use redrive_storage::cluster::{next_leader, FORGET_NODE_MS};
use redrive_storage::{
    Beat, ClusterView, EndpointTrip, EndpointTrips, Heartbeat, Leadership, NodeRecord,
};

/// The leader row: the record (lapsed or not) and the highest epoch so far.
async fn leader_row<C: Db>(c: &mut C, lock: bool) -> Result<(Option<Leadership>, u64), E> {
    let sql = if lock {
        "SELECT node, incarnation, epoch, expires_at FROM leader WHERE one = 1 FOR UPDATE"
    } else {
        "SELECT node, incarnation, epoch, expires_at FROM leader WHERE one = 1"
    };
    let r = query_one(c, sql, Params::Empty).await?;
    let epoch = col::<i64>(&r, 2)?.max(0) as u64;
    let Some(incarnation) = col::<Option<String>>(&r, 1)? else {
        return Ok((None, epoch));
    };
    Ok((
        Some(Leadership {
            node: col::<Option<String>>(&r, 0)?.unwrap_or_default(),
            incarnation,
            epoch,
            expires_at: Timestamp::from_millis(col(&r, 3)?),
        }),
        epoch,
    ))
}

/// Record `beat` and take or renew leadership when the rule allows.
pub async fn heartbeat<C: Db>(
    tx: &mut C,
    beat: &Heartbeat,
    now: Option<Timestamp>,
) -> Result<Beat, E> {
    let now = resolve_now(tx, now).await?;
    let t = now.as_millis();
    execute(
        tx,
        "INSERT INTO nodes (incarnation, node, address, version, started_at, last_seen) \
         VALUES (?, ?, ?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
         last_seen = GREATEST(last_seen, VALUES(last_seen)), address = VALUES(address)",
        args![
            beat.incarnation.as_str(),
            beat.node.as_str(),
            beat.address.as_str(),
            beat.version.as_str(),
            t,
            t
        ],
    )
    .await?;
    execute(
        tx,
        "DELETE FROM nodes WHERE last_seen < ?",
        args![t - FORGET_NODE_MS],
    )
    .await?;
    let (current, epoch) = leader_row(tx, beat.lead).await?;
    if let Some(next) = next_leader(current.as_ref(), epoch, beat, now) {
        execute(
            tx,
            "UPDATE leader SET node = ?, incarnation = ?, epoch = ?, expires_at = ? WHERE one = 1",
            args![
                next.node.as_str(),
                next.incarnation.as_str(),
                next.epoch as i64,
                next.expires_at.as_millis()
            ],
        )
        .await?;
        return Ok(Beat {
            at: now,
            leader: Some(next),
        });
    }
    Ok(Beat {
        at: now,
        leader: redrive_storage::cluster::live_leader(current.as_ref(), now),
    })
}

/// Forget the node `incarnation`; its leadership, if it holds it, lapses now.
pub async fn leave<C: Db>(tx: &mut C, incarnation: &str, now: Option<Timestamp>) -> Result<(), E> {
    let now = resolve_now(tx, now).await?;
    execute(
        tx,
        "DELETE FROM nodes WHERE incarnation = ?",
        args![incarnation],
    )
    .await?;
    execute(
        tx,
        "UPDATE leader SET expires_at = LEAST(expires_at, ?) WHERE one = 1 AND incarnation = ?",
        args![now.as_millis(), incarnation],
    )
    .await?;
    Ok(())
}

/// The nodes, oldest first, and the live leader, read in one consistent snapshot
/// (`REPEATABLE READ`, the connection's own level being `READ COMMITTED`): read apart, a
/// heartbeat committing between them showed its leadership with its node missing from the
/// list (shared-handles case `a_cluster_view_is_one_moment`).
pub async fn view(c: &mut mysql_async::Conn, now: Option<Timestamp>) -> Result<ClusterView, E> {
    let mut opts = mysql_async::TxOpts::default();
    opts.with_isolation_level(mysql_async::IsolationLevel::RepeatableRead)
        .with_consistent_snapshot(true)
        .with_readonly(true);
    let mut tx = c.start_transaction(opts).await?;
    let now = resolve_now(&mut tx, now).await?;
    let rows = query(
        &mut tx,
        "SELECT node, incarnation, address, version, started_at, last_seen FROM nodes \
         ORDER BY started_at, incarnation",
        Params::Empty,
    )
    .await?;
    let mut nodes = Vec::with_capacity(rows.len());
    for r in &rows {
        nodes.push(NodeRecord {
            node: col(r, 0)?,
            incarnation: col(r, 1)?,
            address: col(r, 2)?,
            version: col(r, 3)?,
            started_at: Timestamp::from_millis(col(r, 4)?),
            last_seen: Timestamp::from_millis(col(r, 5)?),
        });
    }
    let (current, _) = leader_row(&mut tx, false).await?;
    tx.commit().await?;
    Ok(ClusterView {
        at: now,
        nodes,
        leader: redrive_storage::cluster::live_leader(current.as_ref(), now),
    })
}

/// Record a trip of `endpoint` by `incarnation` for `open_ms` (kept only if it ends later
/// than the one recorded: `open_until` is assigned last, so every `IF` sees the old one).
pub async fn endpoint_trip<C: Db>(
    tx: &mut C,
    endpoint: &str,
    incarnation: &str,
    open_ms: u64,
    now: Option<Timestamp>,
) -> Result<(), E> {
    let now = resolve_now(tx, now).await?;
    let t = now.as_millis();
    let until = t.saturating_add(i64::try_from(open_ms.max(1)).unwrap_or(i64::MAX / 2));
    execute(
        tx,
        "INSERT INTO endpoint_trips (endpoint, incarnation, tripped_at, open_until) \
         VALUES (?, ?, ?, ?) ON DUPLICATE KEY UPDATE \
         incarnation = IF(open_until < VALUES(open_until), VALUES(incarnation), incarnation), \
         tripped_at = IF(open_until < VALUES(open_until), VALUES(tripped_at), tripped_at), \
         open_until = GREATEST(open_until, VALUES(open_until))",
        args![endpoint, incarnation, t, until],
    )
    .await?;
    Ok(())
}

/// The trips whose period has not ended at `now`, by endpoint.
pub async fn endpoint_trips<C: Db>(c: &mut C, now: Option<Timestamp>) -> Result<EndpointTrips, E> {
    let now = resolve_now(c, now).await?;
    let rows = query(
        c,
        "SELECT endpoint, incarnation, tripped_at, open_until FROM endpoint_trips \
         WHERE open_until > ? ORDER BY endpoint",
        args![now.as_millis()],
    )
    .await?;
    let mut open = Vec::with_capacity(rows.len());
    for r in &rows {
        open.push(EndpointTrip {
            endpoint: col(r, 0)?,
            incarnation: col(r, 1)?,
            tripped_at: Timestamp::from_millis(col(r, 2)?),
            open_until: Timestamp::from_millis(col(r, 3)?),
        });
    }
    Ok(EndpointTrips { at: now, open })
}
