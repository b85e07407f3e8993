//! What MySQL has instead of LISTEN/NOTIFY: every store polls.
//!
//! Every [`crate::MysqlOptions::poll_every`] (at most 1 s) the poller of a store asks the
//! database for the `ready` rows written since it last looked (`ready.rid`, an
//! auto-increment, is the cursor) by *another* store (`ready.node` names the writer), and
//! hands them to [`redrive_storage::Notifier::ready`] per queue: a publish, a retry due now,
//! a release or a promotion on another node wakes this node's long polls within one poll.
//! The same query is the health probe: no answer within 2 s makes [`Store::health`]
//! `Unavailable` until one comes. It also reads the schema's version: once a newer redrive
//! (a node upgraded while this one runs) has migrated the database past
//! [`crate::SCHEMA_VERSION`], the store refuses every call ([`StoreError::Superseded`]).
//!
//! A hint, never relied upon: a row whose transaction commits after a later one was seen
//! is missed by the cursor (an auto-increment is taken at insert, not at commit), and a
//! long poll re-checks its queue every second anyway (`Notifier::recheck`). The poller also
//! keeps the wake hint at most 1 s ahead, so that every node ticks at least once a second:
//! a message scheduled, or a lease taken, on another node is promoted or expired within a
//! second of its time. That second is counted on the database's clock, which the poll reads
//! (the wake hint is a time of the store's clock, which a node whose own clock is minutes
//! ahead would otherwise push minutes away).
//!
//! [`Store::health`]: redrive_storage::Store::health

use crate::error::E;
use crate::sql::{args, col, query, query_one};
use crate::Inner;
use mysql_async::Params;
use redrive_storage::ReadyNotice;
#[cfg(doc)]
use redrive_storage::StoreError;
use std::sync::Arc;
use std::time::Duration;

/// The newest `ready.rid` (0 when empty): where a new store's poller starts.
pub async fn newest_rid(c: &mut mysql_async::Conn) -> Result<i64, E> {
    let r = query_one(c, "SELECT COALESCE(MAX(rid), 0) FROM ready", Params::Empty).await?;
    col(&r, 0)
}

/// One poll: the notices of rows written by others after `after`, the new cursor, and
/// the database's clock (ms). Refuses everything from then on if the schema's version is
/// newer than this build's.
async fn poll_once(inner: &Inner, after: i64) -> Result<(Vec<ReadyNotice>, i64, i64), E> {
    let mut c = inner.conn().await?;
    let r = query_one(
        &mut c,
        "SELECT COALESCE(MAX(rid), 0), CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED), \
         (SELECT MAX(version) FROM schema_migrations) FROM ready",
        Params::Empty,
    )
    .await?;
    let (top, db_now): (i64, i64) = (col(&r, 0)?, col(&r, 1)?);
    let version: Option<i64> = col(&r, 2)?;
    if let Some(v) = version.filter(|v| *v > crate::SCHEMA_VERSION) {
        let why = crate::schema::superseded(inner.database(), v);
        if inner.superseded.set(why.clone()) {
            tracing::error!(reason = %why, "refusing every request: stop this node and start the newer redrive");
        }
    }
    if top < after {
        // The counter went back (MariaDB restarts it at the largest row + 1): start again
        // from what there is.
        return Ok((Vec::new(), top, db_now));
    }
    if top == after {
        return Ok((Vec::new(), after, db_now));
    }
    let rows = query(
        &mut c,
        "SELECT queue, CAST(SUM(node <> ?) AS SIGNED), MAX(rid) FROM ready WHERE rid > ? \
         GROUP BY queue",
        args![inner.node(), after],
    )
    .await?;
    let mut notices = Vec::new();
    let mut newest = after;
    for r in &rows {
        let queue: String = col(r, 0)?;
        let others: Option<i64> = col(r, 1)?;
        let max: i64 = col(r, 2)?;
        newest = newest.max(max);
        if let Some(n) = others.filter(|n| *n > 0) {
            notices.push(ReadyNotice {
                queue,
                count: u32::try_from(n).unwrap_or(u32::MAX),
            });
        }
    }
    Ok((notices, newest.max(top.min(newest)), db_now))
}

/// Poll every `every` until the task is aborted (the store closed), from cursor `rid`.
pub async fn run(inner: Arc<Inner>, every: Duration, mut rid: i64) {
    let mut next_due = tokio::time::Instant::now();
    loop {
        let answer = tokio::time::timeout(Duration::from_secs(2), poll_once(&inner, rid)).await;
        let why = match answer {
            Ok(Ok((notices, cursor, db_now))) => {
                let now = tokio::time::Instant::now();
                if now >= next_due {
                    inner.due_elsewhere(db_now + 1_000);
                    next_due = now + Duration::from_secs(1);
                }
                rid = cursor;
                for n in notices {
                    let _ = inner.ready_tx.send(n);
                }
                None
            }
            Ok(Err(e)) => Some(format!("MySQL does not answer: {}", e.into_store())),
            Err(_) => Some("MySQL did not answer within 2 s".to_owned()),
        };
        inner.set_unavailable(why);
        tokio::time::sleep(every).await;
    }
}
