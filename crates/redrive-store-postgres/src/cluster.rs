//! Cluster membership and leadership (tables `nodes` and `leader`, schema v5): the rule of
//! [`redrive_storage::cluster::next_leader`] stated in SQL, at the database's clock. And the
//! push endpoints' shared breakers (table `endpoint_trips`, schema v7): the latest trip per
//! endpoint ([`redrive_storage::cluster::next_trip`] in one upsert).
//!
//! A heartbeat is one transaction: upsert the node's row (`last_seen` = the database's
//! clock), forget nodes not seen for a day, then one `UPDATE` of the single `leader` row
//! that takes or renews leadership only when the rule allows it. Two nodes beating at once
//! queue on that row's lock; under `READ COMMITTED` the second re-reads the row the first
//! committed and finds a live holder, so at most one takes it.

use crate::error::E;
use crate::sql::{execute, query, query_one, resolve_now};
use deadpool_postgres::{GenericClient, Transaction};
use redrive_core::Timestamp;
use redrive_storage::cluster::FORGET_NODE_MS;
use redrive_storage::{
    Beat, ClusterView, EndpointTrip, EndpointTrips, Heartbeat, Leadership, NodeRecord,
};

/// Schema v5: the tables of the cluster.
pub const V5: &str = r#"
CREATE TABLE nodes (
  incarnation text COLLATE "C" PRIMARY KEY,
  node        text NOT NULL,
  address     text NOT NULL,
  version     text NOT NULL,
  started_at  bigint NOT NULL,
  last_seen   bigint NOT NULL
);
CREATE TABLE leader (
  one         boolean PRIMARY KEY DEFAULT true CHECK (one),
  incarnation text COLLATE "C",
  node        text,
  epoch       bigint NOT NULL DEFAULT 0,
  expires_at  bigint NOT NULL DEFAULT 0
);
INSERT INTO leader DEFAULT VALUES;
"#;

/// Schema v7: the latest breaker trip of each push endpoint (one row per endpoint, kept:
/// as many rows as endpoints ever tripped).
pub const V7: &str = r#"
CREATE TABLE endpoint_trips (
  endpoint    text COLLATE "C" PRIMARY KEY,
  incarnation text NOT NULL,
  tripped_at  bigint NOT NULL,
  open_until  bigint NOT NULL
);
"#;

const LEADER_COLUMNS: &str = "node, incarnation, epoch, expires_at";

fn leadership(r: &tokio_postgres::Row) -> Result<Option<Leadership>, E> {
    let Some(incarnation) = r.try_get::<_, Option<String>>(1)? else {
        return Ok(None);
    };
    Ok(Some(Leadership {
        node: r.try_get::<_, Option<String>>(0)?.unwrap_or_default(),
        incarnation,
        epoch: r.try_get::<_, i64>(2)?.max(0) as u64,
        expires_at: Timestamp::from_millis(r.try_get(3)?),
    }))
}

/// The leader row as it is, `None` once its leadership lapsed at `now`.
async fn live_leader<C: GenericClient>(c: &C, now: Timestamp) -> Result<Option<Leadership>, E> {
    let r = query_one(
        c,
        &format!("SELECT {LEADER_COLUMNS} FROM leader WHERE one"),
        &[],
    )
    .await?;
    Ok(leadership(&r)?.filter(|l| l.expires_at > now))
}

/// Record `beat` and take or renew leadership when the rule allows.
pub async fn heartbeat(
    tx: &Transaction<'_>,
    beat: &Heartbeat,
    now: Option<Timestamp>,
) -> Result<Beat, E> {
    let now = resolve_now(tx, now).await?;
    let t = now.as_millis();
    execute(
        tx,
        "INSERT INTO nodes (incarnation, node, address, version, started_at, last_seen) \
         VALUES ($1, $2, $3, $4, $5, $5) ON CONFLICT (incarnation) DO UPDATE \
         SET last_seen = greatest(nodes.last_seen, excluded.last_seen), address = excluded.address",
        &[
            &beat.incarnation,
            &beat.node,
            &beat.address,
            &beat.version,
            &t,
        ],
    )
    .await?;
    execute(
        tx,
        "DELETE FROM nodes WHERE last_seen < $1",
        &[&(t - FORGET_NODE_MS)],
    )
    .await?;
    if beat.lead {
        let lead_ms = beat.lead_ms.clamp(1, i64::MAX as u64 / 2) as i64;
        // next_leader: the holder renews (same epoch); anyone else takes a vacant or
        // lapsed leadership with the next epoch; a live holder is left alone.
        let taken = query(
            tx,
            &format!(
                "UPDATE leader SET node = $2, \
                 epoch = CASE WHEN incarnation = $1 THEN epoch ELSE epoch + 1 END, \
                 incarnation = $1, expires_at = $3 + $4 \
                 WHERE one AND (incarnation = $1 OR incarnation IS NULL OR expires_at <= $3) \
                 RETURNING {LEADER_COLUMNS}"
            ),
            &[&beat.incarnation, &beat.node, &t, &lead_ms],
        )
        .await?;
        if let Some(r) = taken.first() {
            return Ok(Beat {
                at: now,
                leader: leadership(r)?,
            });
        }
    }
    Ok(Beat {
        at: now,
        leader: live_leader(tx, now).await?,
    })
}

/// Forget the node `incarnation`; its leadership, if it holds it, lapses now.
pub async fn leave(
    tx: &Transaction<'_>,
    incarnation: &str,
    now: Option<Timestamp>,
) -> Result<(), E> {
    let now = resolve_now(tx, now).await?;
    execute(
        tx,
        "DELETE FROM nodes WHERE incarnation = $1",
        &[&incarnation],
    )
    .await?;
    execute(
        tx,
        "UPDATE leader SET expires_at = least(expires_at, $2) WHERE one AND incarnation = $1",
        &[&incarnation, &now.as_millis()],
    )
    .await?;
    Ok(())
}

/// The nodes, oldest first, and the live leader.
///
/// Both are read in one snapshot (`REPEATABLE READ`): read apart, a heartbeat committing
/// between them showed its leadership with its node missing from the list, and a leave
/// the list with the leaver in it and its successor leading (shared-handles case
/// `a_cluster_view_is_one_moment`).
pub async fn view(
    c: &mut deadpool_postgres::Client,
    now: Option<Timestamp>,
) -> Result<ClusterView, E> {
    let tx = c
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await?;
    let now = resolve_now(&tx, now).await?;
    let rows = query(
        &tx,
        "SELECT node, incarnation, address, version, started_at, last_seen FROM nodes \
         ORDER BY started_at, incarnation",
        &[],
    )
    .await?;
    let mut nodes = Vec::with_capacity(rows.len());
    for r in &rows {
        nodes.push(NodeRecord {
            node: r.try_get(0)?,
            incarnation: r.try_get(1)?,
            address: r.try_get(2)?,
            version: r.try_get(3)?,
            started_at: Timestamp::from_millis(r.try_get(4)?),
            last_seen: Timestamp::from_millis(r.try_get(5)?),
        });
    }
    let leader = live_leader(&tx, now).await?;
    tx.commit().await?;
    Ok(ClusterView {
        at: now,
        nodes,
        leader,
    })
}

/// Record a trip of `endpoint` by `incarnation` for `open_ms` (kept only if it ends later
/// than the one recorded).
pub async fn endpoint_trip(
    tx: &Transaction<'_>,
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
         VALUES ($1, $2, $3, $4) ON CONFLICT (endpoint) DO UPDATE \
         SET incarnation = excluded.incarnation, tripped_at = excluded.tripped_at, \
             open_until = excluded.open_until \
         WHERE endpoint_trips.open_until < excluded.open_until",
        &[&endpoint, &incarnation, &t, &until],
    )
    .await?;
    Ok(())
}

/// The trips whose period has not ended at `now`, by endpoint.
pub async fn endpoint_trips<C: GenericClient>(
    c: &C,
    now: Option<Timestamp>,
) -> Result<EndpointTrips, E> {
    let now = resolve_now(c, now).await?;
    let rows = query(
        c,
        "SELECT endpoint, incarnation, tripped_at, open_until FROM endpoint_trips \
         WHERE open_until > $1 ORDER BY endpoint",
        &[&now.as_millis()],
    )
    .await?;
    let mut open = Vec::with_capacity(rows.len());
    for r in &rows {
        open.push(EndpointTrip {
            endpoint: r.try_get(0)?,
            incarnation: r.try_get(1)?,
            tripped_at: Timestamp::from_millis(r.try_get(2)?),
            open_until: Timestamp::from_millis(r.try_get(3)?),
        });
    }
    Ok(EndpointTrips { at: now, open })
}
