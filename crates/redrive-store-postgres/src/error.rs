//! The backend's internal error, and how PostgreSQL's errors become [`StoreError`]s.
//!
//! Inside a transaction three kinds of failure must be told apart, because they end the
//! transaction differently:
//!
//! - [`E::Logic`]: the transition is refused (wrong token, wrong state, not found …). No
//!   SQL failed, so the transaction is intact: in a batch (ack, nack …) that item answers
//!   the error and the others go on in the same transaction.
//! - [`E::Db`]: a statement failed. PostgreSQL has aborted the transaction: the whole
//!   call fails and is rolled back.
//! - [`E::Retry`]: a serialization failure or a deadlock (SQLSTATE `40001`, `40P01`), or a
//!   race this backend detected itself (two publishes of one idempotency key on two
//!   nodes): the transaction is rolled back and run again from the start.

use redrive_storage::StoreError;
use tokio_postgres::error::SqlState;

/// An error inside a transaction (see the module docs).
#[derive(Debug)]
pub enum E {
    /// A refused transition; the transaction can go on.
    Logic(StoreError),
    /// A failed statement or a lost connection; the transaction is aborted.
    Db(StoreError),
    /// Roll back and run the transaction again.
    Retry(String),
}

impl From<StoreError> for E {
    fn from(e: StoreError) -> Self {
        E::Logic(e)
    }
}

impl From<serde_json::Error> for E {
    fn from(e: serde_json::Error) -> Self {
        E::Logic(e.into())
    }
}

impl From<tokio_postgres::Error> for E {
    fn from(e: tokio_postgres::Error) -> Self {
        match e.code() {
            Some(c)
                if *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::T_R_DEADLOCK_DETECTED =>
            {
                E::Retry(e.to_string())
            }
            _ => E::Db(store_error(&e)),
        }
    }
}

impl From<deadpool_postgres::PoolError> for E {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        E::Db(pool_error(&e))
    }
}

impl E {
    /// A statement failed because its connection was lost (closed, or terminated by the
    /// server), not because the database refused it: the next connection may succeed.
    pub fn lost_connection(&self) -> bool {
        matches!(self, E::Db(StoreError::Unavailable(_)))
    }

    /// The error to answer with. A transaction that kept conflicting (deadlocks,
    /// serialization failures, racing idempotency keys, [`crate::MAX_RETRIES`] times in a
    /// row) is [`StoreError::Unavailable`]: contention, which passes, so the caller is told
    /// to try again (503), not that the server is broken (500). Logged, since it says the
    /// database is very contended.
    pub fn into_store(self) -> StoreError {
        match self {
            E::Logic(e) | E::Db(e) => e,
            E::Retry(why) => {
                tracing::warn!(%why, "a PostgreSQL transaction kept conflicting; gave up (answered as unavailable)");
                StoreError::Unavailable(format!("transaction kept conflicting, gave up: {why}"))
            }
        }
    }
}

/// A PostgreSQL error as the contract's error: a lost or refused connection, a server
/// shutting down or not accepting connections is [`StoreError::Unavailable`] (the store
/// is fine, the database is not there); anything else is [`StoreError::Backend`].
pub fn store_error(e: &tokio_postgres::Error) -> StoreError {
    let unavailable = e.is_closed()
        || match e.code() {
            // Class 08: connection exception; 57P01..57P03: admin / crash shutdown,
            // cannot connect now; 53300: too many connections.
            Some(c) => {
                c.code().starts_with("08")
                    || *c == SqlState::ADMIN_SHUTDOWN
                    || *c == SqlState::CRASH_SHUTDOWN
                    || *c == SqlState::CANNOT_CONNECT_NOW
                    || *c == SqlState::TOO_MANY_CONNECTIONS
            }
            // No SQLSTATE: the error came from the socket, not from the server.
            None => std::error::Error::source(e)
                .is_some_and(|s| s.downcast_ref::<std::io::Error>().is_some()),
        };
    let text = match e.as_db_error() {
        Some(db) => format!("{}: {}", db.code().code(), db.message()),
        None => e.to_string(),
    };
    if unavailable {
        StoreError::Unavailable(format!("PostgreSQL: {text}"))
    } else {
        StoreError::Backend(format!("PostgreSQL: {text}"))
    }
}

/// A pool error: no connection could be had (timeout, refused, lost): unavailable.
pub fn pool_error(e: &deadpool_postgres::PoolError) -> StoreError {
    match e {
        deadpool_postgres::PoolError::Backend(pg) => store_error(pg),
        deadpool_postgres::PoolError::Closed => StoreError::Closed,
        other => StoreError::Unavailable(format!("PostgreSQL connection pool: {other}")),
    }
}
