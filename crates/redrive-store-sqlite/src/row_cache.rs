//! Rows as the writer itself last wrote them, kept for the retry cycle's next step.
//!
//! A retry cycle on a queue whose leases are held in memory (`hot.rs`) read each row back
//! right after writing it: the lease read the row the publish had just inserted (for its
//! payload), the nack read it again (for the rules), the retry's lease read what the nack
//! had just written, and the ack's `RETURNING` handed the row back once more. The writer
//! is the only one who writes the database, so it knows those rows already:
//!
//! - a publish (not a failed one, which the rules may change on its way in) and a failed
//!   attempt that leaves the row `ready`, or `scheduled` within [`HORIZON_MS`], put the
//!   row here as written ([`RowCache::put`]);
//! - a lease held in memory takes it from here instead of reading it, and keeps it with
//!   the lease (`MemLease::row`), so its nack and its ack read nothing;
//! - every other transition reads its row through `WriterState::row_by_id`, which forgets
//!   it here first; the tick's promotions written on disk forget theirs; a rolled-back job
//!   clears everything (its rows may not exist any more).
//!
//! Bounded: at most [`ROWS_MAX`] rows and [`BYTES_MAX`] bytes; past either a row is not
//! kept (and is read from the database when it is leased, as before). Nothing here is
//! ever the only copy: a crash or a close loses only reads to come.
//!
//! In debug builds (every test) each row taken from here is compared with the row on
//! disk, so the whole test suite checks that nothing writes a row behind the cache.

use crate::row::Row;
use std::collections::HashMap;
use std::sync::Arc;

/// At most this many rows are kept.
pub const ROWS_MAX: usize = 16_384;
/// At most this many bytes of rows ([`size`]) are kept here, and as many with leases.
pub const BYTES_MAX: usize = 32 << 20;
/// A `scheduled` row is kept only when it is due within this long of its write.
pub const HORIZON_MS: i64 = 10_000;

/// What a row costs in memory, roughly: its strings and a fixed part.
pub fn size(row: &Row) -> usize {
    const FIXED: usize = 256;
    let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
    FIXED
        + row.id.len()
        + row.queue.len()
        + row.payload.len()
        + opt(&row.key)
        + opt(&row.idempotency_key)
        + opt(&row.headers)
        + opt(&row.lease_token)
        + opt(&row.last_error)
        + opt(&row.target_url)
}

/// The rows kept, by `seq`, and what the rows kept with leases cost.
#[derive(Debug, Default)]
pub struct RowCache {
    rows: HashMap<i64, Row>,
    bytes: usize,
    /// [`size`] of every row kept with a lease (`MemLease::row`), at most [`BYTES_MAX`].
    lease_bytes: usize,
}

impl RowCache {
    /// Keep `row` (exactly as it is on disk now), replacing what was kept of it; when
    /// the cache is full it is only forgotten.
    pub fn put(&mut self, row: Row) {
        self.forget(row.seq);
        let s = size(&row);
        if self.rows.len() >= ROWS_MAX || self.bytes + s > BYTES_MAX {
            return;
        }
        self.bytes += s;
        self.rows.insert(row.seq, row);
    }

    /// The row at `seq`, if kept; it is not kept any more.
    pub fn take(&mut self, seq: i64) -> Option<Row> {
        let row = self.rows.remove(&seq)?;
        self.bytes -= size(&row);
        Some(row)
    }

    /// The row at `seq` is about to change (or changed) otherwise than through here.
    pub fn forget(&mut self, seq: i64) {
        self.take(seq);
    }

    /// A copy of `row` to keep with a lease, if the leases' rows have room for it (it is
    /// counted once the lease is held: [`Self::lease_held`]).
    pub fn for_lease(&self, row: &Row) -> Option<Arc<Row>> {
        (self.lease_bytes + size(row) <= BYTES_MAX).then(|| Arc::new(row.clone()))
    }

    /// A lease keeping `row` is held (again, after a rolled-back end).
    pub fn lease_held(&mut self, row: &Row) {
        self.lease_bytes += size(row);
    }

    /// A lease keeping `row` is no longer held.
    pub fn lease_dropped(&mut self, row: &Row) {
        self.lease_bytes = self.lease_bytes.saturating_sub(size(row));
    }

    /// Forget every row (a rolled-back job: what it wrote is not on disk).
    pub fn clear(&mut self) {
        self.rows.clear();
        self.bytes = 0;
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.rows.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redrive_core::Timestamp;

    fn row(seq: i64, payload: usize) -> Row {
        Row {
            seq,
            id: format!("m{seq}"),
            queue: "q".into(),
            priority: 0,
            key: None,
            idempotency_key: None,
            payload: "x".repeat(payload),
            headers: None,
            lease_token: None,
            last_error: None,
            target_url: None,
            life: redrive_storage::rules::Lifecycle::published(None, Timestamp::from_millis(1)),
        }
    }

    #[test]
    fn bounded_by_count_and_bytes_and_a_put_replaces() {
        let mut c = RowCache::default();
        for seq in 0..(ROWS_MAX as i64 + 10) {
            c.put(row(seq, 10));
        }
        assert_eq!(c.len(), ROWS_MAX, "past the count nothing more is kept");
        assert!(c.take(ROWS_MAX as i64 + 5).is_none());
        c.put(row(0, 20));
        assert_eq!(c.take(0).map(|r| r.payload.len()), Some(20), "replaced");
        c.clear();
        assert_eq!((c.len(), c.bytes), (0, 0));
        c.put(row(1, BYTES_MAX));
        assert!(c.take(1).is_none(), "past the bytes nothing is kept");
        c.put(row(2, 100));
        c.forget(2);
        assert_eq!((c.len(), c.bytes), (0, 0));
    }
}
