//! Small helpers over a connection or a transaction: statements with positional
//! arguments, typed column reads, and the clock.

use crate::error::E;
use mysql_async::prelude::{FromValue, Queryable};
use mysql_async::{Params, Row, Value};
use redrive_core::Timestamp;
use redrive_storage::StoreError;

/// Positional arguments of a statement: `args![a, b, c]`.
macro_rules! args {
    () => { mysql_async::Params::Empty };
    ($($x:expr),+ $(,)?) => {
        mysql_async::Params::Positional(vec![$(mysql_async::Value::from($x)),+])
    };
}
pub(crate) use args;

/// A connection or a transaction on one: what every statement runs on.
pub trait Db: Queryable + Send {
    /// Rows changed by the last statement.
    fn changed(&self) -> u64;
    /// The `AUTO_INCREMENT` value of the last insert's first row.
    fn inserted_id(&self) -> Option<u64>;
}

impl Db for mysql_async::Conn {
    fn changed(&self) -> u64 {
        self.affected_rows()
    }
    fn inserted_id(&self) -> Option<u64> {
        self.last_insert_id()
    }
}

impl Db for mysql_async::Transaction<'_> {
    fn changed(&self) -> u64 {
        self.affected_rows()
    }
    fn inserted_id(&self) -> Option<u64> {
        self.last_insert_id()
    }
}

/// Run `sql` (prepared once per connection) and collect its rows.
pub async fn query<C: Db>(c: &mut C, sql: &str, p: Params) -> Result<Vec<Row>, E> {
    Ok(c.exec(sql, p).await?)
}

/// Run `sql`; its first row, if any.
pub async fn query_opt<C: Db>(c: &mut C, sql: &str, p: Params) -> Result<Option<Row>, E> {
    Ok(c.exec_first(sql, p).await?)
}

/// Run `sql`; its one row.
pub async fn query_one<C: Db>(c: &mut C, sql: &str, p: Params) -> Result<Row, E> {
    query_opt(c, sql, p).await?.ok_or_else(|| {
        E::Db(StoreError::Backend(format!(
            "MySQL: a statement answered no row: {sql}"
        )))
    })
}

/// Run `sql`; how many rows it changed.
pub async fn execute<C: Db>(c: &mut C, sql: &str, p: Params) -> Result<u64, E> {
    c.exec_drop(sql, p).await?;
    Ok(c.changed())
}

/// Column `i` of `r` as `T` (an `Option` for a nullable column).
pub fn col<T: FromValue>(r: &Row, i: usize) -> Result<T, E> {
    match r.get_opt::<T, usize>(i) {
        Some(Ok(v)) => Ok(v),
        Some(Err(e)) => Err(E::Db(StoreError::Backend(format!(
            "MySQL: column {i} ({}) has an unexpected value: {e}",
            r.columns_ref()
                .get(i)
                .map(|c| c.name_str().into_owned())
                .unwrap_or_default()
        )))),
        None => Err(E::Db(StoreError::Backend(format!(
            "MySQL: a row without column {i}"
        )))),
    }
}

/// The database's clock, in ms since the epoch (`NOW(3)`: the statement's start, with
/// milliseconds; every session runs at UTC, so no daylight-saving hour is ambiguous).
const DB_NOW_MS: &str = "SELECT CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// `now` when the caller gave one, else the database's clock. Every operation resolves
/// its time once, first thing, so that the rules see one instant for the whole
/// transaction.
pub async fn resolve_now<C: Db>(c: &mut C, now: Option<Timestamp>) -> Result<Timestamp, E> {
    match now {
        Some(t) => Ok(t),
        None => {
            let r = query_one(c, DB_NOW_MS, Params::Empty).await?;
            Ok(Timestamp::from_millis(col(&r, 0)?))
        }
    }
}

/// `n` placeholders: `?, ?, ?`.
pub fn marks(n: usize) -> String {
    let mut s = String::with_capacity(n * 3);
    for i in 0..n {
        if i > 0 {
            s.push_str(", ");
        }
        s.push('?');
    }
    s
}

/// A derived table of `n` rows of one column `k`, each a placeholder: `SELECT ? AS k UNION
/// ALL SELECT ? …`. A `DELETE` of a list of keys joins it (`DELETE t FROM t JOIN (…) v ON
/// t.pk = v.k`): with `WHERE pk IN (…)` of many keys on a small table, the optimizer scans
/// the whole table instead, which takes (and waits for) a lock on every row it reads, and
/// two such deletes deadlock (InnoDB ignores an index hint on a multi-table `DELETE`). For a
/// `SELECT` or an `UPDATE`, `FORCE INDEX` does the same.
pub fn key_rows(n: usize) -> String {
    let mut s = String::with_capacity(n * 18 + 8);
    for i in 0..n {
        s.push_str(if i == 0 {
            "SELECT ? AS k"
        } else {
            " UNION ALL SELECT ?"
        });
    }
    s
}

/// Values of a list of arguments (for an `IN (…)` built with [`marks`]).
pub fn list<T: Into<Value> + Clone>(items: &[T]) -> Params {
    Params::Positional(items.iter().cloned().map(Into::into).collect())
}
