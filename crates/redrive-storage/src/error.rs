//! What can go wrong in a store, and what the caller should do about it.
//!
//! The contract names no backend: there is no conversion from a database driver's error
//! here. Each backend turns its own errors into [`StoreError::Backend`] privately (the
//! SQLite backend with `redrive_store_sqlite`'s `sql_error::SqlResultExt`).

use redrive_core::State;

/// A failed store operation. Each variant says what the caller should do.
///
/// Non-exhaustive: a backend may learn new failure kinds; a caller that does not know
/// one treats it like [`StoreError::Backend`] (a 500 without details).
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// No message has that id. Tell the client 404.
    #[error("no message with id {0}")]
    NotFound(String),
    /// The lease token is not the message's current token (another consumer, or garbage).
    /// The caller's work may be duplicated; it must not assume it owns the message.
    #[error("lease token does not match the message's current lease")]
    LeaseMismatch,
    /// The token was the message's lease, but that lease has expired (and was or will be
    /// counted as a failed attempt). Tell the client 409.
    #[error("the lease has expired")]
    LeaseExpired,
    /// The token was the message's lease, and that lease was already settled (acked,
    /// nacked, released, or ended by an operator's kill) before this call: nothing
    /// changed. Tell the client 409, saying how. (An ack repeated with the token of an
    /// acked lease is not this: it succeeds again, as a retried request.)
    #[error("the lease was already settled: {}", .0.explain())]
    LeaseSettled(crate::Settled),
    /// The operation is not allowed in the message's current state. Tell the client 409.
    #[error("message is {state}, {action} needs {allowed}", state = .state.as_str())]
    InvalidState {
        /// The message's state.
        state: State,
        /// What was attempted.
        action: &'static str,
        /// The states that allow it.
        allowed: &'static str,
    },
    /// A batch item reuses an idempotency key with a different payload. Nothing of the batch
    /// was written. Tell the client 409.
    #[error("item {index}: idempotency key {key:?} was already used with a different payload")]
    IdempotencyConflict {
        /// Index of the offending item in the batch.
        index: usize,
        /// The key.
        key: String,
    },
    /// A search cursor that no page of this store handed out (cursors are opaque: only a
    /// `next_cursor` may be passed back). Nothing was read. Tell the client 400.
    #[error("cursor {0:?} is not a next_cursor of this store")]
    InvalidCursor(String),
    /// No task has that id. Tell the client 404.
    #[error("no task with id {0}")]
    TaskNotFound(String),
    /// The task's state does not allow that (pause a finished task, resume a running one).
    /// Tell the client 409.
    #[error("task is {state}, {action} needs {allowed}", state = .state.as_str())]
    InvalidTaskState {
        /// The task's state.
        state: crate::TaskState,
        /// What was attempted.
        action: &'static str,
        /// The states that allow it.
        allowed: &'static str,
    },
    /// A previous write failed to reach the disk; the store refuses all writes until it is
    /// reopened (restart the process, check the disk). Tell the client 503.
    #[error("store is poisoned by an earlier failed write ({0}); restart after checking the disk")]
    Poisoned(String),
    /// Work guarded by a [`crate::cluster::Fence`] was refused: the leadership it names
    /// ended (lapsed, or another node took over). Nothing changed. The node must stop
    /// acting as leader.
    #[error("this node's leadership (epoch {epoch}) has ended; the work was not done")]
    Fenced {
        /// The epoch the caller claimed.
        epoch: u64,
    },
    /// The store's schema was upgraded by a newer redrive (another node of the cluster)
    /// while this one ran: this build's statements may no longer be what the schema needs,
    /// so it refuses every call until it is stopped and replaced by the newer version (at a
    /// restart it refuses to open). Tell the client 503 (`store_superseded`).
    #[error("{0}")]
    Superseded(String),
    /// The store is shutting down or its writer has stopped. Tell the client 503.
    #[error("store is closed")]
    Closed,
    /// The backend cannot be reached now (a database server that is down, restarting or
    /// unreachable, a connection lost mid-request, no free connection in time). Nothing is
    /// wrong with the store itself: it is not poisoned, and the same call may succeed once
    /// the database is back. Whether a write that failed this way was committed is unknown
    /// when the connection was lost during its commit. Tell the client 503
    /// (`store_unavailable`) and retry.
    #[error("storage backend unavailable: {0}; retry when it is back")]
    Unavailable(String),
    /// An unexpected backend error. Logged; tell the client 500 without the details.
    #[error("storage backend error: {0}")]
    Backend(String),
    /// At open: another store (another `redrive serve`, or another open in this process)
    /// holds the data directory's lock, and only one may use a directory. Nothing was
    /// opened or changed. Stop the other one, or use another directory.
    #[error(
        "{lock} is locked by {holder}: another redrive is using this data directory; \
         stop it, or give this one another data directory",
        lock = .lock.display(),
        holder = match .pid { Some(pid) => format!("PID {pid}"), None => "a process that has not written its PID".to_owned() }
    )]
    DataDirLocked {
        /// The lock file.
        lock: std::path::PathBuf,
        /// The PID the holder wrote into it, if there is one to read.
        pid: Option<u32>,
    },
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        StoreError::Backend(format!("json: {e}"))
    }
}
