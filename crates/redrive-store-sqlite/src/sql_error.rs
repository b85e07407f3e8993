//! SQLite's errors, turned into [`StoreError`]s inside this backend only.
//!
//! The storage contract ([`redrive_storage::StoreError`]) names no backend, so it has no
//! `From<rusqlite::Error>`: a PostgreSQL backend must not inherit SQLite's error
//! type through `?`. Inside this module a driver error is converted explicitly with
//! [`SqlResultExt::db`] (`stmt.execute(..).db()?`), and always becomes
//! [`StoreError::Backend`], which the API answers with a 500 that hides the detail.

use redrive_storage::StoreError;

/// `.db()` on a `rusqlite::Result`: the error as a [`StoreError::Backend`].
pub(crate) trait SqlResultExt<T> {
    /// The value, or the driver's error as [`StoreError::Backend`].
    fn db(self) -> Result<T, StoreError>;
}

impl<T> SqlResultExt<T> for rusqlite::Result<T> {
    fn db(self) -> Result<T, StoreError> {
        self.map_err(sql_error)
    }
}

/// A driver error as [`StoreError::Backend`] (for `map_err` where `.db()` does not fit).
pub(crate) fn sql_error(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}
