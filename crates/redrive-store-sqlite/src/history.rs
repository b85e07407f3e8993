//! A message's history is a JSON array in its row (`messages.history`); a transition appends
//! one entry to it.
//!
//! SQLite's `json_insert(history, '$[#]', json(entry))` parsed the whole array into its
//! binary form and rendered it back as text at every append: on the single writer thread
//! that was the largest part of SQLite's JSON work, ~10 % of the writer's CPU in a retry
//! cycle (docs/PERFORMANCE.md). The array is always text this store wrote itself (serde's or
//! SQLite's compact rendering, never hand-edited), so an append is a splice: the entry goes
//! before the closing bracket. [`append`] checks only what it relies on, that the text is one
//! array (`[` … `]`); anything else is an error and the transition's savepoint rolls back.

use crate::sql_error::SqlResultExt;
use redrive_storage::StoreError;
use rusqlite::functions::{Context, FunctionFlags};
use rusqlite::Connection;

/// The SQL function `redrive_history_append(history, entry)`: [`append`].
pub const APPEND_FN: &str = "redrive_history_append";

/// `history` (the text of a JSON array) with `entry` (the text of one JSON value) appended;
/// `None` when `history` is not an array's text.
pub fn append(history: &str, entry: &str) -> Option<String> {
    let body = history.trim().strip_prefix('[')?.strip_suffix(']')?;
    let body = body.trim_end();
    let mut out = String::with_capacity(body.len() + entry.len() + 3);
    out.push('[');
    out.push_str(body);
    if !body.trim_start().is_empty() {
        out.push(',');
    }
    out.push_str(entry);
    out.push(']');
    Some(out)
}

/// Register [`APPEND_FN`] on the writer's connection.
pub fn register(conn: &Connection) -> Result<(), StoreError> {
    conn.create_scalar_function(
        APPEND_FN,
        2,
        FunctionFlags::SQLITE_UTF8 | FunctionFlags::SQLITE_DETERMINISTIC,
        |ctx: &Context<'_>| {
            let history = ctx.get_raw(0).as_str()?;
            let entry = ctx.get_raw(1).as_str()?;
            append(history, entry).ok_or_else(|| {
                rusqlite::Error::UserFunctionError(
                    format!("a message's history is not a JSON array: {history:.80}").into(),
                )
            })
        },
    )
    .db()
}

#[cfg(test)]
mod tests {
    use super::append;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    #[test]
    fn appends_to_empty_and_to_entries() {
        assert_eq!(append("[]", r#"{"a":1}"#).unwrap(), r#"[{"a":1}]"#);
        assert_eq!(append(" [ ] ", "1").unwrap(), "[1]");
        assert_eq!(append("[1]", "2").unwrap(), "[1,2]");
        assert_eq!(append("[1, 2 ]\n", "3").unwrap(), "[1, 2,3]");
    }

    #[test]
    fn refuses_what_is_not_an_array() {
        for bad in ["", "{}", "[1", "1]", "null", "\"[]\""] {
            assert_eq!(append(bad, "1"), None, "{bad:?}");
        }
    }

    fn entry() -> impl Strategy<Value = Value> {
        (any::<u32>(), "[a-z\"\\\\\\]\\[,]{0,12}", any::<bool>()).prop_map(|(n, s, b)| {
            if b {
                json!({"attempt": n, "event": s, "response": {"status": n % 600, "body": s}})
            } else {
                json!({"attempt": n, "at": s})
            }
        })
    }

    proptest! {
        /// An append reads back as the array with the entry last, whoever rendered the
        /// array (serde compact, serde pretty: SQLite's `json_insert` renders compactly).
        #[test]
        fn reads_back_as_the_array_with_the_entry_last(
            entries in proptest::collection::vec(entry(), 0..6),
            next in entry(),
            pretty in any::<bool>(),
        ) {
            let text = if pretty {
                serde_json::to_string_pretty(&entries).unwrap()
            } else {
                serde_json::to_string(&entries).unwrap()
            };
            let appended = append(&text, &serde_json::to_string(&next).unwrap()).unwrap();
            let back: Vec<Value> = serde_json::from_str(&appended).unwrap();
            let mut want = entries;
            want.push(next);
            prop_assert_eq!(back, want);
        }
    }
}
