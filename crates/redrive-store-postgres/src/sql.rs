//! Small helpers over a connection or a transaction: prepared (and cached) statements,
//! and the clock.

use crate::error::E;
use deadpool_postgres::GenericClient;
use redrive_core::Timestamp;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

/// Parameters of a statement.
pub type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

/// Run `sql` (prepared once per connection) and collect its rows.
pub async fn query<C: GenericClient>(c: &C, sql: &str, p: Params<'_>) -> Result<Vec<Row>, E> {
    let st = c.prepare_cached(sql).await?;
    Ok(c.query(&st, p).await?)
}

/// Run `sql`; its one row, if any.
pub async fn query_opt<C: GenericClient>(
    c: &C,
    sql: &str,
    p: Params<'_>,
) -> Result<Option<Row>, E> {
    let st = c.prepare_cached(sql).await?;
    Ok(c.query_opt(&st, p).await?)
}

/// Run `sql`; its one row.
pub async fn query_one<C: GenericClient>(c: &C, sql: &str, p: Params<'_>) -> Result<Row, E> {
    let st = c.prepare_cached(sql).await?;
    Ok(c.query_one(&st, p).await?)
}

/// Run `sql`; how many rows it changed.
pub async fn execute<C: GenericClient>(c: &C, sql: &str, p: Params<'_>) -> Result<u64, E> {
    let st = c.prepare_cached(sql).await?;
    Ok(c.execute(&st, p).await?)
}

/// `now` when the caller gave one, else the database's clock (`clock_timestamp()`, in ms:
/// the time of the call, not of the transaction's start). Every operation takes its
/// time as `Option<Timestamp>` and resolves it once, first thing, so that the rules see one
/// instant for the whole transaction.
pub async fn resolve_now<C: GenericClient>(c: &C, now: Option<Timestamp>) -> Result<Timestamp, E> {
    match now {
        Some(t) => Ok(t),
        None => {
            let r = query_one(
                c,
                "SELECT (extract(epoch from clock_timestamp()) * 1000)::bigint",
                &[],
            )
            .await?;
            Ok(Timestamp::from_millis(r.try_get(0)?))
        }
    }
}
