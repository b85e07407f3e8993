//! What an idempotency key remembers of its message once the message is purged.
//!
//! SPEC §4: a key outlives its message for the whole `idempotency_window`. A done
//! message may be purged sooner (`done_retention` shorter than the window); its
//! idempotency record stays, and purge writes into it a [`Tombstone`]: the facts a
//! replay answers with (id, queue, created / finished time, attempts, priority, key,
//! headers). The payload is not kept (dropping it is the point of the purge): a replay
//! answers with its own payload, which equals the original's by fingerprint, or it
//! would have been an `idempotency_conflict`.
//!
//! A record whose message is gone and that has no tombstone was purged by a redrive
//! before schema version 2: only the id is known; the replay still answers it (never a
//! second message), with `created_at` derived from the record's expiry.
//!
//! An operator's delete removes the record with the message: the key is forgotten, and
//! the next publish with it creates a new message (a documented decision: delete means
//! "as if it had never been published").

pub use redrive_storage::stored::{purged_message, Tombstone};

/// A purged message's idempotency key, its id and its facts: (ikey, message id, facts).
pub type PurgedKey = (String, String, Tombstone);
