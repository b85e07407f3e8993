//! The tick's promotion of due scheduled messages to ready, fair across queues.
//!
//! One tick promotes at most [`TICK_PROMOTE_LIMIT`] messages, so that one commit
//! stays bounded. Taking the earliest-due messages of all queues together let a
//! million messages due at one instant in one queue hold back every other queue's
//! deliveries for a hundred ticks. So the limit is shared instead: every queue with
//! due messages gets an equal share, and what a queue leaves unused goes to the
//! others (a queue with one due message takes one, a flooded one the rest). When
//! more queues are due than the limit, each gets one message and the order rotates
//! from tick to tick, so none waits behind the others.
//!
//! Finding the queues with due messages must not walk one queue's backlog either:
//! `ix_scheduled` is ordered by (queue, due time), and [`DueQueues`] keeps, in
//! memory, a lower bound of each queue's earliest due time (an index seek per queue
//! when it is unknown). It holds one entry per queue with scheduled messages and
//! forgets a queue when it has none left.

use crate::hot::{Hot, Key};
use crate::sql_error::SqlResultExt;
use redrive_core::Timestamp;
use redrive_storage::StoreError;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::{BTreeSet, HashMap, HashSet};

/// At most this many scheduled messages become ready in one tick: a commit of
/// 10,000 transitions takes tens of milliseconds, about as long as one should make
/// the writer's other jobs wait.
pub const TICK_PROMOTE_LIMIT: usize = 10_000;

/// The queues with scheduled messages, and from when each has due ones.
#[derive(Debug, Default)]
pub struct DueQueues {
    /// Queues whose earliest due time must be read again (a message was scheduled
    /// since it was read): one index seek each, at the next [`DueQueues::resolve`].
    unknown: HashSet<String>,
    /// Earliest due time per queue, ms: never later than the real one (a message
    /// promoted, killed or deleted since may leave it early, which costs one
    /// needless look at the queue and nothing else).
    known: HashMap<String, i64>,
    /// `known`, ordered by time.
    by_time: BTreeSet<(i64, String)>,
    /// Queues read since the last commit: if the transaction that read them is rolled
    /// back, what was read may be later than the truth (promotions undone), so they are
    /// read again.
    read_uncommitted: HashSet<String>,
    /// Where the next tick starts when more queues are due than it can serve.
    rotation: usize,
}

impl DueQueues {
    /// Track `queues` (those with scheduled messages), their due times unknown yet.
    pub fn new(queues: impl IntoIterator<Item = String>) -> Self {
        Self {
            unknown: queues.into_iter().collect(),
            ..Self::default()
        }
    }

    /// A message of `queue` was scheduled (or may have been: a rolled-back job
    /// leaves a needless look, nothing worse).
    pub fn scheduled(&mut self, queue: &str) {
        if !self.unknown.contains(queue) {
            self.unknown.insert(queue.to_owned());
        }
    }

    /// The transaction that read due times committed: they hold.
    pub fn committed(&mut self) {
        self.read_uncommitted.clear();
    }

    /// A job or the transaction was rolled back: read again what it read.
    pub fn rolled_back(&mut self) {
        self.unknown.extend(self.read_uncommitted.drain());
    }

    fn set(&mut self, queue: &str, earliest: Option<i64>) {
        if let Some(old) = self.known.remove(queue) {
            self.by_time.remove(&(old, queue.to_owned()));
        }
        if let Some(t) = earliest {
            self.known.insert(queue.to_owned(), t);
            self.by_time.insert((t, queue.to_owned()));
        }
    }

    /// Read the earliest due time of `queue` (one seek on `ix_scheduled`), past the rows
    /// promoted in memory (`hot.rs`: they are `scheduled` on disk, and held).
    fn refresh(&mut self, conn: &Connection, hot: &Hot, queue: &str) -> Result<(), StoreError> {
        let (after_due, after_seq) = hot.scan_after(queue);
        let earliest: Option<i64> = conn
            .prepare_cached(
                "SELECT due_at FROM messages WHERE queue = ?1 AND state = 0 \
                 AND due_at >= ?2 AND (due_at > ?2 OR seq > ?3) ORDER BY due_at, seq LIMIT 1",
            )
            .db()?
            .query_row(params![queue, after_due, after_seq], |r| r.get(0))
            .optional()
            .db()?;
        self.set(queue, earliest);
        if !self.read_uncommitted.contains(queue) {
            self.read_uncommitted.insert(queue.to_owned());
        }
        Ok(())
    }

    /// Read the earliest due time of every queue in `unknown`.
    pub fn resolve(&mut self, conn: &Connection, hot: &Hot) -> Result<(), StoreError> {
        for queue in std::mem::take(&mut self.unknown) {
            self.refresh(conn, hot, &queue)?;
        }
        Ok(())
    }

    /// The earliest due time of all queues, exact: the earliest lower bound is read
    /// again until reading does not change it (each stale entry is corrected once;
    /// usually this is one index seek).
    pub fn earliest(&mut self, conn: &Connection, hot: &Hot) -> Result<Option<i64>, StoreError> {
        self.resolve(conn, hot)?;
        while let Some((t, queue)) = self.by_time.first().cloned() {
            self.refresh(conn, hot, &queue)?;
            if self.known.get(&queue) == Some(&t) {
                return Ok(Some(t));
            }
        }
        Ok(None)
    }

    /// Queues with messages due at `t`, earliest first (after [`DueQueues::resolve`]).
    fn due(&self, t: i64) -> Vec<String> {
        self.by_time
            .iter()
            .take_while(|(d, _)| *d <= t)
            .map(|(_, q)| q.clone())
            .collect()
    }
}

/// What one promotion did.
#[derive(Debug)]
pub struct Promoted {
    /// Messages made ready, per queue, in the order the queues were served.
    pub per_queue: Vec<(String, usize)>,
    /// Whether messages due at `t` are left (the limit was reached).
    pub more: bool,
    /// The messages made ready on disk, per queue share: their places in claim order
    /// (`hot.rs`; those promoted in memory are placed there already).
    pub made_ready: Vec<(String, Vec<Key>)>,
}

/// Promote the scheduled messages due at `t`, at most [`TICK_PROMOTE_LIMIT`], shared
/// fairly among the queues that have some. On a queue `in_memory` says yes to (leases
/// held in memory, `hot.rs`) a promotion writes nothing: the rows are held in `hot` as
/// ready, up to [`crate::hot::DUE_MAX`] of them; past that, and on other queues, the
/// rows are written `ready`.
pub fn promote(
    conn: &Connection,
    due: &mut DueQueues,
    hot: &mut Hot,
    in_memory: &dyn Fn(&str) -> bool,
    t: i64,
    limit: usize,
) -> Result<Promoted, StoreError> {
    due.resolve(conn, hot)?;
    let mut queues = due.due(t);
    if queues.len() > limit {
        let start = due.rotation % queues.len();
        queues.rotate_left(start);
        due.rotation = start + limit;
    }
    let mut left = limit;
    let mut per_queue: Vec<(String, usize)> = Vec::new();
    let mut made_ready = Vec::new();
    // Each pass shares what is left among the queues that took their whole share in
    // the pass before (they may have more); a queue that took less is done.
    let mut active = queues;
    while left > 0 && !active.is_empty() {
        let mut saturated = Vec::new();
        let count = active.len();
        for (i, queue) in active.into_iter().enumerate() {
            if left == 0 {
                break;
            }
            let share = left.div_ceil(count - i);
            let memory = in_memory(&queue);
            let mut n = 0;
            if memory {
                n = promote_in_memory(conn, hot, &queue, t, share)?;
            }
            if n < share && (!memory || hot.promotion_room(&queue, 1) == 0) {
                let keys = promote_on_disk(conn, hot, &queue, t, share - n)?;
                n += keys.len();
                if !keys.is_empty() {
                    made_ready.push((queue.clone(), keys));
                }
            }
            left -= n.min(left);
            if n > 0 {
                match per_queue.iter_mut().find(|(q, _)| *q == queue) {
                    Some((_, total)) => *total += n,
                    None => per_queue.push((queue.clone(), n)),
                }
            }
            if n == share {
                saturated.push(queue);
            }
        }
        active = saturated;
    }
    for (queue, _) in &per_queue {
        due.refresh(conn, hot, queue)?;
    }
    Ok(Promoted {
        per_queue,
        made_ready,
        more: due.earliest(conn, hot)?.is_some_and(|e| e <= t),
    })
}

/// Promote up to `share` due rows of `queue` in memory, as far as it has room, the first
/// after those held already: returns how many.
fn promote_in_memory(
    conn: &Connection,
    hot: &mut Hot,
    queue: &str,
    t: i64,
    share: usize,
) -> Result<usize, StoreError> {
    let room = hot.promotion_room(queue, share);
    if room == 0 {
        return Ok(0);
    }
    let (after_due, after_seq) = hot.scan_after(queue);
    let rows: Vec<(i64, String, u8, i64)> = conn
        .prepare_cached(
            "SELECT seq, id, priority, due_at FROM messages WHERE queue = ?1 AND state = 0 \
             AND due_at <= ?2 AND due_at >= ?3 AND (due_at > ?3 OR seq > ?4) \
             ORDER BY due_at, seq LIMIT ?5",
        )
        .db()?
        .query_map(params![queue, t, after_due, after_seq, room as i64], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
        })
        .db()?
        .collect::<Result<_, _>>()
        .db()?;
    let Some(&(last_seq, _, _, last_due)) = rows.last() else {
        return Ok(0);
    };
    let n = rows.len();
    for (seq, id, priority, due_at) in rows {
        let key = Key::of(priority, Some(Timestamp::from_millis(due_at)), seq);
        hot.promote(&id, queue, key, t);
    }
    hot.hold_upto(queue, (last_due, last_seq));
    Ok(n)
}

/// Write up to `share` due rows of `queue` `ready`, the first after those held in memory:
/// their places in claim order. The writer's kept copies of them are forgotten
/// (`row_cache.rs`).
fn promote_on_disk(
    conn: &Connection,
    hot: &mut Hot,
    queue: &str,
    t: i64,
    share: usize,
) -> Result<Vec<Key>, StoreError> {
    let (after_due, after_seq) = hot.scan_after(queue);
    let keys: Vec<Key> = conn
        .prepare_cached(
            "UPDATE messages SET state = 1, updated_at = ?1 WHERE seq IN \
         (SELECT seq FROM messages WHERE queue = ?2 AND state = 0 AND due_at <= ?1 \
          AND due_at >= ?4 AND (due_at > ?4 OR seq > ?5) ORDER BY due_at, seq LIMIT ?3) \
         RETURNING seq, priority, due_at",
        )
        .db()?
        .query_map(params![t, queue, share as i64, after_due, after_seq], |r| {
            let due: Option<i64> = r.get(2)?;
            Ok(Key::of(
                r.get(1)?,
                due.map(Timestamp::from_millis),
                r.get(0)?,
            ))
        })
        .db()?
        .collect::<Result<_, _>>()
        .db()?;
    for key in &keys {
        hot.rows.forget(key.seq());
    }
    Ok(keys)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In memory only: an in-memory database with the messages table's columns that
    /// promotion reads.
    fn db() -> Connection {
        let conn = Connection::open_in_memory().expect("open");
        conn.execute_batch(
            "CREATE TABLE messages (seq INTEGER PRIMARY KEY, id TEXT, queue TEXT NOT NULL, state INTEGER NOT NULL, priority INTEGER NOT NULL DEFAULT 0, \
             due_at INTEGER, updated_at INTEGER);
             CREATE INDEX ix_scheduled ON messages(queue, due_at) WHERE state = 0;",
        )
        .expect("schema");
        conn
    }

    fn schedule(conn: &Connection, queue: &str, due_at: i64, n: usize) {
        for _ in 0..n {
            conn.execute(
                "INSERT INTO messages (id, queue, state, due_at, updated_at) \
                 VALUES ('m' || (SELECT count(*) FROM messages), ?1, 0, ?2, 0)",
                params![queue, due_at],
            )
            .expect("insert");
        }
    }

    fn ready(conn: &Connection, queue: &str) -> i64 {
        conn.query_row(
            "SELECT COUNT(*) FROM messages WHERE queue = ?1 AND state = 1",
            [queue],
            |r| r.get(0),
        )
        .expect("count")
    }

    #[test]
    fn unused_share_goes_to_the_queues_served_after() {
        let conn = db();
        schedule(&conn, "a", 10, 1);
        schedule(&conn, "b", 20, 100);
        schedule(&conn, "c", 30, 100);
        let mut due = DueQueues::new(["a", "b", "c"].map(String::from));
        let p = promote(&conn, &mut due, &mut Hot::new(), &|_| false, 100, 9).expect("promote");
        // a takes its 1 of a 3 share; b gets ceil(8 / 2) = 4, c the 4 left.
        assert_eq!(
            p.per_queue,
            vec![("a".into(), 1), ("b".into(), 4), ("c".into(), 4)]
        );
        assert!(p.more);
        assert_eq!((ready(&conn, "b"), ready(&conn, "c")), (4, 4));
    }

    #[test]
    fn a_flooded_queue_served_first_gets_what_the_others_leave() {
        let conn = db();
        schedule(&conn, "flooded", 10, 100);
        schedule(&conn, "quiet", 20, 1);
        let mut due = DueQueues::new(["flooded", "quiet"].map(String::from));
        let p = promote(&conn, &mut due, &mut Hot::new(), &|_| false, 100, 10).expect("promote");
        assert_eq!(
            p.per_queue,
            vec![("flooded".into(), 9), ("quiet".into(), 1)]
        );
        assert!(p.more);
    }

    #[test]
    fn more_due_queues_than_the_limit_take_turns() {
        let conn = db();
        for q in ["a", "b", "c", "d", "e"] {
            schedule(&conn, q, 10, 10);
        }
        let mut due = DueQueues::new(["a", "b", "c", "d", "e"].map(String::from));
        let mut served = Vec::new();
        for _ in 0..5 {
            let p = promote(&conn, &mut due, &mut Hot::new(), &|_| false, 100, 2).expect("promote");
            served.extend(p.per_queue.into_iter().map(|(q, n)| {
                assert_eq!(n, 1);
                q
            }));
        }
        served.sort();
        assert_eq!(served, ["a", "a", "b", "b", "c", "c", "d", "d", "e", "e"]);
    }

    #[test]
    fn a_queue_without_scheduled_messages_is_forgotten() {
        let conn = db();
        schedule(&conn, "a", 10, 2);
        let mut due = DueQueues::new(["a".to_owned(), "gone".to_owned()]);
        assert_eq!(
            due.earliest(&conn, &Hot::new()).expect("earliest"),
            Some(10)
        );
        let p = promote(&conn, &mut due, &mut Hot::new(), &|_| false, 10, 100).expect("promote");
        assert_eq!(p.per_queue, vec![("a".into(), 2)]);
        assert!(!p.more);
        assert_eq!(due.earliest(&conn, &Hot::new()).expect("earliest"), None);
        assert!(due.known.is_empty() && due.by_time.is_empty() && due.unknown.is_empty());
    }

    /// A tick whose job is rolled back must not leave the promoted queue's later due
    /// time behind: the messages are scheduled again, due now.
    #[test]
    fn due_times_read_in_a_rolled_back_transaction_are_read_again() {
        let conn = db();
        schedule(&conn, "a", 10, 1);
        schedule(&conn, "a", 50, 1);
        let mut due = DueQueues::new(["a".to_owned()]);
        due.committed();
        conn.execute_batch("BEGIN").expect("begin");
        let p = promote(&conn, &mut due, &mut Hot::new(), &|_| false, 20, 100).expect("promote");
        assert_eq!(p.per_queue, vec![("a".into(), 1)]);
        conn.execute_batch("ROLLBACK").expect("rollback");
        due.rolled_back();
        assert_eq!(
            due.earliest(&conn, &Hot::new()).expect("earliest"),
            Some(10)
        );
    }

    /// On a queue whose leases are held in memory the tick writes nothing, up to the bound;
    /// past it the rest is written `ready`. The queue's next due time is read past the rows
    /// held, so they wake nothing.
    #[test]
    fn promotion_in_memory_writes_nothing_up_to_its_bound() {
        let conn = db();
        let max = crate::hot::DUE_MAX;
        schedule(&conn, "a", 10, max + 5);
        schedule(&conn, "a", 50, 1);
        let mut due = DueQueues::new(["a".to_owned()]);
        let mut hot = Hot::new();
        let p = promote(&conn, &mut due, &mut hot, &|_| true, 20, 10_000).expect("promote");
        assert_eq!(p.per_queue, vec![("a".into(), max + 5)]);
        assert_eq!(ready(&conn, "a"), 5, "past the bound: written");
        let on_disk: usize = p.made_ready.iter().map(|(_, k)| k.len()).sum();
        assert_eq!(on_disk, 5);
        assert_eq!(hot.promotion_room("a", 1), 0);
        assert!(hot.promotion("m0").is_some(), "the earliest are held");
        assert!(!p.more);
        assert_eq!(
            due.earliest(&conn, &hot).expect("earliest"),
            Some(50),
            "the rows held are not due again"
        );
        let p = promote(&conn, &mut due, &mut hot, &|_| true, 30, 10_000).expect("promote");
        assert!(p.per_queue.is_empty(), "nothing promoted twice");
        // Leased elsewhere: room again, and the next due row is held, not written.
        hot.unpromote("m0");
        let p = promote(&conn, &mut due, &mut hot, &|_| true, 50, 10_000).expect("promote");
        assert_eq!(p.per_queue, vec![("a".into(), 1)]);
        assert!(p.made_ready.is_empty());
        assert_eq!(ready(&conn, "a"), 5);
        assert_eq!(due.earliest(&conn, &hot).expect("earliest"), None);
    }

    /// A rolled-back tick takes its promotions in memory back, and how far they went.
    #[test]
    fn a_rolled_back_promotion_in_memory_is_taken_back() {
        let conn = db();
        schedule(&conn, "a", 10, 3);
        let mut due = DueQueues::new(["a".to_owned()]);
        let mut hot = Hot::new();
        promote(&conn, &mut due, &mut hot, &|_| true, 20, 100).expect("promote");
        assert!(hot.promotion("m2").is_some());
        hot.rollback_job();
        due.rolled_back();
        assert!(hot.promotion("m0").is_none() && hot.promotion("m2").is_none());
        assert_eq!(hot.held_upto("a"), None);
        assert_eq!(due.earliest(&conn, &hot).expect("earliest"), Some(10));
        let p = promote(&conn, &mut due, &mut hot, &|_| true, 20, 100).expect("promote");
        assert_eq!(p.per_queue, vec![("a".into(), 3)]);
    }
}
