//! Set-based ack and nack, the part every shared-database backend writes the same way: given
//! the locked rows of a batch's leases (by message id), check each item's lease and apply
//! the rules to its row, in item order, and say what to write. The backend reads the rows
//! before ([`StoredRow`]s keyed by id, locked for its transaction) and writes after: the
//! lifecycles of [`Settlement::written`] (with [`Settlement::errors`] for a nack), the
//! history entries of [`Settlement::entries`], then per-key ordering and wake-ups.
//!
//! An item whose message is unknown answers `NotFound`; an item whose lease is not the live
//! one answers the lease error; neither stops the others. An ack retried after the ack
//! that made its message done (same token) answers that message again, `repeated`, and
//! writes nothing. Items with wait notes (push delivery) are not for this: their notes
//! rewrite history entries, which the backends do one item at a time.

use crate::rules::{self, AttemptEnd, FailedAttempt, LeaseEnd};
use crate::stored::StoredRow;
use crate::{Ack, AckEvent, Acked, FailureOutcome, Nack, Settled, StoreError};
use redrive_core::{HistoryEntry, HistoryEvent, QueueCatalog, SplitMix64, State, Timestamp};
use std::collections::HashMap;

/// What a set-based ack or nack decided: an answer per item, in item order, and what to
/// write.
#[derive(Debug)]
pub struct Settlement<T> {
    /// One answer per item, in item order.
    pub answers: Vec<Result<T, StoreError>>,
    /// The ids of the rows whose lifecycle changed, in item order, each once.
    pub written: Vec<String>,
    /// A nack's new (error class, last error JSON), one per row of `written`; empty for an
    /// ack (the row's last error stays).
    pub errors: Vec<(String, String)>,
    /// The history entries to append, `(message seq, entry)`, in item order.
    pub entries: Vec<(i64, HistoryEntry)>,
}

impl<T> Settlement<T> {
    fn with_capacity(n: usize) -> Self {
        Self {
            answers: Vec::with_capacity(n),
            written: Vec::new(),
            errors: Vec::new(),
            entries: Vec::new(),
        }
    }
}

/// The lease of `row` is `token`'s and alive at `now`.
fn check(row: &StoredRow, token: &str, now: Timestamp) -> Result<(), StoreError> {
    rules::check_lease(&row.life, row.lease_token.as_deref(), token, now, || {
        Ok(Vec::new())
    })
}

/// Ack `items` against their locked `rows` (by id): each lease checked, each row made done.
pub fn acks(
    rows: &mut HashMap<String, StoredRow>,
    items: &[&Ack],
    now: Timestamp,
) -> Settlement<Acked> {
    let mut s = Settlement::with_capacity(items.len());
    for a in items {
        let id = a.lease.id.to_string();
        let Some(row) = rows.get_mut(&id) else {
            s.answers.push(Err(StoreError::NotFound(id)));
            continue;
        };
        let token = a.lease.token.as_str();
        if row.life.state == State::Done && row.lease_token.as_deref() == Some(token) {
            // A retried ack of the lease that made it done.
            s.answers
                .push(row.to_message(None, None).map(|message| Acked {
                    message,
                    repeated: true,
                }));
            continue;
        }
        if let Err(e) = check(row, token, now) {
            s.answers.push(Err(e));
            continue;
        }
        let life = &mut row.life;
        life.state = State::Done;
        life.finished_at = Some(now);
        life.updated_at = now;
        life.lease_end = Some(LeaseEnd::Settled(Settled::Acked));
        s.entries.push((
            row.seq,
            HistoryEntry {
                attempt: life.attempts,
                at: now,
                leased_at: life.leased_at,
                event: match a.event {
                    AckEvent::Acked => HistoryEvent::Acked,
                    AckEvent::Republished => HistoryEvent::Republished,
                },
                response: a.response.clone(),
            },
        ));
        s.written.push(id);
        s.answers
            .push(row.to_message(None, None).map(|message| Acked {
                message,
                repeated: false,
            }));
    }
    s
}

/// Nack `items` against their locked `rows` (by id): each lease checked, each attempt
/// failed through [`rules::fail`] with its queue's policy (`catalog`).
pub fn nacks(
    rows: &mut HashMap<String, StoredRow>,
    items: &[&Nack],
    catalog: &QueueCatalog,
    rng: &mut SplitMix64,
    now: Timestamp,
) -> Result<Settlement<FailureOutcome>, StoreError> {
    let mut s = Settlement::with_capacity(items.len());
    for n in items {
        let id = n.lease.id.to_string();
        let Some(row) = rows.get_mut(&id) else {
            s.answers.push(Err(StoreError::NotFound(id)));
            continue;
        };
        if let Err(e) = check(row, &n.lease.token, now) {
            s.answers.push(Err(e));
            continue;
        }
        let policy = &catalog.get(&row.queue).retry;
        let end = AttemptEnd::lease(LeaseEnd::Settled(Settled::Nacked));
        let FailedAttempt {
            mut entry,
            last_error,
            class,
            retry_delay_ms,
        } = rules::fail(&mut row.life, policy, &n.failure, end, now, rng);
        entry.response = n.response.clone();
        let last_error = serde_json::to_string(&last_error)?;
        row.last_error = Some(last_error.clone());
        s.entries.push((row.seq, entry));
        s.errors.push((class.as_str().to_owned(), last_error));
        s.written.push(id);
        s.answers
            .push(row.to_message(None, None).map(|message| FailureOutcome {
                dead_reason: message.dead_reason,
                message,
                class,
                retry_delay_ms,
            }));
    }
    Ok(s)
}

/// Settle `$items` in item order: set-based (`$set`, given the items' references) where it
/// can, one by one (`$alone`, given an item) an item with wait notes (the notes rewrite its
/// history entries), and everything one by one when fewer than two would go set-based. An
/// item's own refusal (`$E::Logic`, the backend's error type `$E`) is its answer; any other
/// error ends the call. A macro, used by the backends inside an `async fn` returning
/// `Result<Vec<Result<T, StoreError>>, $E>`: generic async closures over a transaction are
/// not `Send`.
#[macro_export]
macro_rules! settle_many {
    ($E:ident, $items:expr, |$n:ident| $has_notes:expr, |$refs:ident| $set:expr, |$it:ident| $alone:expr) => {{
        let items = $items;
        let (mut one_by_one, together): (Vec<usize>, Vec<usize>) =
            (0..items.len()).partition(|&i| {
                let $n = &items[i];
                $has_notes
            });
        let mut out: Vec<Option<Result<_, $crate::StoreError>>> =
            (0..items.len()).map(|_| None).collect();
        if together.len() < 2 {
            one_by_one = (0..items.len()).collect();
        } else {
            let $refs: Vec<&_> = together.iter().map(|&i| &items[i]).collect();
            for (&i, r) in together.iter().zip($set.await?) {
                out[i] = Some(r);
            }
        }
        for i in one_by_one {
            let $it = &items[i];
            out[i] = Some(match $alone.await {
                Ok(v) => Ok(v),
                Err($E::Logic(e)) => Err(e),
                Err(e) => return Err(e),
            });
        }
        Ok(out.into_iter().flatten().collect())
    }};
}
