//! The backend's internal error, and how MySQL's errors become [`StoreError`]s.
//!
//! As in the PostgreSQL store, three kinds of failure inside a transaction are told apart:
//!
//! - [`E::Logic`]: the transition is refused (wrong token, wrong state, not found …). No
//!   SQL failed, so the transaction is intact: in a batch that item answers the error and
//!   the others go on in the same transaction.
//! - [`E::Db`]: a statement failed or the connection was lost: the call fails and its
//!   transaction is rolled back.
//! - [`E::Retry`]: InnoDB chose this transaction as a deadlock victim (error 1213) or a
//!   lock wait timed out (1205), or a race this backend detected itself (two publishes of
//!   one idempotency key on two nodes): the transaction is rolled back and run again, after
//!   a short random pause, a bounded number of times ([`crate::MAX_RETRIES`]).

use redrive_storage::StoreError;

/// MySQL's "Deadlock found when trying to get lock" (`ER_LOCK_DEADLOCK`).
pub const ER_LOCK_DEADLOCK: u16 = 1213;
/// MySQL's "Lock wait timeout exceeded" (`ER_LOCK_WAIT_TIMEOUT`).
pub const ER_LOCK_WAIT_TIMEOUT: u16 = 1205;

/// Why a transaction is run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// Error 1213.
    Deadlock,
    /// Error 1205.
    LockWait,
    /// A race the store found itself (an idempotency key taken meanwhile).
    Race,
}

/// An error inside a transaction (see the module docs).
#[derive(Debug)]
pub enum E {
    /// A refused transition; the transaction can go on.
    Logic(StoreError),
    /// A failed statement or a lost connection; the transaction is rolled back.
    Db(StoreError),
    /// Roll back and run the transaction again.
    Retry(Conflict, String),
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

impl From<mysql_async::Error> for E {
    fn from(e: mysql_async::Error) -> Self {
        match &e {
            mysql_async::Error::Server(s) if s.code == ER_LOCK_DEADLOCK => {
                E::Retry(Conflict::Deadlock, s.message.clone())
            }
            mysql_async::Error::Server(s) if s.code == ER_LOCK_WAIT_TIMEOUT => {
                E::Retry(Conflict::LockWait, s.message.clone())
            }
            _ => E::Db(store_error(&e)),
        }
    }
}

impl E {
    /// A statement failed because its connection was lost, not because the database
    /// refused it: the next connection may succeed.
    pub fn lost_connection(&self) -> bool {
        matches!(self, E::Db(StoreError::Unavailable(_)))
    }

    /// The error to answer with. A transaction that kept conflicting is
    /// [`StoreError::Unavailable`] (contention passes: the caller retries), logged.
    pub fn into_store(self) -> StoreError {
        match self {
            E::Logic(e) | E::Db(e) => e,
            E::Retry(kind, why) => {
                tracing::warn!(?kind, %why, "a MySQL transaction kept conflicting; gave up (answered as unavailable)");
                StoreError::Unavailable(format!("transaction kept conflicting, gave up: {why}"))
            }
        }
    }
}

/// Server error codes that mean the server is going away or cannot take us now, not that
/// it refused the statement: shutdown in progress (1053), too many connections (1040,
/// 1203), server gone / lost (2006, 2013), read-only while failing over (1290, 1836).
const UNAVAILABLE_CODES: &[u16] = &[1040, 1053, 1203, 1290, 1836, 2006, 2013, 1927];

/// A driver error as the contract's error: a lost or refused connection is
/// [`StoreError::Unavailable`]; anything else is [`StoreError::Backend`].
pub fn store_error(e: &mysql_async::Error) -> StoreError {
    use mysql_async::{DriverError, Error};
    match e {
        Error::Io(io) => StoreError::Unavailable(format!("MySQL: {io}")),
        Error::Driver(
            d @ (DriverError::ConnectionClosed
            | DriverError::PoolDisconnected
            | DriverError::UnexpectedPacket { .. }),
        ) => StoreError::Unavailable(format!("MySQL: {d}")),
        Error::Server(s) if UNAVAILABLE_CODES.contains(&s.code) => {
            StoreError::Unavailable(format!("MySQL: {} ({}): {}", s.code, s.state, s.message))
        }
        Error::Server(s) => {
            StoreError::Backend(format!("MySQL: {} ({}): {}", s.code, s.state, s.message))
        }
        other => StoreError::Backend(format!("MySQL: {other}")),
    }
}
