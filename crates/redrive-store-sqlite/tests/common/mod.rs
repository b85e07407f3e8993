//! Helpers the embedded store's integration tests share.

use redrive_storage::conformance::{at, Q};
use redrive_storage::{LeaseRef, LeaseRequest, Leased, Store};
use redrive_store_sqlite::SqliteStore;

/// Lease up to `max` messages of the conformance queue for `lease_ms`, at `now` ms.
pub async fn lease(s: &SqliteStore, max: u32, lease_ms: u64, now: i64) -> Vec<Leased> {
    s.lease(
        LeaseRequest {
            queue: Q.into(),
            max,
            lease_ms,
            max_bytes: None,
        },
        Some(at(now)),
    )
    .await
    .expect("lease")
}

/// The reference that settles `l`.
pub fn lref(l: &Leased) -> LeaseRef {
    LeaseRef {
        id: l.message.id,
        token: l.token.clone(),
    }
}
